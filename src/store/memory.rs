//! The embedded default store: decision state in this process's memory.
//!
//! Exact for one instance. Several instances each with a memory store each
//! admit the full limit: use the Redis store for more than one instance.
//! State is sharded behind short mutexes (no lock is held across an await).
//!
//! Opened from the config ([`MemoryStore::open`], in [`persist`]) it also:
//!
//! - **outlives the process**: the state is written to `[store] state_file`
//!   every `flush_interval` when it changed, and once more by
//!   [`Store::close`]; it is loaded at start-up ([`super::state_file`]);
//! - **stays bounded**: idle state is dropped every 10 s without traffic
//!   (and every 4096 operations on a shard), and at most `max_entries`
//!   (account, rule) states are held (policy at [`MemoryStore::make_room`]).
//!   Learned access tokens ([`super::tokens`]) go when they expire; at most
//!   [`MAX_TOKENS`] are held.
//!
//! [`MemoryStore::new`] is the bare store (the Redis store's fallback, tests):
//! no file, no cap, no background task.

mod journal;
mod learned;
mod penalised;
mod persist;
mod token_slots;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use async_trait::async_trait;

use self::learned::LearnedTokens;
use self::token_slots::TokenSlots;
use super::pair_op::{Inspect, Kept, Operation, PairOp, PairReply, Runs};
use super::state_file::StateFile;
use super::tokens::{Claim, Fetched, TokenHash, TokenKey, TokenOwner};
use super::{Decided, Snapshot, Status, Store, StoreError, TokenStore};
use crate::config::MemoryConfig;
use crate::limit::decide::{clear, decide};
use crate::limit::pair::PairRef;
use crate::limit::{recipient_key, Ask, Key, LimitState, RuleState, WindowKey};
use crate::store::ledger::counts_calendar;
use crate::store::sharded::{lock, Sharded};
use crate::telemetry::metrics::MemoryStoreMetrics;
use crate::time::{Clock, Micros};

const SHARDS: usize = 16;
/// Every this many operations on a shard, its idle entries are dropped.
const SWEEP_EVERY: u32 = 4096;
/// A full shard is searched for state to drop at most this often.
const PRESSURE_EVERY_US: Micros = 1_000_000;
/// "Store full" is logged at most this often.
const FULL_LOG_EVERY_US: Micros = 10_000_000;
/// Most learned access tokens held (about 120 bytes each, measured by
/// bench/peers.sh's token-request rows). Tokens live two
/// hours and an account has one or two at a time: room for a platform of
/// several hundred thousand authorised accounts.
pub const MAX_TOKENS: usize = 1_000_000;

pub struct MemoryStore {
    clock: Arc<dyn Clock>,
    shards: Sharded<Shard, SHARDS>,
    /// Last access-token refresh per account.
    warm: Mutex<HashMap<String, Micros>>,
    /// Longest warm-up a token refresh was reported for: how long `warm`
    /// entries matter.
    warm_keep_us: AtomicI64,
    /// `warm` changed since the last write of the state file.
    warm_dirty: AtomicBool,
    /// What learned access tokens are hashed under: random per state file.
    token_key: TokenKey,
    /// Learned access tokens: hash → (account, until), at most [`MAX_TOKENS`].
    tokens: Mutex<LearnedTokens>,
    /// `tokens` changed since the last write of the state file.
    tokens_dirty: AtomicBool,
    /// The token cache's slots (`crate::features::token_cache`); not persisted.
    token_slots: Mutex<TokenSlots>,
    /// States held (all shards); may pass `max_entries` by the few pairs
    /// created at once, and by penalties, which always find room.
    entries: AtomicUsize,
    max_entries: usize,
    /// Recipients' states held (`per_recipient`, all pairs); may pass
    /// `max_recipients` by the recipients of the calls decided at once on
    /// other shards (at most [`crate::config::Metering::MAX`] each).
    recipients: AtomicUsize,
    max_recipients: usize,
    /// When the store was last searched for recipients to drop (store time).
    recipients_pressed_at: AtomicI64,
    /// The quota offset last seen by an operation, for sweeps without one.
    offset_us: AtomicI64,
    /// When "store full" was last logged (store time).
    full_logged: AtomicI64,
    /// When the store was last searched for room (store time).
    pressed_at: AtomicI64,
    metrics: MemoryStoreMetrics,
    /// The state file, when the store persists ([`persist`]).
    file: Option<Durable>,
    /// This store, for [`Store::close`] to hand to a blocking thread.
    me: Weak<MemoryStore>,
}

/// The state file and what its writer knows ([`persist`]).
struct Durable {
    file: StateFile,
    /// Held while writing: one write at a time, none after the last.
    writing: Mutex<Writer>,
    /// Every change a crash must keep (calendar admissions, penalties,
    /// clears), written before it takes effect ([`journal`]); `None` when
    /// it cannot be opened (said at start).
    journal: Option<journal::Journal>,
}

#[derive(Default)]
struct Writer {
    /// The last write failed: write again even if nothing changed.
    failed: bool,
    /// [`Store::close`] wrote the final state: nothing more is written.
    closed: bool,
    /// When a save failure was last logged (store time).
    logged_at: Micros,
}

#[derive(Default)]
struct Shard {
    /// (account, rule) → state, and the longest warm-up of the rule versions
    /// that used it (how long it matters after its last call).
    states: hashbrown::HashMap<(String, Arc<str>), (RuleState, Micros)>,
    ops: u32,
    /// Changed since the state file was last written.
    dirty: bool,
}

impl MemoryStore {
    /// The bare store (the Redis store's fallback, tests): no state file,
    /// no cap on pairs, no background sweep; at most
    /// [`MemoryConfig::DEFAULT_MAX_RECIPIENTS`] recipients' states.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        let bounds = MemoryConfig { max_entries: usize::MAX, ..MemoryConfig::in_memory() };
        MemoryStore::build(clock, &bounds, 0, MemoryStoreMetrics::default(), None, Weak::new(), None)
    }

    fn build(
        clock: Arc<dyn Clock>,
        bounds: &MemoryConfig,
        offset_us: Micros,
        metrics: MemoryStoreMetrics,
        file: Option<Durable>,
        me: Weak<MemoryStore>,
        token_key: Option<TokenKey>,
    ) -> Self {
        MemoryStore {
            clock,
            shards: Sharded::default(),
            warm: Mutex::default(),
            warm_keep_us: AtomicI64::new(0),
            warm_dirty: AtomicBool::new(false),
            token_key: token_key.unwrap_or_else(TokenKey::random),
            tokens: Mutex::new(LearnedTokens::new(MAX_TOKENS)),
            tokens_dirty: AtomicBool::new(false),
            token_slots: Mutex::default(),
            entries: AtomicUsize::new(0),
            max_entries: bounds.max_entries,
            recipients: AtomicUsize::new(0),
            max_recipients: bounds.max_recipients,
            recipients_pressed_at: AtomicI64::new(Micros::MIN),
            offset_us: AtomicI64::new(offset_us),
            full_logged: AtomicI64::new(Micros::MIN),
            pressed_at: AtomicI64::new(Micros::MIN),
            metrics,
            file,
            me,
        }
    }

    /// This store's clock.
    pub fn now(&self) -> Micros {
        self.clock.now_us()
    }

    /// Runs `f` on the pair's state (created empty if absent, even past
    /// `max_entries`: penalties and slot releases always find room) at this
    /// store's now, under its shard's lock.
    fn with_state<T>(&self, key: Key<'_>, f: impl FnOnce(&mut RuleState, Micros) -> T) -> T {
        let (mut shard, now) = self.shard(key);
        let rule = key.rule;
        // Looked up by reference: the pair's key is copied only when it is new.
        let pair = PairRef(key.account, &rule.state);
        let entry = match shard.states.get_mut(&pair) {
            Some(entry) => entry,
            None => {
                self.entries.fetch_add(1, Ordering::Relaxed);
                shard.states.entry((key.account.to_owned(), rule.state.clone())).or_default()
            }
        };
        entry.1 = entry.1.max(rule.warmup_us);
        f(&mut entry.0, now)
    }

    /// Like [`MemoryStore::with_state`], for a call that may bring a new
    /// pair: refused with [`StoreError::Full`] when the store holds
    /// `max_entries` states and none may be dropped.
    fn with_new_state<T>(&self, key: Key<'_>, f: impl FnOnce(&mut RuleState, Micros) -> T) -> Result<T, StoreError> {
        let (mut shard, now) = self.shard(key);
        let rule = key.rule;
        let pair = PairRef(key.account, &rule.state);
        if self.entries.load(Ordering::Relaxed) >= self.max_entries
            && !shard.states.contains_key(&pair)
            && !self.make_room(&mut shard, now, key.offset_us)
        {
            return Err(self.refuse_new(now));
        }
        let entry = match shard.states.get_mut(&pair) {
            Some(entry) => entry,
            None => {
                self.entries.fetch_add(1, Ordering::Relaxed);
                shard.states.entry((key.account.to_owned(), rule.state.clone())).or_default()
            }
        };
        entry.1 = entry.1.max(rule.warmup_us);
        Ok(f(&mut entry.0, now))
    }

    /// The pair's shard, locked and marked changed (sweeping it every
    /// [`SWEEP_EVERY`] operations), and this store's now.
    fn shard(&self, key: Key<'_>) -> (MutexGuard<'_, Shard>, Micros) {
        let now = self.now();
        let mut shard = self.shards.lock((key.account, &*key.rule.state));
        shard.ops = shard.ops.wrapping_add(1);
        shard.dirty = true;
        if shard.ops % SWEEP_EVERY == 0 {
            self.offset_us.store(key.offset_us, Ordering::Relaxed);
            self.drop_from(&mut shard, |s, warmup| s.is_idle(now, key.offset_us, warmup));
        }
        (shard, now)
    }

    /// Drops the shard's states for which `idle(state, warm-up)` holds.
    fn drop_from(&self, shard: &mut Shard, idle: impl Fn(&RuleState, Micros) -> bool) -> usize {
        let before = shard.states.len();
        let mut members = 0;
        shard.states.retain(|_, (s, warmup)| {
            let keep = !idle(s, *warmup);
            if !keep {
                members += s.recipients.len();
            }
            keep
        });
        self.forget_recipients(members);
        let dropped = before - shard.states.len();
        if dropped > 0 {
            self.entries.fetch_sub(dropped, Ordering::Relaxed);
            shard.dirty = true;
            // A table emptied by a wave of idle accounts gives its memory back.
            if shard.states.capacity() > 4 * shard.states.len().max(256) {
                shard.states.shrink_to_fit();
            }
        }
        dropped
    }

    /// The store holds `max_entries` states and a new pair wants one: drops
    /// what may be lost (at most once a second: from this shard, and from
    /// every other shard not locked at the moment; the 10 s sweep does the
    /// same for all), and says whether there is room now.
    ///
    /// What may be dropped is what no future decision needs to be as strict
    /// as today: every window refilled, no calendar count of the current
    /// period (nor calls reserved for the next), no penalty running or
    /// recent, no slot held. That is [`RuleState::is_idle`] without the
    /// warm-up: a pair dropped during its warm-up starts cold, which is
    /// slower, never faster. So no spent quota is ever granted again: a
    /// pair that holds any is kept, and new pairs are refused instead.
    fn make_room(&self, shard: &mut Shard, now: Micros, offset_us: Micros) -> bool {
        let last = self.pressed_at.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= PRESSURE_EVERY_US
            && self.pressed_at.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
        {
            let droppable = |s: &RuleState, _| s.is_idle(now, offset_us, 0);
            self.drop_from(shard, droppable);
            // Only shards free right now: waiting for one while holding
            // this one could deadlock with a caller doing the same.
            for other in self.shards.iter() {
                if let Ok(mut other) = other.try_lock() {
                    self.drop_from(&mut other, droppable);
                }
            }
        }
        self.entries.load(Ordering::Relaxed) < self.max_entries
    }

    /// Counts (and logs, at most every 10 s) a new pair refused for room.
    fn refuse_new(&self, now: Micros) -> StoreError {
        if self.count_full(now) {
            tracing::error!(
                max_entries = self.max_entries,
                refused_so_far = self.metrics.full.get(),
                "the embedded store is full: calls of new (account, rule) pairs get 503 until state goes idle; \
                 raise [store] max_entries"
            );
        }
        StoreError::Full(self.max_entries)
    }

    /// Counts a refusal for room; whether to log it (at most every 10 s).
    fn count_full(&self, now: Micros) -> bool {
        self.metrics.full.inc();
        let last = self.full_logged.load(Ordering::Relaxed);
        now.saturating_sub(last) >= FULL_LOG_EVERY_US
            && self.full_logged.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
    }

    /// `n` recipients' states were dropped.
    fn forget_recipients(&self, n: usize) {
        if n > 0 {
            let held = self.recipients.fetch_sub(n, Ordering::Relaxed).saturating_sub(n);
            self.metrics.recipients.set(held as i64);
        }
    }

    /// Whether `ask` may add the states of the recipients it names that
    /// `state` (its pair's) holds none of: refused with
    /// [`StoreError::RecipientsFull`] when that would pass
    /// `max_recipients` even after dropping the recipients whose windows
    /// are whole again (those of this pair, and at most once a second
    /// those of every pair not locked at the moment). Far from the bound
    /// (the store holds fewer than `max_recipients` less the call's
    /// recipients) nothing is looked up.
    fn room_for_recipients(&self, state: &mut RuleState, ask: &Ask<'_>, now: Micros) -> Result<(), StoreError> {
        let asked = ask.recipients.len();
        if asked == 0 || self.recipients.load(Ordering::Relaxed).saturating_add(asked) <= self.max_recipients {
            return Ok(());
        }
        let new = |state: &RuleState| {
            ask.recipients.iter().filter(|id| state.recipients.get(recipient_key(id)).is_none()).count()
        };
        let fits =
            |n: usize| n == 0 || self.recipients.load(Ordering::Relaxed).saturating_add(n) <= self.max_recipients;
        if fits(new(state)) {
            return Ok(());
        }
        self.forget_recipients(state.recipients.prune(now));
        let last = self.recipients_pressed_at.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= PRESSURE_EVERY_US
            && self.recipients_pressed_at.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
        {
            // Only shards free right now (this call's own is locked).
            for other in self.shards.iter() {
                if let Ok(mut other) = other.try_lock() {
                    let pruned: usize = other.states.values_mut().map(|(s, _)| s.recipients.prune(now)).sum();
                    if pruned > 0 {
                        other.dirty = true;
                    }
                    self.forget_recipients(pruned);
                }
            }
        }
        if fits(new(state)) {
            return Ok(());
        }
        if self.count_full(now) {
            tracing::error!(
                max_recipients = self.max_recipients,
                refused_so_far = self.metrics.full.get(),
                "the embedded store holds [store] max_recipients recipients' states: calls naming new recipients get \
                 503 until members' windows are whole again; raise [store] max_recipients"
            );
        }
        Err(StoreError::RecipientsFull(self.max_recipients))
    }

    /// Drops idle state from every shard, one at a time, each lock held
    /// for one pass over its shard: what keeps memory following live
    /// accounts without traffic. While the store is full, also drops what
    /// [`MemoryStore::make_room`] may. Returns how many states were dropped.
    pub fn sweep(&self) -> usize {
        let now = self.now();
        let offset = self.offset_us.load(Ordering::Relaxed);
        let pressed = self.entries.load(Ordering::Relaxed) >= self.max_entries;
        let dropped = self
            .shards
            .iter()
            .map(|m| {
                let mut shard = lock(m);
                // Recipients whose windows are whole again (`per_recipient`):
                // what bounds them is the rule's own limits over the longest
                // of those windows.
                let pruned: usize = shard.states.values_mut().map(|(state, _)| state.recipients.prune(now)).sum();
                self.forget_recipients(pruned);
                self.drop_from(&mut shard, |s, w| s.is_idle(now, offset, if pressed { 0 } else { w }))
            })
            .sum();
        let keep = self.warm_keep_us.load(Ordering::Relaxed);
        let mut warm = lock(&self.warm);
        let before = warm.len();
        warm.retain(|_, at| at.saturating_add(keep) > now);
        if warm.len() != before {
            self.warm_dirty.store(true, Ordering::Relaxed);
        }
        drop(warm);
        self.drop_expired_tokens(now);
        self.metrics.entries.set(self.entries.load(Ordering::Relaxed) as i64);
        dropped
    }

    /// Drops the learned tokens expired at `now`.
    fn drop_expired_tokens(&self, now: Micros) {
        if lock(&self.tokens).drop_expired(now) {
            self.tokens_dirty.store(true, Ordering::Relaxed);
        }
    }

    /// Number of (account, rule) states held; for tests and metrics.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).states.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Runs `op` on `key`'s state ([`Operation::apply`]) under its shard's
    /// lock; refused only when `op` may be ([`Operation::MAY_BE_REFUSED`]).
    /// What of its change a crash must keep ([`Operation::KEPT`]) goes to
    /// the journal first, under the same lock.
    pub fn apply_now<O: Operation>(&self, key: Key<'_>, op: &O) -> Result<O::Out, StoreError> {
        let journal = match O::KEPT {
            // Most operations (a slot's release, a call's success without a
            // penalty to end): exactly the bare path.
            Kept::Nothing => None,
            _ => self.journal(),
        };
        let Some(journal) = journal else {
            return if O::MAY_BE_REFUSED {
                self.with_new_state(key, |state, now| op.apply(state, key, now))
            } else {
                Ok(self.with_state(key, |state, now| op.apply(state, key, now)))
            };
        };
        let run = |state: &mut RuleState, now| {
            let before = state.penalty;
            let out = op.apply(state, key, now);
            let written = match O::KEPT {
                Kept::Penalty if state.penalty != before => {
                    journal.append_penalty(key.account, &key.rule.state, &state.penalty)
                }
                Kept::Counts => {
                    let counts = calendar_counts(state, key);
                    if counts[0].is_some() {
                        journal.append(key.account, &key.rule.state, &counts)
                    } else {
                        Ok(())
                    }
                }
                Kept::Learned => {
                    let day = match state.learned_day {
                        Some(l) => journal.append_learned(key.account, &key.rule.state, l.limit, l.at),
                        None => Ok(()),
                    };
                    state
                        .learned_windows
                        .iter()
                        .map(|w| journal.append_window(key.account, &key.rule.state, w))
                        .fold(day, |a, b| a.and(b))
                }
                _ => Ok(()),
            };
            self.journal_failed(written);
            out
        };
        if O::MAY_BE_REFUSED {
            self.with_new_state(key, run)
        } else {
            Ok(self.with_state(key, run))
        }
    }

    /// The journal of changes a crash must keep, when the store persists.
    fn journal(&self) -> Option<&journal::Journal> {
        self.file.as_ref().and_then(|d| d.journal.as_ref())
    }

    /// Counts and logs a journal write that failed.
    fn journal_failed(&self, written: std::io::Result<()>) {
        if let Err(e) = written {
            self.metrics.file_error(crate::telemetry::metrics::FileOp::save);
            tracing::warn!(error = %e, "cannot append to the journal beside the state file: a crash now would forget this change");
        }
    }

    /// The pair's whole state now ([`Inspect`]).
    pub fn state_of(&self, key: Key<'_>) -> Snapshot {
        self.with_state(key, |state, now| Inspect.apply(state, key, now))
    }

    /// Raises the count of `key`'s calendar quota `window` in period
    /// `period_id` to at least `used` (the Redis fallback starts from what
    /// was already used). Never lowers a count.
    pub fn raise_count(&self, key: Key<'_>, window: WindowKey, period_id: i64, used: u64) {
        self.with_state(key, |state, _| raise(state, window, period_id, used));
    }

    /// Runs `f` on the state of a pair known by its account and state name
    /// only (the journal's replay, before any call); creates it when
    /// `create`, else does nothing when it is absent.
    fn with_raw(&self, account: &str, state_name: &str, create: bool, f: impl FnOnce(&mut RuleState)) {
        let state_name: Arc<str> = state_name.into();
        let mut shard = self.shards.lock((account, &*state_name));
        shard.dirty = true;
        let entry = match shard.states.get_mut(&PairRef(account, &state_name)) {
            Some(entry) => entry,
            None if create => {
                self.entries.fetch_add(1, Ordering::Relaxed);
                shard.states.entry((account.to_owned(), state_name.clone())).or_default()
            }
            None => return,
        };
        f(&mut entry.0);
    }
}

/// Raises a calendar count to at least `used` in `period_id` (never lowers one).
fn raise(state: &mut RuleState, window: WindowKey, period_id: i64, used: u64) {
    let raised = match state.get(window) {
        Some(LimitState::Count { period_id: p, used: u, next }) if p == period_id => {
            LimitState::Count { period_id, used: u.max(used), next }
        }
        Some(LimitState::Count { period_id: p, .. }) if p > period_id => return,
        Some(LimitState::Count { period_id: p, next, .. }) if p == period_id - 1 => {
            LimitState::Count { period_id, used: next.max(used), next: 0 }
        }
        _ => LimitState::Count { period_id, used, next: 0 },
    };
    state.set(window, raised);
}

/// A pair's calendar counts after an admission, as the journal records them.
fn calendar_counts(state: &RuleState, key: Key<'_>) -> journal::Counts {
    let mut out: journal::Counts = [None; journal::MAX_COUNTS];
    let calendars = key.rule.limits.iter().filter_map(|l| match *l {
        crate::limit::Limit::Calendar { period, .. } => match state.get(l.window_key()) {
            Some(LimitState::Count { period_id, used, .. }) => Some((period, period_id, used)),
            _ => None,
        },
        crate::limit::Limit::Window(_) => None,
    });
    for (slot, count) in out.iter_mut().zip(calendars) {
        *slot = Some(count);
    }
    out
}

impl Runs for MemoryStore {
    async fn run_op<O: Operation>(&self, key: Key<'_>, op: &O) -> Result<O::Out, StoreError> {
        self.apply_now(key, op)
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn run(&self, key: Key<'_>, op: PairOp<'_>) -> Result<PairReply, StoreError> {
        op.run_on(self, key).await
    }

    fn tokens(&self) -> &dyn TokenStore {
        self
    }

    async fn penalised(&self, max: usize) -> Result<Vec<super::Penalised>, StoreError> {
        Ok(self.penalised_now(max))
    }

    async fn acquire(&self, ask: &Ask<'_>) -> Result<Decided, StoreError> {
        let key = ask.key;
        let account_warm =
            if key.rule.warmup_us > 0 { lock(&self.warm).get(key.account).copied().unwrap_or(0) } else { 0 };
        let journal = self.journal().filter(|_| counts_calendar(key.rule));
        let decision = self.with_new_state(key, |state, now| {
            self.room_for_recipients(state, ask, now)?;
            let members = state.recipients.len();
            let decision = decide(state, ask, now, account_warm);
            // A decision only adds recipients (never drops one).
            let added = state.recipients.len().saturating_sub(members);
            if added > 0 {
                let held = self.recipients.fetch_add(added, Ordering::Relaxed) + added;
                self.metrics.recipients.set(held as i64);
            }
            // In the kernel before the call goes on (a crash loses no
            // admission), and under the pair's lock: the journal holds the
            // pair's changes in the order they were made (a clear between).
            if let (Some(journal), crate::limit::Decision::Admit { .. }) = (journal, &decision) {
                let counts = calendar_counts(state, key);
                if counts[0].is_some() {
                    self.journal_failed(journal.append(key.account, &key.rule.state, &counts));
                }
            }
            Ok(decision)
        })??;
        Ok(Decided { decision, degraded: false })
    }

    async fn clear(&self, keys: &[Key<'_>]) -> Result<(), StoreError> {
        for &key in keys {
            let (mut shard, now) = self.shard(key);
            if let Some((state, _)) = shard.states.get_mut(&PairRef(key.account, &key.rule.state)) {
                // Journalled first, under the pair's lock: a crash keeps the
                // clear, in order with the admissions around it.
                if let Some(journal) = self.journal() {
                    self.journal_failed(journal.append_clear(key.account, &key.rule.state, now));
                }
                clear(state, now, key.offset_us);
            }
        }
        Ok(())
    }

    async fn token_refreshed(&self, account: &str, keep_us: Micros) -> Result<(), StoreError> {
        let now = self.now();
        lock(&self.warm).insert(account.to_owned(), now);
        self.warm_keep_us.fetch_max(keep_us, Ordering::Relaxed);
        self.warm_dirty.store(true, Ordering::Relaxed);
        Ok(())
    }

    fn status(&self) -> Status {
        Status::InProcess
    }

    /// Writes the final state to the state file (if any); nothing is
    /// written after it.
    async fn close(&self) {
        let Some(me) = self.me.upgrade() else { return };
        if me.file.is_some() {
            let _ = tokio::task::spawn_blocking(move || me.save(true)).await;
        }
    }
}

#[async_trait]
impl TokenStore for MemoryStore {
    fn token_hash(&self, token: &[u8]) -> Option<TokenHash> {
        Some(self.token_key.hash(token))
    }

    async fn learn_token(&self, hash: &TokenHash, account: &str, ttl_us: Micros) -> Result<(), StoreError> {
        let now = self.now();
        lock(&self.tokens)
            .learn(*hash, account, now.saturating_add(ttl_us), now)
            .map_err(|_| StoreError::TokensFull(MAX_TOKENS))?;
        self.tokens_dirty.store(true, Ordering::Relaxed);
        Ok(())
    }

    async fn token_owner(&self, hash: &TokenHash) -> Result<Option<TokenOwner>, StoreError> {
        let now = self.now();
        Ok(lock(&self.tokens).get(hash, now).map(|(account, until)| TokenOwner {
            account: account.clone(),
            until: *until,
            now,
        }))
    }

    async fn claim_token(
        &self,
        slot: &str,
        holder: &str,
        min_ttl_us: Micros,
        newer_than: Micros,
        lock_us: Micros,
    ) -> Result<Claim, StoreError> {
        let now = self.now();
        Ok(lock(&self.token_slots).claim(slot, holder, min_ttl_us, newer_than, lock_us, now))
    }

    async fn token_fetched(&self, slot: &str, holder: &str, fetched: Fetched<'_>) -> Result<(), StoreError> {
        let now = self.now();
        lock(&self.token_slots).fetched(slot, holder, fetched, now);
        Ok(())
    }

    async fn drop_token(&self, hash: &TokenHash, kinds: &[&str]) -> Result<bool, StoreError> {
        let now = self.now();
        Ok(lock(&self.token_slots).drop_token(hash, kinds, now))
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use super::*;
    use crate::config::Config;
    use crate::limit::Decision;
    use crate::time::ManualClock;

    const RULE: &str = r#"[[rule]]
name = "message_send"
match = ["/cgi-bin/message/send"]
limits = [{ count = 1000000, per = "day" }]
recipients = { field = "touser", separator = "|" }
per_recipient = [{ count = 30, per = "1m", burst = 10 }, { count = 1000, per = "1h", burst = 100 }]
"#;

    /// The count of recipients held follows every state added and dropped
    /// (what `max_recipients` is checked against, so it must not drift).
    #[tokio::test]
    async fn recipients_held_are_counted_as_they_come_and_go() {
        let config = Config::parse(RULE, Path::new("t.toml")).expect("the rule");
        let rule = config.rule_for("/cgi-bin/message/send").expect("the rule matches").clone();
        let clock = ManualClock::new(1_795_924_800_000_000);
        let store = MemoryStore::new(Arc::new(clock.clone()));
        let held = || store.recipients.load(Ordering::Relaxed);
        let key = Key { account: "wx1", rule: &rule, offset_us: 0 };
        let other = Key { account: "wx2", ..key };
        let ids: Vec<String> = (0..10).map(|i| format!("u{i}")).collect();
        for (k, ids) in [(key, &ids[..]), (key, &ids[5..]), (other, &ids[..3])] {
            let decided = store.acquire(&Ask { cost: 1, recipients: ids, ..Ask::one(k) }).await.expect("acquire");
            assert!(matches!(decided.decision, Decision::Admit { .. }), "{:?}", decided.decision);
        }
        assert_eq!(held(), 13, "10 of wx1 (5 named twice), 3 of wx2");
        assert_eq!(
            held(),
            store
                .shards
                .iter()
                .map(|s| lock(s).states.values().map(|(s, _)| s.recipients.len()).sum::<usize>())
                .sum::<usize>()
        );
        // Every member's windows whole again: the sweep drops them (the
        // pairs stay, holding the day's count).
        clock.advance(Duration::from_secs(3601));
        store.sweep();
        assert_eq!((held(), store.len()), (0, 2));
    }
}
