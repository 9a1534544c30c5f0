//! The accept side of every operation on an existing machine: validate a request against
//! the machine's state, record the operation durably in the same transaction as its effects
//! on the record, then hand it to the machine's actor ([`crate::actor`]) to run. Creates and
//! the market live in [`crate::market`], leases and metadata in [`crate::leases`], reads in
//! [`crate::views`]; every change is published through [`crate::publish`].

use crate::agent::Agent;
use crate::driver;
use crate::error::{capacity_error, AgentError};
use crate::leases::check_lease;
use crate::record::{MachineRecord, OpKind, Operation};
use crate::registry::ActorMsg;
use crate::store::Batch;
use crate::sync::lock;
use bazaar_lifecycle::accept::accept;
use bazaar_types::config::MachineConfig;
use bazaar_types::config_fields;
use bazaar_types::event::MachineEvent;
use bazaar_types::guest::Guest;
use bazaar_types::host::{Resources, StopRequest, UpdateRequest};
use bazaar_types::ids;
use bazaar_types::machine::Machine;
use bazaar_types::signal::Signal;
use bazaar_types::state::{check_transition, MachineState};
use std::time::Duration;
use tokio::sync::mpsc::OwnedPermit;

impl Agent {
    /// Starts a machine.
    pub async fn start_machine(
        &self,
        id: &str,
        nonce: Option<&str>,
    ) -> Result<Machine, AgentError> {
        self.submit(id, nonce, OpKind::Start, |rec| {
            self.refuse_losing_app(&rec.app, &rec.app_id)?;
            Ok(None)
        })
        .await
    }

    /// 409 for an app that lost its name to another app of the name (both made while
    /// their hosts could not hear each other, `bazaar_catalog`'s `replica::apps`): it
    /// takes no new machine and starts none of its own.
    pub(crate) fn refuse_losing_app(&self, app: &str, app_id: &str) -> Result<(), AgentError> {
        let Some(winner) = self.catalog().and_then(|c| c.lost_to(app, app_id)) else {
            return Ok(());
        };
        Err(AgentError::Conflict(winner.lost_name_message(app_id)))
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
        check_lease(&rec, nonce, self.now_ms())?;
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
        if let Some(name) = req.name.as_deref().filter(|n| !n.is_empty()) {
            if name != rec.name {
                return Err(AgentError::Invalid(format!(
                    "name {name:?}: a machine's name cannot be changed by an update (it is {:?}); create a machine with the new name",
                    rec.name
                )));
            }
        }
        if let Some(ttl) = req.lease_ttl {
            crate::leases::new_lease(&rec, ttl, "", None, self.now_ms())?;
        }
        // The caller holds the lease (checked above) or there is none: a lease_ttl refreshes
        // it under the same nonce, or takes a new one.
        let held_nonce = rec
            .lease
            .as_ref()
            .filter(|l| l.expires_at * 1000 > self.now_ms())
            .map(|l| l.nonce.clone());
        let kind = OpKind::Update {
            skip_launch: req.skip_launch,
            previous_instance_id: rec.instance_id.clone(),
        };
        let desired = check_transition(rec.desired, kind.action())?;
        let place = self.0.actors.reserve(id)?;
        let previous_resources = rec.resources;
        // A preempted machine that an update launches takes its resources again first.
        let was_preempted = rec.preempted_by.is_some() && !req.skip_launch;
        // A change of class between `batch` and the others moves the machine between the
        // ledger's pools (when the host reclaims).
        let previous_pool = crate::agent::pool_of(&rec.config);
        let pool = crate::agent::pool_of(&req.config);
        if resources != previous_resources || was_preempted || pool != previous_pool {
            ledger
                .commit_in(id, resources, pool)
                .map_err(capacity_error)?;
        }
        if was_preempted {
            rec.preempted_by = None;
        }
        let undo = |ledger: &mut bazaar_placement::Ledger| {
            if was_preempted {
                ledger.uncommit(id);
            } else {
                ledger.restore_in(id, previous_resources, previous_pool);
            }
        };
        let previous = rec.clone();
        rec.config = req.config.clone();
        rec.resources = resources;
        rec.instance_id = ids::new_instance_id();
        rec.desired = if req.skip_launch {
            MachineState::Stopped
        } else {
            desired
        };
        rec.updated_at_ms = self.now_ms();
        if req.skip_service_registration {
            rec.cordoned = true;
        }
        if let Some(ttl) = req.lease_ttl {
            rec.lease = Some(crate::leases::new_lease(
                &rec,
                ttl,
                "",
                held_nonce.as_deref(),
                self.now_ms(),
            )?);
        }
        if let Err(err) = self
            .assign_ports(&mut rec)
            .and_then(|()| self.assign_user(&mut rec))
        {
            undo(&mut ledger);
            return Err(err);
        }
        let op = self.new_op(&mut rec, kind, "user");
        let mut b = Batch::default();
        b.version(id, &rec.instance_id, &rec.config)
            .event(&mut rec, MachineEvent::new("update", "updating", "user"));
        b.machine(&rec).op(&op);
        if let Err(err) = self.commit(b).await {
            undo(&mut ledger);
            return Err(err);
        }
        let freed: Vec<u16> = previous
            .host_ports
            .values()
            .filter(|p| !rec.host_ports.values().any(|q| q == *p))
            .copied()
            .collect();
        self.0.addresses.release_ports(&freed);
        drop(ledger);
        let mut machine = self.enqueue(&rec, op, place).await?;
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
        check_lease(&rec, nonce, self.now_ms())?;
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
        let mut ledger = self.0.ledger.lock().await;
        let mut rec = self.load_live(id)?;
        let kind = refine(&rec)?.unwrap_or(kind);
        // A preempted machine gave its resources away: starting it takes them again, or is
        // refused for capacity (`preempt.rs`).
        let recommit = rec.preempted_by.is_some()
            && matches!(kind.action(), bazaar_types::state::Action::Start);
        let op = accept(
            &mut rec,
            kind,
            nonce,
            self.next_op_id(),
            "user",
            self.now_ms(),
        )?;
        let place = self.0.actors.reserve(id)?;
        if recommit {
            ledger
                .commit_in(id, rec.resources, crate::agent::pool_of(&rec.config))
                .map_err(crate::error::capacity_error)?;
            rec.preempted_by = None;
        }
        let mut b = Batch::default();
        b.machine(&rec).op(&op);
        if let Err(err) = self.commit(b).await {
            if recommit {
                ledger.uncommit(id);
            }
            return Err(err);
        }
        drop(ledger);
        self.enqueue(&rec, op, place).await
    }

    /// Hands a recorded operation to the machine's actor, in the place `place` taken in its
    /// channel before the operation was recorded.
    pub(crate) async fn enqueue(
        &self,
        rec: &MachineRecord,
        op: Operation,
        place: OwnedPermit<ActorMsg>,
    ) -> Result<Machine, AgentError> {
        self.0.crash.at(op.kind.name(), 0);
        tracing::debug!(machine.id = %rec.id, op = op.kind.name(), "operation accepted");
        // Shown from the moment the operation is accepted (the actor may not have begun it
        // yet): a `wait` right after a restart must not find the machine still `started`
        // from before it. Set before the actor can see the operation, so that its end
        // (which clears the state) comes after this.
        if !op.kind.steps().is_empty() {
            lock(&self.0.transient)
                .entry(rec.id.clone())
                .or_insert(op.kind.transient_state());
        }
        place.send(ActorMsg::Op(op));
        self.machine(&rec.id).await
    }
}

pub(crate) fn stop_params(config: &MachineConfig, req: &StopRequest) -> (Signal, Duration) {
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
/// GPUs (no host has one: a placement refusal, `insufficient_capacity`), keys that are no
/// Fly config's and Fly's fields bazaar does not act on set to other than their default
/// (400 naming the field: `bazaar_types::config_fields`).
fn refuse_unsupported(config: &MachineConfig, guest: &Guest) -> Result<(), AgentError> {
    let set = |v: Option<&serde_json::Value>| {
        v.is_some_and(|v| !config_fields::is_default(v, config_fields::Shape::Any))
    };
    if set(guest.extra.get("gpus")) || set(guest.extra.get("gpu_kind")) {
        return Err(AgentError::Capacity(
            "no host in this cluster has GPUs (guest.gpus / guest.gpu_kind)".into(),
        ));
    }
    config_fields::check(config).map_err(AgentError::Invalid)?;
    if let Some(metrics) = &config.metrics {
        if metrics.port == 0 {
            return Err(AgentError::Invalid(
                "config.metrics.port must be between 1 and 65535".into(),
            ));
        }
        if !metrics.path.starts_with('/')
            || metrics
                .path
                .chars()
                .any(|c| c.is_ascii_control() || c == ' ')
        {
            return Err(AgentError::Invalid(format!(
                "config.metrics.path must be an absolute URL path, got {:?}",
                metrics.path
            )));
        }
        if metrics.https {
            return Err(AgentError::Invalid(
                "config.metrics.https is not supported by bazaar (metrics are scraped over HTTP on the machine's own address); leave it out".into(),
            ));
        }
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
    bazaar_types::limits::check_config(config).map_err(AgentError::Invalid)?;
    refuse_unsupported(config, &guest)?;
    config.rootfs_size_gb().map_err(AgentError::Invalid)?;
    bazaar_types::replacement::validate(config).map_err(AgentError::Invalid)?;
    if let Some(p) = &config.placement {
        p.validate().map_err(AgentError::Invalid)?;
    }
    config.check_runtime().map_err(AgentError::Invalid)?;
    match config.driver() {
        "process" => {
            let argv = config.init.as_ref().map(|i| i.argv()).unwrap_or_default();
            driver::validate_command(&config.env, &argv).map_err(AgentError::Invalid)?;
            driver::work_files(config).map_err(AgentError::Invalid)?;
        }
        // gVisor runs the same bundle as runc, a microVM a disk of the same rootfs (a host
        // that cannot run them refuses them: runnable.rs).
        "oci" | "gvisor" | "microvm" => {
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
