//! Callbacks of queued delivery (issue 47, docs/queued-delivery.md
//! "Callbacks"): once a job with an `X-Wxgate-Callback` ends (sent, failed,
//! expired, cancelled, unknown), wxgate POSTs its result there, signed.
//!
//! Durable, at least once per end: the store marks the callback pending in
//! the write that ends the job ([`crate::jobs::JobStore::callbacks_due`]),
//! so a restart never loses it. This loop (one task per instance) hands out
//! due callbacks under a lease of [`LEASE_US`] (another instance takes one
//! only after it), posts each, and records the post. Fair per caller: at
//! most [`PER_CALLER`] posts of a caller in flight, and a caller at its
//! limit passed over ([`spawn`]), so a dead receiver delays only its own. A callback is posted
//! twice only if the instance stops (or its post outlasts the lease) after
//! the receiver answered and before the post was recorded.
//!
//! - **Body**: the job as `GET /v1/deliveries/<id>` shows it
//!   ([`super::routes::job_json`], never the message's body)
//!   with `ended` (RFC 3339), without the `errcode`/`errmsg` of that
//!   answer's envelope.
//! - **Signature**: `X-Wxgate-Signature: t=<unix seconds>,v1=<hex>`, the
//!   hex of HMAC-SHA256 over `"<t>.<body>"` keyed by `[queue]
//!   callback_key_file` or `WXGATE_CALLBACK_KEY` (Stripe's scheme: the
//!   receiver recomputes it and refuses an old `t`).
//! - **Sending**: HTTP/1 over TCP, TLS for https (the web roots and
//!   `[server] upstream_ca`); redirects never followed; [`TIMEOUT`] for the
//!   whole exchange; at most [`ANSWER_READ`] bytes of the answer read. A
//!   2xx answer is delivered; anything else, or none, is tried again after
//!   `[queue] backoff` (exponential, full jitter, capped by `backoff_max`),
//!   until `[queue] callback_for` after the job ended: then given up
//!   (logged). Each outcome is counted in `wxgate_queue_callbacks_total`
//!   (rule, caller, outcome: `delivered`, `retried`, `given_up`).
//! - A URL its caller no longer allows (a reload narrowed its `callbacks`)
//!   is given up, never posted.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, USER_AGENT};
use http::{HeaderValue, Method, Request, Uri};
use http_body_util::Full;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::routes::{job_json, rfc3339};
use super::state::Shared;
use crate::config::Config;
use crate::features::component::Host;
use crate::jobs::{CallerRoom, DueCallback, JobStore};
use crate::store::StoreError;
use crate::time::{Micros, Span};

/// How often the loop looks for due callbacks when nothing wakes it.
pub const TICK: Span = Span::from_micros(1_000_000);
/// Callbacks handed out at most per look.
pub const BATCH: usize = 32;
/// Posts in flight per caller at most: a receiver that is slow or never
/// answers holds this many of its own caller's callbacks (each for up to
/// [`TIMEOUT`]), and none of another caller's.
pub const PER_CALLER: usize = 8;
/// How long a handed-out callback is this instance's (longer than a post).
pub const LEASE_US: Micros = 60_000_000;
/// Most time one post takes: connecting, sending, the answer's head and
/// the part of its body read.
pub const TIMEOUT: Duration = Duration::from_secs(10);
/// Most bytes of a receiver's answer read (the rest is dropped).
pub const ANSWER_READ: usize = 4096;
/// The signature's header.
pub const SIGNATURE: &str = "x-wxgate-signature";

type Poster = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// Starts the callbacks loop once queued delivery is on (at start, or when
/// a reload or Redis answering opens the jobs store); it ends when the app
/// is dropped.
///
/// Fair per caller: each caller has at most [`PER_CALLER`] posts in
/// flight, the store hands out no more of a caller's callbacks than its
/// room ([`JobStore::callbacks_due`] passes over a caller at its limit),
/// and the loop never waits for a post before handing out more: it looks
/// again when a post ends, a job ends, or every [`TICK`]. So a receiver
/// that accepts and never answers delays only its own caller's callbacks.
pub(super) fn spawn(host: Weak<dyn Host>, q: Arc<Shared>) {
    let queue = q.clone();
    queue.spawn_when_open(move || async move {
        let Some(a) = host.upgrade() else { return };
        let poster = match crate::transport::upstream::connector(&a.config().server) {
            Ok(connector) => {
                Client::builder(TokioExecutor::new()).pool_idle_timeout(Duration::from_secs(30)).build(connector)
            }
            Err(e) => {
                tracing::error!(error = %e, "queued delivery: no client for callbacks; callbacks wait until a restart");
                return;
            }
        };
        drop(a);
        let mut posts = Posts::default();
        loop {
            let Some(host) = host.upgrade() else { return };
            if q.stopping.is_cancelled() {
                break;
            }
            let full = match hand_out(&host, &q, &poster, &mut posts).await {
                Ok(full) => full,
                Err(e) => {
                    tracing::warn!(error = %e, "queued delivery: the jobs store failed reading callbacks; trying again");
                    false
                }
            };
            let clock = host.core().clock.clone();
            drop(host);
            if full {
                tokio::task::yield_now().await;
                continue;
            }
            tokio::select! {
                Some(done) = posts.set.join_next(), if !posts.set.is_empty() => {
                    logged(done);
                    while let Some(done) = posts.set.try_join_next() {
                        logged(done);
                    }
                }
                _ = q.ended.notified() => {}
                _ = clock.sleep(TICK) => {}
                _ = q.stopping.cancelled() => break,
            }
        }
        // Stopping: the posts under way are finished and recorded (each
        // within its TIMEOUT), so none is posted again after a restart.
        while let Some(done) = posts.set.join_next().await {
            logged(done);
        }
    });
}

/// The posts under way, and how many of each caller's.
#[derive(Default)]
struct Posts {
    set: tokio::task::JoinSet<Result<(), StoreError>>,
    flying: Arc<std::sync::Mutex<HashMap<Arc<str>, usize>>>,
}

/// One caller's post in flight: counted until dropped (the post ended,
/// however).
struct Flying {
    caller: Arc<str>,
    flying: Arc<std::sync::Mutex<HashMap<Arc<str>, usize>>>,
}

impl Flying {
    fn new(caller: Arc<str>, flying: &Arc<std::sync::Mutex<HashMap<Arc<str>, usize>>>) -> Flying {
        *flying.lock().unwrap_or_else(|e| e.into_inner()).entry(caller.clone()).or_default() += 1;
        Flying { caller, flying: flying.clone() }
    }
}

impl Drop for Flying {
    fn drop(&mut self) {
        let mut flying = self.flying.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = flying.get_mut(&self.caller) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                flying.remove(&self.caller);
            }
        }
    }
}

fn logged(done: Result<Result<(), StoreError>, tokio::task::JoinError>) {
    match done {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "queued delivery: a callback's post was not recorded"),
        Err(e) => tracing::warn!(error = %e, "queued delivery: a callback's post stopped"),
    }
}

/// Hands out the due callbacks that callers have room for (at most
/// [`BATCH`]) and starts their posts; `Ok(true)` when the batch was full
/// (look again at once).
async fn hand_out(
    host: &Arc<dyn Host>,
    q: &Arc<Shared>,
    poster: &Poster,
    posts: &mut Posts,
) -> Result<bool, StoreError> {
    let Some(jobs) = q.jobs.get().cloned() else { return Ok(false) };
    let room = {
        let flying = posts.flying.lock().unwrap_or_else(|e| e.into_inner());
        let callers = flying.iter().map(|(c, n)| (c.to_string(), PER_CALLER.saturating_sub(*n))).collect();
        CallerRoom { each: PER_CALLER, callers }
    };
    let due = jobs.callbacks_due(host.core().clock.now_us(), LEASE_US, BATCH, &room).await?;
    let full = due.len() == BATCH;
    for due in due {
        let flying = Flying::new(due.job.new.queue.caller.clone(), &posts.flying);
        let (host, q, jobs, poster) = (host.clone(), q.clone(), jobs.clone(), poster.clone());
        posts.set.spawn(async move {
            let _flying = flying;
            post_one(&*host, &q, &jobs, &poster, due).await
        });
    }
    Ok(full)
}

/// Posts one callback and records how it went.
async fn post_one(
    host: &dyn Host,
    q: &Shared,
    jobs: &Arc<dyn JobStore>,
    poster: &Poster,
    due: DueCallback,
) -> Result<(), StoreError> {
    let config = host.config();
    let clock = &host.core().clock;
    let job = &due.job;
    let (id, tries) = (job.id, due.tries);
    let (caller, rule) = (&*job.new.queue.caller, &*job.new.queue.rule);
    let counted = |outcome: &str| q.metrics.callback(rule, caller, outcome);
    let give_up = |why: &str| {
        tracing::warn!(delivery = %id, caller, tries, why, "queued delivery: callback given up");
        counted("given_up");
        jobs.callback_done(id, tries, None, clock.now_us())
    };
    let Some(url) = job.new.callback.as_deref() else {
        return jobs.callback_done(id, tries, None, clock.now_us()).await.map(drop);
    };
    if !allowed(&config, caller, url) {
        return give_up("the URL is no longer under its caller's callbacks prefixes").await.map(drop);
    }
    let Some(key) = config.queue.callback_key.as_ref() else {
        return give_up("no callback key ([queue] callback_key_file or WXGATE_CALLBACK_KEY)").await.map(drop);
    };
    let until = job.updated_us.saturating_add(config.queue.callback_for_us);
    if clock.now_us() >= until {
        return give_up("[queue] callback_for passed").await.map(drop);
    }
    let mut body = job_json(job, clock.now_us());
    if let Some(fields) = body.as_object_mut() {
        fields.remove("errcode");
        fields.remove("errmsg");
        fields.insert("ended".into(), serde_json::Value::String(rfc3339(job.updated_us)));
    }
    let body = Bytes::from(body.to_string());
    let t = clock.now_us().div_euclid(1_000_000);
    let result = post(poster, url, &id.to_string(), signature(key.bytes(), t, &body), body).await;
    let now = clock.now_us();
    match result {
        Ok(status) if (200..300).contains(&status) => {
            tracing::debug!(delivery = %id, caller, tries, status, "queued delivery: callback delivered");
            counted("delivered");
            jobs.callback_done(id, tries, None, now).await.map(drop)
        }
        other => {
            let why = match &other {
                Ok(status) => format!("answered {status}"),
                Err(e) => e.clone(),
            };
            let at = now.saturating_add(config.queue.backoff.delay_us(tries, random_u64()));
            if at >= until {
                return give_up(&format!("{why}, and [queue] callback_for ends before the next try")).await.map(drop);
            }
            tracing::info!(delivery = %id, caller, tries, why, "queued delivery: callback not delivered; tried again later");
            counted("retried");
            jobs.callback_done(id, tries, Some(at), now).await.map(drop)
        }
    }
}

/// Whether `caller` (as the running config has it) still allows `url`.
fn allowed(config: &Config, caller: &str, url: &str) -> bool {
    config
        .callers
        .iter()
        .find(|c| &*c.name == caller)
        .is_some_and(|c| c.callbacks.iter().any(|p| crate::config::units::under_prefix(url, p)))
}

/// `t=<t>,v1=<hex of HMAC-SHA256(key, "<t>.<body>")>`.
pub fn signature(key: &[u8], t: i64, body: &[u8]) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key);
    let mut ctx = ring::hmac::Context::with_key(&key);
    ctx.update(t.to_string().as_bytes());
    ctx.update(b".");
    ctx.update(body);
    let tag = ctx.sign();
    let mut out = format!("t={t},v1=");
    for b in tag.as_ref() {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// One POST; the answer's status (its body read up to [`ANSWER_READ`]
/// bytes), or why there was none.
async fn post(poster: &Poster, url: &str, id: &str, signature: String, body: Bytes) -> Result<u16, String> {
    let uri: Uri = url.parse().map_err(|e| format!("not a URL: {e}"))?;
    let sig = HeaderValue::from_str(&signature).map_err(|e| e.to_string())?;
    let delivery = HeaderValue::from_str(id).map_err(|e| e.to_string())?;
    let req = Request::builder()
        .method(Method::POST)
        .uri(uri)
        .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
        .header(USER_AGENT, HeaderValue::from_static("wxgate"))
        .header(SIGNATURE, sig)
        .header("x-wxgate-delivery", delivery)
        .body(Full::new(body))
        .map_err(|e| e.to_string())?;
    let exchange = async {
        let resp = poster.request(req).await.map_err(|e| format!("no answer: {e}"))?;
        let status = resp.status().as_u16();
        crate::transport::body::read_some(resp.into_body(), ANSWER_READ).await;
        Ok(status)
    };
    match tokio::time::timeout(TIMEOUT, exchange).await {
        Ok(result) => result,
        Err(_) => Err(format!("no answer within {TIMEOUT:?}")),
    }
}

fn random_u64() -> u64 {
    let mut bytes = [0u8; 8];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes);
    u64::from_le_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stripe's documented example shape: the signed payload is
    /// `"<t>.<body>"`; checked against ring's one-shot HMAC.
    #[test]
    fn the_signature_is_hmac_sha256_over_t_dot_body() {
        let key = b"0123456789abcdef0123456789abcdef";
        let sig = signature(key, 1_700_000_000, b"{\"a\":1}");
        let k = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key);
        let tag = ring::hmac::sign(&k, b"1700000000.{\"a\":1}");
        let hex: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(sig, format!("t=1700000000,v1={hex}"));
    }
}
