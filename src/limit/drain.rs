//! When a queue of `n` jobs can have been sent, at the earliest, from a
//! rule's limits and a pair's state: the "drained at" of queued delivery's
//! summary (`GET /v1/deliveries`, docs/queued-delivery.md) and the 202's
//! `X-Wxgate-Eta`.
//!
//! Pure: (rule, state, caller, jobs, now) → time. The answer is the
//! decision's ([`super::decide`]) replayed for `n` calls of cost 1 one after
//! the other, each at the first moment every limit admits it, as a queued
//! send is decided: a normal-priority call (it leaves the rule's
//! `reserve`), counted against its caller's `max_share`, never held. Live
//! traffic shares the day quota at its current rate (`live`: calls per
//! second, the pair's forecast, [`super::forecast`]): from now for the
//! rest of today, and from midnight on each later day, it takes that many
//! of the day's calls before the queue may have them. Otherwise it assumes
//! the queue gets every slot: no other queue spends the rule meanwhile,
//! live calls take no window slot, at full rate (no warm-up), and no
//! recipient's own limit, concurrency cap, WeChat's answer time or back-off
//! slows it: the earliest it can be done at that rate.
//!
//! Cost: logarithmic in `n` per quota period the queue reaches (issue 63:
//! the replay cost one step per job, 1 ms a submission at 32,000 queued).
//! Between two moves of a calendar quota (a period's end, its room spent)
//! the windows alone place the calls, and their schedule has a closed form
//! ([`schedule`]), so the last call such a run holds is found by a search
//! over its length; the calls a calendar moves are replayed one by one
//! ([`Drain::step`]); and whole calendar days are skipped once a day
//! repeats the one before it (a day quota: every day starts fresh and sends
//! the same), so a queue that spills over many days costs its first two
//! days and its last, whatever its length. The replay itself stays
//! ([`Drain::replay`]): the tests compare both on many cases, and it
//! answers for a window whose reserve passes its tolerance (which a
//! compiled rule never has).

mod schedule;

use super::calendar::{Period, DAY_US};
use super::{Limit, LimitState, Rule, RuleState};
use crate::time::Micros;
use schedule::{Schedule, Window};

/// The earliest time all of `jobs` calls of `caller` on `rule` can have
/// been admitted, from `state` at `now` (`offset_us`: the quota day's
/// offset from UTC), while live calls use the day quota at `live` per
/// second. `Some(now)` for no jobs; `None` when a normal call can never be
/// admitted (a calendar quota that the reserve takes whole).
pub fn drained_at(
    rule: &Rule,
    state: &RuleState,
    caller: &str,
    jobs: u64,
    now: Micros,
    offset_us: Micros,
    live: f64,
) -> Option<Micros> {
    let drain = Drain::new(rule, state, caller, jobs, now, offset_us, live)?;
    if jobs == 0 {
        return Some(now);
    }
    Some(if drain.windows.iter().all(|w| w.lead >= 0) { drain.fast() } else { drain.replay() })
}

/// The replay's state: the limits as of call `k`, the last call's time `at`.
struct Drain {
    windows: Vec<Window>,
    calendars: Vec<Calendar>,
    offset_us: Micros,
    jobs: u64,
    /// Calls placed so far.
    k: u64,
    /// The last call's time (before the first: now, or a penalty's end).
    at: Micros,
    /// The last day entered fresh (windows idle, nothing counted): (its
    /// start, calls placed before it).
    fresh: Option<(Micros, u64)>,
    days_only: bool,
}

impl Drain {
    /// `None` when a normal call can never be admitted.
    fn new(
        rule: &Rule,
        state: &RuleState,
        caller: &str,
        jobs: u64,
        now: Micros,
        offset_us: Micros,
        live: f64,
    ) -> Option<Drain> {
        // Of the rule's own day quota only (not a share's).
        let live = if live.is_finite() && live > 0.0 { live } else { 0.0 };
        let kept = |i: usize| rule.reserve.get(i).copied().unwrap_or(0).max(0);
        let mine = (!rule.share.is_empty()).then(|| state.share(caller)).flatten();
        let own = rule.limits.iter().enumerate().map(|(i, l)| (*l, state.get(l.window_key()), kept(i), live));
        let shared = rule.share.iter().map(|l| (*l, mine.and_then(|s| s.get(l.window_key())), 0, 0.0));
        let mut windows: Vec<Window> = Vec::new();
        let mut calendars: Vec<Calendar> = Vec::new();
        for (limit, stored, kept, live) in own.chain(shared) {
            match limit {
                Limit::Window(w) => windows.push(Window {
                    tat: match stored {
                        Some(LimitState::Tat(t)) => t,
                        _ => now,
                    },
                    // Admitted at `a` once tat − τ + kept ≤ a.
                    lead: w.tolerance_us() - kept,
                    step: w.interval_us(),
                }),
                Limit::Calendar { count, period } => {
                    let room = count.get().saturating_sub(kept as u64);
                    if room == 0 {
                        return None;
                    }
                    let (id, used, next) = match stored {
                        Some(LimitState::Count { period_id, used, next }) => (period_id, used, next),
                        _ => (period.id(now, offset_us), 0, 0),
                    };
                    let live = if period == Period::Day { live } else { 0.0 };
                    calendars.push(Calendar { period, room, id, used, next, live, from: now });
                }
            }
        }
        let days_only = calendars.iter().all(|c| c.period == Period::Day);
        // A penalty refuses every call until it ends.
        let at = now.max(state.penalty.until);
        Some(Drain { windows, calendars, offset_us, jobs, k: 0, at, fresh: None, days_only })
    }

    /// Every call replayed one by one: the oracle (and the answer for a
    /// window whose reserve passes its tolerance).
    fn replay(mut self) -> Micros {
        while self.k < self.jobs {
            self.step();
        }
        self.at
    }

    /// The same answer as [`Drain::replay`]: each run of calls the windows
    /// alone place is taken whole from their closed form, and the call
    /// that ends it (a calendar moves it) is replayed. Needs every window's
    /// `lead` ≥ 0.
    fn fast(mut self) -> Micros {
        while self.k < self.jobs {
            let run = Schedule::new(&self.windows, self.at);
            let m = self.plain(&run);
            if m > 0 {
                self.at = run.at(m - 1);
                let tats: Vec<Micros> = self.windows.iter().map(|w| run.tat(w, m)).collect();
                for (w, tat) in self.windows.iter_mut().zip(tats) {
                    w.tat = tat;
                }
                for c in &mut self.calendars {
                    c.used = c.used.saturating_add(m);
                }
                self.k += m;
            }
            if self.k < self.jobs {
                self.step();
            }
        }
        self.at
    }

    /// How many of the next calls `run` places with no calendar moving
    /// them: each in the period every calendar counts now, with room left
    /// (less what live calls took by then). Whether call `i` is such is
    /// monotone (times and counts only grow), so a galloping search finds
    /// the first that is not: O(log) evaluations of the closed form.
    fn plain(&self, run: &Schedule<'_>) -> u64 {
        let left = self.jobs - self.k;
        let off = self.offset_us;
        let ok = |i: u64| {
            let t = run.at(i);
            self.calendars.iter().all(|c| {
                c.period.id(t, off) <= c.id && c.used.saturating_add(i).saturating_add(c.live_at(t, off)) < c.room
            })
        };
        if !ok(0) {
            return 0;
        }
        // ok(lo), and hi == left or !ok(hi).
        let (mut lo, mut hi, mut jump) = (0u64, left, 1u64);
        loop {
            let probe = lo.saturating_add(jump);
            if probe >= left {
                break;
            }
            if ok(probe) {
                lo = probe;
                jump = jump.saturating_mul(2);
            } else {
                hi = probe;
                break;
            }
        }
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if ok(mid) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        hi
    }

    /// Call `k`, as the decision places it.
    fn step(&mut self) {
        let off = self.offset_us;
        let mut at = self.at;
        for w in &self.windows {
            at = at.max(w.tat.max(at) - w.lead);
        }
        let mut jumped = false;
        // A quota spent in the period of `at` moves it to the next period
        // with room; another calendar may then be spent there too (at most
        // two periods ahead each: one pass per calendar settles it).
        for _ in 0..=self.calendars.len() {
            let mut moved = false;
            for c in &mut self.calendars {
                let free = c.free_at(at, off);
                if free > at {
                    at = free;
                    moved = true;
                    jumped = true;
                }
            }
            if !moved {
                break;
            }
        }
        // Whole days alike: once two days in a row started fresh, skip
        // to the last day the rest needs, which starts fresh too.
        if jumped && self.days_only && !self.calendars.is_empty() {
            let idle = self.windows.iter().all(|w| w.tat <= at);
            let counted = self.calendars.iter_mut().all(|c| c.used_at(at, off) == 0);
            if idle && counted {
                if let Some((start, before)) = self.fresh {
                    let (per, span) = (self.k - before, at - start);
                    if per > 0 && span > 0 {
                        let skip = (self.jobs - self.k - 1) / per;
                        self.k += skip * per;
                        at += i64::try_from(skip).unwrap_or(i64::MAX).saturating_mul(span);
                        for c in &mut self.calendars {
                            (c.id, c.used, c.next) = (c.period.id(at, off), 0, 0);
                        }
                    }
                    self.fresh = None;
                } else {
                    self.fresh = Some((at, self.k));
                }
            } else {
                self.fresh = None;
            }
        }
        for w in &mut self.windows {
            w.tat = w.tat.max(at) + w.step;
        }
        for c in &mut self.calendars {
            c.count(at, off);
        }
        self.at = at;
        self.k += 1;
    }
}

/// A calendar quota's count as of period `id`, and its room for a normal
/// call; live calls take `live` per second of it from `from` (now), and
/// from each later period's start.
struct Calendar {
    period: Period,
    room: u64,
    id: i64,
    used: u64,
    next: u64,
    live: f64,
    from: Micros,
}

impl Calendar {
    /// Moves the count to the period of `t` (never earlier than `id`'s).
    fn used_at(&mut self, t: Micros, offset_us: Micros) -> u64 {
        let id = self.period.id(t, offset_us);
        if id > self.id {
            (self.used, self.next) = if id == self.id + 1 { (self.next, 0) } else { (0, 0) };
            self.id = id;
        }
        self.used
    }

    /// Calls live traffic took of the period of `t` by `t`.
    fn live_at(&self, t: Micros, offset_us: Micros) -> u64 {
        if self.live == 0.0 {
            return 0;
        }
        let start = self.from.max(self.period.next_start(t, offset_us) - DAY_US);
        // (A hair over, so that a whole number of calls is not lost to rounding.)
        (self.live * (t - start).max(0) as f64 / 1e6 + 1e-9) as u64
    }

    /// The earliest time ≥ `t` this quota has room for one more call.
    fn free_at(&mut self, t: Micros, offset_us: Micros) -> Micros {
        if self.used_at(t, offset_us).saturating_add(self.live_at(t, offset_us)) < self.room {
            return t;
        }
        let next = self.period.next_start(t, offset_us);
        if self.next < self.room {
            next
        } else {
            self.period.next_start(next, offset_us)
        }
    }

    /// Counts a call admitted at `t`.
    fn count(&mut self, t: Micros, offset_us: Micros) {
        self.used_at(t, offset_us);
        self.used += 1;
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU64;

    use super::schedule::Schedule;
    use super::*;
    use crate::limit::penalty::PenaltyState;
    use crate::limit::rule::WindowLimit;
    use crate::limit::WindowKey;

    const S: Micros = 1_000_000;
    /// Beijing's offset: days start at 16:00 UTC.
    const CN: Micros = 8 * 3600 * S;
    /// 2026-12-03T02:00:00Z (10:00 in Beijing).
    const NOW: Micros = (20_790 * 86_400 + 2 * 3600) * S;

    fn window(count: u64, per_s: i64, burst: u64) -> Limit {
        Limit::Window(WindowLimit::new(count, per_s * S, burst).expect("a window"))
    }

    fn day(count: u64) -> Limit {
        Limit::Calendar { count: NonZeroU64::new(count).expect("count"), period: Period::Day }
    }

    fn midnight_after(t: Micros) -> Micros {
        Period::Day.next_start(t, CN)
    }

    #[test]
    fn a_window_alone_sends_its_burst_at_once_then_one_per_interval() {
        let rule = Rule::new("send", vec![window(60, 60, 10)]);
        let idle = RuleState::default();
        assert_eq!(drained_at(&rule, &idle, "hr", 0, NOW, CN, 0.0), Some(NOW), "nothing to send");
        assert_eq!(drained_at(&rule, &idle, "hr", 10, NOW, CN, 0.0), Some(NOW), "the burst");
        // T = 60 s / 51 slots, rounded up: the 11th call one T after the burst.
        let t = 60 * S / 51 + 1;
        assert_eq!(drained_at(&rule, &idle, "hr", 11, NOW, CN, 0.0), Some(NOW + t));
        assert_eq!(drained_at(&rule, &idle, "hr", 110, NOW, CN, 0.0), Some(NOW + 100 * t));
        // A window spent by earlier calls: its TAT 30 s ahead.
        let mut busy = RuleState::default();
        busy.set(WindowKey::Window(60 * S), LimitState::Tat(NOW + 30 * S));
        let tol = 9 * t;
        assert_eq!(drained_at(&rule, &busy, "hr", 1, NOW, CN, 0.0), Some(NOW + 30 * S - tol));
    }

    #[test]
    fn a_day_quota_spills_into_the_following_days_at_midnight_utc8() {
        let rule = Rule::new("send", vec![day(300), window(1000, 60, 1000)]);
        let mut state = RuleState::default();
        let today = Period::Day.id(NOW, CN);
        state.set(WindowKey::Calendar(Period::Day), LimitState::Count { period_id: today, used: 100, next: 0 });
        // 200 left today: all at once (the window's burst).
        assert_eq!(drained_at(&rule, &state, "hr", 200, NOW, CN, 0.0), Some(NOW));
        // 201: one tomorrow, at Beijing's midnight.
        let tomorrow = midnight_after(NOW);
        assert_eq!(tomorrow % DAY_US, 16 * 3600 * S, "midnight UTC+8 is 16:00 UTC");
        assert_eq!(drained_at(&rule, &state, "hr", 201, NOW, CN, 0.0), Some(tomorrow));
        // 200 today, then 300 a day: 1,100 ends at the start of the 4th day
        // after today (200 + 300 + 300 + 300 = 1,100).
        assert_eq!(drained_at(&rule, &state, "hr", 1_100, NOW, CN, 0.0), Some(tomorrow + 2 * DAY_US));
        assert_eq!(drained_at(&rule, &state, "hr", 1_101, NOW, CN, 0.0), Some(tomorrow + 3 * DAY_US));
        // A year of days costs no more than three (skipped whole): exact still.
        let many = 200 + 300 * 365;
        assert_eq!(drained_at(&rule, &state, "hr", many, NOW, CN, 0.0), Some(tomorrow + 364 * DAY_US));
        // Calls already held over into tomorrow count there.
        state.set(WindowKey::Calendar(Period::Day), LimitState::Count { period_id: today, used: 300, next: 299 });
        assert_eq!(drained_at(&rule, &state, "hr", 1, NOW, CN, 0.0), Some(tomorrow));
        assert_eq!(drained_at(&rule, &state, "hr", 2, NOW, CN, 0.0), Some(tomorrow + DAY_US));
    }

    #[test]
    fn a_day_quota_with_a_slow_window_sends_each_day_at_the_windows_rate() {
        // 3 a day, 1 a minute (burst 1): each day's 3 at 0, 1 and 2 minutes.
        let rule = Rule::new("send", vec![day(3), window(1, 60, 1)]);
        let idle = RuleState::default();
        let tomorrow = midnight_after(NOW);
        assert_eq!(drained_at(&rule, &idle, "hr", 3, NOW, CN, 0.0), Some(NOW + 120 * S));
        assert_eq!(drained_at(&rule, &idle, "hr", 5, NOW, CN, 0.0), Some(tomorrow + 60 * S));
        assert_eq!(drained_at(&rule, &idle, "hr", 3 + 3 * 10, NOW, CN, 0.0), Some(tomorrow + 9 * DAY_US + 120 * S));
    }

    #[test]
    fn live_traffic_takes_its_share_of_the_day_quota_as_the_queue_sends() {
        // 1,000 a day, 1 a minute; live calls 1 a minute too.
        let rule = Rule::new("send", vec![day(1000), window(1, 60, 1)]);
        let idle = RuleState::default();
        let tomorrow = midnight_after(NOW);
        let minutes = |n: i64| n * 60 * S;
        // Alone, the queue sends one a minute all day (14 h are left: 840).
        assert_eq!(drained_at(&rule, &idle, "hr", 600, NOW, CN, 0.0), Some(NOW + minutes(599)));
        // Sharing: by the queue's k-th call live ones took k; 500 + 500 is
        // the day's 1,000, so the queue's 501st waits for midnight, when live
        // calls start again from 0.
        let live = 1.0 / 60.0;
        assert_eq!(drained_at(&rule, &idle, "hr", 500, NOW, CN, live), Some(NOW + minutes(499)));
        assert_eq!(drained_at(&rule, &idle, "hr", 501, NOW, CN, live), Some(tomorrow));
        assert_eq!(drained_at(&rule, &idle, "hr", 600, NOW, CN, live), Some(tomorrow + minutes(99)));
        // 500 a day after that (whole days skipped, exact still).
        let many = 500 + 500 * 10;
        assert_eq!(drained_at(&rule, &idle, "hr", many, NOW, CN, live), Some(tomorrow + 9 * DAY_US + minutes(499)));
        // Live calls fast enough to spend today's rest alone: tomorrow, then
        // what the day leaves the queue (the live rate takes it all by
        // 00:16:40; the queue's first call at midnight goes first).
        let mut state = RuleState::default();
        let today = Period::Day.id(NOW, CN);
        state.set(WindowKey::Calendar(Period::Day), LimitState::Count { period_id: today, used: 1000, next: 0 });
        assert_eq!(drained_at(&rule, &state, "hr", 1, NOW, CN, 1.0), Some(tomorrow));
        assert_eq!(drained_at(&rule, &state, "hr", 2, NOW, CN, 1.0), Some(tomorrow + minutes(1)));
        // A month quota is not shared with the live rate (it has no forecast).
        let month =
            Rule::new("m", vec![Limit::Calendar { count: NonZeroU64::new(3).expect("3"), period: Period::Month }]);
        assert_eq!(drained_at(&month, &idle, "hr", 3, NOW, CN, 100.0), Some(NOW));
    }

    #[test]
    fn a_penalised_pair_drains_no_earlier_than_the_penalty_ends() {
        let rule = Rule::new("send", vec![window(60, 60, 10)]);
        let penalty = PenaltyState { until: NOW + 600 * S, ..PenaltyState::default() };
        let mut state = RuleState { penalty, ..RuleState::default() };
        assert_eq!(drained_at(&rule, &state, "hr", 1, NOW, CN, 0.0), Some(NOW + 600 * S));
        assert_eq!(drained_at(&rule, &state, "hr", 10, NOW, CN, 0.0), Some(NOW + 600 * S), "then the burst");
        let t = 60 * S / 51 + 1;
        assert_eq!(drained_at(&rule, &state, "hr", 11, NOW, CN, 0.0), Some(NOW + 600 * S + t));
        // A penalty over: no effect.
        state.penalty.until = NOW - S;
        assert_eq!(drained_at(&rule, &state, "hr", 10, NOW, CN, 0.0), Some(NOW));
    }

    #[test]
    fn queued_sends_leave_the_reserve_to_high_priority_calls() {
        // reserve 20 %: 20 of the day's 100 and 2 of the window's burst of 10.
        let rule = Rule::new("send", vec![day(100), window(600, 60, 10)]).with_percents(20, 0).expect("reserve");
        let idle = RuleState::default();
        let t = 60 * S / 591 + 1;
        // 8 of the burst at once, then one per T.
        assert_eq!(drained_at(&rule, &idle, "hr", 8, NOW, CN, 0.0), Some(NOW));
        assert_eq!(drained_at(&rule, &idle, "hr", 9, NOW, CN, 0.0), Some(NOW + t));
        // 80 a day for normal calls: the 81st tomorrow.
        assert_eq!(drained_at(&rule, &idle, "hr", 81, NOW, CN, 0.0), Some(midnight_after(NOW)));
        // A reserve that takes a whole quota leaves queued sends nothing.
        let mut all = Rule::new("send", vec![day(5)]);
        all.reserve_percent = 100;
        all.reserve = vec![5];
        assert_eq!(drained_at(&all, &idle, "hr", 1, NOW, CN, 0.0), None);
    }

    /// The decision itself, replayed call by call as the dispatcher sends
    /// a queue (each refused call tried again when its wait is over).
    fn replayed(rule: &Rule, state: &RuleState, jobs: u64, now: Micros) -> Micros {
        let (mut state, mut now, mut last) = (state.clone(), now, now);
        let key = crate::limit::Key { account: "wx1", rule, offset_us: CN };
        let ask = crate::limit::Ask { normal: true, share: Some("hr"), ..crate::limit::Ask::one(key) };
        let mut sent = 0;
        while sent < jobs {
            match crate::limit::decide::decide(&mut state, &ask, now, 0) {
                crate::limit::Decision::Admit { at, .. } => (last, sent) = (at, sent + 1),
                crate::limit::Decision::Reject { wait_us, .. } => now += wait_us.max(1),
            }
        }
        last
    }

    #[test]
    fn the_estimate_is_the_decisions_own_schedule() {
        let rules = [
            Rule::new("a", vec![window(60, 60, 10)]),
            Rule::new("b", vec![day(7), window(2, 3600, 1)]),
            Rule::new("c", vec![day(40), window(600, 60, 10)]).with_percents(20, 50).expect("percents"),
            Rule::new("d", vec![window(100, 1, 5), window(1000, 3600, 100), day(2000)]),
        ];
        let mut busy = RuleState::default();
        busy.set(WindowKey::Window(60 * S), LimitState::Tat(NOW + 45 * S));
        let today = Period::Day.id(NOW, CN);
        busy.set(WindowKey::Calendar(Period::Day), LimitState::Count { period_id: today, used: 5, next: 1 });
        busy.penalty.until = NOW + 90 * S;
        for rule in &rules {
            for state in [RuleState::default(), busy.clone()] {
                for jobs in [1, 2, 9, 10, 11, 39, 41, 100, 333, 2_500] {
                    let want = replayed(rule, &state, jobs, NOW);
                    assert_eq!(drained_at(rule, &state, "hr", jobs, NOW, CN, 0.0), Some(want), "{} {jobs}", rule.name);
                }
            }
        }
    }

    #[test]
    fn a_callers_share_bounds_its_queue() {
        // max_share 50 % of 100 a day: hr's queue sends 50 a day.
        let rule = Rule::new("send", vec![day(100)]).with_percents(0, 50).expect("share");
        let idle = RuleState::default();
        assert_eq!(drained_at(&rule, &idle, "hr", 50, NOW, CN, 0.0), Some(NOW));
        assert_eq!(drained_at(&rule, &idle, "hr", 51, NOW, CN, 0.0), Some(midnight_after(NOW)));
    }

    /// The replay, as it was before the closed form (the oracle).
    fn replay_of(rule: &Rule, state: &RuleState, jobs: u64, now: Micros, live: f64) -> Option<Micros> {
        let drain = Drain::new(rule, state, "hr", jobs, now, CN, live)?;
        Some(if jobs == 0 { now } else { drain.replay() })
    }

    /// A small deterministic generator (xorshift64*).
    struct Gen(u64);

    impl Gen {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n.max(1)
        }

        fn pick<T: Copy>(&mut self, from: &[T]) -> T {
            from[self.below(from.len() as u64) as usize]
        }
    }

    /// Issue 63 item 8: the closed form gives the replay's answer, on
    /// thousands of rules (one to three windows, day and month quotas,
    /// reserves, shares), states (spent windows, counted days with calls
    /// held over, penalties), live rates, start times and queue lengths.
    #[test]
    fn the_closed_form_is_the_replay_on_many_cases() {
        let mut g = Gen(0x9e37_79b9_7f4a_7c15);
        let mut compared = 0;
        for case in 0..6_000 {
            let mut limits = Vec::new();
            for _ in 0..1 + g.below(3) {
                let count = g.pick(&[1, 2, 5, 20, 60, 100, 200, 1000, 5000]);
                let per = g.pick(&[1, 10, 60, 3600, 86_400]);
                let burst = 1 + g.below(count);
                limits.push(window(count, per, burst));
            }
            if g.below(3) > 0 {
                limits.push(day(g.pick(&[1, 3, 7, 40, 100, 300, 2000, 100_000])));
            }
            if g.below(8) == 0 {
                let count = NonZeroU64::new(g.pick(&[3, 50, 1000])).expect("count");
                limits.push(Limit::Calendar { count, period: Period::Month });
            }
            let Ok(rule) = Rule::new("r", limits).with_percents(g.pick(&[0, 0, 10, 20, 50]), g.pick(&[0, 0, 30, 50]))
            else {
                continue;
            };
            let now = NOW + g.below(DAY_US as u64) as i64;
            let mut state = RuleState::default();
            for l in &rule.limits {
                match l {
                    Limit::Window(_) if g.below(2) == 0 => {
                        let tat = now - 100 * S + g.below(3_600 * S as u64) as i64;
                        state.set(l.window_key(), LimitState::Tat(tat));
                    }
                    Limit::Calendar { count, period } if g.below(2) == 0 => {
                        let id = period.id(now, CN) - g.below(2) as i64;
                        let (used, next) = (g.below(count.get() + 1), g.below(count.get() / 2 + 1));
                        state.set(l.window_key(), LimitState::Count { period_id: id, used, next });
                    }
                    _ => {}
                }
            }
            if g.below(6) == 0 {
                state.penalty.until = now + g.below(7_200 * S as u64) as i64;
            }
            let live = g.pick(&[0.0, 0.0, 0.001, 0.01, 0.5, 3.0]);
            let jobs = match g.below(10) {
                0 => g.below(20_000),
                1..=3 => g.below(10),
                _ => g.below(600),
            };
            let want = replay_of(&rule, &state, jobs, now, live);
            let got = drained_at(&rule, &state, "hr", jobs, now, CN, live);
            assert_eq!(got, want, "case {case}: {:?} {state:?} jobs {jobs} live {live} at {now}", rule.limits);
            compared += 1;
        }
        assert!(compared > 3_000, "{compared} cases compared");
    }

    /// The windows' closed form ([`schedule`]) against the windows
    /// replayed call by call: every call's time and every TAT after it, on
    /// generated windows (steps, leads from 0 to the tolerance, TATs behind
    /// and ahead of the start).
    #[test]
    fn the_windows_closed_form_is_their_replay_call_by_call() {
        let mut g = Gen(0x2545_f491_4f6c_dd1d);
        for case in 0..3_000 {
            let start = NOW + g.below(100 * S as u64) as i64;
            let windows: Vec<Window> = (0..1 + g.below(3))
                .map(|_| {
                    let step = 1 + g.below(20 * S as u64) as i64;
                    let tolerance = step * g.below(12) as i64;
                    Window {
                        tat: NOW + g.below(300 * S as u64) as i64,
                        lead: tolerance - g.below(tolerance as u64 + 1) as i64,
                        step,
                    }
                })
                .collect();
            let run = Schedule::new(&windows, start);
            let mut tats: Vec<Micros> = windows.iter().map(|w| w.tat).collect();
            let mut at = start;
            for i in 0..200 {
                for (w, tat) in windows.iter().zip(&tats) {
                    assert_eq!(run.tat(w, i), *tat, "case {case}, TAT before call {i}");
                }
                for (w, tat) in windows.iter().zip(&tats) {
                    at = at.max((*tat).max(at) - w.lead);
                }
                assert_eq!(run.at(i), at, "case {case}, call {i}");
                for (w, tat) in windows.iter().zip(tats.iter_mut()) {
                    *tat = (*tat).max(at) + w.step;
                }
            }
        }
    }

    /// What an estimate costs at depth 0 and 32,000 (printed, not asserted:
    /// `cargo test --lib timing_of_the_estimate -- --nocapture`), the
    /// replay against the closed form, on a campaign's rule (200 a second,
    /// 100,000 a day) and on one whose queue spills over days (1 a second,
    /// 5,000 a day).
    #[test]
    fn timing_of_the_estimate() {
        let rules = [
            ("200/s, 100000/day", Rule::new("send", vec![window(200, 1, 200), day(100_000)])),
            ("1/s, 5000/day", Rule::new("send", vec![window(1, 1, 1), day(5_000)])),
        ];
        let idle = RuleState::default();
        for (name, rule) in &rules {
            for jobs in [1, 32_000] {
                let rounds = if jobs == 1 { 20_000 } else { 50 };
                let time = |f: &dyn Fn() -> Option<Micros>| {
                    let t = std::time::Instant::now();
                    let mut last = None;
                    for _ in 0..rounds {
                        last = std::hint::black_box(f());
                    }
                    (t.elapsed().as_secs_f64() * 1e6 / f64::from(rounds), last)
                };
                let (slow, a) = time(&|| replay_of(rule, &idle, jobs, NOW, 0.0));
                let (fast, b) = time(&|| drained_at(rule, &idle, "hr", jobs, NOW, CN, 0.0));
                assert_eq!(a, b);
                eprintln!("drained_at {name}, {jobs} queued: replay {slow:.2} µs, closed form {fast:.2} µs");
            }
        }
    }
}
