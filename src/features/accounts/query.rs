//! Reading one parameter of a request's query string, as WeChat does:
//! `name=value` pairs separated by `&`, the value percent-decoded.

use std::borrow::Cow;

/// Why a query could be read two ways (by wxgate one way, by WeChat
/// another): refused (400) rather than guessed at.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Ambiguous {
    /// [`once`]'s name given more than once, or spelled otherwise.
    #[error("the query gives \"{0}\" more than once or spelled otherwise: refused as ambiguous")]
    Once(String),
    /// A name with a `%` escape or a `+` ([`scan`]).
    #[error(
        "a parameter name in the query has a %-escape or a +: names are read one way only when written plainly \
         (WeChat's are a-z and _)"
    )]
    Escaped,
    /// One of [`NAMES_READ`] after a `;`.
    #[error("the query names {0} after a \";\"; separate parameters with \"&\" only")]
    AfterSemicolon(&'static str),
    /// One of [`NAMES_READ`] in other letter case.
    #[error("the query spells {plain} as \"{given}\"; write the name plainly")]
    Spelled { plain: &'static str, given: String },
    /// One of [`NAMES_READ`] given more than once.
    #[error("the query gives {0} more than once")]
    Twice(&'static str),
}

/// A query wxgate cannot read one way only is a bad request (400).
impl From<Ambiguous> for crate::error::ProxyError {
    fn from(e: Ambiguous) -> crate::error::ProxyError {
        crate::error::ProxyError::BadRequest(e.to_string())
    }
}

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

/// The value of `name` in `query` when wxgate and WeChat can only read it
/// one way: `Err` if it is given more than once (even empty), or spelled
/// percent-encoded or in other letter case ([`scan`]'s rule, for a name
/// only some APIs read, such as a ticket's `type`).
pub fn once<'q>(query: &'q str, name: &str) -> Result<Option<Cow<'q, [u8]>>, Ambiguous> {
    let mut found = None;
    for pair in query.split(['&', ';']) {
        let raw_name = pair.split('=').next().unwrap_or("");
        let decoded = percent_decode(raw_name.as_bytes());
        if !decoded.eq_ignore_ascii_case(name.as_bytes()) {
            continue;
        }
        if raw_name != name || found.is_some() {
            return Err(Ambiguous::Once(name.to_owned()));
        }
        found = Some(pair.split_once('=').map_or("", |(_, v)| v));
    }
    Ok(found.filter(|v| !v.is_empty()).map(decoded))
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

/// What a query gives of the names wxgate reads: the raw (still
/// percent-encoded) values of its tokens, each given at most once.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Scanned<'q> {
    pub access_token: Option<&'q str>,
    pub component_access_token: Option<&'q str>,
}

/// Reads `query` (a URL query, or a form body) in one pass: its tokens, or
/// why it could be read two ways: one of [`NAMES_READ`] given more than
/// once (even empty), spelled in other letter case (`Access_Token`), or
/// hidden after a `;` (which some servers take as a separator); or any
/// parameter name with a `%` escape or a `+` (`access%5Ftoken`,
/// `access_token%00`: parsers differ on what such a name is). Allocates
/// nothing unless a name has uppercase letters.
pub fn scan(query: &str) -> Result<Scanned<'_>, Ambiguous> {
    let bytes = query.as_bytes();
    let mut out = Scanned::default();
    let mut seen = 0u16;
    let (mut start, mut after_semicolon) = (0, false);
    loop {
        let end = memchr::memchr2(b'&', b';', &bytes[start..]).map_or(bytes.len(), |i| start + i);
        let part = &query[start..end];
        let (name, value) = match memchr::memchr(b'=', part.as_bytes()) {
            Some(i) => (&part[..i], &part[i + 1..]),
            None => (part, ""),
        };
        let read = match read_name(name) {
            Name::Escaped => return Err(Ambiguous::Escaped),
            Name::Read(k) => Some(k),
            Name::Other => None,
        };
        if let Some(k) = read {
            let plain = NAMES_READ[k];
            if after_semicolon {
                return Err(Ambiguous::AfterSemicolon(plain));
            }
            if name != plain {
                return Err(Ambiguous::Spelled { plain, given: name.to_owned() });
            }
            if seen & (1 << k) != 0 {
                return Err(Ambiguous::Twice(plain));
            }
            seen |= 1 << k;
            let value = (!value.is_empty()).then_some(value);
            match k {
                0 => out.access_token = value,
                1 => out.component_access_token = value,
                _ => {}
            }
        }
        if end == bytes.len() {
            return Ok(out);
        }
        after_semicolon = bytes[end] == b';';
        start = end + 1;
    }
}

/// Why a form body could be read two ways, if it could ([`scan`]).
pub fn ambiguity(form: &str) -> Option<Ambiguous> {
    scan(form).err()
}

/// A raw value percent-decoded (borrowed when it has no escapes).
/// `value` as a query value: unreserved characters as they are, the rest %XX.
pub fn encoded(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    encode_into(&mut out, value);
    out
}

/// [`encoded`], appended to `out`.
pub fn encode_into(out: &mut String, value: &str) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push('%');
            out.push(HEX[usize::from(b >> 4)] as char);
            out.push(HEX[usize::from(b & 15)] as char);
        }
    }
}

pub fn decoded(raw: &str) -> Cow<'_, [u8]> {
    if raw.contains('%') {
        Cow::Owned(percent_decode(raw.as_bytes()))
    } else {
        Cow::Borrowed(raw.as_bytes())
    }
}

/// What a parameter name is to [`scan`].
enum Name {
    /// One of [`NAMES_READ`], or one once decoded and lower-cased.
    Read(usize),
    /// A name with a `%` escape or a `+` (a space in a form): parsers
    /// differ on what such a name is (`access_token%00` may be
    /// `access_token`, `access_token\0` or refused), so none is guessed.
    Escaped,
    Other,
}

/// Which of [`NAMES_READ`] a parameter name is, or would be once
/// lower-cased; or that it is written with escapes. One pass over the
/// name's bytes, only for a name that is not plainly one of them.
fn read_name(name: &str) -> Name {
    if let Some(k) = NAMES_READ.iter().position(|n| *n == name) {
        return Name::Read(k);
    }
    let mut upper = false;
    for b in name.bytes() {
        match b {
            b'%' | b'+' => return Name::Escaped,
            b'A'..=b'Z' => upper = true,
            _ => {}
        }
    }
    if !upper || name.len() < 5 {
        return Name::Other;
    }
    let folded = name.to_ascii_lowercase();
    NAMES_READ.iter().position(|n| *n == folded.trim()).map_or(Name::Other, Name::Read)
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
    fn a_scan_finds_both_tokens_raw() {
        let scanned = scan("a=1&access_token=A%2B&component_access_token=C").expect("plain");
        assert_eq!((scanned.access_token, scanned.component_access_token), (Some("A%2B"), Some("C")));
        assert_eq!(&*decoded("A%2B"), b"A+");
        assert_eq!(scan("access_token=&x").expect("plain").access_token, None, "empty");
        assert_eq!(scan("").expect("empty"), Scanned::default());
    }

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
            ("access%5Ftoken=T", "has a %-escape"),
            ("access_token%00=T", "has a %-escape"),
            ("x%5B%5D=1&access_token=T", "has a %-escape"),
            ("access_token+=T", "has a %-escape or a +"),
            ("x=1&Access_Token=T", "spells access_token as \"Access_Token\""),
            ("%61ppid=b", "has a %-escape"),
            ("x=1;access_token=T", "names access_token after a \";\""),
        ] {
            let found = ambiguity(bad).map(|e| e.to_string()).unwrap_or_default();
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
