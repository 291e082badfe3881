//! `wxgate sim`, the WeChat API simulator, over real sockets: its limits
//! answer 45009 / 45033 as WeChat does (HTTP 200, JSON), its tokens expire,
//! quota/get and clear_quota agree with what it counted, /__stats counts
//! every answer and the busiest window exactly; wxgate in front of it keeps
//! it at zero 45009 while using the whole limit. Time is a manual clock.

use crate::support;

use std::time::Duration;

use support::process::{run, spawn_args};
use support::sim::{errcode, SimServer};
use support::*;

const SEND: &str = "/cgi-bin/message/custom/send";

fn errmsg(a: &Answer) -> String {
    a.json()["errmsg"].as_str().expect("errmsg").to_owned()
}

#[tokio::test]
async fn a_sliding_window_admits_exactly_its_count() {
    let sim =
        SimServer::start("[[api]]\npath = \"/cgi-bin/message/custom/send\"\nlimits = [{ count = 5, per = \"1m\" }]\n")
            .await;
    // 3 calls now, 2 calls 30 s later: the window is full.
    for _ in 0..3 {
        assert_eq!(errcode(&sim.post(SEND, "{}").await), 0);
    }
    sim.advance(Duration::from_secs(30));
    for _ in 0..2 {
        assert_eq!(errcode(&sim.post(SEND, "{}").await), 0);
    }
    let refused = sim.post(SEND, "{}").await;
    assert_eq!(errcode(&refused), 45009);
    let msg = errmsg(&refused);
    assert!(msg.starts_with("api freq out of limit rid: "), "{msg}");
    // 1 µs before the first 3 leave the window: still full.
    sim.clock.advance_us(30_000_000 - 1);
    assert_eq!(errcode(&sim.post(SEND, "{}").await), 45009);
    // When they leave, exactly 3 more go.
    sim.clock.advance_us(1);
    for _ in 0..3 {
        assert_eq!(errcode(&sim.post(SEND, "{}").await), 0);
    }
    assert_eq!(errcode(&sim.post(SEND, "{}").await), 45009);
    // Another account (appid) has a window of its own.
    assert_eq!(errcode(&sim.post(&format!("{SEND}?appid=wxB"), "{}").await), 0);
}

#[tokio::test]
async fn a_daily_quota_resets_when_its_short_day_ends() {
    let limits =
        "[sim]\nday_length = \"1m\"\n[[api]]\npath = \"/cgi-bin/user/get\"\nlimits = [{ count = 3, per = \"day\" }]\n";
    let sim = SimServer::start(limits).await;
    // T0 is 10:00 Beijing: a day of one minute starts there.
    assert_eq!(sim.stats().await["day_ends_in_ms"], 60_000);
    for _ in 0..3 {
        assert_eq!(errcode(&sim.get("/cgi-bin/user/get").await), 0);
    }
    let refused = sim.get("/cgi-bin/user/get").await;
    assert_eq!(errcode(&refused), 45009);
    assert!(errmsg(&refused).starts_with("reach max api daily quota limit rid: "), "{}", errmsg(&refused));
    sim.advance(Duration::from_secs(59));
    assert_eq!(errcode(&sim.get("/cgi-bin/user/get").await), 45009, "the same day");
    sim.advance(Duration::from_secs(1));
    for _ in 0..3 {
        assert_eq!(errcode(&sim.get("/cgi-bin/user/get").await), 0, "a new day");
    }
    assert_eq!(errcode(&sim.get("/cgi-bin/user/get").await), 45009);
}

#[tokio::test]
async fn calls_beyond_the_concurrency_cap_get_45033() {
    let limits = "[[api]]\npath = \"/cgi-bin/user/info\"\nconcurrency = 2\nlatency = \"1s\"\n";
    let sim = SimServer::start(limits).await;
    let addr = sim.addr;
    let slow: Vec<_> = (0..2).map(|_| tokio::spawn(async move { get_at(addr, "/cgi-bin/user/info").await })).collect();
    eventually_some_async("2 calls in flight at the sim", PATIENCE, async || {
        (sim.stats().await["paths"]["/cgi-bin/user/info"]["in_flight"] == 2).then_some(())
    })
    .await;
    let refused = sim.get("/cgi-bin/user/info").await;
    assert_eq!(errcode(&refused), 45033);
    assert!(errmsg(&refused).starts_with("api concurrent out of limit rid: "), "{}", errmsg(&refused));
    // Their simulated second passes: both answer, and the slots are free again.
    sim.advance(Duration::from_secs(1));
    for call in slow {
        assert_eq!(errcode(&call.await.expect("call")), 0);
    }
    let late = tokio::spawn(async move { get_at(addr, "/cgi-bin/user/info").await });
    eventually_some_async("a call in flight again", PATIENCE, async || {
        (sim.stats().await["paths"]["/cgi-bin/user/info"]["in_flight"] == 1).then_some(())
    })
    .await;
    sim.advance(Duration::from_secs(1));
    assert_eq!(errcode(&late.await.expect("call")), 0);
    let p = &sim.stats().await["paths"]["/cgi-bin/user/info"];
    assert_eq!((p["arrivals"].as_u64(), p["ok"].as_u64(), p["45033"].as_u64()), (Some(4), Some(3), Some(1)));
    assert_eq!(p["max_in_flight"], 2);
}

#[tokio::test]
async fn issued_tokens_work_until_they_expire_and_unknown_ones_get_40001() {
    let sim = SimServer::start("[sim]\ntoken_ttl = \"10m\"\n").await;
    let a = sim.get("/cgi-bin/token?grant_type=client_credential&appid=wxA&secret=s").await;
    assert_eq!(errcode(&a), 0);
    assert_eq!(a.json()["expires_in"], 600);
    assert!(a.json().get("errcode").is_none(), "like WeChat, a token answer has no errcode: {}", a.text());
    let token = a.json()["access_token"].as_str().expect("token").to_owned();
    assert_eq!(errcode(&sim.post(&format!("{SEND}?access_token={token}"), "{}").await), 0);
    let bogus = sim.post(&format!("{SEND}?access_token=not-issued-here"), "{}").await;
    assert_eq!(errcode(&bogus), 40001);
    assert!(errmsg(&bogus).starts_with("invalid credential"), "{}", errmsg(&bogus));
    // A second /cgi-bin/token call replaces the token: the old one lives 5 more minutes.
    sim.advance(Duration::from_secs(60));
    let newer = sim.token("wxA").await;
    assert_ne!(newer, token);
    sim.advance(Duration::from_secs(299));
    assert_eq!(errcode(&sim.post(&format!("{SEND}?access_token={token}"), "{}").await), 0);
    sim.advance(Duration::from_secs(1));
    assert_eq!(errcode(&sim.post(&format!("{SEND}?access_token={token}"), "{}").await), 40001, "replaced");
    // The new one expires after its 10 minutes.
    sim.advance(Duration::from_secs(299));
    assert_eq!(errcode(&sim.post(&format!("{SEND}?access_token={newer}"), "{}").await), 0);
    sim.advance(Duration::from_secs(1));
    assert_eq!(errcode(&sim.post(&format!("{SEND}?access_token={newer}"), "{}").await), 40001, "expired");

    // stable_token gives the same token while it is fresh; WeCom's gettoken answers errcode 0.
    let body = r#"{"grant_type":"client_credential","appid":"wxA","secret":"s"}"#;
    let s1 = sim.post("/cgi-bin/stable_token", body).await.json();
    sim.advance(Duration::from_secs(60));
    let s2 = sim.post("/cgi-bin/stable_token", body).await.json();
    assert_eq!(
        (&s1["access_token"], s1["expires_in"].as_i64(), s2["expires_in"].as_i64()),
        (&s2["access_token"], Some(600), Some(540))
    );
    let corp = sim.get("/cgi-bin/gettoken?corpid=ww1&corpsecret=s").await;
    assert_eq!((errcode(&corp), corp.json()["expires_in"].as_i64()), (0, Some(600)));
    assert_eq!(errcode(&sim.get("/cgi-bin/token?grant_type=client_credential&secret=s").await), 41002);
    let p = &sim.stats().await["paths"][SEND];
    assert_eq!((p["ok"].as_u64(), p["40001"].as_u64()), (Some(3), Some(3)));
}

#[tokio::test]
async fn with_require_token_false_any_token_passes_and_issued_ones_keep_their_account() {
    let limits = "[sim]\nrequire_token = false\n[[api]]\npath = \"/cgi-bin/message/custom/send\"\nlimits = [{ count = 1, per = \"day\" }]\n";
    let sim = SimServer::start(limits).await;
    assert_eq!(errcode(&sim.post(&format!("{SEND}?access_token=anything"), "{}").await), 0);
    assert_eq!(
        errcode(&sim.post(&format!("{SEND}?access_token=other"), "{}").await),
        45009,
        "both the default account"
    );
    let token = sim.token("wxA").await;
    assert_eq!(errcode(&sim.post(&format!("{SEND}?access_token={token}"), "{}").await), 0, "wxA's own quota");
}

/// `quota/get` of the send API with `token`.
async fn quota(sim: &SimServer, token: &str) -> Answer {
    let body = r#"{"cgi_path":"/cgi-bin/message/custom/send"}"#;
    sim.post(&format!("/cgi-bin/openapi/quota/get?access_token={token}"), body).await
}

#[tokio::test]
async fn quota_get_reports_each_account_s_day_and_clear_quota_resets_it() {
    let limits = "[[api]]\npath = \"/cgi-bin/message/custom/send\"\nlimits = [{ count = 10, per = \"day\" }]\n";
    let sim = SimServer::start(limits).await;
    let (a, b) = (sim.token("wxA").await, sim.token("wxB").await);
    for _ in 0..4 {
        assert_eq!(errcode(&sim.post(&format!("{SEND}?access_token={a}"), "{}").await), 0);
    }
    assert_eq!(errcode(&sim.post(&format!("{SEND}?access_token={b}"), "{}").await), 0);
    let q = quota(&sim, &a).await;
    assert_eq!(errcode(&q), 0);
    assert_eq!(q.text(), r#"{"errcode":0,"errmsg":"ok","quota":{"daily_limit":10,"used":4,"remain":6}}"#);
    assert_eq!(quota(&sim, &b).await.json()["quota"]["used"], 1);
    let unknown =
        sim.post(&format!("/cgi-bin/openapi/quota/get?access_token={a}"), r#"{"cgi_path":"/cgi-bin/nope"}"#).await;
    assert_eq!(errcode(&unknown), 76021);
    assert_eq!(errcode(&sim.post(&format!("/cgi-bin/openapi/quota/get?access_token={a}"), "not json").await), 47001);

    let cleared = sim.post(&format!("/cgi-bin/clear_quota?access_token={a}"), r#"{"appid":"wxA"}"#).await;
    assert_eq!(cleared.text(), r#"{"errcode":0,"errmsg":"ok"}"#);
    assert_eq!(quota(&sim, &a).await.json()["quota"]["used"], 0);
    assert_eq!(quota(&sim, &b).await.json()["quota"]["used"], 1, "only wxA's counts were cleared");
    for _ in 0..10 {
        assert_eq!(errcode(&sim.post(&format!("{SEND}?access_token={a}"), "{}").await), 0);
    }
    assert_eq!(errcode(&sim.post(&format!("{SEND}?access_token={a}"), "{}").await), 45009);
    assert_eq!(quota(&sim, &a).await.json()["quota"]["remain"], 0, "a refused call does not count");
}

/// `[[api.account]]`: wxB's own windows and day quota replace the path's for
/// wxB alone; quota/get reports them; /__stats counts each account apart.
#[tokio::test]
async fn an_account_with_its_own_limits_is_refused_at_them_and_quota_get_reports_them() {
    let limits = "[sim]\nrequire_token = true\n\n[[api]]\npath = \"/cgi-bin/message/custom/send\"\nlimits = [{ count = 5, per = \"1m\" }, { count = 100, per = \"day\" }]\n\n[[api.account]]\nappid = \"wxB\"\nlimits = [{ count = 2, per = \"1m\" }, { count = 3, per = \"day\" }]\n\n[[api.account]]\nappid = \"wxC\"\nlimits = [{ count = 7, per = \"day\" }]\n";
    let sim = SimServer::start(limits).await;
    let b = sim.token("wxB").await;
    let send_b = format!("{SEND}?access_token={b}");
    // wxB: its own window of 2 a minute...
    assert_eq!(errcode(&sim.post(&send_b, "{}").await), 0);
    assert_eq!(errcode(&sim.post(&send_b, "{}").await), 0);
    let window = sim.post(&send_b, "{}").await;
    assert_eq!(errcode(&window), 45009);
    assert!(errmsg(&window).starts_with("api freq out of limit"), "{}", errmsg(&window));
    // ... and its own day quota of 3.
    sim.advance(Duration::from_secs(60));
    assert_eq!(errcode(&sim.post(&send_b, "{}").await), 0);
    let day = sim.post(&send_b, "{}").await;
    assert_eq!(errcode(&day), 45009);
    assert!(errmsg(&day).starts_with("reach max api daily quota limit"), "{}", errmsg(&day));
    let q = quota(&sim, &b).await;
    assert_eq!(q.text(), r#"{"errcode":0,"errmsg":"ok","quota":{"daily_limit":3,"used":3,"remain":0}}"#);

    // wxA keeps the path's limits: 5 a minute, 100 a day.
    for _ in 0..5 {
        assert_eq!(errcode(&sim.post(&format!("{SEND}?appid=wxA"), "{}").await), 0);
    }
    assert_eq!(errcode(&sim.post(&format!("{SEND}?appid=wxA"), "{}").await), 45009);
    assert_eq!(sim.quota("wxA", SEND).await, support::sim::Quota { daily_limit: 100, used: 5, remain: 95 });
    // wxC has a day quota of its own and no window.
    for _ in 0..7 {
        assert_eq!(errcode(&sim.post(&format!("{SEND}?appid=wxC"), "{}").await), 0);
    }
    assert_eq!(errcode(&sim.post(&format!("{SEND}?appid=wxC"), "{}").await), 45009);
    assert_eq!(sim.quota("wxC", SEND).await, support::sim::Quota { daily_limit: 7, used: 7, remain: 0 });

    let got = sim.account(SEND, "wxB").await;
    let want = support::sim::AccountCounts {
        arrivals: 5,
        ok: 3,
        e45009: 2,
        e45009_day: 1,
        e45009_window: 1,
        e45033: 0,
        used_today: 3,
    };
    assert_eq!(got, want);
    let a = sim.account(SEND, "wxA").await;
    assert_eq!((a.ok, a.e45009_window, a.e45009_day, a.used_today), (5, 1, 0, 5));
    assert_eq!(sim.account(SEND, "wxD").await, support::sim::AccountCounts::default(), "no call, no own limits");
    let p = &sim.stats().await["paths"][SEND];
    assert_eq!(p["accounts"]["wxB"]["own_limits"], true);
    assert_eq!(p["accounts"]["wxA"]["own_limits"], false);
    assert_eq!(p["accounts"]["wxB"]["windows"][0]["limit"], "2 per 1m");
    assert_eq!(p["accounts"]["wxB"]["windows"][0]["worst_admitted"], 2);
    assert_eq!(p["accounts"]["wxB"]["day"], serde_json::json!({"daily_limit": 3, "used": 3}));
    // The path's window is that of the accounts on its limits: wxA's 5.
    assert_eq!(p["windows"][0]["worst_admitted"], 5);
    assert_eq!((p["ok"].as_u64(), p["45009"].as_u64()), (Some(15), Some(4)));

    // A new day: wxB's own quota starts again.
    sim.advance(Duration::from_secs(86_400));
    let b = sim.token("wxB").await;
    for _ in 0..2 {
        assert_eq!(errcode(&sim.post(&format!("{SEND}?access_token={b}"), "{}").await), 0);
    }
    assert_eq!(quota(&sim, &b).await.json()["quota"]["used"], 2);
    // After a reset, /__stats lists an account with limits of its own (as
    // quota/get would answer it), and others once they call again.
    assert_eq!(errcode(&sim.post("/__reset", "").await), 0);
    let p = &sim.stats().await["paths"][SEND];
    assert_eq!(p["accounts"]["wxC"]["day"], serde_json::json!({"daily_limit": 7, "used": 0}), "{p}");
    assert!(p["accounts"].get("wxA").is_none(), "{p}");
}

#[tokio::test]
async fn stats_count_every_answer_and_the_busiest_window_exactly() {
    let limits = "[[api]]\npath = \"/cgi-bin/message/custom/send\"\nlimits = [{ count = 4, per = \"10s\" }]\n";
    let sim = SimServer::start(limits).await;
    // Arrivals at 0, 0, 0, 3, 3, 7, 9.9, 10, 12 s: admitted while fewer than 4
    // were admitted in the last 10 s.
    let steps = [0, 0, 0, 3000, 0, 4000, 2900, 100, 2000];
    let mut codes = Vec::new();
    for ms in steps {
        sim.advance(Duration::from_millis(ms));
        codes.push(errcode(&sim.post(SEND, "{}").await));
    }
    assert_eq!(codes, [0, 0, 0, 0, 45009, 45009, 45009, 0, 0]);
    sim.get("/cgi-bin/menu/get").await; // a path without limits: counted too
    sim.post(&format!("{SEND}?access_token=bogus"), "{}").await;
    let s = sim.stats().await;
    let p = &s["paths"][SEND];
    assert_eq!(
        [&p["arrivals"], &p["ok"], &p["45009"], &p["45033"], &p["40001"]],
        [10, 6, 3, 0, 1].map(serde_json::Value::from).each_ref()
    );
    let w = &p["windows"][0];
    assert_eq!((w["limit"].as_str(), w["worst_admitted"].as_u64()), (Some("4 per 10s"), Some(4)));
    // The busiest 10 s of arrivals: [0, 10) held 7 of them (0, 0, 0, 3, 3, 7, 9.9).
    assert_eq!(w["worst_arrivals"], 7);
    assert_eq!(s["paths"]["/cgi-bin/menu/get"]["ok"], 1);
    assert_eq!(s["totals"]["arrivals"], 11);
    assert_eq!(s["totals"]["ok"], 7);

    let reset = sim.post("/__reset", "").await;
    assert_eq!(reset.text(), r#"{"errcode":0,"errmsg":"ok"}"#);
    let s = sim.stats().await;
    assert_eq!(s["totals"]["arrivals"], 0);
    assert_eq!(s["paths"][SEND]["windows"][0]["worst_admitted"], 0);
    assert!(s["paths"].get("/cgi-bin/menu/get").is_none());
    for _ in 0..4 {
        assert_eq!(errcode(&sim.post(SEND, "{}").await), 0, "the limits start again too");
    }
}

/// The point of wxgate, seen from WeChat's side: the same traffic that gets
/// 45009s straight from the sim gets none through wxgate, which still uses
/// the whole limit (20 calls in the busiest minute).
#[tokio::test]
async fn wxgate_in_front_keeps_the_sim_at_zero_45009_while_using_the_whole_limit() {
    let limits = "[[api]]\npath = \"/cgi-bin/message/custom/send\"\nlimits = [{ count = 20, per = \"1m\" }]\n";
    let sim = SimServer::start(limits).await;
    let gate = Gate::start_text(ConfigToml::new(&sim.url()).with(rule("send").matching(SEND).limit(20, "1m"))).await;
    // 2 calls a second for 80 s (160 calls, 6 times the limit); wxgate's
    // clock and the sim's move together.
    let mut forwarded = 0;
    for _ in 0..80 {
        for _ in 0..2 {
            let a = gate.post(SEND, "{}").await;
            match a.status.as_u16() {
                200 => {
                    assert_eq!(a.json()["errcode"], 0, "the sim admitted it: {}", a.text());
                    forwarded += 1;
                }
                429 => {}
                other => panic!("unexpected {other}: {}", a.text()),
            }
        }
        gate.advance(Duration::from_secs(1));
        sim.advance(Duration::from_secs(1));
    }
    let p = sim.stats().await["paths"][SEND].clone();
    assert_eq!(p["45009"], 0, "wxgate kept WeChat from refusing any call: {p}");
    assert_eq!(p["arrivals"], forwarded);
    assert_eq!(p["windows"][0]["worst_admitted"], 20, "the whole limit was used: {p}");
    assert!(forwarded > 20, "more than the first minute's 20 went through: {forwarded}");
    println!("through wxgate: 160 calls, {forwarded} forwarded, 0 45009 at the sim, busiest minute 20");

    // The same traffic straight at the sim: everything over 20 a minute is a 45009.
    assert_eq!(errcode(&sim.post("/__reset", "").await), 0);
    for _ in 0..80 {
        for _ in 0..2 {
            sim.post(SEND, "{}").await;
        }
        sim.advance(Duration::from_secs(1));
    }
    // 20 in the first 10 s; 20 more at 60-69 s, as those leave the window.
    let p = sim.stats().await["paths"][SEND].clone();
    assert_eq!((p["ok"].as_u64(), p["45009"].as_u64()), (Some(40), Some(120)), "{p}");
    assert_eq!(p["windows"][0]["worst_arrivals"], 120);
    println!("straight at the sim: 160 calls, 40 ok, 120 45009, busiest minute 120 arrivals");
}

#[test]
fn deploy_sim_toml_is_the_built_in_demo() {
    let shipped =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/sim.toml")).expect("deploy/sim.toml");
    assert_eq!(
        shipped,
        wxgate::ops::tools::sim::config::DEMO,
        "deploy/sim.toml and src/ops/tools/sim/demo.toml must stay the same"
    );
}

/// The binary: `wxgate sim` needs no rules config, serves the built-in demo,
/// and refuses a bad limits file naming its line and key.
#[tokio::test]
async fn the_binary_serves_the_demo_without_a_rules_config() {
    let sim = spawn_args(&["--config", "/nonexistent/rules.toml", "sim", "--listen", "127.0.0.1:0"], &[])
        .expect("wxgate sim starts");
    let stats = sim.get("/__stats").await.json();
    assert_eq!(stats["day_length_ms"], 300_000, "the demo's 5-minute day");
    assert!(stats["paths"].get(SEND).is_some(), "{stats}");
    let small = &stats["paths"]["/cgi-bin/message/template/send"]["accounts"]["wxsmall"];
    assert_eq!(
        small["day"],
        serde_json::json!({"daily_limit": 20, "used": 0}),
        "the demo's own-limits account: {stats}"
    );
    let a = sim.get("/cgi-bin/token?grant_type=client_credential&appid=wxdemo&secret=s").await;
    assert_eq!(a.json()["expires_in"], 7200, "{}", a.text());
    assert_eq!(errcode(&support::sim::post_at(sim.addr, SEND, "{}").await), 0);
    let log = sim.stop().await;
    assert!(log.contains("wxgate sim serving") && log.contains("limits=built-in demo"), "{log}");

    let dir = TempDir::new("sim-limits");
    let bad = dir.write(
        "sim.toml",
        "[sim]\nday_length = \"5m\"\n\n[[api]]\npath = \"/a\"\nlimits = [{ count = 5, per = \"fortnight\" }]\n",
    );
    let (code, _, err) = run(&["sim", "--limits", bad.to_str().expect("path")], &[]);
    assert_eq!(code, 2, "{err}");
    let want = format!("wxgate sim: invalid limits: {}:4: [[api]] \"/a\": limits[0]: per: ", bad.display());
    assert!(err.starts_with(&want), "{err}");
}
