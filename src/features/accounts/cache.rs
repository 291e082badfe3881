//! This instance's memory of access tokens, in front of the store: a call
//! carrying a token asks the store about it at most once while the answer
//! holds. Known tokens are kept until they expire; unknown ones for
//! [`UNKNOWN_FOR_US`], so that a token learned elsewhere is found soon
//! after. Keyed by the token itself, in this process's memory only (where
//! every request carrying it already is): a call whose token is cached is
//! not hashed at all; the keyed hash ([`crate::store::tokens::TokenHash`])
//! is computed only to ask or tell the store, which never sees the token.
//!
//! One cache per serving thread ([`crate::transport::worker`]), like the upstream pool:
//! a service sends most of its calls with one token, and a cache shared by
//! every thread would put all of them on one lock. A token learned here goes
//! into every thread's cache; one looked up goes into the asking thread's.
//!
//! Bounded: each cache holds at most [`MAX_KNOWN`] known and
//! [`MAX_UNKNOWN`] unknown tokens; a full one first drops what has expired,
//! then arbitrary entries (a hash map's iteration order, which a client
//! cannot predict). A lookup takes one uncontended lock and allocates
//! nothing.

use std::sync::{Arc, Mutex, MutexGuard};

use rustc_hash::FxHashMap;

use crate::limit::clock::Micros;

/// How long "this token is unknown" is believed without asking again.
pub const UNKNOWN_FOR_US: Micros = 5_000_000;
/// Most known tokens per cache (about 100 bytes each).
pub const MAX_KNOWN: usize = 65_536;
/// Most unknown tokens per cache.
pub const MAX_UNKNOWN: usize = 16_384;

/// What this instance knows of a token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cached {
    /// Issued to this account.
    Owner(Arc<str>),
    /// Not known to the store when last asked.
    Unknown,
    /// Not asked about yet, or the answer is over: ask the store.
    Miss,
}

/// The caches of every serving thread, and one for everything else.
pub struct TokenCaches {
    per_worker: Box<[TokenCache]>,
    shared: TokenCache,
}

impl TokenCaches {
    /// Caches for `workers` serving threads.
    pub fn new(workers: usize) -> TokenCaches {
        TokenCaches { per_worker: (0..workers).map(|_| TokenCache::default()).collect(), shared: TokenCache::default() }
    }

    /// This thread's cache.
    pub fn here(&self) -> &TokenCache {
        crate::transport::worker::pick(&self.per_worker, &self.shared)
    }

    /// A token answer passed through: `token` belongs to `account` until
    /// `until`, in every thread's cache.
    pub fn learned(&self, token: &[u8], account: &str, until: Micros, now: Micros) {
        let account: Arc<str> = Arc::from(account);
        for cache in self.per_worker.iter().chain(std::iter::once(&self.shared)) {
            cache.known(token, account.clone(), until, now);
        }
    }
}

#[derive(Default)]
struct Maps {
    /// token → (account, until).
    known: FxHashMap<Box<[u8]>, (Arc<str>, Micros)>,
    /// token → believed unknown until.
    unknown: FxHashMap<Box<[u8]>, Micros>,
}

/// One thread's cache.
#[derive(Default)]
pub struct TokenCache {
    maps: Mutex<Maps>,
}

impl TokenCache {
    fn maps(&self) -> MutexGuard<'_, Maps> {
        // Every update is one map operation: a panic cannot leave one half done.
        self.maps.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What is known of `token` at `now`.
    pub fn get(&self, token: &[u8], now: Micros) -> Cached {
        let mut maps = self.maps();
        if let Some((account, until)) = maps.known.get(token) {
            if *until > now {
                return Cached::Owner(account.clone());
            }
            maps.known.remove(token);
            return Cached::Miss;
        }
        match maps.unknown.get(token) {
            Some(until) if *until > now => Cached::Unknown,
            Some(_) => {
                maps.unknown.remove(token);
                Cached::Miss
            }
            None => Cached::Miss,
        }
    }

    /// `token` belongs to `account` until `until`.
    pub fn known(&self, token: &[u8], account: Arc<str>, until: Micros, now: Micros) {
        let mut maps = self.maps();
        maps.unknown.remove(token);
        make_room(&mut maps.known, MAX_KNOWN, |(_, u)| *u > now);
        maps.known.insert(token.into(), (account, until));
    }

    /// The store does not know `token` (at `now`).
    pub fn unknown(&self, token: &[u8], now: Micros) {
        let mut maps = self.maps();
        make_room(&mut maps.unknown, MAX_UNKNOWN, |u| *u > now);
        maps.unknown.insert(token.into(), now.saturating_add(UNKNOWN_FOR_US));
    }
}

/// Makes room for one more entry in `map` (at most `cap`): drops those that
/// are no longer `live`, then, if that was not enough, arbitrary ones down
/// to three quarters of `cap`, so that a flood of new tokens costs one pass
/// over the map per `cap / 4` of them, not one per token.
fn make_room<V>(map: &mut FxHashMap<Box<[u8]>, V>, cap: usize, live: impl Fn(&V) -> bool) {
    if map.len() < cap {
        return;
    }
    map.retain(|_, v| live(v));
    let keep = cap - cap / 4;
    if map.len() > keep {
        let gone: Vec<Box<[u8]>> = map.keys().take(map.len() - keep).cloned().collect();
        for k in gone {
            map.remove(&k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(n: u8) -> Box<[u8]> {
        vec![n; 16].into()
    }

    #[test]
    fn known_until_the_token_expires_unknown_for_a_few_seconds() {
        let caches = TokenCaches::new(2);
        let cache = caches.here();
        assert_eq!(cache.get(&h(1), 0), Cached::Miss);
        cache.unknown(&h(1), 0);
        assert_eq!(cache.get(&h(1), UNKNOWN_FOR_US - 1), Cached::Unknown);
        assert_eq!(cache.get(&h(1), UNKNOWN_FOR_US), Cached::Miss);
        cache.unknown(&h(1), 0);
        // Learned meanwhile: known at once.
        caches.learned(&h(1), "wxA", 100, 10);
        assert_eq!(cache.get(&h(1), 99), Cached::Owner(Arc::from("wxA")));
        assert_eq!(cache.get(&h(1), 100), Cached::Miss);
        assert_eq!(cache.get(&h(1), 50), Cached::Miss, "an expired entry is gone");
    }

    #[test]
    fn a_full_cache_drops_expired_entries_first_then_any() {
        let mut map = FxHashMap::default();
        for n in 0..4u8 {
            map.insert(h(n), u64::from(n));
        }
        make_room(&mut map, 4, |v| *v >= 2);
        assert_eq!(map.len(), 2, "the two expired ones");
        map.insert(h(8), 9);
        map.insert(h(9), 9);
        make_room(&mut map, 4, |_| true);
        assert_eq!(map.len(), 3, "arbitrary entries, down to three quarters");
        make_room(&mut map, 4, |_| true);
        assert_eq!(map.len(), 3, "room already");
    }
}
