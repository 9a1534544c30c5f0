//! The user-level operations, as the CLI and the benchmarks call them: deploy an app
//! config, roll back to a release, scale a process group's count or size. Each computes a
//! plan from what exists, returns it untouched on a dry run, and otherwise executes it.

use crate::api::Client;
use crate::config::{AppConfig, MaxUnavailable, Strategy};
use crate::execute::{execute, existing_from, Options, Report};
use crate::plan::{counts, distribute, plan, Existing, GroupTarget, Plan};
use crate::progress::Progress;
use crate::release::{history, next_version, release_of};
use bazaar_types::config::MachineConfig;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// flyctl's default `max_unavailable`: a third of a group (at least one machine).
pub const DEFAULT_MAX_UNAVAILABLE: MaxUnavailable = MaxUnavailable::Fraction(0.33);

/// Settings shared by every operation.
#[derive(Debug, Clone)]
pub struct Settings {
    pub strategy: Option<Strategy>,
    pub max_unavailable: Option<MaxUnavailable>,
    pub wait_timeout: Option<Duration>,
    pub drain: Duration,
    pub dry_run: bool,
    pub rollback: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            strategy: None,
            max_unavailable: None,
            wait_timeout: None,
            drain: Duration::from_secs(30),
            dry_run: false,
            rollback: true,
        }
    }
}

/// The result of an operation.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub app: String,
    /// The release deployed (none for scale).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub release: Option<u64>,
    pub plan: Plan,
    pub dry_run: bool,
    /// What happened (none on a dry run or an empty plan).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub report: Option<Report>,
}

impl Outcome {
    /// Whether it succeeded (a dry run always does).
    pub fn ok(&self) -> bool {
        self.report.as_ref().is_none_or(|r| r.ok)
    }
}

fn with_release(mut c: MachineConfig, release: Option<u64>) -> MachineConfig {
    if let Some(n) = release {
        c.metadata.insert(crate::META_RELEASE.into(), n.to_string());
    }
    c
}

/// Refuses a plan that cannot be carried out without losing data: one that changes an
/// existing machine's volume, or a bluegreen deploy of machines with volumes (the new set
/// would need the old set's volumes).
fn refuse(
    targets: &BTreeMap<String, GroupTarget>,
    existing: &[Existing],
    strategy: Strategy,
) -> anyhow::Result<()> {
    crate::volumes::check(targets, existing).map_err(anyhow::Error::msg)?;
    if strategy == Strategy::Bluegreen && crate::volumes::any(targets) {
        anyhow::bail!(
            "the bluegreen strategy cannot be used with [mounts]: the new machines would need the old ones' volumes; use rolling, canary or immediate"
        );
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn run(
    client: &Client,
    app: &str,
    release: Option<u64>,
    targets: BTreeMap<String, GroupTarget>,
    existing: Vec<Existing>,
    plan: Plan,
    strategy: Strategy,
    max_unavailable: MaxUnavailable,
    wait_timeout: Duration,
    s: &Settings,
    snapshot_retention: BTreeMap<String, u32>,
    progress: Arc<dyn Progress>,
) -> anyhow::Result<Outcome> {
    refuse(&targets, &existing, strategy)?;
    let mut out = Outcome {
        app: app.to_string(),
        release,
        plan,
        dry_run: s.dry_run,
        report: None,
    };
    if out.plan.is_empty() {
        // Nothing changes: no new release either.
        out.release = None;
        return Ok(out);
    }
    if s.dry_run {
        return Ok(out);
    }
    // Show the plan before carrying it out.
    progress.event(crate::progress::Event::Note {
        message: match release {
            Some(r) => format!("release v{r} of {app}: plan"),
            None => format!("{app}: plan"),
        },
    });
    for line in out.plan.lines() {
        progress.event(crate::progress::Event::Note {
            message: format!("  {line}"),
        });
    }
    let opts = Options {
        app: app.to_string(),
        strategy,
        max_unavailable,
        wait_timeout,
        drain: s.drain,
        rollback: s.rollback,
        relabel: release.is_some(),
        snapshot_retention,
    };
    out.report = Some(execute(client, &opts, &targets, &existing, &out.plan, progress).await);
    Ok(out)
}

/// Where a first deploy puts a group's machines.
#[derive(Debug, Clone, Default)]
pub struct Initial {
    /// Machines per new group (default 1).
    pub count: Option<usize>,
    /// Regions to spread them over (default: `primary_region`, else the API's default).
    pub regions: Vec<String>,
}

/// Deploys an app config as a new release.
pub async fn deploy(
    client: &Client,
    config: &AppConfig,
    initial: &Initial,
    s: &Settings,
    progress: Arc<dyn Progress>,
) -> anyhow::Result<Outcome> {
    let app = &config.app;
    let exists = client.app_exists(app).await?;
    if !exists && !s.dry_run {
        client.create_app(app).await?;
    }
    // A dry run of a new app plans against nothing (and creates nothing).
    let (existing, hist) = if exists || !s.dry_run {
        (
            existing_from(&client.machines(app).await?),
            history(client, app).await?,
        )
    } else {
        (Vec::new(), Vec::new())
    };
    let release = next_version(&hist);
    let mut targets = BTreeMap::new();
    for g in config.groups() {
        let cfg = with_release(
            config.machine_config(&g).map_err(anyhow::Error::msg)?,
            Some(release),
        );
        let now = counts(&existing, &g);
        let regions = if now.is_empty() {
            let regions = if !initial.regions.is_empty() {
                initial.regions.clone()
            } else {
                vec![config.primary_region.clone().unwrap_or_default()]
            };
            // A per-host group starts with one machine: every other matching host then
            // makes its own copy.
            let count = if config.per_host(&g) {
                1
            } else {
                initial.count.unwrap_or(1)
            };
            distribute(count, &regions, &BTreeMap::new())
        } else {
            now
        };
        targets.insert(
            g,
            GroupTarget {
                config: cfg,
                regions,
            },
        );
    }
    let p = plan(&targets, &existing);
    let strategy = s.strategy.unwrap_or(config.strategy());
    let mu = s
        .max_unavailable
        .or(config.deploy.max_unavailable)
        .unwrap_or(DEFAULT_MAX_UNAVAILABLE);
    let wait = s.wait_timeout.unwrap_or(config.wait_timeout());
    if let Some(crate::config::Command(command)) = &config.deploy.release_command {
        if !s.dry_run && !p.is_empty() {
            refuse(&targets, &existing, strategy)?;
            let base = targets
                .get(crate::config::DEFAULT_GROUP)
                .or_else(|| targets.values().next())
                .map(|t| &t.config)
                .ok_or_else(|| anyhow::anyhow!("{app} has no process group"))?;
            let timeout = config
                .deploy
                .release_command_timeout
                .map_or(crate::release_command::DEFAULT_TIMEOUT, |t| t.0);
            let region = config.primary_region.clone().unwrap_or_default();
            crate::release_command::run(client, app, base, command, &region, timeout, &progress)
                .await?;
        }
    }
    // `[experimental] auto_rollback = false` is `--no-rollback`.
    let s = &Settings {
        rollback: s.rollback && config.experimental.auto_rollback != Some(false),
        ..s.clone()
    };
    run(
        client,
        app,
        Some(release),
        targets,
        existing,
        p,
        strategy,
        mu,
        wait,
        s,
        config.snapshot_retention(),
        progress,
    )
    .await
}

/// Deploys the config of release `version` (default: the one before the current) again,
/// as a new release.
pub async fn rollback(
    client: &Client,
    app: &str,
    version: Option<u64>,
    s: &Settings,
    progress: Arc<dyn Progress>,
) -> anyhow::Result<Outcome> {
    let hist = history(client, app).await?;
    let current = hist
        .iter()
        .find(|r| r.status == "deployed")
        .map(|r| r.version);
    let target = match version {
        Some(v) => hist
            .iter()
            .find(|r| r.version == v)
            .ok_or_else(|| anyhow::anyhow!("release {v} of {app} is not known (any more)"))?,
        None => hist
            .iter()
            .find(|r| r.status == "superseded" && Some(r.version) < current)
            .ok_or_else(|| anyhow::anyhow!("{app} has no earlier release to roll back to"))?,
    };
    if target.configs.is_empty() {
        anyhow::bail!(
            "release {} has no recorded machine config to deploy",
            target.version
        );
    }
    let existing = existing_from(&client.machines(app).await?);
    let release = next_version(&hist);
    let mut targets = BTreeMap::new();
    for (g, cfg) in &target.configs {
        let now = counts(&existing, g);
        let regions = if now.is_empty() {
            BTreeMap::from([(String::new(), 1)])
        } else {
            now
        };
        targets.insert(
            g.clone(),
            GroupTarget {
                config: with_release(cfg.clone(), Some(release)),
                regions,
            },
        );
    }
    let p = plan(&targets, &existing);
    run(
        client,
        app,
        Some(release),
        targets,
        existing,
        p,
        s.strategy.unwrap_or(Strategy::Rolling),
        s.max_unavailable.unwrap_or(DEFAULT_MAX_UNAVAILABLE),
        s.wait_timeout.unwrap_or(Duration::from_secs(300)),
        s,
        BTreeMap::new(),
        progress,
    )
    .await
}

/// The config new machines of a group get: the newest release's config among its live
/// machines, else the newest release in the history that has the group.
async fn template(
    client: &Client,
    app: &str,
    existing: &[Existing],
    group: &str,
) -> anyhow::Result<MachineConfig> {
    if let Some(m) = existing
        .iter()
        .filter(|m| m.group == group)
        .max_by_key(|m| release_of(&m.config).unwrap_or(0))
    {
        return Ok(m.config.clone());
    }
    let hist = history(client, app).await?;
    hist.iter()
        .filter(|r| r.status != "failed")
        .find_map(|r| r.configs.get(group).cloned())
        .ok_or_else(|| {
            anyhow::anyhow!(
                "process group {group:?} of {app} has no machines and no release: deploy first"
            )
        })
}

/// The groups an operation acts on: the one given, else every group with machines.
fn groups_of(existing: &[Existing], group: Option<&str>) -> Vec<String> {
    match group {
        Some(g) => vec![g.to_string()],
        None => {
            let mut v: Vec<String> = existing.iter().map(|m| m.group.clone()).collect();
            v.sort();
            v.dedup();
            if v.is_empty() {
                v.push(crate::config::DEFAULT_GROUP.to_string());
            }
            v
        }
    }
}

/// `scale count N`: N machines per group, spread over `regions` (default: the regions the
/// group runs in). Existing machines keep their config; new ones get the group's newest.
pub async fn scale_count(
    client: &Client,
    app: &str,
    count: usize,
    regions: &[String],
    group: Option<&str>,
    s: &Settings,
    progress: Arc<dyn Progress>,
) -> anyhow::Result<Outcome> {
    let all = existing_from(&client.machines(app).await?);
    let groups = groups_of(&all, group);
    let existing: Vec<Existing> = all
        .into_iter()
        .filter(|m| groups.contains(&m.group))
        .collect();
    let mut targets = BTreeMap::new();
    for g in &groups {
        let config = template(client, app, &existing, g).await?;
        let now = counts(&existing, g);
        let rs: Vec<String> = if !regions.is_empty() {
            regions.to_vec()
        } else if !now.is_empty() {
            now.keys().cloned().collect()
        } else {
            vec![String::new()]
        };
        targets.insert(
            g.clone(),
            GroupTarget {
                config,
                regions: distribute(count, &rs, &now),
            },
        );
    }
    let mut p = plan(&targets, &existing);
    for step in &mut p.steps {
        let kept = std::mem::take(&mut step.update);
        step.keep.extend(kept);
        step.keep.sort();
    }
    run(
        client,
        app,
        None,
        targets,
        existing,
        p,
        Strategy::Rolling,
        MaxUnavailable::Count(1),
        s.wait_timeout.unwrap_or(Duration::from_secs(300)),
        s,
        BTreeMap::new(),
        progress,
    )
    .await
}

/// `scale vm SIZE`: every machine of the group(s) gets the new guest, rolling.
#[allow(clippy::too_many_arguments)]
pub async fn scale_vm(
    client: &Client,
    app: &str,
    size: &str,
    memory_mb: Option<u64>,
    group: Option<&str>,
    s: &Settings,
    progress: Arc<dyn Progress>,
) -> anyhow::Result<Outcome> {
    let mut guest = bazaar_types::guest::Guest::preset(size).map_err(anyhow::Error::msg)?;
    if let Some(mb) = memory_mb {
        guest.memory_mb = mb as i64;
    }
    guest.validate().map_err(anyhow::Error::msg)?;
    let all = existing_from(&client.machines(app).await?);
    let groups = groups_of(&all, group);
    let existing: Vec<Existing> = all
        .into_iter()
        .filter(|m| groups.contains(&m.group))
        .collect();
    let mut targets = BTreeMap::new();
    for g in &groups {
        let mut config = template(client, app, &existing, g).await?;
        config.guest = Some(guest.clone());
        config.size = None;
        targets.insert(
            g.clone(),
            GroupTarget {
                config,
                regions: counts(&existing, g),
            },
        );
    }
    let p = plan(&targets, &existing);
    run(
        client,
        app,
        None,
        targets,
        existing,
        p,
        s.strategy.unwrap_or(Strategy::Rolling),
        s.max_unavailable.unwrap_or(DEFAULT_MAX_UNAVAILABLE),
        s.wait_timeout.unwrap_or(Duration::from_secs(300)),
        s,
        BTreeMap::new(),
        progress,
    )
    .await
}
