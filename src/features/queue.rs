//! Queued delivery (issue 47, docs/queued-delivery.md): a message a caller
//! hands wxgate once, sent at the first moment WeChat takes it.
//!
//! - **Intake** (this feature's hooks): a call of a rule with `queue =
//!   true` that asks for it (`Prefer: respond-async`, or its caller's
//!   `deliver = "queue"`) has its body read whole in `on_request`
//!   (`[queue] max_body`), its headers checked ([`intake`]), and once the
//!   other features have checked it (its account, its domain, its
//!   recipients) it is stored ([`crate::jobs`]) in `before_decide`
//!   and answered `202 Accepted` there: never decided nor forwarded now.
//! - **Dispatch** ([`dispatch`]): a task per instance sends due jobs as
//!   calls of its own through the same phases, in weighted turns between
//!   callers ([`turns`]); `before_forward` (the last hook before a job's
//!   request goes out) marks the job `Sending` durably first; WeChat's
//!   answer becomes the job's end ([`retry`]).
//! - **Callbacks** ([`callbacks`]): an ended job's result posted, signed.
//! - **Gauges** ([`gauges`]) and its series ([`metrics`]).
//! - **Routes** ([`routes`]): `/v1/deliveries` on the proxy listener, for
//!   the caller that queued; `/v1/queues` and `/v1/deliveries/{caller}/{id}`
//!   on the admin listener.
//!
//! It is a component ([`crate::features::component`]): [`Queue`]'s state is
//! private; the server starts it (the jobs store opened, [`open`], and its
//! loops spawned), hands it its routes, a reload (where jobs live is fixed
//! until a restart) and a graceful stop.

pub mod callbacks;
pub mod dispatch;
pub mod flow;
pub mod gauges;
pub mod intake;
pub mod metrics;
pub mod open;
pub mod retry;
pub mod routes;
pub mod slot;
mod state;
pub mod turns;

use std::sync::{Arc, Weak};

use http::{Method, Request, Response};
use hyper::body::Incoming;
use prometheus_client::registry::Registry;
use tokio::sync::Notify;

use crate::admit::callers::Caller;
use crate::config::Config;
use crate::error::{Early, ProxyError};
use crate::features::component::{AdminAnswer, Component, ComponentError, Host};
use crate::features::hooks::{Asking, Env, Feature, Requesting, Sending};
use crate::jobs::JobStore;
use crate::telemetry::metrics::Outcome;
use crate::transport::body::RelayBody;
pub use dispatch::Sends;
use state::{owner_name, Shared};

/// Queued delivery, a feature and a component: its state shared with its
/// own tasks (the dispatcher and each queue's turn, the callbacks and gauge
/// loops), private. Dropped with the app: its loops stop.
pub struct Queue {
    shared: Arc<Shared>,
}

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

/// A refused submission's `reason` (`wxgate_queue_refused_total`).
fn refusal(e: &ProxyError) -> &'static str {
    match e {
        ProxyError::QueueFull { .. } => "queue_full",
        ProxyError::Unavailable(_) => "unavailable",
        _ => "bad_request",
    }
}

impl Queue {
    /// The queue, its series registered in `registry`; `jobs`: a jobs store
    /// its maker opened already (tests), where `config` puts it.
    pub fn new(config: &Config, jobs: Option<Arc<dyn JobStore>>, registry: &mut Registry) -> Queue {
        let slot = slot::JobsSlot::default();
        if let Some(jobs) = jobs {
            slot.set(jobs, config.queue.at.clone());
        }
        Queue {
            shared: Arc::new(Shared {
                jobs: Arc::new(slot),
                wake: Notify::new(),
                submitted: Notify::new(),
                wake_at: Default::default(),
                in_flight: Default::default(),
                runs: Default::default(),
                turned: Notify::new(),
                ended: Notify::new(),
                owner: owner_name(),
                tasks: tokio_util::task::TaskTracker::new(),
                stopping: tokio_util::sync::CancellationToken::new(),
                summary: Default::default(),
                metrics: metrics::register(registry),
            }),
        }
    }

    /// The jobs store, or the refusal of a call asking for queued delivery.
    fn jobs(&self) -> Result<&Arc<dyn JobStore>, ProxyError> {
        self.shared.jobs.or_refusal()
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        self.shared.stopping.cancel();
    }
}

impl Component for Queue {
    /// Opens the jobs store `config` needs ([`open::open`]) and spawns the
    /// dispatcher, callbacks and gauge loops (each starts once the store is
    /// open).
    async fn start(&self, host: Weak<dyn Host>, config: &Config) -> Result<(), ComponentError> {
        open::open(&self.shared.jobs, config)
            .await
            .map_err(|e| ComponentError { component: "queue", source: e.into() })?;
        dispatch::spawn(host.clone(), self.shared.clone());
        callbacks::spawn(host.clone(), self.shared.clone());
        gauges::spawn(host, self.shared.clone());
        Ok(())
    }

    /// Where queued jobs live (`[queue] file`, or the store's kind) is fixed
    /// once a jobs store is open: the running one stays until a restart, so
    /// a reload never loses jobs. Before that, the reload that first needs
    /// one (its first `queue = true` rule, a `file` instead of "off") opens
    /// it now, and the loops start.
    async fn reload(&self, next: &mut Config) -> Result<(), ComponentError> {
        if let Some(at) = self.shared.jobs.at() {
            if next.queue.at != at {
                tracing::warn!(
                    running = ?at,
                    "[queue] file (where queued jobs live) changes need a restart; keeping the running jobs store"
                );
                next.queue.at = at;
            }
            return Ok(());
        }
        open::open(&self.shared.jobs, next).await.map_err(|e| ComponentError { component: "queue", source: e.into() })
    }

    /// A graceful stop: no turn, callback round or look starts any more;
    /// the sends under way finish (each ends `sent`, `failed` or waiting
    /// as its answer says, instead of `unknown` at the next start) within
    /// `deadline`. `false`: some were still under way at the deadline (their
    /// jobs end `unknown` when the next start recovers them).
    async fn stop(&self, deadline: std::time::Duration) -> bool {
        let shared = &self.shared;
        shared.stopping.cancel();
        shared.tasks.close();
        if shared.jobs.get().is_some() {
            tracing::info!("queued delivery stopping: no new sends; waiting for those under way");
        }
        let finished = tokio::time::timeout(deadline, shared.tasks.wait()).await.is_ok();
        if !finished {
            tracing::warn!(
                ?deadline,
                "queued sends still under way at the shutdown deadline: their jobs end unknown at the next start (never resent)"
            );
        }
        finished
    }

    fn serves(&self, path: &str) -> bool {
        routes::is_ours(path)
    }

    async fn serve(
        &self,
        host: &dyn Host,
        caller: &Caller,
        req: Request<Incoming>,
    ) -> Result<Response<RelayBody>, ProxyError> {
        routes::serve(&self.shared, host, caller, req).await
    }

    async fn admin(&self, host: &dyn Host, method: &Method, path: &[&str]) -> Option<AdminAnswer> {
        match (method, path) {
            (&Method::GET, ["queues"]) => Some(routes::queues(&self.shared, host).await),
            (&Method::GET, ["deliveries", caller, id]) => {
                Some(routes::delivery(&self.shared, host, caller, id, false).await)
            }
            (&Method::DELETE, ["deliveries", caller, id]) => {
                Some(routes::delivery(&self.shared, host, caller, id, true).await)
            }
            (_, ["deliveries"] | ["deliveries", _]) => Some(routes::proxy_only(host, path)),
            _ => None,
        }
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
            Ok(Some(preferred)) => Box::pin(intake::read(&self.shared.jobs, env, req, preferred)).await,
            Err(e) => Err(e),
        };
        match asked {
            Ok(Some(asked)) => *cx = Ctx::Queue(Box::new(asked)),
            Ok(None) => {}
            Err(e) => {
                let rule = req.rule.map_or(crate::telemetry::metrics::NO_RULE, |r| &r.name);
                self.shared.metrics.refused(rule, req.who.caller.entry.label(), refusal(&e));
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
        let (caller, metrics) = (asking.who.caller.entry.label(), &self.shared.metrics);
        // Boxed, as the read: a live call's future does not carry a submission's state.
        let resp = match Box::pin(intake::submit(&self.shared.jobs, env, *asked, asking)).await {
            Ok(resp) => resp,
            Err(e) => {
                metrics.refused(rule, caller, refusal(&e));
                return Err(e.into());
            }
        };
        if !resp.headers().contains_key(intake::DUPLICATE) {
            metrics.submitted(rule, caller);
        }
        self.shared.wake.notify_one();
        self.shared.submitted.notify_waiters();
        Err(Early::Answered(Box::new(resp), Outcome::queued))
    }

    /// A job's send: `Sending` is written (durably) before its request
    /// goes; a lease lost meanwhile stops it here, never sent.
    async fn before_forward(&self, env: Env<'_>, cx: &mut Ctx, _: &mut Sending<'_>) -> Result<(), Early> {
        let Ctx::Send(sends) = cx else { return Ok(()) };
        let jobs = self.jobs()?;
        let now = env.core.clock.now_us();
        match jobs.sending(sends.id, &self.shared.owner, now).await {
            Ok(true) => {
                sends.marked.store(true, std::sync::atomic::Ordering::SeqCst);
                Ok(())
            }
            Ok(false) => Err(ProxyError::Unavailable(crate::error::Unavailable::JobLeaseLost).into()),
            Err(e) => Err(ProxyError::from(e).into()),
        }
    }
}
