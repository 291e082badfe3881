//! Phase 9, respond: a call stopped early becomes its answer by the one
//! table ([`crate::error`]); every call is counted once, and a client's
//! call logged once.

use http::Response;

use super::call::Call;
use crate::error::ProxyError;
use crate::proxy::app::App;
use crate::telemetry::metrics::{Outcome, NO_RULE};
use crate::transport::body::RelayBody;

/// The answer to a call stopped by a refusal or a failure, as the one
/// table says ([`ProxyError::into_response`]); sets its outcome.
pub fn refuse(call: &mut Call, e: ProxyError) -> Response<RelayBody> {
    call.outcome = e.outcome();
    if matches!(call.outcome, Outcome::upstream_error | Outcome::unavailable) {
        tracing::warn!(method = %call.arrived.method, path = %call.arrived.path, error = %e, "call failed");
    }
    if call.outcome == Outcome::rejected_bad_request {
        call.refusal = Some(e.to_string());
    }
    let caller_status = call.who.caller.policy().and_then(|p| p.throttle_status);
    e.into_response_for(call.route.rule.as_deref(), &call.arrived.config, caller_status)
}

/// The access log's `outcome` of a request to a route wxgate answers
/// itself ([`super::call::Routed::local`]): no call of WeChat's, whatever
/// its status.
pub const ANSWERED: &str = "answered";

/// Counts the call once (under its rule; a client's call under its
/// caller too) and writes a client's call's access-log line. A request to
/// a route wxgate answers itself is logged (outcome [`ANSWERED`]) and
/// counted in no call series: `wxgate_calls_total` counts calls of
/// WeChat's API only.
pub fn count_and_log(app: &App, call: &Call, status: http::StatusCode) {
    let rule = call.route.rule.as_ref().map_or(NO_RULE, |r| &*r.name);
    if !call.route.local {
        match &call.route.metrics {
            Some(m) => m.call(call.outcome),
            None => app.core.metrics.rule(rule).call(call.outcome),
        }
    }
    if call.who.own {
        return;
    }
    if !call.route.local {
        call.who.caller.entry.metrics.call(call.outcome);
    }
    if let Some(host) = &call.arrived.intercepted {
        host.calls.inc();
    }
    if call.arrived.config.log.access {
        let trace_id = super::spans::trace_id(call);
        tracing::info!(
            target: "wxgate::access",
            method = %call.arrived.method,
            path = %call.arrived.path,
            rule,
            account = %call.who.account,
            caller = %call.who.caller.name,
            // Its metrics label: the declared name, or `other` (so a log
            // line of `caller=default` is found under `caller="other"`).
            caller_label = call.who.caller.entry.label(),
            outcome = if call.route.local { ANSWERED } else { call.outcome.as_str() },
            status = status.as_u16(),
            errcode = call.errcode,
            upstream = call.sent.upstream.as_ref().map(|(u, i)| u.name(*i)),
            intercepted = call.arrived.intercepted.as_ref().map(|h| &*h.name),
            error = call.refusal.as_deref(),
            decision_ms = call.admission.decision_us as f64 / 1000.0,
            upstream_ms = call.sent.upstream_us as f64 / 1000.0,
            held_ms = call.admission.held_us as f64 / 1000.0,
            trace_id = trace_id.as_deref(),
        );
    }
}
