//! Where decision state lives: one seam, [`Store`], and its implementations.
//!
//! - [`memory::MemoryStore`]: state in this process (the embedded default,
//!   exact for one instance);
//! - [`redis::RedisStore`]: state in Redis, shared by every instance. Most
//!   operations are one Lua script (`lua/*.lua`) run by SHA on Redis
//!   `TIME`, atomic by Redis running one script at a time; freeing a slot
//!   (`release`) is a plain `ZREM`, and the access-token key is read with
//!   plain `SET NX` and `GET` ([`redis::RedisStore::load_token_key`]);
//! - [`resilient::Resilient`]: the Redis store behind a timeout, a circuit
//!   breaker, a fallback and a cache of known refusals — what a Redis
//!   deployment runs.
//!
//! The memory and Redis stores decide identically (the memory store runs
//! [`crate::limit::decide::decide`]; `lua/acquire.lua` computes the same);
//! `tests/conformance.rs` runs every operation of one scenario table on each
//! and compares the whole results.
//!
//! Operations on one (account, rule) pair other than `acquire` are each
//! declared once, in [`op`]: the pure function the memory store runs, the
//! script or command the Redis store sends and how its answer is read, and
//! how the resilient wrapper routes it. Callers run them with
//! `Store::apply` (on `dyn Store`: `store.apply(key, Release { holder })`). Adding one
//! touches its file in `src/store/op/`, its line in the `ops!` list of
//! `src/store/op.rs`, its `lua/` script, its conformance row and the docs:
//! no store implementation.

pub mod answer;
pub mod batch;
pub mod ledger;
pub mod memory;
pub mod pair_op;
pub mod redis;
pub mod resilient;
pub mod sharded;
pub mod state_file;
pub mod tokens;

use async_trait::async_trait;

pub use self::answer::{Decided, Penalised, PenaltyEnd, Snapshot, Status, StoreError};
use self::pair_op::{Listed, PairOp, PairReply};
use self::tokens::{Claim, Fetched, TokenHash, TokenOwner};
use crate::limit::{Ask, Key};
use crate::time::Micros;

/// What every store offers: decisions ([`Store::acquire`]), the operations
/// of [`op`] on one (account, rule) pair ([`Store::run`], typed as
/// `Store::apply` on `dyn Store`), the account-wide `clear` and `token_refreshed`, the
/// token mappings ([`Store::tokens`]) and its life cycle.
///
/// What is atomic: on the memory store every operation on a pair runs
/// under that pair's shard lock. On Redis, each operation that is a script
/// runs alone (Redis runs one script at a time), so no other operation on
/// the same pair, from any instance, is seen half done; `release` is one
/// plain command. The resilient wrapper writes some operations to its local
/// fallback store and to Redis, one after the other ([`pair_op::Route`]): each
/// write is atomic, the pair of them is not.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Decides one call and, if it is admitted, debits every limit of its
    /// rule (or none) and takes its concurrency slot.
    async fn acquire(&self, ask: &Ask<'_>) -> Result<Decided, StoreError>;

    /// Runs one operation of [`op`] on `key`'s state. Object-safe form of
    /// `Store::apply` (on `dyn Store`), which callers use.
    async fn run(&self, key: Key<'_>, op: PairOp<'_>) -> Result<PairReply, StoreError>;

    /// WeChat reset an account's counters (`clear_quota`): each of `keys`
    /// (states of one account) gets [`crate::limit::decide::clear`], at
    /// once for every instance. States that do not exist are left absent.
    /// Not an [`op`]: it spans several pairs (one script over all of them
    /// on Redis) and creates none.
    async fn clear(&self, keys: &[Key<'_>]) -> Result<(), StoreError>;

    /// An access token was refreshed for `account`: warm-up starts again for
    /// its rules. `keep_us` is the longest warm-up of any rule. Not an
    /// [`op`]: it is the account's, not a pair's.
    async fn token_refreshed(&self, account: &str, keep_us: Micros) -> Result<(), StoreError>;

    /// The pairs with a penalty in force now, those ending last first, at
    /// most `max`: whatever set them (WeChat's errcode through any
    /// instance, an operator, the state file read at start). Never a pass
    /// that blocks calls: the memory store locks one shard at a time; Redis
    /// reads its index of penalties (`redis/penalties.rs`), not the pairs.
    async fn penalised(&self, max: usize) -> Result<Vec<Penalised>, StoreError>;

    /// Access tokens and the accounts they belong to ([`TokenStore`]).
    fn tokens(&self) -> &dyn TokenStore;

    /// How decisions are being made right now.
    fn status(&self) -> Status;

    /// Opens the calling serving thread's own resources (a Redis
    /// connection), if the store has any. Call it on that thread's runtime.
    async fn attach_worker(&self) {}

    /// The rules were reloaded: drop anything derived from the old ones.
    fn rules_changed(&self) {}

    /// How many instances the fallback divides each limit by (`None`: a
    /// store that does not share its limits).
    fn instances(&self) -> Option<u32> {
        None
    }

    /// Called once when wxgate stops, after calls in flight finished: write
    /// what must outlive the process.
    async fn close(&self) {}
}

impl dyn Store {
    /// Runs `op` on `key`'s state and gives its answer: the front door to
    /// the operations of [`op`] (`store.apply(key, Succeeded { sent_at })`).
    pub async fn apply<'a, O: Listed<'a>>(&self, key: Key<'_>, op: O) -> Result<O::Out, StoreError> {
        let reply = self.run(key, op.pair()).await?;
        O::out(reply)
            .ok_or_else(|| StoreError::BadReply { script: O::NAME, reply: "another operation's answer".into() })
    }
}

/// Access tokens: which account a token was issued to, and the token
/// cache's slots (`crate::features::token_cache`). Not per (account, rule): kept out
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

    /// The token cache (`crate::features::token_cache`): the entry cached in `slot`
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
    /// token is never dropped) and the slot is of one of `kinds` (the
    /// kinds of token the answering host issues, e.g. `["wecom"]` for
    /// qyapi; empty: any). Returns whether it was dropped.
    async fn drop_token(&self, hash: &TokenHash, kinds: &[&str]) -> Result<bool, StoreError>;
}
