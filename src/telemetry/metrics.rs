//! Prometheus metrics (via `prometheus-client`), labelled by rule (and the
//! caller series by declared caller, `other` for the rest): never by account,
//! token or a header's free value, so cardinality is bounded by the config.

mod labels;
mod register;
mod series;

use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use labels::OUTCOMES;
pub use labels::{
    CallerLabel, CallerOutcomeLabels, CallerReasonLabels, ErrcodeLabels, FailoverLabels, FileOp, HostLabel,
    LearnedLabels, LeaseLabel, OpLabel, Outcome, OutcomeLabels, ResultLabel, RuleLabel, SourceLabel, Tried,
    TriedLabels, Tunnel, TunnelLabels, UpstreamLabel, NO_RULE,
};
use register::{AccountSeries, CallSeries, CallerSeries, InterceptSeries, StoreSeries};
pub use series::{CallerMetrics, MemoryStoreMetrics, RuleMetrics, TokenMetrics, UpstreamMetrics};
use series::{Latencies, RuleFamilies};

pub struct Metrics {
    pub registry: Registry,
    rules: std::sync::RwLock<hashbrown::HashMap<std::sync::Arc<str>, std::sync::Arc<RuleMetrics>>>,
    pub calls: Family<OutcomeLabels, Counter>,
    pub upstream_errcodes: Family<ErrcodeLabels, Counter>,
    pub upstream_seconds: Latencies,
    pub decision_seconds: Latencies,
    pub hold_seconds: Latencies,
    pub in_flight: Family<RuleLabel, Gauge>,
    pub held_now: Gauge,
    /// `wxgate_window_margin_seconds` (`crate::admit::margin`).
    pub window_margin: Gauge<f64, AtomicU64>,
    /// `wxgate_scheduler_late_seconds`.
    pub scheduler_late: Gauge<f64, AtomicU64>,
    pub store_errors: Counter,
    pub degraded_decisions: Counter,
    pub store_lost: Counter,
    pub store_reconciled: Counter,
    pub breaker_open: Gauge,
    pub breaker_opened: Counter,
    /// `wxgate_quota_lease_units_total{what}`.
    pub lease_units: Family<LeaseLabel, Counter>,
    /// `wxgate_trace_spans_total{what}`: exported, dropped, failed; and
    /// `wxgate_trace_queued_bytes`.
    pub trace_spans: crate::telemetry::trace::export::Counters,
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
    /// Limits learned from WeChat, by rule and direction
    /// ([`crate::limit::learned`]).
    pub quota_learned: Family<LearnedLabels, Counter>,
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
    /// Day-quota forecasts, by rule (`crate::admit::forecasts`).
    day_forecast: register::DayForecastSeries,
}

impl Metrics {
    /// A limit learned from WeChat changed a pair's limits.
    pub fn learned(&self, rule: &str, direction: &str) {
        self.quota_learned
            .get_or_create(&LearnedLabels { rule: rule.to_owned(), direction: direction.to_owned() })
            .inc();
    }

    pub fn new() -> Metrics {
        Metrics::traced(false)
    }

    /// The metrics of an instance; `traced`: tracing is on, and the
    /// latency histograms keep the trace id of a traced call as an
    /// exemplar.
    pub fn traced(traced: bool) -> Metrics {
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
            window_margin,
            scheduler_late,
        } = register::calls(&mut registry, traced);
        let StoreSeries {
            store_errors,
            degraded_decisions,
            store_lost,
            store_reconciled,
            breaker_open,
            breaker_opened,
            lease_units,
        } = register::store(&mut registry);
        let reloads = register::config_reloads(&mut registry);
        let refunds = register::refunds(&mut registry);
        let (recipients, recipient_refusals) = register::recipients(&mut registry);
        let AccountSeries { unknown_token_calls, tokens_learned, quota_clears, accounts_full, quota_learned } =
            register::accounts(&mut registry);
        let memory_store = register::memory_store(&mut registry);
        let upstreams = register::upstreams(&mut registry);
        let CallerSeries { caller_calls, caller_rate_refusals, caller_auth_refusals } =
            register::callers(&mut registry);
        let tokens = register::tokens(&mut registry);
        let InterceptSeries { intercepted_calls, intercept_tunnels } = register::intercept(&mut registry);
        let day_forecast = register::day_forecast(&mut registry);
        let trace_spans = register::trace_spans(&mut registry);
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
            window_margin,
            scheduler_late,
            store_errors,
            degraded_decisions,
            store_lost,
            store_reconciled,
            breaker_open,
            breaker_opened,
            lease_units,
            trace_spans,
            reloads,
            refunds,
            recipients,
            recipient_refusals,
            unknown_token_calls,
            tokens_learned,
            quota_clears,
            accounts_full,
            quota_learned,
            memory_store,
            upstreams,
            tokens,
            caller_calls,
            caller_rate_refusals,
            caller_auth_refusals,
            intercepted_calls,
            intercept_tunnels,
            day_forecast,
        }
    }

    /// Sets rule `rule`'s day-quota forecast gauges (its accounts together):
    /// the highest fraction used, the soonest exhaustion in seconds (capped
    /// at the quota day's end), and how many accounts are forecast to run
    /// out before it.
    pub fn set_day_forecast(&self, rule: &str, ratio: f64, runs_out_in: f64, running_out: u64) {
        let label = RuleLabel { rule: rule.to_owned() };
        let f = &self.day_forecast;
        f.used_ratio_max.get_or_create(&label).set(ratio);
        f.runs_out_in_min.get_or_create(&label).set(runs_out_in);
        f.running_out.get_or_create(&label).set(i64::try_from(running_out).unwrap_or(i64::MAX));
    }

    /// Removes the day-quota forecast gauges of every rule but `rules`;
    /// sets the seconds until the quota day ends.
    pub fn keep_day_forecasts(&self, rules: &[std::sync::Arc<str>], ends_in: f64) {
        let f = &self.day_forecast;
        f.ends_in.set(ends_in);
        let mut shown = f.shown.lock().unwrap_or_else(|e| e.into_inner());
        for gone in shown.iter().filter(|r| !rules.iter().any(|k| **k == ***r)) {
            let l = RuleLabel { rule: gone.to_string() };
            f.used_ratio_max.remove(&l);
            f.runs_out_in_min.remove(&l);
            f.running_out.remove(&l);
        }
        *shown = rules.to_vec();
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

    /// The series of one rule (created on first use, then shared): those
    /// the alerts count at once, the others on their first use
    /// ([`RuleMetrics`]).
    pub fn rule(&self, name: &str) -> std::sync::Arc<RuleMetrics> {
        if let Some(m) = self.rules.read().unwrap_or_else(|e| e.into_inner()).get(name) {
            return m.clone();
        }
        let families = RuleFamilies {
            calls: self.calls.clone(),
            errcodes: self.upstream_errcodes.clone(),
            decision: self.decision_seconds.clone(),
            upstream: self.upstream_seconds.clone(),
            hold: self.hold_seconds.clone(),
            in_flight: self.in_flight.clone(),
            refunds: self.refunds.clone(),
            recipients: self.recipients.clone(),
            recipient_refusals: self.recipient_refusals.clone(),
        };
        let m = std::sync::Arc::new(RuleMetrics::new(name, families));
        self.rules.write().unwrap_or_else(|e| e.into_inner()).entry(name.into()).or_insert(m).clone()
    }

    /// Creates the series the alerts count of each of `rules` (and of calls
    /// without a rule) at 0, so that the first 45009 or refusal of a rule is
    /// an increase an alert sees, not a series that appears at 1. Called at
    /// start and on each reload.
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

#[cfg(test)]
mod tests {
    use super::register::{DECISION_BUCKETS, HOLD_BUCKETS, UPSTREAM_BUCKETS};
    use super::*;

    fn lines_of(m: &Metrics, rule: &str) -> Vec<String> {
        let needle = format!("rule=\"{rule}\"");
        m.encode().lines().filter(|l| l.contains(&needle)).map(str::to_owned).collect()
    }

    #[test]
    fn bucket_bounds_increase_and_reach_the_timeouts() {
        for bounds in [&UPSTREAM_BUCKETS[..], &DECISION_BUCKETS[..], &HOLD_BUCKETS[..]] {
            assert!(bounds.windows(2).all(|w| w[0] < w[1]), "{bounds:?}");
        }
        // upstream_timeout's default, [store] timeout's default, the longest max_wait.
        assert_eq!(UPSTREAM_BUCKETS.last(), Some(&10.0));
        assert_eq!(DECISION_BUCKETS.last(), Some(&0.05));
        assert_eq!(HOLD_BUCKETS.last(), Some(&300.0));
    }

    #[test]
    fn a_rule_without_calls_has_only_the_series_the_alerts_count() {
        let m = Metrics::new();
        m.rules(["send"]);
        let lines = lines_of(&m, "send");
        assert_eq!(lines.len(), 9, "{lines:#?}");
        for code in ["45009", "45011", "45033"] {
            assert!(lines.iter().any(|l| l.contains(&format!("errcode=\"{code}\"")) && l.ends_with(" 0")), "{code}");
        }
        assert!(lines.iter().all(|l| !l.contains("_seconds")), "no histogram yet");
    }

    #[test]
    fn series_appear_on_first_use_once_and_keep_counting() {
        let m = Metrics::new();
        let send = m.rule("send");
        send.errcode(40001);
        send.errcode(40001);
        send.errcode(12345);
        send.errcode(99999);
        send.call(Outcome::cached);
        send.observe_decision(0.000_01, None);
        send.observe_upstream(0.2, None);
        send.observe_upstream(0.2, None);
        send.refunded();
        let again = m.rule("send");
        again.errcode(40001);
        let text = m.encode();
        let value = |series: &str| {
            text.lines().find_map(|l| l.strip_prefix(series)?.trim().parse::<f64>().ok()).unwrap_or(f64::NAN)
        };
        assert_eq!(value(r#"wxgate_upstream_errcodes_total{rule="send",errcode="40001"}"#), 3.0, "{text}");
        assert_eq!(value(r#"wxgate_upstream_errcodes_total{rule="send",errcode="other"}"#), 2.0);
        assert_eq!(value(r#"wxgate_calls_total{rule="send",outcome="cached"}"#), 1.0);
        assert_eq!(value(r#"wxgate_upstream_seconds_count{rule="send"}"#), 2.0);
        assert_eq!(value(r#"wxgate_upstream_seconds_bucket{le="0.25",rule="send"}"#), 2.0);
        assert_eq!(value(r#"wxgate_upstream_seconds_bucket{le="0.1",rule="send"}"#), 0.0);
        assert_eq!(value(r#"wxgate_decision_seconds_bucket{le="0.00005",rule="send"}"#), 1.0);
        assert_eq!(value(r#"wxgate_refunds_total{rule="send"}"#), 1.0);
        assert!(!text.contains("wxgate_hold_seconds"), "nothing held: {text}");
        assert!(!text.contains("errcode=\"48001\""), "never answered");
        assert!(!text.contains("outcome=\"held\""), "never held");
    }
}
