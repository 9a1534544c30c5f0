//! The simulated fleet: hosts with their exact [`Ledger`]s (the truth, as on each agent),
//! the catalog as each exchange sees it (a host's published free capacity and liveness, as
//! of a gossip delay ago), per-region host lists with a sampler that draws random hosts
//! without scanning the region, and an ordered index by load for the central policies that
//! have a perfect view.

use bazaar_placement::Ledger;
use bazaar_types::host::Resources;
use rand::rngs::StdRng;
use rand::Rng;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// One published row of a host's catalog entry.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Published {
    at_us: u64,
    free: Resources,
    alive: bool,
}

/// A machine running on a host.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Running {
    pub size: Resources,
    /// When it leaves (u64::MAX: never).
    pub until_us: u64,
}

/// One host.
#[derive(Debug, Clone)]
pub struct Host {
    pub id: String,
    pub region: u16,
    pub capacity: Resources,
    pub ledger: Ledger,
    pub alive: bool,
    /// Bumped on every failure, so events of an earlier life are ignored.
    pub epoch: u32,
    /// Machines on the host, by machine number.
    pub machines: BTreeMap<u64, Running>,
    /// Resources committed to machines (mirrors the ledger, for cheap statistics).
    pub used: Resources,
    history: VecDeque<Published>,
    order_key: u64,
}

impl Host {
    /// Load: the larger of the memory and CPU fractions committed.
    pub fn load(&self) -> f64 {
        let mem = self.used.memory_mb as f64 / self.capacity.memory_mb.max(1) as f64;
        let cpu = self.used.cpus as f64 / self.capacity.cpus.max(1) as f64;
        mem.max(cpu)
    }
}

/// The fleet and the catalog views.
#[derive(Debug)]
pub struct Fleet {
    pub hosts: Vec<Host>,
    pub region_names: Vec<String>,
    /// Host indices per region.
    pub regions: Vec<Vec<u32>>,
    /// Longest gossip delay of any exchange: history older than that is dropped.
    max_delay_us: u64,
    /// Hosts per region ordered by (held load, index); kept only when asked for.
    order: Option<Vec<BTreeSet<(u64, u32)>>>,
}

/// Formats a host id; [`host_index`] parses it back.
pub fn host_id(index: u32) -> String {
    format!("h{index}")
}

/// The index of a host id made by [`host_id`].
pub fn host_index(id: &str) -> u32 {
    id.strip_prefix('h')
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("not a simulator host id: {id}"))
}

impl Fleet {
    /// A fleet of `capacities.len()` hosts spread round-robin over the regions.
    pub fn new(
        capacities: &[Resources],
        region_names: Vec<String>,
        max_delay_us: u64,
        ordered: bool,
    ) -> Fleet {
        let nregions = region_names.len();
        let mut regions = vec![Vec::new(); nregions];
        let hosts: Vec<Host> = capacities
            .iter()
            .enumerate()
            .map(|(i, &capacity)| {
                let region = (i % nregions) as u16;
                regions[region as usize].push(i as u32);
                let mut history = VecDeque::new();
                history.push_back(Published {
                    at_us: 0,
                    free: capacity,
                    alive: true,
                });
                Host {
                    id: host_id(i as u32),
                    region,
                    capacity,
                    ledger: Ledger::new(capacity),
                    alive: true,
                    epoch: 0,
                    machines: BTreeMap::new(),
                    used: Resources::default(),
                    history,
                    order_key: 0,
                }
            })
            .collect();
        let order = ordered.then(|| {
            let mut sets = vec![BTreeSet::new(); nregions];
            for (i, h) in hosts.iter().enumerate() {
                sets[h.region as usize].insert((0u64, i as u32));
            }
            sets
        });
        Fleet {
            hosts,
            region_names,
            regions,
            max_delay_us,
            order,
        }
    }

    /// Publishes a host's current free capacity and liveness (after any ledger change).
    pub fn publish(&mut self, h: u32, now_us: u64) {
        let max_delay = self.max_delay_us;
        let host = &mut self.hosts[h as usize];
        let free = if host.alive {
            host.ledger.free()
        } else {
            Resources::default()
        };
        let row = Published {
            at_us: now_us,
            free,
            alive: host.alive,
        };
        match host.history.back_mut() {
            Some(last) if last.at_us == now_us => *last = row,
            _ => host.history.push_back(row),
        }
        // Keep the newest row at or before the oldest moment any exchange can look at.
        let cutoff = now_us.saturating_sub(max_delay);
        while host.history.len() >= 2 && host.history[1].at_us <= cutoff {
            host.history.pop_front();
        }
        if let Some(order) = &mut self.order {
            let key = held_key(host.capacity, free, host.alive);
            let set = &mut order[host.region as usize];
            set.remove(&(host.order_key, h));
            set.insert((key, h));
            host.order_key = key;
        }
    }

    /// What an exchange whose view is `delay_us` old sees of host `h`: (free, alive).
    pub fn view(&self, h: u32, now_us: u64, delay_us: u64) -> (Resources, bool) {
        let host = &self.hosts[h as usize];
        let target = now_us.saturating_sub(delay_us);
        let row = host
            .history
            .iter()
            .rev()
            .find(|p| p.at_us <= target)
            .or(host.history.front())
            .expect("history is never empty");
        (row.free, row.alive)
    }

    /// The exact free capacity of an alive host (committed and reserved taken out).
    pub fn exact_free(&self, h: u32) -> Option<Resources> {
        let host = &self.hosts[h as usize];
        host.alive
            .then(|| host.history.back().expect("history").free)
    }

    /// Hosts of a region from least to most held (committed + reserved), when the fleet
    /// keeps the ordered index.
    pub fn least_loaded(&self, region: u16) -> impl Iterator<Item = u32> + '_ {
        self.order
            .as_ref()
            .expect("fleet built without the ordered index")[region as usize]
            .iter()
            .map(|&(_, h)| h)
    }
}

fn held_key(capacity: Resources, free: Resources, alive: bool) -> u64 {
    if !alive {
        return u64::MAX;
    }
    let frac = |free: u64, cap: u64| 1.0 - free as f64 / cap.max(1) as f64;
    let held = 0.7 * frac(free.memory_mb, capacity.memory_mb)
        + 0.3 * frac(free.cpus as u64, capacity.cpus as u64);
    (held.clamp(0.0, 1.0) * 1e12) as u64
}

/// Whether `free` holds `want`.
pub fn fits(free: Resources, want: Resources) -> bool {
    free.memory_mb >= want.memory_mb && free.cpus >= want.cpus
}

/// Draws random hosts of a region without replacement and without scanning it: a partial
/// Fisher-Yates shuffle over a per-region permutation (which stays shuffled between draws).
#[derive(Debug)]
pub struct Sampler {
    perms: Vec<Vec<u32>>,
    /// Hosts looked at by the last draw.
    pub scanned: usize,
}

impl Sampler {
    pub fn new(fleet: &Fleet) -> Sampler {
        Sampler {
            perms: fleet.regions.clone(),
            scanned: 0,
        }
    }

    /// Up to `need` distinct random hosts of `region` for which `keep` holds, in random
    /// order. Returns fewer only when the region has fewer such hosts.
    pub fn sample(
        &mut self,
        region: u16,
        need: usize,
        rng: &mut StdRng,
        mut keep: impl FnMut(u32) -> bool,
    ) -> Vec<u32> {
        let perm = &mut self.perms[region as usize];
        let mut out = Vec::with_capacity(need.min(perm.len()));
        let mut i = 0;
        while out.len() < need && i < perm.len() {
            let j = rng.random_range(i..perm.len());
            perm.swap(i, j);
            if keep(perm[i]) {
                out.push(perm[i]);
            }
            i += 1;
        }
        self.scanned = i;
        out
    }

    /// The region's hosts in the sampler's current order (for scans).
    pub fn region(&self, region: u16) -> &[u32] {
        &self.perms[region as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn r(cpus: u32, memory_mb: u64) -> Resources {
        Resources { cpus, memory_mb }
    }

    #[test]
    fn views_lag_by_the_gossip_delay() {
        let mut f = Fleet::new(&[r(4, 1000); 2], vec!["a".into()], 100, true);
        f.hosts[0].ledger.reserve("x", r(1, 300), 10_000).unwrap();
        f.publish(0, 50);
        assert_eq!(f.view(0, 60, 0).0, r(3, 700));
        assert_eq!(f.view(0, 60, 20).0, r(4, 1000), "20 µs ago it was empty");
        assert_eq!(f.view(0, 500, 100).0, r(3, 700));
        assert_eq!(f.least_loaded(0).next(), Some(1));
        f.hosts[0].ledger.release("x");
        f.publish(0, 1000);
        f.publish(0, 2000);
        assert_eq!(
            f.hosts[0].history.len(),
            2,
            "only the rows an exchange can still see are kept"
        );
        assert_eq!(f.view(0, 2050, 100).0, r(4, 1000));
    }

    #[test]
    fn sampler_draws_distinct_hosts_that_pass_the_filter() {
        let f = Fleet::new(&[r(4, 1000); 40], vec!["a".into(), "b".into()], 0, false);
        let mut s = Sampler::new(&f);
        let mut rng = StdRng::seed_from_u64(3);
        let got = s.sample(1, 5, &mut rng, |h| h % 4 == 1);
        assert_eq!(got.len(), 5);
        assert!(got
            .iter()
            .all(|h| h % 4 == 1 && f.hosts[*h as usize].region == 1));
        let mut d = got.clone();
        d.sort();
        d.dedup();
        assert_eq!(d.len(), 5);
        assert_eq!(s.sample(1, 50, &mut rng, |h| h % 4 == 1).len(), 10);
        assert_eq!(host_index(&host_id(77)), 77);
    }
}
