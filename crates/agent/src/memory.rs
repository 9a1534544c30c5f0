//! A started machine's memory, changed while it runs (Fly's `/memory` calls, which move a
//! VM's balloon; here the machine's cgroup limit, through [`bazaar_shim::set_memory_limit`]
//! and friends): read the limit and what is free, lower or raise the limit up to the guest
//! size, and reclaim memory. A limit changed here holds until the machine next starts.
//! Functions of the agent's narrow API (the machine's record and state, its driver); the
//! host interface calls them.

use crate::agent::Agent;
use crate::error::AgentError;
use bazaar_shim::ShimError;
use bazaar_types::api::{MemoryResponse, ReclaimMemoryResponse};
use bazaar_types::state::MachineState;

const MIB: u64 = 1 << 20;

/// The run cgroup of started machine `id`, and its guest memory (MiB).
fn memory_cgroup(agent: &Agent, id: &str) -> Result<(String, u64), AgentError> {
    let rec = agent.load_live(id)?;
    let state = agent.current_state(&rec);
    if state != MachineState::Started {
        return Err(AgentError::Conflict(format!(
            "machine {id} is {state}: only a started machine's memory can be read or changed"
        )));
    }
    let guest_mb = crate::operations::validate_config(&rec.config)?.memory_mb;
    let image = rec.config.runs_image();
    let cgroup = agent.driver().machine_cgroup(id, image).ok_or_else(|| {
        AgentError::Conflict(format!(
            "machine {id} has no cgroup on this host (the agent runs without cgroups): \
                     its memory cannot be changed live"
        ))
    })?;
    Ok((cgroup, guest_mb))
}

/// The limit and free memory of started machine `id`.
pub async fn machine_memory(agent: &Agent, id: &str) -> Result<MemoryResponse, AgentError> {
    let (cgroup, guest_mb) = memory_cgroup(agent, id)?;
    let used = tokio::task::spawn_blocking(move || bazaar_shim::memory_use(&cgroup))
        .await?
        .map_err(|e| shim_error(id, e))?;
    let limit_mb = used.limit_bytes.map_or(guest_mb, |b| b / MIB);
    Ok(MemoryResponse {
        limit_mb,
        available_mb: (limit_mb * MIB).saturating_sub(used.working_set_bytes()) / MIB,
    })
}

/// Sets started machine `id`'s memory limit to `limit_mb` (1 to its guest memory).
pub async fn set_machine_memory(
    agent: &Agent,
    id: &str,
    limit_mb: u64,
) -> Result<MemoryResponse, AgentError> {
    let (cgroup, guest_mb) = memory_cgroup(agent, id)?;
    if limit_mb == 0 || limit_mb > guest_mb {
        return Err(AgentError::Invalid(format!(
            "limit_mb {limit_mb}: a machine's memory limit is 1 to its guest memory_mb \
                 ({guest_mb})"
        )));
    }
    tokio::task::spawn_blocking(move || bazaar_shim::set_memory_limit(&cgroup, limit_mb * MIB))
        .await?
        .map_err(|e| shim_error(id, e))?;
    machine_memory(agent, id).await
}

/// Asks the kernel to take back up to `amount_mb` of started machine `id`'s memory.
pub async fn reclaim_machine_memory(
    agent: &Agent,
    id: &str,
    amount_mb: u64,
) -> Result<ReclaimMemoryResponse, AgentError> {
    let (cgroup, _) = memory_cgroup(agent, id)?;
    if amount_mb == 0 {
        return Err(AgentError::Invalid("amount_mb must be at least 1".into()));
    }
    let bytes = amount_mb.saturating_mul(MIB);
    let taken = tokio::task::spawn_blocking(move || bazaar_shim::reclaim_memory(&cgroup, bytes))
        .await?
        .map_err(|e| shim_error(id, e))?;
    Ok(ReclaimMemoryResponse {
        actual_mb: taken / MIB,
    })
}

/// What a failure of the cgroup files means to the caller.
fn shim_error(id: &str, err: ShimError) -> AgentError {
    match err {
        ShimError::NotRunning => AgentError::Conflict(format!("machine {id} is not running")),
        ShimError::NoCgroup => {
            AgentError::Conflict(format!("machine {id} has no memory cgroup on this host"))
        }
        ShimError::Io(_, ref io) if io.kind() == std::io::ErrorKind::ResourceBusy => {
            AgentError::Conflict(format!("machine {id}: {io}"))
        }
        other => AgentError::Internal(other.to_string()),
    }
}
