//! WeCom broadcasts counted from WeCom's own directory (issue 64,
//! docs/recipients.md "Broadcasts"). A message to `@all` (the app's visible
//! range), `toparty` (departments, with their sub-departments) or `totag`
//! (a tag's members and departments) reaches members its body does not
//! list; for a rule whose `recipients` has `directory = true`, this
//! feature resolves them before the decision ([`Feature::before_decide`]),
//! so the call costs its distinct members (with `touser`'s) and each gets
//! its `per_recipient` windows, all or nothing as for `touser`.
//!
//! - **Fetched by wxgate's own calls** ([`OwnCall`]), with the token of the
//!   app's `[[account]]` (`kind = "wecom"`, its corpid and `agent` the
//!   body's `agentid`): counted under their rules like every own call.
//! - **Cached per (corpid, app, unit)** for `[directory] ttl` in a store
//!   slot (the token cache's: one fetch at a time across instances on
//!   Redis, sealed there) and in this process, at most `[directory]
//!   max_members` ids in all (the least recently used go first); from three
//!   quarters of the TTL a use refreshes it in the background.
//! - **When the directory cannot answer** (no `[[account]]` for the app,
//!   an app without permission, WeCom down or slow past `[directory]
//!   wait`, a broadcast past `[directory] max_broadcast`): the rule's
//!   `unseen_cost` is charged if set, else the call is refused naming the
//!   cause (400, or 503 while WeCom does not answer); both counted in
//!   `wxgate_directory_unresolved_total`. Never a silent pass.
//! - **WeCom's partial success** (`invaliduser`, `invalidparty`,
//!   `invalidtag` with errcode 0) is counted in
//!   `wxgate_recipients_invalid_total`; the members it names are not
//!   charged again by a broadcast of that app until the next refresh.

pub mod metrics;
pub mod units;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use http::uri::PathAndQuery;
use http::Method;

use self::metrics::DirectoryMetrics;
use self::units::{Cache, Held, Key, Members, Refused, Unit};
use crate::config::accounts::{AccountKind, SecretAccount};
use crate::config::Config;
use crate::error::{Early, ProxyError, Unavailable};
use crate::features::component::{Component, ComponentError, Host};
pub use crate::features::hooks::Broadcast;
use crate::features::hooks::{Answered, Asking, Env, Feature, Metered, OwnCall, Seeds};
use crate::features::token_cache::cache::TokenCache;
use crate::store::tokens::{Claim, Fetched};
use crate::time::{deadline_after, Micros};

/// Most bytes of a directory answer read (a `user/simplelist` of 100,000
/// members is about 8 MB).
const ANSWER_CAP: usize = 64 * 1024 * 1024;

/// How long a directory answer WeCom refused is shown to every asker
/// before the next fetch.
const REFUSED_HOLD_US: Micros = 2_000_000;

/// Between two looks at a slot another instance is fetching.
const POLL: Duration = Duration::from_millis(50);

/// Why a broadcast's members could not be counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unresolved {
    /// No `[[account]]` holds the app's secret (or the body names no app).
    NoAccount(String),
    /// WeCom refused the app its directory (an errcode such as 60011).
    Denied(String),
    /// WeCom (or the store) did not answer in time.
    Unavailable(String),
    /// More members than `[directory] max_broadcast`, or than the cache holds.
    TooLarge(String),
}

impl Unresolved {
    /// The metric's `cause` label.
    pub fn cause(&self) -> &'static str {
        match self {
            Unresolved::NoAccount(_) => "no_account",
            Unresolved::Denied(_) => "denied",
            Unresolved::Unavailable(_) => "unavailable",
            Unresolved::TooLarge(_) => "too_large",
        }
    }

    fn text(&self) -> &str {
        match self {
            Unresolved::NoAccount(t) | Unresolved::Denied(t) | Unresolved::Unavailable(t) | Unresolved::TooLarge(t) => {
                t
            }
        }
    }

    /// The caller's answer when nothing is charged instead.
    fn refusal(&self, rule: &str) -> ProxyError {
        match self {
            Unresolved::Unavailable(why) => ProxyError::Unavailable(Unavailable::Directory(why.clone())),
            other => ProxyError::BadRequest(format!(
                "rule \"{rule}\" counts a broadcast's members from WeCom's directory, which cannot count this one: {} \
                 (or set the rule's recipients.unseen_cost to charge such messages a fixed cost)",
                other.text()
            )),
        }
    }
}

/// An app: (corpid, AgentId).
type App = (Arc<str>, Arc<str>);

/// The directory: its shared state.
pub struct Directory {
    inner: Arc<Inner>,
}

struct Inner {
    /// The token cache's store slots (`None`: no token cache, so no
    /// `[[account]]` either: nothing to fetch with).
    tokens: Option<Arc<TokenCache>>,
    held: Mutex<Cache>,
    /// Members WeCom answered invalid, per (corpid, app), until when: not
    /// charged by that app's broadcasts meanwhile.
    invalid: Mutex<HashMap<App, HashMap<Box<str>, Micros>>>,
    host: Mutex<Option<Weak<dyn Host>>>,
    metrics: DirectoryMetrics,
}

/// What the directory keeps of one call: the app it resolved a broadcast
/// for, so that WeCom's `invaliduser` is kept for it.
#[derive(Default)]
pub struct Ctx {
    app: Option<App>,
}

impl Directory {
    pub fn new(tokens: Option<Arc<TokenCache>>, registry: &mut prometheus_client::registry::Registry) -> Directory {
        Directory {
            inner: Arc::new(Inner {
                tokens,
                held: Mutex::default(),
                invalid: Mutex::default(),
                host: Mutex::default(),
                metrics: DirectoryMetrics::register(registry),
            }),
        }
    }

    /// Ids this instance holds (every unit together).
    pub fn members_held(&self) -> u64 {
        self.inner.held.lock().map_or(0, |c| c.weight())
    }
}

impl Feature for Directory {
    type Ctx = Ctx;

    async fn before_decide(&self, env: Env<'_>, cx: &mut Ctx, asking: &mut Asking<'_>) -> Result<(), Early> {
        let config: &Arc<Config> = asking.config;
        let Some(rule) = asking.rule else { return Ok(()) };
        let Some(metering) = config.rule_http(Some(rule)).recipients.as_ref().filter(|m| m.directory) else {
            return Ok(());
        };
        let account = asking.who.account.clone();
        let Some(metered) = asking.metered.as_deref_mut() else { return Ok(()) };
        let Some(broadcast) = metered.broadcast.clone() else {
            // Not a broadcast: what WeCom answers invalid is still kept
            // for the app's broadcasts.
            cx.app = metered.app.as_deref().and_then(|app| Some((held_app(config, &account, app)?.1, Arc::from(app))));
            return Ok(());
        };
        match self.inner.resolve(env, config, &account, metered.app.as_deref(), &broadcast).await {
            Ok((app, members)) => {
                add(metered, members, metering.by_recipients);
                cx.app = Some(app);
                if metering.by_recipients {
                    let normal = asking.who.caller.priority() != crate::config::Priority::High;
                    crate::admit::too_costly(rule, metered.cost, normal)?;
                }
                Ok(())
            }
            Err(why) => {
                self.inner.metrics.unresolved(&rule.name, why.cause());
                match (metering.unseen_cost, rule.shadow) {
                    (Some(cost), _) => {
                        tracing::warn!(rule = %rule.name, cause = why.cause(), why = why.text(), "a broadcast's members could not be counted: charged the rule's unseen_cost");
                        if metering.by_recipients {
                            metered.cost = metered.cost.saturating_add(cost);
                        }
                        Ok(())
                    }
                    (None, true) => {
                        tracing::info!(rule = %rule.name, cause = why.cause(), why = why.text(), "shadow mode: a broadcast's members could not be counted: forwarded at its listed recipients' cost");
                        Ok(())
                    }
                    (None, false) => Err(why.refusal(&rule.name).into()),
                }
            }
        }
    }

    async fn on_answer(&self, env: Env<'_>, cx: &mut Ctx, answered: &mut Answered<'_>) {
        if answered.errcode != Some(0) {
            return;
        }
        let (Some(rule), Some(body)) = (answered.rule, answered.body) else { return };
        if answered.config.rule_http(Some(rule)).recipients.is_none() {
            return;
        }
        let Ok(json) = serde_json::from_slice::<serde_json::Value>(body) else { return };
        let listed = |field: &str| -> Vec<String> {
            json.get(field)
                .and_then(|v| v.as_str())
                .map(|s| s.split('|').map(str::trim).filter(|s| !s.is_empty()).map(str::to_ascii_lowercase).collect())
                .unwrap_or_default()
        };
        let users = listed("invaliduser");
        for (kind, n) in
            [("user", users.len()), ("party", listed("invalidparty").len()), ("tag", listed("invalidtag").len())]
        {
            if n > 0 {
                self.inner.metrics.invalid(&rule.name, kind, n as u64);
            }
        }
        if let (Some(app), false) = (&cx.app, users.is_empty()) {
            let now = env.core.clock.now_us();
            let until = now.saturating_add(answered.config.directory.ttl_us);
            let most = answered.config.directory.max_broadcast;
            if let Ok(mut invalid) = self.inner.invalid.lock() {
                let set = invalid.entry(app.clone()).or_default();
                if set.len() + users.len() > most {
                    set.retain(|_, until| *until > now);
                }
                for user in users {
                    if set.len() < most {
                        set.insert(user.into_boxed_str(), until);
                    }
                }
            }
        }
    }
}

impl Component for Directory {
    async fn start(&self, host: Weak<dyn Host>, _config: &Config) -> Result<(), ComponentError> {
        if let Ok(mut h) = self.inner.host.lock() {
            *h = Some(host);
        }
        Ok(())
    }
}

/// Adds the members a broadcast reaches to the call's recipients (each
/// once: those `touser` named already are not added again) and its cost.
fn add(metered: &mut Metered, members: Vec<String>, by_recipients: bool) {
    if metered.recipients.is_empty() {
        metered.recipients = members;
    } else {
        let named: HashSet<&str> = metered.recipients.iter().map(String::as_str).collect();
        let more: Vec<String> = members.into_iter().filter(|m| !named.contains(m.as_str())).collect();
        metered.recipients.extend(more);
    }
    if by_recipients {
        metered.cost = (metered.recipients.len() as u64).saturating_add(metered.unseen_extra);
    }
}

impl Inner {
    /// The distinct members `broadcast` reaches in `app`'s directory
    /// (less those WeCom last answered invalid), and the (corpid, app) they
    /// were resolved in.
    async fn resolve(
        self: &Arc<Self>,
        env: Env<'_>,
        config: &Arc<Config>,
        account: &str,
        app: Option<&str>,
        broadcast: &Broadcast,
    ) -> Result<(App, Vec<String>), Unresolved> {
        let Some(app) = app else {
            return Err(Unresolved::NoAccount("the body names no agentid (the app whose members it reaches)".into()));
        };
        let Some((secret, corp)) = held_app(config, account, app) else {
            return Err(Unresolved::NoAccount(format!(
                "no [[account]] kind = \"wecom\" for account \"{account}\" with agent = \"{app}\" (wxgate reads the \
                 app's directory with its own token)"
            )));
        };
        let agent: Arc<str> = app.into();
        let key = |unit: Unit| -> Key { (corp.clone(), agent.clone(), unit) };
        // Every unit first (each held, or fetched once), then their members
        // counted once, borrowed from them.
        let mut units: Vec<Arc<Members>> = Vec::new();
        let mut parties: Vec<u32> = broadcast.parties.clone();
        let mut tags: Vec<u32> = broadcast.tags.clone();
        if broadcast.all {
            let visible = self.unit(env, config, &secret, key(Unit::Visible)).await?;
            parties.extend(&visible.parties);
            tags.extend(&visible.tags);
            units.push(visible);
        }
        tags.sort_unstable();
        tags.dedup();
        for tag in tags {
            let m = self.unit(env, config, &secret, key(Unit::Tag(tag))).await?;
            parties.extend(&m.parties);
            units.push(m);
        }
        parties.sort_unstable();
        parties.dedup();
        for party in parties {
            units.push(self.unit(env, config, &secret, key(Unit::Party(party))).await?);
        }
        let most = config.directory.max_broadcast;
        let reached: usize = units.iter().map(|u| u.users.len()).sum();
        let mut members: HashSet<&str> = HashSet::with_capacity(reached.min(most + 1));
        for user in units.iter().flat_map(|u| u.users.iter()) {
            members.insert(user);
            if members.len() > most {
                return Err(Unresolved::TooLarge(format!(
                    "it reaches more than [directory] max_broadcast = {most} members"
                )));
            }
        }
        let now = env.core.clock.now_us();
        if let Ok(mut invalid) = self.invalid.lock() {
            if let Some(set) = invalid.get_mut(&(corp.clone(), agent.clone())) {
                set.retain(|_, until| *until > now);
                members.retain(|m| !set.contains_key(*m));
            }
        }
        let mut members: Vec<String> = members.into_iter().map(str::to_owned).collect();
        members.sort_unstable();
        Ok(((corp, agent), members))
    }

    /// A unit's members: held here, else from the store slot, else fetched.
    async fn unit(
        self: &Arc<Self>,
        env: Env<'_>,
        config: &Arc<Config>,
        account: &Arc<SecretAccount>,
        key: Key,
    ) -> Result<Arc<Members>, Unresolved> {
        let now = env.core.clock.now_us();
        let refresh = {
            let mut held = self.held.lock().map_err(|_| Unresolved::Unavailable("the directory's lock".into()))?;
            match held.get(&key, now) {
                Some(h) => {
                    let members = h.members.clone();
                    let due = now >= h.refresh_at && !h.refreshing;
                    if due {
                        h.refreshing = true;
                    }
                    Some((members, due))
                }
                None => None,
            }
        };
        match refresh {
            Some((members, due)) => {
                if due {
                    self.refresh_later(config.clone(), account.clone(), key);
                }
                Ok(members)
            }
            None => self.load(env, config, account, &key, 0).await,
        }
    }

    /// Refreshes `key` in the background (the call goes on with the held copy).
    fn refresh_later(self: &Arc<Self>, config: Arc<Config>, account: Arc<SecretAccount>, key: Key) {
        let host = self.host.lock().ok().and_then(|h| h.clone());
        let Some(host) = host.and_then(|h| h.upgrade()) else {
            if let Ok(mut held) = self.held.lock() {
                held.refreshed(&key);
            }
            return;
        };
        let inner = self.clone();
        tokio::spawn(async move {
            let env = Env { core: host.core(), calls: host.calls() };
            // What another instance refreshed lately is taken as it is; a
            // copy with less than a quarter of its time left is fetched.
            let min_left = config.directory.ttl_us / 4;
            if let Err(why) = inner.load(env, &config, &account, &key, min_left).await {
                tracing::warn!(account = %account.name, api = key.2.api(), cause = why.cause(), why = why.text(), "could not refresh a unit of WeCom's directory: the copy held is used until its time");
                if let Ok(mut held) = inner.held.lock() {
                    held.refreshed(&key);
                }
            }
        });
    }

    /// `key` from its store slot (one fetch at a time for every instance
    /// sharing the store), held here once had.
    async fn load(
        &self,
        env: Env<'_>,
        config: &Arc<Config>,
        account: &SecretAccount,
        key: &Key,
        min_left_us: Micros,
    ) -> Result<Arc<Members>, Unresolved> {
        let Some(cache) = &self.tokens else {
            return Err(Unresolved::NoAccount("this instance has no token cache to fetch the directory with".into()));
        };
        let (corp, agent, unit) = key;
        let slot = format!("dir:{corp}:{agent}:{}", unit.slot_part());
        let holder = cache.holder();
        let wait = config.directory.wait;
        let deadline = deadline_after(wait);
        let lock_us = crate::features::token_cache::cache::fetch_us(&config.server);
        let store = cache.store.tokens();
        loop {
            let woken = cache.done.notified();
            // In one process (the embedded store), the copy held here is the
            // only one: another call's fetch of it may just have ended.
            if !cache.shared {
                let now = env.core.clock.now_us();
                if let Some(h) = self.held.lock().ok().and_then(|mut c| c.get(key, now).map(|h| h.members.clone())) {
                    if min_left_us == 0 {
                        return Ok(h);
                    }
                }
            }
            let claimed = store
                .claim_token(&slot, &holder, min_left_us, 0, lock_us)
                .await
                .map_err(|e| Unresolved::Unavailable(format!("the store: {e}")))?;
            match claimed {
                Claim::Cached { entry, until, now } => {
                    let members =
                        cache.sealer.open(&slot, &entry).as_deref().and_then(Members::decode).ok_or_else(|| {
                            Unresolved::Unavailable(
                                "a cached directory entry cannot be opened: give every instance the same token key"
                                    .into(),
                            )
                        })?;
                    return self.hold(env, config, key, members, until - now);
                }
                Claim::Won { .. } => {
                    let fetched = self.fetch(env, config, account, agent, *unit).await;
                    let ttl_us = config.directory.ttl_us;
                    // Held here first, so that a waiter woken below finds it.
                    let (held, text, refusal) = match fetched {
                        Ok(members) => {
                            let text = cache.shared.then(|| members.encode());
                            let held = self.hold(env, config, key, members, ttl_us);
                            self.metrics.fetched(unit.api(), if held.is_ok() { "ok" } else { "failed" });
                            (held, text, None)
                        }
                        Err((answer, why)) => {
                            let refusal = answer.filter(|_| matches!(why, Unresolved::Denied(_)));
                            (Err(why), None, refusal)
                        }
                    };
                    let stored = match (&held, text, refusal) {
                        // WeCom's refusal, shown to every asker for a moment.
                        (Err(_), _, Some(answer)) => {
                            store
                                .token_fetched(
                                    &slot,
                                    &holder,
                                    Fetched::Failed { answer: &answer, hold_us: REFUSED_HOLD_US },
                                )
                                .await
                        }
                        // On Redis, kept once for every instance, sealed.
                        (Ok(_), Some(text), _) => match cache.sealer.seal(&slot, text.as_bytes()) {
                            Some(entry) => {
                                let hash = cache.sealer.token_hash(entry.as_slice());
                                store
                                    .token_fetched(&slot, &holder, Fetched::Token { entry: &entry, hash, ttl_us })
                                    .await
                            }
                            None => store.token_fetched(&slot, &holder, Fetched::Abandoned).await,
                        },
                        // In one process, held here only (bounded by
                        // `max_members`): the slot was its fetch's lock.
                        _ => store.token_fetched(&slot, &holder, Fetched::Abandoned).await,
                    };
                    cache.done.notify_waiters();
                    if let Err(e) = stored {
                        tracing::warn!(error = %e, "could not keep a directory unit in the store: the next use fetches it again");
                    }
                    return held;
                }
                Claim::Failed { answer } => {
                    return Err(match units::read(*unit, &answer) {
                        Err(Refused::Denied(code)) => denied(account, *unit, code),
                        _ => Unresolved::Unavailable("WeCom refused the directory fetch a moment ago".into()),
                    });
                }
                Claim::Busy { .. } => {}
            }
            if deadline_after(Duration::ZERO) >= deadline {
                return Err(Unresolved::Unavailable(format!(
                    "another fetch of WeCom's directory did not end within [directory] wait = {wait:?}"
                )));
            }
            let _ = tokio::time::timeout_at(deadline.min(deadline_after(POLL)), woken).await;
        }
    }

    /// Keeps `members` here for `left_us`.
    fn hold(
        &self,
        env: Env<'_>,
        config: &Config,
        key: &Key,
        members: Members,
        left_us: Micros,
    ) -> Result<Arc<Members>, Unresolved> {
        let now = env.core.clock.now_us();
        let members = Arc::new(members);
        let ttl = config.directory.ttl_us;
        // Refreshed from three quarters of its time (of what is left, for
        // a copy another instance fetched earlier).
        let refresh_at = now + left_us.min(ttl) - ttl / 4;
        let held = Held { members: members.clone(), until: now + left_us, refresh_at, used: 0, refreshing: false };
        let mut cache = self.held.lock().map_err(|_| Unresolved::Unavailable("the directory's lock".into()))?;
        if !cache.put(key.clone(), held, now, config.directory.max_members) {
            return Err(Unresolved::TooLarge(format!(
                "one {} answer holds {} ids, more than [directory] max_members = {}",
                key.2.api(),
                members.weight(),
                config.directory.max_members
            )));
        }
        self.metrics.held(cache.weight(), cache.len());
        Ok(members)
    }

    /// Fetches `unit` from WeCom with the app's own token; WeCom's answer
    /// is kept with a refusal for the other askers.
    async fn fetch(
        &self,
        env: Env<'_>,
        config: &Arc<Config>,
        account: &SecretAccount,
        agent: &str,
        unit: Unit,
    ) -> Result<Members, (Option<Vec<u8>>, Unresolved)> {
        let target = PathAndQuery::try_from(unit.target(agent))
            .map_err(|_| (None, Unresolved::Unavailable("a directory request target".into())))?;
        let own = OwnCall {
            config: config.clone(),
            account: account.name.to_string(),
            domain: config.domain_of_kind(AccountKind::WeCom),
            method: Method::GET,
            target,
            body: Bytes::new(),
            seeds: Seeds::default(),
            queued_by: None,
            submitted: None,
            answer_cap: ANSWER_CAP,
        };
        let answered = match env.calls.call(own).await {
            Ok(a) => a,
            Err(e) => {
                self.metrics.fetched(unit.api(), "failed");
                return Err((None, Unresolved::Unavailable(format!("its {} call: {e}", unit.api()))));
            }
        };
        let Some(body) = answered.body.filter(|_| answered.status == 200) else {
            self.metrics.fetched(unit.api(), "failed");
            return Err((
                None,
                Unresolved::Unavailable(format!(
                    "WeCom answered its {} call with HTTP {} and no readable JSON",
                    unit.api(),
                    answered.status
                )),
            ));
        };
        match units::read(unit, &body) {
            // Counted `ok` once held ([`Inner::load`]).
            Ok(members) => Ok(members),
            Err(Refused::Denied(code)) => {
                self.metrics.fetched(unit.api(), "denied");
                Err((Some(body.to_vec()), denied(account, unit, code)))
            }
            Err(Refused::Failed(why)) => {
                self.metrics.fetched(unit.api(), "failed");
                Err((None, Unresolved::Unavailable(format!("WeCom answered its {} call with {why}", unit.api()))))
            }
        }
    }
}

/// The `[[account]]` of app `app` (its AgentId) for a call's `account`
/// (the `[[account]]`'s name, or its corpid), and its corpid.
fn held_app(config: &Config, account: &str, app: &str) -> Option<(Arc<SecretAccount>, Arc<str>)> {
    let found = config.accounts.list.iter().find(|a| {
        a.kind == AccountKind::WeCom && a.agent.as_deref() == Some(app) && (&*a.name == account || a.id == account)
    })?;
    Some((found.clone(), found.id.as_str().into()))
}

/// WeCom refused `account`'s app its directory.
fn denied(account: &SecretAccount, unit: Unit, code: i64) -> Unresolved {
    Unresolved::Denied(format!(
        "WeCom answered the {} call of [[account]] \"{}\" with errcode {code}: the app may not read that part of the \
         directory (give it the contacts' visible range, or read permission, in WeCom's admin console)",
        unit.api(),
        account.name
    ))
}
