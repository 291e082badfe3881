//! Callers: which service a call is from (`X-Wx-Caller`, else `[server]
//! caller`, else `default`), declared callers (`[[caller]]`) and their
//! flood guard (`rate`, governor, in-process). Checked through what users
//! see: the mock WeChat's requests, the answers, `/metrics`, `/v1/callers`
//! and Redis's command counts.

use crate::support;

use std::path::Path;
use std::time::Duration;

use support::redis_server::RedisServer;
use support::*;

const SEND: &str = "/cgi-bin/message/custom/send";
const MEDIA: &str = "/cgi-bin/media/upload";

/// "send": generous (never the reason of a refusal here).
fn send_rule() -> RuleToml {
    rule("send").matching(SEND).limit(100_000, "day")
}

/// A Redis store whose background runs no script while a test counts the
/// calls' script runs: with the local fallback every keeper tick (100 ms)
/// reads the recent pairs' calendar counts through lua/fields.lua, and
/// with quota leases it reads their penalties; neither is a call's. (A
/// flood of 50 refusals outlasts a tick on a loaded machine: a CI run
/// counted 10 runs where the calls made 8.)
fn quiet_redis(redis: &RedisServer) -> StoreToml {
    StoreToml::redis(&redis.url()).set("fallback", "deny").set("quota_leases", false)
}

async fn metrics_text(gate: &Gate) -> String {
    get_at(gate.admin_addr(), "/metrics").await.text()
}

async fn metric(gate: &Gate, name: &str) -> f64 {
    let text = metrics_text(gate).await;
    sample(&text, name).unwrap_or_else(|| panic!("no {name} in:\n{text}"))
}

fn caller_calls(caller: &str, outcome: &str) -> String {
    format!("wxgate_caller_calls_total{{caller=\"{caller}\",outcome=\"{outcome}\"}}")
}

fn assert_caller_rate(a: &Answer, status: u16, what: &str) {
    assert_eq!(a.status, status, "{what}: {}", a.text());
    assert_eq!(a.header("x-wxgate-reason"), Some("caller_rate"), "{what}");
    assert_eq!(a.json()["errcode"], 45009, "{what}: {}", a.text());
}

fn assert_bad_request(a: &Answer, what: &str) {
    assert_eq!(a.status, 400, "{what}: {}", a.text());
    assert_eq!(a.json()["errcode"], 40097, "{what}: {}", a.text());
}

#[tokio::test]
async fn the_caller_header_never_reaches_wechat_and_callers_are_counted_by_declared_name_or_other() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start(&mock, format!("{}{}", send_rule(), caller("hr").high())).await;
    assert_eq!(gate.get_as_caller("hr", SEND).await.status, 200);
    assert_eq!(gate.get_as_caller("marketing", SEND).await.status, 200);
    assert_eq!(gate.get(SEND).await.status, 200, "no header: default, not declared here");
    assert_eq!(gate.get_as_caller("hr", "/cgi-bin/user/info").await.status, 200, "a path without a rule");
    let seen = mock.calls();
    assert_eq!(seen.len(), 4);
    for c in &seen {
        assert!(c.headers.get("x-wx-caller").is_none(), "WeChat saw X-Wx-Caller: {:?}", c.headers);
    }
    assert_eq!(metric(&gate, &caller_calls("hr", "forwarded")).await, 2.0);
    assert_eq!(metric(&gate, &caller_calls("other", "forwarded")).await, 2.0, "marketing and default");
    let text = metrics_text(&gate).await;
    assert!(!text.contains("marketing") && !text.contains("caller=\"default\""), "{text}");
}

#[tokio::test]
async fn a_bad_caller_header_is_refused_with_400_and_never_forwarded() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start(&mock, format!("{}{}", send_rule(), caller("hr"))).await;
    let too_long = "a".repeat(65);
    for bad in ["", "h r", "hr!", "hr.ops", "人事", too_long.as_str()] {
        let a = gate.get_with(SEND, &[("x-wx-caller", bad)]).await;
        assert_bad_request(&a, &format!("X-Wx-Caller {bad:?}"));
        assert!(a.text().contains("X-Wx-Caller"), "{}", a.text());
    }
    let twice = gate.get_with(SEND, &[("x-wx-caller", "hr"), ("x-wx-caller", "hr")]).await;
    assert_bad_request(&twice, "given twice");
    assert!(twice.text().contains("more than once"), "{}", twice.text());
    assert_eq!(mock.count(), 0, "nothing refused was forwarded");
    assert_eq!(gate.get_as_caller(&"a".repeat(64), SEND).await.status, 200, "64 characters are fine");
    assert_eq!(gate.get_as_caller("hr_ops-2", SEND).await.status, 200);
    assert_eq!(metric(&gate, &caller_calls("other", "rejected_bad_request")).await, 7.0);
}

#[tokio::test]
async fn server_caller_names_calls_without_the_header_and_the_header_wins() {
    let mock = MockWeChat::start().await;
    let text = ConfigToml::new(&mock.url())
        .server("caller", "hr")
        .with(send_rule())
        .with(caller("hr").rate("2/s"))
        .with(caller("crm"));
    let gate = Gate::start_text(text).await;
    for i in 0..2 {
        assert_eq!(gate.get(SEND).await.status, 200, "call {i}");
    }
    // The sidecar's own service is hr: its guard applies to header-less calls.
    assert_caller_rate(&gate.get(SEND).await, 429, "the third header-less call");
    assert_eq!(gate.get_as_caller("crm", SEND).await.status, 200, "the header beats [server] caller");
    assert_eq!(gate.get_as_caller("newcomer", SEND).await.status, 200);
    assert_eq!(metric(&gate, &caller_calls("hr", "forwarded")).await, 2.0);
    assert_eq!(metric(&gate, &caller_calls("hr", "throttled")).await, 1.0);
    assert_eq!(metric(&gate, &caller_calls("crm", "forwarded")).await, 1.0);
    assert_eq!(metric(&gate, &caller_calls("other", "forwarded")).await, 1.0);
    assert_eq!(mock.count(), 4);

    let listed = get_at(gate.admin_addr(), "/v1/callers").await;
    assert_eq!(listed.status, 200, "{}", listed.text());
    let listed = listed.json();
    assert_eq!(listed["without_header"], "hr");
    assert_eq!(listed["callers"][0]["name"], "hr");
    assert_eq!(listed["callers"][0]["rate"], "2/s");
    assert_eq!(listed["callers"][0]["rate_refusals_here"], 1);
    assert_eq!(listed["callers"][1]["name"], "crm");
    assert_eq!(listed["callers"][1]["priority"], "normal");
    assert!(listed["callers"][1]["rate"].is_null());
}

#[tokio::test]
async fn a_flood_of_made_up_caller_names_adds_no_series() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start(&mock, format!("{}{}", send_rule(), caller("hr"))).await;
    assert_eq!(gate.get_as_caller("warm-up", SEND).await.status, 200);
    let before = metrics_text(&gate).await;
    for i in 0..100 {
        let name = format!("svc-{i}-{}", 7919 * i % 1000);
        assert_eq!(gate.get_as_caller(&name, SEND).await.status, 200, "{name}");
    }
    let after = metrics_text(&gate).await;
    let series = |t: &str| t.lines().filter(|l| !l.starts_with('#')).count();
    assert_eq!(series(&after), series(&before), "the same series, only their values moved");
    assert!(!after.contains("svc-"), "no made-up name is a label");
    assert_eq!(sample(&after, &caller_calls("other", "forwarded")), Some(101.0));
}

#[tokio::test]
async fn the_flood_guard_refuses_a_caller_over_its_rate_until_time_moves_on() {
    let mock = MockWeChat::start().await;
    let sections = [
        send_rule().to_string(),
        rule("media").matching(MEDIA).set("throttle_status", 200).to_string(),
        caller("flood").rate("5/s").to_string(),
        caller("hr").high().rate("5/s").to_string(),
    ];
    let gate = Gate::start(&mock, sections.concat()).await;
    for i in 0..5 {
        assert_eq!(gate.get_as_caller("flood", SEND).await.status, 200, "call {i} of the burst");
    }
    let refused = gate.get_as_caller("flood", SEND).await;
    assert_caller_rate(&refused, 429, "the 6th call at the same instant");
    assert_eq!(refused.retry_after(), 1, "one more may go in 200 ms: 1 s, rounded up");
    assert!(refused.text().contains("5/s"), "{}", refused.text());
    assert_eq!(mock.count(), 5, "WeChat never saw the refused call");

    // Its rule's throttle_status, and paths without a rule, are guarded too.
    assert_caller_rate(&gate.get_as_caller("flood", MEDIA).await, 200, "a rule with throttle_status = 200");
    assert_caller_rate(&gate.get_as_caller("flood", "/cgi-bin/user/info").await, 429, "a path without a rule");
    // Others are unaffected: a guard is per caller.
    assert_eq!(gate.get_as_caller("hr", SEND).await.status, 200);
    assert_eq!(gate.get_as_caller("anyone", SEND).await.status, 200);
    assert_eq!(gate.get(SEND).await.status, 200);
    assert_eq!(mock.count(), 8);

    gate.advance(Duration::from_secs(1));
    for i in 0..5 {
        assert_eq!(gate.get_as_caller("flood", SEND).await.status, 200, "after 1 s, call {i}");
    }
    assert_caller_rate(&gate.get_as_caller("flood", SEND).await, 429, "and then the guard again");
    assert_eq!(mock.count(), 13);

    assert_eq!(metric(&gate, "wxgate_caller_rate_refusals_total{caller=\"flood\"}").await, 4.0);
    assert_eq!(metric(&gate, "wxgate_caller_rate_refusals_total{caller=\"hr\"}").await, 0.0);
    assert_eq!(metric(&gate, &caller_calls("flood", "throttled")).await, 4.0);
    assert_eq!(metric(&gate, "wxgate_calls_total{rule=\"send\",outcome=\"throttled\"}").await, 2.0);
    assert_eq!(metric(&gate, "wxgate_calls_total{rule=\"media\",outcome=\"throttled\"}").await, 1.0);
    assert_eq!(metric(&gate, "wxgate_calls_total{rule=\"_none\",outcome=\"throttled\"}").await, 1.0);
}

#[tokio::test]
async fn the_flood_guard_refuses_without_a_redis_round_trip() {
    let redis = RedisServer::start();
    let mock = MockWeChat::start().await;
    let sections = format!("{}{}{}", quiet_redis(&redis), send_rule(), caller("flood").rate("3/s"));
    let gate = Gate::start(&mock, sections).await;
    let runs = redis.script_runs();
    for i in 0..3 {
        assert_eq!(gate.get_as_caller("flood", SEND).await.status, 200, "call {i}");
    }
    let decided = redis.script_runs();
    assert!(decided >= runs + 3, "each admitted call is a script run: {runs} -> {decided}");
    for i in 0..50 {
        assert_caller_rate(&gate.get_as_caller("flood", SEND).await, 429, &format!("flood call {i}"));
    }
    assert_eq!(redis.script_runs(), decided, "50 refusals by the guard ran nothing in Redis");
    assert_eq!(mock.count(), 3);
    assert_eq!(gate.get_as_caller("other-service", SEND).await.status, 200);
    assert!(redis.script_runs() > decided, "a call past the guard is decided in Redis");
}

/// Replaces the config file and reloads it as SIGHUP does.
async fn reload(gate: &Gate, path: &Path, text: impl std::fmt::Display) {
    std::fs::write(path, text.to_string()).expect("write config");
    wxgate::ops::reload::reload(gate.app(), path).await.expect("reload");
}

#[tokio::test]
async fn a_reload_changes_callers_and_keeps_a_guard_whose_rate_is_unchanged() {
    let mock = MockWeChat::start().await;
    let dir = TempDir::new("callers-reload");
    let path = dir.join("rules.toml");
    let config = |hr: &str, more: &str| {
        ConfigToml::new(&mock.url())
            .with(send_rule())
            .with(caller("flood").rate("2/s"))
            .with(caller("hr").rate(hr))
            .with(more)
            .to_string()
    };
    std::fs::write(&path, config("2/s", "")).expect("write config");
    let gate = Gate::start_file(&path).await;
    for who in ["flood", "hr"] {
        for _ in 0..2 {
            assert_eq!(gate.get_as_caller(who, SEND).await.status, 200, "{who}");
        }
        assert_caller_rate(&gate.get_as_caller(who, SEND).await, 429, who);
    }

    reload(&gate, &path, config("1/s", &caller("crm").rate("1/s").to_string())).await;
    assert_caller_rate(&gate.get_as_caller("flood", SEND).await, 429, "flood's rate is unchanged: still spent");
    assert_eq!(gate.get_as_caller("hr", SEND).await.status, 200, "hr's new rate starts afresh");
    assert_caller_rate(&gate.get_as_caller("hr", SEND).await, 429, "at 1/s");
    assert_eq!(gate.get_as_caller("crm", SEND).await.status, 200, "a new caller");
    assert_caller_rate(&gate.get_as_caller("crm", SEND).await, 429, "with its guard");
    let listed = get_at(gate.admin_addr(), "/v1/callers").await.json();
    let names: Vec<&str> =
        listed["callers"].as_array().expect("list").iter().filter_map(|c| c["name"].as_str()).collect();
    assert_eq!(names, ["flood", "hr", "crm"]);

    // A caller no longer declared is `other`: no guard.
    reload(&gate, &path, ConfigToml::new(&mock.url()).with(send_rule()).with(caller("hr").rate("1/s"))).await;
    for i in 0..3 {
        assert_eq!(gate.get_as_caller("flood", SEND).await.status, 200, "flood, undeclared now: call {i}");
    }
    assert_caller_rate(&gate.get_as_caller("hr", SEND).await, 429, "hr kept its guard (1/s, unchanged)");
    assert_eq!(metric(&gate, &caller_calls("other", "forwarded")).await, 3.0);
}

#[tokio::test]
async fn caller_config_errors_name_the_file_line_and_caller() {
    let base = ConfigToml::new("http://127.0.0.1:9").with(send_rule());
    let error = |extra: String| {
        let text = base.clone().with(extra).to_string();
        match wxgate::config::Config::parse(&text, Path::new("rules.toml")) {
            Ok(_) => panic!("accepted:\n{text}"),
            Err(e) => e.to_string(),
        }
    };
    let line_of = |text: &str, needle: &str| {
        let text = base.clone().with(text.to_owned()).to_string();
        text[..text.find(needle).expect("needle")].matches('\n').count() + 1
    };
    // (the block, the error, the text on the line it names)
    let cases = [
        (
            caller("hr").set("rates", "5/s").to_string(),
            "caller \"hr\": rates: unknown key; did you mean `rate`? (expected one of `name`",
            "rates =",
        ),
        (
            caller("hr").set("priority", "urgent").to_string(),
            "caller \"hr\": priority: \"urgent\" is unknown",
            "[[caller]]",
        ),
        (
            caller("hr").rate("5 per second").to_string(),
            "caller \"hr\": rate: \"5 per second\": write calls per",
            "[[caller]]",
        ),
        (
            caller("hr").rate("0/s").to_string(),
            "caller \"hr\": rate: \"0/s\": the count must be at least 1",
            "[[caller]]",
        ),
        (caller("other").to_string(), "[[caller]] name \"other\" is taken", "[[caller]]"),
        (caller("h r").to_string(), "[[caller]] name \"h r\" must be 1-64 of [A-Za-z0-9_-]", "[[caller]]"),
        (
            format!("{}{}", caller("hr"), caller("hr").high()),
            "caller \"hr\": another [[caller]] has the same name",
            "[[caller]]\nname = \"hr\"\npriority",
        ),
    ];
    for (extra, expected, needle) in cases {
        let e = error(extra.clone());
        assert!(e.contains(expected), "{extra}: {e}");
        let line = line_of(&extra, needle);
        assert!(e.starts_with(&format!("rules.toml:{line}: ")), "{extra}: {e} (expected line {line})");
    }
    let text = base.clone().server("caller", "sidecar of hr").to_string();
    let e = wxgate::config::Config::parse(&text, Path::new("rules.toml")).expect_err("bad [server] caller");
    assert!(e.to_string().contains("[server] caller: \"sidecar of hr\" is not a caller name"), "{e}");
}

#[tokio::test]
async fn the_access_log_names_the_caller() {
    let mock = MockWeChat::start().await;
    let text = ConfigToml::new(&mock.url()).with("[log]\nformat = \"json\"\n").with(send_rule()).with(caller("hr"));
    let gate = support::process::spawn(&text.to_string(), "callers-log", &[]).expect("serving");
    let url = format!("http://{}{SEND}", gate.addr);
    let as_hr = http::Request::get(&url).header("x-wx-caller", "hr").body(Default::default()).expect("request");
    assert_eq!(send(as_hr).await.status, 200);
    assert_eq!(send(http::Request::get(&url).body(Default::default()).expect("request")).await.status, 200);
    let callers = eventually_some("two access log lines", Duration::from_secs(5), || {
        let lines: Vec<serde_json::Value> = gate
            .logged()
            .lines()
            .filter(|l| l.contains("wxgate::access"))
            .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
            .collect();
        (lines.len() == 2).then(|| lines.iter().map(|v| v["caller"].clone()).collect::<Vec<_>>())
    })
    .await;
    assert_eq!(callers, ["hr", "default"]);
}

#[tokio::test]
async fn the_access_log_shows_the_metrics_label_of_each_caller() {
    // A declared caller, an undeclared one and none: the log keeps the name
    // a call gave and adds the label its metrics carry (`other` for every
    // undeclared caller), so a log line leads to its series.
    let mock = MockWeChat::start().await;
    let text = ConfigToml::new(&mock.url()).with("[log]\nformat = \"json\"\n").with(send_rule()).with(caller("hr"));
    let gate = support::process::spawn(&text.to_string(), "callers-label", &[]).expect("serving");
    let url = format!("http://{}{SEND}", gate.addr);
    for name in [Some("hr"), Some("marketing"), None] {
        let mut req = http::Request::get(&url);
        if let Some(name) = name {
            req = req.header("x-wx-caller", name);
        }
        assert_eq!(send(req.body(Default::default()).expect("request")).await.status, 200);
    }
    let logged = eventually_some("three access log lines", Duration::from_secs(5), || {
        let lines: Vec<serde_json::Value> = gate
            .logged()
            .lines()
            .filter(|l| l.contains("wxgate::access"))
            .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
            .collect();
        (lines.len() == 3)
            .then(|| lines.iter().map(|v| (v["caller"].clone(), v["caller_label"].clone())).collect::<Vec<_>>())
    })
    .await;
    let want = [("hr", "hr"), ("marketing", "other"), ("default", "other")]
        .map(|(c, l)| (serde_json::Value::from(c), serde_json::Value::from(l)));
    assert_eq!(logged, want);
    for (label, calls) in [("hr", 1.0), ("other", 2.0)] {
        let series = caller_calls(label, "forwarded");
        assert_eq!(gate.metric(&series).await, Some(calls), "{series}");
    }
}

/// The same through a real wxgate process (the binary as deployed): its
/// guard refuses a flood in the process, and Redis runs nothing for it.
#[tokio::test]
async fn a_wxgate_process_refuses_a_flood_without_touching_redis() {
    let redis = RedisServer::start();
    let mock = MockWeChat::start().await;
    // 3 a minute: no refill during the test, however slow the machine.
    let config = ConfigToml::new(&mock.url())
        .with(quiet_redis(&redis))
        .with(send_rule())
        .with(caller("flood").rate("3/min"))
        .to_string();
    let wxgate = support::process::spawn(&config, "guard", &[]).expect("wxgate serving");
    let as_flood = |addr| async move {
        let req = http::Request::get(format!("http://{addr}{SEND}?access_token=T"))
            .header("x-wx-caller", "flood")
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .expect("request");
        send(req).await
    };
    for i in 0..3 {
        assert_eq!(as_flood(wxgate.addr).await.status, 200, "call {i}");
    }
    let decided = redis.script_runs();
    for i in 0..50 {
        assert_caller_rate(&as_flood(wxgate.addr).await, 429, &format!("flood call {i}"));
    }
    assert_eq!(redis.script_runs(), decided, "50 refusals by the guard ran nothing in Redis");
    assert_eq!(mock.count(), 3);
}

/// Issue 46: the refusal shape is the caller's SDK's business: a caller
/// whose SDK drops the body of a non-2xx answer (wechatpy, WxJava, ...)
/// declares `throttle_status = 200` and gets WeChat's own shape (200 +
/// errcode 45009) for every refusal, whatever its rule says; the others
/// keep the rule's 429. A penalised WeChat answer keeps WeChat's 200 for it.
#[tokio::test]
async fn a_caller_chooses_the_refusal_shape_its_sdk_reads() {
    let mock = MockWeChat::start().await;
    let sections = [
        rule("send").matching(SEND).limit_burst(1, "1h", 1).to_string(),
        rule("media").matching(MEDIA).to_string(),
        caller("wechatpy").set("throttle_status", 200).to_string(),
        caller("go").to_string(),
    ];
    let gate = Gate::start(&mock, sections.concat()).await;
    assert_eq!(gate.get_as_caller("go", SEND).await.status, 200, "the hour's one call");
    let sdk = gate.get_as_caller("wechatpy", SEND).await;
    assert_eq!((sdk.status.as_u16(), sdk.json()["errcode"].as_i64()), (200, Some(45009)), "{}", sdk.text());
    assert!(sdk.retry_after() > 0, "the wait is still told: {}", sdk.text());
    let other = gate.get_as_caller("go", SEND).await;
    assert_eq!((other.status.as_u16(), other.json()["errcode"].as_i64()), (429, Some(45009)), "{}", other.text());

    // WeChat penalises a call: the caller choosing 200 gets WeChat's 200.
    mock.respond(|_| errcode_reply(45009));
    let penalised = gate.get_as_caller("wechatpy", MEDIA).await;
    assert_eq!(
        (penalised.status.as_u16(), penalised.json()["errcode"].as_i64()),
        (200, Some(45009)),
        "{}",
        penalised.text()
    );
    let penalised = gate.get_as_caller("go", MEDIA).await;
    assert_eq!(penalised.status, 429, "{}", penalised.text());

    // Anything else than 200 or 429 is refused at load.
    let dir = TempDir::new("caller-status");
    let bad = ConfigToml::new(&mock.url()).with(send_rule()).with(caller("x").set("throttle_status", 503)).to_string();
    let err = wxgate::config::Config::load(&dir.write("rules.toml", &bad)).expect_err("503 is refused");
    assert!(err.to_string().contains("[[caller]] \"x\"") || err.to_string().contains("caller"), "{err}");
    assert!(err.to_string().contains("throttle_status"), "{err}");
}
