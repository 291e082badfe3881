//! Upstream ports on loopback that fail the way a real WeChat can before a
//! request is written: [`ClosedPort`] refuses connections (and can be opened
//! later, on the same port, as a [`MockWeChat`]); [`StalledPort`] never
//! completes a connection (its accept queue is full), like a host that drops
//! SYNs; [`SilentPort`] completes connections and never answers a byte (a
//! TLS handshake to it never ends).

use std::time::Duration;

use tokio::net::{TcpListener, TcpSocket, TcpStream};

use super::MockWeChat;

/// A loopback port that is bound but not listening: connections to it are
/// refused, and no other test can take it while this lives.
pub struct ClosedPort {
    socket: TcpSocket,
    pub port: u16,
}

impl ClosedPort {
    pub fn new() -> ClosedPort {
        let socket = TcpSocket::new_v4().expect("socket");
        socket.bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
        let port = socket.local_addr().expect("local addr").port();
        ClosedPort { socket, port }
    }

    /// `http://127.0.0.1:port`, as an upstream base.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Starts listening: from now on a [`MockWeChat`] answers on this port.
    pub fn open(self) -> MockWeChat {
        MockWeChat::start_on(self.socket.listen(64).expect("listen"))
    }
}

/// A loopback port whose listener never accepts and whose accept queue is
/// full: the kernel drops further SYNs, so a connection attempt hangs until
/// the client gives up (a connect timeout), without leaving loopback.
pub struct StalledPort {
    _listener: TcpListener,
    _queued: Vec<TcpStream>,
    pub port: u16,
}

impl StalledPort {
    pub async fn new() -> StalledPort {
        let socket = TcpSocket::new_v4().expect("socket");
        socket.bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
        let listener = socket.listen(0).expect("listen");
        let port = listener.local_addr().expect("local addr").port();
        // Fill the accept queue (one connection with backlog 0 on Linux)
        // until an attempt no longer completes.
        let mut queued = Vec::new();
        for _ in 0..8 {
            let attempt = TcpStream::connect(("127.0.0.1", port));
            match tokio::time::timeout(Duration::from_millis(500), attempt).await {
                Ok(Ok(stream)) => queued.push(stream),
                Ok(Err(e)) => panic!("connecting to the stalled port: {e}"),
                Err(_) => return StalledPort { _listener: listener, _queued: queued, port },
            }
        }
        panic!("the accept queue of port {port} never filled up");
    }

    /// `http://127.0.0.1:port`, as an upstream base.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

/// A loopback port whose listener never accepts: the kernel completes TCP
/// connections (up to its backlog), and nothing ever reads or answers them.
pub struct SilentPort {
    _listener: std::net::TcpListener,
    pub port: u16,
}

impl SilentPort {
    pub fn new() -> SilentPort {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("local addr").port();
        SilentPort { _listener: listener, port }
    }
}
