//! Phase 7, answer: WeChat's answer, read for its `errcode` without getting
//! in its way ([`crate::transport::sniff`]), handed to the features' hooks
//! ([`Feature::on_answer`]: the token cache, learning, clear_quota,
//! warm-up, penalties), and turned into what the client gets: WeChat's
//! answer as it came but for hop-by-hop headers, or, when WeChat penalised
//! the call, a penalty refusal with WeChat's body unchanged (the one table,
//! [`crate::error::penalised`]), with the headers of
//! [`Feature::on_response`] (RateLimit).

use http::Response;
use hyper::body::Incoming;

use super::call::Call;
use crate::admit::activity::ActivityGuard;
use crate::app::App;
use crate::error::Early;
use crate::features::broker;
use crate::features::hooks::{Answered, Feature};
use crate::features::token_cache::REJECTED;
use crate::features::FEATURES;
use crate::telemetry::metrics::InFlightGuard;
use crate::transport::body::RelayBody;
use crate::transport::sniff::{sniff, SniffError, Verdict};
use crate::transport::upstream::{strip_hop_by_hop, UpstreamError};

/// The upstream's answer to a forwarded call, with what must live as long
/// as its body is relayed (the in-flight gauge and count).
pub struct Forwarded {
    pub resp: Response<Incoming>,
    pub guards: (Option<InFlightGuard>, Option<ActivityGuard>),
    /// The path and query sent (the token cache reads a rejected call's token).
    pub target: http::uri::PathAndQuery,
    /// A call wxgate added a token to: what it needs to be sent once more.
    pub resend: Option<Box<super::resend::Resend>>,
}

/// WeChat rejected the token wxgate added to `call` (it did not act on the
/// call): one new token, and the call once more with it; its answer, or
/// `None` when no other token could be had (the first answer stands). The
/// caller sees only the answer it gets.
async fn once_more(
    app: &App,
    call: &mut Call,
    resend: &super::resend::Resend,
    sent: &mut http::uri::PathAndQuery,
    code: i64,
) -> Result<Option<(http::response::Parts, RelayBody, Verdict)>, Early> {
    let Some(injected) = &mut call.injected else { return Ok(None) };
    let Some(token) = broker::after_rejection(app, &call.arrived.config, injected).await else { return Ok(None) };
    let target = broker::with_token(&injected.original, &token)?;
    injected.token = token;
    let resp = super::resend::resend(call, resend, &target).await?;
    if let Some(cache) = &app.token_cache {
        cache.metrics.resent.inc();
    }
    tracing::info!(account = %call.who.account, path = %call.arrived.path, errcode = code, "WeChat rejected the token wxgate added: sent once more with a new one");
    *sent = target;
    read(resp, call.arrived.config.server.body_timeout).await.map(Some)
}

/// An answer's head, its body (read whole when small) and its verdict.
async fn read(
    resp: Response<Incoming>,
    stall: std::time::Duration,
) -> Result<(http::response::Parts, RelayBody, Verdict), Early> {
    Ok(sniff(resp, stall).await.map_err(|e| match e {
        SniffError::Stalled(d) => UpstreamError::BodyStalled(d),
        SniffError::Upstream(e) => UpstreamError::Failed(format!("reading the answer: {e}")),
    })?)
}

/// Reads the answer, runs the features' hooks on it, and builds what the
/// client gets.
pub async fn answer(app: &App, call: &mut Call, mut forwarded: Forwarded) -> Result<Response<RelayBody>, Early> {
    let stall = call.arrived.config.server.body_timeout;
    let (mut parts, mut body, mut verdict) = read(forwarded.resp, stall).await?;
    // WeChat rejected the token wxgate added (it did not act on the call):
    // one new token, and the call once more with it. The caller sees only
    // the second answer.
    if let (Verdict::Errcode(code), Some(resend)) = (verdict, &forwarded.resend) {
        if REJECTED.contains(&code) && call.injected.is_some() {
            // Boxed: rare, and a whole fetch and call of its own.
            if let Some(again) = Box::pin(once_more(app, call, resend, &mut forwarded.target, code)).await? {
                (parts, body, verdict) = again;
            }
        }
    }
    strip_hop_by_hop(&mut parts.headers);
    let body = body.holding(forwarded.guards);
    call.errcode = match verdict {
        Verdict::Errcode(code) => Some(code),
        Verdict::Success => Some(0),
        Verdict::Unknown => None,
    };
    if let (Some(code), Some(m)) = (call.errcode, &call.route.metrics) {
        m.errcode(code);
    }
    let admitted = call.decided.admitted.take();
    let mut answered = Answered {
        config: &call.arrived.config,
        account: &call.who.account,
        path: &call.arrived.path,
        target: &forwarded.target,
        intercepted: call.arrived.intercepted.as_ref().map(|h| &*h.name),
        verdict,
        errcode: call.errcode,
        body: body.whole(),
        rule: call.route.rule.as_deref(),
        admitted: admitted.as_ref(),
        learn: call.who.learn.take(),
        clearing: call.who.clearing.as_ref(),
        token_fetch: call.token_fetch.take(),
        penalty: None,
    };
    FEATURES.on_answer(app, &mut answered).await;
    let Some(rule) = answered.rule else {
        return Ok(Response::from_parts(parts, body));
    };
    if let Some(wait_us) = answered.penalty {
        call.outcome = crate::error::penalised(&mut parts, rule, &call.arrived.config, wait_us);
    }
    FEATURES.on_response(&answered, &mut parts.headers);
    let slot = admitted.and_then(|a| a.slot);
    Ok(Response::from_parts(parts, body.holding(slot)))
}
