//! The records the catalog replicates (hosts, machines, volumes, apps, edge certificates
//! and ACME challenges) and the views and filters
//! that queries return. These are plain data: no I/O, no locking.

use bazaar_types::config::MachineService;
use bazaar_types::host::Resources;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// A host's description of itself, published by that host only.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct HostRecord {
    /// The host id; always equal to the publishing node's id.
    pub id: String,
    pub region: String,
    /// Where the host's API (and host-to-host interface) listens.
    pub api_addr: String,
    /// Where the host's catalog gossips (UDP and TCP).
    pub gossip_addr: String,
    pub capacity: Resources,
    /// Advertised free resources; may be stale, the host's bid is authoritative.
    pub free: Resources,
    pub num_machines: u32,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub draining: bool,
    /// Disk offered to volumes, in GB.
    #[serde(default)]
    pub disk_gb: u64,
    /// Disk not yet given to volumes, in GB.
    #[serde(default)]
    pub disk_free_gb: u64,
    /// The host's ed25519 public key (hex), which signs every row it owns (see
    /// [`crate::trust`]); set by the catalog when the host publishes its record.
    #[serde(default)]
    pub public_key: String,
    /// In a cluster with a CA: the CA's signature binding `public_key` to this host id
    /// (base64); nodes take a host's key only with it (see [`crate::trust`]).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub key_endorsement: String,
    /// Hashes (hex SHA-256) of the API tokens this host's token file revokes; every host
    /// refuses a token any host revokes.
    #[serde(default)]
    pub revoked_tokens: Vec<String>,
    pub updated_at_ms: u64,
}

/// One machine, published by the host that owns it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct MachineRecord {
    pub id: String,
    pub app: String,
    /// The id of the app ([`AppRecord::id`]) the machine was created in, as the creating
    /// node's catalog named it: tells the machines of an app that lost its name (made on
    /// the other side of a partition) from the app's. Empty from hosts of older versions.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub app_id: String,
    pub name: String,
    pub region: String,
    /// The owning host; always equal to the publishing node's id.
    pub host_id: String,
    /// The machine state as the Fly API spells it (`started`, `stopped`, `destroyed`, ...).
    pub state: String,
    pub instance_id: String,
    /// The machine's address on its organization's private network (issue 16), if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_ip: Option<String>,
    #[serde(default)]
    pub services: Vec<ServiceRecord>,
    #[serde(default)]
    pub checks: Vec<CheckRecord>,
    #[serde(default)]
    pub cordoned: bool,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    pub updated_at_ms: u64,
    /// The ownership epoch: 0 when created, one more each time the guardian re-places
    /// the machine on another host after its host died. Of two hosts' rows for one machine
    /// id, [`MachineRecord::precedence`] says which is the machine.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub epoch: u64,
    /// What the machine holds on its host (CPUs and memory of its size): what quotas count
    /// (docs/POLICY.md). Zero from hosts of older versions.
    #[serde(default)]
    pub resources: bazaar_types::host::Resources,
    /// The machine's config, carried only by machines that opted in to re-placement
    /// (`bazaar_types::replacement`: the guardian re-creates the machine from it when its
    /// host is dead and cannot be asked) and by per-host machines
    /// (`bazaar_types::per_host`: each matching host makes its copy from it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<Box<bazaar_types::config::MachineConfig>>,
    /// The machine that displaced this one from its host (by preemption, or by taking back
    /// the reclaimed room it ran on), while it is stopped for it. Its host re-places such a
    /// machine on another host when its config allows (`bazaar_types::replacement::
    /// re_placed_when_displaced`), and then publishes its config in this row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub displaced_by: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl MachineRecord {
    /// The order between rows of one machine id held by different hosts (the greatest is
    /// the machine, on every node alike): the higher epoch, then a live row before a
    /// tombstone, then the lower host id (two re-placements that raced). A host whose row
    /// is not the greatest stops its copy (the agent's `fence`).
    pub fn precedence<'a>(
        &self,
        deleted: bool,
        owner: &'a str,
    ) -> (u64, bool, std::cmp::Reverse<&'a str>) {
        (self.epoch, !deleted, std::cmp::Reverse(owner))
    }
}

/// One volume, published by the host that owns it (its storage lives there).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct VolumeRecord {
    pub id: String,
    pub app: String,
    pub name: String,
    pub region: String,
    /// The owning host; always equal to the publishing node's id.
    pub host_id: String,
    /// `creating`, `created`, `extending`, `destroying`, `destroyed`.
    pub state: String,
    pub size_gb: u64,
    #[serde(default)]
    pub attached_machine_id: Option<String>,
    /// `ext4` or `dir`.
    pub fstype: String,
    pub encrypted: bool,
    pub snapshot_retention: u32,
    pub auto_backup_enabled: bool,
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
}

/// A volume as a query returns it.
#[derive(Clone, Debug, PartialEq)]
pub struct VolumeView {
    pub record: VolumeRecord,
    /// `"ok"`, `"unreachable"` or `"unknown"`, as for machines.
    pub host_status: &'static str,
    /// True for a tombstone (the volume was destroyed).
    pub deleted: bool,
}

/// A service of a machine and where to reach it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ServiceRecord {
    pub service: MachineService,
    /// The address the proxy connects to (the host's address for the machine).
    pub address: String,
    pub port: u16,
}

/// The last result of one health check.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CheckRecord {
    pub name: String,
    /// `passing`, `warning` or `critical`.
    pub status: String,
    #[serde(default)]
    pub output: String,
    pub updated_at_ms: u64,
}

/// An app, published by the host whose API created it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct AppRecord {
    /// Made at creation and never reused: what the app owns (certificates, hostnames) is
    /// bound to it, not to the name, so an app made again under a deleted app's name (by
    /// any organization) starts empty.
    #[serde(default)]
    pub id: String,
    pub name: String,
    pub org_slug: String,
    pub created_at_ms: u64,
    pub created_by_host: String,
}

impl AppRecord {
    /// The order among live rows of one app name (two hosts created it while they could
    /// not hear each other): the least is the app, the others lost the name to it, on
    /// every node alike (`Replica::app`): the earliest creation, then the creating host's
    /// id (a host holds one row per name), then the app id.
    pub fn precedence(&self) -> (u64, &str, &str) {
        (self.created_at_ms, &self.created_by_host, &self.id)
    }

    /// What an app that lost its name to this one is told (409): the rule and the winner.
    pub fn lost_name_message(&self, loser_id: &str) -> String {
        format!(
            "app {name:?} ({loser_id}) lost its name to app {id} of organization {org:?}: two \
             apps were given the name while their hosts could not hear each other, and the one \
             created first (then by the lower host id) keeps it; this app takes no machines. \
             Create it again under another name",
            name = self.name,
            id = self.id,
            org = self.org_slug,
        )
    }
}

/// One app secret as one host last wrote it: its value sealed with the cluster's
/// `app-secrets` key (`bazaar-seal`), never in plain text. Any host may write a secret of
/// any app (a row of its own, keyed `<app>/<NAME>`); of the rows for one name, the latest
/// `updated_at_ms` wins on every node alike ([`SecretRecord::precedence`]). Unsetting
/// writes a row without a value, a tombstone that stays (a collected one would let an
/// older value come back).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct SecretRecord {
    /// `<app>/<name>`: the row's key.
    pub id: String,
    pub app: String,
    pub name: String,
    /// The host that wrote it; always equal to the publishing node's id.
    pub set_by_host: String,
    /// The sealed value; `None` once unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sealed: Option<String>,
    /// A keyed digest of the value (16 hex digits): shows that a value changed, not what it is.
    #[serde(default)]
    pub digest: String,
    /// The creation time of the app this secret belongs to: a secret of an app that was
    /// deleted and made again under the same name is not the new app's.
    pub app_created_at_ms: u64,
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
}

/// The quota of an org or an app (docs/POLICY.md), set through any node's API: that node
/// writes a row of its own, keyed `org/<org>` or `app/<app>`; of the rows for one key, the
/// latest `updated_at_ms` (then host id) wins on every node alike. A row without limits
/// lifts the quota. An app's quota belongs to the app as it is now (`app_created_at_ms`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct QuotaRecord {
    /// `org/<org>` or `app/<app>`: the row's key ([`QuotaRecord::key_of`]).
    pub id: String,
    pub scope: bazaar_types::quota::Scope,
    pub limits: bazaar_types::quota::Limits,
    /// The host that wrote it; always equal to the publishing node's id.
    pub set_by_host: String,
    /// For an app's quota, the creation time of the app it was set for (0 for an org).
    #[serde(default)]
    pub app_created_at_ms: u64,
    pub updated_at_ms: u64,
}

impl QuotaRecord {
    /// The row key of a scope's quota.
    pub fn key_of(scope: &bazaar_types::quota::Scope) -> String {
        match scope {
            bazaar_types::quota::Scope::Org(o) => format!("org/{o}"),
            bazaar_types::quota::Scope::App(a) => format!("app/{a}"),
        }
    }

    /// The order among rows of one key: the latest write wins, then the higher host id.
    pub fn precedence(&self) -> (u64, &str) {
        (self.updated_at_ms, &self.set_by_host)
    }
}

/// The edge certificate of one app hostname, published by the host that issued it (or
/// took it over, or removed it). Several hosts may hold a row for one hostname: the one
/// written last (`updated_at_ms`, then host id) is the hostname's certificate, a tombstone
/// included (a removed hostname). The private key travels sealed with the cluster's
/// `certificate-keys` key, bound to `app/<app>/<app id>/certificate/<hostname>`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct CertificateRecord {
    /// The hostname (lowercase), the row's key.
    pub hostname: String,
    pub app: String,
    /// The id of the app ([`AppRecord::id`]) the hostname is attached to: a row counts only
    /// while the app of that name has this id (a deleted app's rows attach nothing).
    #[serde(default)]
    pub app_id: String,
    /// The owning host: it renews the certificate. Always the publishing node's id.
    pub host_id: String,
    /// `acme` or `custom` (given by the user as PEM).
    pub source: String,
    /// `pending`, `issued` or `failed`.
    pub status: String,
    /// Why the last issuance failed (the ACME server's words), when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The certificate chain, PEM, leaf first (empty until issued).
    #[serde(default)]
    pub chain_pem: String,
    /// The private key (PKCS#8 PEM), sealed (`bazaar-seal`); empty until issued.
    #[serde(default)]
    pub sealed_key: String,
    #[serde(default)]
    pub not_before_ms: u64,
    #[serde(default)]
    pub not_after_ms: u64,
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
}

impl SecretRecord {
    /// The row key of secret `name` of `app`.
    pub fn key_of(app: &str, name: &str) -> String {
        format!("{app}/{name}")
    }

    /// The order between rows of one secret written by different hosts (the greatest is
    /// the secret): the later write, then the greater host id.
    pub fn precedence(&self) -> (u64, &str) {
        (self.updated_at_ms, &self.set_by_host)
    }
}

/// An ACME HTTP-01 challenge being answered: every proxy answers
/// `GET /.well-known/acme-challenge/<token>` with `key_authorization`, so validation
/// succeeds whichever host it reaches. Published by the issuing host, deleted when done.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ChallengeRecord {
    /// The token, the row's key.
    pub token: String,
    pub key_authorization: String,
    pub hostname: String,
    /// The issuing host; always the publishing node's id.
    pub host_id: String,
    pub created_at_ms: u64,
}

/// A certificate row as a query returns it.
#[derive(Clone, Debug, PartialEq)]
pub struct CertificateView {
    pub record: CertificateRecord,
    /// Liveness of the owning host.
    pub host_status: HostStatus,
    /// True for a tombstone (the hostname was removed by its owner).
    pub deleted: bool,
}

/// Liveness of a host as this node's failure detector (SWIM) sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HostStatus {
    /// Answering probes.
    Alive,
    /// Failed a probe recently, or not (yet) known to the failure detector.
    Suspect,
    /// Declared down by the cluster.
    Dead,
    /// Announced a clean shutdown.
    Left,
}

impl HostStatus {
    /// The lowercase name (`alive`, `suspect`, `dead`, `left`).
    pub fn as_str(self) -> &'static str {
        match self {
            HostStatus::Alive => "alive",
            HostStatus::Suspect => "suspect",
            HostStatus::Dead => "dead",
            HostStatus::Left => "left",
        }
    }
}

impl fmt::Display for HostStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A host as a query returns it: its last published record and its liveness.
#[derive(Clone, Debug, PartialEq)]
pub struct HostView {
    pub record: HostRecord,
    pub status: HostStatus,
    /// The version of the record (chosen by the host).
    pub version: u64,
}

/// A machine as a query returns it.
#[derive(Clone, Debug, PartialEq)]
pub struct MachineView {
    pub record: MachineRecord,
    /// `"ok"` when the owning host is alive, `"unreachable"` when it is suspect, dead or
    /// left, `"unknown"` when the failure detector has never heard of it.
    pub host_status: &'static str,
    /// True for a tombstone (the machine was destroyed); only returned when asked for.
    pub deleted: bool,
    /// The version of the record (chosen by the owning host).
    pub version: u64,
}

/// What changed in the local replica. Subscribers re-read what they care about.
///
/// A `Host` change is also sent when the host's liveness changes; every machine of that
/// host then gets a `Machine` change too, since its `host_status` changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    Host(String),
    Machine { id: String, app: String },
    Volume { id: String, app: String },
    App(String),
    Certificate(String),
    Challenge(String),
}

/// Which machines [`crate::Catalog::machines`] returns. The default matches every live
/// machine.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MachineFilter {
    pub app: Option<String>,
    pub region: Option<String>,
    /// Empty means any state.
    pub states: Vec<String>,
    /// Also return tombstones of destroyed machines (not yet collected).
    pub include_deleted: bool,
}

impl MachineFilter {
    /// Every live machine of `app`.
    pub fn app(app: impl Into<String>) -> Self {
        MachineFilter {
            app: Some(app.into()),
            ..Default::default()
        }
    }

    /// Whether a machine passes the filter (the `app` and deletion tests included).
    pub fn matches(&self, record: &MachineRecord, deleted: bool) -> bool {
        (self.include_deleted || !deleted)
            && self.app.as_deref().is_none_or(|a| a == record.app)
            && self.region.as_deref().is_none_or(|r| r == record.region)
            && (self.states.is_empty() || self.states.contains(&record.state))
    }
}
