//! The pure part of the device's offloads: the `virtio_net_hdr` the TUN device puts before
//! each packet (`IFF_VNET_HDR`), cutting a TCP super-packet the kernel handed over unsegmented
//! (TSO, up to 64 KiB) into packets of the MSS it names, as a NIC would; finishing a
//! checksum the kernel left partial; and grouping encrypted datagrams into runs that one
//! UDP GSO send can carry (same peer, same size but the last).

use std::ops::Range;

/// Size of `struct virtio_net_hdr` (no mergeable buffers), the TUN device's default.
pub const VNET_HDR_LEN: usize = 10;
/// `VIRTIO_NET_HDR_F_NEEDS_CSUM`: the checksum at `csum_start + csum_offset` holds only the
/// pseudo-header's sum.
const F_NEEDS_CSUM: u8 = 1;
/// `VIRTIO_NET_HDR_F_DATA_VALID`: the receiver need not check the checksum.
pub const F_DATA_VALID: u8 = 2;
const GSO_NONE: u8 = 0;
const GSO_TCPV4: u8 = 1;
const GSO_ECN: u8 = 0x80;
const TCP: u8 = 6;
/// Most segments one UDP GSO send may carry (`UDP_MAX_SEGMENTS`).
pub const GSO_MAX_SEGMENTS: usize = 64;
/// Most bytes one UDP GSO send may carry (an IPv4 datagram's payload).
pub const GSO_MAX_BYTES: usize = 65_507;

/// A `virtio_net_hdr` (native endian, as the TUN device uses by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VnetHdr {
    pub flags: u8,
    pub gso_type: u8,
    pub gso_size: u16,
    pub csum_start: u16,
    pub csum_offset: u16,
}

impl VnetHdr {
    /// Parses the first [`VNET_HDR_LEN`] bytes of `buf`.
    pub fn parse(buf: &[u8]) -> Option<VnetHdr> {
        let b = buf.get(..VNET_HDR_LEN)?;
        let u16_at = |i: usize| u16::from_ne_bytes([b[i], b[i + 1]]);
        Some(VnetHdr {
            flags: b[0],
            gso_type: b[1],
            gso_size: u16_at(4),
            csum_start: u16_at(6),
            csum_offset: u16_at(8),
        })
    }

    /// The header as the TUN device reads it (`hdr_len` left 0: a hint only).
    pub fn to_bytes(self) -> [u8; VNET_HDR_LEN] {
        let mut b = [0u8; VNET_HDR_LEN];
        b[0] = self.flags;
        b[1] = self.gso_type;
        b[4..6].copy_from_slice(&self.gso_size.to_ne_bytes());
        b[6..8].copy_from_slice(&self.csum_start.to_ne_bytes());
        b[8..10].copy_from_slice(&self.csum_offset.to_ne_bytes());
        b
    }
}

/// Why a packet read from the TUN device cannot be passed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffloadError {
    /// Shorter than its headers say, or a checksum place outside it.
    Truncated,
    /// A segmentation type other than TCP over IPv4 (the only one the device turns on).
    UnsupportedGso(u8),
}

/// Calls `each` with every packet `packet` (after its vnet header `hdr`) stands for: itself
/// with its checksum finished if the kernel left it partial, or, for a TCP super-packet, each
/// segment of at most `gso_size` bytes of payload with its own IP length, id and checksum
/// and TCP sequence number, flags and checksum. `scratch` holds one segment at a time
/// (at least the MTU).
pub fn segments(
    hdr: VnetHdr,
    packet: &mut [u8],
    scratch: &mut [u8],
    mut each: impl FnMut(&[u8]),
) -> Result<(), OffloadError> {
    match hdr.gso_type & !GSO_ECN {
        GSO_NONE => {
            if hdr.flags & F_NEEDS_CSUM != 0 {
                finish_checksum(packet, hdr.csum_start.into(), hdr.csum_offset.into())?;
            }
            each(packet);
            Ok(())
        }
        GSO_TCPV4 => segment_tcp4(packet, hdr.gso_size.into(), scratch, each),
        other => Err(OffloadError::UnsupportedGso(other)),
    }
}

/// Completes a partial checksum: the ones' complement of the sum from `start` to the end,
/// whose field (at `start + offset`) holds the pseudo-header's sum.
fn finish_checksum(packet: &mut [u8], start: usize, offset: usize) -> Result<(), OffloadError> {
    let at = start + offset;
    if at + 2 > packet.len() {
        return Err(OffloadError::Truncated);
    }
    let sum = !fold(sum16(&packet[start..], 0));
    packet[at..at + 2].copy_from_slice(&sum.to_be_bytes());
    Ok(())
}

fn segment_tcp4(
    packet: &[u8],
    mss: usize,
    scratch: &mut [u8],
    mut each: impl FnMut(&[u8]),
) -> Result<(), OffloadError> {
    let ip_len = usize::from(packet.first().ok_or(OffloadError::Truncated)? & 0x0f) * 4;
    let tcp_len = usize::from(packet.get(ip_len + 12).ok_or(OffloadError::Truncated)? >> 4) * 4;
    let hdr_len = ip_len + tcp_len;
    if ip_len < 20 || tcp_len < 20 || packet.len() < hdr_len || packet[9] != TCP || mss == 0 {
        return Err(OffloadError::Truncated);
    }
    let payload = &packet[hdr_len..];
    let id = u16::from_be_bytes([packet[4], packet[5]]);
    let seq = u32::from_be_bytes(
        packet[ip_len + 4..ip_len + 8]
            .try_into()
            .unwrap_or_default(),
    );
    let flags = packet[ip_len + 13];
    let count = payload.len().div_ceil(mss).max(1);
    for (i, chunk) in payload
        .chunks(mss)
        .chain(payload.is_empty().then_some(&[][..]))
        .enumerate()
    {
        let len = hdr_len + chunk.len();
        let seg = scratch.get_mut(..len).ok_or(OffloadError::Truncated)?;
        seg[..hdr_len].copy_from_slice(&packet[..hdr_len]);
        seg[hdr_len..].copy_from_slice(chunk);
        // IPv4: total length, id, header checksum.
        seg[2..4].copy_from_slice(&(len as u16).to_be_bytes());
        seg[4..6].copy_from_slice(&id.wrapping_add(i as u16).to_be_bytes());
        seg[10..12].fill(0);
        let ip_sum = !fold(sum16(&seg[..ip_len], 0));
        seg[10..12].copy_from_slice(&ip_sum.to_be_bytes());
        // TCP: sequence number; FIN and PSH on the last segment only, CWR on the first only.
        let tcp = &mut seg[ip_len..];
        let seq = seq.wrapping_add((i * mss) as u32);
        tcp[4..8].copy_from_slice(&seq.to_be_bytes());
        let mut f = flags;
        if i + 1 < count {
            f &= !(0x01 | 0x08);
        }
        if i > 0 {
            f &= !0x80;
        }
        tcp[13] = f;
        tcp[16..18].fill(0);
        let pseudo = pseudo_header4(&seg[12..20], len - ip_len);
        let tcp_sum = !fold(sum16(&seg[ip_len..], pseudo));
        seg[ip_len + 16..ip_len + 18].copy_from_slice(&tcp_sum.to_be_bytes());
        each(seg);
    }
    Ok(())
}

/// The sum of the IPv4 pseudo-header (`addrs`: source then destination) of a TCP segment of
/// `len` bytes.
fn pseudo_header4(addrs: &[u8], len: usize) -> u64 {
    sum16(addrs, u64::from(TCP) + len as u64)
}

/// Ones' complement sum of `data` as big-endian 16-bit words (an odd last byte padded with
/// zero), added to `initial`, not yet folded.
fn sum16(data: &[u8], initial: u64) -> u64 {
    let mut sum = initial;
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        let v = u64::from_be_bytes(w.try_into().unwrap_or_default());
        sum += (v >> 32) + (v & 0xffff_ffff);
    }
    let mut rest = words.remainder().chunks_exact(2);
    for w in &mut rest {
        sum += u64::from(u16::from_be_bytes([w[0], w[1]]));
    }
    if let [last] = rest.remainder() {
        sum += u64::from(*last) << 8;
    }
    sum
}

/// Folds a sum of [`sum16`] into 16 bits.
fn fold(mut sum: u64) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// Splits datagrams (each to a peer `P`, with its length) into runs that one UDP GSO send
/// carries: consecutive, to the same peer, all as long as the first but the last (which may
/// be shorter), at most [`GSO_MAX_SEGMENTS`] and [`GSO_MAX_BYTES`].
pub fn gso_runs<P: PartialEq>(datagrams: &[(P, usize)]) -> Vec<Range<usize>> {
    let mut runs = Vec::new();
    let mut start = 0;
    while start < datagrams.len() {
        let (peer, size) = &datagrams[start];
        let mut end = start + 1;
        let mut bytes = *size;
        while end < datagrams.len()
            && end - start < GSO_MAX_SEGMENTS
            && datagrams[end].0 == *peer
            && datagrams[end].1 <= *size
            && datagrams[end - 1].1 == *size
            && bytes + datagrams[end].1 <= GSO_MAX_BYTES
        {
            bytes += datagrams[end].1;
            end += 1;
        }
        runs.push(start..end);
        start = end;
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An IPv4 TCP packet 10.0.0.1:1000 → 10.0.0.2:80 with `payload`, checksums left zero.
    fn tcp_packet(payload: &[u8], seq: u32, flags: u8) -> Vec<u8> {
        let len = 40 + payload.len();
        let mut p = vec![0u8; len];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&(len as u16).to_be_bytes());
        p[4..6].copy_from_slice(&0xfffeu16.to_be_bytes());
        p[6] = 0x40;
        p[8] = 64;
        p[9] = TCP;
        p[12..16].copy_from_slice(&[10, 0, 0, 1]);
        p[16..20].copy_from_slice(&[10, 0, 0, 2]);
        p[20..22].copy_from_slice(&1000u16.to_be_bytes());
        p[22..24].copy_from_slice(&80u16.to_be_bytes());
        p[24..28].copy_from_slice(&seq.to_be_bytes());
        p[32] = 5 << 4;
        p[33] = flags;
        p[34..36].copy_from_slice(&64240u16.to_be_bytes());
        p[40..].copy_from_slice(payload);
        p
    }

    fn ip_checksum_ok(seg: &[u8]) -> bool {
        fold(sum16(&seg[..20], 0)) == 0xffff
    }

    fn tcp_checksum_ok(seg: &[u8]) -> bool {
        fold(sum16(
            &seg[20..],
            pseudo_header4(&seg[12..20], seg.len() - 20),
        )) == 0xffff
    }

    #[test]
    fn a_super_packet_is_cut_at_the_mss_with_headers_of_its_own() {
        let payload: Vec<u8> = (0..3001u32).map(|i| (i * 7) as u8).collect();
        let mut packet = tcp_packet(&payload, u32::MAX - 1000, 0x10 | 0x08 | 0x01 | 0x80);
        let hdr = VnetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: GSO_TCPV4,
            gso_size: 1000,
            csum_start: 20,
            csum_offset: 16,
        };
        let mut scratch = [0u8; 2048];
        let mut segs = Vec::new();
        segments(hdr, &mut packet, &mut scratch, |s| segs.push(s.to_vec())).unwrap();
        assert_eq!(segs.len(), 4);
        let mut joined = Vec::new();
        for (i, s) in segs.iter().enumerate() {
            assert_eq!(usize::from(u16::from_be_bytes([s[2], s[3]])), s.len());
            assert_eq!(
                u16::from_be_bytes([s[4], s[5]]),
                0xfffeu16.wrapping_add(i as u16)
            );
            let seq = u32::from_be_bytes(s[24..28].try_into().unwrap());
            assert_eq!(seq, (u32::MAX - 1000).wrapping_add(1000 * i as u32));
            let flags = s[33];
            assert_eq!(flags & 0x10, 0x10, "ACK on every segment");
            assert_eq!(flags & 0x80 != 0, i == 0, "CWR on the first only");
            assert_eq!(flags & 0x09 != 0, i == 3, "FIN and PSH on the last only");
            assert!(ip_checksum_ok(s) && tcp_checksum_ok(s), "segment {i}");
            joined.extend_from_slice(&s[40..]);
        }
        assert_eq!(segs[3].len(), 41);
        assert_eq!(joined, payload);
    }

    #[test]
    fn a_partial_checksum_is_finished() {
        let mut packet = tcp_packet(b"hello, mesh", 7, 0x18);
        // What the kernel leaves: the pseudo-header's sum, not complemented.
        let partial = fold(pseudo_header4(&packet[12..20], packet.len() - 20));
        packet[36..38].copy_from_slice(&partial.to_be_bytes());
        let hdr = VnetHdr {
            flags: F_NEEDS_CSUM,
            csum_start: 20,
            csum_offset: 16,
            ..VnetHdr::default()
        };
        let mut out = Vec::new();
        segments(hdr, &mut packet, &mut [0u8; 64], |s| out = s.to_vec()).unwrap();
        assert!(tcp_checksum_ok(&out));
        let bad = VnetHdr {
            csum_offset: 100,
            ..hdr
        };
        assert_eq!(
            segments(bad, &mut packet, &mut [0u8; 64], |_| {}),
            Err(OffloadError::Truncated)
        );
    }

    #[test]
    fn truncated_or_foreign_super_packets_are_refused() {
        let hdr = VnetHdr {
            gso_type: GSO_TCPV4,
            gso_size: 100,
            ..VnetHdr::default()
        };
        let mut scratch = [0u8; 2048];
        let mut short = tcp_packet(&[0; 300], 1, 0x10);
        short.truncate(30);
        assert_eq!(
            segments(hdr, &mut short, &mut scratch, |_| {}),
            Err(OffloadError::Truncated)
        );
        let udp = VnetHdr { gso_type: 3, ..hdr };
        let mut p = tcp_packet(&[0; 300], 1, 0x10);
        assert_eq!(
            segments(udp, &mut p, &mut scratch, |_| {}),
            Err(OffloadError::UnsupportedGso(3))
        );
    }

    #[test]
    fn vnet_header_round_trips() {
        let h = VnetHdr {
            flags: F_DATA_VALID,
            gso_type: GSO_TCPV4 | GSO_ECN,
            gso_size: 1380,
            csum_start: 20,
            csum_offset: 16,
        };
        assert_eq!(VnetHdr::parse(&h.to_bytes()), Some(h));
        assert_eq!(VnetHdr::parse(&[0; 9]), None);
    }

    #[test]
    fn gso_runs_keep_to_one_peer_and_one_size() {
        let d = [
            ('a', 1452),
            ('a', 1452),
            ('a', 900),
            ('a', 1452),
            ('b', 1452),
            ('b', 1452),
            ('b', 1452),
            ('a', 60),
            ('a', 80),
        ];
        assert_eq!(gso_runs(&d), vec![0..3, 3..4, 4..7, 7..8, 8..9]);
        let many = vec![('a', 100); 150];
        assert_eq!(gso_runs(&many), vec![0..64, 64..128, 128..150]);
        let big = vec![('a', 1452); 50];
        assert_eq!(gso_runs(&big), vec![0..45, 45..50]);
        assert!(gso_runs::<char>(&[]).is_empty());
    }
}
