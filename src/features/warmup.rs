//! Warm-up after a token refresh, as a feature ([`crate::features`]): a
//! fresh access token of an account (a successful `/cgi-bin/token`,
//! `stable_token` or `gettoken`, [`TokenRequest::refreshes_access_token`])
//! starts the warm-up of its rules again, on every instance. WeChat slows
//! an account down after a refresh; a rule's `warmup` ramps its rate up
//! over that time ([`crate::limit`]).

use crate::features::accounts::token_requests::TokenRequest;
use crate::features::hooks::{Answered, Env, Feature};
use crate::transport::sniff::Verdict;

pub struct Warmup;

impl Feature for Warmup {
    type Ctx = ();

    async fn on_answer(&self, env: Env<'_>, _: &mut (), answered: &mut Answered<'_>) {
        let config = answered.config;
        if answered.verdict != Verdict::Success || config.max_warmup_us == 0 {
            return;
        }
        if !TokenRequest::at(answered.path).is_some_and(TokenRequest::refreshes_access_token) {
            return;
        }
        if let Err(e) = Box::pin(env.core.store.token_refreshed(answered.counted, config.max_warmup_us)).await {
            tracing::warn!(error = %e, "could not restart warm-up after a token refresh");
        }
    }
}
