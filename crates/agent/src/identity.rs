//! A process machine's own user: when the agent is root and isolates workloads, every
//! process machine runs as a uid (and gid) of its own, `FIRST_UID + n`, allocated when the
//! machine is accepted, recorded with it (a restart or re-adoption keeps it) and unique among
//! the machines of every agent on this kernel ([`crate::uid_claims`]); it owns the machine's work directory and volume. A machine asking
//! for root (`init.user` naming uid 0) is refused unless the operator allows it
//! (`--allow-root-machines`); any other `init.user` only names the machine's own uid inside
//! its sandbox. Agents that are not root run every workload as themselves, as before.
//! The uids are held by the agent's `Addresses`; the agent hands out and gives back a
//! machine's addresses and uid together.

use crate::addresses::Addresses;
use crate::error::AgentError;
use crate::record::MachineRecord;
use crate::sync::lock;

/// The first uid handed to machines (above the usual subordinate-id ranges of users).
pub const FIRST_UID: u32 = 200_000;
/// How many machine uids a host can hand out.
const UID_COUNT: u32 = 65_536;

pub use bazaar_runtime::driver::is_root_user;

/// Checks `init.user` and gives a process machine its uid (kept once it has one), from
/// `addresses`' uids. `machine_users`: process machines run sandboxed, each as its own uid
/// (an isolating agent); `allow_root`: the operator allows machines that ask for root.
pub(crate) fn assign_user(
    addresses: &Addresses,
    rec: &mut MachineRecord,
    machine_users: bool,
    allow_root: bool,
) -> Result<(), AgentError> {
    if rec.config.runs_image() {
        return Ok(());
    }
    let user = rec.config.init.as_ref().and_then(|i| i.user.as_deref());
    let root = rustix::process::geteuid().is_root();
    if root && user.is_some_and(is_root_user) && !allow_root {
        return Err(AgentError::Invalid(
            "config.init.user: process machines may not run as root on this host \
             (the agent needs --allow-root-machines)"
                .into(),
        ));
    }
    if !machine_users || rec.uid.is_some() {
        return Ok(());
    }
    let mut used = lock(&addresses.uids);
    let range = FIRST_UID..FIRST_UID + UID_COUNT;
    let uid = match &addresses.uid_claims {
        // Other agents on this kernel hand out uids too: only one nobody claimed.
        Some(claims) => claims
            .claim_free(&used, range)
            .map_err(|e| AgentError::Internal(format!("claiming a machine uid: {e}")))?,
        None => range.into_iter().find(|uid| !used.contains(uid)),
    }
    .ok_or_else(|| AgentError::Capacity("no machine uid left on this host".into()))?;
    used.insert(uid);
    rec.uid = Some(uid);
    Ok(())
}

/// Gives a destroyed (or refused) machine's uid back to `addresses`.
pub(crate) fn release_user(addresses: &Addresses, rec: &MachineRecord) {
    if let Some(uid) = rec.uid {
        let mut used = lock(&addresses.uids);
        used.remove(&uid);
        if let Some(claims) = &addresses.uid_claims {
            claims.release(uid, &used);
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
