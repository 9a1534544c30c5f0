//! Direct placement by an exchange (no bids): the policy picks hosts from its (possibly
//! stale) view and sends commits, which the hosts accept or refuse.

use super::*;

impl Engine<'_> {
    pub(super) fn direct_round(&mut self, slot: u32) {
        let (exchange, count, req) = {
            let p = self.p(slot);
            p.rounds_used += 1;
            (p.exchange, p.deficit, p.req)
        };
        let delay = self.exchange_delay_us[exchange];
        let choice = self.choose(slot, count, delay);
        let sent = choice.hosts.len() as u32;
        for &host in &choice.hosts {
            let rtt = self.rtt();
            self.out.messages += 1;
            self.at(
                self.now + rtt / 2,
                Ev::CommitArrive {
                    slot,
                    req,
                    host,
                    rtt,
                },
            );
        }
        let p = self.p(slot);
        p.deficit -= sent;
        p.outstanding += sent;
        self.progress(slot);
    }

    pub(super) fn commit_arrive(&mut self, slot: u32, req: u64, h: u32, rtt: u64) {
        let deadline_us = self.sc.bid_deadline_ms * 1000;
        let Some(p) = self.live(slot, req) else {
            return;
        };
        let (size, lifetime) = (p.size, p.lifetimes.last().copied().unwrap_or(u64::MAX));
        let host = &mut self.fleet.hosts[h as usize];
        if !host.alive {
            self.out.no_answers += 1;
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
        let ok = host.ledger.commit(&machine_id(n), size).is_ok();
        if ok {
            self.next_machine += 1;
            self.p(slot).lifetimes.pop();
            self.placed_on(h, n, size, lifetime);
        } else {
            self.out.refusals += 1;
        }
        self.at(
            self.now + rtt / 2,
            Ev::Done {
                slot,
                req,
                host: h,
                ok,
            },
        );
    }
}
