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
//! Timeouts, each meaning what it says ([`Upstream::send`]):
//! - connecting (TCP, TLS) before the request is handed to a connection:
//!   `upstream_timeout` ([`UpstreamError::ConnectTimeout`]);
//! - sending the request body: `body_timeout` without progress. Who stopped
//!   decides whose fault it is: the client stopped sending (408,
//!   [`UpstreamError::ClientStalled`]) or the upstream stopped taking bytes
//!   (504, [`UpstreamError::BodyStalled`]). An upload may take as long as
//!   its bytes keep moving;
//! - from the moment the whole request has been handed to the connection
//!   to the answer's head: `upstream_timeout` ([`UpstreamError::Timeout`]).
//!
//! An exchange that is given up (a timeout, an error, or the call dropped)
//! closes its connection: nothing of it lingers, and nothing is sent again.
//!
//! A failure says whether the request provably never reached the upstream
//! ([`UpstreamError::never_sent`]): only then does the call give back what
//! its admission took from the rule's limits. A request body the client
//! broke off or malformed ([`UpstreamError::client_fault`]) is not such a
//! failure: WeChat may have had the head and part of the body.

use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::header::{self, HeaderMap, HeaderName};
use http::uri::PathAndQuery;
use http::{Request, Response, Uri};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use tokio::task::AbortHandle;
use tokio::time::Sleep;

use crate::clock::{deadline_after, Stopwatch};
use crate::config::Server;
use crate::request_body::{BodyError, Progress, RequestBody};

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

/// One connection to the upstream: hyper's sender, and the task driving the
/// connection (aborted when an exchange on it is given up).
struct Conn {
    sender: SendRequest<RequestBody>,
    task: AbortHandle,
}

/// Aborts a connection's task when dropped, unless disarmed: a given-up
/// exchange (a timeout, an error, the call dropped) closes its connection
/// rather than leave the request, or part of its body, on it.
struct Abandon<'a>(Option<&'a AbortHandle>);

impl Drop for Abandon<'_> {
    fn drop(&mut self) {
        if let Some(task) = self.0 {
            task.abort();
        }
    }
}

/// Checks of the body's progress per `body_timeout` (at least one per
/// `upstream_timeout`): a stall is seen between `body_timeout` and
/// `body_timeout × (1 + 1/STALL_CHECKS)` after the last byte moved.
const STALL_CHECKS: u32 = 4;

/// An idle connection is closed after this long unused.
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Most idle connections kept per pool.
const MAX_IDLE: usize = 256;

/// Connections to the upstream: senders of hyper HTTP/1 connections, each
/// driven by a task on the thread that opened it.
#[derive(Default)]
struct Pool {
    /// Idle connections, each with how long it has been idle.
    idle: Mutex<Vec<(Conn, Stopwatch)>>,
}

impl Pool {
    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<(Conn, Stopwatch)>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The newest connection ready for a request; drops closed and expired ones.
    fn take(&self) -> Option<Conn> {
        let mut idle = self.idle();
        let now = Stopwatch::start();
        let mut i = idle.len();
        while i > 0 {
            i -= 1;
            let (conn, since) = &idle[i];
            if conn.sender.is_closed() || since.until(now) > IDLE_TIMEOUT {
                idle.swap_remove(i);
            } else if conn.sender.is_ready() {
                return Some(idle.swap_remove(i).0);
            }
        }
        None
    }

    /// Keeps a connection for later calls. It may still be reading the answer
    /// it was just used for; [`Pool::take`] only hands out ready ones.
    fn put(&self, conn: Conn) {
        let mut idle = self.idle();
        if idle.len() < MAX_IDLE && !conn.sender.is_closed() {
            idle.push((conn, Stopwatch::start()));
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
    /// `upstream_timeout`: connecting, and waiting for the answer's head
    /// after the whole request was handed to the connection.
    timeout: Duration,
    /// `body_timeout`: most time without progress while sending a body.
    body_timeout: Duration,
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
            body_timeout: server.body_timeout,
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
    /// and returns the answer's head. Connecting is bounded by
    /// `upstream_timeout`; sending the body by `body_timeout` without
    /// progress; waiting for the head, once the whole request has been
    /// handed to the connection, by `upstream_timeout` again. One timer
    /// serves all three, moved from deadline to deadline.
    pub async fn send(&self, mut req: Request<RequestBody>) -> Result<Response<Incoming>, UpstreamError> {
        let pool = crate::worker::pick(&self.per_worker, &self.pool);
        let progress = req.body().progress();
        let connect_by = deadline_after(self.timeout);
        let timer = tokio::time::sleep_until(connect_by);
        tokio::pin!(timer);
        let mut pooled = pool.take();
        loop {
            let reused = pooled.is_some();
            let mut conn = match pooled.take() {
                Some(conn) => conn,
                None => tokio::select! {
                    biased;
                    conn = self.connect() => conn?,
                    () = &mut timer => return Err(UpstreamError::ConnectTimeout(self.timeout)),
                },
            };
            match self.exchange(&mut conn, req, progress.as_deref(), timer.as_mut(), !reused).await? {
                Ok(resp) => {
                    pool.put(conn);
                    return Ok(resp);
                }
                Err(mut e) => match e.take_message() {
                    // Handed back unsent by a pooled connection that had
                    // closed: never on the wire, so it goes on a new one,
                    // within what is left of the time to connect. (hyper
                    // hands a request back only if its connection never
                    // started writing it.)
                    Some(unsent) if reused => {
                        req = unsent;
                        timer.as_mut().reset(connect_by);
                    }
                    // A new connection that closed before writing it.
                    Some(_) => {
                        return Err(UpstreamError::Connect(format!(
                            "the connection closed before the request was written: {}",
                            error_chain(&e.into_error())
                        )))
                    }
                    None => return Err(exchange_error(&e.into_error())),
                },
            }
        }
    }

    /// Hands `req` to `conn` and waits for the answer's head, on `timer`:
    /// while the body is being sent, a stall of `body_timeout`; then
    /// `upstream_timeout` from the moment it was handed over whole. The
    /// outer error is a timeout; the inner one is hyper's. Unless the answer
    /// came, the connection is closed on return.
    ///
    /// The body's progress is looked at when the timer fires, every `check`
    /// (at most `upstream_timeout`, so the hand-over is seen before its
    /// deadline): nothing wakes this call while a body streams, and a small
    /// body, handed over at once, costs no wake-up at all.
    async fn exchange(
        &self,
        conn: &mut Conn,
        req: Request<RequestBody>,
        progress: Option<&Progress>,
        mut timer: Pin<&mut Sleep>,
        fresh: bool,
    ) -> Result<Result<Response<Incoming>, hyper::client::conn::TrySendError<Request<RequestBody>>>, UpstreamError>
    {
        let mut abandon = Abandon(Some(&conn.task));
        let answer = conn.sender.try_send_request(req);
        tokio::pin!(answer);
        let check = (self.body_timeout / STALL_CHECKS).min(self.timeout).max(Duration::from_millis(1));
        let stalled_after = self.body_timeout.as_nanos().div_ceil(check.as_nanos());
        // The body being sent: its progress, bytes seen at the last check,
        // checks since they last moved.
        let mut sending = progress.map(|p| (p, 0, 0));
        if sending.is_some() {
            timer.as_mut().reset(deadline_after(check));
        } else if fresh {
            timer.as_mut().reset(deadline_after(self.timeout));
        }
        // Else a whole request went to a pooled connection as the call
        // started: the timer's `upstream_timeout` from then already counts
        // from the hand-over (no second timer set, no clock read).
        loop {
            tokio::select! {
                biased;
                result = &mut answer => {
                    if result.is_ok() {
                        abandon.0 = None;
                    }
                    return Ok(result);
                }
                () = &mut timer => {
                    let Some((p, seen, quiet)) = &mut sending else {
                        return Err(UpstreamError::Timeout(self.timeout));
                    };
                    if let Some(at) = p.handed_at() {
                        sending = None;
                        timer.as_mut().reset(at + self.timeout);
                        continue;
                    }
                    let moved = p.moved();
                    if moved != *seen {
                        (*seen, *quiet) = (moved, 0);
                    } else {
                        *quiet += 1;
                        if *quiet >= stalled_after {
                            return Err(if p.waiting_on_client() {
                                UpstreamError::ClientStalled(self.body_timeout)
                            } else {
                                UpstreamError::BodyStalled(self.body_timeout)
                            });
                        }
                    }
                    timer.as_mut().reset(deadline_after(check));
                }
            }
        }
    }

    /// Opens a connection (TCP, then TLS for https) and starts its task on
    /// this thread's runtime.
    async fn connect(&self) -> Result<Conn, UpstreamError> {
        use tower_service::Service;
        let mut connector = self.connector.clone();
        let connect_error =
            |e: Box<dyn std::error::Error + Send + Sync>| UpstreamError::Connect(error_chain(e.as_ref()));
        std::future::poll_fn(|cx| connector.poll_ready(cx)).await.map_err(connect_error)?;
        let io = connector.call(self.base.clone()).await.map_err(connect_error)?;
        let (sender, conn) =
            hyper::client::conn::http1::handshake(io).await.map_err(|e| UpstreamError::Connect(error_chain(&e)))?;
        let task = tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "upstream connection ended with an error");
            }
        });
        Ok(Conn { sender, task: task.abort_handle() })
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

/// An exchange's error: the client's when its body failed (found in the
/// error's source chain), else the upstream's.
fn exchange_error(e: &(dyn std::error::Error + 'static)) -> UpstreamError {
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
