//! How a call to an upstream can fail, and whose fault it is: what
//! [`crate::error`] maps to an answer, and what failover reads
//! ([`UpstreamError::never_sent`]). And why the client itself cannot be
//! built ([`ClientError`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::transport::request_body::{BodyError, ReadError};

/// Why a call could not be relayed: the upstream's fault (502, 504) or the
/// client's body ([`UpstreamError::client_fault`]: 400, 408, 413); mapped
/// to an answer by [`crate::error`].
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// No connection (DNS, TCP connect, TLS handshake), or the request was
    /// handed back unwritten: not a byte of it reached the upstream.
    #[error("upstream unreachable: {0}")]
    Connect(String),
    /// `upstream_timeout` passed while still connecting: the request was
    /// never handed to a connection.
    #[error("upstream did not accept a connection within {0:?}")]
    ConnectTimeout(Duration),
    #[error("upstream failed: {0}")]
    Failed(String),
    /// `upstream_timeout` passed after the whole request was handed to the
    /// connection, without the answer's head.
    #[error("upstream did not answer within {0:?}")]
    Timeout(Duration),
    /// The upstream took no byte of the request body for `body_timeout`
    /// while wxgate had bytes for it.
    #[error("upstream stopped taking the request body: nothing for {0:?} ([server] body_timeout)")]
    BodyStalled(Duration),
    /// The client's streamed body went over `[server] max_body` (the
    /// client's fault).
    #[error("the request body is larger than [server] max_body")]
    BodyTooLarge,
    /// The client's body was malformed or cut short (the client's fault).
    #[error("{0}")]
    BadBody(String),
    /// The client sent nothing more of its body for `body_timeout` (the
    /// client's fault).
    #[error("the client stopped sending the request body: nothing for {0:?} ([server] body_timeout)")]
    ClientStalled(Duration),
}

/// Why the client to the upstreams cannot be built (at start, by a
/// reload, for an `[intercept]` host): a `[server]` value it cannot use.
/// Its text is what `wxgate` prints before it exits, or a refused reload
/// logs.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// `upstream_ca` cannot be read as PEM.
    #[error("upstream_ca {}: {source}", .path.display())]
    CaUnreadable { path: PathBuf, source: rustls_pki_types::pem::Error },
    /// `upstream_ca` holds no certificate.
    #[error("upstream_ca {}: no certificate in the file", .path.display())]
    CaEmpty { path: PathBuf },
    /// A certificate of `upstream_ca` that rustls does not take as a root.
    #[error("upstream_ca {}: {source}", .path.display())]
    CaRefused { path: PathBuf, source: rustls::Error },
    /// rustls cannot set up TLS with wxgate's crypto provider.
    #[error("TLS set-up: {0}")]
    Tls(rustls::Error),
    /// An upstream URL without a host.
    #[error("upstream has no host")]
    NoHost,
    /// An upstream's `host[:port]` is not a `Host` header value.
    #[error("upstream host: {0}")]
    Host(http::header::InvalidHeaderValue),
    /// An upstream's base URL cannot be rebuilt from its parts.
    #[error("upstream: {0}")]
    Base(http::Error),
    /// `[server] upstream` lists none.
    #[error("no upstream")]
    NoUpstream,
    /// The config has no domain (it always has the default one).
    #[error("no domain")]
    NoDomain,
    /// One domain's client, when there are several (`[[domain]]`).
    #[error("{host}: {source}")]
    Domain { host: Arc<str>, source: Box<ClientError> },
}

impl UpstreamError {
    /// True when provably no byte of the request reached the upstream, so
    /// WeChat cannot have counted the call. Everything else (a timeout
    /// after the request was handed to a connection, a reset, a malformed
    /// or truncated answer, a body cut at `max_body`) may have been counted.
    pub fn never_sent(&self) -> bool {
        matches!(self, UpstreamError::Connect(_) | UpstreamError::ConnectTimeout(_))
    }

    /// True when the client, not the upstream, failed the call: its body
    /// was too large, malformed, cut short or stalled. Not [`Self::never_sent`]:
    /// the upstream may have had the head and part of the body.
    pub fn client_fault(&self) -> bool {
        matches!(self, UpstreamError::BodyTooLarge | UpstreamError::BadBody(_) | UpstreamError::ClientStalled(_))
    }
}

/// A body read whole before forwarding failed: the client's fault, as
/// for a body streamed (400, 408, 413).
impl From<ReadError> for UpstreamError {
    fn from(e: ReadError) -> UpstreamError {
        match e {
            ReadError::TooLarge(_) => UpstreamError::BodyTooLarge,
            ReadError::Broken(broken) => UpstreamError::BadBody(broken.to_string()),
            ReadError::Stalled(within) => UpstreamError::ClientStalled(within),
        }
    }
}

/// An exchange's error: the client's when its body failed (found in the
/// error's source chain), else the upstream's.
pub(super) fn exchange_error(e: &(dyn std::error::Error + 'static)) -> UpstreamError {
    let mut src = Some(e);
    while let Some(err) = src {
        match err.downcast_ref::<BodyError>() {
            Some(BodyError::TooLarge) => return UpstreamError::BodyTooLarge,
            Some(broken @ BodyError::Broken(_)) => return UpstreamError::BadBody(broken.to_string()),
            None => src = err.source(),
        }
    }
    UpstreamError::Failed(error_chain(e))
}

pub(super) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}
