//! Route: which of an app's machines may take a request (HTTP) or a connection (TCP), and
//! which one does. Pure: no I/O, the clock and the random number come in as arguments; the
//! only state read is the machines' load counters in the table ([`crate::table`]). One rule
//! for both protocols, so they cannot drift apart again:
//!
//! - A machine whose state is `Ready` (started, healthy, uncordoned, its host alive) takes
//!   traffic.
//! - A `Starting` machine is woken, i.e. waited for, whether or not its service autostarts:
//!   something else is starting it already, so waiting starts nothing.
//! - A `Stopped` (stopped or suspended) machine is woken only when its service autostarts:
//!   an anonymous client must not start what the app's owner keeps stopped.
//! - Skipped: a machine this request or connection already tried, one whose connection
//!   failed in the last second, one of this host that autostop is draining, and one of
//!   another host whose proxy is unknown.
//! - `fly-force-instance-id` (HTTP) pins the request to one machine: only that machine is a
//!   candidate, under the same rules (it is never started when its autostart is off). A raw
//!   TCP connection carries no header: nothing pins it, as on Fly.
//!
//! Among the candidates, [`crate::balance::choose`] decides: nearest (this host, then this
//! region) under its soft limit, else wake, else least loaded under its hard limit, else
//! wait.

use crate::balance::{self, Availability, Candidate, Choice};
use crate::table::{Backend, RouteState};
use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// What to do with a request or connection, by index into the route's machines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Send to this machine.
    Send(usize),
    /// Wake this machine (start it, or wait for its start), then send to it.
    Wake(usize),
    /// None can take it now; wait for a slot (bounded by the caller).
    Wait,
    /// The route has no machine (none that the pin names, when pinned).
    NoMachine,
}

/// How machine `b` may take traffic at `now_ms`, given the machines already `tried`.
pub(crate) fn availability(b: &Backend, tried: &[String], now_ms: u64) -> Availability {
    let reachable = b.local || b.hop.is_some();
    let skipped = tried.contains(&b.id)
        || b.load.failed_until_ms.load(Ordering::Relaxed) > now_ms
        || (b.local && b.load.draining.load(Ordering::Relaxed));
    match b.state {
        _ if skipped || !reachable => Availability::Unavailable,
        RouteState::Ready => Availability::Ready,
        RouteState::Starting => Availability::Wakeable,
        RouteState::Stopped if b.limits.autostart => Availability::Wakeable,
        RouteState::Stopped | RouteState::Down => Availability::Unavailable,
    }
}

/// Machine `b` as the balancer sees it.
fn candidate(b: &Backend, tried: &[String], now_ms: u64) -> Candidate {
    Candidate {
        load: b.load.inflight.load(Ordering::Relaxed),
        soft_limit: b.limits.soft,
        hard_limit: b.limits.hard,
        distance: b.distance,
        state: availability(b, tried, now_ms),
    }
}

thread_local! {
    /// The balancer's view of a route, reused by every decision of the thread.
    static CANDIDATES: RefCell<Vec<Candidate>> = const { RefCell::new(Vec::new()) };
}

/// Chooses among `backends` for a request or connection: only machine `pin` when given
/// (`fly-force-instance-id`), none of `tried`. `random` breaks ties.
pub(crate) fn decide(
    backends: &[Arc<Backend>],
    pin: Option<&str>,
    tried: &[String],
    now_ms: u64,
    random: u64,
) -> Decision {
    let pinned = |b: &Backend| pin.is_none_or(|id| b.id == id);
    if !backends.iter().any(|b| pinned(b)) {
        return Decision::NoMachine;
    }
    CANDIDATES.with(|candidates| {
        let mut candidates = candidates.borrow_mut();
        candidates.clear();
        candidates.extend(backends.iter().map(|b| {
            let mut c = candidate(b, tried, now_ms);
            if !pinned(b) {
                c.state = Availability::Unavailable;
            }
            c
        }));
        match balance::choose(&candidates, random) {
            Choice::Send(i) => Decision::Send(i),
            Choice::Wake(i) => Decision::Wake(i),
            Choice::Wait => Decision::Wait,
        }
    })
}

/// What the owner of machine `b` does with a hop for it (HTTP or TCP), before admitting it
/// against the machine's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AtOwner {
    Ready,
    /// Wake it (or wait for its start) first.
    Wake,
    /// It cannot take traffic: the entry proxy goes elsewhere.
    Refuse,
}

/// The owner side of the candidate rule: the same as the entry proxy's, except that a
/// stopped machine is also woken when the entry proxy asked (`wake_asked`: it chose to
/// wake the machine, by the rule above, on its own view of the catalog).
pub(crate) fn at_owner(b: &Backend, wake_asked: bool) -> AtOwner {
    match b.state {
        RouteState::Ready if !b.load.draining.load(Ordering::SeqCst) => AtOwner::Ready,
        RouteState::Starting => AtOwner::Wake,
        RouteState::Stopped if wake_asked || b.limits.autostart => AtOwner::Wake,
        RouteState::Ready | RouteState::Stopped | RouteState::Down => AtOwner::Refuse,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::{Limits, Load};
    use bazaar_types::config::Autostop;
    use std::net::SocketAddr;

    /// Machine `id` of this host (`distance` 0), another host of this region (1) or
    /// elsewhere (2), whose host's proxy is known.
    fn machine(id: &str, state: RouteState, distance: u8, autostart: bool) -> Arc<Backend> {
        let addr: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        Arc::new(Backend {
            id: id.to_string(),
            app: "web".to_string(),
            host_id: format!("host-{distance}"),
            state,
            started: state == RouteState::Ready,
            distance,
            local: distance == 0,
            addr,
            hop: (distance > 0).then_some(addr),
            hop_tls: None,
            hop_name: None,
            limits: Limits {
                soft: 2,
                hard: 3,
                autostart,
                autostop: Autostop::Off,
                min_running: 0,
            },
            load: Arc::new(Load::default()),
        })
    }

    fn load(b: &Backend, n: u32) {
        b.load.inflight.store(n, Ordering::Relaxed);
    }

    const NOW: u64 = 1_000_000;

    fn decide_now(backends: &[Arc<Backend>], pin: Option<&str>) -> Decision {
        decide(backends, pin, &[], NOW, 7)
    }

    #[test]
    fn a_starting_machine_is_waited_for_whatever_its_autostart() {
        // The drift this module ended: TCP refused a starting machine without autostart
        // while HTTP waited for it.
        for autostart in [false, true] {
            let b = machine("m1", RouteState::Starting, 0, autostart);
            assert_eq!(availability(&b, &[], NOW), Availability::Wakeable);
            assert_eq!(
                decide_now(std::slice::from_ref(&b), None),
                Decision::Wake(0)
            );
            assert_eq!(at_owner(&b, false), AtOwner::Wake);
        }
    }

    #[test]
    fn a_stopped_or_suspended_machine_is_woken_only_when_its_service_autostarts() {
        // The table maps both `stopped` and `suspended` to `Stopped`.
        for state in ["stopped", "suspended"] {
            assert_eq!(
                RouteState::of(state, true, false, true),
                RouteState::Stopped,
                "{state}"
            );
        }
        let off = machine("m1", RouteState::Stopped, 0, false);
        assert_eq!(decide_now(std::slice::from_ref(&off), None), Decision::Wait);
        assert_eq!(
            decide_now(std::slice::from_ref(&off), Some("m1")),
            Decision::Wait
        );
        assert_eq!(at_owner(&off, false), AtOwner::Refuse);
        // The entry proxy chose to wake it on its own view (the machine was starting).
        assert_eq!(at_owner(&off, true), AtOwner::Wake);
        let on = machine("m1", RouteState::Stopped, 0, true);
        assert_eq!(
            decide_now(std::slice::from_ref(&on), None),
            Decision::Wake(0)
        );
        assert_eq!(at_owner(&on, false), AtOwner::Wake);
    }

    #[test]
    fn which_catalog_states_route() {
        use RouteState::*;
        assert_eq!(RouteState::of("started", true, false, true), Ready);
        assert_eq!(
            RouteState::of("started", false, false, true),
            Down,
            "unhealthy"
        );
        assert_eq!(
            RouteState::of("started", true, true, true),
            Down,
            "cordoned"
        );
        assert_eq!(
            RouteState::of("started", true, false, false),
            Down,
            "host down"
        );
        assert_eq!(RouteState::of("starting", true, false, true), Starting);
        assert_eq!(RouteState::of("stopped", true, false, false), Down);
        for state in ["stopping", "suspending", "created", "failed", "destroyed"] {
            assert_eq!(RouteState::of(state, true, false, true), Down, "{state}");
        }
        let down = machine("m1", RouteState::Down, 0, true);
        assert_eq!(
            decide_now(std::slice::from_ref(&down), None),
            Decision::Wait
        );
        assert_eq!(at_owner(&down, true), AtOwner::Refuse);
    }

    #[test]
    fn started_machines_go_before_waking_and_the_nearest_first() {
        let ms = [
            machine("a", RouteState::Stopped, 0, true),
            machine("b", RouteState::Ready, 2, false),
            machine("c", RouteState::Ready, 1, false),
        ];
        assert_eq!(
            decide_now(&ms, None),
            Decision::Send(2),
            "same region first"
        );
        load(&ms[2], 2);
        assert_eq!(
            decide_now(&ms, None),
            Decision::Send(1),
            "under its soft limit"
        );
        load(&ms[1], 2);
        assert_eq!(
            decide_now(&ms, None),
            Decision::Wake(0),
            "all above soft: wake"
        );
    }

    #[test]
    fn never_above_the_hard_limit() {
        let ms = [
            machine("a", RouteState::Ready, 0, false),
            machine("b", RouteState::Ready, 1, false),
        ];
        load(&ms[0], 3);
        load(&ms[1], 2);
        assert_eq!(
            decide_now(&ms, None),
            Decision::Send(1),
            "above soft, under hard"
        );
        load(&ms[1], 3);
        assert_eq!(decide_now(&ms, None), Decision::Wait);
        assert_eq!(decide_now(&ms, Some("a")), Decision::Wait, "pinned too");
    }

    #[test]
    fn a_pin_makes_one_machine_the_only_candidate() {
        let ms = [
            machine("a", RouteState::Ready, 0, false),
            machine("b", RouteState::Ready, 2, false),
        ];
        assert_eq!(decide_now(&ms, Some("b")), Decision::Send(1));
        assert_eq!(decide_now(&ms, Some("nope")), Decision::NoMachine);
        assert_eq!(decide_now(&[], None), Decision::NoMachine);
        // A pinned machine that failed is waited for, not replaced.
        assert_eq!(
            decide(&ms, Some("b"), &["b".into()], NOW, 7),
            Decision::Wait
        );
    }

    #[test]
    fn skipped_machines_are_not_candidates() {
        let ms = [
            machine("a", RouteState::Ready, 0, false),
            machine("b", RouteState::Ready, 1, false),
        ];
        assert_eq!(
            decide(&ms, None, &["a".into()], NOW, 7),
            Decision::Send(1),
            "tried"
        );
        ms[0].load.failed_until_ms.store(NOW + 1, Ordering::Relaxed);
        assert_eq!(
            decide_now(&ms, None),
            Decision::Send(1),
            "failed a moment ago"
        );
        ms[0].load.failed_until_ms.store(NOW, Ordering::Relaxed);
        assert_eq!(
            decide_now(&ms, None),
            Decision::Send(0),
            "the skip window ended"
        );
        ms[0].load.draining.store(true, Ordering::Relaxed);
        assert_eq!(decide_now(&ms, None), Decision::Send(1), "draining");
        assert_eq!(at_owner(&ms[0], false), AtOwner::Refuse);
        let mut far = (*machine("c", RouteState::Ready, 1, false)).clone();
        far.hop = None;
        assert_eq!(
            availability(&far, &[], NOW),
            Availability::Unavailable,
            "its host's proxy is unknown"
        );
    }
}
