//! `[deploy] release_command`: run once per release, before any machine changes, in a
//! temporary machine of the release's config (the image, env and size of the group `app`,
//! else the first group), without services, checks, volumes or restarts, as on Fly. The
//! deploy stops when the command exits non-zero, cannot start, or runs past
//! `release_command_timeout` (default 5 min); the machine is destroyed either way. It
//! carries no release label (so `bazaar releases` and rollbacks never see it) and the
//! process group `fly_app_release_command`.

use crate::api::{status_of, Client};
use crate::progress::{Event, Progress};
use bazaar_types::api::CreateMachineRequest;
use bazaar_types::config::{MachineConfig, RestartConfig, RestartPolicyKind};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// The process group of a release command's machine (Fly's name).
pub const GROUP: &str = "fly_app_release_command";

/// Fly's default `release_command_timeout`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// The temporary machine's config: `base` running `command` and nothing else.
pub fn machine_config(base: &MachineConfig, command: &[String]) -> MachineConfig {
    let mut c = base.clone();
    c.services.clear();
    c.checks.clear();
    c.mounts.clear();
    c.standbys.clear();
    c.schedule = None;
    c.auto_destroy = false;
    c.restart = Some(RestartConfig {
        policy: RestartPolicyKind::No,
        max_retries: None,
    });
    let process = c.driver() == "process";
    let init = c.init.get_or_insert_with(Default::default);
    if process {
        init.exec = command.to_vec();
    } else {
        init.exec.clear();
        init.cmd = command.to_vec();
    }
    c.metadata.remove(crate::META_RELEASE);
    c.metadata.insert(crate::META_GROUP.into(), GROUP.into());
    c
}

/// Runs `command` in a temporary machine in `region`; an error says why it failed, with
/// the end of its output.
pub async fn run(
    client: &Client,
    app: &str,
    base: &MachineConfig,
    command: &[String],
    region: &str,
    timeout: Duration,
    progress: &Arc<dyn Progress>,
) -> anyhow::Result<()> {
    progress.event(Event::Note {
        message: format!("running release command: {}", command.join(" ")),
    });
    let req = CreateMachineRequest {
        config: machine_config(base, command),
        region: Some(region.to_string()).filter(|r| !r.is_empty()),
        skip_service_registration: true,
        ..Default::default()
    };
    let m = client.fly().create_machine(app, &req).await?;
    let result = outcome(client, app, &m.id, Instant::now() + timeout).await;
    // Gone either way (a run past its time is stopped first).
    let _ = client.action(app, &m.id, "stop", None, None).await;
    let _ = client
        .wait(app, &m.id, "stopped", None, Duration::from_secs(30))
        .await;
    let destroyed = async {
        client.destroy(app, &m.id, None).await?;
        client
            .wait(app, &m.id, "destroyed", None, Duration::from_secs(30))
            .await
    };
    if let Err(e) = destroyed.await {
        progress.event(Event::Note {
            message: format!("release command machine {} was not destroyed: {e:#}", m.id),
        });
    }
    match result {
        Ok(()) => {
            progress.event(Event::Note {
                message: "release command succeeded".into(),
            });
            Ok(())
        }
        Err(why) => {
            let tail = output_tail(client, app, &m.id).await;
            anyhow::bail!(
                "release_command `{}` {why} (machine {}); the deploy stopped before changing any machine{tail}",
                command.join(" "),
                m.id
            )
        }
    }
}

/// Waits for the machine to stop: `Ok` for exit code 0, else why not.
async fn outcome(client: &Client, app: &str, id: &str, deadline: Instant) -> Result<(), String> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err("did not finish within release_command_timeout".into());
        }
        match client
            .wait(app, id, "stopped", None, left.min(Duration::from_secs(10)))
            .await
        {
            Ok(()) => break,
            Err(e) if status_of(&e) == Some(408) => continue,
            Err(e) => return Err(format!("could not be waited for: {e:#}")),
        }
    }
    let events = client
        .fly()
        .events(app, id)
        .await
        .map_err(|e| format!("ended, and its exit is unknown: {e}"))?;
    let exit = events
        .iter()
        .find(|e| e.kind == "exit")
        .and_then(|e| e.request.as_ref()?.exit_event.clone());
    match exit {
        Some(x) if x.exit_code == 0 && x.error.is_none() => Ok(()),
        Some(x) => Err(match (&x.error, x.signal) {
            (Some(err), _) => format!("could not run: {err}"),
            (None, s) if s != 0 => format!("was killed by signal {s}"),
            _ => format!("exited with code {}", x.exit_code),
        }),
        None => Err("stopped without an exit record".into()),
    }
}

/// The last lines of the machine's output, as `: ...` (empty when there is none).
async fn output_tail(client: &Client, app: &str, id: &str) -> String {
    let Ok(resp) = client.fly().logs(app, id, false).await else {
        return String::new();
    };
    let text = resp.text().await.unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(10)..].join("\n");
    if tail.trim().is_empty() {
        String::new()
    } else {
        format!("; its output ended with:\n{tail}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bazaar_types::config::{InitConfig, MachineService};

    #[test]
    fn the_release_machine_runs_the_command_alone() {
        let mut base = MachineConfig {
            image: "registry.fly.io/shop:v9".into(),
            init: Some(InitConfig {
                entrypoint: vec!["/tini".into()],
                cmd: vec!["serve".into()],
                ..Default::default()
            }),
            services: vec![MachineService::default()],
            mounts: vec![serde_json::json!({"name": "data", "path": "/data"})],
            ..Default::default()
        };
        base.metadata.insert(crate::META_RELEASE.into(), "4".into());
        base.env.insert("RAILS_ENV".into(), "production".into());
        let cmd = vec!["bin/rails".to_string(), "db:prepare".to_string()];
        let c = machine_config(&base, &cmd);
        let init = c.init.unwrap();
        assert_eq!(init.cmd, cmd);
        assert_eq!(init.entrypoint, vec!["/tini"]);
        assert!(c.services.is_empty() && c.mounts.is_empty());
        assert_eq!(c.restart.unwrap().policy, RestartPolicyKind::No);
        assert_eq!(c.env["RAILS_ENV"], "production");
        assert!(!c.metadata.contains_key(crate::META_RELEASE));
        assert_eq!(c.metadata[crate::META_GROUP], GROUP);

        let process = MachineConfig {
            image: "process".into(),
            driver: Some("process".into()),
            ..Default::default()
        };
        let c = machine_config(&process, &cmd);
        assert_eq!(c.init.unwrap().exec, cmd);
    }
}
