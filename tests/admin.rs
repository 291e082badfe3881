//! The admin listener: metrics after a scenario, bucket inspection, lifting
//! and imposing penalties (both stores), the bearer token, shadow mode, the
//! RateLimit headers and the access log.

use crate::support;

use std::net::SocketAddr;
use std::path::Path;

use bytes::Bytes;
use http_body_util::Full;
use serde_json::{json, Value};
use support::redis_server::RedisServer;
use support::*;

/// 3 a minute (burst 3) and 100 a day.
fn send_rule() -> RuleToml {
    rule("send").matching("/cgi-bin/message/custom/send").limit_burst(3, "1m", 3).limit(100, "day")
}

#[tokio::test]
async fn metrics_count_what_a_scenario_did() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start(&mock, send_rule()).await;
    for _ in 0..3 {
        assert_eq!(gate.get("/cgi-bin/message/custom/send").await.status, 200);
    }
    assert_eq!(gate.get("/cgi-bin/message/custom/send").await.status, 429);
    assert_eq!(gate.get_as("bad account!", "/cgi-bin/message/custom/send").await.status, 400);
    mock.respond(|_| errcode_reply(45009));
    assert_eq!(gate.get_as("other", "/cgi-bin/message/custom/send").await.status, 429);
    assert_eq!(gate.get("/cgi-bin/unmatched").await.status, 200);

    let m = admin(gate.admin_addr(), "GET", "/metrics", None).await;
    assert_eq!(m.status, 200);
    assert!(m.header("content-type").is_some_and(|c| c.starts_with("application/openmetrics-text")));
    let text = m.text();
    let calls = |rule: &str, outcome: &str| {
        sample(&text, &format!("wxgate_calls_total{{rule=\"{rule}\",outcome=\"{outcome}\"}}")).unwrap_or(0.0)
    };
    assert_eq!(calls("send", "forwarded"), 3.0, "{text}");
    assert_eq!(calls("send", "throttled"), 1.0);
    assert_eq!(calls("send", "penalised"), 1.0);
    assert_eq!(calls("_none", "rejected_bad_request"), 1.0);
    assert_eq!(calls("_none", "forwarded"), 1.0);
    assert_eq!(sample(&text, "wxgate_upstream_errcodes_total{rule=\"send\",errcode=\"45009\"}"), Some(1.0));
    assert_eq!(sample(&text, "wxgate_upstream_errcodes_total{rule=\"send\",errcode=\"0\"}"), Some(3.0));
    assert_eq!(sample(&text, "wxgate_upstream_seconds_count{rule=\"send\"}"), Some(4.0));
    assert_eq!(sample(&text, "wxgate_decision_seconds_count{rule=\"send\"}"), Some(5.0));
    assert_eq!(sample(&text, "wxgate_in_flight{rule=\"send\"}"), Some(0.0));
    assert!(text.contains("wxgate_build_info{version=\""), "{text}");
    // The account the calls named ("other") is in no label; `caller="other"`
    // and `errcode="other"` are the series of undeclared callers and errcodes.
    let labels = text.replace("caller=\"other\"", "").replace("errcode=\"other\"", "");
    assert!(!labels.contains("account=\"") && !labels.contains("\"other\""), "no account label: {text}");
}

#[tokio::test]
async fn buckets_show_tokens_quota_and_penalty() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start(&mock, send_rule()).await;
    assert_eq!(gate.get_as("wxA", "/cgi-bin/message/custom/send").await.status, 200);
    let b = admin(gate.admin_addr(), "GET", "/v1/buckets/wxA/send", None).await;
    assert_eq!(b.status, 200, "{}", b.text());
    let v = b.json();
    assert_eq!(v["limits"][0]["tokens"], 2, "{v}");
    assert_eq!(v["limits"][1]["used"], 1);
    assert_eq!(v["limits"][1]["remaining"], 99);
    assert_eq!(v["limits"][1]["resets_at"], "2026-11-30T00:00:00.000+08:00");
    assert_eq!(v["penalty"]["active"], false);
    assert_eq!(v["this_instance"]["in_flight"], 0);
    assert_eq!(admin(gate.admin_addr(), "GET", "/v1/buckets/wxA/nope", None).await.status, 404);
    assert_eq!(admin(gate.admin_addr(), "GET", "/v1/buckets/bad!/send", None).await.status, 400);
    let rules = admin(gate.admin_addr(), "GET", "/v1/rules", None).await.json();
    assert_eq!(rules[0]["name"], "send");
    assert_eq!(rules[0]["limits"][0]["burst"], 3);
}

async fn lift_and_impose(gate: &Gate, mock: &MockWeChat) {
    let addr = gate.admin_addr();
    mock.respond(|_| errcode_reply(45009));
    assert_eq!(gate.get_as("wxA", "/cgi-bin/message/custom/send").await.status, 429);
    mock.respond(|_| ok_reply());
    let a = gate.get_as("wxA", "/cgi-bin/message/custom/send").await;
    assert_eq!(a.header("x-wxgate-reason"), Some("penalty"), "penalised");
    let b = admin(addr, "GET", "/v1/buckets/wxA/send", None).await.json();
    assert_eq!(b["penalty"]["active"], true, "{b}");
    // After WeChat's clear_quota, an operator lifts it: calls flow again.
    let lifted = admin(addr, "DELETE", "/v1/penalties/wxA/send", None).await;
    assert_eq!(lifted.status, 200, "{}", lifted.text());
    assert_eq!(lifted.json()["lifted"], true);
    assert_eq!(gate.get_as("wxA", "/cgi-bin/message/custom/send").await.status, 200);
    // And one can be imposed by hand.
    let imposed = admin(addr, "POST", "/v1/penalties/wxA/send?seconds=120", None).await;
    assert_eq!(imposed.status, 200);
    let a = gate.get_as("wxA", "/cgi-bin/message/custom/send").await;
    assert_eq!((a.status.as_u16(), a.header("x-wxgate-reason")), (429, Some("penalty")));
    assert!((119..=120).contains(&a.retry_after()));
    assert_eq!(admin(addr, "POST", "/v1/penalties/wxA/send", None).await.status, 400, "seconds is required");
}

#[tokio::test]
async fn penalties_lifted_and_imposed_through_the_api_memory_store() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start(&mock, send_rule()).await;
    lift_and_impose(&gate, &mock).await;
}

#[tokio::test]
async fn penalties_lifted_and_imposed_through_the_api_redis_store() {
    let redis = RedisServer::start();
    let mock = MockWeChat::start().await;
    let rules = format!("{}\n{}", StoreToml::redis(&redis.url()), send_rule());
    let gate = Gate::start_real(&mock, rules).await;
    lift_and_impose(&gate, &mock).await;
    let b = admin(gate.admin_addr(), "GET", "/v1/buckets/wxA/send", None).await.json();
    assert_eq!(b["limits"][1]["used"], 2, "read from Redis: {b}");
    let ready = admin(gate.admin_addr(), "GET", "/readyz", None).await;
    assert_eq!(ready.status, 200);
    assert_eq!(ready.json()["store"], "redis");
}

#[tokio::test]
async fn the_admin_api_needs_the_token_when_one_is_set() {
    let mock = MockWeChat::start().await;
    let gate =
        Gate::start_text(ConfigToml::new(&mock.url()).server("admin_token", "s3cret-token").with(send_rule())).await;
    let addr = gate.admin_addr();
    let denied = admin(addr, "DELETE", "/v1/penalties/wxA/send", None).await;
    assert_eq!(denied.status, 401);
    assert_eq!(denied.header("www-authenticate"), Some("Bearer"));
    assert_eq!(admin(addr, "GET", "/v1/rules", Some("wrong")).await.status, 401);
    assert_eq!(admin(addr, "GET", "/v1/rules", Some("s3cret-token")).await.status, 200);
    // Probes and metrics stay open for Prometheus and orchestrators.
    assert_eq!(admin(addr, "GET", "/healthz", None).await.status, 200);
    assert_eq!(admin(addr, "GET", "/metrics", None).await.status, 200);
    // The admin API is not on the proxy listener.
    let via_proxy = gate.get("/v1/rules").await;
    assert_ne!(via_proxy.header("content-type"), Some("application/json; admin"));
    assert_eq!(
        mock.calls().last().map(|c| c.path_and_query.clone()),
        Some("/v1/rules".into()),
        "forwarded, not served"
    );
}

#[tokio::test]
async fn shadow_mode_forwards_everything_and_counts_what_it_would_refuse() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start(&mock, send_rule().shadow()).await;
    for _ in 0..5 {
        assert_eq!(gate.get("/cgi-bin/message/custom/send").await.status, 200, "every call forwarded");
    }
    assert_eq!(mock.count(), 5);
    let text = admin(gate.admin_addr(), "GET", "/metrics", None).await.text();
    assert_eq!(sample(&text, "wxgate_calls_total{rule=\"send\",outcome=\"forwarded\"}"), Some(3.0));
    assert_eq!(sample(&text, "wxgate_calls_total{rule=\"send\",outcome=\"shadow_throttled\"}"), Some(2.0));
    // State as if enforcing: 3 debited, the 2 it would refuse were not.
    let b = admin(gate.admin_addr(), "GET", "/v1/buckets/default/send", None).await.json();
    assert_eq!(b["limits"][1]["used"], 3, "{b}");
    // A WeChat penalty is recorded but WeChat's answer passes unchanged.
    mock.respond(|_| errcode_reply(45009));
    gate.advance(std::time::Duration::from_secs(60));
    let a = gate.get("/cgi-bin/message/custom/send").await;
    assert_eq!(a.status, 200);
    assert_eq!(a.json()["errcode"], 45009);
    let b = admin(gate.admin_addr(), "GET", "/v1/buckets/default/send", None).await.json();
    assert_eq!(b["penalty"]["active"], true);
}

#[tokio::test]
async fn ratelimit_headers_describe_the_policy_and_can_be_turned_off() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start(&mock, send_rule()).await;
    let a = gate.get("/cgi-bin/message/custom/send").await;
    assert_eq!(a.header("ratelimit-policy"), Some("\"send.60s\";q=3;w=60, \"send.day\";q=100;w=86400"));
    // Burst = count: two left in the minute window, whole again 60 s after the call.
    assert_eq!(a.header("ratelimit"), Some("\"send.60s\";r=2;t=60"));
    gate.get("/cgi-bin/message/custom/send").await;
    gate.get("/cgi-bin/message/custom/send").await;
    let refused = gate.get("/cgi-bin/message/custom/send").await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.header("ratelimit"), Some("\"send.60s\";r=0;t=60"));

    let gate =
        Gate::start_text(ConfigToml::new(&mock.url()).server("ratelimit_headers", false).with(send_rule())).await;
    let a = gate.get("/cgi-bin/message/custom/send").await;
    assert_eq!((a.header("ratelimit"), a.header("ratelimit-policy")), (None, None));
}

#[tokio::test]
async fn one_json_access_log_line_per_call() {
    let mock = MockWeChat::start().await;
    let text = ConfigToml::new(&mock.url()).with("[log]\nformat = \"json\"\n").with(send_rule()).to_string();
    let gate = support::process::spawn(&text, "access-json", &[]).expect("serving");
    let url = |p: &str| format!("http://{}{p}", gate.addr);
    let req =
        |p: &str| http::Request::get(url(p)).header("x-wx-account", "wxA").body(Full::new(Bytes::new())).expect("req");
    assert_eq!(send(req("/cgi-bin/message/custom/send?access_token=SECRET")).await.status, 200);
    let line = eventually_some("an access log line", std::time::Duration::from_secs(5), || {
        gate.logged().lines().find(|l| l.contains("wxgate::access")).map(str::to_owned)
    })
    .await;
    let v: serde_json::Value = serde_json::from_str(&line).expect("one JSON object per line");
    assert_eq!(v["method"], "GET");
    assert_eq!(v["path"], "/cgi-bin/message/custom/send");
    assert_eq!(v["rule"], "send");
    assert_eq!(v["account"], "wxA");
    assert_eq!(v["outcome"], "forwarded");
    assert_eq!(v["status"], 200);
    assert_eq!(v["errcode"], 0);
    assert!(v["decision_ms"].is_number() && v["upstream_ms"].is_number() && v["held_ms"].is_number(), "{v}");
    assert!(!line.contains("SECRET"), "{line}");
}

/// `admin` with extra request headers (`host` replaces the address's).
async fn penalty_active(addr: SocketAddr, token: Option<&str>) -> bool {
    let b = admin(addr, "GET", "/v1/buckets/wxA/send", token).await;
    assert_eq!(b.status, 200, "{}", b.text());
    b.json()["penalty"]["active"] == true
}

#[tokio::test]
async fn a_browser_page_on_another_site_cannot_change_penalties() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start(&mock, send_rule()).await;
    let addr = gate.admin_addr();
    let impose = "/v1/penalties/wxA/send?seconds=600";
    let cross_site: [&[(&str, &str)]; 4] = [
        &[("origin", "https://evil.example")],
        &[("origin", "null")],
        &[("sec-fetch-site", "cross-site")],
        // DNS rebinding: same-origin by the browser's marks, but not our Host.
        &[("host", "evil.example:9090"), ("origin", "http://evil.example:9090"), ("sec-fetch-site", "same-origin")],
    ];
    for headers in cross_site {
        let refused = admin_with(addr, "POST", impose, headers).await;
        assert_eq!(refused.status, 403, "{headers:?}: {}", refused.text());
        assert!(refused.text().contains("refused"), "{}", refused.text());
        assert!(!penalty_active(addr, None).await, "{headers:?}: no penalty set");
    }
    assert_eq!(admin_with(addr, "POST", impose, &[("host", "evil.example")]).await.status, 403);
    assert!(!penalty_active(addr, None).await);

    // curl-like (no Origin, Host as typed) works on loopback without a token;
    // so does the listener's own origin, and `localhost`.
    assert_eq!(admin(addr, "POST", impose, None).await.status, 200);
    assert!(penalty_active(addr, None).await);
    let lift_cross = admin_with(addr, "DELETE", "/v1/penalties/wxA/send", &[("origin", "https://evil.example")]).await;
    assert_eq!(lift_cross.status, 403);
    assert!(penalty_active(addr, None).await, "not lifted");
    let own = format!("http://{addr}");
    let lift_own = admin_with(addr, "DELETE", "/v1/penalties/wxA/send", &[("origin", &own)]).await;
    assert_eq!(lift_own.status, 200, "{}", lift_own.text());
    let localhost = format!("localhost:{}", addr.port());
    assert_eq!(admin_with(addr, "POST", impose, &[("host", &localhost)]).await.status, 200);
    // Reading stays open to any Host (Prometheus may scrape by name).
    assert_eq!(admin_with(addr, "GET", "/metrics", &[("host", "wxgate.monitoring.svc:9090")]).await.status, 200);
}

#[tokio::test]
async fn the_bearer_token_does_not_let_a_cross_site_request_through() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start_text(ConfigToml::new(&mock.url()).server("admin_token", "tok").with(send_rule())).await;
    let addr = gate.admin_addr();
    let impose = "/v1/penalties/wxA/send?seconds=600";
    assert_eq!(admin(addr, "POST", impose, None).await.status, 401, "no bearer");
    let cross =
        admin_with(addr, "POST", impose, &[("authorization", "Bearer tok"), ("origin", "https://evil.example")]);
    assert_eq!(cross.await.status, 403);
    assert!(!penalty_active(addr, Some("tok")).await);
    assert_eq!(admin(addr, "POST", impose, Some("tok")).await.status, 200);
    assert!(penalty_active(addr, Some("tok")).await);
}

#[test]
fn an_admin_listener_beyond_loopback_needs_a_token() {
    let dir = support::temp::TempDir::new("admin-exposed");
    let config = "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"0.0.0.0:9090\"\n";
    let path = dir.write("wxgate.toml", config);
    let path = path.to_str().expect("utf-8 path");
    let want = "[server] admin_listen: 0.0.0.0:9090 is reachable beyond this machine but no admin_token (or \
                WXGATE_ADMIN_TOKEN) is set";
    // Start-up refuses it, before listening on anything.
    let (code, _, serve_err) = support::process::run(&["--config", path], &[]);
    assert_eq!(code, 2, "{serve_err}");
    assert!(serve_err.starts_with(&format!("wxgate: invalid config: {path}:3: {want}")), "{serve_err}");
    // `check` (in CI, which cannot see the serving environment's secrets)
    // warns of it, naming what start-up needs, as of a missing token key
    // (issue 65: one policy for what the environment supplies).
    let (code, stdout, stderr) = support::process::run(&["check", "--config", path], &[]);
    assert_eq!(code, 0, "{stderr}");
    let refusal = serve_err.trim_end().trim_start_matches("wxgate: invalid config: ");
    assert_eq!(
        stderr,
        format!(
            "wxgate: warning: WXGATE_ADMIN_TOKEN is not set here and [server] admin_token is not given, so start-up \
             here fails (exit 2): \"{refusal}\"; set WXGATE_ADMIN_TOKEN where wxgate runs\n"
        )
    );
    assert!(stdout.starts_with(&format!("{path}: ok, 1 warning (on stderr)")), "{stdout}");
    // With a token (from the environment, as the Kubernetes manifest sets it) it is accepted.
    let (code, _, stderr) = support::process::run(&["check", "--config", path], &[("WXGATE_ADMIN_TOKEN", "t")]);
    assert_eq!(code, 0, "{stderr}");
    // Loopback needs none.
    let loopback = dir.write("loopback.toml", &config.replace("0.0.0.0", "127.0.0.1"));
    let (code, _, stderr) = support::process::run(&["check", "--config", loopback.to_str().expect("utf-8")], &[]);
    assert_eq!(code, 0, "{stderr}");
}

/// A reload never widens access to the admin API: a config that drops
/// `admin_token` (or changes `admin_listen`) keeps the running listener and
/// its token until a restart, with a warning.
#[tokio::test]
async fn a_reload_that_drops_the_admin_token_keeps_it_until_a_restart() {
    let mock = MockWeChat::start().await;
    let dir = TempDir::new("admin-reload");
    let path = dir.join("rules.toml");
    let with_token = ConfigToml::new(&mock.url()).server("admin_token", "tok-123").with(send_rule());
    std::fs::write(&path, with_token.to_string()).expect("write");
    let gate = Gate::start_file(&path).await;
    let addr = gate.admin_addr();
    assert_eq!(admin(addr, "DELETE", "/v1/penalties/wxA/send", None).await.status, 401);
    let open =
        ConfigToml::new(&mock.url()).without_server("admin_token").server("admin_listen", "off").with(send_rule());
    std::fs::write(&path, open.to_string()).expect("write");
    wxgate::ops::reload::reload(gate.app(), &path).await.expect("the rules reload");
    assert_eq!(admin(addr, "DELETE", "/v1/penalties/wxA/send", None).await.status, 401, "the token still guards it");
    assert_eq!(admin(addr, "DELETE", "/v1/penalties/wxA/send", Some("tok-123")).await.status, 200);
}

/// DNS rebinding: a page on an attacker's name that resolves to 127.0.0.1
/// can make the browser GET the admin API with that name as Host. Without
/// a token, /v1 answers only a Host that is an address or localhost;
/// probes and metrics answer any Host. The token's scheme is case-insensitive.
#[tokio::test]
async fn without_a_token_v1_answers_only_an_address_host_and_bearer_is_any_case() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start(&mock, send_rule()).await;
    let addr = gate.admin_addr();
    let get = |host: &'static str, path: &'static str| async move {
        let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        support::wire::exchange(addr, req.as_bytes()).await.only().status
    };
    assert_eq!(get("attacker.example:9090", "/v1/rules").await, 403);
    assert_eq!(get("attacker.example", "/v1/buckets/wxA/send").await, 403);
    assert_eq!(get("127.0.0.1:9090", "/v1/rules").await, 200);
    assert_eq!(get("localhost", "/v1/rules").await, 200);
    assert_eq!(get("attacker.example", "/metrics").await, 200, "Prometheus may scrape by name");
    let tokened = Gate::start_text(ConfigToml::new(&mock.url()).server("admin_token", "tok-9").with(send_rule())).await;
    let req = "GET /v1/rules HTTP/1.1\r\nHost: wxgate-admin.internal\r\nAuthorization: bearer tok-9\r\nConnection: close\r\n\r\n";
    let answer = support::wire::exchange(tokened.admin_addr(), req.as_bytes()).await.only();
    assert_eq!(answer.status, 200, "a lower-case scheme and a name as Host, with the token: {}", answer.text());
}

/// What the alerts and the dashboard count exists at 0 from start-up, so
/// that the first 45009 (or failed reload, or failover) is an increase;
/// a rule added by a reload gets its series at once too.
#[tokio::test]
async fn every_series_an_alert_counts_exists_at_zero_from_the_start_and_after_a_reload() {
    let (one, two) = (MockWeChat::start().await, MockWeChat::start().await);
    let dir = TempDir::new("series-at-zero");
    let path = dir.join("rules.toml");
    let config =
        |extra: &str| ConfigToml::upstreams(&[&one.url(), &two.url()]).with(send_rule()).with(extra.to_owned());
    std::fs::write(&path, config("").to_string()).expect("write");
    let gate = Gate::start_file(&path).await;
    for errcode in ["45009", "45011", "45033"] {
        let series = format!("wxgate_upstream_errcodes_total{{rule=\"send\",errcode=\"{errcode}\"}}");
        assert_eq!(gate.metric(&series).await, Some(0.0), "{series}");
    }
    for outcome in ["forwarded", "throttled", "penalised", "unavailable", "upstream_error", "unauthorized"] {
        for rule in ["send", "_none"] {
            let series = format!("wxgate_calls_total{{rule=\"{rule}\",outcome=\"{outcome}\"}}");
            assert_eq!(gate.metric(&series).await, Some(0.0), "{series}");
        }
    }
    for result in ["ok", "failed"] {
        assert_eq!(gate.metric(&format!("wxgate_config_reloads_total{{result=\"{result}\"}}")).await, Some(0.0));
    }
    let text = get_at(gate.admin_addr(), "/metrics").await.text();
    assert_eq!(text.lines().filter(|l| l.starts_with("wxgate_upstream_failovers_total{")).count(), 2, "{text}");
    std::fs::write(&path, config(&rule("menu").matching("/cgi-bin/menu/get").limit(10, "day").to_string()).to_string())
        .expect("write");
    wxgate::ops::reload::reload(gate.app(), &path).await.expect("reload");
    let series = "wxgate_upstream_errcodes_total{rule=\"menu\",errcode=\"45009\"}";
    assert_eq!(gate.metric(series).await, Some(0.0), "a reloaded rule's series");
}

/// An admin command the docs show: (file:line, method, path).
fn documented_admin_commands() -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for file in ["README.md", "docs/admin.md", "docs/semantics.md"] {
        let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file)).expect(file);
        for (i, line) in text.lines().enumerate() {
            let Some(at) = line.find("localhost:9090/v1/") else { continue };
            if !line.contains("curl ") {
                continue;
            }
            let here = format!("{file}:{}", i + 1);
            // The header as the docs send it: inline, or `-H "$auth"` set once in the block.
            let inline = line.contains("-H \"Authorization: Bearer $WXGATE_ADMIN_TOKEN\"");
            let by_name =
                line.contains("-H \"$auth\"") && text.contains("auth=\"Authorization: Bearer $WXGATE_ADMIN_TOKEN\"");
            assert!(inline || by_name, "{here}: an admin command without the bearer token: {line}");
            let words: Vec<&str> = line.split_whitespace().collect();
            let method = words.iter().position(|w| *w == "-X").and_then(|i| words.get(i + 1)).unwrap_or(&"GET");
            let path: String = line[at + "localhost:9090".len()..]
                .chars()
                .take_while(|c| !c.is_whitespace() && !matches!(c, '`' | '"' | '\''))
                .collect();
            out.push((here, method.to_string(), path));
        }
    }
    out
}

#[tokio::test]
async fn the_documented_admin_commands_carry_the_token_and_work_with_and_without_one() {
    let commands = documented_admin_commands();
    assert!(commands.len() >= 6, "{commands:?}");
    let template = rule("template_send").matching("/cgi-bin/message/template/send").limit(100, "day");
    let mock = MockWeChat::start().await;
    // With a token (a container's or a pod's config), the header as the docs
    // expand it; without one (loopback), the same header, empty, is ignored.
    for (token, header) in [(Some("tok-docs"), "Bearer tok-docs"), (None, "Bearer")] {
        let mut config = ConfigToml::new(&mock.url()).with(template.clone());
        if let Some(token) = token {
            config = config.server("admin_token", token);
        }
        let gate = Gate::start_text(config).await;
        for (here, method, path) in &commands {
            let a = admin_with(gate.admin_addr(), method, path, &[("authorization", header)]).await;
            assert_eq!(a.status, 200, "{here}: {method} {path} with token {token:?}: {}", a.text());
        }
    }
}

/// `GET /` with HTTP Basic: any user name, the admin token as password.
async fn basic(addr: SocketAddr, path: &str, password: &str) -> Answer {
    use base64::Engine;
    let credentials = base64::engine::general_purpose::STANDARD.encode(format!("on-call:{password}"));
    admin_with(addr, "GET", path, &[("authorization", &format!("Basic {credentials}"))]).await
}

#[tokio::test]
async fn the_console_is_behind_the_token_a_browser_can_give_and_under_a_strict_policy() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start_text(ConfigToml::new(&mock.url()).server("admin_token", "tok-7").with(send_rule())).await;
    let addr = gate.admin_addr();
    let asked = admin(addr, "GET", "/", None).await;
    assert_eq!(asked.status, 401);
    assert_eq!(
        asked.header("www-authenticate"),
        Some(r#"Basic realm="wxgate admin", charset="UTF-8""#),
        "a browser asks"
    );
    assert!(!asked.text().contains("<html"), "nothing of the page before the token");
    assert_eq!(basic(addr, "/", "wrong").await.status, 401);
    // Malformed or doubled credentials are refused, never guessed at.
    for auth in ["Basic !!not-base64!!", "Basic dG9rLTc=", "Digest tok-7", "Bearer"] {
        let a = admin_with(addr, "GET", "/", &[("authorization", auth)]).await;
        assert_eq!(a.status, 401, "{auth}");
    }
    let twice = [("authorization", "Bearer tok-7"), ("authorization", "Bearer wrong")];
    assert_eq!(admin_with(addr, "GET", "/v1/health", &twice).await.status, 401, "two Authorization fields");
    let same = [("authorization", "Bearer tok-7"), ("authorization", "Bearer tok-7")];
    assert_eq!(admin_with(addr, "GET", "/v1/health", &same).await.status, 401, "even the same twice");
    assert_eq!(basic(addr, "/console.js", "wrong").await.status, 401);
    let page = basic(addr, "/", "tok-7").await;
    assert_eq!(page.status, 200, "{}", page.text());
    assert_eq!(page.header("content-type"), Some("text/html; charset=utf-8"));
    let policy = page.header("content-security-policy").expect("a policy").to_owned();
    for part in ["default-src 'none'", "script-src 'self'", "connect-src 'self'", "frame-ancestors 'none'"] {
        assert!(policy.contains(part), "{policy}");
    }
    assert!(!policy.contains("unsafe-inline") && !policy.contains("http"), "nothing inline, no other origin: {policy}");
    assert_eq!(page.header("x-content-type-options"), Some("nosniff"));
    let html = page.text();
    assert!(html.contains(r#"<script src="/console.js""#) && !html.contains("<script>"), "no inline script");
    assert!(
        !html.contains("http://") && !html.contains("https://") && !html.contains("//cdn"),
        "nothing from elsewhere"
    );
    let script = basic(addr, "/console.js", "tok-7").await;
    assert_eq!(script.header("content-type"), Some("text/javascript; charset=utf-8"));
    assert!(!script.text().contains("innerHTML"), "values go in as text");
    assert_eq!(basic(addr, "/console.css", "tok-7").await.status, 200);
    // The browser's cached Basic credentials serve the API too; Bearer the page.
    assert_eq!(basic(addr, "/v1/health", "tok-7").await.status, 200);
    assert_eq!(admin(addr, "GET", "/", Some("tok-7")).await.status, 200);
    let api = admin(addr, "GET", "/v1/health", None).await;
    assert_eq!((api.status.as_u16(), api.header("www-authenticate")), (401, Some("Bearer")));
    // A page on another site (another port is another origin) may not even
    // read with the browser's saved credentials; the console's own may.
    let bearer = ("authorization", "Bearer tok-7");
    for (site, status) in [("cross-site", 403), ("same-site", 403), ("same-origin", 200), ("none", 200)] {
        let a = admin_with(addr, "GET", "/v1/accounts?top=100", &[bearer, ("sec-fetch-site", site)]).await;
        assert_eq!(a.status, status, "Sec-Fetch-Site: {site}: {}", a.text());
    }
    // Without a token, a DNS-rebound name cannot read the page either.
    let open = Gate::start(&mock, send_rule()).await;
    let req = "GET / HTTP/1.1\r\nHost: attacker.example:9090\r\nConnection: close\r\n\r\n";
    assert_eq!(support::wire::exchange(open.admin_addr(), req.as_bytes()).await.only().status, 403);
    assert_eq!(admin(open.admin_addr(), "GET", "/", None).await.status, 200);
}

#[tokio::test]
async fn the_console_reads_the_top_accounts_one_account_errcodes_callers_health_and_history() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start(&mock, send_rule()).await;
    let addr = gate.admin_addr();
    let get = |path: &'static str| async move {
        let a = admin(addr, "GET", path, None).await;
        assert_eq!(a.status, 200, "{path}: {}", a.text());
        a.json()
    };
    let history = get("/v1/history").await;
    assert_eq!(history["readings"].as_array().map(Vec::len), Some(0), "{history}");
    const SEND: &str = "/cgi-bin/message/custom/send";
    for (account, calls) in [("wxA", 3), ("wxB", 1), ("wxC", 1)] {
        for _ in 0..calls {
            assert_eq!(gate.get_as(account, SEND).await.status, 200);
        }
    }
    mock.respond(|_| errcode_reply(45009));
    assert_eq!(gate.get_as("wxB", SEND).await.status, 429);

    // The most used first (3 then 2 of 100), each with its state.
    let top = get("/v1/accounts?top=2").await;
    let pairs = top["pairs"].as_array().expect("pairs");
    let shown: Vec<(&str, u64)> = pairs
        .iter()
        .map(|p| (p["account"].as_str().unwrap_or(""), p["limits"][1]["used"].as_u64().unwrap_or(0)))
        .collect();
    assert_eq!(shown, [("wxA", 3), ("wxB", 2)], "{top}");
    assert_eq!(pairs[1]["penalty"]["active"], true);
    assert_eq!(pairs[0]["forecast"]["day_limit"], 100);
    assert_eq!(top["tracked"], 3);
    let found = get("/v1/accounts?q=C").await;
    assert_eq!(found["pairs"][0]["account"], "wxC", "{found}");
    assert_eq!(found["pairs"].as_array().map(Vec::len), Some(1));
    assert_eq!(admin(addr, "GET", "/v1/accounts?top=0", None).await.status, 400);
    assert_eq!(admin(addr, "GET", "/v1/accounts?top=101", None).await.status, 400);
    assert_eq!(admin(addr, "GET", "/v1/accounts?q=a%20b", None).await.status, 400);
    let encoded = admin(addr, "GET", "/v1/accounts?%74op=1", None).await;
    assert_eq!(encoded.status, 400, "an encoded name is neither read nor ignored: {}", encoded.text());
    let twice = admin(addr, "GET", "/v1/accounts?top=1&q=wx&top=100", None).await;
    assert_eq!(
        (twice.status.as_u16(), twice.json()["error"].as_str()),
        (400, Some("?top= is given twice: give it once"))
    );
    // One account on every rule, used or not.
    let one = get("/v1/accounts/wxB").await;
    assert_eq!(one["pairs"][0]["rule"], "send");
    assert_eq!(one["pairs"][0]["penalty"]["active"], true);
    assert_eq!(get("/v1/accounts/wxNever").await["pairs"][0]["limits"][1]["used"], 0);
    assert_eq!(admin(addr, "GET", "/v1/accounts/bad!", None).await.status, 400);

    let errcodes = get("/v1/errcodes").await;
    let last = &errcodes["errcodes"][0];
    assert_eq!((&last["errcode"], &last["account"], &last["rule"]), (&json!(45009), &json!("wxB"), &json!("send")));
    assert!(last["penalty_seconds"].as_f64().is_some_and(|s| s > 0.0), "{errcodes}");
    assert_eq!(errcodes["errcodes"].as_array().map(Vec::len), Some(1), "successes are not kept");

    let callers = get("/v1/callers").await;
    assert_eq!(callers["undeclared"]["calls"], json!({ "forwarded": 5, "penalised": 1 }), "{callers}");

    let health = get("/v1/health").await;
    assert_eq!(health["store"]["kind"], "memory");
    assert_eq!(health["upstreams"][0]["up"], true);
    assert_eq!(health["reloads"]["last_at"], Value::Null);
    assert_eq!(health["now"], "2026-11-29T10:00:00.000+08:00", "wxgate's clock in the quota's zone: {health}");

    // The plots' readings: every 10 s of wxgate's clock, what each rule did.
    gate.advance(std::time::Duration::from_secs(10));
    let mut history = Value::Null;
    eventually_async("a reading", PATIENCE, async || {
        history = get("/v1/history").await;
        history["readings"].as_array().is_some_and(|r| !r.is_empty())
    })
    .await;
    let send = &history["readings"][0]["rules"]["send"];
    assert_eq!((send["admitted"].as_f64(), send["refused"].as_f64()), (Some(0.5), Some(0.1)), "{history}");
}

/// On Redis, an instance lists the pairs it admitted, with the counts all
/// instances share: another instance's calls show in the use it reads.
#[tokio::test]
async fn the_top_accounts_on_redis_show_every_instances_use_of_the_pairs_this_one_saw() {
    let redis = RedisServer::start();
    let mock = MockWeChat::start().await;
    let rules = format!("{}\n{}", StoreToml::redis(&redis.url()), send_rule());
    let (a, b) = (Gate::start_real(&mock, rules.clone()).await, Gate::start_real(&mock, rules).await);
    const SEND: &str = "/cgi-bin/message/custom/send";
    assert_eq!(a.get_as("wxA", SEND).await.status, 200);
    for _ in 0..2 {
        assert_eq!(b.get_as("wxA", SEND).await.status, 200);
    }
    assert_eq!(b.get_as("wxB", SEND).await.status, 200);
    let top = admin(a.admin_addr(), "GET", "/v1/accounts", None).await.json();
    let pairs = top["pairs"].as_array().expect("pairs");
    assert_eq!(pairs.len(), 1, "only what this instance admitted: {top}");
    assert_eq!((pairs[0]["account"].as_str(), pairs[0]["limits"][1]["used"].as_u64()), (Some("wxA"), Some(3)), "{top}");
    let other = admin(b.admin_addr(), "GET", "/v1/accounts", None).await.json();
    assert_eq!(other["tracked"], 2, "{other}");
    let health = admin(a.admin_addr(), "GET", "/v1/health", None).await.json();
    let store = &health["store"];
    assert_eq!(
        (store["kind"].as_str(), store["fallback"].as_str(), store["degraded"].as_bool()),
        (Some("redis"), Some("local"), Some(false)),
        "{health}"
    );
}

/// Issue 61: `/v1/penalties` lists the penalties in force as Redis holds
/// them, whoever set them: one imposed by hand and one WeChat's 45009
/// started, both on instance A, are listed by instance B, which saw no
/// call of either pair (ending last first); a clear on B, and a lift,
/// take them off A's list. Also in a Cluster, where the index of
/// penalties lives in another slot than the pairs.
async fn penalties_set_on_one_instance_are_listed_by_another(store: StoreToml) {
    let mock = MockWeChat::start().await;
    let rules = format!("{store}\n{}", send_rule());
    let (a, b) = (Gate::start_real(&mock, rules.clone()).await, Gate::start_real(&mock, rules).await);
    const SEND: &str = "/cgi-bin/message/custom/send";
    let list = |gate: &Gate| {
        let addr = gate.admin_addr();
        async move {
            let answer = admin(addr, "GET", "/v1/penalties", None).await;
            assert_eq!(answer.status, 200, "{}", answer.text());
            let found = answer.json();
            assert_eq!(found["more"], false, "{found}");
            let pairs = found["pairs"].as_array().cloned().unwrap_or_default();
            pairs
                .iter()
                .map(|p| {
                    (p["account"].as_str().unwrap_or("").to_owned(), p["rule"].clone(), p["penalty"]["active"].clone())
                })
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(list(&b).await, [], "none yet");
    assert_eq!(admin(a.admin_addr(), "POST", "/v1/penalties/wxA/send?seconds=600", None).await.status, 200);
    mock.respond(|_| errcode_reply(45009));
    assert_eq!(a.get_as("wxB", SEND).await.status, 429);
    mock.respond(|_| ok_reply());
    let both = vec![("wxA".to_owned(), json!("send"), json!(true)), ("wxB".to_owned(), json!("send"), json!(true))];
    assert_eq!(list(&b).await, both, "A's penalties, listed by B");
    assert_eq!(admin(b.admin_addr(), "POST", "/v1/accounts/wxB/clear", None).await.status, 200);
    assert_eq!(list(&a).await, both[..1], "a clear lifts wxB's");
    assert_eq!(admin(b.admin_addr(), "DELETE", "/v1/penalties/wxA/send", None).await.status, 200);
    assert_eq!(list(&a).await, [], "lifted");
}

#[tokio::test]
async fn penalties_set_on_one_instance_are_listed_by_another_on_redis() {
    let redis = RedisServer::start();
    penalties_set_on_one_instance_are_listed_by_another(StoreToml::redis(&redis.url())).await;
}

#[tokio::test]
async fn penalties_set_on_one_instance_are_listed_by_another_in_a_redis_cluster() {
    let cluster = support::redis_server::RedisCluster::start(3);
    penalties_set_on_one_instance_are_listed_by_another(StoreToml::redis_cluster(cluster.urls())).await;
}
