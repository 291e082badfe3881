//! Calls wxgate makes itself ([`OwnCall`]: a token fetch; later, a delivery
//! made on a caller's behalf): the phases of a client's call from route
//! on (route, the `on_request` hooks, `before_decide`, decide,
//! `before_forward`, forward, answer), with no client: nothing to hold a
//! call for but its rule's wait, and no access-log line. Counted under
//! its rule like any call. The features reach it through
//! [`crate::features::hooks::Env::calls`].

use http::uri::PathAndQuery;
use http::{Method, StatusCode};

use super::call::Call;
use super::{answer, decide, forward, meter, respond, route, traces};
use crate::error::{Early, ProxyError};
use crate::features::hooks::{Asking, Calls, OwnAnswer, OwnCall, OwnFuture, Requesting, Seeds, Sending};
use crate::proxy::app::App;

impl Calls for App {
    fn call(&self, own: OwnCall) -> OwnFuture<'_> {
        Box::pin(call(self, own))
    }
}

/// Runs `own` through the phases: WeChat's errcode and (small) body, or
/// why it was not sent or not answered.
pub async fn call(app: &App, own: OwnCall) -> Result<OwnAnswer, ProxyError> {
    let OwnCall { config, account, domain, method, target, body, mut seeds, queued_by, submitted } = own;
    let queued = queued_by.is_some();
    let caller = queued_by.unwrap_or_else(|| app.callers.load().fallback());
    let mut call = Call::new(method.clone(), target.path(), config, caller);
    call.arrived.domain = domain;
    call.who.account = account;
    call.who.own = true;
    call.who.queued = queued;
    call.body = Some(body);
    traces::start_own(app, &mut call, submitted);
    route::route(app, &mut call);
    let result = match call.trace.as_ref().filter(|t| t.recording.is_some()).map(|t| t.ctx) {
        None => phases(app, &mut call, method, target, &mut seeds).await,
        // The calls this one makes (a token fetch for a queued send) are its children.
        Some(ctx) => {
            crate::telemetry::trace::CURRENT.scope(ctx, phases(app, &mut call, method, target, &mut seeds)).await
        }
    };
    match &result {
        Ok(_) => {}
        Err(e) => call.outcome = e.outcome(),
    }
    respond::count_and_log(app, &call, StatusCode::OK);
    let status = match &result {
        Ok(a) => StatusCode::from_u16(a.status).unwrap_or(StatusCode::OK),
        Err(e) => e.status(),
    };
    traces::finish(app, &mut call, status);
    result
}

async fn phases(
    app: &App,
    call: &mut Call,
    method: Method,
    target: PathAndQuery,
    seeds: &mut Seeds,
) -> Result<OwnAnswer, ProxyError> {
    let env = app.env();
    let arrived = &call.arrived;
    let mut requesting = Requesting {
        config: &arrived.config,
        method: &arrived.method,
        path: &arrived.path,
        target: &target,
        rule: call.route.rule.as_ref(),
        seeds,
        body: &mut call.body,
        incoming: None,
        named: None,
        who: &mut call.who,
        appid: None,
        authenticated: false,
    };
    let early = match app.features.on_request(env, &mut call.features, &mut requesting).await {
        Ok(()) => {
            let mut asking = Asking {
                config: &call.arrived.config,
                method: &call.arrived.method,
                path: &call.arrived.path,
                target: &target,
                body: call.body.as_ref(),
                who: &call.who,
                rule: call.route.rule.as_deref(),
                domain: call.arrived.domain,
            };
            app.features.before_decide(env, &mut call.features, &mut asking).await
        }
        Err(early) => Err(early),
    };
    early.map_err(|e| refused(call, e))?;
    meter::meter(call, None).await.map_err(|e| refused(call, e))?;
    decide::decide(app, call, None).await.map_err(|e| refused(call, e))?;
    let mut target = target;
    let mut sending =
        Sending { config: &call.arrived.config, who: &call.who, path: &call.arrived.path, target: &mut target };
    app.features.before_forward(env, &mut call.features, &mut sending).await.map_err(|e| refused(call, e))?;
    let outgoing = forward::prepare_own(app, call, method, &target)?;
    let forwarded = forward::forward(app, call, outgoing, target).await.map_err(|e| refused(call, e))?;
    let answered = answer::answer(app, call, forwarded).await.map_err(|e| refused(call, e))?;
    Ok(OwnAnswer { status: answered.status().as_u16(), errcode: call.errcode, body: answered.body().whole().cloned() })
}

/// A phase stopped the call: its refusal (an early answer a hook gave
/// is not one wxgate can use as WeChat's: a refusal too).
fn refused(call: &Call, early: Early) -> ProxyError {
    match early {
        Early::Refused(e) => e,
        Early::Answered(_, outcome) => {
            tracing::warn!(path = %call.arrived.path, outcome = outcome.as_str(), "a call wxgate made itself was answered by wxgate, not WeChat");
            ProxyError::Unavailable(crate::error::Unavailable::AnsweredEarly(outcome))
        }
    }
}
