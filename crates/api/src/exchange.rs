//! The exchange: places machines by asking hosts for bids (DESIGN.md "The market").
//!
//! 1. Candidates come from the local catalog (alive, not draining, advertising room, meeting
//!    the machine's constraints: `policy.rs`); the region expression is tried group by
//!    group.
//! 2. A sample is asked in parallel (`sample_size` per machine, or the whole region when it
//!    is small), each with the bid deadline.
//! 3. The best offers (by score, plus the hosts' affinity and spread scores under a
//!    placement policy) are claimed, concurrently (with a machine id chosen here, so a retried
//!    claim is idempotent); a failed claim falls to the next offer; the rest are released.
//! 4. Refusals that only other reservations caused are retried after a short backoff,
//!    within a time budget; otherwise the answer is `insufficient_capacity` at once, with
//!    what was tried. Every placement is recorded and the record is kept by the machine's
//!    owner (`GET .../placement`).

use crate::error::ApiError;
use crate::Api;
use bazaar_placement::exchange::{
    candidates, choose_asks, choose_winners, parse_regions, Ask, AskOutcome, Candidate, Offer,
    PlacementRecord, PlacementRequest, Round,
};
use bazaar_types::host::{BidRequest, BidResponse, ClaimRequest, Resources};
use bazaar_types::machine::Machine;
use futures_util::StreamExt;
use rand::Rng;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long one placement may keep retrying hosts that were only busy.
const RETRY_BUDGET: Duration = Duration::from_secs(10);
/// Claims of one placement in flight at once.
const CLAIMS_IN_FLIGHT: usize = 16;

/// A host to talk to.
#[derive(Debug, Clone)]
pub struct HostAddr {
    pub host_id: String,
    pub api_addr: String,
}

/// The outcome of a placement: the machines created (maybe fewer than asked) and the record.
#[derive(Debug)]
pub struct Placed {
    pub machines: Vec<Machine>,
    pub record: PlacementRecord,
    /// Machines whose claim got no answer and that were not placed elsewhere: each may
    /// exist on the host that did not answer (the claim may have succeeded there).
    pub unanswered: Vec<Unanswered>,
}

/// A claim that got no answer (the host died or the connection broke after the request was
/// sent), so its machine may or may not exist on that host.
#[derive(Debug, Clone)]
pub struct Unanswered {
    pub machine_id: String,
    /// The hosts asked to claim it that did not answer.
    pub hosts: Vec<String>,
    /// The epoch the next claim of this machine carries: one above the highest claim that
    /// went unanswered, so a copy made by that claim loses to the next one
    /// (`MachineRecord::precedence`) and its host destroys it (the agent's `fence`).
    epoch: u64,
}

/// What to place.
#[derive(Debug, Clone)]
pub struct Order {
    pub app: String,
    pub template: ClaimRequest,
    pub size: Resources,
    pub count: usize,
    pub regions: String,
    /// Dry run: bid, then release everything.
    pub dry_run: bool,
    /// Only this host may take the machines (it holds the volume they mount).
    pub pinned_host: Option<String>,
    /// This host is not asked (a machine displaced from it is re-placed elsewhere).
    pub avoid_host: Option<String>,
}

impl Api {
    /// Every host the catalog knows, as market candidates, and where to reach them.
    pub(crate) fn market_view(
        &self,
    ) -> Result<(Vec<Candidate>, HashMap<String, HostAddr>), ApiError> {
        let catalog = self.catalog()?;
        let mut cands = Vec::new();
        let mut addrs = HashMap::new();
        for h in catalog.hosts() {
            // A suspect host is still asked: suspicion is often a busy host that missed a
            // probe, and one that is really gone just does not bid in time.
            let alive = matches!(
                h.status,
                bazaar_catalog::HostStatus::Alive | bazaar_catalog::HostStatus::Suspect
            ) || h.record.id == self.0.node.host_id();
            cands.push(Candidate {
                host_id: h.record.id.clone(),
                region: h.record.region.clone(),
                capacity: h.record.capacity,
                free: h.record.free,
                alive,
                draining: h.record.draining,
                labels: h.record.labels.clone(),
            });
            addrs.insert(
                h.record.id.clone(),
                HostAddr {
                    host_id: h.record.id.clone(),
                    api_addr: h.record.api_addr.clone(),
                },
            );
        }
        Ok((cands, addrs))
    }

    /// The regions the catalog knows, sorted.
    pub(crate) fn known_regions(cands: &[Candidate]) -> Vec<String> {
        let mut regions: Vec<String> = cands.iter().map(|c| c.region.clone()).collect();
        regions.sort();
        regions.dedup();
        regions
    }

    /// Places `order.count` machines through the market.
    pub async fn place(&self, order: Order) -> Result<Placed, ApiError> {
        let started = Instant::now();
        let (mut cands, addrs) = self.market_view()?;
        let known = Self::known_regions(&cands);
        if let Some(avoid) = &order.avoid_host {
            cands.retain(|c| c.host_id != *avoid);
        }
        let groups = parse_regions(&order.regions, &known).map_err(ApiError::BadRequest)?;
        // The machine's placement policy (`config.placement`): impossible constraints are
        // refused now; the others filter each round and add to the bids' scores.
        let policy = order.template.config.placement.clone().unwrap_or_default();
        crate::policy::check_possible(&policy, &cands, &groups)?;
        let mut counts = crate::policy::spread_counts(self, &order.app, &policy, &cands)?;
        let placement_id = bazaar_types::ids::new_reservation_id().replacen("res_", "pl_", 1);
        let mut record = PlacementRecord {
            placement_id: placement_id.clone(),
            size: order.size,
            count: order.count,
            regions: order.regions.clone(),
            ..Default::default()
        };
        let mut machines = Vec::new();
        // Machines whose last claim went unanswered: the next offer claims the same id with
        // a higher epoch, so there is never a second machine if the first claim succeeded.
        let mut unanswered: Vec<Unanswered> = Vec::new();
        let config = &self.0.market;
        for group in &groups {
            let mut skip: Vec<String> = Vec::new();
            let mut round_no = 0u32;
            loop {
                let remaining = order.count - machines.len();
                if remaining == 0 {
                    break;
                }
                let preq = PlacementRequest {
                    size: order.size,
                    count: remaining,
                    pinned_host: order.pinned_host.clone(),
                    driver: Some(order.template.config.driver().to_string()),
                    batch: order.template.config.priority()
                        == bazaar_types::priority::Priority::Batch,
                    ..Default::default()
                };
                let (ok, excluded) = candidates(&cands, group, &preq);
                let (ok, unmet, verdicts) =
                    crate::policy::filter(&policy, ok, &counts, group, &cands);
                if round_no == 0 {
                    record.excluded.extend(excluded);
                    record.excluded.extend(unmet);
                    record.verdicts.extend(verdicts);
                }
                let asks = {
                    let mut rng = rand::rng();
                    choose_asks(&ok, &preq, config, &skip, &mut rng)
                };
                if asks.is_empty() {
                    break;
                }
                let round_started = Instant::now();
                let (mut round, offers, retryable) =
                    self.ask(group, &asks, &addrs, &order, &placement_id).await;
                let (winners, mut rest) = if policy.is_empty() {
                    choose_winners(offers, remaining)
                } else {
                    let hosts: Vec<_> = cands.iter().map(crate::policy::view).collect();
                    bazaar_placement::constraints::choose_winners(
                        offers, remaining, &policy, &hosts, &counts,
                    )
                };
                round.elapsed_us = round_started.elapsed().as_micros() as u64;
                record.rounds.push(round);
                // Winners are claimed concurrently (a batch of 100 must not wait on 100
                // claims in a row while its reservations expire); a failed claim falls to
                // the next offer. Only an unreachable host is left out for good: a claim
                // refused because its reservation expired says nothing about the host.
                let mut queue: Vec<(Offer, Option<Unanswered>)> =
                    winners.into_iter().map(|o| (o, None)).collect();
                let mut claimed_hosts = Vec::new();
                while !queue.is_empty() {
                    if order.dry_run {
                        claimed_hosts.extend(queue.iter().map(|(o, _)| o.host_id.clone()));
                        rest.extend(queue.drain(..).map(|(o, _)| o));
                        break;
                    }
                    for (_, retry) in queue.iter_mut() {
                        if retry.is_none() {
                            *retry = unanswered.pop();
                        }
                    }
                    let bids_in_round = record
                        .rounds
                        .last()
                        .map(|r| {
                            r.asked
                                .iter()
                                .filter(|a| matches!(a.outcome, AskOutcome::Bid { .. }))
                                .count()
                        })
                        .unwrap_or(0);
                    let claims = std::mem::take(&mut queue).into_iter().map(|(offer, retry)| {
                        let mut claim = order.template.clone();
                        // A machine whose claim went unanswered keeps its id (one epoch up);
                        // one that has an id already (the guardian re-placing it) keeps it;
                        // every other gets a new one.
                        if let Some(retry) = &retry {
                            claim.machine_id = Some(retry.machine_id.clone());
                            claim.epoch = retry.epoch;
                        } else {
                            claim.machine_id = order
                                .template
                                .machine_id
                                .clone()
                                .filter(|_| order.count == 1)
                                .or_else(|| Some(bazaar_types::ids::new_machine_id()));
                        }
                        let mut rec_now = record.clone();
                        rec_now.winners = vec![offer.host_id.clone()];
                        rec_now.reason = format!(
                            "best of {bids_in_round} offer(s): score {:.3} (spread: the share of the host left free{})",
                            offer.score,
                            if policy.is_empty() { "" } else { ", plus the host's affinity and spread scores" }
                        );
                        rec_now.elapsed_us = started.elapsed().as_micros() as u64;
                        claim.placement = serde_json::to_value(&rec_now).ok();
                        let host = addrs[&offer.host_id].clone();
                        async move {
                            let result = self.claim(&host, &offer.reservation_id, &claim).await;
                            let retry = match (&result, retry) {
                                (Err(HostCallError::Unreachable(_)), retry) => {
                                    let mut hosts = retry.map(|r| r.hosts).unwrap_or_default();
                                    hosts.push(offer.host_id.clone());
                                    Some(Unanswered {
                                        machine_id: claim.machine_id.clone().unwrap_or_default(),
                                        hosts,
                                        epoch: claim.epoch + 1,
                                    })
                                }
                                // A refused claim made nothing: what went unanswered before
                                // still is.
                                (_, retry) => retry,
                            };
                            (offer, result, retry)
                        }
                    });
                    let results: Vec<(Offer, Result<Machine, HostCallError>, Option<Unanswered>)> =
                        futures_util::stream::iter(claims)
                            .buffer_unordered(CLAIMS_IN_FLIGHT)
                            .collect()
                            .await;
                    for (offer, result, retry) in results {
                        match result {
                            Ok(m) => {
                                self.remember(&m.id, &offer.host_id);
                                crate::policy::count_placed(
                                    &policy,
                                    &mut counts,
                                    &offer.host_id,
                                    &cands,
                                );
                                claimed_hosts.push(offer.host_id.clone());
                                machines.push(m);
                            }
                            Err(err) => {
                                tracing::info!(host.id = %offer.host_id, error = %err, "claim failed, trying the next offer");
                                if let Some(round) = record.rounds.last_mut() {
                                    round.asked.push(Ask {
                                        host_id: offer.host_id.clone(),
                                        outcome: AskOutcome::ClaimFailed {
                                            error: err.to_string(),
                                        },
                                        elapsed_us: 0,
                                    });
                                }
                                if matches!(err, HostCallError::Unreachable(_)) {
                                    // Offers of a host that is gone are worthless now.
                                    skip.push(offer.host_id.clone());
                                    rest.retain(|o| o.host_id != offer.host_id);
                                }
                                if rest.is_empty() {
                                    unanswered.extend(retry);
                                } else {
                                    queue.push((rest.remove(0), retry));
                                }
                            }
                        }
                    }
                    let (keep, dropped): (Vec<_>, Vec<_>) = std::mem::take(&mut queue)
                        .into_iter()
                        .partition(|(o, _)| !skip.contains(&o.host_id));
                    queue = keep;
                    unanswered.extend(dropped.into_iter().filter_map(|(_, retry)| retry));
                }
                record.winners.extend(claimed_hosts);
                // Losing offers are returned in the background: the answer does not wait
                // for them, and a lost release only means the reservation expires.
                // (A dry run answers only once everything is returned.)
                if order.dry_run {
                    self.release_all(&rest, &addrs).await;
                } else if !rest.is_empty() {
                    let (api, rest, addrs) = (self.clone(), rest.clone(), addrs.clone());
                    self.0
                        .node
                        .spawn(async move { api.release_all(&rest, &addrs).await });
                }
                if order.dry_run {
                    break;
                }
                // Hosts that refused for good are not asked again in this group.
                if let Some(round) = record.rounds.last() {
                    for a in &round.asked {
                        if matches!(
                            a.outcome,
                            AskOutcome::Refused { .. } | AskOutcome::NoAnswer { .. }
                        ) && !retryable.contains(&a.host_id)
                        {
                            skip.push(a.host_id.clone());
                        }
                    }
                }
                round_no += 1;
                let progress = machines.len() + asks.len() > 0;
                if machines.len() == order.count {
                    break;
                }
                if retryable.is_empty() && round_no >= config.rounds {
                    break;
                }
                if !retryable.is_empty() {
                    if started.elapsed() > RETRY_BUDGET || !progress {
                        break;
                    }
                    let pause = rand::rng().random_range(2..20);
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                }
            }
            if machines.len() == order.count {
                break;
            }
        }
        // No host had room: hosts may stop lower-class machines for it (`preemption.rs`).
        let mut preempted = false;
        if machines.len() < order.count && unanswered.is_empty() && record.winners.is_empty() {
            let placement_id = record.placement_id.clone();
            if let Some(m) = self
                .preempt_round(
                    &order,
                    &groups,
                    &cands,
                    &addrs,
                    &policy,
                    &placement_id,
                    &mut record,
                    started,
                )
                .await
            {
                machines.push(m);
            }
            preempted = !record.winners.is_empty();
        }
        record.elapsed_us = started.elapsed().as_micros() as u64;
        record.reason = if preempted {
            std::mem::take(&mut record.reason)
        } else if order.dry_run {
            format!(
                "dry run: {} of {} would be placed",
                record.winners.len(),
                order.count
            )
        } else {
            format!("placed {} of {}", machines.len(), order.count)
        };
        Ok(Placed {
            machines,
            record,
            unanswered,
        })
    }

    /// Asks `asks` for bids in parallel; returns the round, the offers, and the hosts whose
    /// refusals were only "busy".
    async fn ask(
        &self,
        group: &[String],
        asks: &[String],
        addrs: &HashMap<String, HostAddr>,
        order: &Order,
        placement_id: &str,
    ) -> (Round, Vec<Offer>, Vec<String>) {
        let deadline = self.0.market.bid_deadline;
        let ttl = self.0.market.reservation_ttl.as_millis() as u64;
        let futures = asks.iter().map(|host_id| {
            let addr = addrs.get(host_id).cloned();
            let req = BidRequest {
                placement_id: placement_id.to_string(),
                cpus: order.size.cpus,
                memory_mb: order.size.memory_mb,
                ttl_ms: Some(ttl),
                driver: Some(order.template.config.driver().to_string()),
                priority: order.template.config.priority,
                preempt: false,
            };
            let host_id = host_id.clone();
            let api = self.clone();
            async move {
                let t0 = Instant::now();
                let Some(addr) = addr else {
                    return (
                        host_id,
                        Err(("host has no address in the catalog".to_string(), false)),
                        t0.elapsed(),
                    );
                };
                let call = {
                    let (api, addr) = (api.clone(), addr.clone());
                    api.0.node.clone().spawn(async move {
                        api.post_host::<BidResponse>(&addr, "/host/v1/bids", &req)
                            .await
                    })
                };
                let mut call = call;
                let outcome = match tokio::time::timeout(deadline, &mut call).await {
                    Ok(Ok(Ok(r))) => Ok(r),
                    Ok(Ok(Err(e))) => Err((e.to_string(), false)),
                    Ok(Err(e)) => Err((e.to_string(), false)),
                    Err(_) => {
                        // Too late to count, but the host may still reserve: release it
                        // when the answer comes, rather than hold it for the whole TTL.
                        api.0.node.clone().spawn(async move {
                            if let Ok(Ok(BidResponse::Bid { reservation_id, .. })) = call.await {
                                api.release_one(&addr, &reservation_id).await;
                            }
                        });
                        // A slow host is busy, not full: worth asking again.
                        Err((format!("no bid within {} ms", deadline.as_millis()), true))
                    }
                };
                (host_id, outcome, t0.elapsed())
            }
        });
        let results = futures_util::future::join_all(futures).await;
        let mut asked = Vec::new();
        let mut offers = Vec::new();
        let mut retryable = Vec::new();
        for (host_id, outcome, elapsed) in results {
            let outcome = match outcome {
                Ok(BidResponse::Bid {
                    reservation_id,
                    score,
                    ..
                }) => {
                    offers.push(Offer {
                        host_id: host_id.clone(),
                        reservation_id: reservation_id.clone(),
                        score,
                    });
                    AskOutcome::Bid {
                        score,
                        reservation_id,
                        victims: Vec::new(),
                    }
                }
                Ok(BidResponse::Refusal {
                    reason,
                    retryable: r,
                    ..
                }) => {
                    if r {
                        retryable.push(host_id.clone());
                    }
                    AskOutcome::Refused { reason }
                }
                Err((error, busy)) => {
                    if busy {
                        retryable.push(host_id.clone());
                    }
                    AskOutcome::NoAnswer { error }
                }
            };
            asked.push(Ask {
                host_id,
                outcome,
                elapsed_us: elapsed.as_micros() as u64,
            });
        }
        (
            Round {
                regions: group.to_vec(),
                asked,
                elapsed_us: 0,
            },
            offers,
            retryable,
        )
    }

    /// Claims a reservation (or preemption bid) on `host`.
    pub(crate) async fn claim_at(
        &self,
        host: &HostAddr,
        reservation_id: &str,
        claim: &ClaimRequest,
    ) -> Result<Machine, HostCallError> {
        self.claim(host, reservation_id, claim).await
    }

    /// Releases offers (a lost release only means the reservation expires).
    pub(crate) async fn release_offers(&self, offers: &[Offer], addrs: &HashMap<String, HostAddr>) {
        self.release_all(offers, addrs).await
    }

    async fn claim(
        &self,
        host: &HostAddr,
        reservation_id: &str,
        claim: &ClaimRequest,
    ) -> Result<Machine, HostCallError> {
        let path = format!("/host/v1/reservations/{reservation_id}/claim");
        let mut req = self
            .to_node(reqwest::Method::POST, &host.api_addr, &path)
            .json(claim);
        if let Some(v) = self.0.node.secrets_version_header(&claim.app) {
            req = req.header(bazaar_node::secrets::SECRETS_VERSION_HEADER, v);
        }
        Self::call_host(req, host).await
    }

    async fn release_one(&self, host: &HostAddr, reservation_id: &str) {
        let path = format!("/host/v1/reservations/{reservation_id}");
        let req = self.to_node(reqwest::Method::DELETE, &host.api_addr, &path);
        if let Err(err) = req.send().await {
            tracing::debug!(error = %err, "releasing a late reservation");
        }
    }

    async fn release_all(&self, offers: &[Offer], addrs: &HashMap<String, HostAddr>) {
        // A lost release only means the reservation expires by itself.
        let futs = offers
            .iter()
            .filter_map(|o| Some(self.release_one(addrs.get(&o.host_id)?, &o.reservation_id)));
        futures_util::future::join_all(futs).await;
    }

    /// POSTs JSON to a host's interface and decodes the answer (errors keep the host's message).
    pub(crate) async fn post_host<T: serde::de::DeserializeOwned>(
        &self,
        host: &HostAddr,
        path: &str,
        body: &impl serde::Serialize,
    ) -> Result<T, HostCallError> {
        let req = self
            .to_node(reqwest::Method::POST, &host.api_addr, path)
            .json(body);
        Self::call_host(req, host).await
    }

    /// GETs from a host's interface and decodes the answer (errors keep the host's message).
    pub(crate) async fn get_host<T: serde::de::DeserializeOwned>(
        &self,
        host: &HostAddr,
        path: &str,
    ) -> Result<T, HostCallError> {
        let req = self.to_node(reqwest::Method::GET, &host.api_addr, path);
        Self::call_host(req, host).await
    }

    async fn call_host<T: serde::de::DeserializeOwned>(
        req: reqwest::RequestBuilder,
        host: &HostAddr,
    ) -> Result<T, HostCallError> {
        let resp = req.send().await.map_err(|e| {
            HostCallError::Unreachable(format!("host {} at {}: {e}", host.host_id, host.api_addr))
        })?;
        let status = resp.status();
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| HostCallError::Unreachable(format!("host {}: {e}", host.host_id)))?;
        if !status.is_success() {
            let msg = serde_json::from_slice::<bazaar_types::error::ErrorBody>(&bytes)
                .map(|b| b.error)
                .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned());
            return Err(HostCallError::Refused {
                status: status.as_u16(),
                message: msg,
            });
        }
        serde_json::from_slice(&bytes).map_err(|e| HostCallError::Refused {
            status: 502,
            message: format!("bad answer from host {}: {e}", host.host_id),
        })
    }
}

/// A failed call to another host.
#[derive(Debug, thiserror::Error)]
pub enum HostCallError {
    #[error("{0}")]
    Unreachable(String),
    #[error("{message}")]
    Refused { status: u16, message: String },
}

/// Says what was tried, for an `insufficient_capacity` answer.
pub fn describe_attempts(record: &PlacementRecord) -> String {
    let mut parts = Vec::new();
    for round in &record.rounds {
        for a in &round.asked {
            let what = match &a.outcome {
                AskOutcome::Bid { score, .. } => format!("bid {score:.2}"),
                AskOutcome::Refused { reason } => reason.clone(),
                AskOutcome::NoAnswer { error } => format!("no answer: {error}"),
                AskOutcome::ClaimFailed { error } => format!("claim failed: {error}"),
            };
            parts.push(format!("{} ({what})", a.host_id));
        }
    }
    parts.dedup();
    for e in &record.excluded {
        parts.push(format!("{} excluded ({})", e.host_id, e.reason));
    }
    if parts.is_empty() {
        "no host in the region(s)".into()
    } else {
        parts.join("; ")
    }
}
