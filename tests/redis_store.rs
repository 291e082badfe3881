//! The Redis store through wxgate's listener: shared penalties, script
//! reloading after NOSCRIPT, authentication.

use crate::support;

use std::time::{Duration, Instant};

use support::process;
use support::redis_server::RedisServer;
use support::*;

fn tpl() -> RuleToml {
    rule("tpl").matching("/cgi-bin/message/template/send")
}

/// A gate on Redis at `url`, with 1000 calls a day on `tpl`.
fn redis_config(mock: &MockWeChat, url: &str) -> ConfigToml {
    ConfigToml::new(&mock.url()).with(StoreToml::redis(url)).with(tpl().limit(1000, "day"))
}

#[tokio::test]
async fn a_penalty_seen_by_one_instance_stops_every_instance() {
    let redis = RedisServer::start();
    let mock = MockWeChat::start().await;
    mock.respond(|_| errcode_reply(45009));
    let config = redis_config(&mock, &redis.url());
    let a = Gate::start_real_text(&config).await;
    let b = Gate::start_real_text(&config).await;
    let path = "/cgi-bin/message/template/send?access_token=T";
    let first = a.get(path).await;
    assert_eq!((first.status.as_u16(), first.retry_after()), (429, 60));
    mock.respond(|_| ok_reply());
    let other = b.get(path).await;
    assert_eq!(other.status, 429);
    assert_eq!(other.header("x-wxgate-reason"), Some("penalty"));
    assert!((59..=60).contains(&other.retry_after()));
    assert_eq!(mock.count(), 1, "the second instance never reached the punished account");
}

/// With quota leases: the other instance holds a lease of the pair (60 s
/// of calls) when the first sees a 45009. Its keeper reads the penalty of
/// every pair it holds a lease of each 100 ms, so its lease ends within a
/// tick, not at the lease's end: its calls are refused for the penalty
/// long before the lease would have run out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_quota_leases_a_penalty_seen_by_one_instance_ends_the_others_lease() {
    let redis = RedisServer::start();
    let mock = MockWeChat::start().await;
    let store = StoreToml::redis(&redis.url()).set("quota_leases", true).set("quota_lease_span", "60s");
    let config = ConfigToml::new(&mock.url()).with(store).with(tpl().limit(1000, "day"));
    let a = Gate::start_real_text(&config).await;
    let b = Gate::start_real_text(&config).await;
    let path = "/cgi-bin/message/template/send?access_token=T";
    for _ in 0..6 {
        assert_eq!(b.get(path).await.status, 200);
    }
    let spent = b.metric("wxgate_quota_lease_units_total{what=\"spent\"}").await.unwrap_or(0.0);
    assert!(spent >= 1.0, "b decides from a lease: {spent} spent");
    // A call decided from a lease tells its room left as any admission:
    // the day's 1000 less the 7 calls (what the lease still holds is room).
    let leased = b.get(path).await;
    let room = leased.header("ratelimit").unwrap_or_default().to_owned();
    assert!(room.starts_with("\"tpl.day\";r=993;"), "RateLimit of a leased call: {room:?}");
    mock.respond(|_| errcode_reply(45009));
    assert_eq!(a.get(path).await.status, 429);
    mock.respond(|_| ok_reply());
    let before = mock.count();
    eventually_async("b refuses for the penalty", PATIENCE, async || {
        let answer = b.get(path).await;
        answer.status == 429 && answer.header("x-wxgate-reason") == Some("penalty")
    })
    .await;
    let dropped = b.metric("wxgate_quota_lease_units_total{what=\"dropped\"}").await.unwrap_or(0.0);
    eprintln!("b forwarded {} calls after the penalty; {dropped} leased units dropped", mock.count() - before);
    assert!(dropped > 0.0, "b's lease was dropped, not spent out");
}

#[tokio::test]
async fn scripts_come_back_after_script_flush() {
    let redis = RedisServer::start();
    let mock = MockWeChat::start().await;
    let gate = Gate::start_real_text(redis_config(&mock, &redis.url())).await;
    assert_eq!(gate.get("/cgi-bin/message/template/send").await.status, 200);
    // A Redis restart or failover loses the script cache: EVALSHA answers NOSCRIPT.
    assert!(redis.command("SCRIPT FLUSH").starts_with("+OK"));
    assert_eq!(gate.get("/cgi-bin/message/template/send").await.status, 200);
    assert_eq!(mock.count(), 2);
    let count = redis.state_field("wxgate:{default}:tpl", "day.n");
    assert_eq!(count, Some(2), "both calls counted in Redis");
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
    let plain = redis_config(&mock, &redis.url()).to_string();
    let (ok, log) = serve_binary(&plain, None);
    assert!(!ok, "no password: must refuse to start\n{log}");
    assert!(log.contains(&format!("cannot use Redis at 127.0.0.1:{}", redis.port)) && log.contains("NOAUTH"), "{log}");
    assert!(!log.contains("s3cret"));
    let (ok, log) = serve_binary(&plain, Some("s3cret"));
    assert!(ok, "password from WXGATE_REDIS_PASSWORD\n{log}");
    let in_url = redis_config(&mock, &format!("redis://:s3cret@127.0.0.1:{}", redis.port)).to_string();
    let (ok, log) = serve_binary(&in_url, None);
    assert!(ok, "password in the URL\n{log}");
    let wrong = redis_config(&mock, &format!("redis://:nope@127.0.0.1:{}", redis.port)).to_string();
    let (ok, log) = serve_binary(&wrong, None);
    assert!(!ok);
    assert!(!log.contains("nope"), "the password never reaches the log\n{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_instances_concurrency_slots_come_back_after_the_lease() {
    let redis = RedisServer::start();
    let mock = MockWeChat::start().await;
    mock.respond(|_| Reply::Hang);
    let config = ConfigToml::new(&mock.url())
        .server("upstream_timeout", "60s")
        .with(StoreToml::redis(&redis.url()).set("lease", "1s"))
        .with(rule("remark").matching("/cgi-bin/externalcontact/remark").concurrency(1))
        .to_string();
    let mut doomed = process::spawn(&config, "lease-a", &[]).expect("first instance");
    let survivor = process::spawn(&config, "lease-b", &[]).expect("second instance");
    // The first instance's call hangs at WeChat, holding the only slot.
    let addr = doomed.addr;
    // (Over a raw socket: its connection breaks when the instance is killed.)
    let _hanging = tokio::spawn(exchange(addr, b"GET /cgi-bin/externalcontact/remark HTTP/1.1\r\nHost: x\r\n\r\n"));
    eventually("the first call reaching the mock", PATIENCE, || mock.count() >= 1).await;
    // Alive, it renews the lease (every lease / 3): the slot stays taken
    // after the lease it was first given has run out.
    let first = slot_expiry(&redis);
    eventually("the first lease running out, renewed", PATIENCE, || unix_us() > first && slot_expiry(&redis) > first)
        .await;
    let a = survivor.get("/cgi-bin/externalcontact/remark").await;
    assert_eq!(a.header("x-wxgate-reason"), Some("concurrency"), "a live instance keeps its slot past one lease");
    doomed.kill();
    let killed = Instant::now();
    // Dead, its lease runs out within 1 s and the slot comes back.
    mock.respond(|_| ok_reply());
    eventually_async("the dead instance's slot coming back", Duration::from_secs(5), async || {
        let a = survivor.get("/cgi-bin/externalcontact/remark").await;
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

/// When the one concurrency slot of rule "remark" expires unless renewed
/// (µs since the Unix epoch, from Redis).
fn slot_expiry(redis: &RedisServer) -> f64 {
    let reply = redis.command("ZRANGE wxgate:{default}:remark:c 0 -1 WITHSCORES");
    // *2, $len, holder, $len, score
    let lines: Vec<&str> = reply.lines().collect();
    assert_eq!((lines.len(), lines.first().copied()), (5, Some("*2")), "one slot: {reply:?}");
    lines[4].parse().unwrap_or_else(|_| panic!("a score: {reply:?}"))
}

/// Now, in µs since the Unix epoch (the clock Redis and wxgate read too).
fn unix_us() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970").as_micros() as f64
}

/// Calls to EVALSHA Redis has answered so far.
fn evalsha_calls(redis: &RedisServer) -> u64 {
    redis.command_calls("evalsha")
}

#[tokio::test]
async fn known_refusals_are_answered_without_asking_redis() {
    let redis = RedisServer::start();
    let mock = MockWeChat::start().await;
    for (cache, max_asks) in [(true, 5), (false, 51)] {
        // fallback "deny": with "local" the keeper reads the day count back
        // from Redis every 100 ms (lua/fields.lua, an EVALSHA too), and a
        // loaded machine's slower refusals let one of those into the count.
        let store = StoreToml::redis(&redis.url())
            .per_call()
            .set("refusal_cache", cache)
            .set("key_prefix", format!("c{cache}"))
            .set("fallback", "deny");
        let gate = Gate::start_real(&mock, format!("{store}\n{}", tpl().limit(1, "day"))).await;
        assert_eq!(gate.get("/cgi-bin/message/template/send").await.status, 200);
        let before = evalsha_calls(&redis);
        for _ in 0..50 {
            let a = gate.get("/cgi-bin/message/template/send").await;
            assert_eq!((a.status.as_u16(), a.header("x-wxgate-reason")), (429, Some("quota")));
        }
        let asked = evalsha_calls(&redis) - before;
        eprintln!("refusal_cache = {cache}: 50 refusals asked Redis {asked} times");
        if cache {
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
    let store = StoreToml::redis(&redis.url()).per_call().set("fallback", "deny");
    let gate = Gate::start_real(&mock, format!("{store}\n{}", tpl().limit(100_000, "1s"))).await;
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

/// An ACL user with a password (`[store] username`, the password from
/// `WXGATE_REDIS_PASSWORD` or the URL) on a Redis whose default user is
/// off: wxgate decides with that user's rights; a wrong password or a user
/// without the rights wxgate needs is refused at start, clearly, and no
/// password reaches the log.
#[tokio::test]
async fn an_acl_user_with_a_password_decides_and_a_wrong_one_is_refused_at_start() {
    let redis = RedisServer::start();
    // The user may touch wxgate's keys and run its scripts; nothing else.
    let set = redis.command("ACL SETUSER wxgate on >pa55word ~wxgate:* resetchannels +@all -@dangerous +info");
    assert!(set.starts_with("+OK"), "{set}");
    assert!(redis.command("ACL SETUSER nokeys on >pa55word ~other:* +@all").starts_with("+OK"));
    let mock = MockWeChat::start().await;
    let url = |user: &str, pw: &str| format!("redis://{user}:{pw}@127.0.0.1:{}", redis.port);
    let with_user = |url: String| {
        ConfigToml::new(&mock.url())
            .with(StoreToml::redis(&url).set("username", "wxgate"))
            .with(tpl().limit(2, "day"))
            .to_string()
    };
    // The user from [store] username, the password from the URL.
    let gate = Gate::start_real_text(with_user(format!("redis://:pa55word@127.0.0.1:{}", redis.port))).await;
    let path = "/cgi-bin/message/template/send?access_token=T";
    assert_eq!(gate.get(path).await.status, 200);
    assert_eq!(gate.get(path).await.status, 200);
    let third = gate.get(path).await;
    assert_eq!((third.status.as_u16(), third.header("x-wxgate-reason")), (429, Some("quota")), "decided in Redis");
    assert_eq!(redis.state_field("wxgate:{default}:tpl", "day.n"), Some(2), "counted as user wxgate");
    // The default user off: only wxgate's user gets in.
    assert!(redis.command("ACL SETUSER default off").starts_with("+OK"));
    let (ok, log) = serve_binary(&with_user(format!("redis://:wrong@127.0.0.1:{}", redis.port)), None);
    assert!(!ok, "a wrong password must refuse to start\n{log}");
    assert!(log.contains("cannot use Redis at") && !log.contains("wrong@") && !log.contains(":wrong"), "{log}");
    let (ok, log) = serve_binary(&with_user(format!("redis://127.0.0.1:{}", redis.port)), Some("pa55word"));
    assert!(ok, "username from the config, password from WXGATE_REDIS_PASSWORD\n{log}");
    // A user that may not touch wxgate's keys: refused at start, saying why.
    let (ok, log) = serve_binary(
        &ConfigToml::new(&mock.url())
            .with(StoreToml::redis(&url("nokeys", "pa55word")))
            .with(tpl().limit(2, "day"))
            .to_string(),
        None,
    );
    assert!(!ok, "a user without rights on wxgate's keys must refuse to start");
    assert!(log.contains("NOPERM") || log.contains("permission"), "{log}");
    assert!(!log.contains("pa55word"), "{log}");
}

/// TLS to Redis (`rediss://`) with a private CA given as `[store] tls_ca`:
/// calls are decided over TLS; without the CA the server is not trusted and
/// wxgate refuses to start.
#[tokio::test]
async fn redis_over_tls_with_a_private_ca_decides_and_an_untrusted_server_is_refused() {
    let pki = support::pki::pki(&["127.0.0.1"]);
    let dir = TempDir::new("redis-tls");
    let ca = dir.write("ca.pem", &pki.ca_pem);
    let cert = dir.write("redis.pem", &pki.cert_pem);
    let key = dir.write("redis.key", &pki.key_pem);
    let tls_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        l.local_addr().expect("addr").port()
    };
    let s = |p: &std::path::Path| p.to_str().expect("utf-8 path").to_owned();
    let args = [
        "--tls-port".to_owned(),
        tls_port.to_string(),
        "--tls-cert-file".to_owned(),
        s(&cert),
        "--tls-key-file".to_owned(),
        s(&key),
        "--tls-ca-cert-file".to_owned(),
        s(&ca),
        "--tls-auth-clients".to_owned(),
        "no".to_owned(),
    ];
    let redis = RedisServer::start_with(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let mock = MockWeChat::start().await;
    let url = format!("rediss://127.0.0.1:{tls_port}");
    let config = ConfigToml::new(&mock.url())
        .with(StoreToml::redis(&url).set("tls_ca", s(&ca)).set("key_prefix", "tls"))
        .with(tpl().limit(2, "day"));
    let gate = Gate::start_real_text(&config).await;
    let path = "/cgi-bin/message/template/send?access_token=T";
    assert_eq!(gate.get(path).await.status, 200);
    assert_eq!(gate.get(path).await.status, 200);
    assert_eq!(gate.get(path).await.header("x-wxgate-reason"), Some("quota"));
    let count = redis.state_field("tls:{default}:tpl", "day.n");
    assert_eq!(count, Some(2), "counted in Redis, reached over TLS");
    let untrusted = ConfigToml::new(&mock.url()).with(StoreToml::redis(&url)).with(tpl().limit(2, "day")).to_string();
    let (ok, log) = serve_binary(&untrusted, None);
    assert!(!ok, "a server from an unknown CA must refuse to start\n{log}");
    assert!(log.contains("cannot use Redis at"), "{log}");
}
