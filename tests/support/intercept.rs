//! `[intercept]` from a client's side: a CA made as `wxgate ca init` makes
//! it ([`TestCa`]), the config section, and a client that opens a `CONNECT`
//! tunnel through wxgate and speaks TLS inside it ([`connect`], [`tls`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, ServerName};
use rustls::RootCertStore;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use super::wire::{parse_responses, RawResponse};
use super::{TempDir, GUARD};

/// A fresh intercept CA in a scratch directory: `ca.pem`, and `ca-key.pem`
/// with mode 0600.
pub struct TestCa {
    pub dir: TempDir,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TestCa {
    pub fn new() -> TestCa {
        use wxgate::time::Clock as _;
        let dir = TempDir::new("ca");
        let ca =
            wxgate::transport::intercept::ca::generate("test", wxgate::time::SystemClock.now_us()).expect("make a CA");
        let cert = dir.write("ca.pem", &ca.cert_pem);
        let key = dir.write("ca-key.pem", &ca.key_pem);
        set_mode(&key, 0o600);
        TestCa { dir, cert, key }
    }

    /// An `[intercept]` section with this CA; `api.weixin.qq.com`'s calls
    /// go to `upstream` (the mock).
    pub fn section(&self, upstream: &str) -> String {
        format!(
            "[intercept]\nca_cert = {}\nca_key = {}\nupstream = {{ \"api.weixin.qq.com\" = \"{upstream}\" }}\n",
            toml::Value::from(self.cert.display().to_string()),
            toml::Value::from(self.key.display().to_string()),
        )
    }

    /// Roots that trust this CA only.
    pub fn roots(&self) -> RootCertStore {
        let pem = std::fs::read(&self.cert).expect("read ca.pem");
        let mut roots = RootCertStore::empty();
        for cert in rustls_pki_types::pem::PemObject::pem_slice_iter(&pem) {
            let cert: CertificateDer<'static> = cert.expect("ca.pem");
            roots.add(cert).expect("a root");
        }
        roots
    }
}

pub fn set_mode(path: &std::path::Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// Opens a connection to `gate` and sends `CONNECT target`; the answer's
/// head (and body, when the gate closes after it), and the connection.
pub async fn connect(gate: SocketAddr, target: &str) -> (RawResponse, TcpStream) {
    let mut stream = TcpStream::connect(gate).await.expect("connect to wxgate");
    let head = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nUser-Agent: test\r\n\r\n");
    stream.write_all(head.as_bytes()).await.expect("send CONNECT");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let answer = tokio::time::timeout(GUARD, async {
        loop {
            if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
                let len = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map_or(0, |v| v.trim().parse::<usize>().expect("content-length"));
                if got.len() >= end + 4 + len {
                    return parse_responses(&got[..end + 4 + len]).remove(0);
                }
            }
            let n = stream.read(&mut buf).await.expect("read CONNECT answer");
            assert!(n > 0, "wxgate closed without answering the CONNECT: {:?}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .expect("the CONNECT is answered in time");
    (answer, stream)
}

/// TLS inside an opened tunnel, as a client trusting `roots` that asks for
/// `server_name` (SNI and certificate check).
pub async fn tls(stream: TcpStream, roots: RootCertStore, server_name: &str) -> std::io::Result<TlsStream<TcpStream>> {
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = ServerName::try_from(server_name.to_owned()).expect("a server name");
    tokio::time::timeout(GUARD, TlsConnector::from(Arc::new(config)).connect(name, stream))
        .await
        .expect("the TLS handshake ends in time")
}

/// One `GET path` to `host` through a tunnel of `gate` (trusting `ca`):
/// the answer's status and body.
pub async fn through(gate: &super::Gate, ca: &TestCa, host: &str, path: &str) -> (u16, String) {
    let (answer, stream) = connect(gate.addr, &format!("{host}:443")).await;
    assert_eq!(answer.status, 200, "CONNECT {host}: {}", answer.text());
    let mut tls = tls(stream, ca.roots(), host).await.expect("TLS inside the tunnel");
    let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    tls.write_all(req.as_bytes()).await.expect("write");
    let raw = super::wire::read_until_closed(&mut tls).await;
    let only = raw.only();
    (only.status, only.text())
}
