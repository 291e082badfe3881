//! The simulator's limits file (`wxgate sim --limits FILE`): its shape, its
//! checks and the built-in demo. Unknown keys are rejected; a message names
//! the file, the line and the key: `sim.toml:12: [[api]] "/cgi-bin/x": limits[0]: ...`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use crate::config::units::{micros, parse_duration, parse_offset};
use crate::time::{Micros, Span};

/// The built-in demo limits, served when no `--limits` is given. The same
/// text ships as `deploy/sim.toml` (a test keeps the two equal).
pub const DEMO: &str = include_str!("demo.toml");

/// Most admitted calls a sliding window keeps (one timestamp each).
pub const MAX_WINDOW_COUNT: u64 = 1_000_000;

/// Why a limits file is refused: where, and why.
#[derive(Debug, thiserror::Error)]
pub enum SimConfigError {
    /// The file cannot be read.
    #[error("{}: cannot read: {source}", .path.display())]
    Read { path: PathBuf, source: std::io::Error },
    /// The text is refused: `label:line: message` (the line when known).
    #[error("{label}{}: {message}", .line.map(|l| format!(":{l}")).unwrap_or_default())]
    Invalid { label: String, line: Option<usize>, message: String },
}

/// A checked simulator configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimConfig {
    /// Where the simulator listens (`--listen`; not in the file).
    pub listen: SocketAddr,
    /// The file it was read from, or "built-in demo": for the log.
    pub source: String,
    /// Length of a "day" of the daily quotas (WeChat: 24 h).
    pub day_length_us: Micros,
    /// Days start at `k * day_length` in this UTC offset (WeChat: +08:00).
    pub offset_us: Micros,
    /// `expires_in` of the tokens it issues.
    pub token_ttl_us: Micros,
    /// Calls carrying `access_token` need one it issued and that has not
    /// expired (else 40001); `false` accepts any.
    pub require_token: bool,
    /// The paths with limits, in file order.
    pub apis: Vec<Api>,
}

/// One path's limits, counted per account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Api {
    pub path: String,
    /// The limits of every account not named in `accounts`.
    pub limits: Limits,
    /// Accounts (appids) with limits of their own (`[[api.account]]`), in
    /// place of `limits` (whole: windows and day quota alike).
    pub accounts: BTreeMap<String, Limits>,
    /// Calls in flight at once (45033 beyond).
    pub concurrency: Option<u32>,
    /// Simulated processing time of each admitted call.
    pub latency: Span,
}

/// The limits one account has on one path.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Limits {
    /// Sliding windows: no `[t, t + per)` admits more than `count` calls.
    pub windows: Vec<Window>,
    /// Calls admitted per day (`per = "day"`), reported by `quota/get`.
    pub daily: Option<u64>,
}

impl Api {
    /// The limits `account` has on this path: its own, else the path's.
    pub fn limits_of(&self, account: &str) -> &Limits {
        self.accounts.get(account).unwrap_or(&self.limits)
    }

    /// Whether `account` has limits of its own here.
    pub fn has_own(&self, account: &str) -> bool {
        self.accounts.contains_key(account)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub count: u64,
    pub per_us: Micros,
}

impl Window {
    /// `"20 per 1m"`.
    pub fn label(&self) -> String {
        format!("{} per {}", self.count, humantime::format_duration(Duration::from_micros(self.per_us as u64)))
    }
}

impl SimConfig {
    /// The built-in demo (`src/ops/tools/sim/demo.toml`; tested, so always `Ok`).
    pub fn demo() -> Result<SimConfig, SimConfigError> {
        SimConfig::parse(DEMO, "built-in demo")
    }

    /// Reads and checks a limits file.
    pub fn load(path: &Path) -> Result<SimConfig, SimConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| SimConfigError::Read { path: path.to_owned(), source })?;
        SimConfig::parse(&text, &path.display().to_string())
    }

    /// Checks limits text; `label` names it in messages and the log.
    pub fn parse(text: &str, label: &str) -> Result<SimConfig, SimConfigError> {
        let invalid = |line, message: &str| SimConfigError::Invalid {
            label: label.to_owned(),
            line,
            message: message.to_owned(),
        };
        let at = |span: std::ops::Range<usize>, msg: &str| {
            invalid(Some(text[..span.start.min(text.len())].matches('\n').count() + 1), msg)
        };
        let raw: RawFile = toml::from_str(text).map_err(|e| match e.span() {
            Some(span) => at(span, e.message().trim_end()),
            None => invalid(None, e.message().trim_end()),
        })?;
        let s = raw.sim;
        let duration = |key: &str, v: &Option<Spanned<String>>, default: Duration| -> Result<Micros, SimConfigError> {
            let Some(v) = v else { return Ok(micros(default)) };
            let d = parse_duration(v.get_ref()).map_err(|m| at(v.span(), &format!("[sim] {key}: {m}")))?;
            if d < Duration::from_secs(1) {
                return Err(at(v.span(), &format!("[sim] {key}: must be at least 1s")));
            }
            Ok(micros(d))
        };
        let day_length_us = duration("day_length", &s.day_length, Duration::from_secs(86_400))?;
        let token_ttl_us = duration("token_ttl", &s.token_ttl, Duration::from_secs(7200))?;
        let offset_us = match &s.quota_timezone {
            None => 8 * 3_600_000_000,
            Some(v) => parse_offset(v.get_ref()).map_err(|m| at(v.span(), &format!("[sim] quota_timezone: {m}")))?,
        };
        let mut apis: Vec<Api> = Vec::with_capacity(raw.api.len());
        for spanned in raw.api {
            let span = spanned.span();
            let api = compile_api(spanned.into_inner(), span.clone(), &at)?;
            if apis.iter().any(|a| a.path == api.path) {
                return Err(at(span, &format!("[[api]] \"{}\": another [[api]] has the same path", api.path)));
            }
            apis.push(api);
        }
        Ok(SimConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 9999)),
            source: label.to_owned(),
            day_length_us,
            offset_us,
            token_ttl_us,
            require_token: s.require_token.unwrap_or(true),
            apis,
        })
    }
}

/// A message located by the span of what it is about (`file:line: ...`).
type At<'a> = &'a dyn Fn(std::ops::Range<usize>, &str) -> SimConfigError;

/// Checks one `[[api]]` (at `span`); an error names the line of the block,
/// or of its `[[api.account]]` that is wrong.
fn compile_api(raw: RawApi, span: std::ops::Range<usize>, at: At<'_>) -> Result<Api, SimConfigError> {
    let located = |m: String| at(span.clone(), &m);
    let mut api = compile_api_block(&raw).map_err(located)?;
    for spanned in &raw.account {
        let located = |m: String| at(spanned.span(), &m);
        let account = spanned.get_ref();
        let name = format!("[[api]] \"{}\": [[api.account]]", raw.path);
        if account.appid.is_empty() || account.appid.len() > 128 || account.appid.contains(['&', '=', '?', '#', ' ']) {
            return Err(located(format!("{name}: appid must be 1 to 128 characters, none of & = ? # or space")));
        }
        let name = format!("{name} \"{}\"", account.appid);
        let own = compile_limits(&name, &account.limits).map_err(located)?;
        if api.accounts.insert(account.appid.clone(), own).is_some() {
            return Err(located(format!("{name}: another [[api.account]] of this path has the same appid")));
        }
    }
    Ok(api)
}

/// The block's own keys (everything but its accounts).
fn compile_api_block(raw: &RawApi) -> Result<Api, String> {
    let name = format!("[[api]] \"{}\"", raw.path);
    if !raw.path.starts_with('/') || raw.path.contains(['?', '#', ' ']) {
        return Err(format!("{name}: path must start with / and hold no query (e.g. \"/cgi-bin/user/info\")"));
    }
    if raw.path.starts_with("/__") {
        return Err(format!("{name}: paths under /__ are the simulator's own (/__stats, /__reset)"));
    }
    let limits = compile_limits(&name, &raw.limits)?;
    if raw.concurrency == Some(0) {
        return Err(format!("{name}: concurrency must be at least 1 (leave it out for no cap)"));
    }
    let latency = match &raw.latency {
        None => Span::ZERO,
        Some(t) => {
            let d = parse_duration(t).map_err(|m| format!("{name}: latency: {m}"))?;
            if d > Duration::from_secs(60) {
                return Err(format!("{name}: latency: at most 60s"));
            }
            Span::from_duration(d)
        }
    };
    Ok(Api { path: raw.path.clone(), limits, accounts: BTreeMap::new(), concurrency: raw.concurrency, latency })
}

/// A `limits = [...]` list: its sliding windows and its day quota.
fn compile_limits(name: &str, raw: &[Spanned<RawLimit>]) -> Result<Limits, String> {
    let mut windows = Vec::new();
    let mut daily = None;
    for (i, l) in raw.iter().enumerate() {
        let l = l.get_ref();
        let at = |m: String| format!("{name}: limits[{i}]: {m}");
        if l.count == 0 {
            return Err(at("count must be at least 1".into()));
        }
        if l.per == "day" {
            if daily.replace(l.count).is_some() {
                return Err(at("a second per = \"day\" quota (a path has one daily quota)".into()));
            }
            continue;
        }
        let per = parse_duration(&l.per).map_err(|m| at(format!("per: {m} or \"day\"")))?;
        if per < Duration::from_millis(1) || per > Duration::from_secs(86_400) {
            return Err(at("per: a sliding window lasts from 1ms to 24h (a calendar quota is per = \"day\")".into()));
        }
        if l.count > MAX_WINDOW_COUNT {
            return Err(at(format!("count: a sliding window keeps at most {MAX_WINDOW_COUNT} calls")));
        }
        windows.push(Window { count: l.count, per_us: micros(per) });
    }
    Ok(Limits { windows, daily })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    sim: RawSettings,
    #[serde(default)]
    api: Vec<Spanned<RawApi>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawSettings {
    day_length: Option<Spanned<String>>,
    quota_timezone: Option<Spanned<String>>,
    token_ttl: Option<Spanned<String>>,
    require_token: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawApi {
    path: String,
    #[serde(default)]
    limits: Vec<Spanned<RawLimit>>,
    concurrency: Option<u32>,
    latency: Option<String>,
    /// `[[api.account]]`: appids with limits of their own on this path.
    #[serde(default)]
    account: Vec<Spanned<RawAccount>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAccount {
    appid: String,
    limits: Vec<Spanned<RawLimit>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimit {
    count: u64,
    per: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        SimConfig::parse(text, "sim.toml").expect_err("must be refused").to_string()
    }

    #[test]
    fn the_demo_parses() {
        let demo = SimConfig::demo().expect("the demo parses");
        assert_eq!(demo.day_length_us, 300_000_000);
        assert!(demo.apis.iter().any(|a| a.path == "/cgi-bin/message/custom/send" && a.limits.daily.is_some()));
    }

    #[test]
    fn defaults_are_wechat_s() {
        let c = SimConfig::parse("", "sim.toml").expect("empty file");
        assert_eq!((c.day_length_us, c.offset_us, c.token_ttl_us), (86_400_000_000, 8 * 3_600_000_000, 7_200_000_000));
        assert!(c.require_token && c.apis.is_empty());
    }

    #[test]
    fn messages_name_file_line_and_key() {
        assert_eq!(
            err("[sim]\nday_lenght = \"5m\"\n"),
            "sim.toml:2: unknown field `day_lenght`, expected one of `day_length`, `quota_timezone`, `token_ttl`, `require_token`"
        );
        assert_eq!(
            err("[sim]\nday_length = \"5 fortnights\"\n").split(" (").next(),
            Some("sim.toml:2: [sim] day_length: \"5 fortnights\" is not a duration such as \"500ms\", \"10s\", \"1m\", \"1h\"")
        );
        let text = "[[api]]\npath = \"/a\"\n\n[[api]]\npath = \"/b\"\nlimits = [{ count = 0, per = \"1m\" }]\n";
        assert_eq!(err(text), "sim.toml:4: [[api]] \"/b\": limits[0]: count must be at least 1");
        let text = "[[api]]\npath = \"/a\"\n[[api]]\npath = \"/a\"\n";
        assert_eq!(err(text), "sim.toml:3: [[api]] \"/a\": another [[api]] has the same path");
        let text = "[[api]]\npath = \"/a\"\nlimits = [{ count = 1, per = \"day\" }, { count = 2, per = \"day\" }]\n";
        assert!(err(text).contains("limits[1]: a second per = \"day\" quota"), "{}", err(text));
        assert!(err("[[api]]\npath = \"/a\"\nconcurency = 3\n").starts_with("sim.toml:3: unknown field `concurency`"));
        assert!(err("[[api]]\npath = \"/__stats\"\n").contains("the simulator's own"));
    }

    const ACCOUNTS: &str = "[[api]]\npath = \"/a\"\nlimits = [{ count = 20, per = \"1m\" }, { count = 100, per = \"day\" }]\n\n[[api.account]]\nappid = \"wxB\"\nlimits = [{ count = 5, per = \"1m\" }, { count = 30, per = \"day\" }]\n\n[[api.account]]\nappid = \"wxC\"\nlimits = []\n";

    #[test]
    fn an_account_has_its_own_limits_in_place_of_the_path_s() {
        let c = SimConfig::parse(ACCOUNTS, "sim.toml").expect("accounts");
        let api = &c.apis[0];
        assert_eq!(api.limits_of("wxA"), &api.limits);
        assert_eq!(api.limits_of("wxA").daily, Some(100));
        let b = api.limits_of("wxB");
        assert_eq!((b.windows[0].count, b.windows[0].per_us, b.daily), (5, 60_000_000, Some(30)));
        assert_eq!(api.limits_of("wxC"), &Limits::default(), "an empty list: no limits at all");
        assert!(api.has_own("wxB") && !api.has_own("wxA"));
    }

    #[test]
    fn a_bad_account_block_is_refused_at_its_line() {
        let bad = ACCOUNTS.replace("{ count = 30, per = \"day\" }", "{ count = 30, per = \"week\" }");
        assert!(
            err(&bad).starts_with("sim.toml:5: [[api]] \"/a\": [[api.account]] \"wxB\": limits[1]: per: "),
            "{}",
            err(&bad)
        );
        let twice = ACCOUNTS.replace("\"wxC\"", "\"wxB\"");
        assert_eq!(
            err(&twice),
            "sim.toml:9: [[api]] \"/a\": [[api.account]] \"wxB\": another [[api.account]] of this path has the same appid"
        );
        let empty = ACCOUNTS.replace("\"wxC\"", "\"\"");
        assert!(
            err(&empty).starts_with("sim.toml:9: [[api]] \"/a\": [[api.account]]: appid must be"),
            "{}",
            err(&empty)
        );
        let typo = ACCOUNTS.replace("appid = \"wxC\"", "app_id = \"wxC\"");
        assert!(err(&typo).starts_with("sim.toml:10: unknown field `app_id`"), "{}", err(&typo));
        let no_limits = ACCOUNTS.replace("\nlimits = []", "");
        assert!(err(&no_limits).contains("missing field `limits`"), "{}", err(&no_limits));
        // The block's own errors still name the block's line.
        let block = ACCOUNTS.replace("count = 20,", "count = 0,");
        assert!(
            err(&block).starts_with("sim.toml:1: [[api]] \"/a\": limits[0]: count must be at least 1"),
            "{}",
            err(&block)
        );
    }
}
