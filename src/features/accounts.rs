//! Which account a call counts against: the identify phase's rules.
//!
//! 1. **Named** by the caller: the `X-Wx-Account` header, or an `@account`
//!    first path segment ([`split_prefix`](crate::proxy::identify::split_prefix): an SDK's base URL such as
//!    `http://wxgate:8080/@wx1234567890abcdef`; `%40` works too), removed
//!    before the path is checked, matched and forwarded. Both may be given
//!    if they agree.
//! 2. **Learned**: the account the call's access token (`access_token=`, or
//!    `component_access_token=` for the platform's own APIs) was issued to,
//!    remembered when its token answer passed through wxgate ([`token_requests::learn`]).
//! 3. A token request's own appid ([`token_requests::TokenRequest::caller`]): what
//!    WeChat counts a token request against; the appid a `clear_quota`
//!    clears ([`crate::features::quota_clear`]).
//! 4. With `caller_auth = "required"`, the one account the caller is
//!    granted, if it is granted exactly one.
//! 5. `default`.
//!
//! A call that names an account but carries a token learned for another is
//! refused (400): nobody may spend or penalise another account's quota by
//! naming it. A token request or clear_quota is the account of the appid
//! WeChat reads in it: one whose appid is not valid, or naming another
//! account, or carrying a token learned for another, is refused (400).
//! With `[server] accounts`, a call whose account (from any source) is not
//! listed is refused too. Under `caller_auth = "required"` the grant of a
//! named account is checked before any of this ([`crate::proxy::identify`]).
//!
//! Cost: a call without a token looks up nothing; a call with one (at most
//! [`MAX_TOKEN_LEN`] characters, else 400) takes its keyed digest (SipHash,
//! [`cache`]) and looks that up in its serving thread's cache. Only when
//! the cache has no answer is it hashed (HMAC, [`crate::store::tokens`]) and
//! the store asked. The token never leaves the process: not in logs,
//! answers or the store, and no cache keeps it.

pub mod cache;
pub mod in_use;
pub mod query;
pub mod token_requests;

use std::sync::Arc;

use self::cache::{Cached, OwnerCaches};
use self::in_use::InUse;
use self::token_requests::{Learn, Prepared, TokenRequest};
use crate::admit::core::Core;
use crate::error::{Early, ProxyError};
use crate::features::hooks::{Answered, Env, Feature, Requesting};
use crate::transport::sniff::Verdict;

/// Account used when a call names none.
pub const DEFAULT_ACCOUNT: &str = "default";

/// Accounts as a feature ([`crate::features`]): its request hook finds the
/// account a call counts against ([`identify`]); its answer hook learns the
/// owner of a token a token request got ([`token_requests::learn`]).
pub struct Accounts {
    /// Access tokens this instance knows the account of, or knows unknown.
    pub owners: OwnerCaches,
    /// The accounts with calls today (`[server] max_accounts`).
    pub in_use: InUse,
}

impl Accounts {
    /// With a token cache for each of `workers` serving threads.
    pub fn new(workers: usize) -> Accounts {
        Accounts { owners: OwnerCaches::new(workers), in_use: InUse::default() }
    }
}

impl Feature for Accounts {
    /// A token request on its way: what its answer will teach.
    type Ctx = Option<Learn>;

    async fn on_request(&self, env: Env<'_>, cx: &mut Option<Learn>, req: &mut Requesting<'_>) -> Result<(), Early> {
        if req.own() {
            // wxgate's own token request: it names its account.
            *cx = req.seeds.take::<Learn>();
            return Ok(());
        }
        identify(env.core, self, cx, req).await?;
        if let Some(max) = req.config.server.max_accounts {
            let (now, offset) = (env.core.clock.now_us(), req.config.server.quota_offset_us);
            self.in_use.admit(&req.who.account, max, now, offset).inspect_err(|_| {
                env.core.metrics.accounts_full.inc();
            })?;
        }
        Ok(())
    }

    async fn on_answer(&self, env: Env<'_>, cx: &mut Option<Learn>, answered: &mut Answered<'_>) {
        if let (Some(request), Verdict::Success, Some(body)) = (cx.take(), answered.verdict, answered.body) {
            // Boxed: a token request's answer is rare; every call's future
            // would otherwise carry this one.
            Box::pin(token_requests::learn(env.core, &self.owners, answered.config, request, body)).await;
        }
    }
}

/// Longest access token (`access_token`, `component_access_token`, as
/// written in the query) wxgate reads: WeChat's are under 200 characters
/// and it tells clients to keep room for 512; twice that is refused (400)
/// before anything is looked up or kept.
pub const MAX_TOKEN_LEN: usize = 1024;

/// The call's account (`req.who`): the one it names (`req.named`: its
/// grant is already checked), the token in its query, a token request's or
/// clear_quota's appid, or the one account the authenticated caller is
/// granted, or `default`, in that order (see the module docs); for a token
/// request, what its answer will teach (`learning`). Under
/// `caller_auth = "required"`, the caller's grant of an account it does
/// not name is checked once the account is known.
///
/// A token request or clear_quota is about the appid WeChat reads in it:
/// one that gives an appid that is not valid, or names an account other
/// than its appid, or carries a token of another, is refused (400), so that
/// it is counted, granted and answered as the account WeChat acts on. One
/// that gives no appid at all (WeChat acts on none) counts as any call.
async fn identify(
    core: &Core,
    accounts: &Accounts,
    learning: &mut Option<Learn>,
    req: &mut Requesting<'_>,
) -> Result<(), ProxyError> {
    let config = req.config;
    let scanned = match req.target.query() {
        Some(q) => query::scan(q)?,
        None => query::Scanned::default(),
    };
    let tokens = [("access_token", scanned.access_token), ("component_access_token", scanned.component_access_token)];
    for (name, token) in tokens {
        if token.is_some_and(|t| t.len() > MAX_TOKEN_LEN) {
            return Err(ProxyError::BadRequest(format!(
                "this call's {name} is longer than the {MAX_TOKEN_LEN} characters wxgate reads (WeChat's are under 200)"
            )));
        }
    }
    let named = match req.named.take() {
        Some(account) => {
            req.who.account = account;
            true
        }
        None => false,
    };
    // Every token the call carries is looked up: WeChat may read either.
    let mut owner: Option<Option<Arc<str>>> = None;
    for token in tokens.into_iter().filter_map(|(_, t)| t) {
        let found = self::owner(core, accounts, &query::decoded(token)).await;
        match (&owner, &found) {
            (Some(Some(a)), Some(b)) if a != b => {
                return Err(ProxyError::BadRequest(format!(
                    "this call carries access tokens of two accounts (\"{a}\" and \"{b}\"); give one"
                )))
            }
            (Some(Some(_)), None) => {}
            _ => owner = Some(found),
        }
    }
    let about = match TokenRequest::at(req.path) {
        Some(request) => {
            let Prepared { caller, learn } = Box::pin(token_requests::prepare(request, req)).await?;
            *learning = Some(learn);
            Some((caller, request.caller.field()))
        }
        // A clear_quota counts as the appid it clears, like a token request
        // (the feature that recognised it said which).
        None => req.appid.take().map(|appid| (appid.id, appid.field)),
    };
    let caller = match about {
        Some((Some(appid), field)) if named && appid != req.who.account => {
            return Err(ProxyError::BadRequest(format!(
                "this request is for {field} \"{appid}\" but names account \"{}\": name the account WeChat will read \
                 (or none)",
                req.who.account
            )))
        }
        Some((Some(appid), field)) if owner.as_ref().is_some_and(|o| o.as_ref().is_some_and(|o| **o != *appid)) => {
            return Err(ProxyError::BadRequest(format!(
                "this request is for {field} \"{appid}\" but carries an access token of another account"
            )))
        }
        Some((caller, _)) => caller,
        None => None,
    };
    let who = &mut *req.who;
    match owner {
        Some(Some(owner)) if named && *owner != *who.account => {
            return Err(ProxyError::BadRequest(format!(
                "this call's access token was issued to account \"{owner}\", not to \"{}\" (the account it names)",
                who.account
            )));
        }
        Some(Some(_)) if named => who.proven = true,
        _ if named => {}
        Some(Some(owner)) => {
            who.account.clear();
            who.account.push_str(&owner);
            who.proven = true;
        }
        unknown => match caller {
            Some(caller) => who.account = caller,
            None => {
                if unknown.is_some() {
                    core.metrics.unknown_token_calls.inc();
                }
                // An authenticated caller granted one account: its calls
                // that name none are for it.
                let granted =
                    if req.authenticated { who.caller.policy().and_then(|p| p.grants.single()) } else { None };
                let account = granted.map_or(DEFAULT_ACCOUNT, |g| &**g).to_owned();
                who.account = account;
            }
        },
    }
    if let Some(list) = &config.server.accounts {
        if !list.contains(&who.account) {
            return Err(ProxyError::BadRequest(format!(
                "account \"{}\" is not one of this wxgate's accounts ([server] accounts)",
                who.account
            )));
        }
    }
    if req.authenticated && !named {
        who.caller.check_grant(&who.account)?;
    }
    Ok(())
}

/// The account `token` was issued to, if known: from this thread's cache
/// (by the token's [`cache::Digest`]), else from the store (then cached,
/// known or not).
async fn owner(core: &Core, accounts: &Accounts, token: &[u8]) -> Option<Arc<str>> {
    let now = core.clock.now_us();
    let digest = accounts.owners.digest(token);
    let cache = accounts.owners.here();
    match cache.get(&digest, now) {
        Cached::Owner(account) => return Some(account),
        Cached::Unknown => return None,
        Cached::Miss => {}
    }
    let hash = core.store.tokens().token_hash(token)?;
    match core.store.tokens().token_owner(&hash).await {
        Ok(Some(owner)) => {
            let account: Arc<str> = Arc::from(owner.account.as_str());
            cache.known(&digest, account.clone(), now.saturating_add(owner.remaining_us()), now);
            Some(account)
        }
        Ok(None) => {
            cache.unknown(&digest, now);
            None
        }
        Err(e) => {
            tracing::debug!(error = %e, "cannot look up an access token: counted as unknown");
            cache.unknown(&digest, now);
            None
        }
    }
}
