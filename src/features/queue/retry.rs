//! What becomes of a queued job after one attempt (issue 47): the one table
//! from WeChat's answer to the job's [`End`] (shared/WECHAT.md, "Answers to
//! a message send, for a queue"), and when a job that may go again goes:
//! exponential back-off with full jitter, so that jobs refused together do
//! not come back together. Pure: the dispatcher gives the time and the
//! random number.

use crate::jobs::{Answer, End, ANSWER_MAX};
use crate::time::Micros;

/// What the dispatcher saw of one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// It provably never reached WeChat (no connection; nothing written).
    NeverSent,
    /// It may have reached WeChat, and no answer came (a timeout after the
    /// request went out, a connection cut mid-answer).
    NoAnswer,
    /// WeChat answered: the HTTP status, the errcode of its JSON body (if
    /// any) and the body.
    Answered(Answer),
}

/// How WeChat's answer reads, for a queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// Taken (errcode 0; WeCom's partial success with `invaliduser` too:
    /// its answer is kept for the caller).
    Sent,
    /// Not now: the same message may be taken later.
    NotNow,
    /// The message itself is refused: sending it again does not help.
    Wrong,
    /// An answer that is not WeChat's JSON: it may have been taken, so it
    /// is never sent again.
    Unreadable,
}

/// Errcodes that mean "not now" (WECHAT.md): frequency and quota limits
/// (45009 is ambiguous between a minute and a day quota; the penalty it
/// starts holds the job until it ends, capped at midnight), concurrency,
/// mass-send spacing, WeChat busy, and token problems (the broker renews
/// the token and resends once itself; a later attempt gets a fresh one).
pub const NOT_NOW: [i64; 8] = [45009, 45011, 45033, 45066, -1, 40001, 40014, 42001];

/// WeChat refused the call for a quota or frequency limit (45009, 45011,
/// 45033; HTTP 429): it did not act on the message.
pub fn quota_refusal(answer: &Answer) -> bool {
    answer.status == 429 || matches!(answer.errcode, Some(45009 | 45011 | 45033))
}

/// Reads one answer. Every other errcode than 0 and [`NOT_NOW`] is the
/// message's fault (40003 invalid openid, 43004 not subscribed, 40037
/// invalid template, 47003 bad argument, 45047 the 48-hour window closed,
/// ...): failing at once, WeChat's answer kept, is the choice for an
/// errcode no table lists too (a message is never resent on a guess).
pub fn read(status: u16, errcode: Option<i64>) -> Reading {
    match (status, errcode) {
        (500..=599, _) | (429, _) => Reading::NotNow,
        (_, Some(0)) if (200..300).contains(&status) => Reading::Sent,
        (_, Some(code)) if NOT_NOW.contains(&code) => Reading::NotNow,
        (_, Some(_)) => Reading::Wrong,
        (200..=299, None) => Reading::Unreadable,
        (_, None) => Reading::Wrong,
    }
}

pub use crate::config::queue::Backoff;

impl Backoff {
    /// "Full jitter": uniformly in `[0, min(cap, base · 2^(attempts − 1))]`
    /// from `now` (`random`: any 64 random bits). Jobs refused at one
    /// instant come back spread over the whole interval.
    pub fn delay_us(&self, attempts: u32, random: u64) -> Micros {
        let exponent = attempts.saturating_sub(1).min(40);
        let ceiling = self.base_us.max(1).saturating_mul(1i64 << exponent).min(self.cap_us.max(1));
        // `ceiling` is at least 1, so the modulus is never 0.
        let span = u64::try_from(ceiling).unwrap_or(1).saturating_add(1);
        i64::try_from(random % span).unwrap_or(0)
    }
}

/// The job's end after `attempt`, its `attempts` so far counted (the store
/// counts one per send), its `deadline`, at `now`.
///
/// - taken → `Sent`; the message's fault → `Failed`; no answer after it may
///   have gone, or an answer that is not WeChat's → `Unknown` (never resent:
///   WeChat's message APIs have no idempotency key);
/// - not now → `Retry` after [`Backoff::delay_us`]; past `max_attempts`, or
///   when the retry would come after the deadline → `Failed` with the last
///   answer (the job went out and was refused: not `Expired`, which says it
///   never went);
/// - never sent → `Retry` (no later than the deadline, when the dispatcher
///   expires it).
pub fn end_of(
    attempt: Attempt,
    attempts: u32,
    deadline_us: Option<Micros>,
    now: Micros,
    backoff: &Backoff,
    random: u64,
) -> End {
    let at = now.saturating_add(backoff.delay_us(attempts.max(1), random));
    let answer = match attempt {
        Attempt::NeverSent => {
            let at = deadline_us.map_or(at, |d| at.min(d));
            return End::Retry { at, answer: None };
        }
        Attempt::NoAnswer => return End::Unknown(None),
        Attempt::Answered(answer) => cut(answer),
    };
    match read(answer.status, answer.errcode) {
        Reading::Sent => End::Sent(answer),
        Reading::Wrong => End::Failed(answer),
        Reading::Unreadable => End::Unknown(Some(answer)),
        // A quota refusal says WeChat did not act on the message: it waits
        // for the quota (the penalty it starts holds it, to midnight for a
        // day quota) as long as its deadline allows, whatever the attempts.
        Reading::NotNow if attempts >= backoff.max_attempts && !quota_refusal(&answer) => End::Failed(answer),
        Reading::NotNow if deadline_us.is_some_and(|d| at > d) => End::Failed(answer),
        Reading::NotNow => End::Retry { at, answer: Some(answer) },
    }
}

/// The answer as a job keeps it: at most [`ANSWER_MAX`] bytes.
fn cut(mut answer: Answer) -> Answer {
    answer.body.truncate(ANSWER_MAX);
    answer
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn answered(status: u16, errcode: Option<i64>) -> Attempt {
        Attempt::Answered(Answer { status, errcode, body: Bytes::from_static(b"{}") })
    }

    const NOW: Micros = 1_000_000_000;

    #[test]
    fn each_answer_reads_as_the_table_says() {
        assert_eq!(read(200, Some(0)), Reading::Sent);
        for code in NOT_NOW {
            assert_eq!(read(200, Some(code)), Reading::NotNow, "{code}");
        }
        for code in [40003, 43004, 43101, 40037, 47003, 44002, 47001, 45047, 45015, 48001, 50002, 81013, 12345] {
            assert_eq!(read(200, Some(code)), Reading::Wrong, "{code}");
        }
        assert_eq!(read(502, None), Reading::NotNow);
        assert_eq!(read(503, Some(0)), Reading::NotNow, "a 5xx is not a success, whatever its body");
        assert_eq!(read(429, None), Reading::NotNow);
        assert_eq!(read(200, None), Reading::Unreadable, "a 200 that is not WeChat's JSON may have been taken");
        assert_eq!(read(404, None), Reading::Wrong);
    }

    #[test]
    fn an_attempt_ends_the_job_as_its_answer_says() {
        let b = Backoff::default();
        assert!(matches!(end_of(answered(200, Some(0)), 1, None, NOW, &b, 7), End::Sent(_)));
        assert!(matches!(end_of(answered(200, Some(43004)), 1, None, NOW, &b, 7), End::Failed(_)));
        assert_eq!(end_of(Attempt::NoAnswer, 1, None, NOW, &b, 7), End::Unknown(None));
        assert!(matches!(end_of(answered(200, None), 1, None, NOW, &b, 7), End::Unknown(Some(_))));
        match end_of(answered(200, Some(45009)), 1, None, NOW, &b, 7) {
            End::Retry { at, answer: Some(a) } => {
                assert!((NOW..=NOW + b.base_us).contains(&at), "{at}");
                assert_eq!(a.errcode, Some(45009));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(end_of(Attempt::NeverSent, 1, None, NOW, &b, 0), End::Retry { at: NOW, answer: None });
    }

    #[test]
    fn not_now_fails_after_the_last_attempt_or_past_the_deadline() {
        let b = Backoff { max_attempts: 3, ..Backoff::default() };
        assert!(matches!(end_of(answered(200, Some(-1)), 2, None, NOW, &b, 1), End::Retry { .. }));
        assert!(matches!(end_of(answered(200, Some(-1)), 3, None, NOW, &b, 1), End::Failed(_)));
        // A quota refusal is not the message's fault: only its deadline ends it.
        assert!(matches!(end_of(answered(200, Some(45009)), 30, None, NOW, &b, 1), End::Retry { .. }));
        assert!(matches!(end_of(answered(429, None), 30, None, NOW, &b, 1), End::Retry { .. }));
        // The retry would land after the deadline: the job went and was refused.
        let deadline = Some(NOW + 10);
        assert!(matches!(end_of(answered(200, Some(45011)), 1, deadline, NOW, &b, 500_000), End::Failed(_)));
        // Never sent: it waits no later than its deadline, to be expired then.
        assert_eq!(
            end_of(Attempt::NeverSent, 1, deadline, NOW, &b, 500_000),
            End::Retry { at: NOW + 10, answer: None }
        );
    }

    #[test]
    fn retries_double_up_to_the_cap_and_spread_over_the_whole_interval() {
        let b = Backoff { base_us: 1_000, cap_us: 10_000, max_attempts: 100 };
        let max = |attempts| b.delay_us(attempts, u64::MAX - 1).max(b.delay_us(attempts, 10_000));
        assert_eq!(b.delay_us(1, 1_000), 1_000);
        assert_eq!(b.delay_us(1, 1_001), 0, "within [0, base]");
        assert!(max(2) <= 2_000 && max(4) <= 8_000 && max(5) <= 10_000 && max(60) <= 10_000);
        // 1,000 jobs refused at one instant, each with its own random bits:
        // their retries cover the interval, not one instant.
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut delays: Vec<Micros> = (0..1000)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                b.delay_us(4, seed)
            })
            .collect();
        delays.sort_unstable();
        delays.dedup();
        assert!(delays.len() > 800, "{} distinct instants of 1,000", delays.len());
        assert!(delays[0] < 100 && delays[delays.len() - 1] > 7_900, "{:?}", (delays[0], delays.last()));
    }

    #[test]
    fn a_kept_answer_is_cut_to_answer_max() {
        let long = Answer { status: 200, errcode: Some(0), body: Bytes::from(vec![b'x'; ANSWER_MAX + 10]) };
        match end_of(Attempt::Answered(long), 1, None, NOW, &Backoff::default(), 0) {
            End::Sent(a) => assert_eq!(a.body.len(), ANSWER_MAX),
            other => panic!("{other:?}"),
        }
    }
}
