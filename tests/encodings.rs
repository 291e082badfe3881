//! WeChat's answers are read whatever the client asked for: a client that
//! sends `Accept-Encoding: gzip` (Go's net/http does by default) must not
//! hide a 45009, a token or a quota answer from wxgate. wxgate asks WeChat
//! for `identity`; an answer encoded anyway is not read as a success; and a
//! media answer is never read for an errcode. Against a mock that
//! compresses whenever it is asked to.

use crate::support;

use support::tokens::{WeChatTokens, APPID, SECRET};
use support::*;

const SEND: &str = "/cgi-bin/message/custom/send";

/// `reply` as the mock would send it to `rec`: gzip-encoded when the
/// request accepts gzip (as WeChat's servers do), else as it is.
fn compressing(rec: &Recorded, json: &str) -> Reply {
    let asks_gzip =
        rec.headers.get("accept-encoding").and_then(|v| v.to_str().ok()).is_some_and(|v| v.contains("gzip"));
    if asks_gzip {
        Reply::Encoded { body: gzip_stored(json.as_bytes()), encoding: "gzip" }
    } else {
        Reply::Json { body: json.to_owned(), content_type: "application/json" }
    }
}

const GZIP: (&str, &str) = ("accept-encoding", "gzip, deflate, br");

#[tokio::test]
async fn a_client_accepting_gzip_still_gets_wechats_45009_read_and_penalised() {
    let mock = MockWeChat::start().await;
    mock.respond(|rec| compressing(rec, r#"{"errcode":45009,"errmsg":"api freq out of limit"}"#));
    let gate = Gate::start(&mock, rule("send").matching(SEND).limit(100, "day")).await;
    let first = gate.get_with(&format!("{SEND}?access_token=T"), &[GZIP]).await;
    assert_eq!(first.header("x-wxgate-reason"), Some("penalty"), "WeChat's 45009 was read: {}", first.text());
    assert_eq!(first.json()["errcode"], 45009);
    let second = gate.get_with(&format!("{SEND}?access_token=T"), &[GZIP]).await;
    assert_eq!((second.status.as_u16(), second.header("x-wxgate-reason")), (429, Some("penalty")));
    assert_eq!(mock.count(), 1, "the penalty kept the second call from WeChat");
    let asked = mock.calls()[0].headers.get("accept-encoding").map(|v| v.as_bytes().to_vec());
    assert_eq!(asked.as_deref(), Some(&b"identity"[..]), "wxgate asked WeChat for identity");
}

/// Issue 44 item 2: a client giving `Accept-Encoding` twice (`identity`,
/// then `gzip`) had only its first field rewritten: `identity, gzip`
/// reached WeChat, whose gzipped 45009 was read as unknown (no penalty).
#[tokio::test]
async fn a_doubled_accept_encoding_still_gets_wechats_45009_read_and_penalised() {
    let mock = MockWeChat::start().await;
    mock.respond(|rec| compressing(rec, r#"{"errcode":45009,"errmsg":"api freq out of limit"}"#));
    let gate = Gate::start(&mock, rule("send").matching(SEND).limit(100, "day")).await;
    let twice = [("accept-encoding", "identity"), ("accept-encoding", "gzip")];
    let first = gate.get_with(&format!("{SEND}?access_token=T"), &twice).await;
    let asked: Vec<_> =
        mock.calls()[0].headers.get_all("accept-encoding").iter().map(|v| v.as_bytes().to_vec()).collect();
    assert_eq!(asked, [b"identity".to_vec()], "WeChat saw one Accept-Encoding: identity");
    assert_eq!(first.header("x-wxgate-reason"), Some("penalty"), "WeChat's 45009 was read: {}", first.text());
    let second = gate.get_with(&format!("{SEND}?access_token=T"), &twice).await;
    assert_eq!((second.status.as_u16(), second.header("x-wxgate-reason")), (429, Some("penalty")));
    assert_eq!(mock.count(), 1, "the penalty kept the second call from WeChat");
}

#[tokio::test]
async fn tokens_fetched_by_a_client_accepting_gzip_are_learned_and_cached() {
    let mock = MockWeChat::start().await;
    let tokens = WeChatTokens::new();
    let inner = tokens.responder();
    // The mock's token answers, compressed when asked.
    mock.respond(move |rec| match inner(rec) {
        Reply::Json { body, .. } => compressing(rec, &body),
        other => other,
    });
    let token_rule = rule("token").matching("/cgi-bin/token").limit(2000, "day");
    let gate = Gate::start(&mock, format!("{token_rule}\n{}", rule("send").matching(SEND).limit(100, "day"))).await;
    let path = format!("/cgi-bin/token?grant_type=client_credential&appid={APPID}&secret={SECRET}");
    let first = gate.get_with(&path, &[GZIP]).await;
    assert_eq!(first.status, 200, "{}", first.text());
    let token = first.json()["access_token"].as_str().expect("a token the client can read").to_owned();
    // Cached: the second request is answered by wxgate, not fetched again.
    let second = gate.get_with(&path, &[GZIP]).await;
    assert_eq!(second.json()["access_token"], token.as_str());
    assert_eq!(tokens.fetches("token"), 1, "the token cache read the answer");
    // Learned: a call with it counts against its appid.
    assert_eq!(gate.get_with(&format!("{SEND}?access_token={token}"), &[GZIP]).await.status, 200);
    let b = get_at(gate.admin_addr(), &format!("/v1/buckets/{APPID}/send")).await.json();
    assert_eq!(b["limits"][0]["used"], 1, "{b}");
}

#[tokio::test]
async fn an_answer_encoded_anyway_or_typed_as_media_is_not_read_for_an_errcode() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start(&mock, rule("send").matching(SEND).limit(100, "day")).await;
    // Encoded though wxgate asked for identity: its errcode is unknown, never a success.
    mock.respond(|_| Reply::Encoded { body: gzip_stored(br#"{"errcode":45009,"errmsg":"x"}"#), encoding: "gzip" });
    assert_eq!(gate.get(&format!("{SEND}?access_token=T")).await.status, 200, "passed on as it came");
    let successes = gate.metric("wxgate_upstream_errcodes_total{rule=\"send\",errcode=\"0\"}").await;
    assert_eq!(successes.unwrap_or(0.0), 0.0, "not counted as a success");
    // A media answer whose bytes happen to start like an errcode: no penalty.
    mock.respond(|_| Reply::Bytes {
        body: br#"{"errcode":45009,"errmsg":"a file"}"#.to_vec(),
        content_type: "image/jpeg",
    });
    for _ in 0..2 {
        assert_eq!(gate.get(&format!("{SEND}?access_token=T")).await.status, 200);
    }
    assert_eq!(mock.count(), 3, "no penalty started");
}
