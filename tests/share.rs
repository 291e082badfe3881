//! `max_share = "P%"` through real listeners, on both stores: a caller that
//! used its share of a limit is refused (reason `share`, an honest
//! `Retry-After`) while another caller still gets through; every caller not
//! declared counts in one share (`other`), so new names cannot escape the
//! cap; `/v1/buckets` shows each caller's use and the reserve.

use crate::support;

use support::redis_server::RedisServer;
use support::*;

const SEND: &str = "/cgi-bin/message/template/send";

/// 20 per 10 s with burst 10 (one every 0.91 s), 100 a day; 40 % each: 8
/// per 10 s with burst 4 (one every 2 s), 40 a day. 10 % kept for `hr`.
fn config() -> String {
    format!(
        "{}\n{}\n{}\n{}",
        caller("hr").high(),
        caller("marketing"),
        caller("approvals"),
        rule("template")
            .matching(SEND)
            .limit_burst(20, "10s", 10)
            .limit(100, "day")
            .set("max_share", "40%")
            .set("reserve", "10%"),
    )
}

async fn each_caller_keeps_to_its_share(gate: &Gate, mock: &MockWeChat) {
    for _ in 0..4 {
        assert_eq!(gate.get_as_caller("marketing", SEND).await.status, 200);
    }
    let over = gate.get_as_caller("marketing", SEND).await;
    assert_eq!((over.status.as_u16(), over.header("x-wxgate-reason")), (429, Some("share")), "{}", over.text());
    assert_eq!(over.retry_after(), 2, "2 s until marketing's share has a call again");
    assert!(over.text().contains("share"), "{}", over.text());
    // Undeclared callers share one share, whatever they call themselves.
    for name in ["batch-1", "batch-1", "batch-2", "batch-3"] {
        assert_eq!(gate.get_as_caller(name, SEND).await.status, 200, "{name}");
    }
    assert_eq!(gate.get_as_caller("batch-4", SEND).await.header("x-wxgate-reason"), Some("share"));
    // Another declared caller still gets through: what is left of the
    // burst but the reserve (10 - 4 - 4 = 2 calls, one of them kept for hr).
    assert_eq!(gate.get_as_caller("approvals", SEND).await.status, 200);
    assert_eq!(gate.get_as_caller("approvals", SEND).await.header("x-wxgate-reason"), Some("reserve"));
    assert_eq!(gate.get_as_caller("hr", SEND).await.status, 200);
    assert_eq!(gate.get_as_caller("hr", SEND).await.header("x-wxgate-reason"), Some("rate"));
    assert_eq!(mock.count(), 10, "exactly the window's burst reached WeChat");

    let b = admin(gate.admin_addr(), "GET", "/v1/buckets/default/template", None).await.json();
    assert_eq!(b["share"]["max_share_percent"], 40, "{b}");
    let callers = b["share"]["callers"].as_array().expect("callers");
    let named: Vec<&str> = callers.iter().filter_map(|c| c["caller"].as_str()).collect();
    assert_eq!(named, ["approvals", "hr", "marketing", "other"], "{b}");
    let marketing = &callers[2]["limits"];
    assert_eq!((marketing[0]["count"].as_u64(), marketing[0]["burst"].as_u64()), (Some(8), Some(4)), "{b}");
    assert_eq!(marketing[0]["tokens"], 0, "{b}");
    assert_eq!((marketing[1]["count"].as_u64(), marketing[1]["used"].as_u64()), (Some(40), Some(4)), "{b}");
    assert_eq!(b["reserve"]["percent"], 10, "{b}");
    assert_eq!(b["reserve"]["limits"][0]["kept_for_high_priority"], 1, "{b}");
    assert_eq!(b["reserve"]["limits"][1]["kept_for_high_priority"], 10, "{b}");
    assert_eq!(b["reserve"]["limits"][1]["normal_callers_can_use_now"], 80, "{b}");
}

#[tokio::test]
async fn a_caller_over_its_share_is_refused_and_others_get_through_memory_store() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start(&mock, config()).await;
    each_caller_keeps_to_its_share(&gate, &mock).await;
    // 2 s later marketing's share has one call again.
    gate.advance(std::time::Duration::from_secs(2));
    assert_eq!(gate.get_as_caller("marketing", SEND).await.status, 200);
    assert_eq!(gate.get_as_caller("marketing", SEND).await.header("x-wxgate-reason"), Some("share"));
}

#[tokio::test]
async fn a_caller_over_its_share_is_refused_and_others_get_through_redis_store() {
    let redis = RedisServer::start();
    let mock = MockWeChat::start().await;
    let gate = Gate::start_real(&mock, format!("{}\n{}", StoreToml::redis(&redis.url()), config())).await;
    each_caller_keeps_to_its_share(&gate, &mock).await;
}
