//! The `RateLimit-Policy` and `RateLimit` response headers: on a forwarded
//! call's answer ([`admitted`], by the RateLimit headers feature) and on a
//! refusal by a limit ([`refused`], by the one table, [`super::ProxyError`]).
//! Their text is built with the rule ([`crate::config::ratelimit`]); a call
//! only appends two numbers.

use http::header::{HeaderMap, HeaderName, HeaderValue};

use crate::config::ratelimit::Policy;
use crate::limit::{Limit, Quota, Reason, Rule};
use crate::time::Micros;

pub const POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

fn secs_up(us: Micros) -> i64 {
    (us.max(0) + 999_999) / 1_000_000
}

/// `RateLimit: "<policy>";r=<remaining>;t=<reset s>` for the rule's limit `limit`.
fn current(headers: &mut HeaderMap, policy: &Policy, limit: usize, remaining: u64, reset_us: Micros) {
    let Some(prefix) = policy.prefix(limit) else { return };
    let (mut r, mut t) = (itoa::Buffer::new(), itoa::Buffer::new());
    let (r, t) = (r.format(remaining).as_bytes(), t.format(secs_up(reset_us)).as_bytes());
    // Exactly its length: a full `Vec` becomes `Bytes` without a second
    // allocation (a partly filled one allocates its shared header).
    let mut value = Vec::with_capacity(prefix.len() + r.len() + 3 + t.len());
    value.extend_from_slice(prefix.as_bytes());
    value.extend_from_slice(r);
    value.extend_from_slice(b";t=");
    value.extend_from_slice(t);
    if let Ok(v) = HeaderValue::from_maybe_shared(bytes::Bytes::from(value)) {
        headers.insert(RATELIMIT, v);
    }
}

/// `RateLimit-Policy`: every limit of the rule.
fn policies(headers: &mut HeaderMap, policy: &Policy) {
    if let Some(v) = policy.header() {
        headers.insert(POLICY, v.clone());
    }
}

/// On a forwarded call: every policy, and the one with least room left.
pub fn admitted(headers: &mut HeaderMap, rule: &Rule, policy: &Policy, quota: Option<Quota>) {
    if rule.limits.is_empty() {
        return;
    }
    policies(headers, policy);
    if let Some(q) = quota {
        current(headers, policy, q.limit, q.remaining, q.reset_us);
    }
}

/// On a refusal by a limit: every policy, and nothing left until the wait ends.
pub fn refused(headers: &mut HeaderMap, rule: &Rule, policy: &Policy, reason: Reason, wait_us: Micros) {
    if rule.limits.is_empty() {
        return;
    }
    policies(headers, policy);
    let limit = rule.limits.iter().position(|l| match reason {
        Reason::Rate => matches!(l, Limit::Window(_)),
        Reason::Quota => matches!(l, Limit::Calendar { .. }),
        Reason::Penalty | Reason::Concurrency | Reason::Reserve | Reason::Share | Reason::Recipient => false,
    });
    if let Some(i) = limit {
        current(headers, policy, i, 0, wait_us);
    }
}
