//! The label sets of wxgate's series, and the values their labels take.
//! Labels name rules, callers, upstreams and results, never an account,
//! a token or a header's free value.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};

/// What became of one call. Every call counts exactly once.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Outcome {
    /// Sent to WeChat at once.
    forwarded,
    /// Sent to WeChat after being held for its reserved slot.
    held,
    /// Sent to WeChat on a decision made without Redis (fallback).
    degraded,
    /// Refused by a limit or the concurrency cap (429).
    throttled,
    /// Refused by a penalty, or WeChat answered a penalised errcode (429).
    penalised,
    /// Shadow mode: would have been refused, was forwarded.
    shadow_throttled,
    /// Malformed or refused request, or a request body the client
    /// malformed, cut short or stopped sending (400, 408, 413).
    rejected_bad_request,
    /// No decision could be made (503, `fallback = "deny"`).
    unavailable,
    /// WeChat unreachable, failed or too slow (502, 504).
    upstream_error,
    /// A token request answered from wxgate's token cache (never sent).
    cached,
    /// Refused because the call did not prove its caller (401) or its
    /// caller may not spend the account (403), `caller_auth = "required"`.
    unauthorized,
    /// Stored for queued delivery and answered 202 (sent later, by the
    /// dispatcher, as a call of its own).
    queued,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::forwarded => "forwarded",
            Outcome::held => "held",
            Outcome::degraded => "degraded",
            Outcome::throttled => "throttled",
            Outcome::penalised => "penalised",
            Outcome::shadow_throttled => "shadow_throttled",
            Outcome::rejected_bad_request => "rejected_bad_request",
            Outcome::unavailable => "unavailable",
            Outcome::upstream_error => "upstream_error",
            Outcome::cached => "cached",
            Outcome::unauthorized => "unauthorized",
            Outcome::queued => "queued",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuleLabel {
    pub rule: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallerLabel {
    pub caller: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallerReasonLabels {
    pub caller: String,
    pub reason: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallerOutcomeLabels {
    pub caller: String,
    pub outcome: Outcome,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub rule: String,
    pub outcome: Outcome,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrcodeLabels {
    pub rule: String,
    pub errcode: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabel {
    pub source: String,
}

/// An `[intercept] hosts` entry.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HostLabel {
    pub host: String,
}

/// What became of a `CONNECT` with `[intercept]` on.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Tunnel {
    /// TLS completed with the client: its calls are served.
    opened,
    /// Not a listed host on port 443: answered 400, nothing forwarded.
    refused,
    /// The TLS handshake failed (a client that does not trust the CA,
    /// bytes that are not TLS, an SNI that is not the CONNECT's host).
    handshake_failed,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TunnelLabels {
    pub result: Tunnel,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: String,
}

/// Units of quota leases, by what became of them: taken, spent, returned,
/// dropped.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LeaseLabel {
    pub what: String,
}

/// A day limit learned from WeChat, by rule and whether it lowered or
/// raised the pair's limit.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LearnedLabels {
    pub rule: String,
    pub direction: String,
}

/// What the state file was being used for.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum FileOp {
    load,
    save,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabel {
    pub op: FileOp,
}

/// What became of one try of a call at one upstream.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Tried {
    /// Its answer's head came.
    answered,
    /// Provably never reached it (no connection, TLS failed, handed back
    /// unwritten): the call went on to the next upstream, or got 502/504.
    not_sent,
    /// Sent (or partly), then no answer: a timeout, a reset, a broken answer.
    failed,
    /// The client's request body failed on the way (400, 408, 413).
    client_error,
}

impl Tried {
    pub const ALL: [Tried; 4] = [Tried::answered, Tried::not_sent, Tried::failed, Tried::client_error];
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UpstreamLabel {
    pub upstream: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TriedLabels {
    pub upstream: String,
    pub result: Tried,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailoverLabels {
    pub from: String,
    pub to: String,
}

/// Label for a call no rule matched.
pub const NO_RULE: &str = "_none";

/// Every [`Outcome`], in the order of the per-outcome series a rule or a
/// caller keeps.
pub(super) const OUTCOMES: [Outcome; 12] = [
    Outcome::forwarded,
    Outcome::held,
    Outcome::degraded,
    Outcome::throttled,
    Outcome::penalised,
    Outcome::shadow_throttled,
    Outcome::rejected_bad_request,
    Outcome::unavailable,
    Outcome::upstream_error,
    Outcome::cached,
    Outcome::unauthorized,
    Outcome::queued,
];
