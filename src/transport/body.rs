//! The body wxgate sends back to clients: either a small buffered body (our
//! own answers, or a sniffed WeChat JSON answer) or the upstream body streamed
//! through untouched, behind whatever prefix the sniffer already read.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use crate::time::deadline_after;

/// Why a relayed body ended early.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("{0}")]
    Upstream(#[from] hyper::Error),
    /// WeChat sent no byte of the body for this long (`[server]
    /// body_timeout`): the client's connection is closed, as the head went out.
    #[error("WeChat sent nothing more of the answer for {0:?} ([server] body_timeout)")]
    Stalled(Duration),
}

/// A relayed body. It may carry guards (a concurrency slot, in-flight
/// counts), released when the body is dropped: fully sent, failed, or
/// abandoned by the client.
pub struct RelayBody {
    inner: Inner,
    /// Every guard held, in one box (a call's are given at once: one
    /// allocation).
    _guards: Option<Box<dyn Send + Sync>>,
}

enum Inner {
    Full(Option<Bytes>),
    Stream {
        prefix: Option<Bytes>,
        rest: Incoming,
        /// At most this long between two frames of `rest`; the timer is
        /// made on the first wait.
        stall: Duration,
        timer: Option<Pin<Box<tokio::time::Sleep>>>,
    },
}

impl RelayBody {
    pub fn full(bytes: impl Into<Bytes>) -> Self {
        let b: Bytes = bytes.into();
        RelayBody { inner: Inner::Full((!b.is_empty()).then_some(b)), _guards: None }
    }

    /// `prefix` (what was read already), then `rest` as it comes, with at
    /// most `stall` between two of its frames.
    pub fn stream(prefix: Bytes, rest: Incoming, stall: Duration) -> Self {
        let prefix = (!prefix.is_empty()).then_some(prefix);
        RelayBody { inner: Inner::Stream { prefix, rest, stall, timer: None }, _guards: None }
    }

    /// The whole body, when it was read whole (a sniffed JSON answer).
    pub fn whole(&self) -> Option<&Bytes> {
        match &self.inner {
            Inner::Full(b) => b.as_ref(),
            Inner::Stream { .. } => None,
        }
    }

    /// Keeps `guard` alive until this body is dropped (beside any it held).
    pub fn holding(mut self, guard: impl Send + Sync + 'static) -> Self {
        self._guards = Some(match self._guards.take() {
            None => Box::new(guard),
            Some(held) => Box::new((held, guard)),
        });
        self
    }
}

impl Body for RelayBody {
    type Data = Bytes;
    type Error = RelayError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, RelayError>>> {
        match &mut self.get_mut().inner {
            Inner::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            Inner::Stream { prefix, rest, stall, timer } => {
                if let Some(p) = prefix.take() {
                    return Poll::Ready(Some(Ok(Frame::data(p))));
                }
                match Pin::new(rest).poll_frame(cx) {
                    Poll::Ready(frame) => {
                        // Progress: the next wait starts again.
                        if let Some(t) = timer.as_mut() {
                            t.as_mut().reset(deadline_after(*stall));
                        }
                        Poll::Ready(frame.map(|f| f.map_err(RelayError::from)))
                    }
                    Poll::Pending => {
                        let t = timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(*stall)));
                        match t.as_mut().poll(cx) {
                            Poll::Ready(()) => Poll::Ready(Some(Err(RelayError::Stalled(*stall)))),
                            Poll::Pending => Poll::Pending,
                        }
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Full(b) => b.is_none(),
            Inner::Stream { prefix, rest, .. } => prefix.is_none() && rest.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            Inner::Stream { prefix, rest, .. } => {
                let extra = prefix.as_ref().map_or(0, |p| p.len() as u64);
                let inner = rest.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(inner.lower() + extra);
                if let Some(upper) = inner.upper() {
                    hint.set_upper(upper + extra);
                }
                hint
            }
        }
    }
}

/// Reads an answer's body until `most` bytes, its end or an error (what
/// it says is not needed; reading it lets the connection be reused).
pub async fn read_some(mut body: hyper::body::Incoming, most: usize) {
    let mut read = 0usize;
    while read < most {
        match http_body_util::BodyExt::frame(&mut body).await {
            Some(Ok(frame)) => read += frame.data_ref().map_or(0, |d| d.len()),
            Some(Err(_)) | None => break,
        }
    }
}
