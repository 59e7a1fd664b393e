//! The device's UDP socket: batched receive (`recvmmsg`) and transmit
//! (`sendmmsg`) over preallocated slots, ICRC sealing, and the test-only
//! fault hook. Nothing here allocates after creation.
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::wire::roce::icrc::{self, Ipv4Header, UdpPorts};
use crate::wire::roce::seg::Mtu;
use crate::wire::roce::ICRC_LEN;

/// Bytes per packet slot: BTH + RETH + ImmDt + 4096 payload + pad + ICRC,
/// rounded up.
pub(super) const SLOT: usize = 4160;
/// Packets per `sendmmsg`.
pub(super) const TX_BATCH: usize = 64;
/// Packets per `recvmmsg`.
pub(super) const RX_BATCH: usize = 32;
/// Socket buffer size asked for (capped by `net.core.[rw]mem_max`).
const SOCK_BUF: i32 = 4 << 20;

fn sockaddr(a: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(a.ip().octets()),
        },
        sin_zero: [0; 8],
    }
}

fn from_sockaddr(s: &libc::sockaddr_in) -> SocketAddrV4 {
    SocketAddrV4::new(
        Ipv4Addr::from(s.sin_addr.s_addr.to_ne_bytes()),
        u16::from_be(s.sin_port),
    )
}

/// Binds a non-blocking UDP socket at `local` with `IP_PMTUDISC_DO` (DF
/// set, IP ID 0 on unconnected sends: what the ICRC we compute assumes).
///
/// # Errors
/// The OS error of `socket`, `setsockopt` or `bind`.
pub(super) fn bind_udp(local: SocketAddrV4) -> std::io::Result<OwnedFd> {
    // SAFETY: plain socket(2) call; the fd is owned right after.
    let raw = unsafe {
        libc::socket(
            libc::AF_INET,
            libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let set = |level, name, val: i32| -> std::io::Result<()> {
        // SAFETY: valid fd, pointer to an i32 of the given size.
        let r = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                level,
                name,
                &val as *const i32 as *const libc::c_void,
                std::mem::size_of::<i32>() as libc::socklen_t,
            )
        };
        if r < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    set(
        libc::IPPROTO_IP,
        libc::IP_MTU_DISCOVER,
        libc::IP_PMTUDISC_DO,
    )?;
    // Larger buffers absorb a window of packets from every peer at once.
    // The FORCE variants pass `net.core.[rw]mem_max` but need
    // CAP_NET_ADMIN; without it the plain ones are capped there, silently,
    // so the caller reads back what was granted (`SocketBuffers::of`).
    if set(libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, SOCK_BUF).is_err() {
        let _ = set(libc::SOL_SOCKET, libc::SO_RCVBUF, SOCK_BUF);
    }
    if set(libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, SOCK_BUF).is_err() {
        let _ = set(libc::SOL_SOCKET, libc::SO_SNDBUF, SOCK_BUF);
    }
    let sa = sockaddr(local);
    // SAFETY: valid fd and a sockaddr_in of the right size.
    let r = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            &sa as *const libc::sockaddr_in as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fd)
}

/// The socket buffer sizes the kernel granted (as `getsockopt` reports
/// them: twice what was set, the kernel's allowance for its own
/// bookkeeping, in the same unit it charges received packets in).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SocketBuffers {
    /// Receive buffer, bytes.
    pub rcv: usize,
    /// Send buffer, bytes.
    pub snd: usize,
}

impl SocketBuffers {
    /// No limit: what a queue pair assumes before it is installed.
    pub const UNLIMITED: SocketBuffers = SocketBuffers {
        rcv: usize::MAX,
        snd: usize::MAX,
    };

    /// Reads back the sizes of `fd`'s buffers (0 where the kernel does not
    /// say).
    pub fn of(fd: i32) -> SocketBuffers {
        let get = |name| {
            let mut v: libc::c_int = 0;
            let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            // SAFETY: valid fd, pointer to an int and its size.
            let r = unsafe {
                libc::getsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    name,
                    &mut v as *mut libc::c_int as *mut libc::c_void,
                    &mut len,
                )
            };
            if r == 0 {
                v.max(0) as usize
            } else {
                0
            }
        };
        SocketBuffers {
            rcv: get(libc::SO_RCVBUF),
            snd: get(libc::SO_SNDBUF),
        }
    }

    /// Whether the kernel granted less than asked for (it reports double).
    pub fn short(&self) -> bool {
        self.rcv < 2 * SOCK_BUF as usize || self.snd < 2 * SOCK_BUF as usize
    }

    /// The send window and read burst, in packets of `mtu`, that this
    /// buffer takes from one queue pair without dropping: half the
    /// receive buffer (peers usually run the same configuration, so ours
    /// stands for theirs; the rest is for other queue pairs and ACKs), at
    /// a charge per packet of its payload and headers rounded up to a
    /// power of two (the kernel charges the allocation, not the
    /// datagram) plus the socket buffer's own structure. Never more than
    /// `max` nor fewer than 8 packets.
    pub fn fit(&self, mtu: Mtu, max: u32) -> u32 {
        let charge = (mtu.bytes() as usize + ROCE_OVERHEAD as usize).next_power_of_two() + 512;
        (self.rcv / 2 / charge).clamp(8, max.max(8) as usize) as u32
    }
}

/// Bytes a RoCEv2 packet adds to its payload on an IPv4 link, at most:
/// IPv4 20 + UDP 8 + BTH 12 + RETH 16 + ImmDt 4 + pad 3 + ICRC 4 = 67,
/// rounded up to rxe's own allowance (`RXE_MAX_HDR_LENGTH`, 80), so that
/// both ends derive the same path MTU from the same link MTU.
const ROCE_OVERHEAD: u32 = 80;

/// The IB path MTU a link of IP MTU `ip_mtu` carries: the largest of
/// 256..4096 whose packets fit, as rxe sets a port's active MTU from its
/// netdev's (`rxe_set_mtu`): 1500 gives 1024, loopback's 65536 gives 4096
/// (IBTA's maximum, vol. 1 9.7.2). A link too small for 256 still gets
/// 256: the kernel then refuses the packets and they are counted.
pub(super) fn mtu_for_link(ip_mtu: u32) -> Mtu {
    let room = ip_mtu.saturating_sub(ROCE_OVERHEAD);
    Mtu::ALL
        .iter()
        .rev()
        .copied()
        .find(|m| m.bytes() <= room)
        .unwrap_or(Mtu::Mtu256)
}

/// The path MTU toward `dst`: the MTU of the route the kernel picks
/// (`IP_MTU` of a UDP socket connected to it, which also reflects a
/// learnt path MTU), mapped by [`mtu_for_link`]. `None` if the kernel
/// has no route or refuses the query; the caller then keeps 1024, what a
/// 1500-byte Ethernet link carries.
pub(super) fn path_mtu(dst: Ipv4Addr, port: u16) -> Option<Mtu> {
    // SAFETY: plain socket(2) call; the fd is owned right after.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return None;
    }
    // SAFETY: `raw` is a fresh descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let sa = sockaddr(SocketAddrV4::new(dst, port));
    // SAFETY: valid fd and a sockaddr_in of the right size. A UDP
    // connect sends nothing; it only picks the route.
    let r = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            &sa as *const libc::sockaddr_in as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return None;
    }
    let mut mtu: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: valid fd, pointer to an int and its size.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_MTU,
            &mut mtu as *mut libc::c_int as *mut libc::c_void,
            &mut len,
        )
    };
    (r == 0 && mtu > 0).then(|| mtu_for_link(mtu as u32))
}

/// Test-only packet faults: per-mille probabilities of dropping,
/// duplicating and reordering (swapping with the previous packet of the
/// batch) each transmitted data-path packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FaultPolicy {
    /// Drop probability in 1/1000.
    pub drop_permille: u16,
    /// Duplicate probability in 1/1000.
    pub dup_permille: u16,
    /// Reorder probability in 1/1000.
    pub reorder_permille: u16,
    /// PRNG seed (0 picks one from the QPN).
    pub seed: u64,
}

impl FaultPolicy {
    /// Parses `drop,dup,reorder[,seed]` (per mille), as in
    /// `RPCRDMA_ROCE_FAULTS=30,20,20`.
    pub fn parse(s: &str) -> Option<FaultPolicy> {
        let mut it = s.split(',').map(|x| x.trim().parse::<u64>().ok());
        let mut next = |max: u64| match it.next() {
            Some(Some(v)) if v <= max => Some(Some(v)),
            None => Some(None),
            _ => None,
        };
        let d = next(1000)??;
        let u = next(1000)?.unwrap_or(0);
        let r = next(1000)?.unwrap_or(0);
        let seed = next(u64::MAX)?.unwrap_or(0);
        Some(FaultPolicy {
            drop_permille: d as u16,
            dup_permille: u as u16,
            reorder_permille: r as u16,
            seed,
        })
    }

    /// Whether any fault is enabled.
    pub fn is_active(&self) -> bool {
        self.drop_permille + self.dup_permille + self.reorder_permille > 0
    }
}

/// A fault policy with its PRNG state (one per queue pair).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Faults {
    pub policy: FaultPolicy,
    state: u64,
    /// Packets dropped, duplicated, reordered (for tests and logs).
    pub counts: [u64; 3],
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Send,
    Drop,
    Dup,
    Reorder,
}

impl Faults {
    pub fn new(policy: FaultPolicy, qpn: u32) -> Faults {
        let seed = if policy.seed == 0 {
            0x9E37_79B9_7F4A_7C15 ^ qpn as u64
        } else {
            policy.seed ^ qpn as u64
        };
        Faults {
            policy,
            state: seed | 1,
            counts: [0; 3],
        }
    }

    fn roll(&mut self) -> u32 {
        // xorshift64*
        let mut x = self.state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.state = x;
        (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) as u32 % 1000
    }

    fn fate(&mut self) -> Fate {
        if !self.policy.is_active() {
            return Fate::Send;
        }
        let r = self.roll();
        let p = self.policy;
        let (d, u, o) = (
            p.drop_permille as u32,
            p.dup_permille as u32,
            p.reorder_permille as u32,
        );
        if r < d {
            self.counts[0] += 1;
            Fate::Drop
        } else if r < d + u {
            self.counts[1] += 1;
            Fate::Dup
        } else if r < d + u + o {
            self.counts[2] += 1;
            Fate::Reorder
        } else {
            Fate::Send
        }
    }
}

/// The transmit side: a batch of sealed packets waiting for `sendmmsg`.
/// A device has several (one per shard and one for the connection
/// manager), all sending through the device's one socket.
pub(super) struct Tx {
    /// Shared with the device and its other batches: the socket stays
    /// open while any batch may still send.
    fd: Arc<OwnedFd>,
    pub local: SocketAddrV4,
    buf: Box<[u8]>,
    meta: [(u16, SocketAddrV4); TX_BATCH],
    n: usize,
    /// Packets the kernel refused with EMSGSIZE (larger than the route's
    /// MTU with DF set), counted for the whole device.
    oversized: Arc<AtomicU64>,
}

impl Tx {
    pub fn new(fd: Arc<OwnedFd>, local: SocketAddrV4, oversized: Arc<AtomicU64>) -> Tx {
        Tx {
            fd,
            local,
            buf: vec![0u8; SLOT * TX_BATCH].into_boxed_slice(),
            meta: [(0, local); TX_BATCH],
            n: 0,
            oversized,
        }
    }

    /// The next free slot (flushes a full batch first).
    pub fn slot(&mut self) -> &mut [u8] {
        if self.n == TX_BATCH {
            self.flush();
        }
        &mut self.buf[self.n * SLOT..(self.n + 1) * SLOT]
    }

    /// Seals the ICRC of the `len` bytes written into [`Tx::slot`] and
    /// queues them for `dst`, subject to `faults`.
    pub fn commit(&mut self, len: usize, dst: SocketAddrV4, faults: Option<&mut Faults>) {
        debug_assert!(self.n < TX_BATCH && (ICRC_LEN..=SLOT).contains(&len));
        let at = self.n * SLOT;
        let ip = Ipv4Header::plain_udp_socket(self.local.ip().octets(), dst.ip().octets());
        let ports = UdpPorts {
            src: self.local.port(),
            dst: dst.port(),
        };
        // Only fails for a packet shorter than BTH + ICRC or over 64 KiB,
        // which the emitters never produce; such a packet is not sent.
        if icrc::seal_ipv4(&ip, ports, &mut self.buf[at..at + len]).is_err() {
            return;
        }
        let fate = faults.map_or(Fate::Send, |f| f.fate());
        match fate {
            Fate::Drop => return,
            Fate::Send => {}
            Fate::Dup => {
                self.meta[self.n] = (len as u16, dst);
                self.n += 1;
                if self.n == TX_BATCH {
                    self.flush();
                }
                let to = self.n * SLOT;
                // Copy the sealed packet into the next slot (the original
                // is at `at` unless flush moved nothing: flush resets n to 0
                // but leaves the bytes, so copy from the saved offset).
                if to != at {
                    self.buf.copy_within(at..at + len, to);
                }
            }
            Fate::Reorder if self.n > 0 => {
                self.meta[self.n] = (len as u16, dst);
                let (a, b) = self.buf.split_at_mut(at);
                a[at - SLOT..at].swap_with_slice(&mut b[..SLOT]);
                self.meta.swap(self.n, self.n - 1);
                self.n += 1;
                return;
            }
            Fate::Reorder => {}
        }
        self.meta[self.n] = (len as u16, dst);
        self.n += 1;
    }

    /// Sends the batch. Packets the kernel refuses (full socket buffer)
    /// are lost, exactly as on a congested link: the transport retries.
    pub fn flush(&mut self) {
        let mut off = 0;
        while off < self.n {
            let cnt = self.n - off;
            // SAFETY: zeroed mmsghdr/iovec/sockaddr arrays are valid
            // initial values; every pointer set below points into `self`
            // or these stack arrays, alive for the call.
            let mut addrs: [libc::sockaddr_in; TX_BATCH] = unsafe { std::mem::zeroed() };
            let mut iov: [libc::iovec; TX_BATCH] = unsafe { std::mem::zeroed() };
            let mut hdrs: [libc::mmsghdr; TX_BATCH] = unsafe { std::mem::zeroed() };
            for i in 0..cnt {
                let (len, dst) = self.meta[off + i];
                addrs[i] = sockaddr(dst);
                iov[i] = libc::iovec {
                    iov_base: self.buf[(off + i) * SLOT..].as_mut_ptr() as *mut libc::c_void,
                    iov_len: len as usize,
                };
                hdrs[i].msg_hdr.msg_name = &mut addrs[i] as *mut _ as *mut libc::c_void;
                hdrs[i].msg_hdr.msg_namelen =
                    std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
                hdrs[i].msg_hdr.msg_iov = &mut iov[i];
                hdrs[i].msg_hdr.msg_iovlen = 1;
            }
            // SAFETY: `hdrs[..cnt]` are initialised as above.
            let r = unsafe {
                libc::sendmmsg(
                    self.fd.as_raw_fd(),
                    hdrs.as_mut_ptr(),
                    cnt as libc::c_uint,
                    libc::MSG_DONTWAIT,
                )
            };
            if r <= 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                // EAGAIN (buffer full), ECONNREFUSED from an earlier ICMP,
                // EMSGSIZE...: skip the head packet and go on (the
                // transport retransmits); count EMSGSIZE, which no retry
                // can cure (MTU above the route's, see docs/ROCE.md).
                if e.raw_os_error() == Some(libc::EMSGSIZE) {
                    self.oversized.fetch_add(1, Ordering::Relaxed);
                }
                off += 1;
            } else {
                off += r as usize;
            }
        }
        self.n = 0;
    }
}

/// The receive side: one `recvmmsg` batch (one per shard and one for the
/// connection manager, all reading the device's one socket).
pub(super) struct Rx {
    buf: Box<[u8]>,
    pub lens: [usize; RX_BATCH],
    pub srcs: [SocketAddrV4; RX_BATCH],
    pub n: usize,
}

impl Rx {
    pub fn new() -> Rx {
        Rx {
            buf: vec![0u8; SLOT * RX_BATCH].into_boxed_slice(),
            lens: [0; RX_BATCH],
            srcs: [SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0); RX_BATCH],
            n: 0,
        }
    }

    /// Packet `i` of the last batch.
    pub fn packet(&self, i: usize) -> &[u8] {
        &self.buf[i * SLOT..i * SLOT + self.lens[i]]
    }

    /// Receives up to [`RX_BATCH`] datagrams without blocking; returns how
    /// many (0 when none is queued). Truncated datagrams get length 0.
    pub fn recv(&mut self, fd: i32) -> usize {
        // SAFETY: as in `Tx::flush`: zeroed C structs, pointers into
        // `self.buf` and stack arrays alive for the call.
        let mut addrs: [libc::sockaddr_in; RX_BATCH] = unsafe { std::mem::zeroed() };
        let mut iov: [libc::iovec; RX_BATCH] = unsafe { std::mem::zeroed() };
        let mut hdrs: [libc::mmsghdr; RX_BATCH] = unsafe { std::mem::zeroed() };
        for i in 0..RX_BATCH {
            iov[i] = libc::iovec {
                iov_base: self.buf[i * SLOT..].as_mut_ptr() as *mut libc::c_void,
                iov_len: SLOT,
            };
            hdrs[i].msg_hdr.msg_name = &mut addrs[i] as *mut _ as *mut libc::c_void;
            hdrs[i].msg_hdr.msg_namelen =
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            hdrs[i].msg_hdr.msg_iov = &mut iov[i];
            hdrs[i].msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: initialised above; null timeout with MSG_DONTWAIT.
        let r = unsafe {
            libc::recvmmsg(
                fd,
                hdrs.as_mut_ptr(),
                RX_BATCH as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        let n = if r < 0 { 0 } else { r as usize };
        for i in 0..n {
            let truncated = hdrs[i].msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
            self.lens[i] = if truncated {
                0
            } else {
                hdrs[i].msg_len as usize
            };
            self.srcs[i] = from_sockaddr(&addrs[i]);
        }
        self.n = n;
        n
    }
}
