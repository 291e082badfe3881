//! Issue 63 (7), bounded ended jobs: a caller that submits and cancels
//! without end fills neither the jobs file nor Redis. A job's body goes
//! when it ends, and a caller keeps at most `[queue] ended_jobs` ended
//! jobs per account (with their Idempotency-Keys), so the store stays at a
//! size set by the bounds, whatever the number of submissions.
//!
//! Through the [`JobStore`] directly (a real file; a real redis-server over
//! a socket), not through the proxy: both tests take about 5 s together
//! here, where 20,000 HTTP calls through a debug build, on the suite's
//! loaded 2-core machine, would add tens of seconds; and the proxy stores
//! nothing the store does not (the intake hands the job to `submit`,
//! `DELETE /v1/deliveries/<id>` is `cancel`; tests/queue.rs covers those
//! routes).
//!
//! Before the fix (the same tests on cce451d, without `ended_jobs`): the
//! jobs file was 87.9 MB after 10,000 cycles; Redis held 20,010 keys and
//! `used_memory` grew by 100 MB from cycle 1,000 to 10,000. After: a file
//! of 272 KiB (WAL 4.3 MB), 111 keys, +24 KB.

use crate::support;

use std::path::Path;
use std::sync::Arc;

use support::jobs::{new_job, queue, roomy};
use support::redis_server::RedisServer;
use support::{TempDir, SEC, T0};
use wxgate::jobs::redis::RedisJobs;
use wxgate::jobs::sqlite::SqliteJobs;
use wxgate::jobs::{Bounds, Cancelled, JobStore};

const CYCLES: usize = 10_000;
/// Each job's body: 10,000 of them kept would be 80 MiB.
const BODY: usize = 8 * 1024;
const ENDED_JOBS: u64 = 100;
/// Submitters at once (so the file's writer commits them together).
const TASKS: usize = 16;

fn bounds() -> Bounds {
    Bounds { ended_jobs: ENDED_JOBS, ..roomy(86_400 * SEC) }
}

/// Jobs `from..to` of caller `spam` in account `wx1`, each with its own
/// Idempotency-Key, submitted and cancelled by [`TASKS`] tasks.
async fn churn(s: &Arc<dyn JobStore>, from: usize, to: usize) {
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let q = queue("spam", "wx1", "r");
            for i in (from + t..to).step_by(TASKS) {
                let mut job = new_job(&q, BODY);
                job.idempotency_key = Some(format!("key-{i}"));
                let now = T0 + i as i64;
                let id = s.submit(job, &bounds(), now).await.expect("submit: never refused").id;
                assert_eq!(s.cancel("spam", id, now).await.expect("cancel"), Cancelled::Cancelled);
            }
        }));
    }
    for task in tasks {
        task.await.expect("a submitter");
    }
}

/// The caller's jobs the store holds (all ended: every one is cancelled).
async fn held(s: &Arc<dyn JobStore>) -> u64 {
    let all = s.summary(Some("spam")).await.expect("summary");
    all.iter().map(|q| q.queued + q.waiting + q.sending + q.cancelled).sum()
}

fn size(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_and_cancel_ten_thousand_times_keeps_the_jobs_file_under_its_bound() {
    let dir = TempDir::new("jobs-bounded");
    let path = dir.join("jobs.db");
    let wal = dir.join("jobs.db-wal");
    let s: Arc<dyn JobStore> = Arc::new(SqliteJobs::open(&path).expect("open the jobs file"));
    churn(&s, 0, CYCLES).await;
    let (file, log) = (size(&path), size(&wal));
    eprintln!("after {CYCLES} submit-and-cancel of {BODY}-byte bodies: file {file} bytes, WAL {log} bytes");
    assert_eq!(held(&s).await, ENDED_JOBS, "the newest ended_jobs are kept, the rest deleted");
    // What the bounds hold: ENDED_JOBS jobs' metadata and at most TASKS
    // bodies at once (freed pages are reused); the WAL is cut back to
    // 16 MiB (`journal_size_limit`) after a checkpoint, and checkpointed
    // every 1,000 pages (4 MiB).
    assert!(file <= 2 << 20, "the jobs file grew to {file} bytes");
    assert!(log <= 16 << 20, "the WAL grew to {log} bytes");
}

/// `INFO memory`'s `used_memory`.
fn used_memory(redis: &RedisServer) -> i64 {
    let info = redis.command("INFO memory");
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("used_memory in INFO")
}

fn keys(redis: &RedisServer) -> i64 {
    redis.command("DBSIZE").trim().trim_start_matches(':').parse().expect("DBSIZE")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_and_cancel_ten_thousand_times_keeps_redis_under_its_bound() {
    const WARM: usize = 1_000;
    let redis = RedisServer::start();
    let s: Arc<dyn JobStore> =
        Arc::new(RedisJobs::connect(&redis.store_config("jb")).await.expect("connect the jobs store"));
    churn(&s, 0, WARM).await;
    let (keys_warm, memory_warm) = (keys(&redis), used_memory(&redis));
    churn(&s, WARM, CYCLES).await;
    let (keys_end, memory_end) = (keys(&redis), used_memory(&redis));
    eprintln!(
        "after {WARM} submit-and-cancel of {BODY}-byte bodies: {keys_warm} keys, used_memory {memory_warm}; \
         after {CYCLES}: {keys_end} keys, used_memory {memory_end} (+{})",
        memory_end - memory_warm
    );
    assert_eq!(held(&s).await, ENDED_JOBS, "the newest ended_jobs are kept, the rest deleted");
    // One hash per kept job (its body gone), and the account's and the
    // caller's fixed keys (meta, counts, indexes: fewer than 20).
    assert!(keys_end <= ENDED_JOBS as i64 + 20, "{keys_end} keys");
    // 9,000 more jobs' bodies kept would be 70 MiB.
    assert!(memory_end - memory_warm <= 2 << 20, "used_memory grew by {} bytes", memory_end - memory_warm);
}
