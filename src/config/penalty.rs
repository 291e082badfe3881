//! `[[penalty]]`: compiled into [`PenaltyPolicy`]s (the config's, and a
//! `[[domain]]` file's to compare with it).

use std::collections::HashSet;

use toml::Spanned;

use super::errors::{leading_key, ConfigError, Ctx, Invalid};
use super::raw::RawPenalty;
use crate::limit::penalty::{PenaltyLength, PenaltyPolicy};
use crate::time::Span;

/// Every `[[penalty]]`: one per errcode.
pub(super) fn compile(list: Vec<Spanned<RawPenalty>>, ctx: &Ctx<'_>) -> Result<Vec<PenaltyPolicy>, ConfigError> {
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(list.len());
    for p in list {
        let span = p.span();
        let p = p.into_inner();
        if !seen.insert(p.errcode) {
            return Err(ctx.at_field(span, "errcode", format!("[[penalty]] errcode {} is listed twice", p.errcode)));
        }
        // "[[penalty]] errcode 45009: seconds must be ...": at `seconds`.
        let table = format!("[[penalty]] errcode {}", p.errcode);
        out.push(compile_penalty(p).map_err(|e| {
            let key = leading_key(&e.message).to_owned();
            ctx.at_field(span.clone(), &key, e.table(table))
        })?);
    }
    Ok(out)
}

/// One `[[penalty]]`; an error names the field first (`seconds must be at least 1`).
fn compile_penalty(p: RawPenalty) -> Result<PenaltyPolicy, Invalid> {
    let length = match (p.seconds, p.until.as_deref()) {
        (Some(0), None) => return Err(Invalid::new("seconds must be at least 1")),
        (Some(s), None) => PenaltyLength::Escalating { base: Span::from_secs(s) },
        (None, Some("next_minute")) => PenaltyLength::NextMinute,
        (None, Some(other)) => {
            return Err(Invalid::new(format!("until = \"{other}\" is unknown (expected \"next_minute\")")))
        }
        (Some(_), Some(_)) => return Err(Invalid::new("give seconds or until, not both")),
        (None, None) => return Err(Invalid::new("needs seconds or until")),
    };
    let max = match p.max_seconds {
        Some(0) => return Err(Invalid::new("max_seconds must be at least 1")),
        Some(s) => Some(Span::from_secs(s)),
        None => None,
    };
    Ok(PenaltyPolicy { errcode: p.errcode, length, max })
}
