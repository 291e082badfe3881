//! The index of penalties: a sorted set (`<prefix>:#penalties`) of the
//! pairs with a penalty, scored by when it ends, so that the admin API
//! lists the penalties in force (any instance's, restored by the ledger,
//! set by hand) with one read of a bounded range, never a pass over every
//! pair's key.
//!
//! It is noted after the pair's own script, as a command of its own (in a
//! Cluster the index lives in another slot than the pair): penalise.lua
//! and set_penalty.lua ([`crate::store::pair_op::Operation::penalty_note`]),
//! reconcile.lua restoring a penalty; a clear takes the account's pairs
//! out. So it may lag behind the pairs: a note that fails is logged, and
//! that penalty is missing from the list (it is enforced all the same); a
//! lift raced by a new penalty may leave an entry whose pair has none,
//! which readers skip by reading the pair. Entries whose penalty ended are
//! dropped at each note.

use std::sync::Arc;

use super::protocol::{PENALTIES, PENALTY_INDEX};
use super::RedisStore;
use crate::limit::Key;
use crate::store::pair_op::PenaltyNote;
use crate::store::{Penalised, StoreError};
use crate::time::Micros;

/// A pair's member in the index: `<account>:<rule state>` (an account has
/// no `:`).
fn member(account: &str, state: &str) -> String {
    format!("{account}:{state}")
}

impl RedisStore {
    /// Notes in the index what an operation answered on the pair
    /// (`account`, `state`). A failure is logged, never the operation's:
    /// the penalty holds.
    pub(super) async fn note_penalty(&self, account: &str, state: &str, note: PenaltyNote) {
        let (end, mode) = match note {
            PenaltyNote::Raised(end) => (end, "raise"),
            PenaltyNote::Set(end) => (end, "set"),
        };
        let mut inv = PENALTY_INDEX.key(self.keys.penalties());
        inv.arg(end.now).arg(member(account, state)).arg(end.until).arg(mode);
        if let Err(e) = self.run::<i64>(inv).await {
            tracing::warn!(error = %e, %account, rule = %state, "cannot note a penalty in Redis's index of penalties: the admin API and the console do not list it (it is enforced all the same)");
        }
    }

    /// Takes the pairs of `keys` (a clear's: their penalties are lifted)
    /// out of the index. A failure is logged: readers skip such entries.
    pub(super) async fn unnote_penalties(&self, keys: &[Key<'_>]) {
        let mut cmd = redis::cmd("ZREM");
        cmd.arg(self.keys.penalties());
        for key in keys {
            cmd.arg(member(key.account, &key.rule.state));
        }
        if let Err(e) = self.query::<i64>(cmd).await {
            tracing::debug!(error = %e, "cannot take cleared pairs out of Redis's index of penalties");
        }
    }

    /// The index's pairs penalised beyond now, ending last first, at most
    /// `max` (one read of a range of the sorted set).
    pub async fn penalised_pairs(&self, max: usize) -> Result<Vec<Penalised>, StoreError> {
        let mut inv = PENALTIES.key(self.keys.penalties());
        inv.arg(self.now_arg()).arg(max);
        let found: Vec<(String, Micros)> = self.run(inv).await?;
        found
            .into_iter()
            .map(|(member, until)| match member.split_once(':') {
                Some((account, state)) => Ok(Penalised { account: account.to_owned(), state: Arc::from(state), until }),
                None => Err(StoreError::BadReply { script: "penalties.lua", reply: format!("a member {member:?}") }),
            })
            .collect()
    }
}
