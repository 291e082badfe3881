//! Request bodies over real sockets: an upload may take longer than
//! `upstream_timeout` as long as its bytes keep moving; a client that stops
//! sending mid-body gets 408 after `body_timeout`, an upstream that stops
//! taking the body 504; a malformed or truncated body is the client's fault
//! (400, `rejected_bad_request`), never counted or logged as WeChat's.

use crate::support;

use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use support::bodies::{chunked_body, send_and_abort, send_paced, stalled_bodies, DeafUpstream, StrictUpstream};
use support::*;

const UPLOAD: &str = "/cgi-bin/media/upload";

/// A rule without limits on [`UPLOAD`].
fn upload_rule() -> RuleToml {
    rule("upload").matching(UPLOAD)
}

/// `wxgate_calls_total` of `rule` with `outcome`, from the admin `/metrics`.
async fn calls(gate: &Gate, rule: &str, outcome: &str) -> f64 {
    let text = get_at(gate.admin_addr(), "/metrics").await.text();
    sample(&text, &format!("wxgate_calls_total{{rule=\"{rule}\",outcome=\"{outcome}\"}}")).unwrap_or(0.0)
}

/// A request head for [`UPLOAD`] with this framing header; the query carries
/// a secret that no answer may repeat.
fn upload_head(framing: &str) -> String {
    format!("POST {UPLOAD}?access_token=SECRET&type=image HTTP/1.1\r\nHost: x\r\n{framing}\r\n\r\n")
}

/// Asserts a WeChat-shaped refusal of the client's request: `status`,
/// errcode 40097, an errmsg containing `says` and no secret.
fn assert_client_fault(label: &str, resp: &RawResponse, status: u16, says: &str) {
    assert_eq!(resp.status, status, "{label}: {}", resp.text());
    assert_eq!(resp.header("content-type"), Some("application/json"), "{label}");
    let json = resp.json();
    assert_eq!(json["errcode"], 40097, "{label}: {json}");
    let errmsg = json["errmsg"].as_str().unwrap_or_default();
    assert!(errmsg.starts_with("wxgate: ") && errmsg.contains(says), "{label}: {json}");
    assert!(!errmsg.contains("SECRET"), "{label}: no query in the answer: {json}");
}

// --- uploads and timeouts -------------------------------------------------------

#[tokio::test]
async fn upload_slower_than_upstream_timeout_is_forwarded_whole_once() {
    let mock = MockWeChat::start().await;
    let config = ConfigToml::new(&mock.url()).server("upstream_timeout", "1s").with(upload_rule());
    let gate = Gate::start_text(config).await;
    let body: Vec<u8> = (0..96 * 1024).map(|i| (i % 251) as u8).collect();
    let content_length = upload_head(&format!("Connection: close\r\nContent-Length: {}", body.len()));
    let chunks: Vec<&[u8]> = body.chunks(8 * 1024).collect();
    let chunked = upload_head("Connection: close\r\nTransfer-Encoding: chunked");
    for (label, head, wire) in
        [("Content-Length", content_length, body.clone()), ("chunked", chunked, chunked_body(&chunks))]
    {
        let before = mock.count();
        let started = Instant::now();
        // 15 writes 100 ms apart: the body takes 1.4 s, upstream_timeout is 1 s.
        let ex = send_paced(gate.addr, &head, &wire, 15, Duration::from_millis(100)).await;
        assert_eq!(ex.only().status, 200, "{label}: {}", ex.text());
        assert!(started.elapsed() >= Duration::from_millis(1400), "{label}: the upload outlasted upstream_timeout");
        let calls = mock.calls();
        assert_eq!(calls.len(), before + 1, "{label}: WeChat got the call once");
        assert_eq!(calls[before].body, body, "{label}: the whole body");
    }
    assert_eq!(calls(&gate, "upload", "forwarded").await, 2.0);
    assert_eq!(calls(&gate, "upload", "upstream_error").await, 0.0);
}

#[tokio::test]
async fn client_stalling_mid_body_is_408_after_body_timeout() {
    let (addr, upstream) = StrictUpstream::start().await;
    let config = ConfigToml::new(&format!("http://{addr}"))
        .server("upstream_timeout", "5s")
        .server("body_timeout", "1s")
        .with(upload_rule());
    let gate = Gate::start_text(config).await;
    for (label, bytes) in stalled_bodies(upload_head) {
        let started = Instant::now();
        // The client keeps its connection open and sends nothing more.
        let ex = exchange(gate.addr, &bytes).await;
        let waited = started.elapsed();
        assert_client_fault(label, &ex.only(), 408, "body_timeout");
        assert!(waited >= Duration::from_millis(950), "{label}: not before body_timeout: {waited:?}");
        assert!(waited < Duration::from_secs(5), "{label}: before upstream_timeout: {waited:?}");
    }
    assert!(upstream.complete().is_empty(), "no complete call reached the upstream");
    assert_eq!(calls(&gate, "upload", "rejected_bad_request").await, 2.0);
    assert_eq!(calls(&gate, "upload", "upstream_error").await, 0.0);
}

#[tokio::test]
async fn upstream_no_longer_taking_the_body_is_504_and_its_connection_is_closed() {
    let upstream = DeafUpstream::start();
    let config = ConfigToml::new(&upstream.url())
        .server("upstream_timeout", "5s")
        .server("body_timeout", "1s")
        .with(upload_rule());
    let gate = Gate::start_text(config).await;
    // Far more than the socket buffers between the client and the deaf
    // upstream hold; the client writes as fast as it can.
    let len = 32 << 20;
    let stream = TcpStream::connect(gate.addr).await.expect("connect");
    let (mut rd, mut wr) = stream.into_split();
    let head = upload_head(&format!("Content-Length: {len}"));
    let writer = tokio::spawn(async move {
        let piece = vec![b'x'; 64 * 1024];
        if wr.write_all(head.as_bytes()).await.is_ok() {
            for _ in 0..len / piece.len() {
                if wr.write_all(&piece).await.is_err() {
                    break;
                }
            }
        }
    });
    let started = Instant::now();
    let ex = read_until_closed(&mut rd).await;
    let waited = started.elapsed();
    writer.abort();
    let resp = ex.only();
    assert_eq!(resp.status, 504, "{}", ex.text());
    let json = resp.json();
    assert_eq!(json["errcode"], -1, "{json}");
    assert!(json["errmsg"].as_str().is_some_and(|m| m.contains("body_timeout")), "{json}");
    assert!(waited < Duration::from_secs(5), "before upstream_timeout: {waited:?}");
    assert_eq!(upstream.heads(), 1, "the call went upstream once");
    // wxgate gave up on the exchange: it closes the connection rather than
    // leave it, and the part of the body in it, lingering.
    upstream.drain();
    eventually("wxgate closing its connection to the upstream", PATIENCE, || upstream.closed() == 1).await;
    assert_eq!(calls(&gate, "upload", "upstream_error").await, 1.0);
    assert_eq!(calls(&gate, "upload", "rejected_bad_request").await, 0.0);
}

#[tokio::test]
async fn silent_upstream_is_504_upstream_timeout_after_the_whole_body() {
    let mock = MockWeChat::start().await;
    mock.respond(|_| Reply::Hang);
    let config = ConfigToml::new(&mock.url()).server("upstream_timeout", "300ms").with(upload_rule());
    let gate = Gate::start_text(config).await;
    let body = vec![b'z'; 6 * 1024];
    let head = upload_head(&format!("Connection: close\r\nContent-Length: {}", body.len()));
    let started = Instant::now();
    // 6 writes 100 ms apart: the body takes 500 ms, longer than upstream_timeout.
    let ex = send_paced(gate.addr, &head, &body, 6, Duration::from_millis(100)).await;
    let waited = started.elapsed();
    let resp = ex.only();
    assert_eq!(resp.status, 504, "{}", ex.text());
    let json = resp.json();
    assert_eq!(json["errcode"], -1, "{json}");
    assert!(json["errmsg"].as_str().is_some_and(|m| m.contains("300ms")), "names upstream_timeout: {json}");
    assert!(waited >= Duration::from_millis(800), "the body's 500 ms, then upstream_timeout: {waited:?}");
    assert_eq!(mock.calls()[0].body, body, "WeChat had the whole body");
    assert_eq!(calls(&gate, "upload", "upstream_error").await, 1.0);
}

// --- malformed and truncated bodies ------------------------------------------

#[tokio::test]
async fn malformed_chunked_bodies_are_400_and_the_clients_fault() {
    let (addr, upstream) = StrictUpstream::start().await;
    let gate = Gate::start_text(ConfigToml::new(&format!("http://{addr}")).with(upload_rule())).await;
    let long_extension = format!("5;ext={}\r\nworld\r\n0\r\n\r\n", "e".repeat(20_000));
    let cases: [(&str, &[u8]); 5] = [
        ("chunk size overflow", b"ffffffffffffffff1\r\nworld\r\n0\r\n\r\n"),
        ("LF in a chunk extension", b"5;name=va\nlue\r\nworld\r\n0\r\n\r\n"),
        ("20 KB chunk extension", long_extension.as_bytes()),
        ("chunk size not hex", b"zz\r\nworld\r\n0\r\n\r\n"),
        ("chunk longer than its size", b"5\r\nworld!!\r\n0\r\n\r\n"),
    ];
    for (label, broken) in cases {
        // A good first chunk: WeChat may have the head and part of the body.
        let mut req = upload_head("Transfer-Encoding: chunked").into_bytes();
        req.extend_from_slice(b"5\r\nhello\r\n");
        req.extend_from_slice(broken);
        let ex = exchange(gate.addr, &req).await;
        assert_client_fault(label, &ex.only(), 400, "request body");
    }
    assert!(upstream.complete().is_empty(), "no complete call reached the upstream");
    assert_eq!(calls(&gate, "upload", "rejected_bad_request").await, cases.len() as f64);
    assert_eq!(calls(&gate, "upload", "upstream_error").await, 0.0, "not WeChat's fault");
}

#[tokio::test]
async fn body_cut_short_by_the_client_is_400_and_keeps_its_rate_slot() {
    let (addr, upstream) = StrictUpstream::start().await;
    // Three calls an hour: the three cut-short calls below take them all.
    let gate =
        Gate::start_text(ConfigToml::new(&format!("http://{addr}")).with(upload_rule().limit_burst(3, "1h", 3))).await;
    let mut content_length = upload_head("Content-Length: 1000").into_bytes();
    content_length.extend_from_slice(&[b'a'; 100]);
    let mut chunked = upload_head("Transfer-Encoding: chunked").into_bytes();
    chunked.extend_from_slice(b"3e8\r\n");
    chunked.extend_from_slice(&[b'b'; 100]);
    // The client ends its side of the connection midway and waits for the answer.
    for (label, bytes) in [("Content-Length", &content_length), ("chunked", &chunked)] {
        let ex = exchange_half_closed(gate.addr, bytes).await;
        assert_client_fault(label, &ex.only(), 400, "incomplete");
    }
    // A client that closes its connection midway hears nothing, and the call
    // is still counted once, as the client's.
    send_and_abort(gate.addr, &content_length).await;
    eventually_async("the aborted call counted", PATIENCE, async || {
        calls(&gate, "upload", "rejected_bad_request").await == 3.0
    })
    .await;
    assert_eq!(calls(&gate, "upload", "upstream_error").await, 0.0, "not WeChat's fault");
    assert!(upstream.complete().is_empty(), "no complete call reached the upstream");
    // WeChat may have seen the start of each: the calls keep their slots.
    let mut whole = upload_head("Connection: close\r\nContent-Length: 5").into_bytes();
    whole.extend_from_slice(b"hello");
    let ex = exchange(gate.addr, &whole).await;
    assert_eq!(ex.only().status, 429, "{}", ex.text());
}

#[tokio::test]
async fn malformed_body_is_logged_as_the_clients_error_not_as_a_failed_call() {
    let (addr, _upstream) = StrictUpstream::start().await;
    let text = ConfigToml::new(&format!("http://{addr}")).with("[log]\nformat = \"json\"\n").with(upload_rule());
    let wxgate = support::process::spawn(&text.to_string(), "malformed-body", &[]).expect("serving");
    let mut req = upload_head("Transfer-Encoding: chunked").into_bytes();
    req.extend_from_slice(b"5\r\nhello\r\nffffffffffffffff1\r\nworld\r\n0\r\n\r\n");
    let ex = exchange(wxgate.addr, &req).await;
    assert_client_fault("overflow", &ex.only(), 400, "request body");
    let line = eventually_some("an access log line", PATIENCE, || {
        wxgate.logged().lines().find(|l| l.contains("wxgate::access")).map(str::to_owned)
    })
    .await;
    let v: serde_json::Value = serde_json::from_str(&line).expect("one JSON object per line");
    assert_eq!(v["outcome"], "rejected_bad_request", "{line}");
    assert_eq!(v["status"], 400, "{line}");
    assert!(v["error"].as_str().is_some_and(|e| e.contains("request body")), "says why: {line}");
    assert!(!line.contains("SECRET"), "{line}");
    let log = wxgate.stop().await;
    assert!(!log.contains("call failed"), "a client's mistake is no failed call: {log}");
}

// --- config ------------------------------------------------------------------

#[test]
fn body_timeout_is_a_duration_above_zero() {
    let parse = |v: &str| {
        let text = ConfigToml::new("http://127.0.0.1:9").server("body_timeout", v).to_string();
        wxgate::config::Config::parse(&text, std::path::Path::new("test.toml")).map_err(|e| e.to_string())
    };
    assert!(parse("30s").is_ok(), "{:?}", parse("30s").err());
    for bad in ["0s", "soon"] {
        let e = parse(bad).expect_err(bad);
        assert!(e.contains("[server] body_timeout"), "{bad}: {e}");
    }
}

// --- bodies wxgate reads whole: one no-progress timer ---------------------------

/// The paths a body takes: streamed with the caller's own token; read
/// whole because the broker adds a token (resent if WeChat rejects it),
/// because its rule counts recipients, or because it is a token request.
/// `body_timeout` and `header_timeout` are 1 s.
async fn every_body_path() -> (MockWeChat, Gate, support::TempDir) {
    use support::tokens::{account_toml, WeChatTokens, APPID, SECRET};
    let mock = MockWeChat::start().await;
    let tokens = WeChatTokens::new();
    let issuing = tokens.responder();
    mock.respond(move |rec| {
        let path = rec.path_and_query.split('?').next().unwrap_or("");
        if path == "/cgi-bin/token" || path == "/cgi-bin/stable_token" {
            issuing(rec)
        } else {
            ok_reply()
        }
    });
    let dir = support::TempDir::new("bodies-every-path");
    let config = ConfigToml::new(&mock.url())
        .server("upstream_timeout", "5s")
        .server("body_timeout", "1s")
        .server("header_timeout", "1s")
        .with(upload_rule())
        .with(rule("token").matching("/cgi-bin/token").matching("/cgi-bin/stable_token"))
        .with(rule("custom").matching("/cgi-bin/message/custom/send"))
        .with(
            "[[rule]]\nname = \"message\"\nmatch = [\"/cgi-bin/message/send\"]\nlimits = [{ count = 100, per = \"day\" }]\n\
             cost = \"recipients\"\nrecipients = { field = \"touser\", separator = \"|\" }\n",
        )
        .with(account_toml(&dir, APPID, "official_account", SECRET, ""));
    (mock, Gate::start_text(config).await, dir)
}

/// One request on each path of [`every_body_path`]: label, head (without
/// its framing header and blank line) and body, each body its own per
/// `tag` (the token request asks for an appid of its own: no answer is
/// shared between them).
fn on_every_path(tag: usize) -> Vec<(&'static str, String, Vec<u8>)> {
    let head = |target: &str, more: &str| format!("POST {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{more}");
    let account = format!("X-Wx-Account: {}\r\n", support::tokens::APPID);
    let json = |s: String| s.into_bytes();
    vec![
        ("own token", head(&format!("{UPLOAD}?access_token=T&type=image"), ""), vec![b'u'; 4000 + tag]),
        (
            "broker-added token",
            head("/cgi-bin/message/custom/send", &account),
            json(serde_json::json!({"touser": "o1", "msgtype": "text", "text": {"content": "x".repeat(200 + tag)}}).to_string()),
        ),
        (
            "counted recipients",
            head("/cgi-bin/message/send?access_token=T", ""),
            json(serde_json::json!({"touser": "a|b|c", "msgtype": "text", "text": {"content": "x".repeat(200 + tag)}}).to_string()),
        ),
        (
            "token request",
            head("/cgi-bin/stable_token", ""),
            json(
                serde_json::json!({"grant_type": "client_credential", "appid": format!("wxNOTHELD00000{tag}"), "secret": "s".repeat(200)})
                    .to_string(),
            ),
        ),
    ]
}

/// Issue 44 item 12: `body_timeout` and `header_timeout` acted as total
/// deadlines on a body wxgate reads whole: one the broker adds a token to
/// got 408 ("nothing for 1s" though a piece came every 300 ms), one counted
/// for its recipients or a token request's 400, while the same body with
/// the caller's own token streamed. Every body now has one no-progress
/// timer: 10 pieces 300 ms apart (2.7 s, over both timeouts) go through
/// whole on every path, in either framing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_body_that_keeps_moving_is_forwarded_whole_on_every_path() {
    let (mock, gate, _dir) = every_body_path().await;
    let mut sends = Vec::new();
    for (tag, framing) in ["Content-Length", "chunked"].into_iter().enumerate() {
        for (label, head, body) in on_every_path(tag) {
            let (head, wire) = if framing == "chunked" {
                let pieces: Vec<&[u8]> = body.chunks(body.len().div_ceil(10)).collect();
                (format!("{head}Transfer-Encoding: chunked\r\n\r\n"), chunked_body(&pieces))
            } else {
                (format!("{head}Content-Length: {}\r\n\r\n", body.len()), body.clone())
            };
            let addr = gate.addr;
            sends.push(async move {
                let started = Instant::now();
                let ex = send_paced(addr, &head, &wire, 10, Duration::from_millis(300)).await;
                (format!("{label}, {framing}"), ex, started.elapsed(), body)
            });
        }
    }
    let done = futures_util::future::join_all(sends).await;
    let calls = mock.calls();
    for (label, ex, took, body) in done {
        assert_eq!(ex.only().status, 200, "{label}: {}", ex.text());
        assert!(took >= Duration::from_millis(2700), "{label}: the body took {took:?}, over both timeouts");
        assert_eq!(calls.iter().filter(|c| c.body == body).count(), 1, "{label}: forwarded whole, once");
    }
}

/// A body that stops arriving for longer than `body_timeout` is refused
/// 408 on every path a body takes, once `body_timeout` has passed, and
/// never forwarded half-read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_stops_arriving_is_408_after_body_timeout_on_every_path() {
    let (mock, gate, _dir) = every_body_path().await;
    let mut sends = Vec::new();
    let bodies = on_every_path(0);
    for (label, head, body) in bodies.clone() {
        let half = &body[..body.len() / 2];
        let wire = [format!("{head}Content-Length: {}\r\n\r\n", body.len()).as_bytes(), half].concat();
        let addr = gate.addr;
        sends.push(async move {
            let started = Instant::now();
            let ex = exchange(addr, &wire).await;
            (label, ex, started.elapsed())
        });
    }
    for (label, ex, waited) in futures_util::future::join_all(sends).await {
        let resp = ex.only();
        assert_eq!(resp.status, 408, "{label}: {}", ex.text());
        let errmsg = resp.json()["errmsg"].as_str().unwrap_or_default().to_owned();
        assert!(errmsg.contains("body_timeout"), "{label}: {errmsg}");
        assert!(waited >= Duration::from_millis(950), "{label}: not before body_timeout: {waited:?}");
    }
    // Nothing read whole reached WeChat; the streamed upload never whole.
    for c in mock.calls() {
        assert!(!c.path_and_query.starts_with("/cgi-bin/message/"), "{}", c.path_and_query);
        assert!(!bodies.iter().any(|(_, _, body)| c.body == *body), "{} got a whole body", c.path_and_query);
        assert!(!String::from_utf8_lossy(&c.body).contains("wxNOTHELD"), "{}", c.path_and_query);
    }
}
