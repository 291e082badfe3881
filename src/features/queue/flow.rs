//! How many queued sends one account's rule keeps in flight on this
//! instance (issue 63, docs/queued-delivery.md "Pace"): a window that grows
//! while WeChat answers and the rule has room, and shrinks when WeChat says
//! it is overloaded. WeChat meters an account's API, so the window is the
//! (account, rule)'s, shared by its callers' queues in the ratio of their
//! weights (src/features/queue/dispatch.rs). Pure: the dispatcher gives
//! each send's outcome and the time.
//!
//! - **Room** (WeChat answered, and its send waited for its slot at most
//!   a quarter of the round trip: sent at once, or behind only the sends
//!   that left with it, a quarter of the window at most): grow. Doubling per round trip at first (one more
//!   per answer, "slow start"), then by one per window's worth of answers
//!   (additive increase).
//! - **The rule is the limit** (the send was held for its slot more than
//!   half the round trip): the rule admits `rate` sends a second and a
//!   window of `L` sends at a round trip `R` brings `L / R`, so a send waits
//!   about `(L − rate × R) / rate` plus its bunch's share: waits past `R / 2`
//!   mean a quarter or more too many in flight, each reserving a slot
//!   further ahead: shrink by [`HELD_STEP`] per such answer. Between the
//!   two, it stays. So it settles at about 1.25 to 1.5 times what the
//!   rule's pace needs (`rate × round trip`): enough that the rule, not the
//!   window, is the limit, however the sends bunch.
//! - **WeChat overloaded** (45033 too many concurrent calls, -1 busy, a 5xx,
//!   no answer, or a round trip more than twice the least seen plus
//!   [`SLOW_US`]): halve, at most once per round trip (multiplicative
//!   decrease), and leave slow start.
//!
//! - **Too many at once** (45033: WeChat's limit on an API's concurrent
//!   calls): halved as above, and the window after it becomes a learned
//!   ceiling, loosened by one every [`LOOSEN_US`] without another 45033, so
//!   the window never climbs back past WeChat's limit within seconds (each
//!   45033 also starts the account's penalty, `[[penalty]]`).
//!
//! Never below 1 nor above the ceiling (`[queue] max_in_flight`).

use crate::time::Micros;

/// How many sends a queue starts with.
pub const START: f64 = 4.0;
/// A round trip this much above twice the least seen reads as WeChat
/// slowing down under load.
pub const SLOW_US: Micros = 50_000;
/// How much a held answer shrinks the window.
pub const HELD_STEP: f64 = 0.25;
/// A ceiling learned from a 45033 is loosened by one this often.
pub const LOOSEN_US: Micros = 60_000_000;

/// What one send's outcome says of the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// WeChat answered (any errcode but an overload), after `rtt_us`,
    /// the decision having held it `held_us` for its slot.
    Answered { rtt_us: Micros, held_us: Micros },
    /// WeChat (or the way to it) is overloaded: -1, a 5xx, no answer.
    Overloaded,
    /// WeChat refused a call for too many at once (45033).
    TooMany,
    /// Nothing to learn (wxgate's own refusal, a failure before sending).
    Nothing,
}

/// One queue's window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Flow {
    limit: f64,
    ceiling: f64,
    /// Growing by one per answer until the first decrease.
    slow_start: bool,
    /// The least round trip seen (`None`: none yet).
    min_rtt_us: Option<Micros>,
    /// When it was last halved (once per round trip at most).
    cut_at: Micros,
    /// The ceiling a 45033 taught, and when it was set or last loosened.
    learned: Option<(f64, Micros)>,
}

impl Flow {
    /// A new queue's window, under `ceiling` sends.
    pub fn new(ceiling: u32) -> Flow {
        let ceiling = f64::from(ceiling.max(1));
        Flow {
            limit: START.min(ceiling),
            ceiling,
            slow_start: true,
            min_rtt_us: None,
            cut_at: Micros::MIN,
            learned: None,
        }
    }

    /// How many sends may be in flight now.
    pub fn limit(&self) -> usize {
        self.limit.floor().max(1.0) as usize
    }

    /// A reload changed the ceiling.
    pub fn set_ceiling(&mut self, ceiling: u32) {
        self.ceiling = f64::from(ceiling.max(1));
        self.limit = self.limit.min(self.ceiling);
    }

    /// The ceiling now: the configured one, or what a 45033 taught
    /// (loosened by one per [`LOOSEN_US`] since).
    fn top(&mut self, now: Micros) -> f64 {
        if let Some((learned, at)) = self.learned {
            let steps = now.saturating_sub(at) / LOOSEN_US;
            if steps > 0 {
                let loosened = learned + steps as f64;
                self.learned = (loosened < self.ceiling).then_some((loosened, at + steps * LOOSEN_US));
            }
        }
        self.learned.map_or(self.ceiling, |(l, _)| l.min(self.ceiling))
    }

    /// One send's outcome at `now`.
    pub fn seen(&mut self, seen: Seen, now: Micros) {
        let top = self.top(now);
        match seen {
            Seen::Nothing => {}
            Seen::Overloaded => self.cut(now),
            Seen::TooMany => {
                self.cut(now);
                // What was out when WeChat said "too many", halved: below
                // its limit; a later 45033 lowers it further.
                let below = self.learned.map_or(self.limit, |(l, _)| l.min(self.limit)).floor().max(1.0);
                self.learned = Some((below, now));
                self.limit = self.limit.min(below);
            }
            Seen::Answered { rtt_us, held_us } => {
                let least = self.min_rtt_us.map_or(rtt_us, |m| m.min(rtt_us));
                self.min_rtt_us = Some(least);
                if rtt_us > least.saturating_mul(2).saturating_add(SLOW_US) {
                    self.cut(now);
                } else if held_us > least / 2 {
                    self.slow_start = false;
                    self.limit = (self.limit - HELD_STEP).max(1.0);
                } else if held_us > least / 4 {
                    // Near what the rule needs: stay.
                } else if self.slow_start {
                    self.limit = (self.limit + 1.0).min(top);
                } else {
                    self.limit = (self.limit + 1.0 / self.limit).min(top);
                }
            }
        }
    }

    /// Halves the window, once per round trip.
    fn cut(&mut self, now: Micros) {
        let rtt = self.min_rtt_us.unwrap_or(SLOW_US).max(1_000);
        if now.saturating_sub(self.cut_at) < rtt {
            return;
        }
        self.cut_at = now;
        self.slow_start = false;
        self.limit = (self.limit / 2.0).max(1.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RTT: Micros = 50_000;

    fn answered(held: bool) -> Seen {
        Seen::Answered { rtt_us: RTT, held_us: if held { RTT } else { 0 } }
    }

    #[test]
    fn a_window_grows_while_wechat_answers_and_the_rule_has_room() {
        let mut f = Flow::new(128);
        assert_eq!(f.limit(), 4);
        for i in 0..60 {
            f.seen(answered(false), i * 1000);
        }
        assert_eq!(f.limit(), 64, "slow start: one more per answer");
        for i in 0..1000 {
            f.seen(answered(false), 100_000 + i * 1000);
        }
        assert_eq!(f.limit(), 128, "never past its ceiling");
    }

    #[test]
    fn overload_halves_it_once_per_round_trip_and_it_grows_back_slowly() {
        let mut f = Flow::new(128);
        for i in 0..40 {
            f.seen(answered(false), i * 1000);
        }
        assert_eq!(f.limit(), 44);
        f.seen(Seen::Overloaded, 1_000_000);
        f.seen(Seen::Overloaded, 1_010_000);
        assert_eq!(f.limit(), 22, "the second 45033 of the same round trip does not halve it again");
        f.seen(Seen::Overloaded, 1_000_000 + RTT);
        assert_eq!(f.limit(), 11);
        for i in 0..12 {
            f.seen(answered(false), 2_000_000 + i);
        }
        assert_eq!(f.limit(), 12, "additive increase: one per window's worth of answers");
        for k in 0..100 {
            f.seen(Seen::Overloaded, 3_000_000 + k * RTT);
        }
        assert_eq!(f.limit(), 1, "never below one send");
    }

    #[test]
    fn a_45033_teaches_a_ceiling_the_window_stays_under_and_loosens_by_the_minute() {
        let mut f = Flow::new(128);
        for i in 0..12 {
            f.seen(answered(false), i);
        }
        assert_eq!(f.limit(), 16, "slow start past WeChat's limit of 8");
        f.seen(Seen::TooMany, 1_000_000);
        f.seen(Seen::TooMany, 1_000_001);
        assert_eq!(f.limit(), 8, "halved once in the round trip");
        for i in 0..10_000 {
            f.seen(answered(false), 1_000_000 + i * 1000);
        }
        assert_eq!(f.limit(), 8, "never past what was out at the 45033, halved, within the minute");
        for i in 0..100 {
            f.seen(answered(false), 1_000_000 + LOOSEN_US + i);
        }
        assert_eq!(f.limit(), 9, "a minute on: one more");
        f.seen(Seen::TooMany, 1_000_000 + 2 * LOOSEN_US);
        assert_eq!(f.limit(), 4, "another 45033: halved again, the ceiling with it");
    }

    #[test]
    fn a_rising_round_trip_reads_as_overload() {
        let mut f = Flow::new(128);
        for i in 0..20 {
            f.seen(answered(false), i);
        }
        assert_eq!(f.limit(), 24);
        f.seen(Seen::Answered { rtt_us: 2 * RTT + SLOW_US + 1, held_us: 0 }, 1_000_000);
        assert_eq!(f.limit(), 12);
    }

    #[test]
    fn held_sends_shrink_it_to_a_little_more_than_a_saturated_rule_needs() {
        // A rule of `rate` a second at a round trip of RTT: each answer was
        // held as long as the sends in flight past what the rule needs take
        // to go, plus its place in the bunch that left with it (claims come
        // in quarters of the window).
        for rate in [200.0, 1000.0] {
            for rtt in [20_000, 50_000, 150_000] {
                let need = rate * rtt as f64 / 1e6;
                let mut f = Flow::new(10_000);
                let (mut sum, mut random) = (0.0, 0x9e37_79b9_7f4a_7c15_u64);
                for i in 0..100_000i64 {
                    random = random.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                    let bunch = (random >> 11) as f64 / (1u64 << 53) as f64 * f.limit / 4.0;
                    let held_s = ((f.limit - need).max(0.0) + bunch) / rate;
                    f.seen(Seen::Answered { rtt_us: rtt, held_us: (held_s * 1e6) as Micros }, i * 100);
                    if i >= 50_000 {
                        sum += f.limit;
                    }
                }
                let mean = sum / 50_000.0;
                assert!(
                    mean >= need && mean < 1.6 * need + 2.0,
                    "{rate}/s at {rtt} µs: {need} needed, {mean} in flight"
                );
            }
        }
    }
}
