//! Queued delivery (issue 47, docs/queued-delivery.md) over real sockets:
//! a call with `Prefer: respond-async` is stored and answered 202, then
//! sent by the dispatcher through the same phases as a live call (the
//! account's token added by the broker, the rule's limits and penalties),
//! once; its result is read back from `/v1/deliveries/<id>`.

use crate::support;

use std::time::Duration;

use support::queue::{gate, msgid, queued, queued_at, queued_with, slow_wechat, submit, until_state, wechat, ASYNC};
use support::temp::TempDir;
use support::tokens::{account_toml, APPID, SECRET};
use support::{caller, eventually_async, eventually_some, rule, ConfigToml, Gate, MockWeChat, Reply, PATIENCE};

const SEND: &str = "/cgi-bin/message/template/send";

/// The token rule and a template rule that queues (`queue = true`), with
/// `count` calls `per`.
fn rules(count: u64, per: &str) -> String {
    let token = rule("token").matching("/cgi-bin/token").matching("/cgi-bin/stable_token").limit(2000, "day");
    let send = rule("template_send").matching(SEND);
    let send = if per == "day" { send.limit(count, per) } else { send.limit_burst(count, per, count) };
    let send = send.set("queue", true);
    format!("{token}\n{send}")
}

#[tokio::test]
async fn a_queued_message_is_answered_202_and_sent_once_with_the_accounts_token() {
    let (mock, tokens) = wechat(|_, n| msgid(n)).await;
    let dir = TempDir::new("queue-basic");
    let callers = format!("{}\n{}", caller("hr"), caller("marketing"));
    let gate = gate(&mock, &dir, &rules(100, "day"), "", &callers).await;
    let body = r#"{"touser":"o1","template_id":"t","data":{}}"#;
    let a = submit(&gate, "hr", &format!("{SEND}?access_token=CALLERS_OWN"), body, &[]).await;
    assert_eq!(a.status, 202, "{}", a.text());
    let json = a.json();
    assert_eq!((json["errcode"].as_i64(), json["errmsg"].as_str()), (Some(0), Some("queued")), "{json}");
    let id = json["delivery"].as_str().expect("an id").to_owned();
    assert_eq!(a.header("location"), Some(format!("/v1/deliveries/{id}").as_str()));
    assert_eq!(a.header("preference-applied"), Some("respond-async"));
    let done = until_state(&gate, "hr", &id, "sent").await;
    assert_eq!(done["answer"]["body"]["msgid"], 1000, "{done}");
    assert_eq!(done["attempts"], 1, "{done}");
    let sent: Vec<_> = mock.calls().into_iter().filter(|c| c.path_and_query.starts_with(SEND)).collect();
    assert_eq!(sent.len(), 1, "sent once");
    assert_eq!(&sent[0].body[..], body.as_bytes(), "the body as the caller sent it");
    let token = tokens.issued().pop().expect("a token");
    assert_eq!(sent[0].path_and_query, format!("{SEND}?access_token={token}"), "the account's token, not the caller's");
    // Another caller does not see it; an unknown id is 404.
    let other = gate.get_with(&format!("/v1/deliveries/{id}"), &[("x-wx-caller", "marketing")]).await;
    assert_eq!(other.status, 404, "{}", other.text());
    let unknown = gate.get_with(&format!("/v1/deliveries/{}", "0".repeat(32)), &[("x-wx-caller", "hr")]).await;
    assert_eq!(unknown.status, 404);
    // The job's store never saw the caller's token.
    let file = std::fs::read(dir.path().join("queue.db")).unwrap_or_default();
    let wal = std::fs::read(dir.path().join("queue.db-wal")).unwrap_or_default();
    for bytes in [file, wal] {
        assert!(!bytes.windows(11).any(|w| w == b"CALLERS_OWN"), "no caller's token at rest");
    }
}

#[tokio::test]
async fn queued_messages_wait_for_the_quota_and_go_in_order_never_over_it() {
    let (mock, _tokens) = wechat(|_, n| msgid(n)).await;
    let dir = TempDir::new("queue-quota");
    let gate = gate(&mock, &dir, &rules(3, "1m"), "", "").await;
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(queued(&gate, "default", SEND, &format!(r#"{{"touser":"o{i}","template_id":"t"}}"#)).await);
    }
    for id in &ids[..3] {
        until_state(&gate, "default", id, "sent").await;
    }
    let waiting = until_state(&gate, "default", &ids[3], "waiting").await;
    assert!(waiting["waiting_until"].is_string(), "the fourth waits for the window: {waiting}");
    assert_eq!(mock.calls().iter().filter(|c| c.path_and_query.starts_with(SEND)).count(), 3, "never over the window");
    for id in &ids[3..] {
        // Window-exact (docs/semantics.md): after a full burst of 3, one more a minute.
        gate.advance(Duration::from_secs(61));
        until_state(&gate, "default", id, "sent").await;
    }
    let order: Vec<String> = mock
        .calls()
        .into_iter()
        .filter(|c| c.path_and_query.starts_with(SEND))
        .map(|c| String::from_utf8_lossy(&c.body).into_owned())
        .collect();
    let want: Vec<String> = (0..5).map(|i| format!(r#"{{"touser":"o{i}","template_id":"t"}}"#)).collect();
    assert_eq!(order, want, "in the order they were queued, each once");
}

#[tokio::test]
async fn bad_queue_requests_are_refused_and_nothing_is_stored() {
    let (mock, _tokens) = wechat(|_, n| msgid(n)).await;
    let dir = TempDir::new("queue-bad");
    let info = rule("info").matching("/cgi-bin/user/info").limit(100, "day");
    let hr = caller("hr").set("callbacks", vec!["https://hr.internal/hooks/"]).to_string();
    let key = support::callbacks::key_file_line(&dir);
    let gate = gate(&mock, &dir, &format!("{}\n{info}", rules(100, "day")), &key, &hr).await;
    let at = format!("/@{APPID}{SEND}");
    let not_held = format!("/@wxnotheld{SEND}");
    type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, u16, &'a str);
    let cases: Vec<Case> = vec![
        ("/@wxapp/cgi-bin/user/info", vec![ASYNC], 400, "does not queue its calls"),
        (&at, vec![ASYNC, ("x-wxgate-deadline", "2020-01-01T00:00:00Z")], 400, "in the past"),
        (&at, vec![ASYNC, ("x-wxgate-deadline", "soon")], 400, "X-Wxgate-Deadline must be"),
        (&at, vec![ASYNC, ("x-wx-caller", "hr"), ("x-wxgate-callback", "https://evil.example/x")], 400, "callbacks"),
        (&at, vec![ASYNC, ("idempotency-key", "a"), ("idempotency-key", "b")], 400, "more than once"),
        (&not_held, vec![ASYNC], 400, "not an [[account]]"),
        (&at, vec![ASYNC, ("content-encoding", "gzip")], 400, "must not be encoded"),
    ];
    for (path, headers, status, says) in cases {
        let a = gate.post_with(path, "{}", &headers).await;
        assert_eq!(a.status, status, "{path} {headers:?}: {}", a.text());
        assert!(a.text().contains(says), "{path} {headers:?}: {}", a.text());
    }
    let big = "x".repeat(70 * 1024);
    let a = gate.post_with(&at, &big, &[ASYNC]).await;
    assert_eq!(a.status, 413, "{}", a.text());
    let summary = gate.get_with("/v1/deliveries", &[]).await.json();
    assert_eq!(summary["queues"], serde_json::json!([]), "nothing stored: {summary}");
    assert_eq!(mock.calls().iter().filter(|c| c.path_and_query.starts_with(SEND)).count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_key_returns_the_first_job_and_sends_once() {
    for store in Store::all() {
        let (mock, _tokens) = wechat(|_, n| msgid(n)).await;
        let dir = TempDir::new(&format!("queue-idem-{}", store.name()));
        let gate = store.gate(&mock, &dir, rules(100, "day"), "").await;
        let key = [("idempotency-key", "order-42")];
        let first = queued_with(&gate, "default", SEND, "{}", &key).await;
        let again = queued_with(&gate, "default", SEND, "{}", &key).await;
        assert_eq!(first, again, "{}", store.name());
        until_state(&gate, "default", &first, "sent").await;
        gate.settle().await;
        assert_eq!(sends(&mock), 1, "{}", store.name());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_message_fails_at_once_and_a_busy_wechat_is_retried_later() {
    for store in Store::all() {
        let (mock, _tokens) = wechat(|_, n| match n {
            0 => support::errcode_reply(40003),
            1 => support::errcode_reply(-1),
            _ => msgid(n),
        })
        .await;
        let dir = TempDir::new(&format!("queue-retry-{}", store.name()));
        let gate = store.gate(&mock, &dir, rules(100, "day"), "").await;
        let wrong = queued(&gate, "default", SEND, "{}").await;
        let wrong = until_state(&gate, "default", &wrong, "failed").await;
        assert_eq!(wrong["answer"]["errcode"], 40003, "{} {wrong}", store.name());
        let id = queued(&gate, "default", SEND, "{}").await;
        let waiting = until_state(&gate, "default", &id, "waiting").await;
        assert_eq!(waiting["answer"]["errcode"], -1, "{} {waiting}", store.name());
        gate.advance(Duration::from_secs(2));
        let sent = until_state(&gate, "default", &id, "sent").await;
        assert_eq!(sent["attempts"], 2, "{} {sent}", store.name());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_not_yet_sending_can_be_cancelled_and_is_never_sent() {
    for store in Store::all() {
        let (mock, _tokens) = wechat(|_, n| msgid(n)).await;
        let dir = TempDir::new(&format!("queue-cancel-{}", store.name()));
        let gate = store.gate(&mock, &dir, rules(1, "1m"), "").await;
        let first = queued(&gate, "default", SEND, "{}").await;
        until_state(&gate, "default", &first, "sent").await;
        let id = queued(&gate, "default", SEND, "{}").await;
        until_state(&gate, "default", &id, "waiting").await;
        let cancelled = support::send(
            http::Request::delete(gate.url(&format!("/v1/deliveries/{id}")))
                .body(http_body_util::Full::new(bytes::Bytes::new()))
                .expect("request"),
        )
        .await;
        assert_eq!(cancelled.status, 200, "{}: {}", store.name(), cancelled.text());
        assert_eq!(cancelled.json()["state"], "cancelled");
        gate.advance(Duration::from_secs(120));
        gate.settle().await;
        assert_eq!(sends(&mock), 1, "{}: never sent", store.name());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_redis_send_each_job_once_and_never_over_the_quota() {
    for store in Store::redis_and_cluster() {
        two_instances(&store).await;
    }
}

/// Two wxgate processes on `store` (Redis or Cluster) dispatching one queue.
async fn two_instances(store: &Store) {
    let (mock, _tokens) = wechat(|_, n| msgid(n)).await;
    let dir = TempDir::new(&format!("queue-two-{}", store.name()));
    let callers: Vec<String> = ["hr", "marketing", "ops"].iter().map(|c| caller(c).to_string()).collect();
    // No reserve (`quota_reserve = "0s"`): with one, the day's last units
    // may sit in the reserve of the instance that stopped claiming jobs
    // until it calls the pair again or two idle minutes pass (docs/redis-
    // store.md, "What the default guarantees"), longer than this test waits.
    let config = ConfigToml::new(&mock.url())
        .with(store.toml("q2").set("quota_reserve", "0s"))
        .with(rules(30, "day"))
        .with(account_toml(&dir, APPID, "official_account", SECRET, ""))
        .with(callers.join("\n"))
        .to_string();
    let env = [("WXGATE_TOKEN_KEY", "5f0c9a3e7b2d4f6a8c1e3b5d7f9a0c2e4b6d8f1a3c5e7b9d0f2a4c6e8b1d3f5a")];
    let instances: Vec<support::process::Instance> = (0..2)
        .map(|i| {
            let tag = format!("queue-two-{}-{i}", store.name());
            support::process::spawn(&config, &tag, &env).unwrap_or_else(|log| panic!("{log}"))
        })
        .collect();
    let mut ids = Vec::new();
    for i in 0..40 {
        let by = ["hr", "marketing", "ops"][i % 3];
        let url = instances[i % 2].url(&format!("/@{APPID}{SEND}"));
        ids.push((by, queued_at(url, by, format!(r#"{{"touser":"o{i}"}}"#)).await));
    }
    let sends = || mock.calls().into_iter().filter(|c| c.path_and_query.starts_with(SEND)).count();
    eventually_async("30 sent", PATIENCE, async || sends() >= 30).await;
    // The other ten wait for the next quota day (each queue's head
    // `waiting`, the jobs behind it `queued`), seen from either instance.
    let mut states = std::collections::BTreeMap::<String, usize>::new();
    for (i, (by, id)) in ids.iter().enumerate() {
        let path = format!("/v1/deliveries/{id}");
        let mut state = String::new();
        eventually_async("a state", PATIENCE, async || {
            let req = http::Request::get(instances[(i + 1) % 2].url(&path)).header("x-wx-caller", *by);
            let a = support::send(req.body(http_body_util::Full::new(bytes::Bytes::new())).expect("request")).await;
            state = a.json()["state"].as_str().unwrap_or_default().to_owned();
            ["sent", "waiting", "queued"].contains(&state.as_str())
        })
        .await;
        *states.entry(state).or_default() += 1;
    }
    assert_eq!(states.get("sent"), Some(&30), "{states:?}");
    let unsent = states.get("waiting").copied().unwrap_or(0) + states.get("queued").copied().unwrap_or(0);
    assert_eq!(unsent, 10, "{states:?}");
    assert!(states.get("waiting").is_some_and(|w| *w >= 1), "a queue's head waits for the quota: {states:?}");
    let mut bodies: Vec<String> = mock
        .calls()
        .into_iter()
        .filter(|c| c.path_and_query.starts_with(SEND))
        .map(|c| String::from_utf8_lossy(&c.body).into_owned())
        .collect();
    assert_eq!(bodies.len(), 30, "never over the day quota");
    bodies.sort();
    bodies.dedup();
    assert_eq!(bodies.len(), 30, "each job sent once");
    let forwarded = r#"wxgate_calls_total{rule="template_send",outcome="forwarded"}"#;
    let mut by_instance = Vec::new();
    for i in &instances {
        by_instance.push(i.metric(forwarded).await.unwrap_or(0.0));
    }
    assert_eq!(by_instance.iter().sum::<f64>(), 30.0, "{by_instance:?}");
    // Each instance's submissions wake its own dispatcher: both send.
    assert!(by_instance.iter().all(|n| *n > 0.0), "both instances dispatch: {by_instance:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_with_jobs_in_flight_ends_every_job_once_and_resends_none() {
    let gate_replies = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let held = gate_replies.clone();
    let (mock, _tokens) = wechat(move |_, n| Reply::Gated { gate: held.clone(), then: Box::new(msgid(n)) }).await;
    let dir = TempDir::new("queue-kill");
    // A send may take its time on a loaded machine: none ends unknown by a timeout.
    // Up to 64 sends in flight (the issue's figure).
    let config = ConfigToml::new(&mock.url())
        .server("upstream_timeout", "30s")
        .with(format!("[store]\nkind = \"memory\"\nstate_file = \"{}\"\n", dir.path().join("state.json").display()))
        .with(rules(5000, "day"))
        .with(account_toml(&dir, APPID, "official_account", SECRET, ""))
        .with("[queue]\nmax_in_flight = 64\n".to_owned())
        .to_string();
    let path = dir.path().join("wxgate.toml");
    std::fs::write(&path, &config).expect("config");
    let mut first = support::process::spawn_path(&path, &[]).unwrap_or_else(|log| panic!("{log}"));
    const JOBS: usize = 1000;
    let mut submissions = tokio::task::JoinSet::new();
    for i in 0..JOBS {
        let url = first.url(&format!("/@{APPID}{SEND}"));
        submissions.spawn(queued_at(url, "default", format!(r#"{{"touser":"o{i}"}}"#)));
        if submissions.len() >= 16 {
            submissions.join_next().await.expect("a task").expect("submitted");
        }
    }
    while let Some(a) = submissions.join_next().await {
        a.expect("submitted");
    }
    let sends = || mock.calls().into_iter().filter(|c| c.path_and_query.starts_with(SEND)).count();
    // 100 answered; then some more on their way when the process dies.
    gate_replies.add_permits(100);
    eventually_async("more than 100 sends reached WeChat", PATIENCE, async || sends() > 100).await;
    first.kill();
    let mut second = support::process::spawn_path(&path, &[]).unwrap_or_else(|log| panic!("{log}"));
    gate_replies.add_permits(JOBS * 2);
    let mut summary = serde_json::Value::Null;
    eventually_async("every job ended", PATIENCE, async || {
        summary = second.get("/v1/deliveries").await.json();
        let q = &summary["queues"][0];
        q["queued"] == 0 && q["waiting"] == 0 && q["sending"] == 0
    })
    .await;
    let q = &summary["queues"][0];
    let (sent, unknown) = (q["sent"].as_u64().unwrap_or(0), q["unknown"].as_u64().unwrap_or(0));
    assert_eq!(sent + unknown, JOBS as u64, "every job ended once: {summary}");
    // The sends under way when the process died (at most its window of
    // 64) were `sending`, and end unknown; nothing else does, and none of
    // them is sent again.
    assert!((1..=64).contains(&unknown), "unknown = the sends in flight at the kill (at most 64): {summary}");
    let mut bodies: Vec<String> = mock
        .calls()
        .into_iter()
        .filter(|c| c.path_and_query.starts_with(SEND))
        .map(|c| String::from_utf8_lossy(&c.body).into_owned())
        .collect();
    let total = bodies.len();
    bodies.sort();
    bodies.dedup();
    assert_eq!(bodies.len(), total, "no message sent twice");
    let reached_unanswered = total - sent as usize;
    assert!(
        reached_unanswered <= unknown as usize,
        "every message sent reached WeChat once, and those it never answered are unknown: {total} reached, {summary}"
    );
    second.kill();
}

#[tokio::test]
async fn a_send_waiting_on_wechat_never_delays_another_callers_queue() {
    let (mock, _tokens, slow) = slow_wechat().await;
    let dir = TempDir::new("queue-slow");
    // WeChat's answer may take its time: the held send stays `sending`.
    let config = ConfigToml::new(&mock.url())
        .server("upstream_timeout", "60s")
        .with(rules(100, "day"))
        .with(account_toml(&dir, APPID, "official_account", SECRET, ""))
        .with(format!("[queue]\nfile = \"{}\"\n", dir.path().join("queue.db").display()))
        .with(format!("{}\n{}", caller("hr"), caller("marketing")));
    let gate = Gate::start_text(config).await;
    let stuck = queued(&gate, "marketing", SEND, r#"{"slow":1}"#).await;
    eventually_async("marketing's send at WeChat", PATIENCE, async || mock.in_flight().0 == 1).await;
    for n in 0..3 {
        let body: &'static str = [r#"{"hr":0}"#, r#"{"hr":1}"#, r#"{"hr":2}"#][n];
        let id = queued(&gate, "hr", SEND, body).await;
        until_state(&gate, "hr", &id, "sent").await;
    }
    let still = gate.get_with(&format!("/v1/deliveries/{stuck}"), &[("x-wx-caller", "marketing")]).await.json();
    assert_eq!(still["state"], "sending", "{still}");
    slow.add_permits(1);
    until_state(&gate, "marketing", &stuck, "sent").await;
}

/// WeChat takes longer than `upstream_timeout` to answer a queued send:
/// the request went out and may have been taken, so the job ends `unknown`
/// and is never sent again, however long wxgate runs; the queue goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_wechat_answers_after_upstream_timeout_ends_unknown_and_is_never_sent_again() {
    // The stores at once: each waits out upstream_timeout.
    let stores = Store::all();
    futures_util::future::join_all(stores.iter().map(unknown_after_upstream_timeout)).await;
}

/// [`a_send_wechat_answers_after_upstream_timeout_ends_unknown_and_is_never_sent_again`] on `store`.
async fn unknown_after_upstream_timeout(store: &Store) {
    let (mock, _tokens, slow) = slow_wechat().await;
    let dir = TempDir::new(&format!("queue-timeout-{}", store.name()));
    let config = ConfigToml::new(&mock.url()).server("upstream_timeout", "1s");
    let gate = store.gate_on(config, &dir, rules(100, "day"), "").await;
    let id = queued(&gate, "default", SEND, r#"{"slow":1}"#).await;
    let unknown = until_state(&gate, "default", &id, "unknown").await;
    assert_eq!(unknown["attempts"], 1, "{}: {unknown}", store.name());
    assert!(unknown.get("answer").is_none_or(|a| a.is_null()), "{}: no answer came: {unknown}", store.name());
    assert_eq!(sends(&mock), 1, "{}", store.name());
    // Well past every back-off (`backoff_max` 5 min) and the lease (10 min).
    for _ in 0..4 {
        gate.advance(Duration::from_secs(10 * 60));
        gate.settle().await;
    }
    // The queue goes on: the next job is sent, and the slow one never again.
    let next = queued(&gate, "default", SEND, r#"{"next":1}"#).await;
    until_state(&gate, "default", &next, "sent").await;
    let bodies: Vec<_> =
        mock.calls().into_iter().filter(|c| c.path_and_query.starts_with(SEND)).map(|c| c.body).collect();
    assert_eq!(bodies, [&br#"{"slow":1}"#[..], &br#"{"next":1}"#[..]], "{}: the slow one once", store.name());
    let still = gate.get_with(&format!("/v1/deliveries/{id}"), &[]).await.json();
    assert_eq!(still["state"], "unknown", "{}: {still}", store.name());
    slow.add_permits(4);
}

/// A queued call's body is read whole before anything is stored: a body
/// that stops mid-way (the client sends part of it, then nothing) gets the
/// live path's 408 after `body_timeout`, and nothing is stored or sent; a
/// chunked body arriving in pieces is stored and sent byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_body_is_read_whole_and_one_that_stalls_gets_408_and_nothing_is_stored() {
    // The stores at once: each waits out body_timeout.
    let stores = Store::all();
    futures_util::future::join_all(stores.iter().map(queued_body)).await;
}

/// [`a_queued_body_is_read_whole_and_one_that_stalls_gets_408_and_nothing_is_stored`] on `store`.
async fn queued_body(store: &Store) {
    let (mock, _tokens) = wechat(|_, n| msgid(n)).await;
    let dir = TempDir::new(&format!("queue-body-{}", store.name()));
    let config = ConfigToml::new(&mock.url()).server("body_timeout", "1s");
    let gate = store.gate_on(config, &dir, rules(100, "day"), "").await;
    let head = |framing: &str| {
        format!("POST /@{APPID}{SEND} HTTP/1.1\r\nHost: x\r\nPrefer: respond-async\r\n{framing}\r\n\r\n")
    };
    // Both at once, each client keeping its connection open and sending nothing more.
    let stalled = support::bodies::stalled_bodies(head).map(|(label, bytes)| async move {
        let started = std::time::Instant::now();
        let ex = support::exchange(gate.addr, &bytes).await;
        (label, ex, started.elapsed())
    });
    for (label, ex, waited) in futures_util::future::join_all(stalled).await {
        let resp = ex.only();
        assert_eq!(resp.status, 408, "{} {label}: {}", store.name(), resp.text());
        let json = resp.json();
        assert_eq!(json["errcode"], 40097, "{} {label}: {json}", store.name());
        assert!(json["errmsg"].as_str().is_some_and(|m| m.contains("body_timeout")), "{label}: {json}");
        assert!(waited >= Duration::from_millis(950), "{label}: not before body_timeout: {waited:?}");
        assert!(waited < Duration::from_secs(10), "{label}: in bounded time: {waited:?}");
    }
    let summary = gate.get_with("/v1/deliveries", &[]).await.json();
    assert_eq!(summary["queues"], serde_json::json!([]), "{}: nothing stored: {summary}", store.name());
    // A chunked body, in pieces: stored and sent as it was sent.
    let body =
        format!(r#"{{"touser":"o1","data":{{"thing1":{{"value":"{}"}}}},"note":"年 \u00e9"}}"#, "x".repeat(9000));
    let chunks: Vec<&[u8]> = body.as_bytes().chunks(1000).collect();
    let head = head("Connection: close\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked");
    let wire = support::bodies::chunked_body(&chunks);
    let ex = support::bodies::send_paced(gate.addr, &head, &wire, 4, Duration::from_millis(20)).await;
    let resp = ex.only();
    assert_eq!(resp.status, 202, "{}: {}", store.name(), resp.text());
    let id = resp.json()["delivery"].as_str().expect("an id").to_owned();
    until_state(&gate, "default", &id, "sent").await;
    let sent: Vec<_> = mock.calls().into_iter().filter(|c| c.path_and_query.starts_with(SEND)).collect();
    assert_eq!(sent.len(), 1, "{}: only the whole one", store.name());
    assert_eq!(&sent[0].body[..], body.as_bytes(), "{}: the body as the caller sent it", store.name());
}

/// Sends of the template API the mock has seen.
fn sends(mock: &MockWeChat) -> usize {
    mock.calls().into_iter().filter(|c| c.path_and_query.starts_with(SEND)).count()
}

// The issue's 10,000 on memory; 2,000 on Redis and Cluster: still more than
// 3 times what the 6 steps can send at all, so HR's queue competes with a
// backlog all the same. The submissions are most of the test's time (12-16 s
// for 10,000 on a store on a loaded 2-core machine); the stores run as
// separate tests, side by side.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn marketings_campaign_never_delays_hrs_live_calls_and_hrs_queue_gets_its_turns() {
    campaign(&Store::Memory, 10_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_and_a_cluster_marketings_campaign_never_delays_hrs_live_calls_and_hrs_queue_gets_its_turns() {
    for store in Store::redis_and_cluster() {
        campaign(&store, 2_000).await;
    }
}

/// The campaign scenario on `store`: marketing queues `campaign_size` messages.
async fn campaign(store: &Store, campaign_size: usize) {
    let (mock, _tokens) = wechat(|_, n| msgid(n)).await;
    let dir = TempDir::new(&format!("queue-campaign-{}", store.name()));
    // 100 at once (window-exact: never more than 100 in any minute, so
    // after a full burst they come back one a minute: each step below moves
    // the clock 100 minutes, a whole burst); 40 % only for high priority
    // (HR's live calls). Queued sends are never high priority: they share
    // the other 60.
    let token = rule("token").matching("/cgi-bin/token").matching("/cgi-bin/stable_token").limit(2000, "day");
    let send =
        rule("template_send").matching(SEND).limit_burst(100, "1m", 100).set("reserve", "40%").set("queue", true);
    let callers = format!("{}\n{}", caller("hr").high(), caller("marketing"));
    let gate = store.gate(&mock, &dir, format!("{token}\n{send}"), &callers).await;
    let url = gate.url(&format!("/@{APPID}{SEND}"));
    // Marketing's campaign, handed over at once.
    let mut submissions = tokio::task::JoinSet::new();
    for i in 0..campaign_size {
        submissions.spawn(queued_at(url.clone(), "marketing", format!(r#"{{"touser":"m{i}"}}"#)));
        if submissions.len() >= 32 {
            submissions.join_next().await.expect("task").expect("submitted");
        }
    }
    while let Some(submitted) = submissions.join_next().await {
        submitted.expect("submitted");
    }
    let mut seen = 0;
    let mut hr_queued = Vec::new();
    for step in 0..6 {
        // The campaign takes what the step leaves to normal calls.
        eventually_async("the step's normal share sent", PATIENCE, async || sends(&mock) - seen >= 60).await;
        gate.settle().await;
        // HR's live calls, 40 this step: never refused for the queue.
        for i in 0..40 {
            let body = format!(r#"{{"touser":"h{step}-{i}"}}"#);
            let a = gate.post_with(&format!("/@{APPID}{SEND}"), &body, &[("x-wx-caller", "hr")]).await;
            assert_eq!((a.status.as_u16(), a.json()["errcode"].as_i64()), (200, Some(0)), "step {step}: {}", a.text());
        }
        if step == 0 {
            // And 200 of HR's own messages queued behind the rest of the campaign.
            hr_queued = queue_n(&gate, "hr", "hq", 200).await;
        }
        gate.settle().await;
        let this_step = sends(&mock) - seen;
        assert!(this_step <= 100, "step {step}: {this_step} sends, over the window");
        seen = sends(&mock);
        gate.advance(Duration::from_secs(100 * 60 + 1));
        if step == 0 {
            // HR's queue gets its turn in the first round of the next step.
            let first = hr_queued[0].clone();
            until_state(&gate, "hr", &first, "sent").await;
        }
    }
    let bodies: Vec<String> = mock
        .calls()
        .into_iter()
        .filter(|c| c.path_and_query.starts_with(SEND))
        .map(|c| String::from_utf8_lossy(&c.body).into_owned())
        .collect();
    let total = bodies.len();
    let unique: std::collections::HashSet<&String> = bodies.iter().collect();
    assert_eq!(unique.len(), total, "nothing sent twice");
    // In the 5 steps after HR queued, HR's queue got about half of the 300
    // normal sends (equal weights), however many marketing had queued before.
    let hr_sent = bodies.iter().filter(|b| b.contains("\"hq")).count();
    assert!(hr_sent >= 100, "HR's queued messages drain in turns with the campaign: {hr_sent} of 200 in 5 steps");
}

/// Where a scenario's gate keeps its decisions and its jobs.
enum Store {
    /// The memory store, the jobs in SQLite.
    Memory,
    Redis(support::redis_server::RedisServer),
    Cluster(support::redis_server::RedisCluster),
}

impl Store {
    fn all() -> Vec<Store> {
        vec![
            Store::Memory,
            Store::Redis(support::redis_server::RedisServer::start()),
            Store::Cluster(support::redis_server::RedisCluster::start(3)),
        ]
    }

    /// The stores two wxgate processes can share.
    fn redis_and_cluster() -> [Store; 2] {
        [
            Store::Redis(support::redis_server::RedisServer::start()),
            Store::Cluster(support::redis_server::RedisCluster::start(3)),
        ]
    }

    /// The `[store]` section of this Redis or Cluster, its keys under `prefix`.
    fn toml(&self, prefix: &str) -> support::StoreToml {
        match self {
            Store::Memory => panic!("the memory store is one process's"),
            Store::Redis(redis) => support::StoreToml::redis(&redis.url()).set("key_prefix", prefix),
            Store::Cluster(cluster) => support::StoreToml::redis_cluster(cluster.urls()).set("key_prefix", prefix),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Store::Memory => "memory",
            Store::Redis(_) => "redis",
            Store::Cluster(_) => "cluster",
        }
    }

    /// A gate on this store (a manual clock on each) with `rules`, the
    /// account and `extra`. Its dispatcher's leases last 10 minutes: the
    /// tests move the clock by minutes at a time, and a turn under way
    /// must not lose its lease to a jump a real clock never makes.
    async fn gate(&self, mock: &MockWeChat, dir: &TempDir, rules: String, extra: &str) -> Gate {
        self.gate_on(ConfigToml::new(&mock.url()), dir, rules, extra).await
    }

    /// [`Store::gate`] on `config` (its `[server]` settings).
    async fn gate_on(&self, config: ConfigToml, dir: &TempDir, rules: String, extra: &str) -> Gate {
        let key = dir.write_secret("token.key", "5f0c9a3e7b2d4f6a8c1e3b5d7f9a0c2e4b6d8f1a3c5e7b9d0f2a4c6e8b1d3f5a\n");
        let config =
            config.with(rules).with(account_toml(dir, APPID, "official_account", SECRET, "")).with(extra.to_owned());
        let tokens = format!("[tokens]\nkey_file = \"{}\"\n", key.display());
        match self {
            Store::Memory => {
                let queue = format!("[queue]\nlease = \"10m\"\nfile = \"{}\"\n", dir.path().join("queue.db").display());
                Gate::start_text(config.with(queue)).await
            }
            Store::Redis(_) | Store::Cluster(_) => {
                let config = config.with(self.toml("qs")).with(tokens).with("[queue]\nlease = \"10m\"\n".to_owned());
                Gate::start_redis_on_manual_clock(config).await
            }
        }
    }
}

/// Queues `n` messages (`{"touser":"<prefix><i>"}`) as `caller`; their ids.
async fn queue_n(gate: &Gate, caller: &str, prefix: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        ids.push(queued(gate, caller, SEND, &format!(r#"{{"touser":"{prefix}{i}"}}"#)).await);
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_queued_against_a_day_quota_of_300_send_300_once_and_keep_the_rest_for_tomorrow() {
    for store in Store::all() {
        let (mock, _tokens) = wechat(|_, n| msgid(n)).await;
        let dir = TempDir::new(&format!("queue-day-{}", store.name()));
        let token = rule("token").matching("/cgi-bin/token").matching("/cgi-bin/stable_token").limit(2000, "day");
        let send =
            rule("template_send").matching(SEND).limit(300, "day").limit_burst(200, "1m", 200).set("queue", true);
        let gate = store.gate(&mock, &dir, format!("{token}\n{send}"), "").await;
        let ids = queue_n(&gate, "default", "d", 500).await;
        // 200 at once (the window's burst; window-exact, it refills whole
        // in 200 minutes), then 100 more: the day's 300.
        eventually_async("the window's 200", PATIENCE, async || sends(&mock) == 200).await;
        gate.advance(Duration::from_secs(200 * 60 + 1));
        eventually_async("the day's 300", PATIENCE, async || sends(&mock) == 300).await;
        // The sends of a queue go several at a time, so which jobs the
        // day's end turned away is not fixed: each waits for tomorrow.
        let mut head = serde_json::Value::Null;
        eventually_async("a job waiting for tomorrow", PATIENCE, async || {
            for id in &ids[250..] {
                let job = gate.get_with(&format!("/v1/deliveries/{id}"), &[]).await.json();
                if job["state"] == "waiting" {
                    head = job;
                    return true;
                }
            }
            false
        })
        .await;
        // It waits for the quota day's midnight (UTC+8): T0 is 10:00 there.
        assert!(
            head["waiting_until"].as_str().is_some_and(|t| t.ends_with("T16:00:00.000Z")),
            "{} {head}",
            store.name()
        );
        for _ in 0..2 {
            gate.advance(Duration::from_secs(3_600 * 4));
            gate.settle().await;
        }
        assert_eq!(sends(&mock), 300, "{}: nothing more before midnight", store.name());
        let mut bodies: Vec<String> = mock
            .calls()
            .into_iter()
            .filter(|c| c.path_and_query.starts_with(SEND))
            .map(|c| String::from_utf8_lossy(&c.body).into_owned())
            .collect();
        bodies.sort();
        bodies.dedup();
        assert_eq!(bodies.len(), 300, "{}: each once", store.name());
        // After midnight (16:00Z; the clock is at 13:20Z), the other 200 go.
        gate.advance(Duration::from_secs(3 * 3_600));
        eventually_async("tomorrow's first 200", PATIENCE, async || sends(&mock) == 500).await;
        until_state(&gate, "default", &ids[499], "sent").await;
        assert!(mock.calls().iter().all(|c| !String::from_utf8_lossy(&c.body).contains("45009")));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_penalty_holds_every_queued_job_and_a_deadline_expires_one() {
    for store in Store::all() {
        // WeChat answers the first send 45011 (a frequency penalty).
        let (mock, _tokens) = wechat(|_, n| if n == 0 { support::errcode_reply(45011) } else { msgid(n) }).await;
        let dir = TempDir::new(&format!("queue-penalty-{}", store.name()));
        let extra = format!("{}\n{}", support::penalty(45011, 600), caller("ops"));
        let gate = store.gate(&mock, &dir, rules(1000, "day"), &extra).await;
        let ids = queue_n(&gate, "default", "p", 20).await;
        // Sends go several at a time: whichever reached WeChat first got the 45011.
        let mut first = serde_json::Value::Null;
        eventually_async("a job answered 45011 waiting", PATIENCE, async || {
            for id in &ids {
                let job = gate.get_with(&format!("/v1/deliveries/{id}"), &[]).await.json();
                if job["state"] == "waiting" {
                    first = job;
                    return true;
                }
            }
            false
        })
        .await;
        assert_eq!(first["answer"]["errcode"], 45011, "{} {first}", store.name());
        let refused = first["delivery"].as_str().expect("its id").to_owned();
        // The sends under way beside the first when WeChat answered it
        // (a queue's first window: 4) may have gone; none after.
        gate.settle().await;
        let at_penalty = sends(&mock);
        assert!(at_penalty <= 4, "{}: {at_penalty} sends before the penalty was known", store.name());
        // One with a deadline inside the penalty (another caller's queue:
        // a job's deadline is seen when it heads its queue).
        let late = queued_with(&gate, "ops", SEND, r#"{"touser":"late"}"#, &[("x-wxgate-deadline", "300")]).await;
        for _ in 0..9 {
            gate.advance(Duration::from_secs(60));
            gate.settle().await;
        }
        assert_eq!(sends(&mock), at_penalty, "{}: nothing sent during the penalty", store.name());
        let expired = until_state(&gate, "ops", &late, "expired").await;
        assert_eq!(expired["attempts"], 0, "{} {expired}", store.name());
        // Past the penalty: on Redis a refused job's wait has run past the
        // penalty's end (seen: 02:11 for 02:10, and once later still under
        // load), so the clock moves a minute at a time until the last job
        // goes (at most 10 minutes); never before the penalty's end.
        let last = format!("/v1/deliveries/{}", ids[19]);
        let mut state = serde_json::Value::Null;
        for _ in 0..10 {
            gate.advance(Duration::from_secs(61));
            let t = std::time::Instant::now();
            while t.elapsed() < Duration::from_secs(3) {
                state = gate.get_with(&last, &[]).await.json();
                if state["state"] == "sent" {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if state["state"] == "sent" {
                break;
            }
        }
        assert_eq!(state["state"], "sent", "{}: the last job after the penalty: {state}", store.name());
        let sent = until_state(&gate, "default", &refused, "sent").await;
        assert_eq!(sent["attempts"], 2, "{} {sent}", store.name());
        assert_eq!(sends(&mock), 21, "{}: each once, the first twice", store.name());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_behind_a_waiting_head_expires_at_its_deadline_not_when_it_reaches_the_head() {
    for store in Store::all() {
        let (mock, _tokens) = wechat(|_, n| msgid(n)).await;
        let dir = TempDir::new(&format!("queue-deadline-{}", store.name()));
        let gate = store.gate(&mock, &dir, rules(2, "day"), "").await;
        // Two sent; the third heads the queue, waiting for the next quota day
        // (one recipient, so one lane: they go in order).
        let mut ids = Vec::new();
        for _ in 0..3 {
            ids.push(queued(&gate, "default", SEND, r#"{"touser":"d"}"#).await);
        }
        until_state(&gate, "default", &ids[1], "sent").await;
        until_state(&gate, "default", &ids[2], "waiting").await;
        // Behind it, one that must go within two minutes.
        let deadline = [("x-wxgate-deadline", "120")];
        let late = queued_with(&gate, "default", SEND, r#"{"touser":"late"}"#, &deadline).await;
        gate.settle().await;
        let before = gate.get_with(&format!("/v1/deliveries/{late}"), &[]).await.json();
        assert_eq!(before["state"], "queued", "{}: {before}", store.name());
        gate.advance(Duration::from_secs(121));
        let expired = until_state(&gate, "default", &late, "expired").await;
        assert_eq!(expired["attempts"], 0, "{} {expired}", store.name());
        let head = gate.get_with(&format!("/v1/deliveries/{}", ids[2]), &[]).await.json();
        assert_eq!(head["state"], "waiting", "{}: the head still waits for tomorrow: {head}", store.name());
        assert_eq!(sends(&mock), 2, "{}", store.name());
    }
}

#[tokio::test]
async fn queues_refused_together_retry_spread_over_the_back_off_not_at_one_instant() {
    // WeChat is busy (-1) for the first 40 sends, then takes them.
    let (mock, _tokens) = wechat(|_, n| if n < 40 { support::errcode_reply(-1) } else { msgid(n) }).await;
    let dir = TempDir::new("queue-spread");
    let callers: Vec<String> = (0..40).map(|i| caller(&format!("svc{i}")).to_string()).collect();
    let gate = gate(&mock, &dir, &rules(1000, "day"), "backoff = \"10s\"", &callers.join("\n")).await;
    let mut ids = Vec::new();
    for i in 0..40 {
        let who = format!("svc{i}");
        ids.push((who.clone(), queued(&gate, &who, SEND, "{}").await));
    }
    let mut retries = Vec::new();
    for (who, id) in &ids {
        let waiting = until_state(&gate, who, id, "waiting").await;
        assert_eq!(waiting["answer"]["errcode"], -1, "{waiting}");
        retries.push(waiting["waiting_until"].as_str().expect("a time").to_owned());
    }
    retries.sort();
    retries.dedup();
    // Full jitter over [now, now + 10 s] at millisecond resolution: 40 draws
    // land on one instant with odds far below one in a million.
    assert!(retries.len() >= 30, "retries spread over the back-off: {retries:?}");
    let (first, last) = (&retries[0], &retries[retries.len() - 1]);
    assert!(first != last, "{first} {last}");
    gate.advance(Duration::from_secs(11));
    for (who, id) in &ids {
        until_state(&gate, who, id, "sent").await;
    }
}

#[tokio::test]
async fn a_caller_past_its_queue_bound_gets_429_queue_full_and_nothing_is_stored() {
    let (mock, _tokens) = wechat(|_, n| msgid(n)).await;
    let dir = TempDir::new("queue-full");
    // A day quota of 0 left after one: the jobs stay queued.
    let gate = gate(&mock, &dir, &rules(1, "day"), "caller_jobs = 3", "").await;
    for i in 0..3 {
        let a = submit(&gate, "default", SEND, &format!(r#"{{"n":{i}}}"#), &[]).await;
        assert_eq!(a.status, 202, "{}", a.text());
    }
    eventually_async("the first sent", PATIENCE, async || sends(&mock) == 1).await;
    // One ended (sent): two unfinished, room for one more.
    let a = submit(&gate, "default", SEND, r#"{"n":3}"#, &[]).await;
    assert_eq!(a.status, 202, "{}", a.text());
    let full = submit(&gate, "default", SEND, r#"{"n":4}"#, &[]).await;
    assert_eq!(full.status, 429, "{}", full.text());
    assert_eq!(full.header("x-wxgate-reason"), Some("queue_full"));
    assert!(full.retry_after() > 0);
    assert!(full.text().contains("caller_jobs"), "{}", full.text());
    let summary = gate.get_with("/v1/deliveries", &[]).await.json();
    let q = &summary["queues"][0];
    assert_eq!(
        (q["sent"].as_u64(), q["queued"].as_u64().unwrap_or(0) + q["waiting"].as_u64().unwrap_or(0)),
        (Some(1), 3),
        "{summary}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_a_dead_instances_jobs_are_taken_over_after_their_lease_and_none_is_sent_twice() {
    // At once: each waits out its 5 s leases.
    let [redis, cluster] = Store::redis_and_cluster();
    tokio::join!(taken_over(&redis, false), taken_over(&cluster, false));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_a_dead_instances_sends_in_flight_end_unknown_and_the_other_instance_sends_the_rest_once() {
    let redis = Store::Redis(support::redis_server::RedisServer::start());
    taken_over(&redis, true).await;
}

/// SIGKILL of a wxgate process on `store` (Redis or Cluster) with sends
/// held at WeChat; a second process takes its jobs over. `many`: jobs to
/// 100 recipients, up to 64 in flight at the kill (else to one recipient:
/// one at a time, the 11th held).
async fn taken_over(store: &Store, many: bool) {
    let held = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let gate_replies = held.clone();
    let (mock, _tokens) =
        wechat(move |_, n| Reply::Gated { gate: gate_replies.clone(), then: Box::new(msgid(n)) }).await;
    let dir = TempDir::new(&format!("queue-kill-{}", store.name()));
    let config = ConfigToml::new(&mock.url())
        .server("upstream_timeout", "30s")
        .with(store.toml("qk"))
        .with(rules(1000, "day"))
        .with(account_toml(&dir, APPID, "official_account", SECRET, ""))
        .with("[queue]\nlease = \"5s\"\nmax_in_flight = 64\n".to_owned())
        .to_string();
    let env = [("WXGATE_TOKEN_KEY", "5f0c9a3e7b2d4f6a8c1e3b5d7f9a0c2e4b6d8f1a3c5e7b9d0f2a4c6e8b1d3f5a")];
    let tag = |i: &str| format!("queue-kill-{}-{i}", store.name());
    let mut first = support::process::spawn(&config, &tag("a"), &env).unwrap_or_else(|log| panic!("{log}"));
    // Many: 100 answered grow the window to its 64, then 64 held at WeChat.
    let jobs: usize = if many { 200 } else { 100 };
    for i in 0..jobs {
        // To one recipient (one at a time, in order), or to each its own.
        let to = if many { format!("k{i}") } else { "k".to_owned() };
        let body = format!(r#"{{"touser":"{to}","n":{i}}}"#);
        queued_at(first.url(&format!("/@{APPID}{SEND}")), "default", body).await;
    }
    // 10 answered; then the 11th held at WeChat (sending), the rest behind
    // it; or, to many, more sends on their way.
    held.add_permits(if many { 100 } else { 10 });
    let at_kill = if many { 150 } else { 11 };
    eventually_async("the sends held at WeChat", PATIENCE, async || sends(&mock) >= at_kill).await;
    first.kill();
    // Another instance finds the dead one's leases and, once they run out
    // (5 s), ends its sending job unknown and sends the rest.
    let second = support::process::spawn(&config, &tag("b"), &env).unwrap_or_else(|log| panic!("{log}"));
    held.add_permits(jobs * 2);
    let mut summary = serde_json::Value::Null;
    eventually_async("every job ended", std::time::Duration::from_secs(40), async || {
        summary = second.get("/v1/deliveries").await.json();
        let q = &summary["queues"][0];
        q["queued"] == 0 && q["waiting"] == 0 && q["sending"] == 0
    })
    .await;
    let q = &summary["queues"][0];
    let (sent, unknown) = (q["sent"].as_u64().unwrap_or(0), q["unknown"].as_u64().unwrap_or(0));
    let mut bodies: Vec<String> = mock
        .calls()
        .into_iter()
        .filter(|c| c.path_and_query.starts_with(SEND))
        .map(|c| String::from_utf8_lossy(&c.body).into_owned())
        .collect();
    let total = bodies.len();
    bodies.sort();
    bodies.dedup();
    assert_eq!(bodies.len(), total, "none twice: {summary}");
    assert_eq!(sent + unknown, jobs as u64, "every job ended once: {summary}");
    if many {
        // The sends under way at the kill end unknown (at most its window
        // of 64, and at least the 50 held at WeChat); none is sent again.
        assert!((50..=64).contains(&unknown), "{summary}");
        eprintln!("{} sends under way at the kill ended unknown; {total} reached WeChat", unknown);
        assert!(total - sent as usize <= unknown as usize, "{total} reached WeChat: {summary}");
    } else {
        assert_eq!((sent, unknown), (jobs as u64 - 1, 1), "{summary}");
        assert_eq!(total, jobs, "each message reached WeChat once, the unknown one before the kill");
    }
    drop(second);
}

/// The console's queue view and job actions (admin API): per caller and
/// rule, depth, ends and when drained; one delivery by caller and id;
/// cancelled by hand once, then 409; never from another site.
#[tokio::test]
async fn the_admin_api_shows_queues_per_caller_and_cancels_a_delivery_by_hand() {
    let (mock, _tokens) = wechat(|_, n| msgid(n)).await;
    let dir = TempDir::new("queue-admin");
    let gate = gate(&mock, &dir, &rules(1, "1m"), "", &caller("hr").to_string()).await;
    let first = queued(&gate, "hr", SEND, "{}").await;
    until_state(&gate, "hr", &first, "sent").await;
    let id = queued(&gate, "hr", SEND, "{}").await;
    until_state(&gate, "hr", &id, "waiting").await;
    let addr = gate.admin_addr();

    let queues = support::admin(addr, "GET", "/v1/queues", None).await;
    assert_eq!(queues.status, 200, "{}", queues.text());
    let q = &queues.json()["queues"][0];
    assert_eq!(
        (q["caller"].as_str(), q["rule"].as_str(), q["accounts"].as_u64()),
        (Some("hr"), Some("template_send"), Some(1)),
        "{q}"
    );
    assert_eq!((q["sent"].as_u64(), q["waiting"].as_u64(), q["queued"].as_u64()), (Some(1), Some(1), Some(0)), "{q}");
    assert!(q["oldest_age_seconds"].is_u64(), "{q}");
    assert!(q["drained_at"].as_str().is_some_and(|t| t.ends_with('Z')), "one waiting send of 1 a minute: {q}");

    let path = format!("/v1/deliveries/hr/{id}");
    let job = support::admin(addr, "GET", &path, None).await;
    assert_eq!(job.status, 200, "{}", job.text());
    assert_eq!((job.json()["state"].as_str(), job.json()["caller"].as_str()), (Some("waiting"), Some("hr")));
    assert!(job.json().get("body").is_none(), "never the message");
    assert_eq!(support::admin(addr, "GET", &format!("/v1/deliveries/other/{id}"), None).await.status, 404);
    assert_eq!(support::admin(addr, "GET", "/v1/deliveries/hr/not-an-id", None).await.status, 400);
    // A page on another site cannot cancel it.
    let forged = support::admin_with(addr, "DELETE", &path, &[("origin", "http://attacker.example")]).await;
    assert_eq!(forged.status, 403, "{}", forged.text());
    let cancelled = support::admin(addr, "DELETE", &path, None).await;
    assert_eq!(cancelled.status, 200, "{}", cancelled.text());
    assert_eq!(cancelled.json()["state"], "cancelled");
    let again = support::admin(addr, "DELETE", &path, None).await;
    assert_eq!((again.status.as_u16(), again.json()["state"].as_str()), (409, Some("cancelled")));
    gate.advance(Duration::from_secs(120));
    gate.settle().await;
    assert_eq!(mock.calls().iter().filter(|c| c.path_and_query.starts_with(SEND)).count(), 1, "never sent");
    let q = support::admin(addr, "GET", "/v1/queues", None).await.json();
    assert_eq!(
        (q["queues"][0]["cancelled"].as_u64(), q["queues"][0]["drained_at"].as_str().is_some()),
        (Some(1), true),
        "{q}"
    );
}

/// Redis refuses writes for a moment while WeChat's answers to sends under
/// way come back: each job's end is written when Redis takes it again
/// (asked again within milliseconds), not left to its lease (10 minutes
/// here, and then the job would end `unknown` though WeChat took it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_end_the_store_could_not_take_at_once_is_written_when_it_answers_again() {
    let redis = support::redis_server::RedisServer::start();
    let (mock, _tokens, slow) = slow_wechat().await;
    let dir = TempDir::new("queue-store-blip");
    let key = dir.write_secret("token.key", "5f0c9a3e7b2d4f6a8c1e3b5d7f9a0c2e4b6d8f1a3c5e7b9d0f2a4c6e8b1d3f5a\n");
    let config = ConfigToml::new(&mock.url())
        .server("upstream_timeout", "30s")
        .with(support::StoreToml::redis(&redis.url()).set("key_prefix", "qb").set("timeout", "100ms"))
        .with(rules(1000, "day"))
        .with(account_toml(&dir, APPID, "official_account", SECRET, ""))
        .with(format!("[tokens]\nkey_file = \"{}\"\n", key.display()))
        .with("[queue]\nlease = \"10m\"\n".to_owned());
    let gate = Gate::start_redis_on_manual_clock(config).await;
    let mut ids = Vec::new();
    // As many as a new queue's first window (4): all out at once.
    for i in 0..4 {
        ids.push(queued(&gate, "default", SEND, &format!(r#"{{"slow":{i},"touser":"b{i}"}}"#)).await);
    }
    eventually_async("4 sends held at WeChat", PATIENCE, async || sends(&mock) == 4).await;
    // Redis refuses every write for a moment (NOREPLICAS: as a master that
    // lost its replicas under `min-replicas-to-write`), while WeChat answers.
    assert!(redis.command("CONFIG SET min-replicas-to-write 1").contains("OK"));
    slow.add_permits(4);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(redis.command("CONFIG SET min-replicas-to-write 0").contains("OK"));
    for id in &ids {
        let done = until_state(&gate, "default", id, "sent").await;
        assert_eq!(done["attempts"], 1, "{done}");
    }
    assert_eq!(sends(&mock), 4, "each once");
}

/// A call that names no caller (the access log's `caller="default"`,
/// `caller_label="other"`): the admin API finds its delivery by either
/// name; the proxy listener's `Location` path asked of the admin listener
/// says where it is served and which admin route to use; the caller's own
/// `GET /v1/deliveries` is logged as answered by wxgate and counted as no
/// call of WeChat's (issue 65).
#[tokio::test]
async fn an_unnamed_callers_delivery_is_found_by_the_name_its_log_line_shows_and_the_proxy_path_says_where_it_lives() {
    let (mock, _tokens) = wechat(|_, n| msgid(n)).await;
    let dir = TempDir::new("queue-unnamed");
    let queue = format!("[queue]\nfile = \"{}\"\n", dir.path().join("queue.db").display());
    let text = ConfigToml::new(&mock.url())
        .with("[log]\nformat = \"json\"\n")
        .with(rules(100, "day"))
        .with(account_toml(&dir, APPID, "official_account", SECRET, ""))
        .with(queue);
    let wx = support::process::spawn(&text.to_string(), "queue-unnamed", &[]).expect("serving");
    let admin = wx.admin.expect("an admin listener");
    let post = http::Request::post(wx.url(&format!("/@{APPID}{SEND}")))
        .header(ASYNC.0, ASYNC.1)
        .body(http_body_util::Full::new(bytes::Bytes::from_static(b"{}")))
        .expect("request");
    let a = support::send(post).await;
    assert_eq!(a.status, 202, "{}", a.text());
    let id = a.json()["delivery"].as_str().expect("an id").to_owned();
    let location = a.header("location").expect("a Location").to_owned();
    assert_eq!(wx.get("/v1/deliveries").await.status, 200);

    let there = support::admin(admin, "GET", &location, None).await;
    assert_eq!(there.status, 404);
    let why = there.json()["error"].as_str().unwrap_or_default().to_owned();
    assert!(why.starts_with(&format!("{location} is served on the proxy listener")), "{why}");
    assert!(why.contains(&format!("GET or DELETE /v1/deliveries/{{caller}}/{id}")), "{why}");

    let field = |v: &serde_json::Value, f: &str| v[f].as_str().unwrap_or_default().to_owned();
    let line_of = |path: &str| {
        let logged = wx.logged();
        logged
            .lines()
            .filter(|l| l.contains("wxgate::access"))
            .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("one JSON object per line"))
            .find(|v| field(v, "path") == path)
    };
    let queued = eventually_some("the queued call's log line", PATIENCE, || line_of(SEND)).await;
    assert_eq!((field(&queued, "caller"), field(&queued, "caller_label")), ("default".into(), "other".into()));
    let listed = eventually_some("the list's log line", PATIENCE, || line_of("/v1/deliveries")).await;
    assert_eq!(field(&listed, "outcome"), "answered", "answered by wxgate, never forwarded: {listed}");
    let forwarded = r#"wxgate_calls_total{rule="_none",outcome="forwarded"}"#;
    assert_eq!(wx.metric(forwarded).await.unwrap_or(0.0), 0.0, "no call of WeChat's");

    for name in ["default", "other"] {
        let job = support::admin(admin, "GET", &format!("/v1/deliveries/{name}/{id}"), None).await;
        assert_eq!(job.status, 200, "as {name}: {}", job.text());
        assert_eq!(job.json()["caller"], "other", "kept under the metrics label of undeclared callers");
    }
}
