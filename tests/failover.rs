//! Failover between upstreams (`[server] upstream` a list), over real
//! sockets: a call that provably never reached an upstream (connection
//! refused) goes to the next one at once and reaches WeChat exactly once; a
//! call that reached one (it accepted and hangs) is never sent anywhere
//! else; a failed upstream is skipped for its back-off (10 s, doubling while
//! it keeps failing) and gets calls again once a call after the back-off
//! finds it answering. Back-off time is the gate's manual clock: no test
//! waits for it.

use crate::support;

use std::time::Duration;

use support::ports::ClosedPort;
use support::*;

const SEND: &str = "/cgi-bin/message/custom/send?access_token=T";

/// 100 calls a day on /cgi-bin/message/custom/send: `used` shows what WeChat may have counted.
fn day_rule() -> RuleToml {
    rule("send").matching("/cgi-bin/message/custom/send").limit(100, "day")
}

/// `/v1/buckets/wxA/send`: the day quota's `used`.
async fn used_today(gate: &Gate) -> u64 {
    let b = get_at(gate.admin_addr(), "/v1/buckets/wxA/send").await;
    assert_eq!(b.status, 200, "{}", b.text());
    b.json()["limits"][0]["used"].as_u64().expect("used")
}

/// The `upstream` label of a closed port (`host:port`, as the metrics name it).
fn label(port: &ClosedPort) -> String {
    format!("127.0.0.1:{}", port.port)
}

/// `wxgate_upstream_requests_total{upstream,result}`, 0 when absent.
async fn tries(gate: &Gate, upstream: &str, result: &str) -> f64 {
    let series = format!("wxgate_upstream_requests_total{{upstream=\"{upstream}\",result=\"{result}\"}}");
    gate.metric(&series).await.unwrap_or(0.0)
}

/// `/readyz`'s `upstreams`: (name, up, skipped_for_s) in order.
async fn upstream_health(gate: &Gate) -> Vec<(String, bool, f64)> {
    let r = get_at(gate.admin_addr(), "/readyz").await;
    assert_eq!(r.status, 200, "an upstream down never makes wxgate unready: {}", r.text());
    let v = r.json();
    let list = v["upstreams"].as_array().expect("upstreams").clone();
    list.iter()
        .map(|u| {
            let name = u["upstream"].as_str().expect("name").to_owned();
            (name, u["up"].as_bool().expect("up"), u["skipped_for_s"].as_f64().expect("skipped_for_s"))
        })
        .collect()
}

#[tokio::test]
async fn a_closed_first_upstream_sends_every_call_to_the_second_once() {
    let first = ClosedPort::new();
    let second = MockWeChat::start().await;
    let (a, b) = (label(&first), second.addr.to_string());
    let gate = Gate::start_text(ConfigToml::upstreams(&[&first.url(), &second.url()]).with(day_rule())).await;
    for i in 0..5 {
        let answer = gate.get_as("wxA", &format!("{SEND}&n={i}")).await;
        assert_eq!(answer.status, 200, "call {i}: {}", answer.text());
        assert_eq!(answer.json()["errcode"], 0);
    }
    let calls = second.calls();
    let mut seen: Vec<&str> = calls.iter().map(|c| c.path_and_query.as_str()).collect();
    seen.sort_unstable();
    let sent: Vec<String> = (0..5).map(|i| format!("{SEND}&n={i}")).collect();
    assert_eq!(seen, sent, "each call reached the second upstream exactly once");
    for c in &calls {
        assert_eq!(c.headers.get("host").and_then(|h| h.to_str().ok()), Some(b.as_str()), "its own Host");
    }
    assert_eq!(used_today(&gate).await, 5, "each call counted once");

    // Only the first call tried the closed upstream; the others skipped it.
    assert_eq!(tries(&gate, &a, "not_sent").await, 1.0);
    assert_eq!(tries(&gate, &b, "answered").await, 5.0);
    let failovers = format!("wxgate_upstream_failovers_total{{from=\"{a}\",to=\"{b}\"}}");
    assert_eq!(gate.metric(&failovers).await, Some(1.0));
    assert_eq!(gate.metric(&format!("wxgate_upstream_up{{upstream=\"{a}\"}}")).await, Some(0.0));
    assert_eq!(gate.metric(&format!("wxgate_upstream_up{{upstream=\"{b}\"}}")).await, Some(1.0));
    assert_eq!(upstream_health(&gate).await, vec![(a, false, 10.0), (b, true, 0.0)]);
}

#[tokio::test]
async fn a_failed_tls_handshake_moves_the_call_on_to_the_next_upstream() {
    // Plain HTTP where the config says https: the handshake fails before
    // any byte of the request is written.
    let first = MockWeChat::start().await;
    let second = MockWeChat::start().await;
    let https_first = format!("https://{}", first.addr);
    let gate = Gate::start_text(ConfigToml::upstreams(&[&https_first, &second.url()]).with(day_rule())).await;
    let answer = gate.get_as("wxA", SEND).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!((first.count(), second.count()), (0, 1), "sent once, to the second");
    assert_eq!(tries(&gate, &first.addr.to_string(), "not_sent").await, 1.0);
    assert_eq!(used_today(&gate).await, 1);
}

#[tokio::test]
async fn a_first_upstream_that_accepts_and_hangs_is_504_and_the_second_never_gets_the_call() {
    let first = MockWeChat::start().await;
    first.respond(|_| Reply::Hang);
    let second = MockWeChat::start().await;
    let (a, b) = (first.addr.to_string(), second.addr.to_string());
    let config = ConfigToml::upstreams(&[&first.url(), &second.url()]).server("upstream_timeout", "1s");
    let gate = Gate::start_text(config.with(day_rule())).await;

    let answer = gate.get_as("wxA", SEND).await;
    assert_eq!(answer.status, 504, "{}", answer.text());
    assert_eq!(answer.json()["errcode"], -1);
    assert_eq!((first.count(), second.count()), (1, 0), "sent once, to the first; never again elsewhere");
    assert_eq!(used_today(&gate).await, 1, "it keeps its count: WeChat may have counted it");
    assert_eq!(tries(&gate, &a, "failed").await, 1.0);

    // The hang counts against the first upstream: the next call goes to the second.
    let answer = gate.get_as("wxA", SEND).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!((first.count(), second.count()), (1, 1));
    let failovers = format!("wxgate_upstream_failovers_total{{from=\"{a}\",to=\"{b}\"}}");
    assert_eq!(gate.metric(&failovers).await, Some(0.0), "no call moved on: the second call chose the second upstream");
    assert_eq!(upstream_health(&gate).await, vec![(a, false, 10.0), (b, true, 0.0)]);
}

#[tokio::test]
async fn the_first_upstream_gets_calls_again_once_its_back_off_is_over() {
    let first = ClosedPort::new();
    let second = MockWeChat::start().await;
    let a = label(&first);
    let gate = Gate::start_text(ConfigToml::upstreams(&[&first.url(), &second.url()]).with(day_rule())).await;
    assert_eq!(gate.get_as("wxA", SEND).await.status, 200);
    assert_eq!(second.count(), 1);

    // Back on the same port, but still inside its back-off: skipped.
    let first = first.open();
    gate.advance(Duration::from_millis(9_900));
    assert_eq!(gate.get_as("wxA", SEND).await.status, 200);
    assert_eq!((first.count(), second.count()), (0, 2));

    // 10 s after it failed: the next call tries it first, and it answers.
    gate.advance(Duration::from_millis(100));
    for n in 1..=3 {
        assert_eq!(gate.get_as("wxA", SEND).await.status, 200);
        assert_eq!((first.count(), second.count()), (n, 2));
    }
    let host = first.calls()[0].headers.get("host").and_then(|h| h.to_str().ok()).map(str::to_owned);
    assert_eq!(host.as_deref(), Some(a.as_str()), "its own Host");
    assert_eq!(gate.metric(&format!("wxgate_upstream_up{{upstream=\"{a}\"}}")).await, Some(1.0));
    assert_eq!(upstream_health(&gate).await[0], (a, true, 0.0));
    assert_eq!(used_today(&gate).await, 5);
}

#[tokio::test]
async fn an_upstream_that_keeps_failing_is_retried_at_doubling_intervals() {
    let first = ClosedPort::new();
    let second = MockWeChat::start().await;
    let a = label(&first);
    let gate = Gate::start_text(ConfigToml::upstreams(&[&first.url(), &second.url()]).with(day_rule())).await;
    let call = || async { assert_eq!(gate.get_as("wxA", SEND).await.status, 200) };
    call().await;
    assert_eq!(tries(&gate, &a, "not_sent").await, 1.0);

    // After 10 s one call retries it (refused again: that call moves on), and it is skipped for 20 s.
    gate.advance(Duration::from_secs(10));
    call().await;
    assert_eq!(tries(&gate, &a, "not_sent").await, 2.0);
    assert_eq!(upstream_health(&gate).await[0], (a.clone(), false, 20.0));
    gate.advance(Duration::from_secs(10));
    call().await;
    assert_eq!(tries(&gate, &a, "not_sent").await, 2.0, "10 s into a 20 s back-off: not tried");
    gate.advance(Duration::from_secs(10));
    call().await;
    assert_eq!(tries(&gate, &a, "not_sent").await, 3.0, "retried after 20 s; now 40 s");
    assert_eq!(upstream_health(&gate).await[0], (a.clone(), false, 40.0));

    let first = first.open();
    gate.advance(Duration::from_secs(40));
    call().await;
    assert_eq!(first.count(), 1, "back after its back-off");
    assert_eq!(second.count(), 4, "every call reached WeChat once");
    assert_eq!(upstream_health(&gate).await[0], (a, true, 0.0));
}

#[tokio::test]
async fn with_every_upstream_down_each_is_tried_in_order_before_a_502() {
    let (first, second) = (ClosedPort::new(), ClosedPort::new());
    let (a, b) = (label(&first), label(&second));
    let gate = Gate::start_text(ConfigToml::upstreams(&[&first.url(), &second.url()]).with(day_rule())).await;
    for n in 1..=2 {
        let answer = gate.get_as("wxA", SEND).await;
        assert_eq!(answer.status, 502, "{}", answer.text());
        assert_eq!(answer.json()["errcode"], -1);
        // Both are skipped after the first call; the second call still tries both.
        assert_eq!((tries(&gate, &a, "not_sent").await, tries(&gate, &b, "not_sent").await), (n as f64, n as f64));
    }
    assert_eq!(used_today(&gate).await, 0, "no call reached WeChat: both given back");

    // The second comes back inside both back-offs: the next call finds it (after trying the first).
    let second = second.open();
    assert_eq!(gate.get_as("wxA", SEND).await.status, 200);
    assert_eq!(second.count(), 1);
    assert_eq!(tries(&gate, &a, "not_sent").await, 3.0);
    // Now up: calls go straight to it.
    assert_eq!(gate.get_as("wxA", SEND).await.status, 200);
    assert_eq!((second.count(), tries(&gate, &a, "not_sent").await), (2, 3.0));
    assert_eq!(used_today(&gate).await, 2);
}

#[tokio::test]
async fn a_reload_keeps_the_health_of_the_upstreams_it_keeps() {
    let first = ClosedPort::new();
    let (second, third) = (MockWeChat::start().await, MockWeChat::start().await);
    let a = label(&first);
    let dir = TempDir::new("failover-reload");
    let path = dir.write("wxgate.toml", &ConfigToml::upstreams(&[&first.url(), &second.url()]).to_string());
    let gate = Gate::start_file(&path).await;
    assert_eq!(gate.get(SEND).await.status, 200);
    assert_eq!(second.count(), 1);

    dir.write("wxgate.toml", &ConfigToml::upstreams(&[&first.url(), &third.url()]).to_string());
    eventually("the reload", PATIENCE, || gate.reloads().0 >= 1).await;
    assert_eq!(gate.get(SEND).await.status, 200);
    assert_eq!((second.count(), third.count()), (1, 1), "the list changed");
    assert_eq!(tries(&gate, &a, "not_sent").await, 1.0, "the first is still skipped: not tried again");
    let up = |u: &MockWeChat| format!("wxgate_upstream_up{{upstream=\"{}\"}}", u.addr);
    assert_eq!(gate.metric(&up(&second)).await, None, "a removed upstream's gauge goes");
    assert_eq!(gate.metric(&up(&third)).await, Some(1.0));
}

#[tokio::test]
async fn the_access_log_names_the_upstream_that_answered() {
    let first = ClosedPort::new();
    let second = MockWeChat::start().await;
    let text =
        ConfigToml::upstreams(&[&first.url(), &second.url()]).with("[log]\nformat = \"json\"\n").with(day_rule());
    let gate = process::spawn(&text.to_string(), "failover-log", &[]).expect("serving");
    assert_eq!(get_as_at(gate.addr, "wxA", SEND).await.status, 200);
    let line = eventually_some("an access log line", PATIENCE, || {
        gate.logged().lines().find(|l| l.contains("wxgate::access")).map(str::to_owned)
    })
    .await;
    let v: serde_json::Value = serde_json::from_str(&line).expect("one JSON object per line");
    assert_eq!(v["upstream"], second.addr.to_string(), "{line}");
    assert_eq!(v["status"], 200);
}

fn parse(text: &str) -> Result<wxgate::config::Config, String> {
    wxgate::config::Config::parse(text, std::path::Path::new("test.toml")).map_err(|e| e.to_string())
}

#[test]
fn a_bad_upstream_list_is_refused_naming_the_element() {
    let cases = [
        (
            r#"upstream = ["https://api.weixin.qq.com", "ftp://api2.weixin.qq.com"]"#,
            r#"test.toml:2: [server] upstream[1]: "ftp://api2.weixin.qq.com": must start with http:// or https://"#,
        ),
        (
            r#"upstream = ["https://api.weixin.qq.com", "https://"]"#,
            r#"test.toml:2: [server] upstream[1]: "https://": not a URL"#,
        ),
        (r#"upstream = []"#, "test.toml:2: [server] upstream: an empty list: give at least one URL"),
        (
            r#"upstream = ["https://api.weixin.qq.com", "https://API.weixin.qq.com:443/"]"#,
            r#"test.toml:2: [server] upstream[1]: "https://API.weixin.qq.com:443/": the same host and port as upstream[0]"#,
        ),
        (
            r#"upstream = ["http://10.0.0.1/wx", "http://10.0.0.2/"]"#,
            r#"test.toml:2: [server] upstream[1]: "http://10.0.0.2/": its path must be upstream[0]'s ("/wx")"#,
        ),
        (
            r#"upstream = ["https://api.weixin.qq.com", 3]"#,
            "test.toml:2: [server] upstream[1]: expected a string, got the integer 3",
        ),
        (
            r#"upstream = 3"#,
            "test.toml:2: [server] upstream: expected a URL, or a list of URLs tried in order, got the integer 3",
        ),
    ];
    for (line, want) in cases {
        let got = parse(&format!("[server]\n{line}\n")).expect_err(line);
        assert!(got.starts_with(want), "{line}:\n got: {got}\nwant: {want}");
    }
}

#[test]
fn one_upstream_is_still_a_string_and_wxgate_check_prints_the_list() {
    let one = parse("[server]\nupstream = \"https://api2.weixin.qq.com\"\n").expect("a string");
    assert_eq!(one.server.upstream.to_string(), "https://api2.weixin.qq.com/");
    let default = parse("[server]\n").expect("no upstream");
    assert_eq!(default.server.upstream.to_string(), "https://api.weixin.qq.com/");

    let dir = TempDir::new("failover-check");
    let path = dir
        .write("wxgate.toml", "[server]\nupstream = [\"https://api.weixin.qq.com\", \"https://api2.weixin.qq.com\"]\n");
    let (code, stdout, stderr) = process::run(&["check", "--config", path.to_str().expect("utf-8")], &[]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("upstream https://api.weixin.qq.com/, https://api2.weixin.qq.com/ "), "{stdout}");
}
