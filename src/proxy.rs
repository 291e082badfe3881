//! The phases of one call, in order:
//!
//! 1. **accept**: origin-form targets only (`CONNECT` and absolute-form get
//!    400: wxgate is never an open proxy), `X-Wx-Account` validated.
//! 2. **route**: path → rule ([`crate::routes`]).
//! 3. **decide**: one store call ([`crate::store`]); a refusal is answered 429
//!    here and never reaches WeChat.
//! 4. **forward**: method, path, query, headers and body unchanged but for
//!    hop-by-hop headers, `Host` and `X-Wx-Account`; sent exactly once.
//! 5. **inspect**: a small JSON answer is read for its errcode
//!    ([`crate::inspect`]); a penalised one starts a penalty and reaches the
//!    client as 429 + `Retry-After` with WeChat's body unchanged.
//!
//! Every accepted request gets exactly one response: each phase either hands
//! on or returns a [`ProxyError`], which [`handle`] turns into the answer.

use std::sync::Arc;

use arc_swap::ArcSwap;
use http::header::HOST;
use http::{HeaderMap, Method, Request, Response, StatusCode, Version};
use http_body_util::Limited;
use hyper::body::Incoming;

use crate::activity::{Activity, Kind};
use crate::admit::{admit, Held};
use crate::body::RelayBody;
use crate::clock::Clock;
use crate::clock::Micros;
use crate::config::{valid_account, Config};
use crate::error::{mark_throttled, retry_after_secs, ProxyError};
use crate::inspect::{sniff, Verdict};
use crate::limit::{Reason, Rule};
use crate::metrics::{InFlightGuard, Metrics, Outcome, NO_RULE};
use crate::ratelimit;
use crate::reload::Reloads;
use crate::routes::normalise;
use crate::slots::Slots;
use crate::store::Store;
use crate::upstream::{strip_hop_by_hop, Upstream, UpstreamError};

/// Header naming the WeChat account (appid / corpid alias) a call is for.
pub const ACCOUNT_HEADER: &str = "x-wx-account";
const ACCOUNT: http::HeaderName = http::HeaderName::from_static(ACCOUNT_HEADER);
/// Account used when a call names none.
pub const DEFAULT_ACCOUNT: &str = "default";

/// Paths whose successful answer is a fresh access token (OA/MP, stable, WeCom).
const TOKEN_PATHS: [&str; 3] = ["/cgi-bin/token", "/cgi-bin/stable_token", "/cgi-bin/gettoken"];

/// Everything a call needs; shared by every connection.
pub struct App {
    pub config: ArcSwap<Config>,
    pub store: Arc<Store>,
    /// Swapped by a reload that changes the upstream settings.
    pub upstream: ArcSwap<Upstream>,
    pub clock: Arc<dyn Clock>,
    /// Concurrency slots held by this instance's calls.
    pub slots: Arc<Slots>,
    /// Calls held for shaping right now.
    pub held: Held,
    pub reloads: Reloads,
    pub metrics: Metrics,
    /// Held and in-flight calls per (account, rule), on this instance.
    pub activity: Arc<Activity>,
}

/// What one call did, for the access log and the metrics.
struct CallLog {
    rule: Option<Arc<Rule>>,
    account: String,
    outcome: Outcome,
    status: u16,
    errcode: Option<i64>,
    decision_us: Micros,
    upstream_us: Micros,
    held_us: Micros,
}

/// Answers one request. Never fails: errors become WeChat-shaped answers.
pub async fn handle(app: &App, req: Request<Incoming>) -> Response<RelayBody> {
    let method = req.method().clone();
    // The path only: the query carries access_token and other secrets.
    let path = req.uri().path().to_owned();
    let mut log = CallLog {
        rule: None,
        account: String::new(),
        outcome: Outcome::forwarded,
        status: 0,
        errcode: None,
        decision_us: 0,
        upstream_us: 0,
        held_us: 0,
    };
    let resp = match proxy(app, req, &mut log).await {
        Ok(resp) => resp,
        Err(e) => {
            log.outcome = match &e {
                ProxyError::BadRequest(_) | ProxyError::TooLarge(_) => Outcome::rejected_bad_request,
                ProxyError::Upstream(UpstreamError::BodyTooLarge) => Outcome::rejected_bad_request,
                ProxyError::Throttled { reason: Reason::Penalty, .. } => Outcome::penalised,
                ProxyError::Throttled { .. } => Outcome::throttled,
                ProxyError::Unavailable(_) => Outcome::unavailable,
                ProxyError::Upstream(_) => Outcome::upstream_error,
            };
            if matches!(log.outcome, Outcome::upstream_error | Outcome::unavailable) {
                tracing::warn!(%method, %path, error = %e, "call failed");
            }
            let refused = match &e {
                ProxyError::Throttled { reason, wait_us, .. } => Some((*reason, *wait_us)),
                _ => None,
            };
            let mut resp = e.into_response();
            if let (Some((reason, wait_us)), Some(rule)) = (refused, log.rule.as_ref()) {
                if app.config.load().server.ratelimit_headers {
                    ratelimit::refused(resp.headers_mut(), rule, reason, wait_us);
                }
            }
            resp
        }
    };
    log.status = resp.status().as_u16();
    let rule = log.rule.as_ref().map_or(NO_RULE, |r| &*r.name);
    app.metrics.rule(rule).call(log.outcome);
    if app.config.load().log.access {
        tracing::info!(
            target: "wxgate::access",
            %method,
            %path,
            rule,
            account = %log.account,
            outcome = log.outcome.as_str(),
            status = log.status,
            errcode = log.errcode,
            decision_ms = log.decision_us as f64 / 1000.0,
            upstream_ms = log.upstream_us as f64 / 1000.0,
            held_ms = log.held_us as f64 / 1000.0,
        );
    }
    resp
}
async fn proxy(app: &App, req: Request<Incoming>, log: &mut CallLog) -> Result<Response<RelayBody>, ProxyError> {
    let config = app.config.load_full();
    // 1. accept
    if req.method() == Method::CONNECT {
        return Err(ProxyError::BadRequest(
            "CONNECT is not served: wxgate only forwards to its configured upstream".into(),
        ));
    }
    if req.uri().scheme().is_some() || req.uri().authority().is_some() {
        return Err(ProxyError::BadRequest(
            "absolute-form request targets are not served: send origin-form (/cgi-bin/...) to wxgate".into(),
        ));
    }
    let path_and_query = match req.uri().path_and_query() {
        Some(pq) if pq.as_str().starts_with('/') => pq.clone(),
        _ => return Err(ProxyError::BadRequest("the request target must be a path starting with /".into())),
    };
    let account = account_of(req.headers())?;
    log.account.clone_from(&account);
    // Counted before anything is decided or forwarded; a streamed body that
    // grows past the cap is cut off on the way (413 as well).
    let max_body = config.server.max_body;
    let declared = req
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max_body) {
        return Err(ProxyError::TooLarge(format!(
            "the request body is larger than {max_body} bytes ([server] max_body)"
        )));
    }

    // 2. route
    let path = req.uri().path().to_owned();
    let rule = config.routes.lookup(&path).and_then(|i| config.rules.get(i)).cloned();
    log.rule.clone_from(&rule);
    let rule_name = rule.as_ref().map_or(NO_RULE, |r| &*r.name);
    let metrics = app.metrics.rule(rule_name);

    // 3. decide (and hold, or wait for a concurrency slot)
    let admitted = match &rule {
        None => None,
        Some(rule) => {
            let started = std::time::Instant::now();
            let admitted = admit(app, &config, &account, rule).await;
            let decision_us = match &admitted {
                Ok(a) => a.decision_us,
                Err(_) => started.elapsed().as_micros() as Micros,
            };
            log.decision_us = decision_us;
            metrics.decision.observe(decision_us as f64 / 1e6);
            let admitted = admitted?;
            log.held_us = admitted.held_us;
            if admitted.held_us > 0 {
                log.outcome = Outcome::held;
                metrics.hold.observe(admitted.held_us as f64 / 1e6);
            }
            if admitted.degraded {
                log.outcome = Outcome::degraded;
            }
            if let Some((reason, wait_us)) = admitted.shadow_refusal {
                log.outcome = Outcome::shadow_throttled;
                tracing::info!(rule = rule_name, %account, reason = reason.as_str(), wait_s = retry_after_secs(wait_us), "shadow mode: would have refused this call");
            }
            Some(admitted)
        }
    };

    // 4. forward
    let upstream = app.upstream.load_full();
    let (mut parts, body) = req.into_parts();
    parts.uri = upstream
        .target(&path_and_query)
        .map_err(|e| ProxyError::BadRequest(format!("cannot forward this path: {e}")))?;
    parts.version = Version::HTTP_11;
    strip_hop_by_hop(&mut parts.headers);
    parts.headers.insert(HOST, upstream.host().clone());
    parts.headers.remove(ACCOUNT);
    let in_flight = InFlightGuard::new(metrics.in_flight.clone());
    let activity = rule.as_ref().map(|r| app.activity.enter(&account, &r.name, Kind::InFlight));
    let sent = std::time::Instant::now();
    let resp = upstream.send(Request::from_parts(parts, Limited::new(body, max_body as usize))).await;
    log.upstream_us = sent.elapsed().as_micros() as Micros;
    metrics.upstream.observe(log.upstream_us as f64 / 1e6);
    let resp = resp?;

    // 5. inspect
    let (mut parts, body, verdict) =
        sniff(resp).await.map_err(|e| UpstreamError::Failed(format!("reading the answer: {e}")))?;
    strip_hop_by_hop(&mut parts.headers);
    let body = body.holding((in_flight, activity));
    match verdict {
        Verdict::Errcode(code) => {
            log.errcode = Some(code);
            metrics.errcode(code);
        }
        Verdict::Success => {
            log.errcode = Some(0);
            metrics.errcode(0);
        }
        Verdict::Unknown => {}
    }
    if verdict == Verdict::Success && config.max_warmup_us > 0 && TOKEN_PATHS.contains(&normalise(&path).as_str()) {
        if let Err(e) = app.store.token_refreshed(&account, config.max_warmup_us).await {
            tracing::warn!(error = %e, "could not restart warm-up after a token refresh");
        }
    }
    let (Some(rule), Some(admitted)) = (rule, admitted) else {
        return Ok(Response::from_parts(parts, body));
    };
    let offset = config.server.quota_offset_us;
    let sent_at = admitted.at;
    match verdict {
        Verdict::Errcode(code) => {
            if let Some(policy) = config.penalties.iter().find(|p| p.errcode == code) {
                let wait_us = match app.store.penalise(&account, &rule, policy, sent_at, offset).await {
                    Ok((until, now)) => until - now,
                    Err(e) => {
                        tracing::warn!(rule = %rule.name, error = %e, "could not store a penalty");
                        policy.until(0, sent_at, offset) - sent_at
                    }
                };
                tracing::info!(rule = %rule.name, %account, errcode = code, wait_s = retry_after_secs(wait_us), "WeChat penalised a call");
                // Shadow mode records the penalty but passes WeChat's answer on as it is.
                if !rule.shadow {
                    log.outcome = Outcome::penalised;
                    parts.status = StatusCode::TOO_MANY_REQUESTS;
                    mark_throttled(&mut parts.headers, &rule.name, Reason::Penalty, wait_us);
                }
            }
        }
        Verdict::Success if admitted.escalated => {
            if let Err(e) = app.store.succeeded(&account, &rule, sent_at, offset).await {
                tracing::warn!(rule = %rule.name, error = %e, "could not end a penalty escalation");
            }
        }
        _ => {}
    }
    if config.server.ratelimit_headers {
        ratelimit::admitted(&mut parts.headers, &rule, admitted.quota);
    }
    Ok(Response::from_parts(parts, body.holding(admitted.slot)))
}

/// The account a call is for: `X-Wx-Account` (1–64 of `[A-Za-z0-9_-]`) or `default`.
fn account_of(headers: &HeaderMap) -> Result<String, ProxyError> {
    let mut values = headers.get_all(ACCOUNT).iter();
    let Some(value) = values.next() else {
        return Ok(DEFAULT_ACCOUNT.to_owned());
    };
    if values.next().is_some() {
        return Err(ProxyError::BadRequest("X-Wx-Account is given more than once".into()));
    }
    match value.to_str() {
        Ok(v) if valid_account(v) => Ok(v.to_owned()),
        _ => Err(ProxyError::BadRequest("X-Wx-Account must be 1-64 characters of A-Z a-z 0-9 _ -".into())),
    }
}
