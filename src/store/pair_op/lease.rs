//! `lease`: a slice of the pair's limits taken for one instance to spend
//! in-process ([`crate::limit::lease::take`]); what it does not spend goes
//! back by [`super::LeaseReturn`]. lua/lease.lua.

use std::sync::LazyLock;

use redis::Script;

use super::operation::{AnsweredBy, Command, Kept, Operation, Route, Wrapper};
use crate::limit::lease::{has_calendar, supports, take, Booked, Leased, Want, RESERVE_RECORD};
use crate::limit::{Decision, Key, Limit, Quota, RuleState};
use crate::store::answer::StoreError;
use crate::store::redis::protocol::{script, Keys};
use crate::time::Micros;

static TAKE: LazyLock<Script> = LazyLock::new(|| Script::new(script!("lease.lua")));

/// Take up to `want` units spendable for at most `span_us`, leaving the
/// rule's reserve when `normal`; with `reserve`, of the calendar quotas
/// only, until their period's end ([`crate::limit::lease`] "Reserves").
pub struct Lease {
    pub want: u64,
    pub span_us: Micros,
    pub normal: bool,
    pub reserve: bool,
}

impl Lease {
    /// The lease's record for an instance named `instance`.
    pub fn record(&self, instance: &str) -> String {
        if self.reserve {
            format!("{instance}{RESERVE_RECORD}")
        } else {
            instance.to_owned()
        }
    }
}

/// On Redis only: a lease is a slice of the shared limits (the local
/// fallback decides by its own share while Redis is away). Its calendar
/// units count as this instance's in the ledger, as admissions do.
impl Operation for Lease {
    type Out = Leased;
    type Reply = String;
    const NAME: &'static str = "lease.lua";
    const ROUTE: Route = Route::Redis;
    const MAY_BE_REFUSED: bool = true;
    const KEPT: Kept = Kept::Counts;
    const CHECKS_EPOCH: bool = true;

    /// The memory store is one instance, named "" ([`crate::limit::InstanceLease`]).
    fn apply(&self, state: &mut RuleState, key: Key<'_>, now: Micros) -> Leased {
        let record = self.record("");
        let want =
            Want { instance: &record, units: self.want, span_us: self.span_us, normal: self.normal, reserve: self.reserve };
        take(state, key.rule, &want, now, key.offset_us)
    }

    fn script() -> Option<&'static Script> {
        Some(&TAKE)
    }

    fn command(&self, keys: &Keys, key: Key<'_>, now: &str) -> Command {
        let rule = key.rule;
        let mut inv = TAKE.key(keys.state(key.account, rule));
        let leasable = if self.reserve { has_calendar(rule) } else { supports(rule) };
        let want = if leasable { self.want } else { 0 };
        let span = if self.reserve { -1 } else { self.span_us };
        inv.arg(now).arg(key.offset_us).arg(want).arg(span).arg(self.record(keys.inst())).arg(rule.limits.len());
        let kept = |i: usize| if self.normal { rule.reserve.get(i).copied().unwrap_or(0) } else { 0 };
        for (i, limit) in rule.limits.iter().enumerate() {
            let field = limit.window_key().label();
            match limit {
                Limit::Window(w) => {
                    let kind = if rule.learn_windows { "wl" } else { "w" };
                    inv.arg(kind).arg(field).arg(w.interval_us()).arg(w.tolerance_us()).arg(kept(i))
                }
                Limit::Calendar { count, period } => inv
                    .arg(period.as_str())
                    .arg(field)
                    .arg(count.get() as i64)
                    .arg(i64::from(rule.learn_up))
                    .arg(kept(i)),
            };
        }
        Command::Script(inv)
    }

    fn reply(key: Key<'_>, reply: String) -> Result<Leased, StoreError> {
        if reply == "E" {
            return Err(StoreError::Lost);
        }
        let bad = || StoreError::BadReply { script: Self::NAME, reply: reply.clone() };
        let numbers: Vec<i64> =
            reply.split(' ').map(|n| n.parse::<i64>()).collect::<Result<_, _>>().map_err(|_| bad())?;
        match numbers.as_slice() {
            [0] => Ok(Leased::default()),
            [units, at, until, escalated, qi, qr, qt, ends @ ..]
                if *units > 0 && ends.len() == key.rule.limits.len() =>
            {
                Ok(Leased {
                units: *units as u64,
                at: *at,
                until: *until,
                escalated: *escalated == 1,
                quota: (*qi > 0).then(|| Quota { limit: (*qi - 1) as usize, remaining: (*qr).max(0) as u64, reset_us: *qt }),
                booked: key
                    .rule
                    .limits
                    .iter()
                    .zip(ends)
                    .map(|(limit, end)| Booked {
                        key: limit.window_key(),
                        end: *end,
                        step: match limit {
                            // A reserve books no window (its end 0).
                            Limit::Window(w) if *end != 0 => w.interval_us(),
                            Limit::Window(_) | Limit::Calendar { .. } => 0,
                        },
                    })
                    .collect(),
            })
            }
            _ => Err(bad()),
        }
    }

    async fn after(&self, key: Key<'_>, leased: &Leased, _: AnsweredBy<'_>, wrapper: &dyn Wrapper) {
        if leased.units > 0 {
            let admitted =
                Decision::Admit { at: leased.at, hold_us: 0, escalated: false, quota: None, calendar: None };
            wrapper.ledger().admitted(key, &admitted, false, leased.units);
        }
    }
}
