//! `clear_quota` understood. When WeChat accepts a `clear_quota` (or
//! `clear_quota/v2`) that passed through wxgate, it has just reset the
//! account's counters; wxgate resets its own for that account at once, for
//! every instance (through the store): the day count of every rule (each
//! path's, for `scope = "path"`) starts again from 0 and every penalty is
//! lifted ([`crate::limit::decide::clear`]). `POST
//! /v1/accounts/{account}/clear` does the same by hand, for a clear done
//! outside wxgate.
//!
//! Whose counters: the appid the call's body names (`{"appid": ...}`, or
//! `appid=` in a form body or the query): the call is that account's. A
//! clear_quota without a valid appid, or whose account is named otherwise
//! (`X-Wx-Account`, an `@account` prefix) or known by its token as another,
//! is refused in the identify phase (400, [`crate::features::accounts`]):
//! WeChat clears the appid, so the call must be counted and granted as it.
//! Nothing is cleared when WeChat refuses the clear (48006: ten clears a
//! month used up) or its answer is not a plain success.

use crate::admit::core::Core;
use crate::config::Config;
use crate::error::Early;
use crate::features::accounts::token_requests::{BODY_CAP, BODY_WHAT};
use crate::features::hooks::{Answered, Appid, Env, Feature, Requesting};
use crate::limit::Key;
use crate::store::StoreError;
use crate::transport::sniff::Verdict;

pub mod request;

pub use self::request::{at, Clearing, PATHS};

/// clear_quota as a feature ([`crate::features`]): its request hook reads
/// the appid a clear_quota names (the call is that account's); its answer
/// hook resets that account's counts when WeChat accepted it ([`cleared`]).
pub struct QuotaClear;

impl Feature for QuotaClear {
    /// A clear_quota on its way: the appid it names.
    type Ctx = Option<Clearing>;

    async fn on_request(&self, _: Env<'_>, cx: &mut Option<Clearing>, req: &mut Requesting<'_>) -> Result<(), Early> {
        if req.own() || !at(req.path) {
            return Ok(());
        }
        let body = Box::pin(req.read_body(BODY_CAP, BODY_WHAT)).await?.cloned();
        let clearing = request::read(body.as_deref(), req.target.query())?;
        req.appid = Some(Appid { id: clearing.appid.clone(), field: "appid" });
        *cx = Some(clearing);
        Ok(())
    }

    async fn on_answer(&self, env: Env<'_>, cx: &mut Option<Clearing>, answered: &mut Answered<'_>) {
        if let (Verdict::Success, Some(clearing)) = (answered.verdict, cx.take()) {
            Box::pin(cleared(env.core, answered.config, answered.account, &clearing)).await;
        }
    }
}

/// The answer hook's part, after WeChat accepted the clear: resets the
/// counts of `account` (the call's) if it is the appid WeChat cleared.
pub async fn cleared(core: &Core, config: &Config, account: &str, clearing: &Clearing) {
    match clearing.appid.as_deref() {
        Some(appid) if appid == account => match clear_account(core, config, appid).await {
            Ok(()) => {
                tracing::info!(account = %appid, "WeChat cleared this account's quota: its day counts and penalties start again")
            }
            Err(e) => tracing::warn!(
                account = %appid,
                error = %e,
                "WeChat cleared this account's quota, but wxgate could not reset its own counts: \
                 POST /v1/accounts/{{account}}/clear when the store is back"
            ),
        },
        Some(appid) => tracing::warn!(
            account = %account,
            appid = %appid,
            "WeChat cleared the quota of an appid that is not this call's account: wxgate reset nothing; \
             if they are the same WeChat account, POST /v1/accounts/{{account}}/clear"
        ),
        None => tracing::warn!(
            account = %account,
            "a clear_quota succeeded but its body named no appid wxgate could read: wxgate reset nothing; \
             POST /v1/accounts/{{account}}/clear"
        ),
    }
}

/// Resets `account`'s day counts and penalties for every rule of `config`
/// (each path's state for `scope = "path"`), in the store: every instance
/// sees it.
pub async fn clear_account(core: &Core, config: &Config, account: &str) -> Result<(), StoreError> {
    let offset_us = config.server.quota_offset_us;
    let keys: Vec<Key<'_>> =
        config.routed.iter().map(|rule| Key { account, rule: config.rule_of(account, rule), offset_us }).collect();
    core.store.clear(&keys).await?;
    core.metrics.quota_clears.inc();
    Ok(())
}
