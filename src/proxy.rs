//! A call's life, as named phases over one context ([`Call`]), in order:
//!
//! 1. [`accept`]: origin-form targets only (`CONNECT` and absolute-form get
//!    400: wxgate is never an open proxy); a path no WeChat API can have
//!    gets 400 ([`crate::routes::refusal`]); a declared body over `max_body`
//!    gets 413.
//! 2. [`caller`]: who the call is from ([`crate::callers`]: `X-Wx-Caller`,
//!    else `[server] caller`, else `default`; a bad header gets 400), and
//!    that caller's flood guard: a declared caller over its `rate` gets 429
//!    (`caller_rate`) here, before anything asks the store.
//! 3. [`identify`]: the account the call is for: `X-Wx-Account` or an
//!    `@account` first path segment (split off by [`accept`]), else the
//!    account its access token was issued to, else `default`
//!    ([`crate::accounts`]); a token request's answer teaches the account
//!    of its token.
//! 4. [`route`]: path → rule ([`crate::routes`]).
//! 5. [`decide`]: one store decision ([`crate::admit`]), then the call is
//!    held for its reserved slot or waits for a concurrency slot; a refusal
//!    is answered 429 here and never reaches WeChat.
//! 6. [`forward`]: method, path, query, headers and body unchanged but for
//!    hop-by-hop headers, `Host`, `X-Wx-Account` and `X-Wx-Caller` (the
//!    latter taken off by [`caller`]); sent exactly once
//!    ([`crate::upstream`]: connecting within `upstream_timeout`; the body
//!    for as long as it keeps moving, `body_timeout` without progress ends
//!    it; then the answer's head within `upstream_timeout`). A call that
//!    provably never reached an upstream (no connection) goes to the next
//!    one in `[server] upstream`'s list, if any; one that never reached any
//!    gives back what its admission took before its 502/504 is answered. A body the client
//!    malformed, cut short or stopped sending is the client's fault (400,
//!    408; 413 past `max_body`): counted as `rejected_bad_request`, never as
//!    an upstream error, and its admission is kept (WeChat may have had the
//!    head and part of the body).
//! 7. [`crate::inspect::inspect`]: WeChat's answer is read for its errcode;
//!    a penalised one starts a penalty and reaches the client as 429 +
//!    `Retry-After` with WeChat's body unchanged.
//!
//! Each phase hands on to the next or stops the call early ([`Early`]): a
//! refusal or failure, mapped to a WeChat-shaped answer in one place, or an
//! answer of the phase's own. Every accepted request gets exactly one
//! response, and is counted and logged once ([`respond`]).

use std::sync::Arc;

use http::uri::PathAndQuery;
use http::{Method, Request, Response, Version};
use hyper::body::Incoming;

pub use crate::accounts::ACCOUNT_HEADER;
use crate::accounts::{self, ACCOUNT};
use crate::activity::Kind;
use crate::admit::admit;
use crate::app::App;
use crate::body::RelayBody;
use crate::call::{Call, Early};
use crate::callers;
use crate::client::Client;
use crate::clock::Stopwatch;
use crate::error::{retry_after_secs, ProxyError};
use crate::inspect::{inspect, Forwarded};
use crate::limit::{Key, Reason};
use crate::metrics::{InFlightGuard, Outcome, NO_RULE};
use crate::ratelimit;
use crate::request_body::RequestBody;
use crate::routes;
use crate::store::op::Refund;
use crate::upstream::strip_hop_by_hop;

/// Answers one request. Never fails: errors become WeChat-shaped answers.
pub async fn handle(app: &App, req: Request<Incoming>, client: &Client) -> Response<RelayBody> {
    serve(app, req, client, None).await
}

/// Answers one request made inside an `[intercept]` tunnel to `host`
/// (`crate::tunnel`): the same phases as [`handle`], forwarded to that
/// host's upstream ([`crate::intercept::Host::upstream`]).
pub async fn handle_intercepted(
    app: &App,
    req: Request<Incoming>,
    client: &Client,
    host: Arc<crate::intercept::Host>,
) -> Response<RelayBody> {
    serve(app, req, client, Some(host)).await
}

async fn serve(
    app: &App,
    req: Request<Incoming>,
    client: &Client,
    intercepted: Option<Arc<crate::intercept::Host>>,
) -> Response<RelayBody> {
    let fallback = app.callers.load().fallback();
    let mut call = Call::new(req.method().clone(), req.uri().path(), app.config.load_full(), fallback);
    call.intercepted = intercepted;
    let resp = match phases(app, &mut call, req, client).await {
        Ok(resp) => resp,
        Err(Early::Answered(resp)) => *resp,
        Err(Early::Refused(e)) => refuse(&mut call, e),
    };
    respond(app, &call, &resp);
    resp
}

/// The phases, in order; the first that stops the call ends it.
async fn phases(
    app: &App,
    call: &mut Call,
    mut req: Request<Incoming>,
    client: &Client,
) -> Result<Response<RelayBody>, Early> {
    let target = accept(call, &req)?;
    caller(app, call, &mut req)?;
    identify(app, call, &mut req, &target).await?;
    route(app, call);
    if call.learn.is_some() {
        // A token request (identify read it): perhaps answered from the cache.
        crate::token_cache::serve(app, call, &target).await?;
    }
    decide(app, call, client).await?;
    let answer = forward(app, call, req, target).await?;
    inspect(app, call, answer).await
}

/// Phase 1: only origin-form requests to this proxy, with a body it may
/// forward. Returns the path and query to send upstream, bytes unchanged
/// but for an `@account` first segment, which goes to `call.named`.
pub fn accept(call: &mut Call, req: &Request<Incoming>) -> Result<PathAndQuery, Early> {
    if req.method() == Method::CONNECT {
        return Err(ProxyError::BadRequest(connect_refusal(call, req)).into());
    }
    if req.uri().scheme().is_some() || req.uri().authority().is_some() {
        return Err(ProxyError::BadRequest(
            "absolute-form request targets are not served: send origin-form (/cgi-bin/...) to wxgate".into(),
        )
        .into());
    }
    let target = match req.uri().path_and_query() {
        Some(pq) if pq.as_str().starts_with('/') => pq.clone(),
        _ => return Err(ProxyError::BadRequest("the request target must be a path starting with /".into()).into()),
    };
    let target = match accounts::split_prefix(&target) {
        Ok(None) => target,
        Ok(Some((account, rest))) => {
            rest.path().clone_into(&mut call.path);
            call.named = Some(account);
            rest
        }
        Err(why) => return Err(ProxyError::BadRequest(why).into()),
    };
    // Before any rule is looked up: a path no WeChat API has never reaches
    // the limits nor WeChat (see `crate::routes`).
    if let Some(why) = routes::refusal(target.path()) {
        return Err(ProxyError::BadRequest(why.into()).into());
    }
    // Counted before anything is decided or forwarded; a streamed body that
    // grows past the cap is cut off on the way (413 as well).
    let max_body = call.config.server.max_body;
    let declared = req
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max_body) {
        return Err(ProxyError::TooLarge(format!(
            "the request body is larger than {max_body} bytes ([server] max_body)"
        ))
        .into());
    }
    Ok(target)
}

/// Why a `CONNECT` is refused, in words an on-call engineer can act on.
fn connect_refusal(call: &Call, req: &Request<Incoming>) -> String {
    let Some(intercept) = &call.config.intercept else {
        return "CONNECT is not served: wxgate only forwards to its configured upstream".into();
    };
    if call.intercepted.is_some() {
        return "CONNECT inside an intercepted tunnel is not served".into();
    }
    let hosts: Vec<&str> = intercept.hosts.iter().map(|h| &**h).collect();
    // The target (authority-form) is quoted only when it is a host name
    // and port: never bytes a client could fill with something else.
    let target = req.uri().authority().map(|a| a.as_str()).filter(|a| {
        a.len() <= 260 && a.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-.:".contains(&b))
    });
    let target = target.unwrap_or("to this target");
    format!(
        "CONNECT {target} is refused: wxgate intercepts only {}, port 443, and is never a proxy to anything else; \
         send other hosts direct (NO_PROXY, e.g. NO_PROXY=localhost,127.0.0.1,.svc,.cluster.local,<your other hosts>), \
         or give HTTPS_PROXY to the WeChat client only",
        hosts.join(", ")
    )
}

/// Phase 2: who the call is from ([`crate::callers`]), and that caller's
/// flood guard. A call the guard refuses is routed first, so that it is
/// counted under its rule and answered with the rule's `throttle_status`;
/// it never reaches identify (no token lookup) nor the store. The guard
/// holds for calls without a rule too: it limits the caller, not a rule.
pub fn caller(app: &App, call: &mut Call, req: &mut Request<Incoming>) -> Result<(), Early> {
    // Without the header, the caller is the fallback `Call::new` was given.
    if let Some(name) = callers::take_header(req.headers_mut())? {
        call.caller = app.callers.load().named(&name)?;
    }
    if let Err(refused) = call.caller.check() {
        route(app, call);
        return Err(refused.into());
    }
    Ok(())
}

/// Phase 3: the account ([`crate::accounts`]: header or `@account`
/// prefix, learned token, token request's appid, `default`). A token
/// request's body is read here (it names the account).
pub async fn identify(
    app: &App,
    call: &mut Call,
    req: &mut Request<Incoming>,
    target: &PathAndQuery,
) -> Result<(), Early> {
    Ok(accounts::identify(app, call, req, target).await?)
}

/// Phase 4: the rule of the call's path, and its metrics.
pub fn route(app: &App, call: &mut Call) {
    let config = &call.config;
    call.rule = config.rule_for(&call.path).cloned();
    call.metrics = Some(app.metrics.rule(call.rule.as_ref().map_or(NO_RULE, |r| &*r.name)));
}

/// Phase 5: admit the call (holding it or waiting for a slot as its rule
/// says) or refuse it. A call without a rule goes on undecided.
pub async fn decide(app: &App, call: &mut Call, client: &Client) -> Result<(), Early> {
    let Some(rule) = call.rule.clone() else { return Ok(()) };
    let started = Stopwatch::start();
    let normal = call.caller.priority() != crate::config::Priority::High;
    let admitted = admit(app, &call.config, &call.account, &rule, normal, call.caller.entry.label(), client).await;
    call.decision_us = match &admitted {
        Ok(a) => a.decision_us,
        Err(_) => started.elapsed_us(),
    };
    if let Some(m) = &call.metrics {
        m.decision.observe(call.decision_us as f64 / 1e6);
    }
    let admitted = admitted?;
    call.held_us = admitted.held_us;
    if admitted.held_us > 0 {
        call.outcome = Outcome::held;
        if let Some(m) = &call.metrics {
            m.hold.observe(admitted.held_us as f64 / 1e6);
        }
    }
    if admitted.degraded {
        call.outcome = Outcome::degraded;
    }
    if let Some((reason, wait_us)) = admitted.shadow_refusal {
        call.outcome = Outcome::shadow_throttled;
        tracing::info!(rule = %rule.name, account = %call.account, reason = reason.as_str(), wait_s = retry_after_secs(wait_us), "shadow mode: would have refused this call");
    }
    call.admitted = Some(admitted);
    Ok(())
}

/// Phase 6: send the call to an upstream, once, and wait for its answer's
/// head (the upstream sets its own `Host`, and moves a call that never
/// reached one upstream on to the next: [`crate::upstream`]).
pub async fn forward(
    app: &App,
    call: &mut Call,
    req: Request<Incoming>,
    target: PathAndQuery,
) -> Result<Forwarded, Early> {
    let upstream = match &call.intercepted {
        None => app.upstream.load_full(),
        Some(host) => host.upstream(app.upstream.load_full()),
    };
    let (mut parts, body) = req.into_parts();
    parts.uri =
        upstream.target(&target).map_err(|e| ProxyError::BadRequest(format!("cannot forward this path: {e}")))?;
    parts.version = Version::HTTP_11;
    strip_hop_by_hop(&mut parts.headers);
    parts.headers.remove(ACCOUNT);
    let in_flight = call.metrics.as_ref().map(|m| InFlightGuard::new(m.in_flight.clone()));
    let activity = call.rule.as_ref().map(|r| app.activity.enter(&call.account, &r.state, Kind::InFlight));
    // A token request's body was read whole by identify: sent as it came.
    let body = match call.body.take() {
        Some(read) => RequestBody::already_read(body, read),
        None => RequestBody::new(body, call.config.server.max_body),
    };
    let sent = Stopwatch::start();
    let (tried, resp) = upstream.send(Request::from_parts(parts, body)).await;
    call.upstream_us = sent.elapsed_us();
    call.upstream = Some((upstream, tried));
    if let Some(m) = &call.metrics {
        m.upstream.observe(call.upstream_us as f64 / 1e6);
    }
    if let Err(e) = &resp {
        if e.never_sent() {
            give_back(app, call).await;
        }
    }
    Ok(Forwarded { resp: resp?, guards: (in_flight, activity), target })
}

/// The call provably never reached WeChat
/// ([`crate::upstream::UpstreamError::never_sent`]): gives back what its
/// admission took from the rule's limits, before the client hears of the
/// failure. Only what the store debited: nothing for a shadow-mode call
/// that would have been refused (it debited nothing) nor for a decision
/// made by the fallback (`degraded`: Redis took nothing; a local fallback's
/// count stays, on the safe side). Its concurrency slot is freed when the
/// call ends, as for every call.
async fn give_back(app: &App, call: &Call) {
    let (Some(rule), Some(admitted)) = (&call.rule, &call.admitted) else { return };
    if rule.limits.is_empty() || admitted.degraded || admitted.shadow_refusal.is_some() {
        return;
    }
    let key = Key { account: &call.account, rule, offset_us: call.config.server.quota_offset_us };
    match app.store.apply(key, Refund { at: admitted.at }).await {
        Ok(given) => {
            if given {
                if let Some(m) = &call.metrics {
                    m.refunds.inc();
                }
            }
            tracing::debug!(rule = %rule.name, account = %call.account, given, "the call never reached WeChat: its admission is given back");
        }
        Err(e) => {
            tracing::warn!(rule = %rule.name, error = %e, "could not give back the admission of a call that never reached WeChat: it stays counted");
        }
    }
}

/// The answer to a call stopped by a refusal or a failure; sets its outcome.
fn refuse(call: &mut Call, e: ProxyError) -> Response<RelayBody> {
    call.outcome = match &e {
        ProxyError::BadRequest(_) | ProxyError::TooLarge(_) => Outcome::rejected_bad_request,
        ProxyError::Upstream(e) if e.client_fault() => Outcome::rejected_bad_request,
        ProxyError::Throttled { reason: Reason::Penalty, .. } => Outcome::penalised,
        ProxyError::Throttled { .. } | ProxyError::CallerRate { .. } => Outcome::throttled,
        ProxyError::Unavailable(_) | ProxyError::TokenWait(_) => Outcome::unavailable,
        ProxyError::Upstream(_) => Outcome::upstream_error,
    };
    if matches!(call.outcome, Outcome::upstream_error | Outcome::unavailable) {
        tracing::warn!(method = %call.method, path = %call.path, error = %e, "call failed");
    }
    if call.outcome == Outcome::rejected_bad_request {
        call.refusal = Some(e.to_string());
    }
    let refused = match &e {
        ProxyError::Throttled { reason, wait_us, .. } => Some((*reason, *wait_us)),
        _ => None,
    };
    let by_guard = matches!(e, ProxyError::CallerRate { .. });
    let mut resp = e.into_response();
    if by_guard {
        let config = &call.config;
        *resp.status_mut() = call.rule.as_ref().map_or(config.server.throttle_status, |r| r.throttle_status);
    }
    if let (Some((reason, wait_us)), Some(rule)) = (refused, call.rule.as_ref()) {
        *resp.status_mut() = rule.throttle_status;
        if call.config.server.ratelimit_headers {
            ratelimit::refused(resp.headers_mut(), rule, reason, wait_us);
        }
    }
    resp
}

/// Counts the call once and writes its access-log line.
fn respond(app: &App, call: &Call, resp: &Response<RelayBody>) {
    let rule = call.rule.as_ref().map_or(NO_RULE, |r| &*r.name);
    match &call.metrics {
        Some(m) => m.call(call.outcome),
        None => app.metrics.rule(rule).call(call.outcome),
    }
    call.caller.entry.metrics.call(call.outcome);
    if let Some(host) = &call.intercepted {
        host.calls.inc();
    }
    if call.config.log.access {
        tracing::info!(
            target: "wxgate::access",
            method = %call.method,
            path = %call.path,
            rule,
            account = %call.account,
            caller = %call.caller.name,
            outcome = call.outcome.as_str(),
            status = resp.status().as_u16(),
            errcode = call.errcode,
            upstream = call.upstream.as_ref().map(|(u, i)| u.name(*i)),
            intercepted = call.intercepted.as_ref().map(|h| &*h.name),
            error = call.refusal.as_deref(),
            decision_ms = call.decision_us as f64 / 1000.0,
            upstream_ms = call.upstream_us as f64 / 1000.0,
            held_ms = call.held_us as f64 / 1000.0,
        );
    }
}
