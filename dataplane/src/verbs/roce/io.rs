//! The device's UDP socket: batched receive (`recvmmsg`) and transmit
//! (`sendmmsg`) over preallocated slots, ICRC sealing, and the test-only
//! fault hook. Nothing here allocates after creation.
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::wire::roce::icrc::{self, Ipv4Header, UdpPorts};
use crate::wire::roce::seg::Mtu;
use crate::wire::roce::{BTH_LEN, ICRC_LEN};

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
pub(super) fn bind_udp(local: SocketAddrV4, gro: bool) -> std::io::Result<OwnedFd> {
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
    if gro {
        // Best effort (Linux 5.0+): coalesced receives are split in
        // `Rx::recv`; without it every packet is its own datagram.
        let _ = set(libc::SOL_UDP, libc::UDP_GRO, 1);
    }
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

/// Most segments one GSO send may carry (the kernel's
/// `UDP_MAX_SEGMENTS`).
const GSO_MAX_SEGMENTS: usize = 64;
/// Most bytes one GSO send may carry: a UDP datagram's payload limit.
const GSO_MAX_BYTES: usize = 65_507;
/// Receive buffer per datagram with GRO on: the largest datagram the
/// kernel may hand over after coalescing.
const GRO_SLOT: usize = 65_536;
/// Room for one control message of an int (CMSG_SPACE of 4 is 24 bytes
/// on 64-bit Linux; u64s keep it aligned for `cmsghdr`).
const CMSG_WORDS: usize = 4;

/// A packet's payload left where it lies ([`Tx::commit_external`]): the
/// slot holds the packet's `head` bytes of headers, then its ICRC.
#[derive(Debug, Clone, Copy, Default)]
struct External {
    head: u16,
    addr: usize,
    /// 0: the whole packet is in its slot.
    len: u32,
}

/// The transmit side: a batch of packets waiting for `sendmmsg`, sealed
/// when the batch leaves. A device has several (one per shard and one for
/// the connection manager), all sending through the device's one socket.
///
/// With `gso`, consecutive packets to one destination whose sizes allow
/// it (all full but the last) leave as one UDP GSO send (`UDP_SEGMENT`):
/// one system call and one trip through the stack for up to 15 packets of
/// 4096 bytes. The kernel segments it where it must (a device without
/// the offload) and gives segment k of a send from an unconnected socket
/// with DF the IP ID k (the first header's ID, 0, then one more per
/// segment: `ip_select_ident_segs`, `inet_gso_segment`); the ICRC covers
/// the IP ID (IBTA A17.4.1.1), so each segment is sealed for its own.
pub(super) struct Tx {
    /// Shared with the device and its other batches: the socket stays
    /// open while any batch may still send.
    fd: Arc<OwnedFd>,
    pub local: SocketAddrV4,
    buf: Box<[u8]>,
    meta: [(u16, SocketAddrV4); TX_BATCH],
    /// Per packet, its payload when it stays outside the slot
    /// ([`Tx::commit_external`]).
    ext: [External; TX_BATCH],
    n: usize,
    /// Packets the kernel refused with EMSGSIZE (larger than the route's
    /// MTU with DF set), counted for the whole device.
    oversized: Arc<AtomicU64>,
    /// Whether to send runs of packets as one GSO send; cleared for good
    /// when the kernel refuses one (no `UDP_SEGMENT`, or a route that
    /// cannot take it).
    gso: bool,
    /// GSO sends that left, and packets in them (for tests and logs).
    pub gso_sends: u64,
    pub gso_packets: u64,
    /// Packets queued with their payload left where it lies
    /// ([`Tx::commit_external`]).
    pub external_packets: u64,
    /// The `sendmmsg` headers, kept from flush to flush: each flush
    /// writes only the entries it sends (zeroing the whole arrays on the
    /// stack cost about 10,000 instructions per flush, more than the
    /// rest of a small packet's way through the provider).
    msgs: Box<MsgHeaders<TX_BATCH, { 3 * TX_BATCH }>>,
}

impl Tx {
    pub fn new(fd: Arc<OwnedFd>, local: SocketAddrV4, oversized: Arc<AtomicU64>, gso: bool) -> Tx {
        Tx {
            fd,
            local,
            buf: vec![0u8; SLOT * TX_BATCH].into_boxed_slice(),
            meta: [(0, local); TX_BATCH],
            ext: [External::default(); TX_BATCH],
            n: 0,
            oversized,
            gso,
            gso_sends: 0,
            gso_packets: 0,
            external_packets: 0,
            msgs: MsgHeaders::boxed(),
        }
    }

    /// The next free slot (flushes a full batch first).
    pub fn slot(&mut self) -> &mut [u8] {
        if self.n == TX_BATCH {
            self.flush();
        }
        &mut self.buf[self.n * SLOT..(self.n + 1) * SLOT]
    }

    /// Queues the `len` bytes written into [`Tx::slot`] for `dst`, subject
    /// to `faults`; the ICRC is sealed when the batch leaves.
    pub fn commit(&mut self, len: usize, dst: SocketAddrV4, faults: Option<&mut Faults>) {
        debug_assert!(self.n < TX_BATCH && (ICRC_LEN..=SLOT).contains(&len));
        // Shorter than BTH + ICRC or over a slot: the emitters never
        // produce one, and sealing would refuse it; it is not sent.
        if !(BTH_LEN + ICRC_LEN..=SLOT).contains(&len) {
            return;
        }
        let at = self.n * SLOT;
        let fate = faults.map_or(Fate::Send, |f| f.fate());
        self.ext[self.n] = External::default();
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
                // Copy the packet into the next slot (flush resets n to 0
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
                self.ext.swap(self.n, self.n - 1);
                self.n += 1;
                return;
            }
            Fate::Reorder => {}
        }
        self.ext[self.n] = External::default();
        self.meta[self.n] = (len as u16, dst);
        self.n += 1;
    }

    /// Queues a packet whose headers, `head` bytes, were written into
    /// [`Tx::slot`] and whose payload, `len` bytes at `addr`, is not
    /// copied: the kernel gathers headers, payload and ICRC (sealed into
    /// the slot right after the headers when the batch leaves), which
    /// saves the payload's pass through the slot.
    ///
    /// # Safety
    /// `addr..addr + len` is memory of this process that no peer may write
    /// (`Arena::peer_may_write`), owned by a work request that cannot
    /// complete before this batch leaves. The provider keeps the second
    /// part by flushing at the end of every locked section of a shard that
    /// commits (a completion is only seen by a later poll, which takes the
    /// same lock).
    ///
    /// False (nothing queued) for sizes no emitter produces: the caller
    /// then copies the payload into the slot as for any packet.
    pub unsafe fn commit_external(
        &mut self,
        head: usize,
        addr: usize,
        len: usize,
        dst: SocketAddrV4,
    ) -> bool {
        let total = head + len + ICRC_LEN;
        if head < BTH_LEN || head + ICRC_LEN > SLOT || total > usize::from(u16::MAX) {
            return false;
        }
        self.meta[self.n] = (total as u16, dst);
        self.ext[self.n] = External {
            head: head as u16,
            addr,
            len: len as u32,
        };
        self.n += 1;
        self.external_packets += 1;
        true
    }

    /// Seals packet `i` for IP ID `ident`.
    fn seal(&mut self, i: usize, ident: u16) {
        let (len, dst) = self.meta[i];
        let mut ip = Ipv4Header::plain_udp_socket(self.local.ip().octets(), dst.ip().octets());
        ip.ident = ident;
        let ports = UdpPorts {
            src: self.local.port(),
            dst: dst.port(),
        };
        let at = i * SLOT;
        let e = self.ext[i];
        if e.len > 0 {
            let head = usize::from(e.head);
            // SAFETY: `commit_external`'s contract: memory no peer may
            // write, alive and unchanged until the batch has left.
            let payload =
                unsafe { std::slice::from_raw_parts(e.addr as *const u8, e.len as usize) };
            if let Ok(v) = icrc::compute_ipv4_parts(&ip, ports, &self.buf[at..at + head], payload) {
                self.buf[at + head..at + head + ICRC_LEN].copy_from_slice(&v.to_le_bytes());
            }
            return;
        }
        // Cannot fail: `commit` only queues lengths sealing accepts.
        let _ = icrc::seal_ipv4(&ip, ports, &mut self.buf[at..at + len as usize]);
    }

    /// Where the run of packets starting at `i` that can leave as one
    /// send ends (exclusive): all the same size to the same destination,
    /// the last possibly shorter, within the kernel's GSO limits.
    fn run_end(&self, i: usize) -> usize {
        let (seg, dst) = self.meta[i];
        let mut j = i + 1;
        // Only on a device that sends GSO (`Device::at`): loopback ones,
        // where the kernel never segments a GSO send onto a wire (our own
        // GRO socket takes it whole; a socket without GRO gets it
        // segmented by the receiving stack), and others with `gso=all`.
        if !self.gso {
            return j;
        }
        let mut total = seg as usize;
        while j < self.n
            && j - i < GSO_MAX_SEGMENTS
            && self.meta[j].1 == dst
            && self.meta[j - 1].0 == seg
            && self.meta[j].0 <= seg
            && total + self.meta[j].0 as usize <= GSO_MAX_BYTES
        {
            total += self.meta[j].0 as usize;
            j += 1;
        }
        j
    }

    /// Sends the batch. Packets the kernel refuses (full socket buffer)
    /// are lost, exactly as on a congested link: the transport retries.
    pub fn flush(&mut self) {
        // Runs: (first, end) packet indices, each one `msghdr`.
        let mut runs = [(0u16, 0u16); TX_BATCH];
        let mut nruns = 0;
        let mut i = 0;
        while i < self.n {
            let j = self.run_end(i);
            for k in i..j {
                self.seal(k, (k - i) as u16);
            }
            runs[nruns] = (i as u16, j as u16);
            nruns += 1;
            i = j;
        }
        let mut off = 0;
        while off < nruns {
            let cnt = nruns - off;
            let m = &mut *self.msgs;
            let mut used = 0;
            for r in 0..cnt {
                let (a, b) = runs[off + r];
                let (a, b) = (a as usize, b as usize);
                let (seg, dst) = self.meta[a];
                m.addrs[r] = sockaddr(dst);
                let first = used;
                for k in a..b {
                    used += packet_iovecs(&self.buf, &self.meta, &self.ext, k, &mut m.iov[used..]);
                }
                let h = &mut m.hdrs[r].msg_hdr;
                h.msg_name = &mut m.addrs[r] as *mut _ as *mut libc::c_void;
                h.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
                h.msg_iov = &mut m.iov[first];
                h.msg_iovlen = used - first;
                h.msg_flags = 0;
                h.msg_control = std::ptr::null_mut();
                h.msg_controllen = 0;
                if b - a > 1 {
                    // SAFETY: the buffer is CMSG_SPACE(2) bytes or more and
                    // aligned; CMSG_FIRSTHDR of a msghdr whose control
                    // length covers it is in bounds.
                    unsafe {
                        let space = libc::CMSG_SPACE(2) as usize;
                        h.msg_control = m.cmsgs[r].as_mut_ptr() as *mut libc::c_void;
                        h.msg_controllen = space;
                        let c = libc::CMSG_FIRSTHDR(h);
                        (*c).cmsg_level = libc::SOL_UDP;
                        (*c).cmsg_type = libc::UDP_SEGMENT;
                        (*c).cmsg_len = libc::CMSG_LEN(2) as usize;
                        std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut u16, seg);
                    }
                }
            }
            // SAFETY: `hdrs[..cnt]` were written above; every pointer in
            // them points into `self.buf`, the header box or memory
            // `commit_external` vouched for, all alive for the call.
            let r = unsafe {
                libc::sendmmsg(
                    self.fd.as_raw_fd(),
                    m.hdrs.as_mut_ptr(),
                    cnt as libc::c_uint,
                    libc::MSG_DONTWAIT,
                )
            };
            if r > 0 {
                for &(a, b) in &runs[off..off + r as usize] {
                    if b - a > 1 {
                        self.gso_sends += 1;
                        self.gso_packets += u64::from(b - a);
                    }
                }
                off += r as usize;
                continue;
            }
            let e = std::io::Error::last_os_error();
            let code = e.raw_os_error();
            if code == Some(libc::EINTR) {
                continue;
            }
            let (a, b) = runs[off];
            if b - a > 1 && code != Some(libc::EAGAIN) {
                // The kernel refused the GSO send itself (no
                // `UDP_SEGMENT`, or segments the route cannot carry):
                // stop using it, and send this run's packets one by one,
                // sealed for a lone packet's IP ID 0, so a size problem
                // shows as the EMSGSIZE counted below.
                self.gso = false;
                for k in a..b {
                    self.seal(k as usize, 0);
                }
                let (first, end) = (a as usize, b as usize);
                for k in first..end {
                    self.send_one(k);
                }
                off += 1;
                continue;
            }
            // EAGAIN (buffer full), ECONNREFUSED from an earlier ICMP,
            // EMSGSIZE...: skip the head run and go on (the transport
            // retransmits); count EMSGSIZE, which no retry can cure (MTU
            // above the route's, see docs/ROCE.md).
            if code == Some(libc::EMSGSIZE) {
                self.oversized.fetch_add(1, Ordering::Relaxed);
            }
            off += 1;
        }
        self.n = 0;
    }

    /// Sends packet `i` alone (the fallback of a refused GSO send).
    fn send_one(&mut self, i: usize) {
        let (_, dst) = self.meta[i];
        let mut sa = sockaddr(dst);
        // SAFETY: zeroed iovecs and msghdr are valid initial values.
        let mut iov: [libc::iovec; 3] = unsafe { std::mem::zeroed() };
        let n = packet_iovecs(&self.buf, &self.meta, &self.ext, i, &mut iov);
        // SAFETY: as above.
        let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
        h.msg_name = &mut sa as *mut _ as *mut libc::c_void;
        h.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        h.msg_iov = iov.as_mut_ptr();
        h.msg_iovlen = n;
        loop {
            // SAFETY: the iovecs point into `self.buf` and at memory
            // `commit_external` vouched for; a valid sockaddr_in.
            let r = unsafe { libc::sendmsg(self.fd.as_raw_fd(), &h, libc::MSG_DONTWAIT) };
            if r >= 0 {
                return;
            }
            match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EMSGSIZE) => {
                    self.oversized.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                _ => return,
            }
        }
    }
}

/// The iovecs of packet `i` of a transmit batch into `out` (one, or
/// three for a packet with an external payload); returns how many.
fn packet_iovecs(
    buf: &[u8],
    meta: &[(u16, SocketAddrV4)],
    ext: &[External],
    i: usize,
    out: &mut [libc::iovec],
) -> usize {
    let (len, _) = meta[i];
    let e = ext[i];
    // The kernel only reads through these pointers (`sendmsg`).
    let slot = buf[i * SLOT..].as_ptr() as *mut u8;
    if e.len == 0 {
        out[0] = libc::iovec {
            iov_base: slot as *mut libc::c_void,
            iov_len: len as usize,
        };
        return 1;
    }
    let head = usize::from(e.head);
    out[0] = libc::iovec {
        iov_base: slot as *mut libc::c_void,
        iov_len: head,
    };
    out[1] = libc::iovec {
        iov_base: e.addr as *mut libc::c_void,
        iov_len: e.len as usize,
    };
    out[2] = libc::iovec {
        // SAFETY: head + ICRC_LEN <= SLOT (`commit_external`).
        iov_base: unsafe { slot.add(head) } as *mut libc::c_void,
        iov_len: ICRC_LEN,
    };
    3
}

/// The C headers of one `sendmmsg`/`recvmmsg` batch of `N` datagrams
/// with up to `V` iovecs, boxed so that the pointers between them (and
/// into the batch's buffer, also on the heap) stay valid wherever the
/// batch moves.
struct MsgHeaders<const N: usize, const V: usize> {
    addrs: [libc::sockaddr_in; N],
    iov: [libc::iovec; V],
    hdrs: [libc::mmsghdr; N],
    cmsgs: [[u64; CMSG_WORDS]; N],
}

// SAFETY: the raw pointers inside point only into memory owned by the
// batch that owns the box (its buffer, the box itself) or, during a
// `sendmmsg`, memory its caller vouched for; they are used only by the
// thread holding the batch (`&mut`), and moving the batch to another
// thread moves that memory with it.
unsafe impl<const N: usize, const V: usize> Send for MsgHeaders<N, V> {}

impl<const N: usize, const V: usize> MsgHeaders<N, V> {
    fn boxed() -> Box<Self> {
        // SAFETY: all-zero sockaddr_in, iovec, mmsghdr and integer arrays
        // are valid values (null pointers, zero lengths).
        Box::new(unsafe { std::mem::zeroed() })
    }
}

/// One packet of a receive batch: where it is in the batch's buffer,
/// which datagram it came in, and its index among that datagram's GRO
/// segments.
#[derive(Debug, Clone, Copy, Default)]
struct RxPacket {
    at: u32,
    len: u16,
    datagram: u16,
    segment: u16,
}

/// The receive side: one `recvmmsg` batch (the device's one, reading its
/// socket for every shard and the connection manager).
///
/// With UDP GRO on the socket the kernel may hand over several packets
/// of one sender coalesced into one datagram, with their segment size in
/// a `UDP_GRO` control message (a GSO send on loopback or a veth arrives
/// that way, never segmented); they are split here, so every consumer
/// still sees one RoCE packet at a time.
pub(super) struct Rx {
    buf: Box<[u8]>,
    /// Bytes per datagram buffer: [`GRO_SLOT`] with GRO, else [`SLOT`].
    slot: usize,
    srcs: [SocketAddrV4; RX_BATCH],
    pkts: Vec<RxPacket>,
    /// Whether the last `recvmmsg` filled every datagram buffer (more may
    /// be queued).
    pub full: bool,
    /// The `recvmmsg` headers, set up once: the kernel writes back only
    /// each datagram's address length, control length, flags and length,
    /// so a call resets those of the entries the previous call used
    /// (`dirty`), not the whole arrays: an empty poll, the common case of
    /// a spinning thread, then costs little besides the system call.
    msgs: Box<MsgHeaders<RX_BATCH, RX_BATCH>>,
    dirty: usize,
}

impl Rx {
    pub fn new(gro: bool) -> Rx {
        let slot = if gro { GRO_SLOT } else { SLOT };
        let mut rx = Rx {
            buf: vec![0u8; slot * RX_BATCH].into_boxed_slice(),
            slot,
            srcs: [SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0); RX_BATCH],
            // The most packets one batch splits into (a coalesced
            // datagram holds at most the kernel's 64 segments).
            pkts: Vec::with_capacity(RX_BATCH * GSO_MAX_SEGMENTS),
            full: false,
            msgs: MsgHeaders::boxed(),
            dirty: 0,
        };
        let m = &mut *rx.msgs;
        for i in 0..RX_BATCH {
            m.iov[i] = libc::iovec {
                iov_base: rx.buf[i * slot..].as_mut_ptr() as *mut libc::c_void,
                iov_len: slot,
            };
            let h = &mut m.hdrs[i].msg_hdr;
            h.msg_name = &mut m.addrs[i] as *mut _ as *mut libc::c_void;
            h.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            h.msg_iov = &mut m.iov[i];
            h.msg_iovlen = 1;
            h.msg_control = m.cmsgs[i].as_mut_ptr() as *mut libc::c_void;
            h.msg_controllen = CMSG_WORDS * 8;
        }
        rx
    }

    /// Packet `i` of the last batch.
    pub fn packet(&self, i: usize) -> &[u8] {
        let p = self.pkts[i];
        &self.buf[p.at as usize..p.at as usize + p.len as usize]
    }

    /// Who sent packet `i`.
    pub fn src(&self, i: usize) -> SocketAddrV4 {
        self.srcs[self.pkts[i].datagram as usize]
    }

    /// Packet `i`'s index among the GRO segments of its datagram (0 for a
    /// datagram that was not coalesced).
    pub fn segment(&self, i: usize) -> u16 {
        self.pkts[i].segment
    }

    /// Receives up to [`RX_BATCH`] datagrams without blocking; returns how
    /// many packets they hold (0 when none is queued). Truncated
    /// datagrams, and packets larger than a slot, are dropped.
    pub fn recv(&mut self, fd: i32) -> usize {
        let m = &mut *self.msgs;
        for h in &mut m.hdrs[..self.dirty] {
            h.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            h.msg_hdr.msg_controllen = CMSG_WORDS * 8;
            h.msg_hdr.msg_flags = 0;
            h.msg_len = 0;
        }
        // SAFETY: the headers were set up by `new` (pointers into
        // `self.buf` and the header box, both on the heap and alive as
        // long as `self`) and their written-back fields reset above; null
        // timeout with MSG_DONTWAIT.
        let r = unsafe {
            libc::recvmmsg(
                fd,
                m.hdrs.as_mut_ptr(),
                RX_BATCH as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        let n = if r < 0 { 0 } else { r as usize };
        // A failed call writes nothing back; entry 0 is reset anyway.
        self.dirty = n.max(1);
        self.pkts.clear();
        for (d, hdr) in m.hdrs.iter().enumerate().take(n) {
            self.srcs[d] = from_sockaddr(&m.addrs[d]);
            if hdr.msg_hdr.msg_flags & libc::MSG_TRUNC != 0 {
                continue;
            }
            let len = hdr.msg_len as usize;
            let seg = gro_segment(&hdr.msg_hdr).unwrap_or(len).max(1);
            if seg > SLOT {
                continue;
            }
            let mut at = 0;
            let mut k = 0u16;
            while at < len && self.pkts.len() < self.pkts.capacity() {
                let l = seg.min(len - at);
                self.pkts.push(RxPacket {
                    at: (d * self.slot + at) as u32,
                    len: l as u16,
                    datagram: d as u16,
                    segment: k,
                });
                at += l;
                k = k.wrapping_add(1);
            }
        }
        self.full = n == RX_BATCH;
        self.pkts.len()
    }
}

/// The segment size of a coalesced datagram, from its `UDP_GRO` control
/// message.
fn gro_segment(h: &libc::msghdr) -> Option<usize> {
    if h.msg_controllen == 0 || h.msg_control.is_null() {
        return None;
    }
    // SAFETY: the kernel filled `msg_control` up to `msg_controllen`;
    // CMSG_FIRSTHDR/NXTHDR stay within it and CMSG_DATA of a UDP_GRO
    // message holds an int.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(h);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_UDP && (*c).cmsg_type == libc::UDP_GRO {
                let v = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::c_int);
                return (v > 0).then_some(v as usize);
            }
            c = libc::CMSG_NXTHDR(h, c);
        }
    }
    None
}
