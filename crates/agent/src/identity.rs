//! A process machine's own user: when the agent is root and isolates workloads, every
//! process machine runs as a uid (and gid) of its own, `FIRST_UID + n`, allocated when the
//! machine is accepted, recorded with it (a restart or re-adoption keeps it) and unique among
//! the machines of every agent on this kernel ([`crate::uid_claims`]); it owns the machine's work directory and volume. A machine asking
//! for root (`init.user` naming uid 0) is refused unless the operator allows it
//! (`--allow-root-machines`); any other `init.user` only names the machine's own uid inside
//! its sandbox. Agents that are not root run every workload as themselves, as before.
//! Here too: the agent's wrappers that hand out and give back a machine's addresses and uid
//! together ([`crate::addresses`]).

use crate::agent::Agent;
use crate::error::AgentError;
use crate::record::MachineRecord;
use crate::sync::lock;

/// The first uid handed to machines (above the usual subordinate-id ranges of users).
pub const FIRST_UID: u32 = 200_000;
/// How many machine uids a host can hand out.
const UID_COUNT: u32 = 65_536;

pub use bazaar_runtime::driver::is_root_user;

impl Agent {
    /// Whether process machines run sandboxed, each as its own uid.
    pub(crate) fn machine_users(&self) -> bool {
        self.0.driver.isolate
    }

    /// Checks `init.user` and gives a process machine its uid (kept once it has one).
    pub(crate) fn assign_user(&self, rec: &mut MachineRecord) -> Result<(), AgentError> {
        if rec.config.runs_image() {
            return Ok(());
        }
        let user = rec.config.init.as_ref().and_then(|i| i.user.as_deref());
        let root = rustix::process::geteuid().is_root();
        if root && user.is_some_and(is_root_user) && !self.0.config.allow_root_machines {
            return Err(AgentError::Invalid(
                "config.init.user: process machines may not run as root on this host \
                 (the agent needs --allow-root-machines)"
                    .into(),
            ));
        }
        if !self.machine_users() || rec.uid.is_some() {
            return Ok(());
        }
        let mut used = lock(&self.0.addresses.uids);
        let range = FIRST_UID..FIRST_UID + UID_COUNT;
        let uid = match &self.0.addresses.uid_claims {
            // Other agents on this kernel hand out uids too: only one nobody claimed.
            Some(claims) => claims
                .claim_free(&rec.id, &used, range)
                .map_err(|e| AgentError::Internal(format!("claiming a machine uid: {e}")))?,
            None => range.into_iter().find(|uid| !used.contains(uid)),
        }
        .ok_or_else(|| AgentError::Capacity("no machine uid left on this host".into()))?;
        used.insert(uid);
        rec.uid = Some(uid);
        Ok(())
    }

    /// Gives a machine where its services are reached ([`crate::addresses::Addresses::assign`]).
    pub(crate) fn assign_ports(&self, rec: &mut MachineRecord) -> Result<(), AgentError> {
        self.0.addresses.assign(&self.0.driver, rec)
    }

    /// Gives back what [`Agent::assign_ports`] and [`Agent::assign_user`] handed out.
    pub(crate) fn release_ports(&self, rec: &MachineRecord) {
        self.release_user(rec);
        self.0.addresses.release(&self.0.driver, rec);
    }

    /// Gives a destroyed (or refused) machine's uid back.
    pub(crate) fn release_user(&self, rec: &MachineRecord) {
        if let Some(uid) = rec.uid {
            lock(&self.0.addresses.uids).remove(&uid);
            if let Some(claims) = &self.0.addresses.uid_claims {
                claims.release(uid, &rec.id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_is_recognised_by_name_and_number() {
        for user in ["root", "0", "0:0", "root:staff", "00"] {
            assert!(is_root_user(user), "{user}");
        }
        for user in ["nobody", "1000", "65534:0", "www-data"] {
            assert!(!is_root_user(user), "{user}");
        }
    }
}
