//! What admitting a call needs of the shared state, and what every feature
//! reads too: the store, the clock, the metrics and this instance's slots,
//! held calls and activity. Below the features and the [`crate::app::App`],
//! which hold it ([`crate::features::base::Base`] derefs to it).

use std::sync::Arc;

use crate::admit::activity::{Activity, Held};
use crate::admit::slots::Slots;
use crate::store::Store;
use crate::telemetry::metrics::Metrics;
use crate::time::Clock;

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
}
