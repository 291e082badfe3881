//! The one derivation of a rule's numbers: everything computed from what a
//! `[[rule]]` configures (its limits' counts and bursts, `concurrency`,
//! `reserve`, `max_share`) is computed here, for the compiled config and for
//! the local fallback's scaling by `[store] instances` alike. A value derived
//! anywhere else drifts: the fallback once scaled the limits but kept the
//! unscaled reserve, and refused every normal-priority caller during an
//! outage.

use super::{Limit, Rule, WindowLimit};

/// What a derivation does with a percentage that leaves one side nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fit {
    /// The configuration is refused, with a message naming the limit.
    Refuse,
    /// Each side keeps at least one call (the fallback's scaled rule: a
    /// refused config is not an answer while Redis is away).
    Clamp,
}

impl Rule {
    /// A rule named `name` counting `limits`, with every option at its
    /// default (no shaping, warm-up, cap, reserve or share; 429 refusals).
    pub fn new(name: &str, limits: Vec<Limit>) -> Rule {
        let name: std::sync::Arc<str> = name.into();
        Rule {
            state: name.clone(),
            name,
            scope: super::Scope::Rule,
            path: None,
            patterns: Vec::new(),
            limits,
            max_wait_us: 0,
            warmup_us: 0,
            concurrency: 0,
            shadow: false,
            throttle_status: http::StatusCode::TOO_MANY_REQUESTS,
            policy_header: None,
            policy_prefixes: Vec::new(),
            reserve_percent: 0,
            reserve: Vec::new(),
            share_percent: 0,
            share: Vec::new(),
        }
    }

    /// Sets `reserve = "P%"` (0: none) and `max_share = "P%"` (0: none) and
    /// derives what they keep back and give each caller from the rule's
    /// limits. Refuses a percentage that leaves normal callers no call of a
    /// limit (reserve) or a caller no call at all (share), naming the limit.
    pub fn with_percents(mut self, reserve_percent: u32, share_percent: u32) -> Result<Rule, PercentError> {
        self.reserve_percent = reserve_percent;
        self.share_percent = share_percent;
        self.derive(Fit::Refuse)?;
        Ok(self)
    }

    /// What one of `instances` instances may use alone (the local fallback
    /// while Redis is away): every count, burst and concurrency cap divided
    /// by `instances` (rounded down, at least 1), and the reserve and the
    /// callers' shares derived again from those, as for a rule configured
    /// with them. Where the scaled numbers are too small for a percentage,
    /// each side keeps at least one call.
    pub fn scaled(&self, instances: u32) -> Rule {
        let n = u64::from(instances.max(1));
        let mut scaled = self.clone();
        scaled.limits = self
            .limits
            .iter()
            .map(|l| match *l {
                Limit::Window(w) => {
                    let count = (w.count / n).max(1);
                    Limit::Window(WindowLimit::new(count, w.per_us, (w.burst / n).clamp(1, count)))
                }
                Limit::Calendar { count, period } => Limit::Calendar { count: (count / n).max(1), period },
            })
            .collect();
        if self.concurrency > 0 {
            scaled.concurrency = (self.concurrency / instances.max(1)).max(1);
        }
        // Clamped: no error to give.
        let _ = scaled.derive(Fit::Clamp);
        scaled
    }

    /// `reserve` and `share` from `limits` and the two percentages.
    fn derive(&mut self, fit: Fit) -> Result<(), PercentError> {
        self.reserve = match self.reserve_percent {
            0 => Vec::new(),
            p => reserve_of(&self.limits, p, fit)?,
        };
        self.share = match self.share_percent {
            0 => Vec::new(),
            p => shares_of(&self.limits, p, fit)?,
        };
        Ok(())
    }
}

/// Why a percentage does not fit a rule's limits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PercentError {
    #[error("reserve: the rule has no limits to keep a share of")]
    NoLimitsToReserve,
    #[error(
        "reserve: {percent}% of limits[{limit}]'s burst of {burst} leaves no call for normal callers: a window keeps \
         back whole calls of its burst, so give it burst = {needed} or more"
    )]
    ReserveTakesBurst { percent: u32, limit: usize, burst: u64, needed: u64 },
    #[error("reserve: {percent}% of limits[{limit}]'s count of {count} leaves no call for normal callers")]
    ReserveTakesCount { percent: u32, limit: usize, count: u64 },
    #[error("max_share: the rule has no limits to share")]
    NoLimitsToShare,
    #[error("max_share: {percent}% of limits[{limit}]'s count of {count} is less than one call: no caller could call")]
    ShareBelowOne { percent: u32, limit: usize, count: u64 },
}

/// Per limit, what normal-priority calls may not use ([`Rule::reserve`]):
/// ⌈P % of a window's burst⌉ tokens as time, ⌈P % of a calendar count⌉
/// calls. `Clamp` keeps at least one call for normal callers.
fn reserve_of(limits: &[Limit], percent: u32, fit: Fit) -> Result<Vec<i64>, PercentError> {
    if limits.is_empty() {
        return Err(PercentError::NoLimitsToReserve);
    }
    let part = |n: u64| n.saturating_mul(u64::from(percent)).div_ceil(100);
    let mut reserve = Vec::with_capacity(limits.len());
    for (i, limit) in limits.iter().enumerate() {
        reserve.push(match *limit {
            Limit::Window(w) => {
                let mut kept = part(w.burst);
                if kept >= w.burst {
                    if fit == Fit::Refuse {
                        let needed = 100u64.div_ceil(100 - u64::from(percent)).max(2);
                        return Err(PercentError::ReserveTakesBurst { percent, limit: i, burst: w.burst, needed });
                    }
                    kept = w.burst - 1;
                }
                kept as i64 * w.interval_us
            }
            Limit::Calendar { count, .. } => {
                let mut kept = part(count);
                if kept >= count {
                    if fit == Fit::Refuse {
                        return Err(PercentError::ReserveTakesCount { percent, limit: i, count });
                    }
                    kept = count - 1;
                }
                kept as i64
            }
        });
    }
    Ok(reserve)
}

/// Per limit, one caller's sub-limits under `max_share = "P%"`
/// ([`Rule::share`]): P % of each count (rounded down) and of each burst
/// (rounded up, at least 1, at most the share's count). `Clamp` gives a
/// caller at least one call where P % of a count is less.
fn shares_of(limits: &[Limit], percent: u32, fit: Fit) -> Result<Vec<Limit>, PercentError> {
    if limits.is_empty() {
        return Err(PercentError::NoLimitsToShare);
    }
    let part = |n: u64| n.saturating_mul(u64::from(percent)) / 100;
    let mut share = Vec::with_capacity(limits.len());
    for (i, limit) in limits.iter().enumerate() {
        let whole = match *limit {
            Limit::Window(w) => w.count,
            Limit::Calendar { count, .. } => count,
        };
        let mut count = part(whole);
        if count == 0 {
            if fit == Fit::Refuse {
                return Err(PercentError::ShareBelowOne { percent, limit: i, count: whole });
            }
            count = 1;
        }
        share.push(match *limit {
            Limit::Window(w) => {
                let burst = w.burst.saturating_mul(u64::from(percent)).div_ceil(100).clamp(1, count);
                Limit::Window(WindowLimit::new(count, w.per_us, burst))
            }
            Limit::Calendar { period, .. } => Limit::Calendar { count, period },
        });
    }
    Ok(share)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::calendar::Period;

    fn day(count: u64) -> Limit {
        Limit::Calendar { count, period: Period::Day }
    }

    #[test]
    fn a_scaled_rule_derives_its_reserve_and_shares_from_the_scaled_counts() {
        let rule = Rule::new("r", vec![day(90)]).with_percents(40, 50).expect("fits");
        assert_eq!((rule.reserve.clone(), rule.share.clone()), (vec![36], vec![day(45)]));
        let third = rule.scaled(3);
        assert_eq!((third.limits, third.reserve, third.share), (vec![day(30)], vec![12], vec![day(15)]));
    }

    #[test]
    fn a_scaled_rule_keeps_one_call_for_each_side() {
        let rule = Rule::new("r", vec![day(10)]).with_percents(50, 20).expect("fits");
        let quarter = rule.scaled(10);
        assert_eq!((quarter.limits, quarter.reserve, quarter.share), (vec![day(1)], vec![0], vec![day(1)]));
        assert_eq!(
            Rule::new("r", vec![day(1)]).with_percents(50, 0),
            Err(PercentError::ReserveTakesCount { percent: 50, limit: 0, count: 1 })
        );
    }
}
