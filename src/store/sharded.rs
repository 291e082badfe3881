//! A table split into `N` shards, each behind its own lock, a key's shard
//! picked by a randomly seeded hash: what the per-call tables share (the
//! memory store's states, the ledger, the forecasts). A call locks its
//! key's shard only; a pass over every entry (a sweep, a scrape, the
//! console's top accounts) holds one shard at a time, so a call waits at
//! most for one shard's share of the pass, never for the whole table.

use std::hash::{BuildHasher, Hash};
use std::sync::{Mutex, MutexGuard};

pub struct Sharded<T, const N: usize> {
    hasher: foldhash::fast::RandomState,
    shards: Box<[Mutex<T>]>,
}

impl<T: Default, const N: usize> Default for Sharded<T, N> {
    fn default() -> Self {
        Sharded { hasher: Default::default(), shards: (0..N).map(|_| Mutex::default()).collect() }
    }
}

/// Locks `m`. Every update of a sharded table is written only after its
/// checks, so a panic while holding a lock cannot leave an entry
/// half-written: a poisoned lock is safe to use.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<T, const N: usize> Sharded<T, N> {
    /// The index of `key`'s shard.
    pub fn index(&self, key: impl Hash) -> usize {
        (self.hasher.hash_one(key) as usize) % N
    }

    /// `key`'s shard, locked.
    pub fn lock(&self, key: impl Hash) -> MutexGuard<'_, T> {
        lock(&self.shards[self.index(key)])
    }

    /// Every shard, unlocked (to lock one at a time, or try to).
    pub fn iter(&self) -> std::slice::Iter<'_, Mutex<T>> {
        self.shards.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_always_finds_its_own_shard_and_keys_spread() {
        let table: Sharded<Vec<u32>, 16> = Sharded::default();
        for i in 0..1600u32 {
            table.lock(("wx", i)).push(i);
        }
        for i in 0..1600u32 {
            assert!(table.lock(("wx", i)).contains(&i));
        }
        let sizes: Vec<usize> = table.iter().map(|s| lock(s).len()).collect();
        assert_eq!(sizes.iter().sum::<usize>(), 1600);
        assert!(sizes.iter().all(|&n| n > 40), "spread over every shard: {sizes:?}");
    }
}
