//! Queued delivery's metrics (docs/metrics.md, "Queued delivery"), fed off
//! the call path of live calls:
//!
//! - the gauges `wxgate_queue_jobs`, `wxgate_queue_oldest_seconds` and
//!   `wxgate_queue_deadline_seconds`, set by a task of their own every
//!   [`GAUGES_EVERY`] from [`crate::jobs::JobStore::summary`]
//!   (counts kept per queue and state: work in queues, not jobs; one
//!   script per account on Redis; never per scrape, and not in the
//!   dispatcher's round);
//! - the ends the dispatcher writes ([`ended_as`], [`count_end`]): by
//!   state, and for a job sent its submit-to-send delay.
//!
//! The intake counts submissions and their refusals
//! ([`super::intake`]), a cancel is counted where it is answered
//! ([`super::routes`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Weak};

use super::metrics::QueueMetrics;
use super::state::Shared;
use crate::features::component::Host;
use crate::jobs::{End, QueueKey};
use crate::store::StoreError;
use crate::time::{Micros, Span};

/// How often the queue gauges are read from the jobs store.
pub const GAUGES_EVERY: Span = Span::from_micros(15_000_000);

/// Starts the refresh of the queue gauges once queued delivery is on (the
/// first at once); it ends when the app is dropped.
pub(super) fn spawn(host: Weak<dyn Host>, q: Arc<Shared>) {
    let queue = q.clone();
    queue.spawn_when_open(move || async move {
        // Jobs ended `unknown` by `recover` (whose queue it does not see):
        // from 0, so the first is an increase the alert sees.
        q.metrics.recovered_unknown(0);
        let mut shown = Shown::default();
        if let Some(host) = host.upgrade() {
            // The first pace is of the sends since this start.
            shown.sent = (host.core().clock.now_us(), q.metrics.sent_by_rule());
        }
        loop {
            let Some(host) = host.upgrade() else { return };
            if let Err(e) = refresh(&*host, &q, &mut shown).await {
                tracing::warn!(error = %e, "queued delivery: the jobs store's summary failed; the queue gauges keep their last values");
            }
            let clock = host.core().clock.clone();
            drop(host);
            tokio::select! {
                _ = clock.sleep(GAUGES_EVERY) => {}
                _ = q.stopping.cancelled() => return,
            }
        }
    });
}

/// A queue as its series name it: (rule, caller label).
type QueueName = (Arc<str>, Arc<str>);

/// A queue's unfinished jobs (queued, waiting, sending) and its oldest's submission.
type Counts = ([u64; 3], Option<Micros>);

/// The queues (rule, caller) and the rules whose gauges are set.
#[derive(Default)]
pub struct Shown {
    queues: BTreeSet<QueueName>,
    rules: BTreeSet<Arc<str>>,
    /// Jobs sent by rule at the last refresh, and when (for the pace).
    sent: (Micros, std::collections::HashMap<String, u64>),
}

/// Sets the queue gauges from the jobs store's summary (all accounts of a
/// rule and caller together) and the config's queueing rules; removes
/// those of queues no longer in the store and of rules that no longer queue.
async fn refresh(host: &dyn Host, q: &Shared, shown: &mut Shown) -> Result<(), StoreError> {
    let Some(jobs) = q.jobs.get().cloned() else { return Ok(()) };
    let summary = jobs.summary(None).await?;
    let now = host.core().clock.now_us();
    let m = &q.metrics;
    let mut queues: BTreeMap<QueueName, Counts> = BTreeMap::new();
    for s in summary {
        let (counts, oldest) = queues.entry((s.queue.rule.clone(), s.queue.caller.clone())).or_default();
        for (n, more) in counts.iter_mut().zip([s.queued, s.waiting, s.sending]) {
            *n = n.saturating_add(more);
        }
        if let Some(o) = s.oldest_us {
            *oldest = Some(oldest.map_or(o, |p| p.min(o)));
        }
    }
    for ((rule, caller), (counts, oldest)) in &queues {
        let age = oldest.map_or(0, |o| now.saturating_sub(o).max(0) / 1_000_000);
        m.set_queue(rule, caller, *counts, age);
    }
    for (rule, caller) in shown.queues.iter().filter(|k| !queues.contains_key(*k)) {
        m.drop_queue(rule, caller);
    }
    shown.queues = queues.into_keys().collect();

    let config = host.config();
    let mut rules = BTreeSet::new();
    for rule in &config.rules {
        if let Some(deadline) = config.rule_http(Some(rule)).queue {
            m.set_deadline(&rule.name, Some(deadline.unwrap_or(config.queue.deadline_us) / 1_000_000));
            rules.insert(rule.name.clone());
        }
    }
    for gone in shown.rules.difference(&rules) {
        m.set_deadline(gone, None);
    }
    shown.rules = rules;

    // Each queueing rule's pace since the last refresh, against its
    // tightest window's steady rate; shown while its queues have jobs or
    // sent some.
    let sent = m.sent_by_rule();
    let (then, before) = std::mem::replace(&mut shown.sent, (now, sent.clone()));
    let elapsed = (now - then) as f64 / 1e6;
    for rule in &config.rules {
        if config.rule_http(Some(rule)).queue.is_none() {
            continue;
        }
        let rate = rule
            .limits
            .iter()
            .filter_map(|l| match l {
                crate::limit::Limit::Window(w) => Some(w.count() as f64 / (w.per_us().max(1) as f64 / 1e6)),
                crate::limit::Limit::Calendar { .. } => None,
            })
            .reduce(f64::min);
        let now_sent = sent.get(&*rule.name).copied().unwrap_or(0);
        let delta = now_sent.saturating_sub(before.get(&*rule.name).copied().unwrap_or(0));
        let busy = delta > 0 || shown.queues.iter().any(|(r, _)| *r == rule.name);
        match rate {
            Some(rate) if busy => m.set_pace(&rule.name, Some(delta as f64 / elapsed.max(1.0) / rate)),
            _ => m.set_pace(&rule.name, None),
        }
    }
    Ok(())
}

/// What `end` makes of a job, as `wxgate_queue_ended_total`'s `state`
/// (`None`: not an end: a retry, or handed back).
pub fn ended_as(end: &End) -> Option<&'static str> {
    match end {
        End::Sent(_) => Some("sent"),
        End::Failed(_) => Some("failed"),
        End::Expired => Some("expired"),
        End::Unknown(_) => Some("unknown"),
        End::Retry { .. } | End::NotYet { .. } => None,
    }
}

/// Counts an end of a job of `queue` that this instance wrote (`state`
/// from [`ended_as`]), and a sent job's delay since its submission.
pub fn count_end(m: &QueueMetrics, queue: &QueueKey, state: Option<&str>, submitted_us: Micros, now: Micros) {
    let Some(state) = state else { return };
    m.ended(&queue.rule, &queue.caller, state);
    if state == "sent" {
        m.delay(&queue.rule, now.saturating_sub(submitted_us).max(0) as f64 / 1e6);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::Answer;

    #[test]
    fn only_an_end_that_finishes_a_job_is_counted() {
        let answer = || Answer { status: 200, errcode: Some(0), body: bytes::Bytes::new() };
        assert_eq!(ended_as(&End::Sent(answer())), Some("sent"));
        assert_eq!(ended_as(&End::Failed(answer())), Some("failed"));
        assert_eq!(ended_as(&End::Expired), Some("expired"));
        assert_eq!(ended_as(&End::Unknown(None)), Some("unknown"));
        assert_eq!(ended_as(&End::Retry { at: 1, answer: Some(answer()) }), None, "a retry waits");
        assert_eq!(ended_as(&End::NotYet { at: 1 }), None, "handed back unsent");
        let ends: Vec<&str> = super::super::metrics::QUEUE_ENDS.to_vec();
        assert_eq!(ends, ["sent", "failed", "expired", "cancelled", "unknown"]);
    }
}
