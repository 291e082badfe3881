//! The console: one page on the admin listener (`GET /`), its script and
//! its style, compiled in (`src/ops/console/`), reading the `/v1` API every
//! few seconds. Nothing is fetched from anywhere else: the answers carry a
//! Content-Security-Policy allowing only the listener's own scripts,
//! styles and requests (no inline code, no frames, no forms sent
//! elsewhere). Behind the same token as `/v1` (`Authorization: Bearer`, or
//! HTTP Basic with the token as password, which a browser asks for).
//!
//! Also here: the task that reads each rule's call counters into
//! [`crate::telemetry::history`] for the console's plots.

use std::sync::Weak;

use http::header::{HeaderValue, CACHE_CONTROL};
use http::StatusCode;

use crate::ops::answers::{answer, Answer};
use crate::proxy::app::App;
use crate::telemetry::history::EVERY_US;
use crate::time::Span;

const PAGE: &str = include_str!("console/index.html");
const SCRIPT: &str = include_str!("console/console.js");
const STYLE: &str = include_str!("console/console.css");

/// What the console's answers allow: its own script, style and `/v1`
/// reads, inline SVG plots; nothing inline, nothing framed.
pub const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                          connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The console's file at `path` (`/`, `/console.js`, `/console.css`).
pub fn asset(path: &str) -> Option<Answer> {
    let (content_type, body) = match path {
        "/" | "/index.html" => ("text/html; charset=utf-8", PAGE),
        "/console.js" => ("text/javascript; charset=utf-8", SCRIPT),
        "/console.css" => ("text/css; charset=utf-8", STYLE),
        _ => return None,
    };
    let mut resp = answer(StatusCode::OK, content_type, body);
    let h = resp.headers_mut();
    h.insert("content-security-policy", HeaderValue::from_static(POLICY));
    h.insert("x-content-type-options", HeaderValue::from_static("nosniff"));
    h.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    h.insert("x-frame-options", HeaderValue::from_static("DENY"));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Some(resp)
}

/// Reads the rules' call counters into the app's history every
/// [`EVERY_US`] (the first at once); ends when the app is dropped.
pub fn spawn(app: Weak<App>) {
    tokio::spawn(async move {
        loop {
            let Some(a) = app.upgrade() else { return };
            let rules: Vec<std::sync::Arc<str>> = a.config.load().rules.iter().map(|r| r.name.clone()).collect();
            a.history.read(&a.core.metrics, &rules, a.core.clock.now_us());
            let clock = a.core.clock.clone();
            drop(a);
            clock.sleep(Span::from_micros(EVERY_US)).await;
        }
    });
}
