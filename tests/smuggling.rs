//! The smuggling guarantee as a property, over real sockets: on one
//! connection, any sequence of well-formed requests (bodies sized or chunked,
//! chunk sizes with leading zeros, extensions and trailers, `CONNECT` and
//! `Upgrade` requests) followed by a request wxgate must refuse (both
//! framings, bare line endings, HTTP/0.9, other transfer codings) and more
//! requests behind it: every request before the refused one is answered in
//! order and forwarded exactly as sent, the refused one gets 400, the
//! connection closes, and nothing after it is parsed or forwarded.

use crate::support;

use std::sync::atomic::{AtomicUsize, Ordering};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

use support::*;

/// A request wxgate serves.
#[derive(Debug, Clone)]
enum Served {
    Get {
        upgrade: bool,
    },
    Sized(Vec<u8>),
    /// The body in pieces of `piece` bytes; each size written with `width`
    /// hex digits (leading zeros), upper or lower case, maybe an extension;
    /// maybe a trailer.
    Chunked {
        body: Vec<u8>,
        piece: usize,
        width: usize,
        upper: bool,
        ext: bool,
        trailer: bool,
    },
    /// Answered 400 by wxgate itself, and the connection goes on.
    Connect,
}

/// A request wxgate refuses with 400 and a closed connection.
#[derive(Debug, Clone)]
enum Refused {
    BothFramings { te_first: bool, chunk_width: usize },
    BareLf { both_framings: bool },
    Http09,
    NotChunked,
    ChunkedOnHttp10,
}

fn served() -> impl Strategy<Value = Served> {
    prop_oneof![
        any::<bool>().prop_map(|upgrade| Served::Get { upgrade }),
        prop::collection::vec(any::<u8>(), 0..200).prop_map(Served::Sized),
        (
            prop::collection::vec(any::<u8>(), 0..200),
            1usize..64,
            1usize..40,
            any::<bool>(),
            any::<bool>(),
            any::<bool>()
        )
            .prop_map(|(body, piece, width, upper, ext, trailer)| Served::Chunked {
                body,
                piece,
                width,
                upper,
                ext,
                trailer
            }),
        Just(Served::Connect),
    ]
}

fn refused() -> impl Strategy<Value = Refused> {
    prop_oneof![
        (any::<bool>(), 1usize..40).prop_map(|(te_first, chunk_width)| Refused::BothFramings { te_first, chunk_width }),
        any::<bool>().prop_map(|both_framings| Refused::BareLf { both_framings }),
        Just(Refused::Http09),
        Just(Refused::NotChunked),
        Just(Refused::ChunkedOnHttp10),
    ]
}

fn size_line(n: usize, width: usize, upper: bool, ext: bool) -> String {
    let hex = if upper { format!("{n:0width$X}") } else { format!("{n:0width$x}") };
    if ext {
        format!("{hex};name=value\r\n")
    } else {
        format!("{hex}\r\n")
    }
}

/// The bytes of `r` at `path`, the status it gets and the body WeChat
/// receives (`None`: not forwarded).
fn served_bytes(r: &Served, path: &str) -> (Vec<u8>, u16, Option<Vec<u8>>) {
    match r {
        Served::Get { upgrade: false } => (format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").into_bytes(), 200, Some(Vec::new())),
        Served::Get { upgrade: true } => (
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n")
                .into_bytes(),
            200,
            Some(Vec::new()),
        ),
        Served::Sized(body) => {
            let mut b = format!("POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n", body.len()).into_bytes();
            b.extend_from_slice(body);
            (b, 200, Some(body.clone()))
        }
        Served::Chunked { body, piece, width, upper, ext, trailer } => {
            let mut b = format!("POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n").into_bytes();
            for part in body.chunks(*piece) {
                b.extend_from_slice(size_line(part.len(), *width, *upper, *ext).as_bytes());
                b.extend_from_slice(part);
                b.extend_from_slice(b"\r\n");
            }
            b.extend_from_slice(size_line(0, *width, *upper, *ext).as_bytes());
            if *trailer {
                b.extend_from_slice(b"X-Checksum: 1\r\n");
            }
            b.extend_from_slice(b"\r\n");
            (b, 200, Some(body.clone()))
        }
        Served::Connect => {
            (b"CONNECT api.weixin.qq.com:443 HTTP/1.1\r\nHost: api.weixin.qq.com:443\r\n\r\n".to_vec(), 400, None)
        }
    }
}

fn refused_bytes(r: &Refused, path: &str) -> Vec<u8> {
    match r {
        Refused::BothFramings { te_first, chunk_width } => {
            let (first, second) = ("Transfer-Encoding: chunked", "Content-Length: 5");
            let (first, second) = if *te_first { (first, second) } else { (second, first) };
            let end = size_line(0, *chunk_width, false, false);
            format!("POST {path} HTTP/1.1\r\nHost: x\r\n{first}\r\n{second}\r\n\r\n{end}\r\n").into_bytes()
        }
        Refused::BareLf { both_framings: false } => format!("GET {path} HTTP/1.1\nHost: x\n\n").into_bytes(),
        Refused::BareLf { both_framings: true } => {
            format!("POST {path} HTTP/1.1\nHost: x\nContent-Length: 5\nTransfer-Encoding: chunked\n\n0\n\n")
                .into_bytes()
        }
        Refused::Http09 => format!("GET {path}\r\n").into_bytes(),
        Refused::NotChunked => {
            format!("POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n0\r\n\r\n").into_bytes()
        }
        Refused::ChunkedOnHttp10 => {
            format!("POST {path} HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n").into_bytes()
        }
    }
}

#[test]
fn nothing_after_a_refused_request_is_parsed_or_forwarded() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let (mock, gate) = rt.block_on(async {
        let mock = MockWeChat::start().await;
        mock.respond(|_| Reply::Echo);
        let gate = Gate::start(&mock, "").await;
        (mock, gate)
    });
    let case = AtomicUsize::new(0);
    let strategy =
        (prop::collection::vec(served(), 0..5), refused(), prop::collection::vec(served(), 1..3), any::<bool>());
    let mut runner = TestRunner::new(Config { cases: 128, failure_persistence: None, ..Config::default() });
    let result = runner.run(&strategy, |(before, refused, after, smuggle_in_body)| {
        let n = case.fetch_add(1, Ordering::SeqCst);
        let mut bytes = Vec::new();
        let mut statuses = Vec::new();
        let mut forwarded = Vec::new();
        for (i, r) in before.iter().enumerate() {
            let path = format!("/cgi-bin/c{n}/before{i}");
            let (b, status, body) = served_bytes(r, &path);
            bytes.extend_from_slice(&b);
            statuses.push(status);
            if let Some(body) = body {
                forwarded.push((path, body));
            }
        }
        bytes.extend_from_slice(&refused_bytes(&refused, &format!("/cgi-bin/c{n}/refused")));
        statuses.push(400);
        let mut behind = Vec::new();
        for (i, r) in after.iter().enumerate() {
            behind.extend_from_slice(&served_bytes(r, &format!("/cgi-bin/c{n}/smuggled{i}")).0);
        }
        if smuggle_in_body {
            // Behind the refused head as a chunk of its body, as a TE.CL attack puts it.
            bytes.extend_from_slice(format!("{:x}\r\n", behind.len()).as_bytes());
            bytes.extend_from_slice(&behind);
            bytes.extend_from_slice(b"\r\n0\r\n\r\n");
        } else {
            bytes.extend_from_slice(&behind);
        }
        let seen_before = mock.count();
        let ex = rt.block_on(exchange(gate.addr, &bytes));
        prop_assert!(ex.closed, "the connection closes after the refusal: {:?}", ex.text());
        let got: Vec<u16> = ex.responses().iter().map(|r| r.status).collect();
        prop_assert_eq!(got, statuses, "{}", ex.text());
        let seen: Vec<(String, Vec<u8>)> =
            mock.calls().into_iter().skip(seen_before).map(|c| (c.path_and_query, c.body.to_vec())).collect();
        prop_assert_eq!(seen, forwarded);
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    rt.block_on(async move {
        // The refusals are the client's: none is counted as WeChat failing.
        let metrics = get_at(gate.admin_addr(), "/metrics").await.text();
        let failed = sample(&metrics, "wxgate_calls_total{rule=\"_none\",outcome=\"upstream_error\"}");
        assert_eq!(failed, Some(0.0), "{metrics}");
    });
}
