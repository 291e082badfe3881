//! The body wxgate sends back to clients: either a small buffered body (our
//! own answers, or a sniffed WeChat JSON answer) or the upstream body streamed
//! through untouched, behind whatever prefix the sniffer already read.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

/// A relayed body. It may carry guards (a concurrency slot, in-flight
/// counts), released when the body is dropped: fully sent, failed, or
/// abandoned by the client.
pub struct RelayBody {
    inner: Inner,
    _guards: Vec<Box<dyn Send + Sync>>,
}

enum Inner {
    Full(Option<Bytes>),
    Stream { prefix: Option<Bytes>, rest: Incoming },
}

impl RelayBody {
    pub fn full(bytes: impl Into<Bytes>) -> Self {
        let b: Bytes = bytes.into();
        RelayBody { inner: Inner::Full((!b.is_empty()).then_some(b)), _guards: Vec::new() }
    }

    pub fn stream(prefix: Bytes, rest: Incoming) -> Self {
        RelayBody { inner: Inner::Stream { prefix: (!prefix.is_empty()).then_some(prefix), rest }, _guards: Vec::new() }
    }

    /// The whole body, when it was read whole (a sniffed JSON answer).
    pub fn whole(&self) -> Option<&Bytes> {
        match &self.inner {
            Inner::Full(b) => b.as_ref(),
            Inner::Stream { .. } => None,
        }
    }

    /// Keeps `guard` alive until this body is dropped.
    pub fn holding(mut self, guard: impl Send + Sync + 'static) -> Self {
        self._guards.push(Box::new(guard));
        self
    }
}

impl Body for RelayBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match &mut self.get_mut().inner {
            Inner::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            Inner::Stream { prefix, rest } => match prefix.take() {
                Some(p) => Poll::Ready(Some(Ok(Frame::data(p)))),
                None => Pin::new(rest).poll_frame(cx),
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Full(b) => b.is_none(),
            Inner::Stream { prefix, rest } => prefix.is_none() && rest.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            Inner::Stream { prefix, rest } => {
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
