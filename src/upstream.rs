//! The pooled client to the one configured upstream (WeChat, or a mock in
//! tests). wxgate never connects anywhere else: every connection goes to the
//! configured base, and a request carries only the client's path and query
//! (origin-form) and the upstream's `Host`.
//!
//! The pool is wxgate's own, one per serving thread: hyper's HTTP/1
//! connections, a stack of senders (newest first, so few connections stay
//! warm), no hashing, no task per call. A request goes out once; it is sent
//! again only when hyper hands it back unsent (a pooled connection that had
//! closed before the request was written), then on a new connection.
//!
//! A failure says whether the request provably never reached the upstream
//! ([`UpstreamError::never_sent`]): only then does the call give back what
//! its admission took from the rule's limits.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName};
use http::uri::PathAndQuery;
use http::{Request, Response, Uri};
use http_body_util::{Either, Full, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

use crate::clock::Stopwatch;
use crate::config::Server;

/// Why a call could not be relayed; mapped to 502 or 504 by [`crate::error`].
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
    #[error("upstream did not answer within {0:?}")]
    Timeout(Duration),
    /// The client's streamed body went over `[server] max_body`.
    #[error("the request body is larger than [server] max_body")]
    BodyTooLarge,
}

impl UpstreamError {
    /// True when provably no byte of the request reached the upstream, so
    /// WeChat cannot have counted the call. Everything else (a timeout
    /// after the request was handed to a connection, a reset, a malformed
    /// or truncated answer, a body cut at `max_body`) may have been counted.
    pub fn never_sent(&self) -> bool {
        matches!(self, UpstreamError::Connect(_) | UpstreamError::ConnectTimeout(_))
    }
}

/// A forwarded request's body: the client's, streamed (cut at `max_body`),
/// or one read whole before forwarding (a token request's).
pub type ForwardBody = Either<Limited<Incoming>, Full<Bytes>>;

type Sender = SendRequest<ForwardBody>;

/// An idle connection is closed after this long unused.
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Most idle connections kept per pool.
const MAX_IDLE: usize = 256;

/// Connections to the upstream: senders of hyper HTTP/1 connections, each
/// driven by a task on the thread that opened it.
#[derive(Default)]
struct Pool {
    /// Idle senders, each with how long it has been idle.
    idle: Mutex<Vec<(Sender, Stopwatch)>>,
}

impl Pool {
    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<(Sender, Stopwatch)>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The newest connection ready for a request; drops closed and expired ones.
    fn take(&self) -> Option<Sender> {
        let mut idle = self.idle();
        let now = Stopwatch::start();
        let mut i = idle.len();
        while i > 0 {
            i -= 1;
            let (sender, since) = &idle[i];
            if sender.is_closed() || since.until(now) > IDLE_TIMEOUT {
                idle.swap_remove(i);
            } else if sender.is_ready() {
                return Some(idle.swap_remove(i).0);
            }
        }
        None
    }

    /// Keeps a connection for later calls. It may still be reading the answer
    /// it was just used for; [`Pool::take`] only hands out ready ones.
    fn put(&self, sender: Sender) {
        let mut idle = self.idle();
        if idle.len() < MAX_IDLE && !sender.is_closed() {
            idle.push((sender, Stopwatch::start()));
        }
    }
}

#[derive(Clone)]
pub struct Upstream {
    connector: HttpsConnector<HttpConnector>,
    /// scheme://authority of the upstream: where connections go.
    base: Uri,
    /// Used off the serving threads.
    pool: Arc<Pool>,
    /// One pool per serving thread ([`crate::worker`]): a connection's task
    /// runs on the thread that opened it, so sharing pools across threads
    /// would make every call wake another thread.
    per_worker: Arc<[Pool]>,
    base_path: String,
    /// `Host` of every forwarded call, as hyper would build it per call.
    host: http::HeaderValue,
    timeout: Duration,
}

impl Upstream {
    /// Builds the client. Trusts the public web roots plus `upstream_ca`.
    pub fn new(server: &Server) -> Result<Upstream, String> {
        let mut roots = RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() };
        if let Some(ca) = &server.upstream_ca {
            add_pem_roots(&mut roots, ca)?;
        }
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS set-up: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(server.upstream_timeout));
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let up = &server.upstream;
        let hostname = up.host().ok_or("upstream has no host")?;
        let default_port = if up.scheme_str() == Some("https") { 443 } else { 80 };
        let host = match up.port_u16() {
            Some(p) if p != default_port => format!("{hostname}:{p}"),
            _ => hostname.to_owned(),
        };
        let host = http::HeaderValue::from_str(&host).map_err(|e| format!("upstream host: {e}"))?;
        let base = Uri::builder()
            .scheme(up.scheme().cloned().unwrap_or(http::uri::Scheme::HTTPS))
            .authority(up.authority().cloned().ok_or("upstream has no host")?)
            .path_and_query("/")
            .build()
            .map_err(|e| format!("upstream: {e}"))?;
        Ok(Upstream {
            connector,
            base,
            pool: Arc::default(),
            per_worker: (0..server.workers).map(|_| Pool::default()).collect(),
            host,
            base_path: up.path().trim_end_matches('/').to_owned(),
            timeout: server.upstream_timeout,
        })
    }

    /// The request target sent upstream (origin-form): the base URL's path,
    /// then the client's path and query, bytes unchanged.
    pub fn target(&self, path_and_query: &PathAndQuery) -> Result<Uri, http::Error> {
        if self.base_path.is_empty() {
            Ok(Uri::from(path_and_query.clone()))
        } else {
            Uri::builder().path_and_query(format!("{}{}", self.base_path, path_and_query)).build()
        }
    }

    /// The `Host` header forwarded calls carry (the upstream's, never the client's).
    pub fn host(&self) -> &http::HeaderValue {
        &self.host
    }

    /// Sends one request (origin-form target, `Host` set by the caller), once,
    /// and returns the answer's head within `upstream_timeout`.
    pub async fn send(&self, req: Request<ForwardBody>) -> Result<Response<Incoming>, UpstreamError> {
        let pool = crate::worker::pick(&self.per_worker, &self.pool);
        let handed = AtomicBool::new(false);
        match tokio::time::timeout(self.timeout, self.send_on(pool, req, &handed)).await {
            Err(_) if !handed.load(Ordering::Acquire) => Err(UpstreamError::ConnectTimeout(self.timeout)),
            Err(_) => Err(UpstreamError::Timeout(self.timeout)),
            Ok(result) => result,
        }
    }

    /// Sends `req` on a pooled or new connection. `handed` is true while the
    /// request is with a connection (it may be on the wire).
    async fn send_on(
        &self,
        pool: &Pool,
        mut req: Request<ForwardBody>,
        handed: &AtomicBool,
    ) -> Result<Response<Incoming>, UpstreamError> {
        let mut pooled = pool.take();
        loop {
            let reused = pooled.is_some();
            let mut sender = match pooled.take() {
                Some(sender) => sender,
                None => self.connect().await?,
            };
            handed.store(true, Ordering::Release);
            match sender.try_send_request(req).await {
                Ok(resp) => {
                    pool.put(sender);
                    return Ok(resp);
                }
                Err(mut e) => match e.take_message() {
                    // Handed back unsent by a pooled connection that had
                    // closed: never on the wire, so it goes on a new one.
                    // (hyper hands a request back only if its connection
                    // never started writing it.)
                    Some(unsent) if reused => {
                        handed.store(false, Ordering::Release);
                        req = unsent;
                    }
                    // A new connection that closed before writing it.
                    Some(_) => {
                        return Err(UpstreamError::Connect(format!(
                            "the connection closed before the request was written: {}",
                            error_chain(&e.into_error())
                        )))
                    }
                    None => {
                        let e = e.into_error();
                        return Err(if body_too_large(&e) {
                            UpstreamError::BodyTooLarge
                        } else {
                            UpstreamError::Failed(error_chain(&e))
                        });
                    }
                },
            }
        }
    }

    /// Opens a connection (TCP, then TLS for https) and starts its task on
    /// this thread's runtime.
    async fn connect(&self) -> Result<Sender, UpstreamError> {
        use tower_service::Service;
        let mut connector = self.connector.clone();
        let connect_error =
            |e: Box<dyn std::error::Error + Send + Sync>| UpstreamError::Connect(error_chain(e.as_ref()));
        std::future::poll_fn(|cx| connector.poll_ready(cx)).await.map_err(connect_error)?;
        let io = connector.call(self.base.clone()).await.map_err(connect_error)?;
        let (sender, conn) =
            hyper::client::conn::http1::handshake(io).await.map_err(|e| UpstreamError::Connect(error_chain(&e)))?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "upstream connection ended with an error");
            }
        });
        Ok(sender)
    }
}

fn add_pem_roots(roots: &mut RootCertStore, path: &Path) -> Result<(), String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("upstream_ca {}: {e}", path.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("upstream_ca {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("upstream_ca {}: no certificate in the file", path.display()));
    }
    for c in certs {
        roots.add(c).map_err(|e| format!("upstream_ca {}: {e}", path.display()))?;
    }
    Ok(())
}

fn body_too_large(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut src = Some(e);
    while let Some(err) = src {
        if err.is::<LengthLimitError>() {
            return true;
        }
        src = err.source();
    }
    false
}

fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

/// The hop-by-hop headers every message loses, besides those `Connection` names.
fn is_hop_by_hop(name: &HeaderName) -> bool {
    name == header::CONNECTION
        || name == header::TE
        || name == header::TRANSFER_ENCODING
        || name == header::UPGRADE
        || name == header::TRAILER
        || name == header::PROXY_AUTHORIZATION
        || name == header::PROXY_AUTHENTICATE
        || name.as_str() == "keep-alive"
        || name.as_str() == "proxy-connection"
}

/// Removes hop-by-hop headers (RFC 9110 §7.6.1), including those named by `Connection`.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Most messages have none: one pass over the names instead of a lookup
    // per hop-by-hop header.
    let mut gone: Vec<HeaderName> = headers.keys().filter(|n| is_hop_by_hop(n)).cloned().collect();
    if gone.is_empty() {
        return;
    }
    gone.extend(
        headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok()),
    );
    for n in gone {
        headers.remove(n);
    }
}
