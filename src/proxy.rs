//! A call's life, as named phases over one context ([`Call`]), in order:
//!
//! 1. [`accept`]: origin-form targets only (`CONNECT` and absolute-form get
//!    400: wxgate is never an open proxy); a path no WeChat API can have
//!    gets 400 ([`crate::config::routes::refusal`]); a declared body over `max_body`
//!    gets 413.
//! 2. [`identify`]: who the call is from ([`crate::features::callers`]: `X-Wx-Caller`,
//!    else `[server] caller`, else `default`; a bad header gets 400) and
//!    that caller's flood guard (a declared caller over its `rate` gets 429
//!    `caller_rate` here, before anything asks the store); then the account
//!    the call is for ([`crate::features::accounts`]: `X-Wx-Account` or an `@account`
//!    first path segment, else the account its access token was issued to,
//!    else a token request's appid, else `default`).
//! 3. [`route`]: path → rule ([`crate::config::routes`]); then [`meter`]:
//!    for a rule with `recipients`, the body is read whole (64 KiB at
//!    most) and whom the call is to is read from it: its cost, and the
//!    recipients whose own limits the decision checks.
//! 4. **token cache**: the features' [`Feature::before_decide`] hooks
//!    ([`crate::features`]): a token request may be answered from the cache
//!    here, never decided nor forwarded.
//! 5. [`decide`]: one store decision ([`crate::admit`]), then the call is
//!    held for its reserved slot or waits for a concurrency slot; a refusal
//!    is answered here and never reaches WeChat.
//!    Then the features' [`Feature::before_forward`] hooks: the broker adds
//!    an `[[account]]`'s token to a call that carries none
//!    ([`crate::features::broker`]).
//! 6. [`forward`]: method, path, query, headers and body unchanged but for
//!    hop-by-hop headers, `Authorization` (never forwarded), `Accept-Encoding`
//!    (one `identity`), `Host`, `X-Wx-Account` and `X-Wx-Caller` (the latter
//!    taken off by identify), each handled whole, every field of its name
//!    ([`crate::transport::upstream::to_upstream`]); sent exactly once ([`crate::transport::upstream`]:
//!    connecting within `upstream_timeout`; the body for as long as it keeps
//!    moving, `body_timeout` without progress ends it; then the answer's
//!    head within `upstream_timeout`). A call that provably never reached an
//!    upstream (no connection) goes to the next one in `[server] upstream`'s
//!    list, if any; one that never reached any gives back what its admission
//!    took before its 502/504 is answered. A body the client malformed, cut
//!    short or stopped sending is the client's fault (400, 408; 413 past
//!    `max_body`): counted as `rejected_bad_request`, never as an upstream
//!    error, and its admission is kept (WeChat may have had the head and
//!    part of the body).
//! 7. [`answer`]: WeChat's answer is read for its errcode
//!    ([`crate::transport::sniff`]); a call whose added token WeChat
//!    rejected is sent once more with a new one; the answer is handed to the features' [`Feature::on_answer`]
//!    hooks (token cache, learning, clear_quota, warm-up, penalties); a
//!    penalised answer reaches the client as a penalty refusal with WeChat's
//!    body unchanged; [`Feature::on_response`] adds headers (RateLimit).
//! 8. [`respond`]: a call stopped early becomes its answer by the one table
//!    ([`crate::error`]); every call is counted and logged once.
//!
//! Each phase hands on to the next or stops the call early ([`Early`]): a
//! refusal or failure, or an answer of a hook's own. Every accepted request
//! gets exactly one response.

pub mod accept;
pub mod answer;
pub mod call;
pub mod decide;
pub mod forward;
pub mod identify;
pub mod meter;
pub mod resend;
pub mod respond;
pub mod route;

use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;

pub use self::call::Call;
use crate::app::App;
use crate::error::Early;
pub use crate::features::accounts::ACCOUNT_HEADER;
use crate::features::hooks::{Asking, Feature, Sending};
use crate::features::FEATURES;
use crate::transport::body::RelayBody;
use crate::transport::downstream::Client;

/// Answers one request. Never fails: errors become WeChat-shaped answers.
pub async fn handle(app: &App, req: Request<Incoming>, client: &Client) -> Response<RelayBody> {
    serve(app, req, client, None).await
}

/// Answers one request made inside an `[intercept]` tunnel to `host`
/// (`crate::server::tunnel`): the same phases as [`handle`], forwarded to that
/// host's upstream ([`crate::transport::intercept::Host::upstream`]).
pub async fn handle_intercepted(
    app: &App,
    req: Request<Incoming>,
    client: &Client,
    host: Arc<crate::transport::intercept::Host>,
) -> Response<RelayBody> {
    serve(app, req, client, Some(host)).await
}

async fn serve(
    app: &App,
    req: Request<Incoming>,
    client: &Client,
    intercepted: Option<Arc<crate::transport::intercept::Host>>,
) -> Response<RelayBody> {
    let fallback = app.callers.load().fallback();
    let mut call = Call::new(req.method().clone(), req.uri().path(), app.config.load_full(), fallback);
    call.arrived.intercepted = intercepted;
    let resp = match phases(app, &mut call, req, client).await {
        Ok(resp) => resp,
        Err(Early::Answered(resp, outcome)) => {
            call.outcome = outcome;
            *resp
        }
        Err(Early::Refused(e)) => respond::refuse(&mut call, e),
    };
    respond::respond(app, &call, &resp);
    resp
}

/// The phases, in order; the first that stops the call ends it.
async fn phases(
    app: &App,
    call: &mut Call,
    mut req: Request<Incoming>,
    client: &Client,
) -> Result<Response<RelayBody>, Early> {
    let target = accept::accept(call, &req)?;
    identify::identify(app, call, &mut req, &target).await?;
    route::route(app, call);
    meter::meter(call, &mut req).await?;
    // The account is proven by the call's token, or by wxgate adding its own.
    let config = &call.arrived.config;
    let proven = call.who.owned
        || (!config.accounts.is_empty()
            && config.accounts.get(&call.who.account).is_some_and(|a| a.injects())
            && crate::features::broker::wants_token(&call.arrived.path, target.query()));
    let mut asking = Asking {
        config: &call.arrived.config,
        account: &call.who.account,
        proven,
        method: &call.arrived.method,
        path: &call.arrived.path,
        target: &target,
        body: call.who.body.as_ref(),
        token_request: call.who.learn.is_some(),
        rule: call.route.rule.as_deref(),
        token_fetch: &mut call.token_fetch,
    };
    FEATURES.before_decide(app, &mut asking).await?;
    decide::decide(app, call, client).await?;
    let mut target = target;
    let mut sending = Sending {
        config: &call.arrived.config,
        account: &call.who.account,
        path: &call.arrived.path,
        target: &mut target,
        token_request: call.who.learn.is_some(),
        injected: &mut call.injected,
    };
    FEATURES.before_forward(app, &mut sending).await?;
    let forwarded = forward::forward(app, call, req, target).await?;
    answer::answer(app, call, forwarded).await
}
