//! The exchange's preemption round (issue 34 item 1, docs/POLICY.md): when no host asked
//! could take a single machine, the hosts of its regions that meet its constraints are asked
//! again for preemption bids (`BidRequest::preempt`), each naming the lower-class machines
//! it would stop; the bid that displaces least wins (`bazaar_placement::preemption::
//! best_offer`; a bid that needs no preemption always wins), the others are released. The
//! claim makes the host stop its victims before it makes the machine. A `batch` machine
//! preempts nothing, and batches of several machines are not placed by preemption.

use crate::exchange::{HostAddr, HostCallError, Order};
use crate::Api;
use bazaar_placement::constraints::{self, PlacementPolicy};
use bazaar_placement::exchange::{Ask, AskOutcome, Candidate, Offer, PlacementRecord, Round};
use bazaar_placement::preemption::{best_offer, PreemptionOffer};
use bazaar_types::host::{BidRequest, BidResponse};
use bazaar_types::machine::Machine;
use bazaar_types::priority::Priority;
use std::collections::HashMap;
use std::time::Instant;

/// Hosts asked for preemption bids at most, per region group.
const MAX_ASKED: usize = 16;

impl Api {
    /// The preemption round of a placement that found no room: `Some(machine)` when a
    /// claimed bid made it (or, in a dry run, the winner is recorded and nothing kept).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn preempt_round(
        &self,
        order: &Order,
        groups: &[Vec<String>],
        cands: &[Candidate],
        addrs: &HashMap<String, HostAddr>,
        policy: &PlacementPolicy,
        placement_id: &str,
        record: &mut PlacementRecord,
        placement_started: Instant,
    ) -> Option<Machine> {
        let priority = order.template.config.priority();
        if order.count != 1 || priority == Priority::Batch {
            return None;
        }
        let driver = order.template.config.driver().to_string();
        for group in groups {
            let hosts: Vec<&Candidate> = cands
                .iter()
                .filter(|c| c.alive && !c.draining && group.contains(&c.region))
                .filter(|c| bazaar_types::host::cannot_run(&c.labels, &driver).is_none())
                .filter(|c| order.pinned_host.as_ref().is_none_or(|p| *p == c.host_id))
                .filter(|c| constraints::unmet(&policy.constraints, &c.labels).is_none())
                .take(MAX_ASKED)
                .collect();
            if hosts.is_empty() {
                continue;
            }
            let req = BidRequest {
                placement_id: placement_id.to_string(),
                cpus: order.size.cpus,
                memory_mb: order.size.memory_mb,
                ttl_ms: Some(self.0.market.reservation_ttl.as_millis() as u64),
                driver: Some(driver.clone()),
                priority: Some(priority),
                preempt: true,
            };
            let started = Instant::now();
            let asks = hosts.iter().map(|h| {
                let addr = addrs.get(&h.host_id).cloned();
                let req = req.clone();
                async move {
                    let t0 = Instant::now();
                    let answer = match &addr {
                        Some(a) => {
                            self.post_host::<BidResponse>(a, "/host/v1/bids", &req)
                                .await
                        }
                        None => Err(HostCallError::Unreachable("no address".into())),
                    };
                    (h.host_id.clone(), answer, t0.elapsed())
                }
            });
            let answers = tokio::time::timeout(
                self.0.market.bid_deadline * 4,
                futures_util::future::join_all(asks),
            )
            .await
            .unwrap_or_default();
            let mut round = Round {
                regions: group.clone(),
                asked: Vec::new(),
                elapsed_us: 0,
            };
            let mut offers: Vec<(PreemptionOffer, Offer)> = Vec::new();
            for (host_id, answer, elapsed) in answers {
                let outcome = match answer {
                    Ok(BidResponse::Bid {
                        reservation_id,
                        score,
                        victims,
                        ..
                    }) => {
                        let named = victims
                            .iter()
                            .map(|v| format!("{} ({})", v.machine_id, v.priority))
                            .collect();
                        offers.push((
                            PreemptionOffer {
                                host_id: host_id.clone(),
                                victims,
                                score,
                            },
                            Offer {
                                host_id: host_id.clone(),
                                reservation_id: reservation_id.clone(),
                                score,
                            },
                        ));
                        AskOutcome::Bid {
                            score,
                            reservation_id,
                            victims: named,
                        }
                    }
                    Ok(BidResponse::Refusal { reason, .. }) => AskOutcome::Refused { reason },
                    Err(e) => AskOutcome::NoAnswer {
                        error: e.to_string(),
                    },
                };
                round.asked.push(Ask {
                    host_id,
                    outcome,
                    elapsed_us: elapsed.as_micros() as u64,
                });
            }
            round.elapsed_us = started.elapsed().as_micros() as u64;
            record.rounds.push(round);
            let pre: Vec<PreemptionOffer> = offers.iter().map(|(p, _)| p.clone()).collect();
            let Some(best) = best_offer(&pre).map(|b| b.host_id.clone()) else {
                continue;
            };
            let (win, rest): (Vec<_>, Vec<_>) =
                offers.into_iter().partition(|(p, _)| p.host_id == best);
            let rest: Vec<Offer> = rest.into_iter().map(|(_, o)| o).collect();
            let Some((won, offer)) = win.into_iter().next() else {
                continue;
            };
            let victims: Vec<String> = won.victims.iter().map(|v| v.machine_id.clone()).collect();
            if order.dry_run {
                record.winners.push(best);
                self.release_offers(&rest, addrs).await;
                self.release_offers(std::slice::from_ref(&offer), addrs)
                    .await;
                record.reason = format!("preemption bid of {}", describe(&victims));
                return None;
            }
            let mut claim = order.template.clone();
            claim.machine_id = order
                .template
                .machine_id
                .clone()
                .or_else(|| Some(bazaar_types::ids::new_machine_id()));
            let mut rec_now = record.clone();
            rec_now.winners = vec![best.clone()];
            rec_now.elapsed_us = placement_started.elapsed().as_micros() as u64;
            rec_now.reason = format!(
                "no host had room: preemption bid that displaces least, stopping {}",
                describe(&victims)
            );
            claim.placement = serde_json::to_value(&rec_now).ok();
            let host = addrs[&best].clone();
            let result = self.claim_at(&host, &offer.reservation_id, &claim).await;
            self.release_offers(&rest, addrs).await;
            match result {
                Ok(m) => {
                    self.remember(&m.id, &best);
                    record.winners.push(best);
                    record.reason = rec_now.reason;
                    return Some(m);
                }
                Err(err) => {
                    if let Some(r) = record.rounds.last_mut() {
                        r.asked.push(Ask {
                            host_id: best,
                            outcome: AskOutcome::ClaimFailed {
                                error: err.to_string(),
                            },
                            elapsed_us: 0,
                        });
                    }
                    return None;
                }
            }
        }
        None
    }
}

fn describe(victims: &[String]) -> String {
    if victims.is_empty() {
        "nothing (the host had room)".into()
    } else {
        victims.join(", ")
    }
}
