//! Day-quota forecasts (issue 48): after calls at a known rate, `/v1/buckets`
//! shows each pair's fraction used, its rate and when its day quota runs
//! out at that rate (or null: not before the quota day ends); `/metrics`
//! has the per-rule gauges (the highest fraction, the soonest exhaustion,
//! never an account label). Memory, Redis and a Redis Cluster (on the
//! gate's manual clock).

use crate::support;

use std::time::Duration;

use support::redis_server::{RedisCluster, RedisServer};
use support::*;

const SEND: &str = "/cgi-bin/message/custom/send";
const MENU: &str = "/cgi-bin/menu/get";

/// T0 is 10:00 in Beijing: the quota day ends in 14 hours.
const DAY_ENDS_IN_S: f64 = 14.0 * 3600.0;

fn config(mock: &MockWeChat) -> ConfigToml {
    ConfigToml::new(&mock.url())
        .with(rule("send").matching(SEND).limit(1000, "day").limit(100, "1m"))
        .with(rule("menu").matching(MENU).limit(100, "1m"))
}

fn close(got: &serde_json::Value, want: f64, within: f64) -> bool {
    got.as_f64().is_some_and(|g| (g - want).abs() <= within * want)
}

/// wx1 sends one call a second for 10 minutes (600 of its 1,000: the rest
/// lasts 400 s at that rate); wx2 one a minute (its 990 left would last
/// 16.5 h: past the day's end).
async fn calls_at_a_known_rate(gate: &Gate) {
    for s in 0..=600 {
        assert_eq!(gate.get_as("wx1", SEND).await.status, 200, "call {s}");
        if s % 60 == 0 {
            assert_eq!(gate.get_as("wx2", SEND).await.status, 200);
            assert_eq!(gate.get_as("wx2", MENU).await.status, 200);
        }
        gate.advance(Duration::from_secs(1));
    }
}

async fn the_forecast_is_shown_per_pair_and_per_rule(gate: &Gate) {
    calls_at_a_known_rate(gate).await;
    let b = admin(gate.admin_addr(), "GET", "/v1/buckets/wx1/send", None).await.json();
    let f = &b["forecast"];
    assert_eq!((f["day_limit"].as_u64(), f["used"].as_u64()), (Some(1000), Some(601)), "{b}");
    assert!(close(&f["used_fraction"], 0.601, 1e-9), "{f}");
    assert!(close(&f["rate_per_minute"], 60.0, 0.01), "one a second: {f}");
    // 399 left at 1/s, from 1 s after the last call.
    assert!(close(&f["runs_out_in_seconds"], 399.0, 0.01), "{f}");
    let at = f["runs_out_at"].as_str().expect("a time");
    assert!(at.starts_with("2026-11-29T10:16:") && at.ends_with("+08:00"), "local time, like the others: {at}");
    assert_eq!(f["rate_time_constant_seconds"], 300);

    let b = admin(gate.admin_addr(), "GET", "/v1/buckets/wx2/send", None).await.json();
    let f = &b["forecast"];
    assert_eq!(f["used"], 11, "{b}");
    // One a minute, read 1 s after one: 10 % over (an EWMA of single calls
    // 60 s apart, with a 300 s time constant, is highest just after each).
    assert!(close(&f["rate_per_minute"], 1.0, 0.12), "{f}");
    assert!(f["runs_out_at"].is_null() && f["runs_out_in_seconds"].is_null(), "not before the day ends: {f}");
    let b = admin(gate.admin_addr(), "GET", "/v1/buckets/wx2/menu", None).await.json();
    assert!(b["forecast"].is_null(), "no day quota: {b}");
    let b = admin(gate.admin_addr(), "GET", "/v1/buckets/wx3/send", None).await.json();
    assert!(b["forecast"]["rate_per_minute"].is_null() && b["forecast"]["runs_out_at"].is_null(), "{b}");

    // Per rule, over its accounts: wx1 is the highest and the soonest.
    let ratio = gate.metric(r#"wxgate_quota_day_used_ratio_max{rule="send"}"#).await.expect("ratio");
    assert!((ratio - 0.601).abs() < 1e-9, "{ratio}");
    let runs_out = gate.metric(r#"wxgate_quota_day_runs_out_in_seconds_min{rule="send"}"#).await.expect("runs out");
    assert!((runs_out - 399.0).abs() < 4.0, "{runs_out}");
    let ends = gate.metric("wxgate_quota_day_ends_in_seconds").await.expect("ends");
    assert_eq!(ends, DAY_ENDS_IN_S - 601.0);
    assert_eq!(gate.metric(r#"wxgate_quota_day_accounts_running_out{rule="send"}"#).await, Some(1.0));
    assert_eq!(gate.metric(r#"wxgate_quota_day_used_ratio_max{rule="menu"}"#).await, None, "no day quota");
    let text = get_at(gate.admin_addr(), "/metrics").await.text();
    let forecast_lines: Vec<&str> = text.lines().filter(|l| l.starts_with("wxgate_quota_day_")).collect();
    assert!(forecast_lines.iter().all(|l| !l.contains("wx1") && !l.contains("wx2")), "no account: {forecast_lines:?}");

    // Idle for 40 minutes: wx1's rate decays (to e⁻⁸ of it, and the idle
    // time weighs in), so its last 399 no longer run out today.
    gate.advance(Duration::from_secs(2400));
    let b = admin(gate.admin_addr(), "GET", "/v1/buckets/wx1/send", None).await.json();
    assert!(b["forecast"]["runs_out_at"].is_null(), "{b}");
    assert!(b["forecast"]["rate_per_minute"].as_f64().is_some_and(|r| r < 60.0 * (-8f64).exp()), "{b}");
    assert_eq!(gate.metric(r#"wxgate_quota_day_accounts_running_out{rule="send"}"#).await, Some(0.0));
    let runs_out = gate.metric(r#"wxgate_quota_day_runs_out_in_seconds_min{rule="send"}"#).await;
    assert_eq!(runs_out, Some(DAY_ENDS_IN_S - 3001.0), "none before the day's end: capped at it");
    // No admission for an hour: the rule's series go (they come back with its next call).
    gate.advance(Duration::from_secs(3600));
    assert_eq!(gate.metric(r#"wxgate_quota_day_used_ratio_max{rule="send"}"#).await, None);
    assert_eq!(gate.get_as("wx1", SEND).await.status, 200);
    let ratio = gate.metric(r#"wxgate_quota_day_used_ratio_max{rule="send"}"#).await;
    assert_eq!(ratio, Some(0.602), "back at once, already high");
}

#[tokio::test]
async fn buckets_and_metrics_forecast_the_day_quota_at_the_current_rate() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start_text(config(&mock)).await;
    the_forecast_is_shown_per_pair_and_per_rule(&gate).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_the_forecast_reads_the_shared_day_count() {
    let redis = RedisServer::start();
    let mock = MockWeChat::start().await;
    let text = config(&mock).with(StoreToml::redis(&redis.url()).set("key_prefix", "forecast"));
    let gate = Gate::start_redis_on_manual_clock(text).await;
    the_forecast_is_shown_per_pair_and_per_rule(&gate).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_redis_cluster_the_forecast_reads_the_shared_day_count() {
    let cluster = RedisCluster::start(3);
    let mock = MockWeChat::start().await;
    let gate = Gate::start_redis_on_manual_clock(config(&mock).with(StoreToml::redis_cluster(cluster.urls()))).await;
    the_forecast_is_shown_per_pair_and_per_rule(&gate).await;
}

/// Two instances on one Redis: each admission reports the shared day count,
/// so an instance's rate is the account's whole rate (its calls and the
/// other's), and the metrics of either show it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_redis_each_see_the_accounts_whole_rate() {
    let redis = RedisServer::start();
    let mock = MockWeChat::start().await;
    let text = config(&mock).with(StoreToml::redis(&redis.url()).set("key_prefix", "forecast2")).to_string();
    let (a, b) = (Gate::start_redis_on_manual_clock(text.clone()).await, Gate::start_redis_on_manual_clock(text).await);
    // One call a second, on each in turn: each instance decides one every
    // 2 s, and sees the shared count fall by 2 between its own.
    for s in 0..=600 {
        let gate = if s % 2 == 0 { &a } else { &b };
        assert_eq!(gate.get_as("wx1", SEND).await.status, 200, "call {s}");
        a.advance(Duration::from_secs(1));
        b.advance(Duration::from_secs(1));
    }
    for gate in [&a, &b] {
        let f = admin(gate.admin_addr(), "GET", "/v1/buckets/wx1/send", None).await.json()["forecast"].clone();
        assert_eq!(f["used"], 601, "{f}");
        assert!(close(&f["rate_per_minute"], 60.0, 0.01), "the account's whole rate: {f}");
        // 399 left at 1/s.
        assert!(close(&f["runs_out_in_seconds"], 399.0, 0.01), "{f}");
        let runs_out = gate.metric(r#"wxgate_quota_day_runs_out_in_seconds_min{rule="send"}"#).await;
        assert!(runs_out.is_some_and(|s| (s - 399.0).abs() < 4.0), "{runs_out:?}");
    }
}
