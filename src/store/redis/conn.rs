//! Connections to Redis: one per serving thread ([`crate::worker`]), made on
//! that thread's runtime so a round trip never crosses threads, plus a shared
//! one for everything else (the admin API, the breaker's probe, lease
//! renewal, and a serving thread whose own connection could not be made).
//!
//! A single server's connections are multiplexed and reconnect by
//! themselves (`ConnectionManager`); a cluster's follow MOVED/ASK and
//! refresh the topology on their own.

use std::sync::OnceLock;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;

use crate::config::RedisConfig;
use crate::store::StoreError;

/// How long start-up waits for Redis before starting degraded.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

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
}

/// Which connection a piece of code uses: a serving thread's own, or the shared one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    Own(usize),
    Shared,
}

pub struct Connections {
    shared: Conn,
    own: Box<[OnceLock<Conn>]>,
    opener: Opener,
    /// The server's address, for messages (never the URL: it may hold the password).
    at: String,
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
        let at = info.addr().to_string();
        let (shared, opener) = if cfg.nodes.is_empty() {
            let client = redis::Client::open(info).map_err(|e| cannot_use(&at, e))?;
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
        Ok(Connections { shared, own: Box::new([]), opener, at })
    }

    /// Makes room for `workers` serving threads' own connections.
    pub fn with_workers(mut self, workers: usize) -> Self {
        self.own = (0..workers).map(|_| OnceLock::new()).collect();
        self
    }

    /// How many serving threads have a place here.
    pub fn workers(&self) -> usize {
        self.own.len()
    }

    /// Where messages say Redis is.
    pub fn at(&self) -> &str {
        &self.at
    }

    /// Opens this serving thread's own connection, on its runtime. A single
    /// server's connection is made on first use (no I/O here); a cluster's
    /// is made now, and if that fails the thread uses the shared one.
    pub async fn attach_worker(&self) {
        let Some(slot) = crate::worker::current().and_then(|i| self.own.get(i)) else { return };
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
        let _ = slot.set(conn);
    }

    /// This thread's lane: its own connection if it has one, else the shared one.
    pub fn lane(&self) -> Lane {
        match crate::worker::current() {
            Some(i) if self.own.get(i).is_some_and(|c| c.get().is_some()) => Lane::Own(i),
            _ => Lane::Shared,
        }
    }

    /// The connection of `lane`.
    pub fn conn(&self, lane: Lane) -> Conn {
        match lane {
            Lane::Own(i) => self.own.get(i).and_then(OnceLock::get).unwrap_or(&self.shared).clone(),
            Lane::Shared => self.shared.clone(),
        }
    }
}

/// A connection error as wxgate reports it: `Unreachable` (start degraded)
/// when Redis could not be reached, `Refused` (a configuration error) else.
pub fn cannot_use(at: &str, e: redis::RedisError) -> StoreError {
    let msg = format!("cannot use Redis at {at}: {e}");
    if e.is_io_error() || e.is_connection_refusal() || e.is_timeout() || e.is_connection_dropped() {
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
    builder.build()
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
