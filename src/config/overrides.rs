//! `[[quota]]` as the file says it, read and checked: compiled into
//! [`Overrides`] (what they mean: [`super::quota`]).

use std::collections::HashMap;
use std::sync::Arc;

use serde::Deserialize;
use toml::Spanned;

use super::errors::{ConfigError, Ctx, Invalid};
use super::quota::{Listed, Overrides, MAX_OVERRIDES};
use super::ratelimit::Policy;
use super::rule::{limits, At, RawLimit};
use super::units::valid_name;
use super::{QuotaSync, RuleHttp, Server};
use crate::limit::calendar::Period;
use crate::limit::{Limit, Rule};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawQuota {
    pub account: Option<String>,
    pub accounts: Option<Vec<String>>,
    pub rule: String,
    #[serde(default)]
    pub limits: Vec<Spanned<RawLimit>>,
}

/// What compiling the overrides reads of the rest of the config.
pub(super) struct Known<'a> {
    pub server: &'a Server,
    pub rules: &'a [Arc<Rule>],
    pub routed: &'a [Arc<Rule>],
    pub quota_syncs: &'a [QuotaSync],
}

/// Compiles `[[quota]]`: every check with the block's line; adds to `http`
/// the HTTP side of each overriding variant (its `RateLimit-Policy` names
/// the account's limits), which the variants' [`Rule::id`]s point at.
pub(super) fn compile(
    raw: Vec<Spanned<RawQuota>>,
    known: Known<'_>,
    http: &mut Vec<RuleHttp>,
    ctx: &Ctx<'_>,
) -> Result<Overrides, ConfigError> {
    let mut overrides = Overrides::default();
    let mut by_account: HashMap<Arc<str>, Vec<Arc<Rule>>> = HashMap::new();
    // (account, rule) → the line of the override that set it.
    let mut seen: HashMap<(Arc<str>, Arc<str>), usize> = HashMap::new();
    for q in raw {
        let span = q.span();
        let line = ctx.line_of(span.start);
        let q = q.into_inner();
        let at = At { ctx, span: span.clone(), table: "[[quota]]".to_owned() };
        let field = |key: &str, message: String| at.rule(Invalid::at_field(key, message));
        let Some(rule) = known.rules.iter().find(|r| *r.name == q.rule) else {
            let names: Vec<&str> = known.rules.iter().take(20).map(|r| &*r.name).collect();
            return Err(field("rule", format!("no rule named \"{}\" (rules: {})", q.rule, names.join(", "))));
        };
        let accounts: Vec<String> = match (q.account, q.accounts) {
            (Some(a), None) => vec![a],
            (None, Some(list)) if !list.is_empty() => list,
            (None, Some(_)) => return Err(field("accounts", "lists no account".into())),
            (None, None) => {
                return Err(
                    at.rule(Invalid::new("needs account = \"...\" or accounts = [...] (whose limits these are)"))
                )
            }
            (Some(_), Some(_)) => {
                return Err(field("accounts", "give account or accounts, not both".into()));
            }
        };
        let key = if accounts.len() == 1 { "account" } else { "accounts" };
        for a in &accounts {
            if !valid_name(a) {
                return Err(field(key, format!("account \"{a}\" must be 1-64 of [A-Za-z0-9_-]")));
            }
            if known.server.accounts.as_ref().is_some_and(|list| !list.contains(a)) {
                return Err(field(
                    key,
                    format!("account \"{a}\" is not on [server] accounts (its calls are refused: nothing to override)"),
                ));
            }
        }
        if q.limits.is_empty() {
            return Err(field(
                "limits",
                format!(
                    "needs at least one limit (the account's own limits for rule \"{}\"; an override cannot take \
                     an account's limits away)",
                    rule.name
                ),
            ));
        }
        let limits = limits(&q.limits, "limits", known.server.window_margin_us, &at)?;
        if known.quota_syncs.iter().any(|s| s.rule.name == rule.name)
            && !limits.iter().any(|l| matches!(l, Limit::Calendar { period: Period::Day, .. }))
        {
            return Err(field(
                "limits",
                format!(
                    "rule \"{}\" has quota_sync, which keeps a day count: give the account a per = \"day\" limit",
                    rule.name
                ),
            ));
        }
        let id = http.len();
        let base_http = http.get(rule.id).cloned();
        let mut policy_of = None;
        for a in accounts {
            let account: Arc<str> = a.into();
            if let Some(first) = seen.insert((account.clone(), rule.name.clone()), line) {
                return Err(field(
                    key,
                    format!("account \"{account}\" already has an override of rule \"{}\" (line {first})", rule.name),
                ));
            }
            if seen.len() > MAX_OVERRIDES {
                return Err(field(
                    key,
                    format!(
                        "more than {MAX_OVERRIDES} (account, rule) overrides: keep the file to the accounts whose \
                         quota differs, and let quota_sync learn the rest"
                    ),
                ));
            }
            // The rule, or each of its per-path variants, for this account.
            let own = by_account.entry(account.clone()).or_default();
            for state in known.routed.iter().filter(|r| r.name == rule.name) {
                let variant =
                    state.overridden(account.clone(), limits.clone()).map_err(|e| field("limits", e.to_string()))?;
                let variant = Rule { id, ..variant };
                policy_of.get_or_insert_with(|| Policy::of(&variant));
                own.push(Arc::new(variant));
            }
            overrides.listed.push(Listed { account, rule: rule.name.clone(), limits: limits.clone(), line });
        }
        if let (Some(base), Some(policy)) = (base_http, policy_of) {
            http.push(RuleHttp { policy, ..base });
        }
    }
    overrides.by_account.extend(by_account.into_iter().map(|(a, v)| (a, v.into_boxed_slice())));
    Ok(overrides)
}
