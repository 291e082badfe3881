//! `learn_day`: quota_sync (`crate::ops::quota_sync`): WeChat reports
//! `limit` as the pair's day limit (quota/get's `daily_limit`); kept in its
//! state, where every decision reads it ([`crate::limit::learned`]).
//! Answers the learned limit before (0: none). Creates the state if it is
//! absent. lua/learn_day.lua.

use std::sync::LazyLock;

use redis::Script;

use super::operation::{Command, Kept, Operation, Route};
use crate::limit::learned::learn_day;
use crate::limit::{Key, RuleState};
use crate::store::answer::StoreError;
use crate::store::redis::protocol::{script, Keys};
use crate::time::Micros;

static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(script!("learn_day.lua")));

pub struct LearnDay {
    pub limit: u64,
}

/// In the fallback state too, so that decisions made without Redis keep
/// to the learned limit.
impl Operation for LearnDay {
    type Out = u64;
    type Reply = i64;
    const NAME: &'static str = "learn_day.lua";
    const ROUTE: Route = Route::LocalThenRedis;
    const ENDS_LEASES: bool = true;
    const FORGETS_REFUSALS: bool = true;
    const MAY_BE_REFUSED: bool = true;
    const KEPT: Kept = Kept::Learned;

    fn apply(&self, state: &mut RuleState, _: Key<'_>, now: Micros) -> u64 {
        learn_day(state, self.limit, now).unwrap_or(0)
    }

    fn script() -> Option<&'static Script> {
        Some(&SCRIPT)
    }

    fn command(&self, keys: &Keys, key: Key<'_>, now: &str) -> Command {
        let mut inv = SCRIPT.key(keys.state(key.account, key.rule));
        inv.arg(now).arg(self.limit).arg(crate::limit::learned::KEEP_US);
        Command::Script(inv)
    }

    fn reply(_: Key<'_>, before: i64) -> Result<u64, StoreError> {
        Ok(before.max(0) as u64)
    }
}
