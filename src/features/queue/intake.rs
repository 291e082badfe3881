//! The intake of queued delivery: which calls are queued, what of their
//! request is read and checked, and the 202 they get.
//!
//! - **Asked for**: `Prefer: respond-async` (RFC 7240; any `Prefer` field
//!   naming it), or a `[[caller]]` with `deliver = "queue"`. Asked for
//!   explicitly on a rule without `queue = true` (or a call without a
//!   rule): 400 naming the rule; a caller's default only applies where the
//!   rule queues (elsewhere its calls go live as before).
//! - **Read whole**: the body, at most `[queue] max_body` (413 past it);
//!   `Idempotency-Key` (once, 1-255 visible ASCII), `X-Wxgate-Deadline`
//!   (once: seconds from now, or an RFC 3339 time; in the past, malformed
//!   or more than 31 days away: 400), `X-Wxgate-Callback` (once, under one
//!   of the caller's `callbacks` prefixes: else 400).
//! - **Whose token**: the job is sent with the account's own token, added
//!   by the broker at send time; the caller's `access_token` is taken out
//!   of the stored target (no secret at rest). So the account must be an
//!   `[[account]]` whose token wxgate holds (400 otherwise).
//! - **Stored, then answered**: `202 Accepted`, `Location:
//!   /v1/deliveries/<id>`, `Preference-Applied: respond-async` (when asked
//!   so), body `{"errcode":0,"errmsg":"queued","delivery":"<id>"}` (an SDK
//!   that reads errcode sees success). A bound passed: 429 `queue_full`,
//!   nothing stored.
//! - **When it can go**: `X-Wxgate-Eta`, the earliest time the new job can
//!   be sent (after the jobs before it in its queue, the day quota shared
//!   with the account's live calls at their current rate:
//!   `crate::admit::forecasts::drained_at`), and `X-Wxgate-Eta-Late:
//!   deadline` when that is past its deadline. Such a job is stored all the
//!   same: the estimate is of the earliest at today's rates (a clear_quota,
//!   quieter live traffic or a learned higher limit can still make it), the
//!   caller holds its id to cancel it, and a job never goes past its
//!   deadline (it ends `expired`, unsent). Not given for a repeated
//!   `Idempotency-Key`, a rule with `scope = "path"`, or when the stores
//!   do not answer (the 202 does not wait on them failing). Cost: the
//!   queue's counts (`JobStore::queue_summary`: one script on Redis) and
//!   one read of the pair's state, per new job.

use bytes::Bytes;
use http::header::{CONTENT_TYPE, LOCATION};
use http::{HeaderMap, HeaderValue, Response, StatusCode};

use crate::error::ProxyError;
use crate::features::hooks::{Asking, Env, Requesting};
use crate::jobs::{Bound, Lanes, NewJob, QueueKey, SubmitError};
use crate::time::Micros;
use crate::transport::body::RelayBody;

pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
pub const DEADLINE: &str = "x-wxgate-deadline";
pub const CALLBACK: &str = "x-wxgate-callback";
/// Set on the 202 of a repeated `Idempotency-Key` (nothing new stored).
pub const DUPLICATE: &str = "x-wxgate-duplicate";
/// The earliest time a new job can be sent (RFC 3339, UTC).
pub const ETA: &str = "x-wxgate-eta";
/// `deadline`: [`ETA`] is past the job's deadline.
pub const ETA_LATE: &str = "x-wxgate-eta-late";

/// Longest `Idempotency-Key`, and longest callback URL.
const MAX_KEY: usize = 255;
const MAX_CALLBACK: usize = 2048;
/// Longest stored content type.
const MAX_CONTENT_TYPE: usize = 128;
/// How long a caller refused `queue_full` is told to wait.
const FULL_RETRY_US: Micros = 60_000_000;

/// What the intake read of a call to be queued.
pub struct Asked {
    /// `Prefer: respond-async` was given (else: the caller's default).
    pub preferred: bool,
    pub key: Option<String>,
    /// Absolute (wxgate's clock), when the call gave one.
    pub deadline_us: Option<Micros>,
    pub callback: Option<String>,
    pub content_type: Option<String>,
}

/// Whether `headers` ask for an asynchronous answer.
pub fn prefers_async(headers: &HeaderMap) -> bool {
    // A constant: `from_static` checks its name when it runs.
    const PREFER: http::header::HeaderName = http::header::HeaderName::from_static("prefer");
    headers.get_all(PREFER).iter().any(|v| {
        v.to_str().is_ok_and(|v| {
            v.split(',').any(|p| p.split(';').next().is_some_and(|t| t.trim().eq_ignore_ascii_case("respond-async")))
        })
    })
}

/// The call's queue request, read and checked (`None`: a live call).
/// Whether the call is to be queued (`Ok(Some(preferred))`: asked for
/// with `Prefer: respond-async`, or by its caller's default), before
/// anything of it is read: one header lookup, and none of the rest for a
/// live call. 400 for `Prefer: respond-async` on a rule that does not queue.
pub fn wanted(req: &Requesting<'_>) -> Result<Option<bool>, ProxyError> {
    let Some(incoming) = req.incoming.as_deref() else { return Ok(None) };
    let preferred = prefers_async(incoming.headers());
    let queues = req.rule.and_then(|r| req.config.rule_http(Some(r)).queue).is_some();
    if !queues {
        if preferred {
            let rule = req.rule.map_or_else(|| "(none: no rule matches this path)".to_owned(), |r| r.name.to_string());
            return Err(ProxyError::BadRequest(format!(
                "Prefer: respond-async asks for queued delivery, but rule \"{rule}\" does not queue its calls \
                 (queue = true); send it without Prefer: respond-async"
            )));
        }
        return Ok(None);
    }
    if !preferred && !req.who.caller.policy().is_some_and(|p| p.queue_default) {
        return Ok(None);
    }
    Ok(Some(preferred))
}

/// The queue request of a call [`wanted`] found to be queued, read and checked.
pub async fn read(
    jobs: &super::slot::JobsSlot,
    env: Env<'_>,
    req: &mut Requesting<'_>,
    preferred: bool,
) -> Result<Option<Asked>, ProxyError> {
    let Some(incoming) = req.incoming.as_deref() else { return Ok(None) };
    let headers = incoming.headers();
    jobs.or_refusal()?;
    let key = once(headers, IDEMPOTENCY_KEY)?
        .map(|v| {
            let ok = (1..=MAX_KEY).contains(&v.len()) && v.bytes().all(|b| b.is_ascii_graphic());
            ok.then(|| v.to_owned()).ok_or_else(|| {
                ProxyError::BadRequest(format!("Idempotency-Key must be 1-{MAX_KEY} visible ASCII characters"))
            })
        })
        .transpose()?;
    let now = env.core.clock.now_us();
    let deadline_us = once(headers, DEADLINE)?.map(|v| deadline(v, now)).transpose()?;
    let callback = match once(headers, CALLBACK)? {
        None => None,
        Some(url) => Some(callback(url, req.who.caller.policy().map_or(&[][..], |p| &p.callbacks))?),
    };
    let content_type = match once(headers, CONTENT_TYPE.as_str())? {
        Some(v) if v.len() <= MAX_CONTENT_TYPE => Some(v.to_owned()),
        Some(_) => return Err(ProxyError::BadRequest(format!("Content-Type is longer than {MAX_CONTENT_TYPE} bytes"))),
        None => None,
    };
    // The stored body is sent later with its Content-Type only: an encoded
    // body would reach WeChat undecoded, so it is refused, never guessed.
    if headers.get_all(http::header::CONTENT_ENCODING).iter().any(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity")) {
        return Err(ProxyError::BadRequest(
            "a queued call's body must not be encoded (Content-Encoding): send it as plain JSON".into(),
        ));
    }
    let cap = req.config.queue.max_body;
    req.read_body(cap, "a queued call ([queue] max_body)").await?;
    Ok(Some(Asked { preferred, key, deadline_us, callback, content_type }))
}

/// The one value of header `name` (`None`: not given; 400 if given twice
/// or not text).
fn once<'h>(headers: &'h HeaderMap, name: &str) -> Result<Option<&'h str>, ProxyError> {
    let mut all = headers.get_all(name).iter();
    let Some(value) = all.next() else { return Ok(None) };
    if all.next().is_some() {
        return Err(ProxyError::BadRequest(format!("{name} is given more than once")));
    }
    value.to_str().map(Some).map_err(|_| ProxyError::BadRequest(format!("{name} is not visible ASCII")))
}

/// `X-Wxgate-Deadline`: whole seconds from now, or an RFC 3339 time.
pub fn deadline(text: &str, now: Micros) -> Result<Micros, ProxyError> {
    let bad = |why: &str| ProxyError::BadRequest(format!("X-Wxgate-Deadline {why}"));
    let at = if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        let secs: i64 = text.parse().map_err(|_| bad("is too large"))?;
        now.saturating_add(secs.saturating_mul(1_000_000))
    } else {
        crate::time::parse_rfc3339(text)
            .ok_or_else(|| bad("must be seconds from now (\"300\") or an RFC 3339 time (\"2026-12-03T18:00:00Z\")"))?
    };
    if at <= now {
        return Err(bad("is in the past: the message could never be sent in time"));
    }
    let most = crate::config::queue::MAX_DEADLINE.as_micros() as i64;
    if at - now > most {
        return Err(bad("is more than 31 days away"));
    }
    Ok(at)
}

/// `X-Wxgate-Callback`: a URL under one of the caller's prefixes.
fn callback(url: &str, allowed: &[String]) -> Result<String, ProxyError> {
    if url.len() > MAX_CALLBACK || url.contains(['#', '@']) || url.bytes().any(|b| b.is_ascii_whitespace()) {
        return Err(ProxyError::BadRequest(format!(
            "X-Wxgate-Callback must be a URL of at most {MAX_CALLBACK} bytes, without a user or fragment"
        )));
    }
    if allowed.iter().any(|prefix| crate::config::units::under_prefix(url, prefix)) {
        return Ok(url.to_owned());
    }
    Err(ProxyError::BadRequest(
        "X-Wxgate-Callback is not under one of this caller's callbacks prefixes ([[caller]] callbacks)".into(),
    ))
}

/// Stores the call as a job and answers 202, or refuses it.
pub async fn submit(
    jobs: &super::slot::JobsSlot,
    env: Env<'_>,
    asked: Asked,
    asking: &Asking<'_>,
) -> Result<Response<RelayBody>, ProxyError> {
    let jobs = jobs.or_refusal()?;
    let config = asking.config;
    let Some(rule) = asking.rule else { return Err(ProxyError::BadRequest("no rule".into())) };
    let account = &asking.who.account;
    if !config.accounts.get(account).is_some_and(|a| a.injects()) {
        return Err(ProxyError::BadRequest(format!(
            "queued delivery sends a job with the account's own token, added when it is sent; account \"{account}\" \
             is not an [[account]] whose token wxgate holds (name one with X-Wx-Account or /@account/)"
        )));
    }
    let domain: std::sync::Arc<str> = config.domains.get(asking.domain).map_or_else(|| "".into(), |d| d.host.clone());
    let deadline_us = match asked.deadline_us {
        Some(at) => at,
        None => {
            let after = config.rule_http(Some(rule)).queue.flatten().unwrap_or(config.queue.deadline_us);
            env.core.clock.now_us().saturating_add(after)
        }
    };
    let queue = QueueKey {
        caller: asking.who.caller.entry.label().into(),
        account: account.as_str().into(),
        rule: rule.name.clone(),
    };
    let job = NewJob {
        queue: queue.clone(),
        domain,
        method: asking.method.as_str().to_owned(),
        target: without_token(asking.target),
        content_type: asked.content_type,
        body: asking.body.cloned().unwrap_or_default(),
        deadline_us: Some(deadline_us),
        idempotency_key: asked.key,
        callback: asked.callback,
        // The submitting call's span (this runs in its task).
        traceparent: crate::telemetry::trace::current().map(|c| c.traceparent()),
        lanes: lanes(config, rule, asking),
    };
    let now = env.core.clock.now_us();
    let submitted = match jobs.submit(job, &config.queue.bounds, now).await {
        Ok(s) => s,
        Err(SubmitError::Full(bound)) => {
            let what = match bound {
                Bound::CallerJobs => "this caller's queued jobs are at [queue] caller_jobs",
                Bound::CallerBytes => "this caller's queued bodies are at [queue] caller_bytes",
                Bound::AccountJobs => "this account's queued jobs are at [queue] account_jobs",
                Bound::AccountBytes => "this account's queued bodies are at [queue] account_bytes",
            };
            return Err(ProxyError::QueueFull { what: what.into(), wait_us: FULL_RETRY_US });
        }
        Err(SubmitError::Store(e)) => return Err(ProxyError::from(e)),
    };
    let eta = if submitted.duplicate {
        None
    } else {
        // The rule the account's calls count against (its `[[quota]]` override).
        let routed = config.routed.iter().find(|r| r.state == rule.state);
        let own = routed.map_or(rule, |r| &**config.rule_of(account, r));
        eta(jobs, env, own, &queue, asking.who.counted(), config.server.quota_offset_us).await
    };
    let id = submitted.id.to_string();
    let body = serde_json::json!({ "errcode": 0, "errmsg": "queued", "delivery": id });
    let mut resp = Response::new(RelayBody::full(Bytes::from(body.to_string())));
    *resp.status_mut() = StatusCode::ACCEPTED;
    let h = resp.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Ok(location) = HeaderValue::from_str(&format!("/v1/deliveries/{id}")) {
        h.insert(LOCATION, location);
    }
    if asked.preferred {
        h.insert("preference-applied", HeaderValue::from_static("respond-async"));
    }
    if submitted.duplicate {
        h.insert(DUPLICATE, HeaderValue::from_static("1"));
    }
    if let Some(at) = eta {
        if let Ok(v) = HeaderValue::from_str(&crate::time::format_rfc3339(at)) {
            h.insert(ETA, v);
        }
        if at > deadline_us {
            h.insert(ETA_LATE, HeaderValue::from_static("deadline"));
            tracing::debug!(rule = %rule.name, "queued a job that cannot be sent before its deadline at today's rates");
        }
    }
    Ok(resp)
}

/// When the job just stored in `queue` can be sent at the earliest: after
/// every unfinished job of its queue not yet sending (it is the last),
/// from the queue's counts and the pair's state (of `counted`, the
/// account its state is kept under) (`None`: not known).
async fn eta(
    jobs: &std::sync::Arc<dyn crate::jobs::JobStore>,
    env: Env<'_>,
    rule: &crate::limit::Rule,
    queue: &QueueKey,
    counted: &str,
    offset_us: Micros,
) -> Option<Micros> {
    if rule.scope != crate::limit::Scope::Rule {
        return None;
    }
    let q = jobs.queue_summary(queue).await.ok()??;
    let n = q.queued.saturating_add(q.waiting).max(1);
    let (at, _) = crate::admit::forecasts::drained_at(
        &*env.core.store,
        &env.core.forecasts,
        rule,
        counted,
        &queue.caller,
        n,
        offset_us,
    )
    .await?;
    Some(at)
}

/// A new job's lanes ([`Lanes`]): one lane for the whole queue when its
/// rule or caller says `queue_order = "strict"`; else its recipients: as
/// the rule's `recipients` reads them, or the body's ([`body_lanes`]).
fn lanes(config: &crate::config::Config, rule: &crate::limit::Rule, asking: &Asking<'_>) -> Lanes {
    let strict_caller = asking.who.caller.policy().is_some_and(|p| p.queue_strict);
    if config.rule_http(Some(rule)).queue_strict || strict_caller {
        return Lanes::strict();
    }
    // A broadcast reaches members no lane list would name for sure (the
    // directory changes; unseen ones are not listed): it goes strict, after
    // every job before it and before every job after it.
    if asking.broadcast() {
        return Lanes::strict();
    }
    if !asking.recipients().is_empty() {
        return Lanes::of(asking.recipients().iter().map(String::as_str));
    }
    asking.body.map_or_else(Lanes::default, |b| body_lanes(b))
}

/// The lanes of a body naming its recipient in `touser` (split at `|`, as
/// WeCom reads it) or `openid`; none: no lane. A body wxgate cannot read
/// for sure (not a JSON object, `touser` given twice or not a string) is
/// never guessed at: it goes strict, after every job before it and before
/// every job after it, whomever WeChat reads it as being for.
fn body_lanes(body: &[u8]) -> Lanes {
    #[derive(serde::Deserialize)]
    struct To {
        touser: Option<String>,
        openid: Option<String>,
    }
    match serde_json::from_slice::<To>(body) {
        Ok(To { touser: Some(to), .. }) => Lanes::of(to.split('|').filter(|t| !t.is_empty())),
        Ok(To { openid: Some(to), .. }) => Lanes::of([to.as_str()]),
        Ok(_) => Lanes::default(),
        Err(_) => Lanes::strict(),
    }
}

/// The target without any `access_token` (the broker adds the account's
/// own when the job is sent).
fn without_token(target: &http::uri::PathAndQuery) -> String {
    let mut out = target.path().to_owned();
    if let Some(query) = target.query() {
        let kept: Vec<&str> = query
            .split('&')
            .filter(|p| !p.is_empty() && *p != "access_token" && !p.starts_with("access_token="))
            .collect();
        if !kept.is_empty() {
            out.push('?');
            out.push_str(&kept.join("&"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_is_seconds_or_a_time_and_never_past() {
        let now = 1_800_000_000_000_000;
        assert_eq!(deadline("300", now).ok(), Some(now + 300_000_000));
        assert!(deadline("0", now).is_err());
        assert!(deadline("2020-01-01T00:00:00Z", now).is_err());
        assert!(deadline("tomorrow", now).is_err());
        assert!(deadline("99999999999999999999", now).is_err());
        assert!(deadline(&(32 * 86_400).to_string(), now).is_err());
        let want = crate::time::parse_rfc3339("2027-01-20T08:00:00Z").expect("time");
        assert_eq!(deadline("2027-01-20T08:00:00Z", now).ok(), Some(want));
    }

    #[test]
    fn prefer_is_read_among_other_preferences() {
        let mut h = HeaderMap::new();
        h.append("prefer", HeaderValue::from_static("return=minimal, Respond-Async; wait=10"));
        assert!(prefers_async(&h));
        let mut h = HeaderMap::new();
        h.append("prefer", HeaderValue::from_static("respond-asynchronously"));
        assert!(!prefers_async(&h));
    }

    #[test]
    fn a_callback_stays_under_its_prefix() {
        let allowed = vec!["https://hr.internal/hooks/".to_owned()];
        assert!(callback("https://hr.internal/hooks/sent", &allowed).is_ok());
        assert!(callback("https://hr.internal/hooks-evil/x", &allowed).is_err());
        assert!(callback("https://hr.internal/hooks/../admin", &allowed).is_err());
        // Encoded, in any case, or as a backslash: what a receiver that
        // normalises its URL reads as a way out of the prefix.
        for escape in ["%2e%2e/admin", "%2E%2e/admin", ".%2e/admin", "x%2fadmin", "..%5cadmin", "x\\..\\admin"] {
            assert!(callback(&format!("https://hr.internal/hooks/{escape}"), &allowed).is_err(), "{escape}");
        }
        assert!(callback("https://hr.internal/hooks/order-1?x=%41", &allowed).is_ok());
        assert!(callback("https://hr.internal/other", &allowed).is_err());
        assert!(callback("https://hr.internal/hooks/x", &[]).is_err());
    }

    #[test]
    fn a_bodys_recipients_are_its_lanes_and_an_ambiguous_body_goes_strict() {
        let l = |b: &str| body_lanes(b.as_bytes());
        assert_eq!(l(r#"{"touser":"o1","data":{}}"#), Lanes::of(["o1"]));
        assert_eq!(l(r#"{"touser":"a|b|a"}"#), Lanes::of(["a", "b"]));
        assert_eq!(l(r#"{"openid":"o2"}"#), Lanes::of(["o2"]));
        assert_eq!(l(r#"{"template_id":"t"}"#), Lanes::default(), "no recipient: no lane");
        for ambiguous in [r#"{"touser":"o1","touser":"o2"}"#, r#"{"touser":["o1"]}"#, "not json", "[1]"] {
            assert_eq!(l(ambiguous), Lanes::strict(), "{ambiguous}");
        }
    }

    #[test]
    fn the_callers_token_is_never_stored() {
        let t = |s: &str| without_token(&s.parse().expect("target"));
        assert_eq!(t("/cgi-bin/message/template/send?access_token=SECRET"), "/cgi-bin/message/template/send");
        assert_eq!(t("/cgi-bin/x?a=1&access_token=S&b=2"), "/cgi-bin/x?a=1&b=2");
        assert_eq!(t("/cgi-bin/x"), "/cgi-bin/x");
    }
}
