//! The composition root of a node: starts the agent, then the services that ride on it
//! (edge proxy, Machines API with its guardian, certificate renewal, dashboard, the
//! registry on `/v2`) on one
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

/// The registry's routes over the agent's image store (or, on a host that runs no image
/// machines, a store of its own at `DATA/images`); a pushed blob may be as large as an
/// imported archive (`--max-import-bytes`).
pub fn registry_store(
    agent: &bazaar_agent::Agent,
) -> anyhow::Result<(bazaar_image::ImageStore, bazaar_registry::RegistryConfig)> {
    let store = match agent.image_store() {
        Some(store) => store,
        None => bazaar_image::ImageStore::open(
            agent.config().data_dir.join("images"),
            bazaar_image::StoreOptions::default(),
        )?,
    };
    let config = bazaar_registry::RegistryConfig {
        max_blob_bytes: agent.config().max_import_bytes,
        ..bazaar_registry::RegistryConfig::default()
    };
    Ok((store, config))
}

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
            bazaar_api::displaced::spawn(bazaar_api::Api::new(node.clone()));
            bazaar_certs::spawn_renewal(node)?;
            agent.set_image_peers(std::sync::Arc::new(bazaar_registry::peers::NodePeers::new(
                node.clone(),
            )?));
            let (store, config) = registry_store(&agent)?;
            bazaar_registry::retention::spawn(node.clone(), store.clone(), Default::default());
            let registry = bazaar_registry::router(node.clone(), store, config);
            let api = bazaar_api::router(node.clone());
            let ui = bazaar_dashboard::router(node.clone(), api.clone());
            Ok(api.merge(proxy.router()).merge(ui).merge(registry))
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
