//! An OpenTelemetry collector on loopback (tests/tracing.rs): a
//! [`MockWeChat`] that takes OTLP/HTTP exports (`POST /v1/traces`,
//! protobuf) and records them, decoded with the `opentelemetry-proto`
//! messages wxgate encodes with, and as the raw bytes wxgate sent (to
//! search for what must never be in them).

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;

use super::{eventually_some_async, MockWeChat, Reply, PATIENCE};

/// A collector answering every export 200 (an empty protobuf answer).
pub async fn collector() -> MockWeChat {
    let mock = MockWeChat::start().await;
    mock.respond(|_| Reply::Bytes { body: Vec::new(), content_type: "application/x-protobuf" });
    mock
}

/// `[telemetry]` exporting to `collector`, every call sampled, batches
/// sent 10 ms after their first span.
pub fn telemetry(collector: &MockWeChat) -> String {
    format!("[telemetry]\nendpoint = \"{}\"\nbatch_delay = \"10ms\"\n", collector.url())
}

/// Every exported request, decoded (panics on one that is not OTLP).
pub fn requests(collector: &MockWeChat) -> Vec<ExportTraceServiceRequest> {
    collector
        .calls()
        .iter()
        .map(|c| {
            assert_eq!(c.path_and_query, "/v1/traces");
            assert_eq!(c.headers.get("content-type").and_then(|v| v.to_str().ok()), Some("application/x-protobuf"));
            ExportTraceServiceRequest::decode(&c.body[..]).expect("an OTLP trace export")
        })
        .collect()
}

/// Every span exported so far.
pub fn spans(collector: &MockWeChat) -> Vec<Span> {
    requests(collector)
        .into_iter()
        .flat_map(|r| r.resource_spans)
        .flat_map(|r| r.scope_spans)
        .flat_map(|s| s.spans)
        .collect()
}

/// Every byte exported so far, as one (lossy) string.
pub fn raw(collector: &MockWeChat) -> String {
    collector.calls().iter().map(|c| String::from_utf8_lossy(&c.body).into_owned()).collect()
}

/// The spans of the trace `trace_id`, once its span named `name` is in.
pub async fn trace_with(collector: &MockWeChat, trace_id: &[u8], name: &str) -> Vec<Span> {
    eventually_some_async("the trace's span exported", PATIENCE, async || {
        let of: Vec<Span> = spans(collector).into_iter().filter(|s| s.trace_id == trace_id).collect();
        of.iter().any(|s| s.name == name).then_some(of)
    })
    .await
}

/// The first exported span named `name` (waiting for it).
pub async fn span_named(collector: &MockWeChat, name: &str) -> Span {
    eventually_some_async("a span exported", PATIENCE, async || spans(collector).into_iter().find(|s| s.name == name))
        .await
}

/// A span's attribute, as text (strings as they are, numbers and booleans
/// written out).
pub fn attr(span: &Span, key: &str) -> Option<String> {
    span.attributes.iter().find(|kv| kv.key == key).and_then(|kv| kv.value.as_ref()?.value.as_ref()).map(|v| match v {
        Value::StringValue(s) => s.clone(),
        Value::IntValue(i) => i.to_string(),
        Value::BoolValue(b) => b.to_string(),
        Value::DoubleValue(d) => d.to_string(),
        other => format!("{other:?}"),
    })
}

/// Bytes from hex.
pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2).map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex")).collect()
}
