//! Units as users write them: durations (`"500ms"`, `"1m"`), sizes
//! (`"64MiB"`), fixed UTC offsets (`"+08:00"`, `"Asia/Shanghai"`), and the
//! name alphabet shared by rules and accounts.

use std::time::Duration;

use super::errors::Invalid;
use crate::time::Micros;

/// A duration in whole microseconds, saturating.
pub fn micros(d: Duration) -> Micros {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// Seconds in microseconds, saturating.
pub fn secs_us(s: u64) -> Micros {
    i64::try_from(s).unwrap_or(i64::MAX / 1_000_000).saturating_mul(1_000_000)
}

/// Parses a size: `"64MiB"`, `"10MB"`, `"512KiB"`, `"1048576"` (bytes).
pub fn parse_size(text: &str) -> Result<u64, Invalid> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits.parse().map_err(|_| Invalid::new("expected a size such as \"64MiB\""))?;
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "KB" | "kB" => 1000,
        "KiB" => 1 << 10,
        "MB" => 1_000_000,
        "MiB" => 1 << 20,
        "GB" => 1_000_000_000,
        "GiB" => 1 << 30,
        other => return Err(Invalid::new(format!("unknown unit \"{other}\" (use B, KB, KiB, MB, MiB, GB, GiB)"))),
    };
    n.checked_mul(mult).filter(|&b| b > 0).ok_or_else(|| Invalid::new("must be more than 0 and fit in 64 bits"))
}

/// Parses `"500ms"`, `"1s"`, `"10s"`, `"1m"`, `"1min"`, `"1h"`, `"7d"`
/// (humantime syntax), but never the unit `M`: humantime reads it as months
/// (30.44 days) where many read minutes, so `"1M"` is refused rather than
/// guessed ([`ambiguous_unit`]).
pub fn parse_duration(text: &str) -> Result<Duration, Invalid> {
    if ambiguous_unit(text) {
        return Err(Invalid::new(format!(
            "\"{text}\": the unit M is ambiguous (minutes or months): write \"1min\" (or \"1m\") for minutes, \"30d\" \
             for days"
        )));
    }
    humantime::parse_duration(text.trim()).map_err(|e| {
        Invalid::new(format!("\"{text}\" is not a duration such as \"500ms\", \"10s\", \"1m\", \"1h\" ({e})"))
    })
}

/// Whether a duration names the unit `M` (e.g. `"1M"`, `"2 M"`): months
/// to the parser, minutes to many readers.
pub fn ambiguous_unit(text: &str) -> bool {
    text.split(|c: char| !c.is_ascii_alphabetic()).any(|unit| unit == "M")
}

/// Whether a duration names months (`"1month"`): humantime's 30.44-day
/// months, never calendar ones.
pub fn month_unit(text: &str) -> bool {
    text.split(|c: char| !c.is_ascii_alphabetic()).any(|unit| matches!(unit, "month" | "months"))
}

/// A path from the config: a relative one is relative to the config
/// file's directory `dir` (when the config was read from a file), like
/// every path in the config.
pub fn beside_config(dir: Option<&std::path::Path>, path: &std::path::Path) -> std::path::PathBuf {
    match dir {
        Some(dir) if path.is_relative() => dir.join(path),
        _ => path.to_path_buf(),
    }
}

/// Parses a fixed UTC offset: `+08:00`, `-05:30`, `Z`, `UTC`, `Asia/Shanghai`.
pub fn parse_offset(text: &str) -> Result<Micros, Invalid> {
    let t = text.trim();
    if t.eq_ignore_ascii_case("z") || t.eq_ignore_ascii_case("utc") {
        return Ok(0);
    }
    // WeChat's own zone, named the way people will write it. It has no DST.
    if t == "Asia/Shanghai" || t == "Asia/Chongqing" || t == "PRC" {
        return Ok(8 * 3_600_000_000);
    }
    let bad = || Invalid::new("expected a fixed offset such as \"+08:00\" or \"UTC\"");
    let (sign, rest) = match t.as_bytes().first() {
        Some(b'+') => (1, &t[1..]),
        Some(b'-') => (-1, &t[1..]),
        _ => return Err(bad()),
    };
    let (h, m) = rest.split_once(':').ok_or_else(bad)?;
    let h: i64 = h.parse().map_err(|_| bad())?;
    let m: i64 = m.parse().map_err(|_| bad())?;
    if h > 14 || m > 59 || h < 0 || m < 0 {
        return Err(bad());
    }
    Ok(sign * (h * 3600 + m * 60) * 1_000_000)
}

/// 1–64 of `[A-Za-z0-9_-]`: rule and account names.
/// Whether two byte strings are equal, in time that depends only on their
/// lengths (keys, tokens, secrets: where they differ is never told). The
/// one comparison of secrets in wxgate.
pub fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let word = |c: &[u8]| u64::from_ne_bytes(<[u8; 8]>::try_from(c).unwrap_or_default());
    let (whole_a, whole_b) = (a.chunks_exact(8), b.chunks_exact(8));
    let rest = whole_a.remainder().iter().zip(whole_b.remainder()).fold(0u64, |d, (x, y)| d | u64::from(x ^ y));
    whole_a.zip(whole_b).fold(rest, |d, (x, y)| d | (word(x) ^ word(y))) == 0
}

pub fn valid_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// `throttle_status`: 429 or 200 (`None` when not given).
pub fn throttle_status(given: Option<u16>) -> Result<Option<http::StatusCode>, Invalid> {
    match given {
        None => Ok(None),
        Some(429) => Ok(Some(http::StatusCode::TOO_MANY_REQUESTS)),
        Some(200) => Ok(Some(http::StatusCode::OK)),
        Some(n) => Err(Invalid::new(format!(
            "{n}: must be 429 (HTTP's \"too many requests\") or 200 (for SDKs that drop the body of a non-2xx \
             answer, e.g. wechatpy)"
        ))
        .field("throttle_status")),
    }
}

/// Refuses a secret file others may read, or group or others may write:
/// `what` names the setting, `risk` says what a reader could do. Group
/// read is allowed: Kubernetes gives Secret files to the pod's `fsGroup`
/// that way (0440).
#[cfg(unix)]
pub fn check_secret_mode(path: &std::path::Path, what: &str, risk: &str) -> Result<(), Invalid> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path)
        .map_err(|e| Invalid::new(format!("{}: {e}", path.display())).field(what))?
        .permissions()
        .mode();
    if mode & 0o026 != 0 {
        return Err(Invalid::new(format!(
            "{} has mode {:04o}: others can read it, or group or others can write it; {risk}: chmod 600 {}",
            path.display(),
            mode & 0o7777,
            path.display()
        ))
        .field(what));
    }
    Ok(())
}

#[cfg(not(unix))]
pub fn check_secret_mode(_path: &std::path::Path, _what: &str, _risk: &str) -> Result<(), Invalid> {
    Ok(())
}

/// Whether `url` (an `X-Wxgate-Callback`) is under the `callbacks` prefix
/// `prefix`, for every receiver however it normalises its URL: what follows
/// the prefix holds no `..` and no encoded dot, slash or backslash
/// (`%2e`, `%2f`, `%5c`, any case) and no backslash (which URL parsers read
/// as `/`), so `…/hooks/%2e%2e/admin/reset` is never a way out of
/// `…/hooks/`. A URL is refused, never decoded and guessed at.
pub fn under_prefix(url: &str, prefix: &str) -> bool {
    let Some(rest) = url.strip_prefix(prefix) else { return false };
    let lower = rest.to_ascii_lowercase();
    !(lower.contains("..")
        || lower.contains('\\')
        || ["%2e", "%2f", "%5c"].iter().any(|encoded| lower.contains(encoded)))
}
