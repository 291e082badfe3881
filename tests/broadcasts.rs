//! WeCom broadcasts (issue 64): `@all`, `toparty` and `totag` resolved
//! through WeCom's own directory, with the app's token, and charged in
//! person-times and per-member windows, over real sockets.

use crate::support;

use serde_json::json;
use support::tokens::account_toml;
use support::{ConfigToml, Gate, MockWeChat, Reply, TempDir};

const CORP: &str = "wwcorp0123456789";

fn json_reply(v: serde_json::Value) -> Reply {
    Reply::Json { body: v.to_string(), content_type: "application/json" }
}

/// A tiny WeCom: app 1000002 sees users a, b and department 2 (c, d, e).
fn tiny(mock: &MockWeChat) {
    mock.respond(|rec| {
        let path = rec.path_and_query.split('?').next().unwrap_or("");
        match path {
            "/cgi-bin/gettoken" => json_reply(json!({"errcode":0,"access_token":"TOK","expires_in":7200})),
            "/cgi-bin/agent/get" => json_reply(json!({"errcode":0,"agentid":1000002,
                "allow_userinfos":{"user":[{"userid":"a"},{"userid":"B"}]},"allow_partys":{"partyid":[2]},"allow_tags":{"tagid":[]}})),
            "/cgi-bin/user/simplelist" => json_reply(json!({"errcode":0,"userlist":[{"userid":"c"},{"userid":"d"},{"userid":"e"},{"userid":"a"}]})),
            _ => json_reply(json!({"errcode":0,"errmsg":"ok"})),
        }
    });
}

fn rules(more: &str) -> String {
    format!(
        "[[rule]]\nname = \"gettoken\"\nmatch = [\"/cgi-bin/gettoken\"]\nlimits = [{{ count = 100, per = \"1m\" }}]\n\n\
         [[rule]]\nname = \"message_send\"\nmatch = [\"/cgi-bin/message/send\"]\nlimits = [{{ count = 100, per = \"day\" }}]\n\
         cost = \"recipients\"\n\
         recipients = {{ field = \"touser\", separator = \"|\", all = \"@all\", unseen = [\"toparty\", \"totag\"], directory = true }}\n\
         per_recipient = [{{ count = 30, per = \"1m\", burst = 10 }}]\n{more}\n"
    )
}

#[tokio::test]
async fn smoke_at_all_is_charged_its_visible_range() {
    let mock = MockWeChat::start().await;
    tiny(&mock);
    let dir = TempDir::new("broadcast-smoke");
    let config = ConfigToml::new(&mock.url())
        .server("domain", "qyapi.weixin.qq.com")
        .with(rules(""))
        .with(account_toml(&dir, CORP, "wecom", "corpsecret-0123456789", "agent = \"1000002\""));
    let gate = Gate::start_text(config).await;
    let body = json!({"touser":"@all","agentid":1000002,"msgtype":"text","text":{"content":"hi"}}).to_string();
    let a = gate.post_as(CORP, "/cgi-bin/message/send", &body).await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(gate.metric("wxgate_recipients_total{rule=\"message_send\"}").await, Some(5.0), "{}", a.text());
}
