//! The operations on one (account, rule) pair's state, each declared once.
//!
//! An operation is a value (`Release { holder }`) whose [`Operation`] impl,
//! in its own file under `src/store/op/`, says everything about it:
//!
//! - [`Operation::apply`]: what it does to the pair's state, a pure function
//!   of the state and the store's now. The memory store runs it under the
//!   pair's lock (as governor's `StateStore::measure_and_replace`); the
//!   arithmetic lives in [`crate::limit::decide`] and [`crate::limit::penalty`];
//! - [`Operation::command`] and [`Operation::reply`]: the same on Redis, as
//!   its `lua/<op>.lua` script (or a plain command) and how the answer is
//!   read; the conformance table holds the two together;
//! - [`Operation::ROUTE`], [`Operation::FORGETS_REFUSALS`] and
//!   [`Operation::after`]: what the resilient wrapper does with it (Redis
//!   only, also on the local fallback store, answered locally while Redis
//!   is away) and what it notes in its ledger.
//!
//! The `ops!` list below is the only other place an operation is named: it
//! makes the object-safe [`PairOp`] / [`PairReply`] that [`Store::run`]
//! takes and gives, the one `match` over them ([`PairOp::run_on`]), and the
//! list of their scripts the Redis store loads ([`scripts`]).
//!
//! `acquire` is not one of them: it batches calls of an account into one
//! script run ([`super::batch`]), reads the account's warm-up, may be
//! answered from the cache of known refusals, and decides by one of three
//! fallbacks with scaled limits; `clear` spans several pairs, and
//! `token_refreshed` is an account's. They stay methods of [`Store`].
//!
//! [`Store::run`]: super::Store::run
//! [`Store`]: super::Store

mod operation;

use redis::Script;

pub use self::operation::{AnsweredBy, Command, Kept, Operation, PenaltyNote, Route, Runs, Wrapper};
use super::answer::{PenaltyEnd, Snapshot, StoreError};
use crate::limit::Key;

/// An operation of the `ops!` list: converts to and from [`PairOp`] and
/// [`PairReply`]. Generated.
pub trait Listed<'a>: Operation + Sized {
    fn pair(self) -> PairOp<'a>;
    /// `reply`'s answer, if it is this operation's.
    fn out(reply: PairReply) -> Option<Self::Out>;
}

/// The list of operations: `Variant: module::Type -> answer`. Declares the
/// modules and makes [`PairOp`], [`PairReply`], [`PairOp::run_on`], the
/// [`Listed`] impls and [`scripts`].
macro_rules! ops {
    ($($var:ident: $module:ident::$ty:ident$(<$lt:lifetime>)? -> $out:ty,)*) => {
        $(pub mod $module;)*
        $(pub use self::$module::$ty;)*

        /// One operation, for [`super::Store::run`].
        pub enum PairOp<'a> {
            $($var($ty$(<$lt>)?),)*
        }

        /// One operation's answer.
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub enum PairReply {
            $($var($out),)*
        }

        impl PairOp<'_> {
            /// Runs this operation on `store`.
            pub async fn run_on<S: Runs>(self, store: &S, key: Key<'_>) -> Result<PairReply, StoreError> {
                match self {
                    $(PairOp::$var(op) => store.run_op(key, &op).await.map(PairReply::$var),)*
                }
            }
        }

        $(
            impl<'a> Listed<'a> for $ty$(<$lt>)? {
                fn pair(self) -> PairOp<'a> {
                    PairOp::$var(self)
                }

                fn out(reply: PairReply) -> Option<$out> {
                    #[allow(unreachable_patterns)]
                    match reply {
                        PairReply::$var(out) => Some(out),
                        _ => None,
                    }
                }
            }
        )*

        /// The scripts of every operation.
        pub fn scripts() -> impl Iterator<Item = &'static Script> {
            [$(<$ty as Operation>::script(),)*].into_iter().flatten()
        }
    };
}

ops! {
    Penalise: penalise::Penalise<'a> -> PenaltyEnd,
    Succeeded: succeeded::Succeeded -> (),
    Release: release::Release<'a> -> (),
    Renew: renew::Renew<'a> -> (),
    Inspect: inspect::Inspect -> Snapshot,
    SetPenalty: set_penalty::SetPenalty -> PenaltyEnd,
    Refund: refund::Refund -> bool,
    RaiseDay: raise_day::RaiseDay -> u64,
    LearnDay: learn_day::LearnDay -> u64,
    LowerWindows: lower_windows::LowerWindows -> Vec<crate::limit::learned::Lowering>,
    Lease: lease::Lease -> crate::limit::lease::Leased,
    LeaseReturn: lease_return::LeaseReturn<'a> -> bool,
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use crate::store::redis::protocol;

    /// Nothing keeps a list of scripts by hand: every script in `lua/` (but
    /// the preludes, and the breaker's probe, loaded on its own) is loaded
    /// when the Redis store (or the jobs store, `jobs_*.lua`) connects, once.
    #[test]
    fn every_script_is_registered_once() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("lua");
        let files = std::fs::read_dir(dir)
            .expect("lua/")
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|f| f.ends_with(".lua") && f != "prelude.lua" && f != "probe.lua" && f != "jobs_prelude.lua")
            .count();
        let jobs = crate::jobs::redis::script_hashes();
        let loaded: Vec<&str> = protocol::scripts()
            .chain(super::scripts())
            .map(|s| s.get_hash())
            .chain(jobs.iter().map(String::as_str))
            .collect();
        let distinct: HashSet<&str> = loaded.iter().copied().collect();
        assert_eq!((loaded.len(), distinct.len()), (files, files));
    }
}
