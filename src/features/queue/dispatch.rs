//! The dispatcher: one task per instance that sends due jobs.
//!
//! Each tick (every [`TICK`], and at once after a submission): `recover`
//! leases that ran out (every half lease), `expire` jobs past their
//! deadline wherever they are in their queue (every second), `purge` jobs
//! past `[queue] keep` (every minute), then one round: the due queues, [`PER_CALLER`] per
//! caller ([`crate::jobs::JobStore::due_queues`]), planned in
//! weighted turns ([`turns::round`]); each queue of the round claims
//! its share and sends its jobs one after the other, in order (the queues
//! of a round concurrently). A round that sent something is followed by
//! another at once.
//!
//! A job is sent as a call of its own ([`OwnCall`] with its caller): the
//! phases of a live call (rule, meter, decide, the broker's token, forward,
//! answer, penalties), decided as its caller's call that never waits and
//! never takes the reserve. What became of it:
//!
//! - refused by wxgate's decision (a limit, a penalty, the store away):
//!   handed back unsent (`NotYet`) until the refusal's wait is over (never
//!   past the job's deadline); the rest of its claim goes back with it, so
//!   the queue keeps its order;
//! - WeChat's answer: [`super::retry::end_of`] (`Sent`, `Failed`, a
//!   back-off `Retry`);
//! - marked `Sending` and no answer (a timeout, a cut connection): `Unknown`,
//!   never resent; marked and provably never sent (no connection): `Retry`;
//! - its deadline passed before it went: `Expired`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use bytes::Bytes;
use http::uri::PathAndQuery;
use http::{HeaderValue, Method};

use super::gauges;
use super::retry::{end_of, Attempt};
use super::state::Shared;
use super::turns;
use crate::error::ProxyError;
use crate::features::component::Host;
use crate::features::hooks::{OwnCall, Seeds};
use crate::jobs::{Answer, End, Job, JobId, JobStore, QueueKey};
use crate::time::{Micros, Span};

/// How often the dispatcher looks for due jobs when nothing wakes it.
pub const TICK: Span = Span::from_micros(200_000);
/// Due queues read per caller in one round.
pub const PER_CALLER: usize = 8;
/// Claims per unit of a caller's weight in one round.
pub const QUANTUM: u32 = 4;
/// Most queues one instance sends at once.
pub const MAX_RUNNING: usize = 64;
/// How long a job refused because the store could not decide waits.
const UNAVAILABLE_US: Micros = 1_000_000;
/// How often ended jobs are purged.
const PURGE_EVERY_US: Micros = 60_000_000;
/// How often jobs past their deadline are ended wherever they are in their
/// queue (`expire`): a job's `expired` shows at most this late.
const EXPIRE_EVERY_US: Micros = 1_000_000;
/// Most jobs one expire run ends (more wait for the next tick).
const EXPIRE_MAX: usize = 1000;

/// Starts the dispatcher once queued delivery is on (at start, or when a
/// reload or Redis answering opens the jobs store); it ends when the app is
/// dropped.
pub(super) fn spawn(host: Weak<dyn Host>, q: Arc<Shared>) {
    let queue = q.clone();
    queue.spawn_when_open(move || async move {
        let mut marks = Marks {
            recovered: Micros::MIN,
            purged: Micros::MIN,
            expired: Micros::MIN,
            running: Arc::default(),
        };
        if let Some(host) = host.upgrade() {
            if let Some(jobs) = q.jobs.get().cloned() {
                match jobs.recover_at_start(host.core().clock.now_us()).await {
                    Ok(r) if r.unknown > 0 || r.requeued > 0 => {
                        tracing::warn!(
                            unknown = r.unknown,
                            requeued = r.requeued,
                            "queued delivery: jobs a stopped process was sending end unknown (never resent); those it had claimed are queued again"
                        );
                        q.metrics.recovered_unknown(r.unknown);
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "queued delivery: cannot recover the jobs of a stopped process yet")
                    }
                }
            }
        }
        loop {
            let Some(host) = host.upgrade() else { return };
            if q.stopping.is_cancelled() {
                return;
            }
            // The next look is due a tick after this one's time: a clock
            // that moved on meanwhile (a manual one in a test, or a slow
            // tick) makes it due at once, never missed.
            let started = host.core().clock.now_us();
            if let Err(e) = tick(&host, &q, &mut marks).await {
                tracing::warn!(error = %e, "queued delivery: the jobs store failed; trying again");
            }
            let clock = host.core().clock.clone();
            drop(host);
            // A submission or a finished turn wakes it; else the next tick.
            tokio::select! {
                _ = q.wake.notified() => {}
                _ = clock.sleep_until(started + TICK.as_micros()) => {}
                _ = q.stopping.cancelled() => return,
            }
        }
    });
}

/// What the dispatcher seeds a job's send with (the queue's `on_request`
/// takes it into its context).
pub struct Sends {
    pub id: JobId,
    /// Set when the job was marked `Sending` (its request may go out).
    pub marked: Arc<std::sync::atomic::AtomicBool>,
}

/// When the periodic chores last ran, and the queues being sent.
struct Marks {
    recovered: Micros,
    purged: Micros,
    expired: Micros,
    /// Queues whose claim this instance is sending now: not planned again
    /// until it is done (each then wakes the loop).
    running: Arc<std::sync::Mutex<std::collections::HashSet<QueueKey>>>,
}

/// Takes a queue out of [`Marks::running`] when its turn ends (or its task
/// stops), and wakes the loop to plan again.
struct Turn {
    queue: QueueKey,
    running: Arc<std::sync::Mutex<std::collections::HashSet<QueueKey>>>,
    q: Arc<Shared>,
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.running.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.queue);
        self.q.wake.notify_one();
    }
}

/// One tick: the chores, then a turn started for each planned queue that
/// is not running already. Turns run on their own: a slow send holds only
/// its own queue, never another caller's. `Ok(false)`: nothing started.
async fn tick(host: &Arc<dyn Host>, q: &Arc<Shared>, marks: &mut Marks) -> Result<bool, crate::store::StoreError> {
    let Some(jobs) = q.jobs.get().cloned() else { return Ok(false) };
    let config = host.config();
    let now = host.core().clock.now_us();
    if now.saturating_sub(marks.recovered) >= config.queue.lease_us / 2 {
        let r = jobs.recover(now).await?;
        if r.unknown > 0 {
            tracing::warn!(unknown = r.unknown, "queued delivery: jobs whose sending instance stopped before WeChat answered ended unknown (never resent)");
            q.metrics.recovered_unknown(r.unknown);
        }
        marks.recovered = now;
    }
    if now.saturating_sub(marks.expired) >= EXPIRE_EVERY_US {
        let ended = jobs.expire(now, EXPIRE_MAX).await?;
        for job in &ended {
            gauges::count_end(&q.metrics, &job.queue, Some("expired"), job.submitted_us, now);
        }
        marks.expired = if ended.len() >= EXPIRE_MAX { Micros::MIN } else { now };
    }
    if now.saturating_sub(marks.purged) >= PURGE_EVERY_US {
        jobs.purge(now, config.queue.keep_us).await?;
        marks.purged = now;
    }
    let due = jobs.due_queues(now, PER_CALLER).await?;
    if due.is_empty() {
        return Ok(false);
    }
    let weight = |caller: &str| config.callers.iter().find(|c| &*c.name == caller).map_or(1, |c| c.weight);
    let plan = turns::round(&due, weight, QUANTUM);
    let mut started = false;
    for (queue, n) in plan {
        {
            let mut running = marks.running.lock().unwrap_or_else(|e| e.into_inner());
            if running.len() >= MAX_RUNNING || !running.insert(queue.clone()) {
                continue;
            }
        }
        let turn = Turn { queue, running: marks.running.clone(), q: q.clone() };
        let (host, jobs) = (host.clone(), jobs.clone());
        q.tasks.spawn(async move {
            if let Err(e) = run_queue(&*host, &turn.q, &jobs, &turn.queue, n).await {
                tracing::warn!(error = %e, "queued delivery: a queue's turn failed");
            }
            drop(turn);
        });
        started = true;
    }
    Ok(started)
}

/// Claims up to `n` jobs of `queue` and sends them in order; `Ok(true)`
/// when one went (or ended) rather than being handed back.
async fn run_queue(
    host: &dyn Host,
    q: &Shared,
    jobs: &Arc<dyn JobStore>,
    queue: &QueueKey,
    n: usize,
) -> Result<bool, crate::store::StoreError> {
    let owner = q.owner.clone();
    let lease_us = host.config().queue.lease_us;
    let claimed = jobs.claim(queue, &owner, host.core().clock.now_us(), lease_us, n).await?;
    let mut moved = false;
    let mut rest = claimed.into_iter();
    while let Some(job) = rest.next() {
        let (id, submitted_us) = (job.id, job.submitted_us);
        let end = send(host, job).await;
        let ended = gauges::ended_as(&end);
        let waits = match &end {
            End::NotYet { at } | End::Retry { at, .. } => Some(*at),
            _ => None,
        };
        let now = host.core().clock.now_us();
        if !jobs.finish(id, &owner, end, now).await? {
            tracing::warn!(job = %id, "queued delivery: the job's lease was lost before its end was written");
        } else {
            gauges::count_end(&q.metrics, queue, ended, submitted_us, now);
        }
        if let Some(at) = waits {
            // The head waits: the rest of the claim goes back behind it,
            // unsent, waiting as long (none may go before it).
            for later in rest.by_ref() {
                jobs.finish(later.id, &owner, End::NotYet { at }, now).await?;
            }
            break;
        }
        if q.stopping.is_cancelled() {
            // The instance stops: the rest of the claim goes back, due now,
            // for the next start or another instance.
            for later in rest.by_ref() {
                jobs.finish(later.id, &owner, End::NotYet { at: now }, now).await?;
            }
            moved = true;
            break;
        }
        moved = true;
    }
    if moved {
        q.ended.notify_one();
    }
    Ok(moved)
}

/// Sends one claimed job; what became of it.
async fn send(host: &dyn Host, job: Job) -> End {
    let now = host.core().clock.now_us();
    let deadline = job.new.deadline_us;
    if deadline.is_some_and(|d| now >= d) {
        return End::Expired;
    }
    let config = host.config();
    let failed = |why: String| End::Failed(wxgate_answer(&why));
    let Some(rule) = config.rules.iter().find(|r| r.name == job.new.queue.rule) else {
        return failed(format!("rule \"{}\" is no longer in the config", job.new.queue.rule));
    };
    if config.rule_http(Some(rule)).queue.is_none() {
        return failed(format!("rule \"{}\" no longer queues its calls (queue = true)", rule.name));
    }
    let Some(domain) = config.domains.iter().position(|d| *d.host == *job.new.domain) else {
        return failed(format!("domain {} is no longer in the config", job.new.domain));
    };
    let caller = match HeaderValue::from_str(&job.new.queue.caller).map(|v| host.callers().named(&v)) {
        Ok(Ok(caller)) => caller,
        _ => return failed("its caller's name is not valid".into()),
    };
    let account = job.new.queue.account.to_string();
    if config.server.caller_auth.required() {
        if let Err(e) = caller.check_grant(&account) {
            return failed(e.to_string());
        }
    }
    let (Ok(method), Ok(target)) =
        (Method::from_bytes(job.new.method.as_bytes()), PathAndQuery::try_from(job.new.target.as_str()))
    else {
        return failed("its method or target cannot be read".into());
    };
    let marked = Arc::new(AtomicBool::new(false));
    let mut seeds = Seeds::default();
    seeds.insert(Sends { id: job.id, marked: marked.clone() });
    let own = OwnCall {
        config: config.clone(),
        account,
        domain,
        method,
        target,
        body: job.new.body.clone(),
        seeds,
        queued_by: Some(caller),
        submitted: job
            .new
            .traceparent
            .as_deref()
            .and_then(|t| crate::telemetry::trace::SpanContext::from_traceparent(t.as_bytes())),
    };
    let result = host.calls().call(own).await;
    let now = host.core().clock.now_us();
    let random = random_u64();
    let backoff = &config.queue.backoff;
    let attempts = job.attempts.saturating_add(1);
    let not_yet = |wait_us: Micros| End::NotYet { at: deadline.map_or(now + wait_us, |d| d.min(now + wait_us)) };
    match (result, marked.load(Ordering::SeqCst)) {
        (Ok(answer), _) => {
            let answer =
                Answer { status: answer.status, errcode: answer.errcode, body: answer.body.unwrap_or_default() };
            end_of(Attempt::Answered(answer), attempts, deadline, now, backoff, random)
        }
        (Err(ProxyError::Upstream(e)), true) if e.never_sent() => {
            end_of(Attempt::NeverSent, attempts, deadline, now, backoff, random)
        }
        (Err(_), true) => end_of(Attempt::NoAnswer, attempts, deadline, now, backoff, random),
        (Err(e), false) => match e {
            ProxyError::Throttled { wait_us, .. }
            | ProxyError::AccountsFull { wait_us, .. }
            | ProxyError::CallerRate { wait_us, .. } => not_yet(wait_us.max(1)),
            ProxyError::Unavailable(_) | ProxyError::TokenWait(_) | ProxyError::Upstream(_) => not_yet(UNAVAILABLE_US),
            // No token could be had for the account: not now, with back-off
            // (no attempt counted: nothing went to WeChat).
            ProxyError::NoToken { .. } => not_yet(backoff.delay_us(attempts, random).max(UNAVAILABLE_US)),
            other => failed(other.to_string()),
        },
    }
}

/// An end's answer written by wxgate (the job never reached WeChat).
fn wxgate_answer(why: &str) -> Answer {
    let body = serde_json::json!({ "errcode": -1, "errmsg": format!("wxgate: {why}") });
    Answer { status: 0, errcode: None, body: Bytes::from(body.to_string()) }
}

fn random_u64() -> u64 {
    let mut bytes = [0u8; 8];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes);
    u64::from_le_bytes(bytes)
}
