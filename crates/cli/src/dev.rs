//! `bazaar dev`: a working local cluster with nothing to install. Starts N agents as child
//! processes on loopback (API ports from `--base-port`), writes `DIR/dev.env` with the URLs
//! and tokens, and stops everything on Ctrl-C or SIGTERM, removing what its hosts made on
//! the machine outside their data dirs (network, mounts, loop devices, cgroups; see
//! `bazaar_agent::cleanup`). Running it again on the same
//! directory resumes the same cluster: same hosts, same machines (restarted if they were
//! running).

use anyhow::Context;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

/// Flags of `bazaar dev`.
#[derive(Debug, clap::Args)]
pub struct DevArgs {
    /// Number of hosts (agents).
    #[arg(long, default_value_t = 3)]
    hosts: usize,
    /// Regions, assigned to hosts in turn (e.g. `ams,ord`).
    #[arg(long, default_value = "local", value_delimiter = ',')]
    regions: Vec<String>,
    /// Where the cluster keeps its state.
    #[arg(long, default_value = ".bazaar-dev")]
    data_dir: PathBuf,
    /// API port of the first host; host i listens on base + i.
    #[arg(long, default_value_t = 4280)]
    base_port: u16,
    /// Gossip port of the first host; host i gossips on base + i.
    #[arg(long, default_value_t = 4380)]
    gossip_port: u16,
    /// Proxy port of the first host; host i's proxy listens on base + i.
    #[arg(long, default_value_t = 8080)]
    proxy_port: u16,
    /// HTTPS port of the first host's proxy; host i's listens on base + i.
    #[arg(long, default_value_t = 8443)]
    proxy_tls_port: u16,
    /// Host listener (mTLS between hosts) of the first host; host i listens on base + i.
    #[arg(long, default_value_t = 4480)]
    host_port: u16,
    /// Internal DNS of the first host (UDP and TCP); host i answers on base + i.
    #[arg(long, default_value_t = 4580)]
    dns_port: u16,
    /// Proxy hop listener (mTLS, other hosts' proxies) of the first host; host i listens
    /// on base + i.
    #[arg(long, default_value_t = 4680)]
    proxy_hop_port: u16,
    /// Memory (MB) each host offers; default: what this machine has.
    #[arg(long)]
    memory_mb: Option<u64>,
    /// CPUs each host offers; default: detected × overcommit.
    #[arg(long)]
    cpus: Option<u32>,
    /// Serve the Machines API over HTTPS with certificates of the cluster CA (dev.env
    /// then gives https URLs and `BAZAAR_CA_CERT`).
    #[arg(long)]
    api_tls: bool,
}

/// What `dev` remembers between runs.
#[derive(Debug, Serialize, Deserialize)]
struct DevState {
    /// The legacy token in `api-tokens` (still accepted).
    token: String,
    cluster_secret: String,
    /// The org token signed by `cluster-token-key`, written to dev.env (dev dirs made
    /// before scoped tokens get one on their next start).
    #[serde(default)]
    org_token: Option<String>,
}

/// Runs the dev cluster until Ctrl-C / SIGTERM.
pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    // Before anything else: a Ctrl-C or SIGTERM during start-up must stop the cluster
    // cleanly, not kill `dev` and orphan its agents.
    let stop = crate::shutdown_signal();
    anyhow::ensure!(
        (1..=64).contains(&args.hosts),
        "--hosts must be between 1 and 64"
    );
    for r in &args.regions {
        bazaar_types::ids::validate_name("region", r).map_err(anyhow::Error::msg)?;
    }
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("creating {}", args.data_dir.display()))?;
    let dir = std::fs::canonicalize(&args.data_dir)?;
    let mut state = load_or_create_state(&dir)?;
    // The cluster token key: its private half stays here, the agents get the public half.
    let token_key = dir.join("cluster-token-key");
    crate::token_cmd::init_key(&token_key)?;
    let org_token = match &state.org_token {
        Some(t) => t.clone(),
        None => {
            let key =
                bazaar_auth::TokenKey::from_private_hex(&std::fs::read_to_string(&token_key)?)?;
            let token = bazaar_auth::mint(&key, &bazaar_auth::Scope::default())?;
            state.org_token = Some(token.clone());
            bazaar_agent::secrets::write_private(
                &dir.join("dev.json"),
                &serde_json::to_string_pretty(&state)?,
            )?;
            token
        }
    };
    // dev.env appears only once the cluster answers.
    let _ = std::fs::remove_file(dir.join("dev.env"));
    // Kept across runs: it holds the revocations (`bazaar token revoke`).
    let token_file = dir.join("api-tokens");
    if !token_file.exists() {
        bazaar_agent::secrets::write_private(&token_file, &format!("{}\n", state.token))?;
    }
    let exe = std::env::current_exe()?;
    // The cluster's CA, held by host 0; the others join with one-time tokens (once: a
    // host keeps its certificate in its data dir and renews it).
    let ca_dir = dir.join("ca");
    let ca = match bazaar_pki::ClusterCa::open(&ca_dir) {
        Ok(ca) => ca,
        Err(_) => bazaar_pki::ClusterCa::init(&ca_dir)?,
    };
    let host_listen = |j: usize| format!("127.0.0.1:{}", args.host_port as usize + j);
    let mut children = Vec::new();
    for i in 0..args.hosts {
        let region = &args.regions[i % args.regions.len()];
        let host_dir = dir.join(format!("host-{i}"));
        std::fs::create_dir_all(&host_dir)?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(host_dir.join("agent.log"))?;
        let port = args
            .base_port
            .checked_add(i as u16)
            .context("port out of range")?;
        let gossip = |j: usize| format!("127.0.0.1:{}", args.gossip_port as usize + j);
        let seeds: Vec<String> = (0..args.hosts).filter(|j| *j != i).map(gossip).collect();
        let mut cmd = tokio::process::Command::new(&exe);
        cmd.arg("agent").arg("--gossip-listen").arg(gossip(i));
        if !seeds.is_empty() {
            cmd.arg("--join").arg(seeds.join(","));
        }
        cmd.arg("--data-dir")
            .arg(&host_dir)
            .arg("--region")
            .arg(region)
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--proxy-listen")
            .arg(format!("127.0.0.1:{}", args.proxy_port as usize + i))
            .arg("--proxy-tls-listen")
            .arg(format!("127.0.0.1:{}", args.proxy_tls_port as usize + i))
            .arg("--dns-listen")
            .arg(format!("127.0.0.1:{}", args.dns_port as usize + i))
            .arg("--proxy-hop-listen")
            .arg(format!("127.0.0.1:{}", args.proxy_hop_port as usize + i))
            .arg("--token-file")
            .arg(&token_file)
            .arg("--token-public-key-file")
            .arg(crate::token_cmd::public_key_path(&token_key))
            .arg("--stop-machines-on-shutdown")
            // A local cluster pulls from a local registry (`docker run registry`).
            .arg("--allow-loopback-registries")
            .env("BAZAAR_CLUSTER_SECRET", &state.cluster_secret)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            // Ctrl-C in the terminal must reach only `dev`, which stops agents in order.
            .process_group(0)
            .kill_on_drop(true);
        cmd.arg("--host-listen").arg(host_listen(i));
        if i == 0 {
            cmd.arg("--cluster-ca").arg(&ca_dir);
        } else {
            cmd.arg("--join-addr").arg(host_listen(0));
            if !host_dir.join("tls").join(bazaar_pki::HOST_FILE).exists() {
                let token = ca.new_join_token(std::time::Duration::from_secs(600))?;
                cmd.env("BAZAAR_JOIN_TOKEN", token.to_string());
            }
        }
        if args.api_tls {
            cmd.arg("--api-tls");
        }
        if let Some(m) = args.memory_mb {
            cmd.arg("--memory-mb").arg(m.to_string());
        }
        if let Some(c) = args.cpus {
            cmd.arg("--cpus").arg(c.to_string());
        }
        let child = cmd.spawn().context("starting an agent")?;
        children.push((i, port, region.clone(), child));
    }
    let scheme = if args.api_tls { "https" } else { "http" };
    let api_url = format!("{scheme}://127.0.0.1:{}", args.base_port);
    let proxy_url = format!("http://127.0.0.1:{}", args.proxy_port);
    let proxy_tls_url = format!("https://127.0.0.1:{}", args.proxy_tls_port);
    let ca_cert = ca_dir.join("ca.crt");
    // With --api-tls, health is asked over HTTPS, trusting the cluster CA only.
    let https = if args.api_tls {
        let pem = std::fs::read(&ca_cert)?;
        Some(
            reqwest::Client::builder()
                .tls_certs_only(reqwest::Certificate::from_pem_bundle(&pem)?)
                .timeout(Duration::from_secs(2))
                .build()?,
        )
    } else {
        None
    };
    for (i, port, _, child) in children.iter_mut() {
        wait_healthy(*port, child, https.as_ref())
            .await
            .with_context(|| {
                format!(
                    "host {i} did not start; see {}",
                    dir.join(format!("host-{i}/agent.log")).display()
                )
            })?;
    }
    let mut env = format!(
        "BAZAAR_API_URL={api_url}\nBAZAAR_PROXY_URL={proxy_url}\nBAZAAR_PROXY_TLS_URL={proxy_tls_url}\nBAZAAR_TOKEN={}\nBAZAAR_CLUSTER_SECRET={}\n",
        org_token, state.cluster_secret
    );
    if args.api_tls {
        env.push_str(&format!("BAZAAR_CA_CERT={}\n", ca_cert.display()));
    }
    bazaar_agent::secrets::write_private(&dir.join("dev.env"), &env)?;
    println!(
        "bazaar dev cluster: {} host(s) in {}",
        args.hosts,
        dir.display()
    );
    for (i, port, region, _) in &children {
        println!("  host-{i}  region {region:<8} {scheme}://127.0.0.1:{port}");
    }
    println!("BAZAAR_API_URL={api_url}");
    println!(
        "BAZAAR_PROXY_URL={proxy_url}  (apps at http://<app>.localhost:{})",
        args.proxy_port
    );
    println!("BAZAAR_PROXY_TLS_URL={proxy_tls_url}  (hostnames attached with `bazaar certs add`)");
    println!("BAZAAR_TOKEN={org_token}");
    println!(
        "internal DNS: dig @127.0.0.1 -p {} <app>.internal",
        args.dns_port
    );
    println!("dashboard: {api_url}/ui/#token={org_token}");
    println!(
        "written to {}; load it with: set -a; . {}; set +a",
        dir.join("dev.env").display(),
        dir.join("dev.env").display()
    );
    println!("press Ctrl-C to stop");

    let pids: Vec<(usize, u32)> = children
        .iter()
        .filter_map(|(i, _, _, c)| c.id().map(|pid| (*i, pid)))
        .collect();
    // `kill -9 $(cat DIR/host-N/agent.pid)` shows what the others do when a host dies.
    for (i, pid) in &pids {
        std::fs::write(dir.join(format!("host-{i}/agent.pid")), format!("{pid}\n"))?;
    }
    let mut running = tokio::task::JoinSet::new();
    for (i, _, _, mut child) in children {
        running.spawn(async move { (i, child.wait().await) });
    }
    // A host that dies leaves the others running (as in a real cluster); the cluster stops
    // on Ctrl-C / SIGTERM, or when no host is left.
    tokio::pin!(stop);
    let mut exited_hosts = Vec::new();
    loop {
        tokio::select! {
            () = &mut stop => {
                println!("stopping the cluster...");
                break;
            }
            exited = running.join_next() => match exited {
                Some(Ok((i, status))) => {
                    exited_hosts.push(i);
                    eprintln!(
                        "host-{i} exited ({}); the other hosts keep running",
                        status.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string())
                    );
                }
                _ => {
                    eprintln!("every host has exited; stopping");
                    break;
                }
            },
        }
    }
    // (Not to a host that exited: its pid may be another process's by now.)
    let pids: Vec<(usize, u32)> = pids
        .into_iter()
        .filter(|(i, _)| !exited_hosts.contains(i))
        .collect();
    for (_, pid) in &pids {
        send_signal(*pid, libc::SIGTERM);
    }
    let all_stopped = async { while running.join_next().await.is_some() {} };
    if tokio::time::timeout(Duration::from_secs(30), all_stopped)
        .await
        .is_err()
    {
        eprintln!("some hosts did not stop in 30 s; killing them");
        for (_, pid) in &pids {
            send_signal(*pid, libc::SIGKILL);
        }
    }
    // What the hosts made on this machine (network, mounts, loop devices, cgroups) goes
    // with them; their data stays, so the next run resumes the cluster.
    for i in 0..args.hosts {
        let host_dir = dir.join(format!("host-{i}"));
        let host_id = bazaar_agent::cleanup::host_id_of(&host_dir).unwrap_or_else(|err| {
            eprintln!("host-{i}: {err}");
            None
        });
        bazaar_agent::cleanup::release_host(&host_dir, host_id.as_deref());
    }
    println!(
        "stopped; run `bazaar dev --data-dir {}` again to resume",
        args.data_dir.display()
    );
    Ok(())
}

fn send_signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) takes plain integers and touches no memory of ours.
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

fn load_or_create_state(dir: &Path) -> anyhow::Result<DevState> {
    let path = dir.join("dev.json");
    if let Ok(text) = std::fs::read_to_string(&path) {
        return serde_json::from_str(&text).with_context(|| format!("reading {}", path.display()));
    }
    let state = DevState {
        token: bazaar_types::ids::new_secret(20),
        cluster_secret: bazaar_types::ids::new_secret(24),
        org_token: None,
    };
    bazaar_agent::secrets::write_private(&path, &serde_json::to_string_pretty(&state)?)?;
    Ok(state)
}

async fn wait_healthy(
    port: u16,
    child: &mut tokio::process::Child,
    https: Option<&reqwest::Client>,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            anyhow::bail!("agent exited with {status}");
        }
        if let Some(https) = https {
            let health = https
                .get(format!("https://127.0.0.1:{port}/health"))
                .send()
                .await;
            if health.is_ok_and(|r| r.status().is_success()) {
                return Ok(());
            }
        } else if let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let _ = s
                .write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .await;
            let mut buf = Vec::new();
            let _ = s.read_to_end(&mut buf).await;
            if buf.starts_with(b"HTTP/1.1 200") {
                return Ok(());
            }
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "no answer on port {port} within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
