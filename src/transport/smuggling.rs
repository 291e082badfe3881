//! Refuses request-smuggling attempts that hyper would otherwise "repair",
//! and requests hyper would leave unanswered.
//!
//! A request carrying both `Transfer-Encoding` and `Content-Length` is the
//! classic smuggling vector. hyper follows RFC 9112 (Transfer-Encoding wins,
//! Content-Length is dropped, the connection closes after the answer) but
//! hides from the handler that both were present, so wxgate could not refuse
//! it. [`SmuggleGuard`] sits between the socket and hyper and follows the
//! HTTP/1 framing of the byte stream exactly as hyper reads it: request
//! heads, then `Content-Length` or chunked bodies (sizes of any number of
//! hex digits, extensions, trailers), for every request on the connection,
//! whatever its method or headers (`CONNECT` and `Upgrade` requests
//! included: wxgate never switches protocols, so hyper reads on after them).
//! It holds each request head back until it is complete. Guarantees:
//!
//! - A head hyper would parse with a framing other than the one the guard
//!   sees never reaches hyper: both framings, a transfer coding other than
//!   `chunked`, a `Content-Length` hyper would not accept, a line ending
//!   other than CRLF (bare LF, bare CR), or a request line that is not
//!   `METHOD target HTTP/1.0|1.1` (HTTP/0.9, unknown versions). Such a head
//!   is refused the moment the guard sees the offending line: hyper is
//!   given an unparseable head instead, answers it 400 and closes the
//!   connection.
//! - Where a body breaks its framing (a chunk size that overflows, a bad
//!   byte where CRLF belongs, an LF in an extension), the offending byte is
//!   the last one hyper sees: the body fails there (the call is answered
//!   400 as the client's error) and nothing after it is ever handed on.
//! - After either, the stream ends: nothing behind a refused request is
//!   parsed or forwarded.
//!
//! Body bytes pass through as they arrive; a well-formed stream passes
//! through byte for byte.
//!
//! One exception, only with `[intercept]` on ([`SmuggleGuard::tunnels`]): a
//! `CONNECT` to a listed host on port 443, without a body, is the last
//! request the guard follows; what comes after it is the tunnel's bytes
//! (TLS), passed through unfollowed. wxgate then either opens the tunnel or
//! answers with `Connection: close` (`crate::server::tunnel`), so hyper never reads
//! an unfollowed byte as a request. The requests inside the tunnel have a
//! guard of their own.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use memchr::memchr2;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Heads longer than this are handed over unfollowed for hyper to refuse
/// (431), and the stream ends after them.
const MAX_HEAD: usize = 128 * 1024;

/// What hyper is given in place of a refused head: an invalid method, which
/// it answers with 400 and a closed connection.
const REFUSED: &[u8] = b"\x01 / HTTP/1.1\r\n\r\n";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Collecting a request head.
    Head,
    /// Passing this many body bytes.
    Body(u64),
    /// Inside a chunked body.
    Chunked(Chunk),
    /// Nothing more is handed to hyper: its reads end here.
    Stopped,
    /// After a `CONNECT` to a listed host: bytes pass unfollowed.
    Tunnel,
}

/// hyper's chunked decoder, state for state (`proto/h1/decode.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// Before the first hex digit of a size.
    Start,
    /// Reading hex digits of a size.
    Size(u64),
    /// Spaces or tabs after a size.
    SizeLws(u64),
    /// Skipping an extension up to CR.
    Ext(u64),
    /// After the size line's CR.
    SizeLf(u64),
    Data(u64),
    DataCr,
    DataLf,
    /// After the last chunk's size line: CR (end) or a trailer line.
    EndCr,
    Trailer,
    TrailerLf,
    EndLf,
}

/// Why a head is refused (logged at debug level).
type Why = &'static str;

/// What is known of the head being collected, line by line.
#[derive(Debug, Default)]
struct HeadScan {
    /// Bytes of the head already looked at.
    pos: usize,
    /// Where the current line starts.
    line: usize,
    /// The request line has been seen (empty lines before it are skipped,
    /// as hyper does).
    started: bool,
    http10: bool,
    /// A `Transfer-Encoding` field was seen; whether its last one ends in `chunked`.
    te_chunked: Option<bool>,
    content_length: Option<u64>,
}

/// What a scan of the head found.
enum Scan {
    /// The head is not complete yet.
    More,
    /// The head ends before this offset; the framing that follows it.
    Complete(usize, State),
    Refuse(Why),
}

impl HeadScan {
    /// Looks at the bytes of `head` not looked at yet.
    fn scan(&mut self, head: &[u8]) -> Scan {
        while let Some(off) = memchr2(b'\r', b'\n', &head[self.pos..]) {
            let at = self.pos + off;
            if head[at] == b'\n' {
                return Scan::Refuse("a line of the head ends in a bare LF (CRLF is required)");
            }
            match head.get(at + 1) {
                None => {
                    // The byte after this CR has not come yet.
                    self.pos = at;
                    return Scan::More;
                }
                Some(b'\n') => {}
                Some(_) => return Scan::Refuse("a bare CR in the head"),
            }
            let line = &head[self.line..at];
            self.pos = at + 2;
            self.line = self.pos;
            if !self.started {
                if !line.is_empty() {
                    self.started = true;
                    match request_line(line) {
                        Some(http10) => self.http10 = http10,
                        None => return Scan::Refuse("the request line is not METHOD target HTTP/1.0 or HTTP/1.1"),
                    }
                }
            } else if line.is_empty() {
                return match self.framing() {
                    Ok(state) => Scan::Complete(self.pos, state),
                    Err(why) => Scan::Refuse(why),
                };
            } else if let Err(why) = self.field(line) {
                return Scan::Refuse(why);
            }
        }
        self.pos = head.len();
        Scan::More
    }

    /// One header field line. Lines hyper refuses (no colon, bad names) are
    /// left for it to refuse.
    fn field(&mut self, line: &[u8]) -> Result<(), Why> {
        let Some(colon) = line.iter().position(|&b| b == b':') else { return Ok(()) };
        let name = &line[..colon];
        let value = trim(&line[colon + 1..]);
        if name.eq_ignore_ascii_case(b"transfer-encoding") {
            if self.http10 {
                return Err("Transfer-Encoding on HTTP/1.0");
            }
            let last = value.rsplit(|&b| b == b',').next().map_or(value, trim);
            self.te_chunked = Some(last.eq_ignore_ascii_case(b"chunked"));
        } else if name.eq_ignore_ascii_case(b"content-length") {
            let n = digits(value).ok_or("a Content-Length that is not a number")?;
            if self.content_length.is_some_and(|m| m != n) {
                return Err("two different Content-Lengths");
            }
            self.content_length = Some(n);
        }
        Ok(())
    }

    /// How the body after a complete head is framed, as hyper frames it.
    fn framing(&self) -> Result<State, Why> {
        match (self.te_chunked, self.content_length) {
            (Some(_), Some(_)) => Err("both Transfer-Encoding and Content-Length"),
            (Some(true), None) => Ok(State::Chunked(Chunk::Start)),
            (Some(false), None) => Err("a transfer coding other than chunked"),
            (None, Some(0) | None) => Ok(State::Head),
            (None, Some(n)) => Ok(State::Body(n)),
        }
    }
}

/// `Some(is HTTP/1.0)` for a request line `METHOD SP target SP HTTP/1.x`.
fn request_line(line: &[u8]) -> Option<bool> {
    let http10 = match line.len().checked_sub(9).map(|at| line.split_at(at)) {
        Some((_, b" HTTP/1.1")) => false,
        Some((_, b" HTTP/1.0")) => true,
        _ => return None,
    };
    let rest = &line[..line.len() - 9];
    let sp = rest.iter().position(|&b| b == b' ')?;
    (sp > 0 && sp + 1 < rest.len()).then_some(http10)
}

/// A `Content-Length` value as hyper reads it: decimal digits only, no sign.
fn digits(value: &[u8]) -> Option<u64> {
    if value.is_empty() {
        return None;
    }
    value.iter().try_fold(0u64, |n, &b| match b {
        b'0'..=b'9' => n.checked_mul(10)?.checked_add(u64::from(b - b'0')),
        _ => None,
    })
}

/// Without leading and trailing spaces and tabs.
fn trim(s: &[u8]) -> &[u8] {
    let start = s.iter().position(|&b| b != b' ' && b != b'\t').unwrap_or(s.len());
    let end = s.iter().rposition(|&b| b != b' ' && b != b'\t').map_or(start, |e| e + 1);
    &s[start..end]
}

/// One byte of chunked framing outside chunk data, as hyper's decoder takes
/// it: the next state, the end of the body (`Some(None)`), or a byte that
/// breaks the framing (`None`).
fn chunk_step(c: Chunk, b: u8) -> Option<Option<Chunk>> {
    use Chunk::*;
    let next = match (c, b) {
        (Start, _) => Size(hex(b)?),
        (Size(n), b'\t' | b' ') | (SizeLws(n), b'\t' | b' ') => SizeLws(n),
        (Size(n), b';') | (SizeLws(n), b';') => Ext(n),
        (Size(n), b'\r') | (SizeLws(n), b'\r') | (Ext(n), b'\r') => SizeLf(n),
        (Size(n), _) => Size(n.checked_mul(16)?.checked_add(hex(b)?)?),
        (SizeLws(_), _) | (Ext(_), b'\n') => return None,
        (Ext(n), _) => Ext(n),
        (SizeLf(0), b'\n') => EndCr,
        (SizeLf(n), b'\n') => Data(n),
        (Data(n), _) => Data(n),
        (DataCr, b'\r') => DataLf,
        (DataLf, b'\n') => Start,
        (EndCr, b'\r') => EndLf,
        (EndCr, _) => Trailer,
        (Trailer, b'\r') => TrailerLf,
        (Trailer, _) => Trailer,
        (TrailerLf, b'\n') => EndCr,
        (EndLf, b'\n') => return Some(None),
        (SizeLf(_) | DataCr | DataLf | TrailerLf | EndLf, _) => return None,
    };
    Some(Some(next))
}

fn hex(b: u8) -> Option<u64> {
    (b as char).to_digit(16).map(u64::from)
}

/// Wraps a client connection; see the module docs.
pub struct SmuggleGuard<T> {
    inner: T,
    state: State,
    /// The head being collected.
    head: Vec<u8>,
    scan: HeadScan,
    /// What hyper may read now, from `out_pos` on.
    out: Vec<u8>,
    out_pos: usize,
    /// Read buffer, allocated once per connection.
    scratch: Vec<u8>,
    /// `[intercept] hosts`: a `CONNECT` to one of them on port 443 opens a tunnel.
    tunnels: Option<Arc<[Arc<str>]>>,
}

/// Unread bytes drained at most when the connection closes (see
/// [`SmuggleGuard::poll_shutdown`]).
const DRAIN_AT_CLOSE: usize = 256 * 1024;

impl<T> SmuggleGuard<T> {
    pub fn new(inner: T) -> Self {
        SmuggleGuard {
            inner,
            state: State::Head,
            head: Vec::new(),
            scan: HeadScan::default(),
            out: Vec::new(),
            out_pos: 0,
            scratch: Vec::new(),
            tunnels: None,
        }
    }

    /// With `[intercept]` on: a `CONNECT <host>:443` (one of `hosts`, no
    /// body) ends the following; the bytes after its head pass unfollowed.
    pub fn tunnels(mut self, hosts: Arc<[Arc<str>]>) -> Self {
        self.tunnels = Some(hosts);
        self
    }

    /// Whether `head` (complete) is a `CONNECT` to a listed host on 443.
    fn opens_tunnel(&self, head: &[u8]) -> bool {
        let Some(hosts) = &self.tunnels else { return false };
        let start = head.iter().position(|&b| b != b'\r' && b != b'\n').unwrap_or(head.len());
        let Some(line) = head[start..].split(|&b| b == b'\r').next() else { return false };
        let Some(target) = line.strip_prefix(b"CONNECT ").and_then(|rest| rest.split(|&b| b == b' ').next()) else {
            return false;
        };
        let Some(host) = target.strip_suffix(b":443") else { return false };
        hosts.iter().any(|h| h.as_bytes().eq_ignore_ascii_case(host))
    }

    /// Follows `data`, appending what hyper may see now to `out`.
    fn feed(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            match self.state {
                State::Stopped => return,
                State::Tunnel => {
                    self.out.extend_from_slice(data);
                    return;
                }
                State::Head => {
                    self.head.extend_from_slice(data);
                    data = &[];
                    match self.scan.scan(&self.head) {
                        Scan::More if self.head.len() > MAX_HEAD => {
                            self.out.append(&mut self.head);
                            self.state = State::Stopped;
                        }
                        Scan::More => {}
                        Scan::Refuse(why) => self.refuse(why),
                        Scan::Complete(end, next) => {
                            let rest = self.head.split_off(end);
                            let next = match self.opens_tunnel(&self.head) {
                                false => next,
                                true if next == State::Head => State::Tunnel,
                                true => return self.refuse("a CONNECT with a body"),
                            };
                            self.out.append(&mut self.head);
                            self.scan = HeadScan::default();
                            self.state = next;
                            self.feed(&rest);
                        }
                    }
                }
                State::Body(n) => {
                    let take = n.min(data.len() as u64) as usize;
                    self.out.extend_from_slice(&data[..take]);
                    data = &data[take..];
                    let left = n - take as u64;
                    self.state = if left == 0 { State::Head } else { State::Body(left) };
                }
                State::Chunked(Chunk::Data(n)) => {
                    let take = n.min(data.len() as u64) as usize;
                    self.out.extend_from_slice(&data[..take]);
                    data = &data[take..];
                    let left = n - take as u64;
                    self.state = State::Chunked(if left == 0 { Chunk::DataCr } else { Chunk::Data(left) });
                }
                State::Chunked(c) => {
                    let b = data[0];
                    data = &data[1..];
                    self.out.push(b);
                    self.state = match chunk_step(c, b) {
                        Some(Some(next)) => State::Chunked(next),
                        Some(None) => State::Head,
                        // hyper fails the body on this byte; nothing after it is handed on.
                        None => {
                            tracing::debug!(
                                "a chunked request body breaks its framing; the connection ends after its answer"
                            );
                            State::Stopped
                        }
                    };
                }
            }
        }
    }

    /// Hands hyper an unparseable head in place of the collected one, and
    /// ends the stream after it.
    fn refuse(&mut self, why: Why) {
        tracing::debug!(why, "request head refused with 400; the connection closes after it");
        self.head.clear();
        self.out.extend_from_slice(REFUSED);
        self.state = State::Stopped;
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for SmuggleGuard<T> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.out_pos < this.out.len() {
                let n = (this.out.len() - this.out_pos).min(buf.remaining());
                buf.put_slice(&this.out[this.out_pos..this.out_pos + n]);
                this.out_pos += n;
                if this.out_pos == this.out.len() {
                    this.out.clear();
                    this.out_pos = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.state == State::Stopped {
                return Poll::Ready(Ok(()));
            }
            let mut scratch = std::mem::take(&mut this.scratch);
            if scratch.is_empty() {
                scratch.resize(16 * 1024, 0);
            }
            let mut rb = ReadBuf::new(&mut scratch);
            let polled = Pin::new(&mut this.inner).poll_read(cx, &mut rb);
            let n = rb.filled().len();
            match polled {
                Poll::Pending => {
                    this.scratch = scratch;
                    return Poll::Pending;
                }
                Poll::Ready(Err(e)) => {
                    this.scratch = scratch;
                    return Poll::Ready(Err(e));
                }
                Poll::Ready(Ok(())) if n == 0 => {
                    this.scratch = scratch;
                    // The client closed its sending side. A partial head
                    // goes to hyper, which closes without an answer; a
                    // partial body fails where it stops.
                    this.out.append(&mut this.head);
                    this.state = State::Stopped;
                }
                Poll::Ready(Ok(())) => {
                    this.feed(&scratch[..n]);
                    this.scratch = scratch;
                }
            }
        }
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncWrite for SmuggleGuard<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }
    /// Before closing, reads and drops what the client sent that was never
    /// read (up to [`DRAIN_AT_CLOSE`], what has arrived by now): closing a
    /// socket with unread bytes resets the connection, and a reset can
    /// destroy the answer (a 400 to a refused request) before the client
    /// reads it.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let mut scratch = std::mem::take(&mut this.scratch);
        if scratch.is_empty() {
            scratch.resize(16 * 1024, 0);
        }
        let mut drained = 0;
        while drained < DRAIN_AT_CLOSE {
            let mut rb = ReadBuf::new(&mut scratch);
            match Pin::new(&mut this.inner).poll_read(cx, &mut rb) {
                Poll::Ready(Ok(())) if !rb.filled().is_empty() => drained += rb.filled().len(),
                _ => break,
            }
        }
        this.scratch = scratch;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(input: &[u8]) -> (Vec<u8>, State) {
        let mut g = SmuggleGuard::new(());
        // Feed in awkward pieces to exercise every boundary.
        for piece in input.chunks(3) {
            g.feed(piece);
        }
        (g.out, g.state)
    }

    #[test]
    fn a_connect_to_a_listed_host_ends_the_following() {
        let hosts: Arc<[Arc<str>]> = vec![Arc::from("api.weixin.qq.com")].into();
        let mut g = SmuggleGuard::new(()).tunnels(hosts.clone());
        let tls =
            b"\x16\x03\x01\x00\x05hello\r\n\nGET / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n";
        let head = b"CONNECT API.weixin.qq.com:443 HTTP/1.1\r\nHost: api.weixin.qq.com:443\r\n\r\n";
        g.feed(&[&head[..], &tls[..]].concat());
        assert_eq!(g.state, State::Tunnel);
        assert_eq!(g.out, [&head[..], &tls[..]].concat(), "the tunnel's bytes pass unfollowed");
        // Not listed, another port, a body, or no list: not a tunnel, so
        // followed (and refused) like any other request.
        for (head, tunnels) in [
            (&b"CONNECT example.com:443 HTTP/1.1\r\n\r\n"[..], true),
            (b"CONNECT api.weixin.qq.com:80 HTTP/1.1\r\n\r\n", true),
            (b"CONNECT api.weixin.qq.com:443 HTTP/1.1\r\n\r\n", false),
        ] {
            let mut g = SmuggleGuard::new(());
            if tunnels {
                g = g.tunnels(hosts.clone());
            }
            g.feed(&[head, &tls[..]].concat());
            assert_eq!(g.state, State::Stopped, "{}", String::from_utf8_lossy(head));
            assert!(g.out.ends_with(REFUSED));
        }
        let mut g = SmuggleGuard::new(()).tunnels(hosts);
        g.feed(b"CONNECT api.weixin.qq.com:443 HTTP/1.1\r\nContent-Length: 2\r\n\r\nab");
        assert_eq!((g.state, &g.out[..]), (State::Stopped, REFUSED), "a CONNECT with a body is refused");
    }

    #[test]
    fn pipelined_requests_pass_unchanged() {
        let input = b"\r\nPOST /a HTTP/1.1\r\nContent-Length: 5\r\n\r\nhelloPOST /b HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5;x=y\r\nhello\r\n000000000000000000000000000005 \t ;ext\r\nhello\r\n0\r\nTrail: 1\r\n\r\nCONNECT h:443 HTTP/1.1\r\nContent-Length: 2\r\n\r\nabGET /c HTTP/1.1\r\nUpgrade: websocket\r\n\r\n";
        let (out, state) = run(input);
        assert_eq!(String::from_utf8_lossy(&out), String::from_utf8_lossy(input));
        assert_eq!(state, State::Head);
    }

    #[test]
    fn both_framings_are_refused_and_nothing_after_them_is_handed_on() {
        let input = b"GET /ok HTTP/1.1\r\n\r\nPOST /a HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\n\r\n";
        let (out, state) = run(input);
        assert_eq!(state, State::Stopped);
        assert_eq!(out, [&b"GET /ok HTTP/1.1\r\n\r\n"[..], REFUSED].concat());
    }

    #[test]
    fn a_head_is_refused_at_its_first_bad_line() {
        for (label, input) in [
            ("bare LF", &b"GET /a HTTP/1.1\n"[..]),
            ("bare LF in a field", b"GET /a HTTP/1.1\r\nHost: x\n"),
            ("bare CR", b"GET /a HTTP/1.1\r\nHost: x\rY"),
            ("HTTP/0.9", b"GET /a\r\n"),
            ("HTTP/2 preface", b"PRI * HTTP/2.0\r\n"),
            ("no target", b"GET HTTP/1.1\r\n"),
            ("TE on HTTP/1.0", b"POST /a HTTP/1.0\r\nTransfer-Encoding: chunked\r\n"),
            ("signed length", b"POST /a HTTP/1.1\r\nContent-Length: +5\r\n"),
            ("two lengths", b"POST /a HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n"),
        ] {
            let mut g = SmuggleGuard::new(());
            g.feed(input);
            assert_eq!(g.state, State::Stopped, "{label}");
            assert_eq!(g.out, REFUSED, "{label}");
        }
        // Still incomplete, not refused: a CR whose LF has not come yet.
        let mut g = SmuggleGuard::new(());
        g.feed(b"GET /a HTTP/1.1\r");
        assert_eq!((g.state, g.out.len()), (State::Head, 0));
    }

    #[test]
    fn a_broken_chunked_body_ends_the_stream_at_the_offending_byte() {
        let head = &b"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"[..];
        for (label, body, kept) in [
            ("size overflow", &b"ffffffffffffffff1\r\n"[..], 17),
            ("LF in an extension", b"5;a\nb\r\n", 4),
            ("space inside a size", b"5 5\r\n", 3),
            ("no CRLF after data", b"1\r\naXX", 5),
            ("bare CR in a trailer", b"0\r\nX: 1\rZ\r\n\r\n", 9),
        ] {
            let mut g = SmuggleGuard::new(());
            g.feed(&[head, body, b"GET /smuggled HTTP/1.1\r\n\r\n"].concat());
            assert_eq!(g.state, State::Stopped, "{label}");
            assert_eq!(g.out, [head, &body[..kept]].concat(), "{label}");
        }
    }

    proptest::proptest! {
        /// Any sequence of well-formed requests, split anywhere, passes
        /// through byte for byte and ends between requests.
        #[test]
        fn well_formed_streams_pass_unchanged(
            reqs in proptest::collection::vec((0u8..4, proptest::collection::vec(proptest::num::u8::ANY, 0..300), 1usize..50, 1usize..40), 1..8),
            cut in 1usize..64,
        ) {
            let mut input = Vec::new();
            for (kind, body, chunk, width) in &reqs {
                match kind {
                    0 => {
                        input.extend_from_slice(b"POST /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n");
                        for part in body.chunks(*chunk) {
                            input.extend_from_slice(format!("{:0width$X};ext=1\r\n", part.len()).as_bytes());
                            input.extend_from_slice(part);
                            input.extend_from_slice(b"\r\n");
                        }
                        input.extend_from_slice(format!("{:0width$x}\r\nX-Trailer: t\r\n\r\n", 0).as_bytes());
                    }
                    1 => {
                        input.extend_from_slice(format!("POST /y HTTP/1.1\r\ncontent-length: {}\r\n\r\n", body.len()).as_bytes());
                        input.extend_from_slice(body);
                    }
                    2 => input.extend_from_slice(b"CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n"),
                    _ => input.extend_from_slice(b"\r\nGET /z HTTP/1.0\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n"),
                }
            }
            let mut g = SmuggleGuard::new(());
            for piece in input.chunks(cut) {
                g.feed(piece);
            }
            proptest::prop_assert_eq!(&g.out, &input);
            proptest::prop_assert_eq!(g.state, State::Head);
        }
    }

    #[test]
    fn a_partial_head_is_held_back() {
        let (out, state) = run(b"GET /a HTTP/1.1\r\nHost: x\r\n");
        assert!(out.is_empty());
        assert_eq!(state, State::Head);
    }
}
