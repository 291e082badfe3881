//! Where decision state lives: one seam, [`Store`], and its implementations.
//!
//! - [`memory::MemoryStore`]: state in this process (the embedded default,
//!   exact for one instance);
//! - [`redis::RedisStore`]: state in Redis, shared by every instance; each
//!   operation is one Lua script (`lua/*.lua`) run atomically by SHA, on
//!   Redis `TIME`;
//! - [`resilient::Resilient`]: the Redis store behind a timeout, a circuit
//!   breaker, a fallback and a cache of known refusals — what a Redis
//!   deployment runs.
//!
//! The memory and Redis stores decide identically (the memory store runs
//! [`crate::limit::decide::decide`]; `lua/acquire.lua` computes the same);
//! `tests/conformance.rs` runs every operation of one scenario table on each
//! and compares the whole results.
//!
//! Adding a store operation touches this trait, each implementation and its
//! script: nothing else dispatches on the kind of store.

pub mod batch;
pub mod ledger;
pub mod memory;
pub mod redis;
pub mod resilient;
pub mod state_file;
pub mod tokens;

use std::time::Duration;

use async_trait::async_trait;

use self::tokens::{Claim, Fetched, TokenHash, TokenOwner};
use crate::clock::Micros;
use crate::config::Fallback;
use crate::limit::{Ask, Decision, Key, RuleState};
use crate::penalty::PenaltyPolicy;

/// The operations every store offers. Each is atomic for its (account,
/// rule): no other operation on the same pair, from any instance, is seen
/// half done.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Decides one call and, if it is admitted, debits every limit of its
    /// rule (or none) and takes its concurrency slot.
    async fn acquire(&self, ask: &Ask<'_>) -> Result<Decided, StoreError>;

    /// WeChat answered a penalised errcode to a call admitted at `sent_at`:
    /// starts or escalates the pair's penalty ([`crate::penalty`]).
    async fn penalise(&self, key: Key<'_>, policy: &PenaltyPolicy, sent_at: Micros) -> Result<PenaltyEnd, StoreError>;

    /// WeChat answered a call admitted at `sent_at` without a penalised
    /// errcode: ends the penalty escalation (unless the call predates it).
    async fn succeeded(&self, key: Key<'_>, sent_at: Micros) -> Result<(), StoreError>;

    /// Frees the concurrency slot of `holder` (no-op if it is not held).
    async fn release(&self, key: Key<'_>, holder: &str) -> Result<(), StoreError>;

    /// Extends the leases of `holders`' slots to `lease_us` from now; a slot
    /// already freed stays free.
    async fn renew(&self, key: Key<'_>, holders: &[&str], lease_us: Micros) -> Result<(), StoreError>;

    /// The pair's whole state now, read atomically, and the store's now.
    /// Canonical, so that two stores holding the same state answer the same:
    /// limits in the rule's order, slots by lease expiry then holder id.
    async fn inspect(&self, key: Key<'_>) -> Result<Snapshot, StoreError>;

    /// An operator imposes a penalty of `len_us`, or lifts it (0); the
    /// escalation starts over either way.
    async fn set_penalty(&self, key: Key<'_>, len_us: Micros) -> Result<PenaltyEnd, StoreError>;

    /// WeChat reset an account's counters (`clear_quota`): each of `keys`
    /// (states of one account) gets [`crate::limit::decide::clear`], at
    /// once for every instance. States that do not exist are left absent.
    async fn clear(&self, keys: &[Key<'_>]) -> Result<(), StoreError>;

    /// An access token was refreshed for `account`: warm-up starts again for
    /// its rules. `keep_us` is the longest warm-up of any rule.
    async fn token_refreshed(&self, account: &str, keep_us: Micros) -> Result<(), StoreError>;

    /// quota_sync (`crate::quota_sync`): WeChat counts `used` calls today
    /// for `key`; raises the day count of `key`'s state to it, never
    /// lowering it (calls reserved for tomorrow stay). Returns the day count
    /// before. Creates the state if it is absent.
    async fn raise_day(&self, key: Key<'_>, used: u64) -> Result<u64, StoreError>;

    /// Access tokens and the accounts they belong to ([`TokenStore`]).
    fn tokens(&self) -> &dyn TokenStore;

    /// How decisions are being made right now.
    fn status(&self) -> Status;

    /// Opens the calling serving thread's own resources (a Redis
    /// connection), if the store has any. Call it on that thread's runtime.
    async fn attach_worker(&self) {}

    /// The rules were reloaded: drop anything derived from the old ones.
    fn rules_changed(&self) {}

    /// The call of `key` this store admitted at `at` (`Decision::Admit`,
    /// not `degraded`) provably never reached WeChat: gives back what its
    /// admission took, never more ([`crate::limit::decide::refund`]).
    /// `key.rule` is the rule it was admitted under. Returns whether
    /// anything was given back. Its concurrency slot is freed by
    /// [`Store::release`], as for any call.
    async fn refund(&self, key: Key<'_>, at: Micros) -> Result<bool, StoreError>;

    /// Called once when wxgate stops, after calls in flight finished: write
    /// what must outlive the process.
    async fn close(&self) {}
}

/// Access tokens: which account a token was issued to, and the token
/// cache's slots (`crate::token_cache`). Not per (account, rule): kept out
/// of [`Store`]'s decision operations, reached by [`Store::tokens`].
#[async_trait]
pub trait TokenStore: Send + Sync {
    /// The hash this store knows `token` by ([`tokens`]); `None` while its
    /// key is not known (Redis not reached since start): the token is then
    /// unknown and nothing is learned.
    fn token_hash(&self, token: &[u8]) -> Option<TokenHash>;

    /// A token answer passed through: the token hashed to `hash` belongs to
    /// `account` for `ttl_us` from now (its `expires_in`). Any instance's
    /// [`TokenStore::token_owner`] says so from then until it expires.
    async fn learn_token(&self, hash: &TokenHash, account: &str, ttl_us: Micros) -> Result<(), StoreError>;

    /// The account the token hashed to `hash` was issued to, while the
    /// mapping lasts; `None` if unknown or expired.
    async fn token_owner(&self, hash: &TokenHash) -> Result<Option<TokenOwner>, StoreError>;

    /// The token cache (`crate::token_cache`): the entry cached in `slot`
    /// if it has more than `min_ttl_us` left and was stored after
    /// `newer_than` (store time; each store of a slot is later than the
    /// one before, even at the same clock reading); else, if nobody holds the slot's fetch
    /// lock, takes it for `holder` for `lock_us` ([`Claim::Won`]); else
    /// [`Claim::Busy`], or the answer of a fetch that just failed. Atomic:
    /// of any number of askers on any instances, one wins.
    async fn claim_token(
        &self,
        slot: &str,
        holder: &str,
        min_ttl_us: Micros,
        newer_than: Micros,
        lock_us: Micros,
    ) -> Result<Claim, StoreError>;

    /// The fetch `holder` won for `slot` ended: a token is cached (whoever
    /// holds the lock now); the lock is released, or replaced by a failed
    /// answer, if `holder` still holds it.
    async fn token_fetched(&self, slot: &str, holder: &str, fetched: Fetched<'_>) -> Result<(), StoreError>;

    /// WeChat rejected the token hashed to `hash` (40001, 40014, 42001):
    /// drops it from its slot if it is still that slot's token (a later
    /// token is never dropped). Returns whether it was dropped.
    async fn drop_token(&self, hash: &TokenHash) -> Result<bool, StoreError>;
}

/// A decision, and how it was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decided {
    pub decision: Decision,
    /// Made without the shared store (by the fallback, Redis being away).
    pub degraded: bool,
}

/// The end of a penalty, in store time, and the store's now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PenaltyEnd {
    pub until: Micros,
    pub now: Micros,
}

impl PenaltyEnd {
    /// Time left (0 if none).
    pub fn remaining_us(&self) -> Micros {
        (self.until - self.now).max(0)
    }
}

/// A pair's state and the store time it was read at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub state: RuleState,
    pub now: Micros,
}

/// How a store is deciding right now (`/readyz`, metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// In this process: the memory store.
    InProcess,
    /// In Redis, shared with every instance.
    Shared,
    /// Redis cannot be reached: decided by this fallback.
    Degraded(Fallback),
}

impl Status {
    /// `"memory"` or `"redis"`.
    pub fn kind(self) -> &'static str {
        match self {
            Status::InProcess => "memory",
            Status::Shared | Status::Degraded(_) => "redis",
        }
    }
}

/// Why a store could not answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// Redis could not be reached at all (refused, reset, no answer while
    /// connecting). wxgate starts anyway, deciding by the fallback.
    #[error("{0}")]
    Unreachable(String),
    /// Redis refused wxgate for a reason a retry will not fix (a wrong
    /// password, a bad URL): wxgate refuses to start.
    #[error("{0}")]
    Refused(String),
    /// No answer within `[store] timeout`.
    #[error("Redis did not answer within {0:?}")]
    Timeout(Duration),
    /// The circuit breaker is open: Redis is not asked until a probe answers.
    #[error("circuit breaker open")]
    BreakerOpen,
    /// Redis answered with an error (a full memory, a read-only replica, ...).
    #[error("Redis: {0}")]
    Redis(String),
    /// Redis lost wxgate's data (its epoch changed): nothing was decided;
    /// what this instance knows is re-seeded first ([`ledger`]).
    #[error("Redis lost its data (the epoch key changed)")]
    Lost,
    /// Redis answers again, but the other instances may not have added what
    /// they admitted without it yet: decided by the fallback meanwhile.
    #[error("Redis is back; other instances are still adding the calls they admitted without it")]
    Settling,
    /// A script answered something this wxgate cannot read.
    #[error("{script} answered {reply}")]
    BadReply { script: &'static str, reply: String },
    /// The embedded store holds `[store] max_entries` states, none of which
    /// may be dropped without granting a spent quota again: a new (account,
    /// rule) pair is refused until some state goes idle.
    #[error("the embedded store is full ([store] max_entries = {0}): new account/rule pairs are refused until state goes idle")]
    Full(usize),
    /// The embedded store holds this many learned access tokens, none
    /// expired: a new one is not kept.
    #[error("the embedded store holds {0} learned access tokens, none expired: this one is not kept")]
    TokensFull(usize),
}
