//! Pure placement logic, shared by the agent, the API and the simulator. No I/O, no clocks:
//! time is always an argument.
//!
//! - [`ledger`]: a host's side of the market: capacity, committed resources, reservations,
//!   and the bid it makes. Its invariant: committed + reserved never exceeds capacity.
//! - [`score`]: how a bid is scored (the default spreads load).
//! - [`exchange`]: the exchange's side: region expressions, candidates, which hosts to ask
//!   (power of d choices, batch sampling), ranking bids, the placement record.
//! - [`constraints`]: host-label constraints, affinities and spread of an app's machines,
//!   each host's verdict, and the per-host machines rule.
//! - [`volume`]: where a volume may go (disk, `require_unique_zone`, the compute hint).
//! - [`preemption`]: which lower-priority machines a full host would stop, which host's
//!   preemption bid wins, and the ledger's side of such a bid.
//! - [`burst`]: shared CPUs' baseline share and burst balance (Fly's model), the limit a
//!   shared machine's cgroup gets.
//! - [`reclaim`]: reservations that decay from the request towards measured use plus a
//!   margin (Borg's rule), the room that leaves `batch` machines, and which of them stop
//!   when a service needs its reservation back.
#![forbid(unsafe_code)]

pub mod burst;
pub mod constraints;
pub mod exchange;
pub mod ledger;
pub mod preemption;
pub mod reclaim;
pub mod score;
pub mod volume;

pub use ledger::{Ledger, LedgerError, Reservation};
