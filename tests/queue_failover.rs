//! Never twice through a Redis failover (issue 63): a queued job is marked
//! `sending` before its request goes out, and a job found `sending` is
//! never handed out again. On a master with replicas that mark must be on a
//! replica before the request goes, or a failover to a replica that lacks
//! it hands the job out again and WeChat gets it twice.
//!
//! Real redis-server processes on loopback: a master and a replica whose
//! link can hold back the master's stream (so the replica misses what the
//! master writes from then on), the same under Sentinel, and a Cluster with
//! a replica per master; wxgate processes and a mock WeChat counting each
//! message.

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use support::jobs::{new_job, queue, roomy};
use support::process::Instance;
use support::queue::{msgid, queued_at, wechat};
use support::redis_server::{
    wait_replicated, LaggingLink, RedisCluster, RedisSentinelSet, RedisServer, ReplicatedRedis, SENTINEL_MASTER,
};
use support::temp::TempDir;
use support::tokens::{account_toml, APPID, SECRET};
use support::{eventually_async, rule, ConfigToml, MockWeChat, StoreToml, PATIENCE};
use wxgate::jobs::redis::RedisJobs;
use wxgate::jobs::{JobId, JobState, JobStore};

const SEND: &str = "/cgi-bin/message/template/send";

/// Jobs queued in each scenario.
const JOBS: usize = 12;

const TOKEN_KEY: (&str, &str) =
    ("WXGATE_TOKEN_KEY", "5f0c9a3e7b2d4f6a8c1e3b5d7f9a0c2e4b6d8f1a3c5e7b9d0f2a4c6e8b1d3f5a");

const T0: i64 = 1_800_000_000_000_000;
const SEC: i64 = 1_000_000;

/// A config on `store` with a queueing template rule sending one job every
/// 100 ms (so the queue is still sending when the replica's link is held)
/// and leases of 5 s.
fn config(mock: &MockWeChat, dir: &TempDir, store: impl std::fmt::Display) -> String {
    let token = rule("token").matching("/cgi-bin/token").matching("/cgi-bin/stable_token").limit(2000, "day");
    let send = rule("template_send").matching(SEND).limit_burst(10, "1s", 1).set("queue", true);
    ConfigToml::new(&mock.url())
        .with(store.to_string())
        .with(format!("{token}\n{send}"))
        .with(account_toml(dir, APPID, "official_account", SECRET, ""))
        .with("[queue]\nlease = \"5s\"\n".to_owned())
        .to_string()
}

fn sends(mock: &MockWeChat) -> usize {
    mock.calls().into_iter().filter(|c| c.path_and_query.starts_with(SEND)).count()
}

/// Queues [`JOBS`] messages through `gate`, each body its own.
async fn submit_all(gate: &Instance) {
    for i in 0..JOBS {
        queued_at(gate.url(&format!("/@{APPID}{SEND}")), "default", format!(r#"{{"touser":"f{i}"}}"#)).await;
    }
}

/// Holds back what `master` sends its replica through `link` from now on,
/// and returns once wxgate has tried to send at least twice since: WeChat
/// got a message, or the master was asked to `WAIT` for its replica.
async fn hold_while_sending(mock: &MockWeChat, master: &RedisServer, link: &LaggingLink) {
    let (sent, waits) = (sends(mock), master.command_calls("wait"));
    link.hold();
    eventually_async("two sends tried while the replica gets nothing", PATIENCE, async || {
        sends(mock) - sent + (master.command_calls("wait") - waits) as usize >= 2
    })
    .await;
}

/// Waits until no job of `gate`'s queue is queued, waiting or sending.
async fn all_ended(gate: &Instance) -> serde_json::Value {
    let mut summary = serde_json::Value::Null;
    eventually_async("every job ended", Duration::from_secs(40), async || {
        summary = gate.get("/v1/deliveries").await.json();
        let q = &summary["queues"][0];
        q["queued"] == 0 && q["waiting"] == 0 && q["sending"] == 0
    })
    .await;
    summary
}

/// No job reached WeChat twice; every job ended `sent` (those WeChat got)
/// or `unknown`. A job may end `unknown` without having been sent: its
/// mark reached the replica but the master's `WAIT` did not learn so in
/// time, and the mark's undo was lost with the master (at most the marks
/// under way when the replica's link was held: one here, the queue sending
/// one job at a time).
fn assert_none_twice(mock: &MockWeChat, summary: &serde_json::Value) {
    let mut times = BTreeMap::<String, usize>::new();
    for c in mock.calls().into_iter().filter(|c| c.path_and_query.starts_with(SEND)) {
        *times.entry(String::from_utf8_lossy(&c.body).into_owned()).or_default() += 1;
    }
    let twice: Vec<_> = times.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "sent more than once: {twice:?}");
    let q = &summary["queues"][0];
    let (sent, unknown) = (q["sent"].as_u64().unwrap_or(0) as usize, q["unknown"].as_u64().unwrap_or(0) as usize);
    assert_eq!(sent + unknown, JOBS, "every job sent or unknown: {summary}");
    assert!(unknown <= 1, "at most the mark under way at the hold ends unknown: {summary}");
    assert!(times.len() >= sent, "every sent job reached WeChat: {times:?} {summary}");
}

/// A plain master with one replica; the replica stops getting the master's
/// stream while the queue is sending; the master crashes together with the
/// wxgate that was sending, the replica is promoted (`REPLICAOF NO ONE`)
/// and another wxgate is pointed at it. Before the mark had to be on a
/// replica, jobs sent during the hold were `claimed` or `queued` on the
/// promoted replica and sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_to_a_replica_that_missed_the_sending_marks_sends_no_job_twice() {
    let mut redis = ReplicatedRedis::start();
    let (mock, _tokens) = wechat(|_, n| msgid(n)).await;
    let dir = TempDir::new("failover-plain");
    let store = |url: &str| StoreToml::redis(url).set("key_prefix", "qf").set("timeout", "200ms");
    let first = config(&mock, &dir, store(&redis.master.url()));
    let mut gate = support::process::spawn(&first, "failover-plain-a", &[TOKEN_KEY]).unwrap_or_else(|l| panic!("{l}"));
    submit_all(&gate).await;
    wait_replicated(&redis.master, &redis.replica);
    hold_while_sending(&mock, &redis.master, &redis.link).await;
    gate.kill();
    redis.fail_over();
    let second = config(&mock, &dir, store(&redis.replica.url()));
    let gate = support::process::spawn(&second, "failover-plain-b", &[TOKEN_KEY]).unwrap_or_else(|l| panic!("{l}"));
    let summary = all_ended(&gate).await;
    assert_none_twice(&mock, &summary);
}

/// The same under Sentinel, wxgate staying up: `SENTINEL FAILOVER` promotes
/// the replica that missed the master's last writes (the old master, still
/// up, becomes its replica and loses them too), and wxgate follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_failover_to_a_replica_that_missed_the_sending_marks_sends_no_job_twice() {
    let set = RedisSentinelSet::start_lagging();
    let (mock, _tokens) = wechat(|_, n| msgid(n)).await;
    let dir = TempDir::new("failover-sentinel");
    let sentinels: Vec<toml::Value> = set.sentinel_urls().into_iter().map(toml::Value::from).collect();
    let store = format!(
        "[store]\nkind = \"redis-sentinel\"\nsentinels = {}\nmaster = \"{SENTINEL_MASTER}\"\nkey_prefix = \"qf\"\n\
         timeout = \"200ms\"\n",
        toml::Value::Array(sentinels)
    );
    let text = config(&mock, &dir, store);
    let gate = support::process::spawn(&text, "failover-sentinel", &[TOKEN_KEY]).unwrap_or_else(|l| panic!("{l}"));
    submit_all(&gate).await;
    wait_replicated(&set.master, &set.replica);
    let link = set.link.as_ref().expect("a lagging set has a link");
    hold_while_sending(&mock, &set.master, link).await;
    set.fail_over(Duration::from_secs(10));
    let summary = all_ended(&gate).await;
    assert_none_twice(&mock, &summary);
}

/// A job of `account` submitted and claimed by `owner` on `jobs`.
async fn claimed(jobs: &RedisJobs, account: &str, owner: &str) -> JobId {
    let q = queue("hr", account, "tpl");
    let id = jobs.submit(new_job(&q, 10), &roomy(SEC), T0).await.expect("submit").id;
    let got = jobs.claim(&q, owner, T0, 60 * SEC, 1).await.expect("claim");
    assert_eq!(got.iter().map(|j| j.id).collect::<Vec<_>>(), [id]);
    id
}

/// A field of a job's hash as `replica` has it (`READONLY`: a Cluster
/// replica answers reads of its master's slots).
fn on_replica(jobs: &RedisJobs, replica: &RedisServer, account: &str, id: JobId, field: &str) -> Option<String> {
    let client = redis::Client::open(replica.url()).expect("client");
    let mut conn = client.get_connection_with_timeout(Duration::from_secs(2)).expect("connect to the replica");
    let _ = redis::cmd("READONLY").exec(&mut conn);
    let key = format!("{}j:{id}", jobs.account_base(account));
    redis::cmd("HGET").arg(key).arg(field).query(&mut conn).expect("HGET on the replica")
}

/// The replica frozen (SIGSTOP): `sending` cannot have the mark on it in
/// time, so the job is not to be sent, and its mark is taken back (it is
/// `Claimed` again, no attempt counted): what the dispatcher hands back is
/// sent later as if never tried. Once the replica answers, the mark goes
/// through and is on the replica when `sending` returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mark_no_replica_confirms_in_time_is_taken_back_and_the_job_not_sent() {
    let redis = ReplicatedRedis::start();
    let mut cfg = redis.master.store_config("qf");
    cfg.timeout = Duration::from_millis(400);
    let jobs = RedisJobs::connect(&cfg).await.expect("connect the jobs store");
    let id = claimed(&jobs, "wxA", "me").await;
    redis.replica.pause();
    let frozen = jobs.sending(id, "me", T0 + 1).await;
    redis.replica.resume();
    // Resumed, the replica catches up before the next mark (whose WAIT has
    // 200 ms: a loaded machine can take longer to wake it).
    wait_replicated(&redis.master, &redis.replica);
    assert!(!matches!(frozen, Ok(true)), "the replica never had the mark: not to be sent ({frozen:?})");
    let job = jobs.get("hr", id).await.expect("get").expect("the job");
    assert_eq!((job.state, job.attempts), (JobState::Claimed, 0), "the mark taken back");
    assert_eq!(jobs.sending(id, "me", T0 + 2).await.ok(), Some(true));
    assert_eq!(on_replica(&jobs, &redis.replica, "wxA", id, "st").as_deref(), Some("sending"));
}

/// A master without replicas: nothing to wait for, and no `WAIT` sent (a
/// lone Redis pays nothing for this).
#[tokio::test]
async fn on_a_master_without_replicas_a_mark_costs_no_wait() {
    let redis = RedisServer::start();
    let jobs = RedisJobs::connect(&redis.store_config("qf")).await.expect("connect the jobs store");
    for i in 0..3 {
        let id = claimed(&jobs, &format!("wx{i}"), "me").await;
        assert_eq!(jobs.sending(id, "me", T0 + 1).await.ok(), Some(true));
    }
    assert_eq!(redis.command_calls("wait"), 0);
}

/// A Cluster with a replica per master: `WAIT` goes to the master of the
/// job's slot, on the connection its mark was written on (redis-rs would
/// send a lone `WAIT` to every master and keep the least answer). With one
/// master's replica frozen, that master's job is not sent while another
/// master's goes at once, its mark on its own replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_the_mark_waits_for_the_replica_of_its_own_master() {
    let cluster = RedisCluster::start_with_replicas(3, 1);
    let mut cfg = cluster.store_config("qf");
    cfg.timeout = Duration::from_millis(400);
    let jobs = RedisJobs::connect(&cfg).await.expect("connect the jobs store");
    let master_of = |account: &str| cluster.node_of(&format!("{}meta", jobs.account_base(account)));
    let a = "wxA".to_owned();
    let b = (0..).map(|i| format!("wxB{i}")).find(|b| master_of(b) != master_of(&a)).expect("another master");
    let (ja, jb) = (claimed(&jobs, &a, "me").await, claimed(&jobs, &b, "me").await);
    let frozen = cluster.replica_of(master_of(&a));
    frozen.pause();
    let on_a = jobs.sending(ja, "me", T0 + 1).await;
    let on_b = jobs.sending(jb, "me", T0 + 1).await;
    frozen.resume();
    wait_replicated(cluster.node(master_of(&a)), frozen);
    assert!(!matches!(on_a, Ok(true)), "a's replica never had the mark: not to be sent ({on_a:?})");
    assert_eq!(on_b.as_ref().ok(), Some(&true), "b's master's replica answers: {on_b:?}");
    assert_eq!(on_replica(&jobs, cluster.replica_of(master_of(&b)), &b, jb, "st").as_deref(), Some("sending"));
    let job = jobs.get("hr", ja).await.expect("get").expect("the job");
    assert_eq!((job.state, job.attempts), (JobState::Claimed, 0), "a's mark taken back");
    assert_eq!(jobs.sending(ja, "me", T0 + 2).await.ok(), Some(true));
    assert_eq!(on_replica(&jobs, frozen, &a, ja, "st").as_deref(), Some("sending"));
}

/// What a mark costs (`cargo test --test all queue_failover::measure --
/// --ignored --nocapture`): 2,000 marks one after the other, on a lone
/// master and on a master with a replica (both on loopback), timed at the
/// store seam. docs/redis-store.md has the numbers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn measure_a_marks_cost_with_and_without_a_replica() {
    const N: usize = 2000;
    let lone = RedisServer::start();
    let master = RedisServer::start();
    let port = master.port.to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
    while !master.command("INFO replication").contains("state=online") {
        std::thread::sleep(Duration::from_millis(20));
    }
    for (name, server, _replica) in [("no replica", &lone, None), ("one replica", &master, Some(&replica))] {
        let jobs = RedisJobs::connect(&server.store_config("qm")).await.expect("connect the jobs store");
        let q = queue("hr", "wxM", "tpl");
        let mut ids = Vec::with_capacity(N);
        for _ in 0..N {
            ids.push(jobs.submit(new_job(&q, 200), &roomy(SEC), T0).await.expect("submit").id);
        }
        let mut took = Vec::with_capacity(N);
        for (i, chunk) in ids.chunks(100).enumerate() {
            let got = jobs.claim(&q, "me", T0 + i as i64, 3600 * SEC, 100).await.expect("claim");
            assert_eq!(got.len(), chunk.len());
            for id in chunk {
                let started = std::time::Instant::now();
                assert_eq!(jobs.sending(*id, "me", T0 + i as i64).await.ok(), Some(true));
                took.push(started.elapsed());
                // Ended, so the next claim takes the next ones.
                let end = wxgate::jobs::End::Sent(support::jobs::answer(200, 0, "{}"));
                jobs.finish(*id, "me", end, T0 + i as i64).await.expect("finish");
            }
        }
        took.sort();
        let at = |p: usize| took[(took.len() * p / 100).min(took.len() - 1)];
        let mean = took.iter().sum::<Duration>() / took.len() as u32;
        eprintln!(
            "{name}: {N} marks, mean {mean:?}, p50 {:?}, p90 {:?}, p99 {:?}, WAITs {}",
            at(50),
            at(90),
            at(99),
            server.command_calls("wait")
        );
    }
}
