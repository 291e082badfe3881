//! Where queued delivery's jobs store is, once there is one. It is opened
//! when the config first needs it (at start, or at the reload that adds the
//! first `queue = true` rule: [`super::open`]), or, when
//! Redis did not answer then, by a retry once it does
//! ([`JobsSlot::connect_later`]). Once open it stays
//! for the life of the process: where jobs live changes only at a restart,
//! so a reload never loses them.
//!
//! Read without a lock (a `OnceLock`); the dispatcher, callbacks and gauge
//! loops wait on [`JobsSlot::opened`] and start when it is set.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use tokio::sync::watch;

use crate::config::queue::{JobsAt, Replicas};
use crate::config::RedisConfig;
use crate::error::ProxyError;
use crate::jobs::redis::RedisJobs;
use crate::jobs::JobStore;

/// The jobs store, when open, and where it lives.
pub struct JobsSlot {
    open: OnceLock<(Arc<dyn JobStore>, JobsAt)>,
    /// Redis (where the config puts the jobs) has not answered yet: a
    /// retry runs, and a call asking for queued delivery gets 503.
    connecting: AtomicBool,
    /// `true` once open (never back): the loops wait for it; dropped with
    /// the app, which ends their wait.
    on: watch::Sender<bool>,
}

impl Default for JobsSlot {
    fn default() -> Self {
        JobsSlot { open: OnceLock::new(), connecting: AtomicBool::new(false), on: watch::Sender::new(false) }
    }
}

impl JobsSlot {
    /// The store, when open.
    pub fn get(&self) -> Option<&Arc<dyn JobStore>> {
        self.open.get().map(|(jobs, _)| jobs)
    }

    /// Where the jobs live (`Some` once open, or while Redis is being
    /// connected to): fixed until a restart.
    pub fn at(&self) -> Option<JobsAt> {
        match self.open.get() {
            Some((_, at)) => Some(at.clone()),
            None => self.connecting.load(Ordering::Acquire).then_some(JobsAt::Redis),
        }
    }

    /// Whether a retry is connecting to Redis for the jobs.
    pub fn connecting(&self) -> bool {
        self.open.get().is_none() && self.connecting.load(Ordering::Acquire)
    }

    /// Sets the store (once: `false` if one was set already, and `jobs` is
    /// dropped), and wakes the loops waiting for it.
    pub fn set(&self, jobs: Arc<dyn JobStore>, at: JobsAt) -> bool {
        let set = self.open.set((jobs, at)).is_ok();
        self.connecting.store(false, Ordering::Release);
        self.on.send_replace(true);
        set
    }

    /// Marks the jobs as waiting for Redis (`false`: already open or
    /// marked, so no second retry starts).
    fn start_connecting(&self) -> bool {
        self.open.get().is_none() && !self.connecting.swap(true, Ordering::AcqRel)
    }

    /// Marks the jobs as waiting for Redis and starts a task that connects
    /// every `[store] breaker_open` (as the decision store's probe) until
    /// Redis answers, then sets the store (the loops waiting for it start).
    /// Nothing when a store is open or a task connecting; the task ends when
    /// the slot (the app) is dropped.
    pub fn connect_later(self: &Arc<Self>, redis: RedisConfig, replicas: Replicas) {
        if !self.start_connecting() {
            return;
        }
        let slot = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(redis.resilience.breaker_open).await;
                if slot.strong_count() == 0 {
                    return;
                }
                match RedisJobs::connect(&redis).await {
                    Ok(jobs) => {
                        let Some(slot) = slot.upgrade() else { return };
                        slot.set(Arc::new(jobs.with_replicas(replicas)), JobsAt::Redis);
                        tracing::warn!("Redis answers: queued delivery on (jobs in Redis)");
                        return;
                    }
                    Err(e) => tracing::debug!(error = %e, "queued delivery still waits for Redis"),
                }
            }
        });
    }

    /// Resolves (`true`) once the store is open; `false` when the app is
    /// dropped first.
    pub fn opened(&self) -> impl std::future::Future<Output = bool> + Send + 'static {
        let mut rx = self.on.subscribe();
        async move { rx.wait_for(|on| *on).await.is_ok() }
    }

    /// The store, or the refusal of a call asking for queued delivery: 503
    /// while Redis is being connected to (it comes on by itself), 400 when
    /// queued delivery is off.
    pub fn or_refusal(&self) -> Result<&Arc<dyn JobStore>, ProxyError> {
        if let Some(jobs) = self.get() {
            return Ok(jobs);
        }
        if self.connecting() {
            return Err(ProxyError::Unavailable(crate::error::Unavailable::JobsConnecting));
        }
        Err(ProxyError::BadRequest(
            "queued delivery is off on this wxgate ([queue] file = \"off\", or no jobs store could be opened)".into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_answers_400_when_off_503_while_connecting_and_is_set_once() {
        let slot = JobsSlot::default();
        assert!(matches!(slot.or_refusal(), Err(ProxyError::BadRequest(_))));
        assert_eq!(slot.at(), None);
        assert!(slot.start_connecting());
        assert!(!slot.start_connecting(), "one retry at a time");
        assert!(matches!(slot.or_refusal(), Err(ProxyError::Unavailable(_))));
        assert_eq!(slot.at(), Some(JobsAt::Redis));
        let dir = std::env::temp_dir().join(format!("wxgate-slot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("q.db");
        let jobs: Arc<dyn JobStore> = Arc::new(crate::jobs::sqlite::SqliteJobs::open(&path).expect("open"));
        let opened = slot.opened();
        assert!(slot.set(jobs.clone(), JobsAt::Redis));
        assert!(!slot.set(jobs, JobsAt::Off), "set once");
        assert!(slot.or_refusal().is_ok());
        assert!(!slot.connecting());
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        assert!(rt.block_on(opened), "the waiters wake");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
