//! The floor under wxgate's per-call cost: a bare reverse proxy built from
//! the same parts as wxgate's serving path and nothing else, for
//! `bench/floor.sh` (see docs/performance.md, "The floor inside hyper").
//!
//! One single-threaded Tokio runtime (wxgate with `workers = 1`), hyper's
//! HTTP/1 server with wxgate's connection options (timer, header read
//! timeout, half-close, buffer limits), and hyper's HTTP/1 client
//! connections in a per-thread pool of idle senders, each connection driven
//! by its own task, as in `src/transport/upstream.rs`. Every request goes to the
//! upstream as it came (its URI made origin-form) and the answer comes back
//! streamed. No rules, store, metrics, guard or header handling: what is
//! left is what hyper, `http` and Tokio cost per call.
//!
//! ```text
//! cargo build --release --example hyper_floor
//! target/release/examples/hyper_floor 127.0.0.1:8081 127.0.0.1:9000
//! ```

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};

type Pool = Rc<RefCell<Vec<SendRequest<Incoming>>>>;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: hyper_floor LISTEN_ADDR UPSTREAM_ADDR";
    let listen: SocketAddr = args.next().ok_or(usage)?.parse()?;
    let upstream: SocketAddr = args.next().ok_or(usage)?.parse()?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, serve(listen, upstream))
}

async fn serve(listen: SocketAddr, upstream: SocketAddr) -> Result<(), Box<dyn std::error::Error>> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let pool: Pool = Rc::default();
    loop {
        let (stream, _) = listener.accept().await?;
        stream.set_nodelay(true)?;
        let pool = pool.clone();
        let service = service_fn(move |req| forward(pool.clone(), upstream, req));
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(Duration::from_secs(10))
            .half_close(true)
            .max_buf_size(128 * 1024)
            .max_header_size(64 * 1024);
        let conn = builder.serve_connection(TokioIo::new(stream), service);
        tokio::task::spawn_local(async move {
            let _ = conn.await;
        });
    }
}

async fn forward(pool: Pool, upstream: SocketAddr, mut req: Request<Incoming>) -> Result<Response<Incoming>, String> {
    if let Some(pq) = req.uri().path_and_query().cloned() {
        *req.uri_mut() = pq.into();
    }
    let pooled = {
        let mut idle = pool.borrow_mut();
        let mut found = None;
        while let Some(s) = idle.pop() {
            if s.is_ready() {
                found = Some(s);
                break;
            }
        }
        found
    };
    let mut sender = match pooled {
        Some(s) => s,
        None => {
            let io = tokio::net::TcpStream::connect(upstream).await.map_err(|e| e.to_string())?;
            io.set_nodelay(true).map_err(|e| e.to_string())?;
            let (sender, conn) =
                hyper::client::conn::http1::handshake(TokioIo::new(io)).await.map_err(|e| e.to_string())?;
            tokio::task::spawn_local(async move {
                let _ = conn.await;
            });
            sender
        }
    };
    let answer = sender.send_request(req).await.map_err(|e| e.to_string())?;
    pool.borrow_mut().push(sender);
    Ok(answer)
}
