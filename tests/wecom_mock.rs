//! The mock WeCom itself (tests/support/wecom.rs), over real sockets with a
//! plain HTTP client: the numbers of its fixed directory that issue 64's
//! tests rely on, what each app's token may see, how a message/send resolves
//! and drops, and the controls. wxgate is not involved.

use crate::support;

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use serde_json::{json, Value};
use support::wecom::{
    self, MockWeCom, WeComDirectory as Dir, AGENT_ALL, AGENT_PART, CORPID, DEPARTMENT_SIMPLELIST, SECRET_ALL,
    SECRET_PART, USER_SIMPLELIST,
};
use support::{get_at, send, Answer, SEC, T0};
use wxgate::time::ManualClock;

async fn get(w: &MockWeCom, path: &str) -> Answer {
    get_at(w.mock.addr, path).await
}

async fn token(w: &MockWeCom, secret: &str) -> String {
    let a = get(w, &format!("/cgi-bin/gettoken?corpid={CORPID}&corpsecret={secret}")).await.json();
    assert_eq!(a["expires_in"], 7200, "{a}");
    a["access_token"].as_str().expect("a token").to_owned()
}

/// A text message of app `agentid` with these recipient fields.
async fn text(w: &MockWeCom, token: &str, agentid: i64, to: Value) -> Value {
    let mut body = json!({"msgtype": "text", "agentid": agentid, "text": {"content": "all hands at 3"}});
    for (k, v) in to.as_object().expect("fields") {
        body[k] = v.clone();
    }
    let url = format!("{}/cgi-bin/message/send?access_token={token}", w.url());
    send(Request::post(url).body(Full::new(Bytes::from(body.to_string()))).expect("request")).await.json()
}

/// A directory API's JSON answer.
async fn directory(w: &MockWeCom, token: &str, path_and_query: &str) -> Value {
    let sep = if path_and_query.contains('?') { '&' } else { '?' };
    get(w, &format!("{path_and_query}{sep}access_token={token}")).await.json()
}

fn count(list: &Value) -> usize {
    list.as_array().expect("a list").len()
}

#[test]
fn the_nested_directory_resolves_to_its_constants() {
    let d = Dir::nested();
    assert_eq!(d.len(), Dir::MEMBERS);
    assert_eq!(d.visible(AGENT_ALL).len(), Dir::VISIBLE_ALL);
    assert_eq!(d.visible(AGENT_PART).len(), Dir::VISIBLE_PART);
    assert_eq!(d.party(Dir::PARTY, true).len(), Dir::PARTY_MEMBERS);
    assert_eq!(d.party(Dir::PARTY, false).len(), Dir::PARTY_OWN_MEMBERS);
    assert_eq!(d.party(Dir::SUB_PARTY, true).len(), Dir::SUB_PARTY_MEMBERS);
    assert_eq!(d.tag_members(Dir::TAG).len(), Dir::TAG_MEMBERS);
    assert_eq!(d.subtree(1).len(), Dir::DEPARTMENTS);
}

#[tokio::test]
async fn each_app_gets_its_own_token_and_sees_its_own_range() {
    let w = MockWeCom::start(Dir::nested()).await;
    let all = token(&w, SECRET_ALL).await;
    let part = token(&w, SECRET_PART).await;
    assert!(all.starts_with("TOK-1000002-") && part.starts_with("TOK-1000003-"), "{all} {part}");
    let wrong = get(&w, &format!("/cgi-bin/gettoken?corpid={CORPID}&corpsecret=nope")).await.json();
    assert_eq!(wrong["errcode"], 40001);

    let app = directory(&w, &part, "/cgi-bin/agent/get?agentid=1000003").await;
    assert_eq!(app["errcode"], 0, "{app}");
    assert_eq!(app["allow_partys"]["partyid"], json!([2]));
    assert_eq!(app["allow_tags"]["tagid"], json!([5]));
    assert_eq!(count(&app["allow_userinfos"]["user"]), 10);
    assert_eq!(app["allow_userinfos"]["user"][0]["userid"], "user491");
    let other = directory(&w, &part, "/cgi-bin/agent/get?agentid=1000002").await;
    assert_eq!(other["errcode"], 301002, "another app's agentid");
    assert_eq!(directory(&w, "TOK-nope", "/cgi-bin/agent/get?agentid=1000003").await["errcode"], 40014);

    let users = |t: &str, q: &str| {
        let (w, t, q) = (w.clone(), t.to_owned(), q.to_owned());
        async move { directory(&w, &t, &format!("{USER_SIMPLELIST}?{q}")).await }
    };
    assert_eq!(count(&users(&part, "department_id=2&fetch_child=1").await["userlist"]), Dir::PARTY_MEMBERS);
    assert_eq!(count(&users(&part, "department_id=2&fetch_child=0").await["userlist"]), Dir::PARTY_OWN_MEMBERS);
    assert_eq!(count(&users(&part, "department_id=3&fetch_child=1").await["userlist"]), Dir::SUB_PARTY_MEMBERS);
    assert_eq!(users(&part, "department_id=7&fetch_child=1").await["errcode"], 60011, "outside the range");
    let everyone = users(&all, "department_id=1&fetch_child=1").await;
    assert_eq!(count(&everyone["userlist"]), Dir::MEMBERS);
    let user101 = everyone["userlist"].as_array().expect("list").iter().find(|u| u["userid"] == "user101").cloned();
    assert_eq!(user101.expect("user101")["department"], json!([3, 2]), "every department of a member");

    let parts = directory(&w, &part, DEPARTMENT_SIMPLELIST).await;
    let ids: Vec<&Value> = parts["department_id"].as_array().expect("list").iter().map(|d| &d["id"]).collect();
    assert_eq!(ids, [&json!(2), &json!(3)]);
    assert_eq!(parts["department_id"][1]["parentid"], 2);
    assert_eq!(count(&directory(&w, &all, DEPARTMENT_SIMPLELIST).await["department_id"]), Dir::DEPARTMENTS);
    assert_eq!(directory(&w, &part, &format!("{DEPARTMENT_SIMPLELIST}?id=4")).await["errcode"], 60011);

    let tag = directory(&w, &all, "/cgi-bin/tag/get?tagid=5").await;
    assert_eq!((count(&tag["userlist"]), &tag["partylist"]), (30, &json!([3])), "{tag}");
    let outside = directory(&w, &part, "/cgi-bin/tag/get?tagid=6").await;
    assert_eq!(
        (count(&outside["userlist"]), count(&outside["partylist"])),
        (0, 0),
        "only the visible range: {outside}"
    );
    assert_eq!(directory(&w, &all, "/cgi-bin/tag/get?tagid=99").await["errcode"], 40068);
    assert_eq!(w.calls_to(USER_SIMPLELIST), 5);
    assert_eq!(w.calls_by(AGENT_PART, USER_SIMPLELIST), 4);
    assert_eq!(w.directory_calls(), 14);
    assert_eq!(w.mock.count(), 17, "every call recorded, gettoken included");
}

#[tokio::test]
async fn a_send_reaches_each_member_of_its_recipients_once() {
    let w = MockWeCom::start(Dir::nested()).await;
    w.follow(&ManualClock::new(T0));
    let (all, part) = (w.issue_token(AGENT_ALL), w.issue_token(AGENT_PART));
    assert_eq!(text(&w, &all, AGENT_ALL, json!({"touser": "@all"})).await["errcode"], 0);
    assert_eq!(w.person_times(AGENT_ALL), Dir::VISIBLE_ALL);
    assert_eq!(text(&w, &part, AGENT_PART, json!({"touser": "@all"})).await["errcode"], 0);
    assert_eq!(w.person_times(AGENT_PART), Dir::VISIBLE_PART, "each app its own person-times");
    text(&w, &all, AGENT_ALL, json!({"toparty": "2"})).await;
    text(&w, &all, AGENT_ALL, json!({"totag": "5"})).await;
    let a = text(&w, &all, AGENT_ALL, json!({"touser": "user101|USER101|user351", "toparty": "3"})).await;
    assert_eq!(a["invaliduser"], "", "{a}");
    let reached: Vec<usize> = w.sends().iter().map(|s| s.reached).collect();
    assert_eq!(reached, [500, 150, Dir::PARTY_MEMBERS, Dir::TAG_MEMBERS, 31]);
    assert_eq!(w.deliveries(AGENT_ALL, "User101"), [T0; 4], "@all, party 2, tag 5, then once");
    assert_eq!(w.silent_drops(), 0);
}

#[tokio::test]
async fn a_member_past_30_messages_a_minute_is_dropped_without_an_errcode() {
    let w = MockWeCom::start(Dir::nested()).await;
    let clock = ManualClock::new(T0);
    w.follow(&clock);
    let (all, part) = (w.issue_token(AGENT_ALL), w.issue_token(AGENT_PART));
    for _ in 0..30 {
        assert_eq!(text(&w, &all, AGENT_ALL, json!({"touser": "user101"})).await["errcode"], 0);
        clock.advance(Duration::from_secs(1));
    }
    let a = text(&w, &all, AGENT_ALL, json!({"touser": "user101"})).await;
    assert_eq!(a["errcode"], 0, "dropped silently: {a}");
    assert_eq!((w.silent_drops(), w.deliveries(AGENT_ALL, "user101").len()), (1, 30));
    assert_eq!(w.max_per_minute(AGENT_ALL), 31, "what was sent, the dropped one included");
    assert_eq!(text(&w, &part, AGENT_PART, json!({"touser": "user101"})).await["errcode"], 0);
    assert_eq!((w.silent_drops(), w.deliveries(AGENT_PART, "user101").len()), (1, 1), "another app's own window");
    clock.set_us(T0 + 60 * SEC);
    text(&w, &all, AGENT_ALL, json!({"touser": "user101"})).await;
    assert_eq!(w.silent_drops(), 1, "the first delivery is 60 s old: out of the window");
    assert_eq!(w.deliveries(AGENT_ALL, "user101").last(), Some(&(T0 + 60 * SEC)));
}

#[test]
fn a_member_past_1000_messages_an_hour_is_dropped() {
    // 20 a minute, under the minute's 30: every 3 s for an hour and more.
    let times: Vec<i64> = (0..1_202).map(|i| T0 + i * 3 * SEC).collect();
    let dropped = wecom::dropped(&times);
    let first = dropped.iter().position(|d| *d);
    assert_eq!(first, Some(1_000), "the 1,001st within the hour");
    assert_eq!(dropped.iter().filter(|d| **d).count(), 200, "until the first is an hour old: {:?}", &dropped[1_195..]);
    assert!(!dropped[1_200] && !dropped[1_201], "then one out, one in");
}

#[tokio::test]
async fn unknown_recipients_come_back_invalid_and_all_invalid_is_81013() {
    let w = MockWeCom::start(Dir::nested()).await;
    let part = w.issue_token(AGENT_PART);
    let to = json!({"touser": "user001|user101|Nobody", "toparty": "7|2|x", "totag": "5|99"});
    let a = text(&w, &part, AGENT_PART, to).await;
    assert_eq!(a["errcode"], 0, "{a}");
    assert_eq!(
        (&a["invaliduser"], &a["invalidparty"], &a["invalidtag"]),
        (&json!("user001|nobody"), &json!("7|x"), &json!("99"))
    );
    assert_eq!(w.sends()[0].reached, Dir::PARTY_MEMBERS + 20, "department 2 and tag 5's members outside it");
    let none = text(&w, &part, AGENT_PART, json!({"touser": "nobody", "toparty": "7"})).await;
    assert_eq!(none["errcode"], 81013, "{none}");
    assert_eq!(
        text(&w, &part, AGENT_ALL, json!({"touser": "user101"})).await["errcode"],
        301002,
        "another app's agentid"
    );
    assert_eq!(w.sends().len(), 1);
}

#[tokio::test]
async fn controls_stop_the_directory_deny_an_app_refuse_its_sends_and_add_members() {
    let w = MockWeCom::start(Dir::nested()).await;
    let (all, part) = (w.issue_token(AGENT_ALL), w.issue_token(AGENT_PART));
    let users2 = format!("{USER_SIMPLELIST}?department_id=2&fetch_child=1");
    w.set_directory_down(true);
    assert_eq!(get(&w, &format!("{users2}&access_token={part}")).await.status, 502);
    assert_eq!(text(&w, &part, AGENT_PART, json!({"touser": "user101"})).await["errcode"], 0, "sends go on");
    w.set_directory_down(false);
    w.set_directory_busy(true);
    assert_eq!(directory(&w, &part, &users2).await["errcode"], -1);
    w.set_directory_busy(false);
    w.deny_directory(AGENT_PART);
    assert_eq!(directory(&w, &part, &users2).await["errcode"], 60011);
    assert_eq!(directory(&w, &all, &users2).await["errcode"], 0, "the other app still reads");
    w.allow_directory(AGENT_PART);

    w.refuse_sends(AGENT_PART, 45009);
    assert_eq!(text(&w, &part, AGENT_PART, json!({"touser": "@all"})).await["errcode"], 45009);
    assert_eq!(text(&w, &all, AGENT_ALL, json!({"touser": "user101"})).await["errcode"], 0, "the other app sends");
    assert_eq!((w.refused(AGENT_PART), w.person_times(AGENT_PART)), (1, 1));
    w.clear_refusal(AGENT_PART);

    w.add_member("Newcomer", 3);
    assert_eq!(count(&directory(&w, &part, &users2).await["userlist"]), Dir::PARTY_MEMBERS + 1);
    assert_eq!(text(&w, &part, AGENT_PART, json!({"touser": "@all"})).await["errcode"], 0);
    assert_eq!(w.sends().last().map(|s| s.reached), Some(Dir::VISIBLE_PART + 1));
    assert_eq!(w.deliveries(AGENT_PART, "newcomer").len(), 1);
    w.expire_tokens();
    assert_eq!(directory(&w, &part, &users2).await["errcode"], 42001);
}

#[tokio::test]
async fn a_directory_of_100_000_members_is_listed_at_once() {
    let started = Instant::now();
    let w = MockWeCom::start(Dir::large(100_000)).await;
    let built = started.elapsed();
    let all = w.issue_token(AGENT_ALL);
    let asked = Instant::now();
    let a = get(&w, &format!("{USER_SIMPLELIST}?department_id=1&fetch_child=1&access_token={all}")).await;
    let answered = asked.elapsed();
    assert_eq!(a.text().matches(r#""userid":"#).count(), 100_000);
    // A guard against a mock gone quadratic, not a benchmark: on an idle
    // machine each takes a small fraction of this.
    assert!(built + answered < Duration::from_secs(3), "built in {built:?}, answered in {answered:?}");
    let reply = text(&w, &all, AGENT_ALL, json!({"touser": "@all"})).await;
    assert_eq!(reply["errcode"], 0);
    assert_eq!(w.person_times(AGENT_ALL), 100_000);
}
