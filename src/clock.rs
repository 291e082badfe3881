//! The one place that reads the system clock.
//!
//! Every decision takes `now` as an argument; the running proxy gets it from a
//! [`Clock`], and holds calls with [`Clock::sleep`]. Tests hand wxgate a
//! [`ManualClock`] and move time themselves, so no test waits on the wall clock.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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
