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
