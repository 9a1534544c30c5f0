//! Pre-auth connection exhaustion (issue 31, item 3): a stranger opening far more idle
//! connections to the API port than the agent may hold does not take the host down. The
//! agent runs with a small open-file limit (1024: its API and host listener hold at most
//! 512 connections), the test opens 1,500 idle ones, and then an authenticated request on
//! a new connection and a request through the edge proxy are still answered, the oldest
//! idle connections having been closed to make room; and a request head left half-sent is
//! closed once the head timeout (here 5 s) has passed.

use crate::proxy;

use proxy::Cluster;
use serde_json::json;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const OPEN_FILES: u64 = 1024;
const FLOOD: usize = 1500;
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);

/// This test process may open the flood's sockets (its soft limit raised to its hard one).
fn raise_own_open_files() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write the struct given, nothing else.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        limit.rlim_cur = limit.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
    }
    assert!(
        limit.rlim_cur > FLOOD as u64 + 200,
        "the test needs {FLOOD} sockets"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_cannot_starve_authenticated_callers_or_the_proxy() {
    raise_own_open_files();
    let cluster = Cluster::start_with(1, |_, o| {
        o.open_files = Some(OPEN_FILES);
        o.extra_args.extend([
            "--request-head-timeout-ms".to_string(),
            HEAD_TIMEOUT.as_millis().to_string(),
        ]);
    });
    let agent = &cluster.agents[0];
    cluster.create_app("flood").await;
    cluster.create_machine("flood", json!({}), json!({})).await;
    let api = agent.url().trim_start_matches("http://").to_string();

    // The flood: idle connections that never send a byte.
    let flood_start = Instant::now();
    let mut idle = Vec::with_capacity(FLOOD);
    for _ in 0..FLOOD {
        idle.push(TcpStream::connect(&api).await.expect("connect"));
    }

    // An authenticated caller on a new connection, and a request through the proxy.
    let fly = bazaar_testkit::Fly::new(agent);
    let (status, apps) = fly.call(reqwest::Method::GET, "/apps", None).await;
    assert_eq!(status, 200, "{apps}");
    let (status, _, body) = cluster.get(0, "flood", "/", &[]).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        flood_start.elapsed() < HEAD_TIMEOUT,
        "inconclusive: the flood's connections timed out before the requests were made"
    );

    // The agent made room by closing the oldest idle connections: at most half its open
    // files are held by its listeners.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let open = idle
        .iter()
        .filter(|s| {
            let mut b = [0u8; 1];
            matches!(s.try_read(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
        })
        .count();
    assert!(open <= (OPEN_FILES / 2) as usize, "{open} still open");
    assert!(open > 0, "the newest idle connections are kept");
    drop(idle);
    let log = std::fs::read_to_string(agent.data_dir.join("agent.log")).unwrap();
    assert!(!log.contains("Too many open files"), "{}", agent.log_tail());

    // A head left half-sent is closed once the head timeout has passed, not before.
    let mut slow = TcpStream::connect(&api).await.unwrap();
    slow.write_all(b"GET /v1/apps HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let sent = Instant::now();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(HEAD_TIMEOUT * 3, slow.read_to_end(&mut rest)).await;
    let waited = sent.elapsed();
    assert!(read.is_ok(), "the half-sent head was never closed");
    assert!(
        waited >= HEAD_TIMEOUT - Duration::from_millis(500),
        "closed after {waited:?}, before the head timeout"
    );
}
