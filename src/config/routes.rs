//! Request path → rule.
//!
//! Patterns are exact (`/cgi-bin/token`) or segment prefixes
//! (`/cgi-bin/message/*`, which matches every path *below* `/cgi-bin/message/`,
//! never `/cgi-bin/messages`). An exact pattern beats every prefix; among
//! prefixes the longest wins. A path no pattern claims goes to the rule named
//! `default` when there is one, otherwise it is forwarded unthrottled.
//!
//! Only paths a WeChat API can have are routed at all ([`refusal`]): every
//! WeChat and WeCom server API path is lowercase ASCII letters, digits and
//! `_ - . /`, so anything else (uppercase, `;params`, `%` escapes, `\`,
//! spaces, control bytes), any empty segment and any segment ending in `.`
//! (`.`, `..`, `send.`, which some servers read as `send`) is refused with
//! 400 before a rule is looked up, never forwarded. Whether WeChat would treat
//! `/CGI-BIN/...`, `.../send%00` or `.../send.` as a throttled API is unknown;
//! refusing them means none of them can get around a limit either way. A
//! trailing `/` is the same API (`.../send/` is matched as `.../send`); a
//! suffix such as `.../send.json` is another path (the `default` rule, if any).
//!
//! Recovery APIs ([`RECOVERY`]: `clear_quota`, `clear_quota/v2`,
//! `openapi/quota/get`, `openapi/rid/get`) are matched by exact patterns
//! only ([`Routes::lookup`]): a prefix rule or the `default` rule never
//! claims them, so a penalty of those rules never blocks the calls an
//! operator needs to recover from it. A rule that names one exactly applies
//! its own limits (and only its own penalties) to it.
//!
//! Matching uses a normalised copy of the path (the bytes forwarded upstream
//! are never changed): the query is dropped, `%XX` escapes are decoded once
//! (so `%2F` is a slash), empty and `.` segments are dropped and `..` removes
//! the segment before it. Requests never get here with such paths (see
//! above); the normalisation stays for config patterns and as a second line.

use std::borrow::Cow;

use super::errors::Invalid;

// Keys are the config's patterns, never a client's, so a fast unkeyed hash is safe.
use rustc_hash::FxHashMap as HashMap;

/// The APIs an operator calls to recover from WeChat's limits: resetting
/// the account's counters, reading an API's quota, looking up a request id.
/// Only a rule naming one exactly applies to it (see the module docs).
pub const RECOVERY: [&str; 4] =
    ["/cgi-bin/clear_quota", "/cgi-bin/clear_quota/v2", "/cgi-bin/openapi/quota/get", "/cgi-bin/openapi/rid/get"];

/// One `match` entry of a rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Pattern {
    Exact(String),
    /// Normalised prefix without the trailing `/*`; `""` for `/*`.
    Prefix(String),
}

impl Pattern {
    pub fn parse(text: &str) -> Result<Pattern, Invalid> {
        if !text.starts_with('/') {
            return Err(Invalid::new("must start with /"));
        }
        let (body, prefix) = match text.strip_suffix("/*") {
            Some(body) => (body, true),
            None => (text, false),
        };
        if body.contains('*') {
            return Err(Invalid::new("* is only allowed as a final /* segment"));
        }
        if body.contains('?') || body.contains('%') {
            return Err(Invalid::new("give the plain path, without ? or % escapes"));
        }
        let norm = normalise(body);
        if norm != body || (body.is_empty() && !prefix) {
            return Err(Invalid::new(format!("is not a normalised path (did you mean \"{norm}\"?)")));
        }
        // A pattern no call path can have would never match: every call
        // with such a path is refused (400) before a rule is looked up.
        if body.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(Invalid::new(format!(
                "has uppercase letters, so it can never match: WeChat's API paths are lowercase, and wxgate refuses \
                 a call whose path has uppercase letters (400) before any rule is looked up; write \"{}\"",
                text.to_ascii_lowercase()
            )));
        }
        if let Some(why) = (!body.is_empty()).then(|| refusal(body)).flatten() {
            return Err(Invalid::new(format!("can never match: {why}")));
        }
        Ok(if prefix { Pattern::Prefix(norm) } else { Pattern::Exact(norm) })
    }

    fn describe(&self) -> String {
        match self {
            Pattern::Exact(p) => p.clone(),
            Pattern::Prefix(p) => format!("{p}/*"),
        }
    }
}

/// Compiled path table. Lookup costs one hash probe per path segment.
#[derive(Debug, Clone, Default)]
pub struct Routes {
    exact: HashMap<String, usize>,
    prefix: HashMap<String, usize>,
    default: Option<usize>,
}

impl Routes {
    /// Builds the table from `(pattern, rule index)` pairs. Fails with the
    /// pattern and the two rule indices when two rules claim one pattern.
    pub fn new(patterns: Vec<(Pattern, usize)>, default: Option<usize>) -> Result<Routes, (String, usize, usize)> {
        let mut routes = Routes { default, ..Routes::default() };
        for (pattern, rule) in patterns {
            let described = pattern.describe();
            let (map, key) = match pattern {
                Pattern::Exact(p) => (&mut routes.exact, p),
                Pattern::Prefix(p) => (&mut routes.prefix, p),
            };
            if let Some(&other) = map.get(&key) {
                if other != rule {
                    return Err((described, other, rule));
                }
            }
            map.insert(key, rule);
        }
        Ok(routes)
    }

    pub fn has_default(&self) -> bool {
        self.default.is_some()
    }

    /// The rule index for a request path (a query string, if any, is ignored).
    pub fn lookup(&self, path: &str) -> Option<usize> {
        let norm = normalised(path);
        if let Some(&rule) = self.exact.get(norm.as_ref()) {
            return Some(rule);
        }
        if RECOVERY.contains(&norm.as_ref()) {
            return None;
        }
        let mut end = norm.len();
        while let Some(cut) = norm[..end].rfind('/') {
            if let Some(&rule) = self.prefix.get(&norm[..cut]) {
                return Some(rule);
            }
            end = cut;
        }
        self.default
    }
}

const REFUSED: u8 = 0;
const NAME: u8 = 1;
const DOT: u8 = 2;
const SLASH: u8 = 3;

/// The class of every byte in a request path: `a-z 0-9 _ -`, `.`, `/`, or refused.
static PATH_BYTES: [u8; 256] = {
    let mut t = [REFUSED; 256];
    let mut b = 0;
    while b < 256 {
        t[b] = match b as u8 {
            b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' => NAME,
            b'.' => DOT,
            b'/' => SLASH,
            _ => REFUSED,
        };
        b += 1;
    }
    t
};

/// Why `path` (the request path, without its query) cannot be a WeChat API
/// path, or `None` when it can: a byte scan for anything outside
/// `a-z 0-9 _ - . /`, and for empty (`//`) segments and segments ending in
/// `.` (`.`, `..`, `send.`: servers differ on whether `send.` is `send`).
/// A single trailing `/` is allowed. Costs one pass over the path's bytes.
pub fn refusal(path: &str) -> Option<&'static str> {
    const ALPHABET: &str =
        "this path is not a WeChat API path: WeChat's API paths are only a-z 0-9 _ - . / (no uppercase, escapes, ; or \\)";
    const SEGMENT: &str =
        "this path is not a WeChat API path: it has an empty segment, or one ending in . (., .., send.)";
    let bytes = path.as_bytes();
    if bytes.first() != Some(&b'/') {
        return Some("this path is not a WeChat API path: it must start with /");
    }
    // One pass over a byte-class table (this runs for every call): the
    // class of the byte before, a `/` at the start.
    let mut before = SLASH;
    for &c in &bytes[1..] {
        let class = PATH_BYTES[c as usize];
        match class {
            NAME | DOT => {}
            SLASH if matches!(before, SLASH | DOT) => return Some(SEGMENT),
            SLASH => {}
            _ => return Some(ALPHABET),
        }
        before = class;
    }
    // A trailing `/` (an empty last segment) is the same API.
    (before == DOT).then_some(SEGMENT)
}

/// Like [`normalise`], without a copy when the path is normal already
/// (the common case: no query, escape, empty, `.` or `..` segment).
pub fn normalised(path: &str) -> Cow<'_, str> {
    if is_normal(path.as_bytes()) {
        Cow::Borrowed(path)
    } else {
        Cow::Owned(normalise(path))
    }
}

/// Whether [`normalise`] would return `path` unchanged: it starts with `/`,
/// has no `%` nor `?`, and every segment after a `/` is neither empty (no
/// trailing nor double `/`), `.` nor `..`. One pass over the bytes.
fn is_normal(path: &[u8]) -> bool {
    if path.len() < 2 || path[0] != b'/' {
        return false;
    }
    // The segment since the last `/`: its length, and whether it is dots
    // only (`.`, `..` are refused; `...` is a name).
    let (mut len, mut dots) = (0usize, true);
    for &b in &path[1..] {
        match b {
            b'%' | b'?' => return false,
            b'/' if len == 0 || (dots && len <= 2) => return false,
            b'/' => (len, dots) = (0, true),
            b'.' => len += 1,
            _ => (len, dots) = (len + 1, false),
        }
    }
    len > 0 && !(dots && len <= 2)
}

/// The path used for matching: see the module docs. Always starts with `/`
/// unless it is the root, which normalises to `""`.
pub fn normalise(path: &str) -> String {
    let path = path.split_once('?').map_or(path, |(p, _)| p);
    let decoded = percent_decode(path);
    let mut segments: Vec<&str> = Vec::new();
    for seg in decoded.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    let mut out = String::with_capacity(path.len());
    for s in segments {
        out.push('/');
        out.push_str(s);
    }
    out
}

fn percent_decode(s: &str) -> String {
    if !s.contains('%') {
        return s.to_owned();
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push(h * 16 + l);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Routes {
        let p = |s: &str| Pattern::parse(s).expect("pattern");
        Routes::new(
            vec![
                (p("/cgi-bin/token"), 0),
                (p("/cgi-bin/message/*"), 1),
                (p("/cgi-bin/message/custom/send"), 2),
                (p("/cgi-bin/message/mass/*"), 3),
            ],
            Some(9),
        )
        .expect("routes")
    }

    #[test]
    fn most_specific_pattern_wins() {
        let r = table();
        assert_eq!(r.lookup("/cgi-bin/token?grant_type=client_credential"), Some(0));
        assert_eq!(r.lookup("/cgi-bin/message/custom/send"), Some(2));
        assert_eq!(r.lookup("/cgi-bin/message/custom/typing"), Some(1));
        assert_eq!(r.lookup("/cgi-bin/message/mass/sendall"), Some(3));
        assert_eq!(r.lookup("/cgi-bin/messages"), Some(9));
        assert_eq!(r.lookup("/cgi-bin/message"), Some(9));
    }

    #[test]
    fn tricks_do_not_escape_the_rule() {
        let r = table();
        assert_eq!(r.lookup("/cgi-bin/message/custom/send/../../../token"), Some(0));
        assert_eq!(r.lookup("//cgi-bin//message/custom/./send"), Some(2));
        assert_eq!(r.lookup("/cgi-bin/message%2Fcustom%2fsend"), Some(2));
        assert_eq!(r.lookup("/cgi-bin/%74oken"), Some(0));
        assert_eq!(r.lookup("/../../cgi-bin/token"), Some(0));
    }

    #[test]
    fn only_paths_a_wechat_api_can_have_pass() {
        for ok in ["/cgi-bin/token", "/cgi-bin/message/custom/send/", "/wxa/send.json", "/", "/a-b_c/1.2"] {
            assert_eq!(refusal(ok), None, "{ok}");
        }
        for bad in [
            "/CGI-BIN/token",
            "/cgi-bin/message/custom/Send",
            "/cgi-bin/message/custom/send;x",
            "/cgi-bin/message/custom/send%00",
            "/cgi-bin/message/custom\\send",
            "/cgi-bin/message/custom/send ",
            "/cgi-bin/message/custom/send\u{7f}",
            "/cgi-bin/message/custom/s\u{e9}nd",
            "//cgi-bin/token",
            "/cgi-bin//token",
            "/cgi-bin/./token",
            "/cgi-bin/x/../token",
            "/cgi-bin/token/.",
            "/cgi-bin/token//",
            "/cgi-bin/token.",
            "/cgi-bin/token./",
            "/cgi-bin./token",
            "/cgi-bin/token...",
            "cgi-bin/token",
            "",
        ] {
            assert!(refusal(bad).is_some(), "{bad:?}");
        }
    }

    #[test]
    fn bad_patterns_are_refused() {
        assert!(Pattern::parse("cgi-bin/token").is_err());
        assert!(Pattern::parse("/cgi-bin/*/send").is_err());
        assert!(Pattern::parse("/cgi-bin//token").is_err());
        assert!(Pattern::parse("/cgi-bin/token/").is_err());
        assert_eq!(Pattern::parse("/*"), Ok(Pattern::Prefix(String::new())));
    }

    #[test]
    fn two_rules_on_one_pattern_conflict() {
        let p = |s: &str| Pattern::parse(s).expect("pattern");
        let err = Routes::new(vec![(p("/a/*"), 0), (p("/a/*"), 1)], None).expect_err("conflict");
        assert_eq!(err, ("/a/*".to_string(), 0, 1));
    }

    proptest::proptest! {
        /// The no-copy fast path never changes which path is matched.
        #[test]
        fn normalised_is_normalise(path in "[/a.%?2Fb]{0,12}") {
            let (fast, slow) = (normalised(&path).into_owned(), normalise(&path));
            proptest::prop_assert_eq!(fast, slow);
        }
    }
}
