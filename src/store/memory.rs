//! The embedded default store: decision state in this process's memory.
//!
//! Exact for one instance. Several instances each with a memory store each
//! admit the full limit: use the Redis store for more than one instance.
//! State is sharded behind short mutexes (no lock is held across an await),
//! and idle state is dropped as it is found, so memory follows live accounts.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex, MutexGuard};

use super::Asking;
use crate::clock::{Clock, Micros};
use crate::limit::{decide, Ask, Decision, Rule, RuleState};
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

    pub fn now(&self) -> Micros {
        self.clock.now_us()
    }

    fn with_state<T>(
        &self,
        account: &str,
        rule: &Rule,
        offset_us: Micros,
        f: impl FnOnce(&mut RuleState, Micros) -> T,
    ) -> T {
        let now = self.now();
        let i = (self.hasher.hash_one((account, &*rule.name)) as usize) % SHARDS;
        let mut shard = lock(&self.shards[i]);
        shard.ops = shard.ops.wrapping_add(1);
        if shard.ops % SWEEP_EVERY == 0 {
            shard.states.retain(|_, (s, warmup)| !s.is_idle(now, offset_us, *warmup));
        }
        let entry = shard.states.entry((account.to_owned(), rule.name.clone())).or_default();
        entry.1 = entry.1.max(rule.warmup_us);
        f(&mut entry.0, now)
    }

    pub fn acquire(&self, account: &str, rule: &Rule, asking: &Asking<'_>) -> Decision {
        let account_warm = if rule.warmup_us > 0 { lock(&self.warm).get(account).copied().unwrap_or(0) } else { 0 };
        self.with_state(account, rule, asking.offset_us, |state, now| {
            let ask = Ask {
                now,
                offset_us: asking.offset_us,
                max_wait_us: asking.max_wait_us,
                account_warm,
                holder: asking.holder,
                lease_us: asking.lease_us,
            };
            decide(rule, state, ask)
        })
    }

    pub fn penalise(
        &self,
        account: &str,
        rule: &Rule,
        policy: &PenaltyPolicy,
        sent_at: Micros,
        offset_us: Micros,
    ) -> (Micros, Micros) {
        self.with_state(account, rule, offset_us, |state, now| {
            (state.penalty.penalise(policy, sent_at, now, offset_us), now)
        })
    }

    pub fn succeeded(&self, account: &str, rule: &Rule, sent_at: Micros, offset_us: Micros) {
        self.with_state(account, rule, offset_us, |state, _| state.penalty.succeeded(sent_at));
    }

    /// Frees a concurrency slot.
    pub fn release(&self, account: &str, rule: &Rule, holder: &str, offset_us: Micros) {
        self.with_state(account, rule, offset_us, |state, _| state.holders.retain(|(h, _)| h != holder));
    }

    /// Extends the leases of slots still held (by live calls of this instance).
    pub fn renew(&self, account: &str, rule: &Rule, holders: &[&str], lease_us: Micros, offset_us: Micros) {
        self.with_state(account, rule, offset_us, |state, now| {
            for (h, exp) in state.holders.iter_mut() {
                if holders.contains(&h.as_str()) {
                    *exp = now + lease_us;
                }
            }
        });
    }

    /// The state of one (account, rule) now, for inspection.
    pub fn inspect(&self, account: &str, rule: &Rule, offset_us: Micros) -> (RuleState, Micros) {
        self.with_state(account, rule, offset_us, |state, now| (state.clone(), now))
    }

    /// Imposes a penalty of `len_us` (0 lifts it); returns (until, now).
    pub fn set_penalty(&self, account: &str, rule: &Rule, len_us: Micros, offset_us: Micros) -> (Micros, Micros) {
        self.with_state(account, rule, offset_us, |state, now| {
            state.penalty.set_by_hand(len_us, now);
            (state.penalty.until, now)
        })
    }

    /// An access token was refreshed for `account`: warm-up starts again.
    pub fn token_refreshed(&self, account: &str) -> Micros {
        let now = self.now();
        lock(&self.warm).insert(account.to_owned(), now);
        now
    }

    /// Number of (account, rule) states held; for tests and metrics.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).states.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
