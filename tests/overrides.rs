//! Per-account overrides (issue 48, item 3): a `[[quota]]` gives an
//! account its own limits for a rule, applied to its live calls, its
//! queued sends and the admin API's picture of it, hot-reloadable, and
//! checked by `wxgate check` and a reload with file and line. Over real
//! sockets, on the embedded store, a real Redis and a Redis Cluster.

use crate::support;

use std::path::Path;
use std::time::Duration;

use support::backing::Backing;
use support::queue::{gate as queue_gate, msgid, queued, until_state, wechat};
use support::temp::TempDir;
use support::tokens::APPID;
use support::{eventually, eventually_async, get_at, process, rule, ConfigToml, Gate, MockWeChat, PATIENCE};

const SEND: &str = "/cgi-bin/message/template/send";

/// `send` at 100 a day, with these more sections (overrides).
fn config(mock: &MockWeChat, more: &str) -> ConfigToml {
    ConfigToml::new(&mock.url()).with(rule("send").matching(SEND).limit(100, "day")).with(more.to_owned())
}

/// A `[[quota]]` giving `account` `count` calls a day of `send`.
fn day_override(account: &str, count: u64) -> String {
    format!("[[quota]]\naccount = \"{account}\"\nrule = \"send\"\nlimits = [{{ count = {count}, per = \"day\" }}]\n")
}

/// Calls of `account` until the first refusal (at most `most`): how many
/// went through, and the refusal's reason.
async fn admitted_until_refused(gate: &Gate, account: &str, most: usize) -> (usize, Option<String>) {
    for n in 0..most {
        let a = gate.get_as(account, SEND).await;
        if a.status != 200 {
            return (n, a.header("x-wxgate-reason").map(str::to_owned));
        }
    }
    (most, None)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_gives_one_account_its_own_day_quota_and_the_others_keep_the_rules() {
    for backing in Backing::all() {
        let store = backing.name();
        let mock = MockWeChat::start().await;
        let gate = backing.gate_on_manual_clock(config(&mock, &day_override("wxA", 30))).await;
        let first = gate.get_as("wxA", SEND).await;
        assert_eq!(first.status, 200, "{store}");
        assert_eq!(first.header("ratelimit-policy"), Some("\"send.day\";q=30;w=86400"), "{store}");
        assert_eq!(first.header("ratelimit"), Some("\"send.day\";r=29;t=50400"), "{store}");
        assert_eq!(admitted_until_refused(&gate, "wxA", 200).await, (29, Some("quota".into())), "{store}: wxA");
        assert_eq!(admitted_until_refused(&gate, "wxB", 200).await, (100, Some("quota".into())), "{store}: wxB");
        assert_eq!(mock.count(), 130, "{store}: only admitted calls reached WeChat");
        // Each account's answers name its own limits.
        let refused = gate.get_as("wxA", SEND).await;
        assert_eq!(refused.header("ratelimit-policy"), Some("\"send.day\";q=30;w=86400"), "{store}");
        let refused = gate.get_as("wxB", SEND).await;
        assert_eq!(refused.header("ratelimit-policy"), Some("\"send.day\";q=100;w=86400"), "{store}");
        // The admin API: the pair's limits are the override's, and say so.
        let a = get_at(gate.admin_addr(), "/v1/buckets/wxA/send").await.json();
        assert_eq!(
            (a["limits_source"].as_str(), a["limits"][0]["count"].as_u64()),
            (Some("override"), Some(30)),
            "{a}"
        );
        assert_eq!(a["limits"][0]["used"].as_u64(), Some(30), "{store}: {a}");
        let b = get_at(gate.admin_addr(), "/v1/buckets/wxB/send").await.json();
        assert_eq!((b["limits_source"].as_str(), b["limits"][0]["count"].as_u64()), (Some("rule"), Some(100)), "{b}");
        let rules = get_at(gate.admin_addr(), "/v1/rules").await.json();
        let listed = &rules[0]["overrides"];
        assert_eq!(listed.as_array().map(Vec::len), Some(1), "{rules}");
        assert_eq!((listed[0]["account"].as_str(), listed[0]["limits"][0]["count"].as_u64()), (Some("wxA"), Some(30)));
        assert_eq!(rules[0]["limits"][0]["count"], 100, "the rule's own limits are unchanged: {rules}");
    }
}

#[tokio::test]
async fn an_override_of_a_per_path_rule_gives_each_path_the_accounts_limits() {
    let mock = MockWeChat::start().await;
    let draft = rule("draft")
        .matching("/cgi-bin/draft/add")
        .matching("/cgi-bin/draft/update")
        .limit(5, "day")
        .set("scope", "path");
    let quota = "[[quota]]\naccounts = [\"wxA\"]\nrule = \"draft\"\nlimits = [{ count = 2, per = \"day\" }]\n";
    let gate = Gate::start_text(ConfigToml::new(&mock.url()).with(draft).with(quota)).await;
    for path in ["/cgi-bin/draft/add", "/cgi-bin/draft/update"] {
        for (account, each) in [("wxA", 2), ("wxB", 5)] {
            for _ in 0..each {
                assert_eq!(gate.get_as(account, path).await.status, 200, "{account} {path}");
            }
            assert_eq!(gate.get_as(account, path).await.status, 429, "{account} {path}: its {each} are used");
        }
    }
    let a = get_at(gate.admin_addr(), "/v1/buckets/wxA/draft").await.json();
    let counts: Vec<_> =
        a["paths"].as_array().expect("paths").iter().map(|p| p["limits"][0]["count"].clone()).collect();
    assert_eq!(counts, [2, 2], "{a}");
}

/// Replaces the file the way editors and config maps do: write aside, rename over.
fn replace(path: &Path, text: &str) {
    let aside = path.with_extension("tmp");
    std::fs::write(&aside, text).expect("write");
    std::fs::rename(&aside, path).expect("rename");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_adds_lowers_and_removes_an_override_for_the_next_call_and_a_bad_one_is_refused() {
    for backing in [Backing::Memory, Backing::Redis(support::redis_server::RedisServer::start())] {
        let store = backing.name();
        let mock = MockWeChat::start().await;
        let dir = TempDir::new("overrides-reload");
        let path = dir.join("rules.toml");
        let write = |more: &str| replace(&path, &backing.with_store(config(&mock, more)));
        write("");
        let gate = backing.gate_from_file(&path).await;
        let mut reloads = 0;
        let mut reload = async |more: &str| {
            write(more);
            reloads += 1;
            eventually("the reload", PATIENCE, || gate.reloads().0 >= reloads).await;
        };
        for _ in 0..3 {
            assert_eq!(gate.get_as("wxA", SEND).await.status, 200, "{store}");
        }
        // Added: wxA's 3 calls count against its 10.
        reload(&day_override("wxA", 10)).await;
        assert_eq!(admitted_until_refused(&gate, "wxA", 20).await, (7, Some("quota".into())), "{store}: added");
        // Lowered below what it used: refused at once; raised: 2 more.
        reload(&day_override("wxA", 8)).await;
        assert_eq!(admitted_until_refused(&gate, "wxA", 20).await, (0, Some("quota".into())), "{store}: lowered");
        reload(&day_override("wxA", 12)).await;
        assert_eq!(admitted_until_refused(&gate, "wxA", 20).await, (2, Some("quota".into())), "{store}: raised");
        // A bad override is refused whole: the running one stays.
        write("[[quota]]\naccount = \"wxA\"\nrule = \"sned\"\nlimits = [{ count = 500, per = \"day\" }]\n");
        eventually("the refused reload", PATIENCE, || gate.reloads().1 >= 1).await;
        assert_eq!(gate.get_as("wxA", SEND).await.status, 429, "{store}: still the override of 12");
        // Removed: the rule's 100, of which 12 are used.
        reload("").await;
        assert_eq!(admitted_until_refused(&gate, "wxA", 200).await, (88, Some("quota".into())), "{store}: removed");
        // wxB never had an override: all its 100.
        assert_eq!(admitted_until_refused(&gate, "wxB", 200).await, (100, Some("quota".into())), "{store}");
    }
}

#[tokio::test]
async fn a_queued_job_of_the_overridden_account_drains_under_its_override() {
    let (mock, _tokens) = wechat(|_, n| msgid(n)).await;
    let dir = TempDir::new("overrides-queue");
    let token = rule("token").matching("/cgi-bin/token").limit(2000, "day");
    let send = rule("template_send").matching(SEND).limit(100, "day").set("queue", true).set("queue_deadline", "3d");
    let quota = format!(
        "[[quota]]\naccount = \"{APPID}\"\nrule = \"template_send\"\nlimits = [{{ count = 2, per = \"day\" }}]\n"
    );
    let extra = format!("{}\n{quota}", support::caller("hr"));
    let gate = queue_gate(&mock, &dir, &format!("{token}\n{send}"), "", &extra).await;
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(queued(&gate, "hr", SEND, &format!(r#"{{"touser":"o{i}"}}"#)).await);
    }
    for id in &ids[..2] {
        until_state(&gate, "hr", id, "sent").await;
    }
    until_state(&gate, "hr", &ids[2], "waiting").await;
    let sends = || mock.calls().iter().filter(|c| c.path_and_query.starts_with(SEND)).count();
    assert_eq!(sends(), 2, "the account's 2 a day, not the rule's 100");
    // The summary's estimate is the override's too: the last one at
    // Beijing's next midnight (16:00 UTC; the gate's clock reads 02:00 UTC).
    let a = gate.get_with("/v1/deliveries", &[("x-wx-caller", "hr")]).await;
    let q = &a.json()["queues"][0];
    assert_eq!(q["drained_at"], "2026-11-29T16:00:00.000Z", "{q}");
    gate.advance(Duration::from_secs(14 * 3600));
    until_state(&gate, "hr", &ids[2], "sent").await;
    assert_eq!(sends(), 3);
}

/// `wxgate check` on a config with `send` (and `draft`, per path) and these
/// overrides: exit code and stderr.
fn check(server: &str, quota: &str) -> (i32, String) {
    let dir = TempDir::new("overrides-check");
    let path = dir.join("rules.toml");
    let text = format!(
        "[server]\n{server}\n[[rule]]\nname = \"send\"\nmatch = [\"/a\"]\nlimits = [{{ count = 100, per = \"day\" }}]\n\
         reserve = \"10%\"\n\n{quota}"
    );
    std::fs::write(&path, text).expect("write");
    let (code, _, stderr) = process::run(&["check", "--config", &path.display().to_string()], &[]);
    (code, stderr)
}

#[test]
fn bad_overrides_are_refused_with_file_and_line() {
    let quota = |head: &str, limits: &str| format!("[[quota]]\n{head}\nlimits = [{limits}]\n");
    let day = "{ count = 30, per = \"day\" }";
    let cases = [
        (
            "",
            quota("account = \"wxA\"\nrule = \"sned\"", day),
            "rules.toml:11: [[quota]] rule: no rule named \"sned\" (rules: send)",
        ),
        (
            "accounts = [\"wxB\"]",
            quota("account = \"wxA\"\nrule = \"send\"", day),
            "rules.toml:10: [[quota]] account: account \"wxA\" is not on [server] accounts",
        ),
        (
            "",
            quota("account = \"wxA\"\nrule = \"send\"", "{ count = 0, per = \"day\" }"),
            "rules.toml:12: [[quota]] limits[0]: count must be at least 1",
        ),
        (
            "",
            quota("account = \"wxA\"\nrule = \"send\"", "{ count = 30, per = \"day\", burst = 3 }"),
            "rules.toml:12: [[quota]] limits[0]: burst does not apply to per = \"day\"",
        ),
        (
            "",
            quota("account = \"wxA\"\nrule = \"send\"", "{ count = 3, per = \"day\" }, { count = 5, per = \"day\" }"),
            "rules.toml:12: [[quota]] limits[1]: another limit of this override has per = \"day\"",
        ),
        // The rule's reserve of 10 % applies to the override: of 1 call, it leaves normal callers none.
        (
            "",
            quota("account = \"wxA\"\nrule = \"send\"", "{ count = 1, per = \"day\" }"),
            "rules.toml:12: [[quota]] limits: reserve: 10% of limits[0]'s count of 1 leaves no call for normal callers",
        ),
        (
            "",
            quota("account = \"wxA\"\nrule = \"send\"", ""),
            "rules.toml:12: [[quota]] limits: needs at least one limit",
        ),
        (
            "",
            quota("account = \"wx A\"\nrule = \"send\"", day),
            "rules.toml:10: [[quota]] account: account \"wx A\" must be",
        ),
        ("", quota("rule = \"send\"", day), "rules.toml:9: [[quota]]: needs account = \"...\" or accounts = [...]"),
        (
            "",
            format!(
                "{}\n{}",
                quota("accounts = [\"wxA\", \"wxB\"]\nrule = \"send\"", day),
                quota("account = \"wxB\"\nrule = \"send\"", day)
            ),
            "rules.toml:15: [[quota]] account: account \"wxB\" already has an override of rule \"send\" (line 9)",
        ),
    ];
    let mut wrong = Vec::new();
    for (server, quota, expected) in cases {
        let (code, stderr) = check(server, &quota);
        if code != 2 || !stderr.contains(expected) {
            wrong.push(format!("{quota}\nexpected: {expected}\ngot ({code}): {stderr}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));
    let (code, stderr) = check("", &quota("account = \"wxA\"\nrule = \"send\"", day));
    assert_eq!(code, 0, "{stderr}");
}

#[test]
fn check_prints_each_accounts_limits_under_its_rule() {
    let dir = TempDir::new("overrides-check-ok");
    let path = dir.join("rules.toml");
    let text = "[[rule]]\nname = \"send\"\nmatch = [\"/a\"]\nlimits = [{ count = 100, per = \"day\" }]\n\n\
                [[quota]]\naccounts = [\"wxA\", \"wxB\"]\nrule = \"send\"\nlimits = [{ count = 30, per = \"day\" }]\n";
    std::fs::write(&path, text).expect("write");
    let (code, stdout, stderr) = process::run(&["check", "--config", &path.display().to_string()], &[]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("  account wxA ([[quota]] line 6): 30 per calendar day instead"), "{stdout}");
    assert!(stdout.contains("  account wxB ([[quota]] line 6): 30 per calendar day instead"), "{stdout}");
}

#[tokio::test]
async fn a_reload_with_a_bad_override_is_refused_with_its_file_and_line_and_keeps_the_running_one() {
    let mock = MockWeChat::start().await;
    let dir = TempDir::new("overrides-reload-message");
    let path = dir.join("rules.toml");
    std::fs::write(&path, config(&mock, &day_override("wxA", 1)).to_string()).expect("write");
    let instance = process::spawn_path(&path, &[]).expect("serving");
    let bad =
        config(&mock, &day_override("wxA", 1)).to_string().replace("rule = \"send\"\nlimits", "rule = \"snd\"\nlimits");
    replace(&path, &bad);
    let line = bad.lines().position(|l| l == "rule = \"snd\"").expect("the line") + 1;
    let message = format!("{}:{line}: [[quota]] rule: no rule named \"snd\" (rules: send)", path.display());
    let (code, _, checked) = process::run(&["check", "--config", path.to_str().expect("utf-8")], &[]);
    assert_eq!((code, checked.trim_end()), (2, &*format!("wxgate: invalid config: {message}")));
    eventually_async("the refused reload", PATIENCE, async || {
        instance.admin_get("/readyz").await.json()["config_reloads"]["failed"].as_u64() >= Some(1)
    })
    .await;
    // The running override (1 a day) still holds.
    assert_eq!(instance.get_as("wxA", SEND).await.status, 200);
    assert_eq!(instance.get_as("wxA", SEND).await.status, 429, "the override kept");
    let log = instance.stop().await;
    let refused = log.lines().find(|l| l.contains("config reload refused")).expect("a refused reload is logged");
    assert!(refused.contains(&message), "the log names the place as check does:\n{refused}\n{message}");
}

#[tokio::test]
async fn while_redis_is_away_the_local_fallback_divides_the_accounts_own_limits() {
    let mut redis = support::redis_server::RedisServer::start();
    let mock = MockWeChat::start().await;
    let store = support::StoreToml::redis(&redis.url())
        .per_call()
        .set("timeout", "100ms")
        .set("fallback", "local")
        .set("instances", 2)
        .set("breaker_failures", 3)
        .set("breaker_open", "200ms");
    let text = ConfigToml::new(&mock.url())
        .server("quota_timezone", support::midday_timezone())
        .with(rule("send").matching(SEND).limit(10, "day"))
        .with(day_override("wxA", 4))
        .with(store);
    let gate = Gate::start_real_text(text).await;
    redis.stop();
    // instances = 2: this instance alone may use half of each account's own.
    assert_eq!(admitted_until_refused(&gate, "wxA", 10).await, (2, Some("quota".into())), "wxA: 4 / 2");
    assert_eq!(admitted_until_refused(&gate, "wxB", 10).await, (5, Some("quota".into())), "wxB: 10 / 2");
}

#[tokio::test]
async fn an_override_of_a_domains_rule_is_written_in_the_config_and_one_in_its_rules_file_is_warned_of() {
    let mock = MockWeChat::start().await;
    let dir = TempDir::new("overrides-domain");
    let wecom =
        "[[rule]]\nname = \"basic\"\nmatch = [\"/cgi-bin/user/get\"]\nlimits = [{ count = 100, per = \"day\" }]\n\
                 [[quota]]\naccount = \"wxA\"\nrule = \"basic\"\nlimits = [{ count = 5, per = \"day\" }]\n";
    std::fs::write(dir.join("wecom.toml"), wecom).expect("write");
    let domain =
        format!("[[domain]]\nhost = \"qyapi.weixin.qq.com\"\nrules = \"wecom.toml\"\nupstream = \"{}\"\n", mock.url());
    let quota = "[[quota]]\naccount = \"wxA\"\nrule = \"qyapi.basic\"\nlimits = [{ count = 3, per = \"day\" }]\n";
    let path = dir.join("rules.toml");
    std::fs::write(&path, ConfigToml::new(&mock.url()).with(domain).with(quota).to_string()).expect("write");
    let (code, stdout, stderr) = process::run(&["check", "--config", &path.display().to_string()], &[]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("rule qyapi.basic [/cgi-bin/user/get]\n  100 per calendar day"), "{stdout}");
    assert!(stdout.contains("  account wxA ([[quota]] line"), "{stdout}");
    assert!(stdout.contains("): 3 per calendar day instead"), "the config's override: {stdout}");
    assert!(stderr.contains("wecom.toml's [[quota]] apply only when it runs alone"), "{stderr}");
    let gate = Gate::start_file(&path).await;
    let user_get = "/qyapi.weixin.qq.com/cgi-bin/user/get";
    for _ in 0..3 {
        assert_eq!(gate.get_as("wxA", user_get).await.status, 200);
    }
    assert_eq!(gate.get_as("wxA", user_get).await.status, 429, "the config's 3, not the rules file's 5");
}

/// An override is the pair's configured limit, and a day limit WeChat
/// reports lowers it as it lowers a rule's (item 1, `learn = "down"`):
/// wxA's override of 20 stays under WeChat's 100; wxB's of 50 is above its
/// real 30, which quota/get teaches at the first sync.
#[tokio::test]
async fn a_learned_day_limit_lowers_an_override_and_never_raises_it() {
    let sim = support::sim::SimServer::start(
        "[sim]\nday_length = \"24h\"\nrequire_token = true\n\n[[api]]\npath = \"/cgi-bin/message/template/send\"\n\
         limits = [{ count = 100, per = \"day\" }]\n\n[[api.account]]\nappid = \"wxB\"\n\
         limits = [{ count = 30, per = \"day\" }]\n",
    )
    .await;
    let token = rule("token").matching("/cgi-bin/token").limit(2000, "day");
    let send = rule("send").matching(SEND).limit(100, "day").set("quota_sync", "1h");
    let text = ConfigToml::new(&sim.url())
        .with(token)
        .with(send)
        .with("[tokens]\ncache = true\n")
        .with(day_override("wxA", 20))
        .with(day_override("wxB", 50));
    let gate = Gate::start_text(text).await;
    let mut tokens = Vec::new();
    for appid in ["wxA", "wxB"] {
        let a = gate.get(&format!("/cgi-bin/token?grant_type=client_credential&appid={appid}&secret=s")).await;
        tokens.push(a.json()["access_token"].as_str().unwrap_or_else(|| panic!("a token: {}", a.text())).to_owned());
    }
    let bucket = async |account: &str| get_at(gate.admin_addr(), &format!("/v1/buckets/{account}/send")).await.json();
    eventually_async("wxB's day limit learned", PATIENCE, async || bucket("wxB").await["limits"][0]["count"] == 30)
        .await;
    let b = bucket("wxB").await;
    assert_eq!(
        (b["limits_source"].as_str(), b["limits"][0]["configured"].as_u64()),
        (Some("override"), Some(50)),
        "{b}"
    );
    eventually_async("wxA's sync", PATIENCE, async || !bucket("wxA").await["limits"][0]["learned"].is_null()).await;
    let a = bucket("wxA").await;
    assert_eq!((a["limits"][0]["configured"].as_u64(), a["limits"][0]["count"].as_u64()), (Some(20), Some(20)), "{a}");
    let mut sent = [0u32; 2];
    for (who, token) in tokens.iter().enumerate() {
        for _ in 0..60 {
            let answer = gate.post(&format!("{SEND}?access_token={token}"), "{}").await;
            if answer.status == 200 && answer.json()["errcode"] == 0 {
                sent[who] += 1;
            } else {
                assert_eq!(answer.header("x-wxgate-reason"), Some("quota"), "refused by wxgate: {}", answer.text());
            }
        }
    }
    assert_eq!(sent, [20, 30], "wxA its override's 20, wxB WeChat's 30 under its override's 50");
    assert_eq!(sim.account(SEND, "wxB").await.e45009, 0);
}
