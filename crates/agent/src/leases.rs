//! Leases (Fly's exclusive-change tokens, checked by every mutation), cordons and machine
//! metadata.

use crate::agent::Agent;
use crate::error::AgentError;
use crate::record::MachineRecord;
use crate::store::Batch;
use bazaar_types::state::check_transition;
use bazaar_types::{ids, now_ms, rfc3339};
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
        bazaar_types::limits::check_config(&rec.config).map_err(AgentError::Invalid)?;
        bazaar_types::replacement::validate(&rec.config).map_err(AgentError::Invalid)?;
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

/// A new lease (or a refresh keeping `keep_nonce`) of `ttl` seconds (1 s to 1 h). A refresh
/// without a description keeps the lease's own.
pub(crate) fn new_lease(
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
        description: match (keep_nonce, &rec.lease) {
            (Some(_), Some(held)) if description.is_empty() => held.description.clone(),
            _ => description.chars().take(256).collect(),
        },
        version: rec.instance_id.clone(),
    })
}

pub(crate) fn lease_conflict(id: &str, l: &bazaar_types::machine::Lease) -> AgentError {
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
pub(crate) fn check_lease(rec: &MachineRecord, nonce: Option<&str>) -> Result<(), AgentError> {
    match rec
        .lease
        .as_ref()
        .filter(|l| l.expires_at * 1000 > now_ms())
    {
        Some(l) if nonce != Some(l.nonce.as_str()) => Err(lease_conflict(&rec.id, l)),
        _ => Ok(()),
    }
}

pub(crate) fn validate_metadata_key(key: &str) -> Result<(), AgentError> {
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
