//! The registry bench's layer distribution on a `bazaar lab` (`BAZAAR_BENCH_LAB=N`): N
//! hosts, each an agent in a network namespace of its own on the lab's bridge (veth links,
//! mTLS between hosts), regions `r1`..`rN`. The image is pushed to h1's `/v2` and a machine
//! of it created in each of regions r2..rN at once, through h1's API; timed from the first
//! create to the last machine started. Peer to peer only: the lab's agents are not allowed
//! an outside registry, so the all-from-one-host row is the loopback run's.

use bazaar_testkit::images::{push_with_config, Layer};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// A lab, taken down when dropped.
struct LabUp(tempfile::TempDir, String);

impl Drop for LabUp {
    fn drop(&mut self) {
        let _ = Command::new(&self.1)
            .arg("lab")
            .arg("--dir")
            .arg(self.0.path())
            .arg("down")
            .output();
    }
}

async fn call(http: &reqwest::Client, token: &str, url: &str, body: Option<Value>) -> (u16, Value) {
    let req = match body {
        Some(b) => http.post(url).json(&b),
        None => http.get(url),
    };
    let resp = req
        .bearer_auth(token)
        .timeout(Duration::from_secs(90))
        .send()
        .await
        .expect("the lab host answers");
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// Pushes `layers` and `config` to h1 of a new lab of `n` hosts and starts a machine of it
/// on each other host at once: the time until the last one started, and each one's pull.
pub async fn distribution(
    exe: &str,
    n: usize,
    layers: &[Layer],
    config: &[u8],
) -> (Duration, Vec<String>) {
    let dir = tempfile::Builder::new()
        .prefix("bazaar-bench-lab-")
        .tempdir()
        .expect("lab directory");
    let regions: Vec<String> = (1..=n).map(|i| format!("r{i}")).collect();
    let out = Command::new(exe)
        .arg("lab")
        .arg("--dir")
        .arg(dir.path())
        .args([
            "up",
            "--memory-mb",
            "2048",
            "--hosts",
            &n.to_string(),
            "--wait-converged",
        ])
        .args(["--regions", &regions.join(",")])
        .output()
        .expect("bazaar lab up");
    let lab_dir = dir.path().to_path_buf();
    let _up = LabUp(dir, exe.to_string());
    assert!(
        out.status.success(),
        "bazaar lab up: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let lab = bazaar_lab::Lab::open(Path::new(&lab_dir)).expect("the lab");
    let token = lab.token().to_string();
    let h1 = lab.host("h1").expect("h1");
    let api = lab.api_url(&h1);
    let http = reqwest::Client::new();
    let app = json!({"app_name": "bench", "org_slug": "personal"});
    let (s, v) = call(&http, &token, &format!("{api}/v1/apps"), Some(app)).await;
    assert_eq!(s, 201, "{v}");
    let auth = bazaar_image::Auth::Basic {
        username: "x".into(),
        password: token.clone(),
    };
    let registry =
        bazaar_image::Registry::new(&h1.api().to_string(), auth, true).expect("registry client");
    let refs: Vec<&Layer> = layers.iter().collect();
    let digest = push_with_config(&registry, "bench", "lab", &refs, config).await;
    let image = format!("registry.bazaar.internal/bench@{digest}");

    let t0 = Instant::now();
    let creates = regions[1..].iter().map(|region| {
        let (http, token, api, image) = (&http, &token, &api, &image);
        async move {
            let body = json!({"region": region, "config": {
                "image": image,
                "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": 256},
                "init": {"exec": ["/bin/sleep", "1000"]},
            }});
            let machines = format!("{api}/v1/apps/bench/machines");
            let (s, m) = call(http, token, &machines, Some(body)).await;
            assert_eq!(s, 200, "create in {region}: {m}");
            let id = m["id"].as_str().expect("an id").to_string();
            let wait = format!("{machines}/{id}/wait?state=started&timeout=60");
            for _ in 0..5 {
                let (s, w) = call(http, token, &wait, None).await;
                if s == 200 {
                    return id;
                }
                assert_eq!(s, 408, "machine in {region}: {w}");
            }
            panic!("the machine in {region} did not start in 5 minutes")
        }
    });
    let ids = futures_util::future::join_all(creates).await;
    let took = t0.elapsed();
    let mut pulls = Vec::new();
    for id in ids {
        let url = format!("{api}/v1/apps/bench/machines/{id}/events");
        let (_, events) = call(&http, &token, &url, None).await;
        pulls.push(super::pull_reason(&events));
    }
    (took, pulls)
}
