//! One request to the simulator, answered as WeChat would: HTTP 200 and a
//! JSON body, except for requests too broken to read (a body over
//! [`MAX_BODY`]: 413).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use ring::rand::{SecureRandom, SystemRandom};
use serde::Deserialize;
use serde_json::json;

use super::config::SimConfig;
use super::scoreboard::Scoreboard;
use super::tokens::{Endpoint, Tokens};
use crate::features::accounts::query::param;
use crate::time::{Clock, Span};

/// Largest request body the simulator reads (media uploads included).
pub const MAX_BODY: usize = 64 << 20;
/// The account of calls that name none (no token it knows, no `appid`).
pub const DEFAULT_ACCOUNT: &str = "default";

/// The simulator's shared state.
pub struct Sim {
    pub config: Arc<SimConfig>,
    pub clock: Arc<dyn Clock>,
    scoreboard: Mutex<Scoreboard>,
    tokens: Mutex<Tokens>,
    random: SystemRandom,
    rids: AtomicU32,
}

/// What a request asks for, once its body and parameters are read.
enum Wanted {
    /// A token for the account: `(endpoint, force_refresh)`.
    Token(Endpoint, bool),
    /// `quota/get` of this path.
    Quota(String),
    /// `clear_quota` of this account.
    Clear(String),
    /// Any other API: `{"errcode":0,"errmsg":"ok"}`.
    Plain,
}

/// The result of reading a request: the account it counts against and what
/// it asks, or WeChat's error for it (counted, against no limit).
type Reading = Result<(String, bool, Wanted), (i64, &'static str)>;

impl Sim {
    pub fn new(config: SimConfig, clock: Arc<dyn Clock>) -> Sim {
        let config = Arc::new(config);
        Sim {
            scoreboard: Mutex::new(Scoreboard::new(config.clone())),
            tokens: Mutex::new(Tokens::default()),
            config,
            clock,
            random: SystemRandom::new(),
            rids: AtomicU32::new(0),
        }
    }

    fn scoreboard(&self) -> MutexGuard<'_, Scoreboard> {
        // A panic while holding the lock leaves plain counters: keep serving them.
        self.scoreboard.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn tokens(&self) -> MutexGuard<'_, Tokens> {
        self.tokens.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Answers one request.
    pub async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let (parts, body) = req.into_parts();
        let path = parts.uri.path().to_owned();
        let query = parts.uri.query().unwrap_or("").to_owned();
        match (path.as_str(), &parts.method) {
            ("/__stats", &Method::GET) => {
                let stats = self.scoreboard().stats(self.clock.now_us());
                return json_response(StatusCode::OK, serde_json::to_vec(&stats).unwrap_or_default());
            }
            ("/__reset", &Method::POST) => {
                self.scoreboard().reset();
                return self.wechat(0, "ok");
            }
            ("/__stats" | "/__reset", _) => {
                let body = br#"{"errcode":-1,"errmsg":"GET /__stats, POST /__reset"}"#.to_vec();
                return json_response(StatusCode::METHOD_NOT_ALLOWED, body);
            }
            _ => {}
        }
        let body = match Limited::new(body, MAX_BODY).collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                let body = format!(r#"{{"errcode":-1,"errmsg":"request body over {MAX_BODY} bytes"}}"#);
                return json_response(StatusCode::PAYLOAD_TOO_LARGE, body.into_bytes());
            }
            // The client went away or broke its framing: nobody reads an answer.
            Err(_) => return json_response(StatusCode::BAD_REQUEST, b"{}".to_vec()),
        };
        let (account, token_ok, wanted) = match self.read(&path, &query, &body) {
            Ok(read) => read,
            Err((code, msg)) => {
                self.scoreboard().other(&path);
                tracing::debug!(%path, errcode = code, "sim refused a malformed call");
                return self.wechat(code, msg);
            }
        };
        let verdict = self.scoreboard().admit(&account, &path, token_ok, self.clock.now_us());
        if let Err(refusal) = verdict {
            tracing::debug!(%path, %account, errcode = refusal.errcode(), "sim refused");
            return self.wechat(refusal.errcode(), refusal.errmsg());
        }
        // In flight from here until dropped, even if the client goes away.
        let _in_flight = InFlight { sim: &self, account: &account, path: &path };
        let latency = self.scoreboard().api(&path).map_or(Span::ZERO, |a| a.latency);
        if latency > Span::ZERO {
            self.clock.sleep(latency).await;
        }
        self.answer(&account, wanted)
    }

    /// The account and what the call asks; WeChat's error for a call that
    /// lacks what its API needs.
    fn read(&self, path: &str, query: &str, body: &[u8]) -> Reading {
        let text = |name: &str| param(query, name).map(|v| String::from_utf8_lossy(&v).into_owned());
        match path {
            "/cgi-bin/token" => {
                if text("grant_type").as_deref() != Some("client_credential") {
                    return Err((40002, "invalid grant_type"));
                }
                let appid = text("appid").ok_or((41002, "appid missing"))?;
                text("secret").ok_or((41004, "appsecret missing"))?;
                Ok((appid, true, Wanted::Token(Endpoint::Token, false)))
            }
            "/cgi-bin/stable_token" => {
                let b: StableBody = serde_json::from_slice(body).map_err(|_| (47001, "data format error"))?;
                if b.grant_type.as_deref() != Some("client_credential") {
                    return Err((40002, "invalid grant_type"));
                }
                let appid = b.appid.filter(|a| !a.is_empty()).ok_or((41002, "appid missing"))?;
                b.secret.filter(|s| !s.is_empty()).ok_or((41004, "appsecret missing"))?;
                Ok((appid, true, Wanted::Token(Endpoint::Stable, b.force_refresh.unwrap_or(false))))
            }
            "/cgi-bin/gettoken" => {
                let corpid = text("corpid").ok_or((41002, "corpid missing"))?;
                text("corpsecret").ok_or((41004, "corpsecret missing"))?;
                Ok((corpid, true, Wanted::Token(Endpoint::Corp, false)))
            }
            "/cgi-bin/clear_quota/v2" => {
                let b: ClearBody = serde_json::from_slice(body).map_err(|_| (47001, "data format error"))?;
                let appid = b.appid.filter(|a| !a.is_empty()).ok_or((41002, "appid missing"))?;
                b.appsecret.filter(|s| !s.is_empty()).ok_or((41004, "appsecret missing"))?;
                Ok((appid.clone(), true, Wanted::Clear(appid)))
            }
            _ => {
                let (account, token_ok) = self.caller(query, &text);
                let wanted = match path {
                    "/cgi-bin/openapi/quota/get" => {
                        let b: QuotaBody = serde_json::from_slice(body).map_err(|_| (47001, "data format error"))?;
                        let cgi_path = b.cgi_path.ok_or((47001, "data format error"))?;
                        if self.scoreboard().api(&cgi_path).and_then(|a| a.limits_of(&account).daily).is_none() {
                            return Err((76021, "cgi_path not found, please check"));
                        }
                        Wanted::Quota(cgi_path)
                    }
                    "/cgi-bin/clear_quota" => {
                        let b: ClearBody = serde_json::from_slice(body).map_err(|_| (47001, "data format error"))?;
                        Wanted::Clear(b.appid.filter(|a| !a.is_empty()).ok_or((41002, "appid missing"))?)
                    }
                    _ => Wanted::Plain,
                };
                Ok((account, token_ok, wanted))
            }
        }
    }

    /// The account of an API call and whether its token passes: the
    /// account a known token was issued to, else the `appid` parameter,
    /// else [`DEFAULT_ACCOUNT`]. A call without `access_token` passes.
    fn caller(&self, query: &str, text: &dyn Fn(&str) -> Option<String>) -> (String, bool) {
        let fallback = || text("appid").unwrap_or_else(|| DEFAULT_ACCOUNT.to_owned());
        let Some(token) = param(query, "access_token") else { return (fallback(), true) };
        let token = String::from_utf8_lossy(&token);
        match self.tokens().account_of(&token, self.clock.now_us()) {
            Some(account) => (account.to_owned(), true),
            None => (fallback(), !self.config.require_token),
        }
    }

    /// The answer of an admitted call.
    fn answer(&self, account: &str, wanted: Wanted) -> Response<Full<Bytes>> {
        match wanted {
            Wanted::Plain => self.wechat(0, "ok"),
            Wanted::Token(endpoint, force) => {
                let now = self.clock.now_us();
                let issued =
                    self.tokens().issue(endpoint, account, force, self.config.token_ttl_us, now, || self.fresh_token());
                let Some((token, expires_in)) = issued else { return self.wechat(-1, "system error") };
                // Field order as WeChat's (the token is of [A-Za-z0-9_-]).
                let body = match endpoint {
                    Endpoint::Corp => {
                        format!(r#"{{"errcode":0,"errmsg":"ok","access_token":"{token}","expires_in":{expires_in}}}"#)
                    }
                    Endpoint::Token | Endpoint::Stable => {
                        format!(r#"{{"access_token":"{token}","expires_in":{expires_in}}}"#)
                    }
                };
                json_response(StatusCode::OK, body.into_bytes())
            }
            Wanted::Quota(path) => {
                let (limit, used) = self.scoreboard().quota(account, &path, self.clock.now_us()).unwrap_or((0, 0));
                let remain = limit.saturating_sub(used);
                let body = format!(
                    r#"{{"errcode":0,"errmsg":"ok","quota":{{"daily_limit":{limit},"used":{used},"remain":{remain}}}}}"#
                );
                json_response(StatusCode::OK, body.into_bytes())
            }
            Wanted::Clear(appid) => {
                self.scoreboard().clear(&appid);
                tracing::info!(%appid, "sim: clear_quota");
                self.wechat(0, "ok")
            }
        }
    }

    /// `{"errcode":N,"errmsg":"..."}` with HTTP 200; an error's message ends
    /// with ` rid: ...` as WeChat's do today.
    fn wechat(&self, errcode: i64, errmsg: &str) -> Response<Full<Bytes>> {
        let errmsg = if errcode == 0 { errmsg.to_owned() } else { format!("{errmsg} rid: {}", self.rid()) };
        json_response(StatusCode::OK, json!({"errcode": errcode, "errmsg": errmsg}).to_string().into_bytes())
    }

    /// A request id shaped like WeChat's: `xxxxxxxx-xxxxxxxx-xxxxxxxx`.
    fn rid(&self) -> String {
        let n = self.rids.fetch_add(1, Ordering::Relaxed);
        let secs = (self.clock.now_us() / 1_000_000) as u32;
        format!("{secs:08x}-{n:08x}-{:08x}", (n ^ secs).wrapping_mul(0x9e37_79b9).rotate_left(16))
    }

    /// 64 random characters of `[A-Za-z0-9_-]` (384 bits).
    fn fresh_token(&self) -> Option<String> {
        const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-";
        let mut bytes = [0u8; 64];
        self.random.fill(&mut bytes).ok()?;
        Some(bytes.iter().map(|b| ALPHABET[(b & 63) as usize] as char).collect())
    }
}

/// An admitted call in flight; dropping it ends it (answered or abandoned).
struct InFlight<'a> {
    sim: &'a Sim,
    account: &'a str,
    path: &'a str,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.sim.scoreboard().finish(self.account, self.path);
    }
}

fn json_response(status: StatusCode, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json; charset=utf-8"));
    resp
}

#[derive(Deserialize)]
struct StableBody {
    grant_type: Option<String>,
    appid: Option<String>,
    secret: Option<String>,
    force_refresh: Option<bool>,
}

#[derive(Deserialize)]
struct QuotaBody {
    cgi_path: Option<String>,
}

#[derive(Deserialize)]
struct ClearBody {
    appid: Option<String>,
    appsecret: Option<String>,
}
