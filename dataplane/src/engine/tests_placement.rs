//! Send-based data placement between two engines (draft-dnoveck-rpcrdma-
//! rtrext-02 s3.3, s7, s8.3, s9.5; `placement.rs`), negotiated by a real
//! CONF_RDMA version 2 exchange. Named after the draft's sections.

use super::harness::*;
use super::placement::TargetLayout;
use super::tests::*;
use super::tests_continuation::{continued_pair, optional};
use super::*;
use crate::wire::rtrext::{
    err_code, ErrorInfo, ItemLocation, Operation, OptionalHeader, PlacementType, ReplyLocation,
};

fn sp(c: Config) -> Config {
    Config {
        extensions: Extensions::MESSAGE_CONTINUATION.union(Extensions::SEND_PLACEMENT),
        credits: 16,
        max_outstanding_calls: 16,
        ..c
    }
}

/// A pair that negotiated continuation and placement through CONF_RDMA
/// v2, the client asking for results placed by Send.
fn placing_pair() -> Pair {
    let client = Config {
        place_results: true,
        ..sp(cfg())
    };
    continued_pair(client, sp(cfg()))
}

/// The first RDMA_OPTIONAL header `side` sent.
fn first_header(p: &Pair, side: usize) -> OptionalHeader {
    p.sends_from(side)
        .find_map(optional)
        .expect("an RDMA_OPTIONAL Send")
}

fn reports_from(p: &Pair, side: usize) -> Vec<ErrorInfo> {
    p.sends_from(side)
        .filter_map(optional)
        .filter_map(|h| match h.op {
            Operation::ReportError(r) => Some(r.info),
            _ => None,
        })
        .collect()
}

#[test]
fn rtrext_s8_3_the_receive_buffer_structures_are_exchanged() {
    let p = placing_pair();
    for side in [CLIENT, SERVER] {
        let c = &p.peers[side].conn;
        assert!(c.negotiated().contains(Extensions::SEND_PLACEMENT));
        assert_eq!(c.peer_targets, TargetLayout::ours(4096), "side {side}");
    }
    // Placement without continuation is not advertised: it rides on the
    // transmission framing here.
    let alone = Config {
        extensions: Extensions::SEND_PLACEMENT,
        ..cfg()
    };
    let mut q = Pair::new(alone, alone);
    let reply = conf_v2_exchange(&mut q).unwrap();
    assert!(!reply
        .properties
        .extensions()
        .contains(Extensions::SEND_PLACEMENT));
    assert!(reply
        .properties
        .get(crate::wire::rtrext::prop_id::RECEIVE_BUFFER_STRUCTURE)
        .is_none());
}

#[test]
fn rtrext_s7_3_a_ddp_argument_is_placed_in_target_segments_not_pulled() {
    let mut p = placing_pair();
    let data = payload(12_000, 4);
    let (msg, item) = echo_call(7, &data);
    let h = send(&mut p, 7, &data, true, expect(32 * KIB, None));
    let seen = run_recording(&mut p);
    assert_eq!(seen, vec![msg.clone()], "the server sees the call as sent");
    let first = first_header(&p, CLIENT);
    let Operation::TransmitRequest {
        count, payload_len, ..
    } = first.op
    else {
        panic!("{:?}", first.op);
    };
    // The payload stream is the call without its argument.
    assert_eq!(payload_len as usize, msg.len() - 12_000);
    let placed = first.placement.get(0).expect("one placed item");
    assert_eq!((placed.disp, placed.length), (item.offset, 12_000));
    let ItemLocation::TargetBuffers {
        offset,
        buffer_segments,
    } = placed.location
    else {
        panic!("{placed:?}");
    };
    assert_eq!(offset, 0);
    // 12,000 bytes in segments of 576.
    assert_eq!(buffer_segments.len(), 21);
    assert_eq!(count, 4, "seven segments per 4 KiB Send");
    assert_eq!(p.ops[1], 0, "no RDMA Read: one round trip");
    assert_eq!(p.peers[CLIENT].conn.stats().items_placed_sent, 1);
    assert_eq!(p.peers[SERVER].conn.stats().items_placed_received, 1);
    assert_eq!(p.peers[CLIENT].conn.stats().calls_pulled, 0);
    assert_eq!(returned_payload(&p, h), data);
    close_and_check_leaks(&mut p);
}

#[test]
fn rtrext_s7_4_a_ddp_result_is_placed_as_the_call_directed_not_written() {
    let mut p = placing_pair();
    let data = payload(9_000, 6);
    let h = send(&mut p, 8, &data, false, expect(16 * KIB, Some(16 * KIB)));
    p.drive();
    // The call asked for the result in our target segments.
    let call = first_header(&p, CLIENT);
    assert!(
        matches!(call.op, Operation::TransmitRequest { reply_buffers, .. } if reply_buffers > 0)
    );
    let set = call.directions.sets().next().expect("one direction set");
    let d = set.directions().next().expect("one direction");
    assert_eq!(d.location, ReplyLocation::TargetBuffers);
    assert_eq!(d.min_len, 576, "one of our segments");
    // The reply placed it there.
    let reply = first_header(&p, SERVER);
    assert!(
        matches!(reply.op, Operation::TransmitResponse { .. }),
        "{:?}",
        reply.op
    );
    let placed = reply.placement.get(0).expect("the item's place");
    assert_eq!(placed.length, 9_000);
    assert!(matches!(
        placed.location,
        ItemLocation::TargetBuffers { .. }
    ));
    assert_eq!(p.ops[2], 0, "no RDMA Write");
    let (_, _, _, ddp_len) = replies(&p)[0];
    assert_eq!(ddp_len, None, "the result is back in the reply message");
    assert_eq!(returned_payload(&p, h), data);
    assert_eq!(p.peers[SERVER].conn.stats().items_placed_sent, 1);
    assert_eq!(p.peers[CLIENT].conn.stats().items_placed_received, 1);
    close_and_check_leaks(&mut p);
}

#[test]
fn rtrext_s7_4_by_default_a_ddp_result_is_written_by_rdma_as_the_call_directed() {
    // The default requester: the argument placed by Send, the result
    // directed to our memory by an explicit-RDMA direction (no round trip
    // of its own), answered by a Version One reply with the write list.
    let mut p = continued_pair(sp(cfg()), sp(cfg()));
    let data = payload(12_000, 12);
    let (msg, _) = echo_call(13, &data);
    let h = send(&mut p, 13, &data, true, expect(16 * KIB, Some(16 * KIB)));
    let seen = run_recording(&mut p);
    assert_eq!(seen, vec![msg]);
    let call = first_header(&p, CLIENT);
    assert!(matches!(
        call.op,
        Operation::TransmitRequest {
            reply_buffers: 0,
            ..
        }
    ));
    assert_eq!(call.placement.len(), 1, "the argument placed");
    let set = call.directions.sets().next().expect("one direction set");
    let d = set.directions().next().expect("one direction");
    let ReplyLocation::ExplicitRdma(segs) = d.location else {
        panic!("{d:?}");
    };
    assert_eq!(segs[0].length, 16 * KIB);
    assert_eq!((p.ops[1], p.ops[2]), (0, 1), "no Read, one Write");
    let (_, _, _, ddp_len) = replies(&p)[0];
    assert_eq!(ddp_len, Some(12_000), "the result in our DDP buffer");
    assert_eq!(returned_payload(&p, h), data);
    assert_eq!(p.peers[CLIENT].conn.stats().calls_pulled, 0);
    close_and_check_leaks(&mut p);
}

#[test]
fn rtrext_s7_4_both_items_of_an_exchange_are_placed() {
    let mut p = placing_pair();
    let data = payload(16_000, 7);
    let (msg, _) = echo_call(9, &data);
    let h = send(
        &mut p,
        9,
        &data,
        true,
        expect(16 * KIB + 64, Some(16 * KIB)),
    );
    let seen = run_recording(&mut p);
    assert_eq!(seen, vec![msg]);
    assert_eq!(returned_payload(&p, h), data);
    assert_eq!((p.ops[1], p.ops[2]), (0, 0), "Sends only");
    assert_eq!(p.peers[CLIENT].conn.stats().items_placed_sent, 1);
    assert_eq!(p.peers[SERVER].conn.stats().items_placed_sent, 1);
    close_and_check_leaks(&mut p);
}

/// The argument of a call too long for one Send (a group of two): only
/// such a call goes as a Transmit Request that can direct its reply (a
/// call that fits one Send keeps Version One's write chunk).
fn long_call() -> Vec<u8> {
    payload(5_000, 3)
}

/// Replies with `reply` (message and items) to the first call.
fn answer_with(p: &mut Pair, reply: impl Fn(u32) -> (Vec<u8>, Vec<DdpItem>)) {
    p.drive_with(&mut |side, conn, now, ev| {
        if let (SERVER, Event::CallArrived { call, xid, .. }) = (side, ev) {
            let (m, items) = reply(xid);
            conn.send_reply(
                now,
                call,
                &OutgoingReply {
                    message: &m,
                    ddp: &items,
                },
            )
            .unwrap();
        }
    });
}

#[test]
fn rtrext_s7_4_a_result_shorter_than_directed_is_answered_too_short_and_sent_inline() {
    let mut p = placing_pair();
    let short = payload(100, 8);
    let tail = payload(6_000, 9);
    let h = send(
        &mut p,
        10,
        &long_call(),
        false,
        expect(16 * KIB, Some(16 * KIB)),
    );
    // The reply is long, its DDP-eligible item short: an echo of 100
    // bytes followed by 6,000 bytes of other results.
    let reply_msg = |xid| {
        let (mut m, item) = echo_reply(xid, &short);
        m.extend_from_slice(&(tail.len() as u32).to_be_bytes());
        m.extend_from_slice(&tail);
        (m, item)
    };
    answer_with(&mut p, |xid| {
        let (m, item) = reply_msg(xid);
        (m, vec![item])
    });
    let reply = first_header(&p, SERVER);
    let answer = reply.placement.get(0).expect("the direction's answer");
    assert_eq!(answer.location, ItemLocation::TooShort);
    assert_eq!(answer.length, 100);
    assert_eq!(reply_of(&p, h), Some(reply_msg(10).0), "the reply, whole");
    assert_eq!(p.peers[SERVER].conn.stats().items_placed_sent, 0);
    close_and_check_leaks(&mut p);
}

#[test]
fn rtrext_s7_4_a_reply_without_an_item_answers_no_item() {
    let mut p = placing_pair();
    let data = payload(6_000, 9);
    let h = send(
        &mut p,
        11,
        &long_call(),
        false,
        expect(16 * KIB, Some(16 * KIB)),
    );
    answer_with(&mut p, |xid| (echo_reply(xid, &data).0, Vec::new()));
    let reply = first_header(&p, SERVER);
    let answer = reply.placement.get(0).expect("the direction's answer");
    assert_eq!(answer.location.placement_type(), PlacementType::NoItem);
    assert_eq!(returned_payload(&p, h), data);
    close_and_check_leaks(&mut p);
}

/// A placed call whose first transmission gets `corrupt(header)`
/// applied: (byte offset, xor) into it.
fn placed_call_with(corrupt: fn(&OptionalHeader) -> (usize, u8)) -> Pair {
    let mut p = placing_pair();
    p.set_fault_hook(move |fp| match fp {
        FaultPoint::Send {
            from: CLIENT,
            bytes,
        } => match optional(bytes) {
            Some(h) if matches!(h.op, Operation::TransmitRequest { .. }) => {
                let (offset, xor) = corrupt(&h);
                Fault::Corrupt { offset, xor }
            }
            _ => Fault::Deliver,
        },
        _ => Fault::Deliver,
    });
    let data = payload(12_000, 10);
    send(&mut p, 40, &data, true, expect(32 * KIB, None));
    p.drive();
    p
}

/// Byte offset of the first transmission's item fields: six fixed
/// words, then `dp`: count, disp, length, type, offset, number count,
/// numbers (s7.3).
const ITEM_OFFSET_AT: usize = 24 + 4 * 4;
const NUMBERS_AT: usize = 24 + 6 * 4;

fn assert_refused(p: &mut Pair, code: u32) {
    assert_eq!(
        failures(p),
        vec![(40, CallFailure::TransmissionError { code })],
        "the call fails with the reported error"
    );
    let r = p.peers[SERVER].conn.resources();
    assert_eq!(r.serve_slots_busy, 0, "the partial call's slot came back");
    assert_eq!(p.peers[SERVER].conn.active_calls, 0, "and its credits");
    close_and_check_leaks(p);
}

#[test]
fn rtrext_s9_5_a_segment_number_past_the_group_is_reported_badtbsn() {
    // The last segment number (numbers increase, so it stays the
    // largest) moved 4096 up.
    let mut p = placed_call_with(|h| {
        let n = match h.placement.get(0).unwrap().location {
            ItemLocation::TargetBuffers {
                buffer_segments, ..
            } => buffer_segments.len(),
            _ => unreachable!(),
        };
        (NUMBERS_AT + 4 * (n - 1) + 2, 0x10)
    });
    let reports = reports_from(&p, SERVER);
    assert!(
        matches!(
            reports[..],
            [ErrorInfo::BadBufferNumber {
                min: 0,
                max: 27,
                ..
            }]
        ),
        "four Sends of seven segments: {reports:?}"
    );
    assert_refused(&mut p, err_code::BAD_BUFFER_NUMBER);
}

#[test]
fn rtrext_s9_5_a_segment_under_the_payload_stream_is_reported_badtbsn() {
    // The first segment number 1 made 0: our first segment, where the
    // header and the payload stream are.
    let mut p = placed_call_with(|_| (NUMBERS_AT + 3, 0x01));
    let reports = reports_from(&p, SERVER);
    assert_eq!(
        reports,
        vec![ErrorInfo::BadBufferNumber {
            value: 0,
            min: 0,
            max: 6
        }]
    );
    assert_refused(&mut p, err_code::BAD_BUFFER_NUMBER);
}

#[test]
fn rtrext_s9_5_an_offset_past_its_segment_is_reported_badoff() {
    let mut p = placed_call_with(|_| (ITEM_OFFSET_AT + 2, 0x10));
    let reports = reports_from(&p, SERVER);
    assert_eq!(
        reports,
        vec![ErrorInfo::BadOffset {
            value: 4096,
            min: 0,
            max: 575
        }]
    );
    assert_refused(&mut p, err_code::BAD_OFFSET);
}

#[test]
fn rtrext_s5_3_a_peer_without_placement_gets_the_item_inline() {
    // The server offers continuation only: the argument travels in the
    // payload stream, the result is not directed.
    let cont = Config {
        extensions: Extensions::MESSAGE_CONTINUATION,
        credits: 16,
        max_outstanding_calls: 16,
        ..cfg()
    };
    let mut p = Pair::new(sp(cfg()), cont);
    let reply = conf_v2_exchange(&mut p).unwrap();
    p.conn(CLIENT).apply_conf_rdma_reply_v2(&reply);
    p.sends.clear();
    let data = payload(12_000, 11);
    let h = send(&mut p, 12, &data, true, expect(16 * KIB, Some(16 * KIB)));
    p.drive();
    assert_eq!(returned_payload(&p, h), data);
    let call = first_header(&p, CLIENT);
    assert!(call.placement.is_empty() && call.directions.is_empty());
    for side in [CLIENT, SERVER] {
        assert_eq!(p.peers[side].conn.stats().items_placed_sent, 0);
    }
    close_and_check_leaks(&mut p);
}

#[test]
fn rtrext_s7_2_target_segments_that_are_not_back_to_back_are_filled_one_by_one() {
    use crate::wire::rtrext::{BufferGroup, BufferStructure, SEGMENT_FLAG_PLACEMENT_TARGET};
    // A receive buffer whose target segments have gaps between them: a
    // 64-byte head, then seven of 500 bytes, each followed by 76 bytes
    // nobody may place into. The sender cannot send an item's pieces as
    // one gathered slice, so it copies each to its place; the receiver
    // finds every byte.
    let mut p = placing_pair();
    let mut groups = vec![BufferGroup {
        count: 1,
        length: 64,
        align: 4,
        flags: 0,
    }];
    for _ in 0..7 {
        groups.push(BufferGroup {
            count: 1,
            length: 500,
            align: 4,
            flags: SEGMENT_FLAG_PLACEMENT_TARGET,
        });
        groups.push(BufferGroup {
            count: 1,
            length: 76,
            align: 4,
            flags: 0,
        });
    }
    let gappy = TargetLayout::from_structure(&BufferStructure {
        length: 4096,
        groups: &groups,
    });
    assert_eq!(gappy.per_buffer(), 7);
    assert_eq!(gappy.segment(1), Some((0, 64 + 576, 500)));
    // As if the server had advertised it: the client places into it, the
    // server checks against it.
    p.peers[CLIENT].conn.peer_targets = gappy;
    p.peers[SERVER].conn.our_targets = gappy;
    let data = payload(12_000, 14);
    let (msg, _) = echo_call(15, &data);
    let h = send(&mut p, 15, &data, true, expect(16 * KIB, Some(16 * KIB)));
    let seen = run_recording(&mut p);
    assert_eq!(seen, vec![msg], "the server sees the call as sent");
    let call = first_header(&p, CLIENT);
    let ItemLocation::TargetBuffers {
        buffer_segments, ..
    } = call.placement.get(0).expect("placed").location
    else {
        panic!("{call:?}");
    };
    assert_eq!(buffer_segments.len(), 24, "12,000 bytes in segments of 500");
    assert_eq!(p.peers[SERVER].conn.stats().items_placed_received, 1);
    assert_eq!(returned_payload(&p, h), data);
    close_and_check_leaks(&mut p);
}
