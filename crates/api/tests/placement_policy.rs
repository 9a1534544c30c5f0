//! `config.placement` (issue 34 item 4, docs/POLICY.md) on an agent in the test's own
//! process, labelled `disk=nvme`: a machine constrained to NVMe hosts is placed there with
//! the host's verdict in its placement record; one that asks for a label no host has is
//! refused at once with 422 naming the constraint; a malformed policy or an unknown key of
//! it is a 400 naming the field; the dry run shows the verdicts. None of the refusals makes
//! a machine.

use axum::http::{Method, StatusCode};
use bazaar_testkit::api_token;
use bazaar_testkit::in_process::{oneshot, InProcessAgent};
use serde_json::{json, Value};

fn create(placement: Value) -> String {
    json!({
        "config": {"driver": "process", "init": {"exec": ["sleep", "100"]}, "placement": placement},
        "skip_launch": true,
    })
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn constraints_place_on_labelled_hosts_and_impossible_ones_are_refused() {
    let mut node = InProcessAgent::start_with(|c| {
        c.labels.insert("disk".into(), "nvme".into());
    })
    .await
    .unwrap();
    let host = node.agent.host_id().to_string();
    let api = bazaar_api::router(node.node());
    node.serve(api.clone());
    let token = Some(api_token());
    let body = json!({"app_name": "pp", "org_slug": "personal"}).to_string();
    let (s, v) = oneshot(&api, Method::POST, "/v1/apps", token, Some(&body)).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let path = "/v1/apps/pp/machines";

    let nvme = json!({"constraints": [{"label": "disk", "value": "nvme"}],
                      "affinities": [{"label": "disk", "value": "nvme", "weight": 10}]});
    let (s, m) = oneshot(&api, Method::POST, path, token, Some(&create(nvme))).await;
    assert_eq!(s, StatusCode::OK, "{m}");
    assert_eq!(
        m["config"]["placement"]["constraints"][0],
        json!({"label": "disk", "op": "=", "value": "nvme"}),
        "the policy is kept, its default op written out: {m}"
    );
    let id = m["id"].as_str().unwrap();
    let (s, p) = oneshot(
        &api,
        Method::GET,
        &format!("{path}/{id}/placement"),
        token,
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{p}");
    let verdict = &p["verdicts"][0];
    assert_eq!(verdict["host_id"], host.as_str(), "{p}");
    assert!(verdict.get("excluded").is_none(), "{p}");
    assert_eq!(verdict["affinity"].as_f64(), Some(1.0), "{p}");
    assert_eq!(verdict["spread"].as_f64(), Some(0.0), "{p}");

    let refusals = [
        (
            json!({"constraints": [{"label": "disk", "value": "ssd"}]}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "no host meets the constraints: disk = ssd (1 of 1 hosts fail) in region(s) local",
        ),
        (
            json!({"affinities": [{"label": "disk", "value": "nvme", "weight": 0}]}),
            StatusCode::BAD_REQUEST,
            "placement.affinities[0].weight must be -100..=100 and not 0, not 0",
        ),
        (
            json!({"spread": {"by": "rack"}}),
            StatusCode::BAD_REQUEST,
            "placement.spread.by must be \"host\" or \"label:NAME\", not \"rack\"",
        ),
    ];
    for (policy, status, error) in refusals {
        let (s, v) = oneshot(&api, Method::POST, path, token, Some(&create(policy))).await;
        assert_eq!(s, status, "{v}");
        assert_eq!(v["error"], error, "{v}");
    }
    let (s, v) = oneshot(
        &api,
        Method::POST,
        path,
        token,
        Some(&create(json!({"constrains": []}))),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("constrains"),
        "the unknown key is named: {v}"
    );
    let (s, v) = oneshot(&api, Method::GET, path, token, None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        v.as_array().unwrap().len(),
        1,
        "the refusals made nothing: {v}"
    );

    let dry =
        json!({"placement": {"constraints": [{"label": "disk", "op": "!=", "value": "nvme"}]}})
            .to_string();
    let (s, v) = oneshot(
        &api,
        Method::POST,
        "/v1/platform/placements",
        token,
        Some(&dry),
    )
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    let dry =
        json!({"placement": {"constraints": [{"label": "disk", "op": "exists"}]}}).to_string();
    let (s, v) = oneshot(
        &api,
        Method::POST,
        "/v1/platform/placements",
        token,
        Some(&dry),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["placement"]["winners"], json!([host]), "{v}");
    assert_eq!(
        v["placement"]["verdicts"][0]["host_id"],
        host.as_str(),
        "{v}"
    );
    node.stop().await;
}
