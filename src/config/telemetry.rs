//! `[telemetry]` → [`Telemetry`]: where wxgate exports its traces
//! (OpenTelemetry, OTLP over HTTP with protobuf; docs/tracing.md), and
//! which calls it traces. Off unless `[telemetry] endpoint` or one of the
//! standard `OTEL_EXPORTER_OTLP_*ENDPOINT` variables names a collector.
//!
//! The file's keys win over the standard variables where both are given
//! (the file is the explicit configuration); the variables fill in the
//! rest, so an operator (or the OpenTelemetry Operator's injection) can
//! turn tracing on without editing the file. Read at start: a reload keeps
//! the running exporter (`crate::ops::reload`).

use std::path::PathBuf;
use std::time::Duration;

use http::{HeaderName, HeaderValue, Uri};
use serde::Deserialize;

use super::errors::Invalid;
use super::units::{beside_config, check_secret_mode, parse_duration, parse_size};
pub use crate::telemetry::trace::Sampling as Sampler;

const TABLE: &str = "[telemetry]";

/// `max_attribute_bytes` by default: a WeChat path, a rule's, account's or
/// caller's name is far shorter; a caller's 60 KiB path is cut to this.
const ATTRIBUTE_BYTES: usize = 256;
/// `max_queued_bytes` by default: `max_queued`'s 4096 spans of ordinary
/// calls (about 1 KB each) fit in it; spans made long reach it first.
const QUEUED_BYTES: u64 = 8 << 20;

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTelemetry {
    pub endpoint: Option<String>,
    pub headers_file: Option<PathBuf>,
    pub sampling: Option<f64>,
    pub service_name: Option<String>,
    pub max_queued: Option<usize>,
    pub max_queued_bytes: Option<String>,
    pub max_attribute_bytes: Option<usize>,
    pub timeout: Option<String>,
    pub batch_delay: Option<String>,
}

/// `[telemetry]`, compiled: tracing is on.
#[derive(Debug, Clone, PartialEq)]
pub struct Telemetry {
    /// Where spans are posted (`…/v1/traces`).
    pub endpoint: Uri,
    /// Sent with every export (a vendor's API key): never logged.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// Which calls are traced (`OTEL_TRACES_SAMPLER`'s rules).
    pub sampler: Sampler,
    /// `service.name` of the spans' resource.
    pub service_name: String,
    /// Most spans waiting to be exported; past it a span is dropped and
    /// counted (`wxgate_trace_spans_total{what="dropped"}`), never waited for.
    pub max_queued: usize,
    /// Most bytes of spans held for export (queued, or in the export under
    /// way; `crate::telemetry::trace::attr::held_bytes`): past it a span is
    /// dropped and counted as past `max_queued`.
    pub max_queued_bytes: usize,
    /// Most bytes of a span's name and of each of its string values (a
    /// path, an error's text): longer is cut, at a character boundary.
    pub max_attribute_bytes: usize,
    /// Longest one export may take (then its spans are dropped).
    pub timeout: Duration,
    /// Longest a span waits to be sent with others.
    pub batch_delay: Duration,
}

/// `[telemetry]` and the standard variables (`env`: a variable's value),
/// compiled; `None`: tracing off.
pub(super) fn compile(
    raw: RawTelemetry,
    dir: Option<&std::path::Path>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<Telemetry>, Invalid> {
    let var = |name: &str| env(name).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
    if var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) && raw.endpoint.is_none() {
        return Ok(None);
    }
    if var("OTEL_TRACES_EXPORTER").is_some_and(|v| v == "none") && raw.endpoint.is_none() {
        return Ok(None);
    }
    let endpoint = match (&raw.endpoint, var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), var("OTEL_EXPORTER_OTLP_ENDPOINT"))
    {
        (Some(base), _, _) => traces_url(base, true).map_err(|e| Invalid::at(TABLE, "endpoint", e))?,
        (None, Some(url), _) => {
            traces_url(&url, false).map_err(|e| Invalid::at_field("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", e))?
        }
        (None, None, Some(base)) => {
            traces_url(&base, true).map_err(|e| Invalid::at_field("OTEL_EXPORTER_OTLP_ENDPOINT", e))?
        }
        (None, None, None) => {
            if raw.headers_file.is_some() || raw.sampling.is_some() || raw.service_name.is_some() {
                return Err(Invalid::at(
                    TABLE,
                    "endpoint",
                    "missing: give the collector's OTLP/HTTP address (e.g. \"http://otel-collector:4318\"), \
                     or set OTEL_EXPORTER_OTLP_ENDPOINT",
                ));
            }
            return Ok(None);
        }
    };
    let headers = match &raw.headers_file {
        Some(path) => {
            let path = beside_config(dir, path);
            check_secret_mode(&path, "headers_file", "whoever reads it can send to the collector with its key")
                .map_err(|e| e.table(TABLE))?;
            let text = std::fs::read_to_string(&path)
                .map_err(|e| Invalid::at(TABLE, "headers_file", format!("{}: {e}", path.display())))?;
            headers(&text).map_err(|e| Invalid::at(TABLE, "headers_file", format!("{}: {e}", path.display())))?
        }
        None => match var("OTEL_EXPORTER_OTLP_TRACES_HEADERS").or_else(|| var("OTEL_EXPORTER_OTLP_HEADERS")) {
            Some(text) => headers(&text).map_err(|e| Invalid::at_field("OTEL_EXPORTER_OTLP_HEADERS", e))?,
            None => Vec::new(),
        },
    };
    let sampler = match raw.sampling {
        Some(r) if (0.0..=1.0).contains(&r) => Sampler { ratio: r, parent_based: true },
        Some(_) => return Err(Invalid::at(TABLE, "sampling", "must be between 0 and 1 (the share of calls traced)")),
        None => sampler(var("OTEL_TRACES_SAMPLER").as_deref(), var("OTEL_TRACES_SAMPLER_ARG").as_deref())
            .map_err(|e| Invalid::at_field("OTEL_TRACES_SAMPLER", e))?,
    };
    let service_name = raw.service_name.or_else(|| var("OTEL_SERVICE_NAME")).unwrap_or_else(|| "wxgate".into());
    if service_name.is_empty() || service_name.len() > 255 {
        return Err(Invalid::at(TABLE, "service_name", "must be 1 to 255 characters"));
    }
    let max_queued = match raw.max_queued {
        None => 4096,
        Some(n @ 1..=1_000_000) => n,
        Some(_) => return Err(Invalid::at(TABLE, "max_queued", "must be between 1 and 1000000 spans")),
    };
    let max_queued_bytes = match raw.max_queued_bytes.as_deref() {
        None => QUEUED_BYTES,
        Some(text) => match parse_size(text).map_err(|e| e.field("max_queued_bytes").table(TABLE))? {
            n @ 65_536..=0x4000_0000 => n,
            _ => {
                return Err(Invalid::at(
                    TABLE,
                    "max_queued_bytes",
                    format!("\"{text}\" must be between 64KiB and 1GiB"),
                ))
            }
        },
    };
    let max_attribute_bytes = attribute_bytes(raw.max_attribute_bytes, &var)?;
    let duration = |key: &str, text: &Option<String>, default: Duration| -> Result<Duration, Invalid> {
        let Some(text) = text else { return Ok(default) };
        let d = parse_duration(text).map_err(|e| e.field(key).table(TABLE))?;
        if d < Duration::from_millis(10) || d > Duration::from_secs(60) {
            return Err(Invalid::at(TABLE, key, format!("\"{text}\" must be between 10ms and 60s")));
        }
        Ok(d)
    };
    Ok(Some(Telemetry {
        endpoint,
        headers,
        sampler,
        service_name,
        max_queued,
        max_queued_bytes: usize::try_from(max_queued_bytes).unwrap_or(usize::MAX),
        max_attribute_bytes,
        timeout: duration("timeout", &raw.timeout, Duration::from_secs(10))?,
        batch_delay: duration("batch_delay", &raw.batch_delay, Duration::from_secs(1))?,
    }))
}

/// `max_attribute_bytes`, else OpenTelemetry's span attribute value
/// length limit, else its attribute value length limit, else 256. The
/// specification counts characters; wxgate counts bytes and cuts at a
/// character boundary, so a value also keeps to the limit in characters.
fn attribute_bytes(given: Option<usize>, var: &dyn Fn(&str) -> Option<String>) -> Result<usize, Invalid> {
    const RANGE: &str = "must be between 1 and 65536 bytes";
    let (n, field) = match given {
        Some(n) => (n, None),
        None => {
            let from = ["OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT"]
                .into_iter()
                .find_map(|name| var(name).map(|v| (name, v)));
            let Some((name, text)) = from else { return Ok(ATTRIBUTE_BYTES) };
            let n = text.parse::<usize>().map_err(|_| Invalid::at_field(name, format!("\"{text}\" {RANGE}")))?;
            (n, Some(name))
        }
    };
    match (n, field) {
        (1..=65_536, _) => Ok(n),
        (_, None) => Err(Invalid::at(TABLE, "max_attribute_bytes", RANGE)),
        (_, Some(name)) => Err(Invalid::at_field(name, format!("{n} {RANGE}"))),
    }
}

/// The traces URL: a base (`http://collector:4318`) gets `/v1/traces`, as
/// OTLP/HTTP's `OTEL_EXPORTER_OTLP_ENDPOINT` does; a signal's own URL
/// is used as given.
fn traces_url(text: &str, base: bool) -> Result<Uri, String> {
    let url = match base {
        true => format!("{}/v1/traces", text.trim_end_matches('/')),
        false => text.to_owned(),
    };
    let uri: Uri = url.parse().map_err(|e| format!("\"{text}\" is not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http" | "https") if uri.host().is_some() => {}
        _ => return Err(format!("\"{text}\" must be an http:// or https:// URL")),
    }
    if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
        return Err("give credentials in headers_file (or OTEL_EXPORTER_OTLP_HEADERS), not in the URL".into());
    }
    Ok(uri)
}

/// Headers in OpenTelemetry's format (`OTEL_EXPORTER_OTLP_HEADERS`):
/// `name=value` pairs, separated by commas (or lines, in a file), values
/// percent-encoded. An error never quotes a value (it may be a key).
fn headers(text: &str) -> Result<Vec<(HeaderName, HeaderValue)>, String> {
    let mut out = Vec::new();
    for pair in text.split([',', '\n']).map(str::trim).filter(|p| !p.is_empty() && !p.starts_with('#')) {
        let Some((name, value)) = pair.split_once('=') else {
            return Err("each header is name=value (comma-separated)".into());
        };
        let name = HeaderName::from_bytes(name.trim().as_bytes())
            .map_err(|_| format!("\"{}\" is not a header name", name.trim()))?;
        let value =
            percent_decode(value.trim()).ok_or_else(|| format!("the value of {name} is not percent-encoded text"))?;
        let mut value =
            HeaderValue::from_str(&value).map_err(|_| format!("the value of {name} is not a header value"))?;
        value.set_sensitive(true);
        out.push((name, value));
    }
    Ok(out)
}

/// `%XX` escapes decoded (OpenTelemetry's header values are URL-encoded).
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// `OTEL_TRACES_SAMPLER` (and its argument): the specification's names;
/// none: `parentbased_always_on`.
fn sampler(name: Option<&str>, arg: Option<&str>) -> Result<Sampler, String> {
    let ratio = || -> Result<f64, String> {
        match arg {
            None => Ok(1.0),
            Some(a) => match a.parse::<f64>() {
                Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
                _ => Err(format!("OTEL_TRACES_SAMPLER_ARG \"{a}\" must be a ratio between 0 and 1")),
            },
        }
    };
    Ok(match name.unwrap_or("parentbased_always_on") {
        "always_on" => Sampler { ratio: 1.0, parent_based: false },
        "always_off" => Sampler { ratio: 0.0, parent_based: false },
        "traceidratio" => Sampler { ratio: ratio()?, parent_based: false },
        "parentbased_always_on" => Sampler { ratio: 1.0, parent_based: true },
        "parentbased_always_off" => Sampler { ratio: 0.0, parent_based: true },
        "parentbased_traceidratio" => Sampler { ratio: ratio()?, parent_based: true },
        other => {
            return Err(format!(
                "\"{other}\" is not one wxgate knows: always_on, always_off, traceidratio, parentbased_always_on, \
                 parentbased_always_off, parentbased_traceidratio"
            ))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| vars.iter().find(|(n, _)| *n == name).map(|(_, v)| (*v).to_owned())
    }

    #[test]
    fn off_without_an_endpoint_and_on_with_the_standard_variable() {
        assert_eq!(compile(RawTelemetry::default(), None, &env(&[])).expect("off"), None);
        let on = compile(RawTelemetry::default(), None, &env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318/")]))
            .expect("valid")
            .expect("on");
        assert_eq!(on.endpoint, "http://c:4318/v1/traces");
        assert_eq!(on.sampler, Sampler { ratio: 1.0, parent_based: true });
        let disabled = env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"), ("OTEL_SDK_DISABLED", "true")]);
        assert_eq!(compile(RawTelemetry::default(), None, &disabled).expect("off"), None);
    }

    #[test]
    fn the_file_wins_over_the_variables() {
        let raw = RawTelemetry {
            endpoint: Some("https://otlp.example.com".into()),
            sampling: Some(0.01),
            ..Default::default()
        };
        let vars = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://other:4318"),
            ("OTEL_TRACES_SAMPLER", "always_off"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=abc%3D,x-team=wx"),
            ("OTEL_SERVICE_NAME", "egress"),
        ]);
        let t = compile(raw, None, &vars).expect("valid").expect("on");
        assert_eq!(t.endpoint, "https://otlp.example.com/v1/traces");
        assert_eq!(t.sampler, Sampler { ratio: 0.01, parent_based: true });
        assert_eq!(t.service_name, "egress");
        let names: Vec<(&str, &[u8])> = t.headers.iter().map(|(n, v)| (n.as_str(), v.as_bytes())).collect();
        assert_eq!(names, vec![("api-key", &b"abc="[..]), ("x-team", &b"wx"[..])]);
    }

    #[test]
    fn the_bounds_default_and_come_from_the_file_or_the_standard_variables() {
        let on = |raw: RawTelemetry, vars: &[(&str, &str)]| {
            let raw = RawTelemetry { endpoint: Some("http://c".into()), ..raw };
            compile(raw, None, &env(vars)).map(|t| t.map(|t| (t.max_queued_bytes, t.max_attribute_bytes)))
        };
        assert_eq!(on(RawTelemetry::default(), &[]).expect("valid"), Some((8 << 20, 256)));
        let file = RawTelemetry {
            max_queued_bytes: Some("64KiB".into()),
            max_attribute_bytes: Some(1024),
            ..Default::default()
        };
        let vars = [("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "512"), ("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "64")];
        assert_eq!(on(file, &vars).expect("valid"), Some((65_536, 1024)));
        // The span's limit wins over the general one.
        assert_eq!(on(RawTelemetry::default(), &vars).expect("valid"), Some((8 << 20, 512)));
        assert_eq!(on(RawTelemetry::default(), &vars[1..]).expect("valid"), Some((8 << 20, 64)));
        let bad = |raw: RawTelemetry, vars: &[(&str, &str)]| on(raw, vars).expect_err("refused").to_string();
        let bytes = |text: &str| RawTelemetry { max_queued_bytes: Some(text.into()), ..Default::default() };
        assert_eq!(bad(bytes("1KiB"), &[]), "[telemetry] max_queued_bytes: \"1KiB\" must be between 64KiB and 1GiB");
        assert_eq!(bad(bytes("2GiB"), &[]), "[telemetry] max_queued_bytes: \"2GiB\" must be between 64KiB and 1GiB");
        assert!(bad(bytes("lots"), &[]).starts_with("[telemetry] max_queued_bytes: expected a size"));
        let attribute = RawTelemetry { max_attribute_bytes: Some(0), ..Default::default() };
        assert_eq!(bad(attribute, &[]), "[telemetry] max_attribute_bytes: must be between 1 and 65536 bytes");
        assert_eq!(
            bad(RawTelemetry::default(), &[("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "none")]),
            "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT: \"none\" must be between 1 and 65536 bytes"
        );
        assert_eq!(
            bad(RawTelemetry::default(), &[("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "100000")]),
            "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT: 100000 must be between 1 and 65536 bytes"
        );
    }

    #[test]
    fn bad_values_are_refused_without_quoting_a_header_value() {
        let bad =
            |raw: RawTelemetry, vars: &[(&str, &str)]| compile(raw, None, &env(vars)).expect_err("refused").to_string();
        assert!(bad(
            RawTelemetry { sampling: Some(2.0), endpoint: Some("http://c".into()), ..Default::default() },
            &[]
        )
        .contains("sampling: must be between 0 and 1"));
        assert!(bad(RawTelemetry { endpoint: Some("ftp://c".into()), ..Default::default() }, &[])
            .contains("must be an http:// or https:// URL"));
        assert!(bad(RawTelemetry { sampling: Some(0.5), ..Default::default() }, &[]).contains("endpoint: missing"));
        let e = bad(
            RawTelemetry::default(),
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c"), ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=s3cr\u{7f}t")],
        );
        assert!(e.contains("not a header value") && !e.contains("s3cr"), "{e}");
        let e = bad(
            RawTelemetry::default(),
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c"), ("OTEL_TRACES_SAMPLER", "jaeger")],
        );
        assert!(e.contains("\"jaeger\" is not one wxgate knows"), "{e}");
    }
}
