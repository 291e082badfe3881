//! Test harness: a mock WeChat over real sockets, wxgate started in-process
//! on a free loopback port with a [`ManualClock`], and a small HTTP client.
//! Beside it: the wxgate binary as a process ([`process`]), `redis-server`
//! ([`redis_server`]), config TOML ([`config`]), polling with a deadline
//! ([`poll`]), window counting ([`window`]), raw HTTP over a socket
//! ([`wire`]), `wxgate sim` in-process ([`sim`]),
//! scratch directories ([`temp`]), upstream ports that refuse
//! or stall connections ([`ports`]), the memory store's state file
//! ([`state_file`]), request bodies with upstreams that record what became
//! of them ([`bodies`]), real WeChat SDKs as subprocesses ([`sdk`]) and the
//! deployment files with promtool ([`deploy`]), `[intercept]`'s CA
//! and CONNECT clients ([`intercept`]), queued delivery's jobs
//! (submissions, and the test binary run again as a child: [`jobs`]),
//! queued delivery over real sockets ([`queue`]) and its callbacks (a
//! receiver, the signature's check: [`callbacks`]), the stores a scenario
//! runs on ([`backing`]: memory, Redis, Cluster), an OpenTelemetry
//! collector ([`otlp`]), a headless Chromium over the DevTools protocol
//! ([`browser`]), a WeCom with a member directory, visible ranges and
//! per-member silent drops ([`wecom`]).
//! Compiled once, in the one integration test binary (tests/all.rs),
//! whose every test file's module does `use crate::support;`.
#![allow(dead_code)]

pub mod backing;
pub mod bodies;
pub mod browser;
pub mod callbacks;
pub mod config;
pub mod deploy;
pub mod intercept;
pub mod jobs;
pub mod otlp;
pub mod pki;
pub mod poll;
pub mod ports;
pub mod process;
pub mod queue;
pub mod redis_server;
pub mod sdk;
pub mod sim;
pub mod state_file;
pub mod temp;
pub mod tokens;
pub mod wecom;
pub mod window;
pub mod wire;

#[allow(unused_imports)]
pub use config::{caller, key_sha256, midday_timezone, penalty, rule, CallerToml, ConfigToml, RuleToml, StoreToml};
#[allow(unused_imports)]
pub use poll::{eventually, eventually_async, eventually_some, eventually_some_async, within_async, PATIENCE};
#[allow(unused_imports)]
pub use temp::TempDir;
#[allow(unused_imports)]
pub use window::{busiest_window, max_in_window};
#[allow(unused_imports)]
pub use wire::{exchange, exchange_half_closed, read_until_closed, Exchange, RawResponse};

use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt::Display;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Notify};
use wxgate::config::Config;
use wxgate::server::Running;
use wxgate::time::ManualClock;

/// 2026-11-29 10:00:00 Beijing (02:00 UTC), in microseconds.
pub const T0: i64 = (20_786 * 86_400 + 2 * 3600) * 1_000_000;
pub const SEC: i64 = 1_000_000;

/// Guards against hangs: an exchange, a start or a stop that needs longer
/// than this has failed.
pub const GUARD: Duration = Duration::from_secs(20);

/// One call as the mock saw it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path_and_query: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub arrived: Instant,
}

/// What the mock answers.
#[derive(Clone)]
pub enum Reply {
    /// Status 200, this JSON text, `Content-Type` as given.
    Json { body: String, content_type: &'static str },
    /// Status 200, `image/jpeg`, `len` bytes in 64 KiB chunks. When `gate`
    /// is set, the first chunk goes out, then the rest only after it is notified.
    Binary { len: usize, gate: Option<Arc<Notify>> },
    /// Never answer (until the connection is dropped).
    Hang,
    /// Send headers and part of a body, then drop the connection.
    DropMidBody,
    /// Send headers (`Content-Length` 1000) and `{`, then nothing more
    /// until the connection is dropped: a WeChat that stalls mid-answer.
    StallMidBody,
    /// Status 200, this body, this Content-Type.
    Bytes { body: Vec<u8>, content_type: &'static str },
    /// Status 200, `application/json`, this body sent with
    /// `Content-Encoding: <encoding>` (the test encodes it).
    Encoded { body: Vec<u8>, encoding: &'static str },
    /// Wait this long (real time), then answer `then`.
    Delayed { ms: u64, then: Box<Reply> },
    /// Wait for a permit from `gate` (the test adds them), then answer `then`.
    Gated { gate: Arc<tokio::sync::Semaphore>, then: Box<Reply> },
    /// A WeChat with a ceiling on calls at once: `then` while fewer than
    /// `slots`' ceiling are being answered (the call holds a slot until its
    /// answer is decided), else `over` at once (e.g. 45033).
    Limited { slots: Arc<Slots>, then: Box<Reply>, over: Box<Reply> },
    /// Echo the request back: status 200, body = request body, headers
    /// `x-echo-*` describing the request.
    Echo,
    /// This status and body (`text/plain`): e.g. a callback receiver that fails.
    Status { status: u16, body: String },
}

/// Whether this run is the suite's per-call mode (`WXGATE_TEST_PER_CALL=1`,
/// set by scripts/test.sh for its second run of the Redis tests): every
/// Redis store a test configures decides each call on its own, without the
/// default quota leases and reserves.
pub fn test_per_call() -> bool {
    std::env::var("WXGATE_TEST_PER_CALL").is_ok_and(|v| v == "1")
}

pub fn errcode_reply(code: i64) -> Reply {
    Reply::Json {
        body: format!(
            r#"{{"errcode":{code},"errmsg":"reach max api daily quota limit rid: 6740e5a1-0b3c7d2e-1f2a3b4c"}}"#
        ),
        content_type: "text/plain",
    }
}

pub fn ok_reply() -> Reply {
    Reply::Json { body: r#"{"errcode":0,"errmsg":"ok"}"#.into(), content_type: "application/json; encoding=utf-8" }
}

type Responder = Arc<dyn Fn(&Recorded) -> Reply + Send + Sync>;

/// A mock WeChat server that records every call.
#[derive(Clone)]
pub struct MockWeChat {
    pub addr: SocketAddr,
    calls: Arc<Mutex<Vec<Recorded>>>,
    responder: Arc<Mutex<Responder>>,
    in_flight: Arc<AtomicUsize>,
    max_in_flight: Arc<AtomicUsize>,
}

/// Counts a call as in flight at the mock until its answer is decided.
struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    fn enter(now: &Arc<AtomicUsize>, max: &Arc<AtomicUsize>) -> InFlight {
        let n = now.fetch_add(1, Ordering::SeqCst) + 1;
        max.fetch_max(n, Ordering::SeqCst);
        InFlight(now.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The calls at once a [`Reply::Limited`] takes, and what it saw: each
/// call's arrival with how many were being answered with it (itself
/// counted), and whether it was over the ceiling.
pub struct Slots {
    ceiling: usize,
    now: Arc<AtomicUsize>,
    seen: Mutex<Vec<Concurrent>>,
}

/// One call at a [`Slots`]-limited mock.
#[derive(Debug, Clone, Copy)]
pub struct Concurrent {
    pub arrived: Instant,
    /// Calls being answered with it, itself counted.
    pub at_once: usize,
    /// Over the ceiling: answered `over`.
    pub over: bool,
}

impl Slots {
    pub fn new(ceiling: usize) -> Arc<Slots> {
        Arc::new(Slots { ceiling, now: Arc::default(), seen: Mutex::default() })
    }

    /// Every call so far, in arrival order.
    pub fn seen(&self) -> Vec<Concurrent> {
        self.seen.lock().expect("slots").clone()
    }

    /// Takes a slot (`Some`: held until dropped) or finds them all taken.
    fn take(&self) -> Option<InFlight> {
        let mut seen = self.seen.lock().expect("slots");
        let at_once = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        let over = at_once > self.ceiling;
        seen.push(Concurrent { arrived: Instant::now(), at_once, over });
        if over {
            self.now.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(InFlight(self.now.clone()))
    }
}

impl MockWeChat {
    /// The mock as an upstream base URL, `http://127.0.0.1:port`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub async fn start() -> MockWeChat {
        MockWeChat::start_on(TcpListener::bind("127.0.0.1:0").await.expect("bind mock"))
    }

    /// A mock serving on `listener` (e.g. a [`ports::ClosedPort`] opened).
    pub fn start_on(listener: TcpListener) -> MockWeChat {
        let mock = MockWeChat {
            addr: listener.local_addr().expect("mock addr"),
            calls: Arc::default(),
            responder: Arc::new(Mutex::new(Arc::new(|_: &Recorded| ok_reply()))),
            in_flight: Arc::default(),
            max_in_flight: Arc::default(),
        };
        let m = mock.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { return };
                m.serve_conn(TokioIo::new(stream));
            }
        });
        mock
    }

    pub fn serve_conn<I>(&self, io: I)
    where
        I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    {
        let m = self.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let m = m.clone();
                async move { Ok::<_, Infallible>(m.answer(req).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
        });
    }

    /// Sets how the mock answers from now on.
    pub fn respond(&self, f: impl Fn(&Recorded) -> Reply + Send + Sync + 'static) {
        *self.responder.lock().expect("responder") = Arc::new(f);
    }

    /// From now on every call waits at the mock until the test adds a permit
    /// to the returned semaphore (one per call), then gets `then`.
    pub fn hold_replies(&self, then: Reply) -> Arc<tokio::sync::Semaphore> {
        let permits = Arc::new(tokio::sync::Semaphore::new(0));
        let p = permits.clone();
        self.respond(move |_| Reply::Gated { gate: p.clone(), then: Box::new(then.clone()) });
        permits
    }

    pub fn calls(&self) -> Vec<Recorded> {
        self.calls.lock().expect("calls").clone()
    }

    pub fn count(&self) -> usize {
        self.calls.lock().expect("calls").len()
    }

    /// Calls being answered right now, and the most there ever were at once.
    pub fn in_flight(&self) -> (usize, usize) {
        (self.in_flight.load(Ordering::SeqCst), self.max_in_flight.load(Ordering::SeqCst))
    }

    async fn answer(&self, req: Request<Incoming>) -> Response<MockBody> {
        let (parts, body) = req.into_parts();
        let body = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        let rec = Recorded {
            method: parts.method.to_string(),
            path_and_query: parts.uri.path_and_query().map(|p| p.to_string()).unwrap_or_default(),
            headers: parts.headers.clone(),
            body: body.clone(),
            arrived: Instant::now(),
        };
        self.calls.lock().expect("calls").push(rec.clone());
        let responder = self.responder.lock().expect("responder").clone();
        let mut reply = responder(&rec);
        let in_flight = InFlight::enter(&self.in_flight, &self.max_in_flight);
        let mut slot = None;
        let reply = loop {
            match reply {
                Reply::Limited { slots, then, over } => match slots.take() {
                    Some(taken) => {
                        slot = Some(taken);
                        reply = *then;
                    }
                    None => reply = *over,
                },
                Reply::Gated { gate, then } => {
                    if let Ok(permit) = gate.acquire().await {
                        permit.forget();
                    }
                    reply = *then;
                }
                Reply::Delayed { ms, then } => {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    reply = *then;
                }
                other => break other,
            }
        };
        drop(slot);
        drop(in_flight);
        match reply {
            Reply::Gated { .. } | Reply::Delayed { .. } | Reply::Limited { .. } => unreachable!("unwrapped above"),
            Reply::Json { body, content_type } => {
                Response::builder().header("content-type", content_type).body(full(body)).expect("response")
            }
            Reply::Status { status, body } => Response::builder()
                .status(status)
                .header("content-type", "text/plain")
                .body(full(body))
                .expect("response"),
            Reply::Echo => {
                let mut b = Response::builder()
                    .header("content-type", "application/octet-stream")
                    .header("x-echo-method", rec.method.clone())
                    .header("x-echo-path", rec.path_and_query.clone());
                for (k, v) in &rec.headers {
                    b = b.header(format!("x-echo-h-{k}"), v);
                }
                b.body(full(rec.body.clone())).expect("response")
            }
            Reply::Binary { len, gate } => {
                let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, Infallible>>(4);
                tokio::spawn(async move {
                    let mut sent = 0;
                    let mut first = true;
                    while sent < len {
                        let n = (len - sent).min(64 * 1024);
                        let chunk: Vec<u8> = (sent..sent + n).map(|i| (i % 251) as u8).collect();
                        if tx.send(Ok(Frame::data(Bytes::from(chunk)))).await.is_err() {
                            return;
                        }
                        sent += n;
                        if first {
                            first = false;
                            if let Some(g) = &gate {
                                g.notified().await;
                            }
                        }
                    }
                });
                Response::builder()
                    .header("content-type", "image/jpeg")
                    .header("content-length", len.to_string())
                    .body(StreamBody::new(tokio_stream_from(rx)).boxed_unsync())
                    .expect("response")
            }
            Reply::Hang => {
                std::future::pending::<()>().await;
                unreachable!()
            }
            Reply::StallMidBody => {
                let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, Infallible>>(1);
                tokio::spawn(async move {
                    let _ = tx.send(Ok(Frame::data(Bytes::from_static(b"{")))).await;
                    // Keep the body open: the answer never ends.
                    tx.closed().await;
                });
                Response::builder()
                    .header("content-type", "application/json")
                    .header("content-length", "1000")
                    .body(StreamBody::new(tokio_stream_from(rx)).boxed_unsync())
                    .expect("response")
            }
            Reply::Bytes { body, content_type } => {
                Response::builder().header("content-type", content_type).body(full(body)).expect("response")
            }
            Reply::Encoded { body, encoding } => Response::builder()
                .header("content-type", "application/json")
                .header("content-encoding", encoding)
                .body(full(body))
                .expect("response"),
            Reply::DropMidBody => {
                let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, Infallible>>(1);
                tokio::spawn(async move {
                    let _ = tx.send(Ok(Frame::data(Bytes::from_static(b"{\"errcode\":0,")))).await;
                    // dropping tx with the declared length unmet aborts the connection
                });
                Response::builder()
                    .header("content-type", "application/json")
                    .header("content-length", "1000")
                    .body(StreamBody::new(tokio_stream_from(rx)).boxed_unsync())
                    .expect("response")
            }
        }
    }
}

type MockBody = http_body_util::combinators::UnsyncBoxBody<Bytes, Infallible>;

fn full(b: impl Into<Bytes>) -> MockBody {
    Full::new(b.into()).boxed_unsync()
}

fn tokio_stream_from(
    mut rx: mpsc::Receiver<Result<Frame<Bytes>, Infallible>>,
) -> impl futures_core::Stream<Item = Result<Frame<Bytes>, Infallible>> {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// A wxgate listening on a free loopback port, with a manual clock.
pub struct Gate {
    pub addr: SocketAddr,
    pub clock: ManualClock,
    pub running: Option<Running>,
    /// Its Redis store decides on `clock` ([`Gate::start_redis_on_manual_clock`]):
    /// [`Gate::restart`] starts the new one so too.
    redis_on_clock: bool,
}

/// Config text for a gate in front of `upstream` (an `http://host:port` base)
/// with these sections (rules, a store, penalties): [`ConfigToml`]'s defaults.
pub fn config_text(upstream: &str, sections: impl Display) -> String {
    ConfigToml::new(upstream).with(sections).to_string()
}

fn parse(text: impl Display) -> Config {
    Config::parse(&text.to_string(), Path::new("test.toml")).expect("test config")
}

impl Gate {
    /// A gate in front of `mock` with these sections (rules, a store, penalties).
    pub async fn start(mock: &MockWeChat, sections: impl Display) -> Gate {
        Gate::start_text(config_text(&mock.url(), sections)).await
    }

    /// A gate on this whole config text (or [`ConfigToml`]).
    pub async fn start_text(text: impl Display) -> Gate {
        Gate::serve(parse(text), None).await
    }

    /// A gate loaded from a config file, which it watches for changes.
    pub async fn start_file(path: &Path) -> Gate {
        Gate::serve(Config::load(path).expect("test config file"), None).await
    }

    /// A gate on the system clock, for tests of real concurrency and of
    /// Redis (its `clock` field is unused).
    pub async fn start_real(mock: &MockWeChat, sections: impl Display) -> Gate {
        Gate::start_real_text(config_text(&mock.url(), sections)).await
    }

    /// Like [`Gate::start_real`], on a whole config text (or [`ConfigToml`]).
    pub async fn start_real_text(text: impl Display) -> Gate {
        Gate::serve(parse(text), Some(Arc::new(wxgate::time::SystemClock))).await
    }

    /// A gate on this whole config text, whose `[store]` is Redis (single
    /// or Cluster) deciding on the gate's [`ManualClock`] instead of Redis
    /// `TIME`: time-dependent scenarios on Redis, without waiting.
    pub async fn start_redis_on_manual_clock(text: impl Display) -> Gate {
        Gate::redis_on(parse(text), ManualClock::new(T0)).await
    }

    /// Like [`Gate::start_redis_on_manual_clock`], loaded from a config file,
    /// which it watches for changes (and [`Gate::restart`] loads again).
    pub async fn start_redis_file_on_manual_clock(path: &Path) -> Gate {
        Gate::redis_on(Config::load(path).expect("test config file"), ManualClock::new(T0)).await
    }

    /// Starts wxgate on `config`, whose Redis store decides on `clock`.
    async fn redis_on(config: Config, clock: ManualClock) -> Gate {
        let wxgate::config::StoreConfig::Redis(redis) = &config.store else { panic!("a Redis store") };
        let store = wxgate::store::redis::RedisStore::connect(redis)
            .await
            .expect("connect")
            .with_fixed_clock(Arc::new(clock.clone()));
        let running = wxgate::start_with_store(config, Arc::new(store), Arc::new(clock.clone())).await.expect("start");
        Gate { addr: running.addr, clock, running: Some(running), redis_on_clock: true }
    }

    /// Starts wxgate on this runtime, on `clock` or else a [`ManualClock`] at [`T0`].
    async fn serve(config: Config, clock: Option<Arc<dyn wxgate::time::Clock>>) -> Gate {
        let manual = ManualClock::new(T0);
        let clock = clock.unwrap_or_else(|| Arc::new(manual.clone()));
        let running = wxgate::start(config, clock).await.expect("start wxgate");
        Gate { addr: running.addr, clock: manual, running: Some(running), redis_on_clock: false }
    }

    /// Stops this gate as SIGTERM stops wxgate (calls finish, then the store
    /// closes: the memory store writes its state file) and starts a new one
    /// from the same config file, on the same manual clock (a Redis store
    /// started on it decides on it again).
    pub async fn restart(mut self) -> Gate {
        let running = self.running.take().expect("running");
        let path = running.app.config.load().source.clone();
        let old = Arc::downgrade(&running.app);
        assert!(running.shutdown(GUARD).await, "calls in flight finished");
        // A restart is a new process: the old instance is gone first. Its
        // background tasks (the dispatcher, callbacks, metrics) let go of its
        // app when their round ends, and with it of its jobs file and lock,
        // which the new one then opens.
        eventually_async("the old instance gone", PATIENCE, async || old.strong_count() == 0).await;
        let config = Config::load(&path).expect("test config file");
        if self.redis_on_clock {
            return Gate::redis_on(config, self.clock.clone()).await;
        }
        let running = wxgate::start(config, Arc::new(self.clock.clone())).await.expect("restart wxgate");
        Gate { addr: running.addr, clock: self.clock.clone(), running: Some(running), redis_on_clock: false }
    }

    /// The running app (config, store, counters).
    pub fn app(&self) -> &wxgate::proxy::app::App {
        &self.running.as_ref().expect("running").app
    }

    /// The admin listener's address.
    pub fn admin_addr(&self) -> SocketAddr {
        self.running.as_ref().expect("running").admin_addr.expect("admin listener")
    }

    /// Calls of `account` on `rule` being held for their reserved slot right
    /// now (wxgate's own count: `App::activity`).
    pub fn held(&self, account: &str, rule: &str) -> u32 {
        self.app().core.activity.get(account, &Arc::from(rule)).0
    }

    /// Places taken among this instance's held calls, `[server] max_held`
    /// (`App::held`): a call on a rule with `max_wait` takes one while it is
    /// decided and held, and gives it back when it goes or its client leaves.
    pub fn held_places(&self) -> usize {
        self.app().core.held.count()
    }

    /// Reloads applied and refused so far (`App::reloads`).
    pub fn reloads(&self) -> (u64, u64) {
        let r = &self.app().reloads;
        (r.ok.load(Ordering::Relaxed), r.failed.load(Ordering::Relaxed))
    }

    /// Returns once wxgate has acted on what was already ready to run when it
    /// was called, such as held calls that a clock step woke (each looks at
    /// the clock again, and either goes, leaving [`Gate::held`], or keeps
    /// waiting). It is a round trip to the admin listener's `/healthz`: a
    /// `Gate` serves on the test's runtime, and on the current-thread runtime
    /// of `#[tokio::test]` every task already queued runs before that request
    /// even connects. So "X did not happen" is checked after wxgate had its
    /// turn to do X, not after a guessed sleep. (On a multi-thread runtime the
    /// round trip makes that very likely, not certain.)
    pub async fn settle(&self) {
        let a = get_at(self.admin_addr(), "/healthz").await;
        assert_eq!(a.status, 200, "admin /healthz: {}", a.text());
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// One sample of the admin API's `/metrics` (`name{labels}` exactly as
    /// exposed), if present.
    pub async fn metric(&self, name_and_labels: &str) -> Option<f64> {
        sample(&get_at(self.admin_addr(), "/metrics").await.text(), name_and_labels)
    }

    pub async fn get(&self, path: &str) -> Answer {
        send(Request::get(self.url(path)).body(Full::new(Bytes::new())).expect("request")).await
    }

    pub async fn get_as(&self, account: &str, path: &str) -> Answer {
        send(
            Request::get(self.url(path))
                .header("x-wx-account", account)
                .body(Full::new(Bytes::new()))
                .expect("request"),
        )
        .await
    }

    /// A GET naming `caller` in `X-Wx-Caller`.
    pub async fn get_as_caller(&self, caller: &str, path: &str) -> Answer {
        self.get_with(path, &[("x-wx-caller", caller)]).await
    }

    /// A GET with these headers, in order (a name given twice is sent twice).
    pub async fn get_with(&self, path: &str, headers: &[(&str, &str)]) -> Answer {
        let mut req = Request::get(self.url(path));
        for (name, v) in headers {
            req = req.header(*name, *v);
        }
        send(req.body(Full::new(Bytes::new())).expect("request")).await
    }

    /// A DELETE with these headers (e.g. cancelling a queued delivery).
    pub async fn delete_with(&self, path: &str, headers: &[(&str, &str)]) -> Answer {
        let mut req = Request::delete(self.url(path));
        for (name, v) in headers {
            req = req.header(*name, *v);
        }
        send(req.body(Full::new(Bytes::new())).expect("request")).await
    }

    pub async fn post(&self, path: &str, body: &str) -> Answer {
        send(Request::post(self.url(path)).body(Full::new(Bytes::from(body.to_owned()))).expect("request")).await
    }

    /// A POST naming `account` in `X-Wx-Account`.
    /// A POST with these headers.
    pub async fn post_with(&self, path: &str, body: &str, headers: &[(&str, &str)]) -> Answer {
        let mut req = Request::post(self.url(path));
        for (name, v) in headers {
            req = req.header(*name, *v);
        }
        send(req.body(Full::new(Bytes::from(body.to_owned()))).expect("request")).await
    }

    pub async fn post_as(&self, account: &str, path: &str, body: &str) -> Answer {
        let req = Request::post(self.url(path)).header("x-wx-account", account);
        send(req.body(Full::new(Bytes::from(body.to_owned()))).expect("request")).await
    }

    pub fn advance(&self, d: Duration) {
        self.clock.advance(d);
    }
}

/// A complete answer as a client sees it.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("JSON body")
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub fn retry_after(&self) -> i64 {
        self.header("retry-after").and_then(|v| v.parse().ok()).expect("Retry-After")
    }
}

/// A GET of `path` on the listener at `addr` (for calls in spawned tasks,
/// which cannot borrow a [`Gate`] or a process).
/// An admin API request (`method path`, with the bearer `token` if any).
pub async fn admin(addr: SocketAddr, method: &str, path: &str, token: Option<&str>) -> Answer {
    let mut req = http::Request::builder().method(method).uri(format!("http://{addr}{path}"));
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    send(req.body(Full::new(Bytes::new())).expect("request")).await
}

/// An admin request with these headers (`Origin`, `Authorization: Basic`, ...).
pub async fn admin_with(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)]) -> Answer {
    let mut req = http::Request::builder().method(method).uri(format!("http://{addr}{path}"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    send(req.body(Full::new(Bytes::new())).expect("request")).await
}

pub async fn get_at(addr: SocketAddr, path: &str) -> Answer {
    send(Request::get(format!("http://{addr}{path}")).body(Full::new(Bytes::new())).expect("request")).await
}

/// A GET of `path` as `account` (`X-Wx-Account`) on the listener at `addr`.
pub async fn get_as_at(addr: SocketAddr, account: &str, path: &str) -> Answer {
    let req = Request::get(format!("http://{addr}{path}")).header("x-wx-account", account);
    send(req.body(Full::new(Bytes::new())).expect("request")).await
}

pub async fn send(req: Request<Full<Bytes>>) -> Answer {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let resp = client.request(req).await.expect("wxgate answered");
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.expect("whole body").to_bytes();
    Answer { status: parts.status, headers: parts.headers, body }
}

/// Counts answers by status.
pub fn tally(statuses: &[StatusCode]) -> HashMap<u16, usize> {
    let mut m = HashMap::new();
    for s in statuses {
        *m.entry(s.as_u16()).or_default() += 1;
    }
    m
}

/// The value of one sample line of an OpenMetrics exposition (`name{labels}`
/// exactly as exposed), if present.
pub fn sample(metrics: &str, name_and_labels: &str) -> Option<f64> {
    metrics.lines().find_map(|l| l.strip_prefix(name_and_labels)?.trim().split(' ').next()?.parse().ok())
}

/// `data` as a gzip stream (RFC 1952) of one stored deflate block: what a
/// server answering `Accept-Encoding: gzip` sends, without a compressor.
pub fn gzip_stored(data: &[u8]) -> Vec<u8> {
    assert!(data.len() < 65_536, "one stored block");
    let mut out = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];
    let len = data.len() as u16;
    out.push(1); // final block, stored
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&(!len).to_le_bytes());
    out.extend_from_slice(data);
    let mut crc = 0xffff_ffffu32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xedb8_8320 } else { crc >> 1 };
        }
    }
    out.extend_from_slice(&(!crc).to_le_bytes());
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out
}
