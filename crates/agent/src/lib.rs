//! The bazaar host agent (Fly's flyd): the only source of truth for the machines on its
//! host. It keeps them in an embedded durable store, runs every operation on them as a
//! durable sequence of idempotent steps, supervises each workload through a per-machine
//! shim that outlives the agent, enforces restart policies, and answers the market: bids,
//! reservations and claims.
//!
//! Layout:
//! - [`agent`]: shared state, start-up, the accept side of operations, catalog publishing.
//! - [`addresses`]: host ports and machine-network addresses, handed out and given back.
//! - [`market`]: bids, reservations, claims and creates (the host's side of the market).
//! - [`leases`]: leases, cordons and metadata.
//! - [`publish`]: this host's rows in the catalog (host record, machines) and the live state
//!   `wait` watches.
//! - [`views`]: reads of machines (the API view, lists, events, versions, logs, `wait`).
//! - [`actor`]: one task per machine that executes its operations step by step.
//! - [`record`]: what is persisted (machine records, operations, steps).
//! - [`store`]: the redb store.
//! - [`driver`], [`oci`], [`network`], [`netlink`], [`idranges`], [`volume_fs`], [`exec`]:
//!   the host plumbing, re-exported from `bazaar-runtime` (the driver of process and image
//!   machines, their network, volumes' storage, exec). The actors reach machines only
//!   through its [`bazaar_runtime::MachineDriver`] (`Inner::machine_driver`).
//! - [`restart`]: the restart policy.
//! - [`http`]: the host interface (`/host/v1`).
//! - [`cluster_security`]: the gossip keyring and the CA's revocations on this host.
//! - [`host_tls`]: this host's cluster certificate (join, renewal) and the host listener
//!   (the host interface over mTLS).
//! - [`api_tls`]: HTTPS on the API port (`--api-tls`), with a certificate of the cluster CA
//!   or one given.
//! - [`exec`]: running a command inside a machine; [`ps`]: its processes.
//! - [`images`]: this host's images over the host interface (list, pull with progress,
//!   import, prune) and their background pruning.
//! - [`standby`]: starts stopped standbys when their primary's host is declared dead.
//! - [`volumes`]: volumes owned by this host (records, placement checks, attachment), on
//!   storage from [`volume_fs`] (ext4 images on loop devices, or directories);
//!   [`snapshots`]: their snapshots, restores and forks; [`volume_record`]: what is stored
//!   of one.
//! - [`metrics`]: operations, steps, store commits and machines by state, with the
//!   catalog's, as Prometheus text (served at `/metrics` with the proxy's).
//! - [`checks`]: service health checks of this host's machines (results go in the catalog).
//! - [`cleanup`]: what a host made on the machine outside its store (mounts, loop devices,
//!   network, cgroups, shims), found from its data dir and removed (`bazaar host reset`,
//!   `bazaar dev` on Ctrl-C, leftovers of a killed agent at start).
//! - [`config`], [`secrets`], [`tokens`] (who calls the API), [`audit`] (what they changed),
//!   [`fault`], [`error`].
//! - [`node`]: the agent as the `bazaar_node::Node` the API, proxy, certificates and
//!   dashboard use.
//! - [`app_secrets`]: apps' secrets, sealed in the catalog, opened into a workload's env at
//!   each start.
//!
//! Entry point: [`run_agent`].

pub mod actor;
pub mod addresses;
pub mod agent;
pub mod api_tls;
pub mod app_secrets;
pub mod audit;
pub mod checks;
pub mod cleanup;
pub mod cluster_security;
pub mod config;
pub mod dns;
pub mod error;
pub mod fault;
pub mod fence;
pub mod host_tls;
pub mod http;
pub mod identity;
pub mod images;
pub mod leases;
pub mod ledger_dump;
pub mod market;
pub mod mesh;
pub mod metrics;
pub mod node;
pub mod ps;
pub mod publish;
pub mod record;
pub mod restart;
pub mod schedule;
pub mod secrets;
pub mod snapshots;
pub mod standby;
pub mod store;
pub mod tokens;
pub mod views;
pub mod volume_record;
pub mod volumes;

// The host plumbing lives in `bazaar-runtime`; its modules keep their old paths here.
pub use bazaar_runtime::{driver, exec, idranges, netlink, network, oci, volume_fs};

pub use agent::Agent;
pub use config::AgentConfig;

use anyhow::Context;
use std::future::Future;

/// Runs an agent until `shutdown_signal` completes: binds the listener, starts the catalog
/// (writing `data_dir/gossip.addr`), writes `data_dir/api.addr`, serves the host interface
/// plus `extra_routes` (the Machines API, `/metrics`), then leaves the cluster and shuts down
/// cleanly. `extra_routes` runs once the catalog is attached and may start services of its
/// own (the edge proxy); an error from it stops the agent from starting.
pub async fn run_agent(
    config: AgentConfig,
    extra_routes: impl FnOnce(Agent) -> anyhow::Result<axum::Router>,
    shutdown_signal: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    raise_fd_limit();
    let listener = tokio::net::TcpListener::bind(config.api_listen)
        .await
        .with_context(|| format!("binding the API listener on {}", config.api_listen))?;
    let addr = listener.local_addr()?;
    let mut config = config;
    config.api_listen = addr;
    let agent = Agent::start(config.clone()).await?;
    let host_tls = host_tls::HostTls::establish(&config, agent.host_id())
        .await
        .context("the host's cluster certificate")?;
    let mut catalog_config = bazaar_catalog::CatalogConfig::new(
        agent.host_id(),
        &config.region,
        config.gossip_listen,
        agent.cluster_secret(),
    );
    catalog_config.signing_key = secrets::host_signing_key(&config.data_dir)?;
    catalog_config.gossip_keys = cluster_security::load_gossip_keys(&config.data_dir)?;
    if let Some(tls) = &host_tls {
        let row_key = catalog_config.signing_key.verifying_key().to_bytes();
        catalog_config.cluster = Some(bazaar_catalog::ClusterIdentity {
            identity: tls.identity.clone(),
            ca_pem: tls.ca_pem.clone(),
            key_endorsement: tls
                .row_key_endorsement(&config.data_dir, row_key)
                .await
                .context("the CA's endorsement of this host's catalog key")?,
            revocations: cluster_security::load_revocations(&config.data_dir)?
                .into_iter()
                .chain(tls.ca_revocations())
                .collect(),
        });
    }
    catalog_config.seeds = config.join.clone();
    catalog_config.dead_after = config.dead_after;
    catalog_config.probe_period =
        (config.dead_after / 8).max(std::time::Duration::from_millis(100));
    let catalog = bazaar_catalog::Catalog::start(catalog_config)
        .await
        .with_context(|| format!("starting the catalog on {}", config.gossip_listen))?;
    secrets::write_private(
        &config.data_dir.join("gossip.addr"),
        &catalog.local_addr().to_string(),
    )?;
    agent.attach_catalog(catalog.clone()).await;
    cluster_security::spawn_keeper(&agent, catalog.clone());
    dns::spawn(&agent).await;
    mesh::spawn(&agent).await;
    standby::spawn(&agent);
    fence::spawn(&agent);
    images::spawn_pruning(&agent);
    // The host listener is bound and the link to other hosts known before the services
    // beside the API start (the proxy hops over it); it serves once the router is built.
    let host_listener = match &host_tls {
        Some(tls) => {
            let listener = tokio::net::TcpListener::bind(config.host_listen)
                .await
                .with_context(|| format!("binding the host listener on {}", config.host_listen))?;
            let host_addr = listener.local_addr()?;
            agent
                .set_host_link(tls.link(host_addr, catalog.clone())?)
                .await;
            Some((tls, listener, host_addr))
        }
        None => None,
    };
    // Services beside the API (the edge proxy) start here, before `api.addr` announces
    // that the agent is up.
    let extra = extra_routes(agent.clone())?;
    let stop = agent.0.shutdown.clone();
    let app = http::router(agent.clone())
        .merge(extra)
        .layer(axum::middleware::map_response(
            http::fly_shaped_method_errors,
        ));
    if let Some((tls, listener, host_addr)) = host_listener {
        // The same interfaces, to other hosts, over mTLS.
        tls.serve(&agent, listener, tls.router(app.clone()))?;
        tls.spawn_renewal(&agent, config.data_dir.clone());
        secrets::write_private(&config.data_dir.join("host.addr"), &host_addr.to_string())?;
    }
    let api_tls = api_tls::ApiTls::establish(&config, &agent, host_tls.as_ref())
        .await
        .context("the API's certificate (--api-tls)")?;
    secrets::write_private(&config.data_dir.join("api.addr"), &addr.to_string())?;
    tracing::info!(api.addr = %addr, api.tls = api_tls.is_some(), host.id = agent.host_id(), region = %config.region, "listening");
    let server = match &api_tls {
        Some(tls) => tls.serve(&agent, listener, app),
        None => {
            let server = axum::serve(
                listener,
                // The peer's address, for the audit record.
                app.into_make_service_with_connect_info::<std::net::SocketAddr>(),
            )
            .with_graceful_shutdown(async move { stop.cancelled().await });
            tokio::spawn(async move { server.await })
        }
    };
    shutdown_signal.await;
    tracing::info!("shutting down");
    // Leave first, so other hosts stop routing here at once.
    catalog.leave().await;
    agent.shutdown().await;
    match tokio::time::timeout(std::time::Duration::from_secs(5), server).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(err))) => tracing::warn!(error = %err, "server error"),
        Ok(Err(err)) => tracing::warn!(error = %err, "server task"),
        Err(_) => tracing::warn!("server did not stop within 5 s"),
    }
    Ok(())
}

/// Each supervised machine holds a few pidfds; lift the soft limit on open files to the hard
/// limit so a host with thousands of machines does not run out.
fn raise_fd_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        limit.current = limit.maximum;
        if let Err(err) = setrlimit(Resource::Nofile, limit) {
            tracing::warn!(error = %err, "raising the open-file limit");
        }
    }
}
