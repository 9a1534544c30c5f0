//! Agent configuration: a TOML file and/or command-line flags (the CLI merges them).
//! Every listener defaults to loopback; nothing binds an auto-detected interface address.

use bazaar_types::host::Resources;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Everything an agent needs to run.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentConfig {
    /// Where the store, machine directories and secrets live.
    pub data_dir: PathBuf,
    /// The region this host is in.
    pub region: String,
    /// Address of the HTTP listener (the Machines API and the host interface).
    pub api_listen: SocketAddr,
    /// Address of the catalog's gossip (UDP and TCP on the same port).
    pub gossip_listen: SocketAddr,
    /// Gossip addresses of hosts to join through.
    pub join: Vec<SocketAddr>,
    /// A dead host is noticed everywhere within about this long.
    #[serde(with = "millis")]
    pub dead_after: Duration,
    /// CPUs offered; `None` detects them (times `cpu_overcommit`).
    pub cpus: Option<u32>,
    /// Memory offered in MB; `None` detects it.
    pub memory_mb: Option<u64>,
    /// Disk offered to volumes in GB; `None` takes the free space of `data_dir` at start.
    pub disk_gb: Option<u64>,
    /// Shared CPUs are time-sliced: each detected CPU counts this many times.
    pub cpu_overcommit: u32,
    /// The cluster secret; `None` reads `cluster_secret_file`, else reads (or creates)
    /// `data_dir/cluster-secret`. Prefer the file or `BAZAAR_CLUSTER_SECRET`: a command
    /// line shows in `ps`.
    pub cluster_secret: Option<String>,
    /// A file holding the cluster secret (first line).
    pub cluster_secret_file: Option<PathBuf>,
    /// A file of API tokens (one per line) also accepted by this agent.
    pub token_file: Option<PathBuf>,
    /// The cluster's public token key (hex) that scoped tokens are verified with; `None`
    /// reads `token_public_key_file`, else `data_dir/token-public-key` if it exists (else
    /// only the cluster secret and the token file's tokens are accepted).
    pub token_public_key: Option<String>,
    /// A file holding the public token key (hex).
    pub token_public_key_file: Option<PathBuf>,
    /// Run workloads in their own namespaces, as an unprivileged user, under cgroup limits
    /// (only possible as root; ignored otherwise).
    pub isolate: bool,
    /// Let process machines run as root (`init.user = "root"`) on a root agent; refused
    /// with 400 otherwise (see `identity.rs`).
    pub allow_root_machines: bool,
    /// Stop every workload when the agent shuts down (dev clusters). By default workloads
    /// keep running and are re-adopted when the agent comes back (upgrades, crashes).
    pub stop_machines_on_shutdown: bool,
    /// Size cap of a machine's log file before it is rotated.
    pub log_max_bytes: u64,
    /// The size of every machine's writable space (MB) when its config does not say
    /// (`config.rootfs.size_gb`); `None`: by guest size (`work_disk::default_mb`); 0: no
    /// limit (the work directory is on the data dir's file system).
    #[serde(default)]
    pub machine_disk_mb: Option<u64>,
    /// Longest time a bid's reservation is held unless claimed.
    #[serde(with = "millis")]
    pub reservation_ttl: Duration,
    /// How long destroyed machines are kept as tombstones.
    #[serde(with = "millis")]
    pub tombstone_ttl: Duration,
    /// How long an hour of `config.schedule` lasts (an hour; shorter in tests).
    #[serde(with = "millis")]
    pub schedule_hour: Duration,
    /// The `bazaar` executable to run shims with (defaults to this executable).
    pub shim_exe: Option<PathBuf>,
    /// Address of the edge proxy's HTTP listener.
    pub proxy_listen: SocketAddr,
    /// Address of the proxy's hop listener (mTLS, for other hosts' proxies; only with a
    /// cluster certificate). Default: the proxy's IP, a port the kernel picks.
    pub proxy_hop_listen: Option<SocketAddr>,
    /// Apps are served at `<app>.<proxy_domain>`.
    pub proxy_domain: String,
    /// Address of the edge proxy's HTTPS listener (certificates per app hostname).
    pub proxy_tls_listen: SocketAddr,
    /// The ACME directory URL certificates are issued from (`bazaar certs add`); `None`:
    /// only certificates given as PEM.
    pub acme_directory: Option<String>,
    /// A PEM file of the root(s) the ACME directory's HTTPS is checked against (a test CA
    /// such as Pebble's); `None`: the system's roots.
    pub acme_ca: Option<PathBuf>,
    /// A machine of a service with `autostop` is stopped after this long without requests.
    #[serde(with = "millis")]
    pub autostop_idle: Duration,
    /// How long the proxy holds a request that no machine can take yet before it answers 503.
    #[serde(with = "millis")]
    pub proxy_queue_timeout: Duration,
    /// How long this node's exchange waits for a host's bid before the round goes on
    /// without it (the market's `bid_deadline`).
    #[serde(with = "millis")]
    pub bid_deadline: Duration,
    /// Registries (`host[:port]`) pulled from over plain HTTP, on any address (private
    /// ones too); others are reached on public addresses only (`bazaar_image::egress`).
    pub insecure_registries: Vec<String>,
    /// Registries on loopback addresses may be pulled from, over plain HTTP (`bazaar dev`,
    /// tests): the agent then fetches from this host's own services.
    pub allow_loopback_registries: bool,
    /// The subnet of this host's machine network (CIDR); `None` keeps the one used before,
    /// or picks the first free /19 of 10.192.0.0/12.
    pub machine_subnet: Option<String>,
    /// Let image machines reach beyond this host (masquerade their traffic).
    pub machine_nat: bool,
    /// Where this host's WireGuard mesh listens (UDP); `None` runs no mesh. With a mesh the
    /// machine network is this host's claimed /22 of 10.208.0.0/12 (`crate::mesh`,
    /// docs/NETWORK.md).
    pub mesh_listen: Option<SocketAddr>,
    /// The runc executable; `None` looks it up in PATH.
    pub runc: Option<PathBuf>,
    /// The guest kernel of microVM machines (`config.runtime = "microvm"`; a `vmlinuz`
    /// with its virtio modules in `modules/` beside it, as `scripts/vm-kernel` extracts);
    /// `None`: this host runs no microVMs.
    pub vm_kernel: Option<PathBuf>,
    /// Run microVMs under QEMU's TCG when `/dev/kvm` is not usable (slow: tests and
    /// hosts without hardware virtualization).
    pub vm_allow_tcg: bool,
    /// Credentials for pulling from registries: `host[:port]=user:password` each.
    pub registry_auth: Vec<String>,
    /// The largest image archive `POST /host/v1/images/import` accepts (bytes).
    pub max_import_bytes: u64,
    /// The cluster CA's directory (`bazaar cluster init`) when this host holds it: the host
    /// issues its own certificate and serves joins and renewals (`host_tls.rs`).
    pub cluster_ca: Option<PathBuf>,
    /// A one-time join token (`bazaar cluster join-token`) for a host that has no
    /// certificate yet. Prefer `BAZAAR_JOIN_TOKEN`: a command line shows in `ps`.
    pub join_token: Option<String>,
    /// The host listener of a host holding the CA: where to join and renew.
    pub join_addr: Option<SocketAddr>,
    /// Address of the host listener (mTLS between hosts); served once the host has a
    /// cluster certificate.
    pub host_listen: SocketAddr,
    /// How long the host certificates this host's CA issues are valid (renewed after two
    /// thirds of that).
    #[serde(with = "millis")]
    pub cert_validity: Duration,
    /// Serve the Machines API port over HTTPS (`api_tls.rs`): with `api_tls_cert` and
    /// `api_tls_key` when given, else with a certificate of the cluster CA.
    pub api_tls: bool,
    /// The API's certificate chain (PEM) instead of one from the cluster CA.
    pub api_tls_cert: Option<PathBuf>,
    /// The key of `api_tls_cert` (PEM).
    pub api_tls_key: Option<PathBuf>,
    /// How long a host must have been dead before the guardian re-places its machines
    /// that opted in (`bazaar_api::guardian`).
    #[serde(with = "millis")]
    pub replace_after: Duration,
    /// Where the host itself asks the internal DNS (loopback; `None`: only machines, on
    /// the network's gateway, are served).
    pub dns_listen: Option<SocketAddr>,
    /// Resolvers that names outside `.internal` are forwarded to; empty reads the
    /// host's `/etc/resolv.conf`.
    pub dns_upstreams: Vec<SocketAddr>,
    /// Connections the API port and the host listener hold at once, together; at most half
    /// the agent's open-file limit (`bazaar_node::listen`).
    pub max_connections: usize,
    /// Connections from one source address that have not yet carried a token the agent
    /// accepts.
    pub max_connections_per_source: usize,
    /// Longest a request head (or TLS handshake) may take on the API port and the host
    /// listener, and a kept-alive connection may idle there.
    #[serde(with = "millis")]
    pub request_head_timeout: Duration,
    /// What this host says of its region (`[region_info]`: name, latitude, longitude,
    /// geo_region, gateway), published in its host row for `GET /v1/platform/regions`.
    pub region_info: bazaar_types::region::RegionInfo,
    /// The operator's labels of this host (`[labels]`, `disk = "nvme"`; `--label`),
    /// published in its host row for machines' placement constraints, affinities and
    /// spread (docs/POLICY.md). Names the agent publishes itself are refused.
    pub labels: BTreeMap<String, String>,
    /// Oversubscription with reclamation (`[reclaim]`, docs/POLICY.md "Reclamation"): off
    /// by default.
    pub reclaim: ReclaimConfig,
    /// Shared CPUs' burst model (`[burst]`, docs/POLICY.md "Shared CPU bursts"): off by
    /// default (a shared vCPU then has a core of `cpu.max`).
    pub burst: BurstConfig,
}

/// `[burst]`: shared vCPUs get a baseline share of a core and a burst balance (Fly's
/// model, `bazaar_placement::burst`), accounted at every measurement (`[reclaim]
/// interval`) and applied to the machine's cgroup `cpu.max`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BurstConfig {
    pub enabled: bool,
    /// Each shared vCPU's guaranteed share of a core, in percent.
    pub baseline_pct: f64,
    /// The largest balance, in milliseconds of one full core per vCPU.
    pub max_balance_ms: u64,
}

impl Default for BurstConfig {
    fn default() -> Self {
        let rule = bazaar_placement::burst::Burst::default();
        BurstConfig {
            enabled: false,
            baseline_pct: rule.baseline_pct,
            max_balance_ms: rule.max_balance_ms,
        }
    }
}

impl BurstConfig {
    /// The model these parameters make.
    pub fn rule(&self) -> bazaar_placement::burst::Burst {
        bazaar_placement::burst::Burst {
            baseline_pct: self.baseline_pct.clamp(0.1, 100.0),
            max_balance_ms: self.max_balance_ms,
        }
    }
}

/// `[reclaim]`: whether this host lends what its services reserve and do not use to
/// `batch` machines, how often it measures each machine's use, and Borg's rule's
/// parameters (`bazaar_placement::reclaim::Reclaim`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReclaimConfig {
    /// Hold `batch` machines against the reclaimed room instead of capacity by requests.
    pub enabled: bool,
    /// Time between two measurements of every machine's CPU and memory use (reclamation's
    /// and shared CPU bursts' alike).
    #[serde(with = "millis")]
    pub interval: Duration,
    /// The safety margin over measured use, in percent of the use.
    pub margin_pct: u64,
    /// The share of the gap between a reservation and its target closed per measurement,
    /// in percent.
    pub decay_pct: u64,
    /// Measurements after a service starts during which its reservation stays at its
    /// request.
    pub grace_observations: u32,
    /// How far batch machines' CPU is throttled (`cpu.max`), in percent of their request,
    /// before any is stopped for CPU when a service needs its reservation back; 100 stops
    /// them at once.
    pub throttle_floor_pct: u64,
}

impl Default for ReclaimConfig {
    fn default() -> Self {
        let rule = bazaar_placement::reclaim::Reclaim::default();
        ReclaimConfig {
            enabled: false,
            interval: Duration::from_secs(5),
            margin_pct: rule.margin_pct,
            decay_pct: rule.decay_pct,
            grace_observations: rule.grace_observations,
            throttle_floor_pct: rule.throttle_floor_pct,
        }
    }
}

impl ReclaimConfig {
    /// The rule these parameters make.
    pub fn rule(&self) -> bazaar_placement::reclaim::Reclaim {
        bazaar_placement::reclaim::Reclaim {
            margin_pct: self.margin_pct,
            decay_pct: self.decay_pct.clamp(1, 100),
            grace_observations: self.grace_observations,
            throttle_floor_pct: self.throttle_floor_pct.clamp(1, 100),
        }
    }
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            data_dir: PathBuf::from("/var/lib/bazaar"),
            region: "local".into(),
            api_listen: SocketAddr::from(([127, 0, 0, 1], 4280)),
            gossip_listen: SocketAddr::from(([127, 0, 0, 1], 4380)),
            join: Vec::new(),
            // Within the "≤ 10 s", with margin for a loaded host.
            dead_after: Duration::from_secs(8),
            cpus: None,
            memory_mb: None,
            disk_gb: None,
            cpu_overcommit: 8,
            cluster_secret: None,
            cluster_secret_file: None,
            token_file: None,
            token_public_key: None,
            token_public_key_file: None,
            isolate: true,
            allow_root_machines: false,
            stop_machines_on_shutdown: false,
            log_max_bytes: 8 * 1024 * 1024,
            machine_disk_mb: None,
            // Long enough for a claim round trip on a busy host, short enough that an
            // exchange that died does not hold capacity for long (DESIGN.md: "a few seconds").
            reservation_ttl: Duration::from_secs(5),
            tombstone_ttl: Duration::from_secs(3600),
            schedule_hour: Duration::from_secs(3600),
            shim_exe: None,
            proxy_listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            proxy_hop_listen: None,
            proxy_domain: "localhost".into(),
            proxy_tls_listen: SocketAddr::from(([127, 0, 0, 1], 8443)),
            acme_directory: None,
            acme_ca: None,
            autostop_idle: Duration::from_secs(30),
            proxy_queue_timeout: Duration::from_secs(5),
            bid_deadline: bazaar_placement::exchange::MarketConfig::default().bid_deadline,
            insecure_registries: Vec::new(),
            allow_loopback_registries: false,
            machine_subnet: None,
            machine_nat: false,
            mesh_listen: None,
            runc: None,
            vm_kernel: None,
            vm_allow_tcg: false,
            registry_auth: Vec::new(),
            max_import_bytes: 4 << 30,
            cluster_ca: None,
            join_token: None,
            join_addr: None,
            host_listen: SocketAddr::from(([127, 0, 0, 1], 4480)),
            cert_validity: bazaar_pki::DEFAULT_CERT_VALIDITY,
            api_tls: false,
            api_tls_cert: None,
            api_tls_key: None,
            replace_after: Duration::from_secs(60),
            dns_listen: None,
            dns_upstreams: Vec::new(),
            max_connections: bazaar_node::listen::Limits::default().max_connections,
            max_connections_per_source: bazaar_node::listen::Limits::default()
                .max_untrusted_per_source,
            request_head_timeout: bazaar_node::listen::Limits::default().head_timeout,
            region_info: Default::default(),
            labels: BTreeMap::new(),
            reclaim: ReclaimConfig::default(),
            burst: BurstConfig::default(),
        }
    }
}

impl AgentConfig {
    /// What the runtime needs of this config to run image machines.
    pub fn oci_settings(&self) -> bazaar_runtime::oci::OciSettings<'_> {
        bazaar_runtime::oci::OciSettings {
            data_dir: &self.data_dir,
            insecure_registries: &self.insecure_registries,
            allow_loopback_registries: self.allow_loopback_registries,
            machine_subnet: self.machine_subnet.as_deref(),
            machine_nat: self.machine_nat,
            runc: self.runc.as_deref(),
            registry_auth: &self.registry_auth,
            vm_kernel: self.vm_kernel.as_deref(),
            vm_allow_tcg: self.vm_allow_tcg,
        }
    }

    /// Reads a TOML config file.
    pub fn from_file(path: &std::path::Path) -> anyhow::Result<AgentConfig> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
        let config: AgentConfig =
            toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        config
            .region_info
            .validate()
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        for (name, value) in &config.labels {
            bazaar_types::placement_policy::check_host_label(name, value)
                .map_err(|e| anyhow::anyhow!("{}: labels: {e}", path.display()))?;
        }
        Ok(config)
    }

    /// The capacity this host offers.
    pub fn capacity(&self) -> Resources {
        let cpus = self
            .cpus
            .unwrap_or_else(|| detected_cpus() * self.cpu_overcommit.max(1));
        let memory_mb = self.memory_mb.unwrap_or_else(detected_memory_mb);
        Resources { cpus, memory_mb }
    }
}

/// CPUs of this machine.
pub fn detected_cpus() -> u32 {
    std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(1)
}

/// Memory of this machine in MB (from /proc/meminfo), less 10% for the host itself.
pub fn detected_memory_mb() -> u64 {
    let total_kb = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .unwrap_or(1024 * 1024);
    total_kb / 1024 * 9 / 10
}

mod millis {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis() as u64)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_millis(u64::deserialize(d)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example the Debian package installs as /etc/bazaar/agent.toml.
    const PACKAGED: &str = include_str!("../../../packaging/debian/agent.toml");

    fn load(text: &str) -> anyhow::Result<AgentConfig> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("agent.toml");
        std::fs::write(&path, text)?;
        AgentConfig::from_file(&path)
    }

    #[test]
    fn the_packaged_example_is_accepted_as_it_is_and_with_every_key_uncommented() {
        let config = load(PACKAGED).unwrap();
        assert_eq!(config.data_dir, PathBuf::from("/var/lib/bazaar"));
        assert_eq!(config.region, "local");
        // Each commented key, uncommented, is one the agent knows and a value it takes.
        let uncommented: String = PACKAGED
            .lines()
            .map(|line| match line.strip_prefix("# ") {
                Some(rest)
                    if rest.starts_with('[')
                        || rest.split_once(" = ").is_some_and(|(k, _)| {
                            k.chars().all(|c| c.is_ascii_lowercase() || c == '_')
                        }) =>
                {
                    rest
                }
                _ => line,
            })
            .map(|line| format!("{line}\n"))
            .collect();
        assert!(uncommented.contains("\n[region_info]\n"), "{uncommented}");
        let config = load(&uncommented).unwrap_or_else(|e| panic!("{e:#}\n{uncommented}"));
        assert_eq!(config.cpus, Some(16));
        assert_eq!(config.join.len(), 1);
        assert_eq!(config.region_info.geo_region.as_deref(), Some("eu"));
        // An unknown key is refused (so the test above would see a misspelt one).
        assert!(load("no_such_key = 1\n").is_err());
    }
}
