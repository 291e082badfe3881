//! Secrets never leak: the wxgate binary, logging at trace or debug level,
//! serves calls that carry WeChat secrets in the query, the JSON body and the
//! headers, through every kind of answer wxgate writes itself (429 from a
//! limit or a penalty, 400, 413, 502, 504), and one access token learned
//! from its token answer, then used by a call that names another account. Neither its logs nor any answer
//! it wrote (nor its admin endpoints) may contain a secret. WeChat's own
//! answers are relayed unchanged and are not checked.

use crate::support;

use tokio::net::TcpSocket;

use support::process::{self, Instance};
use support::*;

const SECRETS: [&str; 6] = ["SEKRIT_AT_1", "SEKRIT_S_2", "SEKRIT_CS_3", "SEKRIT_C_4", "SEKRIT_JS_5", "SEKRIT_RT_6"];

const QUERY: &str = "access_token=SEKRIT_AT_1&secret=SEKRIT_S_2&corpsecret=SEKRIT_CS_3&code=SEKRIT_C_4&js_code=SEKRIT_JS_5&refresh_token=SEKRIT_RT_6";

const BODY: &str = r#"{"access_token":"SEKRIT_AT_1","secret":"SEKRIT_S_2","corpsecret":"SEKRIT_CS_3","code":"SEKRIT_C_4","js_code":"SEKRIT_JS_5","refresh_token":"SEKRIT_RT_6"}"#;

/// The same names as headers, plus the usual carriers of credentials.
const HEADERS: &str =
    "Access-Token: SEKRIT_AT_1\r\nSecret: SEKRIT_S_2\r\nCorpsecret: SEKRIT_CS_3\r\nCode: SEKRIT_C_4\r\n\
Js-Code: SEKRIT_JS_5\r\nRefresh-Token: SEKRIT_RT_6\r\nAuthorization: Bearer SEKRIT_AT_1\r\n\
Cookie: access_token=SEKRIT_AT_1; secret=SEKRIT_S_2\r\nX-Wx-Account: wx1234567890abcdef\r\n";

/// The wxgate binary on `config`, logging at `filter`.
fn start(config: &str, tag: &str, filter: &str) -> Instance {
    let tag = format!("secrets-{tag}");
    process::spawn(config, &tag, &[("WXGATE_LOG", filter)]).unwrap_or_else(|log| panic!("wxgate did not start:\n{log}"))
}

/// One call: what to send, what status to expect, and whether wxgate wrote
/// the answer itself (then the whole answer is checked) or relayed WeChat's.
struct Call {
    label: &'static str,
    request: Vec<u8>,
    status: u16,
    generated: bool,
}

fn get(label: &'static str, path: &str, status: u16, generated: bool) -> Call {
    let request = format!("GET {path}?{QUERY} HTTP/1.1\r\nHost: wxgate\r\n{HEADERS}Connection: close\r\n\r\n");
    Call { label, request: request.into_bytes(), status, generated }
}

fn post(label: &'static str, path: &str, body: &str, status: u16, generated: bool) -> Call {
    let request = format!(
        "POST {path}?{QUERY} HTTP/1.1\r\nHost: wxgate\r\n{HEADERS}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    Call { label, request: request.into_bytes(), status, generated }
}

fn raw_call(label: &'static str, request: String, status: u16) -> Call {
    Call { label, request: request.into_bytes(), status, generated: true }
}

/// A body over 1 KiB that is all secrets.
fn big_body() -> String {
    let mut b = String::from("{\"items\":[");
    while b.len() < 2048 {
        b.push_str(BODY);
        b.push(',');
    }
    b.push_str(BODY);
    b.push_str("]}");
    b
}

fn chunked_big_body() -> String {
    let piece = BODY;
    let mut out = format!(
        "POST /cgi-bin/other?{QUERY} HTTP/1.1\r\nHost: wxgate\r\n{HEADERS}Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    );
    for _ in 0..16 {
        out.push_str(&format!("{:x}\r\n{piece}\r\n", piece.len()));
    }
    out.push_str("0\r\n\r\n");
    out
}

fn leaks(text: &str) -> Vec<&'static str> {
    SECRETS.iter().copied().filter(|s| text.contains(s)).collect()
}

/// One call a day on "send", no limits on "punished" and the default rule.
fn config(upstream: &str, log_format: &str) -> String {
    ConfigToml::new(upstream)
        .server("upstream_timeout", "1s")
        .server("max_body", "1KiB")
        .with(format!("[log]\nformat = \"{log_format}\"\n"))
        .with(rule("send").matching("/cgi-bin/message/custom/send").limit(1, "day"))
        .with(rule("punished").matching("/cgi-bin/punished"))
        .with(rule("default"))
        .to_string()
}

async fn no_secrets_anywhere(filter: &str, log_format: &str) {
    let mock = MockWeChat::start().await;
    mock.respond(|rec| {
        if rec.path_and_query.starts_with("/cgi-bin/punished") {
            errcode_reply(45009)
        } else if rec.path_and_query.starts_with("/cgi-bin/hang") {
            Reply::Hang
        } else if rec.path_and_query.starts_with("/cgi-bin/token?") {
            Reply::Json {
                body: r#"{"access_token":"SEKRIT_AT_1","expires_in":7200}"#.into(),
                content_type: "text/plain",
            }
        } else {
            ok_reply()
        }
    });
    // Bound but not listening: connections are refused, and nobody else can take the port.
    let closed = TcpSocket::new_v4().expect("socket");
    closed.bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
    let closed_port = closed.local_addr().expect("addr").port();

    let tag = format!("{}-{log_format}", filter.replace(|c: char| !c.is_ascii_alphanumeric(), "_"));
    let gate = start(&config(&mock.url(), log_format), &format!("{tag}-main"), filter);
    let dead = start(&config(&format!("http://127.0.0.1:{closed_port}"), log_format), &format!("{tag}-dead"), filter);

    let send = "/cgi-bin/message/custom/send";
    let punished = "/cgi-bin/punished";
    let on_gate = vec![
        // WeChat answers the token SEKRIT_AT_1, which wxgate learns for wx1234567890abcdef ...
        Call {
            label: "a token request",
            request: format!(
                "GET /cgi-bin/token?{QUERY}&appid=wx1234567890abcdef HTTP/1.1\r\nHost: wxgate\r\n{HEADERS}Connection: close\r\n\r\n"
            )
            .into_bytes(),
            status: 200,
            generated: false,
        },
        // ... and refuses when another account is named with it.
        raw_call(
            "the learned token, another account named",
            format!("GET {send}?{QUERY} HTTP/1.1\r\nHost: wxgate\r\nX-Wx-Account: wxOTHER\r\nConnection: close\r\n\r\n"),
            400,
        ),
        get("first send, forwarded", send, 200, false),
        post("second send, over the day quota", send, BODY, 429, true),
        get("WeChat answers 45009", punished, 429, false),
        post("paused by the penalty", punished, BODY, 429, true),
        post("WeChat hangs past upstream_timeout", "/cgi-bin/hang", BODY, 504, true),
        post("body over max_body", send, &big_body(), 413, true),
        raw_call("chunked body growing past max_body", chunked_big_body(), 413),
        raw_call(
            "invalid X-Wx-Account",
            format!("GET /cgi-bin/token?{QUERY} HTTP/1.1\r\nHost: wxgate\r\nX-Wx-Account: SEKRIT_AT_1/SEKRIT_S_2\r\nConnection: close\r\n\r\n"),
            400,
        ),
        raw_call(
            "absolute-form target",
            format!("GET http://api.weixin.qq.com/cgi-bin/token?{QUERY} HTTP/1.1\r\nHost: api.weixin.qq.com\r\n{HEADERS}Connection: close\r\n\r\n"),
            400,
        ),
        raw_call(
            "CONNECT",
            "CONNECT SEKRIT_AT_1.example:443 HTTP/1.1\r\nHost: SEKRIT_AT_1.example:443\r\nConnection: close\r\n\r\n".to_owned(),
            400,
        ),
        raw_call(
            "invalid header bytes",
            format!("GET /cgi-bin/token?{QUERY} HTTP/1.1\r\nHost: wxgate\r\nBad Header: SEKRIT_S_2\r\n{HEADERS}\r\n"),
            400,
        ),
        // Issue 44 item 14: a refused path is logged as "<refused path>",
        // never as written (it may carry a secret where a query belongs).
        raw_call(
            "a query hidden in the path as %3F",
            format!("GET {send}%3Faccess_token=SEKRIT_AT_1&secret=SEKRIT_S_2 HTTP/1.1\r\nHost: wxgate\r\nConnection: close\r\n\r\n"),
            400,
        ),
        raw_call(
            "path parameters after ;",
            format!("GET {send};corpsecret=SEKRIT_CS_3 HTTP/1.1\r\nHost: wxgate\r\nConnection: close\r\n\r\n"),
            400,
        ),
        raw_call(
            "a secret as a path segment",
            "GET /cgi-bin/token/code=SEKRIT_C_4 HTTP/1.1\r\nHost: wxgate\r\nConnection: close\r\n\r\n".to_owned(),
            400,
        ),
        raw_call(
            "a secret in an invalid @account prefix",
            format!("GET /@SEKRIT_JS_5=x/{send} HTTP/1.1\r\nHost: wxgate\r\nConnection: close\r\n\r\n"),
            400,
        ),
        raw_call(
            "conflicting Content-Lengths",
            format!("POST /cgi-bin/token?{QUERY} HTTP/1.1\r\nHost: wxgate\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n{BODY}"),
            400,
        ),
    ];
    let on_dead = vec![
        get("upstream refuses connections", "/cgi-bin/token", 502, true),
        post("upstream refuses connections, with a body", send, BODY, 502, true),
    ];

    let mut checked = 0;
    for (proc, calls) in [(&gate, on_gate), (&dead, on_dead)] {
        for call in calls {
            let ex = exchange(proc.addr, &call.request).await;
            let answer = ex.closed_text();
            assert_eq!(ex.only().status, call.status, "{}: {answer}", call.label);
            if call.generated {
                checked += 1;
                let leaked = leaks(&answer);
                assert!(leaked.is_empty(), "{}: wxgate's answer contains {leaked:?}:\n{answer}", call.label);
            }
        }
    }
    assert_eq!(checked, 17);
    // The calls did carry the secrets: WeChat got them (so a clean log means something).
    let first = &mock.calls()[0];
    assert!(first.path_and_query.contains("SEKRIT_AT_1"), "{first:?}");
    assert_eq!(first.headers.get("secret").map(|v| v.as_bytes()), Some(&b"SEKRIT_S_2"[..]));

    // The admin endpoints describe rules, buckets and counts, never calls.
    for proc in [&gate, &dead] {
        let Some(admin) = proc.admin else { continue };
        // ... nor does the console and what it reads (the errcodes, the
        // accounts, callers, health, queues) after these calls.
        for path in [
            "/metrics",
            "/v1/rules",
            "/v1/buckets/wx1234567890abcdef/send",
            "/v1/buckets/wx1234567890abcdef/punished",
            "/",
            "/console.js",
            "/v1/errcodes",
            "/v1/accounts?top=100",
            "/v1/accounts/wx1234567890abcdef",
            "/v1/callers",
            "/v1/health",
            "/v1/history",
            "/v1/queues",
        ] {
            let answer = exchange(
                admin,
                format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").as_bytes(),
            )
            .await
            .closed_text();
            let leaked = leaks(&answer);
            assert!(leaked.is_empty(), "admin {path} contains {leaked:?}:\n{answer}");
        }
    }
    // The console's actions are logged (below: with no secret).
    if let Some(admin) = gate.admin {
        let lift =
            "DELETE /v1/penalties/wx1234567890abcdef/punished HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
        assert_eq!(exchange(admin, lift.as_bytes()).await.only().status, 200);
        let clear = "POST /v1/accounts/wx1234567890abcdef/clear HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
        assert_eq!(exchange(admin, clear.as_bytes()).await.only().status, 200);
    }

    let gate_log = gate.stop().await;
    let dead_log = dead.stop().await;
    drop(closed);
    // The logs did record these calls (so an empty capture cannot pass) ...
    assert!(gate_log.contains("penalised"), "the penalty is logged:\n{gate_log}");
    assert!(gate_log.contains("penalty set by hand (0 = lifted)"), "a lift is logged:\n{gate_log}");
    assert!(gate_log.contains("quota cleared by hand"), "a clear is logged:\n{gate_log}");
    assert!(gate_log.contains("/cgi-bin/hang"), "the 504 is logged:\n{gate_log}");
    assert!(gate_log.contains("<refused path>"), "the refused paths are logged:\n{gate_log}");
    assert!(dead_log.contains("/cgi-bin/token"), "the 502 is logged:\n{dead_log}");
    // ... and never a secret.
    for (name, log) in [("main", &gate_log), ("dead upstream", &dead_log)] {
        let leaked = leaks(log);
        let lines: Vec<&str> = log.lines().filter(|l| !leaks(l).is_empty()).take(10).collect();
        assert!(
            leaked.is_empty(),
            "{name} log (WXGATE_LOG={filter}, {log_format}) contains {leaked:?}:\n{}",
            lines.join("\n")
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_in_trace_logs_or_in_answers_wxgate_writes() {
    no_secrets_anywhere("trace", "text").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_in_debug_json_logs_or_in_answers_wxgate_writes() {
    no_secrets_anywhere("debug", "json").await;
}

/// `caller_auth = "required"`: a caller's key (right or wrong, Bearer or
/// Basic) is never in a log line at trace level, an answer wxgate wrote,
/// the admin API, or what reaches WeChat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_caller_key_in_trace_logs_answers_admin_or_upstream() {
    const KEY: &str = "SEKRIT_KEY_7_0123456789";
    let mock = MockWeChat::start().await;
    let digest: String = wxgate::config::KeyDigest::of(KEY.as_bytes()).0.iter().map(|b| format!("{b:02x}")).collect();
    let config = ConfigToml::new(&mock.url())
        .server("caller_auth", "required")
        .with(caller("orders").set("key_sha256", digest.clone()).set("accounts", vec!["wxA"]))
        .with(rule("send").matching("/cgi-bin/message/custom/send").limit(10, "day"))
        .to_string();
    let gate = start(&config, "caller-key", "trace");
    let basic = |name: &str, key: &str| {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(format!("{name}:{key}"))
    };
    let send = "/cgi-bin/message/custom/send?access_token=T";
    let calls = [
        (format!("Authorization: Bearer {KEY}\r\nX-Wx-Account: wxA\r\n"), 200),
        (format!("Authorization: Basic {}\r\nX-Wx-Account: wxA\r\n", basic("orders", KEY)), 200),
        (format!("Authorization: Bearer {KEY}\r\nX-Wx-Account: wxB\r\n"), 403),
        (format!("Authorization: Bearer {KEY}_WRONG\r\nX-Wx-Account: wxA\r\n"), 401),
        (format!("Authorization: Basic {}\r\nX-Wx-Account: wxA\r\n", basic("approvals", KEY)), 401),
    ];
    for (headers, status) in &calls {
        let request = format!("GET {send} HTTP/1.1\r\nHost: wxgate\r\n{headers}Connection: close\r\n\r\n");
        let ex = exchange(gate.addr, request.as_bytes()).await;
        let answer = ex.closed_text();
        assert_eq!(ex.only().status, *status, "{headers}: {answer}");
        assert!(!answer.contains("SEKRIT_KEY_7") && !answer.contains(&digest), "{answer}");
    }
    assert!(mock.calls().iter().all(|c| c.headers.get("authorization").is_none()), "taken off before forwarding");
    let admin = gate.admin.expect("admin");
    for path in ["/metrics", "/v1/callers", "/v1/rules"] {
        let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
        let answer = exchange(admin, request.as_bytes()).await.closed_text();
        assert!(!answer.contains("SEKRIT_KEY_7") && !answer.contains(&digest), "admin {path}: {answer}");
    }
    let log = gate.stop().await;
    assert!(log.contains("unauthorized"), "the refusals are logged:\n{log}");
    let leaked: Vec<&str> = log.lines().filter(|l| l.contains("SEKRIT_KEY_7") || l.contains(&digest)).take(5).collect();
    assert!(leaked.is_empty(), "the log holds the key:\n{}", leaked.join("\n"));
}
