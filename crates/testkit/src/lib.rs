//! Test kit: starts real `bazaar agent` processes on loopback ports with temporary data
//! directories, so tests and benchmarks can create machines through the host interface,
//! SIGKILL an agent at any moment and start it again on the same data and port. A cluster
//! ([`start_cluster`]) has a cluster CA held by its first host, the others joining with
//! one-time tokens, as `bazaar dev` does: hosts talk over mTLS
//! ([`start_plain_cluster`] for the old path with the cluster secret alone).
//! [`fake_driver`] runs the real agent in-process with no shim (tests on a paused clock).

pub mod debian_base;
pub mod fake_driver;
mod fly;
pub mod host_guard;
pub mod images;
pub mod in_process;
pub mod tokens;

pub use fly::Fly;
pub use host_guard::HostGuard;

use bazaar_client::HostClient;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The cluster secret test agents share: it opens their host interface and catalog view
/// (`TestAgent::client`), never the Machines API (use [`api_token`]).
pub const TEST_SECRET: &str = "test-cluster-secret-0123456789";

/// The org token test agents accept on the Machines API ([`tokens::admin`]).
pub fn api_token() -> &'static str {
    tokens::admin()
}

/// How to start a test agent.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    pub exe: PathBuf,
    pub region: String,
    pub cpus: u32,
    pub memory_mb: u64,
    pub isolate: bool,
    pub env: Vec<(String, String)>,
    pub extra_args: Vec<String>,
    /// The loopback address the edge proxy listens on (hosts of a multi-host test can
    /// each take their own, as separate servers would have).
    pub proxy_ip: std::net::Ipv4Addr,
    /// Put the data dir in this subdirectory of the temporary directory instead of using
    /// it directly (a test can then make the parent private, as a home directory is).
    pub data_subdir: Option<String>,
    /// Start the agent with this limit on open files (soft and hard): a small host.
    pub open_files: Option<u64>,
}

impl AgentOptions {
    /// Defaults: region `local`, 64 cpus, 64 GB, isolation on (when root).
    pub fn new(exe: impl Into<PathBuf>) -> AgentOptions {
        AgentOptions {
            exe: exe.into(),
            region: "local".into(),
            cpus: 64,
            memory_mb: 65536,
            isolate: true,
            env: Vec::new(),
            extra_args: Vec::new(),
            proxy_ip: std::net::Ipv4Addr::LOCALHOST,
            data_subdir: None,
            open_files: None,
        }
    }
}

/// One running (or stopped) agent process and its data directory.
#[derive(Debug)]
pub struct TestAgent {
    pub opts: AgentOptions,
    pub data_dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    child: Option<Child>,
    port: u16,
    gossip_port: u16,
    proxy_port: u16,
    /// The agent's host id, read once it is up (its machines' cgroups are named after it).
    host_id: Option<String>,
    /// The cluster CA's directory, held by the first agent of a cluster with certificates.
    cluster_ca: Option<tempfile::TempDir>,
    /// The owner and mode of host files as they were before the agent started: checked
    /// when it is dropped ([`HostGuard`]).
    host_guard: HostGuard,
}

impl TestAgent {
    /// Starts an agent on a fresh temporary directory and a free port.
    pub fn start(opts: AgentOptions) -> anyhow::Result<TestAgent> {
        let tmp = tempfile::Builder::new().prefix("bazaar-test-").tempdir()?;
        let data_dir = match &opts.data_subdir {
            Some(sub) => tmp.path().join(sub),
            None => tmp.path().to_path_buf(),
        };
        Self::start_at(opts, data_dir, Some(tmp))
    }

    /// Starts an agent on `data_dir`, made by the caller (a small file system, say), which
    /// it leaves in place when dropped.
    pub fn start_in(opts: AgentOptions, data_dir: PathBuf) -> anyhow::Result<TestAgent> {
        Self::start_at(opts, data_dir, None)
    }

    fn start_at(
        opts: AgentOptions,
        data_dir: PathBuf,
        tmp: Option<tempfile::TempDir>,
    ) -> anyhow::Result<TestAgent> {
        let host_guard = HostGuard::new();
        std::fs::create_dir_all(&data_dir)?;
        let mut agent = TestAgent {
            opts,
            data_dir,
            _tmp: tmp,
            child: None,
            port: free_port(std::net::Ipv4Addr::LOCALHOST),
            gossip_port: free_port(std::net::Ipv4Addr::LOCALHOST),
            proxy_port: 0,
            host_id: None,
            cluster_ca: None,
            host_guard,
        };
        // A port found free may be taken by a test alongside before the agent binds it:
        // a first start that finds one taken tries fresh ports.
        for attempt in 0.. {
            agent.proxy_port = free_port(agent.opts.proxy_ip);
            match agent.spawn(&[]) {
                Err(err) if attempt < 5 && err.to_string().contains("Address already in use") => {
                    agent.port = free_port(std::net::Ipv4Addr::LOCALHOST);
                    agent.gossip_port = free_port(std::net::Ipv4Addr::LOCALHOST);
                }
                other => return other.map(|()| agent),
            }
        }
        unreachable!("the loop returns")
    }

    /// Starts (again) with extra environment variables for this run only.
    pub fn spawn(&mut self, env: &[(&str, &str)]) -> anyhow::Result<()> {
        anyhow::ensure!(self.child.is_none(), "agent already running");
        let addr_file = self.data_dir.join("api.addr");
        let _ = std::fs::remove_file(&addr_file);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.data_dir.join("agent.log"))?;
        let mut cmd = Command::new(&self.opts.exe);
        cmd.arg("agent")
            .arg("--data-dir")
            .arg(&self.data_dir)
            .arg("--region")
            .arg(&self.opts.region)
            .arg("--listen")
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("--gossip-listen")
            .arg(format!("127.0.0.1:{}", self.gossip_port))
            .arg("--proxy-listen")
            .arg(format!("{}:{}", self.opts.proxy_ip, self.proxy_port))
            .arg("--proxy-tls-listen")
            .arg(format!("{}:0", self.opts.proxy_ip))
            .arg("--cpus")
            .arg(self.opts.cpus.to_string())
            .arg("--memory-mb")
            .arg(self.opts.memory_mb.to_string())
            // Tests pull from a registry on loopback (`images::TestRegistry`).
            .arg("--allow-loopback-registries")
            // Through the environment: a command line shows in `ps`.
            .env("BAZAAR_CLUSTER_SECRET", TEST_SECRET)
            .env("BAZAAR_TOKEN_PUBLIC_KEY", tokens::public_key_hex())
            .args(&self.opts.extra_args)
            .env(
                "BAZAAR_LOG",
                std::env::var("BAZAAR_LOG").unwrap_or_else(|_| "info".into()),
            )
            .env_remove("BAZAAR_CRASH_AT")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        if !self.opts.isolate {
            cmd.arg("--no-isolate");
        }
        for (k, v) in &self.opts.env {
            cmd.env(k, v);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        if let Some(n) = self.opts.open_files {
            use std::os::unix::process::CommandExt;
            let limit = libc::rlimit {
                rlim_cur: n,
                rlim_max: n,
            };
            // SAFETY: between fork and exec the closure only calls setrlimit(2), which is
            // async-signal-safe, on a value copied in.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let log_path = self.data_dir.join("agent.log");
        let mut log_start = std::fs::metadata(&log_path).map_or(0, |m| m.len());
        self.child = Some(cmd.spawn()?);
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut port_retries = 0;
        loop {
            if let Ok(text) = std::fs::read_to_string(&addr_file) {
                if let Ok(addr) = text.trim().parse::<std::net::SocketAddr>() {
                    self.port = addr.port();
                    let gossip = std::fs::read_to_string(self.data_dir.join("gossip.addr"))?;
                    self.gossip_port = gossip.trim().parse::<std::net::SocketAddr>()?.port();
                    if let Ok(p) = std::fs::read_to_string(self.data_dir.join("proxy.addr")) {
                        self.proxy_port = p.trim().parse::<std::net::SocketAddr>()?.port();
                    }
                    if self.host_id.is_none() {
                        // An API served over HTTPS (`--api-tls`): the certificate names it.
                        self.host_id = fetch_host_id(self.port).or_else(|| {
                            let pem = std::fs::read_to_string(
                                self.data_dir.join("tls").join(bazaar_pki::HOST_FILE),
                            )
                            .ok()?;
                            bazaar_pki::host_id_of_pem(&pem)
                        });
                    }
                    break;
                }
            }
            if let Some(child) = self.child.as_mut() {
                if let Some(status) = child.try_wait()? {
                    self.child = None;
                    // A port of a restarted agent still held for a moment after its old
                    // process was reaped (seen twice in CI, holder not yet known): try
                    // again for a second, and say who held it.
                    let this_run = std::fs::read(&log_path).unwrap_or_default();
                    let this_run = String::from_utf8_lossy(
                        this_run.get(log_start as usize..).unwrap_or_default(),
                    );
                    if this_run.contains("Address already in use") && port_retries < 5 {
                        port_retries += 1;
                        eprintln!(
                            "testkit: agent on {} could not bind a port at start ({this_run}); sockets then:\n{}",
                            self.data_dir.display(),
                            sockets_on_ports(&[self.port, self.gossip_port, self.proxy_port])
                        );
                        std::thread::sleep(Duration::from_millis(200));
                        log_start = std::fs::metadata(&log_path).map_or(0, |m| m.len());
                        self.child = Some(cmd.spawn()?);
                        continue;
                    }
                    anyhow::bail!(
                        "agent exited at start ({status}); log:\n{}",
                        self.log_tail()
                    );
                }
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "agent did not start; log:\n{}",
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    /// The directory of the cluster CA this agent holds (the first agent of a cluster
    /// started with certificates).
    pub fn cluster_ca_dir(&self) -> Option<&Path> {
        self.cluster_ca.as_ref().map(|d| d.path())
    }

    /// The address of the agent's host listener (mTLS), when it has a cluster certificate.
    pub fn host_listen_addr(&self) -> Option<std::net::SocketAddr> {
        std::fs::read_to_string(self.data_dir.join("host.addr"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// The address of the proxy's hop listener (mTLS), when the agent has a certificate.
    pub fn proxy_hop_addr(&self) -> Option<std::net::SocketAddr> {
        std::fs::read_to_string(self.data_dir.join("proxy-hop.addr"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// The agent's gossip address (to join through).
    pub fn gossip_addr(&self) -> String {
        format!("127.0.0.1:{}", self.gossip_port)
    }

    /// The address of the agent's edge proxy (`127.0.0.1:<port>` unless `proxy_ip` says).
    pub fn proxy_addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from((self.opts.proxy_ip, self.proxy_port))
    }

    /// The agent's proxy as a base URL (send `Host: <app>.localhost` with requests).
    pub fn proxy_url(&self) -> String {
        format!("http://{}", self.proxy_addr())
    }

    /// The address of the agent's HTTPS proxy listener (a port of its own choosing, read
    /// from `proxy-tls.addr`).
    pub fn proxy_tls_addr(&self) -> anyhow::Result<std::net::SocketAddr> {
        let text = std::fs::read_to_string(self.data_dir.join("proxy-tls.addr"))?;
        Ok(text.trim().parse()?)
    }

    /// The agent's URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// A client with the cluster secret.
    pub fn client(&self) -> HostClient {
        HostClient::new(&self.url(), TEST_SECRET)
    }

    /// The agent's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// True while the process runs.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Waits for the process to exit by itself (e.g. fault injection), up to `within`.
    pub fn wait_exit(&mut self, within: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        while let Some(child) = self.child.as_mut() {
            if child.try_wait()?.is_some() {
                self.child = None;
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "agent still running after {within:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    /// SIGKILLs the agent (its shims and workloads keep running).
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERMs the agent and waits for it to exit.
    pub fn stop(&mut self) -> anyhow::Result<()> {
        if let Some(mut child) = self.child.take() {
            signal(child.id() as i32, libc::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(30);
            while child.try_wait()?.is_none() {
                if Instant::now() > deadline {
                    let _ = child.kill();
                    anyhow::bail!("agent did not stop within 30 s");
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        Ok(())
    }

    /// Restarts after a kill or stop, on the same data and port.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.kill9();
        self.spawn(&[])
    }

    /// The last lines of the agent's log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.data_dir.join("agent.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

impl Drop for TestAgent {
    fn drop(&mut self) {
        // Take the workloads down with the test, and everything the agent made on the host
        // (cgroups, mounts, loop devices, network): thousands of stale cgroups slow every
        // cgroup change on the host, and so every later test and benchmark.
        self.kill9();
        bazaar_agent::cleanup::release_host(&self.data_dir, self.host_id.as_deref());
        // Nothing of it may be left running (a leaked shim keeps its workload alive for good).
        let deadline = Instant::now() + Duration::from_secs(3);
        let mut left = self.leftover_processes();
        while !left.is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
            left = self.leftover_processes();
        }
        if !left.is_empty() && !std::thread::panicking() {
            panic!(
                "processes of the agent on {} still run after it was released: {left:?}",
                self.data_dir.display()
            );
        }
        // Nothing it ran may have changed a host file's owner or mode (issue 31).
        if let Err(changed) = self.host_guard.check() {
            let agent = format!("agent on {}", self.data_dir.display());
            if std::thread::panicking() {
                eprintln!("{agent}: {changed}");
            } else {
                panic!("{agent}: {changed}");
            }
        }
    }
}

impl TestAgent {
    /// Live processes of this agent's host once it is gone: its shims (and their inits),
    /// and whatever is in its cgroups (workloads, containers). Pids with their command line.
    fn leftover_processes(&self) -> Vec<(i32, String)> {
        let mut pids = bazaar_agent::cleanup::processes_of_host(&self.data_dir);
        if let Some(id) = &self.host_id {
            let cgroup = format!("/bazaar/{id}");
            let in_cgroup = |pid: i32| {
                std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
                    .unwrap_or_default()
                    .lines()
                    .any(|l| l.ends_with(&cgroup) || l.contains(&format!("{cgroup}/")))
            };
            let all = std::fs::read_dir("/proc").into_iter().flatten().flatten();
            pids.extend(
                all.filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
                    .filter(|&pid| in_cgroup(pid)),
            );
        }
        pids.sort_unstable();
        pids.dedup();
        pids.into_iter()
            .filter(|&pid| pid_alive(pid))
            .map(|pid| {
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                (pid, String::from_utf8_lossy(&cmdline).replace('\0', " "))
            })
            .collect()
    }
}

/// A port that is free for TCP and UDP on `ip`, picked at random below the kernel's
/// ephemeral range (32768 and up on Linux). An agent restarted on its old ports must find
/// them free: a port the kernel handed out would be fair game for any outgoing connection
/// of the tests running alongside while the agent is down. For the same reason a port is
/// claimed for the life of the test process (`claim_port`): another test must not be
/// handed it while this one's agent is down between a kill and a restart.
pub fn free_port(ip: std::net::Ipv4Addr) -> u16 {
    use std::hash::{BuildHasher, RandomState};
    let free = |p: u16| {
        std::net::TcpListener::bind((ip, p)).is_ok()
            && std::net::UdpSocket::bind((ip, p)).is_ok()
            && claim_port(p)
    };
    let random = RandomState::new();
    for attempt in 0u32..10_000 {
        let port = 20_000 + (random.hash_one(attempt) % 12_000) as u16;
        if free(port) {
            return port;
        }
    }
    panic!("no free port on {ip} between 20000 and 32000");
}

/// What `ss` lists on `ports` (any state, with the owning processes), for diagnostics.
fn sockets_on_ports(ports: &[u16]) -> String {
    let filter = ports
        .iter()
        .map(|p| format!("sport = :{p}"))
        .collect::<Vec<_>>()
        .join(" or ");
    Command::new("ss")
        .args(["-tuanp", &filter])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_else(|e| format!("(ss: {e})"))
}

/// Claims `port` for this process until it exits, across the test processes of the
/// machine: a Unix socket bound to the abstract name `bazaar-test-port-<port>`, which the
/// kernel lets go when the process ends, however it ends, and which leaves no file behind.
/// False when a live process (this one included) holds it.
fn claim_port(port: u16) -> bool {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    static CLAIMED: std::sync::Mutex<Vec<UnixDatagram>> = std::sync::Mutex::new(Vec::new());
    let Ok(name) = SocketAddr::from_abstract_name(claim_name(port)) else {
        return true;
    };
    match UnixDatagram::bind_addr(&name) {
        Ok(socket) => {
            CLAIMED
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(socket);
            true
        }
        Err(err) => err.kind() != std::io::ErrorKind::AddrInUse,
    }
}

/// The abstract socket name that claims `port` ([`claim_port`]).
fn claim_name(port: u16) -> String {
    format!("bazaar-test-port-{port}")
}

/// The host id of the agent listening on `port` (`GET /host/v1/info`), over a plain
/// blocking connection: this runs in sync code that may be inside a tokio runtime.
fn fetch_host_id(port: u16) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET /host/v1/info HTTP/1.1\r\nHost: agent\r\nAuthorization: Bearer {TEST_SECRET}\r\n\
         Connection: close\r\n\r\n"
    )
    .ok()?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).ok()?;
    let (_, body) = answer.split_once("\r\n\r\n")?;
    let info: serde_json::Value = serde_json::from_str(body).ok()?;
    info["id"].as_str().map(str::to_string)
}

/// Starts `n` agents that form one cluster: the first alone, holding a new cluster CA,
/// the others joining it with one-time tokens (hosts call each other, hop and sync over
/// mTLS). `configure` adjusts each agent's options (by index) before it starts.
pub fn start_cluster(
    exe: &Path,
    n: usize,
    configure: impl FnMut(usize, &mut AgentOptions),
) -> anyhow::Result<Vec<TestAgent>> {
    start_cluster_with(exe, n, true, configure)
}

/// [`start_cluster`] without certificates: the hosts authenticate each other with the
/// cluster secret alone, over plain HTTP (the old path, for the tests of it).
pub fn start_plain_cluster(
    exe: &Path,
    n: usize,
    configure: impl FnMut(usize, &mut AgentOptions),
) -> anyhow::Result<Vec<TestAgent>> {
    start_cluster_with(exe, n, false, configure)
}

fn start_cluster_with(
    exe: &Path,
    n: usize,
    certificates: bool,
    mut configure: impl FnMut(usize, &mut AgentOptions),
) -> anyhow::Result<Vec<TestAgent>> {
    let ca_dir = if certificates {
        Some(tempfile::Builder::new().prefix("bazaar-ca-").tempdir()?)
    } else {
        None
    };
    let ca = match &ca_dir {
        Some(dir) => Some(bazaar_pki::ClusterCa::init(dir.path())?),
        None => None,
    };
    let ca_listen = format!("127.0.0.1:{}", free_port(std::net::Ipv4Addr::LOCALHOST));
    let mut agents: Vec<TestAgent> = Vec::new();
    for i in 0..n {
        let mut opts = AgentOptions::new(exe);
        // Fast failure detection for tests.
        opts.extra_args
            .extend(["--dead-after-ms".to_string(), "2000".to_string()]);
        if let Some(first) = agents.first() {
            opts.extra_args.push("--join".into());
            opts.extra_args.push(first.gossip_addr());
        }
        if let (Some(ca), Some(dir)) = (&ca, &ca_dir) {
            if i == 0 {
                opts.extra_args.extend([
                    "--cluster-ca".to_string(),
                    dir.path().display().to_string(),
                    "--host-listen".into(),
                    ca_listen.clone(),
                ]);
            } else {
                let token = ca.new_join_token(Duration::from_secs(600))?;
                opts.extra_args.extend([
                    "--join-addr".to_string(),
                    ca_listen.clone(),
                    "--host-listen".into(),
                    "127.0.0.1:0".into(),
                ]);
                opts.env
                    .push(("BAZAAR_JOIN_TOKEN".to_string(), token.to_string()));
            }
        }
        configure(i, &mut opts);
        agents.push(TestAgent::start(opts)?);
    }
    if let Some(first) = agents.first_mut() {
        first.cluster_ca = ca_dir;
    }
    Ok(agents)
}

/// Sends a signal to a process.
pub fn signal(pid: i32, sig: i32) {
    // SAFETY: kill(2) takes plain integers and touches no memory of ours.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// True if the process exists and is not a zombie.
pub fn pid_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s
            .rsplit_once(')')
            .map(|(_, rest)| !rest.trim_start().starts_with('Z'))
            .unwrap_or(false),
        Err(_) => false,
    }
}

/// Polls `probe` until it returns `Some`, for at most `within`.
pub async fn eventually<T, F, Fut>(within: Duration, mut probe: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + within;
    let mut pause = Duration::from_millis(5);
    loop {
        if let Some(v) = probe().await {
            return Ok(v);
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "condition not met within {within:?}"
        );
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// Whether the synchronous `probe` becomes true within `within` ([`eventually`]'s pacing).
pub async fn holds_within(within: Duration, mut probe: impl FnMut() -> bool) -> bool {
    eventually(within, || {
        let holds = probe();
        async move { holds.then_some(()) }
    })
    .await
    .is_ok()
}

/// A process-machine config running `argv`.
pub fn process_config(argv: &[&str]) -> bazaar_types::config::MachineConfig {
    bazaar_types::config::MachineConfig {
        driver: Some("process".into()),
        image: "process".into(),
        init: Some(bazaar_types::config::InitConfig {
            exec: argv.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A create request for app `app` running `argv`.
pub fn create_request(app: &str, argv: &[&str]) -> bazaar_types::host::ClaimRequest {
    bazaar_types::host::ClaimRequest {
        app: app.into(),
        app_id: String::new(),
        name: None,
        region: None,
        config: process_config(argv),
        skip_launch: false,
        machine_id: None,
        lease_ttl: None,
        skip_service_registration: false,
        placement: None,
        epoch: 0,
        displaced_from: None,
    }
}

/// The variable that turns a root-only test's skip into a failure. `.ci/run` sets it: CI
/// runs as root, and a CI run that is not must fail loudly rather than pass tests it did
/// not run.
pub const REQUIRE_ROOT_VAR: &str = "BAZAAR_TESTS_REQUIRE_ROOT";

/// Whether a test that needs `what` (root, cgroups, ...) can run: true when `available`.
/// Otherwise it says why it skips and returns false, or panics when [`REQUIRE_ROOT_VAR`]
/// is set.
pub fn can_run(available: bool, what: &str) -> bool {
    if available {
        return true;
    }
    assert!(
        std::env::var_os(REQUIRE_ROOT_VAR).is_none(),
        "this test needs {what}, and {REQUIRE_ROOT_VAR} is set (CI runs as root)"
    );
    eprintln!("skipped: needs {what}");
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Claims `port` as another test process would (`None` if one already has).
    fn hold_elsewhere(port: u16) -> Option<std::os::unix::net::UnixDatagram> {
        use std::os::linux::net::SocketAddrExt;
        let name = std::os::unix::net::SocketAddr::from_abstract_name(claim_name(port)).ok()?;
        std::os::unix::net::UnixDatagram::bind_addr(&name).ok()
    }

    #[test]
    fn a_port_is_handed_out_once_across_test_processes() {
        let port = free_port(std::net::Ipv4Addr::LOCALHOST);
        // Not again to this process, though nothing listens on it.
        assert!(!claim_port(port));
        // Not to a port another process claimed, and free again once that one is gone.
        let (other, held) = (20_000..32_000)
            .filter(|p| *p != port && std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
            .find_map(|p| Some((p, hold_elsewhere(p)?)))
            .unwrap();
        assert!(!claim_port(other));
        drop(held);
        assert!(claim_port(other));
    }
}
