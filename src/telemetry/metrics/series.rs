//! The series a subsystem keeps and feeds itself: clones of the app's
//! metrics, fetched once so that the hot path touches no label sets.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::exemplar::HistogramWithExemplars;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use std::sync::OnceLock;

use super::labels::{
    ErrcodeLabels, FailoverLabels, FileOp, OpLabel, Outcome, OutcomeLabels, ResultLabel, RuleLabel, TriedLabels,
    UpstreamLabel, OUTCOMES,
};

/// The token cache's series (`crate::features::token_cache`, `crate::ops::quota_sync`):
/// clones of the app's metrics.
#[derive(Clone, Default)]
pub struct TokenMetrics {
    /// Token requests answered from the cache (at once or after waiting
    /// for another request's fetch, whose refusal they get if WeChat refused it).
    pub from_cache: Counter,
    /// Token requests that went to WeChat as their slot's one fetch: a
    /// caller's, or wxgate's own for an `[[account]]` (renewals included).
    pub fetched: Counter,
    /// Token requests that went to WeChat without the cache (not
    /// cacheable, or the store could not answer).
    pub passed: Counter,
    /// Token requests that waited `[tokens] wait` for another's fetch (503).
    pub timed_out: Counter,
    /// Cached tokens dropped because WeChat rejected them (40001, 40014, 42001).
    pub invalidations: Counter,
    /// quota/get calls of quota_sync, by result.
    pub syncs: Family<ResultLabel, Counter>,
    /// Calls wxgate added an `[[account]]`'s token to.
    pub injected: Counter,
    /// Injected calls sent once more with a new token after WeChat
    /// rejected the first (40001, 40014, 42001).
    pub resent: Counter,
    /// Tokens of `[[account]]`s renewed ahead of expiry, by result.
    pub renewals: Family<ResultLabel, Counter>,
}

impl TokenMetrics {
    pub fn sync(&self, result: &str) {
        self.syncs.get_or_create(&ResultLabel { result: result.to_owned() }).inc();
    }

    pub fn renewal(&self, result: &str) {
        self.renewals.get_or_create(&ResultLabel { result: result.to_owned() }).inc();
    }
}

/// The embedded store's series (`crate::store::memory`): clones of the
/// app's metrics, fed by the store.
#[derive(Clone, Default)]
pub struct MemoryStoreMetrics {
    /// (account, rule) states held.
    pub entries: Gauge,
    /// New (account, rule) pairs refused for want of room (`max_entries`),
    /// and calls that would add recipients past `max_recipients`.
    pub full: Counter,
    /// Recipients' states held (`per_recipient`), all pairs together.
    pub recipients: Gauge,
    /// State file reads and writes that failed.
    pub file_errors: Family<OpLabel, Counter>,
    /// State file writes that succeeded.
    pub saves: Counter,
    /// When the state file was last written, in Unix seconds (0: never).
    pub last_save: Gauge,
}

impl MemoryStoreMetrics {
    pub fn file_error(&self, op: FileOp) {
        self.file_errors.get_or_create(&OpLabel { op }).inc();
    }

    pub fn file_errors(&self, op: FileOp) -> u64 {
        self.file_errors.get_or_create(&OpLabel { op }).get()
    }
}

/// The upstreams' series (`crate::transport::upstream`), labelled by the configured
/// upstreams' `host[:port]` only: clones of the app's metrics, fed by the
/// upstream client.
#[derive(Clone, Default)]
pub struct UpstreamMetrics {
    /// Tries of calls at each upstream, by what became of them.
    pub requests: Family<TriedLabels, Counter>,
    /// Calls that moved on from one upstream to the next, never sent to the first.
    pub failovers: Family<FailoverLabels, Counter>,
    /// 1 while an upstream takes calls, 0 while it is skipped after a failure.
    pub up: Family<UpstreamLabel, Gauge>,
}

/// Errcodes that get their own series (once seen); all others are `other`.
pub(super) const KNOWN_ERRCODES: [i64; 12] =
    [-1, 0, 40001, 40014, 42001, 45009, 45011, 45015, 45033, 45047, 48001, 48006];

/// The errcodes the shipped alerts count (`deploy/prometheus/wxgate-alerts.yml`):
/// their series exist at 0 for every rule from the start, so that the first
/// one is an increase. Every other errcode's series appears when WeChat
/// first answers it.
pub(super) const ALERTED_ERRCODES: [i64; 3] = [45009, 45011, 45033];

/// The outcomes whose series exist at 0 for every rule from the start: those
/// the alerts and the dashboard's refusal panels count. The others (`held`,
/// `degraded`, `shadow_throttled`, `rejected_bad_request`, `cached`)
/// appear with a rule's first call of that outcome.
pub(super) const EAGER_OUTCOMES: [Outcome; 6] = [
    Outcome::forwarded,
    Outcome::throttled,
    Outcome::penalised,
    Outcome::unavailable,
    Outcome::upstream_error,
    Outcome::unauthorized,
];

/// A call latency histogram; with tracing on, with the trace id of a
/// traced call as the exemplar of the bucket it fell in (OpenMetrics).
/// Without tracing a plain histogram: its exemplars' lock is not paid for.
#[derive(Debug, Clone)]
pub enum Latency {
    Plain(Histogram),
    Exemplars(HistogramWithExemplars<TraceLabel>),
}

impl Latency {
    pub fn observe(&self, seconds: f64, trace: Option<String>) {
        match self {
            Latency::Plain(h) => h.observe(seconds),
            Latency::Exemplars(h) => h.observe(seconds, trace.map(|trace_id| TraceLabel { trace_id }), None),
        }
    }
}

impl prometheus_client::metrics::TypedMetric for Latency {
    const TYPE: prometheus_client::metrics::MetricType = prometheus_client::metrics::MetricType::Histogram;
}

impl prometheus_client::encoding::EncodeMetric for Latency {
    fn encode(&self, encoder: prometheus_client::encoding::MetricEncoder) -> Result<(), std::fmt::Error> {
        match self {
            Latency::Plain(h) => h.encode(encoder),
            Latency::Exemplars(h) => h.encode(encoder),
        }
    }

    fn metric_type(&self) -> prometheus_client::metrics::MetricType {
        prometheus_client::metrics::MetricType::Histogram
    }
}

/// [`Latency`] histograms by rule.
pub(super) type Latencies = Family<RuleLabel, Latency, fn() -> Latency>;

/// An exemplar's label: the trace of the call it came from.
#[derive(Debug, Clone, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct TraceLabel {
    pub trace_id: String,
}

/// The families of the per-rule series (handles: a clone shares the
/// series), which a [`RuleMetrics`] creates its series in.
#[derive(Clone)]
pub(super) struct RuleFamilies {
    pub(super) calls: Family<OutcomeLabels, Counter>,
    pub(super) errcodes: Family<ErrcodeLabels, Counter>,
    pub(super) decision: Latencies,
    pub(super) upstream: Latencies,
    pub(super) hold: Latencies,
    pub(super) in_flight: Family<RuleLabel, Gauge>,
    pub(super) refunds: Family<RuleLabel, Counter>,
    pub(super) recipients: Family<RuleLabel, Counter>,
    pub(super) recipient_refusals: Family<RuleLabel, Counter>,
}

/// One rule's series, fetched once and kept: the hot path then touches no
/// label sets and allocates nothing for metrics. A series the alerts count
/// exists from the start ([`EAGER_OUTCOMES`], [`ALERTED_ERRCODES`]); every
/// other one is created in its family on its first use (one label-set
/// lookup per series in the process's life), then kept in its cell: a call
/// pays one atomic load per series it feeds, no lock, no hash. So a rule
/// without calls costs 9 lines of `/metrics`, and its histograms appear
/// only once it has calls (docs/metrics.md, "How many series").
pub struct RuleMetrics {
    name: String,
    families: RuleFamilies,
    calls: [OnceLock<Counter>; OUTCOMES.len()],
    errcodes: [OnceLock<Counter>; KNOWN_ERRCODES.len()],
    other_errcode: OnceLock<Counter>,
    decision: OnceLock<Latency>,
    upstream: OnceLock<Latency>,
    hold: OnceLock<Latency>,
    in_flight: OnceLock<Gauge>,
    refunds: OnceLock<Counter>,
    recipients: OnceLock<Counter>,
    recipient_refusals: OnceLock<Counter>,
}

impl RuleMetrics {
    /// The series of rule `name`, those the alerts count created at 0.
    pub(super) fn new(name: &str, families: RuleFamilies) -> RuleMetrics {
        let m = RuleMetrics {
            name: name.to_owned(),
            families,
            calls: Default::default(),
            errcodes: Default::default(),
            other_errcode: OnceLock::new(),
            decision: OnceLock::new(),
            upstream: OnceLock::new(),
            hold: OnceLock::new(),
            in_flight: OnceLock::new(),
            refunds: OnceLock::new(),
            recipients: OnceLock::new(),
            recipient_refusals: OnceLock::new(),
        };
        for outcome in EAGER_OUTCOMES {
            let _ = m.outcome(outcome);
        }
        for code in ALERTED_ERRCODES {
            let _ = m.code(code);
        }
        m
    }

    fn rule(&self) -> RuleLabel {
        RuleLabel { rule: self.name.clone() }
    }

    fn outcome(&self, outcome: Outcome) -> Option<&Counter> {
        let i = OUTCOMES.iter().position(|o| *o == outcome)?;
        let cell = self.calls.get(i)?;
        Some(cell.get_or_init(|| {
            self.families.calls.get_or_create_owned(&OutcomeLabels { rule: self.name.clone(), outcome })
        }))
    }

    fn code(&self, code: i64) -> &Counter {
        let known = KNOWN_ERRCODES.iter().position(|c| *c == code).and_then(|i| self.errcodes.get(i));
        known.unwrap_or(&self.other_errcode).get_or_init(|| {
            let errcode = if known.is_some() { code.to_string() } else { "other".to_owned() };
            self.families.errcodes.get_or_create_owned(&ErrcodeLabels { rule: self.name.clone(), errcode })
        })
    }

    pub fn call(&self, outcome: Outcome) {
        if let Some(c) = self.outcome(outcome) {
            c.inc();
        }
    }

    /// The rule's calls so far, by outcome (those never counted left out).
    pub fn outcomes(&self) -> Vec<(Outcome, u64)> {
        OUTCOMES.iter().zip(&self.calls).filter_map(|(&o, cell)| Some((o, cell.get()?.get()))).collect()
    }

    pub fn errcode(&self, code: i64) {
        self.code(code).inc();
    }

    /// Time to decide, in seconds (`trace`: a traced call's trace id, the exemplar).
    pub fn observe_decision(&self, seconds: f64, trace: Option<String>) {
        let h = self.decision.get_or_init(|| self.families.decision.get_or_create_owned(&self.rule()));
        h.observe(seconds, trace);
    }

    /// Time to WeChat's answer's head, in seconds.
    pub fn observe_upstream(&self, seconds: f64, trace: Option<String>) {
        let h = self.upstream.get_or_init(|| self.families.upstream.get_or_create_owned(&self.rule()));
        h.observe(seconds, trace);
    }

    /// How long a held call waited for its slot, in seconds.
    pub fn observe_hold(&self, seconds: f64, trace: Option<String>) {
        let h = self.hold.get_or_init(|| self.families.hold.get_or_create_owned(&self.rule()));
        h.observe(seconds, trace);
    }

    /// The rule's calls at WeChat now (for an [`super::InFlightGuard`]).
    pub fn in_flight(&self) -> Gauge {
        self.in_flight.get_or_init(|| self.families.in_flight.get_or_create_owned(&self.rule())).clone()
    }

    /// A call that never reached WeChat gave back what it took.
    pub fn refunded(&self) {
        self.refunds.get_or_init(|| self.families.refunds.get_or_create_owned(&self.rule())).inc();
    }

    /// `cost = "recipients"`: the recipients of an admitted call (person-times).
    pub fn recipients(&self, n: u64) {
        self.recipients.get_or_init(|| self.families.recipients.get_or_create_owned(&self.rule())).inc_by(n);
    }

    /// A call refused because a recipient was over its `per_recipient` limits.
    pub fn recipient_refused(&self) {
        self.recipient_refusals
            .get_or_init(|| self.families.recipient_refusals.get_or_create_owned(&self.rule()))
            .inc();
    }
}

/// One caller's series (a declared caller, or `other`), fetched when the
/// callers are built (start, reload): a call then costs one increment.
#[derive(Clone)]
pub struct CallerMetrics {
    pub(super) calls: Vec<Counter>,
    /// Calls its flood guard refused (`[[caller]] rate`).
    pub rate_refusals: Counter,
    /// `caller_auth = "required"`: calls that proved no caller (on `other`'s
    /// series) and calls for an account it is not granted.
    pub unauthenticated: Counter,
    pub forbidden: Counter,
}

impl CallerMetrics {
    pub fn call(&self, outcome: Outcome) {
        if let Some(c) = OUTCOMES.iter().position(|o| *o == outcome).and_then(|i| self.calls.get(i)) {
            c.inc();
        }
    }

    /// The caller's calls so far, by outcome (those at 0 left out).
    pub fn outcomes(&self) -> Vec<(Outcome, u64)> {
        OUTCOMES.iter().zip(&self.calls).map(|(&o, c)| (o, c.get())).filter(|(_, n)| *n > 0).collect()
    }
}
