//! Where queued delivery's jobs store is opened: at start and at a reload
//! ([`crate::features::component::Component`]'s `start` and `reload`).

use std::path::PathBuf;
use std::sync::Arc;

use super::slot::JobsSlot;
use crate::config::queue::JobsAt;
use crate::config::{Config, StoreConfig};
use crate::jobs::redis::RedisJobs;
use crate::jobs::sqlite::SqliteJobs;
use crate::store::StoreError;

/// Why the jobs store `config` asks for cannot be opened (start and reload
/// refuse it: a configuration error).
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// `[queue] file` cannot be opened (a directory that does not exist,
    /// a file of another program, one another process holds).
    #[error("[queue] file {}: {error}", path.display())]
    File { path: PathBuf, error: StoreError },
    /// Redis refused wxgate for a reason a retry will not fix.
    #[error("queued delivery's jobs store: {0}")]
    Redis(StoreError),
}

/// Opens queued delivery's jobs store where `config` puts it, if it needs
/// one and none is open yet: at start, and at each reload (the first that
/// adds a `queue = true` rule opens it then). Nothing when one is open or
/// being connected to (where jobs live changes only at a restart), when no
/// rule has `queue = true`, or when `[queue] file = "off"`.
///
/// Redis unreachable: the jobs wait for it (a call asking for queued
/// delivery gets 503) and a task tries again every `[store] breaker_open`
/// (as the decision store's probe) until Redis answers, then opens it and
/// the dispatcher starts. `Err`: a jobs file that cannot be opened, or a
/// Redis that refuses wxgate (a configuration error: start and reload
/// refuse it).
pub async fn open(slot: &Arc<JobsSlot>, config: &Config) -> Result<(), OpenError> {
    if slot.at().is_some() || !config.rules_http.iter().any(|h| h.queue.is_some()) {
        return Ok(());
    }
    match (&config.queue.at, &config.store) {
        (JobsAt::Off, _) => {}
        (JobsAt::File(path), StoreConfig::Memory(_)) => {
            let jobs = SqliteJobs::open(path).map_err(|e| OpenError::File { path: path.clone(), error: e })?;
            slot.set(Arc::new(jobs), config.queue.at.clone());
            say_on(config, &format!("file {}", path.display()));
        }
        (JobsAt::Redis, StoreConfig::Redis(r)) => match RedisJobs::connect(r).await {
            Ok(jobs) => {
                slot.set(Arc::new(jobs.with_replicas(config.queue.replicas)), JobsAt::Redis);
                say_on(config, "Redis");
            }
            Err(StoreError::Unreachable(e)) => {
                tracing::warn!(
                    error = %e,
                    "queued delivery waits for Redis (the jobs store): calls asking for it get 503 until Redis answers"
                );
                slot.connect_later(r.clone(), config.queue.replicas);
            }
            Err(e) => return Err(OpenError::Redis(e)),
        },
        // The file's jobs place and the running store disagree: a reload
        // whose `[store]` changed (kept until a restart, as the store is).
        (at, _) => {
            tracing::warn!(
                jobs = ?at,
                "[queue]: the file puts queued jobs where the running [store] is not; needs a restart: queued delivery stays off"
            );
        }
    }
    Ok(())
}

/// The jobs store is open: queued delivery is on if an `[[account]]` can
/// send (a queued message goes with the account's own token), else the log
/// says why no call can be queued yet.
fn say_on(config: &Config, jobs: &str) {
    let accounts: Vec<&str> = config.accounts.list.iter().filter(|a| a.injects()).map(|a| &*a.name).collect();
    if accounts.is_empty() {
        tracing::warn!(jobs = jobs, "queued delivery: its jobs store is open, but no call can be queued: no [[account]] (a queued message is sent with the account's own token); Prefer: respond-async gets 400");
    } else {
        tracing::info!(jobs = jobs, accounts = %accounts.join(","), "queued delivery on");
    }
}
