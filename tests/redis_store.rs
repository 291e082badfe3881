//! The Redis store through wxgate's listener: shared penalties, script
//! reloading after NOSCRIPT, authentication.

mod support;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::process;
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

#[tokio::test]
async fn a_penalty_seen_by_one_instance_stops_every_instance() {
    let redis = RedisServer::start();
    let mock = MockWeChat::start().await;
    mock.respond(|_| errcode_reply(45009));
    let text = redis_config(&mock, &redis.url());
    let a = gate_on(&text).await;
    let b = gate_on(&text).await;
    let path = "/cgi-bin/message/template/send?access_token=T";
    let first = get_at(a.addr, path).await;
    assert_eq!((first.status.as_u16(), first.retry_after()), (429, 60));
    mock.respond(|_| ok_reply());
    let other = get_at(b.addr, path).await;
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
    assert_eq!(get_at(gate.addr, "/cgi-bin/message/template/send").await.status, 200);
    // A Redis restart or failover loses the script cache: EVALSHA answers NOSCRIPT.
    assert!(redis.command("SCRIPT FLUSH").starts_with("+OK"));
    assert_eq!(get_at(gate.addr, "/cgi-bin/message/template/send").await.status, 200);
    assert_eq!(mock.count(), 2);
    let count = redis.command("HGET wxgate:{default}:tpl day.n");
    assert!(count.contains("\r\n2\r\n"), "both calls counted in Redis: {count}");
}

/// Whether the wxgate binary starts serving on `config`, and what it logged.
fn serve_binary(config: &str, password_env: Option<&str>) -> (bool, String) {
    let env: Vec<(&str, &str)> = password_env.map(|p| ("WXGATE_REDIS_PASSWORD", p)).into_iter().collect();
    match process::spawn(config, &format!("auth-{}", password_env.is_some()), &env) {
        Ok(_) => (true, String::new()),
        Err(log) => (false, log),
    }
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
    let wrong = redis_config(&mock, &format!("redis://:nope@127.0.0.1:{}", redis.port));
    let (ok, log) = serve_binary(&wrong, None);
    assert!(!ok);
    assert!(!log.contains("nope"), "the password never reaches the log\n{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_instances_concurrency_slots_come_back_after_the_lease() {
    let redis = RedisServer::start();
    let mock = MockWeChat::start().await;
    mock.respond(|_| Reply::Hang);
    let rules =
        "[[rule]]\nname = \"remark\"\nmatch = [\"/cgi-bin/externalcontact/remark\"]\nlimits = []\nconcurrency = 1\n";
    let config = config_text(
        &format!("http://{}", mock.addr),
        &format!("[store]\nkind = \"redis\"\nurl = \"{}\"\ntimeout = \"2s\"\nlease = \"1s\"\n{rules}", redis.url()),
    )
    .replace("upstream_timeout = \"2s\"", "upstream_timeout = \"60s\"");
    let mut doomed = process::spawn(&config, "lease-a", &[]).expect("first instance");
    let survivor = process::spawn(&config, "lease-b", &[]).expect("second instance");
    // The first instance's call hangs at WeChat, holding the only slot.
    let addr = doomed.addr;
    let _hanging = tokio::spawn(async move { get_at(addr, "/cgi-bin/externalcontact/remark").await });
    eventually("the first call reaching the mock", PATIENCE, || mock.count() >= 1).await;
    // Alive, it renews the lease (every lease / 3): the slot stays taken.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let a = get_at(survivor.addr, "/cgi-bin/externalcontact/remark").await;
    assert_eq!(a.header("x-wxgate-reason"), Some("concurrency"), "a live instance keeps its slot past one lease");
    doomed.kill();
    let killed = Instant::now();
    // Dead, its lease runs out within 1 s and the slot comes back.
    mock.respond(|_| ok_reply());
    eventually_async("the dead instance's slot coming back", Duration::from_secs(5), async || {
        let a = get_at(survivor.addr, "/cgi-bin/externalcontact/remark").await;
        if a.status != 200 {
            assert_eq!(a.header("x-wxgate-reason"), Some("concurrency"));
        }
        a.status == 200
    })
    .await;
    // Within the 1 s lease, plus polling and scheduling slack on a loaded machine.
    assert!(killed.elapsed() <= Duration::from_secs(3), "took {:?}", killed.elapsed());
    assert_eq!(mock.count(), 2);
}

/// Calls to EVALSHA Redis has answered so far.
fn evalsha_calls(redis: &RedisServer) -> u64 {
    let stats = redis.command("INFO commandstats");
    stats
        .lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .and_then(|l| l.split("calls=").nth(1))
        .and_then(|v| v.split(',').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn known_refusals_are_answered_without_asking_redis() {
    let redis = RedisServer::start();
    let mock = MockWeChat::start().await;
    let one_a_day = "[[rule]]\nname = \"tpl\"\nmatch = [\"/cgi-bin/message/template/send\"]\nlimits = [{ count = 1, per = \"day\" }]\n";
    for (cache, max_asks) in [("true", 5), ("false", 51)] {
        let store = format!("[store]\nkind = \"redis\"\nurl = \"{}\"\ntimeout = \"2s\"\nrefusal_cache = {cache}\nkey_prefix = \"c{cache}\"\n", redis.url());
        let gate = gate_on(&config_text(&format!("http://{}", mock.addr), &format!("{store}{one_a_day}"))).await;
        assert_eq!(get_at(gate.addr, "/cgi-bin/message/template/send").await.status, 200);
        let before = evalsha_calls(&redis);
        for _ in 0..50 {
            let a = get_at(gate.addr, "/cgi-bin/message/template/send").await;
            assert_eq!((a.status.as_u16(), a.header("x-wxgate-reason")), (429, Some("quota")));
        }
        let asked = evalsha_calls(&redis) - before;
        eprintln!("refusal_cache = {cache}: 50 refusals asked Redis {asked} times");
        if cache == "true" {
            assert!(asked <= max_asks, "asked Redis {asked} times for 50 known refusals");
        } else {
            assert_eq!(asked, max_asks - 1, "without the cache every refusal is a round trip");
        }
    }
}

/// Clients that hang up while their decisions are queued or in flight (here:
/// Redis frozen, every client giving up) must not leave their account's
/// queue waiting for a leader that never comes: once Redis answers again,
/// every call is decided by it. With `fallback = "deny"` a stuck queue would
/// show as 503s after the 2 s timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_leaving_mid_decision_never_stall_the_account() {
    let redis = RedisServer::start();
    let mock = MockWeChat::start().await;
    let text = config_text(
        &format!("http://{}", mock.addr),
        &format!(
            "[store]\nkind = \"redis\"\nurl = \"{}\"\ntimeout = \"2s\"\nfallback = \"deny\"\n\n\
             [[rule]]\nname = \"tpl\"\nmatch = [\"/cgi-bin/message/template/send\"]\n\
             limits = [{{ count = 100000, per = \"1s\" }}]\n",
            redis.url()
        ),
    );
    let gate = gate_on(&text).await;
    let addr = gate.addr;
    let path = "/cgi-bin/message/template/send?access_token=T";
    for round in 0..3 {
        redis.pause();
        let leaving: Vec<_> = (0..16)
            .map(|_| tokio::spawn(tokio::time::timeout(Duration::from_millis(150), get_at(addr, path))))
            .collect();
        for t in leaving {
            assert!(t.await.expect("task").is_err(), "round {round}: no answer while Redis is frozen");
        }
        redis.resume();
        let calls: Vec<_> = (0..16).map(|_| tokio::spawn(get_at(addr, path))).collect();
        for t in calls {
            let answer = t.await.expect("task");
            assert_eq!(answer.status, 200, "round {round}: {}", answer.text());
        }
    }
}
