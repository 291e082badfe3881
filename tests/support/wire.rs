//! Raw HTTP/1.x over a socket: send any bytes (malformed ones included) and
//! read every byte the server sends back until it closes the connection.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::GUARD;

/// What one connection produced: every byte the server sent, and whether it
/// closed the connection (EOF or reset) before the guard ran out.
pub struct Exchange {
    pub bytes: Vec<u8>,
    pub closed: bool,
}

impl Exchange {
    pub fn responses(&self) -> Vec<RawResponse> {
        parse_responses(&self.bytes)
    }

    /// The one response of this exchange; the server must have closed the connection.
    pub fn only(&self) -> RawResponse {
        assert!(self.closed, "the server closes the connection: {}", self.text());
        let mut all = self.responses();
        assert_eq!(all.len(), 1, "exactly one response: {}", self.text());
        all.remove(0)
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }

    /// Everything the server sent; it must have closed the connection.
    pub fn closed_text(&self) -> String {
        assert!(self.closed, "the server closes the connection in time: {:?}", self.text());
        self.text()
    }
}

/// Writes `bytes` on a fresh connection (write errors ignored: the server may
/// close early) while reading everything the server sends until it closes.
pub async fn exchange(addr: SocketAddr, bytes: &[u8]) -> Exchange {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut rd, mut wr) = stream.into_split();
    let payload = bytes.to_vec();
    let writer = tokio::spawn(async move {
        let _ = wr.write_all(&payload).await;
        // Keep the write half open: a half-close would let the server treat
        // an EOF as the end of the request.
        wr
    });
    let ex = read_until_closed(&mut rd).await;
    drop(writer.await);
    ex
}

/// Writes `bytes`, then closes the sending side (`shutdown(SHUT_WR)`: a
/// half-close), and reads everything the server sends until it closes.
pub async fn exchange_half_closed(addr: SocketAddr, bytes: &[u8]) -> Exchange {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut rd, mut wr) = stream.into_split();
    // Errors ignored, as in `exchange`: the server may close early.
    let _ = wr.write_all(bytes).await;
    let _ = wr.shutdown().await;
    let ex = read_until_closed(&mut rd).await;
    drop(wr);
    ex
}

pub async fn read_until_closed<R: AsyncReadExt + Unpin>(rd: &mut R) -> Exchange {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let closed = tokio::time::timeout(GUARD, async {
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .is_ok();
    Exchange { bytes: out, closed }
}

/// One HTTP/1.x response as read off the wire.
#[derive(Debug)]
pub struct RawResponse {
    pub version: String,
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl RawResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("JSON body ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Splits a byte stream into responses (Content-Length, chunked or
/// close-delimited bodies). Panics on anything that is not HTTP/1.x.
pub fn parse_responses(mut rest: &[u8]) -> Vec<RawResponse> {
    let mut out = Vec::new();
    while !rest.is_empty() {
        let end = find(rest, b"\r\n\r\n")
            .unwrap_or_else(|| panic!("incomplete response head: {:?}", String::from_utf8_lossy(rest)));
        let head = std::str::from_utf8(&rest[..end]).expect("ASCII head");
        rest = &rest[end + 4..];
        let mut lines = head.split("\r\n");
        let status_line = lines.next().expect("status line");
        let mut parts = status_line.splitn(3, ' ');
        let version = parts.next().unwrap_or_default().to_owned();
        assert!(version.starts_with("HTTP/1."), "not an HTTP/1.x response: {status_line:?}");
        let status: u16 =
            parts.next().and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("status: {status_line:?}"));
        let headers: Vec<(String, String)> = lines
            .map(|l| {
                let (k, v) = l.split_once(':').unwrap_or_else(|| panic!("header line: {l:?}"));
                (k.trim().to_ascii_lowercase(), v.trim().to_owned())
            })
            .collect();
        let get = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
        let body = if get("transfer-encoding").is_some_and(|te| te.eq_ignore_ascii_case("chunked")) {
            let mut body = Vec::new();
            loop {
                let eol = find(rest, b"\r\n").expect("chunk size line");
                let size_text = std::str::from_utf8(&rest[..eol]).expect("chunk size");
                let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
                    .unwrap_or_else(|_| panic!("chunk size {size_text:?}"));
                rest = &rest[eol + 2..];
                if size == 0 {
                    let trailer_end = find(rest, b"\r\n").expect("end of chunked body");
                    rest = &rest[trailer_end + 2..];
                    break;
                }
                body.extend_from_slice(&rest[..size]);
                rest = &rest[size + 2..];
            }
            body
        } else if let Some(len) = get("content-length") {
            let len: usize = len.parse().expect("content-length");
            let body = rest[..len].to_vec();
            rest = &rest[len..];
            body
        } else if status == 204 || status == 304 || status < 200 {
            Vec::new()
        } else {
            let body = rest.to_vec();
            rest = &[];
            body
        };
        out.push(RawResponse { version, status, headers, body });
    }
    out
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
