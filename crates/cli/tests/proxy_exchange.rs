//! The proxy passes answers of every HTTP/1.1 shape through whole, from a machine of its
//! own host and through another host's proxy: chunked bodies (with extensions and trailers),
//! bodies larger than any buffer, bodies delimited by the connection closing, bodiless
//! answers (204, HEAD), hop-by-hop headers dropped, request bodies small (buffered) and
//! large (streamed), and kept connections the machine closes without saying so.

use crate::proxy;

use proxy::*;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_of_every_shape_pass_through_whole() {
    let c = Cluster::start(2, &[]);
    c.create_app("shapes").await;
    let id = c.create_machine("shapes", json!({}), json!({})).await;
    assert_eq!(c.machine("shapes", &id).await["state"], "started");
    for i in 0..2 {
        c.wait_routable(i, "shapes").await;
    }
    for i in 0..2 {
        let send = |method: Method, path: &str, body: Option<Vec<u8>>| {
            let mut req = c
                .http
                .request(method, format!("{}{path}", c.agents[i].proxy_url()))
                .header("host", "shapes.localhost");
            if let Some(b) = body {
                req = req.body(b);
            }
            async move {
                let resp = req.send().await.expect("an answer");
                let status = resp.status();
                let headers = resp.headers().clone();
                let body = resp.bytes().await.expect("the whole body");
                (status, headers, body)
            }
        };
        let (s, _, body) = send(Method::GET, "/shape/chunked", None).await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(&body[..], b"hello, chunked world", "proxy {i}");

        let n = 3_000_000;
        let (s, h, body) = send(Method::GET, &format!("/shape/big?n={n}"), None).await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(body.len(), n, "proxy {i}: {h:?}");
        assert!(
            body.chunks(10).all(|c| c == &b"0123456789"[..c.len()]),
            "proxy {i}: the big body arrived altered"
        );

        let (s, _, body) = send(Method::GET, "/shape/close", None).await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(&body[..], b"until the connection closes", "proxy {i}");

        let (s, _, body) = send(Method::GET, "/shape/204", None).await;
        assert_eq!(s, StatusCode::NO_CONTENT);
        assert!(body.is_empty());

        let (s, h, body) = send(Method::HEAD, "/", None).await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(
            h["content-length"], "1234",
            "a HEAD answer keeps its length"
        );
        assert!(body.is_empty());

        let (s, h, body) = send(Method::GET, "/shape/hop", None).await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(&body[..], b"ok");
        assert_eq!(h["x-kept"], "1");
        assert!(h.get("x-private").is_none(), "proxy {i}: {h:?}");
        assert!(h.get("keep-alive").is_none(), "proxy {i}: {h:?}");
        assert!(h.get("fly-request-id").is_some(), "proxy {i}: {h:?}");

        // A small body is buffered, a large one streamed: both arrive whole.
        for len in [1_000usize, 200_000] {
            let payload: Vec<u8> = (0..len).map(|k| (k % 251) as u8).collect();
            let want = checksum(&payload);
            let (s, _, body) = send(Method::POST, "/echo", Some(payload)).await;
            assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
            let v: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(v["length"], len, "proxy {i}: {v}");
            assert_eq!(v["checksum"], want, "proxy {i}");
            assert!(v["headers"].get("transfer-encoding").is_none(), "{v}");
            assert!(v["headers"]["x-forwarded-for"].is_string(), "{v}");
        }

        // Clients speaking plain HTTP/1.x over a raw socket.
        let addr = c.agents[i].proxy_addr();
        let host = "Host: shapes.localhost\r\n";
        // Two requests in one write (pipelined), the second closing the connection.
        let out = raw(
            addr,
            &format!("GET / HTTP/1.1\r\n{host}\r\nGET /shape/chunked HTTP/1.1\r\n{host}Connection: close\r\n\r\n"),
            None,
        )
        .await;
        assert_eq!(out.matches("HTTP/1.1 200").count(), 2, "proxy {i}: {out}");
        assert!(
            out.contains("transfer-encoding: chunked") && out.ends_with("\r\n0\r\n\r\n"),
            "proxy {i}: the chunked answer is passed on chunked: {out}"
        );
        // HTTP/1.0: a chunked answer reaches it delimited by the connection closing.
        let out = raw(
            addr,
            &format!("GET /shape/chunked HTTP/1.0\r\n{host}\r\n"),
            None,
        )
        .await;
        assert!(out.starts_with("HTTP/1.1 200"), "proxy {i}: {out}");
        assert!(
            !out.to_ascii_lowercase().contains("transfer-encoding"),
            "{out}"
        );
        assert!(
            out.ends_with("\r\n\r\nhello, chunked world"),
            "proxy {i}: {out}"
        );
        // A chunked request body, and one sent only after `100 Continue`.
        let out = raw(
            addr,
            &format!("POST /echo HTTP/1.1\r\n{host}Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
            None,
        )
        .await;
        assert!(
            out.starts_with("HTTP/1.1 200") && out.contains("\"length\": 5"),
            "proxy {i}: {out}"
        );
        let out = raw(
            addr,
            &format!("POST /echo HTTP/1.1\r\n{host}Content-Length: 5\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n"),
            Some(("100 Continue", "hello")),
        )
        .await;
        assert!(
            out.contains("HTTP/1.1 200") && out.contains("\"length\": 5"),
            "proxy {i}: {out}"
        );

        // The machine closes kept connections after answering: every next request is
        // still served (on a new connection).
        for round in 0..30 {
            let (s, _, body) = send(Method::GET, "/shape/drop", None).await;
            assert_eq!(s, StatusCode::OK, "proxy {i} round {round}");
            assert_eq!(&body[..], b"dropped after this");
            let (s, _, body) = send(Method::GET, "/", None).await;
            assert_eq!(
                s,
                StatusCode::OK,
                "proxy {i} round {round}: {}",
                String::from_utf8_lossy(&body)
            );
        }
    }
}

/// Writes `request` to `addr` (then, once the answer so far contains `then.0`, writes
/// `then.1`) and reads until the proxy closes the connection.
async fn raw(addr: std::net::SocketAddr, request: &str, then: Option<(&str, &str)>) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let read = async {
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        conn.write_all(request.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        let mut then = then;
        loop {
            let n = conn.read(&mut buf).await.unwrap_or(0);
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
            if let Some((seen, more)) = then {
                if String::from_utf8_lossy(&out).contains(seen) {
                    conn.write_all(more.as_bytes()).await.unwrap();
                    then = None;
                }
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), read)
        .await
        .expect("the proxy answers and closes the connection")
}

/// What the backend reports of a body it got: a position-weighted sum (catches lost,
/// repeated and reordered bytes).
fn checksum(data: &[u8]) -> u64 {
    data.iter().enumerate().fold(0u64, |acc, (k, b)| {
        (acc + (k as u64 + 1) * u64::from(*b)) % 1_000_000_007
    })
}
