//! The host's side of the market and machine creation: bids (reservations in the ledger),
//! releases, claims that turn a reservation into a machine, and direct creates. A create is
//! validated and written in one transaction with its first operation before it is answered.

use crate::actor::spawn_actor;
use crate::agent::Agent;
use crate::error::capacity_error;
use crate::error::AgentError;
use crate::leases::new_lease;
use crate::operations::validate_config;
use crate::record::{MachineRecord, OpKind, Operation};
use crate::store::Batch;
use bazaar_placement::LedgerError;
use bazaar_types::event::MachineEvent;
use bazaar_types::host::{BidRequest, BidResponse, ClaimRequest, Resources};
use bazaar_types::ids;
use bazaar_types::machine::Machine;
use bazaar_types::state::MachineState;
use std::collections::BTreeMap;
use std::time::Duration;

impl Agent {
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
        if let Some((driver, why)) = req
            .driver
            .as_deref()
            .and_then(|d| Some((d, self.cannot_run(d)?)))
        {
            return Ok(BidResponse::Refusal {
                host_id: self.0.host_id.clone(),
                reason: format!("cannot run {driver} machines: missing {why}"),
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
        let expires_at_ms = self.now_ms() + ttl.as_millis() as u64;
        let mut ledger = self.0.ledger.lock().await;
        // Open reservations live in memory only: losing them in a crash is the same as
        // their expiry, which the exchange handles (the claim fails, the next offer is
        // taken). Claimed ones are persisted with the machine they became.
        let pool = bazaar_placement::ledger::Pool::for_priority(req.priority.unwrap_or_default());
        match ledger.reserve_in(&id, want, expires_at_ms, pool) {
            Ok((_, score)) => Ok(BidResponse::Bid {
                host_id: self.0.host_id.clone(),
                reservation_id: id,
                score,
                expires_at_ms,
                free: ledger.free(),
                victims: Vec::new(),
            }),
            Err(err) if req.preempt && !matches!(err, LedgerError::Draining) => {
                crate::preempt::preemption_bid(self, &mut ledger, &req, id, want, expires_at_ms)
            }
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
        if self.0.preemptions.release(&mut ledger, reservation_id) {
            return Ok(());
        }
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
        if self.0.preemptions.contains(reservation_id) {
            return crate::preempt::claim_preemption(self, reservation_id, req).await;
        }
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
        if self.0.draining.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(AgentError::Conflict(crate::drain::REFUSAL.into()));
        }
        let (rec, op, batch) = self.prepare_create(&req)?;
        let pool = crate::agent::pool_of(&rec.config);
        if let Err(err) = ledger.commit_in(&rec.id, rec.resources, pool) {
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
    pub(crate) fn prepare_create(
        &self,
        req: &ClaimRequest,
    ) -> Result<(MachineRecord, Operation, Batch), AgentError> {
        ids::validate_name("app", &req.app).map_err(AgentError::Invalid)?;
        self.refuse_losing_app(&req.app, &req.app_id)?;
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
        let driver = req.config.driver();
        if let Some(why) = self.cannot_run(driver) {
            return Err(AgentError::Invalid(format!(
                "this host cannot run {driver} machines: missing {why}"
            )));
        }
        let now = self.now_ms();
        let instance_id = ids::new_instance_id();
        let mut rec = MachineRecord {
            id: id.clone(),
            name,
            app: req.app.clone(),
            app_id: req.app_id.clone(),
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
            private_ip: None,
            uid: None,
            uid_base: None,
            run: None,
            next_run_id: 1,
            exit_handled_run: 0,
            policy_restarts: Vec::new(),
            restart_count: 0,
            host_shutdown_run: None,
            next_event_seq: 1,
            last_event_id: String::new(),
            last_event_status: String::new(),
            destroyed_at_ms: None,
            lease: None,
            image_ref: None,
            epoch: req.epoch,
            preempted_by: None,
        };
        rec.cordoned = req.skip_service_registration;
        if let Some(ttl) = req.lease_ttl {
            rec.lease = Some(new_lease(&rec, ttl, "", None, self.now_ms())?);
        }
        self.assign_ports(&mut rec)?;
        if let Err(err) = self.assign_user(&mut rec) {
            self.release_ports(&rec);
            return Err(err);
        }
        let kind = OpKind::Create {
            skip_launch: req.skip_launch,
        };
        let op = self.new_op(&mut rec, kind, "user");
        let mut batch = Batch::default();
        batch
            .version(&id, &instance_id, &req.config)
            .event(&mut rec, MachineEvent::new("launch", "created", "user"));
        batch.machine(&rec).op(&op);
        if let Some(p) = &req.placement {
            batch.placement(&id, p);
        }
        if let Err(err) = crate::volumes::attach_volume(self, &rec, &mut batch) {
            self.release_ports(&rec);
            return Err(err);
        }
        Ok((rec, op, batch))
    }

    pub(crate) async fn accepted_create(&self, rec: MachineRecord, op: Operation) -> Machine {
        self.0.crash.at(op.kind.name(), 0);
        tracing::info!(machine.id = %rec.id, app = %rec.app, "machine created");
        self.publish(&rec);
        crate::volumes::publish_attached_volume(self, &rec);
        let mut machine = self.view(&rec, self.0.store.events(&rec.id, 20).unwrap_or_default());
        machine.nonce = rec.lease.as_ref().map(|l| l.nonce.clone());
        spawn_actor(self, rec, vec![op], None);
        machine
    }
}
