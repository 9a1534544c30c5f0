//! The proxy's own HTTP/1.1 request reader against hyper's server (issue 21 item 4): every
//! head the fast path serves itself, hyper's server must read the same way (method, target,
//! version, headers, and the body's length), so a client cannot make the proxy and a server
//! behind it (or hyper, which takes the connections the fast path hands over) disagree on
//! where a request ends: no request smuggling through Content-Length / Transfer-Encoding.

mod support;

use bazaar_proxy::{read_request_head, RequestHead};
use proptest::prelude::*;
use support::hyper_reference::{hyper_reads, without_length};

/// What the fast path decides about `input`.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Decision {
    Served { content_length: u64 },
    HandOff,
    Partial,
    Refused,
}
use Decision::*;

/// The fast path's decision on `input`, after checking it against hyper's when it serves.
fn check(input: &[u8]) -> Decision {
    let ours = read_request_head(input);
    let Ok(RequestHead::Served {
        parts,
        head_len,
        content_length,
        ..
    }) = ours
    else {
        return match ours {
            Ok(RequestHead::HandOff) => HandOff,
            Ok(RequestHead::Partial) => Partial,
            _ => Refused,
        };
    };
    let shown = String::from_utf8_lossy(input);
    let theirs = hyper_reads(input)
        .unwrap_or_else(|| panic!("the proxy serves a head hyper refuses: {shown:?}"));
    assert_eq!(parts.method, theirs.method, "{shown:?}");
    assert_eq!(parts.uri, theirs.uri, "{shown:?}");
    assert_eq!(parts.version, theirs.version, "{shown:?}");
    assert_eq!(
        without_length(&parts.headers),
        without_length(&theirs.headers),
        "{shown:?}"
    );
    let rest = (input.len() - head_len) as u64;
    if rest >= content_length {
        assert_eq!(
            theirs.body_len,
            Some(content_length as usize),
            "hyper reads another body length: {shown:?}"
        );
    }
    // The head ends where the proxy says: one byte less is not a whole head.
    assert!(
        matches!(
            read_request_head(&input[..head_len - 1]),
            Ok(RequestHead::Partial)
        ),
        "{shown:?}"
    );
    Served { content_length }
}

#[test]
fn tricky_heads_are_read_as_hyper_reads_them_or_refused() {
    let many_headers = |n: usize| {
        let mut h = String::from("GET / HTTP/1.1\r\n");
        for i in 0..n {
            h.push_str(&format!("x-h{i}: {i}\r\n"));
        }
        h + "\r\n"
    };
    let cases: Vec<(String, Decision)> = vec![
        (
            "GET / HTTP/1.1\r\nHost: a\r\n\r\n".into(),
            Served { content_length: 0 },
        ),
        // Bare LF line ends (accepted by both).
        (
            "GET / HTTP/1.1\nHost: a\n\n".into(),
            Served { content_length: 0 },
        ),
        (
            "POST / HTTP/1.1\nContent-Length: 3\n\nabc".into(),
            Served { content_length: 3 },
        ),
        // obs-fold (RFC 9112 §5.2: a server may reject it).
        ("GET / HTTP/1.1\r\nX-A: a\r\n b\r\n\r\n".into(), Refused),
        ("GET / HTTP/1.1\r\nX-A: a\r\n\tb\r\n\r\n".into(), Refused),
        // Duplicate Content-Length: equal values are one length, others are refused.
        (
            "POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc".into(),
            Served { content_length: 3 },
        ),
        (
            "POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd".into(),
            Refused,
        ),
        (
            "POST / HTTP/1.1\r\nContent-Length: 3, 3\r\n\r\nabc".into(),
            Refused,
        ),
        (
            "POST / HTTP/1.1\r\nContent-Length: 3 3\r\n\r\nabc".into(),
            Refused,
        ),
        (
            "POST / HTTP/1.1\r\nContent-Length: +3\r\n\r\nabc".into(),
            Refused,
        ),
        (
            "POST / HTTP/1.1\r\nContent-Length: 0x3\r\n\r\nabc".into(),
            Refused,
        ),
        (
            "POST / HTTP/1.1\r\nContent-Length: 18446744073709551616\r\n\r\n".into(),
            Refused,
        ),
        (
            "POST / HTTP/1.1\r\nContent-Length: 003\r\n\r\nabc".into(),
            Served { content_length: 3 },
        ),
        (
            "POST / HTTP/1.1\r\nContent-Length:  3 \r\n\r\nabc".into(),
            Served { content_length: 3 },
        ),
        // Content-Length with Transfer-Encoding, in either order, and any transfer coding:
        // hyper's server takes the connection (and applies RFC 9112 §6.3 itself).
        (
            "POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n".into(),
            HandOff,
        ),
        (
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n".into(),
            HandOff,
        ),
        (
            "POST / HTTP/1.1\r\ntransfer-encoding: gzip\r\n\r\n".into(),
            HandOff,
        ),
        // Whitespace between a field name and the colon (RFC 9112 §5.1: must be refused),
        // and names that only look like the framing headers.
        (
            "POST / HTTP/1.1\r\nContent-Length : 3\r\n\r\nabc".into(),
            Refused,
        ),
        (
            "POST / HTTP/1.1\r\nTransfer-Encoding : chunked\r\n\r\n".into(),
            Refused,
        ),
        (
            "POST / HTTP/1.1\r\n Content-Length: 3\r\n\r\nabc".into(),
            Refused,
        ),
        (
            "POST / HTTP/1.1\r\nContent-Length-X: 3\r\n\r\nabc".into(),
            Served { content_length: 0 },
        ),
        // Header counts at and over the limit hyper's server is given.
        (many_headers(100), Served { content_length: 0 }),
        (many_headers(101), Refused),
        // Non-ASCII: allowed in values (obs-text), not in names or the method.
        (
            "GET / HTTP/1.1\r\nX-A: caf\u{e9}\r\n\r\n".into(),
            Served { content_length: 0 },
        ),
        ("GET / HTTP/1.1\r\nX-\u{e9}: 1\r\n\r\n".into(), Refused),
        ("G\u{c9}T / HTTP/1.1\r\n\r\n".into(), Refused),
        // Control characters.
        ("GET / HTTP/1.1\r\nX-A: a\0b\r\n\r\n".into(), Refused),
        ("GET / HTTP/1.1\r\nX-A: a\rb\r\n\r\n".into(), Refused),
        ("GET /a\u{7f} HTTP/1.1\r\n\r\n".into(), Refused),
        // Targets and versions.
        (
            "GET http://other.example/x HTTP/1.1\r\n\r\n".into(),
            Served { content_length: 0 },
        ),
        (
            "POST / HTTP/1.0\r\nContent-Length: 2\r\n\r\nhi".into(),
            Served { content_length: 2 },
        ),
        // Versions httparse does not read are hyper's to answer.
        ("GET / HTTP/1.2\r\n\r\n".into(), HandOff),
        ("GET / HTTP/2.0\r\n\r\n".into(), HandOff),
        ("GET  / HTTP/1.1\r\n\r\n".into(), Refused),
        ("GET / HTTP/1.1\r\nHost: a\r\n".into(), Partial),
        // Upgrades and expectations go to hyper.
        (
            "GET / HTTP/1.1\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n".into(),
            HandOff,
        ),
        (
            "POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n".into(),
            HandOff,
        ),
    ];
    let mut wrong = Vec::new();
    for (input, expected) in &cases {
        let got = check(input.as_bytes());
        if got != *expected {
            wrong.push(format!("{input:?}: expected {expected:?}, got {got:?}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Pieces of request heads that parsers are known to read differently.
fn piece(options: &'static [&'static str]) -> impl Strategy<Value = &'static str> {
    proptest::sample::select(options)
}

fn header() -> impl Strategy<Value = String> {
    let name = piece(&[
        "Content-Length",
        "content-length",
        "Content-Length ",
        " Content-Length",
        "Transfer-Encoding",
        "Connection",
        "Host",
        "X-A",
        "X\u{e9}",
        "",
    ]);
    let value = piece(&[
        "0",
        "3",
        "03",
        " 3 ",
        "3,3",
        "-3",
        "+3",
        "3 3",
        "chunked",
        "close",
        "keep-alive",
        "upgrade",
        "a\tb",
        "caf\u{e9}",
        "",
        "\u{1}",
        "99999999999999999999",
    ]);
    let colon = piece(&[":", ": ", " :", ":\t"]);
    (name, colon, value).prop_map(|(n, c, v)| format!("{n}{c}{v}"))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn generated_heads_are_read_as_hyper_reads_them_or_refused(
        method in piece(&["GET", "POST", "HEAD", "PUT", "G@T", ""]),
        target in piece(&["/", "/a?b=c", "*", "http://h/x", "/%zz", "", "/a b"]),
        version in piece(&["HTTP/1.1", "HTTP/1.0", "HTTP/1.1 ", "http/1.1"]),
        headers in proptest::collection::vec(header(), 0..6),
        line_end in piece(&["\r\n", "\n"]),
        body in piece(&["", "abc", "abcdef", "0\r\n\r\n"]),
    ) {
        let mut input = format!("{method} {target} {version}{line_end}");
        for h in &headers {
            input.push_str(h);
            input.push_str(line_end);
        }
        input.push_str(line_end);
        input.push_str(body);
        check(input.as_bytes());
    }
}
