//! `wxgate sim`: a WeChat API simulator for local tries and load tests.
//!
//! It answers like `api.weixin.qq.com`: HTTP 200 and JSON, 45009 when a
//! path's sliding window or daily quota (with a configurable day length) is
//! used up, 45033 beyond its concurrency, 40001 for a token it did not issue
//! or that expired. It issues tokens (`/cgi-bin/token`, `/cgi-bin/stable_token`,
//! WeCom's `/cgi-bin/gettoken`), answers `/cgi-bin/openapi/quota/get` and
//! `/cgi-bin/clear_quota`, and counts what it saw at `GET /__stats`
//! (`POST /__reset` starts again). Limits come from a small TOML file
//! ([`config`]; reference: `docs/sim.md`); the counting is [`scoreboard`], the
//! tokens [`tokens`], one request [`handler`].
//!
//! Decisions read the injected [`Clock`], so tests drive the simulator with a
//! `ManualClock`, and simulated latency sleeps on that clock too.

pub mod config;
pub mod handler;
pub mod scoreboard;
pub mod tokens;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

pub use config::{SimConfig, SimConfigError};
use handler::Sim;

use crate::time::Clock;

/// A running simulator. Dropping it (or [`SimHandle::stop`]) stops accepting
/// connections; connections already open are served until their clients close them.
pub struct SimHandle {
    task: JoinHandle<()>,
}

impl SimHandle {
    /// Stops accepting connections.
    pub fn stop(&self) {
        self.task.abort();
    }

    /// Waits until the accept loop ends (it only ends when stopped).
    pub async fn wait(mut self) {
        let _ = (&mut self.task).await;
    }
}

impl Drop for SimHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The simulator cannot listen on its address.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr}: {source}")]
pub struct ListenError {
    pub addr: SocketAddr,
    pub source: std::io::Error,
}

/// Binds `config.listen` and serves the simulator on the calling Tokio
/// runtime; returns the bound address (for port 0, the one chosen).
pub async fn serve(config: SimConfig, clock: Arc<dyn Clock>) -> Result<(SocketAddr, SimHandle), ListenError> {
    let listen = config.listen;
    let cannot = |source| ListenError { addr: listen, source };
    let listener = TcpListener::bind(listen).await.map_err(cannot)?;
    let addr = listener.local_addr().map_err(cannot)?;
    let sim = Arc::new(Sim::new(config, clock));
    let task = tokio::spawn(accept(listener, sim));
    Ok((addr, SimHandle { task }))
}

async fn accept(listener: TcpListener, sim: Arc<Sim>) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors and the like: wait for some to close.
                tracing::warn!(error = %e, "sim: accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let sim = sim.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let sim = sim.clone();
                async move { Ok::<_, Infallible>(sim.handle(req).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
        });
    }
}
