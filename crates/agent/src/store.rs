//! The host's durable store (redb): machines, their config versions, events, operations,
//! reservations and volumes. Every write is one ACID transaction, fsynced before it returns, so what
//! the agent acknowledged survives a kill -9.
//!
//! Machine records are also kept in memory, as last committed (the store is their only
//! writer), so reading one costs a clone rather than a decode. A machine's placement record
//! (`explain`) is kept in a table of its own: it is written once, at create, and read only by
//! `GET .../placement`.
//!
//! Once a write fails for want of space (or any other I/O error), redb refuses everything
//! until the database is closed and opened again, so the store does that itself, at once:
//! a full disk fails the writes made while it is full (with [`StoreError::DiskFull`]) and
//! no more, without restarting the agent.

use crate::metrics::CommitStats;
use crate::record::{MachineRecord, Operation};
use crate::sync::lock;
use crate::volume_record::VolumeRecord;
use bazaar_placement::Reservation;
use bazaar_types::config::MachineConfig;
use bazaar_types::event::MachineEvent;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, RwLock};

/// The meta key of the drain flag (`drain.rs`): `true` while the host is drained.
pub const META_DRAINING: &str = "draining";
const META: TableDefinition<&str, &str> = TableDefinition::new("meta");
const MACHINES: TableDefinition<&str, &[u8]> = TableDefinition::new("machines");
/// Key: `machine_id/instance_id`.
const VERSIONS: TableDefinition<&str, &[u8]> = TableDefinition::new("versions");
/// Key: `machine_id/{seq:020}`.
const EVENTS: TableDefinition<&str, &[u8]> = TableDefinition::new("events");
const OPERATIONS: TableDefinition<u64, &[u8]> = TableDefinition::new("operations");
const RESERVATIONS: TableDefinition<&str, &[u8]> = TableDefinition::new("reservations");
const VOLUMES: TableDefinition<&str, &[u8]> = TableDefinition::new("volumes");
/// Key: machine id; value: the placement record (JSON).
const PLACEMENTS: TableDefinition<&str, &[u8]> = TableDefinition::new("placements");

/// Store errors.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database: {0}")]
    Db(String),
    /// Nothing was written: the file system under the data dir is full.
    #[error("the disk holding the agent's data dir is full, nothing was written ({0})")]
    DiskFull(String),
    /// Reading or writing the database file failed (it is reopened before the next use).
    #[error("database I/O: {0}")]
    Io(String),
    #[error("corrupt record: {0}")]
    Decode(#[from] serde_json::Error),
}

impl StoreError {
    /// Whether redb refuses every later call until the database is reopened.
    fn needs_reopen(&self) -> bool {
        matches!(self, StoreError::DiskFull(_) | StoreError::Io(_))
    }
}

impl From<redb::Error> for StoreError {
    fn from(e: redb::Error) -> Self {
        match e {
            redb::Error::Io(io) if io.kind() == std::io::ErrorKind::StorageFull => {
                StoreError::DiskFull(io.to_string())
            }
            redb::Error::Io(_) | redb::Error::PreviousIo | redb::Error::DatabaseClosed => {
                StoreError::Io(e.to_string())
            }
            other => StoreError::Db(other.to_string()),
        }
    }
}

fn io_err(err: std::io::Error) -> StoreError {
    StoreError::from(redb::Error::Io(err))
}

macro_rules! db_err {
    ($($t:ty),*) => {$(
        impl From<$t> for StoreError {
            fn from(e: $t) -> Self { StoreError::from(redb::Error::from(e)) }
        }
    )*};
}
db_err!(
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);

/// The store, cheap to clone.
#[derive(Debug, Clone)]
pub struct Store {
    path: Arc<PathBuf>,
    /// Held for reading while a transaction runs, for writing to reopen the database.
    db: Arc<RwLock<OpenDb>>,
    /// Every machine record, as last committed.
    machines: Arc<Mutex<HashMap<String, Arc<MachineRecord>>>>,
    /// Held from the start of a write until the in-memory records show it, so they are
    /// updated in commit order.
    writing: Arc<Mutex<()>>,
    /// Every commit's duration and failures ([`crate::metrics`]).
    commits: Arc<CommitStats>,
}

/// The open database, and how many times it was opened.
#[derive(Debug)]
struct OpenDb {
    /// `None` after an I/O error until a reopen succeeds (the disk may still be full).
    db: Option<Database>,
    generation: u64,
}

/// What records written before placements had their own table carried.
#[derive(serde::Deserialize)]
struct LegacyPlacement {
    #[serde(default)]
    placement: Option<serde_json::Value>,
}

/// Writes gathered into one transaction by [`Store::write`].
#[derive(Debug, Default, Clone)]
pub struct Batch {
    machines: Vec<Arc<MachineRecord>>,
    placements: Vec<(String, Vec<u8>)>,
    versions: Vec<(String, String, MachineConfig)>,
    events: Vec<(String, u64, MachineEvent)>,
    put_ops: Vec<Operation>,
    delete_ops: Vec<u64>,
    put_reservations: Vec<Reservation>,
    delete_reservations: Vec<String>,
    meta: Vec<(String, String)>,
    delete_machines: Vec<String>,
    volumes: Vec<VolumeRecord>,
    delete_volumes: Vec<String>,
}

impl Batch {
    /// Puts a machine record.
    pub fn machine(&mut self, m: &MachineRecord) -> &mut Self {
        self.machines.push(Arc::new(m.clone()));
        self
    }
    /// Records how machine `id` was placed.
    pub fn placement(&mut self, id: &str, placement: &serde_json::Value) -> &mut Self {
        self.placements.push((id.into(), enc(placement)));
        self
    }
    /// Records a config version.
    pub fn version(
        &mut self,
        machine_id: &str,
        instance_id: &str,
        cfg: &MachineConfig,
    ) -> &mut Self {
        self.versions
            .push((machine_id.into(), instance_id.into(), cfg.clone()));
        self
    }
    /// Replaces the record of machine `m` put earlier in this batch (or puts it).
    pub fn replace_machine(&mut self, m: &MachineRecord) -> &mut Self {
        self.machines.retain(|r| r.id != m.id);
        self.machine(m)
    }
    /// Moves machine `id`'s events numbered from `from` on by `by` (someone else appended
    /// events to the machine meanwhile).
    pub fn shift_events(&mut self, id: &str, from: u64, by: u64) -> &mut Self {
        for (machine, seq, _) in &mut self.events {
            if machine == id && *seq >= from {
                *seq += by;
            }
        }
        self
    }
    /// Appends an event; `m.next_event_seq` is advanced (put the record after this).
    pub fn event(&mut self, m: &mut MachineRecord, e: MachineEvent) -> &mut Self {
        let seq = m.next_event_seq;
        m.next_event_seq += 1;
        if e.id > m.last_event_id {
            m.last_event_id = e.id.clone();
            m.last_event_status = e.status.clone();
        }
        self.events.push((m.id.clone(), seq, e));
        self
    }
    /// Puts an operation.
    pub fn op(&mut self, op: &Operation) -> &mut Self {
        self.put_ops.push(op.clone());
        self
    }
    /// Deletes an operation (it finished).
    pub fn delete_op(&mut self, id: u64) -> &mut Self {
        self.delete_ops.push(id);
        self
    }
    /// Puts a reservation.
    pub fn reservation(&mut self, r: &Reservation) -> &mut Self {
        self.put_reservations.push(r.clone());
        self
    }
    /// Deletes a reservation.
    pub fn delete_reservation(&mut self, id: &str) -> &mut Self {
        self.delete_reservations.push(id.into());
        self
    }
    /// Sets a meta key.
    pub fn meta(&mut self, key: &str, value: &str) -> &mut Self {
        self.meta.push((key.into(), value.into()));
        self
    }
    /// Puts a volume record.
    pub fn volume(&mut self, v: &VolumeRecord) -> &mut Self {
        self.volumes.push(v.clone());
        self
    }
    /// Deletes a volume record (its storage is gone).
    pub fn delete_volume(&mut self, id: &str) -> &mut Self {
        self.delete_volumes.push(id.into());
        self
    }
    /// Deletes a machine with its versions and events (tombstone collection).
    pub fn purge_machine(&mut self, id: &str) -> &mut Self {
        self.delete_machines.push(id.into());
        self
    }
}

fn enc<T: Serialize>(v: &T) -> Vec<u8> {
    // Serializing our own plain structs to JSON cannot fail.
    serde_json::to_vec(v).unwrap_or_default()
}

fn dec<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, StoreError> {
    Ok(serde_json::from_slice(bytes)?)
}

impl Store {
    /// Opens (or creates) the store at `path`.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        let db = Database::create(path)?;
        // It holds every machine's environment: the agent's user only.
        let owner_only =
            <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o600);
        std::fs::set_permissions(path, owner_only).map_err(io_err)?;
        let tx = db.begin_write()?;
        {
            tx.open_table(META)?;
            tx.open_table(MACHINES)?;
            tx.open_table(VERSIONS)?;
            tx.open_table(EVENTS)?;
            tx.open_table(OPERATIONS)?;
            tx.open_table(RESERVATIONS)?;
            tx.open_table(VOLUMES)?;
            tx.open_table(PLACEMENTS)?;
        }
        tx.commit()?;
        let mut machines = HashMap::new();
        let mut legacy = Vec::new();
        {
            let tx = db.begin_read()?;
            let t = tx.open_table(MACHINES)?;
            for row in t.iter()? {
                let (_, v) = row?;
                let rec: MachineRecord = dec(v.value())?;
                if let Some(p) = dec::<LegacyPlacement>(v.value())?.placement {
                    legacy.push((rec.id.clone(), p));
                }
                machines.insert(rec.id.clone(), Arc::new(rec));
            }
        }
        let store = Store {
            path: Arc::new(path.to_path_buf()),
            db: Arc::new(RwLock::new(OpenDb {
                db: Some(db),
                generation: 0,
            })),
            machines: Arc::new(Mutex::new(HashMap::new())),
            writing: Arc::new(Mutex::new(())),
            commits: Arc::default(),
        };
        *lock(&store.machines) = machines;
        if !legacy.is_empty() {
            // Move placement records kept in machine records to their own table.
            let mut b = Batch::default();
            for (id, p) in &legacy {
                b.placement(id, p);
                if let Some(rec) = store.machine(id)? {
                    b.machine(&rec);
                }
            }
            store.write(&b)?;
        }
        Ok(store)
    }

    /// Runs `f` on the database. If it fails with an I/O error (after which redb refuses
    /// everything), the database is reopened and `f` run once more: every transaction of
    /// the store is made of puts and deletes, so running one again is harmless.
    fn on_db<T>(&self, f: impl Fn(&Database) -> Result<T, StoreError>) -> Result<T, StoreError> {
        let (generation, first) = self.try_on_db(&f);
        match first {
            Err(err) if err.needs_reopen() => {
                if let Err(reopen) = self.reopen(generation) {
                    tracing::warn!(error = %reopen, "reopening the store after an I/O error");
                    return Err(err);
                }
                self.try_on_db(&f).1
            }
            other => other,
        }
    }

    fn try_on_db<T>(
        &self,
        f: &impl Fn(&Database) -> Result<T, StoreError>,
    ) -> (u64, Result<T, StoreError>) {
        let open = self.db.read().unwrap_or_else(|p| p.into_inner());
        let result = match &open.db {
            Some(db) => f(db),
            None => Err(StoreError::Io(
                "the database is closed after an I/O error".into(),
            )),
        };
        (open.generation, result)
    }

    /// Closes and opens the database again, unless someone did since `generation`.
    fn reopen(&self, generation: u64) -> Result<(), StoreError> {
        let mut open = self.db.write().unwrap_or_else(|p| p.into_inner());
        if open.generation != generation {
            return Ok(());
        }
        // The old one first: it holds the file's lock.
        open.db = None;
        open.generation += 1;
        open.db = Some(Database::create(self.path.as_path())?);
        tracing::warn!("reopened the store after an I/O error");
        Ok(())
    }

    /// Every commit's duration and failures.
    pub fn commit_stats(&self) -> &CommitStats {
        &self.commits
    }

    /// Applies a batch in one durable transaction.
    pub fn write(&self, batch: &Batch) -> Result<(), StoreError> {
        let _writing = lock(&self.writing);
        let started = std::time::Instant::now();
        let written = self.on_db(|db| Self::write_tx(db, batch));
        self.commits.duration.observe(started.elapsed());
        if written.is_err() {
            self.commits.failed.fetch_add(1, Ordering::Relaxed);
        }
        written?;
        let mut mirror = lock(&self.machines);
        for id in &batch.delete_machines {
            mirror.remove(id);
        }
        for m in &batch.machines {
            mirror.insert(m.id.clone(), m.clone());
        }
        Ok(())
    }

    fn write_tx(db: &Database, batch: &Batch) -> Result<(), StoreError> {
        let tx = db.begin_write()?;
        {
            let mut machines = tx.open_table(MACHINES)?;
            let mut versions = tx.open_table(VERSIONS)?;
            let mut events = tx.open_table(EVENTS)?;
            let mut placements = tx.open_table(PLACEMENTS)?;
            for id in &batch.delete_machines {
                machines.remove(id.as_str())?;
                placements.remove(id.as_str())?;
                let prefix = format!("{id}/");
                let end = format!("{id}0");
                let keys: Vec<String> = versions
                    .range(prefix.as_str()..end.as_str())?
                    .filter_map(|r| r.ok().map(|(k, _)| k.value().to_string()))
                    .collect();
                for k in keys {
                    versions.remove(k.as_str())?;
                }
                let keys: Vec<String> = events
                    .range(prefix.as_str()..end.as_str())?
                    .filter_map(|r| r.ok().map(|(k, _)| k.value().to_string()))
                    .collect();
                for k in keys {
                    events.remove(k.as_str())?;
                }
            }
            for m in &batch.machines {
                machines.insert(m.id.as_str(), enc(&**m).as_slice())?;
            }
            for (id, p) in &batch.placements {
                placements.insert(id.as_str(), p.as_slice())?;
            }
            for (mid, iid, cfg) in &batch.versions {
                versions.insert(format!("{mid}/{iid}").as_str(), enc(cfg).as_slice())?;
            }
            for (mid, seq, e) in &batch.events {
                events.insert(format!("{mid}/{seq:020}").as_str(), enc(e).as_slice())?;
            }
            let mut ops = tx.open_table(OPERATIONS)?;
            for op in &batch.put_ops {
                ops.insert(op.id, enc(op).as_slice())?;
            }
            for id in &batch.delete_ops {
                ops.remove(*id)?;
            }
            let mut res = tx.open_table(RESERVATIONS)?;
            for r in &batch.put_reservations {
                res.insert(r.id.as_str(), enc(r).as_slice())?;
            }
            for id in &batch.delete_reservations {
                res.remove(id.as_str())?;
            }
            let mut meta = tx.open_table(META)?;
            for (k, v) in &batch.meta {
                meta.insert(k.as_str(), v.as_str())?;
            }
            let mut volumes = tx.open_table(VOLUMES)?;
            for v in &batch.volumes {
                volumes.insert(v.id.as_str(), enc(v).as_slice())?;
            }
            for id in &batch.delete_volumes {
                volumes.remove(id.as_str())?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// Copies every table as one read transaction sees it into a new database at `dest`
    /// (replaced if there; 0600): a consistent copy of the store while the agent keeps
    /// writing (`bazaar host backup`). redb has no online backup of its own, and its file
    /// copied as is could pair one commit's header with another's pages.
    pub fn copy_to(&self, dest: &Path) -> Result<(), StoreError> {
        self.on_db(|db| {
            match std::fs::remove_file(dest) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io_err(e)),
                _ => {}
            }
            let out = Database::create(dest)?;
            let owner_only =
                <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o600);
            std::fs::set_permissions(dest, owner_only).map_err(io_err)?;
            let read = db.begin_read()?;
            let write = out.begin_write()?;
            macro_rules! copy {
                ($($table:expr),*) => {$({
                    let from = read.open_table($table)?;
                    let mut to = write.open_table($table)?;
                    for row in from.iter()? {
                        let (k, v) = row?;
                        to.insert(k.value(), v.value())?;
                    }
                })*};
            }
            copy!(
                META,
                MACHINES,
                VERSIONS,
                EVENTS,
                RESERVATIONS,
                VOLUMES,
                PLACEMENTS
            );
            copy!(OPERATIONS);
            write.commit()?;
            Ok(())
        })
    }

    /// Reads a meta key.
    pub fn meta(&self, key: &str) -> Result<Option<String>, StoreError> {
        self.on_db(|db| {
            let tx = db.begin_read()?;
            let t = tx.open_table(META)?;
            Ok(t.get(key)?.map(|v| v.value().to_string()))
        })
    }

    /// Reads one machine.
    pub fn machine(&self, id: &str) -> Result<Option<MachineRecord>, StoreError> {
        Ok(lock(&self.machines)
            .get(id)
            .map(|m| MachineRecord::clone(m)))
    }

    /// Reads every machine (tombstones included), in id order.
    pub fn machines(&self) -> Result<Vec<MachineRecord>, StoreError> {
        let all: Vec<Arc<MachineRecord>> = lock(&self.machines).values().cloned().collect();
        let mut out: Vec<MachineRecord> = all.iter().map(|m| MachineRecord::clone(m)).collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    /// What `f` picks out of every machine (tombstones included), in no particular order:
    /// only what it returns is copied.
    pub fn select<T>(&self, mut f: impl FnMut(&MachineRecord) -> Option<T>) -> Vec<T> {
        lock(&self.machines).values().filter_map(|m| f(m)).collect()
    }

    /// How machine `id` was placed, if it went through the market.
    pub fn placement(&self, id: &str) -> Result<Option<serde_json::Value>, StoreError> {
        self.on_db(|db| {
            let tx = db.begin_read()?;
            let t = tx.open_table(PLACEMENTS)?;
            t.get(id)?.map(|v| dec(v.value())).transpose()
        })
    }

    /// Reads one volume.
    pub fn volume(&self, id: &str) -> Result<Option<VolumeRecord>, StoreError> {
        self.on_db(|db| {
            let tx = db.begin_read()?;
            let t = tx.open_table(VOLUMES)?;
            t.get(id)?.map(|v| dec(v.value())).transpose()
        })
    }

    /// Reads every volume.
    pub fn volumes(&self) -> Result<Vec<VolumeRecord>, StoreError> {
        self.on_db(|db| {
            let tx = db.begin_read()?;
            let t = tx.open_table(VOLUMES)?;
            let mut out = Vec::new();
            for row in t.iter()? {
                let (_, v) = row?;
                out.push(dec(v.value())?);
            }
            Ok(out)
        })
    }

    /// Every unfinished operation, in order.
    pub fn operations(&self) -> Result<Vec<Operation>, StoreError> {
        self.on_db(|db| {
            let tx = db.begin_read()?;
            let t = tx.open_table(OPERATIONS)?;
            let mut out = Vec::new();
            for row in t.iter()? {
                let (_, v) = row?;
                out.push(dec(v.value())?);
            }
            Ok(out)
        })
    }

    /// Every stored reservation.
    pub fn reservations(&self) -> Result<Vec<Reservation>, StoreError> {
        self.on_db(|db| {
            let tx = db.begin_read()?;
            let t = tx.open_table(RESERVATIONS)?;
            let mut out = Vec::new();
            for row in t.iter()? {
                let (_, v) = row?;
                out.push(dec(v.value())?);
            }
            Ok(out)
        })
    }

    /// A machine's events, newest first, at most `limit`.
    pub fn events(&self, machine_id: &str, limit: usize) -> Result<Vec<MachineEvent>, StoreError> {
        self.events_below(machine_id, format!("{machine_id}0"), limit)
    }

    /// The events of `rec` as it was recorded, newest first, at most `limit`: those numbered
    /// below its `next_event_seq`. A write commits its events before the in-memory record
    /// shows it, so events newer than a record just read may already be in the database;
    /// shown with it, they would describe a machine that never was (a `start` event beside
    /// the state from before it).
    pub fn events_of(
        &self,
        rec: &MachineRecord,
        limit: usize,
    ) -> Result<Vec<MachineEvent>, StoreError> {
        let end = format!("{}/{:020}", rec.id, rec.next_event_seq);
        self.events_below(&rec.id, end, limit)
    }

    /// Machine `machine_id`'s events keyed below `end`, newest first, at most `limit`.
    fn events_below(
        &self,
        machine_id: &str,
        end: String,
        limit: usize,
    ) -> Result<Vec<MachineEvent>, StoreError> {
        self.on_db(|db| {
            let tx = db.begin_read()?;
            let t = tx.open_table(EVENTS)?;
            let start = format!("{machine_id}/");
            let mut out = Vec::new();
            for row in t.range(start.as_str()..end.as_str())?.rev().take(limit) {
                let (_, v) = row?;
                out.push(dec(v.value())?);
            }
            Ok(out)
        })
    }

    /// A machine's config versions, oldest first.
    pub fn versions(&self, machine_id: &str) -> Result<Vec<(String, MachineConfig)>, StoreError> {
        self.on_db(|db| {
            let tx = db.begin_read()?;
            let t = tx.open_table(VERSIONS)?;
            let (start, end) = (format!("{machine_id}/"), format!("{machine_id}0"));
            let mut out = Vec::new();
            for row in t.range(start.as_str()..end.as_str())? {
                let (k, v) = row?;
                let iid = k.value().rsplit('/').next().unwrap_or_default().to_string();
                out.push((iid, dec(v.value())?));
            }
            Ok(out)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn record_json(id: &str) -> serde_json::Value {
        json!({
            "id": id, "name": "n", "app": "a", "region": "local",
            "state": "started", "desired": "started", "instance_id": "i1",
            "config": {"image": "process"},
            "resources": {"cpus": 1, "memory_mb": 256},
            "created_at_ms": 1, "updated_at_ms": 1,
            "next_run_id": 2, "next_event_seq": 3,
        })
    }

    #[test]
    fn placements_kept_in_machine_records_move_to_their_own_table() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.redb");
        let placement = json!({"placement_id": "pl_1", "rounds": [{"elapsed_us": 5}]});
        {
            // A store written before placements had their own table.
            let db = Database::create(&path).unwrap();
            let tx = db.begin_write().unwrap();
            {
                let mut t = tx.open_table(MACHINES).unwrap();
                let mut old = record_json("m1");
                old["placement"] = placement.clone();
                t.insert("m1", enc(&old).as_slice()).unwrap();
                t.insert("m2", enc(&record_json("m2")).as_slice()).unwrap();
            }
            tx.commit().unwrap();
        }
        let store = Store::open(&path).unwrap();
        assert_eq!(store.placement("m1").unwrap(), Some(placement.clone()));
        assert_eq!(store.placement("m2").unwrap(), None);
        assert_eq!(store.machine("m1").unwrap().unwrap().next_event_seq, 3);
        let ids: Vec<String> = store
            .machines()
            .unwrap()
            .into_iter()
            .map(|m| m.id)
            .collect();
        assert_eq!(ids, ["m1", "m2"]);
        drop(store);
        // The record itself no longer carries it, and what was moved survives a reopen.
        let store = Store::open(&path).unwrap();
        assert_eq!(store.placement("m1").unwrap(), Some(placement));
        let open = store.db.read().unwrap();
        let tx = open.db.as_ref().unwrap().begin_read().unwrap();
        let t = tx.open_table(MACHINES).unwrap();
        let raw: serde_json::Value = dec(t.get("m1").unwrap().unwrap().value()).unwrap();
        assert!(raw.get("placement").is_none());
    }

    #[test]
    fn reads_see_every_committed_write_and_purges() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("agent.redb")).unwrap();
        let mut rec: MachineRecord = serde_json::from_value(record_json("m1")).unwrap();
        let mut b = Batch::default();
        b.machine(&rec).placement("m1", &json!({"x": 1}));
        store.write(&b).unwrap();
        rec.next_event_seq = 9;
        let mut b = Batch::default();
        b.machine(&rec);
        store.write(&b).unwrap();
        assert_eq!(store.machine("m1").unwrap().unwrap().next_event_seq, 9);
        assert_eq!(store.select(|m| Some(m.id.clone())), ["m1"]);
        let mut b = Batch::default();
        b.purge_machine("m1");
        store.write(&b).unwrap();
        assert!(store.machine("m1").unwrap().is_none());
        assert_eq!(store.placement("m1").unwrap(), None);
        drop(store);
        let store = Store::open(&dir.path().join("agent.redb")).unwrap();
        assert!(store.machines().unwrap().is_empty());
    }

    #[test]
    fn a_record_is_read_with_its_own_events_while_a_newer_write_is_not_shown_yet() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("agent.redb")).unwrap();
        let mut rec: MachineRecord = serde_json::from_value(record_json("m1")).unwrap();
        let mut b = Batch::default();
        b.event(&mut rec, MachineEvent::new("exit", "stopped", "user"));
        rec.state = bazaar_types::state::MachineState::Stopped;
        b.machine(&rec);
        store.write(&b).unwrap();
        // A launch step's write: committed to the database, not yet shown by the record
        // in memory (the moment between the two inside `Store::write`).
        let mut launched = rec.clone();
        let mut b = Batch::default();
        b.event(&mut launched, MachineEvent::new("start", "started", "user"));
        launched.state = bazaar_types::state::MachineState::Started;
        b.machine(&launched);
        store.on_db(|db| Store::write_tx(db, &b)).unwrap();
        let shown = store.machine("m1").unwrap().unwrap();
        assert_eq!(shown.state, bazaar_types::state::MachineState::Stopped);
        let kinds = |events: Vec<MachineEvent>| -> Vec<String> {
            events.into_iter().map(|e| e.kind).collect()
        };
        assert_eq!(kinds(store.events("m1", 20).unwrap()), ["start", "exit"]);
        assert_eq!(
            kinds(store.events_of(&shown, 20).unwrap()),
            ["exit"],
            "the stopped record is read without the start that came after it"
        );
        store.write(&b).unwrap();
        let shown = store.machine("m1").unwrap().unwrap();
        assert_eq!(kinds(store.events_of(&shown, 1).unwrap()), ["start"]);
    }

    #[test]
    fn a_copy_holds_every_table_while_the_store_stays_open_and_writable() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("agent.redb")).unwrap();
        let rec: MachineRecord = serde_json::from_value(record_json("m1")).unwrap();
        let mut b = Batch::default();
        b.machine(&rec)
            .placement("m1", &json!({"x": 1}))
            .meta(META_DRAINING, "true");
        store.write(&b).unwrap();
        let copy = dir.path().join("copy.redb");
        store.copy_to(&copy).unwrap();
        // Made again over an older copy; the store keeps taking writes.
        store.copy_to(&copy).unwrap();
        let mut b = Batch::default();
        b.meta("after", "1");
        store.write(&b).unwrap();
        let mode = std::fs::metadata(&copy).unwrap().permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600
        );
        let copied = Store::open(&copy).unwrap();
        assert_eq!(copied.machine("m1").unwrap().unwrap().id, "m1");
        assert_eq!(copied.placement("m1").unwrap(), Some(json!({"x": 1})));
        assert_eq!(copied.meta(META_DRAINING).unwrap().as_deref(), Some("true"));
        assert_eq!(copied.meta("after").unwrap(), None);
    }
}
