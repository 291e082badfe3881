//! The state every call and every listener shares, and how it is built:
//! the [`Core`] (store, clock, metrics, upstream, slots: what the phases
//! and every hook read), the [`Features`] (each with its own state), the
//! running config and its callers, reloads, intercept. The phases
//! ([`crate::proxy`]), the admin API and reloads all read and swap what is
//! here.

pub mod sync_status;

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use arc_swap::ArcSwap;

use super::start::StartError;
use crate::admit::activity::Held;
use crate::admit::callers::Callers;
use crate::admit::core::Core;
use crate::admit::slots::Slots;
use crate::config::{Config, StoreConfig};
use crate::features::component::Host;
use crate::features::hooks::{Calls, Env};
use crate::features::Features;
use crate::jobs::JobStore;
use crate::proxy::app::sync_status::SyncStatus;
use crate::store::memory::MemoryStore;
use crate::store::redis::RedisStore;
use crate::store::resilient::{Resilient, StoreCounters};
use crate::store::{Store, StoreError};
use crate::telemetry::metrics::{MemoryStoreMetrics, Metrics};
use crate::time::Clock;
use crate::transport::intercept::Interceptor;
use crate::transport::upstream::DomainUpstreams;

/// Everything a call needs; shared by every connection.
pub struct App {
    /// The store, clock, metrics, upstream, slots.
    pub core: Core,
    /// The features, each with its shared state.
    pub features: Features,
    /// The running config; a call keeps the one it started with.
    pub config: ArcSwap<Config>,
    /// The running config's callers, their flood guards and series:
    /// rebuilt with the config on reload (`Callers::new`).
    pub callers: ArcSwap<Callers>,
    /// What quota_sync found, per (account, rule state), on this instance.
    pub syncs: SyncStatus,
    pub reloads: Reloads,
    /// The last hour of each rule's calls (the console's plots), read from
    /// the metrics by `crate::ops::console`.
    pub history: crate::telemetry::history::History,
    /// `[intercept]`, when on: the CA, the hosts' certificates and
    /// upstreams. Built at start; `[intercept]` changes need a restart.
    pub intercept: Option<Arc<Interceptor>>,
}

impl App {
    /// What the features' hooks are given: the core, and this app to run
    /// calls wxgate makes itself through the phases.
    pub fn env(&self) -> Env<'_> {
        Env { core: &self.core, calls: self }
    }
}

/// What the components' work reaches of the app (held weakly).
impl Host for App {
    fn core(&self) -> &Core {
        &self.core
    }

    fn config(&self) -> Arc<Config> {
        self.config.load_full()
    }

    fn callers(&self) -> Arc<Callers> {
        self.callers.load_full()
    }

    fn calls(&self) -> &dyn Calls {
        self
    }
}

/// Reload outcomes since start, and what the config watcher saw (`/readyz`).
#[derive(Default)]
pub struct Reloads {
    pub ok: AtomicU64,
    pub failed: AtomicU64,
    /// The last reload: when (wxgate's clock), and its error if refused.
    pub last: std::sync::Mutex<Option<(crate::time::Micros, Option<String>)>>,
    pub watched: Arc<Watched>,
}

/// File events the config watcher received from the config file's
/// directory since start: all of them, and those naming the config file
/// (each starts a reload). Shows whether an edit was seen at all.
#[derive(Default)]
pub struct Watched {
    pub events: AtomicU64,
    pub of_config: AtomicU64,
}

impl App {
    /// The shared state a listener serves from. Starts the renewal of
    /// concurrency leases, which stops when the app is dropped.
    pub fn new(
        config: Config,
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        mut metrics: Metrics,
        jobs: Option<Arc<dyn JobStore>>,
    ) -> Result<Arc<App>, StartError> {
        let upstreams = DomainUpstreams::new(&config, &clock, &metrics.upstreams, None)?;
        let lease_us = config.lease_us;
        let callers = Callers::new(&config, &clock, &metrics, None);
        metrics.rules(config.rules.iter().map(|r| &*r.name));
        metrics.window_margin.set(config.server.window_margin_us as f64 / 1e6);
        let features = Features::new(&config, &store, &clock, &mut metrics, jobs)?;
        let intercept = Interceptor::new(&config, clock.clone(), &metrics)?.map(Arc::new);
        let tracer = config.telemetry.as_ref().map(|t| {
            use crate::telemetry::trace::{export::Queue, Tracer};
            let (queue, spans) = Queue::new(t.max_queued, t.max_queued_bytes, metrics.trace_spans.clone());
            Tracer::new(t.sampler, t.max_attribute_bytes, queue, spans)
        });
        let app = Arc::new(App {
            core: Core {
                store,
                clock,
                metrics,
                slots: Arc::new(Slots::new()),
                held: Held::default(),
                activity: Arc::default(),
                forecasts: Arc::default(),
                margin: Arc::default(),
                upstreams: ArcSwap::from_pointee(upstreams),
                tracer,
            },
            features,
            config: ArcSwap::from_pointee(config),
            callers: ArcSwap::from_pointee(callers),
            syncs: SyncStatus::default(),
            reloads: Reloads::default(),
            history: Default::default(),
            intercept,
        });
        Slots::spawn_renewal(Arc::downgrade(&app.core.slots), Arc::downgrade(&app.core.store), lease_us);
        Ok(app)
    }
}
/// Builds the store `config` asks for. `clock` drives the memory store (and
/// the Redis store's local fallback); the Redis store decides on Redis `TIME`.
/// `memory` are the memory store's metrics.
pub async fn open_store(
    config: &Config,
    clock: Arc<dyn Clock>,
    counters: StoreCounters,
    memory: MemoryStoreMetrics,
) -> Result<Arc<dyn Store>, StartError> {
    Ok(match &config.store {
        StoreConfig::Memory(m) => {
            MemoryStore::open(clock, m, config.server.quota_offset_us, config.max_warmup_us, memory)?
        }
        StoreConfig::Redis(r) => {
            let (redis, healthy) = match RedisStore::connect(r).await {
                Ok(redis) => (redis, true),
                // Unreachable now: start anyway, deciding by the fallback until
                // the breaker's probe finds Redis. Any other error (a wrong
                // password, a bad URL) is a configuration error.
                Err(StoreError::Unreachable(e)) => {
                    tracing::warn!(error = %e, fallback = ?r.resilience.fallback, "starting without Redis");
                    (RedisStore::connect_later(r).await?, false)
                }
                Err(e) => return Err(StartError::Redis(e)),
            };
            let redis = redis.with_workers(config.server.workers);
            let store = Resilient::new(redis, clock, r.resilience.clone(), healthy, counters);
            if healthy {
                if let Err(e) = store.adopt_epoch().await {
                    tracing::warn!(error = %e, "cannot read the deployment's epoch from Redis yet");
                }
            }
            store
        }
    })
}
