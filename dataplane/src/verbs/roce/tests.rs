//! The roce provider against a hand-written peer: a plain UDP socket that
//! speaks IB CM and RC transport through the `wire` codecs, the way an rxe
//! peer would. It checks what the provider puts on the wire (REQ fields,
//! starting PSNs the right way round, ICRC, retransmissions, DREQ) and how
//! its responder answers (ACK with MSN, PSN wrap, sequence-error NAK once,
//! duplicate RDMA Read replay, remote access NAK).
use std::net::{IpAddr, Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU32, Ordering as AtOrd};
use std::time::{Duration, Instant};

use super::cm::{cm_path, trim_private, CM_RETRY, REP_RETRIES};
use super::qp::idle;
use super::random::FAIL_RANDOM;
use super::*;
use crate::mem::{Arena, Slab, WrKind};
use crate::verbs::*;
use crate::wire::ibcm::{
    self, gsi_packet, ipv4_mapped_gid, CmMad, CmMessage, CmPath, CommIds, RdmaCmHeader, Rep, Req,
    MAD_LEN, RDMA_CM_HEADER_LEN,
};
use crate::wire::roce::icrc::{Ipv4Header, UdpPorts};
use crate::wire::roce::seg::Mtu;
use crate::wire::roce::{icrc, Bth, NakCode, Opcode, Packet, Psn, Reth, RocePacket, Syndrome};

const LONG: Duration = Duration::from_secs(20);
/// The fake peer's QPN and the PSN it announces (two before the wrap).
const FAKE_QPN: u32 = 0x22;
const FAKE_PSN: u32 = 0xFF_FFFE;
const UDP: u16 = 47_931;

static SEQ: AtomicU32 = AtomicU32::new(0);

/// (provider address, fake peer address), unique per test in this process.
fn addrs() -> (Ipv4Addr, Ipv4Addr) {
    let pid = std::process::id() & 0xFFFF;
    let seq = SEQ.fetch_add(1, AtOrd::Relaxed);
    (
        Ipv4Addr::from(0x7F01_0000 | pid),
        Ipv4Addr::from(0x7F00_0000 | ((2 + seq) << 16) | pid),
    )
}

struct Fake {
    sock: UdpSocket,
    me: SocketAddrV4,
    peer: SocketAddrV4,
    gsi_psn: Psn,
}

impl Fake {
    fn new(me: Ipv4Addr, peer: Ipv4Addr) -> Fake {
        let sock = UdpSocket::bind((me, UDP)).unwrap();
        // DF and IP ID 0, like the provider (our ICRCs assume it).
        let v: i32 = libc::IP_PMTUDISC_DO;
        // SAFETY: valid fd, pointer to an i32.
        unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                &v as *const i32 as *const libc::c_void,
                4,
            )
        };
        sock.set_read_timeout(Some(LONG)).unwrap();
        Fake {
            sock,
            me: SocketAddrV4::new(me, UDP),
            peer: SocketAddrV4::new(peer, UDP),
            gsi_psn: Psn::default(),
        }
    }

    /// The next datagram, its ICRC checked as the provider computes it.
    fn recv(&self) -> Vec<u8> {
        let mut b = vec![0u8; 9000];
        let (n, from) = self.sock.recv_from(&mut b).expect("peer went silent");
        b.truncate(n);
        let ip = Ipv4Header::plain_udp_socket(
            match from.ip() {
                IpAddr::V4(v) => v.octets(),
                IpAddr::V6(_) => panic!("v6"),
            },
            self.me.ip().octets(),
        );
        let ports = UdpPorts {
            src: from.port(),
            dst: UDP,
        };
        let want = Packet::new_checked(&b[..]).unwrap().icrc();
        // A plain socket sees no IP header. The provider seals a lone
        // packet for IP ID 0 and segment k of a GSO send for ID k, which
        // the kernel's segmentation gives it (this socket has no GRO, so
        // loopback segments before delivering).
        let mut ip = ip;
        let ok = (0..64u16).any(|id| {
            ip.ident = id;
            icrc::compute_ipv4(&ip, ports, &b).unwrap() == want
        });
        assert!(ok, "ICRC");
        b
    }

    /// The next packet that is not a CM MAD.
    fn recv_rc(&self) -> Vec<u8> {
        loop {
            let b = self.recv();
            let p = RocePacket::parse(&b).unwrap();
            if p.bth.dest_qpn != ibcm::GSI_QPN {
                return b;
            }
        }
    }

    fn recv_mad(&self) -> Vec<u8> {
        loop {
            let b = self.recv();
            let p = RocePacket::parse(&b).unwrap();
            if p.bth.dest_qpn == ibcm::GSI_QPN {
                return p.payload.to_vec();
            }
        }
    }

    fn send(&self, p: &RocePacket<'_>) {
        let mut b = vec![0u8; p.buffer_len()];
        p.emit(&mut b).unwrap();
        let ip = Ipv4Header::plain_udp_socket(self.me.ip().octets(), self.peer.ip().octets());
        let ports = UdpPorts {
            src: self.me.port(),
            dst: UDP,
        };
        icrc::seal_ipv4(&ip, ports, &mut b).unwrap();
        self.sock.send_to(&b, self.peer).unwrap();
    }

    fn send_mad(&mut self, m: &CmMad<'_>) {
        let mut mad = [0u8; MAD_LEN];
        m.emit(&mut mad).unwrap();
        self.send_raw_mad(&mad);
    }

    /// A MAD laid out byte by byte by the test, not by our encoder.
    fn send_raw_mad(&mut self, mad: &[u8; MAD_LEN]) {
        let psn = self.gsi_psn;
        self.gsi_psn = psn.next();
        self.send(&gsi_packet(psn, mad));
    }
}

/// The provider side: a context, memory and a QP, connected by a thread.
struct Side {
    qp: RoceQp,
    cq: RoceCq,
    mr: RoceMr,
    local: Slab,
    _recv: Slab,
    _mrs: Vec<RoceMr>,
    _pd: RocePd,
    _ctx: RoceContext,
}

impl Side {
    /// Posts a Send of `data` from the side's send slab.
    fn send(&mut self, data: &[u8]) {
        let mut b = self.local.alloc().unwrap();
        assert!(b.fill(data));
        self.qp
            .post_send(SendWr::new(
                b.wr_id(),
                SendOp::Send,
                SgeList::one(Sge::data(b)),
            ))
            .unwrap();
    }
}

fn side(url: &str, peer_private: &'static [u8]) -> std::thread::JoinHandle<Side> {
    let url = url.to_owned();
    std::thread::spawn(move || {
        let ctx = Roce::open(&url).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(64).unwrap();
        let arena = Arena::with_backing(1 << 20, crate::mem::Backing::Small).unwrap();
        let rdma = Arena::with_backing(1 << 16, crate::mem::Backing::Small).unwrap();
        let lw = Access::LOCAL_WRITE;
        let m1 = pd.register(&arena, 0, 1 << 19, lw).unwrap();
        let m2 = pd.register(&arena, 1 << 19, 1 << 19, lw).unwrap();
        let mr = pd
            .register(
                &rdma,
                0,
                1 << 16,
                lw | Access::REMOTE_READ | Access::REMOTE_WRITE,
            )
            .unwrap();
        // SAFETY: the arena is ours and not shared; fill the exposed region.
        unsafe {
            for i in 0..(1 << 16) {
                *rdma.as_ptr().add(i) = (i * 7 % 251) as u8;
            }
        }
        let recv = Slab::new(arena.clone(), 0, 8192, 64, m1.lkey(), WrKind::Recv).unwrap();
        let local = Slab::new(arena, 1 << 19, 8192, 64, m2.lkey(), WrKind::Send).unwrap();
        let caps = QpCaps {
            rnr_retry: 7,
            ..QpCaps::default()
        };
        let mut pqp = pd.create_qp(&cq, &cq, caps).unwrap();
        for _ in 0..4 {
            let b = recv.alloc().unwrap();
            pqp.post_recv(RecvWr {
                wr_id: b.wr_id(),
                sgl: SgeList::one(Sge::whole(b)),
            })
            .unwrap();
        }
        let (qp, pd_bytes) = pqp.connect(&url, b"hello", LONG).unwrap();
        assert_eq!(pd_bytes, peer_private);
        Side {
            qp,
            cq,
            mr,
            local,
            _recv: recv,
            _mrs: vec![m1, m2],
            _pd: pd,
            _ctx: ctx,
        }
    })
}

fn next_completion(cq: &RoceCq) -> Completion {
    let deadline = Instant::now() + LONG;
    let mut out = [Completion::default()];
    let mut n = 0u32;
    loop {
        if cq.poll(&mut out) == 1 {
            return std::mem::take(&mut out[0]);
        }
        assert!(Instant::now() < deadline, "no completion");
        n += 1;
        idle(n);
    }
}

/// Runs the CM exchange as an rdma_cm passive peer; returns the REQ's
/// starting PSN and the provider's QPN.
fn accept_as_fake(fake: &mut Fake, provider_ip: Ipv4Addr, fake_ip: Ipv4Addr) -> (u32, u32) {
    // No `mtu` option: the REQ announces what the route's link (lo)
    // carries.
    accept_as_fake_at(fake, provider_ip, fake_ip, lo_path_mtu())
}

/// [`accept_as_fake`] for a provider whose REQ must announce `mtu`.
fn accept_as_fake_at(
    fake: &mut Fake,
    provider_ip: Ipv4Addr,
    fake_ip: Ipv4Addr,
    mtu: Mtu,
) -> (u32, u32) {
    let mad = fake.recv_mad();
    let m = CmMad::parse(&mad).unwrap();
    let CmMessage::Req(req) = m.message else {
        panic!("expected REQ, got {:?}", m.message)
    };
    assert_eq!(ibcm::tcp_port_of_service_id(req.service_id), Some(7000));
    assert!(req.local_qpn > 1, "never QPN 0 or 1");
    assert!(req.initiator_depth >= 1 && req.responder_resources >= 1);
    assert_eq!(req.transport_type, 0);
    assert_eq!(req.path_mtu, mtu);
    assert_eq!(req.primary_path.local_gid, ipv4_mapped_gid(provider_ip));
    assert_eq!(req.primary_path.remote_gid, ipv4_mapped_gid(fake_ip));
    let (hdr, user) = RdmaCmHeader::parse(req.private_data).unwrap();
    assert_eq!(hdr.src, IpAddr::V4(provider_ip));
    assert_eq!(hdr.dst, IpAddr::V4(fake_ip));
    assert_eq!(&user[..5], b"hello");
    assert!(user[5..].iter().all(|&b| b == 0));
    let rep = Rep {
        local_comm_id: 0x77,
        remote_comm_id: req.local_comm_id,
        local_qkey: 0,
        local_qpn: FAKE_QPN,
        local_eecn: 0,
        starting_psn: Psn::new(FAKE_PSN).unwrap(),
        responder_resources: 1,
        initiator_depth: 1,
        target_ack_delay: 15,
        failover_accepted: 0,
        end_to_end_flow_control: false,
        rnr_retry_count: 7,
        srq: false,
        local_ca_guid: 1,
        private_data: b"world",
    };
    fake.send_mad(&CmMad::new(m.tid, CmMessage::Rep(rep)));
    let rtu = fake.recv_mad();
    let m2 = CmMad::parse(&rtu).unwrap();
    let CmMessage::Rtu(ids) = m2.message else {
        panic!("expected RTU")
    };
    assert_eq!(
        (ids.local_comm_id, ids.remote_comm_id),
        (req.local_comm_id, 0x77)
    );
    (req.starting_psn.value(), req.local_qpn)
}

/// The direction of the CM's Starting PSN, checked against bytes laid out
/// as Linux's CM (`cm_format_rep` in `drivers/infiniband/core/cm.c`) puts
/// them on the wire, not through our own CM encoder: a REP's Starting PSN
/// is the PSN its sender expects first, so our first Send carries it; and
/// our REQ's Starting PSN is the PSN we expect, so the peer's first Send
/// at that PSN is accepted and ACKed. Both of our sides once read it the
/// other way round, agreed with each other, and a Linux rxe peer NAKed the
/// first Send of either with "PSN sequence error".
#[test]
fn the_starting_psn_is_what_its_sender_expects() {
    let (pip, fip) = addrs();
    let mut fake = Fake::new(fip, pip);
    let t = side(&url(fip, pip, ""), b"world");
    let raw_req = fake.recv_mad();
    let m = CmMad::parse(&raw_req).unwrap();
    let CmMessage::Req(req) = m.message else {
        panic!("expected REQ, got {:?}", m.message)
    };
    // REQ: Starting PSN in bytes 44..47 of the CM data (after the 24-byte
    // MAD header), the top 24 bits of that big-endian word.
    let d = &raw_req[24..];
    let req_psn = u32::from_be_bytes([0, d[44], d[45], d[46]]);
    assert_eq!(req_psn, req.starting_psn.value());
    let req_comm_id = u32::from_be_bytes([d[0], d[1], d[2], d[3]]);
    let req_qpn = u32::from_be_bytes([0, d[32], d[33], d[34]]);
    assert_eq!(req_qpn, req.local_qpn);

    // REP, byte by byte. MAD header: base version 1, class CM (7), class
    // version 2, method Send (3), status 0, TID echoed, attribute REP
    // (0x0013), modifier 0.
    const REP_PSN: u32 = 0x12_3456;
    let mut rep = [0u8; MAD_LEN];
    rep[..4].copy_from_slice(&[1, 0x07, 2, 0x03]);
    rep[8..16].copy_from_slice(&raw_req[8..16]);
    rep[16..18].copy_from_slice(&0x0013u16.to_be_bytes());
    let r = &mut rep[24..];
    r[0..4].copy_from_slice(&0x77u32.to_be_bytes()); // local comm id
    r[4..8].copy_from_slice(&req_comm_id.to_be_bytes()); // remote comm id
    r[12..15].copy_from_slice(&FAKE_QPN.to_be_bytes()[1..]); // local QPN
    r[20..23].copy_from_slice(&REP_PSN.to_be_bytes()[1..]); // starting PSN
    r[24] = 1; // responder resources
    r[25] = 1; // initiator depth
    r[26] = 15 << 3; // target ACK delay
    r[27] = 7 << 5; // RNR retry count
    r[28..36].copy_from_slice(&1u64.to_be_bytes()); // local CA GUID
    r[36..41].copy_from_slice(b"world"); // private data
    fake.send_raw_mad(&rep);
    let rtu = fake.recv_mad();
    assert!(matches!(
        CmMad::parse(&rtu).unwrap().message,
        CmMessage::Rtu(_)
    ));
    let mut s = t.join().unwrap();

    // Our first Send goes out at the REP's Starting PSN.
    s.send(b"first");
    let raw = fake.recv_rc();
    let p = RocePacket::parse(&raw).unwrap();
    assert_eq!(
        (p.bth.opcode, p.bth.dest_qpn),
        (Opcode::RcSendOnly, FAKE_QPN)
    );
    assert_eq!(p.bth.psn.value(), REP_PSN, "our first Send's PSN");
    fake_ack(&fake, req_qpn, REP_PSN, Syndrome::ACK, 1);
    let c = next_completion(&s.cq);
    assert!(c.is_ok(), "{:?} {:?}", c.opcode, c.status);

    // The peer's first Send comes at our REQ's Starting PSN: accepted,
    // delivered, ACKed at that PSN (not a sequence-error NAK).
    let mut bth = Bth::new(Opcode::RcSendOnly, req_qpn, Psn::new(req_psn).unwrap());
    bth.ack_req = true;
    fake.send(&RocePacket::new(bth, b"from linux"));
    let (apsn, syn, msn) = ack_of(&fake.recv_rc());
    assert_eq!((apsn.value(), syn, msn), (req_psn, Syndrome::ACK, 1));
}

/// The path MTU loopback's link MTU gives (4096 for the usual 65536).
fn lo_path_mtu() -> Mtu {
    let lo: u32 = std::fs::read_to_string("/sys/class/net/lo/mtu")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    super::io::mtu_for_link(lo)
}

#[test]
fn the_path_mtu_follows_the_link_as_rxe_derives_it() {
    use super::io::{mtu_for_link, path_mtu};
    // rxe: the netdev's MTU less its 80-byte header allowance, rounded
    // down to an IB MTU, at most 4096.
    assert_eq!(mtu_for_link(1500), Mtu::Mtu1024);
    assert_eq!(mtu_for_link(9000), Mtu::Mtu4096);
    assert_eq!(mtu_for_link(65536), Mtu::Mtu4096);
    assert_eq!(mtu_for_link(4096 + 80), Mtu::Mtu4096);
    assert_eq!(mtu_for_link(4096 + 79), Mtu::Mtu2048);
    assert_eq!(mtu_for_link(1024 + 80), Mtu::Mtu1024);
    assert_eq!(mtu_for_link(576), Mtu::Mtu256);
    assert_eq!(mtu_for_link(0), Mtu::Mtu256);
    assert_eq!(path_mtu(Ipv4Addr::LOCALHOST, UDP), Some(lo_path_mtu()));
    // Configured wins over the link.
    let (_, c) = parse_url("roce://127.0.0.1:1?mtu=512", RoceConfig::default()).unwrap();
    assert_eq!(c.mtu_toward(Ipv4Addr::LOCALHOST), Mtu::Mtu512);
    let (_, c) = parse_url("roce://127.0.0.1:1", RoceConfig::default()).unwrap();
    assert_eq!(c.mtu_toward(Ipv4Addr::LOCALHOST), lo_path_mtu());
}

fn url(fake_ip: Ipv4Addr, provider_ip: Ipv4Addr, extra: &str) -> String {
    format!("roce://{fake_ip}:7000?udp_port={UDP}&local={provider_ip}&verify_icrc=1{extra}")
}

/// A provider side connected to a fake peer on a device of its own
/// (`idle_ms` is the first opener's, and the other tests of this process
/// share the common device's address), whose thread stays away from the
/// shard for ten minutes (`idle_ms`): only the test's own polls drive it.
/// Returns the fake, the side, and the PSN and QPN the fake sends to.
fn alone_with_fake() -> (Fake, Side, u32, u32) {
    let ((_, pip), (_, fip)) = (addrs(), addrs());
    let mut fake = Fake::new(fip, pip);
    let t = side(&url(fip, pip, "&idle_ms=600000"), b"world");
    let (req_psn, qpn) = accept_as_fake(&mut fake, pip, fip);
    (fake, t.join().unwrap(), req_psn, qpn)
}

/// The ACK of a Send the application polled is held to its next step and
/// leaves right behind the answer that step posts: the answer first (what
/// the peer waits for), then the ACK, which toward loopback rides in the
/// answer's GSO send (docs/ROCE.md, "RC transport"). The device's thread
/// is kept away (`idle_ms`), so only the polling thread sends.
#[test]
fn a_held_ack_leaves_right_behind_the_answer() {
    let (fake, mut s, req_psn, qpn) = alone_with_fake();
    let mut bth = Bth::new(Opcode::RcSendOnly, qpn, Psn::new(req_psn).unwrap());
    bth.ack_req = true;
    fake.send(&RocePacket::new(bth, b"call"));
    let c = next_completion(&s.cq);
    assert!(c.is_ok());
    assert_eq!(c.sgl.iter().next().unwrap().buf.to_vec(), b"call");
    drop(c);
    s.send(b"reply");
    let raw = fake.recv_rc();
    let p = RocePacket::parse(&raw).unwrap();
    assert_eq!(
        (p.bth.opcode, p.payload),
        (Opcode::RcSendOnly, &b"reply"[..]),
        "the answer leaves first"
    );
    let (apsn, syn, msn) = ack_of(&fake.recv_rc());
    assert_eq!((apsn.value(), syn, msn), (req_psn, Syndrome::ACK, 1));
}

/// A thread that goes to sleep after the poll that took a Send sends the
/// ACK it held for its next step then (`CompletionQueue::before_sleep`):
/// the ACK does not wait for the device's thread (kept away here by
/// `idle_ms`), nor the peer for its tail probe.
#[test]
fn before_sleep_sends_the_held_ack() {
    let (fake, s, req_psn, qpn) = alone_with_fake();
    let mut bth = Bth::new(Opcode::RcSendOnly, qpn, Psn::new(req_psn).unwrap());
    bth.ack_req = true;
    fake.send(&RocePacket::new(bth, b"call"));
    drop(next_completion(&s.cq));
    // Held: the poll's step sent nothing (loopback delivers within the
    // send, so anything it sent would be queued already).
    fake.sock.set_nonblocking(true).unwrap();
    assert!(fake.sock.recv_from(&mut [0u8; 64]).is_err(), "ACK not held");
    fake.sock.set_nonblocking(false).unwrap();
    s.cq.before_sleep();
    let (apsn, syn, msn) = ack_of(&fake.recv_rc());
    assert_eq!((apsn.value(), syn, msn), (req_psn, Syndrome::ACK, 1));
}

/// A sleeper waits on the device's socket only while no thread drives
/// any of the device's shards (`CompletionQueue::watch_also`): after
/// `before_sleep` handed the only shard to the device's thread, the
/// socket is offered, and a packet on it makes it readable; while a
/// thread polls the shard, it is not (that thread reads the socket, and
/// a sleeper there would wake for each of its datagrams).
#[test]
fn a_sleeper_watches_the_device_socket_only_while_nobody_drives_it() {
    use std::os::fd::RawFd;
    let (fake, s, req_psn, qpn) = alone_with_fake();
    let watched = |cq: &RoceCq| {
        let mut fds: Vec<RawFd> = Vec::new();
        cq.watch_also(&mut |fd| fds.push(fd));
        fds
    };
    // Driven: the poll of `accept` just ran.
    assert!(s.cq.poll(&mut []) == 0);
    assert!(
        watched(&s.cq).is_empty(),
        "offered while a thread drives it"
    );
    s.cq.before_sleep();
    let fds = watched(&s.cq);
    assert_eq!(fds.len(), 1, "the socket of the sleeper's device");
    let mut pfd = [crate::wake::pollfd(fds[0])];
    // The device's thread, now the shard's driver, would read the packet
    // as soon as it arrives; holding the shard keeps it off (it only
    // `try_lock`s a shard, and reads the socket for no one else), so the
    // packet stays in the socket for the look below.
    let held = lock(&s.qp.shard.state);
    let mut bth = Bth::new(Opcode::RcSendOnly, qpn, Psn::new(req_psn).unwrap());
    bth.ack_req = true;
    fake.send(&RocePacket::new(bth, b"call"));
    assert!(
        crate::wake::sleep_on(&mut pfd, Duration::from_secs(30)),
        "broken: a packet did not make the watched socket readable"
    );
    drop(held);
    // The poll after the sleep (or the device's thread) reads it, and the
    // Send completes.
    let c = next_completion(&s.cq);
    assert_eq!(c.sgl.iter().next().unwrap().buf.to_vec(), b"call");
    drop(c);
    assert!(watched(&s.cq).is_empty(), "driven again");
}

/// A Send from memory no peer may write leaves without a copy into the
/// transmit slot (headers and ICRC in the slot, the payload gathered by
/// the kernel from where it lies), and the peer gets the same packets
/// with valid ICRCs (`Fake::recv` checks each). From memory registered
/// `REMOTE_WRITE` the payload is copied as before.
#[test]
fn a_payload_no_peer_may_write_leaves_from_where_it_lies() {
    let ((_, pip), (_, fip)) = (addrs(), addrs());
    let mut fake = Fake::new(fip, pip);
    let t = side(&url(fip, pip, ""), b"world");
    let (_, qpn) = accept_as_fake(&mut fake, pip, fip);
    let mut s = t.join().unwrap();
    let external = |s: &Side| lock(&s.qp.shard.state).tx.external_packets;
    let receive = |fake: &Fake, len: usize| {
        let (mut got, mut last) = (Vec::new(), 0);
        while got.len() < len {
            let raw = fake.recv_rc();
            let p = RocePacket::parse(&raw).unwrap();
            got.extend_from_slice(p.payload);
            last = p.bth.psn.value();
        }
        (got, last)
    };
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 13 % 251) as u8).collect();
    let before = external(&s);
    s.send(&data);
    let (got, last) = receive(&fake, data.len());
    assert_eq!(got, data);
    // Two full packets at lo's 4096-byte MTU, both from where they lie.
    assert_eq!(lo_path_mtu(), Mtu::Mtu4096);
    assert_eq!(external(&s) - before, 2);
    fake_ack(&fake, qpn, last, Syndrome::ACK, 1);
    drop(next_completion(&s.cq));

    // The exposed region is registered REMOTE_WRITE: copied.
    let exposed = Slab::new(
        s.mr.info.arena.clone(),
        0,
        8192,
        1,
        s.mr.lkey(),
        WrKind::Send,
    )
    .unwrap();
    let mut b = exposed.alloc().unwrap();
    assert!(b.fill(&data));
    let before = external(&s);
    s.qp.post_send(SendWr::new(
        b.wr_id(),
        SendOp::Send,
        SgeList::one(Sge::data(b)),
    ))
    .unwrap();
    let (got, _) = receive(&fake, data.len());
    assert_eq!(got, data);
    assert_eq!(external(&s), before);
}

#[test]
fn requester_sends_from_the_psn_of_the_rep_retransmits_then_retry_exceeded() {
    let (pip, fip) = addrs();
    let mut fake = Fake::new(fip, pip);
    let t = side(&url(fip, pip, "&retry=2&ack_timeout_ms=5"), b"world");
    let (req_psn, _qpn) = accept_as_fake(&mut fake, pip, fip);
    let mut s = t.join().unwrap();
    s.send(b"ping");
    // The original and `retry` retransmissions of the same packet: the PSN
    // the peer's REP announced (the first it expects), to its QPN.
    assert_ne!(req_psn, FAKE_PSN);
    for _ in 0..3 {
        let raw = fake.recv_rc();
        let p = RocePacket::parse(&raw).unwrap();
        assert_eq!(p.bth.opcode, Opcode::RcSendOnly);
        assert_eq!(p.bth.psn.value(), FAKE_PSN);
        assert_eq!(p.bth.dest_qpn, FAKE_QPN);
        assert!(p.bth.ack_req);
        assert_eq!(p.payload, b"ping");
    }
    let c = next_completion(&s.cq);
    assert_eq!(c.status, WcStatus::RetryExcErr);
    assert_eq!(s.qp.state(), QpState::Error);
    // The error is announced with a DREQ naming our QP pair.
    let m = fake.recv_mad();
    let CmMessage::Dreq(d) = CmMad::parse(&m).unwrap().message else {
        panic!("expected DREQ")
    };
    assert_eq!(d.remote_qpn, FAKE_QPN);
    assert_eq!(d.remote_comm_id, 0x77);
}

fn ack_of(raw: &[u8]) -> (Psn, Syndrome, u32) {
    let p = RocePacket::parse(raw).unwrap();
    assert_eq!(p.bth.opcode, Opcode::RcAcknowledge);
    let a = p.aeth.unwrap();
    (p.bth.psn, a.syndrome, a.msn)
}

#[test]
fn responder_acks_wraps_naks_once_and_replays_reads() {
    let (pip, fip) = addrs();
    let mut fake = Fake::new(fip, pip);
    // The provider announces (expects) FAKE_PSN, two before the wrap.
    let t = side(
        // The fake segments at 1024, as rxe on a 1500-byte link.
        &url(fip, pip, &format!("&initial_psn={FAKE_PSN}&mtu=1024")),
        b"world",
    );
    let (req_psn, qpn) = accept_as_fake_at(&mut fake, pip, fip, Mtu::Mtu1024);
    assert_eq!(req_psn, FAKE_PSN);
    let mut s = t.join().unwrap();
    let key = s.qp.expose(&s.mr).unwrap();
    let psn = |k: u32| FAKE_PSN.wrapping_add(k) & 0xFF_FFFF;
    let send = |op: Opcode, k: u32, payload: &[u8], ack: bool| {
        let mut bth = Bth::new(op, qpn, Psn::from_masked(psn(k)));
        bth.ack_req = ack;
        fake.send(&RocePacket::new(bth, payload));
    };

    // A three-packet Send starting from the PSN of the provider's REQ, across the
    // 2^24 wrap; the ACK names the last PSN with MSN 1.
    let body: Vec<u8> = (0..2058u32).map(|i| i as u8).collect();
    send(Opcode::RcSendFirst, 0, &body[..1024], false);
    send(Opcode::RcSendMiddle, 1, &body[1024..2048], false);
    send(Opcode::RcSendLast, 2, &body[2048..], true);
    let (apsn, syn, msn) = ack_of(&fake.recv_rc());
    assert_eq!((apsn.value(), syn, msn), (psn(2), Syndrome::ACK, 1));
    assert_eq!(psn(2), 0, "crossed the wrap");
    let c = next_completion(&s.cq);
    assert!(c.is_ok());
    assert_eq!(c.byte_len, 2058);
    assert_eq!(c.sgl.iter().next().unwrap().buf.to_vec(), &body[..]);
    drop(c);

    // Out of order: one sequence-error NAK naming the expected PSN, then
    // silence until the expected packet comes (whose ACK is next).
    send(Opcode::RcSendOnly, 5, b"early", true);
    send(Opcode::RcSendOnly, 6, b"early", true);
    let (npsn, syn, _) = ack_of(&fake.recv_rc());
    assert_eq!(
        (npsn.value(), syn),
        (psn(3), Syndrome::Nak(NakCode::PsnSequenceError))
    );
    send(Opcode::RcSendOnly, 3, b"x", true);
    let (apsn, syn, msn) = ack_of(&fake.recv_rc());
    assert_eq!((apsn.value(), syn, msn), (psn(3), Syndrome::ACK, 2));
    drop(next_completion(&s.cq));

    // RDMA Read of 3000 bytes: three responses at PSNs 4, 5, 6.
    let read = |k: u32, rkey: u32| {
        let mut bth = Bth::new(Opcode::RcReadRequest, qpn, Psn::from_masked(psn(k)));
        bth.ack_req = true;
        let mut p = RocePacket::new(bth, &[]);
        p.reth = Some(Reth {
            va: key.addr + 100,
            rkey,
            dma_len: 3000,
        });
        fake.send(&p);
    };
    let expect: Vec<u8> = (100..3100usize).map(|i| (i * 7 % 251) as u8).collect();
    let collect = || {
        let mut got = Vec::new();
        for (i, op) in [
            Opcode::RcReadResponseFirst,
            Opcode::RcReadResponseMiddle,
            Opcode::RcReadResponseLast,
        ]
        .into_iter()
        .enumerate()
        {
            let raw = fake.recv_rc();
            let p = RocePacket::parse(&raw).unwrap();
            assert_eq!(p.bth.opcode, op);
            assert_eq!(p.bth.psn.value(), psn(4 + i as u32));
            got.extend_from_slice(p.payload);
        }
        got
    };
    read(4, key.rkey);
    assert_eq!(collect(), expect);
    // The same request again (our responses "were lost"): executed again.
    read(4, key.rkey);
    assert_eq!(collect(), expect);
    // The rest of it from its second PSN (a requester's retry of a partly
    // received read): MIDDLE then LAST, the bytes from offset 1024.
    let mut bth = Bth::new(Opcode::RcReadRequest, qpn, Psn::from_masked(psn(5)));
    bth.ack_req = true;
    let mut p = RocePacket::new(bth, &[]);
    p.reth = Some(Reth {
        va: key.addr + 100 + 1024,
        rkey: key.rkey,
        dma_len: 3000 - 1024,
    });
    fake.send(&p);
    let mut got = Vec::new();
    for (i, op) in [Opcode::RcReadResponseMiddle, Opcode::RcReadResponseLast]
        .into_iter()
        .enumerate()
    {
        let raw = fake.recv_rc();
        let p = RocePacket::parse(&raw).unwrap();
        assert_eq!((p.bth.opcode, p.bth.psn.value()), (op, psn(5 + i as u32)));
        got.extend_from_slice(p.payload);
    }
    assert_eq!(got, expect[1024..]);
    // The read consumed three PSNs: the next request is PSN 7.
    send(Opcode::RcSendOnly, 7, b"y", true);
    let (apsn, syn, _) = ack_of(&fake.recv_rc());
    assert_eq!((apsn.value(), syn), (psn(7), Syndrome::ACK));
    drop(next_completion(&s.cq));

    // A bad rkey: remote access NAK, the QP goes to error and says so.
    read(8, key.rkey ^ 0x100);
    let (npsn, syn, _) = ack_of(&fake.recv_rc());
    assert_eq!(
        (npsn.value(), syn),
        (psn(8), Syndrome::Nak(NakCode::RemoteAccessError))
    );
    let m = fake.recv_mad();
    assert!(matches!(
        CmMad::parse(&m).unwrap().message,
        CmMessage::Dreq(_)
    ));
    let deadline = Instant::now() + LONG;
    while s.qp.state() != QpState::Error {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn rejected_by_a_peer_returns_its_private_data() {
    let (pip, fip) = addrs();
    let mut fake = Fake::new(fip, pip);
    let t = std::thread::spawn({
        let url = url(fip, pip, "");
        move || {
            let ctx = Roce::open(&url).unwrap();
            let pd = ctx.alloc_pd().unwrap();
            let cq = ctx.create_cq(4).unwrap();
            let pqp = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
            match pqp.connect(&url, b"hi", LONG) {
                Err(VerbsError::Rejected { private_data }) => private_data,
                other => panic!("expected a reject, got {:?}", other.map(|_| ())),
            }
        }
    });
    let mad = fake.recv_mad();
    let m = CmMad::parse(&mad).unwrap();
    let CmMessage::Req(req) = m.message else {
        panic!("expected REQ")
    };
    let rej = ibcm::Rej {
        local_comm_id: 5,
        remote_comm_id: req.local_comm_id,
        message_rejected: 0,
        reject_info_len: 0,
        reason: ibcm::rej_reason::CONSUMER_DEFINED,
        ari: [0; 72],
        private_data: b"go away",
    };
    fake.send_mad(&CmMad::new(m.tid, CmMessage::Rej(rej)));
    assert_eq!(t.join().unwrap(), b"go away");
}

#[test]
fn url_options_parse_and_bad_ones_are_refused() {
    let (a, c) = parse_url(
        "roce://10.0.0.1:20049?udp_port=5000&mtu=4096&retry=3&ack_timeout_ms=9&faults=10,5,5,7",
        RoceConfig::default(),
    )
    .unwrap();
    assert_eq!(a, "10.0.0.1:20049".parse().unwrap());
    assert_eq!(c.udp_port, 5000);
    assert_eq!(c.mtu, Some(Mtu::Mtu4096));
    assert_eq!(c.retry_count, 3);
    assert_eq!(c.ack_timeout, Duration::from_millis(9));
    assert_eq!(
        c.faults,
        FaultPolicy {
            drop_permille: 10,
            dup_permille: 5,
            reorder_permille: 5,
            seed: 7
        }
    );
    // GSO: loopback devices by default, everywhere with `all`, off with 0.
    let gso = |v: &str| {
        let (_, c) =
            parse_url(&format!("roce://10.0.0.1:1?gso={v}"), RoceConfig::default()).unwrap();
        (c.gso, c.gso_everywhere)
    };
    assert_eq!(
        (
            RoceConfig::default().gso,
            RoceConfig::default().gso_everywhere
        ),
        (true, false)
    );
    assert_eq!(
        (gso("0"), gso("1"), gso("all")),
        ((false, false), (true, false), (true, true))
    );
    // GSO on send and GRO on receive go together: on loopback devices
    // unless off, on every other device only with `all`.
    let offloads = |v: &str, ip: Ipv4Addr| {
        let (_, c) =
            parse_url(&format!("roce://10.0.0.1:1?gso={v}"), RoceConfig::default()).unwrap();
        super::device::offloads(&c, SocketAddrV4::new(ip, 4791))
    };
    let (lo, veth) = (Ipv4Addr::LOCALHOST, Ipv4Addr::new(10, 0, 0, 1));
    assert_eq!(
        [
            offloads("0", lo),
            offloads("1", lo),
            offloads("all", lo),
            offloads("0", veth),
            offloads("1", veth),
            offloads("all", veth)
        ],
        [false, true, true, false, false, true]
    );
    for bad in [
        "shm:///x",
        "roce://host:1",
        "roce://10.0.0.1",
        "roce://10.0.0.1:1?mtu=1000",
        "roce://10.0.0.1:1?retry=8",
        "roce://10.0.0.1:1?what=1",
        "roce://10.0.0.1:1?udp_port=0",
        "roce://10.0.0.1:1?faults=2000",
    ] {
        assert!(parse_url(bad, RoceConfig::default()).is_err(), "{bad}");
    }
    assert_eq!(RoceConfig::default().ack_timeout_code(), 14);
    assert_eq!(trim_private(b"ab\0c\0\0"), b"ab\0c");
}

#[test]
fn passive_side_rejects_unknown_services_mras_repeats_and_binds_the_right_way_round() {
    let (pip, fip) = addrs();
    let mut fake = Fake::new(fip, pip);
    let url = format!("roce://{pip}:7001?udp_port={UDP}&verify_icrc=1");
    let ctx = Roce::open(&url).unwrap();
    let listener = ctx.listen(&url).unwrap();
    let mut private = req_private(fip, pip);
    private[RDMA_CM_HEADER_LEN..RDMA_CM_HEADER_LEN + 2].copy_from_slice(b"hi");
    let req = |service: u16| Req {
        local_comm_id: 0x5150 + service as u32,
        service_id: ibcm::tcp_service_id(service),
        local_ca_guid: 2,
        local_qkey: 0,
        local_qpn: FAKE_QPN,
        // rxe/xprtrdma clients announce 128; we must not exceed our 16.
        responder_resources: 128,
        local_eecn: 0,
        initiator_depth: 0,
        remote_eecn: 0,
        remote_cm_response_timeout: 20,
        transport_type: 0,
        end_to_end_flow_control: false,
        starting_psn: Psn::new(FAKE_PSN).unwrap(),
        local_cm_response_timeout: 20,
        retry_count: 6,
        pkey: 0xFFFF,
        path_mtu: Mtu::Mtu1024,
        rdc_exists: false,
        rnr_retry_count: 7,
        max_cm_retries: 15,
        srq: false,
        extended_transport: 0,
        primary_path: cm_path(fip, pip, 18),
        alternate_path: CmPath::default(),
        private_data: &private,
    };
    // Nobody listens on 7002: REJ "invalid service ID" echoing our TID.
    fake.send_mad(&CmMad::new(0xAA, CmMessage::Req(req(7002))));
    let m = fake.recv_mad();
    let m = CmMad::parse(&m).unwrap();
    let CmMessage::Rej(j) = m.message else {
        panic!("expected REJ")
    };
    assert_eq!(m.tid, 0xAA);
    assert_eq!(j.reason, ibcm::rej_reason::INVALID_SERVICE_ID);
    assert_eq!(j.remote_comm_id, 0x5150 + 7002);
    // A REQ for 7001, repeated while the application has not accepted:
    // the repeat gets an MRA for the REQ.
    fake.send_mad(&CmMad::new(0xBB, CmMessage::Req(req(7001))));
    fake.send_mad(&CmMad::new(0xBB, CmMessage::Req(req(7001))));
    let m = fake.recv_mad();
    let CmMessage::Mra(mra) = CmMad::parse(&m).unwrap().message else {
        panic!("expected MRA")
    };
    assert_eq!((mra.remote_comm_id, mra.message_mraed), (0x5150 + 7001, 0));
    // Accept: the REP announces our PSN and a QPN > 1, initiator depth >= 1.
    let inc = listener.accept(LONG).unwrap();
    assert_eq!(inc.private_data(), b"hi");
    assert_eq!(inc.peer_ip(), Some(fip));
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let arena = Arena::with_backing(1 << 16, crate::mem::Backing::Small).unwrap();
    let mr = pd
        .register(&arena, 0, 1 << 16, Access::LOCAL_WRITE)
        .unwrap();
    let slab = Slab::new(arena, 0, 4096, 16, mr.lkey(), WrKind::Recv).unwrap();
    let mut pqp = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    let b = slab.alloc().unwrap();
    pqp.post_recv(RecvWr {
        wr_id: b.wr_id(),
        sgl: SgeList::one(Sge::whole(b)),
    })
    .unwrap();
    let mut qp = inc.accept(pqp, b"ok").unwrap();
    let m = fake.recv_mad();
    let m = CmMad::parse(&m).unwrap();
    let CmMessage::Rep(rep) = m.message else {
        panic!("expected REP")
    };
    assert_eq!(m.tid, 0xBB);
    assert_eq!(rep.remote_comm_id, 0x5150 + 7001);
    assert_eq!(rep.local_qpn, qp.qp_num());
    assert!(rep.local_qpn > 1);
    assert!(rep.initiator_depth >= 1);
    assert_eq!(&rep.private_data[..2], b"ok");
    fake.send_mad(&CmMad::new(
        0xBB,
        CmMessage::Rtu(CommIds {
            local_comm_id: 0x5150 + 7001,
            remote_comm_id: rep.local_comm_id,
            private_data: &[],
        }),
    ));
    // The Starting PSN a side announces is the one it expects first
    // (Linux cm.c): the peer sends from the PSN of our REP...
    assert_ne!(rep.starting_psn.value(), FAKE_PSN);
    let mut bth = Bth::new(Opcode::RcSendOnly, rep.local_qpn, rep.starting_psn);
    bth.ack_req = true;
    fake.send(&RocePacket::new(bth, b"to you"));
    let c = next_completion(&cq);
    assert!(c.is_ok());
    assert_eq!(c.sgl.iter().next().unwrap().buf.to_vec(), b"to you");
    drop(c);
    let (apsn, syn, _) = ack_of(&fake.recv_rc());
    assert_eq!((apsn, syn), (rep.starting_psn, Syndrome::ACK));
    // ... and we send from the PSN of its REQ.
    let mut out = slab.alloc().unwrap();
    assert!(out.fill(b"to me"));
    qp.post_send(SendWr::new(
        out.wr_id(),
        SendOp::Send,
        SgeList::one(Sge::data(out)),
    ))
    .unwrap();
    let raw = fake.recv_rc();
    let p = RocePacket::parse(&raw).unwrap();
    assert_eq!(p.bth.psn.value(), FAKE_PSN);
    assert_eq!(p.bth.dest_qpn, FAKE_QPN);
    assert_eq!(p.payload, b"to me");
    let mut ack = RocePacket::new(
        Bth::new(
            Opcode::RcAcknowledge,
            rep.local_qpn,
            Psn::new(FAKE_PSN).unwrap(),
        ),
        &[],
    );
    ack.aeth = Some(crate::wire::roce::Aeth {
        syndrome: Syndrome::ACK,
        msn: 1,
    });
    fake.send(&ack);
    let c = next_completion(&cq);
    assert!(c.is_ok());
    assert_eq!(c.opcode, WcOpcode::Send);
}

/// A QP and CQ pair as `worker::endpoint::Endpoint` holds them, with
/// `n` receive leases posted.
fn prepared_with_leases(
    ctx: &RoceContext,
    pd: &RocePd,
    slab: &Slab,
    n: usize,
) -> (RoceCq, RocePreparedQp) {
    let cq = ctx.create_cq(16).unwrap();
    let mut p = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    for _ in 0..n {
        let b = slab.alloc().unwrap();
        p.post_recv(RecvWr {
            wr_id: b.wr_id(),
            sgl: SgeList::one(Sge::whole(b)),
        })
        .unwrap();
    }
    (cq, p)
}

#[test]
fn closed_queue_pairs_leave_their_device_and_return_their_buffers() {
    // The per-test address: no other test's QPs on this device.
    let (_, pip) = addrs();
    let url = format!("roce://{pip}:7100?udp_port={UDP}&local={pip}");
    let ctx = Roce::open(&url).unwrap();
    let listener = ctx.listen(&url).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let arena = Arena::with_backing(1 << 16, crate::mem::Backing::Small).unwrap();
    let mr = pd
        .register(&arena, 0, 1 << 16, Access::LOCAL_WRITE)
        .unwrap();
    let slab = Slab::new(arena.clone(), 0, 1024, 64, mr.lkey(), WrKind::Recv).unwrap();
    let qps_on_device = || listener.dev.qp_count();
    let base_qps = qps_on_device();
    let base_arena_refs = Arc::strong_count(&arena);
    for _ in 0..16 {
        let (a_cq, a_pqp) = prepared_with_leases(&ctx, &pd, &slab, 3);
        let (b_cq, b_pqp) = prepared_with_leases(&ctx, &pd, &slab, 3);
        let (a_qp, mut b_qp) = std::thread::scope(|s| {
            let t = s.spawn(|| b_pqp.connect(&url, b"", LONG).unwrap().0);
            let inc = listener.accept(LONG).unwrap();
            let a_qp = inc.accept(a_pqp, b"").unwrap();
            (a_qp, t.join().unwrap())
        });
        // A send still queued when the connection goes.
        let b = slab.alloc().unwrap();
        b_qp.post_send(SendWr::new(
            b.wr_id(),
            SendOp::Send,
            SgeList::one(Sge::whole(b)),
        ))
        .unwrap();
        assert_eq!(qps_on_device(), base_qps + 2);
        // The way the worker's endpoint goes: QP, then its CQ, unpolled.
        drop(a_qp);
        drop(a_cq);
        drop(b_qp);
        drop(b_cq);
    }
    assert_eq!(qps_on_device(), base_qps, "closed QPs left on the device");
    assert_eq!(slab.available(), slab.total(), "leases never returned");
    assert_eq!(Arc::strong_count(&arena), base_arena_refs);
}

/// An RC ACK or NAK from the fake peer to the provider's QP.
fn fake_ack(fake: &Fake, qpn: u32, psn: u32, syndrome: Syndrome, msn: u32) {
    let mut ack = RocePacket::new(
        Bth::new(Opcode::RcAcknowledge, qpn, Psn::new(psn).unwrap()),
        &[],
    );
    ack.aeth = Some(crate::wire::roce::Aeth { syndrome, msn });
    fake.send(&ack);
}

#[test]
fn an_ack_for_psns_posted_but_never_sent_is_ignored() {
    let (pip, fip) = addrs();
    let mut fake = Fake::new(fip, pip);
    let t = side(&url(fip, pip, ""), b"world");
    let (_req_psn, qpn) = accept_as_fake(&mut fake, pip, fip);
    let mut s = t.join().unwrap();
    // The provider sends from the PSN of the fake's REP.
    let psn = |i: u32| FAKE_PSN.wrapping_add(i) & 0xFF_FFFF;
    let post = |s: &mut Side, data: &[u8]| {
        let mut b = s.local.alloc().unwrap();
        assert!(b.fill(data));
        s.qp.post_send(SendWr::new(
            b.wr_id(),
            SendOp::Send,
            SgeList::one(Sge::data(b)),
        ))
        .unwrap();
    };
    post(&mut s, b"zero");
    let raw = fake.recv_rc();
    assert_eq!(RocePacket::parse(&raw).unwrap().bth.psn.value(), psn(0));
    // RNR NAK (timer code 0: 655 ms): nothing more goes out meanwhile, so
    // the next two sends are posted (PSNs assigned) but not transmitted.
    fake_ack(&fake, qpn, psn(0), Syndrome::RnrNak { timer: 0 }, 0);
    std::thread::sleep(Duration::from_millis(20));
    post(&mut s, b"one");
    post(&mut s, b"two");
    // A forged ACK through the last posted PSN, which nobody has seen.
    fake_ack(&fake, qpn, psn(2), Syndrome::ACK, 3);
    // Ignored: after the RNR wait all three go out, in order.
    for i in 0..3 {
        let raw = fake.recv_rc();
        let p = RocePacket::parse(&raw).unwrap();
        assert_eq!(p.bth.psn.value(), psn(i), "packet {i}");
    }
    fake_ack(&fake, qpn, psn(2), Syndrome::ACK, 3);
    for _ in 0..3 {
        assert!(next_completion(&s.cq).is_ok());
    }
}

/// The rdma_cm private data of a REQ from `src` to `dst` (RFC 8797's
/// header in the IB CM private data, as librdmacm sends it).
fn req_private(src: Ipv4Addr, dst: Ipv4Addr) -> [u8; ibcm::private_len::REQ] {
    let mut private = [0u8; ibcm::private_len::REQ];
    RdmaCmHeader {
        src_port: 40000,
        src: IpAddr::V4(src),
        dst: IpAddr::V4(dst),
    }
    .emit(&mut private)
    .unwrap();
    private
}

/// A REQ from the fake peer for `service`, naming `gid_ip` as its source.
fn fake_req<'a>(
    comm_id: u32,
    service: u16,
    gid_ip: Ipv4Addr,
    pip: Ipv4Addr,
    private: &'a [u8],
) -> Req<'a> {
    Req {
        local_comm_id: comm_id,
        service_id: ibcm::tcp_service_id(service),
        local_ca_guid: 2,
        local_qkey: 0,
        local_qpn: FAKE_QPN,
        responder_resources: 1,
        local_eecn: 0,
        initiator_depth: 1,
        remote_eecn: 0,
        remote_cm_response_timeout: 20,
        transport_type: 0,
        end_to_end_flow_control: false,
        starting_psn: Psn::new(FAKE_PSN).unwrap(),
        local_cm_response_timeout: 20,
        retry_count: 6,
        pkey: 0xFFFF,
        path_mtu: Mtu::Mtu1024,
        rdc_exists: false,
        rnr_retry_count: 7,
        max_cm_retries: 15,
        srq: false,
        extended_transport: 0,
        primary_path: cm_path(gid_ip, pip, 18),
        alternate_path: CmPath::default(),
        private_data: private,
    }
}

#[test]
fn a_req_naming_another_source_address_is_dropped() {
    // Addresses of this test only: its device counts only its packets.
    let (_, pip) = addrs();
    let (_, fip) = addrs();
    let mut fake = Fake::new(fip, pip);
    let url = format!("roce://{pip}:7004?udp_port={UDP}");
    let ctx = Roce::open(&url).unwrap();
    let listener = ctx.listen(&url).unwrap();
    let private = req_private(fip, pip);
    // Claims to come from a third host: REPs would be reflected at it.
    let victim = Ipv4Addr::new(127, 0, 0, 99);
    fake.send_mad(&CmMad::new(
        0x99,
        CmMessage::Req(fake_req(0x1111, 7004, victim, pip, &private)),
    ));
    fake.send_mad(&CmMad::new(
        0xBB,
        CmMessage::Req(fake_req(0x2222, 7004, fip, pip, &private)),
    ));
    let inc = listener.accept(LONG).unwrap();
    assert_eq!(inc.peer_ip(), Some(fip), "the spoofed REQ was queued");
    assert_eq!(listener.dev.stats().spoofed, 1);
}

#[test]
fn data_from_the_peer_address_but_another_udp_port_is_dropped() {
    let (pip, fip) = addrs();
    let mut fake = Fake::new(fip, pip);
    let t = side(&url(fip, pip, ""), b"world");
    let (req_psn, qpn) = accept_as_fake(&mut fake, pip, fip);
    let mut s = t.join().unwrap();
    // The peer's first packet (an ACK of our send) pins its UDP port.
    s.send(b"ping");
    fake.recv_rc();
    fake_ack(&fake, qpn, FAKE_PSN, Syndrome::ACK, 1);
    assert!(next_completion(&s.cq).is_ok());
    // Same address, another port, the right QPN and PSN: dropped.
    let other = Fake {
        sock: UdpSocket::bind((fip, UDP + 1)).unwrap(),
        me: SocketAddrV4::new(fip, UDP + 1),
        peer: fake.peer,
        gsi_psn: Psn::default(),
    };
    let send = |f: &Fake, data: &[u8]| {
        let mut bth = Bth::new(Opcode::RcSendOnly, qpn, Psn::new(req_psn).unwrap());
        bth.ack_req = true;
        f.send(&RocePacket::new(bth, data))
    };
    send(&other, b"evil");
    send(&fake, b"good");
    let raw = fake.recv_rc();
    let (apsn, syn, _) = ack_of(&raw);
    assert_eq!((apsn.value(), syn), (req_psn, Syndrome::ACK));
    let c = next_completion(&s.cq);
    assert!(c.is_ok());
    assert_eq!(c.sgl.iter().next().unwrap().buf.to_vec(), b"good");
    assert_eq!(s.qp.spoofed_count(), 1);
}

#[test]
fn accept_sends_within_the_smaller_of_its_own_and_the_requesters_mtu() {
    let (pip, fip) = addrs();
    let mut fake = Fake::new(fip, pip);
    let url = format!("roce://{pip}:7005?udp_port={UDP}&mtu=256");
    let ctx = Roce::open(&url).unwrap();
    let listener = ctx.listen(&url).unwrap();
    let private = req_private(fip, pip);
    // The requester announces 1024; we are configured for 256.
    fake.send_mad(&CmMad::new(
        0xBB,
        CmMessage::Req(fake_req(0x3333, 7005, fip, pip, &private)),
    ));
    let inc = listener.accept(LONG).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let arena = Arena::with_backing(1 << 16, crate::mem::Backing::Small).unwrap();
    let mr = pd
        .register(&arena, 0, 1 << 16, Access::LOCAL_WRITE)
        .unwrap();
    let slab = Slab::new(arena, 0, 4096, 16, mr.lkey(), WrKind::Send).unwrap();
    let pqp = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    let mut qp = inc.accept(pqp, b"").unwrap();
    let m = fake.recv_mad();
    let m = CmMad::parse(&m).unwrap();
    let CmMessage::Rep(rep) = m.message else {
        panic!("expected REP")
    };
    fake.send_mad(&CmMad::new(
        0xBB,
        CmMessage::Rtu(CommIds {
            local_comm_id: 0x3333,
            remote_comm_id: rep.local_comm_id,
            private_data: &[],
        }),
    ));
    let mut b = slab.alloc().unwrap();
    assert!(b.fill(&[7u8; 600]));
    qp.post_send(SendWr::new(
        b.wr_id(),
        SendOp::Send,
        SgeList::one(Sge::data(b)),
    ))
    .unwrap();
    let raw = fake.recv_rc();
    let p = RocePacket::parse(&raw).unwrap();
    assert_eq!(p.bth.opcode, Opcode::RcSendFirst);
    assert_eq!(p.payload.len(), 256);
}

#[test]
fn without_randomness_qp_creation_and_expose_fail_instead_of_guessing() {
    let (pip, fip) = addrs();
    let mut fake = Fake::new(fip, pip);
    let t = side(&url(fip, pip, ""), b"world");
    accept_as_fake(&mut fake, pip, fip);
    let mut s = t.join().unwrap();
    FAIL_RANDOM.with(|f| f.set(true));
    // Key slot 0 used to spin forever here when every draw gave 0.
    let exposed = s.qp.expose(&s.mr);
    let cq = s._ctx.create_cq(4).unwrap();
    let created = s._pd.create_qp(&cq, &cq, QpCaps::default());
    FAIL_RANDOM.with(|f| f.set(false));
    assert!(matches!(
        exposed,
        Err(VerbsError::Os {
            what: "getrandom",
            ..
        })
    ));
    assert!(matches!(
        created,
        Err(VerbsError::Os {
            what: "getrandom",
            ..
        })
    ));
    assert!(s.qp.expose(&s.mr).is_ok());
}

#[test]
fn a_duplicate_read_after_its_rkey_is_invalidated_is_not_replayed() {
    duplicate_read_after_invalidation(false);
}

#[test]
fn a_duplicate_read_under_a_rebound_windows_old_key_is_not_replayed() {
    duplicate_read_after_invalidation(true);
}

/// Binds `s`'s window `w` under `rkey` over the whole exposed region.
fn bind_window(s: &mut Side, w: &Window, rkey: u32) -> RemoteKey {
    let b = w.bind(rkey, s.mr.lkey(), s.mr.addr(), 1 << 16, Access::REMOTE_READ);
    s.qp.post_send(SendWr::new(
        WrId::default(),
        SendOp::Bind(b),
        SgeList::new(),
    ))
    .unwrap();
    let c = next_completion(&s.cq);
    assert_eq!((c.status, c.opcode), (WcStatus::Success, WcOpcode::Bind));
    b.remote_key()
}

/// An RDMA Read from the fake, answered; the key is invalidated (for a
/// window: and the window bound again under its next key); a duplicate
/// of that read must not be replayed (IBTA 9.7.5.1.2: only what the key
/// still grants).
fn duplicate_read_after_invalidation(window: bool) {
    let (pip, fip) = addrs();
    let mut fake = Fake::new(fip, pip);
    let t = side(&url(fip, pip, ""), b"world");
    // The fake sends from the PSN the provider's REQ announced.
    let (req_psn, qpn) = accept_as_fake(&mut fake, pip, fip);
    let mut s = t.join().unwrap();
    let w = s.qp.alloc_window().unwrap();
    crate::verbs::soft_mr::check_window_keys(&w);
    let key = if window {
        bind_window(&mut s, &w, w.rkey(0x77_0000))
    } else {
        s.qp.expose(&s.mr).unwrap()
    };
    let psn = |k: u32| req_psn.wrapping_add(k) & 0xFF_FFFF;
    let read = |k: u32| {
        let mut bth = Bth::new(Opcode::RcReadRequest, qpn, Psn::from_masked(psn(k)));
        bth.ack_req = true;
        let mut p = RocePacket::new(bth, &[]);
        p.reth = Some(Reth {
            va: key.addr,
            rkey: key.rkey,
            dma_len: 100,
        });
        fake.send(&p);
    };
    read(0);
    let raw = fake.recv_rc();
    let p = RocePacket::parse(&raw).unwrap();
    assert_eq!(
        (p.bth.opcode, p.bth.psn.value()),
        (Opcode::RcReadResponseOnly, psn(0))
    );
    // The application revokes the key.
    s.qp.post_send(SendWr::new(
        WrId::default(),
        SendOp::LocalInv(key.rkey),
        SgeList::new(),
    ))
    .unwrap();
    assert!(next_completion(&s.cq).is_ok());
    if window {
        let again = bind_window(&mut s, &w, w.next_rkey(key.rkey));
        assert_ne!(again.rkey, key.rkey);
    }
    // A duplicate of the old read, then a new Send: only the Send's ACK
    // comes back, no replayed data.
    read(0);
    let mut bth = Bth::new(Opcode::RcSendOnly, qpn, Psn::from_masked(psn(1)));
    bth.ack_req = true;
    fake.send(&RocePacket::new(bth, b"x"));
    let raw = fake.recv_rc();
    let p = RocePacket::parse(&raw).unwrap();
    assert_eq!(
        (p.bth.opcode, p.bth.psn.value()),
        (Opcode::RcAcknowledge, psn(1)),
        "the invalidated range was replayed"
    );
}

/// The provider's side of a connection the fake requested and the
/// provider accepted: the REP is out, no RTU sent yet. One receive is
/// posted.
struct Accepted {
    fake: Fake,
    cq: RoceCq,
    _qp: RoceQp,
    fake_comm_id: u32,
    our_comm_id: u32,
    our_qpn: u32,
    /// The Starting PSN of our REP: the first PSN we expect from the fake.
    our_psn: Psn,
    _recv: Slab,
    _mr: RoceMr,
    _pd: RocePd,
    _listener: RoceListener,
    _ctx: RoceContext,
}

fn accepted_without_rtu(port: u16) -> Accepted {
    let (pip, fip) = addrs();
    let mut fake = Fake::new(fip, pip);
    let url = format!("roce://{pip}:{port}?udp_port={UDP}");
    let ctx = Roce::open(&url).unwrap();
    let listener = ctx.listen(&url).unwrap();
    let private = req_private(fip, pip);
    let fake_comm_id = 0x4000 + u32::from(port);
    fake.send_mad(&CmMad::new(
        0xCC,
        CmMessage::Req(fake_req(fake_comm_id, port, fip, pip, &private)),
    ));
    let inc = listener.accept(LONG).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let arena = Arena::with_backing(1 << 16, crate::mem::Backing::Small).unwrap();
    let mr = pd
        .register(&arena, 0, 1 << 16, Access::LOCAL_WRITE)
        .unwrap();
    let recv = Slab::new(arena, 0, 4096, 16, mr.lkey(), WrKind::Recv).unwrap();
    let mut pqp = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    let b = recv.alloc().unwrap();
    pqp.post_recv(RecvWr {
        wr_id: b.wr_id(),
        sgl: SgeList::one(Sge::whole(b)),
    })
    .unwrap();
    let qp = inc.accept(pqp, b"").unwrap();
    let m = fake.recv_mad();
    let CmMessage::Rep(rep) = CmMad::parse(&m).unwrap().message else {
        panic!("expected REP")
    };
    assert_eq!(rep.remote_comm_id, fake_comm_id);
    Accepted {
        fake,
        cq,
        fake_comm_id,
        our_comm_id: rep.local_comm_id,
        our_qpn: rep.local_qpn,
        our_psn: rep.starting_psn,
        _qp: qp,
        _recv: recv,
        _mr: mr,
        _pd: pd,
        _listener: listener,
        _ctx: ctx,
    }
}

/// A requester that never sends the RTU (nor anything else) gets our REP
/// again, `REP_RETRIES` times, then a REJ "timeout"; the accepted QP goes
/// to the error state (its receive is flushed), so the connection and its
/// memory do not stay behind.
#[test]
fn without_an_rtu_the_rep_is_resent_then_the_connection_fails() {
    let a = accepted_without_rtu(7006);
    for _ in 0..REP_RETRIES {
        let m = a.fake.recv_mad();
        let CmMessage::Rep(rep) = CmMad::parse(&m).unwrap().message else {
            panic!("expected the REP again")
        };
        assert_eq!(
            (rep.local_comm_id, rep.remote_comm_id),
            (a.our_comm_id, a.fake_comm_id)
        );
    }
    let m = a.fake.recv_mad();
    let CmMessage::Rej(j) = CmMad::parse(&m).unwrap().message else {
        panic!("expected REJ after the last REP")
    };
    assert_eq!(j.reason, ibcm::rej_reason::TIMEOUT);
    assert_eq!(
        (j.local_comm_id, j.remote_comm_id),
        (a.our_comm_id, a.fake_comm_id)
    );
    let c = next_completion(&a.cq);
    assert!(!c.is_ok(), "the receive should be flushed: {:?}", c.status);
}

/// The first packet of the requester's QP stands for a lost RTU: the
/// connection is established and the REP is not resent.
#[test]
fn a_packet_of_the_peer_stands_for_a_lost_rtu() {
    let a = accepted_without_rtu(7007);
    let mut bth = Bth::new(Opcode::RcSendOnly, a.our_qpn, a.our_psn);
    bth.ack_req = true;
    a.fake.send(&RocePacket::new(bth, b"no rtu"));
    let c = next_completion(&a.cq);
    assert!(c.is_ok());
    assert_eq!(c.sgl.iter().next().unwrap().buf.to_vec(), b"no rtu");
    drop(c);
    // Longer than every REP retry together: only the ACK of our Send may
    // arrive, never a REP or a REJ.
    a.fake
        .sock
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let quiet_until = Instant::now() + CM_RETRY * (u32::from(REP_RETRIES) + 2);
    let mut buf = [0u8; 9000];
    while Instant::now() < quiet_until {
        let Ok((n, _)) = a.fake.sock.recv_from(&mut buf) else {
            continue;
        };
        let p = RocePacket::parse(&buf[..n]).unwrap();
        assert_ne!(
            p.bth.dest_qpn,
            ibcm::GSI_QPN,
            "a CM message after the peer's first packet"
        );
    }
}

#[test]
fn the_window_fits_the_granted_socket_buffer() {
    use super::io::SocketBuffers;
    use super::rc::WINDOW;
    // The kernel's default cap (net.core.rmem_max 212992, reported
    // doubled): a window of 4096-byte packets shrinks to what half of it
    // holds.
    let small = SocketBuffers {
        rcv: 425_984,
        snd: 425_984,
    };
    assert!(small.short());
    assert_eq!(small.fit(Mtu::Mtu4096, WINDOW as u32), 24);
    assert_eq!(small.fit(Mtu::Mtu1024, WINDOW as u32), 83);
    // 4 MiB granted (reported as 8 MiB): the full window.
    let big = SocketBuffers {
        rcv: 8 << 20,
        snd: 8 << 20,
    };
    assert!(!big.short());
    assert_eq!(big.fit(Mtu::Mtu4096, WINDOW as u32), WINDOW as u32);
    // Never below 8 packets.
    let tiny = SocketBuffers { rcv: 0, snd: 0 };
    assert_eq!(tiny.fit(Mtu::Mtu4096, WINDOW as u32), 8);
    // A device bound here reads back what it got.
    let fd = super::io::bind_udp(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0), true).unwrap();
    let got = SocketBuffers::of(fd.as_raw_fd());
    assert!(got.rcv > 0 && got.snd > 0);
}

/// A flood of REQs from one address (the application never answers):
/// past `MAX_HALF_OPEN_PER_PEER` half-open connections the REQs get a REJ
/// (no resources) and are counted, and a REQ from another address is
/// still queued for the application.
#[test]
fn a_req_flood_from_one_address_is_capped_and_others_still_get_in() {
    use super::cm::MAX_HALF_OPEN_PER_PEER;
    let (pip, fip) = addrs();
    let (_, other_ip) = addrs();
    let mut fake = Fake::new(fip, pip);
    let mut other = Fake::new(other_ip, pip);
    let url = format!("roce://{pip}:7005?udp_port={UDP}");
    let ctx = Roce::open(&url).unwrap();
    let listener = ctx.listen(&url).unwrap();
    let private_from = |ip: Ipv4Addr| req_private(ip, pip);
    let private = private_from(fip);
    let flood = MAX_HALF_OPEN_PER_PEER + 4;
    for i in 0..flood as u32 {
        fake.send_mad(&CmMad::new(
            0x100 + u64::from(i),
            CmMessage::Req(fake_req(0x7000 + i, 7005, fip, pip, &private)),
        ));
    }
    // The ones past the bound are rejected, each with its own REJ.
    let mut rejected = Vec::new();
    while rejected.len() < flood - MAX_HALF_OPEN_PER_PEER {
        let m = fake.recv_mad();
        let m = CmMad::parse(&m).unwrap();
        if let CmMessage::Rej(j) = m.message {
            assert_eq!(j.reason, ibcm::rej_reason::NO_RESOURCES);
            rejected.push(j.remote_comm_id);
        }
    }
    rejected.sort_unstable();
    let first_refused = 0x7000 + MAX_HALF_OPEN_PER_PEER as u32;
    assert_eq!(
        rejected,
        (first_refused..0x7000 + flood as u32).collect::<Vec<_>>()
    );
    assert_eq!(
        listener.dev.stats().half_open_refused,
        (flood - MAX_HALF_OPEN_PER_PEER) as u64
    );
    // Another address is not held to the first one's bound.
    let private = private_from(other_ip);
    other.send_mad(&CmMad::new(
        0x999,
        CmMessage::Req(fake_req(0x9999, 7005, other_ip, pip, &private)),
    ));
    let mut peers = Vec::new();
    for _ in 0..=MAX_HALF_OPEN_PER_PEER {
        peers.push(listener.accept(LONG).unwrap().peer_ip());
    }
    assert_eq!(
        peers.iter().filter(|p| **p == Some(fip)).count(),
        MAX_HALF_OPEN_PER_PEER
    );
    assert!(peers.contains(&Some(other_ip)), "{peers:?}");
}

/// A flood of REQs from many addresses (the requesters never finish the
/// handshake): the application is handed at most `MAX_ACCEPTING`
/// requests at once (what costs memory), the rest wait in the queue; when
/// the queue is full a newcomer's REQ takes the place of the heaviest
/// address's youngest (one REJ "no resources", counted); and the
/// newcomer is handed over among the first requests, not behind the
/// whole queue.
#[test]
fn a_req_flood_from_many_addresses_is_bounded_and_a_newcomer_gets_a_fair_turn() {
    use super::cm::{MAX_ACCEPTING, MAX_HALF_OPEN_PER_PEER};
    const LISTEN_BACKLOG: usize = 1024;
    let flooders = LISTEN_BACKLOG / MAX_HALF_OPEN_PER_PEER;
    // A device of its own: its bounds and counters are per device, and
    // other tests of this process use the common one.
    let (_, pip) = addrs();
    let url = format!("roce://{pip}:7006?udp_port={UDP}");
    let ctx = Roce::open(&url).unwrap();
    let listener = ctx.listen(&url).unwrap();
    let private_from = |ip: Ipv4Addr| req_private(ip, pip);
    let mut fakes = Vec::new();
    let mut comm_id = 0x1_0000u32;
    for _ in 0..flooders {
        let (_, fip) = addrs();
        let mut fake = Fake::new(fip, pip);
        let private = private_from(fip);
        for _ in 0..MAX_HALF_OPEN_PER_PEER {
            comm_id += 1;
            fake.send_mad(&CmMad::new(
                u64::from(comm_id),
                CmMessage::Req(fake_req(comm_id, 7006, fip, pip, &private)),
            ));
        }
        fakes.push((fip, fake));
    }
    // Everything queued (a request the device has not read yet would
    // arrive after the newcomer's): wait until the queue is full.
    let deadline = Instant::now() + LONG;
    while listener.dev.control().cm.listeners[&7006].len() < LISTEN_BACKLOG {
        assert!(Instant::now() < deadline, "the flood was not queued");
        listener.dev.control_step(Instant::now(), true);
        std::thread::sleep(Duration::from_millis(1));
    }
    // The newcomer: the queue is full, so the heaviest address's youngest
    // request makes room.
    let (_, nip) = addrs();
    let mut newcomer = Fake::new(nip, pip);
    let private = private_from(nip);
    newcomer.send_mad(&CmMad::new(
        0x4242,
        CmMessage::Req(fake_req(0x4242, 7006, nip, pip, &private)),
    ));
    let deadline = Instant::now() + LONG;
    while listener.dev.stats().half_open_refused < 1 {
        assert!(Instant::now() < deadline, "no request made room");
        listener.dev.control_step(Instant::now(), true);
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(listener.dev.stats().half_open_refused, 1);
    // The application takes at most MAX_ACCEPTING, holding them...
    let mut held = Vec::new();
    while let Ok(inc) = listener.accept(Duration::from_millis(200)) {
        held.push(inc);
        assert!(
            held.len() <= MAX_ACCEPTING,
            "more than the bound handed over"
        );
    }
    assert_eq!(held.len(), MAX_ACCEPTING);
    // ...and each one it refuses frees a place. Addresses take turns, so
    // the newcomer comes with the first round over the addresses, far
    // ahead of the ~1,000 requests queued before it.
    let mut taken = held.len();
    let mut newcomer_at = None;
    while newcomer_at.is_none() && taken <= flooders + 1 {
        let refused = held.remove(0);
        drop(refused); // a REJ to that requester
        let inc = listener
            .accept(LONG)
            .expect("a request after one was refused");
        taken += 1;
        if inc.peer_ip() == Some(nip) {
            newcomer_at = Some(taken);
        }
        held.push(inc);
    }
    assert!(
        newcomer_at.is_some(),
        "the newcomer was not among the first {} requests handed over",
        flooders + 1
    );
}

/// Every accepting place is held by a REP its requester never answers,
/// and a newcomer's request waits. Once those REPs went unanswered past a
/// retransmission, the newcomer does not wait for their retries to run
/// out: one REP is given up (REJ "timeout" after fewer REPs than the
/// retries allow), its place goes to the newcomer, and its address is
/// suspect from then on.
#[test]
fn an_unanswered_rep_gives_its_place_to_a_newcomer_before_its_retries_run_out() {
    use super::cm::MAX_ACCEPTING;
    let (_, pip) = addrs(); // a device of its own
    let port = 7008;
    let url = format!("roce://{pip}:{port}?udp_port={UDP}");
    let ctx = Roce::open(&url).unwrap();
    let listener = ctx.listen(&url).unwrap();
    // Each flooding address asks twice: its second request ranks behind
    // the newcomer's, which has no place yet.
    let mut flooders = Vec::new();
    for k in 0..MAX_ACCEPTING as u32 {
        let (_, fip) = addrs();
        let mut fake = Fake::new(fip, pip);
        let private = req_private(fip, pip);
        for j in 0..2 {
            let id = 0x2_0000 + 2 * k + j;
            fake.send_mad(&CmMad::new(
                u64::from(id),
                CmMessage::Req(fake_req(id, port, fip, pip, &private)),
            ));
        }
        flooders.push((fip, fake));
    }
    let deadline = Instant::now() + LONG;
    while listener.dev.control().cm.listeners[&port].len() < 2 * MAX_ACCEPTING {
        assert!(Instant::now() < deadline, "the flood was not queued");
        std::thread::sleep(Duration::from_millis(1));
    }
    // The application accepts every place; no RTU ever comes.
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let mut accepted = Vec::new();
    for _ in 0..MAX_ACCEPTING {
        let inc = listener.accept(LONG).unwrap();
        let pqp = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
        accepted.push(inc.accept(pqp, b"").unwrap());
    }
    let (_, nip) = addrs();
    let mut newcomer = Fake::new(nip, pip);
    let private = req_private(nip, pip);
    newcomer.send_mad(&CmMad::new(
        0x4343,
        CmMessage::Req(fake_req(0x4343, port, nip, pip, &private)),
    ));
    let inc = listener.accept(LONG).expect("the newcomer gets a place");
    assert_eq!(inc.peer_ip(), Some(nip));
    // Exactly one flooder lost its place early: its REJ came after fewer
    // REPs than the initial one and its retries. The others got theirs
    // when their retries ran out.
    let mut early = Vec::new();
    for (fip, fake) in &flooders {
        let mut reps = 0;
        let reason = loop {
            let m = fake.recv_mad();
            match CmMad::parse(&m).unwrap().message {
                CmMessage::Rep(_) => reps += 1,
                CmMessage::Rej(j) => break j.reason,
                _ => {}
            }
        };
        assert_eq!(reason, ibcm::rej_reason::TIMEOUT);
        if reps < 1 + usize::from(REP_RETRIES) {
            early.push((*fip, reps));
        }
    }
    assert_eq!(early.len(), 1, "{early:?}");
    let (victim, reps) = early[0];
    assert!(reps >= 2, "given up before a retransmission: {reps} REP(s)");
    assert!(listener.dev.control().cm.is_suspect(victim, Instant::now()));
}

/// A request the application never takes is refused (REJ "timeout") once
/// it has waited `QUEUE_TIMEOUT` in the queue, so a stale request neither
/// holds its place nor gets a REP its sender gave up on.
#[test]
fn a_request_left_in_the_queue_is_refused_after_the_queue_timeout() {
    use super::cm::QUEUE_TIMEOUT;
    let (_, pip) = addrs(); // a device of its own, as above
    let (_, fip) = addrs();
    let mut fake = Fake::new(fip, pip);
    let url = format!("roce://{pip}:7007?udp_port={UDP}");
    let ctx = Roce::open(&url).unwrap();
    let listener = ctx.listen(&url).unwrap();
    let private = req_private(fip, pip);
    fake.send_mad(&CmMad::new(
        0x77,
        CmMessage::Req(fake_req(0x7777, 7007, fip, pip, &private)),
    ));
    let deadline = Instant::now() + LONG;
    while listener.dev.control().cm.listeners[&7007].is_empty() {
        assert!(Instant::now() < deadline, "the request was not queued");
        listener.dev.control_step(Instant::now(), true);
        std::thread::sleep(Duration::from_millis(1));
    }
    // Just short of the timeout it stays; past it, it goes with a REJ.
    let queued = Instant::now();
    listener.dev.control_step(queued + QUEUE_TIMEOUT / 2, true);
    assert_eq!(listener.dev.control().cm.listeners[&7007].len(), 1);
    listener
        .dev
        .control_step(queued + QUEUE_TIMEOUT + Duration::from_secs(1), true);
    assert!(listener.dev.control().cm.listeners[&7007].is_empty());
    loop {
        let m = fake.recv_mad();
        if let CmMessage::Rej(j) = CmMad::parse(&m).unwrap().message {
            assert_eq!(j.remote_comm_id, 0x7777);
            assert_eq!(j.reason, ibcm::rej_reason::TIMEOUT);
            break;
        }
    }
    assert!(matches!(
        listener.accept(Duration::from_millis(50)),
        Err(VerbsError::Timeout)
    ));
}

/// A shard whose lock another thread holds is being driven by it (a poll
/// or a post is running): the device's thread counts it as driven and so
/// waits, rather than trying again at once and taking the core from the
/// thread that holds the lock (docs/ROCE.md, "Who drives a device").
#[test]
fn a_shard_whose_lock_is_held_counts_as_driven() {
    // A device of its own (the provider address is every test's).
    let (_, ip) = addrs();
    let dev =
        super::device::Device::at(SocketAddrV4::new(ip, UDP), &RoceConfig::default()).unwrap();
    let shard = {
        let ctl = dev.control();
        dev.new_shard(&ctl)
    };
    // Idle by the device's rule: no thread has driven it for `idle_after`.
    std::thread::sleep(RoceConfig::default().idle_after * 5);
    let held = lock(&shard.state);
    let pass = dev.idle_pass(Instant::now());
    assert_eq!((pass.polled, pass.drove, pass.nobody_reads), (1, 0, false));
    drop(held);
    dev.remove_shard(&shard);
}
