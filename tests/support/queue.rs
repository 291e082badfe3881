//! Queued delivery over real sockets: a mock WeChat that issues tokens and
//! answers message sends, a gate with a jobs file and an `[[account]]`
//! whose token it holds, submissions with `Prefer: respond-async`, and
//! waiting for a delivery's state (tests/queue.rs, tests/queue_metrics.rs);
//! a gate on the system clock on either store, for real pace
//! (tests/queue_pace.rs).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::backing::Backing;
use super::temp::TempDir;
use super::tokens::{account_toml, WeChatTokens, APPID, SECRET};
use super::{eventually_async, within_async, ConfigToml, Gate, MockWeChat, Recorded, Reply, PATIENCE};

/// Asks for queued delivery.
pub const ASYNC: (&str, &str) = ("prefer", "respond-async");

/// Where a message send's path starts.
pub const MESSAGE: &str = "/cgi-bin/message/";

/// A mock WeChat issuing tokens; `send` answers each message send whose
/// token is valid (with the sends seen before it), as WeChat checks the
/// token first.
pub async fn wechat(send: impl Fn(&Recorded, usize) -> Reply + Send + Sync + 'static) -> (MockWeChat, WeChatTokens) {
    let mock = MockWeChat::start().await;
    let tokens = WeChatTokens::new();
    let reply = tokens.responder();
    let sends = Arc::new(AtomicUsize::new(0));
    mock.respond(move |rec| {
        let r = reply(rec);
        if rec.path_and_query.starts_with(MESSAGE)
            && matches!(&r, Reply::Json { body, .. } if body.contains("\"errcode\":0"))
        {
            return send(rec, sends.fetch_add(1, Ordering::SeqCst));
        }
        r
    });
    (mock, tokens)
}

/// A mock WeChat as [`wechat`] that takes every send but holds each whose
/// body starts with `{"slow"` until the test adds a permit to the semaphore
/// returned.
pub async fn slow_wechat() -> (MockWeChat, WeChatTokens, Arc<tokio::sync::Semaphore>) {
    let slow = Arc::new(tokio::sync::Semaphore::new(0));
    let held = slow.clone();
    let (mock, tokens) = wechat(move |rec, n| {
        if rec.body.starts_with(b"{\"slow\"") {
            Reply::Gated { gate: held.clone(), then: Box::new(msgid(n)) }
        } else {
            msgid(n)
        }
    })
    .await;
    (mock, tokens, slow)
}

/// WeChat's success with msgid `1000 + n`.
pub fn msgid(n: usize) -> Reply {
    Reply::Json {
        body: format!(r#"{{"errcode":0,"errmsg":"ok","msgid":{}}}"#, 1000 + n),
        content_type: "application/json; encoding=utf-8",
    }
}

/// A gate in front of `mock` with `rules`, the account [`APPID`] (whose
/// token wxgate fetches), its jobs in `dir` with `[queue]` lines `queue`,
/// and `extra` (callers, ...).
pub async fn gate(mock: &MockWeChat, dir: &TempDir, rules: &str, queue: &str, extra: &str) -> Gate {
    let queue = format!("[queue]\nfile = \"{}\"\n{queue}\n", dir.path().join("queue.db").display());
    let config = ConfigToml::new(&mock.url())
        .with(rules.to_owned())
        .with(account_toml(dir, APPID, "official_account", SECRET, ""))
        .with(queue)
        .with(extra.to_owned());
    Gate::start_text(config).await
}

/// A gate on the system clock (real time: pace, leases, slow answers) on
/// `backing` (memory: its jobs in SQLite in `dir`; Redis: there, its
/// account's token sealed with a key in `dir`), with `config`'s `[server]`,
/// `rules`, the account [`APPID`], `[queue]` lines `queue` and `extra`.
pub async fn real_gate(
    backing: &Backing,
    config: ConfigToml,
    dir: &TempDir,
    rules: &str,
    queue: &str,
    extra: &str,
) -> Gate {
    let config = config
        .with(rules.to_owned())
        .with(account_toml(dir, APPID, "official_account", SECRET, ""))
        .with(extra.to_owned());
    match backing.store() {
        None => {
            let file = dir.path().join("queue.db");
            Gate::start_real_text(config.with(format!("[queue]\nfile = \"{}\"\n{queue}\n", file.display()))).await
        }
        Some(store) => {
            let key =
                dir.write_secret("token.key", "5f0c9a3e7b2d4f6a8c1e3b5d7f9a0c2e4b6d8f1a3c5e7b9d0f2a4c6e8b1d3f5a\n");
            let tokens = format!("[tokens]\nkey_file = \"{}\"\n", key.display());
            let config = config.with(store.set("key_prefix", "qp")).with(tokens).with(format!("[queue]\n{queue}\n"));
            Gate::start_real_text(config).await
        }
    }
}

/// `caller`'s first queue in `GET /v1/deliveries` (its counts by state).
pub async fn summary(gate: &Gate, caller: &str) -> serde_json::Value {
    let a = gate.get_with("/v1/deliveries", &[("x-wx-caller", caller)]).await;
    assert_eq!(a.status, 200, "{}", a.text());
    a.json()["queues"][0].clone()
}

/// Waits up to `limit` until `caller`'s queue has no job queued, waiting
/// or sending: its summary then.
pub async fn until_ended(gate: &Gate, caller: &str, limit: std::time::Duration) -> serde_json::Value {
    let mut last = serde_json::Value::Null;
    eventually_async(&format!("{caller}'s jobs all ended"), limit, async || {
        last = summary(gate, caller).await;
        ["queued", "waiting", "sending"].iter().all(|s| last[*s] == 0)
    })
    .await;
    last
}

/// Submits `body` to `path` of [`APPID`] as `caller`, asking for queued
/// delivery (and `headers`): the answer.
pub async fn submit(gate: &Gate, caller: &str, path: &str, body: &str, headers: &[(&str, &str)]) -> super::Answer {
    submit_at(gate.url(&format!("/@{APPID}{path}")), caller, body.to_owned(), headers).await
}

/// Submits `body` to `url` (a gate's or a wxgate process's, the account in
/// its path) as `caller`, asking for queued delivery (and `headers`).
pub async fn submit_at(url: String, caller: &str, body: String, headers: &[(&str, &str)]) -> super::Answer {
    let mut req = http::Request::post(url).header(ASYNC.0, ASYNC.1).header("x-wx-caller", caller);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    super::send(req.body(http_body_util::Full::new(bytes::Bytes::from(body))).expect("request")).await
}

/// Submits and expects 202: the delivery's id.
pub async fn queued(gate: &Gate, caller: &str, path: &str, body: &str) -> String {
    queued_with(gate, caller, path, body, &[]).await
}

/// [`queued`] with these headers too (`Idempotency-Key`, a deadline, a callback).
pub async fn queued_with(gate: &Gate, caller: &str, path: &str, body: &str, headers: &[(&str, &str)]) -> String {
    delivery(submit(gate, caller, path, body, headers).await)
}

/// [`submit_at`] expecting 202: the delivery's id (a future of its own,
/// to be spawned, for a caller named by a `'static` string).
pub async fn queued_at(url: String, caller: &str, body: String) -> String {
    delivery(submit_at(url, caller, body, &[]).await)
}

/// The delivery's id of a 202.
fn delivery(a: super::Answer) -> String {
    assert_eq!(a.status, 202, "{}", a.text());
    a.json()["delivery"].as_str().expect("a delivery id").to_owned()
}

/// Polls `/v1/deliveries/<id>` (as `caller`) until its state is `state`.
pub async fn until_state(gate: &Gate, caller: &str, id: &str, state: &str) -> serde_json::Value {
    let path = format!("/v1/deliveries/{id}");
    let mut last = serde_json::Value::Null;
    let seen = within_async(PATIENCE, async || {
        last = gate.get_with(&path, &[("x-wx-caller", caller)]).await.json();
        (last["state"] == state).then_some(())
    })
    .await;
    assert!(seen.is_some(), "delivery {id} not {state} within {PATIENCE:?}; last seen: {last}");
    last
}
