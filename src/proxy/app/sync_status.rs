//! What quota_sync knows per (account, rule state), on this instance: when
//! it syncs next, what it found, and its back-off after errors. Pure
//! bookkeeping over store time (the injected clock), so tests drive it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

use crate::time::Micros;

/// Longest back-off after errors.
pub const MAX_BACKOFF_US: Micros = 6 * 3_600_000_000;

/// One (account, rule state)'s sync.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sync {
    /// When it is due next (0: at once).
    pub next_at: Micros,
    /// Errors in a row (the back-off doubles with each).
    pub failures: u32,
    /// The last successful sync, and what it found: WeChat's `used`, and
    /// `used` less wxgate's day count then (positive: calls wxgate had not seen).
    pub last_sync_at: Option<Micros>,
    pub wechat_used: Option<u64>,
    pub gap: Option<i64>,
    /// The last error, if the last try failed.
    pub last_error: Option<String>,
    /// quota/get calls this instance made for it.
    pub calls: u64,
}

impl Sync {
    /// A sync answered: next one `every_us` later.
    pub fn succeeded(&mut self, now: Micros, every_us: Micros, used: u64, before: u64) {
        self.calls += 1;
        self.failures = 0;
        self.next_at = now.saturating_add(every_us);
        self.last_sync_at = Some(now);
        self.wechat_used = Some(used);
        self.gap = Some(used as i64 - before as i64);
        self.last_error = None;
    }

    /// A sync failed: the next try waits `every_us` doubled per error in a
    /// row (capped at [`MAX_BACKOFF_US`]), or until `not_before` if later
    /// (quota/get's own quota spent: the next quota day).
    pub fn failed(&mut self, now: Micros, every_us: Micros, why: String, not_before: Option<Micros>, called: bool) {
        if called {
            self.calls += 1;
        }
        self.failures = self.failures.saturating_add(1);
        let factor = 1i64 << self.failures.min(20);
        let wait = every_us.saturating_mul(factor).min(MAX_BACKOFF_US.max(every_us));
        self.next_at = now.saturating_add(wait).max(not_before.unwrap_or(0));
        self.last_error = Some(why);
    }

    /// Another instance synced this interval: look again one interval later.
    pub fn skipped(&mut self, now: Micros, every_us: Micros) {
        self.next_at = now.saturating_add(every_us);
    }

    /// As `/v1/buckets` shows it (times in store µs and seconds from `now`).
    pub fn describe(&self, now: Micros, path: &str) -> Value {
        json!({
            "path": path,
            "last_sync_ago_seconds": self.last_sync_at.map(|t| (now - t) as f64 / 1e6),
            "wechat_used": self.wechat_used,
            "gap": self.gap,
            "next_sync_in_seconds": ((self.next_at - now).max(0) as f64 / 1e6),
            "errors_in_a_row": self.failures,
            "last_error": self.last_error,
            "calls": self.calls,
        })
    }
}

/// Every sync of this instance, by (account, rule state).
#[derive(Default)]
pub struct SyncStatus {
    syncs: Mutex<HashMap<(String, Arc<str>), Sync>>,
    /// Held by a round of syncs (`crate::ops::quota_sync::round`): one at a
    /// time, so a sync that is due is made once.
    pub round: tokio::sync::Mutex<()>,
}

impl SyncStatus {
    /// The sync of (account, state), if any.
    pub fn get(&self, account: &str, state: &str) -> Option<Sync> {
        let all = self.syncs.lock().unwrap_or_else(|e| e.into_inner());
        all.iter().find(|((a, s), _)| a == account && &**s == state).map(|(_, v)| v.clone())
    }

    /// Changes the sync of (account, state) with `f`.
    pub fn update<T>(&self, account: &str, state: &Arc<str>, f: impl FnOnce(&mut Sync) -> T) -> T {
        let mut all = self.syncs.lock().unwrap_or_else(|e| e.into_inner());
        f(all.entry((account.to_owned(), state.clone())).or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Micros = 60_000_000;

    #[test]
    fn errors_back_off_doubling_up_to_a_cap_and_a_success_resets() {
        let mut s = Sync::default();
        s.failed(0, 10 * MIN, "e".into(), None, true);
        assert_eq!(s.next_at, 20 * MIN);
        s.failed(20 * MIN, 10 * MIN, "e".into(), None, true);
        assert_eq!(s.next_at, 20 * MIN + 40 * MIN);
        for _ in 0..30 {
            s.failed(0, 10 * MIN, "e".into(), None, true);
        }
        assert_eq!(s.next_at, MAX_BACKOFF_US, "capped");
        s.failed(0, 10 * MIN, "45009".into(), Some(MAX_BACKOFF_US * 2), true);
        assert_eq!(s.next_at, MAX_BACKOFF_US * 2, "quota/get's own quota: not before the next day");
        s.succeeded(100, 10 * MIN, 50, 30);
        assert_eq!((s.next_at, s.failures, s.gap, s.last_error.clone()), (100 + 10 * MIN, 0, Some(20), None));
        assert_eq!(s.calls, 34);
    }
}
