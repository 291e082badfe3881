//! Why wxgate cannot start: [`StartError`], what [`crate::start`] returns.

use std::net::SocketAddr;

use crate::store::StoreError;

/// Why [`crate::start`] failed, by what failed. Its text is what `wxgate`
/// prints before it exits.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The upstream client cannot be built (`[server] upstream_ca`).
    #[error("{0}")]
    Upstream(String),
    /// A feature's state cannot be built: the token cache (`[tokens]`: its
    /// key), or an `[[account]]` without the token cache it needs.
    #[error("{0}")]
    Features(String),
    /// `[intercept]`'s CA cannot serve its hosts.
    #[error("{0}")]
    Intercept(String),
    /// The memory store cannot open its state file (another process holds it).
    #[error("{0}")]
    StateFile(String),
    /// Queued delivery's jobs store cannot be opened (its file; a Redis
    /// that refuses wxgate).
    #[error("{0}")]
    Jobs(String),
    /// Redis refused wxgate for a reason a retry will not fix (a wrong
    /// password, a bad URL).
    #[error(transparent)]
    Redis(StoreError),
    /// `[server] listen` cannot be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
    /// `[server] admin_listen` cannot be bound.
    #[error("cannot listen on {addr} (admin): {source}")]
    Admin { addr: SocketAddr, source: std::io::Error },
    /// The serving threads cannot start.
    #[error(transparent)]
    Serve(std::io::Error),
}
