//! `[server] hosts`: the names a client may call the proxy listener by
//! (its `Host`), so that a web page whose name an attacker rebinds to the
//! listener's address (DNS rebinding) cannot call it through a victim's
//! browser: its `Host` is the attacker's name. An IP literal and
//! `localhost` are always allowed (no DNS can rebind them).

use super::errors::Invalid;

/// Names allowed when `hosts` is not set: a single label (`wxgate`, a
/// Compose or Kubernetes short name) and these suffixes, none of which a
/// public DNS name can have: Kubernetes' `.svc` (and `.cluster.local`,
/// under `.local`), the special-use `.localhost` (RFC 6761), `.local`
/// (mDNS, RFC 6762), `.home.arpa` (RFC 8375) and `.internal` (reserved for
/// private use by ICANN, 2024; Docker's `host.docker.internal`).
pub const DEFAULT_SUFFIXES: &[&str] = &[".svc", ".localhost", ".local", ".home.arpa", ".internal"];

/// `[server] hosts`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hosts {
    /// Not set: single-label names and [`DEFAULT_SUFFIXES`].
    Default,
    /// `["*"]`: any name (a DNS-rebound page may then call the listener).
    Any,
    /// The names listed: `name` exactly, `.suffix` any name under it.
    Listed(Vec<Box<str>>),
}

impl Hosts {
    /// Whether a `Host` naming `name` (any letter case, without its port;
    /// not an IP literal nor `localhost`, which are always allowed) may call.
    pub fn allows(&self, name: &str) -> bool {
        let under = |suffix: &str| {
            name.len() > suffix.len()
                && name.get(name.len() - suffix.len()..).is_some_and(|end| end.eq_ignore_ascii_case(suffix))
        };
        match self {
            Hosts::Any => true,
            Hosts::Default => !name.contains('.') || DEFAULT_SUFFIXES.iter().any(|s| under(s)),
            Hosts::Listed(list) => {
                list.iter().any(|h| if h.starts_with('.') { under(h) } else { h.eq_ignore_ascii_case(name) })
            }
        }
    }

    /// What a refusal says the listener allows.
    pub fn describe(&self) -> String {
        match self {
            Hosts::Any => "any name".into(),
            Hosts::Default => {
                format!("an IP address, localhost, a name without a dot or under {}", DEFAULT_SUFFIXES.join(" "))
            }
            Hosts::Listed(list) => format!("an IP address, localhost or {}", list.join(", ")),
        }
    }
}

/// Reads `[server] hosts`.
pub fn hosts(raw: Option<&[String]>) -> Result<Hosts, Invalid> {
    let Some(list) = raw else { return Ok(Hosts::Default) };
    let bad = |why: String| Err(Invalid::at("[server]", "hosts", why));
    if list.is_empty() {
        return bad("an empty list allows only IP addresses and localhost; leave the key out for the default".into());
    }
    if list.iter().any(|h| h == "*") {
        if list.len() > 1 {
            return bad("\"*\" allows any name: give it alone".into());
        }
        return Ok(Hosts::Any);
    }
    let mut out = Vec::with_capacity(list.len());
    for h in list {
        let name = h.strip_prefix('.').unwrap_or(h);
        let valid = name.len() <= 253 && name.split('.').all(label);
        if !valid {
            return bad(format!(
                "\"{h}\" is not a host name (lowercase letters, digits, - and .; \".example.com\" for any name \
                 under it; no port)"
            ));
        }
        out.push(h.as_str().into());
    }
    Ok(Hosts::Listed(out))
}

/// One label of a host name: 1-63 of `a-z 0-9 -`, no `-` at either end.
fn label(l: &str) -> bool {
    (1..=63).contains(&l.len())
        && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !l.starts_with('-')
        && !l.ends_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_allows_names_no_public_dns_can_have() {
        let d = Hosts::Default;
        for ok in ["wxgate", "wxgate.ns.svc", "wxgate.ns.svc.cluster.local", "host.docker.internal", "A.LOCALHOST"] {
            assert!(d.allows(ok), "{ok}");
        }
        for refused in ["evil.example", "x.svc.evil.example", "local.evil.example", "evil.internal.example"] {
            assert!(!d.allows(refused), "{refused}");
        }
    }

    #[test]
    fn a_list_allows_its_names_and_suffixes_only() {
        let h = hosts(Some(&["wxgate.corp.example".into(), ".egress.example".into()])).expect("valid");
        assert!(h.allows("wxgate.corp.example"));
        assert!(h.allows("a.egress.example"));
        assert!(!h.allows("egress.example"));
        assert!(!h.allows("wxgate"), "a list replaces the default");
        assert!(!h.allows("x.wxgate.corp.example"));
        assert_eq!(hosts(Some(&["*".into()])).expect("valid"), Hosts::Any);
        for bad in
            [vec![], vec!["*".to_owned(), "a".to_owned()], vec!["A.example".to_owned()], vec!["a:8080".to_owned()]]
        {
            assert!(hosts(Some(&bad)).is_err(), "{bad:?}");
        }
    }
}
