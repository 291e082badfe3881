//! One call's context: what the phases of [`crate::proxy`] learn about a
//! call and hand on, from its request line to its access-log line. Fields
//! are grouped by the phase that sets them; a later phase reads them. What
//! a feature keeps of a call is in its own context ([`Call::features`]).

use std::sync::Arc;

use bytes::Bytes;
use http::Method;

use crate::admit::callers::Caller;
use crate::admit::Admitted;
use crate::config::Config;
use crate::features::hooks::Who;
use crate::features::Contexts;
use crate::limit::Rule;
use crate::telemetry::metrics::{Outcome, RuleMetrics};
use crate::time::Micros;
use crate::transport::upstream::Upstream;

/// What the phases know of one call.
pub struct Call {
    /// The request as it came, set when it arrives and by accept.
    pub arrived: Arrived,
    /// route: the call's rule.
    pub route: Routed,
    /// identify (and its hooks): who the call is from and for.
    pub who: Who,
    /// Each feature's context of this call ([`crate::features::hooks::Feature::Ctx`]).
    pub features: Contexts,
    /// The request's body, when a hook or meter read it whole: forwarded as it is.
    pub body: Option<Bytes>,
    /// meter: what the call costs and whom it is to, read from its body
    /// (`None`: its rule counts calls).
    pub meter: Option<Metered>,
    /// decide: the admission.
    pub admission: Admission,
    /// forward: where it went.
    pub sent: Sent,
    /// answer: WeChat's errcode, when its answer had one (0: success).
    pub errcode: Option<i64>,
    /// What became of the call, for metrics and the access log; set by the
    /// phase that ends it (decide, a hook's early answer, answer, respond).
    pub outcome: Outcome,
    /// respond: why wxgate refused the client's request (400, 408, 413),
    /// for the access log: the errmsg the client got, which never quotes
    /// the query or the body.
    pub refusal: Option<String>,
    /// The call's trace (`None`: tracing off), set when it arrives
    /// ([`crate::proxy::spans`]).
    pub trace: Option<Box<crate::telemetry::trace::Traced>>,
    /// Most bytes of WeChat's JSON answer read whole (a client's call:
    /// [`crate::transport::sniff::SNIFF_CAP`]; an own call may ask more).
    pub answer_cap: usize,
}

/// Set when the call arrives, and by accept.
pub struct Arrived {
    pub method: Method,
    /// The path only (the query carries `access_token` and other secrets);
    /// without an `@account` prefix.
    pub path: String,
    /// The config this call runs under from start to end: a reload never
    /// changes it midway.
    pub config: Arc<Config>,
    /// A call served inside an `[intercept]` tunnel: the host it was for
    /// (its upstream, its count); `None` for a direct call.
    pub intercepted: Option<Arc<crate::transport::intercept::Host>>,
    /// accept: the account an `@account` first path segment names; taken
    /// by identify.
    pub named: Option<String>,
    /// accept: the call's WeChat domain (index into `Config::domains`):
    /// an intercepted host's, a `/<host>/` first segment's, else 0.
    pub domain: usize,
}

pub use crate::features::hooks::Metered;

/// Set by route.
#[derive(Default)]
pub struct Routed {
    /// The rule the path maps to (`None`: forwarded unthrottled).
    pub rule: Option<Arc<Rule>>,
    /// The rule's metrics (the `_none` series without a rule).
    pub metrics: Option<Arc<RuleMetrics>>,
    /// A route wxgate answers itself (queued delivery's `/v1/deliveries`),
    /// its caller identified: never forwarded, not a call of WeChat's API
    /// (logged as `answered`, counted in no call series).
    pub local: bool,
}

/// Set by decide.
#[derive(Default)]
pub struct Admission {
    /// The admission (`None` without a rule, or refused).
    pub admitted: Option<Admitted>,
    pub decision_us: Micros,
    pub held_us: Micros,
}

/// Set by forward.
#[derive(Default)]
pub struct Sent {
    /// The upstream that answered, or the last one tried (index into that
    /// client's list), for the access log.
    pub upstream: Option<(Arc<Upstream>, usize)>,
    pub upstream_us: Micros,
}

impl Call {
    pub fn new(method: Method, path: &str, config: Arc<Config>, caller: Caller) -> Call {
        Call {
            arrived: Arrived { method, path: path.to_owned(), config, intercepted: None, named: None, domain: 0 },
            route: Routed::default(),
            who: Who { caller, account: String::new(), wecom: None, proven: false, own: false, queued: false },
            features: Contexts::default(),
            body: None,
            meter: None,
            admission: Admission::default(),
            sent: Sent::default(),
            errcode: None,
            outcome: Outcome::forwarded,
            refusal: None,
            trace: None,
            answer_cap: crate::transport::sniff::SNIFF_CAP,
        }
    }

    /// The config the call runs under.
    pub fn config(&self) -> &Config {
        &self.arrived.config
    }
}
