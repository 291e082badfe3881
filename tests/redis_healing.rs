//! Redis refusing wxgate for reasons other than being down: a password
//! changed for a moment, a full memory (`-OOM` with `noeviction`), a read-only
//! replica after a failover, wxgate's connections killed. Every call keeps
//! getting an answer (the local fallback), the breaker does not flap while
//! Redis answers PING but refuses writes, and once Redis is healthy again
//! every serving thread of a real wxgate process (`workers = 2`, each with
//! its own Redis connection) decides through Redis by itself, within a few
//! `breaker_open` periods.

use crate::support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use support::process::{self, Instance};
use support::redis_server::RedisServer;
use support::*;

/// The password Redis expects, and the one it is changed to for a moment.
const GOOD: &str = "pw-good-7f3a";
const OTHER: &str = "pw-other-91c2";

const BREAKER_OPEN: Duration = Duration::from_millis(300);
const PATH: &str = "/cgi-bin/message/custom/send?access_token=T";
/// Calls per round, all at once, each on its own connection: enough that
/// both serving threads take some.
const ROUND: usize = 16;
/// How long Redis keeps refusing writes while calls go on: the episode is the
/// scenario (several `breaker_open` periods, in which a flapping breaker would
/// open again and again), not a wait for something to happen.
const EPISODE: Duration = Duration::from_millis(2000);

/// One wxgate process on two serving threads, Redis at `redis` (password
/// from `WXGATE_REDIS_PASSWORD` when given), the local fallback, a quick
/// breaker, and a day quota no test reaches.
fn start(mock: &MockWeChat, redis: &RedisServer, tag: &str, password: Option<&str>) -> Instance {
    start_with_breaker(mock, redis, tag, password, 3)
}

/// [`start`], the breaker opening after `failures` failures in a row.
fn start_with_breaker(
    mock: &MockWeChat,
    redis: &RedisServer,
    tag: &str,
    password: Option<&str>,
    failures: i64,
) -> Instance {
    // Each serving thread's own decisions on Redis, and the fallback's
    // share: the per-call path.
    let store = StoreToml::redis(&redis.url())
        .per_call()
        .set("timeout", "1s")
        .set("fallback", "local")
        .set("instances", 2)
        .set("breaker_failures", failures)
        .set("breaker_open", format!("{}ms", BREAKER_OPEN.as_millis()));
    let config = ConfigToml::new(&mock.url())
        .server("workers", 2)
        .with(store)
        .with(rule("send").matching("/cgi-bin/message/custom/send").limit(1_000_000, "day"))
        .to_string();
    let env: Vec<(&str, &str)> = password.map(|p| ("WXGATE_REDIS_PASSWORD", p)).into_iter().collect();
    process::spawn(&config, tag, &env).expect("wxgate serving")
}

/// Calls decided in Redis today for the rule (its day count).
fn redis_count(redis: &RedisServer, password: Option<&str>) -> i64 {
    redis.state_as(password, "wxgate:{default}:send").get("day.n").copied().unwrap_or(0)
}

async fn metric(gate: &Instance, name: &str) -> f64 {
    gate.metric(name).await.unwrap_or(0.0)
}

async fn degraded(gate: &Instance) -> f64 {
    metric(gate, "wxgate_degraded_decisions_total").await
}

async fn breaker_openings(gate: &Instance) -> f64 {
    metric(gate, "wxgate_store_breaker_opened_total").await
}

/// What `/readyz` says decisions are made by ("shared (Redis reachable)", "fallback local ...").
async fn decisions(gate: &Instance) -> String {
    gate.admin_get("/readyz").await.json()["decisions"].as_str().unwrap_or_default().to_owned()
}

/// [`ROUND`] calls at once, each on a new connection; every one must be
/// answered 200 (the quota is never reached, by Redis or the fallback).
async fn round(addr: SocketAddr) {
    let calls: Vec<_> = (0..ROUND).map(|_| tokio::spawn(get_at(addr, PATH))).collect();
    for c in calls {
        let a = c.await.expect("call");
        assert_eq!(a.status, 200, "every call is answered by Redis or the fallback: {}", a.text());
    }
}

/// Whether one round was decided entirely in Redis: no degraded decision, and
/// Redis counted every call.
async fn shared_round(gate: &Instance, redis: &RedisServer, password: Option<&str>) -> bool {
    let (before, count) = (degraded(gate).await, redis_count(redis, password));
    round(gate.addr).await;
    degraded(gate).await == before && redis_count(redis, password) == count + ROUND as i64
}

/// Waits until this instance decides through Redis on every serving thread:
/// `/readyz` says shared, three rounds in a row are decided in Redis, and
/// both threads' own connections have run acquire.lua. Returns how long it
/// took until the first of those rounds started.
async fn until_shared_everywhere(gate: &Instance, redis: &RedisServer, password: Option<&str>) -> Duration {
    let started = Instant::now();
    let mut streak: Option<(Duration, u32)> = None;
    eventually_async("every serving thread deciding through Redis", PATIENCE, async || {
        let at = started.elapsed();
        streak = match (shared_round(gate, redis, password).await, streak) {
            (true, Some((since, n))) => Some((since, n + 1)),
            (true, None) => Some((at, 1)),
            (false, _) => None,
        };
        streak.is_some_and(|(_, n)| n >= 3)
            && decisions(gate).await.starts_with("shared")
            && redis.clients_last_running(password, "evalsha") >= 2
    })
    .await;
    streak.map_or(started.elapsed(), |(since, _)| since)
}

/// Calls go on for [`EPISODE`] while Redis refuses; all are answered by the
/// fallback. Returns how many times the breaker opened meanwhile.
async fn calls_while_refused(gate: &Instance) -> f64 {
    let (opened, before) = (breaker_openings(gate).await, degraded(gate).await);
    let started = Instant::now();
    while started.elapsed() < EPISODE {
        round(gate.addr).await;
    }
    assert!(degraded(gate).await > before, "calls were decided by the fallback");
    assert!(decisions(gate).await.starts_with("fallback local"), "/readyz says the fallback decides");
    breaker_openings(gate).await - opened
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_changed_for_a_moment_heals_on_every_serving_thread() {
    let redis = RedisServer::start_with(&["--requirepass", GOOD]);
    let mock = MockWeChat::start().await;
    let gate = start(&mock, &redis, "requirepass", Some(GOOD));
    until_shared_everywhere(&gate, &redis, Some(GOOD)).await;

    // The password changes; wxgate's connections are cut, and every
    // reconnect now fails authentication.
    redis.run_as(Some(GOOD), &["CONFIG", "SET", "requirepass", OTHER]);
    redis.run_as(Some(OTHER), &["CLIENT", "KILL", "TYPE", "normal"]);
    calls_while_refused(&gate).await;

    redis.run_as(Some(OTHER), &["CONFIG", "SET", "requirepass", GOOD]);
    let took = until_shared_everywhere(&gate, &redis, Some(GOOD)).await;
    // Every serving thread got a fresh connection when the probe succeeded:
    // none failed again and reopened the breaker.
    assert_eq!(breaker_openings(&gate).await, 1.0, "the breaker opened once");
    eprintln!("requirepass flip: every serving thread decided in Redis {took:?} after the password was restored");
    let log = gate.stop().await;
    assert!(!log.contains(GOOD) && !log.contains(OTHER), "a password is never logged");
}

/// The same flip with a breaker that never opens: no probe runs, so each
/// serving thread has to replace its own connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serving_thread_heals_its_own_connection_while_the_breaker_stays_closed() {
    let redis = RedisServer::start_with(&["--requirepass", GOOD]);
    let mock = MockWeChat::start().await;
    let gate = start_with_breaker(&mock, &redis, "own-lane", Some(GOOD), 1_000_000);
    until_shared_everywhere(&gate, &redis, Some(GOOD)).await;

    redis.run_as(Some(GOOD), &["CONFIG", "SET", "requirepass", OTHER]);
    redis.run_as(Some(OTHER), &["CLIENT", "KILL", "TYPE", "normal"]);
    let before = degraded(&gate).await;
    eventually_async("calls decided by the fallback", PATIENCE, async || {
        round(gate.addr).await;
        degraded(&gate).await > before
    })
    .await;

    redis.run_as(Some(OTHER), &["CONFIG", "SET", "requirepass", GOOD]);
    let took = until_shared_everywhere(&gate, &redis, Some(GOOD)).await;
    assert_eq!(breaker_openings(&gate).await, 0.0, "the breaker never opened");
    eprintln!("requirepass flip, breaker closed: every serving thread decided in Redis {took:?} after the password was restored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_memory_falls_back_without_flapping_and_heals() {
    let redis = RedisServer::start();
    let mock = MockWeChat::start().await;
    let gate = start(&mock, &redis, "oom", None);
    until_shared_everywhere(&gate, &redis, None).await;

    // Every write is refused with -OOM; PING still answers.
    redis.run_as(None, &["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    redis.run_as(None, &["CONFIG", "SET", "maxmemory", "1"]);
    let refused = redis.query_as(None, &["SET", "wxgate-test:junk", "1"]);
    assert!(refused.is_err_and(|e| e.code() == Some("OOM")), "Redis refuses writes");
    let opened = calls_while_refused(&gate).await;
    assert!(redis.ping(), "Redis answered PING all along");
    assert_eq!(opened, 1.0, "the breaker opened once and stayed open while writes were refused");

    redis.run_as(None, &["CONFIG", "SET", "maxmemory", "0"]);
    let took = until_shared_everywhere(&gate, &redis, None).await;
    eprintln!("OOM: breaker opened {opened} time(s); every serving thread decided in Redis {took:?} after maxmemory 0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_replica_falls_back_without_flapping_and_heals() {
    let redis = RedisServer::start();
    let other = RedisServer::start();
    let mock = MockWeChat::start().await;
    let gate = start(&mock, &redis, "readonly", None);
    until_shared_everywhere(&gate, &redis, None).await;

    // wxgate's Redis becomes a replica (as an old master after a failover):
    // scripts that write fail with READONLY.
    redis.run_as(None, &["REPLICAOF", "127.0.0.1", &other.port.to_string()]);
    eventually("the replica refusing writes", PATIENCE, || {
        redis.query_as(None, &["SET", "wxgate-test:junk", "1"]).is_err_and(|e| e.code() == Some("READONLY"))
    })
    .await;
    let opened = calls_while_refused(&gate).await;
    assert_eq!(opened, 1.0, "the breaker opened once and stayed open while writes were refused");

    redis.run_as(None, &["REPLICAOF", "NO", "ONE"]);
    let took = until_shared_everywhere(&gate, &redis, None).await;
    eprintln!(
        "READONLY: breaker opened {opened} time(s); every serving thread decided in Redis {took:?} after REPLICAOF NO ONE"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_connections_are_replaced() {
    let redis = RedisServer::start();
    let mock = MockWeChat::start().await;
    let gate = start(&mock, &redis, "killed", None);
    until_shared_everywhere(&gate, &redis, None).await;
    let before = degraded(&gate).await;

    redis.run_as(None, &["CLIENT", "KILL", "TYPE", "normal"]);
    let took = until_shared_everywhere(&gate, &redis, None).await;
    let lost = degraded(&gate).await - before;
    eprintln!(
        "CLIENT KILL: every serving thread decided in Redis {took:?} after; {lost} call(s) by the fallback meanwhile"
    );
}

/// One account's state key holds the wrong type (an operator's `SET`, a
/// key collision): Redis answers WRONGTYPE for that account's calls only.
/// Those are decided by the fallback; the breaker stays closed, and every
/// other account's calls are still decided on Redis.
#[tokio::test]
async fn one_bad_key_fails_its_own_calls_and_never_opens_the_breaker() {
    let redis = RedisServer::start();
    let mock = MockWeChat::start().await;
    let config = format!(
        "{}\n{}",
        StoreToml::redis(&redis.url()).per_call(),
        rule("send").matching("/cgi-bin/message/custom/send").limit(100, "day")
    );
    let gate = Gate::start_real(&mock, config).await;
    assert_eq!(gate.get_as("wxBAD", PATH).await.status, 200, "the state key exists now");
    break_keys_of(&redis, "wxBAD");
    for _ in 0..5 {
        assert_eq!(gate.get_as("wxBAD", PATH).await.status, 200, "decided by the fallback");
    }
    let degraded = gate.metric("wxgate_degraded_decisions_total").await.unwrap_or(0.0);
    assert_eq!(degraded, 5.0, "each of the bad account's calls went to the fallback");
    for _ in 0..5 {
        assert_eq!(gate.get_as("wxGOOD", PATH).await.status, 200);
    }
    assert_eq!(gate.metric("wxgate_degraded_decisions_total").await, Some(5.0), "wxGOOD was decided on Redis");
    assert_eq!(gate.metric("wxgate_breaker_open").await, Some(0.0));
    assert_eq!(gate.metric("wxgate_store_breaker_opened_total").await, Some(0.0));
    let b = get_at(gate.admin_addr(), "/v1/buckets/wxGOOD/send").await.json();
    assert_eq!(b["limits"][0]["used"], 5, "counted in Redis: {b}");
}

/// Every Redis key of `account` replaced by a string: its pairs' scripts
/// then fail with WRONGTYPE.
fn break_keys_of(redis: &RedisServer, account: &str) {
    let keys = match redis.run_as(None, &["KEYS", &format!("*{{{account}}}*")]) {
        redis::Value::Array(keys) => keys,
        other => panic!("KEYS: {other:?}"),
    };
    for key in keys {
        let redis::Value::BulkString(key) = key else { continue };
        let key = String::from_utf8_lossy(&key).into_owned();
        redis.run_as(None, &["DEL", &key]);
        redis.run_as(None, &["SET", &key, "not a hash"]);
    }
}

/// The log says what happened when one pair's key holds the wrong type:
/// that pair's calls are decided by the fallback, Redis is not
/// unavailable (it said "Redis unavailable: deciding without it").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_bad_key_is_logged_as_that_pairs_key_not_as_redis_unavailable() {
    let redis = RedisServer::start();
    let mock = MockWeChat::start().await;
    let gate = start(&mock, &redis, "bad-key-log", None);
    assert_eq!(gate.get_as("wxBAD", PATH).await.status, 200, "the state key exists now");
    break_keys_of(&redis, "wxBAD");
    assert_eq!(gate.get_as("wxBAD", PATH).await.status, 200, "decided by the fallback");
    let said = "one pair's Redis key has the wrong type";
    eventually("the fallback decision logged", PATIENCE, || gate.logged().contains(said)).await;
    let log = gate.logged();
    let line = log.lines().find(|l| l.contains(said)).expect("the line");
    assert!(line.contains("account=wxBAD") && line.contains("rule=send"), "{line}");
    assert!(!log.contains("Redis unavailable"), "{log}");
    assert_eq!(metric(&gate, "wxgate_store_breaker_opened_total").await, 0.0);
}
