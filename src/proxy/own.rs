//! Calls wxgate makes itself ([`OwnCall`]: a token or ticket fetch, a
//! quota/get, a queued job's send): the phases of a client's call, in the
//! same order (`crate::proxy::run`, from a [`Source::Own`]), with no
//! client: its target and body as its maker gave them, its caller and
//! account set by its maker, nothing to hold a call for but its rule's
//! wait, and no access-log line. Counted under its rule like any call. The
//! features reach it through [`crate::features::hooks::Env::calls`].

use http::StatusCode;

use super::call::Call;
use super::source::Source;
use super::{respond, spans};
use crate::error::{Early, ProxyError};
use crate::features::hooks::{Calls, OwnAnswer, OwnCall, OwnFuture};
use crate::proxy::app::App;

impl Calls for App {
    fn call(&self, own: OwnCall) -> OwnFuture<'_> {
        Box::pin(call(self, own))
    }
}

/// Runs `own` through the phases: WeChat's errcode and (small) body, or
/// why it was not sent or not answered.
pub async fn call(app: &App, own: OwnCall) -> Result<OwnAnswer, ProxyError> {
    let OwnCall { config, account, domain, method, target, body, seeds, queued_by, submitted, answer_cap } = own;
    let queued = queued_by.is_some();
    let caller = queued_by.unwrap_or_else(|| app.callers.load().fallback());
    let mut call = Call::new(method, target.path(), config, caller);
    call.arrived.domain = domain;
    call.who.account = account;
    call.who.own = true;
    call.answer_cap = answer_cap.max(crate::transport::sniff::SNIFF_CAP);
    call.who.queued = queued;
    spans::start_own(app, &mut call, submitted);
    let source = Source::Own { target, body, seeds };
    let answered = match call.trace.as_ref().filter(|t| t.recording.is_some()).map(|t| t.ctx) {
        None => super::run(app, &mut call, source).await,
        // The calls this one makes (a token fetch for a queued send) are its children.
        Some(ctx) => crate::telemetry::trace::CURRENT.scope(ctx, super::run(app, &mut call, source)).await,
    };
    let result = match answered {
        Ok(resp) => Ok(OwnAnswer {
            status: resp.status().as_u16(),
            errcode: call.errcode,
            body: resp.body().whole().cloned(),
            held_us: call.admission.held_us,
            upstream_us: call.sent.upstream_us,
        }),
        Err(early) => Err(refused(&call, early)),
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
    spans::finish(app, &mut call, status);
    result
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
