//! Property tests of the parts that read untrusted or hand-written input:
//! the path matcher, the config loader and the errcode sniffer. Each must
//! never panic, and must keep its stated guarantees on random input.

use std::path::Path;

use proptest::prelude::*;
use proptest::sample::Index;
use wxgate::config::routes::{normalise, Pattern, Routes};
use wxgate::config::Config;
use wxgate::limit::{Limit, WindowLimit};
use wxgate::transport::sniff::errcode;

// --- the path matcher -----------------------------------------------------------

/// Segments that real patterns use, so generated paths often hit a rule.
const WORDS: [&str; 10] = ["cgi-bin", "message", "custom", "send", "token", "mass", "sendall", "wxa", "sns", "中文"];

/// One ordinary path segment: never empty, `.` or `..`, and without `/ % ?`.
fn segment() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => proptest::sample::select(&WORDS[..]).prop_map(str::to_owned),
        1 => "[a-zA-Z0-9_.~é-]{1,6}".prop_filter("not a dot segment", |s| s != "." && s != ".."),
    ]
}

fn segments(max: usize) -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(segment(), 0..max)
}

/// One segment a pattern may have: a WeChat API path's alphabet only
/// (`a-z 0-9 _ - .`, not ending in `.`); a pattern with anything else
/// could never match a call (such calls get 400) and is refused.
fn pattern_segment() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => proptest::sample::select(&WORDS[..WORDS.len() - 1]).prop_map(str::to_owned),
        1 => "[a-z0-9_-]([a-z0-9_.-]{0,4}[a-z0-9_-])?",
    ]
}

fn pattern_segments(max: usize) -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(pattern_segment(), 0..max)
}

fn join(segs: &[String]) -> String {
    segs.iter().map(|s| format!("/{s}")).collect()
}

/// A route table of up to 8 random exact and prefix patterns over [`WORDS`],
/// and maybe a default rule. Returns the table and how many rules it has.
fn table() -> impl Strategy<Value = (Routes, usize)> {
    (prop::collection::vec((pattern_segments(4), any::<bool>()), 0..8), any::<bool>()).prop_map(
        |(entries, with_default)| {
            let mut seen = std::collections::HashSet::new();
            let mut patterns = Vec::new();
            for (segs, prefix) in entries {
                let text = if prefix { format!("{}/*", join(&segs)) } else { join(&segs) };
                if text.is_empty() || !seen.insert(text.clone()) {
                    continue;
                }
                let pattern = Pattern::parse(&text).unwrap_or_else(|e| panic!("pattern {text:?}: {e}"));
                patterns.push((pattern, patterns.len()));
            }
            let rules = patterns.len() + usize::from(with_default);
            let default = with_default.then_some(patterns.len());
            (Routes::new(patterns, default).expect("no pattern is claimed twice"), rules)
        },
    )
}

/// What can be slipped in between two segments without changing the path a
/// decoding server sees: an empty segment (`//`), `.`, or a `seg/..` detour.
#[derive(Debug, Clone)]
enum Junk {
    Empty,
    Dot,
    Detour(String),
}

fn junk() -> impl Strategy<Value = Junk> {
    prop_oneof![Just(Junk::Empty), Just(Junk::Dot), segment().prop_map(Junk::Detour)]
}

/// `segs` as a path with `inserts` (position, junk) slipped in, and maybe a trailing slash.
fn with_junk(segs: &[String], inserts: &[(Index, Junk)], trailing_slash: bool) -> String {
    let mut parts: Vec<String> = segs.to_vec();
    for (at, j) in inserts {
        let pos = at.index(parts.len() + 1);
        let extra = match j {
            Junk::Empty => String::new(),
            Junk::Dot => ".".to_owned(),
            Junk::Detour(s) => format!("{s}/.."),
        };
        parts.insert(pos, extra);
    }
    let mut out: String = parts.iter().map(|s| format!("/{s}")).collect();
    if trailing_slash || out.is_empty() {
        out.push('/');
    }
    out
}

/// `path` with the characters chosen by `mask` written as `%XX` escapes of
/// their UTF-8 bytes (hex digits in either case).
fn percent_encode(path: &str, mask: &[bool], upper: bool) -> String {
    let mut out = String::new();
    for (i, c) in path.chars().enumerate() {
        if mask.get(i % mask.len().max(1)).copied().unwrap_or(false) {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                if upper {
                    out.push_str(&format!("%{b:02X}"));
                } else {
                    out.push_str(&format!("%{b:02x}"));
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Strings rich in what the matcher treats specially: slashes, dots, `%`
/// escapes (valid, truncated, invalid, non-UTF-8), `?`, and multibyte text.
fn tricky() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            Just("/".to_owned()),
            Just(".".to_owned()),
            Just("..".to_owned()),
            Just("?".to_owned()),
            Just("%".to_owned()),
            "%[0-9a-fA-FgG]{0,2}",
            "%[89a-fA-F][0-9a-fA-F]",
            Just("%2F".to_owned()),
            Just("%2e".to_owned()),
            Just("%25".to_owned()),
            Just("%E4%B8".to_owned()),
            Just("中".to_owned()),
            Just("\u{0}".to_owned()),
            "[a-z]{1,3}",
        ],
        0..24,
    )
    .prop_map(|parts| parts.concat())
}

fn is_normal_form(n: &str) -> bool {
    n.is_empty() || (n.starts_with('/') && n.split('/').skip(1).all(|seg| !seg.is_empty() && seg != "." && seg != ".."))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever comes in, the normal form has no empty, `.` or `..` segment
    /// (so no `//`, `/./`, `/../`, no trailing slash), and starts with `/`.
    #[test]
    fn normal_form_has_no_empty_or_dot_segments(path in prop_oneof![tricky(), any::<String>()]) {
        let n = normalise(&path);
        prop_assert!(is_normal_form(&n), "{:?} -> {:?}", path, n);
        prop_assert!(!n.contains("//") && !n.contains("/./") && !n.contains("/../"), "{:?} -> {:?}", path, n);
    }

    /// Normalising twice changes nothing, for any path whose normal form has
    /// no `%` or `?` left (those come from decoding `%25` and `%3F`, which is
    /// done once, as the upstream does: see `double_encoding_is_decoded_once`).
    #[test]
    fn normalise_is_idempotent(path in prop_oneof![tricky(), any::<String>(), "[/.a-c]{0,20}"]) {
        let once = normalise(&path);
        if !once.contains('%') && !once.contains('?') {
            prop_assert_eq!(normalise(&once), once);
        }
    }

    /// Paths written without `%` and `?` are normalised idempotently, always.
    #[test]
    fn normalise_is_idempotent_on_plain_paths(segs in segments(6), inserts in prop::collection::vec((any::<Index>(), junk()), 0..6), slash in any::<bool>()) {
        let path = with_junk(&segs, &inserts, slash);
        let once = normalise(&path);
        prop_assert_eq!(normalise(&once), once.clone());
        prop_assert_eq!(once, join(&segs));
    }

    /// `//`, `/./` and `seg/../` detours anywhere in a path never change its rule.
    #[test]
    fn junk_segments_do_not_change_the_rule((routes, _) in table(), segs in segments(6),
                                            inserts in prop::collection::vec((any::<Index>(), junk()), 1..6),
                                            slash in any::<bool>(), query in "(\\?[a-z=&/.%]{0,12})?") {
        let plain = join(&segs);
        let tricked = format!("{}{query}", with_junk(&segs, &inserts, slash));
        prop_assert_eq!(routes.lookup(&tricked), routes.lookup(&plain), "{:?} vs {:?}", tricked, plain);
    }

    /// Percent-encoding any subset of a path's characters (slashes and dots
    /// included) never changes its rule.
    #[test]
    fn percent_encoding_does_not_change_the_rule((routes, _) in table(), segs in segments(6),
                                                  inserts in prop::collection::vec((any::<Index>(), junk()), 0..4),
                                                  mask in prop::collection::vec(any::<bool>(), 1..40), upper in any::<bool>()) {
        let path = with_junk(&segs, &inserts, false);
        let encoded = percent_encode(&path, &mask, upper);
        prop_assert_eq!(routes.lookup(&encoded), routes.lookup(&join(&segs)), "{:?} vs {:?}", encoded, path);
    }

    /// Lookup never panics, and answers a rule of the table or none.
    #[test]
    fn lookup_never_panics((routes, rules) in table(), path in prop_oneof![tricky(), any::<String>()]) {
        if let Some(i) = routes.lookup(&path) {
            prop_assert!(i < rules);
        }
    }

    /// Every exact pattern of the table, and every path below a prefix
    /// pattern, finds a rule.
    #[test]
    fn patterns_find_their_rule(segs in prop::collection::vec(pattern_segment(), 1..4), below in segments(3)) {
        let exact = join(&segs);
        let p = |s: &str| Pattern::parse(s).expect("pattern");
        let routes = Routes::new(vec![(p(&exact), 0), (p(&format!("{exact}/*")), 1)], None).expect("routes");
        prop_assert_eq!(routes.lookup(&exact), Some(0));
        let under = format!("{exact}{}", join(&below));
        let want = if below.is_empty() { Some(0) } else { Some(1) };
        prop_assert_eq!(routes.lookup(&under), want, "{:?}", under);
    }
}

#[test]
fn double_encoding_is_decoded_once() {
    // `%2573` is `%73` after one decoding, which is what WeChat sees: not `s`.
    assert_eq!(normalise("/cgi-bin/message/custom/%2573end"), "/cgi-bin/message/custom/%73end");
    assert_eq!(normalise("/cgi-bin/message/custom/%73end"), "/cgi-bin/message/custom/send");
    // A decoded `?` is part of the path, not the start of a query.
    assert_eq!(normalise("/a%3Fb"), "/a?b");
}

// --- the config loader ----------------------------------------------------------

const LABEL: &str = "x.toml";

fn parse(text: &str) -> Result<Config, String> {
    Config::parse(text, Path::new(LABEL)).map_err(|e| e.to_string())
}

fn shipped_rules() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("rules.toml");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Fragments of TOML and of wxgate's keys and values, to build texts that
/// get past the TOML parser more often than random characters do.
fn toml_soup() -> impl Strategy<Value = String> {
    let pieces: Vec<&'static str> = vec![
        "[server]\n",
        "[store]\n",
        "[[rule]]\n",
        "[[penalty]]\n",
        "name = \"r\"\n",
        "name = \"default\"\n",
        "name = \"bad name\"\n",
        "match = [\"/cgi-bin/token\"]\n",
        "match = [\"/a/*\", \"/a/*\"]\n",
        "match = [\"/a//b\"]\n",
        "limits = [{ count = 1, per = \"1s\" }]\n",
        "limits = [{ count = 0, per = \"day\" }]\n",
        "limits = [{ count = 5, per = \"1m\", burst = 6 }]\n",
        "limits = [{ count = 18446744073709551615, per = \"1ms\" }]\n",
        "limits = []\n",
        "max_wait = \"6m\"\n",
        "warmup = \"99999999999h\"\n",
        "concurrency = 0\n",
        "errcode = 45009\n",
        "seconds = 0\n",
        "seconds = 18446744073709551615\n",
        "until = \"next_minute\"\n",
        "max_seconds = 1\n",
        "kind = \"redis\"\n",
        "kind = \"memory\"\n",
        "timeout = \"0s\"\n",
        "lease = \"1ms\"\n",
        "url = \"redis://127.0.0.1:1\"\n",
        "listen = \"nope\"\n",
        "upstream = \"http://127.0.0.1:1/base\"\n",
        "upstream = \"ftp://x\"\n",
        "quota_timezone = \"+14:59\"\n",
        "quota_timezone = \"-99:00\"\n",
        "max_body = \"0\"\n",
        "max_body = \"99999999999GiB\"\n",
        "header_timeout = \"0s\"\n",
        "body_timeout = \"0s\"\n",
        "upstream_timeout = \"1 fortnight\"\n",
        "= ",
        "\"",
        "'''",
        "{",
        "}",
        "[",
        "]",
        ",",
        "\n",
        "é",
        "#",
    ];
    prop::collection::vec(proptest::sample::select(pieces), 0..30).prop_map(|p| p.concat())
}

/// One edit of a text: delete a range, or insert a fragment.
#[derive(Debug, Clone)]
enum Edit {
    Delete(Index, usize),
    Insert(Index, String),
    /// Replace a run of digits with another number.
    Number(Index, String),
    /// Replace the inside of a quoted string with another value.
    Quoted(Index, String),
}

/// Values that are valid somewhere in the config, or nearly.
const QUOTED: [&str; 24] = [
    "",
    "0s",
    "1ms",
    "999ms",
    "1s",
    "6m",
    "-1s",
    "99999999999999h",
    "1 fortnight",
    "next_minute",
    "day",
    "month",
    "week",
    "/a/*",
    "/*",
    "/a/*/b",
    "/a/../b",
    "/a%2Fb",
    "+99:00",
    "-14:00",
    "redis",
    "1GiB",
    "0B",
    "中",
];

fn edit() -> impl Strategy<Value = Edit> {
    // Value edits mostly keep the TOML valid, so the checks after parsing
    // are reached; byte edits mostly break the syntax.
    prop_oneof![
        1 => (any::<Index>(), 1usize..40).prop_map(|(at, n)| Edit::Delete(at, n)),
        1 => (any::<Index>(), prop_oneof![toml_soup(), any::<String>(), "[\\[\\]{}=,\"'\n #.0-9a-z_*/]{1,4}"])
            .prop_map(|(at, s)| Edit::Insert(at, s)),
        3 => (any::<Index>(), prop_oneof!["[0-9]{1,25}", Just("-1".to_owned()), Just("0".to_owned())])
            .prop_map(|(at, s)| Edit::Number(at, s)),
        3 => (any::<Index>(), proptest::sample::select(&QUOTED[..]))
            .prop_map(|(at, s)| Edit::Quoted(at, s.to_owned())),
    ]
}

/// Applies `edits` to the bytes of `text`; invalid UTF-8 is replaced, as a
/// file read lossily would be.
fn mutate(text: &str, edits: &[Edit]) -> String {
    let mut bytes = text.as_bytes().to_vec();
    for e in edits {
        match e {
            Edit::Delete(at, n) => {
                let start = at.index(bytes.len() + 1).min(bytes.len());
                let end = (start + n).min(bytes.len());
                bytes.drain(start..end);
            }
            Edit::Insert(at, s) => {
                let pos = at.index(bytes.len() + 1);
                bytes.splice(pos..pos, s.bytes());
            }
            Edit::Number(at, s) => {
                let digits: Vec<usize> = (0..bytes.len()).filter(|&i| bytes[i].is_ascii_digit()).collect();
                if digits.is_empty() {
                    continue;
                }
                let start = digits[at.index(digits.len())];
                let end = (start..bytes.len()).find(|&i| !bytes[i].is_ascii_digit()).unwrap_or(bytes.len());
                bytes.splice(start..end, s.bytes());
            }
            Edit::Quoted(at, s) => {
                let quotes: Vec<usize> = (0..bytes.len()).filter(|&i| bytes[i] == b'"').collect();
                if quotes.len() < 2 {
                    continue;
                }
                let pair = at.index(quotes.len() / 2) * 2;
                bytes.splice(quotes[pair] + 1..quotes[pair + 1], s.bytes());
            }
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Checks what `wxgate check` relies on, for a config that parsed.
fn check_invariants(c: &Config) -> Result<(), TestCaseError> {
    for rule in &c.rules {
        prop_assert!(!rule.name.is_empty() && rule.name.len() <= 64);
        prop_assert!(rule.max_wait_us >= 0 && rule.max_wait_us <= 300_000_000, "{}: max_wait", rule.name);
        prop_assert!(rule.warmup_us >= 0, "{}: warmup", rule.name);
        prop_assert!(rule.warmup_us <= c.max_warmup_us);
        let mut keys = std::collections::HashSet::new();
        for limit in &rule.limits {
            prop_assert!(keys.insert(limit.window_key()), "{}: two limits share a window", rule.name);
            match limit {
                Limit::Window(w) => {
                    prop_assert!(
                        w.burst() >= 1 && w.burst() <= w.count(),
                        "{}: burst {} count {}",
                        rule.name,
                        w.burst(),
                        w.count()
                    );
                    prop_assert!(w.count() <= 1_000_000_000);
                    prop_assert!(w.per_us() >= 1_000_000);
                    prop_assert!(w.interval_us() >= 1, "{}: interval", rule.name);
                    prop_assert!(w.tolerance_us() >= 0, "{}: tolerance", rule.name);
                    prop_assert!(w.refill_per_second().is_finite());
                }
                Limit::Calendar { count, .. } => prop_assert!(count.get() >= 1 && count.get() <= 1_000_000_000),
            }
        }
    }
    let mut errcodes = std::collections::HashSet::new();
    for p in &c.penalties {
        prop_assert!(errcodes.insert(p.errcode), "errcode {} twice", p.errcode);
    }
    prop_assert_eq!(c.domains[0].routes.has_default(), c.rules.iter().any(|r| &*r.name == "default"));
    prop_assert!(c.server.max_body > 0);
    prop_assert!(!c.server.header_timeout.is_zero());
    prop_assert!(!c.server.body_timeout.is_zero());
    Ok(())
}

/// A window limit as generated: `per` text, its length in µs, count, burst.
#[derive(Debug, Clone)]
struct GenWindow {
    per: &'static str,
    per_us: i64,
    count: u64,
    burst: Option<u64>,
}

#[derive(Debug, Clone)]
struct GenRule {
    name: String,
    patterns: Vec<String>,
    windows: Vec<GenWindow>,
    calendars: Vec<(&'static str, u64)>,
    max_wait: Option<&'static str>,
    warmup: Option<&'static str>,
    concurrency: Option<u32>,
}

/// Distinct window lengths (each in its own spelling), 1 s to 31 days.
const WINDOWS: [(&str, i64); 7] = [
    ("1s", 1_000_000),
    ("1500ms", 1_500_000),
    ("10s", 10_000_000),
    ("1m", 60_000_000),
    ("90s", 90_000_000),
    ("1h", 3_600_000_000),
    ("31days", 31 * 86_400_000_000),
];

fn gen_window(per: &'static str, per_us: i64) -> impl Strategy<Value = GenWindow> {
    (1u64..=1_000_000_000, any::<bool>(), any::<Index>()).prop_map(move |(count, with_burst, b)| GenWindow {
        per,
        per_us,
        count,
        // A window of whole days needs its burst (else it reads as a calendar quota written wrong).
        burst: (with_burst || per_us % 86_400_000_000 == 0)
            .then(|| 1 + b.index(usize::try_from(count).unwrap_or(usize::MAX)) as u64),
    })
}

fn gen_rule(index: usize, default: bool) -> impl Strategy<Value = GenRule> {
    let windows = proptest::sample::subsequence(WINDOWS.to_vec(), 0..=3)
        .prop_flat_map(|pers| pers.into_iter().map(|(per, us)| gen_window(per, us)).collect::<Vec<_>>());
    let calendars = proptest::sample::subsequence(vec!["day", "month"], 0..=2)
        .prop_flat_map(|pers| pers.into_iter().map(|p| (Just(p), 1u64..=1_000_000_000)).collect::<Vec<_>>());
    let patterns = prop::collection::vec((pattern_segments(3), any::<bool>()), if default { 0..2 } else { 1..4 });
    (
        patterns,
        windows,
        calendars,
        proptest::option::of(proptest::sample::select(vec!["0s", "250ms", "2s", "5m"])),
        proptest::option::of(proptest::sample::select(vec!["1s", "30s", "1h", "31days"])),
        proptest::option::of(1u32..=1000),
    )
        .prop_map(move |(pats, windows, calendars, max_wait, warmup, concurrency)| {
            // A unique first segment per rule keeps every pattern unique.
            let patterns = pats
                .into_iter()
                .enumerate()
                .map(|(j, (segs, prefix))| {
                    let p = format!("/r{index}p{j}{}", join(&segs));
                    if prefix {
                        format!("{p}/*")
                    } else {
                        p
                    }
                })
                .collect();
            let name = if default { "default".to_owned() } else { format!("rule_{index}-x") };
            GenRule { name, patterns, windows, calendars, max_wait, warmup, concurrency }
        })
}

fn gen_rules() -> impl Strategy<Value = Vec<GenRule>> {
    (0usize..6, any::<bool>()).prop_flat_map(|(n, with_default)| {
        (0..n + usize::from(with_default)).map(|i| gen_rule(i, with_default && i == n)).collect::<Vec<_>>()
    })
}

fn render(rules: &[GenRule], server: &str, penalties: &str) -> String {
    let mut out = format!("[server]\nlisten = \"127.0.0.1:0\"\n{server}\n{penalties}\n");
    for r in rules {
        out.push_str(&format!("[[rule]]\nname = \"{}\"\n", r.name));
        if !r.patterns.is_empty() {
            let quoted: Vec<String> = r.patterns.iter().map(|p| format!("{p:?}")).collect();
            out.push_str(&format!("match = [{}]\n", quoted.join(", ")));
        }
        let mut limits: Vec<String> = r
            .windows
            .iter()
            .map(|w| match w.burst {
                Some(b) => format!("{{ count = {}, per = \"{}\", burst = {b} }}", w.count, w.per),
                None => format!("{{ count = {}, per = \"{}\" }}", w.count, w.per),
            })
            .collect();
        limits.extend(r.calendars.iter().map(|(per, count)| format!("{{ count = {count}, per = \"{per}\" }}")));
        out.push_str(&format!("limits = [{}]\n", limits.join(", ")));
        if let Some(t) = r.max_wait {
            out.push_str(&format!("max_wait = \"{t}\"\n"));
        }
        if let Some(t) = r.warmup {
            out.push_str(&format!("warmup = \"{t}\"\n"));
        }
        if let Some(c) = r.concurrency {
            out.push_str(&format!("concurrency = {c}\n"));
        }
        out.push('\n');
    }
    out
}

fn server_lines() -> impl Strategy<Value = String> {
    (
        proptest::option::of(proptest::sample::select(vec!["+08:00", "UTC", "-05:30", "Asia/Shanghai", "+14:00"])),
        proptest::option::of(0usize..100_000),
        proptest::option::of(proptest::sample::select(vec!["1ms", "300ms", "10s"])),
        proptest::option::of(proptest::sample::select(vec!["1", "1KiB", "10MB", "64MiB", "1GiB"])),
        proptest::option::of(proptest::sample::select(vec!["http://127.0.0.1:9", "https://api.weixin.qq.com/base"])),
    )
        .prop_map(|(tz, held, header, body, upstream)| {
            let mut s = String::new();
            if let Some(v) = tz {
                s.push_str(&format!("quota_timezone = \"{v}\"\n"));
            }
            if let Some(v) = held {
                s.push_str(&format!("max_held = {v}\n"));
            }
            if let Some(v) = header {
                s.push_str(&format!("header_timeout = \"{v}\"\n"));
            }
            if let Some(v) = body {
                s.push_str(&format!("max_body = \"{v}\"\n"));
            }
            if let Some(v) = upstream {
                s.push_str(&format!("upstream = \"{v}\"\n"));
            }
            s
        })
}

fn penalty_lines() -> impl Strategy<Value = String> {
    let one = (prop_oneof![(1u64..100_000).prop_map(Some), Just(None)], proptest::option::of(1u64..1_000_000));
    proptest::option::of(proptest::sample::subsequence(vec![45009i64, 45011, 45033, -1, 40001], 1..=5)).prop_flat_map(
        move |codes| {
            let codes = codes.unwrap_or_default();
            let n = codes.len();
            (Just(codes), prop::collection::vec(one.clone(), n..=n)).prop_map(|(codes, lens)| {
                codes
                    .iter()
                    .zip(lens)
                    .map(|(code, (seconds, max))| {
                        let length = match seconds {
                            Some(s) => format!("seconds = {s}"),
                            None => "until = \"next_minute\"".to_owned(),
                        };
                        let max = max.map(|m| format!("max_seconds = {m}\n")).unwrap_or_default();
                        format!("[[penalty]]\nerrcode = {code}\n{length}\n{max}\n")
                    })
                    .collect::<String>()
            })
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Arbitrary text never panics the loader, and every error names the file first.
    #[test]
    fn loader_never_panics_on_arbitrary_text(text in prop_oneof![any::<String>(), toml_soup()]) {
        match parse(&text) {
            Ok(c) => check_invariants(&c)?,
            Err(m) => prop_assert!(m.starts_with(LABEL), "{:?}", m),
        }
    }

    /// Random edits of the shipped rules.toml never panic the loader; an
    /// error names the file and the line first; whatever still parses keeps
    /// the invariants.
    #[test]
    fn loader_never_panics_on_mutated_shipped_rules(edits in prop::collection::vec(edit(), 1..6)) {
        let text = mutate(&shipped_rules(), &edits);
        match parse(&text) {
            Ok(c) => check_invariants(&c)?,
            Err(m) => {
                let line = m.strip_prefix(LABEL).and_then(|r| r.strip_prefix(':')).map(|r| r.split(':').next());
                prop_assert!(line.flatten().is_some_and(|n| n.parse::<usize>().is_ok()), "{:?}", m);
            }
        }
    }

    /// A valid config (random counts, bursts, windows, quotas, penalties and
    /// server settings within their ranges) always parses, and compiles to
    /// exactly what was written.
    #[test]
    fn generated_valid_config_parses(rules in gen_rules(), server in server_lines(), penalties in penalty_lines()) {
        let text = render(&rules, &server, &penalties);
        let c = match parse(&text) {
            Ok(c) => c,
            Err(m) => return Err(TestCaseError::fail(format!("{m}\n--- config ---\n{text}"))),
        };
        check_invariants(&c)?;
        prop_assert_eq!(c.rules.len(), rules.len());
        for (i, (got, want)) in c.rules.iter().zip(&rules).enumerate() {
            prop_assert_eq!(&*got.name, want.name.as_str());
            prop_assert_eq!(got.limits.len(), want.windows.len() + want.calendars.len());
            for (limit, w) in got.limits.iter().zip(&want.windows) {
                let Limit::Window(got_w) = limit else { return Err(TestCaseError::fail("window limit expected")) };
                prop_assert_eq!(got_w.count(), w.count);
                prop_assert_eq!(got_w.per_us(), w.per_us);
                prop_assert_eq!(got_w.burst(), w.burst.unwrap_or_else(|| WindowLimit::default_burst(w.count)));
            }
            for (limit, (_, count)) in got.limits.iter().skip(want.windows.len()).zip(&want.calendars) {
                let Limit::Calendar { count: got_count, .. } = limit else {
                    return Err(TestCaseError::fail("calendar limit expected"));
                };
                prop_assert_eq!(got_count.get(), *count);
            }
            prop_assert_eq!(got.concurrency, want.concurrency.unwrap_or(0));
            // Each exact pattern routes to its own rule.
            for p in want.patterns.iter().filter(|p| !p.ends_with("/*")) {
                prop_assert_eq!(c.domains[0].routes.lookup(p), Some(i), "{}", p);
            }
        }
        let penalty_count = penalties.matches("[[penalty]]").count();
        if penalty_count > 0 {
            prop_assert_eq!(c.penalties.len(), penalty_count);
        }
    }
}

#[test]
fn shipped_rules_parse_and_keep_the_invariants() {
    let c = parse(&shipped_rules()).expect("the shipped rules.toml is valid");
    check_invariants(&c).expect("invariants");
    assert!(c.domains[0].routes.has_default());
}

// --- the errcode sniffer --------------------------------------------------------

/// A random JSON value, nested a little (objects may hold their own `errcode`).
fn json_value() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from),
        any::<String>().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec(("(errcode|[a-z_]{1,8})", inner), 0..4)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// Other top-level fields: any name but `errcode`, each once.
fn other_fields() -> impl Strategy<Value = Vec<(String, serde_json::Value)>> {
    prop::collection::btree_map("[a-z_]{1,10}|[^\"\\\\]{0,6}", json_value(), 0..6)
        .prop_map(|m| m.into_iter().filter(|(k, _)| k != "errcode").collect())
}

/// An object text with these fields in this order, with random whitespace.
fn object_text(fields: &[(String, String)], ws: &str) -> String {
    let body: Vec<String> =
        fields.iter().map(|(k, v)| format!("{ws}{}{ws}:{ws}{v}{ws}", serde_json::json!(k))).collect();
    format!("{ws}{{{}}}{ws}", body.join(","))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Arbitrary bytes never panic the sniffer.
    #[test]
    fn errcode_never_panics(bytes in prop_oneof![
        prop::collection::vec(any::<u8>(), 0..200),
        "\\{\"errcode\":[-0-9.eE\" ]{0,30}\\}?".prop_map(String::into_bytes),
        any::<String>().prop_map(String::into_bytes),
    ]) {
        let _ = errcode(&bytes);
    }

    /// `{"errcode": N, ...}` with other fields in any order gives N, written
    /// as a number or as a numeric string.
    #[test]
    fn errcode_is_found_among_other_fields(code in any::<i64>(), others in other_fields(), at in any::<Index>(),
                                           as_string in any::<bool>(), ws in "[ \t\r\n]{0,2}") {
        let mut fields: Vec<(String, String)> = others.iter().map(|(k, v)| (k.clone(), v.to_string())).collect();
        let value = if as_string { format!("\"{code}\"") } else { code.to_string() };
        let pos = at.index(fields.len() + 1);
        fields.insert(pos, ("errcode".to_owned(), value));
        let text = object_text(&fields, &ws);
        prop_assert_eq!(errcode(text.as_bytes()), Some(Some(code)), "{}", text);
    }

    /// An object without a top-level errcode (nested ones do not count) gives Some(None).
    #[test]
    fn no_top_level_errcode_is_some_none(others in other_fields(), ws in "[ \t\r\n]{0,2}") {
        let fields: Vec<(String, String)> = others.iter().map(|(k, v)| (k.clone(), v.to_string())).collect();
        let text = object_text(&fields, &ws);
        prop_assert_eq!(errcode(text.as_bytes()), Some(None), "{}", text);
    }
}
