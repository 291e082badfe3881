//! A call's cost from its recipients, and limits per recipient (issue 32),
//! over real sockets: a rule with `cost = "recipients"` counts the members a
//! WeCom app message is addressed to, and `per_recipient` keeps each
//! member under its own limits, so WeCom never drops a message silently.
//! On the embedded store, a real Redis and a 3-master Redis Cluster.

use crate::support;

use std::collections::HashMap;

use serde_json::json;
use support::backing::Backing;
use support::bodies::chunked_body;
use support::redis_server::RedisServer;
use support::wire::exchange;
use support::{ConfigToml, Gate, MockWeChat, StoreToml};

const SEND: &str = "/cgi-bin/message/send?access_token=T";

/// `message_send` counting recipients against `limits`, with these more keys.
fn message_rule(limits: &str, more: &str) -> String {
    format!(
        "[[rule]]\nname = \"message_send\"\nmatch = [\"/cgi-bin/message/send\"]\nlimits = {limits}\n\
         cost = \"recipients\"\nrecipients = {{ field = \"touser\", separator = \"|\" }}\n{more}\n"
    )
}

/// A text message to `to` ("|"-separated member ids).
fn message(to: &str) -> String {
    json!({"touser": to, "msgtype": "text", "agentid": 1000002, "text": {"content": "punch in"}}).to_string()
}

/// The messages the mock received, by their `touser`.
fn delivered(mock: &MockWeChat) -> Vec<String> {
    mock.calls()
        .iter()
        .map(|c| {
            let body: serde_json::Value = serde_json::from_slice(&c.body).expect("JSON at WeChat");
            body["touser"].as_str().unwrap_or_default().to_owned()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_day_counted_by_recipients_refuses_a_message_whole_when_its_recipients_do_not_fit() {
    for backing in Backing::all() {
        let store = backing.name();
        let mock = MockWeChat::start().await;
        let gate = backing.gate(&mock, &message_rule(r#"[{ count = 10, per = "day" }]"#, "")).await;
        for _ in 0..3 {
            let a = gate.post(SEND, &message("a|b|c")).await;
            assert_eq!(a.status, 200, "{store}: {}", a.text());
        }
        // 9 of the day's 10 person-times are spent: 2 more do not fit.
        let refused = gate.post(SEND, &message("d|e")).await;
        assert_eq!(refused.status, 429, "{store}: {}", refused.text());
        assert_eq!(refused.header("x-wxgate-reason"), Some("quota"), "{store}");
        assert_eq!(refused.json()["errcode"], 45009, "{store}");
        let one = gate.post(SEND, &message("f")).await;
        assert_eq!(one.status, 200, "{store}: the 10th person-time: {}", one.text());
        assert_eq!(gate.post(SEND, &message("g")).await.status, 429, "{store}: the day is spent");
        // "d|e" never reached WeChat; what did is byte for byte what was sent.
        assert_eq!(delivered(&mock), ["a|b|c", "a|b|c", "a|b|c", "f"], "{store}");
        assert!(mock.calls().iter().all(|c| c.body.starts_with(br#"{"agentid":1000002"#)), "{store}: bodies untouched");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_over_its_own_limit_is_refused_by_name_and_the_others_keep_theirs() {
    for backing in Backing::all() {
        let store = backing.name();
        let mock = MockWeChat::start().await;
        let rules = message_rule(
            r#"[{ count = 1000, per = "day" }]"#,
            r#"per_recipient = [{ count = 3, per = "1m", burst = 3 }]"#,
        );
        let gate = backing.gate(&mock, &rules).await;
        for _ in 0..3 {
            assert_eq!(gate.post(SEND, &message("u1")).await.status, 200, "{store}");
        }
        // The 4th message to u1 within the minute: WeCom would drop it
        // silently; wxgate refuses it, naming u1, with u1's wait.
        let fourth = gate.post(SEND, &message("u1")).await;
        assert_eq!(fourth.status, 429, "{store}: {}", fourth.text());
        assert_eq!(fourth.header("x-wxgate-reason"), Some("recipient"), "{store}");
        assert_eq!(fourth.header("x-wxgate-rule"), Some("message_send"), "{store}");
        assert!((59..=60).contains(&fourth.retry_after()), "{store}: u1's wait: {:?}", fourth.header("retry-after"));
        let errmsg = fourth.json()["errmsg"].as_str().unwrap_or_default().to_owned();
        assert!(errmsg.contains("(recipient)") && errmsg.ends_with("retry after the wait)"), "{store}: {errmsg}");
        assert!(errmsg.contains(": u1 ("), "{store}: names u1: {errmsg}");
        // Another member passes.
        assert_eq!(gate.post(SEND, &message("u2")).await.status, 200, "{store}");
        // A message to u1 and u3 is refused whole (WeChat has no partial
        // send), naming u1 only, so the caller can send to u3 alone.
        let both = gate.post(SEND, &message("u1|u3")).await;
        assert_eq!(both.status, 429, "{store}");
        assert_eq!(both.header("x-wxgate-reason"), Some("recipient"), "{store}");
        let errmsg = both.json()["errmsg"].as_str().unwrap_or_default().to_owned();
        assert!(
            errmsg.contains("1 recipient(s)") && errmsg.contains(": u1 (") && !errmsg.contains("u3"),
            "{store}: {errmsg}"
        );
        // u3 took nothing from the refused message: it has its 3.
        for _ in 0..3 {
            assert_eq!(gate.post(SEND, &message("u3")).await.status, 200, "{store}");
        }
        assert_eq!(gate.post(SEND, &message("u3")).await.header("x-wxgate-reason"), Some("recipient"), "{store}");
        // No member got more than 3 at WeChat; nothing refused reached it.
        let mut per_member: HashMap<String, usize> = HashMap::new();
        for to in delivered(&mock) {
            for id in to.split('|') {
                *per_member.entry(id.to_owned()).or_default() += 1;
            }
        }
        assert_eq!(per_member, HashMap::from([("u1".into(), 3), ("u2".into(), 1), ("u3".into(), 3)]), "{store}");
        // No recipient id in the metrics.
        let metrics = support::get_at(gate.admin_addr(), "/metrics").await.text();
        assert!(!metrics.contains("u1") && !metrics.contains("u3"), "{store}: no member in metrics");
        assert!(
            metrics.contains(r#"wxgate_calls_total{rule="message_send",outcome="throttled"} 3"#),
            "{store}: the refusals are counted: {}",
            metrics.lines().filter(|l| l.contains("message_send")).collect::<Vec<_>>().join("\n")
        );
        assert_eq!(
            support::sample(&metrics, r#"wxgate_recipient_refusals_total{rule="message_send"}"#),
            Some(3.0),
            "{store}"
        );
        assert_eq!(support::sample(&metrics, r#"wxgate_recipients_total{rule="message_send"}"#), Some(7.0), "{store}");
    }
}

#[tokio::test]
async fn a_body_read_for_its_recipients_is_forwarded_byte_identical_whatever_its_framing() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start(&mock, message_rule(r#"[{ count = 10, per = "day" }]"#, "")).await;
    // Odd spacing and key order: WeChat must get these bytes, not a re-encoding.
    let body = br#"{ "touser" : "a|b",  "msgtype":"text","agentid":1,"text":{"content":"\u4f60\u597d"} }"#;
    let head = |framing: &str| format!("POST {SEND} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{framing}\r\n\r\n");
    let with_length = [head(&format!("Content-Length: {}", body.len())).into_bytes(), body.to_vec()].concat();
    let chunks: Vec<&[u8]> = body.chunks(7).collect();
    let chunked = [head("Transfer-Encoding: chunked").into_bytes(), chunked_body(&chunks)].concat();
    for (label, wire) in [("Content-Length", with_length), ("chunked", chunked)] {
        let ex = exchange(gate.addr, &wire).await;
        assert_eq!(ex.only().status, 200, "{label}: {}", ex.text());
        assert_eq!(mock.calls().last().expect("forwarded").body, &body[..], "{label}: byte-identical");
    }
    assert_eq!(mock.count(), 2);
    // Both counted 2: 4 of 10 used.
    let state = support::get_at(gate.admin_addr(), "/v1/buckets/default/message_send").await.text();
    assert!(state.contains("\"used\":4"), "{state}");
}

#[tokio::test]
async fn what_cannot_be_counted_is_refused_naming_the_rule_and_never_forwarded() {
    let mock = MockWeChat::start().await;
    let rules = format!(
        "{}{}",
        message_rule(r#"[{ count = 100, per = "1m", burst = 5 }]"#, ""),
        "[[rule]]\nname = \"appchat\"\nmatch = [\"/cgi-bin/appchat/send\"]\nlimits = [{ count = 10, per = \"day\" }]\n\
         cost = \"recipients\"\n\
         recipients = { field = \"touser\", separator = \"|\", all = \"@all\", unseen = [\"toparty\", \"totag\"] }\n"
    );
    let gate = Gate::start(&mock, rules).await;
    let big = message(&(0..9000).map(|i| format!("user{i}")).collect::<Vec<_>>().join("|"));
    assert!(big.len() > 64 * 1024);
    let cases: Vec<(&str, String, u16, &str)> = vec![
        (SEND, big, 413, "larger than the 65536 bytes wxgate reads of a call of rule \"message_send\""),
        (SEND, "touser=a".into(), 400, "the body is not JSON"),
        (SEND, r#"{"msgtype":"text"}"#.into(), 400, "has no \"touser\""),
        (SEND, r#"{"touser":"a","touser":"b"}"#.into(), 400, "gives key"),
        (SEND, message("a|b|a"), 400, "names a recipient twice"),
        (SEND, message("a|b|c|d|e|f"), 400, "limits[0] (100 per 1m (burst 5)) admits at most 5 at once"),
        (
            "/cgi-bin/appchat/send?access_token=T",
            message("@all"),
            400,
            "cannot count (\"@all\", \"toparty\", \"totag\")",
        ),
        ("/cgi-bin/appchat/send?access_token=T", r#"{"toparty":"2"}"#.into(), 400, "cannot count"),
    ];
    for (path, body, status, says) in cases {
        let a = gate.post(path, &body).await;
        assert_eq!(a.status, status, "{says}: {}", a.text());
        let errmsg = a.json()["errmsg"].as_str().unwrap_or_default().to_owned();
        assert!(errmsg.contains("rule \"") && errmsg.contains(says), "{says}: {errmsg}");
        assert_eq!(a.json()["errcode"], 40097);
    }
    assert_eq!(mock.count(), 0, "nothing half-read or uncountable was forwarded");
    // The same rule with a price for members wxgate cannot see.
    let priced = Gate::start(
        &mock,
        "[[rule]]\nname = \"appchat\"\nmatch = [\"/cgi-bin/appchat/send\"]\nlimits = [{ count = 10, per = \"day\" }]\n\
         cost = \"recipients\"\nrecipients = { field = \"touser\", separator = \"|\", all = \"@all\", \
         unseen = [\"toparty\"], unseen_cost = 4 }\n",
    )
    .await;
    let path = "/cgi-bin/appchat/send?access_token=T";
    assert_eq!(priced.post(path, &message("@all")).await.status, 200, "@all costs 4");
    assert_eq!(priced.post(path, r#"{"touser":"a|b","toparty":"7"}"#).await.status, 200, "2 + 4");
    let over = priced.post(path, r#"{"toparty":"7"}"#).await;
    assert_eq!(
        (over.status.as_u16(), over.header("x-wxgate-reason")),
        (429, Some("quota")),
        "10 used: {}",
        over.text()
    );
    assert_eq!(mock.count(), 2);
}

/// A body that stops arriving before it is whole is refused (408) once
/// `[server] body_timeout` has passed without progress, and never
/// forwarded half-read.
#[tokio::test]
async fn a_body_that_stalls_before_its_recipients_are_read_is_refused_and_never_forwarded() {
    let mock = MockWeChat::start().await;
    let config = ConfigToml::new(&mock.url())
        .server("body_timeout", "300ms")
        .with(message_rule(r#"[{ count = 10, per = "day" }]"#, ""));
    let gate = Gate::start_text(config).await;
    let body = message("a|b");
    let half = &body.as_bytes()[..body.len() / 2];
    let head =
        format!("POST {SEND} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n", body.len());
    let ex = exchange(gate.addr, &[head.as_bytes(), half].concat()).await;
    let answer = ex.only();
    assert_eq!(answer.status, 408, "{}", ex.text());
    assert!(ex.text().contains("nothing for 300ms ([server] body_timeout)"), "{}", ex.text());
    assert_eq!(mock.count(), 0, "nothing half-read reaches WeChat");
}

/// Rolled out in shadow mode first, a rule counting recipients refuses
/// nothing: a body it cannot count is forwarded (at cost 1), and a message
/// to a member over its limits is forwarded and counted as
/// `shadow_throttled`.
#[tokio::test]
async fn in_shadow_mode_nothing_is_refused_and_the_would_be_refusals_are_counted() {
    let mock = MockWeChat::start().await;
    let rules = message_rule(
        r#"[{ count = 1000, per = "day" }]"#,
        "per_recipient = [{ count = 1, per = \"1m\", burst = 1 }]\nmode = \"shadow\"",
    );
    let gate = Gate::start(&mock, rules).await;
    for body in ["touser=a".to_owned(), message("a|a"), message("u1"), message("u1")] {
        let a = gate.post(SEND, &body).await;
        assert_eq!(a.status, 200, "{body}: {}", a.text());
    }
    assert_eq!(mock.count(), 4, "everything forwarded");
    let metrics = support::get_at(gate.admin_addr(), "/metrics").await.text();
    assert_eq!(
        support::sample(&metrics, r#"wxgate_calls_total{rule="message_send",outcome="shadow_throttled"}"#),
        Some(1.0),
        "the second message to u1 would have been refused"
    );
}

/// `message_send` with WeCom's shipped recipients (`@all`, `toparty`,
/// `totag`) and this `per_recipient`, counting `cost` ("call" or
/// "recipients") against a roomy day.
fn wecom_rule(cost: &str, per_recipient: &str) -> String {
    format!(
        "[[rule]]\nname = \"message_send\"\nmatch = [\"/cgi-bin/message/send\"]\n\
         limits = [{{ count = 1000000, per = \"day\" }}]\ncost = \"{cost}\"\n\
         recipients = {{ field = \"touser\", separator = \"|\", all = \"@all\", unseen = [\"toparty\", \"totag\"], \
         unseen_cost = 1000 }}\nper_recipient = {per_recipient}\n"
    )
}

/// WeCom userids are case-insensitive (doc 90236 answers them "统一转为小写";
/// the member's uniqueness "忽略大小写"): `alice`, `ALICE` and `Alice` are one
/// member, whose 4th message in a minute WeCom would drop silently. Each
/// spelling used to get its own windows (8 spellings: 8 times the limit)
/// and `alice|ALICE` passed the "named twice" check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_member_spelled_in_eight_cases_gets_no_more_than_its_own_limit() {
    for backing in [Backing::Memory, Backing::Redis(RedisServer::start())] {
        let store = backing.name();
        let mock = MockWeChat::start().await;
        let gate = backing.gate(&mock, &wecom_rule("recipients", r#"[{ count = 3, per = "1m", burst = 3 }]"#)).await;
        let spellings = ["alice", "ALICE", "Alice", "aLICE", "alIce", "ALice", "alicE", "AlIcE"];
        let mut through = 0;
        for to in spellings.iter().chain(&spellings) {
            let a = gate.post(SEND, &message(to)).await;
            match a.status.as_u16() {
                200 => through += 1,
                429 => assert_eq!(a.header("x-wxgate-reason"), Some("recipient"), "{store}: {}", a.text()),
                other => panic!("{store}: {to}: {other} {}", a.text()),
            }
        }
        assert_eq!(through, 3, "{store}: 16 messages to one member in 8 spellings: its 3 a minute, no more");
        assert_eq!(mock.count(), 3, "{store}");
        // One member named twice in one call, in two cases: refused (400)
        // like "alice|alice", never forwarded.
        for to in ["bob|BOB", "bob|bob"] {
            let twice = gate.post(SEND, &message(to)).await;
            assert_eq!(twice.status, 400, "{store}: {to}: {}", twice.text());
            assert!(twice.text().contains("names a recipient twice"), "{store}: {}", twice.text());
        }
        assert_eq!(mock.count(), 3, "{store}: nothing named twice reached WeCom");
        if let Backing::Redis(redis) = &backing {
            // One key for the member, under its folded id, kept no longer
            // than its longest window.
            let keys = redis.command("KEYS *#r:*");
            assert!(keys.contains("#r:alice") && !keys.contains("#r:A") && !keys.contains("#r:aL"), "{keys}");
        }
    }
}

/// WeCom documents `touser = "@all"` (lower case) for every member of the
/// app; whether `@ALL` means them too is not documented (a userid cannot
/// start with "@"). It used to be metered as a member named "@ALL" (cost
/// 1, sent to WeCom); it is refused, naming the spelling wxgate reads.
#[tokio::test]
async fn every_member_written_in_another_case_is_refused_rather_than_counted_as_one_member() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start(&mock, wecom_rule("recipients", r#"[{ count = 3, per = "1m", burst = 3 }]"#)).await;
    for to in ["@ALL", "@All", "a|@aLL"] {
        let a = gate.post(SEND, &message(to)).await;
        assert_eq!(a.status, 400, "{to}: {}", a.text());
        let errmsg = a.json()["errmsg"].as_str().unwrap_or_default().to_owned();
        assert!(errmsg.contains("write \"@all\"") && errmsg.contains("rule \"message_send\""), "{to}: {errmsg}");
    }
    assert_eq!(mock.count(), 0, "none reached WeCom");
    // "@all" itself costs unseen_cost (1000 of the day).
    assert_eq!(gate.post(SEND, &message("@all")).await.status, 200);
    let state = support::get_at(gate.admin_addr(), "/v1/buckets/default/message_send").await.text();
    assert!(state.contains("\"used\":1000"), "{state}");
}

/// A rule counting calls (`cost = "call"`) with `per_recipient` keeps one
/// state per member named, for up to its longest window: one call naming
/// thousands used to create thousands (20 calls of a 60 KB `touser`:
/// ~240k states, ~60 MB, counted nowhere). A call names at most WeCom's
/// own 1000 (400 past it, saying so), and the members held by the store
/// stay within `[store] max_recipients`: a call that would add members
/// past it is refused (503) until members' windows are whole again.
#[tokio::test]
async fn calls_naming_many_members_cannot_grow_the_members_held_past_the_bound() {
    let mock = MockWeChat::start().await;
    let config = ConfigToml::new(&mock.url()).with(StoreToml::memory().set("max_recipients", 2500)).with(wecom_rule(
        "call",
        r#"[{ count = 30, per = "1m", burst = 10 }, { count = 1000, per = "1h", burst = 100 }]"#,
    ));
    let gate = Gate::start_text(config).await;
    let members = |from: usize, n: usize| (from..from + n).map(|i| format!("m{i}")).collect::<Vec<_>>().join("|");
    let held = || async { gate.metric("wxgate_store_recipients").await };
    // More than WeCom takes in one touser: 400, naming where 1000 comes from.
    let over = gate.post(SEND, &message(&members(0, 1001))).await;
    assert_eq!(over.status, 400, "{}", over.text());
    assert!(over.text().contains("more than the 1000") && over.text().contains("WeCom's own limit"), "{}", over.text());
    assert_eq!(held().await, Some(0.0), "a refused call holds nothing");
    // 1000 + 1000 members held; 1000 more would pass 2500.
    for from in [0, 1000] {
        let a = gate.post(SEND, &message(&members(from, 1000))).await;
        assert_eq!(a.status, 200, "{}", a.text());
    }
    assert_eq!(held().await, Some(2000.0));
    let full = gate.post(SEND, &message(&members(2000, 1000))).await;
    assert_eq!(full.status, 503, "{}", full.text());
    assert!(full.text().contains("max_recipients"), "{}", full.text());
    // 500 fit exactly; then not one more, while members already held
    // still get their messages.
    assert_eq!(gate.post(SEND, &message(&members(2000, 500))).await.status, 200);
    assert_eq!(gate.post(SEND, &message(&members(2500, 1))).await.status, 503);
    assert_eq!(gate.post(SEND, &message(&members(0, 1000))).await.status, 200, "members held: no new state");
    assert_eq!(held().await, Some(2500.0), "the bound holds");
    assert_eq!(mock.count(), 4);
    // An hour on, every member's windows are whole again: their states go
    // and new members find room.
    gate.advance(std::time::Duration::from_secs(3601));
    assert_eq!(gate.post(SEND, &message(&members(5000, 1000))).await.status, 200);
    assert_eq!(held().await, Some(1000.0), "the 2500 whose windows were whole again were dropped");
}
