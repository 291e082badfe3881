//! A span's (or a resource's) attributes in OTLP's message, and the cap
//! on what a caller can make long in a span.

use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::trace::v1::span::{Event, Link};
use opentelemetry_proto::tonic::trace::v1::Span;

/// A string attribute.
pub fn kv(key: &str, value: impl Into<String>) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(any_value::Value::StringValue(value.into())) }),
        ..Default::default()
    }
}

/// An integer attribute.
pub fn kv_int(key: &str, value: i64) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(any_value::Value::IntValue(value)) }),
        ..Default::default()
    }
}

/// A boolean attribute.
pub fn kv_bool(key: &str, value: bool) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(any_value::Value::BoolValue(value)) }),
        ..Default::default()
    }
}

/// Cuts `s` to at most `max` bytes, at a character boundary (so it is also
/// at most `max` characters, OpenTelemetry's measure), and gives back the
/// memory past it.
pub fn truncate(s: &mut String, max: usize) {
    if s.len() <= max {
        return;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    s.shrink_to_fit();
}

/// Caps everything in `span` a caller can make long — its name, every
/// string attribute value, its status message — at `max` bytes
/// ([`truncate`]; `[telemetry] max_attribute_bytes`). Its `trace_state`
/// is left whole: it is at most 512 bytes (`crate::proxy::spans`), and
/// cut it would be a different list.
pub fn cap(span: &mut Span, max: usize) {
    truncate(&mut span.name, max);
    for kv in &mut span.attributes {
        if let Some(AnyValue { value: Some(any_value::Value::StringValue(s)) }) = &mut kv.value {
            truncate(s, max);
        }
    }
    if let Some(status) = &mut span.status {
        truncate(&mut status.message, max);
    }
}

/// An estimate of the memory `span` holds: its own fields and the heap
/// they point to (strings and vectors by their capacity). What the export
/// queue's byte bound counts (`[telemetry] max_queued_bytes`); its
/// encoded size is smaller.
pub fn held_bytes(span: &Span) -> usize {
    use std::mem::size_of;
    let value = |v: &Option<AnyValue>| match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.capacity(),
        Some(any_value::Value::BytesValue(b)) => b.capacity(),
        _ => 0,
    };
    let attributes = |kvs: &Vec<KeyValue>| {
        kvs.capacity() * size_of::<KeyValue>()
            + kvs.iter().map(|kv| kv.key.capacity() + value(&kv.value)).sum::<usize>()
    };
    let links = span.links.capacity() * size_of::<Link>()
        + span
            .links
            .iter()
            .map(|l| {
                l.trace_id.capacity() + l.span_id.capacity() + l.trace_state.capacity() + attributes(&l.attributes)
            })
            .sum::<usize>();
    size_of::<Span>()
        + span.trace_id.capacity()
        + span.span_id.capacity()
        + span.parent_span_id.capacity()
        + span.trace_state.capacity()
        + span.name.capacity()
        + attributes(&span.attributes)
        + links
        + span.events.capacity() * size_of::<Event>()
        + span.events.iter().map(|e| e.name.capacity() + attributes(&e.attributes)).sum::<usize>()
        + span.status.as_ref().map_or(0, |s| s.message.capacity())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_value_is_cut_at_a_character_boundary_within_the_limit() {
        let mut s = "/cgi-bin/".to_owned() + &"é".repeat(100);
        truncate(&mut s, 20);
        // "/cgi-bin/" is 9 bytes, each "é" 2: 20 bytes would split one.
        assert_eq!(s, "/cgi-bin/ééééé");
        assert_eq!((s.len(), s.capacity()), (19, 19), "the rest is given back");
        let mut short = "send".to_owned();
        truncate(&mut short, 4);
        assert_eq!(short, "send");
    }

    #[test]
    fn a_span_is_capped_in_its_name_strings_and_status_and_its_estimate_shrinks() {
        let long = "x".repeat(60 * 1024);
        let mut span = Span {
            name: format!("GET {long}"),
            attributes: vec![kv("url.path", long.clone()), kv_int("http.response.status_code", 429), kv("a", "b")],
            status: Some(opentelemetry_proto::tonic::trace::v1::Status { message: long.clone(), code: 2 }),
            ..Default::default()
        };
        let before = held_bytes(&span);
        assert!(before > 3 * 60 * 1024, "{before}");
        cap(&mut span, 256);
        assert_eq!(span.name.len(), 256);
        assert_eq!(span.attributes[0].value, kv("url.path", &long[..256]).value);
        assert_eq!(span.attributes[1], kv_int("http.response.status_code", 429));
        assert_eq!(span.attributes[2], kv("a", "b"));
        assert_eq!(span.status.as_ref().map(|s| s.message.len()), Some(256));
        let after = held_bytes(&span);
        assert!(after < 3 * 256 + 1024, "{after}");
    }
}
