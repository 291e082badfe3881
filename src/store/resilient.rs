//! The Redis store with its safety net: what a Redis deployment runs.
//!
//! - Every Redis call has `[store] timeout`. A decision that fails or times
//!   out is made by `[store] fallback`: `local` (in-process, each limit
//!   divided by `[store] instances`), `allow` (forward unthrottled) or
//!   `deny` (503).
//! - After `breaker_failures` failures in a row the breaker opens
//!   ([`breaker`]): calls stop waiting on Redis and go straight to the
//!   fallback, while a background probe PINGs Redis every `breaker_open`.
//!   The first answer closes it and shared decisions resume by themselves.
//! - Known refusals are answered without a round trip ([`refusals`]).
//! - Penalties and slot releases are also written locally, so this instance
//!   honours them while Redis is away. Refunds go to Redis only.
//! - Degraded decisions are counted and logged at most once per 10 s.

pub mod breaker;
pub mod refusals;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use async_trait::async_trait;
use prometheus_client::metrics::counter::Counter;

use self::breaker::Breaker;
use self::refusals::RefusalCache;
use super::memory::MemoryStore;
use super::redis::RedisStore;
use super::{Decided, PenaltyEnd, Snapshot, Status, Store, StoreError};
use crate::clock::{Clock, Micros};
use crate::config::{Fallback, Resilience};
use crate::limit::{Ask, Decision, Key, Limit, Rule, WindowLimit};
use crate::penalty::PenaltyPolicy;

/// Counters the wrapper feeds (clones of the app's metrics).
#[derive(Clone, Default)]
pub struct StoreCounters {
    pub errors: Counter,
    pub degraded: Counter,
}

pub struct Resilient {
    redis: RedisStore,
    /// Decides while Redis cannot, and keeps what this instance must honour
    /// meanwhile (penalties, its own slots).
    local: MemoryStore,
    resilience: Resilience,
    breaker: Breaker,
    counters: StoreCounters,
    /// Known refusals, one cache per serving thread ([`crate::worker`]) plus
    /// one for everything else. Forgetting clears them all.
    refusals: Box<[RefusalCache]>,
    shared_refusals: RefusalCache,
}

impl Resilient {
    /// Wraps `redis`; `clock` drives the local fallback store. `healthy`
    /// false starts with the breaker open (Redis was down at start-up).
    /// Starts the breaker's probe, which ends when the store is dropped.
    pub fn new(
        redis: RedisStore,
        clock: Arc<dyn Clock>,
        resilience: Resilience,
        healthy: bool,
        counters: StoreCounters,
    ) -> Arc<Resilient> {
        let refusals = (0..redis.workers()).map(|_| RefusalCache::default()).collect();
        let store = Arc::new(Resilient {
            redis,
            local: MemoryStore::new(clock),
            resilience,
            breaker: Breaker::default(),
            counters,
            refusals,
            shared_refusals: RefusalCache::default(),
        });
        if !healthy {
            store.breaker.open();
        }
        Self::spawn_probe(Arc::downgrade(&store));
        store
    }

    /// This thread's cache of known refusals.
    fn refusals(&self) -> &RefusalCache {
        crate::worker::pick(&self.refusals, &self.shared_refusals)
    }

    /// Every cache of known refusals, this thread's and the others'.
    fn all_refusals(&self) -> impl Iterator<Item = &RefusalCache> {
        self.refusals.iter().chain(std::iter::once(&self.shared_refusals))
    }

    fn forget(&self, key: Key<'_>) {
        self.all_refusals().for_each(|c| c.forget(key.account, key.rule));
    }

    /// While the breaker is open, PINGs Redis every `breaker_open`; closes it
    /// at the first answer. Ends when the store is dropped.
    fn spawn_probe(store: Weak<Resilient>) {
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

    /// Runs `op` on Redis unless the breaker is open; `Err` means "use the fallback".
    async fn try_redis<T, F: std::future::Future<Output = Result<T, StoreError>>>(
        &self,
        op: impl FnOnce() -> F,
    ) -> Result<T, StoreError> {
        if self.breaker.is_open() {
            return Err(StoreError::BreakerOpen);
        }
        match op().await {
            Ok(v) => {
                self.breaker.succeeded();
                Ok(v)
            }
            Err(e) => {
                self.counters.errors.inc();
                if self.breaker.failed(self.resilience.breaker_failures) {
                    tracing::warn!(error = %e, "Redis circuit breaker open: not waiting on Redis until it answers a probe");
                }
                Err(e)
            }
        }
    }
}

#[async_trait]
impl Store for Resilient {
    /// On Redis, or by the fallback (`degraded`).
    async fn acquire(&self, ask: &Ask<'_>) -> Result<Decided, StoreError> {
        let Key { account, rule, .. } = ask.key;
        let cache = self.resilience.refusal_cache;
        let now = self.local.now();
        if let Some((wait_us, reason)) = cache.then(|| self.refusals().get(account, rule, now)).flatten() {
            let decision = Decision::Reject { wait_us: wait_us + rule.max_wait_us, reason };
            return Ok(Decided { decision, degraded: false });
        }
        let e = match self.try_redis(|| self.redis.decide(ask)).await {
            Ok(decision) => {
                if let (Decision::Reject { wait_us, reason }, true) = (decision, cache) {
                    self.refusals().put(account, rule, wait_us, reason, now);
                }
                return Ok(Decided { decision, degraded: false });
            }
            Err(e) => e,
        };
        self.breaker.degraded(&e, self.resilience.fallback);
        self.counters.degraded.inc();
        match self.resilience.fallback {
            Fallback::Local => {
                let scaled = scale(rule, self.resilience.instances);
                let local = Ask { key: Key { rule: &scaled, ..ask.key }, ..*ask };
                let decision = self.local.acquire(&local).await?.decision;
                Ok(Decided { decision, degraded: true })
            }
            Fallback::Allow => {
                let decision = Decision::Admit { at: self.local.now(), hold_us: 0, escalated: false, quota: None };
                Ok(Decided { decision, degraded: true })
            }
            Fallback::Deny => Err(e),
        }
    }

    /// In Redis, or at least on this instance.
    async fn penalise(&self, key: Key<'_>, policy: &PenaltyPolicy, sent_at: Micros) -> Result<PenaltyEnd, StoreError> {
        self.forget(key);
        match self.try_redis(|| self.redis.penalise(key, policy, sent_at)).await {
            Ok(end) => Ok(end),
            Err(_) => self.local.penalise(key, policy, sent_at).await,
        }
    }

    async fn succeeded(&self, key: Key<'_>, sent_at: Micros) -> Result<(), StoreError> {
        self.local.succeeded(key, sent_at).await?;
        self.try_redis(|| self.redis.succeeded(key, sent_at)).await
    }

    async fn release(&self, key: Key<'_>, holder: &str) -> Result<(), StoreError> {
        // The slot may have come from either store; freeing an absent holder is a no-op.
        self.local.release(key, holder).await?;
        self.try_redis(|| self.redis.release(key, holder)).await
    }

    async fn renew(&self, key: Key<'_>, holders: &[&str], lease_us: Micros) -> Result<(), StoreError> {
        self.local.renew(key, holders, lease_us).await?;
        self.try_redis(|| self.redis.renew(key, holders, lease_us)).await
    }

    /// Redis's state; while Redis is away with the local fallback, what this
    /// instance decides by.
    async fn inspect(&self, key: Key<'_>) -> Result<Snapshot, StoreError> {
        match self.try_redis(|| self.redis.inspect(key)).await {
            Ok(snapshot) => Ok(snapshot),
            Err(_) if self.resilience.fallback == Fallback::Local => self.local.inspect(key).await,
            Err(e) => Err(e),
        }
    }

    /// Imposed or lifted in Redis, and locally too so that this instance
    /// honours it while Redis is away.
    async fn set_penalty(&self, key: Key<'_>, len_us: Micros) -> Result<PenaltyEnd, StoreError> {
        self.forget(key);
        let local = self.local.set_penalty(key, len_us).await?;
        match self.try_redis(|| self.redis.set_penalty(key, len_us)).await {
            Ok(end) => Ok(end),
            Err(e) => {
                tracing::warn!(error = %e, "penalty changed on this instance only: Redis is unavailable");
                Ok(local)
            }
        }
    }

    async fn token_refreshed(&self, account: &str, keep_us: Micros) -> Result<(), StoreError> {
        self.local.token_refreshed(account, keep_us).await?;
        self.try_redis(|| self.redis.token_refreshed(account, keep_us)).await
    }

    fn status(&self) -> Status {
        if self.breaker.is_open() {
            Status::Degraded(self.resilience.fallback)
        } else {
            Status::Shared
        }
    }

    async fn attach_worker(&self) {
        self.redis.attach_worker().await;
    }

    /// Known refusals were computed under the old rules.
    fn rules_changed(&self) {
        self.all_refusals().for_each(RefusalCache::clear);
    }

    /// In Redis only: refunds are for calls Redis admitted (the proxy gives
    /// nothing back for a degraded admission), and the local store took
    /// nothing for them. A refund lost while Redis is away only errs on the
    /// safe side: the call stays counted, as if it had reached WeChat.
    /// Known refusals of the pair are forgotten (one may now be admitted).
    async fn refund(&self, key: Key<'_>, at: Micros) -> Result<bool, StoreError> {
        self.forget(key);
        self.try_redis(|| self.redis.refund(key, at)).await
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
