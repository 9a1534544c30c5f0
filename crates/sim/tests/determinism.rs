//! Same seed, same bytes: the table, the CSV files and the SVG plots.

use bazaar_sim::cli::{execute, SimArgs};
use std::path::Path;

fn run(dir: &Path, seed: u64) -> (Vec<u8>, Vec<(String, Vec<u8>)>) {
    let args = SimArgs {
        name: Some("det".into()),
        hosts: Some(60),
        regions: Some(3),
        placements: Some(2500),
        seed: Some(seed),
        exchanges: Some(6),
        gossip_delay_ms: Some(200.0),
        load: Some(0.9),
        deploy_fraction: Some(0.05),
        deploy_count: Some(8),
        lifetime_s: Some(600.0),
        pareto_alpha: Some(1.5),
        mtbf_hours: Some(2.0),
        policies: [
            "market-d2",
            "market-all",
            "per-task-d2",
            "random",
            "least-loaded-stale",
            "ideal",
            "nomad-binpack",
            "k8s",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        out: Some(dir.to_path_buf()),
        markdown: true,
        ..SimArgs::default()
    };
    let mut out = Vec::new();
    execute(&args, &mut out).unwrap();
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    files.sort();
    // The stdout names the directory; compare it without that line.
    let text: Vec<u8> = String::from_utf8(out)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with("wrote "))
        .collect::<Vec<_>>()
        .join("\n")
        .into_bytes();
    (text, files)
}

#[test]
fn same_seed_same_bytes() {
    let (a, b, c) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let (out1, files1) = run(a.path(), 7);
    let (out2, files2) = run(b.path(), 7);
    assert_eq!(
        out1, out2,
        "stdout differs between two runs with the same seed"
    );
    assert_eq!(files1.len(), 7, "summary, 3 curves CSV, 3 SVG");
    assert_eq!(
        files1, files2,
        "files differ between two runs with the same seed"
    );
    let (out3, _) = run(c.path(), 8);
    assert_ne!(out1, out3, "another seed gives another run");
}
