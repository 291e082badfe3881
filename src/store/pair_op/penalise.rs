//! `penalise`: WeChat answered a penalised errcode to a call admitted at
//! `sent_at`: starts or escalates the pair's penalty ([`crate::limit::penalty`]).
//! lua/penalise.lua.

use std::sync::LazyLock;

use redis::Script;

use super::operation::{Kept, AnsweredBy, Command, Operation, PenaltyNote, Route, Wrapper};
use crate::time::{Micros, Span};
use crate::limit::{Key, RuleState};
use crate::limit::penalty::{PenaltyLength, PenaltyPolicy, PenaltyState};
use crate::store::answer::{PenaltyEnd, StoreError};
use crate::store::redis::protocol::{parse_until, script, Keys};

static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(script!("penalise.lua")));

pub struct Penalise<'a> {
    pub policy: &'a PenaltyPolicy,
    /// When the answered call was admitted (store time).
    pub sent_at: Micros,
}

/// In Redis, or at least on this instance; the penalty is noted in the
/// ledger either way, to be restored if Redis loses it (or given to Redis
/// when it answers again).
impl Operation for Penalise<'_> {
    type Out = PenaltyEnd;
    type Reply = Vec<i64>;
    const NAME: &'static str = "penalise.lua";
    const ROUTE: Route = Route::RedisOrLocal;
    const ENDS_LEASES: bool = true;
    const FORGETS_REFUSALS: bool = true;
    const KEPT: Kept = Kept::Penalty;

    fn apply(&self, state: &mut RuleState, key: Key<'_>, now: Micros) -> PenaltyEnd {
        let until = state.penalty.penalise(self.policy, self.sent_at, now, key.offset_us);
        PenaltyEnd { until, now }
    }

    fn script() -> Option<&'static Script> {
        Some(&SCRIPT)
    }

    fn command(&self, keys: &Keys, key: Key<'_>, now: &str) -> Command {
        let (kind, base, cap) = penalty_args(self.policy);
        let mut inv = SCRIPT.key(keys.state(key.account, key.rule));
        inv.arg(now).arg(key.offset_us).arg(kind).arg(base).arg(cap).arg(self.sent_at);
        Command::Script(inv)
    }

    fn reply(_: Key<'_>, reply: Vec<i64>) -> Result<PenaltyEnd, StoreError> {
        let (until, now) = parse_until(Self::NAME, &reply)?;
        Ok(PenaltyEnd { until, now })
    }

    fn penalty_note(end: &PenaltyEnd) -> Option<PenaltyNote> {
        Some(PenaltyNote::Raised(*end))
    }

    async fn after(&self, key: Key<'_>, end: &PenaltyEnd, by: AnsweredBy<'_>, wrapper: &dyn Wrapper) {
        match by {
            // Penalties are rare: one more round trip reads the level.
            AnsweredBy::Redis => match wrapper.shared_state(key).await {
                Ok(snapshot) => wrapper.ledger().penalised(key, snapshot.state.penalty, false),
                Err(_) => {
                    let p = PenaltyState { until: end.until, started: end.now, level: 0, last_len: end.remaining_us() };
                    wrapper.ledger().penalised(key, p, false);
                }
            },
            AnsweredBy::Local(_) => wrapper.ledger().penalised(key, wrapper.local_state(key).state.penalty, true),
        }
    }
}

/// How `policy` is written to penalise.lua: kind ("e" escalating, "m" next
/// minute), base length, cap (0: the next midnight).
fn penalty_args(policy: &PenaltyPolicy) -> (&'static str, Micros, Micros) {
    let (kind, base) = match policy.length {
        PenaltyLength::Escalating { base } => ("e", base.as_micros()),
        PenaltyLength::NextMinute => ("m", 0),
    };
    (kind, base, policy.max.map_or(0, Span::as_micros))
}
