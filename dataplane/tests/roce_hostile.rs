//! A hostile host on the same network cannot disturb a `roce`
//! connection: garbage datagrams, truncated and mutated packets (the fuzz
//! seeds), well-formed RC packets aimed at our QPs from an address that is
//! not the peer's, and CM MADs (DREQ naming our QPs, REPs, REQs for
//! unknown services) are dropped or refused; the connection then still
//! moves Sends, Writes and Reads byte-exact and nothing panicked.
mod support;

use std::net::{Ipv4Addr, UdpSocket};
use std::path::PathBuf;

use dataplane::verbs::*;
use dataplane::wire::ibcm::{gsi_packet, CmMad, CmMessage, Dreq, MAD_LEN};
use dataplane::wire::roce::{Bth, Opcode, Psn, RocePacket};
use support::roce_pair::{loopback_url, pair, pattern, wait, Endpoint};

fn is_send(c: &Completion) -> bool {
    !matches!(c.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm)
}

fn exchange(a: &mut Endpoint, b: &mut Endpoint, seed: u64) {
    let key = b.key();
    let data = pattern(seed, 70_000);
    b.post_recv();
    a.post(SendOp::Send, &data, 0);
    assert!(wait(a, is_send).is_ok());
    let c = wait(b, |c| !is_send(c));
    assert!(c.is_ok());
    assert!(c.sgl.iter().next().unwrap().buf.to_vec() == data[..]);
    drop(c);
    a.post(SendOp::Write(key.at(0)), &data, 0);
    assert!(wait(a, is_send).is_ok());
    let mut landed = vec![0u8; data.len()];
    assert!(b.rdma().read(0, &mut landed) && landed == data);
    a.post(SendOp::Read(key.at(0)), &[], data.len() as u32);
    let c = wait(a, is_send);
    assert!(c.is_ok());
    assert!(c.sgl.iter().next().unwrap().buf.to_vec() == data[..]);
}

fn hostile_datagrams(qpns: &[u32]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    // Random bytes of every length up to 300.
    let mut x = 0x1234_5678_9ABC_DEF1u64;
    for len in 0..300 {
        let mut v = Vec::with_capacity(len);
        for _ in 0..len {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            v.push(x as u8);
        }
        out.push(v);
    }
    // The fuzz seeds, their truncations and word-wise mutations.
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/roce_packet");
    for e in std::fs::read_dir(dir).expect("seeds") {
        let seed = std::fs::read(e.unwrap().path()).unwrap();
        for cut in 0..seed.len() {
            out.push(seed[..cut].to_vec());
        }
        for w in (0..seed.len()).step_by(4) {
            let mut m = seed.clone();
            let end = (w + 4).min(m.len());
            m[w..end].fill(0xFF);
            out.push(m);
        }
        // Aimed at our QPs.
        for &q in qpns {
            let mut m = seed.clone();
            if m.len() >= 12 {
                m[5..8].copy_from_slice(&q.to_be_bytes()[1..]);
                out.push(m);
            }
        }
    }
    // Well-formed RC requests and ACK/NAKs for our QPs, any PSN.
    for &q in qpns {
        for psn in [0u32, 1, 0x7F_FFFF, 0xFF_FFFF] {
            for op in [Opcode::RcSendOnly, Opcode::RcAcknowledge] {
                let mut p = RocePacket::new(Bth::new(op, q, Psn::from_masked(psn)), &[]);
                if op == Opcode::RcAcknowledge {
                    p.aeth = Some(dataplane::wire::roce::Aeth {
                        syndrome: dataplane::wire::roce::Syndrome::Nak(
                            dataplane::wire::roce::NakCode::RemoteAccessError,
                        ),
                        msn: 0,
                    });
                }
                let mut b = vec![0u8; p.buffer_len()];
                p.emit(&mut b).unwrap();
                out.push(b);
            }
        }
        // A DREQ naming our QP, with made-up communication IDs.
        for ids in [(1u32, 2u32), (0, 0), (u32::MAX, 7)] {
            let m = CmMad::new(
                9,
                CmMessage::Dreq(Dreq {
                    local_comm_id: ids.0,
                    remote_comm_id: ids.1,
                    remote_qpn: q,
                    private_data: &[],
                }),
            );
            let mut mad = [0u8; MAD_LEN];
            m.emit(&mut mad).unwrap();
            let p = gsi_packet(Psn::default(), &mad);
            let mut b = vec![0u8; p.buffer_len()];
            p.emit(&mut b).unwrap();
            out.push(b);
        }
    }
    out
}

#[test]
fn garbage_and_spoofed_packets_do_not_disturb_a_connection() {
    // ICRC verification off: the garbage must reach the parsers.
    let url = loopback_url("");
    let (mut a, mut b) = pair(&url, 0);
    exchange(&mut a, &mut b, 1);
    let dev = a.qp.local_addr();
    // Another address of this host: not the peer of either QP.
    let ip = Ipv4Addr::from(u32::from(*dev.ip()) ^ 0x0000_0100);
    let hostile = UdpSocket::bind((ip, 0)).unwrap();
    let qpns = [a.qp.qp_num(), b.qp.qp_num()];
    let mut sent = 0;
    for (i, d) in hostile_datagrams(&qpns).iter().enumerate() {
        if hostile.send_to(d, dev).is_ok() {
            sent += 1;
        }
        if i % 64 == 0 {
            // Let the device take them in (polling drives it).
            let mut out = [Completion::default()];
            assert_eq!(a.poll(&mut out), 0, "garbage produced a completion");
            assert_eq!(b.poll(&mut out), 0, "garbage produced a completion");
        }
    }
    assert!(sent > 500);
    exchange(&mut a, &mut b, 2);
    exchange(&mut b, &mut a, 3);
    assert_eq!(a.qp.state(), QpState::Rts);
    assert_eq!(b.qp.state(), QpState::Rts);
}
