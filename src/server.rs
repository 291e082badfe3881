//! Accepting connections: HTTP/1.1 on a plain TCP listener, one task per
//! connection, graceful shutdown on request.

pub mod tunnel;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1::Builder;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::proxy::app::App;
use crate::proxy::handle;
use crate::transport::downstream::Client;
use crate::transport::smuggling::SmuggleGuard;

/// Largest request head (request line + headers); larger gets 431.
const MAX_HEAD_BYTES: usize = 64 * 1024;
// Most header fields in one request: hyper's default of 100 (more gets
// 431). Left unset on purpose: setting it, even to 100, makes hyper zero a
// 100-slot array for every request head it parses.

/// A running listener. Dropping it does not stop it; call [`Running::shutdown`].
pub struct Running {
    pub addr: SocketAddr,
    /// The admin listener's address, when it runs.
    pub admin_addr: Option<SocketAddr>,
    pub app: Arc<App>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Running {
    /// Stops accepting and stops queued delivery's dispatcher from starting
    /// sends, lets calls in flight, held calls and queued sends under way
    /// finish (up to `deadline`), then waits briefly for their concurrency slots to be
    /// released in the store, and closes the store ([`crate::store::Store::close`]:
    /// the memory store writes its state file). Returns false if calls were still in flight at
    /// the deadline (they are cut off; their leases run out by themselves).
    pub async fn shutdown(self, deadline: Duration) -> bool {
        let _ = self.stop.send(true);
        // Queued delivery stops starting sends at once; those under way
        // finish with the calls in flight, within the same deadline.
        let components = self.app.features.stop(deadline);
        let (calls, _) = tokio::join!(tokio::time::timeout(deadline, self.task), components);
        let finished = calls.is_ok();
        if !finished {
            tracing::warn!(?deadline, "calls still in flight at the shutdown deadline");
        }
        if !self.app.core.slots.wait_released(Duration::from_secs(2)).await {
            tracing::warn!("some concurrency slots were not released; their leases will run out");
        }
        self.app.core.store.close().await;
        finished
    }

    /// Waits until the listener stops (after a shutdown request).
    pub async fn wait(self) {
        let _ = self.task.await;
    }

    pub fn stopper(&self) -> watch::Sender<bool> {
        self.stop.clone()
    }
}

/// Where connections are served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threads {
    /// On the runtime that calls [`serve`] (in-process tests, embedding).
    Caller,
    /// On this many threads of their own, each with a single-threaded
    /// runtime, all accepting from the one listening socket ([`crate::transport::worker`]).
    Workers(usize),
}

/// Serves `app` on `listener` (and the admin API on `admin`, on the calling
/// runtime) until shutdown is requested.
pub fn serve(
    listener: TcpListener,
    admin: Option<TcpListener>,
    app: Arc<App>,
    threads: Threads,
) -> std::io::Result<Running> {
    let addr = listener.local_addr()?;
    let (stop, stopped) = watch::channel(false);
    let admin_addr = match admin {
        Some(l) => {
            let a = l.local_addr()?;
            crate::ops::admin::serve(l, app.clone(), stop.subscribe());
            Some(a)
        }
        None => None,
    };
    let task = match threads {
        Threads::Caller => {
            probe(&app, stopped.clone());
            tokio::spawn(accept_loop(listener, app.clone(), stopped))
        }
        Threads::Workers(n) => spawn_workers(listener, &app, n.max(1), &stop)?,
    };
    Ok(Running { addr, admin_addr, app, stop, task })
}

/// Starts `n` serving threads; the returned task ends when all have stopped
/// (each after its calls in flight and its slot releases are done).
fn spawn_workers(
    listener: TcpListener,
    app: &Arc<App>,
    n: usize,
    stop: &watch::Sender<bool>,
) -> std::io::Result<JoinHandle<()>> {
    let listener = listener.into_std()?;
    let mut ended = Vec::with_capacity(n);
    for index in 0..n {
        let listener = listener.try_clone()?;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let app = app.clone();
        let stopped = stop.subscribe();
        let (done, end) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new().name(format!("wxgate-worker-{index}")).spawn(move || {
            crate::transport::worker::enter(index);
            runtime.block_on(async move {
                let listener = match TcpListener::from_std(listener) {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::error!(error = %e, worker = index, "a serving thread cannot listen");
                        return;
                    }
                };
                app.core.store.attach_worker().await;
                probe(&app, stopped.clone());
                accept_loop(listener, app.clone(), stopped).await;
                // Slot releases run as tasks on this runtime: let them finish.
                app.core.slots.wait_released(Duration::from_secs(2)).await;
            });
            drop(done);
        })?;
        ended.push(end);
    }
    Ok(tokio::spawn(async move {
        for end in ended {
            let _ = end.await;
        }
    }))
}

/// On this runtime until shutdown, the probe of how late its scheduler
/// wakes timers ([`crate::admit::margin`]): with a clock that runs by
/// itself only (a test's manual clock has no lateness to measure).
fn probe(app: &Arc<App>, mut stopped: watch::Receiver<bool>) {
    if !app.core.clock.runs_by_itself() {
        return;
    }
    let noted = app.clone();
    let observe = move |now, late| {
        let config = noted.config.load();
        crate::admit::margin::note(&noted.core.margin, &noted.core.metrics, &config.server, now, late);
        config.server.window_margin_max_us > config.server.window_margin_us
    };
    let stop = async move {
        let _ = stopped.changed().await;
    };
    tokio::spawn(crate::admit::margin::probe(app.core.clock.clone(), observe, stop));
}

/// Accepts connections until `stopped` changes, then lets the open ones finish.
async fn accept_loop(listener: TcpListener, app: Arc<App>, mut stopped: watch::Receiver<bool>) {
    let graceful = GracefulShutdown::new();
    loop {
        let (stream, _peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stopped.changed() => break,
        };
        let _ = stream.set_nodelay(true);
        let header_timeout = app.config.load().server.header_timeout;
        let app = app.clone();
        let client = Client::new(stream);
        if app.intercept.is_some() {
            intercepting(app, client, header_timeout, &graceful, stopped.clone());
            continue;
        }
        let service = {
            let client = client.clone();
            service_fn(move |req| {
                let app = app.clone();
                let client = client.clone();
                async move { Ok::<_, std::convert::Infallible>(handle(&app, req, &client).await) }
            })
        };
        let conn = http1(header_timeout).serve_connection(TokioIo::new(SmuggleGuard::new(client)), service);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// hyper's HTTP/1 server as wxgate runs it, on every connection (and
/// inside `[intercept]` tunnels).
fn http1(header_timeout: Duration) -> Builder {
    let mut builder = Builder::new();
    // Half-close aware: a client that closes its sending side after a
    // complete request still gets the answer (see `crate::transport::downstream`).
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .half_close(true)
        .max_buf_size(2 * MAX_HEAD_BYTES)
        .max_header_size(MAX_HEAD_BYTES)
        // One buffer, one write(2): an answer's body is small JSON, copied
        // after its head. With writev hyper zeroes 64 I/O slices for every
        // flush (~250 instructions each, twice a call with the upstream's).
        .writev(false);
    builder
}

/// Serves one connection with `[intercept]` on: as any other, but a
/// `CONNECT` goes to [`crate::server::tunnel`] (and the request guard lets a
/// tunnel's bytes through). hyper's graceful shutdown helper cannot watch
/// an upgradeable connection: this one is shut down gracefully when
/// `stopped` changes, and holds a watcher meanwhile so that the shutdown
/// waits for it, as for the others.
fn intercepting(
    app: Arc<App>,
    client: Client,
    header_timeout: Duration,
    graceful: &GracefulShutdown,
    mut stopped: watch::Receiver<bool>,
) {
    let Some(names) = app.intercept.as_ref().map(|i| i.names()) else { return };
    let tunnel_watcher = Arc::new(std::sync::Mutex::new(Some(graceful.watcher())));
    let keep = graceful.watcher();
    let service = {
        let client = client.clone();
        service_fn(move |req: http::Request<hyper::body::Incoming>| {
            let (app, client, watcher) = (app.clone(), client.clone(), tunnel_watcher.clone());
            async move {
                let resp = if req.method() == http::Method::CONNECT {
                    crate::server::tunnel::connect(&app, req, &client, &watcher, http1(header_timeout)).await
                } else {
                    handle(&app, req, &client).await
                };
                Ok::<_, std::convert::Infallible>(resp)
            }
        })
    };
    let guard = SmuggleGuard::new(client).tunnels(names);
    let conn = http1(header_timeout).serve_connection(TokioIo::new(guard), service).with_upgrades();
    tokio::spawn(async move {
        let _keep = keep;
        tokio::pin!(conn);
        let ended = tokio::select! {
            ended = conn.as_mut() => ended,
            _ = stopped.changed() => {
                conn.as_mut().graceful_shutdown();
                conn.await
            }
        };
        if let Err(e) = ended {
            tracing::debug!(error = %e, "connection ended with an error");
        }
    });
}
