//! The agent's shared state, its start-up (re-adoption, resuming operations), and the accept
//! side of every operation on an existing machine: validate a request against the machine's
//! state, record the operation durably in the same transaction as its effects on the record,
//! then hand it to the machine's actor ([`crate::actor`]) to run. Every change is published
//! through [`crate::publish`]. Creates and the market live in [`crate::market`], leases and
//! metadata in [`crate::leases`], reads in [`crate::views`].

use crate::actor::{spawn_actor, ActorMsg};
use crate::config::AgentConfig;
use crate::driver::{self, Driver};
use crate::error::AgentError;
use crate::fault::CrashPoint;
use crate::leases::check_lease;
use crate::record::{MachineRecord, OpKind, Operation};
use crate::store::{Batch, Store};
use bazaar_placement::{Ledger, LedgerError};
use bazaar_runtime::MachineDriver;
use bazaar_types::config::MachineConfig;
use bazaar_types::event::MachineEvent;
use bazaar_types::guest::Guest;
use bazaar_types::host::{HostInfo, Resources, StopRequest, UpdateRequest};
use bazaar_types::machine::Machine;
use bazaar_types::signal::Signal;
use bazaar_types::state::{check_transition, MachineState};
use bazaar_types::{ids, now_ms};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// A machine's live state, published to waiters.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub state: MachineState,
    pub instance_id: String,
    /// The newest event's id and the status it recorded.
    pub event_id: String,
    pub event_status: String,
}

/// The agent, cheap to clone.
#[derive(Debug, Clone)]
pub struct Agent(pub(crate) Arc<Inner>);

/// Shared state of the agent.
#[derive(Debug)]
pub(crate) struct Inner {
    pub config: AgentConfig,
    pub host_id: String,
    pub store: Store,
    /// The ledger; its lock also serializes every accepted write, so validation and the
    /// durable write happen as one step.
    pub ledger: tokio::sync::Mutex<Ledger>,
    /// The host plumbing (paths, network, volumes, images) of this host's machines.
    pub driver: Driver,
    /// What the actors launch, find and remove runs with: `driver` itself, or a fake in
    /// tests ([`Agent::start_with_driver`]).
    pub machine_driver: Arc<dyn MachineDriver>,
    pub actors: Mutex<HashMap<String, mpsc::UnboundedSender<ActorMsg>>>,
    pub live: Mutex<HashMap<String, watch::Sender<Snapshot>>>,
    /// State shown while an operation runs (`starting`, `stopping`, ...).
    pub transient: Mutex<HashMap<String, MachineState>>,
    pub crash: CrashPoint,
    pub next_op_id: AtomicU64,
    pub shutdown: CancellationToken,
    pub tracker: TaskTracker,
    /// Accepted bearer tokens: the cluster secret and API tokens.
    pub tokens: Mutex<Vec<String>>,
    /// The token file's modification time and length when last read (it is re-read when
    /// they change).
    pub tokens_read: Mutex<Option<(Option<std::time::SystemTime>, u64)>>,
    /// Hashes of the tokens this host's token file revokes (published in its host record).
    pub revoked_here: Mutex<std::collections::BTreeSet<String>>,
    /// Hashes of the tokens revoked anywhere in the cluster: this host's and those every
    /// host record publishes (refreshed by housekeeping).
    pub revoked: std::sync::RwLock<HashSet<String>>,
    /// Verifies scoped tokens, if this host has the cluster's public token key (`tokens.rs`).
    pub token_verifier: Option<bazaar_auth::Verifier>,
    /// The record of changes made through this host's API (`audit.rs`).
    pub audit: crate::audit::AuditLog,
    pub ports_in_use: Mutex<HashSet<u16>>,
    /// Machine network addresses held by this host's machines (image machines).
    pub addresses_in_use: Mutex<HashSet<std::net::Ipv4Addr>>,
    /// Uids held by this host's process machines (`identity.rs`).
    pub uids_in_use: Mutex<HashSet<u32>>,
    pub cluster_secret: String,
    /// The gossip replica, once attached: every change to a machine is published to it.
    pub catalog: std::sync::OnceLock<bazaar_catalog::Catalog>,
    /// The last host record published (to publish only changes).
    pub last_host_record: Mutex<Option<bazaar_catalog::HostRecord>>,
    /// Where this host's edge proxy listens, once it does (published as the host label
    /// `proxy_addr`, so other proxies can hand requests for this host's machines to it).
    pub proxy_addr: std::sync::OnceLock<std::net::SocketAddr>,
    /// The proxy's hop listener (mTLS, hosts with certificates only; published as
    /// `proxy_hop_addr`): other proxies hand requests for this host's machines to it.
    pub proxy_hop_addr: std::sync::OnceLock<std::net::SocketAddr>,
    /// This host's host listener and its mTLS client to other hosts, once it has a cluster
    /// certificate ([`crate::host_tls`]; published as the host label `host_addr`).
    pub host_link: std::sync::OnceLock<crate::host_tls::HostLink>,
    /// The host labels announcing this host's mesh (key, endpoint, prefix), once it runs
    /// ([`crate::mesh`]).
    pub mesh_labels: Mutex<std::collections::BTreeMap<String, String>>,
    /// The latest health-check results of this host's machines ([`crate::checks`]).
    pub checks: Mutex<HashMap<String, Vec<bazaar_catalog::CheckRecord>>>,
    /// Disk offered to volumes, in GB.
    pub disk_gb: u64,
    /// Held while a volume's storage step runs (one at a time per host, so a retried create
    /// never formats or mounts the same image twice at once).
    pub volume_steps: tokio::sync::Mutex<()>,
    /// Operations and steps run ([`crate::metrics`]).
    pub metrics: crate::metrics::AgentMetrics,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The health-check results of this host's machines ([`crate::checks`]).
pub(crate) fn lock_checks(
    agent: &Agent,
) -> std::sync::MutexGuard<'_, HashMap<String, Vec<bazaar_catalog::CheckRecord>>> {
    lock(&agent.0.checks)
}

impl Agent {
    /// Opens the store, restores the ledger, re-adopts running workloads and resumes every
    /// unfinished operation.
    pub async fn start(config: AgentConfig) -> anyhow::Result<Agent> {
        Self::start_with_driver(config, None).await
    }

    /// [`Agent::start`] whose actors run machines with `machine_driver` (tests: a fake
    /// driver) instead of this host's shims and runc (`None`).
    pub async fn start_with_driver(
        config: AgentConfig,
        machine_driver: Option<Arc<dyn MachineDriver>>,
    ) -> anyhow::Result<Agent> {
        std::fs::create_dir_all(&config.data_dir)?;
        // Machines' environments, specs and volumes are in here: the agent's user only.
        {
            use std::os::unix::fs::PermissionsExt;
            let private = std::fs::Permissions::from_mode(0o700);
            std::fs::set_permissions(&config.data_dir, private)?;
        }
        let store = Store::open(&config.data_dir.join("agent.redb"))?;
        let host_id = match store.meta("host_id")? {
            Some(id) => id,
            None => {
                let id = ids::new_host_id();
                let mut b = Batch::default();
                b.meta("host_id", &id);
                store.write(&b)?;
                id
            }
        };
        // With a mesh, the machine network is this host's prefix of the private range.
        let config = crate::mesh::with_host_prefix(config, &host_id)?;
        let secret = crate::secrets::cluster_secret(&config)?;
        let mut tokens = vec![secret.clone()];
        let mut revoked_here = std::collections::BTreeSet::new();
        if let Some(path) = &config.token_file {
            let file = crate::secrets::read_tokens(path)?;
            tokens.extend(file.tokens);
            revoked_here = file.revoked;
        }
        let revoked = revoked_here.iter().cloned().collect();
        let is_root = rustix::process::geteuid().is_root();
        let cgroups = is_root && config.isolate && bazaar_shim::cgroups_available();
        let exe = match &config.shim_exe {
            Some(p) => p.clone(),
            None => std::env::current_exe()?,
        };
        let driver = Driver {
            exe,
            machines_dir: config.data_dir.join("machines"),
            host_id: host_id.clone(),
            isolate: is_root && config.isolate,
            cgroups,
            log_max_bytes: config.log_max_bytes,
            volumes: crate::volume_fs::VolumeFs::new(&config.data_dir),
            oci: crate::oci::OciRuntime::for_agent(&config.oci_settings(), &host_id, cgroups),
            network: None,
            seccomp: crate::driver::seccomp_filters(&config.data_dir, is_root && config.isolate),
            sandbox_base: crate::driver::sandbox_base(&config.data_dir, is_root && config.isolate),
        };
        let driver = Driver {
            network: crate::addresses::machine_network(&config, &host_id, &driver),
            ..driver
        };
        let disk_gb = config
            .disk_gb
            .unwrap_or_else(|| crate::volume_fs::free_gb(&config.data_dir));
        let mut ledger = Ledger::new(config.capacity());
        let machines = store.machines()?;
        let mut ports = HashSet::new();
        let mut addresses = HashSet::new();
        let mut uids = HashSet::new();
        for m in machines
            .iter()
            .filter(|m| m.state != MachineState::Destroyed)
        {
            ledger.restore(&m.id, m.resources);
            ports.extend(m.host_ports.values().copied());
            addresses.extend(m.private_ip);
            uids.extend(m.uid);
        }
        crate::addresses::restore_machine_network(&driver, &addresses);
        if let Some(network) = &driver.network {
            network.id_ranges.restore(
                machines
                    .iter()
                    .filter(|m| m.state != MachineState::Destroyed)
                    .filter_map(|m| Some((m.private_ip?, m.uid_base?))),
            );
        }
        for r in store.reservations()? {
            ledger.restore_reservation(r);
        }
        let ops = store.operations()?;
        let next_op_id = ops.iter().map(|o| o.id).max().unwrap_or(0) + 1;
        let inner = Arc::new(Inner {
            host_id,
            store,
            ledger: tokio::sync::Mutex::new(ledger),
            machine_driver: machine_driver.unwrap_or_else(|| Arc::new(driver.clone())),
            driver,
            actors: Mutex::new(HashMap::new()),
            live: Mutex::new(HashMap::new()),
            transient: Mutex::new(HashMap::new()),
            crash: CrashPoint::from_env(),
            next_op_id: AtomicU64::new(next_op_id),
            shutdown: CancellationToken::new(),
            tracker: TaskTracker::new(),
            tokens: Mutex::new(tokens),
            tokens_read: Mutex::new(None),
            revoked_here: Mutex::new(revoked_here),
            revoked: std::sync::RwLock::new(revoked),
            token_verifier: crate::tokens::verifier(&config)?,
            audit: crate::audit::AuditLog::new(&config.data_dir),
            ports_in_use: Mutex::new(ports),
            addresses_in_use: Mutex::new(addresses),
            uids_in_use: Mutex::new(uids),
            cluster_secret: secret,
            catalog: std::sync::OnceLock::new(),
            last_host_record: Mutex::new(None),
            proxy_addr: std::sync::OnceLock::new(),
            proxy_hop_addr: std::sync::OnceLock::new(),
            host_link: std::sync::OnceLock::new(),
            mesh_labels: Mutex::default(),
            checks: Mutex::new(HashMap::new()),
            disk_gb,
            volume_steps: tokio::sync::Mutex::new(()),
            metrics: Default::default(),
            config,
        });
        let agent = Agent(inner);
        // Volumes first: machines that mount them may launch right after.
        agent.recover_volumes().await;
        let mut ops_by_machine: HashMap<String, Vec<Operation>> = HashMap::new();
        for op in ops {
            ops_by_machine
                .entry(op.machine_id.clone())
                .or_default()
                .push(op);
        }
        let num_machines = machines.len();
        let mut num_adopted = 0;
        let mut actors = Vec::new();
        for m in machines {
            if m.state == MachineState::Destroyed {
                continue;
            }
            let ops = ops_by_machine.remove(&m.id).unwrap_or_default();
            agent.publish(&m);
            // Re-adopt the live run now, so that serving means every workload is back
            // under supervision.
            let run = m
                .run
                .filter(|r| r.run_id > m.exit_handled_run)
                .and_then(|r| match agent.0.machine_driver.adopt(&m.id, r.run_id) {
                    Ok(h) => h,
                    Err(err) => {
                        tracing::warn!(machine.id = %m.id, error = %err, "re-adopting run");
                        None
                    }
                });
            num_adopted += run.is_some() as usize;
            actors.push((m, ops, run));
        }
        // What an earlier run left mounted for machines that no longer run goes before any
        // of them launches again.
        let running: HashSet<String> = actors
            .iter()
            .filter(|(_, _, run)| run.is_some())
            .map(|(m, _, _)| m.id.clone())
            .collect();
        crate::cleanup::unmount_stale_roots(&agent.0.config.data_dir, &running);
        for (m, ops, run) in actors {
            spawn_actor(&agent, m, ops, run);
        }
        agent.spawn_housekeeping();
        agent.spawn_snapshot_pruning();
        crate::checks::spawn(&agent);
        tracing::info!(
            host.id = %agent.0.host_id,
            num_machines,
            num_adopted,
            isolate = agent.0.driver.isolate,
            cgroups = agent.0.driver.cgroups,
            "agent started"
        );
        Ok(agent)
    }

    /// The cluster secret (host-to-host calls).
    pub fn cluster_secret(&self) -> &str {
        &self.0.cluster_secret
    }

    /// Cancelled when the agent shuts down (for services that run beside it).
    pub fn shutdown_token(&self) -> CancellationToken {
        self.0.shutdown.clone()
    }

    /// The record of changes made through this host's API.
    pub fn audit(&self) -> &crate::audit::AuditLog {
        &self.0.audit
    }

    /// This host's id.
    pub fn host_id(&self) -> &str {
        &self.0.host_id
    }

    /// The agent's config.
    pub fn config(&self) -> &AgentConfig {
        &self.0.config
    }

    /// True if `token` is the cluster secret (constant time): the only credential of the
    /// host interface and the catalog, which only the cluster's own nodes and operators call.
    pub fn is_cluster_secret(&self, token: &str) -> bool {
        crate::secrets::constant_time_eq(self.0.cluster_secret.as_bytes(), token.as_bytes())
    }

    /// Checks a bearer token in constant time: the cluster secret, or an API token of the
    /// token file that no host has revoked. The file is re-read as soon as it changes (one
    /// `stat` per call), so adding or revoking a token here takes effect at once.
    pub fn authorized(&self, token: &str) -> bool {
        let eq = |t: &String| crate::secrets::constant_time_eq(t.as_bytes(), token.as_bytes());
        if eq(&self.0.cluster_secret) {
            return true;
        }
        self.refresh_tokens();
        {
            let revoked = self.0.revoked.read().unwrap_or_else(|e| e.into_inner());
            if !revoked.is_empty() && revoked.contains(&crate::secrets::token_hash(token)) {
                return false;
            }
        }
        lock(&self.0.tokens).iter().any(eq)
    }

    /// Re-reads the token file if its modification time or length changed. A file that
    /// cannot be read leaves only the cluster secret.
    pub(crate) fn refresh_tokens(&self) {
        let Some(path) = &self.0.config.token_file else {
            return;
        };
        let stamp = std::fs::metadata(path)
            .ok()
            .map(|m| (m.modified().ok(), m.len()));
        let mut read = lock(&self.0.tokens_read);
        if read.is_some() && *read == stamp {
            return;
        }
        *read = stamp;
        let file = crate::secrets::read_tokens(path).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "token file unreadable: only the cluster secret is accepted");
            crate::secrets::TokenFile::default()
        });
        let secret = self.0.cluster_secret.clone();
        *lock(&self.0.tokens) = std::iter::once(secret).chain(file.tokens).collect();
        self.0
            .revoked
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .extend(file.revoked.iter().cloned());
        *lock(&self.0.revoked_here) = file.revoked;
    }

    /// Refreshes the cluster-wide set of revoked tokens: this host's file and every host
    /// record's `revoked_tokens`.
    pub(crate) fn refresh_revocations(&self) {
        self.refresh_tokens();
        let mut all: HashSet<String> = lock(&self.0.revoked_here).iter().cloned().collect();
        if let Some(catalog) = self.0.catalog.get() {
            for host in catalog.hosts() {
                all.extend(host.record.revoked_tokens);
            }
        }
        let mut revoked = self.0.revoked.write().unwrap_or_else(|e| e.into_inner());
        if *revoked != all {
            *revoked = all;
        }
    }

    /// Stops the agent: operations in flight are interrupted (they resume on the next start)
    /// and, if configured, every workload is stopped as a host shutdown.
    pub async fn shutdown(&self) {
        self.0.shutdown.cancel();
        self.0.tracker.close();
        if tokio::time::timeout(Duration::from_secs(10), self.0.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!("tasks still running after 10 s");
        }
        if self.0.config.stop_machines_on_shutdown {
            crate::actor::stop_all_for_host_shutdown(self).await;
        }
    }

    /// The host's description of itself.
    pub async fn info(&self) -> HostInfo {
        let ledger = self.0.ledger.lock().await;
        let num_machines = lock(&self.0.actors).len();
        HostInfo {
            id: self.0.host_id.clone(),
            region: self.0.config.region.clone(),
            api_addr: self.0.config.api_listen.to_string(),
            capacity: ledger.capacity(),
            committed: ledger.committed(),
            reserved: ledger.reserved(),
            free: ledger.free(),
            num_machines,
            num_reservations: ledger.num_open_reservations(),
            version: env!("CARGO_PKG_VERSION").to_string(),
        }
    }

    pub(crate) fn new_op(&self, rec: &mut MachineRecord, kind: OpKind, source: &str) -> Operation {
        let run_id = kind.launches().then(|| {
            let id = rec.next_run_id;
            rec.next_run_id += 1;
            id
        });
        Operation {
            id: self.0.next_op_id.fetch_add(1, Ordering::SeqCst),
            machine_id: rec.id.clone(),
            kind,
            steps_done: 0,
            run_id,
            not_before_ms: 0,
            source: source.into(),
            created_at_ms: now_ms(),
        }
    }

    // === Operations on existing machines ===

    /// Starts a machine.
    pub async fn start_machine(
        &self,
        id: &str,
        nonce: Option<&str>,
    ) -> Result<Machine, AgentError> {
        self.submit(id, nonce, OpKind::Start, |_| Ok(None)).await
    }

    /// Suspends a started machine: its processes are frozen; `start` resumes them.
    pub async fn suspend_machine(
        &self,
        id: &str,
        nonce: Option<&str>,
    ) -> Result<Machine, AgentError> {
        if !self.0.driver.cgroups {
            return Err(AgentError::Invalid(
                "suspend needs cgroups: run the agent as root with isolation on".into(),
            ));
        }
        self.submit(id, nonce, OpKind::Suspend, |_| Ok(None)).await
    }

    /// Stops a machine: its stop signal (or the one given), then SIGKILL after the timeout.
    pub async fn stop_machine(
        &self,
        id: &str,
        req: StopRequest,
        nonce: Option<&str>,
    ) -> Result<Machine, AgentError> {
        self.submit_with_stop(id, req, nonce, |signal, timeout_ms| OpKind::Stop {
            signal,
            timeout_ms,
        })
        .await
    }

    /// Restarts a started machine.
    pub async fn restart_machine(
        &self,
        id: &str,
        req: StopRequest,
        nonce: Option<&str>,
    ) -> Result<Machine, AgentError> {
        self.submit_with_stop(id, req, nonce, |signal, timeout_ms| OpKind::Restart {
            signal,
            timeout_ms,
        })
        .await
    }

    /// Submits an operation that stops the workload first, with the signal and timeout of
    /// the request or, failing that, of the machine's config.
    async fn submit_with_stop(
        &self,
        id: &str,
        req: StopRequest,
        nonce: Option<&str>,
        kind: fn(i32, u64) -> OpKind,
    ) -> Result<Machine, AgentError> {
        self.submit(id, nonce, kind(0, 0), |rec| {
            let (signal, timeout) = stop_params(&rec.config, &req);
            Ok(Some(kind(signal.0, timeout.as_millis() as u64)))
        })
        .await
    }

    /// Destroys a machine: gracefully (stop first), or at once with `force`.
    pub async fn destroy_machine(
        &self,
        id: &str,
        force: bool,
        nonce: Option<&str>,
    ) -> Result<Machine, AgentError> {
        self.submit(id, nonce, OpKind::Destroy { force }, |_| Ok(None))
            .await
    }

    /// Replaces a machine's config with a new version and relaunches it (unless
    /// `skip_launch`).
    pub async fn update_machine(
        &self,
        id: &str,
        req: UpdateRequest,
        nonce: Option<&str>,
    ) -> Result<Machine, AgentError> {
        let resources = validate_config(&req.config)?;
        let mut ledger = self.0.ledger.lock().await;
        let mut rec = self.load_live(id)?;
        check_lease(&rec, nonce)?;
        if let Some(expected) = &req.current_version {
            if *expected != rec.instance_id {
                return Err(AgentError::Conflict(format!(
                    "current_version {expected} does not match the machine's version {}",
                    rec.instance_id
                )));
            }
        }
        if bazaar_types::volume::mount_of(&req.config)
            != bazaar_types::volume::mount_of(&rec.config)
        {
            return Err(AgentError::Invalid(
                "config.mounts cannot be changed by an update; create a new machine".into(),
            ));
        }
        if let Some(region) = req.region.as_deref().filter(|r| !r.is_empty()) {
            if region != rec.region {
                return Err(AgentError::Invalid(format!(
                    "region {region}: an update cannot move machine {id} out of {}; a machine stays on its host (its id, volume and state live there). Create a machine in {region} with this config and destroy this one",
                    rec.region
                )));
            }
        }
        let name = req.name.as_deref().filter(|n| !n.is_empty());
        if let Some(name) = name {
            ids::validate_name("machine", name).map_err(AgentError::Invalid)?;
        }
        if let Some(ttl) = req.lease_ttl {
            crate::leases::new_lease(&rec, ttl, "", None)?;
        }
        // The caller holds the lease (checked above) or there is none: a lease_ttl refreshes
        // it under the same nonce, or takes a new one.
        let held_nonce = rec
            .lease
            .as_ref()
            .filter(|l| l.expires_at * 1000 > now_ms())
            .map(|l| l.nonce.clone());
        let kind = OpKind::Update {
            skip_launch: req.skip_launch,
            previous_instance_id: rec.instance_id.clone(),
        };
        let desired = check_transition(rec.desired, kind.action())?;
        let previous_resources = rec.resources;
        if resources != previous_resources {
            ledger.commit(id, resources).map_err(capacity_error)?;
        }
        let previous = rec.clone();
        rec.config = req.config.clone();
        rec.resources = resources;
        rec.instance_id = ids::new_instance_id();
        rec.desired = if req.skip_launch {
            MachineState::Stopped
        } else {
            desired
        };
        rec.updated_at_ms = now_ms();
        if let Some(name) = name {
            rec.name = name.to_string();
        }
        if req.skip_service_registration {
            rec.cordoned = true;
        }
        if let Some(ttl) = req.lease_ttl {
            rec.lease = Some(crate::leases::new_lease(
                &rec,
                ttl,
                "",
                held_nonce.as_deref(),
            )?);
        }
        if let Err(err) = self
            .assign_ports(&mut rec)
            .and_then(|()| self.assign_user(&mut rec))
        {
            ledger.restore(id, previous_resources);
            return Err(err);
        }
        let op = self.new_op(&mut rec, kind, "user");
        let mut b = Batch::default();
        b.version(id, &rec.instance_id, &rec.config)
            .event(&mut rec, MachineEvent::new("update", "updating", "user"));
        b.machine(&rec).op(&op);
        if let Err(err) = self.commit(b).await {
            ledger.restore(id, previous_resources);
            return Err(err);
        }
        let freed: Vec<u16> = previous
            .host_ports
            .values()
            .filter(|p| !rec.host_ports.values().any(|q| q == *p))
            .copied()
            .collect();
        lock(&self.0.ports_in_use).retain(|p| !freed.contains(p));
        drop(ledger);
        let mut machine = self.enqueue(&rec, op).await?;
        if req.lease_ttl.is_some() {
            machine.nonce = rec.lease.as_ref().map(|l| l.nonce.clone());
        }
        Ok(machine)
    }

    /// Sends a signal to a started machine's workload (not an operation: nothing to resume).
    pub async fn signal_machine(
        &self,
        id: &str,
        signal: Signal,
        nonce: Option<&str>,
    ) -> Result<(), AgentError> {
        let rec = self.load_live(id)?;
        check_lease(&rec, nonce)?;
        let state = self.current_state(&rec);
        check_transition(state, bazaar_types::state::Action::Signal)?;
        let run = rec
            .run
            .filter(|r| r.run_id > rec.exit_handled_run)
            .ok_or_else(|| AgentError::Conflict(format!("machine {id} has no running process")))?;
        let handle = self
            .0
            .machine_driver
            .adopt(id, run.run_id)
            .map_err(|e| AgentError::Internal(e.to_string()))?
            .ok_or_else(|| AgentError::Conflict(format!("machine {id} has no running process")))?;
        handle
            .signal(signal.0)
            .map_err(|e| AgentError::Internal(e.to_string()))
    }

    /// Validates `kind` against the machine's desired state and queues it.
    async fn submit(
        &self,
        id: &str,
        nonce: Option<&str>,
        kind: OpKind,
        refine: impl FnOnce(&MachineRecord) -> Result<Option<OpKind>, AgentError>,
    ) -> Result<Machine, AgentError> {
        let _ledger = self.0.ledger.lock().await;
        let mut rec = self.load_live(id)?;
        check_lease(&rec, nonce)?;
        let kind = refine(&rec)?.unwrap_or(kind);
        rec.desired = check_transition(rec.desired, kind.action())?;
        rec.updated_at_ms = now_ms();
        let op = self.new_op(&mut rec, kind, "user");
        let mut b = Batch::default();
        b.machine(&rec).op(&op);
        self.commit(b).await?;
        drop(_ledger);
        self.enqueue(&rec, op).await
    }

    pub(crate) async fn enqueue(
        &self,
        rec: &MachineRecord,
        op: Operation,
    ) -> Result<Machine, AgentError> {
        self.0.crash.at(op.kind.name(), 0);
        tracing::debug!(machine.id = %rec.id, op = op.kind.name(), "operation accepted");
        let sender = lock(&self.0.actors).get(&rec.id).cloned();
        match sender {
            Some(tx) => {
                // Shown from the moment the operation is accepted (the actor may not have
                // begun it yet): a `wait` right after a restart must not find the machine
                // still `started` from before it. Set before the actor can see the
                // operation, so that its end (which clears the state) comes after this.
                if !op.kind.steps().is_empty() {
                    lock(&self.0.transient)
                        .entry(rec.id.clone())
                        .or_insert(op.kind.transient_state());
                }
                let _ = tx.send(ActorMsg::Op(op));
            }
            None => return Err(AgentError::ShuttingDown),
        }
        self.machine(&rec.id).await
    }

    pub(crate) fn load_live(&self, id: &str) -> Result<MachineRecord, AgentError> {
        if !ids::is_valid_machine_id(id) {
            return Err(AgentError::MachineNotFound(id.into()));
        }
        self.0
            .store
            .machine(id)?
            .filter(|m| m.state != MachineState::Destroyed)
            .ok_or_else(|| AgentError::MachineNotFound(id.into()))
    }

    /// Writes a batch durably, off the async threads.
    /// Commits what a machine's actor did since it read `before` (`rec` is the record it
    /// worked on, already put in `batch`). The accept side may have written the record in
    /// the meantime (a lease, a cordon, metadata, a queued operation's config, desired state
    /// and events); under the ledger lock, which serializes those writes, their fields are
    /// taken from the stored record and the actor's events numbered after theirs, so
    /// nothing acknowledged is lost.
    pub(crate) async fn commit_from_actor(
        &self,
        before: &MachineRecord,
        rec: &mut MachineRecord,
        mut batch: Batch,
    ) -> Result<(), AgentError> {
        let _ledger = self.0.ledger.lock().await;
        if let Some(stored) = self.0.store.machine(&rec.id)? {
            let added = stored.next_event_seq.saturating_sub(before.next_event_seq);
            rec.merge_accepted(before, &stored);
            batch
                .shift_events(&rec.id, before.next_event_seq, added)
                .replace_machine(rec);
        }
        self.commit(batch).await
    }

    pub(crate) async fn commit(&self, batch: Batch) -> Result<(), AgentError> {
        let store = self.0.store.clone();
        tokio::task::spawn_blocking(move || store.write(&batch)).await??;
        Ok(())
    }

    fn spawn_housekeeping(&self) {
        let agent = self.clone();
        let shutdown = self.0.shutdown.clone();
        self.0.tracker.spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    _ = tick.tick() => agent.housekeeping().await,
                }
            }
        });
    }

    /// Refreshes the revoked tokens, expires unclaimed reservations, collects old
    /// tombstones, republishes the host record, puts this host's catalog rows back in line
    /// with its store, starts scheduled machines that are due.
    async fn housekeeping(&self) {
        self.refresh_revocations();
        self.publish_host().await;
        self.reconcile_catalog();
        let now = now_ms();
        crate::schedule::start_due(self, now).await;
        {
            let mut ledger = self.0.ledger.lock().await;
            // Claimed reservations are kept a minute past expiry to answer repeated claims.
            let expired = ledger.expire(now, 60_000);
            let stale: Vec<String> = self
                .0
                .store
                .reservations()
                .unwrap_or_default()
                .into_iter()
                .filter(|r| ledger.reservation(&r.id).is_none())
                .map(|r| r.id)
                .collect();
            if !expired.is_empty() || !stale.is_empty() {
                let mut b = Batch::default();
                for id in expired.iter().chain(stale.iter()) {
                    b.delete_reservation(id);
                }
                if let Err(err) = self.commit(b).await {
                    tracing::warn!(error = %err, "deleting expired reservations");
                }
                if !expired.is_empty() {
                    tracing::debug!(num = expired.len(), "reservations expired");
                }
            }
        }
        let ttl = self.0.config.tombstone_ttl.as_millis() as u64;
        let old: Vec<String> = self.0.store.select(|m| {
            m.destroyed_at_ms
                .is_some_and(|t| now.saturating_sub(t) >= ttl)
                .then(|| m.id.clone())
        });
        if !old.is_empty() {
            let _guard = self.0.ledger.lock().await;
            let mut b = Batch::default();
            for id in &old {
                b.purge_machine(id);
            }
            if self.commit(b).await.is_ok() {
                let mut live = lock(&self.0.live);
                for id in &old {
                    live.remove(id);
                }
            }
        }
    }
}

pub(crate) fn capacity_error(err: LedgerError) -> AgentError {
    AgentError::Capacity(err.to_string())
}

fn stop_params(config: &MachineConfig, req: &StopRequest) -> (Signal, Duration) {
    let (sig, timeout) = config.stop_signal_and_timeout();
    (
        req.signal.unwrap_or(sig),
        req.timeout
            .map(|t| t.get())
            .unwrap_or(timeout)
            .min(bazaar_types::config::MAX_STOP_TIMEOUT),
    )
}

/// Refuses what a config asks for and no host here can do, rather than accept it silently:
/// GPUs (no host has one: a placement refusal, `insufficient_capacity`), and fields bazaar
/// does not act on (400 naming the field).
fn refuse_unsupported(config: &MachineConfig, guest: &Guest) -> Result<(), AgentError> {
    let set = |v: Option<&serde_json::Value>| match v {
        None | Some(serde_json::Value::Null) => false,
        Some(serde_json::Value::Object(o)) => !o.is_empty(),
        Some(serde_json::Value::Array(a)) => !a.is_empty(),
        Some(serde_json::Value::String(s)) => !s.is_empty(),
        Some(serde_json::Value::Number(n)) => n.as_f64() != Some(0.0),
        Some(serde_json::Value::Bool(b)) => *b,
    };
    if set(guest.extra.get("gpus")) || set(guest.extra.get("gpu_kind")) {
        return Err(AgentError::Capacity(
            "no host in this cluster has GPUs (guest.gpus / guest.gpu_kind)".into(),
        ));
    }
    for field in ["dns", "statics", "processes"] {
        if set(config.extra.get(field)) {
            return Err(AgentError::Invalid(format!(
                "config.{field} is not supported by bazaar; leave it out"
            )));
        }
    }
    if set(config
        .init
        .as_ref()
        .and_then(|i| i.extra.get("swap_size_mb")))
    {
        return Err(AgentError::Invalid(
            "config.init.swap_size_mb is not supported by bazaar (machines run without swap); leave it out"
                .into(),
        ));
    }
    if let Some(schedule) = config.schedule.as_deref().filter(|s| !s.is_empty()) {
        if !crate::schedule::SCHEDULES.contains(&schedule) {
            return Err(AgentError::Invalid(format!(
                "config.schedule {schedule:?} must be one of {}",
                crate::schedule::SCHEDULES.join(", ")
            )));
        }
    }
    let service_checks = config.services.iter().flat_map(|s| &s.checks);
    for check in config.checks.values().chain(service_checks) {
        crate::checks::headers(check).map_err(AgentError::Invalid)?;
    }
    Ok(())
}

/// Validates a config and returns the resources it needs.
pub fn validate_config(config: &MachineConfig) -> Result<Resources, AgentError> {
    let guest = match (&config.guest, &config.size) {
        (Some(_), Some(_)) => {
            return Err(AgentError::Invalid(
                "config.size and config.guest are mutually exclusive".into(),
            ))
        }
        (Some(g), None) => g.clone(),
        (None, Some(size)) => Guest::preset(size).map_err(AgentError::Invalid)?,
        (None, None) => Guest::default(),
    };
    let size = guest.validate().map_err(AgentError::Invalid)?;
    refuse_unsupported(config, &guest)?;
    bazaar_types::replacement::validate(config).map_err(AgentError::Invalid)?;
    match config.driver() {
        "process" => {
            let argv = config.init.as_ref().map(|i| i.argv()).unwrap_or_default();
            driver::validate_command(&config.env, &argv).map_err(AgentError::Invalid)?;
            driver::work_files(config).map_err(AgentError::Invalid)?;
        }
        "oci" => {
            config
                .image
                .parse::<bazaar_image::Reference>()
                .map_err(|e| AgentError::Invalid(format!("image {:?}: {e}", config.image)))?;
            for f in &config.files {
                if !f.guest_path.starts_with('/') || f.guest_path.split('/').any(|c| c == "..") {
                    return Err(AgentError::Invalid(format!(
                        "config.files: guest_path {:?} must be an absolute path without ..",
                        f.guest_path
                    )));
                }
                if f.raw_value.is_none() {
                    return Err(AgentError::Invalid(format!(
                        "config.files {}: raw_value (base64) is required",
                        f.guest_path
                    )));
                }
            }
        }
        other => {
            return Err(AgentError::Invalid(format!(
                "unknown driver {other:?}: use \"process\", or set config.image"
            )))
        }
    }
    bazaar_types::volume::mount_of(config).map_err(AgentError::Invalid)?;
    for svc in &config.services {
        if svc.internal_port == 0 {
            return Err(AgentError::Invalid(
                "services[].internal_port must be between 1 and 65535".into(),
            ));
        }
        if !matches!(svc.protocol.as_str(), "tcp" | "udp") {
            return Err(AgentError::Invalid(format!(
                "services[].protocol must be tcp or udp, got {:?}",
                svc.protocol
            )));
        }
    }
    for key in config.env.keys() {
        if key.is_empty() || key.contains('=') || key.contains('\0') {
            return Err(AgentError::Invalid(format!("invalid env name {key:?}")));
        }
    }
    Ok(size.into())
}
