//! What the volume tests (`api_volumes.rs`, `api_volume_snapshots.rs`) share: waiting for
//! an app's volumes, unmounting what the agents left mounted when a test ends, which agent
//! is a host, and a process machine's config that mounts a volume.
#![allow(dead_code)]

use crate::common::*;
use bazaar_testkit::TestAgent;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The app's volumes once the list has `n` of them.
pub async fn list_volumes(fly: &Fly, app: &str, n: usize) -> Vec<Value> {
    bazaar_testkit::eventually(Duration::from_secs(10), || async {
        let (_, v) = fly.get(&format!("/apps/{app}/volumes")).await;
        let list = v.as_array()?.clone();
        (list.len() == n).then_some(list)
    })
    .await
    .unwrap_or_else(|_| panic!("app {app} never had {n} volume(s)"))
}

/// Thaws and unmounts every volume left under the agents' data directories when a test ends
/// (also when it fails), so no loop device outlives it. Declare it after the agents.
pub struct UnmountOnDrop(Vec<PathBuf>);

impl UnmountOnDrop {
    pub fn new(agents: &[TestAgent]) -> UnmountOnDrop {
        UnmountOnDrop(agents.iter().map(|a| a.data_dir.clone()).collect())
    }
}

impl Drop for UnmountOnDrop {
    fn drop(&mut self) {
        for dir in &self.0 {
            for mnt in mounts_under(dir) {
                // A file system left frozen (a failed snapshot test) would outlive its
                // unmount, holding its loop device.
                let _ = std::process::Command::new("fsfreeze")
                    .args(["-u", &mnt])
                    .stderr(std::process::Stdio::null())
                    .status();
                let _ = std::process::Command::new("umount").arg(&mnt).status();
            }
        }
    }
}

/// Mount points under `dir` in this mount namespace.
pub fn mounts_under(dir: &Path) -> Vec<String> {
    let dir = dir.display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
        .filter(|p| p.starts_with(&dir))
        .collect()
}

pub fn expected_fstype() -> &'static str {
    if is_root() && Path::new("/dev/loop-control").exists() {
        "ext4"
    } else {
        "dir"
    }
}

/// The agent whose host id is `host_id`.
pub fn agent_of<'a>(agents: &'a [TestAgent], host_id: &str) -> &'a TestAgent {
    agents
        .iter()
        .find(|a| host_of(a) == host_id)
        .unwrap_or_else(|| panic!("no agent has host id {host_id}"))
}

pub fn host_of(agent: &TestAgent) -> String {
    tokio::task::block_in_place(|| {
        tokio::runtime::Handle::current()
            .block_on(async { agent.client().info().await.expect("host info").id })
    })
}

pub fn process_config(cmd: &[&str], memory_mb: u64, mount: Option<(&str, &str)>) -> Value {
    let mut c = json!({"image": "process", "driver": "process", "init": {"exec": cmd},
        "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": memory_mb}});
    if let Some((volume, path)) = mount {
        c["mounts"] = json!([{"volume": volume, "path": path}]);
    }
    c
}
