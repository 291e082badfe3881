//! Penalties as a feature ([`crate::features`]): WeChat's answer to an
//! admitted call reported to the store. A penalised errcode
//! (`[[penalty]]`) starts or escalates the (account, rule)'s penalty and
//! turns the client's answer into a penalty refusal (429 + `Retry-After`,
//! WeChat's body unchanged; the one table in [`crate::error`] makes it;
//! shadow mode records the penalty and passes WeChat's answer on as it is);
//! a success ends an escalation. A store that cannot record a penalty is
//! logged, and the answer is still turned into a refusal.

use crate::admit::core::Core;
use crate::error::retry_after_secs;
use crate::features::hooks::{Answered, Env, Feature};
use crate::limit::calendar::Period;
use crate::limit::learned::{self, Outcome};
use crate::limit::{Key, Limit};
use crate::store::pair_op::{LowerWindows, Penalise, Succeeded};
use crate::time::Micros;
use crate::transport::sniff::Verdict;

#[derive(Default)]
pub struct Penalties {
    /// Pairs of a rule with a day quota that WeChat answered 45009 since
    /// quota_sync last looked: the errmsg cannot tell a spent day from a
    /// frequency limit, so quota_sync asks quota/get at once
    /// ([`crate::ops::quota_sync`]). At most [`MAX_DAY_CHECKS`]: more
    /// are left to the next regular sync.
    /// With the latest `sent_at` of a call WeChat answered so.
    day_checks: std::sync::Mutex<Vec<(String, std::sync::Arc<str>, Micros)>>,
}

/// Most pairs waiting for quota_sync's check after a 45009.
pub const MAX_DAY_CHECKS: usize = 1024;

impl Penalties {
    /// The pairs to check, taken (each once).
    pub fn take_day_checks(&self) -> Vec<(String, std::sync::Arc<str>, Micros)> {
        std::mem::take(&mut *self.day_checks.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn check_day(&self, account: &str, state: &std::sync::Arc<str>, sent_at: Micros) {
        let mut checks = self.day_checks.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(check) = checks.iter_mut().find(|(a, s, _)| a == account && s == state) {
            check.2 = check.2.max(sent_at);
        } else if checks.len() < MAX_DAY_CHECKS {
            checks.push((account.to_owned(), state.clone(), sent_at));
        }
    }
}

/// WeChat answered a frequency 45009 for the pair of `key`: its rule's
/// windows are lowered until the quota day ends where the calls they
/// admitted show WeChat's limit (`learn_windows`,
/// [`crate::limit::learned`]), counted and logged; a window left as it is
/// is logged at info with why.
pub async fn lower_windows(core: &Core, key: Key<'_>, sent_at: Micros) {
    let rule = key.rule;
    if !rule.learn_windows {
        return;
    }
    let lowered = match Box::pin(core.store.apply(key, LowerWindows { sent_at })).await {
        Ok(lowered) => lowered,
        Err(e) => {
            tracing::warn!(rule = %rule.name, error = %e, "could not lower the windows after a 45009");
            return;
        }
    };
    let windows = rule.limits.iter().filter_map(|l| match l {
        Limit::Window(w) => Some(w),
        Limit::Calendar { .. } => None,
    });
    for (w, l) in windows.zip(&lowered) {
        let window_s = w.per_us() as f64 / 1e6;
        match l.outcome {
            Outcome::FewCalls => {
                tracing::info!(rule = %rule.name, account = key.account, window_s, admitted = l.admitted, floor = learned::floor(w.count()), "WeChat refused a call (45009), but the window admitted too few calls in the window before to be the limit WeChat enforces: not lowered (the penalty applies)")
            }
            Outcome::AtBound => {
                tracing::info!(rule = %rule.name, account = key.account, window_s, admitted = l.admitted, count = l.before, "WeChat refused a call (45009): the window is not lowered below its floor nor below 90 % of the most calls WeChat took in one window today")
            }
            Outcome::Lowered | Outcome::Already => {}
        }
    }
    // Lowered already for a call sent at or after this one, or not at all.
    if lowered.iter().all(|l| l.outcome != Outcome::Lowered) {
        return;
    }
    let counts: Vec<String> = lowered.iter().map(|l| format!("{}->{}", l.before, l.after)).collect();
    core.metrics.learned(&rule.name, "down");
    tracing::warn!(rule = %rule.name, account = key.account, windows = %counts.join(","), "WeChat refused a call within the rule's windows (45009): the account's windows are lowered until the quota day ends");
}

impl Feature for Penalties {
    type Ctx = ();

    async fn on_answer(&self, env: Env<'_>, _: &mut (), answered: &mut Answered<'_>) {
        let (Some(rule), Some(admitted)) = (answered.rule, answered.admitted) else { return };
        let config = answered.config;
        let key = Key { account: answered.counted, rule, offset_us: config.server.quota_offset_us };
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
                if code == 45009 {
                    // Which limit? quota/get can tell a spent day from a
                    // frequency limit where the rule syncs; otherwise the
                    // windows are lowered at once (a day spent lets nothing
                    // through before midnight, when they are whole again).
                    let day = rule.limits.iter().any(|l| matches!(l, Limit::Calendar { period: Period::Day, .. }));
                    let synced = config.quota_syncs.iter().any(|s| s.rule.state == rule.state);
                    if day {
                        self.check_day(answered.counted, &rule.state, sent_at);
                    }
                    if !(day && synced) {
                        lower_windows(env.core, key, sent_at).await;
                    }
                }
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
