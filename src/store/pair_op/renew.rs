//! `renew`: extends the leases of `holders`' slots to `lease_us` from now;
//! a slot already freed stays free. lua/renew.lua (`ZADD XX`, then the
//! slots key's TTL), one round trip.

use std::sync::LazyLock;

use redis::Script;

use super::operation::{Command, Operation, Route};
use crate::time::Micros;
use crate::limit::{Key, RuleState};
use crate::store::answer::StoreError;
use crate::store::redis::protocol::{script, Keys};

static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(script!("renew.lua")));

pub struct Renew<'a> {
    pub holders: &'a [&'a str],
    pub lease_us: Micros,
}

/// Locally too, like [`super::Release`].
impl Operation for Renew<'_> {
    type Out = ();
    type Reply = i64;
    const NAME: &'static str = "renew.lua";
    const ROUTE: Route = Route::LocalThenRedis;

    fn apply(&self, state: &mut RuleState, _: Key<'_>, now: Micros) {
        for (h, exp) in state.holders.iter_mut() {
            if self.holders.contains(&h.as_str()) {
                *exp = now + self.lease_us;
            }
        }
    }

    fn script() -> Option<&'static Script> {
        Some(&SCRIPT)
    }

    fn command(&self, keys: &Keys, key: Key<'_>, now: &str) -> Command {
        let mut inv = SCRIPT.key(keys.slots(key.account, key.rule));
        inv.arg(now).arg(self.lease_us);
        for h in self.holders {
            inv.arg(*h);
        }
        Command::Script(inv)
    }

    fn reply(_: Key<'_>, _: i64) -> Result<(), StoreError> {
        Ok(())
    }
}
