//! Health gating: a machine counts as up when it is `started` at the expected config
//! version and every service check of that version has reported `passing`. Only service
//! checks gate (they are the ones the agent runs and the proxy honours).

use crate::api::{status_of, Client};
use bazaar_types::config::MachineConfig;
use bazaar_types::machine::Machine;
use bazaar_types::state::MachineState;
use std::time::Duration;
use tokio::time::Instant;

/// How many service checks a config defines.
pub fn service_checks(config: &MachineConfig) -> usize {
    config.services.iter().map(|s| s.checks.len()).sum()
}

/// Waits until machine `id` is started at `version` (or any version if `None`).
pub async fn wait_started(
    client: &Client,
    app: &str,
    id: &str,
    version: Option<&str>,
    deadline: Instant,
) -> anyhow::Result<()> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let state = client.machine(app, id).await.map(|m| m.state);
            anyhow::bail!(
                "machine {id} did not start in time (state {})",
                state.map_or("unknown", MachineState::as_str)
            );
        }
        match client
            .wait(
                app,
                id,
                "started",
                version,
                left.min(Duration::from_secs(10)),
            )
            .await
        {
            Ok(()) => return Ok(()),
            Err(e) if status_of(&e) == Some(408) => {
                // Fail early when the machine stopped for good at this version.
                if let Ok(m) = client.machine(app, id).await {
                    let same = version.is_none_or(|v| m.instance_id == v);
                    if same && matches!(m.state, MachineState::Failed | MachineState::Destroyed) {
                        anyhow::bail!("machine {id} is \"{}\"", m.state);
                    }
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// The service checks of a machine: (name, status, output). Check results are free-form
/// JSON objects in the machine type.
pub fn checks_of(m: &Machine) -> Vec<(String, String, String)> {
    m.checks
        .iter()
        .filter_map(|c| {
            let name = c["name"].as_str()?;
            name.starts_with("servicecheck-").then(|| {
                (
                    name.to_string(),
                    c["status"].as_str().unwrap_or_default().to_string(),
                    c["output"].as_str().unwrap_or_default().to_string(),
                )
            })
        })
        .collect()
}

/// Waits until the machine's `expected` service checks all pass (at `version`).
pub async fn wait_passing(
    client: &Client,
    app: &str,
    id: &str,
    version: Option<&str>,
    expected: usize,
    deadline: Instant,
) -> anyhow::Result<()> {
    if expected == 0 {
        return Ok(());
    }
    // The agent forgets the previous version's results when it sees the new one (within
    // its 100 ms scheduling tick): do not read before that.
    tokio::time::sleep(Duration::from_millis(150)).await;
    let mut last = Vec::new();
    loop {
        let m = client.machine(app, id).await?;
        let at_version = version.is_none_or(|v| m.instance_id == v);
        let checks = checks_of(&m);
        if at_version
            && m.state == MachineState::Started
            && checks.len() >= expected
            && checks.iter().all(|(_, s, _)| s == "passing")
        {
            return Ok(());
        }
        if at_version {
            last = checks;
        }
        if Instant::now() >= deadline {
            let why: Vec<String> = last
                .iter()
                .filter(|(_, s, _)| s != "passing")
                .map(|(n, s, o)| format!("{n} {s}: {o}"))
                .collect();
            anyhow::bail!(
                "machine {id}: health checks did not pass in time ({})",
                if why.is_empty() {
                    "no result yet".to_string()
                } else {
                    why.join("; ")
                }
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Started and healthy, within `timeout`.
pub async fn wait_healthy(
    client: &Client,
    app: &str,
    id: &str,
    version: Option<&str>,
    config: &MachineConfig,
    timeout: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    wait_started(client, app, id, version, deadline).await?;
    wait_passing(client, app, id, version, service_checks(config), deadline).await
}
