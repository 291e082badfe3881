//! The pooled client to the configured upstreams (WeChat, or mocks in
//! tests). wxgate never connects anywhere else: every connection goes to a
//! configured base, and a request carries only the client's path and query
//! (origin-form) and that upstream's own `Host`.
//!
//! The pool is wxgate's own, one per upstream and serving thread: hyper's
//! HTTP/1 connections, a stack of senders (newest first, so few connections
//! stay warm), no hashing, no task per call. A request goes out once; it is
//! sent again only when hyper hands it back unsent (a pooled connection that
//! had closed before the request was written), then on a new connection.
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
//!
//! **Failover** (`[server] upstream` a list): a call goes to the first
//! upstream that is up. When it provably never reached that one
//! ([`UpstreamError::never_sent`]: no connection, TLS failed, or
//! `upstream_timeout` while connecting; the request handed back unwritten)
//! it goes to the next at once, with a connect budget of its own; once any
//! byte of it may have been written it is never sent anywhere else (WeChat's
//! sends are not idempotent): a timeout after that is 504, as with one
//! upstream. Each failure of an upstream (never sent, or sent and then no
//! answer; not the client's body) has it skipped for a back-off: 10 s,
//! doubling while it keeps failing, at most 5 min; an answer ends it. When
//! the back-off is over, the next call tries it first (one call at a time:
//! the others go on to the next meanwhile); there is no background probe.
//! Upstreams skipped for their back-off are still tried, in order, after
//! the others failed: a call is answered 502/504 only after every upstream
//! failed to take it. Back-off times are on the app's [`Clock`].

use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::header::{self, HeaderMap, HeaderName, HOST};
use http::uri::PathAndQuery;
use http::{Request, Response, Uri};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use tokio::task::AbortHandle;
use tokio::time::Sleep;

use crate::clock::{deadline_after, Clock, Micros, Stopwatch};
use crate::config::Server;
use crate::metrics::{FailoverLabels, Tried, TriedLabels, UpstreamLabel, UpstreamMetrics};
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

/// An upstream's first back-off after a failure.
const BACKOFF_FIRST_US: Micros = 10_000_000;
/// The longest back-off: a failing upstream is tried by one call this often.
const BACKOFF_MAX_US: Micros = 300_000_000;

/// One upstream's health, shared by every serving thread (and kept across
/// a reload that keeps the upstream).
#[derive(Default)]
struct Health {
    /// 0 while up; else the [`Clock`] time (µs) until which calls skip it.
    down_until: AtomicI64,
    /// The current back-off (µs); 0 while up.
    backoff: AtomicI64,
}

/// Why a call tries an upstream, which decides what its failure does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Why {
    /// It was up: a failure starts its first back-off.
    Up,
    /// Its back-off was over and this call claimed the retry: a failure
    /// doubles the back-off.
    Retry,
    /// Every other upstream failed first: a failure changes nothing.
    LastResort,
}

/// One configured upstream: where, its `Host`, its connections, health and series.
struct Target {
    /// scheme://authority: where connections go.
    base: Uri,
    /// `Host` of every call sent here, as hyper would build it per call.
    host: http::HeaderValue,
    /// `host[:port]`: the metrics' `upstream` label, the access log's `upstream`.
    name: String,
    /// Used off the serving threads.
    pool: Pool,
    /// One pool per serving thread ([`crate::worker`]): a connection's task
    /// runs on the thread that opened it, so sharing pools across threads
    /// would make every call wake another thread.
    per_worker: Box<[Pool]>,
    health: Arc<Health>,
    /// Tries by result, in [`Tried::ALL`]'s order.
    tried: [Counter; 4],
    up: Gauge,
}

impl Target {
    fn count(&self, result: Tried) {
        if let Some(c) = Tried::ALL.iter().position(|t| *t == result).and_then(|i| self.tried.get(i)) {
            c.inc();
        }
    }
}

/// How a try at one upstream failed.
enum Failure {
    /// Not a byte reached it: the request is back, for the next upstream.
    Unsent(Box<Request<RequestBody>>, UpstreamError),
    /// The request (or part of it) may have reached it.
    Sent(UpstreamError),
}

/// One upstream's health, for `/readyz`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamStatus {
    /// `host[:port]`.
    pub name: String,
    pub url: String,
    /// False while it is skipped after a failure.
    pub up: bool,
    /// How long it is still skipped (0 when up, or when the next call will try it).
    pub skipped_for_us: Micros,
}

/// The client to the configured upstreams, tried in order.
pub struct Upstream {
    connector: HttpsConnector<HttpConnector>,
    /// In `[server] upstream`'s order; never empty.
    targets: Box<[Target]>,
    /// The upstreams' path (the same for all), prefixed to every call's.
    base_path: String,
    /// `upstream_timeout`: connecting, and waiting for the answer's head
    /// after the whole request was handed to the connection.
    timeout: Duration,
    /// `body_timeout`: most time without progress while sending a body.
    body_timeout: Duration,
    /// Back-off times.
    clock: Arc<dyn Clock>,
    metrics: UpstreamMetrics,
}

impl Upstream {
    /// Builds the client. Trusts the public web roots plus `upstream_ca`.
    /// Upstreams that `previous` (the client a reload replaces) also had
    /// keep their health: one being skipped stays skipped.
    pub fn new(
        server: &Server,
        clock: Arc<dyn Clock>,
        metrics: &UpstreamMetrics,
        previous: Option<&Upstream>,
    ) -> Result<Upstream, String> {
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
        let mut targets = Vec::new();
        let mut base_path = None;
        for up in server.upstream.iter() {
            let hostname = up.host().ok_or("upstream has no host")?;
            let default_port = if up.scheme_str() == Some("https") { 443 } else { 80 };
            let name = match up.port_u16() {
                Some(p) if p != default_port => format!("{hostname}:{p}"),
                _ => hostname.to_owned(),
            };
            let host = http::HeaderValue::from_str(&name).map_err(|e| format!("upstream host: {e}"))?;
            let base = Uri::builder()
                .scheme(up.scheme().cloned().unwrap_or(http::uri::Scheme::HTTPS))
                .authority(up.authority().cloned().ok_or("upstream has no host")?)
                .path_and_query("/")
                .build()
                .map_err(|e| format!("upstream: {e}"))?;
            base_path.get_or_insert_with(|| up.path().trim_end_matches('/').to_owned());
            let kept = previous.and_then(|p| p.targets.iter().find(|t| t.base == base));
            let health = kept.map_or_else(Arc::default, |t| t.health.clone());
            let labels = |result| TriedLabels { upstream: name.clone(), result };
            let tried = Tried::ALL.map(|r| metrics.requests.get_or_create(&labels(r)).clone());
            let up = metrics.up.get_or_create(&UpstreamLabel { upstream: name.clone() }).clone();
            up.set(i64::from(health.down_until.load(Ordering::Relaxed) == 0));
            targets.push(Target {
                base,
                host,
                name,
                pool: Pool::default(),
                per_worker: (0..server.workers).map(|_| Pool::default()).collect(),
                health,
                tried,
                up,
            });
        }
        if targets.is_empty() {
            return Err("no upstream".into());
        }
        // The series of upstreams a reload removed go: no stale "down".
        for gone in previous.iter().flat_map(|p| p.targets.iter()) {
            if !targets.iter().any(|t| t.name == gone.name) {
                metrics.up.remove(&UpstreamLabel { upstream: gone.name.clone() });
            }
        }
        Ok(Upstream {
            connector,
            targets: targets.into(),
            base_path: base_path.unwrap_or_default(),
            timeout: server.upstream_timeout,
            body_timeout: server.body_timeout,
            clock,
            metrics: metrics.clone(),
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

    /// Whether the first upstream is `https://<host>` on port 443 (any
    /// path): `[intercept]` sends that host's calls to this pool.
    pub fn first_is_https(&self, host: &str) -> bool {
        self.targets.first().is_some_and(|t| {
            t.base.scheme_str() == Some("https")
                && t.base.port_u16().is_none_or(|p| p == 443)
                && t.base.host().is_some_and(|h| h.eq_ignore_ascii_case(host))
        })
    }

    /// The `host[:port]` of upstream `i` (as [`Upstream::send`] numbers them).
    pub fn name(&self, i: usize) -> &str {
        self.targets.get(i).map_or("", |t| &t.name)
    }

    /// Each upstream's health, in order.
    pub fn status(&self) -> Vec<UpstreamStatus> {
        let now = self.clock.now_us();
        self.targets
            .iter()
            .map(|t| {
                let until = t.health.down_until.load(Ordering::Relaxed);
                UpstreamStatus {
                    name: t.name.clone(),
                    url: t.base.to_string(),
                    up: until == 0,
                    skipped_for_us: if until == 0 { 0 } else { (until - now).max(0) },
                }
            })
            .collect()
    }

    /// Sends one request (origin-form target; `Host` set here, each
    /// upstream's own) to the first upstream that is up, and returns the
    /// answer's head, with the index of the upstream that answered (or the
    /// last one tried). When the request provably never reached an upstream
    /// it goes to the next (see the module docs); once it may have reached
    /// one, it is never sent again.
    ///
    /// At each upstream: connecting is bounded by `upstream_timeout`;
    /// sending the body by `body_timeout` without progress; waiting for the
    /// head, once the whole request has been handed to the connection, by
    /// `upstream_timeout` again. One timer serves all three, moved from
    /// deadline to deadline.
    pub async fn send(&self, mut req: Request<RequestBody>) -> (usize, Result<Response<Incoming>, UpstreamError>) {
        let progress = req.body().progress();
        let mut tried = 0u32;
        let (mut i, mut why) = self.pick(tried).unwrap_or((0, Why::LastResort));
        loop {
            tried |= 1 << i;
            let Some(target) = self.targets.get(i) else {
                return (i, Err(UpstreamError::Connect("no upstream".into())));
            };
            req.headers_mut().insert(HOST, target.host.clone());
            match self.send_to(target, req, progress.as_deref()).await {
                Ok(resp) => {
                    target.count(Tried::answered);
                    self.answered(target);
                    return (i, Ok(resp));
                }
                Err(Failure::Sent(e)) => {
                    if e.client_fault() {
                        target.count(Tried::client_error);
                    } else {
                        target.count(Tried::failed);
                        self.failed(target, why, &e);
                    }
                    return (i, Err(e));
                }
                Err(Failure::Unsent(back, e)) => {
                    target.count(Tried::not_sent);
                    self.failed(target, why, &e);
                    let Some((next, next_why)) = self.pick(tried) else { return (i, Err(e)) };
                    if let Some(to) = self.targets.get(next) {
                        tracing::debug!(from = %target.name, to = %to.name, error = %e, "the call never reached the upstream: trying the next");
                        let labels = FailoverLabels { from: target.name.clone(), to: to.name.clone() };
                        self.metrics.failovers.get_or_create(&labels).inc();
                    }
                    (req, i, why) = (*back, next, next_why);
                }
            }
        }
    }

    /// The next upstream to try, not in `tried` (a bit per index): the
    /// first that is up, or whose back-off is over and whose retry this call
    /// claims; else the first left. The clock is read once, and only when
    /// an upstream is down: with all up, this is one atomic load.
    fn pick(&self, tried: u32) -> Option<(usize, Why)> {
        let untried = |i: &usize| tried & (1 << i) == 0;
        let mut now = None;
        for (i, t) in self.targets.iter().enumerate().filter(|(i, _)| untried(i)) {
            let until = t.health.down_until.load(Ordering::Relaxed);
            if until == 0 {
                return Some((i, Why::Up));
            }
            let now = *now.get_or_insert_with(|| self.clock.now_us());
            // Claimed by moving its end on by a back-off: the calls that
            // come meanwhile skip it, and a retry whose call is dropped
            // leaves it skipped for one more back-off.
            let backoff = t.health.backoff.load(Ordering::Relaxed).max(BACKOFF_FIRST_US);
            if now >= until
                && t.health
                    .down_until
                    .compare_exchange(until, now + backoff, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                return Some((i, Why::Retry));
            }
        }
        (0..self.targets.len()).find(untried).map(|i| (i, Why::LastResort))
    }

    /// An answer came from `t`: it is up (again).
    fn answered(&self, t: &Target) {
        if t.health.down_until.load(Ordering::Relaxed) != 0 && t.health.down_until.swap(0, Ordering::AcqRel) != 0 {
            t.health.backoff.store(0, Ordering::Relaxed);
            t.up.set(1);
            tracing::info!(upstream = %t.name, "the upstream answers again: calls go to it");
        }
    }

    /// A call failed at `t` (not by its client's fault): starts its first
    /// back-off if it was up, doubles it if this was its retry.
    fn failed(&self, t: &Target, why: Why, e: &UpstreamError) {
        let h = &t.health;
        let now = self.clock.now_us();
        let backoff = match why {
            Why::Up => {
                if h.down_until
                    .compare_exchange(0, now + BACKOFF_FIRST_US, Ordering::AcqRel, Ordering::Relaxed)
                    .is_err()
                {
                    return; // already skipped, by another call's failure
                }
                h.backoff.store(BACKOFF_FIRST_US, Ordering::Relaxed);
                BACKOFF_FIRST_US
            }
            Why::Retry => {
                let b = h.backoff.load(Ordering::Relaxed).saturating_mul(2).clamp(BACKOFF_FIRST_US, BACKOFF_MAX_US);
                h.backoff.store(b, Ordering::Relaxed);
                h.down_until.store(now + b, Ordering::Release);
                b
            }
            Why::LastResort => return,
        };
        t.up.set(0);
        if self.targets.len() > 1 {
            tracing::warn!(upstream = %t.name, error = %e, backoff_s = backoff / 1_000_000, "upstream failed: calls go to the next upstream until its back-off is over, then one call tries it again");
        } else {
            tracing::warn!(upstream = %t.name, error = %e, "upstream failed: marked down until a call gets an answer");
        }
    }

    /// One try at `target`: its pooled connection or a new one, then the
    /// exchange. A request that provably never reached it comes back.
    async fn send_to(
        &self,
        target: &Target,
        mut req: Request<RequestBody>,
        progress: Option<&Progress>,
    ) -> Result<Response<Incoming>, Failure> {
        let pool = crate::worker::pick(&target.per_worker, &target.pool);
        let connect_by = deadline_after(self.timeout);
        let timer = tokio::time::sleep_until(connect_by);
        tokio::pin!(timer);
        let mut pooled = pool.take();
        loop {
            let reused = pooled.is_some();
            let mut conn = match pooled.take() {
                Some(conn) => conn,
                // Boxed: connecting (TCP, TLS, handshake) is the largest
                // state of a call and rare with a warm pool; inline, every
                // call's future would carry (and move) its ~1.6 KiB.
                None => tokio::select! {
                    biased;
                    conn = Box::pin(self.connect(&target.base)) => match conn {
                        Ok(conn) => conn,
                        Err(e) => return Err(Failure::Unsent(Box::new(req), e)),
                    },
                    () = &mut timer => {
                        return Err(Failure::Unsent(Box::new(req), UpstreamError::ConnectTimeout(self.timeout)))
                    }
                },
            };
            match self.exchange(&mut conn, req, progress, timer.as_mut(), !reused).await.map_err(Failure::Sent)? {
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
                    Some(unsent) => {
                        return Err(Failure::Unsent(
                            Box::new(unsent),
                            UpstreamError::Connect(format!(
                                "the connection closed before the request was written: {}",
                                error_chain(&e.into_error())
                            )),
                        ))
                    }
                    None => return Err(Failure::Sent(exchange_error(&e.into_error()))),
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
    async fn connect(&self, base: &Uri) -> Result<Conn, UpstreamError> {
        use tower_service::Service;
        let mut connector = self.connector.clone();
        let connect_error =
            |e: Box<dyn std::error::Error + Send + Sync>| UpstreamError::Connect(error_chain(e.as_ref()));
        std::future::poll_fn(|cx| connector.poll_ready(cx)).await.map_err(connect_error)?;
        let io = connector.call(base.clone()).await.map_err(connect_error)?;
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

/// The hop-by-hop headers every message loses, besides those `Connection`
/// names (RFC 9110 §7.6.1). Bit `i` of a mask stands for `HOP_BY_HOP[i]`.
static HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    header::TE,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::TRAILER,
    header::PROXY_AUTHORIZATION,
    header::PROXY_AUTHENTICATE,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
];

/// `HOP_BY_HOP`'s bit for `Connection`.
const CONNECTION_BIT: u16 = 1;

/// `HOP_BY_HOP`'s bit for a header name as a `HeaderMap` holds it
/// (lowercase), or 0: one `match`, compiled to a length switch and at most
/// two comparisons (this runs for every header of every call, both ways).
fn hop_by_hop_bit(name: &str) -> u16 {
    match name {
        "connection" => CONNECTION_BIT,
        "te" => 1 << 1,
        "transfer-encoding" => 1 << 2,
        "upgrade" => 1 << 3,
        "trailer" => 1 << 4,
        "proxy-authorization" => 1 << 5,
        "proxy-authenticate" => 1 << 6,
        "keep-alive" => 1 << 7,
        "proxy-connection" => 1 << 8,
        _ => 0,
    }
}

/// [`hop_by_hop_bit`] for a name in any case (a `Connection` token).
fn hop_by_hop_bit_any_case(token: &str) -> u16 {
    HOP_BY_HOP.iter().position(|h| h.as_str().eq_ignore_ascii_case(token)).map_or(0, |i| 1 << i)
}

/// Removes hop-by-hop headers (RFC 9110 §7.6.1), including those named by
/// `Connection`. Allocates nothing unless `Connection` names a header
/// outside the fixed list that the message has (most messages have none,
/// or `Connection: keep-alive` / `close`).
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let mut present = 0u16;
    for name in headers.keys() {
        present |= hop_by_hop_bit(name.as_str());
    }
    if present == 0 {
        return;
    }
    let mut listed: Vec<HeaderName> = Vec::new();
    if present & CONNECTION_BIT != 0 {
        for token in headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|t| !t.is_empty())
        {
            let bit = hop_by_hop_bit_any_case(token);
            if bit != 0 {
                present |= bit;
            } else if headers.contains_key(token) {
                if let Ok(name) = HeaderName::from_bytes(token.as_bytes()) {
                    listed.push(name);
                }
            }
        }
    }
    for (i, name) in HOP_BY_HOP.iter().enumerate() {
        if present & (1 << i) != 0 {
            headers.remove(name);
        }
    }
    for name in listed {
        headers.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        h
    }

    /// The `match` of [`hop_by_hop_bit`] and the list it stands for agree,
    /// bit for bit, in either case.
    #[test]
    fn each_hop_by_hop_name_has_its_own_bit() {
        for (i, name) in HOP_BY_HOP.iter().enumerate() {
            assert_eq!(hop_by_hop_bit(name.as_str()), 1 << i, "{name}");
            assert_eq!(hop_by_hop_bit_any_case(&name.as_str().to_ascii_uppercase()), 1 << i, "{name}");
        }
        assert_eq!(HOP_BY_HOP[0], header::CONNECTION);
        assert_eq!(CONNECTION_BIT, 1);
        assert_eq!(hop_by_hop_bit("content-type"), 0);
    }

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_go_the_rest_stays() {
        let mut h = headers(&[
            ("content-type", "application/json"),
            ("connection", "Keep-Alive, X-Trace ,close"),
            ("connection", "upgrade"),
            ("keep-alive", "timeout=5"),
            ("x-trace", "1"),
            ("upgrade", "h2c"),
            ("te", "trailers"),
            ("proxy-connection", "keep-alive"),
            ("x-kept", "yes"),
        ]);
        strip_hop_by_hop(&mut h);
        let left: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, ["content-type", "x-kept"]);

        let mut plain = headers(&[("host", "a"), ("content-length", "3")]);
        strip_hop_by_hop(&mut plain);
        assert_eq!(plain.len(), 2, "nothing hop-by-hop: untouched");
    }
}
