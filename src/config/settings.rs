//! `[server]`: compiled into [`Server`]. Errors name the table and key;
//! [`super::compile`] adds the file and line.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use super::errors::Invalid;
use super::raw::{RawServer, RawUpstream};
use super::units::{micros, parse_duration, parse_offset, parse_size, throttle_status};
use super::{valid_account, CallerAuth, Server, Upstreams};

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
/// How far the margin widens by default while this machine's scheduler runs
/// late (`crate::admit::margin`): covers a scheduler 330 ms late.
pub const DEFAULT_WINDOW_MARGIN_MAX: Duration = Duration::from_millis(500);

const SERVER: &str = "[server]";

/// `[server]`.
pub(super) fn server(raw: RawServer, dir: Option<&std::path::Path>) -> Result<Server, Invalid> {
    let (listen, admin_listen, admin_token) = listeners(&raw)?;
    let upstream = upstreams(raw.upstream.as_ref(), SERVER, DEFAULT_UPSTREAM)?;
    let upstream_ca = raw.upstream_ca.as_deref().map(|ca| super::units::beside_config(dir, ca));
    if let Some(ca) = &upstream_ca {
        if !ca.is_file() {
            return Err(Invalid::at(SERVER, "upstream_ca", format!("{} is not a readable file", ca.display())));
        }
    }
    let timing = Timing::read(&raw)?;
    let quota_offset_us = match raw.quota_timezone.as_deref() {
        None => 8 * 3_600_000_000,
        Some(tz) => parse_offset(tz).map_err(|e| e.field(format!("\"{tz}\"")).field("quota_timezone").table(SERVER))?,
    };
    let max_body = match raw.max_body.as_deref() {
        None => DEFAULT_MAX_BODY,
        Some(t) => parse_size(t).map_err(|e| e.field(format!("\"{t}\"")).field("max_body").table(SERVER))?,
    };
    let workers = match raw.workers {
        None => std::thread::available_parallelism().map_or(1, |n| n.get()).min(MAX_WORKERS),
        Some(n) if (1..=MAX_WORKERS).contains(&n) => n,
        Some(n) => return Err(Invalid::at(SERVER, "workers", format!("{n}: must be 1 to {MAX_WORKERS}"))),
    };
    let throttle_status = throttle_status(raw.throttle_status).map_err(|e| e.table(SERVER))?;
    let access = Access::read(&raw, listen)?;
    Ok(Server {
        listen,
        upstream,
        upstream_timeout: timing.upstream,
        body_timeout: timing.body,
        upstream_ca,
        quota_offset_us,
        max_held: raw.max_held.unwrap_or(DEFAULT_MAX_HELD),
        shutdown_timeout: timing.shutdown,
        header_timeout: timing.header,
        max_body,
        admin_listen,
        admin_token,
        accounts: access.accounts,
        ratelimit_headers: raw.ratelimit_headers.unwrap_or(true),
        throttle_status: throttle_status.unwrap_or(http::StatusCode::TOO_MANY_REQUESTS),
        workers,
        caller: access.caller,
        caller_auth: access.caller_auth,
        max_accounts: access.max_accounts,
        hosts: super::hosts::hosts(raw.hosts.as_deref())?,
        window_margin_us: micros(timing.window_margin),
        window_margin_max_us: micros(timing.window_margin_max.max(timing.window_margin)),
    })
}

/// `listen`, `admin_listen` and the admin token (the key or `WXGATE_ADMIN_TOKEN`).
fn listeners(raw: &RawServer) -> Result<(SocketAddr, Option<SocketAddr>, Option<String>), Invalid> {
    let listen_text = raw.listen.as_deref().unwrap_or(DEFAULT_LISTEN);
    let listen: SocketAddr = listen_text.parse().map_err(|_| {
        Invalid::at(SERVER, "listen", format!("\"{listen_text}\" is not an address:port such as 127.0.0.1:8080"))
    })?;
    let admin_listen = match raw.admin_listen.as_deref() {
        Some("off") => None,
        other => {
            let text = other.unwrap_or(DEFAULT_ADMIN_LISTEN);
            Some(text.parse().map_err(|_| {
                Invalid::at(SERVER, "admin_listen", format!("\"{text}\" is not an address:port (or \"off\")"))
            })?)
        }
    };
    // Port 0 (tests: any free port) is two different ports.
    if admin_listen.is_some_and(|a: SocketAddr| a == listen && a.port() != 0) {
        return Err(Invalid::at(
            SERVER,
            "admin_listen",
            format!("{listen} is also listen: the admin API needs an address of its own (or \"off\")"),
        ));
    }
    let admin_token =
        raw.admin_token.clone().or_else(|| std::env::var("WXGATE_ADMIN_TOKEN").ok()).filter(|t| !t.is_empty());
    check_admin_exposure(admin_listen, admin_token.is_some())?;
    Ok((listen, admin_listen, admin_token))
}

/// `[server]`'s timeouts and the window margin.
struct Timing {
    upstream: Duration,
    body: Duration,
    shutdown: Duration,
    header: Duration,
    window_margin: Duration,
    window_margin_max: Duration,
}

impl Timing {
    fn read(raw: &RawServer) -> Result<Timing, Invalid> {
        let duration = |key: &str, given: &Option<String>, default: Duration| match given.as_deref() {
            None => Ok(default),
            Some(t) => parse_duration(t).map_err(|e| e.field(key).table(SERVER)),
        };
        let upstream = duration("upstream_timeout", &raw.upstream_timeout, DEFAULT_UPSTREAM_TIMEOUT)?;
        let shutdown = duration("shutdown_timeout", &raw.shutdown_timeout, Duration::from_secs(30))?;
        let header = duration("header_timeout", &raw.header_timeout, Duration::from_secs(10))?;
        if header.is_zero() {
            return Err(Invalid::at(SERVER, "header_timeout", "must be more than 0"));
        }
        let body = duration("body_timeout", &raw.body_timeout, DEFAULT_BODY_TIMEOUT)?;
        if body.is_zero() {
            return Err(Invalid::at(SERVER, "body_timeout", "must be more than 0"));
        }
        // A margin (or its widest) past MAX_WINDOW_MARGIN is a misunderstanding.
        let margin = |key: &str, given: &Option<String>, default: Duration, why: &str| {
            let m = duration(key, given, default)?;
            if m > MAX_WINDOW_MARGIN {
                let most = humantime::format_duration(MAX_WINDOW_MARGIN);
                return Err(Invalid::at(SERVER, key, format!("longer than {most}: {why}")));
            }
            Ok(m)
        };
        let window_margin = margin(
            "window_margin",
            &raw.window_margin,
            DEFAULT_WINDOW_MARGIN,
            "it covers the spread of a call's trip to WeChat, a few milliseconds, not a pause between calls (give \
             the rule a smaller count instead)",
        )?;
        let window_margin_max = margin(
            "window_margin_max",
            &raw.window_margin_max,
            DEFAULT_WINDOW_MARGIN_MAX,
            "a wider margin slows a 1 s window to less than a third",
        )?;
        Ok(Timing { upstream, body, shutdown, header, window_margin, window_margin_max })
    }
}

/// Who may call, and for which accounts: `accounts`, `caller`,
/// `caller_auth`, `max_accounts`.
struct Access {
    accounts: Option<HashSet<String>>,
    caller: Option<Arc<str>>,
    caller_auth: CallerAuth,
    max_accounts: Option<usize>,
}

impl Access {
    fn read(raw: &RawServer, listen: SocketAddr) -> Result<Access, Invalid> {
        let accounts = match &raw.accounts {
            None => None,
            Some(list) if list.is_empty() => {
                return Err(Invalid::at(
                    SERVER,
                    "accounts",
                    "an empty list refuses every call; leave the key out to allow any account",
                ))
            }
            Some(list) => match list.iter().find(|a| !valid_account(a)) {
                Some(bad) => {
                    return Err(Invalid::at(
                        SERVER,
                        "accounts",
                        format!("\"{bad}\" is not an account name (1-64 of A-Z a-z 0-9 _ -)"),
                    ))
                }
                None => Some(list.iter().cloned().collect()),
            },
        };
        let caller = match &raw.caller {
            None => None,
            Some(name) if valid_account(name) => Some(name.as_str().into()),
            Some(bad) => {
                return Err(Invalid::at(
                    SERVER,
                    "caller",
                    format!("\"{bad}\" is not a caller name (1-64 of A-Z a-z 0-9 _ -)"),
                ))
            }
        };
        let caller_auth = caller_auth(raw.caller_auth.as_deref(), listen)?;
        let max_accounts = match raw.max_accounts {
            Some(0) => return Err(Invalid::at(SERVER, "max_accounts", "must be at least 1 (leave it out for no cap)")),
            other => other,
        };
        if caller_auth.required() && caller.is_some() {
            return Err(Invalid::at(
                SERVER,
                "caller",
                "with caller_auth = \"required\" a call's caller is the one its key proves; remove caller",
            ));
        }
        Ok(Access { accounts, caller, caller_auth, max_accounts })
    }
}

/// `caller_auth`; off needs saying on a listener beyond loopback.
fn caller_auth(given: Option<&str>, listen: SocketAddr) -> Result<CallerAuth, Invalid> {
    let caller_auth = match given {
        None => CallerAuth::Off { explicit: false },
        Some("off") => CallerAuth::Off { explicit: true },
        Some("required") => CallerAuth::Required,
        Some(other) => {
            return Err(Invalid::at(
                SERVER,
                "caller_auth",
                format!("\"{other}\" is unknown (expected \"off\" or \"required\")"),
            ))
        }
    };
    if caller_auth == (CallerAuth::Off { explicit: false }) && !listen.ip().is_loopback() {
        return Err(Invalid::at(
            SERVER,
            "caller_auth",
            format!(
                "listen {listen} is beyond loopback, so any service that reaches it could spend (or pause) any \
                 account by naming it: set caller_auth = \"required\" and give each [[caller]] a key and its \
                 accounts, or write caller_auth = \"off\" to trust every caller that can reach it"
            ),
        ));
    }
    Ok(caller_auth)
}

/// An admin listener beyond loopback needs a token: the admin API lifts and
/// imposes penalties, so an open one on a pod or office network lets anyone
/// there switch off the protection wxgate exists for. This is an error, not
/// a warning, and has no opt-out: a warning scrolls past in a log nobody reads,
/// and a token costs one Secret (`/metrics` and the probes stay open without
/// it, so Prometheus and orchestrators need nothing). Loopback is 127.0.0.0/8
/// and `::1`.
fn check_admin_exposure(admin_listen: Option<SocketAddr>, has_token: bool) -> Result<(), Invalid> {
    match admin_listen {
        Some(addr) if !has_token && !addr.ip().is_loopback() => Err(Invalid::at(
            SERVER,
            "admin_listen",
            format!(
                "{addr} is reachable beyond this machine but no admin_token (or WXGATE_ADMIN_TOKEN) is set, so \
                 anyone who can reach it could lift penalties; set admin_token, or listen on 127.0.0.1"
            ),
        )),
        _ => Ok(()),
    }
}

/// `[server] upstream`: a URL (the default: WeChat's), or a list tried in
/// order. Each element passes [`parse_upstream`]; a list is not empty, has
/// at most [`Upstreams::MAX`] elements, no host:port twice (the metrics'
/// `upstream` label), and one path for all (a call's target does not depend
/// on which upstream takes it).
/// An upstream list (`[server] upstream`, a `[[domain]]`'s): `default` when not given.
pub(super) fn upstreams(raw: Option<&RawUpstream>, table: &str, default: &str) -> Result<Upstreams, Invalid> {
    let list = match raw {
        None => return parse_upstream(default).map(|u| Upstreams(vec![u])),
        Some(RawUpstream::One(text)) => {
            let uri = parse_upstream(text)
                .and_then(not_an_api_path)
                .map_err(|e| e.field(format!("\"{}\"", shown(text))).field("upstream").table(table))?;
            return Ok(Upstreams(vec![uri]));
        }
        Some(RawUpstream::List(list)) => list,
    };
    if list.is_empty() {
        return Err(Invalid::at(
            table,
            "upstream",
            format!("an empty list: give at least one URL, e.g. [\"{default}\"]"),
        ));
    }
    if list.len() > Upstreams::MAX {
        return Err(Invalid::at(
            table,
            "upstream",
            format!("{} URLs: at most {} are tried", list.len(), Upstreams::MAX),
        ));
    }
    let mut uris: Vec<http::Uri> = Vec::with_capacity(list.len());
    for (i, text) in list.iter().enumerate() {
        let field = format!("upstream[{i}]");
        let uri = parse_upstream(text)
            .and_then(not_an_api_path)
            .map_err(|e| e.field(format!("\"{}\"", shown(text))).field(field.as_str()).table(table))?;
        if let Some(j) = uris.iter().position(|u| same_host(u, &uri)) {
            return Err(Invalid::at(table, field, format!("\"{text}\": the same host and port as upstream[{j}]")));
        }
        if let Some(first) = uris.first() {
            if uri.path().trim_end_matches('/') != first.path().trim_end_matches('/') {
                return Err(Invalid::at(
                    table,
                    field,
                    format!(
                        "\"{text}\": its path must be upstream[0]'s (\"{}\"): a call keeps its path whichever \
                         upstream takes it",
                        first.path().trim_end_matches('/')
                    ),
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
pub(super) fn parse_upstream(text: &str) -> Result<http::Uri, Invalid> {
    if has_user_info(text) {
        return Err(Invalid::new(
            "must not carry user info (user:password@): wxgate never sends it to WeChat, and a URL is shown in \
             /readyz, `wxgate check` and the logs; give scheme://host[:port][/path] only",
        ));
    }
    let uri: http::Uri = text.parse().map_err(|e| Invalid::new(format!("not a URL ({e})")))?;
    match uri.scheme_str() {
        Some("http") | Some("https") => {}
        _ => return Err(Invalid::new("must start with http:// or https://")),
    }
    if uri.authority().is_none() {
        return Err(Invalid::new("has no host"));
    }
    if uri.query().is_some() {
        return Err(Invalid::new("must not have a query string"));
    }
    Ok(uri)
}

/// `[server] upstream`'s path, if any, is put before every call's path:
/// refused when it holds a segment where WeChat's API paths start
/// (`http://host/cgi-bin/` would send `/cgi-bin/cgi-bin/...`).
fn not_an_api_path(uri: http::Uri) -> Result<http::Uri, Invalid> {
    if let Some(root) = uri.path().split('/').find(|segment| API_ROOTS.contains(segment)) {
        let base = format!("{}://{}", uri.scheme_str().unwrap_or("https"), uri.authority().map_or("", |a| a.as_str()));
        return Err(Invalid::new(format!(
            "the path \"{}\" is part of WeChat's API paths, which every call's path already starts with (the \
             upstream's path is put before it: WeChat would get /{root}/{root}/...); give \"{base}\"",
            uri.path()
        )));
    }
    Ok(uri)
}

/// The first segments of WeChat's and WeCom's API paths: an upstream
/// whose path holds one would have it twice in every call's path.
const API_ROOTS: [&str; 6] = ["cgi-bin", "sns", "wxa", "wxaapi", "customservice", "datacube"];
