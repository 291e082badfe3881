//! The hooks features plug into (pingora's `ProxyHttp` is the model): the
//! phases of [`crate::proxy`] call each hook of the features
//! ([`crate::features::FEATURES`]) in their order, and no phase function
//! knows which features there are.
//!
//! | hook | when it runs | what it sees and may set | an early answer |
//! |---|---|---|---|
//! | [`Feature::before_decide`] | the token-cache phase: after route, before the store decides | the request as identify read it ([`Asking`]); may set `token_fetch` | `Err(Early::Answered)` answers the call without deciding or forwarding it; `Err(Early::Refused)` refuses it |
//! | [`Feature::before_forward`] | after decide, before the call is sent: the call was admitted | the target about to be sent ([`Sending`]); may change its query (the broker adds a token) | `Err(Early::Refused)` answers the call instead of sending it (its admission stays counted) |
//! | [`Feature::on_answer`] | the answer phase: WeChat's answer head and, when small, its body were read; before the client's answer is built | the call and WeChat's verdict ([`Answered`]); may take what it owns (`learn`, `token_fetch`) and set `penalty` | none: WeChat has answered, and the client gets that answer |
//! | [`Feature::on_response`] | the answer phase, building the client's answer to a forwarded call | the call ([`Answered`]); may add headers | none; a status is never set here (the one table in [`crate::error`] chooses it) |
//!
//! Every hook's default does nothing. Identify (accounts, callers) and
//! decide are phases of their own: every call runs them. Hooks run with
//! static dispatch (a tuple of features), so they cost what the code in
//! them costs.

use bytes::Bytes;
use http::uri::PathAndQuery;
use http::{HeaderMap, Method};

use crate::admit::Admitted;
use crate::config::Config;
use crate::error::Early;
use crate::features::accounts::learn::Learn;
use crate::features::base::Base;
use crate::features::broker::injected::Injected;
use crate::features::quota_clear::request::Clearing;
use crate::features::token_cache::cache::Fetch;
use crate::limit::Rule;
use crate::time::Micros;
use crate::transport::sniff::Verdict;

/// What a feature sees of a call before it is decided.
pub struct Asking<'a> {
    pub config: &'a Config,
    pub method: &'a Method,
    /// The path (without an `@account` prefix).
    pub path: &'a str,
    /// The path and query to be sent.
    pub target: &'a PathAndQuery,
    /// The request's body, when identify read it whole (token requests, clear_quota).
    pub body: Option<&'a Bytes>,
    /// A token request (identify will learn from its answer).
    pub token_request: bool,
    /// The account the call counts against (identify's).
    pub account: &'a str,
    /// The account is proven, not only named: the call's token was issued
    /// to it, or wxgate adds the account's own token (a ticket is served
    /// from the account's cache only then).
    pub proven: bool,
    pub rule: Option<&'a Rule>,
    /// token cache: this call is its token slot's one fetch.
    pub token_fetch: &'a mut Option<Fetch>,
}

/// What a feature sees of an admitted call about to be sent.
pub struct Sending<'a> {
    pub config: &'a Config,
    /// The account the call counts against (identify's).
    pub account: &'a str,
    /// The path (without an `@account` prefix).
    pub path: &'a str,
    /// The path and query to be sent; a hook may replace it.
    pub target: &'a mut PathAndQuery,
    /// A token request (identify will learn from its answer).
    pub token_request: bool,
    /// broker: the token wxgate added to this call.
    pub injected: &'a mut Option<Injected>,
}

/// What a feature sees of a call WeChat answered.
pub struct Answered<'a> {
    pub config: &'a Config,
    pub account: &'a str,
    pub path: &'a str,
    /// The path and query that were sent.
    pub target: &'a PathAndQuery,
    /// The WeChat host an intercepted call went to (`None`: a direct call,
    /// which went to `[server] upstream`; see [`Answered::host`]).
    pub intercepted: Option<&'a str>,
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
    /// identify: what a token request's answer teaches (taken by learning).
    pub learn: Option<Learn>,
    /// identify: a clear_quota call and the appid it names.
    pub clearing: Option<&'a Clearing>,
    /// token cache: this call's fetch for its slot (taken by the token cache).
    pub token_fetch: Option<Fetch>,
    /// penalties: WeChat penalised the call; the client's answer is a
    /// penalty refusal for this long (made by the one table).
    pub penalty: Option<Micros>,
}

/// A feature's hooks; see the module docs for when each runs.
pub trait Feature {
    /// The token-cache phase; `Err` ends the call early.
    fn before_decide(
        &self,
        app: &Base,
        asking: &mut Asking<'_>,
    ) -> impl std::future::Future<Output = Result<(), Early>> + Send {
        let _ = (app, asking);
        async { Ok(()) }
    }

    /// The call was admitted and is about to be sent; `Err` answers it instead.
    fn before_forward(
        &self,
        app: &Base,
        sending: &mut Sending<'_>,
    ) -> impl std::future::Future<Output = Result<(), Early>> + Send {
        let _ = (app, sending);
        async { Ok(()) }
    }

    /// WeChat's answer was read.
    fn on_answer(&self, app: &Base, answered: &mut Answered<'_>) -> impl std::future::Future<Output = ()> + Send {
        let _ = (app, answered);
        async {}
    }

    /// The client's answer to a forwarded call is being built.
    fn on_response(&self, answered: &Answered<'_>, headers: &mut HeaderMap) {
        let _ = (answered, headers);
    }
}

macro_rules! feature_tuple {
    ($($f:ident),+) => {
        #[allow(non_snake_case)]
        impl<$($f: Feature + Sync),+> Feature for ($($f,)+) {
            async fn before_decide(&self, app: &Base, asking: &mut Asking<'_>) -> Result<(), Early> {
                let ($($f,)+) = self;
                $($f.before_decide(app, asking).await?;)+
                Ok(())
            }

            async fn before_forward(&self, app: &Base, sending: &mut Sending<'_>) -> Result<(), Early> {
                let ($($f,)+) = self;
                $($f.before_forward(app, sending).await?;)+
                Ok(())
            }

            async fn on_answer(&self, app: &Base, answered: &mut Answered<'_>) {
                let ($($f,)+) = self;
                $($f.on_answer(app, answered).await;)+
            }

            fn on_response(&self, answered: &Answered<'_>, headers: &mut HeaderMap) {
                let ($($f,)+) = self;
                $($f.on_response(answered, headers);)+
            }
        }
    };
}

feature_tuple!(A, B, C, D);
feature_tuple!(A, B, C, D, E, F, G);

impl Answered<'_> {
    /// The WeChat host the call went to: an intercepted call's, else the
    /// first `[server] upstream`'s (`None`: not known). Computed on demand
    /// (it parses a URL).
    pub fn host(&self) -> Option<&str> {
        self.intercepted.or_else(|| self.config.server.upstream.iter().next().and_then(|u| u.host()))
    }
}
