//! The bazaar host agent (Fly's flyd): the only source of truth for the machines on its
//! host. It keeps them in an embedded durable store, runs every operation on them as a
//! durable sequence of idempotent steps, supervises each workload through a per-machine
//! shim that outlives the agent, enforces restart policies, and answers the market: bids,
//! reservations and claims.
//!
//! Layout, in layers (each module imports only from layers below it; `tests/layering.rs`
//! fails on an import circle, on an `impl` block for another module's type and on the
//! agent's `Inner` reachable outside `agent.rs`):
//! - [`boot`], at the top: start-up ([`run_agent`], [`boot::start`]: re-adoption, resuming
//!   operations, the agent's loops) and shutdown.
//! - Above [`agent`], what needs the whole agent, as functions over its narrow methods:
//!   [`operations`] (the accept side of operations on existing machines), [`market`],
//!   [`create`], [`leases`], [`publish`], [`actor`], [`http`], [`volumes`] and the rest below.
//! - [`agent`]: the agent's state, made of parts from the modules below it and private to
//!   it, what every operation shares (numbering, loading a live machine, durable commits),
//!   and narrow accessors of its parts.
//! - The parts, which know nothing of the agent: [`store`] (beside the ledger of
//!   `bazaar-placement`), [`registry`]
//!   (the channel to each machine's actor), [`tokens`], [`addresses`], [`checks`],
//!   [`audit`], [`metrics`], [`host_tls`]; and [`record`], [`config`], [`error`],
//!   [`sync`].
//! - [`addresses`]: host ports, machine-network addresses and uids, handed out and given
//!   back; [`uid_claims`]: the uids claimed machine-wide, beside other agents' on the kernel.
//! - [`connections`]: the agent's router served on the connections its listeners admit
//!   (`bazaar_node::listen`: caps, eviction, head timeout).
//! - [`market`]: bids, reservations, claims and creates (the host's side of the market);
//!   [`create`]: a create request turned into a machine, for the market and preemption.
//! - [`runnable`]: what this host can run, checked at start (the drivers it bids for).
//! - [`leases`]: leases, cordons and metadata.
//! - [`preempt`]: preemption bids and their claims; [`preemptions`]: the open bids.
//! - [`reclaim`]: oversubscription with reclamation (machines' use measured through the
//!   [`usage`] part, reservations decaying in the ledger, batch machines stopped when a
//!   service needs its reservation back).
//! - [`publish`]: this host's rows in the catalog (host record, machines) and the live state
//!   `wait` watches.
//! - [`views`]: reads of machines (the API view, lists, events, versions, logs, `wait`),
//!   over the parts the agent lends them (`views::Reader`); the agent's read methods
//!   delegate to it.
//! - [`actor`]: one task per machine that executes its operations step by step.
//! - [`record`]: what is persisted (machine records, operations, steps), whose types and
//!   rules are the pure core `bazaar-lifecycle`'s (operations and steps, the restart
//!   policy, what an exit leads to, leases): the agent feeds it and carries out what it
//!   decides.
//! - [`store`]: the redb store.
//! - [`driver`], [`oci`], [`network`], [`netlink`], [`idranges`], [`volume_fs`], [`exec`]:
//!   the host plumbing, re-exported from `bazaar-runtime` (the driver of process and image
//!   machines, their network, volumes' storage, exec). The actors reach machines only
//!   through its [`bazaar_runtime::MachineDriver`] (`Agent::machine_driver`).
//! - [`restart`]: the restart policy (`bazaar_lifecycle::restart`).
//! - [`http`]: the host interface (`/host/v1`).
//! - [`cluster_security`]: the gossip keyring and the CA's revocations on this host.
//! - [`host_tls`]: this host's cluster certificate (join, renewal) and the host listener
//!   (the host interface over mTLS).
//! - [`api_tls`]: HTTPS on the API port (`--api-tls`), with a certificate of the cluster CA
//!   or one given.
//! - [`exec`]: running a command inside a machine; [`ps`]: its processes; [`memory`]:
//!   its memory limit changed live, and memory reclaimed.
//! - [`images`]: this host's images over the host interface (list, pull with progress,
//!   import, prune) and their background pruning.
//! - [`standby`]: starts stopped standbys when their primary's host is declared dead.
//! - [`name_conflict`]: stops this host's machines of an app that lost its name to an
//!   older app of the name (both made during a partition).
//! - [`volumes`]: volumes owned by this host (records, placement checks, attachment), on
//!   storage from [`volume_fs`] (ext4 images on loop devices, or directories);
//!   [`snapshots`]: their snapshots, restores and forks; [`volume_record`]: what is stored
//!   of one.
//! - [`metrics`]: operations, steps, store commits and machines by state, with the
//!   catalog's, as Prometheus text (served at `/metrics` with the proxy's).
//! - [`machine_metrics`]: machines' own metrics pages (`config.metrics`), scraped and
//!   served with the agent's (the loop that scrapes is in [`boot`]).
//! - [`checks`]: service health checks of this host's machines (results go in the catalog;
//!   the loop that runs them is in [`boot`]).
//! - [`cleanup`]: what a host made on the machine outside its store (mounts, loop devices,
//!   network, cgroups, shims), found from its data dir and removed (`bazaar host reset`,
//!   `bazaar dev` on Ctrl-C, leftovers of a killed agent at start).
//! - [`clock`]: the agent's "now" (the system clock, or tokio's in paused tests).
//! - [`config`], [`secrets`], [`tokens`] (who calls the API), [`audit`] (what they changed),
//!   [`fault`], [`error`], [`shim_exe`] (which executable runs the shims).
//! - [`node`]: the agent as the `bazaar_node::Node` the API, proxy, certificates and
//!   dashboard use.
//! - [`app_secrets`]: apps' secrets, sealed in the catalog, opened into a workload's env at
//!   each start.
//!
//! Entry point: [`run_agent`].

pub mod actor;
pub mod addresses;
pub mod agent;
pub mod api_tls;
pub mod app_secrets;
pub mod audit;
pub mod backup;
pub mod boot;
pub mod checks;
pub mod cleanup;
pub mod clock;
pub mod cluster_security;
pub mod config;
pub mod connections;
pub mod create;
pub mod disk_watch;
pub mod dns;
pub mod drain;
pub mod error;
pub mod fault;
pub mod fence;
pub mod host_tls;
pub mod http;
pub mod identity;
pub mod images;
pub mod leases;
pub mod ledger_dump;
pub mod machine_metrics;
pub mod market;
pub mod memory;
pub mod mesh;
pub mod metrics;
pub mod name_conflict;
pub mod node;
pub mod operations;
pub mod preempt;
pub mod preemptions;
pub mod ps;
pub mod publish;
pub mod reclaim;
pub mod record;
pub mod registry;
pub mod throttle;
pub use bazaar_lifecycle::restart;
pub mod runnable;
pub mod schedule;
pub mod secrets;
pub mod shim_exe;
pub mod snapshots;
pub mod standby;
pub mod store;
pub mod sync;
pub mod tokens;
pub mod uid_claims;
pub mod usage;
pub mod views;
pub mod volume_record;
pub mod volumes;

// The host plumbing lives in `bazaar-runtime`; its modules keep their old paths here.
pub use bazaar_runtime::{driver, exec, idranges, microvm, netlink, network, oci, volume_fs};

pub use agent::{Agent, Seams};
pub use boot::run_agent;
pub use config::AgentConfig;
