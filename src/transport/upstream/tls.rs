//! The connector every upstream connection is opened with: TCP, then TLS
//! for https, trusting the public web roots plus `upstream_ca`.

use std::path::Path;
use std::sync::Arc;

use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

use super::error::ClientError;
use crate::config::Server;

/// The connector for `[server]`'s upstreams: HTTP/1 over TCP (no delay,
/// connecting bounded by `upstream_timeout`), TLS for https.
pub(super) fn connector(server: &Server) -> Result<HttpsConnector<HttpConnector>, ClientError> {
    let mut roots = RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() };
    if let Some(ca) = &server.upstream_ca {
        add_pem_roots(&mut roots, ca)?;
    }
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(ClientError::Tls)?
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
    Ok(connector)
}

fn add_pem_roots(roots: &mut RootCertStore, path: &Path) -> Result<(), ClientError> {
    let unreadable = |source| ClientError::CaUnreadable { path: path.to_owned(), source };
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(path).map_err(unreadable)?.collect::<Result<_, _>>().map_err(unreadable)?;
    if certs.is_empty() {
        return Err(ClientError::CaEmpty { path: path.to_owned() });
    }
    for c in certs {
        roots.add(c).map_err(|source| ClientError::CaRefused { path: path.to_owned(), source })?;
    }
    Ok(())
}
