//! What the gVisor and microVM machine tests share: a busybox image pushed to the test
//! registry, a machine config of a runtime, and the waits, execs and proxy fetches they
//! make of a machine; each test gives the patience its runtime needs (a microVM boots
//! under TCG in seconds, a gVisor sandbox in a fraction of one).

use crate::common::*;
use bazaar_testkit::images::{busybox_rootfs_layer, config_with, push_with_config, TestRegistry};
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Pushes `repo:1`, a busybox with `applets` and `motd` as `/etc/motd`, whose first
/// process is `sh -c script`; its reference.
pub async fn push_busybox(
    registry: &TestRegistry,
    repo: &str,
    applets: &[&str],
    motd: &[u8],
    script: &str,
) -> String {
    let reg =
        bazaar_image::Registry::new(&registry.host, bazaar_image::Auth::Anonymous, true).unwrap();
    let layer = busybox_rootfs_layer(applets, ("etc/motd", motd));
    let config = config_with(
        &[&layer],
        bazaar_image::manifest::Platform::current()
            .architecture
            .as_str(),
        json!({"Cmd": ["/bin/sh", "-c", script], "Env": ["PATH=/bin"]}),
    );
    push_with_config(&reg, repo, "1", &[&layer], &config).await;
    format!("{}/{repo}:1", registry.host)
}

/// A machine of `image` under `runtime`, serving HTTP on 8080 through the proxy.
pub fn config(image: &str, runtime: &str) -> Value {
    json!({
        "image": image,
        "runtime": runtime,
        "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": 256},
        "services": [{"protocol": "tcp", "internal_port": 8080,
                      "ports": [{"port": 80, "handlers": ["http"]}]}],
    })
}

/// Creates a machine of `app`; its id and address.
pub async fn create(fly: &Fly, app: &str, config: Value) -> (String, Ipv4Addr) {
    let (s, m) = fly
        .post(&format!("/apps/{app}/machines"), json!({"config": config}))
        .await;
    assert_eq!(s, StatusCode::OK, "{m}");
    let ip = m["private_ip"].as_str().unwrap().parse().unwrap();
    (m["id"].as_str().unwrap().to_string(), ip)
}

/// How long a runtime's machines are given: to reach a state, to answer an exec, to serve.
#[derive(Clone, Copy)]
pub struct Patience {
    pub wait_secs: u64,
    pub exec: Duration,
    pub exec_timeout_secs: u64,
    pub serve: Duration,
}

/// Waits until the machine is `state`; otherwise fails with its events and its log.
pub async fn reaches(
    fly: &Fly,
    data_dir: &Path,
    patience: Patience,
    (app, id): (&str, &str),
    state: &str,
) {
    let (s, w) = fly
        .get(&format!(
            "/apps/{app}/machines/{id}/wait?state={state}&timeout={}",
            patience.wait_secs
        ))
        .await;
    if s != StatusCode::OK {
        let (_, ev) = fly.get(&format!("/apps/{app}/machines/{id}/events")).await;
        panic!(
            "machine {id} never {state}: {w}\nevents: {ev}\nlog: {}",
            log(data_dir, id)
        );
    }
}

/// The machine's log on its host.
pub fn log(data_dir: &Path, id: &str) -> String {
    std::fs::read_to_string(data_dir.join("machines").join(id).join("output.log"))
        .unwrap_or_default()
}

/// Runs `cmd` with `sh -c` in the machine once exec answers (retried while it boots, or
/// after a restart); its stdout.
pub async fn sh(fly: &Fly, patience: Patience, (app, id): (&str, &str), cmd: &str) -> String {
    let v = bazaar_testkit::eventually(patience.exec, || async {
        let (s, v) = fly
            .post(
                &format!("/apps/{app}/machines/{id}/exec"),
                json!({"command": ["/bin/sh", "-c", cmd], "timeout": patience.exec_timeout_secs}),
            )
            .await;
        // 125: the command did not run (a microVM's `vm-exec` before its guest's exec
        // port answers: the machine is started once QEMU runs, the guest boots after).
        (s == StatusCode::OK && v["exit_code"].as_i64() != Some(125)).then_some(v)
    })
    .await
    .unwrap_or_else(|_| panic!("exec {cmd:?} never answered 200"));
    v["stdout"].as_str().unwrap_or_default().to_string()
}

/// `/index.html` of `app` through the proxy at `proxy`, once it answers 200.
pub async fn served(proxy: &str, patience: Patience, app: &str) -> String {
    bazaar_testkit::eventually(patience.serve, || async {
        let resp = reqwest::Client::new()
            .get(format!("{proxy}/index.html"))
            .header("host", format!("{app}.localhost"))
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .ok()?;
        (resp.status() == 200).then_some(resp.text().await.ok()?)
    })
    .await
    .expect("served through the proxy")
}

/// Host processes whose command line names `needle`, but this test binary.
pub fn processes_naming(needle: &str) -> Vec<String> {
    let me = std::fs::read_link("/proc/self/exe").unwrap_or_default();
    let me = me
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(needle) && (me.is_empty() || !c.contains(&me)))
        .collect()
}

/// Removes a host file when the test ends, however it ends.
pub struct HostFile(pub PathBuf);

impl Drop for HostFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
