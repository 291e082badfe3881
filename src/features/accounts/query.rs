//! Reading one parameter of a request's query string, as WeChat does:
//! `name=value` pairs separated by `&`, the value percent-decoded.

use std::borrow::Cow;

/// The value of the first `name=` parameter of `query`, percent-decoded
/// (`None` if absent or empty). Allocates only for a value with `%` escapes.
pub fn param<'q>(query: &'q str, name: &str) -> Option<Cow<'q, [u8]>> {
    let raw = query.split('&').find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))?;
    if raw.is_empty() {
        return None;
    }
    if !raw.contains('%') {
        return Some(Cow::Borrowed(raw.as_bytes()));
    }
    Some(Cow::Owned(percent_decode(raw.as_bytes())))
}

/// `%XX` escapes decoded; a `%` not followed by two hex digits stays as it is.
fn percent_decode(raw: &[u8]) -> Vec<u8> {
    let hex = |b: u8| (b as char).to_digit(16);
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        match (raw[i], raw.get(i + 1).copied().and_then(hex), raw.get(i + 2).copied().and_then(hex)) {
            (b'%', Some(hi), Some(lo)) => {
                out.push((hi * 16 + lo) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_exact_names_and_decodes_escapes() {
        let q = "component_access_token=C&access_token=A%2Bb%zz&appid=&x=1";
        assert_eq!(param(q, "access_token").as_deref(), Some(&b"A+b%zz"[..]));
        assert_eq!(param(q, "component_access_token").as_deref(), Some(&b"C"[..]));
        assert_eq!(param(q, "appid"), None, "empty");
        assert_eq!(param(q, "token"), None);
        assert_eq!(param("access_token", "access_token"), None, "no value");
        assert!(matches!(param("access_token=plain", "access_token"), Some(Cow::Borrowed(b"plain"))));
    }
}
