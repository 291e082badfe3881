//! OpenTelemetry traces (docs/tracing.md), exported to a real OTLP/HTTP
//! receiver on loopback (tests/support/otlp.rs): each kind of call's
//! spans, parents and attributes; a caller's trace continued and its
//! context never sent to WeChat; no secret in anything exported; a dead or
//! slow collector costing counters, never a call.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::Span;
use support::otlp::{self, attr, unhex};
use support::temp::TempDir;
use support::tokens::{APPID, SECRET};
use support::{eventually, eventually_async, rule, ConfigToml, Gate, MockWeChat, PATIENCE};

const SEND: &str = "/cgi-bin/message/custom/send";
const INFO: &str = "/cgi-bin/user/info";
const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

fn traceparent() -> String {
    format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01")
}

fn send_rule() -> support::RuleToml {
    rule("send").matching(SEND).limit_burst(10, "10s", 1).max_wait("3s")
}

/// The span of `spans` named `name`.
fn named<'a>(spans: &'a [Span], name: &str) -> &'a Span {
    spans
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no span {name}: {:?}", spans.iter().map(|s| &s.name).collect::<Vec<_>>()))
}

#[tokio::test]
async fn a_forwarded_call_continues_its_callers_trace_and_its_context_never_reaches_wechat() {
    let collector = otlp::collector().await;
    let mock = MockWeChat::start().await;
    let gate = Gate::start(&mock, format!("{}\n{}", send_rule(), otlp::telemetry(&collector))).await;
    let body = r#"{"touser":"oRecipientOpenid","msgtype":"text","text":{"content":"private words"}}"#;
    let tp = traceparent();
    let answer = gate
        .post_with(
            &format!("{SEND}?access_token=SECRETTOKEN123"),
            body,
            &[
                ("traceparent", tp.as_str()),
                ("tracestate", "vendor=abc"),
                ("baggage", "user.id=42"),
                ("authorization", "Bearer CALLERKEY42"),
            ],
        )
        .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    // WeChat saw none of the caller's trace context.
    let sent = &mock.calls()[0];
    for name in ["traceparent", "tracestate", "baggage"] {
        assert!(sent.headers.get(name).is_none(), "{name} forwarded to WeChat");
    }
    let spans = otlp::trace_with(&collector, &unhex(CALLER_TRACE), "POST send").await;
    let server = named(&spans, "POST send");
    assert_eq!(server.kind, SpanKind::Server as i32);
    assert_eq!(server.parent_span_id, unhex(CALLER_SPAN), "a child of the caller's span");
    assert_eq!(server.trace_state, "vendor=abc");
    for (key, value) in [
        ("wxgate.rule", "send"),
        ("wxgate.account", "default"),
        ("wxgate.outcome", "forwarded"),
        ("http.response.status_code", "200"),
        ("wechat.errcode", "0"),
        ("url.path", SEND),
        ("http.request.method", "POST"),
    ] {
        assert_eq!(attr(server, key).as_deref(), Some(value), "{key}: {server:?}");
    }
    let decide = named(&spans, "wxgate.decide");
    assert_eq!(decide.parent_span_id, server.span_id);
    assert_eq!(attr(decide, "wxgate.decision").as_deref(), Some("admitted"));
    assert_eq!(attr(decide, "wxgate.store").as_deref(), Some("memory"));
    let upstream = named(&spans, "POST");
    assert_eq!((upstream.kind, &upstream.parent_span_id), (SpanKind::Client as i32, &server.span_id));
    assert_eq!(attr(upstream, "server.address").as_deref(), Some("127.0.0.1"));
    assert_eq!(attr(upstream, "server.port"), Some(mock.addr.port().to_string()));
    assert_eq!(attr(upstream, "http.response.status_code").as_deref(), Some("200"));
    // The first call to the mock made the connection: how long it took is told.
    assert_eq!(attr(upstream, "wxgate.connection").as_deref(), Some("new"));
    assert!(attr(upstream, "wxgate.connect_us").is_some_and(|us| us.parse::<i64>().is_ok_and(|us| us >= 0)));
    assert!(upstream.start_time_unix_nano >= decide.end_time_unix_nano, "sent after it was decided");
    assert!(server.start_time_unix_nano <= decide.start_time_unix_nano);
    assert!(server.end_time_unix_nano >= upstream.end_time_unix_nano);
    // Nothing a caller must keep to itself is in the export.
    let raw = otlp::raw(&collector);
    for secret in ["SECRETTOKEN123", "access_token", "oRecipientOpenid", "private words", "user.id", "CALLERKEY42"] {
        assert!(!raw.contains(secret), "{secret} exported");
    }
    // The resource says who exported it.
    let resource = otlp::requests(&collector)[0].resource_spans[0].resource.clone().expect("a resource");
    assert!(resource.attributes.iter().any(|kv| kv.key == "service.name"), "{resource:?}");
    // The latency histograms carry the trace id as an exemplar.
    let metrics = support::admin(gate.admin_addr(), "GET", "/metrics", None).await.text();
    assert!(metrics.contains(&format!("# {{trace_id=\"{CALLER_TRACE}\"}}")), "no exemplar:\n{metrics}");
    assert_eq!(gate.metric(r#"wxgate_trace_spans_total{what="dropped"}"#).await, Some(0.0));
}

#[tokio::test]
async fn a_call_without_a_traceparent_starts_a_trace_and_an_unsampled_caller_is_followed() {
    let collector = otlp::collector().await;
    let mock = MockWeChat::start().await;
    let gate = Gate::start(&mock, format!("{}\n{}", send_rule(), otlp::telemetry(&collector))).await;
    let unsampled = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-00");
    assert_eq!(gate.post_with(SEND, "{}", &[("traceparent", unsampled.as_str())]).await.status, 200);
    gate.advance(Duration::from_secs(1));
    assert_eq!(gate.post(SEND, "{}").await.status, 200);
    let server = otlp::span_named(&collector, "POST send").await;
    assert!(server.parent_span_id.is_empty(), "a root span");
    assert_ne!(server.trace_id, unhex(CALLER_TRACE));
    // Two traceparent fields are no context: a trace of its own.
    gate.advance(Duration::from_secs(1));
    let two = [("traceparent", traceparent()), ("traceparent", traceparent())];
    let two: Vec<(&str, &str)> = two.iter().map(|(k, v)| (*k, v.as_str())).collect();
    assert_eq!(gate.post_with(SEND, "{}", &two).await.status, 200);
    eventually_async("the third call's trace", PATIENCE, async || {
        otlp::spans(&collector).iter().filter(|s| s.name == "POST send").count() == 2
    })
    .await;
    let spans = otlp::spans(&collector);
    assert!(spans.iter().all(|s| s.trace_id != unhex(CALLER_TRACE)), "the unsampled caller's trace is not recorded");
}

#[tokio::test]
async fn a_held_and_a_refused_call_show_their_decision() {
    let collector = otlp::collector().await;
    let mock = MockWeChat::start().await;
    let info = rule("info").matching(INFO).limit(1, "10s");
    let gate = Arc::new(Gate::start(&mock, format!("{}\n{info}\n{}", send_rule(), otlp::telemetry(&collector))).await);
    assert_eq!(gate.post(SEND, "{}").await.status, 200);
    // 10 per 10 s, burst 1: the next slot is 1 s away, within max_wait.
    let g = gate.clone();
    let held = tokio::spawn(async move { g.post(SEND, "{}").await });
    eventually("the call held", PATIENCE, || gate.held_places() == 1).await;
    gate.advance(Duration::from_millis(1000));
    assert_eq!(held.await.expect("held call").status, 200);
    let hold = otlp::span_named(&collector, "wxgate.hold").await;
    assert_eq!(attr(&hold, "wxgate.held_ms").as_deref(), Some("1000"));
    let spans: Vec<Span> = otlp::spans(&collector).into_iter().filter(|s| s.trace_id == hold.trace_id).collect();
    let decide = named(&spans, "wxgate.decide");
    assert_eq!(attr(decide, "wxgate.decision").as_deref(), Some("held"));
    assert_eq!(hold.parent_span_id, named(&spans, "POST send").span_id);
    let upstream = named(&spans, "POST");
    assert_eq!(attr(upstream, "wxgate.connection").as_deref(), Some("reused"), "the first call's connection");
    assert_eq!(attr(upstream, "wxgate.connect_us"), None);
    // A rule without max_wait: its second call in 10 s is refused.
    assert_eq!(gate.get(INFO).await.status, 200);
    assert_eq!(gate.get(INFO).await.status, 429);
    let refusal = eventually_some_async_span(&collector, "refused").await;
    let spans: Vec<Span> = otlp::spans(&collector).into_iter().filter(|s| s.trace_id == refusal.trace_id).collect();
    let server = named(&spans, "GET info");
    assert_eq!(attr(server, "wxgate.outcome").as_deref(), Some("throttled"));
    assert_eq!(attr(server, "http.response.status_code").as_deref(), Some("429"));
    assert_eq!(attr(&refusal, "wxgate.reason").as_deref(), Some("rate"));
    assert!(attr(&refusal, "wxgate.wait_ms").is_some());
    assert!(!spans.iter().any(|s| s.kind == SpanKind::Client as i32), "a refused call never went upstream");
}

/// The first decision span with `wxgate.decision` = `decision`.
async fn eventually_some_async_span(collector: &MockWeChat, decision: &str) -> Span {
    support::eventually_some_async("a decision span", PATIENCE, async || {
        otlp::spans(collector)
            .into_iter()
            .find(|s| s.name == "wxgate.decide" && attr(s, "wxgate.decision").as_deref() == Some(decision))
    })
    .await
}

#[tokio::test]
async fn a_penalised_answer_carries_wechats_errcode() {
    let collector = otlp::collector().await;
    let mock = MockWeChat::start().await;
    mock.respond(|_| support::errcode_reply(45009));
    let gate = Gate::start(&mock, format!("{}\n{}", send_rule(), otlp::telemetry(&collector))).await;
    let answer = gate.post(SEND, "{}").await;
    assert_eq!(answer.json()["errcode"], 45009, "{}", answer.text());
    let server = otlp::span_named(&collector, "POST send").await;
    assert_eq!(attr(&server, "wechat.errcode").as_deref(), Some("45009"));
    assert_eq!(attr(&server, "wxgate.outcome").as_deref(), Some("penalised"));
}

#[tokio::test]
async fn a_token_fetch_and_a_resend_are_spans_of_the_call_that_needed_them() {
    let (mock, tokens) = support::tokens::mock_wechat(0).await;
    let collector = otlp::collector().await;
    let dir = TempDir::new("tracing-broker");
    let file = dir.write_secret("wx.secret", &format!("{SECRET}\n"));
    let token = rule("token").matching("/cgi-bin/stable_token").limit(2000, "day");
    let config = ConfigToml::new(&mock.url())
        .with(token)
        .with(rule("send").matching(SEND).limit(100, "day"))
        .with(format!(
            "[[account]]\nid = \"{APPID}\"\nkind = \"official_account\"\nsecret_file = \"{}\"\n",
            file.display()
        ))
        .with(otlp::telemetry(&collector));
    let gate = Gate::start_text(config).await;
    let tp = traceparent();
    let answer = gate.post_with(&format!("/@{APPID}{SEND}"), "{}", &[("traceparent", tp.as_str())]).await;
    assert_eq!(answer.json()["errcode"], 0, "{}", answer.text());
    let spans = otlp::trace_with(&collector, &unhex(CALLER_TRACE), "POST token").await;
    let server = named(&spans, "POST send");
    let fetch = named(&spans, "POST token");
    assert_eq!(fetch.parent_span_id, server.span_id, "the fetch is a child of the call that waited on it");
    assert_eq!(fetch.kind, SpanKind::Internal as i32);
    assert_eq!(attr(fetch, "wxgate.own").as_deref(), Some("true"));
    // WeChat then invalidates that token: the next call is sent once more.
    let first = tokens.issued()[0].clone();
    tokens.invalidate(&first);
    let tp2 = format!("00-{}-{CALLER_SPAN}-01", "5".repeat(32));
    let answer = gate.post_with(&format!("/@{APPID}{SEND}"), "{}", &[("traceparent", tp2.as_str())]).await;
    assert_eq!(answer.json()["errcode"], 0, "{}", answer.text());
    let spans = otlp::trace_with(&collector, &unhex(&"5".repeat(32)), "wxgate.resend").await;
    let resend = named(&spans, "wxgate.resend");
    assert_eq!(resend.kind, SpanKind::Client as i32);
    assert_eq!(attr(resend, "http.response.status_code").as_deref(), Some("200"));
    let raw = otlp::raw(&collector);
    assert!(!raw.contains(SECRET) && !raw.contains(&first), "a secret or token exported");
}

#[tokio::test]
async fn a_dead_or_slow_collector_costs_counted_spans_never_a_call() {
    // Dead: nothing listens at the endpoint.
    let dead = support::ports::ClosedPort::new();
    let mock = MockWeChat::start().await;
    let telemetry = format!("[telemetry]\nendpoint = \"{}\"\nbatch_delay = \"10ms\"\nmax_queued = 4\n", dead.url());
    let gate = Gate::start(&mock, format!("{}\n{telemetry}", rule("info").matching("/cgi-bin/user/info"))).await;
    for i in 0..20 {
        let a = gate.get(&format!("/cgi-bin/user/info?openid=o{i}")).await;
        assert_eq!(a.status, 200);
    }
    eventually_async("spans counted as lost", PATIENCE, async || {
        let dropped = gate.metric(r#"wxgate_trace_spans_total{what="dropped"}"#).await.unwrap_or(0.0);
        let failed = gate.metric(r#"wxgate_trace_spans_total{what="failed"}"#).await.unwrap_or(0.0);
        dropped + failed >= 40.0 && failed > 0.0
    })
    .await;
    // Slow: the collector takes exports and never answers them.
    let slow = otlp::collector().await;
    let _stalled = slow.hold_replies(support::ok_reply());
    let telemetry = format!("[telemetry]\nendpoint = \"{}\"\nbatch_delay = \"10ms\"\nmax_queued = 4\n", slow.url());
    let gate = Gate::start(&mock, format!("{}\n{telemetry}", rule("info").matching("/cgi-bin/user/info"))).await;
    // A first call's spans: the one export, which the collector never answers.
    assert_eq!(gate.get("/cgi-bin/user/info?openid=first").await.status, 200);
    eventually("the first export at the collector", PATIENCE, || slow.count() == 1).await;
    for i in 0..20 {
        let a = gate.get(&format!("/cgi-bin/user/info?openid=o{i}")).await;
        assert_eq!(a.status, 200);
    }
    // 20 calls of 3 spans while the export hangs: 4 queued, the rest dropped.
    assert_eq!(gate.metric(r#"wxgate_trace_spans_total{what="dropped"}"#).await, Some(56.0));
    assert_eq!(slow.count(), 1, "one export in flight at a time");
}

/// Issue 61: a caller's long paths while the collector hung were queued
/// whole (4096 spans of 60 KiB paths: 193 MB). Now every value is cut to
/// `max_attribute_bytes` (256) and the queue holds at most
/// `max_queued_bytes`, the export under way included.
#[tokio::test]
async fn long_paths_while_the_collector_hangs_are_cut_and_held_within_max_queued_bytes() {
    let slow = otlp::collector().await;
    let stalled = slow.hold_replies(support::ok_reply());
    let mock = MockWeChat::start().await;
    let long = rule("long").matching("/cgi-bin/long/*").limit(1, "10s");
    let telemetry = format!(
        "[telemetry]\nendpoint = \"{}\"\nbatch_delay = \"10ms\"\ntimeout = \"60s\"\nmax_queued_bytes = \"64KiB\"\n",
        slow.url()
    );
    let gate = Gate::start(&mock, format!("{long}\n{telemetry}")).await;
    // A first call's spans: the one export, which the collector never answers.
    assert_eq!(gate.get("/cgi-bin/long/first").await.status, 200);
    eventually("the first export at the collector", PATIENCE, || slow.count() == 1).await;
    let tail = "a".repeat(16 * 1024);
    // Even: rule long, its one call in 10 s spent (refused); odd: no rule (forwarded).
    let path = |i: usize| format!("/cgi-bin/{}/{i}/{tail}", if i % 2 == 0 { "long" } else { "free" });
    for i in 0..60 {
        let a = gate.get(&path(i)).await;
        assert_eq!(a.status, if i % 2 == 0 { 429 } else { 200 }, "{i}: {}", a.text());
    }
    // 120 spans, 90 of them with a 16 KiB path: what is held stays within the bound.
    let held = gate.metric("wxgate_trace_queued_bytes").await.expect("the gauge");
    assert!(held > 0.0 && held <= 65536.0, "{held} bytes held");
    let dropped = gate.metric(r#"wxgate_trace_spans_total{what="dropped"}"#).await.expect("counted");
    assert!(dropped > 0.0, "the spans past the bound are dropped");
    assert_eq!(slow.count(), 1, "one export in flight at a time");
    // The collector answers: what was held is exported, every value cut to 256 bytes.
    // Each call made two spans: its own and its decision (refused), or its
    // own and WeChat's (forwarded without a rule); the first call three.
    stalled.add_permits(1_000);
    eventually_async("every span exported or dropped", PATIENCE, async || {
        let exported = gate.metric(r#"wxgate_trace_spans_total{what="exported"}"#).await.unwrap_or(0.0);
        let dropped = gate.metric(r#"wxgate_trace_spans_total{what="dropped"}"#).await.unwrap_or(0.0);
        let held = gate.metric("wxgate_trace_queued_bytes").await;
        exported + dropped == 3.0 + 120.0 && held == Some(0.0)
    })
    .await;
    let spans = otlp::spans(&slow);
    let exported = gate.metric(r#"wxgate_trace_spans_total{what="exported"}"#).await;
    assert_eq!(exported, Some(spans.len() as f64));
    let paths: Vec<String> = spans.iter().filter_map(|s| attr(s, "url.path")).collect();
    assert!(paths.iter().all(|p| p.len() <= 256), "{:?}", paths.iter().map(String::len).collect::<Vec<_>>());
    assert!(paths.contains(&path(0)[..256].to_owned()), "the first refused call's path, cut: {paths:?}");
    assert!(paths.contains(&path(1)[..256].to_owned()), "the first forwarded call's path, cut: {paths:?}");
}

/// Issue 61: a headers file (the collector's API key) anyone could read
/// was accepted; it is refused as `callback_key_file` is.
#[test]
fn a_headers_file_others_may_read_is_refused_naming_the_field() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new("tracing-headers");
    let headers = dir.write("otlp-headers", "api-key=VENDORSECRET\n");
    let config = ConfigToml::new("http://127.0.0.1:9")
        .with(rule("info").matching(INFO).limit(1, "10s"))
        .with(format!("[telemetry]\nendpoint = \"http://127.0.0.1:4318\"\nheaders_file = \"{}\"\n", headers.display()));
    let config = dir.write("rules.toml", &config.to_string());
    let check = |mode: u32| {
        std::fs::set_permissions(&headers, std::fs::Permissions::from_mode(mode)).expect("chmod");
        support::process::run(&["check", "--config", &config.display().to_string()], &[])
    };
    let (code, _, stderr) = check(0o666);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("[telemetry] headers_file:"), "{stderr}");
    assert!(stderr.contains("has mode 0666: others can read it") && stderr.contains("chmod 600"), "{stderr}");
    assert!(!stderr.contains("VENDORSECRET"), "{stderr}");
    // Its owner's alone, or also its group's to read (a Kubernetes Secret's fsGroup).
    for mode in [0o600, 0o440] {
        let (code, stdout, stderr) = check(mode);
        assert_eq!(code, 0, "{mode:o}: {stdout}{stderr}");
    }
}

#[tokio::test]
async fn a_queued_deliverys_send_is_linked_to_the_call_that_submitted_it() {
    use support::queue::{gate, msgid, queued_with, until_state, wechat};
    let (mock, _tokens) = wechat(|_, n| msgid(n)).await;
    let collector = otlp::collector().await;
    let dir = TempDir::new("tracing-queue");
    const TEMPLATE: &str = "/cgi-bin/message/template/send";
    let token = rule("token").matching("/cgi-bin/stable_token").limit(2000, "day");
    let send = rule("template_send").matching(TEMPLATE).limit(100, "day").set("queue", true);
    let rules = format!("{token}\n{send}");
    let extra = format!("{}\n{}", support::caller("hr"), otlp::telemetry(&collector));
    let gate = gate(&mock, &dir, &rules, "", &extra).await;
    let tp = traceparent();
    let id = queued_with(&gate, "hr", TEMPLATE, r#"{"touser":"o1"}"#, &[("traceparent", tp.as_str())]).await;
    until_state(&gate, "hr", &id, "sent").await;
    // The submission: a span of the caller's trace.
    let submitted = otlp::trace_with(&collector, &unhex(CALLER_TRACE), "POST template_send").await;
    let submission = named(&submitted, "POST template_send");
    assert_eq!(attr(submission, "http.response.status_code").as_deref(), Some("202"));
    // The send, later, by the dispatcher: a trace of its own, linked to it.
    let send = support::eventually_some_async("the send's span", PATIENCE, async || {
        otlp::spans(&collector)
            .into_iter()
            .find(|s| s.name == "POST template_send" && attr(s, "wxgate.queued").as_deref() == Some("true"))
    })
    .await;
    assert_ne!(send.trace_id, unhex(CALLER_TRACE));
    assert_eq!(send.links.len(), 1, "{send:?}");
    assert_eq!((&send.links[0].trace_id, &send.links[0].span_id), (&submission.trace_id, &submission.span_id));
    assert_eq!(attr(&send, "wechat.errcode").as_deref(), Some("0"));
    let spans: Vec<Span> = otlp::spans(&collector).into_iter().filter(|s| s.trace_id == send.trace_id).collect();
    assert!(
        spans.iter().any(|s| s.name == "POST" && s.parent_span_id == send.span_id),
        "the send's exchange with WeChat is its child"
    );
    // The token the send needed was fetched inside its trace.
    let fetch = named(&spans, "POST token");
    assert_eq!(fetch.parent_span_id, send.span_id);
}

#[tokio::test]
async fn the_standard_variables_turn_it_on_and_the_json_access_log_carries_the_trace_id() {
    let collector = otlp::collector().await;
    let mock = MockWeChat::start().await;
    let text = ConfigToml::new(&mock.url()).with("[log]\nformat = \"json\"\n").with(send_rule()).to_string();
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url()),
        ("OTEL_EXPORTER_OTLP_HEADERS", "x-vendor-key=VENDORSECRET%3D".to_owned()),
        ("OTEL_SERVICE_NAME", "egress-wxgate".to_owned()),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let gate = support::process::spawn(&text, "tracing-env", &env).expect("serving");
    let tp = traceparent();
    let req = http::Request::post(gate.url(SEND))
        .header("traceparent", tp.as_str())
        .body(http_body_util::Full::new(bytes::Bytes::from_static(b"{}")))
        .expect("request");
    assert_eq!(support::send(req).await.status, 200);
    let line = support::eventually_some("an access log line", PATIENCE, || {
        gate.logged().lines().find(|l| l.contains("wxgate::access")).map(str::to_owned)
    })
    .await;
    let v: serde_json::Value = serde_json::from_str(&line).expect("one JSON object per line");
    assert_eq!(v["trace_id"], CALLER_TRACE, "{v}");
    let spans = otlp::trace_with(&collector, &unhex(CALLER_TRACE), "POST send").await;
    assert!(!spans.is_empty());
    let export = &collector.calls()[0];
    assert_eq!(export.headers.get("x-vendor-key").and_then(|v| v.to_str().ok()), Some("VENDORSECRET="));
    let resource = otlp::requests(&collector)[0].resource_spans[0].resource.clone().expect("a resource");
    let name = resource.attributes.iter().find(|kv| kv.key == "service.name").and_then(|kv| kv.value.clone());
    assert!(format!("{name:?}").contains("egress-wxgate"), "{name:?}");
    assert!(!gate.logged().contains("VENDORSECRET"), "the vendor key logged");
}
