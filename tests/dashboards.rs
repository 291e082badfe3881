//! The Grafana dashboard (`deploy/grafana/wxgate.json`) and the Prometheus
//! alerts (`deploy/prometheus/wxgate-alerts.yml`) query only what wxgate
//! exposes: a live wxgate is driven through calls forwarded, refused and
//! answered 45009 by WeChat, and a refused reload; every metric name and
//! label their PromQL uses must then be in its `/metrics`. `promtool` checks
//! the alert rules, runs their unit tests, and parses every dashboard query.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;
use support::deploy::{entries, promtool, read, run_promtool, text, yaml, Yaml};
use support::tokens::{account_toml, WeChatTokens, APPID, CORPID, CORPSECRET, SECRET};
use support::*;

const DASHBOARD: &str = "deploy/grafana/wxgate.json";
const ALERTS: &str = "deploy/prometheus/wxgate-alerts.yml";
const ALERT_TESTS: &str = "deploy/prometheus/wxgate-alerts.test.yml";

/// Labels Prometheus adds to every series it scrapes.
const TARGET_LABELS: [&str; 2] = ["instance", "job"];

/// Metrics wxgate exposes that the dashboard leaves out, with the reason.
const NOT_ON_DASHBOARD: &[(&str, &str)] = &[];

/// One vector selector of a PromQL expression: `name{label op "value", ...}`.
#[derive(Debug)]
struct Selector {
    name: String,
    matchers: Vec<(String, String, String)>,
}

/// The vector selectors of a PromQL expression: every identifier that is a
/// metric name (starts with `wxgate_`, or is Prometheus's own `up`) with its
/// label matchers. Any other identifier directly followed by `{` is a
/// metric too, and returned, so that nothing unknown goes unchecked.
fn selectors(expr: &str) -> Vec<Selector> {
    let b = expr.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'"' || c == b'\'' || c == b'`' {
            i = skip_string(b, i);
            continue;
        }
        if c == b'{' {
            // Label matchers of a selector without a leading name would be
            // `{__name__=...}`: not used here.
            panic!("a selector without a metric name in: {expr}");
        }
        if !(c.is_ascii_alphabetic() || c == b'_' || c == b':') {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b':') {
            i += 1;
        }
        let name = &expr[start..i];
        // Inside `by (...)`, `on (...)`, ... are label names; after `[` a duration.
        let before = expr[..start].trim_end();
        if before.ends_with('[') || in_label_list(&expr[..start]) {
            continue;
        }
        let mut j = i;
        while j < b.len() && b[j] == b' ' {
            j += 1;
        }
        let braced = b.get(j) == Some(&b'{');
        if !(name.starts_with("wxgate_") || name == "up" || braced) {
            continue;
        }
        let mut matchers = Vec::new();
        if braced {
            let close = closing_brace(b, j).unwrap_or_else(|| panic!("unclosed {{ in {expr}"));
            matchers = parse_matchers(&expr[j + 1..close]);
            i = close + 1;
        }
        out.push(Selector { name: name.to_owned(), matchers });
    }
    out
}

/// Whether the text ends inside `by (`, `without (`, `on (`, `ignoring (`,
/// `group_left (` or `group_right (` (a list of label names).
fn in_label_list(before: &str) -> bool {
    let Some(open) = before.rfind('(') else { return false };
    if before[open..].contains(')') {
        return false;
    }
    let head = before[..open].trim_end();
    ["by", "without", "on", "ignoring", "group_left", "group_right"].iter().any(|k| head.ends_with(k))
}

/// The `}` that closes the `{` at `open`, past quoted values.
fn closing_brace(b: &[u8], open: usize) -> Option<usize> {
    let mut i = open + 1;
    while i < b.len() {
        match b[i] {
            b'"' | b'\'' | b'`' => i = skip_string(b, i),
            b'}' => return Some(i),
            _ => i += 1,
        }
    }
    None
}

fn skip_string(b: &[u8], at: usize) -> usize {
    let quote = b[at];
    let mut i = at + 1;
    while i < b.len() && b[i] != quote {
        i += if b[i] == b'\\' { 2 } else { 1 };
    }
    i + 1
}

/// `label="v", label=~"a|b"` → (label, op, value).
fn parse_matchers(inside: &str) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let mut rest = inside.trim();
    while !rest.is_empty() {
        let name_end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(rest.len());
        let label = rest[..name_end].to_owned();
        rest = rest[name_end..].trim_start();
        let op = ["=~", "!~", "!=", "="].iter().find(|op| rest.starts_with(**op)).expect("a matcher operator");
        rest = rest[op.len()..].trim_start();
        let quote = rest.chars().next().expect("a quoted value");
        let end = rest[1..].find(quote).expect("closing quote") + 1;
        out.push((label, (*op).to_owned(), rest[1..end].to_owned()));
        rest = rest[end + 1..].trim_start().trim_start_matches(',').trim_start();
    }
    out
}

/// An OpenMetrics exposition: every sample (name and labels), and the names
/// each family's type gives its samples even while it has none (a counter
/// `x` is `x_total`, a histogram `x_bucket`, `x_sum`, `x_count`, an info `x_info`).
struct Exposition {
    samples: Vec<(String, BTreeMap<String, String>)>,
    names: BTreeSet<String>,
}

fn exposition(text: &str) -> Exposition {
    let mut samples = Vec::new();
    let mut names = BTreeSet::new();
    for line in text.lines() {
        if let Some(typed) = line.strip_prefix("# TYPE ") {
            let (family, kind) = typed.split_once(' ').expect("# TYPE name type");
            let suffixes: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_sum", "_count"],
                "info" => &["_info"],
                "gauge" | "unknown" => &[""],
                other => panic!("a metric type this test does not know: {other}"),
            };
            names.extend(suffixes.iter().map(|s| format!("{family}{s}")));
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let name_end = line.find(['{', ' ']).expect("a sample line");
        let name = line[..name_end].to_owned();
        let mut labels = BTreeMap::new();
        if line[name_end..].starts_with('{') {
            let close = line.rfind('}').expect("closing brace");
            for (label, _, value) in parse_matchers(&line[name_end + 1..close]) {
                labels.insert(label, value);
            }
        }
        names.insert(name.clone());
        samples.push((name, labels));
    }
    Exposition { samples, names }
}

/// Every PromQL query of the dashboard, with where it is: panel targets and
/// the template variables' `label_values(...)` queries.
fn dashboard_queries() -> Vec<(String, String)> {
    let dashboard: Value = serde_json::from_str(&read(DASHBOARD)).expect("the dashboard is JSON");
    let mut out = Vec::new();
    fn walk(v: &Value, title: &str, out: &mut Vec<(String, String)>) {
        match v {
            Value::Object(map) => {
                let title = map.get("title").and_then(Value::as_str).unwrap_or(title);
                if let Some(expr) = map.get("expr").and_then(Value::as_str) {
                    out.push((format!("panel \"{title}\""), expr.to_owned()));
                }
                for child in map.values() {
                    walk(child, title, out);
                }
            }
            Value::Array(items) => items.iter().for_each(|i| walk(i, title, out)),
            _ => {}
        }
    }
    walk(&dashboard["panels"], "", &mut out);
    for var in dashboard["templating"]["list"].as_array().expect("templating") {
        if let Some(query) = var["query"]["query"].as_str() {
            let inner = query.strip_prefix("label_values(").and_then(|q| q.strip_suffix(')')).expect("label_values");
            let (series, _label) = inner.rsplit_once(',').expect("label_values(series, label)");
            out.push((format!("variable {}", var["name"]), series.trim().to_owned()));
        }
    }
    out
}

/// The alert rules: (name, expr, labels, annotations).
struct Alert {
    name: String,
    expr: String,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
}

fn alerts() -> Vec<Alert> {
    let docs = yaml(ALERTS);
    let mut out = Vec::new();
    for group in docs[0]["groups"].as_vec().expect("groups") {
        for rule in group["rules"].as_vec().expect("rules") {
            let map = |y: &Yaml| -> BTreeMap<String, String> {
                entries(y, "labels").into_iter().map(|(k, v)| (k.to_owned(), text(v, k).to_owned())).collect()
            };
            out.push(Alert {
                name: text(&rule["alert"], "alert").to_owned(),
                expr: text(&rule["expr"], "expr").to_owned(),
                labels: map(&rule["labels"]),
                annotations: map(&rule["annotations"]),
            });
        }
    }
    out
}

/// A live wxgate after a call that reached no upstream (refunded), calls
/// forwarded (failing over from a closed first upstream), held for their
/// slot, refused by a limit, answered 45009 by WeChat (and then refused by
/// the penalty) and token errors, WeCom messages counted by recipient and
/// one refused for a recipient, a message queued and sent and one refused
/// by the queue, and a refused reload: its `/metrics`. A rule's
/// histograms, its refunds and recipients, the errcodes the alerts do not
/// count and a queue's series appear with their first event, so each is here.
async fn live_metrics() -> String {
    let dir = TempDir::new("dashboards");
    // [intercept] on: its series exist from the start.
    let ca = support::intercept::TestCa::new();
    // A closed first upstream: calls fail over to the second, WeChat, which
    // opens only after the first call (that one reaches neither).
    let (closed, wechat) = (ports::ClosedPort::new(), ports::ClosedPort::new());
    let recipients = "[[rule]]\nname = \"message\"\nmatch = [\"/cgi-bin/message/send\"]\nlimits = [{ count = 100, per = \"day\" }]\n\
                      cost = \"recipients\"\nrecipients = { field = \"touser\", separator = \"|\", all = \"@all\", directory = true }\n\
                      per_recipient = [{ count = 1, per = \"1m\", burst = 1 }]\n";
    let config = ConfigToml::upstreams(&[&closed.url(), &wechat.url()])
        .with(rule("send").matching("/cgi-bin/message/template/send").limit_burst(2, "1m", 2))
        .with(rule("shaped").matching("/cgi-bin/menu/create").limit_burst(1, "1m", 1).max_wait("2m"))
        .with(recipients)
        .with(
            rule("queued")
                .matching("/cgi-bin/message/subscribe/send")
                .limit(100, "day")
                .limit(60, "1m")
                .set("queue", true),
        )
        .with(rule("default"))
        .with(ca.section(&wechat.url()))
        .with(account_toml(&dir, APPID, "official_account", SECRET, ""))
        .with(account_toml(&dir, CORPID, "wecom", CORPSECRET, "agent = \"1\""))
        .with(format!("[queue]\nfile = \"{}\"\n", dir.path().join("queue.db").display()))
        .to_string();
    let path = dir.write("rules.toml", &config);
    let gate = Gate::start_file(&path).await;
    let send = "/cgi-bin/message/template/send?access_token=T";
    assert_eq!(gate.get_as("wx1", send).await.status, 502, "no upstream answers: refunded");
    let mock = wechat.open();
    let tokens = WeChatTokens::new().responder();
    mock.respond(move |call| {
        let p = &call.path_and_query;
        if p.starts_with("/cgi-bin/token") || p.starts_with("/cgi-bin/stable_token") || p.starts_with("/cgi-bin/gettoken") {
            return tokens(call);
        }
        // WeCom's directory (an app seeing one member), and its partial success.
        if p.starts_with("/cgi-bin/agent/get") {
            let range = r#"{"errcode":0,"allow_userinfos":{"user":[{"userid":"c"}]},"allow_partys":{"partyid":[]},"allow_tags":{"tagid":[]}}"#;
            return Reply::Json { body: range.into(), content_type: "application/json" };
        }
        if p.starts_with("/cgi-bin/message/send") {
            let partial = r#"{"errcode":0,"errmsg":"ok","invaliduser":"zz"}"#;
            return Reply::Json { body: partial.into(), content_type: "application/json" };
        }
        match ["40001", "40014", "42001"].iter().find(|c| p.ends_with(&format!("errcode={c}"))) {
            Some(code) => errcode_reply(code.parse().expect("a number")),
            None if p.starts_with("/cgi-bin/user/info") => errcode_reply(45009),
            None => ok_reply(),
        }
    });
    assert_eq!(gate.get_as("wx1", send).await.status, 200);
    assert_eq!(gate.get_as("wx1", send).await.status, 200);
    assert_eq!(gate.get_as("wx1", send).await.status, 429, "the third call in a minute is refused");
    for code in ["40001", "40014", "42001"] {
        let token_error = gate.get_as("wx2", &format!("/cgi-bin/menu/get?access_token=T&errcode={code}")).await;
        assert_eq!(token_error.status, 200, "WeChat's {code}, passed on");
    }
    assert_eq!(gate.get_as("wx1", "/cgi-bin/user/info").await.status, 429, "WeChat's 45009");
    assert_eq!(gate.get_as("wx1", "/cgi-bin/user/info").await.status, 429, "the penalty");
    let shaped = "/cgi-bin/menu/create?access_token=T";
    assert_eq!(gate.get_as("wx1", shaped).await.status, 200);
    let (held, ()) = tokio::join!(gate.get_as("wx1", shaped), async {
        eventually("the second call is held", PATIENCE, || gate.held("wx1", "shaped") == 1).await;
        gate.advance(std::time::Duration::from_secs(60));
    });
    assert_eq!(held.status, 200, "sent once its slot came");
    let message = |to: &str| format!(r#"{{"touser":"{to}","msgtype":"text","agentid":1,"text":{{"content":"hi"}}}}"#);
    let to = "/cgi-bin/message/send?access_token=T";
    assert_eq!(gate.post_as("wx1", to, &message("a|b")).await.status, 200);
    assert_eq!(gate.post_as("wx1", to, &message("a")).await.status, 429, "a's second message in a minute");
    // A broadcast counted from WeCom's directory, and one it cannot count
    // (no [[account]] holds that app).
    let all = gate.post_as(CORPID, "/cgi-bin/message/send", &message("@all")).await;
    assert_eq!(all.status, 200, "{}", all.text());
    assert_eq!(gate.post_as("wx1", to, &message("@all")).await.status, 400);
    // A queued message, sent; one refused (a malformed deadline); the
    // queue's gauges from the next summary of the jobs (every 15 s: the
    // minute above passed).
    let queued = format!("/@{APPID}/cgi-bin/message/subscribe/send");
    let asked = ("prefer", "respond-async");
    assert_eq!(gate.post_with(&queued, r#"{"touser":"o1"}"#, &[asked]).await.status, 202);
    let bad = gate.post_with(&queued, "{}", &[asked, ("x-wxgate-deadline", "soon")]).await;
    assert_eq!(bad.status, 400, "{}", bad.text());
    let sent = r#"wxgate_queue_ended_total{rule="queued",caller="other",state="sent"}"#;
    eventually_async("the queued message sent", PATIENCE, async || gate.metric(sent).await == Some(1.0)).await;
    gate.advance(std::time::Duration::from_secs(15));
    let depth = r#"wxgate_queue_jobs{rule="queued",caller="other",state="queued"}"#;
    eventually_async("the queue's gauges", PATIENCE, async || gate.metric(depth).await.is_some()).await;
    dir.write("rules.toml", "[[rule]]\nname = \"broken\"\nlimits = [{ count = 0, per = \"day\" }\n");
    eventually("the refused reload", PATIENCE, || gate.reloads().1 >= 1).await;
    let metrics = get_at(gate.admin_addr(), "/metrics").await;
    assert_eq!(metrics.status, 200);
    metrics.text()
}

/// What is wrong with `selector` (used by `place`) against the live exposition.
fn problems(place: &str, s: &Selector, live: &Exposition, out: &mut Vec<String>) {
    if s.name == "up" {
        return; // Prometheus's own, per scrape target.
    }
    if !s.name.starts_with("wxgate_") {
        out.push(format!("{place}: {} is not a wxgate metric", s.name));
        return;
    }
    if !live.names.contains(&s.name) {
        out.push(format!("{place}: wxgate exposes no {}", s.name));
        return;
    }
    let samples: Vec<&BTreeMap<String, String>> =
        live.samples.iter().filter(|(n, _)| *n == s.name).map(|(_, l)| l).collect();
    for (label, op, value) in &s.matchers {
        if TARGET_LABELS.contains(&label.as_str()) {
            continue;
        }
        if samples.is_empty() {
            out.push(format!("{place}: {} has no samples to check {label}{op}\"{value}\" against", s.name));
            continue;
        }
        let values: BTreeSet<&str> = samples.iter().filter_map(|l| l.get(label).map(String::as_str)).collect();
        if values.is_empty() {
            out.push(format!("{place}: {} has no label {label}", s.name));
            continue;
        }
        if value.contains('$') || op.starts_with('!') {
            continue; // a dashboard variable, or a value it excludes
        }
        let wanted: Vec<&str> = match op.as_str() {
            "=" => vec![value.as_str()],
            _ if value.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '|') => value.split('|').collect(),
            _ => continue, // a real regex: its label was checked
        };
        for w in wanted {
            if !values.contains(w) {
                out.push(format!("{place}: {} never has {label}=\"{w}\" (it has {values:?})", s.name));
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_and_the_alerts_use_only_what_wxgate_exposes() {
    let live = exposition(&live_metrics().await);
    let mut wrong = Vec::new();
    let mut used = BTreeSet::new();
    let queries = dashboard_queries();
    assert!(queries.len() >= 20, "the dashboard has its queries: {}", queries.len());
    for (place, expr) in &queries {
        let found = selectors(expr);
        if found.is_empty() {
            wrong.push(format!("{place}: no metric in {expr}"));
        }
        for s in found {
            problems(place, &s, &live, &mut wrong);
            used.insert(s.name);
        }
    }
    for alert in alerts() {
        for s in selectors(&alert.expr) {
            problems(&format!("alert {}", alert.name), &s, &live, &mut wrong);
        }
    }
    assert!(wrong.is_empty(), "queries that would show nothing:\n{}", wrong.join("\n"));

    // Every metric family is on the dashboard (histograms by their buckets).
    let families: BTreeSet<String> =
        live.names.iter().filter(|n| !n.ends_with("_sum") && !n.ends_with("_count")).map(|n| n.to_owned()).collect();
    let missing: Vec<&String> =
        families.iter().filter(|f| !used.contains(*f) && !NOT_ON_DASHBOARD.iter().any(|(n, _)| n == f)).collect();
    assert!(
        missing.is_empty(),
        "metrics not on the dashboard (add a panel, or list them in NOT_ON_DASHBOARD): {missing:?}"
    );
}

#[test]
fn wechats_45009_is_the_dashboards_first_panel() {
    let dashboard: Value = serde_json::from_str(&read(DASHBOARD)).expect("JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    let first = panels
        .iter()
        .filter(|p| p["type"] != "row")
        .min_by_key(|p| (p["gridPos"]["y"].as_i64(), p["gridPos"]["x"].as_i64()))
        .expect("a panel");
    let expr = first["targets"][0]["expr"].as_str().expect("expr");
    assert!(expr.contains("wxgate_upstream_errcodes_total") && expr.contains("45009"), "{expr}");
    // Panel ids are unique (Grafana links and edits panels by id).
    let mut ids = BTreeSet::new();
    for p in panels {
        assert!(ids.insert(p["id"].as_i64().expect("id")), "panel id {} twice", p["id"]);
    }
}

#[test]
fn every_alert_has_a_severity_a_summary_and_a_runbook_and_covers_the_readme() {
    let alerts = alerts();
    for a in &alerts {
        let severity = a.labels.get("severity").map(String::as_str);
        assert!(matches!(severity, Some("critical" | "warning" | "info")), "{}: severity {severity:?}", a.name);
        for key in ["summary", "description", "runbook"] {
            assert!(a.annotations.get(key).is_some_and(|t| t.len() > 20), "{}: {key}", a.name);
        }
    }
    // Each metric the README says to alert on has an alert.
    let readme = read("README.md");
    let start = readme.find("### What to alert on").expect("the README's alert list");
    let section = &readme[start..];
    let section = &section[..section[4..].find("\n#").map_or(section.len(), |e| e + 4)];
    let alerted: BTreeSet<String> = alerts.iter().flat_map(|a| selectors(&a.expr)).map(|s| s.name).collect();
    let mut named = 0;
    for word in section.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
        if word.starts_with("wxgate_") {
            named += 1;
            assert!(alerted.contains(word), "the README says to alert on {word}; {ALERTS} has no alert on it");
        }
    }
    assert!(named >= 5, "the README's alert list was read ({named} metrics)");
}

#[test]
fn promtool_checks_the_alerts_runs_their_unit_tests_and_parses_the_dashboard() {
    let Some(promtool) = promtool() else { return };
    let (ok, said) = run_promtool(&promtool, &["check", "rules", ALERTS]);
    assert!(ok, "promtool check rules {ALERTS}:\n{said}");
    let (ok, said) = run_promtool(&promtool, &["test", "rules", ALERT_TESTS]);
    assert!(ok, "promtool test rules {ALERT_TESTS}:\n{said}");

    // Every dashboard query, with Grafana's variables filled in, as a
    // recording rule: `check rules` parses each as PromQL.
    let dir = TempDir::new("dashboard-promql");
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (n, (_, expr)) in dashboard_queries().iter().enumerate() {
        let expr = expr
            .replace("$__rate_interval", "5m")
            .replace("$__range", "1h")
            .replace("$instance", ".*")
            .replace("$rule", ".*");
        let quoted = serde_json::to_string(&expr).expect("JSON string"); // a valid YAML string
        rules.push_str(&format!("      - record: dashboard:query_{n}\n        expr: {quoted}\n"));
    }
    let path = dir.write("dashboard-rules.yml", &rules);
    let (ok, said) = run_promtool(&promtool, &["check", "rules", path.to_str().expect("utf-8")]);
    assert!(ok, "the dashboard's queries, as PromQL:\n{said}\n{rules}");
}

#[test]
fn the_promql_reader_finds_names_and_matchers_and_skips_labels_and_strings() {
    let found = selectors(
        r#"sum by (rule, outcome) (rate(wxgate_calls_total{rule=~"$rule",outcome="throttled"}[5m])) / on (rule) group_left wxgate_held + up"#,
    );
    let names: Vec<&str> = found.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["wxgate_calls_total", "wxgate_held", "up"]);
    assert_eq!(
        found[0].matchers,
        [("rule".into(), "=~".into(), "$rule".into()), ("outcome".into(), "=".into(), "throttled".into())]
    );
    let found =
        selectors(r#"histogram_quantile(0.99, sum by (le) (rate(wxgate_decision_seconds_bucket{a="x{y}"}[1m])))"#);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].name, "wxgate_decision_seconds_bucket");
    let live = exposition("# TYPE wxgate_calls counter\n# TYPE wxgate_decision_seconds histogram\nwxgate_held 0\n");
    for n in ["wxgate_calls_total", "wxgate_decision_seconds_bucket", "wxgate_decision_seconds_count", "wxgate_held"] {
        assert!(live.names.contains(n), "{n}");
    }
    assert!(!live.names.contains("wxgate_calls"), "a counter's samples are named _total");
}
