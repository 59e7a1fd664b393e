//! Message continuation between two engines (draft-dnoveck-rpcrdma-
//! rtrext-02 s4, s9.2-9.5; `continuation.rs`), negotiated by a real
//! CONF_RDMA version 2 exchange. Named after the draft's sections.

use std::cell::RefCell;
use std::rc::Rc;

use super::harness::*;
use super::tests::*;
use super::*;
use crate::wire::rpc::MessageType;
use crate::wire::rpcrdma::HeaderView;
use crate::wire::rtrext::{
    err_code, ErrorInfo, GroupKind, Operation, OptionalHeader, TransmissionId, RDMA_OPTIONAL,
};

fn mc(c: Config) -> Config {
    Config {
        extensions: Extensions::MESSAGE_CONTINUATION,
        credits: 16,
        max_outstanding_calls: 16,
        ..c
    }
}

/// A pair that negotiated what its configurations advertise (message
/// continuation at least) through CONF_RDMA v2.
pub(super) fn continued_pair(client: Config, server: Config) -> Pair {
    let mut p = Pair::new(client, server);
    let reply = conf_v2_exchange(&mut p).expect("CONF_RDMA v2");
    p.conn(CLIENT).apply_conf_rdma_reply_v2(&reply);
    p.peers[CLIENT].events.clear();
    p.peers[SERVER].events.clear();
    p.sends.clear();
    p.ops = [0; 3];
    p
}

pub(super) fn optional(bytes: &[u8]) -> Option<OptionalHeader> {
    let v = HeaderView::new_checked(bytes).ok()?;
    if v.proc_type() != RDMA_OPTIONAL {
        return None;
    }
    OptionalHeader::parse(bytes, &crate::wire::rtrext::Limits::DEFAULT)
        .ok()
        .map(|(h, _)| h)
}

/// The operations of every RDMA_OPTIONAL Send `side` made, in order.
fn ops_from(p: &Pair, side: usize) -> Vec<Operation> {
    p.sends_from(side)
        .filter_map(optional)
        .map(|h| h.op)
        .collect()
}

fn reports_from(p: &Pair, side: usize) -> Vec<ErrorInfo> {
    ops_from(p, side)
        .into_iter()
        .filter_map(|op| match op {
            Operation::ReportError(r) => Some(r.info),
            _ => None,
        })
        .collect()
}

#[test]
fn rtrext_s8_conf_rdma_v2_negotiates_continuation_and_the_group_limits() {
    let p = continued_pair(mc(cfg()), mc(cfg()));
    for side in [CLIENT, SERVER] {
        let c = &p.peers[side].conn;
        assert!(c.negotiated().contains(Extensions::MESSAGE_CONTINUATION));
        assert_eq!(c.peer_group_recv_limit, 17, "s8.4");
        assert_eq!(c.peer_group_send_limit, 17, "s8.5");
    }
}

#[test]
fn rtrext_s4_2_a_long_call_goes_as_a_transmission_group_not_a_read_chunk() {
    let mut p = continued_pair(mc(cfg()), mc(cfg()));
    let data = payload(20_000, 3);
    let (msg, _) = echo_call(7, &data);
    let h = send(&mut p, 7, &data, false, expect(32 * KIB, None));
    let seen = run_recording(&mut p);
    assert_eq!(seen, vec![msg.clone()], "the server sees the call as sent");
    let ops = ops_from(&p, CLIENT);
    let Operation::TransmitRequest {
        count,
        reply_buffers,
        ..
    } = ops[0]
    else {
        panic!("first Send is {:?}", ops[0]);
    };
    assert_eq!(count, 5, "20 KiB in 4 KiB Sends");
    assert_eq!(reply_buffers, 8, "32 KiB of reply, 4060 bytes per Send");
    for (n, op) in ops[1..count as usize].iter().enumerate() {
        assert!(
            matches!(op, Operation::TransmitContinue { seq, group: GroupKind::Request, .. } if *seq == n as u32 + 1),
            "transmission {}: {op:?}",
            n + 1
        );
    }
    let total: u32 = ops[..count as usize].iter().map(|o| o.payload_len()).sum();
    assert_eq!(total as usize, msg.len(), "the payload streams concatenate");
    assert_eq!(p.ops[1], 0, "no RDMA Read");
    assert_eq!(p.peers[CLIENT].conn.stats().call_groups_sent, 1);
    assert_eq!(p.peers[SERVER].conn.stats().call_groups_received, 1);
    assert_eq!(p.peers[CLIENT].conn.stats().calls_pulled, 0);
    let (_, _, len, _) = replies(&p)[0];
    assert_eq!(reply_of(&p, h).unwrap().len(), len as usize);
    close_and_check_leaks(&mut p);
}

#[test]
fn rtrext_s4_3_a_long_reply_comes_in_the_receives_its_call_reserved() {
    let mut p = continued_pair(mc(cfg()), mc(cfg()));
    let data = payload(30_000, 9);
    // A call of two Sends whose reply may be 48 KiB: without the
    // extension a read chunk and a reply chunk; here 12 receives beyond
    // the first (4060 payload bytes each). (A call that fits one Send
    // keeps its reply chunk: a Write costs no round trip.)
    let h = send(&mut p, 9, &payload(5_000, 1), false, expect(48 * KIB, None));
    p.drive_with(&mut |side, conn, now, ev| {
        if let (SERVER, Event::CallArrived { call, xid, .. }) = (side, ev) {
            let (m, _) = echo_reply(xid, &data);
            conn.send_reply(
                now,
                call,
                &OutgoingReply {
                    message: &m,
                    ddp: &[],
                },
            )
            .unwrap();
        }
    });
    let ops = ops_from(&p, CLIENT);
    assert!(
        matches!(
            ops[0],
            Operation::TransmitRequest {
                count: 2,
                reply_buffers: 12,
                ..
            }
        ),
        "two Sends, receives reserved instead of a reply chunk: {:?}",
        ops[0]
    );
    let replies_ops = ops_from(&p, SERVER);
    let Operation::TransmitResponse { count, .. } = replies_ops[0] else {
        panic!("the reply begins with {:?}", replies_ops[0]);
    };
    assert_eq!(count, 8, "30 KiB in 4 KiB Sends");
    assert_eq!(returned_payload(&p, h), data);
    assert_eq!(p.ops[2], 0, "no RDMA Write");
    assert_eq!(p.peers[SERVER].conn.stats().reply_groups_sent, 1);
    assert_eq!(p.peers[CLIENT].conn.stats().reply_groups_received, 1);
    close_and_check_leaks(&mut p);
    assert_eq!(
        p.peers[CLIENT].conn.cont_recvs_free,
        p.peers[CLIENT].conn.config().continuation_receives,
        "every reserved receive came back"
    );
}

#[test]
fn rtrext_s4_3_each_transmission_takes_a_credit_and_a_group_never_overruns_the_grant() {
    let small = |c: Config| Config {
        credits: 6,
        max_outstanding_calls: 6,
        ..mc(c)
    };
    let mut p = continued_pair(small(cfg()), small(cfg()));
    // Four calls of 5 transmissions each against a grant of 6: only one
    // group fits at a time beside the others; the rest go as long calls.
    let mut handles = Vec::new();
    for xid in 20..24 {
        handles.push(send(
            &mut p,
            xid,
            &payload(20_000, xid as u8),
            false,
            expect(32 * KIB, None),
        ));
    }
    p.drive_with(&mut echo_service);
    assert_eq!(replies(&p).len(), 4, "{:?}", failures(&p));
    let c = p.peers[CLIENT].conn.stats();
    assert!(c.call_groups_sent >= 1);
    assert_eq!(c.call_groups_sent + c.calls_pulled, 4);
    assert!(
        p.peers[SERVER].conn.stats().max_active_calls <= 6,
        "never beyond the grant"
    );
    assert_eq!(p.peers[SERVER].conn.stats().credit_overruns, 0);
    for h in handles {
        assert!(reply_of(&p, h).is_some());
    }
    close_and_check_leaks(&mut p);
}

#[test]
fn rtrext_s5_2_a_version_one_peer_never_sees_an_optional_header() {
    // The server does not offer continuation: CONF_RDMA v2 negotiates
    // nothing and the long call and long reply use chunks.
    let mut p = continued_pair(mc(cfg()), cfg());
    assert_eq!(p.peers[CLIENT].conn.negotiated(), Extensions::EMPTY);
    let data = payload(20_000, 5);
    let h = send(&mut p, 5, &data, false, expect(64 * KIB, None));
    p.drive_with(&mut echo_service);
    assert_eq!(returned_payload(&p, h), data);
    for side in [CLIENT, SERVER] {
        assert!(
            ops_from(&p, side).is_empty(),
            "side {side} sent an RDMA_OPTIONAL header"
        );
    }
    assert_eq!(p.peers[CLIENT].conn.stats().calls_pulled, 1);
    close_and_check_leaks(&mut p);
}

/// Sends a 20 KiB call as a group of 5 with `hook` applied to the
/// client's Sends, and returns the pair after driving it.
fn group_with_fault(hook: impl FnMut(FaultPoint<'_>) -> Fault + 'static) -> Pair {
    let mut p = continued_pair(mc(cfg()), mc(cfg()));
    p.set_fault_hook(hook);
    send(
        &mut p,
        40,
        &payload(20_000, 1),
        false,
        expect(32 * KIB, None),
    );
    p.drive_with(&mut echo_service);
    p
}

/// The index (among the client's Sends, from 0) of the transmission
/// number `seq` of a group, with a fault for it.
fn fault_on_transmission(seq: u32, fault: Fault) -> impl FnMut(FaultPoint<'_>) -> Fault {
    move |fp| match fp {
        FaultPoint::Send {
            from: CLIENT,
            bytes,
        } => match optional(bytes).map(|h| h.op) {
            Some(Operation::TransmitContinue { seq: s, .. }) if s == seq => fault,
            _ => Fault::Deliver,
        },
        _ => Fault::Deliver,
    }
}

fn assert_call_failed_with(p: &Pair, code: u32) {
    assert_eq!(
        failures(p),
        vec![(40, CallFailure::TransmissionError { code })],
        "the call fails with the reported error"
    );
}

fn assert_server_clean(p: &mut Pair) {
    let r = p.peers[SERVER].conn.resources();
    assert_eq!(r.serve_slots_busy, 0, "the partial call's slot came back");
    assert_eq!(p.peers[SERVER].conn.active_calls, 0, "and its credits");
    assert_eq!(p.peers[SERVER].conn.stats().groups_dropped, 1);
    close_and_check_leaks(p);
}

#[test]
fn rtrext_s9_5_a_lost_transmission_is_reported_badseq_and_the_rest_dropped_quietly() {
    let mut p = group_with_fault(fault_on_transmission(2, Fault::Drop));
    assert_eq!(
        reports_from(&p, SERVER),
        vec![ErrorInfo::BadSequence {
            expected: 2,
            current: 3
        }],
        "one report, not one per later transmission"
    );
    assert_call_failed_with(&p, err_code::BAD_SEQUENCE);
    assert_server_clean(&mut p);
}

#[test]
fn rtrext_s9_5_a_continuation_of_another_xid_is_reported_badxid() {
    // Flip a bit of the XID (its last byte) of transmission 1.
    let mut p = group_with_fault(fault_on_transmission(
        1,
        Fault::Corrupt {
            offset: 3,
            xor: 0x10,
        },
    ));
    assert_eq!(
        reports_from(&p, SERVER),
        vec![ErrorInfo::BadXid {
            expected: 40,
            current: 40 ^ 0x10
        }]
    );
    assert_call_failed_with(&p, err_code::BAD_XID);
    assert_server_clean(&mut p);
}

#[test]
fn rtrext_s9_5_a_continuation_past_its_send_is_reported_badpl() {
    // Transmission 1's pslen (word 8 of the header) made larger than the
    // Send.
    let mut p = group_with_fault(fault_on_transmission(
        1,
        Fault::Corrupt {
            offset: 8 * 4 + 1,
            xor: 0x40,
        },
    ));
    let reports = reports_from(&p, SERVER);
    assert!(
        matches!(reports[..], [ErrorInfo::BadPayloadLength { .. }]),
        "{reports:?}"
    );
    assert_call_failed_with(&p, err_code::BAD_PAYLOAD_LENGTH);
    assert_server_clean(&mut p);
}

#[test]
fn rtrext_s9_5_a_version_one_message_inside_a_group_is_reported_badhmt_and_still_served() {
    let mut p = continued_pair(mc(cfg()), mc(cfg()));
    // Transmissions 1.. of the group vanish; a plain NULL-sized call
    // follows.
    p.set_fault_hook(fault_on_transmission_at_least(1));
    send(
        &mut p,
        40,
        &payload(20_000, 1),
        false,
        expect(32 * KIB, None),
    );
    send(&mut p, 41, b"small", false, expect(512, None));
    p.drive_with(&mut echo_service);
    assert_eq!(
        reports_from(&p, SERVER),
        vec![ErrorInfo::BadHeaderType {
            expected: RDMA_OPTIONAL,
            current: 0
        }],
        "RDMA_MSG (0) where a continuation was due"
    );
    assert_eq!(
        replies(&p).iter().map(|r| r.0).collect::<Vec<_>>(),
        vec![41],
        "the message that broke in is served"
    );
    assert_call_failed_with(&p, err_code::BAD_HEADER_TYPE);
    assert_server_clean(&mut p);
}

fn fault_on_transmission_at_least(seq: u32) -> impl FnMut(FaultPoint<'_>) -> Fault {
    move |fp| match fp {
        FaultPoint::Send {
            from: CLIENT,
            bytes,
        } => match optional(bytes).map(|h| h.op) {
            Some(Operation::TransmitContinue { seq: s, .. }) if s >= seq => Fault::Drop,
            _ => Fault::Deliver,
        },
        _ => Fault::Deliver,
    }
}

#[test]
fn rtrext_s9_5_a_new_group_inside_a_group_is_reported_badomt() {
    let mut p = continued_pair(mc(cfg()), mc(cfg()));
    let mut dropped = 0;
    // The first group loses its last transmission; the second group
    // arrives whole.
    p.set_fault_hook(move |fp| match fp {
        FaultPoint::Send {
            from: CLIENT,
            bytes,
        } => match optional(bytes).map(|h| (h.xid, h.op)) {
            Some((40, Operation::TransmitContinue { seq: 4, .. })) if dropped == 0 => {
                dropped += 1;
                Fault::Drop
            }
            _ => Fault::Deliver,
        },
        _ => Fault::Deliver,
    });
    send(
        &mut p,
        40,
        &payload(20_000, 1),
        false,
        expect(32 * KIB, None),
    );
    send(
        &mut p,
        41,
        &payload(20_000, 2),
        false,
        expect(32 * KIB, None),
    );
    p.drive_with(&mut echo_service);
    assert_eq!(
        reports_from(&p, SERVER),
        vec![ErrorInfo::BadOptionalType {
            expected: crate::wire::rtrext::op_type::TRANSMIT_CONTINUE,
            current: crate::wire::rtrext::op_type::TRANSMIT_REQUEST,
        }]
    );
    assert_eq!(
        replies(&p).iter().map(|r| r.0).collect::<Vec<_>>(),
        vec![41]
    );
    assert_call_failed_with(&p, err_code::BAD_OPTIONAL_TYPE);
    assert_server_clean(&mut p);
}

/// An RDMA_OPTIONAL header from the client, injected as it stands
/// (delivered at the next drive).
fn inject_optional(p: &mut Pair, xid: u32, op: Operation, payload: &[u8]) {
    let h = OptionalHeader::new(xid, 4, op);
    let mut m = vec![0u8; h.buffer_len()];
    h.emit(Extensions::MESSAGE_CONTINUATION, &mut m).unwrap();
    m.extend_from_slice(payload);
    p.inject(CLIENT, m);
}

#[test]
fn rtrext_s9_5_a_continuation_nothing_announced_is_reported_badcont() {
    let mut p = continued_pair(mc(cfg()), mc(cfg()));
    inject_optional(
        &mut p,
        77,
        Operation::TransmitContinue {
            seq: 1,
            group: GroupKind::Request,
            payload_len: 4,
        },
        &[0; 4],
    );
    p.drive();
    assert_eq!(reports_from(&p, SERVER), vec![ErrorInfo::BadContinuation]);
    let report = p
        .sends_from(SERVER)
        .filter_map(optional)
        .find_map(|h| match h.op {
            Operation::ReportError(r) => Some(r),
            _ => None,
        })
        .unwrap();
    assert_eq!(
        report.bad,
        TransmissionId {
            xid: 77,
            direction: MessageType::Call,
            seq: 1
        },
        "names the transmission it was found on"
    );
    close_and_check_leaks(&mut p);
}

#[test]
fn rtrext_s8_4_a_group_longer_than_we_accept_is_reported_badseq_and_dropped_whole() {
    let server = Config {
        max_group_transmissions: 4,
        ..mc(cfg())
    };
    let mut p = continued_pair(mc(cfg()), server);
    let before = p.peers[SERVER].conn.stats().calls_received;
    inject_optional(
        &mut p,
        78,
        Operation::TransmitRequest {
            count: 10,
            reply_buffers: 0,
            payload_len: 8,
        },
        &[0; 8],
    );
    for seq in 1..10 {
        inject_optional(
            &mut p,
            78,
            Operation::TransmitContinue {
                seq,
                group: GroupKind::Request,
                payload_len: 0,
            },
            &[],
        );
    }
    p.drive();
    assert_eq!(
        reports_from(&p, SERVER),
        vec![ErrorInfo::BadSequence {
            expected: 4,
            current: 10
        }],
        "one report; its continuations are dropped"
    );
    let s = p.peers[SERVER].conn.stats();
    assert_eq!((s.calls_received - before, s.groups_dropped), (0, 1));
    assert!(p.peers[SERVER].conn.close_reason().is_none());
    close_and_check_leaks(&mut p);
}

#[test]
fn rtrext_s4_2_a_group_that_stops_arriving_is_dropped_at_the_group_timeout() {
    let mut p = continued_pair(mc(cfg()), mc(cfg()));
    p.set_fault_hook(fault_on_transmission_at_least(3));
    send(
        &mut p,
        40,
        &payload(20_000, 1),
        false,
        expect(32 * KIB, None),
    );
    let start = p.now;
    p.drive_until(start.saturating_add(core::time::Duration::from_millis(500)));
    assert_eq!(
        p.peers[SERVER].conn.resources().serve_slots_busy,
        1,
        "waiting"
    );
    p.drive_until(start.saturating_add(core::time::Duration::from_secs(2)));
    assert!(reports_from(&p, SERVER).is_empty(), "nothing to report");
    assert_server_clean(&mut p);
}

#[test]
fn rtrext_s9_5_a_lost_reply_transmission_fails_the_call_and_tells_the_responder() {
    let mut p = continued_pair(mc(cfg()), mc(cfg()));
    p.set_fault_hook(|fp| match fp {
        FaultPoint::Send {
            from: SERVER,
            bytes,
        } => match optional(bytes).map(|h| h.op) {
            Some(Operation::TransmitContinue { seq: 2, .. }) => Fault::Drop,
            _ => Fault::Deliver,
        },
        _ => Fault::Deliver,
    });
    let data = payload(30_000, 9);
    send(
        &mut p,
        40,
        &payload(5_000, 2),
        false,
        expect(48 * KIB, None),
    );
    p.drive_with(&mut |side, conn, now, ev| {
        if let (SERVER, Event::CallArrived { call, xid, .. }) = (side, ev) {
            let (m, _) = echo_reply(xid, &data);
            let r = OutgoingReply {
                message: &m,
                ddp: &[],
            };
            conn.send_reply(now, call, &r).unwrap();
        }
    });
    assert_eq!(
        reports_from(&p, CLIENT),
        vec![ErrorInfo::BadSequence {
            expected: 2,
            current: 3
        }]
    );
    assert_call_failed_with(&p, err_code::BAD_SEQUENCE);
    assert_eq!(p.peers[SERVER].conn.stats().transmission_errors_received, 1);
    assert_eq!(p.peers[CLIENT].conn.stats().groups_dropped, 1);
    close_and_check_leaks(&mut p);
}

/// Random loss, reordering, duplication and corruption of the
/// transmissions of groups in both directions: every call either gets
/// its echo back intact or fails with a clean reason, nothing panics,
/// and nothing leaks.
mod prop {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
        #[test]
        fn groups_survive_faults(
            sizes in proptest::collection::vec(1usize..40_000, 1..6),
            faults in proptest::collection::vec((0u8..6, 0usize..64, 1u8..=255), 0..6),
            placed in any::<bool>(),
        ) {
            // With send-based placement too, the echoes' data are the
            // DDP-eligible items both ways (placed when short enough).
            let ext = |c: Config| if placed {
                Config {
                    extensions: Extensions::MESSAGE_CONTINUATION.union(Extensions::SEND_PLACEMENT),
                    ..mc(c)
                }
            } else {
                mc(c)
            };
            let mut p = continued_pair(ext(cfg()), ext(cfg()));
            let plan = Rc::new(RefCell::new(faults));
            let seen = Rc::new(RefCell::new(0usize));
            let corrupted = Rc::new(RefCell::new(false));
            let (plan2, seen2, corrupted2) = (plan.clone(), seen.clone(), corrupted.clone());
            p.set_fault_hook(move |fp| {
                let FaultPoint::Send { bytes, .. } = fp else { return Fault::Deliver };
                if optional(bytes).is_none() {
                    return Fault::Deliver;
                }
                let n = {
                    let mut s = seen2.borrow_mut();
                    *s += 1;
                    *s
                };
                let mut plan = plan2.borrow_mut();
                match plan.iter().position(|f| f.1 % 16 == n % 16) {
                    Some(i) => {
                        let (kind, off, xor) = plan.remove(i);
                        match kind {
                            0 => Fault::Drop,
                            1 => Fault::Duplicate,
                            2 => Fault::Delay(core::time::Duration::from_micros(50)),
                            _ => {
                                *corrupted2.borrow_mut() = true;
                                Fault::Corrupt { offset: off, xor }
                            }
                        }
                    }
                    None => Fault::Deliver,
                }
            });
            let mut sent = Vec::new();
            for (i, &n) in sizes.iter().enumerate() {
                let xid = 100 + i as u32;
                let data = payload(n, i as u8);
                let now = p.now;
                let (msg, item) = echo_call(xid, &data);
                let call = OutgoingCall {
                    message: &msg,
                    ddp: placed.then_some(item),
                    reply: expect(48 * KIB, placed.then_some(40_000)),
                    app: AppChunks::NONE,
                };
                if let Ok(h) = p.conn(CLIENT).send_call(now, &call) {
                    sent.push((xid, h, data));
                }
            }
            // A corrupted call may not parse as an echo: such calls are
            // left unanswered (the close drops them).
            let mut tolerant = |side: usize, conn: &mut Connection, now: Instant, ev: Event| {
                if let (SERVER, Event::CallArrived { call, xid, .. }) = (side, ev) {
                    let payload = conn.call_message(call).and_then(echo_payload);
                    if let Some(payload) = payload {
                        let (m, item) = echo_reply(xid, &payload);
                        let r = OutgoingReply { message: &m, ddp: &[item] };
                        let _ = conn.send_reply(now, call, &r);
                    }
                }
            };
            p.drive_with(&mut tolerant);
            let later = p.now.saturating_add(core::time::Duration::from_secs(3));
            p.drive_app_until(&mut tolerant, later);
            // Without corruption (which RDMA's CRC would catch before the
            // engine sees it), every reply that arrived is the echo, intact;
            // loss, duplication and delay only make calls fail.
            let done = replies(&p);
            if !*corrupted.borrow() {
                for (xid, h, data) in &sent {
                    if done.iter().any(|r| r.0 == *xid) {
                        prop_assert_eq!(&returned_payload(&p, *h), data);
                    }
                }
            }
            let failed = failures(&p).len();
            prop_assert!(done.len() + failed <= sent.len());
            release_all(&mut p);
            p.conn(CLIENT).close();
            p.drive();
            for side in [CLIENT, SERVER] {
                let r = p.peers[side].conn.resources();
                prop_assert!(r.is_idle(), "side {} leaked: {:?}", side, r);
            }
        }
    }
}

/// A continuation numbered 2^32-1 inside an open group (found by
/// `engine_worker`): BADSEQ, the rest of the group dropped, no
/// arithmetic overflow.
#[test]
fn rtrext_s9_5_a_last_possible_transmission_number_is_just_out_of_order() {
    let mut p = continued_pair(mc(cfg()), mc(cfg()));
    inject_optional(
        &mut p,
        79,
        Operation::TransmitRequest {
            count: 3,
            reply_buffers: 0,
            payload_len: 8,
        },
        &[0; 8],
    );
    inject_optional(
        &mut p,
        79,
        Operation::TransmitContinue {
            seq: u32::MAX,
            group: GroupKind::Request,
            payload_len: 0,
        },
        &[],
    );
    p.drive();
    assert_eq!(
        reports_from(&p, SERVER),
        vec![ErrorInfo::BadSequence {
            expected: 1,
            current: u32::MAX
        }]
    );
    assert_eq!(p.peers[SERVER].conn.resources().serve_slots_busy, 0);
    close_and_check_leaks(&mut p);
}
