//! The admin listener (`[server] admin_listen`, loopback by default; never
//! the proxy's listener):
//!
//! | endpoint | |
//! |---|---|
//! | `GET /metrics` | Prometheus text (OpenMetrics) |
//! | `GET /healthz` | the process is up |
//! | `GET /readyz` | ready to forward: config loaded, store reachable or fallback active; each upstream's health |
//! | `GET /v1/rules` | the compiled rules |
//! | `GET /v1/callers` | the declared callers: priority, flood guard (`rate`), refusals here |
//! | `GET /v1/buckets/{account}/{rule}` | one pair's state (`scope = "path"`: each path's; `?path=` one) |
//! | `DELETE /v1/penalties/{account}/{rule}` | lift a penalty (e.g. after `clear_quota`); `?path=` as above |
//! | `POST /v1/penalties/{account}/{rule}?seconds=N` | impose one |
//! | `GET /v1/penalties` | the penalties in force ([`overview::penalties`]) |
//! | `POST /v1/accounts/{account}/clear` | reset the account's day counts and penalties (a `clear_quota` done elsewhere) |
//!
//! With `[server] admin_token` (or `WXGATE_ADMIN_TOKEN`) set, `/v1/...`
//! needs `Authorization: Bearer <token>`; `/metrics` and the probes stay open.
//! A non-loopback `admin_listen` without a token is a config error.
//!
//! Requests that change state (any method but GET/HEAD) are refused with 403
//! when they could come from a browser page on another site, token or not
//! (see [`cross_site`]); curl and scripts are unaffected.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use http::header::{HeaderMap, HeaderValue, AUTHORIZATION, HOST, ORIGIN, WWW_AUTHENTICATE};
use http::{Method, Request, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::admit::callers::OTHER;
use crate::config::{valid_account, MemoryConfig, StoreConfig};
use crate::limit::{Key, Limit, Rule, Scope};
use crate::ops::overview;
use crate::proxy::app::App;
use crate::store::pair_op::SetPenalty;
use crate::store::Status;
use crate::telemetry::metrics::FileOp;

use crate::ops::answers::{answer, error, json_answer, Answer};

/// Serves the admin API until `stop` turns true.
pub fn serve(listener: TcpListener, app: Arc<App>, mut stop: watch::Receiver<bool>) {
    tokio::spawn(async move {
        loop {
            let (stream, _) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(c) => c,
                    Err(_) => continue,
                },
                _ = stop.changed() => return,
            };
            let app = app.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req| {
                    let app = app.clone();
                    async move { Ok::<_, Infallible>(route(&app, req).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(std::time::Duration::from_secs(10))
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
}

/// Binds the admin address, if one is configured.
pub async fn bind(addr: Option<SocketAddr>) -> Result<Option<TcpListener>, crate::proxy::start::StartError> {
    match addr {
        None => Ok(None),
        Some(addr) => TcpListener::bind(addr)
            .await
            .map(Some)
            .map_err(|source| crate::proxy::start::StartError::Admin { addr, source }),
    }
}

async fn route(app: &App, req: Request<Incoming>) -> Answer {
    let path = req.uri().path().to_owned();
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    if !matches!(*req.method(), Method::GET | Method::HEAD) {
        if let Some(why) = cross_site(req.headers()) {
            return error(StatusCode::FORBIDDEN, format!("refused: {why}; send it from curl or a script"));
        }
    }
    match (req.method(), segments.as_slice()) {
        (&Method::GET, ["metrics"]) => metrics(app),
        (&Method::GET, ["healthz"]) => answer(StatusCode::OK, "text/plain", "ok\n"),
        (&Method::GET, ["readyz"]) => ready(app),
        (&Method::GET | &Method::HEAD, [] | ["index.html" | "console.js" | "console.css"]) => {
            if let Some(denied) = check_token(app, &req) {
                return denied;
            }
            if let Some(refused) = rebinding(app, &req) {
                return refused;
            }
            crate::ops::console::asset(&path).unwrap_or_else(|| error(StatusCode::NOT_FOUND, "no such page"))
        }
        (_, ["v1", ..]) => {
            if let Some(denied) = check_token(app, &req) {
                return denied;
            }
            // A page on another site may not even read (the browser would
            // send the console's saved credentials): no CORS lets it see
            // the answer, but the reads cost store round trips.
            if fetched_from_another_site(req.headers()) {
                return error(StatusCode::FORBIDDEN, "refused: Sec-Fetch-Site says a page on another site asked");
            }
            if let Some(refused) = rebinding(app, &req) {
                return refused;
            }
            if let Some(why) = ambiguous_parameter(&req) {
                return error(StatusCode::BAD_REQUEST, why);
            }
            match (req.method(), &segments[1..]) {
                (&Method::GET, ["rules"]) => rules(app),
                (&Method::GET, ["accounts"]) => overview::top(app, query(&req, "top"), query(&req, "q")).await,
                (&Method::GET, ["accounts", account]) => overview::account(app, account).await,
                (&Method::GET, ["penalties"]) => overview::penalties(app).await,
                (&Method::GET, ["errcodes"]) => overview::errcodes(app),
                (&Method::GET, ["history"]) => overview::history(app),
                (&Method::GET, ["health"]) => overview::health(app),
                (&Method::GET, ["callers"]) => callers(app),
                (&Method::POST, ["accounts", account, "clear"]) => clear(app, account).await,
                (&Method::GET, ["buckets", account, rule]) => bucket(app, account, rule, query(&req, "path")).await,
                (&Method::DELETE, ["penalties", account, rule]) => {
                    penalty(app, account, rule, query(&req, "path"), Some(0)).await
                }
                (&Method::POST, ["penalties", account, rule]) => {
                    let seconds = query(&req, "seconds")
                        .and_then(|v| v.parse::<u64>().ok())
                        .filter(|&s| s > 0 && s <= 31 * 86_400);
                    match seconds {
                        Some(s) => penalty(app, account, rule, query(&req, "path"), Some(s as i64 * 1_000_000)).await,
                        None => error(StatusCode::BAD_REQUEST, "give ?seconds=N (1 to 2678400)"),
                    }
                }
                (method, rest) => match app.features.admin(app, method, rest).await {
                    Some((status, body)) => json_answer(status, body),
                    None => error(StatusCode::NOT_FOUND, format!("no such admin endpoint: {} {path}", req.method())),
                },
            }
        }
        _ => error(StatusCode::NOT_FOUND, format!("no such admin endpoint: {} {path}", req.method())),
    }
}

/// The value of `name` in the request's query, as sent (admin values are
/// names, paths and numbers: nothing to decode).
fn query<'a>(req: &'a Request<Incoming>, name: &str) -> Option<&'a str> {
    req.uri().query()?.split('&').find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
}

/// Why the query could be read two ways, or `None`: a parameter given
/// more than once (which one counts would be a guess), or a name
/// percent-encoded (`%74op` is not read as `top`, nor ignored).
fn ambiguous_parameter(req: &Request<Incoming>) -> Option<String> {
    let names: Vec<&str> = req.uri().query()?.split('&').map(|kv| kv.split_once('=').map_or(kv, |(k, _)| k)).collect();
    if let Some(name) = names.iter().find(|n| n.contains('%')) {
        return Some(format!("a parameter name is percent-encoded ({name}): write it as is"));
    }
    let (_, twice) = names.iter().enumerate().find(|(i, n)| names[..*i].contains(n))?;
    Some(format!("?{twice}= is given twice: give it once"))
}

/// `None` when the request carries the admin token (or none is set):
/// `Authorization: Bearer <token>`, or `Basic` with the token as the
/// password (any user name), which is what a browser sends for the console
/// once asked. Else 401, with a `Basic` challenge for the console's pages
/// (so that a browser asks) and `Bearer` for the API.
fn check_token(app: &App, req: &Request<Incoming>) -> Option<Answer> {
    let config = app.config.load();
    let expected = config.server.admin_token.as_deref()?;
    // Two credentials: which one counts would be a guess.
    let once = req.headers().get_all(AUTHORIZATION).iter().count() == 1;
    // The scheme is case-insensitive (RFC 9110 §11.1).
    let given = req
        .headers()
        .get(AUTHORIZATION)
        .filter(|_| once)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .and_then(|(scheme, value)| {
            if scheme.eq_ignore_ascii_case("bearer") {
                Some(value.trim().as_bytes().to_vec())
            } else if scheme.eq_ignore_ascii_case("basic") {
                use base64::Engine;
                let decoded = base64::engine::general_purpose::STANDARD.decode(value.trim()).ok()?;
                let colon = decoded.iter().position(|&b| b == b':')?;
                Some(decoded[colon + 1..].to_vec())
            } else {
                None
            }
        });
    if given.is_some_and(|g| crate::config::units::same_bytes(&g, expected.as_bytes())) {
        return None;
    }
    let page = !req.uri().path().starts_with("/v1/");
    let (message, challenge) = if page {
        (
            "the console needs the admin token: give it as the password (any user name)",
            "Basic realm=\"wxgate admin\", charset=\"UTF-8\"",
        )
    } else {
        ("the admin API needs Authorization: Bearer <admin_token>", "Bearer")
    };
    let mut resp = error(StatusCode::UNAUTHORIZED, message);
    resp.headers_mut().insert(WWW_AUTHENTICATE, HeaderValue::from_static(challenge));
    Some(resp)
}

/// Without a token, a DNS-rebound page could read the console or `/v1` on
/// the loopback default: its Host is the attacker's name.
fn rebinding(app: &App, req: &Request<Incoming>) -> Option<Answer> {
    if app.config.load().server.admin_token.is_some()
        || crate::transport::browser::host_names_an_address(host_of(req.headers()))
    {
        return None;
    }
    Some(error(
        StatusCode::FORBIDDEN,
        "refused: Host must be this listener's IP address or localhost (DNS rebinding); set admin_token to use a name",
    ))
}

fn host_of(headers: &HeaderMap) -> &str {
    headers.get(HOST).and_then(|h| h.to_str().ok()).unwrap_or("")
}

/// Why a state-changing request may have been sent by a browser page on
/// another site, or `None`. A page can POST or DELETE to a loopback port
/// without a preflight only as a "simple" request, which browsers always
/// mark: `Origin` (a page's own origin, `null` for sandboxes), and in modern
/// browsers `Sec-Fetch-Site`. A DNS-rebound page is same-origin by those
/// marks but its `Host` is the attacker's name, so `Host` must be an IP
/// literal or `localhost`. curl sends none of `Origin`/`Sec-Fetch-Site` and
/// `Host` as typed (an address), so scripts pass.
fn cross_site(headers: &HeaderMap) -> Option<&'static str> {
    let host = host_of(headers);
    if !crate::transport::browser::host_names_an_address(host) {
        return Some("Host must be this listener's IP address or localhost (DNS rebinding)");
    }
    if let Some(origin) = headers.get(ORIGIN) {
        let own =
            origin.to_str().ok().and_then(|o| o.strip_prefix("http://")).is_some_and(|o| o.eq_ignore_ascii_case(host));
        if !own {
            return Some("Origin is not the admin listener (a cross-site request from a browser)");
        }
    }
    match headers.get("sec-fetch-site").map(HeaderValue::as_bytes) {
        None | Some(b"same-origin" | b"none") => None,
        Some(_) => Some("Sec-Fetch-Site says a browser sent it from another site"),
    }
}

/// A browser says the request comes from a page of another origin's site
/// (`Sec-Fetch-Site: cross-site` or `same-site`: another port of the same
/// host is another origin). curl and scripts send no such header.
fn fetched_from_another_site(headers: &HeaderMap) -> bool {
    matches!(headers.get("sec-fetch-site").map(HeaderValue::as_bytes), Some(b"cross-site" | b"same-site"))
}

fn metrics(app: &App) -> Answer {
    let status = app.core.store.status();
    if status != Status::InProcess {
        app.core.metrics.breaker_open.set(i64::from(matches!(status, Status::Degraded(_))));
    }
    let config = app.config.load();
    let now = app.core.clock.now_us();
    app.core.forecasts.publish(&app.core.metrics, &config.rules, config.server.quota_offset_us, now);
    answer(StatusCode::OK, "application/openmetrics-text; version=1.0.0; charset=utf-8", app.core.metrics.encode())
}

fn ready(app: &App) -> Answer {
    let config = app.config.load();
    let status = app.core.store.status();
    let (ready, decisions) = overview::decisions(status);
    let store = status.kind();
    let status = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    let mut answer = json!({
            "ready": ready,
            "config": config.source.display().to_string(),
            "rules": config.rules.len(),
            "store": store,
            "decisions": decisions,
            // What the local fallback divides each limit by (Redis stores).
            "instances": app.core.store.instances(),
            "config_reloads": {
                "ok": app.reloads.ok.load(Ordering::Relaxed),
                "failed": app.reloads.failed.load(Ordering::Relaxed),
            },
            // Read in this order (see reload::watch).
            "config_watch": {
                "events": app.reloads.watched.events.load(Ordering::Acquire),
                "of_config_file": app.reloads.watched.of_config.load(Ordering::Acquire),
            },
    });
    if let StoreConfig::Memory(memory) = &config.store {
        answer["state_file"] = state_file(app, memory);
    }
    answer["upstreams"] = overview::upstreams(app);
    json_answer(status, answer)
}

/// The memory store's state file: where, and how its writes go (`null`
/// when it keeps none). Failing writes do not make wxgate unready: it
/// decides as well as ever, it would only forget more on a restart.
fn state_file(app: &App, memory: &MemoryConfig) -> Value {
    let Some(path) = &memory.state_file else { return Value::Null };
    let m = &app.core.metrics.memory_store;
    let last = m.last_save.get();
    json!({
        "path": path.display().to_string(),
        "flush_interval_ms": memory.flush_interval.as_millis() as u64,
        "saves": m.saves.get(),
        "last_save_unix": (last > 0).then_some(last),
        "save_errors": m.file_errors(FileOp::save),
        "load_errors": m.file_errors(FileOp::load),
    })
}

/// One limit as `GET /v1/rules` shows it (a rule's, or an override's).
fn limit_json(l: &Limit) -> Value {
    match l {
        Limit::Window(w) => json!({
            "kind": "window",
            "count": w.count(),
            "per_seconds": w.per_us() as f64 / 1e6,
            "burst": w.burst(),
            "refill_per_second": w.refill_per_second(),
            "margin_ms": w.margin_us() as f64 / 1e3,
        }),
        Limit::Calendar { count, period } => json!({ "kind": "calendar", "count": count, "per": period.as_str() }),
    }
}

fn rule_json(rule: &Rule, http: &crate::config::RuleHttp) -> Value {
    let limits: Vec<Value> = rule.limits.iter().map(limit_json).collect();
    let mut shown = json!({
        "name": &*rule.name,
        "match": rule.patterns,
        "scope": rule.scope.as_str(),
        "limits": limits,
    });
    for option in rule.shown() {
        shown[option.key] = option.value;
    }
    shown["throttle_status"] = json!(http.throttle_status.as_u16());
    shown["recipients"] = http.recipients.as_ref().map_or(Value::Null, |m| m.shown());
    shown
}

fn rules(app: &App) -> Answer {
    let config = app.config.load();
    json_answer(
        StatusCode::OK,
        Value::Array(
            config
                .rules
                .iter()
                .map(|r| {
                    let mut shown = rule_json(r, config.rule_http(Some(r)));
                    // Its `[[quota]]` overrides: each account's own limits.
                    let overrides = config.overrides.of_rule(&r.name).map(|o| {
                        json!({
                            "account": &*o.account,
                            "limits": o.limits.iter().map(limit_json).collect::<Vec<_>>(),
                            "line": o.line,
                        })
                    });
                    shown["overrides"] = Value::Array(overrides.collect());
                    shown
                })
                .collect(),
        ),
    )
}

/// `GET /v1/callers`: the caller of calls without `X-Wx-Caller`, and each
/// declared caller (file order) with its priority, its flood guard and the
/// calls the guard refused on this instance.
fn callers(app: &App) -> Answer {
    let callers = app.callers.load();
    let declared: Vec<Value> = callers
        .declared()
        .iter()
        .map(|c| {
            let rate = c.policy().and_then(|p| p.rate);
            json!({
                "name": &*c.name,
                "priority": c.priority().as_str(),
                "rate": rate.map(|r| r.to_string()),
                "rate_per_second": rate.map(|r| r.per_second()),
                "burst": rate.map(|r| r.count.get()),
                "rate_refusals_here": c.entry.metrics.rate_refusals.get(),
                "calls": outcomes(&c.entry.metrics),
                "has_key": c.policy().is_some_and(|p| p.key.is_some()),
                "accounts": c.policy().map(|p| match &p.grants {
                    crate::config::Grants::Unset => Value::Null,
                    crate::config::Grants::All => json!(["*"]),
                    crate::config::Grants::Listed(list) => json!(list.iter().map(|a| &**a).collect::<Vec<_>>()),
                }),
            })
        })
        .collect();
    json_answer(
        StatusCode::OK,
        json!({
            "header": "X-Wx-Caller",
            "caller_auth": if app.config.load().server.caller_auth.required() { "required" } else { "off" },
            "without_header": &*callers.fallback().name,
            "undeclared_label": OTHER,
            "undeclared": { "calls": outcomes(&app.core.metrics.caller(OTHER)) },
            "callers": declared,
        }),
    )
}

/// A caller's calls on this instance by outcome (those at 0 left out).
fn outcomes(m: &crate::telemetry::metrics::CallerMetrics) -> Value {
    Value::Object(m.outcomes().into_iter().map(|(o, n)| (o.as_str().to_owned(), json!(n))).collect())
}

/// The rule named `rule` and the states an admin request about it reads or
/// writes: the rule's own, or its per-path states (all, or the one `path`
/// names).
#[allow(clippy::type_complexity)]
fn find_states(
    app: &App,
    account: &str,
    rule: &str,
    path: Option<&str>,
) -> Result<(Arc<Rule>, Vec<Arc<Rule>>), Box<Answer>> {
    if !valid_account(account) {
        return Err(Box::new(error(StatusCode::BAD_REQUEST, "the account must be 1-64 characters of A-Z a-z 0-9 _ -")));
    }
    let config = app.config.load();
    let Some(found) = config.rules.iter().find(|r| &*r.name == rule).cloned() else {
        return Err(Box::new(error(StatusCode::NOT_FOUND, format!("no rule named \"{rule}\""))));
    };
    // The account's own limits where a `[[quota]]` overrides the rule's.
    let own = |s: &Arc<Rule>| config.rule_of(account, s).clone();
    let states: Vec<Arc<Rule>> = match (found.scope, path) {
        (Scope::Rule | Scope::App, None) => vec![own(&found)],
        (Scope::Rule | Scope::App, Some(_)) => {
            return Err(Box::new(error(
                StatusCode::BAD_REQUEST,
                format!(
                    "rule \"{rule}\" counts its paths together (scope = \"{}\"): leave out ?path=",
                    found.scope.as_str()
                ),
            )))
        }
        (Scope::Path, None) => config.states_of(rule).map(own).collect(),
        (Scope::Path, Some(p)) => config.states_of(rule).filter(|s| s.path.as_deref() == Some(p)).map(own).collect(),
    };
    if states.is_empty() {
        let listed = found.patterns.join(", ");
        return Err(Box::new(error(
            StatusCode::NOT_FOUND,
            format!("rule \"{rule}\" lists no path {}: it counts {listed}", path.unwrap_or("")),
        )));
    }
    Ok((found, states))
}

/// `GET /v1/buckets/{account}/{rule}`: the rule's state; for a rule with
/// `scope = "path"`, each listed path's (`paths`), or one (`?path=`).
async fn bucket(app: &App, account: &str, rule: &str, path: Option<&str>) -> Answer {
    let (rule, states) = match find_states(app, account, rule, path) {
        Ok(r) => r,
        Err(resp) => return *resp,
    };
    let mut pictures = Vec::with_capacity(states.len());
    for state in &states {
        match overview::picture(app, account, state).await {
            Ok(p) => pictures.push(p),
            Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, e),
        }
    }
    match (rule.scope, path) {
        (Scope::Path, None) => json_answer(
            StatusCode::OK,
            json!({ "account": account, "rule": &*rule.name, "scope": "path", "paths": pictures }),
        ),
        _ => json_answer(StatusCode::OK, pictures.pop().unwrap_or(Value::Null)),
    }
}

/// `POST /v1/accounts/{account}/clear`: what a `clear_quota` passing
/// through does ([`crate::features::quota_clear`]), by hand.
async fn clear(app: &App, account: &str) -> Answer {
    if !valid_account(account) {
        return error(StatusCode::BAD_REQUEST, "the account must be 1-64 characters of A-Z a-z 0-9 _ -");
    }
    let config = app.config.load_full();
    match crate::features::quota_clear::clear_account(&app.core, &config, account).await {
        Ok(()) => {
            tracing::info!(%account, "quota cleared by hand: day counts and penalties start again");
            let rules: Vec<&str> = config.rules.iter().map(|r| &*r.name).collect();
            json_answer(StatusCode::OK, json!({ "account": account, "cleared": true, "rules": rules }))
        }
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e),
    }
}

/// Sets (or with 0 lifts) the penalty of the rule's state, or of every
/// listed path of a rule with `scope = "path"` (one with `?path=`).
async fn penalty(app: &App, account: &str, rule: &str, path: Option<&str>, len_us: Option<i64>) -> Answer {
    let (rule, states) = match find_states(app, account, rule, path) {
        Ok(r) => r,
        Err(resp) => return *resp,
    };
    let offset = app.config.load().server.quota_offset_us;
    let len = len_us.unwrap_or(0);
    let mut remaining_us = 0;
    for state in &states {
        match app.core.store.apply(Key { account, rule: state, offset_us: offset }, SetPenalty { len_us: len }).await {
            Ok(end) => remaining_us = remaining_us.max(end.remaining_us()),
            Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, e),
        }
    }
    tracing::info!(%account, rule = %rule.name, path, seconds = len / 1_000_000, "penalty set by hand (0 = lifted)");
    let mut answer = json!({
        "account": account,
        "rule": &*rule.name,
        "penalty_seconds": (remaining_us as f64 / 1e6),
        "lifted": len == 0,
    });
    if let (Scope::Path, Some(fields)) = (rule.scope, answer.as_object_mut()) {
        let paths = states.iter().filter_map(|s| s.path.as_deref()).map(Value::from).collect();
        fields.insert("paths".into(), Value::Array(paths));
    }
    json_answer(StatusCode::OK, answer)
}
