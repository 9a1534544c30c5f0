//! Theory checks: the simulator and the placement code measured against closed forms.
//!
//! - Balls into bins with d choices, placed by the market code (`candidates`,
//!   `choose_asks`, ledger bids, `choose_winners`, claim): the fraction of bins with load
//!   ≥ i against the fluid limit ds_i/dt = s_{i-1}^d − s_i^d (exact as n → ∞; for d = 1 it
//!   is the Poisson tail), and the max load against ln ln n / ln d and ln n / ln ln n
//!   (Gonnet: Γ⁻¹(n) − 3/2).
//! - The supermarket model (n FIFO servers, Poisson(λn) arrivals, exp(1) service, join
//!   the shortest of d): queue tails s_i = λ^((dⁱ−1)/(d−1)) and mean time in system
//!   T_d(λ) = Σ_{i≥1} λ^((dⁱ−d)/(d−1)), measured with a batch-means confidence interval.
//!   The choice can be made by the market code, by a plain shortest-of-d, at random, or by
//!   Join-Idle-Queue (the question for the proxy's request routing).

use bazaar_placement::exchange::{
    candidates, choose_asks, choose_winners, Candidate, MarketConfig, Offer, PlacementRequest,
};
use bazaar_placement::Ledger;
use bazaar_types::host::Resources;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};

// ---- closed forms ----

/// Supermarket model: fraction of queues with at least `i` jobs.
pub fn supermarket_tail(lambda: f64, d: u32, i: u32) -> f64 {
    if d == 1 {
        return lambda.powi(i as i32);
    }
    let d = d as f64;
    lambda.powf((d.powi(i as i32) - 1.0) / (d - 1.0))
}

/// Supermarket model: mean time in system, T_d(λ) (T_1 = 1/(1−λ)).
pub fn supermarket_mean_time(lambda: f64, d: u32) -> f64 {
    if d == 1 {
        return 1.0 / (1.0 - lambda);
    }
    let df = d as f64;
    let mut sum = 0.0;
    for i in 1..200 {
        let term = lambda.powf((df.powi(i) - df) / (df - 1.0));
        sum += term;
        if term < 1e-15 {
            break;
        }
    }
    sum
}

/// Balls into bins with d choices, fluid limit: s_i = the fraction of bins with at least
/// `i` balls after `balls_per_bin`·n balls, for i = 0..=max_i.
pub fn balls_fluid(d: u32, balls_per_bin: f64, max_i: usize) -> Vec<f64> {
    let deriv = |s: &[f64]| -> Vec<f64> {
        let mut ds = vec![0.0; s.len()];
        for i in 1..s.len() {
            ds[i] = s[i - 1].powi(d as i32) - s[i].powi(d as i32);
        }
        ds
    };
    let mut s = vec![0.0; max_i + 1];
    s[0] = 1.0;
    let steps = (balls_per_bin * 2000.0).ceil().max(1.0) as usize;
    let h = balls_per_bin / steps as f64;
    for _ in 0..steps {
        let k1 = deriv(&s);
        let s2: Vec<f64> = s.iter().zip(&k1).map(|(a, k)| a + h / 2.0 * k).collect();
        let k2 = deriv(&s2);
        let s3: Vec<f64> = s.iter().zip(&k2).map(|(a, k)| a + h / 2.0 * k).collect();
        let k3 = deriv(&s3);
        let s4: Vec<f64> = s.iter().zip(&k3).map(|(a, k)| a + h * k).collect();
        let k4 = deriv(&s4);
        for i in 1..s.len() {
            s[i] += h / 6.0 * (k1[i] + 2.0 * k2[i] + 2.0 * k3[i] + k4[i]);
        }
    }
    s
}

/// Expected max load from the fluid tail, taking the bins as independent:
/// Σ_i (1 − exp(−n·s_i)).
pub fn expected_max_from_fluid(n: usize, s: &[f64]) -> f64 {
    s.iter()
        .skip(1)
        .map(|si| 1.0 - (-(n as f64) * si).exp())
        .sum()
}

/// ln Γ(x) for x > 0 (Lanczos, g = 7).
pub fn ln_gamma(x: f64) -> f64 {
    const G: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut a = G[0];
    let t = x + 7.5;
    for (i, g) in G.iter().enumerate().skip(1) {
        a += g / (x + i as f64);
    }
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

/// Gonnet's one-choice max load for n balls in n bins: Γ⁻¹(n) − 3/2.
pub fn gonnet_max_load(n: usize) -> f64 {
    let target = (n as f64).ln();
    let (mut lo, mut hi) = (2.0, 200.0);
    for _ in 0..200 {
        let mid = (lo + hi) / 2.0;
        if ln_gamma(mid) < target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo - 1.5
}

// ---- the market, synchronously ----

/// The market run synchronously over a set of ledgers (no delays, a fresh view): sample,
/// `candidates`, `choose_asks`, every asked ledger bids with `reserve`, `choose_winners`,
/// claim the winner, release the rest. The placement code, without the network.
#[derive(Debug)]
pub struct SyncMarket {
    pub ledgers: Vec<Ledger>,
    ids: Vec<String>,
    region: String,
    config: MarketConfig,
    perm: Vec<u32>,
    next: u64,
}

impl SyncMarket {
    /// `n` hosts of `capacity`, asking `d` per machine (`ask_all_below` 0: always sample).
    pub fn new(n: usize, capacity: Resources, d: usize) -> SyncMarket {
        SyncMarket {
            ledgers: vec![Ledger::new(capacity); n],
            ids: (0..n).map(|i| format!("h{i}")).collect(),
            region: "r".into(),
            config: MarketConfig {
                sample_size: d,
                ask_all_below: 0,
                ..MarketConfig::default()
            },
            perm: (0..n as u32).collect(),
            next: 0,
        }
    }

    /// Places one machine of `size`; returns (host, machine id), or None if nobody bid.
    pub fn place(&mut self, size: Resources, rng: &mut StdRng) -> Option<(usize, String)> {
        let need = self.config.sample_size.max(1);
        let n = self.perm.len();
        let mut cands = Vec::with_capacity(need);
        let mut i = 0;
        while cands.len() < need && i < n {
            let j = rng.random_range(i..n);
            self.perm.swap(i, j);
            let h = self.perm[i] as usize;
            let l = &self.ledgers[h];
            cands.push(Candidate {
                host_id: self.ids[h].clone(),
                region: self.region.clone(),
                capacity: l.capacity(),
                free: l.free(),
                alive: true,
                draining: false,
                labels: BTreeMap::new(),
            });
            i += 1;
        }
        let req = PlacementRequest {
            size,
            count: 1,
            ..Default::default()
        };
        let (ok, _) = candidates(&cands, std::slice::from_ref(&self.region), &req);
        let asks = choose_asks(&ok, &req, &self.config, &[], rng);
        let mut offers = Vec::with_capacity(asks.len());
        for host in asks {
            let h = host_number(&host);
            self.next += 1;
            let res = format!("r{}", self.next);
            if let Ok((_, score)) = self.ledgers[h].reserve(&res, size, u64::MAX - 1) {
                offers.push(Offer {
                    host_id: host,
                    reservation_id: res,
                    score,
                });
            }
        }
        let (winners, rest) = choose_winners(offers, 1);
        for o in rest {
            self.ledgers[host_number(&o.host_id)].release(&o.reservation_id);
        }
        let w = winners.into_iter().next()?;
        let h = host_number(&w.host_id);
        let machine = format!("m{}", self.next);
        self.ledgers[h]
            .claim(&w.reservation_id, &machine)
            .expect("a fresh reservation can be claimed");
        // Forget the claimed reservation (the machine holds the resources).
        self.ledgers[h].expire(u64::MAX, 0);
        Some((h, machine))
    }
}

fn host_number(id: &str) -> usize {
    id[1..].parse().expect("host id")
}

// ---- balls into bins ----

/// One balls-into-bins run.
#[derive(Debug, Clone, PartialEq)]
pub struct BallsResult {
    pub n: usize,
    pub balls: usize,
    pub d: u32,
    /// Fraction of bins with at least i balls, i = 0..
    pub tail: Vec<f64>,
    pub max_load: u64,
}

/// Throws `balls` balls into `n` bins, each to the least loaded of `d` random bins chosen
/// by the market code (ledgers with room for everything; the spread score prefers the
/// emptier host, so the winning bid is the least loaded bin).
pub fn balls_into_bins(n: usize, balls: usize, d: u32, seed: u64) -> BallsResult {
    let big = Resources {
        cpus: 1 << 24,
        memory_mb: 1 << 24,
    };
    let unit = Resources {
        cpus: 1,
        memory_mb: 1,
    };
    let mut market = SyncMarket::new(n, big, d as usize);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut load = vec![0u64; n];
    for _ in 0..balls {
        let (h, _) = market.place(unit, &mut rng).expect("room for every ball");
        load[h] += 1;
    }
    let max_load = load.iter().copied().max().unwrap_or(0);
    let tail = (0..=max_load)
        .map(|i| load.iter().filter(|&&l| l >= i).count() as f64 / n as f64)
        .collect();
    BallsResult {
        n,
        balls,
        d,
        tail,
        max_load,
    }
}

// ---- the supermarket model ----

/// How an arriving job picks its server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chooser {
    /// One server at random (d = 1).
    Random,
    /// Shortest of d random servers, ties at random.
    ShortestOf(u32),
    /// Shortest of d, chosen by the market code (each queued job is a committed machine
    /// in the server's ledger; the spread bid prefers the shorter queue).
    Market(u32),
    /// Join-Idle-Queue with this many dispatchers: idle servers register with a random
    /// dispatcher; a job goes to an idle server of its dispatcher, else to a random one.
    Jiq(u32),
}

/// A supermarket-model run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SupermarketConfig {
    pub n: usize,
    pub lambda: f64,
    pub chooser: Chooser,
    /// Jobs simulated (the first `warmup` fraction is not measured).
    pub jobs: usize,
    pub warmup: f64,
    pub seed: u64,
}

/// What a supermarket run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct SupermarketResult {
    pub mean_time: f64,
    /// Half-width of the 95 % confidence interval of `mean_time` (20 batch means).
    pub ci95: f64,
    /// Time-average fraction of servers with at least i jobs, i = 0..=8 (seen by arrivals).
    pub tail: Vec<f64>,
    /// Messages per job on top of the job itself (probes, idle registrations).
    pub messages_per_job: f64,
}

#[derive(Debug, PartialEq)]
struct Dep(f64, u32, u64);
impl Eq for Dep {}
impl PartialOrd for Dep {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Dep {
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .0
            .total_cmp(&self.0)
            .then_with(|| other.2.cmp(&self.2))
    }
}

/// Runs the supermarket model.
pub fn supermarket(cfg: SupermarketConfig) -> SupermarketResult {
    const TAIL: usize = 9;
    let n = cfg.n;
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let mut qlen = vec![0u32; n];
    let mut last_dep = vec![0.0f64; n];
    let mut count_ge = [0u64; TAIL + 1];
    count_ge[0] = n as u64;
    let mut deps: BinaryHeap<Dep> = BinaryHeap::new();
    let d_of = |c: Chooser| match c {
        Chooser::ShortestOf(d) | Chooser::Market(d) => d,
        _ => 1,
    };
    let mut market = matches!(cfg.chooser, Chooser::Market(_)).then(|| {
        SyncMarket::new(
            n,
            Resources {
                cpus: 1 << 20,
                memory_mb: 1 << 20,
            },
            d_of(cfg.chooser) as usize,
        )
    });
    let mut machine_of: Vec<VecDeque<String>> = vec![VecDeque::new(); n];
    let dispatchers = match cfg.chooser {
        Chooser::Jiq(m) => m.max(1) as usize,
        _ => 0,
    };
    let mut iq: Vec<VecDeque<u32>> = vec![VecDeque::new(); dispatchers];
    let mut registered = vec![dispatchers > 0; n];
    if dispatchers > 0 {
        for s in 0..n {
            iq[rng.random_range(0..dispatchers)].push_back(s as u32);
        }
    }
    let mut perm: Vec<u32> = (0..n as u32).collect();
    let unit = Resources {
        cpus: 1,
        memory_mb: 1,
    };
    let mut job = 0u64;
    // Start near equilibrium (queue lengths drawn from the model's own tail) so the
    // warm-up needs not outlast the slow relaxation of heavily loaded queues.
    let d_start = d_of(cfg.chooser);
    if !matches!(cfg.chooser, Chooser::Jiq(_)) {
        for s in 0..n {
            let u: f64 = rng.random();
            let q = (1..200)
                .take_while(|&i| supermarket_tail(cfg.lambda, d_start, i) > u)
                .count();
            let mut at = 0.0;
            for _ in 0..q {
                at += -(1.0 - rng.random::<f64>()).ln();
                job += 1;
                deps.push(Dep(at, s as u32, job));
                qlen[s] += 1;
                if (qlen[s] as usize) <= TAIL {
                    count_ge[qlen[s] as usize] += 1;
                }
                if let Some(m) = &mut market {
                    let id = format!("m-init-{job}");
                    m.ledgers[s]
                        .commit(&id, unit)
                        .expect("room for the initial queue");
                    machine_of[s].push_back(id);
                }
            }
            last_dep[s] = at;
        }
    }
    let warm = (cfg.jobs as f64 * cfg.warmup) as usize;
    let measured = cfg.jobs - warm;
    let batches = 20;
    let per_batch = (measured / batches).max(1);
    let mut batch_sums = vec![0.0; batches];
    // Also batched by server group: for d = 1 the groups are independent, for d ≥ 2 nearly
    // so (propagation of chaos); time batches alone understate the error when a batch is
    // shorter than the queues' relaxation time.
    let mut group_sums = vec![0.0; batches];
    let mut group_counts = vec![0.0; batches];
    let mut tail_sums = [0.0; TAIL];
    let mut messages = 0u64;
    let mut t = 0.0;
    let rate = cfg.lambda * n as f64;
    for k in 0..cfg.jobs {
        let u: f64 = rng.random();
        t += -(1.0 - u).ln() / rate;
        while deps.peek().is_some_and(|d| d.0 <= t) {
            let Dep(_, s, _) = deps.pop().expect("peeked");
            let s = s as usize;
            if (qlen[s] as usize) <= TAIL {
                count_ge[qlen[s] as usize] -= 1;
            }
            qlen[s] -= 1;
            if let Some(m) = &mut market {
                let id = machine_of[s].pop_front().expect("job in queue");
                m.ledgers[s].uncommit(&id);
            }
            if dispatchers > 0 && qlen[s] == 0 && !registered[s] {
                iq[rng.random_range(0..dispatchers)].push_back(s as u32);
                registered[s] = true;
                messages += 1;
            }
        }
        if k >= warm {
            for (i, sum) in tail_sums.iter_mut().enumerate() {
                *sum += count_ge[i] as f64 / n as f64;
            }
        }
        let s = match cfg.chooser {
            Chooser::Random => rng.random_range(0..n),
            Chooser::ShortestOf(d) => {
                let mut best: Option<usize> = None;
                for i in 0..(d as usize).min(n) {
                    let j = rng.random_range(i..n);
                    perm.swap(i, j);
                    let c = perm[i] as usize;
                    if best.is_none_or(|b| qlen[c] < qlen[b]) {
                        best = Some(c);
                    }
                }
                messages += d as u64;
                best.expect("d ≥ 1")
            }
            Chooser::Market(d) => {
                let m = market.as_mut().expect("market chooser");
                let (s, id) = m.place(unit, &mut rng).expect("room");
                machine_of[s].push_back(id);
                messages += d as u64;
                s
            }
            Chooser::Jiq(_) => {
                let disp = rng.random_range(0..dispatchers);
                match iq[disp].pop_front() {
                    Some(s) => {
                        registered[s as usize] = false;
                        s as usize
                    }
                    None => rng.random_range(0..n),
                }
            }
        };
        let service = -(1.0 - rng.random::<f64>()).ln();
        let start = t.max(last_dep[s]);
        let done = start + service;
        last_dep[s] = done;
        qlen[s] += 1;
        if (qlen[s] as usize) <= TAIL {
            count_ge[qlen[s] as usize] += 1;
        }
        job += 1;
        deps.push(Dep(done, s as u32, job));
        if k >= warm {
            let b = ((k - warm) / per_batch).min(batches - 1);
            batch_sums[b] += done - t;
            group_sums[s % batches] += done - t;
            group_counts[s % batches] += 1.0;
        }
    }
    let counts: Vec<f64> = (0..batches)
        .map(|b| {
            if b == batches - 1 {
                (measured - per_batch * (batches - 1)) as f64
            } else {
                per_batch as f64
            }
        })
        .collect();
    let mean_time = batch_sums.iter().sum::<f64>() / measured as f64;
    let half_width = |sums: &[f64], counts: &[f64]| {
        let means: Vec<f64> = sums
            .iter()
            .zip(counts)
            .map(|(s, c)| s / c.max(1.0))
            .collect();
        let bm = means.iter().sum::<f64>() / batches as f64;
        let var = means.iter().map(|m| (m - bm) * (m - bm)).sum::<f64>() / (batches - 1) as f64;
        // Student t, 19 degrees of freedom, 97.5 %.
        2.093 * (var / batches as f64).sqrt()
    };
    let ci95 = half_width(&batch_sums, &counts).max(half_width(&group_sums, &group_counts));
    SupermarketResult {
        mean_time,
        ci95,
        tail: tail_sums.iter().map(|s| s / measured as f64).collect(),
        messages_per_job: messages as f64 / cfg.jobs as f64,
    }
}

// ---- the report printed by `bazaar sim --theory` ----

/// Balls-into-bins over `seeds` seeds, pooled: (mean tail, mean max load, min, max).
pub fn balls_pooled(
    n: usize,
    balls: usize,
    d: u32,
    seeds: u64,
    seed: u64,
) -> (Vec<f64>, f64, u64, u64) {
    let mut tail: Vec<f64> = Vec::new();
    let (mut sum_max, mut lo, mut hi) = (0u64, u64::MAX, 0u64);
    for k in 0..seeds {
        let r = balls_into_bins(n, balls, d, seed.wrapping_mul(1000).wrapping_add(k));
        if tail.len() < r.tail.len() {
            tail.resize(r.tail.len(), 0.0);
        }
        for (t, v) in tail.iter_mut().zip(&r.tail) {
            *t += v / seeds as f64;
        }
        sum_max += r.max_load;
        lo = lo.min(r.max_load);
        hi = hi.max(r.max_load);
    }
    (tail, sum_max as f64 / seeds as f64, lo, hi)
}

/// Measured against formulas, as text. `full` uses larger systems (seconds in release).
pub fn report(full: bool, seed: u64) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let (sizes, seeds): (&[usize], u64) = if full {
        (&[10_000, 100_000, 1_000_000], 3)
    } else {
        (&[10_000], 5)
    };
    let _ = writeln!(
        out,
        "Balls into bins (n balls, n bins, least loaded of d; placed by the market code)"
    );
    let _ = writeln!(
        out,
        "{:>9} {:>2}  {:>21}  {:>21}  {:>21}  {:>9}  {:>9}  {:>11}",
        "n",
        "d",
        "s1 measured/fluid",
        "s2 measured/fluid",
        "s3 measured/fluid",
        "max load",
        "fluid E",
        "leading"
    );
    for &n in sizes {
        for d in [1u32, 2, 3] {
            let (tail, mean_max, lo, hi) = balls_pooled(n, n, d, seeds, seed);
            let fluid = balls_fluid(d, 1.0, 30);
            let cell =
                |i: usize| format!("{:.4}/{:.4}", tail.get(i).copied().unwrap_or(0.0), fluid[i]);
            let lnn = (n as f64).ln();
            let leading = if d == 1 {
                format!("{:.2} (G {:.2})", lnn / lnn.ln(), gonnet_max_load(n))
            } else {
                format!("{:.2}", lnn.ln() / (d as f64).ln())
            };
            let _ = writeln!(
                out,
                "{n:>9} {d:>2}  {:>21}  {:>21}  {:>21}  {:>4.2} {lo}-{hi}  {:>9.2}  {leading:>11}",
                cell(1),
                cell(2),
                cell(3),
                mean_max,
                expected_max_from_fluid(n, &fluid)
            );
        }
    }
    let _ = writeln!(out, "leading: ln n / ln ln n for d = 1 (G: Gonnet's Γ⁻¹(n) − 3/2), ln ln n / ln d for d ≥ 2; both + O(1)");
    let n = if full { 100_000 } else { 10_000 };
    let _ = writeln!(
        out,
        "\nHeavily loaded (m = 16n balls, n = {n}): gap = max load − m/n"
    );
    for d in [1u32, 2] {
        let (_, mean_max, _, _) = balls_pooled(n, 16 * n, d, if full { 2 } else { 1 }, seed);
        let lnn = (n as f64).ln();
        let bound = if d == 1 {
            format!("Θ(√(m ln n / n)) = {:.2}", (16.0 * lnn).sqrt())
        } else {
            format!("ln ln n / ln d = {:.2}", lnn.ln() / (d as f64).ln())
        };
        let _ = writeln!(out, "  d = {d}: gap {:.2}   ({bound})", mean_max - 16.0);
    }
    let (servers, jobs) = if full {
        (1000, 2_000_000)
    } else {
        (500, 400_000)
    };
    let lambdas: &[f64] = if full {
        &[0.5, 0.8, 0.9, 0.95]
    } else {
        &[0.8, 0.9]
    };
    let _ = writeln!(
        out,
        "\nSupermarket model (n = {servers} FIFO servers, exp(1) service, {jobs} jobs; d ≥ 2 chosen by the market code)"
    );
    let _ = writeln!(
        out,
        "{:>5} {:>2}  {:>17}  {:>8}  {:>7}  {:>15}  {:>15}  {:>15}",
        "λ",
        "d",
        "T measured ± 95%",
        "T_d(λ)",
        "error",
        "s2 meas/formula",
        "s3 meas/formula",
        "s4 meas/formula"
    );
    for &lambda in lambdas {
        for d in [1u32, 2, 3] {
            let chooser = if d == 1 {
                Chooser::Random
            } else {
                Chooser::Market(d)
            };
            let r = supermarket(SupermarketConfig {
                n: servers,
                lambda,
                chooser,
                jobs,
                warmup: 0.2,
                seed,
            });
            let t = supermarket_mean_time(lambda, d);
            let cell = |i: u32| {
                format!(
                    "{:.4}/{:.4}",
                    r.tail[i as usize],
                    supermarket_tail(lambda, d, i)
                )
            };
            let _ = writeln!(
                out,
                "{lambda:>5.2} {d:>2}  {:>8.4} ± {:<6.4}  {t:>8.4}  {:>+6.2}%  {:>15}  {:>15}  {:>15}",
                r.mean_time,
                r.ci95,
                (r.mean_time / t - 1.0) * 100.0,
                cell(2),
                cell(3),
                cell(4)
            );
        }
    }
    let _ = writeln!(
        out,
        "\nRequest routing (the proxy's problem): mean time in system and messages per request"
    );
    let _ = writeln!(
        out,
        "{:>5}  {:>15}  {:>15}  {:>15}  {:>15}",
        "λ", "random", "shortest of 2", "JIQ, 1 router", "JIQ, 10 routers"
    );
    for &lambda in &[0.5, 0.8, 0.9, 0.95] {
        let mut cells = Vec::new();
        for chooser in [
            Chooser::Random,
            Chooser::ShortestOf(2),
            Chooser::Jiq(1),
            Chooser::Jiq(10),
        ] {
            let r = supermarket(SupermarketConfig {
                n: servers,
                lambda,
                chooser,
                jobs,
                warmup: 0.2,
                seed,
            });
            cells.push(format!(
                "{:.3} ({:.2} msg)",
                r.mean_time, r.messages_per_job
            ));
        }
        let _ = writeln!(
            out,
            "{lambda:>5.2}  {:>15}  {:>15}  {:>15}  {:>15}",
            cells[0], cells[1], cells[2], cells[3]
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closed_forms_match_the_anchor_values() {
        // anchors.md §2.
        assert!((supermarket_mean_time(0.8, 2) - 1.9474).abs() < 1e-4);
        assert!((supermarket_mean_time(0.9, 2) - 2.6141).abs() < 1e-4);
        assert!((supermarket_mean_time(0.99, 2) - 5.4320).abs() < 1e-4);
        assert!((supermarket_mean_time(0.8, 3) - 1.5809).abs() < 1e-4);
        assert!((supermarket_mean_time(0.5, 10) - 1.0010).abs() < 1e-4);
        assert!((supermarket_mean_time(0.8, 1) - 5.0).abs() < 1e-9);
        assert!((supermarket_tail(0.9, 2, 4) - 0.206).abs() < 1e-3);
        assert!((supermarket_tail(0.9, 3, 3) - 0.254).abs() < 1e-3);
        // Γ(5) = 24.
        assert!((ln_gamma(5.0) - 24f64.ln()).abs() < 1e-10);
        // One choice: the fluid limit is the Poisson(1) tail.
        let s = balls_fluid(1, 1.0, 4);
        let p_ge1 = 1.0 - (-1f64).exp();
        assert!((s[1] - p_ge1).abs() < 1e-6, "{s:?}");
        assert!((s[2] - (p_ge1 - (-1f64).exp())).abs() < 1e-6);
        let two = balls_fluid(2, 1.0, 6);
        assert!(two[3] < s[3] / 5.0, "two choices cut the tail: {two:?}");
    }

    #[test]
    fn sync_market_places_on_the_least_loaded_of_those_asked() {
        let mut m = SyncMarket::new(
            2,
            Resources {
                cpus: 100,
                memory_mb: 100,
            },
            2,
        );
        let mut rng = StdRng::seed_from_u64(1);
        let unit = Resources {
            cpus: 1,
            memory_mb: 1,
        };
        let mut load = [0; 2];
        for _ in 0..10 {
            load[m.place(unit, &mut rng).unwrap().0] += 1;
        }
        assert_eq!(load, [5, 5], "asking both hosts alternates them");
        for l in &m.ledgers {
            assert_eq!(l.num_open_reservations(), 0);
        }
    }
}
