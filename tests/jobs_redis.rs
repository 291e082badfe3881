//! Queued delivery's jobs in Redis (src/jobs/redis.rs, lua/jobs_*.lua)
//! against a real redis-server and a real Redis Cluster: every operation of
//! `JobStore` as its docs say, on an injected clock (times are passed in),
//! plus what is Redis's own: two instances claiming one queue, one Cluster
//! slot per account, nothing left behind after purge.

use crate::support;

use std::collections::HashSet;
use std::sync::Arc;

use bytes::Bytes;
use support::redis_server::{RedisCluster, RedisServer};
use wxgate::config::RedisConfig;
use wxgate::jobs::redis::RedisJobs;
use wxgate::jobs::{
    Answer, Bound, Bounds, Cancelled, End, JobId, JobState, JobStore, NewJob, QueueKey, Recovered, SubmitError,
};

const T0: i64 = 1_800_000_000_000_000;
const SEC: i64 = 1_000_000;

fn queue(caller: &str, account: &str, rule: &str) -> QueueKey {
    QueueKey { caller: caller.into(), account: account.into(), rule: rule.into() }
}

fn job(caller: &str, account: &str, body: &str) -> NewJob {
    NewJob {
        queue: queue(caller, account, "tpl"),
        domain: "api.weixin.qq.com".into(),
        method: "POST".into(),
        target: "/cgi-bin/message/template/send".into(),
        content_type: Some("application/json".into()),
        body: Bytes::from(body.to_owned()),
        deadline_us: None,
        idempotency_key: None,
        callback: None,
        traceparent: None,
        lanes: wxgate::jobs::Lanes::default(),
    }
}

fn roomy() -> Bounds {
    Bounds {
        caller_jobs: 1_000_000,
        caller_bytes: 1 << 40,
        account_jobs: 1_000_000,
        account_bytes: 1 << 40,
        ended_jobs: 1_000_000,
        idempotency_us: 3600 * SEC,
    }
}

fn answer(errcode: i64) -> Answer {
    Answer { status: 200, errcode: Some(errcode), body: Bytes::from(format!("{{\"errcode\":{errcode}}}")) }
}

async fn store(cfg: &RedisConfig) -> RedisJobs {
    RedisJobs::connect(cfg).await.expect("connect the jobs store")
}

async fn submit(s: &RedisJobs, j: NewJob, now: i64) -> JobId {
    let done = s.submit(j, &roomy(), now).await.expect("submit");
    assert!(!done.duplicate);
    done.id
}

/// Every key on `server` and what it holds (`DUMP`), in key order.
fn snapshot(server: &RedisServer) -> Vec<(String, redis::Value)> {
    let mut keys = keys_with(server, "");
    keys.sort();
    keys.into_iter().map(|k| (k.clone(), server.run_as(None, &["DUMP", &k]))).collect()
}

/// Every key on `server` (one node) whose name contains `part`.
fn keys_with(server: &RedisServer, part: &str) -> Vec<String> {
    let v = server.run_as(None, &["KEYS", &format!("*{part}*")]);
    redis::from_redis_value::<Vec<String>>(v).expect("KEYS")
}

#[tokio::test]
async fn a_submitted_job_is_queued_in_full_and_visible_only_to_its_caller() {
    let redis = RedisServer::start();
    let s = store(&redis.store_config("jr")).await;
    let mut new = job("hr", "wxA", "{\"touser\":\"o1\"}");
    new.deadline_us = Some(T0 + 60 * SEC);
    new.callback = Some("https://hr.example/cb".into());
    let id = submit(&s, new.clone(), T0).await;
    let got = s.get("hr", id).await.unwrap().expect("the caller sees its job");
    assert_eq!(got.id, id);
    assert_eq!(got.new, new, "every submitted field comes back as given");
    assert_eq!(got.state, JobState::Queued);
    assert_eq!((got.submitted_us, got.due_us, got.updated_us, got.attempts), (T0, T0, T0, 0));
    assert_eq!((got.owner.as_deref(), got.answer.as_ref()), (None, None));
    assert_eq!(s.get("marketing", id).await.unwrap(), None, "another caller's id is not found");
    let unknown = JobId::parse("0000000900112233445566778899aabb").unwrap();
    assert_eq!(s.get("hr", unknown).await.unwrap(), None);
    assert_eq!(s.get("hr", JobId([0xff; 16])).await.unwrap(), None);
    let mut other = id.0;
    other[15] ^= 1;
    assert_eq!(s.get("hr", JobId(other)).await.unwrap(), None, "an id of a known account but no job");
}

#[tokio::test]
async fn an_idempotency_key_returns_the_first_job_until_it_expires() {
    let redis = RedisServer::start();
    let s = store(&redis.store_config("jr")).await;
    let mut new = job("hr", "wxA", "one");
    new.idempotency_key = Some("batch-7".into());
    let first = submit(&s, new.clone(), T0).await;
    let again = s.submit(new.clone(), &roomy(), T0 + 3599 * SEC).await.unwrap();
    assert_eq!((again.id, again.duplicate), (first, true));
    let mut other_caller = new.clone();
    other_caller.queue.caller = "ops".into();
    let theirs = s.submit(other_caller, &roomy(), T0 + SEC).await.unwrap();
    assert!(!theirs.duplicate, "a key is the caller's own");
    let summary = s.summary(Some("hr")).await.unwrap();
    assert_eq!(summary[0].queued, 1, "the repeat stored nothing");
    let later = s.submit(new, &roomy(), T0 + 3600 * SEC).await.unwrap();
    assert!(!later.duplicate, "after idempotency_us the key names no job");
    assert_ne!(later.id, first);
}

#[tokio::test]
async fn a_submission_past_a_bound_is_refused_whole_with_nothing_stored() {
    let redis = RedisServer::start();
    let s = store(&redis.store_config("jr")).await;
    let tight = Bounds {
        caller_jobs: 2,
        caller_bytes: 10,
        account_jobs: 3,
        account_bytes: 14,
        ended_jobs: 100,
        idempotency_us: SEC,
    };
    s.submit(job("hr", "wxA", "aaaa"), &tight, T0).await.unwrap();
    s.submit(job("hr", "wxA", "bbbb"), &tight, T0).await.unwrap();
    let before = snapshot(&redis);
    let full = |r: Result<_, SubmitError>| match r {
        Err(SubmitError::Full(b)) => b,
        other => panic!("expected Full, got {other:?}"),
    };
    let mut keyed = job("hr", "wxA", "c");
    keyed.idempotency_key = Some("k".into());
    assert_eq!(full(s.submit(keyed.clone(), &tight, T0).await), Bound::CallerJobs);
    assert_eq!(full(s.submit(job("ops", "wxA", "0123456789a"), &tight, T0).await), Bound::CallerBytes);
    s.submit(job("ops", "wxA", "cc"), &tight, T0).await.unwrap();
    let before_account = snapshot(&redis);
    assert_eq!(full(s.submit(job("mk", "wxA", "d"), &tight, T0).await), Bound::AccountJobs);
    assert_eq!(snapshot(&redis), before_account, "a refused submission stores nothing");
    let roomier = Bounds { account_jobs: 10, ..tight };
    assert_eq!(full(s.submit(job("mk", "wxA", "0123456"), &roomier, T0).await), Bound::AccountBytes);
    assert_eq!(snapshot(&redis), before_account);
    assert_ne!(before, before_account);
    // The refused keyed submission left no key behind: a later one with
    // room is stored as new.
    let roomy_caller = Bounds { caller_jobs: 10, account_jobs: 10, ..tight };
    assert!(!s.submit(keyed, &roomy_caller, T0).await.unwrap().duplicate);
}

#[tokio::test]
async fn the_caller_bound_counts_the_callers_jobs_in_every_account() {
    let redis = RedisServer::start();
    let s = store(&redis.store_config("jr")).await;
    let b = Bounds { caller_jobs: 2, ..roomy() };
    s.submit(job("hr", "wxA", "x"), &b, T0).await.unwrap();
    s.submit(job("hr", "wxB", "x"), &b, T0).await.unwrap();
    assert!(matches!(s.submit(job("hr", "wxC", "x"), &b, T0).await, Err(SubmitError::Full(Bound::CallerJobs))));
    // An ended job counts no more, whichever account it was in.
    let q = queue("hr", "wxB", "tpl");
    let claimed = s.claim(&q, "i1", T0, 30 * SEC, 10).await.unwrap();
    assert!(s.finish(claimed[0].id, "i1", End::Expired, T0).await.unwrap());
    s.submit(job("hr", "wxC", "x"), &b, T0).await.unwrap();
}

#[tokio::test]
async fn claim_hands_out_one_recipients_jobs_one_at_a_time_in_order() {
    let redis = RedisServer::start();
    let s = store(&redis.store_config("jr")).await;
    let q = queue("hr", "wxA", "tpl");
    let mut ids = Vec::new();
    for i in 0..5 {
        let to_one = NewJob { lanes: wxgate::jobs::Lanes::of(["o1"]), ..job("hr", "wxA", &format!("m{i}")) };
        ids.push(submit(&s, to_one, T0 + i).await);
    }
    let first = s.claim(&q, "i1", T0 + 10, 30 * SEC, 2).await.unwrap();
    assert_eq!(first.iter().map(|j| j.id).collect::<Vec<_>>(), ids[..1], "its first only");
    assert_eq!(first[0].state, JobState::Claimed);
    assert_eq!((first[0].owner.as_deref(), first[0].lease_us), (Some("i1"), T0 + 10 + 30 * SEC));
    assert!(s.claim(&q, "i2", T0 + 10, 30 * SEC, 10).await.unwrap().is_empty(), "a claimed job holds the rest");
    assert!(s.due_queues(T0 + 10, 10).await.unwrap().is_empty(), "nor is the queue due");
    // It waits (back-off): the recipient's others wait behind it.
    assert!(s.finish(ids[0], "i1", End::NotYet { at: T0 + 100 * SEC }, T0 + 20).await.unwrap());
    assert!(s.claim(&q, "i2", T0 + 50 * SEC, 30 * SEC, 10).await.unwrap().is_empty(), "a waiting job holds the rest");
    assert!(s.due_queues(T0 + 50 * SEC, 10).await.unwrap().is_empty());
    assert_eq!(s.due_queues(T0 + 100 * SEC, 10).await.unwrap(), vec![q.clone()]);
    let again = s.claim(&q, "i2", T0 + 100 * SEC, 30 * SEC, 10).await.unwrap();
    assert_eq!(again.iter().map(|j| j.id).collect::<Vec<_>>(), vec![ids[0]]);
    assert!(s.finish(ids[0], "i2", End::Sent(answer(0)), T0 + 100 * SEC).await.unwrap());
    let next = s.claim(&q, "i2", T0 + 100 * SEC, 30 * SEC, 10).await.unwrap();
    assert_eq!(next.iter().map(|j| j.id).collect::<Vec<_>>(), vec![ids[1]], "then the next, in order");
    assert!(s.claim(&q, "i2", T0 + 100 * SEC, 30 * SEC, 0).await.unwrap().is_empty());
}

#[tokio::test]
async fn due_queues_lists_due_heads_oldest_first_per_caller() {
    let redis = RedisServer::start();
    let s = store(&redis.store_config("jr")).await;
    let (a, b, c) = (queue("hr", "wxA", "tpl"), queue("mk", "wxA", "tpl"), queue("hr", "wxB", "tpl"));
    submit(&s, job("mk", "wxA", "x"), T0 + 2).await;
    submit(&s, job("hr", "wxB", "x"), T0 + 3).await;
    submit(&s, job("hr", "wxA", "x"), T0 + 1).await;
    assert_eq!(s.due_queues(T0 + 5, 10).await.unwrap(), vec![a.clone(), c.clone(), b.clone()], "hr's together");
    assert_eq!(s.due_queues(T0 + 5, 1).await.unwrap(), vec![a.clone(), b.clone()], "1 per caller");
    assert_eq!(s.due_queues(T0 + 2, 10).await.unwrap(), vec![a.clone(), b.clone()], "not yet due: not listed");
    let got = s.claim(&b, "i1", T0 + 5, SEC, 1).await.unwrap();
    assert!(s.finish(got[0].id, "i1", End::Failed(answer(40003)), T0 + 5).await.unwrap());
    assert_eq!(s.due_queues(T0 + 5, 10).await.unwrap(), vec![a, c], "an emptied queue leaves the index");
    let mut left = keys_with(&redis, "jr:{#jobs}:due");
    left.sort();
    assert_eq!(left, vec!["jr:{#jobs}:due-callers", "jr:{#jobs}:due:hr"], "mk's emptied index is gone with it");
}

#[tokio::test]
async fn leases_one_owner_at_a_time_and_recover_never_hands_out_a_sending_job() {
    let redis = RedisServer::start();
    let s = store(&redis.store_config("jr")).await;
    let q = queue("hr", "wxA", "tpl");
    let a = submit(&s, job("hr", "wxA", "a"), T0).await;
    let b = submit(&s, job("hr", "wxA", "b"), T0).await;
    let got = s.claim(&q, "i1", T0, 30 * SEC, 2).await.unwrap();
    assert_eq!(got.len(), 2);
    assert!(!s.sending(a, "i2", T0 + SEC).await.unwrap(), "another owner cannot send it");
    assert!(!s.finish(a, "i2", End::Sent(answer(0)), T0 + SEC).await.unwrap(), "nor finish it");
    assert!(s.sending(a, "i1", T0 + SEC).await.unwrap());
    assert!(!s.sending(a, "i1", T0 + SEC).await.unwrap(), "a sending job is not marked sending again");
    let sending = s.get("hr", a).await.unwrap().unwrap();
    assert_eq!((sending.state, sending.attempts), (JobState::Sending, 1));
    assert!(!s.sending(b, "i1", T0 + 30 * SEC).await.unwrap(), "a lease that ran out cannot start a send");
    assert_eq!(s.recover(T0 + 30 * SEC - 1).await.unwrap(), Recovered::default(), "no lease ran out yet");
    assert_eq!(s.recover(T0 + 30 * SEC).await.unwrap(), Recovered { requeued: 1, unknown: 1 });
    let a_now = s.get("hr", a).await.unwrap().unwrap();
    assert_eq!((a_now.state, a_now.owner.as_deref()), (JobState::Unknown, None));
    let b_now = s.get("hr", b).await.unwrap().unwrap();
    assert_eq!((b_now.state, b_now.attempts), (JobState::Queued, 0));
    assert!(!s.finish(a, "i1", End::Sent(answer(0)), T0 + 31 * SEC).await.unwrap(), "recovered: i1 holds it no more");
    assert_eq!(s.due_queues(T0 + 31 * SEC, 10).await.unwrap(), vec![q.clone()]);
    let again = s.claim(&q, "i2", T0 + 31 * SEC, 30 * SEC, 10).await.unwrap();
    assert_eq!(again.iter().map(|j| j.id).collect::<Vec<_>>(), vec![b], "the unknown job is never handed out again");
    assert_eq!(s.recover(T0 + 3600 * SEC).await.unwrap(), Recovered { requeued: 1, unknown: 0 });
    assert_eq!(s.recover(T0 + 3600 * SEC).await.unwrap(), Recovered::default(), "recover twice changes nothing");
}

#[tokio::test]
async fn finish_ends_each_way_the_trait_says() {
    let redis = RedisServer::start();
    let s = store(&redis.store_config("jr")).await;
    let send = |caller: &'static str| {
        let s = &s;
        async move {
            let q = queue(caller, "wxA", "tpl");
            let id = submit(s, job(caller, "wxA", "x"), T0).await;
            let got = s.claim(&q, "i1", T0, 30 * SEC, 1).await.unwrap();
            assert_eq!(got[0].id, id);
            id
        }
    };

    let id = send("c1").await;
    assert!(s.sending(id, "i1", T0).await.unwrap());
    assert!(s.finish(id, "i1", End::Sent(answer(0)), T0 + 5).await.unwrap());
    let j = s.get("c1", id).await.unwrap().unwrap();
    assert_eq!((j.state, j.attempts, j.answer, j.updated_us), (JobState::Sent, 1, Some(answer(0)), T0 + 5));
    assert!(!s.finish(id, "i1", End::Sent(answer(0)), T0 + 6).await.unwrap(), "an ended job is held by nobody");

    let id = send("c2").await;
    assert!(s.sending(id, "i1", T0).await.unwrap());
    assert!(s.finish(id, "i1", End::Failed(answer(40003)), T0).await.unwrap());
    let j = s.get("c2", id).await.unwrap().unwrap();
    assert_eq!((j.state, j.answer.and_then(|a| a.errcode)), (JobState::Failed, Some(40003)));

    let id = send("c3").await;
    assert!(s.sending(id, "i1", T0).await.unwrap());
    assert!(s.finish(id, "i1", End::Retry { at: T0 + 9 * SEC, answer: Some(answer(45009)) }, T0).await.unwrap());
    let j = s.get("c3", id).await.unwrap().unwrap();
    assert_eq!((j.state, j.due_us, j.attempts, j.owner.clone()), (JobState::Waiting, T0 + 9 * SEC, 1, None));
    assert_eq!(j.answer.and_then(|a| a.errcode), Some(45009));
    let j = s.claim(&queue("c3", "wxA", "tpl"), "i2", T0 + 9 * SEC, SEC, 1).await.unwrap();
    assert_eq!(j[0].id, id, "a waiting job is claimed once due");

    let id = send("c4").await;
    assert!(s.finish(id, "i1", End::NotYet { at: T0 + 2 * SEC }, T0).await.unwrap());
    let j = s.get("c4", id).await.unwrap().unwrap();
    assert_eq!((j.state, j.due_us, j.attempts), (JobState::Waiting, T0 + 2 * SEC, 0), "no attempt counted");

    // Handed back due at once: queued, not waiting.
    let id = send("c9").await;
    assert!(s.finish(id, "i1", End::NotYet { at: T0 }, T0).await.unwrap());
    assert_eq!(s.get("c9", id).await.unwrap().unwrap().state, JobState::Queued);

    let id = send("c5").await;
    assert!(s.finish(id, "i1", End::Expired, T0).await.unwrap());
    assert_eq!(s.get("c5", id).await.unwrap().unwrap().state, JobState::Expired);

    let id = send("c6").await;
    assert!(s.sending(id, "i1", T0).await.unwrap());
    let none = Answer { status: 0, errcode: None, body: Bytes::new() };
    assert!(s.finish(id, "i1", End::Unknown(Some(none.clone())), T0).await.unwrap());
    let j = s.get("c6", id).await.unwrap().unwrap();
    assert_eq!((j.state, j.answer), (JobState::Unknown, Some(none)));

    // "Not yet" and "expired" say a job was never sent: a sending job
    // may have been, so neither hands it back nor ends it.
    let id = send("c8").await;
    assert!(s.sending(id, "i1", T0).await.unwrap());
    assert!(!s.finish(id, "i1", End::NotYet { at: T0 }, T0).await.unwrap());
    assert!(!s.finish(id, "i1", End::Expired, T0).await.unwrap());
    assert_eq!(s.get("c8", id).await.unwrap().unwrap().state, JobState::Sending);
    assert!(s.claim(&queue("c8", "wxA", "tpl"), "i2", T0 + 3600 * SEC, SEC, 5).await.unwrap().is_empty());

    let id = send("c7").await;
    let long = Answer { status: 200, errcode: Some(0), body: Bytes::from(vec![b'x'; 10_000]) };
    assert!(s.sending(id, "i1", T0).await.unwrap());
    assert!(s.finish(id, "i1", End::Sent(long), T0).await.unwrap());
    let kept = s.get("c7", id).await.unwrap().unwrap().answer.unwrap();
    assert_eq!(kept.body.len(), wxgate::jobs::ANSWER_MAX, "the answer is kept up to ANSWER_MAX bytes");
}

#[tokio::test]
async fn cancel_ends_a_job_not_yet_sending_and_only_for_its_caller() {
    let redis = RedisServer::start();
    let s = store(&redis.store_config("jr")).await;
    let q = queue("hr", "wxA", "tpl");
    let a = submit(&s, job("hr", "wxA", "a"), T0).await;
    let b = submit(&s, job("hr", "wxA", "b"), T0).await;
    let c = submit(&s, job("hr", "wxA", "c"), T0).await;
    assert_eq!(s.cancel("marketing", c, T0).await.unwrap(), Cancelled::NotFound);
    assert_eq!(s.cancel("hr", JobId([0xee; 16]), T0).await.unwrap(), Cancelled::NotFound);
    assert_eq!(s.cancel("hr", c, T0 + 1).await.unwrap(), Cancelled::Cancelled);
    assert_eq!(s.get("hr", c).await.unwrap().unwrap().state, JobState::Cancelled);
    assert_eq!(s.cancel("hr", c, T0 + 1).await.unwrap(), Cancelled::TooLate(JobState::Cancelled));
    s.claim(&q, "i1", T0, 30 * SEC, 2).await.unwrap();
    assert!(s.sending(a, "i1", T0).await.unwrap());
    assert_eq!(s.cancel("hr", a, T0).await.unwrap(), Cancelled::TooLate(JobState::Sending));
    assert_eq!(s.cancel("hr", b, T0).await.unwrap(), Cancelled::Cancelled, "a claimed job can be cancelled");
    assert!(!s.sending(b, "i1", T0).await.unwrap(), "and its dispatcher then never sends it");
    assert!(!s.finish(b, "i1", End::Sent(answer(0)), T0).await.unwrap());
    let sum = s.summary(Some("hr")).await.unwrap();
    assert_eq!((sum[0].cancelled, sum[0].sending, sum[0].queued), (2, 1, 0));
}

#[tokio::test]
async fn summary_counts_each_queue_by_state_with_its_oldest_job() {
    let redis = RedisServer::start();
    let s = store(&redis.store_config("jr")).await;
    let q = queue("hr", "wxA", "tpl");
    let a = submit(&s, job("hr", "wxA", "a"), T0 + 1).await;
    let b = submit(&s, job("hr", "wxA", "b"), T0 + 2).await;
    submit(&s, job("hr", "wxA", "c"), T0 + 3).await;
    submit(&s, job("mk", "wxB", "d"), T0 + 4).await;
    s.claim(&q, "i1", T0 + 5, 30 * SEC, 2).await.unwrap();
    assert!(s.sending(a, "i1", T0 + 5).await.unwrap());
    assert!(s.finish(a, "i1", End::Sent(answer(0)), T0 + 6).await.unwrap());
    assert!(s.finish(b, "i1", End::NotYet { at: T0 + SEC }, T0 + 6).await.unwrap());
    let all = s.summary(None).await.unwrap();
    assert_eq!(all.len(), 2);
    let hr = &all[0];
    assert_eq!(hr.queue, q);
    assert_eq!((hr.queued, hr.waiting, hr.sending, hr.sent), (1, 1, 0, 1));
    assert_eq!(hr.oldest_us, Some(T0 + 2), "the oldest unfinished job's submission");
    assert_eq!((all[1].queue.caller.as_ref(), all[1].queued, all[1].oldest_us), ("mk", 1, Some(T0 + 4)));
    let mine = s.summary(Some("mk")).await.unwrap();
    assert_eq!(mine, vec![all[1].clone()], "a caller sees its own queues only");
    assert!(s.summary(Some("nobody")).await.unwrap().is_empty());
}

/// What spans accounts is written by the client after each script: a
/// write lost (an instance dying between the two) or crossed is repaired.
/// A queue missing from the index is listed again by the next recover; an
/// entry too many costs one empty claim, which takes it out; lost caller
/// totals come back with recover.
#[tokio::test]
async fn a_lost_write_to_the_cross_account_keys_is_repaired() {
    let redis = RedisServer::start();
    let s = store(&redis.store_config("jr")).await;
    let q = queue("hr", "wxA", "tpl");
    submit(&s, job("hr", "wxA", "a"), T0).await;
    redis.run_as(None, &["DEL", "jr:{#jobs}:due:hr", "jr:{#jobs}:due-callers", "jr:{#jobs}:caller:hr"]);
    assert!(s.due_queues(T0, 10).await.unwrap().is_empty(), "the index lost the queue");
    let b = Bounds { caller_jobs: 1, ..roomy() };
    assert!(s.submit(job("hr", "wxB", "b"), &b, T0).await.is_ok(), "the caller bound missed wxA's job");
    assert_eq!(s.recover(T0).await.unwrap(), Recovered::default());
    assert_eq!(s.due_queues(T0, 10).await.unwrap(), vec![q.clone(), queue("hr", "wxB", "tpl")]);
    assert!(matches!(s.submit(job("hr", "wxC", "c"), &b, T0).await, Err(SubmitError::Full(Bound::CallerJobs))));
    s.claim(&q, "i1", T0, 30 * SEC, 1).await.unwrap();
    redis.run_as(None, &["ZADD", "jr:{#jobs}:due:hr", "0", "wxA\ntpl"]);
    assert!(s.due_queues(T0, 10).await.unwrap().contains(&q), "a stale entry");
    assert!(s.claim(&q, "i2", T0, 30 * SEC, 1).await.unwrap().is_empty(), "costs one empty claim");
    assert!(!s.due_queues(T0, 10).await.unwrap().contains(&q), "which takes it out");
}

/// The single index of due queues an earlier build wrote (`{#jobs}:due`,
/// every caller in one zset) is read by nothing now, and the first recover
/// deletes it.
#[tokio::test]
async fn an_earlier_builds_single_due_index_is_deleted_by_recover() {
    let redis = RedisServer::start();
    let s = store(&redis.store_config("jr")).await;
    redis.run_as(None, &["ZADD", "jr:{#jobs}:due", "0", "wxA\nhr\ntpl"]);
    assert!(s.due_queues(T0, 10).await.unwrap().is_empty(), "its entry is not read");
    assert_eq!(s.recover(T0).await.unwrap(), Recovered::default());
    assert!(keys_with(&redis, "jr:{#jobs}:due").is_empty(), "and it is gone");
}

/// Redis loses its data (a restart without persistence, FLUSHALL) and
/// gives an account's number to another: an instance that remembered the
/// old account still finds, sends and finishes the new account's jobs.
#[tokio::test]
async fn after_redis_loses_its_data_account_numbers_are_read_again() {
    let redis = RedisServer::start();
    let cfg = redis.store_config("jr");
    let (one, two) = (store(&cfg).await, store(&cfg).await);
    let old = submit(&one, job("hr", "wxA", "a"), T0).await;
    assert!(two.get("hr", old).await.unwrap().is_some(), "two knows wxA's number");
    redis.run_as(None, &["FLUSHALL"]);
    let new = submit(&one, job("hr", "wxX", "x"), T0).await;
    assert_eq!(new.0[..4], old.0[..4], "wxX has the number wxA had");
    assert_eq!(two.get("hr", new).await.unwrap().map(|j| j.id), Some(new));
    let q = queue("hr", "wxX", "tpl");
    assert_eq!(two.claim(&q, "i2", T0, 30 * SEC, 1).await.unwrap()[0].id, new);
    assert!(two.sending(new, "i2", T0).await.unwrap());
    assert!(two.finish(new, "i2", End::Sent(answer(0)), T0).await.unwrap());
    assert_eq!(two.get("hr", old).await.unwrap(), None, "wxA's job went with the data");
}

/// Keys of `account`'s jobs on `server`.
fn account_keys(server: &RedisServer, account: &str) -> Vec<String> {
    keys_with(server, &format!("{{{account}}}:#jobs:"))
}

#[tokio::test]
async fn purge_deletes_ended_jobs_after_keep_and_leaves_no_key_behind() {
    let redis = RedisServer::start();
    let s = store(&redis.store_config("jr")).await;
    let q = queue("hr", "wxA", "tpl");
    let mut keyed = job("hr", "wxA", "a");
    keyed.idempotency_key = Some("once".into());
    let a = s.submit(keyed.clone(), &roomy(), T0).await.unwrap().id;
    let b = submit(&s, job("hr", "wxA", "b"), T0).await;
    s.claim(&q, "i1", T0, 30 * SEC, 1).await.unwrap();
    assert!(s.sending(a, "i1", T0).await.unwrap());
    assert!(s.finish(a, "i1", End::Sent(answer(0)), T0 + 10 * SEC).await.unwrap());
    assert_eq!(s.purge(T0 + 20 * SEC, 10 * SEC).await.unwrap(), 0, "ended exactly keep ago: kept");
    // Past keep, but its Idempotency-Key counts until T0 + 1 h: kept until then.
    assert_eq!(s.purge(T0 + 20 * SEC + 1, 10 * SEC).await.unwrap(), 0);
    assert!(s.get("hr", a).await.unwrap().is_some(), "a job its key still names is kept");
    assert!(s.get("hr", b).await.unwrap().is_some(), "an unfinished job is never purged");
    assert_eq!(s.cancel("hr", b, T0 + 30 * SEC).await.unwrap(), Cancelled::Cancelled);
    // A cancel leaves its emptied queue listed as due (`added_only`): the
    // dispatcher's next claim hands out nothing and takes it out.
    assert!(s.claim(&q, "i1", T0 + 30 * SEC, 30 * SEC, 1).await.unwrap().is_empty());
    assert_eq!(s.purge(T0 + 30 * SEC, 0).await.unwrap(), 0);
    assert!(!account_keys(&redis, "wxA").is_empty(), "the idempotency key is still in its time");
    assert_eq!(s.purge(T0 + 3600 * SEC, 0).await.unwrap(), 2, "both jobs, the key's time over");
    assert_eq!(account_keys(&redis, "wxA"), Vec::<String>::new(), "nothing of the account's jobs is left");
    assert!(s.summary(None).await.unwrap().is_empty());
    let left = keys_with(&redis, "jr:");
    let globals: HashSet<&str> = ["jr:{#jobs}:accounts", "jr:{#jobs}:names", "jr:{#jobs}:next"].into();
    assert!(left.iter().all(|k| globals.contains(k.as_str())), "only the account numbers are left: {left:?}");
    // The account starts again cleanly.
    let again = s.submit(keyed, &roomy(), T0 + 3600 * SEC).await.unwrap();
    assert!(!again.duplicate);
    assert_eq!(s.get("hr", again.id).await.unwrap().unwrap().seq, 1);
}

/// Two instances (two stores, their own connections) claim one queue at
/// the same time over and over: no job is handed to both, and every job is
/// handed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_claiming_one_queue_never_get_the_same_job() {
    let redis = RedisServer::start();
    let cfg = redis.store_config("jr");
    let one = Arc::new(store(&cfg).await);
    let two = Arc::new(store(&cfg).await);
    let q = queue("mk", "wxA", "tpl");
    const N: usize = 400;
    for i in 0..N {
        submit(&one, job("mk", "wxA", &format!("m{i}")), T0).await;
    }
    let run = |s: Arc<RedisJobs>, owner: &'static str| {
        let q = q.clone();
        tokio::spawn(async move {
            let mut mine = Vec::new();
            for _ in 0..10 * N {
                let got = s.claim(&q, owner, T0, 30 * SEC, 3).await.unwrap();
                if got.is_empty() && s.due_queues(T0, 10).await.unwrap().is_empty() {
                    let left = s.summary(None).await.unwrap();
                    if left[0].queued == 0 {
                        break;
                    }
                }
                for j in got {
                    assert!(s.sending(j.id, owner, T0).await.unwrap(), "{owner} holds what it claimed");
                    assert!(s.finish(j.id, owner, End::Sent(answer(0)), T0).await.unwrap());
                    mine.push(j.id);
                }
            }
            mine
        })
    };
    let (a, b) = (run(one.clone(), "i1"), run(two.clone(), "i2"));
    let (a, b) = (a.await.unwrap(), b.await.unwrap());
    let both: HashSet<JobId> = a.iter().copied().collect();
    assert!(b.iter().all(|id| !both.contains(id)), "a job went to both instances");
    assert_eq!(a.len() + b.len(), N, "every job was handed out once");
    assert!(!a.is_empty() && !b.is_empty(), "both instances dispatched ({} / {})", a.len(), b.len());
    assert_eq!(one.summary(None).await.unwrap()[0].sent, N as u64);
}

/// The same life on a Redis Cluster: every key of one account's jobs is in
/// that account's slot, operations work across masters, and purge leaves
/// nothing of the account.
#[tokio::test]
async fn on_a_cluster_each_accounts_jobs_live_in_one_slot() {
    let cluster = RedisCluster::start(3);
    let s = store(&cluster.store_config("jc")).await;
    let accounts = ["wxA", "wxB", "wxC", "wxD", "wxE", "wxF"];
    let masters: HashSet<u16> = accounts.iter().map(|a| cluster.node_of(&format!("jc:{{{a}}}:#jobs:meta"))).collect();
    assert!(masters.len() >= 2, "the accounts spread over masters");
    let mut ids = Vec::new();
    for a in accounts {
        let mut j = job("hr", a, "x");
        j.idempotency_key = Some("k".into());
        ids.push((a, s.submit(j, &roomy(), T0).await.unwrap().id));
        submit(&s, job("mk", a, "y"), T0).await;
    }
    assert_eq!(s.due_queues(T0, 100).await.unwrap().len(), 12);
    for (a, id) in &ids {
        let got = s.claim(&queue("hr", a, "tpl"), "i1", T0, 30 * SEC, 5).await.unwrap();
        assert_eq!(got.iter().map(|j| j.id).collect::<Vec<_>>(), vec![*id]);
        assert!(s.sending(*id, "i1", T0).await.unwrap());
        assert_eq!(s.cancel("mk", *id, T0).await.unwrap(), Cancelled::NotFound);
    }
    assert_eq!(s.recover(T0 + 30 * SEC).await.unwrap(), Recovered { requeued: 0, unknown: 6 });
    assert_eq!(s.summary(Some("hr")).await.unwrap().iter().map(|q| q.unknown).sum::<u64>(), 6);
    for a in accounts {
        let slots: HashSet<String> = cluster
            .nodes
            .iter()
            .flat_map(|n| account_keys(n, a))
            .map(|k| cluster.nodes[0].command(&format!("CLUSTER KEYSLOT {k}")))
            .collect();
        assert_eq!(slots.len(), 1, "{a}'s job keys are in one slot: {slots:?}");
        let id = s.claim(&queue("mk", a, "tpl"), "i1", T0 + 31 * SEC, 30 * SEC, 5).await.unwrap()[0].id;
        assert!(s.finish(id, "i1", End::Failed(answer(43004)), T0 + 31 * SEC).await.unwrap());
    }
    assert_eq!(s.purge(T0 + 7200 * SEC, SEC).await.unwrap(), 12);
    for a in accounts {
        let left: Vec<String> = cluster.nodes.iter().flat_map(|n| account_keys(n, a)).collect();
        assert!(left.is_empty(), "{a}: {left:?}");
    }
}

/// Redis memory per queued job with a 500-byte body, and submissions per
/// second on this machine (one connection, one submission at a time, and
/// 32 at once). Prints numbers; asserts none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn bench_memory_per_job_and_submissions_per_second() {
    let redis = RedisServer::start();
    let s = Arc::new(store(&redis.store_config("jb")).await);
    let used = |r: &RedisServer| -> i64 {
        r.command("INFO memory")
            .lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("used_memory")
    };
    let body = "x".repeat(500);
    // Warm: the account's keys and the script cache exist.
    submit(&s, job("warm", "wxA", &body), T0).await;
    let n = 10_000usize;
    let before = used(&redis);
    let start = std::time::Instant::now();
    let mut last = None;
    for i in 0..n {
        last = Some(submit(&s, job("mk", "wxA", &body), T0 + i as i64).await);
    }
    let serial = start.elapsed();
    let after = used(&redis);
    let id = last.unwrap();
    let usage = redis.command(&format!("MEMORY USAGE jb:{{wxA}}:#jobs:j:{id}"));
    println!(
        "redis memory per queued job (500-byte body): {} bytes (INFO used_memory over {n} jobs)",
        (after - before) / n as i64
    );
    println!("MEMORY USAGE of one job's hash: {}", usage.trim());
    let body_usage = redis.command(&format!("MEMORY USAGE jb:{{wxA}}:#jobs:b:{id}"));
    println!("MEMORY USAGE of its body: {}", body_usage.trim());
    let queue = redis.command("MEMORY USAGE jb:{wxA}:#jobs:q:mk:tpl");
    let per: i64 = queue.trim().trim_start_matches(':').parse().unwrap_or(0);
    println!("MEMORY USAGE of the queue's sorted set, per job: {}", per / n as i64);
    println!("submissions per second, one at a time: {:.0}", n as f64 / serial.as_secs_f64());
    let start = std::time::Instant::now();
    let mut tasks = Vec::new();
    for t in 0..32 {
        let s = s.clone();
        let body = body.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..n / 32 {
                submit(&s, job(&format!("c{t}"), "wxB", &body), T0 + i as i64).await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    println!("submissions per second, 32 at once: {:.0}", (n / 32 * 32) as f64 / start.elapsed().as_secs_f64());
}
