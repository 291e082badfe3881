//! wxgate driven by real WeChat SDKs, pinned and installed from their
//! registries by `scripts/sdk-env.sh` (run by the first test if needed):
//! wechatpy 1.8.18 (Python) and wechat-api 1.35.1 (Node.js, node-webot),
//! each in a subprocess making real SDK calls against an in-process wxgate in
//! front of the mock WeChat. What each SDK's caller sees is asserted, so a
//! change in wxgate or in an SDK that breaks "change the base URL, nothing
//! else" is noticed.

use crate::support;

use std::time::Duration;

use support::sdk::{wechat_api, wechatpy, Seen};
use support::*;

/// `/cgi-bin/menu/get`: a burst of 2 calls, then 1 a minute (the clock
/// stands still until a test moves it), and 100 a day.
fn menu() -> RuleToml {
    rule("menu").matching("/cgi-bin/menu/get").limit_burst(2, "1m", 2).limit(100, "day")
}

fn base(gate: &Gate) -> String {
    format!("http://{}", gate.addr)
}

async fn bucket(gate: &Gate, account: &str, rule: &str) -> serde_json::Value {
    let a = get_at(gate.admin_addr(), &format!("/v1/buckets/{account}/{rule}")).await;
    assert_eq!(a.status, 200, "/v1/buckets/{account}/{rule}: {}", a.text());
    a.json()
}

/// Calls of `account` on `rule` counted today (the rule's day quota is its last limit).
async fn used_today(gate: &Gate, account: &str, rule: &str) -> i64 {
    let b = bucket(gate, account, rule).await;
    let limits = b["limits"].as_array().cloned().unwrap_or_default();
    limits.last().and_then(|l| l["used"].as_i64()).unwrap_or_else(|| panic!("no day quota in {b}"))
}

/// Two calls went through, the third was refused; the refusal as the SDK showed it.
fn third_refused(seen: &[Seen]) -> &Seen {
    assert!(seen[0].ok && seen[1].ok, "the first two calls pass: {seen:#?}");
    assert!(!seen[2].ok, "the third is refused: {seen:#?}");
    &seen[2]
}

fn retry_after(s: &Seen) -> u64 {
    s.retry_after.as_deref().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("Retry-After: {s:?}"))
}

#[tokio::test]
async fn with_throttle_status_200_each_sdks_own_error_carries_errcode_45009() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start_text(ConfigToml::new(&mock.url()).server("throttle_status", 200).with(menu())).await;

    let py = wechatpy(&base(&gate)).token("T").calls(&["menu.get"; 3]).await;
    let refused = third_refused(&py);
    // wechatpy raises APILimitedException, its WeChatClientException for 45009.
    assert_eq!(refused.error.as_deref(), Some("APILimitedException"), "{refused:?}");
    assert_eq!(refused.wechat_client_exception, Some(true));
    assert!(refused.is_wxgate_45009(), "{refused:?}");
    assert!(refused.errmsg.as_deref().is_some_and(|m| m.contains("\"menu\"")), "names the rule: {refused:?}");
    assert_eq!(refused.status, Some(200));
    assert!(retry_after(refused) >= 1, "e.response.headers['Retry-After']");

    gate.advance(Duration::from_secs(120)); // the burst of 2 is whole again (sustained: 1 a minute)
    let node = wechat_api(&base(&gate)).token("T").calls(&["getMenu"; 3]).await;
    let refused = third_refused(&node);
    assert_eq!(refused.error.as_deref(), Some("WeChatAPIError"), "{refused:?}");
    assert!(refused.is_wxgate_45009(), "err.code 45009: {refused:?}");
    assert_eq!(refused.status, Some(200));
    assert!(retry_after(refused) >= 1, "res.headers['retry-after']");

    assert_eq!(mock.count(), 4, "refusals never reach WeChat");
}

#[tokio::test]
async fn with_429_wechatpy_loses_the_errcode_and_wechat_api_keeps_it() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start(&mock, menu()).await;

    // wechatpy 1.8.18 calls raise_for_status() before reading the body:
    // WeChatClientException(errcode=None, errmsg=None), never APILimitedException.
    // The status and Retry-After are on the exception's response.
    let py = wechatpy(&base(&gate)).token("T").calls(&["menu.get"; 3]).await;
    let refused = third_refused(&py);
    assert_eq!(refused.error.as_deref(), Some("WeChatClientException"), "{refused:?}");
    assert_eq!((refused.errcode, refused.errmsg.as_deref()), (None, None), "{refused:?}");
    assert_eq!(refused.status, Some(429));
    assert!(retry_after(refused) >= 1);

    // wechat-api parses the JSON body whatever the status: err.code 45009.
    gate.advance(Duration::from_secs(120));
    let node = wechat_api(&base(&gate)).token("T").calls(&["getMenu"; 3]).await;
    let refused = third_refused(&node);
    assert_eq!(refused.error.as_deref(), Some("WeChatAPIError"), "{refused:?}");
    assert!(refused.is_wxgate_45009(), "{refused:?}");
    assert_eq!(refused.status, Some(429));
    assert!(retry_after(refused) >= 1);
}

/// WeChat itself answers 45009 on the first call; the second is wxgate's
/// penalty refusal. What each SDK's caller sees for each, per `throttle_status`.
async fn wechats_own_45009(throttle_status: u16, wechatpy_sdk: bool) -> (Seen, Seen) {
    let mock = MockWeChat::start().await;
    mock.respond(|_| errcode_reply(45009));
    let send = rule("send").matching("/cgi-bin/message/custom/send");
    let config = ConfigToml::new(&mock.url())
        .server("throttle_status", i64::from(throttle_status))
        .with(send)
        .with(penalty(45009, 60));
    let gate = Gate::start_text(config).await;
    let seen = if wechatpy_sdk {
        wechatpy(&base(&gate)).token("T").calls(&["message.send_text"; 2]).await
    } else {
        wechat_api(&base(&gate)).token("T").calls(&["sendText"; 2]).await
    };
    assert_eq!(mock.count(), 1, "the penalty kept the second call from WeChat");
    (seen[0].clone(), seen[1].clone())
}

#[tokio::test]
async fn wechats_own_45009_reaches_wechatpy_only_with_throttle_status_200_and_wechat_api_either_way() {
    const WECHATS: &str = "reach max api daily quota limit rid: 6740e5a1-0b3c7d2e-1f2a3b4c";
    let (own, penalty) = wechats_own_45009(200, true).await;
    assert_eq!(
        (own.error.as_deref(), own.errcode, own.errmsg.as_deref()),
        (Some("APILimitedException"), Some(45009), Some(WECHATS))
    );
    assert_eq!(own.status, Some(200));
    assert!(penalty.is_wxgate_45009() && penalty.error.as_deref() == Some("APILimitedException"), "{penalty:?}");

    let (own, penalty) = wechats_own_45009(429, true).await;
    for s in [&own, &penalty] {
        assert_eq!(
            (s.error.as_deref(), s.errcode, s.status),
            (Some("WeChatClientException"), None, Some(429)),
            "{s:?}"
        );
    }

    for status in [200, 429] {
        let (own, penalty) = wechats_own_45009(status, false).await;
        assert_eq!((own.errcode, own.errmsg.as_deref(), own.status), (Some(45009), Some(WECHATS), Some(status)));
        assert!(penalty.is_wxgate_45009(), "{penalty:?}");
    }
}

/// A mock WeChat that hands out `TOKEN-<appid>` for `/cgi-bin/token` and
/// answers every other call with a body that each driver call can read.
async fn token_issuing_mock() -> MockWeChat {
    let mock = MockWeChat::start().await;
    mock.respond(|r| {
        if r.path_and_query.starts_with("/cgi-bin/token?") {
            let appid = r.path_and_query.split(['?', '&']).find_map(|kv| kv.strip_prefix("appid=")).unwrap_or("?");
            return Reply::Json {
                body: format!(r#"{{"access_token":"TOKEN-{appid}","expires_in":7200}}"#),
                content_type: "application/json; encoding=utf-8",
            };
        }
        Reply::Json {
            body: r#"{"errcode":0,"errmsg":"ok","list":[],"sessionlist":[],"category_list":[],"openid":"o1","session_key":"k"}"#.into(),
            content_type: "application/json; encoding=utf-8",
        }
    });
    mock
}

fn path_of(r: &Recorded) -> &str {
    r.path_and_query.split('?').next().unwrap_or_default()
}

/// wechatpy 1.8.18 calls that go to `https://api.weixin.qq.com/` whatever
/// `API_BASE_URL` says (class-level `API_BASE_URL` or full URLs in its source).
const HARD_CODED: [&str; 4] =
    ["wxa.get_category", "wxa.code_to_session", "customservice.get_session_list", "datacube.get_user_summary"];

#[tokio::test]
async fn wechatpys_hard_coded_calls_reach_wxgate_only_through_the_contrib_session() {
    let mock = token_issuing_mock().await;
    let rules: Vec<RuleToml> = [
        ("token", "/cgi-bin/token"),
        ("menu", "/cgi-bin/menu/get"),
        ("wxa", "/wxa/*"),
        ("jscode2session", "/sns/jscode2session"),
        ("customservice", "/customservice/*"),
        ("datacube", "/datacube/*"),
    ]
    .into_iter()
    .map(|(name, path)| rule(name).matching(path).limit(100, "day"))
    .collect();
    let gate = Gate::start(&mock, rules.iter().map(|r| r.to_string()).collect::<String>()).await;

    // API_BASE_URL pointed at wxgate: these calls, and the token request,
    // still head for WeChat (the driver stops them at the loopback guard).
    let bypass = wechatpy(&base(&gate)).token("T").calls(&HARD_CODED).await;
    let fetching = wechatpy(&base(&gate)).calls(&["menu.get"]).await;
    for s in bypass.iter().chain(&fetching) {
        let msg = s.errmsg.as_deref().unwrap_or_default();
        assert!(!s.ok && msg.contains("refusing to leave loopback: https://api.weixin.qq.com/"), "{s:?}");
    }
    assert!(fetching[0].errmsg.as_deref().is_some_and(|m| m.contains("api.weixin.qq.com/cgi-bin/token?")));
    assert_eq!(mock.count(), 0, "nothing reached wxgate");

    // contrib/wechatpy_wxgate.py on the client's session: every call goes
    // through wxgate, the token request first, counted on the account named.
    let mut calls = vec!["menu.get"];
    calls.extend(HARD_CODED);
    let routed = wechatpy(&base(&gate)).contrib().account("wxC").appid("wxC").calls(&calls).await;
    assert!(routed.iter().all(|s| s.ok), "{routed:#?}");
    let seen: Vec<Recorded> = mock.calls();
    let paths: Vec<&str> = seen.iter().map(path_of).collect();
    assert_eq!(
        paths,
        [
            "/cgi-bin/token",
            "/cgi-bin/menu/get",
            "/wxa/get_category",
            "/sns/jscode2session",
            "/customservice/kfsession/getsessionlist",
            "/datacube/getusersummary"
        ]
    );
    assert!(seen[0].path_and_query.contains("appid=wxC"), "{}", seen[0].path_and_query);
    assert!(
        seen[1..].iter().all(|r| r.path_and_query.contains("access_token=TOKEN-wxC")),
        "the token fetched through wxgate"
    );
    assert!(seen.iter().all(|r| !r.headers.contains_key("x-wx-account")), "X-Wx-Account is not forwarded");
    for r in ["token", "menu", "wxa", "jscode2session", "customservice", "datacube"] {
        assert_eq!(used_today(&gate, "wxC", r).await, 1, "{r} on wxC");
    }
    let metrics = get_at(gate.admin_addr(), "/metrics").await.text();
    for r in ["token", "wxa"] {
        let forwarded = sample(&metrics, &format!("wxgate_calls_total{{rule=\"{r}\",outcome=\"forwarded\"}}"));
        assert_eq!(forwarded, Some(1.0), "{r}: {metrics}");
    }
}

#[tokio::test]
async fn sdk_clients_naming_their_account_in_a_header_are_limited_independently() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start_text(ConfigToml::new(&mock.url()).server("throttle_status", 200).with(menu())).await;
    let b = base(&gate);
    // wechat-api: api.setOpts({headers: {'X-Wx-Account': ...}}); wechatpy: the contrib session's `account`.
    for account in ["wxA", "wxB"] {
        let seen = wechat_api(&b).account(account).token("T").calls(&["getMenu"; 3]).await;
        assert!(third_refused(&seen).is_wxgate_45009(), "{account}: {seen:#?}");
    }
    let seen = wechatpy(&b).contrib().account("wxC").token("T").calls(&["menu.get"; 3]).await;
    assert!(third_refused(&seen).is_wxgate_45009(), "{seen:#?}");
    for account in ["wxA", "wxB", "wxC"] {
        assert_eq!(used_today(&gate, account, "menu").await, 2, "{account}");
    }
    assert_eq!(used_today(&gate, "default", "menu").await, 0);
    assert_eq!(mock.count(), 6);
}

#[tokio::test]

async fn sdk_clients_with_different_account_base_urls_are_limited_independently() {
    let mock = token_issuing_mock().await;
    let wxa = rule("wxa").matching("/wxa/*").limit(100, "day");
    let gate =
        Gate::start_text(ConfigToml::new(&mock.url()).server("throttle_status", 200).with(menu()).with(wxa)).await;
    let b = base(&gate);

    // One client per account, the account in the base URL and nothing else.
    let a = wechatpy(&format!("{b}/@wxA")).token("TA").calls(&["menu.get"; 3]).await;
    let bb = wechatpy(&format!("{b}/@wxB")).token("TB").calls(&["menu.get"; 3]).await;
    let c = wechat_api(&format!("{b}/@wxC")).token("TC").calls(&["getMenu"; 3]).await;
    for (account, seen) in [("wxA", &a), ("wxB", &bb), ("wxC", &c)] {
        assert!(third_refused(seen).is_wxgate_45009(), "{account}: {seen:#?}");
        assert_eq!(used_today(&gate, account, "menu").await, 2, "{account}");
    }
    // The contrib session with a percent-encoded prefix: its hard-coded wxa call too.
    let d = wechatpy(&format!("{b}/%40wxD")).contrib().token("TD").calls(&["menu.get", "wxa.get_category"]).await;
    assert!(d.iter().all(|s| s.ok), "{d:#?}");
    assert_eq!(used_today(&gate, "wxD", "menu").await, 1);
    assert_eq!(used_today(&gate, "wxD", "wxa").await, 1);
    assert_eq!(used_today(&gate, "default", "menu").await, 0);

    // WeChat sees the paths without the prefix.
    let seen = mock.calls();
    assert_eq!(seen.len(), 8, "6 admitted menu calls of A, B, C and 2 of D");
    for r in &seen {
        let p = path_of(r);
        assert!(p == "/cgi-bin/menu/get" || p == "/wxa/get_category", "{}", r.path_and_query);
    }
}

#[tokio::test]

async fn calls_with_a_token_the_sdk_fetched_through_wxgate_count_against_its_appid() {
    let mock = token_issuing_mock().await;
    let gate = Gate::start(&mock, rule("menu").matching("/cgi-bin/menu/get").limit(100, "day")).await;
    let b = base(&gate);

    // No header, no prefix: each SDK fetches its own token through wxgate
    // (wechatpy's token request needs the contrib session, wechat-api's
    // follows api.endpoint), then calls with it.
    let py = wechatpy(&b).contrib().appid("wx00000000000000a1").calls(&["menu.get"; 2]).await;
    let node = wechat_api(&b).appid("wx00000000000000b2").calls(&["getMenu"; 2]).await;
    assert!(py.iter().chain(&node).all(|s| s.ok), "{py:#?} {node:#?}");

    let seen = mock.calls();
    let paths: Vec<&str> = seen.iter().map(path_of).collect();
    assert_eq!(
        paths,
        [
            "/cgi-bin/token",
            "/cgi-bin/menu/get",
            "/cgi-bin/menu/get",
            "/cgi-bin/token",
            "/cgi-bin/menu/get",
            "/cgi-bin/menu/get"
        ]
    );
    assert!(seen[1].path_and_query.contains("access_token=TOKEN-wx00000000000000a1"), "{}", seen[1].path_and_query);
    assert!(seen[4].path_and_query.contains("access_token=TOKEN-wx00000000000000b2"), "{}", seen[4].path_and_query);
    for appid in ["wx00000000000000a1", "wx00000000000000b2"] {
        assert_eq!(used_today(&gate, appid, "menu").await, 2, "{appid}: the calls carrying its token");
    }
    assert_eq!(used_today(&gate, "default", "menu").await, 0, "nothing left on default");
}

/// `caller_auth = "required"`: each SDK authenticates with nothing but a
/// base URL carrying `caller:key@` (HTTP Basic, sent by requests and by
/// Node's http client), and a wrong key is refused (401, errcode 48001)
/// as the SDK's own error; the credential never reaches WeChat.
#[tokio::test]
async fn each_sdk_authenticates_with_caller_and_key_in_its_base_url() {
    const KEY: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f0";
    let digest: String = wxgate::config::KeyDigest::of(KEY.as_bytes()).0.iter().map(|b| format!("{b:02x}")).collect();
    let mock = MockWeChat::start().await;
    let orders = caller("orders").set("key_sha256", digest).set("accounts", vec!["wxA"]);
    let gate =
        Gate::start_text(ConfigToml::new(&mock.url()).server("caller_auth", "required").with(orders).with(menu()))
            .await;
    let with_key = |key: &str| format!("http://orders:{key}@{}/@wxA", gate.addr);

    let py = wechatpy(&with_key(KEY)).token("T").calls(&["menu.get"]).await;
    assert!(py[0].ok, "wechatpy authenticates from its base URL: {py:?}");
    let node = wechat_api(&with_key(KEY)).token("T").calls(&["getMenu"]).await;
    assert!(node[0].ok, "wechat-api authenticates from its base URL: {node:?}");
    assert_eq!(used_today(&gate, "wxA", "menu").await, 2);
    assert!(mock.calls().iter().all(|c| c.headers.get("authorization").is_none()), "never forwarded");

    let wrong = "ffffffffffffffffffffffffffffffff";
    let py = wechatpy(&with_key(wrong)).token("T").calls(&["menu.get"]).await;
    assert!(!py[0].ok && py[0].status == Some(401), "{py:?}");
    let node = wechat_api(&with_key(wrong)).token("T").calls(&["getMenu"]).await;
    assert!(!node[0].ok && node[0].errcode == Some(48001) && node[0].status == Some(401), "{node:?}");
    assert_eq!(mock.count(), 2);
}

#[tokio::test]
async fn sdks_set_to_fetch_no_token_get_the_one_wxgate_holds() {
    use support::tokens::{WeChatTokens, APPID, SECRET};
    let mock = MockWeChat::start().await;
    let tokens = WeChatTokens::new();
    mock.respond(tokens.responder());
    let dir = TempDir::new("sdk-broker");
    let secret = dir.write_secret("secret", SECRET);
    let held =
        format!("[[account]]\nid = \"{APPID}\"\nkind = \"official_account\"\nsecret_file = \"{}\"\n", secret.display());
    let gate = Gate::start_text(ConfigToml::new(&mock.url()).with(held)).await;
    let at = format!("http://{}/@{APPID}", gate.addr);
    let py = wechatpy(&at).no_token().calls(&["user.get", "message.send_text"]).await;
    assert!(py.iter().all(|s| s.ok), "wechatpy, base URL and no token: {py:#?}");
    let node = wechat_api(&at).no_token().calls(&["getUser", "sendText"]).await;
    assert!(node.iter().all(|s| s.ok), "wechat-api, base URL and no token: {node:#?}");
    assert_eq!(tokens.fetches("stable"), 1, "wxgate fetched one token; the SDKs none");
    assert_eq!(tokens.fetches("token"), 0);
    let token = tokens.issued().remove(0);
    let calls = mock.calls();
    let api: Vec<_> = calls.iter().filter(|c| !c.path_and_query.starts_with("/cgi-bin/stable_token")).collect();
    assert_eq!(api.len(), 4);
    for c in api {
        assert!(c.path_and_query.ends_with(&format!("access_token={token}")), "{}", c.path_and_query);
    }
}
