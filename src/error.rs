//! Every answer wxgate writes itself, in one place, WeChat-shaped:
//! `{"errcode":N,"errmsg":"wxgate: ..."}` with an HTTP status that says
//! what happened (400, 408, 413, 429, 502, 503, 504). An SDK that reads
//! the body of a non-2xx answer sees a WeChat errcode; one that turns every
//! non-2xx status into a transport error (wechatpy, WxJava's Apache
//! backend) does not: for those, a rule's `throttle_status = 200` makes
//! refusals HTTP 200 with the same body and headers (set in [`crate::proxy`]).

use http::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, Response, StatusCode};

use crate::body::RelayBody;
use crate::clock::Micros;
use crate::limit::Reason;
use crate::store::StoreError;
use crate::upstream::UpstreamError;

/// WeChat's "api freq out of limit"; what a throttled call reports.
pub const ERRCODE_THROTTLED: i64 = 45009;
/// WeChat's "invalid args"; what a malformed request reports.
pub const ERRCODE_BAD_REQUEST: i64 = 40097;
/// WeChat's "system error, retry later"; upstream unreachable or too slow.
pub const ERRCODE_SYSTEM: i64 = -1;

pub const REASON_HEADER: &str = "x-wxgate-reason";
pub const RULE_HEADER: &str = "x-wxgate-rule";
/// `X-Wxgate-Reason` of a call its caller's flood guard refused.
pub const REASON_CALLER_RATE: &str = "caller_rate";

/// A call wxgate answers itself.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("{0}")]
    BadRequest(String),
    #[error("rule \"{rule}\" throttled this call ({reason}); retry after {secs}s", reason = .reason.as_str(), secs = retry_after_secs(*.wait_us))]
    Throttled { rule: String, reason: Reason, wait_us: Micros },
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    /// The store could not decide and `[store] fallback = "deny"`.
    #[error("store unavailable: {0}")]
    Unavailable(StoreError),
    #[error("{0}")]
    TooLarge(String),
    /// A token request waited `[tokens] wait` for another request's fetch
    /// of the same token, which did not end in time.
    #[error("another request is fetching this access token and did not finish within {0:?} ([tokens] wait); retry")]
    TokenWait(std::time::Duration),
    /// The caller's flood guard (`[[caller]] rate`) refused the call.
    #[error("caller \"{caller}\" is over its rate of {rate} on this instance ([[caller]] rate); retry after {secs}s", secs = retry_after_secs(*.wait_us))]
    CallerRate { caller: std::sync::Arc<str>, rate: crate::config::CallerRate, wait_us: Micros },
}

/// `Retry-After` for a wait: whole seconds, rounded up, at least 1.
pub fn retry_after_secs(wait_us: Micros) -> i64 {
    ((wait_us + 999_999) / 1_000_000).max(1)
}

impl ProxyError {
    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ProxyError::Throttled { .. } | ProxyError::CallerRate { .. } => StatusCode::TOO_MANY_REQUESTS,
            ProxyError::Upstream(
                UpstreamError::Timeout(_) | UpstreamError::ConnectTimeout(_) | UpstreamError::BodyStalled(_),
            ) => StatusCode::GATEWAY_TIMEOUT,
            ProxyError::Upstream(UpstreamError::BodyTooLarge) | ProxyError::TooLarge(_) => {
                StatusCode::PAYLOAD_TOO_LARGE
            }
            ProxyError::Upstream(UpstreamError::BadBody(_)) => StatusCode::BAD_REQUEST,
            ProxyError::Upstream(UpstreamError::ClientStalled(_)) => StatusCode::REQUEST_TIMEOUT,
            ProxyError::Upstream(_) => StatusCode::BAD_GATEWAY,
            ProxyError::Unavailable(_) | ProxyError::TokenWait(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    fn errcode(&self) -> i64 {
        match self {
            ProxyError::BadRequest(_) | ProxyError::TooLarge(_) => ERRCODE_BAD_REQUEST,
            ProxyError::Upstream(e) if e.client_fault() => ERRCODE_BAD_REQUEST,
            ProxyError::Throttled { .. } | ProxyError::CallerRate { .. } => ERRCODE_THROTTLED,
            ProxyError::Upstream(_) | ProxyError::Unavailable(_) | ProxyError::TokenWait(_) => ERRCODE_SYSTEM,
        }
    }

    /// The one mapping from an error to what the client sees.
    pub fn into_response(self) -> Response<RelayBody> {
        let body = serde_json::json!({ "errcode": self.errcode(), "errmsg": format!("wxgate: {self}") });
        let mut resp = Response::new(RelayBody::full(body.to_string()));
        *resp.status_mut() = self.status();
        let h = resp.headers_mut();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        match &self {
            ProxyError::Throttled { rule, reason, wait_us } => mark_throttled(h, rule, *reason, *wait_us),
            ProxyError::CallerRate { wait_us, .. } => {
                h.insert(RETRY_AFTER, HeaderValue::from(retry_after_secs(*wait_us)));
                h.insert(REASON_HEADER, HeaderValue::from_static(REASON_CALLER_RATE));
            }
            ProxyError::Unavailable(_) | ProxyError::TokenWait(_) => {
                h.insert(RETRY_AFTER, HeaderValue::from(1));
                h.insert(REASON_HEADER, HeaderValue::from_static("unavailable"));
            }
            _ => {}
        }
        resp
    }
}

/// Adds `Retry-After`, `X-Wxgate-Reason` and `X-Wxgate-Rule` to a refusal.
pub fn mark_throttled(headers: &mut HeaderMap, rule: &str, reason: Reason, wait_us: Micros) {
    headers.insert(RETRY_AFTER, HeaderValue::from(retry_after_secs(wait_us)));
    headers.insert(REASON_HEADER, HeaderValue::from_static(reason.as_str()));
    if let Ok(v) = HeaderValue::from_str(rule) {
        headers.insert(RULE_HEADER, v);
    }
}
