//! The embedded store's token cache (`crate::features::token_cache`): slots of sealed
//! tokens, their fetch locks, and which slot holds which token. What
//! `lua/token_claim.lua`, `lua/token_fetched.lua` and `lua/token_drop.lua`
//! do in Redis, under one mutex. Not kept in the state file: after a
//! restart the first token request fetches once.

use std::collections::HashMap;

use crate::store::tokens::{Claim, Fetched, TokenHash};
use crate::time::Micros;

/// Entries (slots, locks, token hashes) held before the first sweep of
/// expired ones; after a sweep the next comes when what is held has doubled,
/// so a sweep costs O(1) per claim however many live tokens are held (a
/// platform holds one per authorizer account).
const SWEEP_AT: usize = 4096;

struct Entry {
    sealed: Vec<u8>,
    until: Micros,
    stored_at: Micros,
    hash: TokenHash,
}

enum Lock {
    Held(String),
    Failed(Vec<u8>),
}

#[derive(Default)]
pub(super) struct TokenSlots {
    entries: HashMap<String, Entry>,
    locks: HashMap<String, (Lock, Micros)>,
    by_hash: HashMap<TokenHash, (String, Micros)>,
    /// Entries held at which the next write sweeps (0: [`SWEEP_AT`]).
    sweep_at: usize,
    /// Sweeps run (tests).
    #[cfg(test)]
    sweeps: usize,
}

impl TokenSlots {
    pub fn claim(
        &mut self,
        slot: &str,
        holder: &str,
        min_ttl_us: Micros,
        newer_than: Micros,
        lock_us: Micros,
        now: Micros,
    ) -> Claim {
        if let Some(e) = self.entries.get(slot) {
            if e.until - now > min_ttl_us && e.stored_at > newer_than {
                return Claim::Cached { entry: e.sealed.clone(), until: e.until, now };
            }
        }
        match self.locks.get(slot) {
            Some((Lock::Held(h), until)) if *until > now => {
                if h == holder {
                    Claim::Won { now }
                } else {
                    Claim::Busy { now, stored: self.entries.get(slot).map_or(0, |e| e.stored_at) }
                }
            }
            Some((Lock::Failed(answer), until)) if *until > now => Claim::Failed { answer: answer.clone() },
            _ => {
                self.sweep(now);
                self.locks.insert(slot.to_owned(), (Lock::Held(holder.to_owned()), now.saturating_add(lock_us)));
                Claim::Won { now }
            }
        }
    }

    pub fn fetched(&mut self, slot: &str, holder: &str, fetched: Fetched<'_>, now: Micros) {
        if let Fetched::Token { entry, hash, ttl_us } = fetched {
            let until = now.saturating_add(ttl_us);
            // Later than the entry it replaces, even at the same clock reading.
            let stored_at = self.entries.get(slot).map_or(now, |e| now.max(e.stored_at + 1));
            self.entries.insert(slot.to_owned(), Entry { sealed: entry.to_vec(), until, stored_at, hash });
            self.by_hash.insert(hash, (slot.to_owned(), until));
        }
        let ours = matches!(self.locks.get(slot), Some((Lock::Held(h), until)) if h == holder && *until > now);
        if !ours {
            return;
        }
        match fetched {
            Fetched::Failed { answer, hold_us } => {
                self.locks.insert(slot.to_owned(), (Lock::Failed(answer.to_vec()), now.saturating_add(hold_us)));
            }
            Fetched::Token { .. } | Fetched::Abandoned => {
                self.locks.remove(slot);
            }
        }
    }

    pub fn drop_token(&mut self, hash: &TokenHash, kinds: &[&str], now: Micros) -> bool {
        let Some((slot, until)) = self.by_hash.get(hash) else { return false };
        if *until <= now || !of_kind(slot, kinds) {
            return false;
        }
        match self.entries.get(slot) {
            Some(e) if e.hash == *hash && e.until > now => {
                let slot = slot.clone();
                self.entries.remove(&slot);
                true
            }
            _ => false,
        }
    }

    fn held(&self) -> usize {
        self.entries.len() + self.locks.len() + self.by_hash.len()
    }

    /// Drops expired entries once what is held reached `sweep_at`: a pass
    /// over every entry per doubling, not per claim (where a thousand
    /// accounts' live tokens made each new claim scan them all).
    fn sweep(&mut self, now: Micros) {
        if self.held() < self.sweep_at.max(SWEEP_AT) {
            return;
        }
        self.entries.retain(|_, e| e.until > now);
        self.locks.retain(|_, (_, until)| *until > now);
        self.by_hash.retain(|_, (_, until)| *until > now);
        self.sweep_at = self.held().saturating_mul(2);
        #[cfg(test)]
        {
            self.sweeps += 1;
        }
    }
}

/// Whether a slot (`<kind>:<id>:<hash>`) is of one of `kinds` (empty: any).
/// Mirrored by lua/token_drop.lua.
pub fn of_kind(slot: &str, kinds: &[&str]) -> bool {
    kinds.is_empty() || slot.split_once(':').is_some_and(|(kind, _)| kinds.contains(&kind))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Micros = 1_000_000;

    fn fetch(slots: &mut TokenSlots, i: usize, now: Micros) {
        let slot = format!("token:wx{i}:h");
        assert!(matches!(slots.claim(&slot, "me", 0, 0, SEC, now), Claim::Won { .. }));
        let mut hash = TokenHash([0; 16]);
        hash.0[..8].copy_from_slice(&(i as u64).to_le_bytes());
        slots.fetched(&slot, "me", Fetched::Token { entry: b"sealed", hash, ttl_us: 7200 * SEC }, now);
    }

    /// Many accounts' tokens, all live: a new slot's claim must not scan
    /// them all (a sweep per claim past SWEEP_AT entries would make 4,000
    /// claims 4,000 full passes).
    #[test]
    fn live_tokens_of_many_accounts_are_swept_once_per_doubling_not_per_claim() {
        let mut slots = TokenSlots::default();
        for i in 0..6000 {
            fetch(&mut slots, i, i as Micros);
        }
        assert_eq!(slots.entries.len(), 6000, "every token is live");
        // Held: a slot and a hash per token; swept at 4,096 and 8,192 held.
        assert!(slots.sweeps <= 3, "{} sweeps for 6,000 claims", slots.sweeps);
        // Expired ones still go, at the next doubling.
        let later = 7201 * SEC;
        for i in 6000..20_000 {
            fetch(&mut slots, i, later + i as Micros);
        }
        assert!(slots.entries.len() < 20_000, "the first 6,000 expired and were swept");
        assert!(slots.sweeps <= 10, "{} sweeps for 20,000 claims", slots.sweeps);
    }
}
