//! The configuration as the rest of wxgate reads it: validated, compiled
//! types, built once from `rules.toml` ([`Config::load`], in [`compile`]);
//! the hot path never re-validates anything.
//!
//! - [`raw`]: the file's shape (serde, unknown keys rejected);
//! - [`errors`]: where in the file an error is, and serde's errors in words;
//! - [`compile`]: raw → these types, every check with a message that names
//!   the file, the line where known, the rule and the field
//!   (`rules.toml:14: rule "menu": limits[0]: ...`);
//! - [`callers`]: `[[caller]]` (who calls, its priority and flood guard);
//! - [`units`]: durations, sizes, UTC offsets.
//!
//! This module depends on the decision's types ([`crate::limit`],
//! [`crate::limit::penalty`], [`crate::config::routes`]) and on nothing that runs: the
//! stores, the proxy and the upstream read it.

pub mod accounts;
mod callers;
mod compile;
pub mod directory;
pub mod domain;
mod errors;
pub mod hosts;
mod intercept;
mod meter;
mod overrides;
mod penalty;
pub mod queue;
pub mod quota;
pub mod ratelimit;
mod raw;
pub mod routes;
mod rule;
mod settings;
mod store;
pub mod telemetry;
pub mod units;

pub use errors::{ConfigError, Invalid};
pub use meter::{Metering, PARTY_FIELD, TAG_FIELD};

use std::collections::HashSet;
use std::net::SocketAddr;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::config::routes::Routes;
use crate::limit::penalty::PenaltyPolicy;
use crate::limit::Rule;
use crate::time::Micros;

/// The validated, compiled configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub source: PathBuf,
    pub server: Server,
    pub store: StoreConfig,
    pub penalties: Vec<PenaltyPolicy>,
    /// The rules as written, in file order, domain after domain.
    pub rules: Vec<Arc<Rule>>,
    /// What `routes` points into: each rule with `scope = "rule"` (the same
    /// `Arc` as in `rules`), and one variant per listed path of each rule
    /// with `scope = "path"` ([`Rule::state`]).
    pub routed: Vec<Arc<Rule>>,
    /// The HTTP side of each rule (by [`Rule::id`]): [`Config::rule_http`].
    pub rules_http: Vec<RuleHttp>,
    /// The same for calls without a rule.
    pub unruled_http: RuleHttp,
    /// The WeChat domains (domain 0: the file's own rules and `[server]
    /// upstream`; then each `[[domain]]`): each with its routes into
    /// `routed` and its upstreams ([`domain`]).
    pub domains: Vec<Domain>,
    /// Lease of a concurrency slot (`[store] lease`), renewed while the call lives.
    pub lease_us: Micros,
    /// Longest warm-up of any rule (0: no rule warms up).
    pub max_warmup_us: Micros,
    pub log: LogConfig,
    /// The declared callers (`[[caller]]`), in file order; names are unique
    /// and never `other` ([`CallerPolicy`]).
    pub callers: Vec<Arc<CallerPolicy>>,
    /// `[tokens]`: the access-token cache (`crate::features::token_cache`).
    pub tokens: TokensConfig,
    /// `[queue]`: queued delivery (`crate::features::queue`).
    pub queue: queue::QueueConfig,
    /// `[directory]`: WeCom's directory for broadcasts (`crate::features::directory`).
    pub directory: directory::DirectoryConfig,
    /// Rules with `quota_sync`: each state and the API path asked for.
    pub quota_syncs: Vec<QuotaSync>,
    /// `[intercept]`: CONNECT tunnels to WeChat's hosts, served like direct
    /// calls (`crate::transport::intercept`); `None`: off (the default).
    pub intercept: Option<Intercept>,
    /// `[telemetry]`: trace export (`crate::telemetry::trace`); `None`: off
    /// (the default). Read at start: a reload keeps the running exporter.
    pub telemetry: Option<telemetry::Telemetry>,
    /// `[[account]]`: the accounts whose secret wxgate holds
    /// (`crate::features::broker`), by name.
    pub accounts: accounts::SecretAccounts,
    /// `[[quota]]`: accounts' own limits for a rule ([`Config::rule_of`]).
    pub overrides: quota::Overrides,
    /// What the config leaves to chance without being wrong (a Redis store
    /// without `instances`): printed by `wxgate check`, logged at start.
    pub warnings: Vec<ConfigError>,
}

/// The HTTP side of a rule: what the layers above the decision need of it
/// and the decision never reads (the status and headers of its answers, how
/// a call's recipients are read from its body). Kept apart from the
/// [`Rule`] so that the decision layer names no HTTP type, and built once at
/// compile so a call validates no header.
#[derive(Debug, Clone)]
pub struct RuleHttp {
    /// The HTTP status of the rule's refusals and of WeChat's penalised
    /// answers (429; or 200: refusals keep their 45009 body and headers, and
    /// WeChat's own answers pass with the status WeChat sent).
    pub throttle_status: http::StatusCode,
    /// Its `RateLimit-Policy` and `RateLimit` prefixes.
    pub policy: ratelimit::Policy,
    /// `recipients`: how a call's recipients are read from its body
    /// (`None`: the rule counts calls and reads no body).
    pub recipients: Option<Arc<Metering>>,
    /// `queue = true`: calls may be queued (`Prefer: respond-async`, a
    /// caller's `deliver = "queue"`); inside, the rule's `queue_deadline`
    /// (`None`: `[queue] deadline`). `None`: the rule does not queue.
    pub queue: Option<Option<Micros>>,
    /// `queue_order = "strict"`: its queued jobs go one at a time in the
    /// order they were submitted (default `"recipient"`: in order per
    /// recipient, several in flight; docs/queued-delivery.md).
    pub queue_strict: bool,
}

impl Config {
    /// The rule `account`'s calls of `rule` (a rule or per-path variant of
    /// this config) count against: its `[[quota]]` override, else `rule`.
    /// Nothing is looked up in a config without overrides.
    #[inline]
    pub fn rule_of<'a>(&'a self, account: &str, rule: &'a Arc<Rule>) -> &'a Arc<Rule> {
        self.overrides.rule_of(account, rule)
    }

    /// The HTTP side of `rule` (`None`: calls without a rule).
    pub fn rule_http(&self, rule: Option<&Rule>) -> &RuleHttp {
        rule.and_then(|r| self.rules_http.get(r.id)).unwrap_or(&self.unruled_http)
    }
}

/// `[tokens]`: the access-token cache. Read at start (a reload keeps the
/// cache as it started).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokensConfig {
    /// `cache`: `None` = the store's default (memory: on; Redis: on when a
    /// token key is given).
    pub cache: Option<bool>,
    /// `min_ttl`: a cached token with less left is fetched anew.
    pub min_ttl: Duration,
    /// `wait`: how long a token request waits for another's fetch, and how
    /// long a fetch holds its lock.
    pub wait: Duration,
    /// `key_file`: the token key (32 bytes, hex or base64), unless
    /// `WXGATE_TOKEN_KEY` gives it.
    pub key_file: Option<PathBuf>,
}

impl Default for TokensConfig {
    fn default() -> Self {
        TokensConfig { cache: None, min_ttl: Duration::from_secs(300), wait: Duration::from_secs(15), key_file: None }
    }
}

/// A rule's `quota_sync`: how often WeChat is asked for `path`'s day count
/// (`/cgi-bin/openapi/quota/get`), raised into `rule`'s state.
#[derive(Debug, Clone)]
pub struct QuotaSync {
    /// The rule's state (the rule, or its variant for `path` with `scope = "path"`).
    pub rule: Arc<Rule>,
    /// The API asked for: the rule's first exact path (or the variant's).
    pub path: String,
    pub every: Duration,
    /// The rule's domain (where the question goes).
    pub domain: usize,
}

/// One WeChat domain's rules and upstreams (compiled in [`domain`]).
#[derive(Debug, Clone)]
pub struct Domain {
    /// Its name: `[[domain]] name`, else its host's first label (`qyapi`).
    /// A `[[domain]]`'s rules are named `<name>.<rule>`.
    pub name: Arc<str>,
    /// Its WeChat host (lower case): the first path segment of a direct
    /// call for it (`/qyapi.weixin.qq.com/cgi-bin/...`), and what an
    /// intercepted host maps to ([`domain::WECHAT_HOSTS`]).
    pub host: Arc<str>,
    /// Where its calls go (`[server] upstream` for domain 0; `[[domain]]
    /// upstream`, default `https://<host>`).
    pub upstream: Upstreams,
    /// Its paths → its rules (indices into `Config::routed`).
    pub routes: Routes,
    /// The file its rules are from: `[[domain]] rules`, or for domain 0 the
    /// config's `rules` (`None`: the config file's own `[[rule]]`s).
    /// Watched with the config file.
    pub rules_file: Option<PathBuf>,
    /// Its rules' ids (`Config::rules[..]`).
    pub rules: Range<usize>,
}

/// `[intercept]`, on: wxgate accepts `CONNECT <host>:443` for these hosts
/// only, completes TLS with a certificate for the host signed by the CA,
/// and serves the calls inside like direct ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Intercept {
    /// `hosts`: lower-case DNS names, no port (default: WeChat's API hosts).
    pub hosts: Vec<Arc<str>>,
    /// `ca_cert`: the CA certificate (PEM) leaves are signed with.
    pub ca_cert: PathBuf,
    /// `ca_key`: its private key (PEM); never readable by others (checked).
    pub ca_key: PathBuf,
    /// `upstream`: where a host's calls go instead of `https://<host>`
    /// (`scheme://authority`, no path), per host of `hosts`.
    pub upstream: Vec<(Arc<str>, http::Uri)>,
}

impl Intercept {
    /// Whether `host` (any case) is one of `hosts`; `Some` of its entry.
    pub fn host(&self, host: &str) -> Option<&Arc<str>> {
        self.hosts.iter().find(|h| h.eq_ignore_ascii_case(host))
    }
}

/// A `[[caller]]`: a service calling through wxgate, named by the
/// `X-Wx-Caller` header of its calls or by `[server] caller` (see
/// `crate::admit::callers`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallerPolicy {
    pub name: Arc<str>,
    pub priority: Priority,
    /// `rate`: the local flood guard, per instance; `None`: no guard.
    pub rate: Option<CallerRate>,
    /// The SHA-256 of its key (`key_sha256`, or of `key_file`'s contents);
    /// `None`: it has none (only with `caller_auth = "off"`).
    pub key: Option<KeyDigest>,
    /// `accounts`: the accounts it may spend under `caller_auth = "required"`.
    pub grants: Grants,
    /// `throttle_status`: the status of its refused calls, whatever their
    /// rule says (`None`: the rule's). Its SDK is what decides: 200 for one
    /// that drops the body of a non-2xx answer.
    pub throttle_status: Option<http::StatusCode>,
    /// `deliver = "queue"`: its calls to rules that queue are queued
    /// without `Prefer: respond-async`.
    pub queue_default: bool,
    /// `weight`: its share of the dispatcher's turns (1-1000, default 1).
    pub weight: u32,
    /// `queue_order = "strict"`: its queued jobs go one at a time, in the
    /// order it submitted them, whatever their rule says.
    pub queue_strict: bool,
    /// `callbacks`: the URL prefixes its `X-Wxgate-Callback` may name.
    pub callbacks: Vec<String>,
}

/// The SHA-256 of a caller's key: never the key, and never shown (its
/// `Debug` says nothing of it).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyDigest(pub [u8; 32]);

impl KeyDigest {
    /// The SHA-256 of a key, as callers are looked up by.
    pub fn of(key: &[u8]) -> KeyDigest {
        let digest = ring::digest::digest(&ring::digest::SHA256, key);
        let mut out = [0u8; 32];
        out.copy_from_slice(digest.as_ref());
        KeyDigest(out)
    }
}

impl std::fmt::Debug for KeyDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyDigest(..)")
    }
}

/// The accounts a caller may spend (`[[caller]] accounts`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Grants {
    /// Not given: none under `caller_auth = "required"` (a config error
    /// there), any with it off.
    #[default]
    Unset,
    /// `["*"]`: every account.
    All,
    /// These accounts.
    Listed(Vec<Arc<str>>),
}

impl Grants {
    /// Whether a call for `account` is granted.
    pub fn allow(&self, account: &str) -> bool {
        match self {
            Grants::Unset => false,
            Grants::All => true,
            Grants::Listed(list) => list.iter().any(|a| &**a == account),
        }
    }

    /// The one account granted, if exactly one is: the account of the
    /// caller's calls that name none.
    pub fn single(&self) -> Option<&Arc<str>> {
        match self {
            Grants::Listed(list) if list.len() == 1 => list.first(),
            _ => None,
        }
    }

    /// As `wxgate check` and the admin API say it.
    pub fn describe(&self) -> String {
        match self {
            Grants::Unset => "none".to_owned(),
            Grants::All => "every account".to_owned(),
            Grants::Listed(list) => list.iter().map(|a| &**a).collect::<Vec<_>>().join(", "),
        }
    }
}

/// A caller's `priority`: `"normal"` (the default) or `"high"`. Every
/// caller not declared is `Normal`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Priority {
    #[default]
    Normal,
    High,
}

impl Priority {
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Normal => "normal",
            Priority::High => "high",
        }
    }
}

/// A caller's `rate` (`"200/s"`, `"600/min"`, `"5000/h"`): `count` calls
/// per `per`, on each instance, up to `count` of them at once (a GCRA:
/// one more every `per / count` after a burst).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallerRate {
    pub count: std::num::NonZeroU32,
    pub per: RatePer,
}

/// The period of a [`CallerRate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RatePer {
    Second,
    Minute,
    Hour,
}

impl RatePer {
    /// As written in a rate: `s`, `min`, `h`.
    pub fn as_str(self) -> &'static str {
        match self {
            RatePer::Second => "s",
            RatePer::Minute => "min",
            RatePer::Hour => "h",
        }
    }

    pub fn seconds(self) -> u32 {
        match self {
            RatePer::Second => 1,
            RatePer::Minute => 60,
            RatePer::Hour => 3600,
        }
    }
}

impl CallerRate {
    /// Calls per second, sustained.
    pub fn per_second(self) -> f64 {
        f64::from(self.count.get()) / f64::from(self.per.seconds())
    }
}

impl std::fmt::Display for CallerRate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.count, self.per.as_str())
    }
}

/// `[log]`: read at start-up (the format cannot change on reload).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogConfig {
    /// One JSON object per line instead of text.
    pub json: bool,
    /// One access-log line per call.
    pub access: bool,
}

#[derive(Debug, Clone)]
pub struct Server {
    pub listen: SocketAddr,
    /// `window_margin`: how much two calls' trips from decision to WeChat
    /// may differ with every window still exact where WeChat counts
    /// ([`crate::limit::WindowLimit::with_margin`]).
    pub window_margin_us: Micros,
    /// `window_margin_max`: how far the margin widens while this machine's
    /// scheduler runs late (`crate::admit::margin`); at most
    /// `window_margin_us` never widens it.
    pub window_margin_max_us: Micros,
    /// Base URL(s) of WeChat (or a test mock), tried in order
    /// ([`crate::transport::upstream`]); every forwarded call goes to one of them and
    /// nowhere else.
    pub upstream: Upstreams,
    /// How long a connection to the upstream may take, and how long the
    /// upstream may take to start its answer once the whole request (body
    /// included) has been handed to the connection.
    pub upstream_timeout: Duration,
    /// Longest time without progress on a request body, streamed upstream
    /// or read whole first (never a total deadline): the client sending
    /// nothing (408) or the upstream taking nothing (504).
    pub body_timeout: Duration,
    /// Extra PEM roots trusted for the upstream, on top of the public web roots.
    pub upstream_ca: Option<PathBuf>,
    /// Offset of `quota_timezone` from UTC.
    pub quota_offset_us: Micros,
    /// Most calls this instance holds at once for shaping; past it, calls
    /// that would be held are refused instead.
    pub max_held: usize,
    /// On SIGTERM/SIGINT, how long calls in flight may take to finish.
    pub shutdown_timeout: Duration,
    /// How long a client may take to send a request head (never a body:
    /// [`Server::body_timeout`]).
    pub header_timeout: Duration,
    /// Largest request body forwarded; larger ones get 413.
    pub max_body: u64,
    /// The admin listener (metrics, health, buckets, penalties); `None` = off.
    pub admin_listen: Option<SocketAddr>,
    /// Bearer token required by the admin API (`/v1/...`), if set.
    pub admin_token: Option<String>,
    /// `accounts`: the only accounts calls may count against (from any
    /// source: header, `@account` prefix, learned token, `default`), and
    /// the only ones tokens are learned for; `None`: any valid name.
    pub accounts: Option<HashSet<String>>,
    /// Add `RateLimit-Policy` / `RateLimit` headers to answers.
    pub ratelimit_headers: bool,
    /// The HTTP status of wxgate's refusals (429, or 200 for SDKs that drop
    /// the body of any non-2xx answer); a rule may set its own.
    pub throttle_status: http::StatusCode,
    /// Serving threads, each with its own event loop, upstream connections
    /// and Redis connection (default: one per CPU). Read at start only.
    pub workers: usize,
    /// `caller`: the caller of calls without an `X-Wx-Caller` header (a
    /// sidecar names its service once); `None`: `default`.
    pub caller: Option<Arc<str>>,
    /// `caller_auth`: whether a call must prove which `[[caller]]` it is.
    pub caller_auth: CallerAuth,
    /// `hosts`: the names (`Host`) a client may call the proxy listener by,
    /// besides IP addresses and `localhost` (DNS rebinding).
    pub hosts: hosts::Hosts,
    /// `max_accounts`: at most this many accounts have state on this
    /// instance at once; a call for a new one past it is refused before
    /// any state is created (`None`: no cap).
    pub max_accounts: Option<usize>,
}

/// `[server] caller_auth`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallerAuth {
    /// Callers name themselves (`X-Wx-Caller`) and any account: the trust
    /// model of a listener only trusted services reach (loopback, a sidecar).
    Off {
        /// Written in the config (required for a listener beyond loopback).
        explicit: bool,
    },
    /// Every call carries a declared caller's key; it may spend only the
    /// accounts that caller is granted.
    Required,
}

impl CallerAuth {
    pub fn required(self) -> bool {
        self == CallerAuth::Required
    }
}

/// `[server] upstream`: one base URL, or several tried in order (a call
/// goes to the next only when it provably never reached the one before).
/// Never empty; at most [`Upstreams::MAX`]; no two with the same host and
/// port; all with the same path. Displays as the list, comma-separated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstreams(Vec<http::Uri>);

impl Upstreams {
    /// Most upstreams in a list (WeChat names five API domains).
    pub const MAX: usize = 8;

    /// One upstream (`[intercept]`'s per-host upstreams).
    pub fn one(url: http::Uri) -> Upstreams {
        Upstreams(vec![url])
    }

    /// The upstreams, in the order calls try them.
    pub fn iter(&self) -> std::slice::Iter<'_, http::Uri> {
        self.0.iter()
    }
}

impl Server {
    /// Sends every call to `http://<addr>` (`wxgate try`: the simulator).
    pub fn upstream_at(&mut self, addr: SocketAddr) -> Result<(), http::uri::InvalidUri> {
        self.upstream = Upstreams::one(format!("http://{addr}/").parse()?);
        Ok(())
    }
}

impl std::fmt::Display for Upstreams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, u) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{u}")?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreConfig {
    Memory(MemoryConfig),
    Redis(RedisConfig),
}

/// `[store] kind = "memory"` (the default): the embedded store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryConfig {
    /// Where the store keeps its state across restarts (`state_file`;
    /// default `wxgate-state.json` beside the config file); `None` = `"off"`.
    pub state_file: Option<PathBuf>,
    /// How often changed state is written to `state_file`: what a crash can lose.
    pub flush_interval: Duration,
    /// Most (account, rule) states held; a new pair past it is refused (503).
    pub max_entries: usize,
    /// Most recipients' states held (`per_recipient`), all pairs together;
    /// a call that would add one past it is refused (503).
    pub max_recipients: usize,
}

impl MemoryConfig {
    /// The default state file's name, in the config file's directory.
    pub const DEFAULT_STATE_FILE: &str = "wxgate-state.json";
    pub const DEFAULT_FLUSH_INTERVAL: Duration = Duration::from_secs(1);
    /// About 0.5-0.65 GB of state at most (measured: 500-650 bytes per (account, rule) state).
    pub const DEFAULT_MAX_ENTRIES: usize = 1_000_000;
    /// About 65-130 MB of heap at most (65-130 bytes per recipient with
    /// two windows, by how full the map is), up to ~260 MB resident (the
    /// allocator keeps the pages of the tables freed as the map grew);
    /// examples/recipient_memory.rs. The Redis store's local fallback holds
    /// at most this many too.
    pub const DEFAULT_MAX_RECIPIENTS: usize = 1_000_000;

    /// No state file; the default bounds (tests, embedding).
    pub fn in_memory() -> MemoryConfig {
        MemoryConfig {
            state_file: None,
            flush_interval: Self::DEFAULT_FLUSH_INTERVAL,
            max_entries: Self::DEFAULT_MAX_ENTRIES,
            max_recipients: Self::DEFAULT_MAX_RECIPIENTS,
        }
    }
}

/// `[store] kind = "redis"` / `"redis-cluster"` / `"redis-sentinel"`.
/// `Debug` shows no password and no URL (either may hold one).
#[derive(Clone, PartialEq, Eq)]
pub struct RedisConfig {
    /// `redis://` or `rediss://` (TLS with rustls) URL, password possibly inside.
    pub url: String,
    /// `[store] username`: the ACL user, used when the URL names none.
    pub username: Option<String>,
    /// Used when the URL has no password.
    pub password: Option<String>,
    /// `[store] tls_ca`: the PEM certificates a `rediss://` server's chain
    /// must end in (a private CA), instead of the public roots.
    pub tls_ca: Option<Vec<u8>>,
    pub key_prefix: String,
    /// Budget for one decision, round trip included.
    pub timeout: Duration,
    /// Redis Cluster seed nodes (`kind = "redis-cluster"`); empty for one server.
    pub nodes: Vec<String>,
    /// `kind = "redis-sentinel"`: the sentinels that name the master (`url`
    /// is then only its scheme).
    pub sentinel: Option<Box<SentinelConfig>>,
    /// `[store] wait_replicas = N`: after a run that counted a calendar
    /// admission, `WAIT N` for that many replicas to have it before the
    /// calls go on (0: don't wait).
    pub wait_replicas: u32,
    /// What to do while Redis cannot answer.
    pub resilience: Resilience,
    /// Decide an account's concurrent calls together, one script run per
    /// round trip (`crate::store::batch`); `false`: one run per call.
    pub batch: bool,
}

impl std::fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConfig")
            .field("tls", &self.url.starts_with("rediss://"))
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<set>"))
            .field("tls_ca", &self.tls_ca.is_some())
            .field("key_prefix", &self.key_prefix)
            .field("timeout", &self.timeout)
            .field("nodes", &self.nodes.len())
            .field("sentinel", &self.sentinel)
            .field("wait_replicas", &self.wait_replicas)
            .field("resilience", &self.resilience)
            .field("batch", &self.batch)
            .finish()
    }
}

/// `[store] kind = "redis-sentinel"`: where the master is found.
#[derive(Clone, PartialEq, Eq)]
pub struct SentinelConfig {
    /// `redis://host:26379` (or `rediss://`), a password possibly inside.
    pub sentinels: Vec<String>,
    /// The name the sentinels monitor the master as.
    pub master: String,
    /// The sentinels' password (`WXGATE_REDIS_SENTINEL_PASSWORD`), when their URLs hold none.
    pub password: Option<String>,
}

impl std::fmt::Debug for SentinelConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URLs may hold a password: only how many, and the name.
        f.debug_struct("SentinelConfig")
            .field("sentinels", &self.sentinels.len())
            .field("master", &self.master)
            .finish()
    }
}

/// What to do when Redis cannot decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// Decide in-process, each limit divided by the expected instance count.
    Local,
    /// Forward unthrottled.
    Allow,
    /// Refuse with 503.
    Deny,
}

/// `[store]` settings of the safety net around Redis
/// (`crate::store::resilient`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resilience {
    pub fallback: Fallback,
    /// Expected number of wxgate instances sharing the limits.
    pub instances: u32,
    /// Whether `instances` was written (else the floor is 1, and an
    /// instance that starts while Redis is away decides with whole limits).
    pub instances_given: bool,
    pub breaker_failures: u32,
    pub breaker_open: Duration,
    /// Answer known refusals locally (see `crate::store::resilient`'s refusal cache).
    pub refusal_cache: bool,
    /// Quota leases (`crate::store::resilient::leases`): the longest span
    /// of one, `None` when off.
    pub quota_leases: Option<Duration>,
    /// Calls of a pair within a second on this instance that make it worth
    /// a lease (`[store] quota_lease_calls`).
    pub quota_lease_calls: u32,
    /// How many calls of its recent pace each instance holds of every
    /// calendar quota it calls, to spend through an outage
    /// (`[store] quota_reserve`; zero: none).
    pub quota_reserve: Duration,
}

impl Default for Resilience {
    fn default() -> Self {
        Resilience {
            fallback: Fallback::Local,
            instances: 1,
            instances_given: false,
            breaker_failures: 3,
            breaker_open: Duration::from_secs(1),
            refusal_cache: true,
            quota_leases: Some(Duration::from_secs(1)),
            quota_lease_calls: 4,
            quota_reserve: Duration::from_secs(60),
        }
    }
}

impl Resilience {
    /// No fallback at all: every Redis failure is an error, and every call
    /// decided on its own (no lease) (tests, benchmarks).
    pub fn strict() -> Self {
        Resilience { fallback: Fallback::Deny, quota_leases: None, ..Resilience::default() }
    }
}

/// Valid account names: 1–64 of `[A-Za-z0-9_-]` (the same alphabet as rule names).
pub fn valid_account(s: &str) -> bool {
    units::valid_name(s)
}
