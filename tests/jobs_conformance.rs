//! Every queued-delivery jobs store ([`JobStore`], src/jobs.rs) keeps
//! the same promises: one table of scenarios, each run through
//! `Arc<dyn JobStore>` on every store of [`stores`], on times passed in
//! (plain microseconds; no store reads a clock). Then the embedded store's
//! own promises over a real file: a restart keeps everything, a SIGKILL
//! right after `submit` returned loses nothing, and concurrent submissions
//! share one transaction (one fsync).

use crate::support;

use std::any::Any;
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::jobs::{answer, job_to, new_job, queue, roomy, strict_job, SelfChild, CHILD_LIFE};
use support::redis_server::RedisServer;
use support::{TempDir, SEC, T0};
use wxgate::jobs::redis::RedisJobs;
use wxgate::jobs::sqlite::SqliteJobs;
use wxgate::jobs::{
    Bound, Bounds, CallerRoom, Cancelled, End, JobId, JobState, JobStore, NewJob, Recovered, SubmitError, Submitted,
    ANSWER_MAX,
};

const DAY: i64 = 86_400 * SEC;
const LEASE: i64 = 30 * SEC;

/// Every store the table runs on: a name, the store, and what must live as
/// long as it (its directory, its server). Add a store here in one line.
async fn stores() -> Vec<(&'static str, Arc<dyn JobStore>, Box<dyn Any + Send>)> {
    let dir = TempDir::new("jobs-sqlite");
    let sqlite = SqliteJobs::open(&dir.join("jobs.db")).expect("open the jobs file");
    let redis = RedisServer::start();
    let on_redis = RedisJobs::connect(&redis.store_config("jc")).await.expect("connect the jobs store");
    vec![("sqlite", Arc::new(sqlite), Box::new(dir)), ("redis", Arc::new(on_redis), Box::new(redis))]
}

/// Runs each named scenario on every store, as one test each.
macro_rules! on_every_store {
    ($($name:ident),* $(,)?) => {$(
        #[tokio::test]
        async fn $name() {
            for (store_name, store, guard) in stores().await {
                eprintln!("{} on {store_name}", stringify!($name));
                scenarios::$name(store).await;
                drop(guard);
            }
        }
    )*};
}

on_every_store!(
    a_submitted_job_is_queued_and_only_its_caller_sees_it,
    a_repeated_idempotency_key_returns_the_first_job_and_stores_nothing,
    an_idempotency_key_is_forgotten_after_its_time,
    each_bound_refuses_a_submission_whole_and_stores_nothing,
    an_ended_job_frees_its_room,
    a_queue_goes_out_in_submission_order,
    a_waiting_or_held_head_holds_its_queue,
    jobs_sharing_a_recipient_go_one_at_a_time_in_order_and_others_go_past,
    a_renewed_lease_outlives_its_first_term_and_only_its_owner_renews_it,
    due_queues_lists_queues_with_a_due_free_head_oldest_first_per_caller,
    a_caller_with_many_due_queues_never_hides_another_callers_due_queue,
    due_queues_leaves_out_claimed_and_sending_heads_and_lists_a_waiting_head_at_its_time,
    a_cancelled_or_recovered_head_moves_its_queue_in_or_out_of_the_due_list,
    a_second_dispatcher_gets_nothing_leased_until_the_lease_runs_out_and_is_recovered,
    a_job_that_may_have_been_sent_ends_unknown_and_is_never_handed_out_again,
    finish_ends_each_way_with_attempts_counted_only_for_sends,
    cancel_takes_back_only_jobs_not_yet_sending_and_only_its_callers,
    summary_counts_each_queue_by_state,
    purge_deletes_only_jobs_ended_before_keep,
    an_ended_jobs_callback_is_pending_until_done_and_its_job_kept_until_then,
    every_way_a_job_ends_makes_its_callback_pending_and_only_then,
    callbacks_due_hands_out_at_most_max_across_accounts,
    callbacks_due_passes_over_a_caller_without_room,
    a_job_past_its_deadline_expires_wherever_it_is_in_its_queue,
    every_way_a_job_ends_deletes_its_body_and_keeps_its_answer_and_metadata,
    past_ended_jobs_a_callers_oldest_ended_jobs_in_the_account_go_with_their_keys,
    submit_and_cancel_is_never_refused_and_keeps_at_most_ended_jobs,
    a_pending_callback_past_ended_jobs_is_given_up_with_its_job,
    purge_keeps_an_ended_job_while_its_idempotency_key_counts,
);

async fn submit(s: &Arc<dyn JobStore>, job: NewJob, now: i64) -> JobId {
    let done = s.submit(job, &roomy(DAY), now).await.expect("submit");
    assert!(!done.duplicate);
    done.id
}

async fn state(s: &Arc<dyn JobStore>, caller: &str, id: JobId) -> JobState {
    s.get(caller, id).await.expect("get").expect("the job").state
}

fn ids(jobs: &[wxgate::jobs::Job]) -> Vec<JobId> {
    jobs.iter().map(|j| j.id).collect()
}

async fn unfinished(s: &Arc<dyn JobStore>) -> u64 {
    s.summary(None).await.expect("summary").iter().map(|q| q.queued + q.waiting + q.sending).sum()
}

mod scenarios {
    pub use super::callback_scenarios::{
        an_ended_jobs_callback_is_pending_until_done_and_its_job_kept_until_then,
        callbacks_due_hands_out_at_most_max_across_accounts, callbacks_due_passes_over_a_caller_without_room,
        every_way_a_job_ends_makes_its_callback_pending_and_only_then,
    };
    pub use super::kept_scenarios::{
        a_pending_callback_past_ended_jobs_is_given_up_with_its_job,
        every_way_a_job_ends_deletes_its_body_and_keeps_its_answer_and_metadata,
        past_ended_jobs_a_callers_oldest_ended_jobs_in_the_account_go_with_their_keys,
        purge_keeps_an_ended_job_while_its_idempotency_key_counts,
        submit_and_cancel_is_never_refused_and_keeps_at_most_ended_jobs,
    };
    use super::*;

    pub async fn a_submitted_job_is_queued_and_only_its_caller_sees_it(s: Arc<dyn JobStore>) {
        let q = queue("hr", "wx1", "template_send");
        let mut job = new_job(&q, 500);
        job.deadline_us = Some(T0 + DAY);
        job.callback = Some("https://hr.example/done".into());
        job.traceparent = Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into());
        let id = submit(&s, job.clone(), T0).await;
        let got = s.get("hr", id).await.expect("get").expect("the caller's job");
        assert_eq!(got.id, id);
        assert_eq!(got.new, job, "stored as submitted");
        assert_eq!(got.state, JobState::Queued);
        assert_eq!((got.submitted_us, got.due_us, got.updated_us), (T0, T0, T0));
        assert_eq!((got.attempts, got.owner.clone(), got.answer.clone()), (0, None, None));
        assert_eq!(s.get("marketing", id).await.expect("get"), None, "another caller's id is not found");
        assert_eq!(s.get("hr", JobId([7; 16])).await.expect("get"), None);
        let second = submit(&s, new_job(&q, 10), T0).await;
        let second = s.get("hr", second).await.expect("get").expect("job");
        assert!(second.seq > got.seq, "seq grows with submission");
    }

    pub async fn a_repeated_idempotency_key_returns_the_first_job_and_stores_nothing(s: Arc<dyn JobStore>) {
        let q = queue("batch", "wx1", "template_send");
        let mut job = new_job(&q, 100);
        job.idempotency_key = Some("run-42/item-7".into());
        let first = s.submit(job.clone(), &roomy(DAY), T0).await.expect("submit");
        assert!(!first.duplicate);
        let again = s.submit(job.clone(), &roomy(DAY), T0 + DAY - 1).await.expect("submit again");
        assert_eq!(again, Submitted { id: first.id, duplicate: true });
        assert_eq!(unfinished(&s).await, 1, "nothing more stored");
        // Even when the caller's room is used up, a repeat gets its id.
        let full = Bounds { caller_jobs: 1, ..roomy(DAY) };
        let repeat = s.submit(job.clone(), &full, T0 + 1).await.expect("repeat while full");
        assert_eq!(repeat.id, first.id);
        // Keys are per caller.
        let mut other = job.clone();
        other.queue = queue("other", "wx1", "template_send");
        let theirs = s.submit(other, &roomy(DAY), T0 + 2).await.expect("another caller's key");
        assert!(!theirs.duplicate);
        assert_ne!(theirs.id, first.id);
        // And per account: the same key for another account is another message.
        let mut elsewhere = job.clone();
        elsewhere.queue = queue("batch", "wx2", "template_send");
        let second = s.submit(elsewhere, &roomy(DAY), T0 + 3).await.expect("the key for another account");
        assert!(!second.duplicate);
        assert_ne!(second.id, first.id);
    }

    pub async fn an_idempotency_key_is_forgotten_after_its_time(s: Arc<dyn JobStore>) {
        let q = queue("batch", "wx1", "template_send");
        let mut job = new_job(&q, 100);
        job.idempotency_key = Some("k".into());
        let first = s.submit(job.clone(), &roomy(DAY), T0).await.expect("submit");
        let later = s.submit(job.clone(), &roomy(DAY), T0 + DAY).await.expect("after a day");
        assert!(!later.duplicate, "the key's day is over");
        assert_ne!(later.id, first.id);
        let repeat = s.submit(job, &roomy(DAY), T0 + DAY + 1).await.expect("repeat of the new one");
        assert_eq!(repeat, Submitted { id: later.id, duplicate: true });
        assert_eq!(unfinished(&s).await, 2);
    }

    pub async fn each_bound_refuses_a_submission_whole_and_stores_nothing(s: Arc<dyn JobStore>) {
        let tight = |f: fn(&mut Bounds)| {
            let mut b = roomy(DAY);
            f(&mut b);
            b
        };
        // (bound, bounds, what is submitted first, the refused one).
        let a = |c: &str, acct: &str, n: usize| new_job(&queue(c, acct, "r"), n);
        let cases: Vec<(Bound, Bounds, Vec<NewJob>, NewJob, NewJob)> = vec![
            (
                Bound::CallerJobs,
                tight(|b| b.caller_jobs = 2),
                vec![a("c1", "x1", 10), a("c1", "y1", 10)],
                a("c1", "z1", 10),
                a("c9", "z1", 10),
            ),
            (
                Bound::CallerBytes,
                tight(|b| b.caller_bytes = 100),
                vec![a("c2", "x2", 60)],
                a("c2", "y2", 41),
                a("c2", "y2", 40),
            ),
            (
                Bound::AccountJobs,
                tight(|b| b.account_jobs = 2),
                vec![a("c3", "x3", 10), a("c4", "x3", 10)],
                a("c5", "x3", 10),
                a("c5", "y3", 10),
            ),
            (
                Bound::AccountBytes,
                tight(|b| b.account_bytes = 100),
                vec![a("c6", "x4", 50), a("c7", "x4", 50)],
                a("c8", "x4", 1),
                a("c8", "y4", 100),
            ),
        ];
        for (bound, bounds, before, mut refused, fits) in cases {
            for job in before {
                s.submit(job, &bounds, T0).await.expect("within the bounds");
            }
            let count = unfinished(&s).await;
            refused.idempotency_key = Some(format!("{bound:?}"));
            match s.submit(refused.clone(), &bounds, T0 + 1).await {
                Err(SubmitError::Full(b)) => assert_eq!(b, bound),
                other => panic!("{bound:?}: expected Full, got {other:?}"),
            }
            assert_eq!(unfinished(&s).await, count, "{bound:?}: nothing stored");
            // Its idempotency key was not kept either: with room, it is new.
            let stored = s.submit(refused, &roomy(DAY), T0 + 2).await.expect("with room");
            assert!(!stored.duplicate, "{bound:?}: the refused submission's key was not stored");
            let caller = stored_caller(&s, stored.id).await;
            assert_eq!(s.cancel(&caller, stored.id, T0 + 3).await.expect("cancel"), Cancelled::Cancelled);
            // Exactly at the bound, or another caller/account, still fits.
            s.submit(fits, &bounds, T0 + 4).await.expect("at the bound or elsewhere: fits");
        }
    }

    async fn stored_caller(s: &Arc<dyn JobStore>, id: JobId) -> String {
        for c in ["c1", "c2", "c3", "c4", "c5", "c6", "c7", "c8", "c9"] {
            if s.get(c, id).await.expect("get").is_some() {
                return c.to_owned();
            }
        }
        panic!("no caller has the job");
    }

    pub async fn an_ended_job_frees_its_room(s: Arc<dyn JobStore>) {
        let q = queue("hr", "wx1", "r");
        let bounds = Bounds { caller_jobs: 1, account_bytes: 100, ..roomy(DAY) };
        let first = s.submit(new_job(&q, 100), &bounds, T0).await.expect("first").id;
        assert!(matches!(s.submit(new_job(&q, 1), &bounds, T0).await, Err(SubmitError::Full(Bound::CallerJobs))));
        let claimed = s.claim(&q, "i1", T0, LEASE, 1).await.expect("claim");
        assert_eq!(ids(&claimed), vec![first]);
        assert!(s.sending(first, "i1", T0).await.expect("sending"));
        // Sending still counts.
        assert!(matches!(s.submit(new_job(&q, 1), &bounds, T0).await, Err(SubmitError::Full(_))));
        let sent = End::Sent(answer(200, 0, r#"{"errcode":0,"msgid":1}"#));
        assert!(s.finish(first, "i1", sent, T0 + 1).await.expect("finish"));
        s.submit(new_job(&q, 100), &bounds, T0 + 2).await.expect("room again after Sent");
    }

    pub async fn a_queue_goes_out_in_submission_order(s: Arc<dyn JobStore>) {
        let q = queue("hr", "wx1", "r");
        let other = queue("hr", "wx1", "other_rule");
        let mut want = Vec::new();
        for i in 0..5 {
            want.push(submit(&s, new_job(&q, 10 + i), T0 + i as i64).await);
            submit(&s, new_job(&other, 10), T0).await;
        }
        let first = s.claim(&q, "i1", T0 + 10, LEASE, 3).await.expect("claim");
        assert_eq!(ids(&first), want[..3].to_vec(), "the first three, in seq order");
        assert!(first.windows(2).all(|w| w[0].seq < w[1].seq));
        for job in &first {
            assert_eq!(job.state, JobState::Claimed);
            assert_eq!(job.owner.as_deref(), Some("i1"));
            assert_eq!(job.lease_us, T0 + 10 + LEASE);
            assert_eq!(job.new.queue, q, "only this queue's jobs");
        }
        for job in &first {
            let sent = End::Sent(answer(200, 0, "{}"));
            assert!(s.sending(job.id, "i1", T0 + 11).await.expect("sending"));
            assert!(s.finish(job.id, "i1", sent, T0 + 12).await.expect("finish"));
        }
        let rest = s.claim(&q, "i1", T0 + 13, LEASE, 10).await.expect("claim the rest");
        assert_eq!(ids(&rest), want[3..].to_vec());
        assert!(s.claim(&q, "i1", T0 + 13, LEASE, 0).await.expect("claim 0").is_empty());
        let unknown = queue("nobody", "wx1", "r");
        assert!(s.claim(&unknown, "i1", T0, LEASE, 10).await.expect("claim of no queue").is_empty());
    }

    pub async fn a_waiting_or_held_head_holds_its_queue(s: Arc<dyn JobStore>) {
        let q = queue("hr", "wx1", "r");
        let a = submit(&s, strict_job(&q, 10), T0).await;
        let b = submit(&s, strict_job(&q, 10), T0).await;
        // A held head: nothing behind it is handed out.
        assert_eq!(ids(&s.claim(&q, "i1", T0, LEASE, 1).await.expect("claim")), vec![a]);
        assert!(s.claim(&q, "i2", T0, LEASE, 5).await.expect("claim").is_empty(), "head claimed");
        assert!(s.sending(a, "i1", T0).await.expect("sending"));
        assert!(s.claim(&q, "i2", T0, LEASE, 5).await.expect("claim").is_empty(), "head sending");
        // A waiting head: the same until it is due.
        let retry = End::Retry { at: T0 + 10 * SEC, answer: Some(answer(200, 45009, "{}")) };
        assert!(s.finish(a, "i1", retry, T0 + 1).await.expect("finish"));
        assert_eq!(state(&s, "hr", a).await, JobState::Waiting);
        assert!(s.claim(&q, "i1", T0 + 10 * SEC - 1, LEASE, 5).await.expect("claim").is_empty(), "head waiting");
        assert_eq!(state(&s, "hr", b).await, JobState::Queued, "b waits behind a");
        let head = s.claim(&q, "i1", T0 + 10 * SEC, LEASE, 5).await.expect("claim when due");
        assert_eq!(ids(&head), vec![a], "a strict queue hands out its head only, b after a ends");
        assert!(s.finish(a, "i1", End::Sent(answer(200, 0, "{}")), T0 + 10 * SEC).await.expect("finish"));
        assert_eq!(ids(&s.claim(&q, "i1", T0 + 10 * SEC, LEASE, 5).await.expect("claim")), vec![b]);
    }

    /// Jobs to one recipient go one at a time, in the order submitted
    /// (whoever claims them); jobs to others go past them in parallel. A
    /// job waiting (a back-off, a refusal) holds back only its recipients'.
    pub async fn jobs_sharing_a_recipient_go_one_at_a_time_in_order_and_others_go_past(s: Arc<dyn JobStore>) {
        let q = queue("mkt", "wx1", "r");
        let mut want = Vec::new();
        for i in 0..3 {
            for to in ["o1", "o2", "o3"] {
                want.push((to, submit(&s, job_to(&q, to, 10 + i), T0).await));
            }
        }
        let of = |to: &str| want.iter().filter(|(t, _)| *t == to).map(|(_, id)| *id).collect::<Vec<_>>();
        let first = s.claim(&q, "i1", T0, LEASE, 10).await.expect("claim");
        assert_eq!(ids(&first), vec![of("o1")[0], of("o2")[0], of("o3")[0]], "each recipient's first, in order");
        assert!(s.claim(&q, "i2", T0, LEASE, 10).await.expect("claim").is_empty(), "the rest wait for theirs");
        // o1's first is retried later: o1's second waits for it, o2's goes.
        assert!(s.sending(of("o1")[0], "i1", T0).await.expect("sending"));
        let retry = End::Retry { at: T0 + 5 * SEC, answer: Some(answer(200, -1, "{}")) };
        assert!(s.finish(of("o1")[0], "i1", retry, T0 + 1).await.expect("finish"));
        assert!(s.finish(of("o2")[0], "i1", End::Sent(answer(200, 0, "{}")), T0 + 1).await.expect("finish"));
        assert_eq!(ids(&s.claim(&q, "i2", T0 + 2, LEASE, 10).await.expect("claim")), vec![of("o2")[1]]);
        assert_eq!(s.due_queues(T0 + 2, 4).await.expect("due"), vec![], "o1 waits, o2 and o3 are out");
        assert_eq!(s.due_queues(T0 + 5 * SEC, 4).await.expect("due"), vec![q.clone()], "due when o1's wait ends");
        assert_eq!(ids(&s.claim(&q, "i2", T0 + 5 * SEC, LEASE, 10).await.expect("claim")), vec![of("o1")[0]]);
        // A job to two recipients waits for both; a job to none, for nobody.
        let q2 = queue("mkt", "wx1", "r2");
        let a = submit(&s, job_to(&q2, "o1", 1), T0).await;
        let both = NewJob { lanes: wxgate::jobs::Lanes::of(["o1", "o2"]), ..new_job(&q2, 1) };
        let both = submit(&s, both, T0).await;
        let c = submit(&s, job_to(&q2, "o2", 1), T0).await;
        let anyone = submit(&s, new_job(&q2, 1), T0).await;
        assert_eq!(ids(&s.claim(&q2, "i1", T0, LEASE, 10).await.expect("claim")), vec![a, anyone]);
        assert!(s.finish(a, "i1", End::Sent(answer(200, 0, "{}")), T0).await.expect("finish"));
        assert_eq!(ids(&s.claim(&q2, "i1", T0, LEASE, 10).await.expect("claim")), vec![both], "c waits for it");
        assert!(s.finish(both, "i1", End::Sent(answer(200, 0, "{}")), T0).await.expect("finish"));
        assert_eq!(ids(&s.claim(&q2, "i1", T0, LEASE, 10).await.expect("claim")), vec![c]);
    }

    /// A lease renewed while its send is under way is not taken for a dead
    /// instance's; only its owner renews it, and an ended job is not renewed.
    pub async fn a_renewed_lease_outlives_its_first_term_and_only_its_owner_renews_it(s: Arc<dyn JobStore>) {
        let q = queue("hr", "wx1", "r");
        let (a, b) = (submit(&s, new_job(&q, 1), T0).await, submit(&s, new_job(&q, 1), T0).await);
        assert_eq!(s.claim(&q, "i1", T0, LEASE, 2).await.expect("claim").len(), 2);
        assert!(s.sending(a, "i1", T0).await.expect("sending"));
        assert_eq!(s.renew(&[a, b], "i2", T0 + LEASE / 2, LEASE).await.expect("renew"), 0, "not i2's");
        assert_eq!(s.renew(&[a, b], "i1", T0 + LEASE / 2, LEASE).await.expect("renew"), 2);
        assert_eq!(s.recover(T0 + LEASE).await.expect("recover"), Recovered::default(), "renewed: nothing ran out");
        assert!(s.finish(b, "i1", End::Sent(answer(200, 0, "{}")), T0 + LEASE).await.expect("finish"));
        assert_eq!(s.renew(&[a, b], "i1", T0 + LEASE, LEASE).await.expect("renew"), 1, "b has ended");
        assert!(s.finish(a, "i1", End::Sent(answer(200, 0, "{}")), T0 + 2 * LEASE).await.expect("finish"));
        assert_eq!(state(&s, "hr", a).await, JobState::Sent, "answered after its first lease ran out: sent");
        assert_eq!(s.renew(&[], "i1", T0, LEASE).await.expect("renew nothing"), 0);
    }

    pub async fn due_queues_lists_queues_with_a_due_free_head_oldest_first_per_caller(s: Arc<dyn JobStore>) {
        let (q1, q2, q3) = (queue("hr", "wx1", "r"), queue("mkt", "wx1", "r"), queue("hr", "wx2", "r"));
        assert!(s.due_queues(T0, 10).await.expect("due").is_empty());
        submit(&s, strict_job(&q2, 10), T0 + 2).await;
        submit(&s, strict_job(&q1, 10), T0 + 1).await;
        let held = submit(&s, strict_job(&q3, 10), T0).await;
        submit(&s, strict_job(&q3, 10), T0).await;
        assert_eq!(s.due_queues(T0 + 5, 10).await.expect("due"), vec![q3.clone(), q1.clone(), q2.clone()]);
        assert_eq!(s.due_queues(T0 + 5, 1).await.expect("due"), vec![q3.clone(), q2.clone()], "at most 1 per caller");
        assert!(s.due_queues(T0 + 5, 0).await.expect("due").is_empty(), "0 per caller lists nothing");
        assert_eq!(s.due_queues(T0 + 1, 10).await.expect("due"), vec![q3.clone(), q1.clone()], "q2 not yet due");
        assert_eq!(ids(&s.claim(&q3, "i1", T0 + 5, LEASE, 1).await.expect("claim")), vec![held]);
        assert_eq!(s.due_queues(T0 + 5, 10).await.expect("due"), vec![q1.clone(), q2.clone()], "q3's head is held");
        let not_yet = End::NotYet { at: T0 + 100 };
        assert!(s.finish(held, "i1", not_yet, T0 + 6).await.expect("finish"));
        assert_eq!(s.due_queues(T0 + 99, 10).await.expect("due"), vec![q1.clone(), q2.clone()], "q3 waits");
        assert_eq!(
            s.due_queues(T0 + 100, 10).await.expect("due"),
            vec![q1, q3, q2],
            "q3 due again, beside its caller's"
        );
    }

    /// Marketing's campaign fills many old queues (several accounts and
    /// rules); HR's one queue is newer. However few queues per caller the
    /// dispatcher asks for, HR's is listed, marketing's come oldest head
    /// first and no more than asked.
    pub async fn a_caller_with_many_due_queues_never_hides_another_callers_due_queue(s: Arc<dyn JobStore>) {
        // Names sort otherwise than their heads' ages: the order is by age.
        let mut marketing = Vec::new();
        for (i, account) in ["wx9", "wx3", "wx7", "wx1", "wx5", "wx2"].into_iter().enumerate() {
            for (j, rule) in ["template_send", "custom_send"].into_iter().enumerate() {
                let q = queue("marketing", account, rule);
                let at = T0 + (2 * i + j) as i64;
                for _ in 0..3 {
                    submit(&s, new_job(&q, 10), at).await;
                }
                marketing.push(q);
            }
        }
        let hr = queue("hr", "wx1", "template_send");
        submit(&s, new_job(&hr, 10), T0 + SEC).await;
        let now = T0 + 2 * SEC;
        for per_caller in [1, 2, 5, 11, 12, 100] {
            let due = s.due_queues(now, per_caller).await.expect("due");
            let shown = per_caller.min(marketing.len());
            let mut want = marketing[..shown].to_vec();
            want.push(hr.clone());
            assert_eq!(due, want, "{per_caller} per caller: marketing's oldest first, then hr (its oldest is newer)");
        }
        // HR's head now older than all of marketing's: HR's turn comes first.
        let earlier = queue("hr", "wx2", "template_send");
        submit(&s, new_job(&earlier, 10), T0 - 1).await;
        let due = s.due_queues(now, 3).await.expect("due");
        assert_eq!(due[..2], [earlier, hr], "callers in the order of their oldest due head");
        assert_eq!(due[2..], marketing[..3]);
    }

    /// A head being sent or claimed holds its queue and takes none of its
    /// caller's room in the list; a head told to wait is listed again at
    /// its time, in its place by age.
    pub async fn due_queues_leaves_out_claimed_and_sending_heads_and_lists_a_waiting_head_at_its_time(
        s: Arc<dyn JobStore>,
    ) {
        let (a, b, c, d) =
            (queue("mk", "wx1", "r"), queue("mk", "wx2", "r"), queue("mk", "wx3", "r"), queue("mk", "wx4", "r"));
        let hr = queue("hr", "wx1", "r");
        for (i, q) in [&a, &b, &c, &d].into_iter().enumerate() {
            submit(&s, strict_job(q, 10), T0 + i as i64).await;
            submit(&s, strict_job(q, 10), T0 + i as i64).await;
        }
        submit(&s, strict_job(&hr, 10), T0 + 10).await;
        let now = T0 + 20;
        assert_eq!(s.due_queues(now, 2).await.expect("due"), vec![a.clone(), b.clone(), hr.clone()]);
        let claimed = s.claim(&a, "i1", now, LEASE, 1).await.expect("claim");
        let sending = s.claim(&b, "i1", now, LEASE, 1).await.expect("claim");
        assert!(s.sending(sending[0].id, "i1", now).await.expect("sending"));
        assert_eq!(
            s.due_queues(now, 2).await.expect("due"),
            vec![c.clone(), d.clone(), hr.clone()],
            "a claimed head and a sending head are not listed, nor take the caller's room"
        );
        let back = T0 + 60 * SEC;
        assert!(s.finish(claimed[0].id, "i1", End::NotYet { at: back }, now).await.expect("finish"));
        let retry = End::Retry { at: back + 1, answer: Some(answer(200, 45009, "{}")) };
        assert!(s.finish(sending[0].id, "i1", retry, now).await.expect("finish"));
        assert_eq!(s.get("mk", claimed[0].id).await.expect("get").expect("job").state, JobState::Waiting);
        assert_eq!(s.due_queues(back - 1, 10).await.expect("due"), vec![c.clone(), d.clone(), hr.clone()], "waiting");
        assert_eq!(
            s.due_queues(back, 10).await.expect("due"),
            vec![c.clone(), d.clone(), a.clone(), hr.clone()],
            "a is due at its time"
        );
        assert_eq!(
            s.due_queues(back + 1, 10).await.expect("due"),
            vec![c.clone(), d.clone(), a.clone(), b.clone(), hr.clone()]
        );
        assert_eq!(s.due_queues(back + 1, 2).await.expect("due"), vec![c, d, hr], "the oldest heads first");
    }

    /// Every write that changes a queue's head changes whether it is due:
    /// a lease run out (recover), a cancel of a claimed head, a sending head
    /// ended unknown, the last job gone.
    pub async fn a_cancelled_or_recovered_head_moves_its_queue_in_or_out_of_the_due_list(s: Arc<dyn JobStore>) {
        let q = queue("hr", "wx1", "r");
        let (a, b, c) = (
            submit(&s, strict_job(&q, 1), T0).await,
            submit(&s, strict_job(&q, 1), T0).await,
            submit(&s, strict_job(&q, 1), T0).await,
        );
        assert_eq!(ids(&s.claim(&q, "i1", T0, LEASE, 1).await.expect("claim")), vec![a]);
        assert!(s.due_queues(T0, 4).await.expect("due").is_empty(), "claimed head");
        assert_eq!(s.recover(T0 + LEASE).await.expect("recover"), Recovered { requeued: 1, unknown: 0 });
        assert_eq!(s.due_queues(T0 + LEASE, 4).await.expect("due"), vec![q.clone()], "requeued head");
        assert_eq!(ids(&s.claim(&q, "i1", T0 + LEASE, LEASE, 1).await.expect("claim")), vec![a]);
        assert_eq!(s.cancel("hr", a, T0 + LEASE).await.expect("cancel"), Cancelled::Cancelled);
        assert_eq!(s.due_queues(T0 + LEASE, 4).await.expect("due"), vec![q.clone()], "b is the head now");
        assert_eq!(ids(&s.claim(&q, "i1", T0 + LEASE, LEASE, 1).await.expect("claim")), vec![b]);
        assert!(s.sending(b, "i1", T0 + LEASE).await.expect("sending"));
        assert!(s.due_queues(T0 + LEASE, 4).await.expect("due").is_empty(), "sending head");
        assert_eq!(s.recover(T0 + 2 * LEASE).await.expect("recover"), Recovered { requeued: 0, unknown: 1 });
        assert_eq!(s.due_queues(T0 + 2 * LEASE, 4).await.expect("due"), vec![q.clone()], "c is the head now");
        assert_eq!(s.cancel("hr", c, T0 + 2 * LEASE).await.expect("cancel"), Cancelled::Cancelled);
        // No job left: the queue may still be listed (Redis: a cancel never
        // takes a queue out of the index, src/jobs/redis.rs
        // `added_only`); a claim hands out nothing and takes it out.
        assert!(s.claim(&q, "i1", T0 + 2 * LEASE, LEASE, 1).await.expect("claim").is_empty());
        assert!(s.due_queues(T0 + 2 * LEASE, 4).await.expect("due").is_empty(), "no job left");
    }

    pub async fn a_second_dispatcher_gets_nothing_leased_until_the_lease_runs_out_and_is_recovered(
        s: Arc<dyn JobStore>,
    ) {
        let q = queue("hr", "wx1", "r");
        let id = submit(&s, new_job(&q, 10), T0).await;
        assert_eq!(ids(&s.claim(&q, "i1", T0, LEASE, 5).await.expect("claim")), vec![id]);
        assert!(s.claim(&q, "i2", T0 + 1, LEASE, 5).await.expect("claim").is_empty());
        assert_eq!(s.recover(T0 + LEASE - 1).await.expect("recover"), Recovered::default(), "lease still runs");
        assert!(s.claim(&q, "i2", T0 + LEASE, LEASE, 5).await.expect("claim").is_empty(), "not recovered yet");
        let back = s.recover(T0 + LEASE).await.expect("recover");
        assert_eq!(back, Recovered { requeued: 1, unknown: 0 });
        assert_eq!(state(&s, "hr", id).await, JobState::Queued);
        assert_eq!(ids(&s.claim(&q, "i2", T0 + LEASE, LEASE, 5).await.expect("claim")), vec![id]);
        assert!(!s.sending(id, "i1", T0 + LEASE).await.expect("sending"), "the stale owner must not send");
        assert!(!s.finish(id, "i1", End::Expired, T0 + LEASE).await.expect("finish"), "nor end it");
        assert!(s.sending(id, "i2", T0 + LEASE).await.expect("sending"));
        let job = s.get("hr", id).await.expect("get").expect("job");
        assert_eq!((job.state, job.owner.as_deref(), job.attempts), (JobState::Sending, Some("i2"), 1));
        // A lease that ran out before `sending`: too late to send.
        let late = submit(&s, new_job(&queue("hr", "wx9", "r"), 1), T0).await;
        assert_eq!(s.claim(&queue("hr", "wx9", "r"), "i3", T0, LEASE, 1).await.expect("claim").len(), 1);
        assert!(!s.sending(late, "i3", T0 + LEASE).await.expect("sending"), "lease ran out");
        assert_eq!(state(&s, "hr", late).await, JobState::Claimed);
    }

    pub async fn a_job_that_may_have_been_sent_ends_unknown_and_is_never_handed_out_again(s: Arc<dyn JobStore>) {
        let q = queue("hr", "wx1", "r");
        let id = submit(&s, new_job(&q, 10), T0).await;
        let next = submit(&s, new_job(&q, 10), T0).await;
        s.claim(&q, "i1", T0, LEASE, 1).await.expect("claim");
        assert!(s.sending(id, "i1", T0 + 1).await.expect("sending"));
        assert_eq!(s.recover(T0 + LEASE).await.expect("recover"), Recovered { requeued: 0, unknown: 1 });
        let job = s.get("hr", id).await.expect("get").expect("job");
        assert_eq!((job.state, job.owner, job.attempts), (JobState::Unknown, None, 1));
        assert!(!s.finish(id, "i1", End::Sent(answer(200, 0, "{}")), T0 + LEASE).await.expect("finish"));
        let after = s.claim(&q, "i2", T0 + LEASE, LEASE, 5).await.expect("claim");
        assert_eq!(ids(&after), vec![next], "the queue goes on without it");
        let back = s.recover(T0 + 10 * LEASE).await.expect("recover");
        assert_eq!(back, Recovered { requeued: 1, unknown: 0 }, "only `next`, claimed, goes back");
        assert_eq!(state(&s, "hr", id).await, JobState::Unknown, "ended for good");
        let again = s.claim(&q, "i3", T0 + 10 * LEASE, LEASE, 5).await.expect("claim");
        assert_eq!(ids(&again), vec![next], "never the unknown one");
    }

    pub async fn finish_ends_each_way_with_attempts_counted_only_for_sends(s: Arc<dyn JobStore>) {
        let long = "y".repeat(ANSWER_MAX + 100);
        struct Case {
            end: End,
            sent_first: bool,
            state: JobState,
            attempts: u32,
            due: Option<i64>,
        }
        let now = T0 + 5;
        let cases = vec![
            Case {
                end: End::Sent(answer(200, 0, r#"{"msgid":9}"#)),
                sent_first: true,
                state: JobState::Sent,
                attempts: 1,
                due: None,
            },
            Case {
                end: End::Failed(answer(200, 40003, "{}")),
                sent_first: true,
                state: JobState::Failed,
                attempts: 1,
                due: None,
            },
            Case {
                end: End::Retry { at: now + SEC, answer: Some(answer(200, 45009, "{}")) },
                sent_first: true,
                state: JobState::Waiting,
                attempts: 1,
                due: Some(now + SEC),
            },
            Case {
                end: End::NotYet { at: now + SEC },
                sent_first: false,
                state: JobState::Waiting,
                attempts: 0,
                due: Some(now + SEC),
            },
            Case { end: End::Expired, sent_first: false, state: JobState::Expired, attempts: 0, due: None },
            Case { end: End::Unknown(None), sent_first: true, state: JobState::Unknown, attempts: 1, due: None },
            Case {
                end: End::Unknown(Some(answer(502, -1, &long))),
                sent_first: true,
                state: JobState::Unknown,
                attempts: 1,
                due: None,
            },
        ];
        for (i, case) in cases.into_iter().enumerate() {
            let q = queue("hr", &format!("wx{i}"), "r");
            let id = submit(&s, new_job(&q, 10), T0).await;
            s.claim(&q, "i1", T0, LEASE, 1).await.expect("claim");
            if case.sent_first {
                assert!(s.sending(id, "i1", T0 + 1).await.expect("sending"));
            }
            let kept = match &case.end {
                End::Sent(a) | End::Failed(a) | End::Unknown(Some(a)) | End::Retry { answer: Some(a), .. } => {
                    Some(a.clone())
                }
                _ => None,
            };
            assert!(!s.finish(id, "other", case.end.clone(), now).await.expect("finish"), "{i}: not the owner's");
            if case.sent_first {
                // "Never sent" is refused for a job that may have been.
                for never in [End::NotYet { at: now + SEC }, End::Expired] {
                    assert!(!s.finish(id, "i1", never.clone(), now).await.expect("finish"), "{i}: {never:?}");
                }
                assert_eq!(s.get("hr", id).await.expect("get").expect("job").state, JobState::Sending, "{i}");
            }
            assert!(s.finish(id, "i1", case.end.clone(), now).await.expect("finish"), "{i}");
            let job = s.get("hr", id).await.expect("get").expect("job");
            assert_eq!(job.state, case.state, "{i}: {:?}", case.end);
            assert_eq!(job.attempts, case.attempts, "{i}");
            assert_eq!((job.owner.clone(), job.updated_us), (None, now), "{i}");
            if let Some(due) = case.due {
                assert_eq!(job.due_us, due, "{i}");
            }
            match kept {
                Some(mut a) => {
                    a.body.truncate(ANSWER_MAX);
                    assert_eq!(job.answer, Some(a), "{i}: the answer is kept (at most ANSWER_MAX bytes)");
                }
                None => assert_eq!(job.answer, None, "{i}"),
            }
            assert!(!s.finish(id, "i1", End::Expired, now).await.expect("finish twice"), "{i}: no longer held");
            if case.state == JobState::Waiting {
                // Sent again when due: its attempts go on counting.
                assert_eq!(s.claim(&q, "i1", now + SEC, LEASE, 1).await.expect("claim").len(), 1);
                assert!(s.sending(id, "i1", now + SEC).await.expect("sending"));
                let again = s.get("hr", id).await.expect("get").expect("job");
                assert_eq!(again.attempts, case.attempts + 1, "{i}");
            }
        }
    }

    pub async fn cancel_takes_back_only_jobs_not_yet_sending_and_only_its_callers(s: Arc<dyn JobStore>) {
        let q = queue("hr", "wx1", "r");
        let queued = submit(&s, new_job(&q, 10), T0).await;
        assert_eq!(s.cancel("marketing", queued, T0).await.expect("cancel"), Cancelled::NotFound);
        assert_eq!(s.cancel("hr", JobId([1; 16]), T0).await.expect("cancel"), Cancelled::NotFound);
        assert_eq!(state(&s, "hr", queued).await, JobState::Queued, "another caller cancels nothing");
        assert_eq!(s.cancel("hr", queued, T0 + 1).await.expect("cancel"), Cancelled::Cancelled);
        let job = s.get("hr", queued).await.expect("get").expect("job");
        assert_eq!((job.state, job.updated_us), (JobState::Cancelled, T0 + 1));
        assert_eq!(s.cancel("hr", queued, T0 + 2).await.expect("cancel"), Cancelled::TooLate(JobState::Cancelled));
        // Claimed: cancelled, and its dispatcher may no longer send it.
        let claimed = submit(&s, new_job(&q, 10), T0).await;
        assert_eq!(ids(&s.claim(&q, "i1", T0, LEASE, 1).await.expect("claim")), vec![claimed]);
        assert_eq!(s.cancel("hr", claimed, T0 + 1).await.expect("cancel"), Cancelled::Cancelled);
        assert!(!s.sending(claimed, "i1", T0 + 1).await.expect("sending"));
        // Waiting: cancelled.
        let waiting = submit(&s, new_job(&q, 10), T0).await;
        s.claim(&q, "i1", T0, LEASE, 1).await.expect("claim");
        assert!(s.finish(waiting, "i1", End::NotYet { at: T0 + DAY }, T0).await.expect("finish"));
        assert_eq!(s.cancel("hr", waiting, T0 + 1).await.expect("cancel"), Cancelled::Cancelled);
        // Sending: too late.
        let sending = submit(&s, new_job(&q, 10), T0).await;
        s.claim(&q, "i1", T0, LEASE, 1).await.expect("claim");
        assert!(s.sending(sending, "i1", T0).await.expect("sending"));
        assert_eq!(s.cancel("hr", sending, T0 + 1).await.expect("cancel"), Cancelled::TooLate(JobState::Sending));
        assert!(s.finish(sending, "i1", End::Sent(answer(200, 0, "{}")), T0 + 2).await.expect("finish"));
        assert_eq!(s.cancel("hr", sending, T0 + 3).await.expect("cancel"), Cancelled::TooLate(JobState::Sent));
    }

    pub async fn a_job_past_its_deadline_expires_wherever_it_is_in_its_queue(s: Arc<dyn JobStore>) {
        let (hr, mk) = (queue("hr", "wx1", "r"), queue("mk", "wx2", "r"));
        let with = |q: &wxgate::jobs::QueueKey, deadline: Option<i64>, callback: bool| {
            let mut job = new_job(q, 10);
            job.deadline_us = deadline;
            job.callback = callback.then(|| "https://hr.example/done".to_owned());
            job
        };
        // hr's head waits for tomorrow; behind it three jobs, two with deadlines.
        let head = submit(&s, with(&hr, None, false), T0).await;
        let soon = submit(&s, with(&hr, Some(T0 + 10 * SEC), true), T0).await;
        let later = submit(&s, with(&hr, Some(T0 + 20 * SEC), false), T0).await;
        let never = submit(&s, with(&hr, None, false), T0).await;
        let claimed = s.claim(&hr, "i1", T0, LEASE, 1).await.expect("claim");
        assert_eq!(ids(&claimed), vec![head]);
        assert!(s.finish(head, "i1", End::Retry { at: T0 + DAY, answer: None }, T0).await.expect("finish"));
        // mk's head is held by a dispatcher past its deadline: its holder's to end.
        let held = submit(&s, with(&mk, Some(T0 + 5 * SEC), false), T0).await;
        assert_eq!(ids(&s.claim(&mk, "i2", T0, LEASE, 1).await.expect("claim")), vec![held]);

        assert_eq!(s.expire(T0 + 9 * SEC, 100).await.expect("expire"), vec![], "nothing due yet");
        let ended = s.expire(T0 + 15 * SEC, 100).await.expect("expire");
        assert_eq!(ended.iter().map(|e| (e.id, e.submitted_us)).collect::<Vec<_>>(), vec![(soon, T0)]);
        assert_eq!(ended[0].queue, hr);
        assert_eq!(state(&s, "hr", soon).await, JobState::Expired);
        assert_eq!(state(&s, "mk", held).await, JobState::Claimed, "a held job is left to its holder");
        assert_eq!(state(&s, "hr", head).await, JobState::Waiting, "the head still waits");
        let cbs = s.callbacks_due(T0 + 15 * SEC, LEASE, 10, &CallerRoom::unlimited()).await.expect("callbacks");
        assert_eq!(cbs.iter().map(|c| c.job.id).collect::<Vec<_>>(), vec![soon], "its callback pending");
        let q = s.summary(Some("hr")).await.expect("summary");
        assert_eq!((q[0].waiting, q[0].queued, q[0].expired), (1, 2, 1), "{q:?}");

        // At most `max` per run (earliest first within an account; on
        // Redis, accounts by their earliest).
        let a = submit(&s, with(&mk, Some(T0 + 25 * SEC), false), T0).await;
        let mut two = ids_of(&s.expire(T0 + 30 * SEC, 1).await.expect("expire"));
        assert_eq!(two.len(), 1);
        two.extend(ids_of(&s.expire(T0 + 30 * SEC, 1).await.expect("expire")));
        two.sort();
        let mut both = vec![later, a];
        both.sort();
        assert_eq!(two, both);
        assert_eq!(s.expire(T0 + 30 * SEC, 100).await.expect("expire"), vec![]);
        assert_eq!(state(&s, "hr", never).await, JobState::Queued, "a job without a deadline never expires");
        // The held one, handed back unsent, expires on the next run.
        assert!(s.finish(held, "i2", End::NotYet { at: T0 + 30 * SEC }, T0 + 30 * SEC).await.expect("finish"));
        assert_eq!(ids_of(&s.expire(T0 + 31 * SEC, 100).await.expect("expire")), vec![held]);
        assert_eq!(unfinished(&s).await, 2, "the head and the job without a deadline");
    }

    fn ids_of(ended: &[wxgate::jobs::ExpiredJob]) -> Vec<JobId> {
        ended.iter().map(|e| e.id).collect()
    }

    pub async fn summary_counts_each_queue_by_state(s: Arc<dyn JobStore>) {
        let (hr, mkt) = (queue("hr", "wx1", "r"), queue("mkt", "wx1", "r"));
        let mut hr_ids = Vec::new();
        for i in 0..6 {
            hr_ids.push(submit(&s, new_job(&hr, 10), T0 + i).await);
        }
        for _ in 0..2 {
            submit(&s, new_job(&mkt, 10), T0 + 100).await;
        }
        // hr: sent, failed, waiting, sending, cancelled, queued.
        let claimed = s.claim(&hr, "i1", T0 + 10, LEASE, 4).await.expect("claim");
        assert_eq!(claimed.len(), 4);
        for id in &hr_ids[..4] {
            assert!(s.sending(*id, "i1", T0 + 10).await.expect("sending"));
        }
        assert!(s.finish(hr_ids[0], "i1", End::Sent(answer(200, 0, "{}")), T0 + 11).await.expect("finish"));
        assert!(s.finish(hr_ids[1], "i1", End::Failed(answer(200, 40003, "{}")), T0 + 11).await.expect("finish"));
        let retry = End::Retry { at: T0 + DAY, answer: None };
        assert!(s.finish(hr_ids[2], "i1", retry, T0 + 11).await.expect("finish"));
        assert_eq!(s.cancel("hr", hr_ids[5], T0 + 11).await.expect("cancel"), Cancelled::Cancelled);
        let all = s.summary(None).await.expect("summary");
        assert_eq!(all.len(), 2);
        let h = all.iter().find(|x| x.queue == hr).expect("hr's queue");
        assert_eq!(
            (h.queued, h.waiting, h.sending, h.sent, h.failed, h.expired, h.cancelled, h.unknown),
            (1, 1, 1, 1, 1, 0, 1, 0)
        );
        assert_eq!(h.oldest_us, Some(T0 + 2), "the oldest unfinished job's submission");
        let m = all.iter().find(|x| x.queue == mkt).expect("mkt's queue");
        assert_eq!((m.queued, m.oldest_us), (2, Some(T0 + 100)));
        let only = s.summary(Some("mkt")).await.expect("summary of one caller");
        assert_eq!(only.len(), 1);
        assert_eq!(only[0].queue, mkt);
        assert!(s.summary(Some("nobody")).await.expect("summary").is_empty());
        // One queue's counts (the 202's X-Wxgate-Eta reads them), the same.
        let one = s.queue_summary(&hr).await.expect("one queue").expect("hr's queue");
        assert_eq!((one.queued, one.waiting, one.sending, one.sent, one.oldest_us), (1, 1, 1, 1, Some(T0 + 2)));
        assert_eq!(s.queue_summary(&queue("hr", "wx2", "r")).await.expect("no such queue"), None);
        assert_eq!(s.queue_summary(&queue("hr", "wx1", "other")).await.expect("no such queue"), None);
    }

    pub async fn purge_deletes_only_jobs_ended_before_keep(s: Arc<dyn JobStore>) {
        let q = queue("hr", "wx1", "r");
        let old = submit(&s, new_job(&q, 10), T0).await;
        let recent = submit(&s, new_job(&q, 10), T0).await;
        let open = submit(&s, new_job(&q, 10), T0).await;
        assert_eq!(s.cancel("hr", old, T0).await.expect("cancel"), Cancelled::Cancelled);
        assert_eq!(s.cancel("hr", recent, T0 + DAY).await.expect("cancel"), Cancelled::Cancelled);
        let keep = 7 * DAY;
        assert_eq!(s.purge(T0 + keep, keep).await.expect("purge"), 0, "ended exactly keep ago: kept");
        assert_eq!(s.purge(T0 + keep + 1, keep).await.expect("purge"), 1);
        assert_eq!(s.get("hr", old).await.expect("get"), None);
        assert_eq!(state(&s, "hr", recent).await, JobState::Cancelled);
        assert_eq!(state(&s, "hr", open).await, JobState::Queued, "unfinished jobs are never purged");
        assert_eq!(s.purge(T0 + 100 * DAY, keep).await.expect("purge"), 1);
        assert_eq!(state(&s, "hr", open).await, JobState::Queued);
        assert_eq!(ids(&s.claim(&q, "i1", T0 + 100 * DAY, LEASE, 5).await.expect("claim")), vec![open]);
        // Idempotency keys past their time go too; a later one is new.
        let mut keyed = new_job(&q, 10);
        keyed.idempotency_key = Some("k".into());
        let first = s.submit(keyed.clone(), &roomy(DAY), T0).await.expect("submit");
        s.purge(T0 + DAY, keep).await.expect("purge");
        let again = s.submit(keyed, &roomy(DAY), T0 + DAY).await.expect("submit");
        assert!(!again.duplicate);
        assert_ne!(again.id, first.id);
    }
}

/// Issue 63 (7): what an ended job keeps, and how many a caller keeps.
mod kept_scenarios {
    use super::callbacks::{due, with_callback};
    use super::*;
    use wxgate::jobs::QueueKey;

    /// `ended_jobs` at `n`, nothing else reached.
    fn keeping(n: u64) -> Bounds {
        Bounds { ended_jobs: n, ..roomy(DAY) }
    }

    async fn keyed(s: &Arc<dyn JobStore>, q: &QueueKey, key: &str, bounds: &Bounds, now: i64) -> Submitted {
        let mut job = new_job(q, 300);
        job.idempotency_key = Some(key.into());
        s.submit(job, bounds, now).await.expect("submit")
    }

    async fn cancel(s: &Arc<dyn JobStore>, caller: &str, id: JobId, now: i64) {
        assert_eq!(s.cancel(caller, id, now).await.expect("cancel"), Cancelled::Cancelled);
    }

    async fn ended_count(s: &Arc<dyn JobStore>, caller: &str, account: &str) -> u64 {
        let all = s.summary(Some(caller)).await.expect("summary");
        let mine = all.iter().filter(|q| &*q.queue.account == account);
        mine.map(|q| q.sent + q.failed + q.expired + q.cancelled + q.unknown).sum()
    }

    /// Sent, failed, expired and unknown (by `finish`), cancelled, unknown
    /// by `recover`, expired by `expire`: the job is still there with its
    /// metadata and answer, its body gone. A job handed back (`Retry`)
    /// keeps its body.
    pub async fn every_way_a_job_ends_deletes_its_body_and_keeps_its_answer_and_metadata(s: Arc<dyn JobStore>) {
        let mut submitted = Vec::new();
        for rule in ["sent", "failed", "expired", "unknown", "cancelled", "recovered", "deadline", "retried"] {
            let q = queue("hr", "wx1", rule);
            let mut job = new_job(&q, 500);
            job.idempotency_key = Some(format!("key-{rule}"));
            job.callback = Some(format!("https://hr.example/{rule}"));
            job.traceparent = Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into());
            job.deadline_us = Some(if rule == "deadline" { T0 + SEC } else { T0 + DAY });
            submitted.push((rule, submit(&s, job.clone(), T0).await, job));
        }
        let ok = answer(200, 0, r#"{"errcode":0,"errmsg":"ok","msgid":7}"#);
        let refused = answer(200, 43004, r#"{"errcode":43004}"#);
        let mut answers = std::collections::HashMap::new();
        for (rule, id, job) in &submitted {
            let at = T0 + 10;
            let claim = |s: &Arc<dyn JobStore>| {
                let (s, q) = (s.clone(), job.queue.clone());
                async move { s.claim(&q, "i1", at, LEASE, 1).await.expect("claim").len() }
            };
            let answered = match *rule {
                "sent" | "failed" | "unknown" | "retried" => {
                    assert_eq!(claim(&s).await, 1);
                    assert!(s.sending(*id, "i1", at).await.expect("sending"));
                    let (end, a) = match *rule {
                        "sent" => (End::Sent(ok.clone()), Some(ok.clone())),
                        "failed" => (End::Failed(refused.clone()), Some(refused.clone())),
                        "unknown" => (End::Unknown(None), None),
                        _ => (End::Retry { at: T0 + DAY, answer: Some(ok.clone()) }, Some(ok.clone())),
                    };
                    assert!(s.finish(*id, "i1", end, at).await.expect("finish"));
                    a
                }
                "expired" => {
                    assert_eq!(claim(&s).await, 1);
                    assert!(s.finish(*id, "i1", End::Expired, at).await.expect("finish"));
                    None
                }
                "cancelled" => {
                    cancel(&s, "hr", *id, at).await;
                    None
                }
                "recovered" => {
                    assert_eq!(claim(&s).await, 1);
                    assert!(s.sending(*id, "i1", at).await.expect("sending"));
                    None
                }
                _ => None,
            };
            answers.insert(*id, answered);
        }
        assert_eq!(s.recover(T0 + 10 + LEASE).await.expect("recover").unknown, 1);
        assert_eq!(s.expire(T0 + 10 + LEASE, 10).await.expect("expire").len(), 1);
        for (rule, id, job) in &submitted {
            let got = s.get("hr", *id).await.expect("get").expect("an ended job is kept");
            let mut kept = job.clone();
            if *rule == "retried" {
                assert_eq!(got.state, JobState::Waiting);
                assert_eq!(got.new, kept, "{rule}: an unfinished job keeps its body");
            } else {
                assert!(got.state.ended(), "{rule}: {:?}", got.state);
                kept.body = bytes::Bytes::new();
                assert_eq!(got.new, kept, "{rule}: the body goes, the rest is kept");
            }
            assert_eq!(got.answer, answers[id], "{rule}: the answer is kept");
        }
    }

    /// `ended_jobs` 2: the third ended job of (hr, wx1) deletes the
    /// oldest (ended first; ties by id) of any of its rules, and that job's
    /// `Idempotency-Key` (a repeat is a new job); the caller's ended jobs in
    /// another account, and another caller's in this one, stay.
    pub async fn past_ended_jobs_a_callers_oldest_ended_jobs_in_the_account_go_with_their_keys(s: Arc<dyn JobStore>) {
        let b = keeping(2);
        let (q, q2) = (queue("hr", "wx1", "r"), queue("hr", "wx1", "r2"));
        let mut ids = Vec::new();
        for i in 0..4 {
            ids.push(keyed(&s, &q, &format!("k{i}"), &b, T0).await.id);
        }
        let other_account = keyed(&s, &queue("hr", "wx2", "r"), "k0", &b, T0).await.id;
        let other_caller = keyed(&s, &queue("mk", "wx1", "r"), "k0", &b, T0).await.id;
        cancel(&s, "hr", other_account, T0).await;
        cancel(&s, "mk", other_caller, T0).await;
        cancel(&s, "hr", ids[0], T0 + 1).await;
        cancel(&s, "hr", ids[1], T0 + 2).await;
        assert_eq!(ended_count(&s, "hr", "wx1").await, 2);
        cancel(&s, "hr", ids[2], T0 + 3).await;
        assert_eq!(s.get("hr", ids[0]).await.expect("get"), None, "the oldest ended job went");
        assert_eq!(ended_count(&s, "hr", "wx1").await, 2);
        for id in [ids[1], ids[2]] {
            assert_eq!(state(&s, "hr", id).await, JobState::Cancelled);
        }
        assert_eq!(state(&s, "hr", other_account).await, JobState::Cancelled, "another account's stay");
        assert_eq!(state(&s, "mk", other_caller).await, JobState::Cancelled, "another caller's stay");
        assert_eq!(state(&s, "hr", ids[3]).await, JobState::Queued, "unfinished jobs never go");
        // The key of the job that went names nothing; the others still do.
        let again = keyed(&s, &q, "k0", &b, T0 + 4).await;
        assert!(!again.duplicate, "k0's job went, and its key with it");
        assert_eq!(keyed(&s, &q, "k1", &b, T0 + 4).await, Submitted { id: ids[1], duplicate: true });
        // A job of another rule of the same caller and account counts too.
        let elsewhere = s.submit(new_job(&q2, 10), &b, T0).await.expect("submit").id;
        cancel(&s, "hr", elsewhere, T0 + 5).await;
        assert_eq!(s.get("hr", ids[1]).await.expect("get"), None, "the oldest of both rules went");
        assert_eq!(state(&s, "hr", ids[2]).await, JobState::Cancelled);
        // Jobs that end at the same time: the lower id goes first.
        let (a, z) = (submit(&s, new_job(&q, 10), T0).await, submit(&s, new_job(&q, 10), T0).await);
        let (low, high) = if a < z { (a, z) } else { (z, a) };
        let bound = keeping(1);
        keyed(&s, &q, "narrow", &bound, T0 + 6).await;
        cancel(&s, "hr", a, T0 + 7).await;
        cancel(&s, "hr", z, T0 + 7).await;
        assert_eq!(s.get("hr", low).await.expect("get"), None, "the lower id of a tie goes");
        assert_eq!(state(&s, "hr", high).await, JobState::Cancelled);
        assert_eq!(ended_count(&s, "hr", "wx1").await, 1, "back at the bound, two at most per end");
    }

    /// A caller that may hold one unfinished job submits and cancels 30
    /// times: never refused, and at most `ended_jobs` of them stay.
    pub async fn submit_and_cancel_is_never_refused_and_keeps_at_most_ended_jobs(s: Arc<dyn JobStore>) {
        let b = Bounds { caller_jobs: 1, ended_jobs: 3, ..roomy(DAY) };
        let q = queue("hr", "wx1", "r");
        for i in 0..30 {
            let done = keyed(&s, &q, &format!("k{i}"), &b, T0 + i).await;
            assert!(!done.duplicate);
            cancel(&s, "hr", done.id, T0 + i).await;
            assert!(ended_count(&s, "hr", "wx1").await <= 3);
        }
        assert_eq!(ended_count(&s, "hr", "wx1").await, 3);
    }

    /// A job whose callback is pending counts among the caller's ended
    /// jobs; the oldest past `ended_jobs` goes, its callback given up.
    pub async fn a_pending_callback_past_ended_jobs_is_given_up_with_its_job(s: Arc<dyn JobStore>) {
        let b = keeping(1);
        let q = queue("hr", "wx1", "r");
        let first = s.submit(with_callback(&q, 1), &b, T0).await.expect("submit").id;
        let second = s.submit(new_job(&q, 10), &b, T0).await.expect("submit").id;
        cancel(&s, "hr", first, T0 + 1).await;
        assert_eq!(due(&s, T0 + 1, 10).await.len(), 1, "its callback is pending");
        cancel(&s, "hr", second, T0 + 2).await;
        assert_eq!(s.get("hr", first).await.expect("get"), None);
        assert!(due(&s, T0 + 3, 10).await.is_empty(), "given up with its job");
    }

    /// `keep` 7 days, `idempotency` 10: an ended job its key still names is
    /// kept until the key's time (a repeat finds it, never a new one), then
    /// purged.
    pub async fn purge_keeps_an_ended_job_while_its_idempotency_key_counts(s: Arc<dyn JobStore>) {
        let (keep, b) = (7 * DAY, roomy(10 * DAY));
        let q = queue("hr", "wx1", "r");
        let first = keyed(&s, &q, "k", &b, T0).await.id;
        let plain = submit(&s, new_job(&q, 10), T0).await;
        cancel(&s, "hr", first, T0).await;
        cancel(&s, "hr", plain, T0).await;
        assert_eq!(s.purge(T0 + keep + 1, keep).await.expect("purge"), 1, "the job without a key");
        assert_eq!(state(&s, "hr", first).await, JobState::Cancelled, "kept while its key counts");
        assert_eq!(keyed(&s, &q, "k", &b, T0 + 10 * DAY - 1).await, Submitted { id: first, duplicate: true });
        assert_eq!(s.purge(T0 + 10 * DAY - 1, keep).await.expect("purge"), 0);
        assert_eq!(s.purge(T0 + 10 * DAY, keep).await.expect("purge"), 1, "its key's time is over");
        assert_eq!(s.get("hr", first).await.expect("get"), None);
        assert!(!keyed(&s, &q, "k", &b, T0 + 10 * DAY).await.duplicate);
    }
}

mod callbacks {
    use super::*;
    use wxgate::jobs::DueCallback;

    pub fn with_callback(q: &wxgate::jobs::QueueKey, n: u32) -> NewJob {
        let mut job = new_job(q, 10);
        job.callback = Some(format!("https://hr.example/hooks/{n}"));
        job
    }

    pub async fn due(s: &Arc<dyn JobStore>, now: i64, max: usize) -> Vec<DueCallback> {
        s.callbacks_due(now, LEASE, max, &CallerRoom::unlimited()).await.expect("callbacks_due")
    }

    pub fn due_ids(due: &[DueCallback]) -> Vec<(JobId, u32)> {
        due.iter().map(|d| (d.job.id, d.tries)).collect()
    }
}

mod callback_scenarios {
    use super::callbacks::{due, due_ids, with_callback};
    use super::*;

    pub async fn an_ended_jobs_callback_is_pending_until_done_and_its_job_kept_until_then(s: Arc<dyn JobStore>) {
        let q = queue("hr", "wx1", "r");
        let a = submit(&s, with_callback(&q, 1), T0).await;
        let b = submit(&s, new_job(&q, 10), T0).await;
        assert!(due(&s, T0 + DAY, 10).await.is_empty(), "nothing pending before a job ends");
        assert_eq!(ids(&s.claim(&q, "i1", T0, LEASE, 2).await.expect("claim")), vec![a, b]);
        assert!(s.sending(a, "i1", T0).await.expect("sending"));
        assert!(s.finish(a, "i1", End::Sent(answer(200, 0, r#"{"msgid":7}"#)), T0 + 1).await.expect("finish"));
        assert!(s.finish(b, "i1", End::Sent(answer(200, 0, "{}")), T0 + 1).await.expect("finish"));
        assert!(due(&s, T0, 10).await.is_empty(), "due when the job ended, not before");
        let first = due(&s, T0 + 1, 10).await;
        assert_eq!(due_ids(&first), vec![(a, 1)], "only the job with a callback");
        let job = &first[0].job;
        assert_eq!((job.state, job.attempts, job.updated_us), (JobState::Sent, 1, T0 + 1));
        assert_eq!(job.answer, Some(answer(200, 0, r#"{"msgid":7}"#)));
        assert_eq!(job.new.callback.as_deref(), Some("https://hr.example/hooks/1"));
        assert!(job.new.body.is_empty(), "the job's body is never handed out with its callback");
        assert!(due(&s, T0 + LEASE, 10).await.is_empty(), "handed out: leased, not to another instance");
        // The lease ran out before the post was recorded (an instance died):
        // handed out again (at least once).
        assert_eq!(due_ids(&due(&s, T0 + 1 + LEASE, 10).await), vec![(a, 2)]);
        assert!(!s.callback_done(a, 1, None, T0 + 2 + LEASE).await.expect("done"), "a stale post changes nothing");
        let later = T0 + 10 * LEASE;
        assert!(s.callback_done(a, 2, Some(later), T0 + 2 + LEASE).await.expect("retry later"));
        assert!(due(&s, later - 1, 10).await.is_empty());
        assert_eq!(due_ids(&due(&s, later, 10).await), vec![(a, 3)]);
        // Purge keeps a job whose callback is pending, and deletes it once done.
        assert_eq!(s.purge(T0 + 100 * DAY, DAY).await.expect("purge"), 1, "b only");
        assert_eq!(state(&s, "hr", a).await, JobState::Sent);
        assert!(s.callback_done(a, 3, None, later).await.expect("delivered"));
        assert!(!s.callback_done(a, 3, None, later).await.expect("again"), "no longer pending");
        assert!(due(&s, T0 + 100 * DAY, 10).await.is_empty(), "done: never handed out again");
        assert_eq!(s.purge(T0 + 100 * DAY, DAY).await.expect("purge"), 1, "a, once its callback is done");
        assert_eq!(s.get("hr", a).await.expect("get"), None);
    }

    pub async fn every_way_a_job_ends_makes_its_callback_pending_and_only_then(s: Arc<dyn JobStore>) {
        let mut ended = Vec::new();
        // One queue per job, so each is its queue's head.
        let q = |n: u32| queue("hr", "wx1", &format!("r{n}"));
        let ends = [
            End::Failed(answer(200, 40003, "{}")),
            End::Expired,
            End::Unknown(None),
            End::Retry { at: T0 + DAY, answer: Some(answer(200, -1, "{}")) },
            End::NotYet { at: T0 + DAY },
        ];
        for (n, end) in ends.into_iter().enumerate() {
            let n = n as u32;
            let id = submit(&s, with_callback(&q(n), n), T0).await;
            assert_eq!(ids(&s.claim(&q(n), "i1", T0, LEASE, 1).await.expect("claim")), vec![id]);
            let may_send = matches!(end, End::Unknown(_) | End::Failed(_) | End::Retry { .. });
            if may_send {
                assert!(s.sending(id, "i1", T0).await.expect("sending"));
            }
            let ends_it = !matches!(end, End::Retry { .. } | End::NotYet { .. });
            assert!(s.finish(id, "i1", end, T0 + 1).await.expect("finish"));
            if ends_it {
                ended.push(id);
            }
        }
        let cancelled = submit(&s, with_callback(&q(10), 10), T0).await;
        assert_eq!(s.cancel("hr", cancelled, T0 + 1).await.expect("cancel"), Cancelled::Cancelled);
        ended.push(cancelled);
        let lost = submit(&s, with_callback(&q(11), 11), T0).await;
        s.claim(&q(11), "i2", T0, LEASE, 1).await.expect("claim");
        assert!(s.sending(lost, "i2", T0).await.expect("sending"));
        assert_eq!(s.recover(T0 + LEASE).await.expect("recover"), Recovered { requeued: 0, unknown: 1 });
        ended.push(lost);
        let mut got: Vec<(JobId, JobState)> =
            due(&s, T0 + LEASE, 100).await.into_iter().map(|d| (d.job.id, d.job.state)).collect();
        got.sort_by_key(|(id, _)| *id);
        let mut want = Vec::new();
        for id in ended {
            want.push((id, state(&s, "hr", id).await));
        }
        want.sort_by_key(|(id, _)| *id);
        assert_eq!(got, want, "each ended job once, a job retried or handed back not at all");
        let states: Vec<JobState> = want.iter().map(|(_, st)| *st).collect();
        for st in [JobState::Failed, JobState::Expired, JobState::Unknown, JobState::Cancelled] {
            assert!(states.contains(&st), "{st:?} among {states:?}");
        }
    }

    pub async fn callbacks_due_hands_out_at_most_max_across_accounts(s: Arc<dyn JobStore>) {
        let mut all = Vec::new();
        for (n, account) in ["wx1", "wx2", "wx3"].into_iter().enumerate() {
            let q = queue("hr", account, "r");
            for k in 0..2 {
                let id = submit(&s, with_callback(&q, k), T0).await;
                assert_eq!(s.cancel("hr", id, T0 + n as i64).await.expect("cancel"), Cancelled::Cancelled);
                all.push(id);
            }
        }
        assert!(s.callbacks_due(T0, LEASE, 0, &CallerRoom::unlimited()).await.expect("none asked").is_empty());
        let first = due(&s, T0 + 10, 4).await;
        assert_eq!(first.len(), 4, "at most max");
        let rest = due(&s, T0 + 10, 4).await;
        assert_eq!(rest.len(), 2, "the others, each once");
        let mut got: Vec<JobId> = first.iter().chain(&rest).map(|d| d.job.id).collect();
        got.sort();
        all.sort();
        assert_eq!(got, all);
        assert_eq!(first[0].job.new.queue.account.as_ref(), "wx1", "the oldest first");
    }

    /// Issue 63 item 9: a caller's older callbacks never hide another's
    /// from a hand-out that leaves it no room (its receiver holds its
    /// posts), on one account and across accounts; each caller gets at most
    /// its room, oldest first.
    pub async fn callbacks_due_passes_over_a_caller_without_room(s: Arc<dyn JobStore>) {
        let mut hr = Vec::new();
        for (n, account) in ["wx1", "wx2"].into_iter().enumerate() {
            let q = queue("hr", account, "r");
            for k in 0..300 {
                let id = submit(&s, with_callback(&q, k), T0).await;
                let ended = T0 + (300 * n + k as usize) as i64;
                assert_eq!(s.cancel("hr", id, ended).await.expect("cancel"), Cancelled::Cancelled);
                hr.push(id);
            }
        }
        let mut ops = Vec::new();
        for account in ["wx1", "wx2"] {
            let id = submit(&s, with_callback(&queue("ops", account, "r"), 0), T0).await;
            assert_eq!(s.cancel("ops", id, T0 + 1_000).await.expect("cancel"), Cancelled::Cancelled);
            ops.push(id);
        }
        let full = CallerRoom { each: 8, callers: vec![("hr".into(), 0)] };
        let got = s.callbacks_due(T0 + 2_000, LEASE, 4, &full).await.expect("callbacks_due");
        assert_eq!(ids_of(&got), ops, "hr has no room: only ops's, past hr's 600 older ones");
        let some = CallerRoom { each: 8, callers: vec![("hr".into(), 3)] };
        let got = s.callbacks_due(T0 + 2_000, LEASE, 32, &some).await.expect("callbacks_due");
        assert_eq!(ids_of(&got), hr[..3].to_vec(), "at most hr's room, its oldest");
        let each = CallerRoom { each: 2, callers: Vec::new() };
        let got = s.callbacks_due(T0 + 2_000, LEASE, 32, &each).await.expect("callbacks_due");
        assert_eq!(ids_of(&got), hr[3..5].to_vec(), "at most `each` of a caller not listed");
    }

    fn ids_of(due: &[wxgate::jobs::DueCallback]) -> Vec<JobId> {
        due.iter().map(|d| d.job.id).collect()
    }
}

// ---- The embedded store (SQLite) over a real file ----

async fn open(dir: &TempDir) -> SqliteJobs {
    SqliteJobs::open(&dir.join("jobs.db")).expect("open the jobs file")
}

#[tokio::test]
async fn a_restart_keeps_every_job_as_it_was() {
    let dir = TempDir::new("jobs-restart");
    let q = queue("hr", "wx1", "r");
    let s: Arc<dyn JobStore> = Arc::new(open(&dir).await);
    let mut keyed = new_job(&q, 500);
    keyed.idempotency_key = Some("k1".into());
    let a = s.submit(keyed.clone(), &roomy(DAY), T0).await.expect("submit").id;
    let b = submit(&s, new_job(&q, 500), T0).await;
    let c = submit(&s, new_job(&q, 500), T0).await;
    s.claim(&q, "i1", T0, LEASE, 2).await.expect("claim");
    assert!(s.sending(a, "i1", T0).await.expect("sending"));
    let mut jobs = Vec::new();
    for id in [a, b, c] {
        jobs.push(s.get("hr", id).await.expect("get").expect("job"));
    }
    drop(s);
    let s: Arc<dyn JobStore> = Arc::new(open(&dir).await);
    for job in &jobs {
        assert_eq!(s.get("hr", job.id).await.expect("get").as_ref(), Some(job), "kept whole across a restart");
    }
    let again = s.submit(keyed, &roomy(DAY), T0 + 1).await.expect("repeat");
    assert_eq!(again, Submitted { id: a, duplicate: true }, "idempotency keys kept");
    assert_eq!(s.recover(T0 + LEASE).await.expect("recover"), Recovered { requeued: 1, unknown: 1 });
    let next = submit(&s, new_job(&q, 1), T0 + 2).await;
    let order = s.claim(&q, "i2", T0 + LEASE, LEASE, 5).await.expect("claim");
    assert_eq!(ids(&order), vec![b, c, next], "seq goes on after the restart");
}

#[cfg(unix)]
#[tokio::test]
async fn the_jobs_file_is_readable_by_its_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new("jobs-mode");
    let s: Arc<dyn JobStore> = Arc::new(open(&dir).await);
    submit(&s, new_job(&queue("hr", "wx1", "r"), 500), T0).await;
    for file in ["jobs.db", "jobs.db-wal", "jobs.db-shm"] {
        let mode = std::fs::metadata(dir.join(file)).expect("the file").permissions().mode();
        assert_eq!(mode & 0o077, 0, "{file} holds message bodies: its owner's only ({mode:o})");
    }
}

#[tokio::test]
async fn a_file_of_a_newer_wxgate_or_another_program_is_refused_clearly() {
    let dir = TempDir::new("jobs-version");
    drop(open(&dir).await);
    let path = dir.join("jobs.db");
    {
        let conn = rusqlite::Connection::open(&path).expect("open");
        conn.pragma_update(None, "user_version", 99).expect("set version");
    }
    let err = SqliteJobs::open(&path).err().expect("a newer file is refused").to_string();
    assert!(err.contains("newer wxgate") && err.contains("99"), "{err}");
    let other = dir.join("other.db");
    {
        let conn = rusqlite::Connection::open(&other).expect("open");
        conn.execute_batch("CREATE TABLE notes (x TEXT)").expect("create");
    }
    let err = SqliteJobs::open(&other).err().expect("another program's file is refused").to_string();
    assert!(err.contains("not a wxgate jobs file"), "{err}");
    let garbage = dir.write("garbage.db", &"not sqlite at all\n".repeat(400));
    let err = SqliteJobs::open(&garbage).err().expect("not SQLite is refused").to_string();
    assert!(err.contains("garbage.db"), "{err}");
}

/// A jobs file of schema version 1 (written before the index of queue
/// heads, with jobs in every state) opens, is migrated in place, and its
/// due queues are listed and claimed as a new file's would be.
#[tokio::test]
async fn a_jobs_file_of_version_1_is_migrated_and_its_due_queues_listed() {
    let dir = TempDir::new("jobs-v1");
    let path = dir.join("jobs.db");
    {
        let conn = rusqlite::Connection::open(&path).expect("create");
        conn.execute_batch(wxgate::jobs::sqlite::SCHEMA).expect("the version 1 schema");
        conn.pragma_update(None, "application_id", 0x7778_676a).expect("application id");
        conn.pragma_update(None, "user_version", 1).expect("version 1");
        let queues = [(1, "hr", "wx1"), (2, "mk", "wx1"), (3, "mk", "wx2"), (4, "mk", "wx3"), (5, "ops", "wx1")];
        for (qid, caller, account) in queues {
            conn.execute("INSERT INTO queues VALUES (?1, ?2, ?3, 'r')", rusqlite::params![qid, caller, account])
                .expect("a queue");
        }
        // (qid, state, due): hr's head waits until T0 + 100; mk wx1's ended
        // job is followed by a queued one; mk wx2's head is claimed; mk
        // wx3's queued head is due at T0 + 1; ops has only an ended job.
        let jobs = [(1, 1, T0 + 100), (2, 4, T0), (2, 0, T0 + 2), (3, 2, T0), (3, 0, T0), (4, 0, T0 + 1), (5, 4, T0)];
        for (n, (qid, state, due)) in jobs.into_iter().enumerate() {
            conn.execute(
                "INSERT INTO jobs (id, qid, state, domain, method, target, body, submitted_us, due_us, lease_us, \
                 attempts, updated_us) VALUES (?1, ?2, ?3, 'api.weixin.qq.com', 'POST', '/', x'00', ?4, ?5, 0, 0, ?4)",
                rusqlite::params![&[n as u8; 16][..], qid, state, T0, due],
            )
            .expect("a job");
        }
    }
    let s: Arc<dyn JobStore> = Arc::new(open(&dir).await);
    let version: i64 = rusqlite::Connection::open(&path)
        .and_then(|c| c.pragma_query_value(None, "user_version", |r| r.get(0)))
        .expect("the version");
    assert_eq!(version, wxgate::jobs::sqlite::VERSION);
    let counts: Vec<(String, u64, u64, u64, u64)> = s
        .summary(None)
        .await
        .expect("summary")
        .iter()
        .map(|q| {
            (
                format!("{}/{}", q.queue.caller, q.queue.account),
                q.queued,
                q.waiting,
                q.sent,
                q.oldest_us.map_or(0, |_| 1),
            )
        })
        .collect();
    assert_eq!(
        counts,
        vec![
            ("hr/wx1".to_owned(), 0, 1, 0, 1),
            ("mk/wx1".to_owned(), 1, 0, 1, 1),
            ("mk/wx2".to_owned(), 2, 0, 0, 1),
            ("mk/wx3".to_owned(), 1, 0, 0, 1),
            ("ops/wx1".to_owned(), 0, 0, 1, 0),
        ],
        "the counts of the jobs the file had"
    );
    let (mk1, mk3, hr) = (queue("mk", "wx1", "r"), queue("mk", "wx3", "r"), queue("hr", "wx1", "r"));
    assert_eq!(s.due_queues(T0 + 99, 5).await.expect("due"), vec![mk3.clone(), mk1.clone()]);
    assert_eq!(s.due_queues(T0 + 100, 5).await.expect("due"), vec![mk3.clone(), mk1.clone(), hr.clone()]);
    assert_eq!(ids(&s.claim(&mk3, "i1", T0 + 100, LEASE, 5).await.expect("claim")), vec![JobId([5; 16])]);
    assert_eq!(s.due_queues(T0 + 100, 5).await.expect("due"), vec![mk1, hr], "claimed: out of the list");
    drop(s);
    let again: Arc<dyn JobStore> = Arc::new(open(&dir).await);
    assert_eq!(again.due_queues(T0 + 100, 1).await.expect("due").len(), 2, "reopened: nothing to migrate");
}

const CHILD_ENV: &str = "WXGATE_TEST_JOBS_CHILD";
const KILLED_JOBS: usize = 20;

/// The child's side of [`a_submission_that_returned_survives_sigkill`]:
/// submits jobs one by one, printing each id once `submit` returned, then
/// waits to be killed. Does nothing when run on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_submits_then_waits_to_be_killed() {
    let Ok(path) = std::env::var(CHILD_ENV) else { return };
    let s = SqliteJobs::open(std::path::Path::new(&path)).expect("open");
    let q = queue("hr", "wx1", "r");
    for i in 0..KILLED_JOBS {
        let id = s.submit(new_job(&q, 500), &roomy(DAY), T0 + i as i64).await.expect("submit").id;
        println!("submitted {id}");
    }
    // Keep submitting (unanswered ones may be lost) until killed.
    let deadline = Instant::now() + CHILD_LIFE;
    while Instant::now() < deadline {
        let _ = s.submit(new_job(&q, 500), &roomy(DAY), T0).await;
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[tokio::test]
async fn a_submission_that_returned_survives_sigkill() {
    let dir = TempDir::new("jobs-kill");
    let path = dir.join("jobs.db");
    let path_text = path.to_str().expect("utf-8 path");
    let mut child =
        SelfChild::spawn("jobs_conformance::child_submits_then_waits_to_be_killed", &[(CHILD_ENV, path_text)]);
    let mut answered = Vec::new();
    for _ in 0..KILLED_JOBS {
        answered.push(JobId::parse(&child.next("submitted ")).expect("an id"));
    }
    child.kill();
    let s = SqliteJobs::open(&path).expect("reopen after SIGKILL");
    for id in answered {
        let job = s.get("hr", id).await.expect("get").expect("every answered submission is kept");
        assert_eq!((job.state, job.new.body.len()), (JobState::Queued, 500));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_submissions_share_one_commit_and_are_all_durable() {
    const N: usize = 64;
    let dir = TempDir::new("jobs-group");
    let s = Arc::new(open(&dir).await);
    let hold = s.hold_writer().await.expect("hold the writer");
    let before = s.commits();
    let mut tasks = Vec::new();
    for i in 0..N {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let q = queue(&format!("c{}", i % 4), "wx1", "r");
            s.submit(new_job(&q, 500), &roomy(DAY), T0).await
        }));
    }
    support::eventually("all submissions wait for the writer", support::PATIENCE, || s.pending() == N).await;
    drop(hold);
    let mut ids = Vec::new();
    for t in tasks {
        ids.push(t.await.expect("task").expect("submit").id);
    }
    // The hold's own (empty) transaction, then one for all N.
    assert_eq!(s.commits() - before, 2, "{N} concurrent submissions: one commit");
    drop(s);
    let s = open(&dir).await;
    for (i, id) in ids.iter().enumerate() {
        assert!(s.get(&format!("c{}", i % 4), *id).await.expect("get").is_some(), "kept after reopen");
    }
}

/// Submissions per second and bytes on disk per job (500-byte bodies):
/// `cargo test --release --test all jobs_conformance:: -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn bench_submissions_per_second_and_bytes_per_job() {
    for tasks in [1usize, 16] {
        let dir = TempDir::new("jobs-bench");
        let s = Arc::new(open(&dir).await);
        let per_task = if tasks == 1 { 500 } else { 250 };
        let (start, commits) = (Instant::now(), s.commits());
        let mut handles = Vec::new();
        for t in 0..tasks {
            let s = s.clone();
            handles.push(tokio::spawn(async move {
                let q = queue(&format!("c{t}"), "wx1", "template_send");
                for i in 0..per_task {
                    s.submit(new_job(&q, 500), &roomy(DAY), T0 + i as i64).await.expect("submit");
                }
            }));
        }
        for h in handles {
            h.await.expect("task");
        }
        let took = start.elapsed();
        let n = tasks * per_task;
        println!(
            "{tasks} task(s): {n} submissions in {took:?}: {:.0}/s, {} commits ({:.1} per commit)",
            n as f64 / took.as_secs_f64(),
            s.commits() - commits,
            n as f64 / (s.commits() - commits) as f64
        );
        drop(s);
        let conn = rusqlite::Connection::open(dir.join("jobs.db")).expect("open");
        conn.pragma_update(None, "wal_checkpoint", "TRUNCATE").expect("checkpoint");
        drop(conn);
        let bytes = std::fs::metadata(dir.join("jobs.db")).expect("size").len();
        println!("  {} bytes on disk: {:.0} per queued job", bytes, bytes as f64 / n as f64);
    }
    // Many jobs, for the bytes per job without the file's fixed part.
    let dir = TempDir::new("jobs-bench-size");
    let s = Arc::new(open(&dir).await);
    let mut handles = Vec::new();
    for t in 0..16 {
        let s = s.clone();
        handles.push(tokio::spawn(async move {
            let q = queue(&format!("c{t}"), "wx1", "template_send");
            for i in 0..1250 {
                s.submit(new_job(&q, 500), &roomy(DAY), T0 + i).await.expect("submit");
            }
        }));
    }
    for h in handles {
        h.await.expect("task");
    }
    drop(s);
    let conn = rusqlite::Connection::open(dir.join("jobs.db")).expect("open");
    conn.pragma_update(None, "wal_checkpoint", "TRUNCATE").expect("checkpoint");
    drop(conn);
    let bytes = std::fs::metadata(dir.join("jobs.db")).expect("size").len();
    println!("20000 jobs of 500 bytes: {bytes} bytes on disk, {:.0} per job", bytes as f64 / 20_000.0);
    let start = Instant::now();
    let s = open(&dir).await;
    let opened = start.elapsed();
    let start = Instant::now();
    let due = s.due_queues(T0 + DAY, 100).await.expect("due");
    let listed = start.elapsed();
    let start = Instant::now();
    let summary = s.summary(None).await.expect("summary");
    println!(
        "  reopen {opened:?}; due_queues ({} queues) {listed:?}; summary ({} queues) {:?}",
        due.len(),
        summary.len(),
        start.elapsed()
    );
}

/// What one `due_queues` call costs with many queues, on every store:
/// 10 callers × 1,000 queues each (500 accounts × 2 rules), one job each,
/// every head due. Prints numbers; asserts only the answer's shape.
/// `cargo test --release --test all jobs_conformance::bench_due -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn bench_due_queues_with_many_callers_and_queues() {
    const CALLERS: usize = 10;
    const ACCOUNTS: usize = 500;
    for (name, s, guard) in stores().await {
        let start = Instant::now();
        let mut handles = Vec::new();
        for c in 0..CALLERS {
            let s = s.clone();
            handles.push(tokio::spawn(async move {
                for a in 0..ACCOUNTS {
                    for rule in ["template_send", "custom_send"] {
                        let q = queue(&format!("c{c}"), &format!("wx{a}"), rule);
                        s.submit(new_job(&q, 100), &roomy(DAY), T0 + a as i64).await.expect("submit");
                    }
                }
            }));
        }
        for h in handles {
            h.await.expect("task");
        }
        println!("{name}: {} queues submitted in {:?}", CALLERS * ACCOUNTS * 2, start.elapsed());
        for per_caller in [1, 16, 256] {
            let mut took = Vec::new();
            for _ in 0..5 {
                let start = Instant::now();
                let due = s.due_queues(T0 + DAY, per_caller).await.expect("due");
                took.push(start.elapsed());
                assert_eq!(due.len(), CALLERS * per_caller);
            }
            took.sort();
            println!("  due_queues({per_caller} per caller): median {:?} (min {:?})", took[2], took[0]);
        }
        drop(guard);
    }
}

/// `due_queues` and `claim` on the embedded store when a queue keeps many
/// ended jobs (a campaign's sent jobs, kept until `purge`): 100,000 ended
/// jobs written straight into the file ahead of one queued job. Prints
/// numbers; asserts only the answers.
/// `cargo test --release --test all jobs_conformance::bench_ended -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn bench_ended_jobs_kept_do_not_slow_due_queues_or_claim() {
    let dir = TempDir::new("jobs-bench-ended");
    let q = queue("mk", "wx1", "template_send");
    let s = open(&dir).await;
    let first = submit_to(&s, &q).await;
    let claimed = s.claim(&q, "i1", T0, LEASE, 1).await.expect("claim");
    assert_eq!(ids(&claimed), vec![first]);
    assert!(s.finish(first, "i1", End::Sent(answer(200, 0, "{}")), T0).await.expect("finish"));
    {
        let mut conn = rusqlite::Connection::open(dir.join("jobs.db")).expect("open");
        let tx = conn.transaction().expect("transaction");
        let qid: i64 = tx.query_row("SELECT qid FROM queues", [], |r| r.get(0)).expect("the queue");
        for i in 0u64..100_000 {
            let mut id = [0u8; 16];
            id[..8].copy_from_slice(&i.to_be_bytes());
            id[8] = 1;
            tx.execute(
                "INSERT INTO jobs (id, qid, state, domain, method, target, body, submitted_us, due_us, lease_us, \
                 attempts, updated_us) VALUES (?1, ?2, 4, 'api.weixin.qq.com', 'POST', '/', x'00', ?3, ?3, 0, 1, ?3)",
                rusqlite::params![&id[..], qid, T0],
            )
            .expect("an ended job");
        }
        tx.commit().expect("commit");
    }
    let queued = submit_to(&s, &q).await;
    let start = Instant::now();
    for _ in 0..10 {
        assert_eq!(s.due_queues(T0 + SEC, 16).await.expect("due"), vec![q.clone()]);
    }
    println!("due_queues beside 100,000 ended jobs: {:?} per call", start.elapsed() / 10);
    let start = Instant::now();
    let got = s.claim(&q, "i1", T0 + SEC, LEASE, 8).await.expect("claim");
    println!("claim beside 100,000 ended jobs: {:?}", start.elapsed());
    assert_eq!(ids(&got), vec![queued]);
}

async fn submit_to(s: &SqliteJobs, q: &wxgate::jobs::QueueKey) -> JobId {
    s.submit(new_job(q, 100), &roomy(DAY), T0).await.expect("submit").id
}
