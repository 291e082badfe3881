//! Day limits learned from WeChat: what `openapi/quota/get` reports as an
//! account's `daily_limit` for an API (`quota_sync`, [`crate::ops::quota_sync`]).
//!
//! WeChat's day quotas are per account (they grow with followers, an
//! uncertified account's are lower, WeChat changes them without notice):
//! a rule's count is one number for every account. A pair's learned limit
//! is kept in its state ([`RuleState::learned_day`], both stores, shared
//! by every instance, kept across restarts) and applies to the rule's own
//! day quota in every decision: the lower of the configured count and the
//! learned one (`learn = "down"`, the default), or the learned one whatever
//! the configured count says (`learn = "both"`). Callers' shares
//! (`max_share`) and the reserve keep their configured numbers: the rule's
//! own quota bounds them all.
//!
//! A learned limit is kept for [`KEEP_US`] after WeChat last reported it
//! (each sync reports it again): an account whose token wxgate no longer
//! knows falls back to the configured count after two days.

use crate::limit::calendar::Period;
use crate::limit::{Limit, Rule, RuleState};
use crate::time::Micros;

/// How long a learned limit stays after WeChat last reported it.
pub const KEEP_US: Micros = 2 * 86_400_000_000;

/// A day limit WeChat reported for a pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LearnedDay {
    /// quota/get's `daily_limit` (at least 1).
    pub limit: u64,
    /// When WeChat last reported it (store time).
    pub at: Micros,
}

impl LearnedDay {
    /// Whether it still applies at `now`.
    pub fn fresh(&self, now: Micros) -> bool {
        now < self.at.saturating_add(KEEP_US)
    }
}

/// The count a rule's own day quota of `configured` calls has for a pair
/// whose state is `state`, at `now`.
pub fn day_count(rule: &Rule, configured: u64, state: &RuleState, now: Micros) -> u64 {
    match state.learned_day {
        Some(l) if l.fresh(now) => {
            // The local fallback's scaled rule: its instance's part of it.
            let limit = (l.limit / rule.learned_divisor.max(1)).max(1);
            if rule.learn_up || limit < configured {
                limit
            } else {
                configured
            }
        }
        _ => configured,
    }
}

/// The effective day limit of a pair: its rule's day quota as
/// [`day_count`] makes it (`None`: the rule has no day quota).
pub fn day_limit(rule: &Rule, state: &RuleState, now: Micros) -> Option<u64> {
    rule.limits.iter().find_map(|l| match l {
        Limit::Calendar { count, period: Period::Day } => Some(day_count(rule, count.get(), state, now)),
        _ => None,
    })
}

/// WeChat reported `limit` as the pair's day limit at `now`: kept (a
/// `limit` of 0 says nothing and is ignored). Returns the learned limit
/// before (`None`: none, or no longer fresh). `lua/learn_day.lua` mirrors it.
pub fn learn_day(state: &mut RuleState, limit: u64, now: Micros) -> Option<u64> {
    let before = state.learned_day.filter(|l| l.fresh(now)).map(|l| l.limit);
    if limit > 0 {
        state.learned_day = Some(LearnedDay { limit, at: now });
    }
    before
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU64;

    use super::*;

    fn rule(up: bool) -> Rule {
        let count = NonZeroU64::new(100).expect("count");
        Rule { learn_up: up, ..Rule::new("r", vec![Limit::Calendar { count, period: Period::Day }]) }
    }

    #[test]
    fn a_learned_limit_lowers_the_day_quota_and_raises_it_only_when_the_rule_says_both() {
        let mut state = RuleState::default();
        assert_eq!(day_limit(&rule(false), &state, 5), Some(100));
        assert_eq!(learn_day(&mut state, 30, 5), None);
        assert_eq!(day_limit(&rule(false), &state, 6), Some(30));
        assert_eq!(learn_day(&mut state, 300, 7), Some(30));
        assert_eq!(day_limit(&rule(false), &state, 8), Some(100));
        assert_eq!(day_limit(&rule(true), &state, 8), Some(300));
        // Not reported for two days: the configured count again.
        assert_eq!(day_limit(&rule(true), &state, 7 + KEEP_US), Some(100));
        // 0 says nothing.
        assert_eq!(learn_day(&mut state, 0, 9), Some(300));
        assert_eq!(day_limit(&rule(true), &state, 10), Some(300));
    }

    /// acquire.lua keeps its own copy of [`KEEP_US`].
    #[test]
    fn acquire_lua_keeps_a_learned_limit_as_long() {
        let lua = include_str!("../../lua/acquire.lua");
        assert!(lua.contains(&format!("local KEEP_LEARNED = {KEEP_US}\n")), "acquire.lua KEEP_LEARNED");
    }
}
