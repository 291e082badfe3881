//! `throttle_status`: wxgate's refusals as HTTP 429 (the default) or as
//! HTTP 200 with the same WeChat-shaped body and headers, for SDKs that turn
//! any non-2xx answer into a transport error before reading its errcode
//! (wechatpy, WxJava's Apache backend); WeChat's own penalised answers
//! under each.

use crate::support;

use std::sync::Arc;

use support::*;

const SEND: &str = "/cgi-bin/message/custom/send?access_token=T";
const MENU: &str = "/cgi-bin/menu/get?access_token=T";

fn send() -> RuleToml {
    rule("send").matching("/cgi-bin/message/custom/send").limit(1, "1m")
}

fn menu() -> RuleToml {
    rule("menu").matching("/cgi-bin/menu/get").limit(1, "1m")
}

/// What a refusal carries in either mode.
fn assert_refusal(a: &Answer, status: u16, rule: &str, reason: &str) {
    assert_eq!(a.status, status, "{}", a.text());
    assert_eq!(a.json()["errcode"], 45009, "{}", a.text());
    let errmsg = a.json()["errmsg"].as_str().unwrap_or_default().to_owned();
    assert!(errmsg.starts_with("wxgate: ") && errmsg.contains(rule), "{errmsg}");
    assert!(a.retry_after() >= 1, "Retry-After");
    assert_eq!(a.header("x-wxgate-reason"), Some(reason));
    assert_eq!(a.header("x-wxgate-rule"), Some(rule));
    assert!(a.header("ratelimit").is_some() && a.header("ratelimit-policy").is_some(), "RateLimit headers");
}

#[tokio::test]
async fn with_throttle_status_200_refusals_are_http_200_with_the_same_body_and_headers() {
    let mock = MockWeChat::start().await;
    // The server says 200; the menu rule keeps 429 for itself.
    let config = ConfigToml::new(&mock.url())
        .server("throttle_status", 200)
        .with(send())
        .with(menu().set("throttle_status", 429));
    let gate = Gate::start_text(config).await;
    assert_eq!(gate.get(SEND).await.status, 200);
    assert_refusal(&gate.get(SEND).await, 200, "send", "rate");
    assert_eq!(gate.get(MENU).await.status, 200);
    assert_refusal(&gate.get(MENU).await, 429, "menu", "rate");
    assert_eq!(mock.count(), 2, "refusals never reach WeChat");
    // Counted the same in both modes.
    let metrics = get_at(gate.admin_addr(), "/metrics").await.text();
    for r in ["send", "menu"] {
        let throttled = sample(&metrics, &format!("wxgate_calls_total{{rule=\"{r}\",outcome=\"throttled\"}}"));
        assert_eq!(throttled, Some(1.0), "{r}: {metrics}");
    }
    let rules = get_at(gate.admin_addr(), "/v1/rules").await.json();
    let status_of = |name: &str| {
        rules.as_array().and_then(|a| a.iter().find(|r| r["name"] == name)).map(|r| r["throttle_status"].clone())
    };
    assert_eq!(status_of("send"), Some(200.into()));
    assert_eq!(status_of("menu"), Some(429.into()));
}

#[tokio::test]
async fn a_rule_can_ask_for_200_under_the_default_429() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start(&mock, format!("{}{}", send().set("throttle_status", 200), menu())).await;
    assert_eq!(gate.get(SEND).await.status, 200);
    assert_refusal(&gate.get(SEND).await, 200, "send", "rate");
    assert_eq!(gate.get(MENU).await.status, 200);
    assert_refusal(&gate.get(MENU).await, 429, "menu", "rate");
}

#[tokio::test]
async fn wechats_own_45009_passes_as_wechat_sent_it_and_still_starts_a_penalty() {
    let mock = MockWeChat::start().await;
    mock.respond(|_| errcode_reply(45009));
    let rules =
        format!("{}{}", rule("send").matching("/cgi-bin/message/custom/send").set("throttle_status", 200), menu());
    let gate = Gate::start(&mock, format!("{rules}{}", penalty(45009, 60))).await;

    let a = gate.get(SEND).await;
    assert_eq!(a.status, 200, "WeChat's status, not 429: {}", a.text());
    assert_eq!(
        a.text(),
        r#"{"errcode":45009,"errmsg":"reach max api daily quota limit rid: 6740e5a1-0b3c7d2e-1f2a3b4c"}"#
    );
    assert_eq!(a.header("x-wxgate-reason"), Some("penalty"));
    assert_eq!(a.retry_after(), 60);
    // The penalty holds: the next call is wxgate's own refusal, HTTP 200 too.
    let b = gate.get(SEND).await;
    assert_eq!(b.status, 200);
    assert_eq!(b.json()["errcode"], 45009);
    assert_eq!(b.header("x-wxgate-reason"), Some("penalty"));
    assert_eq!(mock.count(), 1, "the paused rule sends nothing");

    // Under 429 (the menu rule), the same answer is turned into a 429 with WeChat's body.
    let c = gate.get(MENU).await;
    assert_eq!(c.status, 429);
    assert_eq!(c.json()["errcode"], 45009);
    let metrics = get_at(gate.admin_addr(), "/metrics").await.text();
    // WeChat's answer and wxgate's refusal during the penalty: both "penalised", in both modes.
    for (r, n) in [("send", 2.0), ("menu", 1.0)] {
        let penalised = sample(&metrics, &format!("wxgate_calls_total{{rule=\"{r}\",outcome=\"penalised\"}}"));
        assert_eq!(penalised, Some(n), "{r}: {metrics}");
    }
}

#[tokio::test]
async fn concurrency_refusals_follow_throttle_status_too() {
    let mock = MockWeChat::start().await;
    let permits = mock.hold_replies(ok_reply());
    let capped = rule("remark").matching("/cgi-bin/externalcontact/remark").concurrency(1).set("throttle_status", 200);
    let gate = Arc::new(Gate::start(&mock, capped).await);
    let g = gate.clone();
    let first = tokio::spawn(async move { g.get("/cgi-bin/externalcontact/remark?access_token=T").await });
    eventually("the first call at WeChat", PATIENCE, || mock.count() == 1).await;
    let second = gate.get("/cgi-bin/externalcontact/remark?access_token=T").await;
    assert_eq!(second.status, 200, "{}", second.text());
    assert_eq!(second.json()["errcode"], 45009);
    assert_eq!(second.header("x-wxgate-reason"), Some("concurrency"));
    permits.add_permits(1);
    assert_eq!(first.await.expect("first").status, 200);
}
