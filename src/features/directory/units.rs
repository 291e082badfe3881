//! What WeCom's directory answers, read (pure): the units a broadcast is
//! resolved from, and the bounded in-process copy of them.
//!
//! - [`Unit::Visible`]: the app's visible range, `agent/get?agentid=`
//!   (doc 90227): `allow_userinfos.user[].userid`, `allow_partys.partyid[]`,
//!   `allow_tags.tagid[]`. `@all` is every member in it.
//! - [`Unit::Party`]: a department's members with its sub-departments',
//!   `user/simplelist?department_id=&fetch_child=1` (doc 90200):
//!   `userlist[].userid`. The app must see the department.
//! - [`Unit::Tag`]: a tag's members, `tag/get?tagid=` (doc 90213):
//!   `userlist[].userid` and `partylist[]` (departments, resolved as
//!   [`Unit::Party`]).
//!
//! Member ids are folded to ASCII lower case (WeCom userids are
//! case-insensitive), as `crate::proxy::meter` folds a `touser`'s.

use std::collections::HashMap;
use std::sync::Arc;

use crate::time::Micros;

/// One unit of WeCom's directory that a broadcast names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    Visible,
    Party(u32),
    Tag(u32),
}

impl Unit {
    /// The API path and query (without the token) that fetches it.
    pub fn target(self, agent: &str) -> String {
        match self {
            Unit::Visible => format!("/cgi-bin/agent/get?agentid={agent}"),
            Unit::Party(id) => format!("/cgi-bin/user/simplelist?department_id={id}&fetch_child=1"),
            Unit::Tag(id) => format!("/cgi-bin/tag/get?tagid={id}"),
        }
    }

    /// Its name in a store slot and a metric's `api` label.
    pub fn api(self) -> &'static str {
        match self {
            Unit::Visible => "agent_get",
            Unit::Party(_) => "user_simplelist",
            Unit::Tag(_) => "tag_get",
        }
    }

    /// Its name in a store slot.
    pub fn slot_part(self) -> String {
        match self {
            Unit::Visible => "all".into(),
            Unit::Party(id) => format!("p{id}"),
            Unit::Tag(id) => format!("t{id}"),
        }
    }
}

/// What a unit holds: members, and the departments and tags it names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Members {
    pub users: Vec<Box<str>>,
    pub parties: Vec<u32>,
    pub tags: Vec<u32>,
}

impl Members {
    /// Ids held: what the cache's bound counts (at least 1: an empty unit,
    /// a department that does not exist, is an entry too).
    pub fn weight(&self) -> u64 {
        (self.users.len() + self.parties.len() + self.tags.len()).max(1) as u64
    }

    /// The form kept in a store slot (sealed there): one line of users
    /// separated by `|` (a userid never holds one), then parties, then tags.
    pub fn encode(&self) -> String {
        let join = |ids: &[u32]| ids.iter().map(u32::to_string).collect::<Vec<_>>().join("|");
        let users: Vec<&str> = self.users.iter().map(|u| &**u).collect();
        format!("{}\n{}\n{}", users.join("|"), join(&self.parties), join(&self.tags))
    }

    pub fn decode(text: &str) -> Option<Members> {
        let mut lines = text.split('\n');
        let users = lines.next()?.split('|').filter(|u| !u.is_empty()).map(Box::from).collect();
        let ids = |line: Option<&str>| -> Option<Vec<u32>> {
            line?.split('|').filter(|p| !p.is_empty()).map(|p| p.parse().ok()).collect()
        };
        let parties = ids(lines.next())?;
        let tags = ids(lines.next())?;
        Some(Members { users, parties, tags })
    }
}

/// Why WeCom's answer to a unit's fetch gave no members.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// The app may not read it (60011 and kin): a configuration matter.
    Denied(i64),
    /// Anything else (a system error, an unreadable answer): try later.
    Failed(String),
}

/// WeCom's errcodes for a department or tag that does not exist: the
/// unit reaches nobody (WeCom answers it `invalidparty`/`invalidtag`).
const GONE: [i64; 3] = [60003, 40068, 60123];

/// WeCom's errcodes for an app not allowed to read its directory (60011
/// no privilege, 48002 API forbidden, 301002 not the app's, 60020 IP not
/// allowed).
const DENIED: [i64; 4] = [60011, 48002, 301002, 60020];

/// Most bytes one folded member id may have (WeCom's are at most 64).
const MAX_ID: usize = 256;

/// WeCom's answer as read: only the fields a unit needs (a member's name,
/// departments and the rest are skipped unread).
#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct Answer {
    errcode: i64,
    allow_userinfos: Option<UserList>,
    allow_partys: Option<PartyIds>,
    allow_tags: Option<TagIds>,
    userlist: Vec<User>,
    partylist: Vec<u64>,
}

#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct UserList {
    user: Vec<User>,
}

#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct PartyIds {
    partyid: Vec<u64>,
}

#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct TagIds {
    tagid: Vec<u64>,
}

#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct User {
    userid: String,
}

/// The members of `unit` in WeCom's `answer` (errcode 0), or why none.
pub fn read(unit: Unit, answer: &[u8]) -> Result<Members, Refused> {
    let a: Answer =
        serde_json::from_slice(answer).map_err(|_| Refused::Failed("an answer that is not WeCom's JSON".into()))?;
    if GONE.contains(&a.errcode) && unit != Unit::Visible {
        return Ok(Members::default());
    }
    if DENIED.contains(&a.errcode) {
        return Err(Refused::Denied(a.errcode));
    }
    if a.errcode != 0 {
        return Err(Refused::Failed(format!("errcode {}", a.errcode)));
    }
    let ids = |v: Vec<u64>| -> Vec<u32> { v.into_iter().filter_map(|p| u32::try_from(p).ok()).collect() };
    let users = |v: Vec<User>| -> Vec<Box<str>> {
        let mut out: Vec<Box<str>> = v
            .into_iter()
            .filter_map(|u| {
                let id = u.userid.trim();
                (!id.is_empty() && id.len() <= MAX_ID && !id.contains('|'))
                    .then(|| id.to_ascii_lowercase().into_boxed_str())
            })
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    };
    Ok(match unit {
        Unit::Visible => Members {
            users: users(a.allow_userinfos.unwrap_or_default().user),
            parties: ids(a.allow_partys.unwrap_or_default().partyid),
            tags: ids(a.allow_tags.unwrap_or_default().tagid),
        },
        Unit::Party(_) => Members { users: users(a.userlist), parties: Vec::new(), tags: Vec::new() },
        Unit::Tag(_) => Members { users: users(a.userlist), parties: ids(a.partylist), tags: Vec::new() },
    })
}

/// A unit's key in the cache: (corpid, AgentId, unit).
pub type Key = (Arc<str>, Arc<str>, Unit);

/// A unit as this instance holds it.
#[derive(Debug, Clone)]
pub struct Held {
    pub members: Arc<Members>,
    /// Used until then (this process's clock).
    pub until: Micros,
    /// Refreshed in the background from then.
    pub refresh_at: Micros,
    /// When a call last used it, as a sequence number of uses (the least
    /// recently used goes first; set by the cache).
    pub used: u64,
    /// A background refresh is under way.
    pub refreshing: bool,
}

/// The units held, at most `max` ids in all ([`Members::weight`]).
#[derive(Debug, Default)]
pub struct Cache {
    held: HashMap<Key, Held>,
    weight: u64,
    /// Uses so far (each use's [`Held::used`]).
    uses: u64,
}

impl Cache {
    /// The unit, if held and not past its time.
    pub fn get(&mut self, key: &Key, now: Micros) -> Option<&mut Held> {
        let h = self.held.get_mut(key)?;
        if now >= h.until {
            return None;
        }
        self.uses += 1;
        h.used = self.uses;
        Some(h)
    }

    /// Holds `members` for `key`, dropping the least recently used units
    /// (and any past their time) until every unit fits in `max` ids;
    /// `false` when this one alone does not.
    pub fn put(&mut self, key: Key, mut held: Held, now: Micros, max: u64) -> bool {
        let weight = held.members.weight();
        self.uses += 1;
        held.used = self.uses;
        if weight > max {
            return false;
        }
        if let Some(old) = self.held.remove(&key) {
            self.weight -= old.members.weight();
        }
        if self.weight + weight > max {
            self.held.retain(|_, h| {
                let keep = h.until > now;
                if !keep {
                    self.weight -= h.members.weight();
                }
                keep
            });
            let mut by_use: Vec<(u64, Key)> = self.held.iter().map(|(k, h)| (h.used, k.clone())).collect();
            by_use.sort_unstable_by_key(|(used, _)| *used);
            for (_, k) in by_use {
                if self.weight + weight <= max {
                    break;
                }
                if let Some(h) = self.held.remove(&k) {
                    self.weight -= h.members.weight();
                }
            }
        }
        self.weight += weight;
        self.held.insert(key, held);
        true
    }

    /// Ids held ([`Members::weight`] summed).
    pub fn weight(&self) -> u64 {
        self.weight
    }

    /// Units held.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Marks `key`'s refresh over (its fetch failed: the held copy is used
    /// until its time and the next use tries again).
    pub fn refreshed(&mut self, key: &Key) {
        if let Some(h) = self.held.get_mut(key) {
            h.refreshing = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wecoms_answers_are_read_as_its_docs_give_them() {
        let agent = br#"{"errcode":0,"errmsg":"ok","agentid":1000002,"allow_userinfos":{"user":[{"userid":"Alice"},{"userid":"bob"}]},
            "allow_partys":{"partyid":[2,3]},"allow_tags":{"tagid":[5]}}"#;
        let m = read(Unit::Visible, agent).expect("read");
        assert_eq!(m.users, vec![Box::from("alice"), Box::from("bob")]);
        assert_eq!((m.parties, m.tags), (vec![2, 3], vec![5]));
        let list =
            br#"{"errcode":0,"userlist":[{"userid":"a","name":"A","department":[2]},{"userid":"B"},{"userid":"a"}]}"#;
        assert_eq!(read(Unit::Party(2), list).map(|m| m.users.len()), Ok(2));
        let tag = br#"{"errcode":0,"tagname":"t","userlist":[{"userid":"x","name":"X"}],"partylist":[4]}"#;
        let m = read(Unit::Tag(5), tag).expect("tag");
        assert_eq!((m.users.len(), m.parties), (1, vec![4]));
        assert_eq!(read(Unit::Party(2), br#"{"errcode":60011,"errmsg":"no privilege"}"#), Err(Refused::Denied(60011)));
        assert_eq!(
            read(Unit::Party(9), br#"{"errcode":60003,"errmsg":"department not found"}"#),
            Ok(Members::default())
        );
        assert!(matches!(read(Unit::Visible, br#"{"errcode":-1}"#), Err(Refused::Failed(_))));
        assert!(matches!(read(Unit::Visible, b"<html>"), Err(Refused::Failed(_))));
    }

    #[test]
    fn the_stored_form_reads_back() {
        let m = Members { users: vec!["a".into(), "b-c".into()], parties: vec![2, 30], tags: vec![] };
        assert_eq!(Members::decode(&m.encode()), Some(m));
        assert_eq!(Members::decode(&Members::default().encode()), Some(Members::default()));
        assert_eq!(Members::decode("a\nx\n"), None);
    }

    #[test]
    fn the_cache_keeps_at_most_its_bound_dropping_the_least_recently_used() {
        let mut c = Cache::default();
        let key = |n: u32| (Arc::from("corp"), Arc::from("1"), Unit::Party(n));
        let held = |n: usize| Held {
            members: Arc::new(Members { users: (0..n).map(|i| i.to_string().into()).collect(), ..Members::default() }),
            until: 1_000,
            refresh_at: 750,
            used: 0,
            refreshing: false,
        };
        assert!(c.put(key(1), held(400), 1, 1_000));
        assert!(c.put(key(2), held(400), 1, 1_000));
        assert!(c.get(&key(1), 1).is_some(), "1 used last now (at one moment of the clock: uses are counted)");
        assert!(c.put(key(3), held(400), 1, 1_000));
        assert_eq!(c.weight(), 800);
        assert!(c.get(&key(2), 5).is_none(), "the least recently used went");
        assert!(c.get(&key(1), 5).is_some());
        assert!(!c.put(key(4), held(1_001), 5, 1_000), "one unit over the bound is not held");
        assert!(c.get(&key(1), 1_000).is_none(), "past its time");
        assert!(c.weight() <= 1_000);
    }
}
