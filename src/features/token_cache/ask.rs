//! Which token requests the cache answers, and the answers it writes.
//!
//! - `GET /cgi-bin/token?grant_type=client_credential&appid=..&secret=..`
//! - `POST /cgi-bin/stable_token` with a JSON body `{grant_type:
//!   "client_credential", appid, secret, force_refresh}`; `force_refresh:
//!   true` always fetches (single-flighted, [`TokenAsk::force`])
//! - WeCom `GET /cgi-bin/gettoken?corpid=..&corpsecret=..`
//!
//! Anything else (another grant type, a missing or invalid appid, an empty
//! secret, a body that is not such JSON) is not cached: it goes to WeChat as
//! it came.

use http::Method;
use serde_json::json;

use crate::config::valid_account;
use crate::features::accounts::query;

/// The token APIs the cache answers; each has slots of its own (a stable
/// token and a `/cgi-bin/token` token of one appid are different tokens).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotKind {
    Token,
    Stable,
    WeCom,
    /// A platform's `component_access_token` (`api_component_token`).
    Component,
    /// An authorizer's `authorizer_access_token` (`api_authorizer_token`),
    /// per (authorizer, platform, refresh token, component token).
    Authorizer,
    /// An account's ticket (keyed by the account, not the token).
    Ticket(Ticket),
}

/// The tickets the cache answers, one slot per (kind, account).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ticket {
    /// OA `GET /cgi-bin/ticket/getticket?type=jsapi`.
    Jsapi,
    /// OA `GET /cgi-bin/ticket/getticket?type=wx_card`.
    WxCard,
    /// WeCom `GET /cgi-bin/get_jsapi_ticket` (the corp's).
    CorpJsapi,
    /// WeCom `GET /cgi-bin/ticket/get?type=agent_config` (the app's).
    AgentConfig,
}

impl Ticket {
    pub const ALL: [Ticket; 4] = [Ticket::Jsapi, Ticket::WxCard, Ticket::CorpJsapi, Ticket::AgentConfig];

    pub fn as_str(self) -> &'static str {
        match self {
            Ticket::Jsapi => "jsapi",
            Ticket::WxCard => "wx_card",
            Ticket::CorpJsapi => "corp_jsapi",
            Ticket::AgentConfig => "agent_config",
        }
    }
}

/// The ticket request at `path` (GET, with this `query`), if this is one;
/// `Err` for one whose `type` could be read two ways (given twice, or
/// encoded): which ticket it asks for must be what WeChat reads. Cheap for
/// every other call: one prefix test.
pub fn ticket(method: &Method, path: &str, query: Option<&str>) -> Result<Option<Ticket>, query::Ambiguous> {
    if method != Method::GET || !path.starts_with("/cgi-bin/") {
        return Ok(None);
    }
    let path = path.strip_suffix('/').unwrap_or(path);
    let kind = || query.map_or(Ok(None), |q| query::once(q, "type"));
    Ok(match path {
        "/cgi-bin/ticket/getticket" => match kind()?.as_deref() {
            Some(b"jsapi") => Some(Ticket::Jsapi),
            Some(b"wx_card") => Some(Ticket::WxCard),
            _ => None,
        },
        "/cgi-bin/get_jsapi_ticket" => Some(Ticket::CorpJsapi),
        "/cgi-bin/ticket/get" => (kind()?.as_deref() == Some(b"agent_config")).then_some(Ticket::AgentConfig),
        _ => None,
    })
}

impl SlotKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SlotKind::Token => "token",
            SlotKind::Stable => "stable",
            SlotKind::WeCom => "wecom",
            SlotKind::Component => "component",
            SlotKind::Authorizer => "authorizer",
            SlotKind::Ticket(t) => t.as_str(),
        }
    }

    /// The answer's field that holds the token.
    pub fn field(self) -> &'static str {
        match self {
            SlotKind::Token | SlotKind::Stable | SlotKind::WeCom => "access_token",
            SlotKind::Component => "component_access_token",
            SlotKind::Authorizer => "authorizer_access_token",
            SlotKind::Ticket(_) => "ticket",
        }
    }
}

/// A token request the cache can answer.
pub struct TokenAsk {
    pub kind: SlotKind,
    /// The appid (corpid for WeCom).
    pub id: String,
    /// The secret, only ever hashed ([`super::seal::Sealer::secret_hash`]).
    pub secret: Vec<u8>,
    /// `stable_token` with `force_refresh: true`.
    pub force: bool,
    /// `api_authorizer_token`: the refresh token the request gave, which its
    /// cached answer repeats (never stored: only hashed into the slot).
    pub refresh: Option<String>,
}

impl std::fmt::Debug for TokenAsk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenAsk").field("kind", &self.kind).field("id", &self.id).field("force", &self.force).finish()
    }
}

/// The cacheable token request at `path` (as accepted: normal but for a
/// trailing `/`), if this is one.
pub fn ask(method: &Method, path: &str, query: Option<&str>, body: Option<&[u8]>) -> Option<TokenAsk> {
    let path = path.strip_suffix('/').unwrap_or(path);
    let param = |name: &str| query.and_then(|q| query::param(q, name)).map(|v| v.into_owned());
    let valid_id = |id: Vec<u8>| String::from_utf8(id).ok().filter(|id| valid_account(id));
    match (method, path) {
        (&Method::GET, "/cgi-bin/token") => {
            if param("grant_type").as_deref() != Some(b"client_credential") {
                return None;
            }
            let id = valid_id(param("appid")?)?;
            let secret = param("secret").filter(|s| !s.is_empty())?;
            Some(TokenAsk { kind: SlotKind::Token, id, secret, force: false, refresh: None })
        }
        (&Method::GET, "/cgi-bin/gettoken") => {
            let id = valid_id(param("corpid")?)?;
            let secret = param("corpsecret").filter(|s| !s.is_empty())?;
            Some(TokenAsk { kind: SlotKind::WeCom, id, secret, force: false, refresh: None })
        }
        (&Method::POST, "/cgi-bin/stable_token") => {
            let json: serde_json::Value = serde_json::from_slice(body?).ok()?;
            if json.get("grant_type")?.as_str()? != "client_credential" {
                return None;
            }
            let id = json.get("appid")?.as_str().filter(|id| valid_account(id))?.to_owned();
            let secret = json.get("secret")?.as_str().filter(|s| !s.is_empty())?.as_bytes().to_vec();
            let force = match json.get("force_refresh") {
                None | Some(serde_json::Value::Null) => false,
                Some(v) => v.as_bool()?,
            };
            Some(TokenAsk { kind: SlotKind::Stable, id, secret, force, refresh: None })
        }
        // The verify ticket changes every 10 minutes and is not part of the
        // slot: one component token per (platform, appsecret).
        (&Method::POST, "/cgi-bin/component/api_component_token") => {
            let json: serde_json::Value = serde_json::from_slice(body?).ok()?;
            let id = json.get("component_appid")?.as_str().filter(|id| valid_account(id))?.to_owned();
            let secret = json.get("component_appsecret")?.as_str().filter(|s| !s.is_empty())?.as_bytes().to_vec();
            json.get("component_verify_ticket")?.as_str().filter(|t| !t.is_empty())?;
            Some(TokenAsk { kind: SlotKind::Component, id, secret, force: false, refresh: None })
        }
        // One authorizer token per (authorizer, platform, refresh token,
        // component token): the slot's secret is all three credentials, so
        // a request with a bogus component_access_token never gets the
        // token cached for the platform's own, nor the platform WeChat's
        // answer to a bogus one. A new component token (every two hours)
        // names a new slot: one fetch of the authorizer token each time.
        (&Method::POST, "/cgi-bin/component/api_authorizer_token") => {
            let json: serde_json::Value = serde_json::from_slice(body?).ok()?;
            let id = json.get("authorizer_appid")?.as_str().filter(|id| valid_account(id))?.to_owned();
            let platform = json.get("component_appid")?.as_str().filter(|id| valid_account(id))?;
            let refresh = json.get("authorizer_refresh_token")?.as_str().filter(|s| !s.is_empty())?.to_owned();
            let component = param("component_access_token").filter(|t| !t.is_empty())?;
            // Each part after its length: no two triples give the same bytes.
            let mut secret = Vec::with_capacity(platform.len() + refresh.len() + component.len() + 24);
            for part in [platform.as_bytes(), refresh.as_bytes(), &component] {
                secret.extend_from_slice(&(part.len() as u64).to_be_bytes());
                secret.extend_from_slice(part);
            }
            Some(TokenAsk { kind: SlotKind::Authorizer, id, secret, force: false, refresh: Some(refresh) })
        }
        _ => None,
    }
}

/// The body WeChat sends for a token of `kind` with `expires_in` seconds
/// left (WeCom adds `errcode` 0 and `errmsg` "ok"; an authorizer token
/// repeats the refresh token asked with, as WeChat does).
pub fn answer(kind: SlotKind, token: &str, expires_in: i64, refresh: Option<&str>) -> String {
    match kind {
        SlotKind::Token | SlotKind::Stable => json!({ "access_token": token, "expires_in": expires_in }).to_string(),
        SlotKind::WeCom => {
            json!({ "errcode": 0, "errmsg": "ok", "access_token": token, "expires_in": expires_in }).to_string()
        }
        SlotKind::Component => json!({ "component_access_token": token, "expires_in": expires_in }).to_string(),
        SlotKind::Authorizer => json!({
            "authorizer_access_token": token,
            "expires_in": expires_in,
            "authorizer_refresh_token": refresh.unwrap_or_default(),
        })
        .to_string(),
        SlotKind::Ticket(_) => {
            json!({ "errcode": 0, "errmsg": "ok", "ticket": token, "expires_in": expires_in }).to_string()
        }
    }
}

/// A token answer read: the token and its `expires_in` (seconds, > 0).
pub fn token_of(answer: &[u8]) -> Option<(String, i64)> {
    credential_of(SlotKind::Token, answer)
}

/// An answer of `kind`'s API read: its token (or ticket) and `expires_in`
/// (seconds, > 0); `None` for an answer with a non-zero errcode.
pub fn credential_of(kind: SlotKind, answer: &[u8]) -> Option<(String, i64)> {
    let json: serde_json::Value = serde_json::from_slice(answer).ok()?;
    if json.get("errcode").and_then(|c| c.as_i64()).is_some_and(|c| c != 0) {
        return None;
    }
    let token = json.get(kind.field())?.as_str().filter(|t| !t.is_empty())?.to_owned();
    let expires_in = match json.get("expires_in")? {
        serde_json::Value::Number(n) => n.as_i64()?,
        serde_json::Value::String(s) => s.trim().parse().ok()?,
        _ => return None,
    };
    (expires_in > 0).then_some((token, expires_in))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_well_formed_token_requests_are_cacheable() {
        let get = |path: &str, q: &str| ask(&Method::GET, path, Some(q), None);
        let t = get("/cgi-bin/token", "grant_type=client_credential&appid=wxA&secret=s%3D1").expect("token");
        assert_eq!((t.kind, t.id.as_str(), t.secret.as_slice(), t.force), (SlotKind::Token, "wxA", &b"s=1"[..], false));
        assert!(get("/cgi-bin/token", "grant_type=other&appid=wxA&secret=s").is_none());
        assert!(get("/cgi-bin/token", "grant_type=client_credential&appid=wx.A&secret=s").is_none());
        assert!(get("/cgi-bin/token", "grant_type=client_credential&appid=wxA&secret=").is_none());
        assert!(ask(&Method::POST, "/cgi-bin/token", Some("grant_type=client_credential&appid=wxA&secret=s"), None)
            .is_none());
        assert_eq!(get("/cgi-bin/gettoken", "corpid=ww1&corpsecret=c").map(|a| a.kind), Some(SlotKind::WeCom));
        let stable = |b: &str| ask(&Method::POST, "/cgi-bin/stable_token", None, Some(b.as_bytes()));
        let s = stable(r#"{"grant_type":"client_credential","appid":"wxA","secret":"s"}"#).expect("stable");
        assert_eq!((s.kind, s.force), (SlotKind::Stable, false));
        let f = stable(r#"{"grant_type":"client_credential","appid":"wxA","secret":"s","force_refresh":true}"#);
        assert!(f.expect("forced").force);
        assert!(
            stable(r#"{"grant_type":"client_credential","appid":"wxA","secret":"s","force_refresh":"x"}"#).is_none()
        );
        assert!(format!("{s:?}").find("secret").is_none(), "the secret is never printed");
    }

    #[test]
    fn answers_are_shaped_as_wechat_sends_them() {
        assert_eq!(answer(SlotKind::Token, "T", 60, None), r#"{"access_token":"T","expires_in":60}"#);
        assert_eq!(token_of(br#"{"access_token":"T","expires_in":7200}"#), Some(("T".into(), 7200)));
        assert_eq!(token_of(br#"{"errcode":40125,"errmsg":"invalid appsecret"}"#), None);
        let wecom: serde_json::Value = serde_json::from_str(&answer(SlotKind::WeCom, "T", 5, None)).expect("json");
        assert_eq!(wecom["errcode"], 0);
    }
}
