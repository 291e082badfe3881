//! `inspect`: the pair's whole state now, read atomically, and the store's
//! now. Canonical, so that two stores holding the same state answer the
//! same: limits in the rule's order, slots by lease expiry then holder id.
//! lua/inspect.lua (read-only).

use std::sync::LazyLock;

use redis::Script;

use super::operation::{Command, Operation, Route};
use crate::time::Micros;
use crate::limit::{Key, RuleState};
use crate::store::answer::{Snapshot, StoreError};
use crate::store::redis::protocol::{parse_state, script, InspectReply, Keys};

static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(script!("inspect.lua")));

pub struct Inspect;

/// Redis's state; while Redis is away with the local fallback, what this
/// instance decides by.
impl Operation for Inspect {
    type Out = Snapshot;
    type Reply = InspectReply;
    const NAME: &'static str = "inspect.lua";
    const ROUTE: Route = Route::RedisOrLocalFallback;

    fn apply(&self, state: &mut RuleState, key: Key<'_>, now: Micros) -> Snapshot {
        Snapshot { state: state.canonical(key.rule), now }
    }

    fn script() -> Option<&'static Script> {
        Some(&SCRIPT)
    }

    fn command(&self, keys: &Keys, key: Key<'_>, now: &str) -> Command {
        let mut inv = SCRIPT.key(keys.state(key.account, key.rule));
        inv.key(keys.slots(key.account, key.rule)).arg(now);
        Command::Script(inv)
    }

    fn reply(key: Key<'_>, (now, fields, slots): InspectReply) -> Result<Snapshot, StoreError> {
        Ok(Snapshot { state: parse_state(key.rule, &fields, slots), now })
    }
}
