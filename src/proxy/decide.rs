//! Phase 6, decide: one store decision ([`crate::admit`]); the call is held
//! for its reserved slot or waits for a concurrency slot as its rule says,
//! or is refused here and never reaches WeChat.

use super::call::Call;
use crate::admit::{admit, ToAdmit};
use crate::error::{retry_after_secs, Early};
use crate::features::hooks::OWN_CALLER;
use crate::proxy::app::App;
use crate::telemetry::metrics::Outcome;
use crate::time::Stopwatch;
use crate::transport::downstream::Client;

/// Longest a queued job's send is held for its reserved slot: a queue
/// keeps several sends in flight, each decided at once and sent at its
/// slot's moment (paced by the store, never asking again); a slot further
/// away hands the job back to its queue. Well under the shortest `[queue]
/// lease` (5 s), which the dispatcher renews meanwhile.
pub const QUEUED_HOLD_US: crate::time::Micros = 1_000_000;

/// Admits the call (holding it or waiting for a slot as its rule
/// says) or refuses it. A call without a rule goes on undecided. `client`:
/// the call's client (`None`: a call wxgate makes itself).
pub async fn decide(app: &App, call: &mut Call, client: Option<&Client>) -> Result<(), Early> {
    let Some(routed) = &call.route.rule else { return Ok(()) };
    // The account's own limits (`[[quota]]`), for the decision and every
    // later phase (its answer's RateLimit headers, a penalty, a refund):
    // nothing is looked up in a config without overrides.
    let rule = call.arrived.config.rule_of(&call.who.account, routed).clone();
    if rule.account.is_some() {
        call.route.rule = Some(rule.clone());
    }
    let started = Stopwatch::start();
    let normal = call.who.caller.priority() != crate::config::Priority::High;
    let meter = match &call.meter {
        Some(m) => crate::admit::Meter { cost: m.cost, recipients: &m.recipients },
        None => crate::admit::Meter::ONE,
    };
    let (caller, normal) = match (call.who.own, call.who.queued) {
        // A queued job's send yields to live calls: never the reserve.
        (_, true) => (call.who.caller.entry.label(), true),
        // wxgate's own call (a token is what every call of the account
        // waits on): the rule's reserve is for it.
        (true, false) => (OWN_CALLER, false),
        (false, false) => (call.who.caller.entry.label(), normal),
    };
    // Decided with the margin this machine's scheduler needs now (the
    // rule itself unless widened); every later phase keeps the rule as
    // configured (a refund gives back no more than it took).
    let widened = app.core.margin.widened(&rule);
    let asked = ToAdmit {
        config: &call.arrived.config,
        account: call.who.counted(),
        rule: widened.as_ref().unwrap_or(&rule),
        normal,
        caller,
        meter,
        client,
        // A queued job is held only for a slot moments away
        // ([`QUEUED_HOLD_US`]); a refusal hands it back to its queue until
        // the refusal's wait is over.
        may_wait: !call.who.queued,
        queued_hold_us: call.who.queued.then_some(QUEUED_HOLD_US),
    };
    let traced_at = super::spans::now(call);
    let admitted = admit(&app.core, asked).await;
    call.admission.decision_us = match &admitted {
        Ok(a) => a.decision_us,
        Err(_) => started.elapsed_us(),
    };
    super::spans::decided(app, call, traced_at, admitted.as_ref().map(|a| (a.decision_us, a.held_us)));
    if let Some(m) = &call.route.metrics {
        m.observe_decision(call.admission.decision_us as f64 / 1e6, super::spans::exemplar(call));
    }
    if let (Some(m), Err(crate::error::ProxyError::Throttled { reason: crate::limit::Reason::Recipient, .. })) =
        (&call.route.metrics, &admitted)
    {
        m.recipient_refused();
    }
    let admitted = admitted?;
    if let (Some(m), Some(metered)) = (&call.route.metrics, &call.meter) {
        if call.config().rule_http(Some(&rule)).recipients.as_ref().is_some_and(|c| c.by_recipients) {
            m.recipients(metered.cost);
        }
    }
    call.admission.held_us = admitted.held_us;
    if admitted.held_us > 0 {
        call.outcome = Outcome::held;
        if let Some(m) = &call.route.metrics {
            m.observe_hold(admitted.held_us as f64 / 1e6, super::spans::exemplar(call));
        }
    }
    if admitted.degraded {
        call.outcome = Outcome::degraded;
    }
    if let Some((reason, wait_us)) = admitted.shadow_refusal {
        call.outcome = Outcome::shadow_throttled;
        tracing::info!(rule = %rule.name, account = %call.who.account, reason = reason.as_str(), wait_s = retry_after_secs(wait_us), "shadow mode: would have refused this call");
    }
    call.admission.admitted = Some(admitted);
    Ok(())
}
