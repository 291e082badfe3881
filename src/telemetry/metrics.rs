//! Prometheus metrics (via `prometheus-client`), labelled by rule (and the
//! caller series by declared caller, `other` for the rest): never by account,
//! token or a header's free value, so cardinality is bounded by the config.

mod labels;
mod register;
mod series;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use labels::OUTCOMES;
pub use labels::{
    CallerLabel, CallerOutcomeLabels, CallerReasonLabels, ErrcodeLabels, FailoverLabels, FileOp, HostLabel, OpLabel,
    Outcome, OutcomeLabels, ResultLabel, RuleLabel, SourceLabel, Tried, TriedLabels, Tunnel, TunnelLabels,
    UpstreamLabel, NO_RULE,
};
use register::{AccountSeries, CallSeries, CallerSeries, Histograms, InterceptSeries, StoreSeries};
use series::KNOWN_ERRCODES;
pub use series::{CallerMetrics, MemoryStoreMetrics, RuleMetrics, TokenMetrics, UpstreamMetrics};

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
    pub recipients: Family<RuleLabel, Counter>,
    pub recipient_refusals: Family<RuleLabel, Counter>,
    /// Calls that named no account and carried an access token wxgate did
    /// not know: counted against `default`.
    pub unknown_token_calls: Counter,
    /// Access tokens learned from their token answers (and stored).
    pub tokens_learned: Counter,
    /// Accounts whose day counts and penalties were reset: a `clear_quota`
    /// WeChat accepted, or `POST /v1/accounts/{account}/clear`.
    pub quota_clears: Counter,
    pub accounts_full: Counter,
    pub memory_store: MemoryStoreMetrics,
    pub upstreams: UpstreamMetrics,
    /// The token cache and quota_sync.
    pub tokens: TokenMetrics,
    /// Calls by caller (declared name or `other`) and outcome.
    pub caller_calls: Family<CallerOutcomeLabels, Counter>,
    /// Calls refused by their caller's flood guard, by caller.
    pub caller_rate_refusals: Family<CallerLabel, Counter>,
    pub caller_auth_refusals: Family<CallerReasonLabels, Counter>,
    /// `[intercept]`: calls served inside CONNECT tunnels, by host.
    pub intercepted_calls: Family<HostLabel, Counter>,
    /// `[intercept]`: CONNECT requests by what became of them.
    pub intercept_tunnels: Family<TunnelLabels, Counter>,
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("wxgate");
        // One subsystem after another, in the order of the /metrics text.
        let CallSeries {
            calls,
            upstream_errcodes,
            upstream_seconds,
            decision_seconds,
            hold_seconds,
            in_flight,
            held_now,
        } = register::calls(&mut registry);
        let StoreSeries {
            store_errors,
            degraded_decisions,
            store_lost,
            store_reconciled,
            breaker_open,
            breaker_opened,
        } = register::store(&mut registry);
        let reloads = register::config_reloads(&mut registry);
        let refunds = register::refunds(&mut registry);
        let (recipients, recipient_refusals) = register::recipients(&mut registry);
        let AccountSeries { unknown_token_calls, tokens_learned, quota_clears, accounts_full } =
            register::accounts(&mut registry);
        let memory_store = register::memory_store(&mut registry);
        let upstreams = register::upstreams(&mut registry);
        let CallerSeries { caller_calls, caller_rate_refusals, caller_auth_refusals } =
            register::callers(&mut registry);
        let tokens = register::tokens(&mut registry);
        let InterceptSeries { intercepted_calls, intercept_tunnels } = register::intercept(&mut registry);
        register::build(&mut registry);
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
            recipients,
            recipient_refusals,
            unknown_token_calls,
            tokens_learned,
            quota_clears,
            accounts_full,
            memory_store,
            upstreams,
            tokens,
            caller_calls,
            caller_rate_refusals,
            caller_auth_refusals,
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
            unauthenticated: self.auth_refusal(label, "unauthenticated"),
            forbidden: self.auth_refusal(label, "forbidden"),
        }
    }

    fn auth_refusal(&self, caller: &str, reason: &str) -> Counter {
        self.caller_auth_refusals
            .get_or_create(&CallerReasonLabels { caller: caller.to_owned(), reason: reason.to_owned() })
            .clone()
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
            recipients: self.recipients.get_or_create(&rule()).clone(),
            recipient_refusals: self.recipient_refusals.get_or_create(&rule()).clone(),
        });
        self.rules.write().unwrap_or_else(|e| e.into_inner()).entry(name.into()).or_insert(m).clone()
    }

    /// Creates the series of each of `rules` (and of calls without a rule)
    /// at 0, so that the first 45009 or refusal of a rule is an increase an
    /// alert sees, not a series that appears at 1. Called at start and on
    /// each reload.
    pub fn rules<'a>(&self, rules: impl IntoIterator<Item = &'a str>) {
        let _ = self.rule(NO_RULE);
        for name in rules {
            let _ = self.rule(name);
        }
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
