//! The agent's shared state and the accept side of every operation: validate a request
//! against the machine's state, record the operation durably in the same transaction as
//! its effects on the record, then hand it to the machine's actor ([`crate::actor`]) to run.
//! Also the host's side of the market: bids, reservations and claims.

use crate::actor::{spawn_actor, ActorMsg};
use crate::config::AgentConfig;
use crate::driver::{self, Driver};
use crate::error::AgentError;
use crate::fault::CrashPoint;
use crate::record::{MachineRecord, OpKind, Operation};
use crate::store::{Batch, Store};
use bazaar_placement::{Ledger, LedgerError};
use bazaar_types::config::MachineConfig;
use bazaar_types::event::MachineEvent;
use bazaar_types::guest::Guest;
use bazaar_types::host::{
    BidRequest, BidResponse, ClaimRequest, HostInfo, Resources, StopRequest, UpdateRequest,
    WaitResponse,
};
use bazaar_types::machine::Machine;
use bazaar_types::signal::Signal;
use bazaar_types::state::{check_transition, MachineState};
use bazaar_types::{ids, now_ms, rfc3339};
use std::collections::{BTreeMap, HashMap, HashSet};
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
    pub driver: Driver,
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
    /// When the token file was last read (it is re-read when it changes).
    pub tokens_read: Mutex<Option<std::time::SystemTime>>,
    pub ports_in_use: Mutex<HashSet<u16>>,
    pub cluster_secret: String,
    /// The gossip replica, once attached: every change to a machine is published to it.
    pub catalog: std::sync::OnceLock<bazaar_catalog::Catalog>,
    /// The last host record published (to publish only changes).
    pub last_host_record: Mutex<Option<bazaar_catalog::HostRecord>>,
    /// Where this host's edge proxy listens, once it does (published as the host label
    /// `proxy_addr`, so other proxies can hand requests for this host's machines to it).
    pub proxy_addr: std::sync::OnceLock<std::net::SocketAddr>,
    /// The latest health-check results of this host's machines ([`crate::checks`]).
    pub checks: Mutex<HashMap<String, Vec<bazaar_catalog::CheckRecord>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
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
        std::fs::create_dir_all(&config.data_dir)?;
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
        let secret = crate::secrets::cluster_secret(&config)?;
        let mut tokens = vec![secret.clone()];
        if let Some(path) = &config.token_file {
            tokens.extend(crate::secrets::read_tokens(path)?);
        }
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
        };
        let mut ledger = Ledger::new(config.capacity());
        let machines = store.machines()?;
        let mut ports = HashSet::new();
        for m in machines
            .iter()
            .filter(|m| m.state != MachineState::Destroyed)
        {
            ledger.restore(&m.id, m.resources);
            ports.extend(m.host_ports.values().copied());
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
            ports_in_use: Mutex::new(ports),
            cluster_secret: secret,
            catalog: std::sync::OnceLock::new(),
            last_host_record: Mutex::new(None),
            proxy_addr: std::sync::OnceLock::new(),
            checks: Mutex::new(HashMap::new()),
            config,
        });
        let agent = Agent(inner);
        let mut ops_by_machine: HashMap<String, Vec<Operation>> = HashMap::new();
        for op in ops {
            ops_by_machine
                .entry(op.machine_id.clone())
                .or_default()
                .push(op);
        }
        let num_machines = machines.len();
        let mut num_adopted = 0;
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
                .and_then(|r| {
                    let dir = agent.0.driver.run_dir(&m.id, r.run_id);
                    match bazaar_shim::ShimHandle::adopt(&dir) {
                        Ok(h) => h,
                        Err(err) => {
                            tracing::warn!(machine.id = %m.id, error = %err, "re-adopting run");
                            None
                        }
                    }
                });
            num_adopted += run.is_some() as usize;
            spawn_actor(&agent, m, ops, run);
        }
        agent.spawn_housekeeping();
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

    /// Attaches the catalog and publishes this host and all its machines to it (with
    /// versions above anything published before a restart).
    pub async fn attach_catalog(&self, catalog: bazaar_catalog::Catalog) {
        if self.0.catalog.set(catalog).is_err() {
            return;
        }
        self.publish_host().await;
        for m in self.0.store.machines().unwrap_or_default() {
            self.publish(&m);
        }
    }

    /// The catalog, once attached.
    pub fn catalog(&self) -> Option<&bazaar_catalog::Catalog> {
        self.0.catalog.get()
    }

    /// The cluster secret (host-to-host calls).
    pub fn cluster_secret(&self) -> &str {
        &self.0.cluster_secret
    }

    /// Publishes this host's record to the catalog if it changed.
    pub async fn publish_host(&self) {
        let Some(catalog) = self.0.catalog.get() else {
            return;
        };
        // Advertise capacity minus what is committed: reservations are short-lived, and
        // counting them would make a host look full to every exchange during a burst.
        let (capacity, free) = {
            let ledger = self.0.ledger.lock().await;
            let (cap, used) = (ledger.capacity(), ledger.committed());
            (
                cap,
                Resources {
                    cpus: cap.cpus.saturating_sub(used.cpus),
                    memory_mb: cap.memory_mb.saturating_sub(used.memory_mb),
                },
            )
        };
        let num_machines = lock(&self.0.actors).len() as u32;
        let record = bazaar_catalog::HostRecord {
            id: self.0.host_id.clone(),
            region: self.0.config.region.clone(),
            api_addr: self.0.config.api_listen.to_string(),
            gossip_addr: catalog.local_addr().to_string(),
            capacity,
            free,
            num_machines,
            labels: self
                .0
                .proxy_addr
                .get()
                .map(|a| BTreeMap::from([("proxy_addr".to_string(), a.to_string())]))
                .unwrap_or_default(),
            draining: self.0.shutdown.is_cancelled(),
            updated_at_ms: 0,
        };
        let mut last = lock(&self.0.last_host_record);
        if last.as_ref() != Some(&record) {
            *last = Some(record.clone());
            drop(last);
            catalog.publish_host(record);
        }
    }

    /// Records where this host's edge proxy listens and republishes the host record.
    pub async fn set_proxy_addr(&self, addr: std::net::SocketAddr) {
        let _ = self.0.proxy_addr.set(addr);
        self.publish_host().await;
    }

    /// Cancelled when the agent shuts down (for services that run beside it).
    pub fn shutdown_token(&self) -> CancellationToken {
        self.0.shutdown.clone()
    }

    /// This host's id.
    pub fn host_id(&self) -> &str {
        &self.0.host_id
    }

    /// The agent's config.
    pub fn config(&self) -> &AgentConfig {
        &self.0.config
    }

    /// Checks a bearer token in constant time.
    pub fn authorized(&self, token: &str) -> bool {
        let check = |tokens: &Vec<String>| {
            tokens
                .iter()
                .any(|t| crate::secrets::constant_time_eq(t.as_bytes(), token.as_bytes()))
        };
        if check(&lock(&self.0.tokens)) {
            return true;
        }
        // `bazaar token create` appends to the token file: pick up new tokens.
        let Some(path) = &self.0.config.token_file else {
            return false;
        };
        let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
        let mut read = lock(&self.0.tokens_read);
        if modified.is_none() || *read == modified {
            return false;
        }
        *read = modified;
        if let Ok(file_tokens) = crate::secrets::read_tokens(path) {
            let mut tokens = lock(&self.0.tokens);
            let secret = self.0.cluster_secret.clone();
            *tokens = std::iter::once(secret).chain(file_tokens).collect();
            return check(&tokens);
        }
        false
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

    // === The market: bids, claims, releases ===

    /// Answers a bid request from exact local state: a reservation and a score, or a
    /// refusal with the reason.
    pub async fn bid(&self, req: BidRequest) -> Result<BidResponse, AgentError> {
        if req.memory_mb == 0 || req.cpus == 0 {
            return Err(AgentError::Invalid(
                "a bid needs cpus and memory_mb greater than zero".into(),
            ));
        }
        if self.0.shutdown.is_cancelled() {
            return Ok(BidResponse::Refusal {
                host_id: self.0.host_id.clone(),
                reason: "host is shutting down".into(),
                retryable: false,
            });
        }
        let ttl = Duration::from_millis(req.ttl_ms.unwrap_or(u64::MAX))
            .min(self.0.config.reservation_ttl);
        let want = Resources {
            cpus: req.cpus,
            memory_mb: req.memory_mb,
        };
        let id = ids::new_reservation_id();
        let expires_at_ms = now_ms() + ttl.as_millis() as u64;
        let mut ledger = self.0.ledger.lock().await;
        // Open reservations live in memory only: losing them in a crash is the same as
        // their expiry, which the exchange handles (the claim fails, the next offer is
        // taken). Claimed ones are persisted with the machine they became.
        match ledger.reserve(&id, want, expires_at_ms) {
            Ok((_, score)) => Ok(BidResponse::Bid {
                host_id: self.0.host_id.clone(),
                reservation_id: id,
                score,
                expires_at_ms,
                free: ledger.free(),
            }),
            Err(err) => Ok(BidResponse::Refusal {
                host_id: self.0.host_id.clone(),
                reason: err.to_string(),
                retryable: !matches!(err, LedgerError::Draining)
                    && ledger.fits_without_reservations(want),
            }),
        }
    }

    /// Returns an unclaimed reservation.
    pub async fn release(&self, reservation_id: &str) -> Result<(), AgentError> {
        let mut ledger = self.0.ledger.lock().await;
        match ledger.reservation(reservation_id) {
            None => return Err(AgentError::ReservationNotFound(reservation_id.into())),
            Some(r) if r.claimed_by.is_some() => {
                return Err(AgentError::Conflict(format!(
                    "reservation {reservation_id} was claimed and cannot be released"
                )))
            }
            Some(_) => {}
        }
        ledger.release(reservation_id);
        Ok(())
    }

    /// Turns a reservation into a machine. Idempotent: claiming a reservation again returns
    /// the machine it became.
    pub async fn claim(
        &self,
        reservation_id: &str,
        req: ClaimRequest,
    ) -> Result<Machine, AgentError> {
        // Fault injection: a host that dies between its bid and the claim.
        self.0.crash.at("claim", 0);
        let mut ledger = self.0.ledger.lock().await;
        let reservation = ledger
            .reservation(reservation_id)
            .cloned()
            .ok_or_else(|| AgentError::ReservationNotFound(reservation_id.into()))?;
        if let Some(existing) = &reservation.claimed_by {
            if req.machine_id.as_deref().is_some_and(|m| m != existing) {
                return Err(AgentError::Conflict(format!(
                    "reservation {reservation_id} was already claimed by machine {existing}"
                )));
            }
            drop(ledger);
            return self.machine(existing).await;
        }
        let (rec, op, mut batch) = self.prepare_create(&req)?;
        if rec.resources != reservation.resources {
            self.release_ports(&rec);
            return Err(AgentError::Invalid(format!(
                "the machine needs {} cpus / {} MB but reservation {reservation_id} holds {} cpus / {} MB",
                rec.resources.cpus,
                rec.resources.memory_mb,
                reservation.resources.cpus,
                reservation.resources.memory_mb
            )));
        }
        ledger
            .claim(reservation_id, &rec.id)
            .map_err(|e| AgentError::Conflict(e.to_string()))?;
        let mut claimed = reservation.clone();
        claimed.claimed_by = Some(rec.id.clone());
        batch.reservation(&claimed);
        if let Err(err) = self.commit(batch).await {
            ledger.uncommit(&rec.id);
            ledger.restore_reservation(reservation);
            self.release_ports(&rec);
            return Err(err);
        }
        drop(ledger);
        Ok(self.accepted_create(rec, op).await)
    }

    /// Creates a machine here directly (a reservation and its claim in one step).
    pub async fn create(&self, req: ClaimRequest) -> Result<Machine, AgentError> {
        let mut ledger = self.0.ledger.lock().await;
        if let Some(id) = &req.machine_id {
            if self.0.store.machine(id)?.is_some() {
                drop(ledger);
                return self.machine(id).await;
            }
        }
        let (rec, op, batch) = self.prepare_create(&req)?;
        if let Err(err) = ledger.commit(&rec.id, rec.resources) {
            self.release_ports(&rec);
            return Err(capacity_error(err));
        }
        if let Err(err) = self.commit(batch).await {
            ledger.uncommit(&rec.id);
            self.release_ports(&rec);
            return Err(err);
        }
        drop(ledger);
        Ok(self.accepted_create(rec, op).await)
    }

    /// Validates a create request and builds the record, its first operation and the batch
    /// that records them (not yet written).
    fn prepare_create(
        &self,
        req: &ClaimRequest,
    ) -> Result<(MachineRecord, Operation, Batch), AgentError> {
        ids::validate_name("app", &req.app).map_err(AgentError::Invalid)?;
        let name = match &req.name {
            Some(n) => {
                ids::validate_name("machine", n).map_err(AgentError::Invalid)?;
                n.clone()
            }
            None => ids::new_machine_name(),
        };
        if let Some(region) = &req.region {
            if !region.is_empty() && *region != self.0.config.region {
                return Err(AgentError::Invalid(format!(
                    "this host is in region {}, not {region}",
                    self.0.config.region
                )));
            }
        }
        let id = match &req.machine_id {
            Some(id) if ids::is_valid_machine_id(id) => id.clone(),
            Some(id) => return Err(AgentError::Invalid(format!("invalid machine id {id:?}"))),
            None => ids::new_machine_id(),
        };
        let resources = validate_config(&req.config)?;
        let now = now_ms();
        let instance_id = ids::new_instance_id();
        let mut rec = MachineRecord {
            id: id.clone(),
            name,
            app: req.app.clone(),
            region: self.0.config.region.clone(),
            state: MachineState::Created,
            desired: if req.skip_launch {
                MachineState::Created
            } else {
                MachineState::Started
            },
            instance_id: instance_id.clone(),
            config: req.config.clone(),
            resources,
            created_at_ms: now,
            updated_at_ms: now,
            cordoned: false,
            host_ports: BTreeMap::new(),
            run: None,
            next_run_id: 1,
            exit_handled_run: 0,
            policy_restarts: Vec::new(),
            restart_count: 0,
            host_shutdown_run: None,
            next_event_seq: 1,
            destroyed_at_ms: None,
            lease: None,
            placement: req.placement.clone(),
        };
        rec.cordoned = req.skip_service_registration;
        if let Some(ttl) = req.lease_ttl {
            rec.lease = Some(new_lease(&rec, ttl, "", None)?);
        }
        self.assign_ports(&mut rec)?;
        let kind = OpKind::Create {
            skip_launch: req.skip_launch,
        };
        let op = self.new_op(&mut rec, kind, "user");
        let mut batch = Batch::default();
        batch
            .version(&id, &instance_id, &req.config)
            .event(&mut rec, MachineEvent::new("launch", "created", "user"));
        batch.machine(&rec).op(&op);
        Ok((rec, op, batch))
    }

    async fn accepted_create(&self, rec: MachineRecord, op: Operation) -> Machine {
        self.0.crash.at(op.kind.name(), 0);
        tracing::info!(machine.id = %rec.id, app = %rec.app, "machine created");
        self.publish(&rec);
        let mut machine = self.view(&rec, self.0.store.events(&rec.id, 20).unwrap_or_default());
        machine.nonce = rec.lease.as_ref().map(|l| l.nonce.clone());
        spawn_actor(self, rec, vec![op], None);
        machine
    }

    fn new_op(&self, rec: &mut MachineRecord, kind: OpKind, source: &str) -> Operation {
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

    fn assign_ports(&self, rec: &mut MachineRecord) -> Result<(), AgentError> {
        let wanted: Vec<u16> = rec
            .config
            .services
            .iter()
            .map(|s| s.internal_port)
            .collect();
        rec.host_ports
            .retain(|internal, _| wanted.contains(internal));
        let mut in_use = lock(&self.0.ports_in_use);
        for internal in wanted {
            if rec.host_ports.contains_key(&internal) {
                continue;
            }
            let mut port = driver::free_port().map_err(|e| AgentError::Internal(e.to_string()))?;
            for _ in 0..16 {
                if !in_use.contains(&port) {
                    break;
                }
                port = driver::free_port().map_err(|e| AgentError::Internal(e.to_string()))?;
            }
            in_use.insert(port);
            rec.host_ports.insert(internal, port);
        }
        Ok(())
    }

    pub(crate) fn release_ports(&self, rec: &MachineRecord) {
        let mut in_use = lock(&self.0.ports_in_use);
        for p in rec.host_ports.values() {
            in_use.remove(p);
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
        self.submit(
            id,
            nonce,
            OpKind::Stop {
                signal: 0,
                timeout_ms: 0,
            },
            |rec| {
                let (sig, timeout) = stop_params(&rec.config, &req);
                Ok(Some(OpKind::Stop {
                    signal: sig.0,
                    timeout_ms: timeout.as_millis() as u64,
                }))
            },
        )
        .await
    }

    /// Restarts a started machine.
    pub async fn restart_machine(
        &self,
        id: &str,
        req: StopRequest,
        nonce: Option<&str>,
    ) -> Result<Machine, AgentError> {
        self.submit(
            id,
            nonce,
            OpKind::Restart {
                signal: 0,
                timeout_ms: 0,
            },
            |rec| {
                let (sig, timeout) = stop_params(&rec.config, &req);
                Ok(Some(OpKind::Restart {
                    signal: sig.0,
                    timeout_ms: timeout.as_millis() as u64,
                }))
            },
        )
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
        if let Err(err) = self.assign_ports(&mut rec) {
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
        self.enqueue(&rec, op).await
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
        let run_dir = self.0.driver.run_dir(id, run.run_id);
        let handle = bazaar_shim::ShimHandle::adopt(&run_dir)
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

    async fn enqueue(&self, rec: &MachineRecord, op: Operation) -> Result<Machine, AgentError> {
        self.0.crash.at(op.kind.name(), 0);
        tracing::debug!(machine.id = %rec.id, op = op.kind.name(), "operation accepted");
        let sender = lock(&self.0.actors).get(&rec.id).cloned();
        match sender {
            Some(tx) => {
                let _ = tx.send(ActorMsg::Op(op));
            }
            None => return Err(AgentError::ShuttingDown),
        }
        self.machine(&rec.id).await
    }

    fn load_live(&self, id: &str) -> Result<MachineRecord, AgentError> {
        if !ids::is_valid_machine_id(id) {
            return Err(AgentError::MachineNotFound(id.into()));
        }
        self.0
            .store
            .machine(id)?
            .filter(|m| m.state != MachineState::Destroyed)
            .ok_or_else(|| AgentError::MachineNotFound(id.into()))
    }

    // === Leases, cordons, metadata ===

    /// Takes or refreshes the lease. Refreshing needs the current nonce; another holder's
    /// unexpired lease is a conflict. Returns the lease and whether it is new.
    pub async fn lease_acquire(
        &self,
        id: &str,
        ttl: u64,
        description: &str,
        nonce: Option<&str>,
    ) -> Result<(bazaar_types::machine::Lease, bool), AgentError> {
        let _guard = self.0.ledger.lock().await;
        let mut rec = self.load_live(id)?;
        let held = rec.lease.clone().filter(|l| l.expires_at * 1000 > now_ms());
        let (lease, created) = match (&held, nonce) {
            (Some(l), Some(n)) if l.nonce == n => {
                (new_lease(&rec, ttl, description, Some(n))?, false)
            }
            (Some(l), _) => return Err(lease_conflict(id, l)),
            (None, Some(n))
                if !n.is_empty() && rec.lease.as_ref().is_some_and(|l| l.nonce == n) =>
            {
                // Refreshing a lease that just expired: renew it for the same holder.
                (new_lease(&rec, ttl, description, Some(n))?, false)
            }
            (None, _) => (new_lease(&rec, ttl, description, None)?, true),
        };
        rec.lease = Some(lease.clone());
        let mut b = Batch::default();
        b.machine(&rec);
        self.commit(b).await?;
        Ok((lease, created))
    }

    /// The current lease, if one is held.
    pub async fn lease_get(
        &self,
        id: &str,
    ) -> Result<Option<bazaar_types::machine::Lease>, AgentError> {
        let rec = self.load_live(id)?;
        Ok(rec.lease.filter(|l| l.expires_at * 1000 > now_ms()))
    }

    /// Releases the lease; the nonce must match.
    pub async fn lease_release(&self, id: &str, nonce: Option<&str>) -> Result<(), AgentError> {
        let _guard = self.0.ledger.lock().await;
        let mut rec = self.load_live(id)?;
        let Some(nonce) = nonce.filter(|n| !n.is_empty()) else {
            return Err(AgentError::Invalid(
                "releasing a lease needs its nonce in the fly-machine-lease-nonce header".into(),
            ));
        };
        match rec.lease.clone().filter(|l| l.expires_at * 1000 > now_ms()) {
            None => return Err(AgentError::LeaseNotFound(id.into())),
            Some(l) if l.nonce != nonce => return Err(lease_conflict(id, &l)),
            Some(_) => {}
        }
        rec.lease = None;
        let mut b = Batch::default();
        b.machine(&rec);
        self.commit(b).await
    }

    /// Cordons (no new traffic from the proxy) or uncordons a machine.
    pub async fn cordon(
        &self,
        id: &str,
        cordoned: bool,
        nonce: Option<&str>,
    ) -> Result<(), AgentError> {
        let _guard = self.0.ledger.lock().await;
        let mut rec = self.load_live(id)?;
        check_lease(&rec, nonce)?;
        rec.cordoned = cordoned;
        rec.updated_at_ms = now_ms();
        let mut b = Batch::default();
        b.machine(&rec);
        self.commit(b).await?;
        self.publish(&rec);
        Ok(())
    }

    /// A machine's metadata.
    pub async fn metadata(&self, id: &str) -> Result<BTreeMap<String, String>, AgentError> {
        Ok(self.load_live(id)?.config.metadata)
    }

    /// Sets or removes metadata keys (a `None` or empty value removes the key). With
    /// `machine_version`, refuses (412) unless the machine is at that version.
    pub async fn metadata_update(
        &self,
        id: &str,
        changes: BTreeMap<String, Option<String>>,
        machine_version: Option<&str>,
        nonce: Option<&str>,
    ) -> Result<(), AgentError> {
        for key in changes.keys() {
            validate_metadata_key(key)?;
        }
        let _guard = self.0.ledger.lock().await;
        let mut rec = self.load_live(id)?;
        check_lease(&rec, nonce)?;
        if let Some(v) = machine_version {
            if v != rec.instance_id {
                return Err(AgentError::Precondition(format!(
                    "machine version is {}, not {v}",
                    rec.instance_id
                )));
            }
        }
        for (k, v) in changes {
            match v.filter(|v| !v.is_empty()) {
                Some(v) => rec.config.metadata.insert(k, v),
                None => rec.config.metadata.remove(&k),
            };
        }
        rec.updated_at_ms = now_ms();
        let mut b = Batch::default();
        b.machine(&rec);
        self.commit(b).await?;
        self.publish(&rec);
        Ok(())
    }

    /// Runs a command in a started machine's context.
    pub async fn exec(
        &self,
        id: &str,
        req: bazaar_types::host::ExecRequest,
    ) -> Result<bazaar_types::host::ExecResponse, AgentError> {
        let rec = self.load_live(id)?;
        check_transition(self.current_state(&rec), bazaar_types::state::Action::Exec)?;
        let run = rec
            .run
            .filter(|r| r.run_id > rec.exit_handled_run && r.workload_pid > 0)
            .ok_or_else(|| AgentError::Conflict(format!("machine {id} has no running process")))?;
        let spec = self.0.driver.spec(&rec, run.run_id);
        let target = crate::exec::ExecTarget {
            workload_pid: run.workload_pid,
            isolated: self.0.driver.isolate,
            env: spec.env,
            workdir: spec.workdir,
        };
        crate::exec::run(&target, &req).await
    }

    /// How the machine was placed, if it went through the market.
    pub async fn placement(&self, id: &str) -> Result<Option<serde_json::Value>, AgentError> {
        Ok(self
            .0
            .store
            .machine(id)?
            .ok_or_else(|| AgentError::MachineNotFound(id.into()))?
            .placement)
    }

    /// The machine's log file, for streaming.
    pub fn log_path(&self, id: &str) -> std::path::PathBuf {
        self.0.driver.log_path(id)
    }

    // === Reads ===

    /// One machine (tombstones included), with its latest events.
    pub async fn machine(&self, id: &str) -> Result<Machine, AgentError> {
        if !ids::is_valid_machine_id(id) {
            return Err(AgentError::MachineNotFound(id.into()));
        }
        let rec = self
            .0
            .store
            .machine(id)?
            .ok_or_else(|| AgentError::MachineNotFound(id.into()))?;
        let events = self.0.store.events(id, 20)?;
        Ok(self.view(&rec, events))
    }

    /// Machines on this host, optionally of one app.
    pub async fn machines(
        &self,
        app: Option<&str>,
        include_deleted: bool,
    ) -> Result<Vec<Machine>, AgentError> {
        let mut out: Vec<Machine> = self
            .0
            .store
            .machines()?
            .into_iter()
            .filter(|m| app.is_none_or(|a| m.app == a))
            .filter(|m| include_deleted || m.state != MachineState::Destroyed)
            .map(|m| self.view(&m, Vec::new()))
            .collect();
        out.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        Ok(out)
    }

    /// A machine's events, newest first.
    pub async fn events(&self, id: &str, limit: usize) -> Result<Vec<MachineEvent>, AgentError> {
        self.machine(id).await?;
        Ok(self.0.store.events(id, limit)?)
    }

    /// A machine's config versions, newest first.
    pub async fn versions(&self, id: &str) -> Result<Vec<(String, MachineConfig)>, AgentError> {
        self.machine(id).await?;
        let mut v = self.0.store.versions(id)?;
        v.reverse();
        Ok(v)
    }

    /// The tail of a machine's log (JSON lines), at most `max_bytes`.
    pub async fn log_tail(&self, id: &str, max_bytes: u64) -> Result<String, AgentError> {
        self.machine(id).await?;
        let path = self.0.driver.log_path(id);
        let data = match std::fs::read(&path) {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(AgentError::Internal(e.to_string())),
        };
        let start = data.len().saturating_sub(max_bytes as usize);
        let text = String::from_utf8_lossy(&data[start..]);
        // Do not start in the middle of a line.
        let text = if start > 0 {
            text.split_once('\n').map(|(_, t)| t).unwrap_or("")
        } else {
            &text
        };
        Ok(text.to_string())
    }

    /// Waits until the machine is in one of `states` (and at `instance_id`, if given).
    pub async fn wait(
        &self,
        id: &str,
        states: &[MachineState],
        timeout: Duration,
        instance_id: Option<&str>,
    ) -> Result<WaitResponse, AgentError> {
        let machine = self.machine(id).await?;
        let rx = lock(&self.0.live).get(id).map(|tx| tx.subscribe());
        let matches = |s: &Snapshot| {
            let state_ok = states.contains(&s.state);
            state_ok && instance_id.is_none_or(|v| v == s.instance_id)
        };
        let Some(mut rx) = rx else {
            // A tombstone: it only ever is destroyed.
            let snap = Snapshot {
                state: machine.state,
                instance_id: machine.instance_id.clone(),
            };
            if matches(&snap) {
                return Ok(WaitResponse {
                    ok: true,
                    state: snap.state.to_string(),
                    version: snap.instance_id,
                });
            }
            return Err(AgentError::WaitTimeout {
                id: id.into(),
                states: join_states(states),
            });
        };
        let result = tokio::time::timeout(timeout, rx.wait_for(|s| matches(s))).await;
        match result {
            Ok(Ok(snap)) => Ok(WaitResponse {
                ok: true,
                state: snap.state.to_string(),
                version: snap.instance_id.clone(),
            }),
            _ => Err(AgentError::WaitTimeout {
                id: id.into(),
                states: join_states(states),
            }),
        }
    }

    /// The state clients see: the running operation's state, else the recorded one.
    pub(crate) fn current_state(&self, rec: &MachineRecord) -> MachineState {
        if rec.state == MachineState::Destroyed {
            return rec.state;
        }
        lock(&self.0.transient)
            .get(&rec.id)
            .copied()
            .unwrap_or(rec.state)
    }

    /// Shows a record as the API's machine object.
    pub(crate) fn view(&self, rec: &MachineRecord, events: Vec<MachineEvent>) -> Machine {
        let live_run = rec.run.filter(|r| r.run_id > rec.exit_handled_run);
        Machine {
            id: rec.id.clone(),
            name: rec.name.clone(),
            state: self.current_state(rec),
            region: rec.region.clone(),
            instance_id: rec.instance_id.clone(),
            version: rec.instance_id.clone(),
            private_ip: "127.0.0.1".into(),
            created_at: rfc3339(rec.created_at_ms),
            updated_at: rfc3339(rec.updated_at_ms),
            config: rec.config.clone(),
            events,
            checks: lock(&self.0.checks)
                .get(&rec.id)
                .filter(|_| self.current_state(rec) == MachineState::Started)
                .map(|list| {
                    list.iter()
                        .map(|c| {
                            serde_json::json!({
                                "name": c.name,
                                "status": c.status,
                                "output": c.output,
                                "updated_at": rfc3339(c.updated_at_ms),
                            })
                        })
                        .collect()
                })
                .unwrap_or_default(),
            host_status: "ok".into(),
            cordoned: rec.cordoned,
            nonce: None,
            host_id: self.0.host_id.clone(),
            app: rec.app.clone(),
            host_ports: rec.host_ports.clone(),
            pid: live_run.map(|r| r.workload_pid),
            lease: rec.lease.clone().filter(|l| l.expires_at * 1000 > now_ms()),
        }
    }

    /// Publishes a machine's state to waiters and to the catalog.
    pub(crate) fn publish(&self, rec: &MachineRecord) {
        if let Some(catalog) = self.0.catalog.get() {
            if rec.state == MachineState::Destroyed {
                catalog.delete_machine(&rec.id);
            } else {
                catalog.publish_machine(self.catalog_row(rec));
            }
        }
        let snap = Snapshot {
            state: self.current_state(rec),
            instance_id: rec.instance_id.clone(),
        };
        let mut live = lock(&self.0.live);
        match live.get(&rec.id) {
            Some(tx) => {
                tx.send_if_modified(|s| {
                    if *s != snap {
                        *s = snap.clone();
                        true
                    } else {
                        false
                    }
                });
            }
            None => {
                live.insert(rec.id.clone(), watch::channel(snap).0);
            }
        }
    }

    /// The catalog row of a machine.
    fn catalog_row(&self, rec: &MachineRecord) -> bazaar_catalog::MachineRecord {
        let services = rec
            .config
            .services
            .iter()
            .filter_map(|svc| {
                rec.host_ports
                    .get(&svc.internal_port)
                    .map(|port| bazaar_catalog::ServiceRecord {
                        service: svc.clone(),
                        address: self.0.config.api_listen.ip().to_string(),
                        port: *port,
                    })
            })
            .collect();
        bazaar_catalog::MachineRecord {
            id: rec.id.clone(),
            app: rec.app.clone(),
            name: rec.name.clone(),
            region: rec.region.clone(),
            host_id: self.0.host_id.clone(),
            state: self.current_state(rec).to_string(),
            instance_id: rec.instance_id.clone(),
            services,
            checks: if self.current_state(rec) == MachineState::Started {
                lock(&self.0.checks)
                    .get(&rec.id)
                    .cloned()
                    .unwrap_or_default()
            } else {
                Vec::new()
            },
            cordoned: rec.cordoned,
            metadata: rec.config.metadata.clone(),
            updated_at_ms: rec.updated_at_ms,
        }
    }

    /// Writes a batch durably, off the async threads.
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

    /// Expires unclaimed reservations, collects old tombstones, republishes the host record.
    async fn housekeeping(&self) {
        self.publish_host().await;
        let now = now_ms();
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
        let old: Vec<String> = self
            .0
            .store
            .machines()
            .unwrap_or_default()
            .into_iter()
            .filter(|m| {
                m.destroyed_at_ms
                    .is_some_and(|t| now.saturating_sub(t) >= ttl)
            })
            .map(|m| m.id)
            .collect();
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

fn join_states(states: &[MachineState]) -> String {
    states
        .iter()
        .map(|s| s.as_str())
        .collect::<Vec<_>>()
        .join(" or ")
}

fn capacity_error(err: LedgerError) -> AgentError {
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
    match config.driver() {
        "process" => {}
        "oci" => {
            return Err(AgentError::Invalid(format!(
                "image {:?}: this host runs process machines only (set config.driver = \"process\" and config.init.exec)",
                config.image
            )))
        }
        other => {
            return Err(AgentError::Invalid(format!(
                "unknown driver {other:?}: use \"process\""
            )))
        }
    }
    let argv = config.init.as_ref().map(|i| i.argv()).unwrap_or_default();
    driver::validate_command(&config.env, &argv).map_err(AgentError::Invalid)?;
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

/// A new lease (or a refresh keeping `keep_nonce`) of `ttl` seconds (1 s to 1 h).
fn new_lease(
    rec: &MachineRecord,
    ttl: u64,
    description: &str,
    keep_nonce: Option<&str>,
) -> Result<bazaar_types::machine::Lease, AgentError> {
    if !(1..=3600).contains(&ttl) {
        return Err(AgentError::Invalid(format!(
            "lease ttl must be between 1 and 3600 seconds, got {ttl}"
        )));
    }
    Ok(bazaar_types::machine::Lease {
        nonce: keep_nonce
            .map(str::to_string)
            .unwrap_or_else(|| ids::new_secret(6)),
        expires_at: now_ms() / 1000 + ttl,
        owner: "api".into(),
        description: description.chars().take(256).collect(),
        version: rec.instance_id.clone(),
    })
}

fn lease_conflict(id: &str, l: &bazaar_types::machine::Lease) -> AgentError {
    AgentError::Conflict(format!(
        "machine {id} lease currently held by {} ({}), expires at {}",
        l.owner,
        if l.description.is_empty() {
            "no description"
        } else {
            &l.description
        },
        rfc3339(l.expires_at * 1000)
    ))
}

/// Refuses a mutation of a leased machine unless `nonce` is the lease's.
fn check_lease(rec: &MachineRecord, nonce: Option<&str>) -> Result<(), AgentError> {
    match rec
        .lease
        .as_ref()
        .filter(|l| l.expires_at * 1000 > now_ms())
    {
        Some(l) if nonce != Some(l.nonce.as_str()) => Err(lease_conflict(&rec.id, l)),
        _ => Ok(()),
    }
}

fn validate_metadata_key(key: &str) -> Result<(), AgentError> {
    let ok = !key.is_empty()
        && key.len() <= 128
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'));
    if ok {
        Ok(())
    } else {
        Err(AgentError::Invalid(format!(
            "invalid metadata key {key:?}: use 1-128 letters, digits, '_', '-', '.', '/'"
        )))
    }
}
