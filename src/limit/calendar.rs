//! Calendar periods (day, month, minute) in a fixed UTC offset.
//!
//! WeChat resets its daily quotas at midnight Beijing time (`+08:00`, no DST), so
//! a fixed offset is all that is needed. `lua/prelude.lua` has the same
//! functions, step for step, for every script; the conformance tests hold the
//! two together. Hand-written rather than taken from `chrono`/`time` because
//! the Lua side needs the identical algorithm (Howard Hinnant's
//! `days_from_civil`) anyway.

use crate::time::Micros;

pub const MINUTE_US: Micros = 60_000_000;
pub const DAY_US: Micros = 86_400_000_000;

/// A calendar period a quota counts in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Period {
    Day,
    Month,
}

impl Period {
    /// Identifies the period containing `now` (local to `offset_us`): days since
    /// the epoch, or `year * 12 + month0`.
    pub fn id(self, now: Micros, offset_us: Micros) -> i64 {
        let day = local_day(now, offset_us);
        match self {
            Period::Day => day,
            Period::Month => {
                let (y, m, _) = civil_from_days(day);
                y * 12 + (m - 1)
            }
        }
    }

    /// The first instant of the next period after the one containing `now`.
    pub fn next_start(self, now: Micros, offset_us: Micros) -> Micros {
        let day = local_day(now, offset_us);
        let next_day = match self {
            Period::Day => day + 1,
            Period::Month => {
                let (y, m, _) = civil_from_days(day);
                let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
                days_from_civil(ny, nm, 1)
            }
        };
        next_day * DAY_US - offset_us
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Period::Day => "day",
            Period::Month => "month",
        }
    }
}

/// Local midnight that starts the next day after `now`.
pub fn next_midnight(now: Micros, offset_us: Micros) -> Micros {
    Period::Day.next_start(now, offset_us)
}

/// The next whole local minute after `now` (strictly later).
pub fn next_minute(now: Micros, offset_us: Micros) -> Micros {
    ((now + offset_us).div_euclid(MINUTE_US) + 1) * MINUTE_US - offset_us
}

fn local_day(now: Micros, offset_us: Micros) -> i64 {
    (now + offset_us).div_euclid(DAY_US)
}

/// Days since 1970-01-01 of a proleptic Gregorian date.
pub fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// (year, month 1–12, day 1–31) of a day number since 1970-01-01.
pub fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEIJING: Micros = 8 * 3_600_000_000;

    fn utc(y: i64, m: i64, d: i64, hh: i64, mm: i64, ss: i64) -> Micros {
        days_from_civil(y, m, d) * DAY_US + (hh * 3600 + mm * 60 + ss) * 1_000_000
    }

    #[test]
    fn civil_round_trips_over_four_centuries() {
        for z in (-200_000..200_000).step_by(7) {
            let (y, m, d) = civil_from_days(z);
            assert_eq!(days_from_civil(y, m, d), z);
        }
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(days_from_civil(2024, 2, 29)), (2024, 2, 29));
    }

    #[test]
    fn beijing_day_turns_at_16_utc() {
        let before = utc(2026, 11, 29, 15, 59, 59);
        let after = utc(2026, 11, 29, 16, 0, 0);
        assert_eq!(Period::Day.id(before, BEIJING) + 1, Period::Day.id(after, BEIJING));
        assert_eq!(next_midnight(before, BEIJING), after);
        assert_eq!(next_midnight(after, BEIJING), after + DAY_US);
    }

    #[test]
    fn beijing_month_turns_on_the_last_day_at_16_utc() {
        let before = utc(2026, 11, 30, 15, 59, 59);
        let after = utc(2026, 11, 30, 16, 0, 0);
        assert_eq!(Period::Month.id(before, BEIJING) + 1, Period::Month.id(after, BEIJING));
        assert_eq!(Period::Month.next_start(before, BEIJING), after);
        // December rolls into the next year.
        let dec = utc(2026, 12, 15, 0, 0, 0);
        assert_eq!(Period::Month.next_start(dec, BEIJING), utc(2026, 12, 31, 16, 0, 0));
    }

    #[test]
    fn next_minute_is_strictly_later() {
        let t = utc(2026, 1, 1, 0, 0, 0);
        assert_eq!(next_minute(t, BEIJING), t + MINUTE_US);
        assert_eq!(next_minute(t + 1, BEIJING), t + MINUTE_US);
    }
}
