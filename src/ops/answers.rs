//! The admin listener's answers: JSON or a page, with their status.

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Response, StatusCode};
use http_body_util::Full;
use serde_json::{json, Value};

/// An admin answer (bodies are small and whole).
pub type Answer = Response<Full<Bytes>>;

pub fn answer(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Answer {
    let mut resp = Response::new(Full::new(body.into()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

pub fn json_answer(status: StatusCode, value: Value) -> Answer {
    answer(status, "application/json", value.to_string())
}

pub fn error(status: StatusCode, message: impl std::fmt::Display) -> Answer {
    json_answer(status, json!({ "error": message.to_string() }))
}
