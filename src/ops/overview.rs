//! The admin API's reads across many pairs, and the console's actions on
//! queued deliveries ([`crate::ops::admin`] routes them):
//!
//! | endpoint | |
//! |---|---|
//! | `GET /v1/accounts?top=N&q=S` | the pairs of today using most of their day quota (as this instance last saw them), whose account contains `S`: each pair's state |
//! | `GET /v1/accounts/{account}` | one account's state on every rule |
//! | `GET /v1/penalties` | the pairs with a penalty in force, as the store holds them: each pair's state |
//! | `GET /v1/errcodes` | WeChat's last throttling and token errcodes here |
//! | `GET /v1/history` | each rule's calls per second over the last hour |
//! | `GET /v1/health` | the store, upstreams, tokens, reloads |
//! | `GET /v1/queues` | queued delivery per caller and rule: depth, oldest, ends, drained at |
//! | `GET /v1/deliveries/{caller}/{id}` | one queued delivery |
//! | `DELETE /v1/deliveries/{caller}/{id}` | cancel it (logged) |
//!
//! None loads every pair: the top list is one pass over this instance's
//! forecast table keeping `N` (at most [`MAX_TOP`]), whose states are then
//! read one `inspect` each; the penalties are the store's list
//! ([`crate::store::Store::penalised`]: at most [`MAX_PENALTIES`]), read
//! likewise.

use std::sync::atomic::Ordering;

use http::StatusCode;
use serde_json::{json, Value};

use crate::config::{valid_account, Fallback};
use crate::limit::{Key, Rule};
use crate::ops::answers::{error, json_answer, Answer};
use crate::ops::pair_view::{describe, local_time, Here};
use crate::proxy::app::App;
use crate::store::pair_op::Inspect;
use crate::store::Status;
use crate::telemetry::history::Counts;

/// Most pairs `GET /v1/accounts?top=` lists.
pub const MAX_TOP: usize = 100;
/// Most pairs `GET /v1/penalties` lists (those ending last).
pub const MAX_PENALTIES: usize = 50;

/// `GET /v1/accounts?top=N&q=S`.
pub async fn top(app: &App, n: Option<&str>, containing: Option<&str>) -> Answer {
    let n = match n.map(str::parse::<usize>) {
        None => 20,
        Some(Ok(n)) if (1..=MAX_TOP).contains(&n) => n,
        Some(_) => return error(StatusCode::BAD_REQUEST, format!("give ?top=N (1 to {MAX_TOP})")),
    };
    let containing = containing.unwrap_or("");
    if !containing.is_empty() && !valid_account(containing) {
        return error(StatusCode::BAD_REQUEST, "?q= is part of an account: 1-64 characters of A-Z a-z 0-9 _ -");
    }
    let now = app.core.clock.now_us();
    let found = app.core.forecasts.top(n, containing, now);
    let config = app.config.load_full();
    let mut pairs = Vec::with_capacity(found.len());
    for t in found {
        let Some(state) = config.state_named(&t.state) else {
            continue; // a rule a reload removed
        };
        let state = config.rule_of(&t.account, &state).clone();
        match picture(app, &t.account, &state).await {
            Ok(mut p) => {
                p["rule"] = json!(&*t.rule);
                pairs.push(p);
            }
            Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, e),
        }
    }
    json_answer(StatusCode::OK, json!({ "pairs": pairs, "tracked": app.core.forecasts.len() }))
}

/// `GET /v1/penalties`: the pairs with a penalty in force as the store
/// holds them, whatever set them (WeChat's errcode through any instance,
/// an operator, the state file read at start), those ending last first, at
/// most [`MAX_PENALTIES`] (`more`: there are others); each pair's state.
pub async fn penalties(app: &App) -> Answer {
    let found = match app.core.store.penalised(MAX_PENALTIES + 1).await {
        Ok(found) => found,
        Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, e),
    };
    let config = app.config.load_full();
    let mut pairs = Vec::with_capacity(found.len().min(MAX_PENALTIES));
    for p in found.iter().take(MAX_PENALTIES) {
        let Some(state) = config.state_named(&p.state) else {
            continue; // a rule a reload removed
        };
        let state = config.rule_of(&p.account, &state).clone();
        match picture(app, &p.account, &state).await {
            // Lifted since it was listed (Redis's index may lag a lift).
            Ok(shown) if shown["penalty"]["active"] != true => {}
            Ok(shown) => pairs.push(shown),
            Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, e),
        }
    }
    json_answer(StatusCode::OK, json!({ "pairs": pairs, "more": found.len() > MAX_PENALTIES }))
}

/// `GET /v1/accounts/{account}`: every rule's state of the account (each
/// listed path's for a rule with `scope = "path"`).
pub async fn account(app: &App, account: &str) -> Answer {
    if !valid_account(account) {
        return error(StatusCode::BAD_REQUEST, "the account must be 1-64 characters of A-Z a-z 0-9 _ -");
    }
    let config = app.config.load_full();
    let mut pairs = Vec::new();
    for rule in &config.rules {
        let states: Vec<_> = match rule.scope {
            // A `scope = "app"` rule: its base state (each app's is listed
            // by /v1/penalties and /v1/accounts?top= as the stores find them).
            crate::limit::Scope::Rule | crate::limit::Scope::App => vec![rule.clone()],
            crate::limit::Scope::Path => config.states_of(&rule.name).cloned().collect(),
        };
        for state in states {
            let state = config.rule_of(account, &state).clone();
            match picture(app, account, &state).await {
                Ok(mut p) => {
                    p["rule"] = json!(&*rule.name);
                    pairs.push(p);
                }
                Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, e),
            }
        }
    }
    json_answer(StatusCode::OK, json!({ "account": account, "pairs": pairs }))
}

/// `GET /v1/errcodes`: newest first, times in the quota's time zone (as
/// a pair's `until` and `resets_at`).
pub fn errcodes(app: &App) -> Answer {
    let offset = app.config.load().server.quota_offset_us;
    let seen: Vec<Value> = app
        .features
        .errcodes
        .newest_first()
        .into_iter()
        .map(|s| {
            json!({
                "at": local_time(s.at_us, offset),
                "errcode": s.errcode,
                "account": s.account,
                "rule": s.rule.as_deref(),
                "penalty_seconds": s.penalty_us.map(|us| us as f64 / 1e6),
            })
        })
        .collect();
    json_answer(StatusCode::OK, json!({ "errcodes": seen, "kept": crate::features::errcodes::KEEP }))
}

/// `GET /v1/history`: per reading (oldest first), each rule's admitted,
/// refused and failed calls per second; a rule without calls in a reading
/// is left out of it (an hour of 50 rules mostly idle stays small).
pub fn history(app: &App) -> Answer {
    let readings: Vec<Value> = app
        .history
        .readings()
        .into_iter()
        .map(|r| {
            let per_s = |n: u64| (n as f64 * 1e6 / r.span_us as f64 * 1000.0).round() / 1000.0;
            let rules: serde_json::Map<String, Value> = r
                .rules
                .iter()
                .filter(|(_, c)| *c != Counts::default())
                .map(|(rule, c)| {
                    let v = json!({
                        "admitted": per_s(c.admitted),
                        "refused": per_s(c.refused),
                        "upstream_errors": per_s(c.upstream_errors),
                    });
                    (rule.to_string(), v)
                })
                .collect();
            json!({ "at": crate::time::format_rfc3339(r.at_us), "seconds": r.span_us as f64 / 1e6, "rules": rules })
        })
        .collect();
    json_answer(
        StatusCode::OK,
        json!({ "every_seconds": crate::telemetry::history::EVERY_US / 1_000_000, "readings": readings }),
    )
}

/// `GET /v1/health`: what `/readyz` says of the store and upstreams, with
/// the counters an on-call reads next (store errors, degraded decisions,
/// tokens, reloads).
pub fn health(app: &App) -> Answer {
    let m = &app.core.metrics;
    let status = app.core.store.status();
    let (_, decisions) = decisions(status);
    let renewals = |result: &str| {
        m.tokens.renewals.get_or_create(&crate::telemetry::metrics::ResultLabel { result: result.to_owned() }).get()
    };
    let last = app.reloads.last.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let config = app.config.load();
    let (fallback, quota_leases, quota_reserve) = match &config.store {
        crate::config::StoreConfig::Redis(r) => (
            Some(format!("{:?}", r.resilience.fallback).to_lowercase()),
            r.resilience.quota_leases.is_some(),
            (r.resilience.fallback == crate::config::Fallback::Local)
                .then_some(r.resilience.quota_reserve.as_secs_f64())
                .filter(|s| *s > 0.0),
        ),
        _ => (None, false, None),
    };
    json_answer(
        StatusCode::OK,
        json!({
            "store": {
                "kind": status.kind(),
                "decisions": decisions,
                "degraded": matches!(status, Status::Degraded(_)),
                // Redis: what decides while it cannot (`[store] fallback`).
                "fallback": fallback,
                "quota_leases": quota_leases,
                // Seconds of recent calls held of each calendar quota for an
                // outage (`[store] quota_reserve`; null: none).
                "quota_reserve_seconds": quota_reserve,
                "instances": app.core.store.instances(),
                "breaker_opened": m.breaker_opened.get(),
                "errors": m.store_errors.get(),
                "degraded_decisions": m.degraded_decisions.get(),
                "lost": m.store_lost.get(),
            },
            "upstreams": upstreams(app),
            "tokens": {
                "fetched": m.tokens.fetched.get(),
                "from_cache": m.tokens.from_cache.get(),
                "invalidated": m.tokens.invalidations.get(),
                "resent": m.tokens.resent.get(),
                "renewed": renewals("renewed"),
                "renewal_errors": renewals("error"),
            },
            "reloads": {
                "ok": app.reloads.ok.load(Ordering::Relaxed),
                "failed": app.reloads.failed.load(Ordering::Relaxed),
                "last_at": last.as_ref().map(|(at, _)| crate::time::format_rfc3339(*at)),
                "last_error": last.and_then(|(_, e)| e),
            },
            "held_now": m.held_now.get(),
            // wxgate's clock in the quota's time zone: the console shows
            // every time in this zone.
            "now": local_time(app.core.clock.now_us(), config.server.quota_offset_us),
        }),
    )
}

/// Each upstream's health, in the order calls try them. A skipped upstream
/// does not make wxgate unready: calls go to the next, and when every one
/// is down that is WeChat's outage, which restarting wxgate cannot mend.
pub fn upstreams(app: &App) -> Value {
    let config = app.config.load();
    let upstreams = app.core.upstreams.load();
    let mut list = Vec::new();
    for (i, domain) in config.domains.iter().enumerate() {
        for u in upstreams.get(i).status() {
            list.push(json!({
                "upstream": u.name,
                "url": u.url,
                "domain": &*domain.host,
                "up": u.up,
                "skipped_for_s": u.skipped_for_us as f64 / 1e6,
            }));
        }
    }
    Value::Array(list)
}

/// Whether calls can be decided with the store's `status`, and how they
/// are (`/readyz`, `/v1/health`): not with Redis away and `fallback = "deny"`.
pub fn decisions(status: Status) -> (bool, String) {
    match status {
        Status::InProcess => (true, "in-process".to_owned()),
        Status::Shared => (true, "shared (Redis reachable)".to_owned()),
        Status::Degraded(fallback) => (
            fallback != Fallback::Deny,
            format!("fallback {fallback:?} (Redis unavailable: unreachable, or refusing writes)").to_lowercase(),
        ),
    }
}

/// One pair's state as `GET /v1/buckets` shows it (`state`: the account's
/// own rule state), read with one `inspect`.
pub async fn picture(app: &App, account: &str, state: &Rule) -> Result<Value, crate::store::StoreError> {
    let offset = app.config.load().server.quota_offset_us;
    let snapshot = app.core.store.apply(Key { account, rule: state, offset_us: offset }, Inspect).await?;
    let (held, in_flight) = app.core.activity.get(account, &state.state);
    let forecasts = &app.core.forecasts;
    let day_rate = forecasts.rates(account, &state.state, snapshot.now).map(|r| r.total);
    if let Some(limit) = crate::limit::learned::day_limit(state, &snapshot.state, snapshot.now) {
        forecasts.set_limit(account, &state.state, limit);
    }
    let here = Here { held, in_flight, day_rate };
    let mut picture = describe(account, state, &snapshot.state, snapshot.now, offset, here);
    add_quota_sync(app, account, state, &mut picture);
    Ok(picture)
}

/// A state with `quota_sync`: what this instance's last sync found
/// (`crate::ops::quota_sync`).
fn add_quota_sync(app: &App, account: &str, state: &crate::limit::Rule, picture: &mut Value) {
    let config = app.config.load();
    let Some(sync) = config.quota_syncs.iter().find(|s| s.rule.state == state.state) else { return };
    let now = app.core.clock.now_us();
    let found = app.syncs.get(account, &state.state).unwrap_or_default();
    let mut shown = found.describe(now, &sync.path);
    shown["every_seconds"] = json!(sync.every.as_secs_f64());
    if let Value::Object(map) = picture {
        map.insert("quota_sync".into(), shown);
    }
}
