//! Callbacks of queued delivery (tests/queue_callbacks.rs): a receiver
//! (a [`MockWeChat`] recording every POST) and the check a receiver makes
//! of `X-Wxgate-Signature`.

use super::{MockWeChat, Recorded, Reply};

/// The callback key the tests configure (`[queue] callback_key_file`).
pub const KEY: &str = "0123456789abcdef0123456789abcdef";

/// `[queue]` lines naming a key file in `dir` holding [`KEY`] (mode 0600).
pub fn key_file_line(dir: &super::TempDir) -> String {
    let file = dir.write_secret("callback.key", &format!("{KEY}\n"));
    format!("callback_key_file = \"{}\"\n", file.display())
}

/// A receiver answering each callback as `reply` says (by its number, from 0).
pub async fn receiver(reply: impl Fn(usize) -> Reply + Send + Sync + 'static) -> MockWeChat {
    let mock = MockWeChat::start().await;
    let n = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    mock.respond(move |_| reply(n.fetch_add(1, std::sync::atomic::Ordering::SeqCst)));
    mock
}

pub fn status(status: u16) -> Reply {
    Reply::Status { status, body: "body".into() }
}

/// Checks a callback's `X-Wxgate-Signature` as a receiver does (HMAC-SHA256
/// with `key` over `"<t>.<body>"`); returns `t`. Panics if it does not verify.
pub fn verify(rec: &Recorded, key: &[u8]) -> i64 {
    let header = rec.headers.get("x-wxgate-signature").expect("a signature").to_str().expect("ascii");
    let (t, v1) = header
        .split_once(',')
        .and_then(|(t, v)| Some((t.strip_prefix("t=")?, v.strip_prefix("v1=")?)))
        .unwrap_or_else(|| panic!("t=<t>,v1=<hex>: {header}"));
    let mut signed = format!("{t}.").into_bytes();
    signed.extend_from_slice(&rec.body);
    let k = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key);
    let tag: Vec<u8> = (0..v1.len() / 2).map(|i| u8::from_str_radix(&v1[2 * i..2 * i + 2], 16).expect("hex")).collect();
    ring::hmac::verify(&k, &signed, &tag).unwrap_or_else(|_| panic!("the signature verifies: {header}"));
    t.parse().expect("t is a number")
}

/// A receiver that accepts every connection, reads what comes and never
/// answers a byte (a dead receiver, as a hostile review found one): it
/// counts the connections accepted, those the client closed since, and
/// the most open at once.
pub struct Hanging {
    pub port: u16,
    counts: std::sync::Arc<HangingCounts>,
}

#[derive(Default)]
struct HangingCounts {
    accepted: std::sync::atomic::AtomicUsize,
    open: std::sync::atomic::AtomicUsize,
    most: std::sync::atomic::AtomicUsize,
    closed: std::sync::atomic::AtomicUsize,
}

impl Hanging {
    pub async fn start() -> Hanging {
        use std::sync::atomic::Ordering::SeqCst;
        use tokio::io::AsyncReadExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the hanging receiver");
        let port = listener.local_addr().expect("local addr").port();
        let counts = std::sync::Arc::new(HangingCounts::default());
        let c = counts.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else { return };
                c.accepted.fetch_add(1, SeqCst);
                let open = c.open.fetch_add(1, SeqCst) + 1;
                c.most.fetch_max(open, SeqCst);
                let c = c.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    while matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {}
                    c.open.fetch_sub(1, SeqCst);
                    c.closed.fetch_add(1, SeqCst);
                });
            }
        });
        Hanging { port, counts }
    }

    /// `http://127.0.0.1:port`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.counts.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Connections the client has closed (its post given up).
    pub fn closed(&self) -> usize {
        self.counts.closed.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The most connections open at once.
    pub fn most_open(&self) -> usize {
        self.counts.most.load(std::sync::atomic::Ordering::SeqCst)
    }
}
