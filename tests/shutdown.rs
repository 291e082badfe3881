//! Graceful shutdown of the real binary on SIGTERM/SIGINT: stop accepting,
//! let calls in flight and held calls finish, release concurrency slots,
//! exit 0; and cut off what is still running at the deadline.

use crate::support;

use std::time::{Duration, Instant};

use support::process;
use support::redis_server::RedisServer;
use support::*;

/// Whether a new connection is refused (the listener is closed).
async fn refuses(addr: std::net::SocketAddr) -> bool {
    tokio::net::TcpStream::connect(addr).await.is_err()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_calls_in_flight_finish_then_exits_zero() {
    let mock = MockWeChat::start().await;
    let permits = mock.hold_replies(ok_reply());
    let rules = rule("tpl").matching("/cgi-bin/message/template/send");
    let mut gate = process::spawn(&config_text(&mock.url(), rules), "term", &[]).expect("serving");
    let addr = gate.addr;
    let in_flight = tokio::spawn(async move { get_at(addr, "/cgi-bin/message/template/send").await });
    eventually("the call reaching WeChat", PATIENCE, || mock.count() >= 1).await;
    gate.signal("-TERM");
    eventually_async("the listener closing after SIGTERM", PATIENCE, async || refuses(addr).await).await;
    assert!(gate.is_running(), "waits for the call in flight");
    permits.add_permits(1);
    assert_eq!(in_flight.await.expect("call").status, 200, "the call in flight got its answer");
    assert_eq!(gate.exit_code(PATIENCE).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_lets_a_held_call_go_out_before_exiting() {
    let mock = MockWeChat::start().await;
    // 2 per 2 s, burst 1: the second call is held about a second.
    let rules = rule("tpl").matching("/cgi-bin/message/template/send").limit_burst(2, "2s", 1).max_wait("5s");
    let mut gate = process::spawn(&config_text(&mock.url(), rules), "int", &[]).expect("serving");
    let addr = gate.addr;
    assert_eq!(get_at(addr, "/cgi-bin/message/template/send").await.status, 200);
    let held = tokio::spawn(async move { get_at(addr, "/cgi-bin/message/template/send").await });
    eventually_async("the second call held", PATIENCE, async || gate.metric("wxgate_held").await == Some(1.0)).await;
    assert_eq!(mock.count(), 1, "the second call is being held");
    gate.signal("-INT");
    assert_eq!(held.await.expect("held call").status, 200, "the held call went out");
    assert_eq!(mock.count(), 2);
    assert_eq!(gate.exit_code(PATIENCE).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_concurrency_slots_in_redis() {
    let redis = RedisServer::start();
    let mock = MockWeChat::start().await;
    let permits = mock.hold_replies(ok_reply());
    let store = StoreToml::redis(&redis.url());
    let remark = rule("remark").matching("/cgi-bin/externalcontact/remark").concurrency(5);
    let config = ConfigToml::new(&mock.url()).with(store).with(remark).to_string();
    let mut gate = process::spawn(&config, "slots", &[]).expect("serving");
    let addr = gate.addr;
    let calls: Vec<_> =
        (0..3).map(|_| tokio::spawn(async move { get_at(addr, "/cgi-bin/externalcontact/remark").await })).collect();
    eventually("the calls reaching WeChat", PATIENCE, || mock.count() >= 3).await;
    assert!(redis.command("ZCARD wxgate:{default}:remark:c").contains(":3"), "three slots taken");
    gate.signal("-TERM");
    permits.add_permits(3);
    for c in calls {
        assert_eq!(c.await.expect("call").status, 200);
    }
    assert_eq!(gate.exit_code(PATIENCE).await, 0);
    let left = redis.command("ZCARD wxgate:{default}:remark:c");
    assert!(left.contains(":0"), "every slot released before exit, not left to its lease: {left}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_still_running_at_the_deadline_are_cut_off() {
    let mock = MockWeChat::start().await;
    mock.respond(|_| Reply::Hang);
    let text =
        ConfigToml::new(&mock.url()).server("shutdown_timeout", "300ms").server("upstream_timeout", "60s").to_string();
    let mut gate = process::spawn(&text, "deadline", &[]).expect("serving");
    let addr = gate.addr;
    let hanging = tokio::spawn(async move {
        let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http::<http_body_util::Full<bytes::Bytes>>();
        let req = http::Request::get(format!("http://{addr}/cgi-bin/anything")).body(Default::default()).expect("req");
        client.request(req).await.map(|r| r.status())
    });
    eventually("the call reaching WeChat", PATIENCE, || mock.count() >= 1).await;
    let signalled = Instant::now();
    gate.signal("-TERM");
    assert_eq!(gate.exit_code(PATIENCE).await, 0);
    assert!(signalled.elapsed() < Duration::from_secs(5), "exited at the deadline, not when the call ended");
    assert!(hanging.await.expect("task").is_err(), "the cut-off call sees its connection close");
}
