//! A central scheduler per region (Nomad- or Kubernetes-style): requests queue, one
//! scheduler places them in order from an exact view, paying a modelled cost per decision.

use super::*;

impl Engine<'_> {
    pub(super) fn central_run(&mut self, region: u16) {
        let Mode::Central(cost) = self.mode.clone() else {
            unreachable!("central run under another mode")
        };
        let Some(slot) = self.central_queue[region as usize].pop_front() else {
            self.central_busy[region as usize] = false;
            return;
        };
        let (count, req) = {
            let p = self.p(slot);
            p.rounds_used += 1;
            p.round_active = false;
            (p.deficit, p.req)
        };
        let mut service_us = 0.0;
        let mut placed = Vec::new();
        for _ in 0..count {
            let choice = self.choose(slot, 1, 0);
            service_us += cost.base_us + cost.per_node_us * choice.examined as f64;
            let Some(&h) = choice.hosts.first() else {
                break;
            };
            let p = self.pending[slot as usize].as_ref().expect("live");
            let (size, lifetime) = (p.size, p.lifetimes.last().copied().unwrap_or(u64::MAX));
            let n = self.next_machine;
            let host = &mut self.fleet.hosts[h as usize];
            if !host.alive || host.ledger.commit(&machine_id(n), size).is_err() {
                self.out.refusals += 1;
                continue;
            }
            self.next_machine += 1;
            self.p(slot).lifetimes.pop();
            self.placed_on(h, n, size, lifetime);
            placed.push(h);
        }
        let service = service_us as u64;
        let done_at = self.now + service + (cost.overhead_ms * 1000.0) as u64;
        for &host in &placed {
            let rtt = self.rtt();
            self.out.messages += 1;
            self.at(
                done_at + rtt,
                Ev::Done {
                    slot,
                    req,
                    host,
                    ok: true,
                },
            );
        }
        let p = self.p(slot);
        p.deficit -= placed.len() as u32;
        p.outstanding += placed.len() as u32;
        self.at(self.now + service, Ev::CentralRun { region });
        self.progress(slot);
    }
}
