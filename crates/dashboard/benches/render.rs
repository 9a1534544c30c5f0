//! How long the dashboard takes to render its pages for a cluster of 1,000 machines on 20
//! hosts in 4 regions (the rendering the agent does per page load; reading the catalog is
//! a copy of in-memory rows). `cargo bench -p bazaar-dashboard --bench render`.

use bazaar_catalog::{HostRecord, HostStatus, HostView, MachineRecord, MachineView};
use bazaar_dashboard::render::{self, Viewer};
use std::collections::BTreeMap;
use std::time::Instant;

fn main() {
    let regions = ["ams", "ord", "sin", "gru"];
    let hosts: Vec<HostView> = (0..20)
        .map(|i| {
            let mut record = HostRecord {
                id: format!("h{i:012x}"),
                region: regions[i % 4].into(),
                api_addr: format!("10.0.0.{i}:4280"),
                num_machines: 50,
                ..Default::default()
            };
            record.capacity.cpus = 64;
            record.capacity.memory_mb = 131_072;
            record.free.cpus = 14;
            record.free.memory_mb = 60_000;
            HostView {
                record,
                status: HostStatus::Alive,
                version: 1,
            }
        })
        .collect();
    let machines: Vec<MachineView> = (0..1000)
        .map(|i| {
            let mut metadata = BTreeMap::new();
            metadata.insert(
                "fly_process_group".to_string(),
                ["app", "worker"][i % 2].to_string(),
            );
            metadata.insert("fly_release_version".to_string(), (1 + i % 3).to_string());
            MachineView {
                record: MachineRecord {
                    id: format!("{i:014x}"),
                    app: "web".into(),
                    name: format!("web-{i}"),
                    region: regions[i % 4].into(),
                    host_id: hosts[i % 20].record.id.clone(),
                    state: ["started", "stopped"][usize::from(i % 10 == 0)].into(),
                    metadata,
                    ..Default::default()
                },
                host_status: "ok",
                deleted: false,
                version: 1,
            }
        })
        .collect();
    let per_host: BTreeMap<String, usize> =
        hosts.iter().map(|h| (h.record.id.clone(), 50)).collect();
    let viewer = Viewer { may_act: true };
    let rounds = 50;
    let time = |name: &str, f: &dyn Fn() -> String| {
        let bytes = f().len();
        let start = Instant::now();
        for _ in 0..rounds {
            std::hint::black_box(f());
        }
        let each = start.elapsed() / rounds;
        println!(
            "{name:<28} {:>8.2} ms  {:>7} KB",
            each.as_secs_f64() * 1e3,
            bytes / 1024
        );
    };
    time("fleet (20 hosts)", &|| render::fleet(&hosts, &per_host));
    time("app (1,000 machines)", &|| {
        render::app("web", &machines, viewer)
    });
}
