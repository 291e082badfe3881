//! Access tokens as the stores know them: by a keyed hash, never in clear.
//!
//! A store remembers which account an access token was issued to
//! ([`crate::features::accounts`] learns it from the token answer). It holds the
//! token's [`TokenHash`]: the first 128 bits of HMAC-SHA256 of the token
//! under the deployment's [`TokenKey`], a random 256-bit key. Without the
//! key nobody can tell which hash a given token has; with it (a reader of
//! the memory store's state file, or of Redis) one can check a token one
//! already holds, never recover one: tokens are long random strings.
//!
//! The key: the memory store's is random per state file and kept in it; the
//! Redis store's is created once by whichever instance comes first
//! (`SET <prefix>:#tokenkey <random> NX`) and read by every other.
//!
//! HMAC-SHA256 from `ring`: the standard keyed hash (a PRF) for secrets,
//! already in the binary through rustls (no new dependency), using the
//! CPU's SHA extensions where present. Its `hmac::Key` holds the padded
//! key states, so hashing a token of a few hundred bytes takes a few SHA-256 blocks and
//! allocates nothing.

use std::fmt;

use ring::hmac;
use ring::rand::SecureRandom;

use crate::time::Micros;

/// Bytes of a [`TokenKey`].
const KEY_LEN: usize = 32;
/// Bytes of a [`TokenHash`]: 128 bits, no collision among any number of
/// tokens a deployment will ever see.
const HASH_LEN: usize = 16;

/// The key access tokens are hashed under. Never printed.
#[derive(Clone)]
pub struct TokenKey {
    key: hmac::Key,
    bytes: [u8; KEY_LEN],
}

impl TokenKey {
    /// A fresh key from the operating system's random source.
    pub fn random() -> TokenKey {
        let mut bytes = [0u8; KEY_LEN];
        if ring::rand::SystemRandom::new().fill(&mut bytes).is_err() {
            // getrandom failing is not something Linux does; should it, the
            // per-process random keys of std's hasher are still unguessable
            // from outside, if weaker.
            tracing::warn!("the system random source failed: the access-token key comes from std's RandomState");
            use std::hash::BuildHasher;
            for (i, chunk) in bytes.chunks_mut(8).enumerate() {
                let word = std::hash::RandomState::new().hash_one(i).to_le_bytes();
                chunk.copy_from_slice(&word[..chunk.len()]);
            }
        }
        TokenKey::from_bytes(bytes)
    }

    fn from_bytes(bytes: [u8; KEY_LEN]) -> TokenKey {
        TokenKey { key: hmac::Key::new(hmac::HMAC_SHA256, &bytes), bytes }
    }

    /// The key written as 64 hex digits (how the state file and Redis keep it).
    pub fn to_hex(&self) -> String {
        hex(&self.bytes)
    }

    /// A key written by [`TokenKey::to_hex`]; `None` for anything else.
    pub fn from_hex(text: &str) -> Option<TokenKey> {
        unhex::<KEY_LEN>(text).map(TokenKey::from_bytes)
    }

    /// The hash naming `token` under this key.
    pub fn hash(&self, token: &[u8]) -> TokenHash {
        let tag = hmac::sign(&self.key, token);
        let mut out = [0u8; HASH_LEN];
        out.copy_from_slice(&tag.as_ref()[..HASH_LEN]);
        TokenHash(out)
    }
}

impl PartialEq for TokenKey {
    fn eq(&self, other: &TokenKey) -> bool {
        self.bytes == other.bytes
    }
}

impl Eq for TokenKey {}

impl fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TokenKey(..)")
    }
}

/// What a store knows an access token by ([`TokenKey::hash`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TokenHash(pub [u8; HASH_LEN]);

impl TokenHash {
    /// 32 hex digits: its name in Redis keys and the state file.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }

    pub fn from_hex(text: &str) -> Option<TokenHash> {
        unhex::<HASH_LEN>(text).map(TokenHash)
    }
}

/// The account a token was issued to, until when (store time), and the
/// store's now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenOwner {
    pub account: String,
    pub until: Micros,
    pub now: Micros,
}

impl TokenOwner {
    /// How long the mapping still holds.
    pub fn remaining_us(&self) -> Micros {
        (self.until - self.now).max(0)
    }
}

/// What [`crate::store::TokenStore::claim_token`] found for a token-cache slot
/// (`crate::features::token_cache`): a cached token, the right to fetch one, or
/// another asker's fetch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// A cached entry (sealed: never the token in clear) with more than the
    /// asked minimum left, until when (store time), and the store's now.
    Cached { entry: Vec<u8>, until: Micros, now: Micros },
    /// Nothing usable was cached and nobody was fetching: the asker now
    /// holds the slot's fetch lock (until it reports, or the lock expires).
    Won { now: Micros },
    /// Another asker holds the fetch lock; `stored` is when the entry cached
    /// now was stored (0: none), which a forced refresh waits to see replaced.
    Busy { now: Micros, stored: Micros },
    /// The last fetch failed with this answer (WeChat's, kept for a moment
    /// so that its waiters get it too instead of fetching again).
    Failed { answer: Vec<u8> },
}

/// How a fetch a [`Claim::Won`] allowed ended
/// ([`crate::store::TokenStore::token_fetched`]).
#[derive(Debug, Clone, Copy)]
pub enum Fetched<'a> {
    /// A token: its sealed entry, its hash (for invalidation) and lifetime.
    Token { entry: &'a [u8], hash: TokenHash, ttl_us: Micros },
    /// WeChat answered an error: `answer` is shown to waiters for `hold_us`.
    Failed { answer: &'a [u8], hold_us: Micros },
    /// No answer to share (refused by a limit, WeChat unreachable): the
    /// lock is released and the next asker fetches.
    Abandoned,
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[(b >> 4) as usize] as char);
        out.push(DIGITS[(b & 15) as usize] as char);
    }
    out
}

fn unhex<const N: usize>(text: &str) -> Option<[u8; N]> {
    let digits = text.as_bytes();
    if digits.len() != 2 * N {
        return None;
    }
    let value = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = [0u8; N];
    for (i, pair) in digits.chunks(2).enumerate() {
        out[i] = value(pair[0])? << 4 | value(pair[1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_hashes_read_back_and_hashes_depend_on_the_key() {
        let key = TokenKey::random();
        let again = TokenKey::from_hex(&key.to_hex()).expect("hex key");
        assert_eq!(again, key);
        assert_eq!(again.hash(b"TOKEN"), key.hash(b"TOKEN"));
        assert_ne!(key.hash(b"TOKEN"), key.hash(b"TOKEN2"));
        assert_ne!(TokenKey::random().hash(b"TOKEN"), key.hash(b"TOKEN"));
        let h = key.hash(b"TOKEN");
        assert_eq!(TokenHash::from_hex(&h.to_hex()), Some(h));
        assert_eq!(h.to_hex().len(), 32);
        assert_eq!(TokenHash::from_hex("xyz"), None);
        assert_eq!(TokenKey::from_hex(&"g".repeat(64)), None);
        assert_eq!(format!("{key:?}"), "TokenKey(..)");
    }

    #[test]
    fn the_hash_is_hmac_sha256_truncated() {
        // RFC 4231 test case 2 (key "Jefe": HMAC pads a short key with
        // zeros, so the zero-padded 32-byte key is the same key).
        let mut bytes = [0u8; KEY_LEN];
        bytes[..4].copy_from_slice(b"Jefe");
        let hash = TokenKey::from_bytes(bytes).hash(b"what do ya want for nothing?");
        assert_eq!(hash.to_hex(), "5bdcc146bf60754e6a042426089575c7");
    }
}
