//! API tokens on a 2-agent loopback cluster, each agent with its own token file: a token
//! revoked with `bazaar token revoke` is refused at once by the agent whose file changed,
//! and within moments by every other agent (the revocation travels in the catalog as a
//! hash), while other tokens keep working.

use crate::common;

use common::EXE;
use reqwest::StatusCode;
use std::time::{Duration, Instant};

/// The status of an authenticated call to agent `url` with `token`.
async fn status_with(http: &reqwest::Client, url: &str, token: &str) -> StatusCode {
    http.get(format!("{url}/v1/apps/no-such-app"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_token_is_refused_at_once_here_and_soon_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<_> = (0..2)
        .map(|i| dir.path().join(format!("tokens-{i}")))
        .collect();
    let (doomed, kept) = (
        "doomed-token-0123456789abcdef",
        "kept-token-0123456789abcdef",
    );
    for f in &files {
        std::fs::write(f, format!("{doomed}\n{kept}\n")).unwrap();
    }
    let agents = bazaar_testkit::start_cluster(std::path::Path::new(EXE), 2, |i, o| {
        o.extra_args.push("--token-file".into());
        o.extra_args.push(files[i].display().to_string());
    })
    .expect("cluster starts");
    let http = reqwest::Client::new();
    for a in &agents {
        assert_eq!(
            status_with(&http, &a.url(), doomed).await,
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            status_with(&http, &a.url(), "never-issued").await,
            StatusCode::UNAUTHORIZED
        );
    }

    let out = std::process::Command::new(EXE)
        .args(["token", "revoke", doomed, "--token-file"])
        .arg(&files[0])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = std::fs::read_to_string(&files[0]).unwrap();
    assert!(
        !text.contains(doomed),
        "the token itself is not kept: {text}"
    );

    // At once on the agent whose file changed, without any other request first.
    assert_eq!(
        status_with(&http, &agents[0].url(), doomed).await,
        StatusCode::UNAUTHORIZED
    );
    // Soon on the other agent, whose own file still lists the token.
    let started = Instant::now();
    loop {
        match status_with(&http, &agents[1].url(), doomed).await {
            StatusCode::UNAUTHORIZED => break,
            s => assert_eq!(s, StatusCode::NOT_FOUND),
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "agent 1 still accepts the revoked token"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "revocation reached the other agent in {:?}",
        started.elapsed()
    );
    for a in &agents {
        assert_eq!(
            status_with(&http, &a.url(), kept).await,
            StatusCode::NOT_FOUND
        );
    }
}
