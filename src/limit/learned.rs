//! A pair's effective day limit: the configured day quota, lowered by what
//! was learned of the account's real one (issue 48, the lead's part: its
//! body is replaced at the merge).

use super::calendar::Period;
use super::{Limit, Rule, RuleState};
use crate::time::Micros;

/// The day limit `rule` applies to the pair whose state is `state` at `now`
/// (`None`: the rule has no day quota).
pub fn day_limit(rule: &Rule, state: &RuleState, now: Micros) -> Option<u64> {
    let _ = (state, now);
    rule.limits.iter().find_map(|l| match *l {
        Limit::Calendar { count, period: Period::Day } => Some(count.get()),
        _ => None,
    })
}
