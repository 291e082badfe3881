//! Raw config → [`Config`]: every check, every message. A message names the
//! file and the line (of the field where it is in the file, else of its
//! table or rule), then the table or rule and the field:
//! `rules.toml:14: rule "menu": limits[0]: ...`, `rules.toml:3: [server] workers: ...`
//! ([`super::errors`] finds the lines).

use std::collections::HashSet;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use toml::Spanned;

use super::accounts::SecretAccounts;
use super::errors::{Ctx, Invalid};
use super::raw::{RawConfig, RawLog, RawTokens};
use super::rule::{compile_rule, RawRule, RuleDefaults};
use super::store::{self, RawStore};
use super::units::{micros, parse_duration, valid_name};
use super::{
    callers, intercept, settings, CallerPolicy, Config, ConfigError, LogConfig, QuotaSync, RuleHttp, Server,
    TokensConfig,
};
use crate::config::routes::{Pattern, Routes};
use crate::limit::calendar::Period;
use crate::limit::penalty::PenaltyPolicy;
use crate::limit::{Limit, Rule, Scope};

const DEFAULT_LEASE: Duration = Duration::from_secs(30);

impl Config {
    /// Reads, parses and validates a config file.
    /// The memory store's default `state_file` is in the file's directory.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        Config::load_with_env(path, &|name| std::env::var(name).ok())
    }

    /// [`Config::load`] reading `secret_env` variables from `env` (`wxgate
    /// try` puts its demo account's secret over the process's environment).
    pub fn load_with_env(path: &Path, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: path.to_path_buf(),
            line: None,
            table: None,
            field: None,
            message: format!("cannot read: {e}"),
        })?;
        let dir = path.parent().unwrap_or(Path::new(""));
        Config::compile_text(&text, path, Some(dir), env)
    }

    /// Parses and validates config text; `path` only labels the messages.
    /// Text that is not read from a file has no directory, so the memory
    /// store keeps no state file unless `state_file` names one.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        Config::compile_text(text, path, None, &|name| std::env::var(name).ok())
    }

    /// The rule (or, for `scope = "path"`, the rule's variant for this API)
    /// a request path counts against; `None`: forwarded unthrottled.
    /// Domain 0's ([`Config::rule_in`] for the others).
    pub fn rule_for(&self, path: &str) -> Option<&Arc<Rule>> {
        self.rule_in(0, path)
    }

    /// The states of the rule named `name`: the rule itself, or its
    /// per-path variants (`scope = "path"`), in the order of its patterns.
    pub fn states_of<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Arc<Rule>> + 'a {
        self.routed.iter().filter(move |r| &*r.name == name)
    }

    /// The state named `state` as the stores key it: a routed state, or a
    /// `scope = "app"` rule's state for one app (`message_send@1000002`);
    /// `None` for a state no rule of this config has (a reload removed it).
    pub fn state_named(&self, state: &str) -> Option<Arc<Rule>> {
        if let Some(routed) = self.routed.iter().find(|r| *r.state == *state) {
            return Some(routed.clone());
        }
        let (base, app) = state.rsplit_once('@')?;
        let routed = self.routed.iter().find(|r| *r.state == *base && r.scope == Scope::App)?;
        Some(Arc::new(routed.for_app(app)))
    }

    fn compile_text(
        text: &str,
        path: &Path,
        dir: Option<&Path>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let ctx = Ctx { text, path, dir, env };
        let de = toml::Deserializer::parse(text).map_err(|e| ctx.toml_error(&e))?;
        let raw: RawConfig = serde_path_to_error::deserialize(de)
            .map_err(|e| sim_file(&ctx).unwrap_or_else(|| ctx.serde_error(&[], &e)))?;
        compile(raw, &ctx)
    }
}

/// The top-level keys of `wxgate sim`'s file (`[sim]`, `[[api]]`), which
/// wxgate's config has none of.
const SIM_KEYS: [&str; 2] = ["sim", "api"];

/// A `wxgate sim` file given as wxgate's config (every top-level key the
/// simulator's, such as deploy/sim.toml): said in those words, with the
/// command that reads it, instead of `api: unknown key`.
fn sim_file(ctx: &Ctx<'_>) -> Option<ConfigError> {
    let table: toml::Table = ctx.text.parse().ok()?;
    let sim = !table.is_empty() && table.keys().all(|k| SIM_KEYS.contains(&k.as_str()));
    sim.then(|| {
        ctx.plain(format!(
            "this is a `wxgate sim` file (the simulated WeChat's [sim] and [[api]]), not wxgate's config: run \
             `wxgate sim --config {}`",
            ctx.path.display()
        ))
    })
}

fn compile(mut raw: RawConfig, ctx: &Ctx<'_>) -> Result<Config, ConfigError> {
    let all_shadow = match raw.server.mode.as_deref() {
        None | Some("enforce") => false,
        Some("shadow") => true,
        Some(other) => {
            return Err(ctx.in_table(Invalid::at(
                "[server]",
                "mode",
                format!("\"{other}\" is unknown (expected \"enforce\" or \"shadow\")"),
            )))
        }
    };
    let log = compile_log(&raw.log).map_err(|e| ctx.in_table(e))?;
    let server_domain = raw.server.domain.take();
    let server = settings::server(raw.server, ctx.dir).map_err(|e| ctx.in_table(e))?;
    let store = RawStore::read(raw.store, ctx)?;
    let lease = match store.lease() {
        None => DEFAULT_LEASE,
        Some(t) => parse_duration(t).map_err(|e| ctx.in_table(e.field("lease").table("[store]")))?,
    };
    if lease < Duration::from_secs(1) {
        return Err(ctx.in_table(Invalid::at("[store]", "lease", "must be at least 1s")));
    }
    let store = store::compile(store, ctx.dir).map_err(|e| ctx.in_table(e))?;
    let mut warnings = Vec::new();
    // The instances count each other from heartbeats in Redis, but one that
    // starts while Redis is away hears none: `instances` is its floor.
    if let super::StoreConfig::Redis(r) = &store {
        if r.resilience.fallback == super::Fallback::Local && !r.resilience.instances_given {
            warnings.push(ctx.plain(Invalid::at(
                "[store]",
                "instances",
                "not set: an instance that starts while Redis is away hears no other instance and decides with                  the whole of every limit (fallback = \"local\"), each of them; set it to the most instances you \
                 run (replicas, an HPA's maxReplicas), or 1 if this is the only one",
            )));
        }
    }
    // `rules = "..."`: the rules and penalties are that file's, and its
    // errors are named in it.
    let (included, rules_from) =
        match super::domain::include(raw.rules.as_ref(), (&raw.rule, raw.penalty.as_ref()), ctx, &mut warnings)? {
            Some((file, parsed)) => (Some(file), Some(parsed)),
            None => (None, None),
        };
    let included_ctx = included.as_ref().map(|i| i.ctx(ctx.env));
    let rules_ctx = included_ctx.as_ref().unwrap_or(ctx);
    let (own_rules, own_penalties) = match rules_from {
        Some(file) => (file.rule, file.penalty),
        None => (std::mem::take(&mut raw.rule), raw.penalty.take()),
    };
    let penalties = match own_penalties {
        None => PenaltyPolicy::defaults(),
        Some(list) => super::penalty::compile(list, rules_ctx)?,
    };
    let tokens = compile_tokens(&raw.tokens, ctx.dir).map_err(|e| ctx.in_table(e))?;
    let (redis, state_dir) = match &store {
        super::StoreConfig::Redis(_) => (true, None),
        super::StoreConfig::Memory(m) => (false, m.state_file.as_deref().and_then(|f| f.parent())),
    };
    let queue = super::queue::compile(std::mem::take(&mut raw.queue), redis, state_dir, ctx.dir)
        .map_err(|e| ctx.in_table(e))?;
    let directory = super::directory::compile(std::mem::take(&mut raw.directory)).map_err(|e| ctx.in_table(e))?;
    let mut rules = Rules::new();
    let own = super::domain::Own {
        host: super::domain::own_host(server_domain.as_deref(), &server.upstream).map_err(|e| ctx.in_table(e))?,
        rules_file: included.as_ref().map(|i| i.file.clone()),
        routes: rules.add(own_rules, 0, None, (all_shadow, &server), rules_ctx)?,
        rules: 0..rules.rules.len(),
        server: &server,
        penalties: &penalties,
    };
    let domains = super::domain::compile(raw.domain, own, ctx, &mut warnings, &mut |raw, i, name, file_ctx| {
        let first = rules.rules.len();
        let routes = rules.add(raw, i, Some(name), (all_shadow, &server), file_ctx)?;
        Ok((routes, first..rules.rules.len()))
    })?;
    let caller_spans: Vec<Range<usize>> = raw.caller.iter().map(|c| c.span()).collect();
    let callers = callers::compile(raw.caller, ctx.dir).map_err(|(span, e)| ctx.at(span, e))?;
    check_caller_auth(&server, &callers, caller_spans, ctx)?;
    let with_callbacks = callers.iter().find(|c| !c.callbacks.is_empty()).map(|c| &*c.name);
    super::queue::check_callbacks(&queue, with_callbacks).map_err(|e| ctx.in_table(e))?;
    let intercept = intercept::compile(raw.intercept, ctx.dir, &domains).map_err(|e| ctx.in_table(e))?;
    let telemetry =
        super::telemetry::compile(std::mem::take(&mut raw.telemetry), ctx.dir, &|name| std::env::var(name).ok())
            .map_err(|e| ctx.in_table(e))?;
    let account_spans: Vec<Range<usize>> = raw.account.iter().map(|a| a.span()).collect();
    let accounts = super::accounts::compile(raw.account, ctx.dir, ctx.env, &|at| ctx.line_of(at))
        .map_err(|(span, e)| ctx.at(span, e))?;
    check_accounts(&server, &accounts, account_spans, ctx)?;
    // A window whose burst is more than half its count: after the burst it
    // sustains only (count - burst + 1) per window (`burst = count`: one),
    // which looks like a refusal bug to whoever tries it.
    for rule in &rules.rules {
        let windows = rule.limits.iter().filter_map(|l| match l {
            crate::limit::Limit::Window(w) => Some(("limits", w)),
            crate::limit::Limit::Calendar { .. } => None,
        });
        for (field, w) in windows.chain(rule.per_recipient.iter().map(|w| ("per_recipient", w))) {
            if w.burst() > 1 && 2 * w.burst() > w.count() {
                warnings.push(ctx.plain(Invalid::at(&format!("[[rule]] \"{}\"", rule.name), field, burst_trap(w))));
            }
        }
    }
    // Rules that queue calls when no call can be queued: a queued message
    // is kept in the jobs store and sent with an [[account]]'s own token.
    let queueing: Vec<&str> = rules
        .rules
        .iter()
        .zip(&rules.http)
        .filter(|(_, http)| http.queue.is_some())
        .map(|(rule, _)| &*rule.name)
        .collect();
    let why = match (&queue.at, accounts.list.iter().any(|a| a.injects())) {
        (super::queue::JobsAt::Off, _) => {
            Some("there is no jobs store ([queue] file = \"off\", or state_file = \"off\" and no [queue] file)")
        }
        (_, false) => Some("no [[account]] is configured (a queued message is sent with the account's own token)"),
        _ => None,
    };
    if let (Some(first), Some(why)) = (queueing.first(), why) {
        warnings.push(ctx.plain(Invalid::at(
            &format!("[[rule]] \"{first}\""),
            "queue",
            format!(
                "{} rule(s) queue calls (queue = true: {}), but no call can be queued: {why}; Prefer: \
                 respond-async gets 400 (README, \"Queued delivery\")",
                queueing.len(),
                queueing.join(", ")
            ),
        )));
    }
    // A rule resolving broadcasts through WeCom's directory reads it with
    // an app's own token: without any WeCom [[account]], every broadcast
    // of it is refused (or charged `unseen_cost`).
    let wecom_apps = accounts.list.iter().any(|a| a.kind == super::accounts::AccountKind::WeCom);
    for (rule, http) in rules.rules.iter().zip(&rules.http) {
        if let (Some(m), false) = (http.recipients.as_ref().filter(|m| m.directory), wecom_apps) {
            let what = match m.unseen_cost {
                Some(c) => format!("charged unseen_cost = {c} instead of their members"),
                None => "refused".to_owned(),
            };
            warnings.push(ctx.plain(Invalid::at(
                &format!("[[rule]] \"{}\"", rule.name),
                "recipients.directory",
                format!(
                    "reads WeCom's directory with an app's own token, and no [[account]] kind = \"wecom\" is \
                     configured: its broadcasts (@all, toparty, totag) will be {what}; add the app as an \
                     [[account]] (docs/recipients.md, \"Broadcasts\")"
                ),
            )));
        }
    }
    let overrides = super::overrides::compile(
        raw.quota,
        super::overrides::Known {
            server: &server,
            rules: &rules.rules,
            routed: &rules.routed,
            quota_syncs: &rules.quota_syncs,
        },
        &mut rules.http,
        ctx,
    )?;
    let unruled_http = RuleHttp {
        throttle_status: server.throttle_status,
        policy: Default::default(),
        recipients: None,
        queue: None,
        queue_strict: false,
    };
    let max_warmup_us = rules.rules.iter().map(|r| r.warmup_us).max().unwrap_or(0);
    Ok(Config {
        source: ctx.path.to_path_buf(),
        rules_http: rules.http,
        unruled_http,
        server,
        store,
        penalties,
        rules: rules.rules,
        routed: rules.routed,
        domains,
        lease_us: micros(lease),
        max_warmup_us,
        log,
        callers,
        tokens,
        queue,
        directory,
        quota_syncs: rules.quota_syncs,
        intercept,
        telemetry,
        accounts,
        overrides,
        warnings,
    })
}

/// Every `[[rule]]` of every domain, and what calls find them by.
struct Rules {
    rules: Vec<Arc<Rule>>,
    routed: Vec<Arc<Rule>>,
    http: Vec<RuleHttp>,
    quota_syncs: Vec<QuotaSync>,
}

impl Rules {
    fn new() -> Rules {
        Rules { rules: Vec::new(), routed: Vec::new(), http: Vec::new(), quota_syncs: Vec::new() }
    }

    /// Adds one domain's rules (`domain`: its index; `prefix`: its name,
    /// put before each rule's name with a dot, for a `[[domain]]`'s file)
    /// and returns the domain's routes. Ids and states continue from the
    /// domains before, so every rule of the config has its own.
    fn add(
        &mut self,
        raw: Vec<Spanned<RawRule>>,
        domain: usize,
        prefix: Option<&str>,
        defaults: (bool, &Server),
        ctx: &Ctx<'_>,
    ) -> Result<Routes, ConfigError> {
        let (all_shadow, server) = defaults;
        let first_rule = self.rules.len();
        let mut names = HashSet::new();
        let mut spans = Vec::with_capacity(raw.len());
        let mut patterns: Vec<(Pattern, usize)> = Vec::new();
        let mut default = None;
        for r in raw {
            let span = r.span();
            spans.push(span.clone());
            let r = r.into_inner();
            let table = format!("rule \"{}\"", r.name);
            if !valid_name(&r.name) {
                let e = Invalid::new(format!("rule name \"{}\" must be 1-64 of [A-Za-z0-9_-]", r.name));
                return Err(ctx.at_field(span, "name", e));
            }
            if !names.insert(r.name.clone()) {
                return Err(ctx.at_field(span, "name", Invalid::new("another rule has the same name").table(table)));
            }
            if r.name == "default" {
                default = Some(self.routed.len());
            }
            let sync = r.quota_sync.clone();
            let (rule, http, own) = compile_rule(
                r,
                self.rules.len(),
                span.clone(),
                RuleDefaults {
                    all_shadow,
                    throttle_status: server.throttle_status,
                    margin_us: server.window_margin_us,
                    prefix,
                },
                ctx,
            )?;
            self.http.push(http);
            let rule = Arc::new(rule);
            let sync = match sync {
                None => None,
                Some(text) => Some((
                    quota_sync(&text, &rule, &own)
                        .map_err(|e| ctx.at_field(span.clone(), "quota_sync", e.field("quota_sync").table(table)))?,
                    first_exact(&own),
                )),
            };
            self.route(&rule, own, &mut patterns, sync, domain);
            self.rules.push(rule);
        }
        Routes::new(patterns, default).map_err(|(p, a, b)| {
            let (a, b) = (&self.routed[a].name, &self.routed[b].name);
            let b_index = self.rules[first_rule..].iter().position(|r| r.name == *b).unwrap_or(0);
            let e = format!("rules \"{a}\" and \"{b}\" both claim the path pattern \"{p}\"");
            ctx.at_field(spans[b_index].clone(), "match", e)
        })
    }

    /// The states `rule` is routed to (itself, or its per-path variants)
    /// for its patterns `own`, and its quota syncs (every `sync`, and the
    /// path of a `scope = "rule"` rule's).
    fn route(
        &mut self,
        rule: &Arc<Rule>,
        own: Vec<Pattern>,
        patterns: &mut Vec<(Pattern, usize)>,
        sync: Option<(Duration, Option<String>)>,
        domain: usize,
    ) {
        let first_state = self.routed.len();
        match rule.scope {
            // A `scope = "app"` rule's per-app states are made per call
            // ([`Rule::for_app`]): it is routed as one.
            Scope::Rule | Scope::App => {
                patterns.extend(own.into_iter().map(|p| (p, self.routed.len())));
                self.routed.push(rule.clone());
            }
            Scope::Path => {
                for p in own {
                    let Pattern::Exact(path) = &p else { continue };
                    let path: Arc<str> = path.as_str().into();
                    let state = format!("{}{path}", rule.name).into();
                    patterns.push((p, self.routed.len()));
                    self.routed.push(Arc::new(Rule { state, path: Some(path), ..(**rule).clone() }));
                }
            }
        }
        let Some((every, first)) = sync else { return };
        match rule.scope {
            Scope::Rule | Scope::App => {
                self.quota_syncs.extend(first.map(|path| QuotaSync { rule: rule.clone(), path, every, domain }));
            }
            Scope::Path => self.quota_syncs.extend(self.routed[first_state..].iter().filter_map(|v| {
                let path = v.path.as_deref().filter(|p| !p.starts_with("/sns/"))?;
                Some(QuotaSync { rule: v.clone(), path: path.to_owned(), every, domain })
            })),
        }
    }
}

/// `caller_auth = "required"` needs callers, each with a key and accounts.
fn check_caller_auth(
    server: &Server,
    callers: &[Arc<CallerPolicy>],
    spans: Vec<Range<usize>>,
    ctx: &Ctx<'_>,
) -> Result<(), ConfigError> {
    if !server.caller_auth.required() {
        return Ok(());
    }
    if callers.is_empty() {
        return Err(ctx.in_table(Invalid::at(
            "[server]",
            "caller_auth",
            "\"required\" needs at least one [[caller]] with a key and its accounts",
        )));
    }
    for (c, span) in callers.iter().zip(spans) {
        let missing = match (c.key.is_some(), c.grants != crate::config::Grants::Unset) {
            (true, true) => continue,
            (false, _) => "a key (key_sha256 or key_file)",
            (true, false) => "accounts (the accounts it may spend, or [\"*\"])",
        };
        let e = Invalid::new(format!("caller_auth = \"required\" needs {missing}"));
        return Err(ctx.at(span, e.table(format!("caller \"{}\"", c.name))));
    }
    Ok(())
}

/// An `[[account]]` gets wxgate's token only where callers are known, and
/// only when `[server] accounts` (if given) lists it.
fn check_accounts(
    server: &Server,
    accounts: &SecretAccounts,
    spans: Vec<Range<usize>>,
    ctx: &Ctx<'_>,
) -> Result<(), ConfigError> {
    for (a, span) in accounts.list.iter().zip(spans) {
        if !server.caller_auth.required() && !server.listen.ip().is_loopback() {
            let e = Invalid::new(format!(
                "wxgate adds its token to calls that carry none, and listen {} is beyond loopback with caller_auth \
                 off, so any service that reaches it could spend the account: set [server] caller_auth = \
                 \"required\" and grant the account to its callers",
                server.listen
            ));
            return Err(ctx.at(span, e.table(format!("[[account]] \"{}\"", a.name))));
        }
        if server.accounts.as_ref().is_some_and(|list| !list.contains(&*a.name)) {
            return Err(ctx.at(span, format!("[[account]] \"{}\" is not on [server] accounts", a.name)));
        }
    }
    Ok(())
}

/// Shortest `quota_sync`: each sync is a WeChat call (quota/get has its
/// own limits).
const MIN_QUOTA_SYNC: Duration = Duration::from_secs(1);

/// A rule's `quota_sync` checked: a duration of at least 1s, on a rule
/// with a day quota and an exact path quota/get can answer for.
fn quota_sync(text: &str, rule: &Rule, patterns: &[Pattern]) -> Result<Duration, Invalid> {
    let every = parse_duration(text)?;
    if every < MIN_QUOTA_SYNC {
        return Err(Invalid::new(format!(
            "\"{text}\" is shorter than 1s (each sync is a call to WeChat; \"10m\" is typical)"
        )));
    }
    if !rule.limits.iter().any(|l| matches!(l, Limit::Calendar { period: Period::Day, .. })) {
        return Err(Invalid::new("the rule has no per = \"day\" limit to keep in step with WeChat's count"));
    }
    match patterns.iter().find(|p| matches!(p, Pattern::Exact(_))) {
        None => Err(Invalid::new("needs an exact path in match (quota/get answers for one API path, not a prefix)")),
        Some(Pattern::Exact(path)) if path.starts_with("/sns/") => {
            Err(Invalid::new(format!("\"{path}\": WeChat's quota/get does not answer for /sns/ APIs (76022)")))
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
fn compile_tokens(raw: &RawTokens, dir: Option<&Path>) -> Result<TokensConfig, Invalid> {
    let defaults = TokensConfig::default();
    let min_ttl = match raw.min_ttl.as_deref() {
        None => defaults.min_ttl,
        Some(t) => parse_duration(t).map_err(|e| e.field("min_ttl").table("[tokens]"))?,
    };
    if min_ttl >= Duration::from_secs(7200) {
        return Err(Invalid::at("[tokens]", "min_ttl", "must be shorter than a token's 2 hours"));
    }
    let wait = match raw.wait.as_deref() {
        None => defaults.wait,
        Some(t) => parse_duration(t).map_err(|e| e.field("wait").table("[tokens]"))?,
    };
    if wait < Duration::from_secs(1) || wait > Duration::from_secs(120) {
        return Err(Invalid::at("[tokens]", "wait", "must be between 1s and 2m"));
    }
    let key_file = raw.key_file.as_deref().map(|f| super::units::beside_config(dir, f));
    Ok(TokensConfig { cache: raw.cache, min_ttl, wait, key_file })
}

fn compile_log(raw: &RawLog) -> Result<LogConfig, Invalid> {
    let json = match raw.format.as_deref() {
        None | Some("text") => false,
        Some("json") => true,
        Some(other) => {
            return Err(Invalid::at(
                "[log]",
                "format",
                format!("\"{other}\" is unknown (expected \"text\" or \"json\")"),
            ))
        }
    };
    Ok(LogConfig { json, access: raw.access.unwrap_or(true) })
}

/// What a window whose burst is more than half its count does after its
/// burst: `5 per 1m with burst 5 sustains 1 per 1m after its burst`.
fn burst_trap(w: &crate::limit::WindowLimit) -> String {
    let per = humantime::format_duration(std::time::Duration::from_micros(w.per_us().max(0) as u64));
    let sustained = w.count() - w.burst() + 1;
    format!(
        "{} per {per} with burst {} sustains {sustained} per {per} after its burst (count - burst + 1): a burst of \
         at most half the count sustains at least half of it (docs/semantics.md)",
        w.count(),
        w.burst()
    )
}
