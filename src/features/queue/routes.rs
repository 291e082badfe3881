//! Queued delivery's routes. On the proxy listener, for the caller that
//! queued them (its key under `caller_auth = "required"`; else its
//! `X-Wx-Caller`, as for its calls):
//!
//! - `GET /v1/deliveries/<id>`: the job's state, attempts, times and
//!   WeChat's last answer. Another caller's id, or an unknown or malformed
//!   one: 404.
//! - `DELETE /v1/deliveries/<id>`: cancels a job not yet sending (200 with
//!   the job; 409 with its state when too late).
//! - `GET /v1/deliveries`: the caller's queues, counts by state, the
//!   oldest unfinished job's age, and when the queue can be drained at the
//!   earliest (`drained_at`, `drained_in_seconds`: [`crate::limit::drain`],
//!   sharing the day quota with the live calls' current rate).
//!
//! No WeChat API path starts with `/v1/`, so these never shadow one.
//!
//! On the admin listener (behind its token): `GET /v1/queues` (every
//! queue by caller and rule) and `GET`/`DELETE /v1/deliveries/{caller}/{id}`.

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::{json, Value};

use std::collections::BTreeMap;
use std::sync::Arc;

use super::state::{Shared, SUMMARY_FOR};
use crate::admit::callers::{Caller, OTHER};
use crate::config::valid_account;
use crate::error::ProxyError;
use crate::features::component::{AdminAnswer, Host};
use crate::jobs::{Cancelled, Job, JobId, JobState, QueueSummary};
use crate::time::Micros;
use crate::transport::body::RelayBody;

/// Most queues `GET /v1/queues` works out a drained-at time for (the
/// deepest; one `inspect` each).
pub const MAX_DRAINED: usize = 50;

/// The path prefix served here.
pub const PREFIX: &str = "/v1/deliveries";

/// Whether `path` is one of these endpoints'.
pub fn is_ours(path: &str) -> bool {
    path == PREFIX || path.starts_with("/v1/deliveries/")
}

/// Answers one request to [`PREFIX`] from `caller`.
pub(super) async fn serve(
    q: &Shared,
    host: &dyn Host,
    caller: &Caller,
    req: Request<Incoming>,
) -> Result<Response<RelayBody>, ProxyError> {
    let jobs = q.jobs.or_refusal()?.clone();
    let caller = caller.entry.label().to_owned();
    let path = req.uri().path();
    let now = host.core().clock.now_us();
    let unavailable = |e: crate::store::StoreError| ProxyError::from(e);
    if path == PREFIX {
        if req.method() != Method::GET {
            return Err(ProxyError::BadRequest(format!("{PREFIX} answers GET only")));
        }
        let queues = jobs.summary(Some(&caller)).await.map_err(unavailable)?;
        let mut list: Vec<Value> = Vec::with_capacity(queues.len());
        for summary in &queues {
            let mut v = summary_json(summary, now);
            let drained = drained_in(host, summary).await;
            v["drained_in_seconds"] = json!(drained.map(|us| (us + 999_999) / 1_000_000));
            v["drained_at"] = json!(drained.map(|us| rfc3339(now + us)));
            list.push(v);
        }
        return Ok(answer(StatusCode::OK, &json!({ "errcode": 0, "errmsg": "ok", "queues": list })));
    }
    let id = path.strip_prefix("/v1/deliveries/").and_then(JobId::parse);
    let not_found = || ProxyError::NotFound("no delivery of this caller has this id".into());
    let Some(id) = id else { return Err(not_found()) };
    match *req.method() {
        Method::GET => {
            let job = jobs.get(&caller, id).await.map_err(unavailable)?.ok_or_else(not_found)?;
            Ok(answer(StatusCode::OK, &job_json(&job, now)))
        }
        Method::DELETE => match jobs.cancel(&caller, id, now).await.map_err(unavailable)? {
            Cancelled::NotFound => Err(not_found()),
            Cancelled::Cancelled => {
                let job = jobs.get(&caller, id).await.map_err(unavailable)?.ok_or_else(not_found)?;
                cancelled(q, &job, "its caller");
                Ok(answer(StatusCode::OK, &job_json(&job, now)))
            }
            Cancelled::TooLate(state) => Ok(answer(
                StatusCode::CONFLICT,
                &json!({
                    "errcode": crate::error::ERRCODE_BAD_REQUEST, "errmsg": format!("wxgate: the delivery is {} and can no longer be cancelled", state.as_str()),
                    "delivery": id.to_string(), "state": state.as_str(),
                }),
            )),
        },
        _ => Err(ProxyError::BadRequest(format!("{PREFIX}/<id> answers GET and DELETE only"))),
    }
}

/// What follows a job's cancel (`by`: who asked, for the log): the
/// callbacks loop looks at once, the admin's queue summary is read again,
/// the end is counted and logged.
fn cancelled(q: &Shared, job: &Job, by: &str) {
    let queue = &job.new.queue;
    q.ended.notify_one();
    *q.summary.lock().unwrap_or_else(|e| e.into_inner()) = None;
    q.metrics.ended(&queue.rule, &queue.caller, "cancelled");
    tracing::info!(caller = %queue.caller, delivery = %job.id, "queued delivery cancelled by {by}");
}

fn answer(status: StatusCode, body: &Value) -> Response<RelayBody> {
    let mut resp = Response::new(RelayBody::full(Bytes::from(body.to_string())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp.headers_mut().insert(http::header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// An RFC 3339 time (UTC, to the millisecond) of wxgate's clock.
pub fn rfc3339(us: Micros) -> String {
    crate::time::format_rfc3339(us)
}

/// A job as its caller sees it (never its body).
pub fn job_json(job: &Job, now: Micros) -> Value {
    let state = match job.state {
        JobState::Waiting if job.due_us <= now => "queued",
        s => s.as_str(),
    };
    let mut v = json!({
        "errcode": 0,
        "errmsg": "ok",
        "delivery": job.id.to_string(),
        "state": state,
        "rule": &*job.new.queue.rule,
        "account": &*job.new.queue.account,
        "attempts": job.attempts,
        "submitted": rfc3339(job.submitted_us),
        "updated": rfc3339(job.updated_us),
    });
    if state == "waiting" {
        v["waiting_until"] = json!(rfc3339(job.due_us));
    }
    if let Some(d) = job.new.deadline_us {
        v["deadline"] = json!(rfc3339(d));
    }
    if let Some(a) = &job.answer {
        let body = match serde_json::from_slice::<Value>(&a.body) {
            Ok(json) => json,
            Err(_) => json!(String::from_utf8_lossy(&a.body)),
        };
        // WeCom's partial success, named where a caller looks first: the
        // recipients it could not reach (the message went to the others).
        let invalid: serde_json::Map<String, Value> = ["invaliduser", "invalidparty", "invalidtag"]
            .iter()
            .filter_map(|f| {
                let listed = body.get(*f)?.as_str()?;
                let ids: Vec<&str> = listed.split('|').map(str::trim).filter(|s| !s.is_empty()).collect();
                (!ids.is_empty()).then(|| ((*f).to_owned(), json!(ids)))
            })
            .collect();
        if !invalid.is_empty() {
            v["invalid"] = Value::Object(invalid);
        }
        v["answer"] = json!({ "status": a.status, "errcode": a.errcode, "body": body });
    }
    v
}

/// How long until `q`'s jobs not yet sending can all have been sent at the
/// earliest, were every normal-priority slot of its rule for its account
/// its own but what the pair's live calls take of the day quota at their
/// current rate (`crate::admit::forecasts::drained_at`): from the pair's
/// state, read with one `inspect` (the admin API's `/v1/buckets` read),
/// only for a queue with such jobs. `None`: not known (the rule is gone or
/// counts per path, the store did not answer, or its reserve leaves queued
/// sends nothing).
async fn drained_in(host: &dyn Host, q: &QueueSummary) -> Option<Micros> {
    let jobs = q.queued.saturating_add(q.waiting);
    if jobs == 0 {
        return Some(0);
    }
    let (rule, counted, offset_us) = {
        let config = host.config();
        let rule = config.rules.iter().find(|r| *r.name == *q.queue.rule && r.scope == crate::limit::Scope::Rule)?;
        let rule = config.rule_of(&q.queue.account, rule).clone();
        // Its state is the one its sends are decided by: a WeCom app's corpid's.
        let counted = config.accounts.counted(&q.queue.account).to_owned();
        (rule, counted, config.server.quota_offset_us)
    };
    let (at, now) = crate::admit::forecasts::drained_at(
        &*host.core().store,
        &host.core().forecasts,
        &rule,
        &counted,
        &q.queue.caller,
        jobs,
        offset_us,
    )
    .await?;
    Some((at - now).max(0))
}

fn summary_json(q: &QueueSummary, now: Micros) -> Value {
    json!({
        "account": &*q.queue.account,
        "rule": &*q.queue.rule,
        "queued": q.queued,
        "waiting": q.waiting,
        "sending": q.sending,
        "sent": q.sent,
        "failed": q.failed,
        "expired": q.expired,
        "cancelled": q.cancelled,
        "unknown": q.unknown,
        "oldest_age_seconds": q.oldest_us.map(|o| (now - o).max(0) / 1_000_000),
    })
}

/// `GET /v1/queues`: queued delivery's queues grouped by caller and rule
/// (all accounts together): jobs by state, the oldest unfinished, and when
/// the deepest [`MAX_DRAINED`] queues are drained at the earliest (the
/// latest of them). The jobs store's summary is read at most every
/// [`SUMMARY_FOR`]. `on: false` without queued delivery.
pub(super) async fn queues(q: &Shared, host: &dyn Host) -> AdminAnswer {
    let Some(jobs) = q.jobs.get().cloned() else {
        return (StatusCode::OK, json!({ "on": false, "queues": [] }));
    };
    let now = host.core().clock.now_us();
    let kept = q.summary.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let all = match kept {
        Some((at, all)) if now - at < SUMMARY_FOR && now >= at => all,
        _ => match jobs.summary(None).await {
            Ok(all) => {
                let all = Arc::new(all);
                *q.summary.lock().unwrap_or_else(|e| e.into_inner()) = Some((now, all.clone()));
                all
            }
            Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, e),
        },
    };
    let mut deepest: Vec<&QueueSummary> = all.iter().filter(|s| s.queued + s.waiting > 0).collect();
    deepest.sort_by_key(|s| std::cmp::Reverse(s.queued + s.waiting));
    deepest.truncate(MAX_DRAINED);
    let mut drained: BTreeMap<(&str, &str), Option<i64>> = BTreeMap::new();
    for s in deepest {
        let at = drained_in(host, s).await;
        let slot = drained.entry((&s.queue.caller, &s.queue.rule)).or_insert(Some(0));
        *slot = match (*slot, at) {
            (Some(a), Some(b)) => Some(a.max(b)),
            _ => None,
        };
    }
    let mut grouped: BTreeMap<(&str, &str), (QueueSummary, u64)> = BTreeMap::new();
    for s in all.iter() {
        let (sum, accounts) =
            grouped.entry((&s.queue.caller, &s.queue.rule)).or_insert_with(|| (QueueSummary::new(s.queue.clone()), 0));
        *accounts += 1;
        sum.merge(s);
    }
    let list: Vec<Value> = grouped
        .into_iter()
        .map(|((caller, rule), (sum, accounts))| {
            let mut v = summary_json(&sum, now);
            if let Some(fields) = v.as_object_mut() {
                fields.remove("account");
            }
            v["caller"] = json!(caller);
            v["rule"] = json!(rule);
            v["accounts"] = json!(accounts);
            let pending = sum.queued + sum.waiting;
            // Unknown (`null`): a store that did not answer, a reserve that
            // leaves queued sends nothing, or only queues past the deepest.
            let at = if pending == 0 { Some(0) } else { drained.get(&(caller, rule)).copied().flatten() };
            v["drained_at"] = json!(at.map(|us| rfc3339(now + us)));
            v
        })
        .collect();
    (StatusCode::OK, json!({ "on": true, "queues": list }))
}

/// The admin listener's answer to the proxy listener's own paths
/// (`/v1/deliveries`, `/v1/deliveries/<id>`, as a 202's `Location` gives
/// them): 404 saying where they are served and which admin route finds a
/// delivery here.
pub(super) fn proxy_only(host: &dyn Host, path: &[&str]) -> AdminAnswer {
    let listen = host.config().server.listen;
    let id = path.get(1).copied().unwrap_or("{id}");
    error(
        StatusCode::NOT_FOUND,
        format!(
            "{PREFIX}{} is served on the proxy listener ([server] listen {listen}), to the caller that queued it (its key or \
             X-Wx-Caller, as on its calls); on this admin listener: GET or DELETE {PREFIX}/{{caller}}/{id} \
             (the caller as the access log's `caller` names it; every undeclared caller's are also under \
             \"{OTHER}\") and GET /v1/queues",
            path.get(1).map(|id| format!("/{id}")).unwrap_or_default(),
        ),
    )
}

/// The names a job of `caller` (as the admin route names it) may be kept
/// under, the likeliest first. Jobs are kept under the caller's metrics
/// label ([`crate::admit::callers::Entry::label`]): a declared caller's
/// name, else [`OTHER`] for every undeclared one, so the name the access
/// log's `caller` shows for an undeclared caller (`default` for a call
/// naming none) finds its jobs under `other`. The name as given comes
/// second: the jobs of a caller declared when they were queued and
/// undeclared since.
fn kept_under<'a>(host: &dyn Host, caller: &'a str) -> Vec<&'a str> {
    let declared = caller == OTHER || host.config().callers.iter().any(|p| *p.name == *caller);
    if declared {
        vec![caller]
    } else {
        vec![OTHER, caller]
    }
}

/// `GET` (or with `cancel`, `DELETE`) `/v1/deliveries/{caller}/{id}`:
/// `caller` is the declared name, or any undeclared caller's name (its
/// jobs are under [`OTHER`]), or `other`.
pub(super) async fn delivery(q: &Shared, host: &dyn Host, caller: &str, id: &str, cancel: bool) -> AdminAnswer {
    let Some(jobs) = q.jobs.get().cloned() else {
        return error(StatusCode::NOT_FOUND, "queued delivery is off");
    };
    if !valid_account(caller) {
        return error(StatusCode::BAD_REQUEST, "the caller must be 1-64 characters of A-Z a-z 0-9 _ -");
    }
    let Some(id) = JobId::parse(id) else {
        return error(StatusCode::BAD_REQUEST, "a delivery id is 32 hex digits, as its 202 answer gave it");
    };
    let now = host.core().clock.now_us();
    let names = kept_under(host, caller);
    let not_found = || {
        let undeclared =
            if names.len() > 1 { format!(" (undeclared: looked under \"{OTHER}\" too)") } else { String::new() };
        error(StatusCode::NOT_FOUND, format!("caller \"{caller}\"{undeclared} has no delivery {id}"))
    };
    // The one name of the ones it may be under that holds the job.
    let mut found = None;
    for name in &names {
        match jobs.get(name, id).await {
            Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, e),
            Ok(Some(_)) => {
                found = Some(*name);
                break;
            }
            Ok(None) => {}
        }
    }
    let Some(caller) = found else { return not_found() };
    if cancel {
        match jobs.cancel(caller, id, now).await {
            Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, e),
            Ok(Cancelled::NotFound) => return not_found(),
            Ok(Cancelled::TooLate(state)) => {
                return (
                    StatusCode::CONFLICT,
                    json!({ "error": format!("the delivery is {} and can no longer be cancelled", state.as_str()), "state": state.as_str() }),
                )
            }
            Ok(Cancelled::Cancelled) => {}
        }
    }
    match jobs.get(caller, id).await {
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e),
        Ok(None) => not_found(),
        Ok(Some(job)) => {
            if cancel {
                cancelled(q, &job, "hand (admin API)");
            }
            let mut v = job_json(&job, now);
            if let Some(fields) = v.as_object_mut() {
                fields.remove("errcode");
                fields.remove("errmsg");
            }
            // The name it is kept under: the caller's metrics label.
            v["caller"] = json!(caller);
            (StatusCode::OK, v)
        }
    }
}

/// An admin API error: its status and `{"error": message}`.
fn error(status: StatusCode, message: impl std::fmt::Display) -> AdminAnswer {
    (status, json!({ "error": message.to_string() }))
}
