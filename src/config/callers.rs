//! `[[caller]]` → [`CallerPolicy`]: names, priorities and the flood guard's
//! `rate`. A message names the caller and the field; [`super::compile`]
//! adds the file and line.

use std::collections::HashSet;
use std::num::NonZeroU32;
use std::ops::Range;
use std::sync::Arc;

use toml::Spanned;

use super::raw::RawCaller;
use super::units::valid_name;
use super::{CallerPolicy, CallerRate, Priority, RatePer};

/// The metrics label of every undeclared caller, so no caller may be named so.
const RESERVED: &str = "other";
/// Most calls a `rate` may name per period.
const MAX_RATE_COUNT: u32 = 1_000_000;

/// Every `[[caller]]`, in file order; `Err` names the offending one's span.
pub(super) fn compile(list: Vec<Spanned<RawCaller>>) -> Result<Vec<Arc<CallerPolicy>>, (Range<usize>, String)> {
    let mut names = HashSet::with_capacity(list.len());
    let mut out = Vec::with_capacity(list.len());
    for c in list {
        let span = c.span();
        let c = c.into_inner();
        if !valid_name(&c.name) {
            return Err((span, format!("[[caller]] name \"{}\" must be 1-64 of [A-Za-z0-9_-]", c.name)));
        }
        if c.name == RESERVED {
            return Err((
                span,
                format!(
                    "[[caller]] name \"{RESERVED}\" is taken: it is the metrics label of every caller not declared"
                ),
            ));
        }
        if !names.insert(c.name.clone()) {
            return Err((span, format!("caller \"{}\": another [[caller]] has the same name", c.name)));
        }
        let err = |m: String| (span.clone(), format!("caller \"{}\": {m}", c.name));
        let priority = match c.priority.as_deref() {
            None | Some("normal") => Priority::Normal,
            Some("high") => Priority::High,
            Some(other) => {
                return Err(err(format!("priority: \"{other}\" is unknown (expected \"high\" or \"normal\")")))
            }
        };
        let rate = match c.rate.as_deref() {
            None => None,
            Some(text) => Some(parse_rate(text).map_err(|m| err(format!("rate: \"{text}\": {m}")))?),
        };
        out.push(Arc::new(CallerPolicy { name: c.name.into(), priority, rate }));
    }
    Ok(out)
}

/// `"N/s"`, `"N/min"` (or `"N/m"`), `"N/h"`; N from 1 to 1000000.
fn parse_rate(text: &str) -> Result<CallerRate, String> {
    let usage = "write calls per period: \"200/s\", \"600/min\" or \"5000/h\"";
    let Some((count, per)) = text.split_once('/') else { return Err(usage.into()) };
    let per = match per.trim() {
        "s" => RatePer::Second,
        "m" | "min" => RatePer::Minute,
        "h" => RatePer::Hour,
        _ => return Err(usage.into()),
    };
    let count: u32 = count.trim().parse().map_err(|_| usage.to_owned())?;
    let count = NonZeroU32::new(count).ok_or("the count must be at least 1 (leave rate out for no guard)")?;
    if count.get() > MAX_RATE_COUNT {
        return Err(format!("the count must be at most {MAX_RATE_COUNT}"));
    }
    Ok(CallerRate { count, per })
}

#[cfg(test)]
mod tests {
    use super::*;

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
