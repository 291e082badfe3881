//! This instance's forecast of each (account, rule state)'s day quota
//! ([`crate::limit::forecast`]): fed by every admission's answer, read by
//! `/v1/buckets` (per pair), the per-rule gauges at each scrape
//! ([`Forecasts::publish`]) and queued delivery's "drained at".
//!
//! - **Input**: an admission's [`Quota`] of its calendar quotas
//!   (`Decision::Admit { calendar }`): what is left of the day quota after
//!   it, of the *shared* count (on Redis, every instance's calls). Its
//!   decrease between two admissions is the pair's use meanwhile, whoever
//!   made it, so an instance estimates the pair's whole rate from the
//!   admissions it decides (not only its own). Used only when the quota
//!   with least room is the day quota (a month quota tighter than the
//!   day's: no forecast).
//! - **Per call**: one lock (of the pair's shard) and one lookup of the
//!   pair (its account copied only for a pair new to the map), two
//!   exponentials; nothing for a rule without a day quota.
//! - **Passes over every pair** (a scrape's gauges, the console's top
//!   accounts and search) lock one of [`SHARDS`] shards at a time: a call
//!   waits at most for one shard's part of a pass (100,000 pairs: a search
//!   held the one lock of the whole table ~3.6 ms).
//! - **Bounded**: only admitted calls add a pair (so at most the accounts
//!   wxgate accepts, `[server] max_accounts`, times the rules with a day
//!   quota); pairs with no admission for [`IDLE_US`] are dropped when a
//!   shard has doubled since its last prune (and at each scrape), so it
//!   holds at most twice the pairs used in the last hour (at least
//!   [`PRUNE_AT_LEAST`]).
//! - **The limit** a fraction is of: the rule's configured day count, until
//!   [`Forecasts::set_limit`] says what the pair's effective limit is (the
//!   admin view does, from the pair's state; so should whatever learns a
//!   pair's limit).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::limit::calendar::Period;
use crate::limit::forecast::{runs_out_at, used_fraction, DayRate};
use crate::limit::pair::{Pair, PairRef};
use crate::limit::{Key, Limit, Quota, Rule};
use crate::store::pair_op::Inspect;
use crate::store::sharded::{lock, Sharded};
use crate::store::Store;
use crate::telemetry::metrics::Metrics;
use crate::time::Micros;

/// A pair with no admission for this long is forgotten (its rate would
/// read `e⁻¹²` of what it was).
pub const IDLE_US: Micros = 3_600_000_000;
/// Pairs kept before the first prune (all shards together).
pub const PRUNE_AT_LEAST: usize = 1024;
/// The table's shards.
pub const SHARDS: usize = 64;
/// Pairs a shard keeps before its first prune.
const SHARD_PRUNE_AT_LEAST: usize = PRUNE_AT_LEAST / SHARDS;

/// One pair's day quota as this instance last saw it.
#[derive(Debug, Clone)]
struct Entry {
    /// The rule's name (the gauges' label).
    rule: Arc<str>,
    /// The shared day count's increases.
    total: DayRate,
    /// This instance's queued sends' part of them.
    queued: DayRate,
    /// What the last admission left of the day quota.
    remaining: u64,
    /// The end of the quota day `remaining` is of.
    day_end: Micros,
    /// The rule's configured day count (as of the last admission).
    configured: u64,
    /// The pair's effective day limit, when told ([`Forecasts::set_limit`]).
    effective: Option<u64>,
}

impl Entry {
    /// The day limit `remaining` is of.
    fn limit(&self) -> u64 {
        self.effective.unwrap_or(self.configured)
    }
}

#[derive(Default)]
struct Table {
    pairs: hashbrown::HashMap<Pair, Entry>,
    prune_at: usize,
}

/// A pair's forecast inputs, read by [`Forecasts::rates`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rates {
    /// Increases of the shared day count per second (every caller's).
    pub total: f64,
    /// Of which this instance's queued sends.
    pub queued: f64,
}

impl Rates {
    /// The rate of everything but this instance's queued sends.
    pub fn live(&self) -> f64 {
        (self.total - self.queued).max(0.0)
    }
}

/// A pair among the most used ([`Forecasts::top`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Top {
    pub account: String,
    pub state: Arc<str>,
    pub rule: Arc<str>,
    pub used: u64,
    pub limit: u64,
    pub fraction: f64,
}

/// Every pair's forecast inputs (see the module).
#[derive(Default)]
pub struct Forecasts {
    table: Sharded<Table, SHARDS>,
}

/// The day quota's index among `rule`'s limits, and its configured count.
fn day_quota(rule: &Rule, i: usize) -> Option<u64> {
    match rule.limits.get(i)? {
        Limit::Calendar { count, period: Period::Day } => Some(count.get()),
        _ => None,
    }
}

impl Forecasts {
    /// An admission of a call of `cost` of `account` on `rule` at `now`,
    /// whose calendar quotas have `calendar` left (`queued`: a queued job's
    /// send).
    pub fn observe(&self, account: &str, rule: &Rule, calendar: Quota, now: Micros, cost: u64, queued: bool) {
        let Some(configured) = day_quota(rule, calendar.limit) else { return };
        let day_end = now + calendar.reset_us;
        let pair = PairRef(account, &rule.state);
        let mut table = self.table.lock(&pair);
        match table.pairs.get_mut(&pair) {
            Some(e) => {
                // Used since the last admission of the same day; a count
                // that went back (a clear, a raised limit) or a new day
                // starts again from here.
                let used = if day_end == e.day_end { e.remaining.saturating_sub(calendar.remaining) } else { 0 };
                e.total.add(used, now);
                if queued {
                    e.queued.add(cost, now);
                }
                if day_end >= e.day_end {
                    (e.remaining, e.day_end) = (calendar.remaining, day_end);
                }
                e.configured = configured;
            }
            None => {
                if table.pairs.len() >= table.prune_at.max(SHARD_PRUNE_AT_LEAST) {
                    prune(&mut table, now);
                }
                let entry = Entry {
                    rule: rule.name.clone(),
                    total: DayRate::starting(now),
                    queued: DayRate::starting(now),
                    remaining: calendar.remaining,
                    day_end,
                    configured,
                    effective: None,
                };
                table.pairs.insert((account.to_owned(), rule.state.clone()), entry);
            }
        }
    }

    /// The rates of the pair (`state`: the rule's state name) at `now`, if
    /// it had admissions lately and time has passed since its first.
    pub fn rates(&self, account: &str, state: &Arc<str>, now: Micros) -> Option<Rates> {
        let pair = PairRef(account, state);
        let table = self.table.lock(&pair);
        let e = table.pairs.get(&pair)?;
        Some(Rates { total: e.total.per_second(now)?, queued: e.queued.per_second(now).unwrap_or(0.0) })
    }

    /// The pair's effective day limit is `limit` (what the fractions in the
    /// gauges are of).
    pub fn set_limit(&self, account: &str, state: &Arc<str>, limit: u64) {
        let pair = PairRef(account, state);
        if let Some(e) = self.table.lock(&pair).pairs.get_mut(&pair) {
            e.effective = Some(limit);
        }
    }

    /// Sets the per-rule gauges at `now` for `rules` (the config's): for
    /// each rule with a day quota and pairs admitted today in the last
    /// hour, the highest fraction used of its pairs, the soonest exhaustion
    /// (capped at the quota day's end: "not before it") and the pairs
    /// forecast to run out before it; the seconds until the quota day ends;
    /// the gauges of every other rule are removed.
    pub fn publish(&self, metrics: &Metrics, rules: &[Arc<Rule>], offset_us: Micros, now: Micros) {
        let ends_in = Period::Day.next_start(now, offset_us) - now;
        let day_rules: Vec<&Arc<str>> = rules
            .iter()
            .filter(|r| r.limits.iter().any(|l| matches!(l, Limit::Calendar { period: Period::Day, .. })))
            .map(|r| &r.name)
            .collect();
        let mut shown: BTreeMap<Arc<str>, Summary> = BTreeMap::new();
        for shard in self.table.iter() {
            let mut table = lock(shard);
            prune(&mut table, now);
            for e in table.pairs.values() {
                if e.day_end <= now || !day_rules.iter().any(|r| **r == e.rule) {
                    continue; // a day that is over (nothing used today yet), or a rule gone
                }
                let s = shown.entry(e.rule.clone()).or_insert(Summary { ratio: 0.0, runs_out_in: ends_in, out: 0 });
                let limit = e.limit();
                s.ratio = s.ratio.max(used_fraction(limit.saturating_sub(e.remaining), limit));
                let rate = e.total.per_second(now).unwrap_or(0.0);
                if let Some(at) = runs_out_at(e.remaining, rate, now, e.day_end) {
                    s.runs_out_in = s.runs_out_in.min(at - now);
                    s.out += 1;
                }
            }
        }
        let names: Vec<Arc<str>> = shown.keys().cloned().collect();
        for (rule, s) in shown {
            metrics.set_day_forecast(&rule, s.ratio, s.runs_out_in as f64 / 1e6, s.out);
        }
        metrics.keep_day_forecasts(&names, ends_in as f64 / 1e6);
    }

    /// The `n` pairs of today using most of their day quota (by fraction,
    /// then count), whose account contains `containing` (all when empty):
    /// (account, rule state, rule, used, limit). One pass over the pairs,
    /// a shard at a time, keeping `n`.
    pub fn top(&self, n: usize, containing: &str, now: Micros) -> Vec<Top> {
        let mut best: Vec<Top> = Vec::with_capacity(n + 1);
        let finder = memchr::memmem::Finder::new(containing.as_bytes());
        for shard in self.table.iter() {
            let table = lock(shard);
            for ((account, state), e) in &table.pairs {
                if e.day_end <= now || (!containing.is_empty() && finder.find(account.as_bytes()).is_none()) {
                    continue;
                }
                let limit = e.limit();
                let used = limit.saturating_sub(e.remaining);
                let fraction = used_fraction(used, limit);
                let worse = |t: &Top| (t.fraction, t.used) < (fraction, used);
                if best.len() == n && !best.last().is_some_and(worse) {
                    continue;
                }
                let at = best.iter().position(worse).unwrap_or(best.len());
                best.insert(
                    at,
                    Top { account: account.clone(), state: state.clone(), rule: e.rule.clone(), used, limit, fraction },
                );
                best.truncate(n);
            }
        }
        best
    }

    /// How many pairs are kept (for tests).
    pub fn len(&self) -> usize {
        self.table.iter().map(|s| lock(s).pairs.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// When `jobs` queued sends of `caller` on (`account`, `rule`) can all have
/// been sent at the earliest, sharing the day quota with the pair's live
/// calls at their current rate ([`Rates::live`], [`crate::limit::drain`]),
/// from the pair's state read with one `inspect`: (that time, the store's
/// now). `None`: not known (the store did not answer, or the rule's
/// reserve leaves queued sends nothing).
pub async fn drained_at(
    store: &dyn Store,
    forecasts: &Forecasts,
    rule: &Rule,
    account: &str,
    caller: &str,
    jobs: u64,
    offset_us: Micros,
) -> Option<(Micros, Micros)> {
    let key = Key { account, rule, offset_us };
    let snapshot = store.apply(key, Inspect).await.ok()?;
    let live = forecasts.rates(account, &rule.state, snapshot.now).map_or(0.0, |r| r.live());
    let at = crate::limit::drain::drained_at(rule, &snapshot.state, caller, jobs, snapshot.now, offset_us, live)?;
    Some((at, snapshot.now))
}

/// One rule's gauges.
struct Summary {
    ratio: f64,
    runs_out_in: Micros,
    out: u64,
}

/// Drops the pairs idle for [`IDLE_US`]; the next prune when twice as many.
fn prune(table: &mut Table, now: Micros) {
    table.pairs.retain(|_, e| e.total.last() + IDLE_US > now);
    table.prune_at = (table.pairs.len() * 2).max(SHARD_PRUNE_AT_LEAST);
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU64;

    use super::*;

    const S: Micros = 1_000_000;
    const T0: Micros = 1_800_000_000 * S;

    fn rule() -> Rule {
        Rule::new("send", vec![Limit::Calendar { count: NonZeroU64::new(5000).expect("count"), period: Period::Day }])
    }

    fn left(remaining: u64, now: Micros) -> Quota {
        Quota { limit: 0, remaining, reset_us: T0 + 3600 * S - now }
    }

    #[test]
    fn the_rate_is_the_shared_counts_and_queued_sends_are_told_apart() {
        let (f, rule) = (Forecasts::default(), rule());
        // The shared count falls by 3 every second (other instances' calls
        // included), one of them this instance's queued send.
        let mut remaining = 4000;
        f.observe("wx1", &rule, left(remaining, T0), T0, 1, false);
        for k in 1..=600 {
            remaining -= 3;
            f.observe("wx1", &rule, left(remaining, T0 + k * S), T0 + k * S, 1, k % 2 == 0);
        }
        let r = f.rates("wx1", &rule.state, T0 + 600 * S).expect("rates");
        assert!((r.total - 3.0).abs() < 0.01, "{r:?}");
        assert!((r.queued - 0.5).abs() < 0.01, "{r:?}");
        assert!((r.live() - 2.5).abs() < 0.02, "{r:?}");
        assert_eq!(f.rates("wx2", &rule.state, T0 + 600 * S), None);
    }

    #[test]
    fn the_top_pairs_are_the_most_used_of_today_and_a_search_narrows_them() {
        let (f, rule) = (Forecasts::default(), rule());
        for (i, remaining) in [4000, 100, 2500, 4999, 900].into_iter().enumerate() {
            f.observe(&format!("wx{i}"), &rule, left(remaining, T0), T0, 1, false);
        }
        let top = f.top(3, "", T0 + S);
        let shown: Vec<(&str, u64)> = top.iter().map(|t| (t.account.as_str(), t.used)).collect();
        assert_eq!(shown, [("wx1", 4900), ("wx4", 4100), ("wx2", 2500)]);
        assert_eq!(top[0].limit, 5000);
        f.set_limit("wx3", &rule.state, 1000);
        assert_eq!(f.top(1, "", T0 + S)[0].account, "wx1", "4,900 of 5,000 beats 1 of 1,000");
        let found: Vec<String> = f.top(10, "x3", T0 + S).into_iter().map(|t| t.account).collect();
        assert_eq!(found, ["wx3"]);
        assert!(f.top(10, "", T0 + 3600 * S).is_empty(), "a day that is over");
        assert!(f.top(0, "", T0 + S).is_empty());
    }

    #[test]
    fn the_top_of_100_000_pairs_is_what_a_full_sort_gives() {
        let (f, rule) = (Forecasts::default(), rule());
        for i in 0..100_000u64 {
            // Uses spread over 0-4999, many ties.
            let remaining = 5000 - (i * 7919 % 5000);
            f.observe(&format!("wx{i:08}"), &rule, left(remaining, T0), T0, 1, false);
        }
        assert_eq!(f.len(), 100_000);
        let top = f.top(20, "", T0 + S);
        let mut all: Vec<u64> = (0..100_000u64).map(|i| i * 7919 % 5000).collect();
        all.sort_unstable_by(|a, b| b.cmp(a));
        let used: Vec<u64> = top.iter().map(|t| t.used).collect();
        assert_eq!(used, all[..20], "the 20 most used");
        // wx00009999 and wx00099990 to wx00099999.
        let found = f.top(20, "0009999", T0 + S);
        assert_eq!(found.len(), 11, "{found:?}");
        assert!(found.iter().all(|t| t.account.contains("0009999")));
    }

    /// While a pass (top, publish) reads one shard, a call on a pair of
    /// another shard goes on: with one lock over the table it would wait
    /// for the pass (here, on the pass's own thread, forever).
    #[test]
    fn a_call_goes_on_while_a_pass_holds_another_shard() {
        let (f, rule) = (Forecasts::default(), rule());
        let held = lock(f.table.iter().next().expect("a shard"));
        let account = (0..)
            .map(|i| format!("wx{i}"))
            .find(|a| f.table.index(PairRef(a, &rule.state)) != 0)
            .expect("an account of another shard");
        f.observe(&account, &rule, left(10, T0), T0, 1, false);
        assert_eq!(f.rates(&account, &rule.state, T0 + S).map(|r| r.queued), Some(0.0));
        drop(held);
        assert_eq!(f.len(), 1);
    }

    fn gauge(m: &Metrics, name: &str) -> Option<f64> {
        let prefix = format!("{name}{{rule=\"send\"}} ");
        m.encode().lines().find_map(|l| l.strip_prefix(&prefix).and_then(|v| v.parse().ok()))
    }

    #[test]
    fn the_gauges_take_the_highest_fraction_of_the_effective_limit_and_the_soonest_exhaustion() {
        let (f, rule) = (Forecasts::default(), Arc::new(rule()));
        let m = Metrics::new();
        // wx1 has 4,000 of 5,000 left, wx2 1,000, both falling by 10 a
        // second for a minute: 3,400 (32 % used) and 400 (92 %), which wx2
        // spends in 40 s.
        for k in 0..=60 {
            let t = T0 + k * S;
            f.observe("wx1", &rule, left(4000 - 10 * k as u64, t), t, 1, false);
            f.observe("wx2", &rule, left(1000 - 10 * k as u64, t), t, 1, false);
        }
        let now = T0 + 60 * S;
        f.publish(&m, std::slice::from_ref(&rule), 0, now);
        assert_eq!(gauge(&m, "wxgate_quota_day_used_ratio_max"), Some(0.92));
        let soonest = gauge(&m, "wxgate_quota_day_runs_out_in_seconds_min").expect("soonest");
        assert!((soonest - 40.0).abs() < 0.5, "{soonest}");
        assert_eq!(gauge(&m, "wxgate_quota_day_accounts_running_out"), Some(2.0));
        // wx2's effective limit is 1,000 (a learned one): 600 of it used.
        f.set_limit("wx2", &rule.state, 1000);
        f.publish(&m, std::slice::from_ref(&rule), 0, now);
        assert_eq!(gauge(&m, "wxgate_quota_day_used_ratio_max"), Some(0.6), "wx2 at 60 %, wx1 at 32 %");
        // A rule no longer configured loses its gauges.
        f.publish(&m, &[], 0, now);
        assert_eq!(gauge(&m, "wxgate_quota_day_used_ratio_max"), None);
    }

    #[test]
    fn idle_pairs_are_dropped_and_a_month_quota_is_not_forecast() {
        let (f, rule) = (Forecasts::default(), rule());
        // Accounts of the shard "wx-new" will be in, until it is full.
        let shard = f.table.index(PairRef("wx-new", &rule.state));
        let full = |f: &Forecasts| {
            let t = lock(f.table.iter().nth(shard).expect("shard"));
            (t.pairs.len(), t.prune_at.max(SHARD_PRUNE_AT_LEAST))
        };
        let mut i = 0;
        while full(&f).0 < full(&f).1 {
            let account = format!("idle{i}");
            if f.table.index(PairRef(&account, &rule.state)) == shard {
                f.observe(&account, &rule, left(999, T0), T0, 1, false);
            } else if i % 7 == 0 {
                f.observe(&account, &rule, left(999, T0), T0, 1, false); // some in other shards
            }
            i += 1;
            assert!(i < 1_000_000, "the shard filled");
        }
        let later = T0 + IDLE_US;
        f.observe("wx-new", &rule, left(999, later), later, 1, false);
        assert_eq!(full(&f).0, 1, "its shard's idle pairs were dropped when the shard was full");
        assert!(f.len() > 1, "the other shards' are kept until they fill");
        f.publish(&Metrics::new(), &[], 0, later);
        assert_eq!(f.len(), 1, "and every other shard's at a scrape");
        let month =
            Rule::new("m", vec![Limit::Calendar { count: NonZeroU64::new(5).expect("count"), period: Period::Month }]);
        f.observe("wx1", &month, left(4, later), later, 1, false);
        assert_eq!(f.len(), 1);
    }
}
