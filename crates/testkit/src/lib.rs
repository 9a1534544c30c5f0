//! Test kit: starts real `bazaar agent` processes on loopback ports with temporary data
//! directories, so tests and benchmarks can create machines through the host interface,
//! SIGKILL an agent at any moment and start it again on the same data and port.

mod fly;
pub mod images;

pub use fly::Fly;

use bazaar_client::HostClient;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The cluster secret test agents share.
pub const TEST_SECRET: &str = "test-cluster-secret-0123456789";

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
}

impl TestAgent {
    /// Starts an agent on a fresh temporary directory and a free port.
    pub fn start(opts: AgentOptions) -> anyhow::Result<TestAgent> {
        let tmp = tempfile::Builder::new().prefix("bazaar-test-").tempdir()?;
        let data_dir = tmp.path().to_path_buf();
        let mut agent = TestAgent {
            opts,
            data_dir,
            _tmp: Some(tmp),
            child: None,
            port: free_port(std::net::Ipv4Addr::LOCALHOST),
            gossip_port: free_port(std::net::Ipv4Addr::LOCALHOST),
            proxy_port: 0,
            host_id: None,
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
            .arg("--cpus")
            .arg(self.opts.cpus.to_string())
            .arg("--memory-mb")
            .arg(self.opts.memory_mb.to_string())
            .arg("--cluster-secret")
            .arg(TEST_SECRET)
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
        self.child = Some(cmd.spawn()?);
        let deadline = Instant::now() + Duration::from_secs(20);
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
                        self.host_id = fetch_host_id(self.port);
                    }
                    break;
                }
            }
            if let Some(child) = self.child.as_mut() {
                if let Some(status) = child.try_wait()? {
                    self.child = None;
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
        // Take the workloads down with the test: stop the agent, kill any shim left, and
        // remove the machines' cgroups (thousands of stale ones slow every cgroup change on
        // the host, and so every later test and benchmark).
        self.kill9();
        kill_shims_under(&self.data_dir);
        if let Some(host_id) = &self.host_id {
            remove_cgroups(host_id, &self.data_dir);
        }
        remove_machine_network_and_mounts(&self.data_dir);
        if let Some(host_id) = &self.host_id {
            remove_runtime_dir(host_id);
        }
    }
}

/// Removes what image machines leave on the host outside the data dir: their network
/// namespaces and the user namespaces owning them, the agent's bridge and firewall tables,
/// and mounts (overlay root filesystems) below the data dir.
fn remove_machine_network_and_mounts(data_dir: &Path) {
    let run = |program: &str, args: &[&str]| {
        let _ = Command::new(program)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    };
    let network = std::fs::read_to_string(data_dir.join("network")).unwrap_or_default();
    if let Some(bridge) = network.lines().nth(1).filter(|b| b.starts_with("bz-")) {
        // The agent's namespaces are `<bridge>-<index>`.
        let prefix = format!("{bridge}-");
        for e in std::fs::read_dir("/run/netns")
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(&prefix) {
                run("ip", &["netns", "delete", &name]);
                let _ = std::fs::remove_file(Path::new("/run/bazaar/netns-ready").join(&name));
            }
        }
        // And the user namespaces that own them.
        for e in std::fs::read_dir("/run/bazaar/userns")
            .into_iter()
            .flatten()
            .flatten()
        {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                run("umount", &["-l", &e.path().display().to_string()]);
                let _ = std::fs::remove_file(e.path());
            }
        }
        run("ip", &["link", "delete", bridge]);
        let table = format!("bazaar_{}", bridge.replace('-', "_"));
        run("nft", &["delete", "table", "ip", &table]);
        run("nft", &["delete", "table", "bridge", &table]);
    }
    let prefix = format!("{}/", data_dir.display());
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let mut targets: Vec<&str> = mounts
        .lines()
        .filter_map(|l| l.split(' ').nth(1))
        .filter(|t| t.starts_with(&prefix))
        .collect();
    targets.sort_by_key(|t| std::cmp::Reverse(t.len()));
    for t in targets {
        run("umount", &["-l", t]);
    }
}

/// Removes an agent's `/run/bazaar/<host id>` (where its image machines' root filesystems
/// are mounted for runc) and the id ranges its machines claimed.
fn remove_runtime_dir(host_id: &str) {
    let dir = Path::new("/run/bazaar").join(host_id);
    let prefix = format!("{}/", dir.display());
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    for t in mounts
        .lines()
        .filter_map(|l| l.split(' ').nth(1))
        .filter(|t| t.starts_with(&prefix))
    {
        let _ = Command::new("umount")
            .args(["-l", t])
            .stderr(Stdio::null())
            .status();
    }
    let _ = std::fs::remove_dir_all(&dir);
    let holder = format!("{host_id}/");
    for claim in std::fs::read_dir("/run/bazaar/idranges")
        .into_iter()
        .flatten()
        .flatten()
    {
        if std::fs::read_to_string(claim.path()).is_ok_and(|h| h.starts_with(&holder)) {
            let _ = std::fs::remove_file(claim.path());
        }
    }
}

/// A port that is free for TCP and UDP on `ip`, picked at random below the kernel's
/// ephemeral range (32768 and up on Linux). An agent restarted on its old ports must find
/// them free: a port the kernel handed out would be fair game for any outgoing connection
/// of the tests running alongside while the agent is down.
pub fn free_port(ip: std::net::Ipv4Addr) -> u16 {
    use std::hash::{BuildHasher, RandomState};
    let free = |p: u16| {
        std::net::TcpListener::bind((ip, p)).is_ok() && std::net::UdpSocket::bind((ip, p)).is_ok()
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

/// Removes the cgroups of a test agent's machines and of the agent itself
/// (`bazaar/<host id>/<machine id>` in every hierarchy, as the agent's driver names them).
fn remove_cgroups(host_id: &str, data_dir: &Path) {
    let Ok(machines) = std::fs::read_dir(data_dir.join("machines")) else {
        return;
    };
    for m in machines.flatten() {
        let id = m.file_name().to_string_lossy().into_owned();
        let _ = bazaar_shim::remove_cgroup(&format!("bazaar/{host_id}/{id}"));
    }
    let _ = bazaar_shim::remove_cgroup(&format!("bazaar/{host_id}"));
}

/// Starts `n` agents that form one cluster: the first alone, the others joining it.
/// `configure` adjusts each agent's options (by index) before it starts.
pub fn start_cluster(
    exe: &Path,
    n: usize,
    mut configure: impl FnMut(usize, &mut AgentOptions),
) -> anyhow::Result<Vec<TestAgent>> {
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
        configure(i, &mut opts);
        agents.push(TestAgent::start(opts)?);
    }
    Ok(agents)
}

/// Kills every process whose command line mentions `dir` (the shims of a test agent).
pub fn kill_shims_under(dir: &Path) {
    let needle = dir.display().to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(" shim ") && cmdline.contains(&needle) {
            signal(pid, libc::SIGKILL);
        }
    }
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
        name: None,
        region: None,
        config: process_config(argv),
        skip_launch: false,
        machine_id: None,
        lease_ttl: None,
        skip_service_registration: false,
        placement: None,
    }
}
