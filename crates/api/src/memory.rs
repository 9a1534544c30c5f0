//! `/v1/apps/{app}/machines/{id}/memory`: a started machine's memory limit read and changed
//! live, and memory reclaimed (Fly moves a VM's balloon; bazaar the machine's cgroup limit).
//! Forwarded to the machine's owner like every machine call (`machines::forward`),
//! which does the work (`bazaar_agent::memory`).

use crate::machines::forward;
use crate::openapi::{nonce, op, NoBody, RawJson};
use crate::Api;
use aide::axum::routing::{get_with, post_with};
use aide::axum::ApiRouter;
use axum::Json;
use bazaar_types::api::{
    MemoryLimitRequest, MemoryResponse, ReclaimMemoryRequest, ReclaimMemoryResponse,
};

/// What a memory call can answer besides success.
const ERRORS: &[u16] = &[400, 401, 403, 404, 409, 503];

/// The memory routes.
pub(crate) fn routes() -> ApiRouter<Api> {
    ApiRouter::new()
        .api_route(
            "/v1/apps/{app}/machines/{id}/memory",
            get_with(forward::<Json<MemoryResponse>, NoBody>, |t| {
                op(
                    t,
                    "MachinesShowMemory",
                    "machines",
                    "A started machine's memory limit (its guest size's unless changed) and how \
                     much of it is free; 409 when it is not started.",
                    ERRORS,
                )
            })
            .put_with(
                forward::<Json<MemoryResponse>, RawJson<MemoryLimitRequest>>,
                |t| {
                    nonce(op(
                        t,
                        "MachinesUpdateMemory",
                        "machines",
                        "Change a started machine's memory limit live (1 MiB to its guest \
                         `memory_mb`; until it next starts). 409 when the machine uses more than \
                         the new limit and the kernel cannot reclaim it.",
                        ERRORS,
                    ))
                },
            ),
        )
        .api_route(
            "/v1/apps/{app}/machines/{id}/memory/reclaim",
            post_with(
                forward::<Json<ReclaimMemoryResponse>, RawJson<ReclaimMemoryRequest>>,
                |t| {
                    nonce(op(
                        t,
                        "MachinesReclaimMemory",
                        "machines",
                        "Ask the kernel to take back up to `amount_mb` of a started machine's \
                         memory (page cache first); answers how much it took.",
                        ERRORS,
                    ))
                },
            ),
        )
}
