//! Why wxgate cannot serve a call right now, though a retry soon may:
//! [`Unavailable`], what [`super::ProxyError::Unavailable`] carries. Every
//! one gets the same answer, the table's one row for it (503, errcode -1,
//! `Retry-After: 1`, `X-Wxgate-Reason: unavailable`, outcome
//! `unavailable`), and queued delivery tries such a job again later; the
//! errmsg says what was not ready.

use crate::store::StoreError;
use crate::telemetry::metrics::Outcome;

/// What was not ready for a call; see the module docs.
#[derive(Debug, thiserror::Error)]
pub enum Unavailable {
    /// The store could not decide and `[store] fallback = "deny"`.
    #[error("store unavailable: {0}")]
    Store(#[from] StoreError),
    /// `caller_auth = "required"` arrived with a reload whose callers (and
    /// their keys) are not in place yet: no key can be checked for a moment.
    #[error("a reload is turning caller authentication on and its callers' keys are not in place yet; retry")]
    AuthReloading,
    /// A call needs the token cache (an `[[account]]`'s token) and this
    /// instance has none. Start and every reload refuse an `[[account]]`
    /// without it ([`crate::features::broker::check`]), so no call should
    /// meet this.
    #[error("this call needs the token cache (for an [[account]]'s token) and this instance has not opened one")]
    NoTokenCache,
    /// A call wxgate made itself (a queued job's send, an own call) was
    /// answered by one of wxgate's own hooks (counted as this outcome), not
    /// by WeChat: not an answer wxgate can use as WeChat's.
    #[error("a call wxgate made itself was answered by wxgate (outcome {}), not by WeChat", .0.as_str())]
    AnsweredEarly(Outcome),
    /// A queued job's lease passed to another instance before its send was
    /// marked: it was not sent from here (the lease's holder sends it).
    #[error("this queued job's lease passed to another instance before it was sent; it was not sent from here")]
    JobLeaseLost,
    /// Queued delivery's jobs store is in Redis, which has not answered
    /// since wxgate started (or since the reload that turned queued
    /// delivery on); it comes on by itself once Redis does.
    #[error("queued delivery's jobs store: Redis has not answered since wxgate started (or since the reload that turned queued delivery on); queued delivery comes on once it does: retry")]
    JobsConnecting,
    /// A broadcast (`@all`, `toparty`, `totag`) of a rule whose directory
    /// resolves it, and WeCom's directory did not answer (down, slow, a
    /// fetch refused by a limit) within `[directory] wait`, with no
    /// `unseen_cost` to charge instead: the message is not sent uncounted.
    #[error("this broadcast's members could not be counted: {0}; retry (or set the rule's recipients.unseen_cost)")]
    Directory(String),
}
