//! `[intercept]`: a service routes every WeChat call through wxgate with
//! environment variables alone (`HTTPS_PROXY` and a CA bundle), including
//! the calls its SDK hard-codes to `https://api.weixin.qq.com`. Driven by
//! the real wechatpy 1.8.18 (`tests/sdk/`), and by raw clients for what
//! must be refused: other hosts and ports, a client that does not trust the
//! CA, bytes that are not TLS. `wxgate ca init` and the start-up check of
//! the key's mode run the real binary.

use crate::support;

use support::intercept::{connect, set_mode, through, tls, TestCa};
use support::process::run;
use support::sdk::{wechatpy, wechatpy_intercepted};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A burst of 2 calls, then 1 a minute (the clock stands still), 100 a day.
fn limited(name: &str, path: &str) -> RuleToml {
    rule(name).matching(path).limit_burst(2, "1m", 2).limit(100, "day")
}

/// A gate in front of `mock` (directly, and for `api.weixin.qq.com`
/// through tunnels), refusing with 200 + errcode 45009 (what wechatpy
/// reads); a tunnel without TLS is closed after 1 s (`header_timeout`).
async fn gate(mock: &MockWeChat, ca: &TestCa) -> Gate {
    Gate::start_text(
        ConfigToml::new(&mock.url())
            .server("throttle_status", 200)
            .server("header_timeout", "1s")
            .with(limited("jscode2session", "/sns/jscode2session"))
            .with(limited("send", "/cgi-bin/message/custom/send"))
            .with(ca.section(&mock.url())),
    )
    .await
}

async fn metric(gate: &Gate, name: &str) -> f64 {
    gate.metric(name).await.unwrap_or(0.0)
}

#[tokio::test]
async fn wechatpy_with_only_https_proxy_and_a_ca_bundle_is_counted_throttled_and_forwarded_intact() {
    let mock = MockWeChat::start().await;
    let ca = TestCa::new();
    let gate = gate(&mock, &ca).await;

    // What wechatpy sends for a normal API, pointed at the mock itself.
    let direct = wechatpy(&mock.url()).token("T").calls(&["message.send_text"]).await;
    assert!(direct[0].ok, "{direct:?}");
    let reference = mock.calls().remove(0);

    // The same SDK as shipped, nothing changed but HTTPS_PROXY and
    // REQUESTS_CA_BUNDLE: a Mini Program API it hard-codes to
    // https://api.weixin.qq.com, and a normal one.
    let calls = ["wxa.code_to_session", "wxa.code_to_session", "wxa.code_to_session"];
    let sends = ["message.send_text", "message.send_text", "message.send_text"];
    let seen = wechatpy_intercepted(gate.addr, &ca.cert).token("T").calls(&[&calls[..], &sends[..]].concat()).await;
    for (i, s) in seen.iter().enumerate() {
        if i % 3 < 2 {
            assert!(s.ok, "the first two of each pass: {seen:#?}");
        } else {
            assert!(s.is_wxgate_45009(), "the third of each is wxgate's refusal: {s:?}");
            assert_eq!(s.error.as_deref(), Some("APILimitedException"), "{s:?}");
        }
    }
    let at_mock = mock.calls();
    assert_eq!(at_mock.len(), 1 + 4, "refusals never reach WeChat: {at_mock:#?}");

    // The hard-coded call reached the mock as wechatpy made it.
    for c in &at_mock[1..3] {
        assert_eq!(c.method, "GET");
        assert_eq!(
            c.path_and_query,
            "/sns/jscode2session?appid=wxsdktest&secret=SECRET&js_code=JSCODE&grant_type=authorization_code&access_token=T"
        );
        let ua = c.headers.get("user-agent").and_then(|v| v.to_str().ok()).unwrap_or_default();
        assert!(ua.starts_with("python-requests/"), "the client's headers: {:?}", c.headers);
    }
    // The normal call: method, path, query, headers and body as sent
    // directly (only the hop-by-hop Connection differs, and Accept-Encoding,
    // which wxgate turns into identity so that it can read the answer).
    let headers = |c: &Recorded| {
        let mut h: Vec<(String, String)> = c
            .headers
            .iter()
            .filter(|(k, _)| *k != "connection" && *k != "accept-encoding")
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("?").to_owned()))
            .collect();
        h.sort();
        h
    };
    for c in &at_mock[3..5] {
        assert_eq!(
            (&c.method, &c.path_and_query, &c.body),
            (&reference.method, &reference.path_and_query, &reference.body)
        );
        assert_eq!(headers(c), headers(&reference));
        assert_eq!(c.headers.get("accept-encoding").map(|v| v.as_bytes()), Some(&b"identity"[..]));
    }

    // Counted by their rules, like direct calls, and as intercepted.
    for rule in ["jscode2session", "send"] {
        let forwarded = format!("wxgate_calls_total{{rule=\"{rule}\",outcome=\"forwarded\"}}");
        let throttled = format!("wxgate_calls_total{{rule=\"{rule}\",outcome=\"throttled\"}}");
        assert_eq!((metric(&gate, &forwarded).await, metric(&gate, &throttled).await), (2.0, 1.0), "{rule}");
    }
    assert_eq!(metric(&gate, "wxgate_intercepted_calls_total{host=\"api.weixin.qq.com\"}").await, 6.0);
    // One tunnel, one TLS handshake: requests kept the connection for all six calls.
    assert_eq!(metric(&gate, "wxgate_intercept_tunnels_total{result=\"opened\"}").await, 1.0);
    assert_eq!(metric(&gate, "wxgate_intercept_tunnels_total{result=\"handshake_failed\"}").await, 0.0);
}

#[tokio::test]
async fn wechatpys_own_token_request_goes_through_and_teaches_the_account() {
    let mock = MockWeChat::start().await;
    mock.respond(|r| {
        if r.path_and_query.starts_with("/cgi-bin/token?") {
            Reply::Json {
                body: r#"{"access_token":"TOKEN_OF_WXAPP","expires_in":7200}"#.into(),
                content_type: "application/json",
            }
        } else {
            ok_reply()
        }
    });
    let ca = TestCa::new();
    let gate = gate(&mock, &ca).await;
    // No token given: wechatpy fetches its own from the hard-coded token URL.
    let seen = wechatpy_intercepted(gate.addr, &ca.cert).appid("wxapp").calls(&["message.send_text"]).await;
    assert!(seen[0].ok, "{seen:?}");
    let at_mock = mock.calls();
    assert_eq!(at_mock.len(), 2, "{at_mock:#?}");
    assert!(at_mock[0].path_and_query.starts_with("/cgi-bin/token?grant_type=client_credential&appid=wxapp"));
    assert!(at_mock[1].path_and_query.ends_with("access_token=TOKEN_OF_WXAPP"));
    // The call carrying the learned token counted against its appid.
    let bucket = get_at(gate.admin_addr(), "/v1/buckets/wxapp/send").await;
    assert_eq!(bucket.status, 200, "{}", bucket.text());
    let used = bucket.json()["limits"].as_array().and_then(|l| l.last().cloned()).unwrap_or_default();
    assert_eq!(used["used"].as_i64(), Some(1), "{}", bucket.text());
}

#[tokio::test]
async fn connect_to_anything_but_a_listed_host_on_443_is_refused_and_nothing_is_forwarded() {
    let mock = MockWeChat::start().await;
    let ca = TestCa::new();
    let gate = gate(&mock, &ca).await;
    let targets = [
        "example.com:443",
        "api.weixin.qq.com:8443",
        "api.weixin.qq.com:80",
        "127.0.0.1:443",
        "user@api.weixin.qq.com:443",
        "SEKRIT_1.example:443",
        "api.weixin.qq.com:0443",
    ];
    for target in targets {
        let (answer, mut stream) = connect(gate.addr, target).await;
        assert_eq!(answer.status, 400, "{target}: {}", answer.text());
        let body = answer.json();
        assert_eq!(body["errcode"], 40097, "a WeChat-shaped body: {body}");
        let msg = body["errmsg"].as_str().unwrap_or_default();
        assert!(msg.contains("NO_PROXY") && msg.contains("api.weixin.qq.com"), "says what to do: {msg}");
        let quoted = !target.contains("SEKRIT") && !target.contains('@');
        assert_eq!(msg.contains(target), quoted, "a host name is quoted, anything else not: {msg}");
        assert_eq!(answer.header("connection"), Some("close"), "{target}");
        // Nothing after a refused CONNECT is read: the connection ends.
        let _ = stream.write_all(b"GET /cgi-bin/message/custom/send HTTP/1.1\r\nHost: x\r\n\r\n").await;
        let after = read_until_closed(&mut stream).await;
        assert!(after.closed && after.bytes.is_empty(), "{target}: {:?}", after.text());
    }
    // Absolute-form http:// requests stay refused.
    let absolute = exchange(
        gate.addr,
        b"GET http://api.weixin.qq.com/cgi-bin/message/custom/send HTTP/1.1\r\nHost: api.weixin.qq.com\r\nConnection: close\r\n\r\n",
    )
    .await
    .only();
    assert_eq!(absolute.status, 400, "{}", absolute.text());
    assert_eq!(mock.count(), 0, "nothing reached WeChat");
    assert_eq!(metric(&gate, "wxgate_intercept_tunnels_total{result=\"refused\"}").await, 7.0);
}

#[tokio::test]
async fn a_client_that_does_not_trust_the_ca_fails_its_handshake_and_nothing_is_forwarded() {
    let mock = MockWeChat::start().await;
    let ca = TestCa::new();
    let gate = gate(&mock, &ca).await;

    // The public roots only, as a service without REQUESTS_CA_BUNDLE.
    let (answer, stream) = connect(gate.addr, "api.weixin.qq.com:443").await;
    assert_eq!(answer.status, 200);
    let public = rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() };
    let refused = tls(stream, public, "api.weixin.qq.com").await.expect_err("the handshake fails");
    assert!(refused.to_string().contains("UnknownIssuer"), "{refused}");

    // Another CA (another deployment's): the same.
    let (_, stream) = connect(gate.addr, "api.weixin.qq.com:443").await;
    assert!(tls(stream, TestCa::new().roots(), "api.weixin.qq.com").await.is_err());

    // The CA trusted, but TLS for another host than the CONNECT's (SNI):
    // no certificate is served for it.
    let (_, stream) = connect(gate.addr, "api.weixin.qq.com:443").await;
    assert!(tls(stream, ca.roots(), "api2.weixin.qq.com").await.is_err());

    // And the same client trusting the CA gets through.
    let (_, stream) = connect(gate.addr, "api.weixin.qq.com:443").await;
    let mut inner = tls(stream, ca.roots(), "api.weixin.qq.com").await.expect("a client trusting the CA");
    inner
        .write_all(
            b"GET /cgi-bin/menu/get?access_token=T HTTP/1.1\r\nHost: api.weixin.qq.com\r\nConnection: close\r\n\r\n",
        )
        .await
        .expect("send");
    let answer = read_until_closed(&mut inner).await;
    assert_eq!(answer.responses()[0].status, 200, "{}", answer.text());

    assert_eq!(mock.count(), 1, "only the trusting client's call reached WeChat");
    assert_eq!(metric(&gate, "wxgate_intercept_tunnels_total{result=\"handshake_failed\"}").await, 3.0);
    assert_eq!(metric(&gate, "wxgate_intercept_tunnels_total{result=\"opened\"}").await, 1.0);
}

#[tokio::test]
async fn garbage_after_a_connect_closes_that_connection_and_wxgate_serves_on() {
    let mock = MockWeChat::start().await;
    let ca = TestCa::new();
    let gate = gate(&mock, &ca).await;
    let garbage: [&[u8]; 3] = [
        b"GET /cgi-bin/message/custom/send HTTP/1.1\r\nHost: api.weixin.qq.com\r\n\r\n",
        b"\x16\x03\x01\x00\x02\x01\x00",
        &[0xff; 2048],
    ];
    for bytes in garbage {
        let (answer, mut stream) = connect(gate.addr, "api.weixin.qq.com:443").await;
        assert_eq!(answer.status, 200);
        let _ = stream.write_all(bytes).await;
        let after = read_until_closed(&mut stream).await;
        assert!(after.closed, "the connection is closed");
        assert!(!after.text().contains("HTTP/1.1"), "no HTTP answer in the clear: {:?}", after.text());
    }
    // A client that opens the tunnel and never speaks is closed at header_timeout.
    let (_, mut silent) = connect(gate.addr, "api.weixin.qq.com:443").await;
    let mut byte = [0u8; 1];
    let ended = tokio::time::timeout(GUARD, silent.read(&mut byte)).await.expect("closed at header_timeout");
    assert!(matches!(ended, Ok(0) | Err(_)), "{ended:?}");

    assert_eq!(mock.count(), 0, "nothing was forwarded");
    let direct = gate.get("/cgi-bin/message/custom/send?access_token=T").await;
    assert_eq!(direct.status, 200, "direct calls are still served");
    assert_eq!(metric(&gate, "wxgate_intercept_tunnels_total{result=\"handshake_failed\"}").await, 4.0);
}

#[tokio::test]
async fn ca_init_writes_a_private_key_and_refuses_to_overwrite() {
    let dir = TempDir::new("ca-init");
    let out = dir.join("ca");
    let out_text = out.display().to_string();
    let (code, stdout, stderr) = run(&["ca", "init", "--out", &out_text, "--name", "test-deployment"], &[]);
    assert_eq!(code, 0, "{stderr}");
    let mode = |f: &str| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(out.join(f)).expect(f).permissions().mode() & 0o777
    };
    assert_eq!((mode("ca-key.pem"), mode("ca.pem")), (0o600, 0o644));
    let cert = std::fs::read_to_string(out.join("ca.pem")).expect("ca.pem");
    for line in [
        "HTTPS_PROXY=http://127.0.0.1:8080",
        &format!("REQUESTS_CA_BUNDLE={out_text}/ca.pem"),
        &format!("SSL_CERT_FILE={out_text}/ca.pem"),
        "keytool -importcert",
        "[intercept]",
    ] {
        assert!(stdout.contains(line), "prints {line:?}:\n{stdout}");
    }
    assert!(stdout.contains("wxgate intercept CA (test-deployment,"), "{stdout}");
    assert!(!stdout.contains("PRIVATE KEY") && !stderr.contains("PRIVATE KEY"), "the key is never printed");

    let (code, _, stderr) = run(&["ca", "init", "--out", &out_text], &[]);
    assert_ne!(code, 0);
    assert!(stderr.contains("exists") && stderr.contains("--force"), "{stderr}");
    assert_eq!(std::fs::read_to_string(out.join("ca.pem")).expect("ca.pem"), cert, "left alone");

    let (code, _, stderr) = run(&["ca", "init", "--out", &out_text, "--force"], &[]);
    assert_eq!(code, 0, "{stderr}");
    assert_ne!(std::fs::read_to_string(out.join("ca.pem")).expect("ca.pem"), cert, "replaced");
    assert_eq!(mode("ca-key.pem"), 0o600);
}

#[tokio::test]
async fn wxgate_refuses_to_start_with_a_ca_key_others_can_read() {
    let ca = TestCa::new();
    let config = ca.dir.write(
        "rules.toml",
        &format!("[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"off\"\n\n{}", ca.section("http://127.0.0.1:9")),
    );
    let config = config.display().to_string();
    let (code, stdout, stderr) = run(&["check", "--config", &config], &[]);
    assert_eq!(code, 0, "mode 0600 is fine: {stderr}");
    assert!(
        stdout.contains("intercept CONNECT api.weixin.qq.com, api2.weixin.qq.com, port 443"),
        "the Official Account's hosts (WeCom's only with a [[domain]] for it): {stdout}"
    );
    // Another CA's key with this certificate: `check` finds it as start-up would.
    let good_key = std::fs::read(&ca.key).expect("key");
    let other = TestCa::new();
    std::fs::copy(&other.key, &ca.key).expect("copy");
    let (code, _, stderr) = run(&["check", "--config", &config], &[]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("does not verify against ca_cert"), "{stderr}");
    std::fs::write(&ca.key, good_key).expect("restore");
    set_mode(&ca.key, 0o644);
    for args in [&["check", "--config", &config][..], &["--config", &config]] {
        let (code, _, stderr) = run(args, &[]);
        assert_eq!(code, 2, "{args:?}: {stderr}");
        let key = ca.key.display().to_string();
        assert!(stderr.contains("[intercept] ca_key") && stderr.contains(&format!("chmod 600 {key}")), "{stderr}");
        assert!(!stderr.contains("PRIVATE KEY"), "never quotes the key: {stderr}");
    }
    // Group-readable (a Kubernetes Secret with fsGroup: 0440) is accepted.
    set_mode(&ca.key, 0o440);
    let (code, _, stderr) = run(&["check", "--config", &config], &[]);
    assert_eq!(code, 0, "{stderr}");
}

#[tokio::test]
async fn intercept_config_errors_name_the_key() {
    let ca = TestCa::new();
    let cases = [
        (
            format!("[intercept]\nca_cert = {:?}\n", ca.cert.display().to_string()),
            "[intercept] ca_key: missing: `wxgate ca init",
        ),
        (
            ca.section("http://127.0.0.1:9").replace("api.weixin.qq.com", "example.com"),
            "[intercept] upstream: \"example.com\" is not in [intercept] hosts",
        ),
        (format!("{}hosts = [\"api.weixin.qq.com:443\"]\n", ca.section("http://127.0.0.1:9")), "[intercept] hosts[0]"),
        (ca.section("http://127.0.0.1:9/cgi-bin"), "no path"),
    ];
    for (section, expected) in cases {
        let text = format!("[server]\nadmin_listen = \"off\"\n\n{section}");
        let err = wxgate::config::Config::parse(&text, std::path::Path::new("rules.toml"))
            .err()
            .unwrap_or_else(|| panic!("refused: {section}"))
            .to_string();
        assert!(err.contains(expected), "{expected:?} in {err}");
    }
    let off = "[server]\nadmin_listen = \"off\"\n\n[intercept]\nenabled = false\n";
    assert!(wxgate::config::Config::parse(off, std::path::Path::new("rules.toml")).expect("off").intercept.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_an_intercepted_call_in_flight_finish() {
    let mock = MockWeChat::start().await;
    let permits = mock.hold_replies(ok_reply());
    let ca = TestCa::new();
    let config = ConfigToml::new(&mock.url())
        .with(limited("send", "/cgi-bin/message/custom/send"))
        .with(ca.section(&mock.url()));
    let mut gate = support::process::spawn(&config.to_string(), "intercept-term", &[]).expect("serving");
    let (answer, stream) = connect(gate.addr, "api.weixin.qq.com:443").await;
    assert_eq!(answer.status, 200);
    let mut inner = tls(stream, ca.roots(), "api.weixin.qq.com").await.expect("TLS");
    inner
        .write_all(b"POST /cgi-bin/message/custom/send?access_token=T HTTP/1.1\r\nHost: api.weixin.qq.com\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
        .await
        .expect("send");
    eventually("the call reaching WeChat", PATIENCE, || mock.count() >= 1).await;
    gate.signal("-TERM");
    assert!(gate.is_running(), "waits for the intercepted call in flight");
    permits.add_permits(1);
    let answer = read_until_closed(&mut inner).await;
    let status = answer.responses().first().map(|r| r.status);
    assert_eq!(status, Some(200), "the call in flight got its answer, not cut off: {:?}", answer.text());
    assert_eq!(gate.exit_code(PATIENCE).await, 0);
    assert_eq!(mock.calls()[0].body.as_ref(), b"{}");
}

/// A 40001 from a host drops a cached token only if that host issues that
/// kind of token: an official-account token sent to WeCom's qyapi by
/// mistake is refused there, but stays the account's token (dropping it
/// would spend the 2,000-a-day token quota on a refetch).
#[tokio::test]
async fn a_40001_from_another_host_family_keeps_the_cached_token() {
    let tokens = support::tokens::WeChatTokens::new();
    let mock = MockWeChat::start().await;
    let answers = tokens.responder();
    mock.respond(move |rec| {
        // The call the test sends to qyapi (the mock sees its own host).
        if rec.path_and_query.starts_with("/cgi-bin/user/get") {
            errcode_reply(40001)
        } else {
            answers(rec)
        }
    });
    let ca = TestCa::new();
    let section = format!(
        "[intercept]\nca_cert = {}\nca_key = {}\nupstream = {{ \"api.weixin.qq.com\" = \"{url}\", \"qyapi.weixin.qq.com\" = \"{url}\" }}\n",
        toml::Value::from(ca.cert.display().to_string()),
        toml::Value::from(ca.key.display().to_string()),
        url = mock.url(),
    );
    let wecom = ca.dir.write("wecom.toml", "");
    let domain = format!(
        "[[domain]]\nhost = \"qyapi.weixin.qq.com\"\nrules = {}\n",
        toml::Value::from(wecom.display().to_string())
    );
    let gate = Gate::start_text(ConfigToml::new(&mock.url()).with(section).with(domain)).await;
    let token_path = format!(
        "/cgi-bin/token?grant_type=client_credential&appid={}&secret={}",
        support::tokens::APPID,
        support::tokens::SECRET
    );
    let (status, body) = through(&gate, &ca, "api.weixin.qq.com", &token_path).await;
    assert_eq!(status, 200, "{body}");
    let token = serde_json::from_str::<serde_json::Value>(&body).expect("json")["access_token"]
        .as_str()
        .expect("a token")
        .to_owned();
    let (status, body) =
        through(&gate, &ca, "qyapi.weixin.qq.com", &format!("/cgi-bin/user/get?access_token={token}")).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("40001"), "qyapi refused the OA token: {body}");
    let (_, again) = through(&gate, &ca, "api.weixin.qq.com", &token_path).await;
    assert!(again.contains(&token), "still the cached token: {again}");
    assert_eq!(tokens.fetches("token"), 1, "no refetch");
}
