//! Where decision state lives. One seam, several stores: the in-process
//! [`MemoryStore`] (the embedded default, for a single instance) and, from the
//! Redis issue on, a store shared by every instance. All of them run the same
//! decision ([`crate::limit::decide`]) with the same semantics.

pub mod memory;
pub mod redis;

use crate::clock::Micros;
use crate::limit::{Decision, Rule};
use crate::penalty::PenaltyPolicy;

pub use self::redis::{RedisConfig, RedisStore};
pub use memory::MemoryStore;

/// A store could not decide (e.g. Redis unreachable or too slow).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store unavailable: {0}")]
    Unavailable(String),
}

/// The configured store.
pub enum Store {
    Memory(MemoryStore),
    Redis(RedisStore),
}

impl Store {
    /// Decides one call of `rule` for `account`; debits every limit or none.
    pub async fn acquire(&self, account: &str, rule: &Rule, offset_us: Micros) -> Result<Decision, StoreError> {
        match self {
            Store::Memory(m) => Ok(m.acquire(account, rule, offset_us)),
            Store::Redis(r) => r.acquire(account, rule, offset_us).await,
        }
    }

    /// Records a penalised answer to a call admitted at `sent_at`; returns the
    /// penalty's end in store time and the store's `now`.
    pub async fn penalise(
        &self,
        account: &str,
        rule: &Rule,
        policy: &PenaltyPolicy,
        sent_at: Micros,
        offset_us: Micros,
    ) -> Result<(Micros, Micros), StoreError> {
        match self {
            Store::Memory(m) => Ok(m.penalise(account, rule, policy, sent_at, offset_us)),
            Store::Redis(r) => r.penalise(account, rule, policy, sent_at, offset_us).await,
        }
    }

    /// Records a successful answer to a call admitted at `sent_at`.
    pub async fn succeeded(
        &self,
        account: &str,
        rule: &Rule,
        sent_at: Micros,
        offset_us: Micros,
    ) -> Result<(), StoreError> {
        match self {
            Store::Memory(m) => {
                m.succeeded(account, rule, sent_at, offset_us);
                Ok(())
            }
            Store::Redis(r) => r.succeeded(account, rule, sent_at).await,
        }
    }
}
