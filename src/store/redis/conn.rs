//! Connections to Redis: one per serving thread ([`crate::transport::worker`]), made on
//! that thread's runtime so a round trip never crosses threads, plus a shared
//! one for everything else (the admin API, the breaker's probe, lease
//! renewal, and a serving thread whose own connection could not be made).
//!
//! A single server's connections are multiplexed and reconnect by
//! themselves after I/O errors (`ConnectionManager`); a cluster's follow
//! MOVED/ASK and refresh the topology on their own.
//!
//! Neither recovers from everything: a `ConnectionManager` whose reconnect
//! failed authentication (a password changed for a moment) keeps answering
//! that error for good. So a lane whose call fails with an error the
//! connection will not get over by itself ([`fault_of`]), or that keeps
//! failing, gets a new connection ([`Connections::failed`]): at most once per
//! `[store] breaker_open` per lane, made lazily on that lane's own thread,
//! and nothing is done on success.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use arc_swap::{ArcSwap, ArcSwapOption};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::{ErrorKind, ServerErrorKind};

use crate::config::{RedisConfig, SentinelConfig};
use crate::store::answer::StoreError;
use crate::time::Stopwatch;

/// How long start-up waits for Redis before starting degraded.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Failures of any kind after which a lane's connection is replaced even if
/// no single one said it had to be (a connection that times out for ever,
/// say). Counted since the last replacement; successes leave it alone.
const REPEATED: u32 = 5;

/// Replacements are logged at most once per this long.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// One connection to a single server or to a cluster.
#[derive(Clone)]
pub enum Conn {
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
    Cluster(ClusterClient),
    /// A Sentinel-managed master: a single server whose address the
    /// sentinels give, followed by [`Sentinel::watch`].
    Sentinel(Arc<Sentinel>, ConnectionManagerConfig),
}

/// How often the sentinels are asked where the master is. A failover
/// takes the sentinels about 1.5 s (down-after 500 ms); calls are decided
/// on the new master this long after they name it, at most.
pub const SENTINEL_EVERY: Duration = Duration::from_millis(250);

/// The master the sentinels name now, and how many times it moved.
pub struct Sentinel {
    cfg: SentinelConfig,
    /// The master's connection settings but its address (user, password,
    /// database, TLS), from `[store]`.
    info: redis::ConnectionInfo,
    tls_ca: Option<Vec<u8>>,
    current: ArcSwap<(String, redis::Client)>,
    /// Bumped each time the master moves: every lane that saw an older
    /// one gets a new connection on its next call.
    generation: AtomicU64,
}

impl Sentinel {
    /// The current master's client.
    fn client(&self) -> redis::Client {
        self.current.load().1.clone()
    }

    /// A client for the master at `host:port`.
    fn client_at(&self, host: &str, port: u16) -> redis::RedisResult<redis::Client> {
        master_client(&self.info, self.tls_ca.as_deref(), host, port)
    }
}

/// A client for a Sentinel master at `host:port` with `info`'s settings.
fn master_client(
    info: &redis::ConnectionInfo,
    tls_ca: Option<&[u8]>,
    host: &str,
    port: u16,
) -> redis::RedisResult<redis::Client> {
    let tls = matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. });
    let addr = if tls {
        redis::ConnectionAddr::TcpTls { host: host.to_owned(), port, insecure: false, tls_params: None }
    } else {
        redis::ConnectionAddr::Tcp(host.to_owned(), port)
    };
    let info = info.clone().set_addr(addr);
    match tls_ca {
        None => redis::Client::open(info),
        Some(ca) => redis::Client::build_with_tls(info, certificates(ca)),
    }
}

impl Sentinel {
    /// Where the sentinels say the master is: the first sentinel that
    /// answers, each asked within [`CONNECT_TIMEOUT`] / 4.
    async fn ask(cfg: &SentinelConfig) -> Result<(String, u16), String> {
        let mut why = String::from("no sentinel configured");
        for url in &cfg.sentinels {
            let mut info = match redis::IntoConnectionInfo::into_connection_info(url.as_str()) {
                Ok(info) => info,
                Err(e) => {
                    why = format!("[store] sentinels: {e}");
                    continue;
                }
            };
            if let (Some(pw), None) = (&cfg.password, info.redis_settings().password()) {
                let settings = info.redis_settings().clone().set_password(pw.clone());
                info = info.set_redis_settings(settings);
            }
            let at = info.addr().to_string();
            let asked = async {
                let client = redis::Client::open(info)?;
                let mut conn = client.get_multiplexed_async_connection().await?;
                redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(&cfg.master)
                    .query_async::<Option<(String, u16)>>(&mut conn)
                    .await
            };
            match tokio::time::timeout(CONNECT_TIMEOUT / 4, asked).await {
                Ok(Ok(Some(addr))) => return Ok(addr),
                Ok(Ok(None)) => why = format!("sentinel {at} monitors no master named \"{}\"", cfg.master),
                Ok(Err(e)) => why = format!("sentinel {at}: {e}"),
                Err(_) => why = format!("sentinel {at}: no answer"),
            }
        }
        Err(why)
    }

    /// Asks the sentinels every [`SENTINEL_EVERY`] where the master is, and
    /// moves every connection to it when it moved (a failover), for as long
    /// as the store lives.
    fn watch(me: Weak<Sentinel>) {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(SENTINEL_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(s) = me.upgrade() else { return };
                let Ok((host, port)) = Sentinel::ask(&s.cfg).await else { continue };
                let addr = format!("{host}:{port}");
                if s.current.load().0 == addr {
                    continue;
                }
                match s.client_at(&host, port) {
                    Ok(client) => {
                        let was = s.current.load().0.clone();
                        s.current.store(Arc::new((addr.clone(), client)));
                        s.generation.fetch_add(1, Ordering::Release);
                        tracing::warn!(master = %s.cfg.master, from = %was, to = %addr, "the sentinels name a new Redis master: connections move to it");
                    }
                    Err(e) => tracing::warn!(error = %e, "cannot use the master the sentinels name"),
                }
            }
        });
    }
}

/// Which connection a piece of code uses: a serving thread's own, or the shared one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    Own(usize),
    Shared,
}

/// What an error says about the connection it came on ([`fault_of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnFault {
    /// It will not recover by itself: replace it.
    Broken,
    /// Redis answered (a full memory, still loading, a busy script), or the
    /// connection's own reconnecting handles it, or a call timed out:
    /// replaced only when failures repeat.
    Transient,
}

/// Whether `e` means its connection must be replaced:
/// - authentication refused (`AuthenticationFailed`, `NOAUTH`, `WRONGPASS`):
///   a reconnect that failed authentication is never retried by the
///   connection manager;
/// - `READONLY` / `MASTERDOWN`: the connection reaches a replica, e.g. an
///   old master after a failover; a new one may reach the new master;
/// - a reply that could not be parsed, or a client-side error (a connection
///   in an unknown state).
///
/// Everything else is transient: `OOM`, `LOADING` (heals by waiting),
/// `BUSY`, script errors, cluster redirections, and I/O errors (the manager
/// reconnects after those by itself).
pub fn fault_of(e: &redis::RedisError) -> ConnFault {
    let broken = match e.kind() {
        ErrorKind::AuthenticationFailed | ErrorKind::Parse | ErrorKind::Client => true,
        ErrorKind::ClusterConnectionNotFound => true,
        ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown) => true,
        ErrorKind::Extension => matches!(e.code(), Some("NOAUTH" | "WRONGPASS")),
        _ => false,
    };
    if broken {
        ConnFault::Broken
    } else {
        ConnFault::Transient
    }
}

/// When replacements were last logged, and how many happened since.
#[derive(Default)]
struct ReplaceLog {
    last: Option<Stopwatch>,
    unlogged: u64,
}

/// When a lane's connection was last replaced, and its failures since.
#[derive(Default)]
struct Health {
    rebuilt: Option<Stopwatch>,
    failures: u32,
}

/// A serving thread's own connection (none until it is attached, or if a
/// cluster connection could not be made) and its health.
struct Own {
    conn: Arc<ArcSwapOption<Conn>>,
    health: Mutex<Health>,
    /// The Sentinel master generation its connection is to.
    seen: AtomicU64,
}

/// Where a replacement goes.
enum Place {
    Shared(Arc<ArcSwap<Conn>>),
    Own(Arc<ArcSwapOption<Conn>>),
}

impl Place {
    fn put(&self, conn: Conn) {
        match self {
            Place::Shared(slot) => slot.store(Arc::new(conn)),
            Place::Own(slot) => slot.store(Some(Arc::new(conn))),
        }
    }
}

pub struct Connections {
    shared: Arc<ArcSwap<Conn>>,
    shared_health: Mutex<Health>,
    shared_seen: AtomicU64,
    own: Box<[Own]>,
    opener: Opener,
    /// The server's address, for messages (never the URL: it may hold the password).
    at: String,
    /// Least time between two replacements of one lane's connection.
    rebuild_every: Duration,
    log: Mutex<ReplaceLog>,
}

impl Connections {
    /// Connects to `cfg`'s server or cluster. `lazy`: make a single server's
    /// connection on first use instead (starting while Redis is away).
    pub async fn open(cfg: &RedisConfig, lazy: bool) -> Result<Connections, StoreError> {
        let mut info: redis::ConnectionInfo = redis::IntoConnectionInfo::into_connection_info(cfg.url.as_str())
            .map_err(|e| StoreError::Refused(format!("[store] url: {e}")))?;
        if let Some(pw) = &cfg.password {
            if info.redis_settings().password().is_none() {
                let settings = info.redis_settings().clone().set_password(pw.clone());
                info = info.set_redis_settings(settings);
            }
        }
        if let Some(user) = &cfg.username {
            if info.redis_settings().username().is_none() {
                let settings = info.redis_settings().clone().set_username(user);
                info = info.set_redis_settings(settings);
            }
        }
        let mut at = info.addr().to_string();
        let (shared, opener) = if let Some(sc) = &cfg.sentinel {
            let (host, port) = match Sentinel::ask(sc).await {
                Ok(addr) => addr,
                Err(e) if !lazy => {
                    return Err(StoreError::Unreachable(format!("cannot find the Redis master \"{}\": {e}", sc.master)))
                }
                // Starting degraded: the watch finds the master later.
                Err(_) => ("127.0.0.1".to_owned(), 0),
            };
            let client = master_client(&info, cfg.tls_ca.as_deref(), &host, port)
                .map_err(|e| cannot_use(&format!("{host}:{port}"), e))?;
            let sentinel = Arc::new(Sentinel {
                cfg: SentinelConfig::clone(sc),
                info,
                tls_ca: cfg.tls_ca.clone(),
                current: ArcSwap::from_pointee((format!("{host}:{port}"), client.clone())),
                generation: AtomicU64::new(0),
            });
            at = format!("sentinel master \"{}\"", sc.master);
            let manager_config = manager_config(cfg);
            let conn = single(client, manager_config.clone(), lazy, &at).await?;
            Sentinel::watch(Arc::downgrade(&sentinel));
            (Conn::Single(conn), Opener::Sentinel(sentinel, manager_config))
        } else if cfg.nodes.is_empty() {
            let client = match &cfg.tls_ca {
                None => redis::Client::open(info),
                Some(ca) => redis::Client::build_with_tls(info, certificates(ca)),
            }
            .map_err(|e| cannot_use(&at, e))?;
            let manager_config = manager_config(cfg);
            let conn = single(client.clone(), manager_config.clone(), lazy, &at).await?;
            (Conn::Single(conn), Opener::Single(client, manager_config))
        } else {
            let client = cluster_client(cfg).map_err(|e| cannot_use(&at, e))?;
            let conn = match tokio::time::timeout(CONNECT_TIMEOUT, client.get_async_connection()).await {
                Ok(conn) => conn.map_err(|e| cannot_use(&at, e))?,
                Err(_) => {
                    return Err(StoreError::Unreachable(format!(
                        "cannot use Redis Cluster at {at}: no answer within {CONNECT_TIMEOUT:?}"
                    )))
                }
            };
            (Conn::Cluster(conn), Opener::Cluster(client))
        };
        Ok(Connections {
            shared: Arc::new(ArcSwap::from_pointee(shared)),
            shared_health: Mutex::default(),
            shared_seen: AtomicU64::new(0),
            own: Box::new([]),
            opener,
            at,
            rebuild_every: cfg.resilience.breaker_open,
            log: Mutex::default(),
        })
    }

    /// Makes room for `workers` serving threads' own connections.
    pub fn with_workers(mut self, workers: usize) -> Self {
        self.own = (0..workers)
            .map(|_| Own { conn: Arc::default(), health: Mutex::default(), seen: AtomicU64::new(0) })
            .collect();
        self
    }

    /// How many serving threads have a place here.
    pub fn workers(&self) -> usize {
        self.own.len()
    }

    /// How many times the sentinels named another master since the start
    /// (0 without Sentinel).
    pub fn master_generation(&self) -> u64 {
        match &self.opener {
            Opener::Sentinel(s, _) => s.generation.load(Ordering::Acquire),
            _ => 0,
        }
    }

    /// Where messages say Redis is.
    pub fn at(&self) -> &str {
        &self.at
    }

    /// Opens this serving thread's own connection, on its runtime. A single
    /// server's connection is made on first use (no I/O here); a cluster's
    /// is made now, and if that fails the thread uses the shared one.
    pub async fn attach_worker(&self) {
        let Some(own) = crate::transport::worker::current().and_then(|i| self.own.get(i)) else { return };
        let conn = match &self.opener {
            Opener::Single(client, config) => match lazy(client, config) {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "a serving thread uses the shared Redis connection");
                    return;
                }
            },
            Opener::Sentinel(s, config) => {
                own.seen.store(s.generation.load(Ordering::Acquire), Ordering::Relaxed);
                match lazy(&s.client(), config) {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(error = %e, "a serving thread uses the shared Redis connection");
                        return;
                    }
                }
            }
            Opener::Cluster(client) => match tokio::time::timeout(CONNECT_TIMEOUT, client.get_async_connection()).await
            {
                Ok(Ok(c)) => Conn::Cluster(c),
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "a serving thread uses the shared Redis Cluster connection");
                    return;
                }
                Err(_) => {
                    tracing::warn!("a serving thread uses the shared Redis Cluster connection (connect timed out)");
                    return;
                }
            },
        };
        own.conn.store(Some(Arc::new(conn)));
    }

    /// This thread's lane: a serving thread's own, else the shared one.
    pub fn lane(&self) -> Lane {
        match crate::transport::worker::current() {
            Some(i) if i < self.own.len() => Lane::Own(i),
            _ => Lane::Shared,
        }
    }

    /// The connection of `lane` (the shared one for a serving thread
    /// without its own). One atomic load and a reference count.
    pub fn conn(&self, lane: Lane) -> Conn {
        if let Opener::Sentinel(s, config) = &self.opener {
            self.follow(lane, s, config);
        }
        if let Lane::Own(i) = lane {
            if let Some(conn) = self.own.get(i).and_then(|o| o.conn.load().as_deref().cloned()) {
                return conn;
            }
        }
        Conn::clone(&self.shared.load())
    }

    /// A Sentinel master moved since `lane`'s connection was made: gives
    /// the lane a connection to the new one (made on first use).
    fn follow(&self, lane: Lane, s: &Sentinel, config: &ConnectionManagerConfig) {
        let now = s.generation.load(Ordering::Acquire);
        let (seen, place) = match lane {
            Lane::Own(i) => match self.own.get(i).filter(|o| o.conn.load().is_some()) {
                Some(o) => (&o.seen, Place::Own(o.conn.clone())),
                None => (&self.shared_seen, Place::Shared(self.shared.clone())),
            },
            Lane::Shared => (&self.shared_seen, Place::Shared(self.shared.clone())),
        };
        if seen.load(Ordering::Relaxed) == now || seen.swap(now, Ordering::AcqRel) == now {
            return;
        }
        match lazy(&s.client(), config) {
            Ok(conn) => place.put(conn),
            Err(e) => tracing::warn!(error = %e, "cannot connect to the new Redis master"),
        }
    }

    /// Runs a script on this thread's lane within `timeout` (the Redis
    /// round trip every store of this crate makes: the limit store and
    /// queued delivery's jobs store alike).
    pub async fn run<T: redis::FromRedisValue>(
        &self,
        inv: redis::ScriptInvocation<'_>,
        timeout: Duration,
    ) -> Result<T, StoreError> {
        let lane = self.lane();
        let mut conn = self.conn(lane);
        let result = tokio::time::timeout(timeout, inv.invoke_async(&mut conn)).await;
        self.outcome(lane, result, timeout)
    }

    /// Runs a plain command on this thread's lane within `timeout`.
    pub async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd, timeout: Duration) -> Result<T, StoreError> {
        let lane = self.lane();
        let mut conn = self.conn(lane);
        let result = tokio::time::timeout(timeout, cmd.query_async(&mut conn)).await;
        self.outcome(lane, result, timeout)
    }

    /// A round trip's result on `lane`; a failure is noted there first (it
    /// may replace the lane's connection, [`Connections::failed`]).
    pub fn outcome<T>(
        &self,
        lane: Lane,
        result: Result<redis::RedisResult<T>, tokio::time::error::Elapsed>,
        timeout: Duration,
    ) -> Result<T, StoreError> {
        match result {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => {
                self.failed(lane, Some(&e));
                Err(redis_error(e))
            }
            Err(_) => {
                self.failed(lane, None);
                Err(StoreError::Timeout(timeout))
            }
        }
    }

    /// Notes that a call on `lane` failed with `e` (`None`: it timed out).
    /// Replaces the connection the call used when `e` says it will not
    /// recover by itself ([`fault_of`]) or after [`REPEATED`] failures, at
    /// most once per `breaker_open`. Calls already under way finish on the
    /// old one.
    pub fn failed(&self, lane: Lane, e: Option<&redis::RedisError>) {
        let own = match lane {
            Lane::Own(i) => self.own.get(i).filter(|o| o.conn.load().is_some()),
            Lane::Shared => None,
        };
        let health = own.map_or(&self.shared_health, |o| &o.health);
        {
            let mut h = health.lock().unwrap_or_else(|p| p.into_inner());
            h.failures = h.failures.saturating_add(1);
            let due = e.map(fault_of) == Some(ConnFault::Broken) || h.failures >= REPEATED;
            let allowed = h.rebuilt.is_none_or(|t| t.elapsed() >= self.rebuild_every);
            if !(due && allowed) {
                return;
            }
            *h = Health { rebuilt: Some(Stopwatch::start()), failures: 0 };
        }
        self.log_replacement(e);
        let place = match own {
            Some(o) => Place::Own(o.conn.clone()),
            None => Place::Shared(self.shared.clone()),
        };
        self.replace(place);
    }

    /// Logs the first replacement at once, then at most one line per [`LOG_EVERY`].
    fn log_replacement(&self, e: Option<&redis::RedisError>) {
        let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        log.unlogged += 1;
        if log.last.is_none_or(|t| t.elapsed() >= LOG_EVERY) {
            let why = e.map_or_else(|| "calls time out".to_owned(), ToString::to_string);
            tracing::warn!(
                at = %self.at,
                error = %why,
                replaced = log.unlogged,
                "replacing Redis connections that do not recover by themselves"
            );
            *log = ReplaceLog { last: Some(Stopwatch::start()), unlogged: 0 };
        }
    }

    /// Puts a new connection in `place`: a single server's at once (made on
    /// first use, by whoever uses it first); a cluster's when connected, by a
    /// task on this thread's runtime. Keeps the old one if that fails.
    fn replace(&self, place: Place) {
        match &self.opener {
            Opener::Single(client, config) => match lazy(client, config) {
                Ok(conn) => place.put(conn),
                Err(e) => tracing::warn!(error = %e, "cannot replace a Redis connection"),
            },
            Opener::Sentinel(s, config) => match lazy(&s.client(), config) {
                Ok(conn) => place.put(conn),
                Err(e) => tracing::warn!(error = %e, "cannot replace a Redis connection"),
            },
            Opener::Cluster(client) => {
                let client = client.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(CONNECT_TIMEOUT, client.get_async_connection()).await {
                        Ok(Ok(conn)) => place.put(Conn::Cluster(conn)),
                        Ok(Err(e)) => tracing::warn!(error = %e, "cannot replace a Redis Cluster connection"),
                        Err(_) => tracing::warn!("cannot replace a Redis Cluster connection: connect timed out"),
                    }
                });
            }
        }
    }

    /// Gives every serving thread a fresh single-server connection (made on
    /// first use, on its own thread), for when Redis is healthy again after
    /// the breaker was open: a thread's connection may still hold the error
    /// that opened it. A cluster's are left alone (they are replaced on
    /// their own thread when they fail: making one needs I/O).
    pub fn renew_own(&self) {
        let (client, config) = match &self.opener {
            Opener::Single(client, config) => (client.clone(), config),
            Opener::Sentinel(s, config) => (s.client(), config),
            Opener::Cluster(_) => return,
        };
        for own in self.own.iter().filter(|o| o.conn.load().is_some()) {
            match lazy(&client, config) {
                Ok(conn) => own.conn.store(Some(Arc::new(conn))),
                Err(e) => tracing::warn!(error = %e, "cannot replace a Redis connection"),
            }
            *own.health.lock().unwrap_or_else(|p| p.into_inner()) =
                Health { rebuilt: Some(Stopwatch::start()), failures: 0 };
        }
    }
}

/// A single server's connection, made on first use (no I/O here).
fn lazy(client: &redis::Client, config: &ConnectionManagerConfig) -> redis::RedisResult<Conn> {
    ConnectionManager::new_lazy_with_config(client.clone(), config.clone()).map(Conn::Single)
}

/// A connection error as wxgate reports it: `Unreachable` (start degraded)
/// when Redis could not be reached, `Refused` (a configuration error) else.
pub fn cannot_use(at: &str, e: redis::RedisError) -> StoreError {
    let msg = format!("cannot use Redis at {at}: {e}");
    // A server whose certificate is not trusted ([store] tls_ca) is a
    // configuration error: retrying will not fix it.
    let untrusted = msg.contains("certificate") || msg.contains("UnknownIssuer");
    if untrusted {
        StoreError::Refused(format!("{msg} (a private CA? give it as [store] tls_ca)"))
    } else if e.is_io_error() || e.is_connection_refusal() || e.is_timeout() || e.is_connection_dropped() {
        StoreError::Unreachable(msg)
    } else {
        StoreError::Refused(msg)
    }
}

fn cluster_client(cfg: &RedisConfig) -> redis::RedisResult<ClusterClient> {
    let mut builder = ClusterClientBuilder::new(cfg.nodes.clone())
        .connection_timeout(cfg.timeout.max(Duration::from_millis(500)))
        .response_timeout(cfg.timeout)
        .retries(1);
    if let Some(pw) = &cfg.password {
        builder = builder.password(pw.clone());
    }
    if let Some(user) = &cfg.username {
        builder = builder.username(user);
    }
    if let Some(ca) = &cfg.tls_ca {
        builder = builder.certs(certificates(ca));
    }
    builder.build()
}

/// `[store] tls_ca` as the crate takes it: the CA to trust, no client certificate.
fn certificates(ca: &[u8]) -> redis::TlsCertificates {
    redis::TlsCertificates { client_tls: None, root_cert: Some(ca.to_vec()) }
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
) -> Result<ConnectionManager, StoreError> {
    if lazy {
        return ConnectionManager::new_lazy_with_config(client, manager_config).map_err(|e| cannot_use(at, e));
    }
    match tokio::time::timeout(CONNECT_TIMEOUT, ConnectionManager::new_with_config(client, manager_config)).await {
        Ok(conn) => conn.map_err(|e| cannot_use(at, e)),
        Err(_) => {
            Err(StoreError::Unreachable(format!("cannot use Redis at {at}: no answer within {CONNECT_TIMEOUT:?}")))
        }
    }
}

/// A Redis error as the store reports it: [`StoreError::BadKey`] when it is
/// about the data of the keys the command touched (`WRONGTYPE`, or a script
/// failing at run time on what it read), else [`StoreError::Redis`].
pub fn redis_error(e: redis::RedisError) -> StoreError {
    let text = e.to_string();
    // A script fails on its keys' data with a plain ERR; one that fails
    // because of the server's state (full, read-only, loading, ...) says so,
    // and that is every account's problem.
    const SERVER_STATE: [&str; 10] =
        ["OOM", "READONLY", "MASTERDOWN", "LOADING", "BUSY", "NOSCRIPT", "CLUSTERDOWN", "TRYAGAIN", "NOAUTH", "NOPERM"];
    let upper = text.to_ascii_uppercase();
    let script_failed = upper.contains("USER_SCRIPT") || upper.contains("ERROR RUNNING SCRIPT");
    let about_keys = e.code() == Some("WRONGTYPE")
        || upper.contains("WRONGTYPE")
        || (script_failed && !SERVER_STATE.iter().any(|c| upper.contains(c) || e.code() == Some(*c)));
    if about_keys {
        StoreError::BadKey(text)
    } else {
        StoreError::Redis(text)
    }
}

#[cfg(test)]
mod tests {
    use super::{fault_of, ConnFault};

    /// The error Redis answers with `line` (RESP, e.g. `-OOM ...`).
    fn answered(line: &str) -> redis::RedisError {
        match redis::parse_redis_value(format!("{line}\r\n").as_bytes()) {
            Ok(redis::Value::ServerError(e)) => e.into(),
            other => panic!("{line} parsed as {other:?}"),
        }
    }

    #[test]
    fn refused_passwords_and_replicas_replace_the_connection() {
        for line in [
            "-NOAUTH Authentication required.",
            "-WRONGPASS invalid username-password pair or user is disabled.",
            "-READONLY You can't write against a read only replica.",
            "-MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
        ] {
            assert_eq!(fault_of(&answered(line)), ConnFault::Broken, "{line}");
        }
        let auth = redis::RedisError::from((redis::ErrorKind::AuthenticationFailed, "Password authentication failed"));
        assert_eq!(fault_of(&auth), ConnFault::Broken);
    }

    #[test]
    fn answers_of_a_working_connection_are_transient() {
        for line in [
            "-OOM command not allowed when used memory > 'maxmemory'.",
            "-LOADING Redis is loading the dataset in memory",
            "-BUSY Redis is busy running a script.",
            "-ERR Error running script",
            "-NOSCRIPT No matching script.",
        ] {
            assert_eq!(fault_of(&answered(line)), ConnFault::Transient, "{line}");
        }
        let io = redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert_eq!(fault_of(&io), ConnFault::Transient, "the connection manager reconnects after I/O errors");
    }
}
