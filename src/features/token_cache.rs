//! One access token per account for every replica: token requests
//! answered from a cache, with a single fetch per (account, secret) across
//! all instances ([`serve`]), tokens WeChat rejects dropped ([`rejected`]).
//!
//! Why: each `/cgi-bin/token` fetch invalidates the account's previous
//! token five minutes later, so replicas that fetch their own tokens knock
//! each other out (40001 storms) and burn the 2,000-a-day token quota.
//!
//! A cacheable token request ([`ask`]) names a **slot**: `<kind>:<appid>:
//! <HMAC of the secret>` ([`seal`]): a request with another secret names
//! another slot, so it never gets a token cached for the right one; it goes
//! to WeChat and gets WeChat's error. For its slot, the request (after
//! identify and route, before decide) asks the store ([`crate::store::TokenStore::claim_token`]):
//!
//! - a cached token with more than `[tokens] min_ttl` left is answered at
//!   once, WeChat-shaped, with `expires_in` what remains (outcome `cached`;
//!   never forwarded, so it takes nothing from the token rule's quota);
//! - else exactly one request, on any instance, wins the slot's fetch lock
//!   and goes on through decide and forward as usual (it counts against the
//!   token rule); its answer is sealed into the slot ([`fetched`]);
//! - every other asker waits (polling the store every [`POLL`], woken at
//!   once by a fetch of its own instance) for up to `[tokens] wait`, then
//!   gets the fetched token; if WeChat refused the fetch, the refusal
//!   (kept 2 s, never cached as a token); if the fetch ended without an
//!   answer (refused by wxgate's limits, WeChat unreachable), the next
//!   waiter fetches; past `wait`, 503 — never a second fetch while one is
//!   in flight.
//!
//! `stable_token` with `force_refresh: true` skips the cached token, and
//! joins a fetch already in flight instead of starting another.
//!
//! Cost: only token and ticket requests, and answers with errcode
//! 40001/40014/42001, do anything here; any other call costs this
//! feature's hooks a few checks: whether the cache is on, its path against
//! the token and ticket paths (`before_decide`), its answer's errcode
//! (`on_answer`).

pub mod ask;
pub mod cache;
pub mod seal;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::Response;

use self::ask::{answer, credential_of, SlotKind};
use self::cache::{Fetch, TokenCache, FAILED_HOLD_US};
use crate::admit::core::Core;
use crate::error::{Early, ProxyError};
use crate::features::accounts::query;
use crate::features::accounts::token_requests::TokenRequest;
use crate::features::hooks::{Answered, Asking, Env, Feature, Requesting};
use crate::store::tokens::{Claim, Fetched};
use crate::telemetry::metrics::Outcome;
use crate::time::deadline_after;
use crate::transport::body::RelayBody;
use crate::transport::sniff::Verdict;

/// How often a waiter looks at the store again.
pub const POLL: Duration = Duration::from_millis(20);
/// The errcodes that say a token is no longer valid.
pub const REJECTED: [i64; 3] = [40001, 40014, 42001];
/// Longest a fetched token is cached, whatever its `expires_in` says.
const MAX_TTL_S: i64 = 86_400;

/// The token cache as a feature ([`crate::features`]): its
/// `before_decide` hook answers token requests from the cache ([`serve`]),
/// its `on_answer` hook seals a fetched token ([`fetched`]) and drops a
/// token WeChat rejected ([`rejected`]).
pub struct TokenCacheFeature {
    /// The access-token cache (`[tokens]`); `None` when off.
    pub cache: Option<Arc<TokenCache>>,
}

impl Feature for TokenCacheFeature {
    /// This call is its token slot's one fetch: reported by the answer
    /// hook (or released when the call ends).
    type Ctx = Option<Fetch>;

    async fn on_request(&self, _: Env<'_>, cx: &mut Option<Fetch>, req: &mut Requesting<'_>) -> Result<(), Early> {
        if req.own() {
            // wxgate's own fetch: its maker won the slot.
            *cx = req.seeds.take::<Fetch>();
        }
        Ok(())
    }

    async fn before_decide(&self, env: Env<'_>, cx: &mut Option<Fetch>, asking: &mut Asking<'_>) -> Result<(), Early> {
        let Some(cache) = &self.cache else { return Ok(()) };
        if cx.is_some() {
            return Ok(());
        }
        if TokenRequest::at(asking.path).is_some() {
            return Box::pin(serve(env.core, cache, cx, asking)).await;
        }
        match ask::ticket(asking.method, asking.path, asking.target.query()) {
            Ok(Some(ticket)) => return Box::pin(serve_ticket(env.core, cache, cx, asking, ticket)).await,
            Ok(None) => {}
            Err(why) => return Err(ProxyError::from(why).into()),
        }
        Ok(())
    }

    async fn on_answer(&self, env: Env<'_>, cx: &mut Option<Fetch>, answered: &mut Answered<'_>) {
        if let Some(fetch) = cx.take() {
            let sent = answered.target.query().and_then(|q| query::param(q, "access_token"));
            Box::pin(fetched(env.core, fetch, answered.errcode, answered.body, sent.as_deref())).await;
        }
        if let (Verdict::Errcode(code), Some(cache)) = (answered.verdict, &self.cache) {
            if REJECTED.contains(&code) {
                Box::pin(rejected(cache, answered.target.query(), answered.host())).await;
            }
        }
    }
}

/// A token request (after identify, before decide): answered from the
/// cache or from another request's fetch, or let go on as its slot's one
/// fetch (`fetch`). One that is not cacheable goes on untouched.
async fn serve(
    core: &Core,
    cache: &Arc<TokenCache>,
    fetch: &mut Option<Fetch>,
    call: &Asking<'_>,
) -> Result<(), Early> {
    let Some(asked) = ask::ask(call.method, call.path, call.target.query(), call.body.map(|b| &b[..])) else {
        cache.metrics.passed.inc();
        return Ok(());
    };
    let name = cache.slot(asked.kind, &asked.id, &asked.secret);
    let slot =
        Slot { name, kind: asked.kind, account: asked.id, force: asked.force, refresh: asked.refresh.as_deref() };
    serve_slot(core, cache, fetch, call, slot).await
}

/// A token-cache slot a request asks for.
struct Slot<'a> {
    name: String,
    kind: SlotKind,
    /// The account (appid) whose credential it holds.
    account: String,
    /// A forced refresh (`stable_token`'s `force_refresh`).
    force: bool,
    /// The `refresh` an answer echoes (a platform's).
    refresh: Option<&'a str>,
}

/// A ticket request (after route, before decide): answered from the slot
/// of (ticket, account), shared by every caller of the account whatever
/// token it brings, but only for a call whose account is proven (its
/// token's owner is known to be it, or wxgate adds the account's token):
/// otherwise the ticket of the account it names could be read with any
/// token. Any other ticket request goes to WeChat as it came.
async fn serve_ticket(
    core: &Core,
    cache: &Arc<TokenCache>,
    fetch: &mut Option<Fetch>,
    call: &Asking<'_>,
    ticket: ask::Ticket,
) -> Result<(), Early> {
    if !call.who.proven {
        return Ok(());
    }
    let name = format!("{}:{}", ticket.as_str(), call.who.account);
    let account = call.who.account.clone();
    cache.ticket_used(&account, ticket, core.clock.now_us());
    let slot = Slot { name, kind: SlotKind::Ticket(ticket), account, force: false, refresh: None };
    serve_slot(core, cache, fetch, call, slot).await
}

/// Answers a request for `slot`'s credential (a token, a ticket) from the
/// cache or from another request's fetch, or lets it go on as the slot's
/// one fetch (`fetch`).
async fn serve_slot(
    core: &Core,
    cache: &Arc<TokenCache>,
    fetch: &mut Option<Fetch>,
    call: &Asking<'_>,
    slot: Slot<'_>,
) -> Result<(), Early> {
    let Slot { name: slot, kind, account, force, refresh } = slot;
    let holder = cache.holder();
    let deadline = deadline_after(cache.wait);
    // The lock outlasts the longest the fetch may take, held by its rule's
    // max_wait and then sent: no second fetch starts meanwhile.
    let held_us = call.rule.map_or(0, |r| r.max_wait_us);
    let lock_us = cache.lock_us(&call.config.server, held_us);
    // A forced refresh skips the cached token, and takes only one stored
    // after the entry cached when it found a fetch in flight.
    let mut newer_than = if force { i64::MAX } else { -1 };
    loop {
        let woken = cache.done.notified();
        let claim = cache.store.tokens().claim_token(&slot, &holder, cache.min_ttl_us, newer_than, lock_us).await;
        match claim {
            Err(e) => {
                tracing::warn!(error = %e, "the token cache cannot be read: this token request goes to WeChat");
                cache.metrics.passed.inc();
                return Ok(());
            }
            Ok(Claim::Cached { entry, until, now }) => {
                let Some(token) = cache.sealer.open(&slot, &entry) else {
                    tracing::warn!("a cached access token cannot be opened (sealed under another token key?): this token request goes to WeChat");
                    cache.metrics.passed.inc();
                    return Ok(());
                };
                let left_s = (until - now) / 1_000_000;
                let local_until = core.clock.now_us().saturating_add(until - now);
                match kind {
                    SlotKind::Token | SlotKind::Stable => cache.remember(&account, &token, local_until),
                    SlotKind::Ticket(t) => cache.ticket_until(&account, t, local_until),
                    _ => {}
                }
                cache.metrics.from_cache.inc();
                let resp = json_answer(answer(kind, &token, left_s, refresh).into());
                return Err(Early::Answered(Box::new(resp), Outcome::cached));
            }
            Ok(Claim::Won { .. }) => {
                cache.metrics.fetched.inc();
                *fetch = Some(Fetch::new(cache.clone(), slot, holder, kind, account));
                return Ok(());
            }
            Ok(Claim::Failed { answer }) => {
                cache.metrics.from_cache.inc();
                return Err(Early::Answered(Box::new(json_answer(answer.into())), Outcome::cached));
            }
            Ok(Claim::Busy { stored, .. }) => {
                if newer_than == i64::MAX {
                    // A forced refresh joins the fetch in flight: its token replaces `stored`.
                    newer_than = stored;
                }
            }
        }
        if deadline_after(Duration::ZERO) >= deadline {
            cache.metrics.timed_out.inc();
            return Err(ProxyError::TokenWait(cache.wait).into());
        }
        let next = deadline.min(deadline_after(POLL));
        let _ = tokio::time::timeout_at(next, woken).await;
    }
}

/// The answer hook's part for the call that made its slot's fetch:
/// a token answer is sealed into the slot; WeChat's refusal is shown to the
/// waiters for a moment; anything else releases the lock.
/// `errcode` is the answer's (0: success; `None`: not a WeChat JSON answer).
pub async fn fetched(core: &Core, fetch: Fetch, errcode: Option<i64>, body: Option<&Bytes>, sent: Option<&[u8]>) {
    let cache = fetch.cache.clone();
    match (errcode, body) {
        (Some(0), Some(body)) => match credential_of(fetch.kind, body) {
            Some((token, expires_in)) => {
                let ttl_us = expires_in.min(MAX_TTL_S) * 1_000_000;
                let Some(entry) = cache.sealer.seal(&fetch.slot, token.as_bytes()) else {
                    fetch.finish(Fetched::Abandoned).await;
                    return;
                };
                // A ticket is known by the token it was fetched with, so that
                // WeChat rejecting that token drops it too ([`rejected`]).
                let hash = match (fetch.kind, sent) {
                    (SlotKind::Ticket(t), Some(sent)) => ticket_hash(&cache, t, sent),
                    (SlotKind::Ticket(_), None) => {
                        fetch.finish(Fetched::Abandoned).await;
                        return;
                    }
                    _ => cache.sealer.token_hash(token.as_bytes()),
                };
                let local_until = core.clock.now_us().saturating_add(ttl_us);
                match fetch.kind {
                    SlotKind::Token | SlotKind::Stable => cache.remember(&fetch.account, &token, local_until),
                    SlotKind::Ticket(t) => cache.ticket_until(&fetch.account, t, local_until),
                    _ => {}
                }
                tracing::info!(account = %fetch.account, kind = fetch.kind.as_str(), expires_in_s = expires_in, "fetched {} for the token cache", if matches!(fetch.kind, SlotKind::Ticket(_)) { "a ticket" } else { "an access token" });
                fetch.finish(Fetched::Token { entry: &entry, hash, ttl_us }).await;
            }
            None => fetch.finish(Fetched::Abandoned).await,
        },
        (Some(code), Some(body)) => {
            tracing::info!(account = %fetch.account, errcode = code, "WeChat refused a token fetch: its waiters get the same answer");
            fetch.finish(Fetched::Failed { answer: body, hold_us: FAILED_HOLD_US }).await;
        }
        _ => fetch.finish(Fetched::Abandoned).await,
    }
}

/// The kinds of token (token-cache slots) a WeChat host issues, and so may
/// reject as stale: WeCom's `qyapi` its own, the official-account and mini
/// program hosts theirs; any for a host that is not WeChat's (a mock, a
/// relay). An OA token sent to qyapi by mistake is refused there, but is
/// not stale.
pub fn kinds_issued_by(host: Option<&str>) -> &'static [&'static str] {
    let Some(host) = host.map(|h| h.trim_end_matches('.').to_ascii_lowercase()) else { return &[] };
    if host == "qyapi.weixin.qq.com" {
        &["wecom"]
    } else if host.ends_with(".weixin.qq.com") {
        &["token", "stable", "component", "authorizer"]
    } else {
        &[]
    }
}

/// WeChat answered 40001/40014/42001 to a call: if its `access_token` is
/// a slot's current token and a token of the kind the answering host
/// issues ([`kinds_issued_by`]), that slot drops it (once: a token fetched
/// since is never dropped), so the next token request fetches a fresh one.
pub async fn rejected(cache: &Arc<TokenCache>, query: Option<&str>, host: Option<&str>) {
    for name in ["access_token", "component_access_token"] {
        if let Some(token) = query.and_then(|q| query::param(q, name)) {
            rejected_token(cache, &token, host).await;
        }
    }
}

/// [`rejected`] for one token the call carried; whether it was a slot's.
pub async fn rejected_token(cache: &Arc<TokenCache>, token: &[u8], host: Option<&str>) -> bool {
    let kinds = kinds_issued_by(host);
    let hash = cache.sealer.token_hash(token);
    if kinds.is_empty() {
        cache.forget(token);
    }
    let dropped = match cache.store.tokens().drop_token(&hash, kinds).await {
        Ok(true) => {
            cache.forget(token);
            cache.metrics.invalidations.inc();
            tracing::info!("WeChat rejected a cached access token: dropped, the next token request fetches a new one");
            true
        }
        Ok(false) => false,
        Err(e) => {
            tracing::warn!(error = %e, "could not drop a rejected access token from the token cache");
            false
        }
    };
    // The tickets fetched with it go too (each is known by its token).
    for t in ask::Ticket::ALL {
        match cache.store.tokens().drop_token(&ticket_hash(cache, t, token), &[]).await {
            Ok(true) => tracing::info!(ticket = t.as_str(), "dropped a ticket fetched with a token WeChat rejected"),
            Ok(false) => {}
            Err(e) => tracing::debug!(error = %e, "could not drop the tickets of a rejected token"),
        }
    }
    dropped
}

/// What a ticket of kind `t` fetched with access token `token` is known by.
fn ticket_hash(cache: &TokenCache, t: ask::Ticket, token: &[u8]) -> crate::store::tokens::TokenHash {
    let mut named = Vec::with_capacity(token.len() + 16);
    named.extend_from_slice(b"ticket:");
    named.extend_from_slice(t.as_str().as_bytes());
    named.push(b':');
    named.extend_from_slice(token);
    cache.sealer.token_hash(&named)
}

/// A WeChat-shaped JSON answer (HTTP 200).
pub fn json_answer(body: Bytes) -> Response<RelayBody> {
    let mut resp = Response::new(RelayBody::full(body));
    resp.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json; encoding=utf-8"));
    resp
}

#[cfg(test)]
mod tests {
    use super::kinds_issued_by;

    #[test]
    fn a_host_rejects_only_the_tokens_it_issues() {
        assert_eq!(kinds_issued_by(Some("qyapi.weixin.qq.com")), &["wecom"]);
        assert_eq!(kinds_issued_by(Some("API.weixin.qq.com")), &["token", "stable", "component", "authorizer"]);
        assert_eq!(kinds_issued_by(Some("sh.api.weixin.qq.com")), &["token", "stable", "component", "authorizer"]);
        assert!(kinds_issued_by(Some("127.0.0.1")).is_empty());
        assert!(kinds_issued_by(None).is_empty());
    }
}
