//! Phase 8, answer: WeChat's answer, read for its `errcode` without getting
//! in its way ([`crate::transport::sniff`]); sent once more if a feature
//! asks ([`Feature::resend`]: the client gets only the second answer);
//! handed to the features' [`Feature::on_answer`] hooks; and turned into
//! what the client gets: WeChat's answer as it came but for hop-by-hop
//! headers, or, when a hook found WeChat penalised the call, a penalty
//! refusal with WeChat's body unchanged (the one table,
//! [`crate::error::penalised`]), with the headers of
//! [`Feature::on_response`].
//!
//! [`Feature::resend`]: crate::features::hooks::Feature::resend
//! [`Feature::on_answer`]: crate::features::hooks::Feature::on_answer
//! [`Feature::on_response`]: crate::features::hooks::Feature::on_response

use http::Response;
use hyper::body::Incoming;

use super::call::{Arrived, Call, Routed};
use crate::admit::activity::ActivityGuard;
use crate::error::Early;
use crate::features::hooks::Answered;
use crate::proxy::app::App;
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
    /// A call whose body a feature kept: what it needs to be sent once more.
    pub resend: Option<Box<super::resend::Resend>>,
}

/// An answer's head, its body (read whole when small) and its verdict.
pub async fn read(
    resp: Response<Incoming>,
    stall: std::time::Duration,
    cap: usize,
) -> Result<(http::response::Parts, RelayBody, Verdict), Early> {
    Ok(sniff(resp, stall, cap).await.map_err(|e| match e {
        SniffError::Stalled(d) => UpstreamError::BodyStalled(d),
        SniffError::Upstream(e) => UpstreamError::Failed(format!("reading the answer: {e}")),
    })?)
}

/// The answer's view for the features' hooks (from the call's fields, so
/// that its features' contexts stay free to lend).
fn answered<'a>(
    arrived: &'a Arrived,
    route: &'a Routed,
    who: &'a crate::features::hooks::Who,
    target: &'a http::uri::PathAndQuery,
    verdict: Verdict,
    body: Option<&'a bytes::Bytes>,
    admitted: Option<&'a crate::admit::Admitted>,
) -> Answered<'a> {
    Answered {
        config: &arrived.config,
        account: &who.account,
        counted: who.counted(),
        path: &arrived.path,
        target,
        intercepted: arrived.intercepted.as_ref().map(|h| &*h.name),
        domain: arrived.domain,
        verdict,
        errcode: errcode(verdict),
        body,
        rule: route.rule.as_deref(),
        admitted,
        penalty: None,
    }
}

/// The errcode a verdict reports (0: success; `None`: not a WeChat JSON answer).
fn errcode(verdict: Verdict) -> Option<i64> {
    match verdict {
        Verdict::Errcode(code) => Some(code),
        Verdict::Success => Some(0),
        Verdict::Unknown => None,
    }
}

/// Reads the answer, runs the features' hooks on it, and builds what the
/// client gets. A feature may first have the call sent once more
/// ([`crate::features::hooks::Feature::resend`]): the client gets only the
/// second answer.
pub async fn answer(app: &App, call: &mut Call, mut forwarded: Forwarded) -> Result<Response<RelayBody>, Early> {
    let stall = call.arrived.config.server.body_timeout;
    let env = app.env();
    let (mut parts, mut body, mut verdict) = read(forwarded.resp, stall, call.answer_cap).await?;
    if let Some(resend) = forwarded.resend.take() {
        let view = answered(&call.arrived, &call.route, &call.who, &forwarded.target, verdict, body.whole(), None);
        if let Some(target) = app.features.resend(env, &mut call.features, &view).await {
            // Boxed: rare, and a whole call of its own.
            let resp = Box::pin(super::resend::resend(app, call, &resend, &target)).await?;
            forwarded.target = target;
            (parts, body, verdict) = read(resp, stall, call.answer_cap).await?;
        }
    }
    strip_hop_by_hop(&mut parts.headers);
    call.errcode = errcode(verdict);
    if let (Some(code), Some(m)) = (call.errcode, &call.route.metrics) {
        m.errcode(code);
    }
    let admitted = call.admission.admitted.take();
    let whole = body.whole();
    let mut view =
        answered(&call.arrived, &call.route, &call.who, &forwarded.target, verdict, whole, admitted.as_ref());
    app.features.on_answer(env, &mut call.features, &mut view).await;
    let Some(rule) = view.rule else {
        return Ok(Response::from_parts(parts, body.holding(forwarded.guards)));
    };
    if let Some(wait_us) = view.penalty {
        let caller_status = call.who.caller.policy().and_then(|p| p.throttle_status);
        call.outcome = crate::error::penalised(&mut parts, rule, view.config, caller_status, wait_us);
    }
    app.features.on_response(&call.features, &view, &mut parts.headers);
    // The body holds the in-flight count, the activity count and the
    // concurrency slot until it is sent (one allocation for the three).
    let slot = admitted.and_then(|a| a.slot);
    Ok(Response::from_parts(parts, body.holding((forwarded.guards, slot))))
}
