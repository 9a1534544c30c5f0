//! The fault suite's runner (the I/O shell around [`crate::check`]): brings up a lab,
//! gives every host a web machine, then for each fault drives a workload through every
//! API node at once (creates, updates, stops, starts, destroys of an app of its own)
//! while proxy requests go to the web app through every host's proxy and every ledger is
//! sampled; injects the fault, heals it, waits until the catalogs agree with the owners,
//! records everything in a [`History`] and checks it. `bazaar lab faults` and
//! `cli/tests/fleet_faults.rs` drive it; [`matrix`] writes the result as markdown.

mod workload;

use workload::{ledger, proxy_traffic, sample_ledger, workload};

use crate::check::{self, Bounds, Row, Violation};
use crate::history::{
    Call, EndState, FaultRecord, History, LedgerSample, MachineView, PidWatch, ProxySample,
};
use crate::wire::{request, Reply};
use crate::{AgentSettings, Lab, UpOptions};
use anyhow::Context;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The faults a run can inject, in the order a run takes them.
pub const ALL: [&str; 9] = [
    "partition",
    "oneway-partition",
    "loss",
    "freeze",
    "kill",
    "crash",
    "restart",
    "upgrade",
    "fill-disk",
];

/// How a run is sized.
#[derive(Debug, Clone)]
pub struct FaultOptions {
    /// The lab's directory (histories are written to `DIR/histories/`).
    pub dir: PathBuf,
    /// The `bazaar` binary the agents run (copied for `upgrade`).
    pub exe: PathBuf,
    pub hosts: usize,
    /// Faults to inject (names of [`ALL`]), each `rounds` times.
    pub faults: Vec<String>,
    pub rounds: usize,
    /// Workload clients per API node.
    pub clients_per_node: usize,
    /// Machines a client keeps at most.
    pub live_per_client: usize,
    /// How long a fault lasts before it is healed.
    pub fault_for: Duration,
    pub bounds: Bounds,
    /// Scheduling policies on (docs/POLICY.md): hosts reclaim ([`POLICIES`]) and every
    /// other workload client makes `batch` machines, which ride on reclaimed room and are
    /// throttled, stopped and re-placed as services need it back.
    pub policies: bool,
}

/// The agent config of a run with [`FaultOptions::policies`]: reclamation measured every
/// 0.5 s, a reservation decaying after 2 s. Its hosts are small (4 shared vCPUs, 768 MB each) so that
/// batch machines fill what services reserve and do not use, and a service started again
/// takes it back (throttling or stopping batch machines, which are then re-placed).
pub const POLICIES: &str =
    "[reclaim]\nenabled = true\ninterval = 500\ngrace_observations = 4\ndecay_pct = 50\n";

impl FaultOptions {
    /// The CI size: 3 hosts, each fault once, short workloads.
    pub fn ci(dir: PathBuf, exe: PathBuf) -> FaultOptions {
        FaultOptions {
            dir,
            exe,
            hosts: 3,
            faults: ALL.iter().map(|s| s.to_string()).collect(),
            rounds: 1,
            clients_per_node: 1,
            live_per_client: 2,
            fault_for: Duration::from_secs(5),
            bounds: BOUNDS,
            policies: false,
        }
    }

    /// The long run: 4 hosts, every fault 3 times, two clients per node.
    pub fn long(dir: PathBuf, exe: PathBuf) -> FaultOptions {
        FaultOptions {
            hosts: 4,
            rounds: 3,
            clients_per_node: 2,
            live_per_client: 3,
            fault_for: Duration::from_secs(10),
            ..FaultOptions::ci(dir, exe)
        }
    }
}

/// The bounds both sizes hold runs to.
const BOUNDS: Bounds = Bounds {
    converge_ms: 10_000,
    proxy_error_rate: 0.02,
};
/// Failure detection in the lab (ms).
const DEAD_AFTER_MS: u64 = 2000;
/// Memory each host offers (MB): a workload or web machine takes 256 (the least for a
/// shared CPU).
const HOST_MEMORY_MB: u64 = 2048;
/// CPUs (shared vCPUs) and memory (MB) each host offers in a run with policies: a web
/// machine and two more services by requests, and batch machines beside them on what they
/// do not use.
const POLICY_HOST: (u32, u64) = (4, 768);
/// How long the runner waits for the catalogs to agree after a heal.
const CONVERGE_WAIT: Duration = Duration::from_secs(30);
/// Deadline of one Machines API call.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// One fault run: its matrix row, what it broke, and its history.
#[derive(Debug, Clone)]
pub struct FaultRun {
    pub round: usize,
    pub row: Row,
    pub violations: Vec<Violation>,
    pub history: History,
}

/// What a whole run answers: every fault run, and the plan of the lab it used (to check
/// that nothing of it is left).
#[derive(Debug, Clone)]
pub struct FaultReport {
    pub runs: Vec<FaultRun>,
    pub plan: crate::LabPlan,
}

/// Brings up a lab, runs every fault of `opts` and takes the lab down (also on error or
/// panic); `each` sees every run as it ends.
pub fn run(opts: &FaultOptions, mut each: impl FnMut(&FaultRun)) -> anyhow::Result<FaultReport> {
    for f in &opts.faults {
        anyhow::ensure!(
            ALL.contains(&f.as_str()),
            "no fault {f:?}; faults are {}",
            ALL.join(", ")
        );
    }
    let lab = Lab::up(UpOptions {
        dir: opts.dir.clone(),
        hosts: opts.hosts.max(3),
        regions: vec!["local".into()],
        subnet: None,
        exe: opts.exe.clone(),
        small_disk: true,
        agent: AgentSettings {
            memory_mb: Some(if opts.policies {
                POLICY_HOST.1
            } else {
                HOST_MEMORY_MB
            }),
            cpus: opts.policies.then_some(POLICY_HOST.0),
            dead_after_ms: Some(DEAD_AFTER_MS),
            replace_after_ms: None,
            config: opts.policies.then(|| POLICIES.to_string()),
        },
    })?;
    let mut guard = Guard(Some(lab));
    let lab = guard.0.as_mut().expect("the lab is up");
    lab.wait_converged(Duration::from_secs(60))?;
    let upgrade_exe = opts.dir.join("bazaar-upgrade");
    std::fs::copy(&opts.exe, &upgrade_exe).context("copying the binary for `upgrade`")?;
    let web = start_web(lab)?;
    let mut runs = Vec::new();
    for round in 1..=opts.rounds {
        for fault in &opts.faults {
            let run = run_one(lab, opts, round, fault, &web, &upgrade_exe)
                .with_context(|| format!("fault {fault}, round {round}"))?;
            each(&run);
            runs.push(run);
        }
    }
    let lab = guard.0.take().expect("the lab is up");
    let plan = lab.plan().clone();
    lab.down()?;
    Ok(FaultReport { runs, plan })
}

/// Takes the lab down when dropped (a failed or panicking run included).
struct Guard(Option<Lab>);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(lab) = self.0.take() {
            if let Err(e) = lab.down() {
                eprintln!("lab down: {e:#}");
            }
        }
    }
}

/// One host's endpoints, for threads.
#[derive(Debug, Clone)]
struct Node {
    name: String,
    api: std::net::SocketAddr,
    proxy: std::net::SocketAddr,
}

fn nodes(lab: &Lab) -> Vec<Node> {
    lab.plan()
        .hosts
        .iter()
        .map(|h| Node {
            name: h.name.clone(),
            api: h.api(),
            proxy: h.proxy(),
        })
        .collect()
}

/// A web machine on every host (created on the host itself), serving through the proxies.
/// Answers host name → machine id.
fn start_web(lab: &Lab) -> anyhow::Result<BTreeMap<String, String>> {
    let secret = lab.cluster_secret().to_string();
    let first = &nodes(lab)[0];
    // The Machines API takes an API token, the host interface the cluster secret.
    let (s, b) = answer(request(
        first.api,
        "POST",
        "/v1/apps",
        None,
        lab.token(),
        Some(&json!({"app_name": "web", "org_slug": "personal"}).to_string()),
        CALL_TIMEOUT,
    ))?;
    anyhow::ensure!(s == 201, "creating app web: {s} {b}");
    let mut web = BTreeMap::new();
    for n in nodes(lab) {
        let body = json!({
            "app": "web",
            "name": format!("web-{}", n.name),
            "config": {
                "image": "process", "driver": "process",
                "init": {"exec": ["sh", "-c", "cd / && exec python3 -m http.server $PORT"]},
                "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": 256},
                "services": [{"internal_port": 8080, "protocol": "tcp"}],
            },
        });
        let (s, b) = answer(request(
            n.api,
            "POST",
            "/host/v1/machines",
            None,
            &secret,
            Some(&body.to_string()),
            CALL_TIMEOUT,
        ))?;
        anyhow::ensure!(s / 100 == 2, "creating web on {}: {s} {b}", n.name);
        let id = serde_json::from_str::<Value>(&b)?["id"]
            .as_str()
            .context("no machine id")?
            .to_string();
        let (s, b) = answer(request(
            n.api,
            "GET",
            &format!("/host/v1/machines/{id}/wait?state=started&timeout=30"),
            None,
            &secret,
            None,
            Duration::from_secs(35),
        ))?;
        anyhow::ensure!(s == 200, "web on {} does not start: {s} {b}", n.name);
        web.insert(n.name, id);
    }
    // Every proxy serves it before any fault.
    let deadline = Instant::now() + Duration::from_secs(30);
    for n in nodes(lab) {
        while proxy_get(&n) != Some(200) {
            anyhow::ensure!(
                Instant::now() < deadline,
                "web does not serve through {}",
                n.name
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    Ok(web)
}

fn answer(r: Reply) -> anyhow::Result<(u16, String)> {
    match r {
        Reply::Answer(s, b) => Ok((s, b)),
        Reply::NotSent(e) | Reply::Lost(e) => anyhow::bail!("{e}"),
    }
}

fn proxy_get(n: &Node) -> Option<u16> {
    match request(
        n.proxy,
        "GET",
        "/",
        Some("web.localhost"),
        "",
        None,
        Duration::from_secs(3),
    ) {
        Reply::Answer(s, _) => Some(s),
        _ => None,
    }
}

/// What the threads of a run share.
struct Shared {
    started: Instant,
    stop: AtomicBool,
    calls: Mutex<Vec<Call>>,
    ledgers: Mutex<Vec<LedgerSample>>,
    proxy: Mutex<Vec<ProxySample>>,
}

impl Shared {
    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }
}

fn run_one(
    lab: &mut Lab,
    opts: &FaultOptions,
    round: usize,
    fault: &str,
    web: &BTreeMap<String, String>,
    upgrade_exe: &Path,
) -> anyhow::Result<FaultRun> {
    let secret = lab.cluster_secret().to_string();
    let nodes = nodes(lab);
    let names: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();
    let target = names.last().expect("a lab has hosts").clone();
    let app = format!("load-{round}-{fault}");
    let token = lab.token().to_string();
    let (s, b) = answer(request(
        nodes[0].api,
        "POST",
        "/v1/apps",
        None,
        &token,
        Some(&json!({"app_name": app, "org_slug": "personal"}).to_string()),
        CALL_TIMEOUT,
    ))?;
    anyhow::ensure!(s == 201, "creating app {app}: {s} {b}");
    let host_ids: BTreeMap<String, String> = lab
        .state()
        .hosts
        .iter()
        .zip(&names)
        .filter_map(|(h, n)| Some((n.clone(), h.host_id.clone()?)))
        .collect();
    // The workloads that must keep their pids: every web machine, but the crashed one's.
    let watched: Vec<(String, String)> = web
        .iter()
        .filter(|(host, _)| !(fault == "crash" && **host == target))
        .map(|(h, id)| (h.clone(), id.clone()))
        .collect();
    let before: Vec<Vec<u32>> = watched.iter().map(|(_, id)| pids_of(id)).collect();

    let shared = Arc::new(Shared {
        started: Instant::now(),
        stop: AtomicBool::new(false),
        calls: Mutex::default(),
        ledgers: Mutex::default(),
        proxy: Mutex::default(),
    });
    let mut threads = Vec::new();
    for n in &nodes {
        for _ in 0..opts.clients_per_node {
            let (n, sh, token, app) = (n.clone(), shared.clone(), token.clone(), app.clone());
            let client = threads.len() + 1;
            let live = opts.live_per_client;
            let priority = (opts.policies && client % 2 == 1).then_some("batch");
            threads.push(std::thread::spawn(move || {
                workload(client, &n, &sh, &token, &app, live, priority)
            }));
        }
        let (n2, sh) = (n.clone(), shared.clone());
        threads.push(std::thread::spawn(move || proxy_traffic(&n2, &sh)));
        let (n3, sh, secret) = (n.clone(), shared.clone(), secret.clone());
        threads.push(std::thread::spawn(move || sample_ledger(&n3, &sh, &secret)));
    }

    std::thread::sleep(Duration::from_millis(1500));
    let injected_ms = shared.now_ms();
    let (sides, impaired): (Vec<Vec<String>>, Vec<String>) = match fault {
        "partition" | "oneway-partition" => {
            let (a, b) = (vec![names[0].clone()], names[1..].to_vec());
            lab.partition(&a, &b, fault == "oneway-partition")?;
            (vec![a, b], vec![])
        }
        "loss" => {
            lab.loss(&target, 20)?;
            (vec![], vec![target.clone()])
        }
        "freeze" => {
            lab.freeze(&target)?;
            (vec![], vec![target.clone()])
        }
        "kill" => {
            lab.kill(&target)?;
            (vec![], vec![target.clone()])
        }
        "crash" => {
            lab.crash(&target)?;
            (vec![], vec![target.clone()])
        }
        "restart" => {
            lab.restart(&target)?;
            (vec![], vec![target.clone()])
        }
        "upgrade" => {
            lab.upgrade(&target, upgrade_exe)?;
            (vec![], vec![target.clone()])
        }
        "fill-disk" => {
            lab.fill_disk(&target)?;
            (vec![], vec![])
        }
        other => anyhow::bail!("no fault {other}"),
    };
    let split_seen_ms = if sides.is_empty() {
        None
    } else {
        wait_split(
            lab,
            &sides,
            &secret,
            opts.fault_for + Duration::from_secs(10),
        )
        .then(|| shared.now_ms())
    };
    let until = Duration::from_millis(injected_ms) + opts.fault_for;
    let since_split = split_seen_ms.map(|ms| Duration::from_millis(ms) + Duration::from_secs(3));
    let until = until.max(since_split.unwrap_or_default());
    if let Some(left) = until.checked_sub(shared.started.elapsed()) {
        std::thread::sleep(left);
    }
    match fault {
        "partition" | "oneway-partition" | "loss" => lab.heal()?,
        "fill-disk" => lab.heal()?,
        "freeze" => lab.thaw(&target)?,
        "kill" | "crash" => lab.restart(&target)?,
        _ => {}
    }
    let healed_ms = shared.now_ms();
    std::thread::sleep(Duration::from_secs(1));
    shared.stop.store(true, Ordering::SeqCst);
    for t in threads {
        let _ = t.join();
    }
    // The truth is still only once the workload's last call has ended (a call may take up
    // to its 10 s timeout; a create that preempts waits for its victims to stop):
    // convergence is timed from then.
    let quiet_ms = shared.now_ms().max(healed_ms);

    // The catalogs against the owners, until they agree and every machine has settled.
    let apps = [app.clone(), "web".to_string()];
    let mut end = EndState {
        quiet_after_ms: quiet_ms - healed_ms,
        ..EndState::default()
    };
    let wait_from = Instant::now();
    loop {
        end.truth = truth(&nodes, &secret, &apps);
        end.catalogs = catalogs(&nodes, &secret, &apps);
        let agree =
            end.catalogs.len() == nodes.len() && end.catalogs.values().all(|c| *c == end.truth);
        if !agree && end.converged_after_ms.is_none() {
            end.last_disagreement = disagreement(&end, &nodes);
        }
        if agree && end.converged_after_ms.is_none() {
            end.converged_after_ms = Some(shared.now_ms() - quiet_ms);
        }
        // The checks look at the end once the operations still queued have run (an
        // acknowledged destroy may be waiting behind a start).
        if agree
            && end
                .truth
                .iter()
                .all(|m| check::SETTLED.contains(&m.state.as_str()))
        {
            break;
        }
        if wait_from.elapsed() > CONVERGE_WAIT {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    for n in &nodes {
        let held = get_json(n.api, "/host/v1/machines", &secret).and_then(|v| {
            v.as_array()?
                .iter()
                .filter(|m| m["state"] != "destroyed")
                .map(|m| m["id"].as_str().map(str::to_string))
                .collect::<Option<Vec<String>>>()
        });
        let sample = ledger(n, &secret, shared.now_ms());
        if let (Some(mut held), Some(sample)) = (held, sample) {
            held.retain(|id| !sample.displaced.contains(id));
            end.held.insert(n.name.clone(), held);
            end.ledgers.push(sample);
        }
    }
    let pids = watched
        .iter()
        .zip(before)
        .map(|((host, id), before)| PidWatch {
            machine: id.clone(),
            host: host.clone(),
            before,
            after: pids_of(id),
        })
        .collect();

    let mut calls: Vec<Call> = take(&shared.calls);
    calls.sort_by_key(|c| c.start_ms);
    let history = History {
        fault: FaultRecord {
            kind: fault.to_string(),
            sides,
            impaired,
            injected_ms,
            split_seen_ms,
            healed_ms,
        },
        host_ids,
        workload_apps: vec![app.clone()],
        calls,
        ledgers: take(&shared.ledgers),
        proxy: take(&shared.proxy),
        pids,
        end,
    };
    let (row, violations) = check::check(&history, &opts.bounds);
    let dir = opts.dir.join("histories");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(
        dir.join(format!("{round}-{fault}.json")),
        serde_json::to_string_pretty(&history)?,
    )?;
    clean_up(lab, &nodes, &secret, &app)?;
    Ok(FaultRun {
        round,
        row,
        violations,
        history,
    })
}

fn take<T>(m: &Mutex<Vec<T>>) -> Vec<T> {
    std::mem::take(&mut *m.lock().unwrap_or_else(|e| e.into_inner()))
}

/// Destroys the run's machines (not recorded) and waits until every host sees every host
/// alive again, so the next run starts from a whole cluster.
fn clean_up(lab: &Lab, nodes: &[Node], secret: &str, app: &str) -> anyhow::Result<()> {
    for m in truth(nodes, secret, &[app.to_string()]) {
        let _ = request(
            nodes[0].api,
            "DELETE",
            &format!("/v1/apps/{app}/machines/{}?force=true", m.id),
            None,
            lab.token(),
            None,
            CALL_TIMEOUT,
        );
    }
    lab.wait_converged(Duration::from_secs(90))
        .map(|_| ())
        .context("the hosts do not all see each other alive again")
}

/// Waits until every side's hosts see every host of the other sides gone.
fn wait_split(lab: &Lab, sides: &[Vec<String>], secret: &str, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    let addr_of = |name: &str| {
        lab.host(name)
            .map(|h| h.addr.to_string())
            .unwrap_or_default()
    };
    while Instant::now() < deadline {
        let split = sides.iter().enumerate().all(|(i, side)| {
            let others: Vec<String> = sides
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .flat_map(|(_, s)| s.iter().map(|n| addr_of(n)))
                .collect();
            side.iter().all(|name| {
                let Ok(h) = lab.host(name) else { return false };
                let Some(hosts) = get_json(h.api(), "/v1/catalog/hosts", secret) else {
                    return false;
                };
                hosts.as_array().into_iter().flatten().all(|row| {
                    let ip = row["api_addr"]
                        .as_str()
                        .and_then(|a| a.split(':').next())
                        .unwrap_or_default();
                    !others.iter().any(|o| o == ip) || row["status"] != "alive"
                })
            })
        });
        if split {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

fn get_json(addr: std::net::SocketAddr, path: &str, secret: &str) -> Option<Value> {
    match request(
        addr,
        "GET",
        path,
        None,
        secret,
        None,
        Duration::from_secs(3),
    ) {
        Reply::Answer(200, b) => serde_json::from_str(&b).ok(),
        _ => None,
    }
}

/// Every machine of `apps` its owner holds (not destroyed), from every host.
fn truth(nodes: &[Node], secret: &str, apps: &[String]) -> Vec<MachineView> {
    let mut all = Vec::new();
    for n in nodes {
        for app in apps {
            let path = format!("/host/v1/machines?app={app}");
            for m in get_json(n.api, &path, secret)
                .and_then(|v| v.as_array().cloned())
                .unwrap_or_default()
            {
                if let Some(v) = view(&m, app) {
                    all.push(v);
                }
            }
        }
    }
    all.sort();
    all
}

/// How each node's catalog differs from the owners' truth (a few rows each).
fn disagreement(end: &EndState, nodes: &[Node]) -> Vec<String> {
    let mut out = Vec::new();
    for n in nodes {
        let Some(rows) = end.catalogs.get(&n.name) else {
            out.push(format!("{}: no answer", n.name));
            continue;
        };
        let missing = end.truth.iter().filter(|m| !rows.contains(m)).take(3);
        out.extend(missing.map(|m| format!("{} lacks or differs on {m:?}", n.name)));
        let extra = rows.iter().filter(|m| !end.truth.contains(m)).take(3);
        out.extend(extra.map(|m| format!("{} shows {m:?}, which no owner holds so", n.name)));
        if *rows != end.truth && out.is_empty() {
            let twice = |list: &[MachineView]| -> Vec<String> {
                list.windows(2)
                    .filter(|w| w[0] == w[1])
                    .map(|w| format!("{:?}", w[0]))
                    .collect()
            };
            out.push(format!(
                "{}: the same rows, counted differently: {} against the truth's {}; twice in the catalog {:?}, in the truth {:?}",
                n.name,
                rows.len(),
                end.truth.len(),
                twice(rows),
                twice(&end.truth)
            ));
        }
    }
    out
}

/// Each node's catalog of `apps` (not destroyed); a node that does not answer is left out.
fn catalogs(nodes: &[Node], secret: &str, apps: &[String]) -> BTreeMap<String, Vec<MachineView>> {
    let mut out = BTreeMap::new();
    'nodes: for n in nodes {
        let mut rows = Vec::new();
        for app in apps {
            let Some(v) = get_json(n.api, &format!("/v1/catalog/machines?app={app}"), secret)
            else {
                continue 'nodes;
            };
            rows.extend(
                v.as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|m| view(m, app)),
            );
        }
        rows.sort();
        out.insert(n.name.clone(), rows);
    }
    out
}

fn view(m: &Value, app: &str) -> Option<MachineView> {
    let state = m["state"].as_str()?;
    if state == "destroyed" || m["deleted"] == true {
        return None;
    }
    Some(MachineView {
        id: m["id"].as_str()?.to_string(),
        name: m["name"].as_str().unwrap_or_default().to_string(),
        app: app.to_string(),
        host_id: m["host_id"].as_str()?.to_string(),
        state: state.to_string(),
    })
}

/// The pids of the processes whose environment names machine `id` (its workload).
fn pids_of(id: &str) -> Vec<u32> {
    let needle = format!("FLY_MACHINE_ID={id}\0");
    let mut pids: Vec<u32> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
            String::from_utf8_lossy(&env)
                .contains(&needle)
                .then_some(pid)
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// The fault matrix as a markdown table (one row per run).
pub fn matrix(runs: &[FaultRun]) -> String {
    let mut out = String::from(
        "| fault | round | ops tried | acknowledged | indeterminate | lost | duplicated | overcommits | converged after the last op | proxy errors during fault | violations |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in runs {
        let row = &r.row;
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.2} % ({}/{}) | {} |\n",
            row.fault,
            r.round,
            row.tried,
            row.acknowledged,
            row.indeterminate,
            row.lost,
            row.duplicated,
            row.overcommits,
            row.converged_ms
                .map(|ms| format!("{ms} ms"))
                .unwrap_or_else(|| "not within 30 s".into()),
            row.proxy_error_rate() * 100.0,
            row.proxy_errors,
            row.proxy_requests,
            if r.violations.is_empty() {
                "none".to_string()
            } else {
                r.violations
                    .iter()
                    .map(|v| v.invariant)
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        ));
    }
    out
}
