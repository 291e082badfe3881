//! `[server]` and `[store]`: compiled into [`Server`] and [`StoreConfig`].
//! Errors are messages naming the table and key; [`super::compile`] adds
//! the file.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::raw::{RawServer, RawStore, RawUpstream};
use super::units::{micros, parse_duration, parse_offset, parse_size, throttle_status};
use super::{
    valid_account, CallerAuth, Fallback, MemoryConfig, RedisConfig, Resilience, SentinelConfig, Server, StoreConfig,
    Upstreams,
};

const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_millis(50);
const DEFAULT_MAX_HELD: usize = 10_000;
/// Most serving threads (`[server] workers`).
const MAX_WORKERS: usize = 256;
/// WeChat media uploads go up to tens of MB (WeCom files 20 MB, OA videos
/// 10–20 MB): 64 MiB leaves room and still stops a runaway body.
const DEFAULT_MAX_BODY: u64 = 64 * 1024 * 1024;

const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9090";
const DEFAULT_UPSTREAM: &str = "https://api.weixin.qq.com";
const DEFAULT_UPSTREAM_TIMEOUT: Duration = Duration::from_secs(10);
/// Without progress for this long, a request body being sent ends the call.
/// Generous: an upload only has to keep moving, however long it takes.
const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// How much the trips of two calls from decision to WeChat may differ and
/// their windows still hold at WeChat's door (docs/semantics.md). Measured
/// on loopback (tests/shaping.rs with a margin of 0, 2 cores at load
/// average 8): consecutive held calls 192–207 ms apart for a 200 ms slot,
/// so trips differing by up to 8 ms; 20 ms covers that twice over, for
/// 0.03 % of a minute window's rate.
pub const DEFAULT_WINDOW_MARGIN: Duration = Duration::from_millis(20);
/// A margin past this is a misunderstanding: it slows a 1 s window to a third.
const MAX_WINDOW_MARGIN: Duration = Duration::from_secs(2);

/// `[server]`.
pub(super) fn server(raw: RawServer) -> Result<Server, String> {
    let listen_text = raw.listen.as_deref().unwrap_or(DEFAULT_LISTEN);
    let listen = listen_text
        .parse()
        .map_err(|_| format!("[server] listen: \"{listen_text}\" is not an address:port such as 127.0.0.1:8080"))?;
    let upstream = upstreams(raw.upstream)?;
    let upstream_timeout = match raw.upstream_timeout.as_deref() {
        None => DEFAULT_UPSTREAM_TIMEOUT,
        Some(t) => parse_duration(t).map_err(|m| format!("[server] upstream_timeout: {m}"))?,
    };
    let quota_offset_us = match raw.quota_timezone.as_deref() {
        None => 8 * 3_600_000_000,
        Some(tz) => parse_offset(tz).map_err(|m| format!("[server] quota_timezone: \"{tz}\": {m}"))?,
    };
    if let Some(ca) = &raw.upstream_ca {
        if !ca.is_file() {
            return Err(format!("[server] upstream_ca: {} is not a readable file", ca.display()));
        }
    }
    let max_held = raw.max_held.unwrap_or(DEFAULT_MAX_HELD);
    let duration = |key: &str, given: &Option<String>, default: Duration| match given.as_deref() {
        None => Ok(default),
        Some(t) => parse_duration(t).map_err(|m| format!("[server] {key}: {m}")),
    };
    let shutdown_timeout = duration("shutdown_timeout", &raw.shutdown_timeout, Duration::from_secs(30))?;
    let header_timeout = duration("header_timeout", &raw.header_timeout, Duration::from_secs(10))?;
    if header_timeout.is_zero() {
        return Err("[server] header_timeout: must be more than 0".into());
    }
    let body_timeout = duration("body_timeout", &raw.body_timeout, DEFAULT_BODY_TIMEOUT)?;
    if body_timeout.is_zero() {
        return Err("[server] body_timeout: must be more than 0".into());
    }
    let window_margin = duration("window_margin", &raw.window_margin, DEFAULT_WINDOW_MARGIN)?;
    if window_margin > MAX_WINDOW_MARGIN {
        return Err(format!(
            "[server] window_margin: longer than {}: it covers the spread of a call's trip to WeChat, a few \
             milliseconds, not a pause between calls (give the rule a smaller count instead)",
            humantime::format_duration(MAX_WINDOW_MARGIN)
        ));
    }
    let max_body = match raw.max_body.as_deref() {
        None => DEFAULT_MAX_BODY,
        Some(t) => parse_size(t).map_err(|m| format!("[server] max_body: \"{t}\": {m}"))?,
    };
    let admin_listen = match raw.admin_listen.as_deref() {
        Some("off") => None,
        other => {
            let text = other.unwrap_or(DEFAULT_ADMIN_LISTEN);
            Some(
                text.parse()
                    .map_err(|_| format!("[server] admin_listen: \"{text}\" is not an address:port (or \"off\")"))?,
            )
        }
    };
    // Port 0 (tests: any free port) is two different ports.
    if admin_listen.is_some_and(|a: SocketAddr| a == listen && a.port() != 0) {
        return Err(format!(
            "[server] admin_listen: {listen} is also listen: the admin API needs an address of its own (or \"off\")"
        ));
    }
    let workers = match raw.workers {
        None => std::thread::available_parallelism().map_or(1, |n| n.get()).min(MAX_WORKERS),
        Some(n) if (1..=MAX_WORKERS).contains(&n) => n,
        Some(n) => return Err(format!("[server] workers: {n}: must be 1 to {MAX_WORKERS}")),
    };
    let throttle_status = throttle_status(raw.throttle_status).map_err(|m| format!("[server] {m}"))?;
    let accounts = match raw.accounts {
        None => None,
        Some(list) if list.is_empty() => {
            return Err(
                "[server] accounts: an empty list refuses every call; leave the key out to allow any account".into()
            )
        }
        Some(list) => match list.iter().find(|a| !valid_account(a)) {
            Some(bad) => {
                return Err(format!("[server] accounts: \"{bad}\" is not an account name (1-64 of A-Z a-z 0-9 _ -)"))
            }
            None => Some(list.into_iter().collect()),
        },
    };
    let caller = match raw.caller {
        None => None,
        Some(name) if valid_account(&name) => Some(name.into()),
        Some(bad) => return Err(format!("[server] caller: \"{bad}\" is not a caller name (1-64 of A-Z a-z 0-9 _ -)")),
    };
    let caller_auth = match raw.caller_auth.as_deref() {
        None => CallerAuth::Off { explicit: false },
        Some("off") => CallerAuth::Off { explicit: true },
        Some("required") => CallerAuth::Required,
        Some(other) => {
            return Err(format!("[server] caller_auth: \"{other}\" is unknown (expected \"off\" or \"required\")"))
        }
    };
    if caller_auth == (CallerAuth::Off { explicit: false }) && !listen.ip().is_loopback() {
        return Err(format!(
            "[server] caller_auth: listen {listen} is beyond loopback, so any service that reaches it could spend \
             (or pause) any account by naming it: set caller_auth = \"required\" and give each [[caller]] a key \
             and its accounts, or write caller_auth = \"off\" to trust every caller that can reach it"
        ));
    }
    let max_accounts = match raw.max_accounts {
        Some(0) => return Err("[server] max_accounts: must be at least 1 (leave it out for no cap)".into()),
        other => other,
    };
    if caller_auth.required() && caller.is_some() {
        return Err(
            "[server] caller: with caller_auth = \"required\" a call's caller is the one its key proves; remove caller"
                .into(),
        );
    }
    let admin_token = raw.admin_token.or_else(|| std::env::var("WXGATE_ADMIN_TOKEN").ok()).filter(|t| !t.is_empty());
    check_admin_exposure(admin_listen, admin_token.is_some())?;
    Ok(Server {
        listen,
        upstream,
        upstream_timeout,
        body_timeout,
        upstream_ca: raw.upstream_ca,
        quota_offset_us,
        max_held,
        shutdown_timeout,
        header_timeout,
        max_body,
        admin_listen,
        admin_token,
        accounts,
        ratelimit_headers: raw.ratelimit_headers.unwrap_or(true),
        throttle_status: throttle_status.unwrap_or(http::StatusCode::TOO_MANY_REQUESTS),
        workers,
        caller,
        caller_auth,
        max_accounts,
        window_margin_us: micros(window_margin),
    })
}

/// An admin listener beyond loopback needs a token: the admin API lifts and
/// imposes penalties, so an open one on a pod or office network lets anyone
/// there switch off the protection wxgate exists for. This is an error, not
/// a warning, and has no opt-out: a warning scrolls past in a log nobody reads,
/// and a token costs one Secret (`/metrics` and the probes stay open without
/// it, so Prometheus and orchestrators need nothing). Loopback is 127.0.0.0/8
/// and `::1`.
fn check_admin_exposure(admin_listen: Option<SocketAddr>, has_token: bool) -> Result<(), String> {
    match admin_listen {
        Some(addr) if !has_token && !addr.ip().is_loopback() => Err(format!(
            "[server] admin_listen: {addr} is reachable beyond this machine but no admin_token (or \
             WXGATE_ADMIN_TOKEN) is set, so anyone who can reach it could lift penalties; set admin_token, \
             or listen on 127.0.0.1"
        )),
        _ => Ok(()),
    }
}

/// `[store]`. `config_dir` is the config file's directory (where the
/// memory store's state file goes by default), if it was read from a file.
pub(super) fn store(mut raw: RawStore, config_dir: Option<&Path>) -> Result<StoreConfig, String> {
    match raw.kind.as_deref() {
        None | Some("memory") => {
            for (key, given) in [
                ("url", raw.url.is_some()),
                ("username", raw.username.is_some()),
                ("tls_ca", raw.tls_ca.is_some()),
                ("nodes", raw.nodes.is_some()),
                ("sentinels", raw.sentinels.is_some()),
                ("master", raw.master.is_some()),
                ("wait_replicas", raw.wait_replicas.is_some()),
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
                    return Err(format!("[store] {key}: only used with kind = \"redis\""));
                }
            }
            memory(raw, config_dir).map(StoreConfig::Memory)
        }
        Some(kind @ ("redis" | "redis-cluster" | "redis-sentinel")) => {
            for (key, given) in [
                ("state_file", raw.state_file.is_some()),
                ("flush_interval", raw.flush_interval.is_some()),
                ("max_entries", raw.max_entries.is_some()),
                ("max_recipients", raw.max_recipients.is_some()),
            ] {
                if given {
                    return Err(format!("[store] {key}: only used with kind = \"memory\""));
                }
            }
            let redis_url = |u: &str| u.starts_with("redis://") || u.starts_with("rediss://");
            let sentinel = if kind == "redis-sentinel" {
                if raw.url.is_some() || raw.nodes.is_some() {
                    return Err("[store] url, nodes: with kind = \"redis-sentinel\" the sentinels name the master".into());
                }
                let sentinels = raw.sentinels.take().unwrap_or_default();
                if sentinels.is_empty() {
                    return Err("[store] sentinels: kind = \"redis-sentinel\" needs the sentinels, such as \
                                [\"redis://10.0.0.1:26379\", ...] (three, for a quorum)"
                        .into());
                }
                if let Some(bad) = sentinels.iter().find(|n| !redis_url(n)) {
                    return Err(format!("[store] sentinels: \"{bad}\" must start with redis:// or rediss://"));
                }
                let master = raw.master.take().filter(|m| !m.is_empty() && !m.contains(' ')).ok_or(
                    "[store] master: the name the sentinels monitor the master as (SENTINEL MONITOR <name> ...), \
                     such as \"mymaster\"",
                )?;
                let password = std::env::var("WXGATE_REDIS_SENTINEL_PASSWORD").ok().filter(|p| !p.is_empty());
                Some(Box::new(SentinelConfig { sentinels, master, password }))
            } else {
                for (key, given) in [("sentinels", raw.sentinels.is_some()), ("master", raw.master.is_some())] {
                    if given {
                        return Err(format!("[store] {key}: only used with kind = \"redis-sentinel\""));
                    }
                }
                None
            };
            let nodes = if kind == "redis-cluster" {
                if raw.url.is_some() {
                    return Err("[store] url: use nodes = [...] with kind = \"redis-cluster\"".into());
                }
                let nodes = raw.nodes.unwrap_or_default();
                if nodes.is_empty() {
                    return Err(
                        "[store] nodes: kind = \"redis-cluster\" needs seed nodes such as [\"redis://10.0.0.1:6379\"]"
                            .into(),
                    );
                }
                if let Some(bad) = nodes.iter().find(|n| !redis_url(n)) {
                    return Err(format!("[store] nodes: \"{bad}\" must start with redis:// or rediss://"));
                }
                nodes
            } else {
                if raw.nodes.is_some() {
                    return Err("[store] nodes: only used with kind = \"redis-cluster\"".into());
                }
                Vec::new()
            };
            let url = match &sentinel {
                // Where the master is known only once the sentinels say; its
                // scheme (TLS or not) is the sentinels'.
                Some(s) if s.sentinels.iter().all(|u| u.starts_with("rediss://")) => "rediss://sentinel-master".to_owned(),
                Some(_) => "redis://sentinel-master".to_owned(),
                None => raw
                    .url
                    .unwrap_or_else(|| nodes.first().cloned().unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned())),
            };
            if !(redis_url(&url) || url.starts_with("redis+unix://")) {
                return Err("[store] url: must start with redis:// or rediss://".into());
            }
            let key_prefix = raw.key_prefix.unwrap_or_else(|| "wxgate".to_owned());
            if key_prefix.is_empty() || key_prefix.contains(['{', '}', ' ']) {
                return Err("[store] key_prefix: must be non-empty, without braces or spaces".into());
            }
            let timeout = match raw.timeout.as_deref() {
                None => DEFAULT_STORE_TIMEOUT,
                Some(t) => parse_duration(t).map_err(|m| format!("[store] timeout: {m}"))?,
            };
            if timeout.is_zero() {
                return Err("[store] timeout: must be more than 0".into());
            }
            let password = std::env::var("WXGATE_REDIS_PASSWORD").ok().filter(|p| !p.is_empty());
            let username = match raw.username {
                Some(u) if u.is_empty() || u.contains([' ', '@', ':', '/']) => {
                    return Err("[store] username: a Redis ACL user name, without spaces, '@', ':' or '/'".into())
                }
                other => other,
            };
            let tls_ca = match raw.tls_ca.as_deref() {
                None => None,
                Some(path) => {
                    let path = match config_dir {
                        Some(dir) if Path::new(path).is_relative() => dir.join(path),
                        _ => PathBuf::from(path),
                    };
                    let pem = std::fs::read(&path)
                        .map_err(|e| format!("[store] tls_ca: cannot read {}: {e}", path.display()))?;
                    if !pem.windows(27).any(|w| w == b"-----BEGIN CERTIFICATE-----") {
                        return Err(format!("[store] tls_ca: {} holds no PEM certificate", path.display()));
                    }
                    let tls = url.starts_with("rediss://") && nodes.iter().all(|n| n.starts_with("rediss://"));
                    if !tls {
                        return Err("[store] tls_ca: only for rediss:// (TLS) URLs".into());
                    }
                    Some(pem)
                }
            };
            let fallback = match raw.fallback.as_deref() {
                None | Some("local") => Fallback::Local,
                Some("allow") => Fallback::Allow,
                Some("deny") => Fallback::Deny,
                Some(other) => {
                    return Err(format!(
                        "[store] fallback: \"{other}\" is unknown (expected \"local\", \"allow\" or \"deny\")"
                    ))
                }
            };
            let instances = raw.instances.unwrap_or(1);
            if instances == 0 {
                return Err("[store] instances: must be at least 1".into());
            }
            let breaker_failures = raw.breaker_failures.unwrap_or(3);
            if breaker_failures == 0 {
                return Err("[store] breaker_failures: must be at least 1".into());
            }
            let breaker_open = match raw.breaker_open.as_deref() {
                None => Duration::from_secs(1),
                Some(t) => parse_duration(t).map_err(|m| format!("[store] breaker_open: {m}"))?,
            };
            if breaker_open < Duration::from_millis(10) {
                return Err("[store] breaker_open: must be at least 10ms".into());
            }
            let resilience = Resilience {
                fallback,
                instances,
                breaker_failures,
                breaker_open,
                refusal_cache: raw.refusal_cache.unwrap_or(true),
            };
            let batch = raw.batch.unwrap_or(true);
            let wait_replicas = raw.wait_replicas.unwrap_or(0);
            if wait_replicas > 0 && kind == "redis-cluster" {
                return Err("[store] wait_replicas: not with kind = \"redis-cluster\" (each node replicates on its own)".into());
            }
            Ok(StoreConfig::Redis(RedisConfig {
                url,
                username,
                password,
                tls_ca,
                key_prefix,
                timeout,
                nodes,
                sentinel,
                wait_replicas,
                resilience,
                batch,
            }))
        }
        Some(other) => Err(format!(
            "[store] kind: unknown store \"{other}\" (expected \"memory\", \"redis\", \"redis-cluster\" or \"redis-sentinel\")"
        )),
    }
}

/// `[store] kind = "memory"`: the state file and the bounds.
fn memory(raw: RawStore, config_dir: Option<&Path>) -> Result<MemoryConfig, String> {
    let state_file = match raw.state_file.as_deref() {
        None => config_dir.map(|d| d.join(MemoryConfig::DEFAULT_STATE_FILE)),
        Some("off") => None,
        Some("") => return Err("[store] state_file: give a file path, or \"off\"".into()),
        Some(path) => Some(PathBuf::from(path)),
    };
    if let Some(path) = &state_file {
        if path.file_name().is_none() || path.is_dir() {
            return Err(format!("[store] state_file: {} is not a file name", path.display()));
        }
    }
    let flush_interval = match raw.flush_interval.as_deref() {
        None => MemoryConfig::DEFAULT_FLUSH_INTERVAL,
        Some(t) => parse_duration(t).map_err(|m| format!("[store] flush_interval: {m}"))?,
    };
    if flush_interval < Duration::from_millis(10) || flush_interval > Duration::from_secs(3600) {
        return Err("[store] flush_interval: must be 10ms to 1h".into());
    }
    let max_entries = raw.max_entries.unwrap_or(MemoryConfig::DEFAULT_MAX_ENTRIES);
    if max_entries == 0 {
        return Err("[store] max_entries: must be at least 1".into());
    }
    let max_recipients = raw.max_recipients.unwrap_or(MemoryConfig::DEFAULT_MAX_RECIPIENTS);
    if max_recipients < crate::config::Metering::MAX {
        return Err(format!(
            "[store] max_recipients: must be at least {} (the recipients one call may name)",
            crate::config::Metering::MAX
        ));
    }
    Ok(MemoryConfig { state_file, flush_interval, max_entries, max_recipients })
}

/// `[server] upstream`: a URL (the default: WeChat's), or a list tried in
/// order. Each element passes [`parse_upstream`]; a list is not empty, has
/// at most [`Upstreams::MAX`] elements, no host:port twice (the metrics'
/// `upstream` label), and one path for all (a call's target does not depend
/// on which upstream takes it).
fn upstreams(raw: Option<RawUpstream>) -> Result<Upstreams, String> {
    let list = match raw {
        None => return parse_upstream(DEFAULT_UPSTREAM).map(|u| Upstreams(vec![u])),
        Some(RawUpstream::One(text)) => {
            let uri = parse_upstream(&text).map_err(|m| format!("[server] upstream: \"{}\": {m}", shown(&text)))?;
            return Ok(Upstreams(vec![uri]));
        }
        Some(RawUpstream::List(list)) => list,
    };
    if list.is_empty() {
        return Err(format!(
            "[server] upstream: an empty list: give at least one URL, e.g. [\"{DEFAULT_UPSTREAM}\", \"https://api2.weixin.qq.com\"]"
        ));
    }
    if list.len() > Upstreams::MAX {
        return Err(format!("[server] upstream: {} URLs: at most {} are tried", list.len(), Upstreams::MAX));
    }
    let mut uris: Vec<http::Uri> = Vec::with_capacity(list.len());
    for (i, text) in list.iter().enumerate() {
        let uri = parse_upstream(text).map_err(|m| format!("[server] upstream[{i}]: \"{}\": {m}", shown(text)))?;
        if let Some(j) = uris.iter().position(|u| same_host(u, &uri)) {
            return Err(format!("[server] upstream[{i}]: \"{text}\": the same host and port as upstream[{j}]"));
        }
        if let Some(first) = uris.first() {
            if uri.path().trim_end_matches('/') != first.path().trim_end_matches('/') {
                return Err(format!(
                    "[server] upstream[{i}]: \"{text}\": its path must be upstream[0]'s (\"{}\"): a call keeps its path whichever upstream takes it",
                    first.path().trim_end_matches('/')
                ));
            }
        }
        uris.push(uri);
    }
    Ok(Upstreams(uris))
}

/// Whether a URL's authority (what follows `scheme://` up to the first
/// `/`, `?` or `#`) has an `@`: user info, whatever else is wrong with it.
fn has_user_info(text: &str) -> bool {
    authority_of(text).contains('@')
}

fn authority_of(text: &str) -> &str {
    let rest = text.split_once("://").map_or(text, |(_, rest)| rest);
    rest.split(['/', '?', '#']).next().unwrap_or(rest)
}

/// An upstream URL as an error may quote it: its user info, if any, cut
/// out (`https://…@host/path`).
pub(super) fn shown(text: &str) -> std::borrow::Cow<'_, str> {
    let authority = authority_of(text);
    match authority.rfind('@') {
        None => std::borrow::Cow::Borrowed(text),
        Some(at) => {
            let start = authority.as_ptr() as usize - text.as_ptr() as usize;
            std::borrow::Cow::Owned(format!("{}…{}", &text[..start], &text[start + at..]))
        }
    }
}

/// Whether two upstream URLs reach the same host and port.
fn same_host(a: &http::Uri, b: &http::Uri) -> bool {
    let port = |u: &http::Uri| u.port_u16().unwrap_or(if u.scheme_str() == Some("https") { 443 } else { 80 });
    a.host().map(str::to_ascii_lowercase) == b.host().map(str::to_ascii_lowercase) && port(a) == port(b)
}

/// An upstream URL: `http://` or `https://`, a host, no query, and no
/// user info (`user:password@`): wxgate never sends it (WeChat takes no
/// credential there), and a URL is shown in `/readyz`, `wxgate check` and
/// the start-up log, where a password must never be.
pub(super) fn parse_upstream(text: &str) -> Result<http::Uri, String> {
    if has_user_info(text) {
        return Err("must not carry user info (user:password@): wxgate never sends it to WeChat, and a URL is \
                    shown in /readyz, `wxgate check` and the logs; give scheme://host[:port][/path] only"
            .into());
    }
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
