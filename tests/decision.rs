//! The pure decision, checked against its stated guarantees on random input.

use crate::support;

use proptest::prelude::*;
use support::max_in_window;
use wxgate::limit::calendar::Period;
use wxgate::limit::decide::{decide, refund};
use wxgate::limit::{Ask, Decision, Key, Limit, Reason, Rule, RuleState, WindowLimit};

const SEC: i64 = 1_000_000;
const BEIJING: i64 = 8 * 3600 * SEC;

fn rule(limits: Vec<Limit>) -> Rule {
    Rule::new("r", limits)
}

/// Police-only decision at `now`.
fn dec(rule: &Rule, state: &mut RuleState, now: i64) -> Decision {
    let ask = Ask {
        key: Key { account: "a", rule, offset_us: BEIJING },
        max_wait_us: 0,
        holder: "",
        lease_us: 0,
        normal: false,
        share: None,
        cost: 1,
        recipients: &[],
    };
    decide(state, &ask, now, 0)
}

fn window(count: u64, per_s: i64, burst: u64) -> Limit {
    Limit::Window(WindowLimit::new(count, per_s * SEC, burst).expect("a valid window"))
}

fn quota(count: u64, period: Period) -> Limit {
    Limit::Calendar { count: std::num::NonZeroU64::new(count).expect("a count"), period }
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
            let ask = Ask { key, max_wait_us: r.max_wait_us, holder: "", lease_us: 0, normal: false, share: None, cost: 1, recipients: &[] };
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
        let r = rule(vec![window(count, per_s, 1), quota(day_quota, Period::Day)]);
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
    let Decision::Reject { wait_us, reason, .. } = dec(&r, &mut st, t) else { panic!("admitted a 31st") };
    assert_eq!(reason, Reason::Rate);
    assert_eq!(wait_us, (60 * SEC + 270) / 271);
}

#[test]
fn a_warm_up_added_by_a_reload_finds_a_busy_pair_warm() {
    // One call a second, no warm-up, called every second; then a reload adds
    // a 10 s warm-up. The pair was never idle: it is warm, one a second goes
    // on (not the half rate of a cold start).
    let plain = rule(vec![window(1, 1, 1)]);
    let mut warming = rule(vec![window(1, 1, 1)]);
    warming.warmup_us = 10 * SEC;
    let mut st = RuleState::default();
    let t = 1_700_000_000 * SEC;
    for i in 0..3 {
        assert!(matches!(dec(&plain, &mut st, t + i * SEC), Decision::Admit { .. }), "call {i} refused");
    }
    for i in 3..6 {
        let d = dec(&warming, &mut st, t + i * SEC);
        assert!(matches!(d, Decision::Admit { .. }), "after the reload, call {i} refused: {d:?}");
    }
}

#[test]
fn all_or_nothing_across_limits() {
    // The day quota is spent; the minute window must not be debited by refusals.
    let r = rule(vec![window(5, 60, 5), quota(2, Period::Day)]);
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
    let bigger = rule(vec![window(5, 60, 5), quota(100, Period::Day)]);
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
    let day10 = rule(vec![quota(10, Period::Day)]);
    for _ in 0..8 {
        dec(&day10, &mut st, t);
    }
    let day5 = rule(vec![quota(5, Period::Day)]);
    assert!(matches!(dec(&day5, &mut st, t), Decision::Reject { reason: Reason::Quota, .. }));
}

#[test]
fn admissions_report_the_limit_with_least_room() {
    let r = rule(vec![window(300, 60, 30), quota(10, Period::Day)]);
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

/// Beijing midnight starting 2026-11-30, in UTC microseconds.
const MIDNIGHT: i64 = (20_786 * 86_400 + 16 * 3600) * SEC;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Calendar quotas: admitting k calls and then giving back j of them
    /// (at once, hours later, or after midnight) leaves every later decision
    /// exactly as if only the k − j had been admitted.
    #[test]
    fn refunded_calls_count_as_never_admitted(extra in 0u64..4,
                                              calls in prop::collection::vec((0i64..900 * SEC, any::<bool>()), 1..12),
                                              before_midnight in 0i64..4 * 3600 * SEC,
                                              refund_after in 0i64..3 * 3600 * SEC,
                                              later in prop::collection::vec(0i64..3 * 3600 * SEC, 1..30)) {
        let k = calls.len() as u64;
        let r = rule(vec![
            quota(k + extra, Period::Day),
            quota(2 * k + extra, Period::Month),
        ]);
        let (mut real, mut twin) = (RuleState::default(), RuleState::default());
        let mut now = MIDNIGHT - before_midnight;
        let mut failed = Vec::new();
        for (gap, fails) in &calls {
            now += gap;
            let Decision::Admit { at, .. } = dec(&r, &mut real, now) else {
                return Err(TestCaseError::fail("within the quota"));
            };
            if *fails {
                failed.push(at);
            } else {
                dec(&r, &mut twin, now);
            }
        }
        now += refund_after;
        for at in failed {
            refund(&mut real, &r, at, now, BEIJING, 1);
        }
        for gap in later {
            now += gap;
            prop_assert_eq!(dec(&r, &mut real, now), dec(&r, &mut twin, now));
        }
    }

    /// Window limits: calls that never reached WeChat given back at any
    /// moment (at once, or after other calls were admitted and held, under
    /// warm-up) never let more than `count` calls reach WeChat in any window.
    #[test]
    fn refunds_keep_windows_exact(count in 1u64..20, burst_frac in 0u64..=100, per_s in 1i64..30,
                                  max_wait_ms in prop::sample::select(vec![0i64, 0, 500, 3_000]), warmup_s in 0i64..20,
                                  steps in prop::collection::vec((0i64..2_000_000, 0u8..3, 0i64..3_000_000), 1..300)) {
        let burst = (count * burst_frac / 100).max(1);
        let mut r = rule(vec![window(count, per_s, burst), quota(10_000, Period::Day)]);
        r.max_wait_us = max_wait_ms * 1000;
        r.warmup_us = warmup_s * SEC;
        let mut st = RuleState::default();
        let mut now = 1_700_000_000 * SEC;
        let mut sent = Vec::new();
        // Refunds still to make: (when, the call's admission time).
        let mut pending: Vec<(i64, i64)> = Vec::new();
        for (gap, fate, delay) in steps {
            now += gap;
            pending.sort();
            while let Some(&(due, at)) = pending.first().filter(|(due, _)| *due <= now) {
                refund(&mut st, &r, at, due, BEIJING, 1);
                pending.remove(0);
            }
            let key = Key { account: "a", rule: &r, offset_us: BEIJING };
            let ask = Ask { key, max_wait_us: r.max_wait_us, holder: "", lease_us: 0, normal: false, share: None, cost: 1, recipients: &[] };
            if let Decision::Admit { at, .. } = decide(&mut st, &ask, now, 0) {
                match fate {
                    // It never reached WeChat: given back right after its
                    // forward time, or `delay` later.
                    0 => pending.push((at, at)),
                    1 => pending.push((at + delay, at)),
                    _ => sent.push(at),
                }
            }
        }
        sent.sort();
        prop_assert!(max_in_window(&sent, per_s * SEC) as u64 <= count);
    }
}

#[test]
fn a_call_reserved_for_the_next_day_is_given_back_to_that_day() {
    let mut r = rule(vec![quota(1, Period::Day)]);
    r.max_wait_us = 5 * SEC;
    let mut st = RuleState::default();
    let key = Key { account: "a", rule: &r, offset_us: BEIJING };
    let ask = Ask {
        key,
        max_wait_us: r.max_wait_us,
        holder: "",
        lease_us: 0,
        normal: false,
        share: None,
        cost: 1,
        recipients: &[],
    };
    let before = MIDNIGHT - SEC;
    assert!(matches!(decide(&mut st, &ask, before, 0), Decision::Admit { hold_us: 0, .. }));
    let Decision::Admit { at, hold_us, .. } = decide(&mut st, &ask, before, 0) else { panic!("held for tomorrow") };
    assert_eq!((at, hold_us), (MIDNIGHT, SEC));
    assert!(refund(&mut st, &r, at, before, BEIJING, 1), "tomorrow's reservation given back");
    // Tomorrow is whole again; today is still spent.
    assert!(matches!(dec(&r, &mut st, before), Decision::Reject { reason: Reason::Quota, .. }));
    assert!(matches!(dec(&r, &mut st, MIDNIGHT), Decision::Admit { .. }));
    // Today's call, given back after midnight: that day is over, nothing comes back.
    assert!(!refund(&mut st, &r, before, MIDNIGHT, BEIJING, 1));
    assert!(matches!(dec(&r, &mut st, MIDNIGHT), Decision::Reject { reason: Reason::Quota, .. }));
}

#[test]
fn a_refund_never_frees_a_slot_a_held_call_already_took() {
    // One call per 10 s, calls held up to 20 s for their slot.
    let mut r = rule(vec![window(1, 10, 1)]);
    r.max_wait_us = 20 * SEC;
    let mut st = RuleState::default();
    let key = Key { account: "a", rule: &r, offset_us: BEIJING };
    let ask = Ask {
        key,
        max_wait_us: r.max_wait_us,
        holder: "",
        lease_us: 0,
        normal: false,
        share: None,
        cost: 1,
        recipients: &[],
    };
    let t = 1_700_000_000 * SEC;
    let Decision::Admit { at: failed, .. } = decide(&mut st, &ask, t, 0) else { panic!("admitted") };
    // A second call is held for the next slot, t + 10 s; then the first one
    // fails to connect. Moving the TAT back would give a third call the
    // held call's slot: two calls in [t + 10 s, t + 20 s).
    let Decision::Admit { at: held, .. } = decide(&mut st, &ask, t, 0) else { panic!("held") };
    assert_eq!(held, t + 10 * SEC);
    refund(&mut st, &r, failed, t, BEIJING, 1);
    let Decision::Admit { at: third, .. } = decide(&mut st, &ask, t, 0) else { panic!("held") };
    assert!(third >= held + 10 * SEC, "third call at {} s", (third - t) / SEC);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Calls costing several units (a message to several recipients): no
    /// window of length `per` takes more than `count` units and no day
    /// more than its quota, whatever the costs and arrivals; a call is
    /// admitted whole or not at all; and a call costing 1 more than the
    /// burst is never admitted.
    #[test]
    fn costs_never_exceed_a_window_or_a_day(count in 2u64..40, burst_frac in 0u64..=100, per_s in 1i64..60,
                                            day in 5u64..200,
                                            calls in prop::collection::vec((0i64..3_000_000, 1u64..8), 1..300)) {
        let burst = (count * burst_frac / 100).max(1);
        let r = rule(vec![window(count, per_s, burst), quota(day, Period::Day)]);
        let mut st = RuleState::default();
        let mut now = 1_700_000_000 * SEC;
        let mut units = Vec::new();
        let mut total = 0u64;
        for (gap, cost) in calls {
            now += gap;
            let ask = Ask { key: Key { account: "a", rule: &r, offset_us: BEIJING }, max_wait_us: 0, holder: "", lease_us: 0, normal: false, share: None, cost, recipients: &[] };
            if let Decision::Admit { .. } = decide(&mut st, &ask, now, 0) {
                prop_assert!(cost <= burst, "cost {cost} admitted past a burst of {burst}");
                units.extend(std::iter::repeat_n(now, cost as usize));
                total += cost;
            }
        }
        prop_assert!(max_in_window(&units, per_s * SEC) as u64 <= count);
        prop_assert!(max_in_window(&units, 86_400 * SEC) as u64 <= day || total <= day);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Messages to random sets of members under per-recipient windows: no
    /// member gets more than a window's count in any window of its length,
    /// a message is admitted for all its recipients or none (the rule's
    /// window counts exactly the recipients of the admitted ones), and a
    /// refusal names exactly the members whose own windows are full.
    #[test]
    fn no_recipient_gets_more_than_its_own_windows(count in 1u64..6, burst_frac in 0u64..=100, per_s in 1i64..30,
                                                   hour in 3u64..20,
                                                   calls in prop::collection::vec((0i64..2_000_000, 1u8..16), 1..300)) {
        let burst = (count * burst_frac / 100).max(1);
        let mut r = rule(vec![window(10_000, 60, 10_000)]);
        r.per_recipient = vec![
            WindowLimit::new(count, per_s * SEC, burst).expect("a valid window"),
            WindowLimit::new(hour, 3600 * SEC, hour).expect("a valid window"),
        ];
        let members = ["u1", "u2", "u3", "u4"];
        let mut st = RuleState::default();
        let mut now = 1_700_000_000 * SEC;
        let mut got: Vec<Vec<i64>> = vec![Vec::new(); members.len()];
        for (gap, set) in calls {
            now += gap;
            let to: Vec<usize> = (0..members.len()).filter(|i| set & (1 << i) != 0).collect();
            let ids: Vec<String> = to.iter().map(|i| members[*i].to_owned()).collect();
            let ask = Ask { key: Key { account: "a", rule: &r, offset_us: BEIJING }, max_wait_us: 0, holder: "", lease_us: 0, normal: false, share: None, cost: ids.len() as u64, recipients: &ids };
            match decide(&mut st, &ask, now, 0) {
                Decision::Admit { .. } => {
                    for i in &to {
                        got[*i].push(now);
                    }
                }
                Decision::Reject { reason, over, .. } => {
                    prop_assert_eq!(reason, Reason::Recipient);
                    prop_assert!(!over.is_empty());
                    // Each member alone now: refused exactly when named over.
                    for (j, id) in ids.iter().enumerate() {
                        let alone = std::slice::from_ref(id);
                        let ask = Ask { cost: 1, recipients: alone, ..ask };
                        let admitted = matches!(decide(&mut st.clone(), &ask, now, 0), Decision::Admit { .. });
                        prop_assert_eq!(admitted, !over.contains(&(j as u32)), "{} named over: {:?}", id, over);
                    }
                }
            }
        }
        for times in &got {
            prop_assert!(max_in_window(times, per_s * SEC) as u64 <= count);
            prop_assert!(max_in_window(times, 3600 * SEC) as u64 <= hour);
        }
    }
}

/// The instances' ids in [`leases_keep_every_window_and_day_exact`].
const INSTANCES: [&str; 3] = ["i0", "i1", "i2"];

/// One instance's lease in [`leases_keep_every_window_and_day_exact`]:
/// the grant and the units it has not spent.
struct Held {
    lease: wxgate::limit::lease::Leased,
    left: u64,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Leases (src/limit/lease.rs) taken by three instances of random
    /// sizes and spans, spent at random moments of their spans, given back
    /// or abandoned (a crash), mixed with calls decided one by one and
    /// refunds of those: the calls sent never hold more than `count` in any
    /// window, nor more than the day quota in a day, across midnight.
    #[test]
    fn leases_keep_every_window_and_day_exact(count in 2u64..30, burst_frac in 0u64..=100, per_s in 1i64..10,
                                              day_x in 1u64..5, start_before in 0i64..20 * SEC,
                                              steps in prop::collection::vec(
                                                  (0i64..300_000, 0u8..9, 0usize..3, 1u64..30, 0i64..8 * SEC),
                                                  1..500)) {
        use wxgate::limit::lease::{give_back, take, Want};
        let burst = (count * burst_frac / 100).max(1);
        // Days of 1 to 4 windows' worth: either limit may be the one that binds.
        let day = count * day_x;
        let r = rule(vec![window(count, per_s, burst), quota(day, Period::Day)]);
        let mut st = RuleState::default();
        let mut now = MIDNIGHT - start_before;
        let mut held: [Option<Held>; 3] = [None, None, None];
        let mut sent: Vec<i64> = Vec::new();
        let mut by_call: Vec<(i64, usize)> = Vec::new();
        for (gap, what, i, want, span) in steps {
            now += gap;
            match what {
                // A call decided alone.
                0..=2 => {
                    if let Decision::Admit { at, .. } = dec(&r, &mut st, now) {
                        by_call.push((at, sent.len()));
                        sent.push(at);
                    }
                }
                // Instance i takes a lease (giving back the one it holds first).
                3 => {
                    if let Some(h) = held[i].take() {
                        give_back(&mut st, INSTANCES[i], &h.lease, h.left, now, BEIJING);
                    }
                    let want = Want { instance: INSTANCES[i], units: want, span_us: span, normal: false, reserve: false };
                    let lease = take(&mut st, &r, &want, now, BEIJING);
                    prop_assert!(lease.units <= burst, "a lease of {} over the burst {burst}", lease.units);
                    let left = lease.units;
                    held[i] = Some(Held { lease, left });
                }
                // Instance i sends a call from its lease, while it lasts.
                4 | 5 => {
                    if let Some(h) = held[i].as_mut() {
                        if h.left > 0 && now <= h.lease.until {
                            h.left -= 1;
                            sent.push(now);
                        }
                    }
                }
                // Instance i gives back what it did not spend.
                6 => {
                    if let Some(h) = held[i].take() {
                        give_back(&mut st, INSTANCES[i], &h.lease, h.left, now, BEIJING);
                    }
                }
                // Instance i crashes (its lease is never given back), or a
                // call decided alone never reached WeChat and is refunded.
                _ => {
                    if i == 0 {
                        held[0] = None;
                    } else if let Some((at, n)) = by_call.pop() {
                        if sent[n] == at {
                            sent[n] = i64::MIN;
                            refund(&mut st, &r, at, now, BEIJING, 1);
                        }
                    }
                }
            }
        }
        let mut times: Vec<i64> = sent.into_iter().filter(|t| *t != i64::MIN).collect();
        times.sort_unstable();
        prop_assert!(max_in_window(&times, per_s * SEC) as u64 <= count);
        for d in [MIDNIGHT - 86_400 * SEC, MIDNIGHT] {
            let n = times.iter().filter(|t| **t >= d && **t < d + 86_400 * SEC).count() as u64;
            prop_assert!(n <= day, "{n} sent in a day of {day}");
        }
    }
}
