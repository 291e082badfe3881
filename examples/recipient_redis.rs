//! What `per_recipient` state costs in Redis: `used_memory` per recipient
//! (one hash key each, with its expiry), and `MEMORY USAGE` of one
//! recipient's key, for N distinct recipients of one (account, rule) pair
//! reached by messages of 1000 recipients each through wxgate's RedisStore
//! (the rule of examples/recipient_memory.rs: per_recipient windows of 1m
//! and 1h, keys kept 12 minutes).
//!
//! `cargo run --profile profiling --example recipient_redis -- 1000000`
//! (N defaults to 1,000,000; the figure is also shown after every power of
//! ten of recipients on the way). Starts its own `redis-server` (or
//! `$WXGATE_TEST_REDIS_SERVER`) on a free loopback port, never 6379, without
//! persistence, and stops it at the end.
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use wxgate::config::{Config, RedisConfig, Resilience};
use wxgate::limit::{Ask, Decision, Key};
use wxgate::store::redis::RedisStore;
use wxgate::store::Store;

const RULE: &str = r#"[[rule]]
name = "message_send"
match = ["/cgi-bin/message/send"]
limits = [{ count = 1000000000, per = "day" }]
cost = "recipients"
recipients = { field = "touser", separator = "|" }
per_recipient = [{ count = 1, per = "1m" }, { count = 5, per = "1h" }]
"#;

/// Recipients per message (WeCom's most).
const BATCH: usize = 1000;

/// The redis-server of this run: killed, and its directory removed, on drop.
struct Server {
    child: Child,
    dir: std::path::PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start_server() -> (Server, u16) {
    let port = TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("its address").port();
    let dir = std::env::temp_dir().join(format!("wxgate-recipient-redis-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("redis dir");
    let bin = std::env::var("WXGATE_TEST_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
    let child = Command::new(&bin)
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .args(["--dir", dir.to_str().expect("utf-8 temp dir")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {bin}: {e}"));
    (Server { child, dir }, port)
}

/// Recipient ids like WeCom userids (`zhangsan0000123`, 15 bytes).
fn recipient(i: usize) -> String {
    format!("zhangsan{i:07}")
}

/// A field of `INFO memory`.
async fn info_memory(conn: &mut redis::aio::MultiplexedConnection, field: &str) -> u64 {
    let info: String = redis::cmd("INFO").arg("memory").query_async(conn).await.expect("INFO memory");
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("INFO memory has no {field}"))
}

async fn dbsize(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    redis::cmd("DBSIZE").query_async(conn).await.expect("DBSIZE")
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let n: usize = std::env::args().nth(1).map(|a| a.parse().expect("N: a number")).unwrap_or(1_000_000);
    assert!(n > 0 && n % BATCH == 0, "N: a multiple of {BATCH}");
    let (_server, port) = start_server();
    let url = format!("redis://127.0.0.1:{port}");
    let client = redis::Client::open(url.as_str()).expect("redis url");
    let started = Instant::now();
    let mut conn = loop {
        if let Ok(mut c) = client.get_multiplexed_async_connection().await {
            if redis::cmd("PING").query_async::<String>(&mut c).await.is_ok() {
                break c;
            }
        }
        assert!(started.elapsed() < Duration::from_secs(10), "redis-server did not start on port {port}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let version: String = redis::cmd("INFO").arg("server").query_async(&mut conn).await.expect("INFO server");
    let version = version.lines().find_map(|l| l.strip_prefix("redis_version:")).unwrap_or("?").trim().to_owned();

    let config = Config::parse(RULE, Path::new("recipients.toml")).expect("the rule");
    let rule = config.rule_for("/cgi-bin/message/send").expect("the rule matches").clone();
    let rc = RedisConfig {
        url: url.clone(),
        username: None,
        password: None,
        tls_ca: None,
        key_prefix: "wxgate".into(),
        timeout: Duration::from_secs(10),
        nodes: vec![],
        sentinel: None,
        wait_replicas: 0,
        resilience: Resilience::strict(),
        batch: true,
    };
    let store = RedisStore::connect(&rc).await.expect("RedisStore");
    let account = "wxrecipients000001";
    let key = Key { account, rule: &rule, offset_us: config.server.quota_offset_us };
    // One call first, of a recipient outside the measured ones: the
    // scripts are loaded and the pair's own hash exists before the count.
    let first = vec!["warmup".to_owned()];
    store.acquire(&Ask { cost: 1, recipients: &first, ..Ask::one(key) }).await.expect("acquire");
    let keys0 = dbsize(&mut conn).await;
    let before = info_memory(&mut conn, "used_memory").await;
    let rss_before = info_memory(&mut conn, "used_memory_rss").await;
    println!("redis {version} on 127.0.0.1:{port}; {keys0} keys, used_memory {before} B before");

    let mut ids: Vec<String> = Vec::with_capacity(BATCH);
    let t = Instant::now();
    let mut next_report = 10_000;
    for start in (0..n).step_by(BATCH) {
        ids.clear();
        ids.extend((start..start + BATCH).map(recipient));
        let ask = Ask { cost: BATCH as u64, recipients: &ids, ..Ask::one(key) };
        let decided = store.acquire(&ask).await.expect("acquire");
        assert!(matches!(decided.decision, Decision::Admit { .. }), "refused: {:?}", decided.decision);
        let done = start + BATCH;
        if done == next_report || done == n {
            let used = info_memory(&mut conn, "used_memory").await;
            let keys = dbsize(&mut conn).await - keys0;
            println!(
                "{done:>9} recipients: {keys} new keys, used_memory +{} B = {} bytes/recipient",
                used - before,
                (used - before) / done as u64
            );
            next_report *= 10;
        }
    }
    let fill = t.elapsed();
    let after = info_memory(&mut conn, "used_memory").await;
    let rss_after = info_memory(&mut conn, "used_memory_rss").await;
    let keys = dbsize(&mut conn).await - keys0;
    assert_eq!(keys, n as u64, "one key per recipient, none expired yet");
    println!(
        "{n} recipients in one pair: used_memory {before} -> {after} B = {} bytes/recipient; \
         used_memory_rss +{} B = {} bytes/recipient (fill {fill:?}, {:.2} µs/recipient)",
        (after - before) / n as u64,
        rss_after.saturating_sub(rss_before),
        rss_after.saturating_sub(rss_before) / n as u64,
        fill.as_secs_f64() * 1e6 / n as f64
    );

    // One recipient's key: its name, fields, expiry and MEMORY USAGE.
    let pattern = format!("*#r:{}", recipient(n / 2));
    let mut cursor = 0u64;
    let one = loop {
        let (next, found): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(10_000)
            .query_async(&mut conn)
            .await
            .expect("SCAN");
        if let Some(k) = found.into_iter().next() {
            break k;
        }
        assert!(next != 0, "no key matches {pattern}");
        cursor = next;
    };
    let fields: Vec<(String, String)> = redis::cmd("HGETALL").arg(&one).query_async(&mut conn).await.expect("HGETALL");
    let pttl: i64 = redis::cmd("PTTL").arg(&one).query_async(&mut conn).await.expect("PTTL");
    let usage: u64 =
        redis::cmd("MEMORY").arg("USAGE").arg(&one).arg("SAMPLES").arg(0).query_async(&mut conn).await.expect("MEMORY");
    let encoding: String =
        redis::cmd("OBJECT").arg("ENCODING").arg(&one).query_async(&mut conn).await.expect("OBJECT ENCODING");
    println!(
        "one recipient's key: {one} ({} bytes of name), {encoding}, fields {fields:?}, PTTL {pttl} ms: \
         MEMORY USAGE {usage} B",
        one.len()
    );
}
