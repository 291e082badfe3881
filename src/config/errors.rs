//! Where in the file a config error is, and what it means in words. A
//! message names the file and line, then the table or rule, then the field:
//! `rules.toml:4: rule "send": limits[0].count: expected an integer, got the string "3"`.
//!
//! - A value serde cannot read (wrong type, out of range, unknown or missing
//!   key, [`serde_error`]): the key path comes from `serde_path_to_error`,
//!   the line from the TOML parser's span, the words from [`problem`].
//! - A value a check refuses: its message names the field first
//!   (`[server] workers: ...`, `match "...": ...`), and the line is that
//!   field's, found in the document ([`Doc`]), else its table's.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde_path_to_error::Segment;
use toml::de::{DeTable, DeValue};
use toml::Spanned;

/// A config that failed to load: where (the file, the line when known, the
/// table and the field) and why. Displays as users read it, the file and
/// line first, then the table, the field and the message:
/// `rules.toml:4: rule "send": limits[0].count: expected an integer, got the string "3"`,
/// `rules.toml:3: [store] timeout: must be more than 0`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// The config file (as given: the path wxgate was told).
    pub file: PathBuf,
    /// The line of the field (else of its table or rule), when the error
    /// is at a place in the file (`None`: the file cannot be read, or the
    /// table is not in it).
    pub line: Option<usize>,
    /// The table or entry the field is in, as the message names it:
    /// `[server]`, `rule "send"`, `[[penalty]] errcode 45009`, `caller "crm"`.
    pub table: Option<String>,
    /// The field, as the message names it: `workers`, `limits[0].count`,
    /// `limits[0]` (where the message goes on to name a key of it).
    pub field: Option<String>,
    /// Why: what follows the table and field.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        f.write_str(": ")?;
        place(f, self.table.as_deref(), self.field.as_deref(), &self.message)
    }
}

/// A value a check refused, before the file and line are known: the table
/// and the field when the check knows them, and why. Displays as the part of
/// a [`ConfigError`] after the line (`[store] timeout: must be more than 0`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct Invalid {
    pub table: Option<String>,
    pub field: Option<String>,
    pub message: String,
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        place(f, self.table.as_deref(), self.field.as_deref(), &self.message)
    }
}

/// `[server] workers: m` (a table's header is followed by its key), `rule
/// "send": limits[0]: m` (an entry by a colon), `[server]: m`, `workers: m`, `m`.
fn place(f: &mut fmt::Formatter<'_>, table: Option<&str>, field: Option<&str>, message: &str) -> fmt::Result {
    match (table, field) {
        (Some(t), Some(k)) if t.starts_with('[') && t.ends_with(']') && !t.contains(' ') => {
            write!(f, "{t} {k}: {message}")
        }
        (Some(t), Some(k)) => write!(f, "{t}: {k}: {message}"),
        (Some(p), None) | (None, Some(p)) => write!(f, "{p}: {message}"),
        (None, None) => f.write_str(message),
    }
}

impl Invalid {
    /// A message alone: the caller names the field ([`Invalid::field`]).
    pub fn new(message: impl Into<String>) -> Invalid {
        Invalid { table: None, field: None, message: message.into() }
    }

    /// `[table] field: message`.
    pub fn at(table: &str, field: impl Into<String>, message: impl fmt::Display) -> Invalid {
        Invalid { table: Some(table.to_owned()), field: Some(field.into()), message: message.to_string() }
    }

    /// `field: message`, in a table the caller names ([`Invalid::table`]).
    pub fn at_field(field: impl Into<String>, message: impl fmt::Display) -> Invalid {
        Invalid { table: None, field: Some(field.into()), message: message.to_string() }
    }

    /// This, about `field`: what it said so far becomes the message
    /// (`per: "x" is not a duration` about `limits[0]`).
    pub fn field(self, field: impl Into<String>) -> Invalid {
        Invalid { table: None, field: Some(field.into()), message: self.to_string() }
    }

    /// This, in `table` (`[server]`, `rule "send"`).
    pub fn table(self, table: impl Into<String>) -> Invalid {
        match self.table {
            None => Invalid { table: Some(table.into()), ..self },
            Some(_) => Invalid { table: Some(table.into()), field: None, message: self.to_string() },
        }
    }
}

impl From<String> for Invalid {
    fn from(message: String) -> Invalid {
        Invalid::new(message)
    }
}

impl From<&str> for Invalid {
    fn from(message: &str) -> Invalid {
        Invalid::new(message)
    }
}

/// The document parsed again, to find fields, rule names and spans in.
/// Errors only: parsing twice costs nothing there.
pub(super) struct Doc<'a> {
    /// `None` when the text does not parse (then serde never ran).
    root: Option<DeTable<'a>>,
}

/// One step of a key path: a key, or an index into an array.
enum Step {
    Key(String),
    Index(usize),
}

impl<'a> Doc<'a> {
    pub(super) fn parse(text: &'a str) -> Doc<'a> {
        Doc { root: DeTable::parse(text).ok().map(Spanned::into_inner) }
    }

    /// The value at `path` (at least one step long).
    fn value_at(&self, path: &[Step]) -> Option<&Spanned<DeValue<'a>>> {
        let (Step::Key(first), rest) = path.split_first()? else { return None };
        let mut value = entry(self.root.as_ref()?, first)?.1;
        for step in rest {
            value = match (step, value.get_ref()) {
                (Step::Key(k), DeValue::Table(t)) => entry(t, k)?.1,
                (Step::Index(i), DeValue::Array(a)) => a.get(*i)?,
                _ => return None,
            };
        }
        Some(value)
    }

    /// Where `key` of `[table]` is written: the key, else the table's
    /// header (or first key), else `None` (the table is not in the file).
    pub(super) fn table_key(&self, table: &str, key: &str) -> Option<Range<usize>> {
        let (name, value) = entry(self.root.as_ref()?, table)?;
        match value.get_ref() {
            DeValue::Table(t) => Some(entry(t, key).map_or_else(|| name.span(), |(k, _)| k.span())),
            _ => Some(name.span()),
        }
    }

    /// Where `key` of the table spanning `span` is written (`None`: not there).
    pub(super) fn key_in(&self, span: &Range<usize>, key: &str) -> Option<Range<usize>> {
        let table = find_table(self.root.as_ref()?, span)?;
        entry(table, key).map(|(k, _)| k.span())
    }
}

/// `table[key]`, with the key's own span.
fn entry<'t, 'a>(
    table: &'t DeTable<'a>,
    key: &str,
) -> Option<(&'t Spanned<toml::de::DeString<'a>>, &'t Spanned<DeValue<'a>>)> {
    table.iter().find(|(k, _)| k.get_ref() == key)
}

/// The table (at any depth) whose value has exactly `span`. (A `[table]`'s
/// span is its header only, and an array of tables' that of its first: spans
/// do not nest, so every table is looked at.)
fn find_table<'t, 'a>(table: &'t DeTable<'a>, span: &Range<usize>) -> Option<&'t DeTable<'a>> {
    fn within<'t, 'a>(value: &'t Spanned<DeValue<'a>>, span: &Range<usize>) -> Option<&'t DeTable<'a>> {
        match value.get_ref() {
            DeValue::Table(t) if value.span() == *span => Some(t),
            DeValue::Table(t) => find_table(t, span),
            DeValue::Array(a) => a.iter().find_map(|v| within(v, span)),
            _ => None,
        }
    }
    table.iter().find_map(|(_, v)| within(v, span))
}

/// The parser's `duplicate key` at `span`, named: `[server] workers: this
/// key is given twice`, `[server]: this table is given twice`.
pub(super) fn duplicate_key(text: &str, span: &Range<usize>) -> Invalid {
    let key = text.get(span.clone()).unwrap_or_default();
    let line_start = text.get(..span.start).and_then(|t| t.rfind('\n')).map_or(0, |i| i + 1);
    let line = text.get(line_start..).and_then(|t| t.lines().next()).unwrap_or_default();
    if let Some(table) = header(line) {
        return Invalid::new("this table is given twice").table(table);
    }
    // The table the key is in: the header above it (a parse error has no
    // document to look in).
    let twice = Invalid::new("this key is given twice").field(key);
    match text.get(..line_start).and_then(|t| t.lines().rev().find_map(header)) {
        Some(table) => Invalid { table: Some(table.to_owned()), ..twice },
        None => twice,
    }
}

/// The `[table]` / `[[table]]` a line is the header of, as written: a line
/// of its own, `[` to `]`, with a bare name (not an array of strings or numbers).
fn header(line: &str) -> Option<&str> {
    let l = line.split(" #").next().unwrap_or(line).trim();
    let inner = l.strip_prefix('[')?.strip_suffix(']')?.trim_start_matches('[');
    let bare = inner.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ' ' | ']'));
    (bare && inner.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')).then_some(l)
}

/// The field a check's message names first: `count` of `count must be at
/// least 1`, `match` of `match "/a/*/b": ...` (empty when it starts otherwise).
pub(super) fn leading_key(msg: &str) -> &str {
    let end = msg.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(msg.len());
    &msg[..end]
}

/// An error's `[server]` / `[store]` table and the key of its field (`upstream` of `upstream[1]`).
fn table_and_key(e: &Invalid) -> Option<(&str, &str)> {
    let table = e.table.as_deref()?.strip_prefix('[')?.strip_suffix(']')?;
    Some((table, leading_key(e.field.as_deref()?)))
}

/// A serde error as a message without the file (`rule "send":
/// limits[0].count: expected an integer, got the string "3"`), and where it
/// is in the text, when known.
pub(super) fn serde_error(
    doc: &Doc<'_>,
    within: &[&str],
    e: &serde_path_to_error::Error<toml::de::Error>,
) -> (Invalid, Option<Range<usize>>) {
    let path: Vec<Step> = within
        .iter()
        .map(|k| Step::Key((*k).to_owned()))
        .chain(e.path().iter().filter_map(|s| match s {
            Segment::Seq { index } => Some(Step::Index(*index)),
            // `toml::Spanned` reads its value through private keys.
            Segment::Map { key } if !key.starts_with("$__") => Some(Step::Key(key.clone())),
            _ => None,
        }))
        .collect();
    serde_error_at(doc, path, e.inner())
}

fn serde_error_at(doc: &Doc<'_>, path: Vec<Step>, e: &toml::de::Error) -> (Invalid, Option<Range<usize>>) {
    let value = doc.value_at(&path);
    let span = e.span().or_else(|| value.map(Spanned::span));
    let key = path.iter().rev().find_map(|s| match s {
        Step::Key(k) => Some(k.as_str()),
        Step::Index(_) => None,
    });
    let got = value.map(|v| describe(v.get_ref()));
    let (problem, missing) = problem(e.message().trim_end(), key, got.as_deref());

    // `[server] workers`, `rule "send": limits[0].count`, `[[penalty]] errcode 45009: seconds`.
    let (place, skip) = match path.as_slice() {
        [Step::Key(t), _, ..] if matches!(t.as_str(), "server" | "store" | "log" | "tokens") => (format!("[{t}]"), 1),
        [Step::Key(t), Step::Index(i), ..] if t == "rule" || t == "caller" => {
            let name =
                doc.value_at(&path[..2]).and_then(|r| r.get_ref().get("name")).and_then(|n| n.get_ref().as_str());
            (name.map_or_else(|| format!("{t}[{i}]"), |n| format!("{t} \"{n}\"")), 2)
        }
        [Step::Key(t), Step::Index(i), ..] if t == "penalty" => {
            let code = doc
                .value_at(&path[..2])
                .and_then(|p| p.get_ref().get("errcode"))
                .and_then(|c| c.get_ref().as_integer());
            let code = code.and_then(|c| i64::from_str_radix(c.as_str(), c.radix()).ok());
            (code.map_or_else(|| format!("penalty[{i}]"), |c| format!("[[penalty]] errcode {c}")), 2)
        }
        _ => (String::new(), 0),
    };
    let mut field = String::new();
    for step in &path[skip..] {
        match step {
            Step::Key(k) => push_key(&mut field, k),
            Step::Index(i) => field.push_str(&format!("[{i}]")),
        }
    }
    if let Some(k) = missing {
        push_key(&mut field, k);
    }
    let some = |s: String| (!s.is_empty()).then_some(s);
    (Invalid { table: some(place), field: some(field), message: problem }, span)
}

fn push_key(field: &mut String, key: &str) {
    if !field.is_empty() {
        field.push('.');
    }
    field.push_str(key);
}

/// Serde's message in words (`expected an integer, got the string "3"`
/// for `invalid type: string "3", expected u64`), and the key a `missing
/// field` message names. `key` is the field's own key; `got` describes the
/// value found in the file.
fn problem<'m>(msg: &'m str, key: Option<&str>, got: Option<&str>) -> (String, Option<&'m str>) {
    let typed = msg.strip_prefix("invalid type: ").map(|r| (r, false));
    if let Some((rest, out_of_range)) = typed.or_else(|| msg.strip_prefix("invalid value: ").map(|r| (r, true))) {
        if let Some((unexpected, expected)) = rest.rsplit_once(", expected ") {
            // An integer refused by an integer type is out of its range
            // (serde calls one past 64 bits an invalid type).
            let integer = unexpected.starts_with("integer `");
            let negative = unexpected.starts_with("integer `-");
            let expected = expected_words(expected, key, out_of_range || integer, negative);
            return (format!("expected {expected}, got {}", got.unwrap_or(unexpected)), None);
        }
    }
    if let Some(rest) = msg.strip_prefix("unknown field `") {
        return match rest.split_once("`, expected ") {
            Some((unknown, list)) => match did_you_mean(unknown, list) {
                // `rules = "..."` written under a table: TOML puts a key
                // after a table's header in that table.
                _ if unknown == "rules" => (
                    format!(
                        "unknown key; `rules = \"...\"` (the file this config's rules are read from) is a top-level \
                         key: write it above the first [table] (expected {list})"
                    ),
                    None,
                ),
                Some(near) => (format!("unknown key; did you mean `{near}`? (expected {list})"), None),
                None => (format!("unknown key; expected {list}"), None),
            },
            None => ("unknown key; this table takes none".into(), None),
        };
    }
    if let Some(k) = msg.strip_prefix("missing field `").and_then(|r| r.strip_suffix('`')) {
        return ("required, but not given".into(), Some(k));
    }
    (msg.to_owned(), None)
}

/// The key of `list` (serde's "one of `a`, `b`") nearest to `unknown`, if
/// one is near enough to be a slip: at most one edit (a letter added,
/// dropped, changed, or two swapped) per three letters, two at most.
fn did_you_mean<'l>(unknown: &str, list: &'l str) -> Option<&'l str> {
    let limit = (unknown.chars().count() / 3).clamp(1, 2);
    list.split('`')
        .skip(1)
        .step_by(2)
        .map(|key| (edits(unknown, key), key))
        .filter(|&(d, _)| d <= limit)
        .min_by_key(|&(d, _)| d)
        .map(|(_, key)| key)
}

/// The edits (insert, delete, substitute, swap two neighbours) that turn
/// `a` into `b` (optimal string alignment distance).
fn edits(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let width = b.len() + 1;
    let mut d = vec![0usize; (a.len() + 1) * width];
    for (i, row) in d.chunks_mut(width).enumerate() {
        row[0] = i;
    }
    for (j, cell) in d.iter_mut().take(width).enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best =
                (d[(i - 1) * width + j] + 1).min(d[i * width + j - 1] + 1).min(d[(i - 1) * width + j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[(i - 2) * width + j - 2] + 1);
            }
            d[i * width + j] = best;
        }
    }
    d[a.len() * width + b.len()]
}

/// What serde expected, in the words of the file: `an integer` for `u64`,
/// `an array` for `a sequence`, a duration's form for a duration's key.
fn expected_words(expected: &str, key: Option<&str>, out_of_range: bool, negative: bool) -> String {
    let range: Option<(i128, u128)> = match expected {
        "u8" => Some((0, u8::MAX.into())),
        "u16" => Some((0, u16::MAX.into())),
        "u32" => Some((0, u32::MAX.into())),
        "u64" | "usize" => Some((0, u64::MAX.into())),
        "i8" => Some((i8::MIN.into(), i8::MAX as u128)),
        "i16" => Some((i16::MIN.into(), i16::MAX as u128)),
        "i32" => Some((i32::MIN.into(), i32::MAX as u128)),
        "i64" | "isize" => Some((i64::MIN.into(), i64::MAX as u128)),
        _ => None,
    };
    if let Some((min, max)) = range {
        return match (out_of_range, min == 0 && negative) {
            (false, _) => "an integer".into(),
            (true, true) => "a non-negative integer".into(),
            (true, false) => format!("an integer from {min} to {max}"),
        };
    }
    match expected {
        "a string" | "a borrowed string" | "path string" => match key {
            Some(
                "upstream_timeout" | "body_timeout" | "shutdown_timeout" | "header_timeout" | "window_margin"
                | "window_margin_max" | "lease" | "breaker_open" | "timeout" | "flush_interval" | "max_wait" | "warmup",
            ) => "a duration in quotes, such as \"10s\"".into(),
            Some("per") => "a window in quotes, such as \"1m\", or \"day\" or \"month\"".into(),
            Some("max_body" | "max_queued_bytes") => "a size in quotes, such as \"64MiB\"".into(),
            Some("rules") => "a file name in quotes, such as \"rules.toml\" (one rule is a [[rule]] table)".into(),
            _ => "a string".into(),
        },
        "a boolean" => "true or false".into(),
        "a sequence" => "an array".into(),
        "a map" | "a spanned value" => "a table".into(),
        s if s.starts_with("struct ") => "a table".into(),
        other => other.to_owned(),
    }
}

/// A value as a user would name it: `the string "3"`, `the integer -1`, `a table`.
fn describe(value: &DeValue<'_>) -> String {
    match value {
        DeValue::String(s) => format!("the string {:?}", s.as_ref()),
        DeValue::Integer(i) => format!("the integer {i}"),
        DeValue::Float(f) => format!("the number {f}"),
        DeValue::Boolean(b) => format!("the boolean {b}"),
        DeValue::Datetime(d) => format!("the date-time {d}"),
        DeValue::Array(_) => "an array".into(),
        DeValue::Table(_) => "a table".into(),
    }
}

/// The text being compiled, to point messages at its lines.
pub(super) struct Ctx<'a> {
    pub text: &'a str,
    pub path: &'a Path,
    /// The config file's directory, when the text was read from a file.
    pub dir: Option<&'a Path>,
    /// The environment secrets are read from (`secret_env`): the process's,
    /// or `wxgate try`'s with its demo secret over it.
    pub env: &'a dyn Fn(&str) -> Option<String>,
}

impl Ctx<'_> {
    pub(super) fn line_of(&self, offset: usize) -> usize {
        self.text[..offset.min(self.text.len())].matches('\n').count() + 1
    }
    fn error(&self, line: Option<usize>, e: impl Into<Invalid>) -> ConfigError {
        let Invalid { table, field, message } = e.into();
        ConfigError { file: self.path.to_path_buf(), line, table, field, message }
    }
    pub(super) fn at(&self, span: Range<usize>, e: impl Into<Invalid>) -> ConfigError {
        self.error(Some(self.line_of(span.start)), e)
    }
    pub(super) fn plain(&self, e: impl Into<Invalid>) -> ConfigError {
        self.error(None, e)
    }
    pub(super) fn toml_error(&self, e: &toml::de::Error) -> ConfigError {
        let msg = e.message().trim_end();
        match e.span() {
            // The parser points at the key given twice: name it.
            Some(span) if msg == "duplicate key" => self.at(span.clone(), duplicate_key(self.text, &span)),
            Some(span) => self.at(span, msg),
            None => self.plain(msg),
        }
    }
    /// A value serde could not read, with its key path in words; `within`:
    /// the keys of the table it was read from (`["store"]`; none: the file).
    pub(super) fn serde_error(&self, within: &[&str], e: &serde_path_to_error::Error<toml::de::Error>) -> ConfigError {
        match serde_error(&Doc::parse(self.text), within, e) {
            (e, Some(span)) => self.at(span, e),
            (e, None) => self.plain(e),
        }
    }
    /// An error about `key` of the table spanning `table`: at the key's
    /// line when it is written there, else at the table's.
    pub(super) fn at_field(&self, table: Range<usize>, key: &str, e: impl Into<Invalid>) -> ConfigError {
        let span = Doc::parse(self.text).key_in(&table, key).unwrap_or(table);
        self.at(span, e)
    }
    /// An error in a `[table]` (`[server]`, `[store]`): at its field's
    /// line, else at its table's, else (the table is not in the file)
    /// without a line.
    pub(super) fn in_table(&self, e: impl Into<Invalid>) -> ConfigError {
        let e = e.into();
        match table_and_key(&e).and_then(|(table, key)| Doc::parse(self.text).table_key(table, key)) {
            Some(span) => self.at(span, e),
            None => self.plain(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::Config;

    fn error(text: &str) -> String {
        match Config::parse(text, Path::new("t.toml")) {
            Ok(_) => panic!("accepted:\n{text}"),
            Err(e) => e.to_string(),
        }
    }

    const RULE: &str = "[[rule]]\nname = \"send\"\nmatch = [\"/cgi-bin/message/custom/send\"]\n";

    #[test]
    fn numbers_out_of_range_say_the_range() {
        assert_eq!(
            error("[server]\nthrottle_status = 70000\n"),
            "t.toml:2: [server] throttle_status: expected an integer from 0 to 65535, got the integer 70000"
        );
        assert_eq!(
            error("[server]\nworkers = 99999999999999999999\n"),
            "t.toml:2: [server] workers: expected an integer from 0 to 18446744073709551615, got the integer \
             99999999999999999999"
        );
        assert_eq!(
            error(&format!("{RULE}concurrency = -2\n")),
            "t.toml:4: rule \"send\": concurrency: expected a non-negative integer, got the integer -2"
        );
        assert_eq!(
            error("[[penalty]]\nerrcode = 99999999999999999999\nseconds = 1\n"),
            "t.toml:2: penalty[0]: errcode: expected an integer from -9223372036854775808 to 9223372036854775807, \
             got the integer 99999999999999999999"
        );
    }

    #[test]
    fn a_value_of_the_wrong_kind_is_named_as_written() {
        assert_eq!(
            error("[server]\nmax_held = 1.5\n"),
            "t.toml:2: [server] max_held: expected an integer, got the number 1.5"
        );
        assert_eq!(
            error("[server]\nupstream_timeout = 1979-05-27\n"),
            "t.toml:2: [server] upstream_timeout: expected a duration in quotes, such as \"10s\", got the date-time \
             1979-05-27"
        );
        assert_eq!(
            error(&format!("{RULE}limits = [{{ count = 1, per = 60 }}]\n")),
            "t.toml:4: rule \"send\": limits[0].per: expected a window in quotes, such as \"1m\", or \"day\" or \
             \"month\", got the integer 60"
        );
        assert_eq!(error("[log]\naccess = 1\n"), "t.toml:2: [log] access: expected true or false, got the integer 1");
        assert_eq!(
            error(&format!("{RULE}limits = [5]\n")),
            "t.toml:4: rule \"send\": limits[0]: expected a table, got the integer 5"
        );
        assert_eq!(error("[rule]\nname = \"x\"\n"), "t.toml:1: rule: expected an array, got a table");
    }

    #[test]
    fn unknown_and_missing_keys_are_named_where_they_belong() {
        assert_eq!(
            error("[rul]\nname = \"x\"\n"),
            "t.toml:1: rul: unknown key; did you mean `rule`? (expected one of `rules`, `server`, `store`, `penalty`, \
             `rule`, `log`, `caller`, `tokens`, `intercept`, `account`, `domain`, `queue`, `directory`, `quota`, `telemetry`)"
        );
        // `rules` names a file; a slip for `[[rule]]` is told so.
        assert_eq!(
            error("[rules]\nname = \"x\"\n"),
            "t.toml:1: rules: expected a file name in quotes, such as \"rules.toml\" (one rule is a [[rule]] table), \
             got a table"
        );
        // Written under a table's header, it is that table's key.
        let under = error("[log]\nrules = \"rules.toml\"\n");
        assert!(under.starts_with("t.toml:2: [log] rules: unknown key; `rules = \"...\"`"), "{under}");
        assert!(under.contains("top-level key: write it above the first [table]"), "{under}");
        assert_eq!(
            error(&format!("{RULE}limits = [{{ count = 1, per = \"1m\", brust = 1 }}]\n")),
            "t.toml:4: rule \"send\": limits[0].brust: unknown key; did you mean `burst`? (expected one of `count`, \
             `per`, `burst`)"
        );
        assert_eq!(error("[[rule]]\nmatch = [\"/a\"]\n"), "t.toml:1: rule[0]: name: required, but not given");
        assert_eq!(error("[[penalty]]\nseconds = 1\n"), "t.toml:1: penalty[0]: errcode: required, but not given");
    }

    #[test]
    fn a_refused_value_is_placed_at_its_own_line() {
        // A limit written as a table of its own: at the key, not the header.
        assert_eq!(
            error(&format!("{RULE}\n[[rule.limits]]\nper = \"1m\"\ncount = 0\n")),
            "t.toml:7: rule \"send\": limits[0]: count must be at least 1"
        );
        // The second of two rules.
        assert_eq!(
            error(&format!("{RULE}\n[[rule]]\nmatch = [\"/b\"]\nname = \"send\"\n")),
            "t.toml:7: rule \"send\": another rule has the same name"
        );
        assert_eq!(
            error("[[penalty]]\nerrcode = 45009\nmax_seconds = 0\nseconds = 1\n"),
            "t.toml:3: [[penalty]] errcode 45009: max_seconds must be at least 1"
        );
        // A dotted key, and a key left out (at its table's header).
        assert_eq!(error("server.workers = 0\n"), "t.toml:1: [server] workers: 0: must be 1 to 256");
        assert_eq!(
            error("[server]\n\nlisten = \"127.0.0.1:9090\"\n"),
            "t.toml:1: [server] admin_listen: 127.0.0.1:9090 is also listen: the admin API needs an address of its \
             own (or \"off\")"
        );
    }

    #[test]
    fn a_key_or_table_given_twice_is_named() {
        assert_eq!(error("[server]\nworkers = 1\n[server]\n"), "t.toml:3: [server]: this table is given twice");
        assert_eq!(
            error("[server] # here\nworkers = 1\nworkers = 2\n"),
            "t.toml:3: [server] workers: this key is given twice"
        );
        assert_eq!(
            error("[[rule]]\nname = \"a\"\nmatch = [\n  [1],\n]\nname = \"b\"\n"),
            "t.toml:6: [[rule]] name: this key is given twice"
        );
        assert_eq!(error("a = 1\na = 2\n"), "t.toml:2: a: this key is given twice");
    }
}
