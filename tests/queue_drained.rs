//! Queued delivery's summary says when each queue can be drained at the
//! earliest (issue 47): `drained_at` and `drained_in_seconds` in `GET
//! /v1/deliveries`, from the rule's limits and the pair's state.

mod support;

use std::time::Duration;

use support::queue::{gate, msgid, queued, until_state, wechat};
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
