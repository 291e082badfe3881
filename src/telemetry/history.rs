//! The last hour of each rule's calls, for the console's plots
//! (`GET /v1/history`): every [`EVERY_US`] a task of the admin side
//! (`crate::ops::console`) reads the rules' call counters (the metrics'
//! own, so a call pays nothing more) and keeps what each rule did since the
//! previous reading. Bounded: [`KEEP`] readings of the config's rules (a
//! rule a reload removed leaves with its readings).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::telemetry::metrics::{Metrics, Outcome};
use crate::time::Micros;

/// How often the counters are read.
pub const EVERY_US: Micros = 10_000_000;
/// Readings kept: one hour's.
pub const KEEP: usize = 360;

/// One rule's calls in one interval: admitted (forwarded, held, degraded,
/// shadow, cached, queued) and refused (throttled, penalised, unavailable,
/// unauthorized, bad requests); WeChat's failures apart.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub admitted: u64,
    pub refused: u64,
    pub upstream_errors: u64,
}

impl Counts {
    fn of(outcomes: &[(Outcome, u64)]) -> Counts {
        let mut c = Counts::default();
        for &(outcome, n) in outcomes {
            let slot = match outcome {
                Outcome::throttled
                | Outcome::penalised
                | Outcome::unavailable
                | Outcome::unauthorized
                | Outcome::rejected_bad_request => &mut c.refused,
                Outcome::upstream_error => &mut c.upstream_errors,
                _ => &mut c.admitted,
            };
            *slot += n;
        }
        c
    }

    fn since(self, before: Counts) -> Counts {
        Counts {
            admitted: self.admitted.saturating_sub(before.admitted),
            refused: self.refused.saturating_sub(before.refused),
            upstream_errors: self.upstream_errors.saturating_sub(before.upstream_errors),
        }
    }
}

/// One reading: the interval's end and each rule's calls in it.
#[derive(Debug, Clone)]
pub struct Reading {
    pub at_us: Micros,
    pub span_us: Micros,
    pub rules: Vec<(Arc<str>, Counts)>,
}

#[derive(Default)]
struct Inner {
    /// Each rule's totals at the last reading.
    last: Vec<(Arc<str>, Counts)>,
    last_at: Option<Micros>,
    readings: VecDeque<Reading>,
}

/// The readings (see the module).
#[derive(Default)]
pub struct History {
    inner: Mutex<Inner>,
}

impl History {
    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads the counters of `rules` at `now` and keeps what each did since
    /// the last reading (the first reading only sets the start).
    pub fn read(&self, metrics: &Metrics, rules: &[Arc<str>], now: Micros) {
        let totals: Vec<(Arc<str>, Counts)> =
            rules.iter().map(|r| (r.clone(), Counts::of(&metrics.rule(r).outcomes()))).collect();
        let mut inner = self.inner();
        if let Some(last_at) = inner.last_at {
            let rules = totals
                .iter()
                .map(|(rule, now)| {
                    let before = inner.last.iter().find(|(r, _)| r == rule).map_or(Counts::default(), |(_, c)| *c);
                    (rule.clone(), now.since(before))
                })
                .collect();
            if inner.readings.len() == KEEP {
                inner.readings.pop_front();
            }
            inner.readings.push_back(Reading { at_us: now, span_us: (now - last_at).max(1), rules });
        }
        inner.last = totals;
        inner.last_at = Some(now);
    }

    /// The readings kept, oldest first.
    pub fn readings(&self) -> Vec<Reading> {
        self.inner().readings.iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_an_hour_of_differences_per_rule() {
        let metrics = Metrics::new();
        let history = History::default();
        let rules: Vec<Arc<str>> = vec!["send".into(), "menu".into()];
        history.read(&metrics, &rules, 0);
        assert!(history.readings().is_empty(), "the first reading only starts");
        for _ in 0..3 {
            metrics.rule("send").call(Outcome::forwarded);
        }
        metrics.rule("send").call(Outcome::throttled);
        metrics.rule("menu").call(Outcome::upstream_error);
        history.read(&metrics, &rules, EVERY_US);
        let r = &history.readings()[0];
        assert_eq!(r.span_us, EVERY_US);
        assert_eq!(r.rules[0], ("send".into(), Counts { admitted: 3, refused: 1, upstream_errors: 0 }));
        assert_eq!(r.rules[1], ("menu".into(), Counts { admitted: 0, refused: 0, upstream_errors: 1 }));
        for i in 2..(KEEP as i64 + 10) {
            metrics.rule("send").call(Outcome::held);
            history.read(&metrics, &rules, i * EVERY_US);
        }
        let all = history.readings();
        assert_eq!(all.len(), KEEP, "bounded");
        assert_eq!(all[KEEP - 1].rules[0].1, Counts { admitted: 1, refused: 0, upstream_errors: 0 });
        assert_eq!(all[0].at_us, 10 * EVERY_US, "the oldest dropped first");
    }
}
