//! The shared store: decision state in Redis. Every operation that reads
//! and writes state is one Lua script run by SHA (acquire.lua and the other
//! scripts of [`protocol`], and those the operations of [`super::pair_op`]
//! declare), atomic because Redis runs one script at a time: two instances
//! can never both take the last token. The exceptions are single plain
//! commands: freeing a slot (`ZREM`, [`super::pair_op::Release`]), reading the
//! epoch (`GET`) and the access-token key (`SET NX`, then `GET`: two round
//! trips, harmless since the first value written stays). The clock is Redis
//! `TIME`, never an instance's clock.
//!
//! - Each serving thread has its own connection ([`conn`]); a round trip
//!   never crosses threads.
//! - With `[store] batch` (the default), calls that arrive while a decision
//!   is in flight on a connection are decided together in the next
//!   acquire.lua run ([`super::batch`]): a busy connection costs one round
//!   trip per run, not per call, whatever accounts its calls are for (in a
//!   Cluster, per account: a run's keys must share a slot). An idle one
//!   decides alone, at once.
//! - Each key carries a TTL covering the longest time any of its state
//!   matters, so idle accounts and retired rules vanish by themselves.
//! - A script Redis no longer knows (restart, failover, `SCRIPT FLUSH`) is
//!   loaded again and the same command runs once more.
//! - A connection that fails in a way it will not recover from by itself (a
//!   refused password, a read-only replica) is replaced ([`conn`]).
//!
//! Failures are errors here; [`super::resilient`] decides what they mean.

pub mod conn;
mod penalties;
pub mod protocol;

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use async_trait::async_trait;
use redis::Script;

use self::conn::{Connections, Lane, CONNECT_TIMEOUT};
use self::protocol::{AcquireArgs, EpochReply, Keys, TokenOwnerReply};
use super::batch::{Answer, Batcher, Joined};
use super::ledger::Pending;
use super::pair_op;
use super::pair_op::{Command, Operation, PairOp, PairReply, Runs};
use super::tokens::{Claim, Fetched, TokenHash, TokenKey, TokenOwner};
use super::{Decided, Status, Store, StoreError, TokenStore};
use crate::config::RedisConfig;
use crate::limit::{Ask, Decision, Key};
use crate::time::{deadline_after, Clock, Micros, Stopwatch};

/// Most calls one acquire.lua run decides (Redis runs nothing else meanwhile).
const MAX_BATCH: usize = 64;

/// Keys one acquire.lua run takes calls for, recipients' included: a run
/// blocks Redis while it lasts, so a batch of broadcasts is split.
const MAX_RUN_KEYS: usize = 1024;

pub struct RedisStore {
    conns: Connections,
    /// Decisions queued per lane: the shared connection's, then each
    /// serving thread's.
    shared_batcher: Batcher<AcquireArgs>,
    batchers: Box<[Batcher<AcquireArgs>]>,
    /// Coalesce concurrent decisions of an account ([`super::batch`]).
    batch: bool,
    keys: Keys,
    /// The breaker's probe ([`RedisStore::probe`]) and its key.
    probe: Script,
    probe_key: String,
    timeout: Duration,
    /// The deployment's epoch this instance decides under, checked by every
    /// acquire.lua run (single server only: in a cluster the epoch key lives
    /// in another slot than the account's keys). `None`: not checked.
    epoch: ArcSwapOption<String>,
    epoch_key: String,
    /// What access tokens are hashed under, once read from Redis
    /// ([`RedisStore::load_token_key`]).
    token_key: ArcSwapOption<TokenKey>,
    cluster: bool,
    /// Tests only: pass this clock's time to the scripts instead of `TIME`.
    fixed_clock: Option<Arc<dyn Clock>>,
    /// `[store] wait_replicas` (0: off).
    wait_replicas: u32,
    /// WAITs that found too few replicas in time, and when that was last logged.
    short_waits: std::sync::atomic::AtomicU64,
    short_logged: std::sync::Mutex<Option<Stopwatch>>,
}

impl RedisStore {
    async fn open(cfg: &RedisConfig, lazy: bool) -> Result<RedisStore, StoreError> {
        let conns = Connections::open(cfg, lazy).await?;
        let keys = Keys::new(&cfg.key_prefix);
        let store = RedisStore {
            conns,
            shared_batcher: Batcher::default(),
            batchers: Box::new([]),
            batch: cfg.batch,
            epoch_key: keys.epoch(),
            keys,
            probe: Script::new(include_str!("../../lua/probe.lua")),
            probe_key: format!("{}:probe", cfg.key_prefix),
            timeout: cfg.timeout,
            epoch: ArcSwapOption::empty(),
            token_key: ArcSwapOption::empty(),
            cluster: !cfg.nodes.is_empty(),
            fixed_clock: None,
            wait_replicas: cfg.wait_replicas,
            short_waits: std::sync::atomic::AtomicU64::new(0),
            short_logged: std::sync::Mutex::new(None),
        };
        if !lazy {
            let mut conn = store.conns.conn(Lane::Shared);
            // A small command first: a Redis that wants a password answers it
            // NOAUTH, where a script (over 16 KiB) would get "Protocol error:
            // unauthenticated bulk length", which says nothing of a password.
            match tokio::time::timeout(CONNECT_TIMEOUT, redis::cmd("PING").query_async::<String>(&mut conn)).await {
                Ok(answered) => answered.map(|_| ()).map_err(|e| conn::cannot_use(store.conns.at(), e))?,
                Err(_) => {
                    return Err(StoreError::Unreachable(format!(
                        "cannot use Redis at {}: PING timed out",
                        store.conns.at()
                    )))
                }
            }
            for script in protocol::scripts().chain(pair_op::scripts()) {
                match tokio::time::timeout(CONNECT_TIMEOUT, script.prepare_invoke().load_async(&mut conn)).await {
                    Ok(loaded) => loaded.map_err(|e| conn::cannot_use(store.conns.at(), e))?,
                    Err(_) => {
                        return Err(StoreError::Unreachable(format!(
                            "cannot use Redis at {}: SCRIPT LOAD timed out",
                            store.conns.at()
                        )))
                    }
                };
            }
            // A user whose ACL denies wxgate's keys or scripts is a
            // configuration error; a read-only or full Redis is not (the
            // fallback decides until it takes writes).
            if let Err(StoreError::Redis(text) | StoreError::BadKey(text)) = store.probe().await {
                if text.to_ascii_uppercase().contains("NOPERM") || text.contains("no permissions") {
                    return Err(StoreError::Refused(format!(
                        "cannot use Redis at {}: {text} (the user needs every command on keys {}:* and scripts)",
                        store.conns.at(),
                        cfg.key_prefix
                    )));
                }
            }
            // Not a reason to refuse to start (a read-only Redis takes no
            // SET): the resilient wrapper asks again until it has it.
            if let Err(e) = store.load_token_key().await {
                tracing::debug!(error = %e, "cannot read the access-token key from Redis yet");
            }
        }
        Ok(store)
    }

    /// Connects and loads the scripts; fails on any error (tests, strict start).
    pub async fn connect(cfg: &RedisConfig) -> Result<RedisStore, StoreError> {
        Self::open(cfg, false).await
    }

    /// A store whose connection is made on first use, for starting while
    /// Redis is unreachable (scripts load on the first NOSCRIPT).
    pub async fn connect_later(cfg: &RedisConfig) -> Result<RedisStore, StoreError> {
        Self::open(cfg, true).await
    }

    /// Makes room for `workers` serving threads' own connections.
    pub fn with_workers(mut self, workers: usize) -> Self {
        self.conns = self.conns.with_workers(workers);
        self.batchers = (0..workers).map(|_| Batcher::default()).collect();
        self
    }

    /// How many serving threads have a place here ([`RedisStore::with_workers`]).
    pub fn workers(&self) -> usize {
        self.conns.workers()
    }

    /// Tests only: decide on `clock`'s time instead of Redis `TIME`.
    pub fn with_fixed_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.fixed_clock = Some(clock);
        self
    }

    /// `<prefix>:{<account>}:<rule>`: the state of a pair (one packed value).
    fn state_key(&self, key: Key<'_>) -> String {
        self.keys.state(key.account, key.rule)
    }

    /// Whether Redis takes a small write within the decision timeout: what
    /// decisions need, where a PING would pass while Redis refuses every
    /// write (`OOM`, `READONLY`). Runs on the caller's lane (the breaker's
    /// probe: the shared one), whose connection is replaced when the failure
    /// says so.
    pub async fn probe(&self) -> Result<(), StoreError> {
        self.run::<i64>(self.probe.key(&self.probe_key)).await.map(|_| ())
    }

    /// Gives every serving thread a fresh connection, for when Redis is
    /// healthy again after an outage ([`conn::Connections::renew_own`]).
    pub fn renew_connections(&self) {
        self.conns.renew_own();
    }

    /// The queue of `lane`'s connection.
    fn batcher(&self, lane: Lane) -> &Batcher<AcquireArgs> {
        match lane {
            Lane::Own(i) => self.batchers.get(i).unwrap_or(&self.shared_batcher),
            Lane::Shared => &self.shared_batcher,
        }
    }

    /// The time the scripts decide at: "" (Redis `TIME`), or the test clock's.
    fn now_arg(&self) -> String {
        self.fixed_clock.as_ref().map(|c| c.now_us().to_string()).unwrap_or_default()
    }

    fn timed_out(&self) -> StoreError {
        StoreError::Timeout(self.timeout)
    }

    /// Runs a script on this thread's connection within the timeout.
    async fn run<T: redis::FromRedisValue>(&self, inv: redis::ScriptInvocation<'_>) -> Result<T, StoreError> {
        self.conns.run(inv, self.timeout).await
    }

    /// Each pair's calendar counts as Redis holds them: per period asked,
    /// the count if Redis's state is in that period (one pipeline of
    /// lua/fields.lua, read only).
    pub async fn calendar_counts(
        &self,
        pairs: &[crate::store::ledger::Recent],
    ) -> Result<Vec<Vec<Option<u64>>>, StoreError> {
        let reads = pairs
            .iter()
            .map(|pair| {
                let fields = pair
                    .periods
                    .iter()
                    .flat_map(|(period, _)| [format!("{}.p", period.as_str()), format!("{}.n", period.as_str())])
                    .collect();
                (self.keys.state_named(&pair.account, &pair.state), fields)
            })
            .collect::<Vec<_>>();
        let replies = self.read_fields(&reads).await?;
        Ok(pairs
            .iter()
            .zip(replies)
            .map(|(pair, fields)| {
                pair.periods
                    .iter()
                    .enumerate()
                    .map(|(i, (_, id))| {
                        match (fields.get(2 * i).copied().flatten(), fields.get(2 * i + 1).copied().flatten()) {
                            (Some(p), Some(n)) if p == *id => Some(n.max(0) as u64),
                            _ => None,
                        }
                    })
                    .collect()
            })
            .collect())
    }

    /// When each pair's penalty ends (`pu`; 0: none), in one pipeline:
    /// the keeper's check of the pairs this instance holds quota leases of.
    pub async fn penalty_ends(&self, pairs: &[(&str, &str)]) -> Result<Vec<Micros>, StoreError> {
        let reads: Vec<(String, Vec<String>)> =
            pairs.iter().map(|(account, state)| (self.keys.state_named(account, state), vec!["pu".into()])).collect();
        let replies = self.read_fields(&reads).await?;
        Ok(replies.into_iter().map(|v| v.first().copied().flatten().unwrap_or(0)).collect())
    }

    /// Fields of pair states (key, field names), read in one pipeline of
    /// lua/fields.lua on this thread's connection within the timeout (the
    /// script loaded and the pipeline sent once more if Redis lost it).
    async fn read_fields(&self, reads: &[(String, Vec<String>)]) -> Result<Vec<Vec<Option<i64>>>, StoreError> {
        let script: &Script = &protocol::FIELDS;
        let mut pipe = redis::pipe();
        for (key, fields) in reads {
            pipe.cmd("EVALSHA").arg(script.get_hash()).arg(1).arg(key).arg(fields);
        }
        let lane = self.conns.lane();
        let mut conn = self.conns.conn(lane);
        let result = tokio::time::timeout(self.timeout, async {
            match pipe.query_async::<Vec<Vec<Option<i64>>>>(&mut conn).await {
                Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                    script.load_async(&mut conn).await?;
                    pipe.query_async::<Vec<Vec<Option<i64>>>>(&mut conn).await
                }
                other => other,
            }
        })
        .await;
        self.conns.outcome(lane, result, self.timeout)
    }

    /// Runs a plain command on this thread's connection within the timeout.
    async fn query<T: redis::FromRedisValue>(&self, cmd: redis::Cmd) -> Result<T, StoreError> {
        self.conns.query(&cmd, self.timeout).await
    }

    /// Decides `ask` alone, or with the calls queued on the same lane
    /// (`[store] batch`): [`Store::acquire`], without boxing its future (the
    /// wrapper calls it on every decision). On one server a run takes calls
    /// of any accounts (each call names its own keys); in a Cluster only of
    /// one account, whose keys share a slot.
    pub(super) async fn decide(&self, ask: &Ask<'_>) -> Result<Decision, StoreError> {
        let lane = self.conns.lane();
        let deadline = deadline_after(self.timeout);
        let mut call = AcquireArgs::new(&self.keys, ask);
        if !self.batch {
            let mut results = self.run_acquire(lane, &[call], deadline).await?;
            return results
                .pop()
                .unwrap_or_else(|| Err(StoreError::BadReply { script: "acquire.lua", reply: String::new() }));
        }
        let batcher = self.batcher(lane);
        let account = if self.cluster { ask.key.account } else { "" };
        loop {
            let mut leader = match batcher.join(account, call) {
                Joined::Lead(leader) => leader,
                Joined::Wait(mut waiting) => match tokio::time::timeout_at(deadline, waiting.answer()).await {
                    Ok(Ok(Answer::Decided(result))) => return result,
                    Ok(Ok(Answer::Lead(own))) => batcher.lead(account, own),
                    // The run this call was taken into was abandoned (its
                    // leader's client left): decide again.
                    Ok(Err(_)) => {
                        call = AcquireArgs::new(&self.keys, ask);
                        continue;
                    }
                    Err(_) => return Err(self.timed_out()),
                },
            };
            // Recipient keys count too: a run touches at most about
            // MAX_RUN_KEYS keys (a message's own recipients always go).
            let mut keys = leader.calls[0].key_count();
            leader.take(MAX_BATCH, |first, next| {
                keys += next.key_count();
                first.offset_us == next.offset_us && keys <= MAX_RUN_KEYS
            });
            let results = self.run_acquire(lane, &leader.calls, deadline).await;
            return leader.finish(results);
        }
    }

    /// Runs acquire.lua once for `calls` (same offset; in a Cluster, one account's) on
    /// `lane`'s connection, giving up at `deadline` (the first call's budget).
    async fn run_acquire(
        &self,
        lane: Lane,
        calls: &[AcquireArgs],
        deadline: tokio::time::Instant,
    ) -> Result<Vec<Result<Decision, StoreError>>, StoreError> {
        let script: &Script = &protocol::ACQUIRE;
        let epoch = self.epoch.load();
        let check = epoch.as_deref().map(|e| (self.epoch_key.as_str(), e.as_str()));
        let cmd = protocol::acquire_command(script, calls, &self.now_arg(), check, self.keys.inst());
        let mut conn = self.conns.conn(lane);
        let reply = tokio::time::timeout_at(deadline, async {
            match cmd.query_async::<redis::Value>(&mut conn).await {
                // Redis lost its script cache (restart, failover, SCRIPT
                // FLUSH): load the script and run the same command once more.
                Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                    script.load_async(&mut conn).await?;
                    cmd.query_async::<redis::Value>(&mut conn).await
                }
                other => other,
            }
        })
        .await;
        let decisions = self.conns.outcome(lane, reply, self.timeout).and_then(protocol::parse_decisions)?;
        let counted = |d: &Result<Decision, StoreError>| matches!(d, Ok(Decision::Admit { calendar: Some(_), .. }));
        if self.wait_replicas > 0 && decisions.iter().any(counted) {
            self.wait_for_replicas(&mut conn, deadline).await;
        }
        Ok(decisions)
    }

    /// `[store] wait_replicas`: waits (until `deadline`) for that many
    /// replicas to hold every write made so far on `conn`, the admissions
    /// just counted among them, so that a failover cannot lose them. The
    /// decision stands if fewer answer in time: that is counted and logged
    /// (at most every 10 s), and the calls go on.
    async fn wait_for_replicas(&self, conn: &mut conn::Conn, deadline: tokio::time::Instant) {
        let left = deadline.saturating_duration_since(deadline_after(Duration::ZERO));
        let ms = left.as_millis().clamp(1, u128::from(u32::MAX)) as u64;
        let mut cmd = redis::cmd("WAIT");
        cmd.arg(self.wait_replicas).arg(ms);
        let acked = tokio::time::timeout(left + Duration::from_millis(50), cmd.query_async::<i64>(conn)).await;
        let short = match acked {
            Ok(Ok(n)) => n < i64::from(self.wait_replicas),
            _ => true,
        };
        if short {
            let total = self.short_waits.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            let mut last = self.short_logged.lock().unwrap_or_else(|e| e.into_inner());
            if last.as_ref().is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
                *last = Some(Stopwatch::start());
                tracing::warn!(
                    wait_replicas = self.wait_replicas,
                    short_so_far = total,
                    "fewer replicas than [store] wait_replicas acknowledged admissions in time: a failover now could lose them"
                );
            }
        }
    }
}

/// The deployment's epoch ([`RedisStore::epoch_now`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Epoch {
    pub value: String,
    /// When it was written (store time).
    pub created: Micros,
    /// The store's now when it was read.
    pub now: Micros,
}

impl RedisStore {
    /// The deployment's epoch, written now with `candidate` in it if Redis
    /// has none (an empty Redis).
    pub async fn epoch_now(&self, candidate: &str) -> Result<Epoch, StoreError> {
        let mut inv = protocol::EPOCH.key(&self.epoch_key);
        if !self.cluster {
            inv.key(self.keys.epoch_run());
        }
        inv.arg(self.now_arg()).arg(candidate);
        let (value, created, now): EpochReply = self.run(inv).await?;
        Ok(Epoch { value, created, now })
    }

    /// This instance's heartbeat: its id and Redis `TIME` (µs) in the
    /// sorted set `<prefix>:#instances`, those older than `ttl_us` taken
    /// out, in one MULTI; the number of instances heard from within
    /// `ttl_us`, this one included. Plain commands, not a script: a
    /// background chore, never a decision.
    pub async fn heartbeat(&self, ttl_us: Micros) -> Result<u32, StoreError> {
        let now: Micros = match &self.fixed_clock {
            Some(clock) => clock.now_us(),
            None => {
                let (secs, micros): (i64, i64) = self.query(redis::cmd("TIME")).await?;
                secs.saturating_mul(1_000_000).saturating_add(micros)
            }
        };
        let key = self.keys.instances();
        let mut pipe = redis::pipe();
        pipe.atomic()
            .zadd(&key, self.keys.inst(), now)
            .ignore()
            .zrembyscore(&key, "-inf", format!("({}", now.saturating_sub(ttl_us)))
            .ignore()
            .pexpire(&key, ttl_us.div_euclid(1000).saturating_mul(2))
            .ignore()
            .zcard(&key);
        let lane = self.conns.lane();
        let mut conn = self.conns.conn(lane);
        let result = tokio::time::timeout(self.timeout, pipe.query_async::<(i64,)>(&mut conn)).await;
        let (live,) = self.conns.outcome(lane, result, self.timeout)?;
        Ok(u32::try_from(live).unwrap_or(u32::MAX).max(1))
    }

    /// The epoch Redis holds now, if any (a plain GET).
    pub async fn epoch_value(&self) -> Result<Option<String>, StoreError> {
        self.query(redis::cmd("GET").arg(&self.epoch_key).clone()).await
    }

    /// The `run_id` of the Redis server process that answers (`INFO
    /// server`): another one than before means a restart or a failover, and
    /// lua/epoch.lua then rotates the epoch. `None` in a Cluster (each node
    /// has its own), or if the server does not tell (an ACL without INFO,
    /// some managed proxies).
    pub async fn run_id(&self) -> Result<Option<String>, StoreError> {
        if self.cluster {
            return Ok(None);
        }
        let info: String = self.query(redis::cmd("INFO").arg("server").clone()).await?;
        Ok(info.lines().find_map(|l| l.strip_prefix("run_id:")).map(|id| id.trim().to_owned()))
    }

    /// Reads the deployment's access-token key (`<prefix>:#tokenkey`),
    /// writing this instance's own key, or a new random one, if Redis has
    /// none (first start, or Redis lost its data: every instance then
    /// offers the key it had, and the first one written stays).
    pub async fn load_token_key(&self) -> Result<(), StoreError> {
        let name = self.keys.token_key();
        let offer = self.token_key.load().as_deref().cloned().unwrap_or_else(TokenKey::random);
        let set = redis::cmd("SET").arg(&name).arg(offer.to_hex()).arg("NX").clone();
        self.query::<Option<String>>(set).await?;
        let value: Option<String> = self.query(redis::cmd("GET").arg(&name).clone()).await?;
        // The value is a secret: never in an error message.
        let key = value.as_deref().and_then(TokenKey::from_hex).ok_or_else(|| StoreError::BadReply {
            script: "GET <prefix>:#tokenkey",
            reply: "not 64 hex digits".into(),
        })?;
        self.token_key.store(Some(Arc::new(key)));
        Ok(())
    }

    /// Whether the access-token key has been read ([`RedisStore::load_token_key`]).
    pub fn has_token_key(&self) -> bool {
        self.token_key.load().is_some()
    }

    /// `[store] timeout`: how long one command may take.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// How many times the sentinels named another master ([`Connections::master_generation`]).
    pub fn master_generation(&self) -> u64 {
        self.conns.master_generation()
    }

    /// Decide under `epoch` from now on: a decision that finds another one
    /// in Redis fails with [`StoreError::Lost`]. Ignored in a cluster.
    pub fn decide_under(&self, epoch: &str) {
        if !self.cluster {
            self.epoch.store(Some(Arc::new(epoch.to_owned())));
        }
    }

    /// Adds `pending` (counts admitted elsewhere, a lost penalty) to Redis;
    /// returns the store's now.
    pub async fn reconcile(&self, pending: &Pending) -> Result<Micros, StoreError> {
        let mut inv = protocol::RECONCILE.key(self.keys.state_named(&pending.account, &pending.rule));
        inv.arg(self.now_arg());
        protocol::reconcile_args(&mut inv, pending, self.keys.inst());
        let epoch = self.epoch.load();
        if let Some(e) = epoch.as_deref() {
            inv.key(&self.epoch_key).arg(e.as_str());
        }
        let now = match self.run(inv).await? {
            -1 => return Err(StoreError::Lost),
            now => now,
        };
        // A penalty restored (reconcile.lua keeps a later one Redis holds).
        if let Some(p) = pending.penalty.filter(|p| p.until > now) {
            let end = crate::store::PenaltyEnd { until: p.until, now };
            self.note_penalty(&pending.account, &pending.rule, crate::store::pair_op::PenaltyNote::Raised(end)).await;
        }
        Ok(now)
    }
}

/// Its script (or command) on this thread's connection within the timeout.
impl Runs for RedisStore {
    async fn run_op<O: Operation>(&self, key: Key<'_>, op: &O) -> Result<O::Out, StoreError> {
        let reply = match op.command(&self.keys, key, &self.now_arg()) {
            Command::Script(mut inv) => {
                let epoch = self.epoch.load();
                if let (true, Some(e)) = (O::CHECKS_EPOCH, epoch.as_deref()) {
                    inv.key(&self.epoch_key).arg(e.as_str());
                }
                self.run(inv).await?
            }
            Command::Plain(cmd) => self.query(cmd).await?,
        };
        let out = O::reply(key, reply)?;
        if let Some(note) = O::penalty_note(&out) {
            self.note_penalty(key.account, &key.rule.state, note).await;
        }
        Ok(out)
    }
}

#[async_trait]
impl Store for RedisStore {
    async fn run(&self, key: Key<'_>, op: PairOp<'_>) -> Result<PairReply, StoreError> {
        op.run_on(self, key).await
    }

    fn tokens(&self) -> &dyn TokenStore {
        self
    }

    async fn acquire(&self, ask: &Ask<'_>) -> Result<Decided, StoreError> {
        Ok(Decided { decision: self.decide(ask).await?, degraded: false })
    }

    async fn clear(&self, keys: &[Key<'_>]) -> Result<(), StoreError> {
        let Some((&first, rest)) = keys.split_first() else { return Ok(()) };
        let mut inv = protocol::CLEAR.key(self.state_key(first));
        for &key in rest {
            inv.key(self.state_key(key));
        }
        inv.arg(self.now_arg()).arg(first.offset_us);
        self.run::<i64>(inv).await?;
        self.unnote_penalties(keys).await;
        Ok(())
    }

    async fn penalised(&self, max: usize) -> Result<Vec<super::Penalised>, StoreError> {
        self.penalised_pairs(max).await
    }

    async fn token_refreshed(&self, account: &str, keep_us: Micros) -> Result<(), StoreError> {
        let mut inv = protocol::WARM.key(self.keys.warm(account));
        inv.arg(self.now_arg()).arg((keep_us / 1000).max(1000));
        self.run::<i64>(inv).await.map(|_| ())
    }

    fn status(&self) -> Status {
        Status::Shared
    }

    async fn attach_worker(&self) {
        self.conns.attach_worker().await;
    }
}

#[async_trait]
impl TokenStore for RedisStore {
    fn token_hash(&self, token: &[u8]) -> Option<TokenHash> {
        self.token_key.load().as_deref().map(|k| k.hash(token))
    }

    async fn learn_token(&self, hash: &TokenHash, account: &str, ttl_us: Micros) -> Result<(), StoreError> {
        let mut inv = protocol::LEARN_TOKEN.key(self.keys.token(hash));
        inv.arg(self.now_arg()).arg(account).arg(ttl_us);
        self.run::<i64>(inv).await.map(|_| ())
    }

    async fn token_owner(&self, hash: &TokenHash) -> Result<Option<TokenOwner>, StoreError> {
        let mut inv = protocol::TOKEN_OWNER.key(self.keys.token(hash));
        inv.arg(self.now_arg());
        let (account, until, now): TokenOwnerReply = self.run(inv).await?;
        Ok((!account.is_empty()).then_some(TokenOwner { account, until, now }))
    }

    async fn claim_token(
        &self,
        slot: &str,
        holder: &str,
        min_ttl_us: Micros,
        newer_than: Micros,
        lock_us: Micros,
    ) -> Result<Claim, StoreError> {
        let (entry, lock) = self.keys.token_slot(slot);
        let mut inv = protocol::TOKEN_CLAIM.key(entry);
        inv.key(lock).arg(self.now_arg()).arg(holder).arg(min_ttl_us).arg(newer_than).arg(lock_us.max(1000));
        protocol::parse_claim(self.run(inv).await?)
    }

    async fn token_fetched(&self, slot: &str, holder: &str, fetched: Fetched<'_>) -> Result<(), StoreError> {
        let (entry, lock) = self.keys.token_slot(slot);
        let mut inv = protocol::TOKEN_FETCHED.key(entry);
        inv.key(lock);
        inv.arg(self.now_arg()).arg(holder);
        match fetched {
            Fetched::Token { entry, hash, ttl_us } => {
                inv.key(self.keys.token_slot_of(&hash));
                inv.arg("token").arg(entry).arg(hash.to_hex()).arg(ttl_us);
            }
            Fetched::Failed { answer, hold_us } => {
                inv.key(self.keys.token_slots());
                inv.arg("failed").arg(answer).arg("").arg(hold_us);
            }
            Fetched::Abandoned => {
                inv.key(self.keys.token_slots());
                inv.arg("abandoned").arg("").arg("").arg(0);
            }
        }
        inv.arg(slot);
        self.run::<i64>(inv).await.map(|_| ())
    }

    async fn drop_token(&self, hash: &TokenHash, kinds: &[&str]) -> Result<bool, StoreError> {
        let mut inv = protocol::TOKEN_DROP.key(self.keys.token_slot_of(hash));
        inv.arg(self.keys.token_slots()).arg(hash.to_hex()).arg(self.now_arg()).arg(kinds.join(" "));
        self.run::<i64>(inv).await.map(|n| n == 1)
    }
}
