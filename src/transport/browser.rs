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
use http::{HeaderMap, HeaderValue};

use crate::config::hosts::Hosts;

pub const SEC_FETCH_SITE: HeaderName = HeaderName::from_static("sec-fetch-site");

/// Why a request to the proxy listener looks sent by a browser, or `None`.
/// `host`: `Some(allowed)` when its `Host` must be checked (not inside an
/// intercepted tunnel, whose `Host` is the WeChat host the tunnel named).
/// A navigation the browser's user typed (`Sec-Fetch-Site: none`) passes:
/// no page asked for it.
pub fn proxy_refusal(headers: &HeaderMap, host: Option<&Hosts>) -> Option<String> {
    if headers.contains_key(ORIGIN) {
        return Some(
            "a browser page sent this request (it has an Origin field): wxgate's proxy listener serves \
                     services, never web pages"
                .into(),
        );
    }
    if headers.get(SEC_FETCH_SITE).is_some_and(|v| v.as_bytes() != b"none") {
        return Some(
            "a browser page sent this request (Sec-Fetch-Site): wxgate's proxy listener serves \
                     services, never web pages"
                .into(),
        );
    }
    let allowed = host?;
    let mut fields = headers.get_all(http::header::HOST).iter();
    let (Some(first), None) = (fields.next(), fields.next()) else {
        // No Host (HTTP/1.0: no browser sends that), or two: ambiguous.
        return (headers.get_all(http::header::HOST).iter().count() > 1)
            .then(|| "the request has two Host fields".into());
    };
    let name = name_of(first)?;
    if name.is_empty() {
        return Some("the Host field is not a host name".into());
    }
    if names_an_address(&name) || allowed.allows(&name) {
        return None;
    }
    Some(format!(
        "Host is not a name this listener is called by ([server] hosts: {}); a web page whose name points at \
         this address (DNS rebinding) sends its own name: add this service's name to [server] hosts",
        allowed.describe()
    ))
}

/// The name of a `Host` field, lowercase, without its port; `None` when it
/// is not text.
fn name_of(host: &HeaderValue) -> Option<String> {
    let text = host.to_str().ok()?;
    let name = match text.strip_prefix('[') {
        Some(rest) => return Some(rest.split_once(']').map_or("", |(ip, _)| ip).to_owned()),
        None => text.rsplit_once(':').map_or(text, |(name, _)| name),
    };
    Some(name.trim_end_matches('.').to_ascii_lowercase())
}

/// `localhost`, or an IP address (IPv6 without its brackets): names no
/// DNS can rebind.
fn names_an_address(name: &str) -> bool {
    name == "localhost" || name.parse::<std::net::IpAddr>().is_ok()
}

/// `host[:port]` (a `Host` field's text) where host is `localhost`, an IPv4
/// address or a bracketed IPv6 address: names no DNS can rebind.
pub fn host_names_an_address(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => {
            return rest.split_once(']').is_some_and(|(ip, port)| {
                ip.parse::<std::net::Ipv6Addr>().is_ok() && (port.is_empty() || port.starts_with(':'))
            })
        }
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::Ipv4Addr>().is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

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
        for ok in ["127.0.0.1:8080", "localhost:8080", "[::1]:8080", "wxgate:8080", "wxgate.ns.svc.cluster.local"] {
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
        ] {
            assert!(proxy_refusal(&headers(refused), d).is_some(), "{refused:?}");
        }
        // Inside an intercepted tunnel the Host is WeChat's; marks still count.
        assert_eq!(proxy_refusal(&headers(&[("host", "api.weixin.qq.com")]), None), None);
        assert!(proxy_refusal(&headers(&[("host", "api.weixin.qq.com"), ("origin", "null")]), None).is_some());
    }
}
