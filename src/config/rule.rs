//! One `[[rule]]`: the table as serde reads it, and its compilation into
//! a [`Rule`] (its numbers derived by [`Rule::with_percents`]) and its HTTP
//! side ([`RuleHttp`]). A new rule field is read and checked here.

use std::collections::HashSet;
use std::num::NonZeroU64;
use std::ops::Range;
use std::sync::Arc;

use serde::Deserialize;
use toml::Spanned;

use super::errors::{leading_key, ConfigError, Ctx, Invalid};
use super::meter::{Metering, RawRecipients};
use super::ratelimit::Policy;
use super::routes::Pattern;
use super::units::{ambiguous_unit, micros, month_unit, parse_duration, throttle_status as parse_throttle_status};
use super::RuleHttp;
use crate::limit::calendar::{Period, DAY_US};
use crate::limit::{Limit, Rule, Scope, WindowLimit};
use crate::time::Micros;

/// Longest `max_wait`: a held call keeps its client's connection open.
const MAX_MAX_WAIT: std::time::Duration = std::time::Duration::from_secs(300);

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRule {
    pub name: String,
    #[serde(rename = "match", default)]
    pub patterns: Vec<String>,
    #[serde(default)]
    pub limits: Vec<Spanned<RawLimit>>,
    pub max_wait: Option<String>,
    pub warmup: Option<String>,
    pub concurrency: Option<u32>,
    pub mode: Option<String>,
    pub throttle_status: Option<u16>,
    pub scope: Option<String>,
    pub reserve: Option<String>,
    pub max_share: Option<String>,
    pub quota_sync: Option<String>,
    pub learn: Option<String>,
    pub learn_windows: Option<bool>,
    pub cost: Option<String>,
    pub recipients: Option<RawRecipients>,
    pub per_recipient: Option<Vec<Spanned<RawLimit>>>,
    pub queue: Option<bool>,
    pub queue_deadline: Option<String>,
    pub queue_order: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLimit {
    pub count: u64,
    pub per: String,
    pub burst: Option<u64>,
}

/// What a rule takes from `[server]` unless it says otherwise.
pub(super) struct RuleDefaults<'a> {
    /// `[server] mode = "shadow"`.
    pub all_shadow: bool,
    pub throttle_status: http::StatusCode,
    /// `[server] window_margin`, for every window.
    pub margin_us: Micros,
    /// Its `[[domain]]`'s name, put before its own (`qyapi.default`).
    pub prefix: Option<&'a str>,
}

/// Where a rule's errors go: the rule's table, at the line of the field
/// they name (else the rule's header), or at a limit's own table.
pub(super) struct At<'a> {
    pub ctx: &'a Ctx<'a>,
    pub span: Range<usize>,
    pub table: String,
}

impl At<'_> {
    /// An error about the rule; its field (or the key its message starts
    /// with: `count must be ...`) gives the line.
    pub(super) fn rule(&self, e: Invalid) -> ConfigError {
        let key = leading_key(e.field.as_deref().unwrap_or(&e.message)).to_owned();
        self.ctx.at_field(self.span.clone(), &key, e.table(self.table.clone()))
    }

    /// An error about the limit `field` (`limits[0]`) written at `span`.
    fn limit(&self, span: Range<usize>, field: &str, e: Invalid) -> ConfigError {
        let key = leading_key(e.field.as_deref().unwrap_or(&e.message)).to_owned();
        self.ctx.at_field(span, &key, e.field(field).table(self.table.clone()))
    }
}

/// One `[[rule]]` (its name already checked), and its parsed `match` patterns.
pub(super) fn compile_rule(
    r: RawRule,
    id: usize,
    span: Range<usize>,
    defaults: RuleDefaults<'_>,
    ctx: &Ctx<'_>,
) -> Result<(Rule, RuleHttp, Vec<Pattern>), ConfigError> {
    let at = At { ctx, span, table: format!("rule \"{}\"", r.name) };
    let qualified = match defaults.prefix {
        Some(prefix) => format!("{prefix}.{}", r.name),
        None => r.name.clone(),
    };
    let patterns = patterns(&r).map_err(|e| at.rule(e))?;
    let limits = limits(&r.limits, "limits", defaults.margin_us, &at)?;
    let (max_wait_us, warmup_us) = timing(&r).map_err(|e| at.rule(e))?;
    let shadow = match r.mode.as_deref() {
        None | Some("enforce") => defaults.all_shadow,
        Some("shadow") => true,
        Some(other) => {
            let e = Invalid::new(format!("\"{other}\" is unknown (expected \"enforce\" or \"shadow\")"));
            return Err(at.rule(e.field("mode")));
        }
    };
    let concurrency = match r.concurrency {
        Some(0) => {
            return Err(at.rule(Invalid::new("must be at least 1 (leave it out for no cap)").field("concurrency")))
        }
        Some(c) => c,
        None => 0,
    };
    let throttle_status =
        parse_throttle_status(r.throttle_status).map_err(|e| at.rule(e))?.unwrap_or(defaults.throttle_status);
    let scope = scope(&r, &patterns).map_err(|e| at.rule(e))?;
    let percent = |text: Option<&str>, key: &str| match text {
        None => Ok(0),
        Some(text) => percent_of(text).map_err(|e| at.rule(e.field(key))),
    };
    let (reserve_percent, share_percent) =
        (percent(r.reserve.as_deref(), "reserve")?, percent(r.max_share.as_deref(), "max_share")?);
    let learn_up = match (r.learn.as_deref(), r.quota_sync.is_some()) {
        (None | Some("down"), _) => false,
        (Some("both"), true) => true,
        (Some("both"), false) => {
            let e = Invalid::new("\"both\" needs quota_sync (the day limit is learned from WeChat's quota/get)");
            return Err(at.rule(e.field("learn")));
        }
        (Some(other), _) => {
            let e = Invalid::new(format!("\"{other}\" is unknown (expected \"down\" or \"both\")"));
            return Err(at.rule(e.field("learn")));
        }
    };
    let per_recipient = per_recipient(&r, defaults.margin_us, &at)?;
    let recipients =
        recipients(&r.name, r.recipients, r.cost.as_deref(), &per_recipient, scope).map_err(|e| at.rule(e))?;
    let rule = Rule {
        id,
        scope,
        patterns: r.patterns,
        max_wait_us,
        warmup_us,
        concurrency,
        shadow,
        per_recipient,
        learn_up,
        learn_windows: r.learn_windows.unwrap_or(true) && limits.iter().any(|l| matches!(l, Limit::Window(_))),
        ..Rule::new(&qualified, limits)
    }
    .with_percents(reserve_percent, share_percent)
    .map_err(|e| at.rule(Invalid::new(e.to_string())))?;
    let queue = match (r.queue, r.queue_deadline.as_deref()) {
        (Some(true), deadline) => {
            Some(super::queue::deadline(deadline).map_err(|e| at.rule(e.field("queue_deadline")))?)
        }
        (_, Some(_)) => {
            return Err(at.rule(Invalid::new("is for a rule with queue = true").field("queue_deadline")));
        }
        _ => None,
    };
    let queue_strict = match (r.queue_order.as_deref(), queue.is_some()) {
        (None | Some("recipient"), _) => false,
        (Some("strict"), true) => true,
        (Some("strict"), false) => {
            return Err(at.rule(Invalid::new("is for a rule with queue = true").field("queue_order")));
        }
        (Some(other), _) => {
            let e = Invalid::new(format!("\"{other}\" is unknown (expected \"recipient\" or \"strict\")"));
            return Err(at.rule(e.field("queue_order")));
        }
    };
    let http = RuleHttp { throttle_status, policy: Policy::of(&rule), recipients, queue, queue_strict };
    Ok((rule, http, patterns))
}

/// `match`: at least one pattern (the `default` rule may have none).
fn patterns(r: &RawRule) -> Result<Vec<Pattern>, Invalid> {
    if r.patterns.is_empty() && r.name != "default" {
        return Err(Invalid::new("needs at least one path pattern").field("match"));
    }
    r.patterns.iter().map(|p| Pattern::parse(p).map_err(|e| e.field(format!("match \"{p}\"")))).collect()
}

/// `limits` (or `per_recipient`'s, or a `[[quota]]`'s): no two of one window.
pub(super) fn limits(
    raw: &[Spanned<RawLimit>],
    key: &str,
    margin_us: Micros,
    at: &At<'_>,
) -> Result<Vec<Limit>, ConfigError> {
    let mut limits = Vec::with_capacity(raw.len());
    let mut windows = HashSet::new();
    for (i, l) in raw.iter().enumerate() {
        let field = format!("{key}[{i}]");
        let limit = compile_limit(l.get_ref(), margin_us).map_err(|e| at.limit(l.span(), &field, e))?;
        if !windows.insert(limit.window_key()) {
            let other = match key {
                _ if at.table.starts_with("[[quota]]") => "another limit of this override",
                "limits" => "another limit of this rule",
                _ => "another per_recipient limit",
            };
            let e = Invalid::new(format!("{other} has per = \"{}\"", l.get_ref().per));
            return Err(at.limit(l.span(), &field, e));
        }
        limits.push(limit);
    }
    Ok(limits)
}

/// `max_wait` and `warmup`.
fn timing(r: &RawRule) -> Result<(Micros, Micros), Invalid> {
    let max_wait_us = match r.max_wait.as_deref() {
        None => 0,
        Some(t) => {
            let d = parse_duration(t).map_err(|e| e.field("max_wait"))?;
            if d > MAX_MAX_WAIT {
                return Err(Invalid::new(format!("\"{t}\" is longer than 5m")).field("max_wait"));
            }
            micros(d)
        }
    };
    let warmup_us = match r.warmup.as_deref() {
        None => 0,
        Some(t) => micros(parse_duration(t).map_err(|e| e.field("warmup"))?),
    };
    if warmup_us > 31 * DAY_US {
        return Err(Invalid::new("longer than 31 days").field("warmup"));
    }
    Ok((max_wait_us, warmup_us))
}

/// `scope`; `"path"` needs listed APIs (exact paths, not the default
/// rule's); `"app"` reads the app from the body (it needs `recipients`,
/// checked with them) and is not synced with quota/get (WeCom has none).
fn scope(r: &RawRule, patterns: &[Pattern]) -> Result<Scope, Invalid> {
    let scope = match r.scope.as_deref() {
        None | Some("rule") => Scope::Rule,
        Some("path") => Scope::Path,
        Some("app") => Scope::App,
        Some(other) => {
            return Err(
                Invalid::new(format!("\"{other}\" is unknown (expected \"rule\", \"path\" or \"app\")")).field("scope")
            )
        }
    };
    if scope == Scope::App && r.quota_sync.is_some() {
        return Err(Invalid::new(
            "each WeCom app's counts are kept apart, and quota/get (an official account's API) knows no app; leave \
             quota_sync out",
        )
        .field("scope = \"app\""));
    }
    if scope == Scope::Path {
        if r.name == "default" {
            return Err(Invalid::new(
                "the default rule takes every unlisted path, so its states would be as many as the paths clients \
                 send; list the APIs in a rule of their own",
            )
            .field("scope = \"path\""));
        }
        if let Some(p) = r.patterns.iter().zip(patterns).find(|(_, p)| matches!(p, Pattern::Prefix(_))) {
            return Err(Invalid::new(format!(
                "scope = \"path\" counts each listed API apart: list them as exact paths (\"{}\" is a prefix, \
                 which would make the number of counters depend on what clients send)",
                p.0
            )));
        }
    }
    Ok(scope)
}

/// `per_recipient`: windows only, at most [`crate::limit::MAX_RECIPIENT_WINDOWS`].
fn per_recipient(r: &RawRule, margin_us: Micros, at: &At<'_>) -> Result<Vec<WindowLimit>, ConfigError> {
    let raw = r.per_recipient.as_deref().unwrap_or_default();
    let mut windows = Vec::with_capacity(raw.len());
    for (i, limit) in limits(raw, "per_recipient", margin_us, at)?.into_iter().enumerate() {
        match limit {
            Limit::Window(w) => windows.push(w),
            Limit::Calendar { .. } => {
                let e = Invalid::new(
                    "per_recipient limits are windows (\"1m\", \"1h\"): a recipient's calendar count is not kept",
                );
                return Err(at.limit(raw[i].span(), &format!("per_recipient[{i}]"), e));
            }
        }
    }
    if windows.len() > crate::limit::MAX_RECIPIENT_WINDOWS {
        let e = Invalid::new(format!("at most {} limits", crate::limit::MAX_RECIPIENT_WINDOWS));
        return Err(at.rule(e.field("per_recipient")));
    }
    Ok(windows)
}

/// `cost` and `recipients`: read only when a limit counts them.
fn recipients(
    rule: &str,
    raw: Option<RawRecipients>,
    cost: Option<&str>,
    per_recipient: &[WindowLimit],
    scope: Scope,
) -> Result<Option<Arc<Metering>>, Invalid> {
    let by_recipients = match cost {
        None | Some("call") => false,
        Some("recipients") => true,
        Some(other) => {
            return Err(
                Invalid::new(format!("\"{other}\" is unknown (expected \"call\" or \"recipients\")")).field("cost")
            )
        }
    };
    let metering =
        match raw {
            None if scope == Scope::App => return Err(Invalid::new(
                "counts each WeCom app apart, by the body's agentid: it needs recipients = { field = \"...\" } (the \
                 body is read only for a rule with recipients)",
            )
            .field("scope = \"app\"")),
            None if by_recipients => {
                return Err(
                    Invalid::new("needs recipients = { field = \"...\" } to count them").field("cost = \"recipients\"")
                )
            }
            None if !per_recipient.is_empty() => {
                return Err(Invalid::new("needs recipients = { field = \"...\" } to know whom a call is to")
                    .field("per_recipient"))
            }
            None => return Ok(None),
            Some(_) if !by_recipients && per_recipient.is_empty() => {
                return Err(Invalid::new(
                    "read only for cost = \"recipients\" or per_recipient; give one of them, or leave recipients out",
                )
                .field("recipients"))
            }
            Some(raw) => Metering::compile(rule, raw, by_recipients).map_err(|e| e.field("recipients"))?,
        };
    if scope == Scope::Path {
        return Err(Invalid::new("not with scope = \"path\" (give the API a rule of its own)").field("recipients"));
    }
    Ok(Some(Arc::new(metering)))
}

/// `"P%"`, 1 to 99.
fn percent_of(text: &str) -> Result<u32, Invalid> {
    text.strip_suffix('%')
        .and_then(|p| p.trim().parse::<u32>().ok())
        .filter(|p| (1..=99).contains(p))
        .ok_or_else(|| Invalid::new(format!("\"{text}\": expected a share such as \"20%\" (1% to 99%)")))
}

/// One limit; a window gets the arrival margin `margin_us` (`[server] window_margin`).
fn compile_limit(l: &RawLimit, margin_us: Micros) -> Result<Limit, Invalid> {
    let Some(count) = NonZeroU64::new(l.count) else { return Err(Invalid::new("count must be at least 1")) };
    if l.count > 1_000_000_000 {
        return Err(Invalid::new(format!("count {} is too large (at most 1000000000)", l.count)));
    }
    match l.per.as_str() {
        "day" | "month" => {
            if l.burst.is_some() {
                return Err(Invalid::new(format!("burst does not apply to per = \"{}\" (a calendar quota)", l.per)));
            }
            let period = if l.per == "day" { Period::Day } else { Period::Month };
            Ok(Limit::Calendar { count, period })
        }
        per => {
            if ambiguous_unit(per) {
                return Err(Invalid::new(format!(
                    "per = \"{per}\": the unit M is ambiguous (minutes or months): write per = \"1min\" (or \"1m\") \
                     for a one-minute window, or per = \"month\" for WeChat's calendar month"
                )));
            }
            if month_unit(per) {
                return Err(Invalid::new(format!(
                    "per = \"{per}\" is a sliding window of 30.44 days, not a calendar month: WeChat's monthly quotas \
                     start again on the 1st, so write per = \"month\""
                )));
            }
            let window = parse_duration(per).map_err(|e| e.field("per"))?;
            let per_us = i64::try_from(window.as_micros()).map_err(|_| Invalid::new("too long").field("per"))?;
            if per_us < 1_000_000 {
                return Err(Invalid::new(format!("per = \"{per}\" is shorter than 1s")));
            }
            if per_us > 31 * DAY_US {
                return Err(Invalid::new(format!("per = \"{per}\" is longer than 31 days; use per = \"month\"")));
            }
            // WeChat's daily and monthly quotas are calendar periods. A
            // window of whole days is almost always one of those written
            // as a duration; an explicit burst says a sliding window is meant.
            let days = per_us / DAY_US;
            if per_us % DAY_US == 0 && l.burst.is_none() && !(days == 1 || (28..=31).contains(&days)) {
                return Err(Invalid::new(format!(
                    "per = \"{per}\" is a sliding window of {days} x 24 hours: WeChat's quotas are per calendar day \
                     (per = \"day\") or month (per = \"month\"), none per {days} days; to mean a sliding window, \
                     write per = \"{days}d\" and give its burst too"
                )));
            }
            if per_us % DAY_US == 0 && l.burst.is_none() {
                let calendar = if per_us == DAY_US { "day" } else { "month" };
                return Err(Invalid::new(format!(
                    "per = \"{per}\" is a sliding window of {} x 24 hours, not a calendar {calendar}: WeChat's daily \
                     quotas start again at midnight, so write per = \"{calendar}\" (the calendar {calendar} in \
                     quota_timezone); to mean a sliding window, give its burst too",
                    per_us / DAY_US
                )));
            }
            // `burst must be at least 1`, `burst 40 exceeds count 30`.
            let burst = l.burst.unwrap_or_else(|| WindowLimit::default_burst(l.count));
            let window = WindowLimit::with_margin(l.count, per_us, burst, margin_us);
            Ok(Limit::Window(window.map_err(|e| Invalid::new(e.to_string()))?))
        }
    }
}
