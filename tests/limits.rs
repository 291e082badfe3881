//! Limits through a real listener: the 429 shape, window exactness under
//! random arrivals, calendar days at Beijing midnight, accounts kept apart.

use crate::support;

use std::time::Duration;

use support::*;

/// 10 per 10 s, burst 3.
fn ten_seconds() -> RuleToml {
    rule("send").matching("/cgi-bin/message/custom/send").limit_burst(10, "10s", 3)
}

#[tokio::test]
async fn throttled_call_gets_429_wechat_shaped() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start(&mock, ten_seconds()).await;
    for _ in 0..3 {
        assert_eq!(gate.post("/cgi-bin/message/custom/send?access_token=T", "{}").await.status, 200);
    }
    let a = gate.post("/cgi-bin/message/custom/send?access_token=T", "{}").await;
    assert_eq!(a.status, 429);
    assert_eq!(a.header("content-type"), Some("application/json"));
    assert_eq!(a.header("x-wxgate-reason"), Some("rate"));
    assert_eq!(a.header("x-wxgate-rule"), Some("send"));
    // 10 per 10 s with burst 3: one every ⌈10 s / 8⌉ = 1.25 s → rounded up to 2.
    assert_eq!(a.retry_after(), 2);
    let body = a.json();
    assert_eq!(body["errcode"], 45009);
    let msg = body["errmsg"].as_str().expect("errmsg");
    assert!(msg.contains("wxgate") && msg.contains("\"send\"") && msg.contains("retry after 2s"), "{msg}");
    assert!(!msg.contains("access_token"));
    assert_eq!(mock.count(), 3, "the throttled call never reached WeChat");
    // 1.25 s later exactly one more goes.
    gate.advance(Duration::from_millis(1250));
    assert_eq!(gate.post("/cgi-bin/message/custom/send", "{}").await.status, 200);
    assert_eq!(gate.post("/cgi-bin/message/custom/send", "{}").await.status, 429);
}

#[tokio::test]
async fn no_window_ever_admits_more_than_count_under_random_arrivals() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start(&mock, ten_seconds()).await;
    let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut now = 0i64;
    let mut admitted = Vec::new();
    for _ in 0..400 {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        // Bursts and lulls: mostly short gaps, sometimes a long pause.
        let gap = match seed >> 60 {
            0 => 9_000_000 + (seed >> 20) as i64 % 5_000_000,
            1..=5 => (seed >> 20) as i64 % 2_000_000,
            _ => 0,
        };
        now += gap;
        gate.clock.advance_us(gap);
        let a = gate.get("/cgi-bin/message/custom/send").await;
        match a.status.as_u16() {
            200 => admitted.push(now),
            429 => assert!(a.retry_after() >= 1),
            s => panic!("unexpected status {s}"),
        }
    }
    assert_eq!(mock.count(), admitted.len());
    let (worst, from) = busiest_window(&admitted, 10 * SEC);
    assert!(worst <= 10, "{worst} calls in the 10 s window from t={from:?}us");
    assert!(admitted.len() > 40, "the limiter admitted almost nothing: {}", admitted.len());
}

#[tokio::test]
async fn day_quota_resets_at_beijing_midnight() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start(&mock, rule("menu").matching("/cgi-bin/menu/create").limit(3, "day")).await;
    // 2026-11-29 23:59:58 Beijing = 15:59:58 UTC.
    gate.clock.set_us((20_786 * 86_400 + 15 * 3600 + 59 * 60 + 58) * SEC);
    for _ in 0..3 {
        assert_eq!(gate.get("/cgi-bin/menu/create").await.status, 200);
    }
    let a = gate.get("/cgi-bin/menu/create").await;
    assert_eq!(a.status, 429);
    assert_eq!(a.header("x-wxgate-reason"), Some("quota"));
    assert_eq!(a.retry_after(), 2, "two seconds to midnight");
    gate.advance(Duration::from_millis(1999));
    assert_eq!(gate.get("/cgi-bin/menu/create").await.status, 429, "still the old day");
    gate.advance(Duration::from_millis(1));
    for _ in 0..3 {
        assert_eq!(gate.get("/cgi-bin/menu/create").await.status, 200, "a new day in Beijing");
    }
    assert_eq!(gate.get("/cgi-bin/menu/create").await.status, 429);
    assert_eq!(mock.count(), 6);
}

#[tokio::test]
async fn accounts_have_their_own_limits() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start(&mock, ten_seconds()).await;
    for _ in 0..3 {
        assert_eq!(gate.get_as("appA", "/cgi-bin/message/custom/send").await.status, 200);
    }
    assert_eq!(gate.get_as("appA", "/cgi-bin/message/custom/send").await.status, 429);
    assert_eq!(gate.get_as("appB", "/cgi-bin/message/custom/send").await.status, 200);
    // No header = the account "default", separate from both.
    assert_eq!(gate.get("/cgi-bin/message/custom/send").await.status, 200);
    assert!(mock.calls().iter().all(|c| !c.headers.contains_key("x-wx-account")));
}

#[tokio::test]
async fn all_or_nothing_through_the_proxy() {
    let mock = MockWeChat::start().await;
    let gate =
        Gate::start(&mock, rule("mass").matching("/cgi-bin/message/mass/*").limit_burst(3, "1m", 3).limit(2, "day"))
            .await;
    // 23:59:59 Beijing.
    gate.clock.set_us((20_786 * 86_400 + 15 * 3600 + 59 * 60 + 59) * SEC);
    assert_eq!(gate.get("/cgi-bin/message/mass/sendall").await.status, 200);
    assert_eq!(gate.get("/cgi-bin/message/mass/send").await.status, 200);
    for _ in 0..5 {
        let a = gate.get("/cgi-bin/message/mass/sendall").await;
        assert_eq!(a.status, 429);
        assert_eq!(a.header("x-wxgate-reason"), Some("quota"));
    }
    // One second later it is a new day. The refused calls took nothing from
    // the minute window, so its last 1 of 3 is there; then the window is full.
    gate.advance(Duration::from_secs(1));
    assert_eq!(gate.get("/cgi-bin/message/mass/sendall").await.status, 200);
    let a = gate.get("/cgi-bin/message/mass/sendall").await;
    assert_eq!((a.status.as_u16(), a.header("x-wxgate-reason")), (429, Some("rate")));
    assert_eq!(mock.count(), 3);
}
