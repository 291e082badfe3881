//! Hostile and malformed clients over real sockets: oversized heads, too many
//! or invalid headers, oversized bodies, slow clients, HTTP/1.0, pipelining,
//! request smuggling and path tricks. What matters is what a client gets back
//! and that nothing unintended reaches WeChat.

use crate::support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use support::bodies::{chunked_body, StrictUpstream};
use support::*;

const SEND: &str = "/cgi-bin/message/custom/send";

/// A rule without limits on [`SEND`].
fn send_rule() -> RuleToml {
    rule("send").matching(SEND)
}

// --- request heads ------------------------------------------------------------

#[tokio::test]
async fn request_head_under_64_kib_is_served() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start(&mock, "").await;
    let headers: String = (0..60).map(|i| format!("X-Pad-{i}: {}\r\n", "a".repeat(1000))).collect();
    let req = format!("GET /cgi-bin/token HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{headers}\r\n");
    let ex = exchange(gate.addr, req.as_bytes()).await;
    assert_eq!(ex.only().status, 200, "{}", ex.text());
    let calls = mock.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].headers.get("x-pad-59").map(|v| v.len()), Some(1000));
}

#[tokio::test]
async fn request_head_over_64_kib_is_431_and_never_forwarded() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start(&mock, "").await;
    let many_headers: String = (0..70).map(|i| format!("X-Pad-{i}: {}\r\n", "a".repeat(1000))).collect();
    let one_huge_header = format!("X-Huge: {}\r\n", "b".repeat(70 * 1024));
    for (label, headers) in [("70 headers of 1 KB", many_headers), ("one 70 KiB header", one_huge_header)] {
        let req = format!(
            "GET /cgi-bin/token?grant_type=client_credential HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{headers}\r\n"
        );
        let ex = exchange(gate.addr, req.as_bytes()).await;
        let resp = ex.only();
        assert_eq!(resp.status, 431, "{label}: {}", ex.text());
    }
    assert_eq!(mock.count(), 0, "an oversized request never reaches WeChat");
}

#[tokio::test]
async fn more_than_100_header_fields_is_431_and_100_are_served() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start(&mock, "").await;
    // Host, Connection and 98 others: exactly the limit.
    let at_limit: String = (0..98).map(|i| format!("X-H-{i}: v\r\n")).collect();
    let req = format!("GET /cgi-bin/token HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{at_limit}\r\n");
    let ex = exchange(gate.addr, req.as_bytes()).await;
    assert_eq!(ex.only().status, 200, "100 header fields are served: {}", ex.text());
    assert_eq!(mock.count(), 1);
    assert!(mock.calls()[0].headers.contains_key("x-h-97"));

    let over: String = (0..100).map(|i| format!("X-H-{i}: v\r\n")).collect();
    let req = format!("GET /cgi-bin/token HTTP/1.1\r\nHost: x\r\n{over}\r\n");
    let ex = exchange(gate.addr, req.as_bytes()).await;
    assert_eq!(ex.only().status, 431, "101 header fields: {}", ex.text());
    assert_eq!(mock.count(), 1, "the request with 101 header fields never reaches WeChat");
}

#[tokio::test]
async fn invalid_header_bytes_are_400_and_never_forwarded() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start(&mock, "").await;
    let cases: [(&str, &[u8]); 8] = [
        ("space in a header name", b"Bad Name: x\r\n"),
        ("space before the colon", b"X-A : x\r\n"),
        ("NUL in a value", b"X-Nul: a\0b\r\n"),
        ("control character in a value", b"X-Ctl: a\x01b\r\n"),
        ("DEL in a value", b"X-Del: a\x7fb\r\n"),
        ("header line without a colon", b"NoColonHere\r\n"),
        ("obsolete line folding", b"X-Fold: a\r\n folded\r\n"),
        ("non-token byte in a name", b"X-\xffName: x\r\n"),
    ];
    for (label, header) in cases {
        let mut req = b"GET /cgi-bin/token HTTP/1.1\r\nHost: x\r\n".to_vec();
        req.extend_from_slice(header);
        req.extend_from_slice(b"\r\n");
        let ex = exchange(gate.addr, &req).await;
        assert_eq!(ex.only().status, 400, "{label}: {}", ex.text());
    }
    assert_eq!(mock.count(), 0, "malformed requests never reach WeChat");
}

// --- request bodies -----------------------------------------------------------

/// A gate in front of `upstream` that takes request bodies up to 1 KiB.
fn small_body(upstream: SocketAddr) -> ConfigToml {
    ConfigToml::new(&format!("http://{upstream}")).server("max_body", "1KiB")
}

#[tokio::test]
async fn body_over_max_body_with_content_length_is_413_and_never_forwarded() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start_text(small_body(mock.addr).with(send_rule())).await;

    // Exactly at the cap: forwarded whole.
    let body = "x".repeat(1024);
    let req = format!("POST {SEND} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 1024\r\n\r\n{body}");
    let ex = exchange(gate.addr, req.as_bytes()).await;
    assert_eq!(ex.only().status, 200, "{}", ex.text());
    assert_eq!(mock.calls()[0].body.len(), 1024);

    // One byte over: refused before anything is decided or forwarded.
    for (label, path) in [("ruled path", SEND), ("unruled path", "/cgi-bin/other")] {
        let body = "y".repeat(1025);
        // Connection: close, or hyper keeps the connection for the next request.
        let req = format!("POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 1025\r\n\r\n{body}");
        let ex = exchange(gate.addr, req.as_bytes()).await;
        let resp = ex.only();
        assert_eq!(resp.status, 413, "{label}: {}", ex.text());
        assert_eq!(resp.header("content-type"), Some("application/json"), "{label}");
        let json = resp.json();
        assert_eq!(json["errcode"], 40097, "{label}: {json}");
        assert!(json["errmsg"].as_str().is_some_and(|m| m.starts_with("wxgate: ")), "{label}: {json}");
    }
    // A huge declared length is refused at once, without waiting for the body,
    // and the connection is closed (the body cannot be drained).
    let ex = exchange(
        gate.addr,
        b"POST /cgi-bin/message/custom/send HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999999\r\n\r\nabc",
    )
    .await;
    assert_eq!(ex.only().status, 413, "{}", ex.text());
    assert_eq!(mock.count(), 1, "only the call within the cap reached WeChat");
}

#[tokio::test]
async fn chunked_body_growing_past_max_body_is_413_and_no_complete_call_is_forwarded() {
    let (addr, upstream) = StrictUpstream::start().await;
    for (label, rules) in [("ruled path", send_rule().to_string()), ("unruled path", String::new())] {
        let gate = Gate::start_text(small_body(addr).with(rules)).await;
        let before = upstream.complete().len();

        // Under the cap in three chunks: forwarded whole.
        let chunk = [b'a'; 300];
        let mut req =
            format!("POST {SEND} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n")
                .into_bytes();
        req.extend_from_slice(&chunked_body(&[&chunk, &chunk, &chunk]));
        let ex = exchange(gate.addr, &req).await;
        assert_eq!(ex.only().status, 200, "{label}: {}", ex.text());
        let complete = upstream.complete();
        assert_eq!(complete.len(), before + 1, "{label}");
        assert_eq!(complete[before].1.len(), 900, "{label}: the whole body arrived");

        // Over the cap: 4 × 512 bytes, no Content-Length.
        let chunk = [b'z'; 512];
        let mut req = format!("POST {SEND} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n").into_bytes();
        req.extend_from_slice(&chunked_body(&[&chunk, &chunk, &chunk, &chunk]));
        let ex = exchange(gate.addr, &req).await;
        let resp = ex.only();
        assert_eq!(resp.status, 413, "{label}: {}", ex.text());
        let json = resp.json();
        assert_eq!(json["errcode"], 40097, "{label}: {json}");
        // The upstream may have seen the start of the call, but never a
        // complete one: the body was cut off, so WeChat cannot act on it.
        assert_eq!(upstream.complete().len(), before + 1, "{label}: no complete call beyond the first");
    }
}

// --- slow clients ---------------------------------------------------------------

/// A gate in front of `mock` that gives a client 200 ms to send a request head.
fn slow(mock: &MockWeChat) -> ConfigToml {
    ConfigToml::new(&mock.url()).server("header_timeout", "200ms")
}

#[tokio::test]
async fn client_stalling_mid_request_line_is_disconnected_without_an_answer() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start_text(slow(&mock)).await;
    for (label, partial) in [("half a request line", &b"GET /cgi-bin/tok"[..]), ("nothing at all", &b""[..])] {
        let started = Instant::now();
        let mut s = TcpStream::connect(gate.addr).await.expect("connect");
        s.write_all(partial).await.expect("write");
        let ex = read_until_closed(&mut s).await;
        let waited = started.elapsed();
        assert!(ex.closed, "{label}: the server closes a stalled connection (waited {waited:?})");
        // hyper closes on a header timeout without sending anything (no 408).
        assert_eq!(ex.text(), "", "{label}: no answer is written");
        assert!(waited >= Duration::from_millis(150), "{label}: not before header_timeout: {waited:?}");
    }
    assert_eq!(mock.count(), 0);
}

#[tokio::test]
async fn client_dribbling_a_request_head_is_cut_off_at_header_timeout() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start_text(slow(&mock)).await;
    let started = Instant::now();
    let s = TcpStream::connect(gate.addr).await.expect("connect");
    let (mut rd, mut wr) = s.into_split();
    // One byte every 20 ms forever: each read makes progress, but the head
    // never completes. The timeout covers the whole head, not each read.
    let head = b"GET /cgi-bin/token HTTP/1.1\r\nX-Slow: ".iter().copied().chain(std::iter::repeat(b'a'));
    let dribbler = tokio::spawn(async move {
        for b in head {
            if wr.write_all(&[b]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let ex = read_until_closed(&mut rd).await;
    dribbler.abort();
    assert!(ex.closed, "the server cuts off a dribbling client (after {:?})", started.elapsed());
    assert_eq!(ex.text(), "", "no answer is written");
    assert_eq!(mock.count(), 0);
}

// --- protocol versions and pipelining ----------------------------------------

#[tokio::test]
async fn http_1_0_request_is_served() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start(&mock, "").await;
    let ex = exchange(gate.addr, b"GET /cgi-bin/token?grant_type=client_credential HTTP/1.0\r\n\r\n").await;
    let resp = ex.only();
    assert_eq!(resp.status, 200, "{}", ex.text());
    assert!(resp.version.starts_with("HTTP/1."), "{}", ex.text());
    assert_eq!(resp.json()["errcode"], 0);
    let calls = mock.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].path_and_query, "/cgi-bin/token?grant_type=client_credential");
}

#[tokio::test]
async fn pipelined_requests_get_answers_in_order() {
    let mock = MockWeChat::start().await;
    mock.respond(|rec| Reply::Json {
        body: format!("{{\"errcode\":0,\"path\":{}}}", serde_json::json!(rec.path_and_query)),
        content_type: "application/json",
    });
    let gate = Gate::start(&mock, "").await;
    let ex = exchange(
        gate.addr,
        b"GET /cgi-bin/first?n=1 HTTP/1.1\r\nHost: x\r\n\r\nGET /cgi-bin/second?n=2 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(ex.closed, "{}", ex.text());
    let responses = ex.responses();
    assert_eq!(responses.len(), 2, "{}", ex.text());
    assert_eq!(responses[0].status, 200);
    assert_eq!(responses[0].json()["path"], "/cgi-bin/first?n=1");
    assert_eq!(responses[1].status, 200);
    assert_eq!(responses[1].json()["path"], "/cgi-bin/second?n=2");
    let paths: Vec<String> = mock.calls().into_iter().map(|c| c.path_and_query).collect();
    assert_eq!(paths, ["/cgi-bin/first?n=1", "/cgi-bin/second?n=2"]);
}

// --- request smuggling --------------------------------------------------------

#[tokio::test]
async fn transfer_encoding_with_content_length_is_refused() {
    let mock = MockWeChat::start().await;
    mock.respond(|_| Reply::Echo);
    let gate = Gate::start(&mock, "").await;
    let smuggled = "GET /cgi-bin/smuggled?access_token=X HTTP/1.1\r\nHost: x\r\n\r\n";
    let cases = [
        // CL.TE: Content-Length covers the smuggled request, chunked ends before it.
        (
            "chunked ends first",
            format!(
                "POST /cgi-bin/token HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n{smuggled}",
                5 + smuggled.len()
            ),
            "",
        ),
        // TE.CL: Content-Length ends early, the smuggled request sits in a chunk.
        (
            "content-length ends first",
            format!(
                "POST /cgi-bin/token HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{smuggled}\r\n0\r\n\r\n",
                smuggled.len()
            ),
            smuggled,
        ),
        // Content-Length after Transfer-Encoding: still TE.
        (
            "content-length second",
            format!(
                "POST /cgi-bin/token HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n{:x}\r\n{smuggled}\r\n0\r\n\r\n",
                smuggled.len()
            ),
            smuggled,
        ),
    ];
    for (label, req, _forwarded_body) in cases {
        let before = mock.count();
        let ex = exchange(gate.addr, req.as_bytes()).await;
        // Refused outright: one 400, then the connection closes, so nothing
        // after the head is parsed, and WeChat sees nothing at all.
        let resp = ex.only();
        assert_eq!(resp.status, 400, "{label}: {}", ex.text());
        assert_eq!(mock.count(), before, "{label}: nothing forwarded");
        assert!(mock.calls().iter().all(|c| !c.path_and_query.contains("smuggled")), "{label}");
    }
    // The same request with only one of the two framings is served normally.
    let chunked_only =
        "POST /cgi-bin/token HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
    let ex = exchange(gate.addr, chunked_only.as_bytes()).await;
    assert_eq!(ex.only().status, 200, "{}", ex.text());
}

#[tokio::test]
async fn ambiguous_body_framing_is_400_and_never_forwarded() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start(&mock, "").await;
    let cases: [(&str, &str); 7] = [
        ("Transfer-Encoding gzip", "POST /cgi-bin/token HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\nabc"),
        (
            "chunked not last",
            "POST /cgi-bin/token HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, gzip\r\n\r\n0\r\n\r\n",
        ),
        (
            "two different Content-Lengths",
            "POST /cgi-bin/token HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 5\r\n\r\nabcde",
        ),
        (
            "Content-Length list that disagrees",
            "POST /cgi-bin/token HTTP/1.1\r\nHost: x\r\nContent-Length: 3, 5\r\n\r\nabcde",
        ),
        ("negative Content-Length", "POST /cgi-bin/token HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\nabc"),
        ("non-numeric Content-Length", "POST /cgi-bin/token HTTP/1.1\r\nHost: x\r\nContent-Length: 3x\r\n\r\nabc"),
        (
            "Transfer-Encoding on HTTP/1.0",
            "POST /cgi-bin/token HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        ),
    ];
    for (label, req) in cases {
        let ex = exchange(gate.addr, req.as_bytes()).await;
        assert_eq!(ex.only().status, 400, "{label}: {}", ex.text());
    }
    assert_eq!(mock.count(), 0, "no ambiguous request reaches WeChat");
}

/// A request with both framings, then a request hidden behind it.
const BOTH_FRAMINGS: &str = "POST /cgi-bin/token?both=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /cgi-bin/smuggled HTTP/1.1\r\nHost: x\r\n\r\n";

/// The paths WeChat saw since `before` calls.
fn paths_since(mock: &MockWeChat, before: usize) -> Vec<String> {
    mock.calls().into_iter().skip(before).map(|c| c.path_and_query).collect()
}

#[tokio::test]
async fn both_framings_are_refused_wherever_they_appear_on_a_connection() {
    let mock = MockWeChat::start().await;
    mock.respond(|_| Reply::Echo);
    let gate = Gate::start(&mock, "").await;
    let long_size = |digits: usize| {
        format!(
            "POST /cgi-bin/first HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{:0>digits$}\r\nhello\r\n{:0>digits$}\r\n\r\n",
            "5", "0"
        )
    };
    let upgrade = "GET /cgi-bin/first HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";
    let h2c = "GET /cgi-bin/first HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n";
    let connect = "CONNECT api.weixin.qq.com:443 HTTP/1.1\r\nHost: api.weixin.qq.com:443\r\n\r\n";
    let cases: [(&str, String, &[u16], &[&str]); 6] = [
        ("after a 16-hex-digit chunk size", long_size(16), &[200], &["/cgi-bin/first"]),
        ("after a 40-hex-digit chunk size", long_size(40), &[200], &["/cgi-bin/first"]),
        ("after a CONNECT", connect.into(), &[400], &[]),
        ("after a websocket Upgrade request", upgrade.into(), &[200], &["/cgi-bin/first"]),
        ("after an h2c Upgrade request", h2c.into(), &[200], &["/cgi-bin/first"]),
        ("after CONNECT and Upgrade", format!("{connect}{upgrade}"), &[400, 200], &["/cgi-bin/first"]),
    ];
    for (label, prefix, statuses, forwarded) in cases {
        let before = mock.count();
        let ex = exchange(gate.addr, format!("{prefix}{BOTH_FRAMINGS}").as_bytes()).await;
        assert!(ex.closed, "{label}: the connection closes after the refusal: {}", ex.text());
        let got: Vec<u16> = ex.responses().iter().map(|r| r.status).collect();
        let mut want = statuses.to_vec();
        want.push(400);
        assert_eq!(got, want, "{label}: {}", ex.text());
        assert_eq!(
            paths_since(&mock, before),
            forwarded,
            "{label}: only the requests before the refused one reach WeChat"
        );
    }
    // What an Upgrade request forwards is a plain call: no upgrade asked of WeChat.
    assert!(mock.calls().iter().all(|c| !c.headers.contains_key("upgrade")), "Upgrade is never forwarded");
}

#[tokio::test]
async fn heads_with_bare_line_endings_and_http_0_9_are_answered_400_at_once() {
    let mock = MockWeChat::start().await;
    // A header timeout far beyond the exchange's guard: an answer within the
    // guard is an answer at once, not one at the header timeout.
    let gate = Gate::start_text(ConfigToml::new(&mock.url()).server("header_timeout", "120s")).await;
    let cases: [(&str, &str); 7] = [
        ("bare LF line endings", "GET /cgi-bin/token HTTP/1.1\nHost: x\n\n"),
        (
            "bare LF with both framings",
            "POST /cgi-bin/token HTTP/1.1\nHost: x\nContent-Length: 5\nTransfer-Encoding: chunked\n\n0\n\nGET /cgi-bin/smuggled HTTP/1.1\nHost: x\n\n",
        ),
        ("one bare LF among CRLFs", "GET /cgi-bin/token HTTP/1.1\r\nHost: x\n\r\n"),
        ("a bare CR", "GET /cgi-bin/token HTTP/1.1\r\nHost: x\r\n\r\r\n"),
        ("HTTP/0.9", "GET /cgi-bin/token\r\n"),
        ("HTTP/0.9, bare LF", "GET /cgi-bin/token\n"),
        ("an unknown version", "GET /cgi-bin/token HTTP/1.2\r\n"),
    ];
    for (label, req) in cases {
        let ex = exchange(gate.addr, req.as_bytes()).await;
        assert!(ex.closed, "{label}: answered and closed at once, not at header_timeout: {:?}", ex.text());
        assert_eq!(ex.only().status, 400, "{label}: {}", ex.text());
    }
    assert_eq!(mock.count(), 0, "none of them reaches WeChat");
}

#[tokio::test]
async fn a_half_closed_connection_with_a_complete_request_is_served() {
    let mock = MockWeChat::start().await;
    mock.respond(|_| Reply::Echo);
    let gate = Gate::start_text(ConfigToml::new(&mock.url()).server("header_timeout", "120s")).await;
    let get = "GET /cgi-bin/token?n=1 HTTP/1.1\r\nHost: x\r\n\r\n";
    let sized = "POST /cgi-bin/message/custom/send HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\n{\"a\":\"bcd\"}";
    let chunked =
        "POST /cgi-bin/media/upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n0\r\n\r\n";
    let cases: [(&str, String, &[&str]); 4] = [
        ("a GET", get.into(), &["/cgi-bin/token?n=1"]),
        ("a body with Content-Length", sized.into(), &["/cgi-bin/message/custom/send"]),
        ("a chunked body", chunked.into(), &["/cgi-bin/media/upload"]),
        ("two pipelined requests", format!("{get}{sized}"), &["/cgi-bin/token?n=1", "/cgi-bin/message/custom/send"]),
    ];
    for (label, req, paths) in cases {
        let before = mock.count();
        let ex = exchange_half_closed(gate.addr, req.as_bytes()).await;
        assert!(ex.closed, "{label}: answered, then closed: {:?}", ex.text());
        let answers = ex.responses();
        assert_eq!(answers.len(), paths.len(), "{label}: every request answered: {}", ex.text());
        assert!(answers.iter().all(|a| a.status == 200), "{label}: {}", ex.text());
        assert_eq!(paths_since(&mock, before), paths, "{label}: each forwarded once");
    }
    let bodies: Vec<Bytes> = mock.calls().into_iter().map(|c| c.body).collect();
    assert_eq!(bodies[1], Bytes::from_static(b"{\"a\":\"bcd\"}"));
    assert_eq!(bodies[2], Bytes::from_static(b"abcd"));
}

// --- path tricks --------------------------------------------------------------

/// Paths no WeChat API has: the variants of issue 13 item 5 and the classic
/// traversal tricks. Each slipped past `send`'s limit to the limit-less
/// `default` rule (or was matched after decoding) before.
const NOT_API_PATHS: [&str; 22] = [
    "/CGI-BIN/message/custom/send",
    "/cgi-bin/message/custom/Send",
    "/cgi-bin/message/custom/send;x",
    "/cgi-bin/message/custom/send%00",
    "/cgi-bin/message/custom/send%20",
    "/cgi-bin/message/custom/send%2523",
    "/cgi-bin/message/custom\\send",
    "/cgi-bin/message/custom/%73end",
    "/cgi-bin/message%2Fcustom%2Fsend",
    "/cgi-bin//message/custom/send",
    "//cgi-bin/message/custom/send/",
    "/cgi-bin/message/custom/./send",
    "/cgi-bin/message/custom/%2e/send",
    "/x/../cgi-bin/message/custom/send",
    "/../../cgi-bin/message/custom/send",
    "/cgi-bin/message/custom/send/../../../token",
    "/cgi-bin/message/custom/send~",
    // Issue 44: a segment ending in `.`, which some servers read without it.
    "/cgi-bin/message/custom/send.",
    "/cgi-bin/message/custom/send./",
    "/cgi-bin/message/custom/send..",
    "/cgi-bin/message/custom./send",
    "/cgi-bin./message/custom/send",
];

#[tokio::test]
async fn paths_no_wechat_api_has_are_400_and_never_forwarded() {
    let mock = MockWeChat::start().await;
    let rules = format!("{}{}", send_rule().limit(1, "1h"), rule("default"));
    let gate = Gate::start(&mock, rules).await;
    let get = |path: String| {
        let addr = gate.addr;
        async move {
            let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
            exchange(addr, req.as_bytes()).await.only()
        }
    };

    let first = get(format!("{SEND}?access_token=T")).await;
    assert_eq!(first.status, 200, "{}", first.text());

    for path in NOT_API_PATHS {
        let a = get(format!("{path}?access_token=T")).await;
        assert_eq!(a.status, 400, "{path}: {}", a.text());
        assert_eq!(a.json()["errcode"], 40097, "{path}");
        let errmsg = a.json()["errmsg"].as_str().unwrap_or_default().to_owned();
        assert!(errmsg.contains("not a WeChat API path"), "{path}: {errmsg}");
    }

    // A trailing slash is the same API: counted against send's limit.
    let slash = get(format!("{SEND}/?access_token=T")).await;
    assert_eq!(slash.status, 429, "{}", slash.text());
    assert_eq!(slash.header("x-wxgate-rule"), Some("send"));
    // A suffix within the alphabet is another path: the default rule.
    let json = get(format!("{SEND}.json?access_token=T")).await;
    assert_eq!(json.status, 200, "{}", json.text());
    // The query is not the path: escapes, uppercase and `;` there are fine.
    let query = "/cgi-bin/user/info?access_token=T&x=%2F..%2F&Lang=zh_CN;a\\b";
    let a = get(query.to_owned()).await;
    assert_eq!(a.status, 200, "{}", a.text());

    // WeChat saw only the real API paths, byte for byte.
    let paths: Vec<String> = mock.calls().into_iter().map(|c| c.path_and_query).collect();
    assert_eq!(paths, [format!("{SEND}?access_token=T"), format!("{SEND}.json?access_token=T"), query.to_owned()]);
    let metrics = get_at(gate.admin_addr(), "/metrics").await.text();
    let refused = sample(&metrics, "wxgate_calls_total{rule=\"_none\",outcome=\"rejected_bad_request\"}");
    assert_eq!(refused, Some(NOT_API_PATHS.len() as f64), "{metrics}");
}

/// Issue 44: a query parameter name with a `%` escape or a `+`
/// (`access_token%00=`, `access%5Ftoken=`) was not read as the name it may
/// be to WeChat: the call counted on the `default` account while WeChat
/// may have read the token. wxgate cannot read such a name one way, so it
/// refuses it (400) and never forwards it; escapes in values stay fine.
#[tokio::test]
async fn a_query_parameter_name_with_an_escape_is_400_and_never_forwarded() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start(&mock, send_rule().limit(1, "1h")).await;
    for query in [
        "access_token%00=T",
        "access_token%00=T&access_token=U",
        "x=1&access%5Ftoken=T",
        "access_token+=T",
        "lang%5B%5D=zh&access_token=T",
        "access_token=T;appid%00=wx1",
    ] {
        let a = gate.get(&format!("{SEND}?{query}")).await;
        assert_eq!(a.status, 400, "{query}: {}", a.text());
        let errmsg = a.json()["errmsg"].as_str().unwrap_or_default().to_owned();
        assert!(errmsg.contains("parameter name in the query has a %-escape"), "{query}: {errmsg}");
        assert!(
            !errmsg.contains("access_token%00") && !errmsg.contains("=T"),
            "{query}: the name is not quoted: {errmsg}"
        );
    }
    assert_eq!(mock.count(), 0, "none was forwarded");
    let fine = gate.get(&format!("{SEND}?access_token=T%00%2B&lang=zh_CN")).await;
    assert_eq!(fine.status, 200, "escapes in a value: {}", fine.text());
}

// --- browsers ------------------------------------------------------------------

/// A request over a fresh connection to `addr`, with these header lines.
async fn with_fields(addr: SocketAddr, method: &str, target: &str, fields: &str) -> u16 {
    let body = if method == "POST" { "{\"touser\":\"o1\"}" } else { "" };
    let req = format!(
        "{method} {target} HTTP/1.1\r\n{fields}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    exchange(addr, req.as_bytes()).await.only().status
}

/// A web page can make its visitor's browser call the proxy on loopback
/// (cross-site, or DNS-rebound so that its Host is the attacker's name):
/// every such request is refused (403) before anything is read, decided or
/// forwarded, the delivery API's included; services (Host an address,
/// `localhost`, a Kubernetes or Compose name; no browser marks) pass.
#[tokio::test]
async fn a_browser_page_cannot_call_wechat_through_the_proxy_listener() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start(&mock, send_rule()).await;
    let port = gate.addr.port();
    let own = format!("Host: 127.0.0.1:{port}\r\n");
    let refused: [(&str, &str, String); 7] = [
        ("POST", SEND, format!("{own}Origin: https://evil.example\r\nContent-Type: text/plain\r\n")),
        ("POST", SEND, format!("{own}Origin: null\r\n")),
        ("GET", "/cgi-bin/user/get", format!("{own}Sec-Fetch-Site: cross-site\r\nSec-Fetch-Mode: no-cors\r\n")),
        ("GET", "/cgi-bin/user/get", format!("Host: rebound.evil.example:{port}\r\n")),
        ("POST", SEND, format!("Host: rebound.evil.example:{port}\r\nSec-Fetch-Site: same-origin\r\n")),
        ("DELETE", "/v1/deliveries/0a3413d13ebd3fea679773813f03a852", format!("{own}Origin: https://evil.example\r\n")),
        ("GET", "/cgi-bin/user/get", format!("{own}Host: rebound.evil.example\r\n")),
    ];
    for (method, target, fields) in &refused {
        assert_eq!(with_fields(gate.addr, method, target, fields).await, 403, "{method} {target} {fields:?}");
    }
    assert_eq!(mock.count(), 0, "nothing a browser sent reached WeChat");
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        "wxgate".into(),
        "wxgate.ns.svc.cluster.local".into(),
    ] {
        assert_eq!(with_fields(gate.addr, "POST", SEND, &format!("Host: {host}\r\n")).await, 200, "{host}");
    }
    // A name of the operator's own, once listed; the list replaces the default.
    let text = ConfigToml::new(&mock.url()).with(send_rule()).server("hosts", vec![".corp.example"]);
    let listed = Gate::start_text(text).await;
    assert_eq!(with_fields(listed.addr, "POST", SEND, "Host: wxgate.corp.example\r\n").await, 200);
    assert_eq!(with_fields(listed.addr, "POST", SEND, "Host: wxgate\r\n").await, 403);
    assert_eq!(with_fields(listed.addr, "POST", SEND, &format!("Host: 127.0.0.1:{port}\r\n")).await, 200);
    assert_eq!(mock.count(), 6);
}
