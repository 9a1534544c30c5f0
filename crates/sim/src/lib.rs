//! bazaar's simulator: a deterministic discrete-event simulation of fleets of 10,000 to
//! 100,000 hosts that runs the same placement code as the API (`bazaar_placement`), to
//! compare placement policies and check them against theory.
//!
//! - [`config`]: scenarios (fleet, workload, faults, network), from TOML or flags.
//! - [`fleet`]: hosts with their exact ledgers, the stale catalog views, region sampling.
//! - [`policy`]: the policies, plug-ins of one interface (market, random, central ones).
//! - [`engine`]: the event loop and the protocols with modelled round trips (the market,
//!   direct placement and central schedulers each in a module of their own).
//! - [`metrics`]: what a run measures.
//! - [`theory`]: balls into bins and the supermarket model, measured against formulas.
//! - [`reclaim`]: oversubscription with reclamation and preemption (`--reclaim`).
//! - [`report`]: the comparison table, CSV and SVG.
//! - [`cli`]: `bazaar sim`.
#![forbid(unsafe_code)]

pub mod cli;
pub mod config;
pub mod engine;
pub mod fleet;
pub mod metrics;
pub mod policy;
pub mod reclaim;
pub mod report;
pub mod theory;
