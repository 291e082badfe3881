//! The features of a call, in the order their hooks ([`crate::features::hooks`])
//! run; the phases of [`crate::proxy`] run them without knowing which they
//! are. Adding a feature: its module, an `impl Feature` with the hooks it
//! needs, and its place in the `features!` list below.

pub mod accounts;
pub mod base;
pub mod broker;
pub mod callers;
pub mod hooks;
pub mod penalties;
pub mod quota_clear;
pub mod token_cache;
pub mod warmup;

use http::HeaderMap;

use crate::features::hooks::{Answered, Feature};

/// `Features` (the type) and `FEATURES` (its value) from one list of unit
/// features, so the two cannot disagree.
macro_rules! features {
    ($($feature:path),+ $(,)?) => {
        pub type Features = ($($feature,)+);
        pub const FEATURES: Features = ($($feature,)+);
    };
}

// The features, in the order their hooks run. The penalties' hook runs
// after the token and account features', as WeChat's answer is reported to
// the store last.
features!(
    broker::Broker,
    token_cache::TokenCacheFeature,
    accounts::Learning,
    quota_clear::QuotaClear,
    warmup::Warmup,
    penalties::Penalties,
    RateLimitHeaders,
);

/// The RateLimit headers as a feature: on every admitted call's answer,
/// the rule's policies and the room left in its tightest limit
/// ([`crate::telemetry::ratelimit_headers::admitted`]). Refusals get theirs from the one table
/// ([`crate::error`], [`crate::telemetry::ratelimit_headers::refused`]).
pub struct RateLimitHeaders;

impl Feature for RateLimitHeaders {
    fn on_response(&self, answered: &Answered<'_>, headers: &mut HeaderMap) {
        if let (Some(rule), Some(a), true) =
            (answered.rule, answered.admitted, answered.config.server.ratelimit_headers)
        {
            let policy = &answered.config.rule_http(Some(rule)).policy;
            crate::telemetry::ratelimit_headers::admitted(headers, rule, policy, a.quota);
        }
    }
}
