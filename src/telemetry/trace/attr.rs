//! A span's (or a resource's) attributes in OTLP's message.

use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};

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
