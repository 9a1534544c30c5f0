//! The typed Machines API client against a scripted HTTP server on loopback: what it sends
//! (path, token, lease nonce, body) and how it reads answers (typed bodies, Fly-shaped
//! errors with their status).

use bazaar_client::fly::{status_of, ApiError, FlyClient, LeaseRequest};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// One request as the server read it: its head (request line and headers, lowercased
/// names) and body.
struct Seen {
    head: String,
    body: String,
}

/// Serves one connection: answers `status` with `body`, hands back what it read.
async fn serve_once(
    status: &'static str,
    body: &'static str,
) -> (String, tokio::task::JoinHandle<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        let (head, body_start) = loop {
            let n = sock.read(&mut chunk).await.unwrap();
            assert!(n > 0, "the client closed before a whole request");
            buf.extend_from_slice(&chunk[..n]);
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break (String::from_utf8_lossy(&buf[..end]).to_lowercase(), end + 4);
            }
        };
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map(|v| v.trim().parse().unwrap())
            .unwrap_or(0);
        while buf.len() < body_start + length {
            let n = sock.read(&mut chunk).await.unwrap();
            buf.extend_from_slice(&chunk[..n]);
        }
        let answer = format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        sock.write_all(answer.as_bytes()).await.unwrap();
        Seen {
            head,
            body: String::from_utf8_lossy(&buf[body_start..]).into_owned(),
        }
    });
    (base, task)
}

const MACHINE: &str = r#"[{"id": "m1", "name": "web-1", "state": "started", "region": "ams",
  "instance_id": "v1", "version": "v1", "private_ip": "127.0.0.1",
  "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z",
  "config": {"image": "process", "env": {"A": "1"}, "x_unknown": true},
  "host_status": "ok", "host_id": "h1", "app": "web"}]"#;

#[tokio::test]
async fn answers_decode_into_the_wire_types_and_calls_carry_the_token() {
    let (base, server) = serve_once("200 OK", MACHINE).await;
    let api = FlyClient::new(&base, "tok");
    let machines = api.machines("web").await.expect("a machine list");
    let seen = server.await.unwrap();
    assert!(
        seen.head.starts_with("get /v1/apps/web/machines http/1.1"),
        "{}",
        seen.head
    );
    assert!(
        seen.head.contains("authorization: bearer tok"),
        "{}",
        seen.head
    );
    assert_eq!(machines.len(), 1);
    let m = &machines[0];
    assert_eq!((m.id.as_str(), m.host_id.as_str()), ("m1", "h1"));
    assert_eq!(m.state.as_str(), "started");
    assert_eq!(m.config.env.get("A").map(String::as_str), Some("1"));
    // Fields the types do not know survive a round trip (the CLI prints them with --json).
    assert_eq!(
        m.config.extra.get("x_unknown"),
        Some(&serde_json::json!(true))
    );
}

#[tokio::test]
async fn an_error_answer_carries_its_status_and_the_servers_message() {
    let (base, server) = serve_once(
        "412 Precondition Failed",
        r#"{"error": "machine m1 is started: stop it first or pass force=true"}"#,
    )
    .await;
    let api = FlyClient::new(&base, "tok");
    let err = api
        .destroy_machine("web", "m1", false, None)
        .await
        .expect_err("a 412");
    let seen = server.await.unwrap();
    assert!(
        seen.head
            .starts_with("delete /v1/apps/web/machines/m1?force=false "),
        "{}",
        seen.head
    );
    assert_eq!(err.status(), Some(412));
    assert_eq!(
        err.to_string(),
        "machine m1 is started: stop it first or pass force=true (412)"
    );
    match &err {
        ApiError::Status { message, code, .. } => {
            assert!(message.starts_with("machine m1 is started"));
            assert_eq!(code, &None);
        }
        other => panic!("{other:?}"),
    }
    // Found again under added context, as deploys look for it.
    let wrapped = anyhow::Error::from(err).context("destroying m1");
    assert_eq!(status_of(wrapped.as_ref()), Some(412));
}

#[tokio::test]
async fn a_leased_call_sends_the_nonce_and_its_body() {
    let (base, server) = serve_once(
        "200 OK",
        r#"{"status": "success", "data": {"nonce": "n2", "expires_at": 99, "owner": "me"}}"#,
    )
    .await;
    let api = FlyClient::new(&base, "tok");
    let req = LeaseRequest {
        ttl: Some(13),
        description: Some("deploy".into()),
    };
    let lease = api
        .lease("web", "m1", &req, Some("n1"))
        .await
        .expect("a lease");
    let seen = server.await.unwrap();
    assert!(seen
        .head
        .starts_with("post /v1/apps/web/machines/m1/lease "));
    assert!(
        seen.head.contains("fly-machine-lease-nonce: n1"),
        "{}",
        seen.head
    );
    let body: serde_json::Value = serde_json::from_str(&seen.body).unwrap();
    assert_eq!(
        body,
        serde_json::json!({"ttl": 13, "description": "deploy"})
    );
    assert_eq!(
        (lease.data.nonce.as_str(), lease.data.expires_at),
        ("n2", 99)
    );
}

#[tokio::test]
async fn an_answer_of_the_wrong_shape_is_an_error_not_a_default() {
    let (base, server) = serve_once("200 OK", r#"{"machines": "not a list"}"#).await;
    let api = FlyClient::new(&base, "tok");
    let err = api.machines("web").await.expect_err("not a machine list");
    server.await.unwrap();
    assert!(matches!(err, ApiError::Decode { .. }), "{err:?}");
    assert_eq!(err.status(), None);
}
