//! `caller_auth = "required"`: a call proves which `[[caller]]` it is with
//! that caller's key, as `Authorization: Bearer <key>` or HTTP Basic
//! `<caller>:<key>` (what an HTTP client sends for a base URL carrying
//! `http://orders:KEY@wxgate:8080/`). The header is taken off the request
//! (WeChat never sees it) and never logged or shown; a refusal never
//! repeats it.
//!
//! Keys are known by their SHA-256 only ([`crate::config::KeyDigest`]).
//! A credential once verified is remembered by its exact header bytes in a
//! small per-serving-thread list ([`MAX_VERIFIED`]), so a service sending
//! the same header on every call pays one comparison, not a hash; the list
//! belongs to one config, so a reload that removes or changes a key takes
//! effect on the next call. Comparisons run in constant time.

use std::sync::Mutex;

use base64::Engine as _;
use http::header::{Entry as HeaderEntry, AUTHORIZATION};
use http::HeaderMap;

use crate::config::units::same_bytes as same;
use crate::config::KeyDigest;
use crate::error::ProxyError;

/// Credentials remembered per serving thread (a handful of services each).
pub const MAX_VERIFIED: usize = 32;
/// Longest credential (the whole header value) remembered: a longer one is
/// still accepted if its key is right, but hashed on each call, so what a
/// thread remembers stays under [`MAX_VERIFIED`] × this many bytes (16 KiB)
/// whatever a caller sends.
pub const MAX_REMEMBERED_LEN: usize = 512;

/// What a refusal says: the same for a missing, malformed or wrong
/// credential, so that a prober learns nothing of which part was wrong.
const REFUSAL: &str = "this wxgate serves only callers that prove who they are (caller_auth = \"required\"): send \
                       Authorization: Bearer <key>, or a base URL with <caller>:<key>@ (HTTP Basic)";

/// The credentials a serving thread has verified: the header's bytes and
/// the caller they prove.
pub struct Verified<C>(Mutex<Vec<(Box<[u8]>, C)>>);

impl<C> Default for Verified<C> {
    fn default() -> Self {
        Verified(Mutex::new(Vec::new()))
    }
}

/// A caller as a credential proves it: its name (a Basic credential's
/// must match).
pub trait Named: Clone {
    fn name(&self) -> &str;
}

/// Takes `Authorization` off `headers`: its one value (401 without one, or
/// with more than one).
pub fn take(headers: &mut HeaderMap) -> Result<http::HeaderValue, ProxyError> {
    let HeaderEntry::Occupied(given) = headers.entry(AUTHORIZATION) else {
        return Err(ProxyError::Unauthenticated(REFUSAL.into()));
    };
    let (_, mut values) = given.remove_entry_mult();
    match (values.next(), values.next()) {
        (Some(one), None) => Ok(one),
        _ => Err(ProxyError::Unauthenticated(REFUSAL.into())),
    }
}

/// The caller a credential proves, or 401: first among `verified`, else
/// by its key's digest among `by_key` (then remembered in `verified`).
pub fn prove<C: Named>(
    value: &http::HeaderValue,
    verified: &Verified<C>,
    by_key: impl Fn(&KeyDigest) -> Option<C>,
) -> Result<C, ProxyError> {
    let bytes = value.as_bytes();
    {
        let known = verified.0.lock().unwrap_or_else(|e| e.into_inner());
        let mut found = None;
        for (credential, caller) in known.iter() {
            if same(credential, bytes) {
                found = Some(caller.clone());
            }
        }
        if let Some(caller) = found {
            return Ok(caller);
        }
    }
    let (name, key) = parse(bytes).ok_or_else(|| ProxyError::Unauthenticated(REFUSAL.into()))?;
    let caller = by_key(&KeyDigest::of(&key)).ok_or_else(|| ProxyError::Unauthenticated(REFUSAL.into()))?;
    if name.is_some_and(|n| !same(&n, caller.name().as_bytes())) {
        return Err(ProxyError::Unauthenticated(REFUSAL.into()));
    }
    if bytes.len() > MAX_REMEMBERED_LEN {
        return Ok(caller);
    }
    let mut known = verified.0.lock().unwrap_or_else(|e| e.into_inner());
    if known.len() >= MAX_VERIFIED {
        known.remove(0);
    }
    known.push((bytes.into(), caller.clone()));
    Ok(caller)
}

/// A credential's caller name (Basic only) and key: `Bearer <key>` or
/// `Basic base64(<caller>:<key>)`, the scheme in any case.
fn parse(value: &[u8]) -> Option<(Option<Vec<u8>>, Vec<u8>)> {
    let text = std::str::from_utf8(value).ok()?.trim();
    let (scheme, rest) = text.split_once(' ')?;
    let rest = rest.trim();
    if scheme.eq_ignore_ascii_case("bearer") {
        return (!rest.is_empty()).then(|| (None, rest.as_bytes().to_vec()));
    }
    if scheme.eq_ignore_ascii_case("basic") {
        let decoded = base64::engine::general_purpose::STANDARD.decode(rest).ok()?;
        let colon = decoded.iter().position(|b| *b == b':')?;
        let (name, key) = (decoded[..colon].to_vec(), decoded[colon + 1..].to_vec());
        return (!key.is_empty()).then_some((Some(name), key));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_and_basic_credentials_are_read() {
        assert_eq!(parse(b"Bearer k3y"), Some((None, b"k3y".to_vec())));
        assert_eq!(parse(b"bearer  k3y "), Some((None, b"k3y".to_vec())));
        // base64("orders:k:ey") — the key may hold a colon.
        assert_eq!(parse(b"Basic b3JkZXJzOms6ZXk="), Some((Some(b"orders".to_vec()), b"k:ey".to_vec())));
        for bad in
            [&b"k3y"[..], b"Bearer", b"Bearer ", b"Basic !!!", b"Basic b3JkZXJz", b"Digest x", b"Basic b3JkZXJzOg=="]
        {
            assert_eq!(parse(bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn comparisons_see_every_byte() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"ab"));
        let long = b"Bearer 0123456789abcdef0123456789abcdef";
        assert!(same(long, long));
        for i in 0..long.len() {
            let mut other = *long;
            other[i] ^= 1;
            assert!(!same(long, &other), "byte {i}");
        }
    }
}
