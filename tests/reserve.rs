//! `reserve = "P%"` through real listeners, on both stores: a normal caller
//! is refused (reason `reserve`, an honest `Retry-After`) when what is left
//! of a limit is the reserve, a high caller still gets through, and once the
//! limit is spent everyone is told the limit's own reason.

use crate::support;

use std::time::Duration;

use support::redis_server::RedisServer;
use support::*;

const SEND: &str = "/cgi-bin/message/template/send";

/// 10 per 10 s with burst 5 (one every 1.67 s), 20 a day; 20 % kept for `hr`.
fn config() -> String {
    format!(
        "{}\n{}\n{}",
        caller("hr").high(),
        caller("marketing"),
        rule("template").matching(SEND).limit_burst(10, "10s", 5).limit(20, "day").set("reserve", "20%"),
    )
}

async fn the_reserve_is_kept_for_the_high_caller(gate: &Gate, mock: &MockWeChat) {
    for _ in 0..4 {
        assert_eq!(gate.get_as_caller("marketing", SEND).await.status, 200);
    }
    let kept = gate.get_as_caller("marketing", SEND).await;
    assert_eq!((kept.status.as_u16(), kept.header("x-wxgate-reason")), (429, Some("reserve")), "{}", kept.text());
    assert_eq!(kept.retry_after(), 2, "1.67 s until a normal call leaves the reserve");
    assert!(kept.text().contains("reserve"), "{}", kept.text());
    // An undeclared caller is normal too.
    assert_eq!(gate.get_as_caller("someone", SEND).await.header("x-wxgate-reason"), Some("reserve"));
    // The high caller takes the call kept back for it.
    assert_eq!(gate.get_as_caller("hr", SEND).await.status, 200);
    let spent = gate.get_as_caller("hr", SEND).await;
    assert_eq!(spent.header("x-wxgate-reason"), Some("rate"), "spent for everyone");
    assert_eq!(gate.get_as_caller("marketing", SEND).await.header("x-wxgate-reason"), Some("rate"));
    assert_eq!(mock.count(), 5, "exactly the window's burst reached WeChat");
}

#[tokio::test]
async fn a_normal_caller_leaves_the_reserve_to_a_high_one_memory_store() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start(&mock, config()).await;
    the_reserve_is_kept_for_the_high_caller(&gate, &mock).await;
    // 1.67 s later one more normal call goes: the reserve refilled first.
    gate.advance(Duration::from_millis(1667));
    assert_eq!(gate.get_as_caller("marketing", SEND).await.header("x-wxgate-reason"), Some("reserve"));
    gate.advance(Duration::from_millis(1667));
    assert_eq!(gate.get_as_caller("marketing", SEND).await.status, 200);
}

#[tokio::test]
async fn a_normal_caller_leaves_the_reserve_to_a_high_one_redis_store() {
    let redis = RedisServer::start();
    let mock = MockWeChat::start().await;
    let gate = Gate::start_real(&mock, format!("{}\n{}", StoreToml::redis(&redis.url()), config())).await;
    the_reserve_is_kept_for_the_high_caller(&gate, &mock).await;
}
