//! The market protocol in the engine: a round asks sampled hosts for bids (each reserves
//! in its ledger), bids and refusals come back after modelled round trips, the round is
//! resolved at its deadline or when every host answered, winners are claimed and losers
//! released.

use super::*;

impl Engine<'_> {
    pub(super) fn market_round(&mut self, slot: u32) {
        let Mode::Market(config) = self.mode.clone() else {
            unreachable!("market round under another mode")
        };
        let (exchange, count) = {
            let p = self.p(slot);
            p.rounds_used += 1;
            p.round += 1;
            p.round_count = p.deficit;
            p.deficit = 0;
            p.round_active = true;
            p.asks.clear();
            (p.exchange, p.round_count)
        };
        let delay = self.exchange_delay_us[exchange];
        let choice = self.choose(slot, count, delay);
        let mut asks = Vec::with_capacity(choice.hosts.len());
        for &h in &choice.hosts {
            self.next_res += 1;
            let rtt = self.rtt();
            asks.push(AskSlot {
                host: h,
                res: format!("r{}", self.next_res),
                rtt,
                state: AskState::Waiting,
            });
        }
        self.out.messages += asks.len() as u64;
        let p = self.p(slot);
        let (req, round) = (p.req, p.round);
        p.replies_pending = asks.len() as u32;
        let sends: Vec<(u64, u32)> = asks.iter().map(|a| a.rtt / 2).zip(0..).collect();
        p.asks = asks;
        if sends.is_empty() {
            self.resolve_round(slot);
            return;
        }
        for (half, ask) in sends {
            self.at(self.now + half, Ev::AskArrive { slot, req, ask });
        }
        let deadline = self.now + config.bid_deadline.as_micros() as u64;
        self.at(deadline, Ev::Deadline { slot, req, round });
    }

    pub(super) fn ask_arrive(&mut self, slot: u32, req: u64, ask: u32) {
        let ttl_ms = self.sc.reservation_ttl_ms;
        let now = self.now;
        let Some(p) = self.live(slot, req) else {
            return;
        };
        let round = p.round;
        let size = p.size;
        let a = &p.asks[ask as usize];
        let (h, res, half) = (a.host, a.res.clone(), a.rtt / 2);
        let host = &mut self.fleet.hosts[h as usize];
        if !host.alive {
            return; // no answer: the deadline will tell
        }
        let expires_ms = now / 1000 + ttl_ms;
        let epoch = host.epoch;
        let score = match host.ledger.reserve(&res, size, expires_ms) {
            Ok((_, score)) => {
                self.changed(h);
                self.at(expires_ms * 1000 + 1, Ev::Expire { host: h, epoch });
                Some(score)
            }
            Err(_) => None,
        };
        self.at(
            now + half,
            Ev::BidReply {
                slot,
                req,
                round,
                ask,
                score,
            },
        );
    }

    pub(super) fn bid_reply(
        &mut self,
        slot: u32,
        req: u64,
        round: u32,
        ask: u32,
        score: Option<f64>,
    ) {
        let current = self
            .live(slot, req)
            .is_some_and(|p| p.round == round && p.round_active);
        if !current {
            // A late bid: release it (the reservation would expire anyway).
            if score.is_some() {
                if let Some(p) = self.live(slot, req) {
                    if let Some(a) = p.asks.get(ask as usize).filter(|_| p.round == round) {
                        let (host, res, half) = (a.host, a.res.clone(), a.rtt / 2);
                        self.send_release(host, res, half);
                    }
                }
            }
            return;
        }
        let p = self.p(slot);
        p.asks[ask as usize].state = match score {
            Some(s) => AskState::Bid(s),
            None => AskState::Refused,
        };
        p.replies_pending -= 1;
        if p.replies_pending == 0 {
            self.resolve_round(slot);
        }
    }

    pub(super) fn send_release(&mut self, host: u32, res: String, half: u64) {
        self.out.messages += 1;
        let epoch = self.fleet.hosts[host as usize].epoch;
        self.at(self.now + half, Ev::Release { host, epoch, res });
    }

    pub(super) fn resolve_round(&mut self, slot: u32) {
        let p = self.p(slot);
        p.round_active = false;
        let mut offers = Vec::new();
        let mut skipped = Vec::new();
        let (mut refused, mut unanswered) = (0, 0);
        for a in &p.asks {
            match a.state {
                AskState::Bid(score) => offers.push(Offer {
                    host_id: format!("h{}", a.host),
                    reservation_id: a.res.clone(),
                    score,
                }),
                AskState::Refused => {
                    refused += 1;
                    skipped.push(a.host)
                }
                AskState::NoAnswer | AskState::Waiting => {
                    unanswered += 1;
                    skipped.push(a.host)
                }
                AskState::Claiming => {}
            }
        }
        for h in skipped {
            if !p.skip.contains(&h) {
                p.skip.push(h);
                p.skip_ids.push(format!("h{h}"));
            }
        }
        let count = p.round_count;
        let (winners, rest) = choose_winners(offers, count as usize);
        p.deficit += count - winners.len() as u32;
        p.outstanding += winners.len() as u32;
        let req = p.req;
        let find = |p: &Pending, res: &str| {
            p.asks
                .iter()
                .position(|a| a.res == res)
                .expect("offer of this round") as u32
        };
        let mut claims = Vec::new();
        for w in winners {
            let i = find(p, &w.reservation_id) as usize;
            let a = &mut p.asks[i];
            a.state = AskState::Claiming;
            claims.push((a.host, w.reservation_id, a.rtt / 2));
        }
        let releases: Vec<(u32, String, u64)> = rest
            .iter()
            .map(|o| {
                let a = &p.asks[find(p, &o.reservation_id) as usize];
                (a.host, a.res.clone(), a.rtt / 2)
            })
            .collect();
        self.out.refusals += refused;
        self.out.no_answers += unanswered;
        for (host, res, half) in claims {
            self.out.messages += 1;
            self.at(
                self.now + half,
                Ev::ClaimArrive {
                    slot,
                    req,
                    host,
                    res,
                    half,
                },
            );
        }
        for (host, res, half) in releases {
            self.send_release(host, res, half);
        }
        self.progress(slot);
    }

    pub(super) fn claim_arrive(&mut self, slot: u32, req: u64, h: u32, res: String, half: u64) {
        let deadline_us = self.sc.bid_deadline_ms * 1000;
        let Some(p) = self.live(slot, req) else {
            return;
        };
        let lifetime = p.lifetimes.last().copied().unwrap_or(u64::MAX);
        let host = &mut self.fleet.hosts[h as usize];
        if !host.alive {
            self.at(
                self.now + deadline_us,
                Ev::Done {
                    slot,
                    req,
                    host: h,
                    ok: false,
                },
            );
            return;
        }
        let n = self.next_machine;
        let ok = host.ledger.claim(&res, &machine_id(n)).is_ok();
        if ok {
            let size = host.ledger.committed_to(&machine_id(n)).unwrap_or_default();
            self.next_machine += 1;
            self.p(slot).lifetimes.pop();
            self.placed_on(h, n, size, lifetime);
        }
        self.at(
            self.now + half,
            Ev::Done {
                slot,
                req,
                host: h,
                ok,
            },
        );
    }

    /// A machine now runs on host `h` (its resources are already committed in the ledger).
    pub(super) fn placed_on(&mut self, h: u32, n: u64, size: Resources, lifetime: u64) {
        let host = &mut self.fleet.hosts[h as usize];
        let until = self.now.saturating_add(lifetime);
        host.machines.insert(
            n,
            crate::fleet::Running {
                size,
                until_us: until,
            },
        );
        host.used = add(host.used, size);
        let epoch = host.epoch;
        self.used_mem += size.memory_mb;
        if self.out.fill90.is_none() && self.used_mem * 10 >= self.total_mem * 9 {
            let placed = self.out.placed + 1;
            self.out.fill90 = Some((self.now as f64 / US, placed));
        }
        if until != u64::MAX {
            self.departures.push(Reverse((until, n, h, epoch)));
        }
        self.changed(h);
    }

    pub(super) fn done(&mut self, slot: u32, req: u64, host: u32, ok: bool) {
        let now = self.now;
        let Some(p) = self.live(slot, req) else {
            return;
        };
        p.outstanding -= 1;
        if ok {
            p.placed += 1;
            p.last_done_us = now;
        } else {
            p.deficit += 1;
            if !p.skip.contains(&host) {
                p.skip.push(host);
                p.skip_ids.push(format!("h{host}"));
            }
        }
        if ok {
            self.out.placed += 1;
        } else {
            self.out.claim_failures += 1;
        }
        self.progress(slot);
    }
}
