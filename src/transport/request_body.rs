//! The client's request body on its way upstream ([`RequestBody`]).
//!
//! - No more than `[server] max_body` bytes pass: a body that grows past it
//!   fails with [`BodyError::TooLarge`] (413).
//! - A body the client does not deliver whole (malformed chunked framing, a
//!   connection that ends or resets midway) fails with
//!   [`BodyError::Broken`], which says why in words safe to log and to send
//!   back (never bytes of the request). The upstream exchange's error then
//!   carries it, so the call is answered as the client's fault (400), never
//!   as WeChat's.
//! - A request that has a body shares its [`Progress`] with the sender
//!   ([`crate::transport::upstream`]), which guards the sending with `body_timeout`:
//!   bytes passed so far, whether the body is waiting on the client, and
//!   when it was handed over whole. Nothing wakes the sender: it looks at
//!   the progress when its own timer fires. A request without a body (GET,
//!   `Content-Length: 0`) has no progress and costs nothing more.
//! - A body wxgate reads whole before it forwards the call (a token
//!   request's, a clear_quota's, one counted for its recipients, one it
//!   added a token to: [`read_whole`]) is read with the same rule: at most
//!   `body_timeout` without progress, never a total deadline. A slow
//!   upload that keeps moving is read whole, whichever path it takes.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::time::Instant;

use crate::time::deadline_after;

/// Why a request body did not reach the upstream whole: the client's fault.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BodyError {
    /// The body went over `[server] max_body`.
    #[error("the request body is larger than [server] max_body")]
    TooLarge,
    /// The client's body could not be read: malformed or cut short.
    #[error("the request body is {0}")]
    Broken(String),
}

/// Why a body read whole ([`read_whole`]) was not: the client's fault.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ReadError {
    /// The body is larger than the reader's cap.
    #[error("the request body is larger than the {0} bytes wxgate reads of it")]
    TooLarge(u64),
    /// Malformed or cut short.
    #[error("{0}")]
    Broken(BodyError),
    /// Nothing more of it arrived for this long (`[server] body_timeout`).
    #[error("the client stopped sending the request body: nothing for {0:?} ([server] body_timeout)")]
    Stalled(Duration),
}

/// Reads `body` whole, up to `cap` bytes: the one reader of every request
/// body wxgate reads before forwarding. `stall` (`[server] body_timeout`)
/// is the longest time without a byte of progress, as for a streamed body
/// ([`crate::transport::upstream`]): a body may take as long as it keeps
/// moving. One timer, moved on at each frame; a body that came in one
/// frame is not copied.
pub async fn read_whole(body: &mut Incoming, cap: u64, stall: Duration) -> Result<Bytes, ReadError> {
    use http_body_util::BodyExt as _;
    let timer = tokio::time::sleep(stall);
    tokio::pin!(timer);
    let (mut first, mut more): (Option<Bytes>, Vec<u8>) = (None, Vec::new());
    let mut len = 0u64;
    loop {
        let frame = tokio::select! {
            biased;
            frame = body.frame() => frame,
            () = &mut timer => return Err(ReadError::Stalled(stall)),
        };
        let data = match frame {
            None => break,
            Some(Err(e)) => return Err(ReadError::Broken(broken(&e))),
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => data,
                // Trailers: not part of the body WeChat reads.
                Err(_) => continue,
            },
        };
        if data.is_empty() {
            continue;
        }
        len += data.len() as u64;
        if len > cap {
            return Err(ReadError::TooLarge(cap));
        }
        timer.as_mut().reset(deadline_after(stall));
        match first.take() {
            None if more.is_empty() => first = Some(data),
            None => more.extend_from_slice(&data),
            Some(one) => {
                more.reserve(one.len() + data.len());
                more.extend_from_slice(&one);
                more.extend_from_slice(&data);
            }
        }
    }
    Ok(first.unwrap_or_else(|| Bytes::from(more)))
}

/// How far a request body has been sent; shared by the body (which the
/// upstream connection's task polls) and the sender waiting for the answer.
#[derive(Debug, Default)]
pub struct Progress {
    /// Bytes handed to the upstream connection so far.
    moved: AtomicU64,
    /// The body's last poll found nothing from the client yet.
    waiting: AtomicBool,
    /// When the whole body had been handed over (Tokio's clock).
    handed: OnceLock<Instant>,
}

impl Progress {
    /// Bytes handed to the upstream connection so far.
    pub fn moved(&self) -> u64 {
        self.moved.load(Ordering::Relaxed)
    }

    /// True while the body is waiting for the client to send more; false
    /// while it has bytes the upstream connection has not asked for.
    pub fn waiting_on_client(&self) -> bool {
        self.waiting.load(Ordering::Relaxed)
    }

    /// When the whole body had been handed to the upstream connection, if
    /// it has been.
    pub fn handed_at(&self) -> Option<Instant> {
        self.handed.get().copied()
    }
}

/// The client's body as sent upstream; see the module docs.
#[derive(Debug)]
pub struct RequestBody {
    /// `None`: a body wxgate wrote itself ([`RequestBody::bytes`]).
    inner: Option<Incoming>,
    /// A body read whole before forwarding (a token request's), sent
    /// instead of `inner` (which has then ended).
    read: Option<Bytes>,
    /// Bytes still allowed by `max_body`.
    left: u64,
    /// `None` without a body, and once it was handed over whole.
    progress: Option<Arc<Progress>>,
}

impl RequestBody {
    pub fn new(inner: Incoming, max_body: u64) -> RequestBody {
        let progress = (!inner.is_end_stream()).then(Arc::default);
        RequestBody { inner: Some(inner), read: None, left: max_body, progress }
    }

    /// `inner`, whose bytes were already read whole (`read`, within
    /// `max_body`): those bytes are sent as they came.
    pub fn already_read(inner: Incoming, read: Bytes) -> RequestBody {
        RequestBody { inner: Some(inner), read: (!read.is_empty()).then_some(read), left: 0, progress: None }
    }

    /// A body wxgate sends itself (`crate::ops::quota_sync`'s quota/get).
    pub fn bytes(read: Bytes) -> RequestBody {
        RequestBody { inner: None, read: (!read.is_empty()).then_some(read), left: 0, progress: None }
    }

    /// The body's progress, if it has a body to send.
    pub fn progress(&self) -> Option<Arc<Progress>> {
        self.progress.clone()
    }

    fn handed_whole(&mut self) {
        if let Some(p) = self.progress.take() {
            p.waiting.store(false, Ordering::Relaxed);
            // Now, on Tokio's clock.
            let _ = p.handed.set(deadline_after(Duration::ZERO));
        }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        if let Some(read) = this.read.take() {
            return Poll::Ready(Some(Ok(Frame::data(read))));
        }
        let Some(inner) = this.inner.as_mut() else { return Poll::Ready(None) };
        let polled = Pin::new(inner).poll_frame(cx);
        let waiting = matches!(polled, Poll::Pending);
        if let Some(p) = &this.progress {
            p.waiting.store(waiting, Ordering::Relaxed);
        }
        let frame = match polled {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(None) => {
                this.handed_whole();
                return Poll::Ready(None);
            }
            Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(broken(&e)))),
            Poll::Ready(Some(Ok(frame))) => frame,
        };
        if let Some(data) = frame.data_ref() {
            let n = data.len() as u64;
            if n > this.left {
                this.left = 0;
                return Poll::Ready(Some(Err(BodyError::TooLarge)));
            }
            this.left -= n;
            if let Some(p) = &this.progress {
                p.moved.fetch_add(n, Ordering::Relaxed);
            }
        }
        // hyper stops polling a body that says it has ended.
        if this.inner.as_ref().is_none_or(Incoming::is_end_stream) {
            this.handed_whole();
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.read.is_none() && self.inner.as_ref().is_none_or(Incoming::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        if let Some(read) = &self.read {
            return SizeHint::with_exact(read.len() as u64);
        }
        let Some(inner) = &self.inner else { return SizeHint::with_exact(0) };
        // As `http_body_util::Limited`: never more than what is left.
        let mut hint = inner.size_hint();
        if hint.lower() >= self.left {
            hint.set_exact(self.left);
        } else {
            hint.set_upper(hint.upper().map_or(self.left, |u| u.min(self.left)));
        }
        hint
    }
}

/// Why the client's body could not be read. hyper's description of a
/// framing error is kept when it is plain words (its fixed messages, such
/// as "invalid chunk size: overflow"); anything else, which could quote
/// bytes of the request (a trailer field), is left out.
fn broken(e: &hyper::Error) -> BodyError {
    use std::io::ErrorKind;
    let mut io = None;
    let mut src: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = src {
        if let Some(found) = err.downcast_ref::<std::io::Error>() {
            io = Some(found);
            break;
        }
        src = err.source();
    }
    let why = match io {
        Some(io) if io.kind() == ErrorKind::UnexpectedEof => {
            "incomplete: the client's connection ended before the whole body arrived".to_owned()
        }
        Some(io) if matches!(io.kind(), ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted) => {
            "incomplete: the client's connection was reset midway".to_owned()
        }
        Some(io) => match io.to_string() {
            text if is_plain(&text) => format!("malformed: {text}"),
            _ => "malformed: invalid chunked framing".to_owned(),
        },
        None => "incomplete: the client's connection failed midway".to_owned(),
    };
    BodyError::Broken(why)
}

/// Short text of letters, digits, spaces and `:,-_.` only.
fn is_plain(text: &str) -> bool {
    text.len() <= 80 && text.bytes().all(|b| b.is_ascii_alphanumeric() || b" :,-_.".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::is_plain;

    #[test]
    fn only_plain_words_are_quoted() {
        assert!(is_plain("invalid chunk size: overflow"));
        assert!(is_plain("chunk extensions over limit"));
        assert!(!is_plain("Invalid header value: Header { name: \"x\", value: [115] }"));
        assert!(!is_plain(&"a".repeat(81)));
    }
}
