//! WeChat's token endpoints and quota/get for the mock ([`super::MockWeChat`]):
//! `/cgi-bin/token` (a new token each call, the previous one of the appid
//! invalidated as WeChat does, after an overlap the test chooses),
//! `/cgi-bin/stable_token` (the current token again unless
//! `force_refresh`), WeCom `/cgi-bin/gettoken`, and
//! `/cgi-bin/openapi/quota/get` (the `used` the test sets per path). Any
//! other call is answered by the token it carries: ok, or 40001 for a token
//! the mock never issued or invalidated. Plug it in with
//! `mock.respond(tokens.responder())`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::{MockWeChat, Recorded, Reply};

/// The appid, secret and WeCom corpid, corpsecret every test uses.
pub const APPID: &str = "wxTOKENAPP00001";
pub const SECRET: &str = "SEKRIT_APPSECRET_9f8e7d";
pub const CORPID: &str = "wwTOKENCORP0001";
pub const CORPSECRET: &str = "SEKRIT_CORPSECRET_6c5b4a";
/// A third-party platform, its appsecret, and an account it is authorised for.
pub const PLATFORM: &str = "wxPLATFORM00001";
pub const PLATFORM_SECRET: &str = "SEKRIT_PLATFORM_3e2d1c";
pub const AUTHORIZER: &str = "wxAUTHORIZER001";
pub const REFRESH: &str = "refreshtoken@@@SEKRIT_REFRESH_0a9b8c";

/// The ticket APIs the mock answers (a new ticket each call, counted as
/// fetches at "ticket").
pub const TICKETS: [&str; 3] = ["/cgi-bin/ticket/getticket", "/cgi-bin/get_jsapi_ticket", "/cgi-bin/ticket/get"];

#[derive(Default)]
struct State {
    /// Token → still valid.
    valid: HashMap<String, bool>,
    /// (endpoint, account) → current token.
    current: HashMap<(&'static str, String), String>,
    /// Fetches per endpoint ("token", "stable", "gettoken"), successful or not.
    fetches: HashMap<&'static str, usize>,
    /// quota/get: `used` per cgi_path, calls, and an errcode to answer instead.
    used: HashMap<String, u64>,
    quota_gets: usize,
    /// When each answered quota/get (a valid token, no error) arrived.
    quota_answered: Vec<Instant>,
    quota_errcode: Option<i64>,
    /// quota/get: `daily_limit` per cgi_path (100,000 when not set).
    daily_limit: HashMap<String, u64>,
}

/// The mock's token and quota state; clones share it.
#[derive(Clone, Default)]
pub struct WeChatTokens {
    state: Arc<Mutex<State>>,
    seq: Arc<AtomicU64>,
    /// A new `/cgi-bin/token` invalidates the previous one at once
    /// (WeChat: after 5 minutes; `false` keeps it valid for the test).
    pub invalidate_at_once: bool,
}

impl WeChatTokens {
    pub fn new() -> WeChatTokens {
        WeChatTokens::default()
    }

    /// What the mock answers, for [`super::MockWeChat::respond`].
    pub fn responder(&self) -> impl Fn(&Recorded) -> Reply + Send + Sync + 'static {
        let me = self.clone();
        move |rec| me.reply(rec)
    }

    /// Fetches seen at `endpoint`: "token", "stable" or "gettoken".
    pub fn fetches(&self, endpoint: &str) -> usize {
        self.state.lock().expect("tokens").fetches.get(endpoint).copied().unwrap_or(0)
    }

    /// Every token the mock issued.
    pub fn issued(&self) -> Vec<String> {
        self.state.lock().expect("tokens").valid.keys().cloned().collect()
    }

    /// WeChat invalidates `token` (as a newer fetch elsewhere would).
    pub fn invalidate(&self, token: &str) {
        self.state.lock().expect("tokens").valid.insert(token.to_owned(), false);
    }

    /// quota/get reports `used` calls of `path` today.
    pub fn set_used(&self, path: &str, used: u64) {
        self.state.lock().expect("tokens").used.insert(path.to_owned(), used);
    }

    /// quota/get reports `limit` as the account's day limit of `path`.
    pub fn set_daily_limit(&self, path: &str, limit: u64) {
        self.state.lock().expect("tokens").daily_limit.insert(path.to_owned(), limit);
    }

    /// quota/get answers this errcode (`None`: its quota).
    pub fn fail_quota_get(&self, errcode: Option<i64>) {
        self.state.lock().expect("tokens").quota_errcode = errcode;
    }

    /// quota/get calls seen.
    pub fn quota_gets(&self) -> usize {
        self.state.lock().expect("tokens").quota_gets
    }

    /// When each quota/get that WeChat answered with a count arrived, in
    /// order (quota/gets refused for a bad token or an errcode left out).
    pub fn quota_answered(&self) -> Vec<Instant> {
        self.state.lock().expect("tokens").quota_answered.clone()
    }

    fn fresh(&self, account: &str) -> String {
        let n = self.seq.fetch_add(1, Ordering::SeqCst);
        format!("ACCESSTOKEN_{account}_{n}_{:x}", rand_ish(n))
    }

    fn issue(&self, endpoint: &'static str, account: &str, renew: bool) -> String {
        let mut s = self.state.lock().expect("tokens");
        let key = (endpoint, account.to_owned());
        if !renew {
            if let Some(t) = s.current.get(&key).filter(|t| s.valid.get(*t) == Some(&true)) {
                return t.clone();
            }
        }
        let token = self.fresh(account);
        if let Some(old) = s.current.insert(key, token.clone()) {
            if self.invalidate_at_once {
                s.valid.insert(old, false);
            }
        }
        s.valid.insert(token.clone(), true);
        token
    }

    fn reply(&self, rec: &Recorded) -> Reply {
        let (path, query) = rec.path_and_query.split_once('?').unwrap_or((&rec.path_and_query, ""));
        let param = |name: &str| {
            query.split('&').find_map(|p| p.strip_prefix(name)?.strip_prefix('=')).unwrap_or("").to_owned()
        };
        let count = |endpoint: &'static str| {
            *self.state.lock().expect("tokens").fetches.entry(endpoint).or_default() += 1;
        };
        match path {
            "/cgi-bin/token" => {
                count("token");
                if param("appid") != APPID || param("secret") != SECRET {
                    return json(r#"{"errcode":40125,"errmsg":"invalid appsecret rid: 1"}"#);
                }
                let token = self.issue("token", APPID, true);
                json(&format!(r#"{{"access_token":"{token}","expires_in":7200}}"#))
            }
            "/cgi-bin/stable_token" => {
                count("stable");
                let body: serde_json::Value = serde_json::from_slice(&rec.body).unwrap_or_default();
                if body["appid"] != APPID || body["secret"] != SECRET {
                    return json(r#"{"errcode":40125,"errmsg":"invalid appsecret rid: 2"}"#);
                }
                let token = self.issue("stable", APPID, body["force_refresh"] == true);
                json(&format!(r#"{{"access_token":"{token}","expires_in":7200}}"#))
            }
            "/cgi-bin/gettoken" => {
                count("gettoken");
                if param("corpid") != CORPID || param("corpsecret") != CORPSECRET {
                    return json(r#"{"errcode":40001,"errmsg":"invalid credential"}"#);
                }
                let token = self.issue("gettoken", CORPID, false);
                json(&format!(r#"{{"errcode":0,"errmsg":"ok","access_token":"{token}","expires_in":7200}}"#))
            }
            "/cgi-bin/component/api_component_token" => {
                count("component");
                let body: serde_json::Value = serde_json::from_slice(&rec.body).unwrap_or_default();
                if body["component_appid"] != PLATFORM || body["component_appsecret"] != PLATFORM_SECRET {
                    return json(r#"{"errcode":40125,"errmsg":"invalid appsecret"}"#);
                }
                let token = self.issue("component", PLATFORM, true);
                json(&format!(r#"{{"component_access_token":"{token}","expires_in":7200}}"#))
            }
            "/cgi-bin/component/api_authorizer_token" => {
                count("authorizer");
                let body: serde_json::Value = serde_json::from_slice(&rec.body).unwrap_or_default();
                let valid =
                    self.state.lock().expect("tokens").valid.get(&param("component_access_token")) == Some(&true);
                if !valid || body["authorizer_refresh_token"] != REFRESH {
                    return json(r#"{"errcode":40001,"errmsg":"invalid credential"}"#);
                }
                let token = self.issue("authorizer", AUTHORIZER, true);
                json(&format!(
                    r#"{{"authorizer_access_token":"{token}","expires_in":7200,"authorizer_refresh_token":"{REFRESH}"}}"#
                ))
            }
            _ => {
                let token = param("access_token");
                let mut s = self.state.lock().expect("tokens");
                if s.valid.get(&token) != Some(&true) {
                    return json(
                        r#"{"errcode":40001,"errmsg":"invalid credential, access_token is invalid or not latest"}"#,
                    );
                }
                if TICKETS.contains(&path) {
                    *s.fetches.entry("ticket").or_default() += 1;
                    let n = self.seq.fetch_add(1, Ordering::SeqCst);
                    return json(&format!(
                        r#"{{"errcode":0,"errmsg":"ok","ticket":"TICKET_{n}_{:x}","expires_in":7200}}"#,
                        rand_ish(n)
                    ));
                }
                if path != "/cgi-bin/openapi/quota/get" {
                    return json(r#"{"errcode":0,"errmsg":"ok"}"#);
                }
                s.quota_gets += 1;
                if let Some(code) = s.quota_errcode {
                    return json(&format!(r#"{{"errcode":{code},"errmsg":"mock error"}}"#));
                }
                let body: serde_json::Value = serde_json::from_slice(&rec.body).unwrap_or_default();
                let cgi = body["cgi_path"].as_str().unwrap_or("").to_owned();
                let used = s.used.get(&cgi).copied().unwrap_or(0);
                let limit = s.daily_limit.get(&cgi).copied().unwrap_or(100_000);
                s.quota_answered.push(rec.arrived);
                json(&format!(
                    r#"{{"errcode":0,"errmsg":"ok","quota":{{"daily_limit":{limit},"used":{used},"remain":{}}}}}"#,
                    limit.saturating_sub(used)
                ))
            }
        }
    }
}

fn json(body: &str) -> Reply {
    Reply::Json { body: body.to_owned(), content_type: "application/json; encoding=utf-8" }
}

/// A scrambled number, so tokens look random.
fn rand_ish(n: u64) -> u64 {
    (n ^ 0x9E37_79B9_7F4A_7C15).wrapping_mul(0xBF58_476D_1CE4_E5B9).rotate_left(31)
}

/// A mock WeChat issuing tokens; its token endpoints answer after
/// `delay_ms`, so concurrent askers arrive while a fetch is in flight.
pub async fn mock_wechat(delay_ms: u64) -> (MockWeChat, WeChatTokens) {
    let mock = MockWeChat::start().await;
    let tokens = WeChatTokens::new();
    let reply = tokens.responder();
    mock.respond(move |rec| {
        let r = reply(rec);
        let path = rec.path_and_query.split('?').next().unwrap_or("");
        if ["/cgi-bin/token", "/cgi-bin/stable_token", "/cgi-bin/gettoken"].contains(&path) {
            Reply::Delayed { ms: delay_ms, then: Box::new(r) }
        } else {
            r
        }
    });
    (mock, tokens)
}

/// An `[[account]]` whose secret is in a file of `dir` (`extra`: more keys).
pub fn account_toml(dir: &super::TempDir, id: &str, kind: &str, secret: &str, extra: &str) -> String {
    let file = dir.write_secret(&format!("{id}.secret"), &format!("{secret}\n"));
    format!("[[account]]\nid = \"{id}\"\nkind = \"{kind}\"\nsecret_file = \"{}\"\n{extra}\n", file.display())
}
