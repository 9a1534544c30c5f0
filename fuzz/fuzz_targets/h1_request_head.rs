//! The proxy's HTTP/1.1 request head reader (`bazaar_proxy::read_request_head`, the fast
//! path's `inspect` and `build_parts`) against hyper's server: a head the proxy serves
//! itself is read by hyper the same way (method, target, version, headers, body length),
//! ends where the proxy says, and reads the same with anything after it.
#![no_main]

use bazaar_proxy::{read_request_head, RequestHead};
use libfuzzer_sys::fuzz_target;

#[path = "../../crates/proxy/tests/support/hyper_reference.rs"]
mod hyper_reference;

fuzz_target!(|input: &[u8]| {
    let Ok(RequestHead::Served {
        parts,
        head_len,
        content_length,
        keep_alive,
    }) = read_request_head(input)
    else {
        return;
    };
    let theirs = hyper_reference::hyper_reads(input)
        .unwrap_or_else(|| panic!("the proxy serves a head hyper refuses"));
    assert_eq!(parts.method, theirs.method);
    assert_eq!(parts.uri, theirs.uri);
    assert_eq!(parts.version, theirs.version);
    assert_eq!(
        hyper_reference::without_length(&parts.headers),
        hyper_reference::without_length(&theirs.headers)
    );
    if (input.len() - head_len) as u64 >= content_length {
        assert_eq!(theirs.body_len, Some(content_length as usize));
    }
    assert!(matches!(
        read_request_head(&input[..head_len - 1]),
        Ok(RequestHead::Partial)
    ));
    match read_request_head(&input[..head_len]) {
        Ok(RequestHead::Served {
            parts: again,
            head_len: len,
            content_length: cl,
            keep_alive: ka,
        }) => {
            assert_eq!((len, cl, ka), (head_len, content_length, keep_alive));
            assert_eq!(again.headers, parts.headers);
        }
        other => panic!("the head alone reads differently: {other:?}"),
    }
});
