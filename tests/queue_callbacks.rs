//! Callbacks of queued delivery (issue 47, deliverable 7;
//! docs/queued-delivery.md#callbacks) over real sockets: once a job with
//! `X-Wxgate-Callback` ends, wxgate POSTs its result to a receiver (a
//! [`MockWeChat`] recording it), signed with HMAC-SHA256
//! (`X-Wxgate-Signature`), once per end, again later when the receiver
//! does not answer 2xx, and never lost across a restart. On the embedded
//! store, on Redis and on a Redis Cluster, on the gate's manual clock (no
//! test sleeps).

use crate::support;

use std::time::Duration;

use support::callbacks::{key_file_line, receiver, status, verify, Hanging, KEY};
use support::queue::{msgid, queued_with, until_state};
use support::redis_server::{RedisCluster, RedisServer};
use support::temp::TempDir;
use support::tokens::{account_toml, APPID, SECRET};
use support::{caller, eventually_async, rule, ConfigToml, Gate, MockWeChat, Reply, StoreToml, PATIENCE};
use wxgate::features::queue::callbacks::PER_CALLER;

const SEND: &str = "/cgi-bin/message/template/send";

/// The token rule and a template rule that queues, `count` sends a day.
fn rules(count: u64) -> String {
    let token = rule("token").matching("/cgi-bin/token").matching("/cgi-bin/stable_token").limit(2000, "day");
    let send = rule("template_send").matching(SEND).limit(count, "day").set("queue", true);
    format!("{token}\n{send}")
}

/// A mock WeChat issuing tokens and taking every template send (msgid 1000, 1001, ...).
async fn wechat() -> MockWeChat {
    support::queue::wechat(|_, n| msgid(n)).await.0
}

/// The config of a gate whose caller `hr` may name callbacks under
/// `<receiver>/hooks/`; `store`: a `[store]` section (Redis) or "" (the
/// embedded jobs file in `dir`).
fn config(mock: &MockWeChat, dir: &TempDir, hooks: &str, count: u64, store: &str) -> ConfigToml {
    let (file, tokens) = if store.is_empty() {
        (format!("file = \"{}\"\n", dir.path().join("queue.db").display()), String::new())
    } else {
        // Over Redis the token cache needs a token key.
        let key = dir.write_secret("token.key", &"5f0c9a3e7b2d4f6a".repeat(4));
        (String::new(), format!("[tokens]\nkey_file = \"{}\"\n", key.display()))
    };
    let queue = format!("[queue]\n{file}{}backoff = \"1s\"\nbackoff_max = \"4s\"\n", key_file_line(dir));
    let hr = caller("hr").set("callbacks", vec![format!("{hooks}/hooks/")]);
    ConfigToml::new(&mock.url())
        .with(rules(count))
        .with(account_toml(dir, APPID, "official_account", SECRET, ""))
        .with(queue)
        .with(hr)
        .with(store.to_owned())
        .with(tokens)
}

/// A gate on `text`: on the embedded store when `store` is "", else on
/// that Redis (or Cluster) deciding on the gate's manual clock.
async fn start(text: String, store: &str) -> Gate {
    if store.is_empty() {
        Gate::start_text(text).await
    } else {
        Gate::start_redis_on_manual_clock(text).await
    }
}

/// [`start`] from a config file, which the gate watches (and restarts from).
async fn start_file(path: &std::path::Path, store: &str) -> Gate {
    if store.is_empty() {
        Gate::start_file(path).await
    } else {
        Gate::start_redis_file_on_manual_clock(path).await
    }
}

/// Queues a template message of `hr` with a callback to `url`; its id.
async fn queue_one(gate: &Gate, n: usize, url: &str) -> String {
    let body = format!(r#"{{"touser":"secret-recipient-{n}","template_id":"t"}}"#);
    queued_with(gate, "hr", SEND, &body, &[("x-wxgate-callback", url)]).await
}

/// Waits until the receiver got `n` callbacks; they, in order.
async fn callbacks(receiver: &MockWeChat, n: usize) -> Vec<support::Recorded> {
    eventually_async(&format!("{n} callbacks"), PATIENCE, async || receiver.count() >= n).await;
    receiver.calls()
}

fn json(rec: &support::Recorded) -> serde_json::Value {
    serde_json::from_slice(&rec.body).expect("a JSON callback")
}

/// The callback of a sent message arrives once, signed (the HMAC checked
/// here), with its end: state, attempts, WeChat's answer, rule, account,
/// when it ended; never the message's body. A job cancelled while it waits
/// is called back too, `cancelled`.
async fn called_back_once_signed(gate: &Gate, receiver: &MockWeChat) {
    let hooks = receiver.url();
    let id = queue_one(gate, 0, &format!("{hooks}/hooks/order-1")).await;
    let got = callbacks(receiver, 1).await;
    let rec = &got[0];
    assert_eq!((rec.method.as_str(), rec.path_and_query.as_str()), ("POST", "/hooks/order-1"));
    assert_eq!(rec.headers.get("content-type").map(|v| v.to_str().unwrap_or("")), Some("application/json"));
    let t = verify(rec, KEY.as_bytes());
    assert_eq!(t, wxgate::time::Clock::now_us(&gate.clock) / 1_000_000, "t is wxgate's time, in seconds");
    let body = json(rec);
    assert_eq!(body["delivery"], id.as_str(), "{body}");
    assert_eq!(body["state"], "sent", "{body}");
    assert_eq!(body["attempts"], 1, "{body}");
    assert_eq!(body["answer"]["status"], 200, "{body}");
    assert_eq!(body["answer"]["errcode"], 0, "{body}");
    assert_eq!(body["answer"]["body"]["msgid"], 1000, "{body}");
    assert_eq!((body["rule"].as_str(), body["account"].as_str()), (Some("template_send"), Some(APPID)), "{body}");
    assert!(body["ended"].as_str().is_some_and(|e| e.ends_with('Z')), "{body}");
    assert!(body.get("errcode").is_none(), "no envelope errcode to mistake for WeChat's: {body}");
    let text = String::from_utf8_lossy(&rec.body);
    assert!(!text.contains("secret-recipient"), "never the message's body: {text}");
    assert_eq!(rec.headers.get("x-wxgate-delivery").map(|v| v.to_str().unwrap_or("")), Some(id.as_str()));
    // The quota (1 a day) is spent: the next job waits, and is cancelled.
    let waiting = queue_one(gate, 1, &format!("{hooks}/hooks/order-2")).await;
    until_state(gate, "hr", &waiting, "waiting").await;
    let del = gate.delete_with(&format!("/v1/deliveries/{waiting}"), &[("x-wx-caller", "hr")]).await;
    assert_eq!(del.status, 200, "{}", del.text());
    let got = callbacks(receiver, 2).await;
    verify(&got[1], KEY.as_bytes());
    let body = json(&got[1]);
    assert_eq!((body["delivery"].as_str(), body["state"].as_str()), (Some(waiting.as_str()), Some("cancelled")));
    assert_eq!(body["attempts"], 0, "{body}");
    // Delivered (2xx): never posted again, however long wxgate runs.
    gate.advance(Duration::from_secs(3 * 86_400));
    gate.settle().await;
    let third = queue_one(gate, 2, &format!("{hooks}/hooks/order-3")).await;
    let got = callbacks(receiver, 3).await;
    assert_eq!(json(&got[2])["delivery"], third.as_str(), "the next callback is the next job's");
    gate.settle().await;
    assert_eq!(receiver.count(), 3, "each end called back once");
}

#[tokio::test]
async fn a_finished_job_is_called_back_once_signed_with_its_end_state() {
    let mock = wechat().await;
    let receiver = receiver(|_| status(204)).await;
    let dir = TempDir::new("callbacks-once");
    let gate = Gate::start_text(config(&mock, &dir, &receiver.url(), 1, "")).await;
    called_back_once_signed(&gate, &receiver).await;
}

/// Issue 63 item 9 (a hostile review): a receiver that accepts and never
/// answers held up the whole round of callbacks until its post timed out
/// (10 s), so every other caller's callbacks waited with it. Each caller
/// now has its own posts in flight (at most `callbacks::PER_CALLER`), and
/// one at its limit is passed over, not waited for: hr's 40 callbacks to
/// a dead receiver hold at most that many connections, and ops's callback
/// arrives while they still hang (none of them given up yet).
#[tokio::test]
async fn a_dead_receiver_delays_only_its_own_callers_callbacks() {
    let mock = wechat().await;
    let dead = Hanging::start().await;
    let live = receiver(|_| status(200)).await;
    let dir = TempDir::new("callbacks-fair");
    let ops = caller("ops").set("callbacks", vec![format!("{}/hooks/", live.url())]);
    let gate = Gate::start_text(config(&mock, &dir, &dead.url(), 100, "").with(ops)).await;
    for n in 0..40 {
        queue_one(&gate, n, &format!("{}/hooks/order-{n}", dead.url())).await;
    }
    let sent = || mock.calls().iter().filter(|c| c.path_and_query.starts_with(SEND)).count();
    eventually_async("hr's 40 messages sent", PATIENCE, async || sent() >= 40).await;
    eventually_async("hr's callbacks posted", PATIENCE, async || dead.accepted() >= 1).await;
    let url = format!("{}/hooks/ops-1", live.url());
    let body = r#"{"touser":"someone","template_id":"t"}"#;
    let id = queued_with(&gate, "ops", SEND, body, &[("x-wxgate-callback", &url)]).await;
    eventually_async("ops's callback", PATIENCE, async || live.count() >= 1).await;
    assert_eq!(dead.closed(), 0, "ops's callback arrived while every post of hr's still hung");
    assert_eq!(json(&live.calls()[0])["delivery"], id.as_str());
    let most = PER_CALLER;
    eventually_async("hr's posts at its limit", PATIENCE, async || dead.accepted() >= most).await;
    gate.settle().await;
    assert_eq!((dead.accepted(), dead.most_open()), (most, most), "hr's posts in flight: its own limit");
}

/// A callback URL that leaves its prefix once a receiver normalises it
/// (`%2e%2e`, an encoded slash, a backslash) is refused at submission,
/// 400, like a literal `..`: nothing is queued, sent or called back.
#[tokio::test]
async fn a_callback_escaping_its_prefix_by_percent_encoding_is_refused() {
    let mock = wechat().await;
    let receiver = receiver(|_| status(204)).await;
    let dir = TempDir::new("callbacks-escape");
    let gate = Gate::start_text(config(&mock, &dir, &receiver.url(), 10, "")).await;
    let hooks = receiver.url();
    for escape in ["%2e%2e/admin/reset", "%2E%2E/admin/reset", "..%2fadmin/reset", "x%5c..%5cadmin", "../admin/reset"] {
        let body = r#"{"touser":"secret-recipient","template_id":"t"}"#;
        let url = format!("{hooks}/hooks/{escape}");
        let answer = support::queue::submit(&gate, "hr", SEND, body, &[("x-wxgate-callback", &url)]).await;
        assert_eq!(answer.status, 400, "{escape}: {}", answer.text());
        assert!(answer.text().contains("callbacks prefixes"), "{escape}: {}", answer.text());
    }
    // A callback under the prefix still goes through, and is the only one.
    queue_one(&gate, 0, &format!("{hooks}/hooks/order-1")).await;
    let got = callbacks(&receiver, 1).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].path_and_query, "/hooks/order-1");
    assert_eq!(mock.calls().iter().filter(|c| c.path_and_query.starts_with(SEND)).count(), 1, "one message sent");
}

#[tokio::test]
async fn a_finished_job_is_called_back_once_signed_on_redis() {
    let redis = RedisServer::start();
    let mock = wechat().await;
    let receiver = receiver(|_| status(200)).await;
    let dir = TempDir::new("callbacks-redis");
    let store = StoreToml::redis(&redis.url()).set("key_prefix", "cb1").to_string();
    let gate = Gate::start_redis_on_manual_clock(config(&mock, &dir, &receiver.url(), 1, &store)).await;
    called_back_once_signed(&gate, &receiver).await;
}

/// A receiver answering 500, then a redirect, then 200.
async fn refusing_twice() -> MockWeChat {
    receiver(|n| match n {
        0 => status(500),
        1 => Reply::Status { status: 302, body: String::new() },
        _ => status(200),
    })
    .await
}

/// A receiver that answers 500 (or redirects, or is down) gets the callback
/// again after the back-off, until it answers 2xx; then never again.
async fn retried_until_2xx(gate: &Gate, receiver: &MockWeChat) {
    let id = queue_one(gate, 0, &format!("{}/hooks/x", receiver.url())).await;
    let first = callbacks(receiver, 1).await;
    let t1 = verify(&first[0], KEY.as_bytes());
    gate.settle().await;
    assert_eq!(receiver.count(), 1, "not again before the back-off");
    // `[queue] backoff = "1s"`, `backoff_max = "4s"`: each retry within 4 s
    // of the failed post being recorded (the clock is moved on until it came).
    for n in 2..=3 {
        eventually_async(&format!("callback {n}"), PATIENCE, async || {
            gate.advance(Duration::from_secs(5));
            gate.settle().await;
            receiver.count() >= n
        })
        .await;
    }
    let got = receiver.calls();
    let t3 = verify(&got[2], KEY.as_bytes());
    assert!(t3 >= t1 + 10, "each post signed at its own time ({t1}, {t3})");
    for rec in &got {
        let body = json(rec);
        assert_eq!((body["delivery"].as_str(), body["state"].as_str()), (Some(id.as_str()), Some("sent")));
    }
    assert_eq!(got[0].body, got[2].body, "the same result each time");
    gate.advance(Duration::from_secs(600));
    gate.settle().await;
    // A later job's callback arrives after the advance: the loop had its turn.
    queue_one(gate, 1, &format!("{}/hooks/y", receiver.url())).await;
    callbacks(receiver, 4).await;
    gate.settle().await;
    assert_eq!(receiver.count(), 4, "delivered (the third post's 200): not posted again");
}

#[tokio::test]
async fn a_callback_refused_with_500_or_a_redirect_is_posted_again_later_until_2xx() {
    let mock = wechat().await;
    let receiver = refusing_twice().await;
    let dir = TempDir::new("callbacks-retry");
    let gate = Gate::start_text(config(&mock, &dir, &receiver.url(), 10, "")).await;
    retried_until_2xx(&gate, &receiver).await;
}

#[tokio::test]
async fn a_callback_refused_with_500_is_posted_again_later_on_redis() {
    let redis = RedisServer::start();
    let mock = wechat().await;
    let receiver = receiver(|n| if n < 2 { status(500) } else { status(200) }).await;
    let dir = TempDir::new("callbacks-retry-redis");
    let store = StoreToml::redis(&redis.url()).set("key_prefix", "cb2").to_string();
    let gate = Gate::start_redis_on_manual_clock(config(&mock, &dir, &receiver.url(), 10, &store)).await;
    retried_until_2xx(&gate, &receiver).await;
}

/// A receiver that never answers 2xx is tried for `[queue] callback_for`
/// after the job ended, then the callback is given up: never posted again
/// (while other callbacks still go).
#[tokio::test]
async fn a_callback_never_accepted_is_given_up_after_callback_for() {
    given_up_after_callback_for("").await;
}

/// [`a_callback_never_accepted_is_given_up_after_callback_for`] on `store`.
async fn given_up_after_callback_for(store: &str) {
    let mock = wechat().await;
    let receiver = MockWeChat::start().await;
    receiver.respond(|rec| if rec.path_and_query.starts_with("/hooks/down") { status(503) } else { status(200) });
    let dir = TempDir::new("callbacks-give-up");
    let text = config(&mock, &dir, &receiver.url(), 10, store).to_string();
    let gate = start(text.replace("[queue]\n", "[queue]\ncallback_for = \"1m\"\n"), store).await;
    let now = || wxgate::time::Clock::now_us(&gate.clock);
    let down = || receiver.calls().iter().filter(|c| c.path_and_query == "/hooks/down").count();
    queue_one(&gate, 0, &format!("{}/hooks/down", receiver.url())).await;
    callbacks(&receiver, 1).await;
    let ended = now();
    // Tried again and again (each within backoff_max = 4 s) for a minute:
    // the clock moved 2 s per look, so each failed post is recorded first.
    eventually_async("a minute and more", PATIENCE, async || {
        gate.advance(Duration::from_secs(2));
        gate.settle().await;
        now() >= ended + 70_000_000
    })
    .await;
    // A later job's callback, handed out in a later round: by then every
    // post of the first was made, and it is given up.
    let mut tried = 0;
    for (n, path) in ["up-1", "up-2"].into_iter().enumerate() {
        gate.advance(Duration::from_secs(600));
        queue_one(&gate, n + 1, &format!("{}/hooks/{path}", receiver.url())).await;
        eventually_async(path, PATIENCE, async || {
            receiver.calls().iter().any(|c| c.path_and_query == format!("/hooks/{path}"))
        })
        .await;
        if n == 0 {
            tried = down();
        }
    }
    assert!(tried >= 3, "retried within callback_for: {tried}");
    assert_eq!(down(), tried, "given up after callback_for: never posted again");
    let series = |outcome: &str| {
        format!(r#"wxgate_queue_callbacks_total{{rule="template_send",caller="hr",outcome="{outcome}"}}"#)
    };
    assert_eq!(gate.metric(&series("given_up")).await, Some(1.0), "given up once, and counted");
    // Each failed post is counted retried, but one whose next try would
    // come after callback_for, which is the give-up.
    let retried = gate.metric(&series("retried")).await.unwrap_or(0.0);
    assert!(retried == tried as f64 || retried == (tried - 1) as f64, "{retried} of {tried}");
    assert_eq!(gate.metric(&series("delivered")).await, Some(2.0), "up-1 and up-2");
}

/// A reload that takes a prefix away from a caller stops its pending
/// callbacks under it: given up, never posted again (a reload never widens
/// where wxgate posts).
#[tokio::test]
async fn a_pending_callback_under_a_prefix_a_reload_took_away_is_never_posted() {
    never_posted_after_a_reload_took_its_prefix("").await;
}

/// [`a_pending_callback_under_a_prefix_a_reload_took_away_is_never_posted`] on `store`.
async fn never_posted_after_a_reload_took_its_prefix(store: &str) {
    let mock = wechat().await;
    let receiver = MockWeChat::start().await;
    receiver.respond(|_| status(500));
    let dir = TempDir::new("callbacks-reload");
    let text = config(&mock, &dir, &receiver.url(), 10, store).to_string();
    let path = dir.write("wxgate.toml", &text);
    let gate = start_file(&path, store).await;
    queue_one(&gate, 0, &format!("{}/hooks/old", receiver.url())).await;
    callbacks(&receiver, 1).await;
    // hr's prefix is now <receiver>/other/ only; the receiver would take it.
    receiver.respond(|_| status(200));
    let narrowed = text.replace(&format!("{}/hooks/", receiver.url()), &format!("{}/other/", receiver.url()));
    assert_ne!(narrowed, text);
    let aside = dir.write("wxgate.toml.tmp", &narrowed);
    std::fs::rename(&aside, &path).expect("rename over the config");
    eventually_async("the reload", PATIENCE, async || gate.reloads().0 >= 1).await;
    for n in 1..=2 {
        gate.advance(Duration::from_secs(600));
        let url = format!("{}/other/new-{n}", receiver.url());
        queue_one(&gate, n, &url).await;
        eventually_async(&url, PATIENCE, async || {
            receiver.calls().iter().any(|c| c.path_and_query == format!("/other/new-{n}"))
        })
        .await;
    }
    let old = receiver.calls().iter().filter(|c| c.path_and_query == "/hooks/old").count();
    assert_eq!(old, 1, "never posted under the prefix taken away");
}

/// A callback whose receiver is down when the job ends is kept in the jobs
/// store: after a restart it is posted once the receiver is up.
#[tokio::test]
async fn a_pending_callback_survives_a_restart() {
    survives_a_restart("").await;
}

/// [`a_pending_callback_survives_a_restart`] on `store`.
async fn survives_a_restart(store: &str) {
    let mock = wechat().await;
    let down = support::ports::ClosedPort::new();
    let dir = TempDir::new("callbacks-restart");
    let path = dir.write("wxgate.toml", &config(&mock, &dir, &down.url(), 10, store).to_string());
    let gate = start_file(&path, store).await;
    let id = queue_one(&gate, 0, &format!("{}/hooks/z", down.url())).await;
    until_state(&gate, "hr", &id, "sent").await;
    gate.settle().await;
    let gate = gate.restart().await;
    let receiver = down.open();
    eventually_async("the callback after the restart", PATIENCE, async || {
        gate.advance(Duration::from_secs(5));
        gate.settle().await;
        receiver.count() >= 1
    })
    .await;
    let got = receiver.calls();
    verify(&got[0], KEY.as_bytes());
    assert_eq!(
        (json(&got[0])["delivery"].as_str(), json(&got[0])["state"].as_str()),
        (Some(id.as_str()), Some("sent"))
    );
}

/// The scenarios of the embedded store's tests that the two above do not
/// run, on Redis (each its own key prefix).
#[tokio::test]
async fn on_redis_a_callback_is_given_up_after_callback_for_stopped_by_a_reload_and_kept_across_a_restart() {
    let redis = RedisServer::start();
    let store = |prefix: &str| StoreToml::redis(&redis.url()).set("key_prefix", prefix).to_string();
    given_up_after_callback_for(&store("cb3")).await;
    never_posted_after_a_reload_took_its_prefix(&store("cb4")).await;
    survives_a_restart(&store("cb5")).await;
}

/// Every callback scenario on one Redis Cluster (each its own key prefix):
/// signed once, retried until 2xx, given up, stopped by a reload, kept
/// across a restart.
#[tokio::test]
async fn on_a_redis_cluster_callbacks_are_signed_retried_given_up_and_kept_across_a_restart() {
    let cluster = RedisCluster::start(3);
    let store = |prefix: &str| StoreToml::redis_cluster(cluster.urls()).set("key_prefix", prefix).to_string();
    {
        let mock = wechat().await;
        let taking = receiver(|_| status(200)).await;
        let dir = TempDir::new("callbacks-cluster-once");
        let gate = Gate::start_redis_on_manual_clock(config(&mock, &dir, &taking.url(), 1, &store("cc0"))).await;
        called_back_once_signed(&gate, &taking).await;
    }
    {
        let mock = wechat().await;
        let refusing = refusing_twice().await;
        let dir = TempDir::new("callbacks-cluster-retry");
        let gate = Gate::start_redis_on_manual_clock(config(&mock, &dir, &refusing.url(), 10, &store("cc1"))).await;
        retried_until_2xx(&gate, &refusing).await;
    }
    given_up_after_callback_for(&store("cc2")).await;
    never_posted_after_a_reload_took_its_prefix(&store("cc3")).await;
    survives_a_restart(&store("cc4")).await;
}

/// Callbacks are signed, so a caller allowed to name them needs a key: a
/// config without one is refused, saying where to put it.
#[test]
fn a_caller_with_callbacks_and_no_key_or_an_unsafe_key_file_is_a_config_error() {
    let text = format!(
        "{}\n{}",
        ConfigToml::new("http://127.0.0.1:9"),
        caller("hr").set("callbacks", vec!["https://hr.internal/hooks/"])
    );
    let Err(err) = wxgate::config::Config::parse(&text, std::path::Path::new("t.toml")) else {
        panic!("a caller with callbacks and no key is refused")
    };
    let err = err.to_string();
    assert!(err.contains("callback_key_file") && err.contains("WXGATE_CALLBACK_KEY") && err.contains("hr"), "{err}");
    // A key file others may read, or a short key, is refused too.
    let dir = TempDir::new("callbacks-key");
    let open = dir.write("open.key", KEY);
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).expect("chmod 644");
    }
    let short = dir.write_secret("short.key", "abc");
    for (file, says) in [(&open, "chmod 600"), (&short, "shorter than 16 bytes")] {
        let text = format!(
            "{}\n[queue]\nfile = \"off\"\ncallback_key_file = \"{}\"\n",
            ConfigToml::new("http://127.0.0.1:9"),
            file.display()
        );
        let Err(err) = wxgate::config::Config::parse(&text, std::path::Path::new("t.toml")) else {
            panic!("{} is refused", file.display())
        };
        let err = err.to_string();
        assert!(err.contains(says) && err.contains("callback_key_file"), "{err}");
    }
}
