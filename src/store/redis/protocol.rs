//! The script protocol: the keys scripts touch, the scripts of the
//! operations that are not per-pair ([`scripts`]: acquire, warm, clear,
//! epoch, reconcile, the token scripts, the index of penalties) and how
//! their arguments are written and their answers read, and the readers the
//! per-pair operations share ([`parse_until`], [`parse_state`]). Each
//! per-pair operation writes its own arguments, in its file of
//! [`crate::store::pair_op`]. Each script's header (`lua/*.lua`) documents its
//! KEYS, ARGV and reply.
//!
//! Keys are `<prefix>:{<account>}:<rule>`: one packed state per (account,
//! rule) (a MessagePack map of numbers in one string value: lua/prelude.lua
//! `state_read`), with the account as hash tag so every key a call touches
//! sits in one Redis Cluster slot.

use std::collections::HashMap;
use std::sync::LazyLock;

use redis::Script;

use crate::limit::learned::{LearnedDay, LearnedWindow};
use crate::limit::penalty::PenaltyState;
use crate::limit::{Ask, Decision, InstanceLease, Limit, LimitState, Quota, Reason, Rule, RuleState, ShareState};
use crate::store::answer::StoreError;
use crate::store::tokens::TokenHash;
use crate::time::Micros;

/// A script's text: the shared prelude (`lua/prelude.lua`: the store
/// clock, integer printing, calendar arithmetic) in front of `lua/<file>`;
/// Redis scripts cannot include one another.
macro_rules! script {
    ($file:literal) => {
        concat!(
            include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/prelude.lua")),
            include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/", $file))
        )
    };
}
pub(crate) use script;

/// The scripts of the store's operations that are not per-pair operations
/// ([`crate::store::pair_op`] declares those, with their scripts), each hashed
/// once, and [`scripts`]: the list of them.
macro_rules! scripts {
    ($($name:ident = $file:literal,)*) => {
        $(
            #[doc = concat!("lua/", $file, " with the prelude.")]
            pub static $name: LazyLock<Script> = LazyLock::new(|| Script::new(script!($file)));
        )*

        /// Every script of this list (the Redis store loads them, and
        /// [`crate::store::pair_op::scripts`], when it connects).
        pub fn scripts() -> impl Iterator<Item = &'static Script> {
            [$(&*$name,)*].into_iter()
        }
    };
}

scripts! {
    ACQUIRE = "acquire.lua",
    WARM = "warm.lua",
    CLEAR = "clear.lua",
    EPOCH = "epoch.lua",
    RECONCILE = "reconcile.lua",
    LEARN_TOKEN = "learn_token.lua",
    TOKEN_OWNER = "token_owner.lua",
    TOKEN_CLAIM = "token_claim.lua",
    TOKEN_FETCHED = "token_fetched.lua",
    TOKEN_DROP = "token_drop.lua",
    FIELDS = "fields.lua",
    PENALTY_INDEX = "penalty_index.lua",
    PENALTIES = "penalties.lua",
}

/// Key names under one prefix, and this store's instance id.
pub struct Keys {
    prefix: String,
    /// This process's id among the instances sharing Redis (random at
    /// start, 16 hex digits): names its own count of each calendar quota in
    /// the pair states (`<field>.m.<inst>`, lua/acquire.lua), which a
    /// top-up after a failover reads (lua/reconcile.lua).
    inst: String,
}

impl Keys {
    pub fn new(prefix: &str) -> Keys {
        use std::hash::BuildHasher;
        let inst = format!("{:016x}", std::hash::RandomState::new().hash_one((std::process::id(), prefix)));
        Keys { prefix: prefix.to_owned(), inst }
    }

    /// The key prefix (`[store] key_prefix`).
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// This store's instance id ([`Keys::inst`]).
    pub fn inst(&self) -> &str {
        &self.inst
    }

    /// `<prefix>:#epoch-run`: the run_id of the Redis server process the
    /// epoch was last read on (lua/epoch.lua: another one rotates it).
    pub fn epoch_run(&self) -> String {
        format!("{}:#epoch-run", self.prefix)
    }

    /// `<prefix>:{<account>}:<tail>`, built without the formatting machinery
    /// (three of these per decision).
    pub(crate) fn account_key(&self, account: &str, tail: &[&str]) -> String {
        let len = self.prefix.len() + account.len() + 4 + tail.iter().map(|t| t.len()).sum::<usize>();
        let mut key = String::with_capacity(len);
        key.push_str(&self.prefix);
        key.push_str(":{");
        key.push_str(account);
        key.push_str("}:");
        for t in tail {
            key.push_str(t);
        }
        key
    }

    /// `<prefix>:{<account>}:<state>`: the pair state ([`Rule::state`]:
    /// the rule's name, or `<rule><path>` for a per-path rule).
    pub fn state(&self, account: &str, rule: &Rule) -> String {
        self.account_key(account, &[&rule.state])
    }

    /// The pair state of the state named `rule` ([`Rule::state`]).
    pub fn state_named(&self, account: &str, rule: &str) -> String {
        self.account_key(account, &[rule])
    }

    /// `<prefix>:{<account>}:<state>:c`: concurrency slots (holder → lease expiry).
    pub fn slots(&self, account: &str, rule: &Rule) -> String {
        self.account_key(account, &[&rule.state, ":c"])
    }

    /// `<prefix>:{<account>}:<state>#r:<id>`: one recipient's windows
    /// (`per_recipient`), a hash of `w<ms>` → TAT and `ex`. The account's
    /// hash tag comes first, so an id cannot move the key to another
    /// Cluster slot; a rule name never holds `#`.
    pub fn recipient(&self, account: &str, rule: &Rule, id: &str) -> String {
        self.account_key(account, &[&rule.state, "#r:", id])
    }

    /// `<prefix>:{<account>}:#warm`: last token refresh (`#` never appears in a rule name).
    pub fn warm(&self, account: &str) -> String {
        self.account_key(account, &["#warm"])
    }

    /// `<prefix>:#instances`: the instances heard from, by id, scored by
    /// when (`RedisStore::heartbeat`).
    pub fn instances(&self) -> String {
        format!("{}:#instances", self.prefix)
    }

    /// `<prefix>:#penalties`: the index of penalties, by when each ends
    /// (lua/penalty_index.lua).
    pub fn penalties(&self) -> String {
        format!("{}:#penalties", self.prefix)
    }

    /// `<prefix>:#epoch`: the deployment's epoch (lua/epoch.lua).
    pub fn epoch(&self) -> String {
        format!("{}:#epoch", self.prefix)
    }

    /// `<prefix>:#tokenkey`: what access tokens are hashed under, written
    /// once by the first instance (`SET NX`), read by every other.
    pub fn token_key(&self) -> String {
        format!("{}:#tokenkey", self.prefix)
    }

    /// `<prefix>:#token:<hash>`: the account a learned access token
    /// belongs to (lua/learn_token.lua, lua/token_owner.lua).
    pub fn token(&self, hash: &TokenHash) -> String {
        format!("{}:#token:{}", self.prefix, hash.to_hex())
    }

    /// `<prefix>:{#tokens}:`: what the token cache's keys start with
    /// (lua/token_claim.lua); one hash tag, so one Redis Cluster slot.
    pub fn token_slots(&self) -> String {
        format!("{}:{{#tokens}}:", self.prefix)
    }

    /// The entry and the fetch lock of a token-cache slot.
    pub fn token_slot(&self, slot: &str) -> (String, String) {
        let entry = format!("{}:{{#tokens}}:{slot}", self.prefix);
        let lock = format!("{entry}:lock");
        (entry, lock)
    }

    /// `<prefix>:{#tokens}:by:<hash>`: the slot holding a cached token.
    pub fn token_slot_of(&self, hash: &TokenHash) -> String {
        format!("{}:{{#tokens}}:by:{}", self.prefix, hash.to_hex())
    }
}

/// One call's part of an acquire.lua run, taken when the call arrives and
/// written straight into the EVALSHA command (no intermediate strings).
pub struct AcquireArgs {
    /// The pair state's key, and the account's warm-up key and the rule's
    /// slots only when the rule has a warm-up or a concurrency cap.
    key: String,
    warm_slots: Option<[String; 2]>,
    pub offset_us: Micros,
    max_wait_us: Micros,
    /// Only with a concurrency cap ("" else: nothing is held).
    holder: String,
    spec: Spec,
    recipients: Vec<String>,
}

/// What acquire.lua reads of a call's rule: sent once for the calls of a
/// run that share it (the next ones send "=").
#[derive(PartialEq)]
struct Spec {
    /// warm-up, concurrency cap, lease, number of limits.
    numbers: [i64; 4],
    /// kind, field, a, b, r per limit (see acquire.lua).
    limits: Vec<(&'static str, String, i64, i64, i64)>,
    /// The caller's label when the rule's `max_share` applies ("" else),
    /// and a, b of each of its share limits.
    share: (String, Vec<(i64, i64)>),
    /// What the call costs (acquire.lua: decided as that many calls).
    cost: u64,
    /// `per_recipient`: field, T, τ of each window.
    per_recipient: Vec<(String, i64, i64)>,
}

impl AcquireArgs {
    /// `ask`'s keys and values for acquire.lua.
    pub fn new(keys: &Keys, ask: &Ask<'_>) -> AcquireArgs {
        let (account, rule) = (ask.key.account, ask.key.rule);
        let kept = |i: usize| if ask.normal { rule.reserve.get(i).copied().unwrap_or(0) } else { 0 };
        let limits = rule
            .limits
            .iter()
            .enumerate()
            .map(|(i, limit)| {
                let label = limit.window_key().label();
                match limit {
                    Limit::Window(w) => {
                        let kind = if rule.learn_windows { "wl" } else { "w" };
                        (kind, label, w.interval_us(), w.tolerance_us(), kept(i))
                    }
                    Limit::Calendar { count, period } => {
                        (period.as_str(), label, count.get() as i64, i64::from(rule.learn_up), kept(i))
                    }
                }
            })
            .collect();
        let slots = rule.warmup_us > 0 || rule.concurrency > 0;
        AcquireArgs {
            key: keys.state(account, rule),
            warm_slots: slots.then(|| [keys.warm(account), keys.slots(account, rule)]),
            offset_us: ask.key.offset_us,
            max_wait_us: ask.max_wait_us,
            holder: if rule.concurrency > 0 { ask.holder.to_owned() } else { String::new() },
            spec: Spec {
                numbers: [rule.warmup_us, i64::from(rule.concurrency), ask.lease_us, rule.limits.len() as i64],
                limits,
                share: match ask.share.filter(|_| !rule.share.is_empty()) {
                    None => (String::new(), Vec::new()),
                    Some(caller) => (caller.to_owned(), rule.share.iter().map(share_args).collect()),
                },
                cost: ask.cost.max(1),
                per_recipient: if rule.recipients_matter() {
                    rule.per_recipient
                        .iter()
                        .map(|w| {
                            (crate::limit::WindowKey::Window(w.per_us()).label(), w.interval_us(), w.tolerance_us())
                        })
                        .collect()
                } else {
                    Vec::new()
                },
            },
            recipients: if rule.recipients_matter() {
                ask.recipients.iter().map(|id| keys.recipient(account, rule, id)).collect()
            } else {
                Vec::new()
            },
        }
    }

    /// How many keys this call adds to a run.
    pub fn key_count(&self) -> usize {
        1 + self.warm_slots.as_ref().map_or(0, |k| k.len()) + self.recipients.len()
    }

    /// This call's keys, in acquire.lua's order.
    fn keys(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.key.as_str())
            .chain(self.warm_slots.iter().flatten().map(String::as_str))
            .chain(self.recipients.iter().map(String::as_str))
    }

    /// This call's values, in acquire.lua's order; its spec as "=" when it
    /// is `previous`'s.
    fn write_args(&self, cmd: &mut redis::Cmd, previous: Option<&AcquireArgs>) {
        cmd.arg(self.max_wait_us).arg(self.holder.as_str());
        if previous.is_some_and(|p| p.spec == self.spec) {
            cmd.arg("=");
        } else {
            let spec = &self.spec;
            let [warmup, conc, lease, n] = spec.numbers;
            cmd.arg(warmup).arg(conc).arg(lease).arg(n);
            for (kind, field, a, b, r) in &spec.limits {
                cmd.arg(*kind).arg(field.as_str()).arg(*a).arg(*b).arg(*r);
            }
            cmd.arg(spec.share.0.as_str());
            for (a, b) in &spec.share.1 {
                cmd.arg(*a).arg(*b);
            }
            cmd.arg(spec.cost).arg(spec.per_recipient.len());
            for (field, t, tau) in &spec.per_recipient {
                cmd.arg(field.as_str()).arg(*t).arg(*tau);
            }
        }
        cmd.arg(self.recipients.len());
    }
}

/// A share limit's a and b as acquire.lua takes them (kind and field are
/// the rule limit's at the same index).
fn share_args(limit: &Limit) -> (i64, i64) {
    match limit {
        Limit::Window(w) => (w.interval_us(), w.tolerance_us()),
        Limit::Calendar { count, .. } => (count.get() as i64, 0),
    }
}

/// The EVALSHA of one acquire.lua run deciding `calls` (one account's, same
/// offset), at `now` ("" = Redis `TIME`); checking first that the epoch
/// key holds `epoch`, if given (key, value).
pub fn acquire_command(
    script: &Script,
    calls: &[AcquireArgs],
    now: &str,
    epoch: Option<(&str, &str)>,
    inst: &str,
) -> redis::Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash())
        .arg(calls.iter().map(AcquireArgs::key_count).sum::<usize>() + usize::from(epoch.is_some()));
    for call in calls {
        for key in call.keys() {
            cmd.arg(key);
        }
    }
    if let Some((key, _)) = epoch {
        cmd.arg(key);
    }
    cmd.arg(now).arg(calls.first().map_or(0, |c| c.offset_us)).arg(epoch.map_or("", |(_, value)| value)).arg(inst);
    let mut previous = None;
    for call in calls {
        call.write_args(&mut cmd, previous);
        previous = Some(call);
    }
    cmd
}

/// acquire.lua's answer: a flat array of integers, one decision after
/// another; or "E", the epoch changed ([`StoreError::Lost`]).
pub fn parse_decisions(reply: redis::Value) -> Result<Vec<Result<Decision, StoreError>>, StoreError> {
    let bad = |reply: &dyn std::fmt::Debug| StoreError::BadReply { script: "acquire.lua", reply: format!("{reply:?}") };
    let values = match reply {
        redis::Value::Array(values) => values,
        redis::Value::BulkString(ref s) if s == b"E" => return Err(StoreError::Lost),
        redis::Value::SimpleString(ref s) if s == "E" => return Err(StoreError::Lost),
        other => return Err(bad(&other)),
    };
    let mut ints = Vec::with_capacity(values.len());
    for v in &values {
        match v {
            redis::Value::Int(x) => ints.push(*x),
            other => return Err(bad(other)),
        }
    }
    let mut decisions = Vec::new();
    let mut rest = &ints[..];
    while !rest.is_empty() {
        let (decision, used) = parse_decision(rest).ok_or_else(|| bad(&rest))?;
        decisions.push(Ok(decision));
        rest = &rest[used..];
    }
    Ok(decisions)
}

/// The decision at the start of `ints` and how many integers it took:
/// "1 at escalated hold qi qr qt ci cr ct" or "0 wait reason m j1…jm" (j:
/// the 0-based indices of the recipients over their limits).
fn parse_decision(ints: &[i64]) -> Option<(Decision, usize)> {
    match ints {
        [0, wait_us, reason, m, rest @ ..] => {
            let m = usize::try_from(*m).ok().filter(|m| *m <= rest.len())?;
            let reason = match reason {
                1 => Reason::Rate,
                2 => Reason::Quota,
                4 => Reason::Concurrency,
                5 => Reason::Reserve,
                6 => Reason::Share,
                7 => Reason::Recipient,
                _ => Reason::Penalty,
            };
            let over = rest[..m].iter().map(|j| u32::try_from(*j).ok()).collect::<Option<Box<[u32]>>>()?;
            Some((Decision::Reject { wait_us: *wait_us, reason, over }, 4 + m))
        }
        [1, at, escalated, hold_us, qi, qr, qt, ci, cr, ct, ..] => Some((
            Decision::Admit {
                at: *at,
                hold_us: *hold_us,
                escalated: *escalated == 1,
                quota: quota(*qi, *qr, *qt),
                calendar: quota(*ci, *cr, *ct),
            },
            10,
        )),
        _ => None,
    }
}

/// A limit's room as acquire.lua writes it: 1-based index (0: none), room, reset.
fn quota(i: i64, room: i64, reset_us: i64) -> Option<Quota> {
    (i > 0).then(|| Quota { limit: (i - 1) as usize, remaining: room.max(0) as u64, reset_us })
}

/// `{until, now}`, the answer of penalise.lua and set_penalty.lua.
pub fn parse_until(script: &'static str, reply: &[i64]) -> Result<(Micros, Micros), StoreError> {
    match reply {
        [until, now] => Ok((*until, *now)),
        other => Err(StoreError::BadReply { script, reply: format!("{other:?}") }),
    }
}

/// epoch.lua's answer: the epoch, when it was written, and now.
pub type EpochReply = (String, i64, i64);

/// token_owner.lua's answer: the account ("" if unknown), until, now.
pub type TokenOwnerReply = (String, i64, i64);

/// token_claim.lua's answer: kind, entry or answer, until, now.
pub type TokenClaimReply = (String, Vec<u8>, i64, i64);

/// token_claim.lua's answer read.
pub fn parse_claim((kind, bytes, until, now): TokenClaimReply) -> Result<crate::store::tokens::Claim, StoreError> {
    use crate::store::tokens::Claim;
    Ok(match kind.as_str() {
        "cached" => Claim::Cached { entry: bytes, until, now },
        "won" => Claim::Won { now },
        "busy" => Claim::Busy { now, stored: until },
        "failed" => Claim::Failed { answer: bytes },
        other => return Err(StoreError::BadReply { script: "token_claim.lua", reply: other.to_owned() }),
    })
}

/// The arguments of reconcile.lua after now: offset, penalty, this
/// instance's id, counts (added, or topped up:
/// [`crate::store::ledger::Pending::top_up`]).
pub fn reconcile_args(inv: &mut redis::ScriptInvocation<'_>, pending: &crate::store::ledger::Pending, inst: &str) {
    let p = pending.penalty.unwrap_or_default();
    inv.arg(pending.offset_us).arg(p.until).arg(p.started).arg(p.level).arg(p.last_len);
    inv.arg(inst).arg(pending.adds.len());
    let mode = if pending.top_up { "t" } else { "a" };
    for (period, id, n) in &pending.adds {
        inv.arg(period.as_str()).arg(period.as_str()).arg(*id).arg(*n).arg(mode);
    }
}

/// inspect.lua's answer: now, the pair state's fields, the slots.
pub type InspectReply = (i64, HashMap<String, i64>, Vec<(String, i64)>);

/// The state inspect.lua read, for `rule`, in canonical form
/// ([`RuleState::canonical`]).
pub fn parse_state(rule: &Rule, fields: &HashMap<String, i64>, slots: Vec<(String, i64)>) -> RuleState {
    let get = |f: &str| fields.get(f).copied();
    let mut state = RuleState::default();
    for limit in &rule.limits {
        let key = limit.window_key();
        let label = key.label();
        match limit {
            Limit::Window(w) => {
                if let Some(tat) = get(&label) {
                    state.limits.push((key, LimitState::Tat(tat)));
                }
                if let Some(run) = get(&format!("{label}.r")) {
                    state.runs.push((w.per_us(), run));
                }
                let lowered = |f: &str| get(&format!("{label}.{f}"));
                if let (Some(count), Some(burst), Some(interval_us), Some(tolerance_us), Some(at), Some(until)) =
                    (lowered("ln"), lowered("lk"), lowered("lt"), lowered("lb"), lowered("la"), lowered("lu"))
                {
                    state.learned_windows.push(LearnedWindow {
                        per_us: w.per_us(),
                        count: count.max(0) as u64,
                        burst: burst.max(0) as u64,
                        interval_us,
                        tolerance_us,
                        at,
                        until,
                        took: lowered("lh").unwrap_or(0).max(0) as u64,
                    });
                }
            }
            Limit::Calendar { .. } => {
                if let Some(p) = get(&format!("{label}.p")) {
                    let used = get(&format!("{label}.n")).unwrap_or(0).max(0) as u64;
                    let next = get(&format!("{label}.q")).unwrap_or(0).max(0) as u64;
                    state.limits.push((key, LimitState::Count { period_id: p, used, next }));
                }
            }
        }
    }
    state.penalty = PenaltyState {
        until: get("pu").unwrap_or(0),
        started: get("ps").unwrap_or(0),
        level: get("pl").unwrap_or(0).clamp(0, i64::from(u32::MAX)) as u32,
        last_len: get("pn").unwrap_or(0),
    };
    state.learned_day = match (get("day.l"), get("day.la")) {
        (Some(limit), Some(at)) if limit > 0 => Some(LearnedDay { limit: limit as u64, at }),
        _ => None,
    };
    state.warm_start = get("ws").unwrap_or(0);
    state.last_call = get("lc").unwrap_or(0);
    state.lease_end = get("le").unwrap_or(0);
    // Each instance's last lease: le.<instance> its end, lu.<instance> its units.
    state.leases = fields
        .iter()
        .filter_map(|(f, until)| {
            let instance = f.strip_prefix("le.")?;
            let units = get(&format!("lu.{instance}")).unwrap_or(0).max(0) as u64;
            Some(InstanceLease { instance: instance.into(), units, until: *until })
        })
        .collect();
    state.cleared_at = get("cl").unwrap_or(0);
    state.holders = slots;
    state.shares = parse_shares(rule, fields);
    state.canonical(rule)
}

/// The callers' shares in a pair state: fields `<limit>~<caller>` (window)
/// and `<limit>~<caller>.p|.n|.q` (calendar), as acquire.lua writes them.
fn parse_shares(rule: &Rule, fields: &HashMap<String, i64>) -> Vec<ShareState> {
    let mut callers: Vec<&str> = fields
        .keys()
        .filter_map(|f| {
            let (_, rest) = f.split_once('~')?;
            Some(rest.split_once('.').map_or(rest, |(caller, _)| caller))
        })
        .collect();
    callers.sort_unstable();
    callers.dedup();
    callers
        .into_iter()
        .map(|caller| {
            let get = |f: String| fields.get(&f).copied();
            let mut share = ShareState { caller: caller.into(), limits: Vec::new() };
            for limit in &rule.share {
                let key = limit.window_key();
                let field = format!("{}~{caller}", key.label());
                match limit {
                    Limit::Window(_) => {
                        if let Some(tat) = get(field) {
                            share.limits.push((key, LimitState::Tat(tat)));
                        }
                    }
                    Limit::Calendar { .. } => {
                        if let Some(p) = get(format!("{field}.p")) {
                            let used = get(format!("{field}.n")).unwrap_or(0).max(0) as u64;
                            let next = get(format!("{field}.q")).unwrap_or(0).max(0) as u64;
                            share.limits.push((key, LimitState::Count { period_id: p, used, next }));
                        }
                    }
                }
            }
            share
        })
        .collect()
}
