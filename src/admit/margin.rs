//! The arrival margin as this machine keeps it. `[server] window_margin`
//! (`M`) is how much two calls' trips from decision to WeChat may differ
//! with every window still exact where WeChat counts ([`crate::limit`]). A
//! trip is mostly this process's own scheduling: a held call is sent when
//! its runtime wakes it, which a busy CPU makes late. Measured (issue 61: 2
//! cores at load ~4), held calls released at a window's edge went tens of
//! ms late, and 53 calls reached WeChat within 1.94 s of a window of 50 per
//! 2 s: the fixed 20 ms covers a quiet machine only.
//!
//! So the lateness is measured where it arises, and the margin follows it:
//!
//! - Each serving runtime runs a probe that sleeps [`PROBE_US`] and notes
//!   how late it woke; a held call notes how late its hold ended. Both are
//!   the scheduler's lateness, which the trip of a call sent then carries.
//! - The worst lateness of the last [`KEEP_S`] seconds, `L`: while `1.5·L`
//!   is more than `M`, every window is decided as if its margin were the
//!   first of [`LEVELS`] that covers `1.5·L` (at most `[server]
//!   window_margin_max`); once `L` has been small for [`KEEP_S`] seconds,
//!   the configured margin again. Widening is at once; each change is
//!   logged, and shown as `wxgate_window_margin_seconds` (and
//!   `wxgate_scheduler_late_seconds`, `L`).
//! - A widened window keeps its own tolerance and takes the interval of the
//!   wider margin ([`crate::limit::WindowLimit::widened`]): whatever mix of
//!   margins decided a pair's calls, no window is ever looser than
//!   configured; while widened, a burst may be one call smaller.
//!
//! The cost is the margin's share of a window's rate (`M / W`: 100 ms of a
//! 2 s window is 5 %), only while the machine is that late.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use crate::limit::Rule;
use crate::telemetry::metrics::Metrics;
use crate::time::{Clock, Micros, Span};

/// How often a serving runtime's probe wakes.
pub const PROBE_US: Micros = 10_000;
/// How long a lateness counts (seconds): the margin narrows this long after
/// the last late wake-up that widened it.
pub const KEEP_S: usize = 30;
/// The margins a widened one takes (µs): few, so that each rule has few
/// variants (they are derived once per margin, [`Margin::widened`]).
pub const LEVELS: [Micros; 6] = [50_000, 100_000, 200_000, 500_000, 1_000_000, 2_000_000];
/// Rule variants kept for the current margin; past it, derived per call.
const MAX_VARIANTS: usize = 4096;

/// The worst lateness of each of the last [`KEEP_S`] seconds.
#[derive(Debug, Default)]
pub struct Spread {
    worst: [Micros; KEEP_S],
    /// The second (`now / 1 s`) `worst[second % KEEP_S]` is of.
    second: i64,
}

impl Spread {
    /// A wake-up `late_us` late, at `now`.
    pub fn observe(&mut self, now: Micros, late_us: Micros) {
        self.roll(now);
        let slot = &mut self.worst[(self.second.rem_euclid(KEEP_S as i64)) as usize];
        *slot = (*slot).max(late_us.max(0));
    }

    /// The worst lateness of the last [`KEEP_S`] seconds, at `now`.
    pub fn worst(&mut self, now: Micros) -> Micros {
        self.roll(now);
        self.worst.iter().copied().max().unwrap_or(0)
    }

    /// Forgets the seconds that `now` has left behind.
    fn roll(&mut self, now: Micros) {
        let second = now.div_euclid(1_000_000);
        if second <= self.second {
            return;
        }
        let gone = (second - self.second).min(KEEP_S as i64);
        for s in 1..=gone {
            self.worst[((self.second + s).rem_euclid(KEEP_S as i64)) as usize] = 0;
        }
        self.second = second;
    }
}

/// The margin windows are decided with when the scheduler was at worst
/// `worst_us` late: `configured` while it covers one and a half times that,
/// else the first of [`LEVELS`] that does, at most `max_us` (at least
/// `configured`).
pub fn effective(configured: Micros, max_us: Micros, worst_us: Micros) -> Micros {
    let want = worst_us.saturating_mul(3) / 2;
    if want <= configured || max_us <= configured {
        return configured;
    }
    let level = LEVELS.iter().copied().find(|&l| l >= want).unwrap_or(Micros::MAX);
    level.min(max_us).max(configured)
}

/// This instance's margin: what it measured, the margin it decides with,
/// and each rule's variant for it.
pub struct Margin {
    spread: Mutex<Spread>,
    /// The margin windows are decided with, when wider than configured (0:
    /// as configured). Read once per call.
    widened_us: AtomicI64,
    /// The worst lateness last computed, for the gauge.
    worst_us: AtomicI64,
    variants: Mutex<Variants>,
}

/// Rules derived for one widened margin, by the address of the rule they
/// were derived from (which each entry keeps alive, so no other rule takes
/// its address while it is here).
#[derive(Default)]
struct Variants {
    margin_us: Micros,
    of: HashMap<usize, (Arc<Rule>, Arc<Rule>)>,
}

impl Default for Margin {
    fn default() -> Self {
        Margin {
            spread: Mutex::new(Spread::default()),
            widened_us: AtomicI64::new(0),
            worst_us: AtomicI64::new(0),
            variants: Mutex::default(),
        }
    }
}

/// A change of the margin (for the log and the gauges).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Change {
    pub from_us: Micros,
    pub to_us: Micros,
    pub worst_us: Micros,
}

impl Margin {
    /// A wake-up `late_us` late at `now`, under a config whose margin is
    /// `configured` and may widen to `max_us`; the change it makes to the
    /// margin windows are decided with, if any.
    pub fn observe(&self, now: Micros, late_us: Micros, configured: Micros, max_us: Micros) -> Option<Change> {
        let worst = {
            let mut spread = self.spread.lock().unwrap_or_else(|e| e.into_inner());
            spread.observe(now, late_us);
            spread.worst(now)
        };
        self.worst_us.store(worst, Ordering::Relaxed);
        let to = effective(configured, max_us, worst);
        let stored = if to > configured { to } else { 0 };
        let was = self.widened_us.swap(stored, Ordering::Relaxed);
        let from = if was > 0 { was } else { configured };
        (was != stored).then_some(Change { from_us: from, to_us: to, worst_us: worst })
    }

    /// The margin windows are decided with now (`configured` unless widened).
    pub fn now_us(&self, configured: Micros) -> Micros {
        match self.widened_us.load(Ordering::Relaxed) {
            0 => configured,
            m => m,
        }
    }

    /// The worst lateness of the last [`KEEP_S`] seconds, as last observed.
    pub fn worst_us(&self) -> Micros {
        self.worst_us.load(Ordering::Relaxed)
    }

    /// While the margin is widened, `rule`'s variant for the wider margin
    /// ([`Rule::widened`]), derived once per rule and margin; `None`: a call
    /// is decided by `rule` itself.
    pub fn widened(&self, rule: &Arc<Rule>) -> Option<Arc<Rule>> {
        let margin = self.widened_us.load(Ordering::Relaxed);
        if margin == 0 {
            return None;
        }
        let key = Arc::as_ptr(rule) as usize;
        let mut variants = self.variants.lock().unwrap_or_else(|e| e.into_inner());
        if variants.margin_us != margin {
            variants.of.clear();
            variants.margin_us = margin;
        }
        if let Some((_, wide)) = variants.of.get(&key) {
            return Some(wide.clone());
        }
        let wide = Arc::new(rule.widened(margin));
        if variants.of.len() < MAX_VARIANTS {
            variants.of.insert(key, (rule.clone(), wide.clone()));
        }
        Some(wide)
    }
}

/// Notes a wake-up `late_us` late at `now` under `server`'s margin: the
/// gauges, and the change of margin logged.
pub fn note(margin: &Margin, metrics: &Metrics, server: &crate::config::Server, now: Micros, late_us: Micros) {
    let configured = server.window_margin_us;
    let change = margin.observe(now, late_us, configured, server.window_margin_max_us);
    metrics.scheduler_late.set(margin.worst_us() as f64 / 1e6);
    metrics.window_margin.set(margin.now_us(configured) as f64 / 1e6);
    let Some(c) = change else { return };
    if c.to_us > c.from_us {
        tracing::warn!(
            late_ms = c.worst_us / 1000,
            margin_ms = c.to_us / 1000,
            configured_ms = configured / 1000,
            "this machine's scheduler ran late (a busy CPU): every window is decided as if window_margin were {} ms \
             until it has been on time for {KEEP_S} s",
            c.to_us / 1000
        );
    } else {
        tracing::info!(
            margin_ms = c.to_us / 1000,
            "the scheduler is on time again: windows are decided with window_margin {} ms",
            c.to_us / 1000
        );
    }
}

/// A serving runtime's probe: wakes every [`PROBE_US`] on `clock` and hands
/// how late it woke to `observe`, until `stop` resolves; every [`IDLE_US`]
/// instead while `observe` says the margin cannot widen (`window_margin_max`
/// at most `window_margin`: then only the gauge of lateness is fed).
pub async fn probe(
    clock: Arc<dyn Clock>,
    mut observe: impl FnMut(Micros, Micros) -> bool,
    stop: impl std::future::Future,
) {
    tokio::pin!(stop);
    let mut every = PROBE_US;
    loop {
        let due = clock.now_us() + every;
        tokio::select! {
            _ = clock.sleep(Span::from_micros(every)) => {}
            _ = &mut stop => return,
        }
        let now = clock.now_us();
        every = if observe(now, now - due) { PROBE_US } else { IDLE_US };
    }
}

/// How often the probe wakes while the margin cannot widen.
pub const IDLE_US: Micros = 1_000_000;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{Limit, WindowLimit};

    const S: Micros = 1_000_000;
    const MS: Micros = 1_000;

    #[test]
    fn the_margin_widens_at_once_and_narrows_after_keep_s_quiet_seconds() {
        let m = Margin::default();
        let (configured, max) = (20 * MS, 500 * MS);
        assert_eq!(m.observe(100 * S, 5 * MS, configured, max), None, "a quiet machine");
        assert_eq!(m.now_us(configured), configured);
        let change = m.observe(100 * S + 10 * MS, 40 * MS, configured, max).expect("widened");
        assert_eq!(change, Change { from_us: 20 * MS, to_us: 100 * MS, worst_us: 40 * MS });
        assert_eq!(m.now_us(configured), 100 * MS, "1.5 × 40 ms = 60 ms: the 100 ms level");
        assert_eq!(m.observe(110 * S, 300 * MS, configured, max).map(|c| c.to_us), Some(500 * MS), "at most max");
        assert_eq!(m.observe(129 * S, MS, configured, max), None, "still within 30 s of the worst");
        let back = m.observe(140 * S + 1, MS, configured, max).expect("narrowed");
        assert_eq!((back.from_us, back.to_us), (500 * MS, 20 * MS));
        assert_eq!(m.now_us(configured), configured);
        // window_margin_max at most the margin: it never widens.
        assert_eq!(m.observe(141 * S, 900 * MS, configured, configured), None);
    }

    #[test]
    fn effective_covers_one_and_a_half_times_the_lateness_by_levels() {
        assert_eq!(effective(20 * MS, 2 * S, 13 * MS), 20 * MS);
        assert_eq!(effective(20 * MS, 2 * S, 14 * MS), 50 * MS);
        assert_eq!(effective(20 * MS, 2 * S, 140 * MS), 500 * MS);
        assert_eq!(effective(20 * MS, 2 * S, 10 * S), 2 * S);
        assert_eq!(effective(700 * MS, 2 * S, 600 * MS), S);
        assert_eq!(effective(0, 0, 600 * MS), 0, "window_margin_max = 0: never widened");
    }

    /// GCRA over a stream of calls each decided by a window with any of
    /// the margins: no `N + 1` admissions within the configured `W + M`,
    /// whatever the mix (the widened window is never looser).
    #[test]
    fn a_widened_window_is_never_looser_than_configured_whatever_the_mix() {
        let configured = WindowLimit::with_margin(50, 2 * S, 5, 20 * MS).expect("window");
        let margins = [20 * MS, 50 * MS, 100 * MS, 500 * MS];
        let mut seed: u64 = 7;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let (mut tat, mut now) = (0i64, 0i64);
        let mut admitted = Vec::new();
        while now < 120 * S {
            let w = configured.widened(margins[(next() % 4) as usize]);
            if tat - w.tolerance_us() <= now {
                tat = tat.max(now) + w.interval_us();
                admitted.push(now);
            }
            now += (next() % 30_000) as i64;
        }
        let span = configured.per_us() + configured.margin_us();
        for pair in admitted.windows(51) {
            assert!(pair[50] - pair[0] >= span, "51 admissions within {} µs", pair[50] - pair[0]);
        }
        let wide = Rule::new("r", vec![Limit::Window(configured)]).widened(100 * MS);
        let Limit::Window(w) = wide.limits[0] else { panic!("a window") };
        assert_eq!(w.tolerance_us(), configured.tolerance_us());
        assert_eq!(w.interval_us(), (2 * S + 100 * MS + 45) / 46);
    }

    #[test]
    fn each_rule_is_widened_once_per_margin() {
        let m = Margin::default();
        let rule = Arc::new(Rule::new("r", vec![Limit::Window(WindowLimit::new(10, S, 2).expect("window"))]));
        assert!(m.widened(&rule).is_none(), "not widened: the rule itself");
        m.observe(0, 60 * MS, 0, 2 * S);
        let a = m.widened(&rule).expect("widened");
        assert!(!Arc::ptr_eq(&a, &rule));
        assert!(Arc::ptr_eq(&a, &m.widened(&rule).expect("widened")), "derived once");
    }
}
