//! A REP that a real Linux kernel sent, replayed to our `roce` provider.
//!
//! `data/linux_rep.hex` is the whole RoCE packet (BTH, DETH, the 256-byte
//! CM MAD, ICRC) of the first REP that knfsd's RDMA CM (Debian's 6.1
//! kernel, rdma_rxe) sent to our client in
//! `control/tests/linux_peer.rs`, captured on the wire
//! (`RPCRDMA_SAVE_LINUX_REP=PATH` writes it). Replayed here through a
//! plain UDP socket playing Linux, only the two fields that name our REQ
//! are patched: the MAD transaction ID and the REP's Remote Communication
//! ID (our REQ draws both afresh every time); the ICRC is resealed for the
//! loopback addresses. Everything else, the Starting PSN among it, is what
//! Linux put on the wire.
//!
//! What it pins: our first Send goes to the QPN the REP names and carries
//! the REP's Starting PSN. Linux's rxe checks the first packet it receives
//! against the PSN it announced in that field; had we started anywhere
//! else, it would have answered with a PSN sequence error NAK and the
//! connection would never have carried a call.
//!
//! The same REP, with a DREQ sent ahead of it, pins how the connecting
//! side treats a DREQ that overtakes the REP of its connect.
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use dataplane::mem::{Arena, Slab, WrKind};
use dataplane::verbs::roce::Roce;
use dataplane::verbs::*;
use dataplane::wire::ibcm::{CmMad, CmMessage, Dreq, Req, GSI_QPN};
use dataplane::wire::roce::icrc::{self, Ipv4Header, UdpPorts};
use dataplane::wire::roce::{Aeth, Bth, Opcode, RocePacket, Syndrome};

const PATIENCE: Duration = Duration::from_secs(20);
const UDP: u16 = 47_941;
/// Offsets in the RoCE packet: BTH 12 bytes, DETH 8, then the MAD (24-byte
/// header, then the CM message).
const MAD_AT: usize = 12 + 8;
const TID_AT: usize = MAD_AT + 8;
const REP_AT: usize = MAD_AT + 24;

fn linux_rep() -> Vec<u8> {
    let hex: String = include_str!("data/linux_rep.hex")
        .split_whitespace()
        .collect();
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

/// Plays Linux: a UDP socket on the RoCEv2 port of its own address.
struct Linux {
    sock: UdpSocket,
    me: Ipv4Addr,
    peer: SocketAddrV4,
}

impl Linux {
    fn new(me: Ipv4Addr, peer: Ipv4Addr) -> Linux {
        let sock = UdpSocket::bind((me, UDP)).unwrap();
        // DF set and IP ID 0, as rxe and our provider send: the ICRC
        // covers the IP header with those fields as they are.
        let v: i32 = libc::IP_PMTUDISC_DO;
        // SAFETY: a valid socket and a pointer to an i32 that outlives the call.
        unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                &v as *const i32 as *const libc::c_void,
                4,
            )
        };
        sock.set_read_timeout(Some(PATIENCE)).unwrap();
        Linux {
            sock,
            me,
            peer: SocketAddrV4::new(peer, UDP),
        }
    }

    fn recv(&self) -> Vec<u8> {
        let mut b = vec![0u8; 9000];
        let (n, _) = self
            .sock
            .recv_from(&mut b)
            .expect("the provider went silent");
        b.truncate(n);
        b
    }

    fn recv_mad(&self) -> Vec<u8> {
        loop {
            let b = self.recv();
            if RocePacket::parse(&b).unwrap().bth.dest_qpn == GSI_QPN {
                return b;
            }
        }
    }

    fn recv_rc(&self) -> Vec<u8> {
        loop {
            let b = self.recv();
            if RocePacket::parse(&b).unwrap().bth.dest_qpn != GSI_QPN {
                return b;
            }
        }
    }

    /// Sends a whole RoCE packet after sealing its ICRC for our addresses.
    fn send_raw(&self, mut b: Vec<u8>) {
        let ip = Ipv4Header::plain_udp_socket(self.me.octets(), self.peer.ip().octets());
        let ports = UdpPorts { src: UDP, dst: UDP };
        icrc::seal_ipv4(&ip, ports, &mut b).unwrap();
        self.sock.send_to(&b, self.peer).unwrap();
    }

    fn send(&self, p: &RocePacket<'_>) {
        let mut b = vec![0u8; p.buffer_len()];
        p.emit(&mut b).unwrap();
        self.send_raw(b);
    }
}

/// Our side, connected by a thread: context, memory, CQ and QP.
struct Side {
    qp: dataplane::verbs::roce::RoceQp,
    cq: dataplane::verbs::roce::RoceCq,
    local: Slab,
    _recv: Slab,
    _mrs: Vec<dataplane::verbs::roce::RoceMr>,
    _pd: dataplane::verbs::roce::RocePd,
    _ctx: dataplane::verbs::roce::RoceContext,
}

/// Our side's connect, on its thread: the side and the REP's private data.
type Connecting = std::thread::JoinHandle<(Side, Vec<u8>)>;

fn connect_side(url: String) -> Connecting {
    std::thread::spawn(move || {
        let ctx = Roce::open(&url).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(64).unwrap();
        let arena = Arena::new(1 << 20).unwrap();
        let lw = Access::LOCAL_WRITE;
        let m1 = pd.register(&arena, 0, 1 << 19, lw).unwrap();
        let m2 = pd.register(&arena, 1 << 19, 1 << 19, lw).unwrap();
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
        let (qp, private) = pqp.connect(&url, b"rpcrdma", PATIENCE).unwrap();
        let side = Side {
            qp,
            cq,
            local,
            _recv: recv,
            _mrs: vec![m1, m2],
            _pd: pd,
            _ctx: ctx,
        };
        (side, private.to_vec())
    })
}

/// Linux's UDP socket at 127.`net + 1`.x.y and our side connecting to it
/// from 127.`net`.x.y on a thread; returns both and the REQ our side sent.
fn linux_and_our_connect(net: u32) -> (Linux, Connecting, Vec<u8>) {
    let pid = std::process::id() & 0xFFFF;
    let ours = Ipv4Addr::from(net << 16 | pid);
    let theirs = Ipv4Addr::from((net + 1) << 16 | pid);
    let linux = Linux::new(theirs, ours);
    let t = connect_side(format!(
        "roce://{theirs}:20049?udp_port={UDP}&local={ours}&verify_icrc=1"
    ));
    let req_pkt = linux.recv_mad();
    (linux, t, req_pkt)
}

/// The REQ in `req_pkt`.
fn req_of(req_pkt: &[u8]) -> Req<'_> {
    let p = RocePacket::parse(req_pkt).unwrap();
    match CmMad::parse(p.payload).unwrap().message {
        CmMessage::Req(req) => req,
        other => panic!("expected REQ, got {other:?}"),
    }
}

/// Linux's REP, answering the REQ in `req_pkt`. The only patches: the
/// transaction ID our REQ used and its Communication ID as the REP's
/// Remote Communication ID.
fn rep_answering(req_pkt: &[u8]) -> Vec<u8> {
    let mut rep = linux_rep();
    rep[TID_AT..TID_AT + 8].copy_from_slice(&req_pkt[TID_AT..TID_AT + 8]);
    rep[REP_AT + 4..REP_AT + 8].copy_from_slice(&req_of(req_pkt).local_comm_id.to_be_bytes());
    rep
}

fn next_completion(cq: &dataplane::verbs::roce::RoceCq) -> Completion {
    let deadline = Instant::now() + PATIENCE;
    let mut out = [Completion::default()];
    loop {
        if cq.poll(&mut out) == 1 {
            return std::mem::take(&mut out[0]);
        }
        assert!(Instant::now() < deadline, "no completion");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn the_fixture_is_the_rep_linux_sent() {
    let rep = linux_rep();
    // 12 + 8 + 256 + 4 bytes: BTH, DETH, MAD, and Linux's ICRC (which the
    // live test verified against the IP header it came with).
    assert_eq!(rep.len(), 280);
    let p = RocePacket::parse(&rep).unwrap();
    assert_eq!(p.bth.opcode, Opcode::UdSendOnly);
    assert_eq!(p.bth.dest_qpn, GSI_QPN);
    let m = CmMad::parse(p.payload).unwrap();
    let CmMessage::Rep(r) = m.message else {
        panic!("not a REP: {:?}", m.message)
    };
    // The Starting PSN field, bytes 20..23 of the REP (IBTA Vol. 1
    // 12.6.8), read raw and through our decoder.
    let raw = u32::from_be_bytes([0, rep[REP_AT + 20], rep[REP_AT + 21], rep[REP_AT + 22]]);
    assert_eq!(r.starting_psn.value(), raw);
    // knfsd's REP: its QPN, RFC 8797 private data (magic 0xf6ab0e18,
    // version 1, 4 KiB inline both ways), no responder resources (the
    // server never serves RDMA Reads to the client), 16 initiator depth.
    assert_eq!(r.local_qpn, 0x11);
    assert_eq!(&r.private_data[..8], &[0xf6, 0xab, 0x0e, 0x18, 1, 0, 3, 3]);
    assert_eq!((r.responder_resources, r.initiator_depth), (0, 16));
}

#[test]
fn our_first_send_carries_the_starting_psn_of_linuxs_rep() {
    let (linux, t, req_pkt) = linux_and_our_connect(0x7F45);
    let req = req_of(&req_pkt);
    let rep = rep_answering(&req_pkt);
    let (rep_qpn, rep_psn) = {
        let p = RocePacket::parse(&rep).unwrap();
        let CmMessage::Rep(r) = CmMad::parse(p.payload).unwrap().message else {
            unreachable!()
        };
        (r.local_qpn, r.starting_psn)
    };
    linux.send_raw(rep);

    let rtu = linux.recv_mad();
    let rtu_p = RocePacket::parse(&rtu).unwrap();
    assert!(matches!(
        CmMad::parse(rtu_p.payload).unwrap().message,
        CmMessage::Rtu(_)
    ));
    let (mut side, private) = t.join().unwrap();
    assert_eq!(
        &private[..4],
        &[0xf6, 0xab, 0x0e, 0x18],
        "RFC 8797 private data"
    );

    let mut b = side.local.alloc().unwrap();
    assert!(b.fill(b"first call"));
    side.qp
        .post_send(SendWr::new(
            b.wr_id(),
            SendOp::Send,
            SgeList::one(Sge::data(b)),
        ))
        .unwrap();
    let raw = linux.recv_rc();
    let p = RocePacket::parse(&raw).unwrap();
    assert_eq!(p.bth.opcode, Opcode::RcSendOnly);
    assert_eq!(p.bth.dest_qpn, rep_qpn, "to the QPN of Linux's REP");
    assert_eq!(
        p.bth.psn, rep_psn,
        "our first Send carries the Starting PSN of Linux's REP"
    );
    assert_eq!(p.payload, b"first call");
    // Linux ACKs it (what rxe does with a packet at the expected PSN).
    let mut ack = RocePacket::new(Bth::new(Opcode::RcAcknowledge, req.local_qpn, rep_psn), &[]);
    ack.aeth = Some(Aeth {
        syndrome: Syndrome::ACK,
        msn: 1,
    });
    linux.send(&ack);
    let c = next_completion(&side.cq);
    assert!(c.is_ok(), "{:?} {:?}", c.opcode, c.status);
}

/// A DREQ that overtakes the REP it follows (the accepting side of a
/// failed bind accepts and disconnects at once) must not end our connect
/// before the REP is in: no DREP answers that first DREQ, the REP gets its
/// RTU and `connect` returns the REP's private data; the DREQ repeated
/// afterwards, as the peer's DREQ retries do, gets the DREP and ends the
/// connection.
#[test]
fn a_dreq_ahead_of_its_rep_waits_for_the_rep() {
    let (linux, t, req_pkt) = linux_and_our_connect(0x7F47);
    let req = req_of(&req_pkt);
    let rep = rep_answering(&req_pkt);
    let rep_comm_id = {
        let p = RocePacket::parse(&rep).unwrap();
        let CmMessage::Rep(r) = CmMad::parse(p.payload).unwrap().message else {
            unreachable!()
        };
        r.local_comm_id
    };
    // The DREQ goes in the REP's packet (same BTH and DETH, QP1 to QP1).
    let dreq = |tid: u64| {
        let mad = CmMad::new(
            tid,
            CmMessage::Dreq(Dreq {
                local_comm_id: rep_comm_id,
                remote_comm_id: req.local_comm_id,
                remote_qpn: req.local_qpn,
                private_data: &[],
            }),
        );
        let mut b = rep.clone();
        mad.emit(&mut b[MAD_AT..MAD_AT + 256]).unwrap();
        b
    };
    // Both queued on our socket, the DREQ first.
    linux.send_raw(dreq(0x0D_0001));
    linux.send_raw(rep.clone());

    let next = linux.recv_mad();
    let m = CmMad::parse(RocePacket::parse(&next).unwrap().payload).unwrap();
    assert!(
        matches!(m.message, CmMessage::Rtu(_)),
        "the REP is answered with an RTU, the early DREQ not at all: {:?}",
        m.message
    );
    let (side, private) = t.join().unwrap();
    assert_eq!(
        &private[..4],
        &[0xf6, 0xab, 0x0e, 0x18],
        "the REP's private data"
    );
    assert!(!side.qp.peer_disconnected());

    // The peer repeats its DREQ: now it is answered and ends the connection.
    linux.send_raw(dreq(0x0D_0002));
    let drep = linux.recv_mad();
    let m = CmMad::parse(RocePacket::parse(&drep).unwrap().payload).unwrap();
    assert!(matches!(m.message, CmMessage::Drep(_)), "{:?}", m.message);
    assert_eq!(m.tid, 0x0D_0002, "the DREP answers the repeated DREQ");
    let deadline = Instant::now() + PATIENCE;
    while !side.qp.peer_disconnected() {
        assert!(
            Instant::now() < deadline,
            "the connection never saw the DREQ"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}
