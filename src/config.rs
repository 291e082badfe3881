//! `rules.toml`: parsed with unknown keys rejected, then validated and compiled
//! once into [`Config`]. The hot path never re-validates anything.
//!
//! Every error names the file and, where the TOML parser or a span knows it,
//! the line, then the rule and the field: `rules.toml:14: rule "menu": limits[0]: ...`.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use crate::calendar::Period;
use crate::clock::Micros;
use crate::limit::{Limit, Rule, WindowLimit};
use crate::penalty::{PenaltyLength, PenaltyPolicy};
use crate::routes::{Pattern, Routes};
use crate::store::{Fallback, RedisConfig, Resilience};

/// A config that failed to load, with a message fit to show a user as is.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// The validated, compiled configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub source: PathBuf,
    pub server: Server,
    pub store: StoreConfig,
    pub penalties: Vec<PenaltyPolicy>,
    pub rules: Vec<Arc<Rule>>,
    pub routes: Routes,
    /// Lease of a concurrency slot (`[store] lease`), renewed while the call lives.
    pub lease_us: Micros,
    /// Longest warm-up of any rule (0: no rule warms up).
    pub max_warmup_us: Micros,
    pub log: LogConfig,
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
    /// Base URL of WeChat (or a test mock); every forwarded call goes here and nowhere else.
    pub upstream: http::Uri,
    pub upstream_timeout: Duration,
    /// Extra PEM roots trusted for the upstream, on top of the public web roots.
    pub upstream_ca: Option<PathBuf>,
    /// Offset of `quota_timezone` from UTC.
    pub quota_offset_us: Micros,
    /// Most calls this instance holds at once for shaping; past it, calls
    /// that would be held are refused instead.
    pub max_held: usize,
    /// On SIGTERM/SIGINT, how long calls in flight may take to finish.
    pub shutdown_timeout: Duration,
    /// How long a client may take to send a request head.
    pub header_timeout: Duration,
    /// Largest request body forwarded; larger ones get 413.
    pub max_body: u64,
    /// The admin listener (metrics, health, buckets, penalties); `None` = off.
    pub admin_listen: Option<SocketAddr>,
    /// Bearer token required by the admin API (`/v1/...`), if set.
    pub admin_token: Option<String>,
    /// Add `RateLimit-Policy` / `RateLimit` headers to answers.
    pub ratelimit_headers: bool,
    /// Serving threads, each with its own event loop, upstream connections
    /// and Redis connection (default: one per CPU). Read at start only.
    pub workers: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreConfig {
    Memory,
    Redis(RedisConfig),
}

const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_millis(50);
const DEFAULT_LEASE: Duration = Duration::from_secs(30);
const DEFAULT_MAX_HELD: usize = 10_000;
/// Most serving threads (`[server] workers`).
const MAX_WORKERS: usize = 256;
/// WeChat media uploads go up to tens of MB (WeCom files 20 MB, OA videos
/// 10–20 MB): 64 MiB leaves room and still stops a runaway body.
const DEFAULT_MAX_BODY: u64 = 64 * 1024 * 1024;
/// Longest `max_wait`: a held call keeps its client's connection open.
const MAX_MAX_WAIT: Duration = Duration::from_secs(300);

const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9090";
const DEFAULT_UPSTREAM: &str = "https://api.weixin.qq.com";
const DEFAULT_UPSTREAM_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    server: RawServer,
    #[serde(default)]
    store: RawStore,
    penalty: Option<Vec<Spanned<RawPenalty>>>,
    #[serde(default)]
    rule: Vec<Spanned<RawRule>>,
    #[serde(default)]
    log: RawLog,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawLog {
    format: Option<String>,
    access: Option<bool>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawServer {
    listen: Option<String>,
    upstream: Option<String>,
    upstream_timeout: Option<String>,
    upstream_ca: Option<PathBuf>,
    quota_timezone: Option<String>,
    max_held: Option<usize>,
    shutdown_timeout: Option<String>,
    header_timeout: Option<String>,
    max_body: Option<String>,
    admin_listen: Option<String>,
    admin_token: Option<String>,
    ratelimit_headers: Option<bool>,
    workers: Option<usize>,
    mode: Option<String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawStore {
    kind: Option<String>,
    nodes: Option<Vec<String>>,
    lease: Option<String>,
    fallback: Option<String>,
    instances: Option<u32>,
    breaker_failures: Option<u32>,
    breaker_open: Option<String>,
    refusal_cache: Option<bool>,
    batch: Option<bool>,
    url: Option<String>,
    key_prefix: Option<String>,
    timeout: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPenalty {
    errcode: i64,
    seconds: Option<u64>,
    until: Option<String>,
    max_seconds: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    name: String,
    #[serde(rename = "match", default)]
    patterns: Vec<String>,
    #[serde(default)]
    limits: Vec<Spanned<RawLimit>>,
    max_wait: Option<String>,
    warmup: Option<String>,
    concurrency: Option<u32>,
    mode: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimit {
    count: u64,
    per: String,
    burst: Option<u64>,
}

impl Config {
    /// Reads, parses and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|e| ConfigError(format!("{}: cannot read: {e}", path.display())))?;
        Config::parse(&text, path)
    }

    /// Parses and validates config text; `path` only labels the messages.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let ctx = Ctx { text, path };
        let raw: RawConfig = toml::from_str(text).map_err(|e| ctx.toml_error(&e))?;
        compile(raw, &ctx)
    }
}

struct Ctx<'a> {
    text: &'a str,
    path: &'a Path,
}

impl Ctx<'_> {
    fn line_of(&self, offset: usize) -> usize {
        self.text[..offset.min(self.text.len())].matches('\n').count() + 1
    }
    fn at(&self, span: std::ops::Range<usize>, msg: impl std::fmt::Display) -> ConfigError {
        ConfigError(format!("{}:{}: {msg}", self.path.display(), self.line_of(span.start)))
    }
    fn plain(&self, msg: impl std::fmt::Display) -> ConfigError {
        ConfigError(format!("{}: {msg}", self.path.display()))
    }
    fn toml_error(&self, e: &toml::de::Error) -> ConfigError {
        let msg = e.message().trim_end();
        match e.span() {
            Some(span) => self.at(span, msg),
            None => self.plain(msg),
        }
    }
}

fn compile(raw: RawConfig, ctx: &Ctx<'_>) -> Result<Config, ConfigError> {
    let all_shadow = match raw.server.mode.as_deref() {
        None | Some("enforce") => false,
        Some("shadow") => true,
        Some(other) => {
            return Err(ctx.plain(format!("[server] mode: \"{other}\" is unknown (expected \"enforce\" or \"shadow\")")))
        }
    };
    let log = LogConfig {
        json: match raw.log.format.as_deref() {
            None | Some("text") => false,
            Some("json") => true,
            Some(other) => {
                return Err(ctx.plain(format!("[log] format: \"{other}\" is unknown (expected \"text\" or \"json\")")))
            }
        },
        access: raw.log.access.unwrap_or(true),
    };
    let server = compile_server(raw.server, ctx)?;
    let lease = match raw.store.lease.as_deref() {
        None => DEFAULT_LEASE,
        Some(t) => parse_duration(t).map_err(|m| ctx.plain(format!("[store] lease: {m}")))?,
    };
    if lease < Duration::from_secs(1) {
        return Err(ctx.plain("[store] lease: must be at least 1s"));
    }
    let store = compile_store(raw.store, ctx)?;
    let penalties = match raw.penalty {
        None => PenaltyPolicy::defaults(),
        Some(list) => {
            let mut seen = HashSet::new();
            let mut out = Vec::with_capacity(list.len());
            for p in list {
                let span = p.span();
                let p = p.into_inner();
                if !seen.insert(p.errcode) {
                    return Err(ctx.at(span, format!("[[penalty]] errcode {} is listed twice", p.errcode)));
                }
                out.push(compile_penalty(p).map_err(|m| ctx.at(span, m))?);
            }
            out
        }
    };
    let mut rules = Vec::with_capacity(raw.rule.len());
    let mut names = HashSet::new();
    let mut spans = Vec::with_capacity(raw.rule.len());
    let mut patterns: Vec<(Pattern, usize)> = Vec::new();
    for (index, r) in raw.rule.into_iter().enumerate() {
        let span = r.span();
        spans.push(span.clone());
        let r = r.into_inner();
        let err = |m: String| ctx.at(span.clone(), format!("rule \"{}\": {m}", r.name));
        if !valid_name(&r.name) {
            return Err(ctx.at(span.clone(), format!("rule name \"{}\" must be 1-64 of [A-Za-z0-9_-]", r.name)));
        }
        if !names.insert(r.name.clone()) {
            return Err(err("another rule has the same name".into()));
        }
        if r.patterns.is_empty() && r.name != "default" {
            return Err(err("match: needs at least one path pattern".into()));
        }
        for p in &r.patterns {
            let pattern = Pattern::parse(p).map_err(|m| err(format!("match \"{p}\": {m}")))?;
            patterns.push((pattern, index));
        }
        let mut limits = Vec::with_capacity(r.limits.len());
        let mut windows = HashSet::new();
        for (i, l) in r.limits.iter().enumerate() {
            let at = |m: String| ctx.at(l.span(), format!("rule \"{}\": limits[{i}]: {m}", r.name));
            let limit = compile_limit(l.get_ref()).map_err(at)?;
            if !windows.insert(limit.window_key()) {
                return Err(at(format!("another limit of this rule has per = \"{}\"", l.get_ref().per)));
            }
            limits.push(limit);
        }
        let max_wait_us = match r.max_wait.as_deref() {
            None => 0,
            Some(t) => {
                let d = parse_duration(t).map_err(|m| err(format!("max_wait: {m}")))?;
                if d > MAX_MAX_WAIT {
                    return Err(err(format!("max_wait: \"{t}\" is longer than 5m")));
                }
                micros(d)
            }
        };
        let warmup_us = match r.warmup.as_deref() {
            None => 0,
            Some(t) => micros(parse_duration(t).map_err(|m| err(format!("warmup: {m}")))?),
        };
        if warmup_us > 31 * crate::calendar::DAY_US {
            return Err(err("warmup: longer than 31 days".into()));
        }
        let shadow = match r.mode.as_deref() {
            None | Some("enforce") => all_shadow,
            Some("shadow") => true,
            Some(other) => {
                return Err(err(format!("mode: \"{other}\" is unknown (expected \"enforce\" or \"shadow\")")))
            }
        };
        let concurrency = match r.concurrency {
            Some(0) => return Err(err("concurrency: must be at least 1 (leave it out for no cap)".into())),
            Some(c) => c,
            None => 0,
        };
        let mut rule = Rule {
            name: r.name.into(),
            patterns: r.patterns,
            limits,
            max_wait_us,
            warmup_us,
            concurrency,
            shadow,
            policy_header: None,
            policy_prefixes: Vec::new(),
        };
        rule.policy_header = crate::ratelimit::policy_header(&rule);
        rule.policy_prefixes = crate::ratelimit::policy_prefixes(&rule);
        rules.push(Arc::new(rule));
    }
    let default = rules.iter().position(|r| &*r.name == "default");
    let routes = Routes::new(patterns, default).map_err(|(p, a, b)| {
        ctx.at(
            spans[b].clone(),
            format!("rules \"{}\" and \"{}\" both claim the path pattern \"{p}\"", rules[a].name, rules[b].name),
        )
    })?;
    let max_warmup_us = rules.iter().map(|r| r.warmup_us).max().unwrap_or(0);
    Ok(Config {
        source: ctx.path.to_path_buf(),
        server,
        store,
        penalties,
        rules,
        routes,
        lease_us: micros(lease),
        max_warmup_us,
        log,
    })
}

fn compile_server(raw: RawServer, ctx: &Ctx<'_>) -> Result<Server, ConfigError> {
    let listen_text = raw.listen.as_deref().unwrap_or(DEFAULT_LISTEN);
    let listen = listen_text.parse().map_err(|_| {
        ctx.plain(format!("[server] listen: \"{listen_text}\" is not an address:port such as 127.0.0.1:8080"))
    })?;
    let upstream_text = raw.upstream.as_deref().unwrap_or(DEFAULT_UPSTREAM);
    let upstream =
        parse_upstream(upstream_text).map_err(|m| ctx.plain(format!("[server] upstream: \"{upstream_text}\": {m}")))?;
    let upstream_timeout = match raw.upstream_timeout.as_deref() {
        None => DEFAULT_UPSTREAM_TIMEOUT,
        Some(t) => parse_duration(t).map_err(|m| ctx.plain(format!("[server] upstream_timeout: {m}")))?,
    };
    let quota_offset_us = match raw.quota_timezone.as_deref() {
        None => 8 * 3_600_000_000,
        Some(tz) => parse_offset(tz).map_err(|m| ctx.plain(format!("[server] quota_timezone: \"{tz}\": {m}")))?,
    };
    if let Some(ca) = &raw.upstream_ca {
        if !ca.is_file() {
            return Err(ctx.plain(format!("[server] upstream_ca: {} is not a readable file", ca.display())));
        }
    }
    let max_held = raw.max_held.unwrap_or(DEFAULT_MAX_HELD);
    let duration = |key: &str, given: &Option<String>, default: Duration| match given.as_deref() {
        None => Ok(default),
        Some(t) => parse_duration(t).map_err(|m| ctx.plain(format!("[server] {key}: {m}"))),
    };
    let shutdown_timeout = duration("shutdown_timeout", &raw.shutdown_timeout, Duration::from_secs(30))?;
    let header_timeout = duration("header_timeout", &raw.header_timeout, Duration::from_secs(10))?;
    if header_timeout.is_zero() {
        return Err(ctx.plain("[server] header_timeout: must be more than 0"));
    }
    let max_body = match raw.max_body.as_deref() {
        None => DEFAULT_MAX_BODY,
        Some(t) => parse_size(t).map_err(|m| ctx.plain(format!("[server] max_body: \"{t}\": {m}")))?,
    };
    let admin_listen = match raw.admin_listen.as_deref() {
        Some("off") => None,
        other => {
            let text = other.unwrap_or(DEFAULT_ADMIN_LISTEN);
            Some(text.parse().map_err(|_| {
                ctx.plain(format!("[server] admin_listen: \"{text}\" is not an address:port (or \"off\")"))
            })?)
        }
    };
    let workers = match raw.workers {
        None => std::thread::available_parallelism().map_or(1, |n| n.get()).min(MAX_WORKERS),
        Some(n) if (1..=MAX_WORKERS).contains(&n) => n,
        Some(n) => return Err(ctx.plain(format!("[server] workers: {n}: must be 1 to {MAX_WORKERS}"))),
    };
    let admin_token = raw.admin_token.or_else(|| std::env::var("WXGATE_ADMIN_TOKEN").ok()).filter(|t| !t.is_empty());
    Ok(Server {
        listen,
        upstream,
        upstream_timeout,
        upstream_ca: raw.upstream_ca,
        quota_offset_us,
        max_held,
        shutdown_timeout,
        header_timeout,
        max_body,
        admin_listen,
        admin_token,
        ratelimit_headers: raw.ratelimit_headers.unwrap_or(true),
        workers,
    })
}

fn compile_store(raw: RawStore, ctx: &Ctx<'_>) -> Result<StoreConfig, ConfigError> {
    match raw.kind.as_deref() {
        None | Some("memory") => {
            for (key, given) in [
                ("url", raw.url.is_some()),
                ("nodes", raw.nodes.is_some()),
                ("key_prefix", raw.key_prefix.is_some()),
                ("timeout", raw.timeout.is_some()),
                ("fallback", raw.fallback.is_some()),
                ("instances", raw.instances.is_some()),
                ("breaker_failures", raw.breaker_failures.is_some()),
                ("breaker_open", raw.breaker_open.is_some()),
                ("refusal_cache", raw.refusal_cache.is_some()),
                ("batch", raw.batch.is_some()),
            ] {
                if given {
                    return Err(ctx.plain(format!("[store] {key}: only used with kind = \"redis\"")));
                }
            }
            Ok(StoreConfig::Memory)
        }
        Some(kind @ ("redis" | "redis-cluster")) => {
            let redis_url = |u: &str| u.starts_with("redis://") || u.starts_with("rediss://");
            let nodes = if kind == "redis-cluster" {
                if raw.url.is_some() {
                    return Err(ctx.plain("[store] url: use nodes = [...] with kind = \"redis-cluster\""));
                }
                let nodes = raw.nodes.unwrap_or_default();
                if nodes.is_empty() {
                    return Err(ctx.plain(
                        "[store] nodes: kind = \"redis-cluster\" needs seed nodes such as [\"redis://10.0.0.1:6379\"]",
                    ));
                }
                if let Some(bad) = nodes.iter().find(|n| !redis_url(n)) {
                    return Err(ctx.plain(format!("[store] nodes: \"{bad}\" must start with redis:// or rediss://")));
                }
                nodes
            } else {
                if raw.nodes.is_some() {
                    return Err(ctx.plain("[store] nodes: only used with kind = \"redis-cluster\""));
                }
                Vec::new()
            };
            let url = raw
                .url
                .unwrap_or_else(|| nodes.first().cloned().unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned()));
            if !(redis_url(&url) || url.starts_with("redis+unix://")) {
                return Err(ctx.plain("[store] url: must start with redis:// or rediss://"));
            }
            let key_prefix = raw.key_prefix.unwrap_or_else(|| "wxgate".to_owned());
            if key_prefix.is_empty() || key_prefix.contains(['{', '}', ' ']) {
                return Err(ctx.plain("[store] key_prefix: must be non-empty, without braces or spaces"));
            }
            let timeout = match raw.timeout.as_deref() {
                None => DEFAULT_STORE_TIMEOUT,
                Some(t) => parse_duration(t).map_err(|m| ctx.plain(format!("[store] timeout: {m}")))?,
            };
            if timeout.is_zero() {
                return Err(ctx.plain("[store] timeout: must be more than 0"));
            }
            let password = std::env::var("WXGATE_REDIS_PASSWORD").ok().filter(|p| !p.is_empty());
            let fallback = match raw.fallback.as_deref() {
                None | Some("local") => Fallback::Local,
                Some("allow") => Fallback::Allow,
                Some("deny") => Fallback::Deny,
                Some(other) => {
                    return Err(ctx.plain(format!(
                        "[store] fallback: \"{other}\" is unknown (expected \"local\", \"allow\" or \"deny\")"
                    )))
                }
            };
            let instances = raw.instances.unwrap_or(1);
            if instances == 0 {
                return Err(ctx.plain("[store] instances: must be at least 1"));
            }
            let breaker_failures = raw.breaker_failures.unwrap_or(3);
            if breaker_failures == 0 {
                return Err(ctx.plain("[store] breaker_failures: must be at least 1"));
            }
            let breaker_open = match raw.breaker_open.as_deref() {
                None => Duration::from_secs(1),
                Some(t) => parse_duration(t).map_err(|m| ctx.plain(format!("[store] breaker_open: {m}")))?,
            };
            if breaker_open < Duration::from_millis(10) {
                return Err(ctx.plain("[store] breaker_open: must be at least 10ms"));
            }
            let resilience = Resilience {
                fallback,
                instances,
                breaker_failures,
                breaker_open,
                refusal_cache: raw.refusal_cache.unwrap_or(true),
            };
            let batch = raw.batch.unwrap_or(true);
            Ok(StoreConfig::Redis(RedisConfig { url, password, key_prefix, timeout, nodes, resilience, batch }))
        }
        Some(other) => {
            Err(ctx.plain(format!("[store] kind: unknown store \"{other}\" (expected \"memory\" or \"redis\")")))
        }
    }
}

fn parse_upstream(text: &str) -> Result<http::Uri, String> {
    let uri: http::Uri = text.parse().map_err(|e| format!("not a URL ({e})"))?;
    match uri.scheme_str() {
        Some("http") | Some("https") => {}
        _ => return Err("must start with http:// or https://".into()),
    }
    if uri.authority().is_none() {
        return Err("has no host".into());
    }
    if uri.query().is_some() {
        return Err("must not have a query string".into());
    }
    Ok(uri)
}

fn compile_penalty(p: RawPenalty) -> Result<PenaltyPolicy, String> {
    let length = match (p.seconds, p.until.as_deref()) {
        (Some(0), None) => return Err(format!("[[penalty]] errcode {}: seconds must be at least 1", p.errcode)),
        (Some(s), None) => PenaltyLength::Escalating { base_us: secs_us(s) },
        (None, Some("next_minute")) => PenaltyLength::NextMinute,
        (None, Some(other)) => {
            return Err(format!(
                "[[penalty]] errcode {}: until = \"{other}\" is unknown (expected \"next_minute\")",
                p.errcode
            ))
        }
        (Some(_), Some(_)) => {
            return Err(format!("[[penalty]] errcode {}: give seconds or until, not both", p.errcode))
        }
        (None, None) => return Err(format!("[[penalty]] errcode {}: needs seconds or until", p.errcode)),
    };
    let max_us = match p.max_seconds {
        Some(0) => return Err(format!("[[penalty]] errcode {}: max_seconds must be at least 1", p.errcode)),
        Some(s) => Some(secs_us(s)),
        None => None,
    };
    Ok(PenaltyPolicy { errcode: p.errcode, length, max_us })
}

fn micros(d: Duration) -> Micros {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

fn secs_us(s: u64) -> Micros {
    i64::try_from(s).unwrap_or(i64::MAX / 1_000_000).saturating_mul(1_000_000)
}

fn compile_limit(l: &RawLimit) -> Result<Limit, String> {
    if l.count == 0 {
        return Err("count must be at least 1".into());
    }
    if l.count > 1_000_000_000 {
        return Err(format!("count {} is too large (at most 1000000000)", l.count));
    }
    match l.per.as_str() {
        "day" | "month" => {
            if l.burst.is_some() {
                return Err(format!("burst does not apply to per = \"{}\" (a calendar quota)", l.per));
            }
            let period = if l.per == "day" { Period::Day } else { Period::Month };
            Ok(Limit::Calendar { count: l.count, period })
        }
        per => {
            let window = parse_duration(per).map_err(|m| format!("per: {m}"))?;
            let per_us = i64::try_from(window.as_micros()).map_err(|_| "per: too long".to_string())?;
            if per_us < 1_000_000 {
                return Err(format!("per = \"{per}\" is shorter than 1s"));
            }
            if per_us > 31 * crate::calendar::DAY_US {
                return Err(format!("per = \"{per}\" is longer than 31 days; use per = \"month\""));
            }
            let burst = l.burst.unwrap_or_else(|| WindowLimit::default_burst(l.count));
            if burst == 0 {
                return Err("burst must be at least 1".into());
            }
            if burst > l.count {
                return Err(format!("burst {burst} exceeds count {}", l.count));
            }
            Ok(Limit::Window(WindowLimit::new(l.count, per_us, burst)))
        }
    }
}

/// Parses a size: `"64MiB"`, `"10MB"`, `"512KiB"`, `"1048576"` (bytes).
fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits.parse().map_err(|_| "expected a size such as \"64MiB\"".to_string())?;
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "KB" | "kB" => 1000,
        "KiB" => 1 << 10,
        "MB" => 1_000_000,
        "MiB" => 1 << 20,
        "GB" => 1_000_000_000,
        "GiB" => 1 << 30,
        other => return Err(format!("unknown unit \"{other}\" (use B, KB, KiB, MB, MiB, GB, GiB)")),
    };
    n.checked_mul(mult).filter(|&b| b > 0).ok_or_else(|| "must be more than 0 and fit in 64 bits".to_string())
}

/// Parses `"500ms"`, `"1s"`, `"10s"`, `"1m"`, `"1h"` (humantime syntax).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim())
        .map_err(|e| format!("\"{text}\" is not a duration such as \"500ms\", \"10s\", \"1m\", \"1h\" ({e})"))
}

/// Parses a fixed UTC offset: `+08:00`, `-05:30`, `Z`, `UTC`, `Asia/Shanghai`.
fn parse_offset(text: &str) -> Result<Micros, String> {
    let t = text.trim();
    if t.eq_ignore_ascii_case("z") || t.eq_ignore_ascii_case("utc") {
        return Ok(0);
    }
    // WeChat's own zone, named the way people will write it. It has no DST.
    if t == "Asia/Shanghai" || t == "Asia/Chongqing" || t == "PRC" {
        return Ok(8 * 3_600_000_000);
    }
    let bad = || "expected a fixed offset such as \"+08:00\" or \"UTC\"".to_string();
    let (sign, rest) = match t.as_bytes().first() {
        Some(b'+') => (1, &t[1..]),
        Some(b'-') => (-1, &t[1..]),
        _ => return Err(bad()),
    };
    let (h, m) = rest.split_once(':').ok_or_else(bad)?;
    let h: i64 = h.parse().map_err(|_| bad())?;
    let m: i64 = m.parse().map_err(|_| bad())?;
    if h > 14 || m > 59 || h < 0 || m < 0 {
        return Err(bad());
    }
    Ok(sign * (h * 3600 + m * 60) * 1_000_000)
}

fn valid_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Valid account names: 1–64 of `[A-Za-z0-9_-]` (the same alphabet as rule names).
pub fn valid_account(s: &str) -> bool {
    valid_name(s)
}
