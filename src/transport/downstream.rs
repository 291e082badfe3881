//! The downstream connection: a client's connection, shared between hyper (which reads and writes it
//! through [`crate::transport::smuggling::SmuggleGuard`]) and the calls it carries,
//! which may watch it for the client closing its sending side
//! ([`Client::closed`]).
//!
//! Connections are served half-close aware: a client that sends a complete
//! request and then closes its sending side (`shutdown(SHUT_WR)`) still gets
//! its answer. On TCP such a half-close cannot be told from a client that
//! went away; where it matters (a call that would be held), [`Client::closed`]
//! lets the call find out.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;

/// One client connection; clones share it.
#[derive(Clone)]
pub struct Client(Arc<TcpStream>);

impl Client {
    pub fn new(stream: TcpStream) -> Client {
        Client(Arc::new(stream))
    }

    /// Resolves once the client has closed its sending side (a FIN: a
    /// half-close or a disconnect) or reset the connection, with nothing
    /// unread before it. Never resolves while bytes not yet read are
    /// waiting (a pipelined request): what comes after them cannot be seen.
    pub async fn closed(&self) {
        let mut byte = [0u8; 1];
        match self.0.peek(&mut byte).await {
            Ok(0) | Err(_) => {}
            Ok(_) => std::future::pending().await,
        }
    }
}

impl AsyncRead for Client {
    /// As tokio's own `TcpStream` reads: a read that fills less than the
    /// buffer has drained the socket (epoll and kqueue report readiness by
    /// edges), so its readiness is cleared at once, and the next read waits
    /// for the next event instead of costing a system call that answers
    /// `EAGAIN` (one per call otherwise: hyper reads again after each
    /// request). `try_io` clears only the readiness seen before the read:
    /// bytes that arrived meanwhile raise a newer event, which stays.
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let stream = &*self.0;
        loop {
            ready!(stream.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            let len = unfilled.len();
            let mut drained = 0;
            let read = stream.try_io(Interest::READABLE, || match stream.try_read(unfilled) {
                Ok(n) if n > 0 && n < len => {
                    drained = n;
                    Err(io::ErrorKind::WouldBlock.into())
                }
                other => other,
            });
            let n = match read {
                Ok(n) => n,
                Err(_) if drained > 0 => drained,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            };
            buf.advance(n);
            return Poll::Ready(Ok(()));
        }
    }
}

impl AsyncWrite for Client {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.0.poll_write_ready(cx))?;
            match self.0.try_write(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                done => return Poll::Ready(done),
            }
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.0.poll_write_ready(cx))?;
            match self.0.try_write_vectored(bufs) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                done => return Poll::Ready(done),
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(socket2::SockRef::from(&*self.0).shutdown(std::net::Shutdown::Write))
    }
}
