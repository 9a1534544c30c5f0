//! The pure part of the device's offloads: the `virtio_net_hdr` the TUN device puts before
//! each packet (`IFF_VNET_HDR`), cutting a TCP super-packet the kernel handed over unsegmented
//! (TSO, up to 64 KiB) into packets of the MSS it names, as a NIC would; finishing a
//! checksum the kernel left partial; grouping encrypted datagrams into runs that one UDP GSO
//! send can carry (same peer, same size but the last); and, the other way, joining
//! decrypted segments of one TCP flow into one super-packet for the TUN device (GRO), so
//! that the kernel's stack runs once for many.

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

/// Joins consecutive TCP/IPv4 segments of one flow into one super-packet the TUN device
/// takes (behind a vnet header asking the kernel to segment it again if it must, and to
/// finish its checksum), as a NIC's GRO would: same IP and TCP header bytes but the IP
/// length, id and checksum and the TCP sequence number and checksum; each segment's
/// sequence number right after the last's; all as long as the first but the last; ACK set,
/// PSH on the last only, no other flag. Anything else passes alone, unchanged.
pub struct Coalescer {
    /// A vnet header, then the packet being built.
    buf: Vec<u8>,
    /// Bytes of the packet in `buf` (0: none).
    len: usize,
    segments: usize,
    /// The shape of the packet in `buf`, if it is a TCP segment others may join.
    shape: Option<Shape>,
    /// Whether it still takes more.
    open: bool,
}

#[derive(Clone, Copy)]
struct Shape {
    ip_len: usize,
    hdr_len: usize,
    /// Payload bytes of the first segment: every one but the last has as many.
    mss: usize,
    next_seq: u32,
}

impl std::fmt::Debug for Coalescer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coalescer")
            .field("len", &self.len)
            .field("segments", &self.segments)
            .finish_non_exhaustive()
    }
}

impl Default for Coalescer {
    fn default() -> Self {
        Coalescer {
            buf: vec![0u8; VNET_HDR_LEN + usize::from(u16::MAX)],
            len: 0,
            segments: 0,
            shape: None,
            open: false,
        }
    }
}

const ACK: u8 = 0x10;
const PSH: u8 = 0x08;

impl Coalescer {
    /// Adds `packet`; the group it cannot join is first passed to `write`.
    pub fn add(&mut self, packet: &[u8], write: impl FnMut(&[u8])) {
        if self.join(packet) {
            return;
        }
        self.flush(write);
        let len = packet.len().min(self.buf.len() - VNET_HDR_LEN);
        self.buf[VNET_HDR_LEN..VNET_HDR_LEN + len].copy_from_slice(&packet[..len]);
        self.len = len;
        self.segments = 1;
        self.shape = tcp_shape(packet)
            .filter(|(_, flags)| *flags == ACK)
            .map(|(s, _)| s);
        self.open = self.shape.is_some();
    }

    /// Passes the packet being built, if any, to `write`: a vnet header, then the packet.
    pub fn flush(&mut self, write: impl FnOnce(&[u8])) {
        if self.len == 0 {
            return;
        }
        let mut hdr = VnetHdr::default();
        if let (2.., Some(shape)) = (self.segments, self.shape) {
            let total = self.len;
            let p = &mut self.buf[VNET_HDR_LEN..VNET_HDR_LEN + total];
            p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
            p[10..12].fill(0);
            let ip_sum = !fold(sum16(&p[..shape.ip_len], 0));
            p[10..12].copy_from_slice(&ip_sum.to_be_bytes());
            // The kernel finishes the checksum from the pseudo-header's sum.
            let partial = fold(pseudo_header4(&p[12..20], total - shape.ip_len));
            p[shape.ip_len + 16..shape.ip_len + 18].copy_from_slice(&partial.to_be_bytes());
            hdr = VnetHdr {
                flags: F_NEEDS_CSUM,
                gso_type: GSO_TCPV4,
                gso_size: shape.mss as u16,
                csum_start: shape.ip_len as u16,
                csum_offset: 16,
            };
        }
        self.buf[..VNET_HDR_LEN].copy_from_slice(&hdr.to_bytes());
        write(&self.buf[..VNET_HDR_LEN + self.len]);
        self.len = 0;
        self.segments = 0;
        self.shape = None;
        self.open = false;
    }

    /// Appends `packet`'s payload to the packet being built, if it may join it.
    fn join(&mut self, packet: &[u8]) -> bool {
        let Some(shape) = self.shape.filter(|_| self.open) else {
            return false;
        };
        let Some((theirs, flags)) = tcp_shape(packet) else {
            return false;
        };
        let payload = packet.len() - shape.hdr_len;
        let first = &self.buf[VNET_HDR_LEN..VNET_HDR_LEN + shape.hdr_len];
        let (ip, tcp) = (shape.ip_len, shape.hdr_len);
        let joins = theirs.ip_len == shape.ip_len
            && theirs.hdr_len == shape.hdr_len
            && theirs.next_seq.wrapping_sub(payload as u32) == shape.next_seq
            && payload <= shape.mss
            && (flags == ACK || flags == ACK | PSH)
            && self.len + payload <= usize::from(u16::MAX)
            // IP: version to DSCP, flags and fragment offset, TTL, protocol, addresses.
            && packet[..2] == first[..2]
            && packet[6..10] == first[6..10]
            && packet[12..ip] == first[12..ip]
            // TCP: ports, acknowledgment, offset and flags but PSH, window, options.
            && packet[ip..ip + 4] == first[ip..ip + 4]
            && packet[ip + 8..ip + 13] == first[ip + 8..ip + 13]
            && packet[ip + 14..ip + 16] == first[ip + 14..ip + 16]
            && packet[ip + 20..tcp] == first[ip + 20..tcp];
        if !joins {
            return false;
        }
        let at = VNET_HDR_LEN + self.len;
        self.buf[at..at + payload].copy_from_slice(&packet[shape.hdr_len..]);
        self.len += payload;
        self.segments += 1;
        self.shape = Some(Shape {
            next_seq: theirs.next_seq,
            ..shape
        });
        // PSH, or a short segment, ends the group.
        if flags & PSH != 0 {
            self.buf[VNET_HDR_LEN + ip + 13] |= PSH;
        }
        self.open = flags == ACK && payload == shape.mss;
        true
    }
}

/// The shape of a TCP/IPv4 segment with payload, not a fragment, and its TCP flags.
fn tcp_shape(packet: &[u8]) -> Option<(Shape, u8)> {
    let ip_len = usize::from(*packet.first()? & 0x0f) * 4;
    if packet[0] >> 4 != 4 || ip_len < 20 || packet.len() < ip_len + 20 || packet[9] != TCP {
        return None;
    }
    let total = usize::from(u16::from_be_bytes([packet[2], packet[3]]));
    let fragment = u16::from_be_bytes([packet[6], packet[7]]) & 0x3fff;
    let hdr_len = ip_len + usize::from(packet[ip_len + 12] >> 4) * 4;
    if total != packet.len() || fragment != 0 || hdr_len < ip_len + 20 || packet.len() <= hdr_len {
        return None;
    }
    let seq = u32::from_be_bytes(packet[ip_len + 4..ip_len + 8].try_into().ok()?);
    let mss = packet.len() - hdr_len;
    let shape = Shape {
        ip_len,
        hdr_len,
        mss,
        next_seq: seq.wrapping_add(mss as u32),
    };
    Some((shape, packet[ip_len + 13]))
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

    /// `n` segments of one flow, `mss` bytes of payload each but the last (`last` bytes),
    /// checksums right, ids counting up as a sender's would.
    fn flow(n: usize, mss: usize, last: usize) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| {
                let len = if i + 1 == n { last } else { mss };
                let payload: Vec<u8> = (0..len).map(|j| (i * 31 + j) as u8).collect();
                let mut p = tcp_packet(&payload, 5000 + (i * mss) as u32, ACK);
                p[4..6].copy_from_slice(&(100 + i as u16).to_be_bytes());
                let ip_sum = !fold(sum16(&p[..20], 0));
                p[10..12].copy_from_slice(&ip_sum.to_be_bytes());
                let tcp_sum = !fold(sum16(&p[20..], pseudo_header4(&p[12..20], p.len() - 20)));
                p[36..38].copy_from_slice(&tcp_sum.to_be_bytes());
                p
            })
            .collect()
    }

    fn coalesce(packets: &[Vec<u8>]) -> Vec<Vec<u8>> {
        let mut c = Coalescer::default();
        let mut written = Vec::new();
        for p in packets {
            c.add(p, |w| written.push(w.to_vec()));
        }
        c.flush(|w| written.push(w.to_vec()));
        written
    }

    #[test]
    fn segments_of_one_flow_join_and_cut_back_into_the_same_segments() {
        let segs = flow(4, 1000, 300);
        let written = coalesce(&segs);
        assert_eq!(written.len(), 1);
        let hdr = VnetHdr::parse(&written[0]).unwrap();
        assert_eq!(
            hdr,
            VnetHdr {
                flags: F_NEEDS_CSUM,
                gso_type: GSO_TCPV4,
                gso_size: 1000,
                csum_start: 20,
                csum_offset: 16
            }
        );
        let mut joined = written[0][VNET_HDR_LEN..].to_vec();
        assert_eq!(joined.len(), 40 + 3300);
        assert!(ip_checksum_ok(&joined));
        // What the kernel would do with it: cut it again.
        let mut again = Vec::new();
        segments(hdr, &mut joined, &mut [0u8; 2048], |s| {
            again.push(s.to_vec())
        })
        .unwrap();
        assert_eq!(again, segs);
    }

    #[test]
    fn what_cannot_join_passes_alone_and_unchanged() {
        let alone = |p: &[u8]| [&[0u8; VNET_HDR_LEN][..], p].concat();
        // A gap in the sequence numbers: two groups.
        let mut segs = flow(4, 1000, 1000);
        segs.remove(2);
        let written = coalesce(&segs);
        assert_eq!(written.len(), 2);
        assert_eq!(written[1], alone(&segs[2]));
        // Another flow (port), a short segment in the middle, PSH: each ends a group.
        let mut segs = flow(3, 1000, 1000);
        segs[1][20..22].copy_from_slice(&1001u16.to_be_bytes());
        assert_eq!(coalesce(&segs).len(), 3);
        let mut segs = flow(3, 1000, 1000);
        segs[1].truncate(40 + 500);
        segs[1][2..4].copy_from_slice(&540u16.to_be_bytes());
        assert_eq!(coalesce(&segs).len(), 2);
        let mut segs = flow(3, 1000, 1000);
        segs[1][33] |= PSH;
        let written = coalesce(&segs);
        assert_eq!(written.len(), 2);
        assert_eq!(written[0][VNET_HDR_LEN + 33], ACK | PSH);
        // Not TCP, or a SYN: alone, byte for byte.
        let mut udp = flow(1, 1000, 1000).remove(0);
        udp[9] = 17;
        let mut syn = flow(1, 1000, 1000).remove(0);
        syn[33] = 0x02;
        assert_eq!(
            coalesce(&[udp.clone(), syn.clone()]),
            [alone(&udp), alone(&syn)]
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
