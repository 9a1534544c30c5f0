//! The gossip keyring: datagrams are encrypted and authenticated with ChaCha20-Poly1305
//! (ring's AEAD), as memberlist and Serf do with AES-GCM. The first key encrypts, every key
//! decrypts, so a key rotates without a moment where two hosts cannot hear each other:
//! install the new key everywhere, then use it everywhere, then remove the old one.
//! Without keys given, the ring holds one key derived from the cluster secret (HKDF), so a
//! cluster needs no new setting.
//!
//! Datagram (UDP): `kind: u8 | sender_len: u8 | sender | sent_at_ms: u64 | seq: u64 |
//! nonce[12] | ciphertext | tag[16]`. The header before the nonce is the associated data
//! (with the context `bazaar-catalog/udp/v3`): the sender's id, clock and sequence number
//! cannot be changed, and the tag makes every datagram unique, which is what the replay
//! guard ([`crate::wire::ReplayGuard`]) remembers. Nonces are random (96 bits): a host
//! restarted with the same key does not reuse a counter.

use crate::wire::Datagram;
use anyhow::{bail, Context};
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};

/// Bytes of the AEAD tag.
pub const TAG_LEN: usize = 16;
/// Bytes of a gossip key.
pub const KEY_LEN: usize = 32;
const CONTEXT: &[u8] = b"bazaar-catalog/udp/v3";
const DERIVE_INFO: &[u8] = b"bazaar-catalog/gossip-key/v1";

/// Bytes a datagram of `sender` adds around its payload.
pub fn datagram_overhead(sender: &str) -> usize {
    1 + 1 + sender.len() + 8 + 8 + NONCE_LEN + TAG_LEN
}

/// A gossip key as operators see it: 64 hex characters.
pub fn parse_key(text: &str) -> anyhow::Result<[u8; KEY_LEN]> {
    let bytes = hex::decode(text.trim()).context("a gossip key is 64 hex characters")?;
    bytes
        .try_into()
        .map_err(|_| anyhow::anyhow!("a gossip key is 32 bytes (64 hex characters)"))
}

/// A new random gossip key, hex.
pub fn generate_key() -> String {
    let mut key = [0u8; KEY_LEN];
    SystemRandom::new()
        .fill(&mut key)
        .expect("the system random source works");
    hex::encode(key)
}

/// The key a cluster uses when no keyring is given: derived from the cluster secret.
pub fn derived_key(cluster_secret: &str) -> [u8; KEY_LEN] {
    struct Len;
    impl ring::hkdf::KeyType for Len {
        fn len(&self) -> usize {
            KEY_LEN
        }
    }
    let salt = ring::hkdf::Salt::new(ring::hkdf::HKDF_SHA256, b"bazaar-catalog");
    let mut key = [0u8; KEY_LEN];
    salt.extract(cluster_secret.as_bytes())
        .expand(&[DERIVE_INFO], Len)
        .and_then(|okm| okm.fill(&mut key))
        .expect("HKDF output of 32 bytes");
    key
}

/// The keys a node encrypts with (the first) and decrypts with (all of them).
pub struct Keyring {
    keys: Vec<([u8; KEY_LEN], LessSafeKey)>,
    rng: SystemRandom,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Keyring({} keys)", self.keys.len())
    }
}

fn cipher(key: &[u8; KEY_LEN]) -> LessSafeKey {
    LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, key).expect("a 32-byte key"))
}

impl Keyring {
    /// A ring of `keys`, the first one primary. Refuses an empty list.
    pub fn new(keys: &[[u8; KEY_LEN]]) -> anyhow::Result<Self> {
        anyhow::ensure!(!keys.is_empty(), "a gossip keyring needs at least one key");
        let mut ring = Keyring {
            keys: Vec::new(),
            rng: SystemRandom::new(),
        };
        for key in keys {
            ring.install(*key);
        }
        Ok(ring)
    }

    /// Every key, hex, the primary first.
    pub fn keys(&self) -> Vec<String> {
        self.keys.iter().map(|(k, _)| hex::encode(k)).collect()
    }

    /// Adds a key that decrypts (a no-op if it is there already).
    pub fn install(&mut self, key: [u8; KEY_LEN]) {
        if !self.keys.iter().any(|(k, _)| *k == key) {
            self.keys.push((key, cipher(&key)));
        }
    }

    /// Makes an installed key the one that encrypts.
    pub fn use_key(&mut self, key: [u8; KEY_LEN]) -> anyhow::Result<()> {
        let Some(at) = self.keys.iter().position(|(k, _)| *k == key) else {
            bail!("that gossip key is not installed: install it on every host first");
        };
        let entry = self.keys.remove(at);
        self.keys.insert(0, entry);
        Ok(())
    }

    /// Removes a key; the one in use cannot be removed.
    pub fn remove(&mut self, key: [u8; KEY_LEN]) -> anyhow::Result<()> {
        match self.keys.iter().position(|(k, _)| *k == key) {
            Some(0) => bail!("that gossip key is in use: use another key first"),
            Some(at) => {
                self.keys.remove(at);
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// Encrypts a datagram from `sender` (at most 255 bytes, see
    /// [`crate::CatalogConfig::validate`]) with the primary key.
    pub fn seal_datagram(
        &self,
        kind: u8,
        sender: &str,
        sent_at_ms: u64,
        seq: u64,
        payload: &[u8],
    ) -> Vec<u8> {
        let mut out = Vec::with_capacity(payload.len() + datagram_overhead(sender));
        out.push(kind);
        out.push(sender.len() as u8);
        out.extend_from_slice(sender.as_bytes());
        out.extend_from_slice(&sent_at_ms.to_be_bytes());
        out.extend_from_slice(&seq.to_be_bytes());
        let header_len = out.len();
        let mut nonce = [0u8; NONCE_LEN];
        self.rng
            .fill(&mut nonce)
            .expect("the system random source works");
        out.extend_from_slice(&nonce);
        out.extend_from_slice(payload);
        let aad = aad(&out[..header_len]);
        let body = &mut out[header_len + NONCE_LEN..];
        let tag = self.keys[0]
            .1
            .seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), Aad::from(&aad), body)
            .expect("payloads are far below ChaCha20-Poly1305's limit");
        out.extend_from_slice(tag.as_ref());
        out
    }

    /// Decrypts and checks a datagram with any key of the ring; `None` if no key opens it
    /// or its layout is wrong. Freshness and replays are the replay guard's business.
    pub fn open_datagram<'a>(&self, data: &'a [u8]) -> Option<Datagram<'a>> {
        if data.len() < datagram_overhead("") {
            return None;
        }
        let header_len = 2 + data[1] as usize + 16;
        if data.len() < header_len + NONCE_LEN + TAG_LEN {
            return None;
        }
        let (head, rest) = data.split_at(header_len);
        let (nonce, sealed) = rest.split_at(NONCE_LEN);
        let nonce: [u8; NONCE_LEN] = nonce.try_into().ok()?;
        let aad = aad(head);
        // A failed open leaves its buffer unspecified: each key opens a copy.
        let payload = self.keys.iter().find_map(|(_, key)| {
            let mut buf = sealed.to_vec();
            let plain = key
                .open_in_place(
                    Nonce::assume_unique_for_key(nonce),
                    Aad::from(&aad),
                    &mut buf,
                )
                .ok()?
                .len();
            buf.truncate(plain);
            Some(buf)
        })?;
        let sender_len = head[1] as usize;
        let sender = std::str::from_utf8(&head[2..2 + sender_len]).ok()?;
        let sent_at_ms =
            u64::from_be_bytes(head[2 + sender_len..2 + sender_len + 8].try_into().ok()?);
        Some(Datagram {
            kind: head[0],
            sender,
            sent_at_ms,
            tag: sealed[sealed.len() - TAG_LEN..].try_into().ok()?,
            payload,
        })
    }
}

fn aad(header: &[u8]) -> Vec<u8> {
    let mut aad = Vec::with_capacity(CONTEXT.len() + header.len());
    aad.extend_from_slice(CONTEXT);
    aad.extend_from_slice(header);
    aad
}
