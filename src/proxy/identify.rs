//! Phase 3, identify: who the call is from ([`crate::admit::callers`]:
//! `X-Wx-Caller`, else `[server] caller`, else `default`; under
//! `caller_auth = "required"` the caller its key proves) and that caller's
//! flood guard; the account the call names (`X-Wx-Account` or an
//! `@account` first path segment), whose grant is checked before anything
//! of the call is looked up or kept; then the features' `on_request` hooks
//! ([`crate::features::hooks::Feature::on_request`]), which find the
//! account the call counts against and read what they must of its request;
//! last, whether that account is a WeCom app's `[[account]]`, whose calls
//! count under its corpid ([`crate::features::hooks::Who::counted`]).

use bytes::Bytes;
use http::header::Entry as HeaderEntry;
use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderName, HeaderValue, Request};
use hyper::body::Incoming;

use super::call::{Call, Routed};
use super::source::Source;
use crate::admit::callers;
use crate::config::valid_account;
use crate::error::{Early, ProxyError};
use crate::features::hooks::{Requesting, Seeds};
use crate::proxy::app::App;

/// Sets `call.who`. Under `caller_auth = "required"` the caller's grant of
/// the account a call names is checked before the hooks look at its token
/// or body; of an account it does not name, once that is known (by the
/// hook that finds it). A call the caller's guard refuses never reaches
/// the account lookup (no token lookup) nor the store. The guard holds for
/// calls without a rule too: it limits the caller, not a rule. A call
/// wxgate makes itself has its caller and account from its maker: only
/// the hooks run, with what its maker left them ([`Seeds`]).
pub async fn identify(app: &App, call: &mut Call, source: &mut Source<'_>, target: &PathAndQuery) -> Result<(), Early> {
    let identified = who(app, call, source, target).await;
    if identified.is_ok() {
        // A WeCom app's calls count under its corpid (one lookup, none
        // without `[[account]]`s): `Who::counted`.
        call.who.wecom = call.arrived.config.accounts.wecom(&call.who.account).cloned();
    }
    if let (Err(Early::Refused(e)), Source::Client(..)) = (&identified, source) {
        // A client's request identify could not read was not read as a
        // call of its rule: counted under none.
        if !e.refuses_the_caller() {
            call.route = Routed::default();
        }
    }
    identified
}

/// The caller (a client's) and the account, then the `on_request` hooks.
async fn who(app: &App, call: &mut Call, source: &mut Source<'_>, target: &PathAndQuery) -> Result<(), Early> {
    let mut none = Seeds::default();
    let (incoming, seeds, named, authenticated) = match source {
        Source::Client(req, _) => {
            let (named, authenticated) = client(app, call, req)?;
            (Some(req), &mut none, named, authenticated)
        }
        Source::Own { seeds, .. } => (None, seeds, None, false),
    };
    let arrived = &call.arrived;
    let mut requesting = Requesting {
        config: &arrived.config,
        method: &arrived.method,
        path: &arrived.path,
        target,
        rule: call.route.rule.as_ref(),
        seeds,
        body: &mut call.body,
        incoming,
        named,
        who: &mut call.who,
        appid: None,
        authenticated,
    };
    app.features.on_request(app.env(), &mut call.features, &mut requesting).await
}

/// A client's caller and the account its call names, the caller's grant of
/// it checked: (the account named, whether the caller is authenticated).
fn client(app: &App, call: &mut Call, req: &mut Request<Incoming>) -> Result<(Option<String>, bool), ProxyError> {
    let authenticated = caller(app, call, req)?;
    let named = named(req.headers_mut(), call.arrived.named.take())?;
    // The grant of a named account is checked before anything of the call
    // is looked up or kept (its token, its body).
    if let (true, Some(account)) = (authenticated, &named) {
        call.who.caller.check_grant(account)?;
    }
    Ok((named, authenticated))
}

/// Sets `call.who.caller`: under `caller_auth = "required"` the one the
/// call's key proves (401 without; 400 for an `X-Wx-Caller` naming
/// another), else `X-Wx-Caller` or the fallback; then its flood guard.
/// `Ok(true)`: the caller is authenticated.
pub fn caller(app: &App, call: &mut Call, req: &mut Request<Incoming>) -> Result<bool, ProxyError> {
    let authenticated = call.arrived.config.server.caller_auth.required();
    if authenticated {
        // caller_auth = "required": the caller is the one its key proves
        // (refused calls are counted under their rule, like the guard's);
        // an X-Wx-Caller naming another is refused.
        let callers = app.callers.load();
        let proven = match callers.authenticate(req.headers_mut()) {
            Some(proven) => proven,
            // A reload is turning authentication on: its callers are not in yet.
            None => Err(ProxyError::Unavailable(crate::error::Unavailable::AuthReloading)),
        };
        let proven = proven?;
        if let Some(name) = callers::take_header(req.headers_mut())? {
            if name.as_bytes() != proven.name.as_bytes() {
                return Err(ProxyError::BadRequest(format!(
                    "X-Wx-Caller names another caller than the one this call's key proves (\"{}\")",
                    proven.name
                )));
            }
        }
        call.who.caller = proven;
    } else if let Some(name) = callers::take_header(req.headers_mut())? {
        // Without the header, the caller is the fallback `Call::new` was given.
        call.who.caller = app.callers.load().named(&name)?;
    }
    call.who.caller.check()?;
    Ok(authenticated)
}

/// Header naming the WeChat account (appid / corpid alias) a call is for.
pub const ACCOUNT_HEADER: &str = "x-wx-account";
pub const ACCOUNT: HeaderName = HeaderName::from_static(ACCOUNT_HEADER);

const ALPHABET: &str = "1-64 characters of A-Z a-z 0-9 _ -";

/// Splits an `@account` first segment off a request target: the account
/// and the target without it (query unchanged), or `None` if the target
/// has no such segment. `Err` (400) for an invalid account or nothing
/// after it.
pub fn split_prefix(target: &PathAndQuery) -> Result<Option<(String, PathAndQuery)>, ProxyError> {
    let path = target.path();
    let Some(rest) = path.strip_prefix("/@").or_else(|| path.strip_prefix("/%40")) else {
        return Ok(None);
    };
    let Some(slash) = rest.find('/') else {
        return Err(ProxyError::BadRequest(
            "an @account prefix must be followed by the API path: /@account/cgi-bin/...".into(),
        ));
    };
    let account = &rest[..slash];
    if !valid_account(account) {
        return Err(ProxyError::BadRequest(format!("the @account prefix must be {ALPHABET}")));
    }
    let mut stripped = String::with_capacity(target.as_str().len());
    stripped.push_str(&rest[slash..]);
    if let Some(q) = target.query() {
        stripped.push('?');
        stripped.push_str(q);
    }
    let stripped = PathAndQuery::from_maybe_shared(Bytes::from(stripped)).map_err(|e| {
        ProxyError::BadRequest(format!("the path after the @account prefix is not a request target: {e}"))
    })?;
    Ok(Some((account.to_owned(), stripped)))
}

/// The account `X-Wx-Account` names, if given (once, and valid), taken
/// off the request (every field of it): one lookup of the name.
fn header(headers: &mut HeaderMap) -> Result<Option<HeaderValue>, ProxyError> {
    let HeaderEntry::Occupied(given) = headers.entry(ACCOUNT) else { return Ok(None) };
    let (_, mut values) = given.remove_entry_mult();
    let first = values.next();
    if values.next().is_some() {
        return Err(ProxyError::BadRequest("X-Wx-Account is given more than once".into()));
    }
    match first {
        Some(value) if value.to_str().is_ok_and(valid_account) => Ok(Some(value)),
        _ => Err(ProxyError::BadRequest(format!("X-Wx-Account must be {ALPHABET}"))),
    }
}

/// The account a call names, if it names one: `X-Wx-Account` (taken off
/// the request) or the `@account` prefix accept split off (`prefix`); 400
/// if both are given and differ. The identify phase checks the caller's
/// grant of it before anything is looked up ([`identify`]).
pub fn named(headers: &mut HeaderMap, prefix: Option<String>) -> Result<Option<String>, ProxyError> {
    let given = header(headers)?;
    // Checked valid (ASCII) by `header`.
    let given = given.as_ref().and_then(|v| v.to_str().ok());
    match (given, prefix) {
        (Some(h), Some(p)) if h != p => Err(ProxyError::BadRequest(format!(
            "X-Wx-Account \"{h}\" and the @account prefix \"{p}\" name different accounts"
        ))),
        (Some(h), _) => Ok(Some(h.to_owned())),
        (None, p) => Ok(p),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(target: &str) -> Result<Option<(String, String)>, String> {
        let pq = PathAndQuery::from_maybe_shared(Bytes::from(target.to_owned())).expect("target");
        split_prefix(&pq).map(|o| o.map(|(a, rest)| (a, rest.as_str().to_owned()))).map_err(|e| e.to_string())
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
