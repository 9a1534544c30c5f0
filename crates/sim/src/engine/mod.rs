//! The discrete-event engine: virtual time in microseconds, a binary heap of
//! (time, sequence, event), seeded random streams (workload, network, failures and policy
//! are separate streams, so every policy sees the same arrivals, sizes, lifetimes and
//! failures). It generates the workload, carries out each policy's protocol with modelled
//! round trips, holds reservations in flight (which is where concurrency between exchanges
//! comes from), fails and repairs hosts, and measures. Same scenario, seed and policy: the
//! same [`Summary`], bit for bit.

use crate::config::{Lifetime, Scenario, WeightedSize};
use crate::fleet::{fits, Fleet, Sampler};
use crate::metrics::{load_stats, Snapshot, Summary};
use crate::policy::{self, Choice, Ctx, Mode, Policy, Request};
use bazaar_placement::exchange::{choose_winners, Offer};
use bazaar_placement::Ledger;
use bazaar_types::host::Resources;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, VecDeque};

mod central;
mod direct;
mod market;

/// Runs `policy` on `scenario`.
pub fn run(scenario: &Scenario, policy: &str) -> anyhow::Result<Summary> {
    scenario.validate()?;
    let policy = policy::parse(policy, scenario)?;
    Ok(Engine::new(scenario, policy)?.run())
}

#[derive(Debug, Clone, PartialEq)]
enum Ev {
    Arrival,
    Burst,
    AskArrive {
        slot: u32,
        req: u64,
        ask: u32,
    },
    BidReply {
        slot: u32,
        req: u64,
        round: u32,
        ask: u32,
        score: Option<f64>,
    },
    Deadline {
        slot: u32,
        req: u64,
        round: u32,
    },
    /// Carries the reservation: a new round may have replaced the asks meanwhile.
    ClaimArrive {
        slot: u32,
        req: u64,
        host: u32,
        res: String,
        half: u64,
    },
    /// A claim, commit or central binding acknowledged (or not).
    Done {
        slot: u32,
        req: u64,
        host: u32,
        ok: bool,
    },
    Release {
        host: u32,
        epoch: u32,
        res: String,
    },
    CommitArrive {
        slot: u32,
        req: u64,
        host: u32,
        rtt: u64,
    },
    /// The central scheduler of a region takes its next request.
    CentralRun {
        region: u16,
    },
    Expire {
        host: u32,
        epoch: u32,
    },
    Departure {
        host: u32,
        epoch: u32,
        machine: u64,
    },
    HostFail {
        host: u32,
    },
    HostRecover {
        host: u32,
    },
    Snapshot,
}

#[derive(Debug)]
struct Item {
    at: u64,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Item {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Item {}
impl PartialOrd for Item {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Item {
    // Reversed: the heap pops the earliest.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum AskState {
    Waiting,
    Bid(f64),
    Refused,
    NoAnswer,
    Claiming,
}

#[derive(Debug, Clone)]
struct AskSlot {
    host: u32,
    res: String,
    rtt: u64,
    state: AskState,
}

/// One request in flight.
#[derive(Debug)]
struct Pending {
    req: u64,
    exchange: usize,
    region: u16,
    size: Resources,
    /// Lifetimes (µs) of the machines still to place.
    lifetimes: Vec<u64>,
    arrived_us: u64,
    rounds_used: u32,
    round: u32,
    round_active: bool,
    round_count: u32,
    asks: Vec<AskSlot>,
    replies_pending: u32,
    /// Claims, commits or bindings in flight.
    outstanding: u32,
    /// Machines that need another round.
    deficit: u32,
    placed: u32,
    last_done_us: u64,
    skip: Vec<u32>,
    skip_ids: Vec<String>,
}

struct Engine<'s> {
    sc: &'s Scenario,
    policy: Box<dyn Policy>,
    mode: Mode,
    fleet: Fleet,
    sampler: Sampler,
    heap: BinaryHeap<Item>,
    departures: BinaryHeap<Reverse<(u64, u64, u32, u32)>>,
    seq: u64,
    now: u64,
    work_rng: StdRng,
    net_rng: StdRng,
    fail_rng: StdRng,
    policy_rng: StdRng,
    sizes: Vec<WeightedSize>,
    size_total: f64,
    request_rate: f64,
    exchange_delay_us: Vec<u64>,
    pending: Vec<Option<Pending>>,
    free_slots: Vec<u32>,
    active: u64,
    next_req: u64,
    next_machine: u64,
    next_res: u64,
    machines_arrived: u64,
    arrivals_done: bool,
    /// One central scheduler per region (Nomad and Kubernetes clusters are per region).
    central_queue: Vec<VecDeque<u32>>,
    central_busy: Vec<bool>,
    total_mem: u64,
    used_mem: u64,
    snapshot_every_us: u64,
    out: Summary,
}

impl std::fmt::Debug for Engine<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("policy", &self.policy.name())
            .field("now", &self.now)
            .finish_non_exhaustive()
    }
}

const US: f64 = 1e6;

fn exp_sample(rng: &mut StdRng, mean: f64) -> f64 {
    let u: f64 = rng.random();
    -mean * (1.0 - u).ln()
}

impl<'s> Engine<'s> {
    fn new(sc: &'s Scenario, policy: Box<dyn Policy>) -> anyhow::Result<Engine<'s>> {
        let mut setup = StdRng::seed_from_u64(sc.seed ^ 0x5e7u64);
        let class_total: f64 = sc.host_classes.iter().map(|c| c.weight).sum();
        let capacities: Vec<Resources> = (0..sc.hosts)
            .map(|_| {
                let mut x = setup.random::<f64>() * class_total;
                let mut chosen = &sc.host_classes[0];
                for c in &sc.host_classes {
                    chosen = c;
                    if x < c.weight {
                        break;
                    }
                    x -= c.weight;
                }
                Resources {
                    cpus: chosen.cpus,
                    memory_mb: chosen.memory_mb,
                }
            })
            .collect();
        let exchange_delay_us: Vec<u64> = (0..sc.exchanges)
            .map(|_| (sc.gossip_delay_ms * 1000.0 * (0.5 + setup.random::<f64>())) as u64)
            .collect();
        let max_delay = exchange_delay_us.iter().copied().max().unwrap_or(0);
        let fleet = Fleet::new(
            &capacities,
            sc.region_names(),
            max_delay,
            policy.needs_order(),
        );
        let sampler = Sampler::new(&fleet);
        let sizes = sc.resolved_sizes()?;
        let size_total = sizes.iter().map(|s| s.weight).sum();
        let request_rate = sc.request_rate();
        let burst_rate = sc.bursts.map_or(0.0, |b| b.requests as f64 / b.every_s);
        let expected_s = sc.placements as f64 / sc.mean_count() / (request_rate + burst_rate);
        let snapshot_every_us = ((expected_s * US) / sc.snapshots.max(1) as f64).max(1.0) as u64;
        let total_mem = capacities.iter().map(|c| c.memory_mb).sum();
        Ok(Engine {
            sc,
            mode: policy.mode(),
            policy,
            fleet,
            sampler,
            heap: BinaryHeap::new(),
            departures: BinaryHeap::new(),
            seq: 0,
            now: 0,
            work_rng: StdRng::seed_from_u64(sc.seed),
            net_rng: StdRng::seed_from_u64(sc.seed ^ 0x6e65_7477),
            fail_rng: StdRng::seed_from_u64(sc.seed ^ 0x6661_696c),
            policy_rng: StdRng::seed_from_u64(sc.seed ^ 0x706f_6c69),
            sizes,
            size_total,
            request_rate,
            exchange_delay_us,
            pending: Vec::new(),
            free_slots: Vec::new(),
            active: 0,
            next_req: 0,
            next_machine: 0,
            next_res: 0,
            machines_arrived: 0,
            arrivals_done: false,
            central_queue: vec![VecDeque::new(); sc.regions],
            central_busy: vec![false; sc.regions],
            total_mem,
            used_mem: 0,
            snapshot_every_us,
            out: Summary::default(),
        })
    }

    fn at(&mut self, at: u64, ev: Ev) {
        self.seq += 1;
        self.heap.push(Item {
            at,
            seq: self.seq,
            ev,
        });
    }

    fn run(mut self) -> Summary {
        self.out.policy = self.policy.name().to_string();
        self.at(0, Ev::Arrival);
        if let Some(b) = self.sc.bursts {
            self.at((b.every_s * US) as u64, Ev::Burst);
        }
        if let Some(f) = self.sc.failures {
            if f.mtbf_hours > 0.0 {
                for h in 0..self.fleet.hosts.len() as u32 {
                    let t = exp_sample(&mut self.fail_rng, f.mtbf_hours * 3600.0 * US);
                    self.at(t as u64, Ev::HostFail { host: h });
                }
            }
        }
        self.at(self.snapshot_every_us, Ev::Snapshot);
        loop {
            if self.arrivals_done && self.active == 0 {
                break;
            }
            // Departures live in their own compact heap (they are most of the pending
            // events); at equal times they go first.
            let next = self.heap.peek().map(|i| i.at);
            let dep = self.departures.peek().map(|d| d.0 .0);
            let ev = match (next, dep) {
                (_, Some(d)) if next.is_none_or(|n| d <= n) => {
                    let Reverse((at, machine, host, epoch)) =
                        self.departures.pop().expect("peeked");
                    self.now = at;
                    Ev::Departure {
                        host,
                        epoch,
                        machine,
                    }
                }
                (Some(_), _) => {
                    let item = self.heap.pop().expect("peeked");
                    self.now = item.at;
                    item.ev
                }
                (None, _) => break,
            };
            self.out.events += 1;
            self.handle(ev);
        }
        self.take_snapshot();
        let mut loads: Vec<f64> = self
            .fleet
            .hosts
            .iter()
            .filter(|h| h.alive)
            .map(|h| h.load())
            .collect();
        self.out.final_stats = load_stats(&mut loads);
        self.out.final_loads = loads;
        self.out.latencies_us.sort_unstable();
        self.out.virtual_s = self.now as f64 / US;
        self.out.finish_series();
        self.out
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Arrival => {
                self.arrive();
                if !self.arrivals_done {
                    let dt = exp_sample(&mut self.work_rng, US / self.request_rate);
                    self.at(self.now + dt.max(1.0) as u64, Ev::Arrival);
                }
            }
            Ev::Burst => {
                if let Some(b) = self.sc.bursts {
                    for _ in 0..b.requests {
                        self.arrive();
                    }
                    if !self.arrivals_done {
                        self.at(self.now + (b.every_s * US) as u64, Ev::Burst);
                    }
                }
            }
            Ev::AskArrive { slot, req, ask } => self.ask_arrive(slot, req, ask),
            Ev::BidReply {
                slot,
                req,
                round,
                ask,
                score,
            } => self.bid_reply(slot, req, round, ask, score),
            Ev::Deadline { slot, req, round } => {
                if let Some(p) = self.live(slot, req) {
                    if p.round == round && p.round_active {
                        for a in p.asks.iter_mut() {
                            if a.state == AskState::Waiting {
                                a.state = AskState::NoAnswer;
                            }
                        }
                        self.resolve_round(slot);
                    }
                }
            }
            Ev::ClaimArrive {
                slot,
                req,
                host,
                res,
                half,
            } => self.claim_arrive(slot, req, host, res, half),
            Ev::Done {
                slot,
                req,
                host,
                ok,
            } => self.done(slot, req, host, ok),
            Ev::Release { host, epoch, res } => {
                let h = &mut self.fleet.hosts[host as usize];
                if h.alive && h.epoch == epoch && h.ledger.release(&res) {
                    self.changed(host);
                }
            }
            Ev::CommitArrive {
                slot,
                req,
                host,
                rtt,
            } => self.commit_arrive(slot, req, host, rtt),
            Ev::CentralRun { region } => self.central_run(region),
            Ev::Expire { host, epoch } => {
                let now_ms = self.now / 1000;
                let h = &mut self.fleet.hosts[host as usize];
                if h.alive && h.epoch == epoch {
                    let expired = h.ledger.expire(now_ms, 0);
                    if !expired.is_empty() {
                        self.out.expired_reservations += expired.len() as u64;
                        self.changed(host);
                    }
                }
            }
            Ev::Departure {
                host,
                epoch,
                machine,
            } => {
                let h = &mut self.fleet.hosts[host as usize];
                if h.epoch == epoch {
                    if let Some(m) = h.machines.remove(&machine) {
                        h.ledger.uncommit(&machine_id(machine));
                        h.used = sub(h.used, m.size);
                        self.used_mem -= m.size.memory_mb;
                        self.changed(host);
                    }
                }
            }
            Ev::HostFail { host } => self.host_fail(host),
            Ev::HostRecover { host } => {
                self.fleet.hosts[host as usize].alive = true;
                self.fleet.publish(host, self.now);
                if let Some(f) = self.sc.failures {
                    let t = exp_sample(&mut self.fail_rng, f.mtbf_hours * 3600.0 * US);
                    self.at(self.now + t as u64, Ev::HostFail { host });
                }
            }
            Ev::Snapshot => {
                self.take_snapshot();
                if !self.arrivals_done {
                    self.at(self.now + self.snapshot_every_us, Ev::Snapshot);
                }
            }
        }
    }

    // ---- workload ----

    fn draw_size(&mut self) -> Resources {
        let mut x = self.work_rng.random::<f64>() * self.size_total;
        for s in &self.sizes {
            if x < s.weight {
                return s.size;
            }
            x -= s.weight;
        }
        self.sizes.last().expect("sizes").size
    }

    fn draw_lifetime(&mut self) -> u64 {
        match self.sc.lifetime {
            Lifetime::Exponential { mean_s } => exp_sample(&mut self.work_rng, mean_s * US) as u64,
            Lifetime::Pareto { mean_s, alpha } => {
                let xm = mean_s * (alpha - 1.0) / alpha;
                let u: f64 = self.work_rng.random();
                (xm * US / (1.0 - u).powf(1.0 / alpha)).min(1e18) as u64
            }
            Lifetime::Forever => u64::MAX,
        }
    }

    fn arrive(&mut self) {
        if self.arrivals_done {
            return;
        }
        let region = self.work_rng.random_range(0..self.sc.regions) as u16;
        let size = self.draw_size();
        let deploy = self.work_rng.random::<f64>() < self.sc.deploy_fraction;
        let count = if deploy { self.sc.deploy_count } else { 1 };
        let lifetimes: Vec<u64> = (0..count).map(|_| self.draw_lifetime()).collect();
        let exchange = self.work_rng.random_range(0..self.sc.exchanges);
        self.machines_arrived += count as u64;
        if self.machines_arrived >= self.sc.placements {
            self.arrivals_done = true;
        }
        if self.policy.splits_deploys() {
            for l in lifetimes {
                self.submit(exchange, region, size, vec![l]);
            }
        } else {
            self.submit(exchange, region, size, lifetimes);
        }
    }

    fn submit(&mut self, exchange: usize, region: u16, size: Resources, lifetimes: Vec<u64>) {
        self.next_req += 1;
        self.out.requests += 1;
        self.out.machines += lifetimes.len() as u64;
        let count = lifetimes.len() as u32;
        let p = Pending {
            req: self.next_req,
            exchange,
            region,
            size,
            lifetimes,
            arrived_us: self.now,
            rounds_used: 0,
            round: 0,
            round_active: false,
            round_count: 0,
            asks: Vec::new(),
            replies_pending: 0,
            outstanding: 0,
            deficit: count,
            placed: 0,
            last_done_us: self.now,
            skip: Vec::new(),
            skip_ids: Vec::new(),
        };
        let slot = match self.free_slots.pop() {
            Some(s) => {
                self.pending[s as usize] = Some(p);
                s
            }
            None => {
                self.pending.push(Some(p));
                (self.pending.len() - 1) as u32
            }
        };
        self.active += 1;
        self.progress(slot);
    }

    fn live(&mut self, slot: u32, req: u64) -> Option<&mut Pending> {
        self.pending
            .get_mut(slot as usize)
            .and_then(|p| p.as_mut())
            .filter(|p| p.req == req)
    }

    fn p(&mut self, slot: u32) -> &mut Pending {
        self.pending[slot as usize].as_mut().expect("live slot")
    }

    fn rtt(&mut self) -> u64 {
        let jitter = if self.sc.rtt_jitter_ms > 0.0 {
            exp_sample(&mut self.net_rng, self.sc.rtt_jitter_ms * 1000.0)
        } else {
            0.0
        };
        ((self.sc.rtt_ms * 1000.0 + jitter) as u64).max(2)
    }

    /// After any change to a request: start another round, give up, or finish.
    fn progress(&mut self, slot: u32) {
        let rounds = self.sc.rounds;
        let p = self.pending[slot as usize].as_mut().expect("live slot");
        if p.round_active {
            return;
        }
        if p.deficit > 0 {
            if p.rounds_used < rounds {
                match self.mode.clone() {
                    Mode::Market(_) => self.market_round(slot),
                    Mode::Direct => self.direct_round(slot),
                    Mode::Central(_) => {
                        // Queued for the central scheduler; the deficit is its to place.
                        let p = self.p(slot);
                        p.round_active = true;
                        let region = p.region;
                        self.central_queue[region as usize].push_back(slot);
                        if !self.central_busy[region as usize] {
                            self.central_busy[region as usize] = true;
                            self.at(self.now, Ev::CentralRun { region });
                        }
                    }
                }
                return;
            }
            let (n, region, size) = (p.deficit, p.region, p.size);
            p.deficit = 0;
            self.fail(region, size, n);
        }
        let p = self.p(slot);
        if !p.round_active && p.outstanding == 0 && p.deficit == 0 {
            if p.placed > 0 {
                let lat = p.last_done_us - p.arrived_us;
                self.out.latencies_us.push(lat);
            }
            self.pending[slot as usize] = None;
            self.free_slots.push(slot);
            self.active -= 1;
        }
    }

    /// Machines answered `insufficient_capacity`; counts those the region had room for.
    fn fail(&mut self, region: u16, size: Resources, n: u32) {
        self.out.failed += n as u64;
        let mut room = 0u64;
        for &h in &self.fleet.regions[region as usize] {
            let host = &self.fleet.hosts[h as usize];
            if !host.alive {
                continue;
            }
            let free = sub(host.capacity, host.used);
            let per = |f: u64, w: u64| f.checked_div(w).unwrap_or(u64::MAX);
            room +=
                per(free.memory_mb, size.memory_mb).min(per(free.cpus as u64, size.cpus as u64));
            if room >= n as u64 {
                break;
            }
        }
        self.out.false_ice += room.min(n as u64);
    }

    fn choose(&mut self, slot: u32, count: u32, delay_us: u64) -> Choice {
        let p = self.pending[slot as usize].as_ref().expect("live slot");
        let req = Request {
            region: p.region,
            size: p.size,
            count,
        };
        let mut ctx = Ctx {
            fleet: &self.fleet,
            sampler: &mut self.sampler,
            rng: &mut self.policy_rng,
            now_us: self.now,
            delay_us,
            skip: &p.skip,
            skip_ids: &p.skip_ids,
            round: p.rounds_used,
        };
        self.policy.choose(&mut ctx, &req)
    }

    // ---- faults ----

    fn host_fail(&mut self, h: u32) {
        let now = self.now;
        let host = &mut self.fleet.hosts[h as usize];
        if !host.alive {
            return;
        }
        host.alive = false;
        host.epoch += 1;
        host.ledger = Ledger::new(host.capacity);
        host.used = Resources::default();
        let lost = std::mem::take(&mut host.machines);
        let region = host.region;
        self.out.lost += lost.len() as u64;
        for m in lost.values() {
            self.used_mem -= m.size.memory_mb;
        }
        self.fleet.publish(h, now);
        let f = self.sc.failures.expect("failures configured");
        self.at(now + (f.repair_s * US) as u64, Ev::HostRecover { host: h });
        if f.replace_lost && !self.arrivals_done {
            for m in lost.into_values() {
                if m.until_us > now {
                    // Not from a random stream: the workload streams must not depend on
                    // how many machines a policy happened to have on the host.
                    let exchange = (self.out.lost as usize + h as usize) % self.sc.exchanges;
                    let left = if m.until_us == u64::MAX {
                        u64::MAX
                    } else {
                        m.until_us - now
                    };
                    self.submit(exchange, region, m.size, vec![left]);
                }
            }
        }
    }

    // ---- bookkeeping ----

    /// A host's ledger changed: check the invariant if asked, and publish.
    fn changed(&mut self, h: u32) {
        if self.sc.check_invariants {
            let host = &self.fleet.hosts[h as usize];
            let l = &host.ledger;
            let held = add(l.committed(), l.reserved());
            if !fits(l.capacity(), held) || l.committed() != host.used {
                self.out.invariant_violations += 1;
            }
        }
        self.fleet.publish(h, self.now);
    }

    fn take_snapshot(&mut self) {
        let mut loads: Vec<f64> = self
            .fleet
            .hosts
            .iter()
            .filter(|h| h.alive)
            .map(|h| h.load())
            .collect();
        let stats = load_stats(&mut loads);
        self.out.series.push(Snapshot {
            t_s: self.now as f64 / US,
            stats,
        });
    }
}

fn machine_id(n: u64) -> String {
    format!("m{n}")
}

fn add(a: Resources, b: Resources) -> Resources {
    Resources {
        cpus: a.cpus + b.cpus,
        memory_mb: a.memory_mb + b.memory_mb,
    }
}

fn sub(a: Resources, b: Resources) -> Resources {
    Resources {
        cpus: a.cpus.saturating_sub(b.cpus),
        memory_mb: a.memory_mb.saturating_sub(b.memory_mb),
    }
}
