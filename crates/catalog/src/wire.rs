//! What goes on the wire: the frame layout, its authentication with the cluster secret
//! (HMAC-SHA256, truncated tag), the replay guard of datagrams, and the messages frames and
//! datagrams carry. Rows inside
//! them carry their owner's signature besides (see [`crate::trust`]).
//!
//! Datagram (UDP): encrypted with the gossip keyring, see [`crate::keyring`]: the sender's
//! id and clock and a sequence number (per sender, increasing) are authenticated with it, and
//! its tag makes every datagram unique: a receiver refuses datagrams outside [`FRESHNESS`] of
//! its clock and those it has already seen ([`ReplayGuard`]). `kind` is [`DGRAM_SWIM`] (a
//! foca packet) or [`DGRAM_GOODBYE`] (a [`Goodbye`]).
//!
//! Frame (TCP, anti-entropy): a small header `len: u32 | sent_at_ms: u64 | sender_len: u8 |
//! sender | header_tag[16]` with header_tag = HMAC(secret, "bazaar-catalog/tcp/v2/header" |
//! the header before it), then `payload[len] | tag[16]` with tag = HMAC(secret,
//! "bazaar-catalog/tcp/v2/body" | header_tag | payload). The header is read and checked
//! (tag, `len` under the configured cap, `sent_at_ms` within [`FRESHNESS`]) before any
//! buffer for the payload exists, and the payload buffer then grows only as bytes arrive;
//! the payload is a postcard-encoded [`SyncMsg`].
//!
//! Records travel as JSON inside postcard ([`WireRow::body`]): the shared types use
//! `#[serde(flatten)]`, which only self-describing formats can read back.
//!
//! Anything that fails the tag or does not decode is dropped by the caller, never trusted.

use crate::records::{
    AppRecord, CertificateRecord, ChallengeRecord, HostRecord, MachineRecord, QuotaRecord,
    SecretRecord, VolumeRecord,
};
use crate::replica::{DigestEntry, Kind, Record, Row};
use crate::trust::{Seal, SignedEntry};
use anyhow::{bail, Context};
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use std::collections::{HashSet, VecDeque};
use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Bytes of the truncated HMAC tag.
pub const TAG_LEN: usize = 16;
/// A datagram carrying a foca (SWIM) packet.
pub const DGRAM_SWIM: u8 = 1;
/// A datagram announcing a clean shutdown.
pub const DGRAM_GOODBYE: u8 = 2;
/// The default cap on an anti-entropy frame's payload
/// ([`crate::CatalogConfig::max_frame`]).
pub const MAX_FRAME: usize = 64 * 1024 * 1024;
/// How far a datagram's or frame's clock may be from the receiver's (either way).
pub const FRESHNESS: std::time::Duration = std::time::Duration::from_secs(30);
/// Datagrams remembered for replay detection, at most.
const MAX_REMEMBERED: usize = 1 << 18;
/// The payload buffer of a frame starts this small and grows as the bytes arrive.
const FIRST_READ: usize = 64 * 1024;

const TCP_HEADER_CONTEXT: &[u8] = b"bazaar-catalog/tcp/v2/header";
const TCP_BODY_CONTEXT: &[u8] = b"bazaar-catalog/tcp/v2/body";

/// Signs and checks anti-entropy frames with the cluster secret.
#[derive(Clone)]
pub struct Authenticator {
    mac: Hmac<Sha256>,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Authenticator(..)")
    }
}

/// A datagram that one of the gossip keys opened ([`crate::keyring`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Datagram<'a> {
    pub kind: u8,
    pub sender: &'a str,
    pub sent_at_ms: u64,
    /// Unique per datagram (it covers `seq` and a random nonce): what the replay guard
    /// remembers.
    pub tag: [u8; TAG_LEN],
    /// The decrypted payload.
    pub payload: Vec<u8>,
}

/// A frame header that passed its tag, its cap and its clock check.
#[derive(Clone, Debug, PartialEq)]
pub struct FrameHeader {
    pub len: usize,
    pub sender: String,
    pub sent_at_ms: u64,
    tag: [u8; TAG_LEN],
}

fn is_fresh(sent_at_ms: u64, now_ms: u64) -> bool {
    sent_at_ms.abs_diff(now_ms) <= FRESHNESS.as_millis() as u64
}

impl Authenticator {
    pub fn new(secret: &str) -> Self {
        Authenticator {
            mac: Hmac::<Sha256>::new_from_slice(secret.as_bytes())
                .expect("HMAC accepts keys of any length"),
        }
    }

    fn tag(&self, context: &[u8], parts: &[&[u8]]) -> [u8; TAG_LEN] {
        let mut mac = self.mac.clone();
        mac.update(context);
        for p in parts {
            mac.update(p);
        }
        let full = mac.finalize().into_bytes();
        let mut tag = [0u8; TAG_LEN];
        tag.copy_from_slice(&full[..TAG_LEN]);
        tag
    }

    fn verify(&self, context: &[u8], parts: &[&[u8]], tag: &[u8]) -> bool {
        let mut mac = self.mac.clone();
        mac.update(context);
        for p in parts {
            mac.update(p);
        }
        mac.verify_truncated_left(tag).is_ok()
    }

    /// Writes one signed frame from `sender`.
    pub async fn write_frame<W: AsyncWriteExt + Unpin>(
        &self,
        w: &mut W,
        sender: &str,
        payload: &[u8],
    ) -> anyhow::Result<usize> {
        self.write_frame_at(w, sender, bazaar_types::now_ms(), payload)
            .await
    }

    /// [`Authenticator::write_frame`] with the sender's clock given.
    pub async fn write_frame_at<W: AsyncWriteExt + Unpin>(
        &self,
        w: &mut W,
        sender: &str,
        sent_at_ms: u64,
        payload: &[u8],
    ) -> anyhow::Result<usize> {
        let len = u32::try_from(payload.len()).context("frame too large")?;
        let sender_len = u8::try_from(sender.len()).context("sender id too long")?;
        let mut buf = Vec::with_capacity(payload.len() + 2 * TAG_LEN + 13 + sender.len());
        buf.extend_from_slice(&len.to_be_bytes());
        buf.extend_from_slice(&sent_at_ms.to_be_bytes());
        buf.push(sender_len);
        buf.extend_from_slice(sender.as_bytes());
        let header_tag = self.tag(TCP_HEADER_CONTEXT, &[&buf]);
        buf.extend_from_slice(&header_tag);
        buf.extend_from_slice(payload);
        buf.extend_from_slice(&self.tag(TCP_BODY_CONTEXT, &[&header_tag, payload]));
        w.write_all(&buf).await?;
        w.flush().await?;
        Ok(buf.len())
    }

    /// Reads and checks a frame header (a few hundred bytes at most, on the stack);
    /// `Ok(None)` on a clean end of stream. Refuses a payload above `max_frame`.
    pub async fn read_header<R: AsyncReadExt + Unpin>(
        &self,
        r: &mut R,
        max_frame: usize,
    ) -> anyhow::Result<Option<FrameHeader>> {
        let mut buf = [0u8; 13 + 255 + TAG_LEN];
        match r.read_exact(&mut buf[..13]).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e.into()),
        }
        let end = 13 + buf[12] as usize;
        r.read_exact(&mut buf[13..end + TAG_LEN])
            .await
            .context("reading a frame header")?;
        let (fields, tag) = (&buf[..end], &buf[end..end + TAG_LEN]);
        if !self.verify(TCP_HEADER_CONTEXT, &[fields], tag) {
            bail!("frame header failed authentication");
        }
        let len = u32::from_be_bytes(fields[..4].try_into().expect("4 bytes")) as usize;
        let sent_at_ms = u64::from_be_bytes(fields[4..12].try_into().expect("8 bytes"));
        if len > max_frame {
            bail!("frame of {len} bytes is over the {max_frame}-byte cap");
        }
        if !is_fresh(sent_at_ms, bazaar_types::now_ms()) {
            bail!("frame sent at {sent_at_ms} is not fresh");
        }
        Ok(Some(FrameHeader {
            len,
            sender: std::str::from_utf8(&fields[13..])
                .context("sender id is not UTF-8")?
                .to_owned(),
            sent_at_ms,
            tag: tag.try_into().expect("tag length"),
        }))
    }

    /// Reads and checks the payload that follows `header`.
    pub async fn read_body<R: AsyncReadExt + Unpin>(
        &self,
        r: &mut R,
        header: &FrameHeader,
    ) -> anyhow::Result<Vec<u8>> {
        let mut payload = Vec::with_capacity(header.len.min(FIRST_READ));
        let read = r
            .take(header.len as u64)
            .read_to_end(&mut payload)
            .await
            .context("reading a frame")?;
        let mut tag = [0u8; TAG_LEN];
        if read < header.len {
            bail!("frame cut short");
        }
        r.read_exact(&mut tag).await.context("reading a frame")?;
        if !self.verify(TCP_BODY_CONTEXT, &[&header.tag, &payload], &tag) {
            bail!("frame failed authentication");
        }
        Ok(payload)
    }

    /// Reads one whole frame; `Ok(None)` on a clean end of stream.
    pub async fn read_frame<R: AsyncReadExt + Unpin>(
        &self,
        r: &mut R,
        max_frame: usize,
    ) -> anyhow::Result<Option<(FrameHeader, Vec<u8>)>> {
        let Some(header) = self.read_header(r, max_frame).await? else {
            return Ok(None);
        };
        let payload = self.read_body(r, &header).await?;
        Ok(Some((header, payload)))
    }
}

/// Why a datagram with a good tag was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Its clock is more than [`FRESHNESS`] from ours.
    Stale,
    /// Seen before.
    Replayed,
}

/// Remembers the datagrams accepted within the freshness window, to refuse replays. Bounded:
/// when full it forgets the oldest and from then on refuses anything not newer than what
/// it forgot, so it never accepts a datagram twice.
#[derive(Debug, Default)]
pub struct ReplayGuard {
    seen: HashSet<[u8; TAG_LEN]>,
    /// (sent_at_ms, tag) in arrival order; sent times are close to arrival order, and an
    /// entry leaves once its time is out of the window.
    order: VecDeque<(u64, [u8; TAG_LEN])>,
    /// Datagrams sent at or before this are refused (the guard forgot some of that age).
    floor_ms: u64,
}

impl ReplayGuard {
    /// Accepts a datagram once, if it is fresh.
    pub fn admit(&mut self, d: &Datagram<'_>, now_ms: u64) -> Result<(), Refusal> {
        let window = FRESHNESS.as_millis() as u64;
        while let Some(&(at, tag)) = self.order.front() {
            if at.saturating_add(window) >= now_ms {
                break;
            }
            self.order.pop_front();
            self.seen.remove(&tag);
        }
        if !is_fresh(d.sent_at_ms, now_ms) || d.sent_at_ms <= self.floor_ms {
            return Err(Refusal::Stale);
        }
        if !self.seen.insert(d.tag) {
            return Err(Refusal::Replayed);
        }
        self.order.push_back((d.sent_at_ms, d.tag));
        if self.order.len() > MAX_REMEMBERED {
            let (at, tag) = self.order.pop_front().expect("non-empty");
            self.seen.remove(&tag);
            self.floor_ms = self.floor_ms.max(at);
        }
        Ok(())
    }
}

/// The catalog row format this build reads and writes: a row body's JSON says its format in
/// `format` (none: format 1, every row before formats were numbered). A node drops a row
/// of a newer format, saying to upgrade it ([`NewerRowFormat`]), rather than misread it.
/// Raised only by a change an older agent would misread (a field whose absence or
/// meaning it would get wrong); docs/INSTALL.md ("Upgrades") has the side-by-side rule.
pub const ROW_FORMAT: u32 = 1;

/// A row in a catalog format newer than [`ROW_FORMAT`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewerRowFormat {
    pub found: u32,
}

impl std::fmt::Display for NewerRowFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "a catalog row in format {}, newer than this agent's {ROW_FORMAT} (bazaar {}): \
             upgrade this agent (docs/INSTALL.md, \"Upgrades\")",
            self.found,
            env!("CARGO_PKG_VERSION")
        )
    }
}

impl std::error::Error for NewerRowFormat {}

/// Refuses a row body of a newer format than this build's.
pub fn check_row_format(body: &[u8]) -> anyhow::Result<()> {
    #[derive(Deserialize)]
    struct Format {
        #[serde(default)]
        format: Option<u32>,
    }
    let found = serde_json::from_slice::<Format>(body)?.format.unwrap_or(1);
    if found > ROW_FORMAT {
        return Err(NewerRowFormat { found }.into());
    }
    Ok(())
}

/// A row as it travels: the record is JSON in `body`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WireRow {
    pub owner: String,
    pub kind: Kind,
    pub key: String,
    pub version: u64,
    pub deleted: bool,
    pub updated_at_ms: u64,
    /// The record's JSON as the owner signed it.
    pub body: Vec<u8>,
    /// The signer's public key and signature ([`Seal`]).
    pub public_key: [u8; 32],
    pub signature: Vec<u8>,
}

impl WireRow {
    pub fn from_row(row: &Row) -> Self {
        WireRow {
            owner: row.owner.clone(),
            kind: row.kind(),
            key: row.key().to_owned(),
            version: row.version,
            deleted: row.deleted,
            updated_at_ms: row.updated_at_ms,
            body: row.seal.signed_body(&row.record).into_owned(),
            public_key: row.seal.public_key,
            signature: row.seal.signature.to_vec(),
        }
    }

    /// Decodes the record and checks that it is consistent with the row's key and owner.
    /// The seal is carried over unchecked: see `crate::trust::verify_row`.
    pub fn into_row(self) -> anyhow::Result<Row> {
        check_row_format(&self.body)?;
        let record = match self.kind {
            Kind::Host => {
                let h: HostRecord = serde_json::from_slice(&self.body)?;
                if h.id != self.owner {
                    bail!("host row of {} published by {}", h.id, self.owner);
                }
                Record::Host(h)
            }
            Kind::Machine => {
                let m: MachineRecord = serde_json::from_slice(&self.body)?;
                if m.host_id != self.owner {
                    bail!("machine of host {} published by {}", m.host_id, self.owner);
                }
                Record::Machine(m)
            }
            Kind::App => {
                let a: AppRecord = serde_json::from_slice(&self.body)?;
                if a.created_by_host != self.owner {
                    bail!(
                        "app of host {} published by {}",
                        a.created_by_host,
                        self.owner
                    );
                }
                Record::App(a)
            }
            Kind::Volume => {
                let v: VolumeRecord = serde_json::from_slice(&self.body)?;
                if v.host_id != self.owner {
                    bail!("volume of host {} published by {}", v.host_id, self.owner);
                }
                Record::Volume(v)
            }
            Kind::Secret => {
                let x: SecretRecord = serde_json::from_slice(&self.body)?;
                if x.set_by_host != self.owner {
                    bail!(
                        "secret of host {} published by {}",
                        x.set_by_host,
                        self.owner
                    );
                }
                if x.id != SecretRecord::key_of(&x.app, &x.name) {
                    bail!("secret row {} does not name its app and secret", x.id);
                }
                Record::Secret(x)
            }
            Kind::Quota => {
                let q: QuotaRecord = serde_json::from_slice(&self.body)?;
                if q.set_by_host != self.owner {
                    bail!(
                        "quota of host {} published by {}",
                        q.set_by_host,
                        self.owner
                    );
                }
                if q.id != QuotaRecord::key_of(&q.scope) {
                    bail!("quota row {} does not name its scope", q.id);
                }
                Record::Quota(q)
            }
            Kind::Certificate => {
                let c: CertificateRecord = serde_json::from_slice(&self.body)?;
                if c.host_id != self.owner {
                    bail!(
                        "certificate of host {} published by {}",
                        c.host_id,
                        self.owner
                    );
                }
                Record::Certificate(c)
            }
            Kind::Challenge => {
                let c: ChallengeRecord = serde_json::from_slice(&self.body)?;
                if c.host_id != self.owner {
                    bail!(
                        "challenge of host {} published by {}",
                        c.host_id,
                        self.owner
                    );
                }
                Record::Challenge(c)
            }
        };
        if record.key() != self.key {
            bail!("row key {} does not match its record", self.key);
        }
        let signature: [u8; 64] = self
            .signature
            .as_slice()
            .try_into()
            .context("bad signature length")?;
        Ok(Row {
            owner: self.owner,
            version: self.version,
            deleted: self.deleted,
            updated_at_ms: self.updated_at_ms,
            record,
            seal: Seal {
                public_key: self.public_key,
                signature,
                body: Some(self.body.into()),
            },
        })
    }
}

/// A custom foca broadcast: a fresh row, or, when the row does not fit in a packet, a hint
/// that makes receivers pull the owner's rows over TCP, or a host revoked by the CA.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum BroadcastItem {
    Row(WireRow),
    Hint {
        owner: String,
        kind: Kind,
        key: String,
        version: u64,
    },
    Revocation(bazaar_pki::Revocation),
}

impl BroadcastItem {
    /// The (owner, kind, key, version) the item is about; a revocation is about its host,
    /// under a key no row has (empty) and the highest version.
    pub fn ident(&self) -> (&str, Kind, &str, u64) {
        match self {
            BroadcastItem::Row(r) => (&r.owner, r.kind, &r.key, r.version),
            BroadcastItem::Hint {
                owner,
                kind,
                key,
                version,
            } => (owner, *kind, key, *version),
            BroadcastItem::Revocation(r) => (&r.host_id, Kind::Host, "", u64::MAX),
        }
    }
}

/// A clean shutdown, sent straight to every known member.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Goodbye {
    pub node_id: String,
    /// The identity's bump (see [`crate::membership::NodeIdentity`]) that is leaving.
    pub bump: u64,
}

/// The anti-entropy exchange. The initiator sends a `Request` with its digest; the peer
/// answers with the rows the initiator lacks of every owner whose digest entry differs,
/// and its own entries for those owners; the initiator then sends a `Push` with what the
/// peer lacks. See [`crate::sync`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum SyncMsg {
    Request {
        from: String,
        from_addr: SocketAddr,
        digest: Vec<DigestEntry>,
        /// The hosts the CA revoked that the initiator knows of (few; empty without a CA).
        revocations: Vec<bazaar_pki::Revocation>,
    },
    Response {
        from: String,
        rows: Vec<WireRow>,
        /// The responder's entries for the owners where the digests differ.
        want: Vec<DigestEntry>,
        /// Set when the responder has merged a sync since it started and sends its own
        /// rows: its signed digest entry, saying those rows are its complete set (see
        /// [`crate::replica::Replica::apply_authoritative`]).
        complete: Option<SignedEntry>,
        /// The responder's revocations.
        revocations: Vec<bazaar_pki::Revocation>,
    },
    Push {
        rows: Vec<WireRow>,
        /// The initiator's signed entry when `rows` holds its own rows.
        complete: Option<SignedEntry>,
    },
}

pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    postcard::to_stdvec(value).expect("postcard encodes our types")
}

pub fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> anyhow::Result<T> {
    Ok(postcard::from_bytes(bytes)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyring::{datagram_overhead, derived_key, Keyring};

    #[test]
    fn datagrams_round_trip_and_reject_tampering() {
        let ring = Keyring::new(&[[1; 32]]).unwrap();
        let d = ring.seal_datagram(DGRAM_SWIM, "h1", 1_000, 7, b"hello");
        assert_eq!(d.len(), 5 + datagram_overhead("h1"));
        assert!(
            !d.windows(5).any(|w| w == b"hello"),
            "the payload is encrypted"
        );
        let open = ring.open_datagram(&d).unwrap();
        assert_eq!(
            (open.kind, open.sender, open.sent_at_ms, &open.payload[..]),
            (DGRAM_SWIM, "h1", 1_000, &b"hello"[..])
        );
        for i in 0..d.len() {
            let mut bad = d.clone();
            bad[i] ^= 1;
            assert_eq!(ring.open_datagram(&bad), None, "flipped byte {i}");
        }
        assert_eq!(Keyring::new(&[[2; 32]]).unwrap().open_datagram(&d), None);
        assert_eq!(ring.open_datagram(&[1, 2, 3]), None);
        assert_eq!(ring.open_datagram(&[]), None);
    }

    #[test]
    fn the_first_key_encrypts_and_every_key_decrypts() {
        let (old, new) = ([1; 32], [2; 32]);
        let mut ring = Keyring::new(&[old]).unwrap();
        let only_old = Keyring::new(&[old]).unwrap();
        let only_new = Keyring::new(&[new]).unwrap();
        ring.install(new);
        let d = ring.seal_datagram(DGRAM_SWIM, "h1", 1, 1, b"x");
        assert!(only_old.open_datagram(&d).is_some());
        assert!(ring
            .open_datagram(&only_new.seal_datagram(DGRAM_SWIM, "h2", 1, 1, b"x"))
            .is_some());
        assert!(ring.remove(old).is_err(), "the key in use stays");
        ring.use_key(new).unwrap();
        let d = ring.seal_datagram(DGRAM_SWIM, "h1", 1, 2, b"x");
        assert!(only_new.open_datagram(&d).is_some());
        assert!(only_old.open_datagram(&d).is_none());
        ring.remove(old).unwrap();
        assert_eq!(ring.keys(), vec![hex::encode(new)]);
        assert!(ring.use_key(old).is_err(), "not installed");
        assert_eq!(derived_key("s"), derived_key("s"));
        assert_ne!(derived_key("s"), derived_key("t"));
    }

    #[test]
    fn the_replay_guard_admits_each_fresh_datagram_once() {
        let a = Keyring::new(&[[1; 32]]).unwrap();
        let now = 1_000_000;
        let mut guard = ReplayGuard::default();
        let d1 = a.seal_datagram(DGRAM_SWIM, "h1", now, 1, b"x");
        let d2 = a.seal_datagram(DGRAM_SWIM, "h1", now, 2, b"x");
        let d1 = a.open_datagram(&d1).unwrap();
        assert_eq!(guard.admit(&d1, now), Ok(()));
        assert_eq!(guard.admit(&d1, now + 5), Err(Refusal::Replayed));
        assert_eq!(guard.admit(&a.open_datagram(&d2).unwrap(), now), Ok(()));
        let old = a.seal_datagram(DGRAM_SWIM, "h1", now - 31_000, 3, b"x");
        let early = a.seal_datagram(DGRAM_SWIM, "h1", now + 31_000, 4, b"x");
        for d in [old, early] {
            assert_eq!(
                guard.admit(&a.open_datagram(&d).unwrap(), now),
                Err(Refusal::Stale)
            );
        }
        // Past the window the guard forgets, and the datagram is refused as stale.
        assert_eq!(guard.admit(&d1, now + 61_000), Err(Refusal::Stale));
        assert!(guard.seen.is_empty());
    }

    #[tokio::test]
    async fn frames_round_trip_and_reject_garbage() {
        let a = Authenticator::new("secret");
        let mut buf = Vec::new();
        a.write_frame(&mut buf, "h1", b"payload").await.unwrap();
        let mut r = &buf[..];
        let (header, payload) = a.read_frame(&mut r, MAX_FRAME).await.unwrap().unwrap();
        assert_eq!(
            (header.sender.as_str(), &payload[..]),
            ("h1", &b"payload"[..])
        );
        assert!(a.read_frame(&mut r, MAX_FRAME).await.unwrap().is_none());
        let mut r = &buf[..];
        assert!(Authenticator::new("x")
            .read_frame(&mut r, MAX_FRAME)
            .await
            .is_err());
        for i in 0..buf.len() {
            let mut bad = buf.clone();
            bad[i] ^= 1;
            assert!(
                a.read_frame(&mut &bad[..], MAX_FRAME).await.is_err(),
                "byte {i}"
            );
        }
        // Over the cap, or from a clock too far away: refused from the header alone.
        assert!(a.read_frame(&mut &buf[..], 6).await.is_err());
        let mut old = Vec::new();
        a.write_frame_at(&mut old, "h1", bazaar_types::now_ms() - 60_000, b"payload")
            .await
            .unwrap();
        assert!(a.read_frame(&mut &old[..], MAX_FRAME).await.is_err());
    }

    #[tokio::test]
    async fn a_huge_announced_frame_allocates_only_what_arrives() {
        let a = Authenticator::new("secret");
        let mut buf = Vec::new();
        a.write_frame(&mut buf, "h1", &[7u8; 100]).await.unwrap();
        // Announce 60 MiB (under the cap) and re-sign the header, then cut the stream.
        let announced = 60 * 1024 * 1024u32;
        let mut header = Vec::new();
        header.extend_from_slice(&announced.to_be_bytes());
        header.extend_from_slice(&buf[4..15]);
        let tag = a.tag(TCP_HEADER_CONTEXT, &[&header]);
        header.extend_from_slice(&tag);
        header.extend_from_slice(&[0u8; 1000]);
        let mut r = &header[..];
        let h = a.read_header(&mut r, MAX_FRAME).await.unwrap().unwrap();
        assert_eq!(h.len, announced as usize);
        let mut payload = Vec::with_capacity(h.len.min(FIRST_READ));
        (&mut r)
            .take(h.len as u64)
            .read_to_end(&mut payload)
            .await
            .unwrap();
        assert!(payload.capacity() <= FIRST_READ, "{}", payload.capacity());
        assert!(a.read_body(&mut &header[31..], &h).await.is_err());
    }

    #[test]
    fn wire_rows_check_their_owner() {
        let row = Row {
            owner: "h1".into(),
            version: 3,
            deleted: false,
            updated_at_ms: 1,
            record: Record::Machine(MachineRecord {
                id: "m".into(),
                host_id: "h1".into(),
                ..Default::default()
            }),
            seal: Seal::default(),
        };
        let wire = WireRow::from_row(&row);
        let back = decode::<WireRow>(&encode(&wire)).unwrap();
        let mut received = back.clone().into_row().unwrap();
        assert!(received.seal.body.is_some(), "kept until checked");
        received.seal.compact(&received.record);
        assert_eq!(received, row);
        let mut forged = back;
        forged.owner = "h2".into();
        assert!(forged.into_row().is_err());
        let app = AppRecord {
            name: "web".into(),
            created_by_host: "h1".into(),
            ..Default::default()
        };
        let mut wire = WireRow {
            owner: "h2".into(),
            kind: Kind::App,
            key: "web".into(),
            body: serde_json::to_vec(&app).unwrap(),
            signature: vec![0; 64],
            ..wire
        };
        assert!(
            wire.clone().into_row().is_err(),
            "app rows name their owner"
        );
        wire.owner = "h1".into();
        wire.into_row().unwrap();
    }

    #[test]
    fn a_row_of_a_newer_format_is_refused_saying_to_upgrade() {
        let m = MachineRecord {
            id: "m".into(),
            host_id: "h1".into(),
            ..Default::default()
        };
        let mut body = serde_json::to_value(&m).unwrap();
        let wire = |body: &serde_json::Value| WireRow {
            owner: "h1".into(),
            kind: Kind::Machine,
            key: "m".into(),
            version: 1,
            deleted: false,
            updated_at_ms: 1,
            body: serde_json::to_vec(body).unwrap(),
            public_key: [0; 32],
            signature: vec![0; 64],
        };
        // Today's rows say no format: format 1.
        wire(&body).into_row().unwrap();
        body["format"] = ROW_FORMAT.into();
        wire(&body).into_row().unwrap();
        body["format"] = (ROW_FORMAT + 1).into();
        let err = wire(&body).into_row().unwrap_err();
        assert_eq!(
            err.downcast_ref::<NewerRowFormat>(),
            Some(&NewerRowFormat {
                found: ROW_FORMAT + 1
            })
        );
        let text = err.to_string();
        assert!(text.contains("upgrade this agent"), "{text}");
    }
}
