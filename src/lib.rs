//! wxgate: an outbound proxy for the WeChat server API that keeps every
//! service and replica of an account inside WeChat's quotas.
//!
//! A call goes through the phases in [`proxy`]: accept → route → identify →
//! meter → decide → forward → answer → respond, each a function over the
//! call's context ([`proxy::Call`]), any of which may answer early; the
//! features ([`features`]) plug into the phases through named hooks, each
//! with its own state and per-call context; wxgate's own calls run the same
//! phases ([`proxy::own`]). The decision ([`limit`]) is pure maths over
//! state held by a [`store`]; the listeners are in [`server`], the bytes on
//! the wire in [`transport`], the admin API, reloads and the command-line
//! tools in [`ops`]; the shared state is the [`proxy::app::App`].
//!
//! Failure semantics: every accepted request gets exactly one response; a
//! call is sent upstream at most once; when Redis cannot decide, `[store]
//! fallback` does ([`store::resilient`]).
#![forbid(unsafe_code)]

// The layers, highest first (each imports only those below it; the order
// is the table in tests/architecture.rs): server, ops, proxy, features,
// admit, error, store, transport, config, telemetry, limit, time.
pub mod admit;
pub mod config;
pub mod error;
pub mod features;
pub mod jobs;
pub mod limit;
pub mod ops;
pub mod proxy;
pub mod server;
pub mod store;
pub mod telemetry;
pub mod time;
pub mod transport;

use std::sync::Arc;

use crate::config::Config;
use crate::proxy::app::App;
pub use crate::proxy::start::StartError;
use crate::server::{Running, Threads};
use crate::store::resilient::StoreCounters;
use crate::store::Store;
use crate::telemetry::metrics::Metrics;
use crate::time::Clock;

/// Binds `[server] listen` and serves on the calling Tokio runtime.
pub async fn start(config: Config, clock: Arc<dyn Clock>) -> Result<Running, StartError> {
    start_on(config, clock, Threads::Caller).await
}

/// Binds `[server] listen` and serves on `threads`. Must run inside a Tokio
/// runtime, which also runs the admin API and background tasks.
pub async fn start_on(config: Config, clock: Arc<dyn Clock>, threads: Threads) -> Result<Running, StartError> {
    let metrics = Metrics::traced(config.telemetry.is_some());
    let counters = StoreCounters {
        errors: metrics.store_errors.clone(),
        degraded: metrics.degraded_decisions.clone(),
        lost: metrics.store_lost.clone(),
        reconciled: metrics.store_reconciled.clone(),
        breaker_opened: metrics.breaker_opened.clone(),
        leases: lease_counters(&metrics),
    };
    let store = proxy::app::open_store(&config, clock.clone(), counters, metrics.memory_store.clone()).await?;
    start_parts(config, store, clock, metrics, threads).await
}

/// The quota leases' counters (`wxgate_quota_lease_units_total{what}`).
fn lease_counters(metrics: &Metrics) -> store::resilient::leases::LeaseCounters {
    let of =
        |what: &str| metrics.lease_units.get_or_create(&telemetry::metrics::LeaseLabel { what: what.into() }).clone();
    store::resilient::leases::LeaseCounters {
        taken: of("taken"),
        spent: of("spent"),
        returned: of("returned"),
        expired: of("expired"),
        dropped: of("dropped"),
        reserved: of("reserved"),
        reserve_spent: of("reserve_spent"),
    }
}

/// Like [`start`], with a store built by the caller (tests pass a Redis store
/// driven by a manual clock).
pub async fn start_with_store(
    config: Config,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
) -> Result<Running, StartError> {
    let metrics = Metrics::traced(config.telemetry.is_some());
    start_parts(config, store, clock, metrics, Threads::Caller).await
}

async fn start_parts(
    config: Config,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    metrics: Metrics,
    threads: Threads,
) -> Result<Running, StartError> {
    let listen = config.server.listen;
    let source = config.source.clone();
    let app = App::new(config, store, clock, metrics, None)?;
    let config = app.config.load_full();
    let host: std::sync::Weak<dyn features::component::Host> = Arc::downgrade(&app) as _;
    app.features.start(host, &config).await?;
    ops::quota_sync::spawn(Arc::downgrade(&app));
    ops::renewal::spawn(Arc::downgrade(&app));
    ops::trace_export::spawn(&app);
    ops::console::spawn(Arc::downgrade(&app));
    if source.is_file() {
        ops::reload::spawn(Arc::downgrade(&app), source);
    }
    let listener =
        tokio::net::TcpListener::bind(listen).await.map_err(|source| StartError::Listen { addr: listen, source })?;
    let admin = ops::admin::bind(app.config.load().server.admin_listen).await?;
    server::serve(listener, admin, app, threads).map_err(StartError::Serve)
}
