//! What the agent persists about each machine and each operation: the types live in the
//! pure core, `bazaar-lifecycle` (`record`, `operation`); this module adds what joins them
//! to the runtime (the machine as a `Workload`).

pub use bazaar_lifecycle::operation::{OpKind, Operation, Step};
pub use bazaar_lifecycle::record::{MachineRecord, RunInfo};

/// The machine as the runtime sees it (what a launch or an exec needs).
pub trait AsWorkload {
    /// The record's fields the runtime reads.
    fn workload(&self) -> bazaar_runtime::Workload<'_>;
}

impl AsWorkload for MachineRecord {
    fn workload(&self) -> bazaar_runtime::Workload<'_> {
        bazaar_runtime::Workload {
            id: &self.id,
            app: &self.app,
            region: &self.region,
            instance_id: &self.instance_id,
            config: &self.config,
            resources: &self.resources,
            host_ports: &self.host_ports,
            private_ip: self.private_ip,
            uid: self.uid,
            uid_base: self.uid_base,
        }
    }
}
