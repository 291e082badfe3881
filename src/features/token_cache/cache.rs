//! The token cache's shared state ([`TokenCache`], in `Base::token_cache`)
//! and how it is built from `[tokens]` and the store ([`TokenCache::open`]).
//!
//! Where the slots live: in the store (`TokenStore::claim_token` and the rest)
//! when it is shared (Redis with a token key: one token per account for
//! every instance, sealed), else in an in-process memory store (the
//! embedded store itself, or a separate one beside Redis without a key).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use super::seal::{parse_key, KeyError, SealError, Sealer, KEY_LEN};
use crate::config::{Invalid, StoreConfig, TokensConfig};
use crate::store::memory::MemoryStore;
use crate::store::tokens::Fetched;
use crate::store::Store;
use crate::telemetry::metrics::TokenMetrics;
use crate::time::{Clock, Micros};

/// The environment variable holding the token key.
pub const KEY_ENV: &str = "WXGATE_TOKEN_KEY";

/// Why the token cache `[tokens]` asks for cannot be opened: its key
/// (wxgate does not start).
#[derive(Debug, thiserror::Error)]
pub enum TokenCacheError {
    /// `WXGATE_TOKEN_KEY` is not a key.
    #[error("{KEY_ENV}: {0}")]
    EnvKey(KeyError),
    /// Others may read `[tokens] key_file` (or it is not there).
    #[error(transparent)]
    KeyFileMode(#[from] Invalid),
    /// `[tokens] key_file` cannot be read.
    #[error("[tokens] key_file: {}: {source}", .path.display())]
    KeyFileRead { path: std::path::PathBuf, source: std::io::Error },
    /// `[tokens] key_file` holds no key.
    #[error("[tokens] key_file: {}: {source}", .path.display())]
    KeyFile { path: std::path::PathBuf, source: KeyError },
    #[error(transparent)]
    Sealer(#[from] SealError),
}

/// For `Features::new`, which passes a message on until it returns a
/// typed error of its own (issue 62).
/// How long waiters see the answer of a fetch WeChat refused.
pub const FAILED_HOLD_US: Micros = 2_000_000;

/// What a fetch lock lasts beyond the fetch itself: the store's answers.
const LOCK_MARGIN_US: Micros = 1_000_000;

/// The longest a token fetch takes once sent, by `[server]`'s timeouts:
/// connecting to each upstream in turn (`upstream_timeout` each: a call goes
/// to the next only when it never reached one), the request (its body is
/// read whole before; `body_timeout` without progress), the answer's head
/// (`upstream_timeout`), the answer's body (`body_timeout`). 80 s with the
/// defaults and one upstream.
pub fn fetch_us(server: &crate::config::Server) -> Micros {
    let upstreams = i64::try_from(server.upstream.iter().count().max(1)).unwrap_or(i64::MAX);
    let each = crate::config::units::micros(server.upstream_timeout);
    let body = crate::config::units::micros(server.body_timeout);
    each.saturating_mul(upstreams.saturating_add(1)).saturating_add(body.saturating_mul(2))
}

/// The token cache of this instance.
pub struct TokenCache {
    /// Where the slots are: the app's store when shared, else in-process.
    pub store: Arc<dyn Store>,
    /// Slots are shared by every instance (Redis with a token key).
    pub shared: bool,
    pub sealer: Sealer,
    pub min_ttl_us: Micros,
    pub wait: Duration,
    /// This instance's id, the start of every holder id.
    instance: String,
    seq: AtomicU64,
    /// A fetch of this instance ended: its local waiters look again at once.
    pub done: Notify,
    /// The tokens this instance served or fetched, per account, until
    /// they expire: what quota_sync calls quota/get with. In memory only.
    known: Mutex<HashMap<String, (String, Micros)>>,
    /// The token of each `[[account]]` this instance last had from the
    /// store, to add to calls without asking the store each time
    /// (`crate::features::broker`).
    pub held: std::sync::RwLock<HashMap<Arc<str>, HeldToken>>,
    /// The tickets this instance served, per (account, ticket), and when
    /// last: those the broker renews ahead of expiry for held accounts.
    tickets: Mutex<HashMap<(String, super::ask::Ticket), TicketSeen>>,
    pub metrics: TokenMetrics,
}

impl TokenCache {
    /// The cache `[tokens]` asks for over `store`, or `None` when it is off.
    /// The key comes from `WXGATE_TOKEN_KEY`, else `[tokens] key_file`
    /// (refused if others may read it). Defaults: on for the embedded
    /// store; on over Redis when a key is given (shared), off without one
    /// (per-instance caches would each fetch their own token, and each
    /// fetch knocks out the others' after 5 minutes: the storm the cache
    /// is there to prevent); `cache = true` over Redis without a key
    /// caches in-process, with a warning.
    pub fn open(
        config: &TokensConfig,
        store_config: &StoreConfig,
        store: &Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        metrics: TokenMetrics,
    ) -> Result<Option<Arc<TokenCache>>, TokenCacheError> {
        let key = read_key(config)?;
        let redis = matches!(store_config, StoreConfig::Redis(_));
        let on = config.cache.unwrap_or(!redis || key.is_some());
        if !on {
            if redis {
                tracing::info!(
                    "[tokens] cache is off: no token key ({KEY_ENV} or [tokens] key_file) to share tokens in Redis"
                );
            }
            return Ok(None);
        }
        let (slots, shared): (Arc<dyn Store>, bool) = match (redis, &key) {
            (true, Some(_)) => (store.clone(), true),
            (true, None) => {
                tracing::warn!(
                    "[tokens] cache = true without a token key ({KEY_ENV} or [tokens] key_file): tokens are cached \
                     in this instance only; several instances each fetch their own token, and each fetch invalidates \
                     the others' five minutes later"
                );
                (Arc::new(MemoryStore::new(clock)), false)
            }
            (false, _) => (store.clone(), false),
        };
        let sealer = match &key {
            Some(k) => Sealer::new(k)?,
            None => Sealer::random()?,
        };
        let instance = format!("{:016x}", rand_u64()?);
        tracing::info!(
            shared = shared,
            "[tokens] cache on: one access token per account and secret{}",
            if shared { ", shared by every instance through Redis (sealed)" } else { ", in this process" }
        );
        Ok(Some(Arc::new(TokenCache {
            store: slots,
            shared,
            sealer,
            min_ttl_us: crate::config::units::micros(config.min_ttl),
            wait: config.wait,
            instance,
            seq: AtomicU64::new(0),
            done: Notify::new(),
            known: Mutex::default(),
            tickets: Mutex::default(),
            held: Default::default(),
            metrics,
        })))
    }

    /// The slot of the tokens of `kind` for (`id`, `secret`): a request with
    /// another secret names another slot ([`Sealer::secret_hash`]).
    pub fn slot(&self, kind: super::ask::SlotKind, id: &str, secret: &[u8]) -> String {
        format!("{}:{id}:{}", kind.as_str(), self.sealer.secret_hash(kind.as_str(), id, secret))
    }

    /// How long a slot's fetch lock lasts, so that no second fetch starts
    /// while one may still be in flight: `[tokens] wait`, plus `held_us`
    /// (the token rule's `max_wait`: the fetch may be held that long before
    /// it is sent), plus the longest the fetch may take once sent
    /// ([`fetch_us`]), plus a second for the store. An instance that dies
    /// mid-fetch blocks its slot that long at most (its waiters get 503
    /// after `wait`, as when a fetch is slow).
    pub fn lock_us(&self, server: &crate::config::Server, held_us: Micros) -> Micros {
        crate::config::units::micros(self.wait)
            .saturating_add(held_us)
            .saturating_add(fetch_us(server))
            .saturating_add(LOCK_MARGIN_US)
    }

    /// A fresh id for one asker.
    pub fn holder(&self) -> String {
        format!("{}-{}", self.instance, self.seq.fetch_add(1, Ordering::Relaxed))
    }

    /// quota_sync's holder id for this instance.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// `token` of `account` is valid until `until` (this process's clock).
    pub fn remember(&self, account: &str, token: &str, until: Micros) {
        let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        match known.get_mut(account) {
            Some(entry) if entry.0 == token => entry.1 = until,
            _ => {
                known.insert(account.to_owned(), (token.to_owned(), until));
            }
        }
    }

    /// WeChat rejected `token`: forgotten if it is the one known for its account.
    pub fn forget(&self, token: &[u8]) {
        let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        known.retain(|_, (t, _)| t.as_bytes() != token);
    }

    /// A ticket of `account` was asked for at `now`.
    pub fn ticket_used(&self, account: &str, ticket: super::ask::Ticket, now: Micros) {
        let mut tickets = self.tickets.lock().unwrap_or_else(|e| e.into_inner());
        tickets.entry((account.to_owned(), ticket)).or_insert(TicketSeen { used: now, until: None }).used = now;
    }

    /// A ticket of `account` is cached until `until` (this process's clock).
    pub fn ticket_until(&self, account: &str, ticket: super::ask::Ticket, until: Micros) {
        let mut tickets = self.tickets.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(seen) = tickets.get_mut(&(account.to_owned(), ticket)) {
            seen.until = Some(until);
        }
    }

    /// The tickets of `account` asked for since `since` (older ones
    /// forgotten) and seen cached until a time before `due_before`: those
    /// to renew. A ticket dropped (its token rejected) or never stored is
    /// not renewed: the next request fetches it.
    pub fn tickets_due(
        &self,
        account: &str,
        since: Micros,
        now: Micros,
        due_before: Micros,
    ) -> Vec<super::ask::Ticket> {
        let mut tickets = self.tickets.lock().unwrap_or_else(|e| e.into_inner());
        tickets.retain(|_, seen| seen.used >= since);
        tickets
            .iter()
            .filter(|((a, _), seen)| a == account && seen.until.is_some_and(|u| u > now && u < due_before))
            .map(|((_, t), _)| *t)
            .collect()
    }

    /// The accounts with a token valid at `now`, and that token.
    pub fn known(&self, now: Micros) -> Vec<(String, String)> {
        let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        known.retain(|_, (_, until)| *until > now);
        known.iter().map(|(a, (t, _))| (a.clone(), t.clone())).collect()
    }
}

fn rand_u64() -> Result<u64, SealError> {
    use ring::rand::SecureRandom;
    let mut b = [0u8; 8];
    ring::rand::SystemRandom::new().fill(&mut b).map_err(|_| SealError::Random)?;
    Ok(u64::from_le_bytes(b))
}

/// The token key: `WXGATE_TOKEN_KEY`, else `[tokens] key_file`, else none.
fn read_key(config: &TokensConfig) -> Result<Option<[u8; KEY_LEN]>, TokenCacheError> {
    if let Ok(text) = std::env::var(KEY_ENV) {
        return parse_key(&text).map(Some).map_err(TokenCacheError::EnvKey);
    }
    let Some(path) = &config.key_file else { return Ok(None) };
    // The one rule of every secret file: no one but its owner and group
    // reads it, no one but its owner writes it (a Kubernetes Secret mounted
    // 0440 for the pod's fsGroup passes).
    crate::config::units::check_secret_mode(
        path,
        "[tokens] key_file",
        "whoever reads it can read every cached access token and tell learned tokens apart",
    )?;
    let text =
        std::fs::read_to_string(path).map_err(|source| TokenCacheError::KeyFileRead { path: path.clone(), source })?;
    parse_key(&text).map(Some).map_err(|source| TokenCacheError::KeyFile { path: path.clone(), source })
}

/// A ticket this instance served: when last asked for, and until when it
/// was last seen cached.
struct TicketSeen {
    used: Micros,
    until: Option<Micros>,
}

/// An `[[account]]`'s token as this instance holds it.
pub struct HeldToken {
    /// The secret it was had for (a reload with a rotated one misses).
    pub secret: crate::config::accounts::Secret,
    pub token: String,
    /// Until when it is added to calls (this process's clock).
    pub until: Micros,
}

/// A fetch this call won (`Claim::Won`): reported to the store when the
/// call learns how it ended ([`Fetch::finish`]); if the call ends first (a
/// refusal, an upstream failure, the client leaving), the lock is released
/// on drop so the next asker fetches.
pub struct Fetch {
    pub cache: Arc<TokenCache>,
    pub slot: String,
    pub holder: String,
    pub kind: super::ask::SlotKind,
    pub account: String,
    finished: bool,
}

impl Fetch {
    pub fn new(
        cache: Arc<TokenCache>,
        slot: String,
        holder: String,
        kind: super::ask::SlotKind,
        account: String,
    ) -> Fetch {
        Fetch { cache, slot, holder, kind, account, finished: false }
    }

    /// Reports how the fetch ended, and wakes this instance's waiters.
    pub async fn finish(mut self, fetched: Fetched<'_>) {
        self.finished = true;
        if let Err(e) = self.cache.store.tokens().token_fetched(&self.slot, &self.holder, fetched).await {
            tracing::warn!(error = %e, "could not store a fetched access token: the next token request fetches again");
        }
        self.cache.done.notify_waiters();
    }
}

impl Drop for Fetch {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let (cache, slot, holder) =
            (self.cache.clone(), std::mem::take(&mut self.slot), std::mem::take(&mut self.holder));
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = cache.store.tokens().token_fetched(&slot, &holder, Fetched::Abandoned).await {
                    tracing::debug!(error = %e, "could not release a token fetch lock: it expires by itself");
                }
                cache.done.notify_waiters();
            });
        }
    }
}
