//! The decision: rules + state + now → admit or reject-for-d. Pure maths, no I/O.
//!
//! Guarantees (for one (account, rule); the stores keep one state per pair):
//!
//! - **Window-exact.** A limit `{count N, per W, burst B}` never admits more
//!   than N calls in any half-open interval `[t, t + W)`. It is a GCRA (the
//!   token-bucket equivalent) with emission interval `T = ⌈W / (N − B + 1)⌉`
//!   and tolerance `τ = (B − 1)·T`: admitted calls `a₁ ≤ … ≤ aₖ` satisfy
//!   `aₖ − a₁ ≥ (k − 1)·T − τ`, so k calls inside `[t, t + W)` need
//!   `(k − 1 − (B − 1))·T < W`, i.e. `k ≤ N`. Up to B calls go at once after
//!   idle, and the sustained rate is `(N − B + 1) / W`. (A bucket of capacity N
//!   refilled at N/W would admit 2N in one window after idle: the bug this
//!   product exists to avoid.)
//! - **Calendar quotas** (`per = "day"` / `"month"`) count admitted calls in
//!   the current period of `quota_timezone` and start again at its midnight.
//! - **All-or-nothing.** Every limit of the rule is checked first; a call that
//!   any limit (or a penalty) refuses consumes nothing from any limit.
//! - **Lowered limits bite at once.** State holds a theoretical arrival time,
//!   not a token count, so a smaller burst or count applies to existing state
//!   without a conversion (spare tokens above the new capacity are gone).
//! - A rejection's wait is the earliest moment at which every limit admits the
//!   call, given no other traffic.
//! - **Shaping.** When that moment is at most the rule's `max_wait` away the
//!   call is admitted *for* that moment (its slot reserved, debited as if it
//!   arrived then), and the guarantees hold for forward times.
//! - **Warm-up.** For `warmup` after a cold start (no call for a whole warm-up
//!   period) or a token refresh, the emission interval is `T / f`, f rising
//!   linearly from ½ to 1: never faster than `T`, so still window-exact.
//! - **Concurrency.** At most `concurrency` slots are held at once; a slot
//!   whose lease ran out is free again.
//! - **Priority reserve.** With `reserve`, a normal-priority call is admitted
//!   only if it leaves the reserve: a window's reserved tokens
//!   (`tat + R·T − τ ≤ at`: R of its burst), a calendar quota's reserved calls
//!   (`used < count − Rc`). High-priority calls may use everything; debits are
//!   the same for both, so every guarantee above holds for all callers together.
//! - **Per-caller share.** With `max_share`, each caller also has sub-limits
//!   of its own (a window `{⌊P·N⌋, W, ⌈P·B⌉}`, a calendar quota ⌊P·count⌋),
//!   checked all-or-nothing with the rule's in the same decision: no caller
//!   gets more than its share of any window or period, and the rule's own
//!   guarantees are unchanged. Callers are the declared names and `other`
//!   (every undeclared caller together), so renaming a caller cannot escape
//!   its cap and the state per rule stays bounded.
//! - **Refunds.** A call that never reached WeChat can give back what its
//!   admission took ([`decide::refund`]): exactly for calendar quotas, and
//!   for windows only as much as keeps every guarantee above.

use std::sync::Arc;

use serde::Serialize;

use crate::limit::calendar::Period;
use crate::limit::clock::Micros;
use crate::limit::penalty::PenaltyState;

pub mod calendar;
pub mod clock;
pub mod decide;
pub mod derive;
pub mod pair;
pub mod penalty;

/// A named rule: its limits, and whose state they count in.
///
/// `scope = "rule"` (the default): one state per (account, rule), shared by
/// every path the rule matches. `scope = "path"`: the compiled config holds
/// one variant of the rule per API path it lists (exact patterns only), each
/// with a state of its own, so one rule says "each of these APIs: N".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// The rule's name (metrics, logs, refusals and the admin API use it).
    pub name: Arc<str>,
    /// What the stores key this rule's state by, within an account: the
    /// name, or for a per-path variant `<name><path>` (`draft/cgi-bin/draft/add`;
    /// a name never contains `/`, so no two states share a key).
    pub state: Arc<str>,
    pub scope: Scope,
    /// The API path a per-path variant counts (`None` for `scope = "rule"`).
    pub path: Option<Arc<str>>,
    /// The `match` patterns as written (for `wxgate check` and the admin API).
    pub patterns: Vec<String>,
    pub limits: Vec<Limit>,
    /// Shaping: hold a call up to this long for its slot instead of refusing (0 = police only).
    pub max_wait_us: Micros,
    /// Warm-up: after a cold start or a token refresh the refill rate starts
    /// at half and rises linearly to full over this period (0 = none).
    pub warmup_us: Micros,
    /// At most this many calls in flight at WeChat (0 = no cap).
    pub concurrency: u32,
    /// Shadow mode: decide and keep state as if enforcing, but forward every call.
    pub shadow: bool,
    /// The HTTP status of this rule's refusals and of WeChat's penalised
    /// answers (429; or 200: refusals keep their 45009 body and headers, and
    /// WeChat's own answers pass with the status WeChat sent).
    pub throttle_status: http::StatusCode,
    /// `RateLimit-Policy` for this rule, built once (see [`crate::telemetry::ratelimit_headers`]).
    pub policy_header: Option<http::HeaderValue>,
    /// Each limit's `RateLimit` prefix, `"<rule>.<window>";r=`, built once.
    pub policy_prefixes: Vec<String>,
    /// `reserve = "P%"`: P (0: none). Per limit (index-aligned with
    /// `limits`), what normal-priority calls may not use: a window's
    /// reserved tokens as time (`R·T`, R = ⌈P % of the burst⌉), a calendar
    /// quota's reserved calls (⌈P % of the count⌉). Empty without a reserve.
    pub reserve_percent: u32,
    pub reserve: Vec<i64>,
    /// `max_share = "P%"`: P (0: none). Per limit (index-aligned with
    /// `limits`), one caller's own sub-limit: a window `{⌊P·N⌋, W, ⌈P·B⌉}`,
    /// a calendar quota of ⌊P·count⌋. Empty without a share.
    pub share_percent: u32,
    pub share: Vec<Limit>,
}

/// Whose calls a rule's limits count together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scope {
    /// Every path of the rule shares one state.
    #[default]
    Rule,
    /// Every path of the rule has a state of its own.
    Path,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Rule => "rule",
            Scope::Path => "path",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Limit {
    Window(WindowLimit),
    Calendar { count: u64, period: Period },
}

/// Identifies a limit's state within its rule, so that changing a count keeps
/// the state and changing a window starts afresh.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WindowKey {
    Window(Micros),
    Calendar(Period),
}

impl Limit {
    /// Name of this limit in `RateLimit-Policy` (`"60s"`, `"day"`), and its
    /// quota and window in seconds.
    pub fn policy(&self) -> (String, u64, u64) {
        match self {
            Limit::Window(w) if w.per_us % 1_000_000 == 0 => {
                (format!("{}s", w.per_us / 1_000_000), w.count, (w.per_us / 1_000_000) as u64)
            }
            Limit::Window(w) => (format!("{}ms", w.per_us / 1000), w.count, (w.per_us as u64).div_ceil(1_000_000)),
            Limit::Calendar { count, period: Period::Day } => ("day".into(), *count, 86_400),
            Limit::Calendar { count, period: Period::Month } => ("month".into(), *count, 31 * 86_400),
        }
    }

    pub fn window_key(&self) -> WindowKey {
        match self {
            Limit::Window(w) => WindowKey::Window(w.per_us),
            Limit::Calendar { period, .. } => WindowKey::Calendar(*period),
        }
    }
}

impl WindowKey {
    /// Short stable text used in store keys: `w60000` (ms) or `day` / `month`.
    pub fn label(&self) -> String {
        match self {
            WindowKey::Window(us) => {
                // Built by hand: this runs for every limit of every Redis decision.
                let mut label = String::with_capacity(12);
                label.push('w');
                label.push_str(itoa::Buffer::new().format(us / 1000));
                label
            }
            WindowKey::Calendar(p) => p.as_str().to_owned(),
        }
    }
}

/// `{count N, per W, burst B}` compiled to GCRA parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct WindowLimit {
    pub count: u64,
    pub per_us: Micros,
    pub burst: u64,
    /// Emission interval `T = ⌈W / (N − B + 1)⌉` (rounded up: never faster).
    pub interval_us: Micros,
    /// Tolerance `τ = (B − 1)·T`.
    pub tolerance_us: Micros,
}

impl WindowLimit {
    /// Callers validate `1 ≤ burst ≤ count` and `per_us > 0` first.
    pub fn new(count: u64, per_us: Micros, burst: u64) -> Self {
        let slots = i64::try_from(count - burst + 1).unwrap_or(i64::MAX);
        let interval_us = (per_us + slots - 1) / slots;
        let tolerance_us = i64::try_from(burst - 1).unwrap_or(0).saturating_mul(interval_us);
        WindowLimit { count, per_us, burst, interval_us, tolerance_us }
    }

    /// Burst when the config gives none: 5 % of the count, at least 1. Small,
    /// so the sustained rate stays at ≥ 95 % of the quota.
    pub fn default_burst(count: u64) -> u64 {
        count.div_ceil(20).max(1)
    }

    /// Capacity and refill in token-bucket terms, for `wxgate check`.
    pub fn refill_per_second(&self) -> f64 {
        1_000_000.0 / self.interval_us as f64
    }
}

/// Why a call was refused; shown to clients in `X-Wxgate-Reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Reason {
    /// A minute/second/hour window is full.
    Rate,
    /// A calendar quota (day, month) is used up.
    Quota,
    /// WeChat itself said 45009/45011/45033 recently.
    Penalty,
    /// `concurrency` calls of this rule are already in flight.
    Concurrency,
    /// What is left of a limit is the rule's reserve, for high-priority
    /// callers only (a normal caller was refused; a high one would not be).
    Reserve,
    /// The caller used its `max_share` of a limit of the rule (other
    /// callers may still get through).
    Share,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Rate => "rate",
            Reason::Quota => "quota",
            Reason::Penalty => "penalty",
            Reason::Concurrency => "concurrency",
            Reason::Reserve => "reserve",
            Reason::Share => "share",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Forward at `at` (store time), i.e. after holding the call `hold_us`
    /// (0: at once). `at` tells answers to calls sent before a penalty from
    /// those sent after it; `escalated` says whether a successful answer
    /// should be reported to end a penalty escalation.
    /// `quota` describes the limit with the least room left after this call
    /// (for the `RateLimit` header); `None` for a rule without limits.
    /// `calendar` is the same among the calendar quotas only (`None`: the
    /// rule has none): what an instance last saw of the day's shared count,
    /// which its fallback starts from while Redis is away.
    Admit { at: Micros, hold_us: Micros, escalated: bool, quota: Option<Quota>, calendar: Option<Quota> },
    /// Refuse; every limit admits after `wait_us` at the earliest.
    Reject { wait_us: Micros, reason: Reason },
}

/// Room left in one limit of a rule after an admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    /// Index of the limit in the rule.
    pub limit: usize,
    /// Calls that could still go at once.
    pub remaining: u64,
    /// Until the limit is whole again (window) or its period starts afresh (calendar).
    pub reset_us: Micros,
}

/// State of one limit: GCRA theoretical arrival time, or a calendar count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitState {
    Tat(Micros),
    /// Calls counted in period `period_id`, and calls already reserved (held)
    /// for the period after it.
    Count {
        period_id: i64,
        used: u64,
        next: u64,
    },
}

/// Everything a store keeps for one (account, rule).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuleState {
    pub limits: Vec<(WindowKey, LimitState)>,
    pub penalty: PenaltyState,
    /// When the current warm-up began (0: never).
    pub warm_start: Micros,
    /// When the last call was admitted (0: never).
    pub last_call: Micros,
    /// Concurrency slots taken: holder id and lease expiry.
    pub holders: Vec<(String, Micros)>,
    /// `max_share`: each caller's use of its own sub-limits, by caller label.
    pub shares: Vec<ShareState>,
}

/// One caller's use of its share of a rule ([`Rule::share`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShareState {
    /// The caller's label: a declared caller's name, or `other`.
    pub caller: Arc<str>,
    pub limits: Vec<(WindowKey, LimitState)>,
}

/// The state of the limit `key` among `limits`.
fn state_of(limits: &[(WindowKey, LimitState)], key: WindowKey) -> Option<LimitState> {
    limits.iter().find(|(k, _)| *k == key).map(|(_, s)| *s)
}

/// Sets the state of the limit `key` among `limits` (added if absent).
fn set_state(limits: &mut Vec<(WindowKey, LimitState)>, key: WindowKey, state: LimitState) {
    match limits.iter_mut().find(|(k, _)| *k == key) {
        Some(slot) => slot.1 = state,
        None => limits.push((key, state)),
    }
}

impl ShareState {
    pub(crate) fn get(&self, key: WindowKey) -> Option<LimitState> {
        state_of(&self.limits, key)
    }

    pub(crate) fn set(&mut self, key: WindowKey, state: LimitState) {
        set_state(&mut self.limits, key, state)
    }
}

impl RuleState {
    pub(crate) fn get(&self, key: WindowKey) -> Option<LimitState> {
        state_of(&self.limits, key)
    }

    pub(crate) fn set(&mut self, key: WindowKey, state: LimitState) {
        set_state(&mut self.limits, key, state)
    }

    /// The part of this state `rule` reads, in a canonical order: its limits'
    /// states in the rule's order, slots by lease expiry then holder id.
    /// Two stores holding the same state give equal canonical forms.
    pub fn canonical(&self, rule: &Rule) -> RuleState {
        let limits = rule.limits.iter().filter_map(|l| Some((l.window_key(), self.get(l.window_key())?))).collect();
        let mut holders = self.holders.clone();
        holders.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
        let mut shares: Vec<ShareState> = self
            .shares
            .iter()
            .map(|s| ShareState {
                caller: s.caller.clone(),
                limits: rule.share.iter().filter_map(|l| Some((l.window_key(), s.get(l.window_key())?))).collect(),
            })
            .filter(|s| !s.limits.is_empty())
            .collect();
        shares.sort_by(|a, b| a.caller.cmp(&b.caller));
        RuleState { limits, holders, shares, ..self.clone() }
    }

    /// The share state of `caller`, if it has one.
    pub(crate) fn share(&self, caller: &str) -> Option<&ShareState> {
        self.shares.iter().find(|s| &*s.caller == caller)
    }

    /// True when forgetting this state changes no future decision of a rule
    /// whose warm-up is at most `warmup_us`.
    pub fn is_idle(&self, now: Micros, offset_us: Micros, warmup_us: Micros) -> bool {
        let idle = |(key, s): &(WindowKey, LimitState)| match (key, s) {
            (_, LimitState::Tat(tat)) => *tat <= now,
            (WindowKey::Calendar(p), LimitState::Count { period_id, next, .. }) => {
                let current = p.id(now, offset_us);
                *period_id < current - 1 || (*period_id == current - 1 && *next == 0)
            }
            (WindowKey::Window(_), LimitState::Count { .. }) => true,
        };
        self.limits.iter().all(idle)
            && self.shares.iter().all(|s| s.limits.iter().all(idle))
            && self.penalty.until <= now
            && !self.penalty.is_recent(now)
            && self.holders.iter().all(|(_, exp)| *exp <= now)
            && (self.last_call == 0 || self.last_call + warmup_us <= now)
    }
}

/// Whose state an operation reads or writes: one (account, rule state) pair
/// (the rule's [`Rule::state`]), and
/// the offset from UTC (`quota_timezone`) its calendar quotas count in.
#[derive(Debug, Clone, Copy)]
pub struct Key<'a> {
    pub account: &'a str,
    pub rule: &'a Rule,
    pub offset_us: Micros,
}

/// One call's question, to a store and through it to [`decide::decide`]:
/// the one request type of the decision path.
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    pub key: Key<'a>,
    /// Longest the caller will hold this call for its slot (at most the
    /// rule's `max_wait`; 0: admit now or refuse).
    pub max_wait_us: Micros,
    /// Concurrency slot holder id, unique per call across all instances
    /// (empty when the rule has no concurrency cap).
    pub holder: &'a str,
    /// Lease of a concurrency slot; renewed while the call lives.
    pub lease_us: Micros,
    /// A normal-priority caller's call: the rule's reserve is not for it.
    pub normal: bool,
    /// The caller's label (declared name or `other`) when the rule has a
    /// `max_share`: its share is checked and debited too.
    pub share: Option<&'a str>,
}
