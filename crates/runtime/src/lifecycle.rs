//! The interface between the agent's machine actors and the host: what an operation's steps
//! do to a workload (launch a run, find one that may already exist, signal, freeze, thaw,
//! wait for it, remove what the machine left), as the traits [`MachineDriver`] and [`Run`].
//! The real implementation is [`crate::driver::Driver`] over shims; the agent's tests run
//! the actor against a fake one, without root and without touching the host.

use crate::launch_error::LaunchError;
use async_trait::async_trait;
use bazaar_shim::{ExitRecord, ShimError, ShimHandle};
use bazaar_types::config::MachineConfig;
use bazaar_types::event::MachineEvent;
use bazaar_types::host::Resources;
use bazaar_types::machine::ImageRef;
use std::collections::BTreeMap;
use std::net::Ipv4Addr;

/// A machine as the runtime sees it for one call, borrowed from the agent's record.
#[derive(Debug, Clone, Copy)]
pub struct Workload<'a> {
    pub id: &'a str,
    pub app: &'a str,
    pub region: &'a str,
    /// The version of the config (`FLY_MACHINE_VERSION`).
    pub instance_id: &'a str,
    pub config: &'a MachineConfig,
    pub resources: &'a Resources,
    /// Internal port → host port, for a machine without an address of its own.
    pub host_ports: &'a BTreeMap<u16, u16>,
    /// Its address on the machine network, if it has one.
    pub private_ip: Option<Ipv4Addr>,
    /// The uid of a sandboxed process machine.
    pub uid: Option<u32>,
    /// The first host id of an image machine's user namespace.
    pub uid_base: Option<u32>,
}

/// What a launch did on its way (an image pulled), kept whether or not it succeeded.
#[derive(Debug, Default)]
pub struct LaunchReport {
    pub events: Vec<MachineEvent>,
    /// The image the run was made from (image machines).
    pub image: Option<ImageRef>,
    /// Where the launch's time went ([`crate::timing`]); filled by a launch that succeeded.
    pub timing: Vec<bazaar_types::event::StepTiming>,
}

/// What [`MachineDriver::find_run`] found of a run that may have been launched before.
#[derive(Debug)]
pub enum RunFound {
    /// It runs: here is its handle.
    Alive(Box<dyn Run>),
    /// It ran and ended (its exit is in [`MachineDriver::exit_record`]).
    Ended,
    /// It was never launched.
    None,
}

/// Launches, finds and removes machines' runs on this host.
#[async_trait]
pub trait MachineDriver: Send + Sync + std::fmt::Debug {
    /// Starts run `run_id` of `machine` with its app's secrets (`secret_env`, which win over
    /// `config.env`); what happened on the way is added to `report`, also on failure. A
    /// failure says at which step, of what kind and whether it is retryable.
    async fn launch(
        &self,
        machine: &Workload<'_>,
        run_id: u64,
        secret_env: &[(String, String)],
        report: &mut LaunchReport,
    ) -> Result<Box<dyn Run>, LaunchError>;

    /// Run `run_id` of machine `id`, if it was already launched (an agent that crashed
    /// after spawning it redoes the launch step): alive, ended, or never started.
    async fn find_run(&self, id: &str, run_id: u64) -> RunFound;

    /// Takes the live run `run_id` of machine `id` back under supervision, if it runs.
    fn adopt(&self, id: &str, run_id: u64) -> Result<Option<Box<dyn Run>>, ShimError>;

    /// How run `run_id` of machine `id` ended, once it has.
    fn exit_record(&self, id: &str, run_id: u64) -> Option<ExitRecord>;

    /// Removes everything a destroyed machine left on the host.
    async fn destroy(&self, id: &str);

    /// Why machine `id`'s writable space is full, if it is ([`crate::work_disk::full`]).
    fn disk_full(&self, _id: &str) -> Option<String> {
        None
    }
}

/// One run of a machine: its supervisor and workload.
#[async_trait]
pub trait Run: Send + Sync + std::fmt::Debug {
    fn run_id(&self) -> u64;
    fn shim_pid(&self) -> i32;
    fn workload_pid(&self) -> i32;
    /// Sends signal number `signal` to the workload.
    fn signal(&self, signal: i32) -> Result<(), ShimError>;
    /// Kills the workload and everything it started.
    fn kill(&self) -> Result<(), ShimError>;
    fn freeze(&self) -> Result<(), ShimError>;
    fn thaw(&self) -> Result<(), ShimError>;
    /// Resolves once the run is over (its exit record is then final). Cancel-safe.
    async fn wait(&self);
}

#[async_trait]
impl Run for ShimHandle {
    fn run_id(&self) -> u64 {
        ShimHandle::run_id(self)
    }
    fn shim_pid(&self) -> i32 {
        ShimHandle::shim_pid(self)
    }
    fn workload_pid(&self) -> i32 {
        ShimHandle::workload_pid(self)
    }
    fn signal(&self, signal: i32) -> Result<(), ShimError> {
        ShimHandle::signal(self, signal)
    }
    fn kill(&self) -> Result<(), ShimError> {
        ShimHandle::kill(self)
    }
    fn freeze(&self) -> Result<(), ShimError> {
        ShimHandle::freeze(self)
    }
    fn thaw(&self) -> Result<(), ShimError> {
        ShimHandle::thaw(self)
    }
    async fn wait(&self) {
        ShimHandle::wait(self).await
    }
}
