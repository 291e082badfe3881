//! Hop-by-hop headers (RFC 9110 §7.6.1): what no message passes on, both
//! ways. This runs for every header of every call.

use http::header::{self, HeaderMap, HeaderName};

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

/// Removes hop-by-hop headers (RFC 9110 §7.6.1), including those named by
/// `Connection`. Allocates nothing unless `Connection` names a header
/// outside the fixed list that the message has (most messages have none,
/// or `Connection: keep-alive` / `close`).
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let mut present = 0u16;
    for name in headers.keys() {
        present |= hop_by_hop_bit(name.as_str());
    }
    if present == 0 {
        return;
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
    for (i, name) in HOP_BY_HOP.iter().enumerate() {
        if present & (1 << i) != 0 {
            headers.remove(name);
        }
    }
    for name in listed {
        headers.remove(name);
    }
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
}
