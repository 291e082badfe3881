//! The shipped rule files: `rules.toml` (Official Account / Mini Program) and
//! `deploy/rules-wecom.toml` (WeCom) pass `wxgate check`, send each API to
//! the rule meant for it, keep APIs that WeChat meters separately on
//! separate rules (one counter each), never claim a recovery API, and give
//! every number a source.

use crate::support;

use std::collections::BTreeMap;
use std::path::Path;

use support::process;
use wxgate::config::Config;

const OFFICIAL: &str = "rules.toml";
const WECOM: &str = "deploy/rules-wecom.toml";

/// Recovery APIs: they must reach WeChat while the rest of the account is paused.
const RECOVERY: [&str; 4] =
    ["/cgi-bin/clear_quota", "/cgi-bin/clear_quota/v2", "/cgi-bin/openapi/quota/get", "/cgi-bin/openapi/rid/get"];

/// Official Account / Mini Program: path → the rule that counts it.
const OFFICIAL_TABLE: &[(&str, &str)] = &[
    ("/cgi-bin/token", "token"),
    ("/cgi-bin/stable_token", "stable_token"),
    ("/cgi-bin/ticket/getticket", "jsapi_ticket"),
    ("/cgi-bin/menu/create", "menu_create"),
    ("/cgi-bin/menu/get", "menu_get"),
    ("/cgi-bin/get_current_selfmenu_info", "menu_selfmenu_info"),
    ("/cgi-bin/menu/delete", "menu_delete"),
    ("/cgi-bin/menu/addconditional", "menu_addconditional"),
    ("/cgi-bin/menu/delconditional", "menu_delconditional"),
    ("/cgi-bin/menu/trymatch", "menu_trymatch"),
    ("/cgi-bin/media/upload", "media_upload"),
    ("/cgi-bin/media/uploadimg", "media_uploadimg"),
    ("/cgi-bin/media/uploadnews", "media_uploadnews"),
    ("/cgi-bin/media/get", "media_get"),
    ("/cgi-bin/media/get/jssdk", "media_get_jssdk"),
    ("/cgi-bin/material/add_material", "material_add"),
    ("/cgi-bin/material/get_material", "material_get"),
    ("/cgi-bin/material/del_material", "material_del"),
    ("/cgi-bin/material/batchget_material", "material_batchget"),
    ("/cgi-bin/material/get_materialcount", "material_count"),
    ("/cgi-bin/message/custom/send", "custom_send"),
    ("/cgi-bin/message/template/send", "template_send"),
    ("/cgi-bin/message/subscribe/send", "subscribe_send"),
    ("/cgi-bin/message/subscribe/bizsend", "subscribe_bizsend"),
    ("/cgi-bin/message/mass/sendall", "mass_sendall"),
    ("/cgi-bin/message/mass/send", "mass_send"),
    ("/cgi-bin/message/mass/preview", "mass_preview"),
    ("/cgi-bin/message/mass/delete", "mass_delete"),
    ("/cgi-bin/message/mass/get", "mass_get"),
    ("/cgi-bin/qrcode/create", "qrcode_create"),
    ("/wxa/getwxacodeunlimit", "wxacode_unlimit"),
    ("/wxa/getwxacode", "wxacode_limited"),
    ("/cgi-bin/shorturl", "shorturl"),
    ("/wxa/genwxashortlink", "wxa_shortlink"),
    ("/wxa/generatescheme", "wxa_scheme_urllink"),
    ("/cgi-bin/user/get", "user_get"),
    ("/cgi-bin/user/info", "user_info"),
    ("/cgi-bin/user/info/batchget", "user_info_batchget"),
    ("/cgi-bin/user/info/updateremark", "user_remark"),
    ("/cgi-bin/tags/create", "tags_create"),
    ("/cgi-bin/tags/get", "tags_get"),
    ("/cgi-bin/tags/update", "tags_update"),
    ("/cgi-bin/tags/delete", "tags_delete"),
    ("/cgi-bin/tags/members/batchtagging", "tags_batchtagging"),
    ("/cgi-bin/tags/members/batchuntagging", "tags_batchuntagging"),
    ("/customservice/kfaccount/add", "kf_account"),
    ("/customservice/kfsession/create", "kf_session"),
    ("/cgi-bin/draft/add", "draft_add"),
    ("/cgi-bin/draft/get", "draft_get"),
    ("/cgi-bin/draft/delete", "draft_delete"),
    ("/cgi-bin/draft/update", "draft_update"),
    ("/cgi-bin/draft/count", "draft_count"),
    ("/cgi-bin/draft/batchget", "draft_batchget"),
    ("/cgi-bin/freepublish/submit", "freepublish_submit"),
    ("/cgi-bin/freepublish/get", "freepublish_get"),
    ("/cgi-bin/freepublish/getarticle", "freepublish_getarticle"),
    ("/cgi-bin/freepublish/batchget", "freepublish_batchget"),
    ("/cgi-bin/freepublish/delete", "freepublish_delete"),
    ("/wxa/msg_sec_check", "msg_sec_check"),
    ("/sns/jscode2session", "jscode2session"),
    ("/sns/oauth2/access_token", "sns_oauth"),
];

/// Paths the official-account table may map to a rule already used above:
/// WeChat documents each group as one quota, or publishes no quota for it
/// (a rule without limits keeps no counter).
const OFFICIAL_SHARED: &[(&str, &str)] = &[
    ("/cgi-bin/wxaapp/createwxaqrcode", "wxacode_limited"), // one lifetime quota with getwxacode
    ("/wxa/generate_urllink", "wxa_scheme_urllink"),        // one daily quota with generatescheme
    ("/cgi-bin/material/update_news", "material_other"),
    ("/cgi-bin/message/mass/speed/get", "mass_other"),
    ("/cgi-bin/tags/getidlist", "tags_other"),
    ("/cgi-bin/customservice/getkflist", "kf_account"),
    ("/customservice/kfsession/close", "kf_session"),
    ("/sns/userinfo", "sns_oauth"),
    ("/cgi-bin/some/unlisted/api", "default"),
];

/// WeCom: path → the rule that counts it.
const WECOM_TABLE: &[(&str, &str)] = &[
    ("/cgi-bin/gettoken", "gettoken"),
    ("/cgi-bin/get_jsapi_ticket", "jsapi_ticket"),
    ("/cgi-bin/message/send", "message_send"),
    ("/cgi-bin/appchat/create", "appchat_create"),
    ("/cgi-bin/appchat/update", "appchat_update"),
    ("/cgi-bin/appchat/send", "appchat_send"),
    ("/cgi-bin/media/uploadimg", "media_uploadimg"),
    ("/cgi-bin/user/get", "basic"),
    ("/cgi-bin/user/list", "basic"),
    ("/cgi-bin/department/list", "basic"),
    ("/cgi-bin/externalcontact/get", "basic"),
    ("/cgi-bin/externalcontact/batch/get_by_user", "basic"),
    ("/cgi-bin/externalcontact/list", "basic"),
    ("/cgi-bin/externalcontact/get_follow_user_list", "basic"),
    ("/cgi-bin/externalcontact/remark", "basic_concurrent"),
    ("/cgi-bin/externalcontact/mark_tag", "basic_concurrent"),
    ("/cgi-bin/kf/sync_msg", "basic_concurrent"),
    ("/cgi-bin/externalcontact/get_unassigned_list", "externalcontact"),
    ("/cgi-bin/checkin/getcheckindata", "checkin_data"),
    ("/cgi-bin/corp/getapprovaldata", "approval_data"),
    ("/cgi-bin/auth/getuserinfo", "auth_getuserinfo"),
    ("/cgi-bin/agent/get", "basic"),
];

/// WeCom paths documented as one quota with a path above, or sharing the
/// prefix/default counter (tighter than WeCom).
const WECOM_SHARED: &[(&str, &str)] = &[
    ("/cgi-bin/ticket/get", "jsapi_ticket"), // doc 90454: 400/hour per corp for both tickets
    ("/cgi-bin/externalcontact/del_contact_way", "externalcontact"),
    ("/cgi-bin/user/update", "default"),
];

fn load(file: &str) -> Config {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    Config::load(&path).unwrap_or_else(|e| panic!("{file}: {}", e))
}

fn rule_of(config: &Config, path: &str) -> Option<String> {
    config.rule_for(path).map(|r| r.name.to_string())
}

/// Every path maps to its expected rule, and no two paths of `table` share a
/// counter (a rule's state: the rule, or one path of a `scope = "path"`
/// rule): each API metered separately keeps a counter of its own.
fn check_table(file: &str, table: &[(&str, &str)], shared: &[(&str, &str)]) {
    let config = load(file);
    let mut owners: BTreeMap<String, &str> = BTreeMap::new();
    for &(path, want) in table {
        assert_eq!(rule_of(&config, path).as_deref(), Some(want), "{file}: {path}");
        let counter = config.rule_for(path).map(|r| r.state.to_string()).unwrap_or_default();
        if let Some(other) = owners.insert(counter, path) {
            panic!("{file}: {other} and {path} share the counter of rule {want}, but WeChat meters them separately");
        }
    }
    for &(path, want) in shared {
        assert_eq!(rule_of(&config, path).as_deref(), Some(want), "{file}: {path}");
    }
}

#[test]
fn both_shipped_rule_files_pass_check() {
    for file in [OFFICIAL, WECOM] {
        let (code, stdout, stderr) = process::run(&["check", "--config", file], &[]);
        assert_eq!(code, 0, "{file}: {stderr}");
        assert!(stdout.starts_with(&format!("{file}: ok")), "{file}: {stdout}");
        assert!(stdout.contains("unmatched paths: rule default"), "{file}: {stdout}");
    }
    assert_eq!(load(WECOM).server.upstream.to_string(), "https://qyapi.weixin.qq.com/");
}

#[test]
fn official_account_apis_each_count_on_their_own_rule() {
    check_table(OFFICIAL, OFFICIAL_TABLE, OFFICIAL_SHARED);
}

#[test]
fn wecom_apis_each_count_on_their_own_rule() {
    check_table(WECOM, WECOM_TABLE, WECOM_SHARED);
}

#[test]
fn recovery_apis_belong_to_no_rule_in_either_file() {
    for file in [OFFICIAL, WECOM] {
        let config = load(file);
        for path in RECOVERY {
            assert_eq!(rule_of(&config, path), None, "{file}: {path}");
            assert_eq!(rule_of(&config, &format!("{path}/")), None, "{file}: {path}/");
        }
    }
}

/// Every rule with limits carries its source ("doc", "staff") or says that
/// its numbers are an "estimate", in a comment inside the rule or just above it.
#[test]
fn every_limit_has_a_source_or_says_it_is_an_estimate() {
    for file in [OFFICIAL, WECOM] {
        let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file)).expect("read");
        let lines: Vec<&str> = text.lines().collect();
        let starts: Vec<usize> = (0..lines.len()).filter(|&i| lines[i].trim() == "[[rule]]").collect();
        assert!(!starts.is_empty(), "{file}: no rules");
        for (n, &start) in starts.iter().enumerate() {
            let end = starts.get(n + 1).copied().unwrap_or(lines.len());
            let mut from = start;
            while from > 0 && lines[from - 1].trim_start().starts_with('#') {
                from -= 1;
            }
            let block = lines[from..end].join("\n");
            let name = lines[start..end].iter().find(|l| l.starts_with("name")).copied().unwrap_or("?");
            let limited = lines[start..end].iter().any(|l| l.starts_with("limits") && l.contains("count"));
            let sourced = ["doc", "staff", "estimate"].iter().any(|s| block.contains(s));
            assert!(!limited || sourced, "{file}: {name}: a limit without a source or \"estimate\"");
        }
    }
}

/// WeCom app messages are metered in person-times with limits per member
/// (shared/WECHAT.md, "Who counts what"): the shipped rule counts a
/// message's recipients, keeps each member under 30 a minute and 1,000 an
/// hour, and can take a message to 1,000 members (touser's most) at once.
#[test]
fn the_wecom_message_rule_counts_recipients_and_keeps_each_member_under_its_limits() {
    let config = load(WECOM);
    let rule = config.rule_for("/cgi-bin/message/send").expect("message_send").clone();
    let meter = config.rule_http(Some(&rule)).recipients.clone().expect("it reads recipients");
    assert!(meter.by_recipients && meter.field == ["touser"] && meter.separator.as_deref() == Some("|"));
    assert_eq!(meter.all.as_deref(), Some("@all"));
    assert_eq!(meter.unseen, [vec!["toparty".to_owned()], vec!["totag".to_owned()]]);
    let per_member: Vec<(u64, i64)> = rule.per_recipient.iter().map(|w| (w.count(), w.per_us() / 1_000_000)).collect();
    assert_eq!(per_member, [(30, 60), (1000, 3600)]);
    let (most, _) = rule.max_cost(false, false).expect("a cap");
    assert!(most >= 1000, "a 1,000-member message must fit at once: {most}");
}

/// The block at the end of rules.toml, uncommented: both shipped files in
/// one instance, each path of each domain counted by that domain's rule
/// (the same path is another API on each), with no warning (the two files'
/// penalties agree).
#[test]
fn both_shipped_rule_files_run_together_in_one_instance() {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(OFFICIAL)).expect("rules.toml");
    let block = "# [[domain]]\n# host = \"qyapi.weixin.qq.com\"\n# rules = \"deploy/rules-wecom.toml\"\n";
    assert!(text.contains(block), "rules.toml ends with the WeCom block");
    let both = text.replace(block, &block.replace("# ", ""));
    let dir = support::TempDir::new("both-domains");
    std::fs::create_dir_all(dir.join("deploy")).expect("dir");
    std::fs::copy(Path::new(env!("CARGO_MANIFEST_DIR")).join(WECOM), dir.join(WECOM)).expect("copy");
    let path = dir.write("rules.toml", &both);
    let config = Config::load(&path).unwrap_or_else(|e| panic!("{e}"));
    // The two warnings: queued delivery and WeCom's broadcasts need the
    // accounts as [[account]]s (none here).
    let warned: Vec<_> = config.warnings.iter().map(|w| (w.table.as_deref(), w.field.as_deref())).collect();
    let expected = [
        (Some("[[rule]] \"custom_send\""), Some("queue")),
        (Some("[[rule]] \"qyapi.message_send\""), Some("recipients.directory")),
    ];
    assert_eq!(warned, expected, "{:?}", config.warnings);
    let wecom = load(WECOM);
    for &(path, want) in OFFICIAL_TABLE {
        assert_eq!(config.rule_in(0, path).map(|r| r.name.to_string()).as_deref(), Some(want), "{path}");
    }
    for &(path, want) in WECOM_TABLE {
        let rule = config.rule_in(1, path).expect("a WeCom rule");
        assert_eq!(&*rule.name, format!("qyapi.{want}"), "{path}");
        assert_eq!(rule.limits, wecom.rule_for(path).expect("alone").limits, "{path}: WeCom's own limits");
    }
    let oa = config.rule_in(0, "/cgi-bin/user/get").expect("OA");
    let wc = config.rule_in(1, "/cgi-bin/user/get").expect("WeCom");
    assert_ne!(oa.state, wc.state, "two counters");
    let (code, stdout, stderr) = process::run(&["check", "--config", &path.display().to_string()], &[]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("domain qyapi.weixin.qq.com (/qyapi.weixin.qq.com/)"), "{stdout}");
}
