//! Which account a call counts against, without code in the caller: an
//! `@account` first path segment (an SDK's base URL), or the account an
//! access token was issued to, learned when the token answer passed through
//! wxgate (`/cgi-bin/token`, `stable_token`, WeCom `gettoken`, the
//! third-party platform's component and authorizer tokens, `api_query_auth`). Checked through
//! what users see: the mock WeChat's requests, the answers, the buckets of
//! the admin API, the metrics, Redis's keys and the state file.

use crate::support;

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use support::process;
use support::redis_server::RedisServer;
use support::*;

const SEND: &str = "/cgi-bin/message/custom/send";

/// WeChat handing out tokens: each token names the appid (or corpid) it was
/// asked for, so a test can tell them apart. Everything else: `ok`.
fn token_answers(rec: &Recorded) -> Reply {
    let (path, query) = rec.path_and_query.split_once('?').unwrap_or((&rec.path_and_query, ""));
    let param =
        |name: &str| query.split('&').find_map(|kv| kv.strip_prefix(name)?.strip_prefix('=')).unwrap_or("").to_owned();
    let body: serde_json::Value = serde_json::from_slice(&rec.body).unwrap_or_default();
    let field = |name: &str| body[name].as_str().unwrap_or("").to_owned();
    let json = match path {
        "/cgi-bin/token" => format!(r#"{{"access_token":"TOKEN_{}","expires_in":7200}}"#, param("appid")),
        "/cgi-bin/stable_token" => format!(r#"{{"access_token":"TOKEN_{}","expires_in":7200}}"#, field("appid")),
        "/cgi-bin/gettoken" => {
            format!(r#"{{"errcode":0,"errmsg":"ok","access_token":"TOKEN_{}","expires_in":7200}}"#, param("corpid"))
        }
        "/cgi-bin/component/api_component_token" => {
            format!(r#"{{"component_access_token":"CTOKEN_{}","expires_in":7200}}"#, field("component_appid"))
        }
        "/cgi-bin/component/api_authorizer_token" => format!(
            r#"{{"authorizer_access_token":"ATOKEN_{}","expires_in":7200,"authorizer_refresh_token":"R2"}}"#,
            field("authorizer_appid")
        ),
        // An account authorises the platform: its appid comes in the answer.
        "/cgi-bin/component/api_query_auth" => r#"{"authorization_info":{"authorizer_appid":"wxNew","authorizer_access_token":"ATOKEN_wxNew","expires_in":7200,"authorizer_refresh_token":"R","func_info":[]}}"#.to_owned(),
        _ => return ok_reply(),
    };
    Reply::Json { body: json, content_type: "application/json; encoding=utf-8" }
}

/// A mock WeChat that hands out tokens ([`token_answers`]).
async fn wechat() -> MockWeChat {
    let mock = MockWeChat::start().await;
    mock.respond(token_answers);
    mock
}

/// "send": 1000 calls a day (the bucket counts each one).
fn send_rule() -> RuleToml {
    rule("send").matching(SEND).limit(1000, "day")
}

/// Calls of `account` counted today on `rule` (the rule's first limit, a day quota).
async fn used(gate: &Gate, account: &str, rule: &str) -> u64 {
    let b = get_at(gate.admin_addr(), &format!("/v1/buckets/{account}/{rule}")).await;
    assert_eq!(b.status, 200, "{}", b.text());
    b.json()["limits"][0]["used"].as_u64().expect("a day quota")
}

/// Room left in `account`'s window on `rule` (the rule's first limit, a window).
async fn tokens_left(gate: &Gate, account: &str, rule: &str) -> u64 {
    let b = get_at(gate.admin_addr(), &format!("/v1/buckets/{account}/{rule}")).await;
    assert_eq!(b.status, 200, "{}", b.text());
    b.json()["limits"][0]["tokens"].as_u64().expect("a window")
}

async fn metric(gate: &Gate, name: &str) -> f64 {
    let text = get_at(gate.admin_addr(), "/metrics").await.text();
    sample(&text, name).unwrap_or_else(|| panic!("no {name} in:\n{text}"))
}

/// A POST of a JSON `body`, as an SDK sends it.
async fn post_json(gate: &Gate, path: &str, body: &str) -> Answer {
    let req = http::Request::post(gate.url(path)).header("content-type", "application/json");
    send(req.body(Full::new(Bytes::from(body.to_owned()))).expect("request")).await
}

fn assert_refused(a: &Answer, what: &str) {
    assert_eq!(a.status, 400, "{what}: {}", a.text());
    assert_eq!(a.json()["errcode"], 40097, "{what}: {}", a.text());
}

#[tokio::test]
async fn an_account_prefix_counts_against_that_account_and_is_not_forwarded() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start(&mock, rule("send").matching(SEND).limit_burst(2, "1m", 2)).await;
    let query = "?access_token=T&x=%2F1";
    for account in ["wxA", "wxB"] {
        for _ in 0..2 {
            let a = gate.get(&format!("/@{account}{SEND}{query}")).await;
            assert_eq!(a.status, 200, "{account}: {}", a.text());
        }
    }
    for account in ["wxA", "wxB"] {
        let a = gate.get(&format!("/@{account}{SEND}{query}")).await;
        assert_eq!((a.status.as_u16(), a.header("x-wxgate-rule")), (429, Some("send")), "{account}");
    }
    assert_eq!(tokens_left(&gate, "wxA", "send").await, 0);
    assert_eq!(tokens_left(&gate, "wxB", "send").await, 0);
    assert_eq!(tokens_left(&gate, "default", "send").await, 2, "nothing went to default");
    let seen: Vec<String> = mock.calls().into_iter().map(|c| c.path_and_query).collect();
    assert_eq!(seen, vec![format!("{SEND}{query}"); 4], "WeChat sees the path without the prefix, query unchanged");
}

#[tokio::test]
async fn the_prefix_may_be_percent_encoded_and_must_agree_with_the_header() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start(&mock, send_rule()).await;
    assert_eq!(gate.get(&format!("/%40wxA{SEND}")).await.status, 200);
    assert_eq!(gate.get_as("wxA", &format!("/@wxA{SEND}")).await.status, 200, "the same account twice is fine");
    assert_eq!(used(&gate, "wxA", "send").await, 2);
    assert_eq!(mock.count(), 2);

    assert_refused(&gate.get_as("wxB", &format!("/@wxA{SEND}")).await, "header and prefix differ");
    let too_long = format!("/@{}{SEND}", "a".repeat(65));
    for bad in ["/@/cgi-bin/message/custom/send", "/@wx!A/cgi-bin/message/custom/send", "/@wxA", "/@wxA?access_token=T"]
        .into_iter()
        .chain([too_long.as_str(), "/%40/cgi-bin/message/custom/send", "/@wx%41/cgi-bin/message/custom/send"])
    {
        assert_refused(&gate.get(bad).await, bad);
    }
    assert_eq!(mock.count(), 2, "nothing refused was forwarded");
    assert_eq!(used(&gate, "wxA", "send").await, 2);
    assert_eq!(used(&gate, "wxB", "send").await, 0);
}

#[tokio::test]
async fn a_token_from_cgi_bin_token_counts_later_calls_against_its_appid_until_it_expires() {
    let mock = wechat().await;
    let gate = Gate::start(&mock, send_rule()).await;
    let token = gate.get("/cgi-bin/token?grant_type=client_credential&appid=wxA&secret=S").await;
    assert_eq!(token.json()["access_token"], "TOKEN_wxA", "the answer passes through unchanged");
    assert_eq!(metric(&gate, "wxgate_tokens_learned_total").await, 1.0);

    for _ in 0..3 {
        assert_eq!(gate.get(&format!("{SEND}?access_token=TOKEN_wxA")).await.status, 200);
    }
    assert_eq!(used(&gate, "wxA", "send").await, 3);
    assert_eq!(used(&gate, "default", "send").await, 0);
    assert_eq!(metric(&gate, "wxgate_unknown_token_calls_total").await, 0.0);

    // A token wxgate never saw: `default`, and counted.
    assert_eq!(gate.get(&format!("{SEND}?access_token=NEVER_SEEN")).await.status, 200);
    assert_eq!(used(&gate, "default", "send").await, 1);
    assert_eq!(metric(&gate, "wxgate_unknown_token_calls_total").await, 1.0);

    // The mapping ends with the token (expires_in = 7200 s).
    gate.advance(Duration::from_secs(7199));
    assert_eq!(gate.get(&format!("{SEND}?access_token=TOKEN_wxA")).await.status, 200);
    assert_eq!(used(&gate, "wxA", "send").await, 4);
    gate.advance(Duration::from_secs(1));
    assert_eq!(gate.get(&format!("{SEND}?access_token=TOKEN_wxA")).await.status, 200);
    assert_eq!(used(&gate, "wxA", "send").await, 4);
    assert_eq!(used(&gate, "default", "send").await, 2);
    assert_eq!(metric(&gate, "wxgate_unknown_token_calls_total").await, 2.0);
}

#[tokio::test]
async fn tokens_are_learned_from_stable_token_gettoken_and_the_platforms_token_answers() {
    let mock = wechat().await;
    let component = rule("component")
        .matching("/cgi-bin/component/api_create_preauthcode")
        .matching("/cgi-bin/component/api_authorizer_token")
        .limit(1000, "day");
    let gate = Gate::start(&mock, format!("{}\n{component}", send_rule())).await;

    // stable_token: the appid is in the JSON body, which WeChat gets exactly as sent.
    let body = r#"{"grant_type":"client_credential","appid":"wxS","secret":"S","force_refresh":false}"#;
    assert_eq!(post_json(&gate, "/cgi-bin/stable_token", body).await.json()["access_token"], "TOKEN_wxS");
    let sent = mock.calls().pop().expect("forwarded");
    assert_eq!(sent.body, body.as_bytes(), "the body reaches WeChat unchanged");
    assert_eq!(sent.headers.get("content-length").map(|v| v.as_bytes()), Some(body.len().to_string().as_bytes()));
    // WeCom: the corpid is in the query.
    assert_eq!(gate.get("/cgi-bin/gettoken?corpid=wwC&corpsecret=S").await.json()["access_token"], "TOKEN_wwC");
    // A third-party platform: its own token, then one per authorised account.
    let ticket = r#"{"component_appid":"wxP","component_appsecret":"S","component_verify_ticket":"V"}"#;
    let c = post_json(&gate, "/cgi-bin/component/api_component_token", ticket).await;
    assert_eq!(c.json()["component_access_token"], "CTOKEN_wxP");
    let pre = post_json(&gate, "/cgi-bin/component/api_create_preauthcode?component_access_token=CTOKEN_wxP", "{}");
    assert_eq!(pre.await.status, 200);
    let refresh = r#"{"component_appid":"wxP","authorizer_appid":"wxAuth","authorizer_refresh_token":"R"}"#;
    let a =
        post_json(&gate, "/cgi-bin/component/api_authorizer_token?component_access_token=CTOKEN_wxP", refresh).await;
    assert_eq!(a.json()["authorizer_access_token"], "ATOKEN_wxAuth");
    let code = r#"{"component_appid":"wxP","authorization_code":"CODE"}"#;
    let q = post_json(&gate, "/cgi-bin/component/api_query_auth?component_access_token=CTOKEN_wxP", code).await;
    assert_eq!(q.json()["authorization_info"]["authorizer_access_token"], "ATOKEN_wxNew");
    assert_eq!(metric(&gate, "wxgate_tokens_learned_total").await, 5.0);

    for token in ["TOKEN_wxS", "TOKEN_wwC", "ATOKEN_wxAuth", "TOKEN_wxS", "ATOKEN_wxNew"] {
        assert_eq!(gate.get(&format!("{SEND}?access_token={token}")).await.status, 200);
    }
    assert_eq!(used(&gate, "wxS", "send").await, 2);
    assert_eq!(used(&gate, "wwC", "send").await, 1);
    assert_eq!(used(&gate, "wxAuth", "send").await, 1, "an authorised account is an account of its own");
    assert_eq!(used(&gate, "wxNew", "send").await, 1, "from its first authorizer token on");
    assert_eq!(used(&gate, "wxP", "component").await, 2, "platform APIs count against the platform");
    assert_eq!(used(&gate, "default", "send").await, 0);
    assert_eq!(used(&gate, "default", "component").await, 0);
    assert_eq!(metric(&gate, "wxgate_unknown_token_calls_total").await, 0.0);
}

#[tokio::test]
async fn a_token_request_counts_against_the_appid_it_names() {
    let mock = wechat().await;
    let token = rule("token").matching("/cgi-bin/token").matching("/cgi-bin/stable_token").limit(2000, "day");
    // Without the token cache (tests/tokens.rs), which would answer the third itself.
    let gate = Gate::start(&mock, format!("{token}\n[tokens]\ncache = false\n")).await;
    assert_eq!(gate.get("/cgi-bin/token?grant_type=client_credential&appid=wxA&secret=S").await.status, 200);
    let body = r#"{"grant_type":"client_credential","appid":"wxA","secret":"S"}"#;
    assert_eq!(post_json(&gate, "/cgi-bin/stable_token", body).await.status, 200);
    assert_eq!(gate.get_as("wxA", "/cgi-bin/token?grant_type=client_credential&appid=wxA&secret=S").await.status, 200);
    assert_eq!(used(&gate, "wxA", "token").await, 3);
    assert_eq!(used(&gate, "default", "token").await, 0);
}

/// Issue 44 item 3: a token request or clear_quota naming one account
/// (`@wxA`, `X-Wx-Account`) and carrying another appid was counted on the
/// named account and forwarded: WeChat acts on the appid. Refused (400),
/// never forwarded, nothing counted.
#[tokio::test]
async fn a_token_request_naming_another_account_than_its_appid_is_refused() {
    let mock = wechat().await;
    let token = rule("token").matching("/cgi-bin/token").matching("/cgi-bin/stable_token").limit(2000, "day");
    let gate = Gate::start(&mock, format!("{token}\n[tokens]\ncache = false\n")).await;
    let stable = r#"{"grant_type":"client_credential","appid":"wxA","secret":"S"}"#;
    let clear = r#"{"appid":"wxA"}"#;
    for a in [
        gate.get_as("wxB", "/cgi-bin/token?grant_type=client_credential&appid=wxA&secret=S").await,
        gate.get("/@wxB/cgi-bin/token?grant_type=client_credential&appid=wxA&secret=S").await,
        gate.post_as("wxB", "/cgi-bin/stable_token", stable).await,
        gate.post_as("wxB", "/cgi-bin/clear_quota?access_token=T", clear).await,
        gate.post_as("wxB", "/cgi-bin/clear_quota/v2?appid=wxA&appsecret=S", "").await,
    ] {
        assert_eq!(a.status, 400, "{}", a.text());
        let says = a.json()["errmsg"].as_str().unwrap_or_default().to_owned();
        assert!(says.contains("is for appid \"wxA\" but names account \"wxB\""), "{says}");
    }
    assert_eq!(mock.count(), 0, "nothing forwarded");
    assert_eq!(used(&gate, "wxB", "token").await, 0);
    assert_eq!(used(&gate, "wxA", "token").await, 0);
}

#[tokio::test]
async fn naming_another_account_than_the_tokens_is_refused_and_not_forwarded() {
    let mock = wechat().await;
    let gate = Gate::start(&mock, send_rule()).await;
    gate.get("/cgi-bin/token?grant_type=client_credential&appid=wxA&secret=S").await;
    let path = format!("{SEND}?access_token=TOKEN_wxA");
    let before = mock.count();
    for a in [gate.get_as("wxB", &path).await, gate.get(&format!("/@wxB{path}")).await] {
        assert_refused(&a, "another account's name");
        assert!(a.text().contains("wxA") && !a.text().contains("TOKEN_wxA"), "names the account, not the token");
    }
    assert_eq!(mock.count(), before, "nothing forwarded");
    assert_eq!(used(&gate, "wxB", "send").await, 0);
    assert_eq!(gate.get_as("wxA", &path).await.status, 200, "its own account is fine");
    assert_eq!(gate.get(&format!("/@wxA{path}")).await.status, 200);
    assert_eq!(used(&gate, "wxA", "send").await, 2);
}

#[tokio::test]
async fn the_allow_list_refuses_other_accounts_and_learns_no_unlisted_appid() {
    let mock = wechat().await;
    let config = ConfigToml::new(&mock.url()).server("accounts", vec!["wxA", "default"]).with(send_rule());
    let gate = Gate::start_text(config).await;
    assert_eq!(gate.get_as("wxA", SEND).await.status, 200);
    assert_eq!(gate.get(SEND).await.status, 200, "default is listed");
    assert_refused(&gate.get_as("wxB", SEND).await, "unlisted header");
    assert_refused(&gate.get(&format!("/@wxB{SEND}")).await, "unlisted prefix");
    assert_refused(&gate.get("/cgi-bin/token?grant_type=client_credential&appid=wxZ&secret=S").await, "unlisted appid");
    assert_eq!(mock.count(), 2);
    // Naming a listed account does not make the token of an unlisted appid asked for.
    let z = gate.get_as("wxA", "/cgi-bin/token?grant_type=client_credential&appid=wxZ&secret=S").await;
    assert_refused(&z, "a listed account named, an unlisted appid asked for");
    assert_eq!(mock.count(), 2);
    assert_eq!(metric(&gate, "wxgate_tokens_learned_total").await, 0.0);
    assert_eq!(gate.get(&format!("{SEND}?access_token=TOKEN_wxZ")).await.status, 200);
    assert_eq!(used(&gate, "default", "send").await, 2);
    assert_eq!(used(&gate, "wxZ", "send").await, 0);
}

#[tokio::test]
async fn an_allow_list_without_default_refuses_calls_that_name_no_account() {
    let mock = wechat().await;
    let config = ConfigToml::new(&mock.url()).server("accounts", vec!["wxA"]).with(send_rule());
    let gate = Gate::start_text(config).await;
    assert_refused(&gate.get(SEND).await, "default is not listed");
    assert_eq!(gate.get("/cgi-bin/token?grant_type=client_credential&appid=wxA&secret=S").await.status, 200);
    assert_eq!(gate.get(&format!("{SEND}?access_token=TOKEN_wxA")).await.status, 200, "a learned token names wxA");
    assert_eq!(used(&gate, "wxA", "send").await, 1);
}

/// Every key in Redis and its value, as text.
fn redis_contents(redis: &RedisServer) -> Vec<(String, String)> {
    let text = |v: redis::Value| -> String {
        match v {
            redis::Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
            redis::Value::Array(items) => items
                .into_iter()
                .map(|i| match i {
                    redis::Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
                    other => format!("{other:?}"),
                })
                .collect::<Vec<_>>()
                .join(" "),
            other => format!("{other:?}"),
        }
    };
    let keys = match redis.run_as(None, &["KEYS", "*"]) {
        redis::Value::Array(keys) => keys,
        other => panic!("KEYS answered {other:?}"),
    };
    keys.into_iter()
        .map(|k| {
            let key = text(k);
            let kind = match redis.run_as(None, &["TYPE", &key]) {
                redis::Value::SimpleString(s) => s,
                other => format!("{other:?}"),
            };
            let value = match kind.as_str() {
                "string" => redis.run_as(None, &["GET", &key]),
                "hash" => redis.run_as(None, &["HGETALL", &key]),
                "zset" => redis.run_as(None, &["ZRANGE", &key, "0", "-1", "WITHSCORES"]),
                other => panic!("{key} is a {other}"),
            };
            (key, text(value))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_sharing_redis_share_learned_tokens_which_redis_never_holds_in_clear() {
    let redis = RedisServer::start();
    let mock = wechat().await;
    let config = ConfigToml::new(&mock.url()).with(StoreToml::redis(&redis.url())).with(send_rule());
    let one = Gate::start_real_text(&config).await;
    let two = Gate::start_real_text(&config).await;
    let body = r#"{"grant_type":"client_credential","appid":"wxA","secret":"S"}"#;
    assert_eq!(post_json(&one, "/cgi-bin/stable_token", body).await.json()["access_token"], "TOKEN_wxA");
    for _ in 0..3 {
        assert_eq!(two.get(&format!("{SEND}?access_token=TOKEN_wxA")).await.status, 200);
    }
    assert_eq!(two.get_as("wxB", &format!("{SEND}?access_token=TOKEN_wxA")).await.status, 400);
    assert_eq!(used(&two, "wxA", "send").await, 3, "instance 2 knew the token instance 1 learned");
    assert_eq!(used(&two, "default", "send").await, 0);
    assert_eq!(metric(&one, "wxgate_tokens_learned_total").await, 1.0);
    assert_eq!(metric(&two, "wxgate_unknown_token_calls_total").await, 0.0);

    let contents = redis_contents(&redis);
    let learned: Vec<&(String, String)> = contents.iter().filter(|(_, v)| v.contains("wxA")).collect();
    assert!(learned.iter().any(|(k, _)| k.starts_with("wxgate:#token:")), "the mapping is in Redis: {contents:?}");
    for (key, value) in &contents {
        assert!(!key.contains("TOKEN_wxA") && !value.contains("TOKEN_wxA"), "in clear: {key} = {value}");
    }
}

#[tokio::test]
async fn learned_tokens_outlive_a_restart_of_the_memory_store_and_its_file_never_holds_them() {
    let mock = wechat().await;
    let dir = TempDir::new("accounts-restart");
    let config = ConfigToml::new(&mock.url()).with(StoreToml::memory().set("flush_interval", "20ms")).with(send_rule());
    let path = dir.write("wxgate.toml", &config.to_string());
    let gate = Gate::start_file(&path).await;
    gate.get("/cgi-bin/token?grant_type=client_credential&appid=wxA&secret=S").await;
    assert_eq!(gate.get(&format!("{SEND}?access_token=TOKEN_wxA")).await.status, 200);
    let gate = gate.restart().await;

    let state = std::fs::read_to_string(dir.join("wxgate-state.json")).expect("state file");
    assert!(!state.contains("TOKEN_wxA"), "hashed, never in clear: {state}");
    let file: serde_json::Value = serde_json::from_str(&state).expect("JSON");
    assert_eq!(file["tokens"][0]["account"], "wxA", "{state}");
    assert_eq!(gate.get(&format!("{SEND}?access_token=TOKEN_wxA")).await.status, 200);
    assert_eq!(used(&gate, "wxA", "send").await, 2);
    assert_eq!(used(&gate, "default", "send").await, 0);
    assert_eq!(metric(&gate, "wxgate_unknown_token_calls_total").await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_on_two_serving_threads_counts_every_call_with_a_learned_token() {
    let mock = wechat().await;
    let config = ConfigToml::new(&mock.url())
        .server("workers", 2)
        .with(StoreToml::memory().set("state_file", "off"))
        .with(send_rule())
        .to_string();
    let gate = process::spawn(&config, "accounts-workers", &[("WXGATE_LOG", "debug")]).expect("serving");
    let token = gate.get("/cgi-bin/token?grant_type=client_credential&appid=wxA&secret=S").await;
    assert_eq!(token.json()["access_token"], "TOKEN_wxA");
    // A connection each: the calls spread over both serving threads.
    for _ in 0..8 {
        assert_eq!(gate.get(&format!("{SEND}?access_token=TOKEN_wxA")).await.status, 200);
    }
    let bucket = gate.admin_get("/v1/buckets/wxA/send").await.json();
    assert_eq!(bucket["limits"][0]["used"], 8, "{bucket}");
    assert_eq!(gate.metric("wxgate_unknown_token_calls_total").await, Some(0.0));
    let log = gate.stop().await;
    assert!(log.contains("learned an access token"), "{log}");
    assert!(!log.contains("TOKEN_wxA"), "the token is never logged:\n{log}");
}

#[test]
fn the_allow_list_is_checked_when_the_config_loads() {
    let parse = |accounts: &str| {
        wxgate::config::Config::parse(&format!("[server]\naccounts = {accounts}\n"), std::path::Path::new("t.toml"))
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    assert_eq!(parse(r#"["wx1234567890abcdef", "ww_corp-1", "default"]"#), Ok(()));
    assert_eq!(
        parse("[]"),
        Err("t.toml:2: [server] accounts: an empty list refuses every call; leave the key out to allow any account"
            .into())
    );
    assert_eq!(
        parse(r#"["wxA", "wx B"]"#),
        Err(r#"t.toml:2: [server] accounts: "wx B" is not an account name (1-64 of A-Z a-z 0-9 _ -)"#.into())
    );
}

/// Two calls through `learner` and `user`: a token request for `appid`,
/// then a call with its token. Whether the call counted against `appid`.
async fn learned_across(learner: &Gate, user: &Gate, appid: &str) -> bool {
    let token = learner.get(&format!("/cgi-bin/token?grant_type=client_credential&appid={appid}&secret=S")).await;
    assert_eq!(token.status, 200, "{}", token.text());
    assert_eq!(user.get(&format!("{SEND}?access_token=TOKEN_{appid}")).await.status, 200);
    used(user, appid, "send").await == 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gate_started_without_redis_learns_tokens_once_redis_answers() {
    let mut redis = RedisServer::start();
    redis.stop();
    let mock = wechat().await;
    let store = StoreToml::redis(&redis.url()).per_call().set("timeout", "200ms").set("breaker_open", "50ms");
    let gate = Gate::start_real_text(ConfigToml::new(&mock.url()).with(store).with(send_rule())).await;
    let token = gate.get("/cgi-bin/token?grant_type=client_credential&appid=wxA&secret=S").await;
    assert_eq!(token.json()["access_token"], "TOKEN_wxA", "served without Redis");
    assert_eq!(metric(&gate, "wxgate_tokens_learned_total").await, 0.0, "no key to hash it with yet");
    redis.restart();
    let mut n = 0;
    eventually_async("a token learned once Redis is back", PATIENCE, async || {
        n += 1;
        learned_across(&gate, &gate, &format!("wxR{n}")).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_redis_loses_its_data_every_instance_hashes_tokens_alike() {
    let mut redis = RedisServer::start();
    let mock = wechat().await;
    let config = ConfigToml::new(&mock.url()).with(StoreToml::redis(&redis.url()).per_call()).with(send_rule());
    let one = Gate::start_real_text(&config).await;
    assert!(learned_across(&one, &one, "wxBefore").await);
    // Restarted empty: the key is gone with the rest. A new instance starts
    // at about the time the running one notices (within 100 ms).
    redis.stop();
    redis.restart();
    let two = Gate::start_real_text(&config).await;
    // (Each instance decides by its fallback for a moment after the loss,
    // which Redis's buckets count later: hence the polling.)
    let mut n = 0;
    eventually_async("both instances hashing under the same key", PATIENCE, async || {
        n += 1;
        learned_across(&one, &two, &format!("wxAfter{n}")).await
            && learned_across(&two, &one, &format!("wxBack{n}")).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_prefix_counts_against_that_account_across_instances_sharing_redis() {
    let redis = RedisServer::start();
    let mock = MockWeChat::start().await;
    let config = ConfigToml::new(&mock.url())
        .with(StoreToml::redis(&redis.url()).per_call())
        .with(rule("send").matching(SEND).limit_burst(2, "1m", 2));
    let one = Gate::start_real_text(&config).await;
    let two = Gate::start_real_text(&config).await;
    assert_eq!(one.get(&format!("/@wxC{SEND}?access_token=T")).await.status, 200);
    assert_eq!(two.get(&format!("/%40wxC{SEND}?access_token=T")).await.status, 200);
    let third = one.get(&format!("/@wxC{SEND}?access_token=T")).await;
    assert_eq!(third.status, 429, "wxC's 2 per minute are spent across both instances: {}", third.text());
    assert_eq!(two.get(&format!("/@wxD{SEND}?access_token=T")).await.status, 200, "wxD has its own limit");
    for gate in [&one, &two] {
        assert_eq!(tokens_left(gate, "wxC", "send").await, 0);
        assert_eq!(tokens_left(gate, "wxD", "send").await, 1);
        assert_eq!(tokens_left(gate, "default", "send").await, 2, "nothing went to default");
    }
    let seen: Vec<String> = mock.calls().into_iter().map(|c| c.path_and_query).collect();
    assert_eq!(seen, vec![format!("{SEND}?access_token=T"); 3], "WeChat sees the paths without the prefix");
}

// ---- Ambiguous requests: what wxgate reads is what WeChat reads ----

/// `body` sent chunked (no Content-Length) on a raw connection, as
/// `POST path`: the answer's status and body.
async fn post_chunked(gate: &Gate, path: &str, body: &str) -> (u16, String) {
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: wx\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\
         Connection: close\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
        body.len()
    );
    let answer = support::wire::exchange(gate.addr, req.as_bytes()).await.only();
    (answer.status, answer.text())
}

#[tokio::test]
async fn a_token_behind_a_second_parameter_or_an_encoded_name_is_refused_not_counted_elsewhere() {
    let mock = wechat().await;
    let gate = Gate::start(&mock, send_rule()).await;
    let fetch = gate.get("/cgi-bin/token?grant_type=client_credential&appid=wxvictim&secret=S").await;
    assert_eq!(fetch.json()["access_token"], "TOKEN_wxvictim");
    let before = mock.count();
    for query in [
        "access_token=x&component_access_token=TOKEN_wxvictim",
        "access_token=&access_token=TOKEN_wxvictim",
        "access_token=JUNK&access_token=TOKEN_wxvictim",
        "access%5Ftoken=TOKEN_wxvictim",
        "x=1;access_token=TOKEN_wxvictim",
    ] {
        assert_refused(&gate.get_as("wxother", &format!("{SEND}?{query}")).await, query);
        // Without a name too: nothing is guessed.
        if query.contains("JUNK") || query.contains("%5F") {
            assert_refused(&gate.get(&format!("{SEND}?{query}")).await, query);
        }
    }
    assert_eq!(mock.count(), before, "none reached WeChat");
    assert_eq!(used(&gate, "wxother", "send").await, 0);
    assert_eq!(used(&gate, "wxvictim", "send").await, 0);
    assert_eq!(used(&gate, "default", "send").await, 0);
    // The token alone, once, is the victim's own call.
    assert_eq!(gate.get(&format!("{SEND}?access_token=TOKEN_wxvictim")).await.status, 200);
    assert_eq!(used(&gate, "wxvictim", "send").await, 1);
}

#[tokio::test]
async fn a_token_request_that_gives_an_appid_or_secret_twice_is_refused_and_nothing_learned() {
    let mock = wechat().await;
    let gate = Gate::start(&mock, send_rule()).await;
    let twice = "/cgi-bin/token?grant_type=client_credential&appid=wxVICTIM&secret=junk&appid=wxATT&secret=S2";
    assert_refused(&gate.get(twice).await, "appid twice in the query");
    assert_refused(&gate.get("/cgi-bin/gettoken?corpid=wwA&corpsecret=S&corpsecret=T").await, "corpsecret twice");
    let body = r#"{"grant_type":"client_credential","appid":"wxVICTIM","secret":"junk","appid":"wxATT"}"#;
    let a = post_json(&gate, "/cgi-bin/stable_token", body).await;
    assert_refused(&a, "appid twice in the body");
    assert!(a.text().contains("gives key \\\"appid\\\" twice"), "{}", a.text());
    let body = r#"{"grant_type":"client_credential","appid":"wxATT","secret":"S"}"#;
    assert_refused(&post_json(&gate, "/cgi-bin/stable_token?appid=wxVICTIM", body).await, "query and body differ");
    let (status, text) = post_chunked(&gate, "/cgi-bin/stable_token", r#"{"appid":"wxA","appid":"wxB"}"#).await;
    assert_eq!(status, 400, "chunked, appid twice: {text}");
    assert_eq!(mock.count(), 0, "none reached WeChat");
    assert_eq!(metric(&gate, "wxgate_tokens_learned_total").await, 0.0);
}

#[tokio::test]
async fn a_chunked_token_request_is_read_whole_and_learned_and_one_past_the_cap_is_refused() {
    let mock = wechat().await;
    let gate = Gate::start(&mock, send_rule()).await;
    let body = r#"{"grant_type":"client_credential","appid":"wxS","secret":"S"}"#;
    let (status, text) = post_chunked(&gate, "/cgi-bin/stable_token", body).await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("TOKEN_wxS"), "{text}");
    assert_eq!(mock.calls().pop().expect("forwarded").body, body.as_bytes(), "WeChat gets the body whole");
    assert_eq!(metric(&gate, "wxgate_tokens_learned_total").await, 1.0, "learned though chunked");
    // So its token cannot be spent under another account's name.
    assert_refused(&gate.get_as("wxother", &format!("{SEND}?access_token=TOKEN_wxS")).await, "the learned token");
    // Past the 4 KiB cap, chunked or declared: 413, never forwarded.
    let padded = format!(r#"{{"appid":"wxP","secret":"S","pad":"{}"}}"#, " ".repeat(5000));
    let before = mock.count();
    let (status, text) = post_chunked(&gate, "/cgi-bin/stable_token", &padded).await;
    assert_eq!(status, 413, "{text}");
    let declared = post_json(&gate, "/cgi-bin/stable_token", &padded).await;
    assert_eq!(declared.status, 413, "{}", declared.text());
    assert_eq!(declared.json()["errcode"], 40097);
    assert_eq!(mock.count(), before);
}

/// `[server] max_accounts`: made-up account names past the cap are refused
/// before any state exists, so the accounts in use (and the embedded
/// store's room) are untouched; a new day starts the list again.
#[tokio::test]
async fn a_flood_of_new_account_names_cannot_starve_the_accounts_in_use() {
    let mock = wechat().await;
    let config = ConfigToml::new(&mock.url())
        .server("max_accounts", 2)
        .with(StoreToml::memory().set("max_entries", 2))
        .with(send_rule());
    let gate = Gate::start_text(config).await;
    for account in ["wxA", "wxB"] {
        assert_eq!(gate.get_as(account, SEND).await.status, 200);
    }
    for i in 0..5 {
        let a = gate.get_as(&format!("wxFLOOD{i}"), SEND).await;
        assert_eq!((a.status.as_u16(), a.header("x-wxgate-reason")), (429, Some("accounts_full")), "{}", a.text());
        assert_eq!(a.retry_after(), 14 * 3600, "until midnight in quota_timezone: {}", a.text());
        assert_eq!(a.json()["errcode"], 45009);
    }
    assert_eq!(mock.count(), 2, "no flood call reached WeChat");
    for account in ["wxA", "wxB"] {
        assert_eq!(gate.get_as(account, SEND).await.status, 200, "{account} is in use and goes on");
    }
    assert_eq!(metric(&gate, "wxgate_accounts_full_total").await, 5.0);
    gate.advance(Duration::from_secs(14 * 3600));
    assert_eq!(gate.get_as("wxNEW", SEND).await.status, 200, "a new day, a new list");
}
