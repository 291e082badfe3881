//! One call's context: what the phases of [`crate::proxy`] learn about a call
//! and hand on, from its request line to its access-log line.

use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Response};

use crate::accounts::learn::Learn;
use crate::admit::Admitted;
use crate::body::RelayBody;
use crate::callers::Caller;
use crate::clock::Micros;
use crate::config::Config;
use crate::error::ProxyError;
use crate::limit::Rule;
use crate::metrics::{Outcome, RuleMetrics};
use crate::upstream::{Upstream, UpstreamError};

/// Account used when a call names none.
pub const DEFAULT_ACCOUNT: &str = "default";

/// What the phases know of one call. Filled in phase order: a field is set
/// by the phase named on it and read by later ones.
pub struct Call {
    pub method: Method,
    /// The path only: the query carries `access_token` and other secrets.
    pub path: String,
    /// The config this call runs under from start to end: a reload never
    /// changes it midway.
    pub config: Arc<Config>,
    /// caller: who the call is from (`X-Wx-Caller`, else `[server] caller`,
    /// else `default`); until then, the fallback of `[server] caller`.
    pub caller: Caller,
    /// accept: the account an `@account` first path segment names (then
    /// `path` is without it); taken by identify.
    pub named: Option<String>,
    /// identify: the WeChat account (appid / corpid alias) the call is for.
    pub account: String,
    /// identify: what a token request's answer will teach (`crate::accounts::learn`).
    pub learn: Option<Learn>,
    /// identify: a token request's or clear_quota's body, read whole; forwarded as it is.
    pub body: Option<Bytes>,
    /// identify: a `clear_quota` call, and the appid its body names
    /// (`crate::quota_clear`).
    pub clearing: Option<crate::quota_clear::Clearing>,
    /// token cache: the fetch this call makes for every asker of its token
    /// (`crate::token_cache`), reported by inspect (or released on drop).
    pub token_fetch: Option<crate::token_cache::cache::Fetch>,
    /// route: the rule the path maps to (`None`: forwarded unthrottled).
    pub rule: Option<Arc<Rule>>,
    /// route: the rule's metrics (the `_none` series without a rule).
    pub metrics: Option<Arc<RuleMetrics>>,
    /// decide: the admission (`None` without a rule).
    pub admitted: Option<Admitted>,
    /// What became of the call, for metrics and the access log.
    pub outcome: Outcome,
    /// WeChat's errcode, when its answer had one (0: success).
    pub errcode: Option<i64>,
    /// Why wxgate refused the client's request (400, 408, 413), for the
    /// access log: the errmsg the client got, which never quotes the query
    /// or the body.
    pub refusal: Option<String>,
    /// forward: the upstream that answered, or the last one tried (index
    /// into that client's list), for the access log.
    pub upstream: Option<(Arc<Upstream>, usize)>,
    /// A call served inside an `[intercept]` tunnel: the host it was for
    /// (its upstream, its count); `None` for a direct call.
    pub intercepted: Option<Arc<crate::intercept::Host>>,
    pub decision_us: Micros,
    pub upstream_us: Micros,
    pub held_us: Micros,
}

impl Call {
    pub fn new(method: Method, path: &str, config: Arc<Config>, caller: Caller) -> Call {
        Call {
            method,
            path: path.to_owned(),
            config,
            caller,
            named: None,
            account: String::new(),
            learn: None,
            body: None,
            clearing: None,
            token_fetch: None,
            rule: None,
            metrics: None,
            admitted: None,
            outcome: Outcome::forwarded,
            errcode: None,
            refusal: None,
            upstream: None,
            intercepted: None,
            decision_us: 0,
            upstream_us: 0,
            held_us: 0,
        }
    }
}

/// A call that ends before its last phase. Each phase either hands on to
/// the next or stops the call with one of these; [`crate::proxy::handle`]
/// turns it into the one answer the client gets.
pub enum Early {
    /// wxgate refuses or fails the call: a WeChat-shaped answer, made in one
    /// place ([`ProxyError::into_response`]).
    Refused(ProxyError),
    /// A phase answered the call itself (e.g. from a cache): sent as it is.
    Answered(Box<Response<RelayBody>>),
}

impl From<ProxyError> for Early {
    fn from(e: ProxyError) -> Early {
        Early::Refused(e)
    }
}

impl From<UpstreamError> for Early {
    fn from(e: UpstreamError) -> Early {
        Early::Refused(ProxyError::Upstream(e))
    }
}
