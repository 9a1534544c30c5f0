//! The machine lifecycle's rules, pure: what the agent decides about a machine, as functions
//! of (record, event, now) with no clock, no store, no async runtime and no I/O of their own.
//!
//! - [`accept`]: an operation on an existing machine checked against its lease and the
//!   state its queued operations leave, and the operation to record.
//! - [`operation`]: what an operation does (its kind), the steps it is made of, where a
//!   resumed operation goes on, and the state it leaves the machine in.
//! - [`restart`]: the restart policy (Fly's `no`, `always`, `on-failure` with its retry
//!   window and backoff).
//! - [`exit`]: what a workload's own exit leads to: a policy restart, a relaunch after a host
//!   shutdown, a destroy (`auto_destroy`) or a stop, and what it changes in the record.
//! - [`lease`]: leases (Fly's exclusive-change tokens): taking, refreshing, releasing and
//!   checking one; and metadata keys.
//! - [`record`]: the machine as the agent stores it, and how an actor's work merges with what
//!   the accept side changed meanwhile.
//! - [`schedule`]: when a scheduled machine (`config.schedule`) is started again.
//!
//! The agent (`bazaar-agent`) is the shell: it feeds these functions what its store, its
//! driver and its clock say, and carries out what they decide. Each rule is tested here in
//! milliseconds (`cargo test -p bazaar-lifecycle`), and `cargo mutants -p bazaar-lifecycle`
//! checks that the tests notice a changed rule (docs/MUTANTS.md).

#![forbid(unsafe_code)]

pub mod accept;
pub mod exit;
pub mod lease;
pub mod operation;
pub mod record;
pub mod restart;
pub mod schedule;
