//! `[server] domain` and `[[domain]]`: compiled into [`Domain`]s. A call's
//! WeChat domain (the Official Account host `api.weixin.qq.com`, WeCom's
//! `qyapi.weixin.qq.com`) picks the rules it counts by and the upstreams it
//! goes to, so that one instance serves both: WeChat meters each domain's
//! APIs apart, and the same path (`/cgi-bin/user/get`) is another API with
//! another quota on each.
//!
//! Domain 0 is the file's own: its `[[rule]]`s, `[server] upstream`, and
//! `[server] domain` as its host. Each `[[domain]]` takes the `[[rule]]`s
//! of another file (`rules`, e.g. the shipped `deploy/rules-wecom.toml`),
//! its errors named in that file, and names them `<name>.<rule>`; the rest
//! of that file (`[server]`, `[store]`, ...) is for running it alone, and
//! its `[[penalty]]`s must be this file's (penalties are per errcode, for
//! every domain): a difference is a warning.
//!
//! The file's own rules may be another file's too: `rules = "rules.toml"`
//! ([`include`]) reads that file's `[[rule]]`s and `[[penalty]]`s as this
//! file's own, and nothing else of it, so that deployment configs (a
//! `[server]` and a `[store]` of their own) share the shipped rules.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use toml::Spanned;

use super::errors::{Ctx, Invalid};
use super::raw::{RawDomain, RawPenalty, RawRulesFile};
use super::routes::Routes;
use super::rule::RawRule;
use super::settings::upstreams;
use super::units::{beside_config, valid_name};
use super::{ConfigError, Domain, Server, Upstreams};
use crate::limit::penalty::PenaltyPolicy;

/// The domain of rules that do not say (`[server] domain`'s default).
pub const DEFAULT_DOMAIN: &str = "api.weixin.qq.com";

/// WeChat's API hosts, each with the domain it serves (WECHAT.md, from the
/// Official Account docs' 接口域名说明): the general host, its
/// disaster-recovery twin and the regional ones are one domain (one quota);
/// WeCom's is another.
pub const WECHAT_HOSTS: [(&str, &str); 6] = [
    ("api.weixin.qq.com", DEFAULT_DOMAIN),
    ("api2.weixin.qq.com", DEFAULT_DOMAIN),
    ("sh.api.weixin.qq.com", DEFAULT_DOMAIN),
    ("sz.api.weixin.qq.com", DEFAULT_DOMAIN),
    ("hk.api.weixin.qq.com", DEFAULT_DOMAIN),
    ("qyapi.weixin.qq.com", "qyapi.weixin.qq.com"),
];

/// The domain a WeChat host is part of ([`WECHAT_HOSTS`]); `None` for a
/// host that is not WeChat's.
pub fn family(host: &str) -> Option<&'static str> {
    WECHAT_HOSTS.iter().find(|(h, _)| *h == host).map(|(_, d)| *d)
}

/// A lower-case DNS name with at least two labels: letters, digits, `-`.
pub fn valid_host(h: &str) -> bool {
    h.len() <= 253
        && h.contains('.')
        && h.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
}

/// `[server] domain`; by default the WeChat domain of `[server] upstream`'s
/// first host (`https://qyapi.weixin.qq.com`: WeCom's), else
/// [`DEFAULT_DOMAIN`] (a mock, a private mirror).
pub(super) fn own_host(raw: Option<&str>, upstream: &Upstreams) -> Result<Arc<str>, Invalid> {
    let inferred = upstream.iter().next().and_then(|u| u.host()).and_then(family);
    let host = raw.or(inferred).unwrap_or(DEFAULT_DOMAIN);
    if !valid_host(host) {
        return Err(Invalid::at(
            "[server]",
            "domain",
            format!("\"{host}\" is not a host name (such as \"{DEFAULT_DOMAIN}\" or \"qyapi.weixin.qq.com\")"),
        ));
    }
    Ok(host.into())
}

/// Compiles one domain's rules file into the config's rules (the closure
/// adds them and returns the domain's routes).
pub(super) type AddRules<'a> =
    dyn FnMut(Vec<Spanned<RawRule>>, usize, &str, &Ctx<'_>) -> Result<(Routes, Range<usize>), ConfigError> + 'a;

/// The file's own domain (domain 0).
pub(super) struct Own<'a> {
    pub host: Arc<str>,
    /// `rules`: the file its rules are from (`None`: the config itself).
    pub rules_file: Option<PathBuf>,
    pub routes: Routes,
    pub rules: Range<usize>,
    pub server: &'a Server,
    pub penalties: &'a [PenaltyPolicy],
}

/// Every domain: the file's own, then each `[[domain]]` in file order; a
/// `[[domain]]` whose file's penalties differ from the config's adds a
/// warning.
pub(super) fn compile(
    raw: Vec<Spanned<RawDomain>>,
    own: Own<'_>,
    ctx: &Ctx<'_>,
    warnings: &mut Vec<ConfigError>,
    add: &mut AddRules<'_>,
) -> Result<Vec<Domain>, ConfigError> {
    let own_name = first_label(&own.host);
    let mut domains = vec![Domain {
        name: own_name.into(),
        host: own.host,
        upstream: own.server.upstream.clone(),
        routes: own.routes,
        rules_file: own.rules_file,
        rules: own.rules,
    }];
    for (i, d) in raw.into_iter().enumerate() {
        let span = d.span();
        let d = d.into_inner();
        let table = format!("[[domain]] \"{}\"", d.host);
        let at = |field: &str, e: Invalid| ctx.at_field(span.clone(), field, e.table(table.clone()));
        let host = d.host.to_ascii_lowercase();
        if !valid_host(&host) {
            let e = Invalid::new(format!("\"{}\" is not a host name (such as \"qyapi.weixin.qq.com\")", d.host));
            return Err(at("host", e.field("host")));
        }
        if let Some(other) = domains.iter().find(|o| o.host.as_ref() == host || same_family(&o.host, &host)) {
            let e = if other.host.as_ref() == host {
                format!("another domain is {host} already")
            } else {
                format!(
                    "{host} serves the same WeChat domain as {} (one quota): list it in that domain's upstream instead",
                    other.host
                )
            };
            return Err(at("host", Invalid::new(e).field("host")));
        }
        let name = d.name.clone().unwrap_or_else(|| first_label(&host).to_owned());
        if !valid_name(&name) {
            return Err(at("name", Invalid::new(format!("\"{name}\" must be 1-64 of [A-Za-z0-9_-]")).field("name")));
        }
        if domains.iter().any(|o| *o.name == *name) {
            let e = Invalid::new(format!(
                "\"{name}\" is another domain's name already: set `name` to tell them apart in rule names"
            ));
            return Err(at("name", e.field("name")));
        }
        let upstream = match &d.upstream {
            Some(raw) => upstreams(Some(raw), &table, &format!("https://{host}"))
                .map_err(|e| ctx.at_field(span.clone(), "upstream", e))?,
            None => upstreams(None, &table, &format!("https://{host}")).map_err(|e| at("upstream", e))?,
        };
        let file = beside_config(ctx.dir, &d.rules);
        let text = std::fs::read_to_string(&file)
            .map_err(|e| at("rules", Invalid::new(format!("cannot read {}: {e}", file.display())).field("rules")))?;
        let file_ctx = Ctx { text: &text, path: &file, dir: file.parent(), env: ctx.env };
        let rules_file = read_rules_file(&file_ctx)?;
        if rules_file.domain.is_some() {
            let e = Invalid::new(format!("{} has [[domain]] tables of its own: domains do not nest", file.display()));
            return Err(at("rules", e.field("rules")));
        }
        if rules_file.rules.is_some() {
            return Err(at("rules", chained(&file).field("rules")));
        }
        if let Some(list) = rules_file.penalty {
            let theirs = super::penalty::compile(list, &file_ctx)?;
            if theirs != own.penalties {
                warnings.push(at(
                    "rules",
                    Invalid::new(format!(
                        "{}'s [[penalty]] differ from this file's; this file's apply to every domain",
                        file.display()
                    ))
                    .field("rules"),
                ));
            }
        }
        if rules_file.quota.is_some() {
            warnings.push(at(
                "rules",
                Invalid::new(format!(
                    "{}'s [[quota]] apply only when it runs alone: give this domain's accounts their own limits \
                     in this file, with rule = \"{name}.<rule>\"",
                    file.display()
                ))
                .field("rules"),
            ));
        }
        let (routes, rules) = add(rules_file.rule, i + 1, &name, &file_ctx)?;
        domains.push(Domain { name: name.into(), host: host.into(), upstream, routes, rules_file: Some(file), rules });
    }
    Ok(domains)
}

/// A config's `rules = "..."`: the file read, whose text the rules' errors
/// are named in.
pub(super) struct Included {
    pub file: PathBuf,
    pub text: String,
}

impl Included {
    pub(super) fn ctx<'a>(&'a self, env: &'a dyn Fn(&str) -> Option<String>) -> Ctx<'a> {
        Ctx { text: &self.text, path: &self.file, dir: self.file.parent(), env }
    }
}

/// `rules = "..."`: the file (relative to the config's directory) whose
/// `[[rule]]`s and `[[penalty]]`s are this config's. Only those are read:
/// its `[server]`, `[store]` and every other table are for running it
/// alone, so what it holds can never set who may call, which accounts
/// wxgate holds tokens for, or where it listens (a reload that edits it
/// changes rules and penalties only). Its `[[caller]]`s, `[[account]]`s,
/// `[[domain]]`s and `[[quota]]`s are named in a warning, since a reader
/// might expect them to apply. A config that has `[[rule]]`s or
/// `[[penalty]]`s of its own too is refused: one place says them.
pub(super) fn include(
    named: Option<&Spanned<PathBuf>>,
    own: (&[Spanned<RawRule>], Option<&Vec<Spanned<RawPenalty>>>),
    ctx: &Ctx<'_>,
    warnings: &mut Vec<ConfigError>,
) -> Result<Option<(Included, RawRulesFile)>, ConfigError> {
    let Some(named) = named else { return Ok(None) };
    let at = |e: Invalid| ctx.at(named.span(), e.field("rules"));
    let file = beside_config(ctx.dir, named.get_ref());
    let own = match (own.0.is_empty(), own.1.is_some()) {
        (true, false) => None,
        (false, _) => Some("[[rule]]"),
        (true, true) => Some("[[penalty]]"),
    };
    if let Some(own) = own {
        return Err(at(Invalid::new(format!(
            "this file has {own} tables of its own, and its rules and penalties are {}'s: say them in one place              (move them there, or delete `rules`)",
            file.display()
        ))));
    }
    let text =
        std::fs::read_to_string(&file).map_err(|e| at(Invalid::new(format!("cannot read {}: {e}", file.display()))))?;
    let included = Included { file, text };
    let parsed = read_rules_file(&included.ctx(ctx.env))?;
    if parsed.rules.is_some() {
        return Err(at(chained(&included.file)));
    }
    let ignored: Vec<&str> = [
        ("[[caller]]", parsed.caller.is_some()),
        ("[[account]]", parsed.account.is_some()),
        ("[[domain]]", parsed.domain.is_some()),
        ("[[quota]]", parsed.quota.is_some()),
    ]
    .into_iter()
    .filter_map(|(table, there)| there.then_some(table))
    .collect();
    if !ignored.is_empty() {
        warnings.push(at(Invalid::new(format!(
            "{}'s {} are not read: only its [[rule]]s and [[penalty]]s are this file's; give this file its own",
            included.file.display(),
            ignored.join(", ")
        ))));
    }
    Ok(Some((included, parsed)))
}

/// A rules file that takes its own rules from yet another: refused.
fn chained(file: &Path) -> Invalid {
    Invalid::new(format!(
        "{} takes its rules from another file (its own `rules = ...`): name that file here, rules files do not chain",
        file.display()
    ))
}

/// A rules file, its errors named in it.
fn read_rules_file(ctx: &Ctx<'_>) -> Result<RawRulesFile, ConfigError> {
    let de = toml::Deserializer::parse(ctx.text).map_err(|e| ctx.toml_error(&e))?;
    serde_path_to_error::deserialize(de).map_err(|e| ctx.serde_error(&[], &e))
}

fn first_label(host: &str) -> &str {
    host.split('.').next().unwrap_or(host)
}

/// Whether two hosts are WeChat hosts of one domain (`api` and `api2`).
fn same_family(a: &str, b: &str) -> bool {
    matches!((family(a), family(b)), (Some(x), Some(y)) if x == y)
}

impl super::Config {
    /// The domain whose host is `host` (a direct call's first path
    /// segment); `None`: no domain has it.
    pub fn domain_named(&self, host: &str) -> Option<usize> {
        self.domains.iter().position(|d| d.host.eq_ignore_ascii_case(host))
    }

    /// The domain an intercepted host's calls are for: the one whose host
    /// it is or whose WeChat domain it serves (`api2.weixin.qq.com` →
    /// `api.weixin.qq.com`'s); `None` for a WeChat host of no domain here.
    /// Another host (a test's, a private mirror's) is domain 0's.
    pub fn domain_of_host(&self, host: &str) -> Option<usize> {
        if let Some(i) = self.domain_named(host) {
            return Some(i);
        }
        match family(host) {
            Some(root) => self.domains.iter().position(|d| family(&d.host) == Some(root)),
            None => Some(0),
        }
    }

    /// The domain an `[[account]]` of `kind` calls (its token fetches): the
    /// one serving WeCom's host for a WeCom app, else the one serving the
    /// Official Account host; domain 0 when none does (a config for one
    /// domain, whatever its `[server] domain` says).
    pub fn domain_of_kind(&self, kind: super::accounts::AccountKind) -> usize {
        let host = match kind {
            super::accounts::AccountKind::WeCom => "qyapi.weixin.qq.com",
            _ => DEFAULT_DOMAIN,
        };
        self.domain_of_host(host).unwrap_or(0)
    }

    /// The rule (or per-path variant) a path of `domain` counts against.
    pub fn rule_in(&self, domain: usize, path: &str) -> Option<&Arc<crate::limit::Rule>> {
        let routes = &self.domains.get(domain)?.routes;
        routes.lookup(path).and_then(|i| self.routed.get(i))
    }

    /// Every domain's upstreams set to `http://<addr>` (`wxgate try`: the simulator).
    pub fn upstreams_at(&mut self, addr: std::net::SocketAddr) -> Result<(), http::uri::InvalidUri> {
        self.server.upstream_at(addr)?;
        for d in &mut self.domains {
            d.upstream = self.server.upstream.clone();
        }
        Ok(())
    }
}
