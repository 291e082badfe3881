//! The request side of clear_quota: which paths it is at, and the appid a
//! call's body (or query) names, read by the identify phase.

use crate::config::valid_account;
use crate::error::ProxyError;
use crate::features::accounts::query;
use crate::features::hooks::body::request_json;

/// The APIs that reset an account's counters at WeChat.
pub const PATHS: [&str; 2] = ["/cgi-bin/clear_quota", "/cgi-bin/clear_quota/v2"];

/// A `clear_quota` call on its way: the appid it names (if valid).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Clearing {
    pub appid: Option<String>,
}

/// Whether `path` (as [`crate::config::routes::refusal`] accepted it: normal but
/// for a trailing `/`) is a clear_quota API.
pub fn at(path: &str) -> bool {
    PATHS.contains(&path.strip_suffix('/').unwrap_or(path))
}

/// The appid a clear_quota names, from its `body` (read whole, at most
/// [`crate::features::accounts::token_requests::BODY_CAP`] bytes; forwarded as it
/// is) or its query.
pub fn read(body: Option<&[u8]>, query: Option<&str>) -> Result<Clearing, ProxyError> {
    let json = request_json(body)?;
    let form = body.and_then(|b| std::str::from_utf8(b).ok()).filter(|_| json.is_none());
    if let Some(why) = form.and_then(query::ambiguity) {
        return Err(ProxyError::BadRequest(format!("the body: {why}")));
    }
    let from_json = || json.as_ref()?.get("appid")?.as_str().map(str::to_owned);
    let from_form = |text: Option<&str>| {
        let raw = query::param(text?, "appid")?;
        String::from_utf8(raw.into_owned()).ok()
    };
    if let (Some(in_body), Some(in_query)) = (from_json(), query.and_then(|q| query::param(q, "appid"))) {
        if in_body.as_bytes() != &*in_query {
            return Err(ProxyError::BadRequest(
                "appid is given in the query and, differently, in the body; give it once".into(),
            ));
        }
    }
    let given = from_json().or_else(|| from_form(form)).or_else(|| from_form(query));
    // WeChat clears the appid it reads: one wxgate cannot read as an
    // account (padded, encoded into something else) is refused.
    if given.as_ref().is_some_and(|a| !valid_account(a)) {
        return Err(ProxyError::BadRequest(
            "this clear_quota names an appid that is not 1-64 characters of A-Z a-z 0-9 _ -".into(),
        ));
    }
    Ok(Clearing { appid: given })
}
