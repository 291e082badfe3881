//! Operating wxgate: the admin API ([`admin`]) and its view of a pair
//! ([`pair_view`]), config reloads ([`reload`]), the background quota syncs
//! ([`quota_sync`]) and token renewal ([`renewal`]); the trace exporter ([`trace_export`]); and the command-line
//! tools built on the library, off the call path ([`tools`]: the simulated
//! WeChat, the health probe). Above the app and the features, whose state
//! they read and swap.

pub mod admin;
pub mod answers;
pub mod console;
pub mod overview;
pub mod pair_view;
pub mod quota_sync;
pub mod reload;
pub mod renewal;
pub mod tools;
pub mod trace_export;
