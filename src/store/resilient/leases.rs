//! Quota leases held by this instance (`[store] quota_leases`): for a pair
//! it calls often, a slice of the pair's limits taken from Redis in one
//! script run ([`crate::limit::lease`]) and spent in-process, call by call,
//! with no round trip.
//!
//! - A pair is leased once this instance made `[store] quota_lease_calls`
//!   calls of it within a second (default [`HOT_CALLS`]); the lease wanted is what this instance called in
//!   the last second over the span (at least 2), which the take caps at
//!   the burst and at what is left of each calendar quota. The span is
//!   `[store] quota_lease_span`, at most half a window's tolerance
//!   ([`Leases::span_for`]).
//! - A unit is spent only before the lease's end in this instance's clock:
//!   the take's send time plus the lease's span (Redis's clock read the
//!   take after it was sent, so the unit goes before the lease ends in
//!   store time too).
//! - A call that finds the lease spent or over takes the next one itself
//!   (one round trip, as a decision per call costs); while a take is in
//!   flight, calls of the pair are decided per call. Only then: a
//!   `clear_quota` keeps counted only each instance's last lease of a pair
//!   ([`crate::limit::lease`]), which must be the only one it may still
//!   spend from. A take that grants
//!   nothing (the pair is at its limit) leaves the pair to per-call
//!   decisions for [`COLD_US`].
//! - What a lease did not spend by its end is given back by the keeper
//!   ([`Leases::due_returns`]); a lease the rules were reloaded under or
//!   the account was cleared under too. A penalty (or a lower limit) drops
//!   the pair's lease at once: its units are not given back (WeChat's
//!   answer may concern them), and stay counted, the safe side.
//! - A penalty another instance saw ends this one's lease of the pair at
//!   the keeper's next tick (every 100 ms it reads the penalty of each pair
//!   it holds a lease of, in one pipeline), or at its next take, whichever
//!   comes first.
//!
//! **Reserves** (`[store] quota_reserve`, a duration R; [`crate::limit::lease`]
//! "Reserves"): for every pair with a calendar quota this instance called
//! at least [`RESERVE_CALLS`] times within the last R (among the
//! [`MAX_PAIRS`] it tracks), it holds a reserve of that quota, taken by the keeper
//! ([`Leases::reserves_wanted`], at most [`RESERVE_TAKES`] a second): as many
//! units as it called in the last R (the larger of the current and the
//! previous R-long bucket), at most half of what is left (the take caps it).
//! The units are counted in Redis when taken, so while Redis answers they
//! cost nothing but room, and through an outage the instance spends them
//! ([`Leases::spend_reserve`]) with the windows decided by its own share:
//! exactly what was reserved, and no more, goes. Given back: when the pair
//! was not called for two buckets (it is forgotten), on a reload, and at
//! once when Redis refuses a call of the pair for its calendar quota
//! ([`Leases::give_back_reserve`]: the call is decided again, and the pair
//! takes no reserve again before the period ends). A reserve spent below
//! half of what the pair now wants is given back and taken anew.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use prometheus_client::metrics::counter::Counter;

use crate::limit::lease::{has_calendar, supports, Leased};
use crate::limit::{Ask, Decision, Key, Quota, Rule};
use crate::time::Micros;

/// Calls within a second that make a pair worth a lease, by default.
pub const HOT_CALLS: u32 = 4;
/// How long a pair a take granted nothing to is decided per call.
pub const COLD_US: Micros = 1_000_000;
/// At most this many pairs are tracked (the rest are decided per call, and
/// hold no reserve: through an outage their calendar quotas refuse). About
/// 150 bytes each, 300 with a reserve; the keeper passes over them every
/// tick.
pub const MAX_PAIRS: usize = 10_000;
/// Calls within the last `quota_reserve` that make a pair worth a reserve:
/// its take and its return are two script runs, paid back by the calls
/// (a pair called once in a while, among many accounts, stays without).
pub const RESERVE_CALLS: u32 = 4;
/// A pair unused this long is forgotten (its lease, if any, given back);
/// one with a reserve after two of its buckets.
const IDLE_US: Micros = 10_000_000;
/// The shortest span worth a lease (`[store] quota_lease_span`'s least).
const MIN_SPAN_US: Micros = 10_000;
/// Reserves the keeper takes at most in one tick (each one script run).
pub const RESERVE_TAKES: usize = 256;

/// Units of leases, counted (`wxgate_quota_lease_units_total{what}`).
#[derive(Clone, Default)]
pub struct LeaseCounters {
    pub taken: Counter,
    pub spent: Counter,
    pub returned: Counter,
    /// Unspent, with nothing to give back when the return ran (the lease's
    /// window slots or its period had passed).
    pub expired: Counter,
    /// Dropped unspent without being given back (a penalty, a lower limit,
    /// a return Redis did not answer).
    pub dropped: Counter,
    /// Units taken into reserves, and spent from them (through an outage).
    pub reserved: Counter,
    pub reserve_spent: Counter,
}

/// A lease this instance holds.
struct Held {
    lease: Leased,
    left: u64,
    /// Local time the take was sent, and the lease's end in local time.
    sent: Micros,
    deadline: Micros,
    /// The rule it was taken under (to give it back by).
    rule: Arc<Rule>,
    offset_us: Micros,
}

/// A reserve this instance holds: spent only while Redis cannot answer.
struct Reserve {
    lease: Leased,
    left: u64,
    /// What the pair wanted when it was taken (the take may grant less:
    /// at most half of what was left).
    wanted: u64,
    /// The reserve's end in local time (as [`Held::deadline`]).
    deadline: Micros,
    rule: Arc<Rule>,
    offset_us: Micros,
}

#[derive(Default)]
struct Pair {
    /// Calls in the current second (from `second`), and in the one before.
    second: Micros,
    calls: u32,
    before: u32,
    last_call: Micros,
    held: Option<Box<Held>>,
    taking: bool,
    cold_until: Micros,
    /// Calls in the current reserve bucket (`quota_reserve` long, from
    /// `bucket`), and in the one before.
    bucket: Micros,
    bucket_calls: u32,
    bucket_before: u32,
    /// The rule and offset of its calls, for the keeper's takes (a pair
    /// with a calendar quota, reserves on).
    rule: Option<(Arc<Rule>, Micros)>,
    reserve: Option<Box<Reserve>>,
    reserving: bool,
    no_reserve_until: Micros,
    /// Takes in a row that granted nothing (each waits twice as long).
    reserve_misses: u8,
}

impl Pair {
    /// Calls in the last reserve bucket or the current one, at `now`.
    fn recent(&mut self, bucket_us: Micros, now: Micros) -> u32 {
        roll(&mut self.bucket, &mut self.bucket_calls, &mut self.bucket_before, bucket_us, now);
        self.bucket_calls.max(self.bucket_before)
    }
}

/// Moves a two-bucket counter (`start`, `calls`, `before`) to `now`.
fn roll(start: &mut Micros, calls: &mut u32, before: &mut u32, len: Micros, now: Micros) {
    if now - *start >= len {
        *before = if now - *start >= 2 * len { 0 } else { *calls };
        *start = now;
        *calls = 0;
    }
}

/// What a call of a pair does ([`Leases::spend`]). A lease is taken
/// leaving the rule's reserve (whoever takes it), so that any call may
/// spend it; a high-priority call that needs the reserve finds the take
/// granting nothing and goes per call.
pub enum Spend {
    /// Admitted from the held lease.
    Admit(Decision),
    /// Take a lease of this many units first (this call is the taker).
    Take(u64),
    /// Decide per call.
    PerCall,
}

/// A lease to give back: its pair and what it did not spend.
pub struct Return {
    pub account: Arc<str>,
    pub rule: Arc<Rule>,
    pub offset_us: Micros,
    pub lease: Leased,
    pub unspent: u64,
    /// A reserve's (its record is the reserve's).
    pub reserve: bool,
}

/// A reserve the keeper is to take ([`Leases::reserves_wanted`]).
pub struct ReserveTake {
    pub account: Arc<str>,
    pub rule: Arc<Rule>,
    pub offset_us: Micros,
    pub want: u64,
}

impl ReserveTake {
    /// Its pair.
    pub fn key(&self) -> Key<'_> {
        Key { account: &self.account, rule: &self.rule, offset_us: self.offset_us }
    }
}

/// Pairs by account, then by rule state (looked up by `&str`: no
/// allocation per call), and how many there are.
#[derive(Default)]
struct Pairs {
    by_account: HashMap<Arc<str>, HashMap<Arc<str>, Pair>>,
    len: usize,
    /// Each rule state's rule, shared by its pairs (for reserves).
    rules: HashMap<Arc<str>, Arc<Rule>>,
}

impl Pairs {
    fn get_mut(&mut self, key: Key<'_>) -> Option<&mut Pair> {
        self.by_account.get_mut(key.account)?.get_mut(&*key.rule.state)
    }
}

pub struct Leases {
    /// Leases of hot pairs (`[store] quota_leases`), and their longest span.
    leasing: bool,
    span_us: Micros,
    /// Calls within a second that make a pair worth a lease.
    hot_calls: u32,
    /// `[store] quota_reserve` (0: no reserves).
    reserve_us: Micros,
    pairs: Mutex<Pairs>,
    returns: Mutex<Vec<Return>>,
    pub counters: LeaseCounters,
}

impl Leases {
    /// Leases of hot pairs when `span_us` is given; reserves when
    /// `reserve_us` is more than 0.
    pub fn new(span_us: Option<Micros>, hot_calls: u32, reserve_us: Micros, counters: LeaseCounters) -> Leases {
        Leases {
            leasing: span_us.is_some(),
            span_us: span_us.unwrap_or(0),
            hot_calls: hot_calls.max(1),
            reserve_us: reserve_us.max(0),
            pairs: Mutex::default(),
            returns: Mutex::default(),
            counters,
        }
    }

    /// Whether this instance holds reserves (`[store] quota_reserve`).
    pub fn reserves(&self) -> bool {
        self.reserve_us > 0
    }

    /// Whether calls of `rule` are worth noting for a reserve.
    pub fn reserves_for(&self, rule: &Rule) -> bool {
        self.reserves() && has_calendar(rule)
    }

    /// The span of a lease of `rule`: `[store] quota_lease_span`, at most
    /// half the smallest tolerance of its windows (a lease's slots lie
    /// between its end and the tolerance: half for each leaves room for
    /// as many units as the span needs at the full rate).
    pub fn span_for(&self, rule: &Rule) -> Micros {
        rule.limits
            .iter()
            .filter_map(|l| match l {
                crate::limit::Limit::Window(w) => Some(w.tolerance_us() / 2),
                crate::limit::Limit::Calendar { .. } => None,
            })
            .fold(self.span_us, Micros::min)
    }

    /// Whether `ask` may be decided from a lease at all: not when a window
    /// of its rule leaves a lease no time to be spent in (a burst of one has
    /// no tolerance: a lease would end as it is taken, and its slot, booked
    /// until the keeper gave it back, would turn the next calls away).
    pub fn leasable(&self, ask: &Ask<'_>) -> bool {
        self.leasing
            && ask.cost == 1
            && ask.recipients.is_empty()
            && supports(ask.key.rule)
            && self.span_for(ask.key.rule) >= MIN_SPAN_US
    }

    /// The pair of `key`, tracked from now on if there is room.
    fn track<'p>(&self, pairs: &'p mut Pairs, key: Key<'_>, now: Micros) -> Option<&'p mut Pair> {
        if pairs.get_mut(key).is_none() {
            if pairs.len >= MAX_PAIRS {
                return None;
            }
            pairs.len += 1;
            let rule = self.reserves_for(key.rule).then(|| {
                let rule = pairs.rules.entry(key.rule.state.clone()).or_insert_with(|| Arc::new(key.rule.clone()));
                (rule.clone(), key.offset_us)
            });
            let pair = Pair { rule, bucket: now, ..Pair::default() };
            pairs.by_account.entry(key.account.into()).or_default().insert(key.rule.state.clone(), pair);
        }
        let pair = pairs.get_mut(key)?;
        if self.reserve_us > 0 {
            roll(&mut pair.bucket, &mut pair.bucket_calls, &mut pair.bucket_before, self.reserve_us, now);
            pair.bucket_calls = pair.bucket_calls.saturating_add(1);
        }
        pair.last_call = now;
        Some(pair)
    }

    /// A call of `key`'s pair that no lease decides, at local `now`: noted
    /// for the pair's reserve ([`Leases::reserves_for`] its rule).
    pub fn note(&self, key: Key<'_>, now: Micros) {
        let mut pairs = lock(&self.pairs);
        let _ = self.track(&mut pairs, key, now);
    }

    /// A call of `ask`'s pair at local time `now`: spent from the held
    /// lease, or the lease to take, or per call.
    pub fn spend(&self, ask: &Ask<'_>, now: Micros) -> Spend {
        let key = ask.key;
        let mut guard = lock(&self.pairs);
        let Some(pair) = self.track(&mut guard, key, now) else { return Spend::PerCall };
        if now - pair.second >= 1_000_000 {
            pair.before = if now - pair.second >= 2_000_000 { 0 } else { pair.calls };
            pair.second = now;
            pair.calls = 0;
        }
        pair.calls = pair.calls.saturating_add(1);
        if let Some(h) = pair.held.as_mut() {
            if h.left > 0 && now < h.deadline {
                h.left -= 1;
                self.counters.spent.inc();
                return Spend::Admit(admitted(h, now));
            }
        }
        if pair.taking || now < pair.cold_until || pair.calls.max(pair.before) < self.hot_calls {
            return Spend::PerCall;
        }
        // Spent or over: give back what is left and take the next.
        if let Some(h) = pair.held.take() {
            self.give_back(key.account, *h);
        }
        pair.taking = true;
        let rate = u64::from(pair.calls.max(pair.before));
        let span = self.span_for(key.rule).max(0) as u64;
        Spend::Take((rate * span).div_ceil(1_000_000).max(2))
    }

    /// The take of `key`'s pair sent at local `sent` answered `leased` (or
    /// failed: `None`) at local `now`. Returns the decision of the taking
    /// call when the lease holds a unit for it.
    pub fn taken(&self, key: Key<'_>, leased: Option<Leased>, sent: Micros, now: Micros) -> Option<Decision> {
        let mut pairs = lock(&self.pairs);
        let Some(pair) = pairs.get_mut(key) else {
            self.give_back_whole(key, leased, false);
            return None;
        };
        pair.taking = false;
        let lease = match leased {
            Some(l) if l.units > 0 => l,
            Some(_) => {
                pair.cold_until = now + COLD_US;
                return None;
            }
            None => return None,
        };
        self.counters.taken.inc_by(lease.units);
        let deadline = sent + (lease.until - lease.at);
        if now >= deadline {
            let unspent = lease.units;
            self.queue(key.account, Arc::new(key.rule.clone()), key.offset_us, lease, unspent, false);
            return None;
        }
        self.counters.spent.inc();
        let left = lease.units - 1;
        let held = Held { lease, left, sent, deadline, rule: Arc::new(key.rule.clone()), offset_us: key.offset_us };
        let decision = admitted(&held, now);
        pair.held = Some(Box::new(held));
        Some(decision)
    }

    /// The call taking `key`'s lease was dropped before the take answered
    /// (its client left): the pair may be leased again. Units the take's
    /// script may have booked are never spent: they stay counted (at most
    /// one lease's, the safe side).
    pub fn abandoned(&self, key: Key<'_>) {
        if let Some(pair) = lock(&self.pairs).get_mut(key) {
            pair.taking = false;
        }
    }

    /// Drops the lease of `key`'s pair without giving it back (a penalty,
    /// a lower limit): its units stay counted.
    pub fn drop_pair(&self, key: Key<'_>) {
        let mut pairs = lock(&self.pairs);
        if let Some(pair) = pairs.get_mut(key) {
            if let Some(h) = pair.held.take() {
                self.counters.dropped.inc_by(h.left);
            }
        }
    }

    /// The reserves to take now (at most `max`): of each tracked pair with a
    /// calendar quota called within the last two buckets that holds none
    /// (or holds one spent below half of what it wants now: given back
    /// first, by the keeper's next returns).
    pub fn reserves_wanted(&self, now: Micros, max: usize) -> Vec<ReserveTake> {
        let mut wanted = Vec::new();
        if self.reserve_us == 0 {
            return wanted;
        }
        let mut pairs = lock(&self.pairs);
        let mut spent = Vec::new();
        'accounts: for (account, states) in pairs.by_account.iter_mut() {
            for pair in states.values_mut() {
                if wanted.len() >= max {
                    break 'accounts;
                }
                let Some((rule, offset_us)) = pair.rule.clone() else { continue };
                if pair.reserving || now < pair.no_reserve_until {
                    continue;
                }
                let want = u64::from(pair.recent(self.reserve_us, now));
                if want < u64::from(RESERVE_CALLS) {
                    continue;
                }
                // Taken anew once the pace doubled since, or an outage spent
                // half of it; never because the take granted less than wanted.
                match &pair.reserve {
                    Some(r) if now < r.deadline && want < 2 * r.wanted && r.left * 2 >= r.lease.units => continue,
                    Some(_) => {
                        if let Some(r) = pair.reserve.take() {
                            spent.push((account.clone(), r));
                        }
                    }
                    None => {}
                }
                pair.reserving = true;
                wanted.push(ReserveTake { account: account.clone(), rule, offset_us, want });
            }
        }
        drop(pairs);
        for (account, r) in spent {
            self.give_back_kept(&account, *r);
        }
        wanted
    }

    /// The reserve of `key`'s pair the keeper sent at local `sent` was
    /// answered `leased` (`None`: not answered) at local `now`.
    pub fn reserve_taken(&self, t: &ReserveTake, leased: Option<Leased>, sent: Micros, now: Micros) {
        let key = t.key();
        let mut pairs = lock(&self.pairs);
        let Some(pair) = pairs.get_mut(key) else {
            self.give_back_whole(key, leased, true);
            return;
        };
        pair.reserving = false;
        match leased {
            Some(lease) if lease.units > 0 => {
                pair.reserve_misses = 0;
                self.counters.reserved.inc_by(lease.units);
                let deadline = sent + (lease.until - lease.at);
                let rule = pair.rule.as_ref().map_or_else(|| Arc::new(key.rule.clone()), |(r, _)| r.clone());
                let left = lease.units;
                let wanted = t.want;
                pair.reserve =
                    Some(Box::new(Reserve { lease, left, wanted, deadline, rule, offset_us: key.offset_us }));
            }
            // Nothing left to reserve (leases out may hold it for a
            // moment), or Redis did not answer: try again in a second, then
            // twice as long each time, at most a bucket later.
            _ => {
                let wait = COLD_US.saturating_mul(1 << pair.reserve_misses.min(12)).min(self.reserve_us);
                pair.reserve_misses = pair.reserve_misses.saturating_add(1);
                pair.no_reserve_until = now + wait;
            }
        }
    }

    /// Spends `cost` units of the reserve of `key`'s pair at local `now`
    /// (Redis cannot answer): whether it held them.
    pub fn spend_reserve(&self, key: Key<'_>, cost: u64, now: Micros) -> bool {
        let mut pairs = lock(&self.pairs);
        let Some(pair) = self.track(&mut pairs, key, now) else { return false };
        match pair.reserve.as_mut() {
            Some(r) if now < r.deadline && r.left >= cost => {
                r.left -= cost;
                true
            }
            _ => false,
        }
    }

    /// Puts back `cost` units [`Leases::spend_reserve`] took for a call its
    /// windows then refused.
    pub fn unspend_reserve(&self, key: Key<'_>, cost: u64) {
        let mut pairs = lock(&self.pairs);
        if let Some(r) = pairs.get_mut(key).and_then(|p| p.reserve.as_mut()) {
            r.left = (r.left + cost).min(r.lease.units);
        }
    }

    /// Takes out the reserve of `key`'s pair, to give back now (Redis
    /// refused a call of the pair for its calendar quota: what is left of
    /// it is in reserves); the pair takes no reserve again before the
    /// period ends. `None` when it holds none with units left.
    pub fn give_back_reserve(&self, key: Key<'_>) -> Option<Return> {
        let mut pairs = lock(&self.pairs);
        let pair = pairs.get_mut(key)?;
        let r = pair.reserve.take()?;
        pair.no_reserve_until = r.deadline;
        (r.left > 0).then(|| Return {
            account: key.account.into(),
            rule: r.rule,
            offset_us: r.offset_us,
            lease: r.lease,
            unspent: r.left,
            reserve: true,
        })
    }

    /// The pairs this instance holds a lease of now (account, rule state).
    pub fn held(&self) -> Vec<(Arc<str>, Arc<str>)> {
        let pairs = lock(&self.pairs);
        let mut held = Vec::new();
        for (a, states) in &pairs.by_account {
            for (state, pair) in states {
                if pair.held.is_some() {
                    held.push((a.clone(), state.clone()));
                }
            }
        }
        held
    }

    /// Redis says the penalty of `account`'s pair `state` ends at `until`
    /// (store time): a lease of it is dropped if the penalty outlasts the
    /// latest store time the lease can be at now (local `now`).
    pub fn penalty_seen(&self, account: &str, state: &str, until: Micros, now: Micros) {
        let mut pairs = lock(&self.pairs);
        let Some(pair) = pairs.by_account.get_mut(account).and_then(|s| s.get_mut(state)) else { return };
        if pair.held.as_ref().is_some_and(|h| until > h.lease.at + (now - h.sent)) {
            if let Some(h) = pair.held.take() {
                self.counters.dropped.inc_by(h.left);
            }
        }
    }

    /// Gives back every lease of `account` (WeChat reset its counters).
    pub fn account_cleared(&self, account: &str) {
        let mut pairs = lock(&self.pairs);
        if let Some(states) = pairs.by_account.get_mut(account) {
            for pair in states.values_mut() {
                if let Some(h) = pair.held.take() {
                    self.give_back(account, *h);
                }
            }
        }
    }

    /// Gives back every lease (the rules were reloaded: a lower limit
    /// bites at once on this instance).
    pub fn give_back_all(&self) {
        let mut pairs = lock(&self.pairs);
        pairs.len = 0;
        pairs.rules.clear();
        for (a, states) in pairs.by_account.drain() {
            for pair in states.into_values() {
                if let Some(h) = pair.held {
                    self.give_back(&a, *h);
                }
                if let Some(r) = pair.reserve {
                    self.give_back_kept(&a, *r);
                }
            }
        }
    }

    /// Leases over at local `now` with units unspent, and pairs idle for
    /// [`IDLE_US`] (forgotten), queued to be given back; then every queued
    /// return, for the keeper to send.
    pub fn due_returns(&self, now: Micros) -> Vec<Return> {
        {
            let mut guard = lock(&self.pairs);
            let pairs = &mut *guard;
            let mut over = Vec::new();
            let mut kept = Vec::new();
            let mut len = 0;
            let reserve_idle = 2 * self.reserve_us;
            pairs.by_account.retain(|a, states| {
                states.retain(|_, pair| {
                    if pair.held.as_ref().is_some_and(|h| now >= h.deadline) {
                        if let Some(h) = pair.held.take() {
                            over.push((a.clone(), h));
                        }
                    }
                    // A reserve past its period: nothing to give back.
                    if pair.reserve.as_ref().is_some_and(|r| now >= r.deadline) {
                        if let Some(r) = pair.reserve.take() {
                            self.counters.expired.inc_by(r.left);
                        }
                    }
                    let idle = now - pair.last_call;
                    let keep = pair.taking
                        || pair.reserving
                        || pair.held.is_some()
                        || idle < IDLE_US
                        || (pair.reserve.is_some() && idle < reserve_idle);
                    if !keep {
                        if let Some(r) = pair.reserve.take() {
                            kept.push((a.clone(), r));
                        }
                    }
                    keep
                });
                len += states.len();
                !states.is_empty()
            });
            pairs.len = len;
            for (a, h) in over {
                self.give_back(&a, *h);
            }
            for (a, r) in kept {
                self.give_back_kept(&a, *r);
            }
        }
        std::mem::take(&mut *lock(&self.returns))
    }

    /// A return the keeper could not send: counted as dropped (its units
    /// stay counted in Redis, the safe side).
    pub fn not_returned(&self, r: &Return) {
        self.counters.dropped.inc_by(r.unspent);
    }

    /// A return Redis found nothing to give back of: its units expired.
    pub fn expired(&self, r: &Return) {
        self.counters.expired.inc_by(r.unspent);
    }

    fn give_back(&self, account: &str, h: Held) {
        if h.left > 0 {
            self.queue(account, h.rule, h.offset_us, h.lease, h.left, false);
        }
    }

    /// A take (a reserve's when `reserve`) answered for a pair forgotten
    /// meanwhile (a reload): counted, and given back whole.
    fn give_back_whole(&self, key: Key<'_>, leased: Option<Leased>, reserve: bool) {
        let Some(lease) = leased.filter(|l| l.units > 0) else { return };
        let taken = if reserve { &self.counters.reserved } else { &self.counters.taken };
        taken.inc_by(lease.units);
        let unspent = lease.units;
        self.queue(key.account, Arc::new(key.rule.clone()), key.offset_us, lease, unspent, reserve);
    }

    /// Queues what is left of a reserve to be given back.
    fn give_back_kept(&self, account: &str, r: Reserve) {
        if r.left > 0 {
            self.queue(account, r.rule, r.offset_us, r.lease, r.left, true);
        }
    }

    fn queue(&self, account: &str, rule: Arc<Rule>, offset_us: Micros, lease: Leased, unspent: u64, reserve: bool) {
        lock(&self.returns).push(Return { account: account.into(), rule, offset_us, lease, unspent, reserve });
    }
}

/// The admission of a call spent from `h` at local `now`: at a store time
/// no earlier than the call's (the take's store time is at most its send
/// time later); the room left counts what the lease still holds.
fn admitted(h: &Held, now: Micros) -> Decision {
    let elapsed = now - h.sent;
    Decision::Admit {
        at: h.lease.at + elapsed,
        hold_us: 0,
        escalated: h.lease.escalated,
        quota: h.lease.quota.map(|q| Quota {
            remaining: q.remaining + h.left,
            reset_us: (q.reset_us - elapsed).max(0),
            ..q
        }),
        calendar: None,
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Ends a take whose call is dropped before it answered ([`Leases::abandoned`]),
/// unless [`Taking::answered`] says it ended.
pub struct Taking<'a> {
    leases: &'a Leases,
    key: Key<'a>,
    armed: bool,
}

impl<'a> Taking<'a> {
    pub fn new(leases: &'a Leases, key: Key<'a>) -> Taking<'a> {
        Taking { leases, key, armed: true }
    }

    /// The take answered ([`Leases::taken`] runs next).
    pub fn answered(mut self) {
        self.armed = false;
    }
}

impl Drop for Taking<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.leases.abandoned(self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{Limit, WindowLimit};

    fn ask(rule: &Rule) -> Ask<'_> {
        Ask::one(Key { account: "a", rule, offset_us: 0 })
    }

    /// Regression (issue 66, leases on by default): a window with a burst
    /// of one was leased; each lease ended as it was taken and its slot,
    /// booked until given back, halved what a queue could send (0.49 of
    /// the window).
    #[test]
    fn a_window_with_a_burst_of_one_is_never_leased() {
        let leases = Leases::new(Some(1_000_000), HOT_CALLS, 0, LeaseCounters::default());
        let one = Rule::new("r", vec![Limit::Window(WindowLimit::new(20, 1_000_000, 1).expect("a valid window"))]);
        let twenty = Rule::new("r", vec![Limit::Window(WindowLimit::new(20, 1_000_000, 20).expect("a valid window"))]);
        assert!(!leases.leasable(&ask(&one)));
        assert!(leases.leasable(&ask(&twenty)));
    }

    /// Regression: a call dropped while it took its pair's lease (its
    /// client left) left the pair marked as taking, so it was decided per
    /// call for good.
    #[test]
    fn a_take_dropped_before_it_answered_lets_the_pair_be_leased_again() {
        let rule =
            Rule::new("r", vec![Limit::Window(WindowLimit::new(1_000, 60_000_000, 1_000).expect("a valid window"))]);
        let leases = Leases::new(Some(1_000_000), HOT_CALLS, 0, LeaseCounters::default());
        let mut takes = 0;
        for i in 0..HOT_CALLS as i64 + 1 {
            if let Spend::Take(_) = leases.spend(&ask(&rule), i) {
                takes += 1;
                drop(Taking::new(&leases, ask(&rule).key));
            }
        }
        assert!(takes >= 2, "the pair was leased again after the dropped take: {takes} takes");
    }
}
