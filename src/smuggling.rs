//! Refuses request-smuggling attempts that hyper would otherwise "repair".
//!
//! A request carrying both `Transfer-Encoding` and `Content-Length` is the
//! classic smuggling vector. hyper follows RFC 9112 (Transfer-Encoding wins,
//! Content-Length is dropped, the connection closes after the answer) but
//! hides from the handler that both were present, so wxgate could not refuse
//! it. [`SmuggleGuard`] sits between the socket and hyper: it follows the
//! HTTP/1 framing of the byte stream (request heads, then `Content-Length` or
//! chunked bodies), holds each request head back until it is complete, and if
//! a head has both fields it corrupts the `Content-Length` field name so that
//! hyper's parser refuses the request with 400 and closes the connection.
//! Body bytes pass through as they arrive; nothing else is changed. On
//! anything it does not understand it steps aside and lets hyper decide.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Heads longer than this are passed through for hyper to refuse (431).
const MAX_HEAD: usize = 128 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Collecting a request head.
    Head,
    /// Passing this many body bytes.
    Body(u64),
    /// Inside a chunked body.
    Chunked(Chunk),
    /// No longer following the framing (hyper will refuse or has upgraded).
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// Reading the hex size; `digits` seen so far.
    Size {
        size: u64,
        digits: u8,
    },
    /// Skipping a chunk extension up to CR.
    Ext {
        size: u64,
    },
    /// After the size line's CR.
    SizeLf {
        size: u64,
    },
    Data(u64),
    DataCr,
    DataLf,
    /// Trailer section; `empty` while the current line has no bytes yet.
    Trailer {
        empty: bool,
        cr: bool,
    },
}

/// Wraps a client connection; see the module docs.
pub struct SmuggleGuard<T> {
    inner: T,
    state: State,
    head: Vec<u8>,
    out: Vec<u8>,
    out_pos: usize,
    /// Read buffer, allocated once per connection.
    scratch: Vec<u8>,
}

impl<T> SmuggleGuard<T> {
    pub fn new(inner: T) -> Self {
        SmuggleGuard { inner, state: State::Head, head: Vec::new(), out: Vec::new(), out_pos: 0, scratch: Vec::new() }
    }

    /// Follows `data`, appending what hyper may see now to `out`.
    fn feed(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            match self.state {
                State::Off => {
                    self.out.extend_from_slice(data);
                    return;
                }
                State::Head => {
                    let start = self.head.len().saturating_sub(3);
                    self.head.extend_from_slice(data);
                    match find(&self.head[start..], b"\r\n\r\n") {
                        Some(p) => {
                            let end = start + p + 4;
                            let rest = self.head.split_off(end);
                            let mut head = std::mem::take(&mut self.head);
                            self.state = frame(&mut head);
                            self.out.extend_from_slice(&head);
                            self.feed_owned(rest);
                            return;
                        }
                        None if self.head.len() > MAX_HEAD => {
                            self.out.append(&mut self.head);
                            self.state = State::Off;
                        }
                        None => {}
                    }
                    return;
                }
                State::Body(n) => {
                    let take = (n.min(data.len() as u64)) as usize;
                    self.out.extend_from_slice(&data[..take]);
                    data = &data[take..];
                    let left = n - take as u64;
                    self.state = if left == 0 { State::Head } else { State::Body(left) };
                }
                State::Chunked(c) => {
                    if let Chunk::Data(n) = c {
                        let take = (n.min(data.len() as u64)) as usize;
                        self.out.extend_from_slice(&data[..take]);
                        data = &data[take..];
                        let left = n - take as u64;
                        self.state = State::Chunked(if left == 0 { Chunk::DataCr } else { Chunk::Data(left) });
                        continue;
                    }
                    let b = data[0];
                    self.out.push(b);
                    data = &data[1..];
                    self.state = chunk_step(c, b);
                }
            }
        }
    }

    fn feed_owned(&mut self, rest: Vec<u8>) {
        if !rest.is_empty() {
            self.feed(&rest);
        }
    }
}

/// One byte of chunked framing outside chunk data.
fn chunk_step(c: Chunk, b: u8) -> State {
    let next = match c {
        Chunk::Size { size, digits } => match b {
            b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' if digits < 15 => {
                let v = (b as char).to_digit(16).unwrap_or(0) as u64;
                Chunk::Size { size: size * 16 + v, digits: digits + 1 }
            }
            b';' | b' ' | b'\t' if digits > 0 => Chunk::Ext { size },
            b'\r' if digits > 0 => Chunk::SizeLf { size },
            _ => return State::Off,
        },
        Chunk::Ext { size } => {
            if b == b'\r' {
                Chunk::SizeLf { size }
            } else {
                Chunk::Ext { size }
            }
        }
        Chunk::SizeLf { size } => match (b, size) {
            (b'\n', 0) => Chunk::Trailer { empty: true, cr: false },
            (b'\n', n) => Chunk::Data(n),
            _ => return State::Off,
        },
        Chunk::Data(n) => Chunk::Data(n),
        Chunk::DataCr if b == b'\r' => Chunk::DataLf,
        Chunk::DataLf if b == b'\n' => Chunk::Size { size: 0, digits: 0 },
        Chunk::DataCr | Chunk::DataLf => return State::Off,
        Chunk::Trailer { empty, cr } => match (b, cr) {
            (b'\r', _) => Chunk::Trailer { empty, cr: true },
            (b'\n', true) if empty => return State::Head,
            (b'\n', true) => Chunk::Trailer { empty: true, cr: false },
            _ => Chunk::Trailer { empty: false, cr: false },
        },
    };
    State::Chunked(next)
}

/// Reads a complete head's framing; corrupts it if it is a smuggling attempt.
fn frame(head: &mut [u8]) -> State {
    let mut te_chunked = None;
    let mut cl_name_at = None;
    let mut cl_value = None;
    let mut pos = 0;
    let mut first = true;
    let mut connect_or_upgrade = false;
    while pos < head.len() {
        let end = find(&head[pos..], b"\r\n").map_or(head.len(), |e| pos + e);
        let line = &head[pos..end];
        if first {
            first = false;
            connect_or_upgrade = line.starts_with(b"CONNECT ");
        } else if let Some(colon) = line.iter().position(|&b| b == b':') {
            let name = &line[..colon];
            let value = trim(&line[colon + 1..]);
            if name.eq_ignore_ascii_case(b"transfer-encoding") {
                let last = value.rsplit(|&b| b == b',').next().map(trim).unwrap_or(value);
                te_chunked = Some(last.eq_ignore_ascii_case(b"chunked"));
            } else if name.eq_ignore_ascii_case(b"content-length") {
                cl_name_at.get_or_insert(pos);
                cl_value = std::str::from_utf8(value).ok().and_then(|v| v.parse::<u64>().ok());
            } else if name.eq_ignore_ascii_case(b"upgrade") {
                connect_or_upgrade = true;
            }
        }
        pos = end + 2;
    }
    match (te_chunked, cl_name_at) {
        (Some(_), Some(at)) => {
            // "Content-Length" → "Content-Lengt\x01": an invalid header name,
            // which hyper answers with 400 and a closed connection.
            if let Some(b) = head.get_mut(at + 13) {
                *b = 0x01;
            }
            State::Off
        }
        _ if connect_or_upgrade => State::Off,
        (Some(true), None) => State::Chunked(Chunk::Size { size: 0, digits: 0 }),
        (Some(false), None) => State::Off,
        (None, Some(_)) => match cl_value {
            Some(0) => State::Head,
            Some(n) => State::Body(n),
            None => State::Off,
        },
        (None, None) => State::Head,
    }
}

fn trim(s: &[u8]) -> &[u8] {
    let start = s.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(s.len());
    let end = s.iter().rposition(|b| !b.is_ascii_whitespace()).map_or(start, |e| e + 1);
    &s[start..end]
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
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
            if this.state == State::Off && this.head.is_empty() {
                return Pin::new(&mut this.inner).poll_read(cx, buf);
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
                    // EOF: hand over a partial head for hyper to judge.
                    if this.head.is_empty() {
                        return Poll::Ready(Ok(()));
                    }
                    this.out.append(&mut this.head);
                    this.state = State::Off;
                }
                Poll::Ready(Ok(())) => {
                    this.feed(&scratch[..n]);
                    this.scratch = scratch;
                }
            }
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for SmuggleGuard<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
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
    fn pipelined_requests_pass_unchanged() {
        let input = b"POST /a HTTP/1.1\r\nContent-Length: 5\r\n\r\nhelloPOST /b HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5;x=y\r\nhello\r\n0\r\nTrail: 1\r\n\r\nGET /c HTTP/1.1\r\nHost: x\r\n\r\n";
        let (out, state) = run(input);
        assert_eq!(out, input.to_vec());
        assert_eq!(state, State::Head);
    }

    #[test]
    fn both_framings_corrupt_the_content_length_name() {
        let input = b"POST /a HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\n\r\n";
        let (out, state) = run(input);
        assert_eq!(state, State::Off);
        let text = String::from_utf8_lossy(&out);
        assert!(text.contains("Content-Lengt\u{1}: 5"), "{text}");
        assert_eq!(out.len(), input.len());
    }

    proptest::proptest! {
        /// Any sequence of well-formed requests, split anywhere, passes
        /// through byte for byte and ends between requests.
        #[test]
        fn well_formed_streams_pass_unchanged(
            reqs in proptest::collection::vec((proptest::bool::ANY, proptest::collection::vec(proptest::num::u8::ANY, 0..300), 1usize..50), 1..8),
            cut in 1usize..64,
        ) {
            let mut input = Vec::new();
            for (chunked, body, chunk) in &reqs {
                if *chunked {
                    input.extend_from_slice(b"POST /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n");
                    for part in body.chunks(*chunk) {
                        input.extend_from_slice(format!("{:X};ext=1\r\n", part.len()).as_bytes());
                        input.extend_from_slice(part);
                        input.extend_from_slice(b"\r\n");
                    }
                    input.extend_from_slice(b"0\r\nX-Trailer: t\r\n\r\n");
                } else {
                    input.extend_from_slice(format!("POST /y HTTP/1.1\r\ncontent-length: {}\r\n\r\n", body.len()).as_bytes());
                    input.extend_from_slice(body);
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
