//! The edge proxy on a 3-agent loopback cluster with real HTTP backends: routing by Host,
//! forwarded headers and request ids, `fly-force-instance-id`, load spread over every
//! machine, hard limits under concurrent load, the bounded wait and its 503, unknown apps,
//! malformed and oversized requests, slow clients, and `/metrics`.

use crate::proxy;

use proxy::*;
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn routes_spreads_and_never_exceeds_the_hard_limit() {
    let c = Cluster::start(3, &["--proxy-queue-timeout-ms", "10000"]);
    c.create_app("web").await;
    let svc = json!({"concurrency": {"type": "requests", "soft_limit": 2, "hard_limit": 3}});
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(
            c.create_machine("web", svc.clone(), json!({"LIMIT": "3"}))
                .await,
        );
    }
    // Every proxy routes, whichever host the machines are on.
    for i in 0..3 {
        c.wait_routable(i, "web").await;
    }

    // Headers: X-Forwarded-For/Proto and a request id reach the machine and the client.
    let (s, h, body) = c.get(0, "web", "/hello", &[]).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["headers"]["x-forwarded-for"], "127.0.0.1");
    assert_eq!(v["headers"]["x-forwarded-proto"], "http");
    assert_eq!(v["headers"]["host"], "web.localhost");
    let rid = h
        .get("fly-request-id")
        .expect("request id")
        .to_str()
        .unwrap();
    assert_eq!(v["headers"]["fly-request-id"], rid);
    assert!(
        v["headers"].get("bazaar-proxy-hop").is_none(),
        "hop secret leaked: {v}"
    );

    // fly-force-instance-id pins the machine, through any proxy (once that proxy's catalog
    // has the machine: `wait_routable` only waited for one of them).
    for id in &ids {
        for i in 0..3 {
            let pinned = [("fly-force-instance-id", id.as_str())];
            let body = bazaar_testkit::eventually(Duration::from_secs(10), || async {
                let (s, _, body) = c.get(i, "web", "/", &pinned).await;
                (s == StatusCode::OK).then_some(body)
            })
            .await
            .unwrap_or_else(|_| panic!("machine {id} never reached through proxy {i}"));
            assert_eq!(&machine_of(&body), id);
        }
    }
    let (s, _, body) = c
        .get(0, "web", "/", &[("fly-force-instance-id", "nope")])
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{body}");

    // 36 concurrent slow requests through one proxy: 3 machines × hard limit 3 = 9 at a
    // time; the rest wait. Every machine serves, none ever sees more than 3 at once.
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..36 {
        let c2 = c.http.clone();
        let url = format!("{}/?sleep=150", c.agents[0].proxy_url());
        tasks.push(tokio::spawn(async move {
            let r = c2
                .get(url)
                .header("host", "web.localhost")
                .send()
                .await
                .unwrap();
            (r.status(), r.text().await.unwrap())
        }));
    }
    let mut per_machine: HashMap<String, u32> = HashMap::new();
    for t in tasks {
        let (s, body) = t.await.unwrap();
        assert_eq!(s, StatusCode::OK, "{body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        assert!(v["max"].as_u64().unwrap() <= 3, "hard limit exceeded: {v}");
        *per_machine.entry(machine_of(&body)).or_default() += 1;
    }
    assert_eq!(
        per_machine.len(),
        3,
        "every machine serves: {per_machine:?}"
    );
    // 36 requests of 150 ms, 9 at a time: at least 4 rounds.
    assert!(started.elapsed() >= Duration::from_millis(550));

    // Requests through all three proxies at once: still never above the hard limit
    // (each host's proxy admits requests for its own machines).
    let mut tasks = Vec::new();
    for k in 0..30 {
        let c2 = c.http.clone();
        let url = format!("{}/?sleep=100", c.agents[k % 3].proxy_url());
        tasks.push(tokio::spawn(async move {
            let r = c2
                .get(url)
                .header("host", "web.localhost")
                .send()
                .await
                .unwrap();
            (r.status(), r.text().await.unwrap())
        }));
    }
    for t in tasks {
        let (s, body) = t.await.unwrap();
        assert_eq!(s, StatusCode::OK, "{body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        assert!(v["max"].as_u64().unwrap() <= 3, "hard limit exceeded: {v}");
    }

    let m = c.metrics(0).await;
    assert!(
        m.contains("bazaar_proxy_requests_total{app=\"web\",status=\"200\"}"),
        "{m}"
    );
    // Without a token the metrics (app names, traffic) are not shown.
    for token in [None, Some("not-a-token")] {
        let mut req = c.http.get(format!("{}/metrics", c.agents[0].url()));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        let body = r.text().await.unwrap();
        assert!(
            body.contains("\"error\"") && !body.contains("web"),
            "{body}"
        );
    }
    assert!(
        m.contains("bazaar_proxy_request_duration_seconds_bucket"),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_app_answers_503_after_a_bounded_wait() {
    let c = Cluster::start(1, &["--proxy-queue-timeout-ms", "800"]);
    c.create_app("slow").await;
    let svc = json!({"concurrency": {"type": "requests", "soft_limit": 1, "hard_limit": 1}});
    c.create_machine("slow", svc, json!({"LIMIT": "1"})).await;
    c.wait_routable(0, "slow").await;
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let c2 = c.http.clone();
        let url = format!("{}/?sleep=3000", c.agents[0].proxy_url());
        tasks.push(tokio::spawn(async move {
            let t0 = Instant::now();
            let r = c2
                .get(url)
                .header("host", "slow.localhost")
                .send()
                .await
                .unwrap();
            (r.status(), t0.elapsed(), r.text().await.unwrap())
        }));
    }
    let mut ok = 0;
    for t in tasks {
        let (s, elapsed, body) = t.await.unwrap();
        if s == StatusCode::OK {
            ok += 1;
        } else {
            assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{body}");
            assert!(body.contains("could take the request within"), "{body}");
            assert!(elapsed < Duration::from_millis(2500), "{elapsed:?}");
        }
    }
    assert_eq!(ok, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_answered_without_hurting_other_clients() {
    let c = Cluster::start(1, &[]);
    c.create_app("web").await;
    c.create_machine("web", json!({}), json!({})).await;
    c.wait_routable(0, "web").await;

    // Unknown app, and a host outside the domain.
    let (s, _, body) = c.get(0, "nope", "/", &[]).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert!(body.contains("no app named \"nope\""), "{body}");
    let r = c
        .http
        .get(format!("{}/", c.agents[0].proxy_url()))
        .header("host", "example.com")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);

    let addr = c.agents[0].proxy_addr();
    // Slow clients: 50 connections that send half a request head and stall.
    let mut slow = Vec::new();
    for _ in 0..50 {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: web.localhost\r\nX-Slow: ")
            .unwrap();
        slow.push(s);
    }
    // Malformed request line.
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GARBAGE\x01\x02 / NOT-HTTP\r\n\r\n").unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    assert!(out.is_empty() || out.starts_with("HTTP/1.1 400"), "{out}");
    // A huge header block.
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let big = "x".repeat(200 * 1024);
    let _ = s.write_all(
        format!("GET / HTTP/1.1\r\nHost: web.localhost\r\nX-Big: {big}\r\n\r\n").as_bytes(),
    );
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    assert!(
        out.is_empty() || out.starts_with("HTTP/1.1 431") || out.starts_with("HTTP/1.1 400"),
        "{}",
        &out[..out.len().min(200)]
    );
    // Meanwhile others are served promptly.
    for _ in 0..20 {
        let t0 = Instant::now();
        let (s, _, body) = c.get(0, "web", "/", &[]).await;
        assert_eq!(s, StatusCode::OK, "{body}");
        assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    }
    // HTTP/2 (prior knowledge) works too, with the app in :authority.
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .resolve("web.localhost", addr)
        .build()
        .unwrap();
    let r = h2
        .get(format!("http://web.localhost:{}/h2", addr.port()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.version(), reqwest::Version::HTTP_2);
    // The stalled clients are let go once their head is overdue (10 s): each gets a 408 or
    // a closed connection, not a connection held open for ever.
    let stalled = slow.pop().unwrap();
    let waited = Instant::now();
    let closed = tokio::task::spawn_blocking(move || {
        let mut stalled = stalled;
        stalled
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut out = Vec::new();
        stalled.read_to_end(&mut out).map(|_| out)
    })
    .await
    .unwrap();
    let out = closed.expect("the proxy closes a stalled connection (no read timeout)");
    assert!(
        out.is_empty() || out.starts_with(b"HTTP/1.1 408"),
        "{}",
        String::from_utf8_lossy(&out)
    );
    assert!(
        waited.elapsed() < Duration::from_secs(13),
        "{:?}",
        waited.elapsed()
    );
    drop(slow);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_tcp_services_are_proxied() {
    let c = Cluster::start(1, &[]);
    c.create_app("raw").await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let id = c
        .create_machine("raw", json!({"ports": [{"port": port}]}), json!({}))
        .await;
    let body = bazaar_testkit::eventually(Duration::from_secs(10), || async {
        raw_http_get(std::net::Ipv4Addr::LOCALHOST.into(), port)
    })
    .await
    .expect("the TCP port answers");
    assert!(body.contains(&id), "{body}");
    // No X-Forwarded-For on raw TCP: the bytes pass through untouched.
    assert!(!body.contains("x-forwarded-for"), "{body}");
    let m = c.metrics(0).await;
    assert!(
        m.contains("bazaar_proxy_tcp_connections_total{app=\"raw\"}"),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_tcp_to_another_hosts_machine_goes_through_that_hosts_proxy() {
    // Two hosts whose proxies listen on their own addresses, as two servers would.
    let c = Cluster::start_with(2, |i, o| {
        o.proxy_ip = std::net::Ipv4Addr::new(127, 0, 0, 2 + i as u8);
    });
    c.create_app("rawhop").await;
    let port = std::net::TcpListener::bind("127.0.0.2:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let id = c
        .create_machine("rawhop", json!({"ports": [{"port": port}]}), json!({}))
        .await;
    let owner_id = c.machine("rawhop", &id).await["host_id"]
        .as_str()
        .unwrap()
        .to_string();
    let mut owner = 0;
    for (i, a) in c.agents.iter().enumerate() {
        if a.client().info().await.unwrap().id == owner_id {
            owner = i;
        }
    }
    let entry = 1 - owner;
    let entry_ip = c.agents[entry].proxy_addr().ip();
    let body = bazaar_testkit::eventually(Duration::from_secs(10), || async {
        raw_http_get(entry_ip, port)
    })
    .await
    .expect("the TCP port of the host without the machine answers");
    assert!(body.contains(&id), "{body}");
    // The bytes went through the owner's proxy: it delivered the connection, the entry
    // proxy did not dial the machine itself.
    let delivered = "bazaar_proxy_tcp_connections_total{app=\"rawhop\"}";
    let owner_metrics = c.metrics(owner).await;
    assert!(owner_metrics.contains(delivered), "{owner_metrics}");
    let entry_metrics = c.metrics(entry).await;
    assert!(!entry_metrics.contains(delivered), "{entry_metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machines_traffic_counts_what_it_serves_through_any_proxy() {
    let c = Cluster::start(2, &[]);
    c.create_app("busy").await;
    let id = c.create_machine("busy", json!({}), json!({})).await;
    for i in 0..2 {
        c.wait_routable(i, "busy").await;
    }
    let path = format!("/apps/busy/machines/{id}/traffic");
    let traffic = || async {
        let (s, v) = c.api(reqwest::Method::GET, &path, None).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        v
    };
    assert_eq!(traffic().await["in_flight"], 0);
    // Two slow requests, one through each proxy: the owner's proxy counts both.
    let slow = |i: usize| {
        let (http, url) = (c.http.clone(), c.agents[i].proxy_url());
        tokio::spawn(async move {
            http.get(format!("{url}/?sleep=1500"))
                .header("host", "busy.localhost")
                .send()
                .await
                .map(|r| r.status())
        })
    };
    let requests = [slow(0), slow(1)];
    bazaar_testkit::eventually(Duration::from_secs(5), || async {
        (traffic().await["in_flight"] == 2).then_some(())
    })
    .await
    .expect("both requests counted while they are served");
    for r in requests {
        assert_eq!(r.await.unwrap().unwrap(), StatusCode::OK);
    }
    // The owner's count drops as its proxy finishes the response, a moment after the client
    // (behind the other proxy's hop) has it.
    let after = bazaar_testkit::eventually(Duration::from_secs(2), || async {
        let t = traffic().await;
        (t["in_flight"] == 0).then_some(t)
    })
    .await
    .expect("nothing in flight once both are answered");
    assert!(after["last_request_at"].is_string(), "{after}");
    let (s, _) = c
        .api(
            reqwest::Method::GET,
            "/apps/busy/machines/m_nonexistent/traffic",
            None,
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

/// Opens a WebSocket to `/ws` of `app` through the proxy at `addr` and checks the
/// handshake; returns the stream (after the 101 head) and the machine id the backend sent.
fn open_websocket(addr: std::net::SocketAddr, app: &str) -> (std::net::TcpStream, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let key = "dGhlIHNhbXBsZSBub25jZQ==";
    write!(
        s,
        "GET /ws HTTP/1.1\r\nHost: {app}.localhost\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {key}\r\n\r\n"
    )
    .unwrap();
    // The head, then the machine id line the backend sends first.
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !String::from_utf8_lossy(&buf).contains("\r\n\r\n") {
        assert_eq!(s.read(&mut byte).unwrap(), 1, "closed during the handshake");
        buf.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&buf).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("upgrade: websocket"), "{head}");
    // RFC 6455's example key and its accept value: the machine's handshake came through.
    assert!(
        head.contains("sec-websocket-accept: s3pplmbitxaq9kygzzhzrbk+xoo="),
        "{head}"
    );
    let mut line = Vec::new();
    while line.last() != Some(&b'\n') {
        assert_eq!(s.read(&mut byte).unwrap(), 1, "closed before the greeting");
        line.push(byte[0]);
    }
    let id = String::from_utf8_lossy(&line).trim().to_string();
    (s, id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websockets_are_spliced_through_local_and_remote_proxies() {
    let c = Cluster::start(2, &[]);
    c.create_app("chat").await;
    let svc = json!({"concurrency": {"type": "connections", "soft_limit": 5, "hard_limit": 5}});
    let id = c.create_machine("chat", svc, json!({})).await;
    for i in 0..2 {
        c.wait_routable(i, "chat").await;
    }
    for i in 0..2 {
        let addr = c.agents[i].proxy_addr();
        let (mut s, greeted_by) = tokio::task::spawn_blocking(move || open_websocket(addr, "chat"))
            .await
            .unwrap();
        assert_eq!(greeted_by, id);
        // Bytes flow both ways, unchanged, several times on the same connection.
        for n in 0..3 {
            let msg = format!("frame {n} via proxy {i}\n");
            s.write_all(msg.as_bytes()).unwrap();
            let mut back = vec![0u8; msg.len()];
            s.read_exact(&mut back).unwrap();
            assert_eq!(String::from_utf8_lossy(&back), msg);
        }
        // An open WebSocket counts as a connection in flight on the machine's owner.
        let gauge = "bazaar_proxy_in_flight{app=\"chat\"} 1";
        let mut counted = false;
        for j in 0..2 {
            counted |= c.metrics(j).await.contains(gauge);
        }
        assert!(counted, "no proxy counts the open WebSocket");
        drop(s);
    }
    // Closed WebSockets end their in-flight count.
    bazaar_testkit::eventually(Duration::from_secs(5), || async {
        let mut total = 0;
        for j in 0..2 {
            total += c
                .metrics(j)
                .await
                .matches("bazaar_proxy_in_flight{app=\"chat\"} 1")
                .count();
        }
        (total == 0).then_some(())
    })
    .await
    .expect("in-flight count returns to zero");
}

/// A GET over a plain TCP connection to `ip:port`; the whole answer if it is a 200.
fn raw_http_get(ip: std::net::IpAddr, port: u16) -> Option<String> {
    let mut s = std::net::TcpStream::connect((ip, port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"GET /raw HTTP/1.1\r\nHost: whatever\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.starts_with("HTTP/1.1 200").then_some(out)
}
