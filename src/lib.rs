//! wxgate: an outbound proxy for the WeChat server API that keeps every
//! service and replica of an account inside WeChat's quotas.
//!
//! A call goes through the phases in [`proxy`]: accept → route → decide →
//! forward → inspect. The decision ([`limit`]) is pure maths over state held
//! by a [`store`]; transport lives in [`server`], [`proxy`] and [`upstream`].
#![forbid(unsafe_code)]

pub mod activity;
pub mod admin;
pub mod admit;
pub mod body;
pub mod bucket;
pub mod calendar;
pub mod clock;
pub mod config;
pub mod error;
pub mod inspect;
pub mod limit;
pub mod metrics;
pub mod penalty;
pub mod proxy;
pub mod ratelimit;
pub mod reload;
pub mod routes;
pub mod server;
pub mod slots;
pub mod smuggling;
pub mod store;
pub mod upstream;
pub mod worker;

use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::admit::Held;
use crate::clock::Clock;
use crate::config::{Config, StoreConfig};
use crate::metrics::Metrics;
use crate::proxy::App;
use crate::reload::Reloads;
use crate::server::{Running, Threads};
use crate::slots::Slots;
use crate::store::{MemoryStore, RedisStore, SharedStore, Store, StoreCounters, StoreError};
use crate::upstream::Upstream;

/// Builds the store `config` asks for. `clock` drives the memory store; the
/// Redis store uses Redis `TIME`.
pub async fn build_store(config: &Config, clock: Arc<dyn Clock>, counters: StoreCounters) -> Result<Store, String> {
    Ok(match &config.store {
        StoreConfig::Memory => Store::Memory(MemoryStore::new(clock)),
        StoreConfig::Redis(r) => {
            let (redis, healthy) = match RedisStore::connect(r).await {
                Ok(redis) => (redis, true),
                // Unreachable now: start anyway, deciding by the fallback until
                // the breaker's probe finds Redis. Any other error (a wrong
                // password, a bad URL) is a configuration error.
                Err(StoreError::Unreachable(e)) => {
                    tracing::warn!(error = %e, fallback = ?r.resilience.fallback, "starting without Redis");
                    (RedisStore::connect_later(r).await.map_err(|e| e.to_string())?, false)
                }
                Err(e) => return Err(e.to_string()),
            };
            let redis = redis.with_workers(config.server.workers);
            Store::Redis(SharedStore::with_counters(redis, clock, r.resilience.clone(), healthy, counters))
        }
    })
}

/// Builds the shared state a listener serves from, and starts the renewal
/// of concurrency leases (it stops when the app is dropped).
pub fn build_app(config: Config, store: Store, clock: Arc<dyn Clock>, metrics: Metrics) -> Result<Arc<App>, String> {
    let upstream = Upstream::new(&config.server)?;
    let lease_us = config.lease_us;
    let app = Arc::new(App {
        config: ArcSwap::from_pointee(config),
        store: Arc::new(store),
        upstream: ArcSwap::from_pointee(upstream),
        clock,
        slots: Arc::new(Slots::new()),
        held: Held::default(),
        reloads: Reloads::default(),
        metrics,
        activity: Arc::default(),
    });
    Slots::spawn_renewal(Arc::downgrade(&app.slots), Arc::downgrade(&app.store), lease_us);
    Ok(app)
}

/// Binds `[server] listen` and serves on the calling Tokio runtime.
pub async fn start(config: Config, clock: Arc<dyn Clock>) -> Result<Running, String> {
    start_on(config, clock, Threads::Caller).await
}

/// Binds `[server] listen` and serves on `threads`. Must run inside a Tokio
/// runtime, which also runs the admin API and background tasks.
pub async fn start_on(config: Config, clock: Arc<dyn Clock>, threads: Threads) -> Result<Running, String> {
    let metrics = Metrics::new();
    let counters = StoreCounters { errors: metrics.store_errors.clone(), degraded: metrics.degraded_decisions.clone() };
    let store = build_store(&config, clock.clone(), counters).await?;
    start_parts(config, store, clock, metrics, threads).await
}

/// Like [`start`], with a store built by the caller (tests pass a Redis store
/// driven by a manual clock).
pub async fn start_with_store(config: Config, store: Store, clock: Arc<dyn Clock>) -> Result<Running, String> {
    start_parts(config, store, clock, Metrics::new(), Threads::Caller).await
}

async fn start_parts(
    config: Config,
    store: Store,
    clock: Arc<dyn Clock>,
    metrics: Metrics,
    threads: Threads,
) -> Result<Running, String> {
    let listen = config.server.listen;
    let source = config.source.clone();
    let app = build_app(config, store, clock, metrics)?;
    if source.is_file() {
        reload::spawn(Arc::downgrade(&app), source);
    }
    let listener =
        tokio::net::TcpListener::bind(listen).await.map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    let admin = admin::bind(app.config.load().server.admin_listen).await?;
    server::serve(listener, admin, app, threads).map_err(|e| e.to_string())
}
