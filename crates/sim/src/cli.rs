//! `bazaar sim`: builds a scenario from a TOML file and flags, runs every policy on it,
//! prints the comparison table (deterministic: no wall-clock figures on stdout; those go to
//! stderr), writes CSV and SVG with `--out`, runs the theory checks with `--theory` and the oversubscription experiment with
//! `--reclaim`.

use crate::config::{Failures, Lifetime, Scenario};
use crate::{engine, policy, report, theory};
use anyhow::Context;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

/// Flags of `bazaar sim`. Flags override the scenario file's fields.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct SimArgs {
    /// Scenario file (TOML; missing fields take the defaults, see --print-scenario).
    #[arg(long, value_name = "FILE.toml")]
    pub scenario: Option<PathBuf>,
    /// Scenario name (prefixes the files written by --out).
    #[arg(long)]
    pub name: Option<String>,
    /// Hosts in the fleet.
    #[arg(long)]
    pub hosts: Option<usize>,
    /// Regions (hosts are spread evenly over them).
    #[arg(long)]
    pub regions: Option<usize>,
    /// Machines to place in total.
    #[arg(long)]
    pub placements: Option<u64>,
    /// Policies to compare, comma-separated (see --list-policies).
    #[arg(long, value_delimiter = ',')]
    pub policies: Vec<String>,
    /// Seed of every random stream: same seed, same output.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Exchanges (API nodes) placing concurrently.
    #[arg(long)]
    pub exchanges: Option<usize>,
    /// Mean age of an exchange's view of the hosts (gossip delay).
    #[arg(long)]
    pub gossip_delay_ms: Option<f64>,
    /// Round trip exchange ↔ host (plus exponential jitter, --rtt-jitter-ms).
    #[arg(long)]
    pub rtt_ms: Option<f64>,
    #[arg(long)]
    pub rtt_jitter_ms: Option<f64>,
    /// Target memory utilization (sets the arrival rate when --rate is not given).
    #[arg(long)]
    pub load: Option<f64>,
    /// Requests per second (Poisson).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Share of requests that are deploys of --deploy-count machines at once.
    #[arg(long)]
    pub deploy_fraction: Option<f64>,
    #[arg(long)]
    pub deploy_count: Option<u32>,
    /// Mean machine lifetime (exponential; Pareto with --pareto-alpha).
    #[arg(long)]
    pub lifetime_s: Option<f64>,
    #[arg(long)]
    pub pareto_alpha: Option<f64>,
    /// Machines never leave (fill the fleet; needs --rate).
    #[arg(long)]
    pub forever: bool,
    /// Mean time between failures of each host, in hours (0: none).
    #[arg(long)]
    pub mtbf_hours: Option<f64>,
    /// Bidding rounds before insufficient_capacity.
    #[arg(long)]
    pub rounds: Option<u32>,
    /// Directory for CSV and SVG files.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Also print the table as Markdown.
    #[arg(long)]
    pub markdown: bool,
    /// Run the oversubscription experiment instead: services with a daily load plus batch
    /// work, without reclamation, with reclamation and preemption, with reclamation only
    /// (uses --hosts, default 200, and --seed).
    #[arg(long)]
    pub reclaim: bool,
    /// Run the theory checks (balls into bins, supermarket model, JIQ) instead.
    #[arg(long)]
    pub theory: bool,
    /// With --theory: the larger sizes (a few seconds in release).
    #[arg(long)]
    pub full: bool,
    /// Check every ledger's invariant after every change (slower).
    #[arg(long)]
    pub check_invariants: bool,
    /// List the policies and exit.
    #[arg(long)]
    pub list_policies: bool,
    /// Print the resulting scenario as TOML and exit.
    #[arg(long)]
    pub print_scenario: bool,
}

/// Runs `bazaar sim`, printing to stdout.
pub fn run(args: SimArgs) -> anyhow::Result<()> {
    let stdout = std::io::stdout();
    let mut lock = stdout.lock();
    execute(&args, &mut lock)
}

/// Builds the scenario the flags describe.
pub fn scenario(args: &SimArgs) -> anyhow::Result<Scenario> {
    let mut s = match &args.scenario {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            let mut s = Scenario::from_toml(&text)?;
            if s.name == Scenario::default().name {
                if let Some(stem) = path.file_stem() {
                    s.name = stem.to_string_lossy().into_owned();
                }
            }
            s
        }
        None => Scenario::default(),
    };
    macro_rules! set {
        ($($field:ident <- $flag:ident),*) => {$(
            if let Some(v) = args.$flag.clone() { s.$field = v; }
        )*};
    }
    set!(name <- name, hosts <- hosts, regions <- regions, placements <- placements,
         seed <- seed, exchanges <- exchanges, gossip_delay_ms <- gossip_delay_ms,
         rtt_ms <- rtt_ms, rtt_jitter_ms <- rtt_jitter_ms, load <- load, rate_per_s <- rate,
         deploy_fraction <- deploy_fraction, deploy_count <- deploy_count, rounds <- rounds);
    if !args.policies.is_empty() {
        s.policies = args.policies.clone();
    }
    if let Some(mean_s) = args.lifetime_s {
        s.lifetime = match args.pareto_alpha {
            Some(alpha) => Lifetime::Pareto { mean_s, alpha },
            None => Lifetime::Exponential { mean_s },
        };
    }
    if args.forever {
        s.lifetime = Lifetime::Forever;
    }
    if let Some(mtbf_hours) = args.mtbf_hours {
        s.failures = (mtbf_hours > 0.0).then_some(Failures {
            mtbf_hours,
            repair_s: 600.0,
            replace_lost: true,
        });
    }
    if args.check_invariants {
        s.check_invariants = true;
    }
    s.validate()?;
    Ok(s)
}

/// Runs `bazaar sim`, writing the deterministic output to `out` (wall times go to stderr).
pub fn execute(args: &SimArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    if args.list_policies {
        for (name, what) in policy::POLICIES {
            writeln!(out, "{name:20} {what}")?;
        }
        return Ok(());
    }
    if args.reclaim {
        let hosts = args.hosts.unwrap_or(200);
        write!(
            out,
            "{}",
            crate::reclaim::report(hosts, 2, args.seed.unwrap_or(1))
        )?;
        return Ok(());
    }
    if args.theory {
        let started = Instant::now();
        write!(out, "{}", theory::report(args.full, args.seed.unwrap_or(1)))?;
        eprintln!(
            "theory checks: {:.1} s wall",
            started.elapsed().as_secs_f64()
        );
        return Ok(());
    }
    let s = scenario(args)?;
    if args.print_scenario {
        write!(out, "{}", toml::to_string(&s)?)?;
        return Ok(());
    }
    let runs = simulate(&s)?;
    write!(out, "{}", report::table(&s, &runs))?;
    if args.markdown {
        writeln!(out)?;
        write!(out, "{}", report::markdown(&runs))?;
    }
    if let Some(dir) = &args.out {
        report::write_files(dir, &s, &runs)?;
        writeln!(out, "wrote {}/{}-*.csv and *.svg", dir.display(), s.name)?;
    }
    Ok(())
}

/// Runs every policy of the scenario, one after the other; reports wall time on stderr.
pub fn simulate(s: &Scenario) -> anyhow::Result<Vec<crate::metrics::Summary>> {
    let mut runs = Vec::new();
    for p in &s.policies {
        let started = Instant::now();
        let r = engine::run(s, p)?;
        eprintln!(
            "{p}: {} machines, {} events, {:.0} s virtual, {:.2} s wall",
            r.machines,
            r.events,
            r.virtual_s,
            started.elapsed().as_secs_f64()
        );
        runs.push(r);
    }
    Ok(runs)
}
