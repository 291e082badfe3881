//! Hot reload: the watched file and SIGHUP; new limits apply at once, a
//! broken file keeps the old rules, calls in flight keep theirs.

use crate::support;

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use support::*;

/// Replaces the file the way editors and config maps do: write aside, rename over.
fn replace(path: &Path, text: &str) {
    let aside = path.with_extension("tmp");
    std::fs::write(&aside, text).expect("write");
    std::fs::rename(&aside, path).expect("rename");
}

/// "menu" with `day` calls a day, "info" without limits; and `extra` sections.
fn rules(mock: &MockWeChat, day: u64, extra: &str) -> String {
    ConfigToml::new(&mock.url())
        .with(extra)
        .with(rule("menu").matching("/cgi-bin/menu/create").limit(day, "day"))
        .with(rule("info").matching("/cgi-bin/user/info"))
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_file_applies_under_load_and_a_broken_one_is_refused() {
    let mock = MockWeChat::start().await;
    let dir = TempDir::new("reload-edit");
    let path = dir.join("rules.toml");
    std::fs::write(&path, rules(&mock, 2, "")).expect("write");
    let gate = Arc::new(Gate::start_file(&path).await);
    // Load on another rule throughout: nothing may fail across the swaps.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut load = Vec::new();
    for _ in 0..4 {
        let (g, stop) = (gate.clone(), stop.clone());
        load.push(tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                assert_eq!(g.get("/cgi-bin/user/info").await.status, 200);
                n += 1;
            }
            n
        }));
    }
    for _ in 0..2 {
        assert_eq!(gate.get("/cgi-bin/menu/create").await.status, 200);
    }
    assert_eq!(gate.get("/cgi-bin/menu/create").await.status, 429);

    replace(&path, &rules(&mock, 5, ""));
    eventually("the reload", PATIENCE, || gate.reloads().0 >= 1).await;
    // The day's count (2) carries over; the new quota is 5.
    for _ in 0..3 {
        assert_eq!(gate.get("/cgi-bin/menu/create").await.status, 200);
    }
    assert_eq!(gate.get("/cgi-bin/menu/create").await.status, 429);

    replace(&path, "[[rule]]\nname = \"menu\"\nlimits = [{ count = 0, per = \"day\" }\n");
    eventually("the refused reload", PATIENCE, || gate.reloads().1 >= 1).await;
    // Still the old rules: the quota of 5 is used up, "info" still forwards.
    let a = gate.get("/cgi-bin/menu/create").await;
    assert_eq!((a.status.as_u16(), a.header("x-wxgate-reason")), (429, Some("quota")));
    assert_eq!(gate.get("/cgi-bin/user/info").await.status, 200);

    stop.store(true, Ordering::Relaxed);
    for l in load {
        assert!(l.await.expect("load task") > 0);
    }
}

#[tokio::test]
async fn a_call_in_flight_finishes_under_the_rules_it_started_with() {
    let mock = MockWeChat::start().await;
    let permits = mock.hold_replies(errcode_reply(45009));
    let dir = TempDir::new("reload-inflight");
    let path = dir.join("rules.toml");
    std::fs::write(&path, rules(&mock, 100, &penalty(45009, 60))).expect("write");
    let gate = Arc::new(Gate::start_file(&path).await);
    let g = gate.clone();
    let call = tokio::spawn(async move { g.get("/cgi-bin/menu/create").await });
    eventually("the call reaching WeChat", PATIENCE, || mock.count() == 1).await;
    replace(&path, &rules(&mock, 100, &penalty(45009, 600)));
    eventually("the reload", PATIENCE, || gate.reloads().0 >= 1).await;
    permits.add_permits(1);
    let a = call.await.expect("call");
    assert_eq!((a.status.as_u16(), a.retry_after()), (429, 60), "penalised under the rules it started with");
}

#[tokio::test]
async fn sighup_reloads_even_when_the_file_change_is_not_seen() {
    let mock = MockWeChat::start().await;
    // The watched path is a symlink into another directory: editing the
    // target raises no event where wxgate watches, so only SIGHUP reloads.
    let dir = TempDir::new("reload-hup");
    let real_dir = dir.join("real");
    std::fs::create_dir_all(&real_dir).expect("dir");
    let real = real_dir.join("rules.toml");
    std::fs::write(&real, rules(&mock, 1, "")).expect("write");
    let link = dir.join("rules.toml");
    std::os::unix::fs::symlink(&real, &link).expect("symlink");
    let instance = support::process::spawn_path(&link, &[]).expect("serving");
    let get = |p| instance.get(p);
    assert_eq!(get("/cgi-bin/menu/create").await.status, 200);
    assert_eq!(get("/cgi-bin/menu/create").await.status, 429);
    std::fs::write(&real, rules(&mock, 3, "")).expect("write");
    // A later change in the watched directory: once the watcher has counted
    // an event, it has seen every event before it, the edit's included.
    std::fs::write(dir.join("unrelated.txt"), "x").expect("write");
    let watch = eventually_some_async("the watcher seeing a change", PATIENCE, async || {
        let ready = instance.admin_get("/readyz").await.json();
        (ready["config_watch"]["events"].as_u64() >= Some(1)).then(|| ready["config_watch"].clone())
    })
    .await;
    assert_eq!(watch["of_config_file"], 0, "the edit behind the symlink raised no event for the config file");
    assert_eq!(get("/cgi-bin/menu/create").await.status, 429, "no event, no reload");
    instance.signal("-HUP");
    eventually_async("the reload on SIGHUP", PATIENCE, async || get("/cgi-bin/menu/create").await.status == 200).await;
    assert_eq!(get("/cgi-bin/menu/create").await.status, 200);
    assert_eq!(get("/cgi-bin/menu/create").await.status, 429, "quota 3 now, all used");
}

#[tokio::test]
async fn a_refused_reload_logs_what_check_says_about_the_file() {
    let mock = MockWeChat::start().await;
    let dir = TempDir::new("reload-message");
    let path = dir.join("rules.toml");
    std::fs::write(&path, rules(&mock, 1, "")).expect("write");
    let instance = support::process::spawn_path(&path, &[]).expect("serving");
    replace(&path, &rules(&mock, 1, "").replace("count = 1,", "count = \"1\","));
    let (code, _, checked) = support::process::run(&["check", "--config", path.to_str().expect("utf-8")], &[]);
    assert_eq!(code, 2, "{checked}");
    let message = checked.trim_end().strip_prefix("wxgate: invalid config: ").expect("check's message");
    let line =
        std::fs::read_to_string(&path).expect("read").lines().position(|l| l.contains("count = \"1\"")).expect("line")
            + 1;
    let place = format!("{}:{line}: ", path.display());
    assert_eq!(message, format!("{place}rule \"menu\": limits[0].count: expected an integer, got the string \"1\""));
    eventually_async("the refused reload", PATIENCE, async || {
        instance.admin_get("/readyz").await.json()["config_reloads"]["failed"].as_u64() >= Some(1)
    })
    .await;
    let log = instance.stop().await;
    let refused = log.lines().find(|l| l.contains("config reload refused")).expect("a refused reload is logged");
    assert!(refused.contains(message), "the log names the place as check does:\n{refused}\n{message}");
}

/// With `WXGATE_LOG=trace` and stderr written to a file beside the config
/// file, each log line is a file event in the watched directory: wxgate
/// must not log those events (it did, at trace: each logged event was
/// another event, ~40 MB/s of log from an idle process). The watcher still
/// sees them; the log stays small.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_logging_beside_the_config_file_does_not_log_its_own_writes() {
    let mock = MockWeChat::start().await;
    let dir = TempDir::new("reload-trace-log");
    let path = dir.join("rules.toml");
    std::fs::write(&path, rules(&mock, 1, "")).expect("write");
    let log = dir.join("wxgate.log");
    let instance =
        support::process::spawn_path_logging_to(&path, &[("WXGATE_LOG", "trace")], &log).await.expect("serving");
    let size = || std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
    let events = async || instance.admin_get("/readyz").await.json()["config_watch"]["events"].as_u64();
    let (seen, start) = (events().await.expect("config_watch"), size());
    // An unrelated write in the directory; once the watcher counted its
    // event, it had seen every event before it (the log's own writes).
    std::fs::write(dir.join("unrelated.txt"), "x").expect("write");
    eventually_async("the watcher seeing the write", PATIENCE, async || events().await > Some(seen)).await;
    // Idle now: nothing may keep the log growing (bounded look, 1 s).
    let grown =
        support::poll::within(std::time::Duration::from_secs(1), || (size() > start + 8 * 1024).then(size)).await;
    assert_eq!(grown, None, "the log grew from {start} to {} bytes while idle", size());
    assert!(size() > 0, "it logs at all");
}

/// A reload cannot move the listener, so it cannot be checked against the
/// address the file names: a file that says loopback and adds an
/// `[[account]]` (whose token wxgate adds to calls without one) is refused
/// while wxgate still listens beyond loopback with caller_auth off, and no
/// call gets the account's token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_saying_loopback_cannot_add_an_account_to_a_listener_beyond_it() {
    use support::tokens::{APPID, SECRET};
    const INFO: &str = "/cgi-bin/user/info";
    let (mock, tokens) = support::tokens::mock_wechat(0).await;
    let dir = TempDir::new("reload-listen");
    let path = dir.join("rules.toml");
    let open = ConfigToml::new(&mock.url())
        .server("listen", "0.0.0.0:0")
        .server("caller_auth", "off")
        .with(rule("info").matching(INFO));
    std::fs::write(&path, open.to_string()).expect("write");
    let mut instance = support::process::spawn_path(&path, &[]).expect("serving");
    // Bound beyond loopback; the test reaches it over loopback only.
    instance.addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    let secret = dir.write_secret("app.secret", &format!("{SECRET}\n"));
    let narrowed = open.server("listen", "127.0.0.1:0").with(format!(
        "[[account]]\nid = \"{APPID}\"\nkind = \"official_account\"\nsecret_file = \"{}\"\n",
        secret.display()
    ));
    replace(&path, &narrowed.to_string());
    instance.signal("-HUP");
    let reloads = eventually_some_async("the reload", PATIENCE, async || {
        let r = instance.admin_get("/readyz").await.json()["config_reloads"].clone();
        (r["ok"].as_u64()? + r["failed"].as_u64()? > 0).then_some(r)
    })
    .await;
    assert_eq!(reloads["ok"], 0, "refused: {reloads}\n{}", instance.logged());
    // The counter can be read before the refusal's log line is written.
    eventually("the refusal logged", PATIENCE, || instance.logged().contains("a reload cannot move it")).await;
    let a = instance.get_as(APPID, &format!("{INFO}?openid=o1")).await;
    let sent: Vec<String> = mock.calls().into_iter().map(|c| c.path_and_query).collect();
    assert!(sent.iter().all(|p| !p.contains("access_token=")), "no token added: {sent:?} ({})", a.text());
    assert_eq!((tokens.fetches("stable"), tokens.fetches("token")), (0, 0), "no token fetched");
}

/// A `[[domain]]`'s rules file is watched like the config: its edited
/// limits apply without touching the config itself.
#[tokio::test]
async fn an_edited_domain_rules_file_applies() {
    let mock = MockWeChat::start().await;
    let dir = TempDir::new("reload-domain");
    let wecom = dir.join("rules-wecom.toml");
    let wecom_rules = |n: u64| {
        format!("[[rule]]\nname = \"send\"\nmatch = [\"/cgi-bin/message/send\"]\nlimits = [{{ count = {n}, per = \"day\" }}]\n")
    };
    std::fs::write(&wecom, wecom_rules(1)).expect("write");
    let domain = format!(
        "[[domain]]\nhost = \"qyapi.weixin.qq.com\"\nrules = \"rules-wecom.toml\"\nupstream = \"{}\"\n",
        mock.url()
    );
    let path = dir.write("rules.toml", &rules(&mock, 2, &domain));
    let gate = Gate::start_file(&path).await;
    let send = "/qyapi.weixin.qq.com/cgi-bin/message/send";
    assert_eq!(gate.post(send, "{}").await.status, 200);
    assert_eq!(gate.post(send, "{}").await.status, 429);

    replace(&wecom, &wecom_rules(3));
    eventually("the reload", PATIENCE, || gate.reloads().0 >= 1).await;
    for _ in 0..2 {
        assert_eq!(gate.post(send, "{}").await.status, 200, "the day's count (1) carries over; the new quota is 3");
    }
    assert_eq!(gate.post(send, "{}").await.status, 429);
}

/// The file a config's `rules` names is watched like the config: its
/// edited limits apply without touching the config itself.
#[tokio::test]
async fn an_edited_rules_file_applies() {
    let mock = MockWeChat::start().await;
    let dir = TempDir::new("reload-rules-key");
    let shared = dir.join("rules.toml");
    let shared_rules = |n: u64| rule("menu").matching("/cgi-bin/menu/create").limit(n, "day").to_string();
    std::fs::write(&shared, shared_rules(1)).expect("write");
    let path = dir.write("wxgate.toml", &format!("rules = \"rules.toml\"\n{}", ConfigToml::new(&mock.url())));
    let gate = Gate::start_file(&path).await;
    assert_eq!(gate.post("/cgi-bin/menu/create", "{}").await.status, 200);
    assert_eq!(gate.post("/cgi-bin/menu/create", "{}").await.status, 429);

    replace(&shared, &shared_rules(3));
    eventually("the reload", PATIENCE, || gate.reloads().0 >= 1).await;
    for _ in 0..2 {
        assert_eq!(gate.post("/cgi-bin/menu/create", "{}").await.status, 200, "the new quota is 3");
    }
    assert_eq!(gate.post("/cgi-bin/menu/create", "{}").await.status, 429);
}
