//! The decide phase of a call: ask the store, then hold the call for its
//! reserved slot, wait for a concurrency slot, or refuse.
//!
//! - A call whose slot is at most the rule's `max_wait` away is *held*: the
//!   store has already reserved the slot (later calls see it taken, on every
//!   instance), and the call is forwarded when it comes. At most
//!   `[server] max_held` calls are held per instance; past that, calls that
//!   would be held are refused at once and reserve nothing.
//! - A call refused only because `concurrency` calls are in flight waits
//!   (within `max_wait`) for one to end: woken at once when one of this
//!   instance's calls frees a slot, and polling for the others' every 10 ms.
//! - A call is held (or waits for a concurrency slot) only while its client
//!   may still read the answer: once the client has closed its sending side
//!   ([`Client::closed`]: a disconnect, or a half-close, which TCP cannot
//!   tell apart), the call is refused at once with 429 and never sent. Its
//!   reserved slot stays used (never given to a later call, so limits are
//!   never exceeded), and its concurrency slot is freed at once. A client
//!   that half-closes is thus served as if `max_wait` were 0.

pub mod activity;
pub mod callers;
pub mod core;
pub mod forecasts;
pub mod margin;
pub mod slots;

use std::sync::Arc;

use crate::admit::activity::Stage;
use crate::admit::core::Core;
use crate::admit::slots::SlotGuard;
use crate::config::Config;
use crate::error::ProxyError;
use crate::limit::{Ask, Decision, Key, Quota, Reason, Rule};
use crate::telemetry::metrics::InFlightGuard;
use crate::time::{Micros, Span, Stopwatch};
use crate::transport::downstream::Client;

/// How often a call waiting for a concurrency slot asks the store again.
const CONCURRENCY_POLL_US: Micros = 10_000;

/// A call cleared to go now.
pub struct Admitted {
    /// Store time the call was admitted for (its forward time).
    pub at: Micros,
    pub escalated: bool,
    pub slot: Option<SlotGuard>,
    /// How long the call was held (0: not held).
    pub held_us: Micros,
    /// The decision was made without the shared store.
    pub degraded: bool,
    /// Time spent deciding (store round trips), without the hold.
    pub decision_us: Micros,
    /// The limit with least room left, for the `RateLimit` header.
    pub quota: Option<Quota>,
    /// Shadow mode: the refusal that enforcing would have answered.
    pub shadow_refusal: Option<(Reason, Micros)>,
}

/// What a call costs against its rule, and whom it is to: what
/// `crate::proxy::meter` read from its body (`Meter::ONE` for a call of a
/// rule that counts calls).
#[derive(Debug, Clone, Copy)]
pub struct Meter<'a> {
    pub cost: u64,
    /// Each recipient once, when the rule has `per_recipient` limits.
    pub recipients: &'a [String],
}

impl Meter<'_> {
    pub const ONE: Meter<'static> = Meter { cost: 1, recipients: &[] };
}

/// A call asking to be admitted.
pub struct ToAdmit<'a> {
    /// The config it runs under.
    pub config: &'a Config,
    pub account: &'a str,
    pub rule: &'a Arc<Rule>,
    /// Its caller is not of high priority (the rule's `reserve` is not for it).
    pub normal: bool,
    /// Its caller's label (declared name, `other`, or wxgate's own), whose
    /// share a rule's `max_share` checks.
    pub caller: &'a str,
    pub meter: Meter<'a>,
    /// Its client, whose leaving ends a hold (`None`: a call wxgate makes itself).
    pub client: Option<&'a Client>,
    /// It may be held or wait for a concurrency slot (`max_wait`); `false`:
    /// decided as if `max_wait` were 0.
    pub may_wait: bool,
    /// A queued job's send: held for its slot (or waiting for a concurrency
    /// slot) up to this long instead of the rule's `max_wait`, without a
    /// place among `[server] max_held` (the queue bounds its sends in
    /// flight itself). So a queue's sends each reserve their slot and go
    /// at its moment, paced by the store's decision, instead of being
    /// refused and asking again.
    pub queued_hold_us: Option<Micros>,
}

/// Decides, holds or waits as the rule says; `Err` is the refusal to send.
pub async fn admit(app: &Core, call: ToAdmit<'_>) -> Result<Admitted, ProxyError> {
    let ToAdmit { config, account, rule, normal, caller, meter, client, may_wait, queued_hold_us } = call;
    let offset_us = config.server.quota_offset_us;
    let holder = if rule.concurrency > 0 { app.slots.holder_id() } else { String::new() };
    // Shaping needs a place among this instance's held calls.
    let permit = if rule.max_wait_us > 0 && may_wait { app.held.permit(config.server.max_held) } else { None };
    let max_wait_us = match queued_hold_us {
        Some(hold_us) => hold_us.max(0),
        None if permit.is_some() => rule.max_wait_us,
        None => 0,
    };
    // The clock is read for the wait only when the call may wait at all.
    let started = if max_wait_us > 0 { app.clock.now_us() } else { 0 };
    let mut decision_us = 0;
    loop {
        let remaining = if max_wait_us > 0 { (max_wait_us - (app.clock.now_us() - started)).max(0) } else { 0 };
        let ask = Ask {
            key: Key { account, rule, offset_us },
            max_wait_us: remaining,
            holder: &holder,
            lease_us: config.lease_us,
            normal,
            share: rule.caller_matters().then_some(caller),
            cost: meter.cost,
            recipients: if rule.recipients_matter() { meter.recipients } else { &[] },
        };
        let asked = Stopwatch::start();
        let decided = app.store.acquire(&ask).await;
        decision_us += asked.elapsed_us();
        let decided = decided.map_err(ProxyError::from)?;
        let degraded = decided.degraded;
        match decided.decision {
            Decision::Admit { at, hold_us, escalated, quota, calendar } => {
                if let (Some(left), false) = (calendar, degraded) {
                    // The day quota's forecast: the shared count as of the
                    // decision (not a fallback's count of its own share).
                    app.forecasts.observe(account, rule, left, at - hold_us, meter.cost, !may_wait);
                }
                let slot = (rule.concurrency > 0)
                    .then(|| app.slots.track(app.store.clone(), account, rule.clone(), holder.clone(), offset_us));
                // Shadow mode debits as if enforcing but never delays a call.
                if hold_us > 0 && !rule.shadow {
                    let _held = app.activity.enter(account, &rule.state, Stage::Held);
                    let _gauge = InFlightGuard::new(app.metrics.held_now.clone());
                    let until = app.clock.now_us() + hold_us;
                    tokio::select! {
                        _ = app.clock.sleep(Span::from_micros(hold_us)) => {
                            // How late the scheduler woke it: the margin's measure.
                            if app.clock.runs_by_itself() {
                                let now = app.clock.now_us();
                                margin::note(&app.margin, &app.metrics, &config.server, now, now - until);
                            }
                        }
                        _ = closed(client) => {
                            let wait_us = (until - app.clock.now_us()).max(0);
                            return Err(gone(rule, Reason::Rate, wait_us));
                        }
                    }
                }
                drop(permit);
                let held_us = if rule.shadow { 0 } else { hold_us };
                return Ok(Admitted {
                    at,
                    escalated,
                    slot,
                    held_us,
                    degraded,
                    decision_us,
                    quota,
                    shadow_refusal: None,
                });
            }
            Decision::Reject { reason, wait_us, .. } if rule.shadow => {
                return Ok(Admitted {
                    at: app.clock.now_us(),
                    escalated: false,
                    slot: None,
                    held_us: 0,
                    degraded,
                    decision_us,
                    quota: None,
                    shadow_refusal: Some((reason, wait_us)),
                });
            }
            Decision::Reject { reason: Reason::Concurrency, wait_us, .. } if remaining > 0 => {
                let step = remaining.min(CONCURRENCY_POLL_US).min(wait_us.max(1));
                let freed = app.slots.freed.notified();
                tokio::select! {
                    _ = freed => {}
                    _ = app.clock.sleep(Span::from_micros(step)) => {}
                    _ = closed(client) => return Err(gone(rule, Reason::Concurrency, wait_us)),
                }
            }
            Decision::Reject { wait_us, reason, over } => {
                let over = over.iter().filter_map(|i| ask.recipients.get(*i as usize).cloned()).collect();
                return Err(ProxyError::Throttled { rule: rule.name.to_string(), reason, wait_us, over });
            }
        }
    }
}

/// Resolves once `client` has closed its sending side; never for a call
/// wxgate makes itself (`None`: a token fetch).
async fn closed(client: Option<&Client>) {
    match client {
        Some(c) => c.closed().await,
        None => std::future::pending().await,
    }
}

/// The refusal of a call whose client closed its sending side while the
/// call waited: never sent.
fn gone(rule: &Rule, reason: Reason, wait_us: Micros) -> ProxyError {
    tracing::debug!(rule = %rule.name, "the client closed its sending side while its call waited: refused, never sent");
    ProxyError::Throttled { rule: rule.name.to_string(), reason, wait_us, over: Vec::new() }
}

/// A call costing `cost` (its recipients, a broadcast's members too) when
/// its rule can never admit that much at once (a window's burst, a day's
/// count, less a normal caller's reserve or a caller's share): 400 naming
/// the limit, as no wait would let it through. Checked before the call is
/// decided or queued (`crate::proxy::meter`, and the directory for a
/// broadcast); never in shadow mode (nothing is refused).
pub fn too_costly(rule: &crate::limit::Rule, cost: u64, normal: bool) -> Result<(), ProxyError> {
    if rule.shadow {
        return Ok(());
    }
    match rule.max_cost(normal && rule.priority_matters(), rule.caller_matters()) {
        Some((most, limit)) if cost > most => Err(ProxyError::BadRequest(format!(
            "rule \"{}\" counts recipients: this call costs {cost}, but {limit} admits at most {most} at once, \
             so no wait would let it through; split the message, or raise the limit's burst",
            rule.name
        ))),
        _ => Ok(()),
    }
}
