//! What the simulator counts, per account and path, as pure state over an
//! explicit `now`: sliding windows, daily quotas, calls in flight, and the
//! counters of `/__stats`.
//!
//! Guarantees:
//! - **Sliding windows are exact.** A window `{count N, per W}` admits a call
//!   at `t` only if fewer than N calls were admitted in `(t − W, t]`; so no
//!   half-open interval `[s, s + W)` ever holds more than N admitted calls.
//! - **Daily quotas** count admitted calls in the current day
//!   (`[k·day_length, (k+1)·day_length)` in `quota_timezone`) and start at 0
//!   in the next one.
//! - **A refused call counts against nothing** (no window, quota or slot).
//!   WeChat's docs do not say whether a refused call counts; its `quota/get`
//!   never reports more used than the daily limit, which this matches.
//! - **Worst windows are exact**: the most calls admitted (and arrived) in
//!   any window of the limit's length, from the timestamps kept for the
//!   window. Arrivals keep at most [`MAX_ARRIVALS`] timestamps per account
//!   and window; beyond, `worst_arrivals` is a lower bound.
//! - **An account with limits of its own** (`[[api.account]]`) is held to
//!   those alone on that path, and reported on its own: the path's windows
//!   in `/__stats` are those of the accounts on the path's limits.
//! - Time never runs backwards here: a `now` earlier than one already seen
//!   is taken as that one (a wall clock stepped back changes no count).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use serde::Serialize;

use super::config::{Api, Limits, SimConfig};
use crate::time::Micros;

/// Timestamps of arrivals kept per account and window (8 bytes each).
pub const MAX_ARRIVALS: usize = 1 << 20;
/// Distinct unlisted paths counted one by one in `/__stats`; calls on any
/// further ones are counted under [`OTHER_PATHS`].
pub const MAX_PATHS: usize = 10_000;
pub const OTHER_PATHS: &str = "(other paths)";

/// Why a call was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// 40001: its token is unknown or expired.
    Token,
    /// 45033: the path's calls in flight are at its `concurrency`.
    Concurrency,
    /// 45009: the day's quota is used up.
    Daily,
    /// 45009: a sliding window is full.
    Window,
}

impl Refusal {
    pub fn errcode(self) -> i64 {
        match self {
            Refusal::Token => 40001,
            Refusal::Concurrency => 45033,
            Refusal::Daily | Refusal::Window => 45009,
        }
    }

    /// WeChat's `errmsg` (before its ` rid: ...` suffix).
    pub fn errmsg(self) -> &'static str {
        match self {
            Refusal::Token => "invalid credential, access_token is invalid or not latest",
            Refusal::Concurrency => "api concurrent out of limit",
            Refusal::Daily => "reach max api daily quota limit",
            Refusal::Window => "api freq out of limit",
        }
    }
}

/// One path's state for one account.
#[derive(Default)]
struct Usage {
    /// Per window of the account's limits on the path: times of admitted
    /// calls in the last `per`.
    admitted: Vec<VecDeque<Micros>>,
    /// Per window: times of arrivals in the last `per`.
    arrivals: Vec<VecDeque<Micros>>,
    /// Per window: the most calls admitted, and arrived, in any window of its
    /// length since the last reset.
    worst: Vec<(u64, u64)>,
    /// The day `used` counts in, and the calls admitted in it.
    day: i64,
    used: u64,
    in_flight: u32,
    /// This account's answers on the path since the last reset.
    counts: AccountCounts,
}

impl Usage {
    fn new(limits: &Limits) -> Usage {
        let n = limits.windows.len();
        Usage {
            admitted: vec![VecDeque::new(); n],
            arrivals: vec![VecDeque::new(); n],
            worst: vec![(0, 0); n],
            ..Usage::default()
        }
    }
}

/// One account's answers on one path.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct AccountCounts {
    pub arrivals: u64,
    pub ok: u64,
    /// Every 45009: `45009_day + 45009_window`.
    #[serde(rename = "45009")]
    pub e45009: u64,
    /// 45009 "reach max api daily quota limit": the day quota was used up.
    #[serde(rename = "45009_day")]
    pub e45009_day: u64,
    /// 45009 "api freq out of limit": a sliding window was full.
    #[serde(rename = "45009_window")]
    pub e45009_window: u64,
    #[serde(rename = "45033")]
    pub e45033: u64,
    #[serde(rename = "40001")]
    pub e40001: u64,
}

/// Counters of one path, over all accounts.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Counts {
    pub arrivals: u64,
    pub ok: u64,
    #[serde(rename = "45009")]
    pub e45009: u64,
    #[serde(rename = "45033")]
    pub e45033: u64,
    #[serde(rename = "40001")]
    pub e40001: u64,
    /// Other errors the sim answered (a missing appid, malformed JSON...).
    pub other: u64,
}

impl Counts {
    fn add(&mut self, o: &Counts) {
        self.arrivals += o.arrivals;
        self.ok += o.ok;
        self.e45009 += o.e45009;
        self.e45033 += o.e45033;
        self.e40001 += o.e40001;
        self.other += o.other;
    }
}

#[derive(Default)]
struct PathStats {
    counts: Counts,
    in_flight: u32,
    max_in_flight: u32,
}

/// Everything the simulator counts. Serve it behind one lock.
pub struct Scoreboard {
    config: Arc<SimConfig>,
    index: HashMap<String, usize>,
    accounts: HashMap<String, Vec<Usage>>,
    paths: HashMap<String, PathStats>,
    latest: Micros,
}

impl Scoreboard {
    pub fn new(config: Arc<SimConfig>) -> Scoreboard {
        let index = config.apis.iter().enumerate().map(|(i, a)| (a.path.clone(), i)).collect();
        let mut scoreboard =
            Scoreboard { config, index, accounts: HashMap::new(), paths: HashMap::new(), latest: Micros::MIN };
        scoreboard.reset();
        scoreboard
    }

    /// The listed API of `path`, if any.
    pub fn api(&self, path: &str) -> Option<&Api> {
        self.index.get(path).map(|&i| &self.config.apis[i])
    }

    /// The day containing `now`, and when it ends.
    pub fn day(&self, now: Micros) -> (i64, Micros) {
        let len = self.config.day_length_us;
        let day = (now + self.config.offset_us).div_euclid(len);
        (day, (day + 1) * len - self.config.offset_us)
    }

    fn tick(&mut self, now: Micros) -> Micros {
        self.latest = self.latest.max(now);
        self.latest
    }

    /// Decides a call of `account` on `path` at `now` and counts it. A call
    /// whose token was refused (`token_ok` false) is counted as a 40001. An
    /// admitted call is in flight until [`Scoreboard::finish`].
    pub fn admit(&mut self, account: &str, path: &str, token_ok: bool, now: Micros) -> Result<(), Refusal> {
        let now = self.tick(now);
        let (today, _) = self.day(now);
        let key = self.path_key(path);
        let listed = self.index.get(path).copied();
        let verdict = match listed {
            None if token_ok => Ok(()),
            None => Err(Refusal::Token),
            Some(i) => {
                let api = &self.config.apis[i];
                let limits = api.limits_of(account);
                let usage = usage(&mut self.accounts, &self.config, account, i);
                // Every arrival enters the arrival windows, whatever its answer.
                for (w, times) in limits.windows.iter().zip(usage.arrivals.iter_mut()) {
                    if times.len() == MAX_ARRIVALS {
                        times.pop_front();
                    }
                    times.push_back(now);
                    while times.front().is_some_and(|&t| t <= now - w.per_us) {
                        times.pop_front();
                    }
                }
                for (worst, times) in usage.worst.iter_mut().zip(&usage.arrivals) {
                    worst.1 = worst.1.max(times.len() as u64);
                }
                let verdict = decide(api, limits, usage, token_ok, today, now);
                let c = &mut usage.counts;
                c.arrivals += 1;
                match verdict {
                    Ok(()) => {
                        c.ok += 1;
                        for (worst, times) in usage.worst.iter_mut().zip(&usage.admitted) {
                            worst.0 = worst.0.max(times.len() as u64);
                        }
                    }
                    Err(Refusal::Token) => c.e40001 += 1,
                    Err(Refusal::Concurrency) => c.e45033 += 1,
                    Err(Refusal::Daily) => (c.e45009, c.e45009_day) = (c.e45009 + 1, c.e45009_day + 1),
                    Err(Refusal::Window) => (c.e45009, c.e45009_window) = (c.e45009 + 1, c.e45009_window + 1),
                }
                verdict
            }
        };
        let stats = self.paths.entry(key).or_default();
        stats.counts.arrivals += 1;
        match verdict {
            Ok(()) => {
                stats.counts.ok += 1;
                stats.in_flight += 1;
                stats.max_in_flight = stats.max_in_flight.max(stats.in_flight);
            }
            Err(Refusal::Token) => stats.counts.e40001 += 1,
            Err(Refusal::Concurrency) => stats.counts.e45033 += 1,
            Err(Refusal::Daily | Refusal::Window) => stats.counts.e45009 += 1,
        }
        verdict
    }

    /// An admitted call of `account` on `path` has been answered.
    pub fn finish(&mut self, account: &str, path: &str) {
        if let Some(&i) = self.index.get(path) {
            if let Some(u) = self.accounts.get_mut(account).and_then(|a| a.get_mut(i)) {
                u.in_flight = u.in_flight.saturating_sub(1);
            }
        }
        let key = self.path_key(path);
        if let Some(s) = self.paths.get_mut(&key) {
            s.in_flight = s.in_flight.saturating_sub(1);
        }
    }

    /// A call the sim answered with an error of its own (missing appid,
    /// malformed body...): counted as arrived, against no limit.
    pub fn other(&mut self, path: &str) {
        let key = self.path_key(path);
        let s = self.paths.entry(key).or_default();
        s.counts.arrivals += 1;
        s.counts.other += 1;
    }

    /// `quota/get` of `account` on `path`: its daily limit (its own, else
    /// the path's) and the calls admitted today (`None` if `path` has no
    /// daily quota for it).
    pub fn quota(&mut self, account: &str, path: &str, now: Micros) -> Option<(u64, u64)> {
        let now = self.tick(now);
        let (today, _) = self.day(now);
        let &i = self.index.get(path)?;
        let limit = self.config.apis[i].limits_of(account).daily?;
        let used = self.accounts.get(account).and_then(|a| a.get(i)).filter(|u| u.day == today).map_or(0, |u| u.used);
        Some((limit, used))
    }

    /// `clear_quota`: every daily count and sliding window of `account` starts
    /// again at 0 (as WeChat resets all counters of the account).
    pub fn clear(&mut self, account: &str) {
        for u in self.accounts.get_mut(account).into_iter().flatten() {
            u.used = 0;
            u.admitted.iter_mut().for_each(VecDeque::clear);
        }
    }

    /// `POST /__reset`: counters, worst windows and every account's limits
    /// start again; calls in flight stay in flight.
    pub fn reset(&mut self) {
        for (account, usage) in self.accounts.iter_mut() {
            for (u, api) in usage.iter_mut().zip(&self.config.apis) {
                *u = Usage { in_flight: u.in_flight, ..Usage::new(api.limits_of(account)) };
            }
        }
        let mut paths = HashMap::new();
        for api in &self.config.apis {
            let in_flight = self.paths.get(&api.path).map_or(0, |s| s.in_flight);
            let stats = PathStats { in_flight, ..PathStats::default() };
            paths.insert(api.path.clone(), stats);
        }
        for (path, s) in &self.paths {
            if s.in_flight > 0 && !paths.contains_key(path) {
                paths.insert(path.clone(), PathStats { in_flight: s.in_flight, ..PathStats::default() });
            }
        }
        self.paths = paths;
    }

    /// The `/__stats` report at `now`.
    pub fn stats(&mut self, now: Micros) -> Stats {
        let now = self.tick(now);
        let (today, ends) = self.day(now);
        let mut totals = Counts::default();
        let mut paths = BTreeMap::new();
        for (path, s) in &self.paths {
            totals.add(&s.counts);
            let mut report = PathReport {
                counts: s.counts.clone(),
                in_flight: s.in_flight,
                max_in_flight: s.max_in_flight,
                windows: Vec::new(),
                day: None,
                accounts: BTreeMap::new(),
            };
            if let Some(&i) = self.index.get(path) {
                let api = &self.config.apis[i];
                // The path's windows: the worst of the accounts on its limits.
                let mut worst = vec![(0, 0); api.limits.windows.len()];
                for (account, usage) in &self.accounts {
                    let Some(u) = usage.get(i).filter(|_| !api.has_own(account)) else { continue };
                    for (w, &(admitted, arrived)) in worst.iter_mut().zip(&u.worst) {
                        *w = (w.0.max(admitted), w.1.max(arrived));
                    }
                }
                report.windows = window_reports(&api.limits, &worst);
                // Each account that called the path since the reset, and each
                // with limits of its own.
                for (account, usage) in &self.accounts {
                    let Some(u) = usage.get(i).filter(|u| u.counts.arrivals > 0 || api.has_own(account)) else {
                        continue;
                    };
                    let limits = api.limits_of(account);
                    let used = if u.day == today { u.used } else { 0 };
                    report.accounts.insert(
                        account.clone(),
                        AccountReport {
                            counts: u.counts.clone(),
                            own_limits: api.has_own(account),
                            windows: window_reports(limits, &u.worst),
                            day: limits.daily.map(|daily_limit| AccountDay { daily_limit, used }),
                        },
                    );
                }
                for account in api.accounts.keys() {
                    if report.accounts.contains_key(account) {
                        continue;
                    }
                    let limits = api.limits_of(account);
                    report.accounts.insert(
                        account.clone(),
                        AccountReport {
                            counts: AccountCounts::default(),
                            own_limits: true,
                            windows: window_reports(limits, &vec![(0, 0); limits.windows.len()]),
                            day: limits.daily.map(|daily_limit| AccountDay { daily_limit, used: 0 }),
                        },
                    );
                }
                if let Some(daily_limit) = api.limits.daily {
                    let used = self
                        .accounts
                        .iter()
                        .filter_map(|(a, u)| u.get(i).filter(|u| u.day == today && u.used > 0).map(|u| (a, u.used)))
                        .map(|(a, n)| (a.clone(), n))
                        .collect();
                    report.day = Some(DayReport { daily_limit, used });
                }
            }
            paths.insert(path.clone(), report);
        }
        Stats { day_length_ms: self.config.day_length_us / 1000, day_ends_in_ms: (ends - now) / 1000, totals, paths }
    }

    fn path_key(&self, path: &str) -> String {
        if self.paths.contains_key(path) || self.paths.len() < MAX_PATHS + self.config.apis.len() {
            path.to_owned()
        } else {
            OTHER_PATHS.to_owned()
        }
    }
}

/// The usage of account `account` on listed API `i`, created on first use.
fn usage<'m>(
    accounts: &'m mut HashMap<String, Vec<Usage>>,
    config: &SimConfig,
    account: &str,
    i: usize,
) -> &'m mut Usage {
    if !accounts.contains_key(account) {
        let fresh = config.apis.iter().map(|a| Usage::new(a.limits_of(account))).collect();
        accounts.insert(account.to_owned(), fresh);
    }
    match accounts.get_mut(account) {
        Some(a) => &mut a[i],
        None => unreachable!("inserted above"),
    }
}

/// The reports of `limits`' windows, with their worst counts.
fn window_reports(limits: &Limits, worst: &[(u64, u64)]) -> Vec<WindowReport> {
    limits
        .windows
        .iter()
        .zip(worst)
        .map(|(w, &(admitted, arrived))| WindowReport {
            limit: w.label(),
            count: w.count,
            per_ms: w.per_us / 1000,
            worst_admitted: admitted,
            worst_arrivals: arrived,
        })
        .collect()
}

/// Checks, in WeChat's order of what a caller would be told: token,
/// concurrency, the day's quota, then each window of the account's
/// `limits`. Debits only when every check passes.
fn decide(api: &Api, limits: &Limits, u: &mut Usage, token_ok: bool, today: i64, now: Micros) -> Result<(), Refusal> {
    if !token_ok {
        return Err(Refusal::Token);
    }
    if api.concurrency.is_some_and(|cap| u.in_flight >= cap) {
        return Err(Refusal::Concurrency);
    }
    if u.day != today {
        u.day = today;
        u.used = 0;
    }
    if limits.daily.is_some_and(|limit| u.used >= limit) {
        return Err(Refusal::Daily);
    }
    for (w, times) in limits.windows.iter().zip(u.admitted.iter_mut()) {
        while times.front().is_some_and(|&t| t <= now - w.per_us) {
            times.pop_front();
        }
        if times.len() as u64 >= w.count {
            return Err(Refusal::Window);
        }
    }
    for times in &mut u.admitted {
        times.push_back(now);
    }
    u.used += 1;
    u.in_flight += 1;
    Ok(())
}

/// `GET /__stats`.
#[derive(Debug, Serialize)]
pub struct Stats {
    pub day_length_ms: Micros,
    /// Until the daily quotas start again.
    pub day_ends_in_ms: Micros,
    pub totals: Counts,
    pub paths: BTreeMap<String, PathReport>,
}

#[derive(Debug, Serialize)]
pub struct PathReport {
    #[serde(flatten)]
    pub counts: Counts,
    pub in_flight: u32,
    pub max_in_flight: u32,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub windows: Vec<WindowReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub day: Option<DayReport>,
    /// Per account that called the path since the last reset, and per
    /// account with limits of its own.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub accounts: BTreeMap<String, AccountReport>,
}

/// One account on one path: its answers, its limits (its own or the
/// path's) with its busiest windows, and its day.
#[derive(Debug, Serialize)]
pub struct AccountReport {
    #[serde(flatten)]
    pub counts: AccountCounts,
    /// Whether it has limits of its own (`[[api.account]]`).
    pub own_limits: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub windows: Vec<WindowReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub day: Option<AccountDay>,
}

/// An account's day quota on a path: what `quota/get` answers it.
#[derive(Debug, Serialize)]
pub struct AccountDay {
    pub daily_limit: u64,
    pub used: u64,
}

/// One sliding window of a path: the most calls any one account had in any
/// window of its length.
#[derive(Debug, Serialize)]
pub struct WindowReport {
    pub limit: String,
    pub count: u64,
    pub per_ms: Micros,
    pub worst_admitted: u64,
    pub worst_arrivals: u64,
}

/// A path's daily quota: calls admitted today, per account that made any.
#[derive(Debug, Serialize)]
pub struct DayReport {
    pub daily_limit: u64,
    pub used: BTreeMap<String, u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Micros = 1_000_000;

    fn scoreboard(text: &str) -> Scoreboard {
        Scoreboard::new(Arc::new(SimConfig::parse(text, "sim.toml").expect("config")))
    }

    const WINDOW: &str = "[[api]]\npath = \"/w\"\nlimits = [{ count = 3, per = \"10s\" }]\n";

    #[test]
    fn a_window_admits_its_count_and_slides_exactly() {
        let mut m = scoreboard(WINDOW);
        let t = 1_000 * S;
        for at in [t, t + S, t + 2 * S] {
            assert_eq!(m.admit("a", "/w", true, at), Ok(()));
            m.finish("a", "/w");
        }
        assert_eq!(m.admit("a", "/w", true, t + 10 * S - 1), Err(Refusal::Window));
        assert_eq!(m.admit("b", "/w", true, t + 10 * S - 1), Ok(()), "another account has its own window");
        assert_eq!(m.admit("a", "/w", true, t + 10 * S), Ok(()), "the first call left the window");
        assert_eq!(m.admit("a", "/w", true, t + 10 * S), Err(Refusal::Window));
        let s = m.stats(t + 10 * S);
        let p = &s.paths["/w"];
        assert_eq!((p.counts.arrivals, p.counts.ok, p.counts.e45009), (7, 5, 2));
        assert_eq!((p.windows[0].worst_admitted, p.windows[0].worst_arrivals), (3, 5), "a had 5 arrivals in (t, t+10]");
    }

    #[test]
    fn a_day_quota_resets_with_the_short_day() {
        let mut m =
            scoreboard("[sim]\nday_length = \"1m\"\n[[api]]\npath = \"/d\"\nlimits = [{ count = 2, per = \"day\" }]\n");
        let start = 1_000 * 60 * S - 8 * 3600 * S; // a day boundary at +08:00
        assert_eq!(m.day(start).1, start + 60 * S);
        assert_eq!(m.admit("a", "/d", true, start), Ok(()));
        assert_eq!(m.admit("a", "/d", true, start + 1), Ok(()));
        assert_eq!(m.admit("a", "/d", true, start + 60 * S - 1), Err(Refusal::Daily));
        assert_eq!(m.quota("a", "/d", start + 60 * S - 1), Some((2, 2)));
        assert_eq!(m.quota("a", "/d", start + 60 * S), Some((2, 0)));
        assert_eq!(m.admit("a", "/d", true, start + 60 * S), Ok(()));
    }

    #[test]
    fn refused_calls_take_nothing_and_time_never_runs_back() {
        let mut m = scoreboard("[[api]]\npath = \"/c\"\nlimits = [{ count = 1, per = \"day\" }]\nconcurrency = 1\n");
        assert_eq!(m.admit("a", "/c", false, 10 * S), Err(Refusal::Token));
        assert_eq!(m.admit("a", "/c", true, 10 * S), Ok(()));
        assert_eq!(m.admit("a", "/c", true, 10 * S), Err(Refusal::Concurrency));
        m.finish("a", "/c");
        assert_eq!(m.admit("a", "/c", true, 5 * S), Err(Refusal::Daily), "5s is taken as 10s");
        m.clear("a");
        assert_eq!(m.admit("a", "/c", true, 10 * S), Ok(()));
        let s = m.stats(10 * S);
        assert_eq!(s.totals, Counts { arrivals: 5, ok: 2, e45009: 1, e45033: 1, e40001: 1, other: 0 });
        m.reset();
        assert_eq!(m.stats(10 * S).paths["/c"].in_flight, 1, "a call in flight stays in flight");
        assert_eq!(m.stats(10 * S).totals, Counts::default());
    }
}
