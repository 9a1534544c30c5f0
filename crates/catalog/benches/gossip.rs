//! Catalog benchmark: change propagation latency, steady-state gossip bandwidth and replica
//! memory, with every node in this one process on 127.0.0.1.
//!
//! Run: `cargo bench -p bazaar-catalog --bench gossip`
//! Knobs (environment): `BENCH_SIZES` (default `10,50,200`), `BENCH_CHANGES` (20),
//! `BENCH_WINDOW_SECS` (10, the bandwidth measurement window).
//!
//! Prints Markdown tables.

use bazaar_catalog::replica::{Record, Replica, Row};
use bazaar_catalog::trust::Seal;
use bazaar_catalog::{
    Catalog, CatalogConfig, CatalogStats, CheckRecord, HostRecord, MachineRecord, ServiceRecord,
};
use bazaar_types::config::MachineService;
use rand::Rng;
use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant};

/// Counts live heap bytes, to measure the replica's footprint.
struct Counting;

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const SECRET: &str = "bench-secret";

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else to parse.
    let sizes: Vec<usize> = std::env::var("BENCH_SIZES")
        .unwrap_or_else(|_| "10,50,200".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let changes: usize = env_or("BENCH_CHANGES", 20);
    let window = Duration::from_secs(env_or("BENCH_WINDOW_SECS", 10));
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());

    println!("# bazaar-catalog gossip benchmark\n");
    println!(
        "All nodes in one process on 127.0.0.1, tokio multi-thread runtime, {cores} cores. \
         Default timings: probe 1 s, dead_after 8 s, anti-entropy 2 s (fanout 2), 1400-byte datagrams.\n"
    );

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");

    println!("## Change propagation (publish on a random node until every node has it)\n");
    println!("Measured once the cluster has formed and settled (no broadcast backlog).\n");
    println!("| nodes | changes | p50 | p99 | max | cluster formed and settled in |");
    println!("|---:|---:|---:|---:|---:|---:|");
    let mut bandwidth_rows = Vec::new();
    for &n in &sizes {
        rt.block_on(async {
            let started = Instant::now();
            let nodes = start_cluster(n).await;
            let formed = started.elapsed();
            let mut samples = propagation(&nodes, changes).await;
            samples.sort();
            println!(
                "| {n} | {} | {} | {} | {} | {:.1} s |",
                samples.len(),
                ms(percentile(&samples, 0.50)),
                ms(percentile(&samples, 0.99)),
                ms(*samples.last().unwrap_or(&Duration::ZERO)),
                formed.as_secs_f64()
            );
            if n == *sizes.iter().max().unwrap_or(&0) {
                for per_host in per_host_counts() {
                    let row = bandwidth(&nodes, per_host, window).await;
                    eprintln!("  measured: {row}");
                    bandwidth_rows.push(row);
                }
            }
            for node in &nodes {
                node.kill().await;
            }
        });
    }

    if !bandwidth_rows.is_empty() {
        println!("\n## Steady-state gossip bandwidth per node (no changes during the window)\n");
        println!(
            "| nodes | machines per host | rows per replica | converged in | CPU µs per row merged | UDP sent B/s | TCP sent B/s | total sent B/s | received B/s |"
        );
        println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for r in &bandwidth_rows {
            println!("{r}");
        }
    }

    println!("\n## Replica memory\n");
    println!("| machine rows | replica heap bytes | bytes per row | per 10,000 rows | of which the records alone |");
    println!("|---:|---:|---:|---:|---:|");
    for rows in [10_000usize, 50_000] {
        let bytes = replica_heap(rows);
        let records = records_heap(rows);
        println!(
            "| {rows} | {bytes} | {} | {} MiB | {} MiB |",
            bytes / rows,
            mib(bytes as f64 / rows as f64 * 10_000.0),
            mib(records as f64 / rows as f64 * 10_000.0),
        );
    }
}

/// Machines per host for the bandwidth runs (`BENCH_MACHINES`, default `10,50`).
fn per_host_counts() -> Vec<usize> {
    std::env::var("BENCH_MACHINES")
        .unwrap_or_else(|_| "10,50".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect()
}

fn config(id: &str, seeds: Vec<SocketAddr>) -> CatalogConfig {
    let mut c = CatalogConfig::new(id, "ams", "127.0.0.1:0".parse().expect("addr"), SECRET);
    c.seeds = seeds;
    c
}

async fn start_cluster(n: usize) -> Vec<Catalog> {
    let mut nodes: Vec<Catalog> = Vec::with_capacity(n);
    for i in 0..n {
        // Join through up to three earlier nodes.
        let seeds = nodes.iter().take(3).map(Catalog::local_addr).collect();
        let c = Catalog::start(config(&format!("node-{i:03}"), seeds))
            .await
            .expect("start");
        c.publish_host(host_record(c.node_id()));
        nodes.push(c);
    }
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let ready = nodes.iter().all(|c| {
            let s = c.stats();
            s.alive_members as usize == n - 1 && c.hosts().len() == n
        });
        if ready {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the {n}-node cluster did not form"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    settle(&nodes).await;
    nodes
}

/// Waits until foca has finished retransmitting every broadcast (a settled cluster).
async fn settle(nodes: &[Catalog]) {
    let deadline = Instant::now() + Duration::from_secs(180);
    while nodes.iter().any(|n| n.stats().broadcast_backlog > 0) {
        assert!(Instant::now() < deadline, "broadcasts did not drain");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Publishes `changes` machine updates, one at a time on a random node, and returns how
/// long each took to be visible on every node.
async fn propagation(nodes: &[Catalog], changes: usize) -> Vec<Duration> {
    let mut samples = Vec::with_capacity(changes);
    for k in 0..changes {
        let origin = &nodes[rand::rng().random_range(0..nodes.len())];
        let id = format!("probe-{k}");
        let start = Instant::now();
        origin.publish_machine(machine_record(&id, origin.node_id(), "started"));
        let version = origin.machine(&id).expect("own row").version;
        let mut pending: Vec<&Catalog> = nodes.iter().collect();
        while !pending.is_empty() {
            pending.retain(|n| n.machine(&id).is_none_or(|m| m.version < version));
            if start.elapsed() > Duration::from_secs(30) {
                panic!("change {k} did not reach {} nodes", pending.len());
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        samples.push(start.elapsed());
        // Let the dissemination of this change settle before the next one.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    samples
}

/// Publishes up to `per_host` machines on every node, waits for convergence and for the
/// broadcasts to drain, then measures traffic over `window`.
async fn bandwidth(nodes: &[Catalog], per_host: usize, window: Duration) -> String {
    let cpu_before = process_cpu();
    let merged_before: u64 = nodes.iter().map(|n| n.stats().rows_merged).sum();
    for node in nodes {
        for i in 0..per_host {
            let id = format!("{}-m{i:03}", node.node_id());
            if node.machine(&id).is_none() {
                node.publish_machine(machine_record(&id, node.node_id(), "started"));
            }
        }
    }
    let started = Instant::now();
    let mut last_report = Instant::now();
    loop {
        let digests: std::collections::HashSet<String> =
            nodes.iter().map(Catalog::digest).collect();
        if digests.len() == 1 {
            break;
        }
        if last_report.elapsed() > Duration::from_secs(5) {
            let stats: Vec<CatalogStats> = nodes.iter().map(Catalog::stats).collect();
            eprintln!(
                "  converging ({:.0} s): {} distinct digests, rows min {} max {}, syncs {} (pulls {}) failed {}, alive min {}, backlog max {}",
                started.elapsed().as_secs_f64(),
                digests.len(),
                stats.iter().map(|s| s.rows).min().unwrap_or(0),
                stats.iter().map(|s| s.rows).max().unwrap_or(0),
                stats.iter().map(|s| s.syncs).sum::<u64>(),
                stats.iter().map(|s| s.pulls).sum::<u64>(),
                stats.iter().map(|s| s.syncs_failed).sum::<u64>(),
                stats.iter().map(|s| s.alive_members).min().unwrap_or(0),
                stats.iter().map(|s| s.broadcast_backlog).max().unwrap_or(0),
            );
            last_report = Instant::now();
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "no convergence with {per_host} machines per host"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let converged = started.elapsed();
    let merged = nodes.iter().map(|n| n.stats().rows_merged).sum::<u64>() - merged_before;
    let cpu_per_row = (process_cpu() - cpu_before).as_secs_f64() * 1e6 / merged.max(1) as f64;
    // foca keeps retransmitting fresh broadcasts for a while; let that finish.
    settle(nodes).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before: Vec<CatalogStats> = nodes.iter().map(Catalog::stats).collect();
    tokio::time::sleep(window).await;
    let after: Vec<CatalogStats> = nodes.iter().map(Catalog::stats).collect();
    let secs = window.as_secs_f64() * nodes.len() as f64;
    let sum = |f: fn(&CatalogStats) -> u64| {
        before
            .iter()
            .zip(&after)
            .map(|(b, a)| f(a) - f(b))
            .sum::<u64>() as f64
            / secs
    };
    let udp = sum(|s| s.udp_bytes_sent);
    let tcp = sum(|s| s.tcp_bytes_sent);
    let received = sum(|s| s.udp_bytes_received + s.tcp_bytes_received);
    let rows = nodes[0].stats().rows;
    format!(
        "| {} | {per_host} | {rows} | {:.0} s | {cpu_per_row:.0} | {udp:.0} | {tcp:.0} | {:.0} | {received:.0} |",
        nodes.len(),
        converged.as_secs_f64(),
        udp + tcp
    )
}

/// CPU time (user and system) this process has used, from `/proc/self/stat`.
fn process_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // Fields after the command name (which may hold spaces): utime and stime are the
    // 12th and 13th, in clock ticks (100 per second on Linux).
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let ticks: u64 =
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    Duration::from_millis(ticks * 10)
}

/// Heap bytes held by a replica of `rows` realistic machine rows (over 100 hosts).
fn replica_heap(rows: usize) -> usize {
    let make = |i: usize| {
        let owner = format!("host-{:03}", i % 100);
        let record = machine_record(&format!("machine-{i:06}"), &owner, "started");
        // A row holds its owner's seal: the key and the signature (the signed JSON only
        // when encoding the record again would differ).
        let seal = Seal::default();
        Row {
            owner,
            version: 1_700_000_000_000_000 + i as u64,
            deleted: false,
            updated_at_ms: 1_700_000_000_000,
            record: Record::Machine(record),
            seal,
        }
    };
    let before = LIVE_BYTES.load(Ordering::Relaxed);
    let mut replica = Replica::new();
    for i in 0..rows {
        replica.apply(make(i));
    }
    let after = LIVE_BYTES.load(Ordering::Relaxed);
    assert_eq!(replica.len(), rows);
    drop(replica);
    (after - before).max(0) as usize
}

/// Heap bytes of the same machine records in a plain `Vec` (the data itself).
fn records_heap(rows: usize) -> usize {
    let before = LIVE_BYTES.load(Ordering::Relaxed);
    let records: Vec<MachineRecord> = (0..rows)
        .map(|i| {
            machine_record(
                &format!("machine-{i:06}"),
                &format!("host-{:03}", i % 100),
                "started",
            )
        })
        .collect();
    let after = LIVE_BYTES.load(Ordering::Relaxed);
    drop(records);
    (after - before).max(0) as usize
}

fn mib(bytes: f64) -> String {
    format!("{:.1}", bytes / (1024.0 * 1024.0))
}

fn host_record(id: &str) -> HostRecord {
    HostRecord {
        id: id.into(),
        region: "ams".into(),
        api_addr: "127.0.0.1:4280".into(),
        capacity: bazaar_types::host::Resources {
            cpus: 16,
            memory_mb: 65_536,
        },
        free: bazaar_types::host::Resources {
            cpus: 12,
            memory_mb: 40_000,
        },
        ..Default::default()
    }
}

/// A machine row of typical size: one HTTP service, one check, a little metadata.
fn machine_record(id: &str, host: &str, state: &str) -> MachineRecord {
    let service: MachineService = serde_json::from_value(serde_json::json!({
        "protocol": "tcp",
        "internal_port": 8080,
        "ports": [{"port": 443, "handlers": ["tls", "http"]}, {"port": 80, "handlers": ["http"]}],
        "concurrency": {"type": "requests", "soft_limit": 20, "hard_limit": 25},
        "autostart": true,
        "autostop": true,
    }))
    .expect("service");
    MachineRecord {
        resources: Default::default(),
        id: id.into(),
        app: format!("app-{}", id.len() % 7),
        app_id: String::new(),
        name: format!("{id}-name"),
        region: "ams".into(),
        host_id: host.into(),
        state: state.into(),
        instance_id: "01J9ZZZZZZZZZZZZZZZZZZZZZZ".into(),
        private_ip: None,
        services: vec![ServiceRecord {
            service,
            address: "10.0.0.12".into(),
            port: 31_337,
        }],
        checks: vec![CheckRecord {
            name: "http".into(),
            status: "passing".into(),
            output: "200 OK".into(),
            updated_at_ms: 1_700_000_000_000,
        }],
        cordoned: false,
        metadata: BTreeMap::from([("fly_process_group".into(), "app".into())]),
        updated_at_ms: 1_700_000_000_000,
        epoch: 0,
        config: None,
        displaced_by: None,
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[idx]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}
