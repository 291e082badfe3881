//! What this instance is doing right now: calls held for shaping and calls
//! in flight at WeChat, per (account, rule state) ([`Activity`], for
//! `/v1/buckets`), and the instance-wide count of held calls with its cap
//! ([`Held`], `[server] max_held`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

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
pub enum Kind {
    Held = 0,
    InFlight = 1,
}

type Key = (String, Arc<str>);
type Counts = hashbrown::HashMap<Key, [u32; 2]>;

#[derive(Default)]
pub struct Activity {
    counts: Mutex<Counts>,
}

impl Activity {
    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts one call of `kind` until the guard drops.
    pub fn enter(self: &Arc<Self>, account: &str, rule: &Arc<str>, kind: Kind) -> ActivityGuard {
        let key = (account.to_owned(), rule.clone());
        let mut counts = self.counts();
        match counts.get_mut(&key) {
            Some(c) => c[kind as usize] += 1,
            None => {
                let mut c = [0, 0];
                c[kind as usize] = 1;
                counts.insert(key.clone(), c);
            }
        }
        drop(counts);
        ActivityGuard { activity: self.clone(), key, kind }
    }

    /// (held, in flight) for one (account, rule).
    pub fn get(&self, account: &str, rule: &Arc<str>) -> (u32, u32) {
        let c = self.counts().get(&(account.to_owned(), rule.clone())).copied().unwrap_or_default();
        (c[0], c[1])
    }
}

pub struct ActivityGuard {
    activity: Arc<Activity>,
    key: Key,
    kind: Kind,
}

impl Drop for ActivityGuard {
    fn drop(&mut self) {
        let mut counts = self.activity.counts();
        if let Some(c) = counts.get_mut(&self.key) {
            c[self.kind as usize] = c[self.kind as usize].saturating_sub(1);
            if *c == [0, 0] {
                counts.remove(&self.key);
            }
        }
    }
}
