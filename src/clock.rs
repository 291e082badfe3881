//! The one place that reads the system clock.
//!
//! Every decision takes `now` as an argument; the running proxy gets it from a
//! [`Clock`]. Tests hand wxgate a [`ManualClock`] and move time themselves, so
//! no test waits on the wall clock.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// Microseconds since the Unix epoch.
pub type Micros = i64;

/// A source of the current time, in microseconds since the Unix epoch.
pub trait Clock: Send + Sync + 'static {
    fn now_us(&self) -> Micros;
}

/// The system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_us(&self) -> Micros {
        match SystemTime::now().duration_since(UNIX_EPOCH) {
            Ok(d) => i64::try_from(d.as_micros()).unwrap_or(i64::MAX),
            // A clock set before 1970 is a broken host; treat it as the epoch.
            Err(_) => 0,
        }
    }
}

/// A clock that only moves when told to. Cheap to clone; clones share time.
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<AtomicI64>);

impl ManualClock {
    pub fn new(now_us: Micros) -> Self {
        Self(Arc::new(AtomicI64::new(now_us)))
    }
    pub fn set_us(&self, now_us: Micros) {
        self.0.store(now_us, Ordering::SeqCst);
    }
    pub fn advance_us(&self, by_us: Micros) {
        self.0.fetch_add(by_us, Ordering::SeqCst);
    }
    pub fn advance(&self, by: std::time::Duration) {
        self.advance_us(i64::try_from(by.as_micros()).unwrap_or(i64::MAX));
    }
}

impl Clock for ManualClock {
    fn now_us(&self) -> Micros {
        self.0.load(Ordering::SeqCst)
    }
}
