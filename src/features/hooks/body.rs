//! Request bodies read whole before a call goes on (forwarded byte for
//! byte afterwards): by a feature that must read what WeChat will read
//! (token requests, clear_quota) and by the meter phase (recipients). Here
//! so that phases and features share them without naming each other.

use std::time::Duration;

use bytes::Bytes;
use http::header::CONTENT_LENGTH;
use http::Request;
use hyper::body::Incoming;

use crate::error::ProxyError;
use crate::transport::request_body::{read_whole, ReadError};

/// The request's whole body (`None`: it has none), read within `stall`
/// of no progress, up to `cap` bytes; `what` names what wxgate reads it for
/// in the 413.
pub async fn read_body_upto(
    req: &mut Request<Incoming>,
    stall: Duration,
    cap: u64,
    what: &str,
) -> Result<Option<Bytes>, ProxyError> {
    let too_large =
        || ProxyError::TooLarge(format!("this request's body is larger than the {cap} bytes wxgate reads of {what}"));
    let declared = req.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > cap) {
        return Err(too_large());
    }
    if http_body::Body::is_end_stream(req.body()) {
        return Ok(None);
    }
    match read_whole(req.body_mut(), cap, stall).await {
        Ok(read) => Ok(Some(read)),
        Err(ReadError::TooLarge(_)) => Err(too_large()),
        Err(e) => Err(ProxyError::Upstream(e.into())),
    }
}

/// A request body's JSON, read as WeChat would have to: `Ok(None)` for a
/// body that is not JSON (WeChat refuses it too; nothing is learned from
/// it), 400 for JSON that gives a key twice in any object (parsers differ
/// on which one counts).
pub fn request_json(body: Option<&[u8]>) -> Result<Option<serde_json::Value>, ProxyError> {
    let Some(body) = body else { return Ok(None) };
    match serde_json::from_slice::<Unique>(body) {
        Ok(Unique(value)) => Ok(Some(value)),
        Err(e) if e.to_string().starts_with(DUPLICATE) => Err(ProxyError::BadRequest(format!(
            "the request body {}: wxgate and WeChat might read different values",
            e.to_string().split(" at line").next().unwrap_or(DUPLICATE)
        ))),
        Err(_) => Ok(None),
    }
}

const DUPLICATE: &str = "gives key";

/// A JSON value in which no object gives a key twice (`serde_json::Value`
/// keeps the last one silently).
struct Unique(serde_json::Value);

impl<'de> serde::Deserialize<'de> for Unique {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Unique, D::Error> {
        d.deserialize_any(UniqueVisitor).map(Unique)
    }
}

struct UniqueVisitor;

impl<'de> serde::de::Visitor<'de> for UniqueVisitor {
    type Value = serde_json::Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<serde_json::Value, E> {
        Ok(v.into())
    }
    fn visit_i64<E>(self, v: i64) -> Result<serde_json::Value, E> {
        Ok(v.into())
    }
    fn visit_u64<E>(self, v: u64) -> Result<serde_json::Value, E> {
        Ok(v.into())
    }
    fn visit_f64<E>(self, v: f64) -> Result<serde_json::Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(serde_json::Value::Null, serde_json::Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<serde_json::Value, E> {
        Ok(v.into())
    }
    fn visit_string<E>(self, v: String) -> Result<serde_json::Value, E> {
        Ok(v.into())
    }
    fn visit_unit<E>(self) -> Result<serde_json::Value, E> {
        Ok(serde_json::Value::Null)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<serde_json::Value, A::Error> {
        let mut out = Vec::new();
        while let Some(Unique(v)) = seq.next_element()? {
            out.push(v);
        }
        Ok(out.into())
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<serde_json::Value, A::Error> {
        let mut out = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                return Err(serde::de::Error::custom(format!("{DUPLICATE} \"{key}\" twice")));
            }
            let Unique(v) = map.next_value()?;
            out.insert(key, v);
        }
        Ok(out.into())
    }
}
