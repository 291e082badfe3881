//! The file's shape, as serde reads it: every table rejects unknown keys, so
//! a misspelled setting is an error rather than silently ignored.

use std::path::PathBuf;

use serde::Deserialize;
use toml::Spanned;

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    /// `rules = "rules.toml"`: the file this config's `[[rule]]`s and
    /// `[[penalty]]`s are read from (src/config/domain.rs, [`super::domain::include`]).
    pub rules: Option<Spanned<PathBuf>>,
    #[serde(default)]
    pub server: RawServer,
    /// Read by its `kind` ([`super::store::RawStore::read`]).
    #[serde(default)]
    pub store: toml::Table,
    pub penalty: Option<Vec<Spanned<RawPenalty>>>,
    #[serde(default)]
    pub rule: Vec<Spanned<super::rule::RawRule>>,
    #[serde(default)]
    pub log: RawLog,
    #[serde(default)]
    pub caller: Vec<Spanned<RawCaller>>,
    #[serde(default)]
    pub tokens: RawTokens,
    pub intercept: Option<RawIntercept>,
    #[serde(default)]
    pub account: Vec<Spanned<super::accounts::RawAccount>>,
    #[serde(default)]
    pub domain: Vec<Spanned<RawDomain>>,
    #[serde(default)]
    pub queue: super::queue::RawQueue,
    #[serde(default)]
    pub directory: super::directory::RawDirectory,
    #[serde(default)]
    pub quota: Vec<Spanned<super::overrides::RawQuota>>,
    #[serde(default)]
    pub telemetry: super::telemetry::RawTelemetry,
}

/// `[[domain]]` (src/config/domain.rs).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDomain {
    pub host: String,
    pub name: Option<String>,
    pub upstream: Option<RawUpstream>,
    pub rules: PathBuf,
}

/// A rules file (a `[[domain]]`'s `rules`, or the config's own `rules`),
/// as it is read: its `[[rule]]`s (every key checked) and its
/// `[[penalty]]`s; its `[[domain]]`s, `[[quota]]`s, `[[caller]]`s and
/// `[[account]]`s only to say that they are not read from there, and its
/// `rules` to refuse a chain; the rest of the file (its `[server]`,
/// `[store]`, ...) is for running it alone, and never read.
#[derive(Debug, Deserialize)]
pub(super) struct RawRulesFile {
    #[serde(default)]
    pub rule: Vec<Spanned<super::rule::RawRule>>,
    pub penalty: Option<Vec<Spanned<RawPenalty>>>,
    pub domain: Option<toml::Value>,
    pub quota: Option<toml::Value>,
    pub caller: Option<toml::Value>,
    pub account: Option<toml::Value>,
    pub rules: Option<toml::Value>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTokens {
    pub cache: Option<bool>,
    pub min_ttl: Option<String>,
    pub wait: Option<String>,
    pub key_file: Option<PathBuf>,
}

/// `[intercept]` (src/config/intercept.rs).
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawIntercept {
    pub enabled: Option<bool>,
    pub hosts: Option<Vec<String>>,
    pub ca_cert: Option<PathBuf>,
    pub ca_key: Option<PathBuf>,
    pub upstream: Option<std::collections::BTreeMap<String, String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCaller {
    pub name: String,
    pub priority: Option<String>,
    pub rate: Option<String>,
    pub key_sha256: Option<String>,
    pub key_file: Option<PathBuf>,
    pub accounts: Option<Vec<String>>,
    pub throttle_status: Option<u16>,
    pub deliver: Option<String>,
    pub weight: Option<u32>,
    pub callbacks: Option<Vec<String>>,
    pub queue_order: Option<String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLog {
    pub format: Option<String>,
    pub access: Option<bool>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawServer {
    pub listen: Option<String>,
    pub upstream: Option<RawUpstream>,
    pub upstream_timeout: Option<String>,
    pub body_timeout: Option<String>,
    pub upstream_ca: Option<PathBuf>,
    pub quota_timezone: Option<String>,
    pub max_held: Option<usize>,
    pub shutdown_timeout: Option<String>,
    pub header_timeout: Option<String>,
    pub max_body: Option<String>,
    pub admin_listen: Option<String>,
    pub admin_token: Option<String>,
    pub accounts: Option<Vec<String>>,
    pub ratelimit_headers: Option<bool>,
    pub throttle_status: Option<u16>,
    pub workers: Option<usize>,
    pub mode: Option<String>,
    pub caller: Option<String>,
    pub caller_auth: Option<String>,
    pub max_accounts: Option<usize>,
    pub window_margin: Option<String>,
    pub window_margin_max: Option<String>,
    pub domain: Option<String>,
    pub hosts: Option<Vec<String>>,
}

/// `[server] upstream`: one base URL, or a list of them tried in order.
#[derive(Debug)]
pub(super) enum RawUpstream {
    One(String),
    List(Vec<String>),
}

impl<'de> Deserialize<'de> for RawUpstream {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = RawUpstream;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a URL, or a list of URLs tried in order")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<RawUpstream, E> {
                Ok(RawUpstream::One(s.to_owned()))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<RawUpstream, A::Error> {
                let mut list = Vec::new();
                while let Some(url) = seq.next_element::<String>()? {
                    list.push(url);
                }
                Ok(RawUpstream::List(list))
            }
        }
        d.deserialize_any(Visitor)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPenalty {
    pub errcode: i64,
    pub seconds: Option<u64>,
    pub until: Option<String>,
    pub max_seconds: Option<u64>,
}
