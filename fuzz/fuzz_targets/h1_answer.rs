//! How the proxy's fast path reads a machine's answer: the response head
//! (`bazaar_proxy::parse_head`: framing by RFC 9112 §6.3, hop-by-hop headers dropped) and
//! chunked bodies (`bazaar_proxy::decode_chunked_body`). Properties: the head reads the
//! same with or without what follows it and is incomplete one byte short; the framing
//! follows the headers; a chunked body decodes the same however it is split as it
//! arrives; and any body encoded in chunks decodes to itself.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use bazaar_proxy::{decode_chunked_body, parse_head, Framing};
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
struct Input {
    head_request: bool,
    step: u8,
    /// Bytes from a machine: a head, or a chunked body.
    raw: Vec<u8>,
    /// A body to send chunked: its chunks, each with an extension or not.
    chunks: Vec<(Vec<u8>, bool)>,
    trailers: Vec<(u8, u8)>,
    uppercase_sizes: bool,
}

fuzz_target!(|data: &[u8]| {
    match data.split_first() {
        // The seeds: answers and chunked bodies as machines send them.
        Some((b'H', raw)) => {
            head(raw, false);
            chunked_arbitrary(raw, 3);
        }
        _ => {
            let Ok(input) = Input::arbitrary_take_rest(Unstructured::new(data)) else {
                return;
            };
            head(&input.raw, input.head_request);
            chunked_arbitrary(&input.raw, input.step as usize);
            chunked_round_trip(&input);
        }
    }
});

fn head(raw: &[u8], head_request: bool) {
    let Ok(Some(head)) = parse_head(raw, head_request) else {
        return;
    };
    let alone = parse_head(&raw[..head.len], head_request)
        .expect("the head alone parses")
        .expect("the head alone is whole");
    assert_eq!(
        (alone.len, alone.status, alone.framing, alone.keep_alive),
        (head.len, head.status, head.framing, head.keep_alive)
    );
    assert_eq!(alone.headers, head.headers);
    assert!(matches!(
        parse_head(&raw[..head.len - 1], head_request),
        Ok(None)
    ));
    // What the machine said, as httparse reads it.
    let mut slots = [httparse_empty(); 128];
    let mut parsed = httparse::Response::new(&mut slots);
    parsed
        .parse(raw)
        .expect("httparse agrees the head is whole");
    let has = |name: &str| {
        parsed
            .headers
            .iter()
            .any(|h| h.name.eq_ignore_ascii_case(name))
    };
    let chunked = has("transfer-encoding");
    let bodiless = head_request
        || head.status.is_informational()
        || head.status.as_u16() == 204
        || head.status.as_u16() == 304;
    match head.framing {
        _ if bodiless => assert_eq!(head.framing, Framing::Length(0)),
        Framing::Chunked(_) => assert!(chunked),
        Framing::Length(n) => {
            assert!(!chunked, "a length with a transfer coding");
            let given = head.headers.get(http::header::CONTENT_LENGTH);
            let given = given.and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
            assert_eq!(given, Some(n));
        }
        Framing::Close => {
            assert!(!chunked && !has("content-length"));
            assert!(
                !head.keep_alive,
                "a body up to close leaves a connection to keep"
            );
        }
    }
    if chunked && has("content-length") && !bodiless {
        assert!(!head.keep_alive, "an answer with both framings is not kept");
    }
    for hop in [
        "connection",
        "transfer-encoding",
        "keep-alive",
        "upgrade",
        "te",
        "trailer",
    ] {
        assert!(!head.headers.contains_key(hop), "{hop} passed on");
    }
}

fn httparse_empty() -> httparse::Header<'static> {
    httparse::EMPTY_HEADER
}

fn chunked_arbitrary(raw: &[u8], step: usize) {
    let whole = decode_chunked_body(raw, raw.len().max(1));
    for step in [1, step.max(1)] {
        assert_eq!(
            decode_chunked_body(raw, step),
            whole,
            "split every {step} bytes"
        );
    }
    if let Ok((data, used)) = whole {
        assert!(used <= raw.len() && data.len() <= used);
    }
}

fn chunked_round_trip(input: &Input) {
    let mut wire = Vec::new();
    let mut body = Vec::new();
    for (chunk, ext) in input.chunks.iter().filter(|(c, _)| !c.is_empty()) {
        let size = if input.uppercase_sizes {
            format!("{:X}", chunk.len())
        } else {
            format!("{:x}", chunk.len())
        };
        wire.extend_from_slice(size.as_bytes());
        if *ext {
            wire.extend_from_slice(b";name=\"v\"");
        }
        wire.extend_from_slice(b"\r\n");
        wire.extend_from_slice(chunk);
        wire.extend_from_slice(b"\r\n");
        body.extend_from_slice(chunk);
    }
    wire.extend_from_slice(b"0\r\n");
    for (n, v) in &input.trailers {
        wire.extend_from_slice(format!("x-t{n}: {v}\r\n").as_bytes());
    }
    wire.extend_from_slice(b"\r\n");
    let len = wire.len();
    wire.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
    let decoded = decode_chunked_body(&wire, input.step as usize + 1);
    assert_eq!(
        decoded,
        Ok((body, len)),
        "a body sent chunked decodes to itself"
    );
}
