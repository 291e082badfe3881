//! The Redis store through wxgate's listener: shared penalties, script
//! reloading after NOSCRIPT, authentication.

mod support;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;

use support::redis_server::RedisServer;
use support::*;
use wxgate::clock::SystemClock;
use wxgate::config::Config;

const RULE: &str = r#"
[[rule]]
name = "tpl"
match = ["/cgi-bin/message/template/send"]
limits = [{ count = 1000, per = "day" }]
"#;

fn redis_config(mock: &MockWeChat, url: &str) -> String {
    config_text(
        &format!("http://{}", mock.addr),
        &format!("[store]\nkind = \"redis\"\nurl = \"{url}\"\ntimeout = \"2s\"\n{RULE}"),
    )
}

async fn gate_on(text: &str) -> wxgate::server::Running {
    let config = Config::parse(text, Path::new("test.toml")).expect("config");
    wxgate::start(config, Arc::new(SystemClock)).await.expect("start on redis")
}

async fn get(addr: std::net::SocketAddr, path: &str) -> Answer {
    send(
        http::Request::get(format!("http://{addr}{path}"))
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .expect("request"),
    )
    .await
}

#[tokio::test]
async fn a_penalty_seen_by_one_instance_stops_every_instance() {
    let redis = RedisServer::start();
    let mock = MockWeChat::start().await;
    mock.respond(|_| errcode_reply(45009));
    let text = redis_config(&mock, &redis.url());
    let a = gate_on(&text).await;
    let b = gate_on(&text).await;
    let path = "/cgi-bin/message/template/send?access_token=T";
    let first = get(a.addr, path).await;
    assert_eq!((first.status.as_u16(), first.retry_after()), (429, 60));
    mock.respond(|_| ok_reply());
    let other = get(b.addr, path).await;
    assert_eq!(other.status, 429);
    assert_eq!(other.header("x-wxgate-reason"), Some("penalty"));
    assert!((59..=60).contains(&other.retry_after()));
    assert_eq!(mock.count(), 1, "the second instance never reached the punished account");
}

#[tokio::test]
async fn scripts_come_back_after_script_flush() {
    let redis = RedisServer::start();
    let mock = MockWeChat::start().await;
    let gate = gate_on(&redis_config(&mock, &redis.url())).await;
    assert_eq!(get(gate.addr, "/cgi-bin/message/template/send").await.status, 200);
    // A Redis restart or failover loses the script cache: EVALSHA answers NOSCRIPT.
    assert!(redis.command("SCRIPT FLUSH").starts_with("+OK"));
    assert_eq!(get(gate.addr, "/cgi-bin/message/template/send").await.status, 200);
    assert_eq!(mock.count(), 2);
    let count = redis.command("HGET wxgate:{default}:tpl day.n");
    assert!(count.contains("\r\n2\r\n"), "both calls counted in Redis: {count}");
}

#[tokio::test]
async fn a_redis_that_is_down_gives_503_not_a_hang() {
    let redis = RedisServer::start();
    let mock = MockWeChat::start().await;
    let gate = gate_on(&redis_config(&mock, &redis.url())).await;
    drop(redis);
    let a = get(gate.addr, "/cgi-bin/message/template/send").await;
    assert_eq!(a.status, 503);
    assert_eq!(a.json()["errcode"], -1);
    assert_eq!(mock.count(), 0, "no decision, no call");
}

/// Starts the wxgate binary and returns the first line that says it serves
/// or why it could not.
fn serve_binary(config: &str, password_env: Option<&str>) -> (bool, String) {
    let path = std::env::temp_dir().join(format!("wxgate-auth-{}-{}.toml", std::process::id(), password_env.is_some()));
    std::fs::write(&path, config).expect("write config");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_wxgate"));
    cmd.args(["--config", path.to_str().expect("utf-8")]).stdout(Stdio::null()).stderr(Stdio::piped());
    cmd.env_remove("WXGATE_REDIS_PASSWORD");
    if let Some(pw) = password_env {
        cmd.env("WXGATE_REDIS_PASSWORD", pw);
    }
    let mut child = cmd.spawn().expect("spawn wxgate");
    let stderr = child.stderr.take().expect("stderr");
    let mut seen = String::new();
    let mut serving = false;
    for line in BufReader::new(stderr).lines().map_while(Result::ok) {
        seen.push_str(&line);
        seen.push('\n');
        if line.contains("wxgate serving") {
            serving = true;
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    (serving, seen)
}

#[tokio::test]
async fn password_from_the_url_or_the_environment() {
    let redis = RedisServer::start_with(&["--requirepass", "s3cret"]);
    let mock = MockWeChat::start().await;
    let plain = redis_config(&mock, &redis.url());
    let (ok, log) = serve_binary(&plain, None);
    assert!(!ok, "no password: must refuse to start\n{log}");
    assert!(log.contains(&format!("cannot use Redis at 127.0.0.1:{}", redis.port)) && log.contains("NOAUTH"), "{log}");
    assert!(!log.contains("s3cret"));
    let (ok, log) = serve_binary(&plain, Some("s3cret"));
    assert!(ok, "password from WXGATE_REDIS_PASSWORD\n{log}");
    let in_url = redis_config(&mock, &format!("redis://:s3cret@127.0.0.1:{}", redis.port));
    let (ok, log) = serve_binary(&in_url, None);
    assert!(ok, "password in the URL\n{log}");
    assert!(!log.contains("s3cret"), "the password never reaches the log\n{log}");
}
