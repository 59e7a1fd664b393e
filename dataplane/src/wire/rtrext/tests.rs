//! Golden bytes (hand-assembled from draft-dnoveck-rpcrdma-rtrext-02 s6-9
//! and our framing), hostile inputs kept as regressions, and property
//! tests for the rtrext codecs.

use super::*;
use proptest::prelude::*;

const L: Limits = Limits::DEFAULT;
const ALL: Extensions = Extensions::ALL;

fn seg(handle: u32, length: u32, offset: u64) -> Segment {
    Segment {
        handle,
        length,
        offset,
    }
}

fn words(v: &mut Vec<u8>, ws: &[u32]) {
    for w in ws {
        v.extend_from_slice(&w.to_be_bytes());
    }
}

/// The checks every golden header gets (smoltcp style): deconstruct,
/// construct, round trip (also through a warmed scratch header),
/// `buffer_len`, the fixed-word view, truncation at every offset, short
/// output buffers, and the fuzz invariants.
fn check_golden(bytes: &[u8], header_len: usize, repr: &OptionalHeader, negotiated: Extensions) {
    let (parsed, len) = OptionalHeader::parse(bytes, &L).expect("golden parses");
    assert_eq!(&parsed, repr);
    assert_eq!(len, header_len);
    assert_eq!(repr.buffer_len(), header_len);
    let mut buf = vec![0xAAu8; header_len];
    assert_eq!(repr.emit(negotiated, &mut buf), Ok(header_len));
    assert_eq!(&buf[..], &bytes[..header_len]);
    let mut scratch = OptionalHeader::with_capacity(&L);
    assert_eq!(scratch.parse_into(&buf, &L), Ok(header_len));
    assert_eq!(&scratch, repr);
    let view = OptionalView::new_checked(bytes).unwrap();
    assert_eq!(
        (view.xid(), view.vers(), view.credits(), view.proc_type()),
        (repr.xid, 1, repr.credits, RDMA_OPTIONAL)
    );
    assert_eq!(view.op_type(), repr.op.op_type());
    assert_eq!(view.optinfo_len() as usize, header_len - OPTIONAL_FIXED_LEN);
    for cut in 0..header_len {
        let r = OptionalHeader::parse(&bytes[..cut], &L);
        assert!(r.is_err(), "cut at {cut} parsed: {r:?}");
        assert!(scratch.parse_into(&bytes[..cut], &L).is_err());
    }
    for short in [0, header_len / 2, header_len - 1] {
        let mut out = vec![0x55u8; short];
        assert_eq!(repr.emit(negotiated, &mut out), Err(Error::BufferTooShort));
        assert!(out.iter().all(|&b| b == 0x55));
    }
    // A plain Version One peer never gets one.
    assert!(!repr.allowed(Extensions::EMPTY));
    let mut out = vec![0x55u8; header_len];
    assert_eq!(
        repr.emit(Extensions::EMPTY, &mut out),
        Err(Error::Malformed)
    );
    assert!(out.iter().all(|&b| b == 0x55));
    fuzz_parse(bytes);
}

// Transmit Request for an NFSv3 WRITE of 8 KiB whose data was placed by
// Send into target buffer segments 1 and 2, with directions for the reply
// (in the request's XDR range 0..0x100): first item by size (up to 4 KiB
// by Send, longer by RDMA Write into a 64 KiB segment), second by Send.
#[rustfmt::skip]
pub(super) const XMTREQ: [u8; 124] = [
    0x00, 0x00, 0x10, 0x01, // xid
    0x00, 0x00, 0x00, 0x01, // vers 1
    0x00, 0x00, 0x00, 0x20, // credits 32
    0x00, 0x00, 0x00, 0x05, // RDMA_OPTIONAL
    0x00, 0x00, 0x00, 0x05, // opttype: Transmit Request
    0x00, 0x00, 0x00, 0x64, // optinfo length 100
    // optxrq_dp (xmdp_grpinfo)
    0x00, 0x00, 0x00, 0x01, //   1 item
    0x00, 0x00, 0x00, 0x60, //   disp 96
    0x00, 0x00, 0x20, 0x00, //   length 8192
    0x00, 0x00, 0x00, 0x02, //   XMPTYPE_TBSN
    0x00, 0x00, 0x00, 0x00, //     offset 0
    0x00, 0x00, 0x00, 0x02, //     2 buffer segments
    0x00, 0x00, 0x00, 0x01, //     #1
    0x00, 0x00, 0x00, 0x02, //     #2
    // optxrq_rsd (xmdp_rsdgroup)
    0x00, 0x00, 0x00, 0x01, //   1 set
    0x00, 0x00, 0x00, 0x00, //   begin 0
    0x00, 0x00, 0x01, 0x00, //   end 0x100
    0x00, 0x00, 0x00, 0x02, //   2 directions
    0x00, 0x00, 0x04, 0x00, //   minlen 1024
    0x00, 0x00, 0x00, 0x04, //   XMPTYPE_BYSIZE
    0x00, 0x00, 0x10, 0x00, //     threshold 4096
    0x00, 0x00, 0x00, 0x01, //     1 segment
    0x00, 0x00, 0x0a, 0xbc, 0x00, 0x01, 0x00, 0x00, // handle 0xabc, length 65536
    0x00, 0x00, 0x7f, 0x00, 0x00, 0x00, 0x00, 0x00, // offset
    0x00, 0x00, 0x00, 0x00, //   minlen 0
    0x00, 0x00, 0x00, 0x02, //   XMPTYPE_TBSN
    0x00, 0x00, 0x00, 0x01, // optxrq_count 1
    0x00, 0x00, 0x00, 0x02, // optxrq_rsbuf 2
    0x00, 0x00, 0x00, 0x98, // optxrq_pslen 152
];

pub(super) fn xmtreq_repr() -> OptionalHeader {
    let mut h = OptionalHeader::new(
        0x1001,
        32,
        Operation::TransmitRequest {
            count: 1,
            reply_buffers: 2,
            payload_len: 152,
        },
    );
    h.placement
        .push(PlacedItem {
            disp: 96,
            length: 8192,
            location: ItemLocation::TargetBuffers {
                offset: 0,
                buffer_segments: &[1, 2],
            },
        })
        .unwrap();
    h.directions
        .push_set(
            0,
            0x100,
            &[
                Direction {
                    min_len: 1024,
                    location: ReplyLocation::BySize {
                        threshold: 4096,
                        segments: &[seg(0xabc, 65536, 0x7f00_0000_0000)],
                    },
                },
                Direction {
                    min_len: 0,
                    location: ReplyLocation::TargetBuffers,
                },
            ],
        )
        .unwrap();
    h
}

#[test]
fn golden_transmit_request() {
    let h = xmtreq_repr();
    let both = Extensions::SEND_PLACEMENT.union(Extensions::MESSAGE_CONTINUATION);
    check_golden(&XMTREQ, 124, &h, both);
    // Target buffers need send placement; reserved reply buffers need
    // message continuation.
    assert_eq!(h.required_extensions(), both);
    assert!(!h.allowed(Extensions::MESSAGE_CONTINUATION));
    assert!(!h.allowed(Extensions::SEND_PLACEMENT));
    let item = h.placement.get(0).unwrap();
    assert_eq!(item.location.placement_type(), PlacementType::TargetBuffers);
    assert!(item.location.is_excised());
    let set = h.directions.sets().next().unwrap();
    assert_eq!((set.begin, set.end, set.len()), (0, 0x100, 2));
    let d: Vec<_> = set.directions().collect();
    assert_eq!(d[0].location.segments().len(), 1);
    assert_eq!(d[1].location.segments(), &[]);
}

#[test]
fn payload_follows_the_header() {
    let mut msg = XMTREQ.to_vec();
    msg.extend((0..152u32).map(|i| i as u8));
    let (h, len) = OptionalHeader::parse(&msg, &L).unwrap();
    assert_eq!(len, 124);
    let p = h.payload(&msg, len).unwrap();
    assert_eq!((p.len(), p[0], p[151]), (152, 0, 151));
    assert_eq!(h.payload(&msg[..200], len), Err(Error::Truncated));
    assert_eq!(h.payload(&msg, usize::MAX), Err(Error::Truncated));
    fuzz_parse(&msg);
}

// Transmit Response: a READ reply whose 4 KiB of data went by RDMA Write
// into the requester's segment, and a second direction that matched no
// reply item.
#[rustfmt::skip]
pub(super) const XMTRESP: [u8; 80] = [
    0x00, 0x00, 0x10, 0x02, // xid
    0x00, 0x00, 0x00, 0x01, // vers 1
    0x00, 0x00, 0x00, 0x10, // credits 16
    0x00, 0x00, 0x00, 0x05, // RDMA_OPTIONAL
    0x00, 0x00, 0x00, 0x06, // opttype: Transmit Response
    0x00, 0x00, 0x00, 0x38, // optinfo length 56
    0x00, 0x00, 0x00, 0x02, // optxrs_dp: 2 items
    0x00, 0x00, 0x00, 0x70, //   disp 112
    0x00, 0x00, 0x10, 0x00, //   length 4096
    0x00, 0x00, 0x00, 0x01, //   XMPTYPE_EXRW
    0x00, 0x00, 0x00, 0x01, //     1 segment
    0x00, 0x00, 0x0a, 0xbc, 0x00, 0x00, 0x10, 0x00, // handle 0xabc, length 4096
    0x00, 0x00, 0x7f, 0x00, 0x00, 0x00, 0x00, 0x00, // offset
    0x00, 0x00, 0x00, 0x00, //   disp 0
    0x00, 0x00, 0x00, 0x00, //   length 0
    0x00, 0x00, 0x00, 0x06, //   XMPTYPE_NOITEM
    0x00, 0x00, 0x00, 0x01, // optxrs_count 1
    0x00, 0x00, 0x00, 0x74, // optxrs_pslen 116
];

pub(super) fn xmtresp_repr() -> OptionalHeader {
    let mut h = OptionalHeader::new(
        0x1002,
        16,
        Operation::TransmitResponse {
            count: 1,
            payload_len: 116,
        },
    );
    let s = [seg(0xabc, 4096, 0x7f00_0000_0000)];
    h.placement
        .push(PlacedItem {
            disp: 112,
            length: 4096,
            location: ItemLocation::ExplicitRdma(&s),
        })
        .unwrap();
    h.placement
        .push(PlacedItem {
            disp: 0,
            length: 0,
            location: ItemLocation::NoItem,
        })
        .unwrap();
    h
}

#[test]
fn golden_transmit_response() {
    let mut h = xmtresp_repr();
    check_golden(&XMTRESP, 80, &h, Extensions::MESSAGE_CONTINUATION);
    assert_eq!(h.required_extensions(), Extensions::EMPTY);
    assert!(h.allowed(Extensions::SEND_PLACEMENT));
    assert!(!h.allowed(Extensions::RESPONDER_READ_CHUNKS.union(Extensions::REMOTE_INVALIDATE)));
    // The responder rewrites the length actually written.
    h.placement.segments_mut(0).unwrap()[0].length = 100;
    assert!(h.placement.segments_mut(1).is_none());
    assert!(h.placement.segments_mut(2).is_none());
    match h.placement.get(0).unwrap().location {
        ItemLocation::ExplicitRdma(s) => assert_eq!(s[0].length, 100),
        other => panic!("{other:?}"),
    }
    // A multi-transmission response needs message continuation.
    h.op = Operation::TransmitResponse {
        count: 3,
        payload_len: 116,
    };
    assert_eq!(h.required_extensions(), Extensions::MESSAGE_CONTINUATION);
    assert!(!h.allowed(Extensions::SEND_PLACEMENT));
}

// Transmit Continue: transmission 1 of a response group, 512 payload bytes.
#[rustfmt::skip]
pub(super) const XMTCONT: [u8; 36] = [
    0x00, 0x00, 0x10, 0x02, // xid
    0x00, 0x00, 0x00, 0x01, // vers 1
    0x00, 0x00, 0x00, 0x10, // credits 16
    0x00, 0x00, 0x00, 0x05, // RDMA_OPTIONAL
    0x00, 0x00, 0x00, 0x07, // opttype: Transmit Continue
    0x00, 0x00, 0x00, 0x0c, // optinfo length 12
    0x00, 0x00, 0x00, 0x01, // optxc_xnum 1
    0x00, 0x00, 0x00, 0x06, // optxc_itype: group begun by Transmit Response
    0x00, 0x00, 0x02, 0x00, // optxc_pslen 512
];

#[test]
fn golden_transmit_continue() {
    let h = OptionalHeader::new(
        0x1002,
        16,
        Operation::TransmitContinue {
            seq: 1,
            group: GroupKind::Response,
            payload_len: 512,
        },
    );
    check_golden(&XMTCONT, 36, &h, Extensions::MESSAGE_CONTINUATION);
    assert!(!h.allowed(Extensions::SEND_PLACEMENT));
    // The group kind must name an initial operation.
    let mut bad = XMTCONT;
    bad[31] = 7;
    assert_eq!(OptionalHeader::parse(&bad, &L), Err(Error::UnknownValue));
    // Transmission 0 is the initial one, never a continuation.
    let mut zero = XMTCONT;
    zero[27] = 0;
    assert_eq!(OptionalHeader::parse(&zero, &L), Err(Error::Malformed));
}

// Report Error: transmission 2 of call 0x1003 arrived where 1 was
// expected; the lead is transmission 1 of the same call.
#[rustfmt::skip]
pub(super) const REPTERR: [u8; 64] = [
    0x00, 0x00, 0x10, 0x03, // xid
    0x00, 0x00, 0x00, 0x01, // vers 1
    0x00, 0x00, 0x00, 0x01, // credits 1
    0x00, 0x00, 0x00, 0x05, // RDMA_OPTIONAL
    0x00, 0x00, 0x00, 0x08, // opttype: Report Error
    0x00, 0x00, 0x00, 0x28, // optinfo length 40
    0x00, 0x00, 0x10, 0x03, // optre_bad: xid
    0x00, 0x00, 0x00, 0x00, //   CALL
    0x00, 0x00, 0x00, 0x02, //   transmission 2
    0x00, 0x00, 0x00, 0x01, // optre_lead: present
    0x00, 0x00, 0x10, 0x03, //   xid
    0x00, 0x00, 0x00, 0x00, //   CALL
    0x00, 0x00, 0x00, 0x01, //   transmission 1
    0x00, 0x00, 0x00, 0x04, // OPTRERR_BADSEQ
    0x00, 0x00, 0x00, 0x01, //   expected 1
    0x00, 0x00, 0x00, 0x02, //   current 2
];

#[test]
fn golden_report_error_with_lead() {
    let id = |seq| TransmissionId {
        xid: 0x1003,
        direction: MessageType::Call,
        seq,
    };
    let h = OptionalHeader::new(
        0x1003,
        1,
        Operation::ReportError(ErrorReport {
            bad: id(2),
            lead: Some(id(1)),
            info: ErrorInfo::BadSequence {
                expected: 1,
                current: 2,
            },
        }),
    );
    check_golden(&REPTERR, 64, &h, Extensions::MESSAGE_CONTINUATION);
    // An unknown direction or presence word does not decode.
    let mut b = REPTERR;
    b[31] = 2;
    assert_eq!(OptionalHeader::parse(&b, &L), Err(Error::UnknownValue));
    let mut b = REPTERR;
    b[39] = 2;
    assert_eq!(OptionalHeader::parse(&b, &L), Err(Error::UnknownValue));
}

// Report Error without a lead: a target-buffer offset out of range.
#[rustfmt::skip]
const REPTERR_RANGE: [u8; 56] = [
    0x00, 0x00, 0x10, 0x04, // xid
    0x00, 0x00, 0x00, 0x01, // vers 1
    0x00, 0x00, 0x00, 0x00, // credits 0
    0x00, 0x00, 0x00, 0x05, // RDMA_OPTIONAL
    0x00, 0x00, 0x00, 0x08, // opttype: Report Error
    0x00, 0x00, 0x00, 0x20, // optinfo length 32
    0x00, 0x00, 0x10, 0x04, // optre_bad: xid
    0x00, 0x00, 0x00, 0x01, //   REPLY
    0x00, 0x00, 0x00, 0x00, //   transmission 0
    0x00, 0x00, 0x00, 0x00, // optre_lead: absent
    0x00, 0x00, 0x00, 0x06, // OPTRERR_BADOFF
    0x00, 0x00, 0x20, 0x00, //   value 8192
    0x00, 0x00, 0x00, 0x00, //   min 0
    0x00, 0x00, 0x0f, 0xfc, //   max 4092
];

#[test]
fn golden_report_error_range() {
    let h = OptionalHeader::new(
        0x1004,
        0,
        Operation::ReportError(ErrorReport {
            bad: TransmissionId {
                xid: 0x1004,
                direction: MessageType::Reply,
                seq: 0,
            },
            lead: None,
            info: ErrorInfo::BadOffset {
                value: 8192,
                min: 0,
                max: 4092,
            },
        }),
    );
    check_golden(&REPTERR_RANGE, 56, &h, Extensions::SEND_PLACEMENT);
    // Unknown error codes are refused.
    for code in [0u8, 9] {
        let mut b = REPTERR_RANGE;
        b[43] = code;
        assert_eq!(OptionalHeader::parse(&b, &L), Err(Error::UnknownValue));
    }
}

#[test]
fn every_error_code_round_trips() {
    let bad = TransmissionId {
        xid: 9,
        direction: MessageType::Reply,
        seq: 3,
    };
    let infos = [
        ErrorInfo::BadHeaderType {
            expected: 5,
            current: 0,
        },
        ErrorInfo::BadOptionalType {
            expected: 7,
            current: 6,
        },
        ErrorInfo::BadContinuation,
        ErrorInfo::BadSequence {
            expected: 1,
            current: 3,
        },
        ErrorInfo::BadXid {
            expected: 1,
            current: 2,
        },
        ErrorInfo::BadOffset {
            value: 1,
            min: 2,
            max: 3,
        },
        ErrorInfo::BadBufferNumber {
            value: 9,
            min: 0,
            max: 4,
        },
        ErrorInfo::BadPayloadLength {
            value: 7,
            min: 0,
            max: 4,
        },
    ];
    for (i, info) in infos.into_iter().enumerate() {
        assert_eq!(info.code(), i as u32 + 1);
        let h = OptionalHeader::new(
            9,
            1,
            Operation::ReportError(ErrorReport {
                bad,
                lead: None,
                info,
            }),
        );
        let mut buf = vec![0u8; h.buffer_len()];
        assert_eq!(h.emit(ALL, &mut buf), Ok(buf.len()));
        assert_eq!(OptionalHeader::parse(&buf, &L), Ok((h, buf.len())));
    }
}

// ---------------------------------------------------------------------------
// Framing outcomes

#[test]
fn unknown_operation_type_is_skipped_and_reemitted_empty() {
    let mut b = Vec::new();
    words(&mut b, &[0x77, 1, 4, RDMA_OPTIONAL, 42, 6]);
    b.extend_from_slice(&[1, 2, 3, 4, 5, 6, 0, 0]);
    let (h, len) = OptionalHeader::parse(&b, &L).unwrap();
    assert_eq!(h.op, Operation::Unknown { opttype: 42 });
    assert_eq!((len, h.buffer_len()), (32, 24));
    assert!(h.placement.is_empty() && h.directions.is_empty());
    fuzz_parse(&b);
    // The catch-all must not spell a known type on emit.
    for known in 5..=8 {
        let h = OptionalHeader::new(1, 1, Operation::Unknown { opttype: known });
        assert_eq!(h.emit(ALL, &mut [0u8; 64]), Err(Error::Malformed));
    }
}

#[test]
fn other_version_or_message_type_is_not_ours() {
    let mut b = XMTCONT;
    b[7] = 2;
    assert_eq!(OptionalHeader::parse(&b, &L), Err(Error::UnknownValue));
    let mut b = XMTCONT;
    b[15] = 0; // RDMA_MSG
    assert_eq!(OptionalHeader::parse(&b, &L), Err(Error::UnknownValue));
    // A plain Version One decoder sees an unknown message type (ERR_CHUNK).
    let (v1, len) =
        super::super::rpcrdma::TransportHeader::parse(&XMTCONT, &Default::default()).unwrap();
    assert_eq!(
        v1.body,
        super::super::rpcrdma::MessageBody::Unknown {
            proc_type: RDMA_OPTIONAL
        }
    );
    assert_eq!(len, 16);
}

#[test]
fn optinfo_length_must_match_its_structure() {
    // One word longer: trailing bytes inside optinfo.
    let mut b = XMTCONT[..24].to_vec();
    b[23] = 16;
    words(&mut b, &[1, 6, 0, 0]);
    assert_eq!(OptionalHeader::parse(&b, &L), Err(Error::Malformed));
    // One word shorter: the structure runs past optinfo.
    let mut b = XMTCONT[..24].to_vec();
    b[23] = 8;
    words(&mut b, &[1, 6, 0]);
    assert_eq!(OptionalHeader::parse(&b, &L), Err(Error::Malformed));
    // A length beyond the input.
    let mut b = XMTCONT;
    b[20..24].copy_from_slice(&[0xff; 4]);
    assert_eq!(OptionalHeader::parse(&b, &L), Err(Error::Truncated));
    fuzz_parse(&b);
}

#[test]
fn optional_view_of_short_buffers() {
    assert_eq!(
        OptionalView::new_checked(&XMTCONT[..23]).err(),
        Some(Error::Truncated)
    );
    let v = OptionalView::new_unchecked(&XMTCONT[..18]);
    assert_eq!((v.xid(), v.op_type()), (0x1002, 0));
}

// ---------------------------------------------------------------------------
// Placement rules (rtrext s6.2 Table 1, s7.3, s7.4)

fn request_with(items: &[PlacedItem<'_>]) -> OptionalHeader {
    let mut h = OptionalHeader::new(
        1,
        1,
        Operation::TransmitRequest {
            count: 1,
            reply_buffers: 0,
            payload_len: 0,
        },
    );
    for i in items {
        h.placement.push(*i).unwrap();
    }
    h
}

fn emit_err(h: &OptionalHeader) -> Error {
    h.emit(ALL, &mut [0u8; 1024]).expect_err("must be refused")
}

#[test]
fn xdr_invalid_placement_types_do_not_decode() {
    // XMPTYPE_CHOOSE and XMPTYPE_BYSIZE are not arms of xmdp_loc.
    for t in [3u8, 4] {
        let mut b = XMTREQ;
        b[39] = t;
        assert_eq!(OptionalHeader::parse(&b, &L), Err(Error::UnknownValue));
        fuzz_parse(&b);
    }
    // TOOSHORT / NOITEM are not arms of xmdp_rsdloc.
    for t in [5u8, 6, 0, 7] {
        let mut b = XMTREQ;
        b[79] = t;
        assert_eq!(OptionalHeader::parse(&b, &L), Err(Error::UnknownValue));
    }
}

#[test]
fn result_types_are_semantically_invalid_in_requests() {
    let too_short = PlacedItem {
        disp: 8,
        length: 4,
        location: ItemLocation::TooShort,
    };
    assert_eq!(emit_err(&request_with(&[too_short])), Error::Malformed);
    // On the wire: a NOITEM item inside a request, then inside a response.
    let mut b = Vec::new();
    words(
        &mut b,
        &[1, 1, 1, RDMA_OPTIONAL, 5, 32, 1, 0, 0, 6, 0, 1, 0, 0],
    );
    assert_eq!(OptionalHeader::parse(&b, &L), Err(Error::Malformed));
    let mut b = Vec::new();
    words(&mut b, &[1, 1, 1, RDMA_OPTIONAL, 6, 24, 1, 0, 0, 6, 1, 0]);
    assert!(OptionalHeader::parse(&b, &L).is_ok());
}

#[test]
fn excised_items_are_aligned_ordered_and_disjoint() {
    let s = [seg(1, 100, 0)];
    let at = |disp, length| PlacedItem {
        disp,
        length,
        location: ItemLocation::ExplicitRdma(&s),
    };
    assert!(request_with(&[at(8, 100), at(108, 4)]).validate().is_ok());
    assert_eq!(emit_err(&request_with(&[at(6, 4)])), Error::Malformed);
    // 100 bytes round up to 104: the next item may start at 112, not 108.
    assert_eq!(
        emit_err(&request_with(&[at(8, 101), at(108, 4)])),
        Error::Malformed
    );
    assert_eq!(
        emit_err(&request_with(&[at(64, 4), at(8, 4)])),
        Error::Malformed
    );
    // An item ending at the top of the stream.
    assert!(request_with(&[at(0xffff_fff0, 16)]).validate().is_ok());
}

#[test]
fn locations_must_hold_something() {
    let empty = PlacedItem {
        disp: 8,
        length: 4,
        location: ItemLocation::ExplicitRdma(&[]),
    };
    assert_eq!(emit_err(&request_with(&[empty])), Error::Malformed);
    let overflow = [seg(1, u32::MAX, 0), seg(2, 1, 0)];
    let big = PlacedItem {
        disp: 8,
        length: 4,
        location: ItemLocation::ExplicitRdma(&overflow),
    };
    assert_eq!(emit_err(&request_with(&[big])), Error::LimitExceeded);
    for numbers in [&[][..], &[2, 2], &[3, 1]] {
        let tb = PlacedItem {
            disp: 8,
            length: 4,
            location: ItemLocation::TargetBuffers {
                offset: 0,
                buffer_segments: numbers,
            },
        };
        assert_eq!(
            emit_err(&request_with(&[tb])),
            Error::Malformed,
            "{numbers:?}"
        );
    }
}

#[test]
fn direction_sets_are_ordered_and_disjoint() {
    let tb = [Direction {
        min_len: 0,
        location: ReplyLocation::TargetBuffers,
    }];
    let with_sets = |sets: &[(u32, u32)]| {
        let mut h = request_with(&[]);
        for &(b, e) in sets {
            h.directions.push_set(b, e, &tb).unwrap();
        }
        h
    };
    assert!(with_sets(&[(0, 8), (8, 16), (32, u32::MAX)])
        .validate()
        .is_ok());
    for bad in [&[(4, 4)][..], &[(8, 4)], &[(2, 8)], &[(0, 16), (8, 24)]] {
        assert_eq!(emit_err(&with_sets(bad)), Error::Malformed, "{bad:?}");
    }
    // Directions with segments need at least one.
    let mut h = request_with(&[]);
    h.directions
        .push_set(
            0,
            8,
            &[Direction {
                min_len: 0,
                location: ReplyLocation::Choice(&[]),
            }],
        )
        .unwrap();
    assert_eq!(emit_err(&h), Error::Malformed);
    // An empty set is legal (a range with nothing to place).
    let mut h = request_with(&[]);
    h.directions.push_set(0, 8, &[]).unwrap();
    assert!(h.validate().is_ok());
    assert!(h.directions.sets().next().unwrap().is_empty());
}

#[test]
fn structures_only_where_the_operation_has_them() {
    let mut h = xmtresp_repr();
    h.directions.push_set(0, 8, &[]).unwrap();
    assert_eq!(emit_err(&h), Error::Malformed);
    let mut h = xmtreq_repr();
    h.op = Operation::TransmitContinue {
        seq: 1,
        group: GroupKind::Request,
        payload_len: 0,
    };
    assert_eq!(emit_err(&h), Error::Malformed);
    let mut h = xmtreq_repr();
    h.op = Operation::TransmitRequest {
        count: 0,
        reply_buffers: 0,
        payload_len: 0,
    };
    assert_eq!(emit_err(&h), Error::Malformed);
}

#[test]
fn negotiation_gates_every_operation() {
    let mc = Extensions::MESSAGE_CONTINUATION;
    let sp = Extensions::SEND_PLACEMENT;
    let lever = Extensions::RESPONDER_READ_CHUNKS.union(Extensions::REMOTE_INVALIDATE);
    // Explicit-RDMA placement only, one transmission: either feature will do.
    let s = [seg(1, 4, 0)];
    let h = request_with(&[PlacedItem {
        disp: 8,
        length: 4,
        location: ItemLocation::ExplicitRdma(&s),
    }]);
    assert!(h.allowed(mc) && h.allowed(sp) && !h.allowed(lever));
    // CHOOSE and BYSIZE directions may end in send-based placement.
    let mut h = request_with(&[]);
    h.directions
        .push_set(
            0,
            8,
            &[Direction {
                min_len: 0,
                location: ReplyLocation::Choice(&s),
            }],
        )
        .unwrap();
    assert_eq!(h.required_extensions(), sp);
    assert!(!h.allowed(mc));
    let mut buf = [0u8; 128];
    assert_eq!(h.emit(mc, &mut buf), Err(Error::Malformed));
    assert!(h.emit(sp, &mut buf).is_ok());
}

// ---------------------------------------------------------------------------
// Hostile inputs

fn parse_err(bytes: &[u8]) -> Error {
    fuzz_parse(bytes);
    OptionalHeader::parse(bytes, &L).expect_err("must fail")
}

/// An XMTREQ header around `info` (the optinfo words).
fn xmtreq_with(info: &[u32]) -> Vec<u8> {
    let mut b = Vec::new();
    words(&mut b, &[5, 1, 1, RDMA_OPTIONAL, 5, 4 * info.len() as u32]);
    words(&mut b, info);
    b
}

#[test]
fn hostile_all_ones_counts() {
    // Item count, segment count, buffer number count, set count,
    // direction count: each 0xFFFFFFFF.
    let cases: [&[u32]; 5] = [
        &[0xffff_ffff, 0, 1, 0, 0],
        &[1, 8, 4, 1, 0xffff_ffff, 0, 0, 1, 0, 0],
        &[1, 8, 4, 2, 0, 0xffff_ffff, 1, 0, 1, 0, 0],
        &[0, 0xffff_ffff, 1, 0, 0],
        &[0, 1, 0, 8, 0xffff_ffff, 0, 2, 1, 0, 0],
    ];
    for info in cases {
        assert_eq!(
            parse_err(&xmtreq_with(info)),
            Error::LimitExceeded,
            "{info:x?}"
        );
    }
    // Every word of every golden header set to all ones: never a panic.
    for golden in [&XMTREQ[..], &XMTRESP, &XMTCONT, &REPTERR, &REPTERR_RANGE] {
        for w in (0..golden.len()).step_by(4) {
            let mut b = golden.to_vec();
            b[w..w + 4].fill(0xff);
            fuzz_parse(&b);
        }
    }
}

#[test]
fn hostile_lists_one_over_the_limit() {
    let item = |v: &mut Vec<u32>, disp: u32| v.extend_from_slice(&[disp, 4, 2, 0, 1, 0]);
    // Items: limit parses, limit + 1 does not.
    for (n, ok) in [(L.max_items, true), (L.max_items + 1, false)] {
        let mut info = vec![n as u32];
        for i in 0..n {
            item(&mut info, 8 * i as u32);
        }
        info.extend_from_slice(&[0, 1, 0, 0]);
        let b = xmtreq_with(&info);
        assert_eq!(OptionalHeader::parse(&b, &L).is_ok(), ok, "{n} items");
        if !ok {
            assert_eq!(parse_err(&b), Error::LimitExceeded);
        }
    }
    // Segments across items: limit over 4 items, then one more.
    for (extra, ok) in [(0, true), (1, false)] {
        let per = L.max_segments / 4;
        let mut info = vec![4];
        for i in 0..4 {
            let n = per + usize::from(i == 3) * extra;
            info.extend_from_slice(&[64 * i, 4, 1, n as u32]);
            for _ in 0..n {
                info.extend_from_slice(&[1, 4, 0, 0]);
            }
        }
        info.extend_from_slice(&[0, 1, 0, 0]);
        let b = xmtreq_with(&info);
        assert_eq!(OptionalHeader::parse(&b, &L).is_ok(), ok);
        if !ok {
            assert_eq!(parse_err(&b), Error::LimitExceeded);
        }
    }
    // Buffer numbers in one item.
    for (n, ok) in [
        (L.max_buffer_numbers, true),
        (L.max_buffer_numbers + 1, false),
    ] {
        let mut info = vec![1, 8, 4, 2, 0, n as u32];
        info.extend(1..=n as u32);
        info.extend_from_slice(&[0, 1, 0, 0]);
        let b = xmtreq_with(&info);
        assert_eq!(OptionalHeader::parse(&b, &L).is_ok(), ok);
        if !ok {
            assert_eq!(parse_err(&b), Error::LimitExceeded);
        }
    }
    // Direction sets, and directions over all sets.
    for (sets, per, ok) in [
        (L.max_direction_sets, 2, true),
        (L.max_direction_sets + 1, 0, false),
        (4, L.max_directions / 4, true),
        (4, L.max_directions / 4 + 1, false),
    ] {
        let mut info = vec![0, sets as u32];
        for i in 0..sets as u32 {
            info.extend_from_slice(&[8 * i, 8 * i + 8, per as u32]);
            for _ in 0..per {
                info.extend_from_slice(&[0, 2]);
            }
        }
        info.extend_from_slice(&[1, 0, 0]);
        let b = xmtreq_with(&info);
        assert_eq!(OptionalHeader::parse(&b, &L).is_ok(), ok, "{sets}x{per}");
        if !ok {
            assert_eq!(parse_err(&b), Error::LimitExceeded);
        }
    }
}

#[test]
fn reused_header_stays_within_limits() {
    let mut scratch = OptionalHeader::default();
    let inputs: [&[u8]; 5] = [&XMTREQ, &XMTRESP, &XMTCONT, &REPTERR, &XMTREQ];
    let caps = |h: &OptionalHeader| {
        (
            h.placement.items.capacity(),
            h.placement.segments.capacity(),
            h.placement.buffer_numbers.capacity(),
            h.directions.sets.capacity(),
            h.directions.directions.capacity(),
            h.directions.segments.capacity(),
        )
    };
    let mut warmed = None;
    for round in 0..3 {
        for input in inputs {
            scratch.parse_into(input, &L).unwrap();
        }
        if round == 0 {
            warmed = Some(caps(&scratch));
        } else {
            assert_eq!(Some(caps(&scratch)), warmed, "no growth once warm");
        }
    }
    let mut sized = OptionalHeader::with_capacity(&L);
    let before = caps(&sized);
    assert_eq!(
        before,
        (
            L.max_items,
            L.max_segments,
            L.max_buffer_numbers,
            L.max_direction_sets,
            L.max_directions,
            L.max_segments
        )
    );
    for input in inputs {
        sized.parse_into(input, &L).unwrap();
        assert_eq!(caps(&sized), before);
    }
}

// ---------------------------------------------------------------------------
// Transport properties (rtrext s8)

// A property list: RTR Support (all three operations), a receive buffer of
// a 256-byte header segment and four 4 KiB placement-targetable segments,
// request/response transmission limits 4 and 8, our extension flags, and
// an unknown property with a 3-byte value.
#[rustfmt::skip]
pub(super) const PROPERTIES: [u8; 112] = [
    0x00, 0x00, 0x00, 0x06, // 6 properties
    0x00, 0x00, 0x00, 0x03, // RTR Support
    0x00, 0x00, 0x00, 0x04, //   value length 4
    0x00, 0x00, 0x00, 0x07, //   XREQ | XRESP | XCONT
    0x00, 0x00, 0x00, 0x04, // Receive Buffer Structure
    0x00, 0x00, 0x00, 0x28, //   value length 40
    0x00, 0x00, 0x41, 0x00, //   buffer length 16640
    0x00, 0x00, 0x00, 0x02, //   2 groups
    0x00, 0x00, 0x00, 0x01, //     1 segment
    0x00, 0x00, 0x01, 0x00, //       of 256 bytes
    0x00, 0x00, 0x00, 0x08, //       aligned to 8
    0x00, 0x00, 0x00, 0x00, //       flags: none
    0x00, 0x00, 0x00, 0x04, //     4 segments
    0x00, 0x00, 0x10, 0x00, //       of 4096 bytes
    0x00, 0x00, 0x10, 0x00, //       aligned to 4096
    0x00, 0x00, 0x00, 0x01, //       flags: placement target
    0x00, 0x00, 0x00, 0x05, // Request Transmission Receive Limit
    0x00, 0x00, 0x00, 0x04, //   value length 4
    0x00, 0x00, 0x00, 0x04, //   4 transmissions
    0x00, 0x00, 0x00, 0x06, // Response Transmission Send Limit
    0x00, 0x00, 0x00, 0x04, //   value length 4
    0x00, 0x00, 0x00, 0x08, //   8 transmissions
    0x80, 0x00, 0x00, 0x01, // our extension flags
    0x00, 0x00, 0x00, 0x04, //   value length 4
    0x00, 0x00, 0x00, 0x07, //   RRC | RI | SEND_PLACEMENT
    0x00, 0x00, 0x00, 0x99, // unknown id 0x99
    0x00, 0x00, 0x00, 0x03, //   value length 3
    0x61, 0x62, 0x63, 0x00, //   "abc", pad
];

pub(super) const GROUPS: [BufferGroup; 2] = [
    BufferGroup {
        count: 1,
        length: 256,
        align: 8,
        flags: 0,
    },
    BufferGroup {
        count: 4,
        length: 4096,
        align: 4096,
        flags: SEGMENT_FLAG_PLACEMENT_TARGET,
    },
];

pub(super) fn properties_repr() -> PropertyList {
    let mut p = PropertyList::new();
    p.push(Property::RtrSupport(RtrSupport(7))).unwrap();
    p.push(Property::ReceiveBufferStructure(BufferStructure {
        length: 16640,
        groups: &GROUPS,
    }))
    .unwrap();
    p.push(Property::RequestTransmissionReceiveLimit(4))
        .unwrap();
    p.push(Property::ResponseTransmissionSendLimit(8)).unwrap();
    p.push(Property::ExtensionFlags(7)).unwrap();
    p.push(Property::Unknown {
        id: 0x99,
        value: b"abc",
    })
    .unwrap();
    p
}

#[test]
fn golden_property_list() {
    let repr = properties_repr();
    assert_eq!(PropertyList::parse(&PROPERTIES, &L).as_ref(), Ok(&repr));
    assert_eq!(repr.buffer_len(), PROPERTIES.len());
    let mut buf = [0xAAu8; 112];
    assert_eq!(repr.emit(&mut buf), Ok(112));
    assert_eq!(buf, PROPERTIES);
    let mut scratch = PropertyList::with_capacity(&L);
    scratch
        .decode_into(&mut Decoder::new(&PROPERTIES), &L)
        .unwrap();
    assert_eq!(scratch, repr);
    for cut in 0..PROPERTIES.len() {
        assert!(
            PropertyList::parse(&PROPERTIES[..cut], &L).is_err(),
            "{cut}"
        );
    }
    assert_eq!(repr.emit(&mut [0u8; 111]), Err(Error::BufferTooShort));
    // Accessors.
    assert!(repr.rtr_support().contains(RtrSupport::TRANSMIT_CONTINUE));
    match repr.get(prop_id::RECEIVE_BUFFER_STRUCTURE) {
        Some(Property::ReceiveBufferStructure(b)) => {
            assert_eq!((b.segment_count(), b.has_placement_targets()), (5, true));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(repr.get(0x42), None);
    assert_eq!(PropertyList::new().rtr_support(), RtrSupport(0));
    let ids: Vec<u32> = repr.iter().map(|p| p.id()).collect();
    assert_eq!(ids, [3, 4, 5, 6, 0x8000_0001, 0x99]);
    fuzz_parse(&PROPERTIES);
}

/// A one-property list with `id` and the value words.
fn one_property(id: u32, value: &[u32]) -> Vec<u8> {
    let mut b = Vec::new();
    words(&mut b, &[1, id, 4 * value.len() as u32]);
    words(&mut b, value);
    b
}

fn props_err(bytes: &[u8]) -> Error {
    fuzz_parse(bytes);
    PropertyList::parse(bytes, &L).expect_err("must fail")
}

#[test]
fn hostile_property_lists() {
    // Property count 0xFFFFFFFF, and one over the limit.
    let mut b = Vec::new();
    words(&mut b, &[0xffff_ffff, 3, 4, 7]);
    assert_eq!(props_err(&b), Error::LimitExceeded);
    let mut b = Vec::new();
    words(&mut b, &[L.max_properties as u32 + 1]);
    for id in 0..=L.max_properties as u32 {
        words(&mut b, &[0x100 + id, 0]);
    }
    assert_eq!(props_err(&b), Error::LimitExceeded);
    // Over-long values: above the limit, and all ones.
    let long = vec![0u32; L.max_property_len / 4 + 1];
    assert_eq!(props_err(&one_property(0x99, &long)), Error::LimitExceeded);
    let mut b = Vec::new();
    words(&mut b, &[1, 0x99, 0xffff_ffff, 0]);
    assert_eq!(props_err(&b), Error::LimitExceeded);
    // A value of exactly the limit is fine.
    let max = vec![0u32; L.max_property_len / 4];
    assert!(PropertyList::parse(&one_property(0x99, &max), &L).is_ok());
    // Typed values of the wrong length.
    assert_eq!(props_err(&one_property(3, &[])), Error::Malformed);
    assert_eq!(props_err(&one_property(5, &[1, 2])), Error::Malformed);
    // Limits of zero transmissions.
    assert_eq!(props_err(&one_property(5, &[0])), Error::Malformed);
    assert_eq!(props_err(&one_property(6, &[0])), Error::Malformed);
    // Duplicate ids.
    let mut b = Vec::new();
    words(&mut b, &[2, 3, 4, 1, 3, 4, 2]);
    assert_eq!(props_err(&b), Error::Malformed);
}

#[test]
fn hostile_buffer_structures() {
    let rbs = |length: u32, groups: &[[u32; 4]]| {
        let mut v = vec![length, groups.len() as u32];
        for g in groups {
            v.extend_from_slice(g);
        }
        one_property(4, &v)
    };
    assert!(PropertyList::parse(&rbs(8192, &[[2, 4096, 0, 1]]), &L).is_ok());
    // Too many buffer segments: a group count of all ones, and limit + 1.
    assert_eq!(
        props_err(&rbs(0, &[[0xffff_ffff, 0, 0, 0]])),
        Error::LimitExceeded
    );
    let n = L.max_buffer_segments as u32;
    assert!(PropertyList::parse(&rbs(n, &[[n, 1, 0, 0]]), &L).is_ok());
    assert_eq!(
        props_err(&rbs(n + 1, &[[n + 1, 1, 0, 0]])),
        Error::LimitExceeded
    );
    // Too many groups; a group count word of all ones.
    let groups = vec![[1, 4, 0, 0]; L.max_buffer_groups + 1];
    let value_len = 8 + 16 * groups.len();
    let big = Limits {
        max_property_len: value_len,
        ..L
    };
    let b = rbs(4 * groups.len() as u32, &groups);
    assert_eq!(PropertyList::parse(&b, &big), Err(Error::LimitExceeded));
    let mut b = one_property(4, &[0, 0xffff_ffff]);
    words(&mut b, &[]);
    assert_eq!(props_err(&b), Error::LimitExceeded);
    // Inconsistent total, empty group, alignment not a power of two.
    assert_eq!(props_err(&rbs(8191, &[[2, 4096, 0, 1]])), Error::Malformed);
    assert_eq!(props_err(&rbs(0, &[[0, 4096, 0, 1]])), Error::Malformed);
    assert_eq!(props_err(&rbs(4096, &[[1, 4096, 12, 1]])), Error::Malformed);
    // Unknown segment flags are kept.
    let (list, _) = (
        PropertyList::parse(&rbs(64, &[[1, 64, 64, 0xf0]]), &L).unwrap(),
        0,
    );
    match list.get(4) {
        Some(Property::ReceiveBufferStructure(b)) => {
            assert_eq!(b.groups[0].flags, 0xf0);
            assert!(!b.has_placement_targets());
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn emitter_refuses_what_parse_refuses() {
    let mut p = PropertyList::new();
    p.push(Property::Unknown {
        id: prop_id::RTR_SUPPORT,
        value: &[0, 0, 0, 1],
    })
    .unwrap();
    assert_eq!(p.emit(&mut [0u8; 64]), Err(Error::Malformed));
    let mut p = PropertyList::new();
    p.push(Property::ExtensionFlags(1)).unwrap();
    p.push(Property::ExtensionFlags(2)).unwrap();
    assert_eq!(p.emit(&mut [0u8; 64]), Err(Error::Malformed));
    let mut p = PropertyList::new();
    p.push(Property::ReceiveBufferStructure(BufferStructure {
        length: 1,
        groups: &GROUPS,
    }))
    .unwrap();
    let mut buf = [0u8; 64];
    assert_eq!(p.emit(&mut buf), Err(Error::Malformed));
    assert!(buf.iter().all(|&b| b == 0));
    // What we send is ours to size: no parse-side segment bound on emit.
    let mut p = PropertyList::new();
    let huge = [BufferGroup {
        count: 100_000,
        length: 16,
        align: 0,
        flags: 0,
    }];
    p.push(Property::ReceiveBufferStructure(BufferStructure {
        length: 1_600_000,
        groups: &huge,
    }))
    .unwrap();
    assert!(p.emit(&mut buf).is_ok());
}

// ---------------------------------------------------------------------------
// Property tests

fn arb_segment() -> impl Strategy<Value = Segment> {
    (any::<u32>(), 0u32..(1 << 20), any::<u64>()).prop_map(|(h, l, o)| seg(h, l, o))
}

#[derive(Debug, Clone)]
enum ArbLoc {
    Rdma(Vec<Segment>),
    Tb(u32, Vec<u32>),
    TooShort,
    NoItem,
}

fn arb_items(in_response: bool) -> impl Strategy<Value = Vec<(u32, u32, ArbLoc)>> {
    let loc = prop_oneof![
        3 => proptest::collection::vec(arb_segment(), 1..4).prop_map(ArbLoc::Rdma),
        3 => (any::<u32>(), proptest::collection::vec(1u32..100, 1..5)).prop_map(|(o, steps)| {
            let mut n = 0;
            ArbLoc::Tb(o, steps.into_iter().map(|s| { n += s; n }).collect())
        }),
        1 => Just(ArbLoc::TooShort),
        1 => Just(ArbLoc::NoItem),
    ]
    .prop_filter("result types only in responses", move |l| {
        in_response || matches!(l, ArbLoc::Rdma(_) | ArbLoc::Tb(..))
    });
    proptest::collection::vec((0u32..4, 0u32..(1 << 20), loc), 0..=6)
}

fn fill_placement(p: &mut DataPlacement, items: &[(u32, u32, ArbLoc)]) {
    let mut next = 0u32;
    for (gap, length, loc) in items {
        let disp = next + 4 * gap;
        let location = match loc {
            ArbLoc::Rdma(s) => ItemLocation::ExplicitRdma(s),
            ArbLoc::Tb(o, n) => ItemLocation::TargetBuffers {
                offset: *o,
                buffer_segments: n,
            },
            ArbLoc::TooShort => ItemLocation::TooShort,
            ArbLoc::NoItem => ItemLocation::NoItem,
        };
        if location.is_excised() {
            next = disp + roundup(*length as usize) as u32;
        }
        p.push(PlacedItem {
            disp,
            length: *length,
            location,
        })
        .unwrap();
    }
}

#[allow(clippy::type_complexity)]
fn arb_directions() -> impl Strategy<Value = Vec<(u32, u32, Vec<(u32, u8, u32, Vec<Segment>)>)>> {
    let dir = (
        any::<u32>(),
        0u8..4,
        any::<u32>(),
        proptest::collection::vec(arb_segment(), 1..3),
    );
    proptest::collection::vec(
        (0u32..8, 1u32..64, proptest::collection::vec(dir, 0..3)),
        0..4,
    )
}

fn arb_op() -> impl Strategy<Value = Operation> {
    let id = (any::<u32>(), any::<bool>(), any::<u32>()).prop_map(|(xid, r, seq)| TransmissionId {
        xid,
        direction: if r {
            MessageType::Reply
        } else {
            MessageType::Call
        },
        seq,
    });
    let info = (1u32..=8, any::<[u32; 3]>()).prop_map(|(code, [a, b, c])| match code {
        1 => ErrorInfo::BadHeaderType {
            expected: a,
            current: b,
        },
        2 => ErrorInfo::BadOptionalType {
            expected: a,
            current: b,
        },
        3 => ErrorInfo::BadContinuation,
        4 => ErrorInfo::BadSequence {
            expected: a,
            current: b,
        },
        5 => ErrorInfo::BadXid {
            expected: a,
            current: b,
        },
        6 => ErrorInfo::BadOffset {
            value: a,
            min: b,
            max: c,
        },
        7 => ErrorInfo::BadBufferNumber {
            value: a,
            min: b,
            max: c,
        },
        _ => ErrorInfo::BadPayloadLength {
            value: a,
            min: b,
            max: c,
        },
    });
    prop_oneof![
        3 => (1u32.., any::<u32>(), any::<u32>()).prop_map(|(count, reply_buffers, payload_len)| {
            Operation::TransmitRequest { count, reply_buffers, payload_len }
        }),
        3 => (1u32.., any::<u32>())
            .prop_map(|(count, payload_len)| Operation::TransmitResponse { count, payload_len }),
        2 => (1u32.., any::<bool>(), any::<u32>()).prop_map(|(seq, req, payload_len)| {
            let group = if req { GroupKind::Request } else { GroupKind::Response };
            Operation::TransmitContinue { seq, group, payload_len }
        }),
        2 => (id.clone(), proptest::option::of(id), info)
            .prop_map(|(bad, lead, info)| Operation::ReportError(ErrorReport { bad, lead, info })),
        1 => any::<u32>()
            .prop_filter("unknown", |t| !(5..=8).contains(t))
            .prop_map(|opttype| Operation::Unknown { opttype }),
    ]
}

fn arb_header() -> impl Strategy<Value = OptionalHeader> {
    (
        any::<u32>(),
        any::<u32>(),
        arb_op(),
        arb_items(false),
        arb_items(true),
        arb_directions(),
    )
        .prop_map(|(xid, credits, op, req_items, resp_items, dirs)| {
            let mut h = OptionalHeader::new(xid, credits, op);
            match op {
                Operation::TransmitRequest { .. } => {
                    fill_placement(&mut h.placement, &req_items);
                    let mut at = 0u32;
                    for (gap, len, ds) in &dirs {
                        let begin = at + 4 * gap;
                        let end = begin + len;
                        at = end.next_multiple_of(4);
                        let locs: Vec<Direction<'_>> = ds
                            .iter()
                            .map(|(min_len, kind, t, s)| Direction {
                                min_len: *min_len,
                                location: match kind {
                                    0 => ReplyLocation::ExplicitRdma(s),
                                    1 => ReplyLocation::Choice(s),
                                    2 => ReplyLocation::BySize {
                                        threshold: *t,
                                        segments: s,
                                    },
                                    _ => ReplyLocation::TargetBuffers,
                                },
                            })
                            .collect();
                        h.directions.push_set(begin, end, &locs).unwrap();
                    }
                }
                Operation::TransmitResponse { .. } => fill_placement(&mut h.placement, &resp_items),
                _ => {}
            }
            h
        })
}

fn arb_properties() -> impl Strategy<Value = PropertyList> {
    let group =
        (1u32..8, 0u32..5000, 0u32..13, any::<u32>()).prop_map(|(count, length, a, flags)| {
            BufferGroup {
                count,
                length,
                align: if a == 12 { 0 } else { 1 << a },
                flags,
            }
        });
    (
        proptest::option::of(any::<u32>()),
        proptest::option::of(proptest::collection::vec(group, 0..4)),
        proptest::option::of(1u32..),
        proptest::option::of(1u32..),
        proptest::option::of(any::<u32>()),
        proptest::collection::btree_map(
            7u32..0x8000_0000,
            proptest::collection::vec(any::<u8>(), 0..40),
            0..4,
        ),
    )
        .prop_map(|(rtr, rbs, rq, rs, flags, unknown)| {
            let mut p = PropertyList::new();
            if let Some(w) = rtr {
                p.push(Property::RtrSupport(RtrSupport(w))).unwrap();
            }
            if let Some(groups) = rbs {
                let length = groups.iter().map(|g| g.count * g.length).sum();
                p.push(Property::ReceiveBufferStructure(BufferStructure {
                    length,
                    groups: &groups,
                }))
                .unwrap();
            }
            if let Some(n) = rq {
                p.push(Property::RequestTransmissionReceiveLimit(n))
                    .unwrap();
            }
            if let Some(n) = rs {
                p.push(Property::ResponseTransmissionSendLimit(n)).unwrap();
            }
            if let Some(w) = flags {
                p.push(Property::ExtensionFlags(w)).unwrap();
            }
            for (id, value) in &unknown {
                p.push(Property::Unknown { id: *id, value }).unwrap();
            }
            p
        })
}

proptest! {
    #[test]
    fn prop_header_round_trip(h in arb_header()) {
        let n = h.buffer_len();
        let mut buf = vec![0u8; n + 8];
        prop_assert_eq!(h.emit(ALL, &mut buf), Ok(n));
        let (p, len) = OptionalHeader::parse(&buf[..n], &L).unwrap();
        prop_assert_eq!(len, n);
        prop_assert_eq!(&p, &h);
        prop_assert!(h.allowed(h.required_extensions().union(Extensions::SEND_PLACEMENT)));
        fuzz_parse(&buf[..n]);
    }

    #[test]
    fn prop_parse_into_warmed_equals_parse(a in arb_header(), b in arb_header()) {
        let mut scratch = OptionalHeader::default();
        for h in [&a, &b, &a] {
            let mut buf = vec![0u8; h.buffer_len()];
            h.emit(ALL, &mut buf).unwrap();
            prop_assert_eq!(scratch.parse_into(&buf, &L), Ok(buf.len()));
            prop_assert_eq!(&scratch, h);
        }
    }

    #[test]
    fn prop_properties_round_trip(p in arb_properties()) {
        let mut buf = vec![0u8; p.buffer_len()];
        prop_assert_eq!(p.emit(&mut buf), Ok(buf.len()));
        prop_assert_eq!(PropertyList::parse(&buf, &L), Ok(p));
        fuzz_parse(&buf);
    }

    #[test]
    fn prop_arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..512)) {
        fuzz_parse(&data);
    }

    #[test]
    fn prop_mutated_headers_never_panic(
        h in arb_header(),
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6),
        cut in any::<usize>(),
    ) {
        let mut buf = vec![0u8; h.buffer_len()];
        h.emit(ALL, &mut buf).unwrap();
        for (at, v) in flips {
            let i = at % buf.len();
            buf[i] = v;
        }
        fuzz_parse(&buf);
        fuzz_parse(&buf[..cut % (buf.len() + 1)]);
    }

    #[test]
    fn prop_mutated_properties_never_panic(
        p in arb_properties(),
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6),
    ) {
        let mut buf = vec![0u8; p.buffer_len()];
        p.emit(&mut buf).unwrap();
        for (at, v) in flips {
            let i = at % buf.len();
            buf[i] = v;
        }
        fuzz_parse(&buf);
    }
}
