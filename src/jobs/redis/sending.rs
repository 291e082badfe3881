//! [`JobStore::sending`](crate::jobs::JobStore::sending) on Redis: the mark
//! is on a replica before the request goes out, so that no failover can
//! hand the job out again (docs/redis-store.md, "Queued jobs through a
//! failover").
//!
//! Why: a job found `sending` is never sent again (it ends `unknown`), but
//! replication is asynchronous. A master that crashes right after
//! `jobs_sending.lua` may not have passed the mark on; its promoted replica
//! then holds the job `claimed` or `queued`, and it is sent a second time.
//!
//! How: the script and a `WAIT <n> <ms>` go in one pipeline, so both run on
//! one connection to the master of the job's slot (in a Cluster the
//! pipeline goes where its script's key is: redis-rs would send a lone
//! `WAIT` to every master and keep the least answer). `WAIT` answers how many
//! replicas hold everything that connection wrote, the mark included; it
//! cannot run inside a script. The script also reports how many replicas
//! the master has online and its replication id, which this instance keeps
//! per slot to know, for the next mark, whether to put a `WAIT` in the
//! pipeline. When it did not (the master gained a replica since), a second
//! pipeline checks the mark is still there, writes, and waits: a `WAIT`
//! covers its own connection's writes only, and a connection remade in
//! between (after an I/O error) would otherwise answer at once for a
//! write it never made.
//!
//! `[queue] replicas` says how many must have it: `"auto"` (the default)
//! one, if the master has or had one under its present replication id (a
//! master that lost its replicas is what a failover under way looks like
//! from the old master's side), none for a master that never had one; a
//! number, that many always.
//!
//! Not confirmed in time (`WAIT` gives up after half of `[store] timeout`):
//! the request does not go, and the mark is taken back (`undo`: `claimed`
//! again, the attempt uncounted). That is sound wherever the undo lands: the
//! request never went, so any end that leads to one send is right. On the
//! master that has the mark it makes the job `claimed` again; on a promoted
//! replica that lacks it, the job is `claimed` there already and the undo
//! changes nothing; if the undo is lost with its master, the job ends
//! `unknown` when its lease runs out: never sent, never twice. The send is
//! then refused as a store error (the dispatcher hands the job back, `NotYet`,
//! and tries again a second later).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use ::redis::cluster_routing::Slot;
use ::redis::{ErrorKind, ServerErrorKind, Value};

use super::{bad, int, lock, text, RedisJobs};
use crate::config::queue::Replicas;
use crate::jobs::JobId;
use crate::store::StoreError;
use crate::time::{Micros, Stopwatch};

const S: &str = "jobs_sending.lua";

/// A warning of marks not confirmed is logged at most this often.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// What this instance last saw of the master of each slot it marked a job
/// in (one entry for a single server or Sentinel): at most 16,384 entries.
#[derive(Default)]
pub(super) struct Masters {
    seen: Mutex<HashMap<Slot, Seen>>,
    warned: Mutex<Option<Stopwatch>>,
}

/// One master as its last mark's script reported it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Seen {
    /// Its replication id (another after a failover).
    replid: String,
    /// Replicas online.
    online: u32,
    /// Whether it had one online at some mark under this replication id.
    had: bool,
}

impl Seen {
    /// The replicas a mark on this master must reach under `replicas`.
    fn needed(&self, replicas: Replicas) -> u32 {
        match replicas {
            Replicas::Auto => u32::from(self.had || self.online > 0),
            Replicas::Exactly(n) => n,
        }
    }

    /// The `WAIT` to put after the next mark's script: the replicas
    /// needed, if the master had them last time (a `WAIT` for replicas it
    /// does not have would only wait out its time).
    fn wait_for(&self, replicas: Replicas) -> u32 {
        let n = self.needed(replicas);
        if self.online >= n {
            n
        } else {
            0
        }
    }

    /// After a script reported the master has `online` replicas under `replid`.
    fn saw(&mut self, online: u32, replid: String) {
        if replid != self.replid {
            *self = Seen { replid, online: 0, had: false };
        }
        self.online = online;
        self.had |= online > 0;
    }
}

/// What one pipeline answered: the script's `{done, replicas, replid}`,
/// and what `WAIT` answered (0 when there was none).
struct Round {
    done: bool,
    online: u32,
    replid: String,
    acked: u32,
}

impl RedisJobs {
    /// [`JobStore::sending`](crate::jobs::JobStore::sending) in `account`'s
    /// keys ([module docs](self)).
    pub(super) async fn sending_in(
        &self,
        account: &str,
        id: JobId,
        owner: &str,
        now: Micros,
    ) -> Result<bool, StoreError> {
        let slot = self.slot_of(account);
        let before = lock(&self.masters.seen).get(&slot).cloned().unwrap_or_default();
        let waited = before.wait_for(self.replicas);
        let mark = self.round("mark", account, id, owner, now, waited).await?;
        if !mark.done {
            return Ok(false);
        }
        let seen = {
            let mut all = lock(&self.masters.seen);
            let seen = all.entry(slot).or_default();
            seen.saw(mark.online, mark.replid);
            seen.clone()
        };
        let needed = seen.needed(self.replicas);
        if needed == 0 || (waited >= needed && mark.acked >= needed) {
            return Ok(true);
        }
        // The master has enough replicas now, but this pipeline did not
        // wait for that many: check and wait once more.
        if seen.online >= needed && waited < needed {
            let check = self.round("check", account, id, owner, now, needed).await?;
            if !check.done {
                return Ok(false);
            }
            if check.acked >= needed {
                return Ok(true);
            }
        }
        self.take_back(account, id, owner, now, needed, seen.online).await
    }

    /// The mark was not on `needed` replicas in time: taken back, and the
    /// send refused (its request never went).
    async fn take_back(
        &self,
        account: &str,
        id: JobId,
        owner: &str,
        now: Micros,
        needed: u32,
        online: u32,
    ) -> Result<bool, StoreError> {
        let undone = self.round("undo", account, id, owner, now, 0).await;
        let why = format!(
            "a queued job's sending mark was not on {needed} Redis replica(s) within {:?} (the master has {online} \
             online): not sent, tried again later",
            self.wait_time()
        );
        {
            let mut warned = lock(&self.masters.warned);
            if warned.as_ref().is_none_or(|t| t.elapsed() >= WARN_EVERY) {
                *warned = Some(Stopwatch::start());
                match &undone {
                    Ok(_) => tracing::warn!(job = %id, "{why}"),
                    Err(e) => {
                        tracing::warn!(job = %id, error = %e, "{why}; the mark could not be taken back: the job ends unknown when its lease runs out")
                    }
                }
            }
        }
        Err(StoreError::Redis(why))
    }

    /// What `WAIT` may take: half of `[store] timeout`, the other half
    /// left for the round trip and the script (the connection gives up on
    /// a reply after the whole `timeout`).
    fn wait_time(&self) -> Duration {
        (self.timeout / 2).max(Duration::from_millis(1))
    }

    /// The slot whose master holds `account`'s jobs (one for all on a
    /// single server or Sentinel).
    fn slot_of(&self, account: &str) -> Slot {
        if self.cluster {
            Slot::for_key(self.account_base(account))
        } else {
            Slot::for_key("")
        }
    }

    /// One pipeline on this thread's lane: jobs_sending.lua doing `what`,
    /// then `WAIT wait <ms>` when `wait` > 0, within `[store] timeout`.
    async fn round(
        &self,
        what: &str,
        account: &str,
        id: JobId,
        owner: &str,
        now: Micros,
        wait: u32,
    ) -> Result<Round, StoreError> {
        let base = self.account_base(account);
        let mut pipe = ::redis::pipe();
        pipe.cmd("EVALSHA")
            .arg(self.scripts.sending.get_hash())
            .arg(1)
            .arg(format!("{base}meta"))
            .arg(&base)
            .arg(now)
            .arg(id.to_string())
            .arg(owner)
            .arg(what);
        if wait > 0 {
            let ms = self.wait_time().as_millis().clamp(1, u128::from(u32::MAX)) as u64;
            pipe.cmd("WAIT").arg(wait).arg(ms);
        }
        let lane = self.conns.lane();
        let mut conn = self.conns.conn(lane);
        let reply = tokio::time::timeout(self.timeout, async {
            match pipe.query_async::<Vec<Value>>(&mut conn).await {
                // Redis lost its scripts (a restart, a failover): load it
                // and run the pipeline once more.
                Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    self.scripts.sending.load_async(&mut conn).await?;
                    pipe.query_async::<Vec<Value>>(&mut conn).await
                }
                other => other,
            }
        })
        .await;
        let reply = self.conns.outcome(lane, reply, self.timeout)?;
        let (script, acked) = match reply.as_slice() {
            [script] => (script, 0),
            [script, acked] => (script, int(acked, S)?),
            _ => return Err(bad(S, format!("{} replies", reply.len()))),
        };
        let Value::Array(fields) = script else { return Err(bad(S, "not a list")) };
        let [done, online, replid] = fields.as_slice() else { return Err(bad(S, "not 3 items")) };
        Ok(Round {
            done: int(done, S)? == 1,
            online: u32::try_from(int(online, S)?).map_err(|_| bad(S, "replicas"))?,
            replid: text(replid, S)?,
            acked: u32::try_from(acked.max(0)).unwrap_or(u32::MAX),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(replid: &str, online: u32, had: bool) -> Seen {
        Seen { replid: replid.into(), online, had }
    }

    #[test]
    fn auto_needs_one_replica_once_the_master_had_one_until_its_replication_id_changes() {
        let mut s = Seen::default();
        assert_eq!((s.needed(Replicas::Auto), s.wait_for(Replicas::Auto)), (0, 0), "nothing seen yet");
        s.saw(0, "a".into());
        assert_eq!(s.needed(Replicas::Auto), 0, "a master that never had a replica");
        s.saw(2, "a".into());
        assert_eq!((s.needed(Replicas::Auto), s.wait_for(Replicas::Auto)), (1, 1));
        // Its replicas gone (a failover under way, seen from the old
        // master): still one needed, and no WAIT that could only time out.
        s.saw(0, "a".into());
        assert_eq!(s, seen("a", 0, true));
        assert_eq!((s.needed(Replicas::Auto), s.wait_for(Replicas::Auto)), (1, 0));
        // Another server (a promoted replica) that has none.
        s.saw(0, "b".into());
        assert_eq!(s, seen("b", 0, false));
        assert_eq!(s.needed(Replicas::Auto), 0);
    }

    #[test]
    fn a_number_of_replicas_is_needed_whatever_the_master_has() {
        let s = seen("a", 1, true);
        assert_eq!((s.needed(Replicas::Exactly(2)), s.wait_for(Replicas::Exactly(2))), (2, 0));
        assert_eq!((s.needed(Replicas::Exactly(1)), s.wait_for(Replicas::Exactly(1))), (1, 1));
        assert_eq!((s.needed(Replicas::Exactly(0)), s.wait_for(Replicas::Exactly(0))), (0, 0));
    }
}
