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
//!
//! **Windows WeChat enforces lower** (`learn_windows`, on by default): a
//! frequency 45009 (not a spent day: see [`crate::ops::quota_sync`]) on a
//! call wxgate admitted within its windows says WeChat's window is smaller
//! for this account. Each window of the pair is lowered, for the rest of the
//! quota day, to [`LOWER_PERCENT`] % of the calls it admitted in the
//! window before the 45009 (and at least one fewer than it allowed):
//! [`lower_windows`]. What a window admitted in its last `W` is counted
//! from its TAT: within a run (admissions that each found the TAT at or
//! after them; the state keeps when the current run began, `runs`), each
//! admission moved the TAT by `T`, so the run's admissions since `s =
//! max(run start, now − W)` are at most `⌊(tat − s) / T⌋`: exact when the
//! run began within the window, at most `B` over when it began earlier (the
//! TAT is at most `τ + T` ahead of any moment of a run). The lowered window
//! `{N', W, B'}` (`B'` at most the default burst of `N'`) is applied over
//! the configured one as the stricter of their `T` and `τ`
//! ([`crate::limit::WindowLimit::tightened`]): both are exact, so the
//! window stays exact for the lower count.

use crate::limit::calendar::Period;
pub use crate::limit::{LearnedDay, LearnedWindow};
use crate::limit::{Limit, LimitState, Rule, RuleState, WindowKey, WindowLimit};
use crate::time::Micros;

/// A frequency 45009 lowers each window to this share of what it admitted
/// in the window before.
pub const LOWER_PERCENT: u64 = 90;

/// The window `w` of `rule` as it applies to a pair whose state is `state`
/// at `now`: lowered by a frequency 45009 until the quota day ends.
pub fn window(rule: &Rule, state: &RuleState, w: &WindowLimit, now: Micros) -> WindowLimit {
    if !rule.learn_windows || state.learned_windows.is_empty() {
        return *w;
    }
    match state.learned_windows.iter().find(|l| l.per_us == w.per_us() && now < l.until) {
        // The local fallback's scaled rule: its instance's part of the
        // lowered count, as of the configured one.
        Some(l) if rule.learned_divisor > 1 => w.tightened(&w.lowered((l.count / rule.learned_divisor).max(1))),
        Some(l) => w.tightened(&WindowLimit::stored(l.count, l.burst, l.per_us, l.interval_us, l.tolerance_us)),
        None => *w,
    }
}

/// WeChat answered a frequency 45009 to a call admitted at `sent_at`, for
/// the pair, at `now`: each window of `rule` is lowered until the next
/// midnight of the quota zone to [`LOWER_PERCENT`] % of what it admitted in
/// the window before (at least one call fewer than it allows now; at least
/// 1). A window lowered at or after `sent_at` is left as it is: the call
/// went under the window before, and the 45009s of calls sent together
/// lower it once, not once each. Returns each window's (count before,
/// count after). `lua/lower_windows.lua` mirrors it.
pub fn lower_windows(
    rule: &Rule,
    state: &mut RuleState,
    now: Micros,
    offset_us: Micros,
    sent_at: Micros,
) -> Vec<(u64, u64)> {
    let until = Period::Day.next_start(now, offset_us);
    let mut lowered = Vec::new();
    for limit in &rule.limits {
        let Limit::Window(configured) = limit else { continue };
        let w = window(rule, state, configured, now);
        if state.learned_windows.iter().any(|l| l.per_us == w.per_us() && now < l.until && l.at >= sent_at) {
            lowered.push((w.count(), w.count()));
            continue;
        }
        let tat = match state.get(WindowKey::Window(w.per_us())) {
            Some(LimitState::Tat(t)) => t,
            _ => now,
        };
        let run = state.runs.iter().find(|(p, _)| *p == w.per_us()).map_or(now, |(_, s)| *s);
        let since = run.max(now - w.per_us());
        let admitted = ((tat - since).max(0) / w.interval_us()) as u64;
        let count = (admitted * LOWER_PERCENT / 100).min(w.count().saturating_sub(1)).max(1);
        let l = configured.lowered(count);
        let learned = LearnedWindow {
            per_us: w.per_us(),
            count: l.count(),
            burst: l.burst(),
            interval_us: l.interval_us(),
            tolerance_us: l.tolerance_us(),
            at: now,
            until,
        };
        match state.learned_windows.iter_mut().find(|x| x.per_us == w.per_us()) {
            Some(slot) => *slot = learned,
            None => state.learned_windows.push(learned),
        }
        lowered.push((w.count(), l.count()));
    }
    lowered
}

/// How long a learned limit stays after WeChat last reported it.
pub const KEEP_US: Micros = crate::limit::LEARNED_KEEP_US;

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
