//! Queued delivery follows the config, not just the start (issue 47): a
//! reload that adds the first `queue = true` rule turns it on at once (the
//! jobs store opened, the dispatcher running); a reload that moves the jobs
//! keeps the running store until a restart (no job lost); and with Redis
//! unreachable at start, a queued call gets 503 until Redis answers, then
//! queued delivery comes on by itself.

use crate::support;

use support::queue::{msgid, queued, submit, until_state, wechat, ASYNC};
use support::redis_server::RedisServer;
use support::temp::TempDir;
use support::tokens::{account_toml, APPID, SECRET};
use support::{eventually_async, rule, ConfigToml, Gate, StoreToml, PATIENCE};

const SEND: &str = "/cgi-bin/message/template/send";
const BODY: &str = r#"{"touser":"o1","template_id":"t","data":{}}"#;

/// The token rule and a template rule, queueing when `queue`.
fn rules(queue: bool) -> String {
    let token = rule("token").matching("/cgi-bin/token").matching("/cgi-bin/stable_token").limit(2000, "day");
    let send = rule("template_send").matching(SEND).limit(100, "day");
    let send = if queue { send.set("queue", true) } else { send };
    format!("{token}\n{send}")
}

/// A config in front of `mock` with [`rules`], the account [`APPID`] and
/// its jobs in `file` of `dir`.
fn config(mock: &support::MockWeChat, dir: &TempDir, queue: bool, file: &str) -> String {
    ConfigToml::new(&mock.url())
        .with(rules(queue))
        .with(account_toml(dir, APPID, "official_account", SECRET, ""))
        .with(format!("[queue]\nfile = \"{}\"\n", dir.join(file).display()))
        .to_string()
}

#[tokio::test]
async fn a_reload_that_adds_the_first_queue_rule_queues_at_once_and_one_that_moves_the_jobs_keeps_them() {
    let (mock, _tokens) = wechat(|_, n| msgid(n)).await;
    let dir = TempDir::new("queue-reload-on");
    let path = dir.write("rules.toml", &config(&mock, &dir, false, "a.db"));
    let gate = Gate::start_file(&path).await;
    let a = submit(&gate, "default", SEND, BODY, &[]).await;
    assert_eq!(a.status, 400, "no rule queues yet: {}", a.text());
    assert!(a.text().contains("does not queue"), "{}", a.text());

    dir.replace("rules.toml", &config(&mock, &dir, true, "a.db"));
    eventually_async("the reload", PATIENCE, async || gate.reloads().0 >= 1).await;
    let first = queued(&gate, "default", SEND, BODY).await;
    until_state(&gate, "default", &first, "sent").await;
    assert!(dir.join("a.db").exists(), "the jobs file the reload named");

    // Where jobs live needs a restart: the reload applies, the running
    // jobs file stays (with its jobs), the new one is not made.
    let before = gate.reloads().0;
    dir.replace("rules.toml", &config(&mock, &dir, true, "b.db"));
    eventually_async("the second reload", PATIENCE, async || gate.reloads().0 > before).await;
    assert_eq!(gate.reloads().1, 0, "not refused");
    let again = until_state(&gate, "default", &first, "sent").await;
    assert_eq!(again["answer"]["body"]["msgid"], 1000, "{again}");
    let second = queued(&gate, "default", SEND, BODY).await;
    until_state(&gate, "default", &second, "sent").await;
    assert!(!dir.join("b.db").exists(), "no second jobs file: the running one keeps the jobs");
    let sends = mock.calls().iter().filter(|c| c.path_and_query.starts_with(SEND)).count();
    assert_eq!(sends, 2, "each job sent once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_away_at_start_a_queued_call_gets_503_and_queued_delivery_comes_on_once_redis_answers() {
    let mut redis = RedisServer::start();
    redis.stop();
    let (mock, _tokens) = wechat(|_, n| msgid(n)).await;
    let dir = TempDir::new("queue-redis-later");
    let key = dir.write_secret("token.key", "5f0c9a3e7b2d4f6a8c1e3b5d7f9a0c2e4b6d8f1a3c5e7b9d0f2a4c6e8b1d3f5a\n");
    let config = ConfigToml::new(&mock.url())
        .with(rules(true))
        .with(account_toml(&dir, APPID, "official_account", SECRET, ""))
        .with(StoreToml::redis(&redis.url()).set("key_prefix", "ql").set("breaker_open", "100ms"))
        .with(format!("[tokens]\nkey_file = \"{}\"\n", key.display()));
    let gate = Gate::start_real_text(config).await;

    let a = submit(&gate, "default", SEND, BODY, &[]).await;
    assert_eq!(a.status, 503, "{}", a.text());
    assert_eq!(a.header("x-wxgate-reason"), Some("unavailable"));
    assert!(a.header("retry-after").is_some());
    assert!(a.text().contains("Redis has not answered"), "{}", a.text());
    let summary = gate.get("/v1/deliveries").await;
    assert_eq!(summary.status, 503, "{}", summary.text());

    redis.restart();
    let mut id = String::new();
    eventually_async("a queued call taken once Redis answers", PATIENCE, async || {
        let a = submit(&gate, "default", SEND, BODY, &[]).await;
        assert!([202, 503].contains(&a.status.as_u16()), "{} {}", a.status, a.text());
        if a.status == 202 {
            id = a.json()["delivery"].as_str().expect("an id").to_owned();
        }
        a.status == 202
    })
    .await;
    let done = until_state(&gate, "default", &id, "sent").await;
    assert_eq!(done["attempts"], 1, "{done}");
    let sends = mock.calls().iter().filter(|c| c.path_and_query.starts_with(SEND)).count();
    assert_eq!(sends, 1, "sent once; the refused calls stored nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_a_sighup_that_adds_the_first_queue_rule_queues_at_once() {
    let redis = RedisServer::start();
    let (mock, _tokens) = wechat(|_, n| msgid(n)).await;
    let dir = TempDir::new("queue-reload-redis");
    let config = |queue: bool| {
        ConfigToml::new(&mock.url())
            .with(rules(queue))
            .with(account_toml(&dir, APPID, "official_account", SECRET, ""))
            .with(StoreToml::redis(&redis.url()).set("key_prefix", "qr"))
            .to_string()
    };
    let path = dir.write("rules.toml", &config(false));
    let env = [("WXGATE_TOKEN_KEY", "5f0c9a3e7b2d4f6a8c1e3b5d7f9a0c2e4b6d8f1a3c5e7b9d0f2a4c6e8b1d3f5a")];
    let instance = support::process::spawn_path(&path, &env).unwrap_or_else(|log| panic!("{log}"));
    let at = format!("/@{APPID}{SEND}");
    let a = instance.post_with(&at, BODY, &[ASYNC]).await;
    assert_eq!(a.status, 400, "no rule queues yet: {}", a.text());

    dir.replace("rules.toml", &config(true));
    instance.signal("-HUP");
    let mut id = String::new();
    eventually_async("the reload turning queued delivery on", PATIENCE, async || {
        let a = instance.post_with(&at, BODY, &[ASYNC]).await;
        assert!([202, 400].contains(&a.status.as_u16()), "{} {}", a.status, a.text());
        if a.status == 202 {
            id = a.json()["delivery"].as_str().expect("an id").to_owned();
        }
        a.status == 202
    })
    .await;
    let path = format!("/v1/deliveries/{id}");
    eventually_async("the job sent", PATIENCE, async || instance.get_with(&path, &[]).await.json()["state"] == "sent")
        .await;
    let sends = mock.calls().iter().filter(|c| c.path_and_query.starts_with(SEND)).count();
    assert_eq!(sends, 1, "sent once");
}
