//! The hooks features plug into (pingora's `ProxyHttp` is the model): the
//! phases of [`crate::proxy`] call each hook of every feature, in the order
//! of the list in [`crate::features`], and no phase names a feature.
//!
//! A feature is a value that holds its shared state (built once, by
//! [`crate::features::Features::new`]), and has a per-call context of its
//! own ([`Feature::Ctx`], created empty for every call and handed to each
//! of its hooks): what it learns of a call in one phase and uses in a
//! later one stays in its context, never in the phases' types.
//!
//! | hook | when it runs | what it sees and may set | an early answer |
//! |---|---|---|---|
//! | [`Feature::on_request`] | identify: after route, once the caller is known and the grant of a named account checked | the request ([`Requesting`]): its headers, its body (a hook may read it whole), the call's account; may set the account and whether it is proven | `Err` refuses the call (or answers it) before anything is decided |
//! | [`Feature::before_decide`] | after identify and meter, before the store decides | the request as identify read it ([`Asking`]) | `Err(Early::Answered)` answers the call without deciding or forwarding it; `Err(Early::Refused)` refuses it |
//! | [`Feature::before_forward`] | after decide, before the call is sent: the call was admitted | the target about to be sent ([`Sending`]); may change its query | `Err(Early::Refused)` answers the call instead of sending it (its admission stays counted) |
//! | [`Feature::keep_body`] | forward, before the body is sent | its context | none: `true` keeps a small body for one resend |
//! | [`Feature::resend`] | answer: WeChat's answer was read, before any other answer hook | the answer ([`Answered`]) | none: `Some(target)` sends the call once more to `target` (its body kept), and the second answer is the one the client gets |
//! | [`Feature::on_answer`] | answer: WeChat's answer head and, when small, its body were read; before the client's answer is built | the call and WeChat's verdict ([`Answered`]); may set `penalty` | none: WeChat has answered, and the client gets that answer |
//! | [`Feature::on_response`] | answer, building the client's answer to a forwarded call | the call ([`Answered`]); may add headers | none; a status is never set here (the one table in [`crate::error`] chooses it) |
//!
//! Every hook's default does nothing. A call wxgate makes itself
//! ([`OwnCall`], sent through [`Env::calls`]) runs the same hooks in the
//! same order, with no client: what its maker left for the features is in
//! its [`Seeds`] ([`Requesting::seeds`]). Hooks run with static dispatch
//! (one field per feature), so they cost what the code in them costs.

pub mod body;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use http::uri::PathAndQuery;
use http::{HeaderMap, Method, Request};
use hyper::body::Incoming;

use crate::admit::callers::Caller;
use crate::admit::core::Core;
use crate::admit::Admitted;
use crate::config::Config;
use crate::error::{Early, ProxyError};
use crate::limit::Rule;
use crate::time::Micros;
use crate::transport::sniff::Verdict;

/// What every hook is given of the shared state: the [`Core`] (store,
/// clock, metrics, upstream, ...) and the way to make a call of one's own.
#[derive(Clone, Copy)]
pub struct Env<'a> {
    pub core: &'a Core,
    /// Runs a call wxgate makes itself through the phases ([`OwnCall`]).
    pub calls: &'a dyn Calls,
}

/// A call wxgate makes itself (a token or ticket fetch, a quota/get, a
/// queued job's send on its caller's behalf): no client, an account
/// already known.
pub struct OwnCall {
    /// The config it runs under.
    pub config: Arc<Config>,
    /// The account it counts against.
    pub account: String,
    /// Its WeChat domain (index into `Config::domains`): its rules and upstreams.
    pub domain: usize,
    pub method: Method,
    /// The path and query to send.
    pub target: PathAndQuery,
    /// Its whole body.
    pub body: Bytes,
    /// What its maker leaves for the features' `on_request` hooks (a token
    /// cache slot's fetch, what its answer teaches).
    pub seeds: Seeds,
    /// A queued job's send: the caller that queued it (decided and counted
    /// as that caller's, never held, never from the rule's reserve).
    /// `None`: wxgate's own call (the rule's reserve is for it).
    pub queued_by: Option<Caller>,
    /// A queued job's send: its submission's span, which the send's span
    /// links to (`crate::proxy::spans`).
    pub submitted: Option<crate::telemetry::trace::SpanContext>,
    /// Most bytes of WeChat's JSON answer read whole into
    /// [`OwnAnswer::body`] (at least a client call's 64 KiB; the
    /// directory's member lists are larger).
    pub answer_cap: usize,
}

/// Values of any type, each taken once by the hook that knows its type
/// (`http::Extensions` would want them `Clone`; a slot's fetch is not).
#[derive(Default)]
pub struct Seeds(Vec<Box<dyn std::any::Any + Send + Sync>>);

impl Seeds {
    pub fn insert<T: Send + Sync + 'static>(&mut self, value: T) {
        self.0.push(Box::new(value));
    }

    /// The value of type `T`, taken out (`None`: none was left).
    pub fn take<T: 'static>(&mut self) -> Option<T> {
        let at = self.0.iter().position(|v| v.is::<T>())?;
        self.0.swap_remove(at).downcast::<T>().ok().map(|v| *v)
    }
}

/// The caller label wxgate's own calls are decided and counted under.
pub const OWN_CALLER: &str = "wxgate";

/// What WeChat answered to a call wxgate made itself.
pub struct OwnAnswer {
    /// The HTTP status WeChat answered with.
    pub status: u16,
    /// Its errcode (0: success; `None`: not a WeChat JSON answer).
    pub errcode: Option<i64>,
    /// Its body, when small enough to be read whole.
    pub body: Option<Bytes>,
    /// How long its decision held it for its slot.
    pub held_us: crate::time::Micros,
    /// How long WeChat took to answer (from sending its request).
    pub upstream_us: crate::time::Micros,
}

/// The future of an own call.
pub type OwnFuture<'a> = Pin<Box<dyn Future<Output = Result<OwnAnswer, ProxyError>> + Send + 'a>>;

/// Runs calls wxgate makes itself through the phases a client's call runs,
/// in the same order, with every feature's hooks ([`crate::proxy::own`]).
/// A trait object, so that the features below the phases can make one.
pub trait Calls: Send + Sync {
    fn call(&self, own: OwnCall) -> OwnFuture<'_>;
}

/// Who a call is from and for: set by identify and its hooks.
pub struct Who {
    /// Who the call is from (`X-Wx-Caller`, else `[server] caller`, else
    /// `default`; [`OWN_CALLER`] for wxgate's own calls).
    pub caller: Caller,
    /// The WeChat account (appid / corpid alias) the call is for: the
    /// name its token, grants, `[[quota]]` and `[[account]]` are found by.
    pub account: String,
    /// The `[[account]]` the account names when it is a WeCom app's
    /// (`kind = "wecom"`), set by identify once the account is known: the
    /// call counts under its corpid ([`Who::counted`]), and a body's
    /// agentid must be its AgentId.
    pub wecom: Option<Arc<crate::config::accounts::SecretAccount>>,
    /// The account is proven, not only named: the call's token was issued
    /// to it, or wxgate adds the account's own token.
    pub proven: bool,
    /// A call wxgate makes itself ([`OwnCall`]): no client.
    pub own: bool,
    /// A queued job's send ([`OwnCall::queued_by`]): decided as its
    /// caller's live calls are, but never held and never from the reserve.
    pub queued: bool,
}

impl Who {
    /// The account the call's decision state is kept under (its limits,
    /// penalties, refunds, concurrency slots, learned windows, forecasts):
    /// a WeCom app's corpid, as WeCom meters API frequency per corp
    /// (several apps of one corp, each an `[[account]]` with a name of its
    /// own, share it); else the account itself.
    pub fn counted(&self) -> &str {
        match &self.wecom {
            Some(app) => &app.id,
            None => &self.account,
        }
    }
}

/// The appid WeChat reads in a request (a token request's, a clear_quota's):
/// set by the hook that recognises the request, read by the account's.
pub struct Appid {
    /// The appid, if the request gives a valid one.
    pub id: Option<String>,
    /// The parameter or field that gives it (for refusals).
    pub field: &'static str,
}

/// What a feature sees of a request being identified.
pub struct Requesting<'a> {
    pub config: &'a Arc<Config>,
    pub method: &'a Method,
    /// The path (without an `@account` prefix).
    pub path: &'a str,
    /// The path and query to be sent.
    pub target: &'a PathAndQuery,
    /// The call's rule (`None`: forwarded unthrottled).
    pub rule: Option<&'a Arc<Rule>>,
    /// What a call wxgate makes itself carries for the features.
    pub seeds: &'a mut Seeds,
    /// The body, when read whole (by a hook, [`Requesting::read_body`]; an
    /// own call's always): forwarded as it is.
    pub body: &'a mut Option<Bytes>,
    /// The live request (`None`: an own call); its body unread unless `body` is set.
    pub incoming: Option<&'a mut Request<Incoming>>,
    /// The account the call names (`X-Wx-Account`, `@account`), its grant checked.
    pub named: Option<String>,
    pub who: &'a mut Who,
    /// The appid WeChat reads in this request, when a hook recognised one.
    pub appid: Option<Appid>,
    /// Under `caller_auth = "required"`: the caller is proven by its key.
    pub authenticated: bool,
}

impl Requesting<'_> {
    /// A call wxgate makes itself (its account and caller are set; nothing
    /// is read from a client).
    pub fn own(&self) -> bool {
        self.incoming.is_none()
    }

    /// The whole body (read now if it was not: see [`body::read_body_upto`]).
    pub async fn read_body(&mut self, cap: u64, what: &str) -> Result<Option<&Bytes>, ProxyError> {
        if self.body.is_none() {
            if let Some(req) = self.incoming.as_deref_mut() {
                *self.body = body::read_body_upto(req, self.config.server.body_timeout, cap, what).await?;
            }
        }
        Ok(self.body.as_ref())
    }
}

/// What a feature sees of a call before it is decided.
pub struct Asking<'a> {
    pub config: &'a Arc<Config>,
    pub method: &'a Method,
    /// The path (without an `@account` prefix).
    pub path: &'a str,
    /// The path and query to be sent.
    pub target: &'a PathAndQuery,
    /// The request's body, when it was read whole.
    pub body: Option<&'a Bytes>,
    pub who: &'a Who,
    pub rule: Option<&'a Rule>,
    /// The call's WeChat domain (index into `Config::domains`).
    pub domain: usize,
    /// What the call costs and whom it is to, as meter read them (`None`:
    /// its rule reads no recipients); the directory adds a broadcast's
    /// members.
    pub metered: Option<&'a mut Metered>,
}

impl Asking<'_> {
    /// Whom the call is to, each once (empty: its rule reads no recipients).
    pub fn recipients(&self) -> &[String] {
        self.metered.as_deref().map_or(&[][..], |m| &m.recipients)
    }

    /// Whether the call is a broadcast (`@all`, `toparty`, `totag`).
    pub fn broadcast(&self) -> bool {
        self.metered.as_deref().is_some_and(|m| m.broadcast.is_some() || m.unseen_extra > 0)
    }
}

/// What a call costs and whom it is to: set by meter
/// (`crate::proxy::meter`) for a rule with `recipients`; a broadcast's
/// members are added by the directory before the decision
/// (`crate::features::directory`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metered {
    /// Against each of the rule's limits (1 unless `cost = "recipients"`).
    pub cost: u64,
    /// The recipients, each once: those the body names, in its order, then
    /// those a broadcast reaches.
    pub recipients: Vec<String>,
    /// The WeCom app the body names (its `agentid`, as digits), if any:
    /// the app whose directory a broadcast is resolved in, and the app a
    /// `scope = "app"` rule counts under.
    pub app: Option<String>,
    /// What the body names for the directory to resolve (`@all`,
    /// `toparty`, `totag`; rules with `directory = true`), until it is.
    pub broadcast: Option<Broadcast>,
    /// What the members no directory resolves cost (`unseen_cost`), in
    /// `cost` already.
    pub unseen_extra: u64,
}

/// What a broadcast's body names for the directory to resolve.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Broadcast {
    /// `touser` is `@all`: the app's visible range.
    pub all: bool,
    /// `toparty`'s department ids.
    pub parties: Vec<u32>,
    /// `totag`'s tag ids.
    pub tags: Vec<u32>,
}

impl Broadcast {
    /// Most departments (and tags) one message may name: WeCom's own
    /// limit ("最多支持100个", doc 90236).
    pub const MAX_UNITS: usize = 100;

    pub fn is_empty(&self) -> bool {
        !self.all && self.parties.is_empty() && self.tags.is_empty()
    }
}

/// What a feature sees of an admitted call about to be sent.
pub struct Sending<'a> {
    pub config: &'a Arc<Config>,
    pub who: &'a Who,
    /// The path (without an `@account` prefix).
    pub path: &'a str,
    /// The path and query to be sent; a hook may replace it.
    pub target: &'a mut PathAndQuery,
}

/// What a feature sees of a call WeChat answered.
pub struct Answered<'a> {
    pub config: &'a Arc<Config>,
    /// The call's account ([`Who::account`]).
    pub account: &'a str,
    /// The account its state is kept under ([`Who::counted`]): where a
    /// penalty or a token refresh's warm-up is kept.
    pub counted: &'a str,
    pub path: &'a str,
    /// The path and query that were sent.
    pub target: &'a PathAndQuery,
    /// The WeChat host an intercepted call went to (`None`: a direct call,
    /// which went to its domain's upstream; see [`Answered::host`]).
    pub intercepted: Option<&'a str>,
    /// The call's domain (index into `Config::domains`).
    pub domain: usize,
    /// What the answer said (its errcode read from its body).
    pub verdict: Verdict,
    /// The answer's errcode (0: success; `None`: not a WeChat JSON answer).
    pub errcode: Option<i64>,
    /// The answer's body, when it was read whole (a small JSON body).
    pub body: Option<&'a Bytes>,
    /// The call's rule (`None`: forwarded unthrottled).
    pub rule: Option<&'a Rule>,
    /// The call's admission (`None` without a rule).
    pub admitted: Option<&'a Admitted>,
    /// WeChat penalised the call; the client's answer is a penalty
    /// refusal for this long (made by the one table). Set by a hook.
    pub penalty: Option<Micros>,
}

/// A feature's hooks; see the module docs for when each runs.
pub trait Feature: Send + Sync {
    /// What the feature keeps of one call, from its request to its answer.
    type Ctx: Default + Send + Sync;

    /// Identify: the request, once the caller is known.
    fn on_request(
        &self,
        env: Env<'_>,
        cx: &mut Self::Ctx,
        req: &mut Requesting<'_>,
    ) -> impl Future<Output = Result<(), Early>> + Send {
        let _ = (env, cx, req);
        async { Ok(()) }
    }

    /// Before the store decides; `Err` ends the call early.
    fn before_decide(
        &self,
        env: Env<'_>,
        cx: &mut Self::Ctx,
        asking: &mut Asking<'_>,
    ) -> impl Future<Output = Result<(), Early>> + Send {
        let _ = (env, cx, asking);
        async { Ok(()) }
    }

    /// The call was admitted and is about to be sent; `Err` answers it instead.
    fn before_forward(
        &self,
        env: Env<'_>,
        cx: &mut Self::Ctx,
        sending: &mut Sending<'_>,
    ) -> impl Future<Output = Result<(), Early>> + Send {
        let _ = (env, cx, sending);
        async { Ok(()) }
    }

    /// Whether the call's body must be kept to be sent once more.
    fn keep_body(&self, cx: &Self::Ctx) -> bool {
        let _ = cx;
        false
    }

    /// WeChat's answer was read: `Some(target)` asks for the call to be
    /// sent once more, to `target` (at most once a call, the first asking).
    fn resend(
        &self,
        env: Env<'_>,
        cx: &mut Self::Ctx,
        answered: &Answered<'_>,
    ) -> impl Future<Output = Option<PathAndQuery>> + Send {
        let _ = (env, cx, answered);
        async { None }
    }

    /// WeChat's answer was read.
    fn on_answer(
        &self,
        env: Env<'_>,
        cx: &mut Self::Ctx,
        answered: &mut Answered<'_>,
    ) -> impl Future<Output = ()> + Send {
        let _ = (env, cx, answered);
        async {}
    }

    /// The client's answer to a forwarded call is being built.
    fn on_response(&self, cx: &Self::Ctx, answered: &Answered<'_>, headers: &mut HeaderMap) {
        let _ = (cx, answered, headers);
    }
}

impl Answered<'_> {
    /// The WeChat host the call went to: an intercepted call's, else its
    /// domain's first upstream's (`None`: not known). Computed on demand
    /// (it parses a URL).
    pub fn host(&self) -> Option<&str> {
        self.intercepted.or_else(|| {
            let domain = self.config.domains.get(self.domain)?;
            domain.upstream.iter().next().and_then(|u| u.host())
        })
    }
}
