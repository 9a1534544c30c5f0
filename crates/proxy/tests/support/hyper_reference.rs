//! hyper's HTTP/1.1 server as the reference reader of request heads: what it hands its
//! service for some bytes sent on a connection. Shared by the differential test
//! (`tests/h1_differential.rs`) and the `h1_request_head` fuzz target (`fuzz/`).

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, Uri, Version};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The first request hyper's server read from a connection.
#[derive(Debug)]
pub struct HyperRead {
    pub method: Method,
    pub uri: Uri,
    pub version: Version,
    pub headers: HeaderMap,
    /// Length of its body; `None` when the body could not be read to its end (cut short,
    /// or malformed).
    pub body_len: Option<usize>,
}

thread_local! {
    static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a current-thread runtime");
}

/// Sends `input` on a connection to hyper's HTTP/1.1 server (with the limits the proxy
/// gives it: 100 headers, 64 KiB of head), then closes the sending side: the first request
/// it read, or `None` when it read none (refused or incomplete).
pub fn hyper_reads(input: &[u8]) -> Option<HyperRead> {
    RUNTIME.with(|rt| rt.block_on(read_first(input)))
}

async fn read_first(input: &[u8]) -> Option<HyperRead> {
    let seen: Arc<Mutex<Option<HyperRead>>> = Arc::default();
    let (client, server) = tokio::io::duplex(64 * 1024);
    let service = {
        let seen = seen.clone();
        service_fn(move |req: Request<Incoming>| {
            let seen = seen.clone();
            async move {
                let (parts, body) = req.into_parts();
                let first = seen.lock().unwrap().is_none();
                if first {
                    *seen.lock().unwrap() = Some(HyperRead {
                        method: parts.method,
                        uri: parts.uri,
                        version: parts.version,
                        headers: parts.headers,
                        body_len: None,
                    });
                }
                let body_len = body.collect().await.ok().map(|b| b.to_bytes().len());
                if first {
                    if let Some(read) = seen.lock().unwrap().as_mut() {
                        read.body_len = body_len;
                    }
                }
                Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
            }
        })
    };
    let conn = http1::Builder::new()
        .half_close(true)
        .max_headers(100)
        .max_buf_size(64 * 1024)
        .serve_connection(TokioIo::new(server), service);
    let (mut from_server, mut to_server) = tokio::io::split(client);
    let send = async {
        let _ = to_server.write_all(input).await;
        let _ = to_server.shutdown().await;
    };
    let drain = async {
        let mut answer = Vec::new();
        let _ = from_server.read_to_end(&mut answer).await;
    };
    let _ = tokio::join!(conn, send, drain);
    let read = seen.lock().unwrap().take();
    read
}

/// `headers` without Content-Length, for comparing what the proxy and hyper read: hyper
/// folds repeated equal lengths into one header, the proxy keeps them as sent (and writes
/// its own length upstream); the length itself is compared as the body's length.
pub fn without_length(headers: &HeaderMap) -> HeaderMap {
    let mut headers = headers.clone();
    headers.remove(http::header::CONTENT_LENGTH);
    headers
}
