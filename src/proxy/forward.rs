//! Phase 7, forward: the call sent to an upstream exactly once, and the
//! head of its answer; a call that provably never reached WeChat gives
//! back what its admission took.

use std::sync::Arc;

use http::header::{HeaderValue, CONTENT_LENGTH, CONTENT_TYPE};
use http::uri::PathAndQuery;
use http::{Request, Version};
use hyper::body::Incoming;

use super::answer::Forwarded;
use super::call::Call;
use super::resend::Resend;
use super::source::Source;
use crate::admit::activity::Stage;
use crate::error::{Early, ProxyError};
use crate::limit::Key;
use crate::proxy::app::App;
use crate::store::pair_op::Refund;
use crate::telemetry::metrics::InFlightGuard;
use crate::time::Stopwatch;
use crate::transport::request_body::{read_whole, RequestBody};
use crate::transport::upstream::{to_upstream, Upstream, UpstreamError};

/// A call ready to go upstream: where, the request, and what a resend
/// needs when a feature keeps its body.
pub struct Outgoing {
    upstream: Arc<Upstream>,
    req: Request<RequestBody>,
    resend: Option<Box<Resend>>,
}

/// The call made ready to go upstream, as its source has it: a client's
/// request ([`client`]) or a call wxgate makes itself ([`own`]).
pub async fn prepare(app: &App, call: &mut Call, source: Source<'_>, target: &PathAndQuery) -> Result<Outgoing, Early> {
    match source {
        Source::Client(req, _) => client(app, call, req, target).await,
        Source::Own { .. } => Ok(own(app, call, target)?),
    }
}

/// A client's request made ready to go upstream: its head rewritten (every
/// field of each header wxgate takes off or rewrites: hop-by-hop ones,
/// `Authorization`, `Accept-Encoding` → `identity`), its body as read or to
/// be streamed. A body a hook or meter read whole is sent as it came; one a
/// feature keeps ([`crate::features::hooks::Feature::keep_body`]: WeChat may
/// make it send the call once more) is read whole first when it is small
/// enough.
async fn client(app: &App, call: &mut Call, req: Request<Incoming>, target: &PathAndQuery) -> Result<Outgoing, Early> {
    let (upstream, uri) = upstream_of(app, call, target)?;
    let (mut parts, mut body) = req.into_parts();
    parts.uri = uri;
    parts.version = Version::HTTP_11;
    to_upstream(&mut parts.headers);
    let keep = app.features.keep_body(&call.features);
    let read = match call.body.take() {
        Some(read) => Some(read),
        None if keep => Box::pin(read_for_resend(&mut body, &call.arrived.config)).await?,
        None => None,
    };
    let resend = match &read {
        Some(read) if keep => Some(Box::new(Resend {
            method: parts.method.clone(),
            headers: parts.headers.clone(),
            body: read.clone(),
            upstream: upstream.clone(),
        })),
        _ => None,
    };
    let body = match read {
        Some(read) => RequestBody::already_read(body, read),
        None => RequestBody::new(body, call.arrived.config.server.max_body),
    };
    Ok(Outgoing { upstream, req: Request::from_parts(parts, body), resend })
}

/// A call wxgate makes itself made ready to go upstream: its method, its
/// body (`call.body`), a JSON content type when it has one, on its
/// domain's upstream.
fn own(app: &App, call: &mut Call, target: &PathAndQuery) -> Result<Outgoing, ProxyError> {
    let (upstream, uri) = upstream_of(app, call, target)?;
    let body = call.body.take().unwrap_or_default();
    let length = body.len();
    let json = !body.is_empty();
    let mut req = Request::new(RequestBody::bytes(body));
    *req.method_mut() = call.arrived.method.clone();
    *req.uri_mut() = uri;
    if json {
        req.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    }
    req.headers_mut().insert(CONTENT_LENGTH, HeaderValue::from(length));
    Ok(Outgoing { upstream, req, resend: None })
}

/// Where the call goes: its upstream (an intercepted host's, else
/// `[server] upstream`) and the URI there.
fn upstream_of(app: &App, call: &Call, target: &PathAndQuery) -> Result<(Arc<Upstream>, http::Uri), ProxyError> {
    let upstream = match &call.arrived.intercepted {
        None => app.core.upstreams.load().get(call.arrived.domain).clone(),
        Some(host) => host.upstream(app.core.upstreams.load().get(call.arrived.domain).clone()),
    };
    let uri = upstream.target(target).map_err(|e| ProxyError::BadRequest(format!("cannot forward this path: {e}")))?;
    Ok((upstream, uri))
}

/// Sends the call to its upstream, once, and waits for its answer's head
/// (the upstream sets its own `Host`, and moves a call that never reached
/// one upstream on to the next: [`crate::transport::upstream`]); a call that
/// provably never reached WeChat gives back its admission.
pub async fn forward(app: &App, call: &mut Call, outgoing: Outgoing, target: PathAndQuery) -> Result<Forwarded, Early> {
    let Outgoing { upstream, req, resend } = outgoing;
    let in_flight = call.route.metrics.as_ref().map(|m| InFlightGuard::new(m.in_flight()));
    let activity =
        call.route.rule.as_ref().map(|r| app.core.activity.enter(call.who.counted(), &r.state, Stage::InFlight));
    let sent = Stopwatch::start();
    let traced_at = super::spans::now(call);
    let (tried, resp) = upstream.send(req).await;
    call.sent.upstream_us = sent.elapsed_us();
    if traced_at.is_some() {
        let answered = super::spans::Answered::of(&resp);
        super::spans::exchanged(app, call, traced_at, upstream.name(tried), answered, false);
    }
    call.sent.upstream = Some((upstream, tried));
    if let Some(m) = &call.route.metrics {
        m.observe_upstream(call.sent.upstream_us as f64 / 1e6, super::spans::exemplar(call));
    }
    if let Err(e) = &resp {
        if e.never_sent() {
            give_back(app, call).await;
        }
    }
    Ok(Forwarded { resp: resp?, guards: (in_flight, activity), target, resend })
}

/// Largest body of a call wxgate added a token to that is kept to be sent
/// once more: WeChat's API bodies are small JSON; a larger one (a media
/// upload) is streamed and not sent again.
pub const RESEND_MAX: u64 = 1 << 20;

/// The body of an injected call, read whole if it declares a length up to
/// [`RESEND_MAX`] (or has none): `None` leaves it to be streamed. Read as
/// every body is ([`read_whole`]): a client that stops sending it for
/// `[server] body_timeout` is at fault (408), one that keeps sending is not.
async fn read_for_resend(body: &mut Incoming, config: &crate::config::Config) -> Result<Option<bytes::Bytes>, Early> {
    use http_body::Body as _;
    if body.is_end_stream() {
        return Ok(Some(bytes::Bytes::new()));
    }
    let declared = match body.size_hint().exact() {
        Some(n) if n <= RESEND_MAX && n <= config.server.max_body => n,
        _ => return Ok(None),
    };
    let read = read_whole(body, declared, config.server.body_timeout).await.map_err(UpstreamError::from)?;
    Ok(Some(read))
}

/// The call provably never reached WeChat
/// ([`crate::transport::upstream::UpstreamError::never_sent`]): gives back what its
/// admission took from the rule's limits, before the client hears of the
/// failure. Only what the store debited: nothing for a shadow-mode call
/// that would have been refused (it debited nothing) nor for a decision
/// made by the fallback (`degraded`: Redis took nothing; a local fallback's
/// count stays, on the safe side). Its concurrency slot is freed when the
/// call ends, as for every call.
async fn give_back(app: &App, call: &Call) {
    let (Some(rule), Some(admitted)) = (&call.route.rule, &call.admission.admitted) else { return };
    if rule.limits.is_empty() || admitted.degraded || admitted.shadow_refusal.is_some() {
        return;
    }
    let key = Key { account: call.who.counted(), rule, offset_us: call.arrived.config.server.quota_offset_us };
    let cost = call.meter.as_ref().map_or(1, |m| m.cost);
    match app.core.store.apply(key, Refund { at: admitted.at, cost }).await {
        Ok(given) => {
            if given {
                if let Some(m) = &call.route.metrics {
                    m.refunded();
                }
            }
            tracing::debug!(rule = %rule.name, account = %call.who.account, given, "the call never reached WeChat: its admission is given back");
        }
        Err(e) => {
            tracing::warn!(rule = %rule.name, error = %e, "could not give back the admission of a call that never reached WeChat: it stays counted");
        }
    }
}
