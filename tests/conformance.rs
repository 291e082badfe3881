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
use wxgate::store::{Asking, MemoryStore, RedisConfig, RedisStore, Resilience, SharedStore, Store};

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
    /// Admitted, held this long for its reserved slot.
    Hold(i64),
    No(i64, Reason),
    /// Penalty ends this long after now.
    Until(i64),
    /// Room left reported by an admission.
    Quota(Option<wxgate::limit::Quota>),
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
    /// The n-th call ended: its concurrency slot is freed.
    Release(usize),
    /// An access token was refreshed for account "a".
    Token,
}

struct Scenario {
    name: &'static str,
    start: i64,
    limits: &'static str,
    /// More TOML keys of the rule (max_wait, warmup, concurrency).
    extra: &'static str,
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
            extra: "",
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
            extra: "",
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
            extra: "",
            steps: vec![(Call("a"), Ok), (Call("a"), No(SEC, Reason::Quota)), (Wait(SEC), Any), (Call("a"), Ok)],
        },
        Scenario {
            name: "all_or_nothing",
            start: BEFORE_MIDNIGHT,
            limits: r#"[{ count = 3, per = "1m", burst = 3 }, { count = 2, per = "day" }]"#,
            extra: "",
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
            extra: "",
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
            extra: "",
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
            extra: "",
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
            extra: "",
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
            extra: "",
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
        Scenario {
            name: "shaping_holds_within_max_wait",
            start: T0,
            limits: r#"[{ count = 10, per = "10s", burst = 3 }]"#,
            extra: r#"max_wait = "3s""#,
            steps: [
                call(3, Ok),
                vec![(Call("a"), Hold(1250 * MS)), (Call("a"), Hold(2500 * MS))],
                // Beyond max_wait: refused, and nothing reserved...
                vec![(Call("a"), No(3750 * MS, Reason::Rate)), (Call("a"), No(3750 * MS, Reason::Rate))],
                // ...so a second later the next slot is where it was.
                vec![(Wait(SEC), Any), (Call("a"), Hold(2750 * MS))],
            ]
            .concat(),
        },
        Scenario {
            name: "holding_across_midnight_counts_in_the_new_day",
            start: BEFORE_MIDNIGHT - SEC,
            limits: r#"[{ count = 2, per = "day" }]"#,
            extra: r#"max_wait = "5s""#,
            steps: [
                call(2, Ok),
                vec![(Call("a"), Hold(2 * SEC)), (Call("a"), Hold(2 * SEC))],
                vec![(Call("a"), No(2 * SEC + 86_400 * SEC, Reason::Quota))],
                vec![(Wait(2 * SEC), Any), (Call("a"), No(86_400 * SEC, Reason::Quota))],
            ]
            .concat(),
        },
        Scenario {
            name: "warm_up_starts_at_half_rate_and_again_after_a_token_refresh",
            start: T0,
            limits: r#"[{ count = 10, per = "10s", burst = 1 }]"#,
            extra: r#"warmup = "10s""#,
            steps: vec![
                (Call("a"), Ok),
                // Cold: one every 2 s instead of 1 s.
                (Call("a"), No(2 * SEC, Reason::Rate)),
                (Wait(2 * SEC), Any),
                (Call("a"), Ok),
                // 2 s into the warm-up: T / (0.5 + 0.5 · 0.2) = 1.666667 s.
                (Call("a"), No(1_666_667, Reason::Rate)),
                // 11 s after the start the warm-up is over: one per second.
                (Wait(9 * SEC), Any),
                (Call("a"), Ok),
                (Call("a"), No(SEC, Reason::Rate)),
                // A token refresh starts it again: 1 s in, T / 0.55.
                (Token, Any),
                (Wait(SEC), Any),
                (Call("a"), Ok),
                (Call("a"), No(1_818_182, Reason::Rate)),
                // Idle for a whole warm-up period: cold again.
                (Wait(30 * SEC), Any),
                (Call("a"), Ok),
                (Call("a"), No(2 * SEC, Reason::Rate)),
            ],
        },
        Scenario {
            name: "concurrency_slots_and_leases",
            start: T0,
            limits: "[]",
            extra: "concurrency = 2",
            steps: vec![
                (Call("a"), Ok),
                (Call("a"), Ok),
                (Call("a"), No(30 * SEC, Reason::Concurrency)),
                (Release(0), Any),
                (Call("a"), Ok),
                (Call("a"), No(30 * SEC, Reason::Concurrency)),
                // Holder 1 (say, a crashed instance) never releases: its lease runs out.
                (Release(3), Any),
                (Wait(30 * SEC), Any),
                (Call("a"), Ok),
                (Call("a"), Ok),
                (Call("a"), No(30 * SEC, Reason::Concurrency)),
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
    Scenario { name: "random_window", start: T0, limits: r#"[{ count = 7, per = "5s", burst = 2 }]"#, extra: "", steps }
}

fn compile(limits: &str, extra: &str) -> (Arc<Rule>, Vec<PenaltyPolicy>, i64) {
    let text = format!("[[rule]]\nname = \"r\"\nmatch = [\"/x\"]\nlimits = {limits}\n{extra}\n");
    let config = Config::parse(&text, Path::new("scenario.toml")).expect("scenario config");
    (config.rules[0].clone(), config.penalties, config.lease_us)
}

/// Runs a scenario on one store; returns every decision, as (time, outcome).
async fn run(s: &Scenario, store: &Store, clock: &ManualClock) -> Vec<(i64, Expect)> {
    run_as(s, store, clock, "").await
}

/// Runs a scenario on one store; accounts are `prefix` + the scenario's names
/// (so runs on a cluster spread over slots).
async fn run_as(s: &Scenario, store: &Store, clock: &ManualClock, prefix: &str) -> Vec<(i64, Expect)> {
    let acct = |a: &str| format!("{prefix}{a}");
    clock.set_us(s.start);
    let (mut rule, penalties, lease_us) = compile(s.limits, s.extra);
    let mut calls = 0;
    let mut quotas = Vec::new();
    let mut admitted = Vec::new();
    let mut trace = Vec::new();
    for (i, (op, expect)) in s.steps.iter().enumerate() {
        let got = match op {
            Wait(d) => {
                clock.advance_us(*d);
                Any
            }
            Limits(l) => {
                rule = compile(l, s.extra).0;
                Any
            }
            Call(account) => {
                let holder = format!("h{calls}");
                calls += 1;
                let asking = Asking { offset_us: BEIJING, max_wait_us: rule.max_wait_us, holder: &holder, lease_us };
                match store.acquire(&acct(account), &rule, &asking).await.expect("store answered") {
                    Decision::Admit { at, hold_us, quota, .. } => {
                        assert_eq!(at, clock.now_us() + hold_us, "{}: admitted for now + hold", s.name);
                        admitted.push(at);
                        quotas.push(quota);
                        if hold_us == 0 {
                            Ok
                        } else {
                            Hold(hold_us)
                        }
                    }
                    Decision::Reject { wait_us, reason } => No(wait_us, reason),
                }
            }
            Release(n) => {
                store.release(&acct("a"), &rule, &format!("h{n}"), BEIJING).await.expect("store answered");
                Any
            }
            Token => {
                store.token_refreshed(&acct("a"), rule.warmup_us).await.expect("store answered");
                Any
            }
            Penalise(code, n) => {
                let policy = penalties.iter().find(|p| p.errcode == *code).expect("default policy");
                let (until, now) =
                    store.penalise(&acct("a"), &rule, policy, admitted[*n], BEIJING).await.expect("store answered");
                Until(until - now)
            }
            Success(n) => {
                store.succeeded(&acct("a"), &rule, admitted[*n], BEIJING).await.expect("store answered");
                Any
            }
        };
        if *expect != Any {
            assert_eq!(got, *expect, "scenario {} step {i} ({:?})", s.name, expect);
        }
        trace.push((clock.now_us(), got));
    }
    // The room-left figures (RateLimit headers) must agree too.
    for (i, q) in quotas.iter().enumerate() {
        trace.push((i as i64, Quota(*q)));
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
            nodes: Vec::new(),
            resilience: Resilience::strict(),
            batch: true,
        };
        let redis_store = RedisStore::connect(&config)
            .await
            .expect("connect to test redis")
            .with_fixed_clock(Arc::new(clock.clone()));
        let shared = Store::Redis(SharedStore::new(redis_store, Arc::new(clock.clone()), Resilience::strict(), true));
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
    let config = RedisConfig {
        url: redis.url(),
        password: None,
        key_prefix: "wxgate".into(),
        timeout: Duration::from_secs(5),
        nodes: Vec::new(),
        resilience: Resilience::strict(),
        batch: true,
    };
    // Real Redis TIME this time: production mode.
    let store = Store::Redis(SharedStore::new(
        RedisStore::connect(&config).await.expect("connect"),
        Arc::new(wxgate::clock::SystemClock),
        Resilience::strict(),
        true,
    ));
    let (rule, _, _) = compile(r#"[{ count = 10, per = "1m" }, { count = 100, per = "day" }]"#, "");
    let asking = Asking { offset_us: BEIJING, max_wait_us: 0, holder: "h", lease_us: SEC };
    assert!(matches!(store.acquire("wxAPPID", &rule, &asking).await, std::result::Result::Ok(Decision::Admit { .. })));
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

/// The same table on a 3-master Redis Cluster, each scenario's accounts on
/// their own hash slots (spread over the masters).
#[tokio::test]
async fn memory_and_redis_cluster_decide_identically() {
    let cluster = support::redis_server::RedisCluster::start(3);
    let clock = ManualClock::new(T0);
    let mut all = scenarios();
    all.push(random_scenario());
    let mut masters = std::collections::HashSet::new();
    for s in &all {
        let prefix = format!("{}-", s.name);
        masters.insert(cluster.node_of(&format!("{prefix}a")));
        let memory = Store::Memory(MemoryStore::new(Arc::new(clock.clone())));
        let config = RedisConfig {
            url: cluster.urls()[0].clone(),
            password: None,
            key_prefix: "conf".into(),
            timeout: Duration::from_secs(5),
            nodes: cluster.urls(),
            resilience: Resilience::strict(),
            batch: true,
        };
        let redis_store = RedisStore::connect(&config)
            .await
            .expect("connect to test cluster")
            .with_fixed_clock(Arc::new(clock.clone()));
        let shared = Store::Redis(SharedStore::new(redis_store, Arc::new(clock.clone()), Resilience::strict(), true));
        let from_memory = run_as(s, &memory, &clock, &prefix).await;
        let from_cluster = run_as(s, &shared, &clock, &prefix).await;
        assert_eq!(from_memory, from_cluster, "scenario {}: memory and cluster disagree", s.name);
    }
    assert_eq!(masters.len(), 3, "the scenarios' accounts landed on every master");
}

/// Calls that arrive while a decision of their account is in flight are
/// decided together in the next script run (`[store] batch`): the answers
/// are exactly those of deciding them one by one, in arrival order.
#[tokio::test]
async fn calls_decided_in_one_batch_match_one_by_one() {
    let redis = RedisServer::start();
    let clock = ManualClock::new(T0);
    let (rule, _, _) = compile(r#"[{ count = 5, per = "1s", burst = 3 }, { count = 7, per = "day" }]"#, "");
    let asking = Asking { offset_us: BEIJING, max_wait_us: 0, holder: "h", lease_us: SEC };
    let memory = MemoryStore::new(Arc::new(clock.clone()));
    let one_by_one: Vec<Decision> = (0..12).map(|_| memory.acquire("wxAPPID", &rule, &asking)).collect();

    let config = RedisConfig {
        url: redis.url(),
        password: None,
        key_prefix: "batch".into(),
        timeout: Duration::from_secs(5),
        nodes: Vec::new(),
        resilience: Resilience::strict(),
        batch: true,
    };
    let store = RedisStore::connect(&config).await.expect("connect").with_fixed_clock(Arc::new(clock.clone()));
    let store = Arc::new(Store::Redis(SharedStore::new(store, Arc::new(clock.clone()), Resilience::strict(), true)));
    assert!(redis.command("CONFIG RESETSTAT").starts_with("+OK"));
    // On this single-threaded test runtime the tasks start in order: the
    // first runs alone, the eleven others queue behind it and go in one run.
    let tasks: Vec<_> = (0..12)
        .map(|_| {
            let (store, rule) = (store.clone(), rule.clone());
            tokio::spawn(async move {
                let asking = Asking { offset_us: BEIJING, max_wait_us: 0, holder: "h", lease_us: SEC };
                store.acquire("wxAPPID", &rule, &asking).await.expect("decided")
            })
        })
        .collect();
    let mut batched = Vec::new();
    for t in tasks {
        batched.push(t.await.expect("task"));
    }
    assert_eq!(batched, one_by_one);
    let admitted = batched.iter().filter(|d| matches!(d, Decision::Admit { .. })).count();
    assert_eq!(admitted, 3, "the burst, then the rate refuses: {batched:?}");
    let stats = redis.command("INFO commandstats");
    assert!(stats.contains("cmdstat_evalsha:calls=2,"), "12 calls in 2 script runs: {stats}");
    let count = redis.command("HGET batch:{wxAPPID}:r day.n");
    assert!(count.contains("\r\n3\r\n"), "one write per run carries every admission: {count}");
}
