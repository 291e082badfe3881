//! Phase 2, route: the rule of the call's path ([`crate::config::routes`]), and its metrics.

use super::call::Call;
use crate::proxy::app::App;
use crate::telemetry::metrics::NO_RULE;

/// Sets `call.route`. Every call is routed (a call without a rule gets the
/// `_none` series).
pub fn route(app: &App, call: &mut Call) {
    let rule = call.arrived.config.rule_in(call.arrived.domain, &call.arrived.path).cloned();
    call.route.metrics = Some(app.core.metrics.rule(rule.as_ref().map_or(NO_RULE, |r| &*r.name)));
    call.route.rule = rule;
}
