//! Decisions per second through the store seam, against a local
//! `redis-server` it starts itself on a free loopback port (and the memory
//! store for comparison), with 1 and 64 concurrent callers.
//!
//!     cargo bench --bench decisions
//!
//! Under `cargo test` it runs a few hundred decisions only, as a smoke test.

#[allow(dead_code)]
#[path = "../tests/support/redis_server.rs"]
mod redis_server;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wxgate::config::Config;
use wxgate::config::{RedisConfig, Resilience};
use wxgate::limit::{Ask, Decision, Key, Rule};
use wxgate::store::memory::MemoryStore;
use wxgate::store::redis::RedisStore;
use wxgate::store::resilient::{Resilient, StoreCounters};
use wxgate::store::Store;
use wxgate::time::SystemClock;

const BEIJING: i64 = 8 * 3_600_000_000;

fn rule(limits: &str) -> Arc<Rule> {
    let text = format!("[[rule]]\nname = \"bench\"\nmatch = [\"/x\"]\nlimits = {limits}\n");
    Config::parse(&text, Path::new("bench.toml")).expect("bench rule").rules[0].clone()
}

struct Figures {
    per_sec: f64,
    p50_us: f64,
    p99_us: f64,
    admitted: usize,
}

async fn measure(store: Arc<dyn Store>, rule: Arc<Rule>, callers: usize, total: usize) -> Figures {
    let per_caller = total / callers;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..callers {
        let store = store.clone();
        let rule = rule.clone();
        tasks.push(tokio::spawn(async move {
            let account = format!("acct{}", c % 8);
            let mut lat = Vec::with_capacity(per_caller);
            let mut admitted = 0;
            for _ in 0..per_caller {
                let t = Instant::now();
                let key = Key { account: &account, rule: &rule, offset_us: BEIJING };
                let ask = Ask {
                    key,
                    max_wait_us: 0,
                    holder: "",
                    lease_us: 30_000_000,
                    normal: false,
                    share: None,
                    cost: 1,
                    recipients: &[],
                };
                let d = store.acquire(&ask).await.expect("decision").decision;
                lat.push(t.elapsed());
                admitted += usize::from(matches!(d, Decision::Admit { .. }));
            }
            (lat, admitted)
        }));
    }
    let mut lat = Vec::with_capacity(total);
    let mut admitted = 0;
    for t in tasks {
        let (l, a) = t.await.expect("caller");
        lat.extend(l);
        admitted += a;
    }
    let elapsed = started.elapsed();
    lat.sort();
    let pct = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)].as_secs_f64() * 1e6;
    Figures { per_sec: lat.len() as f64 / elapsed.as_secs_f64(), p50_us: pct(0.50), p99_us: pct(0.99), admitted }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let total = if full { 200_000 } else { 640 };
    let redis = redis_server::RedisServer::start();
    // Redis three ways: the default (batched decisions, known refusals
    // answered locally), without the refusal cache, and one EVALSHA per call.
    let redis_store = |prefix: &str, batch: bool, refusal_cache: bool| {
        let config = RedisConfig {
            timeout: Duration::from_secs(2),
            resilience: Resilience { refusal_cache, ..Resilience::strict() },
            batch,
            ..redis.store_config(prefix)
        };
        async move {
            let store = RedisStore::connect(&config).await.expect("connect to redis");
            let store: Arc<dyn Store> =
                Resilient::new(store, Arc::new(SystemClock), config.resilience.clone(), true, StoreCounters::default());
            store
        }
    };
    let stores = [
        ("memory", Arc::new(MemoryStore::new(Arc::new(SystemClock))) as Arc<dyn Store>),
        ("redis", redis_store("bench", true, true).await),
        ("redis, refusal_cache = false", redis_store("bench-nc", true, false).await),
        ("redis, batch = false, refusal_cache = false", redis_store("bench-1", false, false).await),
    ];
    let open = rule(r#"[{ count = 1000000000, per = "1h" }, { count = 1000000000, per = "day" }]"#);
    let shut = rule(r#"[{ count = 1, per = "1h" }, { count = 1000000000, per = "day" }]"#);
    println!("| store | rule | callers | decisions/s | p50 | p99 |");
    println!("|---|---|---:|---:|---:|---:|");
    for (name, store) in &stores {
        for (kind, rule) in [("admits all", &open), ("refuses all", &shut)] {
            for callers in [1, 64] {
                // Warm up (connections, script cache), then measure.
                measure(store.clone(), rule.clone(), callers, total / 10).await;
                let f = measure(store.clone(), rule.clone(), callers, total).await;
                if kind == "admits all" {
                    assert_eq!(f.admitted, total / callers * callers);
                }
                println!(
                    "| {name} | {kind} | {callers} | {:.0} | {:.0} µs | {:.0} µs |",
                    f.per_sec, f.p50_us, f.p99_us
                );
            }
        }
    }
}
