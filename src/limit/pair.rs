//! Keys of per-(account, rule state) maps, looked up by reference.

use std::sync::Arc;

/// An (account, rule state) key, owned by the map.
pub type Pair = (String, Arc<str>);

/// An (account, rule state) pair by reference: looks a [`Pair`] key up
/// without copying the account (hashes and compares as the owned pair).
#[derive(Hash)]
pub struct PairRef<'a>(pub &'a str, pub &'a Arc<str>);

impl hashbrown::Equivalent<Pair> for PairRef<'_> {
    fn equivalent(&self, key: &Pair) -> bool {
        self.0 == key.0 && **self.1 == *key.1
    }
}
