//! Hop-by-hop headers (RFC 9110 §7.6.1): what no message passes on, both
//! ways; and the request headers as wxgate sends them to WeChat
//! ([`to_upstream`]). This runs for every header of every call.
//!
//! Every header wxgate sets, rewrites or takes off on the way to WeChat is
//! handled whole: all its fields go ([`HeaderMap::remove`]), then at most
//! one is set ([`replace`]). A client that gives a header twice cannot
//! slip its second field past a rewrite of the first.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// The hop-by-hop headers every message loses, besides those `Connection`
/// names (RFC 9110 §7.6.1). Bit `i` of a mask stands for `HOP_BY_HOP[i]`.
static HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    header::TE,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::TRAILER,
    header::PROXY_AUTHORIZATION,
    header::PROXY_AUTHENTICATE,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
];

/// `HOP_BY_HOP`'s bit for `Connection`.
const CONNECTION_BIT: u16 = 1;

/// `HOP_BY_HOP`'s bit for a header name as a `HeaderMap` holds it
/// (lowercase), or 0: one `match`, compiled to a length switch and at most
/// two comparisons (this runs for every header of every call, both ways).
fn hop_by_hop_bit(name: &str) -> u16 {
    match name {
        "connection" => CONNECTION_BIT,
        "te" => 1 << 1,
        "transfer-encoding" => 1 << 2,
        "upgrade" => 1 << 3,
        "trailer" => 1 << 4,
        "proxy-authorization" => 1 << 5,
        "proxy-authenticate" => 1 << 6,
        "keep-alive" => 1 << 7,
        "proxy-connection" => 1 << 8,
        _ => 0,
    }
}

/// [`hop_by_hop_bit`] for a name in any case (a `Connection` token).
fn hop_by_hop_bit_any_case(token: &str) -> u16 {
    HOP_BY_HOP.iter().position(|h| h.as_str().eq_ignore_ascii_case(token)).map_or(0, |i| 1 << i)
}

/// Bits after `HOP_BY_HOP`'s: the request headers [`to_upstream`] handles.
const AUTHORIZATION_BIT: u16 = 1 << 9;
const ACCEPT_ENCODING_BIT: u16 = 1 << 10;
const TRACEPARENT_BIT: u16 = 1 << 11;
const TRACESTATE_BIT: u16 = 1 << 12;
const BAGGAGE_BIT: u16 = 1 << 13;
const TRACE_BITS: u16 = TRACEPARENT_BIT | TRACESTATE_BIT | BAGGAGE_BIT;
const REQUEST_BITS: u16 = AUTHORIZATION_BIT | ACCEPT_ENCODING_BIT | TRACE_BITS;

/// [`hop_by_hop_bit`], and the bits of the request headers
/// [`to_upstream`] takes off or rewrites.
fn request_bit(name: &str) -> u16 {
    match name {
        "authorization" => AUTHORIZATION_BIT,
        "accept-encoding" => ACCEPT_ENCODING_BIT,
        "traceparent" => TRACEPARENT_BIT,
        "tracestate" => TRACESTATE_BIT,
        "baggage" => BAGGAGE_BIT,
        other => hop_by_hop_bit(other),
    }
}

/// Sets `name` to `value` alone: every field of that name the message had
/// goes first (however many a client gave, none is left beside it).
pub fn replace(headers: &mut HeaderMap, name: HeaderName, value: HeaderValue) {
    // `insert` removes every previous value of the name; `get_mut` would
    // reach only the first field.
    headers.insert(name, value);
}

/// The client's request headers as wxgate sends them to WeChat, each
/// handled whole (every field of its name):
/// - hop-by-hop headers go ([`strip_hop_by_hop`]), `Proxy-Authorization`
///   among them;
/// - `Authorization` goes, whatever `caller_auth` says: WeChat's API reads
///   no credential from a header, and the one a caller sends is its key
///   for wxgate (a `caller:KEY@` base URL sends it even with `caller_auth`
///   off);
/// - `Accept-Encoding`, when given, becomes one `identity`: WeChat's answer
///   is read (errcode, tokens), so it must come unencoded (its answers are
///   small JSON or media already compressed). Without the header servers
///   send identity; an answer encoded anyway is read as unknown (`sniff`).
///
/// - `traceparent`, `tracestate` and `baggage` go: a caller's trace
///   context means nothing to WeChat and would tell it internal ids
///   (wxgate continues the trace itself: docs/tracing.md).
///
/// `Host` is set per upstream ([`replace`]); wxgate's own `X-Wx-Account`
/// and `X-Wx-Caller` are taken off by the call's phases (whole too). One pass over the names,
/// which hop-by-hop stripping made anyway; nothing more for a call that
/// has none of these.
pub fn to_upstream(headers: &mut HeaderMap) {
    let present = strip(headers, request_bit);
    if present & AUTHORIZATION_BIT != 0 {
        headers.remove(header::AUTHORIZATION);
    }
    if present & ACCEPT_ENCODING_BIT != 0 {
        replace(headers, header::ACCEPT_ENCODING, HeaderValue::from_static("identity"));
    }
    if present & TRACE_BITS != 0 {
        for name in ["traceparent", "tracestate", "baggage"] {
            headers.remove(name);
        }
    }
}

/// Removes hop-by-hop headers (RFC 9110 §7.6.1), including those named by
/// `Connection`. Allocates nothing unless `Connection` names a header
/// outside the fixed list that the message has (most messages have none,
/// or `Connection: keep-alive` / `close`).
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    strip(headers, hop_by_hop_bit);
}

/// [`strip_hop_by_hop`], the names read by `bit`: returns the bits of
/// every name the message had (before stripping), hop-by-hop or not.
fn strip(headers: &mut HeaderMap, bit: fn(&str) -> u16) -> u16 {
    let mut seen = 0u16;
    for name in headers.keys() {
        seen |= bit(name.as_str());
    }
    let mut present = seen & !REQUEST_BITS;
    if present == 0 {
        return seen;
    }
    let mut listed: Vec<HeaderName> = Vec::new();
    if present & CONNECTION_BIT != 0 {
        for token in headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|t| !t.is_empty())
        {
            let bit = hop_by_hop_bit_any_case(token);
            if bit != 0 {
                present |= bit;
            } else if headers.contains_key(token) {
                if let Ok(name) = HeaderName::from_bytes(token.as_bytes()) {
                    listed.push(name);
                }
            }
        }
    }
    // Only the names the message has: `Connection: keep-alive` without a
    // `Keep-Alive` field (most answers) costs no lookup of an absent name.
    present &= seen;
    for (i, name) in HOP_BY_HOP.iter().enumerate() {
        if present & (1 << i) != 0 {
            headers.remove(name);
        }
    }
    for name in listed {
        headers.remove(name);
    }
    seen
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        h
    }

    /// The `match` of [`hop_by_hop_bit`] and the list it stands for agree,
    /// bit for bit, in either case.
    #[test]
    fn each_hop_by_hop_name_has_its_own_bit() {
        for (i, name) in HOP_BY_HOP.iter().enumerate() {
            assert_eq!(hop_by_hop_bit(name.as_str()), 1 << i, "{name}");
            assert_eq!(hop_by_hop_bit_any_case(&name.as_str().to_ascii_uppercase()), 1 << i, "{name}");
        }
        assert_eq!(HOP_BY_HOP[0], header::CONNECTION);
        assert_eq!(CONNECTION_BIT, 1);
        assert_eq!(hop_by_hop_bit("content-type"), 0);
    }

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_go_the_rest_stays() {
        let mut h = headers(&[
            ("content-type", "application/json"),
            ("connection", "Keep-Alive, X-Trace ,close"),
            ("connection", "upgrade"),
            ("keep-alive", "timeout=5"),
            ("x-trace", "1"),
            ("upgrade", "h2c"),
            ("te", "trailers"),
            ("proxy-connection", "keep-alive"),
            ("x-kept", "yes"),
        ]);
        strip_hop_by_hop(&mut h);
        let left: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, ["content-type", "x-kept"]);

        let mut plain = headers(&[("host", "a"), ("content-length", "3")]);
        strip_hop_by_hop(&mut plain);
        assert_eq!(plain.len(), 2, "nothing hop-by-hop: untouched");
    }

    #[test]
    fn every_field_of_a_rewritten_header_goes_to_upstream_at_most_once() {
        let mut h = headers(&[
            ("accept-encoding", "identity"),
            ("accept-encoding", "gzip"),
            ("authorization", "Basic b3JkZXJzOktFWQ=="),
            ("authorization", "Bearer KEY"),
            ("proxy-authorization", "Basic a"),
            ("proxy-authorization", "Basic b"),
            ("content-type", "application/json"),
        ]);
        to_upstream(&mut h);
        let left: Vec<_> = h.iter().map(|(k, v)| (k.as_str(), v.to_str().unwrap_or("?"))).collect();
        assert_eq!(left, [("accept-encoding", "identity"), ("content-type", "application/json")]);
        let mut none = headers(&[("content-type", "application/json")]);
        to_upstream(&mut none);
        assert_eq!(none.len(), 1, "no Accept-Encoding is added");
    }

    #[test]
    fn a_callers_trace_context_never_goes_to_wechat() {
        let mut h = headers(&[
            ("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            ("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4737-00f067aa0ba902b7-01"),
            ("tracestate", "vendor=internal-id"),
            ("baggage", "user.id=42"),
            ("content-type", "application/json"),
        ]);
        to_upstream(&mut h);
        let left: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, ["content-type"]);
    }
}
