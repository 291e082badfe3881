//! `set_penalty`: an operator imposes a penalty of `len_us`, or lifts it
//! (0); the escalation starts over either way. lua/set_penalty.lua.

use std::sync::LazyLock;

use redis::Script;

use super::operation::{Kept, AnsweredBy, Command, Operation, PenaltyNote, Route, Wrapper};
use crate::time::Micros;
use crate::limit::{Key, RuleState};
use crate::limit::penalty::PenaltyState;
use crate::store::answer::{PenaltyEnd, StoreError};
use crate::store::redis::protocol::{parse_until, script, Keys};

static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(script!("set_penalty.lua")));

pub struct SetPenalty {
    pub len_us: Micros,
}

/// Imposed or lifted in Redis, and locally too so that this instance
/// honours it while Redis is away; noted in the ledger, to be given to
/// Redis when it answers again if it could not take it.
impl Operation for SetPenalty {
    type Out = PenaltyEnd;
    type Reply = Vec<i64>;
    const NAME: &'static str = "set_penalty.lua";
    const ROUTE: Route = Route::LocalThenRedisOrLocal;
    const ENDS_LEASES: bool = true;
    const FORGETS_REFUSALS: bool = true;
    const KEPT: Kept = Kept::Penalty;

    fn apply(&self, state: &mut RuleState, _: Key<'_>, now: Micros) -> PenaltyEnd {
        state.penalty.set_by_hand(self.len_us, now);
        // A lift: the operator says WeChat takes calls again; windows a
        // frequency 45009 lowered are whole again too.
        if self.len_us <= 0 {
            state.learned_windows.clear();
        }
        PenaltyEnd { until: state.penalty.until, now }
    }

    fn script() -> Option<&'static Script> {
        Some(&SCRIPT)
    }

    fn command(&self, keys: &Keys, key: Key<'_>, now: &str) -> Command {
        let mut inv = SCRIPT.key(keys.state(key.account, key.rule));
        inv.arg(now).arg(self.len_us);
        Command::Script(inv)
    }

    fn reply(_: Key<'_>, reply: Vec<i64>) -> Result<PenaltyEnd, StoreError> {
        let (until, now) = parse_until(Self::NAME, &reply)?;
        Ok(PenaltyEnd { until, now })
    }

    fn penalty_note(end: &PenaltyEnd) -> Option<PenaltyNote> {
        Some(PenaltyNote::Set(*end))
    }

    async fn after(&self, key: Key<'_>, end: &PenaltyEnd, by: AnsweredBy<'_>, wrapper: &dyn Wrapper) {
        let unsynced = match by {
            AnsweredBy::Redis => false,
            AnsweredBy::Local(e) => {
                tracing::warn!(error = %e, "penalty changed on this instance only: Redis is unavailable");
                true
            }
        };
        let state = PenaltyState { until: end.until, started: end.now, level: 0, last_len: self.len_us };
        wrapper.ledger().penalty_set(key, state, unsynced && self.len_us > 0);
    }
}
