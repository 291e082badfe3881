//! Operating a running instance: the admin API ([`admin`]) and its view of
//! a pair ([`pair_view`]), config reloads ([`reload`]), and the background
//! quota syncs ([`quota_sync`]). Above the app and the features, whose state
//! they read and swap.

pub mod admin;
pub mod pair_view;
pub mod quota_sync;
pub mod reload;
pub mod renewal;
