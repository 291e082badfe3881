//! WeCom's directory as the mock ([`super::MockWeCom`]) keeps it: departments
//! in a tree (root 1), members in departments, tags of members and
//! departments, and one corp's self-built apps with their secret and visible
//! range. The mock answers WeCom's directory APIs and resolves
//! `message/send`'s recipients from it; a test reads the numbers it relies on
//! from the constants of [`WeComDirectory::nested`] and can check them against
//! the resolutions here ([`WeComDirectory::visible`], [`WeComDirectory::party`],
//! [`WeComDirectory::tag_members`]).
//!
//! Userids are case-insensitive, as WeCom's: looked up lowercased, kept as
//! written.

use std::collections::{BTreeMap, HashMap, HashSet};

/// The corp every WeCom directory test uses.
pub const CORPID: &str = "wwWECOMDIRCORP01";
/// The app that sees the whole corp, and its secret.
pub const AGENT_ALL: i64 = 1_000_002;
pub const SECRET_ALL: &str = "SEKRIT_AGENT_1000002_7f3e9a";
/// The app that sees a part of it (in [`WeComDirectory::nested`]:
/// department 2 with its sub-department 3, tag 5, and ten more members).
pub const AGENT_PART: i64 = 1_000_003;
pub const SECRET_PART: &str = "SEKRIT_AGENT_1000003_b41c2d";

/// The root department: the corp itself (WeCom: `parentid` 0).
pub const ROOT: u32 = 1;

/// One member: their userid as written, name, and departments.
#[derive(Debug, Clone)]
pub struct Member {
    pub userid: String,
    pub name: String,
    pub department: Vec<u32>,
}

/// A tag: its name, the members and the departments it holds.
#[derive(Debug, Clone, Default)]
pub struct Tag {
    pub name: String,
    pub users: Vec<String>,
    pub parties: Vec<u32>,
}

/// A self-built app: its secret and visible range (agent/get's
/// `allow_userinfos`, `allow_partys`, `allow_tags`).
#[derive(Debug, Clone, Default)]
pub struct App {
    pub secret: String,
    pub users: Vec<String>,
    pub parties: Vec<u32>,
    pub tags: Vec<u32>,
}

/// A corp's directory. Built with [`WeComDirectory::new`] and its adders, or
/// one of the fixed directories [`WeComDirectory::nested`] and
/// [`WeComDirectory::large`].
#[derive(Debug, Clone)]
pub struct WeComDirectory {
    /// Department → its parent (the root's is 0), ordered by id.
    parent: BTreeMap<u32, u32>,
    children: HashMap<u32, Vec<u32>>,
    members: Vec<Member>,
    /// Lowercased userid → index in `members`.
    index: HashMap<String, usize>,
    /// Department → its own members (not its sub-departments'), by index.
    direct: HashMap<u32, Vec<usize>>,
    tags: BTreeMap<u32, Tag>,
    apps: BTreeMap<i64, App>,
}

impl Default for WeComDirectory {
    fn default() -> Self {
        WeComDirectory::new()
    }
}

impl WeComDirectory {
    /// Members in [`WeComDirectory::nested`].
    pub const MEMBERS: usize = 500;
    /// [`AGENT_ALL`]'s visible range there (`@all`): everyone.
    pub const VISIBLE_ALL: usize = 500;
    /// [`AGENT_PART`]'s visible range there (`@all`): department 2's 120,
    /// tag 5's 20 members outside it, and 10 members named one by one.
    pub const VISIBLE_PART: usize = 150;
    /// A department with a sub-department: `toparty=2` reaches
    /// [`Self::PARTY_MEMBERS`], of whom [`Self::SUB_PARTY_MEMBERS`] are in
    /// [`Self::SUB_PARTY`] (5 of those are in both).
    pub const PARTY: u32 = 2;
    pub const PARTY_MEMBERS: usize = 120;
    /// Department 2's own members (`user/simplelist` with `fetch_child=0`):
    /// its 90 and the 5 of department 3 also in it.
    pub const PARTY_OWN_MEMBERS: usize = 95;
    pub const SUB_PARTY: u32 = 3;
    pub const SUB_PARTY_MEMBERS: usize = 30;
    /// A tag of 30 members and department 3, 10 of those members in
    /// department 3: [`Self::TAG_MEMBERS`] distinct members.
    pub const TAG: u32 = 5;
    pub const TAG_MEMBERS: usize = 50;
    /// A tag of 5 members of department 4, outside [`AGENT_PART`]'s range.
    pub const OTHER_TAG: u32 = 6;
    /// Departments of [`WeComDirectory::nested`], root included.
    pub const DEPARTMENTS: usize = 7;

    /// A directory of the root department alone, no members, tags or apps.
    pub fn new() -> WeComDirectory {
        let mut parent = BTreeMap::new();
        parent.insert(ROOT, 0);
        WeComDirectory {
            parent,
            children: HashMap::new(),
            members: Vec::new(),
            index: HashMap::new(),
            direct: HashMap::new(),
            tags: BTreeMap::new(),
            apps: BTreeMap::new(),
        }
    }

    /// 500 members in nested departments, two tags and both apps:
    ///
    /// ```text
    /// 1 root            user001..user010
    /// ├─ 2              user011..user100, and user101..user105
    /// │  └─ 3           user101..user130
    /// ├─ 4              user131..user230
    /// │  └─ 5           user231..user310
    /// │     └─ 6        user311..user350
    /// └─ 7              user351..user500
    /// tag 5: user101..user110, user351..user370, department 3
    /// tag 6: user131..user135
    /// app 1000002: department 1                       (sees 500)
    /// app 1000003: department 2, tag 5, user491..user500 (sees 150)
    /// ```
    pub fn nested() -> WeComDirectory {
        let mut d = WeComDirectory::new();
        for (id, parent) in [(2, 1), (3, 2), (4, 1), (5, 4), (6, 5), (7, 1)] {
            d.department(id, parent);
        }
        let user = |n: usize| format!("user{n:03}");
        for (range, dept) in [(1..=10, 1), (11..=100, 2), (101..=130, 3), (131..=230, 4), (231..=310, 5)] {
            for n in range {
                d.member(&user(n), &[dept]);
            }
        }
        for n in 311..=350 {
            d.member(&user(n), &[6]);
        }
        for n in 351..=500 {
            d.member(&user(n), &[7]);
        }
        for n in 101..=105 {
            d.member(&user(n), &[2]);
        }
        let tag5: Vec<String> = (101..=110).chain(351..=370).map(user).collect();
        d.tag(Self::TAG, "volunteers", &tag5.iter().map(String::as_str).collect::<Vec<_>>(), &[3]);
        let tag6: Vec<String> = (131..=135).map(user).collect();
        d.tag(Self::OTHER_TAG, "auditors", &tag6.iter().map(String::as_str).collect::<Vec<_>>(), &[]);
        d.app(AGENT_ALL, SECRET_ALL, &[], &[ROOT], &[]);
        let named: Vec<String> = (491..=500).map(user).collect();
        d.app(AGENT_PART, SECRET_PART, &named.iter().map(String::as_str).collect::<Vec<_>>(), &[2], &[Self::TAG]);
        d
    }

    /// `n` members `u000001`.. spread over four departments (3 under 2, 4
    /// and 5 under the root), tag 5 holding department 4; [`AGENT_ALL`] sees
    /// everyone, [`AGENT_PART`] department 2 (with 3). Built in well under a
    /// second for 100,000.
    pub fn large(n: usize) -> WeComDirectory {
        let mut d = WeComDirectory::new();
        for (id, parent) in [(2, 1), (3, 2), (4, 1), (5, 1)] {
            d.department(id, parent);
        }
        d.members.reserve(n);
        d.index.reserve(n);
        for i in 0..n {
            let dept = 2 + (i % 4) as u32;
            d.member(&format!("u{:06}", i + 1), &[dept]);
        }
        d.tag(Self::TAG, "everyone in 4", &[], &[4]);
        d.app(AGENT_ALL, SECRET_ALL, &[], &[ROOT], &[]);
        d.app(AGENT_PART, SECRET_PART, &[], &[2], &[]);
        d
    }

    /// Adds department `id` under `parentid` (which must exist).
    pub fn department(&mut self, id: u32, parentid: u32) {
        assert!(self.parent.contains_key(&parentid), "department {id}: parent {parentid} unknown");
        assert!(self.parent.insert(id, parentid).is_none(), "department {id} twice");
        self.children.entry(parentid).or_default().push(id);
    }

    /// Adds member `userid` to `departments` (which must exist): a new
    /// member, or one already there (any case) in more departments.
    pub fn member(&mut self, userid: &str, departments: &[u32]) {
        for d in departments {
            assert!(self.parent.contains_key(d), "member {userid}: department {d} unknown");
        }
        let i = match self.index.get(&userid.to_lowercase()) {
            Some(&i) => i,
            None => {
                self.members.push(Member {
                    userid: userid.to_owned(),
                    name: format!("Member {userid}"),
                    department: Vec::new(),
                });
                self.index.insert(userid.to_lowercase(), self.members.len() - 1);
                self.members.len() - 1
            }
        };
        for &d in departments {
            if !self.members[i].department.contains(&d) {
                self.members[i].department.push(d);
                self.direct.entry(d).or_default().push(i);
            }
        }
    }

    /// Adds tag `tagid` holding these members and departments.
    pub fn tag(&mut self, tagid: u32, name: &str, users: &[&str], parties: &[u32]) {
        let users = users.iter().map(|u| (*u).to_owned()).collect();
        self.tags.insert(tagid, Tag { name: name.to_owned(), users, parties: parties.to_vec() });
    }

    /// Adds app `agentid` of the corp with this secret and visible range.
    pub fn app(&mut self, agentid: i64, secret: &str, users: &[&str], parties: &[u32], tags: &[u32]) {
        let users = users.iter().map(|u| (*u).to_owned()).collect();
        let app = App { secret: secret.to_owned(), users, parties: parties.to_vec(), tags: tags.to_vec() };
        self.apps.insert(agentid, app);
    }

    /// Members in the directory.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Every member, in the order they were added.
    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// Member `userid` (any case).
    /// Removes member `userid` (it left the corp): no department holds it,
    /// no API lists it, and a message naming it answers it `invaliduser`.
    pub fn remove_member(&mut self, userid: &str) {
        let Some(i) = self.index.remove(&userid.to_lowercase()) else { return };
        for d in std::mem::take(&mut self.members[i].department) {
            if let Some(list) = self.direct.get_mut(&d) {
                list.retain(|&j| j != i);
            }
        }
        for app in self.apps.values_mut() {
            app.users.retain(|u| !u.eq_ignore_ascii_case(userid));
        }
        for tag in self.tags.values_mut() {
            tag.users.retain(|u| !u.eq_ignore_ascii_case(userid));
        }
    }

    pub fn find(&self, userid: &str) -> Option<usize> {
        self.index.get(&userid.to_lowercase()).copied()
    }

    pub fn app_of(&self, agentid: i64) -> Option<&App> {
        self.apps.get(&agentid)
    }

    /// The app whose secret this is.
    pub fn app_with_secret(&self, secret: &str) -> Option<i64> {
        self.apps.iter().find(|(_, a)| a.secret == secret).map(|(id, _)| *id)
    }

    pub fn tag_of(&self, tagid: u32) -> Option<&Tag> {
        self.tags.get(&tagid)
    }

    /// Department `id`'s parent, if the department exists.
    pub fn parent_of(&self, id: u32) -> Option<u32> {
        self.parent.get(&id).copied()
    }

    /// Department `id` and every department under it, `id` first, then by
    /// depth.
    pub fn subtree(&self, id: u32) -> Vec<u32> {
        let mut out = vec![id];
        let mut i = 0;
        while i < out.len() {
            out.extend(self.children.get(&out[i]).into_iter().flatten());
            i += 1;
        }
        out
    }

    /// The userids of department `id`'s members, each once: its own, or with
    /// `fetch_child` those of every department under it too.
    pub fn party(&self, id: u32, fetch_child: bool) -> Vec<String> {
        let mut reach = Reach::new(self.len());
        self.reach_party(&mut reach, id, fetch_child);
        reach.userids(self)
    }

    /// The userids of tag `tagid`'s members, each once: its members and
    /// those of its departments (with their sub-departments).
    pub fn tag_members(&self, tagid: u32) -> Vec<String> {
        let mut reach = Reach::new(self.len());
        self.reach_tag(&mut reach, tagid);
        reach.userids(self)
    }

    /// The userids of app `agentid`'s visible range (what `@all` reaches),
    /// each once.
    pub fn visible(&self, agentid: i64) -> Vec<String> {
        self.visible_reach(agentid).userids(self)
    }

    /// The departments inside app `agentid`'s range: those of `allow_partys`
    /// and of its tags, with every department under them.
    pub fn parties_in_range(&self, agentid: i64) -> HashSet<u32> {
        let Some(app) = self.apps.get(&agentid) else { return HashSet::new() };
        let tag_parties = app.tags.iter().filter_map(|t| self.tags.get(t)).flat_map(|t| t.parties.iter());
        app.parties.iter().chain(tag_parties).flat_map(|&p| self.subtree(p)).collect()
    }

    /// Who app `agentid` sees, as marks over the members.
    pub(super) fn visible_reach(&self, agentid: i64) -> Reach {
        let mut reach = Reach::new(self.len());
        let Some(app) = self.apps.get(&agentid) else { return reach };
        let parties = self.parties_in_range(agentid);
        for (i, m) in self.members.iter().enumerate() {
            if m.department.iter().any(|d| parties.contains(d)) {
                reach.mark(i);
            }
        }
        for u in &app.users {
            if let Some(i) = self.find(u) {
                reach.mark(i);
            }
        }
        for &t in &app.tags {
            self.reach_tag(&mut reach, t);
        }
        reach
    }

    pub(super) fn reach_party(&self, reach: &mut Reach, id: u32, fetch_child: bool) {
        let parties = if fetch_child { self.subtree(id) } else { vec![id] };
        for p in parties {
            for &i in self.direct.get(&p).into_iter().flatten() {
                reach.mark(i);
            }
        }
    }

    pub(super) fn reach_tag(&self, reach: &mut Reach, tagid: u32) {
        let Some(tag) = self.tags.get(&tagid) else { return };
        for u in &tag.users {
            if let Some(i) = self.find(u) {
                reach.mark(i);
            }
        }
        for &p in &tag.parties {
            self.reach_party(reach, p, true);
        }
    }
}

/// A set of members, by index: each marked once, in the order first marked.
pub(super) struct Reach {
    marked: Vec<bool>,
    pub(super) order: Vec<usize>,
}

impl Reach {
    pub(super) fn new(members: usize) -> Reach {
        Reach { marked: vec![false; members], order: Vec::new() }
    }

    pub(super) fn mark(&mut self, i: usize) {
        if !self.marked[i] {
            self.marked[i] = true;
            self.order.push(i);
        }
    }

    pub(super) fn contains(&self, i: usize) -> bool {
        self.marked[i]
    }

    pub(super) fn len(&self) -> usize {
        self.order.len()
    }

    fn userids(&self, dir: &WeComDirectory) -> Vec<String> {
        self.order.iter().map(|&i| dir.members[i].userid.clone()).collect()
    }
}
