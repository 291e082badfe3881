//! `RateLimit-Policy` and `RateLimit` headers, per the IETF httpapi draft
//! "RateLimit header fields for HTTP", draft-ietf-httpapi-ratelimit-headers-11
//! (May 2026; the syntax is unchanged since -08): structured-field lists of
//! `"<policy>";q=<quota>;w=<window s>` and `"<policy>";r=<remaining>;t=<reset s>`.
//! A policy is one limit of the rule, named `<rule>.<window>` (`send.60s`,
//! `send.day`). Turned off with `[server] ratelimit_headers = false`.

use http::header::{HeaderMap, HeaderName, HeaderValue};

use crate::limit::clock::Micros;
use crate::limit::{Limit, Quota, Reason, Rule};

pub const POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

fn secs_up(us: Micros) -> i64 {
    (us.max(0) + 999_999) / 1_000_000
}

fn policy_name(rule: &Rule, limit: &Limit) -> String {
    format!("{}.{}", rule.name, limit.policy().0)
}

/// The `RateLimit-Policy` value of a rule: the same for every call, so
/// compiled once with the rule (`Rule::policy_header`).
pub fn policy_header(rule: &Rule) -> Option<HeaderValue> {
    if rule.limits.is_empty() {
        return None;
    }
    let list: Vec<String> = rule
        .limits
        .iter()
        .map(|l| {
            let (_, q, w) = l.policy();
            format!("\"{}\";q={q};w={w}", policy_name(rule, l))
        })
        .collect();
    HeaderValue::from_str(&list.join(", ")).ok()
}

/// Each limit's `"<policy>";r=` prefix of `RateLimit`, compiled once with
/// the rule (`Rule::policy_prefixes`) so a call only appends two numbers.
pub fn policy_prefixes(rule: &Rule) -> Vec<String> {
    rule.limits.iter().map(|l| format!("\"{}\";r=", policy_name(rule, l))).collect()
}

fn policies(headers: &mut HeaderMap, rule: &Rule) {
    if let Some(v) = &rule.policy_header {
        headers.insert(POLICY, v.clone());
    }
}

fn current(headers: &mut HeaderMap, rule: &Rule, limit: usize, remaining: u64, reset_us: Micros) {
    let Some(prefix) = rule.policy_prefixes.get(limit) else { return };
    let mut value = Vec::with_capacity(prefix.len() + 28);
    value.extend_from_slice(prefix.as_bytes());
    value.extend_from_slice(itoa::Buffer::new().format(remaining).as_bytes());
    value.extend_from_slice(b";t=");
    value.extend_from_slice(itoa::Buffer::new().format(secs_up(reset_us)).as_bytes());
    if let Ok(v) = HeaderValue::from_maybe_shared(bytes::Bytes::from(value)) {
        headers.insert(RATELIMIT, v);
    }
}

/// On a forwarded call: every policy, and the one with least room left.
pub fn admitted(headers: &mut HeaderMap, rule: &Rule, quota: Option<Quota>) {
    if rule.limits.is_empty() {
        return;
    }
    policies(headers, rule);
    if let Some(q) = quota {
        current(headers, rule, q.limit, q.remaining, q.reset_us);
    }
}

/// On a refusal by a limit: every policy, and nothing left until the wait ends.
pub fn refused(headers: &mut HeaderMap, rule: &Rule, reason: Reason, wait_us: Micros) {
    if rule.limits.is_empty() {
        return;
    }
    policies(headers, rule);
    let limit = rule.limits.iter().position(|l| match reason {
        Reason::Rate => matches!(l, Limit::Window(_)),
        Reason::Quota => matches!(l, Limit::Calendar { .. }),
        Reason::Penalty | Reason::Concurrency | Reason::Reserve | Reason::Share => false,
    });
    if let Some(i) = limit {
        current(headers, rule, i, 0, wait_us);
    }
}
