//! Request bodies over raw sockets, and upstreams that show what became of
//! them: [`StrictUpstream`] records only calls whose body arrived whole;
//! [`DeafUpstream`] reads a request head and then nothing more (its TCP
//! window fills up), and tells when wxgate closes the connection. Clients:
//! [`chunked_body`] frames chunks, [`send_paced`] streams a body slowly
//! and [`send_and_abort`] closes mid-request (a half-close is
//! [`super::wire::exchange_half_closed`]).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;

use super::wire::{read_until_closed, Exchange};

/// An upstream that answers `{"errcode":0}` and records only calls whose
/// request body arrived complete (`MockWeChat` records a call even when its
/// body broke off midway); calls whose body broke off are only counted.
#[derive(Clone, Default)]
pub struct StrictUpstream {
    complete: Arc<Mutex<Vec<(String, Bytes)>>>,
    broken: Arc<AtomicUsize>,
}

impl StrictUpstream {
    pub async fn start() -> (SocketAddr, StrictUpstream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind upstream");
        let addr = listener.local_addr().expect("addr");
        let up = StrictUpstream::default();
        let u = up.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let u = u.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req: Request<Incoming>| {
                        let u = u.clone();
                        async move {
                            let path = req.uri().path_and_query().map(|p| p.to_string()).unwrap_or_default();
                            match req.into_body().collect().await {
                                Ok(b) => u.complete.lock().expect("complete").push((path, b.to_bytes())),
                                Err(_) => {
                                    u.broken.fetch_add(1, Ordering::SeqCst);
                                }
                            }
                            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"{\"errcode\":0}"))))
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        (addr, up)
    }

    /// Calls whose body arrived whole: path and query, body.
    pub fn complete(&self) -> Vec<(String, Bytes)> {
        self.complete.lock().expect("complete").clone()
    }

    /// Calls whose body broke off.
    pub fn broken(&self) -> usize {
        self.broken.load(Ordering::SeqCst)
    }
}

/// An upstream that accepts connections, reads one request head from each,
/// and then reads nothing more until [`DeafUpstream::drain`]: a WeChat that
/// stopped taking the request body. Its receive buffer is small, so its TCP
/// window fills after a few KB.
pub struct DeafUpstream {
    pub addr: SocketAddr,
    heads: Arc<AtomicUsize>,
    closed: Arc<AtomicUsize>,
    drain: watch::Sender<bool>,
}

impl DeafUpstream {
    pub fn start() -> DeafUpstream {
        let socket = TcpSocket::new_v4().expect("socket");
        socket.set_recv_buffer_size(4096).expect("small receive buffer");
        socket.bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
        let listener = socket.listen(16).expect("listen");
        let addr = listener.local_addr().expect("addr");
        let (heads, closed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (drain, draining) = watch::channel(false);
        let (h, c) = (heads.clone(), closed.clone());
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let (h, c, mut draining) = (h.clone(), c.clone(), draining.clone());
                tokio::spawn(async move {
                    if !read_head(&mut stream).await {
                        return;
                    }
                    h.fetch_add(1, Ordering::SeqCst);
                    if draining.wait_for(|d| *d).await.is_err() {
                        return;
                    }
                    // Reads whatever is left until the peer closes.
                    let mut buf = vec![0u8; 64 * 1024];
                    while let Ok(n) = stream.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                    }
                    c.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        DeafUpstream { addr, heads, closed, drain }
    }

    /// `http://127.0.0.1:port`, as an upstream base.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Request heads read so far.
    pub fn heads(&self) -> usize {
        self.heads.load(Ordering::SeqCst)
    }

    /// From now on every connection reads what it was sent, until its peer
    /// closes it (then it counts in [`DeafUpstream::closed`]).
    pub fn drain(&self) {
        let _ = self.drain.send(true);
    }

    /// Connections the peer (wxgate) closed, seen once draining.
    pub fn closed(&self) -> usize {
        self.closed.load(Ordering::SeqCst)
    }
}

/// Reads up to the end of one request head; false if the connection ended first.
async fn read_head(conn: &mut TcpStream) -> bool {
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    // Byte by byte: nothing past the head is taken off the socket.
    while !got.ends_with(b"\r\n\r\n") {
        match conn.read(&mut byte).await {
            Ok(0) | Err(_) => return false,
            Ok(_) => got.push(byte[0]),
        }
    }
    true
}

/// A chunked body (`Transfer-Encoding: chunked` framing) of these chunks,
/// with its last chunk.
pub fn chunked_body(chunks: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for c in chunks {
        out.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
        out.extend_from_slice(c);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

/// Requests whose body stops mid-way, by their framing: `head(framing)` is
/// the request head with that framing header. `Content-Length: 1000` then
/// 100 bytes; chunked with one whole chunk, then the start of the next.
/// Sent with [`super::exchange`] (the connection kept open), each waits
/// for `body_timeout`.
pub fn stalled_bodies(head: impl Fn(&str) -> String) -> [(&'static str, Vec<u8>); 2] {
    let mut content_length = head("Content-Length: 1000").into_bytes();
    content_length.extend_from_slice(&[b'a'; 100]);
    let mut chunked = head("Transfer-Encoding: chunked").into_bytes();
    chunked.extend_from_slice(b"64\r\n");
    chunked.extend_from_slice(&[b'b'; 100]);
    chunked.extend_from_slice(b"\r\n3e8\r\nbbbb");
    [("Content-Length", content_length), ("chunked", chunked)]
}

/// Sends `head`, then `body` in `pieces` writes with `pause` between them
/// (a slow upload), while reading everything the server sends until it
/// closes the connection. The pacing is bounded: `pieces` × `pause`.
pub async fn send_paced(addr: SocketAddr, head: &str, body: &[u8], pieces: usize, pause: Duration) -> Exchange {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut rd, mut wr) = stream.into_split();
    let head = head.as_bytes().to_vec();
    let body = body.to_vec();
    let writer = tokio::spawn(async move {
        let _ = wr.write_all(&head).await;
        let size = body.len().div_ceil(pieces.max(1)).max(1);
        for (i, piece) in body.chunks(size).enumerate() {
            if i > 0 {
                tokio::time::sleep(pause).await;
            }
            if wr.write_all(piece).await.is_err() {
                break;
            }
        }
        wr
    });
    let ex = read_until_closed(&mut rd).await;
    drop(writer.await);
    ex
}

/// Writes `bytes` and closes the connection at once, without reading: a
/// client that gave up mid-request.
pub async fn send_and_abort(addr: SocketAddr, bytes: &[u8]) {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let _ = stream.write_all(bytes).await;
    drop(stream);
}
