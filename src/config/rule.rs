//! One `[[rule]]`: the table as serde reads it, and its compilation into
//! a [`Rule`] (its numbers derived by [`Rule::with_percents`]) and what its
//! answers show ([`RuleAnswer`]). A new rule field is read and checked here.

use std::collections::HashSet;

use serde::Deserialize;
use toml::Spanned;

use super::errors::{leading_key, Ctx};
use super::meter::RawRecipients;
use super::ratelimit::Policy;
use super::routes::Pattern;
use super::units::{micros, parse_duration, throttle_status as parse_throttle_status};
use super::{ConfigError, RuleAnswer};
use crate::limit::calendar::{Period, DAY_US};
use crate::limit::{Limit, Rule, Scope, WindowLimit};

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
    pub cost: Option<String>,
    pub recipients: Option<RawRecipients>,
    pub per_recipient: Option<Vec<Spanned<RawLimit>>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLimit {
    pub count: u64,
    pub per: String,
    pub burst: Option<u64>,
}

/// One `[[rule]]` (its name already checked), and its parsed `match` patterns.
pub(super) fn compile_rule(
    r: RawRule,
    id: usize,
    span: std::ops::Range<usize>,
    all_shadow: bool,
    throttle_status: http::StatusCode,
    margin_us: crate::time::Micros,
    ctx: &Ctx<'_>,
) -> Result<(Rule, RuleAnswer, Vec<Pattern>), ConfigError> {
    let err = |m: String| ctx.at_field(span.clone(), leading_key(&m), format!("rule \"{}\": {m}", r.name));
    if r.patterns.is_empty() && r.name != "default" {
        return Err(err("match: needs at least one path pattern".into()));
    }
    let mut patterns = Vec::with_capacity(r.patterns.len());
    for p in &r.patterns {
        patterns.push(Pattern::parse(p).map_err(|m| err(format!("match \"{p}\": {m}")))?);
    }
    let mut limits = Vec::with_capacity(r.limits.len());
    let mut windows = HashSet::new();
    for (i, l) in r.limits.iter().enumerate() {
        let at = |m: String| ctx.at_field(l.span(), leading_key(&m), format!("rule \"{}\": limits[{i}]: {m}", r.name));
        let limit = compile_limit(l.get_ref(), margin_us).map_err(at)?;
        if !windows.insert(limit.window_key()) {
            return Err(at(format!("another limit of this rule has per = \"{}\"", l.get_ref().per)));
        }
        limits.push(limit);
    }
    let max_wait_us = match r.max_wait.as_deref() {
        None => 0,
        Some(t) => {
            let d = parse_duration(t).map_err(|m| err(format!("max_wait: {m}")))?;
            if d > MAX_MAX_WAIT {
                return Err(err(format!("max_wait: \"{t}\" is longer than 5m")));
            }
            micros(d)
        }
    };
    let warmup_us = match r.warmup.as_deref() {
        None => 0,
        Some(t) => micros(parse_duration(t).map_err(|m| err(format!("warmup: {m}")))?),
    };
    if warmup_us > 31 * DAY_US {
        return Err(err("warmup: longer than 31 days".into()));
    }
    let shadow = match r.mode.as_deref() {
        None | Some("enforce") => all_shadow,
        Some("shadow") => true,
        Some(other) => return Err(err(format!("mode: \"{other}\" is unknown (expected \"enforce\" or \"shadow\")"))),
    };
    let concurrency = match r.concurrency {
        Some(0) => return Err(err("concurrency: must be at least 1 (leave it out for no cap)".into())),
        Some(c) => c,
        None => 0,
    };
    let throttle_status = parse_throttle_status(r.throttle_status).map_err(err)?.unwrap_or(throttle_status);
    let scope = match r.scope.as_deref() {
        None | Some("rule") => Scope::Rule,
        Some("path") => Scope::Path,
        Some(other) => return Err(err(format!("scope: \"{other}\" is unknown (expected \"rule\" or \"path\")"))),
    };
    if scope == Scope::Path {
        if r.name == "default" {
            return Err(err(
                "scope = \"path\": the default rule takes every unlisted path, so its states would be as many as \
                 the paths clients send; list the APIs in a rule of their own"
                    .into(),
            ));
        }
        if let Some(p) = r.patterns.iter().zip(&patterns).find(|(_, p)| matches!(p, Pattern::Prefix(_))) {
            return Err(err(format!(
                "scope = \"path\" counts each listed API apart: list them as exact paths (\"{}\" is a prefix, \
                 which would make the number of counters depend on what clients send)",
                p.0
            )));
        }
    }
    let percent = |text: Option<&str>, key: &str| match text {
        None => Ok(0),
        Some(text) => percent_of(text).map_err(|m| err(format!("{key}: {m}"))),
    };
    let (reserve_percent, share_percent) =
        (percent(r.reserve.as_deref(), "reserve")?, percent(r.max_share.as_deref(), "max_share")?);
    let by_recipients = match r.cost.as_deref() {
        None | Some("call") => false,
        Some("recipients") => true,
        Some(other) => return Err(err(format!("cost: \"{other}\" is unknown (expected \"call\" or \"recipients\")"))),
    };
    let mut per_recipient = Vec::new();
    for (i, l) in r.per_recipient.iter().flatten().enumerate() {
        let at = |m: String| {
            ctx.at_field(l.span(), leading_key(&m), format!("rule \"{}\": per_recipient[{i}]: {m}", r.name))
        };
        match compile_limit(l.get_ref(), margin_us).map_err(at)? {
            Limit::Window(w) if per_recipient.iter().any(|p: &WindowLimit| p.per_us == w.per_us) => {
                return Err(at(format!("another per_recipient limit has per = \"{}\"", l.get_ref().per)));
            }
            Limit::Window(w) => per_recipient.push(w),
            Limit::Calendar { .. } => {
                return Err(at(
                    "per_recipient limits are windows (\"1m\", \"1h\"): a recipient's calendar count is not kept"
                        .into(),
                ))
            }
        }
    }
    if per_recipient.len() > crate::limit::MAX_RECIPIENT_WINDOWS {
        return Err(err(format!("per_recipient: at most {} limits", crate::limit::MAX_RECIPIENT_WINDOWS)));
    }
    let meter = match r.recipients {
        None if by_recipients => {
            return Err(err("cost = \"recipients\": needs recipients = { field = \"...\" } to count them".into()))
        }
        None if !per_recipient.is_empty() => {
            return Err(err("per_recipient: needs recipients = { field = \"...\" } to know whom a call is to".into()))
        }
        None => None,
        Some(_) if !by_recipients && per_recipient.is_empty() => {
            return Err(err(
                "recipients: read only for cost = \"recipients\" or per_recipient; give one of them, or leave \
                 recipients out"
                    .into(),
            ))
        }
        Some(raw) => Some(std::sync::Arc::new(
            super::meter::Metering::compile(&r.name, raw, by_recipients)
                .map_err(|m| err(format!("recipients: {m}")))?,
        )),
    };
    if meter.is_some() && scope == Scope::Path {
        return Err(err("recipients: not with scope = \"path\" (give the API a rule of its own)".into()));
    }
    let rule = Rule {
        id,
        scope,
        patterns: r.patterns,
        max_wait_us,
        warmup_us,
        concurrency,
        shadow,
        per_recipient,
        ..Rule::new(&r.name, limits)
    }
    .with_percents(reserve_percent, share_percent)
    .map_err(|e| err(e.to_string()))?;
    let answer = RuleAnswer { throttle_status, policy: Policy::of(&rule), meter };
    Ok((rule, answer, patterns))
}

/// `"P%"`, 1 to 99.
fn percent_of(text: &str) -> Result<u32, String> {
    text.strip_suffix('%')
        .and_then(|p| p.trim().parse::<u32>().ok())
        .filter(|p| (1..=99).contains(p))
        .ok_or_else(|| format!("\"{text}\": expected a share such as \"20%\" (1% to 99%)"))
}

/// One limit; a window gets the arrival margin `margin_us` (`[server] window_margin`).
fn compile_limit(l: &RawLimit, margin_us: crate::time::Micros) -> Result<Limit, String> {
    if l.count == 0 {
        return Err("count must be at least 1".into());
    }
    if l.count > 1_000_000_000 {
        return Err(format!("count {} is too large (at most 1000000000)", l.count));
    }
    match l.per.as_str() {
        "day" | "month" => {
            if l.burst.is_some() {
                return Err(format!("burst does not apply to per = \"{}\" (a calendar quota)", l.per));
            }
            let period = if l.per == "day" { Period::Day } else { Period::Month };
            Ok(Limit::Calendar { count: l.count, period })
        }
        per => {
            let window = parse_duration(per).map_err(|m| format!("per: {m}"))?;
            let per_us = i64::try_from(window.as_micros()).map_err(|_| "per: too long".to_string())?;
            if per_us < 1_000_000 {
                return Err(format!("per = \"{per}\" is shorter than 1s"));
            }
            if per_us > 31 * DAY_US {
                return Err(format!("per = \"{per}\" is longer than 31 days; use per = \"month\""));
            }
            // WeChat's daily and monthly quotas are calendar periods. A
            // window of whole days is almost always one of those written
            // as a duration; an explicit burst says a sliding window is meant.
            if per_us % DAY_US == 0 && l.burst.is_none() {
                let calendar = if per_us == DAY_US { "day" } else { "month" };
                return Err(format!(
                    "per = \"{per}\" is a sliding window of {} x 24 hours, not a calendar {calendar}: WeChat's daily \
                     quotas start again at midnight, so write per = \"{calendar}\" (the calendar {calendar} in \
                     quota_timezone); to mean a sliding window, give its burst too",
                    per_us / DAY_US
                ));
            }
            let burst = l.burst.unwrap_or_else(|| WindowLimit::default_burst(l.count));
            if burst == 0 {
                return Err("burst must be at least 1".into());
            }
            if burst > l.count {
                return Err(format!("burst {burst} exceeds count {}", l.count));
            }
            Ok(Limit::Window(WindowLimit::with_margin(l.count, per_us, burst, margin_us)))
        }
    }
}
