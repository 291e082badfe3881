//! What a call the broker added a token to carries on (kept apart so the
//! hooks can name it without importing the broker).

use std::sync::Arc;

use http::uri::PathAndQuery;

use crate::config::accounts::SecretAccount;

/// A call wxgate added its account's token to.
pub struct Injected {
    pub account: Arc<SecretAccount>,
    /// The token added (in memory only; hashed to drop it).
    pub token: String,
    /// The target as the caller sent it, to add a new token to.
    pub original: PathAndQuery,
}
