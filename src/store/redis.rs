//! The shared store: decision state in Redis, every decision one atomic Lua
//! script (`lua/acquire.lua`) run by SHA, so two instances can never both take
//! the last token. The clock is Redis `TIME`, never an instance's clock.
//!
//! Keys are `<prefix>:{<account>}:<rule>`: one hash per (account, rule), with
//! the account as hash tag so every key a call touches sits in one Redis
//! Cluster slot. Each key carries a TTL covering the longest time any of its
//! state matters, so idle accounts and retired rules vanish by themselves.
//! One multiplexed connection per instance, reconnected automatically; one
//! round trip per decision, admitted or refused.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::Script;

use super::batch::{Answer, Batcher, Joined};
use super::shared::Resilience;
use super::{Asking, StoreError};
use crate::clock::{Clock, Micros};
use std::collections::HashMap;

use crate::limit::{Decision, Limit, LimitState, Quota, Reason, Rule, RuleState};
use crate::penalty::PenaltyState;
use crate::penalty::{PenaltyLength, PenaltyPolicy};

pub const ACQUIRE_LUA: &str = concat!(include_str!("../../lua/prelude.lua"), include_str!("../../lua/acquire.lua"));
pub const PENALISE_LUA: &str = concat!(include_str!("../../lua/prelude.lua"), include_str!("../../lua/penalise.lua"));
pub const SUCCEEDED_LUA: &str = concat!(include_str!("../../lua/prelude.lua"), include_str!("../../lua/succeeded.lua"));
/// How long start-up waits for Redis before starting degraded.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

pub const WARM_LUA: &str = concat!(include_str!("../../lua/prelude.lua"), include_str!("../../lua/warm.lua"));
pub const SET_PENALTY_LUA: &str =
    concat!(include_str!("../../lua/prelude.lua"), include_str!("../../lua/set_penalty.lua"));
pub const INSPECT_LUA: &str = concat!(include_str!("../../lua/prelude.lua"), include_str!("../../lua/inspect.lua"));

/// `[store] kind = "redis"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisConfig {
    /// `redis://` or `rediss://` (TLS with rustls) URL, password possibly inside.
    pub url: String,
    /// Used when the URL has no password.
    pub password: Option<String>,
    pub key_prefix: String,
    /// Budget for one decision, round trip included.
    pub timeout: Duration,
    /// Redis Cluster seed nodes (`kind = "redis-cluster"`); empty for one server.
    pub nodes: Vec<String>,
    /// What to do while Redis cannot answer.
    pub resilience: Resilience,
    /// Decide an account's concurrent calls together, one script run per
    /// round trip ([`super::batch`]); `false`: one run per call.
    pub batch: bool,
}

/// One multiplexed connection (auto-reconnecting), or a cluster connection
/// (MOVED/ASK handled by the client, topology refreshed on its own).
#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// What a serving thread needs to open its own connection.
enum Opener {
    Single(redis::Client, ConnectionManagerConfig),
    Cluster(redis::cluster::ClusterClient),
}

/// Most calls one acquire.lua run decides (Redis runs nothing else meanwhile).
const MAX_BATCH: usize = 64;

/// A connection and the decisions queued for it.
#[derive(Default)]
struct Lane {
    conn: OnceLock<Conn>,
    batcher: Batcher<Call>,
}

/// One call's part of an acquire.lua run, taken when the call arrives and
/// written straight into the EVALSHA command (no intermediate strings).
struct Call {
    keys: [String; 3],
    offset_us: Micros,
    /// max wait, warm-up, concurrency cap, lease, number of limits.
    numbers: [i64; 5],
    holder: String,
    /// kind, field, a, b per limit (see acquire.lua).
    limits: Vec<(&'static str, String, i64, i64)>,
}

impl Call {
    /// This call's values, in acquire.lua's order.
    fn write_args(&self, cmd: &mut redis::Cmd) {
        let [max_wait, warmup, conc, lease, n] = self.numbers;
        cmd.arg(max_wait).arg(warmup).arg(conc).arg(self.holder.as_str()).arg(lease).arg(n);
        for (kind, field, a, b) in &self.limits {
            cmd.arg(*kind).arg(field.as_str()).arg(*a).arg(*b);
        }
    }
}

pub struct RedisStore {
    /// Used off the serving threads (probes, admin API, lease renewal), and
    /// by a serving thread whose own connection could not be made.
    conn: Conn,
    /// Decisions queued for `conn`.
    batcher: Batcher<Call>,
    /// Each serving thread's own connection ([`crate::worker`]), opened on
    /// that thread's runtime by [`RedisStore::attach_worker`] so that a
    /// round trip never crosses threads.
    per_worker: Box<[Lane]>,
    opener: Opener,
    /// Coalesce concurrent decisions of an account ([`super::batch`]).
    batch: bool,
    prefix: String,
    timeout: Duration,
    /// Tests only: pass this clock's time to the scripts instead of `TIME`.
    fixed_clock: Option<Arc<dyn Clock>>,
    acquire: Script,
    penalise: Script,
    succeeded: Script,
    warm: Script,
    set_penalty: Script,
    inspect: Script,
}

impl RedisStore {
    async fn open(cfg: &RedisConfig, lazy: bool) -> Result<RedisStore, StoreError> {
        let mut info: redis::ConnectionInfo = redis::IntoConnectionInfo::into_connection_info(cfg.url.as_str())
            .map_err(|e| StoreError::Unavailable(format!("[store] url: {e}")))?;
        if let Some(pw) = &cfg.password {
            if info.redis_settings().password().is_none() {
                let settings = info.redis_settings().clone().set_password(pw.clone());
                info = info.set_redis_settings(settings);
            }
        }
        // The address only: the URL may carry the password.
        let at = info.addr().to_string();
        let cannot = |e: redis::RedisError| {
            let msg = format!("cannot use Redis at {at}: {e}");
            if e.is_io_error() || e.is_connection_refusal() || e.is_timeout() || e.is_connection_dropped() {
                StoreError::Unreachable(msg)
            } else {
                StoreError::Unavailable(msg)
            }
        };
        let (conn, opener) = if cfg.nodes.is_empty() {
            let client = redis::Client::open(info).map_err(cannot)?;
            let manager_config = Self::manager_config(cfg);
            let conn = Self::single(client.clone(), manager_config.clone(), lazy, &at, &cannot).await?;
            (Conn::Single(conn), Opener::Single(client, manager_config))
        } else {
            let client = Self::cluster_client(cfg).map_err(cannot)?;
            (Conn::Cluster(Self::cluster(&client, &at, &cannot).await?), Opener::Cluster(client))
        };
        let store = RedisStore {
            conn,
            batcher: Batcher::default(),
            per_worker: Box::new([]),
            opener,
            batch: cfg.batch,
            prefix: cfg.key_prefix.clone(),
            timeout: cfg.timeout,
            fixed_clock: None,
            acquire: Script::new(ACQUIRE_LUA),
            penalise: Script::new(PENALISE_LUA),
            succeeded: Script::new(SUCCEEDED_LUA),
            warm: Script::new(WARM_LUA),
            set_penalty: Script::new(SET_PENALTY_LUA),
            inspect: Script::new(INSPECT_LUA),
        };
        if !lazy {
            let mut conn = store.conn();
            for script in
                [&store.acquire, &store.penalise, &store.succeeded, &store.warm, &store.set_penalty, &store.inspect]
            {
                match tokio::time::timeout(CONNECT_TIMEOUT, script.prepare_invoke().load_async(&mut conn)).await {
                    Ok(loaded) => loaded.map_err(cannot)?,
                    Err(_) => {
                        return Err(StoreError::Unreachable(format!("cannot use Redis at {at}: SCRIPT LOAD timed out")))
                    }
                };
            }
        }
        Ok(store)
    }

    fn cluster_client(cfg: &RedisConfig) -> redis::RedisResult<redis::cluster::ClusterClient> {
        let mut builder = ClusterClientBuilder::new(cfg.nodes.clone())
            .connection_timeout(cfg.timeout.max(Duration::from_millis(500)))
            .response_timeout(cfg.timeout)
            .retries(1);
        if let Some(pw) = &cfg.password {
            builder = builder.password(pw.clone());
        }
        builder.build()
    }

    async fn cluster(
        client: &redis::cluster::ClusterClient,
        at: &str,
        cannot: &impl Fn(redis::RedisError) -> StoreError,
    ) -> Result<ClusterConnection, StoreError> {
        match tokio::time::timeout(CONNECT_TIMEOUT, client.get_async_connection()).await {
            Ok(conn) => conn.map_err(cannot),
            Err(_) => Err(StoreError::Unreachable(format!(
                "cannot use Redis Cluster at {at}: no answer within {CONNECT_TIMEOUT:?}"
            ))),
        }
    }

    fn manager_config(cfg: &RedisConfig) -> ConnectionManagerConfig {
        ConnectionManagerConfig::new()
            .set_connection_timeout(Some(cfg.timeout.max(Duration::from_millis(500))))
            .set_response_timeout(Some(cfg.timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_secs(1))
    }

    async fn single(
        client: redis::Client,
        manager_config: ConnectionManagerConfig,
        lazy: bool,
        at: &str,
        cannot: &impl Fn(redis::RedisError) -> StoreError,
    ) -> Result<ConnectionManager, StoreError> {
        let conn = if lazy {
            ConnectionManager::new_lazy_with_config(client, manager_config).map_err(cannot)?
        } else {
            match tokio::time::timeout(CONNECT_TIMEOUT, ConnectionManager::new_with_config(client, manager_config))
                .await
            {
                Ok(conn) => conn.map_err(cannot)?,
                Err(_) => {
                    return Err(StoreError::Unreachable(format!(
                        "cannot use Redis at {at}: no answer within {CONNECT_TIMEOUT:?}"
                    )))
                }
            }
        };
        Ok(conn)
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
        self.per_worker = (0..workers).map(|_| Lane::default()).collect();
        self
    }

    /// How many serving threads have a place here ([`RedisStore::with_workers`]).
    pub fn workers(&self) -> usize {
        self.per_worker.len()
    }

    /// Opens this serving thread's own connection, on its runtime. A single
    /// server's connection is made on first use (no I/O here); a cluster's
    /// is made now, and if that fails the thread uses the shared one.
    pub async fn attach_worker(&self) {
        let Some(lane) = crate::worker::current().and_then(|i| self.per_worker.get(i)) else { return };
        let conn = match &self.opener {
            Opener::Single(client, config) => {
                match ConnectionManager::new_lazy_with_config(client.clone(), config.clone()) {
                    Ok(c) => Conn::Single(c),
                    Err(e) => {
                        tracing::warn!(error = %e, "a serving thread uses the shared Redis connection");
                        return;
                    }
                }
            }
            Opener::Cluster(client) => {
                match tokio::time::timeout(CONNECT_TIMEOUT, client.get_async_connection()).await {
                    Ok(Ok(c)) => Conn::Cluster(c),
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "a serving thread uses the shared Redis Cluster connection");
                        return;
                    }
                    Err(_) => {
                        tracing::warn!("a serving thread uses the shared Redis Cluster connection (connect timed out)");
                        return;
                    }
                }
            }
        };
        let _ = lane.conn.set(conn);
    }

    /// This thread's connection and its queue: its own, or the shared ones.
    fn lane(&self) -> (&Conn, &Batcher<Call>) {
        let own = crate::worker::current().and_then(|i| self.per_worker.get(i));
        match own.and_then(|lane| Some((lane.conn.get()?, &lane.batcher))) {
            Some(lane) => lane,
            None => (&self.conn, &self.batcher),
        }
    }

    /// This thread's connection.
    fn conn(&self) -> Conn {
        self.lane().0.clone()
    }

    /// Whether Redis answers a PING within the decision timeout.
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.query::<String>(redis::cmd("PING")).await.map(|_| ())
    }

    /// Tests only: decide on `clock`'s time instead of Redis `TIME`.
    pub fn with_fixed_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.fixed_clock = Some(clock);
        self
    }

    /// `<prefix>:{<account>}:<tail>`, built without the formatting machinery
    /// (three of these per decision).
    fn account_key(&self, account: &str, tail: &[&str]) -> String {
        let len = self.prefix.len() + account.len() + 4 + tail.iter().map(|t| t.len()).sum::<usize>();
        let mut key = String::with_capacity(len);
        key.push_str(&self.prefix);
        key.push_str(":{");
        key.push_str(account);
        key.push_str("}:");
        for t in tail {
            key.push_str(t);
        }
        key
    }

    /// `<prefix>:{<account>}:<rule>`: the state hash.
    pub fn key(&self, account: &str, rule: &Rule) -> String {
        self.account_key(account, &[&rule.name])
    }

    /// `<prefix>:{<account>}:<rule>:c`: concurrency slots (holder → lease expiry).
    fn slots_key(&self, account: &str, rule: &Rule) -> String {
        self.account_key(account, &[&rule.name, ":c"])
    }

    /// `<prefix>:{<account>}:#warm`: last token refresh (`#` never appears in a rule name).
    fn warm_key(&self, account: &str) -> String {
        self.account_key(account, &["#warm"])
    }

    fn now_arg(&self) -> String {
        self.fixed_clock.as_ref().map(|c| c.now_us().to_string()).unwrap_or_default()
    }

    async fn run<T: redis::FromRedisValue>(&self, inv: redis::ScriptInvocation<'_>) -> Result<T, StoreError> {
        let mut conn = self.conn();
        match tokio::time::timeout(self.timeout, inv.invoke_async(&mut conn)).await {
            Ok(result) => result.map_err(unavailable),
            Err(_) => Err(StoreError::Unavailable(format!("Redis did not answer within {:?}", self.timeout))),
        }
    }

    /// Decides one call. With `[store] batch` (the default), calls of an
    /// account that arrive while a decision of it is in flight on this
    /// thread's connection are decided together in the next run.
    pub async fn acquire(&self, account: &str, rule: &Rule, asking: &Asking<'_>) -> Result<Decision, StoreError> {
        let mut call = self.encode(account, rule, asking);
        if !self.batch {
            let deadline = tokio::time::Instant::now() + self.timeout;
            let mut results = self.run_acquire(&[call], deadline).await?;
            return results.pop().unwrap_or_else(|| Err("no answer".into())).map_err(StoreError::Unavailable);
        }
        let (_, batcher) = self.lane();
        let deadline = tokio::time::Instant::now() + self.timeout;
        loop {
            let mut leader = match batcher.join(account, call) {
                Joined::Lead(leader) => leader,
                Joined::Wait(mut waiting) => match tokio::time::timeout_at(deadline, waiting.answer()).await {
                    Ok(Ok(Answer::Decided(result))) => return result.map_err(StoreError::Unavailable),
                    Ok(Ok(Answer::Lead(own))) => batcher.lead(account, own),
                    // The run this call was taken into was abandoned (its
                    // leader's client left): decide again.
                    Ok(Err(_)) => {
                        call = self.encode(account, rule, asking);
                        continue;
                    }
                    Err(_) => {
                        return Err(StoreError::Unavailable(format!("Redis did not answer within {:?}", self.timeout)))
                    }
                },
            };
            leader.take(MAX_BATCH, |first, next| first.offset_us == next.offset_us);
            let results = self.run_acquire(&leader.calls, deadline).await.map_err(|e| e.to_string());
            return leader.finish(results).map_err(StoreError::Unavailable);
        }
    }

    /// A call's keys and values for acquire.lua.
    fn encode(&self, account: &str, rule: &Rule, asking: &Asking<'_>) -> Call {
        let limits = rule
            .limits
            .iter()
            .map(|limit| {
                let label = limit.window_key().label();
                match limit {
                    Limit::Window(w) => ("w", label, w.interval_us, w.tolerance_us),
                    Limit::Calendar { count, period } => (period.as_str(), label, *count as i64, 0),
                }
            })
            .collect();
        Call {
            keys: [self.key(account, rule), self.warm_key(account), self.slots_key(account, rule)],
            offset_us: asking.offset_us,
            numbers: [
                asking.max_wait_us,
                rule.warmup_us,
                i64::from(rule.concurrency),
                asking.lease_us,
                rule.limits.len() as i64,
            ],
            holder: asking.holder.to_owned(),
            limits,
        }
    }

    /// Runs acquire.lua once for `calls` (one account's, same offset),
    /// giving up at `deadline` (the first call's decision budget).
    async fn run_acquire(
        &self,
        calls: &[Call],
        deadline: tokio::time::Instant,
    ) -> Result<Vec<Result<Decision, String>>, StoreError> {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.acquire.get_hash()).arg(calls.len() * 3);
        for call in calls {
            for key in &call.keys {
                cmd.arg(key.as_str());
            }
        }
        cmd.arg(self.now_arg()).arg(calls.first().map_or(0, |c| c.offset_us));
        for call in calls {
            call.write_args(&mut cmd);
        }
        let mut conn = self.conn();
        let reply = tokio::time::timeout_at(deadline, async {
            match cmd.query_async::<String>(&mut conn).await {
                // Redis lost its script cache (restart, failover, SCRIPT
                // FLUSH): load the script and run the same command once more.
                Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                    self.acquire.load_async(&mut conn).await?;
                    cmd.query_async::<String>(&mut conn).await
                }
                other => other,
            }
        })
        .await;
        let reply = match reply {
            Ok(r) => r.map_err(unavailable)?,
            Err(_) => return Err(StoreError::Unavailable(format!("Redis did not answer within {:?}", self.timeout))),
        };
        Ok(reply.split(',').map(parse_decision).collect())
    }

    pub async fn penalise(
        &self,
        account: &str,
        rule: &Rule,
        policy: &PenaltyPolicy,
        sent_at: Micros,
        offset_us: Micros,
    ) -> Result<(Micros, Micros), StoreError> {
        let (kind, base) = match policy.length {
            PenaltyLength::Escalating { base_us } => ("e", base_us),
            PenaltyLength::NextMinute => ("m", 0),
        };
        let mut inv = self.penalise.key(self.key(account, rule));
        inv.arg(self.now_arg()).arg(offset_us).arg(kind).arg(base).arg(policy.max_us.unwrap_or(0)).arg(sent_at);
        let reply: Vec<i64> = self.run(inv).await?;
        match reply.as_slice() {
            [until, now] => Ok((*until, *now)),
            other => Err(StoreError::Unavailable(format!("penalise.lua answered {other:?}"))),
        }
    }

    pub async fn succeeded(&self, account: &str, rule: &Rule, sent_at: Micros) -> Result<(), StoreError> {
        let mut inv = self.succeeded.key(self.key(account, rule));
        inv.arg(sent_at);
        let _: i64 = self.run(inv).await?;
        Ok(())
    }
}

impl RedisStore {
    /// Frees a concurrency slot.
    pub async fn release(&self, account: &str, rule: &Rule, holder: &str) -> Result<(), StoreError> {
        let cmd = redis::cmd("ZREM").arg(self.slots_key(account, rule)).arg(holder).clone();
        self.query::<i64>(cmd).await.map(|_| ())
    }

    /// Extends live slots' leases (`ZADD XX`: a slot already freed stays free).
    pub async fn renew(
        &self,
        account: &str,
        rule: &Rule,
        holders: &[&str],
        lease_us: Micros,
    ) -> Result<(), StoreError> {
        let now = match &self.fixed_clock {
            Some(c) => c.now_us(),
            None => self.time().await?,
        };
        let key = self.slots_key(account, rule);
        let mut cmd = redis::cmd("ZADD");
        cmd.arg(&key).arg("XX");
        for h in holders {
            cmd.arg(now + lease_us).arg(*h);
        }
        self.query::<i64>(cmd).await?;
        let mut expire = redis::cmd("PEXPIRE");
        expire.arg(&key).arg(lease_us / 1000 + 1000);
        self.query::<i64>(expire).await.map(|_| ())
    }

    /// Warm-up starts again for `account` (an access token was refreshed).
    pub async fn token_refreshed(&self, account: &str, keep_us: Micros) -> Result<(), StoreError> {
        let mut inv = self.warm.key(self.warm_key(account));
        inv.arg(self.now_arg()).arg((keep_us / 1000).max(1000));
        self.run::<i64>(inv).await.map(|_| ())
    }

    /// Imposes a penalty of `len_us` (0 lifts it); returns (until, now).
    pub async fn set_penalty(
        &self,
        account: &str,
        rule: &Rule,
        len_us: Micros,
    ) -> Result<(Micros, Micros), StoreError> {
        let mut inv = self.set_penalty.key(self.key(account, rule));
        inv.arg(self.now_arg()).arg(len_us);
        let reply: Vec<i64> = self.run(inv).await?;
        match reply.as_slice() {
            [until, now] => Ok((*until, *now)),
            other => Err(StoreError::Unavailable(format!("set_penalty.lua answered {other:?}"))),
        }
    }

    /// The state of one (account, rule) now, read atomically (`inspect.lua`).
    pub async fn inspect(&self, account: &str, rule: &Rule) -> Result<(RuleState, Micros), StoreError> {
        let mut inv = self.inspect.key(self.key(account, rule));
        inv.key(self.slots_key(account, rule)).arg(self.now_arg());
        type Reply = (i64, HashMap<String, i64>, Vec<(String, i64)>);
        let (now, fields, slots): Reply = self.run(inv).await?;
        let get = |f: &str| fields.get(f).copied();
        let mut state = RuleState::default();
        for limit in &rule.limits {
            let key = limit.window_key();
            let label = key.label();
            match limit {
                Limit::Window(_) => {
                    if let Some(tat) = get(&label) {
                        state.limits.push((key, LimitState::Tat(tat)));
                    }
                }
                Limit::Calendar { .. } => {
                    if let Some(p) = get(&format!("{label}.p")) {
                        let used = get(&format!("{label}.n")).unwrap_or(0).max(0) as u64;
                        let next = get(&format!("{label}.q")).unwrap_or(0).max(0) as u64;
                        state.limits.push((key, LimitState::Count { period_id: p, used, next }));
                    }
                }
            }
        }
        state.penalty = PenaltyState {
            until: get("pu").unwrap_or(0),
            started: get("ps").unwrap_or(0),
            level: get("pl").unwrap_or(0).clamp(0, i64::from(u32::MAX)) as u32,
            last_len: get("pn").unwrap_or(0),
        };
        state.warm_start = get("ws").unwrap_or(0);
        state.last_call = get("lc").unwrap_or(0);
        state.holders = slots;
        Ok((state, now))
    }

    async fn time(&self) -> Result<Micros, StoreError> {
        let (secs, micros): (i64, i64) = self.query(redis::cmd("TIME")).await?;
        Ok(secs * 1_000_000 + micros)
    }

    async fn query<T: redis::FromRedisValue>(&self, cmd: redis::Cmd) -> Result<T, StoreError> {
        let mut conn = self.conn();
        match tokio::time::timeout(self.timeout, cmd.query_async(&mut conn)).await {
            Ok(result) => result.map_err(unavailable),
            Err(_) => Err(StoreError::Unavailable(format!("Redis did not answer within {:?}", self.timeout))),
        }
    }
}

fn unavailable(e: redis::RedisError) -> StoreError {
    StoreError::Unavailable(format!("Redis: {e}"))
}

/// One decision of acquire.lua's answer: "1 at escalated hold qi qr qt" or
/// "0 wait reason".
fn parse_decision(answer: &str) -> Result<Decision, String> {
    let mut numbers = [0i64; 7];
    let mut n = 0;
    for word in answer.split(' ') {
        match word.parse::<i64>() {
            Ok(x) if n < numbers.len() => numbers[n] = x,
            _ => return Err(format!("acquire.lua answered {answer:?}")),
        }
        n += 1;
    }
    match &numbers[..n] {
        [1, at, escalated, hold_us, qi, qr, qt] => Ok(Decision::Admit {
            at: *at,
            hold_us: *hold_us,
            escalated: *escalated == 1,
            quota: (*qi > 0).then(|| Quota {
                limit: (*qi - 1) as usize,
                remaining: (*qr).max(0) as u64,
                reset_us: *qt,
            }),
        }),
        [0, wait_us, reason] => {
            let reason = match reason {
                1 => Reason::Rate,
                2 => Reason::Quota,
                4 => Reason::Concurrency,
                _ => Reason::Penalty,
            };
            Ok(Decision::Reject { wait_us: *wait_us, reason })
        }
        _ => Err(format!("acquire.lua answered {answer:?}")),
    }
}
