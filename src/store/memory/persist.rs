//! The memory store beyond one process: opened from the config (lock, load),
//! kept by a background task (sweep every 10 s; write the state file every
//! `flush_interval` when something changed), and written a last time by
//! [`Store::close`](crate::store::Store::close).
//!
//! **What a crash loses.** Writes start every `flush_interval` (on a fixed
//! beat), but never sooner than 10 times the last write's duration after
//! it started (so that writing a large store takes at most about a tenth
//! of a core); each holds the state as it was when it started. What a
//! decision after a restart must know was also written to the journal
//! ([`super::journal`]) before it took effect: calendar admissions, counts
//! raised to WeChat's, penalties and their escalation, clears. A SIGKILL,
//! an OOM kill or a panic loses none of them (replayed at start); what it
//! loses is window state (TATs, which refill within their window), warm-up
//! timing, `max_share` use and per-recipient windows since the last write:
//! at most `max(flush_interval, 10 × write time)` plus one write time of
//! them. A power loss also loses the journal lines since the last write.
//! A clean stop (SIGTERM, SIGINT) loses nothing.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use super::{lock, Durable, MemoryStore, Writer};
use crate::config::MemoryConfig;
use crate::limit::RuleState;
use crate::store::state_file::{decode, encode_to, Learned, OpenError, Pair, PrivateError, Saved, StateFile};
use crate::telemetry::metrics::{FileOp, MemoryStoreMetrics};
use crate::time::{Clock, Micros, Stopwatch};

/// How often idle state is dropped without traffic.
const SWEEP_PERIOD: Duration = Duration::from_secs(10);
/// A failing save is logged at most this often (each one is counted).
const SAVE_ERROR_LOG_EVERY_US: Micros = 10_000_000;
/// A write starts no sooner than this many times the last one's duration
/// after the last one started.
const SAVE_SPACING: u32 = 10;

impl MemoryStore {
    /// The store `[store] kind = "memory"` describes: its state loaded from
    /// `state_file` (an unreadable file is moved aside and the store starts
    /// empty, saying so), kept by a background task that ends with the
    /// store. `offset_us` is the quota timezone's offset and `keep_warm_us`
    /// the longest warm-up of any rule (what is stale at load). `Err` only
    /// when another process holds the state file, or the journal beside it
    /// is not wxgate's alone. Call inside a Tokio runtime.
    pub fn open(
        clock: Arc<dyn Clock>,
        config: &MemoryConfig,
        offset_us: Micros,
        keep_warm_us: Micros,
        metrics: MemoryStoreMetrics,
    ) -> Result<Arc<MemoryStore>, OpenError> {
        let file = match &config.state_file {
            None => None,
            Some(path) => Some(StateFile::open(path.clone())?),
        };
        if let Some(why) = file.as_ref().and_then(|f| f.unwritable()) {
            tracing::error!(
                error = why,
                "the state file's directory is not writable: quotas and penalties will NOT survive a restart \
                 (set [store] state_file to a writable path)"
            );
        }
        let now = clock.now_us();
        let saved = file.as_ref().and_then(|f| load(f, now, offset_us, keep_warm_us, &metrics));
        let durable = match file {
            None => None,
            Some(file) => {
                let journal = match super::journal::Journal::open(file.path()) {
                    Ok(j) => Some(j),
                    // Someone else could have written it: not to be replayed, nor written through.
                    Err(PrivateError::NotPrivate(e)) => return Err(OpenError::Journal(e)),
                    Err(PrivateError::Io(e)) => {
                        tracing::error!(error = %e, "cannot open the journal beside the state file: a crash would lose the admissions, penalties and clears since the last write");
                        None
                    }
                };
                Some(Durable { file, writing: Mutex::new(Writer::default()), journal })
            }
        };
        let persists = durable.is_some();
        let token_key = saved.as_ref().and_then(|s| s.token_key.clone());
        let store =
            Arc::new_cyclic(|me| MemoryStore::build(clock, config, offset_us, metrics, durable, me.clone(), token_key));
        if let Some(saved) = saved {
            store.restore(saved, keep_warm_us);
        }
        store.replay_journal(now, offset_us);
        store.metrics.entries.set(store.entries.load(std::sync::atomic::Ordering::Relaxed) as i64);
        spawn_keeper(Arc::downgrade(&store), config.flush_interval, persists);
        Ok(store)
    }

    /// Replays the journal over the loaded state, in order (before any
    /// call): the changes since the last write, which a crash would have lost.
    fn replay_journal(&self, now: Micros, offset_us: Micros) {
        use super::journal::Change;
        let Some(journal) = self.journal() else { return };
        let records = journal.records();
        let mut replayed = 0;
        for r in &records {
            match r.change {
                // A count of a period already over counts for nothing.
                Change::Count { period, period_id, .. } if period.id(now, offset_us) != period_id => continue,
                Change::Count { period, period_id, used } => {
                    self.with_raw(&r.account, &r.state, true, |s| {
                        super::raise(s, crate::limit::WindowKey::Calendar(period), period_id, used)
                    });
                }
                Change::Penalty(p) => self.with_raw(&r.account, &r.state, true, |s| {
                    s.penalty = p;
                    // A lift by hand (until 0) made lowered windows whole.
                    if p.until == 0 {
                        s.learned_windows.clear();
                    }
                }),
                Change::Clear { at } => {
                    self.with_raw(&r.account, &r.state, false, |s| crate::limit::decide::clear(s, at, offset_us))
                }
                Change::Learned { limit, at } => self.with_raw(&r.account, &r.state, true, |s| {
                    crate::limit::learned::learn_day(s, limit, at);
                }),
                Change::Window(w) if w.until <= now => continue,
                Change::Window(w) => self.with_raw(&r.account, &r.state, true, |s| {
                    match s.learned_windows.iter_mut().find(|x| x.per_us == w.per_us) {
                        Some(slot) => *slot = w,
                        None => s.learned_windows.push(w),
                    }
                }),
            }
            replayed += 1;
        }
        if replayed > 0 {
            tracing::info!(
                changes = replayed,
                "replayed the journal over the state file (admissions, penalties, clears, learned limits; the last stop was not clean)"
            );
        }
    }

    /// Puts loaded state in place (before any call).
    fn restore(&self, saved: Saved, keep_warm_us: Micros) {
        use std::sync::atomic::Ordering;
        let n = saved.pairs.len();
        let mut members = 0;
        for p in saved.pairs {
            members += p.state.recipients.len();
            let mut shard = self.shards.lock((p.account.as_str(), &*p.rule));
            match shard.states.insert((p.account, p.rule), (p.state, p.warmup_us)) {
                None => {
                    self.entries.fetch_add(1, Ordering::Relaxed);
                }
                Some((replaced, _)) => members -= replaced.recipients.len(),
            }
        }
        // More than max_recipients may be loaded: new recipients are then
        // refused until members' windows are whole again.
        let held = self.recipients.fetch_add(members, Ordering::Relaxed) + members;
        self.metrics.recipients.set(held as i64);
        lock(&self.warm).extend(saved.token_refreshed);
        lock(&self.tokens).load(saved.tokens.into_iter().map(|t| (t.hash, t.account, t.until)));
        self.warm_keep_us.fetch_max(keep_warm_us, Ordering::Relaxed);
        if n > self.max_entries {
            tracing::warn!(
                loaded = n,
                max_entries = self.max_entries,
                "more states loaded than [store] max_entries: new pairs are refused until some go idle"
            );
        }
    }

    /// Writes the state file if anything changed since the last write (or
    /// the last one failed); `last`: the final write, whatever changed,
    /// after which nothing is written. Blocks: run it off the serving threads.
    pub(super) fn save(&self, last: bool) {
        let Some(durable) = &self.file else { return };
        let mut writer = lock(&durable.writing);
        if writer.closed {
            return;
        }
        writer.closed = last;
        let now = self.now();
        // The journal is synced, and turned over before the states are read:
        // every admission is then in the snapshot or in the new journal.
        let turned = match &durable.journal {
            Some(j) => match j.turn_over() {
                Ok(true) => true,
                // An older journal waits for its snapshot: this one is synced.
                Ok(false) => {
                    let _ = j.sync();
                    false
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot turn the admissions journal over; it grows until the next write");
                    false
                }
            },
            None => false,
        };
        let saved = self.snapshot(now, last || writer.failed || turned);
        let written = match saved {
            Some(saved) => self.write(durable, &mut writer, &saved, now, last),
            None => true,
        };
        if let (Some(j), true, true) = (&durable.journal, turned, written) {
            j.drop_old();
        }
        if last {
            // However the write went, the file is free for the next process.
            durable.file.unlock();
        }
    }

    /// Whether the write succeeded.
    fn write(&self, durable: &Durable, writer: &mut Writer, saved: &Saved, now: Micros, last: bool) -> bool {
        let pairs = saved.pairs.len();
        match durable.file.write(|out| encode_to(saved, out)) {
            Ok(()) => {
                writer.failed = false;
                self.metrics.saves.inc();
                self.metrics.last_save.set(now.div_euclid(1_000_000));
                if last {
                    tracing::info!(file = %durable.file.path().display(), pairs, "state saved for the next start");
                }
                true
            }
            Err(e) => {
                writer.failed = true;
                self.metrics.file_error(FileOp::save);
                if last || now.saturating_sub(writer.logged_at) >= SAVE_ERROR_LOG_EVERY_US {
                    writer.logged_at = now;
                    tracing::error!(
                        file = %durable.file.path().display(),
                        error = %e,
                        failures = self.metrics.file_errors(FileOp::save),
                        "cannot write the state file: a restart now would forget quotas and penalties"
                    );
                }
                false
            }
        }
    }

    /// Every state worth keeping (not idle at `now`), without concurrency
    /// slots, if anything changed since the last snapshot or `always`. Each
    /// shard is locked in turn for one pass, and marked unchanged.
    fn snapshot(&self, now: Micros, always: bool) -> Option<Saved> {
        use std::sync::atomic::Ordering;
        let changed = always
            || self.warm_dirty.load(Ordering::Relaxed)
            || self.tokens_dirty.load(Ordering::Relaxed)
            || self.shards.iter().any(|s| lock(s).dirty);
        if !changed {
            return None;
        }
        let offset = self.offset_us.load(Ordering::Relaxed);
        let mut pairs = Vec::with_capacity(self.entries.load(Ordering::Relaxed));
        for shard in self.shards.iter() {
            let mut shard = lock(shard);
            shard.dirty = false;
            pairs.extend(shard.states.iter().filter(|(_, (s, warmup))| !s.is_idle(now, offset, *warmup)).map(
                |((account, rule), (s, warmup))| Pair {
                    account: account.clone(),
                    rule: rule.clone(),
                    state: RuleState {
                        limits: s.limits.clone(),
                        penalty: s.penalty,
                        warm_start: s.warm_start,
                        last_call: s.last_call,
                        holders: Vec::new(),
                        shares: s.shares.clone(),
                        recipients: s.recipients.clone(),
                        learned_day: s.learned_day,
                        learned_windows: s.learned_windows.clone(),
                        runs: s.runs.clone(),
                        // The memory store grants no lease but in tests:
                        // nothing of one to keep.
                        lease_end: 0,
                        leases: Vec::new(),
                        cleared_at: 0,
                    },
                    warmup_us: *warmup,
                },
            ));
        }
        // Cleared before the read: a refresh meanwhile marks it again.
        self.warm_dirty.store(false, Ordering::Relaxed);
        let token_refreshed = lock(&self.warm).iter().map(|(a, t)| (a.clone(), *t)).collect();
        self.tokens_dirty.store(false, Ordering::Relaxed);
        let tokens = lock(&self.tokens)
            .live(now)
            .map(|(hash, account, until)| Learned { hash: *hash, account: account.clone(), until })
            .collect();
        Some(Saved { saved_at_us: now, pairs, token_refreshed, token_key: Some(self.token_key.clone()), tokens })
    }
}

/// The state in `file`, without what is stale at `now`; `None` if there is
/// none, or it cannot be read (then reported, counted and moved aside).
fn load(
    file: &StateFile,
    now: Micros,
    offset_us: Micros,
    keep_warm_us: Micros,
    metrics: &MemoryStoreMetrics,
) -> Option<Saved> {
    let path = file.path().display();
    let read = file.read().map_err(|e| format!("cannot read it: {e}")).and_then(|bytes| match bytes {
        None => Ok(None),
        Some(bytes) => decode(&bytes).map(Some).map_err(|e| e.to_string()),
    });
    match read {
        Ok(None) => {
            tracing::info!(file = %path, "no state file yet: starting with empty state");
            None
        }
        Ok(Some(mut saved)) => {
            let stale = saved.drop_stale(now, offset_us, keep_warm_us);
            let age_s = now.saturating_sub(saved.saved_at_us) / 1_000_000;
            tracing::info!(file = %path, pairs = saved.pairs.len(), stale, age_s, "state loaded");
            Some(saved)
        }
        Err(why) => {
            metrics.file_error(FileOp::load);
            let moved = match file.move_aside(now.div_euclid(1_000_000)) {
                Ok(to) => to.display().to_string(),
                Err(e) => format!("(could not move it aside: {e})"),
            };
            tracing::error!(
                file = %path,
                error = %why,
                moved_to = %moved,
                "the state file is unreadable: QUOTAS RESTART FROM ZERO (day counts and penalties are forgotten)"
            );
            None
        }
    }
}

/// Sweeps the store every [`SWEEP_PERIOD`] and, when it `persists`, saves
/// it every `flush_every` (spaced by [`SAVE_SPACING`]), on a fixed beat,
/// off the async threads; ends when the store is dropped.
fn spawn_keeper(store: Weak<MemoryStore>, flush_every: Duration, persists: bool) {
    let beat = if persists { flush_every.min(SWEEP_PERIOD) } else { SWEEP_PERIOD };
    let every = |d: Duration| (d.as_micros() / beat.as_micros().max(1)).max(1) as u64;
    let (sweep_every, save_every) = (every(SWEEP_PERIOD), every(flush_every));
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(beat);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await;
        // The last write's start and how long it took.
        let mut last_save = (Stopwatch::start(), Duration::ZERO);
        for n in 1u64.. {
            ticks.tick().await;
            let Some(store) = store.upgrade() else { return };
            store.metrics.entries.set(store.entries.load(std::sync::atomic::Ordering::Relaxed) as i64);
            let spaced = last_save.0.elapsed() >= last_save.1 * SAVE_SPACING;
            let (sweep, save) = (n % sweep_every == 0, persists && n % save_every == 0 && spaced);
            if !(sweep || save) {
                continue;
            }
            let saved = tokio::task::spawn_blocking(move || {
                if sweep {
                    store.sweep();
                }
                save.then(|| {
                    let started = Stopwatch::start();
                    store.save(false);
                    (started, started.elapsed())
                })
            })
            .await;
            if let Ok(Some(s)) = saved {
                last_save = s;
            }
        }
    });
}
