//! The admin API's view of a pair: a readable picture of one (account, rule
//! state)'s state, for `/v1/buckets`.
//! Pure: the same for both stores, computed from the state they hold.

use serde_json::{json, Value};

use crate::limit::calendar::{civil_from_days, Period, DAY_US};
use crate::limit::forecast::{runs_out_at, used_fraction, RATE_TAU_US};
use crate::limit::learned;
use crate::limit::{Limit, LimitState, Rule, RuleState, ShareState, WindowKey, WindowLimit};
use crate::time::Micros;

/// Activity of this instance for the pair.
pub struct Here {
    pub held: u32,
    pub in_flight: u32,
    /// The pair's day count's rate per second as this instance estimates
    /// it (`crate::admit::forecasts`; `None`: no admission lately).
    pub day_rate: Option<f64>,
}

pub fn describe(account: &str, rule: &Rule, state: &RuleState, now: Micros, offset_us: Micros, here: Here) -> Value {
    let limits: Vec<Value> = rule
        .limits
        .iter()
        .map(|l| picture_of(l, state.get(l.window_key()), Some((rule, state)), now, offset_us))
        .collect();
    let p = &state.penalty;
    let slots = state.holders.iter().filter(|(_, exp)| *exp > now).count();
    let mut picture = json!({
        "account": account,
        "rule": &*rule.name,
        "now": local_time(now, offset_us),
        "limits": limits,
        // Where the limits are from: the rule's, or the account's own
        // (`[[quota]]`).
        "limits_source": if rule.account.is_some() { "override" } else { "rule" },
        "penalty": {
            "active": p.until > now,
            "remaining_seconds": ((p.until - now).max(0) as f64 / 1e6),
            "until": (p.until > now).then(|| local_time(p.until, offset_us)),
            "level": p.level,
            "escalates_if_repeated": p.is_recent(now),
        },
        "concurrency": {
            "cap": (rule.concurrency > 0).then_some(rule.concurrency),
            "slots_taken_all_instances": slots,
        },
        "this_instance": { "in_flight": here.in_flight, "held": here.held },
        "forecast": forecast(rule, state, now, offset_us, here.day_rate),
    });
    if let Some(fields) = picture.as_object_mut() {
        if let Some(path) = &rule.path {
            fields.insert("path".into(), Value::from(&**path));
        }
        if rule.reserve_percent > 0 {
            fields.insert("reserve".into(), reserve(rule, state, now, offset_us));
        }
        if rule.share_percent > 0 {
            fields.insert("share".into(), shares(rule, state, now, offset_us));
        }
    }
    picture
}

/// The day quota's forecast (`null` for a rule without one): the fraction
/// of the effective day limit used, the rate (per minute), and when the
/// quota runs out at that rate (`null`: not before the quota day ends).
fn forecast(rule: &Rule, state: &RuleState, now: Micros, offset_us: Micros, rate: Option<f64>) -> Value {
    let Some(limit) = learned::day_limit(rule, state, now) else { return Value::Null };
    let (used, _) = calendar_counts(state.get(WindowKey::Calendar(Period::Day)), Period::Day.id(now, offset_us));
    let day_end = Period::Day.next_start(now, offset_us);
    let out = runs_out_at(limit.saturating_sub(used), rate.unwrap_or(0.0), now, day_end);
    json!({
        "day_limit": limit,
        "used": used,
        "used_fraction": used_fraction(used, limit),
        "rate_per_minute": rate.map(|r| r * 60.0),
        "rate_time_constant_seconds": RATE_TAU_US / 1_000_000,
        "runs_out_at": out.map(|t| local_time(t, offset_us)),
        "runs_out_in_seconds": out.map(|t| (t - now) as f64 / 1e6),
    })
}

/// The rule's reserve: per limit, what only high-priority callers may use,
/// and what is left for normal ones now.
fn reserve(rule: &Rule, state: &RuleState, now: Micros, offset_us: Micros) -> Value {
    let limits: Vec<Value> = rule
        .limits
        .iter()
        .zip(&rule.reserve)
        .map(|(limit, kept)| {
            let (name, _, _) = limit.policy();
            let (kept, left) = match *limit {
                Limit::Window(w) => {
                    let kept = kept / w.interval_us();
                    (kept, window_tokens(&w, state.get(limit.window_key()), now) - kept)
                }
                Limit::Calendar { count, period } => {
                    let (used, _) = calendar_counts(state.get(limit.window_key()), period.id(now, offset_us));
                    (*kept, count.get() as i64 - used as i64 - kept)
                }
            };
            json!({ "limit": name, "kept_for_high_priority": kept, "normal_callers_can_use_now": left.max(0) })
        })
        .collect();
    json!({ "percent": rule.reserve_percent, "limits": limits })
}

/// Each caller's use of its `max_share` of the rule (callers that used none
/// yet are not listed: their share is whole).
fn shares(rule: &Rule, state: &RuleState, now: Micros, offset_us: Micros) -> Value {
    let mut callers: Vec<&ShareState> = state.shares.iter().collect();
    callers.sort_by(|a, b| a.caller.cmp(&b.caller));
    let callers: Vec<Value> = callers
        .into_iter()
        .map(|share| {
            let limits: Vec<Value> =
                rule.share.iter().map(|l| picture_of(l, share.get(l.window_key()), None, now, offset_us)).collect();
            json!({ "caller": &*share.caller, "limits": limits })
        })
        .collect();
    json!({ "max_share_percent": rule.share_percent, "callers": callers })
}

/// One limit as its state stands at `now`.
/// One limit's picture; `own`: the rule and the pair's state when the
/// limit is the rule's own (a day quota's learned limit applies to it).
fn picture_of(
    limit: &Limit,
    stored: Option<LimitState>,
    own: Option<(&Rule, &RuleState)>,
    now: Micros,
    offset_us: Micros,
) -> Value {
    let (name, _, _) = limit.policy();
    match *limit {
        Limit::Window(configured) => {
            // A window a frequency 45009 lowered until the quota day ends
            // (crate::limit::learned): it applies, and is shown as such.
            let (w, learned) = match own {
                Some((rule, state)) => {
                    let w = learned::window(rule, state, &configured, now);
                    let learned = state
                        .learned_windows
                        .iter()
                        .find(|l| rule.learn_windows && l.per_us == configured.per_us() && now < l.until)
                        .map_or(Value::Null, |l| {
                            json!({
                                "count": l.count,
                                "burst": l.burst,
                                "source": "errcode_45009",
                                "at": local_time(l.at, offset_us),
                                "until": local_time(l.until, offset_us),
                                "wechat_took": l.took,
                            })
                        });
                    (w, learned)
                }
                None => (configured, Value::Null),
            };
            let tat = match stored {
                Some(LimitState::Tat(t)) => t.max(now),
                _ => now,
            };
            json!({
                "limit": name,
                "kind": "window",
                "count": w.count(),
                "configured": configured.count(),
                "learned": learned,
                "per_seconds": w.per_us() as f64 / 1e6,
                "burst": w.burst(),
                "tokens": window_tokens(&w, stored, now),
                "refill_per_second": w.refill_per_second(),
                "next_admission_in_ms": ((tat - w.tolerance_us() - now).max(0) as f64 / 1e3),
                "full_in_ms": ((tat - now).max(0) as f64 / 1e3),
            })
        }
        Limit::Calendar { count: configured, period } => {
            let (used, next) = calendar_counts(stored, period.id(now, offset_us));
            let reset = period.next_start(now, offset_us);
            // A day quota: what WeChat reported for the account, and the
            // count that applies (crate::limit::learned).
            let (count, learned) = match (period, own.and_then(|(r, s)| Some((r, s, s.learned_day?)))) {
                (Period::Day, Some((rule, state, l))) => (
                    learned::day_count(rule, configured.get(), state, now),
                    json!({
                        "count": l.limit,
                        "source": "quota_get",
                        "at": local_time(l.at, offset_us),
                        "applies": l.fresh(now) && (rule.learn_up || l.limit < configured.get()),
                    }),
                ),
                _ => (configured.get(), Value::Null),
            };
            json!({
                "limit": name,
                "kind": "calendar",
                "count": count,
                "configured": configured,
                "learned": learned,
                "used": used,
                "remaining": count.saturating_sub(used),
                "reserved_for_next_period": next,
                "resets_at": local_time(reset, offset_us),
                "resets_in_seconds": (reset - now) as f64 / 1e6,
            })
        }
    }
}

/// Calls a window could admit at once at `now`.
fn window_tokens(w: &WindowLimit, stored: Option<LimitState>, now: Micros) -> i64 {
    let tat = match stored {
        Some(LimitState::Tat(t)) => t.max(now),
        _ => now,
    };
    (now + w.tolerance_us() + w.interval_us() - tat).div_euclid(w.interval_us()).clamp(0, w.burst() as i64)
}

/// A calendar quota's calls counted in period `current` and reserved for the next.
fn calendar_counts(stored: Option<LimitState>, current: i64) -> (u64, u64) {
    match stored {
        Some(LimitState::Count { period_id, used, next }) if period_id == current => (used, next),
        Some(LimitState::Count { period_id, next, .. }) if period_id == current - 1 => (next, 0),
        _ => (0, 0),
    }
}

/// RFC 3339 local time at `offset_us`, to the millisecond.
pub fn local_time(t: Micros, offset_us: Micros) -> String {
    let local = t + offset_us;
    let days = local.div_euclid(DAY_US);
    let in_day = local.rem_euclid(DAY_US);
    let (y, m, d) = civil_from_days(days);
    let secs = in_day / 1_000_000;
    let millis = (in_day % 1_000_000) / 1000;
    let off_min = offset_us / 60_000_000;
    let sign = if off_min < 0 { '-' } else { '+' };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}{sign}{:02}:{:02}",
        secs / 3600,
        (secs / 60) % 60,
        secs % 60,
        off_min.abs() / 60,
        off_min.abs() % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_time_is_rfc3339() {
        let t = (20_786 * 86_400 + 16 * 3600) * 1_000_000; // 2026-11-29 16:00 UTC
        assert_eq!(local_time(t, 8 * 3_600_000_000), "2026-11-30T00:00:00.000+08:00");
        assert_eq!(local_time(t + 1500, 0), "2026-11-29T16:00:00.001+00:00");
    }
}
