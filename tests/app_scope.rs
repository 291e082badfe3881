//! Several WeCom apps of one corp (issue 64, item 6), over real sockets on
//! the embedded store and a real Redis: WeCom meters API frequency per
//! corp (corpid) and app messages per app (AgentId, doc 90454). Two apps
//! of corp `wwcorp`, each an `[[account]]` with a name of its own ("hr",
//! "oa") whose token wxgate adds, share the corp's API limits; with
//! `scope = "app"`, each app's message person-times, members' windows and
//! penalty are its own, also for calls counted under the corpid itself.

use crate::support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde_json::json;
use support::backing::Backing;
use support::redis_server::RedisServer;
use support::temp::TempDir;
use support::{errcode_reply, ok_reply, penalty, rule, MockWeChat, Reply};

const CORP: &str = "wwcorp";
const HR: &str = "1000002";
const OA: &str = "1000003";
const SEND: &str = "/cgi-bin/message/send";
const USER_GET: &str = "/cgi-bin/user/get?userid=u1";

/// The memory store and a real Redis.
fn backings() -> [Backing; 2] {
    [Backing::Memory, Backing::Redis(RedisServer::start())]
}

/// A WeCom mock: `gettoken` issues one token per app secret; a message of
/// app HR is answered 45009 once `refuse_hr` is set; everything else ok.
fn wecom(refuse_hr: Arc<AtomicBool>) -> impl Fn(&support::Recorded) -> Reply + Send + Sync + 'static {
    move |rec| {
        let (path, query) = rec.path_and_query.split_once('?').unwrap_or((&rec.path_and_query, ""));
        match path {
            "/cgi-bin/gettoken" => {
                let app = ["HR", "OA"].into_iter().find(|app| query.contains(&format!("corpsecret=SECRET_{app}_0")));
                match app {
                    Some(app) => Reply::Json {
                        body: format!(
                            r#"{{"errcode":0,"errmsg":"ok","access_token":"TOKEN_{app}","expires_in":7200}}"#
                        ),
                        content_type: "application/json",
                    },
                    None => errcode_reply(40001),
                }
            }
            SEND => {
                let body: serde_json::Value = serde_json::from_slice(&rec.body).unwrap_or_default();
                if refuse_hr.load(Ordering::SeqCst) && body["agentid"].as_u64() == HR.parse().ok() {
                    errcode_reply(45009)
                } else {
                    ok_reply()
                }
            }
            _ => ok_reply(),
        }
    }
}

/// A token key (the token cache shared over Redis needs one).
const KEY: &str = "6a1d9c3e7b2f4a6c8e0b2d4f6a8c0e2b4d6f8a0c2e4b6d8f0a2c4e6b8d0f2a4c";

/// Apps "hr" and "oa" of [`CORP`], whose secrets are in files of `dir`
/// (with the token key they need).
fn apps(dir: &TempDir) -> String {
    let key = dir.write_secret("token.key", KEY);
    let mut out = format!("[tokens]\nkey_file = \"{}\"\n\n", key.display());
    for (name, agent) in [("hr", HR), ("oa", OA)] {
        let file = dir.write_secret(&format!("{name}.secret"), &format!("SECRET_{}_0\n", name.to_uppercase()));
        out.push_str(&format!(
            "[[account]]\nid = \"{CORP}\"\nname = \"{name}\"\nkind = \"wecom\"\nagent = \"{agent}\"\nsecret_file = \"{}\"\n\n",
            file.display()
        ));
    }
    out
}

/// `message_send` as deploy/rules-wecom.toml has it, with a day of `day`
/// person-times and each member's 10 a minute; `scope` its scope line.
fn message_send(day: u64, scope: &str) -> String {
    format!(
        "[[rule]]\nname = \"message_send\"\nmatch = [\"{SEND}\"]\nlimits = [{{ count = {day}, per = \"day\" }}]\n\
         cost = \"recipients\"\nrecipients = {{ field = \"touser\", separator = \"|\" }}\n\
         per_recipient = [{{ count = 10, per = \"1m\", burst = 10 }}]\n{scope}\n"
    )
}

/// A text message of app `agentid` to `to`.
fn message(agentid: &str, to: &str) -> String {
    json!({"touser": to, "msgtype": "text", "agentid": agentid.parse::<u64>().expect("digits"), "text": {"content": "hi"}})
        .to_string()
}

/// Calls the mock saw at `path`.
fn seen(mock: &MockWeChat, path: &str) -> usize {
    mock.calls().iter().filter(|c| c.path_and_query.split('?').next() == Some(path)).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_apps_of_one_corp_share_the_corps_api_frequency() {
    for backing in backings() {
        let store = backing.name();
        let mock = MockWeChat::start().await;
        mock.respond(wecom(Arc::default()));
        let dir = TempDir::new("app-scope-basic");
        let basic = rule("basic").matching("/cgi-bin/user/get").limit_burst(3, "1m", 3);
        let gate = backing.gate(&mock, &format!("{basic}\n{}", apps(&dir))).await;
        for account in ["hr", "hr", "oa"] {
            let a = gate.get_as(account, USER_GET).await;
            assert_eq!((a.status.as_u16(), a.json()["errcode"].as_i64()), (200, Some(0)), "{store}: {}", a.text());
        }
        // The corp's 3 a minute are spent, whichever app asks.
        for account in ["oa", "hr"] {
            let a = gate.get_as(account, USER_GET).await;
            assert_eq!(a.status, 429, "{store}: {account}: {}", a.text());
            assert_eq!(a.header("x-wxgate-reason"), Some("rate"), "{store}");
        }
        assert_eq!(seen(&mock, "/cgi-bin/user/get"), 3, "{store}: WeCom saw the corp's 3 calls, no more");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_app_keeps_its_own_person_times_and_member_windows() {
    for backing in backings() {
        let store = backing.name();
        let mock = MockWeChat::start().await;
        mock.respond(wecom(Arc::default()));
        let dir = TempDir::new("app-scope-messages");
        let rules = format!("{}\n{}", message_send(15, "scope = \"app\""), apps(&dir));
        let gate = backing.gate(&mock, &rules).await;
        // Each app may send member u1 its 10 in the minute's burst of 10.
        for (account, agent) in [("hr", HR), ("oa", OA)] {
            for i in 0..10 {
                let a = gate.post_as(account, SEND, &message(agent, "u1")).await;
                assert_eq!(a.status, 200, "{store}: {account}'s message {i}: {}", a.text());
            }
            let over = gate.post_as(account, SEND, &message(agent, "u1")).await;
            assert_eq!(over.status, 429, "{store}: {account}'s 11th to u1: {}", over.text());
            assert_eq!(over.header("x-wxgate-reason"), Some("recipient"), "{store}");
        }
        // Person-times too: 10 of each app's 15 are spent; 6 more do not
        // fit in either, 5 fit in each.
        for (account, agent) in [("hr", HR), ("oa", OA)] {
            let six = gate.post_as(account, SEND, &message(agent, "a|b|c|d|e|f")).await;
            assert_eq!(six.status, 429, "{store}: {account}: {}", six.text());
            assert_eq!(six.header("x-wxgate-reason"), Some("quota"), "{store}");
            let five = gate.post_as(account, SEND, &message(agent, "a|b|c|d|e")).await;
            assert_eq!(five.status, 200, "{store}: {account}: {}", five.text());
        }
        assert_eq!(seen(&mock, SEND), 22, "{store}");
        // Calls counted under the corpid itself (their tokens the clients'
        // own) are kept per app as well.
        for agent in [HR, OA] {
            for i in 0..10 {
                let a = gate.post_as("wwother", &format!("{SEND}?access_token=T"), &message(agent, "u1")).await;
                assert_eq!(a.status, 200, "{store}: app {agent}'s message {i} under the corpid: {}", a.text());
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_45009_to_one_apps_messages_leaves_the_other_app_sending() {
    for backing in backings() {
        let store = backing.name();
        let mock = MockWeChat::start().await;
        let refuse_hr = Arc::new(AtomicBool::new(false));
        mock.respond(wecom(refuse_hr.clone()));
        let dir = TempDir::new("app-scope-45009");
        let rules = format!("{}\n{}\n{}", message_send(100_000, "scope = \"app\""), apps(&dir), penalty(45009, 60));
        let gate = backing.gate(&mock, &rules).await;
        refuse_hr.store(true, Ordering::SeqCst);
        for account in ["hr", "wwother"] {
            let path = format!("{SEND}?access_token=T");
            let path = if account == "hr" { SEND } else { &path };
            let refused = gate.post_as(account, path, &message(HR, "u1")).await;
            assert_eq!(refused.status, 429, "{store}: {account}: WeCom's 45009: {}", refused.text());
            let paused = gate.post_as(account, path, &message(HR, "u2")).await;
            assert_eq!(paused.status, 429, "{store}: {account}");
            assert_eq!(paused.header("x-wxgate-reason"), Some("penalty"), "{store}: {account}");
            // The other app of the corp keeps sending.
            let other = if account == "hr" { "oa" } else { account };
            for i in 0..3 {
                let a = gate.post_as(other, path, &message(OA, "u1")).await;
                assert_eq!(a.status, 200, "{store}: {other}'s message {i} (app {OA}): {}", a.text());
            }
        }
        assert_eq!(seen(&mock, SEND), 8, "{store}: app {HR}'s paused messages never reached WeCom");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_message_without_its_agentid_or_with_another_apps_is_refused() {
    for backing in backings() {
        let store = backing.name();
        let mock = MockWeChat::start().await;
        mock.respond(wecom(Arc::default()));
        let dir = TempDir::new("app-scope-400");
        // Another app's agentid is refused under any rule that reads the body.
        let gate = backing.gate(&mock, &format!("{}\n{}", message_send(100, ""), apps(&dir))).await;
        let other = gate.post_as("hr", SEND, &message(OA, "u1")).await;
        assert_eq!(other.status, 400, "{store}: {}", other.text());
        assert!(
            other.json()["errmsg"]
                .as_str()
                .is_some_and(|m| m.contains("agentid 1000003 is not the AgentId of account \"hr\"")),
            "{store}: {}",
            other.text()
        );
        assert_eq!(gate.post_as("hr", SEND, &message(HR, "u1")).await.status, 200, "{store}");
        drop(gate);
        let gate = backing.gate(&mock, &format!("{}\n{}", message_send(100, "scope = \"app\""), apps(&dir))).await;
        let body = json!({"touser": "u1", "msgtype": "text", "text": {"content": "hi"}}).to_string();
        for account in ["hr", "wwother"] {
            let missing = gate.post_as(account, &format!("{SEND}?access_token=T"), &body).await;
            assert_eq!(missing.status, 400, "{store}: {account}: {}", missing.text());
            assert!(
                missing.json()["errmsg"].as_str().is_some_and(|m| m.contains("rule \"message_send\"")
                    && m.contains("scope = \"app\"")
                    && m.contains("no \"agentid\"")),
                "{store}: {}",
                missing.text()
            );
        }
        assert_eq!(seen(&mock, SEND), 1, "{store}: no refused message reached WeCom");
    }
}
