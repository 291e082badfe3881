//! `RateLimit-Policy` and `RateLimit` headers, per the IETF httpapi draft
//! "RateLimit header fields for HTTP", draft-ietf-httpapi-ratelimit-headers-11
//! (May 2026; the syntax is unchanged since -08): structured-field lists of
//! `"<policy>";q=<quota>;w=<window s>` and `"<policy>";r=<remaining>;t=<reset s>`.
//! A policy is one limit of the rule, named `<rule>.<window>` (`send.60s`,
//! `send.day`). Turned off with `[server] ratelimit_headers = false`.

use http::header::{HeaderMap, HeaderName, HeaderValue};

use crate::limit::{Limit, Quota, Reason, Rule};
use crate::time::Micros;

pub const POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

fn secs_up(us: Micros) -> i64 {
    (us.max(0) + 999_999) / 1_000_000
}

fn policy_name(rule: &Rule, limit: &Limit) -> String {
    format!("{}.{}", rule.name, limit.policy().0)
}

/// A rule's `RateLimit-Policy` value and each limit's `"<policy>";r=`
/// prefix of `RateLimit`: the same for every call, so built once with the
/// rule's config (`crate::config::Config::answers`) and a call only appends
/// two numbers.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    header: Option<HeaderValue>,
    prefixes: Vec<String>,
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

    fn current(&self, headers: &mut HeaderMap, limit: usize, remaining: u64, reset_us: Micros) {
        let Some(prefix) = self.prefixes.get(limit) else { return };
        let mut value = Vec::with_capacity(prefix.len() + 28);
        value.extend_from_slice(prefix.as_bytes());
        value.extend_from_slice(itoa::Buffer::new().format(remaining).as_bytes());
        value.extend_from_slice(b";t=");
        value.extend_from_slice(itoa::Buffer::new().format(secs_up(reset_us)).as_bytes());
        if let Ok(v) = HeaderValue::from_maybe_shared(bytes::Bytes::from(value)) {
            headers.insert(RATELIMIT, v);
        }
    }

    fn policies(&self, headers: &mut HeaderMap) {
        if let Some(v) = &self.header {
            headers.insert(POLICY, v.clone());
        }
    }
}

/// On a forwarded call: every policy, and the one with least room left.
pub fn admitted(headers: &mut HeaderMap, rule: &Rule, policy: &Policy, quota: Option<Quota>) {
    if rule.limits.is_empty() {
        return;
    }
    policy.policies(headers);
    if let Some(q) = quota {
        policy.current(headers, q.limit, q.remaining, q.reset_us);
    }
}

/// On a refusal by a limit: every policy, and nothing left until the wait ends.
pub fn refused(headers: &mut HeaderMap, rule: &Rule, policy: &Policy, reason: Reason, wait_us: Micros) {
    if rule.limits.is_empty() {
        return;
    }
    policy.policies(headers);
    let limit = rule.limits.iter().position(|l| match reason {
        Reason::Rate => matches!(l, Limit::Window(_)),
        Reason::Quota => matches!(l, Limit::Calendar { .. }),
        Reason::Penalty | Reason::Concurrency | Reason::Reserve | Reason::Share | Reason::Recipient => false,
    });
    if let Some(i) = limit {
        policy.current(headers, i, 0, wait_us);
    }
}
