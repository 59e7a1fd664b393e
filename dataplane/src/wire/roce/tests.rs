//! Golden bytes (hand-assembled from the IBTA Vol. 1 ch. 9 layouts),
//! ICRC vectors (a ConnectX-4 Lx capture and hand-built frames checked
//! with zlib and with a bitwise CRC below), PSN and segmentation rules, and
//! property tests.

use super::icrc::{self, Ipv4Header, Ipv6Header, UdpPorts};
use super::seg::{self, MessageKind, Mtu, Segments};
use super::*;
use proptest::prelude::*;

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn psn(v: u32) -> Psn {
    Psn::new(v).unwrap()
}

/// Deconstruct, construct, round trip, truncation at every offset, short
/// output buffers.
fn check_golden(bytes: &[u8], repr: &RocePacket<'_>) {
    let parsed = RocePacket::parse(bytes).expect("golden parses");
    assert_eq!(&parsed, repr);
    assert_eq!(repr.buffer_len(), bytes.len());
    let mut buf = vec![0xAAu8; bytes.len()];
    assert_eq!(repr.emit(&mut buf), Ok(bytes.len()));
    // Golden ICRC slots are zero: emit leaves sealing to `icrc`.
    assert_eq!(&buf[..], bytes);
    assert_eq!(RocePacket::parse(&buf).as_ref(), Ok(repr));
    // Around the payload: the same bytes but the payload's, which it
    // leaves as they were (the caller gathers them in).
    let mut around = vec![0xAAu8; bytes.len()];
    assert_eq!(repr.emit_around_payload(&mut around), Ok(bytes.len()));
    let (at, n) = (repr.payload_offset(), repr.payload.len());
    assert!(around[at..at + n].iter().all(|&b| b == 0xAA));
    around[at..at + n].copy_from_slice(repr.payload);
    assert_eq!(&around[..], bytes);
    let view = Packet::new_checked(bytes).unwrap();
    assert_eq!(view.opcode(), Some(repr.bth.opcode));
    assert_eq!(view.psn(), repr.bth.psn);
    assert_eq!(view.dest_qpn(), repr.bth.dest_qpn);
    assert_eq!(view.pad_count(), repr.pad_len());
    assert_eq!(view.tver(), 0);
    // A cut inside the headers fails; a cut in the payload may leave a
    // shorter valid packet (the UDP length is what delimits a RoCE packet)
    // but never this one.
    for cut in 0..bytes.len() {
        let r = RocePacket::parse(&bytes[..cut]);
        if cut < repr.payload_offset() + ICRC_LEN {
            assert!(r.is_err(), "cut at {cut} parsed: {r:?}");
        }
        assert_ne!(r.as_ref(), Ok(repr));
    }
    for short in 0..bytes.len() {
        let mut out = vec![0x55u8; short];
        assert_eq!(repr.emit(&mut out), Err(Error::BufferTooShort));
        assert!(out.iter().all(|&b| b == 0x55));
    }
}

#[test]
fn golden_send_only_with_pad() {
    // opcode 04 | SE0 M0 PadCnt3 TVer0 | P_Key ffff | 00 | QPN 000011
    // | AckReq | PSN 000123 | "hello" | pad 000000 | ICRC slot
    let bytes = hex("04 30 ffff 00 000011 80 000123 68656c6c6f 000000 00000000");
    let mut bth = Bth::new(Opcode::RcSendOnly, 0x11, psn(0x123));
    bth.ack_req = true;
    check_golden(&bytes, &RocePacket::new(bth, b"hello"));
}

#[test]
fn golden_write_only_imm() {
    // 0x0B: RETH (VA, R_Key, len) then ImmDt, 8-byte payload, no pad, SE.
    let bytes = hex("0b 80 ffff 00 abcdef 80 fffffe
         0000 7f00 1234 5678  cafe0001  00000008
         deadbeef
         0102030405060708 00000000");
    let mut bth = Bth::new(Opcode::RcWriteOnlyImm, 0xABCDEF, psn(0xFF_FFFE));
    bth.solicited = true;
    bth.ack_req = true;
    let mut p = RocePacket::new(bth, &[1, 2, 3, 4, 5, 6, 7, 8]);
    p.reth = Some(Reth {
        va: 0x7F00_1234_5678,
        rkey: 0xCAFE_0001,
        dma_len: 8,
    });
    p.immdt = Some(0xDEAD_BEEF);
    check_golden(&bytes, &p);
}

#[test]
fn golden_read_request() {
    let bytes = hex("0c 00 ffff 00 000102 80 000010
         0000000000001000 00000042 00010000 00000000");
    let mut bth = Bth::new(Opcode::RcReadRequest, 0x102, psn(0x10));
    bth.ack_req = true;
    let mut p = RocePacket::new(bth, &[]);
    p.reth = Some(Reth {
        va: 0x1000,
        rkey: 0x42,
        dma_len: 0x10000,
    });
    check_golden(&bytes, &p);
}

#[test]
fn golden_acks() {
    // ACK, credit 0x1F as rxe sends, MSN 5.
    let ack = hex("11 00 ffff 00 000007 00 000123 1f000005 00000000");
    let mut p = RocePacket::new(Bth::new(Opcode::RcAcknowledge, 7, psn(0x123)), &[]);
    p.aeth = Some(Aeth {
        syndrome: Syndrome::ACK,
        msn: 5,
    });
    check_golden(&ack, &p);
    // RNR NAK with timer code 14 (1.28 ms).
    let rnr = hex("11 00 ffff 00 000007 00 000123 2e000005 00000000");
    p.aeth = Some(Aeth {
        syndrome: Syndrome::RnrNak { timer: 14 },
        msn: 5,
    });
    check_golden(&rnr, &p);
    assert_eq!(rnr_timer_usec(14), 1_280);
    assert_eq!(rnr_timer_usec(0), 655_360);
    // NAK: PSN sequence error and remote access error.
    for (b, code) in [
        (0x60, NakCode::PsnSequenceError),
        (0x61, NakCode::InvalidRequest),
        (0x62, NakCode::RemoteAccessError),
        (0x63, NakCode::RemoteOperationalError),
    ] {
        let mut bytes = ack.clone();
        bytes[12] = b;
        p.aeth = Some(Aeth {
            syndrome: Syndrome::Nak(code),
            msn: 5,
        });
        check_golden(&bytes, &p);
    }
}

#[test]
fn golden_read_response_first_and_middle() {
    let first = hex("0d 00 ffff 00 000009 00 000200 1f000001 aabbccdd 00000000");
    let mut p = RocePacket::new(
        Bth::new(Opcode::RcReadResponseFirst, 9, psn(0x200)),
        &[0xAA, 0xBB, 0xCC, 0xDD],
    );
    p.aeth = Some(Aeth {
        syndrome: Syndrome::ACK,
        msn: 1,
    });
    check_golden(&first, &p);
    let middle = hex("0e 00 ffff 00 000009 00 000201 aabbccdd 00000000");
    let p = RocePacket::new(
        Bth::new(Opcode::RcReadResponseMiddle, 9, psn(0x201)),
        &[0xAA, 0xBB, 0xCC, 0xDD],
    );
    check_golden(&middle, &p);
}

#[test]
fn golden_send_only_inv_and_last_imm() {
    let inv = hex("17 20 ffff 00 000003 80 000000 11223344 0102 0000 00000000");
    let mut bth = Bth::new(Opcode::RcSendOnlyInv, 3, psn(0));
    bth.ack_req = true;
    let mut p = RocePacket::new(bth, &[1, 2]);
    p.ieth = Some(0x1122_3344);
    check_golden(&inv, &p);
    let imm = hex("03 10 ffff 00 000003 80 000004 00000007 010203 00 00000000");
    let mut bth = Bth::new(Opcode::RcSendLastImm, 3, psn(4));
    bth.ack_req = true;
    let mut p = RocePacket::new(bth, &[1, 2, 3]);
    p.immdt = Some(7);
    check_golden(&imm, &p);
}

#[test]
fn golden_ud_gsi_send() {
    // CM MAD transport: UD SEND_ONLY to QP1, DETH Q_Key 0x80010000, SrcQP 1.
    let mut bytes = hex("64 00 ffff 00 000001 00 000000 80010000 00 000001");
    bytes.extend_from_slice(&[0x5A; 256]);
    bytes.extend_from_slice(&[0; 4]);
    let payload = [0x5Au8; 256];
    // Built by hand (`ibcm::gsi_packet` builds the same, checked in the
    // ibcm tests): this module sits below `ibcm` and does not call it.
    let mut p = RocePacket::new(Bth::new(Opcode::UdSendOnly, 1, psn(0)), &payload);
    p.deth = Some(Deth {
        qkey: 0x8001_0000,
        src_qpn: 1,
    });
    check_golden(&bytes, &p);
}

#[test]
fn fecn_becn_and_reserved_bits() {
    // FECN/BECN decode; reserved bits are ignored on parse, zero on emit.
    let bytes = hex("04 00 ffff ff 000011 ff 000123 00000000");
    let p = RocePacket::parse(&bytes).unwrap();
    assert!(p.bth.fecn && p.bth.becn && p.bth.ack_req);
    let mut out = [0u8; 16];
    p.emit(&mut out).unwrap();
    assert_eq!(out[4], 0xC0);
    assert_eq!(out[8], 0x80);
}

#[test]
fn hostile_packets() {
    let good = hex("04 30 ffff 00 000011 80 000123 68656c6c6f 000000 00000000");
    // TVer != 0.
    let mut b = good.clone();
    b[1] |= 0x01;
    assert_eq!(RocePacket::parse(&b), Err(Error::Malformed));
    // Unknown opcodes: atomics, UC, CNP, RD.
    for op in [0x12, 0x13, 0x14, 0x24, 0x81, 0x40, 0xFF] {
        let mut b = good.clone();
        b[0] = op;
        assert_eq!(RocePacket::parse(&b), Err(Error::UnknownValue), "{op:#x}");
    }
    // Payload area not a multiple of 4.
    let mut b = good.clone();
    b.insert(12, 0);
    assert_eq!(RocePacket::parse(&b), Err(Error::Malformed));
    // No room for the ICRC.
    let b2 = hex("04 00 ffff 00 000011 80 000123");
    assert_eq!(RocePacket::parse(&b2), Err(Error::Truncated));
    // Payload on an ACK.
    let b = hex("11 00 ffff 00 000007 00 000123 1f000005 00000000 00000000");
    assert_eq!(RocePacket::parse(&b), Err(Error::Malformed));
    // Reserved AETH syndrome type and NAK codes above 4.
    for syn in [0x40, 0x5F, 0x65, 0x7F, 0x80, 0xE0] {
        let b = hex(&format!(
            "11 00 ffff 00 000007 00 000123 {syn:02x}000005 00000000"
        ));
        assert_eq!(RocePacket::parse(&b), Err(Error::UnknownValue), "{syn:#x}");
    }
}

#[test]
fn pad_count_over_empty_payload() {
    // SEND_ONLY with no payload but PadCnt 3: the 0-byte area cannot hold
    // 3 pad bytes.
    let b = hex("04 30 ffff 00 000011 80 000123 00000000");
    assert_eq!(RocePacket::parse(&b), Err(Error::Malformed));
    // And a zero-length SEND_ONLY with PadCnt 0 is fine.
    let b = hex("04 00 ffff 00 000011 80 000123 00000000");
    assert_eq!(RocePacket::parse(&b).unwrap().payload, &[] as &[u8]);
}

#[test]
fn emit_rejects_inconsistent_reprs() {
    let bth = Bth::new(Opcode::RcWriteOnly, 1, psn(1));
    let mut buf = [0x77u8; 64];
    // Missing RETH.
    assert_eq!(
        RocePacket::new(bth, &[]).emit(&mut buf),
        Err(Error::Malformed)
    );
    // Extra AETH.
    let mut p = RocePacket::new(Bth::new(Opcode::RcSendOnly, 1, psn(1)), &[]);
    p.aeth = Some(Aeth {
        syndrome: Syndrome::ACK,
        msn: 0,
    });
    assert_eq!(p.emit(&mut buf), Err(Error::Malformed));
    // QPN beyond 24 bits.
    let p = RocePacket::new(Bth::new(Opcode::RcSendOnly, 1 << 24, psn(1)), &[]);
    assert_eq!(p.emit(&mut buf), Err(Error::Malformed));
    // Payload on a read request.
    let mut p = RocePacket::new(Bth::new(Opcode::RcReadRequest, 1, psn(1)), &[1]);
    p.reth = Some(Reth::default());
    assert_eq!(p.emit(&mut buf), Err(Error::Malformed));
    // Credit code out of range.
    let mut p = RocePacket::new(Bth::new(Opcode::RcAcknowledge, 1, psn(1)), &[]);
    p.aeth = Some(Aeth {
        syndrome: Syndrome::Ack { credit: 32 },
        msn: 0,
    });
    assert_eq!(p.emit(&mut buf), Err(Error::Malformed));
    assert!(buf.iter().all(|&b| b == 0x77));
}

#[test]
fn opcode_table_matches_rxe() {
    // (opcode, header bytes after BTH) from Linux rxe_opcode.c.
    let table: &[(u8, usize, bool)] = &[
        (0x00, 0, true),
        (0x01, 0, true),
        (0x02, 0, true),
        (0x03, 4, true),
        (0x04, 0, true),
        (0x05, 4, true),
        (0x06, 16, true),
        (0x07, 0, true),
        (0x08, 0, true),
        (0x09, 4, true),
        (0x0A, 16, true),
        (0x0B, 20, true),
        (0x0C, 16, false),
        (0x0D, 4, true),
        (0x0E, 0, true),
        (0x0F, 4, true),
        (0x10, 4, true),
        (0x11, 4, false),
        (0x16, 4, true),
        (0x17, 4, true),
        (0x64, 8, true),
        (0x65, 12, true),
    ];
    assert_eq!(table.len(), Opcode::ALL.len());
    for &(v, len, payload) in table {
        let op = Opcode::from_u8(v).unwrap();
        assert_eq!(op.to_u8(), v);
        assert_eq!(op.headers().len(), len, "{op:?}");
        assert_eq!(op.headers().payload, payload, "{op:?}");
        assert_eq!(op.is_ud(), v >= 0x60);
        assert_eq!(op.is_rc(), v < 0x20);
    }
}

// ---------------------------------------------------------------------------
// ICRC

/// Bitwise reflected CRC-32 seeded like rxe (0xDEBB20E3 = the state after
/// eight 0xFF bytes, which this check also confirms), independent of the
/// crc32fast tables the module uses.
fn bitwise_icrc(pseudo_and_rest: &[u8]) -> u32 {
    // rxe: crc32_le(0xdebb20e3, ...) on the raw register, inverted at the end.
    let mut crc: u32 = 0xDEBB_20E3;
    for &b in pseudo_and_rest {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn rxe_seed_is_eight_ones() {
    let mut crc: u32 = 0xFFFF_FFFF;
    for _ in 0..8 {
        crc ^= 0xFF;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    assert_eq!(crc, 0xDEBB_20E3);
}

/// A RoCEv2 CNP captured on a Mellanox ConnectX-4 Lx, published in scapy's
/// `test/contrib/roce.uts` ("RoCE CNP captured on ConnectX-4 Lx"): a
/// hardware-computed ICRC. Ethernet header dropped; the frame starts at IP.
const CX4_CNP: &str = "45c2 003c 718c 4000 4011 9161 0a00 1101 0a00 1201
                       0000 12b7 0028 0000
                       8100 ffff 4000 0118 0000 0000
                       0000 0000 0000 0000 0000 0000 0000 0000
                       82fd 002a";

#[test]
fn icrc_matches_connectx4_capture() {
    let frame = hex(CX4_CNP);
    assert_eq!(icrc::verify_frame(&frame), Ok(true));
    assert_eq!(icrc::compute_frame(&frame), Ok(0x2A00_FD82));
    // The same through the header-values path.
    let ip = Ipv4Header {
        src: [10, 0, 17, 1],
        dst: [10, 0, 18, 1],
        ident: 0x718C,
        flags_frag: icrc::IPV4_DF,
    };
    let ports = UdpPorts { src: 0, dst: 4791 };
    let mut roce = frame[28..].to_vec();
    assert_eq!(icrc::compute_ipv4(&ip, ports, &roce), Ok(0x2A00_FD82));
    roce[32..].fill(0);
    icrc::seal_ipv4(&ip, ports, &mut roce).unwrap();
    assert_eq!(roce[..], frame[28..]);
    // Headers and payload apart give the same ICRC, wherever they split
    // (a payload sent from where it lies).
    for split in [12, 16, 20, 28] {
        let body = &frame[28..frame.len() - 4];
        assert_eq!(
            icrc::compute_ipv4_parts(&ip, ports, &body[..split], &body[split..]),
            Ok(0x2A00_FD82),
            "split at {split}"
        );
    }
    assert_eq!(
        icrc::compute_ipv4_parts(&ip, ports, &frame[28..39], &[]),
        Err(Error::Truncated)
    );
    assert_eq!(
        icrc::compute_ipv4_parts(&ip, ports, &frame[28..40], &vec![0; 65_500]),
        Err(Error::LimitExceeded)
    );
    // BECN (byte 4 of the BTH) is masked: flipping it keeps the ICRC. The
    // IP ID is not: changing it breaks it.
    let mut f = frame.clone();
    f[28 + 4] ^= 0xC0;
    assert_eq!(icrc::verify_frame(&f), Ok(true));
    let mut f = frame.clone();
    f[5] ^= 1;
    assert_eq!(icrc::verify_frame(&f), Ok(false));
    // Independent bitwise CRC over the masked pseudo-header.
    let mut m = frame.clone();
    m[1] = 0xFF; // TOS
    m[8] = 0xFF; // TTL
    m[10..12].fill(0xFF); // IP checksum
    m[26..28].fill(0xFF); // UDP checksum
    m[32] = 0xFF; // BTH byte 4
    let crc = bitwise_icrc(&m[..m.len() - 4]);
    assert_eq!(crc.to_le_bytes(), [0x82, 0xFD, 0x00, 0x2A]);
}

/// Hand-assembled IPv4 frame (192.0.2.1 -> 192.0.2.2, ID 0, DF, TTL 64,
/// UDP 0xC001 -> 4791, checksum 0) carrying the SEND_ONLY "hello" golden
/// packet; ICRC 9d8a86ec computed independently with Python's
/// zlib.crc32(b'\xff'*8 + masked headers + rest).
const V4_SEND: &str = "4500 0034 0000 4000 4011 b6b5 c000 0201 c000 0202
                       c001 12b7 0020 0000
                       0430 ffff 0000 0011 8000 0123 6865 6c6c 6f00 0000
                       9d8a 86ec";

/// The same packet over IPv6 (2001:db8::1 -> ::2, TC 0, flow label 0x12345,
/// hop limit 64); ICRC 49eabf2f from zlib as above.
const V6_SEND: &str = "6001 2345 0020 1140
                       2001 0db8 0000 0000 0000 0000 0000 0001
                       2001 0db8 0000 0000 0000 0000 0000 0002
                       c001 12b7 0020 0000
                       0430 ffff 0000 0011 8000 0123 6865 6c6c 6f00 0000
                       49ea bf2f";

#[test]
fn icrc_hand_assembled_frames() {
    let v4 = hex(V4_SEND);
    assert_eq!(icrc::verify_frame(&v4), Ok(true));
    let mut bth = Bth::new(Opcode::RcSendOnly, 0x11, psn(0x123));
    bth.ack_req = true;
    let p = RocePacket::new(bth, b"hello");
    let mut roce = vec![0u8; p.buffer_len()];
    p.emit(&mut roce).unwrap();
    let ip = Ipv4Header::plain_udp_socket([192, 0, 2, 1], [192, 0, 2, 2]);
    let ports = UdpPorts {
        src: 0xC001,
        dst: ROCEV2_UDP_PORT,
    };
    icrc::seal_ipv4(&ip, ports, &mut roce).unwrap();
    assert_eq!(roce[..], v4[28..]);
    assert_eq!(Packet::new_unchecked(&roce).icrc(), 0xEC86_8A9D);
    // TOS and TTL are masked; Ethernet padding after the datagram ignored.
    let mut f = v4.clone();
    f[1] = 0x88;
    f[8] = 3;
    f.extend_from_slice(&[0xEE; 6]);
    assert_eq!(icrc::verify_frame(&f), Ok(true));

    let v6 = hex(V6_SEND);
    assert_eq!(icrc::verify_frame(&v6), Ok(true));
    let ip6 = Ipv6Header {
        src: v6[8..24].try_into().unwrap(),
        dst: v6[24..40].try_into().unwrap(),
    };
    roce[20..].fill(0);
    icrc::seal_ipv6(&ip6, ports, &mut roce).unwrap();
    assert_eq!(roce[..], v6[48..]);
    // Traffic class, flow label and hop limit are masked.
    let mut f = v6.clone();
    f[0..4].copy_from_slice(&[0x6A, 0xBC, 0xDE, 0xF1]);
    f[7] = 1;
    assert_eq!(icrc::verify_frame(&f), Ok(true));
    // Payload corruption is caught.
    let mut f = v6.clone();
    f[60] ^= 0x01;
    assert_eq!(icrc::verify_frame(&f), Ok(false));
}

#[test]
fn icrc_frame_errors() {
    let v4 = hex(V4_SEND);
    for cut in 0..v4.len() {
        assert!(icrc::compute_frame(&v4[..cut]).is_err(), "cut {cut}");
    }
    let mut opts = v4.clone();
    opts[0] = 0x46;
    assert_eq!(icrc::compute_frame(&opts), Err(Error::Malformed));
    let mut tcp = v4.clone();
    tcp[9] = 6;
    assert_eq!(icrc::compute_frame(&tcp), Err(Error::Malformed));
    let mut v5 = v4.clone();
    v5[0] = 0x55;
    assert_eq!(icrc::compute_frame(&v5), Err(Error::UnknownValue));
    let mut short_udp = v4.clone();
    short_udp[25] = 8 + 15;
    assert_eq!(icrc::compute_frame(&short_udp), Err(Error::Malformed));
    let ip = Ipv4Header::plain_udp_socket([0; 4], [0; 4]);
    let ports = UdpPorts { src: 1, dst: 2 };
    assert_eq!(
        icrc::compute_ipv4(&ip, ports, &[0; 15]),
        Err(Error::Truncated)
    );
    assert_eq!(
        icrc::compute_ipv4(&ip, ports, &vec![0; 65_520]),
        Err(Error::LimitExceeded)
    );
}

// ---------------------------------------------------------------------------
// PSN and segmentation

#[test]
fn psn_arithmetic() {
    let top = psn(MAX_24);
    assert_eq!(top.next(), psn(0));
    assert_eq!(psn(3).sub(5), psn(MAX_24 - 1));
    assert_eq!(psn(0).distance(top), 1);
    assert_eq!(top.distance(psn(0)), -1);
    assert_eq!(psn(0).compare(top), Ordering::Greater);
    assert_eq!(psn(5).compare(psn(5)), Ordering::Equal);
    assert_eq!(psn(1 << 23).distance(psn(0)), -(1 << 23));
    assert_eq!(psn((1 << 23) - 1).distance(psn(0)), (1 << 23) - 1);
    assert_eq!(Psn::new(1 << 24), None);
    assert_eq!(Psn::from_masked(0x0100_0005), psn(5));
}

#[test]
fn segmentation_table() {
    for mtu in Mtu::ALL {
        assert_eq!(Mtu::from_ib(mtu.to_ib()), Some(mtu));
        assert_eq!(Mtu::from_bytes(mtu.bytes()), Some(mtu));
    }
    assert_eq!(Mtu::Mtu256.bytes(), 256);
    assert_eq!(Mtu::Mtu4096.bytes(), 4096);
    assert_eq!(Mtu::from_ib(0), None);
    assert_eq!(Mtu::from_ib(6), None);

    let ops = |k, len, mtu| {
        Segments::new(k, len, mtu)
            .map(|s| s.opcode)
            .collect::<Vec<_>>()
    };
    use Opcode::*;
    assert_eq!(ops(MessageKind::Send, 0, Mtu::Mtu1024), [RcSendOnly]);
    assert_eq!(ops(MessageKind::Send, 1024, Mtu::Mtu1024), [RcSendOnly]);
    assert_eq!(
        ops(MessageKind::SendImm, 1025, Mtu::Mtu1024),
        [RcSendFirst, RcSendLastImm]
    );
    assert_eq!(
        ops(MessageKind::SendInv, 3000, Mtu::Mtu1024),
        [RcSendFirst, RcSendMiddle, RcSendLastInv]
    );
    assert_eq!(
        ops(MessageKind::WriteImm, 4096 * 2 + 1, Mtu::Mtu4096),
        [RcWriteFirst, RcWriteMiddle, RcWriteLastImm]
    );
    assert_eq!(
        ops(MessageKind::WriteImm, 10, Mtu::Mtu256),
        [RcWriteOnlyImm]
    );
    assert_eq!(
        ops(MessageKind::ReadResponse, 600, Mtu::Mtu256),
        [
            RcReadResponseFirst,
            RcReadResponseMiddle,
            RcReadResponseLast
        ]
    );
    let segs: Vec<_> = Segments::new(MessageKind::Write, 1300, Mtu::Mtu512).collect();
    assert_eq!(
        segs.iter().map(|s| (s.offset, s.len)).collect::<Vec<_>>(),
        [(0, 512), (512, 512), (1024, 276)]
    );
    assert_eq!(seg::packet_count(u32::MAX, Mtu::Mtu256), 16_777_216);
    assert_eq!(seg::opcode(MessageKind::Send, 3, 3), None);
    assert_eq!(seg::payload_len(10, Mtu::Mtu256, 1), None);
}

// ---------------------------------------------------------------------------
// Properties

fn arb_opcode() -> impl Strategy<Value = Opcode> {
    proptest::sample::select(Opcode::ALL.to_vec())
}

fn arb_syndrome() -> impl Strategy<Value = Syndrome> {
    prop_oneof![
        (0u8..32).prop_map(|credit| Syndrome::Ack { credit }),
        (0u8..32).prop_map(|timer| Syndrome::RnrNak { timer }),
        (0u8..5).prop_map(|c| Syndrome::from_u8(0x60 | c).unwrap()),
    ]
}

prop_compose! {
    fn arb_packet_parts()(
        opcode in arb_opcode(),
        flags in any::<[bool; 6]>(),
        pkey in any::<u16>(),
        qpn in 0..=MAX_24,
        psn_v in 0..=MAX_24,
        va in any::<u64>(),
        rkey in any::<u32>(),
        dma_len in any::<u32>(),
        syndrome in arb_syndrome(),
        msn in 0..=MAX_24,
        imm in any::<u32>(),
        inv in any::<u32>(),
        qkey in any::<u32>(),
        src_qpn in 0..=MAX_24,
        payload in proptest::collection::vec(any::<u8>(), 0..300),
    ) -> (RocePacket<'static>, Vec<u8>) {
        let h = opcode.headers();
        let bth = Bth {
            opcode,
            solicited: flags[0],
            mig_req: flags[1],
            pkey,
            fecn: flags[2],
            becn: flags[3],
            dest_qpn: qpn,
            ack_req: flags[4],
            psn: Psn::new(psn_v).unwrap(),
        };
        let mut p = RocePacket::new(bth, &[]);
        p.reth = h.reth.then_some(Reth { va, rkey, dma_len });
        p.aeth = h.aeth.then_some(Aeth { syndrome, msn });
        p.immdt = h.immdt.then_some(imm);
        p.ieth = h.ieth.then_some(inv);
        p.deth = h.deth.then_some(Deth { qkey, src_qpn });
        let payload = if h.payload { payload } else { Vec::new() };
        (p, payload)
    }
}

proptest! {
    #[test]
    fn prop_packet_round_trip((p, payload) in arb_packet_parts()) {
        let p = RocePacket { payload: &payload, ..p };
        let mut buf = vec![0u8; p.buffer_len()];
        prop_assert_eq!(p.emit(&mut buf), Ok(buf.len()));
        prop_assert_eq!(buf.len() % 4, 0);
        prop_assert_eq!(RocePacket::parse(&buf), Ok(p));
        // Sealing and verifying through a frame agree.
        let ip = Ipv4Header::plain_udp_socket([10, 0, 0, 1], [10, 0, 0, 2]);
        let ports = UdpPorts { src: 0xC000, dst: ROCEV2_UDP_PORT };
        icrc::seal_ipv4(&ip, ports, &mut buf).unwrap();
        let mut frame = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2];
        let total = (20 + 8 + buf.len()) as u16;
        frame[2..4].copy_from_slice(&total.to_be_bytes());
        frame.extend_from_slice(&[0xC0, 0, 0x12, 0xB7]);
        frame.extend_from_slice(&((8 + buf.len()) as u16).to_be_bytes());
        frame.extend_from_slice(&[0, 0]);
        frame.extend_from_slice(&buf);
        prop_assert_eq!(icrc::verify_frame(&frame), Ok(true));
        fuzz_parse(&buf);
    }

    #[test]
    fn prop_arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..400)) {
        fuzz_parse(&data);
        let v = Packet::new_unchecked(&data[..]);
        let _ = (v.psn(), v.dest_qpn(), v.pkey(), v.icrc(), v.transport_body().len());
    }

    #[test]
    fn prop_mutated_packets_never_panic(
        (p, payload) in arb_packet_parts(),
        at in any::<usize>(),
        byte in any::<u8>(),
    ) {
        let p = RocePacket { payload: &payload, ..p };
        let mut buf = vec![0u8; p.buffer_len()];
        p.emit(&mut buf).unwrap();
        let i = at % buf.len();
        buf[i] = byte;
        fuzz_parse(&buf);
        fuzz_parse(&buf[..i]);
    }

    #[test]
    fn prop_psn(a in 0..=MAX_24, n in 0u32..(1 << 23)) {
        let a = psn(a);
        let b = a.add(n);
        prop_assert_eq!(b.distance(a), n as i32);
        prop_assert_eq!(a.distance(b), -(n as i32));
        prop_assert_eq!(b.sub(n), a);
        prop_assert!(b.value() <= MAX_24);
        prop_assert_eq!(b.compare(a), if n == 0 { Ordering::Equal } else { Ordering::Greater });
        prop_assert_eq!(a.compare(b), b.compare(a).reverse());
        // Exactly 2^24 steps come back.
        prop_assert_eq!(a.add(Psn::MODULUS), a);
    }

    #[test]
    fn prop_segments_cover_message(len in 0u32..100_000, mtu_i in 0usize..5) {
        let mtu = Mtu::ALL[mtu_i];
        for kind in [MessageKind::Send, MessageKind::SendImm, MessageKind::SendInv,
                     MessageKind::Write, MessageKind::WriteImm, MessageKind::ReadResponse] {
            let segs: Vec<_> = Segments::new(kind, len, mtu).collect();
            prop_assert_eq!(segs.len() as u32, seg::packet_count(len, mtu));
            let mut next = 0;
            for (i, s) in segs.iter().enumerate() {
                prop_assert_eq!(s.offset, next);
                prop_assert!(s.len <= mtu.bytes());
                let last = i + 1 == segs.len();
                if !last { prop_assert_eq!(s.len, mtu.bytes()); }
                if segs.len() > 1 && last { prop_assert!(s.len > 0); }
                let h = s.opcode.headers();
                // RETH only on the first Write packet; imm/inv only on the last.
                prop_assert_eq!(h.reth, i == 0 && matches!(kind, MessageKind::Write | MessageKind::WriteImm));
                prop_assert_eq!(h.immdt, last && matches!(kind, MessageKind::SendImm | MessageKind::WriteImm));
                prop_assert_eq!(h.ieth, last && kind == MessageKind::SendInv);
                next += s.len;
            }
            prop_assert_eq!(next, len);
        }
    }
}

#[test]
fn golden_remaining_opcodes() {
    let reth = Reth {
        va: 0x10,
        rkey: 0x20,
        dma_len: 0x30,
    };
    let reth_hex = "0000000000000010 00000020 00000030";
    let ack = Aeth {
        syndrome: Syndrome::ACK,
        msn: 0x0A0B0C,
    };
    // (opcode, extension header hex, setter) with payload "abcd".
    type Fill = fn(&mut RocePacket<'_>, Reth, Aeth);
    let cases: &[(Opcode, String, Fill)] = &[
        (Opcode::RcSendFirst, String::new(), |_, _, _| {}),
        (Opcode::RcSendMiddle, String::new(), |_, _, _| {}),
        (Opcode::RcSendLast, String::new(), |_, _, _| {}),
        (Opcode::RcSendOnlyImm, "01020304".into(), |p, _, _| {
            p.immdt = Some(0x0102_0304)
        }),
        (Opcode::RcSendLastInv, "01020304".into(), |p, _, _| {
            p.ieth = Some(0x0102_0304)
        }),
        (Opcode::RcWriteFirst, reth_hex.into(), |p, r, _| {
            p.reth = Some(r)
        }),
        (Opcode::RcWriteMiddle, String::new(), |_, _, _| {}),
        (Opcode::RcWriteLast, String::new(), |_, _, _| {}),
        (Opcode::RcWriteLastImm, "01020304".into(), |p, _, _| {
            p.immdt = Some(0x0102_0304)
        }),
        (Opcode::RcWriteOnly, reth_hex.into(), |p, r, _| {
            p.reth = Some(r)
        }),
        (Opcode::RcReadResponseLast, "1f0a0b0c".into(), |p, _, a| {
            p.aeth = Some(a)
        }),
        (Opcode::RcReadResponseOnly, "1f0a0b0c".into(), |p, _, a| {
            p.aeth = Some(a)
        }),
        (
            Opcode::UdSendOnlyImm,
            "11111111 00 000abc 01020304".into(),
            |p, _, _| {
                p.deth = Some(Deth {
                    qkey: 0x1111_1111,
                    src_qpn: 0xABC,
                });
                p.immdt = Some(0x0102_0304);
            },
        ),
    ];
    for (op, ext, fill) in cases {
        let bytes = hex(&format!(
            "{:02x} 00 ffff 00 000042 00 000007 {ext} 61626364 00000000",
            op.to_u8()
        ));
        let mut p = RocePacket::new(Bth::new(*op, 0x42, psn(7)), b"abcd");
        fill(&mut p, reth, ack);
        check_golden(&bytes, &p);
    }
}
