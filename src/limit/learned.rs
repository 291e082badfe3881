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
//! call wxgate admitted within its windows may say WeChat's window is
//! smaller for this account. A window is lowered only on evidence, never
//! below what WeChat showed it takes ([`lower_windows`]):
//!
//! - **Evidence**: the window admitted at least its floor ([`floor`]: 10 %
//!   of its configured count, at least 2) in the window before the 45009.
//!   Fewer calls than that cannot be the limit WeChat enforces on a window
//!   configured for ten times as many (a transient 45009, a spent day, a
//!   limit on something else): the window is left as it is, and the
//!   45009's penalty holds the pair as for every 45009. At least 2: the
//!   refused call alone (WeChat took nothing) says nothing of a window.
//! - **The lowering**: to [`LOWER_PERCENT`] % of the calls it admitted in
//!   the window before the 45009, and at least one fewer than it allowed,
//!   for the rest of the quota day; never below the floor.
//! - **What WeChat took**: never below [`LOWER_PERCENT`] % of the most
//!   calls WeChat took in one window at an earlier 45009 of the day
//!   ([`LearnedWindow::took`]): a later 45009 at fewer calls (a transient
//!   one) cannot ratchet the window below what WeChat showed it takes.
//!   Known without the per-call path: at a 45009, the calls the window
//!   admitted before the refused one were answered by WeChat. Only those
//!   in one calendar window of its length are counted (from the quota
//!   day's midnight: a natural minute, hour), where WeChat may count: a
//!   sliding window spans two of them, and may hold twice WeChat's limit
//!   when WeChat counts so. Counted from the window's current run
//!   (below) and from its last lowering (a 45009 before it ends what
//!   WeChat took), as a lower bound: a call admitted at `t` in a run
//!   holds a slot `s` of the run's grid (`s = run start + k·T`) with `s −
//!   τ ≤ t ≤ s` (it found the TAT `s` at or after it, within the
//!   tolerance), so the slots in `[from + τ, sent)` were all admitted in
//!   `[from, sent)`, and `[run start, sent)` holds at least `⌈(sent − run
//!   start) / T⌉` of them. The 90 % keeps the lowering's margin: a call of
//!   those counted that WeChat refused too, its answer still on its way,
//!   is counted as taken.
//!
//! What a window admitted in its last `W` is counted from its TAT: within
//! a run (admissions that each found the TAT at or after them; the state
//! keeps when the current run began, `runs`), each admission moved the TAT
//! by `T`, so the run's admissions since `s = max(run start, now − W)` are
//! at most `⌊(tat − s) / T⌋`: exact when the run began within the window,
//! at most `B` over when it began earlier (the TAT is at most `τ + T` ahead
//! of any moment of a run). The lowered window `{N', W, B'}` (`B'` at most
//! the default burst of `N'`) is applied over the configured one as the
//! stricter of their `T` and `τ` ([`crate::limit::WindowLimit::tightened`]):
//! both are exact, so the window stays exact for the lower count.

use crate::limit::calendar::{Period, DAY_US};
pub use crate::limit::{LearnedDay, LearnedWindow};
use crate::limit::{Limit, LimitState, Rule, RuleState, WindowKey, WindowLimit};
use crate::time::Micros;

/// A frequency 45009 lowers each window to this share of what it admitted
/// in the window before (and of the most WeChat took in one window).
pub const LOWER_PERCENT: u64 = 90;

/// A window is lowered only when it admitted at least this share of its
/// configured count in the window before the 45009, and never below it
/// ([`floor`]).
pub const FLOOR_PERCENT: u64 = 10;

/// ... and at least this many calls: the refused one and one WeChat took.
pub const FLOOR_MIN: u64 = 2;

/// The floor of a window configured for `count` calls: the fewest calls
/// in the window before a 45009 that lower it, and the lowest count it is
/// lowered to.
pub fn floor(count: u64) -> u64 {
    count.saturating_mul(FLOOR_PERCENT).div_ceil(100).max(FLOOR_MIN)
}

/// What a frequency 45009 did to one window of the pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lowering {
    /// The count that applied before, and the one that applies now.
    pub before: u64,
    pub after: u64,
    /// The calls it admitted in the window before the 45009 (0 with
    /// [`Outcome::Already`]: not counted).
    pub admitted: u64,
    pub outcome: Outcome,
}

/// Why a window was lowered or not ([`lower_windows`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Lowered until the quota day ends.
    Lowered,
    /// Lowered already, at or after the refused call was sent: calls sent
    /// together lower it once.
    Already,
    /// It admitted fewer calls than its [`floor`] in the window before: no
    /// evidence of a window WeChat enforces lower.
    FewCalls,
    /// Its floor, or [`LOWER_PERCENT`] % of the most calls WeChat took in
    /// one window today, is at or above the count that applies.
    AtBound,
}

impl Outcome {
    /// The code `lua/lower_windows.lua` answers for it.
    pub fn code(self) -> i64 {
        match self {
            Outcome::Lowered => 0,
            Outcome::Already => 1,
            Outcome::FewCalls => 2,
            Outcome::AtBound => 3,
        }
    }

    /// The outcome of a code `lua/lower_windows.lua` answered (`None`: none).
    pub fn of_code(code: i64) -> Option<Outcome> {
        [Outcome::Lowered, Outcome::Already, Outcome::FewCalls, Outcome::AtBound].into_iter().find(|o| o.code() == code)
    }
}

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
/// the pair, at `now`: each window of `rule` that admitted at least its
/// [`floor`] in the window before is lowered until the next midnight of
/// the quota zone to [`LOWER_PERCENT`] % of what it admitted (at least one
/// call fewer than it allows now), never below its floor nor below
/// [`LOWER_PERCENT`] % of the most calls WeChat took in one window at an
/// earlier 45009 today. A window lowered at or after `sent_at` is left as
/// it is: the call went under the window before, and the 45009s of calls
/// sent together lower it once. `lua/lower_windows.lua` mirrors it.
pub fn lower_windows(
    rule: &Rule,
    state: &mut RuleState,
    now: Micros,
    offset_us: Micros,
    sent_at: Micros,
) -> Vec<Lowering> {
    let until = Period::Day.next_start(now, offset_us);
    let mut out = Vec::new();
    for limit in &rule.limits {
        let Limit::Window(configured) = limit else { continue };
        let w = window(rule, state, configured, now);
        let live = state.learned_windows.iter().find(|l| l.per_us == w.per_us() && now < l.until).copied();
        let unchanged = |admitted, outcome| Lowering { before: w.count(), after: w.count(), admitted, outcome };
        if live.is_some_and(|l| l.at >= sent_at) {
            out.push(unchanged(0, Outcome::Already));
            continue;
        }
        let tat = match state.get(WindowKey::Window(w.per_us())) {
            Some(LimitState::Tat(t)) => t,
            _ => now,
        };
        let run = state.runs.iter().find(|(p, _)| *p == w.per_us()).map_or(now, |(_, s)| *s);
        let since = run.max(now - w.per_us());
        let admitted = ((tat - since).max(0) / w.interval_us()) as u64;
        let floor = floor(configured.count());
        let took_before = live.map_or(0, |l| l.took);
        let bound = floor.max(took_before.saturating_mul(LOWER_PERCENT) / 100);
        let count = bound.max((admitted * LOWER_PERCENT / 100).min(w.count().saturating_sub(1)));
        if admitted < floor {
            out.push(unchanged(admitted, Outcome::FewCalls));
            continue;
        }
        if count >= w.count() {
            out.push(unchanged(admitted, Outcome::AtBound));
            continue;
        }
        let from = calendar_start(sent_at, w.per_us(), offset_us).max(live.map_or(Micros::MIN, |l| l.at));
        let took = took(run, sent_at, from, w.interval_us(), configured.tolerance_us()).max(took_before);
        let l = configured.lowered(count);
        let learned = LearnedWindow {
            per_us: w.per_us(),
            count: l.count(),
            burst: l.burst(),
            interval_us: l.interval_us(),
            tolerance_us: l.tolerance_us(),
            at: now,
            until,
            took,
        };
        match state.learned_windows.iter_mut().find(|x| x.per_us == w.per_us()) {
            Some(slot) => *slot = learned,
            None => state.learned_windows.push(learned),
        }
        out.push(Lowering { before: w.count(), after: l.count(), admitted, outcome: Outcome::Lowered });
    }
    out
}

/// The start of the calendar window of length `per_us` that holds `at`:
/// windows counted from the quota day's midnight (a natural minute, hour).
fn calendar_start(at: Micros, per_us: Micros, offset_us: Micros) -> Micros {
    let midnight = (at + offset_us).div_euclid(DAY_US) * DAY_US - offset_us;
    midnight + (at - midnight) / per_us.max(1) * per_us.max(1)
}

/// At least how many calls of the run that began at `run` were admitted in
/// `[from, sent_at)`, the refused call (admitted at `sent_at`) in that run:
/// the run's grid slots in `[run, sent_at)` when it began at or after
/// `from`, else those in `[from + τ, sent_at)` (module doc). None when the
/// refused call was of an earlier run.
fn took(run: Micros, sent_at: Micros, from: Micros, interval_us: Micros, tolerance_us: Micros) -> u64 {
    let t = interval_us.max(1);
    let n = if run > sent_at {
        0
    } else if run >= from {
        (sent_at - run + t - 1) / t
    } else {
        (sent_at - from - tolerance_us).max(0) / t
    };
    n as u64
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

    #[test]
    fn the_floor_is_a_tenth_of_the_configured_count_and_at_least_two() {
        let floors: Vec<u64> = [1, 2, 10, 15, 25, 100, 600].into_iter().map(floor).collect();
        assert_eq!(floors, [2, 2, 2, 2, 3, 10, 60]);
    }

    /// What WeChat took is counted in the natural minute (hour) holding the
    /// refused call, in the quota zone; from the run's start when it began
    /// within it, else from the minute's start plus the tolerance.
    #[test]
    fn what_wechat_took_is_counted_within_the_calendar_window_of_the_refused_call() {
        const S: Micros = 1_000_000;
        const BEIJING: Micros = 8 * 3600 * S;
        // 2026-11-29 10:00:00 Beijing.
        let ten = (20_786 * 86_400 + 2 * 3600) * S;
        assert_eq!(calendar_start(ten + 35 * S, 60 * S, BEIJING), ten);
        assert_eq!(calendar_start(ten + 60 * S, 60 * S, BEIJING), ten + 60 * S);
        assert_eq!(calendar_start(ten + 3599 * S, 3600 * S, BEIJING), ten);
        let t = 625_000;
        // The run began at 10:00:00: its slots 0..56 before 10:00:35.
        assert_eq!(took(ten, ten + 35 * S, ten, t, 4 * t), 56);
        // It began a minute earlier: slots in [10:00:02.5, 10:00:35), 52.
        assert_eq!(took(ten - 60 * S, ten + 35 * S, ten, t, 4 * t), 52);
        // The refused call was of an earlier run: nothing known.
        assert_eq!(took(ten + 36 * S, ten + 35 * S, ten, t, 4 * t), 0);
    }

    /// acquire.lua keeps its own copy of [`KEEP_US`].
    #[test]
    fn acquire_lua_keeps_a_learned_limit_as_long() {
        let lua = include_str!("../../lua/acquire.lua");
        assert!(lua.contains(&format!("local KEEP_LEARNED = {KEEP_US}\n")), "acquire.lua KEEP_LEARNED");
    }
}
