//! The agent's and the catalog's metrics at `GET /metrics` (docs/METRICS.md): a create and
//! a stop through the host interface move the operation, step and commit counters and the
//! machines-by-state gauge, the catalog counts the machine's row, its live peer and their gossip, and the
//! whole text stays one OpenMetrics document (one `# EOF`, last).

use crate::common;

use bazaar_testkit::TEST_SECRET;
use bazaar_types::host::StopRequest;
use bazaar_types::state::MachineState;
use common::*;
use reqwest::StatusCode;

/// Scrapes `/metrics` as Prometheus would (the cluster secret as bearer token).
async fn scrape(agent: &bazaar_testkit::TestAgent) -> String {
    let r = reqwest::Client::new()
        .get(format!("{}/metrics", agent.url()))
        .bearer_auth(TEST_SECRET)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    r.text().await.unwrap()
}

/// The value of the sample written exactly `sample` (name and labels), 0 when absent.
fn value(text: &str, sample: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' '))
        .map(|v| v.parse().unwrap())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_and_a_stop_move_the_agent_and_catalog_metrics() {
    // Two hosts, so the catalog has a peer to see alive and gossip with.
    let agents = bazaar_testkit::start_cluster(std::path::Path::new(EXE), 2, |_, _| {}).unwrap();
    let agent = &agents[0];
    let c = agent.client();
    let before = scrape(agent).await;

    let m = c
        .create(&bazaar_testkit::create_request("web", &["sleep", "1000"]))
        .await
        .unwrap();
    wait_state(&c, &m.id, MachineState::Started).await;
    c.stop(&m.id, &StopRequest::default()).await.unwrap();
    wait_state(&c, &m.id, MachineState::Stopped).await;
    let after = scrape(agent).await;

    let moved = |sample: &str| value(&after, sample) - value(&before, sample);
    let ops = "bazaar_agent_operations_total";
    assert_eq!(
        moved(&format!("{ops}{{kind=\"create\",outcome=\"completed\"}}")),
        1.0,
        "{after}"
    );
    assert_eq!(
        moved(&format!("{ops}{{kind=\"stop\",outcome=\"completed\"}}")),
        1.0
    );
    assert_eq!(
        moved(&format!("{ops}{{kind=\"create\",outcome=\"aborted\"}}")),
        0.0
    );
    let steps = "bazaar_agent_steps_total";
    for step in ["launch", "signal", "await_exit"] {
        assert_eq!(
            moved(&format!("{steps}{{step=\"{step}\",outcome=\"completed\"}}")),
            1.0,
            "{step}: {after}"
        );
    }
    assert_eq!(
        moved("bazaar_agent_step_duration_seconds_count{step=\"launch\"}"),
        1.0
    );
    assert!(
        value(
            &after,
            "bazaar_agent_step_duration_seconds_sum{step=\"launch\"}"
        ) > 0.0
    );
    // Accept, launch, signal, await exit: each one durable transaction at least.
    assert!(
        moved("bazaar_agent_store_commit_duration_seconds_count") >= 4.0,
        "{after}"
    );
    assert_eq!(
        value(
            &after,
            "bazaar_agent_store_commit_duration_seconds_bucket{le=\"+Inf\"}"
        ),
        value(&after, "bazaar_agent_store_commit_duration_seconds_count")
    );
    assert_eq!(
        value(&after, "bazaar_agent_machines{state=\"stopped\"}"),
        1.0
    );
    assert_eq!(
        value(&after, "bazaar_agent_machines{state=\"started\"}"),
        0.0
    );

    assert_eq!(
        value(&after, "bazaar_catalog_rows{kind=\"machine\"}"),
        1.0,
        "{after}"
    );
    assert!(value(&after, "bazaar_catalog_rows{kind=\"host\"}") >= 1.0);
    assert!(
        value(&after, "bazaar_catalog_hosts{status=\"alive\"}") >= 1.0,
        "{after}"
    );
    assert!(moved("bazaar_catalog_gossip_datagrams_total{direction=\"in\"}") > 0.0);
    assert!(moved("bazaar_catalog_gossip_datagrams_total{direction=\"out\"}") > 0.0);
    assert_eq!(value(&after, "bazaar_catalog_hosts{status=\"dead\"}"), 0.0);
    assert!(after.contains("# TYPE bazaar_agent_operations counter"));
    assert!(after.contains("# TYPE bazaar_agent_step_duration_seconds histogram"));
    // One OpenMetrics document with the proxy's families (none before any traffic): a
    // single `# EOF`, last.
    assert_eq!(after.matches("# EOF").count(), 1, "{after}");
    assert!(after.ends_with("# EOF\n"));
}

/// Fly's `config.metrics`: the agent scrapes a started machine's own page (a real machine
/// serving it with busybox httpd) and serves its samples with the machine's `app` and
/// `machine` labels; a stopped machine's are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machines_metrics_page_is_scraped_and_served_with_its_app_and_id() {
    let agent = agent();
    let c = agent.client();
    let port = bazaar_testkit::free_port(std::net::Ipv4Addr::LOCALHOST);
    let script = format!(
        "mkdir -p www && printf 'app_requests_total{{path=\"/\"}} 7\\napp_temp{{machine=\"x\"}} 21.5\\nbazaar_agent_machines 99\\n' > www/metrics && exec /usr/bin/busybox httpd -f -p {port} -h www"
    );
    let mut req = bazaar_testkit::create_request("mx", &["sh", "-c", &script]);
    req.config.metrics = Some(bazaar_types::config::MetricsConfig {
        port,
        path: "/metrics".into(),
        https: false,
    });
    let m = c.create(&req).await.unwrap();
    wait_state(&c, &m.id, MachineState::Started).await;

    let labels = format!("app=\"mx\",machine=\"{}\"", m.id);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let text = loop {
        let text = scrape(&agent).await;
        if value(&text, &format!("bazaar_machine_metrics_up{{{labels}}}")) == 1.0 {
            break text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never scraped: {text}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    };
    assert_eq!(
        value(&text, &format!("app_requests_total{{{labels},path=\"/\"}}")),
        7.0,
        "{text}"
    );
    // Its own `machine` label is kept apart; bazaar's own families are not its to write.
    assert_eq!(
        value(
            &text,
            &format!("app_temp{{{labels},exported_machine=\"x\"}}")
        ),
        21.5,
        "{text}"
    );
    assert!(!text.contains("bazaar_agent_machines 99"), "{text}");
    assert_eq!(text.matches("# EOF").count(), 1, "{text}");
    assert!(text.ends_with("# EOF\n"));

    c.stop(&m.id, &StopRequest::default()).await.unwrap();
    wait_state(&c, &m.id, MachineState::Stopped).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while scrape(&agent).await.contains(&m.id) {
        assert!(
            std::time::Instant::now() < deadline,
            "a stopped machine's samples stay"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}
