//! The features of a call, in the order their hooks ([`crate::hooks`])
//! run; the phases of [`crate::proxy`] run them without knowing which they
//! are. Adding a feature: its module, an `impl Feature` with the hooks it
//! needs, and its place in [`Features`] and [`FEATURES`].

use http::HeaderMap;

use crate::hooks::{Answered, Feature};

/// The features, in the order their hooks run. The penalties' hook runs
/// after the token and account features', as WeChat's answer is reported
/// to the store last.
pub type Features = (
    crate::token_cache::TokenCacheFeature,
    crate::accounts::Learning,
    crate::quota_clear::QuotaClear,
    crate::warmup::Warmup,
    crate::penalties::Penalties,
    RateLimitHeaders,
);

pub const FEATURES: Features = (
    crate::token_cache::TokenCacheFeature,
    crate::accounts::Learning,
    crate::quota_clear::QuotaClear,
    crate::warmup::Warmup,
    crate::penalties::Penalties,
    RateLimitHeaders,
);

/// The RateLimit headers as a feature: on every admitted call's answer,
/// the rule's policies and the room left in its tightest limit
/// ([`crate::ratelimit::admitted`]). Refusals get theirs from the one table
/// ([`crate::error`], [`crate::ratelimit::refused`]).
pub struct RateLimitHeaders;

impl Feature for RateLimitHeaders {
    fn on_response(&self, answered: &Answered<'_>, headers: &mut HeaderMap) {
        if let (Some(rule), Some(a), true) =
            (answered.rule, answered.admitted, answered.config.server.ratelimit_headers)
        {
            crate::ratelimit::admitted(headers, rule, a.quota);
        }
    }
}
