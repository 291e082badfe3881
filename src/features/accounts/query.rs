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

/// The parameters that say whose quota a call spends or whose token it
/// gets: wxgate reads them, and so does WeChat. A query that gives one of
/// them twice, or spells its name other than plainly, might be read one
/// way by wxgate and another by WeChat, so it is refused ([`ambiguity`]).
pub const NAMES_READ: [&str; 8] = [
    "access_token",
    "component_access_token",
    "appid",
    "secret",
    "corpid",
    "corpsecret",
    "grant_type",
    "component_appid",
];

/// Why `query` (a URL query, or a form body) could be read two ways, if it
/// could: one of [`NAMES_READ`] given more than once (even empty), spelled
/// percent-encoded or in other letter case (`access%5Ftoken`,
/// `Access_Token`), or hidden after a `;` (which some servers take as a
/// separator). Costs one pass over the query, allocating nothing unless a
/// name has `%` escapes.
pub fn ambiguity(query: &str) -> Option<String> {
    let mut seen = [0u8; NAMES_READ.len()];
    for pair in query.split('&') {
        for (i, part) in pair.split(';').enumerate() {
            let name = part.split_once('=').map_or(part, |(n, _)| n);
            let Some(k) = read_name(name) else { continue };
            let plain = NAMES_READ[k];
            if i > 0 {
                return Some(format!("the query names {plain} after a \";\"; separate parameters with \"&\" only"));
            }
            if name != plain {
                return Some(format!("the query spells {plain} as \"{name}\"; write the name plainly"));
            }
            seen[k] += 1;
            if seen[k] > 1 {
                return Some(format!("the query gives {plain} more than once"));
            }
        }
    }
    None
}

/// Which of [`NAMES_READ`] a parameter name is, or would be once decoded
/// and lower-cased.
fn read_name(name: &str) -> Option<usize> {
    if let Some(k) = NAMES_READ.iter().position(|n| *n == name) {
        return Some(k);
    }
    // Only a name that could decode or fold into one is looked at further.
    if name.len() < 5 || !name.bytes().any(|b| b == b'%' || b == b'+' || b.is_ascii_uppercase()) {
        return None;
    }
    let decoded = percent_decode(name.as_bytes());
    let folded = String::from_utf8_lossy(&decoded).to_ascii_lowercase();
    NAMES_READ.iter().position(|n| *n == folded.trim())
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
    fn a_name_wechat_reads_given_twice_or_disguised_is_ambiguous() {
        for fine in ["", "access_token=T", "access_token=T&appid=a&secret=s&x=1&x=2", "token=a&my_appid=b", "a;b=c"] {
            assert_eq!(ambiguity(fine), None, "{fine}");
        }
        for (bad, says) in [
            ("access_token=&access_token=T", "gives access_token more than once"),
            ("access_token=JUNK&access_token=T", "gives access_token more than once"),
            ("appid=a&secret=s&appid=b", "gives appid more than once"),
            ("appid&appid=b", "gives appid more than once"),
            ("access%5Ftoken=T", "spells access_token as \"access%5Ftoken\""),
            ("x=1&Access_Token=T", "spells access_token as \"Access_Token\""),
            ("%61ppid=b", "spells appid"),
            ("x=1;access_token=T", "names access_token after a \";\""),
        ] {
            let found = ambiguity(bad).unwrap_or_default();
            assert!(found.contains(says), "{bad}: {found}");
        }
    }

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
