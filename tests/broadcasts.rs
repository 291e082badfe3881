//! WeCom broadcasts (issue 64): `@all`, `toparty` and `totag` resolved
//! through WeCom's own directory with the app's token, and charged in
//! person-times and per-member windows, with the shipped
//! `deploy/rules-wecom.toml`, over real sockets against a mock WeCom whose
//! directory has 500 members in nested departments and tags
//! ([`support::wecom`]), and which drops silently, as WeCom does, a
//! message past 30 a minute for one member.

use crate::support;

use std::collections::HashSet;
use std::time::Duration;

use serde_json::json;
use support::backing::Backing;
use support::redis_server::RedisServer;
use support::wecom::{MockWeCom, WeComDirectory, AGENT_ALL, AGENT_PART, SECRET_ALL, SECRET_PART};
use support::wecom::{AGENT_GET, CORPID, MESSAGE_SEND, TAG_GET, USER_SIMPLELIST};
use support::{eventually_async, ConfigToml, Gate, StoreToml, TempDir};

const SEND: &str = "/cgi-bin/message/send";
const PERSON_TIMES: &str = "wxgate_recipients_total{rule=\"message_send\"}";

/// The shipped WeCom rules without their `[server]` and `[store]` (the
/// test's own come first), `edit` applied to the text.
fn shipped(edit: impl Fn(String) -> String) -> String {
    let text = std::fs::read_to_string("deploy/rules-wecom.toml").expect("shipped rules");
    let mut out = String::new();
    let mut skipping = false;
    for line in text.lines() {
        if line.starts_with('[') {
            skipping = line == "[server]" || line == "[store]";
        }
        if !skipping {
            out.push_str(line);
            out.push('\n');
        }
    }
    edit(out)
}

/// The two apps of [`CORPID`] as `[[account]]`s: "hr" (sees everyone) and
/// "oa" (sees 150), their secrets in `dir`.
fn apps(dir: &TempDir) -> String {
    let mut out = String::new();
    for (name, agent, secret) in [("hr", AGENT_ALL, SECRET_ALL), ("oa", AGENT_PART, SECRET_PART)] {
        let file = dir.write_secret(&format!("{name}.secret"), &format!("{secret}\n"));
        out.push_str(&format!(
            "[[account]]\nname = \"{name}\"\nid = \"{CORPID}\"\nkind = \"wecom\"\nagent = \"{agent}\"\nsecret_file = \"{}\"\n\n",
            file.display()
        ));
    }
    out
}

/// A gate with the shipped WeCom rules (edited by `edit`), both apps, and
/// `extra`, on `backing`, deciding on its manual clock, which the mock follows.
async fn start(
    backing: &Backing,
    mock: &MockWeCom,
    dir: &TempDir,
    edit: impl Fn(String) -> String,
    extra: &str,
) -> Gate {
    let mut config =
        ConfigToml::new(&mock.url()).server("domain", "qyapi.weixin.qq.com").with(shipped(edit)).with(apps(dir));
    if backing.store().is_some() {
        let key = dir.write_secret("token.key", "5f0c9a3e7b2d4f6a8c1e3b5d7f9a0c2e4b6d8f1a3c5e7b9d0f2a4c6e8b1d3f5a\n");
        config = config.with(format!("[tokens]\nkey_file = \"{}\"\n", key.display()));
    }
    let gate = backing.gate_on_manual_clock(config.with(extra.to_owned())).await;
    mock.follow(&gate.clock);
    gate
}

/// A text message of `agent` with these recipient fields.
fn message(agent: i64, to: serde_json::Value) -> String {
    let mut body = json!({"msgtype": "text", "agentid": agent, "text": {"content": "all hands at 10"}});
    if let (Some(b), Some(to)) = (body.as_object_mut(), to.as_object()) {
        b.extend(to.clone());
    }
    body.to_string()
}

async fn person_times(gate: &Gate) -> f64 {
    gate.metric(PERSON_TIMES).await.unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_all_departments_and_tags_are_charged_their_distinct_members() {
    for backing in Backing::all() {
        let store = backing.name();
        let mock = MockWeCom::start(WeComDirectory::nested()).await;
        let dir = TempDir::new("broadcast-charged");
        let gate = start(&backing, &mock, &dir, |t| t, "").await;
        let d = mock.directory();
        let mut charged = 0.0;
        let mut expect = |label: &str, answer: support::Answer, members: usize, charged_now: f64| {
            assert_eq!(answer.status, 200, "{store} {label}: {}", answer.text());
            assert_eq!(answer.json()["errcode"], 0, "{store} {label}: {}", answer.text());
            charged += members as f64;
            assert_eq!(charged_now, charged, "{store} {label}: charged {members} person-times");
        };
        let a = gate.post_as("hr", SEND, &message(AGENT_ALL, json!({"touser": "@all"}))).await;
        expect("@all", a, WeComDirectory::VISIBLE_ALL, person_times(&gate).await);
        let a = gate.post_as("hr", SEND, &message(AGENT_ALL, json!({"toparty": "2"}))).await;
        expect(
            "toparty 2 (30 of its 120 in department 3)",
            a,
            WeComDirectory::PARTY_MEMBERS,
            person_times(&gate).await,
        );
        let a = gate.post_as("hr", SEND, &message(AGENT_ALL, json!({"totag": "5"}))).await;
        expect("a tag of users and a department", a, WeComDirectory::TAG_MEMBERS, person_times(&gate).await);
        // touser with a department: each member once.
        let mut both: HashSet<String> = d.party(WeComDirectory::SUB_PARTY, true).into_iter().collect();
        let named = ["user001", d.party(WeComDirectory::SUB_PARTY, true)[0].as_str()].join("|");
        both.insert("user001".into());
        let a = gate.post_as("hr", SEND, &message(AGENT_ALL, json!({"touser": named, "toparty": "3"}))).await;
        expect("touser and toparty overlapping", a, both.len(), person_times(&gate).await);
        // WeCom reached exactly whom wxgate charged, and dropped nobody.
        assert_eq!(mock.person_times(AGENT_ALL) as f64, charged, "{store}");
        assert_eq!(mock.silent_drops(), 0, "{store}");
        // Each unit fetched once (the app's range: the root department).
        assert_eq!(mock.calls_to(AGENT_GET), 1, "{store}");
        assert_eq!(mock.calls_to(TAG_GET), 1, "{store}");
        assert_eq!(mock.calls_to(USER_SIMPLELIST), 3, "{store}: departments 1, 2 and 3 (5's is inside its tag's 3)");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_one_broadcasts_in_a_minute_never_give_a_member_more_than_thirty() {
    // `unseen_cost` (the old escape hatch) charges the app's whole range
    // but holds no member's window: WeCom drops the excess silently.
    let priced = |t: String| t.replace("directory = true", "unseen_cost = 150");
    for (how, edit, drops) in [
        ("directory", Box::new(|t| t) as Box<dyn Fn(String) -> String>, false),
        ("unseen_cost", Box::new(priced), true),
    ] {
        let mock = MockWeCom::start(WeComDirectory::nested()).await;
        let dir = TempDir::new("broadcast-minute");
        // 30 a minute with a burst of 30: the 31st within the minute is the one over.
        let edit = move |t: String| {
            edit(t).replace("{ count = 30, per = \"1m\", burst = 10 }", "{ count = 30, per = \"1m\", burst = 30 }")
        };
        let gate = start(&Backing::Memory, &mock, &dir, edit, "").await;
        let mut statuses = Vec::new();
        for i in 0..31 {
            let a = gate.post_as("oa", SEND, &message(AGENT_PART, json!({"touser": "@all"}))).await;
            if a.status == 429 {
                assert_eq!(a.header("x-wxgate-reason"), Some("recipient"), "{how} {i}: {}", a.text());
            }
            statuses.push(a.status);
            gate.advance(Duration::from_millis(1_900));
        }
        if drops {
            assert!(statuses.iter().all(|s| *s == 200), "{how}: {statuses:?}");
            assert!(mock.silent_drops() > 0, "{how}: WeCom dropped the 31st for every member");
        } else {
            assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 30, "{how}: {statuses:?}");
            assert_eq!(statuses[30], 429, "{how}: the 31st is refused");
            assert_eq!(mock.silent_drops(), 0, "{how}");
            assert_eq!(mock.max_per_minute(AGENT_PART), 30, "{how}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_added_to_the_directory_is_counted_within_its_ttl() {
    let mock = MockWeCom::start(WeComDirectory::nested()).await;
    let dir = TempDir::new("broadcast-ttl");
    let gate = start(&Backing::Memory, &mock, &dir, |t| t, "[directory]\nttl = \"1m\"\n").await;
    let all = message(AGENT_PART, json!({"touser": "@all"}));
    let visible = WeComDirectory::VISIBLE_PART as f64;
    assert_eq!(gate.post_as("oa", SEND, &all).await.status, 200);
    assert_eq!(person_times(&gate).await, visible);
    mock.add_member("newcomer", WeComDirectory::PARTY);
    // Within the TTL, the copy held: the newcomer is not known yet.
    gate.advance(Duration::from_secs(20));
    assert_eq!(gate.post_as("oa", SEND, &all).await.status, 200);
    assert_eq!(person_times(&gate).await, 2.0 * visible);
    // Past three quarters of it, a use refreshes it in the background: the
    // call goes on with the copy; the next one counts the newcomer.
    gate.advance(Duration::from_secs(30));
    let fetched = "wxgate_directory_fetches_total{api=\"user_simplelist\",outcome=\"ok\"}";
    assert_eq!(gate.metric(fetched).await, Some(2.0), "departments 2 and 3");
    assert_eq!(gate.post_as("oa", SEND, &all).await.status, 200);
    assert_eq!(person_times(&gate).await, 3.0 * visible);
    // Counted once the fresh copy is held.
    eventually_async("the background refresh", support::PATIENCE, async || gate.metric(fetched).await == Some(4.0))
        .await;
    assert_eq!(gate.post_as("oa", SEND, &all).await.status, 200);
    assert_eq!(person_times(&gate).await, 4.0 * visible + 1.0, "the newcomer counted");
    // WeCom reached the newcomer from the moment it was added: within the
    // TTL, those two messages were not counted in its windows (at most one
    // TTL's worth, docs/recipients.md).
    assert_eq!(mock.person_times(AGENT_PART) as f64, 4.0 * visible + 3.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_that_cannot_answer_refuses_naming_why_or_charges_unseen_cost() {
    let mock = MockWeCom::start(WeComDirectory::nested()).await;
    let dir = TempDir::new("broadcast-unanswered");
    let gate = start(&Backing::Memory, &mock, &dir, |t| t, "").await;
    let unresolved =
        |cause: &str| format!("wxgate_directory_unresolved_total{{rule=\"message_send\",cause=\"{cause}\"}}");
    // WeCom down: 503 saying so, nothing sent.
    mock.set_directory_down(true);
    let a = gate.post_as("oa", SEND, &message(AGENT_PART, json!({"toparty": "2"}))).await;
    assert_eq!(a.status, 503, "{}", a.text());
    assert!(a.text().contains("could not be counted") && a.text().contains("HTTP 502"), "{}", a.text());
    assert!(a.header("retry-after").is_some());
    assert_eq!(gate.metric(&unresolved("unavailable")).await, Some(1.0));
    // The app not allowed to read it: 400 naming WeCom's errcode.
    mock.set_directory_down(false);
    mock.deny_directory(AGENT_PART);
    let a = gate.post_as("oa", SEND, &message(AGENT_PART, json!({"touser": "@all"}))).await;
    assert_eq!(a.status, 400, "{}", a.text());
    assert!(a.text().contains("60011") && a.text().contains("\\\"oa\\\""), "{}", a.text());
    assert_eq!(gate.metric(&unresolved("denied")).await, Some(1.0));
    // No [[account]] holds the app's secret (a call with a token of its own
    // for another app): 400 naming what is missing.
    let token = mock.issue_token(1_000_009);
    let a = gate
        .post_as(CORPID, &format!("{SEND}?access_token={token}"), &message(1_000_009, json!({"touser": "@all"})))
        .await;
    assert_eq!(a.status, 400, "{}", a.text());
    assert!(a.text().contains("no [[account]]") && a.text().contains("1000009"), "{}", a.text());
    assert!(!a.text().contains(&token), "the token is never in an answer");
    assert_eq!(gate.metric(&unresolved("no_account")).await, Some(1.0));
    assert_eq!(mock.calls_to(MESSAGE_SEND), 0, "nothing was sent uncounted");
    assert_eq!(person_times(&gate).await, 0.0);

    // With unseen_cost, the directory down charges that instead.
    let mock = MockWeCom::start(WeComDirectory::nested()).await;
    let dir = TempDir::new("broadcast-unanswered-priced");
    let priced = |t: String| t.replace("directory = true", "directory = true, unseen_cost = 700");
    let gate = start(&Backing::Memory, &mock, &dir, priced, "").await;
    mock.set_directory_down(true);
    let a = gate.post_as("oa", SEND, &message(AGENT_PART, json!({"touser": "user491", "toparty": "2"}))).await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(person_times(&gate).await, 701.0);
    assert_eq!(gate.metric(&unresolved("unavailable")).await, Some(1.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_wecom_answers_invalid_are_counted_and_not_charged_again() {
    let mock = MockWeCom::start(WeComDirectory::nested()).await;
    let dir = TempDir::new("broadcast-invalid");
    let gate = start(&Backing::Memory, &mock, &dir, |t| t, "").await;
    let all = message(AGENT_ALL, json!({"touser": "@all"}));
    assert_eq!(gate.post_as("hr", SEND, &all).await.status, 200);
    assert_eq!(person_times(&gate).await, 500.0);
    // user002 leaves: the directory held still lists them; WeCom answers
    // them invalid when named.
    mock.remove_member("user002");
    let a = gate.post_as("hr", SEND, &message(AGENT_ALL, json!({"touser": "user002|ghost|user003"}))).await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.json()["invaliduser"], "user002|ghost", "WeCom's partial success reaches the caller: {}", a.text());
    let invalid = "wxgate_recipients_invalid_total{rule=\"message_send\",kind=\"user\"}";
    assert_eq!(gate.metric(invalid).await, Some(2.0));
    // The next @all does not charge them again.
    gate.advance(Duration::from_secs(3));
    assert_eq!(gate.post_as("hr", SEND, &all).await.status, 200);
    assert_eq!(person_times(&gate).await, 503.0 + 499.0);
    assert_eq!(mock.person_times(AGENT_ALL), 500 + 1 + 499);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_on_one_redis_fetch_a_unit_once_between_them() {
    let redis = RedisServer::start();
    let mock = MockWeCom::start(WeComDirectory::nested()).await;
    // The directory answers slowly: both instances ask while one fetches.
    let answer = mock.responder();
    mock.mock.respond(move |rec| {
        let r = answer(rec);
        if rec.path_and_query.starts_with(AGENT_GET) || rec.path_and_query.starts_with(USER_SIMPLELIST) {
            support::Reply::Delayed { ms: 300, then: Box::new(r) }
        } else {
            r
        }
    });
    let dir = TempDir::new("broadcast-redis-once");
    let key = dir.write_secret("token.key", "5f0c9a3e7b2d4f6a8c1e3b5d7f9a0c2e4b6d8f1a3c5e7b9d0f2a4c6e8b1d3f5a\n");
    let config = || {
        ConfigToml::new(&mock.url())
            .server("domain", "qyapi.weixin.qq.com")
            .with(shipped(|t| t))
            .with(apps(&dir))
            .with(StoreToml::redis(&redis.url()))
            .with(format!("[tokens]\nkey_file = \"{}\"\n", key.display()))
    };
    let (a, b) = (Gate::start_real_text(config()).await, Gate::start_real_text(config()).await);
    let all = message(AGENT_PART, json!({"touser": "@all"}));
    let (x, y) = tokio::join!(a.post_as("oa", SEND, &all), b.post_as("oa", SEND, &all));
    assert_eq!((x.status.as_u16(), y.status.as_u16()), (200, 200), "{} / {}", x.text(), y.text());
    assert_eq!(mock.calls_to(AGENT_GET), 1, "one fetch of the app's range for both instances");
    // The app sees department 2 (3 under it) and tag 5 (users and department 3).
    assert_eq!(mock.calls_to(USER_SIMPLELIST), 2, "departments 2 and 3, once each");
    assert_eq!(mock.person_times(AGENT_PART), 2 * WeComDirectory::VISIBLE_PART);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_apps_of_one_corp_have_their_own_person_times_windows_and_penalties() {
    let mock = MockWeCom::start(WeComDirectory::nested()).await;
    let dir = TempDir::new("broadcast-two-apps");
    let gate = start(&Backing::Memory, &mock, &dir, |t| t, "").await;
    let hr = message(AGENT_ALL, json!({"touser": "@all"}));
    let oa = message(AGENT_PART, json!({"touser": "@all"}));
    // hr's burst of 10 to every member spends those members' windows for
    // hr only: oa's broadcast to 150 of them goes.
    for i in 0..10 {
        assert_eq!(gate.post_as("hr", SEND, &hr).await.status, 200, "hr's message {i}");
    }
    let over = gate.post_as("hr", SEND, &hr).await;
    assert_eq!((over.status.as_u16(), over.header("x-wxgate-reason")), (429, Some("recipient")), "{}", over.text());
    assert_eq!(gate.post_as("oa", SEND, &oa).await.status, 200, "oa's members' windows are oa's");
    // WeCom's 45009 to hr's messages pauses hr's, not oa's.
    gate.advance(Duration::from_secs(60));
    mock.refuse_sends(AGENT_ALL, 45009);
    let refused = gate.post_as("hr", SEND, &hr).await;
    assert_eq!(refused.json()["errcode"], 45009, "{}", refused.text());
    let paused = gate.post_as("hr", SEND, &hr).await;
    assert_eq!(paused.header("x-wxgate-reason"), Some("penalty"), "{}", paused.text());
    assert_eq!(gate.post_as("oa", SEND, &oa).await.status, 200, "oa keeps sending");
    assert_eq!(mock.refused(AGENT_ALL), 1, "hr's paused message never reached WeCom");
    assert_eq!(mock.person_times(AGENT_ALL), 10 * WeComDirectory::VISIBLE_ALL);
    assert_eq!(mock.person_times(AGENT_PART), 2 * WeComDirectory::VISIBLE_PART);
    assert_eq!(mock.silent_drops(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_broadcast_waits_until_every_member_is_free_and_its_result_names_the_invalid() {
    let mock = MockWeCom::start(WeComDirectory::nested()).await;
    let dir = TempDir::new("broadcast-queued");
    let queue = format!("[queue]\nfile = \"{}\"\n", dir.path().join("queue.db").display());
    let gate = start(&Backing::Memory, &mock, &dir, |t| t, &queue).await;
    let queue = |to: serde_json::Value| {
        let url = gate.url("/@oa/cgi-bin/message/send");
        support::queue::queued_at(url, "hr-app", message(AGENT_PART, to))
    };
    let mut ids = Vec::new();
    for _ in 0..12 {
        ids.push(queue(json!({"touser": "@all"})).await);
    }
    let odd = queue(json!({"touser": "ghost|user491"})).await;
    // The first 10 go at once (each member's burst); each later one when
    // every member has room again (one every 60/21 s), never refused by WeCom.
    let sent = |mock: &MockWeCom| mock.calls_to(MESSAGE_SEND);
    eventually_async("the burst sent", support::PATIENCE, async || sent(&mock) == 10).await;
    for step in 0..60 {
        if sent(&mock) == 13 {
            break;
        }
        assert!(step < 59, "sent {} of 13", sent(&mock));
        gate.advance(Duration::from_millis(500));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for id in &ids {
        let job = support::queue::until_state(&gate, "hr-app", id, "sent").await;
        assert!(job.get("invalid").is_none(), "{job}");
    }
    let job = support::queue::until_state(&gate, "hr-app", &odd, "sent").await;
    assert_eq!(job["invalid"], json!({"invaliduser": ["ghost"]}), "{job}");
    assert_eq!(mock.silent_drops(), 0);
    assert!(mock.max_per_minute(AGENT_PART) <= 30);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_of_100000_members_for_10_apps_stays_within_its_bound() {
    let mut directory = WeComDirectory::large(100_000);
    let apps: Vec<(i64, String)> =
        (0..10).map(|i| (1_000_010 + i, format!("SEKRIT_LARGE_APP_{i}_0123456789"))).collect();
    for (agent, secret) in &apps {
        directory.app(*agent, secret, &[], &[support::wecom::ROOT], &[]);
    }
    let mock = MockWeCom::start(directory).await;
    let dir = TempDir::new("broadcast-large");
    let mut accounts = String::new();
    for (i, (agent, secret)) in apps.iter().enumerate() {
        let file = dir.write_secret(&format!("a{i}.secret"), &format!("{secret}\n"));
        accounts.push_str(&format!(
            "[[account]]\nname = \"a{i}\"\nid = \"{CORPID}\"\nkind = \"wecom\"\nagent = \"{agent}\"\nsecret_file = \"{}\"\n\n",
            file.display()
        ));
    }
    let rules = "[[rule]]\nname = \"message_send\"\nmatch = [\"/cgi-bin/message/send\"]\n\
                 limits = [{ count = 10000000, per = \"day\" }]\ncost = \"recipients\"\nscope = \"app\"\n\
                 recipients = { field = \"touser\", separator = \"|\", all = \"@all\", directory = true }\n";
    // Half of what 10 such directories would hold: the least recently used go.
    let bound = 500_000.0;
    let config = ConfigToml::new(&mock.url())
        .server("domain", "qyapi.weixin.qq.com")
        .with(rules)
        .with(accounts)
        .with("[directory]\nmax_members = 500000\nmax_broadcast = 100000\n");
    let gate = Gate::start_text(config).await;
    mock.follow(&gate.clock);
    let all =
        async |i: usize| gate.post_as(&format!("a{i}"), SEND, &message(apps[i].0, json!({"touser": "@all"}))).await;
    for i in 0..apps.len() {
        let a = all(i).await;
        assert_eq!(a.status, 200, "app {i}: {}", a.text());
        let held = gate.metric("wxgate_directory_members").await.unwrap_or(0.0);
        assert!(held <= bound, "app {i}: {held} ids held");
    }
    let last_four = 4.0 * (100_000.0 + 1.0);
    assert_eq!(
        gate.metric("wxgate_directory_members").await,
        Some(last_four),
        "the last 4 apps' ranges and departments"
    );
    // The first app's department was the least recently used: dropped,
    // fetched again, charged the same.
    assert_eq!(all(0).await.status, 200);
    assert!(gate.metric("wxgate_directory_members").await.unwrap_or(0.0) <= bound);
    assert_eq!(person_times(&gate).await, 11.0 * 100_000.0, "each broadcast charged its 100,000 members");
    assert_eq!(mock.calls_to(USER_SIMPLELIST), 11);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wechatpy_enterprise_sends_to_everyone_and_a_department_through_wxgate_unchanged() {
    let mock = MockWeCom::start(WeComDirectory::nested()).await;
    let dir = TempDir::new("broadcast-wechatpy");
    let gate = start(&Backing::Memory, &mock, &dir, |t| t, "").await;
    // wechatpy 1.8.18's WeCom client as its docs set it up, with its own
    // secret, routed by contrib/wechatpy_wxgate.py (its token request is
    // hard-coded to qyapi.weixin.qq.com): its token from gettoken through
    // wxgate, which learns the corp from it.
    let base = format!("http://{}", gate.addr);
    let seen = support::sdk::wechatpy(&base)
        .contrib()
        .wecom(CORPID, SECRET_PART, AGENT_PART)
        .calls(&["wecom.send_all", "wecom.send_party"])
        .await;
    for s in &seen {
        assert!(s.ok, "{s:?}");
    }
    let reached = WeComDirectory::VISIBLE_PART + WeComDirectory::PARTY_MEMBERS;
    assert_eq!(person_times(&gate).await, reached as f64, "charged @all's 150 and department 2's 120");
    assert_eq!(mock.person_times(AGENT_PART), reached, "and WeCom reached exactly those");
}
