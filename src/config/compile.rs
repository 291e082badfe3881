//! Raw config → [`Config`]: every check, every message. A message names the
//! file and the line (of the field where it is in the file, else of its
//! table or rule), then the table or rule and the field:
//! `rules.toml:14: rule "menu": limits[0]: ...`, `rules.toml:3: [server] workers: ...`
//! ([`super::errors`] finds the lines).

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use toml::Spanned;

use super::errors::{leading_key, Ctx};
use super::raw::{RawConfig, RawLog, RawPenalty, RawTokens};
use super::rule::compile_rule;
use super::units::{micros, parse_duration, valid_name};
use super::{callers, intercept, settings, Config, ConfigError, LogConfig, QuotaSync, RuleAnswer, TokensConfig};
use crate::config::routes::{Pattern, Routes};
use crate::limit::calendar::Period;
use crate::limit::penalty::{PenaltyLength, PenaltyPolicy};
use crate::limit::{Limit, Rule, Scope};
use crate::time::Span;

const DEFAULT_LEASE: Duration = Duration::from_secs(30);

impl Config {
    /// Reads, parses and validates a config file.
    /// The memory store's default `state_file` is in the file's directory.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|e| ConfigError(format!("{}: cannot read: {e}", path.display())))?;
        let dir = path.parent().unwrap_or(Path::new(""));
        Config::compile_text(&text, path, Some(dir))
    }

    /// Parses and validates config text; `path` only labels the messages.
    /// Text that is not read from a file has no directory, so the memory
    /// store keeps no state file unless `state_file` names one.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        Config::compile_text(text, path, None)
    }

    /// The rule (or, for `scope = "path"`, the rule's variant for this API)
    /// a request path counts against; `None`: forwarded unthrottled.
    pub fn rule_for(&self, path: &str) -> Option<&Arc<Rule>> {
        self.routes.lookup(path).and_then(|i| self.routed.get(i))
    }

    /// The states of the rule named `name`: the rule itself, or its
    /// per-path variants (`scope = "path"`), in the order of its patterns.
    pub fn states_of<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Arc<Rule>> + 'a {
        self.routed.iter().filter(move |r| &*r.name == name)
    }

    fn compile_text(text: &str, path: &Path, dir: Option<&Path>) -> Result<Config, ConfigError> {
        let ctx = Ctx { text, path, dir };
        let de = toml::Deserializer::parse(text).map_err(|e| ctx.toml_error(&e))?;
        let raw: RawConfig = serde_path_to_error::deserialize(de).map_err(|e| ctx.serde_error(&e))?;
        compile(raw, &ctx)
    }
}

fn compile(raw: RawConfig, ctx: &Ctx<'_>) -> Result<Config, ConfigError> {
    let all_shadow = match raw.server.mode.as_deref() {
        None | Some("enforce") => false,
        Some("shadow") => true,
        Some(other) => {
            return Err(
                ctx.in_table(format!("[server] mode: \"{other}\" is unknown (expected \"enforce\" or \"shadow\")"))
            )
        }
    };
    let log = compile_log(&raw.log).map_err(|m| ctx.in_table(m))?;
    let server = settings::server(raw.server).map_err(|m| ctx.in_table(m))?;
    let lease = match raw.store.lease.as_deref() {
        None => DEFAULT_LEASE,
        Some(t) => parse_duration(t).map_err(|m| ctx.in_table(format!("[store] lease: {m}")))?,
    };
    if lease < Duration::from_secs(1) {
        return Err(ctx.in_table("[store] lease: must be at least 1s"));
    }
    let store = settings::store(raw.store, ctx.dir).map_err(|m| ctx.in_table(m))?;
    let penalties = match raw.penalty {
        None => PenaltyPolicy::defaults(),
        Some(list) => compile_penalties(list, ctx)?,
    };
    let mut rules = Vec::with_capacity(raw.rule.len());
    let mut names = HashSet::new();
    let mut spans = Vec::with_capacity(raw.rule.len());
    let mut patterns: Vec<(Pattern, usize)> = Vec::new();
    let mut routed: Vec<Arc<Rule>> = Vec::with_capacity(raw.rule.len());
    let mut answers = Vec::with_capacity(raw.rule.len());
    let mut quota_syncs = Vec::new();
    let tokens = compile_tokens(&raw.tokens).map_err(|m| ctx.in_table(m))?;
    for r in raw.rule.into_iter() {
        let span = r.span();
        spans.push(span.clone());
        let r = r.into_inner();
        if !valid_name(&r.name) {
            return Err(ctx.at_field(span, "name", format!("rule name \"{}\" must be 1-64 of [A-Za-z0-9_-]", r.name)));
        }
        if !names.insert(r.name.clone()) {
            return Err(ctx.at_field(span, "name", format!("rule \"{}\": another rule has the same name", r.name)));
        }
        let sync = r.quota_sync.clone();
        let (rule, answer, own) = compile_rule(
            r,
            rules.len(),
            span.clone(),
            all_shadow,
            server.throttle_status,
            server.window_margin_us,
            ctx,
        )?;
        answers.push(answer);
        let rule = Arc::new(rule);
        let first_sync = routed.len();
        let sync = match sync {
            None => None,
            Some(text) => Some((
                quota_sync(&text, &rule, &own).map_err(|m| {
                    ctx.at_field(span.clone(), "quota_sync", format!("rule \"{}\": quota_sync: {m}", rule.name))
                })?,
                first_exact(&own),
            )),
        };
        match rule.scope {
            Scope::Rule => {
                patterns.extend(own.into_iter().map(|p| (p, routed.len())));
                routed.push(rule.clone());
            }
            Scope::Path => {
                for p in own {
                    let Pattern::Exact(path) = &p else { continue };
                    let path: Arc<str> = path.as_str().into();
                    let state = format!("{}{path}", rule.name).into();
                    patterns.push((p, routed.len()));
                    routed.push(Arc::new(Rule { state, path: Some(path), ..(*rule).clone() }));
                }
            }
        }
        if let Some((every, first)) = sync {
            match rule.scope {
                Scope::Rule => quota_syncs.extend(first.map(|path| QuotaSync { rule: rule.clone(), path, every })),
                Scope::Path => quota_syncs.extend(routed[first_sync..].iter().filter_map(|v| {
                    let path = v.path.as_deref().filter(|p| !p.starts_with("/sns/"))?;
                    Some(QuotaSync { rule: v.clone(), path: path.to_owned(), every })
                })),
            }
        }
        rules.push(rule);
    }
    let default = routed.iter().position(|r| &*r.name == "default");
    let routes = Routes::new(patterns, default).map_err(|(p, a, b)| {
        let b_index = rules.iter().position(|r| r.name == routed[b].name).unwrap_or(0);
        ctx.at_field(
            spans[b_index].clone(),
            "match",
            format!("rules \"{}\" and \"{}\" both claim the path pattern \"{p}\"", routed[a].name, routed[b].name),
        )
    })?;
    let max_warmup_us = rules.iter().map(|r| r.warmup_us).max().unwrap_or(0);
    let caller_spans: Vec<std::ops::Range<usize>> = raw.caller.iter().map(|c| c.span()).collect();
    let callers = callers::compile(raw.caller, ctx.dir).map_err(|(span, m)| ctx.at(span, m))?;
    if server.caller_auth.required() {
        if callers.is_empty() {
            return Err(ctx.in_table(
                "[server] caller_auth: \"required\" needs at least one [[caller]] with a key and its accounts",
            ));
        }
        for (c, span) in callers.iter().zip(caller_spans) {
            let missing = match (c.key.is_some(), c.grants != crate::config::Grants::Unset) {
                (true, true) => continue,
                (false, _) => "a key (key_sha256 or key_file)",
                (true, false) => "accounts (the accounts it may spend, or [\"*\"])",
            };
            return Err(ctx.at(span, format!("caller \"{}\": caller_auth = \"required\" needs {missing}", c.name)));
        }
    }
    let intercept = intercept::compile(raw.intercept, ctx.dir).map_err(|m| ctx.in_table(m))?;
    let account_spans: Vec<std::ops::Range<usize>> = raw.account.iter().map(|a| a.span()).collect();
    let accounts = super::accounts::compile(raw.account, ctx.dir).map_err(|(span, m)| ctx.at(span, m))?;
    for (a, span) in accounts.list.iter().zip(account_spans) {
        if !server.caller_auth.required() && !server.listen.ip().is_loopback() {
            return Err(ctx.at(
                span,
                format!(
                    "[[account]] \"{}\": wxgate adds its token to calls that carry none, and listen {} is beyond \
                     loopback with caller_auth off, so any service that reaches it could spend the account: set \
                     [server] caller_auth = \"required\" and grant the account to its callers",
                    a.name, server.listen
                ),
            ));
        }
        if server.accounts.as_ref().is_some_and(|list| !list.contains(&*a.name)) {
            return Err(ctx.at(span, format!("[[account]] \"{}\" is not on [server] accounts", a.name)));
        }
    }
    let unruled = RuleAnswer { throttle_status: server.throttle_status, policy: Default::default(), meter: None };
    Ok(Config {
        source: ctx.path.to_path_buf(),
        answers,
        unruled,
        server,
        store,
        penalties,
        rules,
        routed,
        routes,
        lease_us: micros(lease),
        max_warmup_us,
        log,
        callers,
        tokens,
        quota_syncs,
        intercept,
        accounts,
    })
}

/// Shortest `quota_sync`: each sync is a WeChat call (quota/get has its
/// own limits).
const MIN_QUOTA_SYNC: Duration = Duration::from_secs(1);

/// A rule's `quota_sync` checked: a duration of at least 1s, on a rule
/// with a day quota and an exact path quota/get can answer for.
fn quota_sync(text: &str, rule: &Rule, patterns: &[Pattern]) -> Result<Duration, String> {
    let every = parse_duration(text)?;
    if every < MIN_QUOTA_SYNC {
        return Err(format!("\"{text}\" is shorter than 1s (each sync is a call to WeChat; \"10m\" is typical)"));
    }
    if !rule.limits.iter().any(|l| matches!(l, Limit::Calendar { period: Period::Day, .. })) {
        return Err("the rule has no per = \"day\" limit to keep in step with WeChat's count".into());
    }
    match patterns.iter().find(|p| matches!(p, Pattern::Exact(_))) {
        None => Err("needs an exact path in match (quota/get answers for one API path, not a prefix)".into()),
        Some(Pattern::Exact(path)) if path.starts_with("/sns/") => {
            Err(format!("\"{path}\": WeChat's quota/get does not answer for /sns/ APIs (76022)"))
        }
        Some(_) => Ok(every),
    }
}

/// The path a `scope = "rule"` rule's quota_sync asks for: its first exact one.
fn first_exact(patterns: &[Pattern]) -> Option<String> {
    patterns.iter().find_map(|p| match p {
        Pattern::Exact(path) => Some(path.clone()),
        Pattern::Prefix(_) => None,
    })
}

/// `[tokens]`.
fn compile_tokens(raw: &RawTokens) -> Result<TokensConfig, String> {
    let defaults = TokensConfig::default();
    let min_ttl = match raw.min_ttl.as_deref() {
        None => defaults.min_ttl,
        Some(t) => parse_duration(t).map_err(|m| format!("[tokens] min_ttl: {m}"))?,
    };
    if min_ttl >= Duration::from_secs(7200) {
        return Err("[tokens] min_ttl: must be shorter than a token's 2 hours".into());
    }
    let wait = match raw.wait.as_deref() {
        None => defaults.wait,
        Some(t) => parse_duration(t).map_err(|m| format!("[tokens] wait: {m}"))?,
    };
    if wait < Duration::from_secs(1) || wait > Duration::from_secs(120) {
        return Err("[tokens] wait: must be between 1s and 2m".into());
    }
    Ok(TokensConfig { cache: raw.cache, min_ttl, wait, key_file: raw.key_file.clone() })
}

fn compile_log(raw: &RawLog) -> Result<LogConfig, String> {
    let json = match raw.format.as_deref() {
        None | Some("text") => false,
        Some("json") => true,
        Some(other) => return Err(format!("[log] format: \"{other}\" is unknown (expected \"text\" or \"json\")")),
    };
    Ok(LogConfig { json, access: raw.access.unwrap_or(true) })
}

fn compile_penalties(list: Vec<Spanned<RawPenalty>>, ctx: &Ctx<'_>) -> Result<Vec<PenaltyPolicy>, ConfigError> {
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(list.len());
    for p in list {
        let span = p.span();
        let p = p.into_inner();
        if !seen.insert(p.errcode) {
            return Err(ctx.at_field(span, "errcode", format!("[[penalty]] errcode {} is listed twice", p.errcode)));
        }
        // "[[penalty]] errcode 45009: seconds must be ...": at `seconds`.
        out.push(
            compile_penalty(p)
                .map_err(|m| ctx.at_field(span.clone(), m.split_once(": ").map_or("", |(_, f)| leading_key(f)), &m))?,
        );
    }
    Ok(out)
}

fn compile_penalty(p: RawPenalty) -> Result<PenaltyPolicy, String> {
    let length = match (p.seconds, p.until.as_deref()) {
        (Some(0), None) => return Err(format!("[[penalty]] errcode {}: seconds must be at least 1", p.errcode)),
        (Some(s), None) => PenaltyLength::Escalating { base: Span::from_secs(s) },
        (None, Some("next_minute")) => PenaltyLength::NextMinute,
        (None, Some(other)) => {
            return Err(format!(
                "[[penalty]] errcode {}: until = \"{other}\" is unknown (expected \"next_minute\")",
                p.errcode
            ))
        }
        (Some(_), Some(_)) => {
            return Err(format!("[[penalty]] errcode {}: give seconds or until, not both", p.errcode))
        }
        (None, None) => return Err(format!("[[penalty]] errcode {}: needs seconds or until", p.errcode)),
    };
    let max = match p.max_seconds {
        Some(0) => return Err(format!("[[penalty]] errcode {}: max_seconds must be at least 1", p.errcode)),
        Some(s) => Some(Span::from_secs(s)),
        None => None,
    };
    Ok(PenaltyPolicy { errcode: p.errcode, length, max })
}
