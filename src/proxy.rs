//! A call's life, as named phases over one context ([`Call`]), in order.
//! The features plug into the phases through their hooks
//! ([`crate::features::hooks`]); no phase names a feature.
//!
//! 1. [`accept`]: origin-form targets only (`CONNECT` and absolute-form get
//!    400: wxgate is never an open proxy); a path no WeChat API can have
//!    gets 400 ([`crate::config::routes::refusal`]); a declared body over
//!    `max_body` gets 413; an `@account` first segment is split off.
//! 2. [`route`]: path → rule ([`crate::config::routes`]) and its metrics.
//! 3. [`identify`]: who the call is from ([`crate::admit::callers`]:
//!    `X-Wx-Caller`, else `[server] caller`, else `default`; a bad header
//!    gets 400) and that caller's flood guard (a declared caller over its
//!    `rate` gets 429 `caller_rate` here, before anything asks the store);
//!    the account it names (`X-Wx-Account`, `@account`) and the caller's
//!    grant of it; then the features' `on_request` hooks, which find the
//!    account the call counts against (its token's owner, a token
//!    request's or clear_quota's appid, else `default`).
//! 4. [`meter`]: for a rule with `recipients`, the body is read whole (64
//!    KiB at most) and whom the call is to is read from it: its cost, and
//!    the recipients whose own limits the decision checks; a body's WeCom
//!    app must be its `[[account]]`'s, and a `scope = "app"` rule counts
//!    each app apart ([`route::app`]).
//! 5. The features' `before_decide` hooks: a token request may be answered
//!    from the cache here, never decided nor forwarded.
//! 6. [`decide`]: one store decision ([`crate::admit`]), then the call is
//!    held for its reserved slot or waits for a concurrency slot; a refusal
//!    is answered here and never reaches WeChat. Then the features'
//!    `before_forward` hooks (one may add a token to the query).
//! 7. [`forward`]: method, path, query, headers and body unchanged but for
//!    hop-by-hop headers, `Authorization` (never forwarded), `Accept-Encoding`
//!    (one `identity`), `Host`, and `X-Wx-Account` and `X-Wx-Caller` (taken
//!    off by identify), each handled whole, every field of its name
//!    ([`crate::transport::upstream::to_upstream`]); sent exactly once
//!    ([`crate::transport::upstream`]: connecting within `upstream_timeout`;
//!    the body for as long as it keeps moving, `body_timeout` without
//!    progress ends it; then the answer's head within `upstream_timeout`).
//!    A call that provably never reached an upstream (no connection) goes
//!    to the next one in `[server] upstream`'s list, if any; one that never
//!    reached any gives back what its admission took before its 502/504 is
//!    answered. A body the client malformed, cut short or stopped sending
//!    is the client's fault (400, 408; 413 past `max_body`): counted as
//!    `rejected_bad_request`, never as an upstream error, and its
//!    admission is kept (WeChat may have had the head and part of the body).
//! 8. [`answer`]: WeChat's answer is read for its errcode
//!    ([`crate::transport::sniff`]); sent once more if a feature's `resend`
//!    hook asks (at most once); handed to the features' `on_answer` hooks;
//!    a penalised answer reaches the client as a penalty refusal with
//!    WeChat's body unchanged; the `on_response` hooks add headers.
//! 9. [`respond`]: a call stopped early becomes its answer by the one table
//!    ([`crate::error`]); every call is counted once, and logged once.
//!
//! Each phase hands on to the next or stops the call early ([`Early`]): a
//! refusal or failure, or an answer of a hook's own. Every accepted request
//! gets exactly one response.
//!
//! A call wxgate makes itself ([`own`]: a token or ticket fetch, a
//! quota/get, a queued job's send) runs the same phases in the same order,
//! with no client: its maker gives its target, body, caller and account,
//! so accept checks nothing and identify runs only the `on_request` hooks.
//! The call's [`source::Source`] is all that tells the two apart; the
//! [`source`] module lists what it changes.

pub mod accept;
pub mod answer;
pub mod app;
pub mod call;
pub mod decide;
pub mod forward;
pub mod identify;
pub mod meter;
pub mod own;
pub mod resend;
pub mod respond;
pub mod route;
pub mod source;
pub mod spans;
pub mod start;

use std::future::Future;
use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;

pub use self::call::Call;
pub use self::identify::ACCOUNT_HEADER;
use crate::error::Early;
use crate::features::hooks::{Asking, Sending};
use crate::proxy::app::App;
use crate::proxy::source::Source;
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
    let results = call.arrived.intercepted.is_none() && intercepted.is_none() && app.features.serves(req.uri().path());
    // Before anything is read: a browser page never calls WeChat through
    // wxgate, nor its delivery API (docs/callers.md#browsers).
    // Its Host is checked where it names this listener: not inside an
    // intercepted tunnel (WeChat's host), nor for a target accept refuses
    // anyway (CONNECT, absolute-form: it says why).
    let named = intercepted.is_none() && req.uri().authority().is_none();
    let hosts = named.then_some(&call.arrived.config.server.hosts);
    let browser = crate::transport::browser::proxy_refusal(req.headers(), hosts);
    call.arrived.intercepted = intercepted;
    spans::start(app, &mut call, req.headers());
    // Only a recorded call's task carries its span: the calls wxgate makes
    // for it (a token fetch) are its children; an unrecorded call's future
    // is not boxed for it.
    let recorded = call.trace.as_ref().filter(|t| t.recording.is_some()).map(|t| t.ctx);
    let answered = match (browser, results, recorded) {
        (Some(why), ..) => {
            crate::proxy::accept::REFUSED_PATH.clone_into(&mut call.arrived.path);
            Err(Early::Refused(crate::error::ProxyError::Forbidden(why)))
        }
        // Boxed: a call of the API does not make every call's future carry its state.
        (None, true, _) => Box::pin(component(app, &mut call, req)).await,
        (None, false, None) => phases(app, &mut call, req, client).await,
        (None, false, Some(ctx)) => {
            Box::pin(crate::telemetry::trace::CURRENT.scope(ctx, phases(app, &mut call, req, client))).await
        }
    };
    let resp = match answered {
        Ok(resp) => resp,
        Err(Early::Answered(resp, outcome)) => {
            call.outcome = outcome;
            *resp
        }
        Err(Early::Refused(e)) => respond::refuse(&mut call, e),
    };
    respond::count_and_log(app, &call, resp.status());
    spans::finish(app, &mut call, resp.status());
    resp
}

/// A request to a component's route (queued delivery's `/v1/deliveries`):
/// its caller identified as a call's is, then the component answers it;
/// never forwarded.
async fn component(app: &App, call: &mut Call, mut req: Request<Incoming>) -> Result<Response<RelayBody>, Early> {
    identify::caller(app, call, &mut req)?;
    call.route.local = true;
    Ok(app.features.serve(app, &call.who.caller, req).await?)
}

/// A client's call's phases: [`run`] from a [`Source::Client`].
fn phases<'a>(
    app: &'a App,
    call: &'a mut Call,
    req: Request<Incoming>,
    client: &'a Client,
) -> impl Future<Output = Result<Response<RelayBody>, Early>> + Send + 'a {
    run(app, call, Source::Client(req, client))
}

/// The phases, in order, for a call from `source` (a client's, or one
/// wxgate makes itself: what that changes is in [`source`]); the first
/// that stops the call ends it.
async fn run(app: &App, call: &mut Call, mut source: Source<'_>) -> Result<Response<RelayBody>, Early> {
    let mut target = accept::accept(call, &mut source)?;
    route::route(app, call);
    identify::identify(app, call, &mut source, &target).await?;
    meter::meter(call, source.request()).await?;
    route::app(call)?;
    let mut asking = Asking {
        config: &call.arrived.config,
        method: &call.arrived.method,
        path: &call.arrived.path,
        target: &target,
        body: call.body.as_ref(),
        who: &call.who,
        rule: call.route.rule.as_deref(),
        domain: call.arrived.domain,
        metered: call.meter.as_mut(),
    };
    app.features.before_decide(app.env(), &mut call.features, &mut asking).await?;
    decide::decide(app, call, source.client()).await?;
    let mut sending =
        Sending { config: &call.arrived.config, who: &call.who, path: &call.arrived.path, target: &mut target };
    app.features.before_forward(app.env(), &mut call.features, &mut sending).await?;
    let outgoing = forward::prepare(app, call, source, &target).await?;
    let forwarded = forward::forward(app, call, outgoing, target).await?;
    answer::answer(app, call, forwarded).await
}
