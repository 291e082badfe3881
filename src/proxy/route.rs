//! Phase 2, route: the rule of the call's path ([`crate::config::routes`]),
//! and its metrics; after meter, a `scope = "app"` rule's state for the
//! call's WeCom app ([`app`]).

use std::sync::Arc;

use super::call::Call;
use crate::error::ProxyError;
use crate::limit::Scope;
use crate::proxy::app::App;
use crate::telemetry::metrics::NO_RULE;

/// Sets `call.route`. Every call is routed (a call without a rule gets the
/// `_none` series).
pub fn route(app: &App, call: &mut Call) {
    let rule = call.arrived.config.rule_in(call.arrived.domain, &call.arrived.path).cloned();
    call.route.metrics = Some(app.core.metrics.rule(rule.as_ref().map_or(NO_RULE, |r| &*r.name)));
    call.route.rule = rule;
}

/// After meter, for a call whose body names a WeCom app (its `agentid`,
/// [`crate::proxy::call::Metered::app`]): 400 if the call's account is a
/// WeCom app's `[[account]]` with another AgentId (WeCom would refuse it:
/// the token is that app's); and for a `scope = "app"` rule, the call's
/// rule becomes the account's (its `[[quota]]` override's) state for that
/// app ([`crate::limit::Rule::for_app`]), so that everything kept per account and state
/// (limits, recipients' windows, penalties, learned windows, refunds) is
/// kept per app; 400 naming the rule if the body names no app. A rule in
/// shadow mode refuses nothing here either: the call is logged and counted
/// as its rule (every app together). Calls of other rules are untouched.
pub fn app(call: &mut Call) -> Result<(), ProxyError> {
    let Some(rule) = &call.route.rule else { return Ok(()) };
    let app = call.meter.as_ref().and_then(|m| m.app.as_deref());
    let refusal = match (app, &call.who.wecom) {
        (Some(app), Some(account)) if !same_agent(account.agent.as_deref(), app) => Some(format!(
            "the body's agentid {app} is not the AgentId of account \"{}\" ({}): WeCom refuses a message whose \
             agentid is not the app its token is for; name the account of app {app}",
            account.name,
            account.agent.as_deref().unwrap_or("none")
        )),
        _ if rule.scope != Scope::App => return Ok(()),
        (Some(_), _) => None,
        (None, _) => Some(format!(
            "rule \"{}\" counts each WeCom app apart (scope = \"app\"): the body has no \"agentid\" naming its app",
            rule.name
        )),
    };
    match (refusal, app) {
        (Some(why), _) if rule.shadow => {
            tracing::info!(rule = %rule.name, why = %why, "shadow mode: would have refused this call (400); counted as its rule");
            Ok(())
        }
        (Some(why), _) => Err(ProxyError::BadRequest(why)),
        (None, Some(app)) => {
            let own = call.arrived.config.rule_of(&call.who.account, rule);
            let per_app = Arc::new(own.for_app(app));
            call.route.rule = Some(per_app);
            Ok(())
        }
        (None, None) => Ok(()),
    }
}

/// Whether the AgentId an `[[account]]` gives is `app` (both digits; the
/// body's read without leading zeros).
fn same_agent(agent: Option<&str>, app: &str) -> bool {
    agent.and_then(|a| a.parse::<u64>().ok()).is_some_and(|a| app.parse::<u64>().is_ok_and(|b| a == b))
}
