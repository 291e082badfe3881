//! `lease_return`: `unspent` units of a lease, none of which was or will be
//! sent, given back ([`crate::limit::lease::give_back`]). lua/lease_return.lua.

use std::sync::LazyLock;

use redis::Script;

use super::operation::{AnsweredBy, Command, Operation, Route, Wrapper};
use crate::limit::lease::{give_back, Leased, RESERVE_RECORD};
use crate::limit::{Key, RuleState, WindowKey};
use crate::store::answer::StoreError;
use crate::store::redis::protocol::{script, Keys};
use crate::time::Micros;

static GIVE: LazyLock<Script> = LazyLock::new(|| Script::new(script!("lease_return.lua")));

/// Give back `unspent` units of `lease`: none of them was or will be sent.
pub struct LeaseReturn<'a> {
    pub lease: &'a Leased,
    pub unspent: u64,
    /// A reserve's ([`super::Lease::reserve`]).
    pub reserve: bool,
}

impl LeaseReturn<'_> {
    /// The lease's record for an instance named `instance` ([`super::Lease::record`]).
    fn record(&self, instance: &str) -> String {
        if self.reserve {
            format!("{instance}{RESERVE_RECORD}")
        } else {
            instance.to_owned()
        }
    }
}

/// On Redis only, as [`super::Lease`]. A return lost while Redis is away errs on
/// the safe side: the units stay counted, as if sent.
impl Operation for LeaseReturn<'_> {
    type Out = bool;
    type Reply = i64;
    const NAME: &'static str = "lease_return.lua";
    const ROUTE: Route = Route::Redis;
    const FORGETS_REFUSALS: bool = true;

    /// The memory store is one instance, named "" (as [`super::Lease`]'s).
    fn apply(&self, state: &mut RuleState, key: Key<'_>, now: Micros) -> bool {
        give_back(state, &self.record(""), self.lease, self.unspent, now, key.offset_us)
    }

    fn script() -> Option<&'static Script> {
        Some(&GIVE)
    }

    fn command(&self, keys: &Keys, key: Key<'_>, now: &str) -> Command {
        let mut inv = GIVE.key(keys.state(key.account, key.rule));
        inv.arg(now).arg(key.offset_us).arg(self.unspent).arg(self.record(keys.inst())).arg(self.lease.until).arg(self.lease.at);
        inv.arg(self.lease.booked.len());
        for b in &self.lease.booked {
            let kind = match b.key {
                WindowKey::Window(_) => "w",
                WindowKey::Calendar(period) => period.as_str(),
            };
            inv.arg(kind).arg(b.key.label()).arg(b.end).arg(b.step);
        }
        Command::Script(inv)
    }

    fn reply(_: Key<'_>, given: i64) -> Result<bool, StoreError> {
        Ok(given == 1)
    }

    async fn after(&self, key: Key<'_>, given: &bool, _: AnsweredBy<'_>, wrapper: &dyn Wrapper) {
        if *given {
            wrapper.ledger().refunded(key, self.lease.at, self.unspent.min(self.lease.units));
        }
    }
}
