//! The memory store's learned access tokens (`crate::store::tokens`):
//! hash → (account, until), at most `cap` of them. What
//! `lua/learn_token.lua` keeps in Redis, under one mutex.
//!
//! Their expiries are kept in time order too, so that finding the expired
//! ones costs O(log n) per token that expired, not a pass over all of them:
//! a map full of live tokens refuses a new one at once (it scanned the
//! million held on every refusal).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rustc_hash::FxHashMap;

use crate::store::tokens::TokenHash;
use crate::time::Micros;

pub struct LearnedTokens {
    map: FxHashMap<TokenHash, (String, Micros)>,
    /// An entry (until, hash) per token of `map`, with an until no later
    /// than the token's own: one learned again later is found when this
    /// comes due and queued again at its new expiry. Entries of tokens
    /// already gone are dropped when they come due.
    expiries: BinaryHeap<Reverse<(Micros, TokenHash)>>,
    cap: usize,
    /// Entries looked at to find expired ones (tests).
    #[cfg(test)]
    visited: usize,
}

/// The map holds `cap` live tokens: a new one is refused.
#[derive(Debug, PartialEq, Eq)]
pub struct Full;

impl LearnedTokens {
    pub fn new(cap: usize) -> Self {
        LearnedTokens {
            map: FxHashMap::default(),
            expiries: BinaryHeap::new(),
            cap,
            #[cfg(test)]
            visited: 0,
        }
    }

    /// Learns (or re-learns) `hash` as `account`'s until `until`.
    pub fn learn(&mut self, hash: TokenHash, account: &str, until: Micros, now: Micros) -> Result<(), Full> {
        if self.map.len() >= self.cap && !self.map.contains_key(&hash) {
            self.drop_expired(now);
            if self.map.len() >= self.cap {
                return Err(Full);
            }
        }
        self.insert(hash, account.to_owned(), until);
        Ok(())
    }

    fn insert(&mut self, hash: TokenHash, account: String, until: Micros) {
        match self.map.get_mut(&hash) {
            // Its queued expiry is no later than its old one. An earlier
            // new one is not queued (the same token's expires_in comes back
            // a little shorter on every stable_token call): it goes at the
            // old time, or at the periodic sweep, and is never answered as
            // live meanwhile (`get`).
            Some(held) => *held = (account, until),
            None => {
                self.map.insert(hash, (account, until));
                self.expiries.push(Reverse((until, hash)));
            }
        }
    }

    /// The live token's (account, until).
    pub fn get(&self, hash: &TokenHash, now: Micros) -> Option<&(String, Micros)> {
        self.map.get(hash).filter(|(_, until)| *until > now)
    }

    /// Drops the tokens expired at `now`; whether any went.
    pub fn drop_expired(&mut self, now: Micros) -> bool {
        let mut dropped = false;
        while let Some(&Reverse((due, hash))) = self.expiries.peek() {
            if due > now {
                break;
            }
            self.expiries.pop();
            #[cfg(test)]
            {
                self.visited += 1;
            }
            match self.map.get(&hash) {
                Some((_, until)) if *until <= now => {
                    self.map.remove(&hash);
                    dropped = true;
                }
                // Learned again since: due at its new expiry.
                Some((_, until)) => self.expiries.push(Reverse((*until, hash))),
                None => {}
            }
        }
        dropped
    }

    /// The live tokens, for the state file.
    pub fn live(&self, now: Micros) -> impl Iterator<Item = (&TokenHash, &String, Micros)> {
        self.map.iter().filter(move |(_, (_, until))| *until > now).map(|(h, (a, until))| (h, a, *until))
    }

    /// Tokens loaded from the state file.
    pub fn load(&mut self, tokens: impl IntoIterator<Item = (TokenHash, String, Micros)>) {
        for (hash, account, until) in tokens {
            self.insert(hash, account, until);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Micros = 1_000_000;
    const TTL: Micros = 7200 * SEC;

    fn hash(i: usize) -> TokenHash {
        let mut h = TokenHash([0; 16]);
        h.0[..8].copy_from_slice(&(i as u64).to_le_bytes());
        h
    }

    /// A platform whose map is full of live tokens (a token flood, or more
    /// authorised accounts than the cap): each refused token must not scan
    /// every held one (a scan per refusal makes 1,000 refusals at a cap of
    /// 1,000 look at 1,000,000 entries; at the real cap, a million per
    /// token response).
    #[test]
    fn a_full_map_of_live_tokens_refuses_a_new_one_without_scanning_them_all() {
        let mut learned = LearnedTokens::new(1000);
        for i in 0..1000 {
            assert_eq!(learned.learn(hash(i), "wx1", TTL + i as Micros, i as Micros), Ok(()));
        }
        let now = 2000;
        for i in 1000..2000 {
            assert_eq!(learned.learn(hash(i), "wx2", now + TTL, now), Err(Full));
        }
        assert_eq!(learned.visited, 0, "no token was due: none looked at");
        // A held token is re-learned at the cap (a new expiry, no new entry).
        assert_eq!(learned.learn(hash(5), "wx1", now + TTL, now), Ok(()));
        assert_eq!(learned.get(&hash(5), TTL + 100), Some(&("wx1".to_owned(), now + TTL)));
        // Expired ones make room, oldest first, and are gone.
        let later = TTL + 10;
        assert!(learned.get(&hash(3), later).is_none(), "token 3 expired at TTL + 3");
        for i in 2000..2010 {
            assert_eq!(learned.learn(hash(i), "wx3", later + TTL, later), Ok(()), "token {i}");
        }
        assert_eq!(learned.learn(hash(2010), "wx3", later + TTL, later), Err(Full), "room for 10 (0..=10 but 5)");
        assert_eq!(learned.map.len(), 1000);
        assert_eq!(learned.get(&hash(5), later).map(|(a, _)| a.as_str()), Some("wx1"), "re-learned: kept");
        assert!(learned.get(&hash(11), later).is_some());
        assert!(learned.visited <= 12, "{} entries looked at: only the 11 due", learned.visited);
    }

    /// The periodic sweep drops expired tokens; a token learned again after
    /// it expired is live again.
    #[test]
    fn expired_tokens_go_and_a_token_learned_again_lives() {
        let mut learned = LearnedTokens::new(10);
        assert_eq!(learned.learn(hash(1), "wx1", 100, 0), Ok(()));
        assert_eq!(learned.learn(hash(2), "wx1", 200, 0), Ok(()));
        assert_eq!(learned.learn(hash(2), "wx1", 300, 150), Ok(()), "extended");
        assert!(learned.drop_expired(250));
        assert!(learned.get(&hash(1), 250).is_none());
        assert!(learned.get(&hash(2), 250).is_some(), "its new expiry counts");
        assert_eq!(learned.live(250).count(), 1);
        assert_eq!(learned.learn(hash(1), "wx9", 900, 260), Ok(()));
        assert_eq!(learned.get(&hash(1), 500), Some(&("wx9".to_owned(), 900)));
        assert!(learned.drop_expired(400));
        assert!(!learned.drop_expired(400));
        assert_eq!(learned.live(400).map(|(h, _, _)| *h).collect::<Vec<_>>(), vec![hash(1)]);
    }
}
