//! A mock WeCom (`qyapi.weixin.qq.com`) with a member directory, on
//! [`MockWeChat`] (every call recorded as for every mock): one corp's apps
//! get tokens, read the directory as far as their visible range goes, and
//! send app messages that reach members, who WeCom silently drops past 30
//! messages a minute or 1,000 an hour from one app. The directory is a
//! [`WeComDirectory`] (its fixed [`WeComDirectory::nested`] gives the numbers
//! tests rely on); the answers follow WeCom's documented shapes, each named
//! at its endpoint below (developer.work.weixin.qq.com/document/path/N).
//!
//! Errcodes, from WeCom's global errcode page (doc 90313): 40001 wrong
//! secret, 40013 wrong corpid, 41001 no token, 40014 unknown token, 42001
//! expired token, 40056 unknown agentid, 301002 another app's agentid ("not
//! allow operate another agent with this accesstoken"), 60011 outside the
//! app's range ("no privilege to access/modify contact/party/agent"), 60003
//! unknown department, 40068 unknown tag, 81013 every recipient invalid
//! ("user & party & tag all invalid"), -1 system busy.
//!
//! Time of a delivery comes from a clock the test gives
//! ([`MockWeCom::follow`] a gate's [`ManualClock`], or [`MockWeCom::set_clock`]);
//! until then the system clock.

pub mod directory;

#[allow(unused_imports)]
pub use directory::{WeComDirectory, AGENT_ALL, AGENT_PART, CORPID, ROOT, SECRET_ALL, SECRET_PART};

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use directory::Reach;
use wxgate::time::{Clock, ManualClock, SystemClock};

use super::{max_in_window, MockWeChat, Recorded, Reply, SEC};

/// The directory APIs (each counted in [`MockWeCom::directory_calls`], and
/// answered 502 or -1 while the directory is down or busy).
pub const AGENT_GET: &str = "/cgi-bin/agent/get";
pub const USER_SIMPLELIST: &str = "/cgi-bin/user/simplelist";
pub const DEPARTMENT_SIMPLELIST: &str = "/cgi-bin/department/simplelist";
pub const TAG_GET: &str = "/cgi-bin/tag/get";
pub const DIRECTORY_APIS: [&str; 4] = [AGENT_GET, USER_SIMPLELIST, DEPARTMENT_SIMPLELIST, TAG_GET];
pub const GETTOKEN: &str = "/cgi-bin/gettoken";
pub const MESSAGE_SEND: &str = "/cgi-bin/message/send";

/// WeCom's limits on app messages per member and app (doc 90236 / 90454):
/// past them a message is dropped without an errcode.
pub const PER_MINUTE: usize = 30;
pub const PER_HOUR: usize = 1_000;

/// One `message/send` WeCom accepted (errcode 0).
#[derive(Debug, Clone)]
pub struct Sent {
    pub agentid: i64,
    /// The mock's clock when it arrived, in microseconds.
    pub at: i64,
    /// Distinct members reached (person-times), those dropped included.
    pub reached: usize,
    /// Of those, dropped silently (over 30 a minute or 1,000 an hour).
    pub dropped: usize,
    pub invaliduser: Vec<String>,
    pub invalidparty: Vec<String>,
    pub invalidtag: Vec<String>,
}

type NowUs = Arc<dyn Fn() -> i64 + Send + Sync>;

/// A member's messages from one app, in the mock's clock (sorted).
#[derive(Default)]
struct Inbox {
    /// Every message addressed to them, dropped or not.
    sent: Vec<i64>,
    /// Those delivered.
    delivered: Vec<i64>,
}

#[derive(Default)]
struct State {
    dir: WeComDirectory,
    /// Token → (its app, expired).
    tokens: HashMap<String, (i64, bool)>,
    seq: u64,
    down: bool,
    busy: bool,
    denied: HashSet<i64>,
    refusing: HashMap<i64, i64>,
    calls: HashMap<String, usize>,
    calls_by: HashMap<(i64, String), usize>,
    inboxes: HashMap<(i64, usize), Inbox>,
    sends: Vec<Sent>,
    refused: HashMap<i64, usize>,
}

/// The mock WeCom; clones share it.
#[derive(Clone)]
pub struct MockWeCom {
    pub mock: MockWeChat,
    state: Arc<Mutex<State>>,
    clock: Arc<Mutex<NowUs>>,
}

impl MockWeCom {
    /// A mock WeCom on a free port serving `dir`.
    pub async fn start(dir: WeComDirectory) -> MockWeCom {
        let wecom = MockWeCom::on(MockWeChat::start().await, dir);
        wecom.mock.respond(wecom.responder());
        wecom
    }

    /// The WeCom state over `mock`, not yet answering: plug
    /// [`MockWeCom::responder`] in (e.g. wrapped to delay some answers).
    pub fn on(mock: MockWeChat, dir: WeComDirectory) -> MockWeCom {
        let state = State { dir, ..State::default() };
        let system: NowUs = Arc::new(|| SystemClock.now_us());
        MockWeCom { mock, state: Arc::new(Mutex::new(state)), clock: Arc::new(Mutex::new(system)) }
    }

    /// What the mock answers, for [`MockWeChat::respond`].
    pub fn responder(&self) -> impl Fn(&Recorded) -> Reply + Send + Sync + 'static {
        let me = self.clone();
        move |rec| me.reply(rec)
    }

    /// The base URL, `http://127.0.0.1:port`.
    pub fn url(&self) -> String {
        self.mock.url()
    }

    /// Deliveries are timed by `clock` (e.g. a gate's) from now on.
    pub fn follow(&self, clock: &ManualClock) {
        let clock = clock.clone();
        self.set_clock(move || clock.now_us());
    }

    /// Deliveries are timed by `now_us` (microseconds) from now on.
    pub fn set_clock(&self, now_us: impl Fn() -> i64 + Send + Sync + 'static) {
        *self.clock.lock().expect("clock") = Arc::new(now_us);
    }

    /// A valid token of app `agentid`, as `gettoken` would give (not counted
    /// as a call).
    pub fn issue_token(&self, agentid: i64) -> String {
        let mut s = self.state();
        s.seq += 1;
        let token = format!("TOK-{agentid}-{}", s.seq);
        s.tokens.insert(token.clone(), (agentid, false));
        token
    }

    /// Every token issued so far answers 42001 (expired) from now on.
    pub fn expire_tokens(&self) {
        for t in self.state().tokens.values_mut() {
            t.1 = true;
        }
    }

    // Controls.

    /// Adds `userid` (a new member, or one already there in one more
    /// department) to `department`: seen by the directory APIs and reached by
    /// sends from now on.
    pub fn add_member(&self, userid: &str, department: u32) {
        self.state().dir.member(userid, &[department]);
    }

    /// Removes `userid` from the corp ([`WeComDirectory::remove_member`]).
    pub fn remove_member(&self, userid: &str) {
        self.state().dir.remove_member(userid);
    }

    /// While down, every directory API answers HTTP 502 (a gateway's
    /// answer, no JSON); gettoken and message/send go on.
    pub fn set_directory_down(&self, down: bool) {
        self.state().down = down;
    }

    /// While busy, every directory API answers errcode -1 "system busy".
    pub fn set_directory_busy(&self, busy: bool) {
        self.state().busy = busy;
    }

    /// App `agentid`'s directory calls answer 60011 (an app without
    /// directory permission) until [`MockWeCom::allow_directory`].
    pub fn deny_directory(&self, agentid: i64) {
        self.state().denied.insert(agentid);
    }

    pub fn allow_directory(&self, agentid: i64) {
        self.state().denied.remove(&agentid);
    }

    /// App `agentid`'s message/send answers `errcode` (e.g. 45009: its
    /// message quota) and delivers nothing, until cleared; other apps go on.
    pub fn refuse_sends(&self, agentid: i64, errcode: i64) {
        self.state().refusing.insert(agentid, errcode);
    }

    pub fn clear_refusal(&self, agentid: i64) {
        self.state().refusing.remove(&agentid);
    }

    /// A copy of the directory as it is now.
    pub fn directory(&self) -> WeComDirectory {
        self.state().dir.clone()
    }

    // Counters.

    /// Calls at `path` (e.g. [`USER_SIMPLELIST`]), whatever their answer.
    pub fn calls_to(&self, path: &str) -> usize {
        self.state().calls.get(path).copied().unwrap_or(0)
    }

    /// Calls at `path` with a valid token of app `agentid`.
    pub fn calls_by(&self, agentid: i64, path: &str) -> usize {
        self.state().calls_by.get(&(agentid, path.to_owned())).copied().unwrap_or(0)
    }

    /// Calls at the four directory APIs, whatever their answer.
    pub fn directory_calls(&self) -> usize {
        DIRECTORY_APIS.iter().map(|p| self.calls_to(p)).sum()
    }

    /// Every message/send accepted (errcode 0), in arrival order.
    pub fn sends(&self) -> Vec<Sent> {
        self.state().sends.clone()
    }

    /// Person-times of app `agentid`: members reached by its accepted sends,
    /// dropped ones included (WeCom's quota counts what was sent).
    pub fn person_times(&self, agentid: i64) -> usize {
        self.state().sends.iter().filter(|s| s.agentid == agentid).map(|s| s.reached).sum()
    }

    /// Deliveries dropped silently, every app.
    pub fn silent_drops(&self) -> usize {
        self.state().sends.iter().map(|s| s.dropped).sum()
    }

    /// When `member` (any case) got a message of app `agentid` delivered,
    /// in the mock's clock, earliest first.
    pub fn deliveries(&self, agentid: i64, member: &str) -> Vec<i64> {
        let s = self.state();
        let Some(i) = s.dir.find(member) else { return Vec::new() };
        s.inboxes.get(&(agentid, i)).map(|b| b.delivered.clone()).unwrap_or_default()
    }

    /// The most messages of app `agentid` any member was sent in any 60 s
    /// (dropped ones included: what the sender let through, so a gate that
    /// kept every member under WeCom's limit shows at most 30 here).
    pub fn max_per_minute(&self, agentid: i64) -> usize {
        self.max_in(agentid, 60 * SEC)
    }

    /// Like [`MockWeCom::max_per_minute`], in any hour.
    pub fn max_per_hour(&self, agentid: i64) -> usize {
        self.max_in(agentid, 3600 * SEC)
    }

    /// message/sends of app `agentid` refused by [`MockWeCom::refuse_sends`].
    pub fn refused(&self, agentid: i64) -> usize {
        self.state().refused.get(&agentid).copied().unwrap_or(0)
    }

    fn max_in(&self, agentid: i64, span: i64) -> usize {
        let s = self.state();
        s.inboxes
            .iter()
            .filter(|((a, _), _)| *a == agentid)
            .map(|(_, b)| max_in_window(&b.sent, span))
            .max()
            .unwrap_or(0)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("wecom state")
    }

    fn now_us(&self) -> i64 {
        let clock = self.clock.lock().expect("clock").clone();
        clock()
    }

    fn reply(&self, rec: &Recorded) -> Reply {
        let now = self.now_us();
        let (path, query) = rec.path_and_query.split_once('?').unwrap_or((&rec.path_and_query, ""));
        let q = Query(query);
        let mut s = self.state();
        *s.calls.entry(path.to_owned()).or_default() += 1;
        if path == GETTOKEN {
            return gettoken(&mut s, &q);
        }
        let directory = DIRECTORY_APIS.contains(&path);
        if directory && s.down {
            return Reply::Status { status: 502, body: "502 Bad Gateway".into() };
        }
        if directory && s.busy {
            return err(-1, "system busy");
        }
        let token = q.get("access_token").unwrap_or("");
        let agentid = match s.tokens.get(token) {
            _ if token.is_empty() => return err(41001, "access_token missing"),
            None => return err(40014, "invalid access_token"),
            Some((_, true)) => return err(42001, "access_token expired"),
            Some((agentid, false)) => *agentid,
        };
        *s.calls_by.entry((agentid, path.to_owned())).or_default() += 1;
        if directory && s.denied.contains(&agentid) {
            return err(60011, "no privilege to access/modify contact/party/agent");
        }
        match path {
            AGENT_GET => agent_get(&s.dir, agentid, &q),
            USER_SIMPLELIST => user_simplelist(&s.dir, agentid, &q),
            DEPARTMENT_SIMPLELIST => department_simplelist(&s.dir, agentid, &q),
            TAG_GET => tag_get(&s.dir, agentid, &q),
            MESSAGE_SEND => message_send(&mut s, agentid, &rec.body, now),
            _ => json(r#"{"errcode":0,"errmsg":"ok"}"#.to_owned()),
        }
    }
}

/// GET /cgi-bin/gettoken?corpid=&corpsecret= (doc 91039): one token per
/// app, whose secret it is; a new one each call, the earlier ones staying
/// valid (as WeCom's do within their 7200 s).
fn gettoken(s: &mut State, q: &Query) -> Reply {
    if q.get("corpid") != Some(CORPID) {
        return err(40013, "invalid corpid");
    }
    let Some(agentid) = q.get("corpsecret").and_then(|secret| s.dir.app_with_secret(secret)) else {
        return err(40001, "invalid credential");
    };
    s.seq += 1;
    let token = format!("TOK-{agentid}-{}", s.seq);
    s.tokens.insert(token.clone(), (agentid, false));
    json(format!(r#"{{"errcode":0,"errmsg":"ok","access_token":"{token}","expires_in":7200}}"#))
}

/// GET /cgi-bin/agent/get?agentid= (doc 90227): the token's own app only.
fn agent_get(dir: &WeComDirectory, agentid: i64, q: &Query) -> Reply {
    let asked = q.get("agentid").and_then(|a| a.parse::<i64>().ok());
    let Some(app) = asked.and_then(|a| dir.app_of(a)) else { return err(40056, "invalid agentid") };
    if asked != Some(agentid) {
        return err(301002, "not allow operate another agent with this accesstoken.");
    }
    let users: Vec<String> = app.users.iter().map(|u| format!(r#"{{"userid":{}}}"#, quoted(u))).collect();
    json(format!(
        r#"{{"errcode":0,"errmsg":"ok","agentid":{agentid},"name":"App {agentid}","square_logo_url":"","description":"",
"allow_userinfos":{{"user":[{}]}},"allow_partys":{{"partyid":[{}]}},"allow_tags":{{"tagid":[{}]}},
"close":0,"redirect_domain":"","report_location_flag":0,"isreportenter":0,"home_url":""}}"#,
        users.join(","),
        joined(&app.parties),
        joined(&app.tags)
    ))
}

/// GET /cgi-bin/user/simplelist?department_id=&fetch_child=0|1 (doc 90200,
/// "获取部门成员"): the app must see the department (60011 otherwise); each member
/// once, with all their departments. `open_userid` is what WeCom gives
/// third-party apps; here every app gets it.
fn user_simplelist(dir: &WeComDirectory, agentid: i64, q: &Query) -> Reply {
    let Some(id) = q.get("department_id").and_then(|d| d.parse::<u32>().ok()) else {
        return err(60003, "department not found");
    };
    if dir.parent_of(id).is_none() {
        return err(60003, "department not found");
    }
    if !dir.parties_in_range(agentid).contains(&id) {
        return err(60011, "no privilege to access/modify contact/party/agent");
    }
    let mut reach = Reach::new(dir.len());
    dir.reach_party(&mut reach, id, q.get("fetch_child") == Some("1"));
    let mut body = String::with_capacity(64 + reach.len() * 96);
    body.push_str(r#"{"errcode":0,"errmsg":"ok","userlist":["#);
    for (n, &i) in reach.order.iter().enumerate() {
        let m = &dir.members()[i];
        if n > 0 {
            body.push(',');
        }
        body.push_str(r#"{"userid":"#);
        body.push_str(&quoted(&m.userid));
        body.push_str(r#","name":"#);
        body.push_str(&quoted(&m.name));
        body.push_str(r#","department":["#);
        body.push_str(&joined(&m.department));
        body.push_str(r#"],"open_userid":"#);
        body.push_str(&quoted(&format!("wo{}", m.userid.to_lowercase())));
        body.push('}');
    }
    body.push_str("]}");
    json(body)
}

/// GET /cgi-bin/department/simplelist?id= ("获取子部门ID列表", doc 95406's
/// shape and permission table): department `id` and every one under it, or
/// without `id` every department in the app's range; a self-built app sees
/// only its range (60011).
fn department_simplelist(dir: &WeComDirectory, agentid: i64, q: &Query) -> Reply {
    let range = dir.parties_in_range(agentid);
    let ids: Vec<u32> = match q.get("id").filter(|i| !i.is_empty()) {
        Some(id) => {
            let Some(id) = id.parse::<u32>().ok().filter(|i| dir.parent_of(*i).is_some()) else {
                return err(60003, "department not found");
            };
            if !range.contains(&id) {
                return err(60011, "no privilege to access/modify contact/party/agent");
            }
            dir.subtree(id)
        }
        None => {
            let mut ids: Vec<u32> = range.into_iter().collect();
            ids.sort_unstable();
            ids
        }
    };
    let list: Vec<String> = ids
        .iter()
        .map(|&id| {
            let parent = dir.parent_of(id).unwrap_or(0);
            format!(r#"{{"id":{id},"parentid":{parent},"order":{}}}"#, 100_000_000 - id)
        })
        .collect();
    json(format!(r#"{{"errcode":0,"errmsg":"ok","department_id":[{}]}}"#, list.join(",")))
}

/// GET /cgi-bin/tag/get?tagid= (doc 90213): any tag of the corp ("无限制"),
/// but only the members and departments inside the app's visible range are
/// listed; an unknown tag is 40068.
fn tag_get(dir: &WeComDirectory, agentid: i64, q: &Query) -> Reply {
    let Some(tag) = q.get("tagid").and_then(|t| t.parse::<u32>().ok()).and_then(|t| dir.tag_of(t)) else {
        return err(40068, "invalid tagid");
    };
    let visible = dir.visible_reach(agentid);
    let range = dir.parties_in_range(agentid);
    let users: Vec<String> = tag
        .users
        .iter()
        .filter_map(|u| dir.find(u))
        .filter(|&i| visible.contains(i))
        .map(|i| {
            let m = &dir.members()[i];
            format!(r#"{{"userid":{},"name":{}}}"#, quoted(&m.userid), quoted(&m.name))
        })
        .collect();
    let parties: Vec<u32> = tag.parties.iter().copied().filter(|p| range.contains(p)).collect();
    json(format!(
        r#"{{"errcode":0,"errmsg":"ok","tagname":{},"userlist":[{}],"partylist":[{}]}}"#,
        quoted(&tag.name),
        users.join(","),
        joined(&parties)
    ))
}

/// POST /cgi-bin/message/send (doc 90236 / 90372): `touser` ("|"-separated,
/// or "@all": the app's visible range, toparty and totag then ignored),
/// `toparty` (with sub-departments) and `totag` (its members and
/// departments), each member once. Recipients unknown or outside the range
/// come back in `invaliduser` (lowercased, as WeCom does) / `invalidparty` /
/// `invalidtag` with errcode 0; all invalid is 81013. A member over 30 a
/// minute or 1,000 an hour from this app is dropped silently.
fn message_send(s: &mut State, agentid: i64, body: &[u8], now: i64) -> Reply {
    let Ok(msg) = serde_json::from_slice::<serde_json::Value>(body) else {
        return err(47001, "data format error");
    };
    let sent_as = match &msg["agentid"] {
        serde_json::Value::Number(n) => n.as_i64(),
        serde_json::Value::String(t) => t.parse().ok(),
        _ => None,
    };
    match sent_as {
        None => return err(41011, "missing agentid"),
        Some(a) if a != agentid => return err(301002, "not allow operate another agent with this accesstoken."),
        Some(_) => {}
    }
    if let Some(&code) = s.refusing.get(&agentid) {
        *s.refused.entry(agentid).or_default() += 1;
        return err(code, if code == 45009 { "api freq out of limit" } else { "refused by the mock" });
    }
    let ids = |field: &str| -> Vec<String> {
        msg[field]
            .as_str()
            .unwrap_or("")
            .split('|')
            .map(str::trim)
            .filter(|i| !i.is_empty())
            .map(str::to_owned)
            .collect()
    };
    let (touser, toparty, totag) = (ids("touser"), ids("toparty"), ids("totag"));
    let dir = &s.dir;
    let visible = dir.visible_reach(agentid);
    let mut reach = Reach::new(dir.len());
    // Whether any recipient named is valid: only when none is, WeCom
    // refuses the message (a valid department with no members is no error).
    let mut any_valid = false;
    let (mut invaliduser, mut invalidparty, mut invalidtag) = (Vec::new(), Vec::new(), Vec::new());
    if touser.len() == 1 && touser[0] == "@all" {
        for &i in &visible.order {
            reach.mark(i);
        }
        any_valid = reach.len() > 0;
    } else {
        for u in touser {
            match dir.find(&u).filter(|&i| visible.contains(i)) {
                Some(i) => {
                    any_valid = true;
                    reach.mark(i);
                }
                None => invaliduser.push(u.to_lowercase()),
            }
        }
        let range = dir.parties_in_range(agentid);
        for p in toparty {
            match p.parse::<u32>().ok().filter(|p| range.contains(p)) {
                Some(p) => {
                    any_valid = true;
                    dir.reach_party(&mut reach, p, true);
                }
                None => invalidparty.push(p),
            }
        }
        for t in totag {
            match t.parse::<u32>().ok().filter(|t| dir.tag_of(*t).is_some()) {
                Some(t) => {
                    any_valid = true;
                    let mut members = Reach::new(dir.len());
                    dir.reach_tag(&mut members, t);
                    for &i in members.order.iter().filter(|&&i| visible.contains(i)) {
                        reach.mark(i);
                    }
                }
                None => invalidtag.push(t),
            }
        }
    }
    if !any_valid {
        return err(81013, "user & party & tag all invalid");
    }
    let mut dropped = 0;
    for &i in &reach.order {
        let inbox = s.inboxes.entry((agentid, i)).or_default();
        if !deliver(inbox, now) {
            dropped += 1;
        }
    }
    s.seq += 1;
    let reply = format!(
        r#"{{"errcode":0,"errmsg":"ok","invaliduser":{},"invalidparty":{},"invalidtag":{},"unlicenseduser":"","msgid":"MSG-{agentid}-{}"}}"#,
        quoted(&invaliduser.join("|")),
        quoted(&invalidparty.join("|")),
        quoted(&invalidtag.join("|")),
        s.seq
    );
    s.sends.push(Sent { agentid, at: now, reached: reach.len(), dropped, invaliduser, invalidparty, invalidtag });
    json(reply)
}

/// Which of these messages to one member from one app (their arrival
/// times, in order) WeCom drops: [`deliver`] one after another, the rule the
/// mock applies to every send.
pub fn dropped(times: &[i64]) -> Vec<bool> {
    let mut inbox = Inbox::default();
    times.iter().map(|&t| !deliver(&mut inbox, t)).collect()
}

/// Files one message for a member at `now`; false if WeCom drops it: the
/// member already had [`PER_MINUTE`] delivered in the 60 s up to `now`, or
/// [`PER_HOUR`] in the hour (windows `(now - span, now]`, so a message
/// exactly 60 s after another no longer counts it).
fn deliver(inbox: &mut Inbox, now: i64) -> bool {
    let at = inbox.sent.partition_point(|&t| t <= now);
    inbox.sent.insert(at, now);
    let d = &inbox.delivered;
    let upto = d.partition_point(|&t| t <= now);
    let within = |span: i64| upto - d.partition_point(|&t| t <= now - span);
    if within(60 * SEC) >= PER_MINUTE || within(3600 * SEC) >= PER_HOUR {
        return false;
    }
    inbox.delivered.insert(upto, now);
    true
}

/// A query string's parameters (WeCom's are plain: no percent-decoding).
struct Query<'a>(&'a str);

impl Query<'_> {
    fn get(&self, name: &str) -> Option<&str> {
        self.0.split('&').find_map(|p| p.strip_prefix(name)?.strip_prefix('='))
    }
}

/// WeCom's error answer: errcode, errmsg with its hint and look-up link.
fn err(code: i64, msg: &str) -> Reply {
    json(format!(
        r#"{{"errcode":{code},"errmsg":"{msg}, hint: [1764381600_mock_{code}], from ip: 127.0.0.1, more info at https://open.work.weixin.qq.com/devtool/query?e={code}"}}"#
    ))
}

fn json(body: String) -> Reply {
    Reply::Json { body, content_type: "application/json; charset=UTF-8" }
}

/// `s` as a JSON string.
fn quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn joined<T: ToString>(xs: &[T]) -> String {
    xs.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
}
