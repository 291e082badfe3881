//! The circuit breaker: after `breaker_failures` Redis failures in a row,
//! calls stop waiting on Redis (they go straight to the fallback) until a
//! probe's write succeeds. Also the rate-limited log of degraded decisions.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::config::Fallback;
use crate::limit::clock::Stopwatch;
use crate::store::StoreError;

/// Degraded decisions are logged at most once per this long.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// Circuit-breaker state, readable by metrics and health checks.
#[derive(Default)]
pub struct Breaker {
    failures: AtomicU32,
    open: AtomicBool,
    /// Decisions made without Redis since start.
    pub degraded: AtomicU64,
    log: Mutex<LogState>,
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

    /// Counts one degraded decision; logs the first of a run at once and then
    /// at most one summary line per [`LOG_EVERY`].
    pub fn degraded(&self, why: &StoreError, fallback: Fallback) {
        self.degraded.fetch_add(1, Ordering::Relaxed);
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        log.unlogged += 1;
        let due = log.last.is_none_or(|t| t.elapsed() >= LOG_EVERY);
        if due {
            tracing::warn!(error = %why, ?fallback, decisions = log.unlogged, "Redis unavailable: deciding without it");
            log.last = Some(Stopwatch::start());
            log.unlogged = 0;
        }
    }
}
