//! `[[caller]]` → [`CallerPolicy`]: names, priorities and the flood guard's
//! `rate`. A message names the caller and the field; [`super::compile`]
//! adds the file and line.

use std::collections::HashSet;
use std::num::NonZeroU32;
use std::ops::Range;
use std::sync::Arc;

use toml::Spanned;

use std::path::Path;

use super::errors::Invalid;
use super::raw::RawCaller;
use super::units::{check_secret_mode, valid_name};
use super::{valid_account, CallerPolicy, CallerRate, Grants, KeyDigest, Priority, RatePer};

/// The metrics label of every undeclared caller, so no caller may be named so.
const RESERVED: &str = "other";
/// Most calls a `rate` may name per period.
const MAX_RATE_COUNT: u32 = 1_000_000;

/// Every `[[caller]]`, in file order; `Err` names the offending one's span.
pub(super) fn compile(
    list: Vec<Spanned<RawCaller>>,
    dir: Option<&Path>,
) -> Result<Vec<Arc<CallerPolicy>>, (Range<usize>, Invalid)> {
    let mut names = HashSet::with_capacity(list.len());
    let mut keys = HashSet::with_capacity(list.len());
    let mut out = Vec::with_capacity(list.len());
    for c in list {
        let span = c.span();
        let c = c.into_inner();
        if !valid_name(&c.name) {
            return Err((span, Invalid::new(format!("[[caller]] name \"{}\" must be 1-64 of [A-Za-z0-9_-]", c.name))));
        }
        if c.name == RESERVED {
            return Err((
                span,
                Invalid::new(format!(
                    "[[caller]] name \"{RESERVED}\" is taken: it is the metrics label of every caller not declared"
                )),
            ));
        }
        let table = format!("caller \"{}\"", c.name);
        if !names.insert(c.name.clone()) {
            return Err((span, Invalid::new("another [[caller]] has the same name").table(table)));
        }
        let err = |e: Invalid| (span.clone(), e.table(table.clone()));
        let priority = match c.priority.as_deref() {
            None | Some("normal") => Priority::Normal,
            Some("high") => Priority::High,
            Some(other) => {
                return Err(err(Invalid::at_field(
                    "priority",
                    format!("\"{other}\" is unknown (expected \"high\" or \"normal\")"),
                )))
            }
        };
        let rate = match c.rate.as_deref() {
            None => None,
            Some(text) => Some(parse_rate(text).map_err(|e| err(e.field(format!("\"{text}\"")).field("rate")))?),
        };
        let key = match (c.key_sha256.as_deref(), c.key_file.as_deref()) {
            (Some(_), Some(_)) => return Err(err(Invalid::new("give key_sha256 or key_file, not both"))),
            (Some(hex), None) => Some(parse_digest(hex).map_err(|e| err(e.field("key_sha256")))?),
            (None, Some(path)) => {
                let path = match dir {
                    Some(dir) if path.is_relative() => dir.join(path),
                    _ => path.to_path_buf(),
                };
                Some(read_key_file(&path).map_err(|e| err(e.field("key_file")))?)
            }
            (None, None) => None,
        };
        if let Some(k) = key {
            if !keys.insert(k) {
                return Err(err(Invalid::new("another [[caller]] has the same key: a key must name one caller")));
            }
        }
        let grants = match c.accounts {
            None => Grants::Unset,
            Some(list) if list.iter().any(|a| a == "*") => {
                if list.len() > 1 {
                    return Err(err(Invalid::at_field("accounts", "\"*\" grants every account; give it alone")));
                }
                Grants::All
            }
            Some(list) if list.is_empty() => {
                return Err(err(Invalid::at_field(
                    "accounts",
                    "an empty list grants nothing; leave the caller out instead",
                )))
            }
            Some(list) => match list.iter().find(|a| !valid_account(a)) {
                Some(bad) => {
                    return Err(err(Invalid::at_field(
                        "accounts",
                        format!("\"{bad}\" is not an account name (1-64 of A-Z a-z 0-9 _ -)"),
                    )))
                }
                None => Grants::Listed(list.into_iter().map(Arc::from).collect()),
            },
        };
        let throttle_status = super::units::throttle_status(c.throttle_status).map_err(&err)?;
        let queue_default = match c.deliver.as_deref() {
            None | Some("live") => false,
            Some("queue") => true,
            Some(other) => {
                return Err(err(Invalid::at_field(
                    "deliver",
                    format!("\"{other}\" is unknown (expected \"live\" or \"queue\")"),
                )))
            }
        };
        let weight = match c.weight {
            None => 1,
            Some(w @ 1..=1000) => w,
            Some(_) => return Err(err(Invalid::at_field("weight", "must be between 1 and 1000"))),
        };
        let queue_strict = match c.queue_order.as_deref() {
            None | Some("recipient") => false,
            Some("strict") => true,
            Some(other) => {
                return Err(err(Invalid::at_field(
                    "queue_order",
                    format!("\"{other}\" is unknown (expected \"recipient\" or \"strict\")"),
                )))
            }
        };
        let callbacks = c.callbacks.unwrap_or_default();
        if let Some(bad) = callbacks.iter().find(|p| !callback_prefix(p)) {
            return Err(err(Invalid::at_field(
                "callbacks",
                format!("\"{bad}\" must be an http:// or https:// URL prefix ending in /, without a query, user or fragment"),
            )));
        }
        out.push(Arc::new(CallerPolicy {
            name: c.name.into(),
            priority,
            rate,
            key,
            grants,
            throttle_status,
            queue_default,
            weight,
            queue_strict,
            callbacks,
        }));
    }
    Ok(out)
}

/// A `callbacks` prefix: an absolute http(s) URL with a host, ending in
/// `/` (so `https://hr/hooks/` never allows `https://hr/hooks-evil`), with
/// no user, query or fragment.
fn callback_prefix(p: &str) -> bool {
    let Ok(uri) = p.parse::<http::Uri>() else { return false };
    matches!(uri.scheme_str(), Some("http" | "https"))
        && uri.host().is_some_and(|h| !h.is_empty())
        && p.ends_with('/')
        && !p.contains(['@', '?', '#'])
}

/// Shortest key read from a `key_file` (a key is a random secret, e.g.
/// `openssl rand -hex 32`).
const MIN_KEY_LEN: usize = 16;

/// `key_sha256`: 64 hex digits.
fn parse_digest(hex: &str) -> Result<KeyDigest, Invalid> {
    let hex = hex.trim();
    let bytes = hex.as_bytes();
    if bytes.len() != 64 || !bytes.iter().all(u8::is_ascii_hexdigit) {
        return Err(Invalid::new("expected the 64 hex digits of the key's SHA-256 (printf %s \"$KEY\" | sha256sum)"));
    }
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks(2).enumerate() {
        let digit = |b: u8| (b as char).to_digit(16).unwrap_or(0) as u8;
        out[i] = digit(pair[0]) << 4 | digit(pair[1]);
    }
    Ok(KeyDigest(out))
}

/// A `key_file`: the key itself (surrounding whitespace ignored), at least
/// [`MIN_KEY_LEN`] bytes, in a file only its owner (and group) may read.
fn read_key_file(path: &Path) -> Result<KeyDigest, Invalid> {
    let shown = path.display().to_string();
    check_secret_mode(path, &shown, "whoever reads it can call as this caller")?;
    let text = std::fs::read(path).map_err(|e| Invalid::new(e.to_string()).field(shown.as_str()))?;
    let key = text.trim_ascii();
    if key.len() < MIN_KEY_LEN {
        let e = format!("the key is shorter than {MIN_KEY_LEN} bytes (make one with: openssl rand -hex 32)");
        return Err(Invalid::new(e).field(shown));
    }
    Ok(KeyDigest::of(key))
}

/// `"N/s"`, `"N/min"` (or `"N/m"`), `"N/h"`; N from 1 to 1000000.
fn parse_rate(text: &str) -> Result<CallerRate, Invalid> {
    let usage = || Invalid::new("write calls per period: \"200/s\", \"600/min\" or \"5000/h\"");
    let Some((count, per)) = text.split_once('/') else { return Err(usage()) };
    let per = match per.trim() {
        "s" => RatePer::Second,
        "m" | "min" => RatePer::Minute,
        "h" => RatePer::Hour,
        _ => return Err(usage()),
    };
    let count: u32 = count.trim().parse().map_err(|_| usage())?;
    let count = NonZeroU32::new(count)
        .ok_or_else(|| Invalid::new("the count must be at least 1 (leave rate out for no guard)"))?;
    if count.get() > MAX_RATE_COUNT {
        return Err(Invalid::new(format!("the count must be at most {MAX_RATE_COUNT}")));
    }
    Ok(CallerRate { count, per })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_digest_is_64_hex_digits() {
        let digest = KeyDigest::of(b"abc");
        let hex: String = digest.0.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert_eq!(parse_digest(&hex.to_uppercase()), Ok(digest));
        for bad in ["", "ba78", &format!("{hex}0"), &format!("{}g", &hex[..63])] {
            assert!(parse_digest(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn rates_are_calls_per_second_minute_or_hour() {
        let rate = |t: &str| parse_rate(t).map(|r| r.to_string());
        assert_eq!(rate("200/s"), Ok("200/s".into()));
        assert_eq!(rate("600/min"), Ok("600/min".into()));
        assert_eq!(rate("600/m"), Ok("600/min".into()));
        assert_eq!(rate(" 5 / h "), Ok("5/h".into()));
        assert_eq!(rate("1000000/s"), Ok("1000000/s".into()));
        for bad in ["", "200", "200/", "/s", "200/sec", "200/d", "-1/s", "1.5/s", "0/s", "1000001/s", "2e3/s"] {
            assert!(parse_rate(bad).is_err(), "{bad}");
        }
        assert!((parse_rate("30/min").expect("rate").per_second() - 0.5).abs() < 1e-9);
    }
}
