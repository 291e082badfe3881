//! The embedded default store: decision state in this process's memory.
//!
//! Exact for one instance. Several instances each with a memory store each
//! admit the full limit: use the Redis store for more than one instance.
//! State is sharded behind short mutexes (no lock is held across an await),
//! and idle state is dropped as it is found, so memory follows live accounts.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;

use super::{Decided, PenaltyEnd, Snapshot, Status, Store, StoreError};
use crate::clock::{Clock, Micros};
use crate::limit::decide::{decide, refund};
use crate::limit::{Ask, Key, LimitState, RuleState, WindowKey};
use crate::penalty::PenaltyPolicy;

const SHARDS: usize = 16;
/// Every this many operations on a shard, its idle entries are dropped.
const SWEEP_EVERY: u32 = 4096;

pub struct MemoryStore {
    clock: Arc<dyn Clock>,
    hasher: RandomState,
    shards: Vec<Mutex<Shard>>,
    /// Last access-token refresh per account.
    warm: Mutex<HashMap<String, Micros>>,
}

#[derive(Default)]
struct Shard {
    /// (account, rule) → state, and the longest warm-up of the rule versions
    /// that used it (how long it matters after its last call).
    states: HashMap<(String, Arc<str>), (RuleState, Micros)>,
    ops: u32,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update below is written only after its checks, so a panic while
    // holding a lock cannot leave state half-written: a poisoned lock is safe.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl MemoryStore {
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        MemoryStore {
            clock,
            hasher: RandomState::new(),
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            warm: Mutex::default(),
        }
    }

    /// This store's clock.
    pub fn now(&self) -> Micros {
        self.clock.now_us()
    }

    /// Runs `f` on the pair's state (created empty if absent) at this
    /// store's now, under its shard's lock.
    fn with_state<T>(&self, key: Key<'_>, f: impl FnOnce(&mut RuleState, Micros) -> T) -> T {
        let now = self.now();
        let rule = key.rule;
        let i = (self.hasher.hash_one((key.account, &*rule.name)) as usize) % SHARDS;
        let mut shard = lock(&self.shards[i]);
        shard.ops = shard.ops.wrapping_add(1);
        if shard.ops % SWEEP_EVERY == 0 {
            shard.states.retain(|_, (s, warmup)| !s.is_idle(now, key.offset_us, *warmup));
        }
        let entry = shard.states.entry((key.account.to_owned(), rule.name.clone())).or_default();
        entry.1 = entry.1.max(rule.warmup_us);
        f(&mut entry.0, now)
    }

    /// Number of (account, rule) states held; for tests and metrics.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).states.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Raises the count of `key`'s calendar quota `window` in period
    /// `period_id` to at least `used` (the Redis fallback starts from what
    /// was already used). Never lowers a count.
    pub fn raise_count(&self, key: Key<'_>, window: WindowKey, period_id: i64, used: u64) {
        self.with_state(key, |state, _| {
            let raised = match state.get(window) {
                Some(LimitState::Count { period_id: p, used: u, next }) if p == period_id => {
                    LimitState::Count { period_id, used: u.max(used), next }
                }
                Some(LimitState::Count { period_id: p, .. }) if p > period_id => return,
                Some(LimitState::Count { period_id: p, next, .. }) if p == period_id - 1 => {
                    LimitState::Count { period_id, used: next.max(used), next: 0 }
                }
                _ => LimitState::Count { period_id, used, next: 0 },
            };
            state.set(window, raised);
        });
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn acquire(&self, ask: &Ask<'_>) -> Result<Decided, StoreError> {
        let key = ask.key;
        let account_warm =
            if key.rule.warmup_us > 0 { lock(&self.warm).get(key.account).copied().unwrap_or(0) } else { 0 };
        let decision = self.with_state(key, |state, now| decide(state, ask, now, account_warm));
        Ok(Decided { decision, degraded: false })
    }

    async fn penalise(&self, key: Key<'_>, policy: &PenaltyPolicy, sent_at: Micros) -> Result<PenaltyEnd, StoreError> {
        Ok(self.with_state(key, |state, now| {
            let until = state.penalty.penalise(policy, sent_at, now, key.offset_us);
            PenaltyEnd { until, now }
        }))
    }

    async fn succeeded(&self, key: Key<'_>, sent_at: Micros) -> Result<(), StoreError> {
        self.with_state(key, |state, _| state.penalty.succeeded(sent_at));
        Ok(())
    }

    async fn release(&self, key: Key<'_>, holder: &str) -> Result<(), StoreError> {
        self.with_state(key, |state, _| state.holders.retain(|(h, _)| h != holder));
        Ok(())
    }

    async fn renew(&self, key: Key<'_>, holders: &[&str], lease_us: Micros) -> Result<(), StoreError> {
        self.with_state(key, |state, now| {
            for (h, exp) in state.holders.iter_mut() {
                if holders.contains(&h.as_str()) {
                    *exp = now + lease_us;
                }
            }
        });
        Ok(())
    }

    async fn inspect(&self, key: Key<'_>) -> Result<Snapshot, StoreError> {
        Ok(self.with_state(key, |state, now| Snapshot { state: state.canonical(key.rule), now }))
    }

    async fn set_penalty(&self, key: Key<'_>, len_us: Micros) -> Result<PenaltyEnd, StoreError> {
        Ok(self.with_state(key, |state, now| {
            state.penalty.set_by_hand(len_us, now);
            PenaltyEnd { until: state.penalty.until, now }
        }))
    }

    async fn token_refreshed(&self, account: &str, _keep_us: Micros) -> Result<(), StoreError> {
        let now = self.now();
        lock(&self.warm).insert(account.to_owned(), now);
        Ok(())
    }

    fn status(&self) -> Status {
        Status::InProcess
    }

    async fn refund(&self, key: Key<'_>, at: Micros) -> Result<bool, StoreError> {
        Ok(self.with_state(key, |state, now| refund(state, key.rule, at, now, key.offset_us)))
    }
}
