//! When a pair's day quota runs out at its current rate, and how much of
//! it is used: pure maths over an injected time (no clock read here).
//!
//! - **The rate** ([`DayRate`]) is an exponentially weighted moving average
//!   of the increase of the pair's *shared* day count (what every admission
//!   reports: on Redis, every instance's calls), with time constant
//!   [`RATE_TAU_US`] (5 minutes): `r(t) = Σ Δᵢ·e^{−(t − tᵢ)/τ} / (τ·(1 − e^{−(t − t₀)/τ}))`,
//!   each increase `Δᵢ` at `tᵢ` weighted by its age, normalised by the weight
//!   the kernel has had since the first observation `t₀`. A steady rate `λ`
//!   reads `λ` from the first increase on (no ramp from 0, no bias), an
//!   irregular one its recent mean; idle, the rate decays by `e` every 5
//!   minutes. An observation costs an exponential at most once a second per
//!   pair (increases within a second are weighted as of the first), and no
//!   allocation.
//! - **The forecast** ([`runs_out_at`]): the pair's remaining day quota at
//!   that rate, if it runs out before the quota day ends; `None` if it
//!   does not (or nothing is being used); `now` when it is spent already.
//! - **The fraction used** ([`used_fraction`]) is against the *effective*
//!   day limit ([`super::learned::day_limit`]).

use crate::time::Micros;

/// The rate's time constant: increases older than a few of these weigh
/// nothing (5 minutes, as Prometheus' customary `rate(...[5m])`).
pub const RATE_TAU_US: Micros = 300_000_000;

/// Increases this close to the last fold are added as of it, without an
/// exponential ([`DayRate::add`]).
pub const FOLD_US: Micros = 1_000_000;

/// An exponentially weighted rate of a count's increases (see the module).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DayRate {
    /// The first observation: the weight is normalised from here.
    start: Micros,
    /// The last fold's time (an increase more than [`FOLD_US`] after the
    /// one before); `sum` is weighted as of it.
    last: Micros,
    /// `Σ Δᵢ·e^{−(last − tᵢ)/τ}`.
    sum: f64,
}

impl DayRate {
    /// A rate observed from `now` on, nothing counted yet.
    pub fn starting(now: Micros) -> DayRate {
        DayRate { start: now, last: now, sum: 0.0 }
    }

    /// The count increased by `delta` at `now` (a time before the last one
    /// is taken as the last: a clock step back changes no weight).
    pub fn add(&mut self, delta: u64, now: Micros) {
        let now = now.max(self.last);
        // Within [`FOLD_US`] of the last fold the increase is counted as of
        // it (weighted at most e^{−1/300} too little: 0.3 %), sparing the
        // exponential on the per-call path of a busy pair.
        if now - self.last < FOLD_US {
            self.sum += delta as f64;
            return;
        }
        self.sum = self.sum * decay(now - self.last) + delta as f64;
        self.last = now;
    }

    /// Increases per second at `now`; `None` before any time has passed
    /// since the first observation (no rate can be told yet).
    pub fn per_second(&self, now: Micros) -> Option<f64> {
        let now = now.max(self.last);
        let span = now - self.start;
        if span <= 0 {
            return None;
        }
        let weight = 1.0 - decay(span);
        let tau_s = RATE_TAU_US as f64 / 1e6;
        Some(self.sum * decay(now - self.last) / (tau_s * weight))
    }

    /// When it was last increased.
    pub fn last(&self) -> Micros {
        self.last
    }
}

/// `e^{−dt/τ}`.
fn decay(dt: Micros) -> f64 {
    (-(dt.max(0) as f64) / RATE_TAU_US as f64).exp()
}

/// When `remaining` calls are used up at `per_second` from `now`: `Some(now)`
/// when none is left; `None` when they last past `day_end` (the quota day
/// starts afresh first) or nothing is being used.
pub fn runs_out_at(remaining: u64, per_second: f64, now: Micros, day_end: Micros) -> Option<Micros> {
    if remaining == 0 {
        return Some(now);
    }
    if !(per_second > 0.0 && per_second.is_finite()) {
        return None;
    }
    let after = (remaining as f64 / per_second * 1e6).ceil();
    if after >= (day_end - now) as f64 {
        return None;
    }
    Some(now + after as Micros)
}

/// `used` of `limit`, from 0 to 1 (1 for a limit of 0).
pub fn used_fraction(used: u64, limit: u64) -> f64 {
    if limit == 0 {
        return 1.0;
    }
    (used as f64 / limit as f64).min(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Micros = 1_000_000;
    const T0: Micros = 1_800_000_000 * S;

    fn close(a: f64, b: f64, within: f64) -> bool {
        (a - b).abs() <= within * b.abs().max(1e-9)
    }

    #[test]
    fn a_steady_rate_reads_as_itself_from_the_first_increase_on() {
        let mut r = DayRate::starting(T0);
        assert_eq!(r.per_second(T0), None, "no time has passed");
        // One call a second: 1/s from the first second (within 0.2 %: the
        // discrete calls' half-step), and after an hour alike.
        r.add(1, T0 + S);
        assert!(close(r.per_second(T0 + S).expect("a rate"), 1.0, 0.002), "{:?}", r.per_second(T0 + S));
        for k in 2..=3600 {
            r.add(1, T0 + k * S);
        }
        let at = T0 + 3600 * S;
        assert!(close(r.per_second(at).expect("a rate"), 1.0, 0.002), "{:?}", r.per_second(at));
        // 10 calls every 2 seconds: 5/s.
        let mut r = DayRate::starting(T0);
        for k in 1..=600 {
            r.add(10, T0 + 2 * k * S);
        }
        assert!(close(r.per_second(T0 + 1200 * S).expect("a rate"), 5.0, 0.01));
    }

    #[test]
    fn the_rate_follows_a_change_and_decays_when_idle() {
        let mut r = DayRate::starting(T0);
        for k in 1..=3600 {
            r.add(1, T0 + k * S);
        }
        // Then 2/s for 5 minutes (one τ): 1 + (1 − e⁻¹) ≈ 1.63/s.
        for k in 1..=600 {
            r.add(1, T0 + 3600 * S + k * S / 2);
        }
        let at = T0 + 3900 * S;
        let want = 1.0 + (1.0 - (-1f64).exp());
        assert!(close(r.per_second(at).expect("a rate"), want, 0.01), "{:?} vs {want}", r.per_second(at));
        // Idle for 5 minutes: e⁻¹ of it; for an hour: nothing to speak of.
        let idle = r.per_second(at + 300 * S).expect("a rate");
        assert!(close(idle, want / std::f64::consts::E, 0.01), "{idle}");
        assert!(r.per_second(at + 3600 * S).expect("a rate") < 1e-4);
        // A time before the last increase reads as the last.
        assert_eq!(r.per_second(T0), r.per_second(r.last()));
    }

    #[test]
    fn the_quota_runs_out_at_the_rate_unless_the_day_ends_first() {
        let day_end = T0 + 3600 * S;
        // 1,000 left at 2/s: 500 s.
        assert_eq!(runs_out_at(1000, 2.0, T0, day_end), Some(T0 + 500 * S));
        // 1,000 left at 0.25/s: 4,000 s, after the day's end.
        assert_eq!(runs_out_at(1000, 0.25, T0, day_end), None);
        assert_eq!(runs_out_at(1000, 1000.0 / 3600.0, T0, day_end), None, "exactly at the day's end: not before");
        assert_eq!(runs_out_at(1000, 0.0, T0, day_end), None, "nothing used");
        assert_eq!(runs_out_at(1000, f64::NAN, T0, day_end), None);
        assert_eq!(runs_out_at(0, 0.0, T0, day_end), Some(T0), "spent already");
        // 3 left at 7/s: 428,572 µs (rounded up).
        assert_eq!(runs_out_at(3, 7.0, T0, day_end), Some(T0 + 428_572));
    }

    #[test]
    fn the_fraction_used_is_of_the_limit() {
        assert_eq!(used_fraction(80, 100), 0.8);
        assert_eq!(used_fraction(0, 30), 0.0);
        assert_eq!(used_fraction(31, 30), 1.0, "at most all of it");
        assert_eq!(used_fraction(0, 0), 1.0, "a limit of 0 is spent");
    }
}
