//! User commands over the Machines API (`/v1`): `bazaar apps ...`, `bazaar machine ...`
//! (tokens: `token_cmd.rs`). They read `BAZAAR_API_URL` and `BAZAAR_TOKEN`; tables by
//! default, `--json` for scripts.

use anyhow::{bail, Context};
use bazaar_client::fly::{ApiError, FlyClient, FlyOptions, LeaseRequest};
use bazaar_placement::exchange::PlacementRecord;
use bazaar_types::api::{CreateMachineRequest, UpdateMachineRequest};
use bazaar_types::config::{InitConfig, MachineConfig, MachineService, RestartConfig};
use bazaar_types::machine::{LogLine, Machine};
use comfy_table::Table;
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;

/// Where the API is and how to authenticate.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Conn {
    #[arg(
        long,
        env = "BAZAAR_API_URL",
        default_value = "http://127.0.0.1:4280",
        global = true
    )]
    api_url: String,
    #[arg(long, env = "BAZAAR_TOKEN", hide_env_values = true, global = true)]
    token: Option<String>,
    /// The cluster CA certificate (PEM) to trust for an API served over HTTPS with a
    /// certificate of the cluster (`bazaar agent --api-tls`; `bazaar dev` writes its path).
    #[arg(long, env = "BAZAAR_CA_CERT", global = true)]
    ca_cert: Option<std::path::PathBuf>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
}

impl Conn {
    /// True when the user asked for JSON.
    pub(crate) fn json(&self) -> bool {
        self.json
    }

    /// The typed Machines API client of this connection.
    pub(crate) fn client(&self) -> anyhow::Result<FlyClient> {
        let token = self.token.as_deref().context(
            "no token: set BAZAAR_TOKEN (bazaar dev writes it to .bazaar-dev/dev.env) or pass --token",
        )?;
        let ca_pem = match &self.ca_cert {
            Some(path) => Some(
                std::fs::read(path)
                    .with_context(|| format!("reading the CA certificate {}", path.display()))?,
            ),
            None => None,
        };
        let options = FlyOptions {
            ca_pem,
            timeout: None,
        };
        FlyClient::with_options(&self.api_url, token, &options).with_context(|| {
            match &self.ca_cert {
                Some(path) => format!("{}: not a PEM certificate", path.display()),
                None => "setting up the HTTP client".to_string(),
            }
        })
    }
}

/// `bazaar apps`.
#[derive(Debug, clap::Args)]
pub struct AppsArgs {
    #[command(flatten)]
    conn: Conn,
    #[command(subcommand)]
    command: AppsCommand,
}

#[derive(Debug, clap::Subcommand)]
enum AppsCommand {
    /// Create an app.
    Create {
        name: String,
        #[arg(long, default_value = "personal")]
        org: String,
    },
    /// List apps.
    List,
    /// Destroy an app and its machines.
    Destroy { name: String },
}

/// Runs `bazaar apps`.
pub async fn apps(a: AppsArgs) -> anyhow::Result<()> {
    let c = &a.conn;
    let api = c.client()?;
    match a.command {
        AppsCommand::Create { name, org } => {
            let created = api.create_app(&name, &org).await?;
            out(c, &created, || println!("created app {}", created.name))
        }
        AppsCommand::List => {
            let list = api.apps().await?;
            out(c, &list, || {
                let mut t = Table::new();
                t.set_header(["name", "org", "machines", "status"]);
                for app in &list.apps {
                    t.add_row([
                        app.name.clone(),
                        app.organization.slug.clone(),
                        app.machine_count.to_string(),
                        app.status.clone(),
                    ]);
                }
                println!("{t}");
            })
        }
        AppsCommand::Destroy { name } => {
            let v = api.destroy_app(&name).await?;
            out(c, &v, || println!("destroying app {name} and its machines"))
        }
    }
}

/// `bazaar machine`.
#[derive(Debug, clap::Args)]
pub struct MachineArgs {
    #[command(flatten)]
    conn: Conn,
    /// The app.
    #[arg(long, short, env = "BAZAAR_APP", global = true)]
    app: Option<String>,
    #[command(subcommand)]
    command: MachineCommand,
}

#[derive(Debug, clap::Subcommand)]
enum MachineCommand {
    /// Create (and start) machines running a command, or an image (`--image`), placed by
    /// the market.
    Run {
        /// Run this OCI image (e.g. `127.0.0.1:5000/web:1`) under runc; a command after
        /// `--` then replaces the image's.
        #[arg(long)]
        image: Option<String>,
        /// Region expression: `ams`, `ams,ord`, `any` (default: this node's region, then any).
        #[arg(long)]
        region: Option<String>,
        #[arg(long, default_value = "shared-cpu-1x")]
        size: String,
        #[arg(long)]
        memory_mb: Option<i64>,
        #[arg(long)]
        name: Option<String>,
        /// Internal ports of services (repeatable); the workload reads its port in $PORT.
        #[arg(long = "port")]
        ports: Vec<u16>,
        #[arg(long = "env")]
        env: Vec<String>,
        /// no, always, on-failure.
        #[arg(long)]
        restart: Option<String>,
        /// How many machines (batch placement).
        #[arg(long, default_value_t = 1)]
        count: usize,
        #[arg(long)]
        skip_launch: bool,
        /// Return once the machine is created, without waiting for it to start.
        #[arg(long, short)]
        detach: bool,
        #[arg(last = true, required_unless_present = "image")]
        command: Vec<String>,
    },
    /// Change a machine's image, command or environment (it restarts with them).
    Update {
        id: String,
        #[arg(long)]
        image: Option<String>,
        /// KEY=VALUE (repeatable), added to its environment.
        #[arg(long = "env")]
        env: Vec<String>,
        /// Return without waiting for it to start again.
        #[arg(long, short)]
        detach: bool,
        /// The new command.
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// List the app's machines.
    List,
    /// Show a machine.
    Status {
        id: String,
    },
    /// Start a machine and wait until it runs.
    Start {
        id: String,
        /// Return without waiting for it to start.
        #[arg(long, short)]
        detach: bool,
    },
    Stop {
        id: String,
    },
    /// Restart a machine and wait until it runs again.
    Restart {
        id: String,
        /// Return without waiting for it to start again.
        #[arg(long, short)]
        detach: bool,
    },
    /// Freeze a machine (start resumes it).
    Suspend {
        id: String,
    },
    /// Destroy a machine that is not running (stop it first, or pass --force).
    Destroy {
        id: String,
        /// Kill it at once if it is running (or starting, or suspended).
        #[arg(long)]
        force: bool,
    },
    /// Run a command inside a machine.
    Exec {
        id: String,
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Show a machine's output.
    Logs {
        id: String,
        #[arg(long, short)]
        follow: bool,
    },
    /// Why a machine landed where it did.
    Explain {
        id: String,
        /// Where its last start's time went instead: the placement and each launch step, in
        /// milliseconds (recorded in the start event)
        #[arg(long)]
        timing: bool,
    },
    /// Take a lease (prints the nonce), or release one with --release NONCE.
    Lease {
        id: String,
        #[arg(long, default_value_t = 120)]
        ttl: u64,
        #[arg(long)]
        release: Option<String>,
    },
}

/// Runs `bazaar machine`.
pub async fn machine(a: MachineArgs) -> anyhow::Result<()> {
    let c = &a.conn;
    let app = a
        .app
        .clone()
        .context("which app? pass --app or set BAZAAR_APP")?;
    let api = c.client()?;
    match a.command {
        MachineCommand::Run {
            image,
            region,
            size,
            memory_mb,
            name,
            ports,
            env,
            restart,
            count,
            skip_launch,
            detach,
            command,
        } => {
            let mut guest =
                bazaar_types::guest::Guest::preset(&size).map_err(anyhow::Error::msg)?;
            if let Some(mb) = memory_mb {
                guest.memory_mb = mb;
            }
            let mut config = MachineConfig {
                image: "process".into(),
                driver: Some("process".into()),
                guest: Some(guest),
                init: Some(InitConfig {
                    exec: command.clone(),
                    ..Default::default()
                }),
                env: parse_env(&env)?,
                services: ports
                    .iter()
                    .map(|p| MachineService {
                        internal_port: *p,
                        protocol: "tcp".into(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            };
            if let Some(image) = image {
                config.image = image;
                config.driver = None;
                if command.is_empty() {
                    config.init = None;
                }
            }
            if let Some(r) = restart {
                let policy = serde_json::from_value(Value::String(r.clone()))
                    .map_err(|_| anyhow::anyhow!("--restart {r}: use no, always or on-failure"))?;
                config.restart = Some(RestartConfig {
                    policy,
                    max_retries: None,
                });
            }
            let mut req = CreateMachineRequest {
                config,
                name,
                region,
                skip_launch,
                ..Default::default()
            };
            let machines = if count > 1 {
                req.count = Some(count);
                api.create_machines(&app, &req).await?.machines
            } else {
                vec![api.create_machine(&app, &req).await?]
            };
            let machines = if skip_launch || detach {
                machines
            } else {
                until_all_running(&api, &app, &machines).await?
            };
            out(c, &machines, || {
                for mm in &machines {
                    println!(
                        "machine {} ({}) on host {} in {}",
                        mm.id, mm.name, mm.host_id, mm.region
                    );
                }
            })
        }
        MachineCommand::List => {
            let machines = api.machines(&app).await?;
            out(c, &machines, || print_machines(&machines))
        }
        MachineCommand::Status { id } => {
            let m = api.machine(&app, &id).await?;
            out(c, &m, || print_machines(std::slice::from_ref(&m)))
        }
        MachineCommand::Start { id, detach } => {
            act_and_wait(c, &api, &app, &id, Act::Post("start"), detach, "started").await
        }
        MachineCommand::Stop { id } => {
            let v = api.action(&app, &id, "stop", None, None).await?;
            out(c, &v, || println!("stopping {id}"))
        }
        MachineCommand::Restart { id, detach } => {
            act_and_wait(
                c,
                &api,
                &app,
                &id,
                Act::Post("restart"),
                detach,
                "restarted",
            )
            .await
        }
        MachineCommand::Update {
            id,
            image,
            env,
            detach,
            command,
        } => {
            let mut config = api.machine(&app, &id).await?.config;
            if let Some(image) = image {
                config.image = image;
            }
            config.env.extend(parse_env(&env)?);
            if !command.is_empty() {
                config.init.get_or_insert_with(Default::default).exec = command;
            }
            let update = UpdateMachineRequest {
                config,
                skip_launch: false,
            };
            act_and_wait(
                c,
                &api,
                &app,
                &id,
                Act::Update(Box::new(update)),
                detach,
                "updated",
            )
            .await
        }
        MachineCommand::Suspend { id } => {
            let v = api.action(&app, &id, "suspend", None, None).await?;
            out(c, &v, || println!("suspending {id}"))
        }
        MachineCommand::Destroy { id, force } => {
            match api.destroy_machine(&app, &id, force, None).await {
                Ok(v) => out(c, &v, || println!("destroying {id}")),
                Err(e) if !force && e.to_string().contains("force=true") => {
                    Err(anyhow::Error::from(e).context(format!(
                        "machine {id} is running: stop it first, or pass --force to kill and destroy it"
                    )))
                }
                Err(e) => Err(e.into()),
            }
        }
        MachineCommand::Exec { id, command } => {
            let r = api.exec(&app, &id, &command).await?;
            out(c, &r, || {
                print!("{}", r.stdout);
                eprint!("{}", r.stderr);
                if r.exit_code != 0 {
                    eprintln!("exit code {}", r.exit_code);
                }
            })
        }
        MachineCommand::Logs { id, follow } => {
            let mut resp = match api.logs(&app, &id, follow).await {
                Err(ApiError::Status { message, .. }) => bail!("{message}"),
                other => other?,
            };
            let mut pending = String::new();
            while let Some(chunk) = resp.chunk().await? {
                pending.push_str(&String::from_utf8_lossy(&chunk));
                while let Some(pos) = pending.find('\n') {
                    let line: String = pending.drain(..=pos).collect();
                    // A workload's own bytes: escaped on a terminal (`crate::term`).
                    match serde_json::from_str::<LogLine>(line.trim()) {
                        Ok(l) if !c.json => println!("{}", crate::term::for_stdout(&l.line)),
                        Ok(_) => print!("{}", crate::term::json_for_stdout(&line)),
                        Err(_) => println!("{}", crate::term::for_stdout(line.trim_end())),
                    }
                }
            }
            Ok(())
        }
        MachineCommand::Explain { id, timing: true } => {
            let placement = api.placement(&app, &id).await.ok().map(|p| p.elapsed_us);
            let events = api.events(&app, &id).await?;
            let t = crate::launch_timing::of(&events, placement)
                .context("no start of this machine recorded its timing")?;
            out(c, &t, || println!("{}", crate::launch_timing::render(&t)))
        }
        MachineCommand::Explain { id, .. } => {
            let p = api.placement(&app, &id).await?;
            out(c, &p, || print_placement(&p))
        }
        MachineCommand::Lease { id, ttl, release } => {
            if let Some(nonce) = release {
                if let Err(e) = api.release_lease(&app, &id, &nonce).await {
                    match e {
                        ApiError::Status { message, .. } => bail!("{message}"),
                        other => return Err(other.into()),
                    }
                }
                println!("released");
                return Ok(());
            }
            let req = LeaseRequest {
                ttl: Some(ttl),
                description: None,
            };
            let lease = api.lease(&app, &id, &req, None).await?;
            out(c, &lease, || {
                println!(
                    "lease nonce {} (expires at {})",
                    lease.data.nonce, lease.data.expires_at
                )
            })
        }
    }
}

/// `bazaar machine explain`: the exchange's rounds, host by host, and who won.
fn print_placement(p: &PlacementRecord) {
    use bazaar_placement::exchange::AskOutcome;
    println!(
        "placement {} for {} cpu(s) / {} MB in {:?}: {}",
        p.placement_id, p.size.cpus, p.size.memory_mb, p.regions, p.reason
    );
    let mut t = Table::new();
    t.set_header(["round", "host", "answer", "µs"]);
    for (i, r) in p.rounds.iter().enumerate() {
        for ask in &r.asked {
            let answer = match &ask.outcome {
                AskOutcome::Bid { score, victims, .. } if !victims.is_empty() => {
                    format!("preemption bid {score:.3}, stopping {}", victims.join(", "))
                }
                AskOutcome::Bid { score, .. } => format!("bid {score:.3}"),
                AskOutcome::Refused { reason } => format!("refused: {reason}"),
                AskOutcome::NoAnswer { error } => format!("no_answer: {error}"),
                AskOutcome::ClaimFailed { error } => format!("claim_failed: {error}"),
            };
            t.add_row([
                (i + 1).to_string(),
                ask.host_id.clone(),
                answer,
                ask.elapsed_us.to_string(),
            ]);
        }
    }
    println!("{t}");
    for e in &p.excluded {
        println!("excluded {}: {}", e.host_id, e.reason);
    }
    if !p.verdicts.is_empty() {
        // Each host's verdict under the machine's `config.placement`.
        let mut t = Table::new();
        t.set_header(["host", "verdict", "affinity", "spread"]);
        for v in &p.verdicts {
            t.add_row([
                v.host_id.clone(),
                v.excluded.clone().unwrap_or_else(|| "may take it".into()),
                format!("{:+.2}", v.affinity),
                format!("{:+.2}", v.spread),
            ]);
        }
        println!("placement policy, host by host:\n{t}");
    }
    println!("winner: {}", Value::from(p.winners.clone()));
}

/// `KEY=VALUE` pairs of `--env`.
fn parse_env(env: &[String]) -> anyhow::Result<BTreeMap<String, String>> {
    env.iter()
        .map(|kv| {
            let (k, v) = kv.split_once('=').context("--env takes KEY=VALUE")?;
            Ok((k.to_string(), v.to_string()))
        })
        .collect()
}

/// Waits until every machine of a `run` runs (in parallel); fails with the first failure.
async fn until_all_running(
    api: &FlyClient,
    app: &str,
    machines: &[Machine],
) -> anyhow::Result<Vec<Machine>> {
    let mut waits = tokio::task::JoinSet::new();
    for (i, mm) in machines.iter().enumerate() {
        let (api, app, id) = (api.clone(), app.to_string(), mm.id.clone());
        waits.spawn(async move {
            let none = std::collections::HashSet::new();
            (
                i,
                crate::machine_wait::until_running(&api, &app, &id, &none).await,
            )
        });
    }
    let mut out = machines.to_vec();
    while let Some(joined) = waits.join_next().await {
        let (i, result) = joined?;
        out[i] = result?;
    }
    Ok(out)
}

/// What `act_and_wait` does to the machine.
enum Act {
    /// A POST to this sub-resource (`start`, `restart`).
    Post(&'static str),
    /// A config update.
    Update(Box<UpdateMachineRequest>),
}

/// Does `act` on machine `id`, then, unless `detach`, waits until it runs and says so (or
/// fails saying why).
async fn act_and_wait(
    c: &Conn,
    api: &FlyClient,
    app: &str,
    id: &str,
    act: Act,
    detach: bool,
    done: &str,
) -> anyhow::Result<()> {
    let seen = if detach {
        Default::default()
    } else {
        crate::machine_wait::seen_events(api, app, id).await?
    };
    let answer = match act {
        Act::Post(action) => api.action(app, id, action, None, None).await?,
        Act::Update(update) => {
            serde_json::to_value(api.update_machine(app, id, &update, None).await?)?
        }
    };
    if detach {
        return out(c, &answer, || {
            println!("machine {id}: {done}, not waiting for it to run")
        });
    }
    let machine = crate::machine_wait::until_running(api, app, id, &seen).await?;
    out(c, &machine, || {
        println!("machine {id} {done}: {}", machine.state)
    })
}

/// A free-form JSON value as text: a string as itself, null as nothing.
pub(crate) fn s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// Prints `v` as JSON (`--json`), or runs `human`.
pub(crate) fn out<T: Serialize>(c: &Conn, v: &T, human: impl FnOnce()) -> anyhow::Result<()> {
    if c.json {
        // Through a JSON value: keys print sorted, as the API's answers always have.
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::to_value(v)?)?
        );
    } else {
        human();
    }
    Ok(())
}

/// Prints an object's fields as a two-column table (`volumes show`, `certs show`), keys
/// sorted.
pub(crate) fn print_fields<T: Serialize>(v: &T) {
    let mut t = Table::new();
    t.set_header(["field", "value"]);
    if let Ok(Value::Object(fields)) = serde_json::to_value(v) {
        for (k, val) in &fields {
            t.add_row([k.clone(), s(val)]);
        }
    }
    println!("{t}");
}

fn print_machines(machines: &[Machine]) {
    let mut t = Table::new();
    t.set_header([
        "id",
        "name",
        "state",
        "runtime",
        "region",
        "host",
        "host status",
        "version",
        "updated",
    ]);
    for m in machines {
        t.add_row([
            m.id.clone(),
            m.name.clone(),
            m.state.to_string(),
            m.config.runtime().to_string(),
            m.region.clone(),
            m.host_id.clone(),
            m.host_status.clone(),
            m.instance_id.clone(),
            m.updated_at.clone(),
        ]);
    }
    println!("{t}");
}
