//! The balancing rule, pure (no I/O, no clock), after Fly's (reference/fly.md §1.8):
//!
//! 1. Among machines that can take traffic and are under their soft limit, the nearest
//!    (same host, then same region, then elsewhere); among equals the least loaded; among
//!    those a random one.
//! 2. If none is under its soft limit: wake the nearest stopped or suspended machine of a
//!    service with `autostart` (ties broken by position, so that concurrent requests pick
//!    the same one and share its wake-up).
//! 3. Otherwise, the least loaded machine under its hard limit (nearest among equals): above
//!    soft only when every machine is above soft.
//! 4. Otherwise wait (every machine is at its hard limit, or none can take traffic now).

/// What the balancer knows about one machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    /// In-flight connections or requests (per the service's concurrency type).
    pub load: u32,
    pub soft_limit: u32,
    /// `u32::MAX` when the service has no hard limit.
    pub hard_limit: u32,
    /// 0: this host; 1: this region; 2: elsewhere.
    pub distance: u8,
    pub state: Availability,
}

/// Whether a machine can take traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Availability {
    /// Started, healthy, uncordoned, its host alive.
    Ready,
    /// Stopped or suspended with `autostart`, or starting: can be woken (or waited for).
    Wakeable,
    /// Anything else (stopping, failing checks, cordoned, tried and failed, ...).
    Unavailable,
}

/// The balancer's decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// Send to this machine (index into the candidates).
    Send(usize),
    /// Wake this machine, then send to it.
    Wake(usize),
    /// Nothing can take the request now; wait for a slot (bounded by the caller).
    Wait,
}

/// Chooses a machine. `random` breaks ties (any value; the caller passes a random number).
pub fn choose(candidates: &[Candidate], random: u64) -> Choice {
    let ready = || {
        candidates
            .iter()
            .enumerate()
            .filter(|(_, c)| c.state == Availability::Ready)
    };
    // 1. Nearest under soft, least loaded, random among equals.
    let under_soft = ready().filter(|(_, c)| c.load < c.soft_limit && c.load < c.hard_limit);
    if let Some(i) = pick_min(under_soft, |c| (c.distance, c.load), random) {
        return Choice::Send(i);
    }
    // 2. Wake the nearest stopped machine.
    if let Some((i, _)) = candidates
        .iter()
        .enumerate()
        .filter(|(_, c)| c.state == Availability::Wakeable)
        .min_by_key(|(i, c)| (c.distance, *i))
    {
        return Choice::Wake(i);
    }
    // 3. Least loaded (relative to soft) under hard.
    let under_hard = ready().filter(|(_, c)| c.load < c.hard_limit);
    if let Some(i) = pick_min(
        under_hard,
        |c| (c.load.saturating_sub(c.soft_limit), c.distance, c.load),
        random,
    ) {
        return Choice::Send(i);
    }
    Choice::Wait
}

/// The index of a minimum by `key`, chosen at random among equal minima.
fn pick_min<'a, K: Ord + Copy>(
    it: impl Iterator<Item = (usize, &'a Candidate)>,
    key: impl Fn(&Candidate) -> K,
    random: u64,
) -> Option<usize> {
    let mut best: Option<K> = None;
    let mut ties: u64 = 0;
    let mut chosen = None;
    let mut rng = random;
    for (i, c) in it {
        let k = key(c);
        match best {
            Some(b) if k > b => continue,
            Some(b) if k == b => {
                // Reservoir sampling over the ties, driven by one random number.
                ties += 1;
                rng = splitmix64(rng);
                if rng.is_multiple_of(ties) {
                    chosen = Some(i);
                }
            }
            _ => {
                best = Some(k);
                ties = 1;
                chosen = Some(i);
            }
        }
    }
    chosen
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(load: u32, soft: u32, hard: u32, distance: u8, state: Availability) -> Candidate {
        Candidate {
            load,
            soft_limit: soft,
            hard_limit: hard,
            distance,
            state,
        }
    }
    use Availability::*;

    #[test]
    fn nearest_under_soft_first_then_least_loaded() {
        let cs = [
            c(5, 10, 20, 1, Ready),
            c(9, 10, 20, 0, Ready),
            c(0, 10, 20, 2, Ready),
        ];
        assert_eq!(choose(&cs, 7), Choice::Send(1));
        let cs = [c(5, 10, 20, 1, Ready), c(3, 10, 20, 1, Ready)];
        assert_eq!(choose(&cs, 7), Choice::Send(1));
    }

    #[test]
    fn above_soft_only_when_all_are_above_soft_and_never_above_hard() {
        let cs = [c(12, 10, 20, 0, Ready), c(9, 10, 20, 2, Ready)];
        assert_eq!(choose(&cs, 1), Choice::Send(1));
        let cs = [c(12, 10, 20, 0, Ready), c(11, 10, 20, 2, Ready)];
        assert_eq!(choose(&cs, 1), Choice::Send(1));
        let cs = [c(20, 10, 20, 0, Ready), c(20, 10, 20, 2, Ready)];
        assert_eq!(choose(&cs, 1), Choice::Wait);
        // A hard limit below the soft limit still caps.
        let cs = [c(2, 10, 2, 0, Ready)];
        assert_eq!(choose(&cs, 1), Choice::Wait);
    }

    #[test]
    fn wakes_the_nearest_stopped_machine_when_none_is_under_soft() {
        let cs = [
            c(0, 10, 20, 1, Wakeable),
            c(10, 10, 20, 0, Ready),
            c(0, 10, 20, 0, Wakeable),
        ];
        assert_eq!(choose(&cs, 3), Choice::Wake(2));
        let cs = [c(0, 10, 20, 1, Wakeable), c(0, 10, 20, 1, Wakeable)];
        for r in 0..10 {
            assert_eq!(choose(&cs, r), Choice::Wake(0), "concurrent wakes agree");
        }
        let cs = [c(0, 10, 20, 0, Unavailable)];
        assert_eq!(choose(&cs, 3), Choice::Wait);
    }

    #[test]
    fn ties_are_spread() {
        let cs = [c(0, 10, 20, 0, Ready); 4];
        let mut seen = [0u32; 4];
        for r in 0..4000u64 {
            match choose(&cs, r.wrapping_mul(0x2545_F491_4F6C_DD1D)) {
                Choice::Send(i) => seen[i] += 1,
                other => panic!("{other:?}"),
            }
        }
        assert!(seen.iter().all(|n| *n > 500), "{seen:?}");
    }
}
