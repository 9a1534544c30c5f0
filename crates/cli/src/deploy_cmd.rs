//! Apps as code ([`bazaar_deploy`]): `bazaar deploy`, `bazaar releases`,
//! `bazaar rollback`, `bazaar scale count|vm`, `bazaar app-status` and `bazaar logs`.
//! Progress goes to stderr (a spinner and a bar on a terminal, plain lines otherwise);
//! results to stdout, as tables or, with `--json`, as JSON. A failed deploy exits 1.

use anyhow::Context;
use bazaar_deploy::api::{ApiError, Client};
use bazaar_deploy::config::{AppConfig, MaxUnavailable, Strategy};
use bazaar_deploy::ops::{self, Initial, Outcome, Settings};
use bazaar_deploy::progress::{Event, Progress, Silent};
use bazaar_types::machine::Machine;
use comfy_table::Table;
use serde_json::Value;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Where the API is, which app, output format.
#[derive(Debug, clap::Args)]
pub struct Target {
    #[arg(
        long,
        env = "BAZAAR_API_URL",
        default_value = "http://127.0.0.1:4280",
        global = true
    )]
    api_url: String,
    #[arg(long, env = "BAZAAR_TOKEN", hide_env_values = true, global = true)]
    token: Option<String>,
    /// The app (default: `app` of the config file).
    #[arg(long, short, env = "BAZAAR_APP", global = true)]
    app: Option<String>,
    /// The app config file (default: ./bazaar.toml, else ./fly.toml).
    #[arg(long, short, global = true)]
    config: Option<PathBuf>,
    /// Print JSON instead of tables and progress.
    #[arg(long, global = true)]
    json: bool,
}

impl Target {
    fn client(&self) -> anyhow::Result<Client> {
        let token = self.token.clone().context(
            "no token: set BAZAAR_TOKEN (bazaar dev writes it to .bazaar-dev/dev.env) or pass --token",
        )?;
        Ok(Client::new(&self.api_url, &token))
    }

    fn config_path(&self) -> Option<PathBuf> {
        self.config.clone().or_else(|| {
            ["bazaar.toml", "fly.toml"]
                .into_iter()
                .map(PathBuf::from)
                .find(|p| p.exists())
        })
    }

    /// Loads the config file with what the command line sets over it, printing its
    /// warnings.
    fn load_with(&self, overrides: &bazaar_deploy::config::Overrides) -> anyhow::Result<AppConfig> {
        let path = self
            .config_path()
            .context("no app config: pass --config FILE or create bazaar.toml (or fly.toml)")?;
        let loaded = bazaar_deploy::config::load_with(&path, overrides)?;
        for w in &loaded.warnings {
            eprintln!("warning: {w}");
        }
        let mut config = loaded.config;
        if let Some(app) = &self.app {
            config.app = app.clone();
        }
        Ok(config)
    }

    fn app(&self) -> anyhow::Result<String> {
        if let Some(a) = &self.app {
            return Ok(a.clone());
        }
        if let Some(path) = self.config_path() {
            if let Ok(l) = bazaar_deploy::config::load(&path) {
                return Ok(l.config.app);
            }
        }
        anyhow::bail!("which app? pass --app, set BAZAAR_APP, or run next to bazaar.toml")
    }

    fn progress(&self) -> Arc<dyn Progress> {
        if self.json {
            Arc::new(Silent)
        } else {
            Arc::new(Reporter::new())
        }
    }
}

/// How a deploy-like operation runs.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// rolling, canary, bluegreen or immediate (default: `[deploy] strategy`, else rolling).
    #[arg(long)]
    strategy: Option<Strategy>,
    /// Machines of a group replaced at once: a count, or a fraction (default 0.33).
    #[arg(long)]
    max_unavailable: Option<f64>,
    /// Per machine: started and healthy within this long (`30s`, `5m`).
    #[arg(long)]
    wait_timeout: Option<String>,
    /// The longest a cordoned machine is given to finish its in-flight requests before it
    /// is stopped (it is stopped as soon as they are done).
    #[arg(long, default_value_t = 30_000)]
    drain_ms: u64,
    /// Show the plan and stop.
    #[arg(long)]
    dry_run: bool,
    /// Do not roll back automatically when the deploy fails.
    #[arg(long)]
    no_rollback: bool,
}

impl RunArgs {
    fn settings(&self) -> anyhow::Result<Settings> {
        let max_unavailable = match self.max_unavailable {
            None => None,
            Some(v) if v >= 1.0 && v.fract() == 0.0 => Some(MaxUnavailable::Count(v as usize)),
            Some(v) if v > 0.0 && v < 1.0 => Some(MaxUnavailable::Fraction(v)),
            Some(v) => anyhow::bail!("--max-unavailable must be ≥ 1 or between 0 and 1, got {v}"),
        };
        let wait_timeout = self
            .wait_timeout
            .as_deref()
            .map(bazaar_types::duration::parse_go_duration)
            .transpose()
            .map_err(anyhow::Error::msg)?;
        Ok(Settings {
            strategy: self.strategy,
            max_unavailable,
            wait_timeout,
            drain: Duration::from_millis(self.drain_ms),
            dry_run: self.dry_run,
            rollback: !self.no_rollback,
        })
    }
}

/// `bazaar deploy`.
#[derive(Debug, clap::Args)]
pub struct DeployArgs {
    #[command(flatten)]
    target: Target,
    #[command(flatten)]
    run: RunArgs,
    /// Machines per process group on a first deploy (default 1).
    #[arg(long)]
    count: Option<usize>,
    /// Regions a first deploy spreads machines over (default: primary_region).
    #[arg(long, value_delimiter = ',')]
    regions: Vec<String>,
    /// Deploy this image (built elsewhere) instead of `[build] image`, as `fly deploy
    /// --image` does; the file's `[build]` build settings are then not used.
    #[arg(long, value_name = "REF")]
    image: Option<String>,
    /// Where an image built from the app's Dockerfile is pushed (`HOST[:PORT]`, a registry
    /// the cluster's hosts pull from); the deploy runs the pushed digest. Default: the
    /// cluster's own registry, on the agent of `--api-url` with the deploy's token.
    #[arg(long, env = "BAZAAR_REGISTRY", value_name = "HOST[:PORT]")]
    registry: Option<String>,
    /// A build argument for the Dockerfile (KEY=VALUE; repeatable; over `[build.args]`).
    #[arg(long = "build-arg", value_name = "KEY=VALUE")]
    build_args: Vec<String>,
    /// A secret for the build, as buildah's `--secret` takes it (id=NAME,src=FILE;
    /// repeatable): read by `RUN --mount=type=secret,id=NAME`, never kept in the image.
    #[arg(long = "build-secret", value_name = "id=NAME,src=FILE")]
    build_secrets: Vec<String>,
}

/// Runs `bazaar deploy`.
pub async fn deploy(a: DeployArgs) -> anyhow::Result<()> {
    let mut config = a.target.load_with(&bazaar_deploy::config::Overrides {
        image: a.image.clone(),
        ..Default::default()
    })?;
    if let (None, Some(dockerfile)) = (&config.build.image, config.build.dockerfile.clone()) {
        config.build.image = Some(if a.run.dry_run {
            format!("(built from {dockerfile})")
        } else {
            build_image(&a, &config).await?
        });
    }
    let client = a.target.client()?;
    let initial = Initial {
        count: a.count,
        regions: a.regions.clone(),
    };
    let s = a.run.settings()?;
    let progress = a.target.progress();
    if !a.target.json {
        eprintln!("deploying {} ...", config.app);
    }
    let out = ops::deploy(&client, &config, &initial, &s, progress).await?;
    finish(&a.target, &out)
}

/// Builds the app's Dockerfile with buildah, pushes it to the cluster's registry (or
/// `--registry`) and answers the pushed digest's reference (`bazaar_deploy::build`); the
/// builder's output goes to stderr.
async fn build_image(a: &DeployArgs, config: &AppConfig) -> anyhow::Result<String> {
    use bazaar_deploy::build::PushTo;
    let (to, token) = match a.registry.as_deref() {
        Some(r) => (PushTo::External(r), None),
        None => {
            let token = a.target.token.as_deref().context(
                "no token to push the build to the cluster's registry with: set BAZAAR_TOKEN or pass --token (or push elsewhere with --registry)",
            )?;
            (
                PushTo::Cluster {
                    api_url: &a.target.api_url,
                },
                Some(token),
            )
        }
    };
    let file = a.target.config_path().context("no app config")?;
    let dir = match file.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let unique = bazaar_types::ids::new_instance_id().to_lowercase();
    let plan =
        bazaar_deploy::build::plan(config, &dir, to, &unique, &a.build_args, &a.build_secrets)
            .map_err(anyhow::Error::msg)?;
    eprintln!(
        "building {} from {} ...",
        plan.tag,
        plan.dockerfile.display()
    );
    let image = bazaar_deploy::build::build_and_push(&plan, &config.app, token, |line| {
        eprintln!("  {line}")
    })
    .await?;
    eprintln!("pushed {image}");
    Ok(image)
}

/// Prints an outcome; a failure exits 1 (after the JSON, with `--json`).
fn finish(t: &Target, out: &Outcome) -> anyhow::Result<()> {
    if t.json {
        println!("{}", serde_json::to_string_pretty(out)?);
        if !out.ok() {
            std::process::exit(1);
        }
        return Ok(());
    }
    let Some(r) = &out.report else {
        // Not executed: show the plan here (an executed one was shown before it ran).
        match out.release {
            Some(r) => println!("release v{r} of {}: plan", out.app),
            None => println!("{}: plan", out.app),
        }
        for l in out.plan.lines() {
            println!("  {l}");
        }
        if out.plan.is_empty() {
            println!("nothing to do: the machines already run this config");
        } else if out.dry_run {
            println!("dry run: nothing changed");
        }
        return Ok(());
    };
    if let Some(v) = out.release {
        print!("release v{v}: ");
    }
    println!(
        "{} ({}) in {:.1}s: {} created, {} updated, {} destroyed",
        if r.ok { "done" } else { "FAILED" },
        r.strategy,
        r.seconds,
        r.created.len(),
        r.updated.len(),
        r.destroyed.len()
    );
    if r.ok {
        return Ok(());
    }
    let mut msg = format!(
        "deploy failed: {}",
        r.error.as_deref().unwrap_or("unknown error")
    );
    if r.rolled_back {
        msg.push_str("; rolled back to the previous release");
    } else if let Some(e) = &r.rollback_error {
        msg.push_str(&format!("; the rollback failed too: {e}"));
    }
    anyhow::bail!(msg)
}

/// `bazaar releases`.
#[derive(Debug, clap::Args)]
pub struct ReleasesArgs {
    #[command(flatten)]
    target: Target,
}

/// Runs `bazaar releases`.
pub async fn releases(a: ReleasesArgs) -> anyhow::Result<()> {
    let app = a.target.app()?;
    let client = a.target.client()?;
    let hist = bazaar_deploy::release::history(&client, &app).await?;
    if a.target.json {
        println!("{}", serde_json::to_string_pretty(&hist)?);
        return Ok(());
    }
    let mut t = Table::new();
    t.set_header(["version", "status", "machines", "groups", "created"]);
    for r in &hist {
        t.add_row([
            format!("v{}", r.version),
            r.status.clone(),
            r.machines.to_string(),
            r.configs.keys().cloned().collect::<Vec<_>>().join(","),
            r.created_at.clone(),
        ]);
    }
    println!("{t}");
    Ok(())
}

/// `bazaar rollback [VERSION]`.
#[derive(Debug, clap::Args)]
pub struct RollbackArgs {
    #[command(flatten)]
    target: Target,
    #[command(flatten)]
    run: RunArgs,
    /// The release to deploy again (`3` or `v3`; default: the one before the current).
    version: Option<String>,
}

/// Runs `bazaar rollback`.
pub async fn rollback(a: RollbackArgs) -> anyhow::Result<()> {
    let app = a.target.app()?;
    let client = a.target.client()?;
    let version = a
        .version
        .as_deref()
        .map(|v| v.trim_start_matches('v').parse::<u64>())
        .transpose()
        .context("VERSION is a release number such as 3 or v3")?;
    let out = ops::rollback(
        &client,
        &app,
        version,
        &a.run.settings()?,
        a.target.progress(),
    )
    .await?;
    finish(&a.target, &out)
}

/// `bazaar scale`.
#[derive(Debug, clap::Args)]
pub struct ScaleArgs {
    #[command(flatten)]
    target: Target,
    #[command(subcommand)]
    command: ScaleCommand,
}

#[derive(Debug, clap::Subcommand)]
enum ScaleCommand {
    /// Run N machines per process group (0 destroys them all).
    Count {
        count: usize,
        /// Regions to spread over (comma-separated; default: where the group runs).
        #[arg(long, value_delimiter = ',')]
        region: Vec<String>,
        #[arg(long)]
        process_group: Option<String>,
        #[command(flatten)]
        run: RunArgs,
    },
    /// Give every machine a size (`shared-cpu-2x`, `performance-1x`), rolling.
    Vm {
        size: String,
        /// Memory in MB (default: the size's).
        #[arg(long)]
        memory: Option<u64>,
        #[arg(long)]
        process_group: Option<String>,
        #[command(flatten)]
        run: RunArgs,
    },
}

/// Runs `bazaar scale`.
pub async fn scale(a: ScaleArgs) -> anyhow::Result<()> {
    let app = a.target.app()?;
    let client = a.target.client()?;
    let out = match &a.command {
        ScaleCommand::Count {
            count,
            region,
            process_group,
            run,
        } => {
            ops::scale_count(
                &client,
                &app,
                *count,
                region,
                process_group.as_deref(),
                &run.settings()?,
                a.target.progress(),
            )
            .await?
        }
        ScaleCommand::Vm {
            size,
            memory,
            process_group,
            run,
        } => {
            ops::scale_vm(
                &client,
                &app,
                size,
                *memory,
                process_group.as_deref(),
                &run.settings()?,
                a.target.progress(),
            )
            .await?
        }
    };
    finish(&a.target, &out)
}

/// `bazaar app-status`.
#[derive(Debug, clap::Args)]
pub struct AppStatusArgs {
    #[command(flatten)]
    target: Target,
}

fn health(m: &Machine) -> String {
    let checks = bazaar_deploy::health::checks_of(m);
    if checks.is_empty() {
        return "-".into();
    }
    let passing = checks.iter().filter(|c| c.1 == "passing").count();
    let critical = checks.iter().filter(|c| c.1 == "critical").count();
    let mut s = format!("{passing}/{} passing", checks.len());
    if critical > 0 {
        s.push_str(&format!(", {critical} critical"));
    }
    s
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// Runs `bazaar app-status`: machines per group and region with state, health, release
/// and host.
pub async fn app_status(a: AppStatusArgs) -> anyhow::Result<()> {
    let app = a.target.app()?;
    let client = a.target.client()?;
    let mut machines = client.machines(&app).await?;
    let meta = |m: &Machine, key: &str| m.config.metadata.get(key).cloned();
    let key = |m: &Machine| {
        (
            meta(m, bazaar_deploy::META_GROUP).unwrap_or_default(),
            m.region.clone(),
            m.id.clone(),
        )
    };
    machines.sort_by_key(key);
    if a.target.json {
        let rows: Vec<Value> = machines
            .iter()
            .map(|m| {
                serde_json::json!({
                    "id": m.id,
                    "group": meta(m, bazaar_deploy::META_GROUP),
                    "region": m.region,
                    "state": m.state,
                    "checks": bazaar_deploy::health::checks_of(m),
                    "release": meta(m, bazaar_deploy::META_RELEASE),
                    "host_id": m.host_id,
                    "host_status": m.host_status,
                    "cordoned": m.cordoned,
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({"app": app, "machines": rows}))?
        );
        return Ok(());
    }
    println!("app {app}: {} machine(s)", machines.len());
    let mut t = Table::new();
    t.set_header([
        "group", "region", "id", "state", "health", "release", "host", "cordoned",
    ]);
    for m in &machines {
        let (group, region, id) = key(m);
        let release = meta(m, bazaar_deploy::META_RELEASE).unwrap_or_default();
        t.add_row([
            group,
            region,
            id,
            m.state.to_string(),
            health(m),
            if release.is_empty() {
                "-".into()
            } else {
                format!("v{release}")
            },
            format!("{} ({})", m.host_id, m.host_status),
            m.cordoned.to_string(),
        ]);
    }
    println!("{t}");
    Ok(())
}

/// `bazaar logs`.
#[derive(Debug, clap::Args)]
pub struct LogsArgs {
    #[command(flatten)]
    target: Target,
    /// Keep streaming new lines.
    #[arg(long, short)]
    follow: bool,
}

/// Runs `bazaar logs`: the output of every machine of the app, each line prefixed with its
/// machine and region (with `--json`, JSON lines with `machine` and `region` added).
pub async fn logs(a: LogsArgs) -> anyhow::Result<()> {
    let app = a.target.app()?;
    let client = a.target.client()?;
    let machines = client.machines(&app).await?;
    let mut tasks = Vec::new();
    for m in machines {
        let (id, region) = (m.id, m.region);
        let (fly, app, follow, json) = (client.fly().clone(), app.clone(), a.follow, a.target.json);
        tasks.push(tokio::spawn(async move {
            let mut resp = match fly.logs(&app, &id, follow).await {
                Err(ApiError::Status { message, .. }) => anyhow::bail!("machine {id}: {message}"),
                other => other?,
            };
            let mut pending = String::new();
            while let Some(chunk) = resp.chunk().await? {
                pending.push_str(&String::from_utf8_lossy(&chunk));
                while let Some(pos) = pending.find('\n') {
                    let line: String = pending.drain(..=pos).collect();
                    let v = serde_json::from_str::<Value>(line.trim()).ok();
                    match v {
                        Some(mut v) if json => {
                            v["machine"] = Value::String(id.clone());
                            v["region"] = Value::String(region.clone());
                            println!("{}", crate::term::json_for_stdout(&v.to_string()));
                        }
                        // A workload's own bytes: escaped on a terminal (`crate::term`).
                        Some(v) => println!(
                            "{id} {region} | {}",
                            crate::term::for_stdout(&text(&v["line"]))
                        ),
                        None => println!(
                            "{id} {region} | {}",
                            crate::term::for_stdout(line.trim_end())
                        ),
                    }
                }
            }
            Ok(())
        }));
    }
    for t in tasks {
        if let Err(e) = t.await? {
            eprintln!("warning: {e:#}");
        }
    }
    Ok(())
}

/// Draws deploy progress on stderr: a spinner and a bar per phase on a terminal, plain
/// lines otherwise.
#[derive(Debug)]
struct Reporter {
    bar: Option<Mutex<Option<indicatif::ProgressBar>>>,
}

impl Reporter {
    fn new() -> Reporter {
        Reporter {
            bar: std::io::stderr().is_terminal().then(|| Mutex::new(None)),
        }
    }
}

impl Progress for Reporter {
    fn event(&self, e: Event) {
        let Some(bar) = &self.bar else {
            match e {
                Event::Phase { name, total } => eprintln!("==> {name} ({total})"),
                Event::Machine {
                    id,
                    region,
                    message,
                } => eprintln!("    {id} [{region}] {message}"),
                Event::Advance => {}
                Event::Note { message } => eprintln!("==> {message}"),
            }
            return;
        };
        let mut bar = bar.lock().unwrap_or_else(|p| p.into_inner());
        match e {
            Event::Phase { name, total } => {
                if let Some(b) = bar.take() {
                    done(&b);
                }
                let b = indicatif::ProgressBar::new(total as u64);
                b.set_style(
                    indicatif::ProgressStyle::with_template(
                        "{spinner} {prefix} [{bar:30}] {pos}/{len} {elapsed} {msg}",
                    )
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                    .progress_chars("=> "),
                );
                b.set_prefix(name);
                b.enable_steady_tick(Duration::from_millis(100));
                *bar = Some(b);
            }
            Event::Machine {
                id,
                region,
                message,
            } => {
                if let Some(b) = bar.as_ref() {
                    b.set_message(format!("{id} [{region}] {message}"));
                }
            }
            Event::Advance => {
                if let Some(b) = bar.as_ref() {
                    b.inc(1);
                }
            }
            Event::Note { message } => match bar.as_ref() {
                Some(b) => b.println(format!("==> {message}")),
                None => eprintln!("==> {message}"),
            },
        }
    }
}

/// Replaces a finished phase's bar with one plain line.
fn done(b: &indicatif::ProgressBar) {
    b.finish_and_clear();
    eprintln!(
        "==> {}: {}/{} in {:.1}s",
        b.prefix(),
        b.position(),
        b.length().unwrap_or(0),
        b.elapsed().as_secs_f64()
    );
}

impl Drop for Reporter {
    fn drop(&mut self) {
        if let Some(bar) = &self.bar {
            if let Some(b) = bar.lock().unwrap_or_else(|p| p.into_inner()).take() {
                done(&b);
            }
        }
    }
}
