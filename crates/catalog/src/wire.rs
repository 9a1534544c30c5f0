//! What goes on the wire: the datagram and frame layouts, their authentication with the
//! cluster secret (HMAC-SHA256, truncated tag), and the messages they carry.
//!
//! Datagram (UDP): `kind: u8 | payload | tag[16]`, where the tag is
//! HMAC(secret, "bazaar-catalog/udp/v1" | kind | payload). `kind` is [`DGRAM_SWIM`] (a foca
//! packet) or [`DGRAM_GOODBYE`] (a [`Goodbye`]).
//!
//! Frame (TCP, anti-entropy): `len: u32 (big endian) | payload | tag[16]`, `len` counting
//! payload and tag, tag = HMAC(secret, "bazaar-catalog/tcp/v1" | payload); the payload is a
//! postcard-encoded [`SyncMsg`].
//!
//! Records travel as JSON inside postcard ([`WireRow::body`]): the shared types use
//! `#[serde(flatten)]`, which only self-describing formats can read back.
//!
//! Anything that fails the tag or does not decode is dropped by the caller, never trusted.

use crate::records::{AppRecord, HostRecord, MachineRecord, VolumeRecord};
use crate::replica::{DigestEntry, Kind, Record, Row};
use anyhow::{bail, Context};
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Bytes of the truncated HMAC tag.
pub const TAG_LEN: usize = 16;
/// A datagram carrying a foca (SWIM) packet.
pub const DGRAM_SWIM: u8 = 1;
/// A datagram announcing a clean shutdown.
pub const DGRAM_GOODBYE: u8 = 2;
/// Bytes a datagram adds around its payload.
pub const DGRAM_OVERHEAD: usize = 1 + TAG_LEN;
/// The largest anti-entropy frame accepted (a whole replica of a large cluster fits).
pub const MAX_FRAME: usize = 256 * 1024 * 1024;

const UDP_CONTEXT: &[u8] = b"bazaar-catalog/udp/v1";
const TCP_CONTEXT: &[u8] = b"bazaar-catalog/tcp/v1";

/// Signs and checks datagrams and frames with the cluster secret.
#[derive(Clone)]
pub struct Authenticator {
    mac: Hmac<Sha256>,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Authenticator(..)")
    }
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

    /// Builds a signed datagram.
    pub fn seal_datagram(&self, kind: u8, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(payload.len() + DGRAM_OVERHEAD);
        out.push(kind);
        out.extend_from_slice(payload);
        let tag = self.tag(UDP_CONTEXT, &[&out]);
        out.extend_from_slice(&tag);
        out
    }

    /// Checks a datagram; returns its kind and payload, or `None` if it is not ours.
    pub fn open_datagram<'a>(&self, data: &'a [u8]) -> Option<(u8, &'a [u8])> {
        if data.len() < DGRAM_OVERHEAD {
            return None;
        }
        let (body, tag) = data.split_at(data.len() - TAG_LEN);
        if !self.verify(UDP_CONTEXT, &[body], tag) {
            return None;
        }
        Some((body[0], &body[1..]))
    }

    /// Writes one signed frame.
    pub async fn write_frame<W: AsyncWriteExt + Unpin>(
        &self,
        w: &mut W,
        payload: &[u8],
    ) -> anyhow::Result<usize> {
        let len = payload.len() + TAG_LEN;
        if len > MAX_FRAME {
            bail!("frame of {len} bytes is too large");
        }
        let tag = self.tag(TCP_CONTEXT, &[payload]);
        let mut buf = Vec::with_capacity(4 + len);
        buf.extend_from_slice(&(len as u32).to_be_bytes());
        buf.extend_from_slice(payload);
        buf.extend_from_slice(&tag);
        w.write_all(&buf).await?;
        w.flush().await?;
        Ok(buf.len())
    }

    /// Reads one frame and checks it; `Ok(None)` on a clean end of stream.
    pub async fn read_frame<R: AsyncReadExt + Unpin>(
        &self,
        r: &mut R,
    ) -> anyhow::Result<Option<Vec<u8>>> {
        let mut len = [0u8; 4];
        match r.read_exact(&mut len).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e.into()),
        }
        let len = u32::from_be_bytes(len) as usize;
        if !(TAG_LEN..=MAX_FRAME).contains(&len) {
            bail!("bad frame length {len}");
        }
        let mut buf = vec![0u8; len];
        r.read_exact(&mut buf).await.context("reading frame")?;
        let tag = buf.split_off(len - TAG_LEN);
        if !self.verify(TCP_CONTEXT, &[&buf], &tag) {
            bail!("frame failed authentication");
        }
        Ok(Some(buf))
    }
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
    pub body: Vec<u8>,
}

impl WireRow {
    pub fn from_row(row: &Row) -> Self {
        let body = match &row.record {
            Record::Host(h) => serde_json::to_vec(h),
            Record::Machine(m) => serde_json::to_vec(m),
            Record::App(a) => serde_json::to_vec(a),
            Record::Volume(v) => serde_json::to_vec(v),
        }
        .expect("records serialize to JSON");
        WireRow {
            owner: row.owner.clone(),
            kind: row.kind(),
            key: row.key().to_owned(),
            version: row.version,
            deleted: row.deleted,
            updated_at_ms: row.updated_at_ms,
            body,
        }
    }

    /// Decodes the record and checks that it is consistent with the row's key and owner.
    pub fn into_row(self) -> anyhow::Result<Row> {
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
            Kind::App => Record::App(serde_json::from_slice::<AppRecord>(&self.body)?),
            Kind::Volume => {
                let v: VolumeRecord = serde_json::from_slice(&self.body)?;
                if v.host_id != self.owner {
                    bail!("volume of host {} published by {}", v.host_id, self.owner);
                }
                Record::Volume(v)
            }
        };
        if record.key() != self.key {
            bail!("row key {} does not match its record", self.key);
        }
        Ok(Row {
            owner: self.owner,
            version: self.version,
            deleted: self.deleted,
            updated_at_ms: self.updated_at_ms,
            record,
        })
    }
}

/// A custom foca broadcast: a fresh row, or, when the row does not fit in a packet, a hint
/// that makes receivers pull the owner's rows over TCP.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum BroadcastItem {
    Row(WireRow),
    Hint {
        owner: String,
        kind: Kind,
        key: String,
        version: u64,
    },
}

impl BroadcastItem {
    /// The (owner, kind, key, version) the item is about.
    pub fn ident(&self) -> (&str, Kind, &str, u64) {
        match self {
            BroadcastItem::Row(r) => (&r.owner, r.kind, &r.key, r.version),
            BroadcastItem::Hint {
                owner,
                kind,
                key,
                version,
            } => (owner, *kind, key, *version),
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
    },
    Response {
        from: String,
        rows: Vec<WireRow>,
        /// The responder's entries for the owners where the digests differ.
        want: Vec<DigestEntry>,
        /// The responder has merged a sync since it started, so its own rows in `rows`
        /// are its complete set (see [`crate::replica::Replica::apply_authoritative`]).
        authoritative: bool,
    },
    Push {
        rows: Vec<WireRow>,
        authoritative: bool,
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

    #[test]
    fn datagrams_round_trip_and_reject_tampering() {
        let a = Authenticator::new("secret");
        let d = a.seal_datagram(DGRAM_SWIM, b"hello");
        assert_eq!(a.open_datagram(&d), Some((DGRAM_SWIM, &b"hello"[..])));
        let mut bad = d.clone();
        bad[2] ^= 1;
        assert_eq!(a.open_datagram(&bad), None);
        assert_eq!(Authenticator::new("other").open_datagram(&d), None);
        assert_eq!(a.open_datagram(&[1, 2, 3]), None);
        assert_eq!(a.open_datagram(&[]), None);
    }

    #[tokio::test]
    async fn frames_round_trip_and_reject_garbage() {
        let a = Authenticator::new("secret");
        let mut buf = Vec::new();
        a.write_frame(&mut buf, b"payload").await.unwrap();
        let mut r = &buf[..];
        assert_eq!(a.read_frame(&mut r).await.unwrap().unwrap(), b"payload");
        assert!(a.read_frame(&mut r).await.unwrap().is_none());
        let mut r = &buf[..];
        assert!(Authenticator::new("x").read_frame(&mut r).await.is_err());
        let huge = [0xffu8, 0xff, 0xff, 0xff, 0];
        assert!(a.read_frame(&mut &huge[..]).await.is_err());
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
        };
        let wire = WireRow::from_row(&row);
        let back = decode::<WireRow>(&encode(&wire)).unwrap();
        assert_eq!(back.clone().into_row().unwrap(), row);
        let mut forged = back;
        forged.owner = "h2".into();
        assert!(forged.into_row().is_err());
    }
}
