//! Phase 4, meter: for a rule with `recipients`, what a call costs and
//! whom it is to, read from its body before the decision.
//!
//! - The body is read whole, at most [`BODY_CAP`] bytes (413 naming the
//!   rule past it; 400 if it stalls or breaks), and forwarded byte-identical
//!   afterwards: a body not read whole is never forwarded.
//! - It must be JSON without a key given twice, and name its recipients in
//!   the rule's field: a string split by the separator, or an array of
//!   strings. Else 400 saying what the rule expected.
//! - A recipient named twice is refused (400): whether WeCom counts it
//!   once or twice is not documented, and wxgate does not guess.
//! - `@all` and the `unseen` fields (`toparty`, `totag`) name members wxgate
//!   cannot see: they cost `unseen_cost`, or the call is refused (400).
//! - With `cost = "recipients"`, a call costing more than the rule can
//!   ever admit at once (a window's burst, a day's count) is refused with
//!   400 naming the limit: no wait would let it through.
//! - A rule in shadow mode refuses nothing here either: a call whose
//!   recipients cannot be read is forwarded, decided at cost 1, and logged
//!   (a body over the cap is forwarded unread when its Content-Length
//!   says so; a chunked one that passes the cap has been read in part and
//!   is refused, 413, as it cannot be forwarded whole).

use std::collections::HashSet;

use http::Request;
use hyper::body::Incoming;
use serde_json::Value;

use super::call::{Call, Metered};
use crate::config::{Metering, Priority, PARTY_FIELD, TAG_FIELD};
use crate::error::{Early, ProxyError};
use crate::features::hooks::body::{read_body_upto, request_json};
use crate::features::hooks::Broadcast;

/// Most bytes of a body read to count its recipients.
pub const BODY_CAP: u64 = 64 * 1024;

/// Reads the call's recipients if its rule has `recipients`.
/// `req`: the live request (`None`: a call wxgate makes itself, whose
/// body is always read whole).
pub async fn meter(call: &mut Call, req: Option<&mut Request<Incoming>>) -> Result<(), Early> {
    // Most rules read no body: nothing is cloned for them.
    let config = call.config();
    let Some(metering) = call.route.rule.as_deref().and_then(|r| config.rule_http(Some(r)).recipients.clone()) else {
        return Ok(());
    };
    let Some(rule) = call.route.rule.clone() else { return Ok(()) };
    let shadow = rule.shadow;
    if shadow && call.body.is_none() && req.as_deref().is_some_and(declared_over_cap) {
        tracing::info!(rule = %rule.name, "shadow mode: a body over 64 KiB would have been refused (413); forwarded unread, at cost 1");
        return Ok(());
    }
    let body = match call.body.clone() {
        Some(body) => Some(body),
        None => {
            let within = call.config().server.body_timeout;
            let what = format!("a call of rule \"{}\" (it counts the recipients in the body)", metering.rule);
            match req {
                Some(req) => read_body_upto(req, within, BODY_CAP, &what).await?,
                None => None,
            }
        }
    };
    let metered = match read(&metering, body.as_deref()) {
        Ok(metered) => metered,
        Err(why) if shadow => {
            tracing::info!(rule = %rule.name, why = %why, "shadow mode: would have refused this call (400); forwarded at cost 1");
            call.body = body;
            return Ok(());
        }
        Err(why) => {
            return Err(ProxyError::BadRequest(format!(
                "rule \"{}\" counts this call's recipients: {why}",
                metering.rule
            ))
            .into())
        }
    };
    if metering.by_recipients {
        let normal = call.who.caller.priority() != Priority::High;
        crate::admit::too_costly(&rule, metered.cost, normal)?;
    }
    call.body = body;
    call.meter = Some(metered);
    Ok(())
}

/// Whether the request declares a body longer than [`BODY_CAP`].
fn declared_over_cap(req: &Request<Incoming>) -> bool {
    req.headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|n| n > BODY_CAP)
}

/// What `body` costs under `m`, and its recipients; `Err` says why it
/// cannot be counted (the 400's text, naming no recipient's id).
fn read(m: &Metering, body: Option<&[u8]>) -> Result<Metered, String> {
    let field = m.field.join(".");
    let expected = match &m.separator {
        Some(sep) => {
            format!("a JSON body whose \"{field}\" is a string of ids separated by \"{sep}\", or an array of strings")
        }
        None => format!("a JSON body whose \"{field}\" is an array of strings or one id"),
    };
    let Some(body) = body else { return Err(format!("the request has no body; expected {expected}")) };
    let json = match request_json(Some(body)) {
        Ok(Some(json)) => json,
        Ok(None) => return Err(format!("the body is not JSON; expected {expected}")),
        Err(ProxyError::BadRequest(why)) => return Err(why),
        Err(e) => return Err(e.to_string()),
    };
    // With `directory`, WeCom's `toparty` and `totag` are read as the
    // departments and tags the directory resolves; any other unseen field
    // (and both without it) only says that someone unseen is named.
    let mut broadcast = Broadcast::default();
    let mut unseen = false;
    for path in &m.unseen {
        let Some(value) = at(&json, path).filter(|v| !v.is_null()) else { continue };
        match (m.directory, path.as_slice()) {
            (true, [f]) if f == PARTY_FIELD => broadcast.parties = unit_ids(value, PARTY_FIELD)?,
            (true, [f]) if f == TAG_FIELD => broadcast.tags = unit_ids(value, TAG_FIELD)?,
            _ => unseen |= names_someone(value),
        }
    }
    // Each id trimmed and folded to ASCII lower case as it is read (the
    // one copy the call keeps of it): WeCom userids are case-insensitive,
    // so `alice` and `ALICE` are one member, named twice.
    let mut ids: Vec<String> = Vec::new();
    let mut all_named = 0usize;
    let mut push = |raw: &str| -> Result<(), String> {
        let id = raw.trim();
        if id.is_empty() {
            return Ok(());
        }
        if let Some(all) = &m.all {
            if id == all {
                all_named += 1;
                return Ok(());
            }
            if id.eq_ignore_ascii_case(all) {
                return Err(format!(
                    "\"{field}\" names \"{id}\": WeCom documents \"{all}\" (this spelling) for every member, and \
                     wxgate does not guess whether \"{id}\" means them too (a userid cannot start with \"@\"); \
                     write \"{all}\""
                ));
            }
        }
        if ids.len() == m.max {
            return Err(format!(
                "\"{field}\" names more than the {} recipients one call may ({})",
                m.max,
                m.max_from()
            ));
        }
        if id.len() > Metering::MAX_ID || id.chars().any(char::is_control) {
            return Err(format!(
                "\"{field}\" holds an id longer than {} bytes or with control characters",
                Metering::MAX_ID
            ));
        }
        ids.push(id.to_ascii_lowercase());
        Ok(())
    };
    match at(&json, &m.field) {
        None | Some(Value::Null) if unseen || !broadcast.is_empty() => {}
        None | Some(Value::Null) => return Err(format!("the body has no \"{field}\"; expected {expected}")),
        Some(Value::String(text)) => match &m.separator {
            Some(sep) => text.split(sep.as_str()).try_for_each(&mut push)?,
            None => push(text)?,
        },
        Some(Value::Array(items)) => {
            for item in items {
                match item {
                    Value::String(id) => push(id)?,
                    _ => return Err(format!("\"{field}\" holds something other than strings; expected {expected}")),
                }
            }
        }
        Some(_) => return Err(format!("\"{field}\" is neither a string nor an array; expected {expected}")),
    }
    if all_named > 0 {
        if all_named > 1 || !ids.is_empty() {
            let all = m.all.as_deref().unwrap_or_default();
            return Err(format!("\"{field}\" names \"{all}\" and other recipients too"));
        }
        if m.directory {
            broadcast.all = true;
        } else {
            unseen = true;
        }
    }
    let mut seen = HashSet::with_capacity(ids.len());
    for id in &ids {
        if !seen.insert(id.as_str()) {
            return Err(format!(
                "\"{field}\" names a recipient twice (ids are compared ignoring ASCII case, as WeCom compares \
                 userids); wxgate does not guess whether WeChat counts it once or twice"
            ));
        }
    }
    let extra = match (unseen, m.unseen_cost) {
        (false, _) => 0,
        // Resolved members are counted by the directory; what no
        // directory resolves still costs `unseen_cost`, or is refused.
        (true, Some(cost)) => cost,
        (true, None) => {
            let which: Vec<String> = m
                .all
                .iter()
                .map(|a| format!("\"{a}\""))
                .chain(m.unseen.iter().map(|p| format!("\"{}\"", p.join("."))))
                .collect();
            return Err(format!(
                "the body names members wxgate cannot count ({}); give them as ids in \"{field}\", or set the rule's \
                 recipients.unseen_cost",
                which.join(", ")
            ));
        }
    };
    if ids.is_empty() && extra == 0 && broadcast.is_empty() {
        return Err(format!("\"{field}\" names no recipient; expected {expected}"));
    }
    let cost = if m.by_recipients { ids.len() as u64 + extra } else { 1 };
    let app = app_of(&json)?;
    let broadcast = (!broadcast.is_empty()).then_some(broadcast);
    Ok(Metered { cost, recipients: ids, app, broadcast, unseen_extra: extra })
}

/// The department or tag ids of WeCom's `toparty` / `totag`: a string of
/// ids separated by `|` (as WeCom documents them), a number, or an array
/// of numbers or digit strings; each a positive 32-bit integer, at most
/// [`Broadcast::MAX_UNITS`] of them, none twice. Anything else is refused:
/// wxgate does not guess which departments WeCom would read.
fn unit_ids(value: &Value, field: &str) -> Result<Vec<u32>, String> {
    let bad = || format!("\"{field}\" is not a list of ids (\"1|2\", a number, or an array of them)");
    let one = |text: &str| -> Result<Option<u32>, String> {
        let text = text.trim();
        if text.is_empty() {
            return Ok(None);
        }
        match text.parse::<u32>() {
            Ok(n) if n > 0 && text.bytes().all(|b| b.is_ascii_digit()) => Ok(Some(n)),
            _ => Err(bad()),
        }
    };
    let mut ids = Vec::new();
    let mut push = |id: Option<u32>| -> Result<(), String> {
        let Some(id) = id else { return Ok(()) };
        if ids.contains(&id) {
            return Err(format!("\"{field}\" names {id} twice; wxgate does not guess how WeCom counts it"));
        }
        if ids.len() == Broadcast::MAX_UNITS {
            return Err(format!("\"{field}\" names more than WeCom's {} (doc 90236)", Broadcast::MAX_UNITS));
        }
        ids.push(id);
        Ok(())
    };
    let number = |v: &Value| v.as_u64().and_then(|n| u32::try_from(n).ok()).filter(|n| *n > 0);
    match value {
        Value::String(text) => text.split('|').try_for_each(|t| push(one(t)?))?,
        Value::Number(_) => push(Some(number(value).ok_or_else(bad)?))?,
        Value::Array(items) => {
            for item in items {
                match item {
                    Value::String(t) => push(one(t)?)?,
                    Value::Number(_) => push(Some(number(item).ok_or_else(bad)?))?,
                    _ => return Err(bad()),
                }
            }
        }
        _ => return Err(bad()),
    }
    Ok(ids)
}

/// The WeCom app a body names: its `agentid`, a positive integer (as
/// WeCom documents it) or a string of digits (as some SDKs send it); `Err`
/// for any other value, which wxgate does not read as an app.
fn app_of(json: &Value) -> Result<Option<String>, String> {
    match json.get("agentid") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) if n.as_u64().is_some_and(|n| n > 0 && n < 1 << 32) => Ok(Some(n.to_string())),
        Some(Value::String(s)) if (1..=10).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_digit()) => {
            match s.parse::<u64>() {
                Ok(n) if n > 0 && n < 1 << 32 => Ok(Some(n.to_string())),
                _ => Err("\"agentid\" is not an AgentId (a positive integer)".into()),
            }
        }
        Some(_) => Err("\"agentid\" is not an AgentId (a positive integer)".into()),
    }
}

/// The value at `path` in `json` (`None`: absent).
fn at<'v>(json: &'v Value, path: &[String]) -> Option<&'v Value> {
    path.iter().try_fold(json, |v, name| v.as_object()?.get(name))
}

/// Whether an `unseen` field names anyone: a non-empty string or array, or
/// a number (a tag or party id).
fn names_someone(v: &Value) -> bool {
    match v {
        Value::String(s) => !s.trim().is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Number(_) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn wecom(unseen_cost: Option<u64>) -> Metering {
        Metering {
            rule: "message_send".into(),
            field: vec!["touser".into()],
            separator: Some("|".into()),
            all: Some("@all".into()),
            unseen: vec![vec!["toparty".into()], vec!["totag".into()]],
            unseen_cost,
            max: 1000,
            by_recipients: true,
            directory: false,
        }
    }

    fn cost(m: &Metering, body: &str) -> Result<(u64, Vec<String>), String> {
        read(m, Some(body.as_bytes())).map(|r| (r.cost, r.recipients))
    }

    #[test]
    fn recipients_are_read_from_a_string_or_an_array() {
        let m = wecom(None);
        assert_eq!(cost(&m, r#"{"touser":"a|b | c|"}"#), Ok((3, vec!["a".into(), "b".into(), "c".into()])));
        assert_eq!(cost(&m, r#"{"touser":["a","b"]}"#), Ok((2, vec!["a".into(), "b".into()])));
        let nested = Metering { field: vec!["data".into(), "to".into()], ..wecom(None) };
        assert_eq!(cost(&nested, r#"{"data":{"to":"x"}}"#), Ok((1, vec!["x".into()])));
    }

    #[test]
    fn what_cannot_be_counted_is_refused_or_costs_unseen_cost() {
        let refused = wecom(None);
        for body in [r#"{"touser":"@all"}"#, r#"{"touser":"a","toparty":"1"}"#, r#"{"totag":[2]}"#] {
            assert!(cost(&refused, body).is_err_and(|e| e.contains("cannot count")), "{body}");
        }
        let priced = wecom(Some(500));
        assert_eq!(cost(&priced, r#"{"touser":"@all"}"#), Ok((500, vec![])));
        assert_eq!(cost(&priced, r#"{"touser":"a|b","toparty":"1|2"}"#), Ok((502, vec!["a".into(), "b".into()])));
        assert_eq!(cost(&priced, r#"{"touser":"a","toparty":""}"#), Ok((1, vec!["a".into()])));
    }

    #[test]
    fn ambiguous_or_malformed_bodies_are_refused() {
        let m = wecom(None);
        for (body, says) in [
            ("not json", "not JSON"),
            (r#"{"msgtype":"text"}"#, "has no \"touser\""),
            (r#"{"touser":"a","touser":"b"}"#, "twice"),
            (r#"{"touser":"a|a"}"#, "recipient twice"),
            (r#"{"touser":7}"#, "neither"),
            (r#"{"touser":["a",1]}"#, "other than strings"),
            (r#"{"touser":"|"}"#, "no recipient"),
            (r#"{"touser":"a|@all"}"#, "other recipients"),
        ] {
            assert!(cost(&m, body).is_err_and(|e| e.contains(says)), "{body}: {:?}", cost(&m, body));
        }
        assert!(read(&m, None).is_err_and(|e| e.contains("no body")));
    }

    #[test]
    fn with_a_directory_a_broadcast_is_read_for_it_to_resolve() {
        let m = Metering { directory: true, ..wecom(None) };
        let read_it = |body: &str| read(&m, Some(body.as_bytes()));
        let all = read_it(r#"{"touser":"@all","agentid":1000002}"#).expect("@all");
        assert_eq!(all.broadcast, Some(Broadcast { all: true, ..Broadcast::default() }));
        assert_eq!((all.cost, all.recipients.len(), all.app.as_deref()), (0, 0, Some("1000002")));
        let mixed = read_it(r#"{"touser":"A|b","toparty":"2|3","totag":[5,"6"],"agentid":1}"#).expect("mixed");
        assert_eq!(mixed.broadcast, Some(Broadcast { all: false, parties: vec![2, 3], tags: vec![5, 6] }));
        assert_eq!((mixed.cost, mixed.recipients), (2, vec!["a".into(), "b".into()]));
        assert_eq!(read_it(r#"{"toparty":7,"agentid":1}"#).map(|r| r.broadcast.map(|b| b.parties)), Ok(Some(vec![7])));
        for (body, says) in [
            (r#"{"toparty":"2|2"}"#, "twice"),
            (r#"{"toparty":"x"}"#, "not a list of ids"),
            (r#"{"totag":"-1"}"#, "not a list of ids"),
            (r#"{"totag":"0"}"#, "not a list of ids"),
            (r#"{"toparty":[1.5]}"#, "not a list of ids"),
            (r#"{"toparty":{"a":1}}"#, "not a list of ids"),
            (r#"{"touser":"@all|a"}"#, "other recipients"),
        ] {
            assert!(read_it(body).is_err_and(|e| e.contains(says)), "{body}: {:?}", read_it(body));
        }
        let many: Vec<String> = (1..=101).map(|i| i.to_string()).collect();
        let body = json!({"toparty": many.join("|")}).to_string();
        assert!(read_it(&body).is_err_and(|e| e.contains("more than WeCom's 100")));
        // Without a directory, as before: refused unless priced.
        assert!(read(&wecom(None), Some(br#"{"toparty":"2"}"#)).is_err_and(|e| e.contains("cannot count")));
    }

    #[test]
    fn the_app_is_the_bodys_agentid_read_one_way() {
        let m = wecom(None);
        let app = |body: &str| read(&m, Some(body.as_bytes())).map(|r| r.app);
        assert_eq!(app(r#"{"touser":"a","agentid":1000002}"#), Ok(Some("1000002".into())));
        assert_eq!(app(r#"{"touser":"a","agentid":"1000002"}"#), Ok(Some("1000002".into())));
        assert_eq!(app(r#"{"touser":"a"}"#), Ok(None));
        for bad in [r#""x1""#, "-1", "0", "1.5", r#""""#, "[1]", r#""+1""#, "4294967296"] {
            let body = format!(r#"{{"touser":"a","agentid":{bad}}}"#);
            assert!(app(&body).is_err_and(|e| e.contains("AgentId")), "{bad}");
        }
        let many = (0..1001).map(|i| format!("u{i}")).collect::<Vec<_>>().join("|");
        assert!(cost(&m, &format!(r#"{{"touser":"{many}"}}"#))
            .is_err_and(|e| e.contains("more than the 1000") && e.contains("WeCom's own limit for touser")));
        let fewer = Metering { max: 2, ..wecom(None) };
        assert!(cost(&fewer, r#"{"touser":"a|b|c"}"#).is_err_and(|e| e.contains("the rule's recipients.max")));
    }

    #[test]
    fn ids_differing_only_in_case_are_one_member() {
        let m = wecom(Some(10));
        assert_eq!(cost(&m, r#"{"touser":"Alice|BOB"}"#), Ok((2, vec!["alice".into(), "bob".into()])));
        for body in [r#"{"touser":"alice|ALICE"}"#, r#"{"touser":["Bob"," bob "]}"#] {
            assert!(cost(&m, body).is_err_and(|e| e.contains("recipient twice")), "{body}");
        }
        // Only "@all" as WeCom documents it means everyone; other cases are
        // refused rather than guessed (a userid cannot start with "@").
        assert_eq!(cost(&m, r#"{"touser":"@all"}"#), Ok((10, vec![])));
        for body in [r#"{"touser":"@ALL"}"#, r#"{"touser":"@All|a"}"#, r#"{"touser":["@aLL"]}"#] {
            assert!(cost(&m, body).is_err_and(|e| e.contains("does not guess") && e.contains("\"@all\"")), "{body}");
        }
        assert!(cost(&m, r#"{"touser":"@all|@all"}"#).is_err_and(|e| e.contains("other recipients")));
    }

    #[test]
    fn a_rule_counting_calls_costs_one_whatever_the_recipients() {
        let m = Metering { by_recipients: false, ..wecom(None) };
        assert_eq!(cost(&m, r#"{"touser":"a|b|c"}"#), Ok((1, vec!["a".into(), "b".into(), "c".into()])));
    }
}
