//! Only calls WeChat could have counted are counted, over real sockets: a
//! call that provably never reached the upstream (connection refused, no
//! connection within `upstream_timeout`, TLS handshake failed) gives back
//! what it took from its rule's limits before its 502/504 is answered; a
//! call that reached it (a timeout after the request was sent) keeps its
//! count. Memory and Redis stores.

use crate::support;

use support::ports::{ClosedPort, SilentPort, StalledPort};
use support::redis_server::RedisServer;
use support::*;

const SEND: &str = "/cgi-bin/message/custom/send?access_token=T";

/// 3 calls a day on /cgi-bin/message/custom/send.
fn day_rule() -> RuleToml {
    rule("send").matching("/cgi-bin/message/custom/send").limit(3, "day")
}

/// `/v1/buckets/wxA/send`: the day quota's `used` and `remaining`.
async fn day_quota(gate: &Gate) -> (u64, u64) {
    let b = get_at(gate.admin_addr(), "/v1/buckets/wxA/send").await;
    assert_eq!(b.status, 200, "{}", b.text());
    let v = b.json();
    let day = &v["limits"][0];
    (day["used"].as_u64().expect("used"), day["remaining"].as_u64().expect("remaining"))
}

/// `wxgate_refunds_total{rule="send"}` (0 if not exposed yet).
async fn refunds(gate: &Gate) -> f64 {
    let m = get_at(gate.admin_addr(), "/metrics").await;
    sample(&m.text(), "wxgate_refunds_total{rule=\"send\"}").unwrap_or(0.0)
}

/// Five calls to a port that refuses connections all fail with 502 and
/// leave the day quota whole; once WeChat answers on that port, the full
/// quota of 3 goes through and the 4th is refused.
async fn refused_connections_give_the_day_back(gate: &Gate, port: ClosedPort) {
    for i in 0..5 {
        let a = gate.get_as("wxA", SEND).await;
        assert_eq!(a.status, 502, "call {i}: {}", a.text());
        assert_eq!(a.json()["errcode"], -1);
    }
    assert_eq!(day_quota(gate).await, (0, 3), "no call reached WeChat: nothing used");
    assert_eq!(refunds(gate).await, 5.0);

    let mock = port.open();
    for i in 0..3 {
        assert_eq!(gate.get_as("wxA", SEND).await.status, 200, "call {i} once WeChat answers");
    }
    let a = gate.get_as("wxA", SEND).await;
    assert_eq!((a.status.as_u16(), a.header("x-wxgate-reason")), (429, Some("quota")));
    assert_eq!(mock.count(), 3, "WeChat saw exactly the day quota");
    assert_eq!(day_quota(gate).await, (3, 0));
}

#[tokio::test]
async fn refused_connections_give_the_day_quota_back_memory_store() {
    let port = ClosedPort::new();
    let gate = Gate::start_text(ConfigToml::new(&port.url()).with(day_rule())).await;
    refused_connections_give_the_day_back(&gate, port).await;
}

#[tokio::test]
async fn refused_connections_give_the_day_quota_back_redis_store() {
    let redis = RedisServer::start();
    let port = ClosedPort::new();
    let gate =
        Gate::start_real_text(ConfigToml::new(&port.url()).with(StoreToml::redis(&redis.url())).with(day_rule())).await;
    refused_connections_give_the_day_back(&gate, port).await;
    let used = redis.state_field("wxgate:{wxA}:send", "day.n");
    assert_eq!(used, Some(3), "the count lives in Redis");
}

#[tokio::test]
async fn a_timeout_after_the_request_was_sent_keeps_its_count() {
    for store in [None, Some(RedisServer::start())] {
        let mock = MockWeChat::start().await;
        // WeChat receives the call and never answers.
        mock.respond(|_| Reply::Hang);
        let mut config = ConfigToml::new(&mock.url()).server("upstream_timeout", "300ms");
        if let Some(redis) = &store {
            config = config.with(StoreToml::redis(&redis.url()).per_call());
        }
        let gate = Gate::start_real_text(config.with(day_rule())).await;
        let a = gate.get_as("wxA", SEND).await;
        assert_eq!(a.status, 504, "{}", a.text());
        assert_eq!(mock.count(), 1, "the call reached WeChat");
        assert_eq!(day_quota(&gate).await, (1, 2), "WeChat may have counted it: so does wxgate");
        assert_eq!(refunds(&gate).await, 0.0);
    }
}

#[tokio::test]
async fn no_connection_within_upstream_timeout_gives_the_day_quota_back() {
    // Connections to this port are never accepted (its accept queue is full).
    let port = StalledPort::new().await;
    let gate =
        Gate::start_text(ConfigToml::new(&port.url()).server("upstream_timeout", "300ms").with(day_rule())).await;
    for i in 0..2 {
        let a = gate.get_as("wxA", SEND).await;
        // The connector's own connect timeout and upstream_timeout are the
        // same length: either may end the attempt (502 or 504).
        assert!([502, 504].contains(&a.status.as_u16()), "call {i}: {} {}", a.status, a.text());
    }
    assert_eq!(day_quota(&gate).await, (0, 3), "never connected: nothing used");
    assert_eq!(refunds(&gate).await, 2.0);
}

#[tokio::test]
async fn a_failed_tls_handshake_gives_the_day_quota_back() {
    // wxgate speaks TLS to a plain-HTTP server: the handshake fails before
    // any byte of the request is written.
    let mock = MockWeChat::start().await;
    let gate = Gate::start_text(ConfigToml::new(&format!("https://{}", mock.addr)).with(day_rule())).await;
    let a = gate.get_as("wxA", SEND).await;
    assert_eq!(a.status, 502, "{}", a.text());
    assert_eq!(mock.count(), 0);
    assert_eq!(day_quota(&gate).await, (0, 3));
    assert_eq!(refunds(&gate).await, 1.0);
}

#[tokio::test]
async fn a_tls_handshake_unfinished_within_upstream_timeout_gives_the_day_quota_back() {
    // TCP connects, the server never answers the ClientHello: upstream_timeout
    // ends the attempt before the request was handed to a connection.
    let port = SilentPort::new();
    let config = ConfigToml::new(&format!("https://127.0.0.1:{}", port.port))
        .server("upstream_timeout", "300ms")
        .with(day_rule());
    let gate = Gate::start_text(config).await;
    let a = gate.get_as("wxA", SEND).await;
    assert_eq!(a.status, 504, "{}", a.text());
    assert!(a.json()["errmsg"].as_str().is_some_and(|m| m.contains("connection")), "{}", a.text());
    assert_eq!(day_quota(&gate).await, (0, 3));
    assert_eq!(refunds(&gate).await, 1.0);
}

/// A message counted by its recipients that never reached WeChat gives back
/// all it cost: a refused connection leaves the day's person-times whole,
/// on the memory store and on Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_never_reached_wechat_gives_back_every_recipient_it_cost() {
    let redis = RedisServer::start();
    let rule = "[[rule]]\nname = \"message_send\"\nmatch = [\"/cgi-bin/message/send\"]\n\
                limits = [{ count = 5, per = \"day\" }]\ncost = \"recipients\"\n\
                recipients = { field = \"touser\", separator = \"|\" }\n";
    for redis_store in [false, true] {
        let port = ClosedPort::new();
        let config = ConfigToml::new(&port.url()).with(rule);
        let gate = if redis_store {
            Gate::start_real_text(config.with(StoreToml::redis(&redis.url()).set("key_prefix", "refund32"))).await
        } else {
            Gate::start_text(config).await
        };
        let send = "/cgi-bin/message/send?access_token=T";
        for _ in 0..3 {
            assert_eq!(gate.post(send, r#"{"touser":"a|b|c|d"}"#).await.status, 502);
        }
        let mock = port.open();
        // All 5 person-times are left: 4, then 1, then none.
        assert_eq!(gate.post(send, r#"{"touser":"a|b|c|d"}"#).await.status, 200, "redis: {redis_store}");
        assert_eq!(gate.post(send, r#"{"touser":"e"}"#).await.status, 200, "redis: {redis_store}");
        assert_eq!(gate.post(send, r#"{"touser":"f"}"#).await.header("x-wxgate-reason"), Some("quota"));
        assert_eq!(mock.count(), 2);
    }
}
