//! `bazaar host ...`, `bazaar hosts`, `bazaar status`: operator commands against one agent's
//! host interface and catalog view, at `BAZAAR_API_URL` with the cluster secret
//! (`BAZAAR_CLUSTER_SECRET`; an API token is refused there) over HTTPS or to loopback, or
//! with `--host-data-dir` over the host listener (`operator.rs`). Human tables by default,
//! `--json` for scripts.

use anyhow::Context;
use bazaar_client::HostClient;
use bazaar_types::config::{
    InitConfig, MachineConfig, MachineService, RestartConfig, RestartPolicyKind,
};
use bazaar_types::guest::Guest;
use bazaar_types::host::{ClaimRequest, StopRequest};
use bazaar_types::machine::{LogLine, Machine};
use comfy_table::Table;

/// Flags of `bazaar host`.
#[derive(Debug, clap::Args)]
pub struct HostArgs {
    #[command(flatten)]
    conn: crate::operator::OperatorConn,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: HostCommand,
}

#[derive(Debug, clap::Subcommand)]
enum HostCommand {
    /// Show the host: region, capacity, what is committed and free.
    Info,
    /// List the machines on the host.
    Machines {
        #[arg(long)]
        app: Option<String>,
        /// Include destroyed machines.
        #[arg(long)]
        all: bool,
    },
    /// Run a command as a new machine on this host.
    Run {
        #[arg(long)]
        app: String,
        #[arg(long)]
        name: Option<String>,
        /// A Fly size preset (shared-cpu-1x, performance-2x, ...).
        #[arg(long, default_value = "shared-cpu-1x")]
        size: String,
        /// Memory in MB (overrides the preset's).
        #[arg(long)]
        memory_mb: Option<i64>,
        /// A service's internal port (repeatable); the workload reads its host port in $PORT.
        #[arg(long = "port")]
        ports: Vec<u16>,
        /// Environment variables, KEY=VALUE (repeatable).
        #[arg(long = "env")]
        env: Vec<String>,
        /// Restart policy: no, always, on-failure.
        #[arg(long)]
        restart: Option<String>,
        /// Create without starting.
        #[arg(long)]
        skip_launch: bool,
        /// The command and its arguments.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Show one machine.
    Status { id: String },
    /// Start a machine.
    Start { id: String },
    /// Stop a machine (its stop signal, then SIGKILL after the timeout).
    Stop {
        id: String,
        #[arg(long)]
        signal: Option<String>,
        /// e.g. 10s
        #[arg(long)]
        timeout: Option<String>,
    },
    /// Restart a machine.
    Restart { id: String },
    /// Destroy a machine.
    Destroy {
        id: String,
        /// Kill it at once if it is running.
        #[arg(long)]
        force: bool,
    },
    /// Show a machine's events.
    Events { id: String },
    /// Show a machine's output.
    Logs { id: String },
    /// Wait for a machine to reach a state.
    Wait {
        id: String,
        #[arg(long, default_value = "started")]
        state: String,
        #[arg(long, default_value_t = 60)]
        timeout: u64,
    },
    /// Drain the host (as Nomad's `node drain`): it takes no new machines at once; each of
    /// its machines is replaced by a new one elsewhere through the market (same app, name,
    /// config), the original destroyed once the replacement started; a machine bound to a
    /// volume here is stopped (its data stays). Needs the cluster secret and an API token.
    Drain(crate::drain_cmd::DrainArgs),
    /// Take a drained host back into the market.
    Undrain(crate::drain_cmd::UndrainArgs),
    /// Back the host up, on the host (root): its store, copied consistently while its agent
    /// runs, its keys and certificate (and the cluster CA's directory with --ca-dir) into
    /// one archive.
    Backup(crate::backup_cmd::BackupArgs),
    /// Put a backup back into a host's data dir (its agent stopped); the agent started
    /// again re-adopts its running machines and rejoins.
    Restore(crate::backup_cmd::RestoreArgs),
    /// Remove every trace of a host whose agent is stopped, its machines included: kill
    /// its shims and workloads, unmount, detach loop devices, delete its bridge, network
    /// namespaces, veths, nftables table and cgroups, then empty its data dir. For a host
    /// taken out of service; nothing of it can be resumed afterwards.
    Reset {
        /// The host's data dir (what its agent had as --data-dir).
        #[arg(long)]
        data_dir: std::path::PathBuf,
    },
}

/// `bazaar host reset`: works on the data dir, with no agent to talk to.
fn reset(data_dir: &std::path::Path, json: bool) -> anyhow::Result<()> {
    let done = bazaar_agent::cleanup::reset_host(data_dir).map_err(anyhow::Error::msg)?;
    if json {
        println!(
            "{}",
            serde_json::json!({
                "processes": done.processes,
                "mounts": done.mounts,
                "loop_devices": done.loop_devices,
                "namespaces": done.namespaces,
                "links": done.links,
                "nft_tables": done.nft_tables,
                "cgroups": done.cgroups,
            })
        );
    } else {
        println!("reset {}: removed {done}", data_dir.display());
    }
    Ok(())
}

/// The cluster secret the host interface takes, or an error saying where to find it.
pub(crate) fn require_secret(secret: Option<String>) -> anyhow::Result<String> {
    secret.context(
        "no cluster secret: the host interface takes the cluster secret, not an API token; set \
         BAZAAR_CLUSTER_SECRET (bazaar dev writes it to .bazaar-dev/dev.env; an agent keeps it \
         in DATA_DIR/cluster-secret) or pass --cluster-secret",
    )
}

/// Runs a `bazaar host` command.
pub async fn run(args: HostArgs) -> anyhow::Result<()> {
    match args.command {
        HostCommand::Reset { data_dir } => reset(&data_dir, args.json),
        HostCommand::Drain(d) => crate::drain_cmd::drain(&args.conn, d, args.json).await,
        HostCommand::Undrain(u) => crate::drain_cmd::undrain(&args.conn, u, args.json).await,
        HostCommand::Backup(b) => crate::backup_cmd::backup(&args.conn, b, args.json).await,
        HostCommand::Restore(r) => crate::backup_cmd::restore(r, args.json),
        command => run_on(args.conn, args.json, command).await,
    }
}

/// Runs a `bazaar host` command against one agent's host interface.
async fn run_on(
    conn: crate::operator::OperatorConn,
    json: bool,
    command: HostCommand,
) -> anyhow::Result<()> {
    let client = conn.client()?;
    match command {
        HostCommand::Info => {
            let info = client.info().await?;
            if json {
                return print_json(&info);
            }
            let mut t = Table::new();
            t.set_header([
                "host",
                "region",
                "resource",
                "capacity",
                "committed",
                "reserved",
                "free",
            ]);
            t.add_row([
                info.id.clone(),
                info.region.clone(),
                "memory_mb".into(),
                info.capacity.memory_mb.to_string(),
                info.committed.memory_mb.to_string(),
                info.reserved.memory_mb.to_string(),
                info.free.memory_mb.to_string(),
            ]);
            t.add_row([
                String::new(),
                String::new(),
                "cpus".into(),
                info.capacity.cpus.to_string(),
                info.committed.cpus.to_string(),
                info.reserved.cpus.to_string(),
                info.free.cpus.to_string(),
            ]);
            println!("{t}");
            println!(
                "{} machine(s), {} open reservation(s)",
                info.num_machines, info.num_reservations
            );
        }
        HostCommand::Machines { app, all } => {
            let machines = client.machines(app.as_deref(), all).await?;
            if json {
                return print_json(&machines);
            }
            print_machines(&machines);
        }
        HostCommand::Run {
            app,
            name,
            size,
            memory_mb,
            ports,
            env,
            restart,
            skip_launch,
            command,
        } => {
            let mut guest = Guest::preset(&size).map_err(anyhow::Error::msg)?;
            if let Some(m) = memory_mb {
                guest.memory_mb = m;
            }
            let mut config = MachineConfig {
                driver: Some("process".into()),
                image: "process".into(),
                guest: Some(guest),
                init: Some(InitConfig {
                    exec: command,
                    ..Default::default()
                }),
                ..Default::default()
            };
            for kv in env {
                let (k, v) = kv.split_once('=').context("--env takes KEY=VALUE")?;
                config.env.insert(k.into(), v.into());
            }
            for p in ports {
                config.services.push(MachineService {
                    protocol: "tcp".into(),
                    internal_port: p,
                    ..Default::default()
                });
            }
            if let Some(r) = restart {
                let policy: RestartPolicyKind =
                    serde_json::from_value(serde_json::Value::String(r.clone())).map_err(|_| {
                        anyhow::anyhow!("--restart must be no, always or on-failure, got {r:?}")
                    })?;
                config.restart = Some(RestartConfig {
                    policy,
                    max_retries: None,
                });
            }
            let m = client
                .create(&ClaimRequest {
                    app,
                    app_id: String::new(),
                    name,
                    region: None,
                    config,
                    skip_launch,
                    machine_id: None,
                    lease_ttl: None,
                    skip_service_registration: false,
                    placement: None,
                    epoch: 0,
                    displaced_from: None,
                })
                .await?;
            if !skip_launch {
                let _ = client.wait(&m.id, "started", 30).await;
            }
            let m = client.machine(&m.id).await?;
            if json {
                return print_json(&m);
            }
            println!("machine {} ({}) is {}", m.id, m.name, m.state);
            for (internal, host) in &m.host_ports {
                println!("  port {internal} -> 127.0.0.1:{host}");
            }
        }
        HostCommand::Status { id } => {
            let m = client.machine(&id).await?;
            if json {
                return print_json(&m);
            }
            print_machines(std::slice::from_ref(&m));
            print_events(&m.events);
        }
        HostCommand::Start { id } => {
            done(json, client.start(&id).await?, &format!("started {id}"))?
        }
        HostCommand::Stop {
            id,
            signal,
            timeout,
        } => {
            let req = StopRequest {
                signal: signal
                    .map(|s| bazaar_types::signal::Signal::parse(&s))
                    .transpose()
                    .map_err(anyhow::Error::msg)?,
                timeout: timeout
                    .map(|t| {
                        bazaar_types::duration::parse_go_duration(&t)
                            .map(bazaar_types::duration::GoDuration)
                    })
                    .transpose()
                    .map_err(anyhow::Error::msg)?,
            };
            done(
                json,
                client.stop(&id, &req).await?,
                &format!("stopping {id}"),
            )?
        }
        HostCommand::Restart { id } => done(
            json,
            client.restart(&id, &StopRequest::default()).await?,
            &format!("restarting {id}"),
        )?,
        HostCommand::Destroy { id, force } => done(
            json,
            client.destroy(&id, force).await?,
            &format!("destroying {id}"),
        )?,
        HostCommand::Events { id } => {
            let events = client.events(&id).await?;
            if json {
                return print_json(&events);
            }
            print_events(&events);
        }
        HostCommand::Logs { id } => {
            let text = client.logs(&id).await?;
            for line in text.lines() {
                match serde_json::from_str::<LogLine>(line) {
                    Ok(l) if !json => println!("{}", l.line),
                    _ => println!("{line}"),
                }
            }
        }
        // Done above, before a token is needed.
        HostCommand::Reset { .. }
        | HostCommand::Drain(_)
        | HostCommand::Undrain(_)
        | HostCommand::Backup(_)
        | HostCommand::Restore(_) => {}
        HostCommand::Wait { id, state, timeout } => {
            let r = client.wait(&id, &state, timeout).await?;
            if json {
                return print_json(&r);
            }
            println!("machine {id} is {}", r.state);
        }
    }
    Ok(())
}

fn done(json: bool, v: serde_json::Value, message: &str) -> anyhow::Result<()> {
    if json {
        print_json(&v)
    } else {
        println!("{message}");
        Ok(())
    }
}

fn print_json<T: serde::Serialize>(v: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

fn print_machines(machines: &[Machine]) {
    let mut t = Table::new();
    t.set_header([
        "id", "name", "app", "state", "region", "version", "ports", "updated",
    ]);
    for m in machines {
        let ports = m
            .host_ports
            .iter()
            .map(|(i, h)| format!("{i}->{h}"))
            .collect::<Vec<_>>()
            .join(",");
        t.add_row([
            m.id.clone(),
            m.name.clone(),
            m.app.clone(),
            m.state.to_string(),
            m.region.clone(),
            m.instance_id.clone(),
            ports,
            m.updated_at.clone(),
        ]);
    }
    println!("{t}");
}

fn print_events(events: &[bazaar_types::event::MachineEvent]) {
    let mut t = Table::new();
    t.set_header(["time", "type", "status", "source", "details"]);
    for e in events {
        let details = e
            .request
            .as_ref()
            .map(|r| {
                let mut parts = Vec::new();
                if let Some(x) = &r.exit_event {
                    parts.push(format!("exit_code={} signal={}", x.exit_code, x.signal));
                    if x.oom_killed {
                        parts.push("oom_killed".into());
                    }
                    if let Some(err) = &x.error {
                        parts.push(err.clone());
                    }
                }
                if let Some(reason) = &r.reason {
                    parts.push(reason.clone());
                }
                parts.join(" ")
            })
            .unwrap_or_default();
        t.add_row([
            bazaar_types::rfc3339(e.timestamp),
            e.kind.clone(),
            e.status.clone(),
            e.source.clone(),
            details,
        ]);
    }
    println!("{t}");
}

/// Connection flags shared by the catalog commands.
#[derive(Debug, clap::Args)]
pub struct CatalogArgs {
    #[command(flatten)]
    conn: crate::operator::OperatorConn,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// Flags of `bazaar status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    conn: CatalogArgs,
    /// Only this app's machines.
    #[arg(long)]
    app: Option<String>,
    /// Include destroyed machines not yet collected.
    #[arg(long)]
    all: bool,
}

/// The host-interface client of `conn`.
fn catalog_client(conn: &CatalogArgs) -> anyhow::Result<HostClient> {
    conn.conn.client()
}

/// `bazaar hosts`.
pub async fn hosts(a: CatalogArgs) -> anyhow::Result<()> {
    let hosts = catalog_client(&a)?.catalog_hosts().await?;
    if a.json {
        return print_sorted_json(&hosts);
    }
    let mut t = Table::new();
    t.set_header([
        "host",
        "region",
        "status",
        "api",
        "machines",
        "free mem (MB)",
        "free cpus",
        "updated",
        "gvisor",
        "microvm",
        "cannot run",
    ]);
    for h in hosts {
        // What the host said it lacks for a driver (its `cannot_run_<driver>` labels).
        let cannot_run = bazaar_types::host::cannot_run_any(&h.labels)
            .map(|(driver, why)| format!("{driver}: missing {why}"))
            .collect::<Vec<_>>()
            .join("; ");
        let status = if h.draining {
            format!("{}, draining", h.status)
        } else {
            h.status
        };
        t.add_row([
            h.id,
            h.region,
            status,
            h.api_addr,
            h.num_machines.to_string(),
            format!("{} / {}", h.free.memory_mb, h.capacity.memory_mb),
            format!("{} / {}", h.free.cpus, h.capacity.cpus),
            h.updated_at,
            // The platform gVisor machines run on there (chosen at its start).
            h.labels
                .get(bazaar_types::host::GVISOR_PLATFORM_LABEL)
                .cloned()
                .unwrap_or_else(|| "-".into()),
            // The accelerator microVMs run with there (`kvm`, or `tcg` where allowed).
            h.labels
                .get(bazaar_agent::microvm::ACCEL_LABEL)
                .cloned()
                .unwrap_or_else(|| "-".into()),
            cannot_run,
        ]);
    }
    println!("{t}");
    Ok(())
}

/// `bazaar status`.
pub async fn status(a: StatusArgs) -> anyhow::Result<()> {
    let machines = catalog_client(&a.conn)?
        .catalog_machines(a.app.as_deref(), a.all)
        .await?;
    if a.conn.json {
        return print_sorted_json(&machines);
    }
    let mut t = Table::new();
    t.set_header([
        "id",
        "app",
        "name",
        "region",
        "state",
        "host",
        "host status",
        "services",
        "updated",
    ]);
    for m in machines {
        let services = m
            .services
            .iter()
            .map(|s| format!("{}->{}:{}", s.internal_port, s.address, s.port))
            .collect::<Vec<_>>()
            .join(",");
        t.add_row([
            m.id,
            m.app,
            m.name,
            m.region,
            m.state,
            m.host_id,
            m.host_status,
            services,
            m.updated_at,
        ]);
    }
    println!("{t}");
    Ok(())
}

/// Prints an answer as the server sent it: pretty JSON, keys sorted.
pub(crate) fn print_sorted_json<T: serde::Serialize>(v: &T) -> anyhow::Result<()> {
    print_json(&serde_json::to_value(v)?)
}
