//! Each account's real quota (README "Each account's real quota",
//! docs/configuration.md `learn`): the day limit WeChat's quota/get reports
//! for an account becomes that account's day quota, on every store and
//! every instance, so an account whose quota is lower than the rule's is
//! never sent into a 45009. The WeChat here is `wxgate sim` with a lower
//! quota for one account; time is a manual clock.

use crate::support;

use support::redis_server::{RedisCluster, RedisServer};
use support::sim::SimServer;
use support::*;

const SEND: &str = "/cgi-bin/message/template/send";

/// WeChat: 100 template messages a day per account, but wxB's quota is 30.
const SIM: &str = r#"
[sim]
day_length = "24h"
require_token = true

[[api]]
path = "/cgi-bin/message/template/send"
limits = [{ count = 100, per = "day" }]

[[api.account]]
appid = "wxB"
limits = [{ count = 30, per = "day" }]
"#;

/// wxgate's rules: the same 100 a day for every account, synced hourly.
fn rules() -> String {
    let token = rule("token").matching("/cgi-bin/token").limit(2000, "day");
    let send = rule("send").matching(SEND).limit(100, "day").set("quota_sync", "1h");
    format!("{token}\n{send}\n[tokens]\ncache = true\n")
}

enum Store {
    Memory,
    Redis(RedisServer),
    Cluster(RedisCluster),
}

/// The gates of a run: one on the memory store, two on Redis or a Cluster.
async fn gates(sim: &SimServer, store: &Store) -> Vec<Gate> {
    let base = ConfigToml::new(&sim.url()).with(rules());
    match store {
        Store::Memory => vec![Gate::start_text(base).await],
        Store::Redis(redis) => {
            let text = base.with(StoreToml::redis(&redis.url())).to_string();
            vec![Gate::start_redis_on_manual_clock(&text).await, Gate::start_redis_on_manual_clock(&text).await]
        }
        Store::Cluster(cluster) => {
            let text = base.with(StoreToml::redis_cluster(cluster.urls())).to_string();
            vec![Gate::start_redis_on_manual_clock(&text).await, Gate::start_redis_on_manual_clock(&text).await]
        }
    }
}

async fn bucket(gate: &Gate, account: &str) -> serde_json::Value {
    let a = get_at(gate.admin_addr(), &format!("/v1/buckets/{account}/send")).await;
    assert_eq!(a.status, 200, "{}", a.text());
    a.json()
}

/// Two accounts on one rule of 100 a day; WeChat gives wxB 30. Once the
/// first sync has asked quota/get, wxB gets exactly 30 through (whichever
/// instance its calls go through) and WeChat answers no 45009; wxA still
/// gets 100.
async fn each_account_gets_its_own_day_quota(store: Store) {
    let sim = SimServer::start(SIM).await;
    let gates = gates(&sim, &store).await;
    // The services fetch their tokens through wxgate's token cache: the
    // first instance knows them, and syncs at once.
    let mut tokens = Vec::new();
    for appid in ["wxA", "wxB"] {
        let a = gates[0].get(&format!("/cgi-bin/token?grant_type=client_credential&appid={appid}&secret=s")).await;
        tokens.push(a.json()["access_token"].as_str().unwrap_or_else(|| panic!("a token: {}", a.text())).to_owned());
    }
    eventually_async("wxB's day limit learned", PATIENCE, async || {
        bucket(&gates[0], "wxB").await["limits"][0]["count"] == 30
    })
    .await;
    let b = bucket(&gates[0], "wxB").await;
    let day = &b["limits"][0];
    assert_eq!((day["configured"].as_u64(), day["learned"]["count"].as_u64()), (Some(100), Some(30)), "{b}");
    assert_eq!(
        (day["learned"]["source"].as_str(), day["learned"]["applies"].as_bool()),
        (Some("quota_get"), Some(true))
    );
    let a = bucket(&gates[0], "wxA").await;
    assert_eq!(a["limits"][0]["count"], 100, "wxA keeps the rule's: {a}");
    assert_eq!(gates[0].metric(r#"wxgate_quota_learned_total{rule="send",direction="down"}"#).await, Some(1.0));

    // 120 messages per account, spread over the instances.
    let mut sent = [0u32; 2];
    for i in 0..240 {
        let who = i % 2;
        let gate = &gates[(i / 2) % gates.len()];
        let answer = gate.post(&format!("{SEND}?access_token={}", tokens[who]), "{}").await;
        if answer.status == 200 && answer.json()["errcode"] == 0 {
            sent[who] += 1;
        } else {
            assert_eq!(answer.status, 429, "refused by wxgate, not WeChat: {}", answer.text());
            assert_eq!(answer.header("x-wxgate-reason"), Some("quota"), "{}", answer.text());
        }
    }
    assert_eq!(sent, [100, 30], "wxA its 100, wxB its 30");
    let (at_a, at_b) = (sim.account(SEND, "wxA").await, sim.account(SEND, "wxB").await);
    assert_eq!((at_a.ok, at_a.e45009), (100, 0), "{at_a:?}");
    assert_eq!((at_b.ok, at_b.e45009), (30, 0), "{at_b:?}");
    // The forecast is of each account's own day limit: wxB's 30 are spent.
    let b = bucket(&gates[0], "wxB").await;
    let f = &b["forecast"];
    assert_eq!(
        (f["day_limit"].as_u64(), f["used"].as_u64(), f["used_fraction"].as_f64()),
        (Some(30), Some(30), Some(1.0)),
        "{b}"
    );
    assert_eq!(f["runs_out_in_seconds"], 0.0, "spent: {b}");
    assert_eq!(bucket(&gates[0], "wxA").await["forecast"]["day_limit"], 100);
}

#[tokio::test]
async fn each_account_gets_its_own_day_quota_on_the_memory_store() {
    each_account_gets_its_own_day_quota(Store::Memory).await;
}

#[tokio::test]
async fn each_account_gets_its_own_day_quota_through_two_instances_on_redis() {
    each_account_gets_its_own_day_quota(Store::Redis(RedisServer::start())).await;
}

#[tokio::test]
async fn each_account_gets_its_own_day_quota_through_two_instances_on_a_cluster() {
    each_account_gets_its_own_day_quota(Store::Cluster(RedisCluster::start(3))).await;
}

/// A 45009 says "limit" without saying which: a day quota or a frequency
/// limit. wxgate asks quota/get at once (not at the next hourly sync): it
/// reports the day spent (30 of 30), so the account's day limit is 30 and
/// nothing more is sent today, when the penalty ends or after.
#[tokio::test]
async fn a_45009_is_checked_with_quota_get_at_once_and_a_spent_day_stops_the_account() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use support::tokens::{WeChatTokens, APPID, SECRET};
    let mock = MockWeChat::start().await;
    let tokens = WeChatTokens::new();
    let reply = tokens.responder();
    // WeChat gives this account 30 a day, and answers the 31st with 45009.
    let sends = Arc::new(AtomicU64::new(0));
    let seen = sends.clone();
    mock.respond(move |rec| {
        if rec.path_and_query.starts_with(SEND) && seen.fetch_add(1, Ordering::SeqCst) >= 30 {
            return Reply::Json {
                body: r#"{"errcode":45009,"errmsg":"reach max api daily quota limit rid: 1"}"#.into(),
                content_type: "application/json",
            };
        }
        reply(rec)
    });
    let gate = Gate::start(&mock, rules()).await;
    // The first sync fails (WeChat busy): no limit learned before the calls.
    tokens.fail_quota_get(Some(-1));
    let a = gate.get(&format!("/cgi-bin/token?grant_type=client_credential&appid={APPID}&secret={SECRET}")).await;
    let token = a.json()["access_token"].as_str().unwrap_or_else(|| panic!("a token: {}", a.text())).to_owned();
    eventually("the first sync failed", PATIENCE, || tokens.quota_gets() == 1).await;
    tokens.fail_quota_get(None);
    tokens.set_daily_limit(SEND, 30);
    tokens.set_used(SEND, 30);
    let path = format!("{SEND}?access_token={token}");
    for _ in 0..30 {
        assert_eq!(gate.post(&path, "{}").await.status, 200);
    }
    let refused = gate.post(&path, "{}").await;
    assert_eq!((refused.status.as_u16(), refused.json()["errcode"].as_i64()), (429, Some(45009)), "{}", refused.text());
    eventually_async("quota/get asked at once, the day limit learned", PATIENCE, async || {
        let a = get_at(gate.admin_addr(), &format!("/v1/buckets/{APPID}/send")).await;
        a.json()["limits"][0]["count"] == 30
    })
    .await;
    let b = get_at(gate.admin_addr(), &format!("/v1/buckets/{APPID}/send")).await.json();
    assert_eq!(tokens.quota_gets(), 2, "one check, not waiting for the hourly sync: {b}");
    // The penalty (60 s) over: still nothing today, refused by wxgate.
    gate.advance(std::time::Duration::from_secs(61));
    for _ in 0..5 {
        let a = gate.post(&path, "{}").await;
        assert_eq!((a.status.as_u16(), a.header("x-wxgate-reason")), (429, Some("quota")), "{}", a.text());
    }
    assert_eq!(sends.load(Ordering::SeqCst), 31, "WeChat saw one 45009 and nothing after it");
}

/// A learned day limit is part of the pair's state: the memory store keeps
/// it through a restart (its state file), with no sync needed to know it.
#[tokio::test]
async fn a_learned_day_limit_outlives_a_restart_of_the_memory_store() {
    use support::tokens::{mock_wechat, APPID, SECRET};
    let (mock, tokens) = mock_wechat(0).await;
    tokens.set_daily_limit(SEND, 30);
    let dir = TempDir::new("learned-restart");
    let config = ConfigToml::new(&mock.url()).with(StoreToml::memory().set("flush_interval", "20ms")).with(rules());
    let path = dir.write("wxgate.toml", &config.to_string());
    let gate = Gate::start_file(&path).await;
    let a = gate.get(&format!("/cgi-bin/token?grant_type=client_credential&appid={APPID}&secret={SECRET}")).await;
    let token = a.json()["access_token"].as_str().unwrap_or_else(|| panic!("a token: {}", a.text())).to_owned();
    let bucket = async |gate: &Gate| get_at(gate.admin_addr(), &format!("/v1/buckets/{APPID}/send")).await.json();
    eventually_async("the day limit learned", PATIENCE, async || bucket(&gate).await["limits"][0]["count"] == 30).await;
    // WeChat's quota/get fails from now on: only the state can know.
    tokens.fail_quota_get(Some(-1));
    let gate = gate.restart().await;
    let b = bucket(&gate).await;
    assert_eq!(
        (b["limits"][0]["count"].as_u64(), b["limits"][0]["learned"]["count"].as_u64()),
        (Some(30), Some(30)),
        "{b}"
    );
    let path = format!("{SEND}?access_token={token}");
    for _ in 0..30 {
        assert_eq!(gate.post(&path, "{}").await.status, 200);
    }
    let a = gate.post(&path, "{}").await;
    assert_eq!((a.status.as_u16(), a.header("x-wxgate-reason")), (429, Some("quota")), "{}", a.text());
}

/// WeChat's window for this account is 60 a minute; the rule says 100.
/// The first 45009 lowers the pair's window (to 90 % of what went through
/// in the minute before it): for the rest of the run WeChat answers no
/// other 45009, and the account still sends more than 85 % of its 60.
async fn a_window_wechat_enforces_lower_is_learned_from_the_first_45009(store: Store) {
    let sim = SimServer::start(
        "[sim]\nrequire_token = false\n[[api]]\npath = \"/cgi-bin/message/custom/send\"\nlimits = [{ count = 60, per = \"1m\" }]\n",
    )
    .await;
    let send = rule("send").matching("/cgi-bin/message/custom/send").limit(100, "1m");
    let base = ConfigToml::new(&sim.url()).with(send);
    let gate = match &store {
        Store::Memory => Gate::start_text(base).await,
        Store::Redis(redis) => Gate::start_redis_on_manual_clock(base.with(StoreToml::redis(&redis.url()))).await,
        Store::Cluster(cluster) => {
            Gate::start_redis_on_manual_clock(base.with(StoreToml::redis_cluster(cluster.urls()))).await
        }
    };
    let step = std::time::Duration::from_millis(100);
    let mut late_ok = 0;
    // Six minutes, as fast as wxgate lets calls through, 100 ms at a time.
    for i in 0..3600 {
        for _ in 0..3 {
            let a = gate.post("/cgi-bin/message/custom/send", "{}").await;
            if a.status != 200 {
                break;
            }
            if i >= 1200 && a.json()["errcode"] == 0 {
                late_ok += 1;
            }
        }
        gate.advance(step);
        sim.advance(step);
    }
    let at_sim = sim.account("/cgi-bin/message/custom/send", "default").await;
    assert_eq!(at_sim.e45009, 1, "one 45009, none after it: {at_sim:?}");
    // The last four minutes: at least 85 % of WeChat's 240.
    assert!(late_ok >= 204, "{late_ok} sent in the last four minutes");
    let b = get_at(gate.admin_addr(), "/v1/buckets/default/send").await.json();
    let window = &b["limits"][0];
    assert_eq!(
        (window["configured"].as_u64(), window["learned"]["source"].as_str()),
        (Some(100), Some("errcode_45009")),
        "{b}"
    );
    assert!(window["count"].as_u64().is_some_and(|n| n < 60), "{b}");
    assert_eq!(gate.metric(r#"wxgate_quota_learned_total{rule="send",direction="down"}"#).await, Some(1.0));
}

#[tokio::test]
async fn a_window_wechat_enforces_lower_is_learned_on_the_memory_store() {
    a_window_wechat_enforces_lower_is_learned_from_the_first_45009(Store::Memory).await;
}

#[tokio::test]
async fn a_window_wechat_enforces_lower_is_learned_on_redis() {
    a_window_wechat_enforces_lower_is_learned_from_the_first_45009(Store::Redis(RedisServer::start())).await;
}

#[tokio::test]
async fn a_window_wechat_enforces_lower_is_learned_on_a_cluster() {
    a_window_wechat_enforces_lower_is_learned_from_the_first_45009(Store::Cluster(RedisCluster::start(3))).await;
}
