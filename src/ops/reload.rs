//! Hot reload: the config file is watched (inotify, through `notify`) and
//! SIGHUP also triggers a reload.
//!
//! A new config is fully loaded and validated before anything changes; it is
//! then swapped in atomically, so each call runs under exactly one config:
//! the one it started with. An invalid file is refused with its error logged,
//! and the old rules stay. `[store]`, `[intercept]`, `[telemetry]`, `workers`, the
//! admin listener and where queued jobs live (once a jobs store is open)
//! need a restart: a reload that changes them keeps the running ones and
//! says so. A reload that first needs a jobs store (its first `queue =
//! true` rule) opens it. A reload that changes `listen` is refused
//! whole: the file's callers and accounts are checked against the address
//! it names, which the running listener is not.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;

use crate::admit::callers::Callers;
use crate::config::{Config, ConfigError};
use crate::proxy::app::{App, Watched};
use crate::transport::upstream::DomainUpstreams;

/// Events closer together than this are one edit (editors write in steps).
const SETTLE: Duration = Duration::from_millis(100);

/// Why a reload was refused (the running config stays).
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The file does not load.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The file turns caller authentication off.
    #[error(
        "[server] caller_auth: a reload cannot turn caller authentication off (that would let any caller spend any \
         account); restart wxgate to do so"
    )]
    CallerAuthOff,
    /// The file names another `listen` than the running listener's.
    #[error(
        "[server] listen: wxgate listens on {running} and a reload cannot move it (the file says {file}); the file's \
         callers and accounts are checked against the address it names, so the whole reload is refused: restart \
         wxgate to listen elsewhere, or put listen back"
    )]
    ListenMoved { running: std::net::SocketAddr, file: std::net::SocketAddr },
    /// The new upstream client cannot be built.
    #[error(transparent)]
    Upstream(#[from] crate::transport::upstream::ClientError),
    /// An `[[account]]` needs a token cache the running wxgate has not got.
    #[error(transparent)]
    Accounts(#[from] crate::features::broker::AccountsError),
    /// A component cannot take the new config (queued delivery's jobs
    /// store, needed now, cannot be opened).
    #[error(transparent)]
    Component(#[from] crate::error::ComponentError),
}

/// Loads `path` and swaps it in, or keeps the running config.
pub async fn reload(app: &App, path: &Path) -> Result<(), ReloadError> {
    let result = load(app, path).await;
    match &result {
        Ok(()) => {
            app.reloads.ok.fetch_add(1, Ordering::Relaxed);
            app.core.metrics.reload(true);
            tracing::info!(config = %path.display(), "config reloaded");
            *app.reloads.last.lock().unwrap_or_else(|e| e.into_inner()) = Some((app.core.clock.now_us(), None));
        }
        Err(e) => {
            app.reloads.failed.fetch_add(1, Ordering::Relaxed);
            app.core.metrics.reload(false);
            tracing::error!(config = %path.display(), error = %e, "config reload refused; keeping the running rules");
            let last = (app.core.clock.now_us(), Some(e.to_string()));
            *app.reloads.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(last);
        }
    }
    result
}

async fn load(app: &App, path: &Path) -> Result<(), ReloadError> {
    let mut next = Config::load(path)?;
    let running = app.config.load_full();
    // A reload never widens who may call: turning caller authentication
    // off is refused (the running callers and their keys stay).
    if running.server.caller_auth.required() && !next.server.caller_auth.required() {
        return Err(ReloadError::CallerAuthOff);
    }
    // The admin listener and the token guarding it change together, at a
    // restart: a reload that drops the token while the listener stays up
    // (or moves the listener off loopback) would open the admin API.
    if next.server.admin_listen != running.server.admin_listen || next.server.admin_token != running.server.admin_token
    {
        tracing::warn!("[server] admin_listen and admin_token changes need a restart; keeping the running admin listener and its token");
        next.server.admin_listen = running.server.admin_listen;
        next.server.admin_token = running.server.admin_token.clone();
    }
    // The file was checked against the address it names (caller_auth
    // beyond loopback, `[[account]]` tokens added only on loopback), but
    // the running listener stays bound where it is: a file that says
    // loopback while wxgate listens beyond it would pass those checks and
    // widen access. Refused whole, so what runs is what the file says.
    if next.server.listen != running.server.listen {
        return Err(ReloadError::ListenMoved { running: running.server.listen, file: next.server.listen });
    }
    if next.server.workers != running.server.workers {
        tracing::warn!(
            running = running.server.workers,
            "[server] workers changes need a restart; keeping the running threads"
        );
        next.server.workers = running.server.workers;
    }
    if next.store != running.store {
        tracing::warn!("[store] changes need a restart; keeping the running store");
        next.store = running.store.clone();
    }
    if next.intercept != running.intercept {
        tracing::warn!("[intercept] changes need a restart; keeping the running hosts, CA and upstreams");
        next.intercept = running.intercept.clone();
    }
    if next.telemetry != running.telemetry {
        tracing::warn!("[telemetry] changes need a restart; keeping the running trace exporter");
        next.telemetry = running.telemetry.clone();
    }
    let s = (&next.server, &running.server);
    let domains_moved = next.domains.len() != running.domains.len()
        || next.domains.iter().zip(&running.domains).any(|(a, b)| a.host != b.host || a.upstream != b.upstream);
    if domains_moved
        || s.0.upstream_ca != s.1.upstream_ca
        || s.0.upstream_timeout != s.1.upstream_timeout
        || s.0.body_timeout != s.1.body_timeout
    {
        let previous = app.core.upstreams.load();
        let upstreams =
            DomainUpstreams::new(&next, &app.core.clock, &app.core.metrics.upstreams, Some((&running, &previous)))?;
        app.core.upstreams.store(Arc::new(upstreams));
    }
    crate::features::broker::check(
        &next,
        app.features.token_cache.cache.as_deref(),
        matches!(next.store, crate::config::StoreConfig::Redis(_)),
    )?;
    // The components keep what they must until a restart (queued
    // delivery: where its jobs live) and open what `next` needs first.
    app.features.reload(&mut next).await?;
    let callers = Callers::new(&next, &app.core.clock, &app.core.metrics, Some(&app.callers.load()));
    app.callers.store(Arc::new(callers));
    app.core.metrics.rules(next.rules.iter().map(|r| &*r.name));
    app.config.store(Arc::new(next));
    app.core.store.rules_changed();
    Ok(())
}

/// Watches `path` (and the rules files it names, `rules` and its
/// `[[domain]]`s', as it started)
/// and listens for SIGHUP, reloading on either, until the app is dropped.
/// Failing to watch is logged; SIGHUP still works.
pub fn spawn(app: Weak<App>, path: PathBuf) {
    let (tx, mut rx) = mpsc::channel::<()>(16);
    let Some((watched, domain_files)) = app.upgrade().map(|a| {
        let files: Vec<PathBuf> = a.config.load().domains.iter().filter_map(|d| d.rules_file.clone()).collect();
        (a.reloads.watched.clone(), files)
    }) else {
        return;
    };
    let files: Vec<PathBuf> = std::iter::once(path.clone()).chain(domain_files).collect();
    let watcher = watch(&files, tx.clone(), watched);
    if let Err(e) = &watcher {
        tracing::warn!(config = %path.display(), error = %e, "cannot watch the config file; reload with SIGHUP");
    }
    spawn_sighup(tx);
    tokio::spawn(async move {
        // Keeping the watcher alive keeps the events coming.
        let _watcher = watcher;
        while rx.recv().await.is_some() {
            tokio::time::sleep(SETTLE).await;
            while rx.try_recv().is_ok() {}
            let Some(app) = app.upgrade() else { return };
            let _ = reload(&app, &path).await;
        }
    });
}

/// Watches the files' directories (editors and config-map updates replace a
/// file rather than write into it) and signals on events naming one of the
/// files (by name: another file of that name in a watched directory only
/// costs a reload that changes nothing).
fn watch(files: &[PathBuf], tx: mpsc::Sender<()>, watched: Arc<Watched>) -> notify::Result<notify::RecommendedWatcher> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    for file in files {
        let dir = match file.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        if !dirs.contains(&dir) {
            dirs.push(dir);
        }
    }
    let names: Vec<std::ffi::OsString> = files.iter().filter_map(|f| f.file_name().map(|n| n.to_os_string())).collect();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let Ok(event) = event else { return };
        if event.kind.is_access() {
            return;
        }
        // Counted before `events` (Release): whoever sees an event counted
        // also sees whether it, or any before it, named the config file.
        let names_config = event.paths.iter().any(|p| p.file_name().is_some_and(|n| names.iter().any(|x| x == n)));
        if names_config {
            // Only the config file's events are logged (never the
            // directory's others: a log file there would log itself).
            tracing::debug!(kind = ?event.kind, "config file event");
            watched.of_config.fetch_add(1, Ordering::Release);
        }
        watched.events.fetch_add(1, Ordering::Release);
        if names_config {
            let _ = tx.try_send(());
        }
    })?;
    for dir in &dirs {
        watcher.watch(dir, RecursiveMode::NonRecursive)?;
    }
    Ok(watcher)
}

#[cfg(unix)]
fn spawn_sighup(tx: mpsc::Sender<()>) {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::hangup()) {
        Ok(mut hup) => {
            tokio::spawn(async move {
                while hup.recv().await.is_some() {
                    if tx.send(()).await.is_err() {
                        return;
                    }
                }
            });
        }
        Err(e) => tracing::warn!(error = %e, "cannot listen for SIGHUP"),
    }
}

#[cfg(not(unix))]
fn spawn_sighup(_tx: mpsc::Sender<()>) {}
