//! `[store]`: its `kind` decides which keys it takes. Each kind is a serde
//! struct of its own that rejects every key it does not take
//! ([`RawStore::read`]); a key of another kind is named as such
//! (`[store] state_file: only used with kind = "memory"`). Compiled into
//! [`StoreConfig`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Deserialize;

use super::errors::{ConfigError, Ctx, Invalid};
use super::units::{beside_config, parse_duration};
use super::{Fallback, MemoryConfig, RedisConfig, Resilience, SentinelConfig, StoreConfig};

const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_millis(50);
const STORE: &str = "[store]";

/// `[store]` as written, by its `kind`.
#[derive(Debug)]
pub(super) enum RawStore {
    Memory(RawMemory),
    Redis(RawRedis),
    Cluster(RawCluster),
    Sentinel(RawSentinel),
}

/// `kind = "memory"` (the default).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMemory {
    pub lease: Option<String>,
    pub state_file: Option<String>,
    pub flush_interval: Option<String>,
    pub max_entries: Option<usize>,
    pub max_recipients: Option<usize>,
}

/// A struct of one Redis kind: its own keys, then the keys every Redis
/// kind takes ([`RawRedisShared`], which [`Self::split`] takes apart).
/// A macro, not `#[serde(flatten)]` of the shared keys: serde's `flatten`
/// does not combine with `deny_unknown_fields`, which names a key of
/// another kind.
macro_rules! redis_kind {
    ($(#[$meta:meta])* $name:ident { $($key:ident: $ty:ty),* $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub(super) struct $name {
            $(pub $key: $ty,)*
            pub lease: Option<String>,
            pub username: Option<String>,
            pub tls_ca: Option<String>,
            pub key_prefix: Option<String>,
            pub timeout: Option<String>,
            pub wait_replicas: Option<u32>,
            pub fallback: Option<String>,
            pub instances: Option<u32>,
            pub breaker_failures: Option<u32>,
            pub breaker_open: Option<String>,
            pub refusal_cache: Option<bool>,
            pub batch: Option<bool>,
            pub quota_leases: Option<bool>,
            pub quota_lease_span: Option<String>,
            pub quota_lease_calls: Option<u32>,
            pub quota_reserve: Option<String>,
        }

        impl $name {
            fn split(self) -> (RawRedisShared, ($($ty,)*)) {
                let shared = RawRedisShared {
                    username: self.username,
                    tls_ca: self.tls_ca,
                    key_prefix: self.key_prefix,
                    timeout: self.timeout,
                    wait_replicas: self.wait_replicas,
                    fallback: self.fallback,
                    instances: self.instances,
                    breaker_failures: self.breaker_failures,
                    breaker_open: self.breaker_open,
                    refusal_cache: self.refusal_cache,
                    batch: self.batch,
                    quota_leases: self.quota_leases,
                    quota_lease_span: self.quota_lease_span,
                    quota_lease_calls: self.quota_lease_calls,
                    quota_reserve: self.quota_reserve,
                };
                (shared, ($(self.$key,)*))
            }
        }
    };
}

redis_kind!(
    /// `kind = "redis"`: one server.
    RawRedis { url: Option<String> }
);
redis_kind!(
    /// `kind = "redis-cluster"`: its seed nodes.
    RawCluster { nodes: Option<Vec<String>> }
);
redis_kind!(
    /// `kind = "redis-sentinel"`: the sentinels and the master's name.
    RawSentinel { sentinels: Option<Vec<String>>, master: Option<String> }
);

/// The keys every Redis kind takes (`lease` aside: every kind takes it).
#[derive(Debug)]
pub(super) struct RawRedisShared {
    pub username: Option<String>,
    pub tls_ca: Option<String>,
    pub key_prefix: Option<String>,
    pub timeout: Option<String>,
    pub wait_replicas: Option<u32>,
    pub fallback: Option<String>,
    pub instances: Option<u32>,
    pub breaker_failures: Option<u32>,
    pub breaker_open: Option<String>,
    pub refusal_cache: Option<bool>,
    pub batch: Option<bool>,
    pub quota_leases: Option<bool>,
    pub quota_lease_span: Option<String>,
    pub quota_lease_calls: Option<u32>,
    pub quota_reserve: Option<String>,
}

/// The kinds, as written.
const KINDS: [&str; 4] = ["memory", "redis", "redis-cluster", "redis-sentinel"];

/// The keys of one kind alone (the messages for a key of another kind;
/// a unit test holds them to the structs).
const OWN_KEYS: [(&str, &[&str]); 4] = [
    ("memory", &["state_file", "flush_interval", "max_entries", "max_recipients"]),
    ("redis", &["url"]),
    ("redis-cluster", &["nodes"]),
    ("redis-sentinel", &["sentinels", "master"]),
];

/// The keys of every Redis kind.
const REDIS_KEYS: [&str; 15] = [
    "username",
    "tls_ca",
    "key_prefix",
    "timeout",
    "wait_replicas",
    "fallback",
    "instances",
    "breaker_failures",
    "breaker_open",
    "refusal_cache",
    "batch",
    "quota_leases",
    "quota_lease_span",
    "quota_lease_calls",
    "quota_reserve",
];

/// The kinds that take `key`.
fn kinds_taking(key: &str) -> Vec<&'static str> {
    KINDS
        .into_iter()
        .filter(|kind| {
            OWN_KEYS.iter().any(|(k, keys)| k == kind && keys.contains(&key))
                || (kind.starts_with("redis") && REDIS_KEYS.contains(&key))
        })
        .collect()
}

/// Why `key` is refused with `kind` when another kind takes it (`None`: no kind does).
fn not_for(kind: &str, key: &str) -> Option<String> {
    match (kind, key) {
        ("redis-sentinel", "url" | "nodes") => {
            return Some("with kind = \"redis-sentinel\" the sentinels name the master".into())
        }
        ("redis-cluster", "url") => return Some("use nodes = [...] with kind = \"redis-cluster\"".into()),
        _ => {}
    }
    let kinds: Vec<String> = kinds_taking(key).into_iter().map(|k| format!("\"{k}\"")).collect();
    match kinds.as_slice() {
        [] => None,
        [one] => Some(format!("only used with kind = {one}")),
        [first @ .., last] => Some(format!("only used with kind = {} or {last}", first.join(", "))),
    }
}

impl RawStore {
    /// The `[store]` table read by its kind.
    pub(super) fn read(mut table: toml::Table, ctx: &Ctx<'_>) -> Result<RawStore, ConfigError> {
        #[derive(Deserialize)]
        struct Kind {
            kind: Option<String>,
        }
        let kind = deserialize::<Kind>(table.clone(), ctx)?.kind;
        table.remove("kind");
        let kind = kind.as_deref().unwrap_or("memory");
        if !KINDS.contains(&kind) {
            return Err(ctx.in_table(Invalid::at(
                STORE,
                "kind",
                format!(
                    "unknown store \"{kind}\" (expected \"memory\", \"redis\", \"redis-cluster\" or \"redis-sentinel\")"
                ),
            )));
        }
        if let Some((key, why)) = table.keys().find_map(|key| {
            let taken = kinds_taking(key).contains(&kind);
            (!taken).then(|| not_for(kind, key).map(|why| (key, why))).flatten()
        }) {
            return Err(ctx.in_table(Invalid::at(STORE, key.as_str(), why)));
        }
        Ok(match kind {
            "redis" => RawStore::Redis(deserialize(table, ctx)?),
            "redis-cluster" => RawStore::Cluster(deserialize(table, ctx)?),
            "redis-sentinel" => RawStore::Sentinel(deserialize(table, ctx)?),
            _ => RawStore::Memory(deserialize(table, ctx)?),
        })
    }

    /// `lease`, which every kind takes.
    pub(super) fn lease(&self) -> Option<&str> {
        match self {
            RawStore::Memory(m) => m.lease.as_deref(),
            RawStore::Redis(r) => r.lease.as_deref(),
            RawStore::Cluster(r) => r.lease.as_deref(),
            RawStore::Sentinel(r) => r.lease.as_deref(),
        }
    }
}

/// One kind's struct from the `[store]` table, with serde's errors named
/// as the whole file's are (`[store] batch: expected true or false, ...`).
fn deserialize<T: DeserializeOwned>(table: toml::Table, ctx: &Ctx<'_>) -> Result<T, ConfigError> {
    serde_path_to_error::deserialize(table).map_err(|e| ctx.serde_error(&["store"], &e))
}

/// `[store]`. `config_dir` is the config file's directory (where the
/// memory store's state file goes by default), if it was read from a file.
pub(super) fn compile(raw: RawStore, config_dir: Option<&Path>) -> Result<StoreConfig, Invalid> {
    let (kind, target, shared) = match raw {
        RawStore::Memory(m) => return memory(m, config_dir).map(StoreConfig::Memory),
        RawStore::Redis(r) => {
            let (shared, (url,)) = r.split();
            ("redis", Target::One(url), shared)
        }
        RawStore::Cluster(r) => {
            let (shared, (nodes,)) = r.split();
            ("redis-cluster", Target::Cluster(nodes), shared)
        }
        RawStore::Sentinel(r) => {
            let (shared, (sentinels, master)) = r.split();
            ("redis-sentinel", Target::Sentinel(sentinels, master), shared)
        }
    };
    let (url, nodes, sentinel) = target.compile()?;
    let connection = Connection::compile(&shared, &url, &nodes, config_dir)?;
    let resilience = resilience(&shared)?;
    let wait_replicas = shared.wait_replicas.unwrap_or(0);
    if wait_replicas > 0 && kind == "redis-cluster" {
        return Err(Invalid::at(
            STORE,
            "wait_replicas",
            "not with kind = \"redis-cluster\" (each node replicates on its own)",
        ));
    }
    Ok(StoreConfig::Redis(RedisConfig {
        url,
        username: connection.username,
        password: std::env::var("WXGATE_REDIS_PASSWORD").ok().filter(|p| !p.is_empty()),
        tls_ca: connection.tls_ca,
        key_prefix: connection.key_prefix,
        timeout: connection.timeout,
        nodes,
        sentinel,
        wait_replicas,
        resilience,
        batch: shared.batch.unwrap_or(true),
    }))
}

/// `[store] kind = "memory"`: the state file and the bounds.
fn memory(raw: RawMemory, config_dir: Option<&Path>) -> Result<MemoryConfig, Invalid> {
    let state_file = match raw.state_file.as_deref() {
        None => config_dir.map(|d| d.join(MemoryConfig::DEFAULT_STATE_FILE)),
        Some("off") => None,
        Some("") => return Err(Invalid::at(STORE, "state_file", "give a file path, or \"off\"")),
        Some(path) => Some(beside_config(config_dir, Path::new(path))),
    };
    if let Some(path) = &state_file {
        if path.file_name().is_none() || path.is_dir() {
            return Err(Invalid::at(STORE, "state_file", format!("{} is not a file name", path.display())));
        }
    }
    let flush_interval = match raw.flush_interval.as_deref() {
        None => MemoryConfig::DEFAULT_FLUSH_INTERVAL,
        Some(t) => parse_duration(t).map_err(|e| e.field("flush_interval").table(STORE))?,
    };
    if flush_interval < Duration::from_millis(10) || flush_interval > Duration::from_secs(3600) {
        return Err(Invalid::at(STORE, "flush_interval", "must be 10ms to 1h"));
    }
    let max_entries = raw.max_entries.unwrap_or(MemoryConfig::DEFAULT_MAX_ENTRIES);
    if max_entries == 0 {
        return Err(Invalid::at(STORE, "max_entries", "must be at least 1"));
    }
    let max_recipients = raw.max_recipients.unwrap_or(MemoryConfig::DEFAULT_MAX_RECIPIENTS);
    if max_recipients < crate::config::Metering::MAX {
        return Err(Invalid::at(
            STORE,
            "max_recipients",
            format!("must be at least {} (the recipients one call may name)", crate::config::Metering::MAX),
        ));
    }
    Ok(MemoryConfig { state_file, flush_interval, max_entries, max_recipients })
}

/// Where a Redis kind finds its server(s).
enum Target {
    One(Option<String>),
    Cluster(Option<Vec<String>>),
    Sentinel(Option<Vec<String>>, Option<String>),
}

fn redis_url(u: &str) -> bool {
    u.starts_with("redis://") || u.starts_with("rediss://")
}

/// A Redis kind's URL, its cluster's seed nodes (empty: not a cluster) and its sentinels.
type Servers = (String, Vec<String>, Option<Box<SentinelConfig>>);

impl Target {
    fn compile(self) -> Result<Servers, Invalid> {
        let (url, nodes, sentinel) = match self {
            Target::One(url) => (url.unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned()), Vec::new(), None),
            Target::Cluster(nodes) => {
                let nodes = nodes.unwrap_or_default();
                if nodes.is_empty() {
                    return Err(Invalid::at(
                        STORE,
                        "nodes",
                        "kind = \"redis-cluster\" needs seed nodes such as [\"redis://10.0.0.1:6379\"]",
                    ));
                }
                if let Some(bad) = nodes.iter().find(|n| !redis_url(n)) {
                    return Err(Invalid::at(
                        STORE,
                        "nodes",
                        format!("\"{bad}\" must start with redis:// or rediss://"),
                    ));
                }
                (nodes[0].clone(), nodes, None)
            }
            Target::Sentinel(sentinels, master) => {
                let sentinel = sentinel(sentinels, master)?;
                // Where the master is known only once the sentinels say; its
                // scheme (TLS or not) is the sentinels'.
                let url = match sentinel.sentinels.iter().all(|u| u.starts_with("rediss://")) {
                    true => "rediss://sentinel-master",
                    false => "redis://sentinel-master",
                };
                (url.to_owned(), Vec::new(), Some(sentinel))
            }
        };
        if !(redis_url(&url) || url.starts_with("redis+unix://")) {
            return Err(Invalid::at(STORE, "url", "must start with redis:// or rediss://"));
        }
        Ok((url, nodes, sentinel))
    }
}

/// `kind = "redis-sentinel"`: its sentinels and the master's name.
fn sentinel(sentinels: Option<Vec<String>>, master: Option<String>) -> Result<Box<SentinelConfig>, Invalid> {
    let sentinels = sentinels.unwrap_or_default();
    if sentinels.is_empty() {
        return Err(Invalid::at(
            STORE,
            "sentinels",
            "kind = \"redis-sentinel\" needs the sentinels, such as [\"redis://10.0.0.1:26379\", ...] (three, for a \
             quorum)",
        ));
    }
    if let Some(bad) = sentinels.iter().find(|n| !redis_url(n)) {
        return Err(Invalid::at(STORE, "sentinels", format!("\"{bad}\" must start with redis:// or rediss://")));
    }
    let master = master.filter(|m| !m.is_empty() && !m.contains(' ')).ok_or_else(|| {
        Invalid::at(
            STORE,
            "master",
            "the name the sentinels monitor the master as (SENTINEL MONITOR <name> ...), such as \"mymaster\"",
        )
    })?;
    let password = std::env::var("WXGATE_REDIS_SENTINEL_PASSWORD").ok().filter(|p| !p.is_empty());
    Ok(Box::new(SentinelConfig { sentinels, master, password }))
}

/// How wxgate talks to Redis: who it is, over which TLS roots, under which
/// keys, how long it waits.
struct Connection {
    username: Option<String>,
    tls_ca: Option<Vec<u8>>,
    key_prefix: String,
    timeout: Duration,
}

impl Connection {
    fn compile(
        raw: &RawRedisShared,
        url: &str,
        nodes: &[String],
        config_dir: Option<&Path>,
    ) -> Result<Connection, Invalid> {
        let key_prefix = raw.key_prefix.clone().unwrap_or_else(|| "wxgate".to_owned());
        if key_prefix.is_empty() || key_prefix.contains(['{', '}', ' ']) {
            return Err(Invalid::at(STORE, "key_prefix", "must be non-empty, without braces or spaces"));
        }
        let timeout = match raw.timeout.as_deref() {
            None => DEFAULT_STORE_TIMEOUT,
            Some(t) => parse_duration(t).map_err(|e| e.field("timeout").table(STORE))?,
        };
        if timeout.is_zero() {
            return Err(Invalid::at(STORE, "timeout", "must be more than 0"));
        }
        let username = match &raw.username {
            Some(u) if u.is_empty() || u.contains([' ', '@', ':', '/']) => {
                return Err(Invalid::at(STORE, "username", "a Redis ACL user name, without spaces, '@', ':' or '/'"))
            }
            other => other.clone(),
        };
        let tls_ca = match raw.tls_ca.as_deref() {
            None => None,
            Some(path) => Some(tls_ca(path, url, nodes, config_dir)?),
        };
        Ok(Connection { username, tls_ca, key_prefix, timeout })
    }
}

/// `tls_ca`: the PEM certificates a `rediss://` server's chain must end in.
fn tls_ca(path: &str, url: &str, nodes: &[String], config_dir: Option<&Path>) -> Result<Vec<u8>, Invalid> {
    let path = match config_dir {
        Some(dir) if Path::new(path).is_relative() => dir.join(path),
        _ => PathBuf::from(path),
    };
    let pem = std::fs::read(&path)
        .map_err(|e| Invalid::at(STORE, "tls_ca", format!("cannot read {}: {e}", path.display())))?;
    if !pem.windows(27).any(|w| w == b"-----BEGIN CERTIFICATE-----") {
        return Err(Invalid::at(STORE, "tls_ca", format!("{} holds no PEM certificate", path.display())));
    }
    let tls = url.starts_with("rediss://") && nodes.iter().all(|n| n.starts_with("rediss://"));
    if !tls {
        return Err(Invalid::at(STORE, "tls_ca", "only for rediss:// (TLS) URLs"));
    }
    Ok(pem)
}

/// What to do while Redis cannot answer.
fn resilience(raw: &RawRedisShared) -> Result<Resilience, Invalid> {
    let fallback = match raw.fallback.as_deref() {
        None | Some("local") => Fallback::Local,
        Some("allow") => Fallback::Allow,
        Some("deny") => Fallback::Deny,
        Some(other) => {
            return Err(Invalid::at(
                STORE,
                "fallback",
                format!("\"{other}\" is unknown (expected \"local\", \"allow\" or \"deny\")"),
            ))
        }
    };
    let instances = raw.instances.unwrap_or(1);
    if instances == 0 {
        return Err(Invalid::at(STORE, "instances", "must be at least 1"));
    }
    let breaker_failures = raw.breaker_failures.unwrap_or(3);
    if breaker_failures == 0 {
        return Err(Invalid::at(STORE, "breaker_failures", "must be at least 1"));
    }
    let breaker_open = match raw.breaker_open.as_deref() {
        None => Duration::from_secs(1),
        Some(t) => parse_duration(t).map_err(|e| e.field("breaker_open").table(STORE))?,
    };
    if breaker_open < Duration::from_millis(10) {
        return Err(Invalid::at(STORE, "breaker_open", "must be at least 10ms"));
    }
    let quota_lease_span = match raw.quota_lease_span.as_deref() {
        None => Duration::from_secs(1),
        Some(t) => parse_duration(t).map_err(|e| e.field("quota_lease_span").table(STORE))?,
    };
    if quota_lease_span < Duration::from_millis(10) || quota_lease_span > Duration::from_secs(60) {
        return Err(Invalid::at(STORE, "quota_lease_span", "must be between 10ms and 60s"));
    }
    let quota_lease_calls = raw.quota_lease_calls.unwrap_or(4);
    if !(1..=100_000).contains(&quota_lease_calls) {
        return Err(Invalid::at(STORE, "quota_lease_calls", "must be between 1 and 100000 (calls a second)"));
    }
    let quota_reserve = match raw.quota_reserve.as_deref() {
        None => Duration::from_secs(60),
        Some(t) => parse_duration(t).map_err(|e| e.field("quota_reserve").table(STORE))?,
    };
    if quota_reserve > Duration::from_secs(3600) || (!quota_reserve.is_zero() && quota_reserve < Duration::from_secs(1))
    {
        return Err(Invalid::at(STORE, "quota_reserve", "must be 0s (off) or between 1s and 1h"));
    }
    Ok(Resilience {
        fallback,
        instances,
        instances_given: raw.instances.is_some(),
        breaker_failures,
        breaker_open,
        refusal_cache: raw.refusal_cache.unwrap_or(true),
        quota_leases: raw.quota_leases.unwrap_or(true).then_some(quota_lease_span),
        quota_lease_calls,
        quota_reserve,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether the struct of `kind` takes `key` (any value: only an
    /// unknown key is looked for).
    fn takes(kind: &str, key: &str) -> bool {
        let mut table = toml::Table::new();
        table.insert(key.to_owned(), toml::Value::Boolean(true));
        let unknown = |e: toml::de::Error| e.message().starts_with("unknown field");
        let refused = match kind {
            "memory" => RawMemory::deserialize(table).map_or_else(unknown, |_| false),
            "redis" => RawRedis::deserialize(table).map_or_else(unknown, |_| false),
            "redis-cluster" => RawCluster::deserialize(table).map_or_else(unknown, |_| false),
            _ => RawSentinel::deserialize(table).map_or_else(unknown, |_| false),
        };
        !refused
    }

    /// The key lists the messages use are the structs' keys.
    #[test]
    fn the_key_lists_are_the_structs() {
        let all = OWN_KEYS.iter().flat_map(|(_, keys)| keys.iter()).chain(REDIS_KEYS.iter()).chain(["lease"].iter());
        for key in all {
            for kind in KINDS {
                let listed = *key == "lease" || kinds_taking(key).contains(&kind);
                assert_eq!(takes(kind, key), listed, "kind {kind}, key {key}");
            }
        }
        assert!(!takes("redis", "no_such_key"));
    }
}
