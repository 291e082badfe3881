//! A token fetch wxgate makes itself for an `[[account]]`: a call of its
//! own ([`OwnCall`]), run through the phases like any call: decided
//! against the token API's rule (so fetches count, and wait or are refused
//! as that rule says), sent, and its answer handed to every feature's
//! answer hook (the token cache seals the token into the slot it won,
//! learning maps it to the account, penalties record WeChat's 45009).

use std::sync::Arc;

use bytes::Bytes;
use http::uri::PathAndQuery;
use http::Method;

use crate::config::accounts::{SecretAccount, TokenApi};
use crate::config::Config;
use crate::error::{ProxyError, ERRCODE_SYSTEM};
use crate::features::accounts::query::encoded;
use crate::features::accounts::token_requests::{Learn, TokenRequest};
use crate::features::hooks::{Env, OwnCall, Seeds};
use crate::features::token_cache::ask::{token_of, Ticket};
use crate::features::token_cache::cache::Fetch;

/// Fetches `account`'s token (this asker won the slot's lock: `won`);
/// the token and its `expires_in` (seconds), or why there is none.
pub async fn fetch(
    env: Env<'_>,
    config: &Arc<Config>,
    account: &SecretAccount,
    won: Fetch,
) -> Result<(String, i64), ProxyError> {
    let api = account.token_api;
    let (method, target, body) = request(account)?;
    let mut seeds = Seeds::default();
    seeds.insert(won);
    if let Some(request) = TokenRequest::at(api.path()) {
        seeds.insert(Learn { request, owner: Some(account.name.to_string()) });
    }
    let own = OwnCall {
        config: config.clone(),
        account: account.name.to_string(),
        domain: config.domain_of_kind(account.kind),
        method,
        target,
        body,
        seeds,
        queued_by: None,
        submitted: None,
        answer_cap: 0,
    };
    let answered = env.calls.call(own).await?;
    let (errcode, answer) = (answered.errcode, answered.body);
    match (errcode, answer.as_deref().and_then(token_of)) {
        (Some(0), Some((token, expires_in))) => {
            tracing::info!(account = %account.name, api = api.as_str(), expires_in_s = expires_in, "fetched the account's access token");
            Ok((token, expires_in))
        }
        _ => Err(refused(account, answer.as_deref().unwrap_or_default())),
    }
}

/// Fetches a ticket of `account` with its current `token` (this asker won
/// the ticket's slot: `won`): renewal ahead of expiry of a ticket in use.
pub async fn fetch_ticket(
    env: Env<'_>,
    config: &Arc<Config>,
    account: &SecretAccount,
    ticket: Ticket,
    token: &str,
    won: Fetch,
) -> Result<(), ProxyError> {
    let (path, kind) = match ticket {
        Ticket::Jsapi => ("/cgi-bin/ticket/getticket", Some("jsapi")),
        Ticket::WxCard => ("/cgi-bin/ticket/getticket", Some("wx_card")),
        Ticket::CorpJsapi => ("/cgi-bin/get_jsapi_ticket", None),
        Ticket::AgentConfig => ("/cgi-bin/ticket/get", Some("agent_config")),
    };
    let mut target = format!("{path}?access_token={}", encoded(token));
    if let Some(kind) = kind {
        target.push_str("&type=");
        target.push_str(kind);
    }
    let target = PathAndQuery::from_maybe_shared(Bytes::from(target)).map_err(|_| ProxyError::NoToken {
        account: account.name.clone(),
        errcode: ERRCODE_SYSTEM,
        why: "the ticket request cannot be written as a request target".into(),
    })?;
    let mut seeds = Seeds::default();
    seeds.insert(won);
    let account_name = account.name.to_string();
    let own = OwnCall {
        config: config.clone(),
        account: account_name,
        domain: config.domain_of_kind(account.kind),
        method: Method::GET,
        target,
        body: Bytes::new(),
        seeds,
        queued_by: None,
        submitted: None,
        answer_cap: 0,
    };
    match env.calls.call(own).await? {
        answered if answered.errcode == Some(0) => Ok(()),
        answered => Err(refused(account, answered.body.as_deref().unwrap_or_default())),
    }
}

/// Why WeChat's answer to a token fetch gave no token, from that answer.
pub fn refused(account: &SecretAccount, answer: &[u8]) -> ProxyError {
    let json = serde_json::from_slice::<serde_json::Value>(answer).ok();
    let errcode = json.as_ref().and_then(|j| j["errcode"].as_i64()).filter(|c| *c != 0).unwrap_or(ERRCODE_SYSTEM);
    let errmsg = json.as_ref().and_then(|j| j["errmsg"].as_str()).unwrap_or("no token in its answer");
    // WeChat's errmsg, cut short: it never carries the secret, and the
    // client's answer must stay small.
    let errmsg: String = errmsg.chars().take(200).collect();
    ProxyError::NoToken {
        account: account.name.clone(),
        errcode,
        why: format!(
            "WeChat answered the token fetch ({}) with errcode {errcode}: {errmsg}",
            account.token_api.as_str()
        ),
    }
}

/// The token API request for `account`: method, target, body.
fn request(account: &SecretAccount) -> Result<(Method, PathAndQuery, Bytes), ProxyError> {
    let secret = std::str::from_utf8(account.secret.expose()).unwrap_or_default();
    let (method, target, body) = match account.token_api {
        TokenApi::StableToken => (
            Method::POST,
            TokenApi::StableToken.path().to_owned(),
            Bytes::from(
                serde_json::json!({ "grant_type": "client_credential", "appid": account.id, "secret": secret })
                    .to_string(),
            ),
        ),
        TokenApi::Token => (
            Method::GET,
            format!("/cgi-bin/token?grant_type=client_credential&appid={}&secret={}", account.id, encoded(secret)),
            Bytes::new(),
        ),
        TokenApi::GetToken => (
            Method::GET,
            format!("/cgi-bin/gettoken?corpid={}&corpsecret={}", account.id, encoded(secret)),
            Bytes::new(),
        ),
        TokenApi::ComponentToken => {
            return Err(ProxyError::NoToken {
                account: account.name.clone(),
                errcode: ERRCODE_SYSTEM,
                why: "a platform's token needs its verify ticket: the platform fetches it".into(),
            })
        }
    };
    let target = PathAndQuery::from_maybe_shared(Bytes::from(target)).map_err(|_| ProxyError::NoToken {
        account: account.name.clone(),
        errcode: ERRCODE_SYSTEM,
        why: "the token request cannot be written as a request target".into(),
    })?;
    Ok((method, target, body))
}
