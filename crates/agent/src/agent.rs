//! The agent's state: [`Agent`] is a handle on `Inner`, which holds the agent's parts,
//! each a small type of a module below this one: the store and the ledger (whose lock
//! serializes every accepted write), the actor registry ([`crate::registry`]), the bearer
//! tokens ([`crate::tokens`]), what machines are handed out ([`crate::addresses`]), the
//! health-check results ([`crate::checks`]), the audit log ([`crate::audit`]), the metrics
//! ([`crate::metrics`]), the open preemption bids ([`crate::preemptions`]) and the link to
//! other hosts ([`crate::host_tls`]); the reads ([`crate::views`]) are lent its parts. This
//! module also has what every operation shares: numbering operations, loading a live
//! machine, durable commits, and narrow accessors of its parts for the modules above. It
//! imports only downward: start-up ([`crate::boot`]) and everything that needs the whole
//! agent (operations, market, leases, volumes, actors...) sit above it, as functions over
//! these methods. `Inner` and its fields are private to this file (`tests/layering.rs`
//! checks that they stay so), so no other module can reach past the methods.

use crate::addresses::Addresses;
use crate::checks::CheckResults;
use crate::clock::Clock;
use crate::config::AgentConfig;
use crate::driver::Driver;
use crate::error::AgentError;
use crate::fault::CrashPoint;
use crate::host_tls::HostLink;
use crate::record::{MachineRecord, OpKind, Operation};
use crate::registry::Actors;
use crate::store::{Batch, Store};
use crate::sync::lock;
use crate::tokens::{Caller, Tokens};
use crate::views::Reader;
pub use crate::views::Snapshot;
use bazaar_auth::Denied;
use bazaar_placement::Ledger;
use bazaar_runtime::MachineDriver;
use bazaar_types::config::MachineConfig;
use bazaar_types::event::MachineEvent;
use bazaar_types::host::{HostInfo, WaitResponse};
use bazaar_types::ids;
use bazaar_types::machine::Machine;
use bazaar_types::state::MachineState;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The agent, cheap to clone.
#[derive(Debug, Clone)]
pub struct Agent(Arc<Inner>);

/// Shared state of the agent: its parts.
#[derive(Debug)]
struct Inner {
    config: AgentConfig,
    host_id: String,
    store: Store,
    /// The ledger; its lock also serializes every accepted write, so validation and the
    /// durable write happen as one step.
    ledger: tokio::sync::Mutex<Ledger>,
    /// The host plumbing (paths, network, volumes, images) of this host's machines.
    driver: Driver,
    /// What the actors launch, find and remove runs with: `driver` itself, or a fake in
    /// tests (`boot::start_in_process`).
    machine_driver: Arc<dyn MachineDriver>,
    /// The channel to each machine's actor.
    actors: Actors,
    live: Mutex<HashMap<String, watch::Sender<Snapshot>>>,
    /// State shown while an operation runs (`starting`, `stopping`, ...).
    transient: Mutex<HashMap<String, MachineState>>,
    crash: Arc<CrashPoint>,
    /// "Now" for leases, reservations, backoffs and records ([`crate::clock`]).
    clock: Clock,
    next_op_id: AtomicU64,
    shutdown: CancellationToken,
    /// Counts the agent's tasks: shutdown waits for them.
    tracker: TaskTracker,
    /// Accepted bearer tokens, revocations, the verifier of scoped tokens.
    tokens: Tokens,
    /// The record of changes made through this host's API (`audit.rs`).
    audit: crate::audit::AuditLog,
    /// Host ports, machine network addresses and uids held by this host's machines.
    addresses: Addresses,
    /// The gossip replica, once attached: every change to a machine is published to it.
    catalog: std::sync::OnceLock<bazaar_catalog::Catalog>,
    /// The last host record published (to publish only changes).
    last_host_record: Mutex<Option<bazaar_catalog::HostRecord>>,
    /// Where this host's edge proxy listens, once it does (published as the host label
    /// `proxy_addr`, so other proxies can hand requests for this host's machines to it).
    proxy_addr: std::sync::OnceLock<std::net::SocketAddr>,
    /// The proxy's hop listener (mTLS, hosts with certificates only; published as
    /// `proxy_hop_addr`): other proxies hand requests for this host's machines to it.
    proxy_hop_addr: std::sync::OnceLock<std::net::SocketAddr>,
    /// This host's host listener and its mTLS client to other hosts, once it has a cluster
    /// certificate ([`crate::host_tls`]; published as the host label `host_addr`).
    host_link: std::sync::OnceLock<HostLink>,
    /// The host labels announcing this host's mesh (key, endpoint, prefix), once it runs
    /// (`mesh.rs`).
    mesh_labels: Mutex<std::collections::BTreeMap<String, String>>,
    /// Open preemption bids by reservation id (`preempt.rs`; in memory, as reservations).
    preemptions: crate::preemptions::Preemptions,
    /// The latest health-check results of this host's machines.
    checks: CheckResults,
    /// Disk offered to volumes, in GB.
    disk_gb: u64,
    /// The drivers this host cannot run, with what it lacks ([`crate::runnable`]): bids
    /// and creates for them are refused, and the host row says so.
    cannot_run: std::collections::BTreeMap<String, String>,
    /// Held while a volume's storage step runs (one at a time per host, so a retried create
    /// never formats or mounts the same image twice at once).
    volume_steps: tokio::sync::Mutex<()>,
    /// Operations and steps run.
    metrics: crate::metrics::AgentMetrics,
    /// The machines whose full disk was reported (`disk_watch.rs`).
    full_disks: crate::disk_watch::FullDisks,
    /// The last samples of machines' own metrics pages (`config.metrics`).
    machine_metrics: Arc<crate::machine_metrics::MachineMetrics>,
    /// Set by `bazaar host drain` (`drain.rs`), kept in the store's meta table: the host
    /// bids for nothing, creates nothing new and its row says `draining`.
    draining: std::sync::atomic::AtomicBool,
    /// Where machines' use is measured for reclamation ([`crate::usage`]).
    usage: Arc<dyn crate::usage::UsageProbe>,
}

/// What a test running the agent in-process puts in place of the host's own: the driver
/// the actors launch runs with (a fake), the clock (tokio's, paused) and where to crash.
/// `Seams::default()` is the real agent.
#[derive(Debug, Default)]
pub struct Seams {
    /// `None`: this host's shims and runc.
    pub driver: Option<Arc<dyn MachineDriver>>,
    pub clock: Clock,
    /// `None`: `BAZAAR_CRASH_AT` ([`CrashPoint::from_env`]).
    pub crash: Option<Arc<CrashPoint>>,
    /// `None`: machines' cgroups ([`crate::usage::CgroupUsage`]).
    pub usage: Option<Arc<dyn crate::usage::UsageProbe>>,
}

/// What a store holds at start that the agent has not acted on yet: its machines and its
/// unfinished operations.
pub(crate) struct Stored {
    pub machines: Vec<MachineRecord>,
    pub ops: Vec<Operation>,
}

impl Agent {
    /// The agent of `store` (opened, with this host's id), its state restored: the ledger,
    /// what its machines hold, its machine network. Nothing is started: [`crate::boot`]
    /// re-adopts workloads and starts the actors and loops.
    pub(crate) fn assemble(
        config: AgentConfig,
        store: Store,
        host_id: String,
        seams: Seams,
    ) -> anyhow::Result<(Agent, Stored)> {
        let machine_driver = seams.driver;
        let secret = crate::secrets::cluster_secret(&config)?;
        let tokens = Tokens::load(&config, secret)?;
        let is_root = rustix::process::geteuid().is_root();
        let cgroups = is_root && config.isolate && bazaar_shim::cgroups_available();
        let exe = match &config.shim_exe {
            Some(p) => p.clone(),
            None => crate::shim_exe::shim_executable(&std::env::current_exe()?),
        };
        let driver = Driver {
            exe,
            machines_dir: config.data_dir.join("machines"),
            host_id: host_id.clone(),
            isolate: is_root && config.isolate,
            cgroups,
            log_max_bytes: config.log_max_bytes,
            machine_disk_mb: config.machine_disk_mb,
            volumes: crate::volume_fs::VolumeFs::new(&config.data_dir),
            oci: crate::oci::OciRuntime::for_agent(&config.oci_settings(), &host_id, cgroups),
            network: None,
            seccomp: crate::driver::seccomp_filters(&config.data_dir, is_root && config.isolate),
            sandbox_base: crate::driver::sandbox_base(&config.data_dir, is_root && config.isolate),
            disk_pool: (is_root && config.isolate)
                .then(|| bazaar_runtime::disk_pool::DiskPool::new(&config.data_dir)),
        };
        let driver = Driver {
            network: crate::addresses::machine_network(&config, &host_id, &driver),
            ..driver
        };
        let disk_gb = config
            .disk_gb
            .unwrap_or_else(|| crate::volume_fs::free_gb(&config.data_dir));
        let mut ledger = Ledger::new(config.capacity());
        if config.reclaim.enabled {
            ledger = ledger.with_reclaim(config.reclaim.rule());
        }
        let draining = store.meta(crate::store::META_DRAINING)?.as_deref() == Some("true");
        ledger.set_draining(draining);
        let machines = store.machines()?;
        let mut ports = HashSet::new();
        let mut addresses = HashSet::new();
        let mut uids = HashMap::new();
        // Oldest first: the ledger's batch pool stops the newest first.
        let mut by_age: Vec<&MachineRecord> = machines
            .iter()
            .filter(|m| m.state != MachineState::Destroyed)
            .collect();
        by_age.sort_by_key(|m| m.created_at_ms);
        for m in by_age {
            // A preempted machine holds nothing until it starts again (`preempt.rs`).
            if m.preempted_by.is_none() {
                ledger.restore_in(&m.id, m.resources, pool_of(&m.config));
            }
            ports.extend(m.host_ports.values().copied());
            addresses.extend(m.private_ip);
            if let Some(uid) = m.uid {
                uids.insert(uid, m.id.clone());
            }
        }
        // Machine uids are claimed machine-wide where machines get their own (root,
        // isolating): other agents on this kernel skip them.
        let uid_claims = (driver.isolate && rustix::process::geteuid().is_root())
            .then(|| crate::uid_claims::UidClaims::new(&host_id));
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
        // A driver given by a test runs whatever it is given.
        let cannot_run = match machine_driver {
            Some(_) => Default::default(),
            None => crate::runnable::check(&config, &driver),
        };
        let next_op_id = ops.iter().map(|o| o.id).max().unwrap_or(0) + 1;
        let inner = Arc::new(Inner {
            host_id,
            store,
            ledger: tokio::sync::Mutex::new(ledger),
            machine_driver: machine_driver.unwrap_or_else(|| Arc::new(driver.clone())),
            driver,
            actors: Actors::default(),
            live: Mutex::new(HashMap::new()),
            transient: Mutex::new(HashMap::new()),
            crash: seams
                .crash
                .unwrap_or_else(|| Arc::new(CrashPoint::from_env())),
            clock: seams.clock,
            next_op_id: AtomicU64::new(next_op_id),
            shutdown: CancellationToken::new(),
            tracker: TaskTracker::new(),
            tokens,
            audit: crate::audit::AuditLog::new(&config.data_dir),
            addresses: Addresses::restore(ports, addresses, uids, uid_claims),
            catalog: std::sync::OnceLock::new(),
            last_host_record: Mutex::new(None),
            proxy_addr: std::sync::OnceLock::new(),
            proxy_hop_addr: std::sync::OnceLock::new(),
            host_link: std::sync::OnceLock::new(),
            mesh_labels: Mutex::default(),
            preemptions: Default::default(),
            checks: CheckResults::default(),
            disk_gb,
            cannot_run,
            volume_steps: tokio::sync::Mutex::new(()),
            metrics: Default::default(),
            full_disks: Default::default(),
            machine_metrics: Default::default(),
            draining: std::sync::atomic::AtomicBool::new(draining),
            usage: seams
                .usage
                .unwrap_or_else(|| Arc::new(crate::usage::CgroupUsage)),
            config,
        });
        Ok((Agent(inner), Stored { machines, ops }))
    }

    /// The cluster secret (host-to-host calls).
    pub fn cluster_secret(&self) -> &str {
        self.0.tokens.cluster_secret()
    }

    /// Cancelled when the agent shuts down (for services that run beside it).
    pub fn shutdown_token(&self) -> CancellationToken {
        self.0.shutdown.clone()
    }

    /// The record of changes made through this host's API.
    pub fn audit(&self) -> &crate::audit::AuditLog {
        &self.0.audit
    }

    /// Unix milliseconds on the agent's clock ([`crate::clock`]).
    pub fn now_ms(&self) -> u64 {
        self.0.clock.now_ms()
    }

    /// This host's id.
    pub fn host_id(&self) -> &str {
        &self.0.host_id
    }

    /// The agent's config.
    pub fn config(&self) -> &AgentConfig {
        &self.0.config
    }

    /// The image store of this host's image machines, when it runs them: the registry it
    /// serves (`bazaar-registry`) keeps what is pushed there.
    pub fn image_store(&self) -> Option<bazaar_image::ImageStore> {
        self.0
            .driver
            .oci
            .as_ref()
            .ok()
            .map(|oci| oci.images.clone())
    }

    /// Where this host's image machines pull the cluster's own images from (set once, by
    /// the node's composition root; `bazaar_image::peers`).
    pub fn set_image_peers(&self, peers: std::sync::Arc<dyn bazaar_image::peers::PeerSource>) {
        if let Ok(oci) = &self.0.driver.oci {
            let _ = oci.peers.set(peers);
        }
    }

    /// The host plumbing of this host's machines (paths, cgroups, network).
    pub(crate) fn driver(&self) -> &Driver {
        &self.0.driver
    }

    /// Held while a volume's storage step runs (one at a time per host).
    pub(crate) async fn volume_step(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.0.volume_steps.lock().await
    }

    /// Fault injection at boundary `boundary` of operation `op` ([`crate::fault`]).
    pub(crate) fn crash_at(&self, op: &str, boundary: u32) {
        self.0.crash.at(op, boundary);
    }

    /// Counts the agent's tasks: shutdown waits for them.
    pub(crate) fn tracker(&self) -> &TaskTracker {
        &self.0.tracker
    }

    /// Cancels the agent's tasks (its loops, its actors: operations in flight resume on
    /// the next start) and waits for them, at most 10 s.
    pub(crate) async fn stop_tasks(&self) {
        self.0.shutdown.cancel();
        self.0.tracker.close();
        if tokio::time::timeout(Duration::from_secs(10), self.0.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!("tasks still running after 10 s");
        }
    }

    /// Cancelled when the agent shuts down (`shutdown_token` without the clone).
    pub(crate) fn is_shutting_down(&self) -> bool {
        self.0.shutdown.is_cancelled()
    }

    /// What the actors launch, find and remove runs with.
    pub(crate) fn machine_driver(&self) -> &Arc<dyn MachineDriver> {
        &self.0.machine_driver
    }

    /// "Now" for leases, reservations, backoffs and records ([`crate::clock`]).
    pub(crate) fn clock(&self) -> Clock {
        self.0.clock
    }

    /// Operations and steps run ([`crate::metrics`]).
    pub(crate) fn metrics(&self) -> &crate::metrics::AgentMetrics {
        &self.0.metrics
    }

    /// The machines whose full disk was reported ([`crate::disk_watch`]).
    pub(crate) fn full_disks(&self) -> &crate::disk_watch::FullDisks {
        &self.0.full_disks
    }

    /// The latest health-check results of this host's machines.
    pub(crate) fn checks(&self) -> &CheckResults {
        &self.0.checks
    }

    /// The last samples of machines' own metrics pages ([`crate::machine_metrics`]).
    pub(crate) fn machine_metrics(&self) -> &Arc<crate::machine_metrics::MachineMetrics> {
        &self.0.machine_metrics
    }

    /// Shows machine `id` in `state` while an operation runs on it (`starting`,
    /// `stopping`, ...), or (`None`) in its recorded state again. Clients read it before
    /// the record ([`crate::views`]): clear it only once the operation's last step is
    /// recorded.
    pub(crate) fn set_operation_state(&self, id: &str, state: Option<MachineState>) {
        let mut shown = lock(&self.0.transient);
        match state {
            Some(s) => shown.insert(id.to_string(), s),
            None => shown.remove(id),
        };
    }

    /// Shows machine `id` in `state` unless an operation already shows its own.
    pub(crate) fn show_operation_state(&self, id: &str, state: MachineState) {
        lock(&self.0.transient)
            .entry(id.to_string())
            .or_insert(state);
    }

    /// Forgets the live state `wait` watches of machines whose records were purged.
    pub(crate) fn forget_live(&self, ids: &[String]) {
        let mut live = lock(&self.0.live);
        for id in ids {
            live.remove(id);
        }
    }

    /// True while `bazaar host drain` holds (not shutdown: [`Agent::is_draining`]).
    pub(crate) fn draining_flag(&self) -> bool {
        self.0.draining.load(Ordering::SeqCst)
    }

    /// Gives back host ports no machine holds any more.
    pub(crate) fn release_host_ports(&self, ports: &[u16]) {
        self.0.addresses.release_ports(ports);
    }

    /// The parts the reads use ([`crate::views`]).
    fn reader(&self) -> Reader<'_> {
        Reader {
            store: &self.0.store,
            live: &self.0.live,
            transient: &self.0.transient,
            checks: &self.0.checks,
            driver: &self.0.driver,
            host_id: &self.0.host_id,
            clock: self.0.clock,
            catalog: self.0.catalog.get(),
            api_ip: self.0.config.api_listen.ip(),
        }
    }

    /// Publishes a machine's state to waiters and to the catalog ([`Reader::publish`]).
    pub(crate) fn publish(&self, rec: &MachineRecord) {
        self.reader().publish(rec);
    }

    /// The catalog, once attached.
    pub fn catalog(&self) -> Option<&bazaar_catalog::Catalog> {
        self.0.catalog.get()
    }

    /// Where the catalog is set, once ([`crate::publish::attach_catalog`]).
    pub(crate) fn catalog_cell(&self) -> &std::sync::OnceLock<bazaar_catalog::Catalog> {
        &self.0.catalog
    }

    /// Where this host's edge proxy listens, once it does.
    pub(crate) fn proxy_addr(&self) -> &std::sync::OnceLock<std::net::SocketAddr> {
        &self.0.proxy_addr
    }

    /// The proxy's hop listener, once it has one.
    pub(crate) fn proxy_hop_addr(&self) -> &std::sync::OnceLock<std::net::SocketAddr> {
        &self.0.proxy_hop_addr
    }

    /// Where the host link is set, once ([`crate::publish::set_host_link`]).
    pub(crate) fn host_link_cell(&self) -> &std::sync::OnceLock<HostLink> {
        &self.0.host_link
    }

    /// The drivers this host cannot run, with what each lacks.
    pub(crate) fn cannot_run_all(&self) -> &std::collections::BTreeMap<String, String> {
        &self.0.cannot_run
    }

    /// True while the host drains or shuts down: it takes nothing new.
    pub(crate) fn is_draining(&self) -> bool {
        self.0.shutdown.is_cancelled() || self.0.draining.load(Ordering::SeqCst)
    }

    /// The tokens revoked on this host.
    pub(crate) fn revoked_here(&self) -> Vec<String> {
        self.0.tokens.revoked_here().into_iter().collect()
    }

    /// The last host record published (to publish only changes).
    pub(crate) fn last_host_record(&self) -> &Mutex<Option<bazaar_catalog::HostRecord>> {
        &self.0.last_host_record
    }

    /// One machine (tombstones included), with its latest events.
    pub async fn machine(&self, id: &str) -> Result<Machine, AgentError> {
        self.reader().machine(id).await
    }

    /// Machines on this host, optionally of one app.
    pub async fn machines(
        &self,
        app: Option<&str>,
        include_deleted: bool,
    ) -> Result<Vec<Machine>, AgentError> {
        self.reader().machines(app, include_deleted).await
    }

    /// A machine's events, newest first.
    pub async fn events(&self, id: &str, limit: usize) -> Result<Vec<MachineEvent>, AgentError> {
        self.reader().events(id, limit).await
    }

    /// A machine's config versions, newest first.
    pub async fn versions(&self, id: &str) -> Result<Vec<(String, MachineConfig)>, AgentError> {
        self.reader().versions(id).await
    }

    /// The tail of a machine's log (JSON lines), at most `max_bytes`.
    pub async fn log_tail(&self, id: &str, max_bytes: u64) -> Result<String, AgentError> {
        self.reader().log_tail(id, max_bytes).await
    }

    /// Waits until the machine is in one of `states` (`views::Reader::wait`).
    pub async fn wait(
        &self,
        id: &str,
        states: &[MachineState],
        timeout: Duration,
        instance_id: Option<&str>,
        from_event_id: Option<&str>,
    ) -> Result<WaitResponse, AgentError> {
        let reader = self.reader();
        reader
            .wait(id, states, timeout, instance_id, from_event_id)
            .await
    }

    /// The state clients see: the running operation's state, else the recorded one.
    pub(crate) fn current_state(&self, rec: &MachineRecord) -> MachineState {
        self.reader().current_state(rec)
    }

    /// Shows a record as the API's machine object.
    pub(crate) fn view(&self, rec: &MachineRecord, events: Vec<MachineEvent>) -> Machine {
        self.reader().view(rec, events)
    }

    /// Sets the drain flag ([`crate::drain`], which records it and tells the ledger).
    pub(crate) fn set_draining_flag(&self, draining: bool) {
        self.0.draining.store(draining, Ordering::SeqCst);
    }

    /// The host labels announcing this host's mesh ([`crate::mesh`]).
    pub(crate) fn mesh_labels(&self) -> &Mutex<std::collections::BTreeMap<String, String>> {
        &self.0.mesh_labels
    }

    /// Where volumes' storage is (`volumes.rs`).
    pub(crate) fn volume_fs(&self) -> &crate::volume_fs::VolumeFs {
        &self.0.driver.volumes
    }

    /// Disk offered to volumes, in GB.
    pub(crate) fn disk_gb(&self) -> u64 {
        self.0.disk_gb
    }

    /// Disk given to volumes, in GB.
    pub(crate) fn disk_used_gb(&self) -> u64 {
        let volumes = self.0.store.volumes().unwrap_or_default();
        volumes.iter().map(|v| v.size_gb).sum()
    }

    /// Volume `id`'s record (404 for a malformed or unknown id).
    pub(crate) fn load_volume(
        &self,
        id: &str,
    ) -> Result<crate::volume_record::VolumeRecord, AgentError> {
        let not_found = || AgentError::NotFound(format!("volume {id} not found"));
        if !bazaar_types::volume::is_valid_volume_id(id) {
            return Err(not_found());
        }
        self.0.store.volume(id)?.ok_or_else(not_found)
    }

    /// The open preemption bids ([`crate::preempt`]).
    pub(crate) fn preemptions(&self) -> &crate::preemptions::Preemptions {
        &self.0.preemptions
    }

    /// The channel to each machine's actor.
    /// Where machines' use is measured ([`crate::usage`]).
    pub(crate) fn usage_probe(&self) -> &Arc<dyn crate::usage::UsageProbe> {
        &self.0.usage
    }

    pub(crate) fn actors(&self) -> &Actors {
        &self.0.actors
    }

    /// The store (reads; writes go through [`Agent::commit`]).
    pub(crate) fn store(&self) -> &Store {
        &self.0.store
    }

    /// The agent's write lock, the ledger's: a change validated and written under it is one
    /// step with respect to every other accepted write.
    pub(crate) async fn write_lock(&self) -> tokio::sync::MutexGuard<'_, Ledger> {
        self.0.ledger.lock().await
    }

    /// Whether process machines run sandboxed, each as its own uid ([`crate::identity`]).
    pub(crate) fn machine_users(&self) -> bool {
        self.0.driver.isolate
    }

    /// Checks `init.user` and gives a process machine its uid ([`crate::identity`]).
    pub(crate) fn assign_user(&self, rec: &mut MachineRecord) -> Result<(), AgentError> {
        let allow_root = self.0.config.allow_root_machines;
        crate::identity::assign_user(&self.0.addresses, rec, self.machine_users(), allow_root)
    }

    /// Gives a machine where its services are reached ([`Addresses::assign`]).
    pub(crate) fn assign_ports(&self, rec: &mut MachineRecord) -> Result<(), AgentError> {
        self.0.addresses.assign(&self.0.driver, rec)
    }

    /// Why this host has no address for another machine, if it has none
    /// ([`Addresses::network_full`]).
    pub(crate) fn network_full(&self) -> Option<String> {
        self.0.addresses.network_full(&self.0.driver)
    }

    /// Gives back what [`Agent::assign_ports`] and [`Agent::assign_user`] handed out.
    pub(crate) fn release_ports(&self, rec: &MachineRecord) {
        crate::identity::release_user(&self.0.addresses, rec);
        self.0.addresses.release(&self.0.driver, rec);
    }

    /// Why this host cannot run `driver` machines, if it cannot ([`crate::runnable`]).
    pub fn cannot_run(&self, driver: &str) -> Option<&str> {
        self.0.cannot_run.get(driver).map(String::as_str)
    }

    /// This host's link to other hosts' host listeners, once it has a cluster certificate.
    pub fn host_link(&self) -> Option<&HostLink> {
        self.0.host_link.get()
    }

    /// True if `token` is the cluster secret (constant time): the only credential of the
    /// host interface and the catalog, which only the cluster's own nodes and operators call.
    pub fn is_cluster_secret(&self, token: &str) -> bool {
        self.0.tokens.is_cluster_secret(token)
    }

    /// Checks a bearer token in constant time: an API token of the token file that no host
    /// has revoked (never the cluster secret). The file is re-read as soon as it changes (one
    /// `stat` per call), so adding or revoking a token here takes effect at once.
    pub fn authorized(&self, token: &str) -> bool {
        self.0.tokens.authorized(token)
    }

    /// Who `token` is on the Machines API: a scoped token (signatures checked once and
    /// cached, then its revocation), else a token-file token ([`Agent::authorized`]); the
    /// cluster secret is refused (401, `tokens::NOT_AN_API_TOKEN`).
    pub fn caller(&self, token: &str) -> Result<Caller, Denied> {
        self.0.tokens.caller(token)
    }

    /// Refreshes the cluster-wide set of revoked tokens: this host's file and every host
    /// record's `revoked_tokens`.
    pub(crate) fn refresh_revocations(&self) {
        let elsewhere = self.0.catalog.get().map(|catalog| {
            catalog
                .hosts()
                .into_iter()
                .flat_map(|host| host.record.revoked_tokens)
        });
        self.0
            .tokens
            .refresh_revocations(elsewhere.into_iter().flatten());
    }

    /// The agent's and its catalog's metrics, as Prometheus text.
    pub fn metrics_text(&self) -> String {
        let mut out = bazaar_catalog::metrics::Exposition::default();
        let transient = lock(&self.0.transient).clone();
        let states = self
            .0
            .store
            .select(|r| Some(transient.get(&r.id).copied().unwrap_or(r.state)));
        self.0
            .metrics
            .encode(&mut out, self.0.store.commit_stats(), states);
        if let Some(catalog) = self.0.catalog.get() {
            catalog.encode_metrics(&mut out);
        }
        self.0.machine_metrics.encode(&mut out);
        out.into_string()
    }

    /// The host's description of itself.
    pub async fn info(&self) -> HostInfo {
        let ledger = self.0.ledger.lock().await;
        let num_machines = self.0.actors.len();
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
            draining: self.0.draining.load(Ordering::SeqCst),
        }
    }

    /// A new operation of `kind` on `rec`, from `source` (`bazaar_lifecycle::accept::begin`
    /// with the next operation id, now).
    pub(crate) fn new_op(&self, rec: &mut MachineRecord, kind: OpKind, source: &str) -> Operation {
        self.begin_op(rec, kind, source, 0)
    }

    /// As [`Agent::new_op`], not to begin before `not_before_ms`.
    pub(crate) fn begin_op(
        &self,
        rec: &mut MachineRecord,
        kind: OpKind,
        source: &str,
        not_before_ms: u64,
    ) -> Operation {
        let id = self.next_op_id();
        bazaar_lifecycle::accept::begin(rec, kind, id, source, not_before_ms, self.now_ms())
    }

    /// The next operation id (host-wide, increasing).
    pub(crate) fn next_op_id(&self) -> u64 {
        self.0.next_op_id.fetch_add(1, Ordering::SeqCst)
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
}

/// The ledger pool a machine of `config` is held in: `batch` machines ride on the reclaimed
/// room when the host reclaims (`bazaar_placement::ledger::Pool`).
pub(crate) fn pool_of(config: &MachineConfig) -> bazaar_placement::ledger::Pool {
    bazaar_placement::ledger::Pool::for_priority(config.priority())
}
