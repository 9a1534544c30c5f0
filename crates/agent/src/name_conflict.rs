//! The machines of an app that lost its name (issue 31, item 7): two hosts that could not
//! hear each other both created an app of one name, each made machines in its own, and
//! once the catalogs met every node names the earlier app the app of the name
//! (`bazaar_catalog`'s `replica::apps`). The other app's machines are not the app's: this
//! host stops those of its own that run (they are unrouted already, and their owner
//! refuses to start them again: `operations::refuse_losing_app`), and leaves them for their
//! organization to destroy. The watcher looks on every catalog change and periodically.

use crate::agent::Agent;
use bazaar_types::host::StopRequest;
use bazaar_types::state::MachineState;
use std::time::Duration;

/// Looks at least this often, whatever the change stream says.
const PERIOD: Duration = Duration::from_secs(2);

/// Starts the watcher of this agent (call once the catalog is attached).
pub fn spawn(agent: &Agent) {
    let agent = agent.clone();
    agent.tracker().clone().spawn(async move {
        let Some(catalog) = agent.catalog().cloned() else {
            return;
        };
        let mut changes = catalog.subscribe();
        let shutdown = agent.shutdown_token();
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = changes.recv() => {}
                () = tokio::time::sleep(PERIOD) => {}
            }
            stop_losers(&agent, &catalog).await;
        }
    });
}

/// Stops this host's running machines of apps that lost their name.
pub async fn stop_losers(agent: &Agent, catalog: &bazaar_catalog::Catalog) {
    let losing = catalog.losing_app_ids();
    if losing.is_empty() {
        return;
    }
    let running: Vec<String> = agent.store().select(|m| {
        (losing.contains(&m.app_id)
            && matches!(m.desired, MachineState::Started | MachineState::Suspended))
        .then(|| m.id.clone())
    });
    for id in running {
        let stop = StopRequest {
            signal: None,
            timeout: None,
        };
        match crate::operations::stop_machine(agent, &id, stop, None).await {
            Ok(_) => tracing::info!(machine.id = %id, "stopped: its app lost its name"),
            Err(err) => {
                tracing::warn!(machine.id = %id, %err, "could not stop a machine whose app lost its name")
            }
        }
    }
}
