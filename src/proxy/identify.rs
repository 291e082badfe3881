//! Phase 2, identify: who the call is from ([`crate::features::callers`]) and that
//! caller's flood guard, then the account it is for ([`crate::features::accounts`]:
//! header or `@account` prefix, learned token, token request's appid,
//! `default`). A token request's or clear_quota's body is read here (it
//! names the account).

use http::uri::PathAndQuery;
use http::Request;
use hyper::body::Incoming;

use super::call::Call;
use crate::app::App;
use crate::error::{Early, ProxyError};
use crate::features::accounts::{self, Identified};
use crate::features::callers;

/// Sets `call.who`. Under `caller_auth = "required"` the caller's grant of
/// the account a call names is checked before the account phase looks at
/// its token or body; of an account it does not name, once that is known.
/// A call the caller's guard refuses is routed first, so
/// that it is counted under its rule and answered with the rule's
/// `throttle_status`; it never reaches the account lookup (no token
/// lookup) nor the store. The guard holds for calls without a rule too: it
/// limits the caller, not a rule.
pub async fn identify(
    app: &App,
    call: &mut Call,
    req: &mut Request<Incoming>,
    target: &PathAndQuery,
) -> Result<(), Early> {
    let authenticated = call.arrived.config.server.caller_auth.required();
    if authenticated {
        // caller_auth = "required": the caller is the one its key proves
        // (refused calls are counted under their rule, like the guard's);
        // an X-Wx-Caller naming another is refused.
        let callers = app.callers.load();
        let proven = match callers.authenticate(req.headers_mut()) {
            Some(proven) => proven,
            // A reload is turning authentication on: its callers are not in yet.
            None => Err(ProxyError::Unavailable(crate::store::StoreError::Settling)),
        };
        let proven = proven.inspect_err(|_| super::route::route(app, call))?;
        if let Some(name) = callers::take_header(req.headers_mut())? {
            if name.as_bytes() != proven.name.as_bytes() {
                return Err(ProxyError::BadRequest(format!(
                    "X-Wx-Caller names another caller than the one this call's key proves (\"{}\")",
                    proven.name
                ))
                .into());
            }
        }
        call.who.caller = proven;
    } else if let Some(name) = callers::take_header(req.headers_mut())? {
        // Without the header, the caller is the fallback `Call::new` was given.
        call.who.caller = app.callers.load().named(&name)?;
    }
    if let Err(refused) = call.who.caller.check() {
        super::route::route(app, call);
        return Err(refused.into());
    }
    let named = accounts::named(req.headers(), call.arrived.named.take())?;
    // The grant of a named account is checked before anything of the call
    // is looked up or kept (its token, its body).
    if let (true, Some(account)) = (authenticated, &named) {
        call.who.caller.check_grant(account).inspect_err(|_| super::route::route(app, call))?;
    }
    let arrived = &mut call.arrived;
    // An authenticated caller granted one account: its calls that name none are for it.
    let granted = if authenticated { call.who.caller.policy().and_then(|p| p.grants.single()) } else { None };
    let checked = named.is_some();
    let Identified { account, learn, body, clearing, owned } =
        accounts::identify(app, &arrived.config, &arrived.path, named, granted.map(|g| &**g), req, target).await?;
    if authenticated && !checked {
        call.who.caller.check_grant(&account).inspect_err(|_| super::route::route(app, call))?;
    }
    if let Some(max) = call.arrived.config.server.max_accounts {
        let (now, offset) = (app.clock.now_us(), call.arrived.config.server.quota_offset_us);
        app.accounts_in_use.admit(&account, max, now, offset).inspect_err(|_| {
            app.metrics.accounts_full.inc();
            super::route::route(app, call);
        })?;
    }
    call.who.account = account;
    call.who.learn = learn;
    call.who.body = body;
    call.who.clearing = clearing;
    call.who.owned = owned;
    Ok(())
}
