//! The client side of plain HTTP/1.1 without hyper's server: the requests that make up
//! nearly all of a proxy's traffic (no body, or a small one with a content-length; no
//! upgrade, no `Expect`) are read with `httparse` and answered on the connection's own
//! task, the answer written in one `write` when its body is at hand.
//!
//! Anything else on a connection (HTTP/2, an upgrade, a chunked or large request body,
//! `Expect: 100-continue`, a TCP hop) hands the whole connection, with the bytes read so
//! far, to hyper's server for the rest of its life ([`Outcome::HandOff`], [`Rewind`]).
//!
//! The defences hyper's server gave stay: a request head, once begun, must arrive whole
//! within [`HEADER_READ_TIMEOUT`] (a coarse timer, [`crate::timer`]) and be at most
//! [`MAX_HEAD_BYTES`]; a malformed one gets a 400 and the connection is closed. An idle
//! connection is closed after [`KEEP_ALIVE_IDLE`].

use crate::body::RespBody;
use crate::http::handle_parts;
use crate::request::{ClientBody, Https, REPLAYABLE_BODY};
use crate::shared::Local;
use crate::timer::CoarseSleep;
use crate::wire::{HEADER_READ_TIMEOUT, HOP_TCP_PORT, MAX_HEAD_BYTES};
use bytes::{Bytes, BytesMut};
use http::header::{HeaderName, HeaderValue, CONTENT_LENGTH, DATE};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use http_body_util::BodyExt;
use std::cell::RefCell;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::SystemTime;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

/// Most headers in a request (as hyper's server allows).
const MAX_HEADERS: usize = 100;
/// How long a connection may sit idle between requests (nginx's `keepalive_timeout` is
/// 75 s).
const KEEP_ALIVE_IDLE: std::time::Duration = std::time::Duration::from_secs(60);
/// Room read into at a time.
const READ_CHUNK: usize = 8 * 1024;

/// How a connection served here ended.
pub(crate) enum Outcome {
    /// Closed (by either side, or after an error answer).
    Closed,
    /// For hyper's server, with the bytes already read from it.
    HandOff(Bytes),
}

/// What a request head asks of this server.
struct Head {
    /// Length of the head in the buffer.
    len: usize,
    content_length: u64,
    keep_alive: bool,
    method: Method,
    http10: bool,
    /// Where the request target is in the head.
    target: Span,
}

/// Offset and length of some bytes of a request head.
type Span = (u32, u32);

/// Where each header's name and value are in the head (filled by [`inspect`], so that the
/// head is parsed once).
type HeaderSpans = Vec<(Span, Span)>;

/// Serves plain HTTP/1.1 requests on `stream` until it closes or asks for more than this
/// server does.
pub(crate) async fn serve<S: ClientStream>(
    stream: &mut S,
    local: &Arc<Local>,
    peer_ip: &HeaderValue,
) -> Outcome {
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    let mut out = Vec::with_capacity(1024);
    let mut spans = HeaderSpans::with_capacity(16);
    loop {
        // A whole request head, in time: an idle connection is kept for a while, a head
        // once begun must arrive whole within [`HEADER_READ_TIMEOUT`].
        let mut head_begun = !buf.is_empty();
        let wait = if head_begun {
            HEADER_READ_TIMEOUT
        } else {
            KEEP_ALIVE_IDLE
        };
        let mut sleep = CoarseSleep::after(wait);
        let head = loop {
            if !buf.is_empty() {
                if !head_begun {
                    head_begun = true;
                    sleep = CoarseSleep::after(HEADER_READ_TIMEOUT);
                }
                if buf.starts_with(b"PRI") {
                    // The HTTP/2 connection preface.
                    return Outcome::HandOff(buf.freeze());
                }
                let parsed = inspect(&buf, &mut spans);
                let too_large = match &parsed {
                    Ok(Some(Some(head))) => head.len > MAX_HEAD_BYTES,
                    Ok(None) => buf.len() > MAX_HEAD_BYTES,
                    _ => false,
                };
                match parsed {
                    _ if too_large => {
                        let _ = stream
                            .write_all(&plain_error(
                                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                                "bazaar proxy: the request head is too large",
                            ))
                            .await;
                        return Outcome::Closed;
                    }
                    Ok(Some(Some(head))) => break head,
                    Ok(Some(None)) => return Outcome::HandOff(buf.freeze()),
                    Ok(None) => {}
                    Err(why) => {
                        let _ = stream
                            .write_all(&plain_error(StatusCode::BAD_REQUEST, &why))
                            .await;
                        return Outcome::Closed;
                    }
                }
            }
            if !read_more(stream, &mut buf, &mut sleep).await {
                return Outcome::Closed;
            }
        };
        let head_bytes = buf.split_to(head.len).freeze();
        let mut parts = match build_parts(&head, &spans, &head_bytes) {
            Ok(p) => p,
            Err(why) => {
                let _ = stream
                    .write_all(&plain_error(StatusCode::BAD_REQUEST, &why))
                    .await;
                return Outcome::Closed;
            }
        };
        // Its body (small, or it would have been handed over), in time as well.
        let body_len = head.content_length as usize;
        let mut sleep = CoarseSleep::after(HEADER_READ_TIMEOUT);
        while buf.len() < body_len {
            if !read_more(stream, &mut buf, &mut sleep).await {
                return Outcome::Closed;
            }
        }
        let body = buf.split_to(body_len).freeze();
        let is_head = head.method == Method::HEAD;
        if S::TLS {
            parts.extensions.insert(Https);
        }
        let resp = handle_parts(local.clone(), peer_ip, parts, ClientBody::Buffered(body)).await;
        match write_response(
            stream,
            &mut out,
            resp,
            is_head,
            // Closed after this answer when the host shuts down.
            head.keep_alive && !local.closing.load(std::sync::atomic::Ordering::Relaxed),
            head.http10,
        )
        .await
        {
            // TLS keeps what the socket did not take yet: sent now.
            Ok(true) if !S::TLS || stream.flush().await.is_ok() => {}
            Ok(_) | Err(_) => {
                if S::TLS {
                    let _ = stream.flush().await;
                }
                return Outcome::Closed;
            }
        }
    }
}

/// A client connection requests are read from: plain TCP, or TLS (whose requests are
/// marked [`crate::request::Https`]).
pub(crate) trait ClientStream: AsyncRead + AsyncWrite + Unpin {
    const TLS: bool;
}

impl ClientStream for TcpStream {
    const TLS: bool = false;
}

/// Reads more of the connection into `buf`; `false` when it closed, failed, or `sleep`
/// ran out first.
async fn read_more<S: ClientStream>(
    stream: &mut S,
    buf: &mut BytesMut,
    sleep: &mut CoarseSleep,
) -> bool {
    if buf.capacity() - buf.len() < 1024 {
        buf.reserve(READ_CHUNK);
    }
    let read = tokio::select! {
        biased;
        r = stream.read_buf(buf) => r,
        () = sleep => return false,
    };
    matches!(read, Ok(n) if n > 0)
}

/// Whether `buf` starts with a whole request head (`None`: not yet), and whether this
/// server takes it (`Some(None)`: hand the connection to hyper). `Err`: malformed.
fn inspect(buf: &[u8], spans: &mut HeaderSpans) -> Result<Option<Option<Head>>, String> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        // HTTP/2 and anything newer.
        Err(httparse::Error::Version) => return Ok(Some(None)),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(format!(
                "bazaar proxy: the request has more than {MAX_HEADERS} headers"
            ))
        }
        Err(err) => return Err(format!("bazaar proxy: malformed request: {err}")),
    };
    if req.method == Some("CONNECT") {
        return Ok(Some(None));
    }
    let method = req.method.unwrap_or_default();
    let method = Method::from_bytes(method.as_bytes())
        .map_err(|_| format!("bazaar proxy: bad method {method:?}"))?;
    let span = |part: &[u8]| -> Span {
        (
            (part.as_ptr() as usize - buf.as_ptr() as usize) as u32,
            part.len() as u32,
        )
    };
    let target = span(req.path.unwrap_or_default().as_bytes());
    spans.clear();
    let http11 = req.version == Some(1);
    let mut keep_alive = http11;
    let mut content_length: Option<u64> = None;
    for h in req.headers.iter() {
        let name = h.name;
        spans.push((span(name.as_bytes()), span(h.value)));
        if name.eq_ignore_ascii_case("content-length") {
            // Digits only (RFC 9110 §8.6): no sign, no space, nothing a machine could read
            // differently.
            let value = h.value.trim_ascii();
            let n =
                (!value.is_empty() && value.len() <= 19 && value.iter().all(u8::is_ascii_digit))
                    .then(|| std::str::from_utf8(value).ok()?.parse::<u64>().ok())
                    .flatten()
                    .ok_or("bazaar proxy: malformed content-length")?;
            if content_length.is_some_and(|m| m != n) {
                return Err("bazaar proxy: conflicting content-length headers".into());
            }
            content_length = Some(n);
        } else if name.eq_ignore_ascii_case("connection") {
            for token in h.value.split(|&b| b == b',') {
                let token = token.trim_ascii();
                if token.eq_ignore_ascii_case(b"close") {
                    keep_alive = false;
                } else if token.eq_ignore_ascii_case(b"keep-alive") {
                    keep_alive = true;
                } else if token.eq_ignore_ascii_case(b"upgrade") {
                    return Ok(Some(None));
                }
            }
        } else if name.eq_ignore_ascii_case("transfer-encoding")
            || name.eq_ignore_ascii_case("upgrade")
            || name.eq_ignore_ascii_case("expect")
            || name.eq_ignore_ascii_case(HOP_TCP_PORT.as_str())
        {
            return Ok(Some(None));
        }
    }
    let content_length = content_length.unwrap_or(0);
    if content_length > REPLAYABLE_BODY {
        return Ok(Some(None));
    }
    Ok(Some(Some(Head {
        len,
        content_length,
        keep_alive,
        method,
        http10: !http11,
        target,
    })))
}

/// The request's head as `http` types, sharing `bytes` (the head [`inspect`] looked at).
fn build_parts(
    head: &Head,
    spans: &HeaderSpans,
    bytes: &Bytes,
) -> Result<http::request::Parts, String> {
    let at = |(start, len): Span| bytes.slice(start as usize..(start + len) as usize);
    let (mut parts, ()) = Request::new(()).into_parts();
    parts.method = head.method.clone();
    let target = at(head.target);
    parts.uri = Uri::from_maybe_shared(target.clone()).map_err(|err| {
        format!(
            "bazaar proxy: bad request target {:?}: {err}",
            String::from_utf8_lossy(&target)
        )
    })?;
    parts.version = if head.http10 {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    parts.headers.reserve(spans.len());
    for &(name, value) in spans {
        let name = at(name);
        let name = HeaderName::from_bytes(&name).map_err(|_| {
            format!(
                "bazaar proxy: bad header name {:?}",
                String::from_utf8_lossy(&name)
            )
        })?;
        let value = HeaderValue::from_maybe_shared(at(value))
            .map_err(|_| format!("bazaar proxy: bad value for header {name:?}"))?;
        parts.headers.append(name, value);
    }
    Ok(parts)
}

/// What this server makes of the first bytes of a connection (the decision `serve`
/// takes on a request head), for fuzzing and the differential tests against hyper's parser.
#[derive(Debug)]
pub enum RequestHead {
    /// The head is not whole yet.
    Partial,
    /// The connection goes to hyper's server.
    HandOff,
    /// Served here: the request as it is passed on, the length of its head, and of its body.
    Served {
        parts: Box<http::request::Parts>,
        head_len: usize,
        content_length: u64,
        keep_alive: bool,
    },
}

/// Reads the request head at the start of `buf` as `serve` does; `Err`: the client gets
/// a 400 (or a 431 for a head over 64 KiB) and the connection is closed.
pub fn read_request_head(buf: &[u8]) -> Result<RequestHead, String> {
    if buf.starts_with(b"PRI") {
        return Ok(RequestHead::HandOff);
    }
    let mut spans = HeaderSpans::new();
    let head = match inspect(buf, &mut spans)? {
        None if buf.len() > MAX_HEAD_BYTES => return Err("the request head is too large".into()),
        None => return Ok(RequestHead::Partial),
        Some(None) => return Ok(RequestHead::HandOff),
        Some(Some(head)) if head.len > MAX_HEAD_BYTES => {
            return Err("the request head is too large".into())
        }
        Some(Some(head)) => head,
    };
    let parts = build_parts(&head, &spans, &Bytes::copy_from_slice(&buf[..head.len]))?;
    Ok(RequestHead::Served {
        parts: Box::new(parts),
        head_len: head.len,
        content_length: head.content_length,
        keep_alive: head.keep_alive,
    })
}

/// Writes `resp` to the client; `Ok(false)` when the connection must close after it.
async fn write_response<S: ClientStream>(
    stream: &mut S,
    out: &mut Vec<u8>,
    resp: Response<RespBody>,
    is_head: bool,
    keep_alive: bool,
    http10: bool,
) -> io::Result<bool> {
    let (parts, mut body) = resp.into_parts();
    let status = parts.status;
    let bodiless = is_head
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    let known_length = parts.headers.contains_key(CONTENT_LENGTH);
    let exact = http_body::Body::size_hint(&body).exact();
    // Without a length, the body is sent chunked (or up to close, to an HTTP/1.0 client).
    let chunked = !bodiless && !known_length && exact.is_none() && !http10;
    let keep_alive = keep_alive && (bodiless || known_length || exact.is_some() || chunked);

    out.clear();
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in &parts.headers {
        if name == http::header::TRANSFER_ENCODING || name == http::header::CONNECTION {
            continue;
        }
        header(out, name.as_str().as_bytes(), value.as_bytes());
    }
    if !parts.headers.contains_key(DATE) {
        DATE_NOW.with(|d| header(out, b"date", d.borrow_mut().get()));
    }
    match (bodiless, known_length, exact, chunked) {
        (false, false, Some(n), _) => {
            header(out, b"content-length", n.to_string().as_bytes());
        }
        (_, _, _, true) => header(out, b"transfer-encoding", b"chunked"),
        _ => {}
    }
    if !keep_alive {
        header(out, b"connection", b"close");
    } else if http10 {
        header(out, b"connection", b"keep-alive");
    }
    out.extend_from_slice(b"\r\n");
    if bodiless {
        drop(body);
        stream.write_all(out).await?;
        return Ok(keep_alive);
    }
    // The head and the first part of the body (all of it, usually) in one write.
    let mut first = true;
    loop {
        let frame = match body.frame().await {
            Some(Ok(frame)) => frame,
            Some(Err(err)) => {
                // The machine failed mid-body: the client sees the connection end early
                // (or a 502, when nothing was sent yet).
                tracing::debug!(error = %err, "response body");
                if first {
                    let text = format!("bazaar proxy: the machine's answer failed: {err}");
                    stream
                        .write_all(&plain_error(StatusCode::BAD_GATEWAY, &text))
                        .await?;
                }
                return Ok(false);
            }
            None => break,
        };
        if !first {
            out.clear();
        }
        first = false;
        match frame.into_data() {
            Ok(data) if data.is_empty() => {}
            Ok(data) if chunked => {
                out.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
                out.extend_from_slice(&data);
                out.extend_from_slice(b"\r\n");
            }
            Ok(data) if out.len() + data.len() <= 64 * 1024 => out.extend_from_slice(&data),
            Ok(data) => {
                stream.write_all(out).await?;
                out.clear();
                stream.write_all(&data).await?;
            }
            Err(frame) => {
                if let (Ok(trailers), true) = (frame.into_trailers(), chunked) {
                    out.extend_from_slice(b"0\r\n");
                    for (name, value) in &trailers {
                        header(out, name.as_str().as_bytes(), value.as_bytes());
                    }
                    out.extend_from_slice(b"\r\n");
                    stream.write_all(out).await?;
                    return Ok(keep_alive);
                }
            }
        }
        if !out.is_empty() {
            stream.write_all(out).await?;
        }
    }
    out.clear();
    if chunked {
        out.extend_from_slice(b"0\r\n\r\n");
    }
    if !out.is_empty() || first {
        stream.write_all(out).await?;
    }
    Ok(keep_alive)
}

fn header(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// A whole answer made here, to a request this server could not take, closing the
/// connection.
fn plain_error(status: StatusCode, text: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {} {}\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}\n",
        status.as_str(),
        status.canonical_reason().unwrap_or(""),
        text.len() + 1,
    )
    .into_bytes()
}

thread_local! {
    /// The `Date` header for answers that have none, formatted once a second per thread.
    static DATE_NOW: RefCell<CachedDate> = const { RefCell::new(CachedDate { second: 0, text: String::new() }) };
}

struct CachedDate {
    second: u64,
    text: String,
}

impl CachedDate {
    fn get(&mut self) -> &[u8] {
        let now_ms = crate::clock::now_ms();
        if now_ms / 1000 != self.second || self.text.is_empty() {
            self.second = now_ms / 1000;
            self.text = httpdate::fmt_http_date(SystemTime::now());
        }
        self.text.as_bytes()
    }
}

/// A connection whose first bytes were already read: they are read again first (how a
/// connection is handed to hyper's server after [`serve`] looked at it).
pub(crate) struct Rewind<S = TcpStream> {
    pre: Bytes,
    stream: S,
}

impl<S> Rewind<S> {
    pub(crate) fn new(pre: Bytes, stream: S) -> Rewind<S> {
        Rewind { pre, stream }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewind<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.pre.is_empty() {
            let n = this.pre.len().min(buf.remaining());
            buf.put_slice(&this.pre.split_to(n));
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.stream).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewind<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(text: &str) -> Result<Option<Option<Head>>, String> {
        inspect(text.as_bytes(), &mut Vec::new())
    }

    #[test]
    fn plain_requests_are_taken_and_others_handed_over() {
        let h = head("GET / HTTP/1.1\r\nHost: a.localhost\r\n\r\n")
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(h.keep_alive);
        assert_eq!(h.content_length, 0);
        let h = head(
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
        )
        .unwrap()
        .unwrap()
        .unwrap();
        assert_eq!((h.content_length, h.keep_alive), (5, false));
        let h = head("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n")
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(h.keep_alive);
        let h = head("GET / HTTP/1.0\r\n\r\n").unwrap().unwrap().unwrap();
        assert!(!h.keep_alive, "HTTP/1.0 closes unless asked");
        assert!(
            head("GET / HTTP/1.1\r\nHost: a\r\n").unwrap().is_none(),
            "not whole yet"
        );
        for handed_over in [
            "GET / HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 100000\r\n\r\n",
            "POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n",
            "CONNECT a:443 HTTP/1.1\r\n\r\n",
            "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        ] {
            assert!(matches!(head(handed_over), Ok(Some(None))), "{handed_over}");
        }
        for bad in [
            "GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n",
            "GET / HTTP/1.1\r\nContent-Length: +5\r\n\r\n",
            "GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
            "GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            "GET\x01 / HTTP/1.1\r\n\r\n",
        ] {
            assert!(head(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn parts_share_the_head_bytes() {
        let text = Bytes::from_static(
            b"HEAD /a?b=c HTTP/1.1\r\nHost: web.localhost\r\nX-A: 1\r\nX-A: 2\r\n\r\n",
        );
        let mut spans = Vec::new();
        let head = inspect(&text, &mut spans).unwrap().unwrap().unwrap();
        let parts = build_parts(&head, &spans, &text.slice(..head.len)).unwrap();
        assert_eq!(parts.method, Method::HEAD);
        assert_eq!(parts.uri.path_and_query().unwrap().as_str(), "/a?b=c");
        assert_eq!(parts.headers["host"], "web.localhost");
        assert_eq!(parts.headers.get_all("x-a").iter().count(), 2);
    }
}
