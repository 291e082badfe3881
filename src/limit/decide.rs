//! The decision itself. `lua/acquire.lua` computes the same thing, step by
//! numbered step, in the same order and with the same integer arithmetic;
//! it differs in shape only (it decides a batch of calls per run and reads
//! and writes each pair state once). Change both together: the conformance
//! table (`tests/conformance.rs`) holds them to identical results.

use super::{
    recipient_key, recipient_tat, Ask, Decision, Limit, LimitState, Quota, Reason, RecipientState, Rule, RuleState,
    ShareState, WindowKey, WindowLimit,
};
use crate::limit::calendar::Period;
use crate::limit::learned;
use crate::time::Micros;

/// Decides `ask` at store time `now` and, if it is admitted, debits `state`:
/// every limit of the rule or none. `account_warm` is the account's last
/// access-token refresh (0: none). See [`crate::limit`] for the guarantees.
pub fn decide(state: &mut RuleState, ask: &Ask<'_>, now: Micros, account_warm: Micros) -> Decision {
    let rule = ask.key.rule;
    let offset_us = ask.key.offset_us;
    // 1. A penalty refuses at once and consumes nothing.
    if let Some(wait_us) = state.penalty.remaining(now) {
        return Decision::reject(wait_us, Reason::Penalty);
    }
    // 2. Concurrency: expired leases (a crashed instance's) free their slots.
    if rule.concurrency > 0 {
        state.holders.retain(|(_, exp)| *exp > now);
        if state.holders.len() >= rule.concurrency as usize {
            let free_at = state.holders.iter().map(|(_, exp)| *exp).min().unwrap_or(now);
            return Decision::reject(free_at - now, Reason::Concurrency);
        }
    }
    // 3. Warm-up restarts when the pair was idle for a whole warm-up period.
    let cold = state.last_call == 0 || now - state.last_call >= rule.warmup_us;
    let warm_start = if cold { now } else { state.warm_start }.max(account_warm);

    // 4. Each limit's own wait from now; the largest decides (first on ties).
    //    A normal call of a rule with a reserve must leave the reserve: its
    //    own waits; `plain` is what a high call would wait (for the reason).
    //    With `max_share`, the caller's own sub-limits count too (after the
    //    rule's: on a tie the rule's reason is given).
    let normal = ask.normal && !rule.reserve.is_empty();
    let share = ask.share.filter(|_| !rule.share.is_empty());
    let mine = share.and_then(|caller| state.share(caller));
    //    A call costing n must find room for n at once: one that no wait
    //    can make room for (more than a window's burst) is refused.
    let cost = ask.cost.max(1);
    //    With `per_recipient`, each recipient's own windows count too
    //    (after the shares), each recipient costing 1.
    let recipients: Vec<(u64, Option<&RecipientState>)> = if rule.recipients_matter() {
        ask.recipients.iter().map(|id| recipient_key(id)).map(|k| (k, state.recipients.get(k))).collect()
    } else {
        Vec::new()
    };
    let terms = Terms { rule, share: share.map(|_| mine), now, offset_us, cost, warm_start, recipients: &recipients };
    let (at, reason, fits) = earliest(state, &terms, normal);
    let wait = at - now;
    if wait > ask.max_wait_us || !fits {
        // A normal call: `reserve` if a high one would go, else the reason a
        // high one would be refused for (so "quota" always means spent).
        let reason = match normal.then(|| earliest(state, &terms, false)) {
            Some((plain, _, true)) if plain - now <= ask.max_wait_us => Reason::Reserve,
            Some((_, plain_reason, _)) => plain_reason,
            None => reason,
        };
        // Every recipient whose own limits refuse it, so the caller can
        // leave them out (WeChat has no partial send: the whole is refused).
        let over = terms
            .recipients
            .iter()
            .enumerate()
            .filter(|(_, (_, s))| recipient_wait(rule, *s, now) > ask.max_wait_us)
            .map(|(i, _)| i as u32)
            .collect();
        // A calendar quota partly held in a reserve: try again soon.
        let wait = if reason == Reason::Quota && wait > super::RESERVE_RETRY_US && state.reserve_out(now) {
            super::RESERVE_RETRY_US
        } else {
            wait
        };
        return Decision::Reject { wait_us: wait, reason, over };
    }
    // The keys only: the states borrowed above are written below.
    let keys: Vec<u64> = if recipients.is_empty() { Vec::new() } else { recipients.iter().map(|(k, _)| *k).collect() };
    drop(recipients);

    // 5. Admit at `at`: debit everything, noting the limit with least room.
    let (quota, calendar) = debit_limits(state, rule, at, now, offset_us, cost, warm_start);
    if let Some(caller) = share {
        debit_share(state, rule, caller, at, now, offset_us, cost);
    }
    if !keys.is_empty() {
        for key in keys {
            debit_recipient(state.recipients.entry(key), rule, at);
        }
    }
    // Without a warm-up its start is never read: not written either (one
    // field less per call on Redis). A warm-up added by a reload then finds
    // a busy pair warm, as it is.
    if cold && rule.warmup_us > 0 {
        state.warm_start = now;
    }
    state.last_call = now;
    if rule.concurrency > 0 {
        state.holders.push((ask.holder.to_owned(), at + ask.lease_us));
    }
    Decision::Admit { at, hold_us: wait, escalated: state.penalty.is_recent(now), quota, calendar }
}

/// Debits each of the rule's own limits for a call of `cost` admitted at
/// `at` (step 5): a window's TAT moves on by `cost` emission intervals
/// (under warm-up from `warm_start`), a calendar's count of the period of
/// `at` goes up by `cost`. Returns the limit with least room left after
/// it, and the calendar limit with least (the answer's quota headers).
fn debit_limits(
    state: &mut RuleState,
    rule: &Rule,
    at: Micros,
    now: Micros,
    offset_us: Micros,
    cost: u64,
    warm_start: Micros,
) -> (Option<Quota>, Option<Quota>) {
    let mut quota: Option<Quota> = None;
    let mut calendar: Option<Quota> = None;
    for (i, limit) in rule.limits.iter().enumerate() {
        let key = limit.window_key();
        let (after, remaining, reset_us) = match *limit {
            Limit::Window(w) => {
                let w = learned::window(rule, state, &w, now);
                let stored = state.get(key);
                // learn_windows: a TAT found in the past starts a new run.
                if rule.learn_windows && !matches!(stored, Some(LimitState::Tat(t)) if t >= at) {
                    set_run(state, w.per_us(), at);
                }
                let tat = tat_of(stored, at) + cost as i64 * interval(&w, rule, warm_start, now);
                let room = (now + w.tolerance_us() + w.interval_us() - tat).div_euclid(w.interval_us()).max(0);
                (LimitState::Tat(tat), room as u64, tat - now)
            }
            Limit::Calendar { count, period } => {
                let count = own_count(rule, state, count.get(), period, now);
                let current = period.id(now, offset_us);
                let (used, next) = counts(state.get(key), current);
                let after = if period.id(at, offset_us) == current {
                    LimitState::Count { period_id: current, used: used + cost, next }
                } else {
                    LimitState::Count { period_id: current, used, next: next + cost }
                };
                let used_now = match after {
                    LimitState::Count { used, .. } => used,
                    LimitState::Tat(_) => 0,
                };
                (after, count.saturating_sub(used_now), period.next_start(now, offset_us) - now)
            }
        };
        if quota.is_none_or(|q| remaining < q.remaining) {
            quota = Some(Quota { limit: i, remaining, reset_us });
        }
        if matches!(limit, Limit::Calendar { .. }) && calendar.is_none_or(|q| remaining < q.remaining) {
            calendar = Some(Quota { limit: i, remaining, reset_us });
        }
        state.set(key, after);
    }
    (quota, calendar)
}

/// Notes that the window of length `per_us` began a new run at `at`.
pub(super) fn set_run(state: &mut RuleState, per_us: Micros, at: Micros) {
    match state.runs.iter_mut().find(|(p, _)| *p == per_us) {
        Some(run) => run.1 = at,
        None => state.runs.push((per_us, at)),
    }
}

/// The count of a rule's own calendar quota for this pair: a day quota's
/// lowered (or, with `learn = "both"`, raised) by the day limit WeChat
/// reported ([`crate::limit::learned`]).
pub(super) fn own_count(rule: &Rule, state: &RuleState, count: u64, period: Period, now: Micros) -> u64 {
    match period {
        Period::Day => crate::limit::learned::day_count(rule, count, state, now),
        Period::Month => count,
    }
}

/// What [`earliest`] weighs a call against: its rule, the caller's share
/// state when the rule's `max_share` applies (`Some(None)`: none yet), the
/// store time and offset, the call's cost and the pair's warm-up start.
struct Terms<'a> {
    rule: &'a Rule,
    share: Option<Option<&'a ShareState>>,
    now: Micros,
    offset_us: Micros,
    cost: u64,
    warm_start: Micros,
    /// Each recipient's key and state (`per_recipient`; empty: none).
    recipients: &'a [(u64, Option<&'a RecipientState>)],
}

/// The earliest moment every limit admits a call of `t.cost` (keeping the
/// reserve when `normal`), which kind of limit set it, and whether any wait
/// can make room for it at all: a window admits n calls at once only while
/// (n − 1) emission intervals fit in its tolerance (its burst), past what a
/// normal call must leave.
fn earliest(state: &RuleState, t: &Terms<'_>, normal: bool) -> (Micros, Reason, bool) {
    let (rule, now, offset_us) = (t.rule, t.now, t.offset_us);
    let extra = t.cost.saturating_sub(1);
    let kept = |i: usize| if normal { rule.reserve.get(i).copied().unwrap_or(0) } else { 0 };
    // Every limit that must admit the call: (limit, its state, what this call
    // may not use, its emission interval now, the reason it gives), the rule's first.
    let own = rule.limits.iter().enumerate().map(|(i, l)| {
        let l = &match *l {
            Limit::Window(w) => Limit::Window(learned::window(rule, state, &w, now)),
            calendar => calendar,
        };
        let reason = if matches!(l, Limit::Window(_)) { Reason::Rate } else { Reason::Quota };
        let step = match l {
            Limit::Window(w) => interval(w, rule, t.warm_start, now),
            Limit::Calendar { .. } => 0,
        };
        let count = match *l {
            Limit::Calendar { count, period } => own_count(rule, state, count.get(), period, now),
            Limit::Window(_) => 0,
        };
        (*l, count, state.get(l.window_key()), kept(i), step, reason)
    });
    let shared = t.share.into_iter().flat_map(|mine| {
        rule.share.iter().map(move |l| {
            let step = match l {
                Limit::Window(w) => w.interval_us(),
                Limit::Calendar { .. } => 0,
            };
            let count = match *l {
                Limit::Calendar { count, .. } => count.get(),
                Limit::Window(_) => 0,
            };
            (*l, count, mine.and_then(|s| s.get(l.window_key())), 0, step, Reason::Share)
        })
    });
    let terms = own.chain(shared);
    let mut worst = 0;
    let mut reason = Reason::Rate;
    let mut fits = true;
    for (limit, count, stored, kept, step, why) in terms.clone() {
        let wait = match limit {
            Limit::Window(w) => {
                let more = (extra as i64).saturating_mul(step);
                if more > 0 && more.saturating_add(kept) > w.tolerance_us() {
                    fits = false;
                }
                tat_of(stored, now) - w.tolerance_us() + kept + more - now
            }
            Limit::Calendar { period, .. } => {
                let room = count.saturating_sub(kept as u64).saturating_sub(extra);
                if extra > 0 && room == 0 {
                    fits = false;
                }
                calendar_free_at(stored, room, period, now, offset_us) - now
            }
        };
        if wait > worst {
            worst = wait;
            reason = why;
        }
    }
    // Each recipient's own windows: 1 each, no warm-up (the rule's windows
    // slow the call already), after the rule's (whose reason wins a tie).
    for (_, stored) in t.recipients {
        let wait = recipient_wait(rule, *stored, now);
        if wait > worst {
            worst = wait;
            reason = Reason::Recipient;
        }
    }
    // A hold can cross midnight: the call then counts in the next period,
    // which must have room too. (max_wait is far shorter than a day, so one
    // pass over the calendars settles it.)
    let mut at = now + worst;
    for (limit, count, stored, kept, _, why) in terms {
        if let Limit::Calendar { period, .. } = limit {
            let room = count.saturating_sub(kept as u64).saturating_sub(extra);
            let free = calendar_free_at(stored, room, period, at, offset_us);
            if free > at {
                at = free;
                reason = why;
            }
        }
    }
    (at, reason, fits)
}

/// Debits `caller`'s share of `rule` for a call admitted at `at`: each
/// share window's TAT (no warm-up: the rule's own windows slow the caller
/// already), each share calendar's count of the period of `at`.
fn debit_share(
    state: &mut RuleState,
    rule: &Rule,
    caller: &str,
    at: Micros,
    now: Micros,
    offset_us: Micros,
    cost: u64,
) {
    let i = match state.shares.iter().position(|s| &*s.caller == caller) {
        Some(i) => i,
        None => {
            state.shares.push(ShareState { caller: caller.into(), limits: Vec::with_capacity(rule.share.len()) });
            state.shares.len() - 1
        }
    };
    let mine = &mut state.shares[i];
    for limit in &rule.share {
        let key = limit.window_key();
        let after = match *limit {
            Limit::Window(w) => LimitState::Tat(tat_of(mine.get(key), at) + cost as i64 * w.interval_us()),
            Limit::Calendar { period, .. } => {
                let current = period.id(now, offset_us);
                let (used, next) = counts(mine.get(key), current);
                if period.id(at, offset_us) == current {
                    LimitState::Count { period_id: current, used: used + cost, next }
                } else {
                    LimitState::Count { period_id: current, used, next: next + cost }
                }
            }
        };
        mine.set(key, after);
    }
}

/// How long from `now` until every `per_recipient` window of `rule` admits
/// one more message to the recipient whose state is `stored` (≤ 0: at once).
fn recipient_wait(rule: &Rule, stored: Option<&RecipientState>, now: Micros) -> Micros {
    rule.per_recipient
        .iter()
        .map(|w| recipient_tat(stored, w.per_us()).unwrap_or(now).max(now) - w.tolerance_us() - now)
        .max()
        .unwrap_or(0)
}

/// Debits a recipient's windows for a message admitted at `at`, keeping
/// only the windows `rule` has (a window dropped by a reload is forgotten).
fn debit_recipient(state: &mut RecipientState, rule: &Rule, at: Micros) {
    let mut after = [(0, 0); super::MAX_RECIPIENT_WINDOWS];
    for (slot, w) in after.iter_mut().zip(&rule.per_recipient) {
        let tat = recipient_tat(Some(state), w.per_us()).unwrap_or(at).max(at);
        *slot = (w.per_us(), tat + w.interval_us());
    }
    *state = after;
}

/// The stored theoretical arrival time, or `floor` if it is earlier.
pub(super) fn tat_of(stored: Option<LimitState>, floor: Micros) -> Micros {
    match stored {
        Some(LimitState::Tat(t)) => t.max(floor),
        _ => floor,
    }
}

/// Emission interval under warm-up: `T / f` with f rising linearly from ½ to
/// 1 over the warm-up period, computed in f64 exactly as the Lua script does.
/// Never shorter than `T`, so the window guarantee holds throughout.
fn interval(w: &WindowLimit, rule: &Rule, warm_start: Micros, now: Micros) -> Micros {
    if rule.warmup_us <= 0 {
        return w.interval_us();
    }
    let elapsed = (now - warm_start).clamp(0, rule.warmup_us);
    let up = rule.warmup_us as f64;
    (w.interval_us() as f64 * (2.0 * up) / (up + elapsed as f64)).ceil() as Micros
}

/// Calls counted in period `current` and reserved for `current + 1`.
pub(super) fn counts(stored: Option<LimitState>, current: i64) -> (u64, u64) {
    match stored {
        Some(LimitState::Count { period_id, used, next }) if period_id == current => (used, next),
        Some(LimitState::Count { period_id, next, .. }) if period_id == current - 1 => (next, 0),
        _ => (0, 0),
    }
}

/// Earliest time ≥ `t` at which a calendar quota has room.
fn calendar_free_at(stored: Option<LimitState>, count: u64, period: Period, t: Micros, offset_us: Micros) -> Micros {
    // State is written relative to the period of its last write, which is never
    // after `t`; look at the period containing `t` and the one after it.
    let (used, next) = counts(stored, period.id(t, offset_us));
    if used < count {
        t
    } else if next < count {
        period.next_start(t, offset_us)
    } else {
        period.next_start(period.next_start(t, offset_us), offset_us)
    }
}

/// WeChat reset the account's counters (`clear_quota`) at `now`: the day
/// count of the current day starts again from 0 (calls reserved for the
/// next day stay reserved; the units of each instance's last lease, while
/// it lasts, stay counted), and the penalty is lifted as an operator's
/// lift is (escalation over; answers to calls sent before cannot re-impose
/// it). Windows, month counts, warm-up and slots are untouched: WeChat
/// documents clear_quota as resetting call counts, and a month count kept
/// is the safe side. Every caller's share of the day (`max_share`) starts
/// again with it. `lua/clear.lua` mirrors it.
pub fn clear(state: &mut RuleState, now: Micros, offset_us: Micros) {
    let key = WindowKey::Calendar(Period::Day);
    let today = Period::Day.id(now, offset_us);
    // Units of a lease that may still be sent stay counted
    // ([`super::lease`]): WeChat will count them after its reset. Each
    // instance may still send from its last lease only, while it lasts.
    let leased = state.leases.iter().filter(|l| l.until > now).map(|l| l.units).sum();
    if let Some(after) = cleared(state.get(key), today, leased) {
        state.set(key, after);
    }
    // Every caller's share of the day starts again too.
    for share in &mut state.shares {
        if let Some(after) = cleared(share.get(key), today, 0) {
            share.set(key, after);
        }
    }
    state.penalty.set_by_hand(0, now);
    // What a lease taken before may give back of the day ([`super::lease::give_back`]).
    state.cleared_at = now;
    // Windows a frequency 45009 lowered are whole again: the 45009 may have
    // been a day spent that WeChat just reset.
    state.learned_windows.clear();
}

/// A day count as `clear` leaves it (`None`: nothing to change).
/// `kept`: calls of today that stay counted (leased units still to be sent).
fn cleared(stored: Option<LimitState>, today: i64, kept: u64) -> Option<LimitState> {
    match stored {
        Some(LimitState::Count { period_id, used, next }) if period_id == today => {
            Some(LimitState::Count { period_id, used: used.min(kept), next })
        }
        Some(LimitState::Count { period_id, .. }) if period_id == today - 1 => {
            Some(LimitState::Count { period_id: today, used: 0, next: 0 })
        }
        _ => None,
    }
}

/// A call admitted at `at` never reached WeChat: gives back what its
/// admission took from `state`, never more, at store time `now`. Returns
/// whether anything was given back. `lua/refund.lua` computes the same.
///
/// - A **calendar quota** gets the call back exactly: its count for the
///   period of `at` goes down by one (`used` if that period is the current
///   one, `next` if the call was reserved for the next), never below 0; a
///   period already over gives nothing back.
/// - A **window limit** gets back at most one emission interval `T` (the
///   admission took ≥ T, more under warm-up), and only the part of the
///   call's slot that no other call can have taken since: `T − (p − at)`,
///   clamped to `[0, T]`, where `p = max(now, last_call + max_wait,
///   lease_end)` bounds the forward time of every call admitted so far (a
///   leased unit may be sent until its lease ends: [`super::lease`]).
///   (Moving the TAT back further would let a new call into time a later
///   call already holds: more than the limit in some window.) So a call that fails at once gets
///   its slot back, one whose slot has passed gets nothing, and on a rule
///   with `max_wait` a call sent at once gets back only `T − max_wait`
///   (nothing once `max_wait ≥ T`). The bound assumes `max_wait` was not
///   raised by a reload between the call's admission and its refund.
/// - Penalties, warm-up and concurrency slots are untouched (a slot is
///   freed by [`crate::store::pair_op::Release`]).
///
/// `rule` is the rule the call was admitted under; `cost` what it cost
/// (each of its n units given back as above: at most n intervals of a
/// window, n counts of a calendar).
pub fn refund(state: &mut RuleState, rule: &Rule, at: Micros, now: Micros, offset_us: Micros, cost: u64) -> bool {
    let pinned = now.max(state.last_call + rule.max_wait_us).max(state.lease_end);
    let cost = cost.max(1);
    let mut given = false;
    for limit in &rule.limits {
        let key = limit.window_key();
        let after = match (*limit, state.get(key)) {
            (Limit::Window(w), Some(LimitState::Tat(tat))) => {
                let took = (cost as i64).saturating_mul(w.interval_us());
                let back = (at + took - pinned).clamp(0, took);
                if back == 0 {
                    continue;
                }
                LimitState::Tat(tat - back)
            }
            (Limit::Calendar { period, .. }, stored @ Some(LimitState::Count { .. })) => {
                let current = period.id(now, offset_us);
                let (used, next) = counts(stored, current);
                let of_call = period.id(at, offset_us);
                if of_call == current && used > 0 {
                    LimitState::Count { period_id: current, used: used.saturating_sub(cost), next }
                } else if of_call == current + 1 && next > 0 {
                    LimitState::Count { period_id: current, used, next: next.saturating_sub(cost) }
                } else {
                    continue;
                }
            }
            _ => continue,
        };
        state.set(key, after);
        given = true;
    }
    given
}

/// quota_sync: WeChat reports `reported` calls of this state's API today;
/// the day count becomes the larger of it and the count held (never
/// lower), calls reserved for the next day stay, nothing else changes.
/// Returns the day count before. `lua/raise_day.lua` mirrors it.
pub fn raise_day(state: &mut RuleState, reported: u64, now: Micros, offset_us: Micros) -> u64 {
    let key = WindowKey::Calendar(Period::Day);
    let today = Period::Day.id(now, offset_us);
    let (used, next) = counts(state.get(key), today);
    state.set(key, LimitState::Count { period_id: today, used: used.max(reported), next });
    used
}
