//! The mesh's UDP socket calls that `std` lacks: one send of many datagrams (UDP GSO, the
//! kernel cuts the buffer at the segment size), one receive of many (UDP GRO, the kernel
//! hands datagrams of one sender over as one buffer and says their size), and socket
//! buffers large enough that a burst between two reads is not dropped.

use std::io;
use std::mem::size_of;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::os::fd::AsRawFd;

/// Socket buffer size asked for in each direction.
const BUFFER_BYTES: libc::c_int = 8 << 20;

/// Sets large send and receive buffers (beyond `net.core.*mem_max` when root) and turns on
/// UDP GRO (kernel ≥ 5.0); returns whether GRO is on.
pub fn tune(socket: &UdpSocket) -> bool {
    let fd = socket.as_raw_fd();
    for (force, plain) in [
        (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
        (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
    ] {
        if setsockopt(fd, libc::SOL_SOCKET, force, BUFFER_BYTES).is_err() {
            let _ = setsockopt(fd, libc::SOL_SOCKET, plain, BUFFER_BYTES);
        }
    }
    setsockopt(fd, libc::SOL_UDP, libc::UDP_GRO, 1).is_ok()
}

fn setsockopt(fd: i32, level: i32, name: i32, value: libc::c_int) -> io::Result<()> {
    // SAFETY: `value` is a c_int that lives for the call, and its size is passed.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Sends `buf` to `to` as datagrams of `segment` bytes (the last may be shorter) in one call.
pub fn send_segments(
    socket: &UdpSocket,
    to: SocketAddr,
    buf: &[u8],
    segment: u16,
) -> io::Result<()> {
    let (addr, addr_len) = sockaddr(to);
    let mut iov = libc::iovec {
        iov_base: buf.as_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    let mut control = [0u64; 4];
    // SAFETY: an all-zero msghdr is valid; the pointers set below outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = (&addr as *const libc::sockaddr_storage).cast_mut().cast();
    msg.msg_namelen = addr_len;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if buf.len() > usize::from(segment) {
        // SAFETY: CMSG_SPACE is a size computation.
        msg.msg_controllen = unsafe { libc::CMSG_SPACE(size_of::<u16>() as u32) } as usize;
        msg.msg_control = control.as_mut_ptr().cast();
        // SAFETY: the control buffer holds one cmsg with a u16 (checked by CMSG_SPACE
        // against its 32 bytes), so CMSG_FIRSTHDR is non-null and CMSG_DATA in bounds.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_UDP;
            (*cmsg).cmsg_type = libc::UDP_SEGMENT;
            (*cmsg).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<u16>(), segment);
        }
    }
    // SAFETY: `msg` points at live buffers of the lengths it gives.
    if unsafe { libc::sendmsg(socket.as_raw_fd(), &msg, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Receives into `buf`: (bytes, sender, the size of each datagram in it when the kernel
/// joined several (GRO)).
pub fn recv_segments(
    socket: &UdpSocket,
    buf: &mut [u8],
) -> io::Result<(usize, SocketAddr, Option<u16>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: all-zero sockaddr_storage and msghdr are valid.
    let mut addr: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut control = [0u64; 8];
    // SAFETY: as above.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = (&mut addr as *mut libc::sockaddr_storage).cast();
    msg.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = size_of::<[u64; 8]>();
    // SAFETY: `msg` points at live buffers of the lengths it gives.
    let n = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut msg, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut segment = None;
    // SAFETY: the kernel filled `msg_controllen` bytes of `control` with well-formed cmsgs;
    // the CMSG_* macros walk them within those bounds.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_UDP && (*cmsg).cmsg_type == libc::UDP_GRO {
                let size = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::c_int>());
                segment = u16::try_from(size).ok().filter(|s| *s > 0);
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    let from =
        socket_addr(&addr).ok_or_else(|| io::Error::other("a datagram from no IP address"))?;
    Ok((n as usize, from, segment))
}

fn sockaddr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: an all-zero sockaddr_storage is valid.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*a.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin) };
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin6) };
            size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

fn socket_addr(storage: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match i32::from(storage.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin: libc::sockaddr_in =
                unsafe { std::ptr::read((storage as *const libc::sockaddr_storage).cast()) };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let sin6: libc::sockaddr_in6 =
                unsafe { std::ptr::read((storage as *const libc::sockaddr_storage).cast()) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn buffer(socket: &UdpSocket, name: i32) -> libc::c_int {
        let mut value: libc::c_int = 0;
        let mut len = size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `value` and `len` live for the call and `len` is `value`'s size.
        let r = unsafe {
            libc::getsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                name,
                (&mut value as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        assert_eq!(r, 0, "{}", io::Error::last_os_error());
        value
    }

    /// A burst between two reads fits: the default 208 KiB receive buffer dropped a quarter
    /// of the datagrams of one TCP stream (root: beyond `net.core.rmem_max`).
    #[test]
    fn the_socket_has_room_for_bursts() {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        tune(&socket);
        for name in [libc::SO_RCVBUF, libc::SO_SNDBUF] {
            assert!(
                buffer(&socket, name) >= BUFFER_BYTES,
                "{name}: {}",
                buffer(&socket, name)
            );
        }
    }

    /// One GSO send of five datagrams arrives as five datagrams of the right sizes and bytes,
    /// whether or not the kernel joins them again on the way in (GRO).
    #[test]
    fn segments_sent_in_one_call_arrive_as_datagrams() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let gro = tune(&rx);
        rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let buf: Vec<u8> = (0..4 * 1000 + 300).map(|i| (i % 251) as u8).collect();
        send_segments(&tx, rx.local_addr().unwrap(), &buf, 1000).unwrap();
        let mut got = Vec::new();
        let mut sizes = Vec::new();
        let mut data = vec![0u8; 65536];
        while got.len() < buf.len() {
            let (n, from, seg) = recv_segments(&rx, &mut data).unwrap();
            assert_eq!(from, tx.local_addr().unwrap());
            assert!(gro || seg.is_none());
            for d in data[..n].chunks(seg.map_or(n, usize::from)) {
                sizes.push(d.len());
                got.extend_from_slice(d);
            }
        }
        assert_eq!(sizes, [1000, 1000, 1000, 1000, 300]);
        assert_eq!(got, buf);
    }
}
