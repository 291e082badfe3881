//! Reading WeChat's answer for its `errcode` without getting in its way.
//!
//! WeChat reports errors as HTTP 200 with a small JSON body, under
//! unreliable Content-Types, and sends media and QR codes as large binary
//! bodies. So: a body that declares more than [`SNIFF_CAP`] bytes is never
//! read; otherwise the first bytes decide, and only a body that starts with
//! `{` (after whitespace) is buffered, up to the cap. Anything else streams
//! through untouched behind the bytes already read ([`sniff`]). The answer
//! phase ([`crate::proxy`]) and quota_sync read answers this way.

use bytes::{Bytes, BytesMut};
use http::header::CONTENT_LENGTH;
use http::response::Parts;
use http::Response;
use http_body_util::BodyExt;
use hyper::body::Incoming;

use std::time::Duration;

use crate::time::deadline_after;
use crate::transport::body::RelayBody;

/// Largest body buffered to look for an errcode.
pub const SNIFF_CAP: usize = 64 * 1024;

/// What the sniffer made of an upstream answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A JSON body with this non-zero errcode.
    Errcode(i64),
    /// A JSON body without errcode or with errcode 0, or a streamed body
    /// (media) on a 2xx status.
    Success,
    /// Anything else (non-2xx status, unparseable JSON).
    Unknown,
}

/// Why an answer could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SniffError {
    #[error("{0}")]
    Upstream(#[from] hyper::Error),
    /// The JSON-looking part was not all there within `body_timeout`.
    #[error("WeChat did not send its whole answer within {0:?} ([server] body_timeout)")]
    Stalled(Duration),
}

/// Reads at most `cap` bytes ([`SNIFF_CAP`] for a client's call) of a JSON-looking body, within
/// `stall` in all (nothing has gone to the client yet: a stall is a 504).
/// A body streamed on has at most `stall` between two frames
/// ([`RelayBody::stream`]).
pub async fn sniff(
    resp: Response<Incoming>,
    stall: Duration,
    cap: usize,
) -> Result<(Parts, RelayBody, Verdict), SniffError> {
    let (parts, mut body) = resp.into_parts();
    let ok = parts.status.is_success();
    let fallback = if ok { Verdict::Success } else { Verdict::Unknown };
    let declared = parts.headers.get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > cap as u64) || media(&parts) {
        return Ok((parts, RelayBody::stream(Bytes::new(), body, stall), fallback));
    }
    // An encoded body (wxgate asks for `identity`, but a server may encode
    // anyway) cannot be read here: its errcode is unknown, never "success".
    if encoded(&parts) {
        return Ok((parts, RelayBody::stream(Bytes::new(), body, stall), Verdict::Unknown));
    }
    // The body so far: its first data frame as it came (most answers are
    // one frame: nothing allocated nor copied), then, once another comes,
    // all of it in `more`.
    let (mut first, mut more) = (Bytes::new(), BytesMut::new());
    let mut by = None;
    loop {
        // A frame already there is taken without a timer (the usual small
        // answer); only a wait is bounded, by one deadline for the whole part.
        let mut next = std::pin::pin!(body.frame());
        let next = match std::future::poll_fn(|cx| std::task::Poll::Ready(std::future::Future::poll(next.as_mut(), cx)))
            .await
        {
            std::task::Poll::Ready(frame) => frame,
            std::task::Poll::Pending => {
                let by = *by.get_or_insert_with(|| deadline_after(stall));
                tokio::time::timeout_at(by, next).await.map_err(|_| SniffError::Stalled(stall))?
            }
        };
        let Some(frame) = next else {
            let bytes = if more.is_empty() { first } else { more.freeze() };
            let verdict = if looks_like_json(&bytes) { json_verdict(&bytes, ok) } else { fallback };
            return Ok((parts, RelayBody::full(bytes), verdict));
        };
        let frame = frame?;
        if let Ok(data) = frame.into_data() {
            if first.is_empty() && more.is_empty() {
                first = data;
            } else {
                if more.is_empty() {
                    more.extend_from_slice(&std::mem::take(&mut first));
                }
                more.extend_from_slice(&data);
            }
        }
        let so_far: &[u8] = if more.is_empty() { &first } else { &more };
        let started = so_far.iter().find(|b| !b.is_ascii_whitespace());
        if started.is_some_and(|&b| b != b'{') || so_far.len() > cap {
            let bytes = if more.is_empty() { first } else { more.freeze() };
            return Ok((parts, RelayBody::stream(bytes, body, stall), fallback));
        }
    }
}

/// Whether an answer's Content-Type says media (an image, audio, video,
/// or a download): never one of WeChat's JSON answers, whatever its first
/// bytes are. Every other type may be (WeChat's are unreliable).
fn media(parts: &Parts) -> bool {
    let Some(ct) = parts.headers.get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()) else { return false };
    let ct = ct.trim_start().as_bytes();
    let starts = |p: &[u8]| ct.len() >= p.len() && ct[..p.len()].eq_ignore_ascii_case(p);
    starts(b"image/") || starts(b"audio/") || starts(b"video/") || starts(b"application/octet-stream")
}

/// Whether an answer's body has a content coding other than identity.
fn encoded(parts: &Parts) -> bool {
    parts.headers.get_all(http::header::CONTENT_ENCODING).iter().any(|v| {
        v.to_str()
            .map_or(true, |e| e.split(',').any(|c| !c.trim().is_empty() && !c.trim().eq_ignore_ascii_case("identity")))
    })
}

fn looks_like_json(bytes: &[u8]) -> bool {
    bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{')
}

/// The errcode of a WeChat JSON body (top-level `errcode`, number or
/// numeric string); `None` when the body is not JSON. WeChat's usual shape
/// is read without a parser ([`errcode_exact`]); any other goes to
/// serde_json. Both give the same answer for every body.
pub fn errcode(bytes: &[u8]) -> Option<Option<i64>> {
    if let Some(code) = errcode_exact(bytes) {
        return Some(Some(code));
    }
    errcode_parsed(bytes)
}

/// `{"errcode":N,"errmsg":"M"}` byte for byte as WeChat writes it: no
/// whitespace, N a JSON integer that fits an i64, M printable ASCII
/// without quotes or escapes. Such a body is valid JSON with that errcode;
/// anything else is `None` (and left to [`errcode_parsed`]).
fn errcode_exact(bytes: &[u8]) -> Option<i64> {
    let rest = bytes.strip_prefix(b"{\"errcode\":")?;
    let end = rest.iter().position(|b| !(b.is_ascii_digit() || *b == b'-'))?;
    let (number, rest) = rest.split_at(end);
    let digits = number.strip_prefix(b"-").unwrap_or(number);
    // JSON: no sign but a leading minus, no leading zero; serde_json reads
    // `-0` as a float (no i64): left to it.
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) || (digits[0] == b'0' && number.len() > 1) {
        return None;
    }
    let code: i64 = std::str::from_utf8(number).ok()?.parse().ok()?;
    let message = rest.strip_prefix(b",\"errmsg\":\"")?.strip_suffix(b"\"}")?;
    message.iter().all(|&b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\').then_some(code)
}

fn errcode_parsed(bytes: &[u8]) -> Option<Option<i64>> {
    #[derive(serde::Deserialize)]
    struct Envelope {
        errcode: Option<serde_json::Value>,
    }
    let env: Envelope = serde_json::from_slice(bytes).ok()?;
    Some(match env.errcode {
        None => None,
        Some(serde_json::Value::Number(n)) => n.as_i64(),
        Some(serde_json::Value::String(s)) => s.trim().parse().ok(),
        Some(_) => None,
    })
}

fn json_verdict(bytes: &[u8], ok: bool) -> Verdict {
    match errcode(bytes) {
        Some(Some(code)) if code != 0 => Verdict::Errcode(code),
        Some(_) if ok => Verdict::Success,
        _ => Verdict::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_wechat_envelopes() {
        assert_eq!(
            errcode(br#"{"errcode":45009,"errmsg":"reach max api daily quota limit rid: 1"}"#),
            Some(Some(45009))
        );
        assert_eq!(errcode(br#"{"access_token":"x","expires_in":7200}"#), Some(None));
        assert_eq!(errcode(br#"{"errcode":"45033"}"#), Some(Some(45033)));
        assert_eq!(errcode(br#"{"errcode":0,"errmsg":"ok"}"#), Some(Some(0)));
        assert_eq!(errcode(b"{not json"), None);
        assert_eq!(json_verdict(br#"{"errcode":0}"#, true), Verdict::Success);
        assert_eq!(json_verdict(br#"{"errcode":40001}"#, true), Verdict::Errcode(40001));
    }

    /// The parser-free reading agrees with serde_json on WeChat's shape and
    /// on every near miss, and takes only bodies serde_json reads the same.
    #[test]
    fn the_exact_shape_reads_as_serde_json_does() {
        let bodies: &[&[u8]] = &[
            br#"{"errcode":0,"errmsg":"ok"}"#,
            br#"{"errcode":45009,"errmsg":"reach max api daily quota limit rid: 6565-1"}"#,
            br#"{"errcode":-1,"errmsg":"system error"}"#,
            br#"{"errcode":-0,"errmsg":"ok"}"#,
            br#"{"errcode":007,"errmsg":"ok"}"#,
            br#"{"errcode":00,"errmsg":"ok"}"#,
            br#"{"errcode":-,"errmsg":"ok"}"#,
            br#"{"errcode":1-2,"errmsg":"ok"}"#,
            br#"{"errcode":--1,"errmsg":"ok"}"#,
            br#"{"errcode":,"errmsg":"ok"}"#,
            br#"{"errcode":99999999999999999999,"errmsg":"ok"}"#,
            br#"{"errcode":9223372036854775807,"errmsg":"ok"}"#,
            br#"{"errcode":1,"errmsg":"a \" b"}"#,
            br#"{"errcode":1,"errmsg":"a "b"}"#,
            br#"{"errcode":1,"errmsg":"ok"} "#,
            br#"{"errcode":1,"errmsg":"ok"}}"#,
            br#"{"errcode":1,"errmsg":"ok"},"#,
            br#"{"errcode":1,"errmsg":"ok","errcode":2}"#,
            br#"{"errcode":1,"errmsg":"tab	here"}"#,
            "{\"errcode\":1,\"errmsg\":\"\u{4e0d}\"}".as_bytes(),
            b"{\"errcode\":1,\"errmsg\":\"\x01\"}",
            br#"{"errcode":1,"errmsg":""}"#,
            br#"{"errcode":1,"errmsg":"#,
            br#"{"errcode":1}"#,
            br#"{"errcode":"1","errmsg":"ok"}"#,
        ];
        for body in bodies {
            let exact = errcode_exact(body);
            let parsed = errcode_parsed(body);
            assert_eq!(errcode(body), parsed, "{}", String::from_utf8_lossy(body));
            if let Some(code) = exact {
                assert_eq!(parsed, Some(Some(code)), "{}", String::from_utf8_lossy(body));
            }
        }
        assert_eq!(
            errcode_exact(br#"{"errcode":45009,"errmsg":"reach max api daily quota limit rid: 1"}"#),
            Some(45009)
        );
        assert_eq!(errcode_exact(br#"{"errcode":0,"errmsg":"ok"}"#), Some(0));
    }
}
