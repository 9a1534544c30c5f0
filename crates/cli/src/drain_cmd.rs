//! `bazaar host drain` and `bazaar host undrain`, as Nomad's `node drain`: the host stops
//! taking new machines at once (`PUT /host/v1/drain`: its bids and creates are refused and
//! its catalog row says `draining`, so every exchange leaves it out with that reason), then
//! its machines are moved away one at a time, as Fly's clone-then-destroy: each machine
//! that can run elsewhere gets a new machine of the same app, name, region and config
//! (metadata included) through the market of the Machines API (so never on this host), and
//! the original is stopped and destroyed only once its replacement has started: first
//! cordoned once the catalog lists the replacement (proxies choose again), then stopped
//! when its requests in flight have finished. A machine
//! that mounts a volume of this host cannot move: it is stopped, its data stays, and it is
//! listed. A per-host machine (`bazaar_types::per_host`) is destroyed, not moved. What is still running here at `--deadline` (a replacement that found no room or
//! did not start) is stopped. The host stays drained until `bazaar host undrain`; draining
//! again resumes the move.

use anyhow::Context;
use bazaar_client::{FlyClient, FlyOptions, HostClient};
use bazaar_types::api::CreateMachineRequest;
use bazaar_types::host::StopRequest;
use bazaar_types::machine::Machine;
use bazaar_types::state::MachineState;
use comfy_table::Table;
use std::time::Duration;
use tokio::time::Instant;

/// The longest each step of handing a machine's traffic to its replacement waits: for the
/// catalog to list the replacement, for the original's requests to finish.
const HANDOVER: Duration = Duration::from_secs(10);
/// How often those steps look again.
const POLL: Duration = Duration::from_millis(25);
/// How long to wait before asking the market again for a machine that found no room (409
/// `insufficient_capacity`, or a 5xx).
const RETRY: Duration = Duration::from_secs(2);

/// Flags of `bazaar host drain`.
#[derive(Debug, clap::Args)]
pub struct DrainArgs {
    /// The host to drain (an id of `bazaar hosts`); the agent at --api-url when left out.
    host: Option<String>,
    /// How long to keep moving machines (Go duration); what still runs on the host then
    /// is stopped.
    #[arg(long, default_value = "1h")]
    deadline: String,
    /// Only stop taking new machines; leave the host's machines where they are.
    #[arg(long)]
    no_move: bool,
    /// A Machines API token (org-wide, or for every app on the host): replacements are
    /// created through the Machines API at --api-url.
    #[arg(long, env = "BAZAAR_TOKEN", hide_env_values = true)]
    token: Option<String>,
}

/// Flags of `bazaar host undrain`.
#[derive(Debug, clap::Args)]
pub struct UndrainArgs {
    /// The host to take back into the market; the agent at --api-url when left out.
    host: Option<String>,
}

/// What became of one machine of the drained host.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Moved {
    pub machine: String,
    pub app: String,
    /// `replaced`, `stopped` (bound to a volume here), `destroyed` (a per-host machine),
    /// `failed` (stopped at the deadline), `left` (`--no-move`).
    pub outcome: &'static str,
    /// The new machine, when replaced.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replacement: Option<String>,
    pub detail: String,
}

/// The host client of `host` (an id the catalog lists), or of the agent at `--api-url`;
/// with the client of the agent at `--api-url`.
async fn target(
    conn: &crate::operator::OperatorConn,
    host: Option<&str>,
) -> anyhow::Result<(HostClient, HostClient)> {
    let local = conn.client()?;
    let Some(id) = host else {
        return Ok((local.clone(), local));
    };
    let hosts = local.catalog_hosts().await?;
    let host = hosts
        .iter()
        .find(|h| h.id == id)
        .with_context(|| format!("no host {id} in the catalog (bazaar hosts lists them)"))?;
    let target = conn
        .peer(host)
        .with_context(|| format!("reaching host {id}"))?;
    Ok((target, local))
}

/// `bazaar host undrain`.
pub async fn undrain(
    conn: &crate::operator::OperatorConn,
    args: UndrainArgs,
    json: bool,
) -> anyhow::Result<()> {
    let info = target(conn, args.host.as_deref())
        .await?
        .0
        .set_draining(false)
        .await?;
    if json {
        return crate::host_cmd::print_sorted_json(&info);
    }
    println!("{}: takes new machines again", info.id);
    Ok(())
}

/// `bazaar host drain`.
pub async fn drain(
    conn: &crate::operator::OperatorConn,
    args: DrainArgs,
    json: bool,
) -> anyhow::Result<()> {
    let deadline = bazaar_types::duration::parse_go_duration(&args.deadline)
        .map_err(|e| anyhow::anyhow!("--deadline: {e}"))?;
    let (host, view) = target(conn, args.host.as_deref()).await?;
    let info = host.set_draining(true).await?;
    eprintln!("{}: draining, it takes no new machines", info.id);
    let machines: Vec<Machine> = host
        .machines(None, false)
        .await?
        .into_iter()
        .filter(|m| !matches!(m.state, MachineState::Destroyed | MachineState::Destroying))
        .collect();
    let mut done = Vec::new();
    if args.no_move {
        done.extend(machines.iter().map(|m| Moved {
            machine: m.id.clone(),
            app: m.app.clone(),
            outcome: "left",
            replacement: None,
            detail: format!("{} (--no-move)", m.state.as_str()),
        }));
    } else if !machines.is_empty() {
        let fly = fly_client(conn, args.token.as_deref())?;
        let until = Instant::now() + deadline;
        // A per-host machine belongs to this host: destroyed, not moved (every other
        // matching host has its own copy).
        let (per_host, machines): (Vec<&Machine>, Vec<&Machine>) = machines
            .iter()
            .partition(|m| bazaar_types::per_host::opted_in(&m.config.metadata));
        for m in per_host {
            let moved = destroy_per_host(&host, m, until).await;
            eprintln!("{}: {} {}", m.id, moved.outcome, moved.detail);
            done.push(moved);
        }
        // The machines that can move first, so the ones that cannot serve meanwhile.
        let (bound, movable): (Vec<&Machine>, Vec<&Machine>) =
            machines.into_iter().partition(|m| volume_of(m).is_some());
        for m in movable {
            let moved = replace(&fly, &host, &view, m, until).await;
            eprintln!("{}: {} {}", m.id, moved.outcome, moved.detail);
            done.push(moved);
        }
        for m in bound {
            let volume = volume_of(m).unwrap_or_default();
            let detail = match stop(&host, m, until).await {
                Ok(()) => format!("bound to volume {volume} on this host; its data stays"),
                Err(e) => format!("bound to volume {volume} on this host; stopping it: {e:#}"),
            };
            eprintln!("{}: stopped {detail}", m.id);
            done.push(Moved {
                machine: m.id.clone(),
                app: m.app.clone(),
                outcome: "stopped",
                replacement: None,
                detail,
            });
        }
    }
    if json {
        crate::host_cmd::print_sorted_json(&serde_json::json!({
            "host_id": info.id,
            "draining": true,
            "machines": done,
        }))?;
    } else {
        let mut t = Table::new();
        t.set_header(["machine", "app", "outcome", "replacement", "detail"]);
        for d in &done {
            t.add_row([
                d.machine.clone(),
                d.app.clone(),
                d.outcome.to_string(),
                d.replacement.clone().unwrap_or_default(),
                d.detail.clone(),
            ]);
        }
        println!("{}: drained", info.id);
        if !done.is_empty() {
            println!("{t}");
        }
    }
    let failed = done.iter().filter(|d| d.outcome == "failed").count();
    anyhow::ensure!(
        failed == 0,
        "{failed} machine(s) could not be replaced before the deadline and were stopped; \
         bazaar host drain again moves what is left"
    );
    Ok(())
}

/// The Machines API client the replacements are created through.
fn fly_client(
    conn: &crate::operator::OperatorConn,
    token: Option<&str>,
) -> anyhow::Result<FlyClient> {
    let token = token.context(
        "no API token: moving machines creates their replacements through the Machines API; \
         set BAZAAR_TOKEN or pass --token (or --no-move to only stop taking new machines)",
    )?;
    let ca_pem = match &conn.ca_cert {
        Some(path) => Some(
            std::fs::read(path)
                .with_context(|| format!("reading the CA certificate {}", path.display()))?,
        ),
        None => None,
    };
    FlyClient::with_options(
        &conn.api_url,
        token,
        &FlyOptions {
            ca_pem,
            timeout: None,
        },
    )
    .context("setting up the Machines API client")
}

/// The volume a machine mounts (it lives on this host), if any.
fn volume_of(m: &Machine) -> Option<String> {
    let mount = m.config.mounts.first()?;
    Some(
        mount
            .get("volume")
            .and_then(|v| v.as_str())
            .unwrap_or("?")
            .to_string(),
    )
}

/// Clones `m` elsewhere and, once the clone started, stops and destroys it; at `until`,
/// gives up and stops it. `view` is the agent at `--api-url`, whose catalog says when the
/// clone can be routed to.
async fn replace(
    fly: &FlyClient,
    host: &HostClient,
    view: &HostClient,
    m: &Machine,
    until: Instant,
) -> Moved {
    let outcome = |outcome, replacement, detail| Moved {
        machine: m.id.clone(),
        app: m.app.clone(),
        outcome,
        replacement,
        detail,
    };
    match clone_started(fly, m, until).await {
        Ok(clone) => {
            let detail = match retire(fly, host, view, m, &clone.id, until).await {
                Ok(()) => format!("by {} on {}", clone.id, clone.host_id),
                Err(e) => format!(
                    "by {} on {}; destroying the original: {e:#}",
                    clone.id, clone.host_id
                ),
            };
            outcome("replaced", Some(clone.id), detail)
        }
        Err(e) => {
            let detail = match stop(host, m, until).await {
                Ok(()) => format!("stopped at the deadline: {e:#}"),
                Err(stop_err) => format!("{e:#}; stopping it: {stop_err:#}"),
            };
            outcome("failed", None, detail)
        }
    }
}

/// A new machine like `m` through the market, started if `m` was running; retried while
/// the market has no room, until `until`.
async fn clone_started(fly: &FlyClient, m: &Machine, until: Instant) -> anyhow::Result<Machine> {
    let running = matches!(
        m.state,
        MachineState::Started | MachineState::Starting | MachineState::Restarting
    );
    let req = CreateMachineRequest {
        config: m.config.clone(),
        name: Some(m.name.clone()),
        region: Some(m.region.clone()),
        skip_launch: !running,
        skip_service_registration: m.cordoned,
        lease_ttl: None,
        count: None,
    };
    let clone = loop {
        match fly.create_machine(&m.app, &req).await {
            Ok(clone) => break clone,
            Err(e)
                if e.status().is_some_and(|s| s == 409 || s == 429 || s >= 500)
                    && Instant::now() + RETRY < until =>
            {
                tracing::debug!("{}: no replacement yet: {e}", m.id);
                tokio::time::sleep(RETRY).await;
            }
            Err(e) => return Err(anyhow::Error::new(e).context("creating its replacement")),
        }
    };
    if !running {
        return Ok(clone);
    }
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let _ = fly.destroy_machine(&m.app, &clone.id, true, None).await;
            anyhow::bail!("its replacement {} did not start in time", clone.id);
        }
        if fly
            .wait(
                &m.app,
                &clone.id,
                "started",
                None,
                left.min(Duration::from_secs(30)),
            )
            .await
            .is_ok_and(|w| w.ok)
        {
            return Ok(fly.machine(&m.app, &clone.id).await.unwrap_or(clone));
        }
        let now = fly.machine(&m.app, &clone.id).await?;
        if matches!(
            now.state,
            MachineState::Failed
                | MachineState::LaunchFailed
                | MachineState::Destroyed
                | MachineState::Destroying
        ) {
            let _ = fly.destroy_machine(&m.app, &clone.id, true, None).await;
            anyhow::bail!("its replacement {} is {}", clone.id, now.state.as_str());
        }
    }
}

/// Stops `m` (its stop signal, then its kill timeout) and waits until it has stopped.
/// Stops and destroys a per-host machine of this host (`bazaar_types::per_host`).
async fn destroy_per_host(host: &HostClient, m: &Machine, until: Instant) -> Moved {
    let gone = async {
        stop(host, m, until).await?;
        host.destroy(&m.id, false).await?;
        anyhow::Ok(())
    };
    let (outcome, detail) = match gone.await {
        Ok(()) => (
            "destroyed",
            "a per-host machine: every other matching host has its own".to_string(),
        ),
        Err(e) => (
            "failed",
            format!("a per-host machine; destroying it: {e:#}"),
        ),
    };
    Moved {
        machine: m.id.clone(),
        app: m.app.clone(),
        outcome,
        replacement: None,
        detail,
    }
}

async fn stop(host: &HostClient, m: &Machine, until: Instant) -> anyhow::Result<()> {
    let now = host.machine(&m.id).await?;
    if !matches!(
        now.state,
        MachineState::Started
            | MachineState::Starting
            | MachineState::Restarting
            | MachineState::Stopping
    ) {
        return Ok(());
    }
    if now.state != MachineState::Stopping {
        host.stop(&m.id, &StopRequest::default()).await?;
    }
    let left = until.saturating_duration_since(Instant::now()).as_secs();
    host.wait(&m.id, "stopped", left.clamp(5, 60)).await?;
    Ok(())
}

/// Hands the original's traffic to the clone, then stops and destroys it, waiting until it
/// is gone: once the catalog of `view` lists the clone started (so proxies route to it),
/// the original is cordoned (its host's proxy admits no new request for it, and the
/// proxy that sent one chooses again) until that catalog says so too, and its requests in
/// flight finish, each wait at most `HANDOVER`.
async fn retire(
    fly: &FlyClient,
    host: &HostClient,
    view: &HostClient,
    m: &Machine,
    clone: &str,
    until: Instant,
) -> anyhow::Result<()> {
    let bound = |limit: Duration| (Instant::now() + limit).min(until);
    let routable = bound(HANDOVER);
    while Instant::now() < routable {
        let listed = view.catalog_machines(Some(&m.app), false).await?;
        if listed.iter().any(|c| c.id == clone && c.state == "started") {
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    if let Err(e) = fly.action(&m.app, &m.id, "cordon", None, None).await {
        tracing::debug!("{}: cordoning: {e}", m.id);
    }
    // Proxies route by the catalog: once it says cordoned, none sends the original a new
    // request, nor wakes it once it is stopped.
    let cordoned = bound(HANDOVER);
    while Instant::now() < cordoned {
        let listed = view.catalog_machines(Some(&m.app), false).await?;
        if listed.iter().any(|c| c.id == m.id && c.cordoned) {
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    let drained = bound(HANDOVER);
    while Instant::now() < drained {
        match fly.traffic(&m.app, &m.id).await {
            Ok(t) if t.in_flight > 0 => tokio::time::sleep(POLL).await,
            _ => break,
        }
    }
    // A stop that does not finish in time is cut by the forced destroy.
    if let Err(e) = stop(host, m, until).await {
        tracing::debug!("{}: stopping before destroying: {e:#}", m.id);
    }
    host.destroy(&m.id, true).await?;
    let left = until.saturating_duration_since(Instant::now()).as_secs();
    host.wait(&m.id, "destroyed", left.clamp(5, 60)).await?;
    Ok(())
}
