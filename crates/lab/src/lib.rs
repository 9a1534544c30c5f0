//! `bazaar lab`: a fleet of N hosts on one Linux machine. Each host is a network namespace
//! with one address on a lab bridge (a private subnet the lab creates and removes) and one
//! `bazaar agent` inside it; its shims and workloads run in that namespace too. The hosts
//! talk over mTLS: h1 holds the cluster CA (`DIR/ca`), the others join it with one-time
//! tokens, as `bazaar dev`'s hosts do. Faults are
//! injected per host: partitions and packet loss (nftables in the host's namespace),
//! freeze/thaw (SIGSTOP/SIGCONT of the agent), kill (agent only), crash (power loss:
//! everything of the host), restart, upgrade (another binary), a full disk.
//!
//! A pure core and a thin I/O shell: [`plan`] decides names, addresses, agent command
//! lines and rulesets; `net`, `procs` and `disk` carry them out. [`Lab`] is the library
//! API the CLI (`bazaar lab ...`) and fault suites drive; its state lives in
//! `DIR/lab.json`, so every call may come from a different process.
//!
//! The fault suite: [`faults`] (the runner) records a [`history::History`] of every call
//! under each fault, and [`check`] (pure) judges it against the invariants.

pub mod check;
mod disk;
pub mod faults;
pub mod history;
mod http;
pub mod net;
pub mod plan;
mod procs;
mod wire;

pub use plan::{AgentSettings, Faults, HostPlan, LabPlan, Subnet};
pub use procs::{AgentState, ProcId};

use http::{dechunk, http_get};

use anyhow::Context;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The state file in the lab's directory.
const STATE_FILE: &str = "lab.json";
/// The env file `lab up` writes (URLs and token of host 1).
pub const ENV_FILE: &str = "lab.env";
/// Serializes `lab up`s on this machine while they pick a subnet and a name: a lock on
/// this directory, which every Linux machine has (a lock file would be left behind).
const MACHINE_LOCK: &str = "/run";
/// How long an agent has to answer `/health` after it starts.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Each host's host listener (mTLS between hosts), on its address.
const HOST_LISTEN_PORT: u16 = 4480;

/// What `lab up` is asked for.
#[derive(Debug, Clone)]
pub struct UpOptions {
    /// The lab's directory (state, env file, host data, logs).
    pub dir: PathBuf,
    pub hosts: usize,
    pub regions: Vec<String>,
    /// The lab's subnet; default: the first free /24 of 10.250.0.0/16.
    pub subnet: Option<Subnet>,
    /// The `bazaar` executable the agents run.
    pub exe: PathBuf,
    /// Each host's data dir on a small loop-mounted ext4 (for `fill-disk`).
    pub small_disk: bool,
    pub agent: AgentSettings,
}

/// One host as the lab keeps it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HostState {
    /// The `bazaar` executable its agent runs (changed by `upgrade`).
    pub exe: PathBuf,
    /// The agent process, once started.
    pub agent: Option<ProcId>,
    /// The agent's host id (its machines' cgroups are named after it).
    pub host_id: Option<String>,
}

/// Everything `DIR/lab.json` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LabState {
    pub plan: LabPlan,
    pub token: String,
    pub cluster_secret: String,
    pub small_disk: bool,
    pub agent: AgentSettings,
    pub hosts: Vec<HostState>,
    pub faults: Faults,
}

/// One host as `lab status` shows it.
#[derive(Debug, Clone)]
pub struct HostStatus {
    pub name: String,
    pub region: String,
    pub addr: std::net::Ipv4Addr,
    pub api_url: String,
    pub agent: AgentState,
    pub pid: Option<u32>,
    pub rss_kib: Option<u64>,
    /// Faults on this host, in words (`cut from h2,h3`, `loss 20%`, `disk full`).
    pub faults: Vec<String>,
}

/// A lab on this machine, opened from its directory.
#[derive(Debug)]
pub struct Lab {
    dir: PathBuf,
    state: LabState,
}

/// An exclusive `flock` held until dropped.
#[derive(Debug)]
struct FileLock {
    _file: std::fs::File,
}

impl FileLock {
    /// Locks `path`, a directory or a file (created if missing).
    fn take(path: &Path) -> anyhow::Result<FileLock> {
        let f = if path.is_dir() {
            std::fs::File::open(path)
        } else {
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(path)
        }
        .with_context(|| format!("opening {}", path.display()))?;
        // SAFETY: flock on a descriptor we own.
        let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
        anyhow::ensure!(rc == 0, "locking {}", path.display());
        Ok(FileLock { _file: f })
    }
}

impl Lab {
    /// Creates the lab's network, starts every agent and waits until each answers. On
    /// failure everything made so far is removed again.
    pub fn up(opts: UpOptions) -> anyhow::Result<Lab> {
        anyhow::ensure!(
            // SAFETY: geteuid has no preconditions.
            unsafe { libc::geteuid() } == 0,
            "a lab creates network namespaces: run it as root"
        );
        anyhow::ensure!(opts.hosts >= 1, "--hosts must be at least 1");
        std::fs::create_dir_all(&opts.dir)
            .with_context(|| format!("creating {}", opts.dir.display()))?;
        let dir = std::fs::canonicalize(&opts.dir)?;
        let _dir_lock = FileLock::take(&dir.join("lab.lock"))?;
        anyhow::ensure!(
            !dir.join(STATE_FILE).exists(),
            "a lab is already up in {}; `bazaar lab down --dir {}` first",
            dir.display(),
            dir.display()
        );
        let machine_lock = FileLock::take(Path::new(MACHINE_LOCK))?;
        let subnet = match opts.subnet {
            Some(s) => {
                let used = net::subnets_in_use()?;
                if let Some(u) = used.iter().find(|u| u.overlaps(&s)) {
                    anyhow::bail!("subnet {s} overlaps {u}, already in use on this machine");
                }
                s
            }
            None => {
                let pool: Subnet = plan::DEFAULT_POOL.parse().map_err(anyhow::Error::msg)?;
                let prefix = if opts.hosts + 3 > 256 { 16 } else { 24 };
                plan::pick_subnet(&pool, prefix, &net::subnets_in_use()?).with_context(|| {
                    format!("no free /{prefix} left in {pool}; choose one with --subnet")
                })?
            }
        };
        let id = loop {
            let id = hex::encode(rand::random::<[u8; 2]>());
            let netns = Path::new(net::NETNS_DIR).join(format!("bzlab-{id}-1"));
            if !net::link_exists(&format!("bzlab-{id}")) && !netns.exists() {
                break id;
            }
        };
        let plan =
            LabPlan::new(&id, subnet, opts.hosts, &opts.regions).map_err(anyhow::Error::msg)?;
        let state = LabState {
            hosts: plan
                .hosts
                .iter()
                .map(|_| HostState {
                    exe: opts.exe.clone(),
                    agent: None,
                    host_id: None,
                })
                .collect(),
            plan,
            token: hex::encode(rand::random::<[u8; 20]>()),
            cluster_secret: hex::encode(rand::random::<[u8; 24]>()),
            small_disk: opts.small_disk,
            agent: opts.agent,
            faults: Faults::default(),
        };
        let mut lab = Lab { dir, state };
        // The state file comes first: `down` removes whatever a failed `up` made.
        lab.save()?;
        let started = lab.bring_up(machine_lock);
        if let Err(err) = started {
            let cleanup = lab.remove_everything();
            return Err(match cleanup {
                Ok(()) => err,
                Err(e) => err.context(format!("and cleaning up failed too: {e:#}")),
            });
        }
        Ok(lab)
    }

    fn bring_up(&mut self, machine_lock: FileLock) -> anyhow::Result<()> {
        net::create(&self.state.plan)?;
        // Names and subnet are now visible to other `lab up`s.
        drop(machine_lock);
        write_private(
            &self.dir.join("api-tokens"),
            &format!("{}\n", self.state.token),
        )?;
        std::fs::create_dir_all(self.dir.join("logs"))?;
        // The cluster's CA, held by h1; the others join with one-time tokens.
        bazaar_pki::ClusterCa::init(&self.ca_dir())?;
        for h in self.state.plan.hosts.clone() {
            let data = self.data_dir(&h);
            std::fs::create_dir_all(&data)?;
            if self.state.small_disk {
                disk::mount_small_disk(&self.dir.join(format!("hosts/{}.img", h.name)), &data)?;
            }
            self.spawn_agent(&h)?;
        }
        self.save()?;
        for h in self.state.plan.hosts.clone() {
            self.wait_healthy(&h)?;
            self.state.hosts[h.index - 1].host_id = self.host_id_of(&h);
        }
        self.save()?;
        let first = &self.state.plan.hosts[0];
        // Operator commands reach host 1 over its host listener with its certificate
        // (`--host-data-dir`): the lab's addresses are not loopback, and the cluster secret
        // is not sent over plain HTTP to them.
        let env = format!(
            "BAZAAR_API_URL=http://{}\nBAZAAR_PROXY_URL=http://{}\nBAZAAR_TOKEN={}\nBAZAAR_CLUSTER_SECRET={}\nBAZAAR_HOST_DATA_DIR={}\nBAZAAR_LAB_DIR={}\n",
            first.api(),
            first.proxy(),
            self.state.token,
            self.state.cluster_secret,
            self.data_dir(first).display(),
            self.dir.display()
        );
        write_private(&self.env_file(), &env)?;
        Ok(())
    }

    /// Opens the lab in `dir`.
    pub fn open(dir: &Path) -> anyhow::Result<Lab> {
        let dir = std::fs::canonicalize(dir)
            .with_context(|| format!("no lab in {} (run `bazaar lab up`)", dir.display()))?;
        let path = dir.join(STATE_FILE);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("no lab in {} (run `bazaar lab up`)", dir.display()))?;
        let state =
            serde_json::from_str(&text).with_context(|| format!("reading {}", path.display()))?;
        Ok(Lab { dir, state })
    }

    /// Runs `change` on the state as it is on disk, under the lab's lock, and saves it.
    fn change<T>(
        &mut self,
        change: impl FnOnce(&mut Lab) -> anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        let _lock = FileLock::take(&self.dir.join("lab.lock"))?;
        *self = Lab::open(&self.dir)?;
        let out = change(self);
        self.save()?;
        out
    }

    fn save(&self) -> anyhow::Result<()> {
        let path = self.dir.join(STATE_FILE);
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, serde_json::to_string_pretty(&self.state)?)?;
        std::fs::rename(&tmp, &path)?;
        Ok(())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn plan(&self) -> &LabPlan {
        &self.state.plan
    }

    pub fn state(&self) -> &LabState {
        &self.state
    }

    /// The API token the agents accept (also in the env file).
    pub fn token(&self) -> &str {
        &self.state.token
    }

    pub fn cluster_secret(&self) -> &str {
        &self.state.cluster_secret
    }

    /// `DIR/lab.env`.
    pub fn env_file(&self) -> PathBuf {
        self.dir.join(ENV_FILE)
    }

    /// The host called `name` (`h2` or `2`).
    pub fn host(&self, name: &str) -> anyhow::Result<HostPlan> {
        self.state
            .plan
            .host(name)
            .cloned()
            .map_err(anyhow::Error::msg)
    }

    /// `http://<addr>:<api port>` of a host.
    pub fn api_url(&self, host: &HostPlan) -> String {
        format!("http://{}", host.api())
    }

    /// `http://<addr>:<proxy port>` of a host.
    pub fn proxy_url(&self, host: &HostPlan) -> String {
        format!("http://{}", host.proxy())
    }

    /// A host's data dir.
    pub fn data_dir(&self, host: &HostPlan) -> PathBuf {
        self.dir.join("hosts").join(&host.name)
    }

    /// A host's agent log.
    pub fn log_file(&self, host: &HostPlan) -> PathBuf {
        self.dir.join("logs").join(format!("{}.log", host.name))
    }

    /// The agent process of a host, if one was started.
    pub fn agent(&self, host: &HostPlan) -> Option<ProcId> {
        self.state.hosts[host.index - 1].agent
    }

    /// Every host: address, agent state and memory, faults.
    pub fn status(&self) -> Vec<HostStatus> {
        self.state
            .plan
            .hosts
            .iter()
            .map(|h| {
                let agent = self.agent(h);
                let state = agent.map(|a| a.state()).unwrap_or(AgentState::Down);
                let mut faults = Vec::new();
                let cut: Vec<&str> = self
                    .state
                    .faults
                    .blocked
                    .iter()
                    .filter(|(from, _)| *from == h.name)
                    .map(|(_, to)| to.as_str())
                    .collect();
                if !cut.is_empty() {
                    faults.push(format!("drops to {}", cut.join(",")));
                }
                if let Some(p) = self.state.faults.loss.get(&h.name) {
                    faults.push(format!("loss {p}%"));
                }
                if self.data_dir(h).join(disk::FILLER).exists() {
                    faults.push("disk full".into());
                }
                HostStatus {
                    name: h.name.clone(),
                    region: h.region.clone(),
                    addr: h.addr,
                    api_url: self.api_url(h),
                    agent: state,
                    pid: agent.filter(|_| state != AgentState::Down).map(|a| a.pid),
                    rss_kib: agent.and_then(|a| a.rss_kib()),
                    faults,
                }
            })
            .collect()
    }

    /// Waits until every host's catalog lists every host alive; answers how long it took.
    pub fn wait_converged(&self, within: Duration) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let n = self.state.plan.hosts.len();
        let mut pending: Vec<HostPlan> = self.state.plan.hosts.clone();
        while !pending.is_empty() {
            pending.retain(|h| self.alive_in_catalog(h) != Some(n));
            if pending.is_empty() {
                break;
            }
            anyhow::ensure!(
                started.elapsed() < within,
                "not every host sees {n} alive hosts within {within:?}: {}",
                pending
                    .iter()
                    .map(|h| format!("{} sees {:?}", h.name, self.alive_in_catalog(h)))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(started.elapsed())
    }

    /// How many hosts `host`'s catalog lists alive (`None` if it does not answer).
    pub fn alive_in_catalog(&self, host: &HostPlan) -> Option<usize> {
        let (status, body) =
            http_get(host.api(), "/v1/catalog/hosts", &self.state.cluster_secret).ok()?;
        if status != 200 {
            return None;
        }
        let hosts: Vec<serde_json::Value> = serde_json::from_str(&body).ok()?;
        Some(hosts.iter().filter(|h| h["status"] == "alive").count())
    }

    /// Cuts hosts `a` from hosts `b` (both ways, or only what `a` sends when `oneway`).
    /// Partitions add up until `heal`.
    pub fn partition(&mut self, a: &[String], b: &[String], oneway: bool) -> anyhow::Result<()> {
        let canon = |lab: &Lab, names: &[String]| -> anyhow::Result<Vec<String>> {
            names.iter().map(|n| Ok(lab.host(n)?.name)).collect()
        };
        let (a, b) = (canon(self, a)?, canon(self, b)?);
        if let Some(both) = a.iter().find(|x| b.contains(x)) {
            anyhow::bail!("{both} is on both sides of the partition");
        }
        self.change(|lab| {
            let mut next = lab.state.faults.clone();
            next.partition(&a, &b, oneway);
            lab.set_faults(next)
        })
    }

    /// Loses `percent` of the packets `host` sends and receives (0 ends it).
    pub fn loss(&mut self, host: &str, percent: u8) -> anyhow::Result<()> {
        anyhow::ensure!(percent <= 100, "loss must be between 0 and 100%");
        let name = self.host(host)?.name;
        self.change(|lab| {
            let mut next = lab.state.faults.clone();
            if percent == 0 {
                next.loss.remove(&name);
            } else {
                next.loss.insert(name, percent);
            }
            lab.set_faults(next)
        })
    }

    /// Ends every partition and loss, and frees every filled disk.
    pub fn heal(&mut self) -> anyhow::Result<()> {
        self.change(|lab| {
            lab.set_faults(Faults::default())?;
            for h in lab.state.plan.hosts.clone() {
                disk::free(&lab.data_dir(&h))?;
            }
            Ok(())
        })
    }

    /// Rewrites the firewall of every host whose rules change.
    fn set_faults(&mut self, next: Faults) -> anyhow::Result<()> {
        let changed: Vec<String> = self
            .state
            .faults
            .hosts_changed(&next)
            .into_iter()
            .map(str::to_string)
            .collect();
        for name in changed {
            let host = self.host(&name)?;
            net::apply_firewall(&host, &self.state.plan.firewall(&host, &next))?;
        }
        self.state.faults = next;
        Ok(())
    }

    /// SIGSTOPs the host's agent (a gray failure: its connections stay open, it answers
    /// nothing).
    pub fn freeze(&mut self, host: &str) -> anyhow::Result<()> {
        let agent = self.running_agent(host)?;
        agent.signal(libc::SIGSTOP);
        agent.wait_state(AgentState::Frozen, Duration::from_secs(5))
    }

    /// SIGCONTs the host's agent.
    pub fn thaw(&mut self, host: &str) -> anyhow::Result<()> {
        let agent = self.running_agent(host)?;
        agent.signal(libc::SIGCONT);
        agent.wait_state(AgentState::Running, Duration::from_secs(5))
    }

    fn running_agent(&self, host: &str) -> anyhow::Result<ProcId> {
        let h = self.host(host)?;
        self.agent(&h)
            .filter(|a| a.state() != AgentState::Down)
            .with_context(|| format!("the agent of {} is not running", h.name))
    }

    /// SIGKILLs the host's agent; its shims and workloads keep running.
    pub fn kill(&mut self, host: &str) -> anyhow::Result<()> {
        let agent = self.running_agent(host)?;
        agent.signal(libc::SIGKILL);
        anyhow::ensure!(
            agent.wait_gone(Duration::from_secs(10)),
            "agent {} survived SIGKILL",
            agent.pid
        );
        Ok(())
    }

    /// Power loss: the host's agent, shims and workloads all die at once.
    pub fn crash(&mut self, host: &str) -> anyhow::Result<()> {
        let h = self.host(host)?;
        procs::kill_host(&h.netns, &self.data_dir(&h))
    }

    /// Stops the host's agent if it runs (SIGTERM; workloads keep running) and starts it
    /// again; waits until it answers.
    pub fn restart(&mut self, host: &str) -> anyhow::Result<()> {
        let h = self.host(host)?;
        self.change(|lab| {
            lab.stop_agent(&h)?;
            lab.spawn_agent(&h)
        })?;
        self.wait_healthy(&h)
    }

    /// Replaces the host's agent with `exe` (another `bazaar` binary): stops the running
    /// one, starts the new one on the same data; its machines keep running.
    pub fn upgrade(&mut self, host: &str, exe: &Path) -> anyhow::Result<()> {
        let exe =
            std::fs::canonicalize(exe).with_context(|| format!("no binary {}", exe.display()))?;
        anyhow::ensure!(
            is_executable(&exe),
            "{} is not an executable file",
            exe.display()
        );
        let h = self.host(host)?;
        self.change(|lab| {
            lab.stop_agent(&h)?;
            lab.state.hosts[h.index - 1].exe = exe;
            lab.spawn_agent(&h)
        })?;
        self.wait_healthy(&h)
    }

    /// Fills the host's data dir (a small disk from `up --small-disk`) to the last block;
    /// answers the bytes written.
    pub fn fill_disk(&mut self, host: &str) -> anyhow::Result<u64> {
        let h = self.host(host)?;
        let data = self.data_dir(&h);
        anyhow::ensure!(
            self.state.small_disk && disk::is_mounted(&data),
            "{} has no small disk: start the lab with `lab up --small-disk`",
            h.name
        );
        disk::fill(&data)
    }

    /// Removes what `fill_disk` wrote.
    pub fn free_disk(&mut self, host: &str) -> anyhow::Result<()> {
        let h = self.host(host)?;
        disk::free(&self.data_dir(&h))
    }

    /// Removes the whole lab: every process of every host, the agents' machine
    /// namespaces and cgroups, mounts and loop devices, namespaces, veths, the bridge, the
    /// state (logs stay in `DIR/logs`).
    pub fn down(mut self) -> anyhow::Result<()> {
        let _lock = FileLock::take(&self.dir.join("lab.lock"))?;
        self = Lab::open(&self.dir)?;
        self.remove_everything()
    }

    fn remove_everything(&mut self) -> anyhow::Result<()> {
        let mut errors = Vec::new();
        for h in self.state.plan.hosts.clone() {
            let data = self.data_dir(&h);
            if let Err(e) = procs::kill_host(&h.netns, &data) {
                errors.push(format!("{e:#}"));
            }
            net::remove_machine_namespaces(&data);
            let host_id = self.state.hosts[h.index - 1].host_id.clone();
            if let Some(id) = &host_id {
                remove_cgroups(id, &data);
            }
            // What the host's agent made outside its namespace and data dir: the user
            // namespaces owning its machines' network namespaces, their id range claims,
            // its runtime dir (`/run/bazaar/<host id>`).
            bazaar_agent::cleanup::release_host(&data, host_id.as_deref());
        }
        if let Err(e) = disk::unmount_under(&self.dir) {
            errors.push(format!("{e:#}"));
        }
        if let Err(e) = net::remove(&self.state.plan) {
            errors.push(format!("{e:#}"));
        }
        anyhow::ensure!(errors.is_empty(), "lab down: {}", errors.join("; "));
        let _ = std::fs::remove_dir_all(self.dir.join("hosts"));
        for f in [STATE_FILE, ENV_FILE, "api-tokens"] {
            let _ = std::fs::remove_file(self.dir.join(f));
        }
        Ok(())
    }

    /// What of the lab is still on the machine (namespaces, links, mounts, loop devices,
    /// cgroups, processes); empty after `down`.
    pub fn leftovers(&self) -> Vec<String> {
        let mut left: Vec<String> = net::namespaces(&self.state.plan);
        left.extend(net::links(&self.state.plan));
        left.extend(disk::mounts_under(&self.dir));
        left.extend(disk::loops_under(&self.dir));
        for (h, host) in self.state.plan.hosts.iter().zip(&self.state.hosts) {
            if let Some(id) = &host.host_id {
                left.extend(cgroups_of(id).into_iter().map(|p| p.display().to_string()));
            }
            for pid in procs::processes_of_host(&h.netns, &self.data_dir(h)) {
                if ProcId::of(pid).is_some_and(|p| p.state() != AgentState::Down) {
                    left.push(format!("process {pid} of {}", h.name));
                }
            }
        }
        left
    }

    /// The cluster CA's directory (h1 holds it).
    fn ca_dir(&self) -> PathBuf {
        self.dir.join("ca")
    }

    fn spawn_agent(&mut self, h: &HostPlan) -> anyhow::Result<()> {
        if let Some(config) = &self.state.agent.config {
            let file = AgentSettings::config_file(h, &self.data_dir(h));
            std::fs::write(&file, config).with_context(|| format!("writing {}", file.display()))?;
        }
        let mut args = self.state.plan.agent_args(
            h,
            &self.state.agent,
            &self.data_dir(h),
            &self.dir.join("api-tokens"),
        );
        // Hosts talk over mTLS, as `bazaar dev`'s do: h1 holds the CA, the others join it
        // (once: a host keeps its certificate in its data dir).
        let first = &self.state.plan.hosts[0];
        let host_listen = |h: &HostPlan| SocketAddr::from((h.addr, HOST_LISTEN_PORT));
        args.extend(["--host-listen".to_string(), host_listen(h).to_string()]);
        let mut join_token = None;
        if h.index == first.index {
            args.extend([
                "--cluster-ca".to_string(),
                self.ca_dir().display().to_string(),
            ]);
        } else {
            args.extend(["--join-addr".to_string(), host_listen(first).to_string()]);
            if !self
                .data_dir(h)
                .join("tls")
                .join(bazaar_pki::HOST_FILE)
                .exists()
            {
                let ca = bazaar_pki::ClusterCa::open(&self.ca_dir())?;
                join_token = Some(ca.new_join_token(Duration::from_secs(600))?.to_string());
            }
        }
        let exe = self.state.hosts[h.index - 1].exe.clone();
        let log_level = std::env::var("BAZAAR_LOG").unwrap_or_else(|_| "info".into());
        let agent = procs::spawn_in_netns(
            &h.netns,
            &exe,
            &args,
            &[
                ("BAZAAR_CLUSTER_SECRET", self.state.cluster_secret.as_str()),
                ("BAZAAR_LOG", log_level.as_str()),
            ]
            .into_iter()
            .chain(join_token.as_deref().map(|t| ("BAZAAR_JOIN_TOKEN", t)))
            .collect::<Vec<_>>(),
            &self.log_file(h),
        )?;
        self.state.hosts[h.index - 1].agent = Some(agent);
        Ok(())
    }

    /// SIGTERMs the agent (thawing it if frozen) and waits for it; SIGKILL after 30 s.
    fn stop_agent(&mut self, h: &HostPlan) -> anyhow::Result<()> {
        if let Some(agent) = self.agent(h) {
            agent.signal(libc::SIGTERM);
            agent.signal(libc::SIGCONT);
            if !agent.wait_gone(Duration::from_secs(30)) {
                agent.signal(libc::SIGKILL);
                anyhow::ensure!(
                    agent.wait_gone(Duration::from_secs(10)),
                    "agent {} of {} does not stop",
                    agent.pid,
                    h.name
                );
            }
        }
        self.state.hosts[h.index - 1].agent = None;
        Ok(())
    }

    /// Waits until the host's agent answers `/health`.
    pub fn wait_healthy(&self, h: &HostPlan) -> anyhow::Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if matches!(http_get(h.api(), "/health", ""), Ok((200, _))) {
                return Ok(());
            }
            let running = self.agent(h).is_some_and(|a| a.state() != AgentState::Down);
            if !running || Instant::now() > deadline {
                let log = std::fs::read_to_string(self.log_file(h)).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(20).collect();
                anyhow::bail!(
                    "the agent of {} {} ; its log ({}) ends:\n{}",
                    h.name,
                    if running { "does not answer" } else { "exited" },
                    self.log_file(h).display(),
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn host_id_of(&self, h: &HostPlan) -> Option<String> {
        let (status, body) = http_get(h.api(), "/host/v1/info", &self.state.cluster_secret).ok()?;
        if status != 200 {
            return None;
        }
        let info: serde_json::Value = serde_json::from_str(&body).ok()?;
        info["id"].as_str().map(str::to_string)
    }
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Writes a file only its owner can read.
fn write_private(path: &Path, contents: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    f.write_all(contents.as_bytes())?;
    Ok(())
}

/// Removes the cgroups of a host's machines and the host's own (`bazaar/<host id>/...`).
fn remove_cgroups(host_id: &str, data_dir: &Path) {
    for m in std::fs::read_dir(data_dir.join("machines"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let id = m.file_name().to_string_lossy().into_owned();
        let _ = bazaar_shim::remove_cgroup(&format!("bazaar/{host_id}/{id}"));
    }
    let _ = bazaar_shim::remove_cgroup(&format!("bazaar/{host_id}"));
}

/// The cgroup directories of a host that exist (`bazaar/<host id>` in the unified
/// hierarchy or in any v1 hierarchy).
fn cgroups_of(host_id: &str) -> Vec<PathBuf> {
    let root = Path::new("/sys/fs/cgroup");
    std::iter::once(root.to_path_buf())
        .chain(
            std::fs::read_dir(root)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path()),
        )
        .map(|h| h.join("bazaar").join(host_id))
        .filter(|p| p.is_dir())
        .collect()
}
