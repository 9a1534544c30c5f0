//! `bazaar lab ...`: a fleet of hosts in network namespaces on this machine, and the
//! faults to inject into it. A thin front over [`bazaar_lab::Lab`]; each subcommand opens
//! the lab from its directory's state file, acts and returns.

use bazaar_lab::faults::FaultOptions;
use bazaar_lab::{AgentSettings, Lab, UpOptions};
use std::path::PathBuf;
use std::time::Duration;

/// Flags of `bazaar lab`.
#[derive(Debug, clap::Args)]
pub struct LabArgs {
    /// Where the lab keeps its state, env file, host data and logs.
    #[arg(long, global = true, default_value = ".bazaar-lab")]
    dir: PathBuf,
    #[command(subcommand)]
    command: LabCommand,
}

#[derive(Debug, clap::Subcommand)]
enum LabCommand {
    /// Create the lab's network and start one agent per host; prints the API URLs.
    Up(UpArgs),
    /// Each host: address, region, agent state, memory, faults.
    Status,
    /// Cut hosts from hosts: `lab partition h1,h2 / h3` (both ways unless --oneway).
    Partition {
        /// Only what the first side sends is dropped.
        #[arg(long)]
        oneway: bool,
        /// `A,B / C,D`.
        #[arg(required = true, num_args = 1..)]
        sides: Vec<String>,
    },
    /// End every partition and packet loss; free filled disks.
    Heal,
    /// Lose a share of the packets a host sends and receives: `lab loss h2 20%`.
    Loss { host: String, percent: String },
    /// SIGSTOP a host's agent (a gray failure).
    Freeze { host: String },
    /// SIGCONT a host's agent.
    Thaw { host: String },
    /// SIGKILL a host's agent; its machines keep running.
    Kill { host: String },
    /// Power loss: a host's agent, shims and workloads die at once.
    Crash { host: String },
    /// Start a host's agent again (stopping it first if it runs).
    Restart { host: String },
    /// Replace a host's agent by another `bazaar` binary; its machines keep running.
    Upgrade {
        host: String,
        #[arg(long)]
        binary: PathBuf,
    },
    /// Fill a host's data dir (needs `up --small-disk`) until the disk is full.
    FillDisk { host: String },
    /// Remove what fill-disk wrote.
    FreeDisk { host: String },
    /// Remove the lab: processes, namespaces, links, rules, mounts (logs stay).
    Down,
    /// The fault suite: a lab of its own in DIR, each fault injected under a workload,
    /// healed and checked (docs/RELIABILITY.md); prints the matrix, fails on a violation.
    Faults(FaultsArgs),
}

#[derive(Debug, clap::Args)]
struct FaultsArgs {
    /// Every fault several times on 4 hosts with more clients (the soak run).
    #[arg(long)]
    long: bool,
    /// Only these faults (default: all).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Rounds (default: 1, or 3 with --long).
    #[arg(long)]
    rounds: Option<usize>,
    /// Also write the matrix (markdown) to this file.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Hosts reclaim (`[reclaim] enabled`, measured every 0.5 s) and the workload mixes
    /// `batch` and `default` machines (docs/POLICY.md).
    #[arg(long)]
    policies: bool,
}

#[derive(Debug, clap::Args)]
struct UpArgs {
    /// Number of hosts.
    #[arg(long, default_value_t = 3)]
    hosts: usize,
    /// Regions, assigned to hosts in turn (e.g. `ams,ord`).
    #[arg(long, default_value = "local", value_delimiter = ',')]
    regions: Vec<String>,
    /// The lab's subnet (default: the first free /24 of 10.250.0.0/16).
    #[arg(long)]
    subnet: Option<String>,
    /// Each host's data dir on a small ext4 disk of its own (for `fill-disk`).
    #[arg(long)]
    small_disk: bool,
    /// Memory (MB) each host offers; default: what this machine has.
    #[arg(long)]
    memory_mb: Option<u64>,
    /// CPUs each host offers; default: detected × overcommit.
    #[arg(long)]
    cpus: Option<u32>,
    /// A dead host is noticed within about this long (ms; the agent's default otherwise).
    #[arg(long)]
    dead_after_ms: Option<u64>,
    /// A dead host's machines that opted in are re-placed after this long (ms; the agent's
    /// default otherwise).
    #[arg(long)]
    replace_after_ms: Option<u64>,
    /// Also wait until every host sees every other alive in its catalog.
    #[arg(long)]
    wait_converged: bool,
    /// An agent config file (TOML: `[reclaim]`, `[burst]`, ..., docs/CONFIG.md) every host
    /// starts with.
    #[arg(long)]
    agent_config: Option<PathBuf>,
}

/// Runs one `bazaar lab` subcommand.
pub fn run(args: LabArgs) -> anyhow::Result<()> {
    let dir = args.dir;
    match args.command {
        LabCommand::Up(up) => return run_up(dir, up),
        LabCommand::Status => {
            let lab = Lab::open(&dir)?;
            print_status(&lab);
            return Ok(());
        }
        LabCommand::Down => {
            Lab::open(&dir)?.down()?;
            println!("lab down: {} removed", dir.display());
            return Ok(());
        }
        LabCommand::Faults(f) => return run_faults(dir, f),
        _ => {}
    }
    let mut lab = Lab::open(&dir)?;
    match args.command {
        LabCommand::Partition { oneway, sides } => {
            let (a, b) = bazaar_lab::plan::parse_sides(&sides).map_err(anyhow::Error::msg)?;
            lab.partition(&a, &b, oneway)?;
            let arrow = if oneway { "->" } else { "<->" };
            println!("partitioned {} {arrow} {}", a.join(","), b.join(","));
        }
        LabCommand::Heal => {
            lab.heal()?;
            println!("healed: no partition, no loss, no full disk");
        }
        LabCommand::Loss { host, percent } => {
            let p = bazaar_lab::plan::parse_percent(&percent).map_err(anyhow::Error::msg)?;
            lab.loss(&host, p)?;
            println!("{host} loses {p}% of its packets");
        }
        LabCommand::Freeze { host } => {
            lab.freeze(&host)?;
            println!("{host}: agent frozen");
        }
        LabCommand::Thaw { host } => {
            lab.thaw(&host)?;
            println!("{host}: agent thawed");
        }
        LabCommand::Kill { host } => {
            lab.kill(&host)?;
            println!("{host}: agent killed (machines keep running)");
        }
        LabCommand::Crash { host } => {
            lab.crash(&host)?;
            println!("{host}: crashed (agent, shims and workloads)");
        }
        LabCommand::Restart { host } => {
            lab.restart(&host)?;
            println!("{host}: agent restarted");
        }
        LabCommand::Upgrade { host, binary } => {
            lab.upgrade(&host, &binary)?;
            println!("{host}: agent now runs {}", binary.display());
        }
        LabCommand::FillDisk { host } => {
            let bytes = lab.fill_disk(&host)?;
            println!("{host}: disk full ({} KiB written)", bytes / 1024);
        }
        LabCommand::FreeDisk { host } => {
            lab.free_disk(&host)?;
            println!("{host}: disk freed");
        }
        LabCommand::Up(_) | LabCommand::Status | LabCommand::Down | LabCommand::Faults(_) => {
            unreachable!("handled above")
        }
    }
    Ok(())
}

fn run_up(dir: PathBuf, up: UpArgs) -> anyhow::Result<()> {
    for r in &up.regions {
        bazaar_types::ids::validate_name("region", r).map_err(anyhow::Error::msg)?;
    }
    let subnet = up
        .subnet
        .as_deref()
        .map(str::parse)
        .transpose()
        .map_err(anyhow::Error::msg)?;
    let config = match &up.agent_config {
        Some(file) => Some(
            std::fs::read_to_string(file)
                .map_err(|e| anyhow::anyhow!("reading the agent config {}: {e}", file.display()))?,
        ),
        None => None,
    };
    let started = std::time::Instant::now();
    let lab = Lab::up(UpOptions {
        dir,
        hosts: up.hosts,
        regions: up.regions,
        subnet,
        exe: std::env::current_exe()?,
        small_disk: up.small_disk,
        agent: AgentSettings {
            memory_mb: up.memory_mb,
            cpus: up.cpus,
            dead_after_ms: up.dead_after_ms,
            replace_after_ms: up.replace_after_ms,
            config,
        },
    })?;
    let plan = lab.plan();
    println!(
        "bazaar lab {}: {} host(s) on {} (bridge {} at {}), up in {} ms",
        plan.id,
        plan.hosts.len(),
        plan.subnet,
        plan.bridge(),
        plan.bridge_addr(),
        started.elapsed().as_millis()
    );
    if up.wait_converged {
        let took = lab.wait_converged(Duration::from_secs(120))?;
        println!(
            "every host sees all {} alive after {} ms more",
            plan.hosts.len(),
            took.as_millis()
        );
    }
    for h in &plan.hosts {
        println!(
            "  {:<4} region {:<8} {}  netns {}",
            h.name,
            h.region,
            lab.api_url(h),
            h.netns
        );
    }
    let first = &plan.hosts[0];
    println!("BAZAAR_API_URL={}", lab.api_url(first));
    println!(
        "BAZAAR_PROXY_URL={}  (apps at Host: <app>.localhost)",
        lab.proxy_url(first)
    );
    println!("BAZAAR_TOKEN={}", lab.token());
    println!(
        "written to {}; load it with: set -a; . {}; set +a",
        lab.env_file().display(),
        lab.env_file().display()
    );
    Ok(())
}

fn run_faults(dir: PathBuf, f: FaultsArgs) -> anyhow::Result<()> {
    let exe = std::env::current_exe()?;
    let mut opts = if f.long {
        FaultOptions::long(dir, exe)
    } else {
        FaultOptions::ci(dir, exe)
    };
    if !f.only.is_empty() {
        opts.faults = f.only;
    }
    if let Some(r) = f.rounds {
        opts.rounds = r;
    }
    opts.policies = f.policies;
    let started = std::time::Instant::now();
    let runs = bazaar_lab::faults::run(&opts, |run| {
        println!(
            "{} (round {}): {} ops, {} acknowledged, {} violation(s)",
            run.row.fault,
            run.round,
            run.row.tried,
            run.row.acknowledged,
            run.violations.len()
        );
        for v in &run.violations {
            println!("  {v}");
        }
    })?
    .runs;
    let matrix = bazaar_lab::faults::matrix(&runs);
    println!(
        "\n{matrix}\n{} run(s) in {} s",
        runs.len(),
        started.elapsed().as_secs()
    );
    if let Some(out) = f.out {
        std::fs::write(&out, &matrix)?;
    }
    let broken = runs.iter().filter(|r| !r.violations.is_empty()).count();
    anyhow::ensure!(broken == 0, "{broken} fault run(s) broke an invariant");
    Ok(())
}

fn print_status(lab: &Lab) {
    let mut table = comfy_table::Table::new();
    table.set_header(["HOST", "REGION", "ADDRESS", "AGENT", "PID", "RSS", "FAULTS"]);
    for h in lab.status() {
        table.add_row([
            h.name,
            h.region,
            h.addr.to_string(),
            h.agent.as_str().to_string(),
            h.pid.map(|p| p.to_string()).unwrap_or_default(),
            h.rss_kib
                .map(|k| format!("{} MiB", k / 1024))
                .unwrap_or_default(),
            h.faults.join("; "),
        ]);
    }
    println!(
        "lab {} on {} (bridge {})",
        lab.plan().id,
        lab.plan().subnet,
        lab.plan().bridge()
    );
    println!("{table}");
}
