//! Queued delivery's summary says when each queue can be drained at the
//! earliest (issue 47): `drained_at` and `drained_in_seconds` in `GET
//! /v1/deliveries`, from the rule's limits and the pair's state.

use crate::support;

use std::time::Duration;

use support::queue::{gate, msgid, queued, submit, until_state, wechat};
use support::rule;
use support::temp::TempDir;

const SEND: &str = "/cgi-bin/message/template/send";

#[tokio::test]
async fn the_summary_says_when_a_queue_spilling_over_the_day_quota_is_drained() {
    let (mock, _tokens) = wechat(|_, n| msgid(n)).await;
    let dir = TempDir::new("queue-drained");
    let token = rule("token").matching("/cgi-bin/token").limit(2000, "day");
    // Jobs that may wait two days (the default deadline is 24 h).
    let send = rule("template_send").matching(SEND).limit(2, "day").set("queue", true).set("queue_deadline", "3d");
    let gate = gate(&mock, &dir, &format!("{token}\n{send}"), "", &support::caller("hr").to_string()).await;
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(queued(&gate, "hr", SEND, &format!(r#"{{"touser":"o{i}"}}"#)).await);
    }
    for id in &ids[..2] {
        until_state(&gate, "hr", id, "sent").await;
    }
    until_state(&gate, "hr", &ids[2], "waiting").await;
    // 3 left at 2 a day: 2 at Beijing's next midnight (16:00 UTC; the
    // gate's clock reads 02:00 UTC), the last at the one after.
    let summary = || async {
        let a = gate.get_with("/v1/deliveries", &[("x-wx-caller", "hr")]).await;
        assert_eq!(a.status, 200, "{}", a.text());
        a.json()["queues"][0].clone()
    };
    let q = summary().await;
    let left = q["waiting"].as_u64().zip(q["queued"].as_u64()).map(|(w, q)| w + q);
    assert_eq!((q["sent"].as_u64(), left), (Some(2), Some(3)), "{q}");
    assert_eq!(q["drained_at"], "2026-11-30T16:00:00.000Z", "{q}");
    assert_eq!(q["drained_in_seconds"], 14 * 3600 + 86_400, "{q}");
    gate.advance(Duration::from_secs(3600));
    let q = summary().await;
    let got = (q["drained_at"].as_str(), q["drained_in_seconds"].as_i64());
    assert_eq!(got, (Some("2026-11-30T16:00:00.000Z"), Some(13 * 3600 + 86_400)), "{q}");
    // Past midnight the next 2 go; the last waits for the next midnight.
    gate.advance(Duration::from_secs(13 * 3600));
    for id in &ids[2..4] {
        until_state(&gate, "hr", id, "sent").await;
    }
    let q = summary().await;
    assert_eq!(
        (q["drained_at"].as_str(), q["drained_in_seconds"].as_i64()),
        (Some("2026-11-30T16:00:00.000Z"), Some(86_400)),
        "{q}"
    );
    // Drained: now.
    gate.advance(Duration::from_secs(86_400));
    until_state(&gate, "hr", &ids[4], "sent").await;
    let q = summary().await;
    assert_eq!(
        (q["drained_at"].as_str(), q["drained_in_seconds"].as_i64()),
        (Some("2026-11-30T16:00:00.000Z"), Some(0)),
        "{q}"
    );
}

/// The queue shares the day quota with the account's live calls at their
/// current rate (issue 48): a job that cannot be sent before its deadline
/// is flagged at submission (`X-Wxgate-Eta`, `X-Wxgate-Eta-Late: deadline`)
/// and stored all the same; `drained_at` counts the live calls too.
#[tokio::test]
async fn a_job_that_cannot_make_its_deadline_at_todays_rates_is_flagged_at_submission() {
    let (mock, _tokens) = wechat(|_, n| msgid(n)).await;
    let dir = TempDir::new("queue-eta");
    let token = rule("token").matching("/cgi-bin/token").limit(2000, "day");
    // 100 a day; 2 a minute (one every 30 s, no burst).
    let send = rule("template_send")
        .matching(SEND)
        .limit(100, "day")
        .limit_burst(2, "1m", 1)
        .set("queue", true)
        .set("queue_deadline", "3d");
    let gate = gate(&mock, &dir, &format!("{token}\n{send}"), "", &support::caller("hr").to_string()).await;
    // Live calls of the account, one a minute for 10 minutes: 10 of the 100.
    let live = format!("/@{}{SEND}", support::tokens::APPID);
    for _ in 0..10 {
        assert_eq!(gate.post(&live, r#"{"touser":"o"}"#).await.status, 200);
        gate.advance(Duration::from_secs(60));
    }
    // The first job can go at once.
    let first = submit(&gate, "hr", SEND, r#"{"touser":"q0"}"#, &[]).await;
    assert_eq!(first.status, 202, "{}", first.text());
    assert_eq!(first.header("x-wxgate-eta"), Some("2026-11-29T02:10:00.000Z"), "now");
    assert_eq!(first.header("x-wxgate-eta-late"), None);
    // 79 more, the last with an hour's deadline. At 2 a minute alone the
    // 90 left today would last 45 minutes: in time. But live calls take
    // about 1 a minute of the day quota too: about 59 jobs fit today, the
    // rest go after Beijing's midnight (16:00 UTC).
    for i in 1..79 {
        let a = submit(&gate, "hr", SEND, &format!(r#"{{"touser":"q{i}"}}"#), &[]).await;
        assert_eq!(a.status, 202, "{}", a.text());
    }
    let last = submit(&gate, "hr", SEND, r#"{"touser":"q79"}"#, &[("x-wxgate-deadline", "3600")]).await;
    assert_eq!(last.status, 202, "stored all the same: {}", last.text());
    let eta = last.header("x-wxgate-eta").expect("an estimate").to_owned();
    assert!(eta.as_str() > "2026-11-29T16:00:00.000Z" && eta.as_str() < "2026-11-29T17:00:00.000Z", "{eta}");
    assert_eq!(last.header("x-wxgate-eta-late"), Some("deadline"));
    let q = gate.get_with("/v1/deliveries", &[("x-wx-caller", "hr")]).await.json()["queues"][0].clone();
    let drained = q["drained_at"].as_str().expect("drained_at");
    assert!(drained > "2026-11-29T16:00:00.000Z" && drained < "2026-11-29T17:00:00.000Z", "{q}");
}
