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
