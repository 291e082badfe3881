//! What this instance knows of the shared quota state, so that Redis losing
//! it, or being away, never re-grants a spent calendar quota or forgets a
//! penalty.
//!
//! Per (account, rule) with calendar quotas or a penalty, for the current
//! calendar period of each quota:
//!
//! - `mine`: calls this instance admitted, through Redis or by the local
//!   fallback. When Redis comes back empty (restart without persistence,
//!   failover to an empty replica, `FLUSHALL`), every instance adds its own
//!   `mine` back: each call is counted by exactly one instance, so the sum is
//!   the day's total again, however many instances re-seed at once.
//! - `unsynced`: calls admitted without Redis (the fallback) and not yet
//!   added to Redis's count. They are added when Redis answers again, before
//!   this instance decides on Redis again. A batch is *taken* before it is
//!   sent and *put back* if sending fails, so a count is never sent twice by
//!   this instance (an answer lost after Redis applied it may count twice:
//!   the safe side).
//! - `seen`: the shared count the last Redis decision reported, which the
//!   local fallback starts from (its share of what is left, not of the whole
//!   quota).
//!
//! And the last penalty this instance learned (from WeChat's answers it
//! reported, or a refusal for a penalty), restored into an empty Redis.
//!
//! Window limits (per minute, per second) are not kept: they refill within
//! their window, and an empty Redis restarts them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, MutexGuard};

use crate::limit::calendar::Period;
use crate::limit::penalty::PenaltyState;
use crate::limit::{Decision, Key, Limit, Rule, WindowKey};
use crate::store::sharded::{lock, Sharded};
use crate::time::Micros;

const SHARDS: usize = 16;

/// One calendar quota's tally for one period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    pub period: Period,
    pub period_id: i64,
    pub mine: u64,
    pub unsynced: u64,
    /// The shared count after the last Redis decision in this period.
    pub seen: Option<u64>,
}

/// What the ledger holds for one (account, rule state).
#[derive(Debug, Clone)]
struct Entry {
    /// The rule's [`crate::limit::Rule::state`].
    state: Arc<str>,
    offset_us: Micros,
    tallies: Vec<Tally>,
    penalty: PenaltyState,
    /// The penalty must be written to Redis (it came back empty).
    penalty_unsynced: bool,
    /// Redis may have lost some of this pair's counts (it came back empty,
    /// or a replica that missed the last writes took over): every count of
    /// the current periods is to be topped up ([`Pending::top_up`]).
    top_up: bool,
    /// When this instance last admitted a call of the pair.
    used_at: Micros,
}

impl Entry {
    fn tally(&mut self, period: Period, period_id: i64) -> Option<&mut Tally> {
        let i = match self.tallies.iter().position(|t| t.period == period) {
            Some(i) => i,
            None => {
                self.tallies.push(Tally { period, period_id, mine: 0, unsynced: 0, seen: None });
                self.tallies.len() - 1
            }
        };
        let t = &mut self.tallies[i];
        if t.period_id < period_id {
            *t = Tally { period, period_id, mine: 0, unsynced: 0, seen: None };
        }
        // A count for a period already over (a clock step back) is dropped.
        (t.period_id == period_id).then_some(t)
    }

    fn pending(&self) -> bool {
        self.penalty_unsynced || self.top_up || self.tallies.iter().any(|t| t.unsynced > 0)
    }
}

/// A pair used recently ([`Ledger::recent`]).
#[derive(Debug, Clone)]
pub struct Recent {
    pub account: String,
    pub state: Arc<str>,
    pub periods: Vec<(Period, i64)>,
}

/// What must be written to Redis for one (account, rule): counts to add per
/// calendar quota and period, and a penalty to restore.
#[derive(Debug, Clone)]
pub struct Pending {
    pub account: String,
    /// The rule's name (its state's key).
    pub rule: Arc<str>,
    pub offset_us: Micros,
    pub adds: Vec<(Period, i64, u64)>,
    /// `adds` are everything this instance admitted in those periods, to be
    /// topped up (lua/reconcile.lua: only what Redis does not count as this
    /// instance's is added), not added.
    pub top_up: bool,
    pub penalty: Option<PenaltyState>,
}

impl Pending {
    /// The number of calls this adds.
    pub fn calls(&self) -> u64 {
        self.adds.iter().map(|a| a.2).sum()
    }
}

/// An account's entries, one per rule (few: a linear scan).
type Shard = HashMap<String, Vec<Entry>>;

/// The ledger: sharded by account; no lock is held across an await.
#[derive(Default)]
pub struct Ledger {
    shards: Sharded<Shard, SHARDS>,
    /// Entries with something to write to Redis (a quick check on the hot path).
    pending: AtomicUsize,
}

/// Whether `rule` has anything the ledger keeps counts for.
pub fn counts_calendar(rule: &Rule) -> bool {
    rule.limits.iter().any(|l| matches!(l, Limit::Calendar { .. }))
}

impl Ledger {
    fn shard(&self, account: &str) -> MutexGuard<'_, Shard> {
        self.shards.lock(account)
    }

    /// Runs `f` on the pair's entry, created if absent; keeps `pending` true.
    fn with_entry<T>(&self, key: Key<'_>, f: impl FnOnce(&mut Entry) -> T) -> T {
        let mut shard = self.shard(key.account);
        let entries = match shard.get_mut(key.account) {
            Some(entries) => entries,
            None => shard.entry(key.account.to_owned()).or_default(),
        };
        let i = match entries.iter().position(|e| *e.state == *key.rule.state) {
            Some(i) => i,
            None => {
                entries.push(Entry {
                    state: key.rule.state.clone(),
                    offset_us: key.offset_us,
                    tallies: Vec::new(),
                    penalty: PenaltyState::default(),
                    penalty_unsynced: false,
                    top_up: false,
                    used_at: 0,
                });
                entries.len() - 1
            }
        };
        let entry = &mut entries[i];
        let was = entry.pending();
        entry.offset_us = key.offset_us;
        let out = f(entry);
        match (was, entry.pending()) {
            (false, true) => {
                self.pending.fetch_add(1, Ordering::Relaxed);
            }
            (true, false) => {
                self.pending.fetch_sub(1, Ordering::Relaxed);
            }
            _ => {}
        }
        out
    }

    /// Whether anything waits to be written to Redis.
    pub fn has_pending(&self) -> bool {
        self.pending.load(Ordering::Relaxed) > 0
    }

    /// A call of `key` was admitted: by Redis (`local` false; its decision
    /// reports the shared count) or by the fallback (`local`: to be added to
    /// Redis's count later).
    pub fn admitted(&self, key: Key<'_>, decision: &Decision, local: bool, cost: u64) {
        let Decision::Admit { at, hold_us, calendar, .. } = *decision else { return };
        let rule = key.rule;
        if !counts_calendar(rule) {
            return;
        }
        let now = at - hold_us;
        self.with_entry(key, |e| {
            e.used_at = e.used_at.max(now);
            for (i, limit) in rule.limits.iter().enumerate() {
                let Limit::Calendar { count, period } = *limit else { continue };
                let at_id = period.id(at, key.offset_us);
                if let Some(t) = e.tally(period, at_id) {
                    t.mine += cost;
                    if local {
                        t.unsynced += cost;
                    }
                }
                if let (Some(q), false) = (calendar, local) {
                    let now_id = period.id(now, key.offset_us);
                    if q.limit == i && now_id == at_id {
                        if let Some(t) = e.tally(period, now_id) {
                            t.seen = Some(count.get().saturating_sub(q.remaining));
                        }
                    }
                }
            }
        });
    }

    /// A call of `key` admitted (by Redis) at `at` was given back: it no
    /// longer counts as this instance's.
    pub fn refunded(&self, key: Key<'_>, at: Micros, cost: u64) {
        if !counts_calendar(key.rule) {
            return;
        }
        self.with_entry(key, |e| {
            for limit in &key.rule.limits {
                if let Limit::Calendar { period, .. } = *limit {
                    if let Some(t) = e.tally(period, period.id(at, key.offset_us)) {
                        t.mine = t.mine.saturating_sub(cost);
                    }
                }
            }
        });
    }

    /// Redis refused a call of `key` for its calendar quota at `now`: the
    /// shared count of a rule with one calendar quota is the whole quota.
    pub fn quota_spent(&self, key: Key<'_>, now: Micros) {
        let mut calendars = key.rule.limits.iter().filter_map(|l| match *l {
            Limit::Calendar { count, period } => Some((count.get(), period)),
            Limit::Window(_) => None,
        });
        let (Some((count, period)), None) = (calendars.next(), calendars.next()) else { return };
        self.with_entry(key, |e| {
            if let Some(t) = e.tally(period, period.id(now, key.offset_us)) {
                t.seen = Some(count);
            }
        });
    }

    /// This instance learned `key`'s penalty (kept if it ends later than
    /// the one known); `unsynced`: Redis does not have it (it was away).
    pub fn penalised(&self, key: Key<'_>, penalty: PenaltyState, unsynced: bool) {
        self.with_entry(key, |e| {
            if penalty.until > e.penalty.until || penalty.started > e.penalty.started {
                e.penalty = penalty;
                e.penalty_unsynced |= unsynced;
            }
        });
    }

    /// The pairs this instance admitted a call of since `since` (at most
    /// `max`), with the calendar periods it counts: whose shared counts
    /// the keeper reads back ([`Ledger::refresh_seen`]) so that a fallback
    /// starts from a fresh view, not from this instance's last decision.
    pub fn recent(&self, since: Micros, max: usize) -> Vec<Recent> {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            let shard = lock(shard);
            for (account, entries) in shard.iter() {
                for e in entries.iter().filter(|e| e.used_at >= since && !e.tallies.is_empty()) {
                    if out.len() >= max {
                        return out;
                    }
                    let periods = e.tallies.iter().map(|t| (t.period, t.period_id)).collect();
                    out.push(Recent { account: account.clone(), state: e.state.clone(), periods });
                }
            }
        }
        out
    }

    /// Redis's count of a pair's calendar quota in period `period_id` is
    /// `count`: what this instance has seen of it, if that period is still
    /// the tally's (never lowered: a count read back before the last
    /// decision of this instance may be older).
    pub fn refresh_seen(&self, account: &str, state: &str, period: Period, period_id: i64, count: u64) {
        let mut shard = self.shard(account);
        let Some(entries) = shard.get_mut(account) else { return };
        let Some(e) = entries.iter_mut().find(|e| &*e.state == state) else { return };
        if let Some(t) = e.tallies.iter_mut().find(|t| t.period == period && t.period_id == period_id) {
            t.seen = Some(t.seen.map_or(count, |s| s.max(count)));
        }
    }

    /// The shared count of `key`'s calendar quota `window` in the period
    /// containing `now`, as last seen, if any.
    pub fn seen(&self, key: Key<'_>, window: WindowKey, now: Micros) -> Option<u64> {
        let WindowKey::Calendar(period) = window else { return None };
        let shard = self.shard(key.account);
        let entry = shard.get(key.account)?.iter().find(|e| *e.state == *key.rule.state)?;
        let t = entry.tallies.iter().find(|t| t.period == period)?;
        (t.period_id == period.id(now, key.offset_us)).then_some(t.seen).flatten()
    }

    /// An operator imposed or lifted `key`'s penalty: it replaces the known one.
    pub fn penalty_set(&self, key: Key<'_>, penalty: PenaltyState, unsynced: bool) {
        self.with_entry(key, |e| {
            e.penalty = penalty;
            e.penalty_unsynced = unsynced;
        });
    }

    /// The latest penalty of `key` this instance knows, if it is still on at `now`.
    pub fn penalty(&self, key: Key<'_>, now: Micros) -> Option<PenaltyState> {
        let shard = self.shard(key.account);
        let entry = shard.get(key.account)?.iter().find(|e| *e.state == *key.rule.state)?;
        (entry.penalty.until > now).then_some(entry.penalty)
    }

    /// Takes what `key` has to write to Redis (nothing if none); the caller
    /// writes it and gives it [`Ledger::put_back`] if that failed.
    /// WeChat reset the account's day counts and penalties (`clear_quota`):
    /// what this instance counted today (synced or not) and its penalties
    /// are forgotten too, so Redis losing its data later never brings the
    /// cleared counts back.
    pub fn cleared(&self, account: &str) {
        let mut shard = self.shard(account);
        for entry in shard.get_mut(account).into_iter().flatten() {
            for t in entry.tallies.iter_mut().filter(|t| t.period == Period::Day) {
                *t = Tally { mine: 0, unsynced: 0, seen: None, ..*t };
            }
            entry.penalty = PenaltyState::default();
            entry.penalty_unsynced = false;
        }
    }

    pub fn take(&self, account: &str, rule: &str) -> Option<Pending> {
        let mut shard = self.shard(account);
        let entry = shard.get_mut(account)?.iter_mut().find(|e| &*e.state == rule)?;
        let taken = take_entry(account, entry);
        if taken.is_some() {
            self.pending.fetch_sub(1, Ordering::Relaxed);
        }
        taken
    }

    /// Takes everything pending, for the background writer.
    pub fn take_all(&self) -> Vec<Pending> {
        let mut all = Vec::new();
        for shard in self.shards.iter() {
            let mut shard = lock(shard);
            for (account, entries) in shard.iter_mut() {
                for entry in entries.iter_mut() {
                    if let Some(p) = take_entry(account, entry) {
                        self.pending.fetch_sub(1, Ordering::Relaxed);
                        all.push(p);
                    }
                }
            }
        }
        all
    }

    /// Writing `pending` failed: it is pending again.
    pub fn put_back(&self, pending: Pending) {
        let mut shard = self.shard(&pending.account);
        let Some(e) = shard.get_mut(&pending.account).and_then(|es| es.iter_mut().find(|e| e.state == pending.rule))
        else {
            return;
        };
        let was = e.pending();
        if pending.top_up {
            // The top-up covers what was unsynced too: it is sent again whole.
            e.top_up = true;
        } else {
            for (period, id, n) in &pending.adds {
                if let Some(t) = e.tally(*period, *id) {
                    t.unsynced += n;
                }
            }
            if pending.penalty.is_some() {
                e.penalty_unsynced = true;
            }
        }
        if !was && e.pending() {
            self.pending.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Redis lost its data, or some of it (a failover to a replica that
    /// missed the last writes): everything this instance admitted in the
    /// current periods is to be topped up, and every penalty it knows that
    /// still matters written again. Returns how many (account, rule) pairs
    /// that is.
    pub fn lost(&self, now: Micros) -> usize {
        let mut n = 0;
        for shard in self.shards.iter() {
            let mut shard = lock(shard);
            for entry in shard.values_mut().flatten() {
                let was = entry.pending();
                let offset = entry.offset_us;
                if entry.tallies.iter().any(|t| t.mine > 0 && t.period_id >= t.period.id(now, offset)) {
                    entry.top_up = true;
                }
                entry.penalty_unsynced = entry.penalty.until > now || entry.penalty.is_recent(now);
                if !was && entry.pending() {
                    self.pending.fetch_add(1, Ordering::Relaxed);
                }
                n += usize::from(entry.pending());
            }
        }
        n
    }

    /// Drops what no longer matters at `now`: periods that are over and
    /// penalties no longer recent.
    pub fn prune(&self, now: Micros) {
        for shard in self.shards.iter() {
            let mut shard = lock(shard);
            for entries in shard.values_mut() {
                entries.retain(|e| {
                    e.pending()
                        || e.penalty.until > now
                        || e.penalty.is_recent(now)
                        || e.tallies.iter().any(|t| t.period_id >= t.period.id(now, e.offset_us))
                });
            }
            shard.retain(|_, entries| !entries.is_empty());
        }
    }
}

fn take_entry(account: &str, entry: &mut Entry) -> Option<Pending> {
    if !entry.pending() {
        return None;
    }
    let rule = entry.state.clone();
    let top_up = std::mem::take(&mut entry.top_up);
    let adds = entry
        .tallies
        .iter_mut()
        .filter(|t| if top_up { t.mine > 0 } else { t.unsynced > 0 })
        .map(|t| {
            let unsynced = std::mem::take(&mut t.unsynced);
            (t.period, t.period_id, if top_up { t.mine } else { unsynced })
        })
        .collect();
    let penalty = std::mem::take(&mut entry.penalty_unsynced).then_some(entry.penalty);
    Some(Pending { account: account.to_owned(), rule, offset_us: entry.offset_us, adds, top_up, penalty })
}
