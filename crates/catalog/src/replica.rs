//! The replica: every row this node knows, the merge rule, per-owner digests and
//! tombstone collection. Pure data structure: no I/O, no clock (callers pass `now_ms`),
//! no locking; property-tested below.
//!
//! Rows are keyed by (owner host id, kind, key). Only the owner writes its rows, and it
//! gives every new row a version above all its previous ones, so the merge rule is simply
//! "the higher version wins" per key; the same version from the same owner is the same row.
//! That makes [`Replica::apply`] idempotent, commutative and associative: applying a set of
//! rows in any order, with duplicates, gives the same replica.
//!
//! Two extras keep deletions from coming back:
//! - a collected tombstone leaves a *marker* (key, version) for a while, so a stale copy of
//!   the row (or of its tombstone) held by a node that was away is refused;
//! - [`Replica::apply_authoritative`] takes the owner's complete set of its own rows and
//!   drops what the owner no longer has (rows that were deleted and collected while this
//!   node was away for longer than the markers last).

mod apps;

use crate::records::{
    AppRecord, CertificateRecord, ChallengeRecord, HostRecord, MachineRecord, QuotaRecord,
    SecretRecord, VolumeRecord,
};
use crate::trust::{RowIdentity, Seal};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// The kinds of rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Kind {
    Host,
    Machine,
    App,
    Volume,
    Secret,
    Certificate,
    Challenge,
    Quota,
}

impl Kind {
    fn tag(self) -> u8 {
        match self {
            Kind::Host => 1,
            Kind::Machine => 2,
            Kind::App => 3,
            Kind::Volume => 4,
            Kind::Secret => 5,
            Kind::Certificate => 6,
            Kind::Challenge => 7,
            Kind::Quota => 8,
        }
    }
}

/// The content of a row.
#[derive(Clone, Debug, PartialEq)]
pub enum Record {
    Host(HostRecord),
    Machine(MachineRecord),
    App(AppRecord),
    Volume(VolumeRecord),
    Secret(SecretRecord),
    Certificate(CertificateRecord),
    Challenge(ChallengeRecord),
    Quota(QuotaRecord),
}

impl Record {
    pub fn kind(&self) -> Kind {
        match self {
            Record::Host(_) => Kind::Host,
            Record::Machine(_) => Kind::Machine,
            Record::App(_) => Kind::App,
            Record::Volume(_) => Kind::Volume,
            Record::Secret(_) => Kind::Secret,
            Record::Certificate(_) => Kind::Certificate,
            Record::Challenge(_) => Kind::Challenge,
            Record::Quota(_) => Kind::Quota,
        }
    }

    /// The key of the row within its owner and kind: host id, machine id, app name,
    /// volume id, `<app>/<secret name>`, hostname or challenge token.
    pub fn key(&self) -> &str {
        match self {
            Record::Host(h) => &h.id,
            Record::Machine(m) => &m.id,
            Record::App(a) => &a.name,
            Record::Volume(v) => &v.id,
            Record::Secret(x) => &x.id,
            Record::Certificate(c) => &c.hostname,
            Record::Challenge(c) => &c.token,
            Record::Quota(q) => &q.id,
        }
    }
}

/// One versioned row. A tombstone (`deleted`) keeps the last record, so that queries and
/// change events can still say which app a destroyed machine belonged to.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// The host that wrote the row, the only one allowed to.
    pub owner: String,
    /// Chosen by the owner; strictly increasing over all of the owner's writes.
    pub version: u64,
    pub deleted: bool,
    /// When the owner wrote this version (owner's clock); tombstones expire from it.
    pub updated_at_ms: u64,
    pub record: Record,
    /// The owner's signature, relayed as is (see [`crate::trust`]).
    pub seal: Seal,
}

impl Row {
    pub fn kind(&self) -> Kind {
        self.record.kind()
    }

    pub fn key(&self) -> &str {
        self.record.key()
    }

    /// What the owner's signature covers, besides the record.
    pub(crate) fn identity(&self) -> RowIdentity<'_> {
        RowIdentity {
            owner: &self.owner,
            kind: self.kind(),
            key: self.key(),
            version: self.version,
            deleted: self.deleted,
            updated_at_ms: self.updated_at_ms,
        }
    }

    /// A 64-bit hash of the row's identity (kind, key, version, deleted); XOR-ed into the
    /// owner's digest, so the digest does not depend on the order rows arrived in.
    fn id_hash(&self) -> u64 {
        let mut h = Sha256::new();
        h.update([self.kind().tag()]);
        h.update((self.key().len() as u64).to_be_bytes());
        h.update(self.key().as_bytes());
        h.update(self.version.to_be_bytes());
        h.update([self.deleted as u8]);
        let out = h.finalize();
        u64::from_be_bytes(out[..8].try_into().expect("sha256 is 32 bytes"))
    }
}

/// What a node knows about one owner's rows, in a few bytes: compared during anti-entropy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DigestEntry {
    pub owner: String,
    /// Highest version among the rows held.
    pub max_version: u64,
    /// Number of rows held (tombstones included).
    pub count: u32,
    /// XOR of the rows' identity hashes.
    pub hash: u64,
}

impl DigestEntry {
    /// The entry `owner` has when it holds exactly `rows` (those of other owners ignored).
    pub fn of<'a>(owner: &str, rows: impl IntoIterator<Item = &'a Row>) -> DigestEntry {
        let mut entry = DigestEntry {
            owner: owner.to_owned(),
            max_version: 0,
            count: 0,
            hash: 0,
        };
        for row in rows.into_iter().filter(|r| r.owner == owner) {
            entry.max_version = entry.max_version.max(row.version);
            entry.count += 1;
            entry.hash ^= row.id_hash();
        }
        entry
    }

    /// Same rows (with overwhelming probability).
    pub fn same_as(&self, other: &DigestEntry) -> bool {
        self.max_version == other.max_version
            && self.count == other.count
            && self.hash == other.hash
    }
}

/// The result of [`Replica::apply`].
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// The row is new, or replaced the older version given here.
    Applied { previous_version: Option<u64> },
    /// The replica already had this version or a newer one (or a marker refused it).
    Stale,
}

impl Outcome {
    pub fn is_applied(&self) -> bool {
        matches!(self, Outcome::Applied { .. })
    }
}

type RowKey = (Kind, String);

#[derive(Clone, Debug, Default)]
struct OwnerRows {
    rows: BTreeMap<RowKey, Row>,
    max_version: u64,
    hash: u64,
}

impl OwnerRows {
    fn recompute_max(&mut self) {
        self.max_version = self.rows.values().map(|r| r.version).max().unwrap_or(0);
    }
}

/// Left behind by a collected tombstone: refuse versions up to `version` of this key until
/// `forget_at_ms`.
#[derive(Clone, Copy, Debug)]
struct Marker {
    version: u64,
    forget_at_ms: u64,
}

/// The replica of the whole cluster held by one node.
#[derive(Debug, Default)]
pub struct Replica {
    owners: BTreeMap<String, OwnerRows>,
    /// machine id -> owners holding a row for it (normally one; two while a machine moves).
    machine_owners: HashMap<String, Vec<String>>,
    /// app name -> (owner, machine id) of its machines.
    app_machines: HashMap<String, BTreeSet<(String, String)>>,
    /// app name -> owners holding an App row of that name.
    app_owners: HashMap<String, BTreeSet<String>>,
    /// app name -> (owner, row key) of its secrets' rows.
    app_secrets: HashMap<String, BTreeSet<(String, String)>>,
    /// (updated_at_ms, owner, kind, key) of every tombstone, oldest first.
    tombstones: BTreeSet<(u64, String, Kind, String)>,
    markers: HashMap<(String, Kind, String), Marker>,
}

impl Replica {
    pub fn new() -> Self {
        Self::default()
    }

    /// Merges one row: kept if it is newer than what the replica holds for its key.
    pub fn apply(&mut self, row: Row) -> Outcome {
        let key: RowKey = (row.kind(), row.key().to_owned());
        if let Some(m) = self.markers.get(&(row.owner.clone(), key.0, key.1.clone())) {
            if row.version <= m.version {
                return Outcome::Stale;
            }
        }
        if let Some(existing) = self.owners.get(&row.owner).and_then(|o| o.rows.get(&key)) {
            if existing.version >= row.version {
                return Outcome::Stale;
            }
        }
        let previous_version = self.remove_row(&row.owner.clone(), &key).map(|r| r.version);
        self.insert_row(key, row);
        Outcome::Applied { previous_version }
    }

    /// Merges the owner's complete set of its own rows, then drops the rows of `owner`
    /// that the set lacks and that are not newer than it (the owner deleted them and
    /// collected the tombstones). Dropped rows leave a marker until
    /// `now_ms + marker_ttl_ms`. Returns every row that changed: the applied ones (new
    /// version) and the dropped ones (old version).
    pub fn apply_authoritative(
        &mut self,
        owner: &str,
        rows: Vec<Row>,
        now_ms: u64,
        marker_ttl_ms: u64,
    ) -> Vec<Row> {
        let mut changed = Vec::new();
        let auth_max = rows.iter().map(|r| r.version).max().unwrap_or(0);
        let keep: BTreeSet<RowKey> = rows
            .iter()
            .map(|r| (r.kind(), r.key().to_owned()))
            .collect();
        for row in rows {
            if row.owner != owner {
                continue;
            }
            if self.apply(row.clone()).is_applied() {
                changed.push(row);
            }
        }
        let doomed: Vec<RowKey> = self
            .owners
            .get(owner)
            .map(|o| {
                o.rows
                    .iter()
                    .filter(|(k, r)| !keep.contains(*k) && r.version <= auth_max)
                    .map(|(k, _)| k.clone())
                    .collect()
            })
            .unwrap_or_default();
        for key in doomed {
            if let Some(old) = self.remove_row(owner, &key) {
                self.markers.insert(
                    (owner.to_owned(), key.0, key.1),
                    Marker {
                        version: old.version,
                        forget_at_ms: now_ms.saturating_add(marker_ttl_ms),
                    },
                );
                changed.push(old);
            }
        }
        changed
    }

    /// Removes tombstones written at least `ttl_ms` ago, leaving markers that last another
    /// `ttl_ms`, and forgets expired markers. Returns the removed tombstones.
    pub fn collect_garbage(&mut self, now_ms: u64, ttl_ms: u64) -> Vec<Row> {
        let mut removed = Vec::new();
        while let Some(first) = self.tombstones.first() {
            if first.0.saturating_add(ttl_ms) > now_ms {
                break;
            }
            let (updated_at, owner, kind, key) = self.tombstones.pop_first().expect("non-empty");
            let row_key = (kind, key);
            if let Some(row) = self.remove_row(&owner, &row_key) {
                self.markers.insert(
                    (owner, row_key.0, row_key.1),
                    Marker {
                        version: row.version,
                        forget_at_ms: updated_at
                            .saturating_add(ttl_ms.saturating_mul(2))
                            .max(now_ms.saturating_add(ttl_ms)),
                    },
                );
                removed.push(row);
            }
        }
        self.markers.retain(|_, m| m.forget_at_ms > now_ms);
        removed
    }

    fn insert_row(&mut self, key: RowKey, row: Row) {
        let owner = row.owner.clone();
        match &row.record {
            Record::Machine(m) => {
                let owners = self.machine_owners.entry(m.id.clone()).or_default();
                if !owners.contains(&owner) {
                    owners.push(owner.clone());
                }
                self.app_machines
                    .entry(m.app.clone())
                    .or_default()
                    .insert((owner.clone(), m.id.clone()));
            }
            Record::App(a) => {
                self.app_owners
                    .entry(a.name.clone())
                    .or_default()
                    .insert(owner.clone());
            }
            Record::Secret(x) => {
                self.app_secrets
                    .entry(x.app.clone())
                    .or_default()
                    .insert((owner.clone(), x.id.clone()));
            }
            Record::Host(_)
            | Record::Volume(_)
            | Record::Certificate(_)
            | Record::Challenge(_)
            | Record::Quota(_) => {}
        }
        if row.deleted {
            self.tombstones
                .insert((row.updated_at_ms, owner.clone(), key.0, key.1.clone()));
        }
        let set = self.owners.entry(owner).or_default();
        set.hash ^= row.id_hash();
        set.max_version = set.max_version.max(row.version);
        set.rows.insert(key, row);
    }

    fn remove_row(&mut self, owner: &str, key: &RowKey) -> Option<Row> {
        let set = self.owners.get_mut(owner)?;
        let row = set.rows.remove(key)?;
        set.hash ^= row.id_hash();
        if row.version == set.max_version {
            set.recompute_max();
        }
        if set.rows.is_empty() {
            self.owners.remove(owner);
        }
        match &row.record {
            Record::Machine(m) => {
                if let Some(owners) = self.machine_owners.get_mut(&m.id) {
                    owners.retain(|o| o != owner);
                    if owners.is_empty() {
                        self.machine_owners.remove(&m.id);
                    }
                }
                remove_from_index(
                    &mut self.app_machines,
                    &m.app,
                    &(owner.to_owned(), m.id.clone()),
                );
            }
            Record::App(a) => remove_from_index(&mut self.app_owners, &a.name, &owner.to_owned()),
            Record::Secret(x) => remove_from_index(
                &mut self.app_secrets,
                &x.app,
                &(owner.to_owned(), x.id.clone()),
            ),
            Record::Host(_)
            | Record::Volume(_)
            | Record::Certificate(_)
            | Record::Challenge(_)
            | Record::Quota(_) => {}
        }
        if row.deleted {
            self.tombstones
                .remove(&(row.updated_at_ms, owner.to_owned(), key.0, key.1.clone()));
        }
        Some(row)
    }

    /// Removes every row of `owner` (a revoked host), without markers: its rows are refused
    /// by their owner from then on. Returns them.
    pub fn remove_owner(&mut self, owner: &str) -> Vec<Row> {
        let keys: Vec<RowKey> = self
            .owners
            .get(owner)
            .map(|o| o.rows.keys().cloned().collect())
            .unwrap_or_default();
        keys.iter()
            .filter_map(|key| self.remove_row(owner, key))
            .collect()
    }

    /// The row held for a key, if any.
    pub fn get(&self, owner: &str, kind: Kind, key: &str) -> Option<&Row> {
        self.owners.get(owner)?.rows.get(&(kind, key.to_owned()))
    }

    /// Every row of one owner.
    pub fn owner_rows(&self, owner: &str) -> impl Iterator<Item = &Row> + '_ {
        self.owners
            .get(owner)
            .into_iter()
            .flat_map(|o| o.rows.values())
    }

    /// Every owner with at least one row.
    pub fn owners(&self) -> impl Iterator<Item = &str> + '_ {
        self.owners.keys().map(String::as_str)
    }

    /// Every row, ordered by (owner, kind, key).
    pub fn rows(&self) -> impl Iterator<Item = &Row> + '_ {
        self.owners.values().flat_map(|o| o.rows.values())
    }

    /// Number of rows (tombstones included).
    pub fn len(&self) -> usize {
        self.owners.values().map(|o| o.rows.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.owners.is_empty()
    }

    /// Number of tombstones not yet collected.
    pub fn num_tombstones(&self) -> usize {
        self.tombstones.len()
    }

    /// The digest entry of one owner.
    pub fn entry(&self, owner: &str) -> Option<DigestEntry> {
        self.owners.get(owner).map(|o| DigestEntry {
            owner: owner.to_owned(),
            max_version: o.max_version,
            count: o.rows.len() as u32,
            hash: o.hash,
        })
    }

    /// The digest entries of every owner, ordered by owner.
    pub fn digest_entries(&self) -> Vec<DigestEntry> {
        self.owners
            .keys()
            .filter_map(|owner| self.entry(owner))
            .collect()
    }

    /// The highest version held for an owner's rows (0 if none).
    pub fn max_version(&self, owner: &str) -> u64 {
        self.owners.get(owner).map(|o| o.max_version).unwrap_or(0)
    }

    /// A hash of the whole replica: equal on two nodes holding the same rows.
    pub fn digest(&self) -> String {
        let mut h = Sha256::new();
        for (owner, o) in &self.owners {
            h.update((owner.len() as u64).to_be_bytes());
            h.update(owner.as_bytes());
            h.update(o.max_version.to_be_bytes());
            h.update((o.rows.len() as u32).to_be_bytes());
            h.update(o.hash.to_be_bytes());
        }
        hex::encode(&h.finalize()[..16])
    }

    /// The row that is the machine: of the rows held by several owners (a machine
    /// re-placed after its host died), the greatest by [`MachineRecord::precedence`].
    pub fn machine(&self, id: &str) -> Option<&Row> {
        self.machine_owners
            .get(id)?
            .iter()
            .filter_map(|owner| self.get(owner, Kind::Machine, id))
            .max_by_key(|r| match &r.record {
                Record::Machine(m) => Some(m.precedence(r.deleted, &r.owner)),
                _ => None,
            })
    }

    /// Whether a machine row is the machine (not a copy superseded by another host's row
    /// of the same id); lists show only those.
    pub fn is_current_machine_row(&self, row: &Row) -> bool {
        match self.machine_owners.get(row.key()) {
            Some(owners) if owners.len() > 1 => self
                .machine(row.key())
                .is_some_and(|best| best.owner == row.owner),
            _ => true,
        }
    }

    /// Whether a machine row is of the app now of its name. A machine destroyed before that
    /// app was created belonged to an earlier app of the same name (deleted, then made
    /// again, maybe by another organization): its history is not the new app's.
    pub fn is_of_current_app(&self, row: &Row) -> bool {
        let Record::Machine(m) = &row.record else {
            return false;
        };
        !row.deleted
            || self
                .app(&m.app)
                .is_none_or(|a| m.updated_at_ms >= a.created_at_ms)
    }

    /// The machine rows of an app (tombstones included).
    pub fn app_machines(&self, app: &str) -> impl Iterator<Item = &Row> + '_ {
        self.app_machines
            .get(app)
            .into_iter()
            .flatten()
            .filter_map(|(owner, id)| self.get(owner, Kind::Machine, id))
    }

    /// Every machine row (tombstones included).
    pub fn machines(&self) -> impl Iterator<Item = &Row> + '_ {
        self.rows().filter(|r| r.kind() == Kind::Machine)
    }

    /// Every volume row (tombstones included). Volumes are few; no index.
    pub fn volumes(&self) -> impl Iterator<Item = &Row> + '_ {
        self.rows().filter(|r| r.kind() == Kind::Volume)
    }

    /// Every certificate row (tombstones included). Few; no index.
    pub fn certificates(&self) -> impl Iterator<Item = &Row> + '_ {
        self.rows().filter(|r| r.kind() == Kind::Certificate)
    }

    /// Every live challenge row.
    pub fn challenges(&self) -> impl Iterator<Item = &Row> + '_ {
        self.rows()
            .filter(|r| r.kind() == Kind::Challenge && !r.deleted)
    }

    /// The live host row of a host.
    pub fn host(&self, id: &str) -> Option<&Row> {
        self.get(id, Kind::Host, id).filter(|r| !r.deleted)
    }

    /// The secrets of an app, one per name: of the rows several hosts wrote for a name, the
    /// greatest by [`SecretRecord::precedence`]; unset ones (no value) included. Only
    /// secrets of the app as it is now (`app_created_at_ms`) count.
    pub fn app_secrets(&self, app: &str) -> Vec<&SecretRecord> {
        let Some(rows) = self.app_secrets.get(app) else {
            return Vec::new();
        };
        let Some(created) = self.app(app).map(|a| a.created_at_ms) else {
            return Vec::new();
        };
        let mut by_name: BTreeMap<&str, &SecretRecord> = BTreeMap::new();
        for (owner, key) in rows {
            let Some(Record::Secret(x)) = self
                .get(owner, Kind::Secret, key)
                .filter(|r| !r.deleted)
                .map(|r| &r.record)
            else {
                continue;
            };
            if x.app_created_at_ms != created {
                continue;
            }
            match by_name.get(x.name.as_str()) {
                Some(best) if best.precedence() >= x.precedence() => {}
                _ => {
                    by_name.insert(&x.name, x);
                }
            }
        }
        by_name.into_values().collect()
    }

    /// The quota of a scope as every node resolves it: of the rows hosts wrote for its key,
    /// the greatest by [`QuotaRecord::precedence`]; an app's only if set for the app as it
    /// is now.
    pub fn quota(&self, scope: &bazaar_types::quota::Scope) -> Option<&QuotaRecord> {
        let key = QuotaRecord::key_of(scope);
        let app_created = match scope {
            bazaar_types::quota::Scope::App(a) => Some(self.app(a)?.created_at_ms),
            bazaar_types::quota::Scope::Org(_) => None,
        };
        self.owners
            .keys()
            .filter_map(|owner| match self.get(owner, Kind::Quota, &key) {
                Some(Row {
                    deleted: false,
                    record: Record::Quota(q),
                    ..
                }) => Some(q),
                _ => None,
            })
            .filter(|q| app_created.is_none_or(|c| q.app_created_at_ms == c))
            .max_by(|a, b| a.precedence().cmp(&b.precedence()))
    }
}

fn remove_from_index<K, V>(index: &mut HashMap<K, BTreeSet<V>>, key: &K, value: &V)
where
    K: std::hash::Hash + Eq,
    V: Ord,
{
    if let Some(set) = index.get_mut(key) {
        set.remove(value);
        if set.is_empty() {
            index.remove(key);
        }
    }
}

#[cfg(test)]
mod tests;
