//! `release`: frees the concurrency slot of `holder` (no-op if it is not
//! held). On Redis one plain `ZREM`, no script. Runs on every call of a
//! rule with a concurrency cap.

use super::operation::{Command, Operation, Route};
use crate::time::Micros;
use crate::limit::{Key, RuleState};
use crate::store::answer::StoreError;
use crate::store::redis::protocol::Keys;

pub struct Release<'a> {
    pub holder: &'a str,
}

/// Locally too: the slot may have come from either store; freeing an
/// absent holder is a no-op.
impl Operation for Release<'_> {
    type Out = ();
    type Reply = i64;
    const NAME: &'static str = "ZREM <slots>";
    const ROUTE: Route = Route::LocalThenRedis;

    fn apply(&self, state: &mut RuleState, _: Key<'_>, _: Micros) {
        state.holders.retain(|(h, _)| h != self.holder);
    }

    fn command(&self, keys: &Keys, key: Key<'_>, _: &str) -> Command {
        Command::Plain(redis::cmd("ZREM").arg(keys.slots(key.account, key.rule)).arg(self.holder).clone())
    }

    fn reply(_: Key<'_>, _: i64) -> Result<(), StoreError> {
        Ok(())
    }
}
