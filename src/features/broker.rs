//! wxgate as the token server: for each `[[account]]` (its secret held by
//! wxgate, [`crate::config::accounts`]) one current access token for every
//! instance, added to the calls that carry none.
//!
//! - **Injection** ([`Broker::before_forward`], after decide): a call for
//!   such an account whose query has no `access_token` (or an empty one)
//!   gets the account's current token added to its query. Not on `/sns/`
//!   (user tokens and secrets of their own) nor `/cgi-bin/component/` (the
//!   platform's `component_access_token`), nor on token requests, nor on
//!   `rid/get`, whose answer shows the token of the call it describes (a
//!   `rid/get` that would get it is refused, [`RID_GET`]). Who may:
//!   identify has already checked the caller's grant of the account under
//!   `caller_auth = "required"`; without authentication (allowed with
//!   `[[account]]` only on a loopback listener) any caller.
//! - **One token per account**: the token cache's slot of the account's
//!   token API and secret ([`crate::features::token_cache`]): cached,
//!   sealed, single-flight on every instance; a caller's own token request
//!   with the right secret shares it. A fetch is a call of its own
//!   ([`fetch`]): decided against the token API's rule, penalised and
//!   learned from as any call.
//! - **Renewal** ([`renew`]): a token with less than a tenth of its
//!   lifetime or 5 minutes left (whichever is less) is fetched anew by the
//!   one instance that wins its slot's lock, so a call almost never waits.
//! - **Rejection**: WeChat answering an injected call 40001/40014/42001
//!   ([`after_rejection`]): the token is dropped if it is still the slot's,
//!   one new token is fetched (single flight), and the proxy sends that call
//!   once more with it (`crate::proxy::answer`).

pub mod fetch;
pub mod injected;

pub use self::injected::Injected;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::uri::PathAndQuery;

use crate::admit::core::Core;
use crate::config::accounts::{SecretAccount, TokenApi};
use crate::config::Config;
use crate::error::{Early, ProxyError};
use crate::features::accounts::token_requests::TokenRequest;
use crate::features::hooks::{Answered, Asking, Env, Feature, Requesting, Sending};
use crate::features::token_cache::ask::SlotKind;
use crate::features::token_cache::cache::{fetch_us, Fetch, HeldToken, TokenCache};
use crate::features::token_cache::{ask, json_answer, POLL, REJECTED};
use crate::store::tokens::Claim;
use crate::telemetry::metrics::Outcome;
use crate::time::{deadline_after, Micros};
use crate::transport::sniff::Verdict;

/// A cached token with less left than this is not added to a call: the
/// call fetches a new one (renewal normally has, long before).
pub const CALL_MIN_LEFT_US: Micros = 30_000_000;
/// Renewal starts when less than this is left (or a tenth of the token's
/// lifetime, if that is less).
pub const RENEW_AHEAD_US: Micros = 300_000_000;

/// The broker as a feature ([`crate::features`]): it proves the account
/// of a call it will add the token to (`on_request`), answers a token
/// request for an `[[account]]` (`before_decide`), adds the token
/// (`before_forward`), keeps such a call's body, and has it sent once more
/// with a new token when WeChat rejects the one added (`resend`).
pub struct Broker {
    /// The token cache its tokens live in (`None`: `[tokens] cache` off).
    pub cache: Option<Arc<TokenCache>>,
}

/// What the broker keeps of one call: the token it added, if any.
pub type Ctx = Option<Injected>;

impl Feature for Broker {
    type Ctx = Ctx;

    /// A call wxgate will add its account's own token to has its account
    /// proven (a ticket is served from the account's cache only then).
    async fn on_request(&self, _: Env<'_>, _: &mut Ctx, req: &mut Requesting<'_>) -> Result<(), Early> {
        let config = req.config;
        if !req.who.proven
            && !config.accounts.is_empty()
            && config.accounts.get(&req.who.account).is_some_and(|a| a.injects())
            && wants_token(req.path, req.target.query())
        {
            req.who.proven = true;
        }
        Ok(())
    }

    /// A token request for an `[[account]]`: refused unless it gives the
    /// secret wxgate holds; with it, answered with the account's one token
    /// (a platform's goes on to the token cache, which fetches it with the
    /// request's own verify ticket).
    async fn before_decide(&self, env: Env<'_>, _: &mut Ctx, asking: &mut Asking<'_>) -> Result<(), Early> {
        if asking.config.accounts.is_empty() || asking.who.own {
            return Ok(());
        }
        other_domain(asking)?;
        if TokenRequest::at(asking.path).is_none() {
            return shows_token(asking).map_err(Early::from);
        }
        let body = asking.body.map(|b| &b[..]);
        let Some(asked) = ask::ask(asking.method, asking.path, asking.target.query(), body) else { return Ok(()) };
        let Some(account) = held_for(asking.config, &asked)? else { return Ok(()) };
        if !account.injects() {
            return Ok(());
        }
        let cache = self.cache()?;
        let got = match Box::pin(obtain(env, cache, asking.config, &account, CALL_MIN_LEFT_US, -1, true)).await? {
            Some(got) => got,
            None => return Err(ProxyError::TokenWait(cache.wait).into()),
        };
        cache.metrics.from_cache.inc();
        let body = ask::answer(asked.kind, &got.token, got.left_us / 1_000_000, None);
        Err(Early::Answered(Box::new(json_answer(body.into())), Outcome::cached))
    }

    async fn before_forward(&self, env: Env<'_>, cx: &mut Ctx, sending: &mut Sending<'_>) -> Result<(), Early> {
        let config = sending.config;
        if config.accounts.is_empty() || TokenRequest::at(sending.path).is_some() {
            return Ok(());
        }
        let Some(account) = config.accounts.get(&sending.who.account) else { return Ok(()) };
        if !account.injects() || !wants_token(sending.path, sending.target.query()) {
            return Ok(());
        }
        // Boxed: the fetch behind it is a whole call of its own, and every
        // call's future would otherwise carry its state.
        let cache = self.cache()?;
        let token = Box::pin(current(env, cache, config, account)).await?;
        let with = with_token(sending.target, &token)?;
        let original = std::mem::replace(sending.target, with);
        cache.metrics.injected.inc();
        *cx = Some(Injected { account: account.clone(), token, original });
        Ok(())
    }

    /// A call wxgate added a token to is kept, to be sent once more if
    /// WeChat rejects that token.
    fn keep_body(&self, cx: &Ctx) -> bool {
        cx.is_some()
    }

    /// WeChat rejected the token wxgate added (it did not act on the
    /// call): one new token, and the call once more with it; `None` when no
    /// other token could be had (the first answer stands).
    async fn resend(&self, env: Env<'_>, cx: &mut Ctx, answered: &Answered<'_>) -> Option<PathAndQuery> {
        let (Verdict::Errcode(code), Some(injected), Some(cache)) = (answered.verdict, cx.as_mut(), &self.cache) else {
            return None;
        };
        if !REJECTED.contains(&code) {
            return None;
        }
        let token = after_rejection(env, cache, answered.config, injected).await?;
        let target = with_token(&injected.original, &token).ok()?;
        injected.token = token;
        cache.metrics.resent.inc();
        tracing::info!(account = %answered.account, path = %answered.path, errcode = code, "WeChat rejected the token wxgate added: sent once more with a new one");
        Some(target)
    }
}

impl Broker {
    /// The token cache, which every `[[account]]` needs ([`check`]).
    fn cache(&self) -> Result<&Arc<TokenCache>, ProxyError> {
        self.cache.as_ref().ok_or(ProxyError::Unavailable(crate::error::Unavailable::NoTokenCache))
    }
}

/// The `[[account]]` a token request is for, if wxgate holds one of that
/// id whose token API issues that kind of token ([`issues`]): `Err` (403)
/// unless the request gives its secret. A platform's authorizer token is
/// never an `[[account]]`'s: an authorizer whose appid is also an
/// `[[account]]` is asked for with the platform's credentials, not the
/// account's secret.
fn held_for(config: &Config, asked: &ask::TokenAsk) -> Result<Option<Arc<SecretAccount>>, ProxyError> {
    let platform = asked.kind == SlotKind::Component;
    let mut any = false;
    for a in config.accounts.by_id(&asked.id, platform) {
        if !issues(a.token_api, asked.kind) {
            continue;
        }
        if a.secret.is(&asked.secret) {
            return Ok(Some(a.clone()));
        }
        any = true;
    }
    if !any {
        return Ok(None);
    }
    Err(ProxyError::WrongSecret(format!(
        "wxgate holds the secret of \"{}\" and this token request gives another; send calls without \
         access_token (wxgate adds the account's token), or ask with the secret wxgate holds",
        asked.id
    )))
}

/// WeChat's `rid/get`: its answer's `request.request_url` is the query of
/// the call the rid names, `access_token=…` included (WeChat's own example:
/// `"request_url":"access_token=50_Im7xxxx"`), for any call of the account
/// in the last 7 days, so for calls wxgate added the token to as well.
pub const RID_GET: &str = "/cgi-bin/openapi/rid/get";

/// Whether `path` is [`RID_GET`] (in any letter case: WeChat's English
/// docs write `/cgi-bin/OpenAPI/rid/get`; a trailing `/` too).
pub fn is_rid_get(path: &str) -> bool {
    path.strip_suffix('/').unwrap_or(path).eq_ignore_ascii_case(RID_GET)
}

/// A `rid/get` for an `[[account]]` wxgate would add the token to is
/// refused (400) before it is counted: its answer would show the caller
/// the account's token, which wxgate keeps from callers. A caller with a
/// token of its own sends it, and learns nothing it did not hold.
/// A call for an `[[account]]` whose token wxgate would inject, on another
/// WeChat domain than its kind's (a WeCom app's call without the
/// `/qyapi.weixin.qq.com/` prefix): refused, since that domain refuses the
/// token (40001) and its rules are not the ones the call spends.
fn other_domain(asking: &Asking<'_>) -> Result<(), ProxyError> {
    let config = asking.config;
    let Some(account) = config.accounts.get(&asking.who.account) else { return Ok(()) };
    let home = config.domain_of_kind(account.kind);
    if home == asking.domain || !account.injects() || !wants_token(asking.path, asking.target.query()) {
        return Ok(());
    }
    let host = config.domains.get(home).map_or("", |d| &*d.host);
    Err(ProxyError::BadRequest(format!(
        "the [[account]] \"{}\" is a {} account, whose token only {host} takes: send its calls with the prefix \
         /{host}/",
        account.name,
        account.kind.as_str()
    )))
}

fn shows_token(asking: &Asking<'_>) -> Result<(), ProxyError> {
    if !is_rid_get(asking.path) || !wants_token_of_any(asking.target.query()) {
        return Ok(());
    }
    match asking.config.accounts.get(&asking.who.account) {
        Some(account) if account.injects() => Err(ProxyError::BadRequest(format!(
            "wxgate does not add the token of \"{}\" to rid/get: WeChat's answer shows the token of the call \
             it describes (request_url); send rid/get with an access_token of your own",
            account.name
        ))),
        _ => Ok(()),
    }
}

/// Whether a call to `path` with `query` takes an account's token from
/// wxgate: it carries no `access_token` (or an empty one), and its API
/// takes the account's access token (never `rid/get`: [`RID_GET`]).
pub fn wants_token(path: &str, query: Option<&str>) -> bool {
    if path.starts_with("/sns/") || path.starts_with("/cgi-bin/component/") || is_rid_get(path) {
        return false;
    }
    wants_token_of_any(query)
}

/// Whether `query` carries no token (none, or empty).
fn wants_token_of_any(query: Option<&str>) -> bool {
    let Some(query) = query else { return true };
    !query.split('&').any(|pair| {
        pair.strip_prefix("access_token=").is_some_and(|v| !v.is_empty())
            || pair.strip_prefix("component_access_token=").is_some_and(|v| !v.is_empty())
    })
}

/// `target` with `access_token=<token>` in its query (an empty
/// `access_token` taken out; identify refused a query that gives it twice).
pub fn with_token(target: &PathAndQuery, token: &str) -> Result<PathAndQuery, ProxyError> {
    let mut out = String::with_capacity(target.as_str().len() + token.len() + 16);
    out.push_str(target.path());
    out.push('?');
    if let Some(query) = target.query() {
        for pair in query.split('&').filter(|p| !p.is_empty() && *p != "access_token=" && *p != "access_token") {
            out.push_str(pair);
            out.push('&');
        }
    }
    out.push_str("access_token=");
    crate::features::accounts::query::encode_into(&mut out, token);
    PathAndQuery::from_maybe_shared(Bytes::from(out))
        .map_err(|e| ProxyError::BadRequest(format!("cannot add the access token to this call's query: {e}")))
}

/// Why the `[[account]]`s cannot run: the token cache they need
/// ([`check`]). wxgate does not start; a reload is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AccountsError {
    /// No cache (`[tokens] cache = false`, or Redis without a token key).
    #[error(
        "[[account]] needs the token cache: [tokens] cache is off (or, over Redis, no token key: set \
         WXGATE_TOKEN_KEY or [tokens] key_file, the same on every instance)"
    )]
    NoCache,
    /// A cache per instance over Redis (no token key): each instance would
    /// fetch its own token, and each fetch knocks out the others'.
    #[error(
        "[[account]] over Redis needs a token key (WXGATE_TOKEN_KEY or [tokens] key_file, the same on every \
         instance) so that every instance shares one token per account"
    )]
    NotShared,
}

/// For `Features::new`, which passes a message on until it returns a
/// typed error of its own (issue 62).
/// The token cache an `[[account]]` needs; `Err` says why it cannot run.
pub fn check(config: &Config, cache: Option<&TokenCache>, redis: bool) -> Result<(), AccountsError> {
    if config.accounts.is_empty() {
        return Ok(());
    }
    match cache {
        None => Err(AccountsError::NoCache),
        Some(c) if redis && !c.shared => Err(AccountsError::NotShared),
        Some(_) => Ok(()),
    }
}

/// The kind of token-cache slot an account's token API fills.
pub fn kind(api: TokenApi) -> SlotKind {
    match api {
        TokenApi::StableToken => SlotKind::Stable,
        TokenApi::Token => SlotKind::Token,
        TokenApi::GetToken => SlotKind::WeCom,
        TokenApi::ComponentToken => SlotKind::Component,
    }
}

/// Whether an account of token API `api` answers a token request of
/// `kind`: its own API, or the other of an official account's two token
/// APIs (the same secret gets either); never an authorizer token or a ticket.
pub fn issues(api: TokenApi, kind: SlotKind) -> bool {
    match kind {
        SlotKind::Token | SlotKind::Stable => matches!(api, TokenApi::StableToken | TokenApi::Token),
        SlotKind::WeCom => api == TokenApi::GetToken,
        SlotKind::Component => api == TokenApi::ComponentToken,
        SlotKind::Authorizer | SlotKind::Ticket(_) => false,
    }
}

/// The account's slot in the token cache.
pub fn slot(cache: &TokenCache, account: &SecretAccount) -> String {
    cache.slot(kind(account.token_api), &account.id, account.secret.expose())
}

/// The account's current token, fetched if none with more than
/// [`CALL_MIN_LEFT_US`] left is cached (waiting for another asker's fetch
/// if one is in flight, up to `[tokens] wait`).
///
/// The token is kept in this process until [`CALL_MIN_LEFT_US`] before its
/// end, so a call asks the store only then: a token another instance
/// renewed meanwhile is still valid (WeChat keeps the old one until its
/// end), and one WeChat rejected is replaced by the resend path.
pub async fn current(
    env: Env<'_>,
    cache: &Arc<TokenCache>,
    config: &Arc<Config>,
    account: &Arc<SecretAccount>,
) -> Result<String, ProxyError> {
    let now = env.core.clock.now_us();
    if let Some(held) = cache.held.read().unwrap_or_else(|e| e.into_inner()).get(&account.name) {
        if held.until > now && held.secret.same_read(&account.secret) {
            return Ok(held.token.clone());
        }
    }
    match obtain(env, cache, config, account, CALL_MIN_LEFT_US, -1, true).await? {
        Some(got) => Ok(got.token),
        None => Err(ProxyError::TokenWait(cache.wait)),
    }
}

/// Keeps `token` of `account` in this process while it has more than
/// [`CALL_MIN_LEFT_US`] left (`left_us` from now).
fn hold(core: &Core, cache: &TokenCache, account: &SecretAccount, token: &str, left_us: Micros) {
    let until = core.clock.now_us().saturating_add(left_us - CALL_MIN_LEFT_US);
    let held = HeldToken { secret: account.secret.clone(), token: token.to_owned(), until };
    cache.held.write().unwrap_or_else(|e| e.into_inner()).insert(account.name.clone(), held);
}

/// WeChat rejected `injected`'s token: dropped if it is still the slot's
/// (compare-and-delete, [`crate::features::token_cache::rejected`]), then
/// the account's token, new. `None` when no other token can be had (the
/// slot's is still the one rejected, or the fetch failed): the call is not
/// sent again.
async fn after_rejection(
    env: Env<'_>,
    cache: &Arc<TokenCache>,
    config: &Arc<Config>,
    injected: &Injected,
) -> Option<String> {
    {
        let mut held = cache.held.write().unwrap_or_else(|e| e.into_inner());
        if held.get(&injected.account.name).is_some_and(|h| h.token == injected.token) {
            held.remove(&injected.account.name);
        }
    }
    // The token is the one wxgate added, whatever host answered.
    crate::features::token_cache::rejected_token(cache, injected.token.as_bytes(), None).await;
    match obtain(env, cache, config, &injected.account, CALL_MIN_LEFT_US, -1, true).await {
        Ok(Some(got)) if got.token != injected.token => Some(got.token),
        Ok(_) => None,
        Err(e) => {
            tracing::warn!(account = %injected.account.name, error = %e, "no new token after WeChat rejected one: the call is not sent again");
            None
        }
    }
}

/// A token [`obtain`] got.
struct Got {
    token: String,
    /// How long it lasts (from now).
    left_us: Micros,
    /// This asker fetched it.
    fetched: bool,
}

/// The account's token with more than `min_left_us` left (and stored
/// after `newer_than`): cached, or fetched by this asker if it wins the
/// slot's lock, or another asker's fetch waited for (`wait`; without it,
/// `Ok(None)` when another asker is fetching).
async fn obtain(
    env: Env<'_>,
    cache: &Arc<TokenCache>,
    config: &Arc<Config>,
    account: &Arc<SecretAccount>,
    min_left_us: Micros,
    newer_than: Micros,
    wait: bool,
) -> Result<Option<Got>, ProxyError> {
    let slot = slot(cache, account);
    let holder = cache.holder();
    let deadline = deadline_after(cache.wait);
    let held_us = config.rule_for(account.token_api.path()).map_or(0, |r| r.max_wait_us);
    let lock_us = cache.lock_us(&config.server, held_us);
    loop {
        let woken = cache.done.notified();
        match cache.store.tokens().claim_token(&slot, &holder, min_left_us, newer_than, lock_us).await {
            Err(e) => return Err(ProxyError::from(e)),
            Ok(Claim::Cached { entry, until, now }) => {
                return match cache.sealer.open(&slot, &entry) {
                    Some(token) => {
                        hold(env.core, cache, account, &token, until - now);
                        Ok(Some(Got { token, left_us: until - now, fetched: false }))
                    }
                    None => Err(ProxyError::NoToken {
                        account: account.name.clone(),
                        errcode: crate::error::ERRCODE_SYSTEM,
                        why: "the cached token cannot be opened: give every instance the same token key".into(),
                    }),
                };
            }
            Ok(Claim::Won { .. }) => {
                if account.token_api == TokenApi::ComponentToken {
                    drop(Fetch::new(cache.clone(), slot, holder, kind(account.token_api), account.name.to_string()));
                    return Err(ProxyError::NoToken {
                        account: account.name.clone(),
                        errcode: crate::error::ERRCODE_SYSTEM,
                        why: "a platform's component_access_token is fetched by the platform (it holds the verify ticket)"
                            .into(),
                    });
                }
                let won = Fetch::new(cache.clone(), slot, holder, kind(account.token_api), account.name.to_string());
                // Sent to WeChat for the account's secret: a fetch, as a
                // caller's token request that won its slot is.
                cache.metrics.fetched.inc();
                let (token, expires_in) = fetch::fetch(env, config, account, won).await?;
                let left_us = expires_in.saturating_mul(1_000_000);
                hold(env.core, cache, account, &token, left_us);
                return Ok(Some(Got { token, left_us, fetched: true }));
            }
            Ok(Claim::Failed { answer }) => return Err(fetch::refused(account, &answer)),
            Ok(Claim::Busy { .. }) if !wait => return Ok(None),
            Ok(Claim::Busy { .. }) => {}
        }
        if deadline_after(Duration::ZERO) >= deadline {
            cache.metrics.timed_out.inc();
            return Err(ProxyError::TokenWait(cache.wait));
        }
        let next = deadline.min(deadline_after(POLL));
        let _ = tokio::time::timeout_at(next, woken).await;
    }
}

/// One round of renewal for every `[[account]]` that wxgate fetches: a
/// token with less than [`RENEW_AHEAD_US`] (or a tenth of its lifetime, if
/// less) left is fetched anew, by the instance that wins the slot's lock
/// (the others find it busy, then renewed). Each account is looked at when
/// its renewal is due by what this instance last saw, and at least every
/// [`RENEW_LOOK_US`] (another instance, or a rejection, may have changed
/// it): a store operation per account a minute, not per round.
pub async fn renew(broker: &Broker, env: Env<'_>, config: &Arc<Config>, state: &mut RenewState) {
    let Some(cache) = &broker.cache else { return };
    for account in config.accounts.list.iter().filter(|a| a.injects()) {
        let now = env.core.clock.now_us();
        let due = state.due.get(&account.name).copied().unwrap_or(0);
        if due > now {
            continue;
        }
        let ahead = state.lifetime.get(&account.name).map_or(RENEW_AHEAD_US, |l| (l / 10).min(RENEW_AHEAD_US));
        // A fetch renews a token only if this instance held one: the first
        // (at start, or after WeChat rejected the one held) is a fetch,
        // counted as one in `obtain`, never as a renewal.
        let held = cache.held.read().unwrap_or_else(|e| e.into_inner()).contains_key(&account.name);
        let next = match obtain(env, cache, config, account, ahead, -1, false).await {
            Ok(Some(got)) => {
                state.errors.remove(&account.name);
                if got.fetched {
                    let longest = state.lifetime.entry(account.name.clone()).or_default();
                    *longest = (*longest).max(got.left_us);
                    if held {
                        cache.metrics.renewal("renewed");
                        tracing::info!(account = %account.name, "renewed the account's token ahead of expiry");
                    } else {
                        tracing::info!(account = %account.name, "fetched the account's token");
                    }
                }
                // A renewal that got a token already due (stable_token gives
                // the current one until its last 5 minutes) waits a while.
                let until_due = got.left_us - ahead;
                now + if until_due > 0 { until_due.min(RENEW_LOOK_US) } else { RENEW_RETRY_US }
            }
            // Another instance is fetching it: look again soon.
            Ok(None) => now + 1_000_000,
            Err(e) => {
                // 30 s, doubling while it fails, up to an hour: a wrong
                // secret must not spend the token API's day quota.
                let errors = state.errors.entry(account.name.clone()).or_default();
                let wait_us = RENEW_RETRY_US.saturating_mul(1 << (*errors).min(7)).min(RENEW_BACKOFF_MAX_US);
                *errors += 1;
                cache.metrics.renewal("error");
                tracing::warn!(account = %account.name, error = %e, retry_in_s = wait_us / 1_000_000, "could not renew the account's token ahead of expiry");
                now + wait_us
            }
        };
        state.due.insert(account.name.clone(), next);
        renew_tickets(env, config, cache, account, state).await;
    }
}

/// The tickets of `account` asked for on this instance within a token's
/// lifetime, renewed like its token: the one instance that wins a ticket's
/// slot when less than [`RENEW_AHEAD_US`] is left fetches it with the
/// account's current token.
async fn renew_tickets(
    env: Env<'_>,
    config: &Arc<Config>,
    cache: &Arc<TokenCache>,
    account: &Arc<SecretAccount>,
    state: &mut RenewState,
) {
    let now = env.core.clock.now_us();
    for ticket in cache.tickets_due(&account.name, now - TICKETS_KEPT_US, now, now + RENEW_AHEAD_US) {
        let key = (account.name.clone(), ticket);
        if state.ticket_due.get(&key).is_some_and(|due| *due > now) {
            continue;
        }
        let slot = format!("{}:{}", ticket.as_str(), account.name);
        let holder = cache.holder();
        // The ticket's fetch may first obtain the account's token (a fetch
        // of its own), then fetches the ticket: its lock outlasts both.
        let held_us = config.rule_for(account.token_api.path()).map_or(0, |r| r.max_wait_us);
        let lock_us = cache.lock_us(&config.server, held_us).saturating_add(fetch_us(&config.server));
        let next = match cache.store.tokens().claim_token(&slot, &holder, RENEW_AHEAD_US, -1, lock_us).await {
            Ok(Claim::Cached { until, now: at, .. }) => {
                // Renewed elsewhere: seen cached until then.
                cache.ticket_until(&account.name, ticket, now + (until - at));
                now + 1_000_000
            }
            Ok(Claim::Won { .. }) => {
                let won = Fetch::new(cache.clone(), slot, holder, SlotKind::Ticket(ticket), account.name.to_string());
                // The token from the store, not this process's copy: another
                // instance may have replaced a rejected one.
                let fetched = match obtain(env, cache, config, account, CALL_MIN_LEFT_US, -1, true).await {
                    Ok(Some(got)) => fetch::fetch_ticket(env, config, account, ticket, &got.token, won).await,
                    Ok(None) => Err(ProxyError::TokenWait(cache.wait)),
                    Err(e) => Err(e),
                };
                match fetched {
                    Ok(()) => {
                        cache.metrics.renewal("renewed");
                        tracing::info!(account = %account.name, ticket = ticket.as_str(), "renewed a ticket ahead of expiry");
                        now + RENEW_LOOK_US
                    }
                    Err(e) => {
                        cache.metrics.renewal("error");
                        tracing::warn!(account = %account.name, ticket = ticket.as_str(), error = %e, "could not renew a ticket ahead of expiry; retrying in 30s");
                        now + RENEW_RETRY_US
                    }
                }
            }
            Ok(_) => now + 1_000_000,
            Err(_) => now + RENEW_RETRY_US,
        };
        state.ticket_due.insert(key, next);
    }
}

/// How long a ticket nobody asked for on this instance is still renewed.
pub const TICKETS_KEPT_US: Micros = 7_200_000_000;

/// How long after a failed renewal it is tried again.
pub const RENEW_RETRY_US: Micros = 30_000_000;
/// Longest wait after renewals that failed in a row.
pub const RENEW_BACKOFF_MAX_US: Micros = 3_600_000_000;
/// Longest between two looks at an account's token.
pub const RENEW_LOOK_US: Micros = 60_000_000;

/// What the renewal task remembers between rounds (this instance's view).
#[derive(Default)]
pub struct RenewState {
    /// When each account is next looked at (the app's clock).
    due: std::collections::HashMap<Arc<str>, Micros>,
    /// Renewals of each account that failed in a row.
    errors: std::collections::HashMap<Arc<str>, u32>,
    /// When each (account, ticket) is next looked at.
    ticket_due: std::collections::HashMap<(Arc<str>, ask::Ticket), Micros>,
    /// Each account's token lifetime, the longest fetched (7200 s until
    /// one is).
    lifetime: std::collections::HashMap<Arc<str>, Micros>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pq(s: &str) -> PathAndQuery {
        PathAndQuery::from_maybe_shared(Bytes::from(s.to_owned())).expect("target")
    }

    #[test]
    fn calls_without_a_token_get_one_added_and_nothing_else_changes() {
        assert!(wants_token("/cgi-bin/user/info", None));
        assert!(wants_token("/cgi-bin/user/info", Some("openid=o1&access_token=")));
        assert!(!wants_token("/cgi-bin/user/info", Some("openid=o1&access_token=T")));
        assert!(!wants_token("/sns/userinfo", None));
        assert!(!wants_token("/cgi-bin/component/api_authorizer_token", None));
        assert_eq!(
            with_token(&pq("/cgi-bin/user/info"), "T1").expect("t").as_str(),
            "/cgi-bin/user/info?access_token=T1"
        );
        assert_eq!(
            with_token(&pq("/cgi-bin/user/info?openid=o%201&access_token=&lang=zh_CN"), "T+/").expect("t").as_str(),
            "/cgi-bin/user/info?openid=o%201&lang=zh_CN&access_token=T%2B%2F"
        );
    }
}
