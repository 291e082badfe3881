//! `refund`: the call of `key` this store admitted at `at` (`Decision::Admit`,
//! not `degraded`) provably never reached WeChat: gives back what its
//! admission took, never more ([`crate::limit::decide::refund`]). `key.rule`
//! is the rule it was admitted under. Answers whether anything was given
//! back. Its concurrency slot is freed by [`super::Release`], as for any
//! call. lua/refund.lua.

use std::sync::LazyLock;

use redis::Script;

use super::operation::{AnsweredBy, Command, Operation, Route, Wrapper};
use crate::time::Micros;
use crate::limit::decide::refund;
use crate::limit::{Key, Limit, Rule, RuleState};
use crate::store::answer::StoreError;
use crate::store::redis::protocol::{script, Keys};

static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(script!("refund.lua")));

pub struct Refund {
    /// When the call was admitted (store time).
    pub at: Micros,
    /// What it cost ([`crate::limit::Ask::cost`]).
    pub cost: u64,
}

/// In Redis only: refunds are for calls Redis admitted (the proxy gives
/// nothing back for a degraded admission), and the local store took nothing
/// for them. A refund lost while Redis is away only errs on the safe side:
/// the call stays counted, as if it had reached WeChat. Known refusals of
/// the pair are forgotten (one may now be admitted).
impl Operation for Refund {
    type Out = bool;
    type Reply = i64;
    const NAME: &'static str = "refund.lua";
    const ROUTE: Route = Route::Redis;
    const FORGETS_REFUSALS: bool = true;

    fn apply(&self, state: &mut RuleState, key: Key<'_>, now: Micros) -> bool {
        refund(state, key.rule, self.at, now, key.offset_us, self.cost)
    }

    fn script() -> Option<&'static Script> {
        Some(&SCRIPT)
    }

    fn command(&self, keys: &Keys, key: Key<'_>, now: &str) -> Command {
        let mut inv = SCRIPT.key(keys.state(key.account, key.rule));
        inv.arg(now);
        refund_args(&mut inv, key.rule, key.offset_us, self.at, self.cost);
        inv.arg(keys.inst());
        Command::Script(inv)
    }

    fn reply(_: Key<'_>, given: i64) -> Result<bool, StoreError> {
        Ok(given == 1)
    }

    async fn after(&self, key: Key<'_>, given: &bool, _: AnsweredBy<'_>, wrapper: &dyn Wrapper) {
        if *given {
            wrapper.ledger().refunded(key, self.at, self.cost);
        }
    }
}

/// refund.lua's arguments after the clock: offset, the call's admission
/// time, the rule's max wait, its limits as acquire.lua takes them, then
/// the call's cost.
fn refund_args(inv: &mut redis::ScriptInvocation<'_>, rule: &Rule, offset_us: Micros, at: Micros, cost: u64) {
    inv.arg(offset_us).arg(at).arg(rule.max_wait_us).arg(rule.limits.len());
    for limit in &rule.limits {
        let field = limit.window_key().label();
        match limit {
            Limit::Window(w) => inv.arg("w").arg(field).arg(w.interval_us()).arg(w.tolerance_us()),
            Limit::Calendar { count, period } => inv.arg(period.as_str()).arg(field).arg(count.get() as i64).arg(0),
        };
    }
    inv.arg(cost.max(1));
}
