//! The flood guard of a declared caller with a `rate`: a `governor` GCRA
//! limiter in this process, on wxgate's [`Clock`] (so tests move its time
//! with a `ManualClock`, and only `crate::time` reads a clock). Checking it
//! touches no store: a caller over its rate costs one atomic
//! compare-and-swap, never a Redis round trip.

use std::sync::Arc;

use governor::clock::Clock as GovernorClock;
use governor::middleware::NoOpMiddleware;
use governor::nanos::Nanos;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};

use crate::config::{CallerRate, RatePer};
use crate::time::{Clock, Micros};

/// wxgate's clock as `governor` reads it: nanoseconds since the Unix epoch.
#[derive(Clone)]
pub struct GovernorTime(pub Arc<dyn Clock>);

impl GovernorClock for GovernorTime {
    type Instant = Nanos;

    fn now(&self) -> Nanos {
        Nanos::from(u64::try_from(self.0.now_us()).unwrap_or(0).saturating_mul(1000))
    }
}

/// One caller's guard: at most `rate.count` calls at once, then one more
/// every `per / count`, on this instance.
pub struct Guard {
    pub rate: CallerRate,
    limiter: RateLimiter<NotKeyed, InMemoryState, GovernorTime, NoOpMiddleware<Nanos>>,
    clock: GovernorTime,
}

impl Guard {
    pub fn new(rate: CallerRate, clock: Arc<dyn Clock>) -> Guard {
        let quota = match rate.per {
            RatePer::Second => Quota::per_second(rate.count),
            RatePer::Minute => Quota::per_minute(rate.count),
            RatePer::Hour => Quota::per_hour(rate.count),
        };
        let clock = GovernorTime(clock);
        Guard { rate, limiter: RateLimiter::direct_with_clock(quota, clock.clone()), clock }
    }

    /// Takes one call: `Ok`, or `Err(wait_us)`, the time until one more
    /// call would pass (rounded up to the microsecond, at least 1).
    pub fn check(&self) -> Result<(), Micros> {
        self.limiter.check().map_err(|not_until| {
            let wait = not_until.wait_time_from(self.clock.now());
            i64::try_from(wait.as_nanos().div_ceil(1000)).unwrap_or(i64::MAX).max(1)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;
    use std::time::Duration;

    use super::*;
    use crate::time::ManualClock;

    fn rate(count: u32, per: RatePer) -> CallerRate {
        CallerRate { count: NonZeroU32::new(count).expect("count"), per }
    }

    #[test]
    fn a_burst_of_the_count_passes_then_one_per_interval() {
        let clock = ManualClock::new(1_700_000_000_000_000);
        let guard = Guard::new(rate(5, RatePer::Second), Arc::new(clock.clone()));
        for i in 0..5 {
            assert_eq!(guard.check(), Ok(()), "call {i}");
        }
        assert_eq!(guard.check(), Err(200_000), "the 6th waits one interval, 1s / 5");
        clock.advance(Duration::from_millis(150));
        assert_eq!(guard.check(), Err(50_000));
        clock.advance(Duration::from_millis(50));
        assert_eq!(guard.check(), Ok(()));
        assert_eq!(guard.check(), Err(200_000));
        clock.advance(Duration::from_secs(1));
        for i in 0..5 {
            assert_eq!(guard.check(), Ok(()), "whole again after 1s: call {i}");
        }
        assert!(guard.check().is_err());
    }

    #[test]
    fn per_minute_and_per_hour_spread_the_count_over_the_period() {
        let clock = ManualClock::new(1_700_000_000_000_000);
        let guard = Guard::new(rate(2, RatePer::Minute), Arc::new(clock.clone()));
        assert_eq!((guard.check(), guard.check()), (Ok(()), Ok(())));
        assert_eq!(guard.check(), Err(30_000_000));
        let guard = Guard::new(rate(1, RatePer::Hour), Arc::new(clock.clone()));
        assert_eq!(guard.check(), Ok(()));
        assert_eq!(guard.check(), Err(3_600_000_000));
    }
}
