//! `lower_windows`: WeChat answered a frequency 45009 for the pair
//! (`learn_windows`): each window of its rule that admitted enough calls in
//! the window before to be WeChat's limit is lowered until the quota day
//! ends ([`crate::limit::learned::lower_windows`]). Answers what it did to
//! each window ([`Lowering`]). lua/lower_windows.lua.

use std::sync::LazyLock;

use redis::Script;

use super::operation::{Command, Kept, Operation, Route};
use crate::limit::learned::{lower_windows, Lowering, Outcome, FLOOR_MIN, FLOOR_PERCENT, LOWER_PERCENT};
use crate::limit::{Key, Limit, RuleState};
use crate::store::answer::StoreError;
use crate::store::redis::protocol::{script, Keys};
use crate::time::Micros;

static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(script!("lower_windows.lua")));

/// The 45009 answered a call admitted at `sent_at`.
pub struct LowerWindows {
    pub sent_at: Micros,
}

/// In the fallback state too: decisions made without Redis keep to the
/// lowered windows.
impl Operation for LowerWindows {
    type Out = Vec<Lowering>;
    type Reply = Vec<i64>;
    const NAME: &'static str = "lower_windows.lua";
    const ROUTE: Route = Route::LocalThenRedis;
    const ENDS_LEASES: bool = true;
    const MAY_BE_REFUSED: bool = true;
    const KEPT: Kept = Kept::Learned;

    fn apply(&self, state: &mut RuleState, key: Key<'_>, now: Micros) -> Vec<Lowering> {
        lower_windows(key.rule, state, now, key.offset_us, self.sent_at)
    }

    fn script() -> Option<&'static Script> {
        Some(&SCRIPT)
    }

    fn command(&self, keys: &Keys, key: Key<'_>, now: &str) -> Command {
        let mut inv = SCRIPT.key(keys.state(key.account, key.rule));
        inv.arg(now).arg(key.offset_us).arg(LOWER_PERCENT).arg(self.sent_at).arg(FLOOR_PERCENT).arg(FLOOR_MIN);
        for limit in &key.rule.limits {
            if let Limit::Window(w) = limit {
                inv.arg(limit.window_key().label())
                    .arg(w.per_us())
                    .arg(w.margin_us())
                    .arg(w.count())
                    .arg(w.burst())
                    .arg(w.interval_us())
                    .arg(w.tolerance_us());
            }
        }
        Command::Script(inv)
    }

    fn reply(_: Key<'_>, counts: Vec<i64>) -> Result<Vec<Lowering>, StoreError> {
        counts
            .chunks_exact(4)
            .map(|c| {
                let outcome = Outcome::of_code(c[3])
                    .ok_or_else(|| StoreError::BadReply { script: Self::NAME, reply: format!("outcome {}", c[3]) })?;
                Ok(Lowering { before: c[0].max(0) as u64, after: c[1].max(0) as u64, admitted: c[2].max(0) as u64, outcome })
            })
            .collect()
    }
}
