//! `wxgate check` and start-up refuse bad configs with a precise message.

use crate::support;

use support::process;

use std::collections::BTreeSet;

fn wxgate(args: &[&str]) -> (i32, String, String) {
    process::run(args, &[])
}

#[test]
fn bad_configs_are_refused_with_file_line_rule_and_field() {
    let cases = [
        ("burst_exceeds_count", "burst_exceeds_count.toml:4: rule \"send\": limits[0]: burst 40 exceeds count 30"),
        ("misspelled_key", "misspelled_key.toml:4: rule \"send\": limit: unknown key; did you mean `limits`? (expected one of `name`, `match`, `limits`"),
        (
            "duplicate_pattern",
            "duplicate_pattern.toml:7: rules \"a\" and \"b\" both claim the path pattern \"/cgi-bin/message/*\"",
        ),
        ("bad_duration", "bad_duration.toml:4: rule \"send\": limits[0]: per: \"1 fortnight\" is not a duration"),
        ("bad_upstream", "bad_upstream.toml:2: [server] upstream: \"ftp://api.weixin.qq.com\": must start with http:// or https://"),
        ("syntax_error", "syntax_error.toml:3: unclosed array, expected `]`"),
        ("bad_pattern", "bad_pattern.toml:3: rule \"send\": match \"/cgi-bin/*/send\": * is only allowed as a final /* segment"),
        ("bad_timezone", "bad_timezone.toml:2: [server] quota_timezone: \"Beijing\": expected a fixed offset such as \"+08:00\" or \"UTC\""),
        ("bad_workers", "bad_workers.toml:2: [server] workers: 0: must be 1 to 256"),
        ("burst_on_day", "burst_on_day.toml:4: rule \"tpl\": limits[0]: burst does not apply to per = \"day\" (a calendar quota)"),
        ("day_as_window", "day_as_window.toml:4: rule \"tpl\": limits[0]: per = \"1d\" is a sliding window of 1 x 24 hours, not a calendar day: WeChat's daily quotas start again at midnight, so write per = \"day\""),
        ("unknown_store", "unknown_store.toml:2: [store] kind: unknown store \"etcd\" (expected \"memory\", \"redis\", \"redis-cluster\" or \"redis-sentinel\")"),
        ("admin_on_listen", "admin_on_listen.toml:3: [server] admin_listen: 127.0.0.1:8080 is also listen"),
        ("bad_throttle_status", "bad_throttle_status.toml:2: [server] throttle_status: 503: must be 429 (HTTP's \"too many requests\") or 200"),
        ("bad_rule_throttle_status", "bad_rule_throttle_status.toml:4: rule \"send\": throttle_status: 404: must be 429"),
    ];
    for (name, expected) in cases {
        let stderr = refusal(name);
        let want = format!("wxgate: invalid config: tests/fixtures/{expected}");
        assert!(stderr.starts_with(&want), "{name}:\n got: {stderr}\nwant: {want}");
    }
}

/// What `wxgate check` prints for `tests/fixtures/{name}.toml`, which it
/// refuses (exit 2); serving refuses to start on it with the same message.
fn refusal(name: &str) -> String {
    let path = format!("tests/fixtures/{name}.toml");
    let (code, _, stderr) = wxgate(&["check", "--config", &path]);
    assert_eq!(code, 2, "{name}: exit code ({stderr})");
    let (code, _, serve_err) = wxgate(&["--config", &path]);
    assert_eq!((code, &serve_err), (2, &stderr), "{name}: start-up");
    stderr
}

#[test]
fn values_of_the_wrong_type_and_unknown_keys_name_file_line_place_and_field() {
    let cases = [
        ("countstr", "countstr.toml:4: rule \"send\": limits[0].count: expected an integer, got the string \"3\""),
        ("workers_string", "workers_string.toml:3: [server] workers: expected an integer, got the string \"two\""),
        ("store_batch_string", "store_batch_string.toml:3: [store] batch: expected true or false, got the string \"yes\""),
        (
            "unknown_server_key",
            "unknown_server_key.toml:3: [server] worker: unknown key; did you mean `workers`? (expected one of `listen`, `upstream`, \
             `upstream_timeout`, `body_timeout`, `upstream_ca`, `quota_timezone`, `max_held`, `shutdown_timeout`, \
             `header_timeout`, `max_body`, `admin_listen`, `admin_token`, `accounts`, `ratelimit_headers`, \
             `throttle_status`, `workers`, `mode`, `caller`, `caller_auth`, `max_accounts`, `window_margin`, \
             `window_margin_max`, `domain`, `hosts`)",
        ),
        (
            "match_string",
            "match_string.toml:3: rule \"send\": match: expected an array, got the string \"/cgi-bin/message/custom/send\"",
        ),
        (
            "penalty_seconds_string",
            "penalty_seconds_string.toml:3: [[penalty]] errcode 45009: seconds: expected an integer, got the string \"60\"",
        ),
        ("negative_max_held", "negative_max_held.toml:2: [server] max_held: expected a non-negative integer, got the integer -1"),
        ("limits_table", "limits_table.toml:4: rule \"send\": limits: expected an array, got a table"),
        (
            "max_wait_number",
            "max_wait_number.toml:4: rule \"send\": max_wait: expected a duration in quotes, such as \"10s\", got the integer 5",
        ),
        ("missing_per", "missing_per.toml:4: rule \"send\": limits[0].per: required, but not given"),
        ("duplicate_key", "duplicate_key.toml:4: [server] workers: this key is given twice"),
    ];
    for (name, expected) in cases {
        let stderr = refusal(name);
        let first = stderr.lines().next().unwrap_or_default();
        assert_eq!(first, format!("wxgate: invalid config: tests/fixtures/{expected}"), "{name}");
    }
}

#[test]
fn missing_file_is_a_clear_error() {
    let (code, _, stderr) = wxgate(&["check", "--config", "tests/fixtures/nope.toml"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("tests/fixtures/nope.toml: cannot read"), "{stderr}");
}

#[test]
fn shipped_rules_compile_and_print_each_rule() {
    let (code, stdout, stderr) = wxgate(&["check", "--config", "rules.toml"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("rule template_send [/cgi-bin/message/template/send]"), "{stdout}");
    assert!(stdout.contains("100000 per calendar day (resets at 00:00 +08:00)"), "{stdout}");
    // 5000/min with the default burst of 5 % = 250: refill (5000-250+1)
    // per 60 s + the default window_margin of 20 ms (79.1828/s without it).
    assert!(stdout.contains("5000 per 1m: capacity 250 + refill 79.1515/s"), "{stdout}");
    assert!(
        stdout.contains("no 1m-window admits more than 5000, at WeChat too for trips that differ by up to 20ms"),
        "{stdout}"
    );
    assert!(stdout.contains("unmatched paths: rule default"), "{stdout}");
}

#[test]
fn config_from_the_environment() {
    let (code, _, _) = process::run(&["check"], &[("WXGATE_CONFIG", "tests/fixtures/burst_on_day.toml")]);
    assert_eq!(code, 2);
}

#[test]
fn the_memory_store_keeps_its_state_beside_the_config_file_unless_told_otherwise() {
    use std::path::Path;
    use std::time::Duration;
    use wxgate::config::{Config, MemoryConfig, StoreConfig};

    let parse = |store: &str| {
        Config::parse(&format!("[store]\n{store}\n"), Path::new("t.toml")).map(|c| c.store).map_err(|e| e.to_string())
    };
    // Text that is not read from a file has no directory: no state file.
    assert_eq!(parse(r#"kind = "memory""#), Ok(StoreConfig::Memory(MemoryConfig::in_memory())));
    let set = parse(
        "state_file = \"/var/lib/wxgate/state.json\"\nflush_interval = \"250ms\"\nmax_entries = 5000\n\
         max_recipients = 20000",
    );
    let want = MemoryConfig {
        state_file: Some("/var/lib/wxgate/state.json".into()),
        flush_interval: Duration::from_millis(250),
        max_entries: 5000,
        max_recipients: 20000,
    };
    assert_eq!(set, Ok(StoreConfig::Memory(want)));
    for (store, error) in [
        ("kind = \"redis\"\nstate_file = \"s.json\"", "3: [store] state_file: only used with kind = \"memory\""),
        ("kind = \"redis-cluster\"\nmax_entries = 5", "3: [store] max_entries: only used with kind = \"memory\""),
        ("kind = \"redis\"\nmax_recipients = 5000", "3: [store] max_recipients: only used with kind = \"memory\""),
        ("max_recipients = 999", "2: [store] max_recipients: must be at least 1000 (the recipients one call may name)"),
        ("kind = \"redis\"\nflush_interval = \"1s\"", "3: [store] flush_interval: only used with kind = \"memory\""),
        ("state_file = \"\"", "2: [store] state_file: give a file path, or \"off\""),
        ("flush_interval = \"5ms\"", "2: [store] flush_interval: must be 10ms to 1h"),
        ("max_entries = 0", "2: [store] max_entries: must be at least 1"),
    ] {
        assert_eq!(parse(store), Err(format!("t.toml:{error}")), "{store}");
    }

    let dir = support::TempDir::new("state-file-default");
    let file = dir.write("rules.toml", "[store]\nkind = \"memory\"\n");
    let beside = Config::load(&file).expect("config").store;
    let want = MemoryConfig { state_file: Some(dir.join("wxgate-state.json")), ..MemoryConfig::in_memory() };
    assert_eq!(beside, StoreConfig::Memory(want));
    dir.write("rules.toml", "[store]\nstate_file = \"off\"\n");
    assert_eq!(Config::load(&file).expect("config").store, StoreConfig::Memory(MemoryConfig::in_memory()));
}

#[test]
fn check_piped_into_a_reader_that_stops_early_exits_quietly() {
    // `wxgate check | head -0`: the reader is gone before anything is written.
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_wxgate"))
        .args(["check", "--config", "rules.toml"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn wxgate check");
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "no panic on a broken pipe: {stderr}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
}

#[test]
fn a_sliding_window_of_whole_days_is_allowed_with_an_explicit_burst() {
    let dir = support::TempDir::new("day-window");
    let path = dir.path().join("rules.toml");
    std::fs::write(
        &path,
        "[[rule]]\nname = \"tpl\"\nmatch = [\"/cgi-bin/a\"]\nlimits = [{ count = 100, per = \"24h\", burst = 10 }]\n",
    )
    .expect("write");
    let (code, stdout, stderr) = wxgate(&["check", "--config", &path.display().to_string()]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("100 per 1day"), "{stdout}");
}

#[test]
fn scope_path_needs_listed_apis_and_check_says_what_it_does() {
    let check = |rule: &str| {
        let dir = support::TempDir::new("scope");
        let path = dir.path().join("rules.toml");
        std::fs::write(&path, format!("[[rule]]\n{rule}\nlimits = [{{ count = 1000, per = \"day\" }}]\n"))
            .expect("write");
        wxgate(&["check", "--config", &path.display().to_string()])
    };
    let (code, stdout, stderr) =
        check("name = \"draft\"\nmatch = [\"/cgi-bin/draft/add\", \"/cgi-bin/draft/update\"]\nscope = \"path\"");
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("scope path: each of its 2 paths counts against these limits on its own"), "{stdout}");

    let (code, _, stderr) = check("name = \"draft\"\nmatch = [\"/cgi-bin/draft/*\"]\nscope = \"path\"");
    assert_eq!(code, 2);
    assert!(stderr.contains("rules.toml:4: rule \"draft\": scope = \"path\" counts each listed API apart: list them as exact paths (\"/cgi-bin/draft/*\" is a prefix"), "{stderr}");
    let (code, _, stderr) = check("name = \"default\"\nscope = \"path\"");
    assert_eq!(code, 2);
    assert!(
        stderr.contains("rule \"default\": scope = \"path\": the default rule takes every unlisted path"),
        "{stderr}"
    );
    let (code, _, stderr) = check("name = \"draft\"\nmatch = [\"/cgi-bin/draft/add\"]\nscope = \"api\"");
    assert_eq!(code, 2);
    assert!(
        stderr.contains("rule \"draft\": scope: \"api\" is unknown (expected \"rule\", \"path\" or \"app\")"),
        "{stderr}"
    );
}

#[test]
fn scope_app_reads_the_app_from_the_body_and_check_says_what_it_does() {
    let check = |more: &str| {
        let dir = support::TempDir::new("scope-app");
        let path = dir.path().join("rules.toml");
        let rule = format!(
            "[[rule]]\nname = \"message_send\"\nmatch = [\"/cgi-bin/message/send\"]\nscope = \"app\"\n\
             limits = [{{ count = 1000, per = \"day\" }}]\n{more}\n"
        );
        std::fs::write(&path, rule).expect("write");
        wxgate(&["check", "--config", &path.display().to_string()])
    };
    let (code, stdout, stderr) = check("cost = \"recipients\"\nrecipients = { field = \"touser\", separator = \"|\" }");
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("scope app: each WeCom app (the body's agentid) counts against these limits on its own"),
        "{stdout}"
    );
    let (code, _, stderr) = check("");
    assert_eq!(code, 2);
    assert!(
        stderr.contains("rule \"message_send\": scope = \"app\": counts each WeCom app apart, by the body's agentid: it needs recipients"),
        "{stderr}"
    );
    let (code, _, stderr) =
        check("cost = \"recipients\"\nrecipients = { field = \"touser\", separator = \"|\" }\nquota_sync = \"1h\"");
    assert_eq!(code, 2);
    assert!(
        stderr.contains("rule \"message_send\": scope = \"app\": each WeCom app's counts are kept apart"),
        "{stderr}"
    );
}

#[test]
fn a_reserve_keeps_whole_calls_back_and_says_when_it_cannot() {
    let check = |limits: &str, reserve: &str| {
        let dir = support::TempDir::new("reserve");
        let path = dir.path().join("rules.toml");
        let text =
            format!("[[rule]]\nname = \"send\"\nmatch = [\"/a\"]\nlimits = [{limits}]\nreserve = \"{reserve}\"\n");
        std::fs::write(&path, text).expect("write");
        wxgate(&["check", "--config", &path.display().to_string()])
    };
    let (code, stdout, stderr) =
        check("{ count = 100, per = \"1m\", burst = 10 }, { count = 1000, per = \"day\" }", "20%");
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("reserve 20%: normal-priority callers leave that share"), "{stdout}");
    let (code, _, stderr) = check("{ count = 20, per = \"1m\" }", "20%");
    assert_eq!(code, 2);
    assert!(stderr.contains("reserve: 20% of limits[0]'s burst of 1 leaves no call for normal callers"), "{stderr}");
    assert!(stderr.contains("give it burst = 2 or more"), "{stderr}");
    for bad in ["20", "0%", "100%", "a lot"] {
        let (code, _, stderr) = check("{ count = 1000, per = \"day\" }", bad);
        assert_eq!(code, 2, "{bad}");
        assert!(stderr.contains("expected a share such as \"20%\" (1% to 99%)"), "{bad}: {stderr}");
    }
}

#[test]
fn a_max_share_prints_each_callers_limits_and_says_when_it_leaves_none() {
    let check = |limits: &str, share: &str| {
        let dir = support::TempDir::new("share");
        let path = dir.path().join("rules.toml");
        let text = format!(
            "[server]\ncaller = \"billing\"\n\n[[caller]]\nname = \"hr\"\npriority = \"high\"\nrate = \"50/s\"\n\n\
             [[caller]]\nname = \"shop\"\nthrottle_status = 200\n\n\
             [[rule]]\nname = \"send\"\nmatch = [\"/a\"]\nlimits = [{limits}]\nmax_share = \"{share}\"\n"
        );
        std::fs::write(&path, text).expect("write");
        wxgate(&["check", "--config", &path.display().to_string()])
    };
    let (code, stdout, stderr) =
        check("{ count = 100, per = \"1m\", burst = 10 }, { count = 1000, per = \"day\" }", "60%");
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("max_share 60%: no one caller (declared, or all undeclared together) uses more than 60 per 1m (burst 6), 600 per calendar day"),
        "{stdout}"
    );
    // The callers are listed too.
    assert!(stdout.contains("caller of calls without X-Wx-Caller: billing"), "{stdout}");
    assert!(stdout.contains("caller hr: priority high, flood guard 50/s per instance\n"), "{stdout}");
    assert!(
        stdout.contains("caller shop: priority normal, no flood guard, refusals as 200 + errcode 45009"),
        "{stdout}"
    );
    let (code, _, stderr) = check("{ count = 1, per = \"1m\" }", "60%");
    assert_eq!(code, 2);
    assert!(stderr.contains("max_share: 60% of limits[0]'s count of 1 is less than one call"), "{stderr}");
    let (code, _, stderr) = check("{ count = 1000, per = \"day\" }", "100%");
    assert_eq!(code, 2);
    assert!(stderr.contains("expected a share such as \"20%\" (1% to 99%)"), "{stderr}");
}

#[test]
fn quota_sync_and_tokens_name_their_keys_and_check_prints_them() {
    let check = |text: &str| {
        let dir = support::TempDir::new("tokens");
        let path = dir.path().join("rules.toml");
        std::fs::write(&path, text).expect("write");
        wxgate(&["check", "--config", &path.display().to_string()])
    };
    let send = |extra: &str| {
        format!("[[rule]]\nname = \"send\"\nmatch = [\"/cgi-bin/message/custom/send\"]\nlimits = [{{ count = 1000, per = \"day\" }}]\n{extra}\n")
    };
    let (code, stdout, stderr) = check(&format!("{}\n[tokens]\nmin_ttl = \"10m\"\n", send("quota_sync = \"10m\"")));
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("quota_sync send (/cgi-bin/message/custom/send): asks WeChat's quota/get every 10m"),
        "{stdout}"
    );
    assert!(stdout.contains("its `daily_limit` lowers the account's day quota (learn = \"down\")"), "{stdout}");
    assert!(stdout.contains("tokens: cache on (in-process); min_ttl 10m, wait 15s"), "{stdout}");
    let bad = [
        (send("quota_sync = \"500ms\""), "rules.toml:5: rule \"send\": quota_sync: \"500ms\" is shorter than 1s"),
        (
            "[[rule]]\nname = \"s\"\nmatch = [\"/cgi-bin/message/*\"]\nlimits = [{ count = 9, per = \"day\" }]\nquota_sync = \"10m\"\n"
                .into(),
            "quota_sync: needs an exact path in match",
        ),
        (
            "[[rule]]\nname = \"s\"\nmatch = [\"/sns/jscode2session\"]\nlimits = [{ count = 9, per = \"day\" }]\nquota_sync = \"10m\"\n"
                .into(),
            "quota/get does not answer for /sns/ APIs",
        ),
        (
            "[[rule]]\nname = \"s\"\nmatch = [\"/cgi-bin/a\"]\nlimits = [{ count = 9, per = \"1m\" }]\nquota_sync = \"10m\"\n"
                .into(),
            "quota_sync: the rule has no per = \"day\" limit",
        ),
        (send("learn = \"both\""), "rules.toml:5: rule \"send\": learn: \"both\" needs quota_sync"),
        (send("quota_sync = \"10m\"\nlearn = \"up\""), "rules.toml:6: rule \"send\": learn: \"up\" is unknown"),
        ("[tokens]\nwait = \"0s\"\n".into(), "rules.toml:2: [tokens] wait: must be between 1s and 2m"),
        ("[tokens]\nmin_ttl = \"3h\"\n".into(), "[tokens] min_ttl: must be shorter than a token's 2 hours"),
        ("[tokens]\ncache = \"yes\"\n".into(), "rules.toml:2: [tokens] cache: expected true or false"),
        ("[tokens]\nkey = \"x\"\n".into(), "rules.toml:2: [tokens] key: unknown key"),
    ];
    for (text, want) in bad {
        let (code, _, stderr) = check(&text);
        assert_eq!(code, 2, "{text}");
        assert!(stderr.contains(want), "{text}\nwanted: {want}\ngot: {stderr}");
    }
}

/// `wxgate check` says every option a rule sets, and the admin API shows
/// the same options (both from the one description, `Rule::shown`).
#[test]
fn check_reports_every_option_a_rule_sets() {
    let dir = support::TempDir::new("options");
    let path = dir.path().join("rules.toml");
    let text = "[[rule]]\nname = \"send\"\nmatch = [\"/a\"]\nlimits = [{ count = 100, per = \"1m\" }]\n\
                max_wait = \"2s\"\nwarmup = \"30s\"\nconcurrency = 4\nmode = \"shadow\"\n\n\
                [[rule]]\nname = \"plain\"\nmatch = [\"/b\"]\nlimits = [{ count = 100, per = \"1m\" }]\n";
    std::fs::write(&path, text).expect("write");
    let (code, stdout, stderr) = wxgate(&["check", "--config", &path.display().to_string()]);
    assert_eq!(code, 0, "{stderr}");
    for line in [
        "  max_wait 2s: a call whose slot is that close is held for it, not refused",
        "  warmup 30s: after a cold start or a token refresh the refill starts at half",
        "  concurrency 4: at most that many calls in flight at WeChat",
        "  mode shadow: decided and counted, but every call is forwarded",
    ] {
        assert!(stdout.contains(line), "{line:?} in {stdout}");
    }
    // A rule at its defaults gets no option lines.
    let plain = stdout.split("rule plain").nth(1).expect("rule plain");
    for word in ["max_wait", "warmup", "concurrency", "mode"] {
        assert!(!plain.contains(word), "{word} in {plain}");
    }
}

/// `caller_auth`: what a config must say for it, and what `wxgate check`
/// shows (grants, never a key).
#[test]
fn caller_auth_needs_keys_and_grants_and_check_shows_grants_without_keys() {
    use std::os::unix::fs::PermissionsExt;
    let dir = support::TempDir::new("caller-auth");
    let key = dir.write("orders.key", "orders-key-0123456789abcdef\n");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let hex = "0".repeat(64);
    let check = |server: &str, callers: &str| {
        let path = dir.path().join("rules.toml");
        let text = format!(
            "[server]\n{server}\n{callers}\n[[rule]]\nname = \"send\"\nmatch = [\"/a\"]\nlimits = [{{ count = 10, per = \"day\" }}]\n"
        );
        std::fs::write(&path, text).expect("write");
        wxgate(&["check", "--config", &path.display().to_string()])
    };
    let orders =
        format!("[[caller]]\nname = \"orders\"\nkey_file = \"{}\"\naccounts = [\"wxA\", \"wxB\"]\n", key.display());
    let (code, stdout, stderr) = check("caller_auth = \"required\"", &orders);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("caller orders: priority normal, no flood guard, a key, accounts: wxA, wxB"), "{stdout}");
    assert!(stdout.contains("caller_auth required"), "{stdout}");
    assert!(!stdout.contains("orders-key") && !stdout.contains(&key.display().to_string()), "{stdout}");
    for (server, callers, says) in [
        ("caller_auth = \"required\"", String::new(), "needs at least one [[caller]] with a key"),
        (
            "caller_auth = \"required\"",
            "[[caller]]\nname = \"a\"\naccounts = [\"*\"]\n".to_owned(),
            "caller \"a\": caller_auth = \"required\" needs a key",
        ),
        (
            "caller_auth = \"required\"",
            format!("[[caller]]\nname = \"a\"\nkey_sha256 = \"{hex}\"\n"),
            "caller \"a\": caller_auth = \"required\" needs accounts",
        ),
        (
            "caller_auth = \"required\"\ncaller = \"a\"",
            format!("[[caller]]\nname = \"a\"\nkey_sha256 = \"{hex}\"\naccounts = [\"*\"]\n"),
            "with caller_auth = \"required\" a call's caller is the one its key proves",
        ),
        (
            "",
            format!(
                "[[caller]]\nname = \"a\"\nkey_sha256 = \"{hex}\"\n[[caller]]\nname = \"b\"\nkey_sha256 = \"{hex}\"\n"
            ),
            "caller \"b\": another [[caller]] has the same key",
        ),
        ("", "[[caller]]\nname = \"a\"\nkey_sha256 = \"abc\"\n".to_owned(), "key_sha256: expected the 64 hex digits"),
        ("", "[[caller]]\nname = \"a\"\naccounts = [\"*\", \"wxA\"]\n".to_owned(), "\"*\" grants every account"),
        ("listen = \"0.0.0.0:0\"", String::new(), "[server] caller_auth: listen 0.0.0.0:0 is beyond loopback"),
        ("caller_auth = \"maybe\"", String::new(), "caller_auth: \"maybe\" is unknown"),
        ("max_accounts = 0", String::new(), "max_accounts: must be at least 1"),
    ] {
        let (code, _, stderr) = check(server, &callers);
        assert_eq!(code, 2, "{says}: {stderr}");
        assert!(stderr.contains(says), "{says}: {stderr}");
    }
    // Written out, an open listener is a choice: accepted, and said.
    let (code, stdout, stderr) = check("listen = \"0.0.0.0:0\"\ncaller_auth = \"off\"", "");
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("caller_auth off on 0.0.0.0:0 (beyond loopback)"), "{stdout}");
    // A key file others may read is refused.
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let (code, _, stderr) = check("caller_auth = \"required\"", &orders);
    assert_eq!(code, 2);
    assert!(stderr.contains("has mode 0644: others can read it"), "{stderr}");
    std::fs::write(&key, "short").expect("write");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let (code, _, stderr) = check("caller_auth = \"required\"", &orders);
    assert_eq!(code, 2);
    assert!(stderr.contains("shorter than 16 bytes"), "{stderr}");
}

/// The recipients keys (issue 32) refuse what could not be counted as
/// written, naming the rule and the key.
#[test]
fn recipient_metering_configs_that_cannot_work_are_refused() {
    let rule = |more: &str| {
        format!(
            "[server]\nupstream = \"http://127.0.0.1:9\"\n[[rule]]\nname = \"m\"\nmatch = [\"/cgi-bin/message/send\"]\n\
             limits = [{{ count = 100, per = \"day\" }}]\n{more}\n"
        )
    };
    let fields = "recipients = { field = \"touser\", separator = \"|\" }";
    let cases = [
        ("cost = \"recipients\"".to_owned(), "cost = \"recipients\": needs recipients"),
        ("cost = \"people\"".to_owned(), "cost: \"people\" is unknown"),
        ("per_recipient = [{ count = 3, per = \"1m\" }]".to_owned(), "per_recipient: needs recipients"),
        (fields.to_owned(), "recipients: read only for cost = \"recipients\" or per_recipient"),
        (
            format!("{fields}\nper_recipient = [{{ count = 3, per = \"day\" }}]"),
            "per_recipient[0]: per_recipient limits are windows",
        ),
        (
            format!("{fields}\nper_recipient = [{{ count = 3, per = \"1m\" }}, {{ count = 5, per = \"1m\" }}]"),
            "per_recipient[1]: another per_recipient limit has per = \"1m\"",
        ),
        (
            format!(
                "{fields}\nper_recipient = [{{ count = 3, per = \"1s\" }}, {{ count = 5, per = \"1m\" }}, \
                 {{ count = 9, per = \"1h\" }}, {{ count = 99, per = \"2h\" }}]"
            ),
            "per_recipient: at most 3 limits",
        ),
        (
            "cost = \"recipients\"\nrecipients = { field = \"a..b\" }".to_owned(),
            "recipients: \"a..b\" is not a field path",
        ),
        (
            "cost = \"recipients\"\nrecipients = { field = \"touser\", separator = \"\" }".to_owned(),
            "separator: must not be empty",
        ),
        (
            "cost = \"recipients\"\nrecipients = { field = \"touser\", unseen_cost = 0 }".to_owned(),
            "unseen_cost: must be at least 1",
        ),
        (
            "cost = \"recipients\"\nrecipients = { field = \"touser\", unseen = [\"touser\"] }".to_owned(),
            "lists the recipients field",
        ),
        ("cost = \"recipients\"\nrecipients = { field = \"touser\", who = 1 }".to_owned(), "unknown"),
        (format!("cost = \"recipients\"\n{fields}\nscope = \"path\""), "not with scope = \"path\""),
    ];
    for (more, says) in cases {
        let err = wxgate::config::Config::parse(&rule(&more), std::path::Path::new("m.toml"))
            .map(|_| ())
            .expect_err(&more)
            .to_string();
        assert!(err.contains("rule \"m\"") || err.contains("rule"), "{more}: {}", err);
        assert!(err.contains(says), "{more}: expected {says:?} in: {}", err);
    }
    let ok = format!("cost = \"recipients\"\n{fields}\nper_recipient = [{{ count = 30, per = \"1m\", burst = 10 }}]");
    assert!(wxgate::config::Config::parse(&rule(&ok), std::path::Path::new("m.toml")).is_ok());
}

/// `kind = "redis-sentinel"` needs its sentinels and the master's name, and
/// takes no `url` or `nodes`; the Sentinel keys belong to it alone; the
/// sentinels' URLs (which may hold a password) never print.
#[test]
fn a_sentinel_store_needs_its_sentinels_and_master_and_never_prints_their_urls() {
    use std::path::Path;
    use wxgate::config::{Config, StoreConfig};
    let parse = |store: &str| {
        Config::parse(&format!("[store]\n{store}\n"), Path::new("t.toml")).map(|c| c.store).map_err(|e| e.to_string())
    };
    let sentinel =
        "kind = \"redis-sentinel\"\nsentinels = [\"redis://:pw@10.0.0.1:26379\", \"redis://10.0.0.2:26379\"]";
    for (store, error) in [
        ("kind = \"redis-sentinel\"".to_owned(), "[store] sentinels: kind = \"redis-sentinel\" needs the sentinels"),
        (sentinel.to_owned(), "[store] master: the name the sentinels monitor the master as"),
        (
            format!("{sentinel}\nmaster = \"wxm\"\nurl = \"redis://x:6379\""),
            // Names the key given (was `url, nodes` whichever was).
            "[store] url: with kind = \"redis-sentinel\" the sentinels name the master",
        ),
        (
            "kind = \"redis-sentinel\"\nsentinels = [\"http://x\"]\nmaster = \"m\"".to_owned(),
            "must start with redis://",
        ),
        ("kind = \"redis\"\nmaster = \"m\"".to_owned(), "[store] master: only used with kind = \"redis-sentinel\""),
        // Names the one kind that takes it (was `kind = "redis"`, which does not).
        ("sentinels = [\"redis://x:26379\"]".to_owned(), "[store] sentinels: only used with kind = \"redis-sentinel\""),
    ] {
        let got = parse(&store);
        assert!(got.as_ref().is_err_and(|e| e.contains(error)), "{store}: {got:?}");
    }
    let Ok(StoreConfig::Redis(redis)) = parse(&format!("{sentinel}\nmaster = \"wxm\"")) else {
        panic!("a Sentinel store")
    };
    let s = redis.sentinel.as_ref().expect("sentinel settings");
    assert_eq!((s.sentinels.len(), s.master.as_str()), (2, "wxm"));
    assert!(!format!("{redis:?}").contains("pw@"), "no sentinel URL in Debug: {redis:?}");
}

/// Issue 44, item 18: WeCom's per-member window (30 a minute, burst 10)
/// was exact where wxgate decided, and a member's 31st message reached the
/// upstream 59.998 s after its first. The shipped rule's member windows,
/// like every window, are decided with the default arrival margin of
/// 20 ms: ⌈(60 s + 20 ms) / (30 − 10 + 1)⌉ between a member's messages.
#[test]
fn member_windows_of_the_shipped_wecom_rules_keep_the_arrival_margin() {
    let config = wxgate::config::Config::load(std::path::Path::new("deploy/rules-wecom.toml")).expect("shipped");
    let rule = config.rule_for("/cgi-bin/message/send").expect("message/send has a rule");
    let minute = rule.per_recipient.iter().find(|w| w.per_us() == 60_000_000).expect("a member's minute window");
    assert_eq!((minute.count(), minute.burst(), minute.margin_us()), (30, 10, 20_000));
    assert_eq!(minute.interval_us(), 2_858_096, "60,020,000 µs / 21, rounded up");
}

/// Issue 44 item 13: `[server] upstream = "http://user:pass@host"` was
/// accepted: the user info was never sent, but `/readyz`, the start-up log
/// and `wxgate check` printed it. `check`, start-up and a reload refuse it,
/// naming the key, and the password is printed nowhere.
#[tokio::test]
async fn an_upstream_with_user_info_is_refused_by_check_start_and_reload_and_never_printed() {
    const PASSWORD: &str = "SEKRIT_PW_9";
    let mock = support::MockWeChat::start().await;
    let dir = support::TempDir::new("upstream-user-info");
    let good = support::ConfigToml::new(&mock.url()).with(support::rule("send").matching("/cgi-bin/send"));
    let with_user = mock.url().replace("http://", &format!("http://wxuser:{PASSWORD}@"));
    let listed = format!("[\"{with_user}\"]");
    for (label, bad) in [
        ("one URL", good.clone().server("upstream", with_user.as_str()).to_string()),
        ("a list", good.to_string().replace(&format!("\"{}\"", mock.url()), &listed)),
        ("a user only", good.to_string().replace("http://", "http://wxuser@")),
    ] {
        let path = dir.write(&format!("{}.toml", label.replace(' ', "-")), &bad);
        let path = path.to_str().expect("utf-8");
        let (code, out, stderr) = wxgate(&["check", "--config", path]);
        assert_eq!(code, 2, "{label}: check refuses it: {out}{stderr}");
        assert!(stderr.contains("[server] upstream") && stderr.contains("user info"), "{label}: {stderr}");
        let (code, out, serve_err) = wxgate(&["--config", path]);
        assert_eq!((code, &serve_err), (2, &stderr), "{label}: start-up refuses it as check does");
        for text in [&out, &stderr, &serve_err] {
            assert!(!text.contains(PASSWORD) && !text.contains("wxuser"), "{label}: printed: {text}");
        }
    }
    // A reload to it is refused too: the running config stays, and neither
    // the log nor /readyz shows the password.
    let path = dir.write("running.toml", &good.to_string());
    let instance = process::spawn_path(&path, &[]).expect("serving");
    std::fs::write(dir.join("next.toml"), good.clone().server("upstream", with_user.as_str()).to_string())
        .expect("write");
    std::fs::rename(dir.join("next.toml"), &path).expect("rename");
    instance.signal("-HUP");
    support::eventually_async("the refused reload", support::PATIENCE, async || {
        instance.admin_get("/readyz").await.json()["config_reloads"]["failed"].as_u64() >= Some(1)
    })
    .await;
    let ready = instance.admin_get("/readyz").await.text();
    assert!(!ready.contains(PASSWORD) && !ready.contains("wxuser"), "{ready}");
    assert_eq!(instance.get("/cgi-bin/send?access_token=T").await.status, 200, "the running config serves on");
    let log = instance.stop().await;
    assert!(log.contains("config reload refused") && log.contains("user info"), "{log}");
    assert!(!log.contains(PASSWORD) && !log.contains("wxuser"), "{log}");
}

/// Issue 45: a config error is typed: the file, the line, the table and the
/// field are fields of its own (a tool can point at them), and its text is
/// still `file:line: table field: message`.
#[test]
fn a_config_error_gives_its_file_line_table_and_field_as_fields() {
    use wxgate::config::{Config, ConfigError};
    let dir = support::TempDir::new("typed-config-error");
    let load = |text: &str| Config::load(&dir.write("rules.toml", text)).expect_err(text);
    let file = dir.join("rules.toml");
    let at = |line, table: &str, field: &str, message: &str| ConfigError {
        file: file.clone(),
        line: Some(line),
        table: Some(table.to_owned()),
        field: Some(field.to_owned()),
        message: message.to_owned(),
    };
    // A key of another store kind.
    let e = load("[store]\nkind = \"redis\"\ntimeout = \"10ms\"\nstate_file = \"s.json\"\n");
    assert_eq!(e, at(4, "[store]", "state_file", "only used with kind = \"memory\""));
    assert_eq!(e.to_string(), format!("{}:4: [store] state_file: only used with kind = \"memory\"", file.display()));
    // A value serde cannot read, in a rule.
    let e = load("[[rule]]\nname = \"send\"\nmatch = [\"/a\"]\nlimits = [{ count = \"3\", per = \"1m\" }]\n");
    assert_eq!(e, at(4, "rule \"send\"", "limits[0].count", "expected an integer, got the string \"3\""));
    // A value a check refuses.
    let e = load("[server]\nworkers = 1\nheader_timeout = \"0s\"\n");
    assert_eq!(e, at(3, "[server]", "header_timeout", "must be more than 0"));
    // A file that cannot be read has neither line nor place.
    let missing = dir.join("nope.toml");
    let e = Config::load(&missing).expect_err("no file");
    assert_eq!((e.file, e.line, e.table, e.field), (missing, None, None, None));
    assert!(e.message.starts_with("cannot read: "), "{}", e.message);
}

/// `text` written as `rules.toml` in a scratch directory: `wxgate check`'s
/// exit code, stdout and stderr, with the directory written `DIR`.
fn check_text(tag: &str, text: &str, env: &[(&str, &str)]) -> (i32, String, String) {
    let dir = support::TempDir::new(tag);
    let path = dir.write("rules.toml", text);
    let (code, stdout, stderr) = process::run(&["check", "--config", &path.display().to_string()], env);
    let at = dir.path().display().to_string();
    (code, stdout.replace(&at, "DIR"), stderr.replace(&at, "DIR"))
}

/// `text` refused by `wxgate check` (exit 2) and by start-up with the same
/// message: that message's first line, the directory written `DIR`.
fn refused_text(tag: &str, text: &str) -> String {
    let dir = support::TempDir::new(tag);
    let path = dir.write("rules.toml", text);
    let path = path.display().to_string();
    let (code, _, stderr) = wxgate(&["check", "--config", &path]);
    assert_eq!(code, 2, "{tag}: check's exit code ({stderr})");
    let (code, _, serve_err) = wxgate(&["--config", &path]);
    assert_eq!((code, &serve_err), (2, &stderr), "{tag}: start-up");
    stderr.lines().next().unwrap_or_default().replace(&dir.path().display().to_string(), "DIR")
}

const SEND_RULE: &str = "[[rule]]\nname = \"send\"\nmatch = [\"/cgi-bin/message/custom/send\"]\n";

/// Issue 46: `per = "1M"` was a sliding window of 30.44 days (the parser's
/// months) where a minute was as likely meant; `"1 week"` was told to
/// write `per = "month"`; a `"1month"` window passed as if it were WeChat's
/// calendar month. Every unit the shipped rules use still passes.
#[test]
fn window_units_are_unambiguous_and_the_hints_say_what_to_write() {
    let limit = |per: &str| format!("{SEND_RULE}limits = [{{ count = 10, per = \"{per}\" }}]\n");
    let cases = [
        (
            "1M",
            "rule \"send\": limits[0]: per = \"1M\": the unit M is ambiguous (minutes or months): write per = \"1min\" \
             (or \"1m\") for a one-minute window, or per = \"month\" for WeChat's calendar month",
        ),
        (
            "1 week",
            "rule \"send\": limits[0]: per = \"1 week\" is a sliding window of 7 x 24 hours: WeChat's quotas are per \
             calendar day (per = \"day\") or month (per = \"month\"), none per 7 days; to mean a sliding window, write \
             per = \"7d\" and give its burst too",
        ),
        (
            "1month",
            "rule \"send\": limits[0]: per = \"1month\" is a sliding window of 30.44 days, not a calendar month: \
             WeChat's monthly quotas start again on the 1st, so write per = \"month\"",
        ),
    ];
    for (per, want) in cases {
        assert_eq!(
            refused_text("per", &limit(per)),
            format!("wxgate: invalid config: DIR/rules.toml:4: {want}"),
            "{per}"
        );
    }
    // M is ambiguous in every duration, not only a window.
    assert_eq!(
        refused_text("per", "[server]\nupstream_timeout = \"1M\"\n"),
        "wxgate: invalid config: DIR/rules.toml:2: [server] upstream_timeout: \"1M\": the unit M is ambiguous \
         (minutes or months): write \"1min\" (or \"1m\") for minutes, \"30d\" for days"
    );
    for per in ["1s", "10s", "1m", "1min", "2 min", "1h", "2h", "day", "month"] {
        let (code, _, stderr) = check_text("per-ok", &limit(per), &[]);
        assert_eq!(code, 0, "{per}: {stderr}");
    }
}

/// Issue 46: a pattern with uppercase letters was accepted, though every
/// call whose path has one is refused (400) before a rule is looked up.
#[test]
fn a_match_pattern_no_call_path_can_have_is_refused_saying_why() {
    let rule = |pattern: &str| format!("[[rule]]\nname = \"send\"\nmatch = [\"{pattern}\"]\n");
    assert_eq!(
        refused_text("upper", &rule("/cgi-bin/Message/send")),
        "wxgate: invalid config: DIR/rules.toml:3: rule \"send\": match \"/cgi-bin/Message/send\": has uppercase \
         letters, so it can never match: WeChat's API paths are lowercase, and wxgate refuses a call whose path has \
         uppercase letters (400) before any rule is looked up; write \"/cgi-bin/message/send\""
    );
    assert_eq!(
        refused_text("semicolon", &rule("/cgi-bin/send;x")),
        "wxgate: invalid config: DIR/rules.toml:3: rule \"send\": match \"/cgi-bin/send;x\": can never match: this \
         path is not a WeChat API path: WeChat's API paths are only a-z 0-9 _ - . / (no uppercase, escapes, ; or \\)"
    );
}

/// Issue 46: `upstream = "http://127.0.0.1:9999/cgi-bin/"` made WeChat (the
/// simulator) get `/cgi-bin/cgi-bin/...`. A path prefix of another kind (a
/// relay's) stays allowed.
#[test]
fn an_upstream_holding_wechats_api_path_is_refused_naming_the_field() {
    assert_eq!(
        refused_text("upstream", "[server]\nupstream = \"http://127.0.0.1:9999/cgi-bin/\"\n"),
        "wxgate: invalid config: DIR/rules.toml:2: [server] upstream: \"http://127.0.0.1:9999/cgi-bin/\": the path \
         \"/cgi-bin/\" is part of WeChat's API paths, which every call's path already starts with (the upstream's \
         path is put before it: WeChat would get /cgi-bin/cgi-bin/...); give \"http://127.0.0.1:9999\""
    );
    assert_eq!(
        refused_text(
            "upstream",
            "[server]\nupstream = [\"https://relay.example/wx\", \"https://relay2.example/sns\"]\n"
        ),
        "wxgate: invalid config: DIR/rules.toml:2: [server] upstream[1]: \"https://relay2.example/sns\": the path \
         \"/sns\" is part of WeChat's API paths, which every call's path already starts with (the upstream's path is \
         put before it: WeChat would get /sns/sns/...); give \"https://relay2.example\""
    );
    let (code, _, stderr) = check_text("relay", "[server]\nupstream = \"https://relay.example/wx\"\n", &[]);
    assert_eq!(code, 0, "{stderr}");
}

/// Issue 46: `max_wiat` got the whole key list and no suggestion.
#[test]
fn an_unknown_key_near_a_known_one_gets_a_did_you_mean() {
    assert_eq!(
        refused_text("typo", &format!("{SEND_RULE}max_wiat = \"1s\"\n")),
        "wxgate: invalid config: DIR/rules.toml:4: rule \"send\": max_wiat: unknown key; did you mean `max_wait`? \
         (expected one of `name`, `match`, `limits`, `max_wait`, `warmup`, `concurrency`, `mode`, `throttle_status`, \
         `scope`, `reserve`, `max_share`, `quota_sync`, `learn`, `learn_windows`, `cost`, `recipients`, `per_recipient`, `queue`, \
         `queue_deadline`, `queue_order`)"
    );
    assert_eq!(
        refused_text("typo", "[store]\nkind = \"redis\"\ninstanses = 3\n"),
        "wxgate: invalid config: DIR/rules.toml:3: [store] instanses: unknown key; did you mean `instances`? \
         (expected one of `url`, `lease`, `username`, `tls_ca`, `key_prefix`, `timeout`, `wait_replicas`, \
         `fallback`, `instances`, `breaker_failures`, `breaker_open`, `refusal_cache`, `batch`, `quota_leases`, `quota_lease_span`, `quota_lease_calls`, `quota_reserve`)"
    );
    // Nothing near: the list alone.
    assert_eq!(
        refused_text("typo", "[log]\nverbosity = 3\n"),
        "wxgate: invalid config: DIR/rules.toml:2: [log] verbosity: unknown key; expected `format` or `access`"
    );
}

/// Issue 46: an account listed twice was told to "give each its own name".
#[test]
fn an_account_listed_twice_is_named_with_the_line_of_the_other() {
    let dir = support::TempDir::new("account-twice");
    let secret = dir.write_secret("secret", "0123456789abcdef0123456789abcdef");
    let account = |extra: &str| {
        format!(
            "[[account]]\nid = \"wx1234567890abcdef\"\nkind = \"official_account\"\nsecret_file = \"{}\"\n{extra}",
            secret.display()
        )
    };
    let text = format!("[server]\nlisten = \"127.0.0.1:0\"\n\n{}\n{}", account(""), account(""));
    let path = dir.write("rules.toml", &text);
    let (code, _, stderr) = wxgate(&["check", "--config", &path.display().to_string()]);
    assert_eq!(code, 2, "{stderr}");
    assert_eq!(
        stderr.trim_end(),
        format!(
            "wxgate: invalid config: {}:9: [[account]] \"wx1234567890abcdef\": this account is listed twice: the \
             [[account]] at line 4 has the same id; keep one of them",
            path.display()
        )
    );
    // Two accounts given one name: each needs its own.
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n\n{}\n{}",
        account("name = \"shop\"\n"),
        account("name = \"shop\"\n").replace("wx1234567890abcdef", "wxfedcba0987654321")
    );
    dir.write("rules.toml", &text);
    let (code, _, stderr) = wxgate(&["check", "--config", &path.display().to_string()]);
    assert_eq!(code, 2, "{stderr}");
    assert_eq!(
        stderr.trim_end(),
        format!(
            "wxgate: invalid config: {}:10: [[account]] \"wxfedcba0987654321\": the [[account]] at line 4 is also \
             named \"shop\": give each its own name (two apps of one corpid need one each)",
            path.display()
        )
    );
}

/// An `[[account]]` over Redis (which no test here reaches: port 1), its
/// secret from `WXGATE_TEST_SECRET`.
const ACCOUNT_OVER_REDIS: &str = "[server]\nlisten = \"127.0.0.1:0\"\n\n[store]\nkind = \"redis\"\n\
    url = \"redis://:hunter2@127.0.0.1:1/0\"\ninstances = 2\n\n[[account]]\nid = \"wx1234567890abcdef\"\n\
    kind = \"official_account\"\nsecret_env = \"WXGATE_TEST_SECRET\"\n";
const TEST_SECRET: (&str, &str) = ("WXGATE_TEST_SECRET", "0123456789abcdef0123456789abcdef");
const NEEDS_CACHE: &str = "[[account]] needs the token cache: [tokens] cache is off (or, over Redis, no token key: \
    set WXGATE_TOKEN_KEY or [tokens] key_file, the same on every instance)";

/// Issue 46: an `[[account]]` over Redis without a token key passed
/// `wxgate check` ("ok") and start-up exited 1. `check` builds what
/// start-up builds: what fails whatever the environment is an error (exit
/// 2); the token key, which the serving environment alone usually holds
/// (a Secret a check in CI cannot see), is a warning naming what start-up
/// needs. And check prints the effective store and token cache.
#[test]
fn check_fails_what_start_up_fails_and_warns_of_what_only_the_serving_environment_can_give() {
    let (code, stdout, stderr) = check_text("key-elsewhere", ACCOUNT_OVER_REDIS, &[TEST_SECRET]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        stderr,
        format!(
            "wxgate: warning: WXGATE_TOKEN_KEY is not set here and [tokens] key_file is not given, so start-up here \
             fails (exit 1): \"{NEEDS_CACHE}\"; set WXGATE_TOKEN_KEY (the same on every instance) where wxgate runs\n"
        )
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.first(), Some(&"DIR/rules.toml: ok, 1 warning (on stderr)"), "{stdout}");
    assert!(
        lines.contains(
            &"store redis at redis://127.0.0.1:1/0, key prefix \"wxgate\": limits shared by every instance; while \
              Redis cannot answer, each instance decides alone with 1/2 of each limit (instances 2)"
        ),
        "{stdout}"
    );
    assert!(
        lines.contains(
            &"tokens: cache on, shared by every instance through Redis where WXGATE_TOKEN_KEY is set (not set here); \
              min_ttl 5m, wait 15s"
        ),
        "{stdout}"
    );
    assert!(!stdout.contains("hunter2") && !stderr.contains("hunter2"), "no password printed");

    // Start-up here fails as the warning says.
    let dir = support::TempDir::new("key-elsewhere-start");
    let path = dir.write("rules.toml", ACCOUNT_OVER_REDIS);
    let (code, _, stderr) = process::run(&["--config", &path.display().to_string()], &[TEST_SECRET]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.trim_end().ends_with(&format!("wxgate: {NEEDS_CACHE}")), "{stderr}");

    // With the key: no warning; the cache is shared.
    let key = "ab".repeat(32);
    let (code, stdout, stderr) =
        check_text("key-here", ACCOUNT_OVER_REDIS, &[TEST_SECRET, ("WXGATE_TOKEN_KEY", key.as_str())]);
    assert_eq!((code, stderr.as_str()), (0, ""));
    assert!(stdout.starts_with("DIR/rules.toml: ok\n"), "{stdout}");
    assert!(
        stdout.contains(
            "tokens: cache on, shared by every instance through Redis (sealed with the token key); min_ttl 5m"
        ),
        "{stdout}"
    );

    // What fails wherever wxgate starts is an error.
    let (code, _, stderr) =
        check_text("key-bad", ACCOUNT_OVER_REDIS, &[TEST_SECRET, ("WXGATE_TOKEN_KEY", "not-a-key")]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.starts_with("wxgate: invalid config: DIR/rules.toml: WXGATE_TOKEN_KEY: "), "{stderr}");
    let off = format!("{ACCOUNT_OVER_REDIS}\n[tokens]\ncache = false\n");
    let (code, _, stderr) = check_text("cache-off", &off, &[TEST_SECRET, ("WXGATE_TOKEN_KEY", key.as_str())]);
    assert_eq!((code, stderr), (2, format!("wxgate: invalid config: DIR/rules.toml: {NEEDS_CACHE}\n")));
    let (code, _, stderr) = check_text(
        "key-file-missing",
        &format!("{ACCOUNT_OVER_REDIS}\n[tokens]\nkey_file = \"token.key\"\n"),
        &[TEST_SECRET],
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.starts_with("wxgate: invalid config: DIR/rules.toml: [tokens] key_file: DIR/token.key"), "{stderr}");

    // Without an [[account]], the shared token cache is off where no key is set: said.
    let no_account = &ACCOUNT_OVER_REDIS[..ACCOUNT_OVER_REDIS.find("[[account]]").unwrap_or(0)];
    let (code, stdout, stderr) = check_text("cache-elsewhere", no_account, &[]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        stderr,
        "wxgate: warning: [tokens]: the token cache is off over Redis unless WXGATE_TOKEN_KEY is set where wxgate \
         runs (it is not set here, and [tokens] key_file is not given): without it every instance fetches its own \
         access tokens, and each fetch invalidates the others' five minutes later\n"
    );
    assert!(stdout.contains("tokens: cache on, shared by every instance through Redis where WXGATE_TOKEN_KEY is set"));
}

/// Issue 46 item 8: `state_file` (and `[tokens] key_file`, `upstream_ca`)
/// were relative to the working directory, every other path to the
/// config file's. `check` prints where the state is kept.
#[test]
fn every_path_in_the_config_is_relative_to_its_directory() {
    use wxgate::config::{Config, StoreConfig};
    let dir = support::TempDir::new("relative-paths");
    std::fs::create_dir_all(dir.join("state")).expect("mkdir");
    dir.write_secret("token.key", &"ab".repeat(32));
    dir.write("ca.pem", &support::pki::pki(&["127.0.0.1"]).ca_pem);
    let text = "[server]\nupstream_ca = \"ca.pem\"\n\n[store]\nstate_file = \"state/wx.json\"\n\n[tokens]\nkey_file = \"token.key\"\n";
    let path = dir.write("rules.toml", text);
    let config = Config::load(&path).expect("config");
    let StoreConfig::Memory(m) = &config.store else { panic!("memory") };
    assert_eq!(m.state_file.as_deref(), Some(dir.join("state/wx.json").as_path()));
    assert_eq!(config.tokens.key_file.as_deref(), Some(dir.join("token.key").as_path()));
    assert_eq!(config.server.upstream_ca.as_deref(), Some(dir.join("ca.pem").as_path()));
    // From another working directory (the crate's), check finds them all.
    let (code, stdout, stderr) = wxgate(&["check", "--config", &path.display().to_string()]);
    assert_eq!((code, stderr.as_str()), (0, ""));
    let at = dir.path().display();
    assert!(
        stdout.contains(&format!(
            "store memory: in this process, limits not shared with other instances; state file {at}/state/wx.json \
             (flushed every 1s)"
        )),
        "{stdout}"
    );
}

/// Issue 46: a caller granted several accounts whose call named none got
/// `may not spend account "default"`, with no word on how to name one.
#[tokio::test]
async fn a_call_naming_no_account_of_a_caller_granted_several_is_told_how_to_name_one() {
    use support::{caller, rule, ConfigToml, Gate, MockWeChat};
    const KEY: &str = "orders-key-0123456789abcdef";
    let digest: String = wxgate::config::KeyDigest::of(KEY.as_bytes()).0.iter().map(|b| format!("{b:02x}")).collect();
    let mock = MockWeChat::start().await;
    let orders = caller("orders").set("key_sha256", digest).set("accounts", vec!["wxA", "wxB"]);
    let config = ConfigToml::new(&mock.url())
        .server("caller_auth", "required")
        .with(orders)
        .with(rule("send").matching("/cgi-bin/message/custom/send").limit(10, "day"));
    let gate = Gate::start_text(config).await;
    let bearer = format!("Bearer {KEY}");
    let a = gate.get_with("/cgi-bin/message/custom/send?access_token=T", &[("authorization", &bearer)]).await;
    assert_eq!(a.status, 403, "{}", a.text());
    assert_eq!(
        a.json()["errmsg"],
        "wxgate: caller \"orders\" may not spend account \"default\", the account of a call that names none; it is \
         granted wxA, wxB: name one with the X-Wx-Account header or an @account path prefix (/@wxA/cgi-bin/...)"
    );
    // Named, it goes through.
    let named = [("authorization", bearer.as_str()), ("x-wx-account", "wxB")];
    assert_eq!(gate.get_with("/cgi-bin/message/custom/send?access_token=T", &named).await.status, 200);
    assert_eq!(mock.count(), 1);
}

/// With `caller_auth = "required"` no call falls back to a caller (one
/// without its key gets 401): `check` does not say one does.
#[test]
fn check_names_no_fallback_caller_where_every_call_proves_its_own() {
    let dir = support::TempDir::new("check-auth");
    let path = dir.path().join("rules.toml");
    let text = format!(
        "[server]\ncaller_auth = \"required\"\n\n[[caller]]\nname = \"orders\"\nkey_sha256 = \"{}\"\naccounts = \
         [\"wx1\"]\nthrottle_status = 429\n",
        "ab".repeat(32)
    );
    std::fs::write(&path, text).expect("write");
    let (code, stdout, stderr) = wxgate(&["check", "--config", &path.display().to_string()]);
    assert_eq!(code, 0, "{stderr}");
    assert!(!stdout.contains("caller of calls without X-Wx-Caller"), "{stdout}");
    assert!(stdout.contains("caller_auth required"), "{stdout}");
    assert!(stdout.contains("caller orders: priority normal, no flood guard, a key, accounts: "), "{stdout}");
    assert!(stdout.contains(", refusals as 429"), "{stdout}");
}

/// Issue 49: a quota lease's span is bounded, and the keys are Redis's.
#[test]
fn quota_leases_take_a_bounded_span_on_a_redis_store_only() {
    assert_eq!(
        refused_text("leases", "[store]\nkind = \"redis\"\nquota_leases = true\nquota_lease_span = \"5ms\"\n"),
        "wxgate: invalid config: DIR/rules.toml:4: [store] quota_lease_span: must be between 10ms and 60s"
    );
    let memory = refused_text("leases", "[store]\nkind = \"memory\"\nquota_leases = true\n");
    assert!(memory.contains("[store] quota_leases"), "{memory}");
    assert_eq!(
        refused_text("leases", "[store]\nkind = \"redis\"\nquota_leases = true\nquota_lease_calls = 0\n"),
        "wxgate: invalid config: DIR/rules.toml:4: [store] quota_lease_calls: must be between 1 and 100000 (calls a second)"
    );
    let (code, _, stderr) = check_text(
        "leases",
        "[store]\nkind = \"redis\"\nquota_leases = true\nquota_lease_span = \"2s\"\nquota_lease_calls = 1\n",
        &[],
    );
    assert_eq!(code, 0, "{stderr}");
}

/// A Redis store whose local fallback has no `instances` floor: an
/// instance that starts while Redis is away hears no heartbeat and would
/// decide with the whole of every limit, each of the instances: `check`
/// (and start-up) warns, naming the key; written (even as 1), no warning.
/// (Issue 46 had dropped the warning once heartbeats counted the
/// instances; issue 61 found six sidecars over-admitting at a cold start.)
#[test]
fn a_redis_store_without_an_instances_floor_is_warned_of() {
    let unset = ACCOUNT_OVER_REDIS.replace("instances = 2\n", "");
    let key = "ab".repeat(32);
    let env = [TEST_SECRET, ("WXGATE_TOKEN_KEY", key.as_str())];
    let (code, stdout, stderr) = check_text("instances-unset", &unset, &env);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.starts_with("wxgate: warning: DIR/rules.toml:"), "{stderr}");
    assert!(stderr.contains("[store] instances: not set: an instance that starts while Redis is away"), "{stderr}");
    assert!(stdout.starts_with("DIR/rules.toml: ok, 1 warning (on stderr)"), "{stdout}");
    for given in ["instances = 1\n", "instances = 2\n"] {
        let text = ACCOUNT_OVER_REDIS.replace("instances = 2\n", given);
        let (code, _, stderr) = check_text("instances-given", &text, &env);
        assert_eq!((code, stderr.as_str()), (0, ""), "{given}");
    }
    let deny = unset.replace("kind = \"redis\"\n", "kind = \"redis\"\nfallback = \"deny\"\n");
    assert_eq!(check_text("instances-deny", &deny, &env).2, "", "no fallback divides: no warning");
}

/// Issue 64: a rule resolving broadcasts through WeCom's directory needs an
/// app's `[[account]]` to read it with: `check` says what its broadcasts
/// will meet without one (the shipped WeCom rules alone), and nothing once
/// the app is there.
#[test]
fn a_directory_rule_without_a_wecom_account_is_warned_of() {
    let rules = std::fs::read_to_string("deploy/rules-wecom.toml").expect("shipped");
    let (code, stdout, stderr) = check_text("directory-no-account", &rules, &[]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("[[rule]] \"message_send\": recipients.directory: reads WeCom's directory with an app's own token, and no [[account]] kind = \"wecom\" is configured: its broadcasts (@all, toparty, totag) will be refused"),
        "{stderr}"
    );
    assert!(
        stdout.starts_with("DIR/rules.toml: ok, 2 warnings (on stderr)"),
        "the other: nothing can be queued: {stdout}"
    );
    let app = "\n[[account]]\nid = \"ww1234567890abcdef\"\nkind = \"wecom\"\nagent = \"1000002\"\nsecret_env = \"WXGATE_TEST_SECRET\"\n";
    let (code, _, stderr) = check_text("directory-account", &format!("{rules}{app}"), &[TEST_SECRET]);
    assert_eq!((code, stderr.as_str()), (0, ""));
}

/// Issue 65: an `[[account]]`'s `secret_env` not set where `check` runs
/// (CI, a laptop: the deployment's environment is elsewhere) is a warning
/// naming it, as a missing token key is; start-up still refuses it.
#[test]
fn a_secret_env_unset_here_is_a_warning_in_check_and_refused_at_start() {
    const ACCOUNT_CONFIG: &str = "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\n[[account]]\n\
        id = \"wx1234567890abcdef\"\nkind = \"official_account\"\nsecret_env = \"WXGATE_TEST_SECRET\"\n";
    let (code, stdout, stderr) = check_text("secret-env-unset", ACCOUNT_CONFIG, &[]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("the environment variable WXGATE_TEST_SECRET (an [[account]]'s secret_env) is not set here: start-up refuses the config where it is not set"),
        "{stderr}"
    );
    assert!(stdout.starts_with("DIR/rules.toml: ok, 1 warning (on stderr)"), "{stdout}");
    let (code, _, stderr) = check_text("secret-env-set", ACCOUNT_CONFIG, &[TEST_SECRET]);
    assert_eq!((code, stderr.as_str()), (0, ""));
    let dir = support::TempDir::new("secret-env-start");
    let path = dir.write("rules.toml", ACCOUNT_CONFIG);
    let (code, _, stderr) = process::run(&["--config", &path.display().to_string()], &[]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("the environment variable WXGATE_TEST_SECRET is not set"), "{stderr}");
}

/// Issue 65: `check` says, for each rule with `queue = true`, whether its
/// calls can be queued and for which accounts, and warns when none can; and
/// it warns of a window whose burst is more than half its count, with the
/// rate it sustains (the try config's old `{5, 1m, burst 5}`: one a minute).
#[test]
fn check_explains_queueing_and_warns_of_a_burst_that_sustains_little() {
    let rule = "[[rule]]\nname = \"template_send\"\nmatch = [\"/cgi-bin/message/template/send\"]\n\
                limits = [{ count = 5, per = \"1m\", burst = 5 }]\nqueue = true\n";
    let base = "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n";
    let (code, stdout, stderr) = check_text("queue-no-account", &format!("{base}{rule}"), &[]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("1 rule(s) queue calls (queue = true: template_send), but no call can be queued: no [[account]] is configured"),
        "{stderr}"
    );
    assert!(stderr.contains("limits: 5 per 1m with burst 5 sustains 1 per 1m after its burst"), "{stderr}");
    assert!(stdout.contains("  queue: no call can be queued: no [[account]]"), "{stdout}");
    let account = "[[account]]\nid = \"wxdemo\"\nkind = \"official_account\"\nsecret_env = \"WXGATE_TEST_SECRET\"\n";
    let fixed = rule.replace("burst = 5", "burst = 2");
    let (code, stdout, stderr) = check_text("queue-account", &format!("{base}{account}{fixed}"), &[TEST_SECRET]);
    assert_eq!((code, stderr.as_str()), (0, ""), "{stdout}");
    assert!(
        stdout.contains("  queue: Prefer: respond-async is kept (jobs in DIR/wxgate-queue.db) and sent at the rule's pace, for accounts wxdemo"),
        "{stdout}"
    );
    let off = format!("{base}[store]\nstate_file = \"off\"\n{account}{fixed}");
    let (_, stdout, stderr) = check_text("queue-off", &off, &[TEST_SECRET]);
    assert!(stderr.contains("but no call can be queued: there is no jobs store"), "{stderr}");
    assert!(stdout.contains("  queue: no call can be queued: no jobs store"), "{stdout}");
}

/// `rules = "..."` (issue 65): a config's `[[rule]]`s and `[[penalty]]`s
/// come from another file, relative to the config, their errors named in
/// that file; nothing else of that file is read, so it can never say who
/// may call, which accounts wxgate holds tokens for, or where it listens
/// (its `[[caller]]`s and `[[account]]`s are named in a warning); a config
/// with rules or penalties of its own too, and a chain of rules files, are
/// refused with what to do.
#[test]
fn a_config_takes_its_rules_and_penalties_from_the_file_rules_names() {
    use wxgate::config::Config;
    let dir = support::TempDir::new("rules-key");
    let rules = "[server]\nlisten = \"0.0.0.0:8080\"\ncaller_auth = \"off\"\n\n[store]\nkind = \"memory\"\n\n\
                 [[penalty]]\nerrcode = 45009\nseconds = 7\n\n\
                 [[rule]]\nname = \"send\"\nmatch = [\"/cgi-bin/message/template/send\"]\n\
                 limits = [{ count = 3, per = \"day\" }]\n\n\
                 [[caller]]\nname = \"intruder\"\n\n\
                 [[account]]\nid = \"wx0123456789abcdef\"\nkind = \"official_account\"\nsecret = \"s\"\n";
    std::fs::create_dir_all(dir.join("shared")).expect("dir");
    dir.write("shared/rules.toml", rules);
    let head = "rules = \"shared/rules.toml\"\n\n[server]\ncaller_auth = \"required\"\nadmin_listen = \"off\"\n\n\
                [[caller]]\nname = \"crm\"\nkey_sha256 = \"0000000000000000000000000000000000000000000000000000000000000001\"\n\
                accounts = [\"*\"]\n";
    let path = dir.write("wxgate.toml", head);
    let config = Config::load(&path).unwrap_or_else(|e| panic!("{e}"));
    let send = config.rule_for("/cgi-bin/message/template/send").expect("the included rule");
    assert_eq!(&*send.name, "send");
    assert_eq!(config.penalties.len(), 1, "the included file's penalties, not the defaults");
    assert_eq!(config.domains[0].rules_file.as_deref(), Some(dir.join("shared/rules.toml").as_path()));
    // The head's [server] and [[caller]]s, never the included file's.
    assert!(config.server.listen.ip().is_loopback(), "listen is the head's: {}", config.server.listen);
    assert!(config.server.caller_auth.required());
    let callers: Vec<&str> = config.callers.iter().map(|c| &*c.name).collect();
    assert_eq!(callers, ["crm"]);
    assert!(config.accounts.list.is_empty(), "no [[account]] from the included file");
    let warned: Vec<String> = config.warnings.iter().map(ToString::to_string).collect();
    assert!(
        warned.iter().any(|w| w.contains("wxgate.toml:1: rules: ")
            && w.contains("[[caller]], [[account]] are not read: only its [[rule]]s and [[penalty]]s")),
        "{warned:?}"
    );
    // `check` says where the rules are from.
    let (code, out, err) = wxgate(&["check", "--config", path.to_str().expect("utf-8")]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("rules and penalties from") && out.contains("shared/rules.toml"), "{out}");

    // An error in a rule is named in the included file, at its line.
    dir.write("shared/rules.toml", &rules.replace("count = 3", "count = \"3\""));
    let e = Config::load(&path).expect_err("a bad rule").to_string();
    assert!(e.contains("shared/rules.toml:15: rule \"send\": limits[0].count: expected an integer"), "{e}");

    // Rules or penalties in the head too: one place says them.
    dir.write("shared/rules.toml", rules);
    for own in ["[[rule]]\nname = \"x\"\n", "[[penalty]]\nerrcode = 45011\nseconds = 1\n"] {
        let both = dir.write("both.toml", &format!("{head}\n{own}"));
        let e = Config::load(&both).expect_err("both").to_string();
        assert!(e.contains("both.toml:1: rules: this file has") && e.contains("say them in one place"), "{e}");
    }
    // A rules file that names another: refused, not followed.
    dir.write("shared/rules.toml", &format!("rules = \"more.toml\"\n{rules}"));
    let e = Config::load(&path).expect_err("a chain").to_string();
    assert!(e.contains("wxgate.toml:1: rules: ") && e.contains("rules files do not chain"), "{e}");
    // A file that is not there.
    let missing = dir.write("missing.toml", "rules = \"nope.toml\"\n");
    let e = Config::load(&missing).expect_err("missing").to_string();
    assert!(e.contains("missing.toml:1: rules: cannot read") && e.contains("nope.toml"), "{e}");
}

/// `wxgate check deploy/sim.toml` said `api: unknown key` (issue 65): a
/// `wxgate sim` file given as wxgate's config says what it is and the
/// command that reads it, at check and at start-up alike; a wxgate config
/// with one stray `[[api]]` still gets the unknown key.
#[test]
fn a_sim_file_given_as_the_config_says_it_is_one_and_how_to_run_it() {
    let (code, stdout, stderr) = wxgate(&["check", "--config", "deploy/sim.toml"]);
    assert_eq!((code, stdout.as_str()), (2, ""), "{stderr}");
    assert_eq!(
        stderr,
        "wxgate: invalid config: deploy/sim.toml: this is a `wxgate sim` file (the simulated WeChat's [sim] and \
         [[api]]), not wxgate's config: run `wxgate sim --config deploy/sim.toml`\n"
    );
    let (code, _, serve_err) = wxgate(&["--config", "deploy/sim.toml"]);
    assert_eq!((code, serve_err), (2, stderr));
    let stray = "[server]\nlisten = \"127.0.0.1:0\"\n\n[[api]]\npath = \"/cgi-bin/token\"\n";
    let (code, _, stderr) = check_text("stray-api", stray, &[]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("DIR/rules.toml:4: api: unknown key"), "{stderr}");
}

/// The keys of a table as wxgate reads it: serde's own list of the table's
/// fields (the one place they are written: the `Raw*` structs), from the
/// unknown-key error of a config that gives the table a key it lacks.
fn keys_of(header: &str) -> BTreeSet<String> {
    let text = format!("{header}\nzz_not_a_key = 1\n");
    let e = match wxgate::config::Config::parse(&text, std::path::Path::new("rules.toml")) {
        Ok(_) => panic!("{header}: a key it lacks was accepted"),
        Err(e) => e.to_string(),
    };
    let listed = e.split_once("expected ").map_or("", |(_, l)| l);
    let keys: BTreeSet<String> = listed.split('`').skip(1).step_by(2).map(str::to_owned).collect();
    assert!(!keys.is_empty(), "{header}: no key list in {e:?}");
    keys
}

/// The keys a section of docs/configuration.md names in its tables' first
/// column (`` `a` / `b` ``, `` `a` or `b` ``, `` `until = "..."` ``).
fn keys_documented(doc: &str, section: &str) -> BTreeSet<String> {
    let heading = format!("## `{section}`");
    let start = doc.find(&format!("{heading}\n")).unwrap_or_else(|| panic!("no heading {heading}"));
    let body = &doc[start + heading.len()..];
    let body = &body[..body.find("\n## ").unwrap_or(body.len())];
    body.lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .flat_map(|l| {
            let cell = format!("`{}", l.split(" |").next().unwrap_or_default());
            let names: Vec<String> = cell
                .split('`')
                .skip(1)
                .step_by(2)
                .filter_map(|span| span.split([' ', '=']).next().map(str::to_owned))
                .collect();
            names
        })
        .collect()
}

/// README: "every key, with its default: docs/configuration.md". Each
/// table's every key (as serde reads it, so a key added to a `Raw*`
/// struct fails here until it is documented) is in its section there;
/// `[queue]` was missing (issue 65). `[[caller]]` is documented in
/// docs/callers.md.
#[test]
fn docs_configuration_names_every_key_of_every_table() {
    let doc = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/configuration.md"))
        .expect("docs/configuration.md");
    let tables = [
        "[server]",
        "[store]",
        "[tokens]",
        "[[account]]",
        "[directory]",
        "[log]",
        "[telemetry]",
        "[intercept]",
        "[[penalty]]",
        "[[rule]]",
        "[[quota]]",
        "[[domain]]",
        "[queue]",
    ];
    let mut missing = Vec::new();
    for table in tables {
        let documented = keys_documented(&doc, table);
        for key in keys_of(table) {
            if !documented.contains(&key) {
                missing.push(format!("{table} {key}"));
            }
        }
    }
    assert!(missing.is_empty(), "docs/configuration.md lacks: {missing:?}");
}
