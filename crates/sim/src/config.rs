//! Scenarios: everything a run depends on besides the policy, read from TOML or flags. A
//! scenario fixes the fleet (hosts, capacities, regions), the workload (arrivals, bursts,
//! deploys, machine sizes, lifetimes), faults (host failures) and the network (round trips,
//! gossip delay, number of exchanges). Same scenario and seed, same result.

use anyhow::{bail, Context};
use bazaar_types::guest::Guest;
use bazaar_types::host::Resources;
use serde::{Deserialize, Serialize};

/// One class of host in the fleet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostClass {
    /// CPUs the ledger counts (shared CPUs are counted as whole ones, so this may exceed
    /// the cores of the box: it is the capacity after overcommit).
    pub cpus: u32,
    pub memory_mb: u64,
    /// Relative share of hosts of this class.
    #[serde(default = "one")]
    pub weight: f64,
}

/// One machine size of the workload mix: a Fly preset, optionally with more memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SizeMix {
    /// `shared-cpu-1x`, `performance-2x`, ...
    pub preset: String,
    /// Memory instead of the preset's (validated as Fly validates sizes).
    #[serde(default)]
    pub memory_mb: Option<u64>,
    #[serde(default = "one")]
    pub weight: f64,
}

/// How long machines live.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Lifetime {
    /// Exponentially distributed with this mean.
    Exponential { mean_s: f64 },
    /// Pareto (heavy-tailed) with this mean and shape `alpha` (> 1; 1.5 is a common fit
    /// for job lifetimes).
    Pareto { mean_s: f64, alpha: f64 },
    /// Machines never leave (fill scenarios).
    Forever,
}

/// Bursts: every `every_s` seconds, `requests` extra requests arrive at once.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bursts {
    pub every_s: f64,
    pub requests: u32,
}

/// Host failures: each host fails after an exponential time with mean `mtbf_hours`, comes
/// back empty after `repair_s`; its machines are lost and, if `replace_lost`, submitted
/// again for placement (as a supervisor would).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Failures {
    pub mtbf_hours: f64,
    pub repair_s: f64,
    #[serde(default = "yes")]
    pub replace_lost: bool,
}

/// Service-time model of a central scheduler (Nomad, Kubernetes): every decision costs
/// `base_us + per_node_us × nodes examined` of one scheduler's time, decisions are served
/// one at a time, and each placement pays `overhead_ms` of consensus writes (Raft / etcd).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CentralCost {
    pub base_us: f64,
    pub per_node_us: f64,
    pub overhead_ms: f64,
}

/// A scenario. Every field has a default (see [`Scenario::default`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    pub seed: u64,
    pub hosts: usize,
    pub regions: usize,
    pub host_classes: Vec<HostClass>,
    /// Machines requested in total; the run stops arriving after that many.
    pub placements: u64,
    /// Target memory utilization used to derive the arrival rate when `rate_per_s` is 0.
    pub load: f64,
    /// Requests per second (Poisson). 0: derived from `load`.
    pub rate_per_s: f64,
    /// Share of requests that are deploys of `deploy_count` machines at once.
    pub deploy_fraction: f64,
    pub deploy_count: u32,
    pub bursts: Option<Bursts>,
    pub sizes: Vec<SizeMix>,
    pub lifetime: Lifetime,
    pub failures: Option<Failures>,
    /// Exchanges (API nodes) placing concurrently; each request goes to one at random.
    pub exchanges: usize,
    /// How old an exchange's view of a host is, on average (each exchange gets a fixed
    /// delay drawn from [0.5, 1.5] × this).
    pub gossip_delay_ms: f64,
    /// Round trip exchange ↔ host: `rtt_ms` + exponential jitter of mean `rtt_jitter_ms`.
    pub rtt_ms: f64,
    pub rtt_jitter_ms: f64,
    /// Market tunables (the rest of `MarketConfig` comes from the policy).
    pub bid_deadline_ms: u64,
    pub reservation_ttl_ms: u64,
    pub rounds: u32,
    /// Cost model of Nomad-style central scheduling.
    pub nomad: CentralCost,
    /// Cost model of Kubernetes-style central scheduling.
    pub kubernetes: CentralCost,
    /// Utilization snapshots taken over the run (imbalance over time).
    pub snapshots: usize,
    /// Policies to compare (see `policy::parse`).
    pub policies: Vec<String>,
    /// Check every ledger's invariant after every change (slow; for tests).
    pub check_invariants: bool,
}

fn one() -> f64 {
    1.0
}
fn yes() -> bool {
    true
}

/// A Fly-like mix: mostly small shared-CPU machines, a tail of performance ones.
pub fn fly_mix() -> Vec<SizeMix> {
    let m = |preset: &str, memory_mb: Option<u64>, weight: f64| SizeMix {
        preset: preset.into(),
        memory_mb,
        weight,
    };
    vec![
        m("shared-cpu-1x", None, 30.0),
        m("shared-cpu-1x", Some(512), 15.0),
        m("shared-cpu-1x", Some(1024), 15.0),
        m("shared-cpu-2x", Some(2048), 8.0),
        m("shared-cpu-4x", Some(1024), 5.0),
        m("performance-1x", None, 12.0),
        m("performance-2x", None, 8.0),
        m("performance-4x", None, 5.0),
        m("performance-8x", None, 2.0),
    ]
}

impl Default for Scenario {
    fn default() -> Self {
        Scenario {
            name: "default".into(),
            seed: 1,
            hosts: 1000,
            regions: 4,
            host_classes: vec![HostClass {
                cpus: 128,
                memory_mb: 128 * 1024,
                weight: 1.0,
            }],
            placements: 100_000,
            load: 0.75,
            rate_per_s: 0.0,
            deploy_fraction: 0.0,
            deploy_count: 20,
            bursts: None,
            sizes: fly_mix(),
            lifetime: Lifetime::Exponential { mean_s: 3600.0 },
            failures: None,
            exchanges: 4,
            gossip_delay_ms: 500.0,
            rtt_ms: 1.0,
            rtt_jitter_ms: 0.5,
            bid_deadline_ms: 250,
            reservation_ttl_ms: 5000,
            rounds: 2,
            // C1M: 3,750 placements/s over 5 servers; ⌈log₂ n⌉ nodes scored.
            nomad: CentralCost {
                base_us: 200.0,
                per_node_us: 5.0,
                overhead_ms: 4.0,
            },
            // ~100-300 pods/s at 5k nodes scoring 500 (anchors.md §5).
            kubernetes: CentralCost {
                base_us: 1000.0,
                per_node_us: 8.0,
                overhead_ms: 4.0,
            },
            snapshots: 40,
            policies: vec![
                "market-d2".into(),
                "market-d3".into(),
                "random".into(),
                "ideal".into(),
                "nomad-binpack".into(),
                "nomad-spread".into(),
                "k8s".into(),
            ],
            check_invariants: false,
        }
    }
}

/// A machine size with its weight, resolved from the mix.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WeightedSize {
    pub size: Resources,
    pub weight: f64,
}

impl Scenario {
    /// Reads a scenario from TOML (missing fields take their defaults).
    pub fn from_toml(text: &str) -> anyhow::Result<Scenario> {
        let s: Scenario = toml::from_str(text).context("parsing scenario")?;
        s.validate()?;
        Ok(s)
    }

    /// Checks the scenario makes sense.
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.hosts == 0 || self.regions == 0 || self.regions > self.hosts {
            bail!(
                "need at least one host per region ({} hosts, {} regions)",
                self.hosts,
                self.regions
            );
        }
        if self.regions > u16::MAX as usize || self.hosts > u32::MAX as usize / 2 {
            bail!("too many hosts or regions");
        }
        if self.host_classes.is_empty() || self.host_classes.iter().any(|c| c.weight <= 0.0) {
            bail!("host_classes must be non-empty with positive weights");
        }
        if self.exchanges == 0 {
            bail!("need at least one exchange");
        }
        if self.rounds == 0 {
            bail!("rounds must be at least 1");
        }
        if !(0.0..=1.0).contains(&self.deploy_fraction) || self.deploy_count == 0 {
            bail!("deploy_fraction must be in [0, 1] and deploy_count ≥ 1");
        }
        match self.lifetime {
            Lifetime::Exponential { mean_s } if mean_s <= 0.0 => bail!("lifetime mean must be > 0"),
            Lifetime::Pareto { mean_s, alpha } if mean_s <= 0.0 || alpha <= 1.0 => {
                bail!("pareto lifetime needs mean_s > 0 and alpha > 1")
            }
            Lifetime::Forever if self.rate_per_s <= 0.0 => {
                bail!("machines that live forever need an explicit rate_per_s")
            }
            _ => {}
        }
        self.resolved_sizes()?;
        for p in &self.policies {
            crate::policy::parse(p, self)?;
        }
        Ok(())
    }

    /// The size mix as ledger resources, each validated as Fly validates sizes.
    pub fn resolved_sizes(&self) -> anyhow::Result<Vec<WeightedSize>> {
        if self.sizes.is_empty() {
            bail!("the size mix is empty");
        }
        self.sizes
            .iter()
            .map(|m| {
                let mut guest = Guest::preset(&m.preset).map_err(anyhow::Error::msg)?;
                if let Some(mb) = m.memory_mb {
                    guest.memory_mb = mb as i64;
                }
                let size = guest
                    .validate()
                    .map_err(|e| anyhow::anyhow!("size {}: {e}", m.preset))?;
                if m.weight <= 0.0 {
                    bail!("size {} has a non-positive weight", m.preset);
                }
                Ok(WeightedSize {
                    size: Resources::from(size),
                    weight: m.weight,
                })
            })
            .collect()
    }

    /// Mean machines per request (deploys count many).
    pub fn mean_count(&self) -> f64 {
        1.0 + self.deploy_fraction * (self.deploy_count as f64 - 1.0)
    }

    /// Requests per second: explicit, or such that the fleet's memory sits at `load` in
    /// steady state (Little's law: λ · mean lifetime · mean size = load · capacity).
    pub fn request_rate(&self) -> f64 {
        if self.rate_per_s > 0.0 {
            return self.rate_per_s;
        }
        let sizes = self.resolved_sizes().unwrap_or_default();
        let wsum: f64 = sizes.iter().map(|s| s.weight).sum();
        let mean_mb: f64 = sizes
            .iter()
            .map(|s| s.weight * s.size.memory_mb as f64)
            .sum::<f64>()
            / wsum;
        let csum: f64 = self.host_classes.iter().map(|c| c.weight).sum();
        let host_mb: f64 = self
            .host_classes
            .iter()
            .map(|c| c.weight * c.memory_mb as f64)
            .sum::<f64>()
            / csum;
        let life = match self.lifetime {
            Lifetime::Exponential { mean_s } | Lifetime::Pareto { mean_s, .. } => mean_s,
            Lifetime::Forever => 1.0,
        };
        let machines_per_s = self.load * self.hosts as f64 * host_mb / (mean_mb * life);
        machines_per_s / self.mean_count()
    }

    /// Region names: Fly-like codes, then `r16`, `r17`, ...
    pub fn region_names(&self) -> Vec<String> {
        const CODES: [&str; 16] = [
            "ams", "iad", "sin", "syd", "fra", "ord", "nrt", "gru", "lhr", "sjc", "cdg", "dfw",
            "yyz", "jnb", "bom", "mad",
        ];
        (0..self.regions)
            .map(|i| {
                CODES
                    .get(i)
                    .map(|s| s.to_string())
                    .unwrap_or_else(|| format!("r{i}"))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_scenario_is_valid_and_round_trips_through_toml() {
        let s = Scenario::default();
        s.validate().unwrap();
        let text = toml::to_string(&s).unwrap();
        assert_eq!(Scenario::from_toml(&text).unwrap(), s);
        assert!(s.request_rate() > 0.0);
    }

    #[test]
    fn partial_toml_takes_defaults_and_rejects_unknown_fields() {
        let s = Scenario::from_toml(
            "hosts = 50\nregions = 2\n[lifetime]\nkind = \"pareto\"\nmean_s = 60\nalpha = 1.5\n",
        )
        .unwrap();
        assert_eq!(s.hosts, 50);
        assert_eq!(s.exchanges, Scenario::default().exchanges);
        assert!(Scenario::from_toml("hostz = 5").is_err());
        assert!(Scenario::from_toml("policies = [\"nope\"]").is_err());
    }
}
