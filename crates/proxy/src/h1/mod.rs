//! The fast path to machines: an HTTP/1.1 exchange written and read directly on a pooled
//! upstream socket, inside the request's own task. It serves requests whose body is empty
//! or buffered and that ask for no upgrade (nearly all of them); others go through hyper's
//! client ([`crate::pool`]).
//!
//! hyper's client runs each connection as its own task and hands requests and responses to
//! it over channels: five task polls per proxied request. Here the request's task writes
//! the head and body in one `write`, reads and parses the response head (`httparse`), and
//! hands the client either the whole response (when its body has already arrived, the usual
//! case for small answers; the connection goes back to the pool at once) or a body that
//! reads the rest from the socket as the client takes it (content-length, chunked, or up to
//! close) and returns the connection to the pool when it ends.
//!
//! Connections are kept per proxy thread (no lock). A kept connection the machine has closed
//! is noticed when it is taken, and a request sent on a kept connection that turns out to be
//! closed before any byte of an answer is sent again on a new one when that is safe.

mod answer;

use crate::hop_tls::{SendError, Stream, Upstream};
pub(crate) use answer::FastBody;
use answer::Streaming;
pub use answer::{decode_chunked_body, parse_head, Chunk, Framing, Head as AnswerHead};
use bytes::{Buf, Bytes, BytesMut};
use http::header::{HeaderName, HeaderValue, CONTENT_LENGTH};
use http::{HeaderMap, Method, Response, StatusCode};
use rustc_hash::FxHashMap;
use std::cell::RefCell;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Idle connections older than this are closed.
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Most idle connections kept per address.
const MAX_IDLE_PER_ADDR: usize = 1024;
/// Largest response head accepted.
const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Bodies up to this size are written in the same `write` as the head.
const INLINE_BODY: usize = 16 * 1024;

/// One request to send: borrowed from the prepared request, so that nothing is copied
/// before it is written.
pub(crate) struct Exchange<'a> {
    pub method: &'a Method,
    /// Origin form: `/path?query`.
    pub target: &'a str,
    /// As received: those not [`forwarded`](crate::wire::forwarded), listed by a
    /// `Connection` header, or set in `extra` are left out.
    pub headers: &'a HeaderMap,
    /// Headers this proxy sets.
    pub extra: &'a [(HeaderName, HeaderValue)],
    /// Headers of this attempt only (the hop's).
    pub hop: &'a [(HeaderName, HeaderValue)],
    pub body: &'a Bytes,
}

impl Exchange<'_> {
    fn idempotent(&self) -> bool {
        crate::wire::idempotent(self.method)
    }

    /// The request head (and a small body) as written on the wire.
    fn encode(&self) -> Vec<u8> {
        let inline = self.body.len() <= INLINE_BODY;
        let mut out = Vec::with_capacity(
            256 + self.headers.len() * 32 + if inline { self.body.len() } else { 0 },
        );
        out.extend_from_slice(self.method.as_str().as_bytes());
        out.push(b' ');
        out.extend_from_slice(self.target.as_bytes());
        out.extend_from_slice(b" HTTP/1.1\r\n");
        let mut had_length = false;
        // Names a `Connection` header lists apply to one connection too (rare).
        let listed: Vec<&[u8]> = self
            .headers
            .get_all(http::header::CONNECTION)
            .iter()
            .flat_map(|v| v.as_bytes().split(|b| *b == b','))
            .map(<[u8]>::trim_ascii)
            .collect();
        let passed = self.headers.iter().filter(|(name, _)| {
            crate::wire::forwarded(name)
                && !self.extra.iter().any(|(n, _)| n == *name)
                && !listed
                    .iter()
                    .any(|l| l.eq_ignore_ascii_case(name.as_str().as_bytes()))
        });
        let ours = self.extra.iter().chain(self.hop).map(|(n, v)| (n, v));
        for (name, value) in passed.chain(ours) {
            if name == CONTENT_LENGTH {
                had_length = true;
                continue;
            }
            out.extend_from_slice(name.as_str().as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        if !self.body.is_empty() || had_length {
            out.extend_from_slice(b"content-length: ");
            out.extend_from_slice(self.body.len().to_string().as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"\r\n");
        if inline {
            out.extend_from_slice(self.body);
        }
        out
    }
}

/// A kept connection to a machine.
struct Conn {
    stream: Stream,
    /// Bytes read from it and not yet used.
    buf: BytesMut,
    /// When it was last handed back ([`crate::clock::monotonic_ms`]).
    since_ms: u64,
}

thread_local! {
    static IDLE: RefCell<FxHashMap<SocketAddr, Vec<Conn>>> = RefCell::new(FxHashMap::default());
}

/// An idle connection to `addr` that is still open, if this thread keeps one.
fn checkout(addr: SocketAddr) -> Option<Conn> {
    IDLE.with(|idle| {
        let mut idle = idle.borrow_mut();
        let conns = idle.get_mut(&addr)?;
        while let Some(mut conn) = conns.pop() {
            if !expired(conn.since_ms) && conn.stream.still_open() {
                return Some(conn);
            }
        }
        None
    })
}

/// Whether a connection idle since `since_ms` is too old to use.
fn expired(since_ms: u64) -> bool {
    crate::clock::monotonic_ms().saturating_sub(since_ms) >= IDLE_TIMEOUT.as_millis() as u64
}

/// Keeps a connection whose last exchange ended cleanly.
pub(super) fn checkin(addr: SocketAddr, stream: Stream, buf: BytesMut) {
    if !buf.is_empty() {
        // The machine sent more than its answer: the connection is out of step.
        return;
    }
    let _ = IDLE.try_with(|idle| {
        let mut idle = idle.borrow_mut();
        let conns = idle.entry(addr).or_default();
        if conns.len() < MAX_IDLE_PER_ADDR {
            conns.push(Conn {
                stream,
                buf,
                since_ms: crate::clock::monotonic_ms(),
            });
        }
    });
}

/// Closes this thread's idle connections that expired (run now and then).
pub(crate) fn sweep() {
    IDLE.with(|idle| {
        let mut idle = idle.borrow_mut();
        idle.retain(|_, conns| {
            conns.retain(|c| !expired(c.since_ms));
            !conns.is_empty()
        });
    });
}

/// Sends `ex` to `up` and reads the answer's head; the body follows in the response.
pub(crate) async fn send(
    up: Upstream<'_>,
    ex: &Exchange<'_>,
) -> Result<Response<FastBody>, SendError> {
    let addr = up.addr;
    let wire = ex.encode();
    loop {
        let (conn, reused) = match checkout(addr) {
            Some(c) => (c, true),
            None => {
                let stream = crate::hop_tls::connect(up).await?;
                let conn = Conn {
                    stream,
                    buf: BytesMut::with_capacity(8 * 1024),
                    since_ms: crate::clock::monotonic_ms(),
                };
                (conn, false)
            }
        };
        match exchange(addr, conn, ex, &wire).await {
            Ok(resp) => return Ok(resp),
            // A kept connection closed under us before any answer: the machine never took
            // the request if the write failed, and may have if it did not. Sent again on a
            // new connection when either way is safe.
            Err(Failure::Closed { written }) if reused && (!written || ex.idempotent()) => continue,
            Err(Failure::Closed { written: false }) => {
                return Err(SendError::Connect(
                    "the connection closed before the request was written".into(),
                ))
            }
            Err(Failure::Closed { written: true }) => {
                return Err(SendError::Request(
                    "the connection closed before an answer began".into(),
                ))
            }
            Err(Failure::Other(err)) => return Err(SendError::Request(err)),
        }
    }
}

/// How an exchange failed.
enum Failure {
    /// The connection closed (or was reset) before any byte of an answer arrived.
    Closed {
        written: bool,
    },
    Other(String),
}

async fn exchange(
    addr: SocketAddr,
    mut conn: Conn,
    ex: &Exchange<'_>,
    wire: &[u8],
) -> Result<Response<FastBody>, Failure> {
    let write = async {
        conn.stream.write_all(wire).await?;
        if ex.body.len() > INLINE_BODY {
            conn.stream.write_all(ex.body).await?;
        }
        // Sends what TLS still holds (nothing to do on plain TCP).
        conn.stream.flush().await?;
        io::Result::Ok(())
    };
    if write.await.is_err() {
        return Err(Failure::Closed { written: false });
    }
    conn.buf.clear();
    loop {
        // The head, possibly after interim (1xx) answers.
        let head = loop {
            if !conn.buf.is_empty() {
                match parse_head(&conn.buf, ex.method == Method::HEAD) {
                    Ok(Some(head)) => break head,
                    Ok(None) if conn.buf.len() >= MAX_HEAD_BYTES => {
                        return Err(Failure::Other(format!(
                            "the answer's head is over {MAX_HEAD_BYTES} bytes"
                        )))
                    }
                    Ok(None) => {}
                    Err(err) => return Err(Failure::Other(err)),
                }
            }
            conn.buf.reserve(8 * 1024);
            let first = conn.buf.is_empty();
            match conn.stream.read_buf(&mut conn.buf).await {
                Ok(0) | Err(_) if first => return Err(Failure::Closed { written: true }),
                Ok(0) => {
                    return Err(Failure::Other(
                        "the connection closed in the answer's head".into(),
                    ))
                }
                Ok(_) => {}
                Err(err) => return Err(Failure::Other(err.to_string())),
            }
        };
        conn.buf.advance(head.len);
        if head.status.is_informational() {
            if head.status == StatusCode::SWITCHING_PROTOCOLS {
                return Err(Failure::Other(
                    "the machine switched protocols unasked".into(),
                ));
            }
            continue;
        }
        let mut resp = Response::new(FastBody::Full(None));
        *resp.status_mut() = head.status;
        *resp.headers_mut() = head.headers;
        let body = match head.framing {
            Framing::Length(0) => {
                if head.keep_alive {
                    checkin(addr, conn.stream, conn.buf);
                }
                FastBody::Full(None)
            }
            Framing::Length(n) if (conn.buf.len() as u64) >= n => {
                let body = conn.buf.split_to(n as usize).freeze();
                if head.keep_alive {
                    checkin(addr, conn.stream, conn.buf);
                }
                FastBody::Full(Some(body))
            }
            framing => FastBody::Streaming(Box::new(Streaming {
                addr,
                stream: conn.stream,
                buf: conn.buf,
                framing,
                keep_alive: head.keep_alive,
            })),
        };
        *resp.body_mut() = body;
        return Ok(resp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_encoded_with_their_length() {
        let mut headers = HeaderMap::new();
        headers.insert(http::header::HOST, HeaderValue::from_static("a.localhost"));
        headers.insert(CONTENT_LENGTH, HeaderValue::from_static("999"));
        let body = Bytes::from_static(b"hi");
        let extra = [(
            HeaderName::from_static("x-extra"),
            HeaderValue::from_static("1"),
        )];
        headers.insert("x-extra", HeaderValue::from_static("from the client"));
        headers.insert(
            http::header::CONNECTION,
            HeaderValue::from_static("x-private, close"),
        );
        headers.insert("x-private", HeaderValue::from_static("1"));
        headers.insert("bazaar-proxy-hop", HeaderValue::from_static("secret"));
        headers.insert(
            http::header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        let hop = [(
            HeaderName::from_static("bazaar-proxy-machine"),
            HeaderValue::from_static("m1"),
        )];
        let ex = Exchange {
            method: &Method::POST,
            target: "/p?q=1",
            headers: &headers,
            extra: &extra,
            hop: &hop,
            body: &body,
        };
        let wire = String::from_utf8(ex.encode()).unwrap();
        assert_eq!(
            wire,
            "POST /p?q=1 HTTP/1.1\r\nhost: a.localhost\r\nx-extra: 1\r\n\
             bazaar-proxy-machine: m1\r\ncontent-length: 2\r\n\r\nhi"
        );
        let empty = Bytes::new();
        let ex = Exchange {
            method: &Method::GET,
            target: "/",
            headers: &HeaderMap::new(),
            extra: &[],
            hop: &[],
            body: &empty,
        };
        assert_eq!(
            String::from_utf8(ex.encode()).unwrap(),
            "GET / HTTP/1.1\r\n\r\n"
        );
    }
}
