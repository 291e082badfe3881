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
//!
//! Two kinds of decision time:
//!
//! - [`Micros`]: an instant (microseconds since the Unix epoch) or a signed
//!   difference of two. It stays a bare `i64` in the decision's state and
//!   answers (`crate::limit`: `RuleState`, `Ask`, `Decision`, a rule's
//!   numbers) and in the store operations: that is integer maths which
//!   `lua/*.lua` mirrors step for step and `tests/conformance.rs` holds
//!   equal, where instants and differences meet in every line (a TAT less
//!   the tolerance less now), so a type there would be unwrapped at each
//!   step and check nothing.
//! - [`Span`]: a length of time that is never negative, by construction:
//!   what a clock is asked to sleep, and a length the configuration gives
//!   (a penalty's base and cap, built once at load). A negative length is
//!   the bug it rules out: a sleep of -5 s, a penalty that ends before it
//!   starts.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::Notify;

/// Microseconds since the Unix epoch, or a signed difference of two.
pub type Micros = i64;

/// A length of time in whole microseconds, never negative (see the module
/// documentation for where [`Micros`] stays bare instead). Serialised as
/// its microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(transparent)]
pub struct Span(Micros);

impl Span {
    pub const ZERO: Span = Span(0);

    /// `us` microseconds; a negative `us` (a moment already past) is zero.
    pub const fn from_micros(us: Micros) -> Span {
        Span(if us > 0 { us } else { 0 })
    }

    /// `s` seconds, saturating.
    pub const fn from_secs(s: u64) -> Span {
        let us = if s > (i64::MAX / 1_000_000) as u64 { i64::MAX } else { s as i64 * 1_000_000 };
        Span(us)
    }

    /// `d` in whole microseconds, saturating.
    pub fn from_duration(d: Duration) -> Span {
        Span(i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
    }

    /// Its microseconds (never negative).
    pub const fn as_micros(self) -> Micros {
        self.0
    }

    pub const fn as_duration(self) -> Duration {
        Duration::from_micros(self.0 as u64)
    }
}

impl From<Duration> for Span {
    fn from(d: Duration) -> Span {
        Span::from_duration(d)
    }
}

pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A source of the current time, in microseconds since the Unix epoch.
pub trait Clock: Send + Sync + 'static {
    fn now_us(&self) -> Micros;
    /// Completes once this clock has moved on by `span`.
    fn sleep(&self, span: Span) -> Sleep;
    /// Completes once this clock reads `at` or later (at once if it does
    /// already): unlike `sleep(at - now)`, a move of the clock between
    /// reading it and sleeping is never missed.
    fn sleep_until(&self, at: Micros) -> Sleep {
        self.sleep(Span::from_micros(at.saturating_sub(self.now_us())))
    }
    /// Whether this clock moves with the world, so that a sleep on it can
    /// wake late because the machine is busy (`crate::admit::margin`
    /// measures that); a clock that only moves when told to has no such
    /// lateness.
    fn runs_by_itself(&self) -> bool {
        true
    }
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

    fn sleep(&self, span: Span) -> Sleep {
        Box::pin(tokio::time::sleep(span.as_duration()))
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

    fn runs_by_itself(&self) -> bool {
        false
    }

    fn sleep(&self, span: Span) -> Sleep {
        self.sleep_until(self.now_us().saturating_add(span.as_micros()))
    }

    fn sleep_until(&self, until: Micros) -> Sleep {
        let inner = self.0.clone();
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

/// An RFC 3339 time (`2026-12-03T18:00:00Z`, `2026-12-04T02:00:00.5+08:00`)
/// as wxgate's time (microseconds since the Unix epoch); `None` for text
/// that is not one, a time without its zone included (never guessed).
/// humantime reads the date and time; the offset is applied here (it
/// reads UTC only).
pub fn parse_rfc3339(text: &str) -> Option<Micros> {
    let (local, offset_us) = match text.strip_suffix(['Z', 'z']) {
        Some(local) => (local, 0),
        None => {
            let at = text.len().checked_sub(6)?;
            let (local, zone) = (text.get(..at)?, text.get(at..)?.as_bytes());
            let sign = match zone[0] {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let digits = |s: &[u8]| -> Option<i64> {
                s.iter().all(u8::is_ascii_digit).then(|| s.iter().fold(0, |n, d| n * 10 + i64::from(d - b'0')))
            };
            let (hours, minutes) = (digits(&zone[1..3])?, digits(&zone[4..6])?);
            if zone[3] != b':' || hours > 23 || minutes > 59 {
                return None;
            }
            (local, sign * (hours * 3_600 + minutes * 60) * 1_000_000)
        }
    };
    if !local.contains('T') && !local.contains('t') && !local.contains(' ') {
        return None;
    }
    let t = humantime::parse_rfc3339_weak(local).ok()?;
    let utc = i64::try_from(t.duration_since(UNIX_EPOCH).ok()?.as_micros()).ok()?;
    utc.checked_sub(offset_us)
}

/// wxgate's time `us` as RFC 3339 (UTC, to the millisecond).
pub fn format_rfc3339(us: Micros) -> String {
    let t = UNIX_EPOCH + Duration::from_micros(u64::try_from(us).unwrap_or(0));
    humantime::format_rfc3339_millis(t).to_string()
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

/// Nanoseconds since the Unix epoch on the system clock: when a span of a
/// trace started (`crate::telemetry::trace`). Never decides anything.
pub fn unix_nanos() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// The Tokio instant `after` from now: a deadline for I/O
/// (`tokio::time::timeout_at`), on Tokio's clock so tests can pause it.
pub fn deadline_after(after: Duration) -> tokio::time::Instant {
    tokio::time::Instant::now() + after
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_manual_sleep_until_ends_once_the_clock_reads_its_time_however_it_got_there() {
        let clock = ManualClock::new(1_000);
        let within = Duration::from_secs(5);
        // Moved past before the sleep is polled: never missed.
        let sleep = clock.sleep_until(1_100);
        clock.advance_us(500);
        assert!(tokio::time::timeout(within, sleep).await.is_ok());
        assert!(tokio::time::timeout(within, clock.sleep_until(1_200)).await.is_ok(), "already past: at once");
        let pending = clock.sleep_until(2_000);
        assert!(tokio::time::timeout(Duration::from_millis(20), pending).await.is_err(), "not before its time");
    }

    #[test]
    fn rfc3339_times_are_read_with_their_zone_and_never_without_one() {
        let utc = parse_rfc3339("2026-12-03T18:00:00Z");
        assert_eq!(utc, Some(1_796_320_800_000_000));
        assert_eq!(parse_rfc3339("2026-12-04T02:00:00+08:00"), utc);
        assert_eq!(parse_rfc3339("2026-12-04T02:00:00.0+08:00"), utc);
        assert_eq!(parse_rfc3339("2026-12-03T13:30:00-04:30"), utc);
        assert_eq!(parse_rfc3339("2026-12-03T18:00:00.250Z"), utc.map(|u| u + 250_000));
        for bad in
            ["2026-12-03T18:00:00", "2026-12-03", "2026-12-03T18:00:00+8:00", "2026-12-03T18:00:00+24:00", "soon", ""]
        {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_span_is_never_negative_and_saturates() {
        assert_eq!(Span::from_micros(-5), Span::ZERO);
        assert_eq!(Span::from_micros(7).as_micros(), 7);
        assert_eq!(Span::from_secs(2).as_micros(), 2_000_000);
        assert_eq!(Span::from_secs(u64::MAX).as_micros(), i64::MAX);
        assert_eq!(Span::from_duration(Duration::MAX).as_micros(), i64::MAX);
        assert_eq!(Span::from(Duration::from_millis(3)).as_duration(), Duration::from_millis(3));
        assert_eq!(serde_json::to_string(&Span::from_secs(1)).ok().as_deref(), Some("1000000"));
    }
}
