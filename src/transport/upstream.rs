//! The pooled client to the configured upstreams (WeChat, or mocks in
//! tests). wxgate never connects anywhere else: every connection goes to a
//! configured base, and a request carries only the client's path and query
//! (origin-form) and that upstream's own `Host`.
//!
//! The pool is wxgate's own, one per upstream and serving thread: hyper's
//! HTTP/1 connections, a stack of senders (newest first, so few connections
//! stay warm), no hashing, no task per call. A request goes out once; it is
//! sent again only when hyper hands it back unsent (a pooled connection that
//! had closed before the request was written), then on a new connection.
//!
//! Timeouts, each meaning what it says ([`Upstream::send`]):
//! - connecting (TCP, TLS) before the request is handed to a connection:
//!   `upstream_timeout` ([`UpstreamError::ConnectTimeout`]);
//! - sending the request body: `body_timeout` without progress. Who stopped
//!   decides whose fault it is: the client stopped sending (408,
//!   [`UpstreamError::ClientStalled`]) or the upstream stopped taking bytes
//!   (504, [`UpstreamError::BodyStalled`]). An upload may take as long as
//!   its bytes keep moving;
//! - from the moment the whole request has been handed to the connection
//!   to the answer's head: `upstream_timeout` ([`UpstreamError::Timeout`]).
//!
//! An exchange that is given up (a timeout, an error, or the call dropped)
//! closes its connection: nothing of it lingers, and nothing is sent again.
//!
//! A failure says whether the request provably never reached the upstream
//! ([`UpstreamError::never_sent`]): only then does the call give back what
//! its admission took from the rule's limits. A request body the client
//! broke off or malformed ([`UpstreamError::client_fault`]) is not such a
//! failure: WeChat may have had the head and part of the body.
//!
//! **Failover** (`[server] upstream` a list): a call goes to the first
//! upstream that is up. When it provably never reached that one
//! ([`UpstreamError::never_sent`]: no connection, TLS failed, or
//! `upstream_timeout` while connecting; the request handed back unwritten)
//! it goes to the next at once, with a connect budget of its own; once any
//! byte of it may have been written it is never sent anywhere else (WeChat's
//! sends are not idempotent): a timeout after that is 504, as with one
//! upstream. Each failure of an upstream (never sent, or sent and then no
//! answer; not the client's body) has it skipped for a back-off: 10 s,
//! doubling while it keeps failing, at most 5 min; an answer ends it. When
//! the back-off is over, the next call tries it first (one call at a time:
//! the others go on to the next meanwhile); there is no background probe.
//! Upstreams skipped for their back-off are still tried, in order, after
//! the others failed: a call is answered 502/504 only after every upstream
//! failed to take it. Back-off times are on the app's [`Clock`].
//!
//! The parts: `tls` builds the connector, `pool` keeps the idle
//! connections, `failover` picks the upstream a call tries and keeps each
//! one's health, `exchange` makes one try (connecting, sending, the
//! timers), `error` says how a try failed, and `hop_by_hop` strips the
//! headers no message passes on and sets those WeChat gets ([`to_upstream`],
//! [`replace`]: every field of a header handled whole). Their log lines
//! name the target `wxgate::transport::upstream`, so that one filter
//! (`WXGATE_LOG=wxgate::transport::upstream=debug`) shows every upstream's
//! health, whichever part logs it.

mod error;
mod exchange;
mod failover;
mod hop_by_hop;
mod pool;
mod tls;

use std::sync::Arc;

use http::header::HOST;
use http::uri::PathAndQuery;
use http::{Request, Response, Uri};
use hyper::body::Incoming;

pub use error::{ClientError, UpstreamError};
pub use exchange::Connected;
use exchange::{Failure, Link};
pub use failover::UpstreamStatus;
use failover::{Failover, Target, Why};
pub use hop_by_hop::{replace, strip_hop_by_hop, to_upstream};

use crate::config::Server;
use crate::telemetry::metrics::{FailoverLabels, Tried, UpstreamLabel, UpstreamMetrics};
use crate::time::Clock;
use crate::transport::request_body::RequestBody;

/// The connector of `[server]`'s upstreams (TCP, TLS for https trusting
/// the web roots and `upstream_ca`), for other clients wxgate runs (the
/// callbacks of queued delivery, `crate::features::queue::callbacks`).
pub fn connector(
    server: &Server,
) -> Result<hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>, ClientError> {
    tls::connector(server)
}

/// Each domain's client (`crate::config::Config::domains`, same order).
pub struct DomainUpstreams {
    /// Domain 0's.
    first: Arc<Upstream>,
    /// Domain 1's onwards.
    rest: Vec<Arc<Upstream>>,
}

impl DomainUpstreams {
    /// One client per domain of `config`. A domain whose host `previous`
    /// (the clients a reload replaces, and their config) also had keeps
    /// its upstreams' health.
    pub fn new(
        config: &crate::config::Config,
        clock: &Arc<dyn Clock>,
        metrics: &UpstreamMetrics,
        previous: Option<(&crate::config::Config, &DomainUpstreams)>,
    ) -> Result<DomainUpstreams, ClientError> {
        let mut list = Vec::with_capacity(config.domains.len());
        for d in &config.domains {
            let server = Server { upstream: d.upstream.clone(), ..config.server.clone() };
            let before = previous.and_then(|(c, u)| {
                let i = c.domains.iter().position(|o| o.host == d.host)?;
                Some(&**u.get(i))
            });
            let upstream = Upstream::new(&server, clock.clone(), metrics, before).map_err(|e| {
                if config.domains.len() > 1 {
                    ClientError::Domain { host: d.host.clone(), source: Box::new(e) }
                } else {
                    e
                }
            })?;
            list.push(Arc::new(upstream));
        }
        let mut list = list.into_iter();
        let first = list.next().ok_or(ClientError::NoDomain)?;
        Ok(DomainUpstreams { first, rest: list.collect() })
    }

    /// Domain `i`'s client (domain 0's for an index past the end, which a
    /// call's config never gives).
    pub fn get(&self, i: usize) -> &Arc<Upstream> {
        match i.checked_sub(1) {
            None => &self.first,
            Some(i) => self.rest.get(i).unwrap_or(&self.first),
        }
    }

    /// Every domain's client, in the config's order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Upstream>> {
        std::iter::once(&self.first).chain(self.rest.iter())
    }
}

/// The client to the configured upstreams, tried in order.
pub struct Upstream {
    /// The connector and the timeouts: how a call reaches an upstream.
    link: Link,
    /// The upstreams, their health and back-offs.
    failover: Failover,
    /// The upstreams' path (the same for all), prefixed to every call's.
    base_path: String,
    metrics: UpstreamMetrics,
}

impl Upstream {
    /// Builds the client. Trusts the public web roots plus `upstream_ca`.
    /// Upstreams that `previous` (the client a reload replaces) also had
    /// keep their health: one being skipped stays skipped.
    pub fn new(
        server: &Server,
        clock: Arc<dyn Clock>,
        metrics: &UpstreamMetrics,
        previous: Option<&Upstream>,
    ) -> Result<Upstream, ClientError> {
        let connector = tls::connector(server)?;
        let mut targets = Vec::new();
        let mut base_path = None;
        for up in server.upstream.iter() {
            base_path.get_or_insert_with(|| up.path().trim_end_matches('/').to_owned());
            targets.push(Target::new(up, server.workers, metrics, previous.map(|p| &p.failover))?);
        }
        if targets.is_empty() {
            return Err(ClientError::NoUpstream);
        }
        // Every failover an alert may count exists at 0 from the start.
        for from in &targets {
            for to in targets.iter().filter(|t| t.name != from.name) {
                let _ =
                    metrics.failovers.get_or_create(&FailoverLabels { from: from.name.clone(), to: to.name.clone() });
            }
        }
        // The series of upstreams a reload removed go: no stale "down".
        for gone in previous.iter().flat_map(|p| p.failover.targets.iter()) {
            if !targets.iter().any(|t| t.name == gone.name) {
                metrics.up.remove(&UpstreamLabel { upstream: gone.name.clone() });
            }
        }
        Ok(Upstream {
            link: Link { connector, timeout: server.upstream_timeout, body_timeout: server.body_timeout },
            failover: Failover { targets: targets.into(), clock },
            base_path: base_path.unwrap_or_default(),
            metrics: metrics.clone(),
        })
    }

    /// The request target sent upstream (origin-form): the base URL's path,
    /// then the client's path and query, bytes unchanged.
    pub fn target(&self, path_and_query: &PathAndQuery) -> Result<Uri, http::Error> {
        if self.base_path.is_empty() {
            Ok(Uri::from(path_and_query.clone()))
        } else {
            Uri::builder().path_and_query(format!("{}{}", self.base_path, path_and_query)).build()
        }
    }

    /// Whether the first upstream is `https://<host>` on port 443 (any
    /// path): `[intercept]` sends that host's calls to this pool.
    pub fn first_is_https(&self, host: &str) -> bool {
        self.failover.targets.first().is_some_and(|t| {
            t.base.scheme_str() == Some("https")
                && t.base.port_u16().is_none_or(|p| p == 443)
                && t.base.host().is_some_and(|h| h.eq_ignore_ascii_case(host))
        })
    }

    /// The `host[:port]` of upstream `i` (as [`Upstream::send`] numbers them).
    pub fn name(&self, i: usize) -> &str {
        self.failover.targets.get(i).map_or("", |t| &t.name)
    }

    /// Each upstream's health, in order.
    pub fn status(&self) -> Vec<UpstreamStatus> {
        self.failover.status()
    }

    /// Sends one request (origin-form target; `Host` set here, each
    /// upstream's own) to the first upstream that is up, and returns the
    /// answer's head, with the index of the upstream that answered (or the
    /// last one tried). When the request provably never reached an upstream
    /// it goes to the next (see the module docs); once it may have reached
    /// one, it is never sent again.
    ///
    /// At each upstream: connecting is bounded by `upstream_timeout`;
    /// sending the body by `body_timeout` without progress; waiting for the
    /// head, once the whole request has been handed to the connection, by
    /// `upstream_timeout` again. One timer serves all three, moved from
    /// deadline to deadline.
    pub async fn send(&self, mut req: Request<RequestBody>) -> (usize, Result<Response<Incoming>, UpstreamError>) {
        let progress = req.body().progress();
        let mut tried = 0u32;
        let (mut i, mut why) = self.failover.pick(tried).unwrap_or((0, Why::LastResort));
        loop {
            tried |= 1 << i;
            let Some(target) = self.failover.targets.get(i) else {
                return (i, Err(UpstreamError::Connect("no upstream".into())));
            };
            replace(req.headers_mut(), HOST, target.host.clone());
            match self.link.send_to(target, req, progress.as_deref()).await {
                Ok(resp) => {
                    target.count(Tried::answered);
                    self.failover.answered(target);
                    return (i, Ok(resp));
                }
                Err(Failure::Sent(e)) => {
                    if e.client_fault() {
                        target.count(Tried::client_error);
                    } else {
                        target.count(Tried::failed);
                        self.failover.failed(target, why, &e);
                    }
                    return (i, Err(e));
                }
                Err(Failure::Unsent(back, e)) => {
                    target.count(Tried::not_sent);
                    self.failover.failed(target, why, &e);
                    let Some((next, next_why)) = self.failover.pick(tried) else { return (i, Err(e)) };
                    if let Some(to) = self.failover.targets.get(next) {
                        tracing::debug!(from = %target.name, to = %to.name, error = %e, "the call never reached the upstream: trying the next");
                        let labels = FailoverLabels { from: target.name.clone(), to: to.name.clone() };
                        self.metrics.failovers.get_or_create(&labels).inc();
                    }
                    (req, i, why) = (*back, next, next_why);
                }
            }
        }
    }
}
