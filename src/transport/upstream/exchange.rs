//! One try of a call at one upstream: a pooled connection or a new one,
//! then the exchange, on one timer moved from deadline to deadline
//! (connecting, sending the body, waiting for the answer's head).

use std::pin::Pin;
use std::time::Duration;

use http::{Request, Response, Uri};
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use tokio::task::AbortHandle;
use tokio::time::Sleep;

use super::error::{error_chain, exchange_error, UpstreamError};
use super::failover::Target;
use super::pool::Conn;
use crate::time::{deadline_after, Micros, Stopwatch};
use crate::transport::request_body::{Progress, RequestBody};

/// Aborts a connection's task when dropped, unless disarmed: a given-up
/// exchange (a timeout, an error, the call dropped) closes its connection
/// rather than leave the request, or part of its body, on it.
struct Abandon<'a>(Option<&'a AbortHandle>);

impl Drop for Abandon<'_> {
    fn drop(&mut self) {
        if let Some(task) = self.0 {
            task.abort();
        }
    }
}

/// Checks of the body's progress per `body_timeout` (at least one per
/// `upstream_timeout`): a stall is seen between `body_timeout` and
/// `body_timeout × (1 + 1/STALL_CHECKS)` after the last byte moved.
const STALL_CHECKS: u32 = 4;

/// How a try at one upstream failed.
pub(super) enum Failure {
    /// Not a byte reached it: the request is back, for the next upstream.
    Unsent(Box<Request<RequestBody>>, UpstreamError),
    /// The request (or part of it) may have reached it.
    Sent(UpstreamError),
}

/// How calls reach an upstream: the connector and the timeouts.
pub(super) struct Link {
    pub(super) connector: HttpsConnector<HttpConnector>,
    /// `upstream_timeout`: connecting, and waiting for the answer's head
    /// after the whole request was handed to the connection.
    pub(super) timeout: Duration,
    /// `body_timeout`: most time without progress while sending a body.
    pub(super) body_timeout: Duration,
}

impl Link {
    /// One try at `target`: its pooled connection or a new one, then the
    /// exchange. A request that provably never reached it comes back.
    pub(super) async fn send_to(
        &self,
        target: &Target,
        mut req: Request<RequestBody>,
        progress: Option<&Progress>,
    ) -> Result<Response<Incoming>, Failure> {
        let pool = crate::transport::worker::pick(&target.per_worker, &target.pool);
        let connect_by = deadline_after(self.timeout);
        let timer = tokio::time::sleep_until(connect_by);
        tokio::pin!(timer);
        let mut pooled = pool.take();
        let mut connected = None;
        loop {
            let reused = pooled.is_some();
            let mut conn = match pooled.take() {
                Some(conn) => conn,
                // Boxed: connecting (TCP, TLS, handshake) is the largest
                // state of a call and rare with a warm pool; inline, every
                // call's future would carry (and move) its ~1.6 KiB.
                None => tokio::select! {
                    biased;
                    conn = Box::pin(self.connect(&target.base, &mut connected)) => match conn {
                        Ok(conn) => conn,
                        Err(e) => return Err(Failure::Unsent(Box::new(req), e)),
                    },
                    () = &mut timer => {
                        return Err(Failure::Unsent(Box::new(req), UpstreamError::ConnectTimeout(self.timeout)))
                    }
                },
            };
            match self.exchange(&mut conn, req, progress, timer.as_mut(), !reused).await.map_err(Failure::Sent)? {
                Ok(mut resp) => {
                    pool.put(conn);
                    // Only a call that made a connection says so (a pooled
                    // one, most calls, pays nothing): its trace shows it.
                    if let Some(us) = connected {
                        resp.extensions_mut().insert(Connected { us });
                    }
                    return Ok(resp);
                }
                Err(mut e) => match e.take_message() {
                    // Handed back unsent by a pooled connection that had
                    // closed: never on the wire, so it goes on a new one,
                    // within what is left of the time to connect. (hyper
                    // hands a request back only if its connection never
                    // started writing it.)
                    Some(unsent) if reused => {
                        req = unsent;
                        timer.as_mut().reset(connect_by);
                    }
                    // A new connection that closed before writing it.
                    Some(unsent) => {
                        return Err(Failure::Unsent(
                            Box::new(unsent),
                            UpstreamError::Connect(format!(
                                "the connection closed before the request was written: {}",
                                error_chain(&e.into_error())
                            )),
                        ))
                    }
                    None => return Err(Failure::Sent(exchange_error(&e.into_error()))),
                },
            }
        }
    }

    /// Hands `req` to `conn` and waits for the answer's head, on `timer`:
    /// while the body is being sent, a stall of `body_timeout`; then
    /// `upstream_timeout` from the moment it was handed over whole. The
    /// outer error is a timeout; the inner one is hyper's. Unless the answer
    /// came, the connection is closed on return.
    ///
    /// The body's progress is looked at when the timer fires, every `check`
    /// (at most `upstream_timeout`, so the hand-over is seen before its
    /// deadline): nothing wakes this call while a body streams, and a small
    /// body, handed over at once, costs no wake-up at all.
    async fn exchange(
        &self,
        conn: &mut Conn,
        req: Request<RequestBody>,
        progress: Option<&Progress>,
        mut timer: Pin<&mut Sleep>,
        fresh: bool,
    ) -> Result<Result<Response<Incoming>, hyper::client::conn::TrySendError<Request<RequestBody>>>, UpstreamError>
    {
        let mut abandon = Abandon(Some(&conn.task));
        let answer = conn.sender.try_send_request(req);
        tokio::pin!(answer);
        let check = (self.body_timeout / STALL_CHECKS).min(self.timeout).max(Duration::from_millis(1));
        let stalled_after = self.body_timeout.as_nanos().div_ceil(check.as_nanos());
        // The body being sent: its progress, bytes seen at the last check,
        // checks since they last moved.
        let mut sending = progress.map(|p| (p, 0, 0));
        if sending.is_some() {
            timer.as_mut().reset(deadline_after(check));
        } else if fresh {
            timer.as_mut().reset(deadline_after(self.timeout));
        }
        // Else a whole request went to a pooled connection as the call
        // started: the timer's `upstream_timeout` from then already counts
        // from the hand-over (no second timer set, no clock read).
        loop {
            tokio::select! {
                biased;
                result = &mut answer => {
                    if result.is_ok() {
                        abandon.0 = None;
                    }
                    return Ok(result);
                }
                () = &mut timer => {
                    let Some((p, seen, quiet)) = &mut sending else {
                        return Err(UpstreamError::Timeout(self.timeout));
                    };
                    if let Some(at) = p.handed_at() {
                        sending = None;
                        timer.as_mut().reset(at + self.timeout);
                        continue;
                    }
                    let moved = p.moved();
                    if moved != *seen {
                        (*seen, *quiet) = (moved, 0);
                    } else {
                        *quiet += 1;
                        if *quiet >= stalled_after {
                            return Err(if p.waiting_on_client() {
                                UpstreamError::ClientStalled(self.body_timeout)
                            } else {
                                UpstreamError::BodyStalled(self.body_timeout)
                            });
                        }
                    }
                    timer.as_mut().reset(deadline_after(check));
                }
            }
        }
    }

    /// Opens a connection (TCP, then TLS for https) and starts its task on
    /// this thread's runtime.
    /// A new connection to `base` (TCP, TLS for https, the HTTP/1
    /// handshake); `connected`: how long that took, in µs.
    async fn connect(&self, base: &Uri, connected: &mut Option<Micros>) -> Result<Conn, UpstreamError> {
        use tower_service::Service;
        let started = Stopwatch::start();
        let mut connector = self.connector.clone();
        let connect_error =
            |e: Box<dyn std::error::Error + Send + Sync>| UpstreamError::Connect(error_chain(e.as_ref()));
        std::future::poll_fn(|cx| connector.poll_ready(cx)).await.map_err(connect_error)?;
        let io = connector.call(base.clone()).await.map_err(connect_error)?;
        // writev off, as on the server side (`crate::server`): a call's
        // head and its small body go in one buffer and one write(2).
        let (sender, conn) = hyper::client::conn::http1::Builder::new()
            .writev(false)
            .handshake(io)
            .await
            .map_err(|e| UpstreamError::Connect(error_chain(&e)))?;
        let task = tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(target: "wxgate::transport::upstream", error = %e, "upstream connection ended with an error");
            }
        });
        *connected = Some(started.elapsed_us());
        Ok(Conn { sender, task: task.abort_handle() })
    }
}

/// In the extensions of an answer whose call made a new connection: how
/// long connecting took (TCP, TLS, the HTTP/1 handshake), in µs. An answer
/// without it came over a pooled connection.
#[derive(Debug, Clone, Copy)]
pub struct Connected {
    pub us: Micros,
}
