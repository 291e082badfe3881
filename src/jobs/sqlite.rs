//! The embedded [`JobStore`]: one SQLite file (rusqlite, `bundled`), WAL
//! with `synchronous = FULL`, so every commit is fsync'd before the method
//! that made it returns.
//!
//! One writer thread owns the write connection. Every method that writes
//! sends its work to that thread over a channel and awaits the answer (a
//! tokio oneshot). The thread takes what has arrived (at most
//! [`BATCH_MAX`]), runs each piece inside its own savepoint of one
//! transaction (a piece that fails is rolled back alone), commits once (one
//! fsync), and only then answers each: submissions that arrive while a
//! transaction is open share the next one (group commit). Reads (`get`,
//! `summary`, `due_queues`) use a second connection, which WAL lets read the
//! last commit while the writer writes.
//!
//! The schema is [`SCHEMA`] (version 1) and then [`MIGRATIONS`], versioned
//! by `PRAGMA user_version` ([`VERSION`]): a new file and an older one are
//! brought to [`VERSION`] the same way, in the transaction that opens them;
//! a file of a newer version, or a non-empty file that is not a jobs file,
//! is refused at open with a clear error.
//!
//! What grows, and its bound: unfinished jobs and their bytes per caller and
//! per account ([`Bounds`], checked in the submission's transaction); ended
//! jobs, their body emptied in the write that ends them, until `purge`
//! (kept `keep`) and at most [`Bounds::ended_jobs`] per caller and account
//! (the oldest deleted in the write that ends one more: [`kept`]);
//! idempotency keys, each naming a job stored (deleted with it, or after
//! their time); one row per queue (caller, account, rule) while it has
//! jobs; one totals row per caller and per account with unfinished jobs.
//! Deleted rows' pages are reused, so the file stops growing at those
//! bounds (the WAL at [`WAL_KEEP`] after a checkpoint).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;

use async_trait::async_trait;
use bytes::Bytes;
use rusqlite::{params, Connection, OpenFlags, OptionalExtension, Row, TransactionBehavior};
use tokio::sync::oneshot;

use super::{
    Answer, Bound, Bounds, CallerRoom, Cancelled, DueCallback, End, ExpiredJob, Job, JobId, JobState, JobStore, NewJob,
    QueueKey, QueueSummary, Recovered, SubmitError, Submitted, ANSWER_MAX,
};
use crate::jobs::LaneScan;
use crate::store::StoreError;
use crate::time::Micros;

/// The schema version this wxgate writes (`PRAGMA user_version`): 1 is
/// [`SCHEMA`], each later one [`MIGRATIONS`] in turn.
pub const VERSION: i64 = 7;

/// `PRAGMA application_id` of a jobs file ("wxgj").
const APPLICATION_ID: i64 = 0x7778_676a;

/// Bytes of WAL kept on disk after a checkpoint (`journal_size_limit`).
const WAL_KEEP: i64 = 16 << 20;

/// Most pieces of work one transaction (one fsync) takes.
pub const BATCH_MAX: usize = 1024;

/// The schema of version 1 (a new file is created with it, then migrated
/// to [`VERSION`] like an old one). States are stored as numbers
/// (Queued 0, Waiting 1, Claimed 2, Sending 3, Sent 4, Failed 5, Expired 6,
/// Cancelled 7, Unknown 8): below 4 is unfinished.
pub const SCHEMA: &str = "
CREATE TABLE queues (
    qid INTEGER PRIMARY KEY,
    caller TEXT NOT NULL,
    account TEXT NOT NULL,
    rule TEXT NOT NULL,
    UNIQUE (caller, account, rule)
);
CREATE TABLE jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id BLOB NOT NULL UNIQUE,
    qid INTEGER NOT NULL,
    state INTEGER NOT NULL,
    domain TEXT NOT NULL,
    method TEXT NOT NULL,
    target TEXT NOT NULL,
    content_type TEXT,
    body BLOB NOT NULL,
    deadline_us INTEGER,
    idempotency_key TEXT,
    callback TEXT,
    submitted_us INTEGER NOT NULL,
    due_us INTEGER NOT NULL,
    owner TEXT,
    lease_us INTEGER NOT NULL,
    attempts INTEGER NOT NULL,
    answer_status INTEGER,
    answer_errcode INTEGER,
    answer_body BLOB,
    updated_us INTEGER NOT NULL
);
CREATE INDEX jobs_open ON jobs (qid, seq) WHERE state < 4;
CREATE INDEX jobs_queue ON jobs (qid);
CREATE INDEX jobs_leased ON jobs (lease_us) WHERE state IN (2, 3);
CREATE INDEX jobs_ended ON jobs (updated_us) WHERE state >= 4;
CREATE TABLE idempotency (
    caller TEXT NOT NULL,
    account TEXT NOT NULL,
    key TEXT NOT NULL,
    id BLOB NOT NULL,
    until_us INTEGER NOT NULL,
    PRIMARY KEY (caller, account, key)
) WITHOUT ROWID;
CREATE INDEX idempotency_until ON idempotency (until_us);
CREATE TABLE totals (
    kind INTEGER NOT NULL,
    name TEXT NOT NULL,
    jobs INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    PRIMARY KEY (kind, name)
) WITHOUT ROWID;
";

/// `MIGRATIONS[n - 1]` takes a file from version `n` to `n + 1`, in the
/// transaction that opens it.
///
/// 1 → 2: `queues.head_due`, the due time of the queue's head (its
/// lowest-`seq` unfinished job) when that head is `Queued` or `Waiting`,
/// NULL when it is claimed or sending or the queue has none; kept by every
/// write that can change a head ([`scan`]), and indexed by (caller,
/// head due, account, rule), so [`due_queues`] reads each caller's oldest
/// heads without looking at every queue.
///
/// 2 → 3: pending callbacks. `jobs.cb_due`: when an ended job's callback
/// is due (NULL: none pending: no callback, or done); `jobs.cb_tries`: how
/// many times it was handed out; indexed by `cb_due` where pending. Jobs
/// that ended before version 3 have none pending (no build before it
/// posted callbacks).
///
/// 3 → 4: `counts`, each queue's jobs per state, kept by triggers on
/// `jobs` (every insert, state change and delete, whatever statement made
/// it), so [`summary`] reads one row per queue and state instead of every
/// job; and `jobs_deadline`, the deadlines of jobs no dispatcher holds
/// (`Queued`, `Waiting`), which [`expire`] reads.
///
/// 4 → 5: `jobs.trace`, the submitting call's `traceparent` (NULL: not
/// traced), which the send's span links to.
///
/// 5 → 6: `jobs.lanes` ([`crate::jobs::Lanes`]): jobs stored before it
/// keep the order they were queued in (`*`, strict).
///
/// 6 → 7: `jobs_kept`, each queue's ended jobs by when they ended (ties by
/// id), from which [`kept`] takes a caller's oldest in an account. (Only an
/// index: an older wxgate opening the file would not read it.)
pub const MIGRATIONS: &[&str] = &[
    "
ALTER TABLE queues ADD COLUMN head_due INTEGER;
UPDATE queues SET head_due = (SELECT CASE WHEN state < 2 THEN due_us END FROM jobs INDEXED BY jobs_open
    WHERE jobs.qid = queues.qid AND state < 4 ORDER BY seq LIMIT 1);
CREATE INDEX queues_due ON queues (caller, head_due, account, rule) WHERE head_due IS NOT NULL;
",
    "
ALTER TABLE jobs ADD COLUMN cb_due INTEGER;
ALTER TABLE jobs ADD COLUMN cb_tries INTEGER NOT NULL DEFAULT 0;
CREATE INDEX jobs_callbacks ON jobs (cb_due) WHERE cb_due IS NOT NULL;
",
    "
CREATE TABLE counts (
    qid INTEGER NOT NULL,
    state INTEGER NOT NULL,
    jobs INTEGER NOT NULL,
    PRIMARY KEY (qid, state)
) WITHOUT ROWID;
INSERT INTO counts (qid, state, jobs) SELECT qid, state, count(*) FROM jobs GROUP BY qid, state;
CREATE TRIGGER counts_insert AFTER INSERT ON jobs BEGIN
    INSERT INTO counts (qid, state, jobs) VALUES (new.qid, new.state, 1)
        ON CONFLICT (qid, state) DO UPDATE SET jobs = jobs + 1;
END;
CREATE TRIGGER counts_update AFTER UPDATE OF state, qid ON jobs
    WHEN old.state IS NOT new.state OR old.qid IS NOT new.qid BEGIN
    UPDATE counts SET jobs = jobs - 1 WHERE qid = old.qid AND state = old.state;
    INSERT INTO counts (qid, state, jobs) VALUES (new.qid, new.state, 1)
        ON CONFLICT (qid, state) DO UPDATE SET jobs = jobs + 1;
END;
CREATE TRIGGER counts_delete AFTER DELETE ON jobs BEGIN
    UPDATE counts SET jobs = jobs - 1 WHERE qid = old.qid AND state = old.state;
END;
CREATE INDEX jobs_deadline ON jobs (deadline_us) WHERE state < 2 AND deadline_us IS NOT NULL;
",
    "
ALTER TABLE jobs ADD COLUMN trace TEXT;
",
    "
ALTER TABLE jobs ADD COLUMN lanes TEXT NOT NULL DEFAULT '*';
",
    "
CREATE INDEX jobs_kept ON jobs (qid, updated_us, id) WHERE state >= 4;
",
];

/// `totals.kind`.
const CALLER: i64 = 0;
const ACCOUNT: i64 = 1;

/// The columns [`job_from`] reads, of `jobs j` and `queues q`.
macro_rules! job_fields {
    () => {
        "SELECT j.seq, j.id, q.caller, q.account, q.rule, j.state, j.domain, j.method, j.target, \
         j.content_type, j.body, j.deadline_us, j.idempotency_key, j.callback, j.submitted_us, j.due_us, j.owner, \
         j.lease_us, j.attempts, j.answer_status, j.answer_errcode, j.answer_body, j.updated_us, j.trace, j.lanes"
    };
}

/// [`job_fields`] over `jobs j JOIN queues q`.
const JOB_COLS: &str = concat!(job_fields!(), " FROM jobs j JOIN queues q ON q.qid = j.qid");

// A queue's unfinished jobs are read through `jobs_open` (qid, seq of
// unfinished jobs), named: left to itself SQLite picks `jobs_queue` (qid,
// every job, in seq order too) and steps over each of the queue's ended
// jobs kept until `purge` (a week of a campaign's sent jobs) on every
// claim and, for every queue, on every `due_queues`.

/// [`scan`]: the first unfinished jobs of a queue (`?1` its qid), at most
/// `?2`: what a claim needs to know of each (not its body).
const SCAN: &str = "SELECT seq, state, due_us, lanes FROM jobs INDEXED BY jobs_open \
     WHERE qid = ?1 AND state < 4 ORDER BY seq LIMIT ?2";

/// [`lower_head`]: queue `?1`'s `head_due` lowered to `?2` (NULL when it
/// has no unfinished job).
const LOWER_HEAD: &str = "UPDATE queues SET head_due = CASE \
     WHEN NOT EXISTS (SELECT 1 FROM jobs INDEXED BY jobs_open WHERE qid = ?1 AND state < 4) THEN NULL \
     WHEN head_due IS NOT NULL AND head_due <= ?2 THEN head_due ELSE ?2 END \
     WHERE qid = ?1";

/// [`claim`]: one job by seq.
const JOB_BY_SEQ: &str = concat!(job_fields!(), " FROM jobs j JOIN queues q ON q.qid = j.qid WHERE j.seq = ?1");

/// [`callbacks_due`]: pending callbacks due by `?1`, oldest first: the
/// job's fields ([`job_from`], its body left out) and `cb_tries` (read
/// until enough are taken; callers without room passed over).
const CALLBACKS_DUE: &str = "SELECT j.seq, j.id, q.caller, q.account, q.rule, j.state, j.domain, j.method, \
     j.target, j.content_type, X'', j.deadline_us, j.idempotency_key, j.callback, j.submitted_us, j.due_us, \
     j.owner, j.lease_us, j.attempts, j.answer_status, j.answer_errcode, j.answer_body, j.updated_us, j.trace, j.lanes, \
     j.cb_tries \
     FROM jobs j INDEXED BY jobs_callbacks JOIN queues q ON q.qid = j.qid \
     WHERE j.cb_due IS NOT NULL AND j.cb_due <= ?1 ORDER BY j.cb_due";

/// [`kept`]: the queues of caller `?1` in account `?2`.
const KEPT_QUEUES: &str = "SELECT qid FROM queues WHERE caller = ?1 AND account = ?2";

/// [`kept`]: queue `?1`'s ended jobs (`counts`, kept by triggers).
const KEPT_COUNT: &str = "SELECT coalesce(sum(jobs), 0) FROM counts WHERE qid = ?1 AND state >= 4";

/// [`kept`]: queue `?1`'s oldest ended job (ties by id).
const OLDEST_KEPT: &str = "SELECT seq, updated_us, id, idempotency_key FROM jobs INDEXED BY jobs_kept \
     WHERE qid = ?1 AND state >= 4 ORDER BY updated_us, id LIMIT 1";

/// Whether a pending callback is due by `?1` (the index's first entry).
const ANY_CALLBACK_DUE: &str =
    "SELECT 1 FROM jobs INDEXED BY jobs_callbacks WHERE cb_due IS NOT NULL AND cb_due <= ?1 LIMIT 1";

/// [`due_queues`]: the first caller with a head, and its oldest head.
const FIRST_CALLER: &str = "SELECT caller, head_due FROM queues INDEXED BY queues_due \
     WHERE head_due IS NOT NULL ORDER BY caller, head_due LIMIT 1";

/// [`due_queues`]: the next caller after `?1` with a head, and its oldest.
const NEXT_CALLER: &str = "SELECT caller, head_due FROM queues INDEXED BY queues_due \
     WHERE head_due IS NOT NULL AND caller > ?1 ORDER BY caller, head_due LIMIT 1";

/// [`due_queues`]: caller `?1`'s queues whose head is due by `?2`, oldest
/// head first, at most `?3`.
const CALLER_DUE: &str = "SELECT account, rule FROM queues INDEXED BY queues_due \
     WHERE caller = ?1 AND head_due IS NOT NULL AND head_due <= ?2 \
     ORDER BY head_due, account, rule LIMIT ?3";

/// The embedded jobs store (module docs).
pub struct SqliteJobs {
    path: PathBuf,
    sender: Option<mpsc::Sender<Box<dyn Work>>>,
    writer: Option<JoinHandle<()>>,
    read: Arc<Mutex<Connection>>,
    stats: Arc<Stats>,
    /// [`Bounds::ended_jobs`] as the latest submission gave it (none before
    /// one: the jobs that end meanwhile were unfinished, so bounded).
    ended_jobs: Arc<AtomicU64>,
    /// `<file>.lock`, locked while this process has the file open: no other
    /// wxgate uses it, so at start every lease in it is a dead process's
    /// ([`JobStore::recover_at_start`]). `None` on a file system without locks.
    _lock: Option<std::fs::File>,
}

#[derive(Default)]
struct Stats {
    /// Transactions committed by the writer (each one fsync of the WAL).
    commits: AtomicU64,
    /// Pieces of work sent to the writer and not yet taken by it.
    pending: AtomicUsize,
}

impl SqliteJobs {
    /// Opens (or creates) the jobs file at `path`: WAL, `synchronous =
    /// FULL`, the schema created or checked. Refused: a file this wxgate
    /// cannot read (a newer schema, not a jobs file, not SQLite).
    pub fn open(path: &Path) -> Result<SqliteJobs, StoreError> {
        let refused = |e: rusqlite::Error| StoreError::Refused(format!("jobs file {}: {e}", path.display()));
        let lock = lock(path)?;
        create_private(path)?;
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let mut write = Connection::open_with_flags(path, flags).map_err(refused)?;
        configure(&write).map_err(|e| StoreError::Refused(format!("jobs file {}: {e}", path.display())))?;
        let mode: String = write.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0)).map_err(refused)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Refused(format!(
                "jobs file {}: SQLite would not use WAL (journal_mode is {mode})",
                path.display()
            )));
        }
        write.pragma_update(None, "synchronous", "FULL").map_err(refused)?;
        // The WAL is reused after each checkpoint; past this it is cut back.
        write.pragma_update(None, "journal_size_limit", WAL_KEEP).map_err(refused)?;
        migrate(&mut write, path)?;
        let read = Connection::open_with_flags(path, flags).map_err(refused)?;
        configure(&read).map_err(|e| StoreError::Refused(format!("jobs file {}: {e}", path.display())))?;
        read.pragma_update(None, "query_only", true).map_err(refused)?;
        let stats = Arc::new(Stats::default());
        let (sender, receiver) = mpsc::channel::<Box<dyn Work>>();
        let writer_stats = stats.clone();
        let writer = std::thread::Builder::new()
            .name("wxgate-jobs-writer".into())
            .spawn(move || writer_loop(write, receiver, &writer_stats))
            .map_err(|e| StoreError::Refused(format!("jobs file {}: no writer thread: {e}", path.display())))?;
        Ok(SqliteJobs {
            path: path.to_path_buf(),
            sender: Some(sender),
            writer: Some(writer),
            read: Arc::new(Mutex::new(read)),
            stats,
            ended_jobs: Arc::new(AtomicU64::new(u64::MAX)),
            _lock: lock,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Transactions the writer has committed since open (each one fsync):
    /// for tests and benchmarks of group commit.
    pub fn commits(&self) -> u64 {
        self.stats.commits.load(Ordering::Relaxed)
    }

    /// The ended jobs a caller keeps per account ([`Bounds::ended_jobs`]),
    /// as the latest submission gave it.
    fn ended_jobs(&self) -> u64 {
        self.ended_jobs.load(Ordering::Relaxed)
    }

    /// Pieces of work waiting for the writer to take them.
    pub fn pending(&self) -> usize {
        self.stats.pending.load(Ordering::Relaxed)
    }

    /// Stops the writer until the returned hold is dropped (its own
    /// transaction, with nothing written, commits then): for tests that
    /// show what arrives meanwhile shares one transaction. Returns once
    /// the writer holds.
    #[doc(hidden)]
    pub async fn hold_writer(&self) -> Result<WriterHold, StoreError> {
        let (release, released) = mpsc::channel::<()>();
        let (entered, is_entered) = oneshot::channel::<()>();
        let reply = self.write(move |_c| -> Result<(), StoreError> {
            let _ = entered.send(());
            let _ = released.recv();
            Ok(())
        });
        let task = tokio::spawn(reply);
        is_entered.await.map_err(|_| stopped())?;
        Ok(WriterHold { _release: release, _task: task })
    }

    /// Runs `op` on the writer thread inside the next transaction; its
    /// answer once that transaction is committed.
    fn write<T, E, F>(&self, op: F) -> impl std::future::Future<Output = Result<T, E>> + Send + 'static
    where
        T: Send + 'static,
        E: From<StoreError> + Send + 'static,
        F: FnOnce(&Connection) -> Result<T, E> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let task: Box<dyn Work> = Box::new(Task { op: Some(Box::new(op)), result: None, reply });
        let sent = match &self.sender {
            Some(sender) => {
                self.stats.pending.fetch_add(1, Ordering::Relaxed);
                sender.send(task).is_ok()
            }
            None => false,
        };
        async move {
            if !sent {
                return Err(E::from(stopped()));
            }
            answer.await.unwrap_or_else(|_| Err(E::from(stopped())))
        }
    }

    /// Runs `op` on the read connection (a blocking thread).
    async fn read<T, F>(&self, op: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let read = self.read.clone();
        tokio::task::spawn_blocking(move || {
            let conn =
                read.lock().map_err(|_| StoreError::Unreachable("jobs store: read connection poisoned".into()))?;
            op(&conn)
        })
        .await
        .map_err(|e| StoreError::Unreachable(format!("jobs store: read task failed: {e}")))?
    }
}

impl Drop for SqliteJobs {
    fn drop(&mut self) {
        // The writer ends once the channel is closed and what it holds is
        // committed and answered.
        self.sender.take();
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

/// [`SqliteJobs::hold_writer`]'s hold: the writer waits until it is dropped.
pub struct WriterHold {
    _release: mpsc::Sender<()>,
    _task: tokio::task::JoinHandle<Result<(), StoreError>>,
}

fn stopped() -> StoreError {
    StoreError::Unreachable("jobs store: the writer has stopped".into())
}

fn sql(e: rusqlite::Error) -> StoreError {
    StoreError::Unreachable(format!("jobs store: {e}"))
}

fn bad(what: &str) -> StoreError {
    StoreError::Unreachable(format!("jobs store: the file holds {what}"))
}

/// Creates the jobs file readable by its owner only (0600: it holds the
/// messages' bodies); SQLite gives its `-wal` and `-shm` files the same
/// mode. An existing file is left as it is.
/// Takes `<path>.lock` (an advisory lock, as the memory store's state
/// file has): `Err` when another process holds it. On a file system
/// without locks, goes on unlocked (and then [`JobStore::recover_at_start`]
/// only recovers leases that ran out).
fn lock(path: &Path) -> Result<Option<std::fs::File>, StoreError> {
    let mut name = path.as_os_str().to_owned();
    name.push(".lock");
    let lock_path = PathBuf::from(name);
    let mut open = std::fs::OpenOptions::new();
    open.read(true).write(true).create(true).truncate(false);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut open, 0o600);
    let file = open
        .open(&lock_path)
        .map_err(|e| StoreError::Refused(format!("jobs file lock {}: {e}", lock_path.display())))?;
    match fs4::FileExt::try_lock(&file) {
        Ok(()) => Ok(Some(file)),
        Err(fs4::TryLockError::WouldBlock) => Err(StoreError::Refused(format!(
            "another wxgate is using the jobs file {} (its lock {} is held): give each instance its own [queue] file, \
             or use the Redis store to share a queue",
            path.display(),
            lock_path.display()
        ))),
        Err(fs4::TryLockError::Error(e)) => {
            tracing::warn!(lock = %lock_path.display(), error = %e, "cannot lock the jobs file; go on without");
            Ok(None)
        }
    }
}

fn create_private(path: &Path) -> Result<(), StoreError> {
    let mut open = std::fs::OpenOptions::new();
    open.append(true).create(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut open, 0o600);
    open.open(path).map(drop).map_err(|e| StoreError::Refused(format!("jobs file {}: {e}", path.display())))
}

fn configure(conn: &Connection) -> rusqlite::Result<()> {
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    conn.set_prepared_statement_cache_capacity(32);
    Ok(())
}

/// Creates the schema in an empty file, or checks the file's version and
/// brings an older one to [`VERSION`] ([`MIGRATIONS`]), in one transaction.
fn migrate(conn: &mut Connection, path: &Path) -> Result<(), StoreError> {
    let refused = |e: rusqlite::Error| StoreError::Refused(format!("jobs file {}: {e}", path.display()));
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(refused)?;
    let mut version: i64 = tx.pragma_query_value(None, "user_version", |r| r.get(0)).map_err(refused)?;
    let app: i64 = tx.pragma_query_value(None, "application_id", |r| r.get(0)).map_err(refused)?;
    let objects: i64 = tx.query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get(0)).map_err(refused)?;
    if version == 0 && app == 0 && objects == 0 {
        tx.execute_batch(SCHEMA).map_err(refused)?;
        tx.pragma_update(None, "application_id", APPLICATION_ID).map_err(refused)?;
        version = 1;
    } else if app != APPLICATION_ID {
        return Err(StoreError::Refused(format!(
            "jobs file {}: not a wxgate jobs file (an SQLite file with other contents)",
            path.display()
        )));
    }
    if version > VERSION {
        return Err(StoreError::Refused(format!(
            "jobs file {}: written by a newer wxgate (schema version {version}; this wxgate knows up to {VERSION}): \
             run that version, or move the file away",
            path.display()
        )));
    }
    if version < 1 {
        return Err(StoreError::Refused(format!(
            "jobs file {}: schema version {version}, which this wxgate cannot read",
            path.display()
        )));
    }
    while version < VERSION {
        let step = usize::try_from(version - 1).ok().and_then(|i| MIGRATIONS.get(i));
        let step = step
            .ok_or_else(|| StoreError::Refused(format!("jobs file {}: no migration from {version}", path.display())))?;
        tx.execute_batch(step).map_err(refused)?;
        version += 1;
        tx.pragma_update(None, "user_version", version).map_err(refused)?;
    }
    tx.commit().map_err(refused)
}

/// A piece of work for the writer thread.
trait Work: Send {
    /// Runs inside the open transaction (in its own savepoint).
    fn run(&mut self, tx: &mut rusqlite::Transaction<'_>);
    /// Answers once the transaction is committed (`Err`: it was not).
    fn answer(self: Box<Self>, commit: Result<(), &str>);
}

type Op<T, E> = Box<dyn FnOnce(&Connection) -> Result<T, E> + Send>;

struct Task<T, E> {
    op: Option<Op<T, E>>,
    result: Option<Result<T, E>>,
    reply: oneshot::Sender<Result<T, E>>,
}

impl<T: Send, E: From<StoreError> + Send> Work for Task<T, E> {
    fn run(&mut self, tx: &mut rusqlite::Transaction<'_>) {
        let Some(op) = self.op.take() else { return };
        let result = match tx.savepoint() {
            Err(e) => Err(E::from(sql(e))),
            Ok(sp) => match op(&sp) {
                Ok(v) => sp.commit().map(|()| v).map_err(|e| E::from(sql(e))),
                // Dropping the savepoint rolls back what the piece wrote.
                Err(e) => Err(e),
            },
        };
        self.result = Some(result);
    }

    fn answer(self: Box<Self>, commit: Result<(), &str>) {
        let result = match (commit, self.result) {
            (Ok(()), Some(result)) => result,
            (Ok(()), None) => Err(E::from(stopped())),
            (Err(e), _) => Err(E::from(StoreError::Unreachable(format!("jobs store: commit failed: {e}")))),
        };
        let _ = self.reply.send(result);
    }
}

fn writer_loop(mut conn: Connection, receiver: mpsc::Receiver<Box<dyn Work>>, stats: &Stats) {
    while let Ok(first) = receiver.recv() {
        let mut batch = vec![first];
        while batch.len() < BATCH_MAX {
            match receiver.try_recv() {
                Ok(work) => batch.push(work),
                Err(_) => break,
            }
        }
        stats.pending.fetch_sub(batch.len(), Ordering::Relaxed);
        let committed = (|| {
            let mut tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            for work in batch.iter_mut() {
                work.run(&mut tx);
            }
            tx.commit()
        })();
        let committed = committed.map_err(|e| e.to_string());
        if committed.is_ok() {
            stats.commits.fetch_add(1, Ordering::Relaxed);
        }
        for work in batch {
            work.answer(committed.as_ref().map(|_| ()).map_err(|e| e.as_str()));
        }
    }
}

fn state_code(state: JobState) -> i64 {
    match state {
        JobState::Queued => 0,
        JobState::Waiting => 1,
        JobState::Claimed => 2,
        JobState::Sending => 3,
        JobState::Sent => 4,
        JobState::Failed => 5,
        JobState::Expired => 6,
        JobState::Cancelled => 7,
        JobState::Unknown => 8,
    }
}

fn state_from(code: i64) -> Result<JobState, StoreError> {
    Ok(match code {
        0 => JobState::Queued,
        1 => JobState::Waiting,
        2 => JobState::Claimed,
        3 => JobState::Sending,
        4 => JobState::Sent,
        5 => JobState::Failed,
        6 => JobState::Expired,
        7 => JobState::Cancelled,
        8 => JobState::Unknown,
        _ => return Err(bad(&format!("a job state {code}"))),
    })
}

fn id_from(bytes: &[u8]) -> Result<JobId, StoreError> {
    <[u8; 16]>::try_from(bytes).map(JobId).map_err(|_| bad("a job id that is not 16 bytes"))
}

fn job_from(row: &Row<'_>) -> Result<Job, StoreError> {
    let seq: i64 = row.get(0).map_err(sql)?;
    let id: Vec<u8> = row.get(1).map_err(sql)?;
    let caller: String = row.get(2).map_err(sql)?;
    let account: String = row.get(3).map_err(sql)?;
    let rule: String = row.get(4).map_err(sql)?;
    let state: i64 = row.get(5).map_err(sql)?;
    let body: Vec<u8> = row.get(10).map_err(sql)?;
    let owner: Option<String> = row.get(16).map_err(sql)?;
    let attempts: i64 = row.get(18).map_err(sql)?;
    let status: Option<i64> = row.get(19).map_err(sql)?;
    let answer = match status {
        None => None,
        Some(status) => Some(Answer {
            status: u16::try_from(status).map_err(|_| bad("an answer status out of range"))?,
            errcode: row.get(20).map_err(sql)?,
            body: Bytes::from(row.get::<_, Option<Vec<u8>>>(21).map_err(sql)?.unwrap_or_default()),
        }),
    };
    Ok(Job {
        id: id_from(&id)?,
        new: NewJob {
            queue: QueueKey { caller: caller.into(), account: account.into(), rule: rule.into() },
            domain: row.get::<_, String>(6).map_err(sql)?.into(),
            method: row.get(7).map_err(sql)?,
            target: row.get(8).map_err(sql)?,
            content_type: row.get(9).map_err(sql)?,
            body: Bytes::from(body),
            deadline_us: row.get(11).map_err(sql)?,
            idempotency_key: row.get(12).map_err(sql)?,
            callback: row.get(13).map_err(sql)?,
            traceparent: row.get(23).map_err(sql)?,
            lanes: crate::jobs::Lanes(row.get(24).map_err(sql)?),
        },
        seq: u64::try_from(seq).map_err(|_| bad("a negative seq"))?,
        state: state_from(state)?,
        submitted_us: row.get(14).map_err(sql)?,
        due_us: row.get(15).map_err(sql)?,
        owner: owner.map(Arc::from),
        lease_us: row.get(17).map_err(sql)?,
        attempts: u32::try_from(attempts).map_err(|_| bad("attempts out of range"))?,
        answer,
        updated_us: row.get(22).map_err(sql)?,
    })
}

/// Adds `jobs` and `bytes` (negative: takes away) to a caller's or an
/// account's unfinished totals; a row that reaches 0 jobs goes.
fn add_total(c: &Connection, kind: i64, name: &str, jobs: i64, bytes: i64) -> Result<(), StoreError> {
    c.prepare_cached(
        "INSERT INTO totals (kind, name, jobs, bytes) VALUES (?1, ?2, ?3, ?4) \
         ON CONFLICT (kind, name) DO UPDATE SET jobs = jobs + excluded.jobs, bytes = bytes + excluded.bytes",
    )
    .and_then(|mut s| s.execute(params![kind, name, jobs, bytes]))
    .map_err(sql)?;
    if jobs < 0 {
        c.prepare_cached("DELETE FROM totals WHERE kind = ?1 AND name = ?2 AND jobs <= 0")
            .and_then(|mut s| s.execute(params![kind, name]))
            .map_err(sql)?;
    }
    Ok(())
}

/// Job `seq` ended (its state already written): it counts no more against
/// its caller's and account's unfinished bounds, its body is deleted (only
/// its metadata and WeChat's answer are kept), and it counts against the
/// caller's ended jobs in the account ([`kept`]).
fn ended(c: &Connection, seq: i64, caller: &str, account: &str, bytes: i64, most: u64) -> Result<(), StoreError> {
    add_total(c, CALLER, caller, -1, -bytes)?;
    add_total(c, ACCOUNT, account, -1, -bytes)?;
    c.prepare_cached("UPDATE jobs SET body = X'' WHERE seq = ?1")
        .and_then(|mut s| s.execute(params![seq]))
        .map_err(sql)?;
    kept(c, caller, account, most)
}

/// Most jobs one end deletes past [`Bounds::ended_jobs`]: two, so a
/// caller already past it (the bound lowered by a reload, or jobs that
/// ended before the store knew it) comes back under it one job per end,
/// and no end does unbounded work.
const EVICT_PER_END: usize = 2;

/// Keeps `caller`'s ended jobs in `account` at `most`: past it, deletes the
/// oldest (by when they ended, ties by id; a pending callback goes with its
/// job, given up), each with the `Idempotency-Key` that names it. Work: one
/// probe of `counts` and of `jobs_kept` per queue of the caller in the
/// account (one per rule), whatever the number of jobs.
fn kept(c: &Connection, caller: &str, account: &str, most: u64) -> Result<(), StoreError> {
    let qids: Vec<i64> = c
        .prepare_cached(KEPT_QUEUES)
        .and_then(|mut s| s.query_map(params![caller, account], |r| r.get(0))?.collect())
        .map_err(sql)?;
    let mut held: i64 = 0;
    for qid in &qids {
        held += c
            .prepare_cached(KEPT_COUNT)
            .and_then(|mut s| s.query_row(params![qid], |r| r.get::<_, i64>(0)))
            .map_err(sql)?;
    }
    let over = u64::try_from(held).unwrap_or(0).saturating_sub(most);
    for _ in 0..over.min(EVICT_PER_END as u64) {
        let mut oldest: Option<(i64, Vec<u8>, i64, Option<String>)> = None;
        for qid in &qids {
            let head: Option<(i64, i64, Vec<u8>, Option<String>)> = c
                .prepare_cached(OLDEST_KEPT)
                .and_then(|mut s| {
                    s.query_row(params![qid], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))).optional()
                })
                .map_err(sql)?;
            if let Some((seq, at, id, key)) = head {
                if oldest.as_ref().is_none_or(|o| (at, &id) < (o.0, &o.1)) {
                    oldest = Some((at, id, seq, key));
                }
            }
        }
        let Some((_, id, seq, key)) = oldest else { break };
        c.prepare_cached("DELETE FROM jobs WHERE seq = ?1").and_then(|mut s| s.execute(params![seq])).map_err(sql)?;
        if let Some(key) = key {
            c.prepare_cached("DELETE FROM idempotency WHERE caller = ?1 AND account = ?2 AND key = ?3 AND id = ?4")
                .and_then(|mut s| s.execute(params![caller, account, key, id]))
                .map_err(sql)?;
        }
    }
    Ok(())
}

/// Whether one more job of `bytes` stays within `max_jobs`/`max_bytes` of
/// this caller's or account's unfinished totals.
fn check_total(
    c: &Connection,
    kind: i64,
    name: &str,
    bytes: i64,
    (max_jobs, max_bytes): (u64, u64),
    (jobs_bound, bytes_bound): (Bound, Bound),
) -> Result<(), SubmitError> {
    let (jobs, held): (i64, i64) = c
        .prepare_cached("SELECT jobs, bytes FROM totals WHERE kind = ?1 AND name = ?2")
        .and_then(|mut s| s.query_row(params![kind, name], |r| Ok((r.get(0)?, r.get(1)?))).optional())
        .map_err(sql)?
        .unwrap_or((0, 0));
    if i128::from(jobs) + 1 > i128::from(max_jobs) {
        return Err(SubmitError::Full(jobs_bound));
    }
    if i128::from(held) + i128::from(bytes) > i128::from(max_bytes) {
        return Err(SubmitError::Full(bytes_bound));
    }
    Ok(())
}

fn body_len(body: &Bytes) -> i64 {
    i64::try_from(body.len()).unwrap_or(i64::MAX)
}

fn submit(c: &Connection, id: JobId, job: NewJob, bounds: Bounds, now: Micros) -> Result<Submitted, SubmitError> {
    let caller: &str = &job.queue.caller;
    if let Some(key) = &job.idempotency_key {
        let first: Option<(Vec<u8>, i64)> = c
            .prepare_cached("SELECT id, until_us FROM idempotency WHERE caller = ?1 AND account = ?2 AND key = ?3")
            .and_then(|mut s| {
                s.query_row(params![caller, &*job.queue.account, key], |r| Ok((r.get(0)?, r.get(1)?))).optional()
            })
            .map_err(sql)?;
        if let Some((first, until_us)) = first {
            if now < until_us {
                return Ok(Submitted { id: id_from(&first)?, duplicate: true });
            }
        }
    }
    let bytes = body_len(&job.body);
    let caller_max = (bounds.caller_jobs, bounds.caller_bytes);
    check_total(c, CALLER, caller, bytes, caller_max, (Bound::CallerJobs, Bound::CallerBytes))?;
    let account_max = (bounds.account_jobs, bounds.account_bytes);
    check_total(c, ACCOUNT, &job.queue.account, bytes, account_max, (Bound::AccountJobs, Bound::AccountBytes))?;
    let qid = queue_id(c, &job.queue, true)?.ok_or_else(|| bad("no queue row after inserting it"))?;
    c.prepare_cached(
        "INSERT INTO jobs (id, qid, state, domain, method, target, content_type, body, deadline_us, \
         idempotency_key, callback, submitted_us, due_us, owner, lease_us, attempts, updated_us, trace, lanes) \
         VALUES (?1, ?2, 0, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?11, NULL, 0, 0, ?11, ?12, ?13)",
    )
    .and_then(|mut s| {
        s.execute(params![
            &id.0[..],
            qid,
            &*job.domain,
            job.method,
            job.target,
            job.content_type,
            &job.body[..],
            job.deadline_us,
            job.idempotency_key,
            job.callback,
            now,
            job.traceparent,
            job.lanes.as_str(),
        ])
    })
    .map_err(sql)?;
    if let Some(key) = &job.idempotency_key {
        c.prepare_cached(
            "INSERT OR REPLACE INTO idempotency (caller, account, key, id, until_us) VALUES (?1, ?2, ?3, ?4, ?5)",
        )
        .and_then(|mut s| {
            let until = now.saturating_add(bounds.idempotency_us);
            s.execute(params![caller, &*job.queue.account, key, &id.0[..], until])
        })
        .map_err(sql)?;
    }
    add_total(c, CALLER, caller, 1, bytes)?;
    add_total(c, ACCOUNT, &job.queue.account, 1, bytes)?;
    lower_head(c, qid, now)?;
    Ok(Submitted { id, duplicate: false })
}

/// The queue's row id (created when `create`).
fn queue_id(c: &Connection, queue: &QueueKey, create: bool) -> Result<Option<i64>, StoreError> {
    let key = params![&*queue.caller, &*queue.account, &*queue.rule];
    if create {
        c.prepare_cached("INSERT INTO queues (caller, account, rule) VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING")
            .and_then(|mut s| s.execute(key))
            .map_err(sql)?;
    }
    c.prepare_cached("SELECT qid FROM queues WHERE caller = ?1 AND account = ?2 AND rule = ?3")
        .and_then(|mut s| s.query_row(key, |r| r.get(0)).optional())
        .map_err(sql)
}

/// What a state change needs to know of a job.
struct Held {
    seq: i64,
    qid: i64,
    state: JobState,
    owner: Option<String>,
    caller: String,
    account: String,
    bytes: i64,
}

fn held(c: &Connection, id: JobId) -> Result<Option<Held>, StoreError> {
    let row = c
        .prepare_cached(
            "SELECT j.seq, j.state, j.owner, q.caller, q.account, length(j.body), j.qid \
             FROM jobs j JOIN queues q ON q.qid = j.qid WHERE j.id = ?1",
        )
        .and_then(|mut s| {
            s.query_row(params![&id.0[..]], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?))
            })
            .optional()
        })
        .map_err(sql)?;
    match row {
        None => Ok(None),
        Some((seq, state, owner, caller, account, bytes, qid)) => {
            Ok(Some(Held { seq, qid, state: state_from(state)?, owner, caller, account, bytes }))
        }
    }
}

fn claim(
    c: &Connection,
    queue: &QueueKey,
    owner: &str,
    now: Micros,
    lease_us: Micros,
    max: usize,
) -> Result<Vec<Job>, StoreError> {
    let Some(qid) = queue_id(c, queue, false)? else { return Ok(Vec::new()) };
    let picked = scan(c, qid, now, max)?;
    let until = now.saturating_add(lease_us);
    let mut claimed = Vec::with_capacity(picked.len());
    for seq in picked {
        c.prepare_cached("UPDATE jobs SET state = 2, owner = ?2, lease_us = ?3, updated_us = ?4 WHERE seq = ?1")
            .and_then(|mut s| s.execute(params![seq, owner, until, now]))
            .map_err(sql)?;
        let mut s = c.prepare_cached(JOB_BY_SEQ).map_err(sql)?;
        let mut rows = s.query(params![seq]).map_err(sql)?;
        if let Some(row) = rows.next().map_err(sql)? {
            claimed.push(job_from(row)?);
        }
    }
    Ok(claimed)
}

/// Walks the queue `qid`'s first [`crate::jobs::CLAIM_SCAN`] unfinished
/// jobs ([`LaneScan`]): the seqs of at most `max` free jobs due by `now`,
/// and the queue's `head_due` set to the earliest due time of a free job
/// left (NULL: none). With `max` 0 (`recover`) it only sets that, stopping
/// at the first free job due by `now`.
fn scan(c: &Connection, qid: i64, now: Micros, max: usize) -> Result<Vec<i64>, StoreError> {
    let mut lanes = LaneScan::default();
    let mut picked = Vec::new();
    {
        let mut s = c.prepare_cached(SCAN).map_err(sql)?;
        let limit = i64::try_from(crate::jobs::CLAIM_SCAN.max(max.saturating_mul(2))).unwrap_or(i64::MAX);
        let mut rows = s.query(params![qid, limit]).map_err(sql)?;
        while let Some(row) = rows.next().map_err(sql)? {
            let (seq, state, due): (i64, i64, i64) =
                (row.get(0).map_err(sql)?, row.get(1).map_err(sql)?, row.get(2).map_err(sql)?);
            let ln: String = row.get(3).map_err(sql)?;
            let free = lanes.visit(&ln);
            if free && state < 2 {
                if due <= now && picked.len() < max {
                    picked.push(seq);
                } else {
                    lanes.waits(due);
                }
            }
            if picked.len() >= max && lanes.next_due.is_some_and(|d| d <= now) {
                break;
            }
        }
    }
    c.prepare_cached("UPDATE queues SET head_due = ?2 WHERE qid = ?1")
        .and_then(|mut s| s.execute(params![qid, lanes.next_due]))
        .map_err(sql)?;
    Ok(picked)
}

/// After a write that may have made a job free to claim from `at` on (a
/// submission; a job ended, cancelled or expired, its lanes freed; a job
/// handed back until `at`): queue `qid`'s `head_due` lowered to `at`, with
/// no walk (O(1) whatever is in flight at the queue's front). Never too
/// late; too early at worst (nothing was freed after all): that costs one
/// claim, whose [`scan`] sets the exact time (only a claim and `recover`
/// walk the queue, and only they raise the head).
fn lower_head(c: &Connection, qid: i64, at: Micros) -> Result<(), StoreError> {
    c.prepare_cached(LOWER_HEAD).and_then(|mut s| s.execute(params![qid, at])).map_err(sql)?;
    Ok(())
}

fn renew(c: &Connection, ids: &[JobId], owner: &str, until: Micros) -> Result<usize, StoreError> {
    let mut n = 0;
    for id in ids {
        n += c
            .prepare_cached("UPDATE jobs SET lease_us = ?3 WHERE id = ?1 AND owner = ?2 AND state IN (2, 3)")
            .and_then(|mut s| s.execute(params![&id.0[..], owner, until]))
            .map_err(sql)?;
    }
    Ok(n)
}

fn finish(c: &Connection, id: JobId, owner: &str, end: End, now: Micros, most: u64) -> Result<bool, StoreError> {
    let Some(job) = held(c, id)? else { return Ok(false) };
    if !matches!(job.state, JobState::Claimed | JobState::Sending) || job.owner.as_deref() != Some(owner) {
        return Ok(false);
    }
    // "Never sent" is not for a job that may have been.
    if job.state == JobState::Sending && matches!(end, End::NotYet { .. } | End::Expired) {
        return Ok(false);
    }
    let (state, due, answer) = match end {
        End::Sent(a) => (JobState::Sent, None, Some(a)),
        End::Failed(a) => (JobState::Failed, None, Some(a)),
        End::Retry { at, answer } => (if at <= now { JobState::Queued } else { JobState::Waiting }, Some(at), answer),
        End::NotYet { at } => (if at <= now { JobState::Queued } else { JobState::Waiting }, Some(at), None),
        End::Expired => (JobState::Expired, None, None),
        End::Unknown(a) => (JobState::Unknown, None, a),
    };
    let code = state_code(state);
    c.prepare_cached(
        "UPDATE jobs SET state = ?2, owner = NULL, lease_us = 0, updated_us = ?3, due_us = coalesce(?4, due_us) \
         WHERE seq = ?1",
    )
    .and_then(|mut s| s.execute(params![job.seq, code, now, due]))
    .map_err(sql)?;
    if let Some(a) = answer {
        let body = &a.body[..a.body.len().min(ANSWER_MAX)];
        c.prepare_cached("UPDATE jobs SET answer_status = ?2, answer_errcode = ?3, answer_body = ?4 WHERE seq = ?1")
            .and_then(|mut s| s.execute(params![job.seq, a.status, a.errcode, body]))
            .map_err(sql)?;
    }
    if state.ended() {
        ended(c, job.seq, &job.caller, &job.account, job.bytes, most)?;
        callback_pending(c, job.seq, now)?;
    }
    // Its lanes freed (it ended), or it waits until `due` holding them.
    lower_head(c, job.qid, due.map_or(now, |d| d.max(now)))?;
    Ok(true)
}

/// A job that just ended: its callback, if it has one, pending and due now
/// (in the write that ended it).
fn callback_pending(c: &Connection, seq: i64, now: Micros) -> Result<(), StoreError> {
    c.prepare_cached("UPDATE jobs SET cb_due = ?2, cb_tries = 0 WHERE seq = ?1 AND callback IS NOT NULL")
        .and_then(|mut s| s.execute(params![seq, now]))
        .map_err(sql)?;
    Ok(())
}

fn callbacks_due(
    c: &Connection,
    now: Micros,
    lease_us: Micros,
    max: usize,
    room: &CallerRoom,
) -> Result<Vec<DueCallback>, StoreError> {
    if max == 0 {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    let mut taken: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    {
        let mut s = c.prepare_cached(CALLBACKS_DUE).map_err(sql)?;
        let mut rows = s.query(params![now]).map_err(sql)?;
        while out.len() < max {
            let Some(row) = rows.next().map_err(sql)? else { break };
            let caller: String = row.get(2).map_err(sql)?;
            let left = room.of(&caller);
            let n = taken.entry(caller).or_default();
            if *n >= left {
                continue;
            }
            *n += 1;
            let tries: i64 = row.get(25).map_err(sql)?;
            let tries = u32::try_from(tries.saturating_add(1)).map_err(|_| bad("callback tries out of range"))?;
            out.push(DueCallback { job: job_from(row)?, tries });
        }
    }
    let again = now.saturating_add(lease_us);
    for due in &out {
        let seq = i64::try_from(due.job.seq).map_err(|_| bad("a seq out of range"))?;
        c.prepare_cached("UPDATE jobs SET cb_due = ?2, cb_tries = ?3 WHERE seq = ?1")
            .and_then(|mut s| s.execute(params![seq, again, due.tries]))
            .map_err(sql)?;
    }
    Ok(out)
}

fn callback_done(c: &Connection, id: JobId, tries: u32, retry_at: Option<Micros>) -> Result<bool, StoreError> {
    c.prepare_cached("UPDATE jobs SET cb_due = ?3 WHERE id = ?1 AND cb_tries = ?2 AND cb_due IS NOT NULL")
        .and_then(|mut s| s.execute(params![&id.0[..], tries, retry_at]))
        .map(|n| n == 1)
        .map_err(sql)
}

/// Leases that end by `cutoff` (`now` but at start, when every lease is a
/// dead process's), ended or requeued at `now`.
fn recover(c: &Connection, cutoff: Micros, now: Micros, most: u64) -> Result<Recovered, StoreError> {
    let mut out = Vec::new();
    {
        let mut s = c
            .prepare_cached(
                "SELECT j.seq, j.state, q.caller, q.account, length(j.body), j.qid \
                 FROM jobs j JOIN queues q ON q.qid = j.qid WHERE j.state IN (2, 3) AND j.lease_us <= ?1",
            )
            .map_err(sql)?;
        let mut rows = s.query(params![cutoff]).map_err(sql)?;
        while let Some(r) = rows.next().map_err(sql)? {
            let row: (i64, i64, String, String, i64, i64) = (
                r.get(0).map_err(sql)?,
                r.get(1).map_err(sql)?,
                r.get(2).map_err(sql)?,
                r.get(3).map_err(sql)?,
                r.get(4).map_err(sql)?,
                r.get(5).map_err(sql)?,
            );
            out.push(row);
        }
    }
    let mut recovered = Recovered::default();
    let mut queues = std::collections::BTreeSet::new();
    for (seq, state, caller, account, bytes, qid) in out {
        queues.insert(qid);
        if state == state_code(JobState::Claimed) {
            c.prepare_cached("UPDATE jobs SET state = 0, owner = NULL, lease_us = 0, updated_us = ?2 WHERE seq = ?1")
                .and_then(|mut s| s.execute(params![seq, now]))
                .map_err(sql)?;
            recovered.requeued += 1;
        } else {
            c.prepare_cached("UPDATE jobs SET state = 8, owner = NULL, lease_us = 0, updated_us = ?2 WHERE seq = ?1")
                .and_then(|mut s| s.execute(params![seq, now]))
                .map_err(sql)?;
            ended(c, seq, &caller, &account, bytes, most)?;
            callback_pending(c, seq, now)?;
            recovered.unknown += 1;
        }
    }
    for qid in queues {
        scan(c, qid, now, 0)?;
    }
    Ok(recovered)
}

fn cancel(c: &Connection, caller: &str, id: JobId, now: Micros, most: u64) -> Result<Cancelled, StoreError> {
    let Some(job) = held(c, id)? else { return Ok(Cancelled::NotFound) };
    if job.caller != caller {
        return Ok(Cancelled::NotFound);
    }
    if !matches!(job.state, JobState::Queued | JobState::Waiting | JobState::Claimed) {
        return Ok(Cancelled::TooLate(job.state));
    }
    c.prepare_cached("UPDATE jobs SET state = 7, owner = NULL, lease_us = 0, updated_us = ?2 WHERE seq = ?1")
        .and_then(|mut s| s.execute(params![job.seq, now]))
        .map_err(sql)?;
    ended(c, job.seq, &job.caller, &job.account, job.bytes, most)?;
    callback_pending(c, job.seq, now)?;
    lower_head(c, job.qid, now)?;
    Ok(Cancelled::Cancelled)
}

/// [`purge`]: ended jobs that ended before `?1`, their callback done, and
/// no `Idempotency-Key` that counts at `?2` naming them (such a job is kept
/// until its key's time: a repeat of it finds the job, never a new one).
const PURGE: &str = "DELETE FROM jobs WHERE state >= 4 AND updated_us < ?1 AND cb_due IS NULL \
     AND NOT EXISTS (SELECT 1 FROM queues q JOIN idempotency i ON i.caller = q.caller AND i.account = q.account \
     WHERE q.qid = jobs.qid AND i.key = jobs.idempotency_key AND i.id = jobs.id AND i.until_us > ?2)";

fn purge(c: &Connection, now: Micros, keep_us: Micros) -> Result<u64, StoreError> {
    let before = now.saturating_sub(keep_us);
    let jobs = c.prepare_cached(PURGE).and_then(|mut s| s.execute(params![before, now])).map_err(sql)?;
    c.prepare_cached("DELETE FROM idempotency WHERE until_us <= ?1")
        .and_then(|mut s| s.execute(params![now]))
        .map_err(sql)?;
    c.prepare_cached("DELETE FROM queues WHERE NOT EXISTS (SELECT 1 FROM jobs WHERE jobs.qid = queues.qid)")
        .and_then(|mut s| s.execute([]))
        .map_err(sql)?;
    c.prepare_cached("DELETE FROM counts WHERE jobs <= 0").and_then(|mut s| s.execute([])).map_err(sql)?;
    Ok(u64::try_from(jobs).unwrap_or(u64::MAX))
}

fn get(c: &Connection, caller: &str, id: JobId) -> Result<Option<Job>, StoreError> {
    let mut s = c.prepare_cached(&format!("{JOB_COLS} WHERE j.id = ?1 AND q.caller = ?2")).map_err(sql)?;
    let mut rows = s.query(params![&id.0[..], caller]).map_err(sql)?;
    match rows.next().map_err(sql)? {
        Some(row) => Ok(Some(job_from(row)?)),
        None => Ok(None),
    }
}

/// [`JobStore::due_queues`], on the read connection in one read
/// transaction (one snapshot): the callers with a head, each found by one
/// probe of `queues_due` past the previous one (with its oldest head);
/// those whose oldest head is due, in that order (ties by name); then each
/// one's first `per_caller` due queues from the same index. Work:
/// O(C log Q + D) for C callers with a head, Q queues and D queues listed,
/// however many queues or jobs there are.
fn due_queues(c: &Connection, now: Micros, per_caller: usize) -> Result<Vec<QueueKey>, StoreError> {
    if per_caller == 0 {
        return Ok(Vec::new());
    }
    let per_caller = i64::try_from(per_caller).unwrap_or(i64::MAX);
    let tx = c.unchecked_transaction().map_err(sql)?;
    let mut callers: Vec<(i64, String)> = Vec::new();
    let mut next = tx
        .prepare_cached(FIRST_CALLER)
        .and_then(|mut s| s.query_row([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?))).optional())
        .map_err(sql)?;
    while let Some((caller, oldest)) = next {
        next = tx
            .prepare_cached(NEXT_CALLER)
            .and_then(|mut s| {
                s.query_row(params![caller], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?))).optional()
            })
            .map_err(sql)?;
        if oldest <= now {
            callers.push((oldest, caller));
        }
    }
    callers.sort();
    let mut out = Vec::new();
    let mut s = tx.prepare_cached(CALLER_DUE).map_err(sql)?;
    for (_, caller) in callers {
        let caller: Arc<str> = caller.into();
        let mut rows = s.query(params![&*caller, now, per_caller]).map_err(sql)?;
        while let Some(r) = rows.next().map_err(sql)? {
            let (account, rule): (String, String) = (r.get(0).map_err(sql)?, r.get(1).map_err(sql)?);
            out.push(QueueKey { caller: caller.clone(), account: account.into(), rule: rule.into() });
        }
    }
    Ok(out)
}

/// [`expire`]: jobs no dispatcher holds whose deadline is `?1` or earlier,
/// earliest first, at most `?2`.
const EXPIRED: &str = "SELECT j.seq, j.id, q.caller, q.account, q.rule, length(j.body), j.qid, j.submitted_us \
     FROM jobs j INDEXED BY jobs_deadline JOIN queues q ON q.qid = j.qid \
     WHERE j.state < 2 AND j.deadline_us IS NOT NULL AND j.deadline_us <= ?1 ORDER BY j.deadline_us LIMIT ?2";

/// Whether a job no dispatcher holds has a deadline by `?1`.
const ANY_EXPIRED: &str =
    "SELECT 1 FROM jobs INDEXED BY jobs_deadline WHERE state < 2 AND deadline_us IS NOT NULL AND deadline_us <= ?1 LIMIT 1";

fn expire(c: &Connection, now: Micros, max: usize, most: u64) -> Result<Vec<ExpiredJob>, StoreError> {
    let limit = i64::try_from(max).unwrap_or(i64::MAX);
    let mut found = Vec::new();
    {
        let mut s = c.prepare_cached(EXPIRED).map_err(sql)?;
        let mut rows = s.query(params![now, limit]).map_err(sql)?;
        while let Some(r) = rows.next().map_err(sql)? {
            let id: Vec<u8> = r.get(1).map_err(sql)?;
            let queue = QueueKey {
                caller: r.get::<_, String>(2).map_err(sql)?.into(),
                account: r.get::<_, String>(3).map_err(sql)?.into(),
                rule: r.get::<_, String>(4).map_err(sql)?.into(),
            };
            let row: (i64, i64, i64, i64) =
                (r.get(0).map_err(sql)?, r.get(5).map_err(sql)?, r.get(6).map_err(sql)?, r.get(7).map_err(sql)?);
            found.push((row, ExpiredJob { id: id_from(&id)?, queue, submitted_us: row.3 }));
        }
    }
    let mut queues = std::collections::BTreeSet::new();
    let mut out = Vec::with_capacity(found.len());
    for ((seq, bytes, qid, _), job) in found {
        c.prepare_cached("UPDATE jobs SET state = 6, owner = NULL, lease_us = 0, updated_us = ?2 WHERE seq = ?1")
            .and_then(|mut s| s.execute(params![seq, now]))
            .map_err(sql)?;
        ended(c, seq, &job.queue.caller, &job.queue.account, bytes, most)?;
        callback_pending(c, seq, now)?;
        queues.insert(qid);
        out.push(job);
    }
    for qid in queues {
        lower_head(c, qid, now)?;
    }
    Ok(out)
}

/// [`summary`]: each queue's counts by state (`counts`, kept by triggers).
const COUNTS: &str = "SELECT q.qid, q.caller, q.account, q.rule, c.state, c.jobs \
     FROM counts c JOIN queues q ON q.qid = c.qid WHERE c.jobs > 0 AND (?1 IS NULL OR q.caller = ?1)";

/// [`summary`]: a queue's oldest unfinished job's submission (its head's:
/// a queue is in submission order).
const OLDEST: &str =
    "SELECT submitted_us FROM jobs INDEXED BY jobs_open WHERE qid = ?1 AND state < 4 ORDER BY seq LIMIT 1";

/// Every queue's counts: one row per queue and state it has jobs in, and
/// one probe of `jobs_open` per queue with unfinished jobs, whatever the
/// number of jobs.
fn summary(c: &Connection, caller: Option<&str>) -> Result<Vec<QueueSummary>, StoreError> {
    let mut s = c.prepare_cached(COUNTS).map_err(sql)?;
    let mut rows = s.query(params![caller]).map_err(sql)?;
    let mut queues: BTreeMap<QueueKey, (i64, QueueSummary)> = BTreeMap::new();
    while let Some(r) = rows.next().map_err(sql)? {
        let qid: i64 = r.get(0).map_err(sql)?;
        let (caller, account, rule): (String, String, String) =
            (r.get(1).map_err(sql)?, r.get(2).map_err(sql)?, r.get(3).map_err(sql)?);
        let state = state_from(r.get(4).map_err(sql)?)?;
        let count = u64::try_from(r.get::<_, i64>(5).map_err(sql)?).unwrap_or(0);
        let queue = QueueKey { caller: caller.into(), account: account.into(), rule: rule.into() };
        queues.entry(queue.clone()).or_insert_with(|| (qid, QueueSummary::new(queue))).1.add(state, count);
    }
    drop(rows);
    let mut oldest = c.prepare_cached(OLDEST).map_err(sql)?;
    let mut out = Vec::with_capacity(queues.len());
    for (qid, mut entry) in queues.into_values() {
        if entry.queued + entry.waiting + entry.sending > 0 {
            entry.oldest_us = oldest.query_row(params![qid], |r| r.get(0)).optional().map_err(sql)?;
        }
        out.push(entry);
    }
    Ok(out)
}

#[async_trait]
impl JobStore for SqliteJobs {
    async fn submit(&self, job: NewJob, bounds: &Bounds, now: Micros) -> Result<Submitted, SubmitError> {
        let id = JobId::random().map_err(|_| StoreError::Unreachable("jobs store: no random job id".into()))?;
        let bounds = *bounds;
        self.ended_jobs.store(bounds.ended_jobs, Ordering::Relaxed);
        self.write(move |c| submit(c, id, job, bounds, now)).await
    }

    async fn due_queues(&self, now: Micros, per_caller: usize) -> Result<Vec<QueueKey>, StoreError> {
        self.read(move |c| due_queues(c, now, per_caller)).await
    }

    async fn claim(
        &self,
        queue: &QueueKey,
        owner: &str,
        now: Micros,
        lease_us: Micros,
        max: usize,
    ) -> Result<Vec<Job>, StoreError> {
        let (queue, owner) = (queue.clone(), owner.to_owned());
        self.write(move |c| claim(c, &queue, &owner, now, lease_us, max)).await
    }

    async fn renew(&self, ids: &[JobId], owner: &str, now: Micros, lease_us: Micros) -> Result<usize, StoreError> {
        if ids.is_empty() {
            return Ok(0);
        }
        let (ids, owner) = (ids.to_vec(), owner.to_owned());
        self.write(move |c| renew(c, &ids, &owner, now.saturating_add(lease_us))).await
    }

    async fn sending(&self, id: JobId, owner: &str, now: Micros) -> Result<bool, StoreError> {
        let owner = owner.to_owned();
        self.write(move |c| {
            c.prepare_cached(
                "UPDATE jobs SET state = 3, attempts = attempts + 1, updated_us = ?3 \
                 WHERE id = ?1 AND state = 2 AND owner = ?2 AND lease_us > ?3",
            )
            .and_then(|mut s| s.execute(params![&id.0[..], owner, now]))
            .map(|n| n == 1)
            .map_err(sql)
        })
        .await
    }

    async fn finish(&self, id: JobId, owner: &str, end: End, now: Micros) -> Result<bool, StoreError> {
        let owner = owner.to_owned();
        let most = self.ended_jobs();
        self.write(move |c| finish(c, id, &owner, end, now, most)).await
    }

    async fn recover(&self, now: Micros) -> Result<Recovered, StoreError> {
        let most = self.ended_jobs();
        self.write(move |c| recover(c, now, now, most)).await
    }

    async fn recover_at_start(&self, now: Micros) -> Result<Recovered, StoreError> {
        match self._lock {
            Some(_) => {
                let most = self.ended_jobs();
                self.write(move |c| recover(c, Micros::MAX, now, most)).await
            }
            None => self.recover(now).await,
        }
    }

    async fn expire(&self, now: Micros, max: usize) -> Result<Vec<ExpiredJob>, StoreError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        // One probe of the index on the read connection first: a look that
        // finds nothing costs no turn of the writer.
        let any = self
            .read(move |c| c.prepare_cached(ANY_EXPIRED).and_then(|mut s| s.exists(params![now])).map_err(sql))
            .await?;
        if !any {
            return Ok(Vec::new());
        }
        let most = self.ended_jobs();
        self.write(move |c| expire(c, now, max, most)).await
    }

    async fn get(&self, caller: &str, id: JobId) -> Result<Option<Job>, StoreError> {
        let caller = caller.to_owned();
        self.read(move |c| get(c, &caller, id)).await
    }

    async fn cancel(&self, caller: &str, id: JobId, now: Micros) -> Result<Cancelled, StoreError> {
        let caller = caller.to_owned();
        let most = self.ended_jobs();
        self.write(move |c| cancel(c, &caller, id, now, most)).await
    }

    async fn summary(&self, caller: Option<&str>) -> Result<Vec<QueueSummary>, StoreError> {
        let caller = caller.map(str::to_owned);
        self.read(move |c| summary(c, caller.as_deref())).await
    }

    async fn purge(&self, now: Micros, keep_us: Micros) -> Result<u64, StoreError> {
        self.write(move |c| purge(c, now, keep_us)).await
    }

    async fn callbacks_due(
        &self,
        now: Micros,
        lease_us: Micros,
        max: usize,
        room: &CallerRoom,
    ) -> Result<Vec<DueCallback>, StoreError> {
        // One probe of the index on the read connection first: an idle
        // loop's look costs no turn of the writer.
        let any = self
            .read(move |c| c.prepare_cached(ANY_CALLBACK_DUE).and_then(|mut s| s.exists(params![now])).map_err(sql))
            .await?;
        if !any {
            return Ok(Vec::new());
        }
        let room = room.clone();
        self.write(move |c| callbacks_due(c, now, lease_us, max, &room)).await
    }

    async fn callback_done(
        &self,
        id: JobId,
        tries: u32,
        retry_at: Option<Micros>,
        _now: Micros,
    ) -> Result<bool, StoreError> {
        self.write(move |c| callback_done(c, id, tries, retry_at)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plan SQLite gives `sql`, one line per step.
    fn plan(c: &Connection, sql: &str) -> String {
        let mut s = c.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).expect("explain");
        let args = rusqlite::params_from_iter(1..=s.parameter_count() as i64);
        let rows = s.query_map(args, |r| r.get::<_, String>(3)).expect("plan");
        rows.map(|r| r.expect("a step")).collect::<Vec<_>>().join("\n")
    }

    /// A queue's head is found through the index of unfinished jobs, not by
    /// stepping over the queue's ended jobs (kept for a week: a campaign's
    /// 100,000 sent jobs made each probe 13 ms instead of 20 µs); the due
    /// queues are read from the index of heads, never by a scan or a sort.
    #[test]
    fn claim_and_due_queues_read_a_queue_through_its_unfinished_jobs_only() {
        let c = Connection::open_in_memory().expect("open");
        c.execute_batch(SCHEMA).expect("schema");
        for step in MIGRATIONS {
            c.execute_batch(step).expect("migrate");
        }
        for sql in [CALLBACKS_DUE, ANY_CALLBACK_DUE] {
            let plan = plan(&c, sql);
            assert!(plan.contains("jobs_callbacks") && !plan.contains("TEMP B-TREE"), "{sql}:\n{plan}");
        }
        for sql in [SCAN, LOWER_HEAD] {
            let plan = plan(&c, sql);
            assert!(plan.contains("jobs_open") && !plan.contains("jobs_queue"), "{sql}:\n{plan}");
        }
        for sql in [FIRST_CALLER, NEXT_CALLER, CALLER_DUE] {
            let plan = plan(&c, sql);
            assert!(plan.contains("queues_due") && !plan.contains("TEMP B-TREE"), "{sql}:\n{plan}");
        }
        for sql in [EXPIRED, ANY_EXPIRED] {
            let plan = plan(&c, sql);
            assert!(plan.contains("jobs_deadline") && !plan.contains("TEMP B-TREE"), "{sql}:\n{plan}");
        }
        // A caller's oldest ended jobs in an account, one probe per queue.
        let oldest_kept = plan(&c, OLDEST_KEPT);
        assert!(oldest_kept.contains("jobs_kept") && !oldest_kept.contains("TEMP B-TREE"), "{oldest_kept}");
        let kept_count = plan(&c, KEPT_COUNT);
        assert!(!kept_count.contains("jobs"), "{kept_count}");
        let kept_queues = plan(&c, KEPT_QUEUES);
        assert!(!kept_queues.contains("SCAN"), "{kept_queues}");
        // The summary reads the counts, never the jobs but each queue's head.
        let counts = plan(&c, COUNTS);
        assert!(!counts.contains("SCAN j") && !counts.contains("jobs"), "{counts}");
        let oldest = plan(&c, OLDEST);
        assert!(oldest.contains("jobs_open"), "{oldest}");
    }
}
