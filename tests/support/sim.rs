//! `wxgate sim` in-process on a free loopback port, on a [`ManualClock`]
//! starting at [`T0`], with a small client for its WeChat-shaped answers.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use wxgate::ops::tools::sim::{SimConfig, SimHandle};
use wxgate::time::ManualClock;

use super::{get_at, send, Answer, T0};

/// A simulator serving limits text; stopped when dropped.
pub struct SimServer {
    pub addr: SocketAddr,
    pub clock: ManualClock,
    _handle: SimHandle,
}

impl SimServer {
    /// Serves `limits` (the TOML of `wxgate sim --limits`) on a manual clock at [`T0`].
    pub async fn start(limits: &str) -> SimServer {
        let mut config = SimConfig::parse(limits, "sim.toml").expect("sim limits");
        config.listen = ([127, 0, 0, 1], 0).into();
        let clock = ManualClock::new(T0);
        let (addr, handle) = wxgate::ops::tools::sim::serve(config, Arc::new(clock.clone())).await.expect("start sim");
        SimServer { addr, clock, _handle: handle }
    }

    /// The simulator as an upstream base URL, `http://127.0.0.1:port`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub async fn get(&self, path_and_query: &str) -> Answer {
        get_at(self.addr, path_and_query).await
    }

    pub async fn post(&self, path_and_query: &str, body: &str) -> Answer {
        post_at(self.addr, path_and_query, body).await
    }

    /// `GET /__stats`.
    pub async fn stats(&self) -> serde_json::Value {
        let a = self.get("/__stats").await;
        assert_eq!(a.status, 200, "/__stats: {}", a.text());
        a.json()
    }

    /// A token from `/cgi-bin/token` for `appid`.
    pub async fn token(&self, appid: &str) -> String {
        let a = self.get(&format!("/cgi-bin/token?grant_type=client_credential&appid={appid}&secret=s")).await;
        a.json()["access_token"].as_str().unwrap_or_else(|| panic!("a token: {}", a.text())).to_owned()
    }

    pub fn advance(&self, d: Duration) {
        self.clock.advance(d);
    }
}

/// A POST of `body` to `path` on the listener at `addr`.
pub async fn post_at(addr: SocketAddr, path: &str, body: &str) -> Answer {
    send(Request::post(format!("http://{addr}{path}")).body(Full::new(Bytes::from(body.to_owned()))).expect("request"))
        .await
}

/// The `errcode` of a WeChat-shaped answer (0 when absent, as in token
/// answers), after checking it is HTTP 200 JSON as WeChat sends it.
pub fn errcode(a: &Answer) -> i64 {
    assert_eq!(a.status, 200, "WeChat answers HTTP 200: {}", a.text());
    assert_eq!(a.header("content-type"), Some("application/json; charset=utf-8"));
    a.json()["errcode"].as_i64().unwrap_or(0)
}

/// One account's answers on one path at the sim, from `/__stats`
/// (`paths[path].accounts[appid]`); all 0 for an account that made no call
/// there since the last reset.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AccountCounts {
    pub arrivals: u64,
    pub ok: u64,
    /// Every 45009: `e45009_day + e45009_window`.
    pub e45009: u64,
    /// 45009 "reach max api daily quota limit".
    pub e45009_day: u64,
    /// 45009 "api freq out of limit".
    pub e45009_window: u64,
    pub e45033: u64,
    /// Calls admitted today (the `used` of `quota/get`); 0 for a path without a day quota.
    pub used_today: u64,
}

/// WeChat's `quota/get` answer: `daily_limit`, `used`, `remain`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    pub daily_limit: u64,
    pub used: u64,
    pub remain: u64,
}

impl SimServer {
    /// What `appid` got on `path` since the last reset.
    pub async fn account(&self, path: &str, appid: &str) -> AccountCounts {
        let stats = self.stats().await;
        let a = &stats["paths"][path]["accounts"][appid];
        let n = |key: &str| a[key].as_u64().unwrap_or(0);
        AccountCounts {
            arrivals: n("arrivals"),
            ok: n("ok"),
            e45009: n("45009"),
            e45009_day: n("45009_day"),
            e45009_window: n("45009_window"),
            e45033: n("45033"),
            used_today: a["day"]["used"].as_u64().unwrap_or(0),
        }
    }

    /// `quota/get` of `cgi_path` for `appid` (named by the `appid` parameter).
    pub async fn quota(&self, appid: &str, cgi_path: &str) -> Quota {
        let body = serde_json::json!({ "cgi_path": cgi_path }).to_string();
        let a = self.post(&format!("/cgi-bin/openapi/quota/get?appid={appid}"), &body).await;
        assert_eq!(errcode(&a), 0, "quota/get: {}", a.text());
        let q = &a.json()["quota"];
        let n = |key: &str| q[key].as_u64().unwrap_or_else(|| panic!("quota/get {key}: {}", a.text()));
        Quota { daily_limit: n("daily_limit"), used: n("used"), remain: n("remain") }
    }
}
