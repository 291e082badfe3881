//! wxgate's own connection pool, one per upstream and serving thread: a
//! stack of hyper HTTP/1 senders, newest first, so few connections stay warm.

use std::sync::Mutex;
use std::time::Duration;

use hyper::client::conn::http1::SendRequest;
use tokio::task::AbortHandle;

use crate::time::Stopwatch;
use crate::transport::request_body::RequestBody;

/// One connection to the upstream: hyper's sender, and the task driving the
/// connection (aborted when an exchange on it is given up).
pub(super) struct Conn {
    pub(super) sender: SendRequest<RequestBody>,
    pub(super) task: AbortHandle,
}

/// An idle connection is closed after this long unused.
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Most idle connections kept per pool.
const MAX_IDLE: usize = 256;

/// Connections to the upstream: senders of hyper HTTP/1 connections, each
/// driven by a task on the thread that opened it.
#[derive(Default)]
pub(super) struct Pool {
    /// Idle connections, each with how long it has been idle.
    idle: Mutex<Vec<(Conn, Stopwatch)>>,
}

impl Pool {
    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<(Conn, Stopwatch)>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The newest connection ready for a request; drops closed and expired ones.
    pub(super) fn take(&self) -> Option<Conn> {
        let mut idle = self.idle();
        let now = Stopwatch::start();
        let mut i = idle.len();
        while i > 0 {
            i -= 1;
            let (conn, since) = &idle[i];
            if conn.sender.is_closed() || since.until(now) > IDLE_TIMEOUT {
                idle.swap_remove(i);
            } else if conn.sender.is_ready() {
                return Some(idle.swap_remove(i).0);
            }
        }
        None
    }

    /// Keeps a connection for later calls. It may still be reading the answer
    /// it was just used for; [`Pool::take`] only hands out ready ones.
    pub(super) fn put(&self, conn: Conn) {
        let mut idle = self.idle();
        if idle.len() < MAX_IDLE && !conn.sender.is_closed() {
            idle.push((conn, Stopwatch::start()));
        }
    }
}
