//! What store operations answer, and why a store could not: the types every
//! store and every operation ([`super::pair_op`]) share. Re-exported by
//! [`crate::store`].

use std::sync::Arc;
use std::time::Duration;

use crate::config::Fallback;
use crate::limit::{Decision, RuleState};
use crate::time::Micros;

/// A decision, and how it was made.
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// A pair with a penalty in force ([`super::Store::penalised`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Penalised {
    pub account: String,
    /// The rule's [`crate::limit::Rule::state`].
    pub state: Arc<str>,
    /// When the penalty ends (store time).
    pub until: Micros,
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
    /// Redis answered, but refused the data of the keys this call touched
    /// (a key of the wrong type, a script failing on what a key holds):
    /// that pair's problem, not Redis's, so it never opens the breaker.
    #[error("Redis refused this call's keys: {0}")]
    BadKey(String),
    /// Redis lost wxgate's data (its epoch changed): nothing was decided;
    /// what this instance knows is re-seeded first ([`super::ledger`]).
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
    /// The embedded store holds `[store] max_recipients` recipients'
    /// states, none of whose windows is whole again: a call naming a
    /// recipient without state is refused until some are.
    #[error("the embedded store is full ([store] max_recipients = {0}): calls naming new recipients are refused until members' windows are whole again")]
    RecipientsFull(usize),
    /// The embedded store holds this many learned access tokens, none
    /// expired: a new one is not kept.
    #[error("the embedded store holds {0} learned access tokens, none expired: this one is not kept")]
    TokensFull(usize),
}
