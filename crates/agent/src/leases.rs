//! Leases (Fly's exclusive-change tokens, checked by every mutation), cordons and machine
//! metadata: the agent's side. The rules are the pure core's (`bazaar_lifecycle::lease`);
//! this module loads the record, applies them under the ledger lock and commits.

use crate::agent::Agent;
use crate::error::AgentError;
use crate::record::{AsWorkload, MachineRecord};
use crate::store::Batch;
use bazaar_lifecycle::lease::{self, LeaseRequest};
use bazaar_types::ids;
use bazaar_types::state::check_transition;
use std::collections::BTreeMap;

impl Agent {
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
        let req = LeaseRequest {
            ttl,
            description,
            nonce,
        };
        let (lease, created) = lease::acquire(
            id,
            &rec.instance_id,
            rec.lease.as_ref(),
            req,
            self.now_ms(),
            || ids::new_secret(6),
        )
        .map_err(AgentError::from)?;
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
        Ok(lease::held(rec.lease.as_ref(), self.now_ms()).cloned())
    }

    /// Releases the lease; the nonce must match.
    pub async fn lease_release(&self, id: &str, nonce: Option<&str>) -> Result<(), AgentError> {
        let _guard = self.0.ledger.lock().await;
        let mut rec = self.load_live(id)?;
        lease::release(id, rec.lease.as_ref(), nonce, self.now_ms()).map_err(AgentError::from)?;
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
        check_lease(&rec, nonce, self.now_ms())?;
        rec.cordoned = cordoned;
        rec.updated_at_ms = self.now_ms();
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
            lease::validate_metadata_key(key).map_err(AgentError::from)?;
        }
        let _guard = self.0.ledger.lock().await;
        let mut rec = self.load_live(id)?;
        check_lease(&rec, nonce, self.now_ms())?;
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
        bazaar_types::limits::check_config(&rec.config).map_err(AgentError::Invalid)?;
        bazaar_types::replacement::validate(&rec.config).map_err(AgentError::Invalid)?;
        rec.updated_at_ms = self.now_ms();
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
        let spec = self.0.driver.spec(&rec.workload(), run.run_id);
        let target = crate::exec::ExecTarget {
            shim_exec: self.0.driver.isolate.then(|| {
                let driver = &self.0.driver;
                (driver.exe.clone(), driver.run_dir(&rec.id, run.run_id))
            }),
            env: spec.env,
            workdir: spec.workdir,
            runc_exec: self.0.driver.exec_argv(
                &rec.workload(),
                run.run_id,
                &crate::exec::argv(&req)?,
            ),
        };
        Ok(crate::exec::run(&target, &req).await?)
    }

    /// How the machine was placed, if it went through the market.
    pub async fn placement(&self, id: &str) -> Result<Option<serde_json::Value>, AgentError> {
        if self.0.store.machine(id)?.is_none() {
            return Err(AgentError::MachineNotFound(id.into()));
        }
        Ok(self.0.store.placement(id)?)
    }

    /// The machine's log file, for streaming.
    pub fn log_path(&self, id: &str) -> std::path::PathBuf {
        self.0.driver.log_path(id)
    }
}

/// A new lease of `ttl` seconds for the caller of a create or an update (the core's
/// [`lease::new_lease`] at this machine's version, at `now` in unix ms).
pub(crate) fn new_lease(
    rec: &MachineRecord,
    ttl: u64,
    description: &str,
    keep_nonce: Option<&str>,
    now: u64,
) -> Result<bazaar_types::machine::Lease, AgentError> {
    lease::new_lease(
        &rec.instance_id,
        rec.lease.as_ref(),
        ttl,
        description,
        keep_nonce,
        now,
        || ids::new_secret(6),
    )
    .map_err(AgentError::from)
}

/// Refuses a mutation of a leased machine unless `nonce` is the lease's (at `now`, unix ms).
pub(crate) fn check_lease(
    rec: &MachineRecord,
    nonce: Option<&str>,
    now: u64,
) -> Result<(), AgentError> {
    lease::check(&rec.id, rec.lease.as_ref(), nonce, now).map_err(AgentError::from)
}
