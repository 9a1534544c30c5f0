//! Fencing: the old host's side of a machine claimed again elsewhere. Two deciders do that:
//! - the guardian (`bazaar_api::guardian`) re-places a machine that opted in
//!   (`bazaar_types::replacement`) while its host is dead;
//! - the exchange claims a machine on the next offer when its claim on this host got no
//!   answer (this host died or the connection broke mid-claim), which may have made it here.
//!
//! Either way the new copy carries a higher ownership epoch, and of two hosts' rows for one
//! machine id the catalog's [`bazaar_catalog::MachineRecord::precedence`] picks the machine
//! on every node alike. When this host sees one of its machines superseded:
//! - it never launches its copy again: the `Launch` step asks `superseded_by` first and
//!   fails the launch instead (after a crash, for a machine that opted in, that check waits
//!   until the catalog has caught up with a peer, ≤ 3 s, so the host learns of the
//!   re-placement before it would relaunch);
//! - it destroys its copy ([`spawn`] watches the catalog), whose rows, published with the
//!   old epoch, never win over the new host's: every list shows the machine once.

use crate::agent::Agent;
use bazaar_types::config::MachineConfig;
use bazaar_types::replacement::opted_in;
use bazaar_types::state::MachineState;
use std::collections::HashSet;
use std::time::Duration;

/// How often the watcher looks (a copy that must not run is already kept from launching by
/// `superseded_by`; destroying it can wait this long).
const PERIOD: Duration = Duration::from_millis(500);
/// Longest a launch waits for the catalog to be attached and caught up.
const CATCH_UP_WAIT: Duration = Duration::from_secs(5);

/// The host that holds machine `id` now, if it is not this one: another host's row
/// supersedes this host's. Only for a machine that opted in to re-placement is it worth
/// waiting for a catalog that is catching up (the guardian moves those while this host is
/// dead); any other moves only if its claim here went unanswered, which a lookup sees once
/// the catalog has it (and the watcher fences it if the launch came first).
pub(crate) async fn superseded_by(
    agent: &Agent,
    id: &str,
    config: &MachineConfig,
    epoch: u64,
) -> Option<String> {
    if !can_move(config) {
        return None;
    }
    // Only an opted-in machine is worth waiting for a catalog that is catching up.
    let deadline = tokio::time::Instant::now()
        + if opted_in(&config.metadata) {
            CATCH_UP_WAIT
        } else {
            Duration::ZERO
        };
    let catalog = loop {
        match agent.catalog() {
            Some(c) if !c.catching_up() => break c,
            Some(c) if tokio::time::Instant::now() >= deadline => break c,
            None if tokio::time::Instant::now() >= deadline => return None,
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    let current = catalog.machine(id)?;
    // A row of a lower epoch is the claim this copy supersedes (a displaced machine's old
    // host, a dead host), not one that supersedes it.
    superseded(
        agent.host_id(),
        epoch,
        &current.record.host_id,
        current.record.epoch,
    )
    .then_some(current.record.host_id)
}

/// Whether a machine can have been claimed on another host: not if it mounts a volume
/// (its claims go only to the volume's host, and a row of another host must never make
/// this one destroy a machine that holds state).
fn can_move(config: &MachineConfig) -> bool {
    config.mounts.is_empty()
}

/// Starts the watcher that destroys this host's copies of machines re-placed elsewhere
/// (call once the catalog is attached).
pub fn spawn(agent: &Agent) {
    let agent = agent.clone();
    agent.tracker().clone().spawn(async move {
        let Some(catalog) = agent.catalog().cloned() else {
            return;
        };
        let shutdown = agent.shutdown_token();
        // Copies (id, epoch) whose destroy was accepted: not asked again. By epoch: a
        // machine may come back here as a new copy (a displaced machine moved back and
        // forth) and be superseded again.
        let mut fenced: HashSet<(String, u64)> = HashSet::new();
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(PERIOD) => {}
            }
            fence(&agent, &catalog, &mut fenced).await;
        }
    });
}

async fn fence(
    agent: &Agent,
    catalog: &bazaar_catalog::Catalog,
    fenced: &mut HashSet<(String, u64)>,
) {
    let mine: Vec<(String, u64)> = agent.store().select(|m| {
        (m.state != MachineState::Destroyed && can_move(&m.config)).then(|| (m.id.clone(), m.epoch))
    });
    fenced.retain(|copy| mine.contains(copy));
    for (id, epoch) in mine {
        if fenced.contains(&(id.clone(), epoch)) {
            continue;
        }
        let Some(current) = catalog.machine(&id) else {
            continue;
        };
        if !superseded(
            agent.host_id(),
            epoch,
            &current.record.host_id,
            current.record.epoch,
        ) {
            continue;
        }
        match crate::operations::destroy_moved(agent, &id).await {
            Ok(_) => {
                tracing::info!(
                    machine.id = %id, epoch, host = %current.record.host_id,
                    new_epoch = current.record.epoch,
                    "fence: machine claimed again on another host, destroying this copy"
                );
                fenced.insert((id, epoch));
            }
            Err(err) => {
                tracing::warn!(machine.id = %id, error = %err, "fence: could not destroy the superseded copy")
            }
        }
    }
}

/// Whether this host's copy of a machine (at `epoch`) has been claimed again elsewhere: the
/// catalog's row is another host's, of this epoch or a later one (at the same epoch the
/// catalog's rule between two hosts' rows chose the other). A row of a lower epoch is an
/// older claim that this node's catalog still shows because this copy's own row has not
/// spread yet (a copy just placed here sees the dead host's row for a moment): never a
/// reason to destroy this copy.
fn superseded(me: &str, epoch: u64, row_host: &str, row_epoch: u64) -> bool {
    row_host != me && row_epoch >= epoch
}

#[cfg(test)]
mod tests {
    use super::superseded;

    #[test]
    fn a_copy_is_fenced_only_by_another_hosts_claim_of_its_epoch_or_later() {
        // The old host's copy, once the new claim's row arrives.
        assert!(superseded("old", 0, "new", 1));
        // The new copy, while its node still shows the dead host's row (the race seen in
        // CI: the fresh copy destroyed itself).
        assert!(!superseded("new", 1, "old", 0));
        // Its own row; at the same epoch, the row the catalog chose.
        assert!(!superseded("new", 1, "new", 1));
        assert!(superseded("a", 1, "b", 1));
    }
}
