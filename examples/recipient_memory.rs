//! What `per_recipient` state costs in the embedded store: heap bytes
//! (counted by this example's allocator: what the store holds), resident
//! memory and state-file bytes per recipient, for N distinct recipients of
//! one (account, rule) pair, reached by messages of 1000 recipients each (a
//! rule with two per_recipient windows, 1m and 1h).
//!
//! `cargo run --profile profiling --example recipient_memory -- 1000000`
//! (N defaults to 1,000,000; the figures are also shown after every power
//! of ten of recipients on the way. Run once per N for its own figure: a
//! process that grew and freed a table before may reuse the freed pages.)
//! The heap figure follows the map's fill (a hashbrown table doubles when
//! 7/8 full: 57 bytes a slot, so 65 bytes a recipient just before it grows
//! and 130 just after). RSS is larger: mimalloc keeps the pages of the
//! tables freed while growing for a while (`MIMALLOC_PURGE_DELAY=0` gives
//! them back at once, as wxgate's default build does not).
use std::alloc::{GlobalAlloc, Layout};
use std::path::Path;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use wxgate::config::{Config, MemoryConfig};
use wxgate::limit::{Ask, Decision, Key};
use wxgate::store::memory::MemoryStore;
use wxgate::store::Store;
use wxgate::telemetry::metrics::MemoryStoreMetrics;
use wxgate::time::ManualClock;

/// mimalloc (wxgate's allocator), counting the bytes allocated and not freed.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { mimalloc::MiMalloc.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { mimalloc::MiMalloc.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size as isize - layout.size() as isize, Ordering::Relaxed);
        unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

/// The rule of the measurement: recipients' windows that stay in use (a
/// TAT a minute and 12 minutes ahead) after one message each.
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

fn rss_kb() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmRSS"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Recipient ids like WeCom userids (`zhangsan0000123`, 15 bytes).
fn recipient(i: usize) -> String {
    format!("zhangsan{i:07}")
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let n: usize = std::env::args().nth(1).map(|a| a.parse().expect("N: a number")).unwrap_or(1_000_000);
    assert!(n > 0 && n % BATCH == 0, "N: a multiple of {BATCH}");
    let config = Config::parse(RULE, Path::new("recipients.toml")).expect("the rule");
    let rule = config.rule_for("/cgi-bin/message/send").expect("the rule matches").clone();
    let clock = ManualClock::new(1_795_924_800_000_000);
    let dir = std::env::temp_dir().join(format!("wxgate-recipient-memory-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mc = MemoryConfig {
        state_file: Some(dir.join("state.json")),
        flush_interval: Duration::from_secs(3600),
        max_entries: 10_000_000,
        max_recipients: 100_000_000,
    };
    let store = MemoryStore::open(Arc::new(clock.clone()), &mc, 8 * 3600 * 1_000_000, 0, MemoryStoreMetrics::default())
        .expect("memory store");
    let account = "wxrecipients000001";
    let key = Key { account, rule: &rule, offset_us: config.server.quota_offset_us };
    // The first call, of one recipient outside the measured ones: the pair
    // and its map exist before RSS is read.
    let first = vec!["warmup".to_owned()];
    store.acquire(&Ask { cost: 1, recipients: &first, ..Ask::one(key) }).await.expect("acquire");
    let mut ids: Vec<String> = Vec::with_capacity(BATCH);
    ids.extend((0..BATCH).map(recipient));
    let (before, heap_before) = (rss_kb(), live());
    let t = Instant::now();
    let mut next_report = 10_000;
    for start in (0..n).step_by(BATCH) {
        ids.clear();
        ids.extend((start..start + BATCH).map(recipient));
        let ask = Ask { cost: BATCH as u64, recipients: &ids, ..Ask::one(key) };
        let decided = store.acquire(&ask).await.expect("acquire");
        assert!(matches!(decided.decision, Decision::Admit { .. }), "refused: {:?}", decided.decision);
        // Time moves on a little between messages, as it would.
        clock.advance(Duration::from_micros(50));
        let done = start + BATCH;
        if done == next_report || done == n {
            let rss = rss_kb();
            println!(
                "{done:>9} recipients: heap {} bytes/recipient; RSS {before} -> {rss} KiB: {} bytes/recipient",
                (live() - heap_before) / done as isize,
                (rss.saturating_sub(before)) * 1024 / done as u64
            );
            next_report *= 10;
        }
    }
    let fill = t.elapsed();
    let after = rss_kb();
    println!(
        "{n} recipients in one pair: heap {} bytes/recipient; RSS {before} -> {after} KiB = {} bytes/recipient \
         (fill {fill:?}, {:.2} µs/recipient)",
        (live() - heap_before) / n as isize,
        (after - before) * 1024 / n as u64,
        fill.as_secs_f64() * 1e6 / n as f64
    );
    let t = Instant::now();
    store.close().await;
    let write = t.elapsed();
    let size = std::fs::metadata(dir.join("state.json")).expect("state file").len();
    println!("state file: {size} bytes = {} bytes/recipient; snapshot+encode+write+fsync {write:?}", size / n as u64);
    let _ = std::fs::remove_dir_all(&dir);
}
