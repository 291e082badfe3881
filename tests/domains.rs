//! Both WeChat domains through one wxgate: the Official Account's
//! `api.weixin.qq.com` (the file's own rules) and WeCom's
//! `qyapi.weixin.qq.com` (a `[[domain]]` with the rules of another file).
//! The same path is another API with another quota on each, so a call is
//! counted by its own domain's rule and sent to its own domain's upstream:
//! by a `/<host>/` prefix for direct calls, by the tunnel's host for
//! intercepted ones. Two mocks stand for the two hosts.

use crate::support;

use support::intercept::{through, TestCa};
use support::process::run;
use support::*;

/// `user/get` is the Official Account's 1-a-day rule here and WeCom's
/// 3-a-minute one.
fn configs(oa: &MockWeChat, wecom: &MockWeChat, dir: &TempDir) -> ConfigToml {
    let wecom_rules = dir.write(
        "rules-wecom.toml",
        "[server]\nupstream = \"https://qyapi.weixin.qq.com\"\n\n[[rule]]\nname = \"member_read\"\nmatch = \
         [\"/cgi-bin/user/get\"]\nlimits = [{ count = 3, per = \"1m\", burst = 3 }]\n",
    );
    ConfigToml::new(&oa.url()).with(rule("user_get").matching("/cgi-bin/user/get").limit(1, "day")).with(format!(
        "[[domain]]\nhost = \"qyapi.weixin.qq.com\"\nrules = {}\nupstream = \"{}\"\n",
        toml::Value::from(wecom_rules.display().to_string()),
        wecom.url()
    ))
}

#[tokio::test]
async fn the_same_path_on_both_domains_is_counted_by_its_own_rule_and_sent_to_its_own_host() {
    let (oa, wecom) = (MockWeChat::start().await, MockWeChat::start().await);
    let dir = TempDir::new("domains");
    let gate = Gate::start_text(configs(&oa, &wecom, &dir)).await;

    // The Official Account's read: 1 a day.
    assert_eq!(gate.get_as("wxapp", "/cgi-bin/user/get?openid=o1").await.status, 200);
    let refused = gate.get_as("wxapp", "/cgi-bin/user/get?openid=o2").await;
    assert_eq!(refused.status, 429, "{}", refused.text());

    // WeCom's member read of the same path: its own 3 a minute, untouched
    // by the Official Account's day being spent, and sent to WeCom's host
    // without the prefix.
    for i in 0..3 {
        let a = gate.get_as("wwcorp", &format!("/qyapi.weixin.qq.com/cgi-bin/user/get?userid=u{i}")).await;
        assert_eq!(a.status, 200, "call {i}: {}", a.text());
    }
    let fourth = gate.get("/qyapi.weixin.qq.com/@wwcorp/cgi-bin/user/get?userid=u4").await;
    assert_eq!(fourth.status, 429, "{}", fourth.text());
    assert!(fourth.text().contains("qyapi.member_read"), "named by its domain: {}", fourth.text());

    let paths = |m: &MockWeChat| m.calls().into_iter().map(|c| c.path_and_query).collect::<Vec<_>>();
    assert_eq!(paths(&oa), ["/cgi-bin/user/get?openid=o1"]);
    assert_eq!(
        paths(&wecom),
        ["/cgi-bin/user/get?userid=u0", "/cgi-bin/user/get?userid=u1", "/cgi-bin/user/get?userid=u2"]
    );

    // Each pair's state under its own rule's name.
    let token = None;
    let oa_bucket = admin(gate.admin_addr(), "GET", "/v1/buckets/wxapp/user_get", token).await.json();
    let wecom_bucket = admin(gate.admin_addr(), "GET", "/v1/buckets/wwcorp/qyapi.member_read", token).await.json();
    assert_eq!(oa_bucket["limits"][0]["used"], 1, "{oa_bucket}");
    assert_eq!(wecom_bucket["limits"][0]["count"], 3, "{wecom_bucket}");
    let none = admin(gate.admin_addr(), "GET", "/v1/buckets/wwcorp/user_get", token).await.json();
    assert_eq!(none["limits"][0]["used"], 0, "WeCom's calls never counted by the Official Account's rule: {none}");
    let calls = gate.metric("wxgate_calls_total{rule=\"qyapi.member_read\",outcome=\"forwarded\"}").await;
    assert_eq!(calls, Some(3.0));
}

#[tokio::test]
async fn a_domain_prefix_no_domain_serves_is_refused_and_never_forwarded() {
    let (oa, wecom) = (MockWeChat::start().await, MockWeChat::start().await);
    let dir = TempDir::new("domains");
    let only_oa = Gate::start(&oa, rule("user_get").matching("/cgi-bin/user/get").limit(1, "day")).await;
    let a = only_oa.get("/qyapi.weixin.qq.com/cgi-bin/user/get").await;
    assert_eq!(a.status, 400, "{}", a.text());
    assert!(a.text().contains("qyapi.weixin.qq.com is a WeChat host no [[domain]]"), "{}", a.text());

    let gate = Gate::start_text(configs(&oa, &wecom, &dir)).await;
    for (path, why) in [
        ("/@wwcorp/qyapi.weixin.qq.com/cgi-bin/user/get", "a domain prefix goes first"),
        ("/qyapi.weixin.qq.com/qyapi.weixin.qq.com/cgi-bin/user/get", "a domain prefix goes first, once"),
        ("/qyapi.weixin.qq.com/", "must be followed by the API path"),
        ("/api3.example.com/cgi-bin/user/get", "the first path segment names no domain"),
        ("/QYAPI.weixin.qq.com/cgi-bin/user/get", "not a WeChat API path"),
        ("/a.b_c/cgi-bin/user/get", "no WeChat API path has a dot in its first segment"),
        // An encoded prefix is never decoded into a domain: refused as a path.
        ("/qyapi%2Eweixin.qq.com/cgi-bin/user/get", "not a WeChat API path"),
        ("/qyapi.weixin.qq.com%2Fcgi-bin/user/get", "not a WeChat API path"),
        ("/%71yapi.weixin.qq.com/cgi-bin/user/get", "not a WeChat API path"),
    ] {
        let a = gate.get(path).await;
        assert_eq!(a.status, 400, "{path}: {}", a.text());
        assert!(a.text().contains(why), "{path}: {}", a.text());
    }
    assert_eq!(oa.count() + wecom.count(), 0, "nothing forwarded");
}

#[tokio::test]
async fn intercepted_calls_count_by_the_domain_of_their_host() {
    let (oa, wecom) = (MockWeChat::start().await, MockWeChat::start().await);
    let dir = TempDir::new("domains");
    let ca = TestCa::new();
    let section = format!(
        "[intercept]\nca_cert = {}\nca_key = {}\nupstream = {{ \"api.weixin.qq.com\" = \"{}\", \"qyapi.weixin.qq.com\" \
         = \"{}\" }}\n",
        toml::Value::from(ca.cert.display().to_string()),
        toml::Value::from(ca.key.display().to_string()),
        oa.url(),
        wecom.url(),
    );
    let gate = Gate::start_text(configs(&oa, &wecom, &dir).with(section)).await;
    let path = "/cgi-bin/user/get?access_token=T";
    assert_eq!(through(&gate, &ca, "api.weixin.qq.com", path).await.0, 200);
    let (status, body) = through(&gate, &ca, "api.weixin.qq.com", path).await;
    assert_eq!(status, 429, "the Official Account's day is spent: {body}");
    for i in 0..3 {
        let (status, body) = through(&gate, &ca, "qyapi.weixin.qq.com", path).await;
        assert_eq!(status, 200, "WeCom's call {i} is under its own rule: {body}");
    }
    let (status, body) = through(&gate, &ca, "qyapi.weixin.qq.com", path).await;
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("qyapi.member_read"), "{body}");
    let (status, body) = through(&gate, &ca, "qyapi.weixin.qq.com", &format!("/qyapi.weixin.qq.com{path}")).await;
    assert_eq!(status, 400, "the host is the domain: {body}");
    assert_eq!((oa.count(), wecom.count()), (1, 3));
}

/// `wxgate check` (and start-up, which compiles alike) on configs that
/// would mix the domains up.
#[test]
fn check_refuses_a_config_that_would_mix_the_domains_up() {
    let dir = TempDir::new("domains-check");
    let wecom = dir.write("wecom.toml", "[[rule]]\nname = \"default\"\nlimits = []\n");
    let domain = |host: &str| format!("[[domain]]\nhost = \"{host}\"\nrules = \"wecom.toml\"\n");
    let ca = TestCa::new();
    let intercept = |hosts: &str| {
        format!(
            "[intercept]\nhosts = {hosts}\nca_cert = {}\nca_key = {}\n",
            toml::Value::from(ca.cert.display().to_string()),
            toml::Value::from(ca.key.display().to_string())
        )
    };
    let head = "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"off\"\n\n";
    let cases = [
        (domain("api2.weixin.qq.com"), "api2.weixin.qq.com serves the same WeChat domain as api.weixin.qq.com"),
        (domain("qyapi.weixin.qq.com") + &domain("qyapi.weixin.qq.com"), "another domain is qyapi.weixin.qq.com"),
        (domain("qyapi.weixin.qq.com") + &domain("qyapi.example.com"), "\"qyapi\" is another domain's name already"),
        (intercept("[\"qyapi.weixin.qq.com\"]"), "\"qyapi.weixin.qq.com\" is a WeChat host of no domain here"),
        ("[[domain]]\nhost = \"qyapi.weixin.qq.com\"\nrules = \"missing.toml\"\n".into(), "cannot read"),
    ];
    for (i, (text, want)) in cases.iter().enumerate() {
        let path = dir.write(&format!("c{i}.toml"), &format!("{head}{text}"));
        let (code, stdout, stderr) = run(&["check", "--config", &path.display().to_string()], &[]);
        assert_eq!(code, 2, "{text}: {stdout}");
        assert!(stderr.contains(want), "{text}: {stderr}");
    }

    // An error in the domain's file is named in that file, at its line.
    std::fs::write(
        &wecom,
        "[[rule]]\nname = \"send\"\nmatch = [\"/cgi-bin/message/send\"]\nlimits = [{ count = 0, per = \"1m\" }]\n",
    )
    .expect("write");
    let path = dir.write("bad.toml", &format!("{head}{}", domain("qyapi.weixin.qq.com")));
    let (code, _, stderr) = run(&["check", "--config", &path.display().to_string()], &[]);
    assert_eq!(code, 2);
    assert!(stderr.contains("wecom.toml:4: rule \"send\": limits[0]"), "{stderr}");

    // Both domains, intercepted by default; `check` says which calls go where.
    std::fs::write(&wecom, "[[rule]]\nname = \"default\"\nlimits = []\n").expect("write");
    let path = dir.write("ok.toml", &format!("{head}{}{}", domain("qyapi.weixin.qq.com"), ca_section(&ca)));
    let (code, stdout, stderr) = run(&["check", "--config", &path.display().to_string()], &[]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("intercept CONNECT api.weixin.qq.com, api2.weixin.qq.com, qyapi.weixin.qq.com"),
        "{stdout}"
    );
    assert!(stdout.contains("domain qyapi.weixin.qq.com (/qyapi.weixin.qq.com/): 1 rules from"), "{stdout}");
}

fn ca_section(ca: &TestCa) -> String {
    format!(
        "[intercept]\nca_cert = {}\nca_key = {}\n",
        toml::Value::from(ca.cert.display().to_string()),
        toml::Value::from(ca.key.display().to_string())
    )
}

/// A WeCom-only config written before `[server] domain` existed (upstream
/// qyapi) is WeCom's: intercepted as qyapi, never as the Official Account.
#[test]
fn a_config_without_domain_is_the_domain_of_its_upstream() {
    let ca = TestCa::new();
    let parse = |upstream: &str| {
        let text = format!("[server]\nupstream = \"{upstream}\"\n\n{}", ca_section(&ca));
        wxgate::config::Config::parse(&text, std::path::Path::new("t.toml")).expect("config")
    };
    let wecom = parse("https://qyapi.weixin.qq.com");
    assert_eq!(&*wecom.domains[0].host, "qyapi.weixin.qq.com");
    let hosts: Vec<&str> = wecom.intercept.as_ref().expect("on").hosts.iter().map(|h| &**h).collect();
    assert_eq!(hosts, ["qyapi.weixin.qq.com"]);
    let mock = parse("http://127.0.0.1:9");
    assert_eq!(&*mock.domains[0].host, "api.weixin.qq.com");
    assert_eq!(&*parse("https://api2.weixin.qq.com").domains[0].host, "api.weixin.qq.com");
}

/// With both domains, a call for an `[[account]]` whose token wxgate
/// injects goes to the domain of its kind: a WeCom app's calls take the
/// WeCom prefix (its token fetch goes to WeCom's upstream), and a call on
/// the other domain is refused before anything is counted or fetched
/// (that domain would refuse the token, 40001).
#[tokio::test]
async fn an_accounts_calls_and_token_fetches_go_to_the_domain_of_its_kind() {
    use support::tokens::{account_toml, WeChatTokens, APPID, CORPID, CORPSECRET, SECRET};
    let tokens = WeChatTokens::new();
    let (oa, wecom) = (MockWeChat::start().await, MockWeChat::start().await);
    oa.respond(tokens.responder());
    wecom.respond(tokens.responder());
    let dir = TempDir::new("domains-accounts");
    let config = configs(&oa, &wecom, &dir)
        .with(account_toml(&dir, CORPID, "wecom", CORPSECRET, "agent = \"1000002\""))
        .with(account_toml(&dir, APPID, "official_account", SECRET, ""));
    let gate = Gate::start_text(config).await;

    let wrong = gate.get_as(CORPID, "/cgi-bin/user/get?userid=u1").await;
    assert_eq!(wrong.status, 400, "{}", wrong.text());
    assert!(wrong.text().contains("whose token only qyapi.weixin.qq.com takes"), "{}", wrong.text());
    let wrong = gate.get_as(APPID, "/qyapi.weixin.qq.com/cgi-bin/user/get?openid=o1").await;
    assert_eq!(wrong.status, 400, "{}", wrong.text());
    assert_eq!(oa.count() + wecom.count(), 0, "nothing fetched, nothing forwarded");

    let right = gate.get_as(CORPID, "/qyapi.weixin.qq.com/cgi-bin/user/get?userid=u1").await;
    assert_eq!(right.json()["errcode"], 0, "{}", right.text());
    let right = gate.get_as(APPID, "/cgi-bin/user/get?openid=o1").await;
    assert_eq!(right.json()["errcode"], 0, "{}", right.text());
    let paths = |m: &MockWeChat| {
        m.calls().into_iter().map(|c| c.path_and_query.split('?').next().unwrap_or("").to_owned()).collect::<Vec<_>>()
    };
    assert_eq!(paths(&wecom), ["/cgi-bin/gettoken", "/cgi-bin/user/get"], "WeCom's token from WeCom's host");
    assert_eq!(paths(&oa), ["/cgi-bin/stable_token", "/cgi-bin/user/get"]);
}
