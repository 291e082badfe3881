//! Coalescing concurrent decisions into one script run.
//!
//! Calls queue by a key: on one Redis server one key for the whole
//! connection (a run decides any accounts' calls), in a Cluster the account
//! (a run's keys must share a slot); "account" below is that key.
//!
//! The first call of an account with nothing in flight *leads*: it runs its
//! decision at once, alone (so an idle instance adds no delay). Calls that
//! arrive meanwhile queue; when the leader's answer comes back, the oldest
//! queued call leads the next run, taking every call queued behind it (up to
//! a cap). So a busy account has one script run in flight per connection,
//! deciding many calls in one round trip, each exactly as if alone and in
//! arrival order.
//!
//! Guarantees:
//! - every queued call gets exactly one answer, or is told to lead;
//! - a leader that goes away (its client disconnected) still hands the
//!   queue on (`Drop`); the calls of its abandoned run learn it by their
//!   channel closing, and decide again (a run that reached Redis may have
//!   debited them: never more than the limit, only less of it used);
//! - a queued call told to lead that goes away before it runs passes the
//!   lead on ([`Waiting`]'s `Drop`), so no queue waits for a leader that
//!   will not come.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use tokio::sync::oneshot;

use super::StoreError;
use crate::limit::Decision;

/// What a queued call hears back.
pub enum Answer<C> {
    /// Its decision (or why there is none).
    Decided(Result<Decision, StoreError>),
    /// It leads the next run; here is its call back.
    Lead(C),
}

struct Queue<C> {
    waiting: VecDeque<(C, oneshot::Sender<Answer<C>>)>,
}

/// Queues per account; an account is present while a run of it is in flight.
pub struct Batcher<C> {
    queues: Mutex<HashMap<String, Queue<C>>>,
}

impl<C> Default for Batcher<C> {
    fn default() -> Self {
        Batcher { queues: Mutex::new(HashMap::new()) }
    }
}

/// Whether a call leads now or waits for its answer.
pub enum Joined<'a, C> {
    Lead(Leader<'a, C>),
    Wait(Waiting<'a, C>),
}

/// A queued call's end of the line. If it goes away (its client left, or it
/// timed out) just as it was told to lead, it passes the lead on when
/// dropped, so a queue never waits for a leader that will not come.
pub struct Waiting<'a, C> {
    batcher: &'a Batcher<C>,
    account: String,
    rx: oneshot::Receiver<Answer<C>>,
}

impl<C> Waiting<'_, C> {
    /// The answer, or an error if the run this call was in was abandoned.
    pub async fn answer(&mut self) -> Result<Answer<C>, oneshot::error::RecvError> {
        (&mut self.rx).await
    }
}

impl<C> Drop for Waiting<'_, C> {
    fn drop(&mut self) {
        self.rx.close();
        if let Ok(Answer::Lead(call)) = self.rx.try_recv() {
            // Lead, take nothing, run nothing: the Leader's drop hands on.
            drop(self.batcher.lead(&self.account, call));
        }
    }
}

impl<C> Batcher<C> {
    fn queues(&self) -> std::sync::MutexGuard<'_, HashMap<String, Queue<C>>> {
        self.queues.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Leads at once if no run of `account` is in flight, else queues.
    pub fn join<'a>(&'a self, account: &str, call: C) -> Joined<'a, C> {
        let mut queues = self.queues();
        if let Some(q) = queues.get_mut(account) {
            let (tx, rx) = oneshot::channel();
            q.waiting.push_back((call, tx));
            return Joined::Wait(Waiting { batcher: self, account: account.to_owned(), rx });
        }
        queues.insert(account.to_owned(), Queue { waiting: VecDeque::new() });
        Joined::Lead(self.lead(account, call))
    }

    /// Leads a run after being told to ([`Answer::Lead`]).
    pub fn lead<'a>(&'a self, account: &str, call: C) -> Leader<'a, C> {
        Leader { batcher: self, account: account.to_owned(), calls: vec![call], answers: Vec::new() }
    }

    /// Accounts with a run in flight (tests, metrics).
    pub fn in_flight(&self) -> usize {
        self.queues().len()
    }
}

/// The call running the next script run, with the calls it took along.
pub struct Leader<'a, C> {
    batcher: &'a Batcher<C>,
    account: String,
    /// The leader's own call first, then the calls taken from the queue.
    pub calls: Vec<C>,
    /// Where the taken calls' answers go (`calls[1..]`).
    answers: Vec<oneshot::Sender<Answer<C>>>,
}

impl<C> Leader<'_, C> {
    /// Takes queued calls, oldest first, up to `max` calls in all, while
    /// `fits(first, next)`. Calls whose caller has gone are dropped.
    pub fn take(&mut self, max: usize, mut fits: impl FnMut(&C, &C) -> bool) {
        let mut queues = self.batcher.queues();
        let Some(q) = queues.get_mut(&self.account) else { return };
        while self.calls.len() < max {
            let Some((next, tx)) = q.waiting.front() else { break };
            if tx.is_closed() {
                q.waiting.pop_front();
                continue;
            }
            if !fits(&self.calls[0], next) {
                break;
            }
            if let Some((call, tx)) = q.waiting.pop_front() {
                self.calls.push(call);
                self.answers.push(tx);
            }
        }
    }

    /// Hands each taken call its answer; returns the leader's own.
    pub fn finish(
        mut self,
        results: Result<Vec<Result<Decision, StoreError>>, StoreError>,
    ) -> Result<Decision, StoreError> {
        let answers = std::mem::take(&mut self.answers);
        match results {
            Ok(results) if results.len() == answers.len() + 1 => {
                let mut results = results.into_iter();
                let own = results.next().unwrap_or_else(|| Err(miscounted(0, 1)));
                for (tx, result) in answers.into_iter().zip(results) {
                    let _ = tx.send(Answer::Decided(result));
                }
                own
            }
            Ok(results) => {
                let e = miscounted(results.len(), answers.len() + 1);
                for tx in answers {
                    let _ = tx.send(Answer::Decided(Err(e.clone())));
                }
                Err(e)
            }
            Err(e) => {
                for tx in answers {
                    let _ = tx.send(Answer::Decided(Err(e.clone())));
                }
                Err(e)
            }
        }
    }
}

/// A run answered `got` decisions for `calls` calls.
fn miscounted(got: usize, calls: usize) -> StoreError {
    StoreError::BadReply { script: "acquire.lua", reply: format!("{got} decisions for {calls} calls") }
}

impl<C> Drop for Leader<'_, C> {
    /// Hands the queue to its oldest live call, or ends the account's turn.
    fn drop(&mut self) {
        let mut queues = self.batcher.queues();
        let Some(q) = queues.get_mut(&self.account) else { return };
        while let Some((call, tx)) = q.waiting.pop_front() {
            if tx.send(Answer::Lead(call)).is_ok() {
                return;
            }
        }
        queues.remove(&self.account);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admit(at: i64) -> Result<Decision, StoreError> {
        Ok(Decision::Admit { at, hold_us: 0, escalated: false, quota: None, calendar: None })
    }

    #[test]
    fn the_first_call_leads_and_later_ones_queue_then_lead_in_order() {
        let b: Batcher<u32> = Batcher::default();
        let Joined::Lead(mut first) = b.join("a", 1) else { panic!("first call leads") };
        let Joined::Wait(mut rx2) = b.join("a", 2) else { panic!("second waits") };
        let Joined::Wait(mut rx3) = b.join("a", 3) else { panic!("third waits") };
        let (rx2, rx3) = (&mut rx2.rx, &mut rx3.rx);
        // Another account is independent.
        assert!(matches!(b.join("b", 9), Joined::Lead(_)));
        first.take(64, |_, _| true);
        assert_eq!(first.calls, vec![1, 2, 3]);
        assert_eq!(first.finish(Ok(vec![admit(1), admit(2), admit(3)])), admit(1));
        assert!(matches!(rx2.try_recv(), Ok(Answer::Decided(Ok(Decision::Admit { at: 2, .. })))));
        assert!(matches!(rx3.try_recv(), Ok(Answer::Decided(Ok(Decision::Admit { at: 3, .. })))));
        assert_eq!(b.in_flight(), 0, "the turn ended with an empty queue");
    }

    #[test]
    fn a_leader_that_goes_away_hands_the_queue_on() {
        let b: Batcher<u32> = Batcher::default();
        let Joined::Lead(first) = b.join("a", 1) else { panic!("leads") };
        let Joined::Wait(rx2) = b.join("a", 2) else { panic!("waits") };
        let Joined::Wait(mut rx3) = b.join("a", 3) else { panic!("waits") };
        drop(rx2); // the second caller left
        drop(first); // the leader's client disconnected mid-run
        let Ok(Answer::Lead(call)) = rx3.rx.try_recv() else { panic!("the oldest live call leads") };
        assert_eq!(call, 3);
        let next = b.lead("a", call);
        let down = StoreError::Redis("down".into());
        assert_eq!(next.finish(Err(down.clone())), Err(down));
        assert_eq!(b.in_flight(), 0);
    }

    #[test]
    fn a_run_takes_at_most_max_calls_and_only_fitting_ones() {
        let b: Batcher<u32> = Batcher::default();
        let Joined::Lead(mut first) = b.join("a", 10) else { panic!("leads") };
        let mut rxs = Vec::new();
        for c in [11, 12, 20, 13] {
            let Joined::Wait(rx) = b.join("a", c) else { panic!("waits") };
            rxs.push(rx);
        }
        first.take(3, |a, b| a / 10 == b / 10);
        assert_eq!(first.calls, vec![10, 11, 12]);
        let _ = first.finish(Ok(vec![admit(0), admit(0), admit(0)]));
        // 20 does not fit with 10..: it leads the next run, which takes 13.
        let Ok(Answer::Lead(call)) = rxs[2].rx.try_recv() else { panic!("20 leads") };
        let mut next = b.lead("a", call);
        next.take(64, |a, b| a / 10 == b / 10);
        assert_eq!(next.calls, vec![20], "13 does not fit with 20");
    }

    /// The race a real load found: the leader hands over to the oldest
    /// waiter just as that waiter's client leaves. The lead must not die
    /// with it, or every later call of the account waits out its timeout.
    #[test]
    fn a_lead_handed_to_a_caller_that_leaves_passes_on() {
        let b: Batcher<u32> = Batcher::default();
        let Joined::Lead(first) = b.join("a", 1) else { panic!("leads") };
        let Joined::Wait(second) = b.join("a", 2) else { panic!("waits") };
        let Joined::Wait(mut third) = b.join("a", 3) else { panic!("waits") };
        drop(first); // hands the lead to the second call...
        drop(second); // ...whose client leaves before it runs
        let Ok(Answer::Lead(call)) = third.rx.try_recv() else { panic!("the lead passed on to the third call") };
        assert_eq!(call, 3);
        drop(b.lead("a", call));
        drop(third);
        assert_eq!(b.in_flight(), 0, "nothing left waiting for a leader");
        assert!(matches!(b.join("a", 4), Joined::Lead(_)), "a new call leads at once");
    }
}
