//! A host-interface call whose caller hangs up mid-way (an API node that crashed, a client
//! that timed out) still finishes: a create cut after its durable write is launched and
//! published, not left recorded but never launched and missing from every catalog until
//! the agent restarts (found by the fault suite, `crash`).

mod common;

use bazaar_testkit::TEST_SECRET;
use serde_json::Value;
use std::io::Write;
use std::time::Duration;

async fn get(agent: &bazaar_testkit::TestAgent, path: &str) -> Vec<Value> {
    reqwest::Client::new()
        .get(format!("{}{path}", agent.url()))
        .bearer_auth(TEST_SECRET)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_whose_caller_hangs_up_are_still_launched_and_published() {
    let agent = common::agent();
    let body =
        serde_json::to_string(&bazaar_testkit::create_request("cut", &["sleep", "1000"])).unwrap();
    let addr: std::net::SocketAddr = agent.url().trim_start_matches("http://").parse().unwrap();
    for _ in 0..40 {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        write!(
            s,
            "POST /host/v1/machines HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TEST_SECRET}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        // Hang up as soon as the request is out, without waiting for the answer.
        drop(s);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let settled = bazaar_testkit::eventually(Duration::from_secs(30), || async {
        let held = get(&agent, "/host/v1/machines?app=cut").await;
        let listed = get(&agent, "/v1/catalog/machines?app=cut").await;
        let all_started = held.iter().all(|m| m["state"] == "started");
        (!held.is_empty() && all_started && listed.len() == held.len()).then_some(held.len())
    })
    .await;
    let held = get(&agent, "/host/v1/machines?app=cut").await;
    let listed = get(&agent, "/v1/catalog/machines?app=cut").await;
    let states: Vec<&Value> = held.iter().map(|m| &m["state"]).collect();
    assert!(
        settled.is_ok(),
        "{} machines recorded ({states:?}), {} in the catalog",
        held.len(),
        listed.len()
    );
}
