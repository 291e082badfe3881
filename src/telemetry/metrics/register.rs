//! Each subsystem's series, created and registered: one function per
//! subsystem, called by [`crate::telemetry::metrics::Metrics::new`] in the order the
//! series appear in `/metrics`.

use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::exemplar::HistogramWithExemplars;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use super::labels::{
    CallerLabel, CallerOutcomeLabels, CallerReasonLabels, ErrcodeLabels, FileOp, HostLabel, LearnedLabels, LeaseLabel,
    OpLabel, OutcomeLabels, ResultLabel, RuleLabel, SourceLabel, TunnelLabels,
};
use super::series::{Latencies, Latency, MemoryStoreMetrics, TokenMetrics, UpstreamMetrics};

/// The latency histograms' bucket bounds, in seconds: few enough that an
/// active rule costs 12 or 13 lines per histogram, where the dashboard's
/// p50/p90/p99 panels need them. Each also has `+Inf`, `_sum`, `_count`.
///
/// Time to WeChat's answer's head: 10 ms (the same region) to 10 s
/// (`upstream_timeout`'s default); 1-2.5-5 steps around 0.1–0.5 s, where
/// WeChat answers from most networks.
pub(super) const UPSTREAM_BUCKETS: [f64; 10] = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// Time to decide: 50 µs (the embedded store's decisions all fall below it)
/// to 50 ms (`[store] timeout`'s default, past which the fallback decides);
/// a Redis round trip falls in 0.25–2.5 ms.
pub(super) const DECISION_BUCKETS: [f64; 9] = [0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.05];

/// Time a call was held for its slot: 10 ms to 5 min (the longest `max_wait`).
pub(super) const HOLD_BUCKETS: [f64; 10] = [0.01, 0.05, 0.25, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0];

fn upstream_buckets() -> Latency {
    Latency::Plain(Histogram::new(UPSTREAM_BUCKETS))
}

fn decision_buckets() -> Latency {
    Latency::Plain(Histogram::new(DECISION_BUCKETS))
}

fn hold_buckets() -> Latency {
    Latency::Plain(Histogram::new(HOLD_BUCKETS))
}

fn upstream_buckets_traced() -> Latency {
    Latency::Exemplars(HistogramWithExemplars::new(UPSTREAM_BUCKETS.into_iter()))
}

fn decision_buckets_traced() -> Latency {
    Latency::Exemplars(HistogramWithExemplars::new(DECISION_BUCKETS.into_iter()))
}

fn hold_buckets_traced() -> Latency {
    Latency::Exemplars(HistogramWithExemplars::new(HOLD_BUCKETS.into_iter()))
}

/// The calls' series, by rule: outcomes, WeChat's errcodes, latencies, in flight.
pub(super) struct CallSeries {
    pub(super) calls: Family<OutcomeLabels, Counter>,
    pub(super) upstream_errcodes: Family<ErrcodeLabels, Counter>,
    pub(super) upstream_seconds: Latencies,
    pub(super) decision_seconds: Latencies,
    pub(super) hold_seconds: Latencies,
    pub(super) in_flight: Family<RuleLabel, Gauge>,
    pub(super) held_now: Gauge,
    pub(super) window_margin: Gauge<f64, AtomicU64>,
    pub(super) scheduler_late: Gauge<f64, AtomicU64>,
}

/// `traced`: the latency histograms keep exemplars (tracing on).
pub(super) fn calls(registry: &mut Registry, traced: bool) -> CallSeries {
    let calls = Family::<OutcomeLabels, Counter>::default();
    let upstream_errcodes = Family::<ErrcodeLabels, Counter>::default();
    type Make = fn() -> Latency;
    let (upstream, decision, hold): (Make, Make, Make) = match traced {
        false => (upstream_buckets, decision_buckets, hold_buckets),
        true => (upstream_buckets_traced, decision_buckets_traced, hold_buckets_traced),
    };
    let upstream_seconds: Latencies = Family::new_with_constructor(upstream);
    let decision_seconds: Latencies = Family::new_with_constructor(decision);
    let hold_seconds: Latencies = Family::new_with_constructor(hold);
    let in_flight = Family::<RuleLabel, Gauge>::default();
    let held_now = Gauge::default();
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
    let window_margin = Gauge::<f64, AtomicU64>::default();
    registry.register(
        "window_margin_seconds",
        "The arrival margin windows are decided with now: window_margin, widened while the scheduler runs late",
        window_margin.clone(),
    );
    let scheduler_late = Gauge::<f64, AtomicU64>::default();
    registry.register(
        "scheduler_late_seconds",
        "How late this instance's scheduler woke a timer at worst, over the last 30 s",
        scheduler_late.clone(),
    );
    CallSeries {
        calls,
        upstream_errcodes,
        upstream_seconds,
        decision_seconds,
        hold_seconds,
        in_flight,
        held_now,
        window_margin,
        scheduler_late,
    }
}

/// The shared store's series (Redis, its circuit breaker, the fallback).
pub(super) struct StoreSeries {
    pub(super) store_errors: Counter,
    pub(super) degraded_decisions: Counter,
    pub(super) store_lost: Counter,
    pub(super) store_reconciled: Counter,
    pub(super) breaker_open: Gauge,
    pub(super) breaker_opened: Counter,
    pub(super) lease_units: Family<LeaseLabel, Counter>,
}

pub(super) fn store(registry: &mut Registry) -> StoreSeries {
    let store_errors = Counter::default();
    let degraded_decisions = Counter::default();
    let store_lost = Counter::default();
    let store_reconciled = Counter::default();
    let breaker_open = Gauge::default();
    let breaker_opened = Counter::default();
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
    let lease_units = Family::<LeaseLabel, Counter>::default();
    registry.register(
        "quota_lease_units",
        "Units of quota leases this instance took from Redis, spent in-process, gave back, let expire unspent \
         (their window slots or period passed before the return), or dropped unspent (a penalty, a lower \
         limit, a return Redis did not answer: they stay counted); and of reserves of calendar quotas it \
         took (reserved) and spent while Redis could not answer (reserve_spent)",
        lease_units.clone(),
    );
    StoreSeries {
        store_errors,
        degraded_decisions,
        store_lost,
        store_reconciled,
        breaker_open,
        breaker_opened,
        lease_units,
    }
}

/// Config reloads, by result.
pub(super) fn config_reloads(registry: &mut Registry) -> Family<ResultLabel, Counter> {
    let reloads = Family::<ResultLabel, Counter>::default();
    registry.register("config_reloads", "Config reloads by result (ok, failed)", reloads.clone());
    // Both from the start: the first failed reload is an increase.
    for result in ["ok", "failed"] {
        let _ = reloads.get_or_create(&ResultLabel { result: result.to_owned() });
    }
    reloads
}

/// Spans of traces, by what became of them, and the bytes held for export
/// (`crate::telemetry::trace::export`).
pub(super) fn trace_spans(registry: &mut Registry) -> crate::telemetry::trace::export::Counters {
    let spans = Family::<LeaseLabel, Counter>::default();
    registry.register(
        "trace_spans",
        "Spans of traces: exported to the collector, dropped (the export queue was full), failed (the export did not succeed)",
        spans.clone(),
    );
    let get = |what: &str| spans.get_or_create(&LeaseLabel { what: what.to_owned() }).clone();
    let queued_bytes = Gauge::default();
    registry.register(
        "trace_queued_bytes",
        "Bytes of spans held for export (queued, or in the export under way; an estimate of their memory), at most [telemetry] max_queued_bytes",
        queued_bytes.clone(),
    );
    crate::telemetry::trace::export::Counters {
        exported: get("exported"),
        dropped: get("dropped"),
        failed: get("failed"),
        queued_bytes,
    }
}

/// Refunds, by rule.
pub(super) fn recipients(registry: &mut Registry) -> (Family<RuleLabel, Counter>, Family<RuleLabel, Counter>) {
    let recipients = Family::<RuleLabel, Counter>::default();
    registry.register(
        "recipients",
        "Recipients of the calls admitted under rules with cost = \"recipients\" (person-times)",
        recipients.clone(),
    );
    let refusals = Family::<RuleLabel, Counter>::default();
    registry.register(
        "recipient_refusals",
        "Calls refused whole because a recipient was over its per_recipient limits",
        refusals.clone(),
    );
    (recipients, refusals)
}

pub(super) fn refunds(registry: &mut Registry) -> Family<RuleLabel, Counter> {
    let refunds = Family::<RuleLabel, Counter>::default();
    registry.register(
        "refunds",
        "Calls that provably never reached WeChat (no connection) and gave back what they took from their rule's limits",
        refunds.clone(),
    );
    refunds
}

/// The accounts' series: tokens learned, calls of unknown tokens, quota clears.
pub(super) struct AccountSeries {
    pub(super) unknown_token_calls: Counter,
    pub(super) tokens_learned: Counter,
    pub(super) quota_clears: Counter,
    pub(super) accounts_full: Counter,
    pub(super) quota_learned: Family<LearnedLabels, Counter>,
}

pub(super) fn accounts(registry: &mut Registry) -> AccountSeries {
    let unknown_token_calls = Counter::default();
    let tokens_learned = Counter::default();
    let quota_clears = Counter::default();
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
    let accounts_full = Counter::default();
    registry.register(
        "accounts_full",
        "Calls for an account new to this instance refused (429, reason accounts_full) because [server] max_accounts accounts already have calls today",
        accounts_full.clone(),
    );
    let quota_learned = Family::<LearnedLabels, Counter>::default();
    registry.register(
        "quota_learned",
        "Limits learned from WeChat that changed an (account, rule)'s limits, by rule and direction: a day limit quota/get reported (quota_sync; down or up), a window lowered after a frequency 45009 (learn_windows; down)",
        quota_learned.clone(),
    );
    AccountSeries { unknown_token_calls, tokens_learned, quota_clears, accounts_full, quota_learned }
}

/// The embedded store's series, and its state file's.
pub(super) fn memory_store(registry: &mut Registry) -> MemoryStoreMetrics {
    let memory_store = MemoryStoreMetrics::default();
    // Both series from the start, so that 0 is visible (and alertable).
    let _ = memory_store.file_errors.get_or_create(&OpLabel { op: FileOp::load });
    let _ = memory_store.file_errors.get_or_create(&OpLabel { op: FileOp::save });
    let m = &memory_store;
    registry.register(
        "store_entries",
        "States held by the embedded store, one per X-Wx-Account and rule",
        m.entries.clone(),
    );
    registry.register(
        "store_full",
        "Calls refused with 503 for want of room: of a new X-Wx-Account and rule pair past [store] max_entries, \
         or naming new recipients past [store] max_recipients",
        m.full.clone(),
    );
    registry.register(
        "store_recipients",
        "Recipients' states held by the embedded store (per_recipient), all pairs together",
        m.recipients.clone(),
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
    memory_store
}

/// The upstreams' series.
pub(super) fn upstreams(registry: &mut Registry) -> UpstreamMetrics {
    let upstreams = UpstreamMetrics::default();
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
    upstreams
}

/// The callers' series, by declared caller (or `other`).
pub(super) struct CallerSeries {
    pub(super) caller_calls: Family<CallerOutcomeLabels, Counter>,
    pub(super) caller_rate_refusals: Family<CallerLabel, Counter>,
    pub(super) caller_auth_refusals: Family<CallerReasonLabels, Counter>,
}

pub(super) fn callers(registry: &mut Registry) -> CallerSeries {
    let caller_calls = Family::<CallerOutcomeLabels, Counter>::default();
    let caller_rate_refusals = Family::<CallerLabel, Counter>::default();
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
    let caller_auth_refusals = Family::<CallerReasonLabels, Counter>::default();
    registry.register(
        "caller_auth_refusals",
        "Calls refused under caller_auth = \"required\" by caller (a declared [[caller]], or other when none was proven) and reason: unauthenticated (401: no key, or a wrong one) or forbidden (403: an account not granted)",
        caller_auth_refusals.clone(),
    );
    CallerSeries { caller_calls, caller_rate_refusals, caller_auth_refusals }
}

/// The token cache's series, and quota_sync's.
pub(super) fn tokens(registry: &mut Registry) -> TokenMetrics {
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
        "Token requests by source: cache (answered by wxgate's token cache), fetched (the one request sent to WeChat for its appid and secret: a caller's, or wxgate's own for an [[account]]), passed (sent without the cache), timeout (waited [tokens] wait for another's fetch: 503)",
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
        "token_injections",
        "Calls without an access_token that wxgate added an [[account]]'s current token to",
        tokens.injected.clone(),
    );
    registry.register(
        "token_resends",
        "Injected calls WeChat refused for their token (40001, 40014, 42001), sent once more with a new one",
        tokens.resent.clone(),
    );
    for result in ["renewed", "error"] {
        let _ = tokens.renewals.get_or_create(&ResultLabel { result: result.to_owned() });
    }
    registry.register(
        "token_renewals",
        "Tokens of [[account]]s renewed ahead of expiry by this instance, by result (renewed, error)",
        tokens.renewals.clone(),
    );
    tokens
}

/// `[intercept]`'s series.
pub(super) struct InterceptSeries {
    pub(super) intercepted_calls: Family<HostLabel, Counter>,
    pub(super) intercept_tunnels: Family<TunnelLabels, Counter>,
}

pub(super) fn intercept(registry: &mut Registry) -> InterceptSeries {
    let intercepted_calls = Family::<HostLabel, Counter>::default();
    let intercept_tunnels = Family::<TunnelLabels, Counter>::default();
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
    InterceptSeries { intercepted_calls, intercept_tunnels }
}

/// The build's version.
pub(super) fn build(registry: &mut Registry) {
    let info = Info::new(vec![("version".to_string(), env!("CARGO_PKG_VERSION").to_string())]);
    registry.register("build", "wxgate build", info);
}

/// Day-quota forecasts per rule (never per account): set at each scrape
/// (`crate::admit::forecasts`).
pub(super) struct DayForecastSeries {
    pub(super) used_ratio_max: Family<RuleLabel, Gauge<f64, AtomicU64>>,
    pub(super) runs_out_in_min: Family<RuleLabel, Gauge<f64, AtomicU64>>,
    pub(super) ends_in: Gauge<f64, AtomicU64>,
    pub(super) running_out: Family<RuleLabel, Gauge>,
    /// The rules whose gauges are set.
    pub(super) shown: std::sync::Mutex<Vec<std::sync::Arc<str>>>,
}

pub(super) fn day_forecast(registry: &mut Registry) -> DayForecastSeries {
    let f = DayForecastSeries {
        used_ratio_max: Family::default(),
        runs_out_in_min: Family::default(),
        ends_in: Gauge::default(),
        running_out: Family::default(),
        shown: std::sync::Mutex::default(),
    };
    registry.register(
        "quota_day_used_ratio_max",
        "Day quotas: the highest fraction of its day quota any account of the rule has used today (0 to 1; of its effective day limit), over the accounts this instance admitted calls of in the last hour (no series for a rule without)",
        f.used_ratio_max.clone(),
    );
    registry.register(
        "quota_day_runs_out_in_seconds_min",
        "Day quotas: seconds until the first account of the rule runs out of its day quota at its current rate (a 5-minute moving average); the seconds until the quota day ends when none runs out before",
        f.runs_out_in_min.clone(),
    );
    registry.register(
        "quota_day_ends_in_seconds",
        "Day quotas: seconds until the quota day ends (midnight of quota_timezone) and every day quota starts again",
        f.ends_in.clone(),
    );
    registry.register(
        "quota_day_accounts_running_out",
        "Day quotas: accounts of the rule forecast to run out of their day quota before the quota day ends, at their current rate (spent ones included)",
        f.running_out.clone(),
    );
    f
}
