//! Reading WeChat's answer for an `errcode` without getting in its way.
//!
//! WeChat reports errors as HTTP 200 with a small JSON body, under unreliable
//! Content-Types, and sends media and QR codes as large binary bodies. So: a
//! body that declares more than [`SNIFF_CAP`] bytes is never read; otherwise
//! the first bytes decide, and only a body that starts with `{` (after
//! whitespace) is buffered, up to the cap. Anything else streams through
//! untouched behind the bytes already read.

use bytes::{Bytes, BytesMut};
use http::header::CONTENT_LENGTH;
use http::response::Parts;
use http::Response;
use http_body_util::BodyExt;
use hyper::body::Incoming;

use crate::body::RelayBody;

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

/// Reads at most [`SNIFF_CAP`] bytes of a JSON-looking body.
pub async fn sniff(resp: Response<Incoming>) -> Result<(Parts, RelayBody, Verdict), hyper::Error> {
    let (parts, mut body) = resp.into_parts();
    let ok = parts.status.is_success();
    let fallback = if ok { Verdict::Success } else { Verdict::Unknown };
    let declared = parts.headers.get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > SNIFF_CAP as u64) {
        return Ok((parts, RelayBody::stream(Bytes::new(), body), fallback));
    }
    let mut buf = BytesMut::new();
    loop {
        let Some(frame) = body.frame().await else {
            let bytes = buf.freeze();
            let verdict = if looks_like_json(&bytes) { json_verdict(&bytes, ok) } else { fallback };
            return Ok((parts, RelayBody::full(bytes), verdict));
        };
        let frame = frame?;
        if let Ok(data) = frame.into_data() {
            buf.extend_from_slice(&data);
        }
        let started = buf.iter().find(|b| !b.is_ascii_whitespace());
        if started.is_some_and(|&b| b != b'{') || buf.len() > SNIFF_CAP {
            return Ok((parts, RelayBody::stream(buf.freeze(), body), fallback));
        }
    }
}

fn looks_like_json(bytes: &[u8]) -> bool {
    bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{')
}

/// The errcode of a WeChat JSON body (top-level `errcode`, number or numeric string).
pub fn errcode(bytes: &[u8]) -> Option<Option<i64>> {
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
}
