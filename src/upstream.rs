//! The pooled client to the one configured upstream (WeChat, or a mock in
//! tests). wxgate never connects anywhere else: the target URI is always the
//! configured base plus the client's path and query.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use http::header::{self, HeaderMap, HeaderName};
use http::uri::PathAndQuery;
use http::{Request, Response, Uri};
use http_body_util::{LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

use crate::config::Server;

/// Why a call could not be relayed; mapped to 502 or 504 by [`crate::error`].
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("upstream unreachable: {0}")]
    Connect(String),
    #[error("upstream failed: {0}")]
    Failed(String),
    #[error("upstream did not answer within {0:?}")]
    Timeout(Duration),
    /// The client's streamed body went over `[server] max_body`.
    #[error("the request body is larger than [server] max_body")]
    BodyTooLarge,
}

type PooledClient = Client<HttpsConnector<HttpConnector>, Limited<Incoming>>;

#[derive(Clone)]
pub struct Upstream {
    /// Used off the serving threads.
    client: PooledClient,
    /// One pool per serving thread ([`crate::worker`]): a pooled connection's
    /// task runs on the thread that opened it, so sharing pools across
    /// threads would make every call wake another thread.
    per_worker: Vec<PooledClient>,
    scheme: http::uri::Scheme,
    authority: http::uri::Authority,
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
        // hyper retries a request only when the pooled connection closed before
        // the request was written (it was provably never sent): no duplicates.
        let client = || {
            Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(30))
                .pool_max_idle_per_host(256)
                .build(connector.clone())
        };
        let up = &server.upstream;
        let hostname = up.host().ok_or("upstream has no host")?;
        let default_port = if up.scheme_str() == Some("https") { 443 } else { 80 };
        let host = match up.port_u16() {
            Some(p) if p != default_port => format!("{hostname}:{p}"),
            _ => hostname.to_owned(),
        };
        let host = http::HeaderValue::from_str(&host).map_err(|e| format!("upstream host: {e}"))?;
        Ok(Upstream {
            host,
            client: client(),
            per_worker: (0..server.workers).map(|_| client()).collect(),
            scheme: up.scheme().cloned().unwrap_or(http::uri::Scheme::HTTPS),
            authority: up.authority().cloned().ok_or("upstream has no host")?,
            base_path: up.path().trim_end_matches('/').to_owned(),
            timeout: server.upstream_timeout,
        })
    }

    /// The upstream URI for a client's origin-form path and query, bytes unchanged.
    pub fn target(&self, path_and_query: &PathAndQuery) -> Result<Uri, http::Error> {
        let builder = Uri::builder().scheme(self.scheme.clone()).authority(self.authority.clone());
        if self.base_path.is_empty() {
            builder.path_and_query(path_and_query.clone()).build()
        } else {
            builder.path_and_query(format!("{}{}", self.base_path, path_and_query)).build()
        }
    }

    /// The `Host` header forwarded calls carry (the upstream's, never the client's).
    pub fn host(&self) -> &http::HeaderValue {
        &self.host
    }

    /// Sends one request, once. `Host` is set from the target URI.
    pub async fn send(&self, req: Request<Limited<Incoming>>) -> Result<Response<Incoming>, UpstreamError> {
        let client = crate::worker::pick(&self.per_worker, &self.client);
        match tokio::time::timeout(self.timeout, client.request(req)).await {
            Err(_) => Err(UpstreamError::Timeout(self.timeout)),
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(e)) if e.is_connect() => Err(UpstreamError::Connect(error_chain(&e))),
            Ok(Err(e)) if body_too_large(&e) => Err(UpstreamError::BodyTooLarge),
            Ok(Err(e)) => Err(UpstreamError::Failed(error_chain(&e))),
        }
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
