//! Who calls: a call's caller, its flood guard and its series.
//!
//! Several services often share one WeChat account; the caller says which
//! of them a call is from. It is the `X-Wx-Caller` header (1-64 of
//! `A-Z a-z 0-9 _ -`, given once; removed before forwarding: WeChat never
//! sees it), else `[server] caller` (a sidecar names its service once, in
//! its config), else `default`. A bad header is refused (400).
//!
//! Callers may be declared (`[[caller]]`, [`CallerPolicy`]): a priority and
//! an optional `rate`, the flood guard ([`guard`]) checked in this process
//! before any store work, so a caller that loops without back-off is
//! refused (429, reason `caller_rate`) at the cost of one atomic operation
//! and never a Redis round trip. Calls of undeclared callers have no guard,
//! normal priority, and one metrics label: `other`. Metrics are labelled by
//! declared names and `other` only, never by a header's free value.
//!
//! [`Callers`] is built from a config at start and again on each reload;
//! a reload keeps a guard's state when that caller's `rate` is unchanged.
//! Cost: one header lookup (which also takes the header off); a call
//! without the header clones the pre-built fallback caller (no allocation,
//! no name lookup); with it, one lookup among the declared names (none when
//! there are none), and one allocation for a name not declared. Its series
//! are fetched once per config: counting a call is one increment.

pub mod auth;
pub mod guard;

use std::collections::HashMap;
use std::sync::Arc;

use http::header::Entry as HeaderEntry;
use http::{HeaderMap, HeaderName, HeaderValue};

use self::guard::Guard;
use crate::config::{valid_account, CallerPolicy, Config, Grants, Priority};
use crate::error::ProxyError;
use crate::telemetry::metrics::{CallerMetrics, Metrics};
use crate::time::Clock;

/// Header naming the service a call is from.
pub const CALLER_HEADER: &str = "x-wx-caller";
pub const CALLER: HeaderName = HeaderName::from_static(CALLER_HEADER);
/// The caller of a call that names none, without `[server] caller`.
pub const DEFAULT_CALLER: &str = "default";
/// The metrics label of every caller not declared.
pub const OTHER: &str = "other";

/// What wxgate keeps for one declared caller, or for all undeclared ones.
pub struct Entry {
    /// `None`: the entry of undeclared callers.
    pub policy: Option<Arc<CallerPolicy>>,
    /// Its flood guard, when it has a `rate`.
    pub guard: Option<Arc<Guard>>,
    pub metrics: CallerMetrics,
}

impl Entry {
    /// The label of its series: the declared name, or `other`.
    pub fn label(&self) -> &str {
        self.policy.as_ref().map_or(OTHER, |p| &p.name)
    }
}

/// The caller of one call.
#[derive(Clone)]
pub struct Caller {
    /// As the call named it (or `[server] caller`, or `default`): for logs.
    pub name: Arc<str>,
    /// The declared caller of that name, or the entry of all undeclared ones.
    pub entry: Arc<Entry>,
}

impl auth::Named for Caller {
    fn name(&self) -> &str {
        &self.name
    }
}

impl Caller {
    /// Its declaration (`None`: not declared).
    pub fn policy(&self) -> Option<&CallerPolicy> {
        self.entry.policy.as_deref()
    }

    /// Its priority: declared, else normal.
    pub fn priority(&self) -> Priority {
        self.policy().map_or(Priority::Normal, |p| p.priority)
    }

    /// With `caller_auth = "required"`: 403 unless it is granted `account`
    /// (`[[caller]] accounts`), counted in its series.
    pub fn check_grant(&self, account: &str) -> Result<(), ProxyError> {
        match self.policy() {
            Some(p) if p.grants.allow(account) => Ok(()),
            Some(CallerPolicy { grants: Grants::Listed(list), .. }) if account == "default" && list.len() > 1 => {
                // The account of a call that names none (the accounts
                // feature's `DEFAULT_ACCOUNT`), for a caller granted several.
                self.entry.metrics.forbidden.inc();
                let first = list.first().map_or("account", |a| &**a);
                Err(ProxyError::Forbidden(format!(
                    "caller \"{}\" may not spend account \"default\", the account of a call that names none; it is \
                     granted {}: name one with the X-Wx-Account header or an @account path prefix \
                     (/@{first}/cgi-bin/...)",
                    self.name,
                    list.join(", ")
                )))
            }
            _ => {
                self.entry.metrics.forbidden.inc();
                Err(ProxyError::Forbidden(format!(
                    "caller \"{}\" may not spend account \"{account}\" (its [[caller]] accounts)",
                    self.name
                )))
            }
        }
    }

    /// Takes one call from its flood guard: the refusal (429, `caller_rate`,
    /// counted in `wxgate_caller_rate_refusals_total`) if it is over its
    /// `rate`. Always `Ok` without a guard.
    pub fn check(&self) -> Result<(), ProxyError> {
        let Some(guard) = &self.entry.guard else { return Ok(()) };
        guard.check().map_err(|wait_us| {
            self.entry.metrics.rate_refusals.inc();
            ProxyError::CallerRate { caller: self.name.clone(), rate: guard.rate, wait_us }
        })
    }
}

/// Takes `X-Wx-Caller` off a request's headers (so it never reaches
/// WeChat) with one lookup: its value, `None` without it, 400 if it is
/// given more than once.
pub fn take_header(headers: &mut HeaderMap) -> Result<Option<HeaderValue>, ProxyError> {
    let HeaderEntry::Occupied(given) = headers.entry(CALLER) else { return Ok(None) };
    let (_, mut values) = given.remove_entry_mult();
    let first = values.next();
    if values.next().is_some() {
        return Err(ProxyError::BadRequest("X-Wx-Caller is given more than once".into()));
    }
    Ok(first)
}

/// The callers of one config, with their guards and series.
pub struct Callers {
    /// `caller_auth = "required"`: callers by their key's digest, and the
    /// credentials each serving thread verified (one more for the rest).
    auth: Option<Auth>,
    /// Declared callers by name; empty when none are.
    declared: HashMap<Arc<str>, Caller>,
    /// Declared callers in file order (the admin API's list).
    order: Vec<Caller>,
    other: Arc<Entry>,
    /// The caller of calls without the header.
    fallback: Caller,
}

/// What `caller_auth = "required"` checks a credential against.
struct Auth {
    by_key: HashMap<crate::config::KeyDigest, Caller>,
    verified: Box<[auth::Verified<Caller>]>,
    shared: auth::Verified<Caller>,
}

impl Callers {
    /// The callers `config` declares, guards on `clock`, series in
    /// `metrics`. A caller of `previous` (the running config's) whose
    /// `rate` is unchanged keeps its guard, and so what it has counted.
    pub fn new(config: &Config, clock: &Arc<dyn Clock>, metrics: &Metrics, previous: Option<&Callers>) -> Callers {
        let mut declared = HashMap::with_capacity(config.callers.len());
        let mut order = Vec::with_capacity(config.callers.len());
        for policy in &config.callers {
            let kept = previous
                .and_then(|p| p.declared.get(&policy.name))
                .and_then(|c| c.entry.guard.as_ref())
                .filter(|g| Some(g.rate) == policy.rate);
            let guard = match (kept, policy.rate) {
                (Some(g), _) => Some(g.clone()),
                (None, Some(rate)) => Some(Arc::new(Guard::new(rate, clock.clone()))),
                (None, None) => None,
            };
            let entry = Entry { policy: Some(policy.clone()), guard, metrics: metrics.caller(&policy.name) };
            let caller = Caller { name: policy.name.clone(), entry: Arc::new(entry) };
            declared.insert(policy.name.clone(), caller.clone());
            order.push(caller);
        }
        let other = Arc::new(Entry { policy: None, guard: None, metrics: metrics.caller(OTHER) });
        let name: Arc<str> = config.server.caller.clone().unwrap_or_else(|| DEFAULT_CALLER.into());
        let fallback = match declared.get(&name) {
            Some(c) => c.clone(),
            None => Caller { name, entry: other.clone() },
        };
        let auth = config.server.caller_auth.required().then(|| Auth {
            by_key: order.iter().filter_map(|c| Some((c.policy()?.key?, c.clone()))).collect(),
            verified: (0..config.server.workers).map(|_| auth::Verified::default()).collect(),
            shared: auth::Verified::default(),
        });
        Callers { auth, declared, order, other, fallback }
    }

    /// With `caller_auth = "required"`: the caller a request's credential
    /// proves (taken off its headers), or 401, counted on `other`'s series.
    /// `None` when callers need not prove who they are.
    pub fn authenticate(&self, headers: &mut HeaderMap) -> Option<Result<Caller, ProxyError>> {
        let auth = self.auth.as_ref()?;
        let verified = crate::transport::worker::pick(&auth.verified, &auth.shared);
        let proven = auth::take(headers).and_then(|v| auth::prove(&v, verified, |k| auth.by_key.get(k).cloned()));
        if proven.is_err() {
            self.other.metrics.unauthenticated.inc();
        }
        Some(proven)
    }

    /// The caller of calls that name none.
    pub fn fallback(&self) -> Caller {
        self.fallback.clone()
    }

    /// The declared callers, in file order.
    pub fn declared(&self) -> &[Caller] {
        &self.order
    }

    /// The caller a request's `X-Wx-Caller` value names: the declared one
    /// (one lookup, none when no caller is declared), else an undeclared
    /// caller of that name. 400 if the value is not a name.
    pub fn named(&self, value: &HeaderValue) -> Result<Caller, ProxyError> {
        let name = match value.to_str() {
            Ok(v) if valid_account(v) => v,
            _ => return Err(ProxyError::BadRequest("X-Wx-Caller must be 1-64 characters of A-Z a-z 0-9 _ -".into())),
        };
        if !self.declared.is_empty() {
            if let Some(c) = self.declared.get(name) {
                return Ok(c.clone());
            }
        }
        if *self.fallback.name == *name {
            return Ok(self.fallback());
        }
        Ok(Caller { name: name.into(), entry: self.other.clone() })
    }
}
