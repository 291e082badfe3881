//! Forwarding as a client and WeChat see it, over real sockets: what reaches
//! the upstream, what comes back, streaming, refusals and upstream failures.

use crate::support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::Notify;

use support::*;

/// A rule that admits everything, so the answer goes through the sniffer
/// (`src/transport/sniff.rs`) instead of the plain no-rule stream.
fn default_rule() -> RuleToml {
    rule("default").limit(1_000_000, "day")
}

/// Both answer paths: no rule matches (streamed as is) and a rule matches (sniffed).
fn configs() -> [(&'static str, String); 2] {
    [("no rule", String::new()), ("default rule", default_rule().to_string())]
}

/// A rule without limits on /cgi-bin/message/custom/send.
fn send_rule() -> RuleToml {
    rule("send").matching("/cgi-bin/message/custom/send")
}

const PATH_Q: &str = "/cgi-bin/message/custom/send?access_token=SECRET&x=%2F1&plus=a+b&zh=%E4%B8%AD&empty=";

#[tokio::test]
async fn unmatched_path_is_forwarded_when_no_default_rule() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start(&mock, "").await;
    let a = gate.get("/cgi-bin/anything?access_token=T").await;
    assert_eq!(a.status, 200);
    assert_eq!(mock.count(), 1);
}

#[tokio::test]
async fn request_reaches_upstream_unchanged_but_for_hop_by_hop_host_account_and_authorization() {
    for (label, rules) in configs() {
        let mock = MockWeChat::start().await;
        let gate = Gate::start(&mock, rules).await;
        let body = Bytes::from_static(b"{\"touser\":\"OPENID\",\"msgtype\":\"text\"}\r\n\0\x01\xfe\xff tail");
        // End-to-end headers, in the order sent; each must arrive with the same values in the same order.
        let end_to_end: [(&str, &[u8]); 7] = [
            ("content-type", b"application/json"),
            ("user-agent", b"wechatpy/1.8"),
            ("x-request-id", b"req-42"),
            ("x-multi", b"one"),
            ("x-multi", b"two"),
            ("x-multi", b"three, four"),
            ("x-utf8", "\u{4e2d}\u{6587}".as_bytes()),
        ];
        // Taken off: hop-by-hop headers, wxgate's own, and any credential
        // (WeChat reads none from a header; issue 44 item 15).
        let hop_by_hop: [(&str, &str); 7] = [
            ("connection", "keep-alive, x-drop-me"),
            ("x-drop-me", "named by Connection"),
            ("keep-alive", "timeout=5"),
            ("te", "trailers"),
            ("proxy-authorization", "Basic c2VjcmV0"),
            ("x-wx-account", "app_1"),
            ("authorization", "Bearer caller-key"),
        ];
        let mut req = Request::post(gate.url(PATH_Q));
        for (k, v) in end_to_end {
            req = req.header(k, HeaderValue::from_bytes(v).expect("header value"));
        }
        for (k, v) in hop_by_hop {
            req = req.header(k, v);
        }
        let a = send(req.body(Full::new(body.clone())).expect("request")).await;
        assert_eq!(a.status, 200, "{label}: {}", a.text());

        let calls = mock.calls();
        assert_eq!(calls.len(), 1, "{label}: forwarded exactly once");
        let c = &calls[0];
        assert_eq!(c.method, "POST", "{label}");
        assert_eq!(c.path_and_query, PATH_Q, "{label}: path and query byte for byte");
        assert_eq!(c.body, body, "{label}: body byte for byte");
        assert_eq!(header_values(&c.headers, "host"), vec![mock.addr.to_string().into_bytes()], "{label}: Host");
        for name in ["content-type", "user-agent", "x-request-id", "x-multi", "x-utf8"] {
            let sent: Vec<Vec<u8>> = end_to_end.iter().filter(|(k, _)| *k == name).map(|(_, v)| v.to_vec()).collect();
            assert_eq!(header_values(&c.headers, name), sent, "{label}: header {name}");
        }
        for (name, _) in hop_by_hop {
            assert!(!c.headers.contains_key(name), "{label}: {name} must not be forwarded: {:?}", c.headers);
        }
        // Nothing added either: exactly the end-to-end headers, Host and the body's length.
        let mut names: Vec<&str> = c.headers.keys().map(|k| k.as_str()).collect();
        names.sort_unstable();
        let mut expected: Vec<&str> = end_to_end.iter().map(|(k, _)| *k).collect();
        expected.extend(["host", "content-length"]);
        expected.sort_unstable();
        expected.dedup();
        assert_eq!(names, expected, "{label}: headers at the upstream");
        assert_eq!(header_values(&c.headers, "content-length"), vec![body.len().to_string().into_bytes()], "{label}");
    }
}

#[tokio::test]
async fn upstream_status_headers_and_body_come_back_unchanged() {
    let answers: [(u16, &str, &str); 3] = [
        (201, "application/json", r#"{"errcode":0,"errmsg":"created","media_id":"M1"}"#),
        (404, "text/html", "<html>no such api</html>"),
        (500, "application/json", r#"{"errcode":-1,"errmsg":"system error"}"#),
    ];
    for (status, content_type, body) in answers {
        let upstream = fixed_upstream(status, content_type, body).await;
        for (label, rules) in configs() {
            let gate = Gate::start_text(config_text(&format!("http://{upstream}"), rules)).await;
            let a = gate.get("/cgi-bin/media/get?access_token=T").await;
            assert_eq!(a.status, status, "{label}: status");
            assert_eq!(a.text(), body, "{label}: body");
            assert_eq!(a.header("content-type"), Some(content_type), "{label}");
            assert_eq!(a.header("content-length"), Some(body.len().to_string().as_str()), "{label}");
            assert_eq!(a.header("x-upstream-id"), Some("u-9"), "{label}");
            assert_eq!(a.header("cache-control"), Some("no-store"), "{label}");
            assert_eq!(
                header_values(&a.headers, "set-cookie"),
                vec![b"a=1; Path=/".to_vec(), b"b=2; Path=/".to_vec()],
                "{label}: repeated headers keep every value, in order"
            );
            for hop in ["x-resp-hop", "keep-alive", "proxy-authenticate"] {
                assert!(!a.headers.contains_key(hop), "{label}: hop-by-hop {hop} must not reach the client");
            }
            let connection = header_values(&a.headers, "connection").concat();
            assert!(
                !String::from_utf8_lossy(&connection).contains("x-resp-hop"),
                "{label}: upstream's Connection header must not reach the client"
            );
        }
    }
}

#[tokio::test]
async fn large_binary_answer_is_streamed_not_buffered() {
    const LEN: usize = 5 * 1024 * 1024;
    const FIRST_CHUNK: usize = 64 * 1024;
    for (label, rules) in configs() {
        let mock = MockWeChat::start().await;
        let gate = Gate::start(&mock, rules).await;
        let release = Arc::new(Notify::new());
        let r = release.clone();
        mock.respond(move |_| Reply::Binary { len: LEN, gate: Some(r.clone()) });

        let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        let req = Request::get(gate.url("/cgi-bin/media/get?access_token=T&media_id=M"))
            .body(Full::new(Bytes::new()))
            .expect("request");
        // The mock holds back everything after its first 64 KiB until released:
        // headers and that first chunk must reach the client before then.
        let resp = tokio::time::timeout(Duration::from_secs(5), client.request(req))
            .await
            .unwrap_or_else(|_| panic!("{label}: no response headers while the upstream body is incomplete"))
            .expect("wxgate answered");
        assert_eq!(resp.status(), 200, "{label}");
        assert_eq!(resp.headers().get("content-type").map(|v| v.as_bytes()), Some(&b"image/jpeg"[..]), "{label}");
        assert_eq!(
            resp.headers().get("content-length").map(|v| v.as_bytes()),
            Some(LEN.to_string().as_bytes()),
            "{label}"
        );
        let mut body = resp.into_body();
        let mut got: Vec<u8> = Vec::with_capacity(LEN);
        while got.len() < FIRST_CHUNK {
            let frame = tokio::time::timeout(Duration::from_secs(5), body.frame())
                .await
                .unwrap_or_else(|_| {
                    panic!("{label}: only {} bytes arrived before the upstream finished: body is buffered", got.len())
                })
                .expect("body ended early")
                .expect("body frame");
            if let Ok(data) = frame.into_data() {
                got.extend_from_slice(&data);
            }
        }
        assert_eq!(got.len(), FIRST_CHUNK, "{label}: the upstream has sent exactly its first chunk so far");
        release.notify_one();
        let rest = tokio::time::timeout(GUARD, body.collect())
            .await
            .unwrap_or_else(|_| panic!("{label}: the rest of the body never arrived"))
            .expect("rest of the body")
            .to_bytes();
        got.extend_from_slice(&rest);
        assert_eq!(got.len(), LEN, "{label}: every byte arrives");
        if let Some(i) = got.iter().enumerate().position(|(i, &b)| b != (i % 251) as u8) {
            panic!("{label}: byte {i} differs from what the upstream sent");
        }
        assert_eq!(mock.count(), 1, "{label}");
    }
}

#[tokio::test]
async fn large_request_body_reaches_upstream_intact() {
    const LEN: usize = 3 * 1024 * 1024;
    for (label, rules) in configs() {
        let mock = MockWeChat::start().await;
        mock.respond(|_| Reply::Echo);
        let gate = Gate::start(&mock, rules).await;
        let body: Bytes = (0..LEN).map(|i| (i * 7 % 256) as u8).collect::<Vec<u8>>().into();
        let req = Request::post(gate.url("/cgi-bin/media/upload?access_token=T&type=image"))
            .header("content-type", "multipart/form-data; boundary=XYZ")
            .body(Full::new(body.clone()))
            .expect("request");
        let a = tokio::time::timeout(GUARD, send(req)).await.expect("answer in time");
        assert_eq!(a.status, 200, "{label}");
        let calls = mock.calls();
        assert_eq!(calls.len(), 1, "{label}");
        assert_eq!(calls[0].body.len(), LEN, "{label}: length at the upstream");
        assert!(calls[0].body == body, "{label}: the body at the upstream differs from the one sent");
        assert!(a.body == body, "{label}: the echoed body differs from the one sent");
    }
}

#[tokio::test]
async fn absolute_form_target_is_refused_and_never_forwarded() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start(&mock, default_rule()).await;
    let ex = exchange(
        gate.addr,
        b"GET http://example.com/cgi-bin/token?grant_type=client_credential HTTP/1.1\r\nHost: example.com\r\nConnection: close\r\n\r\n",
    )
    .await;
    let answer = ex.only();
    assert_eq!(answer.status, 400, "{}", ex.text());
    let json = answer.json();
    assert_eq!(json["errcode"], 40097, "{json}");
    assert!(json["errmsg"].as_str().is_some_and(|m| m.contains("absolute-form")), "{json}");
    assert_eq!(mock.count(), 0, "nothing reaches the upstream");
}

#[tokio::test]
async fn connect_is_refused_and_never_forwarded() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start(&mock, default_rule()).await;
    let ex =
        exchange(gate.addr, b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\nConnection: close\r\n\r\n")
            .await;
    let answer = ex.only();
    assert_eq!(answer.status, 400, "{}", ex.text());
    let json = answer.json();
    assert_eq!(json["errcode"], 40097, "{json}");
    assert!(json["errmsg"].as_str().is_some_and(|m| m.contains("CONNECT")), "{json}");
    assert_eq!(mock.count(), 0, "nothing reaches the upstream");
}

#[tokio::test]
async fn invalid_account_header_is_refused_with_a_clear_message() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start(&mock, default_rule()).await;
    let too_long = "a".repeat(65);
    for bad in ["", too_long.as_str(), "app/1", "app 1", "app.1"] {
        let a = gate.get_as(bad, "/cgi-bin/token?grant_type=client_credential").await;
        assert_eq!(a.status, 400, "account {bad:?}: {}", a.text());
        assert_eq!(a.header("content-type"), Some("application/json"), "account {bad:?}");
        let json = a.json();
        assert_eq!(json["errcode"], 40097, "account {bad:?}: {json}");
        assert!(
            json["errmsg"].as_str().is_some_and(|m| m.contains("X-Wx-Account") && m.contains("1-64")),
            "account {bad:?}: the message names the header and its format: {json}"
        );
    }
    let twice = send(
        Request::get(gate.url("/cgi-bin/token"))
            .header("x-wx-account", "app1")
            .header("x-wx-account", "app2")
            .body(Full::new(Bytes::new()))
            .expect("request"),
    )
    .await;
    assert_eq!(twice.status, 400, "{}", twice.text());
    assert!(twice.json()["errmsg"].as_str().is_some_and(|m| m.contains("more than once")), "{}", twice.text());
    assert_eq!(mock.count(), 0, "no refused call reaches the upstream");

    let longest = "Z".repeat(64);
    for good in ["wx_App-01", longest.as_str()] {
        let a = gate.get_as(good, "/cgi-bin/token?grant_type=client_credential").await;
        assert_eq!(a.status, 200, "account {good:?}: {}", a.text());
    }
    let calls = mock.calls();
    assert_eq!(calls.len(), 2);
    for c in &calls {
        assert!(!c.headers.contains_key("x-wx-account"), "X-Wx-Account is not forwarded: {:?}", c.headers);
        assert_eq!(c.path_and_query, "/cgi-bin/token?grant_type=client_credential");
    }
}

#[tokio::test]
async fn unreachable_upstream_is_502_with_wechat_system_error() {
    // A port that is bound but not listening: connections to it are refused,
    // and no other test can take it while the socket lives.
    let holder = TcpSocket::new_v4().expect("socket");
    holder.bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
    let port = holder.local_addr().expect("local addr").port();
    for (label, rules) in configs() {
        let gate = Gate::start_text(config_text(&format!("http://127.0.0.1:{port}"), rules)).await;
        let a = tokio::time::timeout(GUARD, gate.get("/cgi-bin/token?grant_type=client_credential"))
            .await
            .expect("answer in time");
        assert_eq!(a.status, 502, "{label}: {}", a.text());
        assert_eq!(a.header("content-type"), Some("application/json"), "{label}");
        let json = a.json();
        assert_eq!(json["errcode"], -1, "{label}: {json}");
        assert!(json["errmsg"].as_str().is_some_and(|m| m.starts_with("wxgate: ")), "{label}: {json}");
    }
    drop(holder);
}

#[tokio::test]
async fn silent_upstream_is_504_after_upstream_timeout() {
    let mock = MockWeChat::start().await;
    mock.respond(|_| Reply::Hang);
    for (label, rules) in configs() {
        let gate = Gate::start_text(ConfigToml::new(&mock.url()).server("upstream_timeout", "300ms").with(rules)).await;
        let before = mock.count();
        let a = tokio::time::timeout(GUARD, gate.get("/cgi-bin/token?grant_type=client_credential"))
            .await
            .expect("wxgate answers a silent upstream on its own");
        assert_eq!(a.status, 504, "{label}: {}", a.text());
        assert_eq!(a.header("content-type"), Some("application/json"), "{label}");
        let json = a.json();
        assert_eq!(json["errcode"], -1, "{label}: {json}");
        assert!(json["errmsg"].as_str().is_some_and(|m| m.contains("300ms")), "{label}: names the timeout: {json}");
        assert!(mock.count() - before <= 1, "{label}: a timed-out call is not retried");
    }
}

#[tokio::test]
async fn upstream_dropping_a_sniffed_answer_midway_is_one_502_and_no_retry() {
    let mock = MockWeChat::start().await;
    mock.respond(|_| Reply::DropMidBody);
    let gate = Gate::start(&mock, default_rule()).await;
    let a = tokio::time::timeout(GUARD, gate.get("/cgi-bin/message/custom/send?access_token=T"))
        .await
        .expect("answer in time");
    assert_eq!(a.status, 502, "{}", a.text());
    let json = a.json();
    assert_eq!(json["errcode"], -1, "{json}");
    assert!(!a.text().contains("\"errcode\":0,"), "the partial upstream body is not passed off as an answer");
    assert_eq!(mock.count(), 1, "the call went to WeChat exactly once");
}

#[tokio::test]
async fn upstream_dropping_an_unruled_answer_midway_is_one_502_too() {
    let mock = MockWeChat::start().await;
    mock.respond(|_| Reply::DropMidBody);
    let gate = Gate::start(&mock, "").await;
    // No rule matches, but a small JSON-looking answer is still read before it
    // is relayed, so its truncation becomes a clean 502, not a dropped connection.
    let a = tokio::time::timeout(GUARD, gate.get("/cgi-bin/message/custom/send?access_token=T"))
        .await
        .expect("answer in time");
    assert_eq!(a.status, 502);
    assert_eq!(a.json()["errcode"], -1);
    assert!(!a.text().contains("access_token"), "{}", a.text());
    assert_eq!(mock.count(), 1, "the call went to WeChat exactly once");
}

/// Every value of `name`, in order, as bytes.
fn header_values(headers: &HeaderMap, name: &str) -> Vec<Vec<u8>> {
    headers.get_all(name).iter().map(|v| v.as_bytes().to_vec()).collect()
}

/// An upstream that answers every call with `status`, this body, and a fixed
/// set of end-to-end and hop-by-hop headers.
async fn fixed_upstream(status: u16, content_type: &'static str, body: &'static str) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind upstream");
    let addr = listener.local_addr().expect("upstream addr");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            tokio::spawn(async move {
                let service = service_fn(move |_req: Request<Incoming>| async move {
                    let resp = Response::builder()
                        .status(StatusCode::from_u16(status).expect("status"))
                        .header("content-type", content_type)
                        .header("x-upstream-id", "u-9")
                        .header("cache-control", "no-store")
                        .header("set-cookie", "a=1; Path=/")
                        .header("set-cookie", "b=2; Path=/")
                        .header("connection", "x-resp-hop")
                        .header("x-resp-hop", "secret")
                        .header("keep-alive", "timeout=5")
                        .header("proxy-authenticate", "Basic realm=\"up\"")
                        .body(Full::new(Bytes::from_static(body.as_bytes())))
                        .expect("response");
                    Ok::<_, Infallible>(resp)
                });
                let _ =
                    hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
    });
    addr
}

/// Reads one request head; false if the connection ended first.
async fn read_request_head(conn: &mut tokio::net::TcpStream) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = vec![0u8; 65536];
    let mut got = Vec::new();
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut buf).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    true
}

/// An upstream that reads one request and closes the connection without a
/// word, counting the requests it received.
async fn silent_closer() -> (SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let seen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let s = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let s = s.clone();
            tokio::spawn(async move {
                if !read_request_head(&mut conn).await {
                    return;
                }
                s.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                // Dropping the connection: the request arrived, no answer.
            });
        }
    });
    (addr, seen)
}

#[tokio::test]
async fn upstream_closing_without_an_answer_is_one_502_and_one_call() {
    let (addr, seen) = silent_closer().await;
    let gate = Gate::start_text(config_text(&format!("http://{addr}"), send_rule())).await;
    // Warm the pool first, so the second call rides a kept-alive connection
    // that the upstream then drops: the case where a retrying client would resend.
    for _ in 0..2 {
        let a =
            tokio::time::timeout(GUARD, gate.post("/cgi-bin/message/custom/send?access_token=T", "{\"touser\":\"x\"}"))
                .await
                .expect("answer in time");
        assert_eq!(a.status, 502);
        assert_eq!(a.json()["errcode"], -1);
    }
    assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 2, "each call reached WeChat exactly once");
}

/// An upstream that answers every request in full, keep-alive and all, and
/// then closes the connection anyway (as a server at its keep-alive limit
/// may). Counts the requests it received and the connections it closed.
async fn answer_then_close() -> (SocketAddr, Arc<std::sync::atomic::AtomicUsize>, Arc<std::sync::atomic::AtomicUsize>) {
    use tokio::io::AsyncWriteExt;
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let seen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let closed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (s, c) = (seen.clone(), closed.clone());
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let (s, c) = (s.clone(), c.clone());
            tokio::spawn(async move {
                if !read_request_head(&mut conn).await {
                    return;
                }
                s.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let body = br#"{"errcode":0,"errmsg":"ok"}"#;
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                    body.len()
                );
                let _ = conn.write_all(head.as_bytes()).await;
                let _ = conn.write_all(body).await;
                // Then the connection goes, although the answer promised keep-alive.
                drop(conn);
                c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            });
        }
    });
    (addr, seen, closed)
}

/// A pooled connection the upstream has closed is never used for a call:
/// every call is answered, and each reaches the upstream exactly once.
#[tokio::test]
async fn pooled_connections_closed_by_the_upstream_are_not_reused() {
    let (addr, seen, closed) = answer_then_close().await;
    let gate = Gate::start_text(config_text(&format!("http://{addr}"), send_rule())).await;
    for i in 0..5 {
        // The previous call's connection is closed before this call starts
        // (a call racing the close could be written onto it: that one would
        // get a 502, never a resend).
        eventually("the upstream closing the previous connection", GUARD, || {
            closed.load(std::sync::atomic::Ordering::SeqCst) >= i
        })
        .await;
        let a =
            tokio::time::timeout(GUARD, gate.post("/cgi-bin/message/custom/send?access_token=T", "{\"touser\":\"x\"}"))
                .await
                .expect("answer in time");
        assert_eq!(a.status, 200, "call {i}: {}", a.text());
        assert_eq!(a.json()["errcode"], 0);
    }
    assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 5, "each call reached the upstream exactly once");
}

/// WeChat sends its head and `{`, then nothing: the sniffed answer is not
/// all there within `body_timeout`, so the client gets a 504 (nothing went
/// to it yet), and the call leaves in-flight and frees its concurrency slot.
#[tokio::test]
async fn an_answer_stalling_mid_json_is_504_within_body_timeout_and_frees_its_slot() {
    let mock = MockWeChat::start().await;
    mock.respond(|_| Reply::StallMidBody);
    let send = rule("send").matching("/cgi-bin/message/custom/send").limit(100, "day").concurrency(1);
    let config = ConfigToml::new(&mock.url()).server("upstream_timeout", "1s").server("body_timeout", "1s").with(send);
    let gate = Gate::start_text(config).await;
    let started = std::time::Instant::now();
    let a = tokio::time::timeout(GUARD, gate.get("/cgi-bin/message/custom/send?access_token=T"))
        .await
        .expect("wxgate answers a stalled answer on its own");
    assert_eq!(a.status, 504, "{}", a.text());
    assert!(a.text().contains("body_timeout"), "{}", a.text());
    assert!(started.elapsed() < Duration::from_secs(5), "within body_timeout: {:?}", started.elapsed());
    assert_eq!(gate.metric("wxgate_in_flight{rule=\"send\"}").await, Some(0.0));
    // The concurrency slot is free again: the next call goes.
    mock.respond(|_| ok_reply());
    assert_eq!(gate.get("/cgi-bin/message/custom/send?access_token=T").await.status, 200);
    assert_eq!(mock.count(), 2, "the stalled call was not sent again");
}

/// A streamed answer (media) whose head and first chunk went out, then
/// nothing: after `body_timeout` without a byte the client's connection is
/// closed (its head was sent: no other answer is possible), and the call
/// leaves in-flight.
#[tokio::test]
async fn a_streamed_answer_stalling_midway_closes_the_connection_within_body_timeout() {
    let mock = MockWeChat::start().await;
    let never = Arc::new(Notify::new());
    let n = never.clone();
    mock.respond(move |_| Reply::Binary { len: 1024 * 1024, gate: Some(n.clone()) });
    let media = rule("media").matching("/cgi-bin/media/get").limit(100, "day");
    let config = ConfigToml::new(&mock.url()).server("upstream_timeout", "1s").server("body_timeout", "1s").with(media);
    let gate = Gate::start_text(config).await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let req = Request::get(gate.url("/cgi-bin/media/get?access_token=T&media_id=M")).body(Full::new(Bytes::new()));
    let resp = tokio::time::timeout(GUARD, client.request(req.expect("request"))).await.expect("head").expect("answer");
    assert_eq!(resp.status(), 200);
    let started = std::time::Instant::now();
    let body = tokio::time::timeout(GUARD, resp.into_body().collect()).await.expect("the body ends on its own");
    assert!(body.is_err(), "the connection is closed mid-body, not ended as if whole");
    assert!(started.elapsed() < Duration::from_secs(5), "within body_timeout: {:?}", started.elapsed());
    assert_eq!(gate.metric("wxgate_in_flight{rule=\"media\"}").await, Some(0.0));
    drop(never);
}
