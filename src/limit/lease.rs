//! Quota leases: a slice of a pair's limits taken in one decision and spent
//! by one instance in-process ([`take`]), the part it did not spend given
//! back ([`give_back`]). Pure maths; `lua/lease.lua` and
//! `lua/lease_return.lua` compute the same, and the conformance table holds
//! them together.
//!
//! **Why a leased unit keeps every window exact.** The GCRA argument of
//! [`crate::limit`] can be read as *virtual slots*: an admission at time `s`
//! takes the slot `[v, v + T)` with `v = max(tat, s)` and `s ≤ v ≤ s + τ`,
//! and the slots of all admissions are disjoint. N + 1 calls sent inside
//! `[t, t + W)` would hold N + 1 disjoint slots starting in
//! `[t, t + W + τ)`, so `(N + 1)·T < W + τ + T`, i.e. `(N − B + 1)·T < W`:
//! impossible, as `T ≥ W / (N − B + 1)`. So any way of sending is
//! window-exact as long as **every send at `s` owns a slot `v` with
//! `s ≤ v ≤ s + τ`, no slot owned twice**. A lease taken at store time `now`
//! that may be spent until `until` books `k` consecutive slots starting at
//! `v₀ = max(tat, until)` and ending at most at `now + τ`
//! (`v₀ + (k − 1)·T ≤ now + τ`): whenever in `[now, until]` a unit is sent,
//! any of the lease's slots has `s ≤ until ≤ v₀ ≤ v` and
//! `v ≤ now + τ ≤ s + τ`. The units are therefore interchangeable and may
//! be spent in any order at any moment of the lease, and the TAT after the
//! lease (`v₀ + k·T`) keeps every later admission's slot after them. The
//! price: a lease never holds more than a window's burst (`k ≤ B`), nor
//! lasts longer than its tolerance (`until − now ≤ τ`), and the slots
//! between the TAT and `until` stay unused when the pair was idle.
//! With the arrival margin of `[server] window_margin` in `T`, a send's
//! trip to WeChat is covered as any call's.
//!
//! **Calendar quotas** count the `k` units when the lease is taken, in the
//! period of `now`; a lease ends no later than that period
//! (`until ≤` its end), and what it did not spend is given back exactly.
//! A lease takes at most half of what is left of each (rounded up): near
//! its end a quota goes out one call at a time.
//!
//! **All or nothing, reserve, penalty.** A lease is `k` admissions at once:
//! every limit of the rule holds `k` more or the lease is smaller (down to
//! none); a lease for a normal-priority caller leaves the reserve as such a
//! call would; a penalty grants nothing.
//!
//! **clear_quota** ([`super::decide::clear`]) keeps counted the units of
//! the leases that may still be sent: WeChat counts them after its reset.
//! An instance takes its next lease of a pair only once its last one is
//! spent or over (`src/store/resilient/leases.rs`), so only its last lease,
//! while it lasts, may still send: each take replaces the instance's
//! record ([`RuleState::leases`]), and a clear keeps the units of the
//! records not over. (Some of them may have been sent before the clear:
//! counted twice, the safe side, at most one lease per instance.) Units
//! given back leave the record; a lease taken before the last clear gives
//! back of the day count only what the clear kept of it (its record's
//! units, if it was still the instance's last): the rest the clear dropped
//! already ([`RuleState::cleared_at`]).
//!
//! **Refunds.** A window's refund ([`super::decide::refund`]) moves the TAT
//! back only past every moment a call already admitted may still be sent:
//! the latest lease's end is one of them ([`RuleState::lease_end`]).
//!
//! **Given back.** Calendar units exactly, in the lease's period (of the
//! day, after a clear, what the clear kept: see clear_quota above). A
//! window's unspent slots only when they are the last ones booked (the TAT
//! is still the lease's end): the spent units then own the lease's first
//! slots, which stay booked. Slots another admission followed are left to
//! pass unused.
//!
//! Leases are for rules every one of whose limits is a count over time:
//! no concurrency cap, `max_share`, `per_recipient` or warm-up
//! ([`supports`]); those are decided per call.
//!
//! **Reserves** ([`Want::reserve`]): a lease of the calendar quotas only,
//! for any rule that has one, until the end of their current period; no
//! window slot is booked, so no window moves (and `lease_end`, which
//! bounds window refunds, stays). An instance spends a reserve only while
//! the store cannot answer, deciding the windows by its own share meanwhile
//! (`src/store/resilient/leases.rs`): the calendar units were counted when
//! the reserve was taken, so an outage spends exactly what was reserved.
//! Its record is the instance's with [`RESERVE_RECORD`] appended, apart
//! from its last lease: `clear_quota` keeps both counted while they last.

use super::calendar::Period;
use super::decide::{counts, own_count, set_run, tat_of};
use super::{learned, InstanceLease, Limit, LimitState, Quota, Rule, RuleState, WindowKey};
use crate::time::Micros;

pub use super::{RESERVE_RECORD, RESERVE_RETRY_US};

/// What a take asks for: at most `units`, spendable for at most `span_us`,
/// by `instance` ([`InstanceLease::instance`]), leaving the rule's reserve
/// when `normal` (a normal-priority caller's lease).
#[derive(Debug, Clone, Copy)]
pub struct Want<'a> {
    pub instance: &'a str,
    pub units: u64,
    pub span_us: Micros,
    pub normal: bool,
    /// A reserve: the calendar quotas only, until their period's end
    /// (`span_us` is not read); `instance` is then the reserve's record
    /// (the instance's id and [`RESERVE_RECORD`]).
    pub reserve: bool,
}

/// What one limit of the rule booked for a lease, to give back by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Booked {
    pub key: WindowKey,
    /// A window: its TAT after the lease. A calendar quota: the period id
    /// the lease's units count in.
    pub end: Micros,
    /// A window's emission interval at the lease; 0 for a calendar quota.
    pub step: Micros,
}

/// A lease's grant: `units` calls that may be sent from `at` until `until`
/// (store time), each of them already counted against every limit. None
/// granted: all zero.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Leased {
    pub units: u64,
    pub at: Micros,
    pub until: Micros,
    /// A success of a leased call should end a penalty's escalation (as
    /// [`super::Decision::Admit`]'s `escalated`).
    pub escalated: bool,
    /// The limit with least room left after the lease, as an admission's
    /// [`super::Decision::Admit`] `quota` (for the `RateLimit` header).
    pub quota: Option<Quota>,
    /// Per limit of the rule, in its order (empty when nothing is granted).
    pub booked: Vec<Booked>,
}

/// Whether `rule` has a calendar quota (what a reserve holds).
pub fn has_calendar(rule: &Rule) -> bool {
    rule.limits.iter().any(|l| matches!(l, Limit::Calendar { .. }))
}

/// Whether calls of `rule` may be leased (see the module's last paragraph).
pub fn supports(rule: &Rule) -> bool {
    !rule.limits.is_empty()
        && rule.concurrency == 0
        && rule.share.is_empty()
        && !rule.recipients_matter()
        && rule.warmup_us <= 0
}

/// Takes a lease as `want` asks, from `now`, for `want.instance`, whose
/// last lease of the pair is spent or over. Grants nothing (0 units) under
/// a penalty, for a rule that [`supports`] not, or when some limit has no
/// room for one unit.
pub fn take(state: &mut RuleState, rule: &Rule, want: &Want<'_>, now: Micros, offset_us: Micros) -> Leased {
    let reserve = want.reserve;
    let leasable = if reserve { has_calendar(rule) } else { supports(rule) };
    if want.units == 0 || !leasable || state.penalty.remaining(now).is_some() {
        return Leased::default();
    }
    let normal = want.normal;
    let kept = |i: usize| if normal { rule.reserve.get(i).copied().unwrap_or(0) } else { 0 };
    // The lease ends with its span (a reserve: none), and with the current
    // period of every calendar quota.
    let mut until = if reserve { Micros::MAX } else { now + want.span_us.max(0) };
    for limit in &rule.limits {
        if let Limit::Calendar { period, .. } = limit {
            until = until.min(period.next_start(now, offset_us) - 1);
        }
    }
    // How many units every limit holds.
    let mut units = want.units;
    for (i, limit) in rule.limits.iter().enumerate() {
        let room = match *limit {
            Limit::Window(_) if reserve => continue,
            Limit::Window(w) => {
                let w = learned::window(rule, state, &w, now);
                let v0 = tat_of(state.get(limit.window_key()), now).max(until);
                let free = now + w.tolerance_us() - kept(i) - v0;
                if free < 0 {
                    0
                } else {
                    (free / w.interval_us()) as u64 + 1
                }
            }
            Limit::Calendar { count, period } => {
                let count = own_count(rule, state, count.get(), period, now);
                let (used, _) = counts(state.get(limit.window_key()), period.id(now, offset_us));
                // At most half of what is left: near its end a quota goes
                // out in ever smaller slices, down to one call, so the last
                // calls are not stranded in one instance's lease.
                count.saturating_sub(kept(i).max(0) as u64).saturating_sub(used).div_ceil(2)
            }
        };
        units = units.min(room);
    }
    if units == 0 {
        return Leased::default();
    }
    // Book them: each window's slots from max(tat, until), each calendar's
    // count; note the limit with least room left after them (as an
    // admission does, for the RateLimit header).
    let mut booked = Vec::with_capacity(rule.limits.len());
    let mut quota: Option<Quota> = None;
    for (i, limit) in rule.limits.iter().enumerate() {
        let key = limit.window_key();
        let (remaining, reset_us) = match *limit {
            Limit::Window(_) if reserve => {
                // Nothing booked, nothing to give back (a step of 0).
                booked.push(Booked { key, end: 0, step: 0 });
                continue;
            }
            Limit::Window(w) => {
                let w = learned::window(rule, state, &w, now);
                let stored = state.get(key);
                if rule.learn_windows && !matches!(stored, Some(LimitState::Tat(t)) if t >= now) {
                    set_run(state, w.per_us(), now);
                }
                let end = tat_of(state.get(key), now).max(until) + units as i64 * w.interval_us();
                state.set(key, LimitState::Tat(end));
                booked.push(Booked { key, end, step: w.interval_us() });
                let room = (now + w.tolerance_us() + w.interval_us() - end).div_euclid(w.interval_us()).max(0);
                (room as u64, end - now)
            }
            Limit::Calendar { count, period } => {
                let count = own_count(rule, state, count.get(), period, now);
                let current = period.id(now, offset_us);
                let (used, next) = counts(state.get(key), current);
                state.set(key, LimitState::Count { period_id: current, used: used + units, next });
                booked.push(Booked { key, end: current, step: 0 });
                (count.saturating_sub(used + units), period.next_start(now, offset_us) - now)
            }
        };
        if quota.is_none_or(|q| remaining < q.remaining) {
            quota = Some(Quota { limit: i, remaining, reset_us });
        }
    }
    if !reserve {
        state.last_call = now;
        state.lease_end = state.lease_end.max(until);
    }
    // The instance's record: this lease replaces its last one (spent or
    // over); the records of leases over are forgotten.
    state.leases.retain(|l| l.until > now && *l.instance != *want.instance);
    state.leases.push(InstanceLease { instance: want.instance.into(), units, until });
    Leased { units, at: now, until, escalated: state.penalty.is_recent(now), quota, booked }
}

/// Gives back `unspent` units of `lease`, which `instance` took, at `now`
/// (none of them was or will be sent): see the module's "Given back".
/// Returns whether anything was.
pub fn give_back(
    state: &mut RuleState,
    instance: &str,
    lease: &Leased,
    unspent: u64,
    now: Micros,
    offset_us: Micros,
) -> bool {
    let unspent = unspent.min(lease.units);
    if unspent == 0 {
        return false;
    }
    // The instance's record of the lease, while it is still its last.
    let record = state.leases.iter_mut().find(|l| *l.instance == *instance && l.until == lease.until);
    // A clear_quota since the take left of the lease in the day count only
    // what it kept of the record: no more of the day comes back.
    let day = if state.cleared_at >= lease.at { record.as_ref().map_or(0, |l| l.units.min(unspent)) } else { unspent };
    if let Some(l) = record {
        l.units = l.units.saturating_sub(unspent);
    }
    let mut given = false;
    for b in &lease.booked {
        let after = match (b.key, state.get(b.key)) {
            (WindowKey::Window(_), Some(LimitState::Tat(t))) if t == b.end && b.step > 0 => {
                LimitState::Tat(t - unspent as i64 * b.step)
            }
            (WindowKey::Calendar(period), stored @ Some(LimitState::Count { .. })) => {
                let back = if period == Period::Day { day } else { unspent };
                let current = period.id(now, offset_us);
                let (used, next) = counts(stored, current);
                if b.end != current || used == 0 || back == 0 {
                    continue;
                }
                LimitState::Count { period_id: current, used: used.saturating_sub(back), next }
            }
            _ => continue,
        };
        state.set(b.key, after);
        given = true;
    }
    given
}
