//! A blocking HTTP/1.1 client for the fault runner (one request per connection, a
//! deadline for the whole exchange) that tells apart a request that never left (the
//! connection was refused or timed out: it did nothing) from one whose answer was lost
//! (it may have taken effect).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// How an exchange ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// An answer: status and body.
    Answer(u16, String),
    /// No connection was made: the request was never sent.
    NotSent(String),
    /// Sent, but no whole answer came back in time.
    Lost(String),
}

/// Sends `method path` with an optional JSON body to `addr`; `host` is the Host header
/// (the address when `None`); the whole exchange is given `timeout`.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    host: Option<&str>,
    bearer: &str,
    body: Option<&str>,
    timeout: Duration,
) -> Reply {
    let started = Instant::now();
    let connect = timeout.min(Duration::from_secs(2));
    let mut s = match TcpStream::connect_timeout(&addr, connect) {
        Ok(s) => s,
        Err(e) => return Reply::NotSent(format!("connect: {e}")),
    };
    let _ = s.set_nodelay(true);
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n",
        host.map(str::to_string).unwrap_or_else(|| addr.to_string())
    );
    if !bearer.is_empty() {
        head.push_str(&format!("Authorization: Bearer {bearer}\r\n"));
    }
    let body = body.unwrap_or("");
    if !body.is_empty() || method != "GET" {
        head.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    head.push_str("\r\n");
    head.push_str(body);
    let _ = s.set_write_timeout(Some(timeout));
    if let Err(e) = s.write_all(head.as_bytes()) {
        return Reply::Lost(format!("sending: {e}"));
    }
    let mut answer = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        let left = timeout.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Reply::Lost(format!("no answer within {timeout:?}"));
        }
        let _ = s.set_read_timeout(Some(left));
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Reply::Lost(format!("no answer within {timeout:?}"))
            }
            Err(e) => return Reply::Lost(format!("reading: {e}")),
        }
    }
    parse(&answer).unwrap_or_else(|| Reply::Lost("a cut or malformed answer".into()))
}

/// Status and body of a whole HTTP/1.1 answer (content-length or chunked).
fn parse(answer: &[u8]) -> Option<Reply> {
    let text = String::from_utf8_lossy(answer);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status: u16 = head.split_whitespace().nth(1)?.parse().ok()?;
    let header = |name: &str| {
        head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    };
    let body = if header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        crate::dechunk(body)
    } else if let Some(len) = header("content-length").and_then(|v| v.parse::<usize>().ok()) {
        if body.len() < len {
            return None;
        }
        body[..len].to_string()
    } else {
        body.to_string()
    };
    Some(Reply::Answer(status, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_parsed_and_cut_ones_are_not() {
        assert_eq!(
            parse(b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n{}"),
            Some(Reply::Answer(201, "{}".into()))
        );
        assert_eq!(
            parse(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"),
            Some(Reply::Answer(200, "{}".into()))
        );
        assert_eq!(
            parse(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{}"),
            None
        );
        assert_eq!(parse(b"HTTP/1.1 200 OK\r\n"), None);
    }

    #[test]
    fn a_refused_connection_is_not_sent() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        drop(l);
        let r = request(addr, "GET", "/", None, "", None, Duration::from_secs(1));
        assert!(matches!(r, Reply::NotSent(_)), "{r:?}");
    }
}
