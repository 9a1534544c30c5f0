//! The exchange's side of the market (DESIGN.md "The market"), as pure functions: which
//! hosts may take a request (from a possibly stale view), which of them to ask (power of d
//! choices; batch sampling for many machines at once, as Sparrow does), how bids rank, and
//! the record of a placement that `explain` shows. The API drives these with real bid
//! requests; the simulator drives them with modelled ones.

use bazaar_types::host::Resources;
use rand::seq::SliceRandom;
use rand::Rng;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// What the exchange knows of a host (from the catalog; the free figure may be stale).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    pub host_id: String,
    pub region: String,
    pub capacity: Resources,
    pub free: Resources,
    pub alive: bool,
    pub draining: bool,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// Tunables of the market.
#[derive(Debug, Clone, PartialEq)]
pub struct MarketConfig {
    /// Hosts asked per machine (d of "power of d choices").
    pub sample_size: usize,
    /// A region with at most this many candidates is asked whole.
    pub ask_all_below: usize,
    /// Rounds of bidding per region group before giving up on it.
    pub rounds: u32,
    /// How long to wait for bids.
    pub bid_deadline: Duration,
    /// How long a host holds a bid's reservation.
    pub reservation_ttl: Duration,
}

impl Default for MarketConfig {
    fn default() -> Self {
        MarketConfig {
            // d = 2 already gives the exponential improvement of two choices; 3 gives
            // headroom for stale views at a small message cost (docs/SIMULATION.md).
            sample_size: 3,
            ask_all_below: 4,
            rounds: 2,
            bid_deadline: Duration::from_millis(250),
            reservation_ttl: Duration::from_secs(5),
        }
    }
}

/// What is being placed.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PlacementRequest {
    pub size: Resources,
    /// Machines wanted (1 for a single create).
    pub count: usize,
    /// Only this host may take it (a volume lives there).
    pub pinned_host: Option<String>,
    /// Labels a host must have.
    pub labels: BTreeMap<String, String>,
    /// The machine's driver (`process`, `oci`): a host whose labels say it cannot run it
    /// (`bazaar_types::host::cannot_run`) is left out, with its reason.
    pub driver: Option<String>,
    /// A `batch` machine: a host advertising a reclaimed room (`bazaar_types::host::
    /// batch_free`) is judged by that room instead of its free capacity.
    pub batch: bool,
}

/// Parses a region expression: `ams`, `ams,ord` (tried in order), `any`, or `ams,any`.
/// Returns groups of regions to try in order; `any` expands to every known region not
/// already listed. Unknown regions are an error that names the known ones.
pub fn parse_regions(expr: &str, known: &[String]) -> Result<Vec<Vec<String>>, String> {
    let mut groups: Vec<Vec<String>> = Vec::new();
    let mut listed: Vec<String> = Vec::new();
    let parts: Vec<&str> = expr
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if parts.is_empty() {
        return Err("empty region expression".into());
    }
    for part in parts {
        if part == "any" {
            let rest: Vec<String> = known
                .iter()
                .filter(|r| !listed.contains(r))
                .cloned()
                .collect();
            if !rest.is_empty() {
                listed.extend(rest.iter().cloned());
                groups.push(rest);
            }
        } else if known.iter().any(|k| k == part) {
            if !listed.iter().any(|l| l == part) {
                listed.push(part.to_string());
                groups.push(vec![part.to_string()]);
            }
        } else {
            return Err(format!(
                "unknown region {part:?}; known regions: {}",
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            ));
        }
    }
    Ok(groups)
}

/// Why a host was not a candidate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Exclusion {
    pub host_id: String,
    pub reason: String,
}

/// Hosts of `regions` that are alive, not draining, have addresses left, meet the
/// constraints and advertise enough free capacity for one machine; and why the others were
/// left out.
pub fn candidates<'a>(
    hosts: &'a [Candidate],
    regions: &[String],
    req: &PlacementRequest,
) -> (Vec<&'a Candidate>, Vec<Exclusion>) {
    let mut ok = Vec::new();
    let mut excluded = Vec::new();
    for h in hosts.iter().filter(|h| regions.contains(&h.region)) {
        let reason = if !h.alive {
            Some("host is not alive".to_string())
        } else if h.draining {
            Some("host is draining".to_string())
        } else if let Some((driver, why)) = req
            .driver
            .as_deref()
            .and_then(|d| bazaar_types::host::cannot_run(&h.labels, d).map(|why| (d, why)))
        {
            Some(format!("cannot run {driver} machines: missing {why}"))
        } else if let Some(why) = bazaar_types::host::network_full(&h.labels) {
            Some(why.to_string())
        } else if req.pinned_host.as_ref().is_some_and(|p| *p != h.host_id) {
            Some("not the host the machine is pinned to".to_string())
        } else if let Some((k, v)) = req
            .labels
            .iter()
            .find(|(k, v)| h.labels.get(*k) != Some(*v))
        {
            Some(format!("missing label {k}={v}"))
        } else if free_for(h, req).memory_mb < req.size.memory_mb {
            Some(format!(
                "advertises {} MB free{}, needs {}",
                free_for(h, req).memory_mb,
                room_name(h, req),
                req.size.memory_mb
            ))
        } else if free_for(h, req).cpus < req.size.cpus {
            Some(format!(
                "advertises {} cpus free{}, needs {}",
                free_for(h, req).cpus,
                room_name(h, req),
                req.size.cpus
            ))
        } else {
            None
        };
        match reason {
            Some(reason) => excluded.push(Exclusion {
                host_id: h.host_id.clone(),
                reason,
            }),
            None => ok.push(h),
        }
    }
    (ok, excluded)
}

/// What host `h` advertises free for `req`: its reclaimed room for a batch machine where it
/// has one, else its free capacity.
pub fn free_for(h: &Candidate, req: &PlacementRequest) -> Resources {
    match req.batch {
        true => bazaar_types::host::batch_free(&h.labels).unwrap_or(h.free),
        false => h.free,
    }
}

fn room_name(h: &Candidate, req: &PlacementRequest) -> &'static str {
    if req.batch && bazaar_types::host::batch_free(&h.labels).is_some() {
        " for batch machines"
    } else {
        ""
    }
}

/// The hosts to ask for `req.count` machines: `sample_size · count` asks over a random
/// sample of candidates (batch sampling, as Sparrow does, instead of one round per
/// machine), or every candidate when there are few. A host is asked again only while its
/// advertised free capacity could hold one more machine; each ask is one reservation.
/// Hosts in `skip` (they refused or failed earlier in this placement) are not asked.
pub fn choose_asks<R: Rng + ?Sized>(
    cands: &[&Candidate],
    req: &PlacementRequest,
    config: &MarketConfig,
    skip: &[String],
    rng: &mut R,
) -> Vec<String> {
    let count = req.count.max(1);
    let mut pool: Vec<&Candidate> = cands
        .iter()
        .copied()
        .filter(|c| !skip.contains(&c.host_id))
        .collect();
    if pool.is_empty() {
        return Vec::new();
    }
    pool.shuffle(rng);
    let wanted = if pool.len() <= config.ask_all_below {
        pool.len().max(count)
    } else {
        config.sample_size.max(1) * count
    };
    let slots = |c: &Candidate| -> u64 {
        let per = |free: u64, want: u64| free.checked_div(want).unwrap_or(u64::MAX);
        let free = free_for(c, req);
        per(free.memory_mb, req.size.memory_mb).min(per(free.cpus as u64, req.size.cpus as u64))
    };
    let mut asks = Vec::with_capacity(wanted);
    let mut pass = 0u64;
    while asks.len() < wanted {
        let mut asked_this_pass = false;
        for c in &pool {
            if asks.len() >= wanted {
                break;
            }
            // The first ask is always made (the view may be stale in either direction).
            if pass == 0 || pass < slots(c) {
                asks.push(c.host_id.clone());
                asked_this_pass = true;
            }
        }
        if !asked_this_pass {
            break;
        }
        pass += 1;
    }
    asks
}

/// A bid as the exchange sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Offer {
    pub host_id: String,
    pub reservation_id: String,
    pub score: f64,
}

/// Orders offers best first (higher score; ties by host id, so the choice is reproducible)
/// and splits them into the `count` winners and the rest (to release).
pub fn choose_winners(mut offers: Vec<Offer>, count: usize) -> (Vec<Offer>, Vec<Offer>) {
    offers.sort_by(|a, b| {
        b.score
            .partial_cmp(&a.score)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then_with(|| a.host_id.cmp(&b.host_id))
            .then_with(|| a.reservation_id.cmp(&b.reservation_id))
    });
    let rest = offers.split_off(count.min(offers.len()));
    (offers, rest)
}

/// One host's answer in a round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum AskOutcome {
    Bid {
        score: f64,
        reservation_id: String,
        /// A preemption bid: the machines the host would stop, each `id (class)`.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        victims: Vec<String>,
    },
    Refused {
        reason: String,
    },
    NoAnswer {
        error: String,
    },
    /// Won the bid but the claim failed (host gone, reservation expired).
    ClaimFailed {
        error: String,
    },
}

/// One host asked in a round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Ask {
    pub host_id: String,
    #[serde(flatten)]
    pub outcome: AskOutcome,
    pub elapsed_us: u64,
}

/// One round of bidding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Round {
    pub regions: Vec<String>,
    pub asked: Vec<Ask>,
    /// From the first bid request sent to the winners chosen.
    #[serde(default)]
    pub elapsed_us: u64,
}

/// Everything about one placement: who was asked, what each answered, who won and why.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PlacementRecord {
    pub placement_id: String,
    pub size: Resources,
    pub count: usize,
    pub regions: String,
    pub excluded: Vec<Exclusion>,
    pub rounds: Vec<Round>,
    /// Winning host per machine placed.
    pub winners: Vec<String>,
    pub reason: String,
    pub elapsed_us: u64,
    /// Each host's verdict under the machine's placement policy (`config.placement`):
    /// excluded and why, its affinity and spread scores. Empty without a policy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub verdicts: Vec<crate::constraints::HostVerdict>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn host(id: &str, region: &str, free_mb: u64) -> Candidate {
        Candidate {
            host_id: id.into(),
            region: region.into(),
            capacity: Resources {
                cpus: 16,
                memory_mb: 8192,
            },
            free: Resources {
                cpus: 16,
                memory_mb: free_mb,
            },
            alive: true,
            draining: false,
            labels: BTreeMap::new(),
        }
    }

    #[test]
    fn region_expressions() {
        let known: Vec<String> = ["ams", "ord", "sin"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(
            parse_regions("ams", &known).unwrap(),
            vec![vec!["ams".to_string()]]
        );
        assert_eq!(parse_regions("ord,ams", &known).unwrap().len(), 2);
        assert_eq!(parse_regions("any", &known).unwrap(), vec![known.clone()]);
        let g = parse_regions("sin,any", &known).unwrap();
        assert_eq!(
            g,
            vec![
                vec!["sin".to_string()],
                vec!["ams".to_string(), "ord".to_string()]
            ]
        );
        assert!(parse_regions("xyz", &known)
            .unwrap_err()
            .contains("known regions: ams, ord, sin"));
        assert!(parse_regions("", &known).is_err());
    }

    #[test]
    fn a_batch_machine_is_judged_by_the_reclaimed_room_a_host_advertises() {
        let mut full = host("full", "ams", 0);
        full.labels
            .insert(bazaar_types::host::BATCH_FREE_LABEL.into(), "2/1024".into());
        let hosts = vec![full, host("plain", "ams", 0)];
        let regions = vec!["ams".to_string()];
        let size = Resources {
            cpus: 1,
            memory_mb: 512,
        };
        let service = PlacementRequest {
            size,
            count: 1,
            ..Default::default()
        };
        let (ok, excluded) = candidates(&hosts, &regions, &service);
        assert!(ok.is_empty(), "full by requests: {excluded:?}");
        let batch = PlacementRequest {
            batch: true,
            ..service
        };
        let (ok, excluded) = candidates(&hosts, &regions, &batch);
        assert_eq!(ok.len(), 1);
        assert_eq!(ok[0].host_id, "full");
        assert_eq!(excluded[0].host_id, "plain");
        assert!(
            excluded[0]
                .reason
                .contains("advertises 0 MB free, needs 512"),
            "{excluded:?}"
        );
    }

    #[test]
    fn candidates_filter_with_reasons() {
        let mut hosts = vec![
            host("a", "ams", 4096),
            host("b", "ams", 100),
            host("c", "ord", 4096),
            host("d", "ams", 4096),
        ];
        hosts[3].alive = false;
        let req = PlacementRequest {
            size: Resources {
                cpus: 1,
                memory_mb: 256,
            },
            count: 1,
            ..Default::default()
        };
        let (ok, ex) = candidates(&hosts, &["ams".to_string()], &req);
        assert_eq!(
            ok.iter().map(|c| c.host_id.as_str()).collect::<Vec<_>>(),
            vec!["a"]
        );
        assert_eq!(ex.len(), 2);
        assert!(ex
            .iter()
            .any(|e| e.host_id == "b" && e.reason.contains("100 MB")));
        let pinned = PlacementRequest {
            pinned_host: Some("d".into()),
            ..req.clone()
        };
        let (ok, _) = candidates(&hosts, &["ams".to_string()], &pinned);
        assert!(
            ok.is_empty(),
            "a pinned host that is down leaves no candidate"
        );
    }

    #[test]
    fn hosts_that_cannot_run_the_driver_are_left_out_with_why() {
        let mut hosts = vec![host("a", "ams", 4096), host("b", "ams", 4096)];
        hosts[0].labels.insert(
            bazaar_types::host::cannot_run_label("oci"),
            "runc (package runc)".into(),
        );
        let req = |driver: &str| PlacementRequest {
            size: Resources {
                cpus: 1,
                memory_mb: 256,
            },
            count: 1,
            driver: Some(driver.into()),
            ..Default::default()
        };
        let ams = ["ams".to_string()];
        let (ok, ex) = candidates(&hosts, &ams, &req("oci"));
        assert_eq!(ok.iter().map(|c| &c.host_id).collect::<Vec<_>>(), ["b"]);
        assert_eq!(ex.len(), 1);
        assert_eq!(ex[0].host_id, "a");
        assert_eq!(
            ex[0].reason,
            "cannot run oci machines: missing runc (package runc)"
        );
        // Process machines, and a request that names no driver, may go to either.
        assert_eq!(candidates(&hosts, &ams, &req("process")).0.len(), 2);
        let any = PlacementRequest {
            driver: None,
            ..req("oci")
        };
        assert_eq!(candidates(&hosts, &ams, &any).0.len(), 2);
    }

    #[test]
    fn a_host_whose_machine_network_is_full_is_left_out_with_why() {
        let mut hosts = vec![host("a", "ams", 4096), host("b", "ams", 4096)];
        let why = "this host's machine network is full: its subnet 10.192.0.0/19 holds at most 8189 machines";
        hosts[0]
            .labels
            .insert(bazaar_types::host::NETWORK_FULL_LABEL.into(), why.into());
        let req = PlacementRequest {
            size: Resources {
                cpus: 1,
                memory_mb: 256,
            },
            count: 1,
            ..Default::default()
        };
        let (ok, ex) = candidates(&hosts, &["ams".to_string()], &req);
        assert_eq!(ok.iter().map(|c| &c.host_id).collect::<Vec<_>>(), ["b"]);
        assert_eq!((ex[0].host_id.as_str(), ex[0].reason.as_str()), ("a", why));
    }

    #[test]
    fn asks_sample_d_per_machine_or_everyone_when_few() {
        let hosts: Vec<Candidate> = (0..20)
            .map(|i| host(&format!("h{i:02}"), "ams", 4096))
            .collect();
        let refs: Vec<&Candidate> = hosts.iter().collect();
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let config = MarketConfig::default();
        let one = PlacementRequest {
            size: Resources {
                cpus: 1,
                memory_mb: 256,
            },
            count: 1,
            ..Default::default()
        };
        let five = PlacementRequest {
            count: 5,
            ..one.clone()
        };
        let asks = choose_asks(&refs, &one, &config, &[], &mut rng);
        assert_eq!(asks.len(), 3);
        let mut distinct = asks.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), 3);
        let batch = choose_asks(&refs, &five, &config, &[], &mut rng);
        assert_eq!(batch.len(), 15, "batch sampling asks d·N in one round");
        let few: Vec<&Candidate> = refs[..3].to_vec();
        assert_eq!(choose_asks(&few, &one, &config, &[], &mut rng).len(), 3);
        // Few hosts, many machines: hosts are asked again while they could hold more.
        let many = PlacementRequest {
            count: 40,
            ..one.clone()
        };
        let asks = choose_asks(&few, &many, &config, &[], &mut rng);
        assert_eq!(asks.len(), 40);
        let mut small = hosts[..2].to_vec();
        small[0].free.memory_mb = 512; // room for 2
        small[1].free.memory_mb = 256; // room for 1
        let refs2: Vec<&Candidate> = small.iter().collect();
        assert_eq!(choose_asks(&refs2, &many, &config, &[], &mut rng).len(), 3);
        let skip: Vec<String> = vec!["h00".into(), "h01".into()];
        let rest = choose_asks(&refs[..3], &one, &config, &skip, &mut rng);
        assert_eq!(rest, vec!["h02".to_string()]);
    }

    #[test]
    fn winners_are_the_best_offers() {
        let offers = vec![
            Offer {
                host_id: "a".into(),
                reservation_id: "1".into(),
                score: 0.2,
            },
            Offer {
                host_id: "b".into(),
                reservation_id: "2".into(),
                score: 0.9,
            },
            Offer {
                host_id: "c".into(),
                reservation_id: "3".into(),
                score: 0.5,
            },
        ];
        let (win, rest) = choose_winners(offers, 2);
        assert_eq!(
            win.iter().map(|o| o.host_id.as_str()).collect::<Vec<_>>(),
            vec!["b", "c"]
        );
        assert_eq!(rest.len(), 1);
    }
}
