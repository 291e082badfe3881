//! Which account a call counts against: the identify phase's rules.
//!
//! 1. **Named** by the caller: the `X-Wx-Account` header, or an `@account`
//!    first path segment ([`split_prefix`]: an SDK's base URL such as
//!    `http://wxgate:8080/@wx1234567890abcdef`; `%40` works too), removed
//!    before the path is checked, matched and forwarded. Both may be given
//!    if they agree.
//! 2. **Learned**: the account the call's access token (`access_token=`, or
//!    `component_access_token=` for the platform's own APIs) was issued to,
//!    remembered when its token answer passed through wxgate ([`learn`]).
//! 3. A token request's own appid ([`learn::TokenRequest::caller`]): what
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
pub mod learn;
pub mod query;

use std::sync::Arc;

use bytes::Bytes;
use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderName, Request};
use hyper::body::Incoming;

use self::cache::Cached;
use self::learn::{Learn, Prepared, TokenRequest};
use crate::config::{valid_account, Config};
use crate::error::ProxyError;
use crate::features::base::Base;
use crate::features::hooks::{Answered, Feature};
use crate::transport::sniff::Verdict;

/// Account used when a call names none.
pub const DEFAULT_ACCOUNT: &str = "default";

/// Header naming the WeChat account (appid / corpid alias) a call is for.
pub const ACCOUNT_HEADER: &str = "x-wx-account";
pub const ACCOUNT: HeaderName = HeaderName::from_static(ACCOUNT_HEADER);

const ALPHABET: &str = "1-64 characters of A-Z a-z 0-9 _ -";

/// Splits an `@account` first segment off a request target: the account
/// and the target without it (query unchanged), or `None` if the target
/// has no such segment. `Err` (400) for an invalid account or nothing
/// after it.
pub fn split_prefix(target: &PathAndQuery) -> Result<Option<(String, PathAndQuery)>, String> {
    let path = target.path();
    let Some(rest) = path.strip_prefix("/@").or_else(|| path.strip_prefix("/%40")) else {
        return Ok(None);
    };
    let Some(slash) = rest.find('/') else {
        return Err("an @account prefix must be followed by the API path: /@account/cgi-bin/...".into());
    };
    let account = &rest[..slash];
    if !valid_account(account) {
        return Err(format!("the @account prefix must be {ALPHABET}"));
    }
    let mut stripped = String::with_capacity(target.as_str().len());
    stripped.push_str(&rest[slash..]);
    if let Some(q) = target.query() {
        stripped.push('?');
        stripped.push_str(q);
    }
    let stripped = PathAndQuery::from_maybe_shared(Bytes::from(stripped))
        .map_err(|e| format!("the path after the @account prefix is not a request target: {e}"))?;
    Ok(Some((account.to_owned(), stripped)))
}

/// The account `X-Wx-Account` names, if given (once, and valid).
fn header(headers: &HeaderMap) -> Result<Option<&str>, ProxyError> {
    let mut values = headers.get_all(ACCOUNT).iter();
    let Some(value) = values.next() else { return Ok(None) };
    if values.next().is_some() {
        return Err(ProxyError::BadRequest("X-Wx-Account is given more than once".into()));
    }
    match value.to_str() {
        Ok(v) if valid_account(v) => Ok(Some(v)),
        _ => Err(ProxyError::BadRequest(format!("X-Wx-Account must be {ALPHABET}"))),
    }
}

/// Learning as a feature ([`crate::features`]): the answer hook of a token
/// request ([`learn::learn`]).
pub struct Learning;

impl Feature for Learning {
    async fn on_answer(&self, app: &Base, answered: &mut Answered<'_>) {
        if let (Some(request), Verdict::Success, Some(body)) = (answered.learn.take(), answered.verdict, answered.body)
        {
            learn::learn(app, answered.config, request, body).await;
        }
    }
}

/// What identify learns of a call from its request.
pub struct Identified {
    /// The WeChat account (appid / corpid alias) the call is for.
    pub account: String,
    /// What a token request's answer will teach.
    pub learn: Option<Learn>,
    /// A token request's or clear_quota's body, read whole.
    pub body: Option<Bytes>,
    /// A `clear_quota` call, and the appid its body names.
    pub clearing: Option<crate::features::quota_clear::request::Clearing>,
    /// The account is the one the call's access token was issued to.
    pub owned: bool,
}

/// The account a call names, if it names one: `X-Wx-Account` or the
/// `@account` prefix accept split off (`prefix`); 400 if both are given and
/// differ. The identify phase checks the caller's grant of it before
/// anything is looked up ([`identify`]).
pub fn named(headers: &HeaderMap, prefix: Option<String>) -> Result<Option<String>, ProxyError> {
    match (header(headers)?, prefix) {
        (Some(h), Some(p)) if h != p => Err(ProxyError::BadRequest(format!(
            "X-Wx-Account \"{h}\" and the @account prefix \"{p}\" name different accounts"
        ))),
        (Some(h), _) => Ok(Some(h.to_owned())),
        (None, p) => Ok(p),
    }
}

/// Longest access token (`access_token`, `component_access_token`, as
/// written in the query) wxgate reads: WeChat's are under 200 characters
/// and it tells clients to keep room for 512; twice that is refused (400)
/// before anything is looked up or kept.
pub const MAX_TOKEN_LEN: usize = 1024;

/// The identify phase's account: the one the call names (`named`, from
/// [`named`]: its grant is already checked), the token in `target`'s query,
/// a token request's appid, or the one account the authenticated caller is
/// granted (`granted`), or `default`, in that order (see the module docs);
/// and, for a token request or clear_quota, its body and what its answer
/// will teach.
///
/// A token request or clear_quota is about the appid WeChat reads in it:
/// one that gives an appid that is not valid, or names an account other
/// than its appid, or carries a token of another, is refused (400), so that
/// it is counted, granted and answered as the account WeChat acts on. One
/// that gives no appid at all (WeChat acts on none) counts as any call.
pub async fn identify(
    app: &Base,
    config: &Config,
    path: &str,
    named: Option<String>,
    granted: Option<&str>,
    req: &mut Request<Incoming>,
    target: &PathAndQuery,
) -> Result<Identified, ProxyError> {
    let mut out = Identified { account: String::new(), learn: None, body: None, clearing: None, owned: false };
    let scanned = match target.query() {
        Some(q) => query::scan(q).map_err(ProxyError::BadRequest)?,
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
    let named = match named {
        Some(account) => {
            out.account = account;
            true
        }
        None => false,
    };
    // Every token the call carries is looked up: WeChat may read either.
    let mut owner: Option<Option<Arc<str>>> = None;
    for token in tokens.into_iter().filter_map(|(_, t)| t) {
        let found = self::owner(app, &query::decoded(token)).await;
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
    let about = match TokenRequest::at(path) {
        Some(request) => {
            let within = config.server.body_timeout;
            let Prepared { body, caller, learn } = learn::prepare(request, req, target.query(), within).await?;
            out.body = body;
            out.learn = Some(learn);
            Some((caller, request.caller))
        }
        // A clear_quota counts as the appid it clears, like a token request.
        None if crate::features::quota_clear::request::at(path) => {
            let within = config.server.body_timeout;
            let (body, clearing) = crate::features::quota_clear::request::prepare(req, target.query(), within).await?;
            out.body = body;
            let caller = clearing.appid.clone();
            out.clearing = Some(clearing);
            Some((caller, learn::Name::Body("appid")))
        }
        None => None,
    };
    let caller = match about {
        Some((Some(appid), name)) if named && appid != out.account => {
            return Err(ProxyError::BadRequest(format!(
                "this request is for {} \"{appid}\" but names account \"{}\": name the account WeChat will read \
                 (or none)",
                name.field(),
                out.account
            )))
        }
        Some((Some(appid), name)) if owner.as_ref().is_some_and(|o| o.as_ref().is_some_and(|o| **o != *appid)) => {
            return Err(ProxyError::BadRequest(format!(
                "this request is for {} \"{appid}\" but carries an access token of another account",
                name.field()
            )))
        }
        Some((caller, _)) => caller,
        None => None,
    };
    match owner {
        Some(Some(owner)) if named && *owner != *out.account => {
            return Err(ProxyError::BadRequest(format!(
                "this call's access token was issued to account \"{owner}\", not to \"{}\" (the account it names)",
                out.account
            )));
        }
        Some(Some(_)) if named => out.owned = true,
        _ if named => {}
        Some(Some(owner)) => {
            out.account.clear();
            out.account.push_str(&owner);
            out.owned = true;
        }
        unknown => match caller {
            Some(caller) => out.account = caller,
            None => {
                if unknown.is_some() {
                    app.metrics.unknown_token_calls.inc();
                }
                granted.unwrap_or(DEFAULT_ACCOUNT).clone_into(&mut out.account);
            }
        },
    }
    if let Some(list) = &config.server.accounts {
        if !list.contains(&out.account) {
            return Err(ProxyError::BadRequest(format!(
                "account \"{}\" is not one of this wxgate's accounts ([server] accounts)",
                out.account
            )));
        }
    }
    Ok(out)
}

/// The account `token` was issued to, if known: from this thread's cache
/// (by the token's [`cache::Digest`]), else from the store (then cached,
/// known or not).
async fn owner(app: &Base, token: &[u8]) -> Option<Arc<str>> {
    let now = app.clock.now_us();
    let digest = app.token_owners.digest(token);
    let cache = app.token_owners.here();
    match cache.get(&digest, now) {
        Cached::Owner(account) => return Some(account),
        Cached::Unknown => return None,
        Cached::Miss => {}
    }
    let hash = app.store.tokens().token_hash(token)?;
    match app.store.tokens().token_owner(&hash).await {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn split(target: &str) -> Result<Option<(String, String)>, String> {
        let pq = PathAndQuery::from_maybe_shared(Bytes::from(target.to_owned())).expect("target");
        split_prefix(&pq).map(|o| o.map(|(a, rest)| (a, rest.as_str().to_owned())))
    }

    #[test]
    fn the_prefix_is_split_off_and_the_query_kept() {
        let ok = |a: &str, rest: &str| Ok(Some((a.to_owned(), rest.to_owned())));
        assert_eq!(split("/@wxA/cgi-bin/token?appid=x&y=%2F"), ok("wxA", "/cgi-bin/token?appid=x&y=%2F"));
        assert_eq!(split("/%40ww_1-2/cgi-bin/gettoken"), ok("ww_1-2", "/cgi-bin/gettoken"));
        assert_eq!(split("/@wxA/"), ok("wxA", "/"));
        assert_eq!(split("/cgi-bin/token?x=@wxA"), Ok(None));
        assert_eq!(split("/cgi-bin/@wxA/token"), Ok(None), "only the first segment");
        for bad in ["/@wxA", "/@wxA?x=1", "/@/cgi-bin/token", "/%40/cgi-bin/token", "/@wx%41/x", "/@wx.A/x"] {
            assert!(split(bad).is_err(), "{bad}");
        }
        assert!(split(&format!("/@{}/x", "a".repeat(65))).is_err());
        assert!(split(&format!("/@{}/x", "a".repeat(64))).is_ok());
    }
}
