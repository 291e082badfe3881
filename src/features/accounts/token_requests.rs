//! Token requests: the calls whose successful answer is a fresh access
//! token ([`TOKEN_REQUESTS`]), the account each token belongs to, and
//! remembering it ([`learn`]) so that later calls carrying the token count
//! against that account.
//!
//! The account is the appid (or corpid) the request asks a token for: in
//! its query (`/cgi-bin/token`, WeCom `/cgi-bin/gettoken`), in its JSON body
//! (`stable_token`, the platform's `api_component_token` and
//! `api_authorizer_token`), or in the answer (`api_query_auth`). A body is
//! read whole before the call goes on ([`Requesting::read_body`]) only on these paths,
//! whatever its framing, up to [`BODY_CAP`] bytes (a token request is a few
//! dozen; a larger one is refused, 413); WeChat gets exactly the bytes
//! sent. A body whose JSON gives a key twice is refused (400), as is a
//! query that gives an appid or secret twice ([`super::query::ambiguity`]):
//! what wxgate learns is what WeChat reads. Every other call streams as
//! before.

use super::cache::OwnerCaches;
use super::query;
use crate::admit::core::Core;
use crate::config::{valid_account, Config};
use crate::error::ProxyError;
use crate::features::hooks::body::request_json;
use crate::features::hooks::Requesting;
use crate::time::Micros;

/// Largest token request body read before forwarding.
pub const BODY_CAP: u64 = 4096;
/// Longest a learned token is remembered, whatever its `expires_in` says
/// (WeChat's live two hours).
const MAX_TTL_US: Micros = 86_400_000_000;

/// Where a token request names an appid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Name {
    Query(&'static str),
    /// A top-level string of the JSON request body.
    Body(&'static str),
    /// A string of the answer (inside [`TokenRequest::within`]).
    Answer(&'static str),
}

impl Name {
    /// The parameter or field it names.
    pub fn field(self) -> &'static str {
        match self {
            Name::Query(f) | Name::Body(f) | Name::Answer(f) => f,
        }
    }
}

/// A call whose successful answer is an access token.
#[derive(Debug)]
pub struct TokenRequest {
    pub path: &'static str,
    /// The account the request itself is for (it counts against it when it
    /// names no account otherwise).
    pub caller: Name,
    /// The account the token it gets belongs to.
    pub owner: Name,
    /// The answer's field holding the token.
    pub token: &'static str,
    /// The answer's object holding the token, `expires_in` and an
    /// [`Name::Answer`] owner (`None`: the top level).
    pub within: Option<&'static str>,
}

/// Every token request wxgate learns from.
pub const TOKEN_REQUESTS: [TokenRequest; 6] = [
    TokenRequest {
        path: "/cgi-bin/token",
        caller: Name::Query("appid"),
        owner: Name::Query("appid"),
        token: "access_token",
        within: None,
    },
    TokenRequest {
        path: "/cgi-bin/stable_token",
        caller: Name::Body("appid"),
        owner: Name::Body("appid"),
        token: "access_token",
        within: None,
    },
    TokenRequest {
        path: "/cgi-bin/gettoken",
        caller: Name::Query("corpid"),
        owner: Name::Query("corpid"),
        token: "access_token",
        within: None,
    },
    TokenRequest {
        path: "/cgi-bin/component/api_component_token",
        caller: Name::Body("component_appid"),
        owner: Name::Body("component_appid"),
        token: "component_access_token",
        within: None,
    },
    TokenRequest {
        path: "/cgi-bin/component/api_authorizer_token",
        caller: Name::Body("component_appid"),
        owner: Name::Body("authorizer_appid"),
        token: "authorizer_access_token",
        within: None,
    },
    // An account authorising the platform: its first authorizer token.
    TokenRequest {
        path: "/cgi-bin/component/api_query_auth",
        caller: Name::Body("component_appid"),
        owner: Name::Answer("authorizer_appid"),
        token: "authorizer_access_token",
        within: Some("authorization_info"),
    },
];

impl TokenRequest {
    /// The token request at `path` (a path [`crate::config::routes::refusal`]
    /// accepted: normal but for a trailing `/`), if it is one.
    pub fn at(path: &str) -> Option<&'static TokenRequest> {
        // A match on the text, not a search of the list: every call asks.
        let at = match path.strip_suffix('/').unwrap_or(path) {
            "/cgi-bin/token" => 0,
            "/cgi-bin/stable_token" => 1,
            "/cgi-bin/gettoken" => 2,
            "/cgi-bin/component/api_component_token" => 3,
            "/cgi-bin/component/api_authorizer_token" => 4,
            "/cgi-bin/component/api_query_auth" => 5,
            _ => return None,
        };
        TOKEN_REQUESTS.get(at)
    }

    /// Whether its answer is a fresh access token of the account itself
    /// (OA/MP, stable, WeCom): warm-up starts again after one.
    pub fn refreshes_access_token(&self) -> bool {
        self.token == "access_token"
    }

    fn reads_body(&self) -> bool {
        matches!(self.caller, Name::Body(_)) || matches!(self.owner, Name::Body(_))
    }
}

/// What a token request's answer will teach: set by the identify phase,
/// used by the answer hook ([`learn`]).
#[derive(Debug)]
pub struct Learn {
    pub request: &'static TokenRequest,
    /// The owner named in the request (`None`: in the answer, or nowhere valid).
    pub owner: Option<String>,
}

/// A token request on its way: the account it is for, and what its answer
/// will teach.
pub struct Prepared {
    pub caller: Option<String>,
    pub learn: Learn,
}

/// Reads what `request` names before it goes on: its body (see the module
/// docs), the account it is for, the account its token will belong to.
pub async fn prepare(request: &'static TokenRequest, req: &mut Requesting<'_>) -> Result<Prepared, ProxyError> {
    let query = req.target.query();
    let body = if request.reads_body() { req.read_body(BODY_CAP, BODY_WHAT).await?.cloned() } else { None };
    let json = request_json(body.as_deref())?;
    // A request that names no account anywhere (no appid in its query, no
    // body) cannot get a token from WeChat: it goes on as it is. One that
    // names one is read one way or refused.
    let gives = |n: Name| match n {
        Name::Query(f) => query.is_some_and(|q| {
            q.split('&').any(|p| p.strip_prefix(f).is_some_and(|rest| rest.is_empty() || rest.starts_with('=')))
        }),
        Name::Body(_) => body.as_ref().is_some_and(|b| !b.is_empty()),
        Name::Answer(_) => false,
    };
    let names_one = gives(request.caller) || gives(request.owner);
    if names_one {
        one_way(request, req.method, query, json.as_ref()).map_err(ProxyError::BadRequest)?;
    }
    // A name the body gives must not be given differently in the query.
    for n in [request.caller, request.owner] {
        if let (Name::Body(f), Some(q)) = (n, query) {
            let in_body = json.as_ref().and_then(|j| j.get(f)?.as_str().map(|s| s.as_bytes().to_vec()));
            if let Some(in_query) = query::param(q, f) {
                if in_body.as_deref() != Some(&*in_query) {
                    return Err(ProxyError::BadRequest(format!(
                        "{f} is given in the query and, differently or not at all, in the body; give it once"
                    )));
                }
            }
        }
    }
    let name = |n: Name| -> Option<String> {
        let text = match n {
            Name::Query(p) => String::from_utf8(query.and_then(|q| query::param(q, p))?.into_owned()).ok()?,
            Name::Body(f) => json.as_ref()?.get(f)?.as_str()?.to_owned(),
            Name::Answer(_) => return None,
        };
        valid_account(&text).then_some(text)
    };
    let (caller, owner) = (name(request.caller), name(request.owner));
    for (n, valid) in [(request.caller, caller.is_some()), (request.owner, owner.is_some())] {
        if names_one && !valid && !matches!(n, Name::Answer(_)) {
            return Err(ProxyError::BadRequest(format!(
                "this token request names no valid {} (1-64 characters of A-Z a-z 0-9 _ -, given once): wxgate \
                 cannot tell which account WeChat will read it as",
                n.field()
            )));
        }
    }
    Ok(Prepared { caller, learn: Learn { request, owner } })
}

/// Whether WeChat can read `request` only one way, as wxgate reads it:
/// `Err` says why not. A token request of another method than its API's
/// (a `POST /cgi-bin/token` WeChat may read), a body that is not a JSON
/// object where the API reads JSON (a form-encoded `stable_token`), a
/// `grant_type` other than exactly `client_credential` (WeChat may read
/// `Client_Credential` as it), a `force_refresh` that is not a boolean:
/// wxgate could not tell which account, secret or token it is about, so it
/// could neither check nor cache it, and such a request reaching WeChat
/// may still issue a token (invalidating the one wxgate holds).
fn one_way(
    request: &TokenRequest,
    method: &http::Method,
    query: Option<&str>,
    json: Option<&serde_json::Value>,
) -> Result<(), String> {
    let wanted = if request.reads_body() { http::Method::POST } else { http::Method::GET };
    if *method != wanted {
        return Err(format!("{} is asked with {wanted}, not {method}", request.path));
    }
    // Without a grant_type WeChat issues nothing (40002); any other than
    // exactly `client_credential` might be read as it.
    let grant_type = |text: Option<&[u8]>| match text {
        None | Some(b"client_credential") => Ok(()),
        _ => Err(format!("{} takes grant_type \"client_credential\", written exactly so", request.path)),
    };
    if request.reads_body() {
        let Some(object) = json.and_then(|j| j.as_object()) else {
            return Err(format!("{} takes a JSON object as its body (not a form, not empty)", request.path));
        };
        if request.path == "/cgi-bin/stable_token" {
            grant_type(object.get("grant_type").and_then(|g| g.as_str()).map(str::as_bytes))?;
            if object.get("force_refresh").is_some_and(|f| !f.is_boolean() && !f.is_null()) {
                return Err("stable_token's force_refresh must be true or false".into());
            }
        }
    } else if request.path == "/cgi-bin/token" {
        grant_type(query.and_then(|q| query::param(q, "grant_type")).as_deref())?;
    }
    Ok(())
}

/// What [`BODY_CAP`] is read for, in its 413.
pub const BODY_WHAT: &str = "a token or clear_quota request";

/// A successful answer to a token request passed through: remembers its
/// token for its account (in this instance's cache at once, and in the
/// store for every instance and restart) until it expires. Nothing is
/// learned for an account that is not valid or not on `[server] accounts`
/// (of `config`, the call's),
/// nor from an answer without a token or a positive `expires_in`.
/// Failures are logged, never the call's: the client gets its token anyway.
pub async fn learn(core: &Core, owners: &OwnerCaches, config: &Config, learn: Learn, answer: &[u8]) {
    let request = learn.request;
    let Ok(json) = serde_json::from_slice::<serde_json::Value>(answer) else { return };
    let object = match request.within {
        Some(field) => &json[field],
        None => &json,
    };
    let owner = match (learn.owner, request.owner) {
        (Some(owner), _) => owner,
        (None, Name::Answer(field)) => match object[field].as_str() {
            Some(owner) if valid_account(owner) => owner.to_owned(),
            _ => return,
        },
        (None, _) => return,
    };
    let Some(token) = object[request.token].as_str().filter(|t| !t.is_empty()) else { return };
    let expires_in = match &object["expires_in"] {
        serde_json::Value::Number(n) => n.as_i64(),
        serde_json::Value::String(s) => s.trim().parse().ok(),
        _ => None,
    };
    let Some(ttl_us) = expires_in.filter(|s| *s > 0).map(|s| s.saturating_mul(1_000_000).min(MAX_TTL_US)) else {
        return;
    };
    if config.server.accounts.as_ref().is_some_and(|list| !list.contains(&owner)) {
        tracing::info!(account = %owner, path = request.path, "not learning a token for an account not on [server] accounts");
        return;
    }
    let Some(hash) = core.store.tokens().token_hash(token.as_bytes()) else {
        tracing::warn!(account = %owner, "cannot learn an access token yet: the store's token key is not read (Redis not reached since start)");
        return;
    };
    let now = core.clock.now_us();
    owners.learned(token.as_bytes(), &owner, now.saturating_add(ttl_us), now);
    match core.store.tokens().learn_token(&hash, &owner, ttl_us).await {
        Ok(()) => {
            core.metrics.tokens_learned.inc();
            tracing::debug!(account = %owner, path = request.path, expires_in_s = ttl_us / 1_000_000, "learned an access token");
        }
        Err(e) => tracing::warn!(
            account = %owner,
            error = %e,
            "could not store a learned access token: this instance knows it, other instances and a restart will not \
             (their calls with it count against `default`)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_requests_are_found_by_their_exact_path() {
        assert_eq!(TokenRequest::at("/cgi-bin/token").map(|r| r.token), Some("access_token"));
        assert_eq!(TokenRequest::at("/cgi-bin/token/").map(|r| r.path), Some("/cgi-bin/token"));
        assert!(TokenRequest::at("/cgi-bin/tokens").is_none());
        assert!(TokenRequest::at("/cgi-bin/message/custom/send").is_none());
        let auth = TokenRequest::at("/cgi-bin/component/api_authorizer_token").expect("platform");
        assert_eq!((auth.caller, auth.owner), (Name::Body("component_appid"), Name::Body("authorizer_appid")));
        assert!(TOKEN_REQUESTS.iter().all(|r| TokenRequest::at(r.path).is_some_and(|f| f.path == r.path)));
    }
}
