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
//! - **Window-exact at WeChat's door.** WeChat counts a call when it
//!   arrives, some time `d ∈ [0, J]` after its decision (the hold's wake-up,
//!   the store's answer, the forward). With the arrival margin `M`
//!   (`[server] window_margin`), `T = ⌈(W + M) / (N − B + 1)⌉`: the same
//!   argument gives no `N + 1` admissions within `W + M`, so `N + 1`
//!   arrivals `rᵢ = aᵢ + dᵢ` span `r_{N+1} − r₁ ≥ (a_{N+1} − a₁) − J ≥
//!   W + M − J ≥ W` whenever the trips differ by at most `J ≤ M`: no
//!   window `[t, t + W)` at WeChat holds more than N. The cost is the
//!   sustained rate, `(N − B + 1) / (W + M)`: `M / W` of it (20 ms of a
//!   minute: 0.03 %).
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
//! - **Leases.** `k` admissions at once, spendable by one instance
//!   in-process at any moment until the lease ends ([`lease`]): each
//!   window's slots booked so that every guarantee above holds whenever
//!   a unit is sent; what is not spent can be given back.
//! - **Refunds.** A call that never reached WeChat can give back what its
//!   admission took ([`decide::refund`]): exactly for calendar quotas, and
//!   for windows only as much as keeps every guarantee above.

use std::sync::Arc;

use serde::Serialize;

use crate::limit::penalty::PenaltyState;
use crate::time::Micros;

pub mod calendar;
pub mod decide;
pub mod drain;
pub mod forecast;
pub mod learned;
pub mod lease;
pub mod pair;
pub mod penalty;
pub mod rule;

pub use rule::{Limit, PercentError, Rule, Scope, WindowError, WindowKey, WindowLimit};

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
    /// A recipient of the message used its `per_recipient` limit (the
    /// others may still be sent to).
    Recipient,
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
            Reason::Recipient => "recipient",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
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
    /// Refuse; every limit admits after `wait_us` at the earliest. `over`:
    /// the indices (in [`Ask::recipients`]) of the recipients whose own
    /// `per_recipient` limits refuse them (empty for a call without
    /// recipients, or when none is over).
    Reject { wait_us: Micros, reason: Reason, over: Box<[u32]> },
}

impl Decision {
    /// A refusal naming no recipient.
    pub fn reject(wait_us: Micros, reason: Reason) -> Decision {
        Decision::Reject { wait_us, reason, over: Box::default() }
    }
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
    /// `per_recipient`: each recipient's use of its own limits.
    pub recipients: Recipients,
    /// The day limit WeChat last reported for the pair (`quota_sync`):
    /// [`learned`].
    pub learned_day: Option<LearnedDay>,
    /// Windows a frequency 45009 lowered until the quota day ends
    /// (`learn_windows`, [`learned`]).
    pub learned_windows: Vec<LearnedWindow>,
    /// `learn_windows`: per window length, when its current run began (the
    /// last admission that found its TAT in the past): what the window
    /// admitted since is counted from it ([`learned::lower_windows`]).
    pub runs: Vec<(Micros, Micros)>,
    /// The latest end of a lease taken of this pair ([`lease`]; 0: none):
    /// a leased unit may be sent until then.
    pub lease_end: Micros,
    /// Each instance's last lease of this pair, while it lasts: the only
    /// one of its leases whose units it may still send, which a
    /// `clear_quota` keeps counted ([`decide::clear`]).
    pub leases: Vec<InstanceLease>,
    /// When WeChat last reset the pair's day count (`clear_quota`; 0:
    /// never): a lease taken before gives back of the day only what the
    /// clear kept of it ([`lease::give_back`]).
    pub cleared_at: Micros,
}

/// An instance's last lease of a pair ([`lease`]). An instance takes its
/// next lease of a pair only once the last one is spent or over
/// (`src/store/resilient/leases.rs`), so that lease's units are the only
/// ones it may still send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceLease {
    /// The instance's id (the Redis store's, random at each process start;
    /// "" on the memory store, one instance).
    pub instance: Box<str>,
    /// Its units, less those given back.
    pub units: u64,
    /// Its end (store time), which also names the lease: an instance takes
    /// its leases of a pair one after another, never two at one moment.
    pub until: Micros,
}

/// A refusal for a calendar quota while a reserve of the pair is out says
/// "again in a second", not "at the period's end": the reserve's units come
/// back at its instance's next call of the pair (or when the pair idles),
/// and then go to whoever asks (lua/acquire.lua `RESERVE_RETRY`; [`lease`]). Only the
/// refusal's wait: a call is never held on room that may come back.
pub const RESERVE_RETRY_US: Micros = 1_000_000;

/// Appended to an instance's id to name its reserve's record
/// ([`RuleState::leases`]; Redis `le.<id>#r`, `lu.<id>#r`).
pub const RESERVE_RECORD: &str = "#r";

/// How long a learned day limit stays after WeChat last reported it
/// (`learned::KEEP_US`).
pub const LEARNED_KEEP_US: Micros = 2 * 86_400_000_000;

/// A day limit WeChat reported for a pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LearnedDay {
    /// quota/get's `daily_limit` (at least 1).
    pub limit: u64,
    /// When WeChat last reported it (store time).
    pub at: Micros,
}

impl LearnedDay {
    /// Whether it still applies at `now`.
    pub fn fresh(&self, now: Micros) -> bool {
        now < self.at.saturating_add(LEARNED_KEEP_US)
    }
}

/// A window a frequency 45009 lowered, until the quota day ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LearnedWindow {
    /// The window's length (which limit of the rule it lowers).
    pub per_us: Micros,
    pub count: u64,
    pub burst: u64,
    /// The lowered window's `T` and `τ` ([`WindowLimit::lowered`]).
    pub interval_us: Micros,
    pub tolerance_us: Micros,
    /// When it was lowered, and until when it applies (the next midnight
    /// of `quota_timezone`).
    pub at: Micros,
    pub until: Micros,
    /// The most calls WeChat took in one window, seen at the 45009s that
    /// lowered it: no later 45009 of the day lowers it below 90 % of that
    /// ([`learned::lower_windows`]).
    pub took: u64,
}

/// How many `per_recipient` windows a rule may have (a recipient's state is
/// kept inline, without an allocation of its own).
pub const MAX_RECIPIENT_WINDOWS: usize = 3;

/// One recipient's windows: (window length, GCRA theoretical arrival time),
/// unused slots with a length of 0. About 65 bytes per recipient in the map.
pub type RecipientState = [(Micros, Micros); MAX_RECIPIENT_WINDOWS];

/// Every recipient's state of a pair, keyed by [`recipient_key`] of its id
/// (no id is kept: nothing personal in memory dumps or the state file).
/// `None` until a rule with `per_recipient` admits a call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recipients(pub Option<Box<hashbrown::HashMap<u64, RecipientState, RecipientHasher>>>);

/// The recipients' map hasher: the keys are hashes already.
pub type RecipientHasher = std::hash::BuildHasherDefault<KeyHasher>;

/// Passes a `u64` key through (a [`recipient_key`] is a hash already).
#[derive(Default)]
pub struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u64(&mut self, n: u64) {
        // Spread the bits hashbrown reads (its top 7 for the control byte).
        self.0 = n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// A recipient id's key in [`Recipients`]: its 64-bit FNV-1a hash, stable
/// across versions (the state file keeps it). Two ids that collide share
/// their limits, which is stricter, never looser; a caller able to make a
/// collision could as well message the recipient.
pub fn recipient_key(id: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in id.as_bytes() {
        h = (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
    }
    h
}

impl Recipients {
    /// How many recipients have state.
    pub fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |m| m.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The state of the recipient `key`, if any.
    pub fn get(&self, key: u64) -> Option<&RecipientState> {
        self.0.as_ref()?.get(&key)
    }

    /// The state of the recipient `key`, created empty if absent.
    pub fn entry(&mut self, key: u64) -> &mut RecipientState {
        self.0.get_or_insert_with(Box::default).entry(key).or_insert([(0, 0); MAX_RECIPIENT_WINDOWS])
    }

    /// Drops the recipients whose every window is whole again at `now`
    /// (forgetting them changes no decision); returns how many.
    pub fn prune(&mut self, now: Micros) -> usize {
        let Some(map) = self.0.as_mut() else { return 0 };
        let before = map.len();
        map.retain(|_, s| s.iter().any(|(per, tat)| *per > 0 && *tat > now));
        let dropped = before - map.len();
        if map.is_empty() {
            self.0 = None;
        } else if map.capacity() > 4 * map.len().max(64) {
            map.shrink_to_fit();
        }
        dropped
    }

    /// Whether every recipient's windows are whole again at `now`.
    pub fn idle(&self, now: Micros) -> bool {
        self.0.as_ref().is_none_or(|m| m.values().all(|s| s.iter().all(|(per, tat)| *per == 0 || *tat <= now)))
    }
}

/// The TAT of the window of length `per_us` in a recipient's state.
pub fn recipient_tat(state: Option<&RecipientState>, per_us: Micros) -> Option<Micros> {
    state?.iter().find(|(per, _)| *per == per_us).map(|(_, tat)| *tat)
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
    /// Whether a reserve of the pair (any instance's) may still hold units
    /// at `now` ([`RESERVE_RETRY_US`]).
    pub fn reserve_out(&self, now: Micros) -> bool {
        self.leases.iter().any(|l| l.instance.ends_with(RESERVE_RECORD) && l.until > now && l.units > 0)
    }

    pub(crate) fn get(&self, key: WindowKey) -> Option<LimitState> {
        state_of(&self.limits, key)
    }

    pub(crate) fn set(&mut self, key: WindowKey, state: LimitState) {
        set_state(&mut self.limits, key, state)
    }

    /// The part of this state `rule` reads, in a canonical order: its limits'
    /// states in the rule's order, slots by lease expiry then holder id,
    /// instances' leases by end (their ids left out). Two stores holding
    /// the same state give equal canonical forms.
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
        // Recipients are not read back from Redis (one key each): their
        // decisions are compared instead.
        let windows = || {
            rule.limits.iter().filter_map(|l| match l {
                Limit::Window(w) => Some(w.per_us()),
                Limit::Calendar { .. } => None,
            })
        };
        let learned_windows =
            windows().filter_map(|per| self.learned_windows.iter().find(|l| l.per_us == per).copied()).collect();
        let runs = windows().filter_map(|per| self.runs.iter().find(|(p, _)| *p == per).copied()).collect();
        // Leases by end, without their instances' ids: each store names
        // its instance its own way (Redis a random id per process, the
        // memory store none).
        let mut leases: Vec<InstanceLease> =
            self.leases.iter().map(|l| InstanceLease { instance: "".into(), ..l.clone() }).collect();
        leases.sort_by_key(|l| (l.until, l.units));
        RuleState {
            limits,
            holders,
            shares,
            recipients: Recipients::default(),
            learned_windows,
            runs,
            leases,
            ..self.clone()
        }
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
            && self.recipients.idle(now)
            && self.penalty.until <= now
            && !self.penalty.is_recent(now)
            && self.holders.iter().all(|(_, exp)| *exp <= now)
            && (self.last_call == 0 || self.last_call + warmup_us <= now)
            && self.learned_day.is_none_or(|l| !l.fresh(now))
            && self.learned_windows.iter().all(|l| l.until <= now)
            && self.lease_end <= now
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
    /// What the call costs against each limit (1 for a call; a message's
    /// recipients for a rule that counts them): decided as that many calls
    /// at the same moment, all or none.
    pub cost: u64,
    /// Whom the call is addressed to, each id once, when the rule has
    /// `per_recipient` limits (empty else): each recipient's own limits are
    /// checked and debited too, all or nothing with the rule's.
    pub recipients: &'a [String],
}

impl<'a> Ask<'a> {
    /// A call of cost 1 to `key`, refused at once if not admitted, of a
    /// high-priority caller with no share and no recipients.
    pub fn one(key: Key<'a>) -> Ask<'a> {
        Ask { key, max_wait_us: 0, holder: "", lease_us: 0, normal: false, share: None, cost: 1, recipients: &[] }
    }
}
