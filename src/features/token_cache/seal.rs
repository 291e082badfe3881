//! The token cache's cryptography, all from `ring` (already in the binary):
//!
//! - one 256-bit **token key** per deployment (`WXGATE_TOKEN_KEY`, or
//!   `[tokens] key_file`; a random one per process when the cache is only
//!   in-process), from which three keys are derived with HMAC-SHA256 under
//!   fixed labels, so every instance with the same key agrees on all three;
//! - **sealing** a token for the store: ChaCha20-Poly1305 (an AEAD) with a
//!   random 96-bit nonce per write and the slot's name as associated data,
//!   so a sealed token cannot be read without the key nor moved to another
//!   slot;
//! - the **secret's hash** in a slot's name: HMAC-SHA256 of (kind, appid,
//!   secret), so a request with another secret never names the same slot
//!   and the secret is never stored;
//! - the **token's hash** (invalidation looks a rejected token up by it).

use base64::Engine;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};

use crate::store::tokens::TokenHash;

/// Bytes of a token key.
pub const KEY_LEN: usize = 32;

/// Why a token key cannot be read ([`parse_key`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// Base64 of another length than 32 bytes.
    #[error("the key is {0} bytes; it must be 32 (64 hex digits or 44 base64 characters)")]
    Length(usize),
    /// Neither 64 hex digits nor base64.
    #[error("the key must be 32 bytes written as 64 hex digits or in base64 (openssl rand -hex 32)")]
    Unreadable,
}

/// Why a [`Sealer`] cannot be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// ring refused the derived key.
    #[error("cannot derive the sealing key")]
    Derive,
    /// The system random source failed.
    #[error("the system random source failed")]
    Random,
}

/// The derived keys of one token key. Never printed.
pub struct Sealer {
    aead: LessSafeKey,
    secrets: hmac::Key,
    tokens: hmac::Key,
    rng: SystemRandom,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sealer(..)")
    }
}

impl Sealer {
    pub fn new(key: &[u8; KEY_LEN]) -> Result<Sealer, SealError> {
        let master = hmac::Key::new(hmac::HMAC_SHA256, key);
        let derive = |label: &[u8]| hmac::sign(&master, label);
        let aead_key = derive(b"wxgate token cache: seal");
        // 32 bytes from HMAC-SHA256: a ChaCha20 key ring accepts.
        let aead =
            LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, aead_key.as_ref()).map_err(|_| SealError::Derive)?);
        Ok(Sealer {
            aead,
            secrets: hmac::Key::new(hmac::HMAC_SHA256, derive(b"wxgate token cache: secret").as_ref()),
            tokens: hmac::Key::new(hmac::HMAC_SHA256, derive(b"wxgate token cache: token").as_ref()),
            rng: SystemRandom::new(),
        })
    }

    /// A sealer under a random key (the in-process cache).
    pub fn random() -> Result<Sealer, SealError> {
        let mut key = [0u8; KEY_LEN];
        SystemRandom::new().fill(&mut key).map_err(|_| SealError::Random)?;
        Sealer::new(&key)
    }

    /// `token` sealed for `slot`: nonce, then ciphertext and tag.
    pub fn seal(&self, slot: &str, token: &[u8]) -> Option<Vec<u8>> {
        let mut nonce = [0u8; NONCE_LEN];
        self.rng.fill(&mut nonce).ok()?;
        let mut out = token.to_vec();
        self.aead
            .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(slot.as_bytes()), &mut out)
            .ok()?;
        let mut sealed = nonce.to_vec();
        sealed.extend_from_slice(&out);
        Some(sealed)
    }

    /// The token sealed for `slot`; `None` if it was sealed under another
    /// key, for another slot, or altered.
    pub fn open(&self, slot: &str, sealed: &[u8]) -> Option<String> {
        if sealed.len() < NONCE_LEN {
            return None;
        }
        let (nonce, rest) = sealed.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        let mut buf = rest.to_vec();
        let plain = self.aead.open_in_place(nonce, Aad::from(slot.as_bytes()), &mut buf).ok()?;
        String::from_utf8(plain.to_vec()).ok()
    }

    /// 32 hex digits naming (kind, id, secret).
    pub fn secret_hash(&self, kind: &str, id: &str, secret: &[u8]) -> String {
        let mut ctx = hmac::Context::with_key(&self.secrets);
        for part in [kind.as_bytes(), id.as_bytes()] {
            ctx.update(&(part.len() as u64).to_be_bytes());
            ctx.update(part);
        }
        ctx.update(secret);
        TokenHash(first16(ctx.sign().as_ref())).to_hex()
    }

    /// What a cached token is known by for invalidation.
    pub fn token_hash(&self, token: &[u8]) -> TokenHash {
        TokenHash(first16(hmac::sign(&self.tokens, token).as_ref()))
    }
}

fn first16(tag: &[u8]) -> [u8; 16] {
    let mut out = [0u8; 16];
    out.copy_from_slice(&tag[..16]);
    out
}

/// A token key as written in `WXGATE_TOKEN_KEY` or a key file: 64 hex
/// digits or standard base64 of 32 bytes (surrounding whitespace ignored).
pub fn parse_key(text: &str) -> Result<[u8; KEY_LEN], KeyError> {
    let text = text.trim();
    if text.len() == 2 * KEY_LEN && text.bytes().all(|b| b.is_ascii_hexdigit()) {
        let mut key = [0u8; KEY_LEN];
        for (i, pair) in text.as_bytes().chunks(2).enumerate() {
            let digit = |c: u8| (c as char).to_digit(16).unwrap_or(0) as u8;
            key[i] = digit(pair[0]) << 4 | digit(pair[1]);
        }
        return Ok(key);
    }
    match base64::engine::general_purpose::STANDARD.decode(text) {
        Ok(bytes) if bytes.len() == KEY_LEN => {
            let mut key = [0u8; KEY_LEN];
            key.copy_from_slice(&bytes);
            Ok(key)
        }
        Ok(bytes) => Err(KeyError::Length(bytes.len())),
        Err(_) => Err(KeyError::Unreadable),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_tokens_open_only_under_their_key_and_slot() {
        let s = Sealer::new(&[7; KEY_LEN]).expect("sealer");
        let sealed = s.seal("token:wxA:00", b"TOKEN-123").expect("seal");
        assert!(!sealed.windows(9).any(|w| w == b"TOKEN-123"), "not in clear");
        assert_eq!(s.open("token:wxA:00", &sealed).as_deref(), Some("TOKEN-123"));
        assert_eq!(s.open("token:wxB:00", &sealed), None, "bound to its slot");
        assert_eq!(Sealer::new(&[8; KEY_LEN]).expect("sealer").open("token:wxA:00", &sealed), None, "bound to its key");
        assert_ne!(s.seal("token:wxA:00", b"TOKEN-123"), Some(sealed), "a fresh nonce each time");
        let again = Sealer::new(&[7; KEY_LEN]).expect("sealer");
        assert_eq!(again.secret_hash("token", "wxA", b"s1"), s.secret_hash("token", "wxA", b"s1"));
        assert_ne!(s.secret_hash("token", "wxA", b"s1"), s.secret_hash("token", "wxA", b"s2"));
        assert_ne!(s.secret_hash("token", "wxA", b"s1"), s.secret_hash("stable", "wxA", b"s1"));
        assert_eq!(again.token_hash(b"T"), s.token_hash(b"T"));
    }

    #[test]
    fn keys_are_read_from_hex_or_base64() {
        let hex = "00".repeat(31) + "ff";
        assert_eq!(parse_key(&format!(" {hex}\n")).map(|k| k[31]), Ok(0xff));
        let b64 = base64::engine::general_purpose::STANDARD.encode([1u8; 32]);
        assert_eq!(parse_key(&b64), Ok([1u8; 32]));
        assert_eq!(parse_key("abcd"), Err(KeyError::Length(3)));
        assert_eq!(parse_key("not a key"), Err(KeyError::Unreadable));
        assert_eq!(parse_key(&base64::engine::general_purpose::STANDARD.encode([1u8; 16])), Err(KeyError::Length(16)));
    }
}
