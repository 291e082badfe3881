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

use crate::admit::{admit, Held};
use crate::body::RelayBody;
use crate::clock::Clock;
use crate::config::{valid_account, Config};
use crate::error::{mark_throttled, retry_after_secs, ProxyError};
use crate::inspect::{sniff, Verdict};
use crate::limit::Reason;
use crate::reload::Reloads;
use crate::routes::normalise;
use crate::slots::Slots;
use crate::store::Store;
use crate::upstream::{strip_hop_by_hop, Upstream, UpstreamError};

/// Header naming the WeChat account (appid / corpid alias) a call is for.
pub const ACCOUNT_HEADER: &str = "x-wx-account";
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
}

/// Answers one request. Never fails: errors become WeChat-shaped answers.
pub async fn handle(app: &App, req: Request<Incoming>) -> Response<RelayBody> {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    match proxy(app, req).await {
        Ok(resp) => resp,
        Err(e) => {
            match &e {
                ProxyError::Upstream(_) | ProxyError::Unavailable(_) => {
                    tracing::warn!(%method, %path, error = %e, "call failed");
                }
                _ => tracing::debug!(%method, %path, error = %e, "call refused"),
            }
            e.into_response()
        }
    }
}

async fn proxy(app: &App, req: Request<Incoming>) -> Result<Response<RelayBody>, ProxyError> {
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
        Some(pq) if pq.as_str().starts_with('/') => pq.as_str().to_owned(),
        _ => return Err(ProxyError::BadRequest("the request target must be a path starting with /".into())),
    };
    let account = account_of(req.headers())?;
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
    let offset = config.server.quota_offset_us;

    // 3. decide (and hold, or wait for a concurrency slot)
    let admitted = match &rule {
        None => None,
        Some(rule) => Some(admit(app, &config, &account, rule).await?),
    };

    // 4. forward
    let upstream = app.upstream.load_full();
    let (mut parts, body) = req.into_parts();
    parts.uri = upstream
        .target(&path_and_query)
        .map_err(|e| ProxyError::BadRequest(format!("cannot forward this path: {e}")))?;
    parts.version = Version::HTTP_11;
    strip_hop_by_hop(&mut parts.headers);
    parts.headers.remove(HOST);
    parts.headers.remove(ACCOUNT_HEADER);
    let resp = upstream.send(Request::from_parts(parts, Limited::new(body, max_body as usize))).await?;

    // 5. inspect
    let (mut parts, body, verdict) =
        sniff(resp).await.map_err(|e| UpstreamError::Failed(format!("reading the answer: {e}")))?;
    strip_hop_by_hop(&mut parts.headers);
    if verdict == Verdict::Success && config.max_warmup_us > 0 && TOKEN_PATHS.contains(&normalise(&path).as_str()) {
        if let Err(e) = app.store.token_refreshed(&account, config.max_warmup_us).await {
            tracing::warn!(error = %e, "could not restart warm-up after a token refresh");
        }
    }
    let (Some(rule), Some(admitted)) = (rule, admitted) else {
        return Ok(Response::from_parts(parts, body));
    };
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
                parts.status = StatusCode::TOO_MANY_REQUESTS;
                mark_throttled(&mut parts.headers, &rule.name, Reason::Penalty, wait_us);
            }
        }
        Verdict::Success if admitted.escalated => {
            if let Err(e) = app.store.succeeded(&account, &rule, sent_at, offset).await {
                tracing::warn!(rule = %rule.name, error = %e, "could not end a penalty escalation");
            }
        }
        _ => {}
    }
    Ok(Response::from_parts(parts, body.holding(admitted.slot)))
}

/// The account a call is for: `X-Wx-Account` (1–64 of `[A-Za-z0-9_-]`) or `default`.
fn account_of(headers: &HeaderMap) -> Result<String, ProxyError> {
    let mut values = headers.get_all(ACCOUNT_HEADER).iter();
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

/// Shared handle used by the server.
pub type SharedApp = Arc<App>;
