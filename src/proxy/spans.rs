//! A call's spans (`crate::telemetry::trace`, docs/tracing.md), written by
//! the phases through these functions: each does nothing for a call that
//! is not traced, or not sampled.
//!
//! - the call's span (server; internal for a call wxgate makes itself),
//!   written when it is answered ([`finish`]): method, path (never the
//!   query), status, rule, account, caller, outcome, WeChat's errcode, the
//!   upstream's host;
//! - `wxgate.decide`: the store, and the decision (admitted, held, refused
//!   with its reason and wait);
//! - `wxgate.hold`: the wait for a reserved slot;
//! - the upstream exchange (client), connect to answer head, and a resend.
//!
//! Never a token, secret, caller key, body, query or recipient.

use http::{HeaderMap, HeaderName};

use super::call::Call;
use crate::config::StoreConfig;
use crate::error::ProxyError;
use crate::proxy::app::App;
use crate::telemetry::trace::{kv, kv_bool, kv_int, Kind, SpanContext, SpanData};

static TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
static TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// The longest `tracestate` carried on (the W3C limit is 512 bytes).
const MAX_TRACESTATE: usize = 512;

/// Starts a client's call's trace, continuing its caller's `traceparent`
/// (one field, valid; anything else starts a new trace, as W3C says).
pub fn start(app: &App, call: &mut Call, headers: &HeaderMap) {
    let Some(tracer) = &app.core.tracer else { return };
    let one = |name: &HeaderName| {
        let mut all = headers.get_all(name).iter();
        match (all.next(), all.next()) {
            (Some(v), None) => Some(v),
            _ => None,
        }
    };
    let parent = one(&TRACEPARENT).and_then(|v| SpanContext::from_traceparent(v.as_bytes()));
    let state = parent
        .and(one(&TRACESTATE))
        .filter(|v| v.len() <= MAX_TRACESTATE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    call.trace = Some(Box::new(tracer.start(parent, state)));
}

/// Starts the trace of a call wxgate makes itself: a child of the traced
/// call this task runs (a token fetch for it), else a new trace linked to
/// `link` (a queued delivery's submission: recorded when it was).
pub fn start_own(app: &App, call: &mut Call, link: Option<SpanContext>) {
    let Some(tracer) = &app.core.tracer else { return };
    call.trace = Some(Box::new(match (crate::telemetry::trace::current(), link) {
        (Some(parent), _) => tracer.start(Some(parent), None),
        (None, Some(link)) => tracer.start_linked(link),
        (None, None) => tracer.start(None, None),
    }));
}

/// Now on the call's trace clock, when it records.
pub fn now(call: &Call) -> Option<u64> {
    call.trace.as_ref().and_then(|t| t.recording.as_ref()).map(|r| r.now_ns())
}

/// The decision's span (and the hold's), from `start` (see [`now`]).
pub fn decided(app: &App, call: &mut Call, start: Option<u64>, result: Result<(i64, i64), &ProxyError>) {
    let (Some(start), Some(tracer), Some(traced)) = (start, &app.core.tracer, &mut call.trace) else { return };
    let store = match call.arrived.config.store {
        StoreConfig::Redis(_) => "redis",
        StoreConfig::Memory(_) => "memory",
    };
    let mut attributes = vec![kv("wxgate.store", store)];
    let (decision_us, held_us) = match result {
        Ok((decision_us, held_us)) => {
            attributes.push(kv("wxgate.decision", if held_us > 0 { "held" } else { "admitted" }));
            if held_us > 0 {
                attributes.push(kv_int("wxgate.wait_ms", held_us / 1000));
            }
            (decision_us, held_us)
        }
        Err(e) => {
            attributes.push(kv("wxgate.decision", "refused"));
            attributes.push(kv("wxgate.outcome", e.outcome().as_str()));
            if let ProxyError::Throttled { reason, wait_us, .. } = e {
                attributes.push(kv("wxgate.reason", reason.as_str()));
                attributes.push(kv_int("wxgate.wait_ms", wait_us / 1000));
            }
            (call.admission.decision_us, 0)
        }
    };
    let decided = SpanData::end_after(start, decision_us);
    traced.child(
        tracer,
        SpanData {
            name: "wxgate.decide",
            kind: Kind::Internal,
            start_ns: start,
            end_ns: decided,
            attributes,
            error: None,
        },
    );
    if held_us > 0 {
        let end_ns = SpanData::end_after(decided, held_us);
        let attributes = vec![kv_int("wxgate.held_ms", held_us / 1000)];
        traced.child(
            tracer,
            SpanData { name: "wxgate.hold", kind: Kind::Internal, start_ns: decided, end_ns, attributes, error: None },
        );
    }
}

/// An exchange with the upstream (`resend`: the second of a call WeChat
/// made wxgate send again), from `start` until its answer's head.
pub fn exchanged(app: &App, call: &mut Call, start: Option<u64>, upstream: &str, answered: Answered, resend: bool) {
    let Answered { status, connected } = answered;
    let (Some(start), Some(tracer), Some(traced)) = (start, &app.core.tracer, &mut call.trace) else { return };
    let end_ns = traced.recording.as_ref().map_or(start, |r| r.now_ns());
    let (host, port) = match upstream.rsplit_once(':') {
        Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => (h, p.parse::<i64>().ok()),
        _ => (upstream, None),
    };
    let mut attributes = vec![kv("http.request.method", call.arrived.method.as_str()), kv("server.address", host)];
    if let Some(port) = port {
        attributes.push(kv_int("server.port", port));
    }
    attributes.push(kv("url.path", call.arrived.path.as_str()));
    if resend {
        attributes.push(kv_bool("wxgate.resend", true));
    }
    // Connecting (TCP, TLS, handshake) is in the span when the call made a
    // connection; the rest, to the answer's head, is WeChat's time.
    attributes.push(kv("wxgate.connection", if connected.is_some() { "new" } else { "reused" }));
    if let Some(us) = connected {
        attributes.push(kv_int("wxgate.connect_us", us));
    }
    let error = match status {
        Ok(code) => {
            attributes.push(kv_int("http.response.status_code", i64::from(code)));
            (code >= 400).then(|| code.to_string())
        }
        Err(e) => {
            attributes.push(kv("error.type", "upstream"));
            Some(e)
        }
    };
    let name = if resend { "wxgate.resend" } else { call.arrived.method.as_str() };
    traced.child(tracer, SpanData { name, kind: Kind::Client, start_ns: start, end_ns, attributes, error });
}

/// What an exchange with the upstream came to: the answer's status (or
/// why there is none), and how long connecting took when it made a
/// connection.
pub struct Answered {
    pub status: Result<u16, String>,
    pub connected: Option<i64>,
}

impl Answered {
    pub fn of<B>(resp: &Result<http::Response<B>, crate::transport::upstream::UpstreamError>) -> Answered {
        match resp {
            Ok(r) => Answered {
                status: Ok(r.status().as_u16()),
                connected: r.extensions().get::<crate::transport::upstream::Connected>().map(|c| c.us),
            },
            Err(e) => Answered { status: Err(e.to_string()), connected: None },
        }
    }
}

/// Writes the call's own span and hands the call's spans to the export
/// queue.
pub fn finish(app: &App, call: &mut Call, status: http::StatusCode) {
    let (Some(tracer), Some(traced)) = (&app.core.tracer, call.trace.as_mut()) else { return };
    let Some(rec) = traced.recording.take() else { return };
    let end_ns = rec.now_ns();
    let rule = call.route.rule.as_ref().map(|r| &*r.name);
    let name = match rule {
        Some(rule) => format!("{} {rule}", call.arrived.method),
        None => call.arrived.method.to_string(),
    };
    let mut attributes = vec![
        kv("http.request.method", call.arrived.method.as_str()),
        kv("url.path", call.arrived.path.as_str()),
        kv_int("http.response.status_code", i64::from(status.as_u16())),
        kv("wxgate.account", call.who.account.as_str()),
        kv("wxgate.caller", call.who.caller.entry.label()),
        kv("wxgate.outcome", call.outcome.as_str()),
        kv("wxgate.domain", call.arrived.config.domains.get(call.arrived.domain).map_or("", |d| &*d.host)),
    ];
    if let Some(rule) = rule {
        attributes.push(kv("wxgate.rule", rule));
    }
    if let Some(code) = call.errcode {
        attributes.push(kv_int("wechat.errcode", code));
    }
    if let Some((u, i)) = &call.sent.upstream {
        attributes.push(kv("wxgate.upstream", u.name(*i)));
    }
    if call.who.own {
        attributes.push(kv_bool("wxgate.own", true));
        attributes.push(kv_bool("wxgate.queued", call.who.queued));
    }
    let kind = if call.who.own { Kind::Internal } else { Kind::Server };
    let error = (status.as_u16() >= 500).then(|| status.to_string());
    let mut span = crate::telemetry::trace::span(
        traced.ctx.trace_id,
        traced.ctx.span_id,
        rec.parent,
        SpanData { name: &name, kind, start_ns: rec.start_ns, end_ns, attributes, error },
    );
    if let Some(state) = &rec.tracestate {
        span.trace_state.clone_from(state);
    }
    span.links = rec.links.iter().map(crate::telemetry::trace::link).collect();
    let mut spans = rec.spans;
    spans.push(span);
    tracer.finish(spans);
}

/// The trace id of a traced call, for its access-log line (sampled or
/// not: a caller's trace id finds its line).
pub fn trace_id(call: &Call) -> Option<String> {
    call.trace.as_ref().map(|t| t.ctx.trace_hex())
}

/// The trace id of a call whose spans are exported: an exemplar of its
/// latencies.
pub fn exemplar(call: &Call) -> Option<String> {
    call.trace.as_ref().filter(|t| t.recording.is_some()).map(|t| t.ctx.trace_hex())
}
