//! What this instance is doing right now: calls held for shaping and calls
//! in flight at WeChat, per (account, rule state) ([`Activity`], for
//! `/v1/buckets`), and the instance-wide count of held calls with its cap
//! ([`Held`], `[server] max_held`).

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::limit::pair::{Pair, PairRef};

/// Counts calls held by this instance.
#[derive(Default)]
pub struct Held(AtomicUsize);

impl Held {
    pub fn count(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }

    /// A place among the held calls, if fewer than `max` are held; given
    /// back when the permit drops.
    pub fn permit(&self, max: usize) -> Option<HeldPermit<'_>> {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| (n < max).then_some(n + 1))
            .ok()
            .map(|_| HeldPermit(self))
    }
}

/// One place among the held calls ([`Held::permit`]).
pub struct HeldPermit<'a>(&'a Held);

impl Drop for HeldPermit<'_> {
    fn drop(&mut self) {
        self.0 .0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Held = 0,
    InFlight = 1,
}

/// One (account, rule state)'s calls on this instance: held, in flight
/// (indexed by [`Stage`]).
type Counts = [AtomicU32; 2];

/// The counts of every (account, rule state) with a call since the last
/// prune, and the size at which the next prune runs.
struct Table {
    counts: hashbrown::HashMap<Pair, Arc<Counts>>,
    prune_at: usize,
}

impl Default for Table {
    fn default() -> Self {
        Table { counts: hashbrown::HashMap::new(), prune_at: PRUNE_AT_LEAST }
    }
}

/// Pairs kept before the first prune of those without a call.
const PRUNE_AT_LEAST: usize = 1024;

/// Calls held and in flight per (account, rule state). A call's guard holds
/// its pair's counters: entering is one map lookup (the account is copied
/// only for a new pair), leaving is one atomic decrement, no lock. Pairs
/// with no call left are pruned when the map has doubled since the last
/// prune, so it stays within twice the pairs active at once (and at least
/// [`PRUNE_AT_LEAST`]).
#[derive(Default)]
pub struct Activity {
    table: Mutex<Table>,
}

impl Activity {
    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts one call of `kind` until the guard drops.
    pub fn enter(&self, account: &str, rule: &Arc<str>, kind: Stage) -> ActivityGuard {
        let counts = {
            let mut table = self.table();
            match table.counts.get(&PairRef(account, rule)) {
                Some(c) => c.clone(),
                None => {
                    if table.counts.len() >= table.prune_at {
                        // A pair whose counters only the map holds has no call.
                        table.counts.retain(|_, c| Arc::strong_count(c) > 1);
                        table.prune_at = (table.counts.len() * 2).max(PRUNE_AT_LEAST);
                    }
                    let c = Arc::new(Counts::default());
                    table.counts.insert((account.to_owned(), rule.clone()), c.clone());
                    c
                }
            }
        };
        counts[kind as usize].fetch_add(1, Ordering::Relaxed);
        ActivityGuard { counts, kind }
    }

    /// (held, in flight) for one (account, rule).
    pub fn get(&self, account: &str, rule: &Arc<str>) -> (u32, u32) {
        match self.table().counts.get(&PairRef(account, rule)) {
            Some(c) => (c[0].load(Ordering::Relaxed), c[1].load(Ordering::Relaxed)),
            None => (0, 0),
        }
    }
}

/// One call counted by [`Activity::enter`], until dropped.
pub struct ActivityGuard {
    counts: Arc<Counts>,
    kind: Stage,
}

impl Drop for ActivityGuard {
    fn drop(&mut self) {
        self.counts[self.kind as usize].fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_calls_until_their_guards_drop_and_prunes_only_idle_pairs() {
        let activity = Activity::default();
        let rule: Arc<str> = Arc::from("send");
        let held = activity.enter("wx1", &rule, Stage::Held);
        let flying = activity.enter("wx1", &rule, Stage::InFlight);
        let other = activity.enter("wx2", &rule, Stage::InFlight);
        assert_eq!(activity.get("wx1", &rule), (1, 1));
        drop(held);
        assert_eq!(activity.get("wx1", &rule), (0, 1));
        assert_eq!(activity.get("wx3", &rule), (0, 0));
        // Enough idle pairs to prune: the active ones keep their counts.
        for i in 0..2 * PRUNE_AT_LEAST {
            drop(activity.enter(&format!("idle{i}"), &rule, Stage::InFlight));
        }
        assert!(activity.table().counts.len() <= PRUNE_AT_LEAST + 2, "idle pairs pruned");
        assert_eq!(activity.get("wx1", &rule), (0, 1));
        assert_eq!(activity.get("wx2", &rule), (0, 1));
        drop((flying, other));
        assert_eq!(activity.get("wx1", &rule), (0, 0));
    }
}
