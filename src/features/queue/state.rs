//! What queued delivery's hooks, routes and tasks share ([`Shared`]),
//! private to the queue's folder.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::Notify;

use super::flow::Flow;
use super::metrics::QueueMetrics;
use super::slot::JobsSlot;
use crate::jobs::{QueueKey, QueueSummary};
use crate::time::Micros;

/// How long the admin API's queue summary is served again (the console
/// refreshes every 5 s).
pub const SUMMARY_FOR: crate::time::Micros = 5_000_000;

/// What this instance keeps of its queued sends between turns.
#[derive(Default)]
pub(super) struct Runs {
    /// Each (account, rule)'s window, and the callers whose turns share it
    /// now (with their weights).
    pub(super) pairs: HashMap<(Arc<str>, Arc<str>), PairRun>,
    /// Each queue refused by wxgate's decision (a window, a quota, a
    /// penalty): no turn of it starts before then (the dispatcher wakes at it).
    pub(super) paused: HashMap<QueueKey, Micros>,
}

/// One (account, rule)'s sends on this instance.
pub(super) struct PairRun {
    pub(super) flow: Flow,
    /// Callers with a turn under way on it.
    pub(super) turns: HashMap<Arc<str>, TurnShare>,
}

/// One caller's turn on a pair: weighted fair queuing of its sends' starts.
#[derive(Debug, Clone, Copy)]
pub(super) struct TurnShare {
    pub(super) weight: u32,
    /// Sends it started, each counted `1 / weight`: no turn with work to
    /// send starts more than [`SLACK`] ahead of the least of the others.
    pub(super) vtime: f64,
    /// It competes for starts: it has jobs it could send now (not drained,
    /// not refused until later) and room in its share of the window.
    pub(super) ready: bool,
}

/// How far (in sends per unit of weight) a turn may start ahead of the
/// others on its pair.
pub(super) const SLACK: f64 = 2.0;

/// Most (account, rule)s and waiting queues one instance keeps: past it,
/// the idle ones are forgotten (a window then starts again small).
pub(super) const KEPT: usize = 10_000;

impl Runs {
    fn pair_mut(&mut self, queue: &QueueKey) -> Option<&mut PairRun> {
        self.pairs.get_mut(&(queue.account.clone(), queue.rule.clone()))
    }

    /// How many sends `queue`'s turn may start now, with `in_flight` under
    /// way: its part of its pair's window (all of it when it is the only
    /// caller sending there, else its share by weight, at least 1), and no
    /// more than keeps it within [`SLACK`] of the other callers' turns
    /// that compete for starts (so callers sharing a rule take its slots in
    /// the ratio of their weights however fast the first of them starts).
    /// A turn competes while it has work (`has_work`: jobs it could send
    /// now) and room in its share; one whose share is full (its sends slow
    /// at WeChat) holds no other back. Also whether that changed.
    pub(super) fn allowed(&mut self, queue: &QueueKey, in_flight: usize, has_work: bool) -> (usize, bool) {
        let Some(pair) = self.pairs.get_mut(&(queue.account.clone(), queue.rule.clone())) else { return (0, false) };
        let limit = pair.flow.limit();
        let total: u64 = pair.turns.values().map(|t| u64::from(t.weight.max(1))).sum();
        let Some(me) = pair.turns.get(&queue.caller).copied() else { return (0, false) };
        let weight = u64::from(me.weight.max(1));
        let share = if pair.turns.len() <= 1 {
            limit
        } else {
            usize::try_from(limit as u64 * weight / total.max(1)).unwrap_or(1).max(1)
        };
        let room = share.saturating_sub(in_flight);
        let competes = has_work && room > 0;
        let changed = competes != me.ready;
        if let Some(t) = pair.turns.get_mut(&queue.caller) {
            t.ready = competes;
        }
        let others =
            pair.turns.iter().filter(|(c, t)| **c != queue.caller && t.ready).map(|(_, t)| t.vtime).reduce(f64::min);
        let allowed = match others {
            _ if !has_work => 0,
            None => room,
            Some(least) => {
                let ahead = ((least + SLACK - me.vtime) * weight as f64).floor();
                room.min(if ahead > 0.0 { ahead as usize } else { 0 })
            }
        };
        (allowed, changed)
    }

    /// `queue`'s turn started `n` sends.
    pub(super) fn started(&mut self, queue: &QueueKey, n: usize) {
        if let Some(me) = self.pair_mut(queue).and_then(|p| p.turns.get_mut(&queue.caller)) {
            me.vtime += n as f64 / f64::from(me.weight.max(1));
        }
    }

    /// A turn of `queue` starts: its pair's window (made under `ceiling`),
    /// its place among the pair's turns level with the least of theirs.
    pub(super) fn enter(&mut self, queue: &QueueKey, weight: u32, ceiling: u32) {
        if self.pairs.len() >= KEPT {
            self.pairs.retain(|_, p| !p.turns.is_empty());
        }
        let pair = self
            .pairs
            .entry((queue.account.clone(), queue.rule.clone()))
            .or_insert_with(|| PairRun { flow: Flow::new(ceiling), turns: HashMap::new() });
        pair.flow.set_ceiling(ceiling);
        let level = pair.turns.values().map(|t| t.vtime).reduce(f64::min).unwrap_or(0.0);
        pair.turns.insert(queue.caller.clone(), TurnShare { weight, vtime: level, ready: true });
    }

    /// One of `queue`'s sends ended.
    pub(super) fn seen(&mut self, queue: &QueueKey, seen: super::flow::Seen, now: Micros) {
        if let Some(pair) = self.pair_mut(queue) {
            pair.flow.seen(seen, now);
        }
    }

    /// A turn of `queue` ends, its queue refused until `paused_until`.
    pub(super) fn leave(&mut self, queue: &QueueKey, paused_until: Micros, now: Micros) {
        if let Some(pair) = self.pair_mut(queue) {
            pair.turns.remove(&queue.caller);
        }
        if paused_until > now {
            if self.paused.len() >= KEPT {
                self.paused.retain(|_, until| *until > now);
            }
            self.paused.insert(queue.clone(), paused_until);
        } else {
            self.paused.remove(queue);
        }
    }
}

/// What the queue's hooks, routes and tasks share.
pub(super) struct Shared {
    /// The jobs store (empty: queued delivery is off, or waits for Redis).
    pub(super) jobs: Arc<JobsSlot>,
    /// Notified on each submission: the dispatcher looks at once.
    pub(super) wake: Notify,
    /// Notified (all waiters) on each submission: a queue's sends that
    /// found nothing more to claim look again.
    pub(super) submitted: Notify,
    /// When the dispatcher is to look next at the latest (a job handed
    /// back until its slot, or its penalty's end): it looks then, not at
    /// its next tick.
    pub(super) wake_at: std::sync::Mutex<Option<crate::time::Micros>>,
    /// Queued sends under way on this instance, all queues (at most
    /// `[queue] instance_in_flight`).
    pub(super) in_flight: std::sync::atomic::AtomicUsize,
    /// Notified (all waiters) when a turn starts sends, ends, or has no
    /// more work: a turn held back for another caller's looks again.
    pub(super) turned: Notify,
    /// Windows and waits kept between turns.
    pub(super) runs: std::sync::Mutex<Runs>,
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
    /// The dispatcher looks at `at` at the latest.
    pub(super) fn wake_at(&self, at: crate::time::Micros) {
        let mut next = self.wake_at.lock().unwrap_or_else(|e| e.into_inner());
        if next.is_none_or(|n| at < n) {
            *next = Some(at);
            drop(next);
            self.wake.notify_one();
        }
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    fn q(caller: &str) -> QueueKey {
        QueueKey { caller: caller.into(), account: "wx1".into(), rule: "template_send".into() }
    }

    #[test]
    fn callers_sharing_a_rule_start_sends_in_turn_by_weight() {
        let mut runs = Runs::default();
        runs.enter(&q("marketing"), 1, 64);
        assert_eq!(runs.allowed(&q("marketing"), 0, true).0, 4, "alone: the whole window");
        runs.enter(&q("hr"), 3, 64);
        // Marketing races ahead: it may start 2 before HR starts any.
        let mut started = (0, 0);
        for _ in 0..400 {
            for (who, n) in [("marketing", &mut started.0), ("hr", &mut started.1)] {
                let k = runs.allowed(&q(who), 0, true).0.min(1);
                runs.started(&q(who), k);
                *n += k;
            }
        }
        let ratio = started.1 as f64 / started.0 as f64;
        assert!((2.5..3.5).contains(&ratio), "hr (weight 3) starts 3 for marketing's 1: {started:?}");
        // A turn with nothing to send, or whose share is full, holds nobody back.
        assert_eq!(runs.allowed(&q("hr"), 0, false), (0, true));
        assert_eq!(
            runs.allowed(&q("marketing"), 0, true).0,
            1,
            "its share of the window (1 of 4), no longer its turn's"
        );
        runs.allowed(&q("hr"), 3, true);
        assert_eq!(runs.allowed(&q("marketing"), 0, true).0, 1, "hr's share is full: marketing is not held back");
        runs.leave(&q("hr"), 0, 0);
        assert_eq!(runs.allowed(&q("marketing"), 0, true).0, 4);
    }
}
