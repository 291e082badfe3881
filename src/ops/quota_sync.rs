//! quota_sync: day counts kept in step with WeChat's own.
//!
//! wxgate's day counts know only the calls that went through it; calls made
//! before it was deployed, or by a tool that bypasses it, are invisible.
//! WeChat publishes its own count per API (`POST
//! /cgi-bin/openapi/quota/get {"cgi_path": ...}` → `quota.used`). For each
//! rule with `quota_sync = "<interval>"` and each account with a token this
//! instance knows (one the token cache served or fetched here), a
//! background task asks quota/get for the rule's first exact path (each
//! path's, with `scope = "path"`) once per interval and, if WeChat's `used`
//! is higher than wxgate's day count, raises the count to it (never lowers
//! it: [`crate::store::op::RaiseDay`]).
//!
//! - One call per (account, rule state, interval) across instances: a sync
//!   takes the store's lock `sync:<account>:<state>` for the interval first
//!   (shared through Redis with a token key); an instance that finds it
//!   taken skips the interval (`skipped`).
//! - Errors (a WeChat errcode, no answer) back off: the interval doubles
//!   with each error in a row, up to 6 hours ([`crate::proxy::app::sync_status::Sync::failed`]);
//!   45009 (quota/get's own quota spent) waits for the next quota day.
//! - Timing is the injected clock's ([`crate::time::Clock`]); the task
//!   looks every [`TICK`].
//! - The token is sent to WeChat only: never logged (errors name the
//!   errcode, never the request).

use std::sync::Weak;
use std::time::Duration;

use std::sync::Arc;

use bytes::Bytes;
use http::uri::PathAndQuery;
use http::Method;

use crate::config::units::micros;
use crate::config::{Config, QuotaSync};
use crate::features::hooks::{Calls, OwnCall, Seeds};
use crate::limit::calendar::Period;
use crate::limit::Key;
use crate::proxy::app::App;
use crate::store::op::RaiseDay;
use crate::store::tokens::Claim;

/// How often the task looks for syncs that are due.
pub const TICK: Duration = Duration::from_millis(250);
/// quota/get's path.
pub const QUOTA_GET: &str = "/cgi-bin/openapi/quota/get";

/// Starts the task; it ends when the app is dropped.
pub fn spawn(app: Weak<App>) {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(TICK).await;
            let Some(app) = app.upgrade() else { return };
            round(&app).await;
        }
    });
}

/// One look: every sync that is due, done.
pub async fn round(app: &App) {
    let config = app.config.load_full();
    if config.quota_syncs.is_empty() {
        return;
    }
    let Some(cache) = &app.features.token_cache.cache else { return };
    let _one_round = app.syncs.round.lock().await;
    let now = app.core.clock.now_us();
    for (account, token) in cache.known(now) {
        if config.server.accounts.as_ref().is_some_and(|list| !list.contains(&account)) {
            continue;
        }
        for sync in &config.quota_syncs {
            let due = app.syncs.get(&account, &sync.rule.state).is_none_or(|s| s.next_at <= now);
            if due {
                one(app, &config, &account, &token, sync).await;
            }
        }
    }
}

/// One sync of (account, sync's state).
async fn one(app: &App, config: &Arc<Config>, account: &str, token: &str, sync: &QuotaSync) {
    let Some(cache) = &app.features.token_cache.cache else { return };
    let state = &sync.rule.state;
    let every_us = micros(sync.every);
    let now = app.core.clock.now_us();
    let slot = format!("sync:{account}:{state}");
    match cache.store.tokens().claim_token(&slot, cache.instance(), i64::MAX, i64::MAX, every_us).await {
        Ok(Claim::Won { .. }) => {}
        Ok(_) => {
            app.syncs.update(account, state, |s| s.skipped(now, every_us));
            cache.metrics.sync("skipped");
            return;
        }
        Err(e) => {
            app.syncs.update(account, state, |s| s.failed(now, every_us, format!("store: {e}"), None, false));
            return;
        }
    }
    let offset_us = config.server.quota_offset_us;
    match quota_get(app, config, account, token, (sync.domain, &sync.path)).await {
        Ok(used) => {
            let key = Key { account, rule: config.rule_of(account, &sync.rule), offset_us };
            match app.core.store.apply(key, RaiseDay { used }).await {
                Ok(before) => {
                    let raised = used > before;
                    cache.metrics.sync(if raised { "raised" } else { "unchanged" });
                    app.syncs.update(account, state, |s| s.succeeded(now, every_us, used, before));
                    if raised {
                        tracing::info!(account, rule = %sync.rule.name, path = %sync.path, wechat_used = used, wxgate_count = before, "quota_sync: WeChat counts more calls today than wxgate did; day count raised");
                    }
                }
                Err(e) => {
                    cache.metrics.sync("error");
                    app.syncs.update(account, state, |s| s.failed(now, every_us, format!("store: {e}"), None, true));
                }
            }
        }
        Err((errcode, why)) => {
            cache.metrics.sync("error");
            // quota/get's own quota spent: not again before the next quota day.
            let not_before = (errcode == Some(45009)).then(|| Period::Day.next_start(now, offset_us));
            tracing::warn!(account, rule = %sync.rule.name, path = %sync.path, error = %why, "quota_sync: quota/get failed; backing off");
            app.syncs.update(account, state, |s| s.failed(now, every_us, why, not_before, true));
        }
    }
}

/// WeChat's `used` for `path` today, or (errcode, why). A call wxgate
/// makes itself, through the phases like any ([`crate::proxy::own`]):
/// decided against quota/get's rule if it has one, its answer handed to
/// every feature's hooks (a 45009 penalises that rule).
async fn quota_get(
    app: &App,
    config: &Arc<Config>,
    account: &str,
    token: &str,
    (domain, path): (usize, &str),
) -> Result<u64, (Option<i64>, String)> {
    let fail = |why: String| (None, why);
    let target = PathAndQuery::try_from(format!(
        "{QUOTA_GET}?access_token={}",
        crate::features::accounts::query::encoded(token)
    ))
    .map_err(|_| fail("the token cannot be sent in a query".into()))?;
    let body = Bytes::from(serde_json::json!({ "cgi_path": path }).to_string());
    let own = OwnCall {
        config: config.clone(),
        account: account.to_owned(),
        domain,
        method: Method::POST,
        target,
        body,
        seeds: Seeds::default(),
        queued_by: None,
    };
    let answered = app.call(own).await.map_err(|e| fail(e.to_string()))?;
    match answered.errcode {
        Some(0) => {}
        Some(code) => return Err((Some(code), format!("WeChat answered errcode {code}"))),
        None => return Err(fail("the answer is not WeChat's JSON".into())),
    }
    let json = answered
        .body
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .ok_or_else(|| fail("the answer is not JSON".into()))?;
    json["quota"]["used"].as_u64().ok_or_else(|| fail("the answer has no quota.used".into()))
}
