//! The stores a scenario runs on: the embedded store, a real Redis and a
//! 3-master Redis Cluster, each started for the test and stopped with it.

use std::fmt::Display;
use std::path::Path;

use super::redis_server::{RedisCluster, RedisServer};
use super::{ConfigToml, Gate, MockWeChat, StoreToml};

pub enum Backing {
    Memory,
    Redis(RedisServer),
    Cluster(RedisCluster),
}

impl Backing {
    /// Memory, Redis and Cluster.
    pub fn all() -> Vec<Backing> {
        vec![Backing::Memory, Backing::Redis(RedisServer::start()), Backing::Cluster(RedisCluster::start(3))]
    }

    pub fn name(&self) -> &'static str {
        match self {
            Backing::Memory => "memory",
            Backing::Redis(_) => "redis",
            Backing::Cluster(_) => "cluster",
        }
    }

    /// Its `[store]` table (`None`: the embedded store, the default).
    pub fn store(&self) -> Option<StoreToml> {
        match self {
            Backing::Memory => None,
            Backing::Redis(r) => Some(StoreToml::redis(&r.url())),
            Backing::Cluster(c) => Some(StoreToml::redis_cluster(c.urls())),
        }
    }

    /// A gate in front of `mock` with `rules`, on the system clock.
    pub async fn gate(&self, mock: &MockWeChat, rules: &str) -> Gate {
        let config = ConfigToml::new(&mock.url()).with(rules);
        match self.store() {
            None => Gate::start_text(config).await,
            Some(store) => Gate::start_real_text(config.with(store)).await,
        }
    }

    /// A gate on this whole config (its `[store]` added here), deciding on
    /// the gate's manual clock on every store.
    pub async fn gate_on_manual_clock(&self, config: ConfigToml) -> Gate {
        match self.store() {
            None => Gate::start_text(config).await,
            Some(store) => Gate::start_redis_on_manual_clock(config.with(store)).await,
        }
    }

    /// A gate loaded from `path` (whose `[store]` is [`Backing::store`]'s),
    /// watching it, deciding on the gate's manual clock.
    pub async fn gate_from_file(&self, path: &Path) -> Gate {
        match self {
            Backing::Memory => Gate::start_file(path).await,
            _ => Gate::start_redis_file_on_manual_clock(path).await,
        }
    }

    /// `config` with this store's `[store]`.
    pub fn with_store(&self, config: impl Display) -> String {
        match self.store() {
            None => config.to_string(),
            Some(store) => format!("{config}\n{store}"),
        }
    }
}
