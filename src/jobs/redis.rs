//! [`JobStore`] on Redis (single server, Sentinel or Cluster, through the
//! connections of [`crate::store::redis::conn`]): each operation on jobs is
//! one Lua script (`lua/jobs_*.lua`, with `lua/prelude.lua` and
//! `lua/jobs_prelude.lua` in front, run by SHA and loaded again after a
//! `NOSCRIPT`) on the keys of one account, `<prefix>:{<account>}:#jobs:…`
//! (the account's hash tag, as the decision state's: one Cluster slot), so
//! it is atomic on a Cluster too. jobs_prelude.lua lists those keys.
//!
//! `sending` waits, on a master with replicas, until a replica has the
//! mark before the job's request goes out (`sending.rs`).
//!
//! A job's id names its account: its first 4 bytes are the account's number
//! (lua/jobs_account.lua, given once per account and never changed), the 12
//! others random. So `get`, `cancel`, `sending` and `finish`, which have only
//! the id, find the account's keys without any per-job key outside them.
//!
//! What spans accounts cannot be in one slot. It lives under
//! `<prefix>:{#jobs}:` (one slot of its own) and is written by this client
//! after each account script (lua/jobs_note.lua), each write setting what
//! the script reported (idempotent, never a count added to):
//!
//! - `accounts`, `names`, `next`: the account numbers; written *before*
//!   each submission (lua/jobs_account.lua, which also reads the caller's
//!   totals below), so the list of accounts `recover`, `summary` and
//!   `purge` go through is never missing one that has jobs. After Redis
//!   lost its data a number may name another account than this instance
//!   remembers: an operation by id that finds nothing reads it again and
//!   retries once.
//! - `due:<caller>` and `due-callers`: the index `due_queues` reads
//!   (lua/jobs_due.lua), per caller so that a caller with many due queues
//!   never hides another's. `due:<caller>` is a zset of
//!   `<account>\n<rule>` by the queue head's due time (absent when the head
//!   is claimed or sending, or the queue is empty); `due-callers` a zset of
//!   the callers with entries by their lowest (oldest) head, both written
//!   together by the same note, so `due_queues` reads the callers whose
//!   oldest head is due and at most N entries of each: one script, work in
//!   callers × N, whatever the number of queues. (An earlier build's single
//!   `due` zset is deleted by `recover`.) The index may be stale
//!   when two instances' writes for one queue cross, or an instance dies
//!   between a script and its write: an entry too many costs one `claim`
//!   that returns nothing (and that claim writes the truth); an entry
//!   missing delays that queue until the next `recover` (every lease
//!   period), which writes every queue's head of every account.
//! - `deadlines`: a zset of the accounts with unfinished jobs that have a
//!   deadline, by their earliest (each account's own `dl` zset, in its
//!   slot, holds the jobs), which `expire` reads (lua/jobs_expire.lua);
//!   noted after a submission with a deadline, each expire run and each
//!   recover.
//! - `caller:<caller>`: a hash of `<account>` → `"<jobs> <bytes>"`, the
//!   caller's unfinished jobs and bytes per account, for the per-caller
//!   bound. A submission checks the caller's totals of its own account
//!   exactly (in the script) and adds those of its other accounts as last
//!   written: the bound may be passed by the submissions of that caller to
//!   other accounts in flight at the same moment (at most one per
//!   concurrent submission), or by a total an instance died before writing
//!   or whose write crossed another's (repaired by the next `recover`,
//!   which notes every caller's totals of every account, as it notes every
//!   queue's head: one round trip per account and 200 entries). The
//!   per-account bound is exact.
//!
//! Where the trait leaves room (docs/plans/queued-delivery.md "Redis"): an
//! `Idempotency-Key` counts per (caller, account), the first job being
//! found in the script that stores the new one; `finish` with `NotYet` or
//! `Expired` on a `Sending` job changes nothing and answers `false` (both
//! say "never sent"); `finish` by the owner of a lease that ran out but was
//! not yet recovered is taken. Times are always the `now` given (wxgate's
//! clock), never Redis `TIME`. The bound of ended jobs a caller keeps
//! ([`Bounds::ended_jobs`]) is written by each submission into the
//! account's meta hash, where every script that ends a job reads it
//! (lua/jobs_prelude.lua `kept`): so an instance that only cancels or
//! dispatches applies it too.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ::redis::{Script, Value};
use async_trait::async_trait;
use bytes::Bytes;

use super::{
    Answer, Bound, Bounds, CallerRoom, Cancelled, DueCallback, End, ExpiredJob, Job, JobId, JobState, JobStore, NewJob,
    QueueKey, QueueSummary, Recovered, SubmitError, Submitted,
};
use crate::config::queue::Replicas;
use crate::config::RedisConfig;
use crate::store::redis::conn::{Connections, Lane, CONNECT_TIMEOUT};
use crate::store::redis::protocol::{script, Keys};
use crate::store::StoreError;
use crate::time::Micros;

mod sending;

/// A jobs script: prelude.lua, jobs_prelude.lua, then the file.
macro_rules! jobs_script {
    ($file:literal) => {
        concat!(script!("jobs_prelude.lua"), include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/", $file)))
    };
}

/// Most leases (or ended jobs) one recover (or purge) run takes: a run
/// blocks Redis while it lasts, so more are taken in several runs.
const PER_RUN: usize = 1000;

/// Accounts one `expire` looks at beyond the jobs it may end: an account
/// listed whose only jobs past their deadline are held by a dispatcher
/// (stay listed until their holder ends them) ends nothing, and must not
/// hide the next.
const HELD_AHEAD: usize = 100;

struct Scripts {
    account: Script,
    note: Script,
    due: Script,
    submit: Script,
    claim: Script,
    renew: Script,
    sending: Script,
    finish: Script,
    cancel: Script,
    recover: Script,
    summary: Script,
    purge: Script,
    callbacks: Script,
    callback_done: Script,
    expire: Script,
}

impl Scripts {
    fn new() -> Scripts {
        Scripts {
            account: Script::new(script!("jobs_account.lua")),
            note: Script::new(script!("jobs_note.lua")),
            due: Script::new(script!("jobs_due.lua")),
            submit: Script::new(jobs_script!("jobs_submit.lua")),
            claim: Script::new(jobs_script!("jobs_claim.lua")),
            renew: Script::new(jobs_script!("jobs_renew.lua")),
            sending: Script::new(jobs_script!("jobs_sending.lua")),
            finish: Script::new(jobs_script!("jobs_finish.lua")),
            cancel: Script::new(jobs_script!("jobs_cancel.lua")),
            recover: Script::new(jobs_script!("jobs_recover.lua")),
            summary: Script::new(jobs_script!("jobs_summary.lua")),
            purge: Script::new(jobs_script!("jobs_purge.lua")),
            callbacks: Script::new(jobs_script!("jobs_callbacks.lua")),
            expire: Script::new(jobs_script!("jobs_expire.lua")),
            callback_done: Script::new(jobs_script!("jobs_callback_done.lua")),
        }
    }

    fn all(&self) -> [&Script; 15] {
        [
            &self.account,
            &self.note,
            &self.due,
            &self.submit,
            &self.claim,
            &self.renew,
            &self.sending,
            &self.finish,
            &self.cancel,
            &self.recover,
            &self.summary,
            &self.purge,
            &self.callbacks,
            &self.callback_done,
            &self.expire,
        ]
    }
}

/// Every jobs script's SHA (the check that each `lua/` file is loaded once).
#[cfg(test)]
pub(crate) fn script_hashes() -> Vec<String> {
    Scripts::new().all().iter().map(|s| s.get_hash().to_owned()).collect()
}

/// Queued jobs in Redis ([module docs](self)).
pub struct RedisJobs {
    conns: Connections,
    keys: Keys,
    scripts: Scripts,
    timeout: Duration,
    /// The accounts of the numbers this instance has seen (a number never
    /// changes while Redis keeps its data).
    names: Mutex<HashMap<u32, Arc<str>>>,
    /// `[queue] replicas`: the replicas a `sending` mark must be on before
    /// the job's request goes out ([`sending`]).
    replicas: Replicas,
    /// A Redis Cluster (each slot's master seen apart by [`sending`]).
    cluster: bool,
    masters: sending::Masters,
}

impl RedisJobs {
    /// The counts of `account`'s queues (of `caller`'s only, when given):
    /// one script on the account.
    async fn account_summary(&self, account: String, caller: Option<&str>) -> Result<Vec<QueueSummary>, StoreError> {
        const S: &str = "jobs_summary.lua";
        let mut inv = self.on_account(&self.scripts.summary, &account);
        inv.arg(caller.unwrap_or(""));
        let reply: Vec<Value> = self.run(inv).await?;
        let [counts, oldest] = <[Value; 2]>::try_from(reply).map_err(|_| bad(S, "not 2 items"))?;
        let account: Arc<str> = account.into();
        let mut queues: HashMap<(String, String), QueueSummary> = HashMap::new();
        for c in list(counts, S)?.chunks(4) {
            let [caller, rule, state, n] = c else { continue };
            let key = (text(caller, S)?, text(rule, S)?);
            let q = queues.entry(key.clone()).or_insert_with(|| empty_summary(&account, &key.0, &key.1));
            q.add(state_from(&text(state, S)?)?, int(n, S)?.max(0) as u64);
        }
        for o in list(oldest, S)?.chunks(3) {
            let [caller, rule, sub] = o else { continue };
            let key = (text(caller, S)?, text(rule, S)?);
            let q = queues.entry(key.clone()).or_insert_with(|| empty_summary(&account, &key.0, &key.1));
            q.oldest_us = Some(int(sub, S)?);
        }
        Ok(queues.into_values().collect())
    }
    /// Connects with `[store]`'s settings (its own connections, the decision
    /// store's key prefix) and loads the scripts.
    pub async fn connect(cfg: &RedisConfig) -> Result<RedisJobs, StoreError> {
        let conns = Connections::open(cfg, false).await?;
        let jobs = RedisJobs {
            conns,
            keys: Keys::new(&cfg.key_prefix),
            scripts: Scripts::new(),
            timeout: cfg.timeout,
            names: Mutex::default(),
            replicas: Replicas::Auto,
            cluster: !cfg.nodes.is_empty(),
            masters: sending::Masters::default(),
        };
        let mut conn = jobs.conns.conn(Lane::Shared);
        for script in jobs.scripts.all() {
            match tokio::time::timeout(CONNECT_TIMEOUT, script.prepare_invoke().load_async(&mut conn)).await {
                Ok(loaded) => loaded.map_err(|e| crate::store::redis::conn::cannot_use(jobs.conns.at(), e))?,
                Err(_) => {
                    return Err(StoreError::Unreachable(format!(
                        "cannot use Redis at {}: SCRIPT LOAD timed out",
                        jobs.conns.at()
                    )))
                }
            };
        }
        Ok(jobs)
    }

    /// `[queue] replicas` (`"auto"` until given): how many replicas must
    /// have a job's `sending` mark before its request goes out.
    pub fn with_replicas(mut self, replicas: Replicas) -> RedisJobs {
        self.replicas = replicas;
        self
    }

    /// `<prefix>:{<account>}:#jobs:`: what an account's job keys start with.
    pub fn account_base(&self, account: &str) -> String {
        self.keys.account_key(account, &["#jobs:"])
    }

    /// `<prefix>:{#jobs}:<name>`: a key spanning accounts.
    fn global(&self, name: &str) -> String {
        format!("{}:{{#jobs}}:{name}", self.keys.prefix())
    }

    fn caller_key(&self, caller: &str) -> String {
        self.global(&format!("caller:{caller}"))
    }

    /// `<prefix>:{#jobs}:due:<caller>`: the caller's due queues' heads.
    fn due_key(&self, caller: &str) -> String {
        self.global(&format!("due:{caller}"))
    }

    async fn run<T: ::redis::FromRedisValue>(&self, inv: ::redis::ScriptInvocation<'_>) -> Result<T, StoreError> {
        self.conns.run(inv, self.timeout).await
    }

    async fn query<T: ::redis::FromRedisValue>(&self, cmd: &::redis::Cmd) -> Result<T, StoreError> {
        self.conns.query(cmd, self.timeout).await
    }

    /// A script on `account`'s keys: KEYS[1] its meta hash, ARGV[1] its base.
    fn on_account<'a>(&self, script: &'a Script, account: &str) -> ::redis::ScriptInvocation<'a> {
        let base = self.account_base(account);
        let mut inv = script.key(format!("{base}meta"));
        inv.arg(base);
        inv
    }

    /// Before a submission: `account`'s number (given now if it has none;
    /// asked every time, so an account is listed again even after Redis lost
    /// its data) and `caller`'s unfinished jobs and bytes in its other
    /// accounts, as last written (lua/jobs_account.lua).
    async fn intake(&self, account: &Arc<str>, caller: &str) -> Result<(u32, i64, i64), StoreError> {
        const S: &str = "jobs_account.lua";
        let mut inv = self.scripts.account.key(self.global("accounts"));
        inv.key(self.global("names")).key(self.global("next")).key(self.caller_key(caller)).arg(&**account);
        let (n, jobs, bytes): (i64, i64, i64) = self.run(inv).await?;
        let n = u32::try_from(n).map_err(|_| bad(S, n))?;
        lock(&self.names).insert(n, account.clone());
        Ok((n, jobs, bytes))
    }

    /// The account a job id names (`None`: no account has that number).
    async fn account_of(&self, id: JobId) -> Result<Option<Arc<str>>, StoreError> {
        let n = u32::from_be_bytes([id.0[0], id.0[1], id.0[2], id.0[3]]);
        if let Some(name) = lock(&self.names).get(&n) {
            return Ok(Some(name.clone()));
        }
        self.read_name(n).await
    }

    async fn read_name(&self, n: u32) -> Result<Option<Arc<str>>, StoreError> {
        let name: Option<String> = self.query(::redis::cmd("HGET").arg(self.global("names")).arg(n)).await?;
        Ok(name.map(|name| {
            let name: Arc<str> = name.into();
            lock(&self.names).insert(n, name.clone());
            name
        }))
    }

    /// After an operation by id found no job in `seen`'s keys: the account
    /// Redis names for the id's number now, if another (this instance's
    /// memory of numbers is stale only after Redis lost its data and gave
    /// the number again); the caller then tries once more there.
    async fn renamed(&self, id: JobId, seen: &str) -> Result<Option<Arc<str>>, StoreError> {
        let n = u32::from_be_bytes([id.0[0], id.0[1], id.0[2], id.0[3]]);
        Ok(self.read_name(n).await?.filter(|now| &**now != seen))
    }

    /// Every account that has (or had) jobs.
    async fn accounts(&self) -> Result<Vec<String>, StoreError> {
        let mut all: Vec<String> = self.query(::redis::cmd("HKEYS").arg(self.global("accounts"))).await?;
        all.sort();
        Ok(all)
    }

    /// Writes what a script reported into the keys spanning accounts
    /// (lua/jobs_note.lua): the queue's head into the index of due queues
    /// (`head`: its due time, or -1 for out of it), the caller's unfinished
    /// jobs and bytes in `account` (`totals`). `None`: left as they are.
    async fn note(
        &self,
        account: &str,
        caller: &str,
        rule: &str,
        head: Option<i64>,
        totals: Option<(i64, i64)>,
    ) -> Result<(), StoreError> {
        let heads: Vec<(String, String, i64)> =
            head.map(|h| (caller.to_owned(), rule.to_owned(), h)).into_iter().collect();
        let totals: Vec<(String, i64, i64)> = totals.map(|(j, b)| (caller.to_owned(), j, b)).into_iter().collect();
        self.note_all(account, &heads, &totals).await
    }

    /// [`RedisJobs::note`] for many queues and callers of one account, in
    /// one round trip.
    async fn note_all(
        &self,
        account: &str,
        heads: &[(String, String, i64)],
        totals: &[(String, i64, i64)],
    ) -> Result<(), StoreError> {
        if heads.is_empty() && totals.is_empty() {
            return Ok(());
        }
        let mut inv = self.scripts.note.key(self.global("due-callers"));
        inv.arg(account).arg(heads.len());
        for (caller, rule, head) in heads {
            inv.key(self.due_key(caller)).arg(caller).arg(rule).arg(head);
        }
        for (caller, jobs, bytes) in totals {
            inv.key(self.caller_key(caller)).arg(jobs).arg(bytes);
        }
        self.run::<i64>(inv).await.map(|_| ())
    }

    /// The first `most` accounts of the index `key` whose time is `now` or
    /// earlier.
    async fn accounts_by(&self, key: &str, now: Micros, most: usize) -> Result<Vec<String>, StoreError> {
        self.query(::redis::cmd("ZRANGEBYSCORE").arg(key).arg("-inf").arg(now).arg("LIMIT").arg(0).arg(most)).await
    }

    /// Notes what a script reported of an account: `heads` as
    /// `{caller, rule, head, ...}` and `totals` as `{caller, jobs, bytes,
    /// ...}` ([`RedisJobs::note_all`]), a few hundred keys per note.
    async fn note_reported(
        &self,
        account: &str,
        heads: Value,
        totals: Value,
        removals: bool,
        script: &'static str,
    ) -> Result<(), StoreError> {
        let mut all_heads = Vec::new();
        for q in list(heads, script)?.chunks(3) {
            if let [caller, rule, head] = q {
                let head = int(head, script)?;
                if removals || head >= 0 {
                    all_heads.push((text(caller, script)?, text(rule, script)?, head));
                }
            }
        }
        let mut all_totals = Vec::new();
        for t in list(totals, script)?.chunks(3) {
            if let [caller, jobs, bytes] = t {
                all_totals.push((text(caller, script)?, int(jobs, script)?, int(bytes, script)?));
            }
        }
        for heads in all_heads.chunks(200) {
            self.note_all(account, heads, &[]).await?;
        }
        for totals in all_totals.chunks(200) {
            self.note_all(account, &[], totals).await?;
        }
        Ok(())
    }

    /// `<prefix>:{#jobs}:callbacks`: the accounts with pending callbacks,
    /// by their earliest one's due time.
    fn callbacks_key(&self) -> String {
        self.global("callbacks")
    }

    /// Writes an account's earliest pending callback (`-1`: none; `-2`:
    /// unchanged, nothing written) into the index [`JobStore::callbacks_due`] reads. Like the index of due
    /// queues it may be stale when two instances' writes cross or an
    /// instance dies between a script and this write: an entry too early
    /// costs one script that hands out nothing (and writes the truth); an
    /// entry missing waits for the next `recover`, which writes every
    /// account's.
    async fn note_callbacks(&self, account: &str, head: i64) -> Result<(), StoreError> {
        self.note_earliest(&self.callbacks_key(), account, head).await
    }

    /// Writes `account`'s earliest time (`-1`: none, out; `-2`: unchanged,
    /// nothing written) into the index of accounts `key`.
    async fn note_earliest(&self, key: &str, account: &str, head: i64) -> Result<(), StoreError> {
        if head == -2 {
            return Ok(());
        }
        let cmd = if head < 0 {
            ::redis::cmd("ZREM").arg(key).arg(account).clone()
        } else {
            ::redis::cmd("ZADD").arg(key).arg(head).arg(account).clone()
        };
        self.query::<i64>(&cmd).await.map(|_| ())
    }

    /// `<prefix>:{#jobs}:deadlines`: the accounts with unfinished jobs
    /// that have a deadline, by their earliest.
    fn deadlines_key(&self) -> String {
        self.global("deadlines")
    }

    /// Writes an account's earliest deadline (`-1`: none; `-2`: unchanged,
    /// nothing written) into the index [`JobStore::expire`] reads. Stale
    /// like the others: an entry too early costs one script that ends
    /// nothing (and writes the truth); an entry too late or missing waits
    /// for the next `recover` (every half lease), which writes every
    /// account's, and a job whose deadline passes meanwhile is never sent
    /// (the dispatcher checks it) but shows `queued` or `waiting` until then.
    async fn note_deadlines(&self, account: &str, head: i64) -> Result<(), StoreError> {
        self.note_earliest(&self.deadlines_key(), account, head).await
    }

    /// [`JobStore::callback_done`] in `account`'s keys.
    async fn callback_done_in(
        &self,
        account: &str,
        id: JobId,
        tries: u32,
        retry_at: Option<Micros>,
        now: Micros,
    ) -> Result<bool, StoreError> {
        const S: &str = "jobs_callback_done.lua";
        let mut inv = self.on_account(&self.scripts.callback_done, account);
        inv.arg(now).arg(id.to_string()).arg(tries).arg(retry_at.map(|t| t.to_string()).unwrap_or_default());
        let reply: Vec<Value> = self.run(inv).await?;
        let [done, head] = <[Value; 2]>::try_from(reply).map_err(|_| bad(S, "not 2 items"))?;
        self.note_callbacks(account, int(&head, S)?).await?;
        Ok(int(&done, S)? == 1)
    }

    /// [`JobStore::finish`] in `account`'s keys.
    async fn finish_in(
        &self,
        account: &str,
        id: JobId,
        owner: &str,
        end: End,
        now: Micros,
    ) -> Result<bool, StoreError> {
        const S: &str = "jobs_finish.lua";
        let (kind, at, answer) = match end {
            End::Sent(a) => ("sent", 0, Some(a)),
            End::Failed(a) => ("failed", 0, Some(a)),
            End::Retry { at, answer } => ("retry", at, answer),
            End::NotYet { at } => ("notyet", at, None),
            End::Expired => ("expired", 0, None),
            End::Unknown(a) => ("unknown", 0, a),
        };
        let mut inv = self.on_account(&self.scripts.finish, account);
        inv.arg(now).arg(id.to_string()).arg(owner).arg(kind).arg(at);
        match &answer {
            Some(a) => {
                let body = &a.body[..a.body.len().min(super::ANSWER_MAX)];
                inv.arg("1").arg(a.status).arg(a.errcode.map(|e| e.to_string()).unwrap_or_default()).arg(body)
            }
            None => inv.arg("").arg(0).arg("").arg(""),
        };
        let reply: Vec<Value> = self.run(inv).await?;
        match reply.as_slice() {
            [held] if int(held, S)? == 0 => Ok(false),
            [_, caller, rule, head, jobs, bytes, callbacks] => {
                let (caller, rule) = (text(caller, S)?, text(rule, S)?);
                let totals = Some((int(jobs, S)?, int(bytes, S)?));
                self.note(account, &caller, &rule, Some(int(head, S)?), totals).await?;
                self.note_callbacks(account, int(callbacks, S)?).await?;
                Ok(true)
            }
            _ => Err(bad(S, format!("{} items", reply.len()))),
        }
    }

    /// [`JobStore::get`] in `account`'s keys.
    async fn get_in(&self, account: &Arc<str>, caller: &str, id: JobId) -> Result<Option<Job>, StoreError> {
        let key = format!("{}j:{id}", self.account_base(account));
        let fields: Vec<Value> = self.query(::redis::cmd("HGETALL").arg(key)).await?;
        if fields.is_empty() {
            return Ok(None);
        }
        let body: Option<Vec<u8>> =
            self.query(::redis::cmd("GET").arg(format!("{}b:{id}", self.account_base(account)))).await?;
        let job = job_from(account, Value::Array(fields), body.unwrap_or_default())?;
        Ok((&*job.new.queue.caller == caller).then_some(job))
    }

    /// [`JobStore::cancel`] in `account`'s keys.
    async fn cancel_in(&self, account: &str, caller: &str, id: JobId, now: Micros) -> Result<Cancelled, StoreError> {
        const S: &str = "jobs_cancel.lua";
        let mut inv = self.on_account(&self.scripts.cancel, account);
        inv.arg(now).arg(id.to_string()).arg(caller);
        let reply: Vec<Value> = self.run(inv).await?;
        let kind = reply.first().map(|v| text(v, S)).transpose()?.unwrap_or_default();
        match (kind.as_str(), reply.as_slice()) {
            ("none", _) => Ok(Cancelled::NotFound),
            ("late", [_, state]) => Ok(Cancelled::TooLate(state_from(&text(state, S)?)?)),
            ("ok", [_, rule, head, jobs, bytes, callbacks]) => {
                let totals = Some((int(jobs, S)?, int(bytes, S)?));
                self.note(account, caller, &text(rule, S)?, added_only(int(head, S)?), totals).await?;
                self.note_callbacks(account, int(callbacks, S)?).await?;
                Ok(Cancelled::Cancelled)
            }
            _ => Err(bad(S, kind)),
        }
    }

    /// recover on one account, all its runs; repairs the index and the
    /// caller totals from what the last run reports.
    async fn recover_account(&self, account: &str, now: Micros) -> Result<Recovered, StoreError> {
        let mut done = Recovered::default();
        for _ in 0..u16::MAX {
            let mut inv = self.on_account(&self.scripts.recover, account);
            inv.arg(now).arg(PER_RUN);
            let reply: Vec<Value> = self.run(inv).await?;
            let [requeued, unknown, more, heads, totals, callbacks, deadlines] =
                <[Value; 7]>::try_from(reply).map_err(|r| bad("jobs_recover.lua", format!("{} items", r.len())))?;
            done.requeued += int(&requeued, "jobs_recover.lua")?.max(0) as u64;
            done.unknown += int(&unknown, "jobs_recover.lua")?.max(0) as u64;
            if int(&more, "jobs_recover.lua")? == 1 {
                continue;
            }
            const S: &str = "jobs_recover.lua";
            self.note_callbacks(account, int(&callbacks, S)?).await?;
            self.note_deadlines(account, int(&deadlines, S)?).await?;
            self.note_reported(account, heads, totals, true, S).await?;
            break;
        }
        Ok(done)
    }
}

#[async_trait]
impl JobStore for RedisJobs {
    async fn submit(&self, job: NewJob, bounds: &Bounds, now: Micros) -> Result<Submitted, SubmitError> {
        let account = job.queue.account.clone();
        let (number, other_jobs, other_bytes) = self.intake(&account, &job.queue.caller).await?;
        let mut bytes = JobId::random().map_err(|_| StoreError::Redis("no random source for a job id".into()))?.0;
        bytes[..4].copy_from_slice(&number.to_be_bytes());
        let id = JobId(bytes);
        let given = |v: &Option<String>| v.as_ref().map(|v| format!("={v}")).unwrap_or_default();
        let mut inv = self.on_account(&self.scripts.submit, &account);
        inv.arg(now)
            .arg(id.to_string())
            .arg(&*job.queue.caller)
            .arg(&*job.queue.rule)
            .arg(&*job.domain)
            .arg(&job.method)
            .arg(&job.target)
            .arg(given(&job.content_type))
            .arg(&job.body[..])
            .arg(job.deadline_us.map(|d| d.to_string()).unwrap_or_default())
            .arg(given(&job.idempotency_key))
            .arg(given(&job.callback))
            .arg(bounds.caller_jobs)
            .arg(bounds.caller_bytes)
            .arg(bounds.account_jobs)
            .arg(bounds.account_bytes)
            .arg(bounds.idempotency_us)
            .arg(other_jobs)
            .arg(other_bytes)
            .arg(given(&job.traceparent))
            .arg(job.lanes.as_str())
            .arg(bounds.ended_jobs);
        let reply: Vec<Value> = self.run(inv).await?;
        const S: &str = "jobs_submit.lua";
        let kind = reply.first().map(|v| text(v, S)).transpose()?.unwrap_or_default();
        match (kind.as_str(), reply.as_slice()) {
            ("ok", [_, _, jobs, bytes, head, deadlines]) => {
                let q = &job.queue;
                let totals = Some((int(jobs, S)?, int(bytes, S)?));
                self.note(&account, &q.caller, &q.rule, added_only(int(head, S)?), totals).await?;
                self.note_deadlines(&account, int(deadlines, S)?).await?;
                Ok(Submitted { id, duplicate: false })
            }
            ("dup", [_, first]) => {
                let first = JobId::parse(&text(first, S)?).ok_or_else(|| bad(S, "an id"))?;
                Ok(Submitted { id: first, duplicate: true })
            }
            ("full", [_, bound]) => Err(SubmitError::Full(match text(bound, S)?.as_str() {
                "caller_jobs" => Bound::CallerJobs,
                "caller_bytes" => Bound::CallerBytes,
                "account_jobs" => Bound::AccountJobs,
                _ => Bound::AccountBytes,
            })),
            _ => Err(bad(S, kind).into()),
        }
    }

    async fn due_queues(&self, now: Micros, per_caller: usize) -> Result<Vec<QueueKey>, StoreError> {
        const S: &str = "jobs_due.lua";
        if per_caller == 0 {
            return Ok(Vec::new());
        }
        let mut inv = self.scripts.due.key(self.global("due-callers"));
        inv.arg(self.global("due:")).arg(now).arg(per_caller);
        let reply: Vec<String> = self.run(inv).await?;
        let mut out = Vec::with_capacity(reply.len() / 2);
        for pair in reply.chunks_exact(2) {
            let [caller, queue] = pair else { continue };
            let (account, rule) = queue.split_once('\n').ok_or_else(|| bad(S, "an entry without account and rule"))?;
            out.push(QueueKey { caller: caller.as_str().into(), account: account.into(), rule: rule.into() });
        }
        Ok(out)
    }

    async fn claim(
        &self,
        queue: &QueueKey,
        owner: &str,
        now: Micros,
        lease_us: Micros,
        max: usize,
    ) -> Result<Vec<Job>, StoreError> {
        const S: &str = "jobs_claim.lua";
        let mut inv = self.on_account(&self.scripts.claim, &queue.account);
        let scan = super::CLAIM_SCAN.max(max.saturating_mul(2));
        inv.arg(now).arg(owner).arg(lease_us).arg(max).arg(&*queue.caller).arg(&*queue.rule).arg(scan);
        let reply: Vec<Value> = self.run(inv).await?;
        let [head, jobs] = <[Value; 2]>::try_from(reply).map_err(|_| bad(S, "not 2 items"))?;
        let jobs = list(jobs, S)?
            .chunks_exact(2)
            .map(|pair| match pair {
                [fields, body] => {
                    let body = ::redis::from_redis_value_ref::<Option<Vec<u8>>>(body).map_err(|_| bad(S, "a body"))?;
                    job_from(&queue.account, fields.clone(), body.unwrap_or_default())
                }
                _ => Err(bad(S, "a job")),
            })
            .collect::<Result<Vec<Job>, StoreError>>()?;
        self.note(&queue.account, &queue.caller, &queue.rule, Some(int(&head, S)?), None).await?;
        Ok(jobs)
    }

    async fn renew(&self, ids: &[JobId], owner: &str, now: Micros, lease_us: Micros) -> Result<usize, StoreError> {
        let Some(first) = ids.first() else { return Ok(0) };
        let Some(account) = self.account_of(*first).await? else { return Ok(0) };
        let mut inv = self.on_account(&self.scripts.renew, &account);
        inv.arg(now).arg(owner).arg(now.saturating_add(lease_us));
        for id in ids {
            inv.arg(id.to_string());
        }
        let n: i64 = self.run(inv).await?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    async fn sending(&self, id: JobId, owner: &str, now: Micros) -> Result<bool, StoreError> {
        let Some(account) = self.account_of(id).await? else { return Ok(false) };
        if self.sending_in(&account, id, owner, now).await? {
            return Ok(true);
        }
        match self.renamed(id, &account).await? {
            Some(other) => self.sending_in(&other, id, owner, now).await,
            None => Ok(false),
        }
    }

    async fn finish(&self, id: JobId, owner: &str, end: End, now: Micros) -> Result<bool, StoreError> {
        let Some(account) = self.account_of(id).await? else { return Ok(false) };
        if self.finish_in(&account, id, owner, end.clone(), now).await? {
            return Ok(true);
        }
        match self.renamed(id, &account).await? {
            Some(other) => self.finish_in(&other, id, owner, end, now).await,
            None => Ok(false),
        }
    }

    async fn recover(&self, now: Micros) -> Result<Recovered, StoreError> {
        // The one index of an earlier build (`{#jobs}:due`, all callers in
        // one zset), read and written by nothing now: gone on the first
        // recover (one DEL per run; nothing when it is absent).
        self.query::<i64>(::redis::cmd("DEL").arg(self.global("due"))).await?;
        let mut total = Recovered::default();
        for account in self.accounts().await? {
            let one = self.recover_account(&account, now).await?;
            total.requeued += one.requeued;
            total.unknown += one.unknown;
        }
        Ok(total)
    }

    async fn expire(&self, now: Micros, max: usize) -> Result<Vec<ExpiredJob>, StoreError> {
        const S: &str = "jobs_expire.lua";
        if max == 0 {
            return Ok(Vec::new());
        }
        let accounts = self.accounts_by(&self.deadlines_key(), now, max.saturating_add(HELD_AHEAD)).await?;
        let mut out = Vec::new();
        for account in accounts {
            let left = max.saturating_sub(out.len());
            if left == 0 {
                break;
            }
            let mut inv = self.on_account(&self.scripts.expire, &account);
            inv.arg(now).arg(left);
            let reply: Vec<Value> = self.run(inv).await?;
            let [ended, heads, totals, callbacks, deadlines] =
                <[Value; 5]>::try_from(reply).map_err(|r| bad(S, format!("{} items", r.len())))?;
            let account: Arc<str> = account.into();
            for e in list(ended, S)?.chunks(4) {
                if let [id, caller, rule, submitted] = e {
                    let id = JobId::parse(&text(id, S)?).ok_or_else(|| bad(S, "an id"))?;
                    let queue = QueueKey {
                        caller: text(caller, S)?.into(),
                        account: account.clone(),
                        rule: text(rule, S)?.into(),
                    };
                    out.push(ExpiredJob { id, queue, submitted_us: int(submitted, S)? });
                }
            }
            self.note_reported(&account, heads, totals, false, S).await?;
            self.note_callbacks(&account, int(&callbacks, S)?).await?;
            self.note_deadlines(&account, int(&deadlines, S)?).await?;
        }
        Ok(out)
    }

    async fn get(&self, caller: &str, id: JobId) -> Result<Option<Job>, StoreError> {
        let Some(account) = self.account_of(id).await? else { return Ok(None) };
        if let Some(job) = self.get_in(&account, caller, id).await? {
            return Ok(Some(job));
        }
        match self.renamed(id, &account).await? {
            Some(other) => self.get_in(&other, caller, id).await,
            None => Ok(None),
        }
    }

    async fn cancel(&self, caller: &str, id: JobId, now: Micros) -> Result<Cancelled, StoreError> {
        let Some(account) = self.account_of(id).await? else { return Ok(Cancelled::NotFound) };
        match self.cancel_in(&account, caller, id, now).await? {
            Cancelled::NotFound => match self.renamed(id, &account).await? {
                Some(other) => self.cancel_in(&other, caller, id, now).await,
                None => Ok(Cancelled::NotFound),
            },
            done => Ok(done),
        }
    }

    async fn summary(&self, caller: Option<&str>) -> Result<Vec<QueueSummary>, StoreError> {
        let mut out: Vec<QueueSummary> = Vec::new();
        for account in self.accounts().await? {
            out.extend(self.account_summary(account, caller).await?);
        }
        out.sort_by(|a, b| a.queue.cmp(&b.queue));
        Ok(out)
    }

    async fn queue_summary(&self, queue: &QueueKey) -> Result<Option<QueueSummary>, StoreError> {
        let queues = self.account_summary(queue.account.to_string(), Some(&queue.caller)).await?;
        Ok(queues.into_iter().find(|q| q.queue == *queue))
    }

    async fn callbacks_due(
        &self,
        now: Micros,
        lease_us: Micros,
        max: usize,
        room: &CallerRoom,
    ) -> Result<Vec<DueCallback>, StoreError> {
        const S: &str = "jobs_callbacks.lua";
        if max == 0 {
            return Ok(Vec::new());
        }
        // Every account with a due callback (at most the config's
        // `[[account]]`s): an account whose due ones are all of callers
        // without room hands out nothing, and the next is read.
        let accounts = self.accounts_by(&self.callbacks_key(), now, i64::MAX as usize).await?;
        let mut room = room.clone();
        let mut out = Vec::new();
        for account in accounts {
            let left = max.saturating_sub(out.len());
            if left == 0 {
                break;
            }
            let mut inv = self.on_account(&self.scripts.callbacks, &account);
            inv.arg(now).arg(lease_us).arg(left).arg(room.each.min(i64::MAX as usize));
            for (caller, n) in &room.callers {
                inv.arg(caller).arg(*n);
            }
            let reply: Vec<Value> = self.run(inv).await?;
            let [jobs, head] = <[Value; 2]>::try_from(reply).map_err(|_| bad(S, "not 2 items"))?;
            let account: Arc<str> = account.into();
            for fields in list(jobs, S)? {
                let tries = field_of(&fields, "cbn")
                    .and_then(|t| t.parse::<u32>().ok())
                    .ok_or_else(|| bad(S, "a callback without its tries"))?;
                let due = DueCallback { job: job_from(&account, fields, Vec::new())?, tries };
                let caller = &*due.job.new.queue.caller;
                match room.callers.iter_mut().find(|(c, _)| c == caller) {
                    Some((_, n)) => *n = n.saturating_sub(1),
                    None => room.callers.push((caller.to_owned(), room.each.saturating_sub(1))),
                }
                out.push(due);
            }
            self.note_callbacks(&account, int(&head, S)?).await?;
        }
        Ok(out)
    }

    async fn callback_done(
        &self,
        id: JobId,
        tries: u32,
        retry_at: Option<Micros>,
        now: Micros,
    ) -> Result<bool, StoreError> {
        let Some(account) = self.account_of(id).await? else { return Ok(false) };
        if self.callback_done_in(&account, id, tries, retry_at, now).await? {
            return Ok(true);
        }
        match self.renamed(id, &account).await? {
            Some(other) => self.callback_done_in(&other, id, tries, retry_at, now).await,
            None => Ok(false),
        }
    }

    async fn purge(&self, now: Micros, keep_us: Micros) -> Result<u64, StoreError> {
        const S: &str = "jobs_purge.lua";
        let mut purged = 0u64;
        for account in self.accounts().await? {
            for _ in 0..u16::MAX {
                let mut inv = self.on_account(&self.scripts.purge, &account);
                inv.arg(now).arg(now.saturating_sub(keep_us)).arg(PER_RUN);
                let reply: Vec<Value> = self.run(inv).await?;
                let [n, more, gone] = <[Value; 3]>::try_from(reply).map_err(|_| bad(S, "not 3 items"))?;
                purged += int(&n, S)?.max(0) as u64;
                let gone =
                    list(gone, S)?.iter().map(|c| Ok((text(c, S)?, 0, 0))).collect::<Result<Vec<_>, StoreError>>()?;
                for totals in gone.chunks(200) {
                    self.note_all(&account, &[], totals).await?;
                }
                if int(&more, S)? == 0 {
                    break;
                }
            }
        }
        Ok(purged)
    }
}

/// A queue head for the index of due queues, as written by a script that
/// does not hold the queue's head (a submission, a cancel, an expire): a
/// due head is added, but "no due head" (`-1`: held, or the queue empty) is
/// not written. Its holder writes the truth after its own script (`claim`
/// before it sends, `finish` after), and a late "held" from here, crossing
/// that `finish`'s write, would take a due queue out of the index until
/// the next `recover` (seen: a submission while the head was sending). An
/// emptied queue left in the index costs one `claim` that hands out
/// nothing and writes the truth.
fn added_only(head: i64) -> Option<i64> {
    (head >= 0).then_some(head)
}

fn empty_summary(account: &Arc<str>, caller: &str, rule: &str) -> QueueSummary {
    QueueSummary::new(QueueKey { caller: caller.into(), account: account.clone(), rule: rule.into() })
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn bad(script: &'static str, reply: impl std::fmt::Display) -> StoreError {
    StoreError::BadReply { script, reply: reply.to_string() }
}

fn int(v: &Value, script: &'static str) -> Result<i64, StoreError> {
    ::redis::from_redis_value_ref::<i64>(v).map_err(|_| bad(script, format!("{v:?}")))
}

fn text(v: &Value, script: &'static str) -> Result<String, StoreError> {
    ::redis::from_redis_value_ref::<String>(v).map_err(|_| bad(script, "not text"))
}

fn list(v: Value, script: &'static str) -> Result<Vec<Value>, StoreError> {
    match v {
        Value::Array(items) => Ok(items),
        Value::Nil => Ok(Vec::new()),
        _ => Err(bad(script, "not a list")),
    }
}

fn state_from(s: &str) -> Result<JobState, StoreError> {
    Ok(match s {
        "queued" => JobState::Queued,
        "waiting" => JobState::Waiting,
        "claimed" => JobState::Claimed,
        "sending" => JobState::Sending,
        "sent" => JobState::Sent,
        "failed" => JobState::Failed,
        "expired" => JobState::Expired,
        "cancelled" => JobState::Cancelled,
        "unknown" => JobState::Unknown,
        other => return Err(bad("a job's state", other)),
    })
}

/// One field of a job's hash as HGETALL gave it.
fn field_of(fields: &Value, name: &str) -> Option<String> {
    let Value::Array(items) = fields else { return None };
    items.chunks(2).find_map(|pair| match pair {
        [k, v] if ::redis::from_redis_value_ref::<String>(k).ok()? == name => {
            ::redis::from_redis_value_ref::<String>(v).ok()
        }
        _ => None,
    })
}

/// A job from its hash's fields (HGETALL) and its body, of `account`.
fn job_from(account: &Arc<str>, fields: Value, body: Vec<u8>) -> Result<Job, StoreError> {
    const S: &str = "a job's hash";
    let items = list(fields, S)?;
    let mut f: HashMap<String, Vec<u8>> = HashMap::with_capacity(items.len() / 2);
    for pair in items.chunks(2) {
        if let [k, v] = pair {
            let v = ::redis::from_redis_value_ref::<Vec<u8>>(v).map_err(|_| bad(S, "a field"))?;
            f.insert(text(k, S)?, v);
        }
    }
    let s = |name: &str| f.get(name).map(|v| String::from_utf8_lossy(v).into_owned());
    let need = |name: &'static str| s(name).ok_or_else(|| bad(S, format!("no {name}")));
    let num = |name: &'static str| -> Result<i64, StoreError> {
        need(name)?.parse::<i64>().map_err(|_| bad(S, format!("{name} not a number")))
    };
    let id_text = need("id_")?;
    let id = JobId::parse(&id_text).ok_or_else(|| bad(S, "id"))?;
    let answer = match f.get("as") {
        Some(status) => Some(Answer {
            status: String::from_utf8_lossy(status).parse().map_err(|_| bad(S, "as"))?,
            errcode: s("ae").map(|e| e.parse().map_err(|_| bad(S, "ae"))).transpose()?,
            body: Bytes::from(f.get("ab").cloned().unwrap_or_default()),
        }),
        None => None,
    };
    Ok(Job {
        id,
        new: NewJob {
            queue: QueueKey { caller: need("c")?.into(), account: account.clone(), rule: need("r")?.into() },
            domain: need("dom")?.into(),
            method: need("m")?,
            target: need("tg")?,
            content_type: s("ct"),
            body: Bytes::from(body),
            deadline_us: f.get("dl").map(|_| num("dl")).transpose()?,
            idempotency_key: s("ik"),
            callback: s("cb"),
            traceparent: s("tp"),
            lanes: super::Lanes(s("ln").unwrap_or_else(|| super::Lanes::STRICT.to_owned())),
        },
        seq: num("seq")?.max(0) as u64,
        state: state_from(&need("st")?)?,
        submitted_us: num("sub")?,
        due_us: num("due")?,
        owner: s("o").map(Arc::from),
        lease_us: num("l")?,
        attempts: u32::try_from(num("at")?).unwrap_or(0),
        answer,
        updated_us: num("up")?,
    })
}
