//! Oversubscription with reclamation on one host, in-process on tokio's paused clock (the
//! real agent with the test kit's fake driver, docs/POLICY.md "Reclamation"): the machines'
//! use is fed through the agent's usage seam, so a service idles or burns on command. A
//! `batch` machine is placed on room a host full by requests refuses to services, is
//! throttled (its CPU limit lowered, a `throttled` event) when the service's use grows, and
//! stopped with a `reclaimed` event when it grows past what throttling can give back, and the reclaimed pool
//! never holds more than the host has.

use bazaar_agent::clock::Clock;
use bazaar_agent::config::{BurstConfig, ReclaimConfig};
use bazaar_agent::ledger_dump::{current, LedgerDump};
use bazaar_agent::usage::{UsageProbe, UsageSample};
use bazaar_agent::{Agent, AgentConfig, Seams};
use bazaar_testkit::fake_driver::FakeDriver;
use bazaar_types::host::{BidRequest, BidResponse, ClaimRequest};
use bazaar_types::state::MachineState;
use serde_json::json;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// Use fed by the test: each machine burns `millicpus` and holds `memory_mb`; its CPU
/// counter advances with tokio's clock.
#[derive(Debug, Default)]
struct FedUsage {
    machines: Mutex<HashMap<String, Fed>>,
    /// The CPU limits the agent set, in order.
    limits: Mutex<Vec<(String, f64)>>,
}

#[derive(Debug, Clone, Copy)]
struct Fed {
    millicpus: u64,
    memory_mb: u64,
    cpu_usec: u64,
    at: Instant,
}

impl FedUsage {
    fn set(&self, id: &str, millicpus: u64, memory_mb: u64) {
        let mut m = self.machines.lock().unwrap();
        let now = Instant::now();
        let fed = m.entry(id.to_string()).or_insert(Fed {
            millicpus,
            memory_mb,
            cpu_usec: 0,
            at: now,
        });
        fed.cpu_usec += fed.millicpus * (now - fed.at).as_micros() as u64 / 1000;
        fed.at = now;
        fed.millicpus = millicpus;
        fed.memory_mb = memory_mb;
    }
}

impl UsageProbe for FedUsage {
    fn sample(&self, machine_id: &str, _cgroup: Option<&str>) -> Option<UsageSample> {
        let mut m = self.machines.lock().unwrap();
        let fed = m.get_mut(machine_id)?;
        let now = Instant::now();
        fed.cpu_usec += fed.millicpus * (now - fed.at).as_micros() as u64 / 1000;
        fed.at = now;
        Some(UsageSample {
            cpu_usec: fed.cpu_usec,
            memory_bytes: fed.memory_mb << 20,
        })
    }

    fn limit_cpu(&self, machine_id: &str, _cgroup: Option<&str>, cores: f64) -> bool {
        self.limits
            .lock()
            .unwrap()
            .push((machine_id.to_string(), cores));
        true
    }
}

/// A host of 4 CPUs and 4096 MB that reclaims, measuring every second: a reservation
/// stays at the request for 3 measurements, then closes half its gap per measurement.
async fn start(usage: Arc<FedUsage>) -> (Agent, Arc<FakeDriver>, tempfile::TempDir) {
    start_with(usage, BurstConfig::default()).await
}

async fn start_with(
    usage: Arc<FedUsage>,
    burst: BurstConfig,
) -> (Agent, Arc<FakeDriver>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let driver = FakeDriver::new();
    let agent = start_at(&dir, &driver, usage, burst).await;
    (agent, driver, dir)
}

/// The agent of data dir `dir`, whose runs are `driver`'s (they outlive an agent).
async fn start_at(
    dir: &tempfile::TempDir,
    driver: &Arc<FakeDriver>,
    usage: Arc<FedUsage>,
    burst: BurstConfig,
) -> Agent {
    let config = AgentConfig {
        data_dir: dir.path().join("data"),
        isolate: false,
        cpus: Some(4),
        memory_mb: Some(4096),
        reclaim: ReclaimConfig {
            enabled: true,
            interval: Duration::from_secs(1),
            margin_pct: 20,
            decay_pct: 50,
            grace_observations: 3,
            throttle_floor_pct: 25,
        },
        burst,
        ..AgentConfig::default()
    };
    let seams = Seams {
        driver: Some(driver.clone()),
        clock: Clock::tokio(),
        crash: None,
        usage: Some(usage),
    };
    bazaar_agent::boot::start_in_process(config, seams)
        .await
        .unwrap()
}

fn machine(priority: &str, cpus: u32, memory_mb: u64) -> serde_json::Value {
    json!({
        "init": {"exec": ["/bin/sh", "-c", "sleep 1000"]},
        "guest": {"cpus": cpus, "memory_mb": memory_mb, "cpu_kind": "shared"},
        "priority": priority,
        "restart": {"policy": "no"},
    })
}

fn bid(priority: &str, cpus: u32, memory_mb: u64) -> BidRequest {
    serde_json::from_value(json!({
        "cpus": cpus, "memory_mb": memory_mb, "ttl_ms": 5000, "priority": priority,
    }))
    .unwrap()
}

async fn wait_for(agent: &Agent, id: &str, state: MachineState) {
    let waited = agent
        .wait(id, &[state], Duration::from_secs(60), None, None)
        .await;
    let now = agent.machine(id).await.map(|m| m.state);
    assert!(waited.is_ok(), "{id} never became {state}: it is {now:?}");
}

/// The reclaimed pool holds no more than the host has, and services' requests fit.
fn assert_within_capacity(d: &LedgerDump) {
    let by_request: u64 = d
        .committed
        .iter()
        .filter(|(id, _)| !d.batch.contains(id))
        .map(|(_, r)| r.memory_mb)
        .sum();
    assert!(
        by_request + d.reserved.memory_mb <= d.capacity.memory_mb,
        "{d:?}"
    );
    let pool = d.reclaim.as_ref().expect("the host reclaims");
    if !d.batch.is_empty() {
        assert!(
            pool.batch_held.millicpus <= u64::from(d.capacity.cpus) * 1000
                && pool.batch_held.memory_mb <= d.capacity.memory_mb,
            "reservations + batch past capacity: {d:?}"
        );
    }
}

/// Sleeps `secs` seconds of the paused clock a second at a time, checking the ledger after
/// each of the agent's measurements.
async fn run_for(agent: &Agent, secs: u64) {
    for _ in 0..secs {
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_within_capacity(&current(agent).await);
    }
}

#[tokio::test(start_paused = true)]
async fn a_batch_machine_runs_on_reclaimed_room_and_is_stopped_when_the_service_needs_it() {
    let usage = Arc::new(FedUsage::default());
    let (agent, _driver, _dir) = start(usage.clone()).await;
    let req: ClaimRequest =
        serde_json::from_value(json!({"app": "shop", "config": machine("default", 4, 4096)}))
            .unwrap();
    let service = bazaar_agent::market::create(&agent, req).await.unwrap().id;
    wait_for(&agent, &service, MachineState::Started).await;
    usage.set(&service, 100, 200);

    // Just started, the service holds its whole request: no room for batch work either.
    let refused = bazaar_agent::market::bid(&agent, bid("batch", 2, 2048))
        .await
        .unwrap();
    assert!(
        matches!(&refused, BidResponse::Refusal { reason, .. } if reason.contains("reclaimed room")),
        "{refused:?}"
    );

    // Idle for a while, its reservation decays towards 100 millicpus / 200 MB + 20 %.
    run_for(&agent, 20).await;
    let pool = current(&agent).await.reclaim.unwrap();
    assert_eq!(
        (pool.reservations.millicpus, pool.reservations.memory_mb),
        (120, 240)
    );
    // Full by requests: a service is still refused...
    let refused = bazaar_agent::market::bid(&agent, bid("default", 1, 256))
        .await
        .unwrap();
    assert!(
        matches!(&refused, BidResponse::Refusal { reason, .. } if reason.contains("insufficient")),
        "{refused:?}"
    );
    // ...and a batch machine takes the reclaimed room.
    let BidResponse::Bid { reservation_id, .. } =
        bazaar_agent::market::bid(&agent, bid("batch", 2, 2048))
            .await
            .unwrap()
    else {
        panic!("no batch bid on reclaimed room");
    };
    let claim: ClaimRequest =
        serde_json::from_value(json!({"app": "crunch", "config": machine("batch", 2, 2048)}))
            .unwrap();
    let batch = bazaar_agent::market::claim(&agent, &reservation_id, claim)
        .await
        .unwrap()
        .id;
    wait_for(&agent, &batch, MachineState::Started).await;
    let d = current(&agent).await;
    assert_eq!(d.batch, vec![batch.clone()]);
    assert_within_capacity(&d);
    // The service keeps idling: nothing stops.
    run_for(&agent, 10).await;
    assert_eq!(
        agent.machine(&batch).await.unwrap().state,
        MachineState::Started
    );

    // The service burns 2 CPUs: its reservation rises to 2,400 millicpus, and the batch
    // machine (2,000) fits only throttled: its cgroup is held at 1.6 cores, it runs on.
    usage.set(&service, 2000, 200);
    run_for(&agent, 2).await;
    assert_eq!(
        usage.limits.lock().unwrap().last(),
        Some(&(batch.clone(), 1.6)),
        "the batch machine's CPU limit"
    );
    let events = agent.events(&batch, 50).await.unwrap();
    let throttled = events
        .iter()
        .find(|e| e.kind == "throttled")
        .unwrap_or_else(|| panic!("no throttled event: {events:?}"));
    assert_eq!(
        throttled.status,
        format!("CPU held at 1600 millicpus (80.0 % of its request) for machine {service}'s reservation (reclamation)")
    );
    assert_eq!(
        agent.machine(&batch).await.unwrap().state,
        MachineState::Started
    );
    assert_eq!(current(&agent).await.batch, vec![batch.clone()]);
    // It idles again: within a few measurements its reservation has decayed and the batch
    // machine has its 2 cores back.
    usage.set(&service, 100, 200);
    run_for(&agent, 4).await;
    assert_eq!(
        usage.limits.lock().unwrap().last(),
        Some(&(batch.clone(), 2.0)),
        "the batch machine's CPU limit back to its request"
    );
    let events = agent.events(&batch, 50).await.unwrap();
    assert!(
        events
            .iter()
            .any(|e| e.kind == "throttled" && e.status == "CPU limit back to its request"),
        "{events:?}"
    );

    // The service burns 3 CPUs: its reservation rises to 3,600 millicpus at once, and the
    // batch machine no longer fits even throttled to a quarter (500): it is stopped,
    // saying for whom.
    usage.set(&service, 3000, 200);
    run_for(&agent, 2).await;
    wait_for(&agent, &batch, MachineState::Stopped).await;
    let events = agent.events(&batch, 50).await.unwrap();
    let reclaimed = events
        .iter()
        .find(|e| e.kind == "reclaimed")
        .unwrap_or_else(|| panic!("no reclaimed event: {events:?}"));
    assert_eq!(
        reclaimed.status,
        format!("stopped for machine {service}'s reservation (reclamation)")
    );
    assert_eq!(
        agent.machine(&service).await.unwrap().state,
        MachineState::Started
    );
    let d = current(&agent).await;
    assert!(
        d.batch.is_empty() && !d.committed.contains_key(&batch),
        "{d:?}"
    );
    // While the service burns, the batch machine cannot start again.
    let start = bazaar_agent::operations::start_machine(&agent, &batch, None).await;
    assert!(start.is_err(), "{start:?}");
    bazaar_agent::boot::shutdown(&agent).await;
}

/// Shared CPUs' burst model (docs/POLICY.md "Shared CPU bursts"): a shared machine busy
/// past its balance is throttled to its baseline, gets its vCPU back once it has idled, and
/// a performance machine is never limited.
#[tokio::test(start_paused = true)]
async fn a_shared_machine_is_throttled_to_its_baseline_when_its_burst_balance_is_spent() {
    let usage = Arc::new(FedUsage::default());
    let burst = BurstConfig {
        enabled: true,
        baseline_pct: 6.25,
        max_balance_ms: 4_000,
    };
    let (agent, _driver, _dir) = start_with(usage.clone(), burst).await;
    let create = |config: serde_json::Value| {
        let req: ClaimRequest =
            serde_json::from_value(json!({"app": "cpu", "config": config})).unwrap();
        bazaar_agent::market::create(&agent, req)
    };
    let shared = create(machine("default", 1, 256)).await.unwrap().id;
    let mut performance = machine("default", 1, 2048);
    performance["guest"]["cpu_kind"] = json!("performance");
    let performance = create(performance).await.unwrap().id;
    wait_for(&agent, &shared, MachineState::Started).await;
    wait_for(&agent, &performance, MachineState::Started).await;
    usage.set(&shared, 1000, 64);
    usage.set(&performance, 1000, 64);
    let limits = || usage.limits.lock().unwrap().clone();

    // A full core spends 4 s of balance in a little over 4 s of readings (it earns 1/16 of
    // a second per second; the first reading, a second in, only starts the count): still
    // full at 3 s, throttled to 1/16 of a core by 8 s.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(limits().is_empty(), "{:?}", limits());
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(limits(), vec![(shared.clone(), 0.0625)]);
    // Idle, it earns some balance back: its vCPU in full again.
    usage.set(&shared, 0, 64);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        limits(),
        vec![(shared.clone(), 0.0625), (shared.clone(), 1.0)]
    );
    assert!(
        !limits().iter().any(|(id, _)| *id == performance),
        "a performance CPU is never limited"
    );
    bazaar_agent::boot::shutdown(&agent).await;
}

/// An agent that starts again keeps the batch machines running on reclaimed room (its
/// services' reservations start at their requests with no grace, and only a growing one
/// stops batch work), and still stops them when a service needs its reservation back.
#[tokio::test(start_paused = true)]
async fn a_restarted_agent_keeps_its_batch_machines_until_a_service_needs_the_room() {
    let usage = Arc::new(FedUsage::default());
    let (agent, driver, dir) = start(usage.clone()).await;
    let req: ClaimRequest =
        serde_json::from_value(json!({"app": "shop", "config": machine("default", 4, 4096)}))
            .unwrap();
    let service = bazaar_agent::market::create(&agent, req).await.unwrap().id;
    wait_for(&agent, &service, MachineState::Started).await;
    usage.set(&service, 100, 200);
    run_for(&agent, 20).await;
    let claim: ClaimRequest =
        serde_json::from_value(json!({"app": "crunch", "config": machine("batch", 2, 2048)}))
            .unwrap();
    let batch = bazaar_agent::market::create(&agent, claim)
        .await
        .unwrap()
        .id;
    wait_for(&agent, &batch, MachineState::Started).await;
    bazaar_agent::boot::shutdown(&agent).await;
    drop(agent);

    let agent = start_at(&dir, &driver, usage.clone(), BurstConfig::default()).await;
    wait_for(&agent, &batch, MachineState::Started).await;
    run_for(&agent, 10).await;
    assert_eq!(
        agent.machine(&batch).await.unwrap().state,
        MachineState::Started
    );
    assert_eq!(current(&agent).await.batch, vec![batch.clone()]);
    usage.set(&service, 100, 3000);
    run_for(&agent, 2).await;
    wait_for(&agent, &batch, MachineState::Stopped).await;
    let events = agent.events(&batch, 50).await.unwrap();
    assert!(events.iter().any(|e| e.kind == "reclaimed"), "{events:?}");
    bazaar_agent::boot::shutdown(&agent).await;
}
