//! Each account's real quota (README "Each account's real quota",
//! docs/configuration.md `learn`): the day limit WeChat's quota/get reports
//! for an account becomes that account's day quota, on every store and
//! every instance, so an account whose quota is lower than the rule's is
//! never sent into a 45009. The WeChat here is `wxgate sim` with a lower
//! quota for one account; time is a manual clock.

mod support;

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
