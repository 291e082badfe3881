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
use crate::error::Early;
use crate::features::accounts::{self, Identified};
use crate::features::callers;

/// Sets `call.who`. A call the caller's guard refuses is routed first, so
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
    // Without the header, the caller is the fallback `Call::new` was given.
    if let Some(name) = callers::take_header(req.headers_mut())? {
        call.who.caller = app.callers.load().named(&name)?;
    }
    if let Err(refused) = call.who.caller.check() {
        super::route::route(app, call);
        return Err(refused.into());
    }
    let arrived = &mut call.arrived;
    let named = arrived.named.take();
    let Identified { account, learn, body, clearing } =
        accounts::identify(app, &arrived.config, &arrived.path, named, req, target).await?;
    call.who.account = account;
    call.who.learn = learn;
    call.who.body = body;
    call.who.clearing = clearing;
    Ok(())
}
