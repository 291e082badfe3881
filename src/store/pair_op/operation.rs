//! What an operation declares ([`Operation`]) and what runs it ([`Runs`]);
//! see [`super`].

use std::future::Future;

use async_trait::async_trait;
use redis::Script;

use crate::limit::{Key, RuleState};
use crate::store::answer::{PenaltyEnd, Snapshot, StoreError};
use crate::store::ledger::Ledger;
use crate::store::redis::protocol::Keys;
use crate::time::Micros;

/// How the resilient wrapper ([`crate::store::resilient`]) runs an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// On Redis only; an error while Redis cannot answer.
    Redis,
    /// On the local fallback store first (this instance honours it while
    /// Redis is away, and the state may be either store's), then on Redis,
    /// whose answer (or error) is the answer.
    LocalThenRedis,
    /// On the local store first, then on Redis; while Redis cannot answer,
    /// the local store's answer.
    LocalThenRedisOrLocal,
    /// On Redis; while Redis cannot answer, on the local store instead.
    RedisOrLocal,
    /// On Redis; while Redis cannot answer and `fallback = "local"`, on the
    /// local store (what this instance decides by meanwhile); an error with
    /// another fallback.
    RedisOrLocalFallback,
}

/// What of a pair's state an operation changes that a crash must keep: the
/// memory store writes it to its journal (`src/store/memory/journal.rs`)
/// under the pair's lock, before any call sees the change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kept {
    /// Nothing a restart must know (slots, lost refunds err on the safe side).
    Nothing,
    /// The penalty and its escalation (journalled when they changed).
    Penalty,
    /// Calendar counts, only ever raised.
    Counts,
    /// The day limit WeChat reported ([`crate::limit::learned`]).
    Learned,
}

/// Which store gave an operation's answer (for [`Operation::after`]).
#[derive(Debug, Clone, Copy)]
pub enum AnsweredBy<'e> {
    Redis,
    /// The local fallback store, Redis having failed so.
    Local(&'e StoreError),
}

/// What the Redis store notes in its index of penalties once an operation
/// answered ([`Operation::penalty_note`], `crate::store::redis::penalties`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PenaltyNote {
    /// A penalty WeChat's errcode started or lengthened: a later end
    /// already noted stays.
    Raised(PenaltyEnd),
    /// Set or lifted by hand: this end (or none).
    Set(PenaltyEnd),
}

/// What an operation sends to Redis.
pub enum Command {
    /// A script of the operation (`lua/<op>.lua`), by SHA.
    Script(redis::ScriptInvocation<'static>),
    /// One plain command.
    Plain(redis::Cmd),
}

/// One operation on a pair's state; see the module documentation.
pub trait Operation: Send + Sync {
    /// Its answer.
    type Out: Send;
    /// What Redis answers it, before [`Operation::reply`] reads it.
    type Reply: redis::FromRedisValue + Send;
    /// Its name in errors (its script's file name).
    const NAME: &'static str;
    const ROUTE: Route;
    /// The resilient wrapper forgets the known refusals of the pair first
    /// (the operation may let a call through sooner).
    const FORGETS_REFUSALS: bool = false;
    /// It may bring a new pair: the memory store refuses it when full
    /// ([`StoreError::Full`]). Otherwise a pair is always found room for.
    const MAY_BE_REFUSED: bool = false;
    /// What of its change a crash must keep ([`Kept`]).
    const KEPT: Kept = Kept::Nothing;
    /// It may leave the pair less room than a quota lease this instance
    /// holds was taken with (a penalty, a lower limit): the resilient
    /// wrapper drops the pair's lease first (`super::super::resilient::leases`).
    const ENDS_LEASES: bool = false;
    /// Its script checks the deployment's epoch as acquire.lua does (the
    /// Redis store appends the epoch key and value after its own keys and
    /// arguments, on a single server; its reply says "E" when Redis holds
    /// another, and [`Operation::reply`] answers [`StoreError::Lost`]).
    const CHECKS_EPOCH: bool = false;

    /// What it does to `state` at the store's `now`.
    fn apply(&self, state: &mut RuleState, key: Key<'_>, now: Micros) -> Self::Out;

    /// Its script (with the prelude), if it has one: loaded when the Redis
    /// store connects.
    fn script() -> Option<&'static Script> {
        None
    }

    /// The command running it on Redis, at `now` ("" for Redis `TIME`).
    fn command(&self, keys: &Keys, key: Key<'_>, now: &str) -> Command;

    /// Its answer, read from Redis's.
    fn reply(key: Key<'_>, reply: Self::Reply) -> Result<Self::Out, StoreError>;

    /// What the Redis store notes in its index of penalties once the
    /// operation answered `out` on Redis (the admin API lists penalties from
    /// it). Nothing by default: only an operation that starts or sets a
    /// penalty says something.
    fn penalty_note(out: &Self::Out) -> Option<PenaltyNote> {
        let _ = out;
        None
    }

    /// Run by the resilient wrapper once the operation answered `out`: what
    /// to note of it (its ledger). Nothing by default.
    fn after(
        &self,
        key: Key<'_>,
        out: &Self::Out,
        by: AnsweredBy<'_>,
        wrapper: &dyn Wrapper,
    ) -> impl Future<Output = ()> + Send {
        let _ = (key, out, by, wrapper);
        async {}
    }
}

/// What the resilient wrapper lends [`Operation::after`].
#[async_trait]
pub trait Wrapper: Send + Sync {
    /// What this instance admitted and knows, for Redis to be given back.
    fn ledger(&self) -> &Ledger;
    /// The pair's state in Redis (through the breaker).
    async fn shared_state(&self, key: Key<'_>) -> Result<Snapshot, StoreError>;
    /// The pair's state in the local fallback store.
    fn local_state(&self, key: Key<'_>) -> Snapshot;
}

/// A store that runs any operation (memory, Redis, resilient).
pub trait Runs: Sync {
    fn run_op<O: Operation>(&self, key: Key<'_>, op: &O) -> impl Future<Output = Result<O::Out, StoreError>> + Send;
}
