//! One decision semantics, two stores: every scenario runs against the memory
//! store and against the Redis store (lua/*.lua on a real redis-server, time
//! passed explicitly), and both must give exactly the expected results.

mod support;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use support::redis_server::RedisServer;
use wxgate::clock::{Clock, ManualClock};
use wxgate::config::Config;
use wxgate::limit::{Decision, Reason, Rule};
use wxgate::penalty::PenaltyPolicy;
use wxgate::store::{MemoryStore, RedisConfig, RedisStore, Store};

const MS: i64 = 1_000;
const SEC: i64 = 1_000_000;
const BEIJING: i64 = 8 * 3600 * SEC;
/// 2026-11-29 10:00:00 Beijing.
const T0: i64 = (20_786 * 86_400 + 2 * 3600) * SEC;
/// 2026-11-29 23:59:59 Beijing.
const BEFORE_MIDNIGHT: i64 = (20_786 * 86_400 + 15 * 3600 + 59 * 60 + 59) * SEC;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Expect {
    Ok,
    No(i64, Reason),
    /// Penalty ends this long after now.
    Until(i64),
    Any,
}

#[derive(Clone)]
enum Op {
    /// Move the clock.
    Wait(i64),
    /// One call for an account.
    Call(&'static str),
    /// WeChat answered `errcode` to the n-th admitted call.
    Penalise(i64, usize),
    /// WeChat answered the n-th admitted call successfully.
    Success(usize),
    /// Switch to the rule in this TOML `limits = [...]` value.
    Limits(&'static str),
}

struct Scenario {
    name: &'static str,
    start: i64,
    limits: &'static str,
    steps: Vec<(Op, Expect)>,
}

use Expect::*;
use Op::*;

fn call(n: usize, e: Expect) -> Vec<(Op, Expect)> {
    vec![(Call("a"), e); n]
}

fn scenarios() -> Vec<Scenario> {
    vec![
        Scenario {
            name: "burst_then_spacing",
            start: T0,
            limits: r#"[{ count = 10, per = "10s", burst = 3 }]"#,
            steps: [
                call(3, Ok),
                vec![
                    (Call("a"), No(1250 * MS, Reason::Rate)),
                    (Wait(1249 * MS), Any),
                    (Call("a"), No(MS, Reason::Rate)),
                ],
                vec![(Wait(MS), Any), (Call("a"), Ok), (Call("a"), No(1250 * MS, Reason::Rate))],
            ]
            .concat(),
        },
        Scenario {
            name: "day_quota_at_beijing_midnight",
            start: BEFORE_MIDNIGHT,
            limits: r#"[{ count = 2, per = "day" }]"#,
            steps: [
                call(2, Ok),
                vec![(Call("a"), No(SEC, Reason::Quota)), (Wait(SEC - 1), Any), (Call("a"), No(1, Reason::Quota))],
                vec![(Wait(1), Any)],
                call(2, Ok),
                vec![(Call("a"), No(86_400 * SEC, Reason::Quota))],
            ]
            .concat(),
        },
        Scenario {
            name: "month_quota_rolls_on_the_1st",
            // 2026-11-30 23:59:59 Beijing.
            start: BEFORE_MIDNIGHT + 86_400 * SEC,
            limits: r#"[{ count = 1, per = "month" }]"#,
            steps: vec![(Call("a"), Ok), (Call("a"), No(SEC, Reason::Quota)), (Wait(SEC), Any), (Call("a"), Ok)],
        },
        Scenario {
            name: "all_or_nothing",
            start: BEFORE_MIDNIGHT,
            limits: r#"[{ count = 3, per = "1m", burst = 3 }, { count = 2, per = "day" }]"#,
            steps: [
                call(2, Ok),
                call(5, No(SEC, Reason::Quota)),
                vec![(Wait(SEC), Any), (Call("a"), Ok), (Call("a"), No(59 * SEC, Reason::Rate))],
            ]
            .concat(),
        },
        Scenario {
            name: "lowered_limit_clamps",
            start: T0,
            limits: r#"[{ count = 100, per = "1m", burst = 50 }, { count = 10, per = "day" }]"#,
            steps: [
                call(5, Ok),
                vec![(Limits(r#"[{ count = 100, per = "1m", burst = 3 }, { count = 6, per = "day" }]"#), Any)],
                vec![(Wait(3600 * SEC), Any)],
                call(1, Ok),
                vec![(Call("a"), No(13 * 3600 * SEC, Reason::Quota))],
            ]
            .concat(),
        },
        Scenario {
            name: "lowered_burst_clamps",
            start: T0,
            limits: r#"[{ count = 100, per = "1m", burst = 50 }]"#,
            steps: [
                call(5, Ok),
                vec![(Limits(r#"[{ count = 100, per = "1m", burst = 3 }]"#), Any), (Wait(3600 * SEC), Any)],
                call(3, Ok),
                vec![(Call("a"), No(612_245, Reason::Rate))],
            ]
            .concat(),
        },
        Scenario {
            name: "penalty_escalates_and_resets",
            start: T0,
            limits: r#"[{ count = 1000, per = "day" }]"#,
            steps: vec![
                (Call("a"), Ok),
                (Penalise(45009, 0), Until(60 * SEC)),
                (Call("a"), No(60 * SEC, Reason::Penalty)),
                (Call("b"), Ok),
                (Wait(60 * SEC), Any),
                (Call("a"), Ok),
                (Penalise(45009, 2), Until(120 * SEC)),
                // A stale success (call 0 was sent before this penalty) ends nothing.
                (Success(0), Any),
                (Wait(120 * SEC), Any),
                (Call("a"), Ok),
                (Success(3), Any),
                (Call("a"), Ok),
                (Penalise(45009, 4), Until(60 * SEC)),
            ],
        },
        Scenario {
            name: "in_flight_answers_do_not_escalate",
            start: T0,
            limits: "[]",
            steps: vec![
                (Call("a"), Ok),
                (Call("a"), Ok),
                (Call("a"), Ok),
                (Wait(SEC), Any),
                (Penalise(45009, 0), Until(60 * SEC)),
                (Wait(SEC), Any),
                (Penalise(45009, 1), Until(59 * SEC)),
                (Penalise(45033, 2), Until(59 * SEC)),
            ],
        },
        Scenario {
            name: "penalty_cap_is_midnight_and_45011_is_next_minute",
            start: BEFORE_MIDNIGHT - 100 * SEC,
            limits: "[]",
            steps: vec![
                (Call("a"), Ok),
                (Penalise(45009, 0), Until(60 * SEC)),
                (Wait(60 * SEC), Any),
                (Call("a"), Ok),
                // 23:59:19: doubling to 120 s would cross midnight.
                (Penalise(45009, 1), Until(41 * SEC)),
                (Wait(41 * SEC + 30 * SEC), Any),
                (Call("a"), Ok),
                (Penalise(45011, 2), Until(30 * SEC)),
            ],
        },
    ]
}

/// Pseudo-random arrivals for a window-exactness run on both stores.
fn random_scenario() -> Scenario {
    let mut seed: u64 = 42;
    let mut steps = Vec::new();
    for _ in 0..300 {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        let gap = match seed >> 61 {
            0 => 3 * SEC,
            1 | 2 => (seed >> 24) as i64 % (700 * MS),
            _ => 0,
        };
        steps.push((Wait(gap), Any));
        steps.push((Call("a"), Any));
    }
    Scenario { name: "random_window", start: T0, limits: r#"[{ count = 7, per = "5s", burst = 2 }]"#, steps }
}

fn compile(limits: &str) -> (Arc<Rule>, Vec<PenaltyPolicy>) {
    let text = format!("[[rule]]\nname = \"r\"\nmatch = [\"/x\"]\nlimits = {limits}\n");
    let config = Config::parse(&text, Path::new("scenario.toml")).expect("scenario config");
    (config.rules[0].clone(), config.penalties)
}

/// Runs a scenario on one store; returns every decision, as (time, outcome).
async fn run(s: &Scenario, store: &Store, clock: &ManualClock) -> Vec<(i64, Expect)> {
    clock.set_us(s.start);
    let (mut rule, penalties) = compile(s.limits);
    let mut admitted = Vec::new();
    let mut trace = Vec::new();
    for (i, (op, expect)) in s.steps.iter().enumerate() {
        let got = match op {
            Wait(d) => {
                clock.advance_us(*d);
                Any
            }
            Limits(l) => {
                rule = compile(l).0;
                Any
            }
            Call(account) => match store.acquire(account, &rule, BEIJING).await.expect("store answered") {
                Decision::Admit { at, .. } => {
                    assert_eq!(at, clock.now_us(), "{}: admitted at the store's now", s.name);
                    admitted.push(at);
                    Ok
                }
                Decision::Reject { wait_us, reason } => No(wait_us, reason),
            },
            Penalise(code, n) => {
                let policy = penalties.iter().find(|p| p.errcode == *code).expect("default policy");
                let (until, now) =
                    store.penalise("a", &rule, policy, admitted[*n], BEIJING).await.expect("store answered");
                Until(until - now)
            }
            Success(n) => {
                store.succeeded("a", &rule, admitted[*n], BEIJING).await.expect("store answered");
                Any
            }
        };
        if *expect != Any {
            assert_eq!(got, *expect, "scenario {} step {i} ({:?})", s.name, expect);
        }
        trace.push((clock.now_us(), got));
    }
    trace
}

#[tokio::test]
async fn memory_and_redis_stores_decide_identically() {
    let redis = RedisServer::start();
    let clock = ManualClock::new(T0);
    let mut all = scenarios();
    all.push(random_scenario());
    for s in &all {
        let memory = Store::Memory(MemoryStore::new(Arc::new(clock.clone())));
        let config = RedisConfig {
            url: redis.url(),
            password: None,
            key_prefix: format!("conf-{}", s.name),
            timeout: Duration::from_secs(5),
        };
        let shared = Store::Redis(
            RedisStore::connect(&config)
                .await
                .expect("connect to test redis")
                .with_fixed_clock(Arc::new(clock.clone())),
        );
        let from_memory = run(s, &memory, &clock).await;
        let from_redis = run(s, &shared, &clock).await;
        assert_eq!(from_memory, from_redis, "scenario {}: the stores disagree", s.name);
    }
    // The random run is window-exact on both (same trace): at most 7 in any 5 s.
    let trace = run(&random_scenario(), &Store::Memory(MemoryStore::new(Arc::new(clock.clone()))), &clock).await;
    let admitted: Vec<i64> = trace.iter().filter(|(_, e)| *e == Ok).map(|(t, _)| *t).collect();
    let mut lo = 0;
    for hi in 0..admitted.len() {
        while admitted[hi] - admitted[lo] >= 5 * SEC {
            lo += 1;
        }
        assert!(hi - lo < 7);
    }
    assert!(admitted.len() > 50, "{}", admitted.len());
}

#[tokio::test]
async fn redis_keys_are_hash_tagged_and_expire() {
    let redis = RedisServer::start();
    let config =
        RedisConfig { url: redis.url(), password: None, key_prefix: "wxgate".into(), timeout: Duration::from_secs(5) };
    // Real Redis TIME this time: production mode.
    let store = Store::Redis(RedisStore::connect(&config).await.expect("connect"));
    let (rule, _) = compile(r#"[{ count = 10, per = "1m" }, { count = 100, per = "day" }]"#);
    assert!(matches!(store.acquire("wxAPPID", &rule, BEIJING).await, std::result::Result::Ok(Decision::Admit { .. })));
    let keys = redis.command("KEYS *");
    assert!(keys.contains("wxgate:{wxAPPID}:r"), "{keys}");
    let ttl: i64 = redis.command("PTTL wxgate:{wxAPPID}:r").trim_start_matches(':').trim().parse().expect("PTTL");
    // The day count must live until Beijing midnight, and not much longer.
    assert!(ttl > 0 && ttl <= 86_400_000 + 1_000, "{ttl}");
    let fields = redis.command("HGETALL wxgate:{wxAPPID}:r");
    assert!(fields.contains("w60000") && fields.contains("day.n"), "{fields}");
    // RESP bulk strings: every other line is a field name or a value; values are integers.
    let lines: Vec<&str> = fields.lines().filter(|l| !l.starts_with('*') && !l.starts_with('$')).collect();
    for pair in lines.chunks(2) {
        assert!(pair[1].parse::<i64>().is_ok(), "numeric state only: {fields}");
    }
}
