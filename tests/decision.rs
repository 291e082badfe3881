//! The pure decision, checked against its stated guarantees on random input.

mod support;

use proptest::prelude::*;
use support::max_in_window;
use wxgate::calendar::Period;
use wxgate::limit::decide::decide;
use wxgate::limit::{Ask, Decision, Key, Limit, Reason, Rule, RuleState, WindowLimit};

const SEC: i64 = 1_000_000;
const BEIJING: i64 = 8 * 3600 * SEC;

fn rule(limits: Vec<Limit>) -> Rule {
    Rule {
        name: "r".into(),
        patterns: vec![],
        limits,
        max_wait_us: 0,
        warmup_us: 0,
        concurrency: 0,
        shadow: false,
        policy_header: None,
        policy_prefixes: Vec::new(),
    }
}

/// Police-only decision at `now`.
fn dec(rule: &Rule, state: &mut RuleState, now: i64) -> Decision {
    let ask = Ask { key: Key { account: "a", rule, offset_us: BEIJING }, max_wait_us: 0, holder: "", lease_us: 0 };
    decide(state, &ask, now, 0)
}

fn window(count: u64, per_s: i64, burst: u64) -> Limit {
    Limit::Window(WindowLimit::new(count, per_s * SEC, burst))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// No window of length `per` admits more than `count`, whatever the arrivals.
    #[test]
    fn window_exact(count in 1u64..40, burst_frac in 0u64..=100, per_s in 1i64..120,
                    gaps in prop::collection::vec(0i64..4_000_000, 1..400)) {
        let burst = (count * burst_frac / 100).max(1);
        let r = rule(vec![window(count, per_s, burst)]);
        let mut st = RuleState::default();
        let mut now = 1_700_000_000 * SEC;
        let mut admitted = Vec::new();
        for g in gaps {
            now += g;
            if let Decision::Admit { .. } = dec(&r, &mut st, now) {
                admitted.push(now);
            }
        }
        prop_assert!(max_in_window(&admitted, per_s * SEC) as u64 <= count);
    }

    /// Holding calls for reserved slots (max_wait) and warm-up keep the
    /// guarantee: no window of forward times holds more than `count`.
    #[test]
    fn window_exact_with_holds_and_warm_up(count in 1u64..30, burst_frac in 0u64..=100, per_s in 1i64..60,
                                           max_wait_ms in 0i64..5_000, warmup_s in 0i64..30,
                                           gaps in prop::collection::vec(0i64..3_000_000, 1..300)) {
        let burst = (count * burst_frac / 100).max(1);
        let mut r = rule(vec![window(count, per_s, burst)]);
        r.max_wait_us = max_wait_ms * 1000;
        r.warmup_us = warmup_s * SEC;
        let mut st = RuleState::default();
        let mut now = 1_700_000_000 * SEC;
        let mut sent = Vec::new();
        for (i, g) in gaps.iter().enumerate() {
            now += g;
            // Every 50th call, a token refresh restarts the warm-up.
            let account_warm = if i % 50 == 49 { now } else { 0 };
            let key = Key { account: "a", rule: &r, offset_us: BEIJING };
            let ask = Ask { key, max_wait_us: r.max_wait_us, holder: "", lease_us: 0 };
            if let Decision::Admit { at, hold_us, .. } = decide(&mut st, &ask, now, account_warm) {
                prop_assert!(hold_us <= r.max_wait_us);
                sent.push(at);
            }
        }
        sent.sort();
        prop_assert!(max_in_window(&sent, per_s * SEC) as u64 <= count);
    }

    /// A rejection's wait is honest: retrying exactly then is admitted, a
    /// microsecond earlier is not, and a rejection consumes nothing.
    #[test]
    fn wait_is_the_earliest_admission(count in 2u64..20, per_s in 1i64..60, day_quota in 1u64..50,
                                      gaps in prop::collection::vec(0i64..2_000_000, 1..100)) {
        let r = rule(vec![window(count, per_s, 1), Limit::Calendar { count: day_quota, period: Period::Day }]);
        let mut st = RuleState::default();
        let mut now = 1_700_000_000 * SEC;
        for g in gaps {
            now += g;
            let before = st.clone();
            if let Decision::Reject { wait_us, .. } = dec(&r, &mut st, now) {
                prop_assert_eq!(&st, &before, "a rejection changed state");
                let mut early = st.clone();
                let early_decision = dec(&r, &mut early, now + wait_us - 1);
                let early_rejected = matches!(early_decision, Decision::Reject { .. });
                prop_assert!(early_rejected);
                let mut on_time = st.clone();
                let on_time_decision = dec(&r, &mut on_time, now + wait_us);
                let on_time_admitted = matches!(on_time_decision, Decision::Admit { .. });
                prop_assert!(on_time_admitted);
            }
        }
    }
}

#[test]
fn burst_after_idle_then_sustained_rate() {
    // 300/min, burst 30: 30 at once, then one every ⌈60 s / 271⌉.
    let r = rule(vec![window(300, 60, 30)]);
    let mut st = RuleState::default();
    let t = 1_700_000_000 * SEC;
    let admitted = (0..40).filter(|_| matches!(dec(&r, &mut st, t), Decision::Admit { .. })).count();
    assert_eq!(admitted, 30);
    let Decision::Reject { wait_us, reason } = dec(&r, &mut st, t) else { panic!("admitted a 31st") };
    assert_eq!(reason, Reason::Rate);
    assert_eq!(wait_us, (60 * SEC + 270) / 271);
}

#[test]
fn all_or_nothing_across_limits() {
    // The day quota is spent; the minute window must not be debited by refusals.
    let r = rule(vec![window(5, 60, 5), Limit::Calendar { count: 2, period: Period::Day }]);
    let mut st = RuleState::default();
    let t = 1_700_000_000 * SEC;
    for _ in 0..2 {
        assert!(matches!(dec(&r, &mut st, t), Decision::Admit { .. }));
    }
    for _ in 0..10 {
        let d = dec(&r, &mut st, t);
        assert!(matches!(d, Decision::Reject { reason: Reason::Quota, .. }), "{d:?}");
    }
    // Same state under a rule with a larger day quota: the window still has 3 of 5.
    let bigger = rule(vec![window(5, 60, 5), Limit::Calendar { count: 100, period: Period::Day }]);
    let admitted = (0..10).filter(|_| matches!(dec(&bigger, &mut st, t), Decision::Admit { .. })).count();
    assert_eq!(admitted, 3);
}

#[test]
fn lowering_a_limit_clamps_existing_state() {
    let t = 1_700_000_000 * SEC;
    let mut st = RuleState::default();
    let generous = rule(vec![window(100, 60, 50)]);
    // Long idle: full bucket of 50 under the old rule. Use 5 of them.
    for _ in 0..5 {
        assert!(matches!(dec(&generous, &mut st, t), Decision::Admit { .. }));
    }
    // New config: burst 3. Only 3 go at once, not the 45 left under the old one.
    let strict = rule(vec![window(100, 60, 3)]);
    let later = t + 3600 * SEC;
    let admitted = (0..20).filter(|_| matches!(dec(&strict, &mut st, later), Decision::Admit { .. })).count();
    assert_eq!(admitted, 3);
    // And a lowered day quota below what was used refuses at once.
    let mut st = RuleState::default();
    let day10 = rule(vec![Limit::Calendar { count: 10, period: Period::Day }]);
    for _ in 0..8 {
        dec(&day10, &mut st, t);
    }
    let day5 = rule(vec![Limit::Calendar { count: 5, period: Period::Day }]);
    assert!(matches!(dec(&day5, &mut st, t), Decision::Reject { reason: Reason::Quota, .. }));
}

#[test]
fn admissions_report_the_limit_with_least_room() {
    let r = rule(vec![window(300, 60, 30), Limit::Calendar { count: 10, period: Period::Day }]);
    let mut st = RuleState::default();
    let t = 1_700_000_000 * SEC;
    let Decision::Admit { quota: Some(q), .. } = dec(&r, &mut st, t) else { panic!("admitted") };
    // The day quota (9 left) has less room than the window (29 left).
    assert_eq!((q.limit, q.remaining), (1, 9));
    let r = rule(vec![window(300, 60, 30)]);
    let mut st = RuleState::default();
    let Decision::Admit { quota: Some(q), .. } = dec(&r, &mut st, t) else { panic!("admitted") };
    assert_eq!((q.limit, q.remaining, q.reset_us), (0, 29, (60 * SEC + 270) / 271));
}
