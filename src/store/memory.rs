//! The embedded default store: decision state in this process's memory.
//!
//! Exact for one instance. Several instances each with a memory store each
//! admit the full limit: use the Redis store for more than one instance.
//! State is sharded behind short mutexes (no lock is held across an await),
//! and idle state is dropped as it is found, so memory follows live accounts.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::clock::{Clock, Micros};
use crate::limit::{decide, Decision, Rule, RuleState};
use crate::penalty::PenaltyPolicy;

const SHARDS: usize = 16;
/// Every this many operations on a shard, its idle entries are dropped.
const SWEEP_EVERY: u32 = 4096;

pub struct MemoryStore {
    clock: Arc<dyn Clock>,
    hasher: RandomState,
    shards: Vec<Mutex<Shard>>,
}

#[derive(Default)]
struct Shard {
    states: HashMap<(String, Arc<str>), RuleState>,
    ops: u32,
}

impl MemoryStore {
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        MemoryStore {
            clock,
            hasher: RandomState::new(),
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
        }
    }

    pub fn now(&self) -> Micros {
        self.clock.now_us()
    }

    fn shard(&self, account: &str, rule: &Rule) -> MutexGuard<'_, Shard> {
        let i = (self.hasher.hash_one((account, &*rule.name)) as usize) % SHARDS;
        // A panic while holding the lock cannot leave a RuleState half-written
        // (decide() writes only after every check), so a poisoned lock is safe.
        self.shards[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    fn with_state<T>(
        &self,
        account: &str,
        rule: &Rule,
        offset_us: Micros,
        f: impl FnOnce(&mut RuleState, Micros) -> T,
    ) -> T {
        let now = self.now();
        let mut shard = self.shard(account, rule);
        shard.ops = shard.ops.wrapping_add(1);
        if shard.ops % SWEEP_EVERY == 0 {
            shard.states.retain(|_, s| !s.is_idle(now, offset_us));
        }
        let key = (account.to_owned(), rule.name.clone());
        f(shard.states.entry(key).or_default(), now)
    }

    pub fn acquire(&self, account: &str, rule: &Rule, offset_us: Micros) -> Decision {
        self.with_state(account, rule, offset_us, |state, now| decide(rule, state, now, offset_us))
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

    /// Number of (account, rule) states held; for tests and metrics.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).states.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
