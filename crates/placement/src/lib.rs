//! Pure placement logic, shared by the agent, the API and the simulator. No I/O, no clocks:
//! time is always an argument.
//!
//! - [`ledger`]: a host's side of the market: capacity, committed resources, reservations,
//!   and the bid it makes. Its invariant: committed + reserved never exceeds capacity.
//! - [`score`]: how a bid is scored (the default spreads load).

pub mod ledger;
pub mod score;

pub use ledger::{Ledger, LedgerError, Reservation};
