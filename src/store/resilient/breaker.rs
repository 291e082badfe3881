//! The circuit breaker: after `breaker_failures` Redis failures in a row,
//! calls stop waiting on Redis (they go straight to the fallback) until a
//! probe's write succeeds. Also the rate-limited log of degraded decisions.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::config::Fallback;
use crate::limit::Key;
use crate::store::StoreError;
use crate::time::Stopwatch;

/// Degraded decisions are logged at most once per this long.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// Circuit-breaker state, readable by metrics and health checks.
#[derive(Default)]
pub struct Breaker {
    failures: AtomicU32,
    open: AtomicBool,
    /// Decisions made without Redis since start.
    pub degraded: AtomicU64,
    /// Decisions made without Redis because Redis was unavailable.
    log: Mutex<LogState>,
    /// Decisions made without Redis because one pair's keys were refused
    /// ([`StoreError::BadKey`]): logged apart, so that neither hides the other.
    bad_key_log: Mutex<LogState>,
}

#[derive(Default)]
struct LogState {
    last: Option<Stopwatch>,
    unlogged: u64,
}

impl Breaker {
    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    pub fn succeeded(&self) {
        self.failures.store(0, Ordering::Release);
    }

    /// Returns true when this failure opened the breaker.
    pub fn failed(&self, threshold: u32) -> bool {
        let n = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
        n >= threshold && !self.open.swap(true, Ordering::AcqRel)
    }

    /// Opens it at once (Redis was unreachable at start).
    pub fn open(&self) {
        self.open.store(true, Ordering::Release);
    }

    pub fn close(&self) {
        self.failures.store(0, Ordering::Release);
        self.open.store(false, Ordering::Release);
    }

    /// Counts one degraded decision (of `key`'s pair); logs the first of a
    /// run at once and then at most one summary line per [`LOG_EVERY`],
    /// saying what happened: Redis unavailable, or only this pair's keys
    /// refused (`WRONGTYPE`, a script failing on the key's data), Redis
    /// deciding every other pair.
    pub fn degraded(&self, why: &StoreError, fallback: Fallback, key: Key<'_>) {
        self.degraded.fetch_add(1, Ordering::Relaxed);
        let bad_key = matches!(why, StoreError::BadKey(_));
        let mut log = if bad_key { &self.bad_key_log } else { &self.log }.lock().unwrap_or_else(|e| e.into_inner());
        log.unlogged += 1;
        let due = log.last.is_none_or(|t| t.elapsed() >= LOG_EVERY);
        if due {
            if bad_key {
                tracing::warn!(
                    account = %key.account,
                    rule = %key.rule.name,
                    error = %why,
                    ?fallback,
                    decisions = log.unlogged,
                    "one pair's Redis key has the wrong type (or its script failed on the key's data): that pair \
                     is decided without Redis, by the fallback; Redis is available and decides every other pair \
                     (fix or delete the key)"
                );
            } else {
                tracing::warn!(error = %why, ?fallback, decisions = log.unlogged, "Redis unavailable: deciding without it");
            }
            log.last = Some(Stopwatch::start());
            log.unlogged = 0;
        }
    }
}
