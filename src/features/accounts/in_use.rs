//! `[server] max_accounts`: at most that many accounts have calls on this
//! instance in one quota day. A call for an account new to the instance
//! when the cap is reached is refused (429, reason `accounts_full`, until
//! the next midnight of `quota_timezone`) before any state is created, so a
//! flood of made-up account names cannot take the room of the accounts in
//! use, nor fill the embedded store's `max_entries`. An account counts from
//! its first call of the day; the list starts again at midnight, when a
//! day quota's states expire too. Accounts already in use never notice the
//! cap.
//!
//! Cost: nothing without the cap; with it, one lookup under one lock per
//! call (per instance, never a store round trip).

use std::sync::Mutex;

use rustc_hash::FxHashMap;

use crate::error::ProxyError;
use crate::limit::calendar::Period;
use crate::time::Micros;

/// The accounts that had calls today on this instance.
#[derive(Default)]
pub struct InUse(Mutex<Day>);

#[derive(Default)]
struct Day {
    /// The quota day these accounts are of ([`Period::id`]).
    id: i64,
    accounts: FxHashMap<Box<str>, ()>,
}

impl InUse {
    /// Admits a call for `account` at `now` under a cap of `max` accounts
    /// a day (`offset_us`: `quota_timezone`); 429 for a new account past it.
    pub fn admit(&self, account: &str, max: usize, now: Micros, offset_us: Micros) -> Result<(), ProxyError> {
        let mut day = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let today = Period::Day.id(now, offset_us);
        if day.id != today {
            day.id = today;
            day.accounts.clear();
        }
        if day.accounts.contains_key(account) {
            return Ok(());
        }
        if day.accounts.len() >= max {
            return Err(ProxyError::AccountsFull { max, wait_us: Period::Day.next_start(now, offset_us) - now });
        }
        day.accounts.insert(account.into(), ());
        Ok(())
    }

    /// How many accounts had calls today.
    pub fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).accounts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Micros = 86_400_000_000;

    #[test]
    fn new_accounts_past_the_cap_wait_for_midnight_and_known_ones_never_do() {
        let in_use = InUse::default();
        let noon = 20_000 * DAY + DAY / 2;
        assert!(in_use.admit("a", 2, noon, 0).is_ok());
        assert!(in_use.admit("b", 2, noon, 0).is_ok());
        match in_use.admit("c", 2, noon, 0) {
            Err(ProxyError::AccountsFull { max: 2, wait_us }) => assert_eq!(wait_us, DAY / 2),
            other => panic!("{other:?}"),
        }
        assert!(in_use.admit("a", 2, noon + 1, 0).is_ok(), "an account in use goes on");
        assert!(in_use.admit("c", 2, noon + DAY / 2, 0).is_ok(), "a new day");
        assert_eq!(in_use.len(), 1);
    }
}
