//! The one module that reads a clock (checked by `tests/architecture.rs`).
//!
//! - **Decision time** is a [`Clock`]: every decision takes `now` as an
//!   argument; the running proxy gets it from [`SystemClock`] (the memory
//!   store) or Redis `TIME` (the Redis store), and holds calls with
//!   [`Clock::sleep`]. Tests hand wxgate a [`ManualClock`] and move time
//!   themselves, so no test waits on the wall clock for a decision.
//! - **Elapsed time** for metrics, logs and idle connections is a
//!   [`Stopwatch`] (monotonic); **deadlines** for I/O are Tokio instants from
//!   [`deadline_after`]. Neither ever decides a call.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::Notify;

/// Microseconds since the Unix epoch.
pub type Micros = i64;

pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A source of the current time, in microseconds since the Unix epoch.
pub trait Clock: Send + Sync + 'static {
    fn now_us(&self) -> Micros;
    /// Completes once this clock has moved on by `us`.
    fn sleep(&self, us: Micros) -> Sleep;
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

    fn sleep(&self, us: Micros) -> Sleep {
        Box::pin(tokio::time::sleep(Duration::from_micros(us.max(0) as u64)))
    }
}

/// A clock that only moves when told to. Cheap to clone; clones share time.
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<Manual>);

#[derive(Debug, Default)]
struct Manual {
    now: AtomicI64,
    moved: Notify,
}

impl ManualClock {
    pub fn new(now_us: Micros) -> Self {
        Self(Arc::new(Manual { now: AtomicI64::new(now_us), moved: Notify::new() }))
    }
    pub fn set_us(&self, now_us: Micros) {
        self.0.now.store(now_us, Ordering::SeqCst);
        self.0.moved.notify_waiters();
    }
    pub fn advance_us(&self, by_us: Micros) {
        self.0.now.fetch_add(by_us, Ordering::SeqCst);
        self.0.moved.notify_waiters();
    }
    pub fn advance(&self, by: Duration) {
        self.advance_us(i64::try_from(by.as_micros()).unwrap_or(i64::MAX));
    }
}

impl Clock for ManualClock {
    fn now_us(&self) -> Micros {
        self.0.now.load(Ordering::SeqCst)
    }

    fn sleep(&self, us: Micros) -> Sleep {
        let inner = self.0.clone();
        let until = self.now_us().saturating_add(us);
        Box::pin(async move {
            loop {
                let moved = inner.moved.notified();
                tokio::pin!(moved);
                moved.as_mut().enable();
                if inner.now.load(Ordering::SeqCst) >= until {
                    return;
                }
                moved.await;
            }
        })
    }
}

/// Measures how long something took, on the monotonic clock: for metrics,
/// logs and idle timeouts, never for a decision.
#[derive(Debug, Clone, Copy)]
pub struct Stopwatch(Instant);

impl Stopwatch {
    pub fn start() -> Stopwatch {
        Stopwatch(Instant::now())
    }

    pub fn elapsed(&self) -> Duration {
        self.0.elapsed()
    }

    /// Time from this start to `later`'s (zero if `later` started first).
    pub fn until(&self, later: Stopwatch) -> Duration {
        later.0.saturating_duration_since(self.0)
    }

    /// Whole microseconds since the start.
    pub fn elapsed_us(&self) -> Micros {
        i64::try_from(self.0.elapsed().as_micros()).unwrap_or(i64::MAX)
    }
}

/// The Tokio instant `after` from now: a deadline for I/O
/// (`tokio::time::timeout_at`), on Tokio's clock so tests can pause it.
pub fn deadline_after(after: Duration) -> tokio::time::Instant {
    tokio::time::Instant::now() + after
}
