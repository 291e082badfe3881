//! The upstream over TLS: a mock WeChat behind a certificate from a private
//! CA, trusted through `upstream_ca` and refused without it.

use crate::support;

use std::path::Path;
use std::sync::Arc;

use hyper_util::rt::TokioIo;
use rustls::ServerConfig;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use support::pki::{pki, Pki};
use support::*;

/// A [`MockWeChat`] that speaks TLS with `pki`'s server certificate on its own
/// loopback port. (The clone shares the recorded calls and the responder; the
/// plain listener `start` opened stays unused.)
async fn start_tls_mock(pki: &Pki) -> MockWeChat {
    let tls = ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(vec![pki.cert.clone()], pki.key.clone_key())
        .expect("server TLS config");
    let acceptor = TlsAcceptor::from(Arc::new(tls));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind TLS mock");
    let mut mock = MockWeChat::start().await;
    mock.addr = listener.local_addr().expect("TLS mock addr");
    let m = mock.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            let acceptor = acceptor.clone();
            let m = m.clone();
            // Handshake in its own task: a failed or slow one never blocks the accept loop.
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(stream).await {
                    m.serve_conn(TokioIo::new(tls));
                }
            });
        }
    });
    mock
}

/// Config for a gate in front of `https://localhost:{port}`, trusting `ca` if given.
fn tls_config(port: u16, ca: Option<&Path>) -> ConfigToml {
    let config = ConfigToml::new(&format!("https://localhost:{port}")).server("upstream_timeout", "10s");
    match ca {
        Some(ca) => config.server("upstream_ca", ca.to_str().expect("utf-8 path")),
        None => config,
    }
}

#[tokio::test]
async fn upstream_with_a_certificate_from_upstream_ca_is_trusted() {
    let pki = pki(&["localhost", "127.0.0.1"]);
    let mock = start_tls_mock(&pki).await;
    let dir = TempDir::new("tls");
    let ca = dir.write("ca.pem", &pki.ca_pem);
    let gate = Gate::start_text(tls_config(mock.addr.port(), Some(&ca))).await;

    let a = tokio::time::timeout(GUARD, gate.get("/cgi-bin/token?grant_type=client_credential&appid=A"))
        .await
        .expect("answer in time");
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.json()["errcode"], 0, "WeChat's answer comes back: {}", a.text());
    let calls = mock.calls();
    assert_eq!(calls.len(), 1, "the call reached the TLS upstream once");
    assert_eq!(calls[0].path_and_query, "/cgi-bin/token?grant_type=client_credential&appid=A");
    assert_eq!(
        calls[0].headers.get("host").and_then(|v| v.to_str().ok()),
        Some(format!("localhost:{}", mock.addr.port()).as_str()),
        "Host names the upstream as configured"
    );
}

#[tokio::test]
async fn upstream_with_an_untrusted_certificate_is_502_and_never_called() {
    let pki = pki(&["localhost", "127.0.0.1"]);
    let mock = start_tls_mock(&pki).await;
    let gate = Gate::start_text(tls_config(mock.addr.port(), None)).await;

    let a = tokio::time::timeout(GUARD, gate.get("/cgi-bin/token?grant_type=client_credential"))
        .await
        .expect("answer in time");
    assert_eq!(a.status, 502, "{}", a.text());
    let json = a.json();
    assert_eq!(json["errcode"], -1, "{json}");
    assert!(
        json["errmsg"].as_str().is_some_and(|m| m.contains("certificate")),
        "the message says the certificate is the problem: {json}"
    );
    assert_eq!(mock.count(), 0, "no call completed at the upstream");
}

#[tokio::test]
async fn trusted_ca_does_not_excuse_a_certificate_for_another_name() {
    let pki = pki(&["wechat.invalid"]);
    let mock = start_tls_mock(&pki).await;
    let dir = TempDir::new("tls");
    let ca = dir.write("ca.pem", &pki.ca_pem);
    let gate = Gate::start_text(tls_config(mock.addr.port(), Some(&ca))).await;

    let a = tokio::time::timeout(GUARD, gate.get("/cgi-bin/token?grant_type=client_credential"))
        .await
        .expect("answer in time");
    assert_eq!(a.status, 502, "{}", a.text());
    let json = a.json();
    assert_eq!(json["errcode"], -1, "{json}");
    assert!(json["errmsg"].as_str().is_some_and(|m| m.contains("certificate")), "{json}");
    assert_eq!(mock.count(), 0, "no call completed at the upstream");
}
