//! Placement policies, all plug-ins of one interface ([`Policy`]). A policy picks hosts; the
//! engine carries out the protocol its [`Mode`] names, with modelled messages and delays:
//!
//! - [`Mode::Market`]: bazaar's market. The policy runs `bazaar_placement::exchange`
//!   (`candidates`, `choose_asks`) on the exchange's stale view and returns the hosts to ask;
//!   the engine sends the asks, each host answers from its exact ledger (`reserve`), and
//!   the engine calls `choose_winners`, claims and releases.
//! - [`Mode::Direct`]: an exchange decides alone from its stale view and sends the machine
//!   to the host, which may refuse (random; least loaded by the stale view).
//! - [`Mode::Central`]: one central scheduler with a perfect view decides one request at a
//!   time, paying a modelled service time per decision (Nomad, Kubernetes, the ideal).

use crate::config::{CentralCost, Scenario};
use crate::fleet::{fits, host_index, Fleet, Sampler};
use anyhow::bail;
use bazaar_placement::exchange::{
    candidates, choose_asks, Candidate, MarketConfig, PlacementRequest,
};
use bazaar_placement::score::{score, ScorePolicy};
use bazaar_types::host::Resources;
use rand::rngs::StdRng;
use rand::Rng;
use std::collections::BTreeMap;
use std::time::Duration;

/// How a policy's choices are carried out.
#[derive(Debug, Clone, PartialEq)]
pub enum Mode {
    Market(MarketConfig),
    Direct,
    Central(CentralCost),
}

/// What is being placed: `count` machines of `size` in `region`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Request {
    pub region: u16,
    pub size: Resources,
    pub count: u32,
}

/// What a policy may look at when it chooses.
#[derive(Debug)]
pub struct Ctx<'a> {
    pub fleet: &'a Fleet,
    pub sampler: &'a mut Sampler,
    pub rng: &'a mut StdRng,
    pub now_us: u64,
    /// Age of the deciding exchange's view (0 for central policies: a perfect view).
    pub delay_us: u64,
    /// Hosts that refused or failed earlier in this placement.
    pub skip: &'a [u32],
    pub skip_ids: &'a [String],
    /// Which round of this placement this is (1 for the first).
    pub round: u32,
}

impl Ctx<'_> {
    /// The host as the deciding exchange sees it: (free, alive).
    pub fn view(&self, h: u32) -> (Resources, bool) {
        self.fleet.view(h, self.now_us, self.delay_us)
    }
}

/// A policy's choice: for the market, the hosts to ask (a host may appear more than once:
/// one reservation per ask); otherwise one host per machine it could place. `examined` is
/// the number of hosts looked at (drives the central service-time model).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Choice {
    pub hosts: Vec<u32>,
    pub examined: usize,
}

/// A placement policy.
pub trait Policy: std::fmt::Debug {
    /// The name it is asked for by (`market-d2`, `k8s`, ...).
    fn name(&self) -> &str;
    /// How its choices are carried out.
    fn mode(&self) -> Mode;
    /// Whether a deploy of N machines is placed as N separate requests.
    fn splits_deploys(&self) -> bool {
        false
    }
    /// Whether it reads the fleet's ordered-by-load index.
    fn needs_order(&self) -> bool {
        false
    }
    /// Picks hosts for `req` (central policies are asked for one machine at a time).
    fn choose(&mut self, ctx: &mut Ctx<'_>, req: &Request) -> Choice;
}

/// Every policy name `parse` accepts, with what it is.
pub const POLICIES: &[(&str, &str)] = &[
    (
        "market",
        "bazaar's market with MarketConfig::default() (d = 3, ask all below 4)",
    ),
    (
        "market-dN",
        "the market asking N hosts per machine (batch sampling for deploys)",
    ),
    (
        "market-all",
        "the market asking every candidate of the region",
    ),
    (
        "market-escalate-dN",
        "the market asking N per machine, then 4N in the second round, 16N in the third",
    ),
    (
        "per-task-dN",
        "the market, but a deploy of N is N separate placements (no batch sampling)",
    ),
    (
        "random",
        "each exchange sends the machine to a random host that fits by its view",
    ),
    (
        "least-loaded-stale",
        "each exchange sends the machine to the least loaded host by its stale view",
    ),
    (
        "ideal",
        "one central scheduler, perfect view, zero cost: the least loaded host",
    ),
    (
        "nomad-binpack",
        "Nomad: score max(2, ⌈log₂ n⌉) random feasible nodes, bin-pack",
    ),
    ("nomad-spread", "Nomad with scheduler_algorithm = spread"),
    (
        "k8s",
        "kube-scheduler: score percentageOfNodesToScore of the nodes, least allocated + balanced",
    ),
];

/// Builds the policy called `name` for `scenario`.
pub fn parse(name: &str, scenario: &Scenario) -> anyhow::Result<Box<dyn Policy>> {
    let market = |sample_size: usize, ask_all_below: usize| MarketConfig {
        sample_size,
        ask_all_below,
        rounds: scenario.rounds,
        bid_deadline: Duration::from_millis(scenario.bid_deadline_ms),
        reservation_ttl: Duration::from_millis(scenario.reservation_ttl_ms),
    };
    let default_below = MarketConfig::default().ask_all_below;
    let d = |rest: &str| -> anyhow::Result<usize> {
        match rest.parse::<usize>() {
            Ok(d) if (1..=64).contains(&d) => Ok(d),
            _ => bail!("bad sample size in policy {name:?}"),
        }
    };
    let p: Box<dyn Policy> = match name {
        "market" => {
            let def = MarketConfig::default();
            Box::new(Market::new(
                name,
                market(def.sample_size, def.ask_all_below),
                false,
            ))
        }
        "market-all" => Box::new(Market::new(name, market(1, usize::MAX), false)),
        "random" => Box::new(RandomFit),
        "least-loaded-stale" => Box::new(LeastLoadedStale),
        "ideal" => Box::new(Ideal),
        "nomad-binpack" => Box::new(Nomad::new(name, ScorePolicy::BinPack, scenario.nomad)),
        "nomad-spread" => Box::new(Nomad::new(name, ScorePolicy::Spread, scenario.nomad)),
        "k8s" => Box::new(Kubernetes::new(scenario.kubernetes)),
        _ => {
            if let Some(rest) = name.strip_prefix("market-d") {
                Box::new(Market::new(name, market(d(rest)?, default_below), false))
            } else if let Some(rest) = name.strip_prefix("market-escalate-d") {
                let mut m = Market::new(name, market(d(rest)?, default_below), false);
                m.escalate = true;
                Box::new(m)
            } else if let Some(rest) = name.strip_prefix("per-task-d") {
                Box::new(Market::new(name, market(d(rest)?, default_below), true))
            } else {
                let known: Vec<&str> = POLICIES.iter().map(|(n, _)| *n).collect();
                bail!("unknown policy {name:?}; known: {}", known.join(", "))
            }
        }
    };
    Ok(p)
}

/// bazaar's market: `candidates` and `choose_asks` from `bazaar_placement` on the stale
/// view. The catalog scan is replaced by a random draw of candidates from the region (the
/// same distribution as shuffling every candidate, without touching them all).
#[derive(Debug)]
pub struct Market {
    name: String,
    config: MarketConfig,
    per_task: bool,
    /// Ask 4× more hosts in each later round.
    pub escalate: bool,
}

impl Market {
    pub fn new(name: &str, config: MarketConfig, per_task: bool) -> Market {
        Market {
            name: name.into(),
            config,
            per_task,
            escalate: false,
        }
    }
}

impl Policy for Market {
    fn name(&self) -> &str {
        &self.name
    }
    fn mode(&self) -> Mode {
        Mode::Market(self.config.clone())
    }
    fn splits_deploys(&self) -> bool {
        self.per_task
    }
    fn choose(&mut self, ctx: &mut Ctx<'_>, req: &Request) -> Choice {
        let count = req.count.max(1) as usize;
        let mut config = self.config.clone();
        if self.escalate {
            let widen = 4usize.saturating_pow(ctx.round.saturating_sub(1));
            config.sample_size = config.sample_size.saturating_mul(widen);
        }
        // Enough candidates that `choose_asks` makes the same choice as over the whole
        // region: more than `ask_all_below`, and d per machine.
        let need = config
            .ask_all_below
            .saturating_add(1)
            .max(config.sample_size.saturating_mul(count));
        let fleet = ctx.fleet;
        let (now, delay, skip) = (ctx.now_us, ctx.delay_us, ctx.skip);
        let picked = ctx.sampler.sample(req.region, need, ctx.rng, |h| {
            let (free, alive) = fleet.view(h, now, delay);
            alive && fits(free, req.size) && !skip.contains(&h)
        });
        let examined = ctx.sampler.scanned;
        let region = &fleet.region_names[req.region as usize];
        let cands: Vec<Candidate> = picked
            .iter()
            .map(|&h| {
                let host = &fleet.hosts[h as usize];
                let (free, alive) = fleet.view(h, now, delay);
                Candidate {
                    host_id: host.id.clone(),
                    region: region.clone(),
                    capacity: host.capacity,
                    free,
                    alive,
                    draining: false,
                    labels: BTreeMap::new(),
                }
            })
            .collect();
        let preq = PlacementRequest {
            size: req.size,
            count,
            ..Default::default()
        };
        let (ok, _excluded) = candidates(&cands, std::slice::from_ref(region), &preq);
        let asks = choose_asks(&ok, &preq, &config, ctx.skip_ids, ctx.rng);
        Choice {
            hosts: asks.iter().map(|id| host_index(id)).collect(),
            examined,
        }
    }
}

/// Each exchange picks, per machine, a uniformly random host that fits by its view.
#[derive(Debug)]
pub struct RandomFit;

impl Policy for RandomFit {
    fn name(&self) -> &str {
        "random"
    }
    fn mode(&self) -> Mode {
        Mode::Direct
    }
    fn choose(&mut self, ctx: &mut Ctx<'_>, req: &Request) -> Choice {
        let mut hosts = Vec::with_capacity(req.count as usize);
        let fleet = ctx.fleet;
        let (now, delay, skip) = (ctx.now_us, ctx.delay_us, ctx.skip);
        for _ in 0..req.count {
            let got = ctx.sampler.sample(req.region, 1, ctx.rng, |h| {
                let (free, alive) = fleet.view(h, now, delay);
                alive && fits(free, req.size) && !skip.contains(&h)
            });
            hosts.extend(got);
        }
        Choice {
            hosts,
            examined: req.count as usize,
        }
    }
}

/// Each exchange sends each machine to the least loaded host by its own (stale) view,
/// counting its own earlier picks. The policy Mitzenmacher warns herds on old data.
#[derive(Debug)]
pub struct LeastLoadedStale;

impl Policy for LeastLoadedStale {
    fn name(&self) -> &str {
        "least-loaded-stale"
    }
    fn mode(&self) -> Mode {
        Mode::Direct
    }
    fn choose(&mut self, ctx: &mut Ctx<'_>, req: &Request) -> Choice {
        let region = ctx.fleet.regions[req.region as usize].as_slice();
        let mut taken: Vec<(u32, Resources)> = Vec::new();
        let mut hosts = Vec::new();
        for _ in 0..req.count {
            let mut best: Option<(f64, u32, Resources)> = None;
            for &h in region {
                let (mut free, alive) = ctx.view(h);
                if !alive || ctx.skip.contains(&h) {
                    continue;
                }
                if let Some((_, f)) = taken.iter().find(|(t, _)| *t == h) {
                    free = *f;
                }
                if !fits(free, req.size) {
                    continue;
                }
                let cap = ctx.fleet.hosts[h as usize].capacity;
                let s = score(ScorePolicy::Spread, cap, free, req.size);
                if best.is_none_or(|(b, _, _)| s > b) {
                    best = Some((s, h, free));
                }
            }
            let Some((_, h, free)) = best else { break };
            let left = Resources {
                cpus: free.cpus - req.size.cpus,
                memory_mb: free.memory_mb - req.size.memory_mb,
            };
            match taken.iter_mut().find(|(t, _)| *t == h) {
                Some(t) => t.1 = left,
                None => taken.push((h, left)),
            }
            hosts.push(h);
        }
        Choice {
            hosts,
            examined: region.len(),
        }
    }
}

/// The ideal: a central scheduler that knows every host exactly, costs nothing, and puts
/// each machine on the least loaded host that fits.
#[derive(Debug)]
pub struct Ideal;

impl Policy for Ideal {
    fn name(&self) -> &str {
        "ideal"
    }
    fn mode(&self) -> Mode {
        Mode::Central(CentralCost {
            base_us: 0.0,
            per_node_us: 0.0,
            overhead_ms: 0.0,
        })
    }
    fn needs_order(&self) -> bool {
        true
    }
    fn choose(&mut self, ctx: &mut Ctx<'_>, req: &Request) -> Choice {
        let mut examined = 0;
        for h in ctx.fleet.least_loaded(req.region) {
            examined += 1;
            match ctx.fleet.exact_free(h) {
                Some(free) if fits(free, req.size) && !ctx.skip.contains(&h) => {
                    return Choice {
                        hosts: vec![h],
                        examined,
                    }
                }
                // Dead hosts sort last: nothing after them fits.
                None => break,
                _ => {}
            }
        }
        Choice {
            hosts: Vec::new(),
            examined,
        }
    }
}

/// Nomad's service scheduler: feasible nodes in random order, the first
/// max(2, ⌈log₂ n⌉) of them scored (bin-pack or spread), the best wins.
#[derive(Debug)]
pub struct Nomad {
    name: String,
    scoring: ScorePolicy,
    cost: CentralCost,
}

impl Nomad {
    pub fn new(name: &str, scoring: ScorePolicy, cost: CentralCost) -> Nomad {
        Nomad {
            name: name.into(),
            scoring,
            cost,
        }
    }

    /// Nodes Nomad scores in a region of `n` nodes.
    pub fn limit(n: usize) -> usize {
        let log2 = (n.max(1) as f64).log2().ceil() as usize;
        log2.max(2)
    }
}

impl Policy for Nomad {
    fn name(&self) -> &str {
        &self.name
    }
    fn mode(&self) -> Mode {
        Mode::Central(self.cost)
    }
    fn choose(&mut self, ctx: &mut Ctx<'_>, req: &Request) -> Choice {
        let fleet = ctx.fleet;
        let skip = ctx.skip;
        let limit = Nomad::limit(fleet.regions[req.region as usize].len());
        let picked = ctx.sampler.sample(req.region, limit, ctx.rng, |h| {
            fleet.exact_free(h).is_some_and(|f| fits(f, req.size)) && !skip.contains(&h)
        });
        let examined = ctx.sampler.scanned;
        let best = picked
            .iter()
            .map(|&h| {
                let free = fleet.exact_free(h).unwrap_or_default();
                let cap = fleet.hosts[h as usize].capacity;
                (score(self.scoring, cap, free, req.size), h)
            })
            .fold(None::<(f64, u32)>, |best, (s, h)| match best {
                Some((b, _)) if b >= s => best,
                _ => Some((s, h)),
            });
        Choice {
            hosts: best.map(|(_, h)| h).into_iter().collect(),
            examined,
        }
    }
}

/// kube-scheduler with default plugins: nodes scanned from a rotating start index until
/// `numFeasibleNodesToFind` feasible ones are found, each scored LeastAllocated +
/// BalancedAllocation, the best wins (ties at random).
#[derive(Debug)]
pub struct Kubernetes {
    cost: CentralCost,
    next_start: Vec<usize>,
}

impl Kubernetes {
    pub fn new(cost: CentralCost) -> Kubernetes {
        Kubernetes {
            cost,
            next_start: Vec::new(),
        }
    }

    /// kube-scheduler's `numFeasibleNodesToFind` with the default percentage.
    pub fn nodes_to_find(n: usize) -> usize {
        if n < 100 {
            return n;
        }
        let pct = 50usize.saturating_sub(n / 125).max(5);
        (n * pct / 100).max(100)
    }
}

impl Policy for Kubernetes {
    fn name(&self) -> &str {
        "k8s"
    }
    fn mode(&self) -> Mode {
        Mode::Central(self.cost)
    }
    fn choose(&mut self, ctx: &mut Ctx<'_>, req: &Request) -> Choice {
        let nodes = ctx.fleet.regions[req.region as usize].as_slice();
        let n = nodes.len();
        if self.next_start.len() < ctx.fleet.regions.len() {
            self.next_start.resize(ctx.fleet.regions.len(), 0);
        }
        let want = Kubernetes::nodes_to_find(n);
        let start = self.next_start[req.region as usize];
        let (mut found, mut examined, mut ties) = (0, 0, 0u32);
        let mut best: Option<(f64, u32)> = None;
        while examined < n && found < want {
            let h = nodes[(start + examined) % n];
            examined += 1;
            let Some(free) = ctx.fleet.exact_free(h) else {
                continue;
            };
            if !fits(free, req.size) || ctx.skip.contains(&h) {
                continue;
            }
            found += 1;
            let cap = ctx.fleet.hosts[h as usize].capacity;
            let frac = |free: u64, want: u64, cap: u64| (free - want) as f64 / cap.max(1) as f64;
            let cpu_free = frac(free.cpus as u64, req.size.cpus as u64, cap.cpus as u64);
            let mem_free = frac(free.memory_mb, req.size.memory_mb, cap.memory_mb);
            let least_allocated = (cpu_free + mem_free) / 2.0;
            let balanced = 1.0 - (cpu_free - mem_free).abs() / 2.0;
            let s = least_allocated + balanced;
            match best {
                Some((b, _)) if s < b => {}
                Some((b, _)) if s == b => {
                    ties += 1;
                    if ctx.rng.random_range(0..=ties) == 0 {
                        best = Some((s, h));
                    }
                }
                _ => {
                    ties = 0;
                    best = Some((s, h));
                }
            }
        }
        self.next_start[req.region as usize] = (start + examined) % n.max(1);
        Choice {
            hosts: best.map(|(_, h)| h).into_iter().collect(),
            examined,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_policy_parses() {
        let s = Scenario::default();
        for (name, _) in POLICIES {
            let name = name.replace('N', "2");
            let p = parse(&name, &s).unwrap();
            assert_eq!(p.name(), name);
        }
        assert!(parse("market-d0", &s).is_err());
        assert!(parse("nope", &s).is_err());
    }

    #[test]
    fn scoring_sample_sizes_match_the_references() {
        assert_eq!(Nomad::limit(100), 7);
        assert_eq!(Nomad::limit(10_000), 14);
        assert_eq!(Nomad::limit(1), 2);
        assert_eq!(Kubernetes::nodes_to_find(50), 50);
        assert_eq!(Kubernetes::nodes_to_find(500), 230);
        assert_eq!(Kubernetes::nodes_to_find(1000), 420);
        assert_eq!(Kubernetes::nodes_to_find(5000), 500);
        assert_eq!(Kubernetes::nodes_to_find(10_000), 500);
    }
}
