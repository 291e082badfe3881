//! `succeeded`: WeChat answered a call admitted at `sent_at` without a
//! penalised errcode: ends the penalty escalation (unless the call predates
//! it). lua/succeeded.lua. Runs on every answered call.

use std::sync::LazyLock;

use redis::Script;

use super::operation::{Kept, Command, Operation, Route};
use crate::time::Micros;
use crate::limit::{Key, RuleState};
use crate::store::answer::StoreError;
use crate::store::redis::protocol::{script, Keys};

static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(script!("succeeded.lua")));

pub struct Succeeded {
    /// When the answered call was admitted (store time).
    pub sent_at: Micros,
}

/// Locally too: the escalation this instance knows of ends with it.
impl Operation for Succeeded {
    type Out = ();
    type Reply = i64;
    const NAME: &'static str = "succeeded.lua";
    const ROUTE: Route = Route::LocalThenRedis;
    const KEPT: Kept = Kept::Penalty;

    fn apply(&self, state: &mut RuleState, _: Key<'_>, _: Micros) {
        state.penalty.succeeded(self.sent_at);
    }

    fn script() -> Option<&'static Script> {
        Some(&SCRIPT)
    }

    fn command(&self, keys: &Keys, key: Key<'_>, _: &str) -> Command {
        let mut inv = SCRIPT.key(keys.state(key.account, key.rule));
        inv.arg(self.sent_at);
        Command::Script(inv)
    }

    fn reply(_: Key<'_>, _: i64) -> Result<(), StoreError> {
        Ok(())
    }
}
