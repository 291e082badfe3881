//! The command-line health check, `wxgate probe` (not the store breaker's
//! probe of Redis, `RedisStore::probe`): one HTTP/1.1 GET to an admin endpoint (by default
//! `/readyz`), for container health checks in images without curl.
//!
//! A 2xx answer is healthy; anything else (another status, a refused or
//! timed-out connection, a broken answer) is not, with a one-line reason.
//! A plain blocking `std::net::TcpStream` is enough here: one request to a
//! loopback listener, no TLS (the admin listener speaks plain HTTP), and no
//! runtime to start, so the probe costs a few syscalls every interval.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

/// The most of an answer read: the status line and the start of the body
/// (quoted in the reason on failure) are all the probe looks at.
const MAX_ANSWER: u64 = 16 * 1024;
/// The most of a failing answer's body quoted in its reason.
const MAX_QUOTED: usize = 400;

/// The URL probed for an admin listener bound to `admin`: its address, with
/// an unspecified IP (`0.0.0.0`, `::`) replaced by loopback of that family.
pub fn admin_url(admin: SocketAddr, path: &str) -> String {
    let mut target = admin;
    if target.ip().is_unspecified() {
        target.set_ip(match target {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    format!("http://{target}{path}")
}

/// Why a probe found the endpoint unhealthy: the URL, then a one-line
/// reason.
#[derive(Debug, thiserror::Error)]
#[error("{url}: {why}")]
pub struct ProbeError {
    pub url: String,
    pub why: Unhealthy,
}

/// The one-line reason of a [`ProbeError`].
#[derive(Debug, thiserror::Error)]
pub enum Unhealthy {
    #[error("not a URL ({0})")]
    NotUrl(http::uri::InvalidUri),
    #[error("only http:// URLs can be probed (the admin listener speaks plain HTTP)")]
    NotHttp,
    #[error("the URL has no host")]
    NoHost,
    #[error("cannot resolve {host}: {source}")]
    Resolve { host: String, source: std::io::Error },
    #[error("the host resolved to no address")]
    NoAddress,
    /// The last address tried refused, or did not answer in time.
    #[error("cannot connect to {addr}: {source}")]
    Connect { addr: SocketAddr, source: std::io::Error },
    #[error("socket: {0}")]
    Socket(std::io::Error),
    #[error("sending the request: {0}")]
    Send(std::io::Error),
    #[error("no answer: {0}")]
    NoAnswer(std::io::Error),
    #[error("the connection closed without an answer")]
    Closed,
    /// Bytes that are no HTTP answer (quoted when a line came).
    #[error("not an HTTP answer{}", .0.as_deref().map(|q| format!(": {q}")).unwrap_or_default())]
    NotHttpAnswer(Option<String>),
    /// Another status than 2xx: the status line, and the start of the body
    /// on one line when there is one.
    #[error("{line}{}", .body.as_deref().map(|b| format!(": {b}")).unwrap_or_default())]
    Status { line: String, body: Option<String> },
}

/// GETs `url` (`http://host[:port][/path]`), waiting at most `timeout` for
/// the connection and for each read and write. `Ok` carries the status line
/// of a 2xx answer; `Err` a one-line reason, prefixed with the URL.
pub fn probe(url: &str, timeout: Duration) -> Result<String, ProbeError> {
    get(url, timeout).map_err(|why| ProbeError { url: url.to_owned(), why })
}

fn get(url: &str, timeout: Duration) -> Result<String, Unhealthy> {
    let uri: http::Uri = url.parse().map_err(Unhealthy::NotUrl)?;
    match uri.scheme_str() {
        Some("http") => {}
        _ => return Err(Unhealthy::NotHttp),
    }
    let authority = uri.authority().ok_or(Unhealthy::NoHost)?;
    let port = authority.port_u16().unwrap_or(80);
    let host = authority.host().trim_start_matches('[').trim_end_matches(']');
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|source| Unhealthy::Resolve { host: host.to_owned(), source })?
        .collect();
    let mut stream = connect(&addrs, timeout)?;
    stream.set_read_timeout(Some(timeout)).map_err(Unhealthy::Socket)?;
    stream.set_write_timeout(Some(timeout)).map_err(Unhealthy::Socket)?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {authority}\r\nUser-Agent: wxgate-probe/{}\r\nAccept: */*\r\nConnection: close\r\n\r\n",
        env!("CARGO_PKG_VERSION")
    );
    stream.write_all(request.as_bytes()).map_err(Unhealthy::Send)?;
    let mut answer = Vec::new();
    // `Connection: close`: the listener ends the answer by closing. A read
    // error after the status line arrived (a reset, a timeout on a slow
    // body) still leaves a status to judge by.
    let read = stream.take(MAX_ANSWER).read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer);
    let Some((status_line, rest)) = text.split_once("\r\n") else {
        return Err(match read {
            Err(e) => Unhealthy::NoAnswer(e),
            Ok(_) if answer.is_empty() => Unhealthy::Closed,
            Ok(_) => Unhealthy::NotHttpAnswer(None),
        });
    };
    let status = status_line
        .strip_prefix("HTTP/1.")
        .and_then(|s| s.get(2..5))
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| Unhealthy::NotHttpAnswer(Some(quote(status_line))))?;
    if (200..300).contains(&status) {
        return Ok(status_line.to_owned());
    }
    let body = rest.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    let body = (!body.trim().is_empty()).then(|| quote(body));
    Err(Unhealthy::Status { line: status_line.to_owned(), body })
}

/// Tries each address in turn, as a browser does; the last error if none answers.
fn connect(addrs: &[SocketAddr], timeout: Duration) -> Result<TcpStream, Unhealthy> {
    let mut last = Unhealthy::NoAddress;
    for addr in addrs {
        match TcpStream::connect_timeout(addr, timeout) {
            Ok(s) => return Ok(s),
            Err(source) => last = Unhealthy::Connect { addr: *addr, source },
        }
    }
    Err(last)
}

/// `text` on one line, at most [`MAX_QUOTED`] characters.
fn quote(text: &str) -> String {
    let one_line: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match one_line.char_indices().nth(MAX_QUOTED) {
        Some((cut, _)) => format!("{}...", &one_line[..cut]),
        None => one_line,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unspecified_admin_address_is_probed_on_loopback() {
        assert_eq!(admin_url("0.0.0.0:9090".parse().unwrap(), "/readyz"), "http://127.0.0.1:9090/readyz");
        assert_eq!(admin_url("[::]:9090".parse().unwrap(), "/readyz"), "http://[::1]:9090/readyz");
        assert_eq!(admin_url("10.1.2.3:9090".parse().unwrap(), "/healthz"), "http://10.1.2.3:9090/healthz");
    }

    #[test]
    fn only_plain_http_urls_are_probed() {
        let err = probe("https://127.0.0.1:9090/readyz", Duration::from_secs(1)).unwrap_err().to_string();
        assert!(err.contains("only http://"), "{err}");
        let err = probe("127.0.0.1:9090", Duration::from_secs(1)).unwrap_err().to_string();
        assert!(err.starts_with("127.0.0.1:9090: "), "{err}");
    }

    #[test]
    fn a_reason_is_one_short_line() {
        assert_eq!(quote("{\n  \"ready\": false\n}\n"), "{ \"ready\": false }");
        assert_eq!(quote(&"x".repeat(500)).len(), MAX_QUOTED + 3);
    }
}
