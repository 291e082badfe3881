//! Queued delivery through a graceful stop (SIGTERM, as Kubernetes stops a
//! pod on every rollout): a send under way finishes and its job ends as
//! WeChat answered, not `unknown`; the stopping instance starts no other
//! send, and the next start sends the rest once.

use crate::support;

use std::sync::Arc;

use support::queue::{msgid, queued_at, wechat};
use support::temp::TempDir;
use support::tokens::{account_toml, APPID, SECRET};
use support::{eventually, eventually_async, rule, ConfigToml, Reply, PATIENCE};

const SEND: &str = "/cgi-bin/message/template/send";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_a_queued_send_under_way_finish_and_it_ends_sent_not_unknown() {
    let held = Arc::new(tokio::sync::Semaphore::new(0));
    let replies = held.clone();
    let (mock, _tokens) = wechat(move |_, n| Reply::Gated { gate: replies.clone(), then: Box::new(msgid(n)) }).await;
    let sends = || mock.calls().into_iter().filter(|c| c.path_and_query.starts_with(SEND)).count();
    let dir = TempDir::new("queue-sigterm");
    let token = rule("token").matching("/cgi-bin/token").matching("/cgi-bin/stable_token").limit(100, "day");
    let send = rule("template_send").matching(SEND).limit(1000, "day").set("queue", true);
    let config = ConfigToml::new(&mock.url())
        .server("upstream_timeout", "30s")
        .with(format!("[store]\nkind = \"memory\"\nstate_file = \"{}\"\n", dir.path().join("state.json").display()))
        .with(format!("{token}\n{send}"))
        .with(account_toml(&dir, APPID, "official_account", SECRET, ""))
        .to_string();
    let path = dir.path().join("wxgate.toml");
    std::fs::write(&path, &config).expect("config");
    let mut first = support::process::spawn_path(&path, &[]).unwrap_or_else(|log| panic!("{log}"));
    let mut ids = Vec::new();
    for i in 0..3 {
        // Three messages to one recipient: they go one at a time, in order.
        let body = format!(r#"{{"touser":"t","n":{i}}}"#);
        ids.push(queued_at(first.url(&format!("/@{APPID}{SEND}")), "default", body).await);
    }
    // The first send is at WeChat, unanswered; the two behind it wait their turn.
    eventually_async("the first send at WeChat", PATIENCE, async || sends() == 1).await;
    first.signal("-TERM");
    // WeChat answers once the instance waits for it, or has exited (as an
    // instance that does not wait would: its job then ends unknown).
    eventually("the instance stopping", PATIENCE, || {
        first.logged().contains("waiting for those under way") || !first.is_running()
    })
    .await;
    held.add_permits(10);
    assert_eq!(first.exit_code(PATIENCE).await, 0, "{}", first.logged());
    assert_eq!(sends(), 1, "a stopping instance starts no other send");
    let second = support::process::spawn_path(&path, &[]).unwrap_or_else(|log| panic!("{log}"));
    let state = |id: &str| {
        let path = format!("/v1/deliveries/{id}");
        let second = &second;
        async move { second.get(&path).await.json() }
    };
    let answered = state(&ids[0]).await;
    assert_eq!(answered["state"], "sent", "the send under way finished with WeChat's answer: {answered}");
    assert_eq!(answered["answer"]["body"]["msgid"], 1000, "{answered}");
    for id in &ids[1..] {
        let mut last = serde_json::Value::Null;
        eventually_async("the rest sent by the next start", PATIENCE, async || {
            last = state(id).await;
            last["state"] == "sent"
        })
        .await;
        assert_eq!(last["attempts"], 1, "{last}");
    }
    assert_eq!(sends(), 3, "each message once");
}
