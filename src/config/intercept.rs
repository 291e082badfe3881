//! `[intercept]`: compiled into [`Intercept`]. Off unless the table is in
//! the file (and `enabled` is not `false`); when on, `ca_cert` and `ca_key`
//! are required, and the key file must not be readable by others.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::domain::{family, valid_host};
use super::errors::Invalid;
use super::raw::RawIntercept;
use super::settings::{parse_upstream, shown};
use super::{Domain, Intercept};

const INTERCEPT: &str = "[intercept]";

/// WeChat's API hosts that SDKs hard-code: the general host, its
/// disaster-recovery twin, and WeCom's (each when a domain serves it).
pub(super) const DEFAULT_HOSTS: [&str; 3] = ["api.weixin.qq.com", "api2.weixin.qq.com", "qyapi.weixin.qq.com"];

/// `[intercept]`; `None` when absent or `enabled = false`.
///
/// A host goes to its domain ([`super::Config::domain_of_host`]): WeChat's
/// hosts of no domain here are left out of the default list and refused
/// in a given one (their calls would count by another domain's rules).
pub(super) fn compile(
    raw: Option<RawIntercept>,
    dir: Option<&Path>,
    domains: &[Domain],
) -> Result<Option<Intercept>, Invalid> {
    let Some(raw) = raw else { return Ok(None) };
    if raw.enabled == Some(false) {
        return Ok(None);
    }
    let served = |host: &str| match family(host) {
        Some(root) => domains.iter().any(|d| family(&d.host) == Some(root) || *d.host == *host),
        None => true,
    };
    let hosts: Vec<Arc<str>> = match raw.hosts {
        None => {
            let mut hosts: Vec<Arc<str>> = DEFAULT_HOSTS.iter().filter(|h| served(h)).map(|h| Arc::from(*h)).collect();
            for d in domains {
                if !hosts.contains(&d.host) {
                    hosts.push(d.host.clone());
                }
            }
            hosts
        }
        Some(list) => {
            if list.is_empty() {
                return Err(Invalid::at(
                    INTERCEPT,
                    "hosts",
                    "an empty list: name the WeChat hosts to intercept, e.g. [\"api.weixin.qq.com\"] (or set enabled \
                     = false)",
                ));
            }
            let mut hosts: Vec<Arc<str>> = Vec::with_capacity(list.len());
            for (i, h) in list.iter().enumerate() {
                let host = h.to_ascii_lowercase();
                if !valid_host(&host) {
                    return Err(Invalid::at(
                        INTERCEPT,
                        format!("hosts[{i}]"),
                        format!("\"{h}\" is not a DNS name (such as api.weixin.qq.com; no scheme, no port)"),
                    ));
                }
                if !served(&host) {
                    return Err(Invalid::at(
                        INTERCEPT,
                        format!("hosts[{i}]"),
                        format!(
                            "\"{h}\" is a WeChat host of no domain here: its calls would count by another domain's \
                             rules; add a [[domain]] for it (docs/configuration.md#domain) or leave it out"
                        ),
                    ));
                }
                if hosts.iter().any(|x| **x == *host) {
                    return Err(Invalid::at(INTERCEPT, format!("hosts[{i}]"), format!("\"{h}\" is listed twice")));
                }
                hosts.push(host.into());
            }
            hosts
        }
    };
    let file = |key: &str, given: Option<PathBuf>| -> Result<PathBuf, Invalid> {
        let given = given.ok_or_else(|| {
            Invalid::at(INTERCEPT, key, "missing: `wxgate ca init --out DIR` makes the CA (ca.pem, ca-key.pem)")
        })?;
        let path = match dir {
            Some(d) if given.is_relative() => d.join(given),
            _ => given,
        };
        if !path.is_file() {
            return Err(Invalid::at(INTERCEPT, key, format!("{} is not a readable file", path.display())));
        }
        Ok(path)
    };
    let ca_cert = file("ca_cert", raw.ca_cert)?;
    let ca_key = file("ca_key", raw.ca_key)?;
    super::units::check_secret_mode(
        &ca_key,
        "ca_key",
        "whoever reads it can impersonate WeChat's hosts to every service that trusts the CA",
    )
    .map_err(|e| e.table(INTERCEPT))?;
    let mut upstream = Vec::new();
    for (host, url) in raw.upstream.unwrap_or_default() {
        let Some(listed) = hosts.iter().find(|h| h.eq_ignore_ascii_case(&host)) else {
            return Err(Invalid::at(INTERCEPT, "upstream", format!("\"{host}\" is not in [intercept] hosts")));
        };
        let uri = parse_upstream(&url)
            .map_err(|e| e.field(format!("\"{host}\" = \"{}\"", shown(&url))).field("upstream").table(INTERCEPT))?;
        if uri.path() != "/" && !uri.path().is_empty() {
            return Err(Invalid::at(
                INTERCEPT,
                "upstream",
                format!("\"{host}\" = \"{url}\": no path (an intercepted call keeps its own whole path)"),
            ));
        }
        upstream.push((listed.clone(), uri));
    }
    Ok(Some(Intercept { hosts, ca_cert, ca_key, upstream }))
}

#[cfg(test)]
mod tests {
    use super::super::domain::valid_host;

    #[test]
    fn hosts() {
        assert!(valid_host("api.weixin.qq.com"));
        assert!(valid_host("sh.api.weixin.qq.com"));
        for bad in ["localhost", "api.weixin.qq.com:443", "https://api.weixin.qq.com", "a..b", "-a.b", "*.qq.com", ""] {
            assert!(!valid_host(bad), "{bad}");
        }
    }
}
