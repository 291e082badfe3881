//! The Redis store with its safety net: what a Redis deployment runs.
//!
//! - Every Redis call has `[store] timeout`. A decision that fails or times
//!   out is made by `[store] fallback`: `local` (in-process, each limit
//!   divided by `[store] instances`), `allow` (forward unthrottled) or
//!   `deny` (503).
//! - After `breaker_failures` failures in a row the breaker opens
//!   ([`breaker`]): calls stop waiting on Redis and go straight to the
//!   fallback, while a background probe asks Redis every `breaker_open` for
//!   what decisions need: a small write (PING would pass while Redis refuses
//!   every write with `OOM` or `READONLY`, and the breaker would flap). The
//!   first write that succeeds closes it, every serving thread gets a fresh
//!   connection, and shared decisions resume by themselves.
//! - Known refusals are answered without a round trip ([`refusals`]).
//! - Penalties and slot releases are also written locally, so this instance
//!   honours them while Redis is away. Refunds go to Redis only. Each
//!   operation of [`super::pair_op`] is routed by what it declares
//!   ([`super::pair_op::Route`], its `after` hook for the ledger); no operation
//!   has a method of its own here but `acquire`, `clear` and
//!   `token_refreshed`.
//! - Degraded decisions are counted and logged at most once per 10 s.
//! - No spent calendar quota is granted twice ([`super::ledger`]): calls the
//!   fallback admitted are added to Redis's counts as soon as it answers
//!   again, before this instance decides on Redis again; the local fallback
//!   starts from the share of the quota that was left when Redis last
//!   answered; and when Redis comes back empty (its epoch key changed) every
//!   instance adds back what it admitted today and the penalties it knows.
//! - With `fallback = "local"`, after Redis answers again (the breaker
//!   closes, or Redis was found empty) this instance keeps deciding by the
//!   fallback for a grace of `breaker_open` + 200 ms, while it adds what it
//!   admitted meanwhile: by then every other instance has found Redis again
//!   (each probes every `breaker_open`) and added its own, so no decision on
//!   Redis misses another instance's calls.
//! - Learned access tokens live in Redis only. A lookup Redis cannot answer
//!   says "unknown" (the call counts against `default`); a token learned
//!   while Redis cannot take it is not shared (the caller logs it; this
//!   instance's own cache, [`crate::features::accounts`], still knows it). The
//!   access-token key is read at start and, until read, every second; when
//!   Redis lost its data, this instance offers its key back.

pub mod breaker;
pub mod leases;
pub mod refusals;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use prometheus_client::metrics::counter::Counter;

use self::breaker::Breaker;
use self::leases::{LeaseCounters, Leases, Spend, Taking};
use self::refusals::RefusalCache;
use super::ledger::Ledger;
use super::memory::MemoryStore;
use super::pair_op::{AnsweredBy, Inspect, Lease, LeaseReturn, Operation, PairOp, PairReply, Route, Runs, Wrapper};
use super::redis::RedisStore;
use super::tokens::{Claim, Fetched, TokenHash, TokenOwner};
use super::{Decided, Snapshot, Status, Store, StoreError, TokenStore};
use crate::config::{Fallback, Resilience};
use crate::limit::penalty::PenaltyState;
use crate::limit::{Ask, Decision, Key, Limit, Reason};
use crate::time::{Clock, Micros, Stopwatch};

/// How often the background task writes what Redis is missing and checks
/// that Redis still holds the deployment's epoch.
const TICK: Duration = Duration::from_millis(100);
/// A pair used within this long has its shared counts read back each tick.
const RECENT_US: Micros = 600_000_000;
/// At most this many pairs are read back per tick (one pipeline).
const RECENT_MAX: usize = 256;
/// How often the ledger drops what no longer matters.
const PRUNE_EVERY: u32 = 100;
/// How often (in ticks) the access-token key is asked for until it is read.
const KEY_EVERY: u32 = 10;
/// Ticks between two heartbeats (`RedisStore::heartbeat`): 2 s.
const HEARTBEAT_EVERY: u32 = 20;
/// Reserves are looked for every this many ticks (a pass over every pair
/// tracked: at 10,000 pairs, every tick it cost 3.8 % of the proxy's
/// instructions at 100,000 accounts under callgrind).
const RESERVE_EVERY: u32 = 10;
/// How long a heartbeat counts an instance: an instance gone (scaled down,
/// killed) stops counting after this long.
pub const HEARTBEAT_TTL_US: Micros = 10_000_000;

/// Counters the wrapper feeds (clones of the app's metrics).
#[derive(Clone, Default)]
pub struct StoreCounters {
    pub errors: Counter,
    pub degraded: Counter,
    /// Times this instance found Redis empty (its epoch changed) and re-seeded it.
    pub lost: Counter,
    /// Calls added to Redis's counts after the fact (fallback admissions, re-seeds).
    pub reconciled: Counter,
    /// Times the breaker opened (starting with Redis down counts once).
    pub breaker_opened: Counter,
    /// Units of quota leases ([`leases`]).
    pub leases: LeaseCounters,
}

pub struct Resilient {
    redis: RedisStore,
    /// Decides while Redis cannot, and keeps what this instance must honour
    /// meanwhile (penalties, its own slots).
    local: MemoryStore,
    resilience: Resilience,
    breaker: Breaker,
    counters: StoreCounters,
    /// Known refusals, one cache per serving thread ([`crate::transport::worker`]) plus
    /// one for everything else. Forgetting clears them all.
    refusals: Box<[RefusalCache]>,
    shared_refusals: RefusalCache,
    /// What this instance admitted and knows, for Redis to be given back.
    ledger: Ledger,
    /// The epoch this instance decides under (`None`: not read yet).
    adopted: Mutex<Option<String>>,
    /// One re-seed at a time.
    reseeding: tokio::sync::Mutex<()>,
    /// The Sentinel master generation the epoch was last read under
    /// ([`RedisStore::master_generation`]): another one (a failover) has the
    /// epoch read again before the next decision.
    epoch_generation: AtomicU64,
    /// Decisions on Redis whose answer this instance has not noted yet
    /// ([`Resilient::decide_noted`]): a top-up waits for them.
    in_flight: AtomicUsize,
    /// The Redis server process ([`RedisStore::run_id`]) the epoch was
    /// last read on: another one has it read again by epoch.lua (which
    /// rotates it).
    adopted_run: Mutex<Option<String>>,
    /// Deciding by the fallback since then, for this long, although Redis
    /// answers: the other instances are adding what they admitted.
    grace: Mutex<Option<(Stopwatch, Duration)>>,
    in_grace: AtomicBool,
    /// When a refused key was last logged.
    bad_key_said: Mutex<Option<Stopwatch>>,
    /// The instances last heard from in Redis (0: not heard yet); kept
    /// while Redis is away, which is when it is used.
    heard: AtomicU32,
    /// Quota leases this instance holds (`[store] quota_leases`).
    leases: Option<Leases>,
}

impl Resilient {
    /// Wraps `redis`; `clock` drives the local fallback store. `healthy`
    /// false starts with the breaker open (Redis was down at start-up).
    /// Starts the breaker's probe, which ends when the store is dropped.
    pub fn new(
        redis: RedisStore,
        clock: Arc<dyn Clock>,
        resilience: Resilience,
        healthy: bool,
        counters: StoreCounters,
    ) -> Arc<Resilient> {
        let refusals = (0..redis.workers()).map(|_| RefusalCache::default()).collect();
        // Reserves only where the fallback decides in-process: with
        // `allow` or `deny` no call is admitted from a share anyway.
        let reserve_us = match resilience.fallback {
            Fallback::Local => resilience.quota_reserve.as_micros() as Micros,
            Fallback::Allow | Fallback::Deny => 0,
        };
        let span = resilience.quota_leases.map(|span| span.as_micros() as Micros);
        let leases = (span.is_some() || reserve_us > 0)
            .then(|| Leases::new(span, resilience.quota_lease_calls, reserve_us, counters.leases.clone()));
        let store = Arc::new(Resilient {
            leases,
            redis,
            local: MemoryStore::new(clock),
            resilience,
            breaker: Breaker::default(),
            counters,
            refusals,
            shared_refusals: RefusalCache::default(),
            ledger: Ledger::default(),
            adopted: Mutex::new(None),
            reseeding: tokio::sync::Mutex::new(()),
            epoch_generation: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            adopted_run: Mutex::new(None),
            heard: AtomicU32::new(0),
            grace: Mutex::new(None),
            in_grace: AtomicBool::new(false),
            bad_key_said: Mutex::new(None),
        });
        if !healthy {
            store.breaker.open();
            store.counters.breaker_opened.inc();
        }
        Self::spawn_probe(Arc::downgrade(&store));
        Self::spawn_keeper(Arc::downgrade(&store));
        store
    }

    /// Reads the deployment's epoch and decides under it (writing one into
    /// an empty Redis), and reads the access-token key. Call once Redis
    /// answers, before serving.
    pub async fn adopt_epoch(&self) -> Result<(), StoreError> {
        self.check_epoch(None).await?;
        // Read again every tick until it is there: not a reason to wait.
        let _ = self.load_token_key().await;
        Ok(())
    }

    /// Reads (or writes) the access-token key; see [`RedisStore::load_token_key`].
    /// Outside the breaker: what decisions need is not at stake.
    async fn load_token_key(&self) -> Result<(), StoreError> {
        let loaded = self.redis.load_token_key().await;
        if let Err(e) = &loaded {
            tracing::debug!(error = %e, "cannot read the access-token key from Redis yet");
        }
        loaded
    }

    /// Every [`TICK`] while Redis answers: writes what Redis is missing and
    /// checks the epoch. Ends when the store is dropped.
    fn spawn_keeper(store: Weak<Resilient>) {
        tokio::spawn(async move {
            let mut ticks = 0u32;
            loop {
                tokio::time::sleep(TICK).await;
                let Some(s) = store.upgrade() else { return };
                ticks = ticks.wrapping_add(1);
                if ticks % PRUNE_EVERY == 0 {
                    s.ledger.prune(s.local.now());
                }
                if s.breaker.is_open() {
                    continue;
                }
                let adopted = lock(&s.adopted).clone();
                if s.check_epoch(adopted.as_deref()).await.is_err() {
                    continue;
                }
                if s.ledger.has_pending() {
                    s.write_pending().await;
                }
                s.return_leases().await;
                s.check_lease_penalties().await;
                if ticks % RESERVE_EVERY == 0 {
                    s.take_reserves().await;
                }
                // The shared counts the guessed share starts from: not read
                // when leases or reserves hold what an outage may spend.
                if s.resilience.fallback == Fallback::Local && s.leases.is_none() {
                    s.refresh_seen().await;
                }
                if ticks % HEARTBEAT_EVERY == 1 {
                    s.heartbeat().await;
                }
                if ticks % KEY_EVERY == 0 && !s.redis.has_token_key() {
                    let _ = s.load_token_key().await;
                }
            }
        });
    }

    /// This instance's heartbeat, and the instances heard from: what the
    /// fallback divides each limit by when Redis goes away.
    async fn heartbeat(&self) {
        match self.try_redis(|| self.redis.heartbeat(HEARTBEAT_TTL_US)).await {
            Ok(live) => {
                let before = self.heard.swap(live, Ordering::Relaxed);
                if before != live {
                    tracing::info!(
                        heard = live,
                        configured = self.resilience.instances,
                        fallback_divides_by = live.max(self.resilience.instances),
                        "wxgate instances sharing Redis"
                    );
                }
            }
            Err(e) => tracing::debug!(error = %e, "no heartbeat this time"),
        }
    }

    /// A call decided from this instance's lease of its pair ([`leases`]),
    /// if it holds one or takes one now (`Ok(Some)`); `Ok(None)`: decide it
    /// per call; the error of a take Redis did not answer (the call then
    /// goes to the fallback at once: one timeout, not two).
    async fn decide_leased(&self, ask: &Ask<'_>) -> Result<Option<Decision>, StoreError> {
        let Some(leases) = &self.leases else { return Ok(None) };
        if !leases.leasable(ask) {
            if leases.reserves_for(ask.key.rule) {
                leases.note(ask.key, self.local.now());
            }
            return Ok(None);
        }
        let now = self.local.now();
        let want = match leases.spend(ask, now) {
            Spend::Admit(decision) => return Ok(Some(decision)),
            Spend::PerCall => return Ok(None),
            Spend::Take(want) => want,
        };
        // Not while Redis is away or being re-seeded: per call, as any
        // decision then.
        let moved = self.redis.master_generation() != self.epoch_generation.load(Ordering::Acquire);
        if self.breaker.is_open() || self.in_grace() || moved {
            leases.taken(ask.key, None, now, now);
            return Ok(None);
        }
        let span_us = leases.span_for(ask.key.rule);
        let lease = Lease { want, span_us, normal: !ask.key.rule.reserve.is_empty(), reserve: false };
        let taking = Taking::new(leases, ask.key);
        let answer = self.run_op(ask.key, &lease).await;
        taking.answered();
        match answer {
            Ok(leased) => Ok(leases.taken(ask.key, Some(leased), now, self.local.now())),
            Err(e) => {
                leases.taken(ask.key, None, now, now);
                Err(e)
            }
        }
    }

    /// Drops the leases of pairs another instance saw penalised (each
    /// keeper tick): the bound on how long a lease outlives a penalty.
    async fn check_lease_penalties(&self) {
        let Some(leases) = &self.leases else { return };
        let held = leases.held();
        if held.is_empty() {
            return;
        }
        let pairs: Vec<(&str, &str)> = held.iter().map(|(a, s)| (&**a, &**s)).collect();
        let Ok(ends) = self.try_redis(|| self.redis.penalty_ends(&pairs)).await else { return };
        let now = self.local.now();
        for ((account, state), until) in pairs.iter().zip(ends) {
            if until > 0 {
                leases.penalty_seen(account, state, until, now);
            }
        }
    }

    /// Gives back what leases over did not spend (each keeper tick).
    async fn return_leases(&self) {
        let Some(leases) = &self.leases else { return };
        for r in leases.due_returns(self.local.now()) {
            let key = Key { account: &r.account, rule: &r.rule, offset_us: r.offset_us };
            match self.run_op(key, &LeaseReturn { lease: &r.lease, unspent: r.unspent, reserve: r.reserve }).await {
                Ok(true) => {
                    leases.counters.returned.inc_by(r.unspent);
                }
                // Nothing to give back (its period is over, or admissions
                // followed its window slots): they pass unused.
                Ok(false) => leases.expired(&r),
                Err(e) => {
                    tracing::debug!(error = %e, "a lease's unspent units were not given back: they stay counted");
                    leases.not_returned(&r)
                }
            }
        }
    }

    /// Takes the reserves wanted (each keeper tick, while Redis answers and
    /// no re-seed is under way): one script run each.
    async fn take_reserves(&self) {
        let Some(leases) = &self.leases else { return };
        let moved = self.redis.master_generation() != self.epoch_generation.load(Ordering::Acquire);
        if self.in_grace() || moved {
            return;
        }
        for t in leases.reserves_wanted(self.local.now(), leases::RESERVE_TAKES) {
            let key = t.key();
            let sent = self.local.now();
            let lease = Lease { want: t.want, span_us: 0, normal: !t.rule.reserve.is_empty(), reserve: true };
            let leased = match self.run_op(key, &lease).await {
                Ok(leased) => Some(leased),
                Err(e) => {
                    tracing::debug!(error = %e, "no reserve taken this time");
                    None
                }
            };
            leases.reserve_taken(&t, leased, sent, self.local.now());
        }
    }

    /// Redis refused a call of `ask`'s pair for its calendar quota while
    /// this instance holds a reserve of it: gives the reserve back at once
    /// (what is left of the quota is in reserves) and decides the call
    /// again; `None` when it holds none, or the return failed.
    async fn redecide_without_reserve(&self, ask: &Ask<'_>) -> Option<Result<Decision, StoreError>> {
        let leases = self.leases.as_ref()?;
        let r = leases.give_back_reserve(ask.key)?;
        match self.run_op(ask.key, &LeaseReturn { lease: &r.lease, unspent: r.unspent, reserve: true }).await {
            Ok(true) => {
                leases.counters.returned.inc_by(r.unspent);
            }
            Ok(false) => leases.expired(&r),
            Err(e) => {
                tracing::debug!(error = %e, "a reserve's units were not given back: they stay counted");
                leases.not_returned(&r);
                return None;
            }
        }
        Some(self.decide_noted(ask).await)
    }

    /// A call of a rule with a calendar quota while Redis cannot answer,
    /// with reserves on: its windows by this instance's share (`local_key`'s
    /// rule, scaled), its calendar units from the pair's reserve. `None`:
    /// no reserve (or not enough of it) is held.
    async fn spend_reserve(&self, ask: &Ask<'_>, local_key: Key<'_>) -> Result<Option<Decision>, StoreError> {
        let Some(leases) = self.leases.as_ref().filter(|l| l.reserves()) else { return Ok(None) };
        let cost = ask.cost.max(1);
        if !leases.spend_reserve(ask.key, cost, self.local.now()) {
            return Ok(None);
        }
        let windows = local_key.rule.windows_only();
        let local = Ask { key: Key { rule: &windows, ..local_key }, ..*ask };
        let decision = match self.local.acquire(&local).await {
            Ok(d) => d.decision,
            Err(e) => {
                leases.unspend_reserve(ask.key, cost);
                return Err(e);
            }
        };
        match decision {
            Decision::Admit { .. } => {
                leases.counters.reserve_spent.inc_by(cost);
            }
            Decision::Reject { .. } => leases.unspend_reserve(ask.key, cost),
        }
        Ok(Some(decision))
    }

    /// The number of instances the local fallback divides each limit by:
    /// the most of `[store] instances` (a floor) and those last heard from.
    fn fallback_instances(&self) -> u32 {
        self.heard.load(Ordering::Relaxed).max(self.resilience.instances).max(1)
    }

    /// Reads back the shared calendar counts of the pairs this instance used
    /// in the last [`RECENT_US`], so that if Redis goes away its fallback
    /// starts from what every instance had admitted, not from what this
    /// one last saw (which the others may have moved on since).
    async fn refresh_seen(&self) {
        let now = self.local.now();
        let recent = self.ledger.recent(now - RECENT_US, RECENT_MAX);
        if recent.is_empty() {
            return;
        }
        let Ok(counts) = self.try_redis(|| self.redis.calendar_counts(&recent)).await else { return };
        for (pair, counts) in recent.iter().zip(counts) {
            for ((period, id), count) in pair.periods.iter().zip(counts) {
                if let Some(n) = count {
                    self.ledger.refresh_seen(&pair.account, &pair.state, *period, *id, n);
                }
            }
        }
    }

    /// Reads the epoch (lua/epoch.lua: a new one when Redis lost its data
    /// or is another server process than when it was last read, e.g. a
    /// promoted replica); if it is not `known` (or this instance never read
    /// it), tops up what this instance knows and decides under the new one.
    /// `known` None at start.
    async fn check_epoch(&self, known: Option<&str>) -> Result<(), StoreError> {
        let generation = self.redis.master_generation();
        // Outside the breaker: a server that will not tell is no failure.
        let run = if self.breaker.is_open() { None } else { self.redis.run_id().await.ok().flatten() };
        if let Some(known) = known {
            let same_server = run.is_none() || *lock(&self.adopted_run) == run;
            if same_server && self.try_redis(|| self.redis.epoch_value()).await?.as_deref() == Some(known) {
                self.epoch_generation.store(generation, Ordering::Release);
                return Ok(());
            }
        }
        let candidate = candidate_epoch();
        let epoch = self.try_redis(|| self.redis.epoch_now(&candidate)).await?;
        if known == Some(epoch.value.as_str()) {
            self.epoch_generation.store(generation, Ordering::Release);
            *lock(&self.adopted_run) = run;
            return Ok(());
        }
        let _one = self.reseeding.lock().await;
        let adopted = lock(&self.adopted).clone();
        if adopted.as_deref() == Some(epoch.value.as_str()) {
            return Ok(()); // another task re-seeded meanwhile
        }
        if adopted.is_some() {
            // Decisions made before the epoch moved count in Redis as this
            // instance's: the top-up must see them in the ledger too, or it
            // would add less than is missing. Those made after it answer
            // "epoch changed" and wait on `reseeding`.
            self.wait_noted().await;
            let pairs = self.ledger.lost(epoch.now);
            self.counters.lost.inc();
            tracing::error!(
                pairs,
                "Redis lost wxgate's state, or some of it (restart without persistence, a failover to a replica \
                 that missed the last writes, FLUSHALL?): topping up this instance's counts and penalties"
            );
            // The other instances re-seed within the grace of the epoch's
            // creation; decide by the fallback until then. Not when Redis
            // kept its data (a new server process over it: a restart with
            // persistence, a promoted replica): what it may lack is only
            // what did not replicate, which each instance tops up before its
            // next decision there, while fallback decisions mixed with the
            // others' shared ones would over-admit.
            let grace = self.grace_length().as_micros() as Micros;
            let left = epoch.created + grace - epoch.now;
            if left > 0 && !epoch.value.ends_with(":run") {
                self.start_grace(Duration::from_micros(left.min(grace) as u64));
            }
            self.write_pending().await;
            // The access-token key went with the data: offer ours back, so
            // that tokens hash as before on every instance.
            let _ = self.load_token_key().await;
        }
        self.redis.decide_under(&epoch.value);
        *lock(&self.adopted) = Some(epoch.value);
        self.epoch_generation.store(generation, Ordering::Release);
        *lock(&self.adopted_run) = run;
        Ok(())
    }

    /// Waits (at most the store's timeout and a tick) until every decision
    /// on Redis in flight has been noted in the ledger.
    async fn wait_noted(&self) {
        let limit = Stopwatch::start();
        let most = self.redis.timeout() + TICK;
        while self.in_flight.load(Ordering::Acquire) > 0 && limit.elapsed() < most {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Decides on Redis and notes what the decision tells
    /// ([`Resilient::learn`]), counted in flight meanwhile.
    async fn decide_noted(&self, ask: &Ask<'_>) -> Result<Decision, StoreError> {
        struct InFlight<'a>(&'a AtomicUsize);
        impl Drop for InFlight<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        let _noting = InFlight(&self.in_flight);
        let decision = self.decide_shared(ask).await?;
        self.learn(ask.key, &decision, ask.cost);
        Ok(decision)
    }

    /// How long the others may take to find Redis again: a probe period
    /// and two keeper ticks.
    fn grace_length(&self) -> Duration {
        self.resilience.breaker_open + 2 * TICK
    }

    /// Decide by the local fallback for `len` from now (nothing to do with
    /// another fallback: "allow" counts nothing and "deny" admits nothing).
    fn start_grace(&self, len: Duration) {
        if self.resilience.fallback == Fallback::Local {
            *lock(&self.grace) = Some((Stopwatch::start(), len));
            self.in_grace.store(true, Ordering::Release);
        }
    }

    /// Whether decisions are still made by the fallback after Redis came back.
    fn in_grace(&self) -> bool {
        if !self.in_grace.load(Ordering::Acquire) {
            return false;
        }
        let mut grace = lock(&self.grace);
        match *grace {
            Some((since, len)) if since.elapsed() < len => true,
            _ => {
                *grace = None;
                self.in_grace.store(false, Ordering::Release);
                false
            }
        }
    }

    /// Writes everything the ledger has pending; what fails stays pending.
    async fn write_pending(&self) {
        let mut all = self.ledger.take_all().into_iter();
        while let Some(p) = all.next() {
            match self.try_redis(|| self.redis.reconcile(&p)).await {
                Ok(_) => {
                    self.counters.reconciled.inc_by(p.calls());
                }
                Err(e) => {
                    tracing::debug!(error = %e, "could not give Redis this instance's counts yet");
                    self.ledger.put_back(p);
                    all.for_each(|p| self.ledger.put_back(p));
                    return;
                }
            }
        }
    }

    /// Writes what `key` has pending, before deciding on Redis.
    async fn write_pending_of(&self, key: Key<'_>) -> Result<(), StoreError> {
        let Some(p) = self.ledger.take(key.account, &key.rule.state) else { return Ok(()) };
        match self.try_redis(|| self.redis.reconcile(&p)).await {
            Ok(_) => {
                self.counters.reconciled.inc_by(p.calls());
                Ok(())
            }
            Err(e) => {
                self.ledger.put_back(p);
                Err(e)
            }
        }
    }

    /// Notes what a Redis decision tells about the shared state.
    /// `cost`: what the call costs; a refusal of a call costing more than 1
    /// for its quota says only that fewer than that are left.
    fn learn(&self, key: Key<'_>, decision: &Decision, cost: u64) {
        match *decision {
            Decision::Admit { .. } => self.ledger.admitted(key, decision, false, cost),
            Decision::Reject { reason: Reason::Quota, .. } if cost <= 1 => {
                self.ledger.quota_spent(key, self.local.now())
            }
            Decision::Reject { reason: Reason::Penalty, wait_us, .. } => {
                let now = self.local.now();
                let penalty = PenaltyState { until: now + wait_us, started: now, level: 0, last_len: wait_us };
                self.ledger.penalised(key, penalty, false);
            }
            Decision::Reject { .. } => {}
        }
    }

    /// Decides on Redis: what this instance owes it first, then the call.
    async fn decide_shared(&self, ask: &Ask<'_>) -> Result<Decision, StoreError> {
        if self.ledger.has_pending() {
            // Rare (after an outage): boxed, so every decision's future stays small.
            Box::pin(self.write_pending_of(ask.key)).await?;
        }
        self.try_redis(|| self.redis.decide(ask)).await
    }

    /// This thread's cache of known refusals.
    fn refusals(&self) -> &RefusalCache {
        crate::transport::worker::pick(&self.refusals, &self.shared_refusals)
    }

    /// Every cache of known refusals, this thread's and the others'.
    fn all_refusals(&self) -> impl Iterator<Item = &RefusalCache> {
        self.refusals.iter().chain(std::iter::once(&self.shared_refusals))
    }

    fn forget(&self, key: Key<'_>) {
        self.all_refusals().for_each(|c| c.forget(key.account, key.rule));
    }

    /// While the breaker is open, probes Redis every `breaker_open` with a
    /// small write ([`RedisStore::probe`]); at the first success renews the
    /// serving threads' connections and closes it. Ends when the store is
    /// dropped.
    fn spawn_probe(store: Weak<Resilient>) {
        tokio::spawn(async move {
            loop {
                let every = match store.upgrade() {
                    Some(s) => s.resilience.breaker_open,
                    None => return,
                };
                tokio::time::sleep(every).await;
                let Some(s) = store.upgrade() else { return };
                if !s.breaker.is_open() {
                    continue;
                }
                match s.redis.probe().await {
                    Ok(()) => {
                        s.redis.renew_connections();
                        s.breaker.close();
                        s.start_grace(s.grace_length());
                        let degraded = s.breaker.degraded.load(Ordering::Relaxed);
                        tracing::warn!(
                            degraded_so_far = degraded,
                            "Redis takes writes again: shared decisions resumed"
                        );
                    }
                    Err(e) => tracing::debug!(error = %e, "Redis probe failed; the breaker stays open"),
                }
            }
        });
    }

    /// Runs `op` on Redis unless the breaker is open; `Err` means "use the fallback".
    async fn try_redis<T, F: std::future::Future<Output = Result<T, StoreError>>>(
        &self,
        op: impl FnOnce() -> F,
    ) -> Result<T, StoreError> {
        if self.breaker.is_open() {
            return Err(StoreError::BreakerOpen);
        }
        match op().await {
            Ok(v) => {
                self.breaker.succeeded();
                Ok(v)
            }
            // Redis answered: it lost its data, which is not a failure.
            Err(StoreError::Lost) => {
                self.breaker.succeeded();
                Err(StoreError::Lost)
            }
            // Redis answered, about this call's keys only: that call goes
            // to the fallback, every other account's stay on Redis.
            Err(StoreError::BadKey(why)) => {
                self.breaker.succeeded();
                self.counters.errors.inc();
                // Said at most every 10 s: every call of that pair fails alike.
                let mut last = lock(&self.bad_key_said);
                if last.is_none_or(|at| at.elapsed() >= Duration::from_secs(10)) {
                    *last = Some(Stopwatch::start());
                    tracing::warn!(error = %why, "Redis refused one call's keys (a key of the wrong type?): such calls are decided by the fallback; the breaker stays closed for every other account");
                }
                Err(StoreError::BadKey(why))
            }
            Err(e) => {
                self.counters.errors.inc();
                if self.breaker.failed(self.resilience.breaker_failures) {
                    self.counters.breaker_opened.inc();
                    tracing::warn!(error = %e, "Redis circuit breaker open: not waiting on Redis until it answers a probe");
                }
                Err(e)
            }
        }
    }
}

/// By what the operation declares ([`Route`]), then its
/// [`Operation::after`].
impl Runs for Resilient {
    async fn run_op<O: Operation>(&self, key: Key<'_>, op: &O) -> Result<O::Out, StoreError> {
        if O::FORGETS_REFUSALS {
            self.forget(key);
        }
        if let (true, Some(leases)) = (O::ENDS_LEASES, &self.leases) {
            leases.drop_pair(key);
        }
        let shared = || self.try_redis(|| self.redis.run_op(key, op));
        let (out, error) = match O::ROUTE {
            Route::Redis => (shared().await?, None),
            Route::LocalThenRedis => {
                self.local.apply_now(key, op)?;
                (shared().await?, None)
            }
            Route::LocalThenRedisOrLocal => {
                let local = self.local.apply_now(key, op)?;
                match shared().await {
                    Ok(out) => (out, None),
                    Err(e) => (local, Some(e)),
                }
            }
            Route::RedisOrLocal | Route::RedisOrLocalFallback => match shared().await {
                Ok(out) => (out, None),
                Err(e) if O::ROUTE == Route::RedisOrLocal || self.resilience.fallback == Fallback::Local => {
                    (self.local.apply_now(key, op)?, Some(e))
                }
                Err(e) => return Err(e),
            },
        };
        let by = match &error {
            None => AnsweredBy::Redis,
            Some(e) => AnsweredBy::Local(e),
        };
        op.after(key, &out, by, self).await;
        Ok(out)
    }
}

/// What operations note after running ([`Operation::after`]).
#[async_trait]
impl Wrapper for Resilient {
    fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    async fn shared_state(&self, key: Key<'_>) -> Result<Snapshot, StoreError> {
        self.try_redis(|| self.redis.run_op(key, &Inspect)).await
    }

    fn local_state(&self, key: Key<'_>) -> Snapshot {
        self.local.state_of(key)
    }
}

#[async_trait]
impl Store for Resilient {
    async fn run(&self, key: Key<'_>, op: PairOp<'_>) -> Result<PairReply, StoreError> {
        op.run_on(self, key).await
    }

    fn tokens(&self) -> &dyn TokenStore {
        self
    }

    /// Redis's; while Redis cannot answer and `fallback = "local"`, those
    /// this instance honours meanwhile (as [`Inspect`] reads a pair).
    async fn penalised(&self, max: usize) -> Result<Vec<super::Penalised>, StoreError> {
        match self.try_redis(|| self.redis.penalised_pairs(max)).await {
            Err(_) if self.resilience.fallback == Fallback::Local => Ok(self.local.penalised_now(max)),
            found => found,
        }
    }

    /// On Redis, or by the fallback (`degraded`).
    async fn acquire(&self, ask: &Ask<'_>) -> Result<Decided, StoreError> {
        let take = match self.decide_leased(ask).await {
            Ok(Some(decision)) => return Ok(Decided { decision, degraded: false }),
            Ok(None) => None,
            Err(e) => Some(e),
        };
        let Key { account, rule, .. } = ask.key;
        // The known refusals are of calls costing 1: a costlier call always
        // asks (its own wait is longer, and a refusal of it says nothing of
        // a cheaper one), and never of a rule whose recipients count (a
        // refusal is of those recipients).
        let cache = self.resilience.refusal_cache && ask.cost <= 1 && !rule.recipients_matter();
        let now = self.local.now();
        if let Some((wait_us, reason)) =
            cache.then(|| self.refusals().get(account, rule, ask.normal, ask.share, now)).flatten()
        {
            let decision = Decision::reject(wait_us, reason);
            return Ok(Decided { decision, degraded: false });
        }
        // The sentinels named another master: read the epoch there first
        // (a promoted replica rotates it, and this instance tops up).
        let moved = self.redis.master_generation() != self.epoch_generation.load(Ordering::Acquire);
        let mut result = if let Some(e) = take {
            Err(e)
        } else if moved {
            Err(StoreError::Lost)
        } else if self.in_grace() {
            Err(StoreError::Settling)
        } else {
            self.decide_noted(ask).await
        };
        if let Err(StoreError::Lost) = result {
            let adopted = lock(&self.adopted).clone();
            result = match Box::pin(self.check_epoch(adopted.as_deref())).await {
                Ok(()) if self.in_grace() => Err(StoreError::Settling),
                Ok(()) => self.decide_noted(ask).await,
                Err(e) => Err(e),
            };
        }
        if let Ok(Decision::Reject { reason: Reason::Quota, .. }) = result {
            if let Some(again) = Box::pin(self.redecide_without_reserve(ask)).await {
                result = again;
            }
        }
        let e = match result {
            Ok(decision) => {
                match decision {
                    Decision::Reject { wait_us, reason, .. } if cache => {
                        self.refusals().put(account, rule, ask.normal, ask.share, wait_us, reason, now)
                    }
                    // A high caller's admission (it may use the reserve)
                    // moves the normal callers' wait later than known.
                    Decision::Admit { .. } if cache && rule.priority_matters() => self.refusals().forget(account, rule),
                    _ => {}
                }
                return Ok(Decided { decision, degraded: false });
            }
            Err(e) => e,
        };
        self.breaker.degraded(&e, self.resilience.fallback, ask.key);
        self.counters.degraded.inc();
        // A penalty this instance knows of (Redis has it, or had it) holds
        // while Redis is away too.
        let known = (self.resilience.fallback == Fallback::Local).then(|| self.ledger.penalty(ask.key, now)).flatten();
        if let Some(p) = known {
            let decision = Decision::reject(p.until - now, Reason::Penalty);
            return Ok(Decided { decision, degraded: true });
        }
        // With reserves or quota leases, a calendar quota is spent without
        // Redis only from what this instance holds of it (a lease, spent
        // above; a reserve, here): a share guessed from a count other
        // instances' leases and reserves may have moved since could pass
        // the quota. A call none covers is answered as `fallback = "deny"`
        // answers.
        let calendar = rule.limits.iter().any(|l| matches!(l, Limit::Calendar { .. }));
        let held_calendar = calendar && self.leases.is_some();
        let decision = match self.resilience.fallback {
            Fallback::Local if held_calendar => {
                let n = self.fallback_instances();
                let scaled = rule.scaled(n);
                let local_key = Key { rule: &scaled, ..ask.key };
                match self.spend_reserve(ask, local_key).await? {
                    // Counted in Redis when the reserve was taken: not
                    // this instance's unsynced admission.
                    Some(decision) => return Ok(Decided { decision, degraded: true }),
                    None => return Err(e),
                }
            }
            Fallback::Local => {
                let n = self.fallback_instances();
                let scaled = rule.scaled(n);
                let local_key = Key { rule: &scaled, ..ask.key };
                // Start from this instance's share of what was left when
                // Redis last answered, not of the whole quota.
                for limit in &rule.limits {
                    if let Limit::Calendar { period, .. } = *limit {
                        if let Some(seen) = self.ledger.seen(ask.key, limit.window_key(), now) {
                            let id = period.id(now, ask.key.offset_us);
                            self.local.raise_count(local_key, limit.window_key(), id, seen.div_ceil(u64::from(n)));
                        }
                    }
                }
                let local = Ask { key: local_key, ..*ask };
                self.local.acquire(&local).await?.decision
            }
            Fallback::Allow => {
                Decision::Admit { at: self.local.now(), hold_us: 0, escalated: false, quota: None, calendar: None }
            }
            Fallback::Deny => return Err(e),
        };
        self.ledger.admitted(ask.key, &decision, true, ask.cost);
        Ok(Decided { decision, degraded: true })
    }

    /// Cleared in Redis (every instance sees it there: their known
    /// refusals last at most a second), and in this instance's fallback
    /// state and ledger. While Redis is away the clear fails: the local
    /// state is cleared all the same, Redis keeps its counts (the safe side).
    async fn clear(&self, keys: &[Key<'_>]) -> Result<(), StoreError> {
        for &key in keys {
            self.forget(key);
        }
        if let (Some(leases), Some(first)) = (&self.leases, keys.first()) {
            leases.account_cleared(first.account);
        }
        self.local.clear(keys).await?;
        if let Some(first) = keys.first() {
            self.ledger.cleared(first.account);
        }
        self.try_redis(|| self.redis.clear(keys)).await
    }

    async fn token_refreshed(&self, account: &str, keep_us: Micros) -> Result<(), StoreError> {
        self.local.token_refreshed(account, keep_us).await?;
        self.try_redis(|| self.redis.token_refreshed(account, keep_us)).await
    }

    /// Gives Redis what this instance admitted without it, if Redis
    /// answers: those calls would otherwise never be counted.
    async fn close(&self) {
        if self.ledger.has_pending() && !self.breaker.is_open() {
            self.write_pending().await;
        }
        if self.ledger.has_pending() {
            tracing::warn!("stopping with calls admitted without Redis that Redis never counted");
        }
    }

    fn status(&self) -> Status {
        if self.breaker.is_open() {
            Status::Degraded(self.resilience.fallback)
        } else {
            Status::Shared
        }
    }

    async fn attach_worker(&self) {
        self.redis.attach_worker().await;
    }

    /// Known refusals were computed under the old rules.
    fn rules_changed(&self) {
        self.all_refusals().for_each(RefusalCache::clear);
        if let Some(leases) = &self.leases {
            leases.give_back_all();
        }
    }

    fn instances(&self) -> Option<u32> {
        Some(self.fallback_instances())
    }
}

#[async_trait]
impl TokenStore for Resilient {
    fn token_hash(&self, token: &[u8]) -> Option<TokenHash> {
        self.redis.token_hash(token)
    }

    /// In Redis only; an error if Redis cannot take it (nothing is retried).
    async fn learn_token(&self, hash: &TokenHash, account: &str, ttl_us: Micros) -> Result<(), StoreError> {
        self.try_redis(|| self.redis.learn_token(hash, account, ttl_us)).await
    }

    /// From Redis; unknown (`None`) when Redis cannot answer.
    async fn token_owner(&self, hash: &TokenHash) -> Result<Option<TokenOwner>, StoreError> {
        match self.try_redis(|| self.redis.token_owner(hash)).await {
            Ok(owner) => Ok(owner),
            Err(e) => {
                tracing::debug!(error = %e, "cannot look up an access token in Redis: counted as unknown");
                Ok(None)
            }
        }
    }

    /// In Redis only: the cache is shared or it is not used (an error
    /// makes the token request go to WeChat as if there were no cache).
    async fn claim_token(
        &self,
        slot: &str,
        holder: &str,
        min_ttl_us: Micros,
        newer_than: Micros,
        lock_us: Micros,
    ) -> Result<Claim, StoreError> {
        self.try_redis(|| self.redis.claim_token(slot, holder, min_ttl_us, newer_than, lock_us)).await
    }

    async fn token_fetched(&self, slot: &str, holder: &str, fetched: Fetched<'_>) -> Result<(), StoreError> {
        self.try_redis(|| self.redis.token_fetched(slot, holder, fetched)).await
    }

    async fn drop_token(&self, hash: &TokenHash, kinds: &[&str]) -> Result<bool, StoreError> {
        self.try_redis(|| self.redis.drop_token(hash, kinds)).await
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A fresh random value for an epoch this instance may write.
fn candidate_epoch() -> String {
    use std::hash::BuildHasher;
    format!("{:08x}", std::hash::RandomState::new().hash_one(std::process::id()) as u32)
}
