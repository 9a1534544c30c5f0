//! Start-up and shutdown, above every other module: [`run_agent`] wires the agent, its
//! catalog, the host listener and the services beside it; [`start`] opens the store,
//! assembles the agent's parts (`Agent::assemble`), re-adopts running workloads, resumes
//! unfinished operations on their actors and starts the agent's loops (housekeeping,
//! snapshot pruning, health checks); [`shutdown`] stops them.

use crate::actor::spawn_actor;
use crate::agent::{Agent, Seams, Stored};
use crate::checks::Checker;
use crate::config::AgentConfig;
use crate::record::Operation;
use crate::store::{Batch, Store};
use crate::{
    api_tls, cluster_security, connections, dns, fence, host_tls, http, images, mesh,
    name_conflict, secrets, standby,
};
use anyhow::Context;
use bazaar_node::listen::{spawn_accept_loop, Admission};
use bazaar_runtime::MachineDriver;
use bazaar_types::event::MachineEvent;
use bazaar_types::ids;
use bazaar_types::state::MachineState;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
/// A root agent that does not isolate runs its process machines as root: no other user
/// reaches their work directories in the private (0700) data dir, and nothing confines
/// them. That is the operator's call (`--allow-root-machines`, like Nomad's `raw_exec`),
/// not a side effect of `--no-isolate`.
fn refuse_root_without_isolation(config: &AgentConfig) -> anyhow::Result<()> {
    if rustix::process::geteuid().is_root() && !config.isolate && !config.allow_root_machines {
        anyhow::bail!(
            "--no-isolate on a root agent runs process machines as root, unconfined: \
             say so with --allow-root-machines as well (or run the agent as another user)"
        );
    }
    Ok(())
}

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
    refuse_root_without_isolation(&config)?;
    let listener = tokio::net::TcpListener::bind(config.api_listen)
        .await
        .with_context(|| format!("binding the API listener on {}", config.api_listen))?;
    let addr = listener.local_addr()?;
    let mut config = config;
    config.api_listen = addr;
    let agent = start(config.clone()).await?;
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
    // Apps, app secrets, quotas and certificates this host created live in no store:
    // kept here, they outlive a restart of the whole cluster (`bazaar_catalog::own_rows`).
    catalog_config.own_rows_dir = Some(config.data_dir.join(bazaar_catalog::own_rows::DIR_NAME));
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
    crate::publish::attach_catalog(&agent, catalog.clone()).await;
    cluster_security::spawn_keeper(&agent, catalog.clone());
    dns::spawn(&agent).await;
    mesh::spawn(&agent).await;
    standby::spawn(&agent);
    name_conflict::spawn(&agent);
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
            crate::publish::set_host_link(&agent, tls.link(host_addr, catalog.clone())?).await;
            Some((tls, listener, host_addr))
        }
        None => None,
    };
    // Services beside the API (the edge proxy) start here, before `api.addr` announces
    // that the agent is up.
    let extra = extra_routes(agent.clone())?;
    let stop = agent.shutdown_token();
    let app = http::router(agent.clone())
        .merge(extra)
        .layer(axum::middleware::map_response(http::fly_shaped_errors))
        .layer(axum::middleware::from_fn_with_state(
            agent.clone(),
            trust_callers,
        ));
    // One count of connections for the API port and the host listener: they share the
    // process's file descriptors.
    let limits = connections::limits(&config);
    let admission = Admission::new(limits);
    tracing::debug!(?limits, "connection limits");
    if let Some((tls, listener, host_addr)) = host_listener {
        // The same interfaces, to other hosts, over mTLS.
        tls.serve(
            agent.shutdown_token(),
            agent.tracker(),
            agent.catalog().cloned(),
            listener,
            admission.clone(),
            tls.router(app.clone()),
        )?;
        tls.spawn_renewal(
            agent.shutdown_token(),
            agent.tracker(),
            config.data_dir.clone(),
        );
        secrets::write_private(&config.data_dir.join("host.addr"), &host_addr.to_string())?;
    }
    let api_tls = api_tls::ApiTls::establish(&config, &agent, host_tls.as_ref())
        .await
        .context("the API's certificate (--api-tls)")?;
    secrets::write_private(&config.data_dir.join("api.addr"), &addr.to_string())?;
    tracing::info!(api.addr = %addr, api.tls = api_tls.is_some(), host.id = agent.host_id(), region = %config.region, "listening");
    give_back_start_up_heap(&agent);
    let server = match &api_tls {
        Some(tls) => tls.serve(&agent, listener, admission, app),
        None => spawn_accept_loop(
            "API",
            listener,
            admission,
            stop,
            agent.tracker(),
            move |stream, peer, conn| {
                connections::serve(stream, peer, conn, app.clone(), limits, |_| {})
            },
        ),
    };
    shutdown_signal.await;
    tracing::info!("shutting down");
    // Leave first, so other hosts stop routing here at once.
    catalog.leave().await;
    shutdown(&agent).await;
    match tokio::time::timeout(std::time::Duration::from_secs(5), server).await {
        Ok(Ok(())) => {}
        Ok(Err(err)) => tracing::warn!(error = %err, "server task"),
        Err(_) => tracing::warn!("server did not stop within 5 s"),
    }
    Ok(())
}

/// Trusts the connection of a request whose bearer token the agent accepts (the cluster
/// secret on the host interface, a token-file token, a scoped token): from then on it is
/// never evicted for a newer connection (`bazaar_node::listen`).
async fn trust_callers(
    axum::extract::State(agent): axum::extract::State<Agent>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    if let Some(connections::Connection(conn)) = req.extensions().get() {
        if !conn.is_trusted()
            && presented_token(&req)
                .is_some_and(|t| agent.is_cluster_secret(&t) || agent.caller(&t).is_ok())
        {
            conn.trust();
        }
    }
    next.run(req).await
}

/// The token of a request: a bearer token, or the password of `Basic` credentials (how
/// registry clients such as buildah send a token to the registry on `/v2`).
fn presented_token(req: &axum::extract::Request) -> Option<String> {
    use base64::Engine as _;
    if let Some(t) = bazaar_node::access::bearer(req) {
        return Some(t.to_string());
    }
    let value = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let encoded = value.strip_prefix("Basic ")?.trim();
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()?;
    let decoded = String::from_utf8(decoded).ok()?;
    let (_, password) = decoded.split_once(':')?;
    Some(password.to_string())
}

/// Each supervised machine holds a few pidfds; lift the soft limit on open files to the hard
/// limit so a host with thousands of machines does not run out. The API port and the host
/// listener then take at most half of it (`connections::limits`).
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

/// Opens the store, restores the ledger, re-adopts running workloads and resumes every
/// unfinished operation.
pub async fn start(config: AgentConfig) -> anyhow::Result<Agent> {
    start_with_driver(config, None).await
}

/// [`start`] whose actors run machines with `machine_driver` (tests: a fake
/// driver) instead of this host's shims and runc (`None`).
pub async fn start_with_driver(
    config: AgentConfig,
    machine_driver: Option<Arc<dyn MachineDriver>>,
) -> anyhow::Result<Agent> {
    let seams = Seams {
        driver: machine_driver,
        ..Seams::default()
    };
    start_in_process(config, seams).await
}

/// [`start`] with `seams` in place of the host's driver, clock or crash point
/// (in-process tests: a fake driver, tokio's paused clock, a crash at a step).
pub async fn start_in_process(config: AgentConfig, seams: Seams) -> anyhow::Result<Agent> {
    std::fs::create_dir_all(&config.data_dir)?;
    // Machines' environments, specs and volumes are in here: the agent's user only.
    {
        use std::os::unix::fs::PermissionsExt;
        let private = std::fs::Permissions::from_mode(0o700);
        std::fs::set_permissions(&config.data_dir, private)?;
    }
    let store = Store::open(&config.data_dir.join("agent.redb"))?;
    let host_id = match store.meta("host_id")? {
        Some(id) => id,
        None => {
            let id = ids::new_host_id();
            let mut b = Batch::default();
            b.meta("host_id", &id);
            store.write(&b)?;
            id
        }
    };
    // With a mesh, the machine network is this host's prefix of the private range.
    let config = crate::mesh::with_host_prefix(config, &host_id)?;
    let (agent, Stored { machines, ops }) = Agent::assemble(config, store, host_id, seams)?;
    // Volumes first: machines that mount them may launch right after.
    crate::volumes::recover_volumes(&agent).await;
    let mut ops_by_machine: HashMap<String, Vec<Operation>> = HashMap::new();
    for op in ops {
        ops_by_machine
            .entry(op.machine_id.clone())
            .or_default()
            .push(op);
    }
    let num_machines = machines.len();
    let mut num_adopted = 0;
    let mut actors = Vec::new();
    for m in machines {
        if m.state == MachineState::Destroyed {
            continue;
        }
        let ops = ops_by_machine.remove(&m.id).unwrap_or_default();
        agent.publish(&m);
        // Re-adopt the live run now, so that serving means every workload is back
        // under supervision.
        let run = m
            .run
            .filter(|r| r.run_id > m.exit_handled_run)
            .and_then(|r| match agent.machine_driver().adopt(&m.id, r.run_id) {
                Ok(h) => h,
                Err(err) => {
                    tracing::warn!(machine.id = %m.id, error = %err, "re-adopting run");
                    None
                }
            });
        num_adopted += run.is_some() as usize;
        actors.push((m, ops, run));
    }
    // What an earlier run left mounted for machines that no longer run goes before any
    // of them launches again.
    let running: HashSet<String> = actors
        .iter()
        .filter(|(_, _, run)| run.is_some())
        .map(|(m, _, _)| m.id.clone())
        .collect();
    crate::cleanup::unmount_stale_roots(&agent.config().data_dir, &running);
    for (m, ops, run) in actors {
        spawn_actor(&agent, m, ops, run);
    }
    spawn_housekeeping(&agent);
    crate::snapshots::spawn_snapshot_pruning(&agent);
    spawn_checks(&agent);
    spawn_machine_metrics(&agent);
    crate::reclaim::spawn(&agent);
    tracing::info!(
        host.id = %agent.host_id(),
        num_machines,
        num_adopted,
        isolate = agent.driver().isolate,
        cgroups = agent.driver().cgroups,
        "agent started"
    );
    Ok(agent)
}

/// Stops the agent: operations in flight are interrupted (they resume on the next start)
/// and, if configured, every workload is stopped as a host shutdown.
pub async fn shutdown(agent: &Agent) {
    agent.stop_tasks().await;
    if agent.config().stop_machines_on_shutdown {
        crate::actor::stop_all_for_host_shutdown(agent).await;
    }
}

fn spawn_housekeeping(agent: &Agent) {
    let shutdown = agent.shutdown_token();
    let looping = agent.clone();
    agent.tracker().spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = tick.tick() => housekeeping(&looping).await,
            }
        }
    });
}

/// Refreshes the revoked tokens, expires unclaimed reservations, collects old
/// tombstones, republishes the host record, puts this host's catalog rows back in line
/// with its store, starts scheduled machines that are due, reports full disks.
async fn housekeeping(agent: &Agent) {
    agent.refresh_revocations();
    crate::publish::publish_host(agent).await;
    crate::publish::reconcile_catalog(agent);
    let now = agent.now_ms();
    crate::schedule::start_due(agent, now).await;
    watch_disks(agent).await;
    {
        let mut ledger = agent.write_lock().await;
        // Claimed reservations are kept a minute past expiry to answer repeated claims.
        let expired = ledger.expire(now, 60_000);
        let stale: Vec<String> = agent
            .store()
            .reservations()
            .unwrap_or_default()
            .into_iter()
            .filter(|r| ledger.reservation(&r.id).is_none())
            .map(|r| r.id)
            .collect();
        if !expired.is_empty() || !stale.is_empty() {
            let mut b = Batch::default();
            for id in expired.iter().chain(stale.iter()) {
                b.delete_reservation(id);
            }
            if let Err(err) = agent.commit(b).await {
                tracing::warn!(error = %err, "deleting expired reservations");
            }
            if !expired.is_empty() {
                tracing::debug!(num = expired.len(), "reservations expired");
            }
        }
    }
    let ttl = agent.config().tombstone_ttl.as_millis() as u64;
    let old: Vec<String> = agent.store().select(|m| {
        m.destroyed_at_ms
            .is_some_and(|t| now.saturating_sub(t) >= ttl)
            .then(|| m.id.clone())
    });
    if !old.is_empty() {
        let _guard = agent.write_lock().await;
        let mut b = Batch::default();
        for id in &old {
            b.purge_machine(id);
        }
        if agent.commit(b).await.is_ok() {
            agent.forget_live(&old);
        }
    }
}

/// Records a `disk_full` event, with a log line, for each started machine whose disk
/// has just become full (`disk_watch.rs`), every few seconds.
async fn watch_disks(agent: &Agent) {
    if !agent.full_disks().due(std::time::Instant::now()) {
        return;
    }
    let started: Vec<String> = agent
        .store()
        .select(|m| (m.state == MachineState::Started).then(|| m.id.clone()));
    // A machine's next run is told of its full disk again.
    let running: HashSet<&str> = started.iter().map(String::as_str).collect();
    agent.full_disks().retain(|id| running.contains(id));
    let driver = agent.machine_driver().clone();
    let Ok(seen) = tokio::task::spawn_blocking(move || {
        started
            .into_iter()
            .map(|id| {
                let full = driver.disk_full(&id);
                (id, full)
            })
            .collect::<Vec<_>>()
    })
    .await
    else {
        return;
    };
    for (id, full) in seen {
        if !agent.full_disks().saw(&id, full.is_some()) {
            continue;
        }
        let reason = full.unwrap_or_default();
        tracing::warn!(machine.id = %id, %reason, "a machine's disk is full");
        let _ledger = agent.write_lock().await;
        let Ok(Some(mut rec)) = agent.store().machine(&id) else {
            continue;
        };
        let mut b = Batch::default();
        b.event(
            &mut rec,
            MachineEvent::new("disk_full", "started", "flyd").with_reason(reason),
        );
        b.machine(&rec);
        if let Err(err) = agent.commit(b).await {
            tracing::warn!(machine.id = %id, error = %err, "recording a full disk");
        }
    }
}

/// Starts the agent's check loop: health checks of this host's started machines, their
/// results kept in the agent and a machine's row republished when a status changes.
fn spawn_checks(agent: &Agent) {
    let agent = agent.clone();
    let shutdown = agent.shutdown_token();
    agent.tracker().clone().spawn(async move {
        let (mut checker, mut results) = Checker::new();
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = tick.tick() => {
                    if let Some(catalog) = agent.catalog() {
                        let tasks = (agent.tracker(), &shutdown);
                        checker.schedule(catalog, agent.host_id(), agent.checks(), tasks);
                    }
                }
                Some(result) = results.recv() => {
                    let id = result.0.clone();
                    if checker.record(agent.checks(), result) {
                        republish(&agent, id).await;
                    }
                }
            }
        }
    });
}

/// Starts the agent's scrape loop: the metrics pages of this host's started machines that
/// have `config.metrics` (`machine_metrics.rs`), on their own address, else on loopback.
fn spawn_machine_metrics(agent: &Agent) {
    let agent = agent.clone();
    let shutdown = agent.shutdown_token();
    agent.tracker().clone().spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = tick.tick() => {}
            }
            let targets = agent.store().select(|r| {
                let metrics = r.config.metrics.as_ref()?;
                let ip = r.private_ip.unwrap_or(std::net::Ipv4Addr::LOCALHOST);
                (r.state == bazaar_types::state::MachineState::Started).then(|| {
                    crate::machine_metrics::Target {
                        id: r.id.clone(),
                        app: r.app.clone(),
                        addr: format!("{ip}:{}", metrics.port),
                        path: metrics.path.clone(),
                    }
                })
            });
            agent
                .machine_metrics()
                .schedule(targets, (agent.tracker(), &shutdown));
        }
    });
}

/// Republishes machine `id`'s catalog row (its checks changed).
async fn republish(agent: &Agent, id: String) {
    let store = agent.store().clone();
    let id2 = id.clone();
    match tokio::task::spawn_blocking(move || store.machine(&id2)).await {
        Ok(Ok(Some(rec))) => agent.publish(&rec),
        Ok(Ok(None)) => {}
        Ok(Err(err)) => tracing::warn!(machine.id = %id, error = %err, "reading machine"),
        Err(err) => tracing::warn!(machine.id = %id, error = %err, "reading machine"),
    }
}

/// Start-up (the API's OpenAPI document built from its routes, TLS roots, re-adopting
/// machines, the first catalog sync) allocates and frees a few MiB that glibc would keep
/// resident for the agent's whole life (~4 MiB measured on an idle agent): give them back
/// now, and once more when the catalog has settled.
fn give_back_start_up_heap(agent: &Agent) {
    fn trim() {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: malloc_trim takes a plain integer and only releases free heap pages.
        unsafe {
            libc::malloc_trim(0);
        }
    }
    trim();
    let stop = agent.shutdown_token();
    agent.tracker().spawn(async move {
        tokio::select! {
            () = stop.cancelled() => {}
            () = tokio::time::sleep(std::time::Duration::from_secs(3)) => trim(),
        }
    });
}

#[cfg(test)]
mod tests {
    use super::presented_token;
    use base64::Engine as _;

    fn with(auth: &str) -> axum::extract::Request {
        axum::http::Request::builder()
            .header(axum::http::header::AUTHORIZATION, auth)
            .body(axum::body::Body::empty())
            .unwrap()
    }

    #[test]
    fn a_registry_clients_basic_password_counts_as_its_token() {
        assert_eq!(presented_token(&with("Bearer tok")).as_deref(), Some("tok"));
        let basic = base64::engine::general_purpose::STANDARD.encode("x:tok");
        assert_eq!(
            presented_token(&with(&format!("Basic {basic}"))).as_deref(),
            Some("tok")
        );
        assert_eq!(presented_token(&with("Basic %%%")), None);
    }
}
