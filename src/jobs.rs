//! Queued delivery's jobs (issue 47, docs/plans/queued-delivery.md): where a
//! message handed to wxgate waits until it is sent. One seam, [`JobStore`],
//! with two implementations:
//!
//! - `jobs::sqlite` (the embedded default): one SQLite file (WAL), every
//!   write fsync'd before it returns, concurrent submissions group-committed
//!   by one writer thread;
//! - `jobs::redis`: the jobs in Redis, each operation one Lua script on the
//!   keys of one account (`{<prefix>:<account>}`, one Cluster slot), plus an
//!   index of due queues per caller that any instance's dispatcher reads.
//!
//! `tests/jobs_conformance.rs` runs one scenario table on each and compares
//! the results. Time is always given (`now`, wxgate's clock): no store reads
//! a clock of its own, so the table runs on an injected clock.
//!
//! What a job is never: half stored (a submission is one transaction or one
//! script), sent twice (a job is `Sending` durably before its request goes
//! out, and a `Sending` job is never handed out again: [`JobStore::recover`]
//! ends it as `Unknown`), or holding a secret (the caller's `access_token`
//! is taken out of the target before [`JobStore::submit`]; the broker
//! injects the account's token at send time).
//!
//! What an ended job keeps (issue 63): its metadata (queue, target,
//! deadline, key, callback, times, attempts) and WeChat's answer (at most
//! [`ANSWER_MAX`] bytes), never its body, which every way of ending deletes
//! in the write that ends it; and a caller keeps at most
//! [`Bounds::ended_jobs`] ended jobs per account (see [`JobStore`]). With
//! the unfinished bounds, that bounds the store whatever the number of
//! submissions: no sequence of submissions and cancellations grows it.

pub mod redis;

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

use crate::store::StoreError;
use crate::time::Micros;

pub mod sqlite;

/// A job's id: 16 random bytes, shown as 32 lowercase hex digits (the
/// `<id>` of `/v1/deliveries/<id>`). Unguessable, and looked up only
/// within its caller's jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobId(pub [u8; 16]);

impl JobId {
    /// A fresh random id (`Err` only if the system's random source fails).
    pub fn random() -> Result<JobId, ring::error::Unspecified> {
        let mut bytes = [0u8; 16];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)?;
        Ok(JobId(bytes))
    }

    /// Parses 32 lowercase hex digits (`None` for anything else).
    pub fn parse(text: &str) -> Option<JobId> {
        if text.len() != 32 || !text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            return None;
        }
        let mut bytes = [0u8; 16];
        for (i, chunk) in text.as_bytes().chunks(2).enumerate() {
            let hex = std::str::from_utf8(chunk).ok()?;
            bytes[i] = u8::from_str_radix(hex, 16).ok()?;
        }
        Some(JobId(bytes))
    }
}

impl std::fmt::Display for JobId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// One queue: the jobs of one caller for one account and rule, sent in
/// the order they were submitted.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueueKey {
    /// The `[[caller]]`'s name (proven, as for a live call).
    pub caller: Arc<str>,
    /// The account the job counts against (as for a live call).
    pub account: Arc<str>,
    /// The rule's name (`qyapi.message_send` for a `[[domain]]`'s rule).
    pub rule: Arc<str>,
}

/// A submission, as the intake read it from the caller's request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewJob {
    pub queue: QueueKey,
    /// The WeChat domain's host (`api.weixin.qq.com`): a reload that
    /// renumbers domains keeps the job's.
    pub domain: Arc<str>,
    /// `POST` for every queueable API; kept as sent.
    pub method: String,
    /// The path and query to send, without any `access_token` (the broker
    /// injects the account's token when it is sent).
    pub target: String,
    pub content_type: Option<String>,
    pub body: Bytes,
    /// `X-Wxgate-Deadline` (or the rule's default): after it the job ends
    /// `Expired` instead of being sent.
    pub deadline_us: Option<Micros>,
    /// `Idempotency-Key`, within its caller and account.
    pub idempotency_key: Option<String>,
    /// `X-Wxgate-Callback`, checked against the caller's allowed prefixes.
    pub callback: Option<String>,
    /// The span of the call that submitted it (a `traceparent`), when
    /// tracing is on: its send's span links to it (docs/tracing.md).
    pub traceparent: Option<String>,
    /// Its lanes ([`Lanes`]): what it must not overtake nor be overtaken by.
    pub lanes: Lanes,
}

/// A job's lanes: the recipients it names, each as a 16-hex-digit hash
/// (FNV-1a 64 of the recipient as the body gives it), space-separated. Two
/// jobs sharing a lane are never under way at once and go in submission
/// order; jobs sharing none go in parallel (issue 63: what a user needs is
/// that two messages to one recipient arrive in the order sent). `*`
/// ([`Lanes::STRICT`]): every job of its queue is in its lane (one at a
/// time, in order: `queue_order = "strict"`, and every job stored before
/// lanes existed). Empty: a job naming no recipient, ordered with nothing.
/// A hash collision only orders two jobs that need not be.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Lanes(pub String);

impl Lanes {
    pub const STRICT: &'static str = "*";

    /// The lane of every job of a strict queue.
    pub fn strict() -> Lanes {
        Lanes(Self::STRICT.to_owned())
    }

    /// The lanes of a job to `recipients` (each counted once).
    pub fn of<'a>(recipients: impl IntoIterator<Item = &'a str>) -> Lanes {
        let mut out: Vec<String> = recipients.into_iter().map(|r| format!("{:016x}", fnv1a(r.as_bytes()))).collect();
        out.sort_unstable();
        out.dedup();
        Lanes(out.join(" "))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// FNV-1a, 64 bits: stable across processes and builds (every instance
/// must hash a recipient alike), and cheap; not for secrecy (lanes are of
/// the same caller's own jobs).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

/// A claim's walk over a queue's unfinished jobs in `seq` order (the
/// same in both stores; lua/jobs_prelude.lua `scan` is its twin): which
/// jobs are free to go, and when the next could.
#[derive(Debug, Default)]
pub struct LaneScan {
    taken: std::collections::HashSet<String>,
    /// An unfinished job was seen (a strict job behind it waits).
    seen: bool,
    /// A strict job was seen: every job behind it waits.
    all: bool,
    /// The earliest due time of a free job not handed out.
    pub next_due: Option<Micros>,
}

impl LaneScan {
    /// Looks at the next unfinished job (any state), whose lanes are
    /// `lanes`: whether no job before it shares one. Its lanes are taken
    /// either way (a job behind it sharing one waits for it).
    pub fn visit(&mut self, lanes: &str) -> bool {
        let free = if self.all {
            false
        } else if lanes == Lanes::STRICT {
            !self.seen
        } else {
            !lanes.split(' ').any(|l| !l.is_empty() && self.taken.contains(l))
        };
        self.seen = true;
        if lanes == Lanes::STRICT {
            self.all = true;
        } else {
            for l in lanes.split(' ').filter(|l| !l.is_empty()) {
                if !self.taken.contains(l) {
                    self.taken.insert(l.to_owned());
                }
            }
        }
        free
    }

    /// A free job not handed out, due at `due`.
    pub fn waits(&mut self, due: Micros) {
        self.next_due = Some(self.next_due.map_or(due, |d| d.min(due)));
    }
}

/// Most unfinished jobs of a queue one claim looks at (in `seq` order) for
/// jobs whose lanes are free: jobs past it wait until those before them
/// move on (many jobs to one recipient at a queue's front delay the rest
/// by at most that recipient's pace).
pub const CLAIM_SCAN: usize = 512;

pub use crate::config::queue::Bounds;

/// Which bound a refused submission would have passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    CallerJobs,
    CallerBytes,
    AccountJobs,
    AccountBytes,
}

#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// Nothing stored: the caller gets 429 `X-Wxgate-Reason: queue_full`.
    #[error("the queue is full ({0:?})")]
    Full(Bound),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A submission stored (durably, when returned).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Submitted {
    pub id: JobId,
    /// `true`: the `Idempotency-Key` named an earlier job, whose id this is;
    /// nothing new was stored.
    pub duplicate: bool,
}

/// Where a job is in its life. `Claimed` is a dispatcher's lease on a job
/// it is about to send; callers see it as `Queued`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobState {
    /// Due now (`due_us <= now`) or since: waiting for its turn and its slot.
    Queued,
    /// Not before `due_us` (a back-off, a penalty, the next quota day).
    Waiting,
    /// Leased to a dispatcher (`owner`) until `lease_us`; not yet sending.
    Claimed,
    /// Its request may be on its way to WeChat: never handed out again.
    Sending,
    Sent,
    Failed,
    Expired,
    Cancelled,
    /// Its request may have reached WeChat without an answer: never resent.
    Unknown,
}

impl JobState {
    /// Whether the job has ended (counts no more against [`Bounds`]).
    pub fn ended(self) -> bool {
        matches!(self, JobState::Sent | JobState::Failed | JobState::Expired | JobState::Cancelled | JobState::Unknown)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued | JobState::Claimed => "queued",
            JobState::Waiting => "waiting",
            JobState::Sending => "sending",
            JobState::Sent => "sent",
            JobState::Failed => "failed",
            JobState::Expired => "expired",
            JobState::Cancelled => "cancelled",
            JobState::Unknown => "unknown",
        }
    }
}

/// What WeChat (or the way to it) answered an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The HTTP status (0: no answer: the call never reached WeChat, or
    /// the connection ended before an answer).
    pub status: u16,
    pub errcode: Option<i64>,
    /// The answer's body, at most [`ANSWER_MAX`] bytes (e.g. the `msgid`).
    pub body: Bytes,
}

/// Most bytes of WeChat's answer a job keeps.
pub const ANSWER_MAX: usize = 4096;

/// A job as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    pub id: JobId,
    pub new: NewJob,
    /// Its place in its queue (submission order).
    pub seq: u64,
    pub state: JobState,
    pub submitted_us: Micros,
    /// Not sent before this (`Queued` once it has passed).
    pub due_us: Micros,
    /// `Claimed`/`Sending`: whose lease, until when.
    pub owner: Option<Arc<str>>,
    pub lease_us: Micros,
    /// Attempts that went (or may have gone) to WeChat.
    pub attempts: u32,
    /// The last attempt's answer.
    pub answer: Option<Answer>,
    pub updated_us: Micros,
}

/// How an attempt ended, for [`JobStore::finish`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// WeChat took it (errcode 0): `Sent`.
    Sent(Answer),
    /// WeChat refused the message itself (40003, 43004, ...): `Failed`.
    Failed(Answer),
    /// Not now: `Waiting` until `at` (the attempt, if it reached WeChat, counts).
    Retry { at: Micros, answer: Option<Answer> },
    /// Handed back unsent (wxgate's own decision said not yet): `Waiting`
    /// until `at`, no attempt counted.
    NotYet { at: Micros },
    /// Its deadline passed unsent: `Expired`.
    Expired,
    /// Sent without an answer: `Unknown`.
    Unknown(Option<Answer>),
}

/// What [`JobStore::cancel`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancelled {
    Cancelled,
    /// Too late: the job is sending or has ended (its state).
    TooLate(JobState),
    /// No job of this caller has that id.
    NotFound,
}

/// What [`JobStore::recover`] did with leases that ran out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recovered {
    /// `Claimed` jobs back to `Queued` (never sent: safe to send).
    pub requeued: u64,
    /// `Sending` jobs ended `Unknown` (may have reached WeChat).
    pub unknown: u64,
}

/// A job [`JobStore::expire`] ended: its queue and submission time (for
/// the metrics' outcomes and submit-to-end latency).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpiredJob {
    pub id: JobId,
    pub queue: QueueKey,
    pub submitted_us: Micros,
}

/// One queue's counts, for the summary and the metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueSummary {
    pub queue: QueueKey,
    /// Unfinished: `Queued` + `Claimed`, `Waiting`, `Sending`.
    pub queued: u64,
    pub waiting: u64,
    pub sending: u64,
    /// Ended, still kept (until purged).
    pub sent: u64,
    pub failed: u64,
    pub expired: u64,
    pub cancelled: u64,
    pub unknown: u64,
    /// The oldest unfinished job's submission time.
    pub oldest_us: Option<Micros>,
}

impl QueueSummary {
    /// A queue with nothing counted yet.
    pub fn new(queue: QueueKey) -> QueueSummary {
        QueueSummary {
            queue,
            queued: 0,
            waiting: 0,
            sending: 0,
            sent: 0,
            failed: 0,
            expired: 0,
            cancelled: 0,
            unknown: 0,
            oldest_us: None,
        }
    }

    /// Adds `other`'s counts to these, and keeps the older oldest job
    /// (queues counted together: all accounts of a caller and rule).
    pub fn merge(&mut self, other: &QueueSummary) {
        for (to, from) in [
            (&mut self.queued, other.queued),
            (&mut self.waiting, other.waiting),
            (&mut self.sending, other.sending),
            (&mut self.sent, other.sent),
            (&mut self.failed, other.failed),
            (&mut self.expired, other.expired),
            (&mut self.cancelled, other.cancelled),
            (&mut self.unknown, other.unknown),
        ] {
            *to += from;
        }
        self.oldest_us = match (self.oldest_us, other.oldest_us) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }

    /// Counts `n` more jobs in `state` (a `Claimed` job shows `queued`).
    pub fn add(&mut self, state: JobState, n: u64) {
        let slot = match state {
            JobState::Queued | JobState::Claimed => &mut self.queued,
            JobState::Waiting => &mut self.waiting,
            JobState::Sending => &mut self.sending,
            JobState::Sent => &mut self.sent,
            JobState::Failed => &mut self.failed,
            JobState::Expired => &mut self.expired,
            JobState::Cancelled => &mut self.cancelled,
            JobState::Unknown => &mut self.unknown,
        };
        *slot += n;
    }
}

/// An ended job whose callback ([`NewJob::callback`]) is due, handed out
/// by [`JobStore::callbacks_due`]: its job (the body left out, never
/// posted) and how many times its callback was handed out (this one
/// counted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueCallback {
    pub job: Job,
    pub tries: u32,
}

/// How many more callbacks each caller may be handed out by one
/// [`JobStore::callbacks_due`]: `each`, but for the callers listed (those
/// with posts in flight, their own room).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallerRoom {
    pub each: usize,
    pub callers: Vec<(String, usize)>,
}

impl CallerRoom {
    /// No caller limited.
    pub fn unlimited() -> CallerRoom {
        CallerRoom { each: usize::MAX, callers: Vec::new() }
    }

    /// `caller`'s room.
    pub fn of(&self, caller: &str) -> usize {
        self.callers.iter().find(|(c, _)| c == caller).map_or(self.each, |(_, n)| *n)
    }
}

/// Where queued jobs live. Every method is atomic (one transaction, one
/// script): no other call of any instance sees it half done. A method that
/// returns `Ok` has made its change durable (SQLite: fsync'd; Redis: as
/// durable as the Redis deployment is, docs/redis-store.md).
///
/// **A job that ends** (`finish` sent, failed, expired or unknown,
/// `cancel`, `recover`, `expire`) has its body deleted in the same write;
/// [`JobStore::get`] then shows it with an empty body. And it counts among
/// its caller's ended jobs in its account: past [`Bounds::ended_jobs`] (as
/// the latest [`JobStore::submit`] gave it: Redis keeps it in the account's
/// keys, SQLite in memory, none before a submission), the same write
/// deletes that caller's oldest ended jobs in the account (by when they
/// ended, ties by id; at most two per end, so a caller past the bound after
/// a reload lowered it comes back one job per end), a pending callback
/// given up with its job, and the `Idempotency-Key` that names it (a repeat
/// of it is then a new job). Never refuses a submission.
#[async_trait]
pub trait JobStore: Send + Sync + 'static {
    /// Stores `job` as `Queued` (due at `now`) at the end of its queue, or,
    /// when its `Idempotency-Key` names a job of the same caller and account
    /// submitted within `bounds.idempotency_us`, returns that job's id and
    /// stores nothing (a key is per caller and account: on Redis the lookup
    /// runs in the account's slot, and a key reused for another account is
    /// another message). Refused whole ([`SubmitError::Full`]) when the caller's or
    /// the account's unfinished jobs or bytes would pass `bounds`.
    async fn submit(&self, job: NewJob, bounds: &Bounds, now: Micros) -> Result<Submitted, SubmitError>;

    /// Queues whose head (their lowest-`seq` unfinished job) is due
    /// (`due_us <= now`) and neither claimed nor sending, **per caller**:
    /// every caller with at least one such queue is listed, with at most
    /// `per_caller` of its queues, oldest head first (ties by account, then
    /// rule); callers in the order of their oldest due head (ties by name),
    /// each caller's queues together. So a caller with many old queues
    /// never hides another's (the dispatcher's weighted turns,
    /// src/features/queue/turns.rs, need every caller with due work). There
    /// is no limit on callers: queue callers are the config's `[[caller]]`
    /// names (and `other`), so at most that many × `per_caller` queues.
    /// `per_caller` 0 lists nothing.
    ///
    /// Cost: both stores read an index of queue heads by caller (SQLite:
    /// `queues.head_due`; Redis: `{#jobs}:due:<caller>`), one probe per
    /// caller and at most `per_caller` entries of each, whatever the number
    /// of queues or jobs. The Redis index may be stale (src/jobs/redis.rs): a
    /// queue listed that is not due costs one `claim` that hands out
    /// nothing; `claim` always checks the queue itself.
    async fn due_queues(&self, now: Micros, per_caller: usize) -> Result<Vec<QueueKey>, StoreError>;

    /// Leases to `owner` until `now + lease_us` the first jobs of `queue`
    /// in `seq` order, at most `max`, that are due (`Queued`, or `Waiting`
    /// whose time came) and whose [`Lanes`] no earlier unfinished job of
    /// the queue shares (claimed, sending, waiting, or queued and not
    /// handed out now): so two jobs sharing a lane are never out at once
    /// and go in order, and a strict queue hands out its head only. Looks
    /// at the first [`CLAIM_SCAN`] unfinished jobs at most. The queue's
    /// entry in the index of due queues is set to the earliest due time of
    /// a job a claim could hand out next (none: out of the index).
    async fn claim(
        &self,
        queue: &QueueKey,
        owner: &str,
        now: Micros,
        lease_us: Micros,
        max: usize,
    ) -> Result<Vec<Job>, StoreError>;

    /// Extends to `now + lease_us` the leases `owner` holds on `ids`
    /// (`Claimed` or `Sending`, a lease that ran out but was not yet
    /// recovered included: as [`JobStore::finish`] takes it), so a send
    /// slower than the lease is never taken for a dead instance's. All of
    /// `ids` are of one account (one queue's). How many were extended.
    async fn renew(&self, ids: &[JobId], owner: &str, now: Micros, lease_us: Micros) -> Result<usize, StoreError>;

    /// Marks a job `owner` holds as `Sending` (durably) and counts the
    /// attempt: `Ok(false)` when `owner`'s lease ran out or another holds
    /// it, and then it must not be sent. On Redis with replicas, durably
    /// means on a replica too (`[queue] replicas`, src/jobs/redis/sending.rs):
    /// a mark none has in time is taken back (the job `Claimed` again) and
    /// answered `Err`: not to be sent either.
    async fn sending(&self, id: JobId, owner: &str, now: Micros) -> Result<bool, StoreError>;

    /// Ends an attempt of a job `owner` holds (`Claimed` or `Sending`).
    /// `Ok(false)`: `owner` no longer holds it, or the end says "never
    /// sent" (`NotYet`, `Expired`) of a `Sending` job, which may have been
    /// (nothing changed: `recover` ends it `Unknown`).
    async fn finish(&self, id: JobId, owner: &str, end: End, now: Micros) -> Result<bool, StoreError>;

    /// Leases that ran out by `now`: `Claimed` jobs back to `Queued`,
    /// `Sending` jobs to `Unknown`. Any instance may run it.
    async fn recover(&self, now: Micros) -> Result<Recovered, StoreError>;

    /// [`JobStore::recover`] as this process starts. On a store no other
    /// process uses (the embedded file, locked), every lease in it is a
    /// dead process's: all are recovered at once, whatever their end
    /// (`Sending` → `Unknown`, `Claimed` → `Queued`), so a restart after a
    /// crash does not wait a lease period. On a shared store, as `recover`.
    async fn recover_at_start(&self, now: Micros) -> Result<Recovered, StoreError> {
        self.recover(now).await
    }

    /// Ends as `Expired` the jobs no dispatcher holds (`Queued`,
    /// `Waiting`) whose deadline is `now` or earlier, wherever they are in
    /// their queue (a job behind a head that waits for the next quota day
    /// ends at its deadline, not when it reaches the head), earliest
    /// deadline first (on Redis: accounts by their earliest, each
    /// account's earliest first), at most `max`; their callbacks pending as for any
    /// end. A `Claimed` or `Sending` job is its holder's to end (the
    /// dispatcher checks the deadline before it sends). Returns the jobs
    /// it ended.
    ///
    /// Cost: both stores read an index of deadlines (SQLite:
    /// `jobs_deadline`, over unfinished jobs with one; Redis: each
    /// account's `dl` and `{#jobs}:deadlines`, the accounts by their
    /// earliest), so a run with nothing to end reads one entry.
    async fn expire(&self, now: Micros, max: usize) -> Result<Vec<ExpiredJob>, StoreError>;

    /// A job of `caller` (`None` for another caller's id).
    async fn get(&self, caller: &str, id: JobId) -> Result<Option<Job>, StoreError>;

    /// Cancels a job of `caller` that is `Queued`, `Waiting` or `Claimed`.
    async fn cancel(&self, caller: &str, id: JobId, now: Micros) -> Result<Cancelled, StoreError>;

    /// Every queue's counts (of `caller`'s queues only, when given).
    async fn summary(&self, caller: Option<&str>) -> Result<Vec<QueueSummary>, StoreError>;

    /// One queue's counts (`None`: it has no job). By default from
    /// [`JobStore::summary`] of its caller; a store whose summary walks
    /// every account reads only the queue's.
    async fn queue_summary(&self, queue: &QueueKey) -> Result<Option<QueueSummary>, StoreError> {
        Ok(self.summary(Some(&queue.caller)).await?.into_iter().find(|q| q.queue == *queue))
    }

    /// Deletes jobs that ended before `now - keep_us`, and idempotency keys
    /// past their time; how many jobs went. A job whose callback is still
    /// pending is kept until it is done ([`JobStore::callback_done`]); one
    /// that an `Idempotency-Key` still names is kept until the key's time
    /// (a repeat finds its job, never a new one), so every key names a job
    /// stored and keys are bounded with the jobs.
    async fn purge(&self, now: Micros, keep_us: Micros) -> Result<u64, StoreError>;

    /// Callbacks (src/features/queue/callbacks.rs). A job with a callback that ends
    /// (`finish`, `recover`, `cancel`: every way a job ends) has its
    /// callback pending, due at once, in the same write: so it is never
    /// lost across a restart.
    ///
    /// Hands out at most `max` pending callbacks due by `now`, oldest due
    /// first (on Redis: accounts by their oldest, each account's oldest
    /// first), at most `room.of(caller)` of each caller: a caller with no
    /// room is passed over, so its backlog never hides another caller's
    /// callbacks (a receiver that never answers delays only its own
    /// caller). Each is made due again at `now + lease_us` (and its `tries`
    /// counted): another dispatcher (instance) takes it only after that,
    /// so one posts it unless the lease runs out before the post is
    /// recorded (an instance that died, or a post slower than the lease).
    ///
    /// Cost: both stores read the due callbacks in due order (SQLite:
    /// `jobs_callbacks`; Redis: each account's `cbs`), so a round also
    /// reads past the due backlog of the callers passed over.
    async fn callbacks_due(
        &self,
        now: Micros,
        lease_us: Micros,
        max: usize,
        room: &CallerRoom,
    ) -> Result<Vec<DueCallback>, StoreError>;

    /// Records the post of a callback handed out with `tries`: `retry_at`
    /// `None`, done (delivered, or given up: no longer pending); `Some`, due
    /// again then. `Ok(false)`: it was handed out again since (a later
    /// `tries`) or is no longer pending; nothing changed.
    async fn callback_done(
        &self,
        id: JobId,
        tries: u32,
        retry_at: Option<Micros>,
        now: Micros,
    ) -> Result<bool, StoreError>;
}
