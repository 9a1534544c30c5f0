//! A quota across a partition (root, on the lab; issue 34, docs/POLICY.md): with the two
//! hosts of a lab cut apart, each side accepts creates up to the quota counting only what
//! it sees, so the app's use passes the limit, but by no more than the documented bound
//! (`bazaar_types::quota::overshoot_bound`: one limit per extra side, plus each node's
//! racing creates); after the heal every host counts the whole use and refuses the next
//! create with 403 naming the quota.

use crate::lab_support;

use bazaar_types::quota::overshoot_bound;
use lab_support::{until, LabApi as Api, TestLab};
use reqwest::StatusCode;
use serde_json::{json, Value};

const LIMIT: u64 = 2;
const QUOTA: &str = "/v1/orgs/acme/apps/qlab/quota";

fn sleeper() -> Value {
    json!({
        "config": {
            "driver": "process",
            "init": {"exec": ["sleep", "1000"]},
            "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": 256},
        },
        "skip_launch": true,
    })
}

impl Api {
    async fn usage(&self) -> u64 {
        let (_, v) = self.get(QUOTA).await;
        v["usage"]["machines"].as_u64().unwrap_or(0)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_overshoots_a_quota_by_at_most_the_documented_bound() {
    let (t, _) = TestLab::up(
        "quotas",
        &[
            "--dead-after-ms",
            "2000",
            "--hosts",
            "2",
            "--wait-converged",
        ],
    );
    let lab = t.lab();
    let apis = [Api::of(&lab, "h1"), Api::of(&lab, "h2")];
    let (s, v) = apis[0]
        .post("/v1/apps", json!({"app_name": "qlab", "org_slug": "acme"}))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, v) = apis[0].post(QUOTA, json!({"machines": LIMIT})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    until(15, "both hosts hold the quota", || async {
        let (_, v) = apis[1].get(QUOTA).await;
        v["limits"]["machines"] == LIMIT
    })
    .await;

    t.cli(&["partition", "h1", "/", "h2"]);
    until(15, "each side sees the other gone", || async {
        let mut gone = true;
        for api in &apis {
            let (_, v) = api.get("/v1/catalog/hosts").await;
            gone &= v
                .as_array()
                .is_some_and(|hs| hs.iter().any(|h| h["status"] != "alive"));
        }
        gone
    })
    .await;

    // Each side creates until it is refused, one create at a time, each counted by its
    // side's catalog before the next.
    let mut accepted = 0;
    for api in &apis {
        let mut mine = 0;
        for _ in 0..=LIMIT {
            let (s, v) = api.post("/v1/apps/qlab/machines", sleeper()).await;
            if s == StatusCode::FORBIDDEN {
                assert!(
                    v["error"]
                        .as_str()
                        .unwrap()
                        .contains("quota exceeded: app qlab"),
                    "{v}"
                );
                break;
            }
            assert_eq!(s, StatusCode::OK, "{}: {v}", api.base);
            mine += 1;
            until(10, "this side counts its own machine", || async {
                api.usage().await == mine
            })
            .await;
        }
        accepted += mine;
    }
    let bound = overshoot_bound(LIMIT, 2, 2, 1);
    assert!(
        accepted <= LIMIT + bound,
        "{accepted} machines accepted against a limit of {LIMIT} and a bound of {bound}"
    );
    assert!(
        accepted > LIMIT,
        "each side took the quota it saw: {accepted}"
    );

    t.cli(&["heal"]);
    until(30, "every catalog agrees after heal", || async {
        let (a, b) = (apis[0].digest().await, apis[1].digest().await);
        a.is_some() && a == b
    })
    .await;
    for api in &apis {
        assert_eq!(api.usage().await, accepted, "{}", api.base);
        let (s, v) = api.post("/v1/apps/qlab/machines", sleeper()).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{}: {v}", api.base);
        assert_eq!(
            v["error"],
            format!(
                "forbidden: quota exceeded: app qlab allows {LIMIT} machines, {accepted} in use, this request adds 1"
            ),
            "{v}"
        );
    }
    t.cli(&["down"]);
}
