//! `caller_auth = "required"`: who may spend which account. Each call
//! proves its `[[caller]]` with that caller's key (`Authorization: Bearer`,
//! or HTTP Basic `<caller>:<key>`), and may spend only the accounts the
//! caller is granted. Checked through what users see: answers, the mock
//! WeChat's requests, the buckets of the admin API and the metrics.

use crate::support;

use std::path::PathBuf;

use base64::Engine as _;
use support::*;

const SEND: &str = "/cgi-bin/message/custom/send";
const ORDERS_KEY: &str = "orders-key-0123456789abcdef";
const APPROVALS_KEY: &str = "approvals-key-fedcba9876543210";

/// A key file only its owner may read.
fn key_file(dir: &TempDir, name: &str, key: &str) -> PathBuf {
    let path = dir.write(name, &format!("{key}\n"));
    set_mode(&path, 0o600);
    path
}

fn set_mode(path: &std::path::Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// `orders` (normal, key in a file, granted wxA) and `approvals` (high,
/// key by its hash, granted every account); "send": 2 a day, a reserve of
/// 50 % for high-priority callers.
fn config(mock: &MockWeChat, dir: &TempDir) -> ConfigToml {
    let orders = caller("orders")
        .set("key_file", key_file(dir, "orders.key", ORDERS_KEY).display().to_string())
        .set("accounts", vec!["wxA"]);
    let approvals = caller("approvals").high().set("key_sha256", key_sha256(APPROVALS_KEY)).set("accounts", vec!["*"]);
    ConfigToml::new(&mock.url())
        .server("caller_auth", "required")
        .with(orders)
        .with(approvals)
        .with(rule("send").matching(SEND).limit(4, "day").set("reserve", "50%"))
}

fn bearer(key: &str) -> String {
    format!("Bearer {key}")
}

fn basic(name: &str, key: &str) -> String {
    format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{name}:{key}")))
}

async fn call(gate: &Gate, account: &str, auth: Option<&str>, extra: &[(&str, &str)]) -> Answer {
    let mut headers = vec![("x-wx-account", account)];
    if let Some(a) = auth {
        headers.push(("authorization", a));
    }
    headers.extend_from_slice(extra);
    gate.get_with(&format!("{SEND}?access_token=T"), &headers).await
}

/// Calls counted today for the pair (0 when it has no state at all).
async fn used(gate: &Gate, account: &str) -> u64 {
    let b = get_at(gate.admin_addr(), &format!("/v1/buckets/{account}/send")).await;
    b.json()["limits"][0]["used"].as_u64().unwrap_or(0)
}

fn assert_denied(a: &Answer, status: u16, reason: &str, what: &str) {
    assert_eq!(a.status, status, "{what}: {}", a.text());
    assert_eq!(a.json()["errcode"], 48001, "{what}: {}", a.text());
    assert_eq!(a.header("x-wxgate-reason"), Some(reason), "{what}");
}

#[tokio::test]
async fn a_call_without_its_callers_key_is_refused_401_and_nothing_is_counted() {
    let (mock, dir) = (MockWeChat::start().await, TempDir::new("auth-401"));
    let gate = Gate::start_text(config(&mock, &dir)).await;
    let wrong = [
        None,
        Some(bearer("not-a-key-of-anyone")),
        Some(basic("approvals", ORDERS_KEY)), // orders' key under another name
        Some(format!("Token {ORDERS_KEY}")),
        Some("Basic !!!".to_owned()),
    ];
    for auth in &wrong {
        let a = call(&gate, "wxA", auth.as_deref(), &[]).await;
        assert_denied(&a, 401, "unauthenticated", &format!("{auth:?}"));
        assert_eq!(a.header("www-authenticate"), Some("Bearer realm=\"wxgate\""));
        assert!(!a.text().contains(ORDERS_KEY), "the key is never repeated");
    }
    // Two credentials are one too many.
    let two = [("authorization", bearer(ORDERS_KEY)), ("authorization", bearer(APPROVALS_KEY))];
    let pairs: Vec<(&str, &str)> = two.iter().map(|(k, v)| (*k, v.as_str())).collect();
    assert_denied(&gate.get_with(SEND, &pairs).await, 401, "unauthenticated", "two Authorization headers");
    assert_eq!(mock.count(), 0, "none reached WeChat");
    assert_eq!(used(&gate, "wxA").await, 0);
    let n = wrong.len() as f64 + 1.0;
    assert_eq!(
        gate.metric("wxgate_caller_auth_refusals_total{caller=\"other\",reason=\"unauthenticated\"}").await,
        Some(n)
    );
    assert_eq!(gate.metric("wxgate_calls_total{rule=\"send\",outcome=\"unauthorized\"}").await, Some(n));
}

#[tokio::test]
async fn a_proven_caller_spends_only_its_granted_accounts_and_its_key_never_reaches_wechat() {
    let (mock, dir) = (MockWeChat::start().await, TempDir::new("auth-grants"));
    let gate = Gate::start_text(config(&mock, &dir).with(StoreToml::memory().set("max_entries", 2))).await;
    assert_eq!(call(&gate, "wxA", Some(&bearer(ORDERS_KEY)), &[]).await.status, 200, "Bearer");
    assert_eq!(call(&gate, "wxA", Some(&basic("orders", ORDERS_KEY)), &[]).await.status, 200, "Basic");
    let sent = mock.calls();
    assert!(sent.iter().all(|c| c.headers.get("authorization").is_none()), "the credential is taken off");
    // Naming an account it is not granted: 403, not forwarded, no state.
    for (account, auth) in [("wxVICTIM", bearer(ORDERS_KEY)), ("default", basic("orders", ORDERS_KEY))] {
        assert_denied(&call(&gate, account, Some(&auth), &[]).await, 403, "forbidden", account);
    }
    let prefixed = gate.get_with(&format!("/@wxVICTIM{SEND}"), &[("authorization", &bearer(ORDERS_KEY))]).await;
    assert_denied(&prefixed, 403, "forbidden", "@wxVICTIM");
    assert_eq!(mock.count(), 2);
    assert_eq!(used(&gate, "wxVICTIM").await, 0);
    assert_eq!(
        gate.metric("wxgate_caller_auth_refusals_total{caller=\"orders\",reason=\"forbidden\"}").await,
        Some(3.0)
    );
    // The caller granted every account may spend the victim's: the store
    // (max_entries = 2) has room for it, as the refusals created no state.
    assert_eq!(call(&gate, "wxVICTIM", Some(&bearer(APPROVALS_KEY)), &[]).await.status, 200);
    assert_eq!(used(&gate, "wxVICTIM").await, 1);
    assert_eq!(call(&gate, "wxC", Some(&bearer(APPROVALS_KEY)), &[]).await.status, 503, "the store is full now");
}

/// Issue 44 item 15: with `caller_auth` off, `Authorization` was forwarded,
/// so a `caller:KEY@` base URL (docs/callers.md) handed the key to WeChat.
/// WeChat's API reads no credential from a header: neither `Authorization`
/// nor `Proxy-Authorization` ever reaches it, with authentication off or on.
#[tokio::test]
async fn a_callers_key_never_reaches_wechat_with_caller_auth_off_or_on() {
    let (mock, dir) = (MockWeChat::start().await, TempDir::new("auth-never-forwarded"));
    let off = Gate::start(&mock, rule("send").matching(SEND).limit(100, "day")).await;
    let on = Gate::start_text(config(&mock, &dir)).await;
    let (orders, proxy) = (basic("orders", ORDERS_KEY), basic("proxy", "proxy-secret"));
    let path = format!("{SEND}?access_token=T");
    let off_calls = [
        vec![("authorization", orders.as_str())],
        vec![("authorization", orders.as_str()), ("authorization", "Bearer second")],
        vec![("proxy-authorization", proxy.as_str()), ("proxy-authorization", "Basic again")],
    ];
    for headers in &off_calls {
        assert_eq!(off.get_with(&path, headers).await.status, 200, "caller_auth off: {headers:?}");
    }
    let on_headers =
        [("x-wx-account", "wxA"), ("authorization", orders.as_str()), ("proxy-authorization", proxy.as_str())];
    assert_eq!(on.get_with(&path, &on_headers).await.status, 200, "caller_auth on");
    let sent = mock.calls();
    assert_eq!(sent.len(), 4);
    for c in &sent {
        let given: Vec<_> =
            ["authorization", "proxy-authorization"].into_iter().filter(|h| c.headers.contains_key(*h)).collect();
        assert!(given.is_empty(), "WeChat got {given:?}: {:?}", c.headers);
    }
}

#[tokio::test]
async fn priority_comes_from_the_proven_caller_never_from_a_header() {
    let (mock, dir) = (MockWeChat::start().await, TempDir::new("auth-priority"));
    let gate = Gate::start_text(config(&mock, &dir)).await;
    // orders claiming to be approvals (high priority, which may use the reserve).
    let claim = call(&gate, "wxA", Some(&bearer(ORDERS_KEY)), &[("x-wx-caller", "approvals")]).await;
    assert_eq!(claim.status, 400, "{}", claim.text());
    assert!(claim.text().contains("another caller than the one this call's key proves"), "{}", claim.text());
    // Naming itself is fine; the header is never forwarded.
    let own = call(&gate, "wxA", Some(&bearer(ORDERS_KEY)), &[("x-wx-caller", "orders")]).await;
    assert_eq!(own.status, 200);
    assert!(mock.calls().iter().all(|c| c.headers.get("x-wx-caller").is_none()));
    // orders is normal: it leaves the reserve (2 of 4) to approvals.
    assert_eq!(call(&gate, "wxA", Some(&bearer(ORDERS_KEY)), &[]).await.status, 200);
    let reserved = call(&gate, "wxA", Some(&bearer(ORDERS_KEY)), &[]).await;
    assert_eq!((reserved.status.as_u16(), reserved.header("x-wxgate-reason")), (429, Some("reserve")));
    for _ in 0..2 {
        assert_eq!(call(&gate, "wxA", Some(&bearer(APPROVALS_KEY)), &[]).await.status, 200, "high takes the reserve");
    }
    assert_eq!(used(&gate, "wxA").await, 4);
}

#[tokio::test]
async fn a_reload_cannot_turn_authentication_off_but_may_change_keys_and_grants() {
    let (mock, dir) = (MockWeChat::start().await, TempDir::new("auth-reload"));
    let path = dir.join("rules.toml");
    std::fs::write(&path, config(&mock, &dir).to_string()).expect("write");
    let gate = Gate::start_file(&path).await;
    assert_eq!(call(&gate, "wxA", Some(&bearer(ORDERS_KEY)), &[]).await.status, 200);
    let open = ConfigToml::new(&mock.url()).with(rule("send").matching(SEND).limit(4, "day"));
    std::fs::write(&path, open.to_string()).expect("write");
    let refused = wxgate::ops::reload::reload(gate.app(), &path).await;
    assert!(refused.is_err_and(|e| e.to_string().contains("cannot turn caller authentication off")));
    assert_denied(&call(&gate, "wxA", None, &[]).await, 401, "unauthenticated", "still required");
    // A new key for orders takes effect at once; the old one is refused.
    let rotated = config(&mock, &dir).with(String::new());
    let text = rotated.to_string().replace(&dir.join("orders.key").display().to_string(), &{
        key_file(&dir, "orders2.key", "orders-new-key-5555555555").display().to_string()
    });
    std::fs::write(&path, text).expect("write");
    wxgate::ops::reload::reload(gate.app(), &path).await.expect("reload");
    assert_denied(&call(&gate, "wxA", Some(&bearer(ORDERS_KEY)), &[]).await, 401, "unauthenticated", "old key");
    assert_eq!(call(&gate, "wxA", Some(&bearer("orders-new-key-5555555555")), &[]).await.status, 200, "new key");
}

/// Issue 44 item 1: every distinct access_token a call carried was kept
/// whole in the serving thread's token cache, even when the call was then
/// refused: one caller with any key could grow the shared egress by the
/// size of its tokens (16,384 entries × up to 64 KiB per thread). A call
/// naming an account its caller is not granted is refused before its
/// token is looked at, an absurdly long token is refused before it is
/// looked up, and what is kept of any other token is a fixed-size digest.
#[tokio::test]
async fn refused_calls_with_large_distinct_tokens_leave_nothing_in_the_token_cache() {
    let (mock, dir) = (MockWeChat::start().await, TempDir::new("auth-token-flood"));
    let gate = Gate::start_text(config(&mock, &dir)).await;
    let token = |i: usize, len: usize| format!("{i:08}{}", "T".repeat(len - 8));
    for i in 0..40 {
        // Not granted wxVICTIM: 403 before the token is looked up.
        let path = format!("{SEND}?access_token={}", token(i, 16_000));
        let a = gate.get_with(&path, &[("x-wx-account", "wxVICTIM"), ("authorization", &bearer(ORDERS_KEY))]).await;
        assert_denied(&a, 403, "forbidden", "not granted");
        let prefixed = format!("/@wxVICTIM{SEND}?access_token={}", token(100 + i, 16_000));
        let a = gate.get_with(&prefixed, &[("authorization", &bearer(ORDERS_KEY))]).await;
        assert_denied(&a, 403, "forbidden", "@wxVICTIM");
    }
    assert_eq!(gate.app().features.accounts.owners.held(), (0, 0), "nothing of the refused calls' tokens is kept");
    for i in 0..40 {
        // Granted, but a token no WeChat token is near: 400 before the lookup.
        let path = format!("{SEND}?access_token={}", token(200 + i, 16_000));
        let a = gate.get_with(&path, &[("authorization", &bearer(APPROVALS_KEY))]).await;
        assert_eq!(a.status, 400, "{}", a.text());
        assert!(a.text().contains("longer than the 1024 characters"), "{}", a.text());
    }
    assert_eq!(gate.app().features.accounts.owners.held(), (0, 0), "nor of the overlong tokens");
    assert_eq!(mock.count(), 0);
    // A granted call with a token of an ordinary size is looked up and
    // remembered (as unknown) by its digest.
    let a = gate
        .get_with(&format!("{SEND}?access_token={}", token(1, 200)), &[("authorization", &bearer(APPROVALS_KEY))])
        .await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(gate.app().features.accounts.owners.held(), (0, 1));
}

/// Queued delivery's results (`/v1/deliveries`) under `caller_auth =
/// "required"`: a job is read and cancelled only with its caller's key; a
/// name without its key is refused 401, another caller's key finds nothing.
#[tokio::test]
async fn a_delivery_is_read_and_cancelled_only_with_its_callers_key() {
    use support::queue::{msgid, wechat, ASYNC};
    use support::tokens::{account_toml, APPID, SECRET};
    const TEMPLATE: &str = "/cgi-bin/message/template/send";
    let (mock, _tokens) = wechat(|_, n| msgid(n)).await;
    let dir = TempDir::new("auth-deliveries");
    let token = rule("token").matching("/cgi-bin/token").matching("/cgi-bin/stable_token").limit(100, "day");
    let send = rule("template_send").matching(TEMPLATE).limit(1, "day").set("queue", true);
    let orders = caller("orders").set("key_file", key_file(&dir, "orders.key", ORDERS_KEY).display().to_string());
    let approvals = caller("approvals").set("key_sha256", key_sha256(APPROVALS_KEY));
    let queue = format!("[queue]\nfile = \"{}\"\n", dir.path().join("queue.db").display());
    let config = ConfigToml::new(&mock.url())
        .server("caller_auth", "required")
        .with(orders.set("accounts", vec![APPID]))
        .with(approvals.set("accounts", vec!["*"]))
        .with(format!("{token}\n{send}"))
        .with(account_toml(&dir, APPID, "official_account", SECRET, ""))
        .with(queue);
    let gate = Gate::start_text(config).await;
    let by_orders = bearer(ORDERS_KEY);
    let mut ids = Vec::new();
    for i in 0..2 {
        let body = format!(r#"{{"touser":"o{i}"}}"#);
        let a = gate.post_with(&format!("/@{APPID}{TEMPLATE}"), &body, &[ASYNC, ("authorization", &by_orders)]).await;
        assert_eq!(a.status, 202, "{}", a.text());
        ids.push(a.json()["delivery"].as_str().expect("id").to_owned());
    }
    // The first goes; the second waits for the next quota day.
    let path = format!("/v1/deliveries/{}", ids[1]);
    let mut state = serde_json::Value::Null;
    eventually_async("the second waits", PATIENCE, async || {
        state = gate.get_with(&path, &[("authorization", &by_orders)]).await.json();
        state["state"] == "waiting"
    })
    .await;
    // Its caller's name without its key: refused, as any call would be.
    let named = [("x-wx-caller", "orders")];
    for a in [gate.get_with(&path, &named).await, gate.delete_with(&path, &named).await] {
        assert_denied(&a, 401, "unauthenticated", "a name and no key");
    }
    // Another caller's key: no such delivery, for reading or cancelling.
    let by_approvals = bearer(APPROVALS_KEY);
    let other = [("authorization", by_approvals.as_str())];
    for a in [gate.get_with(&path, &other).await, gate.delete_with(&path, &other).await] {
        assert_eq!(a.status, 404, "another caller's key: {}", a.text());
    }
    let listed = gate.get_with("/v1/deliveries", &other).await.json();
    assert_eq!(listed["queues"], serde_json::json!([]), "another caller sees no queue: {listed}");
    // Its own key: cancelled.
    let a = gate.delete_with(&path, &[("authorization", &by_orders)]).await;
    assert_eq!((a.status.as_u16(), a.json()["state"].clone()), (200, serde_json::json!("cancelled")), "{}", a.text());
}
