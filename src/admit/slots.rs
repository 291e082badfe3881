//! Concurrency slots held by this instance's calls.
//!
//! A slot is taken by the decision (in the store, with a lease) and freed
//! when the call ends: its answer fully relayed, failed, or abandoned by the
//! client. [`SlotGuard`] frees it on drop, wherever the call ends. While a
//! call lives, a background task renews its lease; if this instance dies,
//! its slots come back when their leases run out.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::Notify;

use crate::limit::{Key, Rule};
use crate::store::pair_op::{Release, Renew};
use crate::store::Store;
use crate::time::Micros;

/// A live slot: its account, rule and quota offset.
#[derive(Clone)]
struct Live {
    account: String,
    rule: Arc<Rule>,
    offset_us: Micros,
}

/// The live slots of this instance.
pub struct Slots {
    /// Unique per process, so holder ids never collide across instances.
    instance: String,
    counter: AtomicU64,
    live: Mutex<HashMap<String, Live>>,
    /// Releases sent to the store and not yet answered.
    releasing: AtomicU64,
    /// Woken each time one of this instance's slots has been freed.
    pub freed: Notify,
}

impl Slots {
    pub fn new() -> Slots {
        let instance =
            format!("{:016x}", std::hash::BuildHasher::hash_one(&std::hash::RandomState::new(), std::process::id()));
        Slots {
            instance,
            counter: AtomicU64::new(0),
            live: Mutex::default(),
            releasing: AtomicU64::new(0),
            freed: Notify::new(),
        }
    }

    /// A fresh holder id: `<instance>:<n>`.
    pub fn holder_id(&self) -> String {
        format!("{}:{}", self.instance, self.counter.fetch_add(1, Ordering::Relaxed))
    }

    fn live(&self) -> std::sync::MutexGuard<'_, HashMap<String, Live>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Number of slots this instance holds now.
    pub fn len(&self) -> usize {
        self.live().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits until every slot of this instance is freed in the store, or
    /// `limit` passes; true if all were.
    pub async fn wait_released(&self, limit: Duration) -> bool {
        let settled = async {
            loop {
                let freed = self.freed.notified();
                tokio::pin!(freed);
                freed.as_mut().enable();
                if self.is_empty() && self.releasing.load(Ordering::Acquire) == 0 {
                    return;
                }
                freed.await;
            }
        };
        tokio::time::timeout(limit, settled).await.is_ok()
    }

    /// Records a slot the store granted; it is freed when the guard drops.
    pub fn track(
        self: &Arc<Self>,
        store: Arc<dyn Store>,
        account: &str,
        rule: Arc<Rule>,
        holder: String,
        offset_us: Micros,
    ) -> SlotGuard {
        self.live().insert(holder.clone(), Live { account: account.to_owned(), rule: rule.clone(), offset_us });
        SlotGuard { slots: self.clone(), store, account: account.to_owned(), rule, holder, offset_us }
    }

    /// Renews the leases of every live slot every `lease / 3`, until the
    /// owner (the app) is gone.
    pub fn spawn_renewal(slots: Weak<Slots>, store: Weak<dyn Store>, lease_us: Micros) {
        let every = Duration::from_micros((lease_us / 3).max(100_000) as u64);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let (Some(slots), Some(store)) = (slots.upgrade(), store.upgrade()) else { return };
                // One renewal per (account, rule), for all of its live slots.
                let snapshot: Vec<(String, Live)> = slots.live().iter().map(|(h, l)| (h.clone(), l.clone())).collect();
                let mut index: HashMap<(String, Arc<str>), usize> = HashMap::new();
                let mut groups: Vec<(Live, Vec<String>)> = Vec::new();
                for (holder, l) in snapshot {
                    let i = *index.entry((l.account.clone(), l.rule.state.clone())).or_insert_with(|| {
                        groups.push((l.clone(), Vec::new()));
                        groups.len() - 1
                    });
                    groups[i].1.push(holder);
                }
                for (l, holders) in groups {
                    let key = Key { account: &l.account, rule: &l.rule, offset_us: l.offset_us };
                    let ids: Vec<&str> = holders.iter().map(String::as_str).collect();
                    if let Err(e) = store.apply(key, Renew { holders: &ids, lease_us }).await {
                        tracing::warn!(rule = %l.rule.name, error = %e, "could not renew concurrency leases");
                    }
                }
            }
        });
    }
}

impl Default for Slots {
    fn default() -> Self {
        Slots::new()
    }
}

/// Frees its slot when dropped.
pub struct SlotGuard {
    slots: Arc<Slots>,
    store: Arc<dyn Store>,
    account: String,
    rule: Arc<Rule>,
    holder: String,
    offset_us: Micros,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        self.slots.live().remove(&self.holder);
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
        self.slots.releasing.fetch_add(1, Ordering::AcqRel);
        let slots = self.slots.clone();
        let store = self.store.clone();
        let account = std::mem::take(&mut self.account);
        let rule = self.rule.clone();
        let holder = std::mem::take(&mut self.holder);
        let offset = self.offset_us;
        rt.spawn(async move {
            let key = Key { account: &account, rule: &rule, offset_us: offset };
            if let Err(e) = store.apply(key, Release { holder: &holder }).await {
                // The lease runs out by itself; until then the slot stays taken.
                tracing::warn!(rule = %rule.name, error = %e, "could not free a concurrency slot");
            }
            slots.releasing.fetch_sub(1, Ordering::AcqRel);
            slots.freed.notify_waiters();
        });
    }
}
