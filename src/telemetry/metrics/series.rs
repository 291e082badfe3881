//! The series a subsystem keeps and feeds itself: clones of the app's
//! metrics, fetched once so that the hot path touches no label sets.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;

use super::labels::{FailoverLabels, FileOp, OpLabel, Outcome, ResultLabel, TriedLabels, UpstreamLabel, OUTCOMES};

/// The token cache's series (`crate::features::token_cache`, `crate::ops::quota_sync`):
/// clones of the app's metrics.
#[derive(Clone, Default)]
pub struct TokenMetrics {
    /// Token requests answered from the cache (at once or after waiting
    /// for another request's fetch, whose refusal they get if WeChat refused it).
    pub from_cache: Counter,
    /// Token requests that went to WeChat as their slot's one fetch.
    pub fetched: Counter,
    /// Token requests that went to WeChat without the cache (not
    /// cacheable, or the store could not answer).
    pub passed: Counter,
    /// Token requests that waited `[tokens] wait` for another's fetch (503).
    pub timed_out: Counter,
    /// Cached tokens dropped because WeChat rejected them (40001, 40014, 42001).
    pub invalidations: Counter,
    /// quota/get calls of quota_sync, by result.
    pub syncs: Family<ResultLabel, Counter>,
    /// Calls wxgate added an `[[account]]`'s token to.
    pub injected: Counter,
    /// Injected calls sent once more with a new token after WeChat
    /// rejected the first (40001, 40014, 42001).
    pub resent: Counter,
    /// Tokens of `[[account]]`s renewed ahead of expiry, by result.
    pub renewals: Family<ResultLabel, Counter>,
}

impl TokenMetrics {
    pub fn sync(&self, result: &str) {
        self.syncs.get_or_create(&ResultLabel { result: result.to_owned() }).inc();
    }

    pub fn renewal(&self, result: &str) {
        self.renewals.get_or_create(&ResultLabel { result: result.to_owned() }).inc();
    }
}

/// The embedded store's series (`crate::store::memory`): clones of the
/// app's metrics, fed by the store.
#[derive(Clone, Default)]
pub struct MemoryStoreMetrics {
    /// (account, rule) states held.
    pub entries: Gauge,
    /// New (account, rule) pairs refused for want of room (`max_entries`),
    /// and calls that would add recipients past `max_recipients`.
    pub full: Counter,
    /// Recipients' states held (`per_recipient`), all pairs together.
    pub recipients: Gauge,
    /// State file reads and writes that failed.
    pub file_errors: Family<OpLabel, Counter>,
    /// State file writes that succeeded.
    pub saves: Counter,
    /// When the state file was last written, in Unix seconds (0: never).
    pub last_save: Gauge,
}

impl MemoryStoreMetrics {
    pub fn file_error(&self, op: FileOp) {
        self.file_errors.get_or_create(&OpLabel { op }).inc();
    }

    pub fn file_errors(&self, op: FileOp) -> u64 {
        self.file_errors.get_or_create(&OpLabel { op }).get()
    }
}

/// The upstreams' series (`crate::transport::upstream`), labelled by the configured
/// upstreams' `host[:port]` only: clones of the app's metrics, fed by the
/// upstream client.
#[derive(Clone, Default)]
pub struct UpstreamMetrics {
    /// Tries of calls at each upstream, by what became of them.
    pub requests: Family<TriedLabels, Counter>,
    /// Calls that moved on from one upstream to the next, never sent to the first.
    pub failovers: Family<FailoverLabels, Counter>,
    /// 1 while an upstream takes calls, 0 while it is skipped after a failure.
    pub up: Family<UpstreamLabel, Gauge>,
}

/// Errcodes that get their own series; all others are `other`.
pub(super) const KNOWN_ERRCODES: [i64; 12] =
    [-1, 0, 40001, 40014, 42001, 45009, 45011, 45015, 45033, 45047, 48001, 48006];

/// One rule's series, fetched once and kept: the hot path then touches no
/// label sets and allocates nothing for metrics.
pub struct RuleMetrics {
    pub(super) calls: Vec<Counter>,
    pub(super) errcodes: Vec<Counter>,
    pub(super) other_errcode: Counter,
    pub decision: Histogram,
    pub upstream: Histogram,
    pub hold: Histogram,
    pub in_flight: Gauge,
    /// Calls that never reached WeChat and gave back what they took.
    pub refunds: Counter,
    /// `cost = "recipients"`: recipients of the admitted calls (person-times).
    pub recipients: Counter,
    /// Calls refused because a recipient was over its `per_recipient` limits.
    pub recipient_refusals: Counter,
}

impl RuleMetrics {
    pub fn call(&self, outcome: Outcome) {
        if let Some(c) = OUTCOMES.iter().position(|o| *o == outcome).and_then(|i| self.calls.get(i)) {
            c.inc();
        }
    }

    pub fn errcode(&self, code: i64) {
        match KNOWN_ERRCODES.iter().position(|c| *c == code).and_then(|i| self.errcodes.get(i)) {
            Some(c) => c.inc(),
            None => self.other_errcode.inc(),
        };
    }
}

/// One caller's series (a declared caller, or `other`), fetched when the
/// callers are built (start, reload): a call then costs one increment.
#[derive(Clone)]
pub struct CallerMetrics {
    pub(super) calls: Vec<Counter>,
    /// Calls its flood guard refused (`[[caller]] rate`).
    pub rate_refusals: Counter,
    /// `caller_auth = "required"`: calls that proved no caller (on `other`'s
    /// series) and calls for an account it is not granted.
    pub unauthenticated: Counter,
    pub forbidden: Counter,
}

impl CallerMetrics {
    pub fn call(&self, outcome: Outcome) {
        if let Some(c) = OUTCOMES.iter().position(|o| *o == outcome).and_then(|i| self.calls.get(i)) {
            c.inc();
        }
    }
}
