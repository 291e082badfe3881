//! Queued delivery's metrics (issue 47, docs/metrics.md "Queued delivery")
//! over real sockets: jobs queued, refused, sent, failed, cut off and
//! cancelled show in `/metrics` of the admin listener by rule and caller,
//! never by job, account or recipient; the gauges follow the jobs store's
//! summary every 15 s of wxgate's clock.

use crate::support;

use std::time::Duration;

use support::queue::{gate, msgid, queued, submit, until_state, wechat};
use support::tokens::{account_toml, APPID, SECRET};
use support::{caller, errcode_reply, eventually_async, get_at, rule, sample, Gate, Reply, TempDir, PATIENCE};

const TEMPLATE: &str = "/cgi-bin/message/template/send";
const SUBSCRIBE: &str = "/cgi-bin/message/subscribe/send";

/// The token rule; template sends, one a minute, queued with the default
/// deadline; subscribe messages, 100 a day, queued with a 1 h deadline.
fn rules() -> String {
    let token = rule("token").matching("/cgi-bin/token").matching("/cgi-bin/stable_token").limit(2000, "day");
    let template = rule("template_send").matching(TEMPLATE).limit_burst(1, "1m", 1).set("queue", true);
    let subscribe =
        rule("subscribe_send").matching(SUBSCRIBE).limit(100, "day").set("queue", true).set("queue_deadline", "1h");
    format!("{token}\n{template}\n{subscribe}")
}

async fn metrics(gate: &Gate) -> String {
    let a = get_at(gate.admin_addr(), "/metrics").await;
    assert_eq!(a.status, 200);
    a.text()
}

/// `wxgate_queue_<name>{rule,caller[,state|reason]}`.
fn queue_series(name: &str, rule: &str, caller: &str, last: Option<(&str, &str)>) -> String {
    let last = last.map_or_else(String::new, |(k, v)| format!(",{k}=\"{v}\""));
    format!("wxgate_queue_{name}{{rule=\"{rule}\",caller=\"{caller}\"{last}}}")
}

fn jobs(rule: &str, caller: &str, state: &str) -> String {
    queue_series("jobs", rule, caller, Some(("state", state)))
}

fn ended(rule: &str, caller: &str, state: &str) -> String {
    queue_series("ended_total", rule, caller, Some(("state", state)))
}

#[tokio::test]
async fn queued_jobs_show_by_rule_and_caller_from_submission_to_their_end() {
    let (mock, _tokens) = wechat(|rec, n| {
        let body = String::from_utf8_lossy(&rec.body);
        if body.contains("wrong") {
            errcode_reply(40003)
        } else if body.contains("cut") {
            Reply::DropMidBody
        } else {
            msgid(n)
        }
    })
    .await;
    let dir = TempDir::new("queue-metrics");
    let callers = format!("{}\n{}", caller("hr"), caller("marketing"));
    let gate = gate(&mock, &dir, &rules(), "caller_jobs = 2", &callers).await;

    // hr: the first template message goes at once, the second waits for
    // the next minute, a third queues behind it; a fourth is past hr's
    // caller_jobs (429 queue_full) and one with a malformed deadline is 400.
    let first = queued(&gate, "hr", TEMPLATE, r#"{"touser":"o1"}"#).await;
    let second = queued(&gate, "hr", TEMPLATE, r#"{"touser":"o2"}"#).await;
    until_state(&gate, "hr", &first, "sent").await;
    until_state(&gate, "hr", &second, "waiting").await;
    let third = queued(&gate, "hr", TEMPLATE, r#"{"touser":"o3"}"#).await;
    let full = submit(&gate, "hr", TEMPLATE, r#"{"touser":"o4"}"#, &[]).await;
    assert_eq!((full.status.as_u16(), full.header("x-wxgate-reason")), (429, Some("queue_full")), "{}", full.text());
    let bad = submit(&gate, "hr", TEMPLATE, "{}", &[("x-wxgate-deadline", "soon")]).await;
    assert_eq!(bad.status, 400, "{}", bad.text());
    // marketing: a wrong message fails at once; one whose answer is cut
    // off may have reached WeChat: unknown.
    let wrong = queued(&gate, "marketing", SUBSCRIBE, r#"{"wrong":1}"#).await;
    until_state(&gate, "marketing", &wrong, "failed").await;
    let cut = queued(&gate, "marketing", SUBSCRIBE, r#"{"cut":1}"#).await;
    until_state(&gate, "marketing", &cut, "unknown").await;

    let text = metrics(&gate).await;
    let at = |series: &str| sample(&text, series);
    assert_eq!(at(&queue_series("submitted_total", "template_send", "hr", None)), Some(3.0), "{text}");
    assert_eq!(at(&queue_series("submitted_total", "subscribe_send", "marketing", None)), Some(2.0));
    let refused = |reason| queue_series("refused_total", "template_send", "hr", Some(("reason", reason)));
    assert_eq!(at(&refused("queue_full")), Some(1.0));
    assert_eq!(at(&refused("bad_request")), Some(1.0));
    assert_eq!(at(&ended("template_send", "hr", "sent")), Some(1.0));
    assert_eq!(at(&ended("template_send", "hr", "unknown")), Some(0.0), "what the alert counts, from 0");
    assert_eq!(at(&ended("subscribe_send", "marketing", "failed")), Some(1.0));
    assert_eq!(at(&ended("subscribe_send", "marketing", "unknown")), Some(1.0));
    assert_eq!(at(r#"wxgate_queue_ended_total{rule="",caller="",state="unknown"}"#), Some(0.0), "recovered: none");
    assert_eq!(at(r#"wxgate_queue_delay_seconds_count{rule="template_send"}"#), Some(1.0));
    assert_eq!(at(r#"wxgate_queue_delay_seconds_count{rule="subscribe_send"}"#), None, "none sent");
    // The gauges come from the jobs store's summary, read every 15 s of
    // wxgate's clock (the first at start).
    assert_eq!(at(r#"wxgate_queue_deadline_seconds{rule="subscribe_send"}"#), Some(3600.0));
    assert_eq!(at(r#"wxgate_queue_deadline_seconds{rule="template_send"}"#), Some(86_400.0));

    gate.advance(Duration::from_secs(15));
    let mut text = String::new();
    eventually_async("the gauges of the next summary", PATIENCE, async || {
        text = metrics(&gate).await;
        sample(&text, &queue_series("oldest_seconds", "template_send", "hr", None)) == Some(15.0)
    })
    .await;
    let at = |series: &str| sample(&text, series);
    assert_eq!(at(&jobs("template_send", "hr", "waiting")), Some(1.0), "the second: {text}");
    assert_eq!(at(&jobs("template_send", "hr", "queued")), Some(1.0), "the third, behind the second");
    assert_eq!(at(&jobs("template_send", "hr", "sending")), Some(0.0));
    for state in ["queued", "waiting", "sending"] {
        assert_eq!(at(&jobs("subscribe_send", "marketing", state)), Some(0.0), "all ended: {state}");
    }
    assert_eq!(at(&queue_series("oldest_seconds", "subscribe_send", "marketing", None)), Some(0.0));

    // The next minute: the second is sent, 60 s after it was queued; the
    // third is cancelled while it waits.
    gate.advance(Duration::from_secs(45));
    until_state(&gate, "hr", &second, "sent").await;
    until_state(&gate, "hr", &third, "waiting").await;
    let cancel = support::send(
        http::Request::delete(gate.url(&format!("/v1/deliveries/{third}")))
            .header("x-wx-caller", "hr")
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .expect("request"),
    )
    .await;
    assert_eq!(cancel.status, 200, "{}", cancel.text());
    gate.advance(Duration::from_secs(15));
    let mut text = String::new();
    eventually_async("no unfinished job left", PATIENCE, async || {
        text = metrics(&gate).await;
        sample(&text, &jobs("template_send", "hr", "waiting")) == Some(0.0)
            && sample(&text, &jobs("template_send", "hr", "queued")) == Some(0.0)
    })
    .await;
    let at = |series: &str| sample(&text, series);
    assert_eq!(at(&queue_series("oldest_seconds", "template_send", "hr", None)), Some(0.0), "{text}");
    assert_eq!(at(&ended("template_send", "hr", "sent")), Some(2.0));
    assert_eq!(at(&ended("template_send", "hr", "cancelled")), Some(1.0));
    assert_eq!(at(r#"wxgate_queue_delay_seconds_count{rule="template_send"}"#), Some(2.0));
    assert_eq!(at(r#"wxgate_queue_delay_seconds_bucket{le="1.0",rule="template_send"}"#), Some(1.0), "at once");
    assert_eq!(at(r#"wxgate_queue_delay_seconds_bucket{le="10.0",rule="template_send"}"#), Some(1.0));
    assert_eq!(at(r#"wxgate_queue_delay_seconds_bucket{le="300.0",rule="template_send"}"#), Some(2.0), "a minute");

    // Labels name rules, callers, states and reasons only: never a job,
    // an account or a recipient.
    let queue_lines: Vec<&str> = text.lines().filter(|l| l.starts_with("wxgate_queue_")).collect();
    assert!(queue_lines.len() > 20, "{text}");
    for line in queue_lines {
        for secret in [APPID, &first, &second, &third, &wrong, &cut, "o1", "o2"] {
            assert!(!line.contains(secret), "{secret} in {line}");
        }
    }
}

/// On Redis the gauges come from the jobs in Redis (every account's
/// script), the counters from what this instance did.
#[tokio::test]
async fn queued_jobs_show_from_the_jobs_in_redis() {
    let redis = support::redis_server::RedisServer::start();
    let (mock, _tokens) = wechat(|_, n| msgid(n)).await;
    let dir = TempDir::new("queue-metrics-redis");
    let key = dir.write_secret("token.key", "5f0c9a3e7b2d4f6a8c1e3b5d7f9a0c2e4b6d8f1a3c5e7b9d0f2a4c6e8b1d3f5a\n");
    let config = support::ConfigToml::new(&mock.url())
        .with(support::StoreToml::redis(&redis.url()).set("key_prefix", "qm"))
        .with(format!("[tokens]\nkey_file = \"{}\"\n", key.display()))
        .with(rules())
        .with(account_toml(&dir, APPID, "official_account", SECRET, ""))
        .with(caller("hr").to_string());
    let gate = Gate::start_redis_on_manual_clock(config).await;
    let first = queued(&gate, "hr", TEMPLATE, r#"{"touser":"o1"}"#).await;
    let second = queued(&gate, "hr", TEMPLATE, r#"{"touser":"o2"}"#).await;
    until_state(&gate, "hr", &first, "sent").await;
    until_state(&gate, "hr", &second, "waiting").await;
    gate.advance(Duration::from_secs(15));
    let mut text = String::new();
    eventually_async("the gauges from Redis", PATIENCE, async || {
        text = metrics(&gate).await;
        sample(&text, &queue_series("oldest_seconds", "template_send", "hr", None)) == Some(15.0)
    })
    .await;
    let at = |series: &str| sample(&text, series);
    assert_eq!(at(&jobs("template_send", "hr", "waiting")), Some(1.0), "{text}");
    assert_eq!(at(&jobs("template_send", "hr", "queued")), Some(0.0));
    assert_eq!(at(&queue_series("submitted_total", "template_send", "hr", None)), Some(2.0));
    assert_eq!(at(&ended("template_send", "hr", "sent")), Some(1.0));
    assert_eq!(at(r#"wxgate_queue_delay_seconds_count{rule="template_send"}"#), Some(1.0));
}
