//! Failover between the configured upstreams: which one a call tries
//! next, and each one's health and back-off (see [`crate::transport::upstream`]'s
//! docs for the rules).

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use http::Uri;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

use super::error::{ClientError, UpstreamError};
use super::pool::Pool;
use crate::telemetry::metrics::{Tried, TriedLabels, UpstreamLabel, UpstreamMetrics};
use crate::time::{Clock, Micros};

/// An upstream's first back-off after a failure.
const BACKOFF_FIRST_US: Micros = 10_000_000;
/// The longest back-off: a failing upstream is tried by one call this often.
const BACKOFF_MAX_US: Micros = 300_000_000;

/// One upstream's health, shared by every serving thread (and kept across
/// a reload that keeps the upstream).
#[derive(Default)]
struct Health {
    /// 0 while up; else the [`Clock`] time (µs) until which calls skip it.
    down_until: AtomicI64,
    /// The current back-off (µs); 0 while up.
    backoff: AtomicI64,
}

/// Why a call tries an upstream, which decides what its failure does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Why {
    /// It was up: a failure starts its first back-off.
    Up,
    /// Its back-off was over and this call claimed the retry: a failure
    /// doubles the back-off.
    Retry,
    /// Every other upstream failed first: a failure changes nothing.
    LastResort,
}

/// One configured upstream: where, its `Host`, its connections, health and series.
pub(super) struct Target {
    /// scheme://authority: where connections go.
    pub(super) base: Uri,
    /// `Host` of every call sent here, as hyper would build it per call.
    pub(super) host: http::HeaderValue,
    /// `host[:port]`: the metrics' `upstream` label, the access log's `upstream`.
    pub(super) name: String,
    /// Used off the serving threads.
    pub(super) pool: Pool,
    /// One pool per serving thread ([`crate::transport::worker`]): a connection's task
    /// runs on the thread that opened it, so sharing pools across threads
    /// would make every call wake another thread.
    pub(super) per_worker: Box<[Pool]>,
    health: Arc<Health>,
    /// Tries by result, in [`Tried::ALL`]'s order.
    tried: [Counter; 4],
    up: Gauge,
}

impl Target {
    pub(super) fn count(&self, result: Tried) {
        if let Some(c) = Tried::ALL.iter().position(|t| *t == result).and_then(|i| self.tried.get(i)) {
            c.inc();
        }
    }

    /// Upstream `up` (an entry of `[server] upstream`), with a pool per
    /// serving thread; its health kept if `previous` (the client a reload
    /// replaces) had it too.
    pub(super) fn new(
        up: &Uri,
        workers: usize,
        metrics: &UpstreamMetrics,
        previous: Option<&Failover>,
    ) -> Result<Target, ClientError> {
        let hostname = up.host().ok_or(ClientError::NoHost)?;
        let default_port = if up.scheme_str() == Some("https") { 443 } else { 80 };
        let name = match up.port_u16() {
            Some(p) if p != default_port => format!("{hostname}:{p}"),
            _ => hostname.to_owned(),
        };
        let host = http::HeaderValue::from_str(&name).map_err(ClientError::Host)?;
        let base = Uri::builder()
            .scheme(up.scheme().cloned().unwrap_or(http::uri::Scheme::HTTPS))
            .authority(up.authority().cloned().ok_or(ClientError::NoHost)?)
            .path_and_query("/")
            .build()
            .map_err(ClientError::Base)?;
        let kept = previous.and_then(|p| p.targets.iter().find(|t| t.base == base));
        let health = kept.map_or_else(Arc::default, |t| t.health.clone());
        let labels = |result| TriedLabels { upstream: name.clone(), result };
        let tried = Tried::ALL.map(|r| metrics.requests.get_or_create(&labels(r)).clone());
        let up = metrics.up.get_or_create(&UpstreamLabel { upstream: name.clone() }).clone();
        up.set(i64::from(health.down_until.load(Ordering::Relaxed) == 0));
        Ok(Target {
            base,
            host,
            name,
            pool: Pool::default(),
            per_worker: (0..workers).map(|_| Pool::default()).collect(),
            health,
            tried,
            up,
        })
    }
}

/// One upstream's health, for `/readyz`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamStatus {
    /// `host[:port]`.
    pub name: String,
    pub url: String,
    /// False while it is skipped after a failure.
    pub up: bool,
    /// How long it is still skipped (0 when up, or when the next call will try it).
    pub skipped_for_us: Micros,
}

/// The configured upstreams, in order, and the clock of their back-offs.
pub(super) struct Failover {
    /// In `[server] upstream`'s order; never empty.
    pub(super) targets: Box<[Target]>,
    /// Back-off times.
    pub(super) clock: Arc<dyn Clock>,
}

impl Failover {
    /// Each upstream's health, in order.
    pub(super) fn status(&self) -> Vec<UpstreamStatus> {
        let now = self.clock.now_us();
        self.targets
            .iter()
            .map(|t| {
                let until = t.health.down_until.load(Ordering::Relaxed);
                UpstreamStatus {
                    name: t.name.clone(),
                    url: t.base.to_string(),
                    up: until == 0,
                    skipped_for_us: if until == 0 { 0 } else { (until - now).max(0) },
                }
            })
            .collect()
    }

    /// The next upstream to try, not in `tried` (a bit per index): the
    /// first that is up, or whose back-off is over and whose retry this call
    /// claims; else the first left. The clock is read once, and only when
    /// an upstream is down: with all up, this is one atomic load.
    pub(super) fn pick(&self, tried: u32) -> Option<(usize, Why)> {
        let untried = |i: &usize| tried & (1 << i) == 0;
        let mut now = None;
        for (i, t) in self.targets.iter().enumerate().filter(|(i, _)| untried(i)) {
            let until = t.health.down_until.load(Ordering::Relaxed);
            if until == 0 {
                return Some((i, Why::Up));
            }
            let now = *now.get_or_insert_with(|| self.clock.now_us());
            // Claimed by moving its end on by a back-off: the calls that
            // come meanwhile skip it, and a retry whose call is dropped
            // leaves it skipped for one more back-off.
            let backoff = t.health.backoff.load(Ordering::Relaxed).max(BACKOFF_FIRST_US);
            if now >= until
                && t.health
                    .down_until
                    .compare_exchange(until, now + backoff, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                return Some((i, Why::Retry));
            }
        }
        (0..self.targets.len()).find(untried).map(|i| (i, Why::LastResort))
    }

    /// An answer came from `t`: it is up (again).
    pub(super) fn answered(&self, t: &Target) {
        if t.health.down_until.load(Ordering::Relaxed) != 0 && t.health.down_until.swap(0, Ordering::AcqRel) != 0 {
            t.health.backoff.store(0, Ordering::Relaxed);
            t.up.set(1);
            tracing::info!(target: "wxgate::transport::upstream", upstream = %t.name, "the upstream answers again: calls go to it");
        }
    }

    /// A call failed at `t` (not by its client's fault): starts its first
    /// back-off if it was up, doubles it if this was its retry.
    pub(super) fn failed(&self, t: &Target, why: Why, e: &UpstreamError) {
        let h = &t.health;
        let now = self.clock.now_us();
        let backoff = match why {
            Why::Up => {
                if h.down_until
                    .compare_exchange(0, now + BACKOFF_FIRST_US, Ordering::AcqRel, Ordering::Relaxed)
                    .is_err()
                {
                    return; // already skipped, by another call's failure
                }
                h.backoff.store(BACKOFF_FIRST_US, Ordering::Relaxed);
                BACKOFF_FIRST_US
            }
            Why::Retry => {
                let b = h.backoff.load(Ordering::Relaxed).saturating_mul(2).clamp(BACKOFF_FIRST_US, BACKOFF_MAX_US);
                h.backoff.store(b, Ordering::Relaxed);
                h.down_until.store(now + b, Ordering::Release);
                b
            }
            Why::LastResort => return,
        };
        t.up.set(0);
        if self.targets.len() > 1 {
            tracing::warn!(target: "wxgate::transport::upstream", upstream = %t.name, error = %e, backoff_s = backoff / 1_000_000, "upstream failed: calls go to the next upstream until its back-off is over, then one call tries it again");
        } else {
            tracing::warn!(target: "wxgate::transport::upstream", upstream = %t.name, error = %e, "upstream failed: marked down until a call gets an answer");
        }
    }
}
