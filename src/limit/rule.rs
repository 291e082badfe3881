//! A rule, and the one derivation of its numbers: everything computed from what a
//! `[[rule]]` configures (its limits' counts and bursts, `concurrency`,
//! `reserve`, `max_share`) is computed here, for the compiled config and for
//! the local fallback's scaling by `[store] instances` alike. A value derived
//! anywhere else drifts: a fallback that scaled the limits but kept the
//! unscaled reserve would refuse every normal-priority caller during an
//! outage.

use std::num::NonZeroU64;
use std::sync::Arc;

use serde::Serialize;

use crate::limit::calendar::Period;
use crate::time::Micros;

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
    /// The rule's number in its config (file order; every per-path variant
    /// has its rule's). What the layers above show of a rule, which the
    /// decision never reads (its refusals' status, its `RateLimit-Policy`),
    /// is kept in tables indexed by it (`crate::config::Config::answers`).
    pub id: usize,
    /// What the stores key this rule's state by, within an account: the
    /// name, or for a per-path variant `<name><path>` (`draft/cgi-bin/draft/add`;
    /// a name never contains `/`, so no two states share a key), or for a
    /// `scope = "app"` rule's call `<name>@<agentid>` (`message_send@1000002`,
    /// [`Rule::for_app`]; a name never contains `@`).
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
    /// `per_recipient`: each recipient's own windows (at most
    /// [`crate::limit::MAX_RECIPIENT_WINDOWS`], distinct lengths), checked
    /// all-or-nothing with the rule's limits; each recipient costs 1 against
    /// them. Empty: recipients are not limited one by one.
    pub per_recipient: Vec<WindowLimit>,
    /// The account a `[[quota]]` override gives these limits to (`None`:
    /// the rule's own limits, for every account without one):
    /// [`Rule::overridden`].
    pub account: Option<Arc<str>>,
    /// `learn = "both"`: a day limit WeChat reports ([`crate::limit::learned`])
    /// applies even above the configured count (default: only below it).
    pub learn_up: bool,
    /// A learned day limit applies divided by this: 1, or for the local
    /// fallback's scaled rule ([`Rule::scaled`]) the instances its counts
    /// are divided by.
    pub learned_divisor: u64,
    /// `learn_windows` (default on for a rule with windows): a frequency
    /// 45009 lowers the pair's windows for the rest of the quota day
    /// ([`crate::limit::learned`]).
    pub learn_windows: bool,
}

/// Whose calls a rule's limits count together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scope {
    /// Every path of the rule shares one state.
    #[default]
    Rule,
    /// Every path of the rule has a state of its own.
    Path,
    /// Every WeCom app (the body's `agentid`) has a state of its own
    /// within the account: WeCom counts an app's messages per app.
    App,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Rule => "rule",
            Scope::Path => "path",
            Scope::App => "app",
        }
    }
}

/// What a derivation does with a percentage that leaves one side nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fit {
    /// The configuration is refused, with a message naming the limit.
    Refuse,
    /// Each side keeps at least one call (the fallback's scaled rule: a
    /// refused config is not an answer while Redis is away).
    Clamp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Limit {
    Window(WindowLimit),
    /// At most `count` calls in each calendar `period`.
    Calendar {
        count: NonZeroU64,
        period: Period,
    },
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
                (format!("{}s", w.per_us / 1_000_000), w.count(), (w.per_us / 1_000_000) as u64)
            }
            Limit::Window(w) => (format!("{}ms", w.per_us / 1000), w.count(), (w.per_us as u64).div_ceil(1_000_000)),
            Limit::Calendar { count, period: Period::Day } => ("day".into(), count.get(), 86_400),
            Limit::Calendar { count, period: Period::Month } => ("month".into(), count.get(), 31 * 86_400),
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

/// `{count N, per W, burst B}` compiled to GCRA parameters, with the
/// arrival margin `M` (`[server] window_margin`) that keeps the window
/// exact where WeChat counts, not only where wxgate decides.
///
/// Valid by construction: `1 ≤ B ≤ N` and `W > 0` are checked once, when
/// it is made ([`WindowLimit::new`]), so the decision never checks them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct WindowLimit {
    count: NonZeroU64,
    per_us: Micros,
    burst: NonZeroU64,
    interval_us: Micros,
    tolerance_us: Micros,
    #[serde(skip_serializing_if = "is_zero")]
    margin_us: Micros,
}

fn is_zero(us: &Micros) -> bool {
    *us == 0
}

/// Why `{count, per, burst}` is not a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WindowError {
    #[error("count must be at least 1")]
    NoCount,
    #[error("burst must be at least 1")]
    NoBurst,
    #[error("burst {burst} exceeds count {count}")]
    BurstOverCount { burst: u64, count: u64 },
    #[error("the window must be longer than 0")]
    Empty,
}

impl WindowLimit {
    /// A window exact at the decision (no arrival margin).
    pub fn new(count: u64, per_us: Micros, burst: u64) -> Result<Self, WindowError> {
        WindowLimit::with_margin(count, per_us, burst, 0)
    }

    /// A window exact at WeChat's door for trips that differ by up to
    /// `margin_us` (a negative one is 0); `Err` unless `1 ≤ burst ≤ count`
    /// and `per_us > 0`.
    pub fn with_margin(count: u64, per_us: Micros, burst: u64, margin_us: Micros) -> Result<Self, WindowError> {
        let count = NonZeroU64::new(count).ok_or(WindowError::NoCount)?;
        let burst = NonZeroU64::new(burst).ok_or(WindowError::NoBurst)?;
        if burst > count {
            return Err(WindowError::BurstOverCount { burst: burst.get(), count: count.get() });
        }
        if per_us <= 0 {
            return Err(WindowError::Empty);
        }
        Ok(WindowLimit::derived(count, per_us, burst, margin_us))
    }

    /// A window from numbers valid by derivation (a scaled or shared
    /// window of a valid one): `burst` is at most `count` (clamped), `per_us`
    /// positive (at least 1).
    fn derived(count: NonZeroU64, per_us: Micros, burst: NonZeroU64, margin_us: Micros) -> Self {
        let burst = burst.min(count);
        let per_us = per_us.max(1);
        let slots = i64::try_from(count.get() - burst.get() + 1).unwrap_or(i64::MAX);
        let span = per_us.saturating_add(margin_us.max(0));
        let interval_us = (span.saturating_add(slots - 1) / slots).max(1);
        let tolerance_us = i64::try_from(burst.get() - 1).unwrap_or(0).saturating_mul(interval_us);
        WindowLimit { count, per_us, burst, interval_us, tolerance_us, margin_us: margin_us.max(0) }
    }

    /// `N`: calls per window.
    pub fn count(&self) -> u64 {
        self.count.get()
    }

    /// `W`, the window's length.
    pub fn per_us(&self) -> Micros {
        self.per_us
    }

    /// `B`: calls at once.
    pub fn burst(&self) -> u64 {
        self.burst.get()
    }

    /// Emission interval `T = ⌈(W + M) / (N − B + 1)⌉` (rounded up: never
    /// faster); at least 1.
    pub fn interval_us(&self) -> Micros {
        self.interval_us
    }

    /// Tolerance `τ = (B − 1)·T`.
    pub fn tolerance_us(&self) -> Micros {
        self.tolerance_us
    }

    /// The arrival margin `M`: no `N + 1` admissions within `W + M`, so
    /// calls whose trips from decision to WeChat differ by up to `M` still
    /// arrive at most `N` in any `W` ([`crate::limit`]).
    pub fn margin_us(&self) -> Micros {
        self.margin_us
    }

    /// Burst when the config gives none: 5 % of the count, at least 1. Small,
    /// so the sustained rate stays at ≥ 95 % of the quota.
    pub fn default_burst(count: u64) -> u64 {
        count.div_ceil(20).max(1)
    }

    /// This window with `count` calls (fewer than its own), its burst at
    /// most the default burst of that count: the window a frequency 45009
    /// lowers it to ([`crate::limit::learned`]).
    pub fn lowered(&self, count: u64) -> WindowLimit {
        let count = NonZeroU64::new(count.clamp(1, self.count())).unwrap_or(NonZeroU64::MIN);
        let burst =
            NonZeroU64::new(self.burst().min(WindowLimit::default_burst(count.get()))).unwrap_or(NonZeroU64::MIN);
        WindowLimit::derived(count, self.per_us, burst, self.margin_us)
    }

    /// This window decided as if its arrival margin were `margin_us` (when
    /// wider than its own): the emission interval of that margin, its own
    /// tolerance kept. Never looser than itself, whatever mix of the two
    /// decides a pair's calls: every interval is at least its own and the
    /// tolerance is its own, so `k` admissions still span at least
    /// `(k − 1)·T − τ` of its own `T` and `τ` (the exactness argument of
    /// [`crate::limit`]), and those decided by this one alone span
    /// `W + margin_us` for `N + 1` of them, less the burst's share of the
    /// widening (`(B − 1)` calls at once become fewer while it lasts).
    pub fn widened(&self, margin_us: Micros) -> WindowLimit {
        if margin_us <= self.margin_us {
            return *self;
        }
        let wide = WindowLimit::derived(self.count, self.per_us, self.burst, margin_us);
        WindowLimit { interval_us: wide.interval_us.max(self.interval_us), margin_us, ..*self }
    }

    /// This window decided with emission interval `interval_us` and
    /// tolerance `tolerance_us` where they are stricter than its own: a
    /// lowered window's ([`WindowLimit::lowered`]) applied over the one
    /// configured (each stricter, so the result is exact for both), shown
    /// with the lower count and burst.
    pub fn tightened(&self, lowered: &WindowLimit) -> WindowLimit {
        WindowLimit {
            count: self.count.min(lowered.count),
            burst: self.burst.min(lowered.burst),
            interval_us: self.interval_us.max(lowered.interval_us),
            tolerance_us: self.tolerance_us.min(lowered.tolerance_us),
            ..*self
        }
    }

    /// A window with these numbers as they were stored (a lowered window
    /// read back from a store): `count` and `burst` at least 1.
    pub fn stored(count: u64, burst: u64, per_us: Micros, interval_us: Micros, tolerance_us: Micros) -> WindowLimit {
        WindowLimit {
            count: NonZeroU64::new(count).unwrap_or(NonZeroU64::MIN),
            per_us,
            burst: NonZeroU64::new(burst).unwrap_or(NonZeroU64::MIN),
            interval_us: interval_us.max(1),
            tolerance_us: tolerance_us.max(0),
            margin_us: 0,
        }
    }

    /// This window for one of `n` instances: count and burst divided by `n`
    /// (rounded down, at least 1).
    fn divided(&self, n: u64) -> WindowLimit {
        let part = |x: NonZeroU64| NonZeroU64::new(x.get() / n).unwrap_or(NonZeroU64::MIN);
        WindowLimit::derived(part(self.count), self.per_us, part(self.burst), self.margin_us)
    }

    /// Capacity and refill in token-bucket terms, for `wxgate check`.
    pub fn refill_per_second(&self) -> f64 {
        1_000_000.0 / self.interval_us as f64
    }
}

impl Rule {
    /// A rule named `name` counting `limits`, with every option at its
    /// default (no shaping, warm-up, cap, reserve or share; 429 refusals).
    pub fn new(name: &str, limits: Vec<Limit>) -> Rule {
        let name: Arc<str> = name.into();
        Rule {
            id: 0,
            state: name.clone(),
            name,
            scope: Scope::Rule,
            path: None,
            patterns: Vec::new(),
            limits,
            max_wait_us: 0,
            warmup_us: 0,
            concurrency: 0,
            shadow: false,
            reserve_percent: 0,
            reserve: Vec::new(),
            share_percent: 0,
            share: Vec::new(),
            per_recipient: Vec::new(),
            account: None,
            learn_up: false,
            learned_divisor: 1,
            learn_windows: false,
        }
    }

    /// This rule (or per-path variant) for `account` alone, counting
    /// `limits` instead of its own (a `[[quota]]` override): the same
    /// state (a window whose length is kept keeps its count, as on a
    /// reload), every other setting kept, and the reserve and the callers'
    /// shares derived again from the new limits by the same percentages
    /// (refused, naming the limit, where a percentage leaves a side nothing).
    pub fn overridden(&self, account: Arc<str>, limits: Vec<Limit>) -> Result<Rule, PercentError> {
        let rule = Rule { limits, account: Some(account), ..self.clone() };
        rule.with_percents(self.reserve_percent, self.share_percent)
    }

    /// This rule's state for the WeCom app `agentid` (a `scope = "app"`
    /// rule's call): every setting kept, its state `<state>@<agentid>`, so
    /// that each app's limits, recipients' windows, penalty and learned
    /// windows are its own. `agentid` is at most 10 digits (as the
    /// meter reads it from the body): the key stays bounded.
    pub fn for_app(&self, agentid: &str) -> Rule {
        let mut state = String::with_capacity(self.state.len() + 1 + agentid.len());
        state.push_str(&self.state);
        state.push('@');
        state.push_str(agentid);
        Rule { state: state.into(), ..self.clone() }
    }

    /// Sets `reserve = "P%"` (0: none) and `max_share = "P%"` (0: none) and
    /// derives what they keep back and give each caller from the rule's
    /// limits. Refuses a percentage that leaves normal callers no call of a
    /// limit (reserve) or a caller no call at all (share), naming the limit.
    pub fn with_percents(mut self, reserve_percent: u32, share_percent: u32) -> Result<Rule, PercentError> {
        self.reserve_percent = reserve_percent;
        self.share_percent = share_percent;
        self.derive(Fit::Refuse)?;
        Ok(self)
    }

    /// What one of `instances` instances may use alone (the local fallback
    /// while Redis is away): every count, burst and concurrency cap divided
    /// by `instances` (rounded down, at least 1), and the reserve and the
    /// callers' shares derived again from those, as for a rule configured
    /// with them. Where the scaled numbers are too small for a percentage,
    /// each side keeps at least one call.
    pub fn scaled(&self, instances: u32) -> Rule {
        let n = u64::from(instances.max(1));
        let mut scaled = self.clone();
        scaled.limits = self
            .limits
            .iter()
            .map(|l| match *l {
                Limit::Window(w) => Limit::Window(w.divided(n)),
                Limit::Calendar { count, period } => {
                    Limit::Calendar { count: NonZeroU64::new(count.get() / n).unwrap_or(NonZeroU64::MIN), period }
                }
            })
            .collect();
        if self.concurrency > 0 {
            scaled.concurrency = (self.concurrency / instances.max(1)).max(1);
        }
        // A recipient messaged through every instance must not get its
        // limit from each.
        scaled.per_recipient = self.per_recipient.iter().map(|w| w.divided(n)).collect();
        scaled.learned_divisor = self.learned_divisor.max(1) * n;
        // Clamped: no error to give.
        let _ = scaled.derive(Fit::Clamp);
        scaled
    }

    /// This rule without its calendar quotas: what an instance decides by
    /// its own share while a reserve covers the calendar quotas through an
    /// outage (`src/store/resilient/leases.rs`). The per-limit tables
    /// (reserve, share) keep their windows' entries.
    pub fn windows_only(&self) -> Rule {
        let keep: Vec<bool> = self.limits.iter().map(|l| matches!(l, Limit::Window(_))).collect();
        let pick = |i: usize| keep.get(i).copied().unwrap_or(false);
        let mut rule = self.clone();
        rule.limits = self.limits.iter().copied().filter(|l| matches!(l, Limit::Window(_))).collect();
        rule.reserve = self.reserve.iter().enumerate().filter(|(i, _)| pick(*i)).map(|(_, r)| *r).collect();
        rule.share = self.share.iter().enumerate().filter(|(i, _)| pick(*i)).map(|(_, l)| *l).collect();
        rule
    }

    /// This rule with every window (its own, each caller's share, each
    /// recipient's) decided as if the arrival margin were `margin_us`
    /// ([`WindowLimit::widened`]: never looser than configured); the reserve
    /// is derived again (the same reserved tokens, as time of the wider
    /// interval: stricter for normal callers).
    pub fn widened(&self, margin_us: Micros) -> Rule {
        let widen = |l: &Limit| match *l {
            Limit::Window(w) => Limit::Window(w.widened(margin_us)),
            calendar => calendar,
        };
        let mut wide = self.clone();
        wide.limits = self.limits.iter().map(widen).collect();
        wide.share = self.share.iter().map(widen).collect();
        wide.per_recipient = self.per_recipient.iter().map(|w| w.widened(margin_us)).collect();
        if self.reserve_percent > 0 {
            // Valid for the rule's own limits, so for these (clamped: no error to give).
            wide.reserve = reserve_of(&wide.limits, self.reserve_percent, Fit::Clamp).unwrap_or_default();
        }
        wide
    }

    /// `reserve` and `share` from `limits` and the two percentages.
    fn derive(&mut self, fit: Fit) -> Result<(), PercentError> {
        self.reserve = match self.reserve_percent {
            0 => Vec::new(),
            p => reserve_of(&self.limits, p, fit)?,
        };
        self.share = match self.share_percent {
            0 => Vec::new(),
            p => shares_of(&self.limits, p, fit)?,
        };
        Ok(())
    }
}

impl Rule {
    /// Whether the decision tells a normal-priority caller's call from a
    /// high one's (the rule keeps a reserve): else both are decided alike,
    /// and what is known of one's refusal holds for the other's.
    pub fn priority_matters(&self) -> bool {
        !self.reserve.is_empty()
    }

    /// Whether the decision tells one caller's call from another's (the
    /// rule gives each a `max_share`): else every caller's is decided alike.
    pub fn caller_matters(&self) -> bool {
        !self.share.is_empty()
    }

    /// Whether the decision reads a call's recipients (the rule has
    /// `per_recipient` limits).
    pub fn recipients_matter(&self) -> bool {
        !self.per_recipient.is_empty()
    }

    /// The largest cost a call of this rule can ever be admitted at, and
    /// the limit that caps it (`None`: no cap): a window takes at most its
    /// burst at once, a calendar quota its count, less what a normal
    /// caller must leave (`normal`) and, with `share`, the caller's share.
    /// A call costing more is refused whatever it waits.
    pub fn max_cost(&self, normal: bool, share: bool) -> Option<(u64, String)> {
        let own = self.limits.iter().enumerate().map(|(i, l)| {
            let kept = if normal { self.reserve.get(i).copied().unwrap_or(0) } else { 0 };
            (l, kept, format!("limits[{i}] ({})", describe(l)))
        });
        let shared =
            self.share.iter().filter(|_| share).map(|l| (l, 0, format!("the caller's max_share ({})", describe(l))));
        own.chain(shared)
            .map(|(l, kept, name)| {
                let most = match *l {
                    // n at once need (n − 1)·T + kept ≤ τ.
                    Limit::Window(w) => ((w.tolerance_us - kept).max(0) / w.interval_us.max(1)) as u64 + 1,
                    Limit::Calendar { count, .. } => count.get().saturating_sub(kept.max(0) as u64),
                };
                (most, name)
            })
            .min_by_key(|(most, _)| *most)
    }
}

/// One of a rule's options as `wxgate check` and the admin API show it,
/// from the compiled numbers (so a new option is shown where it is derived).
#[derive(Debug, Clone, PartialEq)]
pub struct Shown {
    /// The admin API's key (`GET /v1/rules`).
    pub key: &'static str,
    /// Its value there (`null`: not set).
    pub value: serde_json::Value,
    /// What `wxgate check` says of it (`None`: at its default, nothing).
    pub says: Option<String>,
}

impl Rule {
    /// The rule's options beyond its name, patterns, scope and limits, in
    /// the order `wxgate check` reports them.
    pub fn shown(&self) -> Vec<Shown> {
        use serde_json::{json, Value};
        let set = |on: bool, value: Value| if on { value } else { Value::Null };
        let each: Vec<String> = self.share.iter().map(describe).collect();
        vec![
            Shown {
                key: "reserve_percent",
                value: set(self.reserve_percent > 0, json!(self.reserve_percent)),
                says: (self.reserve_percent > 0).then(|| {
                    format!(
                        "reserve {}%: normal-priority callers leave that share of each limit to high-priority ones",
                        self.reserve_percent
                    )
                }),
            },
            Shown {
                key: "max_share_percent",
                value: set(self.share_percent > 0, json!(self.share_percent)),
                says: (self.share_percent > 0).then(|| {
                    format!(
                        "max_share {}%: no one caller (declared, or all undeclared together) uses more than {}",
                        self.share_percent,
                        each.join(", ")
                    )
                }),
            },
            Shown {
                key: "max_wait_ms",
                value: json!(self.max_wait_us as f64 / 1e3),
                says: (self.max_wait_us > 0).then(|| {
                    format!("max_wait {}: a call whose slot is that close is held for it, not refused", human(self.max_wait_us))
                }),
            },
            Shown {
                key: "warmup_seconds",
                value: json!(self.warmup_us as f64 / 1e6),
                says: (self.warmup_us > 0).then(|| {
                    format!(
                        "warmup {}: after a cold start or a token refresh the refill starts at half and reaches full over that time",
                        human(self.warmup_us)
                    )
                }),
            },
            Shown {
                key: "concurrency",
                value: set(self.concurrency > 0, json!(self.concurrency)),
                says: (self.concurrency > 0)
                    .then(|| format!("concurrency {}: at most that many calls in flight at WeChat", self.concurrency)),
            },
            Shown {
                key: "per_recipient",
                value: set(
                    !self.per_recipient.is_empty(),
                    json!(self.per_recipient.iter().map(|w| describe(&Limit::Window(*w))).collect::<Vec<_>>()),
                ),
                says: (!self.per_recipient.is_empty()).then(|| {
                    format!(
                        "per_recipient: each recipient at most {}",
                        self.per_recipient.iter().map(|w| describe(&Limit::Window(*w))).collect::<Vec<_>>().join(", ")
                    )
                }),
            },
            Shown {
                key: "mode",
                value: json!(if self.shadow { "shadow" } else { "enforce" }),
                says: self.shadow.then(|| "mode shadow: decided and counted, but every call is forwarded".to_owned()),
            },
        ]
    }
}

/// A limit as `wxgate check` names it: `60 per 1m (burst 6)`, `600 per calendar day`.
pub fn describe(limit: &Limit) -> String {
    match limit {
        Limit::Window(w) => format!("{} per {} (burst {})", w.count, human(w.per_us), w.burst),
        Limit::Calendar { count, period } => format!("{count} per calendar {}", period.as_str()),
    }
}

fn human(us: Micros) -> humantime::FormattedDuration {
    humantime::format_duration(std::time::Duration::from_micros(us.max(0) as u64))
}

/// Why a percentage does not fit a rule's limits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PercentError {
    #[error("reserve: the rule has no limits to keep a share of")]
    NoLimitsToReserve,
    #[error(
        "reserve: {percent}% of limits[{limit}]'s burst of {burst} leaves no call for normal callers: a window keeps \
         back whole calls of its burst, so give it burst = {needed} or more"
    )]
    ReserveTakesBurst { percent: u32, limit: usize, burst: u64, needed: u64 },
    #[error("reserve: {percent}% of limits[{limit}]'s count of {count} leaves no call for normal callers")]
    ReserveTakesCount { percent: u32, limit: usize, count: u64 },
    #[error("max_share: the rule has no limits to share")]
    NoLimitsToShare,
    #[error("max_share: {percent}% of limits[{limit}]'s count of {count} is less than one call: no caller could call")]
    ShareBelowOne { percent: u32, limit: usize, count: u64 },
}

/// Per limit, what normal-priority calls may not use ([`Rule::reserve`]):
/// ⌈P % of a window's burst⌉ tokens as time, ⌈P % of a calendar count⌉
/// calls. `Clamp` keeps at least one call for normal callers.
fn reserve_of(limits: &[Limit], percent: u32, fit: Fit) -> Result<Vec<i64>, PercentError> {
    if limits.is_empty() {
        return Err(PercentError::NoLimitsToReserve);
    }
    let part = |n: u64| n.saturating_mul(u64::from(percent)).div_ceil(100);
    let mut reserve = Vec::with_capacity(limits.len());
    for (i, limit) in limits.iter().enumerate() {
        reserve.push(match *limit {
            Limit::Window(w) => {
                let burst = w.burst();
                let mut kept = part(burst);
                if kept >= burst {
                    if fit == Fit::Refuse {
                        let needed = 100u64.div_ceil(100 - u64::from(percent)).max(2);
                        return Err(PercentError::ReserveTakesBurst { percent, limit: i, burst, needed });
                    }
                    kept = burst - 1;
                }
                kept as i64 * w.interval_us
            }
            Limit::Calendar { count, .. } => {
                let count = count.get();
                let mut kept = part(count);
                if kept >= count {
                    if fit == Fit::Refuse {
                        return Err(PercentError::ReserveTakesCount { percent, limit: i, count });
                    }
                    kept = count - 1;
                }
                kept as i64
            }
        });
    }
    Ok(reserve)
}

/// Per limit, one caller's sub-limits under `max_share = "P%"`
/// ([`Rule::share`]): P % of each count (rounded down) and of each burst
/// (rounded up, at least 1, at most the share's count). `Clamp` gives a
/// caller at least one call where P % of a count is less.
fn shares_of(limits: &[Limit], percent: u32, fit: Fit) -> Result<Vec<Limit>, PercentError> {
    if limits.is_empty() {
        return Err(PercentError::NoLimitsToShare);
    }
    let part = |n: u64| n.saturating_mul(u64::from(percent)) / 100;
    let mut share = Vec::with_capacity(limits.len());
    for (i, limit) in limits.iter().enumerate() {
        let whole = match *limit {
            Limit::Window(w) => w.count,
            Limit::Calendar { count, .. } => count,
        };
        let count = match NonZeroU64::new(part(whole.get())) {
            Some(count) => count,
            None if fit == Fit::Refuse => {
                return Err(PercentError::ShareBelowOne { percent, limit: i, count: whole.get() })
            }
            None => NonZeroU64::MIN,
        };
        share.push(match *limit {
            Limit::Window(w) => {
                let burst = w.burst.get().saturating_mul(u64::from(percent)).div_ceil(100);
                let burst = NonZeroU64::new(burst).unwrap_or(NonZeroU64::MIN);
                Limit::Window(WindowLimit::derived(count, w.per_us, burst, w.margin_us))
            }
            Limit::Calendar { period, .. } => Limit::Calendar { count, period },
        });
    }
    Ok(share)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::calendar::Period;

    fn day(count: u64) -> Limit {
        Limit::Calendar { count: NonZeroU64::new(count).expect("a count"), period: Period::Day }
    }

    /// Issue 45: a window is valid by construction (it was built from
    /// public fields by callers who were to check them first).
    #[test]
    fn a_window_is_made_valid_or_not_at_all() {
        assert_eq!(WindowLimit::new(3, 60_000_000, 5), Err(WindowError::BurstOverCount { burst: 5, count: 3 }));
        assert_eq!(WindowLimit::new(0, 60_000_000, 1), Err(WindowError::NoCount));
        assert_eq!(WindowLimit::new(3, 60_000_000, 0), Err(WindowError::NoBurst));
        assert_eq!(WindowLimit::new(3, 0, 1), Err(WindowError::Empty));
        let w = WindowLimit::with_margin(5, 60_000_000, 2, 20_000).expect("valid");
        assert_eq!((w.count(), w.burst(), w.per_us(), w.margin_us()), (5, 2, 60_000_000, 20_000));
        assert_eq!((w.interval_us(), w.tolerance_us()), (15_005_000, 15_005_000));
        // Scaled for 4 instances: count and burst divided, at least 1.
        let quarter = w.divided(4);
        assert_eq!((quarter.count(), quarter.burst(), quarter.interval_us()), (1, 1, 60_020_000));
    }

    #[test]
    fn a_scaled_rule_derives_its_reserve_and_shares_from_the_scaled_counts() {
        let rule = Rule::new("r", vec![day(90)]).with_percents(40, 50).expect("fits");
        assert_eq!((rule.reserve.clone(), rule.share.clone()), (vec![36], vec![day(45)]));
        let third = rule.scaled(3);
        assert_eq!((third.limits, third.reserve, third.share), (vec![day(30)], vec![12], vec![day(15)]));
    }

    #[test]
    fn a_scaled_rule_keeps_one_call_for_each_side() {
        let rule = Rule::new("r", vec![day(10)]).with_percents(50, 20).expect("fits");
        let quarter = rule.scaled(10);
        assert_eq!((quarter.limits, quarter.reserve, quarter.share), (vec![day(1)], vec![0], vec![day(1)]));
        assert_eq!(
            Rule::new("r", vec![day(1)]).with_percents(50, 0),
            Err(PercentError::ReserveTakesCount { percent: 50, limit: 0, count: 1 })
        );
    }
}
