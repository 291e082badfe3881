//! A Sentinel-managed Redis (issue 33) with real processes: a master, a
//! replica and three `redis-server --sentinel` on loopback (down-after
//! 500 ms). wxgate finds the master through the sentinels and follows a
//! failover without a restart: the master SIGKILLed mid-traffic, calls go
//! on (by the local fallback while there is no master), and are decided on
//! the promoted replica again within seconds, with no day quota granted twice.

use crate::support;

use std::time::{Duration, Instant};

use support::redis_server::{RedisSentinelSet, SENTINEL_MASTER};
use support::*;

/// The pair state every test here counts in.
const TPL: &str = "wxgate:{default}:tpl";

const SEND: &str = "/cgi-bin/message/template/send?access_token=T";

/// Every call decided on its own (the calls each test counts on the master
/// and the replica, and the fallback's share while there is no master).
const PER_CALL: &str = "quota_leases = false\nquota_reserve = \"0s\"\n";

/// `[store]` for `set`'s sentinels, with these more keys.
fn sentinel_store(set: &RedisSentinelSet, more: &str) -> String {
    let sentinels: Vec<toml::Value> = set.sentinel_urls().into_iter().map(toml::Value::from).collect();
    format!(
        "[store]\nkind = \"redis-sentinel\"\nsentinels = {}\nmaster = \"{SENTINEL_MASTER}\"\n{PER_CALL}{more}\n",
        toml::Value::Array(sentinels)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_is_followed_without_a_restart_and_no_day_quota_is_granted_twice() {
    let mut set = RedisSentinelSet::start();
    let mock = MockWeChat::start().await;
    let sentinels: Vec<toml::Value> = set.sentinel_urls().into_iter().map(toml::Value::from).collect();
    let store = format!(
        "[store]\nkind = \"redis-sentinel\"\nsentinels = {}\nmaster = \"{SENTINEL_MASTER}\"\n{PER_CALL}timeout = \"100ms\"\n\
         breaker_failures = 2\nbreaker_open = \"200ms\"\ninstances = 1\n",
        toml::Value::Array(sentinels)
    );
    let config = ConfigToml::new(&mock.url())
        .with(store)
        .with(rule("tpl").matching("/cgi-bin/message/template/send").limit(20, "day"));
    let gate = Gate::start_real_text(config).await;
    for i in 0..10 {
        assert_eq!(gate.get(SEND).await.status, 200, "call {i}");
    }
    let on_master = set.master.state_field(TPL, "day.n");
    assert_eq!(on_master, Some(10), "decided on the master the sentinels name");
    let killed = Instant::now();
    let promoted = set.kill_master_and_wait_promotion(Duration::from_secs(10));
    // 20 more calls, 100 ms apart, through the failover and after it;
    // noting when the first call was decided on Redis again (not degraded).
    let degraded = r#"wxgate_calls_total{rule="tpl",outcome="degraded"}"#;
    let mut statuses = Vec::new();
    let mut back = None;
    for _ in 0..20 {
        let before = gate.metric(degraded).await.unwrap_or(0.0);
        statuses.push(gate.get(SEND).await.status.as_u16());
        let shared = gate.metric(degraded).await.unwrap_or(0.0) == before
            && gate.metric("wxgate_breaker_open").await == Some(0.0);
        if back.is_none() && shared && killed.elapsed() > promoted {
            back = Some(killed.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let back = back.unwrap_or_else(|| panic!("no call was decided on the new master within 20 calls: {statuses:?}"));
    assert!(back <= Duration::from_secs(8), "decided on the new master {back:?} after the SIGKILL");
    // The new master holds every call WeChat got (what the fallback admitted
    // meanwhile was added when it answered).
    let count = set.replica.state_field(TPL, "day.n");
    assert_eq!(count, Some(mock.count() as i64), "new master {count:?}, mock {}", mock.count());
    eprintln!("sentinels promoted the replica {promoted:?} after the SIGKILL; wxgate decided on it {back:?} after it");
    assert_eq!(mock.count(), 20, "WeChat saw the day quota exactly, never more: {statuses:?}");
    let after = gate.get(SEND).await;
    assert_eq!((after.status.as_u16(), after.header("x-wxgate-reason")), (429, Some("quota")));
    assert_eq!(mock.count(), 20);
}

/// `[store] wait_replicas = 1`: every call that counted against a day quota
/// is on the replica before it goes to WeChat, so a failover right after
/// cannot lose it; with the replica frozen, WAIT gives up at the store's
/// timeout and the call goes on all the same (the decision stands).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_wait_replicas_each_counted_call_is_on_the_replica_before_it_is_forwarded() {
    let set = RedisSentinelSet::start();
    let mock = MockWeChat::start().await;
    let store = sentinel_store(&set, "timeout = \"2s\"\nwait_replicas = 1");
    let config = ConfigToml::new(&mock.url())
        .with(store)
        .with(rule("tpl").matching("/cgi-bin/message/template/send").limit(20, "day"));
    let gate = Gate::start_real_text(config).await;
    for i in 1..=5 {
        assert_eq!(gate.get(SEND).await.status, 200);
        // Checked the moment the answer is back: already on the replica.
        let on_replica = set.replica.state_field(TPL, "day.n");
        assert_eq!(on_replica, Some(i), "call {i}: replica {on_replica:?}");
    }
    set.replica.pause();
    let started = Instant::now();
    let frozen = gate.get(SEND).await;
    let took = started.elapsed();
    set.replica.resume();
    assert_eq!(frozen.status, 200, "the decision stands when WAIT times out: {}", frozen.text());
    assert!(took >= Duration::from_millis(150), "WAIT waited for the frozen replica: {took:?}");
    assert_eq!(mock.count(), 6);
}

/// The replica misses the last writes (replication is asynchronous): the
/// master is killed while the replica is 3 counted calls behind. The
/// sentinels promote the replica with those calls missing; wxgate sees
/// another server process there (the epoch follows Redis's run_id), tops up
/// what it admitted that the new master does not count, and WeChat still
/// sees the day quota of 20 exactly, never 23.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_to_a_replica_that_missed_the_last_writes_grants_no_day_quota_twice() {
    let mut set = RedisSentinelSet::start_lagging();
    let mock = MockWeChat::start().await;
    let store =
        sentinel_store(&set, "timeout = \"100ms\"\nbreaker_failures = 2\nbreaker_open = \"200ms\"\ninstances = 1");
    let config = ConfigToml::new(&mock.url())
        .with(store)
        .with(rule("tpl").matching("/cgi-bin/message/template/send").limit(20, "day"));
    let gate = Gate::start_real_text(config).await;
    for i in 0..10 {
        assert_eq!(gate.get(SEND).await.status, 200, "call {i}");
    }
    let replicated = Instant::now();
    while set.replica.state_field(TPL, "day.n") != Some(10) {
        assert!(replicated.elapsed() < Duration::from_secs(10), "the replica never got the first 10 calls");
        std::thread::sleep(Duration::from_millis(10));
    }
    let link = set.link.as_ref().expect("a lagging set has a link");
    link.hold();
    for i in 10..13 {
        assert_eq!(gate.get(SEND).await.status, 200, "call {i}");
    }
    assert_eq!(set.master.state_field(TPL, "day.n"), Some(13), "master");
    assert!(link.held_bytes.load(std::sync::atomic::Ordering::Relaxed) > 0, "the master's stream was held");
    assert_eq!(set.replica.state_field(TPL, "day.n"), Some(10), "replica behind");
    set.kill_master_and_wait_promotion(Duration::from_secs(10));
    let mut statuses = Vec::new();
    for _ in 0..20 {
        statuses.push(gate.get(SEND).await.status.as_u16());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(mock.count(), 20, "WeChat saw the day quota exactly, not the 3 lost calls again: {statuses:?}");
    let on_new = set.replica.state_field(TPL, "day.n");
    assert_eq!(on_new, Some(20), "the new master counts every call WeChat got");
    assert_eq!(gate.metric("wxgate_store_lost_total").await, Some(1.0), "one top-up round");
    let after = gate.get(SEND).await;
    assert_eq!((after.status.as_u16(), after.header("x-wxgate-reason")), (429, Some("quota")));
}
