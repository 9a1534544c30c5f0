//! The `bazaar` binary: one executable for the agent, the local dev cluster, the CLI and the
//! per-machine shim.
//!
//! - `bazaar agent`: run one host's agent ([`bazaar_agent`]).
//! - `bazaar dev`: a local cluster of N agents on loopback ([`dev`]).
//! - `bazaar lab ...`: a fleet of agents in network namespaces, with faults to inject
//!   ([`lab_cmd`], over [`bazaar_lab`]).
//! - `bazaar cluster init|join-token`: the cluster CA and join tokens ([`cluster_cmd`]).
//! - `bazaar host ...`: talk to one agent's host interface ([`host_cmd`]).
//! - `bazaar hosts`, `bazaar status`: the catalog as this node sees it.
//! - `bazaar apps ...`, `bazaar machine ...`: the Machines API ([`api_cmd`]).
//! - `bazaar token ...`, `bazaar audit`: scoped tokens and the audit record ([`token_cmd`]).
//! - `bazaar deploy`, `releases`, `rollback`, `scale`, `app-status`, `logs`: apps as code
//!   ([`deploy_cmd`], over [`bazaar_deploy`]).
//! - `bazaar sim`: the fleet simulator ([`bazaar_sim`]).
//! - `bazaar shim RUN_DIR`: internal; the per-machine supervisor ([`bazaar_shim`]).
//! - `bazaar shim-exec RUN_DIR ARGV...`: internal; runs a command inside a live run
//!   ([`bazaar_shim::exec_main`]).

mod api_cmd;
mod backup_cmd;
mod certs_cmd;
mod cluster_cmd;
mod deploy_cmd;
mod dev;
mod drain_cmd;
mod host_cmd;
mod image_cmd;
mod image_push;
mod lab_cmd;
mod launch_timing;
mod machine_wait;
mod node_main;
mod operator;
mod quota_cmd;
mod secrets_cmd;
mod term;
mod token_cmd;
mod volumes_cmd;

use clap::{Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(
    name = "bazaar",
    version,
    about = "A decentralized cluster orchestrator that speaks the Fly Machines API"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the agent of one host.
    Agent(Box<AgentArgs>),
    /// Start (or resume) a local cluster of agents on loopback.
    Dev(dev::DevArgs),
    /// A fleet of hosts in network namespaces on this machine, and faults to inject (root).
    Lab(lab_cmd::LabArgs),
    /// The cluster's identity: its CA, join tokens for new hosts, host revocation, the gossip keyring.
    Cluster(cluster_cmd::ClusterArgs),
    /// Talk to one host's agent (host interface).
    Host(host_cmd::HostArgs),
    /// List the hosts this node's catalog knows, with their liveness and free capacity.
    Hosts(host_cmd::CatalogArgs),
    /// List machines as this node's catalog sees them (all hosts).
    Status(host_cmd::StatusArgs),
    /// Create, list and destroy apps.
    Apps(api_cmd::AppsArgs),
    /// Run and manage machines through the Machines API (placed by the market).
    Machine(api_cmd::MachineArgs),
    /// Create, list, extend and destroy volumes (host-local storage for machines).
    Volumes(volumes_cmd::VolumesArgs),
    /// TLS certificates of an app's hostnames (add by ACME or PEM, list, show, remove).
    Certs(certs_cmd::CertsArgs),
    /// List, pull, import (docker save / OCI archives) and prune one host's images.
    Image(image_cmd::ImageArgs),
    /// Manage API tokens: the cluster token key, scoped tokens, revocation.
    Token(token_cmd::TokenArgs),
    /// Every change made to an app: who (token id), what, when, from where, the answer.
    Audit(token_cmd::AuditArgs),
    /// Set, list and unset an app's secrets (environment variables of its machines).
    Secrets(secrets_cmd::SecretsArgs),
    /// Set and show quotas of an organization or an app (machines, cpus, memory, volume GB).
    Quota(quota_cmd::QuotaArgs),
    /// Deploy the app config file (bazaar.toml or fly.toml) as a new release.
    Deploy(deploy_cmd::DeployArgs),
    /// List an app's releases.
    Releases(deploy_cmd::ReleasesArgs),
    /// Deploy an earlier release again (default: the one before the current).
    Rollback(deploy_cmd::RollbackArgs),
    /// Change how many machines an app runs, or their size.
    Scale(deploy_cmd::ScaleArgs),
    /// An app's machines per process group and region: state, health, release, host.
    AppStatus(deploy_cmd::AppStatusArgs),
    /// Output of every machine of an app.
    Logs(deploy_cmd::LogsArgs),
    /// Simulate a fleet and compare placement policies (see docs/SIMULATION.md).
    Sim(bazaar_sim::cli::SimArgs),
}

#[derive(Debug, clap::Args)]
struct AgentArgs {
    /// A TOML config file; flags override it.
    #[arg(long, env = "BAZAAR_AGENT_CONFIG")]
    config: Option<PathBuf>,
    /// Data directory (store, machines, secrets).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Region of this host.
    #[arg(long)]
    region: Option<String>,
    /// A label of this host, NAME=VALUE (repeatable; added to the config file's `[labels]`,
    /// a flag winning over the file for one name): machines' `config.placement` constraints,
    /// affinities and spread match them (docs/POLICY.md).
    #[arg(long = "label", value_parser = parse_label)]
    labels: Vec<(String, String)>,
    /// Address of the HTTP listener (default 127.0.0.1:4280).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Address of the catalog's gossip, UDP and TCP (default 127.0.0.1:4380).
    #[arg(long)]
    gossip_listen: Option<SocketAddr>,
    /// Gossip addresses of hosts to join through (comma-separated).
    #[arg(long, value_delimiter = ',')]
    join: Vec<SocketAddr>,
    /// A killed host is declared dead everywhere within about this long (ms).
    #[arg(long)]
    dead_after_ms: Option<u64>,
    /// Re-place the machines of a host dead this long that opted in
    /// (`metadata.bazaar_replace_on_host_failure = "true"`), e.g. `60s` (the default).
    #[arg(long, value_parser = bazaar_types::duration::parse_go_duration)]
    replace_after: Option<std::time::Duration>,
    /// How long an hour of `config.schedule` lasts (ms; for tests).
    #[arg(long, hide = true)]
    schedule_hour_ms: Option<u64>,
    /// CPUs offered (default: detected CPUs × cpu overcommit).
    #[arg(long)]
    cpus: Option<u32>,
    /// Memory offered in MB (default: 90% of detected memory).
    #[arg(long)]
    memory_mb: Option<u64>,
    /// Disk offered to volumes in GB (default: free space of the data dir at start).
    #[arg(long)]
    disk_gb: Option<u64>,
    /// The cluster secret (default: read or created in the data dir). On the command line
    /// it shows in `ps`: prefer BAZAAR_CLUSTER_SECRET or --cluster-secret-file.
    #[arg(long, env = "BAZAAR_CLUSTER_SECRET", hide_env_values = true)]
    cluster_secret: Option<String>,
    /// A file whose first line is the cluster secret (wins over BAZAAR_CLUSTER_SECRET).
    #[arg(long)]
    cluster_secret_file: Option<PathBuf>,
    /// File of API tokens this agent accepts (one per line).
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// The cluster's public token key (hex): scoped tokens signed by its private half are
    /// accepted (`bazaar token init` makes the pair).
    #[arg(long, env = "BAZAAR_TOKEN_PUBLIC_KEY")]
    token_public_key: Option<String>,
    /// A file holding the public token key.
    #[arg(long)]
    token_public_key_file: Option<PathBuf>,
    /// Run workloads without namespaces, user switch or cgroups. On a root agent that
    /// means as root, unconfined: it needs --allow-root-machines too.
    #[arg(long)]
    no_isolate: bool,
    /// Let process machines run as root (`init.user = "root"`); refused by default.
    #[arg(long)]
    allow_root_machines: bool,
    /// Stop every workload when the agent stops (they restart with it).
    #[arg(long)]
    stop_machines_on_shutdown: bool,
    /// Address of the edge proxy (default 127.0.0.1:8080).
    #[arg(long)]
    proxy_listen: Option<SocketAddr>,
    /// Address of the proxy's hop listener, where other hosts' proxies hand it requests
    /// over mTLS (hosts with a cluster certificate only; default: the proxy's IP, any port).
    #[arg(long)]
    proxy_hop_listen: Option<SocketAddr>,
    /// The proxy serves app `a` at `a.<domain>` (default localhost).
    #[arg(long)]
    proxy_domain: Option<String>,
    /// Address of the proxy's HTTPS listener (default 127.0.0.1:8443).
    #[arg(long)]
    proxy_tls_listen: Option<SocketAddr>,
    /// The ACME directory certificates are issued from (`bazaar certs add`), e.g.
    /// `https://acme-v02.api.letsencrypt.org/directory`.
    #[arg(long)]
    acme_directory: Option<String>,
    /// A PEM file of the root CA the ACME directory's HTTPS is checked against (a test
    /// CA such as Pebble's; default: the system's roots).
    #[arg(long)]
    acme_ca: Option<PathBuf>,
    /// Stop machines of services with autostop after this long without requests (ms;
    /// default 30000).
    #[arg(long)]
    autostop_idle_ms: Option<u64>,
    /// Answer 503 when no machine could take a request within this long (ms; default 5000).
    #[arg(long)]
    proxy_queue_timeout_ms: Option<u64>,
    /// Place without a host whose bid has not come within this long (ms; default 250).
    #[arg(long)]
    bid_deadline_ms: Option<u64>,
    /// Pull from this registry (`host[:port]`) over plain HTTP, whatever its address
    /// (repeatable). Other registries are reached on public addresses only.
    #[arg(long = "insecure-registry")]
    insecure_registries: Vec<String>,
    /// Let pulls reach registries on loopback addresses (over plain HTTP): development
    /// and tests. Any caller who may create a machine then makes the agent fetch
    /// `/v2/...` from this host's own services.
    #[arg(long)]
    allow_loopback_registries: bool,
    /// Subnet of this host's machine network, e.g. 10.192.32.0/19, a /16 to a /29
    /// (default: the one used before, or the first free /19 of 10.192.0.0/12).
    #[arg(long)]
    machine_subnet: Option<String>,
    /// Let image machines reach beyond this host (outbound NAT).
    #[arg(long)]
    machine_nat: bool,
    /// Join the private network between hosts: its WireGuard mesh listens on this UDP
    /// address (this host's address, never picked for you), and machines get addresses
    /// from this host's /22 of 10.208.0.0/12 (docs/NETWORK.md).
    #[arg(long)]
    mesh_listen: Option<std::net::SocketAddr>,
    /// The runc executable (default: runc in PATH).
    #[arg(long)]
    runc: Option<PathBuf>,
    /// The guest kernel of microVM machines (`config.runtime = "microvm"`), a vmlinuz with
    /// its virtio modules in `modules/` beside it (scripts/vm-kernel; default: no microVMs).
    #[arg(long)]
    vm_kernel: Option<PathBuf>,
    /// Run microVMs under QEMU's TCG when /dev/kvm is not usable (slow).
    #[arg(long)]
    vm_allow_tcg: bool,
    /// The largest image archive `bazaar image import` may send (bytes; default 4 GiB).
    #[arg(long)]
    max_import_bytes: Option<u64>,
    /// The size (MB) of a machine's writable space when its config.rootfs.size_gb does not
    /// say (default: 4 MB per MB of memory, 1 to 8 GB); 0 turns the limit off.
    #[arg(long)]
    machine_disk_mb: Option<u64>,
    /// Credentials for a registry, `host[:port]=user:password` (repeatable).
    #[arg(
        long = "registry-auth",
        env = "BAZAAR_REGISTRY_AUTH",
        value_delimiter = ',',
        hide_env_values = true
    )]
    registry_auth: Vec<String>,
    /// The cluster CA's directory (`bazaar cluster init`), when this host holds it: it
    /// issues its own certificate and serves joins and renewals.
    #[arg(long)]
    cluster_ca: Option<PathBuf>,
    /// A one-time join token (`bazaar cluster join-token`) for a host without a certificate.
    #[arg(long, env = "BAZAAR_JOIN_TOKEN", hide_env_values = true)]
    join_token: Option<String>,
    /// The host listener of the agent holding the CA (to join and renew through).
    #[arg(long)]
    join_addr: Option<SocketAddr>,
    /// Address of the host listener, the host interface over mTLS (default 127.0.0.1:4480).
    #[arg(long)]
    host_listen: Option<SocketAddr>,
    /// How long host certificates issued by this host's CA are valid (ms; default 30 days).
    #[arg(long)]
    cert_validity_ms: Option<u64>,
    /// Where the host asks the internal DNS (`dig @127.0.0.1 -p PORT web.internal`);
    /// machines always get it on their network's gateway, port 53.
    #[arg(long)]
    dns_listen: Option<SocketAddr>,
    /// A resolver that names outside `.internal` are forwarded to (repeatable; default
    /// the name servers of /etc/resolv.conf).
    #[arg(long = "dns-upstream")]
    dns_upstreams: Vec<SocketAddr>,
    /// Serve the Machines API over HTTPS, with a certificate of the cluster CA (its SANs:
    /// the host's name, `localhost` and the listen address) unless one is given.
    #[arg(long)]
    api_tls: bool,
    /// The API's certificate chain (PEM), with --api-tls-key: instead of the cluster CA's.
    #[arg(long, requires = "api_tls_key")]
    api_tls_cert: Option<PathBuf>,
    /// The key of --api-tls-cert (PEM).
    #[arg(long, requires = "api_tls_cert")]
    api_tls_key: Option<PathBuf>,
    /// Connections the API port and the host listener hold at once, together (default
    /// 16384; never more than half the agent's open-file limit). Past it, the oldest
    /// connection that has not carried an accepted token is closed to make room.
    #[arg(long)]
    max_connections: Option<usize>,
    /// Connections from one address that have not yet carried an accepted token (default
    /// 256); past it, that address's oldest is closed to make room.
    #[arg(long)]
    max_connections_per_source: Option<usize>,
    /// Longest a request head or TLS handshake may take on the API port and the host
    /// listener, and a kept-alive connection may idle there (ms; default 10000).
    #[arg(long)]
    request_head_timeout_ms: Option<u64>,
    /// Log format: text or json.
    #[arg(long, default_value = "text")]
    log_format: String,
}

fn main() {
    // The shim must start single-threaded and small: dispatch to it before anything else
    // (no runtime, no argument parser, no logging set-up).
    let mut args = std::env::args_os().skip(1);
    if let Some(cmd) = args.next() {
        bazaar_shim::dispatch(&cmd, args);
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Agent(a) => {
            init_logging(&a.log_format);
            run_async(run_agent(*a))
        }
        Command::Dev(d) => {
            init_logging("text");
            run_async(dev::run(d))
        }
        Command::Lab(l) => lab_cmd::run(l),
        Command::Cluster(c) => cluster_cmd::run(c),
        Command::Host(h) => run_async(host_cmd::run(h)),
        Command::Hosts(a) => run_async(host_cmd::hosts(a)),
        Command::Status(a) => run_async(host_cmd::status(a)),
        Command::Apps(a) => run_async(api_cmd::apps(a)),
        Command::Machine(a) => run_async(api_cmd::machine(a)),
        Command::Volumes(a) => run_async(volumes_cmd::volumes(a)),
        Command::Certs(a) => run_async(certs_cmd::certs(a)),
        Command::Image(a) => run_async(image_cmd::image(a)),
        Command::Token(a) => run_async(token_cmd::token(a)),
        Command::Audit(a) => run_async(token_cmd::audit(a)),
        Command::Secrets(a) => run_async(secrets_cmd::secrets(a)),
        Command::Quota(a) => run_async(quota_cmd::quota(a)),
        Command::Deploy(a) => run_async(deploy_cmd::deploy(a)),
        Command::Releases(a) => run_async(deploy_cmd::releases(a)),
        Command::Rollback(a) => run_async(deploy_cmd::rollback(a)),
        Command::Scale(a) => run_async(deploy_cmd::scale(a)),
        Command::AppStatus(a) => run_async(deploy_cmd::app_status(a)),
        Command::Logs(a) => run_async(deploy_cmd::logs(a)),
        Command::Sim(a) => bazaar_sim::cli::run(a),
    };
    if let Err(err) = result {
        eprintln!("error: {err:#}");
        std::process::exit(1);
    }
}

fn run_async<F: std::future::Future<Output = anyhow::Result<()>>>(f: F) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(f)
}

fn init_logging(format: &str) {
    use tracing_subscriber::EnvFilter;
    let filter = std::env::var("BAZAAR_LOG")
        .ok()
        .or_else(|| std::env::var("RUST_LOG").ok())
        .unwrap_or_else(|| "info".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::new(filter))
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

async fn run_agent(a: AgentArgs) -> anyhow::Result<()> {
    let mut config = match &a.config {
        Some(path) => bazaar_agent::AgentConfig::from_file(path)?,
        None => bazaar_agent::AgentConfig::default(),
    };
    if let Some(d) = a.data_dir {
        config.data_dir = d;
    }
    if let Some(r) = a.region {
        bazaar_types::ids::validate_name("region", &r).map_err(anyhow::Error::msg)?;
        config.region = r;
    }
    if let Some(l) = a.listen {
        config.api_listen = l;
    }
    if let Some(g) = a.gossip_listen {
        config.gossip_listen = g;
    }
    if !a.join.is_empty() {
        config.join = a.join;
    }
    config.labels.extend(a.labels);
    if let Some(d) = a.replace_after {
        config.replace_after = d;
    }
    if let Some(ms) = a.dead_after_ms {
        config.dead_after = std::time::Duration::from_millis(ms);
    }
    if let Some(ms) = a.schedule_hour_ms {
        config.schedule_hour = std::time::Duration::from_millis(ms.max(1));
    }
    if a.cpus.is_some() {
        config.cpus = a.cpus;
    }
    if a.memory_mb.is_some() {
        config.memory_mb = a.memory_mb;
    }
    if a.disk_gb.is_some() {
        config.disk_gb = a.disk_gb;
    }
    if a.cluster_secret.is_some() {
        config.cluster_secret = a.cluster_secret;
    }
    if a.cluster_secret_file.is_some() {
        config.cluster_secret = None;
        config.cluster_secret_file = a.cluster_secret_file;
    }
    if a.token_file.is_some() {
        config.token_file = a.token_file;
    }
    if a.token_public_key.is_some() {
        config.token_public_key = a.token_public_key;
    }
    if a.token_public_key_file.is_some() {
        config.token_public_key = None;
        config.token_public_key_file = a.token_public_key_file;
    }
    if a.no_isolate {
        config.isolate = false;
    }
    config.allow_root_machines |= a.allow_root_machines;
    if a.stop_machines_on_shutdown {
        config.stop_machines_on_shutdown = true;
    }
    if let Some(l) = a.proxy_listen {
        config.proxy_listen = l;
    }
    if a.proxy_hop_listen.is_some() {
        config.proxy_hop_listen = a.proxy_hop_listen;
    }
    if let Some(d) = a.proxy_domain {
        config.proxy_domain = d;
    }
    if let Some(l) = a.proxy_tls_listen {
        config.proxy_tls_listen = l;
    }
    if a.acme_directory.is_some() {
        config.acme_directory = a.acme_directory;
    }
    if a.acme_ca.is_some() {
        config.acme_ca = a.acme_ca;
    }
    if let Some(ms) = a.autostop_idle_ms {
        config.autostop_idle = std::time::Duration::from_millis(ms);
    }
    if let Some(ms) = a.proxy_queue_timeout_ms {
        config.proxy_queue_timeout = std::time::Duration::from_millis(ms);
    }
    if let Some(ms) = a.bid_deadline_ms {
        config.bid_deadline = std::time::Duration::from_millis(ms);
    }
    config.insecure_registries.extend(a.insecure_registries);
    config.allow_loopback_registries |= a.allow_loopback_registries;
    if let Some(s) = a.machine_subnet {
        config.machine_subnet = Some(s);
    }
    config.machine_nat |= a.machine_nat;
    if let Some(m) = a.mesh_listen {
        config.mesh_listen = Some(m);
    }
    if let Some(r) = a.runc {
        config.runc = Some(r);
    }
    if let Some(k) = a.vm_kernel {
        config.vm_kernel = Some(k);
    }
    config.vm_allow_tcg |= a.vm_allow_tcg;
    if let Some(n) = a.max_import_bytes {
        config.max_import_bytes = n;
    }
    if a.machine_disk_mb.is_some() {
        config.machine_disk_mb = a.machine_disk_mb;
    }
    config.registry_auth.extend(a.registry_auth);
    if a.cluster_ca.is_some() {
        config.cluster_ca = a.cluster_ca;
    }
    if a.join_token.is_some() {
        config.join_token = a.join_token;
    }
    if a.join_addr.is_some() {
        config.join_addr = a.join_addr;
    }
    if let Some(l) = a.host_listen {
        config.host_listen = l;
    }
    if a.dns_listen.is_some() {
        config.dns_listen = a.dns_listen;
    }
    if !a.dns_upstreams.is_empty() {
        config.dns_upstreams = a.dns_upstreams;
    }
    // The flags add to the file's `api_tls`, `api_tls_cert` and `api_tls_key`; they do
    // not turn them off.
    config.api_tls |= a.api_tls || a.api_tls_cert.is_some();
    if a.api_tls_cert.is_some() {
        config.api_tls_cert = a.api_tls_cert;
        config.api_tls_key = a.api_tls_key;
    }
    config.api_tls |= config.api_tls_cert.is_some();
    if let Some(n) = a.max_connections {
        config.max_connections = n;
    }
    if let Some(n) = a.max_connections_per_source {
        config.max_connections_per_source = n;
    }
    if let Some(ms) = a.request_head_timeout_ms {
        config.request_head_timeout = std::time::Duration::from_millis(ms.max(1));
    }
    if let Some(ms) = a.cert_validity_ms {
        config.cert_validity = std::time::Duration::from_millis(ms.max(1000));
    }
    node_main::serve(config, shutdown_signal()).await
}

/// `--label NAME=VALUE`.
fn parse_label(s: &str) -> Result<(String, String), String> {
    bazaar_types::placement_policy::parse_host_label(s)
}

/// Registers the SIGINT and SIGTERM handlers now, so that a signal arriving while the
/// process starts up is not fatal, and returns a future that resolves when one arrives.
/// Must be called inside the runtime.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    async move {
        match (term, int) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            _ => std::future::pending().await,
        }
    }
}
