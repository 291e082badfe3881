//! Phase 1, accept: only origin-form requests to this proxy, with a body it
//! may forward; wxgate is never an open proxy.

use http::uri::PathAndQuery;
use http::{Method, Request};
use hyper::body::Incoming;

use super::call::Call;
use super::source::Source;
use crate::config::routes;
use crate::error::{Early, ProxyError};

/// What the access log (and every other log line) shows as the path of a
/// call whose request target was refused before it was read as a WeChat
/// API path ([`routes::refusal`], an `@account` prefix, `CONNECT`,
/// absolute-form): a fixed text. Such a path may be anything a client
/// wrote, a secret included (`…/send%3Faccess_token=…`, `;secret=…`); no
/// cut of it is safe (an appsecret is 32 lowercase hex digits, which any
/// path may carry before the refused byte), and the refusal's reason is
/// logged beside it.
pub const REFUSED_PATH: &str = "<refused path>";

/// The path and query to send upstream. A client's request: only
/// origin-form, to this proxy, with a body it may forward; bytes unchanged
/// but for an `@account` first segment, which goes to `call.arrived.named`.
/// A call wxgate makes itself: the target its maker gave, nothing checked;
/// its whole body is set on the call here, for the hooks and meter.
pub fn accept(call: &mut Call, source: &mut Source<'_>) -> Result<PathAndQuery, Early> {
    match source {
        Source::Client(req, _) => request(call, req),
        Source::Own { target, body, .. } => {
            call.body = Some(std::mem::take(body));
            Ok(target.clone())
        }
    }
}

/// A client's request accepted: its target (see [`accept`]).
fn request(call: &mut Call, req: &Request<Incoming>) -> Result<PathAndQuery, Early> {
    let target = match target(call, req) {
        Ok(target) => target,
        Err(e) => {
            REFUSED_PATH.clone_into(&mut call.arrived.path);
            return Err(e.into());
        }
    };
    // Counted before anything is decided or forwarded; a streamed body that
    // grows past the cap is cut off on the way (413 as well).
    let max_body = call.arrived.config.server.max_body;
    let declared = req
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max_body) {
        return Err(ProxyError::TooLarge(format!(
            "the request body is larger than {max_body} bytes ([server] max_body)"
        ))
        .into());
    }
    Ok(target)
}

/// The request target, when it is a path a WeChat API can have.
fn target(call: &mut Call, req: &Request<Incoming>) -> Result<PathAndQuery, ProxyError> {
    if req.method() == Method::CONNECT {
        return Err(ProxyError::BadRequest(connect_refusal(call, req)));
    }
    if req.uri().scheme().is_some() || req.uri().authority().is_some() {
        return Err(ProxyError::BadRequest(
            "absolute-form request targets are not served: send origin-form (/cgi-bin/...) to wxgate".into(),
        ));
    }
    let target = match req.uri().path_and_query() {
        Some(pq) if pq.as_str().starts_with('/') => pq.clone(),
        _ => return Err(ProxyError::BadRequest("the request target must be a path starting with /".into())),
    };
    let target = match split_domain(call, &target)? {
        None => target,
        Some(rest) => rest,
    };
    let target = match super::identify::split_prefix(&target)? {
        None => target,
        Some((account, rest)) => {
            rest.path().clone_into(&mut call.arrived.path);
            call.arrived.named = Some(account);
            rest
        }
    };
    // Before any rule is looked up: a path no WeChat API has never reaches
    // the limits nor WeChat (see `crate::config::routes`).
    if let Some(why) = routes::refusal(target.path()) {
        return Err(ProxyError::BadRequest(why.into()));
    }
    if first_segment(target.path()).1 {
        return Err(ProxyError::BadRequest(
            "no WeChat API path has a dot in its first segment; a domain prefix goes first, once: \
             /qyapi.weixin.qq.com/@account/cgi-bin/..."
                .into(),
        ));
    }
    Ok(target)
}

/// The first segment of a path (`/a/b` → `a`), and whether it has a dot:
/// one pass over its bytes (it runs on every call).
fn first_segment(path: &str) -> (&str, bool) {
    let bytes = path.as_bytes();
    let start = usize::from(bytes.first() == Some(&b'/'));
    let mut end = bytes.len();
    let mut dot = false;
    for (i, &b) in bytes.iter().enumerate().skip(start) {
        if b == b'/' {
            end = i;
            break;
        }
        dot |= b == b'.';
    }
    (path.get(start..end).unwrap_or(""), dot)
}

/// The call's WeChat domain ([`crate::config::domain`]): an intercepted
/// call's host's; else a first segment that is a domain's host (split off:
/// the target without it, query unchanged); else domain 0. A WeChat API
/// path has no dot in its first segment, so one with a dot names a domain
/// or is refused.
fn split_domain(call: &mut Call, target: &PathAndQuery) -> Result<Option<PathAndQuery>, ProxyError> {
    let config = &call.arrived.config;
    let (first, dot) = first_segment(target.path());
    if let Some(host) = &call.arrived.intercepted {
        if dot {
            return Err(ProxyError::BadRequest(
                "an intercepted call's host is its domain: send the API path without a domain prefix".into(),
            ));
        }
        call.arrived.domain = config.domain_of_host(&host.name).ok_or_else(|| {
            ProxyError::BadRequest(format!(
                "no domain serves {} since a reload: restart wxgate, or put its [[domain]] back",
                host.name
            ))
        })?;
        return Ok(None);
    }
    // A segment no host can be (`..`, `send.`, capitals) is left to the
    // path's own check (`routes::refusal`), which says why.
    if !dot || !crate::config::domain::valid_host(first) {
        return Ok(None);
    }
    let Some(domain) = config.domains.iter().position(|d| *d.host == *first) else {
        let served: Vec<&str> = config.domains.iter().map(|d| &*d.host).collect();
        // Quoted only when it is a WeChat host: a path may carry anything.
        let named = match crate::config::domain::family(first) {
            Some(_) => format!("{first} is a WeChat host no [[domain]] of this wxgate serves"),
            None => "the first path segment names no domain".to_owned(),
        };
        return Err(ProxyError::BadRequest(format!(
            "{named}; this wxgate serves {} (a prefix /<host>/ picks one; none: {})",
            served.join(", "),
            served[0]
        )));
    };
    let rest = &target.path()[1 + first.len()..];
    if rest.len() < 2 {
        return Err(ProxyError::BadRequest(format!(
            "a domain prefix must be followed by the API path: /{first}/cgi-bin/..."
        )));
    }
    let mut stripped = String::with_capacity(target.as_str().len());
    stripped.push_str(rest);
    if let Some(q) = target.query() {
        stripped.push('?');
        stripped.push_str(q);
    }
    let stripped = PathAndQuery::from_maybe_shared(bytes::Bytes::from(stripped)).map_err(|e| {
        ProxyError::BadRequest(format!("the path after the domain prefix is not a request target: {e}"))
    })?;
    rest.clone_into(&mut call.arrived.path);
    call.arrived.domain = domain;
    Ok(Some(stripped))
}

/// Why a `CONNECT` is refused, in words an on-call engineer can act on.
fn connect_refusal(call: &Call, req: &Request<Incoming>) -> String {
    let Some(intercept) = &call.arrived.config.intercept else {
        return "CONNECT is not served: wxgate only forwards to its configured upstream".into();
    };
    if call.arrived.intercepted.is_some() {
        return "CONNECT inside an intercepted tunnel is not served".into();
    }
    let hosts: Vec<&str> = intercept.hosts.iter().map(|h| &**h).collect();
    // The target (authority-form) is quoted only when it is a host name
    // and port: never bytes a client could fill with something else.
    let target = req.uri().authority().map(|a| a.as_str()).filter(|a| {
        a.len() <= 260 && a.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-.:".contains(&b))
    });
    let target = target.unwrap_or("to this target");
    format!(
        "CONNECT {target} is refused: wxgate intercepts only {}, port 443, and is never a proxy to anything else; \
         send other hosts direct (NO_PROXY, e.g. NO_PROXY=localhost,127.0.0.1,.svc,.cluster.local,<your other hosts>), \
         or give HTTPS_PROXY to the WeChat client only",
        hosts.join(", ")
    )
}
