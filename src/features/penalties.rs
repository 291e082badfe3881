//! Penalties as a feature ([`crate::features`]): WeChat's answer to an
//! admitted call reported to the store. A penalised errcode
//! (`[[penalty]]`) starts or escalates the (account, rule)'s penalty and
//! turns the client's answer into a penalty refusal (429 + `Retry-After`,
//! WeChat's body unchanged; the one table in [`crate::error`] makes it;
//! shadow mode records the penalty and passes WeChat's answer on as it is);
//! a success ends an escalation. A store that cannot record a penalty is
//! logged, and the answer is still turned into a refusal.

use crate::error::retry_after_secs;
use crate::features::hooks::{Answered, Env, Feature};
use crate::limit::Key;
use crate::store::op::{Penalise, Succeeded};
use crate::transport::sniff::Verdict;

pub struct Penalties;

impl Feature for Penalties {
    type Ctx = ();

    async fn on_answer(&self, env: Env<'_>, _: &mut (), answered: &mut Answered<'_>) {
        let (Some(rule), Some(admitted)) = (answered.rule, answered.admitted) else { return };
        let config = answered.config;
        let key = Key { account: answered.account, rule, offset_us: config.server.quota_offset_us };
        let sent_at = admitted.at;
        match answered.verdict {
            Verdict::Errcode(code) => {
                let Some(policy) = config.penalties.iter().find(|p| p.errcode == code) else { return };
                let wait_us = match Box::pin(env.core.store.apply(key, Penalise { policy, sent_at })).await {
                    Ok(end) => end.remaining_us(),
                    Err(e) => {
                        tracing::warn!(rule = %rule.name, error = %e, "could not store a penalty");
                        policy.until(0, sent_at, key.offset_us) - sent_at
                    }
                };
                tracing::info!(rule = %rule.name, account = %answered.account, errcode = code, wait_s = retry_after_secs(wait_us), "WeChat penalised a call");
                if !rule.shadow {
                    answered.penalty = Some(wait_us);
                }
            }
            Verdict::Success if admitted.escalated => {
                if let Err(e) = Box::pin(env.core.store.apply(key, Succeeded { sent_at })).await {
                    tracing::warn!(rule = %rule.name, error = %e, "could not end a penalty escalation");
                }
            }
            _ => {}
        }
    }
}
