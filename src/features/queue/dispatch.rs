//! The dispatcher: one task per instance that sends due jobs.
//!
//! Each tick (every [`TICK`], at once after a submission, and at the
//! moment a job handed back waits for: [`Shared::wake_at`]): `recover`
//! leases that ran out (every half lease), `expire` jobs past their
//! deadline wherever they are in their queue (every second), `purge` jobs
//! past `[queue] keep` (every minute), then the due queues, [`PER_CALLER`]
//! per caller ([`crate::jobs::JobStore::due_queues`]), in weighted turns
//! ([`turns::round`]): each that this instance is not sending yet gets a
//! turn of its own ([`run_queue`]), which lasts as long as its queue has
//! jobs to send.
//!
//! **A queue's turn keeps several sends in flight** (issue 63): as many as
//! its window allows ([`super::flow`]: grown while WeChat answers and the
//! rule has room, halved on overload, under `[queue] max_in_flight`, and
//! all queues under `[queue] instance_in_flight`). It claims jobs in
//! batches; the store hands out only jobs whose lanes (recipients) no
//! earlier unfinished job shares ([`crate::jobs::Lanes`]), so two messages
//! to one recipient never overlap and go in the order sent, while messages
//! to different recipients go in parallel (`queue_order = "strict"`: one at
//! a time, in order). Each claimed job is leased to this instance and the
//! lease renewed while its send is under way (every third of a lease), so
//! a slow answer never ends a job `unknown`.
//!
//! A job is sent as a call of its own ([`OwnCall`] with its caller): the
//! phases of a live call (rule, meter, decide, the broker's token, forward,
//! answer, penalties), decided as its caller's call that never takes the
//! reserve, held for its slot when that is moments away
//! ([`crate::proxy::decide::QUEUED_HOLD_US`]: the store paces the sends).
//! What became of it:
//!
//! - refused by wxgate's decision (a limit, a penalty, the store away):
//!   handed back unsent (`NotYet`) until the refusal's wait is over (never
//!   past the job's deadline); its turn claims nothing more until then (a
//!   recipient's own limit holds back only that job), and the dispatcher
//!   wakes at that moment;
//! - WeChat's answer: [`super::retry::end_of`] (`Sent`, `Failed`, a
//!   back-off `Retry`);
//! - marked `Sending` and no answer (a timeout, a cut connection): `Unknown`,
//!   never resent; marked and provably never sent (no connection): `Retry`;
//! - its deadline passed before it went: `Expired`.
//!
//! Its end is written at once; a store that fails is asked again within
//! milliseconds ([`FINISH_RETRIES`]), the lease still renewed meanwhile.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use bytes::Bytes;
use http::uri::PathAndQuery;
use http::{HeaderValue, Method};

use super::flow::Seen;
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
/// The weighted turns' quantum ([`turns::round`]): here only the order in
/// which a round's turns start matters (each turn then sends as its share
/// of its pair's window allows: [`super::state::Runs`]).
pub const QUANTUM: u32 = 4;
/// A store that fails to take a job's end is asked again after 10 ms,
/// 20 ms, ... this many times (about 5 s in all) before the job is left to
/// its lease.
pub const FINISH_RETRIES: u32 = 9;
/// A turn with no send under way whose queue waits less than this keeps
/// its window and waits; a longer wait ends it (the dispatcher wakes when
/// the wait is over).
const PAUSE_IN_TURN_US: Micros = 2_000_000;
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
            // A submission, a finished turn or a job's wait ending wakes
            // it; else the next tick.
            let next = {
                let mut at = q.wake_at.lock().unwrap_or_else(|e| e.into_inner());
                if at.is_some_and(|a| a <= started) {
                    *at = None;
                }
                at.map_or(started + TICK.as_micros(), |a| a.min(started + TICK.as_micros()))
            };
            tokio::select! {
                _ = q.wake.notified() => {}
                _ = clock.sleep_until(next) => {}
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
    // Every turn this round starts is entered in its pair before any
    // claims: the first to claim already shares the window with the rest.
    let mut starting = Vec::new();
    {
        let mut runs = lock(&q.runs);
        let mut running = lock(&marks.running);
        for (queue, _) in plan {
            if runs.paused.get(&queue).is_some_and(|until| *until > now) {
                // Refused until then: the dispatcher wakes at that moment.
                continue;
            }
            if !running.insert(queue.clone()) {
                continue;
            }
            runs.enter(&queue, weight(&queue.caller), config.queue.max_in_flight);
            starting.push(queue);
        }
    }
    for queue in starting {
        let turn = Turn { queue, running: marks.running.clone(), q: q.clone() };
        let (host, jobs) = (host.clone(), jobs.clone());
        q.tasks.spawn(async move {
            if let Err(e) = run_queue(&host, &turn.q, &jobs, &turn.queue).await {
                tracing::warn!(error = %e, "queued delivery: a queue's turn failed");
            }
            drop(turn);
        });
        started = true;
    }
    Ok(started)
}

/// What one send's task hands back to its turn.
struct Done {
    id: JobId,
    seen: Seen,
    /// Refused by wxgate's decision until then (for the whole queue: not a
    /// recipient's own limit).
    pause_until: Option<Micros>,
}

/// A queue's turn (module docs): keeps up to its share of its (account,
/// rule)'s window of sends in flight until the queue has nothing more to
/// send now. The dispatcher entered it in its pair's turns.
async fn run_queue(
    host: &Arc<dyn Host>,
    q: &Arc<Shared>,
    jobs: &Arc<dyn JobStore>,
    queue: &QueueKey,
) -> Result<(), crate::store::StoreError> {
    let config = host.config();
    let (lease_us, instance) = (config.queue.lease_us, config.queue.instance_in_flight as usize);
    drop(config);
    let clock = host.core().clock.clone();
    // Entered in its pair's turns by the dispatcher; left below.
    let mut paused_until = lock(&q.runs).paused.get(queue).copied().unwrap_or(Micros::MIN);
    let held: Arc<std::sync::Mutex<std::collections::HashSet<JobId>>> = Arc::default();
    let mut sends: tokio::task::JoinSet<Done> = tokio::task::JoinSet::new();
    // Nothing more to claim until a send ends or a job is submitted.
    let mut drained = false;
    let mut renew_at = clock.now_us() + lease_us / 3;
    let mut failed = None;
    loop {
        let now = clock.now_us();
        let stopping = q.stopping.is_cancelled();
        // Claims in batches: when a quarter of the window (at least one) is free.
        // Whether this turn has work now, for the other callers' turns on its pair.
        let ready = !stopping && !drained && failed.is_none() && now >= paused_until;
        let (allowed, changed) = lock(&q.runs).allowed(queue, sends.len(), ready);
        if changed {
            q.turned.notify_waiters();
        }
        let free = instance.saturating_sub(q.in_flight.load(Ordering::SeqCst));
        let room = allowed.min(free);
        // Claims in batches: when a quarter of what it may have out is free.
        let batch = ((allowed + sends.len()) / 4).max(1);
        if ready && room > 0 && (room >= batch || sends.is_empty()) {
            match jobs.claim(queue, &q.owner, now, lease_us, room).await {
                Ok(claimed) => {
                    drained = claimed.len() < room;
                    lock(&q.runs).started(queue, claimed.len());
                    q.turned.notify_waiters();
                    for job in claimed {
                        lock(&held).insert(job.id);
                        q.in_flight.fetch_add(1, Ordering::SeqCst);
                        q.metrics.in_flight(&queue.rule, true);
                        let (host, q2, jobs, queue, held) =
                            (host.clone(), q.clone(), jobs.clone(), queue.clone(), held.clone());
                        sends.spawn(async move {
                            let done = send_and_finish(&*host, &q2, &jobs, &queue, job).await;
                            lock(&held).remove(&done.id);
                            q2.in_flight.fetch_sub(1, Ordering::SeqCst);
                            q2.metrics.in_flight(&queue.rule, false);
                            done
                        });
                    }
                }
                Err(e) => failed = Some(e),
            }
            continue;
        }
        // Ready but held back: by the other callers' turns (or this
        // instance's ceiling), until one of them starts a send or ends.
        let held_back = ready && room == 0 && sends.is_empty();
        if sends.is_empty() {
            if stopping || failed.is_some() || (drained && paused_until <= now) {
                break;
            }
            if paused_until > now && paused_until - now > PAUSE_IN_TURN_US {
                q.wake_at(paused_until);
                break;
            }
        }
        let submitted = q.submitted.notified();
        let turned = q.turned.notified();
        let pause = clock.clone();
        let renew = clock.clone();
        tokio::select! {
            done = sends.join_next(), if !sends.is_empty() => {
                if let Some(Ok(done)) = done {
                    lock(&q.runs).seen(queue, done.seen, clock.now_us());
                    if let Some(until) = done.pause_until {
                        paused_until = paused_until.max(until);
                        q.wake_at(until);
                    }
                }
                drained = false;
            }
            _ = submitted, if drained => drained = false,
            _ = turned, if held_back || (ready && !sends.is_empty()) => {}
            _ = pause.sleep_until(paused_until), if paused_until > now => {}
            _ = renew.sleep_until(renew_at) => {
                let ids: Vec<JobId> = lock(&held).iter().copied().collect();
                let now = clock.now_us();
                if let Err(e) = jobs.renew(&ids, &q.owner, now, lease_us).await {
                    tracing::warn!(error = %e, "queued delivery: cannot renew the leases of the sends under way; trying again");
                    renew_at = now + 100_000;
                } else {
                    renew_at = now + lease_us / 3;
                }
            }
            _ = q.stopping.cancelled(), if !stopping => {}
        }
    }
    lock(&q.runs).leave(queue, paused_until, clock.now_us());
    q.turned.notify_waiters();
    q.ended.notify_one();
    match failed {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Sends one claimed job and writes its end (asking a failing store again
/// within milliseconds); what its turn learns of it.
async fn send_and_finish(host: &dyn Host, q: &Shared, jobs: &Arc<dyn JobStore>, queue: &QueueKey, job: Job) -> Done {
    let (id, submitted_us) = (job.id, job.submitted_us);
    let (end, seen, refusal) = send(host, job).await;
    let ended = gauges::ended_as(&end);
    let pause_until = match (&end, refusal) {
        (End::NotYet { at }, Some(Refusal::Queue)) => Some(*at),
        _ => None,
    };
    let mut delay: u64 = 10_000;
    for attempt in 0..=FINISH_RETRIES {
        let now = host.core().clock.now_us();
        match jobs.finish(id, &q.owner, end.clone(), now).await {
            Ok(true) => {
                gauges::count_end(&q.metrics, queue, ended, submitted_us, now);
                break;
            }
            Ok(false) => {
                tracing::warn!(job = %id, "queued delivery: the job's lease was lost before its end was written");
                break;
            }
            Err(e) if attempt < FINISH_RETRIES && !q.stopping.is_cancelled() => {
                tracing::debug!(error = %e, job = %id, "queued delivery: writing a job's end failed; asking again");
                // Real time, whatever the clock: the store's answer, not
                // the rule's, is waited for.
                tokio::time::sleep(std::time::Duration::from_micros(delay)).await;
                delay = (delay * 2).min(1_000_000);
            }
            Err(e) => {
                tracing::warn!(error = %e, job = %id, "queued delivery: cannot write a job's end; its lease ends it");
                break;
            }
        }
    }
    if let End::Retry { at, .. } | End::NotYet { at } = end {
        q.wake_at(at);
    }
    Done { id, seen, pause_until }
}

/// Whom a decision's refusal holds back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// The queue's rule or account (a window, a quota, a penalty, the store).
    Queue,
    /// One recipient's own limit: only this job.
    Recipient,
}

/// Sends one claimed job; what became of it, what its window learns, and
/// whom a refusal by wxgate's decision holds back.
async fn send(host: &dyn Host, job: Job) -> (End, Seen, Option<Refusal>) {
    let end = |end: End| (end, Seen::Nothing, None);
    let now = host.core().clock.now_us();
    let deadline = job.new.deadline_us;
    if deadline.is_some_and(|d| now >= d) {
        return end(End::Expired);
    }
    let config = host.config();
    let failed = |why: String| end(End::Failed(wxgate_answer(&why)));
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
        answer_cap: 0,
    };
    let result = host.calls().call(own).await;
    let now = host.core().clock.now_us();
    let random = random_u64();
    let backoff = &config.queue.backoff;
    let attempts = job.attempts.saturating_add(1);
    let not_yet = |wait_us: Micros| End::NotYet { at: deadline.map_or(now + wait_us, |d| d.min(now + wait_us)) };
    match (result, marked.load(Ordering::SeqCst)) {
        (Ok(answer), _) => {
            let seen = if answer.errcode == Some(45033) {
                Seen::TooMany
            } else if answer.status >= 500 || answer.errcode == Some(-1) {
                Seen::Overloaded
            } else {
                Seen::Answered { rtt_us: answer.upstream_us, held_us: answer.held_us }
            };
            let answer =
                Answer { status: answer.status, errcode: answer.errcode, body: answer.body.unwrap_or_default() };
            (end_of(Attempt::Answered(answer), attempts, deadline, now, backoff, random), seen, None)
        }
        (Err(ProxyError::Upstream(e)), true) if e.never_sent() => {
            (end_of(Attempt::NeverSent, attempts, deadline, now, backoff, random), Seen::Overloaded, None)
        }
        (Err(_), true) => (end_of(Attempt::NoAnswer, attempts, deadline, now, backoff, random), Seen::Overloaded, None),
        (Err(e), false) => match e {
            ProxyError::Throttled { reason: crate::limit::Reason::Recipient, wait_us, .. } => {
                (not_yet(wait_us.max(1)), Seen::Nothing, Some(Refusal::Recipient))
            }
            ProxyError::Throttled { wait_us, .. }
            | ProxyError::AccountsFull { wait_us, .. }
            | ProxyError::CallerRate { wait_us, .. } => (not_yet(wait_us.max(1)), Seen::Nothing, Some(Refusal::Queue)),
            ProxyError::Unavailable(_) | ProxyError::TokenWait(_) | ProxyError::Upstream(_) => {
                (not_yet(UNAVAILABLE_US), Seen::Nothing, Some(Refusal::Queue))
            }
            // No token could be had for the account: not now, with back-off
            // (no attempt counted: nothing went to WeChat).
            ProxyError::NoToken { .. } => {
                let wait = backoff.delay_us(attempts, random).max(UNAVAILABLE_US);
                (not_yet(wait), Seen::Nothing, Some(Refusal::Queue))
            }
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
