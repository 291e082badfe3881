//! `[intercept]`: WeChat's hosts reached through `CONNECT`, for SDKs and
//! code that hard-code `https://api.weixin.qq.com` (a service sets only
//! `HTTPS_PROXY` and a CA bundle). The tunnel itself is `crate::server::tunnel`;
//! this module holds what tunnels share ([`Interceptor`], built once at
//! start: `[intercept]` changes need a restart):
//!
//! - the CA ([`ca`]) and one TLS server config per host, minted from it on
//!   first use and kept (minted again after [`ca::LEAF_RENEW_US`]);
//! - where each host's calls go ([`Host::upstream`]): `[intercept]
//!   upstream`'s URL for the host if set; else, when the host is that of
//!   `[server] upstream`'s first URL (`https://<host>`), the main upstream
//!   pool (its connections, health and failover list: the operator's choice
//!   for that host); else `https://<host>`, over TLS verified against the
//!   public roots (plus `[server] upstream_ca`);
//! - per host, a count of the calls served through tunnels.
//!
//! Never an open proxy: only the listed hosts on port 443 get a tunnel,
//! and a tunnel's calls go only to that host's upstream.

pub mod ca;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use prometheus_client::metrics::counter::Counter;
use rustls::server::ServerConfig;

use crate::config::{Config, Upstreams};
use crate::telemetry::metrics::{HostLabel, Metrics, Tunnel, TunnelLabels};
use crate::time::{Clock, Micros, SystemClock};
use crate::transport::upstream::{ClientError, Upstream};

use self::ca::{Ca, CaError};

/// Why `[intercept]` cannot serve its hosts (wxgate does not start).
#[derive(Debug, thiserror::Error)]
pub enum InterceptError {
    /// The CA cannot be loaded, or cannot sign a leaf that verifies.
    #[error(transparent)]
    Ca(#[from] CaError),
    /// A host that makes no `https://<host>` URL.
    #[error("[intercept] hosts: {host}: {source}")]
    HostUrl { host: Arc<str>, source: http::uri::InvalidUri },
    /// A host's own upstream client cannot be built.
    #[error("[intercept] upstream for {host}: {source}")]
    Upstream { host: Arc<str>, source: ClientError },
}

/// One intercepted host.
pub struct Host {
    /// As listed (lower case).
    pub name: Arc<str>,
    /// `[intercept] upstream`'s URL for it, or `https://<name>`.
    own: Arc<Upstream>,
    /// Whether `own` is `[intercept] upstream`'s (then always used).
    overridden: bool,
    /// `wxgate_intercepted_calls{host}`.
    pub calls: Counter,
}

impl Host {
    /// Where this host's calls go: see the module docs.
    pub fn upstream(&self, main: Arc<Upstream>) -> Arc<Upstream> {
        if !self.overridden && main.first_is_https(&self.name) {
            main
        } else {
            self.own.clone()
        }
    }
}

/// A leaf's TLS config and when it was minted (wall clock).
struct Leaf {
    config: Arc<ServerConfig>,
    minted_us: Micros,
}

/// What every tunnel shares; see the module docs.
pub struct Interceptor {
    hosts: Box<[Arc<Host>]>,
    /// The host names, for the request guard (`crate::transport::smuggling`).
    names: Arc<[Arc<str>]>,
    ca: Ca,
    leaves: Mutex<HashMap<Arc<str>, Leaf>>,
}

impl Interceptor {
    /// Loads the CA and mints a certificate for every host (so a CA that
    /// cannot serve them stops the start, not a client later). `None` when
    /// `[intercept]` is off.
    pub fn new(
        config: &Config,
        clock: Arc<dyn Clock>,
        metrics: &Metrics,
    ) -> Result<Option<Interceptor>, InterceptError> {
        let Some(ic) = &config.intercept else { return Ok(None) };
        let ca = Ca::load(&ic.ca_cert, &ic.ca_key)?;
        let left_days = (ca.not_after() - wall_us() / 1_000_000) / 86_400;
        if left_days < 30 {
            tracing::warn!(
                ca_cert = %ic.ca_cert.display(),
                left_days,
                "the [intercept] CA expires soon: make a new one (wxgate ca init) and give it to the services"
            );
        }
        let mut hosts = Vec::with_capacity(ic.hosts.len());
        let mut leaves = HashMap::new();
        let now = wall_us();
        for name in &ic.hosts {
            let given = ic.upstream.iter().find(|(h, _)| h == name).map(|(_, u)| u.clone());
            let url = match &given {
                Some(u) => u.clone(),
                None => format!("https://{name}")
                    .parse()
                    .map_err(|source| InterceptError::HostUrl { host: name.clone(), source })?,
            };
            let server = crate::config::Server { upstream: Upstreams::one(url), ..config.server.clone() };
            let own = Upstream::new(&server, clock.clone(), &metrics.upstreams, None)
                .map_err(|source| InterceptError::Upstream { host: name.clone(), source })?;
            let calls = metrics.intercepted_calls.get_or_create(&HostLabel { host: name.to_string() }).clone();
            hosts.push(Arc::new(Host { name: name.clone(), own: Arc::new(own), overridden: given.is_some(), calls }));
            leaves.insert(name.clone(), Leaf { config: ca.leaf(name, now)?, minted_us: now });
        }
        // Every result's series from the start, so that 0 is visible (and alertable).
        for result in [Tunnel::opened, Tunnel::refused, Tunnel::handshake_failed] {
            let _ = metrics.intercept_tunnels.get_or_create(&TunnelLabels { result });
        }
        let names = ic.hosts.clone().into();
        Ok(Some(Interceptor { hosts: hosts.into(), names, ca, leaves: Mutex::new(leaves) }))
    }

    /// The listed host `name` (any case), if it is one.
    pub fn host(&self, name: &str) -> Option<&Arc<Host>> {
        self.hosts.iter().find(|h| h.name.eq_ignore_ascii_case(name))
    }

    /// The listed host names.
    pub fn names(&self) -> Arc<[Arc<str>]> {
        self.names.clone()
    }

    /// The TLS config serving `host` (listed): its cached leaf, minted again
    /// when older than [`ca::LEAF_RENEW_US`].
    pub fn tls(&self, host: &Host) -> Result<Arc<ServerConfig>, CaError> {
        let now = wall_us();
        let mut leaves = self.leaves.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(leaf) = leaves.get(&host.name) {
            if now - leaf.minted_us < ca::LEAF_RENEW_US {
                return Ok(leaf.config.clone());
            }
        }
        let config = self.ca.leaf(&host.name, now)?;
        leaves.insert(host.name.clone(), Leaf { config: config.clone(), minted_us: now });
        Ok(config)
    }
}

/// Wall-clock time for certificates: clients check them against their own
/// wall clocks, whatever clock decisions run on (a test's manual clock).
fn wall_us() -> Micros {
    SystemClock.now_us()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::time::ManualClock;

    /// Where each host's calls go: its `[intercept] upstream`, the main pool
    /// for the host of `[server] upstream`'s first URL, else `https://<host>`.
    #[test]
    fn each_host_goes_to_its_own_upstream_or_the_main_pool() {
        let dir = std::env::temp_dir().join(format!("wxgate-intercept-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let ca = ca::generate("unit", SystemClock.now_us()).expect("ca");
        std::fs::write(dir.join("ca.pem"), &ca.cert_pem).expect("write");
        std::fs::write(dir.join("ca-key.pem"), &ca.key_pem).expect("write");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir.join("ca-key.pem"), std::fs::Permissions::from_mode(0o600)).expect("chmod");
        }
        let text = format!(
            "[server]\nupstream = [\"https://api.weixin.qq.com\", \"https://api2.weixin.qq.com\"]\nadmin_listen = \"off\"\n\n\
             [intercept]\nca_cert = {:?}\nca_key = {:?}\nupstream = {{ \"qyapi.weixin.qq.com\" = \"http://127.0.0.1:9999\" }}\n\n\
             [[domain]]\nhost = \"qyapi.weixin.qq.com\"\nrules = {:?}\n",
            dir.join("ca.pem").display().to_string(),
            dir.join("ca-key.pem").display().to_string(),
            dir.join("wecom.toml").display().to_string(),
        );
        std::fs::write(dir.join("wecom.toml"), "").expect("write");
        let config = Config::parse(&text, std::path::Path::new("t.toml")).expect("config");
        let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(0));
        let metrics = Metrics::new();
        let main = Arc::new(Upstream::new(&config.server, clock.clone(), &metrics.upstreams, None).expect("main"));
        let intercept = Interceptor::new(&config, clock, &metrics).expect("start").expect("on");
        let to = |host: &str| intercept.host(host).expect("listed").upstream(main.clone());
        assert!(Arc::ptr_eq(&to("API.weixin.qq.com"), &main), "the main pool, with its failover to api2");
        assert_eq!(to("api2.weixin.qq.com").status()[0].url, "https://api2.weixin.qq.com/");
        assert_eq!(to("qyapi.weixin.qq.com").status()[0].url, "http://127.0.0.1:9999/");
        assert!(intercept.host("example.com").is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
