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
    /// A component cannot start (queued delivery: its jobs file cannot be
    /// opened, or Redis refuses wxgate).
    #[error(transparent)]
    Component(#[from] ComponentError),
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

/// A component's failure to start or to take a reload: which component,
/// and what failed (its own typed error).
#[derive(Debug, thiserror::Error)]
#[error("{source}")]
pub struct ComponentError {
    /// The component's name in the `features!` list (`crate::features`).
    pub component: &'static str,
    pub source: Box<dyn std::error::Error + Send + Sync>,
}
