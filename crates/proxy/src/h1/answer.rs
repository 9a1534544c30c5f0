//! Reading a machine's answer on the fast path: the head (`httparse`, hop-by-hop headers
//! dropped), how its body is delimited (RFC 9112 §6.3), and the body itself, handed over
//! whole or read from the connection as the client takes it (content-length, chunked,
//! or until close), the connection going back to the pool when it ends.

use super::checkin;
use crate::hop_tls::Stream;
use bytes::{Bytes, BytesMut};
use http::header::{HeaderName, HeaderValue, CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{HeaderMap, StatusCode};
use http_body::{Frame, SizeHint};
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

/// Most response headers accepted.
const MAX_HEADERS: usize = 128;
/// Largest chunk-size line (with extensions) or trailer line accepted.
const MAX_LINE_BYTES: usize = 4096;

/// How a response's body is delimited (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Framing {
    /// This many bytes are left.
    Length(u64),
    Chunked(Chunk),
    /// Until the machine closes the connection.
    Close,
}

/// Where a chunked body's decoder is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Chunk {
    /// At a chunk-size line.
    Size,
    /// In a chunk's data, with this many bytes left.
    Data(u64),
    /// At the CRLF after a chunk's data.
    DataEnd,
    /// In the trailer section.
    Trailers,
}

/// A machine's answer head as the fast path reads it.
#[derive(Debug)]
pub struct Head {
    /// Bytes of the head.
    pub len: usize,
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub framing: Framing,
    pub keep_alive: bool,
}

/// The response head at the start of `buf`: `None` while incomplete.
pub fn parse_head(buf: &[u8], head_request: bool) -> Result<Option<Head>, String> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Response::new(&mut slots);
    let len = match parsed.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(err) => return Err(format!("malformed answer: {err}")),
    };
    let code = parsed.code.unwrap_or_default();
    let status =
        StatusCode::from_u16(code).map_err(|_| format!("malformed answer: status {code}"))?;
    let http11 = parsed.version == Some(1);
    let mut headers = HeaderMap::with_capacity(parsed.headers.len());
    let mut length: Option<u64> = None;
    let mut chunked = false;
    let mut close = !http11;
    // Other names a `Connection` header lists, dropped once all headers are read.
    let mut listed: Vec<&[u8]> = Vec::new();
    for h in parsed.headers.iter() {
        let name = HeaderName::from_bytes(h.name.as_bytes())
            .map_err(|_| format!("malformed answer: header name {:?}", h.name))?;
        let value = HeaderValue::from_bytes(h.value)
            .map_err(|_| format!("malformed answer: value of {:?}", h.name))?;
        if name == CONTENT_LENGTH {
            let n = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or_else(|| "malformed answer: content-length".to_string())?;
            if length.is_some_and(|m| m != n) {
                return Err("malformed answer: conflicting content-length".into());
            }
            length = Some(n);
        } else if name == TRANSFER_ENCODING {
            // Only chunked is understood; it must come last (RFC 9112 §6.1).
            let last = h.value.rsplit(|b| *b == b',').next().unwrap_or_default();
            if !last.trim_ascii().eq_ignore_ascii_case(b"chunked") {
                return Err("answer with a transfer coding other than chunked".into());
            }
            chunked = true;
        } else if name == http::header::CONNECTION {
            for token in h.value.split(|b| *b == b',') {
                let token = token.trim_ascii();
                if token.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if token.eq_ignore_ascii_case(b"keep-alive") {
                    close &= http11;
                } else if !token.is_empty() {
                    listed.push(token);
                }
            }
        }
        // Hop-by-hop headers are not passed on (the answer's framing is the client
        // connection's own business).
        if crate::wire::forwarded(&name) {
            headers.append(name, value);
        }
    }
    for name in listed {
        if let Ok(name) = HeaderName::from_bytes(name) {
            headers.remove(name);
        }
    }
    let bodiless = head_request
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    let framing = if bodiless {
        Framing::Length(0)
    } else if chunked {
        // Transfer-Encoding wins over Content-Length, and such an answer is not kept.
        if length.is_some() {
            close = true;
        }
        Framing::Chunked(Chunk::Size)
    } else {
        match length {
            Some(n) => Framing::Length(n),
            None => {
                close = true;
                Framing::Close
            }
        }
    };
    Ok(Some(Head {
        len,
        status,
        headers,
        framing,
        keep_alive: !close,
    }))
}

/// A machine's response body read by the fast path.
pub(crate) enum FastBody {
    /// Arrived whole with the head.
    Full(Option<Bytes>),
    /// Read from the connection as the client takes it.
    Streaming(Box<Streaming>),
}

impl std::fmt::Debug for FastBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FastBody")
    }
}

/// The rest of a body still on its connection.
pub(crate) struct Streaming {
    pub(super) addr: SocketAddr,
    pub(super) stream: Stream,
    pub(super) buf: BytesMut,
    pub(super) framing: Framing,
    pub(super) keep_alive: bool,
}

impl Streaming {
    /// Reads more into `buf`: the number of bytes (0 at the end of the stream).
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        self.buf.reserve(16 * 1024);
        self.stream.poll_read_buf(cx, &mut self.buf)
    }

    /// The next piece of the body: `None` at its end.
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>, BodyError>> {
        loop {
            match self.framing {
                Framing::Length(0) => return Poll::Ready(Ok(None)),
                Framing::Length(left) => {
                    if !self.buf.is_empty() {
                        let n = (self.buf.len() as u64).min(left) as usize;
                        self.framing = Framing::Length(left - n as u64);
                        return Poll::Ready(Ok(Some(self.buf.split_to(n).freeze())));
                    }
                }
                Framing::Close => {
                    if !self.buf.is_empty() {
                        return Poll::Ready(Ok(Some(self.buf.split().freeze())));
                    }
                }
                Framing::Chunked(state) => match decode_chunked(&mut self.buf, state)? {
                    Decoded::Data(data, next) => {
                        self.framing = Framing::Chunked(next);
                        return Poll::Ready(Ok(Some(data)));
                    }
                    Decoded::Moved(next) => {
                        self.framing = Framing::Chunked(next);
                        continue;
                    }
                    Decoded::End => {
                        self.framing = Framing::Length(0);
                        return Poll::Ready(Ok(None));
                    }
                    Decoded::NeedMore => {}
                },
            }
            let n = ready!(self.poll_fill(cx)).map_err(|e| BodyError(e.to_string()))?;
            if n == 0 {
                if self.framing == Framing::Close {
                    self.keep_alive = false;
                    self.framing = Framing::Length(0);
                    return Poll::Ready(Ok(None));
                }
                return Poll::Ready(Err(BodyError(
                    "the machine closed the connection in the middle of the body".into(),
                )));
            }
        }
    }
}

/// What the chunked decoder made of the buffer.
enum Decoded {
    Data(Bytes, Chunk),
    /// Went on to another state without data.
    Moved(Chunk),
    End,
    NeedMore,
}

fn decode_chunked(buf: &mut BytesMut, state: Chunk) -> Result<Decoded, BodyError> {
    let line = |buf: &mut BytesMut| -> Result<Option<BytesMut>, BodyError> {
        match buf.iter().position(|b| *b == b'\n') {
            Some(i) if i < MAX_LINE_BYTES => {
                let mut l = buf.split_to(i + 1);
                l.truncate(i);
                if l.last() == Some(&b'\r') {
                    l.truncate(i - 1);
                }
                Ok(Some(l))
            }
            Some(_) => Err(BodyError("chunked body: line too long".into())),
            None if buf.len() >= MAX_LINE_BYTES => {
                Err(BodyError("chunked body: line too long".into()))
            }
            None => Ok(None),
        }
    };
    Ok(match state {
        Chunk::Size => match line(buf)? {
            None => Decoded::NeedMore,
            Some(l) => {
                let hex = l[..]
                    .split(|b| *b == b';')
                    .next()
                    .unwrap_or_default()
                    .trim_ascii();
                let size = std::str::from_utf8(hex)
                    .ok()
                    .filter(|h| !h.is_empty())
                    .and_then(|h| u64::from_str_radix(h, 16).ok())
                    .ok_or_else(|| BodyError("chunked body: bad chunk size".into()))?;
                Decoded::Moved(if size == 0 {
                    Chunk::Trailers
                } else {
                    Chunk::Data(size)
                })
            }
        },
        Chunk::Data(left) if buf.is_empty() => {
            let _ = left;
            Decoded::NeedMore
        }
        Chunk::Data(left) => {
            let n = (buf.len() as u64).min(left) as usize;
            let data = buf.split_to(n).freeze();
            let next = if n as u64 == left {
                Chunk::DataEnd
            } else {
                Chunk::Data(left - n as u64)
            };
            Decoded::Data(data, next)
        }
        Chunk::DataEnd => match line(buf)? {
            None => Decoded::NeedMore,
            Some(l) if l.is_empty() => Decoded::Moved(Chunk::Size),
            Some(_) => return Err(BodyError("chunked body: data longer than its size".into())),
        },
        // Trailer fields are dropped; the empty line ends the body.
        Chunk::Trailers => match line(buf)? {
            None => Decoded::NeedMore,
            Some(l) if l.is_empty() => Decoded::End,
            Some(_) => Decoded::Moved(Chunk::Trailers),
        },
    })
}

/// Decodes the chunked body at the start of `raw` as the fast path does when it arrives
/// `step` bytes at a time (`step` ≥ 1): the body's data and how many bytes of `raw` it took.
/// For fuzzing and tests; the proxy itself decodes as the client reads.
pub fn decode_chunked_body(raw: &[u8], step: usize) -> Result<(Vec<u8>, usize), String> {
    let step = step.max(1);
    let mut buf = BytesMut::new();
    let mut state = Chunk::Size;
    let mut out = Vec::new();
    let mut fed = 0;
    loop {
        match decode_chunked(&mut buf, state).map_err(|e| e.0)? {
            Decoded::Data(d, next) => {
                out.extend_from_slice(&d);
                state = next;
            }
            Decoded::Moved(next) => state = next,
            Decoded::End => return Ok((out, fed - buf.len())),
            Decoded::NeedMore if fed >= raw.len() => return Err("chunked body: cut short".into()),
            Decoded::NeedMore => {
                let end = (fed + step).min(raw.len());
                buf.extend_from_slice(&raw[fed..end]);
                fed = end;
            }
        }
    }
}

/// A body that could not be read to its end.
#[derive(Debug)]
pub(crate) struct BodyError(String);

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BodyError {}

impl http_body::Body for FastBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        match this {
            FastBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            FastBody::Streaming(s) => match ready!(s.poll_next(cx)) {
                Ok(Some(data)) => Poll::Ready(Some(Ok(Frame::data(data)))),
                Ok(None) => {
                    let done = std::mem::replace(this, FastBody::Full(None));
                    if let FastBody::Streaming(s) = done {
                        if s.keep_alive {
                            checkin(s.addr, s.stream, s.buf);
                        }
                    }
                    Poll::Ready(None)
                }
                Err(err) => {
                    *this = FastBody::Full(None);
                    Poll::Ready(Some(Err(err)))
                }
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            FastBody::Full(b) => b.is_none(),
            FastBody::Streaming(s) => s.framing == Framing::Length(0),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            FastBody::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            FastBody::Full(None) => SizeHint::with_exact(0),
            FastBody::Streaming(s) => match s.framing {
                Framing::Length(n) => SizeHint::with_exact(n),
                _ => SizeHint::default(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(raw: &str) -> Head {
        parse_head(raw.as_bytes(), false).unwrap().unwrap()
    }

    #[test]
    fn framing_follows_rfc_9112() {
        let h = head("HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello");
        assert_eq!(h.framing, Framing::Length(5));
        assert!(h.keep_alive);
        assert_eq!(h.len, 38);
        let h = head("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n");
        assert_eq!(h.framing, Framing::Chunked(Chunk::Size));
        let h = head("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n");
        assert_eq!(h.framing, Framing::Chunked(Chunk::Size));
        assert!(!h.keep_alive, "an answer with both is not kept");
        let h = head("HTTP/1.1 200 OK\r\n\r\n");
        assert_eq!(h.framing, Framing::Close);
        assert!(!h.keep_alive);
        let h = head("HTTP/1.0 200 OK\r\ncontent-length: 1\r\n\r\n");
        assert!(!h.keep_alive, "HTTP/1.0 closes unless it says keep-alive");
        let h = head("HTTP/1.0 200 OK\r\ncontent-length: 1\r\nConnection: Keep-Alive\r\n\r\n");
        assert!(h.keep_alive);
        let h = head("HTTP/1.1 200 OK\r\ncontent-length: 1\r\nconnection: close\r\n\r\n");
        assert!(!h.keep_alive);
        let h = head(
            "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nConnection: keep-alive, x-hop\r\n\
             X-Hop: 1\r\nKeep-Alive: timeout=5\r\nX-Kept: 1\r\n\r\n",
        );
        let names: Vec<&str> = h.headers.keys().map(|k| k.as_str()).collect();
        assert_eq!(
            names,
            ["content-length", "x-kept"],
            "hop-by-hop headers are dropped"
        );
        let h = head("HTTP/1.1 204 No Content\r\n\r\n");
        assert_eq!(h.framing, Framing::Length(0));
        assert!(h.keep_alive);
        let h = parse_head(b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n", true)
            .unwrap()
            .unwrap();
        assert_eq!(h.framing, Framing::Length(0), "a HEAD answer has no body");
        assert!(parse_head(b"HTTP/1.1 200 OK\r\ncontent-le", false)
            .unwrap()
            .is_none());
    }

    #[test]
    fn malformed_heads_are_refused() {
        for raw in [
            "HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
            "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n",
            "SMTP ready\r\n\r\n",
        ] {
            assert!(parse_head(raw.as_bytes(), false).is_err(), "{raw:?}");
        }
    }

    fn dechunk(raw: &[u8], step: usize) -> Result<Vec<u8>, String> {
        decode_chunked_body(raw, step).map(|(data, _)| data)
    }

    #[test]
    fn chunked_bodies_decode_however_they_arrive() {
        let raw = b"5;ext=1\r\nhello\r\n7\r\n, world\r\n0\r\nx-trailer: 1\r\n\r\n";
        for step in [1, 2, 3, 7, raw.len()] {
            assert_eq!(dechunk(raw, step).unwrap(), b"hello, world", "step {step}");
        }
        assert!(dechunk(b"5\r\nhello world\r\n0\r\n\r\n", 4).is_err());
        assert!(dechunk(b"zz\r\n", 4).is_err());
        assert!(dechunk(b"5\r\nhel", 4).is_err());
    }
}
