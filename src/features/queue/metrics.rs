//! Queued delivery's metrics (docs/metrics.md, "Queued delivery"): its own
//! families, registered when the queue is built, fed off the call path of
//! live calls (the intake, the dispatcher, callbacks, the gauges' loop).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::telemetry::metrics::RuleLabel;

type Histograms = Family<RuleLabel, Histogram, fn() -> Histogram>;

/// A queue's series (queued delivery): its rule and its caller's label
/// (the declared name or `other`), never an account, a job or a recipient.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabels {
    pub rule: String,
    pub caller: String,
}

/// A queue's jobs in one state (`queued`, `waiting`, `sending`), or its
/// jobs ended in one (`sent`, `failed`, `expired`, `cancelled`, `unknown`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueStateLabels {
    pub rule: String,
    pub caller: String,
    pub state: String,
}

/// A callback's post, by outcome (`delivered`, `retried`, `given_up`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueCallbackLabels {
    pub rule: String,
    pub caller: String,
    pub outcome: String,
}

/// A submission refused, by reason (`queue_full`, `bad_request`,
/// `unavailable`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueReasonLabels {
    pub rule: String,
    pub caller: String,
    pub reason: String,
}

/// Queued delivery's series, by rule and caller label (declared name or
/// `other`), registered by the queue when it is built ([`register`]). Nothing here is fed on a live call's path: submissions and
/// their refusals are counted at the intake of a queued call, ends where
/// the dispatcher writes them (and on a cancel), and the gauges are set
/// from the jobs store's summary every few seconds
/// (`crate::features::queue::gauges`).
#[derive(Clone)]
pub struct QueueMetrics {
    /// Unfinished jobs by state (`queued`, `waiting`, `sending`), as the
    /// jobs store last summed them (every instance sees the whole store).
    pub jobs: Family<QueueStateLabels, Gauge>,
    /// Age of the oldest unfinished job, in seconds (0: none).
    pub oldest: Family<QueueLabels, Gauge>,
    /// The default deadline of a queueing rule's jobs, in seconds.
    pub deadline: Family<RuleLabel, Gauge>,
    /// Jobs stored (answered 202) by this instance; a repeated
    /// `Idempotency-Key` is not a new job.
    pub submitted: Family<QueueLabels, Counter>,
    /// Submissions refused by this instance, by reason.
    pub refused: Family<QueueReasonLabels, Counter>,
    /// Jobs this instance ended, by end.
    pub ended: Family<QueueStateLabels, Counter>,
    /// Submission to WeChat's success, for jobs sent by this instance.
    pub delay: Histograms,
    /// Callbacks this instance posted or gave up, by outcome
    /// ([`super::callbacks`]).
    pub callbacks: Family<QueueCallbackLabels, Counter>,
    /// Queued sends under way on this instance (claimed, being decided,
    /// held for their slot, or at WeChat), by rule.
    pub in_flight: Family<RuleLabel, Gauge>,
    /// This instance's queued sends per second over the last gauge period,
    /// as a share of the rule's steady rate (its tightest window), by rule:
    /// summed over instances, how much of the rule the queues use.
    pub pace: Family<RuleLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// Jobs this instance sent, by rule (what [`QueueMetrics::pace`] is
    /// computed from).
    sent: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, u64>>>,
}

/// The ends a job can have (`wxgate_queue_ended_total`'s `state`).
pub const QUEUE_ENDS: [&str; 5] = ["sent", "failed", "expired", "cancelled", "unknown"];

/// The unfinished states a queue's jobs are counted in (`wxgate_queue_jobs`).
pub const QUEUE_STATES: [&str; 3] = ["queued", "waiting", "sending"];

impl QueueMetrics {
    fn labels(rule: &str, caller: &str) -> QueueLabels {
        QueueLabels { rule: rule.to_owned(), caller: caller.to_owned() }
    }

    fn state(rule: &str, caller: &str, state: &str) -> QueueStateLabels {
        QueueStateLabels { rule: rule.to_owned(), caller: caller.to_owned(), state: state.to_owned() }
    }

    /// Creates the series the alerts count of a queue at 0 (its `unknown`
    /// ends), so that its first `unknown` is an increase.
    pub fn seen(&self, rule: &str, caller: &str) {
        let _ = self.ended.get_or_create(&Self::state(rule, caller, "unknown"));
    }

    /// A job stored and answered 202.
    pub fn submitted(&self, rule: &str, caller: &str) {
        self.seen(rule, caller);
        self.submitted.get_or_create(&Self::labels(rule, caller)).inc();
    }

    /// A submission refused (`queue_full`, `bad_request`, `unavailable`).
    pub fn refused(&self, rule: &str, caller: &str, reason: &str) {
        let labels = QueueReasonLabels { rule: rule.to_owned(), caller: caller.to_owned(), reason: reason.to_owned() };
        self.refused.get_or_create(&labels).inc();
    }

    /// A job ended `state` (one of [`QUEUE_ENDS`]).
    pub fn ended(&self, rule: &str, caller: &str, state: &str) {
        self.seen(rule, caller);
        if state == "sent" {
            let mut sent = self.sent.lock().unwrap_or_else(|e| e.into_inner());
            match sent.get_mut(rule) {
                Some(n) => *n += 1,
                None => {
                    sent.insert(rule.to_owned(), 1);
                }
            }
        }
        self.ended.get_or_create(&Self::state(rule, caller, state)).inc_by(1);
    }

    /// `n` jobs ended `unknown` whose queue is not known here (`recover`:
    /// counted with `rule` and `caller` empty).
    pub fn recovered_unknown(&self, n: u64) {
        self.ended.get_or_create(&Self::state("", "", "unknown")).inc_by(n);
    }

    /// A callback `delivered` (2xx), `retried` (posted, not 2xx: tried
    /// again later) or `given_up` (`[queue] callback_for` passed, or its URL
    /// no longer allowed).
    pub fn callback(&self, rule: &str, caller: &str, outcome: &str) {
        let labels =
            QueueCallbackLabels { rule: rule.to_owned(), caller: caller.to_owned(), outcome: outcome.to_owned() };
        self.callbacks.get_or_create(&labels).inc();
    }

    /// A job sent `seconds` after it was submitted.
    pub fn delay(&self, rule: &str, seconds: f64) {
        self.delay.get_or_create(&RuleLabel { rule: rule.to_owned() }).observe(seconds);
    }

    /// Sets a queue's gauges: unfinished jobs by state, the oldest's age.
    pub fn set_queue(&self, rule: &str, caller: &str, counts: [u64; 3], oldest_seconds: i64) {
        self.seen(rule, caller);
        for (state, n) in QUEUE_STATES.iter().zip(counts) {
            self.jobs.get_or_create(&Self::state(rule, caller, state)).set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        self.oldest.get_or_create(&Self::labels(rule, caller)).set(oldest_seconds);
    }

    /// Removes a queue's gauges (it has no job left in the store).
    pub fn drop_queue(&self, rule: &str, caller: &str) {
        for state in QUEUE_STATES {
            self.jobs.remove(&Self::state(rule, caller, state));
        }
        self.oldest.remove(&Self::labels(rule, caller));
    }

    /// A send of `rule` starts (`true`) or ends under way on this instance.
    pub fn in_flight(&self, rule: &str, starts: bool) {
        let gauge = self.in_flight.get_or_create(&RuleLabel { rule: rule.to_owned() });
        if starts {
            gauge.inc();
        } else {
            gauge.dec();
        }
    }

    /// Jobs this instance sent so far, by rule.
    pub fn sent_by_rule(&self) -> std::collections::HashMap<String, u64> {
        self.sent.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Sets (`Some`) or removes a rule's pace ratio.
    pub fn set_pace(&self, rule: &str, ratio: Option<f64>) {
        let label = RuleLabel { rule: rule.to_owned() };
        match ratio {
            Some(r) => {
                self.pace.get_or_create(&label).set(r);
            }
            None => {
                self.pace.remove(&label);
            }
        }
    }

    /// Sets (`Some`) or removes a rule's default deadline.
    pub fn set_deadline(&self, rule: &str, seconds: Option<i64>) {
        let label = RuleLabel { rule: rule.to_owned() };
        match seconds {
            Some(s) => {
                self.deadline.get_or_create(&label).set(s);
            }
            None => {
                self.deadline.remove(&label);
            }
        }
    }
}

/// Queued delivery's series. None exists until a queue has a job (or a
/// refused submission), but, once queued delivery is on, the rules'
/// deadlines and the `unknown` ends of jobs recovered from a stopped
/// instance's lease (`rule` and `caller` empty: `recover` does not see
/// whose they were), which the alert counts from 0
/// ([`super::gauges`]).
pub fn register(registry: &mut Registry) -> QueueMetrics {
    let q = QueueMetrics {
        jobs: Family::default(),
        oldest: Family::default(),
        deadline: Family::default(),
        submitted: Family::default(),
        refused: Family::default(),
        ended: Family::default(),
        delay: Family::new_with_constructor(delay_buckets),
        callbacks: Family::default(),
        in_flight: Family::default(),
        pace: Family::default(),
        sent: Default::default(),
    };
    registry.register(
        "queue_jobs",
        "Queued delivery: unfinished jobs by rule, caller and state (queued, waiting, sending), from the jobs store's summary every 15 s; the whole store, so every instance shows the same",
        q.jobs.clone(),
    );
    registry.register(
        "queue_oldest_seconds",
        "Queued delivery: age of the oldest unfinished job by rule and caller (0: none), as of the last summary",
        q.oldest.clone(),
    );
    registry.register(
        "queue_deadline_seconds",
        "Queued delivery: the default deadline of a queueing rule's jobs (queue_deadline, or [queue] deadline)",
        q.deadline.clone(),
    );
    registry.register(
        "queue_submitted",
        "Queued delivery: jobs stored and answered 202 by this instance, by rule and caller",
        q.submitted.clone(),
    );
    registry.register(
        "queue_refused",
        "Queued delivery: submissions refused by this instance, by rule, caller and reason (queue_full, bad_request, unavailable)",
        q.refused.clone(),
    );
    registry.register(
        "queue_ended",
        "Queued delivery: jobs ended by this instance, by rule, caller and state (sent, failed, expired, cancelled, unknown: may have reached WeChat, never resent)",
        q.ended.clone(),
    );
    registry.register(
        "queue_delay_seconds",
        "Queued delivery: time from submission to WeChat's success, by rule",
        q.delay.clone(),
    );
    registry.register(
        "queue_callbacks",
        "Queued delivery: callbacks this instance posted or gave up, by rule, caller and outcome (delivered: 2xx; retried: not 2xx, tried again later; given_up: callback_for passed or the URL no longer allowed)",
        q.callbacks.clone(),
    );
    registry.register(
        "queue_in_flight",
        "Queued delivery: sends under way on this instance (claimed, being decided, held for their slot, or at WeChat), by rule",
        q.in_flight.clone(),
    );
    registry.register(
        "queue_pace_ratio",
        "Queued delivery: this instance's queued sends per second over the last 15 s as a share of the rule's steady rate (its tightest window), by rule; summed over instances: the share of the rule the queues use",
        q.pace.clone(),
    );
    q
}

/// Time from a queued job's submission to WeChat's success: 1 s (sent at
/// once) to a day (`[queue] deadline`'s default; a job waiting for the next
/// quota day falls in 3-24 h).
const DELAY_BUCKETS: [f64; 10] = [1.0, 10.0, 60.0, 300.0, 900.0, 3600.0, 10_800.0, 21_600.0, 43_200.0, 86_400.0];

fn delay_buckets() -> Histogram {
    Histogram::new(DELAY_BUCKETS)
}
