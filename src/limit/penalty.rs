//! Penalties: what wxgate does after WeChat itself answered 45009/45011/45033.
//!
//! While an (account, rule) is penalised every call gets 429 at once, without
//! reaching WeChat and without consuming tokens.
//!
//! Escalation: WeChat's errmsg does not say whether a 45009 was a daily or a
//! per-minute quota, so a penalty that keeps coming back doubles. A penalty is
//! *recent* until as long again as it lasted has passed after it ended; a
//! further penalised answer while the last one is recent doubles the length,
//! up to the cap (default: the next midnight of `quota_timezone`). A
//! successful answer ends the escalation. Answers to calls that were forwarded
//! *before* the current penalty began never escalate it (they were already in
//! flight and come back with the same errcode), and never end it either.

use serde::Serialize;

use crate::limit::calendar::{next_midnight, next_minute};
use crate::time::{Micros, Span};

/// How one errcode is punished (`[[penalty]]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PenaltyPolicy {
    pub errcode: i64,
    pub length: PenaltyLength,
    /// Cap on one penalty; `None` = until the next `quota_timezone` midnight.
    pub max: Option<Span>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum PenaltyLength {
    /// `base`, doubled for each recent repeat, up to the cap.
    Escalating { base: Span },
    /// Until the next whole minute (45011: "retry next minute"). Does not escalate.
    NextMinute,
}

impl PenaltyPolicy {
    /// Used when `rules.toml` has no `[[penalty]]` table.
    ///
    /// - 45009 (frequency or daily quota): 60 s, WeCom's documented block for a
    ///   minute limit; escalation reaches the midnight cap when it was daily.
    /// - 45011 (minute quota): until the next minute, as its errmsg says.
    /// - 45033 (too many concurrent calls): 2 s; in-flight calls finish fast.
    pub fn defaults() -> Vec<PenaltyPolicy> {
        vec![
            PenaltyPolicy {
                errcode: 45009,
                length: PenaltyLength::Escalating { base: Span::from_secs(60) },
                max: None,
            },
            PenaltyPolicy { errcode: 45011, length: PenaltyLength::NextMinute, max: None },
            PenaltyPolicy { errcode: 45033, length: PenaltyLength::Escalating { base: Span::from_secs(2) }, max: None },
        ]
    }

    /// The penalty's end if it starts at `now` at escalation `level` (0 = base).
    pub fn until(&self, level: u32, now: Micros, offset_us: Micros) -> Micros {
        let cap = match self.max {
            Some(max) => now.saturating_add(max.as_micros()),
            None => next_midnight(now, offset_us),
        };
        match self.length {
            PenaltyLength::NextMinute => next_minute(now, offset_us).min(cap),
            PenaltyLength::Escalating { base } => {
                let len = base.as_micros().saturating_mul(1_i64.checked_shl(level.min(40)).unwrap_or(i64::MAX));
                now.saturating_add(len).min(cap)
            }
        }
    }

    pub fn escalates(&self) -> bool {
        matches!(self.length, PenaltyLength::Escalating { .. })
    }
}

/// Penalty state of one (account, rule). All zeros = never penalised.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PenaltyState {
    /// Calls are refused before this instant.
    pub until: Micros,
    /// When the current (or last) penalty began.
    pub started: Micros,
    /// Escalation level of the last penalty (0 = base length).
    pub level: u32,
    /// Length of the last penalty; 0 once a success ended the escalation.
    pub last_len: Micros,
}

impl PenaltyState {
    /// Remaining penalty at `now`, if any.
    pub fn remaining(&self, now: Micros) -> Option<Micros> {
        (self.until > now).then(|| self.until - now)
    }

    /// Whether a further penalty now would escalate (and a success would reset).
    pub fn is_recent(&self, now: Micros) -> bool {
        self.last_len > 0 && now < self.until.saturating_add(self.last_len)
    }

    /// WeChat answered a penalised errcode to a call forwarded at `sent_at`.
    /// Returns the penalty's end (unchanged for a stale answer).
    pub fn penalise(&mut self, policy: &PenaltyPolicy, sent_at: Micros, now: Micros, offset_us: Micros) -> Micros {
        if sent_at < self.started {
            return self.until;
        }
        let level = if policy.escalates() && self.is_recent(now) { self.level.saturating_add(1) } else { 0 };
        let until = policy.until(level, now, offset_us).max(self.until);
        *self = PenaltyState { until, started: now, level, last_len: until - now };
        until
    }

    /// An operator imposed a penalty of `len_us` (or lifted it with 0) at
    /// `now`. Either way the escalation starts over, and answers to calls
    /// sent before now cannot change it.
    pub fn set_by_hand(&mut self, len_us: Micros, now: Micros) {
        let until = if len_us > 0 { now + len_us } else { 0 };
        *self = PenaltyState { until, started: now, level: 0, last_len: len_us };
    }

    /// WeChat answered a call forwarded at `sent_at` without a penalised errcode.
    pub fn succeeded(&mut self, sent_at: Micros) {
        if sent_at >= self.started {
            self.level = 0;
            self.last_len = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Micros = 1_000_000;
    // 2026-11-29 00:00:00 Beijing.
    const DAY0: Micros = 20_786 * 86_400 * S - 8 * 3600 * S;

    fn p45009() -> PenaltyPolicy {
        PenaltyPolicy::defaults().remove(0)
    }

    #[test]
    fn repeats_double_until_the_midnight_cap() {
        let offset = 8 * 3600 * S;
        let mut st = PenaltyState::default();
        let mut now = DAY0 + 10 * 3600 * S; // 10:00 Beijing
        let mut lengths = Vec::new();
        let mut ends = Vec::new();
        for _ in 0..10 {
            let until = st.penalise(&p45009(), now, now, offset);
            lengths.push((until - now) / S);
            ends.push(until);
            now = until + S; // one probe right after expiry, answered 45009 again
        }
        assert_eq!(&lengths[..6], &[60, 120, 240, 480, 960, 1920]);
        // 60 s · (2^10 − 1) is more than the 14 h left: the last one stops at midnight.
        let midnight = DAY0 + 24 * 3600 * S;
        assert!(ends[..9].iter().all(|&e| e < midnight));
        assert_eq!(ends[9], midnight);
    }

    #[test]
    fn in_flight_answers_do_not_escalate_and_success_resets() {
        let offset = 8 * 3600 * S;
        let mut st = PenaltyState::default();
        let t = DAY0 + 3600 * S;
        st.penalise(&p45009(), t - S, t, offset);
        // A call sent before the penalty began comes back 45009 too.
        assert_eq!(st.penalise(&p45009(), t - S / 2, t + S, offset), t + 60 * S);
        assert_eq!(st.level, 0);
        // After expiry a success resets; the next 45009 is base length again.
        st.succeeded(t + 61 * S);
        let until = st.penalise(&p45009(), t + 62 * S, t + 63 * S, offset);
        assert_eq!(until - (t + 63 * S), 60 * S);
    }
}
