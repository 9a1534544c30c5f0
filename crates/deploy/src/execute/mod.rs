//! Runs a [`crate::plan::Plan`] through the Machines API with a strategy, holding
//! short leases on every machine it touches:
//!
//! - `rolling`: new machines first (health-gated), then updates `max_unavailable` at a time:
//!   drain (cordon, wait until its in-flight requests are done), update, wait until started at the new
//!   version with every service check passing, uncordon.
//! - `canary`: the same, with one machine alone first.
//! - `bluegreen`: a new, cordoned set beside the old one; when all of it is healthy it is
//!   uncordoned, the old set drained and destroyed.
//! - `immediate`: every update and create at once, waiting for started only.
//!
//! Surplus machines are drained and destroyed last (a destroy stops the machine with its
//! `kill_signal` and `kill_timeout`). When anything fails, the deploy rolls back to the
//! previous release (updated machines get their old config back, the same way; new ones
//! are destroyed) and the report says what failed and where.

use crate::api::Client;
use crate::config::{MaxUnavailable, Strategy};
use crate::lease::Leases;
use crate::plan::{Existing, GroupTarget, Plan};
use crate::progress::{Event, Progress};
use bazaar_types::config::MachineConfig;
use bazaar_types::machine::Machine;
use bazaar_types::state::MachineState;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod machine;

/// How to run a plan.
#[derive(Debug, Clone)]
pub struct Options {
    pub app: String,
    pub strategy: Strategy,
    pub max_unavailable: MaxUnavailable,
    /// Per machine: started and healthy within this long.
    pub wait_timeout: Duration,
    /// The longest a cordoned machine is given to finish its in-flight requests before it
    /// is stopped, updated or destroyed (it is stopped as soon as they are done).
    pub drain: Duration,
    /// Roll back automatically on failure.
    pub rollback: bool,
    /// Label machines whose config does not change with the new release.
    pub relabel: bool,
    /// Volume name → days its snapshots are kept, for volumes the deploy creates
    /// (`[mounts] snapshot_retention`; the API's default when absent).
    pub snapshot_retention: BTreeMap<String, u32>,
}

/// What a deploy did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    pub ok: bool,
    pub strategy: String,
    pub created: Vec<String>,
    pub updated: Vec<String>,
    pub relabeled: Vec<String>,
    pub destroyed: Vec<String>,
    /// Volumes made for new machines (a deploy never deletes one, a rollback neither).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub volumes_created: Vec<String>,
    /// The first failure: what and where.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed_machine: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed_region: Option<String>,
    pub rolled_back: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rollback_error: Option<String>,
    pub seconds: f64,
}

/// A failure of one machine step.
#[derive(Debug)]
struct Failure {
    id: String,
    region: String,
    error: anyhow::Error,
}

/// An update to run (or to undo).
#[derive(Debug, Clone)]
struct Change {
    id: String,
    region: String,
    to: MachineConfig,
    from: MachineConfig,
    /// A stopped (or suspended) machine is updated without starting it, as on Fly: a
    /// machine the proxy stopped stays stopped until traffic wakes it.
    stopped: bool,
}

/// The running deploy's shared state.
#[derive(Debug)]
struct Run<'a> {
    client: &'a Client,
    opts: &'a Options,
    leases: Leases,
    progress: Arc<dyn Progress>,
    done: Mutex<Done>,
    /// Set while rolling back: waits get at least a minute, whatever `wait_timeout`.
    rolling_back: std::sync::atomic::AtomicBool,
    /// Held while a new machine's volume is chosen, so that two never take the same.
    choosing_volume: tokio::sync::Mutex<()>,
}

#[derive(Debug, Default)]
struct Done {
    /// New machines: id → (region, config).
    created: Vec<(String, String)>,
    /// Updated machines (including one that failed midway).
    updated: Vec<Change>,
    relabeled: Vec<(String, Option<String>)>,
    destroyed: Vec<String>,
    /// Volumes given to new machines of this deploy.
    volumes_taken: Vec<String>,
    /// Volumes this deploy created.
    volumes_created: Vec<String>,
    /// Bluegreen switched traffic to the new machines: a rollback keeps them.
    switched: bool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs `plan` (computed from `targets` and `existing`) with `opts`.
pub async fn execute(
    client: &Client,
    opts: &Options,
    targets: &BTreeMap<String, GroupTarget>,
    existing: &[Existing],
    plan: &Plan,
    progress: Arc<dyn Progress>,
) -> Report {
    let started = std::time::Instant::now();
    let run = Run {
        client,
        opts,
        leases: Leases::new(client.clone(), &opts.app),
        progress,
        done: Mutex::new(Done::default()),
        rolling_back: Default::default(),
        choosing_volume: Default::default(),
    };
    let result = match opts.strategy {
        Strategy::Bluegreen => bluegreen(&run, targets, existing, plan).await,
        _ => in_place(&run, targets, existing, plan).await,
    };
    let mut report = Report {
        strategy: opts.strategy.to_string(),
        ..Default::default()
    };
    if let Err(f) = result {
        let mut at = Vec::new();
        if !f.id.is_empty() {
            at.push(format!("machine {}", f.id));
        }
        if !f.region.is_empty() {
            at.push(format!("in {}", f.region));
        }
        report.error = Some(if at.is_empty() {
            format!("{:#}", f.error)
        } else {
            format!("{}: {:#}", at.join(" "), f.error)
        });
        report.failed_machine = Some(f.id).filter(|s| !s.is_empty());
        report.failed_region = Some(f.region).filter(|s| !s.is_empty());
        run.progress.event(Event::Note {
            message: format!("deploy failed: {}", report.error.as_deref().unwrap_or("")),
        });
        if opts.rollback {
            run.progress.event(Event::Note {
                message: "rolling back to the previous release".into(),
            });
            match rollback(&run).await {
                Ok(()) => report.rolled_back = true,
                Err(e) => report.rollback_error = Some(format!("{e:#}")),
            }
        }
    } else {
        report.ok = true;
    }
    run.leases.release_all().await;
    let done = lock(&run.done);
    report.created = done.created.iter().map(|(id, _)| id.clone()).collect();
    report.updated = done.updated.iter().map(|c| c.id.clone()).collect();
    report.relabeled = done.relabeled.iter().map(|(id, _)| id.clone()).collect();
    report.destroyed = done.destroyed.clone();
    report.volumes_created = done.volumes_created.clone();
    report.seconds = started.elapsed().as_secs_f64();
    report
}

fn changes(
    targets: &BTreeMap<String, GroupTarget>,
    existing: &[Existing],
    plan: &Plan,
) -> Vec<(String, Change)> {
    let by_id: HashMap<&str, &Existing> = existing.iter().map(|m| (m.id.as_str(), m)).collect();
    let mut out = Vec::new();
    for s in &plan.steps {
        let Some(t) = targets.get(&s.group) else {
            continue;
        };
        for id in &s.update {
            if let Some(m) = by_id.get(id.as_str()) {
                out.push((
                    s.group.clone(),
                    Change {
                        id: id.clone(),
                        region: s.region.clone(),
                        to: crate::volumes::desired(&t.config, m),
                        from: m.config.clone(),
                        stopped: matches!(m.state.as_str(), "stopped" | "suspended"),
                    },
                ));
            }
        }
    }
    out
}

fn release_of(targets: &BTreeMap<String, GroupTarget>, group: &str) -> Option<String> {
    targets
        .get(group)
        .and_then(|t| t.config.metadata.get(crate::META_RELEASE).cloned())
}

async fn relabel_and_destroy(
    run: &Run<'_>,
    targets: &BTreeMap<String, GroupTarget>,
    plan: &Plan,
) -> Result<(), Failure> {
    for s in plan.steps.iter().filter(|_| run.opts.relabel) {
        if let Some(rel) = release_of(targets, &s.group) {
            for id in &s.keep {
                run.relabel(id, &s.region, &rel).await?;
            }
        }
    }
    let destroys: Vec<(&String, &String)> = plan
        .steps
        .iter()
        .flat_map(|s| s.destroy.iter().map(move |id| (id, &s.region)))
        .collect();
    if !destroys.is_empty() {
        run.progress.event(Event::Phase {
            name: "destroying surplus machines".into(),
            total: destroys.len(),
        });
        let calls = destroys
            .iter()
            .map(|(id, region)| run.destroy(id, region, true));
        for r in futures_util::future::join_all(calls).await {
            r?;
        }
    }
    Ok(())
}

/// rolling, canary, immediate: machines are updated where they are.
async fn in_place(
    run: &Run<'_>,
    targets: &BTreeMap<String, GroupTarget>,
    existing: &[Existing],
    plan: &Plan,
) -> Result<(), Failure> {
    let gate = run.opts.strategy != Strategy::Immediate;
    let creates: Vec<(&str, &str, usize)> = plan
        .steps
        .iter()
        .filter(|s| s.create > 0)
        .map(|s| (s.group.as_str(), s.region.as_str(), s.create))
        .collect();
    let mut updates = changes(targets, existing, plan);
    let total_new: usize = creates.iter().map(|c| c.2).sum();

    // Canary: one machine alone first (an update, else one new machine).
    let mut creates = creates;
    if run.opts.strategy == Strategy::Canary {
        run.progress.event(Event::Phase {
            name: "canary".into(),
            total: 1,
        });
        if !updates.is_empty() {
            let (_, c) = updates.remove(0);
            run.update_one(&c, true).await?;
        } else if let Some(first) = creates.first_mut() {
            let t = &targets[first.0];
            run.create(first.1, &t.config, 1, false, true).await?;
            first.2 -= 1;
        }
    }

    if total_new > 0 {
        run.progress.event(Event::Phase {
            name: "creating machines".into(),
            total: creates.iter().map(|c| c.2).sum(),
        });
        let calls = creates
            .iter()
            .filter(|c| c.2 > 0)
            .map(|(g, r, n)| run.create(r, &targets[*g].config, *n, false, gate));
        for r in futures_util::future::join_all(calls).await {
            r?;
        }
    }

    if !updates.is_empty() {
        run.progress.event(Event::Phase {
            name: format!("updating machines ({})", run.opts.strategy),
            total: updates.len(),
        });
        if run.opts.strategy == Strategy::Immediate {
            let calls = updates.iter().map(|(_, c)| run.update_one(c, false));
            for r in futures_util::future::join_all(calls).await {
                r?;
            }
        } else {
            // max_unavailable per process group, counted on the group's size.
            let mut by_group: BTreeMap<String, Vec<Change>> = BTreeMap::new();
            for (g, c) in updates {
                by_group.entry(g).or_default().push(c);
            }
            for (g, list) in by_group {
                let size = existing.iter().filter(|m| m.group == g).count();
                let at_once = run.opts.max_unavailable.of(size);
                for batch in list.chunks(at_once) {
                    let calls = batch.iter().map(|c| run.update_one(c, true));
                    for r in futures_util::future::join_all(calls).await {
                        r?;
                    }
                }
            }
        }
    }
    relabel_and_destroy(run, targets, plan).await
}

/// bluegreen: a new set beside the old, traffic switched when all of it is healthy.
async fn bluegreen(
    run: &Run<'_>,
    targets: &BTreeMap<String, GroupTarget>,
    existing: &[Existing],
    plan: &Plan,
) -> Result<(), Failure> {
    let _ = existing;
    let greens: Vec<(&str, &str, usize)> = plan
        .steps
        .iter()
        .filter(|s| s.create + s.update.len() > 0)
        .map(|s| {
            (
                s.group.as_str(),
                s.region.as_str(),
                s.create + s.update.len(),
            )
        })
        .collect();
    run.progress.event(Event::Phase {
        name: "creating the green machines".into(),
        total: greens.iter().map(|g| g.2).sum(),
    });
    let calls = greens
        .iter()
        .map(|(g, r, n)| run.create(r, &targets[*g].config, *n, true, true));
    let mut green_ids = Vec::new();
    for r in futures_util::future::join_all(calls).await {
        green_ids.extend(r?);
    }
    run.progress.event(Event::Note {
        message: "green machines healthy; switching traffic".into(),
    });
    let calls = green_ids.iter().map(|id| run.uncordon(id));
    for (id, r) in green_ids
        .iter()
        .zip(futures_util::future::join_all(calls).await)
    {
        r.map_err(|error| Failure {
            id: id.clone(),
            region: String::new(),
            error,
        })?;
    }
    lock(&run.done).switched = true;
    // Old (blue) machines: drained and destroyed with the surplus ones.
    let mut retire = plan.clone();
    for s in &mut retire.steps {
        let blue = std::mem::take(&mut s.update);
        s.destroy.extend(blue);
    }
    relabel_and_destroy(run, targets, &retire).await
}

/// Puts back the previous release: updated machines get their old config (drained and
/// health-gated like a rolling update), new machines are drained and destroyed, labels
/// restored.
async fn rollback(run: &Run<'_>) -> anyhow::Result<()> {
    run.rolling_back
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let (mut created, updated, relabeled) = {
        let d = lock(&run.done);
        (d.created.clone(), d.updated.clone(), d.relabeled.clone())
    };
    if lock(&run.done).switched {
        // The new machines serve already and the old ones may be gone: keep them.
        created.clear();
    }
    let destroyed_already: Vec<String> = lock(&run.done).destroyed.clone();
    let mut errors = Vec::new();
    // The failed machine was updated last: undo it first (it serves nothing now).
    for c in updated.iter().rev() {
        let back = Change {
            id: c.id.clone(),
            region: c.region.clone(),
            to: c.from.clone(),
            from: c.to.clone(),
            stopped: c.stopped,
        };
        run.say(&c.id, &c.region, "rolling back");
        if let Err(f) = run.update_one(&back, true).await {
            errors.push(format!("machine {}: {:#}", f.id, f.error));
        }
    }
    let calls = created
        .iter()
        .filter(|(id, _)| !destroyed_already.contains(id))
        .map(|(id, region)| run.destroy(id, region, true));
    for r in futures_util::future::join_all(calls).await {
        if let Err(f) = r {
            errors.push(format!("machine {}: {:#}", f.id, f.error));
        }
    }
    for (id, old) in relabeled {
        let nonce = run.leases.acquire(&id).await.ok();
        let path = format!(
            "/apps/{}/machines/{id}/metadata/{}",
            run.app(),
            crate::META_RELEASE
        );
        let r = match old {
            Some(v) => {
                run.client
                    .call(
                        reqwest::Method::POST,
                        &path,
                        Some(serde_json::json!({ "value": v })),
                        nonce.as_deref(),
                    )
                    .await
            }
            None => {
                run.client
                    .call(reqwest::Method::DELETE, &path, None, nonce.as_deref())
                    .await
            }
        };
        if let Err(e) = r {
            errors.push(format!("machine {id}: {e:#}"));
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        anyhow::bail!("{}", errors.join("; "))
    }
}

/// The app's machines as the plan sees them, from API machine objects.
pub fn existing_from(machines: &[Machine]) -> Vec<Existing> {
    machines
        .iter()
        .filter(|m| !matches!(m.state, MachineState::Destroyed | MachineState::Destroying))
        .map(|m| Existing {
            id: m.id.clone(),
            group: m
                .config
                .metadata
                .get(crate::META_GROUP)
                .cloned()
                .unwrap_or_else(|| crate::config::DEFAULT_GROUP.to_string()),
            region: m.region.clone(),
            state: m.state.as_str().to_string(),
            config: m.config.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn machine(id: &str, region: &str, state: &str, config: Value) -> Machine {
        serde_json::from_value(json!({
            "id": id, "name": id, "state": state, "region": region, "instance_id": "v1",
            "version": "v1", "private_ip": "127.0.0.1", "created_at": "", "updated_at": "",
            "host_status": "ok", "config": config,
        }))
        .expect("a machine object")
    }

    #[test]
    fn existing_machines_come_from_api_objects() {
        let ms = vec![
            machine(
                "a",
                "ams",
                "started",
                json!({"image": "process", "metadata": {"fly_process_group": "web"}}),
            ),
            machine("b", "ord", "stopped", json!({"image": "process"})),
            machine("c", "ord", "destroying", json!({})),
            machine("d", "ord", "destroyed", json!({})),
        ];
        let e = existing_from(&ms);
        assert_eq!(e.len(), 2, "{e:?}");
        assert_eq!((e[0].id.as_str(), e[0].group.as_str()), ("a", "web"));
        assert_eq!((e[1].id.as_str(), e[1].group.as_str()), ("b", "app"));
        assert_eq!(e[1].state, "stopped");
    }

    #[test]
    fn changes_pair_each_update_with_its_old_config() {
        let old = MachineConfig {
            image: "v1".into(),
            ..Default::default()
        };
        let new = MachineConfig {
            image: "v2".into(),
            ..Default::default()
        };
        let existing = vec![Existing {
            id: "a".into(),
            group: "app".into(),
            region: "ams".into(),
            state: "started".into(),
            config: old.clone(),
        }];
        let targets = BTreeMap::from([(
            "app".to_string(),
            GroupTarget {
                config: new.clone(),
                regions: BTreeMap::from([("ams".to_string(), 1)]),
            },
        )]);
        let p = crate::plan::plan(&targets, &existing);
        let c = changes(&targets, &existing, &p);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].0, "app");
        assert_eq!(
            (c[0].1.from.image.as_str(), c[0].1.to.image.as_str()),
            ("v1", "v2")
        );
    }
}
