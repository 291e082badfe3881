//! Local knowledge of refusals: once Redis has said an (account, rule)
//! cannot admit before some moment, this instance answers further calls of
//! it itself until then, without a round trip.
//!
//! Sound, because admissions only ever push the earliest admissible moment
//! later. Entries are kept at most [`REFUSAL_CACHE_MAX_US`] (so a penalty
//! lifted on another instance is seen soon), only for rate, quota, reserve,
//! share and penalty refusals (a concurrency slot can free at any moment),
//! kept per caller for a rule with `max_share` (a caller's share says
//! nothing of another's, and its wait can be longer), and end
//! `max_wait` early (from then on a call could be held). A reload or a
//! penalty change through this instance's admin API drops them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::limit::{Reason, Rule};
use crate::time::Micros;

/// Longest a refusal is answered locally.
pub const REFUSAL_CACHE_MAX_US: Micros = 1_000_000;
/// Shorter refusals are not kept: such an entry expires before it can save
/// more than a few round trips, which batching already amortises, and
/// answering some of an account's calls locally only splits its batches.
pub const REFUSAL_CACHE_MIN_US: Micros = 1_000;

/// One cache of known refusals (there is one per serving thread: a lookup
/// per call must not contend across threads).
#[derive(Default)]
pub struct RefusalCache {
    entries: Mutex<Refusals>,
}

/// rule state → account → caller → what is known of each kind of caller's
/// calls (high, normal): looked up by `&str`, without allocating. The two
/// kinds are kept apart: a normal caller's refusal keeps the rule's
/// reserve, so it says nothing of a high caller's, and a high caller's wait
/// is shorter than a normal one's. The caller is `""` unless the rule has a
/// `max_share` (then it is the caller's label: a handful per account).
type Refusals = HashMap<Arc<str>, HashMap<String, Vec<(Box<str>, [Option<Known>; 2])>>>;

/// A refusal Redis answered.
#[derive(Debug, Clone, Copy)]
struct Known {
    /// Answered locally until then (at most [`REFUSAL_CACHE_MAX_US`]).
    answer_until: Micros,
    /// When the call could be admitted, as Redis said (for an honest wait).
    admit_at: Micros,
    reason: Reason,
}

/// Where a refusal of a (normal) call is kept: apart only when the rule has
/// a reserve; without one both kinds of caller are refused alike and share
/// what is known.
fn slot(rule: &Rule, normal: bool) -> usize {
    usize::from(normal && rule.priority_matters())
}

/// Whose refusals a call shares: its caller's for a rule with `max_share`,
/// else every caller's (`""`).
fn caller_of<'a>(rule: &Rule, share: Option<&'a str>) -> &'a str {
    match share {
        Some(caller) if rule.caller_matters() => caller,
        _ => "",
    }
}

impl RefusalCache {
    fn entries(&self) -> MutexGuard<'_, Refusals> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The refusal still standing at `now` for a call (`normal`: of a
    /// normal caller; `share`: its caller, whose share the rule checks):
    /// the wait Redis gave, less the time since, and why.
    pub fn get(
        &self,
        account: &str,
        rule: &Rule,
        normal: bool,
        share: Option<&str>,
        now: Micros,
    ) -> Option<(Micros, Reason)> {
        let entries = self.entries();
        let callers = entries.get(&rule.state)?.get(account)?;
        let caller = caller_of(rule, share);
        let known = callers.iter().find(|(c, _)| &**c == caller)?.1[slot(rule, normal)]?;
        (known.answer_until > now).then(|| (known.admit_at - now, known.reason))
    }

    /// Remembers a refusal Redis answered at `now` (`normal`: to a normal
    /// caller's call; `share`: its caller, whose share the rule checks)
    /// with this wait.
    #[allow(clippy::too_many_arguments)]
    pub fn put(
        &self,
        account: &str,
        rule: &Rule,
        normal: bool,
        share: Option<&str>,
        wait_us: Micros,
        reason: Reason,
        now: Micros,
    ) {
        let keep = wait_us - rule.max_wait_us;
        if keep < REFUSAL_CACHE_MIN_US || matches!(reason, Reason::Concurrency) {
            return;
        }
        let known = Known { answer_until: now + keep.min(REFUSAL_CACHE_MAX_US), admit_at: now + wait_us, reason };
        let mut entries = self.entries();
        let accounts = entries.entry(rule.state.clone()).or_default();
        if accounts.len() >= 10_000 {
            accounts.retain(|_, callers| {
                callers.iter().flat_map(|(_, k)| k.iter().flatten()).any(|k| k.answer_until > now)
            });
        }
        let callers = accounts.entry(account.to_owned()).or_default();
        let caller = caller_of(rule, share);
        let i = match callers.iter().position(|(c, _)| &**c == caller) {
            Some(i) => i,
            None => {
                callers.push((caller.into(), [None; 2]));
                callers.len() - 1
            }
        };
        callers[i].1[slot(rule, normal)] = Some(known);
    }

    pub fn forget(&self, account: &str, rule: &Rule) {
        if let Some(accounts) = self.entries().get_mut(&rule.state) {
            accounts.remove(account);
        }
    }

    pub fn clear(&self) {
        self.entries().clear();
    }
}
