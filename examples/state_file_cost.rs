//! What the embedded store's state costs: memory per account/rule pair, the
//! state file's size, one write, a sweep, a load. The README's figures.
//!
//! `cargo run --release --example state_file_cost -- 200000`
//! (`MIMALLOC_PURGE_DELAY=0` in the environment shows resident memory
//! handed back to the system right after the sweep.)
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wxgate::config::{Config, MemoryConfig};
use wxgate::limit::{Ask, Key};
use wxgate::store::memory::MemoryStore;
use wxgate::store::Store;
use wxgate::telemetry::metrics::MemoryStoreMetrics;
use wxgate::time::ManualClock;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn rss_kb() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmRSS"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let n: usize = std::env::args().nth(1).map(|a| a.parse().unwrap()).unwrap_or(200_000);
    let text = "[[rule]]\nname = \"send\"\nmatch = [\"/a\"]\nlimits = [{ count = 100, per = \"60s\" }, { count = 1000, per = \"day\" }]\n";
    let config = Config::parse(text, Path::new("m.toml")).unwrap();
    let clock = ManualClock::new(1_795_924_800_000_000);
    let dir = std::env::temp_dir().join(format!("wxgate-state-cost-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mc = MemoryConfig {
        state_file: Some(dir.join("state.json")),
        flush_interval: Duration::from_secs(3600),
        max_entries: 10_000_000,
        max_recipients: 100_000_000,
    };
    let store = MemoryStore::open(Arc::new(clock.clone()), &mc, 8 * 3600 * 1_000_000, 0, MemoryStoreMetrics::default())
        .unwrap();
    let before = rss_kb();
    let t = Instant::now();
    for i in 0..n {
        let account = format!("wx{:016x}", i);
        let key = Key { account: &account, rule: &config.rules[0], offset_us: config.server.quota_offset_us };
        store
            .acquire(&Ask {
                key,
                max_wait_us: 0,
                holder: "",
                lease_us: 0,
                normal: false,
                share: None,
                cost: 1,
                recipients: &[],
            })
            .await
            .unwrap();
    }
    let fill = t.elapsed();
    let after = rss_kb();
    println!(
        "{n} states: RSS {before} -> {after} KiB: {} bytes/state (fill {fill:?})",
        (after - before) * 1024 / n as u64
    );
    let t = Instant::now();
    store.close().await;
    let write = t.elapsed();
    let size = std::fs::metadata(dir.join("state.json")).unwrap().len();
    println!("state file: {size} bytes = {} bytes/pair; snapshot+encode+write+fsync {write:?}", size / n as u64);
    clock.advance(Duration::from_secs(2 * 86_400));
    let t = Instant::now();
    let dropped = store.sweep();
    println!("sweep dropped {dropped} in {:?}; RSS now {} KiB", t.elapsed(), rss_kb());
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(500));
        let v: Vec<u8> = Vec::with_capacity(16);
        drop(v);
        println!("RSS {} KiB", rss_kb());
    }
    let t = Instant::now();
    let bytes = std::fs::read(dir.join("state.json")).unwrap();
    let saved = wxgate::store::state_file::decode(&bytes).unwrap();
    println!("read+decode {} pairs: {:?}", saved.pairs.len(), t.elapsed());
    let t = Instant::now();
    wxgate::store::state_file::encode_to(&saved, &mut std::io::sink()).unwrap();
    println!("encode alone: {:?}", t.elapsed());
    let _ = std::fs::remove_dir_all(&dir);
}
