//! The shared state below the features, which every phase and every
//! feature's hooks read: the store, the clock, the metrics, where calls go,
//! and this instance's slots, held calls and activity. Held by the
//! [`crate::proxy::app::App`], handed to hooks in their [`crate::features::hooks::Env`].

use std::sync::Arc;

use crate::admit::activity::{Activity, Held};
use crate::admit::forecasts::Forecasts;
use crate::admit::slots::Slots;
use crate::store::Store;
use crate::telemetry::metrics::Metrics;
use crate::time::Clock;
use crate::transport::upstream::DomainUpstreams;

/// The shared state below the features; built once by `App::new`.
pub struct Core {
    pub store: Arc<dyn Store>,
    pub clock: Arc<dyn Clock>,
    pub metrics: Metrics,
    /// Concurrency slots held by this instance's calls.
    pub slots: Arc<Slots>,
    /// Calls held for shaping right now, against `[server] max_held`.
    pub held: Held,
    /// Held and in-flight calls per (account, rule), on this instance.
    pub activity: Arc<Activity>,
    /// Each pair's day-quota forecast inputs (`crate::admit::forecasts`).
    pub forecasts: Arc<Forecasts>,
    /// The arrival margin as this machine's scheduler keeps it
    /// (`crate::admit::margin`).
    pub margin: Arc<crate::admit::margin::Margin>,
    /// Where each domain's calls go (`[server] upstream`, `[[domain]]
    /// upstream`; swapped by a reload): wxgate's own calls too.
    pub upstreams: arc_swap::ArcSwap<DomainUpstreams>,
    /// `[telemetry]`: the tracer of every call (`None`: tracing off).
    pub tracer: Option<Arc<crate::telemetry::trace::Tracer>>,
}
