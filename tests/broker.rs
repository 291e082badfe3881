//! wxgate as the token server (README "wxgate as your token server",
//! docs/tokens.md): `[[account]]` secrets, the token added to calls that
//! carry none, one token per account for every instance, renewal ahead of
//! expiry, one resend after WeChat rejects an added token, token requests
//! for a held account, against the mock WeChat's token endpoints
//! (tests/support/tokens.rs).

use crate::support;

use std::time::Duration;

use support::process::{self, Instance};
use support::redis_server::RedisServer;
use support::temp::TempDir;
use support::tokens::{WeChatTokens, APPID, CORPID, CORPSECRET, SECRET};
use support::{eventually_async, rule, ConfigToml, Gate, MockWeChat, Reply, StoreToml, PATIENCE};

const INFO: &str = "/cgi-bin/user/info";
const SEND: &str = "/cgi-bin/message/custom/send";
const RENEWED: &str = r#"wxgate_token_renewals_total{result="renewed"}"#;
const KEY: &str = "5f0c9a3e7b2d4f6a8c1e3b5d7f9a0c2e4b6d8f1a3c5e7b9d0f2a4c6e8b1d3f5a";

/// The token rule (WeChat's own limits) and two API rules.
fn rules() -> String {
    let token = rule("token")
        .matching("/cgi-bin/token")
        .matching("/cgi-bin/stable_token")
        .matching("/cgi-bin/gettoken")
        .limit(2000, "day");
    let info = rule("info").matching(INFO).limit(1000, "day");
    let send = rule("send").matching(SEND).limit(100, "day");
    format!("{token}\n{info}\n{send}")
}

/// An `[[account]]` whose secret is in a file of `dir`.
fn account(dir: &TempDir, id: &str, kind: &str, secret: &str, extra: &str) -> String {
    let file = dir.write_secret(&format!("{id}.secret"), &format!("{secret}\n"));
    format!("[[account]]\nid = \"{id}\"\nkind = \"{kind}\"\nsecret_file = \"{}\"\n{extra}\n", file.display())
}

/// A mock WeChat issuing tokens, its token endpoints answering after `delay_ms`.
async fn wechat(delay_ms: u64) -> (MockWeChat, WeChatTokens) {
    support::tokens::mock_wechat(delay_ms).await
}

/// The `access_token` each recorded call to `path` carried, in order.
fn tokens_sent(mock: &MockWeChat, path: &str) -> Vec<String> {
    mock.calls()
        .iter()
        .filter(|c| c.path_and_query.split('?').next() == Some(path))
        .map(|c| {
            let q = c.path_and_query.split_once('?').map_or("", |(_, q)| q);
            q.split('&').find_map(|p| p.strip_prefix("access_token=")).unwrap_or("").to_owned()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_concurrent_calls_without_a_token_fetch_one_and_all_carry_it() {
    let (mock, tokens) = wechat(200).await;
    let dir = TempDir::new("broker-twenty");
    let config = ConfigToml::new(&mock.url()).with(rules()).with(account(&dir, APPID, "official_account", SECRET, ""));
    let gate = Gate::start_text(config).await;
    let paths: Vec<String> = (0..20).map(|i| format!("{INFO}?openid=o{i}&lang=zh_CN")).collect();
    let calls: Vec<_> = paths.iter().map(|p| gate.get_as(APPID, p)).collect();
    for answer in futures_util::future::join_all(calls).await {
        assert_eq!((answer.status.as_u16(), answer.json()["errcode"].as_i64()), (200, Some(0)), "{}", answer.text());
    }
    assert_eq!(tokens.fetches("stable"), 1, "one stable_token fetch for 20 calls");
    let sent = tokens_sent(&mock, INFO);
    assert_eq!(sent.len(), 20);
    assert!(!sent[0].is_empty() && sent.iter().all(|t| *t == sent[0]), "all forwarded with the one token: {sent:?}");
    assert_eq!(tokens.issued(), vec![sent[0].clone()]);
    // The query is the caller's, with the token added at its end.
    let first = mock.calls().into_iter().find(|c| c.path_and_query.starts_with(INFO)).expect("a call");
    assert!(first.path_and_query.contains("&lang=zh_CN&access_token="), "{}", first.path_and_query);
    assert_eq!(gate.metric("wxgate_token_injections_total").await, Some(20.0));
    // The fetch counted against the token rule, on the account.
    let bucket = support::admin(gate.admin_addr(), "GET", &format!("/v1/buckets/{APPID}/token"), None).await.json();
    assert_eq!(bucket["limits"][0]["used"], 1, "{bucket}");
    // An empty access_token is filled too; a caller's own token passes as it is.
    let empty = gate.get_as(APPID, &format!("{INFO}?access_token=&openid=x")).await;
    assert_eq!(empty.json()["errcode"], 0, "{}", empty.text());
    let own = gate.get_as(APPID, &format!("{INFO}?access_token=NOT_ISSUED&openid=x")).await;
    assert_eq!(own.json()["errcode"], 40001, "a caller's own token is not replaced");
    assert_eq!(tokens.fetches("stable"), 1);
}

#[tokio::test]
async fn a_rejected_added_token_is_replaced_and_the_call_sent_once_more() {
    let (mock, tokens) = wechat(0).await;
    let dir = TempDir::new("broker-40001");
    let config = ConfigToml::new(&mock.url()).with(rules()).with(account(&dir, APPID, "official_account", SECRET, ""));
    let gate = Gate::start_text(config).await;
    assert_eq!(gate.get_as(APPID, &format!("{INFO}?openid=o1")).await.json()["errcode"], 0);
    let first = tokens_sent(&mock, INFO).remove(0);
    // WeChat invalidates it (a force_refresh elsewhere, a secret reset).
    tokens.invalidate(&first);
    let body = r#"{"touser":"o1","msgtype":"text","text":{"content":"hello"}}"#;
    let answer = gate.post_as(APPID, SEND, body).await;
    assert_eq!((answer.status.as_u16(), answer.json()["errcode"].as_i64()), (200, Some(0)), "{}", answer.text());
    let sends: Vec<_> = mock.calls().into_iter().filter(|c| c.path_and_query.starts_with(SEND)).collect();
    assert_eq!(sends.len(), 2, "the call reached WeChat exactly twice");
    assert!(sends.iter().all(|c| c.body == body.as_bytes()), "sent byte-identical both times");
    let sent = tokens_sent(&mock, SEND);
    assert_eq!(sent[0], first);
    assert_ne!(sent[1], first);
    assert_eq!(tokens.fetches("stable"), 2, "one new fetch");
    assert_eq!(gate.metric("wxgate_token_resends_total").await, Some(1.0));
    assert_eq!(gate.metric("wxgate_token_invalidations_total").await, Some(1.0));
    // The one admission stands for the one call WeChat acted on.
    let bucket = support::admin(gate.admin_addr(), "GET", &format!("/v1/buckets/{APPID}/send"), None).await.json();
    assert_eq!(bucket["limits"][0]["used"], 1, "{bucket}");
    // The next call carries the new token: no fetch, no resend.
    assert_eq!(gate.get_as(APPID, &format!("{INFO}?openid=o2")).await.json()["errcode"], 0);
    assert_eq!(tokens_sent(&mock, INFO).last(), Some(&sent[1]));
    assert_eq!(tokens.fetches("stable"), 2);
}

#[tokio::test]
async fn an_added_token_rejected_twice_reaches_the_caller_after_one_resend() {
    let mock = MockWeChat::start().await;
    let tokens = WeChatTokens::new();
    let reply = tokens.responder();
    let rejecting = tokens.clone();
    // Every send is refused for its token, which WeChat then forgets: the
    // next fetch gives a new one.
    mock.respond(move |rec| {
        if rec.path_and_query.starts_with(SEND) {
            let q = rec.path_and_query.split_once('?').map_or("", |(_, q)| q);
            if let Some(t) = q.split('&').find_map(|p| p.strip_prefix("access_token=")) {
                rejecting.invalidate(t);
            }
            return support::errcode_reply(40001);
        }
        reply(rec)
    });
    let dir = TempDir::new("broker-twice");
    let config = ConfigToml::new(&mock.url()).with(rules()).with(account(&dir, APPID, "official_account", SECRET, ""));
    let gate = Gate::start_text(config).await;
    let answer = gate.post_as(APPID, SEND, r#"{"touser":"o1"}"#).await;
    assert_eq!(answer.json()["errcode"], 40001, "WeChat's second answer: {}", answer.text());
    assert_eq!(tokens_sent(&mock, SEND).len(), 2, "sent once more, never a third time");
    assert_eq!(gate.metric("wxgate_token_resends_total").await, Some(1.0));
}

#[tokio::test]
async fn a_held_accounts_token_is_renewed_ahead_of_expiry_without_a_call_waiting() {
    let (mock, tokens) = wechat(0).await;
    let dir = TempDir::new("broker-renew");
    let held = account(&dir, APPID, "official_account", SECRET, "token_api = \"token\"");
    let gate = Gate::start_text(ConfigToml::new(&mock.url()).with(rules()).with(held)).await;
    assert_eq!(gate.get_as(APPID, &format!("{INFO}?openid=o1")).await.json()["errcode"], 0);
    let first = tokens_sent(&mock, INFO).remove(0);
    // 10 minutes before its end: nothing yet.
    gate.advance(Duration::from_secs(7200 - 600));
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(tokens.fetches("token"), 1, "not renewed with 10 minutes left");
    // Less than 5 minutes left: the renewal task fetches, no call asked.
    gate.advance(Duration::from_secs(320));
    // Renewed once the new token is stored and held (WeChat answering is not enough).
    eventually_async("renewed", PATIENCE, async || gate.metric(RENEWED).await == Some(1.0)).await;
    assert_eq!(tokens.fetches("token"), 2);
    assert_eq!(gate.get_as(APPID, &format!("{INFO}?openid=o2")).await.json()["errcode"], 0);
    let second = tokens_sent(&mock, INFO).remove(1);
    assert_ne!(second, first, "the next call carries the renewed token");
    assert_eq!(tokens.fetches("token"), 2, "and waited for no fetch");
}

#[tokio::test]
async fn token_requests_for_a_held_account_need_its_secret_and_get_the_one_token() {
    let (mock, tokens) = wechat(0).await;
    let dir = TempDir::new("broker-requests");
    let config = ConfigToml::new(&mock.url()).with(rules()).with(account(&dir, APPID, "official_account", SECRET, ""));
    let gate = Gate::start_text(config).await;
    let wrong = gate.get(&format!("/cgi-bin/token?grant_type=client_credential&appid={APPID}&secret=guess")).await;
    assert_eq!((wrong.status.as_u16(), wrong.json()["errcode"].as_i64()), (403, Some(40125)), "{}", wrong.text());
    assert_eq!(mock.count(), 0, "never forwarded");
    let right = gate.get(&format!("/cgi-bin/token?grant_type=client_credential&appid={APPID}&secret={SECRET}")).await;
    assert_eq!(right.status, 200, "{}", right.text());
    let token = right.json()["access_token"].as_str().unwrap_or_default().to_owned();
    let stable = gate
        .post(
            "/cgi-bin/stable_token",
            &format!(r#"{{"grant_type":"client_credential","appid":"{APPID}","secret":"{SECRET}"}}"#),
        )
        .await;
    assert_eq!(stable.json()["access_token"].as_str(), Some(token.as_str()), "{}", stable.text());
    assert_eq!(gate.get_as(APPID, &format!("{INFO}?openid=o1")).await.json()["errcode"], 0);
    assert_eq!(tokens_sent(&mock, INFO), vec![token], "calls get the token the requests got");
    assert_eq!((tokens.fetches("stable"), tokens.fetches("token")), (1, 0), "one token for the account");
    assert!(!wrong.text().contains("guess") && !right.text().contains(SECRET));
}

#[tokio::test]
async fn callers_get_a_token_only_for_the_accounts_they_are_granted() {
    let (mock, tokens) = wechat(0).await;
    let dir = TempDir::new("broker-grants");
    let key = |name: &str| dir.write_secret(&format!("{name}.key"), &format!("key-of-{name}-0123456789"));
    let (hr, ops) = (key("hr"), key("ops"));
    let callers = format!(
        "[[caller]]\nname = \"hr\"\nkey_file = \"{}\"\naccounts = [\"{APPID}\"]\n\n\
         [[caller]]\nname = \"ops\"\nkey_file = \"{}\"\naccounts = [\"{CORPID}\", \"wxOTHER\"]\n",
        hr.display(),
        ops.display()
    );
    let wecom = account(&dir, CORPID, "wecom", CORPSECRET, "agent = \"1000002\"");
    let config = ConfigToml::new(&mock.url())
        .server("caller_auth", "required")
        .with(rules())
        .with(callers)
        .with(account(&dir, APPID, "official_account", SECRET, ""))
        .with(wecom);
    let gate = Gate::start_text(config).await;
    let bearer = |who: &str| format!("Bearer key-of-{who}-0123456789");
    // hr's one grant is its account: a call naming none gets its token.
    let hr_call = gate.get_with(&format!("{INFO}?openid=o1"), &[("authorization", &bearer("hr"))]).await;
    assert_eq!(hr_call.json()["errcode"], 0, "{}", hr_call.text());
    // ops may not spend the official account: refused, never a token.
    let ops_call = gate
        .get_with(&format!("{INFO}?openid=o1"), &[("authorization", &bearer("ops")), ("x-wx-account", APPID)])
        .await;
    assert_eq!(ops_call.status, 403, "{}", ops_call.text());
    // ops names none and has two grants: "default", not granted, refused.
    let unnamed = gate.get_with(&format!("{INFO}?openid=o1"), &[("authorization", &bearer("ops"))]).await;
    assert_eq!(unnamed.status, 403, "{}", unnamed.text());
    // ops's WeCom app gets the corp's token from gettoken.
    let wecom_call = gate
        .get_with("/cgi-bin/user/get?userid=u1", &[("authorization", &bearer("ops")), ("x-wx-account", CORPID)])
        .await;
    assert_eq!(wecom_call.json()["errcode"], 0, "{}", wecom_call.text());
    assert_eq!((tokens.fetches("stable"), tokens.fetches("gettoken")), (1, 1));
    assert_eq!(tokens_sent(&mock, INFO).len(), 1, "only hr's call was forwarded");
}

/// Issue 44 item 3: a caller granted one account named it (`@wxOTHER`) and
/// asked a token for a held account it is not granted (`appid=` that
/// account, with its secret): the broker answered with that account's
/// token, counted on the account named. The appid is the account: refused.
#[tokio::test]
async fn a_token_request_for_an_appid_the_caller_is_not_granted_gets_no_token_whatever_it_names() {
    let (mock, tokens) = wechat(0).await;
    let dir = TempDir::new("broker-grant-appid");
    let ops = dir.write_secret("ops.key", "key-of-ops-0123456789");
    let callers = format!("[[caller]]\nname = \"ops\"\nkey_file = \"{}\"\naccounts = [\"wxOTHER\"]\n", ops.display());
    let config = ConfigToml::new(&mock.url())
        .server("caller_auth", "required")
        .with(rules())
        .with(callers)
        .with(account(&dir, APPID, "official_account", SECRET, ""));
    let gate = Gate::start_text(config).await;
    let auth = ("authorization", "Bearer key-of-ops-0123456789");
    let query = format!("grant_type=client_credential&appid={APPID}&secret={SECRET}");
    let stable = format!(r#"{{"grant_type":"client_credential","appid":"{APPID}","secret":"{SECRET}"}}"#);
    let named = [
        gate.get_with(&format!("/@wxOTHER/cgi-bin/token?{query}"), &[auth]).await,
        gate.get_with(&format!("/cgi-bin/token?{query}"), &[auth, ("x-wx-account", "wxOTHER")]).await,
        gate.post_with("/@wxOTHER/cgi-bin/stable_token", &stable, &[auth]).await,
    ];
    for a in &named {
        assert_eq!(a.status, 400, "{}", a.text());
        assert!(a.json()["access_token"].is_null(), "no token: {}", a.text());
    }
    // Naming nothing: the appid is the account, not granted.
    let unnamed = gate.get_with(&format!("/cgi-bin/token?{query}"), &[auth]).await;
    assert_eq!(unnamed.status, 403, "{}", unnamed.text());
    assert_eq!((mock.count(), tokens.fetches("stable")), (0, 0), "nothing fetched, nothing forwarded");
}

#[test]
fn accounts_are_checked_and_their_secrets_never_printed() {
    let dir = TempDir::new("broker-check");
    let check = |text: &str| {
        let path = dir.write("wxgate.toml", text);
        process::run(&["check", "--config", path.to_str().expect("path")], &[])
    };
    let base = "[server]\nupstream = \"http://127.0.0.1:9\"\n";
    let ok = format!("{base}{}", account(&dir, APPID, "official_account", SECRET, ""));
    let (code, out, err) = check(&ok);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains(APPID) && out.contains("stable_token"), "check names the account and its token API:\n{out}");
    assert!(!out.contains(SECRET) && !err.contains(SECRET), "the secret is never printed");
    // A secret file others may read.
    let open = dir.write("open.secret", SECRET);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    }
    let bad = [
        (
            format!(
                "{base}[[account]]\nid = \"{APPID}\"\nkind = \"official_account\"\nsecret_file = \"{}\"\n",
                open.display()
            ),
            "chmod 600",
        ),
        (
            format!(
                "{base}[[account]]\nid = \"{APPID}\"\nkind = \"official_account\"\nsecret_file = \"/nonexistent/s\"\n"
            ),
            "/nonexistent/s",
        ),
        (format!("{base}{}", account(&dir, CORPID, "wecom", CORPSECRET, "")), "AgentId"),
        (
            format!("{base}{}", account(&dir, APPID, "official_account", SECRET, "token_api = \"gettoken\"")),
            "token_api",
        ),
        (
            format!(
                "[server]\nupstream = \"http://127.0.0.1:9\"\nlisten = \"0.0.0.0:8080\"\ncaller_auth = \"off\"\n{}",
                account(&dir, APPID, "official_account", SECRET, "")
            ),
            "caller_auth = \"required\"",
        ),
    ];
    for (text, says) in bad {
        let (code, out, err) = check(&text);
        assert_ne!(code, 0, "{text}");
        assert!(err.contains(says) || out.contains(says), "{text}\nshould say {says}:\n{out}{err}");
        assert!(!err.contains(SECRET) && !out.contains(SECRET));
    }
    // A secret_env not set where check runs is a warning (the deployment's
    // environment is elsewhere; start-up refuses it: tests/config.rs).
    let unset = format!(
        "{base}[[account]]\nid = \"{APPID}\"\nkind = \"official_account\"\nsecret_env = \"WXGATE_TEST_UNSET_SECRET\"\n"
    );
    let (code, _, err) = check(&unset);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("WXGATE_TEST_UNSET_SECRET (an [[account]]'s secret_env) is not set here"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_on_one_redis_fetch_one_token_and_no_secret_leaves_wxgate() {
    let redis = RedisServer::start();
    let (mock, tokens) = wechat(300).await;
    let dir = TempDir::new("broker-redis");
    let config = ConfigToml::new(&mock.url())
        .with(StoreToml::redis(&redis.url()).set("key_prefix", "brk"))
        .with(rules())
        .with(account(&dir, APPID, "official_account", SECRET, ""))
        .with(account(&dir, support::tokens::PLATFORM, "platform", support::tokens::PLATFORM_SECRET, ""))
        .to_string();
    // Without a token key the instances could not share the token: refused.
    let refused = process::spawn(&config, "broker-nokey", &[]).err().unwrap_or_default();
    assert!(refused.contains("token key"), "{refused}");
    let env = [("WXGATE_TOKEN_KEY", KEY), ("WXGATE_LOG", "debug")];
    let instances: Vec<Instance> = (0..3)
        .map(|i| process::spawn(&config, &format!("broker-{i}"), &env).unwrap_or_else(|log| panic!("start:\n{log}")))
        .collect();
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..30 {
        let addr = instances[i % 3].addr;
        calls.spawn(async move { support::get_as_at(addr, APPID, &format!("{INFO}?openid=o{i}")).await });
    }
    while let Some(answer) = calls.join_next().await {
        let answer = answer.expect("call task");
        assert_eq!(answer.json()["errcode"], 0, "{}", answer.text());
    }
    assert_eq!(tokens.fetches("stable"), 1, "one fetch for 30 calls on 3 instances");
    let sent = tokens_sent(&mock, INFO);
    assert!(sent.iter().all(|t| *t == sent[0]), "one token on every instance");
    let token = sent[0].clone();
    // A platform's requests through another instance: its secret, verify
    // ticket and refresh token are never stored nor logged.
    use support::tokens::{AUTHORIZER, PLATFORM, PLATFORM_SECRET, REFRESH};
    let component = format!(
        r#"{{"component_appid":"{PLATFORM}","component_appsecret":"{PLATFORM_SECRET}","component_verify_ticket":"ticket@@@VERIFY"}}"#
    );
    let answer = instances[1].post("/cgi-bin/component/api_component_token", &component).await;
    let platform_token = answer.json()["component_access_token"].as_str().unwrap_or_default().to_owned();
    assert!(!platform_token.is_empty(), "{}", answer.text());
    let body = format!(
        r#"{{"component_appid":"{PLATFORM}","authorizer_appid":"{AUTHORIZER}","authorizer_refresh_token":"{REFRESH}"}}"#
    );
    let at = format!("/cgi-bin/component/api_authorizer_token?component_access_token={platform_token}");
    for i in &instances {
        let answer = i.post(&at, &body).await;
        assert_eq!(answer.json()["authorizer_refresh_token"].as_str(), Some(REFRESH), "{}", answer.text());
    }
    assert_eq!((tokens.fetches("component"), tokens.fetches("authorizer")), (1, 1), "cached for every instance");
    // Ten ticket requests on three instances: one fetch.
    let mut asks = tokio::task::JoinSet::new();
    for i in 0..10 {
        let addr = instances[i % 3].addr;
        asks.spawn(async move { support::get_as_at(addr, APPID, JSAPI).await });
    }
    let mut tickets = Vec::new();
    while let Some(answer) = asks.join_next().await {
        tickets.push(ticket_of(&answer.expect("ticket task")));
    }
    assert!(tickets.iter().all(|t| *t == tickets[0]) && tokens.fetches("ticket") == 1, "{tickets:?}");
    // WeChat rejects the token on one instance: resent there, and the
    // token (and its ticket) renewed for all.
    tokens.invalidate(&token);
    let resent = instances[2].get_as(APPID, &format!("{INFO}?openid=again")).await;
    assert_eq!(resent.json()["errcode"], 0, "{}", resent.text());
    assert_eq!(tokens.fetches("stable"), 2);
    assert_ne!(ticket_of(&instances[0].get_as(APPID, JSAPI).await), tickets[0]);
    assert_eq!(tokens.fetches("ticket"), 2);
    let dump = redis.dump_all();
    let mut metrics = String::new();
    for i in &instances {
        metrics.push_str(&i.admin_get("/metrics").await.text());
        metrics.push_str(&i.admin_get("/v1/rules").await.text());
        metrics.push_str(&i.admin_get(&format!("/v1/buckets/{APPID}/token")).await.text());
    }
    let mut logs = String::new();
    for i in instances {
        logs.push_str(&i.stop().await);
    }
    for secret in [SECRET, token.as_str(), PLATFORM_SECRET, REFRESH, "ticket@@@VERIFY", tickets[0].as_str()] {
        assert!(!dump.windows(secret.len()).any(|w| w == secret.as_bytes()), "{secret} in Redis in clear");
        assert!(!metrics.contains(secret), "{secret} in an admin answer");
        assert!(!logs.contains(secret), "{secret} in a log:\n{logs}");
    }
    assert!(logs.contains("fetched the account's access token"), "{logs}");
}

const JSAPI: &str = "/cgi-bin/ticket/getticket?type=jsapi";

fn ticket_of(a: &support::Answer) -> String {
    assert_eq!(a.json()["errcode"], 0, "{}", a.text());
    a.json()["ticket"].as_str().unwrap_or_else(|| panic!("no ticket in {}", a.text())).to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tickets_are_fetched_once_per_account_whatever_token_the_caller_brings() {
    let mock = MockWeChat::start().await;
    let tokens = WeChatTokens::new();
    let reply = tokens.responder();
    // Ticket fetches take a while, so ten askers meet one in flight.
    mock.respond(move |rec| {
        let r = reply(rec);
        if rec.path_and_query.starts_with("/cgi-bin/ticket/") {
            Reply::Delayed { ms: 200, then: Box::new(r) }
        } else {
            r
        }
    });
    let dir = TempDir::new("broker-tickets");
    let config = ConfigToml::new(&mock.url()).with(rules()).with(account(&dir, APPID, "official_account", SECRET, ""));
    let gate = Gate::start_text(config).await;
    let asks: Vec<_> = (0..10).map(|_| gate.get_as(APPID, JSAPI)).collect();
    let tickets: Vec<String> = futures_util::future::join_all(asks).await.iter().map(ticket_of).collect();
    assert!(tickets.iter().all(|t| *t == tickets[0]), "{tickets:?}");
    assert_eq!(tokens.fetches("ticket"), 1, "one ticket fetch for ten requests");
    assert!(gate.get_as(APPID, JSAPI).await.json()["expires_in"].as_i64().is_some_and(|s| s > 7000));
    // A caller with the account's own token (fetched with its secret) gets the same ticket.
    let token = gate.get(&format!("/cgi-bin/token?grant_type=client_credential&appid={APPID}&secret={SECRET}")).await;
    let token = token.json()["access_token"].as_str().unwrap_or_default().to_owned();
    assert_eq!(ticket_of(&gate.get(&format!("{JSAPI}&access_token={token}")).await), tickets[0]);
    assert_eq!(tokens.fetches("ticket"), 1);
    // A token wxgate cannot tie to the account it names never reads that
    // account's ticket: the request goes to WeChat as it came.
    let unproven = gate.get_as(APPID, &format!("{JSAPI}&access_token=SOMEONE_ELSES")).await;
    assert_eq!(unproven.json()["errcode"], 40001, "{}", unproven.text());
    // wx_card is a ticket of its own.
    assert_ne!(ticket_of(&gate.get_as(APPID, "/cgi-bin/ticket/getticket?type=wx_card").await), tickets[0]);
    assert_eq!(tokens.fetches("ticket"), 2);
    // WeChat rejects the token: the ticket fetched with it goes too, and
    // the next request fetches once (with the new token).
    tokens.invalidate(&token);
    assert_eq!(gate.get_as(APPID, &format!("{INFO}?openid=o1")).await.json()["errcode"], 0, "resent with a new token");
    let fresh = ticket_of(&gate.get_as(APPID, JSAPI).await);
    assert_ne!(fresh, tickets[0]);
    assert_eq!(tokens.fetches("ticket"), 3);
    assert_eq!(ticket_of(&gate.get_as(APPID, JSAPI).await), fresh);
}

#[tokio::test]
async fn wecom_tickets_are_the_corps_and_the_apps() {
    let (mock, tokens) = wechat(0).await;
    let dir = TempDir::new("broker-wecom-tickets");
    let wecom = account(&dir, CORPID, "wecom", CORPSECRET, "agent = \"1000002\"");
    let gate = Gate::start_text(ConfigToml::new(&mock.url()).with(rules()).with(wecom)).await;
    let corp = ticket_of(&gate.get_as(CORPID, "/cgi-bin/get_jsapi_ticket").await);
    let app = ticket_of(&gate.get_as(CORPID, "/cgi-bin/ticket/get?type=agent_config").await);
    assert_ne!(corp, app);
    assert_eq!(ticket_of(&gate.get_as(CORPID, "/cgi-bin/get_jsapi_ticket").await), corp);
    assert_eq!(ticket_of(&gate.get_as(CORPID, "/cgi-bin/ticket/get?type=agent_config").await), app);
    assert_eq!((tokens.fetches("ticket"), tokens.fetches("gettoken")), (2, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_platforms_component_and_authorizer_tokens_are_cached_and_its_secret_checked() {
    use support::tokens::{AUTHORIZER, PLATFORM, PLATFORM_SECRET, REFRESH};
    let (mock, tokens) = wechat(0).await;
    let dir = TempDir::new("broker-platform");
    let platform_rule = rule("platform")
        .matching("/cgi-bin/component/api_component_token")
        .matching("/cgi-bin/component/api_authorizer_token")
        .limit(2000, "day");
    let config = ConfigToml::new(&mock.url()).with(rules()).with(platform_rule).with(account(
        &dir,
        PLATFORM,
        "platform",
        PLATFORM_SECRET,
        "",
    ));
    let gate = Gate::start_text(config).await;
    let component = |secret: &str, ticket: &str| {
        format!(
            r#"{{"component_appid":"{PLATFORM}","component_appsecret":"{secret}","component_verify_ticket":"{ticket}"}}"#
        )
    };
    let path = "/cgi-bin/component/api_component_token";
    let wrong = gate.post(path, &component("guess", "ticket@@@1")).await;
    assert_eq!(wrong.status.as_u16(), 403, "{}", wrong.text());
    let first = gate.post(path, &component(PLATFORM_SECRET, "ticket@@@1")).await;
    let token = first.json()["component_access_token"].as_str().unwrap_or_default().to_owned();
    assert!(!token.is_empty(), "{}", first.text());
    // Ten minutes later the platform asks with the new verify ticket: cached.
    let again = gate.post(path, &component(PLATFORM_SECRET, "ticket@@@2")).await;
    assert_eq!(again.json()["component_access_token"].as_str(), Some(token.as_str()));
    assert_eq!(tokens.fetches("component"), 1);
    // Authorizer tokens: one fetch for five askers, the refresh token repeated.
    let body = format!(
        r#"{{"component_appid":"{PLATFORM}","authorizer_appid":"{AUTHORIZER}","authorizer_refresh_token":"{REFRESH}"}}"#
    );
    let at = format!("/cgi-bin/component/api_authorizer_token?component_access_token={token}");
    let asks: Vec<_> = (0..5).map(|_| gate.post(&at, &body)).collect();
    let answers = futures_util::future::join_all(asks).await;
    let authorizer = answers[0].json()["authorizer_access_token"].as_str().unwrap_or_default().to_owned();
    assert!(!authorizer.is_empty(), "{}", answers[0].text());
    for a in &answers {
        assert_eq!(a.json()["authorizer_access_token"].as_str(), Some(authorizer.as_str()), "{}", a.text());
        assert_eq!(a.json()["authorizer_refresh_token"].as_str(), Some(REFRESH));
    }
    assert_eq!(tokens.fetches("authorizer"), 1);
    // Calls with the authorizer's token count against the authorizer.
    let call = gate.get(&format!("{INFO}?access_token={authorizer}&openid=o1")).await;
    assert_eq!(call.json()["errcode"], 0);
    let bucket = support::admin(gate.admin_addr(), "GET", &format!("/v1/buckets/{AUTHORIZER}/info"), None).await.json();
    assert_eq!(bucket["limits"][0]["used"], 1, "{bucket}");
}

/// The console's token card (`/v1/health`): the renewal task's first fetch
/// of an account's token (at start, no call asking) is a fetch, never a
/// renewal ("fetched 0 · renewed 1" was shown, issue 65); the fetch ahead
/// of its expiry is a fetch and a renewal.
#[tokio::test]
async fn the_first_fetch_of_an_accounts_token_is_counted_fetched_and_its_renewal_renewed() {
    let (mock, tokens) = wechat(0).await;
    let dir = TempDir::new("broker-first-fetch");
    let held = account(&dir, APPID, "official_account", SECRET, "token_api = \"token\"");
    let gate = Gate::start_text(ConfigToml::new(&mock.url()).with(rules()).with(held)).await;
    let card = async || {
        let health = support::admin(gate.admin_addr(), "GET", "/v1/health", None).await.json();
        (health["tokens"]["fetched"].as_u64(), health["tokens"]["renewed"].as_u64())
    };
    let mut shown = (None, None);
    eventually_async("the first fetch counted", PATIENCE, async || {
        shown = card().await;
        shown != (Some(0), Some(0))
    })
    .await;
    assert_eq!(shown, (Some(1), Some(0)), "(fetched, renewed) after the first fetch");
    // A call carries that token (waiting for its fetch if under way): it is stored.
    assert_eq!(gate.get_as(APPID, &format!("{INFO}?openid=o1")).await.json()["errcode"], 0);
    assert_eq!(tokens.fetches("token"), 1);
    gate.advance(Duration::from_secs(7200 - 280));
    eventually_async("renewed", PATIENCE, async || {
        shown = card().await;
        shown.1 == Some(1)
    })
    .await;
    assert_eq!(shown, (Some(2), Some(1)), "(fetched, renewed) after the renewal");
    assert_eq!(gate.metric(RENEWED).await, Some(1.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_with_an_injected_clock_the_token_is_renewed_ahead_of_expiry() {
    let redis = RedisServer::start();
    let (mock, tokens) = wechat(0).await;
    let dir = TempDir::new("broker-redis-renew");
    let key = dir.write_secret("token.key", KEY);
    let held = account(&dir, APPID, "official_account", SECRET, "token_api = \"token\"");
    let text = ConfigToml::new(&mock.url())
        .with(StoreToml::redis(&redis.url()).set("key_prefix", "renew"))
        .with(format!("[tokens]\nkey_file = \"{}\"\n", key.display()))
        .with(rules())
        .with(held)
        .to_string();
    let gate = Gate::start_redis_on_manual_clock(text).await;
    assert_eq!(gate.get_as(APPID, &format!("{INFO}?openid=o1")).await.json()["errcode"], 0);
    assert_eq!(tokens.fetches("token"), 1);
    gate.advance(Duration::from_secs(7200 - 280));
    eventually_async("renewed in Redis", PATIENCE, async || gate.metric(RENEWED).await == Some(1.0)).await;
    assert_eq!(gate.get_as(APPID, &format!("{INFO}?openid=o2")).await.json()["errcode"], 0);
    let sent = tokens_sent(&mock, INFO);
    assert_ne!(sent[0], sent[1], "the call after the renewal carries the new token");
    assert_eq!(tokens.fetches("token"), 2);
}

#[tokio::test]
async fn a_ticket_in_use_is_renewed_ahead_of_expiry() {
    let (mock, tokens) = wechat(0).await;
    let dir = TempDir::new("broker-ticket-renew");
    let held = account(&dir, APPID, "official_account", SECRET, "token_api = \"token\"");
    let gate = Gate::start_text(ConfigToml::new(&mock.url()).with(rules()).with(held)).await;
    let first = ticket_of(&gate.get_as(APPID, JSAPI).await);
    assert_eq!(tokens.fetches("ticket"), 1);
    gate.advance(Duration::from_secs(7200 - 280));
    // The token, then the ticket (stored: WeChat answering is not enough).
    eventually_async("ticket renewed", PATIENCE, async || gate.metric(RENEWED).await == Some(2.0)).await;
    assert_eq!(tokens.fetches("ticket"), 2);
    let renewed = ticket_of(&gate.get_as(APPID, JSAPI).await);
    assert_ne!(renewed, first, "the next request gets the renewed ticket");
    assert_eq!(tokens.fetches("ticket"), 2, "without waiting for a fetch");
    // The ticket was fetched with the account's token, renewed too.
    let sent = tokens_sent(&mock, "/cgi-bin/ticket/getticket");
    assert_ne!(sent[0], sent[1]);
    assert_eq!(tokens.fetches("token"), 2);
}

#[tokio::test]
async fn a_rotated_secret_file_takes_effect_on_reload_and_no_secret_reaches_the_state_file() {
    let (mock, tokens) = wechat(0).await;
    let dir = TempDir::new("broker-rotate");
    let secret = dir.write_secret("wx.secret", "OLD_SECRET_REVOKED");
    let text = ConfigToml::new(&mock.url())
        .with(StoreToml::memory().set("state_file", dir.join("state.json").display().to_string()))
        .with(rules())
        .with(format!(
            "[[account]]\nid = \"{APPID}\"\nkind = \"official_account\"\nsecret_file = \"{}\"\n",
            secret.display()
        ))
        .to_string();
    let path = dir.write("wxgate.toml", &text);
    let gate = Gate::start_file(&path).await;
    // WeChat refuses the old secret: the call gets WeChat's errcode, 502.
    let refused = gate.get_as(APPID, &format!("{INFO}?openid=o1")).await;
    assert_eq!((refused.status.as_u16(), refused.json()["errcode"].as_i64()), (502, Some(40125)), "{}", refused.text());
    assert!(!refused.text().contains("OLD_SECRET"), "{}", refused.text());
    assert_eq!(tokens_sent(&mock, INFO).len(), 0, "never forwarded without a token");
    // The secret is rotated, the config reloaded: the new one is used.
    dir.write_secret("wx.secret", SECRET);
    wxgate::ops::reload::reload(gate.app(), &path).await.expect("reload");
    gate.advance(Duration::from_secs(3));
    let answer = gate.get_as(APPID, &format!("{INFO}?openid=o1")).await;
    assert_eq!(answer.json()["errcode"], 0, "{}", answer.text());
    let token = tokens_sent(&mock, INFO).remove(0);
    assert_eq!(tokens.fetches("stable"), 2, "one refused fetch with the old secret, one with the new");
    // Nothing of the secrets or the token is in the state file or its journal.
    let gate = gate.restart().await;
    drop(gate);
    let mut stored = Vec::new();
    for entry in walk(dir.path()) {
        if !entry.to_string_lossy().ends_with(".secret") {
            stored.extend(std::fs::read(&entry).unwrap_or_default());
        }
    }
    assert!(!stored.is_empty());
    for secret in [SECRET, "OLD_SECRET_REVOKED", token.as_str()] {
        assert!(!stored.windows(secret.len()).any(|w| w == secret.as_bytes()), "{secret} stored by wxgate");
    }
}

/// Every file under `dir`.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

#[tokio::test]
async fn a_failing_renewal_backs_off_so_a_wrong_secret_spends_little_of_the_token_quota() {
    let (mock, tokens) = wechat(0).await;
    let dir = TempDir::new("broker-backoff");
    let wrong = account(&dir, APPID, "official_account", "NOT_THE_SECRET", "");
    let gate = Gate::start_text(ConfigToml::new(&mock.url()).with(rules()).with(wrong)).await;
    let errors = r#"wxgate_token_renewals_total{result="error"}"#;
    // The renewal task fetches at start (no call waits for the first token).
    eventually_async("first try", PATIENCE, async || gate.metric(errors).await == Some(1.0)).await;
    gate.advance(Duration::from_secs(31));
    eventually_async("second try after 30 s", PATIENCE, async || gate.metric(errors).await == Some(2.0)).await;
    // The next waits 60 s: nothing 31 s later ...
    gate.advance(Duration::from_secs(31));
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(gate.metric(errors).await, Some(2.0), "backed off");
    // ... and the third try after the 60 s.
    gate.advance(Duration::from_secs(30));
    eventually_async("third try after 60 s", PATIENCE, async || gate.metric(errors).await == Some(3.0)).await;
    assert_eq!(tokens.fetches("stable"), 3);
    drop(mock);
}

#[tokio::test]
async fn a_ticket_request_that_could_be_read_two_ways_is_refused() {
    let (mock, _tokens) = wechat(0).await;
    let dir = TempDir::new("broker-ambiguous-ticket");
    let config = ConfigToml::new(&mock.url()).with(rules()).with(account(&dir, APPID, "official_account", SECRET, ""));
    let gate = Gate::start_text(config).await;
    // WeChat might read the second type: the jsapi slot must never get a wx_card ticket.
    for query in ["type=jsapi&type=wx_card", "ty%70e=jsapi", "TYPE=jsapi&type=wx_card", "type=jsapi;type=wx_card"] {
        let answer = gate.get_as(APPID, &format!("/cgi-bin/ticket/getticket?{query}")).await;
        assert_eq!(
            (answer.status.as_u16(), answer.json()["errcode"].as_i64()),
            (400, Some(40097)),
            "{query}: {}",
            answer.text()
        );
    }
    assert_eq!(mock.count(), 0, "never forwarded, no token fetched for them");
}

#[tokio::test]
async fn a_chunked_injected_call_is_not_kept_so_a_rejection_reaches_the_caller_once() {
    let (mock, tokens) = wechat(0).await;
    let dir = TempDir::new("broker-chunked");
    let config = ConfigToml::new(&mock.url()).with(rules()).with(account(&dir, APPID, "official_account", SECRET, ""));
    let gate = Gate::start_text(config).await;
    assert_eq!(gate.get_as(APPID, &format!("{INFO}?openid=o1")).await.json()["errcode"], 0);
    tokens.invalidate(&tokens_sent(&mock, INFO).remove(0));
    // No Content-Length: streamed to WeChat as it comes, so not kept for a
    // resend; WeChat's 40001 reaches the caller, and the token is renewed.
    let body = r#"{"touser":"o1"}"#;
    let raw = format!(
        "POST /@{APPID}{SEND} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
        body.len()
    );
    let answers = support::exchange(gate.addr, raw.as_bytes()).await.responses();
    assert_eq!(answers.len(), 1);
    let json: serde_json::Value = serde_json::from_slice(&answers[0].body).expect("json");
    assert_eq!(json["errcode"], 40001, "{json}");
    let sends: Vec<_> = mock.calls().into_iter().filter(|c| c.path_and_query.starts_with(SEND)).collect();
    assert_eq!(sends.len(), 1, "sent once, never again");
    assert_eq!(sends[0].body, body.as_bytes(), "forwarded byte-identical");
    // The next call gets a new token.
    assert_eq!(gate.post_as(APPID, SEND, body).await.json()["errcode"], 0);
    assert_eq!(tokens.fetches("stable"), 2);
}

/// Issue 44 (suspicion, confirmed): with `token_api = "token"`, a token
/// request wxgate did not recognise (here a POST to `/cgi-bin/token` with
/// the account's secret) went to WeChat, which issued a new token and so
/// invalidated the one wxgate adds to calls. Refused (400), never sent.
#[tokio::test]
async fn a_token_request_wxgate_cannot_read_never_replaces_the_brokers_token() {
    let (mock, tokens) = wechat(0).await;
    let dir = TempDir::new("broker-post-token");
    let config = ConfigToml::new(&mock.url()).with(rules()).with(account(
        &dir,
        APPID,
        "official_account",
        SECRET,
        "token_api = \"token\"",
    ));
    let gate = Gate::start_text(config).await;
    assert_eq!(gate.get_as(APPID, &format!("{INFO}?openid=o1")).await.json()["errcode"], 0);
    let query = format!("grant_type=client_credential&appid={APPID}&secret={SECRET}");
    let posted = gate.post(&format!("/cgi-bin/token?{query}"), "").await;
    assert_eq!(posted.status, 400, "{}", posted.text());
    assert_eq!(tokens.fetches("token"), 1, "only the broker's own fetch reached WeChat");
    assert_eq!(gate.get_as(APPID, &format!("{INFO}?openid=o2")).await.json()["errcode"], 0);
    let sent = tokens_sent(&mock, INFO);
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[0], sent[1], "the broker's token still is the one");
}

/// A gate holding the platform's `[[account]]` (and `extra`), and the
/// component token it fetched through the gate.
async fn platform_gate(mock: &MockWeChat, dir: &TempDir, extra: &str) -> (Gate, String) {
    use support::tokens::{PLATFORM, PLATFORM_SECRET};
    let platform_rule = rule("platform")
        .matching("/cgi-bin/component/api_component_token")
        .matching("/cgi-bin/component/api_authorizer_token")
        .limit(2000, "day");
    let config = ConfigToml::new(&mock.url())
        .with(rules())
        .with(platform_rule)
        .with(account(dir, PLATFORM, "platform", PLATFORM_SECRET, ""))
        .with(extra);
    let gate = Gate::start_text(config).await;
    let body = format!(
        r#"{{"component_appid":"{PLATFORM}","component_appsecret":"{PLATFORM_SECRET}","component_verify_ticket":"t@@@1"}}"#
    );
    let answer = gate.post("/cgi-bin/component/api_component_token", &body).await;
    let token = answer.json()["component_access_token"].as_str().unwrap_or_default().to_owned();
    assert!(!token.is_empty(), "{}", answer.text());
    (gate, token)
}

/// An `api_authorizer_token` request with this component token.
async fn authorizer_token(gate: &Gate, component_token: &str) -> support::Answer {
    use support::tokens::{AUTHORIZER, PLATFORM, REFRESH};
    let body = format!(
        r#"{{"component_appid":"{PLATFORM}","authorizer_appid":"{AUTHORIZER}","authorizer_refresh_token":"{REFRESH}"}}"#
    );
    gate.post(&format!("/cgi-bin/component/api_authorizer_token?component_access_token={component_token}"), &body).await
}

/// Issue 44 item 9: a platform asking the authorizer token of an account
/// whose appid is also an `[[account]]` got 403/40125: its refresh token was
/// compared with the account's appsecret. The authorizer token is the
/// platform's to ask for.
#[tokio::test]
async fn a_platform_gets_the_authorizer_token_of_an_appid_wxgate_also_holds() {
    use support::tokens::AUTHORIZER;
    let (mock, tokens) = wechat(0).await;
    let dir = TempDir::new("broker-authorizer-held");
    let own = account(&dir, AUTHORIZER, "official_account", "SEKRIT_AUTHORIZER_OWN", "");
    let (gate, component) = platform_gate(&mock, &dir, &own).await;
    let a = authorizer_token(&gate, &component).await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert!(a.json()["authorizer_access_token"].as_str().is_some_and(|t| !t.is_empty()), "{}", a.text());
    assert_eq!(tokens.fetches("authorizer"), 1);
}

/// Issue 44 item 10: the authorizer-token slot ignored the request's
/// `component_access_token`: after one good fetch a bogus component token
/// got the cached authorizer token, and a bogus one reaching WeChat first
/// had its 40001 served to the platform's valid request for 2 s. The
/// component token is part of what names the slot.
#[tokio::test]
async fn an_authorizer_token_is_served_only_to_the_component_token_that_proved_it() {
    let (mock, tokens) = wechat(0).await;
    let dir = TempDir::new("broker-authorizer-proof");
    let (gate, component) = platform_gate(&mock, &dir, "").await;
    // A bogus component token first: WeChat's 40001 is its own.
    let bogus = authorizer_token(&gate, "BOGUS_COMPONENT_TOKEN").await;
    assert_eq!(bogus.json()["errcode"], 40001, "{}", bogus.text());
    let good = authorizer_token(&gate, &component).await;
    let token = good.json()["authorizer_access_token"].as_str().unwrap_or_default().to_owned();
    assert!(!token.is_empty(), "the valid request is not given the bogus one's refusal: {}", good.text());
    // After the good fetch, another bogus token is not given the cached token.
    let again = authorizer_token(&gate, "ANOTHER_BOGUS_TOKEN").await;
    assert_eq!(again.json()["errcode"], 40001, "{}", again.text());
    assert!(!again.text().contains(&token), "the cached authorizer token reached a bogus component token");
    assert_eq!(authorizer_token(&gate, &component).await.json()["authorizer_access_token"].as_str(), Some(&*token));
    assert_eq!(tokens.fetches("authorizer"), 3, "two bogus ones went to WeChat, the good one once");
}

/// Issue 44 (suspicion, confirmed by WeChat's docs: rid/get answers
/// `"request_url":"access_token=50_Im7xxxx"`): wxgate added the account's
/// token to `rid/get`, whose answer shows the token of the call a rid names,
/// so a caller that is never given the token could read it. wxgate no
/// longer adds it there: such a call is refused (400) before it is sent;
/// one with a token of the caller's own goes on.
#[tokio::test]
async fn rid_get_never_shows_a_caller_the_token_wxgate_adds() {
    let (mock, tokens) = wechat(0).await;
    let (reply, seen) = (tokens.responder(), mock.clone());
    mock.respond(move |rec| {
        if !rec.path_and_query.to_ascii_lowercase().starts_with("/cgi-bin/openapi/rid/get") {
            return reply(rec);
        }
        // WeChat: the query of the call the rid names (here: the last one).
        let last = seen.calls().into_iter().rev().nth(1).map(|c| c.path_and_query).unwrap_or_default();
        let url = last.split_once('?').map_or("", |(_, q)| q).to_owned();
        Reply::Json {
            body: serde_json::json!({"errcode": 0, "errmsg": "ok", "request": {"request_url": url}}).to_string(),
            content_type: "application/json",
        }
    });
    let dir = TempDir::new("broker-rid-get");
    let config = ConfigToml::new(&mock.url()).with(rules()).with(account(&dir, APPID, "official_account", SECRET, ""));
    let gate = Gate::start_text(config).await;
    assert_eq!(gate.get_as(APPID, &format!("{INFO}?openid=o1")).await.json()["errcode"], 0);
    let token = tokens.issued().pop().expect("the broker's token");
    let before = mock.count();
    for path in ["/cgi-bin/openapi/rid/get", "/cgi-bin/OpenAPI/rid/get", "/cgi-bin/openapi/rid/get/"] {
        let a = gate.post_as(APPID, path, r#"{"rid":"6740e5a1-0b3c7d2e-1f2a3b4c"}"#).await;
        assert!(!a.text().contains(&token), "{path}: the token reached the caller: {}", a.text());
        assert_eq!(a.status, 400, "{path}: {}", a.text());
    }
    assert_eq!(mock.count(), before, "none was sent");
    // A caller's own token: its rid/get goes on, and shows it only its own.
    let own = gate.post_as(APPID, &format!("/cgi-bin/openapi/rid/get?access_token={token}"), r#"{"rid":"r"}"#).await;
    assert_eq!(own.json()["errcode"], 0, "{}", own.text());
}
