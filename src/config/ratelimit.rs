//! A rule's RateLimit header text, built once with the rule
//! ([`super::RuleHttp::policy`]): the `RateLimit-Policy` value, and each
//! limit's `"<policy>";r=` prefix of `RateLimit`, the same for every call.
//! The headers are written onto answers by [`crate::error::ratelimit`].
//!
//! Per the IETF httpapi draft "RateLimit header fields for HTTP",
//! draft-ietf-httpapi-ratelimit-headers-11 (May 2026; the syntax is
//! unchanged since -08): structured-field lists of
//! `"<policy>";q=<quota>;w=<window s>` and `"<policy>";r=<remaining>;t=<reset s>`.
//! A policy is one limit of the rule, named `<rule>.<window>` (`send.60s`,
//! `send.day`). Turned off with `[server] ratelimit_headers = false`.

use http::header::HeaderValue;

use crate::limit::{Limit, Rule};

/// A rule's `RateLimit-Policy` value and each limit's `"<policy>";r=`
/// prefix of `RateLimit`: a call only appends two numbers.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    header: Option<HeaderValue>,
    prefixes: Vec<String>,
}

fn policy_name(rule: &Rule, limit: &Limit) -> String {
    format!("{}.{}", rule.name, limit.policy().0)
}

impl Policy {
    pub fn of(rule: &Rule) -> Policy {
        if rule.limits.is_empty() {
            return Policy::default();
        }
        let list: Vec<String> = rule
            .limits
            .iter()
            .map(|l| {
                let (_, q, w) = l.policy();
                format!("\"{}\";q={q};w={w}", policy_name(rule, l))
            })
            .collect();
        Policy {
            header: HeaderValue::from_str(&list.join(", ")).ok(),
            prefixes: rule.limits.iter().map(|l| format!("\"{}\";r=", policy_name(rule, l))).collect(),
        }
    }

    /// The `RateLimit-Policy` value (`None`: a rule without limits).
    pub fn header(&self) -> Option<&HeaderValue> {
        self.header.as_ref()
    }

    /// The `"<policy>";r=` prefix of the rule's limit `limit`.
    pub fn prefix(&self, limit: usize) -> Option<&str> {
        self.prefixes.get(limit).map(String::as_str)
    }
}
