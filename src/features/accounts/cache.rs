//! This instance's memory of access tokens, in front of the store: a call
//! carrying a token asks the store about it at most once while the answer
//! holds. Known tokens are kept until they expire; unknown ones for
//! [`UNKNOWN_FOR_US`], so that a token learned elsewhere is found soon
//! after.
//!
//! Keyed by a [`Digest`] of the token, never the token itself: 128 bits of
//! SipHash-2-4 under a random key of this process ([`DigestKey`]), so an
//! entry takes the same few bytes whatever a caller sends (a token of
//! 60 KB took 60 KB per entry before), and nobody who does not know the
//! key can make two tokens share an entry. The store's own keyed hash
//! ([`crate::store::tokens::TokenHash`], HMAC-SHA256) is computed only to
//! ask or tell the store, which never sees the token; the digest costs a
//! call with a token a few dozen instructions more than the hash map's own
//! hashing did (SipHash: the keyed hash made for hash-table keys).
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
//! nothing. What one cache may hold at most: [`MAX_BYTES`].

use std::sync::{Arc, Mutex, MutexGuard};

use rustc_hash::FxHashMap;

use crate::time::Micros;

/// How long "this token is unknown" is believed without asking again.
pub const UNKNOWN_FOR_US: Micros = 5_000_000;
/// Most known tokens per cache.
pub const MAX_KNOWN: usize = 65_536;
/// Most unknown tokens per cache.
pub const MAX_UNKNOWN: usize = 16_384;
/// Bytes of a known entry in its table: the digest, the account (a shared
/// `Arc<str>`: one per account, not per token), until when; and the
/// table's control byte.
pub const KNOWN_ENTRY_BYTES: usize = std::mem::size_of::<(Digest, (Arc<str>, Micros))>() + 1;
/// Bytes of an unknown entry in its table: the digest, until when, the
/// control byte.
pub const UNKNOWN_ENTRY_BYTES: usize = std::mem::size_of::<(Digest, Micros)>() + 1;
/// Most bytes one cache's tables take, whatever callers send: the tables
/// at their largest (a hash table of `n` entries has at most the next power
/// of two above `n × 8/7` slots). 65,536 known × 41 B in 131,072 slots and
/// 16,384 unknown × 25 B in 32,768 slots: about 5.9 MiB (6.2 MB) per serving thread
/// (plus one `Arc<str>` per account).
pub const MAX_BYTES: usize = slots(MAX_KNOWN) * KNOWN_ENTRY_BYTES + slots(MAX_UNKNOWN) * UNKNOWN_ENTRY_BYTES;

const fn slots(entries: usize) -> usize {
    (entries * 8 / 7).next_power_of_two()
}

/// What a cache knows a token by: 128 bits of SipHash-2-4 of the token
/// under the process's [`DigestKey`].
pub type Digest = [u8; 16];

/// The random key of this process's token digests. Never printed.
pub struct DigestKey {
    k0: u64,
    k1: u64,
}

impl DigestKey {
    /// A fresh key from the operating system's random source.
    pub fn random() -> DigestKey {
        use ring::rand::SecureRandom;
        let mut bytes = [0u8; 16];
        if ring::rand::SystemRandom::new().fill(&mut bytes).is_err() {
            // As for the store's token key: std's per-process random keys.
            use std::hash::BuildHasher;
            for (i, chunk) in bytes.chunks_mut(8).enumerate() {
                chunk.copy_from_slice(&std::hash::RandomState::new().hash_one(i).to_le_bytes());
            }
        }
        DigestKey::from_bytes(bytes)
    }

    fn from_bytes(bytes: [u8; 16]) -> DigestKey {
        let word = |i: usize| {
            u64::from_le_bytes([
                bytes[i],
                bytes[i + 1],
                bytes[i + 2],
                bytes[i + 3],
                bytes[i + 4],
                bytes[i + 5],
                bytes[i + 6],
                bytes[i + 7],
            ])
        };
        DigestKey { k0: word(0), k1: word(8) }
    }

    /// The digest of `token`: SipHash-2-4 with its 128-bit output.
    pub fn digest(&self, token: &[u8]) -> Digest {
        use std::hash::Hasher;
        let mut h = siphasher::sip128::SipHasher24::new_with_keys(self.k0, self.k1);
        h.write(token);
        siphasher::sip128::Hasher128::finish128(&h).as_bytes()
    }
}

impl std::fmt::Debug for DigestKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DigestKey(..)")
    }
}

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
pub struct OwnerCaches {
    key: DigestKey,
    per_worker: Box<[OwnerCache]>,
    shared: OwnerCache,
}

impl OwnerCaches {
    /// Caches for `workers` serving threads.
    pub fn new(workers: usize) -> OwnerCaches {
        OwnerCaches {
            key: DigestKey::random(),
            per_worker: (0..workers).map(|_| OwnerCache::default()).collect(),
            shared: OwnerCache::default(),
        }
    }

    /// What the caches know `token` by.
    pub fn digest(&self, token: &[u8]) -> Digest {
        self.key.digest(token)
    }

    /// This thread's cache.
    pub fn here(&self) -> &OwnerCache {
        crate::transport::worker::pick(&self.per_worker, &self.shared)
    }

    /// A token answer passed through: `token` belongs to `account` until
    /// `until`, in every thread's cache.
    pub fn learned(&self, token: &[u8], account: &str, until: Micros, now: Micros) {
        let account: Arc<str> = Arc::from(account);
        let digest = self.digest(token);
        for cache in self.per_worker.iter().chain(std::iter::once(&self.shared)) {
            cache.known(&digest, account.clone(), until, now);
        }
    }

    /// Entries held by every cache: (known, unknown).
    pub fn held(&self) -> (usize, usize) {
        self.per_worker.iter().chain(std::iter::once(&self.shared)).fold((0, 0), |(k, u), cache| {
            let maps = cache.maps();
            (k + maps.known.len(), u + maps.unknown.len())
        })
    }
}

#[derive(Default)]
struct Maps {
    /// token's digest → (account, until).
    known: FxHashMap<Digest, (Arc<str>, Micros)>,
    /// token's digest → believed unknown until.
    unknown: FxHashMap<Digest, Micros>,
}

/// One thread's cache.
#[derive(Default)]
pub struct OwnerCache {
    maps: Mutex<Maps>,
}

impl OwnerCache {
    fn maps(&self) -> MutexGuard<'_, Maps> {
        // Every update is one map operation: a panic cannot leave one half done.
        self.maps.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What is known at `now` of the token of `digest`.
    pub fn get(&self, digest: &Digest, now: Micros) -> Cached {
        let mut maps = self.maps();
        if let Some((account, until)) = maps.known.get(digest) {
            if *until > now {
                return Cached::Owner(account.clone());
            }
            maps.known.remove(digest);
            return Cached::Miss;
        }
        match maps.unknown.get(digest) {
            Some(until) if *until > now => Cached::Unknown,
            Some(_) => {
                maps.unknown.remove(digest);
                Cached::Miss
            }
            None => Cached::Miss,
        }
    }

    /// The token of `digest` belongs to `account` until `until`.
    pub fn known(&self, digest: &Digest, account: Arc<str>, until: Micros, now: Micros) {
        let mut maps = self.maps();
        maps.unknown.remove(digest);
        make_room(&mut maps.known, MAX_KNOWN, |(_, u)| *u > now);
        maps.known.insert(*digest, (account, until));
    }

    /// The store does not know the token of `digest` (at `now`).
    pub fn unknown(&self, digest: &Digest, now: Micros) {
        let mut maps = self.maps();
        make_room(&mut maps.unknown, MAX_UNKNOWN, |u| *u > now);
        maps.unknown.insert(*digest, now.saturating_add(UNKNOWN_FOR_US));
    }
}

/// Makes room for one more entry in `map` (at most `cap`): drops those that
/// are no longer `live`, then, if that was not enough, arbitrary ones down
/// to three quarters of `cap`, so that a flood of new tokens costs one pass
/// over the map per `cap / 4` of them, not one per token.
fn make_room<V>(map: &mut FxHashMap<Digest, V>, cap: usize, live: impl Fn(&V) -> bool) {
    if map.len() < cap {
        return;
    }
    map.retain(|_, v| live(v));
    let keep = cap - cap / 4;
    if map.len() > keep {
        let gone: Vec<Digest> = map.keys().take(map.len() - keep).copied().collect();
        for k in gone {
            map.remove(&k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(n: u8) -> Digest {
        [n; 16]
    }

    #[test]
    fn known_until_the_token_expires_unknown_for_a_few_seconds() {
        let caches = OwnerCaches::new(2);
        let cache = caches.here();
        let t = caches.digest(b"T1");
        assert_eq!(cache.get(&t, 0), Cached::Miss);
        cache.unknown(&t, 0);
        assert_eq!(cache.get(&t, UNKNOWN_FOR_US - 1), Cached::Unknown);
        assert_eq!(cache.get(&t, UNKNOWN_FOR_US), Cached::Miss);
        cache.unknown(&t, 0);
        // Learned meanwhile: known at once.
        caches.learned(b"T1", "wxA", 100, 10);
        assert_eq!(cache.get(&t, 99), Cached::Owner(Arc::from("wxA")));
        assert_eq!(cache.get(&t, 100), Cached::Miss);
        assert_eq!(cache.get(&t, 50), Cached::Miss, "an expired entry is gone");
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

    /// The reference implementation's 128-bit vectors (key 00..0f, message
    /// 00..n-1), for n = 0, 1, 8 and 15.
    #[test]
    fn the_digest_is_siphash_2_4_128() {
        let mut key = [0u8; 16];
        for (i, b) in key.iter_mut().enumerate() {
            *b = i as u8;
        }
        let key = DigestKey::from_bytes(key);
        let hex = |d: Digest| d.iter().map(|b| format!("{b:02x}")).collect::<String>();
        let message: Vec<u8> = (0..64u8).collect();
        assert_eq!(hex(key.digest(&message[..0])), "a3817f04ba25a8e66df67214c7550293");
        assert_eq!(hex(key.digest(&message[..1])), "da87c1d86b99af44347659119b22fc45");
        assert_ne!(DigestKey::random().digest(b"T"), key.digest(b"T"));
        assert_eq!(format!("{key:?}"), "DigestKey(..)");
    }

    #[test]
    fn an_entry_takes_the_same_bytes_whatever_the_token() {
        assert_eq!((KNOWN_ENTRY_BYTES, UNKNOWN_ENTRY_BYTES), (41, 25));
        assert_eq!(MAX_BYTES, 131_072 * 41 + 32_768 * 25);
    }
}
