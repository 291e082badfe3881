//! What the features' hooks see of the shared state: the [`Core`] (store,
//! clock, metrics, ...) and the state the features own (the token → account
//! caches, the access-token cache). Below the [`crate::app::App`], which
//! holds it and derefs to it, so a feature never imports `App`.

use std::ops::Deref;
use std::sync::Arc;

use crate::admit::core::Core;
use crate::features::accounts::cache::TokenCaches;
use crate::features::token_cache::cache::TokenCache;
use crate::transport::upstream::Upstream;

/// The shared state a feature's hooks are given.
pub struct Base {
    pub core: Core,
    /// Access tokens this instance knows the account of, or knows unknown.
    pub token_owners: TokenCaches,
    /// The access-token cache (`[tokens]`); `None` when off.
    pub token_cache: Option<Arc<TokenCache>>,
    /// The accounts with calls today (`[server] max_accounts`).
    pub accounts_in_use: crate::features::accounts::in_use::InUse,
    /// Where calls go (`[server] upstream`; swapped by a reload): also the
    /// token fetches wxgate makes itself (`crate::features::broker`).
    pub upstream: arc_swap::ArcSwap<Upstream>,
}

impl Deref for Base {
    type Target = Core;

    fn deref(&self) -> &Core {
        &self.core
    }
}
