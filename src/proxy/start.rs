//! Why wxgate cannot start: [`StartError`], what [`crate::start`] returns:
//! each part's own error (this layer, above the features, names them all).

use std::net::SocketAddr;

use crate::error::ComponentError;
use crate::store::state_file::OpenError;
use crate::store::StoreError;
use crate::transport::intercept::InterceptError;
use crate::transport::upstream::ClientError;

/// Why [`crate::start`] failed, by what failed: each part's own error, so
/// `?` says which. Its text is what `wxgate` prints before it exits.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The upstream client cannot be built (`[server] upstream_ca`).
    #[error(transparent)]
    Upstream(#[from] ClientError),
    /// A feature's state cannot be built: the token cache (`[tokens]`: its
    /// key), or an `[[account]]` without the token cache it needs.
    #[error(transparent)]
    Features(#[from] crate::features::FeaturesError),
    /// `[intercept]`'s CA cannot serve its hosts.
    #[error(transparent)]
    Intercept(#[from] InterceptError),
    /// The memory store cannot open its state file (another process holds
    /// it, or the journal beside it is not wxgate's alone).
    #[error(transparent)]
    StateFile(#[from] OpenError),
    /// A component cannot start (queued delivery: its jobs file cannot be
    /// opened, or Redis refuses wxgate).
    #[error(transparent)]
    Component(#[from] ComponentError),
    /// Redis refused wxgate for a reason a retry will not fix (a wrong
    /// password, a bad URL).
    #[error(transparent)]
    Redis(#[from] StoreError),
    /// `[server] listen` cannot be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
    /// `[server] admin_listen` cannot be bound.
    #[error("cannot listen on {addr} (admin): {source}")]
    Admin { addr: SocketAddr, source: std::io::Error },
    /// The serving threads cannot start. Not `#[from]`: an I/O error may be
    /// a listener's, which says its address ([`StartError::Listen`]).
    #[error(transparent)]
    Serve(std::io::Error),
}
