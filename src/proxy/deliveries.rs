//! The results of queued delivery, on the proxy listener, for the caller
//! that queued them (its key under `caller_auth = "required"`; else its
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

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::{json, Value};

use super::call::Call;
use super::identify;
use crate::error::{Early, ProxyError};
use crate::proxy::app::App;
use crate::store::jobs::{Cancelled, Job, JobId, JobState, QueueSummary};
use crate::time::Micros;
use crate::transport::body::RelayBody;

/// The path prefix served here.
pub const PREFIX: &str = "/v1/deliveries";

/// Whether `path` is one of these endpoints'.
pub fn is_ours(path: &str) -> bool {
    path == PREFIX || path.starts_with("/v1/deliveries/")
}

/// Answers one request to [`PREFIX`].
pub async fn serve(app: &App, call: &mut Call, mut req: Request<Incoming>) -> Result<Response<RelayBody>, Early> {
    identify::caller(app, call, &mut req)?;
    let jobs = app.features.queue.jobs()?.clone();
    let caller = call.who.caller.entry.label().to_owned();
    let path = req.uri().path();
    let now = app.core.clock.now_us();
    let unavailable = ProxyError::from;
    if path == PREFIX {
        if req.method() != Method::GET {
            return Err(ProxyError::BadRequest(format!("{PREFIX} answers GET only")).into());
        }
        let queues = jobs.summary(Some(&caller)).await.map_err(unavailable)?;
        let mut list: Vec<Value> = Vec::with_capacity(queues.len());
        for q in &queues {
            let mut v = summary_json(q, now);
            let drained = drained_in(app, q).await;
            v["drained_in_seconds"] = json!(drained.map(|us| (us + 999_999) / 1_000_000));
            v["drained_at"] = json!(drained.map(|us| rfc3339(now + us)));
            list.push(v);
        }
        return Ok(answer(StatusCode::OK, &json!({ "errcode": 0, "errmsg": "ok", "queues": list })));
    }
    let id = path.strip_prefix("/v1/deliveries/").and_then(JobId::parse);
    let not_found = || ProxyError::NotFound("no delivery of this caller has this id".into());
    let Some(id) = id else { return Err(not_found().into()) };
    match *req.method() {
        Method::GET => {
            let job = jobs.get(&caller, id).await.map_err(unavailable)?.ok_or_else(not_found)?;
            Ok(answer(StatusCode::OK, &job_json(&job, now)))
        }
        Method::DELETE => match jobs.cancel(&caller, id, now).await.map_err(unavailable)? {
            Cancelled::NotFound => Err(not_found().into()),
            Cancelled::Cancelled => {
                let job = jobs.get(&caller, id).await.map_err(unavailable)?.ok_or_else(not_found)?;
                cancelled(app, &job, "its caller");
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
        _ => Err(ProxyError::BadRequest(format!("{PREFIX}/<id> answers GET and DELETE only")).into()),
    }
}

/// What follows a job's cancel (`by`: who asked, for the log): the
/// callbacks loop looks at once, the admin's queue summary is read again,
/// the end is counted and logged.
pub fn cancelled(app: &App, job: &Job, by: &str) {
    let q = &job.new.queue;
    app.features.queue.ended.notify_one();
    *app.features.queue.summary.lock().unwrap_or_else(|e| e.into_inner()) = None;
    app.core.metrics.queue.ended(&q.rule, &q.caller, "cancelled");
    tracing::info!(caller = %q.caller, delivery = %job.id, "queued delivery cancelled by {by}");
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
pub async fn drained_in(app: &App, q: &QueueSummary) -> Option<Micros> {
    let jobs = q.queued.saturating_add(q.waiting);
    if jobs == 0 {
        return Some(0);
    }
    let (rule, offset_us) = {
        let config = app.config.load();
        let rule = config.rules.iter().find(|r| *r.name == *q.queue.rule && r.scope == crate::limit::Scope::Rule)?;
        let rule = config.rule_of(&q.queue.account, rule).clone();
        (rule, config.server.quota_offset_us)
    };
    let (at, now) = crate::admit::forecasts::drained_at(
        &*app.core.store,
        &app.core.forecasts,
        &rule,
        &q.queue.account,
        &q.queue.caller,
        jobs,
        offset_us,
    )
    .await?;
    Some((at - now).max(0))
}

pub fn summary_json(q: &QueueSummary, now: Micros) -> Value {
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
