//! The body wxgate sends back to clients: either a small buffered body (our
//! own answers, or a sniffed WeChat JSON answer) or the upstream body streamed
//! through untouched, behind whatever prefix the sniffer already read.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

pub enum RelayBody {
    Full(Option<Bytes>),
    Stream { prefix: Option<Bytes>, rest: Incoming },
}

impl RelayBody {
    pub fn full(bytes: impl Into<Bytes>) -> Self {
        let b: Bytes = bytes.into();
        RelayBody::Full((!b.is_empty()).then_some(b))
    }

    pub fn stream(prefix: Bytes, rest: Incoming) -> Self {
        RelayBody::Stream { prefix: (!prefix.is_empty()).then_some(prefix), rest }
    }
}

impl Body for RelayBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            RelayBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            RelayBody::Stream { prefix, rest } => match prefix.take() {
                Some(p) => Poll::Ready(Some(Ok(Frame::data(p)))),
                None => Pin::new(rest).poll_frame(cx),
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RelayBody::Full(b) => b.is_none(),
            RelayBody::Stream { prefix, rest } => prefix.is_none() && rest.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RelayBody::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            RelayBody::Stream { prefix, rest } => {
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
