//! Prometheus metrics (via `prometheus-client`), labelled by rule (and the
//! caller series by declared caller, `other` for the rest): never by account,
//! token or a header's free value, so cardinality is bounded by the config.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

/// What became of one call. Every call counts exactly once.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Outcome {
    /// Sent to WeChat at once.
    forwarded,
    /// Sent to WeChat after being held for its reserved slot.
    held,
    /// Sent to WeChat on a decision made without Redis (fallback).
    degraded,
    /// Refused by a limit or the concurrency cap (429).
    throttled,
    /// Refused by a penalty, or WeChat answered a penalised errcode (429).
    penalised,
    /// Shadow mode: would have been refused, was forwarded.
    shadow_throttled,
    /// Malformed or refused request, or a request body the client
    /// malformed, cut short or stopped sending (400, 408, 413).
    rejected_bad_request,
    /// No decision could be made (503, `fallback = "deny"`).
    unavailable,
    /// WeChat unreachable, failed or too slow (502, 504).
    upstream_error,
    /// A token request answered from wxgate's token cache (never sent).
    cached,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::forwarded => "forwarded",
            Outcome::held => "held",
            Outcome::degraded => "degraded",
            Outcome::throttled => "throttled",
            Outcome::penalised => "penalised",
            Outcome::shadow_throttled => "shadow_throttled",
            Outcome::rejected_bad_request => "rejected_bad_request",
            Outcome::unavailable => "unavailable",
            Outcome::upstream_error => "upstream_error",
            Outcome::cached => "cached",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuleLabel {
    pub rule: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallerLabel {
    pub caller: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallerOutcomeLabels {
    pub caller: String,
    pub outcome: Outcome,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub rule: String,
    pub outcome: Outcome,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrcodeLabels {
    pub rule: String,
    pub errcode: String,
}

/// The token cache's series (`crate::token_cache`, `crate::quota_sync`):
/// clones of the app's metrics.
#[derive(Clone, Default)]
pub struct TokenMetrics {
    /// Token requests answered from the cache (at once or after waiting
    /// for another request's fetch, whose refusal they get if WeChat refused it).
    pub from_cache: Counter,
    /// Token requests that went to WeChat as their slot's one fetch.
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
}

impl TokenMetrics {
    pub fn sync(&self, result: &str) {
        self.syncs.get_or_create(&ResultLabel { result: result.to_owned() }).inc();
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabel {
    pub source: String,
}

/// An `[intercept] hosts` entry.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HostLabel {
    pub host: String,
}

/// What became of a `CONNECT` with `[intercept]` on.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Tunnel {
    /// TLS completed with the client: its calls are served.
    opened,
    /// Not a listed host on port 443: answered 400, nothing forwarded.
    refused,
    /// The TLS handshake failed (a client that does not trust the CA,
    /// bytes that are not TLS, an SNI that is not the CONNECT's host).
    handshake_failed,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TunnelLabels {
    pub result: Tunnel,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: String,
}

/// What the state file was being used for.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum FileOp {
    load,
    save,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabel {
    pub op: FileOp,
}

/// The embedded store's series (`crate::store::memory`): clones of the
/// app's metrics, fed by the store.
#[derive(Clone, Default)]
pub struct MemoryStoreMetrics {
    /// (account, rule) states held.
    pub entries: Gauge,
    /// New (account, rule) pairs refused for want of room (`max_entries`).
    pub full: Counter,
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

/// What became of one try of a call at one upstream.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Tried {
    /// Its answer's head came.
    answered,
    /// Provably never reached it (no connection, TLS failed, handed back
    /// unwritten): the call went on to the next upstream, or got 502/504.
    not_sent,
    /// Sent (or partly), then no answer: a timeout, a reset, a broken answer.
    failed,
    /// The client's request body failed on the way (400, 408, 413).
    client_error,
}

impl Tried {
    pub const ALL: [Tried; 4] = [Tried::answered, Tried::not_sent, Tried::failed, Tried::client_error];
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UpstreamLabel {
    pub upstream: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TriedLabels {
    pub upstream: String,
    pub result: Tried,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailoverLabels {
    pub from: String,
    pub to: String,
}

/// The upstreams' series (`crate::upstream`), labelled by the configured
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

/// Errcodes that get their own series; all others are `other`.
const KNOWN_ERRCODES: [i64; 12] = [-1, 0, 40001, 40014, 42001, 45009, 45011, 45015, 45033, 45047, 48001, 48006];

/// Label for a call no rule matched.
pub const NO_RULE: &str = "_none";

/// One rule's series, fetched once and kept: the hot path then touches no
/// label sets and allocates nothing for metrics.
pub struct RuleMetrics {
    calls: Vec<Counter>,
    errcodes: Vec<Counter>,
    other_errcode: Counter,
    pub decision: Histogram,
    pub upstream: Histogram,
    pub hold: Histogram,
    pub in_flight: Gauge,
    /// Calls that never reached WeChat and gave back what they took.
    pub refunds: Counter,
}

const OUTCOMES: [Outcome; 10] = [
    Outcome::forwarded,
    Outcome::held,
    Outcome::degraded,
    Outcome::throttled,
    Outcome::penalised,
    Outcome::shadow_throttled,
    Outcome::rejected_bad_request,
    Outcome::unavailable,
    Outcome::upstream_error,
    Outcome::cached,
];

impl RuleMetrics {
    pub fn call(&self, outcome: Outcome) {
        if let Some(c) = OUTCOMES.iter().position(|o| *o == outcome).and_then(|i| self.calls.get(i)) {
            c.inc();
        }
    }

    pub fn errcode(&self, code: i64) {
        match KNOWN_ERRCODES.iter().position(|c| *c == code).and_then(|i| self.errcodes.get(i)) {
            Some(c) => c.inc(),
            None => self.other_errcode.inc(),
        };
    }
}

/// One caller's series (a declared caller, or `other`), fetched when the
/// callers are built (start, reload): a call then costs one increment.
#[derive(Clone)]
pub struct CallerMetrics {
    calls: Vec<Counter>,
    /// Calls its flood guard refused (`[[caller]] rate`).
    pub rate_refusals: Counter,
}

impl CallerMetrics {
    pub fn call(&self, outcome: Outcome) {
        if let Some(c) = OUTCOMES.iter().position(|o| *o == outcome).and_then(|i| self.calls.get(i)) {
            c.inc();
        }
    }
}

pub struct Metrics {
    pub registry: Registry,
    rules: std::sync::RwLock<hashbrown::HashMap<std::sync::Arc<str>, std::sync::Arc<RuleMetrics>>>,
    pub calls: Family<OutcomeLabels, Counter>,
    pub upstream_errcodes: Family<ErrcodeLabels, Counter>,
    pub upstream_seconds: Histograms,
    pub decision_seconds: Histograms,
    pub hold_seconds: Histograms,
    pub in_flight: Family<RuleLabel, Gauge>,
    pub held_now: Gauge,
    pub store_errors: Counter,
    pub degraded_decisions: Counter,
    pub store_lost: Counter,
    pub store_reconciled: Counter,
    pub breaker_open: Gauge,
    pub breaker_opened: Counter,
    pub reloads: Family<ResultLabel, Counter>,
    pub refunds: Family<RuleLabel, Counter>,
    /// Calls that named no account and carried an access token wxgate did
    /// not know: counted against `default`.
    pub unknown_token_calls: Counter,
    /// Access tokens learned from their token answers (and stored).
    pub tokens_learned: Counter,
    /// Accounts whose day counts and penalties were reset: a `clear_quota`
    /// WeChat accepted, or `POST /v1/accounts/{account}/clear`.
    pub quota_clears: Counter,
    pub memory_store: MemoryStoreMetrics,
    pub upstreams: UpstreamMetrics,
    /// The token cache and quota_sync.
    pub tokens: TokenMetrics,
    /// Calls by caller (declared name or `other`) and outcome.
    pub caller_calls: Family<CallerOutcomeLabels, Counter>,
    /// Calls refused by their caller's flood guard, by caller.
    pub caller_rate_refusals: Family<CallerLabel, Counter>,
    /// `[intercept]`: calls served inside CONNECT tunnels, by host.
    pub intercepted_calls: Family<HostLabel, Counter>,
    /// `[intercept]`: CONNECT requests by what became of them.
    pub intercept_tunnels: Family<TunnelLabels, Counter>,
}

type Histograms = Family<RuleLabel, Histogram, fn() -> Histogram>;

/// 5 ms to ~10 s.
fn upstream_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 12))
}

/// 50 µs to ~0.4 s.
fn decision_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.000_05, 2.0, 14))
}

/// 10 ms to ~20 s.
fn hold_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.01, 2.0, 12))
}

impl Metrics {
    pub fn new() -> Metrics {
        let calls = Family::<OutcomeLabels, Counter>::default();
        let upstream_errcodes = Family::<ErrcodeLabels, Counter>::default();
        let upstream_seconds: Histograms = Family::new_with_constructor(upstream_buckets);
        let decision_seconds: Histograms = Family::new_with_constructor(decision_buckets);
        let hold_seconds: Histograms = Family::new_with_constructor(hold_buckets);
        let in_flight = Family::<RuleLabel, Gauge>::default();
        let held_now = Gauge::default();
        let store_errors = Counter::default();
        let degraded_decisions = Counter::default();
        let store_lost = Counter::default();
        let store_reconciled = Counter::default();
        let breaker_open = Gauge::default();
        let breaker_opened = Counter::default();
        let reloads = Family::<ResultLabel, Counter>::default();
        let refunds = Family::<RuleLabel, Counter>::default();
        let unknown_token_calls = Counter::default();
        let tokens_learned = Counter::default();
        let quota_clears = Counter::default();
        let memory_store = MemoryStoreMetrics::default();
        let upstreams = UpstreamMetrics::default();
        let caller_calls = Family::<CallerOutcomeLabels, Counter>::default();
        let caller_rate_refusals = Family::<CallerLabel, Counter>::default();
        let intercepted_calls = Family::<HostLabel, Counter>::default();
        let intercept_tunnels = Family::<TunnelLabels, Counter>::default();
        // Both series from the start, so that 0 is visible (and alertable).
        let _ = memory_store.file_errors.get_or_create(&OpLabel { op: FileOp::load });
        let _ = memory_store.file_errors.get_or_create(&OpLabel { op: FileOp::save });

        let mut registry = Registry::with_prefix("wxgate");
        registry.register("calls", "Calls by rule and outcome; each call counts once", calls.clone());
        registry.register(
            "upstream_errcodes",
            "WeChat answers by rule and errcode (0 = success; 45009 and 45033 are the ones to alert on)",
            upstream_errcodes.clone(),
        );
        registry.register("upstream_seconds", "Time to WeChat's response head", upstream_seconds.clone());
        registry.register("decision_seconds", "Time to decide (store round trip included)", decision_seconds.clone());
        registry.register("hold_seconds", "Time calls were held for their reserved slot", hold_seconds.clone());
        registry.register("in_flight", "Calls at WeChat now, from this instance", in_flight.clone());
        registry.register("held", "Calls held for shaping now, on this instance", held_now.clone());
        registry.register("store_errors", "Redis calls that failed or timed out", store_errors.clone());
        registry.register(
            "degraded_decisions",
            "Decisions made without Redis (by [store] fallback)",
            degraded_decisions.clone(),
        );
        registry.register(
            "store_lost",
            "Times Redis was found without wxgate's data (its epoch changed) and re-seeded by this instance",
            store_lost.clone(),
        );
        registry.register(
            "store_reconciled_calls",
            "Calls added to Redis's counts after the fact: admitted by the fallback, or re-seeded after a loss",
            store_reconciled.clone(),
        );
        registry.register("breaker_open", "1 while the Redis circuit breaker is open", breaker_open.clone());
        registry.register(
            "store_breaker_opened",
            "Times the Redis circuit breaker opened (decisions went to the fallback until a probe write succeeded)",
            breaker_opened.clone(),
        );
        registry.register("config_reloads", "Config reloads by result (ok, failed)", reloads.clone());
        registry.register(
            "refunds",
            "Calls that provably never reached WeChat (no connection) and gave back what they took from their rule's limits",
            refunds.clone(),
        );
        registry.register(
            "unknown_token_calls",
            "Calls with an access token wxgate did not learn and neither X-Wx-Account nor an @ prefix: counted against default",
            unknown_token_calls.clone(),
        );
        registry.register(
            "tokens_learned",
            "Access tokens learned from token answers that passed through (calls carrying one count against its appid)",
            tokens_learned.clone(),
        );
        registry.register(
            "quota_clears",
            "Accounts whose day counts and penalties wxgate reset: clear_quota calls WeChat accepted, and clears by hand",
            quota_clears.clone(),
        );
        let m = &memory_store;
        registry.register(
            "store_entries",
            "States held by the embedded store, one per X-Wx-Account and rule",
            m.entries.clone(),
        );
        registry.register(
            "store_full",
            "Calls of a new X-Wx-Account and rule pair refused with 503: the embedded store held [store] max_entries",
            m.full.clone(),
        );
        registry.register(
            "state_file_errors",
            "State file loads and saves that failed (load: quotas restarted from zero)",
            m.file_errors.clone(),
        );
        registry.register("state_file_saves", "State file writes that succeeded", m.saves.clone());
        registry.register(
            "state_file_last_save_seconds",
            "Unix time of the last successful state file write (0: none yet)",
            m.last_save.clone(),
        );
        registry.register(
            "upstream_requests",
            "Tries of calls at each upstream by result: answered, not_sent (never reached it: the call moved on to the next upstream, or got 502/504), failed (sent, then no answer), client_error",
            upstreams.requests.clone(),
        );
        registry.register(
            "upstream_failovers",
            "Calls that never reached one upstream (no connection, TLS failed) and were tried at the next",
            upstreams.failovers.clone(),
        );
        registry.register(
            "upstream_up",
            "1 while an upstream takes calls; 0 while it is skipped after a failure (until a call after its back-off finds it answering)",
            upstreams.up.clone(),
        );
        registry.register(
            "caller_calls",
            "Calls by caller (X-Wx-Caller or [server] caller: a declared [[caller]], or other) and outcome; each call counts once",
            caller_calls.clone(),
        );
        registry.register(
            "caller_rate_refusals",
            "Calls refused (429, reason caller_rate) by their caller's flood guard ([[caller]] rate, per instance), before any store work",
            caller_rate_refusals.clone(),
        );
        let tokens = TokenMetrics::default();
        let token_requests = Family::<SourceLabel, Counter>::default();
        let source = |s: &str| token_requests.get_or_create(&SourceLabel { source: s.to_owned() }).clone();
        let tokens = TokenMetrics {
            from_cache: source("cache"),
            fetched: source("fetched"),
            passed: source("passed"),
            timed_out: source("timeout"),
            ..tokens
        };
        registry.register(
            "token_requests",
            "Token requests by source: cache (answered by wxgate's token cache), fetched (the one request sent to WeChat for its appid and secret), passed (sent without the cache), timeout (waited [tokens] wait for another's fetch: 503)",
            token_requests,
        );
        registry.register(
            "token_invalidations",
            "Cached access tokens dropped because WeChat rejected them (40001, 40014, 42001): the next token request fetches once",
            tokens.invalidations.clone(),
        );
        // Every result from the start, so that 0 is visible.
        for result in ["raised", "unchanged", "error", "skipped"] {
            let _ = tokens.syncs.get_or_create(&ResultLabel { result: result.to_owned() });
        }
        registry.register(
            "quota_syncs",
            "quota/get calls made by quota_sync, by result (raised, unchanged, error, skipped: another instance synced)",
            tokens.syncs.clone(),
        );
        registry.register(
            "intercepted_calls",
            "[intercept]: calls served inside CONNECT tunnels, by host (also counted in wxgate_calls with their rule)",
            intercepted_calls.clone(),
        );
        registry.register(
            "intercept_tunnels",
            "[intercept]: CONNECT requests by result: opened, refused (not a listed host on port 443), handshake_failed (the client does not trust the CA, or sent no TLS)",
            intercept_tunnels.clone(),
        );
        let info = Info::new(vec![("version".to_string(), env!("CARGO_PKG_VERSION").to_string())]);
        registry.register("build", "wxgate build", info);
        Metrics {
            registry,
            rules: Default::default(),
            calls,
            upstream_errcodes,
            upstream_seconds,
            decision_seconds,
            hold_seconds,
            in_flight,
            held_now,
            store_errors,
            degraded_decisions,
            store_lost,
            store_reconciled,
            breaker_open,
            breaker_opened,
            reloads,
            refunds,
            unknown_token_calls,
            tokens_learned,
            quota_clears,
            memory_store,
            upstreams,
            tokens,
            caller_calls,
            caller_rate_refusals,
            intercepted_calls,
            intercept_tunnels,
        }
    }

    /// The series of the caller labelled `label` (a declared name, or
    /// `other`): created on first use, the same counters after.
    pub fn caller(&self, label: &str) -> CallerMetrics {
        CallerMetrics {
            calls: OUTCOMES
                .iter()
                .map(|&outcome| {
                    self.caller_calls.get_or_create(&CallerOutcomeLabels { caller: label.to_owned(), outcome }).clone()
                })
                .collect(),
            rate_refusals: self.caller_rate_refusals.get_or_create(&CallerLabel { caller: label.to_owned() }).clone(),
        }
    }

    /// The series of one rule (created on first use, then shared).
    pub fn rule(&self, name: &str) -> std::sync::Arc<RuleMetrics> {
        if let Some(m) = self.rules.read().unwrap_or_else(|e| e.into_inner()).get(name) {
            return m.clone();
        }
        let rule = || RuleLabel { rule: name.to_owned() };
        let m = std::sync::Arc::new(RuleMetrics {
            calls: OUTCOMES
                .iter()
                .map(|&outcome| self.calls.get_or_create(&OutcomeLabels { rule: name.to_owned(), outcome }).clone())
                .collect(),
            errcodes: KNOWN_ERRCODES
                .iter()
                .map(|c| {
                    let labels = ErrcodeLabels { rule: name.to_owned(), errcode: c.to_string() };
                    self.upstream_errcodes.get_or_create(&labels).clone()
                })
                .collect(),
            other_errcode: self
                .upstream_errcodes
                .get_or_create(&ErrcodeLabels { rule: name.to_owned(), errcode: "other".into() })
                .clone(),
            decision: self.decision_seconds.get_or_create(&rule()).clone(),
            upstream: self.upstream_seconds.get_or_create(&rule()).clone(),
            hold: self.hold_seconds.get_or_create(&rule()).clone(),
            in_flight: self.in_flight.get_or_create(&rule()).clone(),
            refunds: self.refunds.get_or_create(&rule()).clone(),
        });
        self.rules.write().unwrap_or_else(|e| e.into_inner()).entry(name.into()).or_insert(m).clone()
    }

    pub fn reload(&self, ok: bool) {
        let result = if ok { "ok" } else { "failed" }.to_owned();
        self.reloads.get_or_create(&ResultLabel { result }).inc();
    }

    /// The text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// Keeps an in-flight gauge raised while alive.
pub struct InFlightGuard(Gauge);

impl InFlightGuard {
    pub fn new(gauge: Gauge) -> Self {
        gauge.inc();
        InFlightGuard(gauge)
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}
