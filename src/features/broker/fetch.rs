//! A token fetch wxgate makes itself for an `[[account]]`: a call of its
//! own, decided against the token API's rule (so fetches count, and wait or
//! are refused as that rule says), sent through the upstream client, and
//! handed to the features' answer hooks like any call's answer (the token
//! cache seals the token into the slot, learning maps it to the account,
//! penalties record WeChat's 45009).

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_LENGTH, CONTENT_TYPE};
use http::uri::PathAndQuery;
use http::{Method, Request};

use crate::admit::admit;
use crate::config::accounts::{SecretAccount, TokenApi};
use crate::config::Config;
use crate::error::{ProxyError, ERRCODE_SYSTEM};
use crate::features::accounts::learn::{Learn, TokenRequest};
use crate::features::accounts::query::encoded;
use crate::features::accounts::Learning;
use crate::features::base::Base;
use crate::features::hooks::{Answered, Feature};
use crate::features::penalties::Penalties;
use crate::features::token_cache::ask::{token_of, Ticket};
use crate::features::token_cache::cache::Fetch;
use crate::features::token_cache::TokenCacheFeature;
use crate::features::warmup::Warmup;
use crate::limit::Key;
use crate::store::op::Refund;
use crate::telemetry::metrics::{Outcome, NO_RULE};
use crate::time::Stopwatch;
use crate::transport::request_body::RequestBody;
use crate::transport::sniff::{sniff, Verdict};

/// The caller label wxgate's own fetches are decided and counted under.
pub const CALLER: &str = "wxgate";

/// Fetches `account`'s token (this asker won the slot's lock: `won`);
/// the token and its `expires_in` (seconds), or why there is none.
pub async fn fetch(
    app: &Base,
    config: &Config,
    account: &SecretAccount,
    won: Fetch,
) -> Result<(String, i64), ProxyError> {
    let api = account.token_api;
    let (method, target, body) = request(account)?;
    let learn = TokenRequest::at(api.path()).map(|request| Learn { request, owner: Some(account.name.to_string()) });
    let (errcode, answer) =
        own_call(app, config, account, Own { path: api.path(), method, target, body, won, learn }).await?;
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
    app: &Base,
    config: &Config,
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
    let own = Own { path, method: Method::GET, target, body: Bytes::new(), won, learn: None };
    match own_call(app, config, account, own).await? {
        (Some(0), _) => Ok(()),
        (_, answer) => Err(refused(account, answer.as_deref().unwrap_or_default())),
    }
}

/// A call wxgate makes itself.
struct Own {
    path: &'static str,
    method: Method,
    target: PathAndQuery,
    body: Bytes,
    /// The slot's fetch this call makes.
    won: Fetch,
    /// What its answer teaches (a token request).
    learn: Option<Learn>,
}

/// Sends `own` for `account`: decided against its path's rule, sent
/// through the upstream client, its answer handed to the answer hooks;
/// the answer's errcode and (small) body.
async fn own_call(
    app: &Base,
    config: &Config,
    account: &SecretAccount,
    own: Own,
) -> Result<(Option<i64>, Option<Bytes>), ProxyError> {
    let Own { path, method, target, body, won, learn } = own;
    let rule = config.rule_for(path).cloned();
    let metrics = app.metrics.rule(rule.as_ref().map_or(NO_RULE, |r| &*r.name));
    // A token is what every call of the account waits on: the rule's
    // reserve is for it (high priority).
    let admitted = match &rule {
        Some(r) => {
            match admit(&app.core, config, &account.name, r, false, CALLER, crate::admit::Meter::ONE, None).await {
                Ok(a) => Some(a),
                Err(e) => {
                    metrics.call(e.outcome());
                    return Err(e);
                }
            }
        }
        None => None,
    };
    let upstream = app.upstream.load_full();
    let uri = upstream.target(&target).map_err(|e| ProxyError::NoToken {
        account: account.name.clone(),
        errcode: ERRCODE_SYSTEM,
        why: format!("cannot address the upstream: {e}"),
    })?;
    let mut req = Request::new(RequestBody::bytes(body.clone()));
    *req.method_mut() = method;
    *req.uri_mut() = uri;
    if !body.is_empty() {
        req.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    }
    req.headers_mut().insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
    let sent = Stopwatch::start();
    let (_, resp) = upstream.send(req).await;
    metrics.upstream.observe(sent.elapsed_us() as f64 / 1e6);
    let resp = match resp {
        Ok(resp) => resp,
        Err(e) => {
            if let (true, Some(rule), Some(a)) = (e.never_sent(), &rule, &admitted) {
                if !a.degraded && a.shadow_refusal.is_none() && !rule.limits.is_empty() {
                    let key = Key { account: &account.name, rule, offset_us: config.server.quota_offset_us };
                    let _ = app.store.apply(key, Refund { at: a.at, cost: 1 }).await;
                }
            }
            let e = ProxyError::from(e);
            metrics.call(e.outcome());
            return Err(e);
        }
    };
    let (_, body, verdict) = match sniff(resp, config.server.body_timeout).await {
        Ok(read) => read,
        Err(e) => {
            metrics.call(Outcome::upstream_error);
            return Err(ProxyError::NoToken {
                account: account.name.clone(),
                errcode: ERRCODE_SYSTEM,
                why: format!("reading the token API's answer: {e:?}"),
            });
        }
    };
    let errcode = match verdict {
        Verdict::Errcode(code) => Some(code),
        Verdict::Success => Some(0),
        Verdict::Unknown => None,
    };
    if let Some(code) = errcode {
        metrics.errcode(code);
    }
    let whole = body.whole().cloned();
    let mut answered = Answered {
        config,
        account: &account.name,
        path,
        target: &target,
        intercepted: None,
        verdict,
        errcode,
        body: whole.as_ref(),
        rule: rule.as_deref(),
        admitted: admitted.as_ref(),
        learn,
        clearing: None,
        token_fetch: Some(won),
        penalty: None,
    };
    // The answer hooks a token fetch's answer needs, in the order of
    // `crate::features`: sealing the token, learning its owner, warm-up
    // starting again, penalties. (Named here: the feature list includes
    // the broker itself.)
    let hooks = (TokenCacheFeature, Learning, Warmup, Penalties);
    hooks.on_answer(app, &mut answered).await;
    metrics.call(if answered.penalty.is_some() { Outcome::penalised } else { Outcome::forwarded });
    Ok((errcode, whole))
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
