//! Queued delivery (issue 47, docs/queued-delivery.md): a message a caller
//! hands wxgate once, sent at the first moment WeChat takes it.
//!
//! - **Intake** (this feature's hooks): a call of a rule with `queue =
//!   true` that asks for it (`Prefer: respond-async`, or its caller's
//!   `deliver = "queue"`) has its body read whole in `on_request`
//!   (`[queue] max_body`), its headers checked ([`intake`]), and once the
//!   other features have checked it (its account, its domain, its
//!   recipients) it is stored ([`crate::store::jobs`]) in `before_decide`
//!   and answered `202 Accepted` there: never decided nor forwarded now.
//! - **Dispatch** (`crate::ops::dispatch`): a task per instance sends due jobs as
//!   calls of its own through the same phases, in weighted turns between
//!   callers ([`turns`]); `before_forward` (the last hook before a job's
//!   request goes out) marks the job `Sending` durably first; WeChat's
//!   answer becomes the job's end ([`retry`]).

pub mod intake;
pub mod retry;
pub mod slot;
pub mod turns;

use std::sync::Arc;

use tokio::sync::Notify;

use crate::error::{Early, ProxyError};
use crate::features::hooks::{Asking, Env, Feature, Requesting, Sending};
use crate::store::jobs::{JobId, JobStore, QueueSummary};
use crate::telemetry::metrics::Outcome;

/// The queue as a feature: its jobs store (empty: queued delivery is off,
/// or waits for Redis) and the dispatcher's wake-up.
pub struct Queue {
    pub jobs: Arc<slot::JobsSlot>,
    /// Notified on each submission: the dispatcher looks at once.
    pub wake: Arc<Notify>,
    /// Notified when jobs may have ended: the callbacks loop
    /// (`crate::ops::callbacks`) looks at once.
    pub ended: Arc<Notify>,
    /// This instance's name as a lease owner (random per process).
    pub owner: Arc<str>,
    /// Queued delivery's background work (the dispatcher and each queue's
    /// turn, the callbacks and gauge loops), spawned here so that a graceful
    /// shutdown ([`Queue::stop`]) waits for the sends under way.
    pub tasks: tokio_util::task::TaskTracker,
    /// Cancelled when the instance stops: the loops start nothing new.
    pub stopping: tokio_util::sync::CancellationToken,
    /// The last summary of every queue the admin API read, and when: read
    /// again at most every [`SUMMARY_FOR`] (one `summary` per account on
    /// Redis), however many consoles are open.
    pub summary: std::sync::Mutex<Option<(crate::time::Micros, Arc<Vec<QueueSummary>>)>>,
}

/// How long the admin API's queue summary is served again (the console
/// refreshes every 5 s).
pub const SUMMARY_FOR: crate::time::Micros = 5_000_000;

/// What the queue keeps of one call.
#[derive(Default)]
pub enum Ctx {
    /// A live call (or one wxgate makes itself that is no job's send).
    #[default]
    Live,
    /// To be queued: what the intake read of its request.
    Queue(Box<intake::Asked>),
    /// A queued job's send (the dispatcher's seed): marked `Sending`
    /// before it goes.
    Send(Sends),
}

/// What the dispatcher seeds a job's send with.
pub struct Sends {
    pub id: JobId,
    /// Set when the job was marked `Sending` (its request may go out).
    pub marked: Arc<std::sync::atomic::AtomicBool>,
}

/// This process's name as a lease owner: random, so two instances (or a
/// restarted one) never share it.
pub fn owner_name() -> Arc<str> {
    let mut bytes = [0u8; 8];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes);
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}-{hex}", std::process::id()).into()
}

/// A refused submission's `reason` (`wxgate_queue_refused_total`).
fn refusal(e: &ProxyError) -> &'static str {
    match e {
        ProxyError::QueueFull { .. } => "queue_full",
        ProxyError::Unavailable(_) => "unavailable",
        _ => "bad_request",
    }
}

impl Queue {
    /// Spawns queued delivery's background `work` (a loop of `crate::ops`):
    /// it starts once the jobs store is open (at start, or when a reload or
    /// Redis answering opens it), never if the instance stops first, and a
    /// graceful stop ([`Queue::stop`]) waits for it.
    pub fn spawn_when_open<F>(&self, work: impl FnOnce() -> F + Send + 'static)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let opened = self.jobs.opened();
        let stopping = self.stopping.clone();
        self.tasks.spawn(async move {
            let opened = tokio::select! {
                opened = opened => opened,
                _ = stopping.cancelled() => false,
            };
            if opened {
                work().await;
            }
        });
    }

    /// A graceful stop: no turn, callback round or look starts any more;
    /// the sends under way finish (each ends `sent`, `failed` or waiting
    /// as its answer says, instead of `unknown` at the next start) within
    /// `deadline`. `false`: some were still under way at the deadline (their
    /// jobs end `unknown` when the next start recovers them).
    pub async fn stop(&self, deadline: std::time::Duration) -> bool {
        self.stopping.cancel();
        self.tasks.close();
        if self.jobs.get().is_some() {
            tracing::info!("queued delivery stopping: no new sends; waiting for those under way");
        }
        tokio::time::timeout(deadline, self.tasks.wait()).await.is_ok()
    }

    /// The jobs store, or the refusal of a call asking for queued delivery.
    pub fn jobs(&self) -> Result<&Arc<dyn JobStore>, ProxyError> {
        self.jobs.or_refusal()
    }
}

impl Feature for Queue {
    type Ctx = Ctx;

    async fn on_request(&self, env: Env<'_>, cx: &mut Ctx, req: &mut Requesting<'_>) -> Result<(), Early> {
        if let Some(sends) = req.seeds.take::<Sends>() {
            *cx = Ctx::Send(sends);
            return Ok(());
        }
        if req.own() {
            return Ok(());
        }
        // The call's queue request is read (its headers, its body) only when
        // it is to be queued: boxed, so a live call's future does not carry
        // that read's state.
        let asked = match intake::wanted(req) {
            Ok(None) => return Ok(()),
            Ok(Some(preferred)) => Box::pin(intake::read(&self.jobs, env, req, preferred)).await,
            Err(e) => Err(e),
        };
        match asked {
            Ok(Some(asked)) => *cx = Ctx::Queue(Box::new(asked)),
            Ok(None) => {}
            Err(e) => {
                let rule = req.rule.map_or(crate::telemetry::metrics::NO_RULE, |r| &r.name);
                env.core.metrics.queue.refused(rule, req.who.caller.entry.label(), refusal(&e));
                return Err(e.into());
            }
        }
        Ok(())
    }

    async fn before_decide(&self, env: Env<'_>, cx: &mut Ctx, asking: &mut Asking<'_>) -> Result<(), Early> {
        if !matches!(cx, Ctx::Queue(_)) {
            return Ok(());
        }
        let Ctx::Queue(asked) = std::mem::take(cx) else { return Ok(()) };
        let rule = asking.rule.map_or(crate::telemetry::metrics::NO_RULE, |r| &r.name);
        let (caller, metrics) = (asking.who.caller.entry.label(), &env.core.metrics.queue);
        // Boxed, as the read: a live call's future does not carry a submission's state.
        let resp = match Box::pin(intake::submit(&self.jobs, env, *asked, asking)).await {
            Ok(resp) => resp,
            Err(e) => {
                metrics.refused(rule, caller, refusal(&e));
                return Err(e.into());
            }
        };
        if !resp.headers().contains_key(intake::DUPLICATE) {
            metrics.submitted(rule, caller);
        }
        self.wake.notify_one();
        Err(Early::Answered(Box::new(resp), Outcome::queued))
    }

    /// A job's send: `Sending` is written (durably) before its request
    /// goes; a lease lost meanwhile stops it here, never sent.
    async fn before_forward(&self, env: Env<'_>, cx: &mut Ctx, _: &mut Sending<'_>) -> Result<(), Early> {
        let Ctx::Send(sends) = cx else { return Ok(()) };
        let jobs = self.jobs()?;
        let now = env.core.clock.now_us();
        match jobs.sending(sends.id, &self.owner, now).await {
            Ok(true) => {
                sends.marked.store(true, std::sync::atomic::Ordering::SeqCst);
                Ok(())
            }
            Ok(false) => Err(ProxyError::Unavailable(crate::error::Unavailable::JobLeaseLost).into()),
            Err(e) => Err(ProxyError::from(e).into()),
        }
    }
}
