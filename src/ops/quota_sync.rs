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
//! it: [`crate::store::pair_op::RaiseDay`]).
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
use crate::store::pair_op::{LearnDay, RaiseDay};
use crate::store::tokens::Claim;
use crate::time::Micros;

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
    let known = cache.known(now);
    // A 45009 first: is the day spent (quota/get says so: its limit and
    // count are taken, no call goes until the quota day ends) or was it a
    // frequency limit (the penalty holds the pair)?
    for (account, state, sent_at) in app.features.penalties.take_day_checks() {
        let Some(sync) = config.quota_syncs.iter().find(|s| s.rule.state == state) else { continue };
        let Some((_, token)) = known.iter().find(|(a, _)| *a == account) else { continue };
        one(app, &config, &account, token, sync, Why::Penalised { sent_at }).await;
    }
    for (account, token) in &known {
        if config.server.accounts.as_ref().is_some_and(|list| !list.contains(account)) {
            continue;
        }
        for sync in &config.quota_syncs {
            let due = app.syncs.get(account, &sync.rule.state).is_none_or(|s| s.next_at <= now);
            if due {
                one(app, &config, account, token, sync, Why::Due).await;
            }
        }
    }
}

/// Why a sync runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Why {
    /// Its interval is up.
    Due,
    /// WeChat answered 45009 to a call of the pair admitted at `sent_at`:
    /// checked at once, whenever the last sync was; one check per
    /// [`CHECK_EVERY`] across instances.
    Penalised { sent_at: Micros },
}

/// Across instances, at most one quota/get per pair and this long after a 45009.
pub const CHECK_EVERY: Duration = Duration::from_secs(10);

/// One sync of (account, sync's state).
async fn one(app: &App, config: &Arc<Config>, account: &str, token: &str, sync: &QuotaSync, why: Why) {
    let Some(cache) = &app.features.token_cache.cache else { return };
    let state = &sync.rule.state;
    let every_us = micros(sync.every);
    let now = app.core.clock.now_us();
    let (slot, lease_us) = match why {
        Why::Due => (format!("sync:{account}:{state}"), every_us),
        Why::Penalised { .. } => (format!("check:{account}:{state}"), micros(CHECK_EVERY)),
    };
    match cache.store.tokens().claim_token(&slot, cache.instance(), i64::MAX, i64::MAX, lease_us).await {
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
        Ok(Reported { used, daily_limit }) => {
            // The account's own limits where a `[[quota]]` overrides the rule's.
            let key = Key { account, rule: config.rule_of(account, &sync.rule), offset_us };
            if let Some(limit) = daily_limit {
                learn(app, key, limit).await;
                if let Why::Penalised { sent_at } = why {
                    let spent = used >= limit;
                    tracing::info!(account, rule = %sync.rule.name, wechat_used = used, daily_limit = limit, day_spent = spent, "quota_sync: checked a 45009 with quota/get ({})", if spent { "the day quota is spent: nothing more until the quota day ends" } else { "not the day quota: a frequency limit" });
                    if !spent {
                        crate::features::penalties::lower_windows(&app.core, key, sent_at).await;
                    }
                }
            }
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

/// WeChat's `daily_limit` for the pair: kept in its state
/// ([`crate::limit::learned`]), counted and logged when it changes the
/// pair's day limit.
async fn learn(app: &App, key: Key<'_>, limit: u64) {
    let rule = key.rule;
    let Some(configured) = rule.limits.iter().find_map(|l| match l {
        crate::limit::Limit::Calendar { count, period: Period::Day } => Some(count.get()),
        _ => None,
    }) else {
        return;
    };
    let effective = |learned: u64| match learned {
        0 => configured,
        l if rule.learn_up || l < configured => l,
        _ => configured,
    };
    match app.core.store.apply(key, LearnDay { limit }).await {
        Ok(before) => {
            let (was, now) = (effective(before), effective(limit));
            // What the day-quota gauges' fractions are of (`crate::admit::forecasts`).
            app.core.forecasts.set_limit(key.account, &rule.state, now);
            if was != now {
                let direction = if now < was { "down" } else { "up" };
                app.core.metrics.learned(&rule.name, direction);
                tracing::info!(account = key.account, rule = %rule.name, configured, day_limit_was = was, day_limit = now, "quota_sync: WeChat reports another day limit for this account; its day quota follows");
            }
        }
        Err(e) => {
            tracing::warn!(account = key.account, rule = %rule.name, error = %e, "quota_sync: could not keep the day limit WeChat reported")
        }
    }
}

/// What quota/get reports of an API today.
struct Reported {
    used: u64,
    /// `daily_limit`, when WeChat gives one (absent or 0: none).
    daily_limit: Option<u64>,
}

/// WeChat's `used` (and `daily_limit`) for `path` today, or (errcode, why). A call wxgate
/// makes itself, through the phases like any ([`crate::proxy::own`]):
/// decided against quota/get's rule if it has one, its answer handed to
/// every feature's hooks (a 45009 penalises that rule).
async fn quota_get(
    app: &App,
    config: &Arc<Config>,
    account: &str,
    token: &str,
    (domain, path): (usize, &str),
) -> Result<Reported, (Option<i64>, String)> {
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
        submitted: None,
        answer_cap: 0,
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
    let used = json["quota"]["used"].as_u64().ok_or_else(|| fail("the answer has no quota.used".into()))?;
    let daily_limit = json["quota"]["daily_limit"].as_u64().filter(|l| *l > 0);
    Ok(Reported { used, daily_limit })
}
