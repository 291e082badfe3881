//! `CONNECT` with `[intercept]` on ([`crate::transport::intercept`]): a tunnel to a
//! listed WeChat host, in which wxgate is the TLS server, then serves the
//! calls inside like direct ones ([`crate::proxy::handle_intercepted`]).
//!
//! 1. `CONNECT <host>:443` for a listed host: answered 200, then the
//!    connection is hyper's upgrade. Anything else (another host, another
//!    port) goes to [`crate::proxy::handle`], whose accept phase refuses it
//!    (400, a WeChat-shaped body saying what to do; counted and logged like
//!    every refused request); a refused `CONNECT` closes its connection.
//! 2. TLS with the client, within `[server] header_timeout`: its SNI, if
//!    any, must be the `CONNECT`'s host; the host's leaf certificate
//!    (minted from the CA, cached). A client that does not trust the CA,
//!    bytes that are not TLS, or another SNI end the connection: nothing
//!    was read as a request, nothing forwarded (`handshake_failed`).
//! 3. HTTP/1.1 inside, behind a request guard of its own
//!    ([`crate::transport::smuggling::SmuggleGuard`]), with the same limits as a
//!    direct connection; a `CONNECT` inside is refused. Shutdown waits for
//!    these calls as for direct ones.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::header::{HeaderValue, CONNECTION};
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::server::conn::http1::Builder;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::Watcher;
use tokio_rustls::LazyConfigAcceptor;

use crate::proxy::app::App;
use crate::proxy::{handle, handle_intercepted};
use crate::telemetry::metrics::{Tunnel, TunnelLabels};
use crate::transport::body::RelayBody;
use crate::transport::downstream::Client;
use crate::transport::intercept::Host;
use crate::transport::smuggling::SmuggleGuard;

/// Answers a `CONNECT` (`[intercept]` is on). `watcher` keeps shutdown
/// waiting for the tunnel's calls (taken by the first tunnel: hyper gives
/// up the connection after it); `builder` serves HTTP/1.1 inside, as
/// outside.
pub async fn connect(
    app: &Arc<App>,
    mut req: Request<Incoming>,
    client: &Client,
    watcher: &Mutex<Option<Watcher>>,
    builder: Builder,
) -> Response<RelayBody> {
    let host = app.intercept.as_ref().and_then(|i| {
        let target = req.uri().authority()?;
        // As the request guard reads it (`host:443` written so: no user
        // info, no `:0443`), or the guard would follow what comes next as
        // requests and the tunnel would break.
        let plain = !target.as_str().contains('@');
        (plain && target.port().is_some_and(|p| p.as_str() == "443")).then(|| i.host(target.host()))?.cloned()
    });
    let taken = host.as_ref().and_then(|_| watcher.lock().unwrap_or_else(|e| e.into_inner()).take());
    let (Some(host), Some(watcher)) = (host, taken) else {
        count(app, Tunnel::refused);
        // Refused (400) and counted by the accept phase; nothing after it
        // on this connection is read (the request guard may have stopped
        // following the framing).
        let mut resp = handle(app, req, client).await;
        resp.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
        return resp;
    };
    let upgrade = hyper::upgrade::on(&mut req);
    let (app, client) = (app.clone(), client.clone());
    tokio::spawn(async move {
        match upgrade.await {
            Ok(upgraded) => serve(app, TokioIo::new(upgraded), host, client, watcher, builder).await,
            Err(e) => tracing::debug!(error = %e, "a CONNECT tunnel was never opened"),
        }
    });
    let mut resp = Response::new(RelayBody::full(Bytes::new()));
    *resp.status_mut() = StatusCode::OK;
    resp
}

/// TLS with the client, then its calls; see the module docs.
async fn serve(
    app: Arc<App>,
    io: TokioIo<hyper::upgrade::Upgraded>,
    host: Arc<Host>,
    client: Client,
    watcher: Watcher,
    builder: Builder,
) {
    let Some(intercept) = app.intercept.clone() else { return };
    let limit = app.config.load().server.header_timeout;
    let handshake = async {
        let start = LazyConfigAcceptor::new(rustls::server::Acceptor::default(), io)
            .await
            .map_err(|e| format!("no TLS from the client ({e})"))?;
        if let Some(sni) = start.client_hello().server_name() {
            if !sni.eq_ignore_ascii_case(&host.name) {
                return Err(format!("the client's TLS server name {sni:?} is not the CONNECT's host"));
            }
        }
        let tls = intercept.tls(&host).map_err(|e| e.to_string())?;
        start.into_stream(tls).await.map_err(|e| {
            format!("{e} (a client must trust the [intercept] CA: REQUESTS_CA_BUNDLE, SSL_CERT_FILE, a trust store)")
        })
    };
    let tls = match tokio::time::timeout(limit, handshake).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(why)) => {
            count(&app, Tunnel::handshake_failed);
            tracing::warn!(host = %host.name, error = %why, "TLS with a client inside a CONNECT tunnel failed; nothing was forwarded");
            return;
        }
        Err(_) => {
            count(&app, Tunnel::handshake_failed);
            tracing::warn!(host = %host.name, ?limit, "no TLS handshake inside a CONNECT tunnel within [server] header_timeout; nothing was forwarded");
            return;
        }
    };
    count(&app, Tunnel::opened);
    let service = service_fn(move |req| {
        let (app, client, host) = (app.clone(), client.clone(), host.clone());
        async move { Ok::<_, Infallible>(handle_intercepted(&app, req, &client, host).await) }
    });
    let conn = builder.serve_connection(TokioIo::new(SmuggleGuard::new(tls)), service);
    if let Err(e) = watcher.watch(conn).await {
        tracing::debug!(error = %e, "a tunnelled connection ended with an error");
    }
}

fn count(app: &App, result: Tunnel) {
    app.core.metrics.intercept_tunnels.get_or_create(&TunnelLabels { result }).inc();
}
