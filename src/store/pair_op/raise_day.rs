//! `raise_day`: quota_sync (`crate::ops::quota_sync`): WeChat counts `used` calls
//! today for the pair; raises the day count of its state to it, never
//! lowering it (calls reserved for tomorrow stay). Answers the day count
//! before. Creates the state if it is absent ([`crate::limit::decide::raise_day`]).
//! lua/raise_day.lua.

use std::sync::LazyLock;

use redis::Script;

use super::operation::{Kept, Command, Operation, Route};
use crate::time::Micros;
use crate::limit::decide::raise_day;
use crate::limit::{Key, RuleState};
use crate::store::answer::StoreError;
use crate::store::redis::protocol::{script, Keys};

static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(script!("raise_day.lua")));

pub struct RaiseDay {
    pub used: u64,
}

/// In the fallback state too, so that decisions made without Redis count
/// from the raised count.
impl Operation for RaiseDay {
    type Out = u64;
    type Reply = i64;
    const NAME: &'static str = "raise_day.lua";
    const ROUTE: Route = Route::LocalThenRedis;
    const MAY_BE_REFUSED: bool = true;
    const KEPT: Kept = Kept::Counts;

    fn apply(&self, state: &mut RuleState, key: Key<'_>, now: Micros) -> u64 {
        raise_day(state, self.used, now, key.offset_us)
    }

    fn script() -> Option<&'static Script> {
        Some(&SCRIPT)
    }

    fn command(&self, keys: &Keys, key: Key<'_>, now: &str) -> Command {
        let mut inv = SCRIPT.key(keys.state(key.account, key.rule));
        inv.arg(now).arg(key.offset_us).arg(self.used);
        Command::Script(inv)
    }

    fn reply(_: Key<'_>, before: i64) -> Result<u64, StoreError> {
        Ok(before.max(0) as u64)
    }
}
