//! Who may write which rows: every host signs its own rows with its own ed25519 key, and a
//! node keeps a row only if it verifies against the key it trusts for the row's owner.
//!
//! The cluster secret only says "a member of this cluster sent this"; on its own it would
//! let any holder rewrite another host's rows (its `api_addr`, its machines). So:
//!
//! - Each host has a key pair (the agent keeps the private half, 0600, in its data dir) and
//!   publishes the public half in its host row. Every row it owns (host, machines, volumes,
//!   apps, tombstones) carries a [`Seal`]: the owner's public key, its signature over the
//!   row's identity and the record's JSON exactly as signed. Relays (gossip forwarding,
//!   anti-entropy) pass the seal on untouched, so a row verifies on every node whoever
//!   delivered it.
//! - In a cluster with a CA (`CaTrust`), a host's key is bound to its host id by the CA:
//!   the CA signs (host id, key) for a host it issued a certificate to
//!   ([`bazaar_pki::ClusterCa::endorse_row_key`]), the host row carries that endorsement,
//!   and a node pins a host's key only from a host row whose endorsement verifies against
//!   the CA certificate. Rows of an owner whose endorsed key is not known yet are refused
//!   (anti-entropy sends an owner's host row before its other rows, so they follow).
//!   A host the CA revoked ([`bazaar_pki::Revocation`], spread by the catalog) has its
//!   rows dropped and refused, its datagrams and syncs refused.
//! - Without a CA, binding a key to a host id is trust on first use (`KeyRing`): the
//!   first key seen for a host id is pinned, and a row of that host signed with any other
//!   key is refused. A host keeps its key across restarts, so the pin holds; a host whose
//!   data dir is wiped gets a new id too. The weakness is the first contact: a key holder
//!   who publishes rows for a host id before the real host ever did claims that id on the
//!   nodes that saw it first.
//! - Anti-entropy may drop an owner's rows that its complete set lacks; "this is my
//!   complete set" is a [`SignedEntry`], the owner's digest entry signed by the owner, which
//!   the rows received must match.

use crate::replica::{DigestEntry, Kind, Record};
use anyhow::{bail, Context};
pub use ed25519_dalek::SigningKey;
use ed25519_dalek::{Signature, Signer, VerifyingKey};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

const ROW_CONTEXT: &[u8] = b"bazaar-catalog/row/v1";
const ENTRY_CONTEXT: &[u8] = b"bazaar-catalog/complete-set/v1";

/// The owner's signature on one row, kept with the row so that any node can relay it.
#[derive(Clone, Debug, PartialEq)]
pub struct Seal {
    /// The signer's public key (checked against the owner's pinned key).
    pub public_key: [u8; 32],
    pub signature: [u8; 64],
    /// The record's JSON exactly as the owner signed it, when encoding the record again
    /// would not give the same bytes; `None` in the usual case, where it would (the row's
    /// record is then not held twice).
    pub body: Option<Arc<[u8]>>,
}

impl Default for Seal {
    /// An empty seal, which verifies against nothing (rows built in memory, in tests).
    fn default() -> Self {
        Seal {
            public_key: [0; 32],
            signature: [0; 64],
            body: None,
        }
    }
}

impl Seal {
    /// The signed bytes: the body kept, or the record encoded again.
    pub fn signed_body<'a>(&'a self, record: &Record) -> Cow<'a, [u8]> {
        match &self.body {
            Some(body) => Cow::Borrowed(body),
            None => Cow::Owned(record_json(record)),
        }
    }

    /// Drops the body kept if encoding `record` again gives the same bytes.
    pub(crate) fn compact(&mut self, record: &Record) {
        if self
            .body
            .as_deref()
            .is_some_and(|body| body == record_json(record).as_slice())
        {
            self.body = None;
        }
    }
}

/// A record's JSON, as rows carry it.
pub fn record_json(record: &Record) -> Vec<u8> {
    match record {
        Record::Host(h) => serde_json::to_vec(h),
        Record::Machine(m) => serde_json::to_vec(m),
        Record::App(a) => serde_json::to_vec(a),
        Record::Volume(v) => serde_json::to_vec(v),
        Record::Secret(x) => serde_json::to_vec(x),
        Record::Certificate(c) => serde_json::to_vec(c),
        Record::Challenge(c) => serde_json::to_vec(c),
        Record::Quota(q) => serde_json::to_vec(q),
    }
    .expect("records serialize to JSON")
}

/// What a row's signature covers: everything the merge rule and the queries read.
pub(crate) struct RowIdentity<'a> {
    pub owner: &'a str,
    pub kind: Kind,
    pub key: &'a str,
    pub version: u64,
    pub deleted: bool,
    pub updated_at_ms: u64,
}

impl RowIdentity<'_> {
    fn message(&self, body: &[u8]) -> Vec<u8> {
        let mut m = Vec::with_capacity(ROW_CONTEXT.len() + 64 + body.len());
        m.extend_from_slice(ROW_CONTEXT);
        for part in [self.owner.as_bytes(), self.key.as_bytes()] {
            m.extend_from_slice(&(part.len() as u32).to_be_bytes());
            m.extend_from_slice(part);
        }
        m.push(self.kind as u8);
        m.extend_from_slice(&self.version.to_be_bytes());
        m.push(self.deleted as u8);
        m.extend_from_slice(&self.updated_at_ms.to_be_bytes());
        m.extend_from_slice(body);
        m
    }
}

/// Seals a record of this host: its JSON, signed with the host's key.
pub(crate) fn seal(key: &SigningKey, id: &RowIdentity<'_>, record: &Record) -> Seal {
    Seal {
        public_key: key.verifying_key().to_bytes(),
        signature: key.sign(&id.message(&record_json(record))).to_bytes(),
        body: None,
    }
}

/// The hex form of a public key, as host rows publish it.
pub fn public_key_hex(key: &SigningKey) -> String {
    hex::encode(key.verifying_key().as_bytes())
}

/// An owner's digest entry signed by the owner: its rows in the same message are its
/// complete set.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SignedEntry {
    pub entry: DigestEntry,
    pub signature: Vec<u8>,
}

impl SignedEntry {
    pub(crate) fn sign(key: &SigningKey, entry: DigestEntry) -> Self {
        let signature = key.sign(&entry_message(&entry)).to_bytes().to_vec();
        SignedEntry { entry, signature }
    }
}

/// Checks a row's seal: signed by `pinned` (the key pinned for its owner) or, for an owner
/// not seen before, by the key the seal carries, which the caller then pins. A host row
/// must also name the key that signed it. Returns the key that signed.
pub(crate) fn verify_row(
    pinned: Option<VerifyingKey>,
    id: &RowIdentity<'_>,
    seal: &Seal,
    record: &Record,
) -> anyhow::Result<VerifyingKey> {
    let key = match pinned {
        Some(pinned) if pinned.as_bytes() == &seal.public_key => pinned,
        Some(_) => bail!(
            "row of {} signed with a key that is not the host's",
            id.owner
        ),
        None => VerifyingKey::from_bytes(&seal.public_key).context("bad public key")?,
    };
    key.verify_strict(
        &id.message(&seal.signed_body(record)),
        &Signature::from_bytes(&seal.signature),
    )
    .with_context(|| format!("bad signature on a row of {}", id.owner))?;
    if let Record::Host(h) = record {
        if h.public_key != hex::encode(seal.public_key) {
            bail!("host row of {} names another key", id.owner);
        }
    }
    Ok(key)
}

fn entry_message(e: &DigestEntry) -> Vec<u8> {
    let mut m = Vec::with_capacity(ENTRY_CONTEXT.len() + e.owner.len() + 28);
    m.extend_from_slice(ENTRY_CONTEXT);
    m.extend_from_slice(&(e.owner.len() as u32).to_be_bytes());
    m.extend_from_slice(e.owner.as_bytes());
    m.extend_from_slice(&e.max_version.to_be_bytes());
    m.extend_from_slice(&e.count.to_be_bytes());
    m.extend_from_slice(&e.hash.to_be_bytes());
    m
}

/// The key trusted for each host id: the first one seen (TOFU), this node's own from the
/// start.
#[derive(Debug, Default)]
pub(crate) struct KeyRing {
    pinned: HashMap<String, VerifyingKey>,
}

impl KeyRing {
    pub fn new(me: &str, key: &SigningKey) -> Self {
        KeyRing {
            pinned: HashMap::from([(me.to_owned(), key.verifying_key())]),
        }
    }

    /// The key pinned for a host id, if any.
    pub fn pinned(&self, owner: &str) -> Option<VerifyingKey> {
        self.pinned.get(owner).copied()
    }

    /// Pins `key` for `owner`, whatever was pinned before: the CA endorsed it.
    pub fn pin_endorsed(&mut self, owner: &str, key: VerifyingKey) {
        self.pinned.insert(owner.to_owned(), key);
    }

    /// Pins `key` for `owner` unless another key is pinned already; returns whether `key`
    /// is now the owner's key.
    pub fn pin(&mut self, owner: &str, key: VerifyingKey) -> bool {
        *self.pinned.entry(owner.to_owned()).or_insert(key) == key
    }

    /// Whether `signed` is the owner's signature on its digest entry (with the key pinned
    /// for it; an owner never seen has none).
    pub fn check_entry(&self, signed: &SignedEntry) -> bool {
        let Some(key) = self.pinned.get(&signed.entry.owner) else {
            return false;
        };
        let Ok(signature) = Signature::from_slice(&signed.signature) else {
            return false;
        };
        key.verify_strict(&entry_message(&signed.entry), &signature)
            .is_ok()
    }
}

/// What a node of a cluster with a CA checks with the CA certificate: endorsed row keys
/// and revocations.
#[derive(Debug)]
pub(crate) struct CaTrust {
    verifier: bazaar_pki::CaVerifier,
    revoked: std::sync::RwLock<std::collections::BTreeMap<String, bazaar_pki::Revocation>>,
}

impl CaTrust {
    pub fn new(ca_pem: &str, revocations: &[bazaar_pki::Revocation]) -> anyhow::Result<Self> {
        let trust = CaTrust {
            verifier: bazaar_pki::CaVerifier::new(ca_pem)?,
            revoked: Default::default(),
        };
        for r in revocations {
            trust.add_revocation(r)?;
        }
        Ok(trust)
    }

    /// Whether the CA endorsed the key that sealed a host row for its owner.
    pub fn endorses(&self, owner: &str, seal: &Seal, host: &crate::records::HostRecord) -> bool {
        self.verifier
            .check_row_key(owner, &seal.public_key, &host.key_endorsement)
    }

    pub fn is_revoked(&self, host_id: &str) -> bool {
        let revoked = self.revoked.read().unwrap_or_else(|e| e.into_inner());
        !revoked.is_empty() && revoked.contains_key(host_id)
    }

    /// Records a revocation signed by the CA; `Ok(true)` if it is new.
    pub fn add_revocation(&self, r: &bazaar_pki::Revocation) -> anyhow::Result<bool> {
        anyhow::ensure!(
            self.verifier.check_revocation(r),
            "a revocation of {} not signed by the cluster CA",
            r.host_id
        );
        let mut revoked = self.revoked.write().unwrap_or_else(|e| e.into_inner());
        Ok(revoked.insert(r.host_id.clone(), r.clone()).is_none())
    }

    pub fn revocations(&self) -> Vec<bazaar_pki::Revocation> {
        let revoked = self.revoked.read().unwrap_or_else(|e| e.into_inner());
        revoked.values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::{HostRecord, MachineRecord};

    fn key(n: u8) -> SigningKey {
        SigningKey::from_bytes(&[n; 32])
    }

    fn id(owner: &str, version: u64) -> RowIdentity<'_> {
        RowIdentity {
            owner,
            kind: Kind::Machine,
            key: "m1",
            version,
            deleted: false,
            updated_at_ms: 5,
        }
    }

    /// What a node does with an incoming row: verify, then pin.
    fn check(ring: &mut KeyRing, id: &RowIdentity<'_>, seal: &Seal, record: &Record) -> bool {
        match verify_row(ring.pinned(id.owner), id, seal, record) {
            Ok(key) => ring.pin(id.owner, key),
            Err(_) => false,
        }
    }

    #[test]
    fn first_key_wins_and_others_are_refused() {
        let record = Record::Machine(MachineRecord {
            id: "m1".into(),
            host_id: "h1".into(),
            ..Default::default()
        });
        let mut ring = KeyRing::new("me", &key(9));
        let real = seal(&key(1), &id("h1", 1), &record);
        assert!(check(&mut ring, &id("h1", 1), &real, &record));
        // Another key for the same host: refused, even though it signs correctly.
        let forged = seal(&key(2), &id("h1", 2), &record);
        assert!(!check(&mut ring, &id("h1", 2), &forged, &record));
        // The real key's seal does not cover another version or owner.
        assert!(!check(&mut ring, &id("h1", 2), &real, &record));
        // This node's own id is pinned to its own key from the start.
        let mine = seal(&key(3), &id("me", 1), &record);
        assert!(!check(&mut ring, &id("me", 1), &mine, &record));
    }

    #[test]
    fn host_rows_must_name_their_key() {
        let k = key(1);
        let mut host = HostRecord {
            id: "h1".into(),
            ..Default::default()
        };
        let hid = RowIdentity {
            owner: "h1",
            kind: Kind::Host,
            key: "h1",
            version: 1,
            deleted: false,
            updated_at_ms: 1,
        };
        let record = Record::Host(host.clone());
        let s = seal(&k, &hid, &record);
        assert!(!check(&mut KeyRing::default(), &hid, &s, &record));
        host.public_key = public_key_hex(&k);
        let record = Record::Host(host);
        let s = seal(&k, &hid, &record);
        assert!(check(&mut KeyRing::default(), &hid, &s, &record));
    }

    #[test]
    fn signed_entries_verify_only_with_the_owners_key() {
        let entry = DigestEntry {
            owner: "h1".into(),
            max_version: 7,
            count: 2,
            hash: 3,
        };
        let mut ring = KeyRing::default();
        let record = Record::Machine(MachineRecord {
            id: "m1".into(),
            host_id: "h1".into(),
            ..Default::default()
        });
        let s = seal(&key(1), &id("h1", 1), &record);
        assert!(check(&mut ring, &id("h1", 1), &s, &record));
        assert!(ring.check_entry(&SignedEntry::sign(&key(1), entry.clone())));
        assert!(!ring.check_entry(&SignedEntry::sign(&key(2), entry.clone())));
        let mut tampered = SignedEntry::sign(&key(1), entry);
        tampered.entry.count = 1;
        assert!(!ring.check_entry(&tampered));
    }
}
