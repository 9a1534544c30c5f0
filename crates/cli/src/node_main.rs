//! The composition root of a node: starts the agent, then the services that ride on it
//! (edge proxy, Machines API with its guardian, certificate renewal, dashboard) on one
//! [`NodeHandle`]: the agent's cancellation token and one task tracker that the services'
//! background tasks are spawned through. On shutdown the agent cancels the token and stops;
//! then the tracker is closed and drained, for at most [`DRAIN_BOUND`].

use bazaar_agent::AgentConfig;
use bazaar_node::NodeHandle;
use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

/// Longest the services' tasks are waited for once the agent has stopped.
pub const DRAIN_BOUND: Duration = Duration::from_secs(5);

/// Runs a node with `config` until `shutdown_signal` resolves, then shuts it down.
pub async fn serve(
    config: AgentConfig,
    shutdown_signal: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let node: OnceLock<NodeHandle> = OnceLock::new();
    let outcome = bazaar_agent::run_agent(
        config,
        |agent| {
            let node = node.get_or_init(|| bazaar_agent::node::handle(&agent));
            let proxy = bazaar_proxy::Proxy::start(node.clone())?;
            bazaar_api::guardian::spawn(bazaar_api::Api::new(node.clone()));
            bazaar_api::per_host::spawn(bazaar_api::Api::new(node.clone()));
            bazaar_certs::spawn_renewal(node)?;
            let api = bazaar_api::router(node.clone());
            let ui = bazaar_dashboard::router(node.clone(), api.clone());
            Ok(api.merge(proxy.router()).merge(ui))
        },
        shutdown_signal,
    )
    .await;
    if let Some(node) = node.get() {
        match node.drain(DRAIN_BOUND).await {
            0 => tracing::debug!("the services' tasks have stopped"),
            left => tracing::warn!(
                tasks = left,
                "{left} task(s) of the services still running after {DRAIN_BOUND:?}"
            ),
        }
    }
    outcome
}
