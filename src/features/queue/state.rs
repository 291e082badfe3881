//! What queued delivery's hooks, routes and tasks share ([`Shared`]),
//! private to the queue's folder.

use std::sync::Arc;

use tokio::sync::Notify;

use super::metrics::QueueMetrics;
use super::slot::JobsSlot;
use crate::jobs::QueueSummary;

/// How long the admin API's queue summary is served again (the console
/// refreshes every 5 s).
pub const SUMMARY_FOR: crate::time::Micros = 5_000_000;

/// What the queue's hooks, routes and tasks share.
pub(super) struct Shared {
    /// The jobs store (empty: queued delivery is off, or waits for Redis).
    pub(super) jobs: Arc<JobsSlot>,
    /// Notified on each submission: the dispatcher looks at once.
    pub(super) wake: Notify,
    /// Notified when jobs may have ended: the callbacks loop looks at once.
    pub(super) ended: Notify,
    /// This instance's name as a lease owner (random per process).
    pub(super) owner: Arc<str>,
    /// The queue's background work, spawned here so that a graceful
    /// shutdown (`Component::stop`) waits for the sends under way.
    pub(super) tasks: tokio_util::task::TaskTracker,
    /// Cancelled when the instance stops (or the app is dropped): the
    /// loops start nothing new.
    pub(super) stopping: tokio_util::sync::CancellationToken,
    /// The last summary of every queue the admin API read, and when: read
    /// again at most every [`SUMMARY_FOR`] (one `summary` per account on
    /// Redis), however many consoles are open.
    pub(super) summary: std::sync::Mutex<Option<(crate::time::Micros, Arc<Vec<QueueSummary>>)>>,
    pub(super) metrics: QueueMetrics,
}

impl Shared {
    /// Spawns background `work`: it starts once the jobs store is open (at
    /// start, or when a reload or Redis answering opens it), never if the
    /// instance stops first, and a graceful stop waits for it.
    pub(super) fn spawn_when_open<F>(&self, work: impl FnOnce() -> F + Send + 'static)
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
}

/// This process's name as a lease owner: random, so two instances (or a
/// restarted one) never share it.
pub(super) fn owner_name() -> Arc<str> {
    let mut bytes = [0u8; 8];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes);
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}-{hex}", std::process::id()).into()
}
