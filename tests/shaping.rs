//! Holding calls for their reserved slot (max_wait), the per-instance bound
//! on held calls, clients that leave while held, and concurrency caps, all
//! through a real listener.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use support::*;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// 10 per 10 s, burst 1: one call a second, held up to 3 s for its slot.
fn shaped() -> RuleToml {
    rule("tpl").matching("/cgi-bin/message/template/send").limit_burst(10, "10s", 1).max_wait("3s")
}
const PATH: &str = "/cgi-bin/message/template/send?access_token=T";

/// Calls held for their slot on rule "tpl" (account "default").
fn held_now(gate: &Gate) -> u32 {
    gate.held("default", "tpl")
}

/// Issue 44, item 18: held calls were released at exactly their window's
/// edge, and the few milliseconds from decision to WeChat, different for
/// each call, then put six calls of a 5-per-second window within less than
/// a second where WeChat counts (996.8 ms at the shortest). With the
/// arrival margin no window at the upstream's door holds more than its
/// count. (Real time: the jitter is the point. 100 ms here, far above the
/// spread of a loaded test machine; with `window_margin = "0s"`, the code
/// before the margin, this test fails.)
#[tokio::test]
async fn held_calls_reach_wechat_no_closer_together_than_their_window_allows() {
    let mock = MockWeChat::start().await;
    let path = "/cgi-bin/message/template/send?access_token=T";
    let rule = rule("tpl").matching("/cgi-bin/message/template/send").limit_burst(5, "1s", 1).max_wait("5s");
    let config = ConfigToml::new(&mock.url()).server("window_margin", "100ms").with(rule);
    let gate = Arc::new(Gate::start_real_text(config).await);
    let callers: Vec<_> = (0..4)
        .map(|_| {
            let g = gate.clone();
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                for _ in 0..4 {
                    statuses.push(g.get(path).await.status);
                }
                statuses
            })
        })
        .collect();
    for caller in callers {
        assert_eq!(caller.await.expect("caller"), vec![200; 4], "every call is held, then forwarded");
    }
    let mut arrivals: Vec<std::time::Instant> = mock.calls().iter().map(|c| c.arrived).collect();
    arrivals.sort();
    assert_eq!(arrivals.len(), 16);
    let (most, from) = busiest_window(&arrivals, Duration::from_secs(1));
    let gaps: Vec<u128> = arrivals.windows(2).map(|p| (p[1] - p[0]).as_millis()).collect();
    assert!(most <= 5, "{most} calls reached WeChat within 1 s (from {from:?}); gaps in ms: {gaps:?}");
}

#[tokio::test]
async fn a_held_call_is_forwarded_exactly_at_its_reserved_time() {
    let mock = MockWeChat::start().await;
    let gate = Arc::new(Gate::start(&mock, shaped()).await);
    assert_eq!(gate.get(PATH).await.status, 200);
    // 10 per 10 s, burst 1: the next slot is 1 s away, within max_wait.
    let g = gate.clone();
    let held = tokio::spawn(async move { g.get(PATH).await });
    let g = gate.clone();
    let held_later = tokio::spawn(async move { g.get(PATH).await });
    eventually("both calls held", PATIENCE, || held_now(&gate) == 2).await;
    assert_eq!(mock.count(), 1, "held, not forwarded yet");
    gate.advance(Duration::from_millis(999));
    gate.settle().await;
    assert_eq!(held_now(&gate), 2, "a millisecond early: both still held");
    assert_eq!(mock.count(), 1, "a millisecond early is still early");
    gate.advance(Duration::from_millis(1));
    let a = held.await.expect("held call");
    assert_eq!(a.status, 200);
    assert_eq!(mock.count(), 2);
    // The other one reserved the slot after it: 2 s after the first call.
    gate.advance(Duration::from_millis(1000));
    assert_eq!(held_later.await.expect("second held call").status, 200);
    assert_eq!(mock.count(), 3);
}

#[tokio::test]
async fn a_slot_beyond_max_wait_is_refused_at_once() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start(&mock, shaped().max_wait("500ms")).await;
    assert_eq!(gate.get(PATH).await.status, 200);
    let a = gate.get(PATH).await;
    assert_eq!((a.status.as_u16(), a.header("x-wxgate-reason")), (429, Some("rate")));
    assert_eq!(a.retry_after(), 1);
    // Nothing was reserved: after 600 ms the next call waits only 400 ms.
    gate.advance(Duration::from_millis(600));
    let g = Arc::new(gate);
    let g2 = g.clone();
    let held_call = tokio::spawn(async move { g2.get(PATH).await });
    eventually("the call held", PATIENCE, || held_now(&g) == 1).await;
    g.advance(Duration::from_millis(399));
    g.settle().await;
    assert_eq!((held_now(&g), mock.count()), (1, 1), "held for 400 ms, not less");
    g.advance(Duration::from_millis(1));
    assert_eq!(held_call.await.expect("held").status, 200);
}

#[tokio::test]
async fn held_calls_per_instance_are_bounded_and_a_client_leaving_frees_its_place() {
    let mock = MockWeChat::start().await;
    let gate = Arc::new(Gate::start_text(ConfigToml::new(&mock.url()).server("max_held", 1).with(shaped())).await);
    assert_eq!(gate.get(PATH).await.status, 200);
    // A raw client whose call gets held, then goes away.
    let mut leaver = TcpStream::connect(gate.addr).await.expect("connect");
    leaver.write_all(format!("GET {PATH} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes()).await.expect("write");
    eventually("the leaver's call held", PATIENCE, || held_now(&gate) == 1).await;
    assert_eq!(gate.held_places(), 1);
    // The one place for a held call is taken: a call that would wait is refused.
    let a = gate.get(PATH).await;
    assert_eq!(a.status, 429, "max_held = 1 is in use by the held call");
    drop(leaver);
    eventually("the leaver's place freed", PATIENCE, || gate.held_places() == 0).await;
    assert_eq!(held_now(&gate), 0);
    let metrics = get_at(gate.admin_addr(), "/metrics").await.text();
    assert_eq!(sample(&metrics, "wxgate_held"), Some(0.0), "the held gauge counts the leaver out: {metrics}");
    // Its place is free again: this call is held (for the slot after the
    // abandoned one, which stays used) and goes when its time comes.
    let g = gate.clone();
    let held_call = tokio::spawn(async move { g.get(PATH).await });
    eventually("the next call held", PATIENCE, || held_now(&gate) == 1).await;
    gate.advance(Duration::from_millis(1000));
    gate.settle().await;
    assert_eq!(held_now(&gate), 1, "still held: its slot is the one after the abandoned call's");
    assert_eq!(mock.count(), 1, "the abandoned call was never sent, and its slot was not reused");
    gate.advance(Duration::from_millis(1000));
    assert_eq!(held_call.await.expect("held").status, 200);
    assert_eq!(mock.count(), 2);
}

#[tokio::test]
async fn a_client_that_closes_its_sending_side_gets_429_at_once_instead_of_a_hold() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start(&mock, shaped()).await;
    assert_eq!(gate.get(PATH).await.status, 200);
    // The next slot is 1 s away, so this call would be held; its client
    // half-closes right after the request. (The clock never moves: only the
    // close can end the wait.)
    let ex = exchange_half_closed(gate.addr, format!("GET {PATH} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes()).await;
    let a = ex.only();
    assert_eq!(a.status, 429, "{}", ex.text());
    assert_eq!(a.header("x-wxgate-reason"), Some("rate"));
    assert_eq!(a.header("retry-after"), Some("1"));
    assert_eq!(a.json()["errcode"], 45009);
    assert_eq!(mock.count(), 1, "the call that would have been held is never sent");
    assert_eq!(held_now(&gate), 0);
    let metrics = get_at(gate.admin_addr(), "/metrics").await.text();
    assert_eq!(sample(&metrics, "wxgate_held"), Some(0.0), "the held gauge is back to 0: {metrics}");
}

/// No limits, three calls at WeChat at once.
fn capped() -> RuleToml {
    rule("remark").matching("/cgi-bin/externalcontact/remark").concurrency(3)
}

#[tokio::test]
async fn over_the_concurrency_cap_calls_are_refused_without_max_wait() {
    let mock = MockWeChat::start().await;
    let permits = mock.hold_replies(ok_reply());
    let gate = Arc::new(Gate::start_real(&mock, capped()).await);
    let mut calls = Vec::new();
    for _ in 0..3 {
        let g = gate.clone();
        calls.push(tokio::spawn(async move { g.get("/cgi-bin/externalcontact/remark").await }));
    }
    eventually("three calls in flight at WeChat", PATIENCE, || mock.in_flight().0 >= 3).await;
    let a = gate.get("/cgi-bin/externalcontact/remark").await;
    assert_eq!(a.status, 429);
    assert_eq!(a.header("x-wxgate-reason"), Some("concurrency"));
    assert_eq!(a.json()["errcode"], 45009);
    permits.add_permits(3);
    for c in calls {
        assert_eq!(c.await.expect("call").status, 200);
    }
    assert_eq!(mock.in_flight().1, 3);
    // The slots came back when the answers were relayed.
    permits.add_permits(1);
    assert_eq!(gate.get("/cgi-bin/externalcontact/remark").await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_load_never_exceeds_the_concurrency_cap_and_waits_for_slots() {
    let mock = MockWeChat::start().await;
    mock.respond(|_| Reply::Delayed { ms: 30, then: Box::new(ok_reply()) });
    let gate = Arc::new(Gate::start_real(&mock, capped().max_wait("10s")).await);
    let mut calls = Vec::new();
    for _ in 0..24 {
        let g = gate.clone();
        calls.push(tokio::spawn(async move { g.get("/cgi-bin/externalcontact/remark").await }));
    }
    for c in calls {
        assert_eq!(c.await.expect("call").status, 200, "every call waited for a slot");
    }
    assert_eq!(mock.count(), 24);
    let (_, max) = mock.in_flight();
    assert!(max <= 3, "the mock saw {max} calls in flight at once");
    assert_eq!(max, 3, "the cap was used");
}

#[tokio::test]
async fn a_token_refresh_through_wxgate_restarts_the_warm_up() {
    let mock = MockWeChat::start().await;
    mock.respond(|r| {
        if r.path_and_query.starts_with("/cgi-bin/token") {
            Reply::Json { body: r#"{"access_token":"ACCESS","expires_in":7200}"#.into(), content_type: "text/plain" }
        } else {
            ok_reply()
        }
    });
    let rules = rule("tpl").matching("/cgi-bin/message/template/send").limit_burst(10, "10s", 1).warmup("10s");
    let gate = Gate::start(&mock, rules).await;
    // Cold start, then calls through the 10 s warm-up: afterwards, one per second.
    assert_eq!(gate.get_as("appA", PATH).await.status, 200);
    gate.advance(Duration::from_secs(5));
    assert_eq!(gate.get_as("appA", PATH).await.status, 200);
    gate.advance(Duration::from_secs(5));
    assert_eq!(gate.get_as("appA", PATH).await.status, 200);
    assert_eq!(gate.get_as("appA", PATH).await.retry_after(), 1);
    gate.advance(Duration::from_secs(1));
    // The account's token is refreshed through wxgate...
    let t = gate.get_as("appA", "/cgi-bin/token?grant_type=client_credential&appid=appA&secret=S").await;
    assert_eq!(t.status, 200);
    // ...so its rules ramp up again: one every 2 s right after it.
    assert_eq!(gate.get_as("appA", PATH).await.status, 200);
    let a = gate.get_as("appA", PATH).await;
    assert_eq!((a.status.as_u16(), a.retry_after()), (429, 2));
    // Another account's warm-up is untouched.
    assert_eq!(gate.get_as("appB", PATH).await.status, 200);
}

/// A busy machine's scheduler wakes timers late, and held calls go out
/// late (issue 61, item 9: at load ~4 on 2 cores, 53 calls within 1.94 s
/// of a window of 50 per 2 s at WeChat; 20 ms of margin covers a quiet
/// machine only). wxgate measures its scheduler's lateness and decides
/// every window with a margin that covers it, up to `window_margin_max`:
/// here a wxgate process whose threads run on one core at idle priority
/// beside three busy loops on that core (bounded: they stop by themselves)
/// widens its margin from 20 ms to at most 500 ms, shows it, and logs why.
#[tokio::test]
async fn a_late_scheduler_widens_the_window_margin_within_window_margin_max() {
    let mock = MockWeChat::start().await;
    let rule = rule("tpl").matching("/cgi-bin/message/template/send").limit_burst(50, "2s", 5);
    let config = ConfigToml::new(&mock.url())
        .without_server("window_margin")
        .without_server("window_margin_max")
        .server("workers", 1)
        .with(rule);
    let gate = support::process::spawn(&config.to_string(), "late-scheduler", &[]).expect("serving");
    let margin = "wxgate_window_margin_seconds";
    eventually_async("the configured margin shown", PATIENCE, async || gate.metric(margin).await == Some(0.02)).await;
    let pid = gate.pid().to_string();
    let run = |args: &[&str]| {
        let ok = std::process::Command::new(args[0])
            .args(&args[1..])
            .stdout(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "{args:?}");
    };
    run(&["taskset", "-a", "-p", "-c", "0", &pid]);
    run(&["chrt", "-a", "-i", "-p", "0", &pid]);
    let mut busy: Vec<std::process::Child> = (0..3)
        .map(|_| {
            std::process::Command::new("timeout")
                .args(["60", "taskset", "-c", "0", "sh", "-c", "while :; do :; done"])
                .spawn()
                .expect("a busy loop")
        })
        .collect();
    // Read from its log while it starves (an HTTP request to it would
    // wait for the core), then from /metrics once the loops are gone.
    eventually("the margin widened, logged", Duration::from_secs(60), || {
        gate.logged().contains("every window is decided as if window_margin were")
    })
    .await;
    // SIGTERM: `timeout` passes it on to its loop (a SIGKILL would leave
    // the loop running until its 60 s are over).
    for b in &mut busy {
        support::process::signal(b.id(), "-TERM");
        let _ = b.wait();
    }
    let widened = gate.metric(margin).await.unwrap_or_default();
    assert!((0.05..=0.5).contains(&widened), "widened to {widened} s, within window_margin_max (500 ms)");
    let late = gate.metric("wxgate_scheduler_late_seconds").await.unwrap_or_default();
    assert!(late * 1.5 > 0.02, "the lateness that widened it: {late} s");
    assert!(gate.logged().contains("scheduler ran late"), "{}", gate.logged());
}
