mod support;

use support::*;

#[tokio::test]
async fn unmatched_path_is_forwarded_when_no_default_rule() {
    let mock = MockWeChat::start().await;
    let gate = Gate::start(&mock, "").await;
    let a = gate.get("/cgi-bin/anything?access_token=T").await;
    assert_eq!(a.status, 200);
    assert_eq!(mock.count(), 1);
}
