//! Queued delivery at WeChat's pace (issue 63), over real sockets and in
//! real time (the round trips are real): a queue sends as fast as its rule
//! allows whatever WeChat's round trip, never over a window and each job
//! once; keeps each recipient's messages in order; backs off a WeChat that
//! refuses calls past its concurrency (45033); and an answer slower than
//! the lease never ends a job `unknown`. On the memory store (jobs in
//! SQLite) and on Redis.
//!
//! Pace is read from the mock's own arrival times, from the first send
//! after the rule's burst (which goes at once) to the last, never from the
//! test's clock around the submissions: a loaded machine slows the test's
//! side, not what is measured. Each scenario prints its figures
//! (`cargo test --test all queue_pace:: -- --nocapture`).
//!
//! A rule's rate is what it admits sustained: `{count N, per W, burst B}`
//! is a GCRA refilled at (N − B + 1) per W (docs/semantics.md,
//! "Window-exact"), so 200 a second with a burst of 20 sends 181 a second
//! once its burst is spent, whoever sends; the pace is measured against that.
//!
//! Which runs, to keep the suite's time down: 2,000 jobs at a 50 ms round
//! trip on memory and at 150 ms on Redis (the issue's figures), and 600 at
//! the other round trip on each store (3 s of steady pace: the same check).

use crate::support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use support::backing::Backing;
use support::queue::{msgid, real_gate, submit_at, until_ended, wechat};
use support::redis_server::RedisServer;
use support::temp::TempDir;
use support::tokens::APPID;
use support::window::pace;
use support::{max_in_window, rule, ConfigToml, Gate, MockWeChat, Reply, Slots, PATIENCE};

const SEND: &str = "/cgi-bin/message/template/send";

/// The issue's rule: 200 sends a second, 20 at once.
const RATE: u64 = 200;
const BURST: u64 = 20;

/// What a rule of `count` a second with `burst` at once admits sustained
/// (per second).
fn sustained(count: u64, burst: u64) -> f64 {
    (count - burst + 1) as f64
}

/// The token rule and a template rule that queues, `rate` a second with
/// `burst` at once.
fn rules(rate: u64, burst: u64) -> String {
    let token = rule("token").matching("/cgi-bin/token").matching("/cgi-bin/stable_token").limit(2000, "day");
    let send = rule("template_send").matching(SEND).limit_burst(rate, "1s", burst).set("queue", true);
    format!("{token}\n{send}")
}

fn redis() -> Backing {
    Backing::Redis(RedisServer::start())
}

/// A mock WeChat answering each send after `rtt_ms` (its own counter of
/// sends answered beside it).
async fn wechat_after(rtt_ms: u64) -> (MockWeChat, Arc<AtomicUsize>) {
    let answered = Arc::new(AtomicUsize::new(0));
    let count = answered.clone();
    let (mock, _tokens) = wechat(move |_, n| {
        count.fetch_add(1, Ordering::SeqCst);
        Reply::Delayed { ms: rtt_ms, then: Box::new(msgid(n)) }
    })
    .await;
    (mock, answered)
}

/// Now as wxgate's time (microseconds since the epoch) and as an instant:
/// the mock's arrival instants read as wall-clock times.
fn epoch() -> (Instant, i64) {
    let us = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_micros();
    (Instant::now(), i64::try_from(us).expect("micros"))
}

/// What a campaign's run saw.
struct Campaign {
    /// The sends WeChat got, in arrival order: when, and the job's number.
    sends: Vec<(Instant, usize)>,
    /// Each job's `X-Wxgate-Eta` (wxgate's time), by its number.
    etas: HashMap<usize, i64>,
    /// `(instant, wall-clock µs)` at one moment before the run.
    epoch: (Instant, i64),
    summary: serde_json::Value,
}

impl Campaign {
    fn times(&self) -> Vec<Instant> {
        self.sends.iter().map(|(t, _)| *t).collect()
    }

    /// Jobs WeChat got more than once.
    fn duplicates(&self) -> usize {
        let mut seen = std::collections::HashSet::new();
        self.sends.iter().filter(|(_, n)| !seen.insert(*n)).count()
    }

    /// How far each job's send came after its ETA (seconds; negative: before
    /// it), sorted.
    fn eta_errors(&self) -> Vec<f64> {
        let (i0, w0) = self.epoch;
        let mut errors: Vec<f64> = self
            .sends
            .iter()
            .filter_map(|(t, n)| {
                let eta = self.etas.get(n)?;
                let at = w0 + i64::try_from(t.duration_since(i0).as_micros()).ok()?;
                Some((at - eta) as f64 / 1e6)
            })
            .collect();
        errors.sort_by(f64::total_cmp);
        errors
    }
}

/// `q`-quantile of sorted `xs`.
fn quantile(xs: &[f64], q: f64) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs[((xs.len() - 1) as f64 * q).round() as usize]
}

/// The job's number in a body `{"touser":"...","n":<n>}`.
fn number(body: &[u8]) -> usize {
    let json: serde_json::Value = serde_json::from_slice(body).expect("a job's body");
    json["n"].as_u64().expect("its number") as usize
}

/// `jobs` messages queued by one caller on `gate` at once (16 submissions
/// at a time), job `n` to recipient `to(n)`: each job's ETA.
async fn submit_all(gate: &Gate, jobs: usize, to: impl Fn(usize) -> String) -> HashMap<usize, i64> {
    let url = gate.url(&format!("/@{APPID}{SEND}"));
    let mut etas = HashMap::new();
    let mut submissions = tokio::task::JoinSet::new();
    for n in 0..jobs {
        let (url, body) = (url.clone(), format!(r#"{{"touser":"{}","n":{n}}}"#, to(n)));
        submissions.spawn(async move { (n, submit_at(url, "default", body, &[]).await) });
        while submissions.len() >= 16 || (n + 1 == jobs && !submissions.is_empty()) {
            let (n, a) = submissions.join_next().await.expect("a task").expect("submitted");
            assert_eq!(a.status, 202, "{}", a.text());
            if let Some(eta) = a.header("x-wxgate-eta").and_then(wxgate::time::parse_rfc3339) {
                etas.insert(n, eta);
            }
        }
    }
    etas
}

/// Waits until WeChat has answered `jobs` sends (real time: `jobs` at
/// `rate` and then some), then until every job ended: the run.
async fn drained(
    gate: &Gate,
    mock: &MockWeChat,
    answered: &AtomicUsize,
    jobs: usize,
    rate: u64,
    epoch: (Instant, i64),
    etas: HashMap<usize, i64>,
) -> Campaign {
    let limit = Duration::from_secs(jobs as u64 / rate * 3 + 30);
    support::eventually("every job at WeChat", limit, || answered.load(Ordering::SeqCst) >= jobs).await;
    let summary = until_ended(gate, "default", PATIENCE).await;
    let mut sends: Vec<(Instant, usize)> = mock
        .calls()
        .into_iter()
        .filter(|c| c.path_and_query.starts_with(SEND))
        .map(|c| (c.arrived, number(&c.body)))
        .collect();
    sends.sort_by_key(|(t, _)| *t);
    Campaign { sends, etas, epoch, summary }
}

/// One queue of `jobs` messages, each to its own recipient, under a rule of
/// [`RATE`] a second ([`BURST`] at once), WeChat answering after `rtt_ms`.
async fn campaign(backing: &Backing, rtt_ms: u64, jobs: usize) {
    let name = format!("{} {jobs} at {rtt_ms} ms", backing.name());
    let (mock, answered) = wechat_after(rtt_ms).await;
    let dir = TempDir::new(&format!("queue-pace-{}-{rtt_ms}", backing.name()));
    let gate = real_gate(backing, ConfigToml::new(&mock.url()), &dir, &rules(RATE, BURST), "", "").await;
    let epoch = epoch();
    let started = Instant::now();
    // Sends at WeChat at once, every 10 ms (how much of `rate × round
    // trip` the queue keeps there), until the run is over.
    let sampling = tokio_util::sync::CancellationToken::new();
    let sampler = tokio::spawn({
        let (mock, stop) = (mock.clone(), sampling.clone());
        async move {
            let mut samples = Vec::new();
            while !stop.is_cancelled() {
                samples.push((Instant::now(), mock.in_flight().0));
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            samples
        }
    });
    let etas = submit_all(&gate, jobs, |n| format!("o{n}")).await;
    let submitted = started.elapsed();
    let run = drained(&gate, &mock, &answered, jobs, RATE, epoch, etas).await;
    sampling.cancel();
    let samples = sampler.await.expect("samples");
    let times = run.times();
    let steady: Vec<usize> = samples
        .iter()
        .filter(|(t, _)| *t >= times[BURST as usize] && *t <= times[times.len() - 1])
        .map(|(_, n)| *n)
        .collect();
    println!(
        "queue_pace {name}: at WeChat at once on average {:.1} (the rule's rate × the round trip: {:.1})",
        steady.iter().sum::<usize>() as f64 / steady.len().max(1) as f64,
        sustained(RATE, BURST) * rtt_ms as f64 / 1000.0
    );
    let ratio = pace(&times, BURST as usize) / sustained(RATE, BURST);
    let busiest = max_in_window(&times, Duration::from_secs(1));
    let errors = run.eta_errors();
    let abs: Vec<f64> = {
        let mut a: Vec<f64> = errors.iter().map(|e| e.abs()).collect();
        a.sort_by(f64::total_cmp);
        a
    };
    let span = times.last().zip(times.first()).map(|(l, f)| (*l - *f).as_secs_f64()).unwrap_or(0.0);
    let after = times.partition_point(|t| *t < started + submitted);
    let mut seconds = vec![0usize; span.ceil() as usize + 1];
    for t in &times {
        seconds[(*t - times[0]).as_secs() as usize] += 1;
    }
    println!(
        "queue_pace {name}: after the submissions {:.3} of the rule over {} sends; sends per second {seconds:?}",
        pace(&times, after.min(times.len() - 1)) / sustained(RATE, BURST),
        times.len() - after
    );
    println!(
        "queue_pace {name}: pace {ratio:.3} of the rule's sustained rate ({:.3} of its count a second; {span:.2} s first to last send, submissions {:.2} s), busiest second {busiest}, at once at most {}, ETA error (send - ETA) median {:.2} s p90 |error| {:.2} s (signed p10 {:.2} p90 {:.2}), {} ETAs",
        ratio * sustained(RATE, BURST) / RATE as f64,
        submitted.as_secs_f64(),
        mock.in_flight().1,
        quantile(&errors, 0.5),
        quantile(&abs, 0.9),
        quantile(&errors, 0.1),
        quantile(&errors, 0.9),
        errors.len(),
    );
    assert_eq!(run.sends.len(), jobs, "{name}: each job sent once: {}", run.summary);
    assert_eq!(run.duplicates(), 0, "{name}: no job twice");
    assert_eq!((run.summary["sent"].as_u64(), run.summary["unknown"].as_u64()), (Some(jobs as u64), Some(0)), "{name}");
    assert!(busiest as u64 <= RATE + BURST, "{name}: {busiest} sends in one second at WeChat, over the rule");
    assert!(ratio >= 0.9, "{name}: the queue drains at {ratio:.3} of the rule's rate");
    // Each 202's ETA within a few seconds of the job's send (a steady
    // campaign): seen within 0.4 s on a quiet machine, 2.4 s at load 4.
    let late = quantile(&abs, 0.9);
    assert!(late <= 5.0, "{name}: ETAs {late:.2} s off the sends at p90");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_of_2000_drains_at_the_rules_pace_with_wechat_answering_after_50ms_on_memory() {
    campaign(&Backing::Memory, 50, 2000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_of_2000_drains_at_the_rules_pace_with_wechat_answering_after_150ms_on_redis() {
    campaign(&redis(), 150, 2000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_drains_at_the_rules_pace_with_wechat_answering_after_150ms_on_memory() {
    campaign(&Backing::Memory, 150, 600).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_drains_at_the_rules_pace_with_wechat_answering_after_50ms_on_redis() {
    campaign(&redis(), 50, 600).await;
}

/// A window of 20 a second with a burst of 1: every slot is its own, 50 ms
/// apart; the queue takes 0.9 of them. 200 jobs (10 s), not the issue's
/// 1,000 (50 s): the same check on a shorter run.
async fn small_burst(backing: &Backing) {
    const JOBS: usize = 200;
    const RATE: u64 = 20;
    let name = format!("{} burst 1", backing.name());
    let (mock, answered) = wechat_after(50).await;
    let dir = TempDir::new(&format!("queue-pace-burst-{}", backing.name()));
    let gate = real_gate(backing, ConfigToml::new(&mock.url()), &dir, &rules(RATE, 1), "", "").await;
    let epoch = epoch();
    let etas = submit_all(&gate, JOBS, |n| format!("o{n}")).await;
    let run = drained(&gate, &mock, &answered, JOBS, RATE, epoch, etas).await;
    let times = run.times();
    let ratio = pace(&times, 1) / sustained(RATE, 1);
    let busiest = max_in_window(&times, Duration::from_secs(1));
    println!("queue_pace {name}: {ratio:.3} of the window used, busiest second {busiest}");
    assert_eq!((run.sends.len(), run.duplicates()), (JOBS, 0), "{name}: each once");
    assert!(busiest as u64 <= RATE + 1, "{name}: {busiest} sends in one second at WeChat, over the rule");
    assert!(ratio >= 0.9, "{name}: {ratio:.3} of the window used");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_with_a_burst_of_one_is_used_at_least_nine_tenths_on_memory() {
    small_burst(&Backing::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_with_a_burst_of_one_is_used_at_least_nine_tenths_on_redis() {
    small_burst(&redis()).await;
}

/// 300 jobs to 10 recipients in turn: each recipient gets its messages in
/// the order they were submitted, and the queue still keeps the rule's
/// pace. WeChat answers after 20 ms: one recipient's messages go one at a
/// time, so 10 recipients can reach 500 a second, past the rule's 181.
async fn per_recipient(backing: &Backing) {
    const JOBS: usize = 300;
    const RECIPIENTS: usize = 10;
    let name = format!("{} 10 recipients", backing.name());
    let (mock, answered) = wechat_after(20).await;
    let dir = TempDir::new(&format!("queue-pace-order-{}", backing.name()));
    let gate = real_gate(backing, ConfigToml::new(&mock.url()), &dir, &rules(RATE, BURST), "", "").await;
    let epoch = epoch();
    // Each recipient's jobs submitted one after another (their order is
    // the submission order), the recipients side by side.
    let url = gate.url(&format!("/@{APPID}{SEND}"));
    let tasks = (0..RECIPIENTS).map(|r| {
        let url = url.clone();
        async move {
            for n in (r..JOBS).step_by(RECIPIENTS) {
                let a = submit_at(url.clone(), "default", format!(r#"{{"touser":"r{r}","n":{n}}}"#), &[]).await;
                assert_eq!(a.status, 202, "{}", a.text());
            }
        }
    });
    futures_util::future::join_all(tasks).await;
    let run = drained(&gate, &mock, &answered, JOBS, RATE, epoch, HashMap::new()).await;
    let ratio = pace(&run.times(), BURST as usize) / sustained(RATE, BURST);
    println!("queue_pace {name}: pace {ratio:.3} of the rule, at once at most {}", mock.in_flight().1);
    assert_eq!((run.sends.len(), run.duplicates()), (JOBS, 0), "{name}: each once");
    for r in 0..RECIPIENTS {
        let got: Vec<usize> = run.sends.iter().map(|(_, n)| *n).filter(|n| n % RECIPIENTS == r).collect();
        let want: Vec<usize> = (r..JOBS).step_by(RECIPIENTS).collect();
        assert_eq!(got, want, "{name}: recipient r{r} gets its messages in the order sent");
    }
    assert!(ratio >= 0.9, "{name}: {ratio:.3} of the rule's rate");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_recipient_gets_its_messages_in_order_at_the_rules_pace_on_memory() {
    per_recipient(&Backing::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_recipient_gets_its_messages_in_order_at_the_rules_pace_on_redis() {
    per_recipient(&redis()).await;
}

/// How long the window may take to find WeChat's ceiling.
const SETTLING: Duration = Duration::from_secs(5);

/// WeChat answers 45033 (at once) to a call past 8 at once, the others
/// after 50 ms; the rule (200 a second) would need 10: within
/// [`SETTLING`] of the first send the queue keeps at most 8 under way and
/// WeChat refuses none; every job is sent once. The config has no
/// `[[penalty]]`: the default one for 45033 applies (2 s, doubling).
async fn concurrency_ceiling(backing: &Backing) {
    const JOBS: usize = 1000;
    const CEILING: usize = 8;
    let name = format!("{} 45033 past 8", backing.name());
    let slots = Slots::new(CEILING);
    let limited = slots.clone();
    let (mock, _tokens) = wechat(move |_, n| Reply::Limited {
        slots: limited.clone(),
        then: Box::new(Reply::Delayed { ms: 50, then: Box::new(msgid(n)) }),
        over: Box::new(Reply::Json {
            body: r#"{"errcode":45033,"errmsg":"api concurrent out of limit"}"#.into(),
            content_type: "application/json; encoding=utf-8",
        }),
    })
    .await;
    let dir = TempDir::new(&format!("queue-pace-45033-{}", backing.name()));
    let gate = real_gate(backing, ConfigToml::new(&mock.url()), &dir, &rules(RATE, BURST), "", "").await;
    submit_all(&gate, JOBS, |n| format!("o{n}")).await;
    let taken = || slots.seen().iter().filter(|c| !c.over).count();
    // Until every job is taken, or a 45033 past the settling shows it did not settle.
    let unsettled = || {
        let seen = slots.seen();
        seen.first().is_some_and(|first| seen.iter().any(|c| c.over && c.arrived - first.arrived >= SETTLING))
    };
    support::eventually("every job taken by WeChat", Duration::from_secs(60), || taken() >= JOBS || unsettled()).await;
    let seen = slots.seen();
    let first = seen.first().map(|c| c.arrived).expect("sends");
    let refused: Vec<f64> = seen.iter().filter(|c| c.over).map(|c| (c.arrived - first).as_secs_f64()).collect();
    let (taken_n, last) = (taken(), seen.last().map(|c| (c.arrived - first).as_secs_f64()).unwrap_or(0.0));
    let late: Vec<&f64> = refused.iter().filter(|t| **t >= SETTLING.as_secs_f64()).collect();
    println!(
        "queue_pace {name}: {} refused 45033 (at {:?} s after the first send), {} after {SETTLING:?}; {taken_n} of {JOBS} taken in {last:.2} s ({:.1} a second)",
        refused.len(),
        refused.iter().map(|t| (t * 100.0).round() / 100.0).collect::<Vec<_>>(),
        late.len(),
        taken_n as f64 / last.max(0.001),
    );
    assert!(late.is_empty(), "{name}: 45033s go on after {SETTLING:?}: at {late:?} s");
    let summary = until_ended(&gate, "default", PATIENCE).await;
    assert_eq!(
        (summary["sent"].as_u64(), summary["unknown"].as_u64()),
        (Some(JOBS as u64), Some(0)),
        "{name}: {summary}"
    );
    assert_eq!(taken(), JOBS, "{name}: each job taken by WeChat once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wechat_refusing_calls_past_8_at_once_gets_at_most_8_and_its_45033s_stop_on_memory() {
    concurrency_ceiling(&Backing::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wechat_refusing_calls_past_8_at_once_gets_at_most_8_and_its_45033s_stop_on_redis() {
    concurrency_ceiling(&redis()).await;
}

/// WeChat answers each send after 8 s; the dispatcher's lease is 5 s (it
/// renews the leases of the sends under way): every job ends `sent`, none
/// `unknown`, each sent once.
async fn slower_than_the_lease(backing: &Backing) {
    const JOBS: usize = 4;
    let (mock, answered) = wechat_after(8_000).await;
    let dir = TempDir::new(&format!("queue-pace-lease-{}", backing.name()));
    let config = ConfigToml::new(&mock.url()).server("upstream_timeout", "30s");
    let gate = real_gate(backing, config, &dir, &rules(RATE, BURST), "lease = \"5s\"", "").await;
    submit_all(&gate, JOBS, |n| format!("o{n}")).await;
    support::eventually("every job at WeChat", Duration::from_secs(30), || answered.load(Ordering::SeqCst) >= JOBS)
        .await;
    let summary = until_ended(&gate, "default", Duration::from_secs(30)).await;
    let name = backing.name();
    assert_eq!(
        (summary["sent"].as_u64(), summary["unknown"].as_u64()),
        (Some(JOBS as u64), Some(0)),
        "{name}: {summary}"
    );
    let sends = mock.calls().iter().filter(|c| c.path_and_query.starts_with(SEND)).count();
    assert_eq!(sends, JOBS, "{name}: each sent once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_slower_than_the_lease_end_every_job_sent_and_none_unknown() {
    // The stores at once: each waits out 8 s answers.
    let (memory, redis) = (Backing::Memory, redis());
    tokio::join!(slower_than_the_lease(&memory), slower_than_the_lease(&redis));
}
