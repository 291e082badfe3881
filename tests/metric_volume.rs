//! How many lines `/metrics` has: wxgate with the shipped `rules.toml` (the
//! Official Account rules, as a sidecar runs them), idle and after calls of
//! one rule, stays within the figures docs/metrics.md states ("How many
//! series"), and keeps what the alerts count. Every sidecar multiplies these
//! lines, so they are bounded per rule, not left to grow.

use crate::support;

use support::*;

const SHIPPED: &str = "rules.toml";

/// Lines of an idle instance that do not depend on the rules (docs/metrics.md):
/// the `# HELP`/`# TYPE` lines of every family, the series without a rule
/// label, the caller `other`'s, `# EOF`. Generous: a new fixed series must
/// not fail this test, a new series per rule must.
const FIXED: usize = 160;

/// Lines per rule of an idle instance (and for `_none`, calls no rule
/// matched): the `wxgate_calls_total` outcomes the alerts and the admin tests
/// count from zero, and the errcodes the alerts count (45009, 45011, 45033).
const PER_IDLE_RULE: usize = 9;

/// Lines a rule adds once it had calls that were answered: its decision and
/// upstream histograms (9 and 10 bounds, `+Inf`, `_sum`, `_count`: 12 and
/// 13 lines), the in-flight gauge, the errcode WeChat answered (`0`).
const PER_ACTIVE_RULE: usize = 27;

/// Lines a rule with a day quota adds once it had calls admitted (and
/// until an hour without): its day-quota forecast gauges (the highest
/// fraction used, the soonest exhaustion, the accounts running out: one
/// series each, never one per account), with their families' heads.
const PER_DAY_QUOTA_RULE: usize = 3 + 3 * FAMILY_HEAD;

/// The `# HELP` and `# TYPE` lines of a family, written once it has a
/// series (the first rule's histograms, in-flight gauge).
const FAMILY_HEAD: usize = 2;

/// The shipped `rules.toml` with its `[server]` listening on free loopback
/// ports (proxy and admin) in front of `upstream`; every rule as shipped.
fn shipped_rules_in_front_of(upstream: &str) -> (String, usize) {
    let text = std::fs::read_to_string(SHIPPED).expect("the shipped rules.toml");
    let mut config: toml::Table = text.parse().expect("rules.toml is TOML");
    let server = config.get_mut("server").and_then(toml::Value::as_table_mut).expect("rules.toml has [server]");
    server.insert("listen".into(), "127.0.0.1:0".into());
    server.insert("admin_listen".into(), "127.0.0.1:0".into());
    server.insert("upstream".into(), upstream.into());
    let rules = config.get("rule").and_then(toml::Value::as_array).map_or(0, Vec::len);
    assert!(rules >= 60, "the shipped rules were read: {rules}");
    (toml::to_string(&config).expect("TOML"), rules)
}

/// `/metrics` of `gate`, and its line count.
async fn metrics_of(gate: &Gate) -> (String, usize) {
    let answer = get_at(gate.admin_addr(), "/metrics").await;
    assert_eq!(answer.status, 200);
    let text = answer.text();
    let lines = text.lines().count();
    (text, lines)
}

#[tokio::test]
async fn an_idle_instance_with_the_shipped_rules_exposes_a_few_lines_per_rule() {
    let mock = MockWeChat::start().await;
    let (config, rules) = shipped_rules_in_front_of(&mock.url());
    let gate = Gate::start_text(config).await;
    let (text, lines) = metrics_of(&gate).await;
    let bound = FIXED + PER_IDLE_RULE * (rules + 1);
    assert!(lines <= bound, "{lines} lines for {rules} rules idle (at most {bound}):\n{text}");
    // What the alerts count is there at zero for every rule, from the start.
    for series in [
        r#"wxgate_upstream_errcodes_total{rule="template_send",errcode="45009"}"#,
        r#"wxgate_upstream_errcodes_total{rule="user_get",errcode="45033"}"#,
        r#"wxgate_calls_total{rule="user_get",outcome="upstream_error"}"#,
        r#"wxgate_calls_total{rule="_none",outcome="unavailable"}"#,
    ] {
        assert_eq!(sample(&text, series), Some(0.0), "{series}");
    }
    // No rule had a call: no histogram has a series yet.
    assert!(!text.contains("wxgate_upstream_seconds_bucket{"), "{text}");
    assert!(!text.contains("wxgate_decision_seconds_bucket{"), "{text}");
}

#[tokio::test]
async fn calls_of_one_rule_add_only_that_rules_histograms_and_the_errcodes_wechat_answered() {
    let mock = MockWeChat::start().await;
    let (config, rules) = shipped_rules_in_front_of(&mock.url());
    let gate = Gate::start_text(config).await;
    let (_, idle) = metrics_of(&gate).await;
    let send = "/cgi-bin/message/template/send?access_token=T";
    for _ in 0..3 {
        assert_eq!(gate.get_as("wx1", send).await.status, 200);
    }
    mock.respond(|_| errcode_reply(40001));
    assert_eq!(gate.get_as("wx1", send).await.status, 200, "a token error is WeChat's answer, passed on");
    let (text, lines) = metrics_of(&gate).await;
    // One more errcode (40001), three families with their first series,
    // and the rule's day-quota forecast.
    let more = PER_ACTIVE_RULE + 1 + 3 * FAMILY_HEAD + PER_DAY_QUOTA_RULE;
    assert!(
        lines <= idle + more,
        "{lines} lines after calls of one rule ({idle} idle, {rules} rules): at most {more} more:\n{text}"
    );
    assert_eq!(sample(&text, r#"wxgate_calls_total{rule="template_send",outcome="forwarded"}"#), Some(4.0));
    assert_eq!(sample(&text, r#"wxgate_upstream_errcodes_total{rule="template_send",errcode="0"}"#), Some(3.0));
    assert_eq!(sample(&text, r#"wxgate_upstream_errcodes_total{rule="template_send",errcode="40001"}"#), Some(1.0));
    assert_eq!(sample(&text, r#"wxgate_upstream_seconds_count{rule="template_send"}"#), Some(4.0));
    assert!(sample(&text, r#"wxgate_quota_day_used_ratio_max{rule="template_send"}"#).is_some(), "{text}");
    assert_eq!(text.matches("wxgate_quota_day_used_ratio_max{").count(), 1, "only the rule that had calls");
    assert_eq!(sample(&text, r#"wxgate_decision_seconds_count{rule="template_send"}"#), Some(4.0));
    assert_eq!(sample(&text, r#"wxgate_upstream_seconds_bucket{le="+Inf",rule="template_send"}"#), Some(4.0));
    // Only the rule that had calls.
    assert_eq!(text.matches("wxgate_upstream_seconds_count{").count(), 1, "{text}");
    assert_eq!(sample(&text, r#"wxgate_upstream_errcodes_total{rule="user_get",errcode="40001"}"#), None);
    assert_eq!(sample(&text, r#"wxgate_upstream_errcodes_total{rule="template_send",errcode="48001"}"#), None);
    assert_eq!(text.matches("wxgate_hold_seconds_count{").count(), 0, "no call was held: {text}");
}

/// Queued delivery on (a jobs file) adds, idle, one line per rule that
/// queues (`wxgate_queue_deadline_seconds`) and the `unknown` ends of
/// recovered jobs at 0, with their families' heads: no series per caller,
/// account or job until a queue has jobs.
#[tokio::test]
async fn queued_delivery_adds_a_line_per_queueing_rule_to_an_idle_instance() {
    let mock = MockWeChat::start().await;
    let (config, rules) = shipped_rules_in_front_of(&mock.url());
    let queueing = {
        let table: toml::Table = config.parse().expect("TOML");
        let all = table.get("rule").and_then(toml::Value::as_array).cloned().unwrap_or_default();
        all.iter().filter(|r| r.get("queue").and_then(toml::Value::as_bool) == Some(true)).count()
    };
    assert!(queueing >= 5, "the shipped message rules queue: {queueing}");
    let dir = TempDir::new("metric-volume-queue");
    let config = format!("{config}\n[queue]\nfile = \"{}\"\n", dir.path().join("queue.db").display());
    let gate = Gate::start_text(config).await;
    let deadlines = "wxgate_queue_deadline_seconds{";
    let mut text = String::new();
    eventually_async("the queue gauges' first summary", PATIENCE, async || {
        text = metrics_of(&gate).await.0;
        text.matches(deadlines).count() == queueing
    })
    .await;
    let lines = text.lines().count();
    let queue_lines = text.lines().filter(|l| l.contains("wxgate_queue_")).count();
    let bound = FIXED + PER_IDLE_RULE * (rules + 1) + queueing + 1 + 2 * FAMILY_HEAD;
    assert!(lines <= bound, "{lines} lines for {rules} rules idle, {queueing} queueing (at most {bound}):\n{text}");
    assert_eq!(queue_lines, queueing + 1 + 2 * FAMILY_HEAD, "{text}");
    assert_eq!(sample(&text, r#"wxgate_queue_deadline_seconds{rule="template_send"}"#), Some(86_400.0));
    assert_eq!(sample(&text, r#"wxgate_queue_ended_total{rule="",caller="",state="unknown"}"#), Some(0.0));
}
