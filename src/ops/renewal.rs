//! The task that renews the tokens of `[[account]]`s ahead of expiry
//! ([`crate::features::broker::renew`]), so that a call almost never waits
//! for a fetch.

use std::sync::Weak;
use std::time::Duration;

use crate::features::broker::{renew, RenewState};
use crate::proxy::app::App;

/// How often the task looks (each account is asked about only when due).
pub const TICK: Duration = Duration::from_millis(500);

/// Starts the task; it ends when the app is dropped.
pub fn spawn(app: Weak<App>) {
    tokio::spawn(async move {
        let mut state = RenewState::default();
        loop {
            tokio::time::sleep(TICK).await;
            let Some(app) = app.upgrade() else { return };
            let config = app.config.load_full();
            if !config.accounts.is_empty() {
                renew(&app.features.broker, app.env(), &config, &mut state).await;
            }
        }
    });
}
