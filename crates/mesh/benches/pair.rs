//! Device benchmark: two mesh devices in two network namespaces joined by a veth pair (the
//! underlay); one TCP stream from the first to the second through both devices, against the
//! same stream over the veth alone, alternated. Run as root:
//! `cargo bench -p bazaar-mesh --bench pair` (`BAZAAR_BENCH_MIB`, default 1024, per stream).

#[path = "../tests/pair/mod.rs"]
mod pair;

fn main() {
    let mib: u64 = std::env::var("BAZAAR_BENCH_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let pair = pair::Pair::up("mb");
    println!("| round | mesh | plain (veth) | ratio |");
    println!("|---|---|---|---|");
    for round in 0..3 {
        let (mesh, ok) = pair.stream(&pair.a, &pair.b, "10.208.4.1", mib << 20);
        assert!(ok, "the mesh lost bytes");
        let (plain, _) = pair.stream(&pair.a, &pair.b, "10.99.4.1", mib << 20);
        let m = |b: f64| b / (1024.0 * 1024.0);
        println!(
            "| {round} | {:.0} MiB/s | {:.0} MiB/s | {:.0} % |",
            m(mesh),
            m(plain),
            100.0 * mesh / plain
        );
    }
    println!("\nload average before: {}", load.trim());
}
