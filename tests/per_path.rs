//! `scope = "path"`: one rule, a count per API it lists, on both stores,
//! through real listeners; the admin API shows each path, metrics stay by rule.

use crate::support;

use support::redis_server::RedisServer;
use support::*;

const ADD: &str = "/cgi-bin/draft/add";
const UPDATE: &str = "/cgi-bin/draft/update";

/// Each of two draft APIs: 2 a day (WeChat meters them apart).
fn drafts() -> RuleToml {
    rule("draft").matching(ADD).matching(UPDATE).limit(2, "day").set("scope", "path")
}

async fn each_api_gets_its_own_count(gate: &Gate, mock: &MockWeChat) {
    for path in [ADD, UPDATE, ADD, UPDATE] {
        assert_eq!(gate.get_as("wxA", path).await.status, 200, "{path}");
    }
    for path in [ADD, UPDATE] {
        let refused = gate.get_as("wxA", path).await;
        assert_eq!((refused.status.as_u16(), refused.header("x-wxgate-reason")), (429, Some("quota")), "{path}");
        assert_eq!(refused.header("x-wxgate-rule"), Some("draft"));
    }
    assert_eq!(mock.count(), 4, "2 of each API reached WeChat, no more");
    // Another account has its own counts per path too.
    assert_eq!(gate.get_as("wxB", ADD).await.status, 200);

    let addr = gate.admin_addr();
    let all = admin(addr, "GET", "/v1/buckets/wxA/draft", None).await.json();
    assert_eq!(all["scope"], "path", "{all}");
    let paths = all["paths"].as_array().expect("one picture per path");
    let seen: Vec<(&str, u64)> = paths
        .iter()
        .map(|p| (p["path"].as_str().expect("path"), p["limits"][0]["used"].as_u64().expect("used")))
        .collect();
    assert_eq!(seen, vec![(ADD, 2), (UPDATE, 2)]);
    let one = admin(addr, "GET", &format!("/v1/buckets/wxB/draft?path={ADD}"), None).await.json();
    assert_eq!((one["path"].as_str(), one["limits"][0]["used"].as_u64()), (Some(ADD), Some(1)), "{one}");
    let unknown = admin(addr, "GET", "/v1/buckets/wxA/draft?path=/cgi-bin/draft/get", None).await;
    assert_eq!(unknown.status, 404);
    // A penalty set by hand on one path leaves the other alone.
    assert_eq!(admin(addr, "POST", &format!("/v1/penalties/wxB/draft?seconds=60&path={ADD}"), None).await.status, 200);
    assert_eq!(gate.get_as("wxB", ADD).await.header("x-wxgate-reason"), Some("penalty"));
    assert_eq!(gate.get_as("wxB", UPDATE).await.status, 200);

    // Metrics are labelled by rule: no path appears, however many APIs the rule lists.
    let text = admin(addr, "GET", "/metrics", None).await.text();
    assert_eq!(sample(&text, "wxgate_calls_total{rule=\"draft\",outcome=\"forwarded\"}"), Some(6.0));
    assert!(!text.contains("cgi-bin/draft"), "a path in the metrics");
}

#[tokio::test]
async fn each_listed_api_counts_on_its_own_memory_store() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start(&mock, drafts()).await;
    each_api_gets_its_own_count(&gate, &mock).await;
}

#[tokio::test]
async fn each_listed_api_counts_on_its_own_redis_store() {
    let redis = RedisServer::start();
    let mock = MockWeChat::start().await;
    let gate = Gate::start_real(&mock, format!("{}\n{}", StoreToml::redis(&redis.url()), drafts())).await;
    each_api_gets_its_own_count(&gate, &mock).await;
}

#[tokio::test]
async fn the_default_scope_shares_one_count_between_the_paths() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start(&mock, rule("draft").matching(ADD).matching(UPDATE).limit(2, "day")).await;
    assert_eq!(gate.get_as("wxA", ADD).await.status, 200);
    assert_eq!(gate.get_as("wxA", UPDATE).await.status, 200);
    assert_eq!(gate.get_as("wxA", ADD).await.status, 429);
    let b = admin(gate.admin_addr(), "GET", "/v1/buckets/wxA/draft", None).await.json();
    assert_eq!(b["limits"][0]["used"], 2, "{b}");
    let with_path = admin(gate.admin_addr(), "GET", &format!("/v1/buckets/wxA/draft?path={ADD}"), None).await;
    assert_eq!(with_path.status, 400, "a rule counted as one has no per-path state");
}
