//! What a web browser marks its requests with, for listeners no browser
//! has any business calling. A page can make its visitor's browser send a
//! "simple" request (GET, or a POST of a form or text) to any address the
//! browser reaches, loopback included, without a preflight; the answer is
//! hidden from the page, but the call is made. Browsers mark such a request
//! with `Origin` (a POST, any cross-origin fetch) and, in current ones,
//! `Sec-Fetch-Site`; a page whose name an attacker points at the listener's
//! address (DNS rebinding) is same-origin by those marks, but its `Host` is
//! the attacker's name. No WeChat SDK and no HTTP library sends `Origin` or
//! `Sec-Fetch-*` unless told to, and each sends `Host` as its base URL has it.

use http::header::{HeaderName, ORIGIN};
use http::HeaderMap;

use crate::config::hosts::Hosts;

pub const SEC_FETCH_SITE: HeaderName = HeaderName::from_static("sec-fetch-site");

/// Why a request to the proxy listener looks sent by a browser, or `None`.
/// `host`: `Some(allowed)` when its `Host` must be checked (not inside an
/// intercepted tunnel, whose `Host` is the WeChat host the tunnel named).
/// A navigation the browser's user typed (`Sec-Fetch-Site: none`) passes:
/// no page asked for it. One pass over the fields, no allocation: it runs
/// on every call.
pub fn proxy_refusal(headers: &HeaderMap, host: Option<&Hosts>) -> Option<String> {
    let mut hosts = 0;
    let mut named = None;
    for (name, value) in headers {
        if *name == http::header::HOST {
            hosts += 1;
            named = Some(value);
        } else if *name == ORIGIN {
            return Some(
                "a browser page sent this request (it has an Origin field): wxgate's proxy listener \
                         serves services, never web pages"
                    .into(),
            );
        } else if *name == SEC_FETCH_SITE && value.as_bytes() != b"none" {
            return Some(
                "a browser page sent this request (Sec-Fetch-Site): wxgate's proxy listener serves \
                         services, never web pages"
                    .into(),
            );
        }
    }
    let allowed = host?;
    if hosts > 1 {
        return Some("the request has two Host fields".into());
    }
    // No Host: HTTP/1.0, which no browser sends.
    let host = named?.as_bytes();
    if names_an_address(host) {
        return None;
    }
    let Some(name) = name_of(host) else { return Some("the Host field is not a host name".into()) };
    if name.eq_ignore_ascii_case("localhost") || allowed.allows(name) {
        return None;
    }
    Some(format!(
        "Host is not a name this listener is called by ([server] hosts: {}); a web page whose name points at \
         this address (DNS rebinding) sends its own name: add this service's name to [server] hosts",
        allowed.describe()
    ))
}

/// Whether a `Host` field names an IP address (and its port): a bracketed
/// IPv6 literal, or a host of digits and dots, which a browser reads as an
/// IPv4 address and never looks up (a URL whose host ends in a number is
/// an IPv4 address or invalid, by the URL standard): no DNS can rebind
/// them. A byte loop: it runs on every call.
fn names_an_address(host: &[u8]) -> bool {
    if let Some(rest) = host.strip_prefix(b"[") {
        let Some(end) = rest.iter().position(|&b| b == b']') else { return false };
        let port = &rest[end + 1..];
        return end > 0
            && rest[..end].iter().all(|b| b.is_ascii_hexdigit() || b":.".contains(b))
            && (port.is_empty() || port.first() == Some(&b':'));
    }
    let name = match host.iter().rposition(|&b| b == b':') {
        Some(colon) => &host[..colon],
        None => host,
    };
    name.first().is_some_and(u8::is_ascii_digit) && name.iter().all(|b| b.is_ascii_digit() || *b == b'.')
}

/// The name of a `Host` field, without its port and a final dot; `None`
/// when it is not a name (not text, or empty).
fn name_of(host: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(host).ok()?;
    let name = text.rsplit_once(':').map_or(text, |(name, _)| name);
    let name = name.strip_suffix('.').unwrap_or(name);
    (!name.is_empty()).then_some(name)
}

/// `host[:port]` (a `Host` field's text) where host is `localhost` or an
/// IP address ([`names_an_address`]): names no DNS can rebind.
pub fn host_names_an_address(host: &str) -> bool {
    names_an_address(host.as_bytes()) || name_of(host.as_bytes()).is_some_and(|n| n.eq_ignore_ascii_case("localhost"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(fields: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in fields {
            h.append(*name, HeaderValue::from_static(value));
        }
        h
    }

    #[test]
    fn a_service_passes_and_a_browser_page_is_refused() {
        let d = Some(&Hosts::Default);
        for ok in [
            "127.0.0.1:8080",
            "localhost:8080",
            "LOCALHOST",
            "[::1]:8080",
            "[fd00::1]",
            "wxgate:8080",
            "10.0.0.7",
            "wxgate.ns.svc.cluster.local",
        ] {
            assert_eq!(proxy_refusal(&headers(&[("host", ok)]), d), None, "{ok}");
        }
        assert_eq!(proxy_refusal(&headers(&[]), d), None, "HTTP/1.0 without Host");
        assert_eq!(proxy_refusal(&headers(&[("host", "127.0.0.1"), ("sec-fetch-site", "none")]), d), None);
        for refused in [
            &[("host", "127.0.0.1:8080"), ("origin", "https://evil.example")][..],
            &[("host", "127.0.0.1:8080"), ("origin", "null")],
            &[("host", "127.0.0.1:8080"), ("sec-fetch-site", "cross-site")],
            &[("host", "127.0.0.1:8080"), ("sec-fetch-site", "same-origin")],
            &[("host", "rebound.evil.example:8080")],
            &[("host", "REBOUND.evil.example")],
            &[("host", "127.0.0.1"), ("host", "evil.example")],
            &[("host", "127.0.0.1"), ("host", "127.0.0.1")],
            &[("host", "1.2.3.4.evil.example")],
            &[("host", "[evil.example]")],
            &[("host", ":8080")],
        ] {
            assert!(proxy_refusal(&headers(refused), d).is_some(), "{refused:?}");
        }
        // Inside an intercepted tunnel the Host is WeChat's; marks still count.
        assert_eq!(proxy_refusal(&headers(&[("host", "api.weixin.qq.com")]), None), None);
        assert!(proxy_refusal(&headers(&[("host", "api.weixin.qq.com"), ("origin", "null")]), None).is_some());
    }
}
