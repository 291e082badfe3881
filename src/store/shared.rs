//! The Redis store with its safety net: a per-decision timeout, a circuit
//! breaker, and a fallback for when Redis cannot answer.
//!
//! - Every Redis call has `[store] timeout`. A call that fails or times out
//!   is decided by `[store] fallback`: `local` (in-process, each limit divided
//!   by `[store] instances`), `allow` (forward unthrottled) or `deny` (503).
//! - After `breaker_failures` failures in a row the breaker opens: calls stop
//!   waiting on Redis and go straight to the fallback, while a background
//!   probe PINGs Redis every `breaker_open`. The first answer closes it and
//!   shared decisions resume by themselves.
//! - Degraded decisions are counted and logged at most once per 10 s.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use tokio::time::Instant;

use super::{Asking, MemoryStore, RedisStore, StoreError};
use crate::clock::{Clock, Micros};
use std::collections::HashMap;

use crate::limit::{Decision, Limit, Reason, Rule, RuleState, WindowLimit};
use crate::penalty::PenaltyPolicy;

/// What to do when Redis cannot decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// Decide in-process, each limit divided by the expected instance count.
    Local,
    /// Forward unthrottled.
    Allow,
    /// Refuse with 503.
    Deny,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resilience {
    pub fallback: Fallback,
    /// Expected number of wxgate instances sharing the limits.
    pub instances: u32,
    pub breaker_failures: u32,
    pub breaker_open: Duration,
    /// Answer known refusals locally (see [`SharedStore`]'s refusal cache).
    pub refusal_cache: bool,
}

impl Default for Resilience {
    fn default() -> Self {
        Resilience {
            fallback: Fallback::Local,
            instances: 1,
            breaker_failures: 3,
            breaker_open: Duration::from_secs(1),
            refusal_cache: true,
        }
    }
}

impl Resilience {
    /// No fallback at all: every Redis failure is an error (tests, benchmarks).
    pub fn strict() -> Self {
        Resilience { fallback: Fallback::Deny, ..Resilience::default() }
    }
}

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
    last: Option<Instant>,
    unlogged: u64,
}

const LOG_EVERY: Duration = Duration::from_secs(10);

impl Breaker {
    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    fn succeeded(&self) {
        self.failures.store(0, Ordering::Release);
    }

    /// Returns true when this failure opened the breaker.
    fn failed(&self, threshold: u32) -> bool {
        let n = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
        n >= threshold && !self.open.swap(true, Ordering::AcqRel)
    }

    fn close(&self) {
        self.failures.store(0, Ordering::Release);
        self.open.store(false, Ordering::Release);
    }

    /// Counts one degraded decision; logs the first of a run at once and then
    /// at most one summary line per [`LOG_EVERY`].
    fn degraded(&self, why: &StoreError, fallback: Fallback) {
        self.degraded.fetch_add(1, Ordering::Relaxed);
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        log.unlogged += 1;
        let due = log.last.is_none_or(|t| t.elapsed() >= LOG_EVERY);
        if due {
            tracing::warn!(error = %why, ?fallback, decisions = log.unlogged, "Redis unavailable: deciding without it");
            log.last = Some(Instant::now());
            log.unlogged = 0;
        }
    }
}

pub struct SharedStore {
    redis: RedisStore,
    local: MemoryStore,
    pub resilience: Resilience,
    pub breaker: Arc<Breaker>,
    counters: StoreCounters,
    /// Known refusals, one cache per serving thread ([`crate::worker`]) plus
    /// one for everything else: a lookup per call must not contend across
    /// threads. Forgetting clears them all.
    refusals: Box<[RefusalCache]>,
    shared_refusals: RefusalCache,
}

/// Local knowledge: once Redis has said an (account, rule) cannot admit
/// before some moment, this instance answers further calls of it itself until
/// then, without a round trip. Sound, because admissions only ever push the
/// earliest admissible moment later. Entries are kept at most
/// [`REFUSAL_CACHE_MAX`] (so a penalty lifted on another instance is seen
/// soon), only for rate, quota and penalty refusals (a concurrency slot can
/// free at any moment), and end `max_wait` early (from then on a call could
/// be held). A reload or a penalty change through this instance's admin API
/// drops them.
#[derive(Default)]
struct RefusalCache {
    /// (account, rule) → (refused until, on this instance's clock; why).
    entries: Mutex<Refusals>,
}

/// rule → account → (until, why): looked up by `&str`, without allocating.
type Refusals = HashMap<Arc<str>, HashMap<String, (Micros, Reason)>>;

/// Longest a refusal is answered locally.
pub const REFUSAL_CACHE_MAX_US: Micros = 1_000_000;
/// Shorter refusals are not kept: such an entry expires before it can save
/// more than a few round trips, which batching already amortises, and
/// answering some of an account's calls locally only splits its batches.
pub const REFUSAL_CACHE_MIN_US: Micros = 1_000;

impl RefusalCache {
    fn entries(&self) -> std::sync::MutexGuard<'_, Refusals> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The refusal still standing at `now`: time left and why.
    fn get(&self, account: &str, rule: &Rule, now: Micros) -> Option<(Micros, Reason)> {
        let entries = self.entries();
        let (until, reason) = entries.get(&rule.name)?.get(account)?;
        (*until > now).then(|| (*until - now, *reason))
    }

    fn put(&self, account: &str, rule: &Rule, wait_us: Micros, reason: Reason, now: Micros) {
        let keep = wait_us - rule.max_wait_us;
        if keep < REFUSAL_CACHE_MIN_US || matches!(reason, Reason::Concurrency) {
            return;
        }
        let keep = keep.min(REFUSAL_CACHE_MAX_US);
        let mut entries = self.entries();
        let accounts = entries.entry(rule.name.clone()).or_default();
        if accounts.len() >= 10_000 {
            accounts.retain(|_, (until, _)| *until > now);
        }
        accounts.insert(account.to_owned(), (now + keep, reason));
    }

    fn forget(&self, account: &str, rule: &Rule) {
        if let Some(accounts) = self.entries().get_mut(&rule.name) {
            accounts.remove(account);
        }
    }

    fn clear(&self) {
        self.entries().clear();
    }
}

/// Counters the shared store feeds (clones of the app's metrics).
#[derive(Clone, Default)]
pub struct StoreCounters {
    pub errors: Counter,
    pub degraded: Counter,
}

impl SharedStore {
    /// Wraps `redis`; `clock` drives the local fallback store. `healthy`
    /// false starts with the breaker open (Redis was down at start-up).
    pub fn new(redis: RedisStore, clock: Arc<dyn Clock>, resilience: Resilience, healthy: bool) -> Arc<SharedStore> {
        Self::with_counters(redis, clock, resilience, healthy, StoreCounters::default())
    }

    pub fn with_counters(
        redis: RedisStore,
        clock: Arc<dyn Clock>,
        resilience: Resilience,
        healthy: bool,
        counters: StoreCounters,
    ) -> Arc<SharedStore> {
        let refusals = (0..redis.workers()).map(|_| RefusalCache::default()).collect();
        let store = Arc::new(SharedStore {
            redis,
            local: MemoryStore::new(clock),
            resilience,
            breaker: Arc::new(Breaker::default()),
            counters,
            refusals,
            shared_refusals: RefusalCache::default(),
        });
        if !healthy {
            store.breaker.open.store(true, Ordering::Release);
        }
        Self::spawn_probe(Arc::downgrade(&store));
        store
    }

    /// This thread's cache of known refusals.
    fn refusals(&self) -> &RefusalCache {
        crate::worker::pick(&self.refusals, &self.shared_refusals)
    }

    fn all_refusals(&self) -> impl Iterator<Item = &RefusalCache> {
        self.refusals.iter().chain(std::iter::once(&self.shared_refusals))
    }

    /// See [`RedisStore::attach_worker`].
    pub async fn attach_worker(&self) {
        self.redis.attach_worker().await;
    }

    /// While the breaker is open, PINGs Redis every `breaker_open`; closes it
    /// at the first answer. Ends when the store is dropped.
    fn spawn_probe(store: Weak<SharedStore>) {
        tokio::spawn(async move {
            loop {
                let every = match store.upgrade() {
                    Some(s) => s.resilience.breaker_open,
                    None => return,
                };
                tokio::time::sleep(every).await;
                let Some(s) = store.upgrade() else { return };
                if s.breaker.is_open() && s.redis.ping().await.is_ok() {
                    s.breaker.close();
                    let degraded = s.breaker.degraded.load(Ordering::Relaxed);
                    tracing::warn!(degraded_so_far = degraded, "Redis answers again: shared decisions resumed");
                }
            }
        });
    }

    fn failed(&self, e: &StoreError) {
        self.counters.errors.inc();
        if self.breaker.failed(self.resilience.breaker_failures) {
            tracing::warn!(error = %e, "Redis circuit breaker open: not waiting on Redis until it answers a probe");
        }
    }

    /// Runs `op` on Redis unless the breaker is open; `Err` means "use the fallback".
    async fn try_redis<T, F: std::future::Future<Output = Result<T, StoreError>>>(
        &self,
        op: impl FnOnce() -> F,
    ) -> Result<T, StoreError> {
        if self.breaker.is_open() {
            return Err(StoreError::Unavailable("circuit breaker open".into()));
        }
        match op().await {
            Ok(v) => {
                self.breaker.succeeded();
                Ok(v)
            }
            Err(e) => {
                self.failed(&e);
                Err(e)
            }
        }
    }

    /// Decides on Redis, or by the fallback; the flag says which (true = degraded).
    pub async fn acquire(
        &self,
        account: &str,
        rule: &Rule,
        asking: &Asking<'_>,
    ) -> Result<(Decision, bool), StoreError> {
        let now = self.local.now();
        let cached = if self.resilience.refusal_cache { self.refusals().get(account, rule, now) } else { None };
        if let Some((wait_us, reason)) = cached {
            return Ok((Decision::Reject { wait_us: wait_us + rule.max_wait_us, reason }, false));
        }
        let e = match self.try_redis(|| self.redis.acquire(account, rule, asking)).await {
            Ok(d) => {
                if let (Decision::Reject { wait_us, reason }, true) = (d, self.resilience.refusal_cache) {
                    self.refusals().put(account, rule, wait_us, reason, now);
                }
                return Ok((d, false));
            }
            Err(e) => e,
        };
        self.breaker.degraded(&e, self.resilience.fallback);
        self.counters.degraded.inc();
        match self.resilience.fallback {
            Fallback::Local => {
                let scaled = scale(rule, self.resilience.instances);
                Ok((self.local.acquire(account, &scaled, asking), true))
            }
            Fallback::Allow => {
                Ok((Decision::Admit { at: self.local.now(), hold_us: 0, escalated: false, quota: None }, true))
            }
            Fallback::Deny => Err(e),
        }
    }

    pub async fn penalise(
        &self,
        account: &str,
        rule: &Rule,
        policy: &PenaltyPolicy,
        sent_at: Micros,
        offset_us: Micros,
    ) -> Result<(Micros, Micros), StoreError> {
        self.all_refusals().for_each(|c| c.forget(account, rule));
        match self.try_redis(|| self.redis.penalise(account, rule, policy, sent_at, offset_us)).await {
            Ok(v) => Ok(v),
            // At least this instance honours it.
            Err(_) => Ok(self.local.penalise(account, rule, policy, sent_at, offset_us)),
        }
    }

    pub async fn succeeded(
        &self,
        account: &str,
        rule: &Rule,
        sent_at: Micros,
        offset_us: Micros,
    ) -> Result<(), StoreError> {
        self.local.succeeded(account, rule, sent_at, offset_us);
        self.try_redis(|| self.redis.succeeded(account, rule, sent_at)).await
    }

    pub async fn release(&self, account: &str, rule: &Rule, holder: &str, offset_us: Micros) -> Result<(), StoreError> {
        // The slot may have come from either store; freeing an absent holder is a no-op.
        self.local.release(account, rule, holder, offset_us);
        self.try_redis(|| self.redis.release(account, rule, holder)).await
    }

    pub async fn renew(
        &self,
        account: &str,
        rule: &Rule,
        holders: &[&str],
        lease_us: Micros,
        offset_us: Micros,
    ) -> Result<(), StoreError> {
        self.local.renew(account, rule, holders, lease_us, offset_us);
        self.try_redis(|| self.redis.renew(account, rule, holders, lease_us)).await
    }

    pub async fn inspect(
        &self,
        account: &str,
        rule: &Rule,
        offset_us: Micros,
    ) -> Result<(RuleState, Micros), StoreError> {
        match self.try_redis(|| self.redis.inspect(account, rule)).await {
            Ok(v) => Ok(v),
            // Say what this instance decides by while Redis is away.
            Err(_) if self.resilience.fallback == Fallback::Local => Ok(self.local.inspect(account, rule, offset_us)),
            Err(e) => Err(e),
        }
    }

    /// Imposed or lifted in Redis, and locally too so that this instance
    /// honours it while Redis is away.
    pub async fn set_penalty(
        &self,
        account: &str,
        rule: &Rule,
        len_us: Micros,
        offset_us: Micros,
    ) -> Result<(Micros, Micros), StoreError> {
        self.all_refusals().for_each(|c| c.forget(account, rule));
        let local = self.local.set_penalty(account, rule, len_us, offset_us);
        match self.try_redis(|| self.redis.set_penalty(account, rule, len_us)).await {
            Ok(v) => Ok(v),
            Err(e) => {
                tracing::warn!(error = %e, "penalty changed on this instance only: Redis is unavailable");
                Ok(local)
            }
        }
    }

    /// Drops every locally known refusal (the rules changed).
    pub fn forget_refusals(&self) {
        self.all_refusals().for_each(RefusalCache::clear);
    }

    pub async fn token_refreshed(&self, account: &str, keep_us: Micros) -> Result<(), StoreError> {
        self.local.token_refreshed(account);
        self.try_redis(|| self.redis.token_refreshed(account, keep_us)).await
    }
}

/// `rule` with every count, burst and concurrency cap divided by `instances`
/// (rounded down, at least 1): what one of that many instances may use alone.
pub fn scale(rule: &Rule, instances: u32) -> Rule {
    let n = u64::from(instances.max(1));
    let mut scaled = rule.clone();
    scaled.limits = rule
        .limits
        .iter()
        .map(|l| match *l {
            Limit::Window(w) => {
                let count = (w.count / n).max(1);
                Limit::Window(WindowLimit::new(count, w.per_us, (w.burst / n).clamp(1, count)))
            }
            Limit::Calendar { count, period } => Limit::Calendar { count: (count / n).max(1), period },
        })
        .collect();
    if rule.concurrency > 0 {
        scaled.concurrency = (rule.concurrency / instances.max(1)).max(1);
    }
    scaled
}
