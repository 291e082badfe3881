//! Where decision state lives. One seam, two stores: the in-process
//! [`MemoryStore`] (the embedded default, for a single instance) and the
//! [`RedisStore`] shared by every instance. Both run the same decision
//! ([`crate::limit::decide`]; in Redis its Lua port) with the same semantics.

pub mod batch;
pub mod memory;
pub mod redis;
pub mod shared;

use crate::clock::Micros;
use crate::limit::{Decision, Rule, RuleState};
use crate::penalty::PenaltyPolicy;

pub use self::redis::{RedisConfig, RedisStore};
pub use memory::MemoryStore;
pub use shared::{Fallback, Resilience, SharedStore, StoreCounters};

use std::sync::Arc;

/// A store could not decide (e.g. Redis unreachable or too slow).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// Redis could not be reached at all (refused, timed out, dropped).
    #[error("store unreachable: {0}")]
    Unreachable(String),
}

/// What one call asks of the store besides its account and rule.
#[derive(Debug, Clone, Copy)]
pub struct Asking<'a> {
    pub offset_us: Micros,
    /// Longest this call may be held for its slot (0: admit now or refuse).
    pub max_wait_us: Micros,
    /// Concurrency slot holder id, unique per call across all instances.
    pub holder: &'a str,
    /// Lease of a concurrency slot; renewed while the call lives.
    pub lease_us: Micros,
}

/// The configured store.
pub enum Store {
    Memory(MemoryStore),
    Redis(Arc<SharedStore>),
}

impl Store {
    /// Opens the calling serving thread's own connection, if the store has
    /// any ([`RedisStore::attach_worker`]). Call it on that thread's runtime.
    pub async fn attach_worker(&self) {
        if let Store::Redis(r) = self {
            r.attach_worker().await;
        }
    }

    /// Decides one call of `rule` for `account`; debits every limit or none.
    pub async fn acquire(&self, account: &str, rule: &Rule, asking: &Asking<'_>) -> Result<Decision, StoreError> {
        self.decide(account, rule, asking).await.map(|(d, _)| d)
    }

    /// Like [`Store::acquire`], also saying whether the decision was made
    /// without the shared store (a fallback decision).
    pub async fn decide(
        &self,
        account: &str,
        rule: &Rule,
        asking: &Asking<'_>,
    ) -> Result<(Decision, bool), StoreError> {
        match self {
            Store::Memory(m) => Ok((m.acquire(account, rule, asking), false)),
            Store::Redis(r) => r.acquire(account, rule, asking).await,
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
            Store::Redis(r) => r.succeeded(account, rule, sent_at, offset_us).await,
        }
    }

    /// Frees the concurrency slot of `holder`.
    pub async fn release(&self, account: &str, rule: &Rule, holder: &str, offset_us: Micros) -> Result<(), StoreError> {
        match self {
            Store::Memory(m) => {
                m.release(account, rule, holder, offset_us);
                Ok(())
            }
            Store::Redis(r) => r.release(account, rule, holder, offset_us).await,
        }
    }

    /// Extends the leases of slots held by calls still alive.
    pub async fn renew(
        &self,
        account: &str,
        rule: &Rule,
        holders: &[&str],
        lease_us: Micros,
        offset_us: Micros,
    ) -> Result<(), StoreError> {
        match self {
            Store::Memory(m) => {
                m.renew(account, rule, holders, lease_us, offset_us);
                Ok(())
            }
            Store::Redis(r) => r.renew(account, rule, holders, lease_us, offset_us).await,
        }
    }

    /// The state of one (account, rule) now, and the store's now.
    pub async fn inspect(
        &self,
        account: &str,
        rule: &Rule,
        offset_us: Micros,
    ) -> Result<(RuleState, Micros), StoreError> {
        match self {
            Store::Memory(m) => Ok(m.inspect(account, rule, offset_us)),
            Store::Redis(r) => r.inspect(account, rule, offset_us).await,
        }
    }

    /// Imposes a penalty of `len_us`, or lifts it (0); returns (until, now).
    pub async fn set_penalty(
        &self,
        account: &str,
        rule: &Rule,
        len_us: Micros,
        offset_us: Micros,
    ) -> Result<(Micros, Micros), StoreError> {
        match self {
            Store::Memory(m) => Ok(m.set_penalty(account, rule, len_us, offset_us)),
            Store::Redis(r) => r.set_penalty(account, rule, len_us, offset_us).await,
        }
    }

    /// An access-token refresh for `account` passed through: warm-up starts
    /// again for its rules. `keep_us` is the longest warm-up of any rule.
    pub async fn token_refreshed(&self, account: &str, keep_us: Micros) -> Result<(), StoreError> {
        match self {
            Store::Memory(m) => {
                m.token_refreshed(account);
                Ok(())
            }
            Store::Redis(r) => r.token_refreshed(account, keep_us).await,
        }
    }
}
