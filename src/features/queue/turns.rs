//! Weighted turns between callers (issue 47, "fair between callers"): one
//! round of the dispatcher, planned from the queues whose head is due. Each
//! caller with due work gets `weight × quantum` claims in the round, spread
//! over its queues in the order the store gave them (oldest head first),
//! and the plan alternates between callers, so that HR's 40 messages start
//! within one round however many marketing has queued. Pure: the store
//! gives the due queues, the config the weights.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::jobs::QueueKey;

/// One round: the queues to claim from, in order, and how many jobs each
/// may claim. `weight` gives a caller's weight (`[[caller]] weight`; 0 is
/// read as 1: a caller with due work always gets its turn).
pub fn round(due: &[QueueKey], weight: impl Fn(&str) -> u32, quantum: u32) -> Vec<(QueueKey, usize)> {
    // Each caller's queues, callers in the order of their oldest due head.
    let mut order: Vec<Arc<str>> = Vec::new();
    let mut queues: BTreeMap<Arc<str>, Vec<&QueueKey>> = BTreeMap::new();
    for q in due {
        let mine = queues.entry(q.caller.clone()).or_default();
        if mine.is_empty() {
            order.push(q.caller.clone());
        }
        if !mine.contains(&q) {
            mine.push(q);
        }
    }
    // Each caller's share of the round, over its queues round-robin.
    let mut shares: Vec<Vec<(QueueKey, usize)>> = Vec::with_capacity(order.len());
    for caller in &order {
        let mine = queues.get(caller).map(Vec::as_slice).unwrap_or_default();
        let budget =
            usize::try_from(u64::from(weight(caller).max(1)) * u64::from(quantum.max(1))).unwrap_or(usize::MAX);
        let (each, first) = (budget / mine.len().max(1), budget % mine.len().max(1));
        let counts = (0..mine.len()).map(|i| each + usize::from(i < first));
        shares.push(mine.iter().zip(counts).filter(|(_, n)| *n > 0).map(|(q, n)| ((*q).clone(), n)).collect());
    }
    // Interleaved: each caller's first queue, then each one's second, ...
    let mut plan = Vec::new();
    let longest = shares.iter().map(Vec::len).max().unwrap_or(0);
    for i in 0..longest {
        for share in &shares {
            if let Some(entry) = share.get(i) {
                plan.push(entry.clone());
            }
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(caller: &str, account: &str) -> QueueKey {
        QueueKey { caller: caller.into(), account: account.into(), rule: "template_send".into() }
    }

    #[test]
    fn a_caller_with_few_messages_gets_its_turn_beside_one_with_many() {
        // Marketing's queues are older and many; HR's one queue is new.
        let mut due: Vec<QueueKey> = (0..50).map(|i| q("marketing", &format!("wx{i}"))).collect();
        due.push(q("hr", "wx0"));
        let plan = round(&due, |_| 1, 8);
        let hr_at = plan.iter().position(|(k, _)| &*k.caller == "hr").expect("hr has a turn");
        assert_eq!(hr_at, 1, "second, right after marketing's first queue: {plan:?}");
        let total = |who: &str| plan.iter().filter(|(k, _)| &*k.caller == who).map(|(_, n)| n).sum::<usize>();
        assert_eq!((total("marketing"), total("hr")), (8, 8), "each caller's share of the round");
    }

    #[test]
    fn weights_divide_the_round() {
        let due = vec![q("marketing", "wx1"), q("hr", "wx1"), q("ops", "wx1")];
        let weight = |c: &str| match c {
            "hr" => 3,
            "ops" => 0,
            _ => 1,
        };
        let plan = round(&due, weight, 10);
        let n = |who: &str| plan.iter().find(|(k, _)| &*k.caller == who).map(|(_, n)| *n);
        assert_eq!((n("marketing"), n("hr"), n("ops")), (Some(10), Some(30), Some(10)), "weight 0 counts as 1");
    }

    #[test]
    fn a_callers_share_is_spread_over_its_queues_oldest_first() {
        let due = vec![q("hr", "wx1"), q("hr", "wx2"), q("hr", "wx3"), q("hr", "wx2")];
        let plan = round(&due, |_| 1, 5);
        let got: Vec<(&str, usize)> = plan.iter().map(|(k, n)| (&*k.account, *n)).collect();
        assert_eq!(got, [("wx1", 2), ("wx2", 2), ("wx3", 1)], "a queue listed twice counts once");
        assert!(round(&[], |_| 1, 5).is_empty());
        let huge = round(&due, |_| u32::MAX, u32::MAX);
        assert_eq!(huge.len(), 3, "any weight plans at once, without a loop per job");
    }
}
