//! Internal DNS (issue 16) on a two-host test cluster, as root: each host's resolver
//! answers every `.internal` name form from its local catalog, a machine stopped on one
//! host leaves the other host's answers within seconds, a machine resolves its app by name
//! through the `resolv.conf` it was given (the gateway, through the host's firewall), sees
//! no other organization's apps, and names outside `.internal` are forwarded to the host's
//! resolver (here one this test runs on loopback).

use crate::common;

use bazaar_dns::client::{ask, Reply};
use bazaar_dns::proto::op::{Message, MessageType};
use bazaar_dns::proto::rr::rdata::A;
use bazaar_dns::proto::rr::{RData, Record, RecordType};
use bazaar_testkit::{free_port, start_cluster, Fly};
use common::*;
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The "host's resolver": answers `A` questions for any name with 192.0.2.7 (others with
/// no records) and counts questions.
async fn upstream_resolver() -> (SocketAddr, Arc<AtomicUsize>) {
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    let asked = Arc::new(AtomicUsize::new(0));
    let count = asked.clone();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        loop {
            let Ok((n, from)) = socket.recv_from(&mut buf).await else {
                return;
            };
            let Ok(mut msg) = Message::from_vec(&buf[..n]) else {
                continue;
            };
            count.fetch_add(1, Ordering::SeqCst);
            msg.metadata.message_type = MessageType::Response;
            let Some(q) = msg.queries.first().cloned() else {
                continue;
            };
            if q.query_type() == RecordType::A {
                let ip = Ipv4Addr::new(192, 0, 2, 7);
                msg.add_answer(Record::from_rdata(q.name().clone(), 60, RData::A(A(ip))));
            }
            let _ = socket.send_to(&msg.to_vec().unwrap(), from).await;
        }
    });
    (addr, asked)
}

async fn query(server: SocketAddr, name: &str, rtype: RecordType) -> Reply {
    ask(server, name, rtype, Duration::from_secs(5))
        .await
        .unwrap_or_else(|e| panic!("{name} at {server}: {e}"))
}

fn set(ips: &[&str]) -> BTreeSet<IpAddr> {
    ips.iter().map(|ip| ip.parse().unwrap()).collect()
}

fn addresses(reply: &Reply) -> BTreeSet<IpAddr> {
    reply.addresses.iter().copied().collect()
}

/// Creates a sleeping process machine of `app` in `region` (process group `group`); its
/// id and private address.
async fn machine(fly: &Fly, app: &str, region: &str, group: &str) -> (String, String) {
    let (s, m) = fly
        .post(
            &format!("/apps/{app}/machines"),
            json!({"region": region, "config": {
                "image": "process", "driver": "process",
                "init": {"exec": ["sleep", "600"]},
                "metadata": {"fly_process_group": group},
            }}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{m}");
    let id = m["id"].as_str().unwrap().to_string();
    fly.wait_state(app, &id, "started").await;
    let (_, m) = fly.get(&format!("/apps/{app}/machines/{id}")).await;
    let ip = m["private_ip"].as_str().unwrap().to_string();
    assert!(
        ip.starts_with("10."),
        "a sandboxed machine has an address: {m}"
    );
    (id, ip)
}

/// Runs `sh -c script` in a machine; exit code and output.
async fn sh(fly: &Fly, app: &str, id: &str, script: &str) -> (i64, String) {
    let (s, v): (StatusCode, Value) = fly
        .post(
            &format!("/apps/{app}/machines/{id}/exec"),
            json!({"command": ["/bin/sh", "-c", script], "timeout": 20}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "exec {script}: {v}");
    let out = format!(
        "{}{}",
        v["stdout"].as_str().unwrap_or_default(),
        v["stderr"].as_str().unwrap_or_default()
    );
    (v["exit_code"].as_i64().unwrap_or(-1), out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_host_answers_internal_names_from_its_catalog() {
    assert!(
        is_root(),
        "internal DNS tests need root (machine network, nftables)"
    );
    let (upstream, asked) = upstream_resolver().await;
    let dns: Vec<SocketAddr> = (0..2)
        .map(|_| SocketAddr::from(([127, 0, 0, 1], free_port(Ipv4Addr::LOCALHOST))))
        .collect();
    let agents = start_cluster(Path::new(EXE), 2, |i, o| {
        o.region = ["ams", "iad"][i].into();
        o.extra_args.extend([
            "--dns-listen".into(),
            dns[i].to_string(),
            "--dns-upstream".into(),
            upstream.to_string(),
        ]);
    })
    .unwrap();
    let (a, b) = (Fly::new(&agents[0]), Fly::new(&agents[1]));
    a.create_app("web").await;
    let (s, v) = a
        .post("/apps", json!({"app_name": "db", "org_slug": "other-org"}))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");

    let (a1, a1_ip) = machine(&a, "web", "ams", "app").await;
    let (_, a2_ip) = machine(&a, "web", "ams", "worker").await;
    // Placed on host B by its region, through host A's API.
    let (b1, b1_ip) = machine(&a, "web", "iad", "app").await;
    let (d1, d1_ip) = machine(&a, "db", "ams", "app").await;
    let web = set(&[&a1_ip, &a2_ip, &b1_ip]);

    // Both hosts, every name form (host B's answers come from gossip, and vice versa).
    for (i, server) in dns.iter().enumerate() {
        let all = bazaar_testkit::eventually(Duration::from_secs(10), || async {
            let r = query(*server, "web.internal", RecordType::A).await;
            (addresses(&r) == web).then_some(r)
        })
        .await
        .unwrap_or_else(|_| panic!("host {i}: web.internal never listed {web:?}"));
        assert_eq!(all.code, "NoError");
        assert_eq!(all.min_ttl, Some(5), "short TTLs");
        assert_eq!(
            addresses(&query(*server, "ams.web.internal", RecordType::A).await),
            set(&[&a1_ip, &a2_ip])
        );
        assert_eq!(
            addresses(&query(*server, "IAD.Web.Internal.", RecordType::A).await),
            set(&[&b1_ip])
        );
        assert_eq!(
            query(*server, &format!("{a1}.vm.web.internal"), RecordType::A)
                .await
                .addresses,
            vec![a1_ip.parse::<IpAddr>().unwrap()]
        );
        assert_eq!(
            addresses(&query(*server, "worker.process.web.internal", RecordType::A).await),
            set(&[&a2_ip])
        );
        assert_eq!(
            addresses(&query(*server, "app.process.web.internal", RecordType::A).await),
            set(&[&a1_ip, &b1_ip])
        );
        // Nearest: this host's machines first.
        let near = query(*server, "top1.nearest.of.web.internal", RecordType::A).await;
        let mine = if i == 0 {
            set(&[&a1_ip, &a2_ip])
        } else {
            set(&[&b1_ip])
        };
        assert!(
            near.addresses.len() == 1 && mine.contains(&near.addresses[0]),
            "host {i}: {near:?}"
        );
        let near3 = query(*server, "top3.nearest.of.web.internal", RecordType::A).await;
        assert_eq!(addresses(&near3), web);
        assert!(mine.contains(&near3.addresses[0]), "host {i}: {near3:?}");
        // TXT: the apps (the host sees every organization's) and the instances.
        let apps = query(*server, "_apps.internal", RecordType::TXT).await;
        assert_eq!(apps.txt, vec!["db,web".to_string()], "host {i}");
        let instances = query(*server, "_instances.internal", RecordType::TXT).await;
        assert!(
            instances.txt[0].contains(&format!("instance={b1},app=web,ip={b1_ip},region=iad")),
            "{instances:?}"
        );
        // Names that do not exist.
        for name in [
            "nope.internal",
            "x.vm.web.internal",
            "top0.nearest.of.web.internal",
        ] {
            let r = query(*server, name, RecordType::A).await;
            assert_eq!(
                (r.code.as_str(), r.addresses.len()),
                ("NXDomain", 0),
                "{name}"
            );
        }
    }

    // Forwarded: not under .internal, to the host's resolver.
    let before = asked.load(Ordering::SeqCst);
    let fwd = query(dns[0], "example.test", RecordType::A).await;
    assert_eq!(fwd.addresses, vec![IpAddr::from([192, 0, 2, 7])], "{fwd:?}");
    assert_eq!(asked.load(Ordering::SeqCst), before + 1);

    // From inside a machine, through its resolv.conf (the gateway, port 53, let through
    // the host's firewall): its app by name, all of it; not another organization's.
    let (code, out) = sh(
        &a,
        "web",
        &a1,
        "cat /etc/resolv.conf; getent ahostsv4 web.internal",
    )
    .await;
    assert_eq!(code, 0, "{out}");
    let found: BTreeSet<IpAddr> = out
        .lines()
        .filter(|l| l.contains("STREAM"))
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect();
    assert_eq!(found, web, "{out}");
    let (code, out) = sh(&a, "web", &a1, "getent hosts db.internal").await;
    assert_ne!(code, 0, "another organization's app resolved: {out}");
    let (code, out) = sh(&a, "db", &d1, "getent hosts db.internal").await;
    assert_eq!(
        (code, out.split_whitespace().next()),
        (0, Some(d1_ip.as_str())),
        "{out}"
    );
    let (code, out) = sh(&a, "web", &a1, "getent hosts example.test").await;
    assert_eq!(code, 0, "forwarded from a machine: {out}");
    assert!(out.starts_with("192.0.2.7"), "{out}");

    // That went through the firewall's exception for DNS to the gateway, in the chain that
    // drops every other machine packet to the host.
    let bridge = bazaar_agent::network::bridge_name(&agents[0].client().info().await.unwrap().id);
    let rules = std::process::Command::new("nft")
        .args([
            "list",
            "table",
            "ip",
            &format!("bazaar_{}", bridge.replace('-', "_")),
        ])
        .output()
        .unwrap();
    let rules = String::from_utf8_lossy(&rules.stdout);
    assert!(
        rules.contains("th dport 53 accept") && rules.contains("counter packets"),
        "{rules}"
    );

    // Stopped on host B: gone from host A's answers within a few seconds.
    let (s, v) = b
        .post(&format!("/apps/web/machines/{b1}/stop"), json!({}))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let t0 = std::time::Instant::now();
    bazaar_testkit::eventually(Duration::from_secs(5), || async {
        let r = query(dns[0], "web.internal", RecordType::A).await;
        (addresses(&r) == set(&[&a1_ip, &a2_ip])).then_some(())
    })
    .await
    .expect("the stopped machine left host A's answers");
    eprintln!(
        "a stop on host B left host A's answers after {:?}",
        t0.elapsed()
    );
    let r = query(dns[0], &format!("{b1}.vm.web.internal"), RecordType::A).await;
    assert_eq!(r.code, "NXDomain");
}

/// An image machine (busybox) resolves its app with `nslookup` through the `resolv.conf`
/// written into its root: the gateway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_machine_resolves_its_app_by_name() {
    use bazaar_testkit::images::{
        busybox_rootfs_layer, config_with, push_with_config, TestRegistry,
    };
    assert!(is_root(), "image machines need root (runc, namespaces)");
    let registry = TestRegistry::start(None);
    let reg =
        bazaar_image::Registry::new(&registry.host, bazaar_image::Auth::Anonymous, true).unwrap();
    let layer = busybox_rootfs_layer(&["sh", "nslookup", "sleep", "cat"], ("etc/motd", b"dns\n"));
    let arch = bazaar_image::manifest::Platform::current().architecture;
    let config = config_with(
        &[&layer],
        arch.as_str(),
        json!({"Cmd": ["/bin/sleep", "600"], "Env": ["PATH=/bin"]}),
    );
    push_with_config(&reg, "dnsbox", "1", &[&layer], &config).await;
    let (upstream, _) = upstream_resolver().await;
    let agents = start_cluster(Path::new(EXE), 1, |_, o| {
        o.extra_args
            .extend(["--dns-upstream".into(), upstream.to_string()]);
    })
    .unwrap();
    let fly = Fly::new(&agents[0]);
    fly.create_app("box").await;
    let mut ips = BTreeSet::new();
    let mut ids = Vec::new();
    for _ in 0..2 {
        let (s, m) = fly
            .post(
                "/apps/box/machines",
                json!({"config": {"image": format!("{}/dnsbox:1", registry.host)}}),
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{m}");
        let id = m["id"].as_str().unwrap().to_string();
        fly.wait_state("box", &id, "started").await;
        ips.insert(m["private_ip"].as_str().unwrap().to_string());
        ids.push(id);
    }
    // Each started machine is in the zone once its row reaches this host's catalog (the
    // API's `started` comes from the owner, the zone from gossip).
    let script = "cat /etc/resolv.conf; nslookup box.internal";
    let all_in = bazaar_testkit::eventually(Duration::from_secs(10), || async {
        let (code, out) = sh(&fly, "box", &ids[0], script).await;
        (code == 0 && ips.iter().all(|ip| out.contains(&format!("Address: {ip}")))).then_some(out)
    })
    .await;
    let out = match all_in {
        Ok(out) => out,
        Err(_) => sh(&fly, "box", &ids[0], script).await.1,
    };
    let (resolv, answer) = out.split_once("Server:").expect("nslookup answered");
    let gateway = resolv
        .trim()
        .strip_prefix("nameserver ")
        .unwrap_or_default();
    assert!(
        gateway.ends_with(".1"),
        "the gateway is the resolver: {out}"
    );
    for ip in &ips {
        assert!(
            answer.contains(&format!("Address: {ip}")),
            "{ip} missing: {out}"
        );
    }
    let (code, out) = sh(&fly, "box", &ids[0], "nslookup nothing.internal").await;
    assert_ne!(code, 0, "{out}");
}
