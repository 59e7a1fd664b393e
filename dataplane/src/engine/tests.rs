//! Engine tests over the two-peer harness. Each test is named after the
//! RFC 5666 section whose rule it checks.

use std::cell::RefCell;
use std::rc::Rc;

use super::harness::*;
use super::*;
use crate::wire::conf::{CONFIG_RDMA_PROG, CONF_RDMA_PROC};
use crate::wire::rpc::{AcceptStatus, CallHeader, OpaqueAuth};
use crate::wire::rpcrdma::{ErrorBody, Limits, MessageBody, Segment, TransportHeader};

mod bulk;
mod miri;
mod msgp_inv;
mod slot_states;

pub(super) const KIB: u32 = 1024;

pub(super) fn cfg() -> Config {
    Config {
        inline_recv_size: 4 * KIB,
        inline_send_size: 4 * KIB,
        peer_inline_recv_size: 4 * KIB,
        peer_inline_send_size: 4 * KIB,
        credits: 4,
        max_outstanding_calls: 4,
        max_call_size: 512 * KIB,
        max_reply_size: 512 * KIB,
        max_ddp_size: 512 * KIB,
        ..Config::default()
    }
}

pub(super) fn pair() -> Pair {
    Pair::new(cfg(), cfg())
}

pub(super) fn header(bytes: &[u8]) -> TransportHeader {
    TransportHeader::parse(bytes, &Limits::DEFAULT)
        .expect("engine emitted a bad header")
        .0
}

pub(super) fn payload(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

pub(super) fn expect(max_len: u32, ddp_max: Option<u32>) -> ReplyExpect {
    ReplyExpect { max_len, ddp_max }
}

pub(super) fn send(
    p: &mut Pair,
    xid: u32,
    data: &[u8],
    ddp: bool,
    reply: ReplyExpect,
) -> CallHandle {
    let (msg, item) = echo_call(xid, data);
    let now = p.now;
    p.conn(CLIENT)
        .send_call(
            now,
            &OutgoingCall {
                message: &msg,
                ddp: ddp.then_some(item),
                reply,
                app: AppChunks::NONE,
            },
        )
        .expect("send_call")
}

/// Replies that arrived at the client: (xid, handle, len, ddp_len).
pub(super) fn replies(p: &Pair) -> Vec<(u32, CallHandle, u32, Option<u32>)> {
    p.peers[CLIENT]
        .events
        .iter()
        .filter_map(|e| match *e {
            Event::ReplyArrived {
                call,
                xid,
                len,
                ddp_len,
            } => Some((xid, call, len, ddp_len)),
            _ => None,
        })
        .collect()
}

pub(super) fn failures(p: &Pair) -> Vec<(u32, CallFailure)> {
    p.peers[CLIENT]
        .events
        .iter()
        .filter_map(|e| match *e {
            Event::CallFailed { xid, reason, .. } => Some((xid, reason)),
            _ => None,
        })
        .collect()
}

/// The full echo payload the client got back: from the write chunk if the
/// responder used it, else from the inline/reply-chunk message.
pub(super) fn returned_payload(p: &Pair, h: CallHandle) -> Vec<u8> {
    match p.peers[CLIENT].conn.reply_ddp(h) {
        Some(d) => d.to_vec(),
        None => {
            let m = reply_of(p, h).expect("reply");
            let (_, hl) = crate::wire::rpc::ReplyHeader::parse(&m).expect("reply header");
            crate::wire::xdr::Decoder::new(&m[hl..])
                .get_opaque(usize::MAX)
                .expect("opaque")
                .to_vec()
        }
    }
}

/// A copy of the reply to `h` at the client (the engine hands out a view
/// of memory the peer wrote), if it arrived.
pub(super) fn reply_of(p: &Pair, h: CallHandle) -> Option<Vec<u8>> {
    p.peers[CLIENT].conn.reply_message(h).map(|b| b.to_vec())
}

pub(super) fn release_all(p: &mut Pair) {
    for (_, h, _, _) in replies(p) {
        p.conn(CLIENT).release_reply(h);
    }
}

/// Close, let every posted request flush, and check nothing leaked.
pub(super) fn close_and_check_leaks(p: &mut Pair) {
    release_all(p);
    p.conn(CLIENT).close();
    p.drive();
    for side in [CLIENT, SERVER] {
        let r = p.peers[side].conn.resources();
        assert!(r.is_idle(), "side {side} leaked: {r:?}");
    }
}

/// A raw RDMA_MSG call as a hand-crafted peer would send it.
pub(super) fn raw_call(xid: u32, credits: u32, rpc: &[u8]) -> Vec<u8> {
    let h = TransportHeader::new(xid, credits, MessageBody::Msg);
    let mut v = vec![0u8; h.buffer_len()];
    h.emit(&mut v).unwrap();
    v.extend_from_slice(rpc);
    v
}

pub(super) fn be(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_be_bytes()).collect()
}

pub(super) fn last_error_from_server(p: &Pair) -> (u32, ErrorBody) {
    let bytes = p.sends_from(SERVER).last().expect("server sent nothing");
    let h = header(bytes);
    match h.body {
        MessageBody::Error(e) => (h.xid, e),
        other => panic!("expected RDMA_ERROR, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------
// s3.1 / s4: inline messages

#[test]
fn rfc5666_s3_1_inline_call_and_reply_round_trip() {
    let mut p = pair();
    let h = send(&mut p, 7, b"hello, rdma", true, expect(512, None));
    p.drive();
    assert_eq!(replies(&p).len(), 1);
    let (xid, rh, len, ddp) = replies(&p)[0];
    assert_eq!((xid, rh, ddp), (7, h, None));
    let want = echo_reply(7, b"hello, rdma").0;
    assert_eq!(len as usize, want.len());
    assert_eq!(reply_of(&p, h), Some(want.to_vec()));
    // Two Sends, both RDMA_MSG with three empty lists; no RDMA at all.
    assert_eq!(p.ops, [2, 0, 0]);
    for (_, bytes) in &p.sends {
        let hd = header(bytes);
        assert_eq!(hd.body, MessageBody::Msg);
        assert!(hd.chunks.is_empty());
    }
    assert!(p.conn(CLIENT).release_reply(h));
    assert!(
        !p.conn(CLIENT).release_reply(h),
        "a released handle is stale"
    );
    close_and_check_leaks(&mut p);
}

#[test]
fn rfc5666_s3_1_inline_threshold_is_the_peers_receive_size() {
    // The client may send 4 KiB but the server only receives 2 KiB: a
    // 3 KiB call must not go inline.
    let server = Config {
        inline_recv_size: 2 * KIB,
        ..cfg()
    };
    let client = Config {
        peer_inline_recv_size: 2 * KIB,
        ..cfg()
    };
    let mut p = Pair::new(client, server);
    let data = payload(3 * 1024, 1);
    let h = send(&mut p, 1, &data, true, expect(8 * KIB, None));
    p.drive();
    let first = p.sends_from(CLIENT).next().unwrap().to_vec();
    assert!(first.len() <= 2048, "call Send of {} bytes", first.len());
    assert_eq!(header(&first).chunks.reads().len(), 1);
    // The 3 KiB reply exceeds nothing on the client (4 KiB receives): inline.
    let reply = p.sends_from(SERVER).next().unwrap().to_vec();
    assert_eq!(header(&reply).body, MessageBody::Msg);
    assert_eq!(returned_payload(&p, h), data);
    close_and_check_leaks(&mut p);
}

// ---------------------------------------------------------------------------
// s3.3: credits

#[test]
fn rfc5666_s3_3_credits_requested_granted_and_respected() {
    let server = Config {
        credits: 2,
        ..cfg()
    };
    let client = Config {
        max_outstanding_calls: 8,
        ..cfg()
    };
    let mut p = Pair::new(client, server);
    let handles: Vec<_> = (0..8)
        .map(|i| send(&mut p, 100 + i, &[i as u8; 40], false, expect(512, None)))
        .collect();
    assert_eq!(
        p.peers[CLIENT].conn.outstanding_calls(),
        1,
        "one credit before the first grant"
    );
    p.drive();
    assert_eq!(replies(&p).len(), 8);
    for (i, h) in handles.iter().enumerate() {
        assert_eq!(returned_payload(&p, *h), vec![i as u8; 40]);
    }
    assert!(p.peers[SERVER].conn.stats().max_active_calls <= 2);
    assert_eq!(p.peers[CLIENT].conn.stats().max_outstanding_calls, 2);
    assert_eq!(p.peers[CLIENT].conn.granted_credits(), 2);
    for bytes in p.sends_from(CLIENT) {
        assert_eq!(
            header(bytes).credits,
            8,
            "calls request max_outstanding_calls"
        );
    }
    for bytes in p.sends_from(SERVER) {
        assert_eq!(
            header(bytes).credits,
            2,
            "replies grant the configured credits"
        );
    }
    assert_eq!(p.rnr, 0);
    close_and_check_leaks(&mut p);
}

#[test]
fn rfc5666_s3_3_credit_overrun_closes_connection() {
    let server = Config {
        credits: 2,
        ..cfg()
    };
    let mut p = Pair::new(cfg(), server);
    p.drive();
    for xid in 1..=3 {
        p.inject(CLIENT, raw_call(xid, 2, &echo_call(xid, b"x").0));
    }
    // The server application sits on its calls: no reply frees a credit.
    p.drive_with(&mut |_, _, _, _| {});
    let s = &p.peers[SERVER];
    assert_eq!(s.conn.close_reason(), Some(CloseReason::CreditOverrun));
    assert_eq!(s.conn.stats().credit_overruns, 1);
    assert_eq!(s.conn.stats().calls_received, 2);
    assert!(s.events.contains(&Event::ConnectionLost {
        reason: CloseReason::CreditOverrun
    }));
    for side in [CLIENT, SERVER] {
        assert!(
            p.peers[side].conn.resources().is_idle(),
            "{:?}",
            p.peers[side].conn.resources()
        );
    }
}

#[test]
fn rfc5666_s3_3_receives_posted_match_credits_plus_own_calls() {
    let mut p = pair();
    p.drive();
    // credits (4) for the peer's calls + max_outstanding_calls (4) for replies.
    assert_eq!(p.peers[SERVER].max_recvs_posted, 8);
    assert_eq!(p.peers[SERVER].conn.resources().recvs_posted, 8);
}

// ---------------------------------------------------------------------------
// s4.2: header errors

#[test]
fn rfc5666_s4_2_unsupported_version_answered_with_err_vers() {
    let mut p = pair();
    p.drive();
    let mut msg = be(&[0xabcd, 2, 1, 0, 0, 0, 0]);
    msg.extend_from_slice(&echo_call(0xabcd, b"v2").0);
    p.inject(CLIENT, msg);
    p.drive();
    assert_eq!(
        last_error_from_server(&p),
        (0xabcd, ErrorBody::Vers { low: 1, high: 1 })
    );
    let s = &p.peers[SERVER].conn;
    assert_eq!(s.stats().err_vers_sent, 1);
    assert_eq!(s.stats().calls_received, 0);
    assert_eq!(s.close_reason(), None);
    assert_eq!(p.peers[CLIENT].conn.stats().unmatched_replies, 1);
}

#[test]
fn rfc5666_s4_2_bad_chunk_lists_answered_with_err_chunk_before_any_read() {
    let mut p = pair();
    p.drive();
    let rpc = echo_call(9, b"abc").0;
    // Misaligned read position (RFC 5666 s3.4: XDR positions).
    let mut bad_pos = be(&[9, 1, 1, 0, 1, 6, 0x1234, 64, 0, 0x1000, 0, 0, 0]);
    bad_pos.extend_from_slice(&rpc);
    // Read chunk positioned past the inline part (layout check).
    let mut past_end = be(&[9, 1, 1, 0, 1, 4096, 0x1234, 64, 0, 0x1000, 0, 0, 0]);
    past_end.extend_from_slice(&rpc);
    // RDMA_MSGP whose align is not a multiple of 4 (s3.9), an unknown type.
    let mut msgp = be(&[9, 1, 1, 2, 6, 0, 0, 0, 0]);
    msgp.extend_from_slice(&rpc);
    let unknown = be(&[9, 1, 1, 7]);
    // Truncated inside the read list.
    let truncated = be(&[9, 1, 1, 0, 1, 8]);
    for (i, m) in [bad_pos, past_end, msgp, unknown, truncated]
        .into_iter()
        .enumerate()
    {
        p.inject(CLIENT, m);
        p.drive();
        assert_eq!(
            last_error_from_server(&p),
            (9, ErrorBody::Chunk),
            "case {i}"
        );
        assert_eq!(p.peers[SERVER].conn.stats().err_chunk_sent, i as u64 + 1);
    }
    assert_eq!(p.ops[1], 0, "no RDMA Read was issued");
    // Too short to carry an XID: nothing to answer, counted.
    p.inject(CLIENT, be(&[9, 1, 1]));
    p.drive();
    let s = &p.peers[SERVER].conn;
    assert_eq!(s.stats().runts_dropped, 1);
    assert_eq!(s.stats().err_chunk_sent, 5);
    assert_eq!(s.resources().serve_slots_busy, 0);
    assert_eq!(s.stats().calls_received, 0);
    assert_eq!(s.close_reason(), None);
}

#[test]
fn rfc5666_s4_2_rdma_error_fails_only_that_call() {
    // A server that can issue no RDMA Read (CONF_RDMA maxrdmaread 0)
    // answers a call with a read chunk with ERR_CHUNK.
    let server = Config {
        max_rdma_read: 0,
        ..cfg()
    };
    let mut p = Pair::new(cfg(), server);
    send(&mut p, 1, &payload(20_000, 3), true, expect(512, None));
    p.drive();
    assert_eq!(failures(&p), vec![(1, CallFailure::PeerChunkError)]);
    assert_eq!(p.peers[CLIENT].conn.resources().buffers_exposed, 0);
    // The connection is still good for the next call.
    let h = send(&mut p, 2, b"small", true, expect(512, None));
    p.drive();
    assert_eq!(returned_payload(&p, h), b"small");
    assert_eq!(p.peers[CLIENT].conn.close_reason(), None);
    close_and_check_leaks(&mut p);
}

// ---------------------------------------------------------------------------
// s3.4 - s3.7: read chunks

/// Runs `calls` through the echo service, recording each call message the
/// server application saw.
pub(super) fn run_recording(p: &mut Pair) -> Vec<Vec<u8>> {
    let seen = Rc::new(RefCell::new(Vec::new()));
    let s2 = seen.clone();
    p.drive_with(&mut move |side, conn, now, ev| {
        if let (SERVER, Event::CallArrived { call, .. }) = (side, ev) {
            s2.borrow_mut()
                .push(conn.call_message(call).unwrap().to_vec());
        }
        echo_service(side, conn, now, ev);
    });
    let v = seen.borrow().clone();
    v
}

#[test]
fn rfc5666_s3_4_read_chunk_moves_ddp_argument_at_its_position() {
    let mut p = pair();
    let data = payload(100_000, 5);
    let (msg, item) = echo_call(42, &data);
    let h = send(&mut p, 42, &data, true, expect(200 * KIB, Some(128 * KIB)));
    let seen = run_recording(&mut p);
    assert_eq!(seen, vec![msg.clone()], "the server sees the call as sent");
    let call_send = p.sends_from(CLIENT).next().unwrap().to_vec();
    let hd = header(&call_send);
    assert_eq!(hd.body, MessageBody::Msg);
    assert_eq!(hd.chunks.reads().len(), 1);
    let r = hd.chunks.reads()[0];
    assert_eq!((r.position, r.segment.length), (item.offset, 100_000));
    assert_eq!(
        call_send.len() - hd.buffer_len(),
        msg.len() - 100_000,
        "data elided inline"
    );
    assert_eq!(p.ops[1], 1, "one RDMA Read");
    assert_eq!(returned_payload(&p, h), data);
    close_and_check_leaks(&mut p);
}

#[test]
fn rfc5666_s3_7_read_chunk_roundup_elided_and_zero_filled() {
    let mut p = pair();
    // First call leaves 0xff in the server's call buffer.
    let h1 = send(&mut p, 1, &[0xff; 8192], true, expect(9000, Some(9000)));
    p.drive();
    assert_eq!(returned_payload(&p, h1), vec![0xff; 8192]);
    release_all(&mut p);
    // 4097 bytes: 3 bytes of XDR roundup, not sent by the client.
    let data = payload(4097, 9);
    let (msg, item) = echo_call(2, &data);
    let h2 = send(&mut p, 2, &data, true, expect(9000, Some(9000)));
    let seen = run_recording(&mut p);
    let call_send = p.sends_from(CLIENT).nth(1).unwrap().to_vec();
    let hd = header(&call_send);
    assert_eq!(
        hd.chunks.reads()[0].segment.length,
        4097,
        "roundup not in the chunk"
    );
    assert_eq!(
        call_send.len() - hd.buffer_len(),
        msg.len() - 4100,
        "data and pad elided"
    );
    assert_eq!(seen, vec![msg.clone()], "pad zero-filled at the server");
    assert_eq!(&msg[item.offset as usize + 4097..][..3], &[0, 0, 0]);
    assert_eq!(returned_payload(&p, h2), data);
    close_and_check_leaks(&mut p);
}

#[test]
fn rfc5666_s3_3_max_rdma_read_bounds_reads_in_flight_fifo() {
    let server = Config {
        max_rdma_read: 2,
        credits: 8,
        ..cfg()
    };
    let client = Config {
        max_outstanding_calls: 8,
        ..cfg()
    };
    let mut p = Pair::new(client, server);
    // Let the first reply raise the grant to 8, then send six at once.
    let h = send(&mut p, 99, b"warm", false, expect(512, None));
    p.drive();
    p.conn(CLIENT).release_reply(h);
    let datas: Vec<_> = (0..6).map(|i| payload(20_000 + i * 4, i as u8)).collect();
    for (i, d) in datas.iter().enumerate() {
        send(
            &mut p,
            i as u32 + 1,
            d,
            true,
            expect(32 * KIB, Some(32 * KIB)),
        );
    }
    let seen = run_recording(&mut p);
    let s = p.peers[SERVER].conn.stats();
    assert_eq!(s.max_reads_in_flight, 2);
    assert_eq!(s.max_active_calls, 6);
    let xids: Vec<u32> = seen
        .iter()
        .map(|m| crate::wire::rpc::peek_xid(m).unwrap())
        .collect();
    assert_eq!(xids, vec![1, 2, 3, 4, 5, 6], "calls complete in FIFO order");
    for (i, m) in seen.iter().enumerate() {
        assert_eq!(echo_payload(m).unwrap(), datas[i]);
    }
    close_and_check_leaks(&mut p);
}

// ---------------------------------------------------------------------------
// s5.1: long calls

#[test]
fn rfc5666_s5_1_long_call_uses_position_zero_read_chunk() {
    let mut p = pair();
    let data = payload(50_000, 11);
    let (msg, _) = echo_call(5, &data);
    // No DDP-eligible item: the whole message moves by RDMA Read.
    let h = send(&mut p, 5, &data, false, expect(64 * KIB, Some(64 * KIB)));
    let seen = run_recording(&mut p);
    assert_eq!(seen, vec![msg.clone()]);
    let call_send = p.sends_from(CLIENT).next().unwrap().to_vec();
    let hd = header(&call_send);
    assert_eq!(hd.body, MessageBody::NoMsg);
    assert_eq!(call_send.len(), hd.buffer_len(), "nothing inline");
    let r = hd.chunks.reads();
    assert_eq!(r.len(), 1);
    assert_eq!(
        (r[0].position, r[0].segment.length as usize),
        (0, msg.len())
    );
    assert_eq!(returned_payload(&p, h), data);
    close_and_check_leaks(&mut p);
}

// ---------------------------------------------------------------------------
// s3.6, s5.2: write chunks and reply chunks

#[test]
fn rfc5666_s3_6_write_chunk_receives_ddp_reply_with_rewritten_length() {
    let mut p = pair();
    let data = payload(150_001, 13);
    let h = send(&mut p, 8, &data, true, expect(200 * KIB, Some(200 * KIB)));
    p.drive();
    let (_, _, len, ddp) = replies(&p)[0];
    assert_eq!(ddp, Some(150_001));
    let full = echo_reply(8, &data).0;
    assert_eq!(
        len as usize,
        full.len() - 150_004,
        "inline part without data and pad"
    );
    assert_eq!(
        p.peers[CLIENT].conn.reply_ddp(h).map(|b| b.to_vec()),
        Some(data.to_vec())
    );
    let reply_send = p.sends_from(SERVER).next().unwrap().to_vec();
    let hd = header(&reply_send);
    assert_eq!(hd.body, MessageBody::Msg);
    let wc: Vec<_> = hd.chunks.write_chunks().collect();
    assert_eq!(wc.len(), 1);
    assert_eq!(
        wc[0].len_bytes(),
        150_001,
        "length rewritten to the bytes written, no roundup"
    );
    assert!(hd.chunks.reply().is_none());
    assert_eq!(p.ops[2], 1, "one RDMA Write");
    close_and_check_leaks(&mut p);
}

/// A reply the service encoded in the slot's own buffer
/// (`send_reply_in_place`) puts the same bytes on the wire as the same
/// reply copied in (`send_reply`): the Send, the data in the write chunk
/// (s3.6) and the message the requester reassembles. With results after
/// the DDP item the tail moves in front of it; without, nothing moves.
/// Answered inline too (no write chunk offered: the item stays in the
/// message).
#[test]
fn rfc5666_s3_6_a_reply_encoded_in_place_is_the_reply_copied_in() {
    let data = payload(20_001, 17);
    for (tail, ddp_max) in [(0, Some(64 * KIB)), (12, Some(64 * KIB)), (12, None)] {
        let mut seen = Vec::new();
        for in_place in [false, true] {
            let mut p = pair();
            let h = send(&mut p, 9, &data, true, expect(64 * KIB, ddp_max));
            p.drive_with(&mut |side, conn, now, ev| {
                let (SERVER, Event::CallArrived { call, xid, .. }) = (side, ev) else {
                    return;
                };
                let (mut msg, item) = echo_reply(xid, &data);
                msg.extend((0..tail).map(|i| 0xA0 + i as u8));
                if in_place {
                    let out = conn.reply_buffer(call).expect("reply buffer");
                    out[..msg.len()].copy_from_slice(&msg);
                    conn.send_reply_in_place(now, call, msg.len(), Some(item))
                        .expect("reply in place");
                } else {
                    let reply = OutgoingReply {
                        message: &msg,
                        ddp: &[item],
                    };
                    conn.send_reply(now, call, &reply).expect("reply");
                }
            });
            let send_bytes = p.sends_from(SERVER).next().unwrap().to_vec();
            let message = reply_of(&p, h).expect("reply");
            assert_eq!(returned_payload(&p, h), data, "tail {tail}, {ddp_max:?}");
            seen.push((send_bytes, message));
            close_and_check_leaks(&mut p);
        }
        assert_eq!(seen[0], seen[1], "tail {tail}, write chunk {ddp_max:?}");
    }
}

/// An accepted reply whose results are the opaques `items`, and the DDP
/// item of each.
fn reply_of_opaques(xid: u32, items: &[&[u8]]) -> (Vec<u8>, Vec<DdpItem>) {
    let mut m = be(&[xid, 1, 0, 0, 0, 0]);
    let mut ddp = Vec::new();
    for data in items {
        m.extend_from_slice(&(data.len() as u32).to_be_bytes());
        ddp.push(DdpItem {
            offset: m.len() as u32,
            len: data.len() as u32,
        });
        m.extend_from_slice(data);
        m.resize(m.len().next_multiple_of(4), 0);
    }
    (m, ddp)
}

#[test]
fn rfc5666_s3_6_nth_ddp_item_goes_into_the_nth_write_chunk_and_an_empty_one_keeps_it_inline() {
    // A hand-crafted requester offering three write chunks (one empty),
    // as an NFSv4 client would for a COMPOUND of three READ-like
    // operations (RFC 8267 s5). Its memory is a buffer our own requester
    // exposed for a write chunk of 2 KiB, cut into the three chunks.
    let mut p = pair();
    send(&mut p, 61, b"w", false, expect(16 * KIB, Some(2 * KIB)));
    p.drive_with(&mut |_, _, _, _| {});
    let offer = header(p.sends_from(CLIENT).next().unwrap());
    let w = offer.chunks.write_chunks().next().unwrap().segments[0];
    assert!(w.length >= 2 * KIB);
    let at = |off: u64, length: u32| Segment {
        offset: w.offset + off,
        length,
        ..w
    };
    let (a, c1, c2) = (at(0, 100), at(512, 200), at(1024, 100));
    let mut h = TransportHeader::new(70, 4, MessageBody::Msg);
    h.chunks.push_write_chunk(&[a]).unwrap();
    h.chunks.push_write_chunk(&[]).unwrap();
    h.chunks.push_write_chunk(&[c1, c2]).unwrap();
    let mut call = vec![0u8; h.buffer_len()];
    h.emit(&mut call).unwrap();
    call.extend_from_slice(&echo_call(70, b"three reads").0);
    p.inject(CLIENT, call);

    let (first, second, third) = (payload(50, 1), payload(21, 2), payload(250, 3));
    let (msg, items) = reply_of_opaques(70, &[&first, &second, &third]);
    let answered = Rc::new(RefCell::new(Vec::new()));
    let log = answered.clone();
    p.drive_with(&mut move |side, conn, now, ev| {
        if let (SERVER, Event::CallArrived { call, xid: 70, .. }) = (side, ev) {
            // Out of order or overlapping items are refused, and the call
            // still waits for its reply.
            let swapped = [items[1], items[0]];
            for bad in [&swapped[..], &[items[0], items[0]][..]] {
                let r = OutgoingReply {
                    message: &msg,
                    ddp: bad,
                };
                log.borrow_mut().push(conn.send_reply(now, call, &r));
            }
            let r = OutgoingReply {
                message: &msg,
                ddp: &items,
            };
            log.borrow_mut().push(conn.send_reply(now, call, &r));
        }
    });
    assert_eq!(
        *answered.borrow(),
        [
            Err(ReplyError::BadDdpItem),
            Err(ReplyError::BadDdpItem),
            Ok(())
        ]
    );

    // The reply returns all three chunks, lengths = bytes written.
    let reply = p.sends_from(SERVER).last().unwrap().to_vec();
    let hd = header(&reply);
    assert_eq!(hd.body, MessageBody::Msg);
    let lens: Vec<Vec<u32>> = hd
        .chunks
        .write_chunks()
        .map(|c| c.segments.iter().map(|s| s.length).collect())
        .collect();
    assert_eq!(lens, [vec![50], vec![], vec![200, 50]]);
    // The first and third items were written where their chunks point.
    let client = p.peers[CLIENT].conn.buffers();
    let read = |seg: Segment| {
        let s = client.resolve(&seg, crate::engine::buffers::Access::RemoteWrite);
        client
            .to_vec(s.expect("inside the exposed buffer"))
            .unwrap()
    };
    assert_eq!(read(at(0, 50)), first);
    let mut got = read(at(512, 200));
    got.extend(read(at(1024, 50)));
    assert_eq!(got, third);
    // The inline part keeps every length word, and the second item (its
    // chunk empty) with its data and padding in place.
    let mut inline = be(&[70, 1, 0, 0, 0, 0, 50, 21]);
    inline.extend_from_slice(&second);
    inline.extend_from_slice(&[0, 0, 0]);
    inline.extend_from_slice(&be(&[250]));
    assert_eq!(reply[hd.buffer_len()..], inline[..]);
    assert_eq!(p.ops[2], 3, "three RDMA Writes");
}

#[test]
fn rfc5666_s5_2_reply_chunk_carries_long_reply() {
    let mut p = pair();
    let data = payload(60_000, 17);
    let h = send(&mut p, 3, &data, true, expect(64 * KIB, None));
    // The service returns the payload in place (no write chunk offered).
    p.drive();
    let full = echo_reply(3, &data).0;
    let (_, _, len, ddp) = replies(&p)[0];
    assert_eq!((len as usize, ddp), (full.len(), None));
    assert_eq!(reply_of(&p, h), Some(full.to_vec()));
    let reply_send = p.sends_from(SERVER).next().unwrap().to_vec();
    let hd = header(&reply_send);
    assert_eq!(hd.body, MessageBody::NoMsg);
    assert_eq!(reply_send.len(), hd.buffer_len());
    assert_eq!(hd.chunks.reply().unwrap().len_bytes() as usize, full.len());
    close_and_check_leaks(&mut p);
}

#[test]
fn design_s5_a_received_message_is_read_from_peer_memory_once_then_parsed_from_a_copy() {
    // Receive buffers are memory the peer can write at any moment. The
    // engine reads each received message out of its buffer exactly once
    // and parses only that copy, so a header the peer rewrites after it
    // arrived cannot change what was parsed. Every path: inline both
    // ways, read chunk plus write chunk, reply chunk, a long call.
    let mut p = pair();
    let small = payload(100, 1);
    let h1 = send(&mut p, 1, &small, false, expect(4 * KIB, None));
    let bulk = payload(100_000, 2);
    let h2 = send(&mut p, 2, &bulk, true, expect(200 * KIB, Some(128 * KIB)));
    let long = payload(60_000, 3);
    let h3 = send(&mut p, 3, &long, true, expect(64 * KIB, None));
    let h4 = send(&mut p, 4, &long, false, expect(64 * KIB, None));
    p.drive();
    assert_eq!(returned_payload(&p, h1), small);
    assert_eq!(returned_payload(&p, h2), bulk);
    assert_eq!(returned_payload(&p, h3), long);
    assert_eq!(returned_payload(&p, h4), long);
    for (side, from) in [(CLIENT, SERVER), (SERVER, CLIENT)] {
        let received = p.sends_from(from).count() as u64;
        assert!(received >= 4, "{received} messages to side {side}");
        assert_eq!(
            p.peers[side].conn.buffers().receive_reads(),
            received,
            "side {side}: one read of the receive buffer per message"
        );
    }
    // Rewriting every receive buffer afterwards changes no reply the
    // application sees.
    let recvs: Vec<BufId> = (0..p.peers[CLIENT].conn.buffers().count() as u32)
        .map(BufId)
        .filter(|&b| p.peers[CLIENT].conn.buffers().class(b) == Some(BufClass::Recv))
        .collect();
    for b in recvs {
        let t = p.peers[CLIENT].conn.buffers_mut();
        let len = t.buf_len(b) as usize;
        assert!(t.write(b, 0, &vec![0xee; len]));
    }
    assert_eq!(returned_payload(&p, h1), small);
    assert_eq!(returned_payload(&p, h3), long);
    close_and_check_leaks(&mut p);
}

/// Each side's (binds, invalidations) must balance and no key stay live.
fn assert_keys_all_invalidated(p: &Pair) {
    for side in [CLIENT, SERVER] {
        let (binds, invalidations) = p.key_ops[side];
        assert_eq!(
            binds, invalidations,
            "side {side}: every bound key invalidated"
        );
    }
    assert_keys_all_invalidated_or_remote(p);
}

#[test]
fn design_s5_each_exposure_has_its_own_key_bound_before_it_is_advertised() {
    // With key windows: a fresh key per exposure, over exactly the
    // advertised bytes, bound before the Send that names it (the harness
    // resolves only live keys) and invalidated when the exchange ends.
    let mut p = Pair::with_key_windows(cfg(), cfg());
    let bulk = payload(100_000, 2);
    let long = payload(60_000, 3);
    let mut handles = Vec::new();
    for round in 0..3u32 {
        let h1 = send(
            &mut p,
            10 * round + 1,
            &bulk,
            true,
            expect(200 * KIB, Some(128 * KIB)),
        );
        let h2 = send(&mut p, 10 * round + 2, &long, true, expect(64 * KIB, None));
        let h3 = send(&mut p, 10 * round + 3, &long, false, expect(64 * KIB, None));
        p.drive();
        assert_eq!(returned_payload(&p, h1), bulk);
        assert_eq!(returned_payload(&p, h2), long);
        assert_eq!(returned_payload(&p, h3), long);
        release_all(&mut p);
        assert_keys_all_invalidated(&p);
    }
    // Per round: read chunk + write chunk + reply chunk (the reply may
    // exceed the inline size), read + reply chunk, long call + reply
    // chunk.
    assert_eq!(p.key_ops[CLIENT].0, 3 * 7);
    for call in p.sends_from(CLIENT) {
        let hd = header(call);
        handles.extend(hd.chunks.reads().iter().map(|r| r.segment.handle));
        handles.extend(
            hd.chunks
                .write_chunks()
                .flat_map(|c| c.segments.iter().map(|s| s.handle)),
        );
        handles.extend(
            hd.chunks
                .reply()
                .into_iter()
                .flat_map(|c| c.segments.iter().map(|s| s.handle)),
        );
    }
    assert_eq!(handles.len(), 21, "one advertised segment per bind");
    let mut unique = handles.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(
        unique.len(),
        handles.len(),
        "no key advertised twice: {handles:x?}"
    );
    close_and_check_leaks(&mut p);
}

#[test]
fn rfc8797_remote_invalidation_ends_a_single_key_exchange_and_only_then() {
    // The client's private data offered remote invalidation. A call whose
    // only chunk is its write chunk: the reply is a Send With Invalidate
    // of that key, and the client invalidates nothing itself. A call with
    // a read chunk and a write chunk (two keys): a plain Send, and the
    // client invalidates both.
    let server = Config {
        peer_remote_invalidate: true,
        ..cfg()
    };
    let mut p = Pair::with_key_windows(cfg(), server);
    let small = payload(3000, 4);
    let h = send(&mut p, 1, &small, false, expect(4 * KIB, Some(8 * KIB)));
    p.drive();
    assert_eq!(returned_payload(&p, h), small);
    release_all(&mut p);
    let call = header(p.sends_from(CLIENT).next().unwrap());
    let key = call.chunks.write_chunks().next().unwrap().segments[0].handle;
    assert_eq!(p.invalidations, vec![(SERVER, key)]);
    assert_eq!(
        p.key_ops[CLIENT],
        (1, 0),
        "bound once, invalidated by the peer"
    );
    assert_keys_all_invalidated_or_remote(&p);

    let bulk = payload(9000, 5);
    let h = send(&mut p, 2, &bulk, true, expect(4 * KIB, Some(16 * KIB)));
    p.drive();
    assert_eq!(returned_payload(&p, h), bulk);
    release_all(&mut p);
    assert_eq!(p.invalidations.len(), 1, "two keys: no remote invalidation");
    assert_eq!(p.key_ops[CLIENT], (3, 2));
    assert_keys_all_invalidated_or_remote(&p);
    close_and_check_leaks(&mut p);
}

/// No key left live on either side (whoever invalidated it).
fn assert_keys_all_invalidated_or_remote(p: &Pair) {
    for side in [CLIENT, SERVER] {
        assert_eq!(
            p.live_keys[side].as_ref().map(|k| k.len()),
            Some(0),
            "side {side}: no key left live"
        );
    }
}

#[test]
fn design_s5_a_late_write_after_a_timeout_fails_at_the_provider_and_changes_no_byte() {
    // The call offers a write chunk, the server pulls the argument, then
    // holds its reply past the client's timeout. The timeout invalidates
    // every key of the call, so the server's late RDMA Write is refused
    // (remote access error) and no byte of the client's memory changes.
    let client = Config {
        call_timeout: Some(core::time::Duration::from_millis(5)),
        ..cfg()
    };
    let mut p = Pair::with_key_windows(client, cfg());
    let data = payload(20_000, 7);
    send(&mut p, 9, &data, true, expect(4 * KIB, Some(64 * KIB)));
    let mut held = None;
    p.drive_with(&mut |side, _, _, ev| {
        if let (SERVER, Event::CallArrived { call, .. }) = (side, ev) {
            held = Some(call);
        }
    });
    let call = held.expect("the server got the call");
    assert_eq!(failures(&p), vec![(9, CallFailure::Timeout)]);
    assert_eq!(
        p.live_keys[CLIENT].as_ref().map(|k| k.len()),
        Some(0),
        "the timeout invalidated the call's keys"
    );
    let client_memory = |p: &Pair| -> Vec<Vec<u8>> {
        let t = p.peers[CLIENT].conn.buffers();
        (0..t.count() as u32)
            .map(BufId)
            .filter(|&b| matches!(t.class(b), Some(BufClass::Ddp | BufClass::Reply)))
            .map(|b| t.peer_bytes(b, 0, t.buf_len(b) as usize).unwrap().to_vec())
            .collect()
    };
    let before = client_memory(&p);
    let now = p.now;
    reply_echo(p.conn(SERVER), now, call, 9, &data);
    p.drive();
    assert_eq!(
        p.peers[SERVER].conn.close_reason(),
        Some(CloseReason::TransportError(WcStatus::RemoteAccessError)),
        "the late Write was refused"
    );
    assert!(client_memory(&p) == before, "no byte of the client changed");
    close_and_check_leaks(&mut p);
}

#[test]
fn rfc5666_s5_2_reply_chunk_offered_when_peer_sends_less_than_we_receive() {
    // RFC 8797: the client receives 16 KiB but the server posts at most
    // 1 KiB Sends (its private data said so): an 8 KiB reply needs a reply
    // chunk although it would fit the client's receive buffers.
    let pd = crate::wire::rpcrdma::PrivateData {
        remote_invalidate: false,
        max_send_size: KIB,
        max_recv_size: 4 * KIB,
    };
    let client = Config {
        inline_recv_size: 16 * KIB,
        ..cfg()
    }
    .with_peer_private_data(&pd);
    let server = Config {
        inline_send_size: KIB,
        peer_inline_recv_size: 16 * KIB,
        ..cfg()
    };
    let mut p = Pair::new(client, server);
    let data = payload(8 * 1024, 4);
    let h = send(&mut p, 6, &data, false, expect(9 * KIB, None));
    p.drive();
    let call_send = p.sends_from(CLIENT).next().unwrap().to_vec();
    assert!(header(&call_send).chunks.reply().is_some());
    let reply_send = p.sends_from(SERVER).next().unwrap().to_vec();
    assert_eq!(header(&reply_send).body, MessageBody::NoMsg);
    assert_eq!(returned_payload(&p, h), data);
    close_and_check_leaks(&mut p);
}

#[test]
fn rfc5666_s5_2_reply_never_written_past_reply_chunk_end() {
    let mut p = pair();
    send(&mut p, 4, b"q", false, expect(8 * KIB, None));
    let outcome = Rc::new(RefCell::new(Vec::new()));
    let o2 = outcome.clone();
    p.drive_with(&mut move |side, conn, now, ev| {
        if let (SERVER, Event::CallArrived { call, xid, .. }) = (side, ev) {
            let big = echo_reply(xid, &payload(20_000, 1)).0;
            o2.borrow_mut().push(conn.send_reply(
                now,
                call,
                &OutgoingReply {
                    message: &big,
                    ddp: &[],
                },
            ));
            let small = echo_reply(xid, b"fits").0;
            o2.borrow_mut().push(conn.send_reply(
                now,
                call,
                &OutgoingReply {
                    message: &small,
                    ddp: &[],
                },
            ));
        }
    });
    assert_eq!(*outcome.borrow(), vec![Err(ReplyError::TooLarge), Ok(())]);
    assert_eq!(p.ops[2], 0, "nothing written");
    let h = replies(&p)[0].1;
    assert_eq!(returned_payload(&p, h), b"fits");
    close_and_check_leaks(&mut p);
}

// ---------------------------------------------------------------------------
// Faults: completions, loss, corruption, reordering

/// A provider that reports one of a reply's Writes twice: the second
/// report is a duplicate (the Write's op number completed already), so
/// the slot is not freed while the reply's Send is still posted and its
/// buffer still the Send's source.
#[test]
fn engine_a_repeated_write_completion_does_not_free_the_slot_under_its_send() {
    let mut p = pair();
    p.set_fault_hook(|f| match f {
        FaultPoint::Completion {
            side: SERVER,
            wr_id,
        } if wr_id.kind == WrKind::ChunkWrite => Fault::Duplicate,
        FaultPoint::Completion {
            side: SERVER,
            wr_id,
        } if wr_id.kind == WrKind::ReplySend => Fault::Delay(core::time::Duration::from_millis(5)),
        _ => Fault::Deliver,
    });
    send(
        &mut p,
        1,
        &payload(9000, 1),
        true,
        expect(512, Some(16 * KIB)),
    );
    let start = p.now;
    p.drive_until(start.saturating_add(core::time::Duration::from_millis(2)));
    assert_eq!(replies(&p).len(), 1, "the reply arrived");
    assert_eq!(
        p.peers[SERVER].conn.resources().serve_slots_busy,
        1,
        "the Send is still posted: the slot waits for it"
    );
    assert_eq!(p.peers[SERVER].conn.stats().stale_completions, 1);
    p.drive();
    assert_eq!(p.peers[SERVER].conn.resources().serve_slots_busy, 0);
    close_and_check_leaks(&mut p);
}

#[test]
fn engine_duplicate_completions_are_counted_and_ignored() {
    let mut p = pair();
    // Every completion twice, receives included (on both sides).
    p.set_fault_hook(|f| match f {
        FaultPoint::Completion { side, wr_id } if side <= SERVER && wr_id.index < u32::MAX => {
            Fault::Duplicate
        }
        _ => Fault::Deliver,
    });
    let hs: Vec<_> = (0..4)
        .map(|i| {
            send(
                &mut p,
                i,
                &payload(9000, i as u8),
                true,
                expect(16 * KIB, Some(16 * KIB)),
            )
        })
        .collect();
    p.drive();
    assert_eq!(replies(&p).len(), 4);
    for (i, h) in hs.iter().enumerate() {
        assert_eq!(returned_payload(&p, *h), payload(9000, i as u8));
    }
    assert!(p.peers[CLIENT].conn.stats().stale_completions > 0);
    assert!(p.peers[SERVER].conn.stats().stale_completions > 0);
    close_and_check_leaks(&mut p);
}

#[test]
fn rfc5666_s3_3_lost_reply_times_out_and_keeps_its_credit() {
    let client = Config {
        call_timeout: Some(core::time::Duration::from_millis(5)),
        ..cfg()
    };
    let mut p = Pair::new(client, cfg());
    p.set_fault_hook(|f| match f {
        FaultPoint::Send { from: SERVER, .. } => Fault::Drop,
        _ => Fault::Deliver,
    });
    send(&mut p, 77, b"lost", false, expect(512, None));
    p.drive();
    assert_eq!(failures(&p), vec![(77, CallFailure::Timeout)]);
    assert!(p.now >= Instant(5_000_000));
    let c = &p.peers[CLIENT].conn;
    assert_eq!(
        c.outstanding_calls(),
        1,
        "the peer may still answer: credit held"
    );
    assert_eq!(c.resources().call_slots_busy, 1);
    close_and_check_leaks(&mut p);
}

#[test]
fn engine_peer_close_fails_outstanding_calls_and_drains() {
    let mut p = pair();
    send(&mut p, 1, b"a", false, expect(512, None));
    send(&mut p, 2, &payload(30_000, 2), true, expect(512, None));
    // The server closes as soon as the first call arrives.
    p.drive_with(&mut |side, conn, _, ev| {
        if side == SERVER && matches!(ev, Event::CallArrived { .. }) {
            conn.close();
        }
    });
    let f = failures(&p);
    assert_eq!(f.len(), 2);
    assert!(f.iter().all(|(_, r)| *r == CallFailure::ConnectionLost));
    assert!(matches!(
        p.peers[CLIENT].conn.close_reason(),
        Some(CloseReason::TransportError(WcStatus::Flushed))
    ));
    assert_eq!(
        p.peers[CLIENT].conn.send_call(
            p.now,
            &OutgoingCall {
                message: &echo_call(3, b"").0,
                ddp: None,
                reply: expect(64, None),
                app: AppChunks::NONE,
            }
        ),
        Err(SendCallError::Closed)
    );
    for side in [CLIENT, SERVER] {
        assert!(
            p.peers[side].conn.resources().is_idle(),
            "{side}: {:?}",
            p.peers[side].conn.resources()
        );
    }
}

/// A tiny deterministic generator for fault schedules.
fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

#[test]
fn engine_corrupted_delayed_duplicated_traffic_never_panics_or_leaks() {
    let (mut replied, mut errors_sent, mut failed) = (0, 0, 0);
    for seed in 1..=60u64 {
        // Odd seeds also run responder-provided read chunks and RDMA_DONE.
        let rrc_on = seed % 2 == 1;
        let mut p = Pair::new(
            Config {
                call_timeout: Some(core::time::Duration::from_millis(2)),
                reply_read_chunks: rrc_on,
                ..cfg()
            },
            Config {
                reply_read_chunks: rrc_on,
                ..cfg()
            },
        );
        let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        p.set_fault_hook(move |f| {
            let r = xorshift(&mut rng);
            match (f, r % 8) {
                // Mostly in the transport header, where the rules live.
                (FaultPoint::Send { bytes, .. }, 0) => Fault::Corrupt {
                    offset: (r >> 8) as usize % bytes.len().clamp(1, 64),
                    xor: (r >> 40) as u8 | 1,
                },
                (FaultPoint::Send { .. }, 1) => {
                    Fault::Delay(core::time::Duration::from_micros(r >> 54))
                }
                (FaultPoint::Send { .. }, 2) => Fault::Duplicate,
                (FaultPoint::Completion { .. }, 3) => {
                    Fault::Delay(core::time::Duration::from_micros(r >> 56))
                }
                _ => Fault::Deliver,
            }
        });
        for i in 0..8u32 {
            let len = [10usize, 3000, 9000, 40_000][(i % 4) as usize];
            let (msg, item) = echo_call(i, &payload(len, i as u8));
            let _ = p.peers[CLIENT].conn.send_call(
                p.now,
                &OutgoingCall {
                    message: &msg,
                    ddp: (i % 2 == 0).then_some(item),
                    // With read chunks on, some calls offer no reply chunk.
                    reply: expect(
                        if rrc_on && i % 4 == 1 { 512 } else { 64 * KIB },
                        (i % 3 == 0).then_some(64 * KIB),
                    ),
                    app: AppChunks::NONE,
                },
            );
        }
        p.drive_with(&mut |side, conn, now, ev| match ev {
            Event::ReplyArrived { call, .. } => {
                conn.release_reply(call);
            }
            Event::CallArrived { call, xid, .. } if side == SERVER => {
                let body = conn
                    .call_message(call)
                    .and_then(echo_payload)
                    .unwrap_or_default();
                let (msg, item) = echo_reply(xid, &body);
                let _ = conn.send_reply(
                    now,
                    call,
                    &OutgoingReply {
                        message: &msg,
                        ddp: &[item],
                    },
                );
            }
            _ => {}
        });
        replied += replies(&p).len();
        failed += failures(&p).len();
        let s = p.peers[SERVER].conn.stats();
        errors_sent += s.err_chunk_sent + s.err_vers_sent;
        p.conn(CLIENT).close();
        p.conn(SERVER).close();
        p.drive();
        for side in [CLIENT, SERVER] {
            let r = p.peers[side].conn.resources();
            assert!(r.is_idle(), "seed {seed} side {side}: {r:?}");
        }
    }
    // The schedule exercised all three outcomes.
    assert!(
        replied > 100 && errors_sent > 0 && failed > 0,
        "{replied} {errors_sent} {failed}"
    );
}

// ---------------------------------------------------------------------------
// Property: any mix of sizes and thresholds delivers exactly what was sent.

pub(super) mod prop {
    use super::*;
    use proptest::prelude::*;
    use proptest::test_runner::TestCaseError;

    #[derive(Debug, Clone)]
    pub(in crate::engine) struct Rpc {
        len: usize,
        ddp_arg: bool,
        write_chunk: bool,
        /// Offer no reply chunk (only with responder-provided read chunks).
        tight_reply: bool,
    }

    /// RPCs whose call length is drawn from `sizes`.
    pub(in crate::engine) fn rpc_sized(
        sizes: impl Strategy<Value = usize>,
    ) -> impl Strategy<Value = Rpc> {
        (sizes, any::<bool>(), any::<bool>(), any::<bool>()).prop_map(
            |(len, ddp_arg, write_chunk, tight_reply)| Rpc {
                len,
                ddp_arg,
                write_chunk,
                tight_reply,
            },
        )
    }

    /// The body both size ranges share: a client and a server on `base`
    /// with inline sizes `ci`/`si` KiB-multiples and the server granting
    /// `credits`, every RPC of `rpcs` echoed; checks that the bytes
    /// delivered equal the bytes sent, no receiver-not-ready, calls within
    /// the grant, Reads within `max_rdma_read`, receives within credits +
    /// own calls + the DONE allowance, every exposed reply DONE'd. Returns
    /// the pair, not yet closed, for test-specific checks.
    pub(in crate::engine) fn echo_and_check(
        base: Config,
        (ci, si): (u32, u32),
        credits: u32,
        rpcs: &[Rpc],
    ) -> Result<Pair, TestCaseError> {
        let (max_rdma_read, reply_read_chunks) = (base.max_rdma_read, base.reply_read_chunks);
        let client = Config {
            inline_recv_size: ci,
            inline_send_size: ci,
            peer_inline_recv_size: si,
            peer_inline_send_size: si,
            ..base
        };
        let server = Config {
            inline_recv_size: si,
            inline_send_size: si,
            peer_inline_recv_size: ci,
            peer_inline_send_size: ci,
            credits,
            ..base
        };
        let mut p = Pair::new(client, server);
        let mut sent = Vec::new();
        for (i, r) in rpcs.iter().enumerate() {
            let data = payload(r.len, i as u8);
            let reply_len = r.len as u32 + 64;
            let max_len = if reply_read_chunks && r.tight_reply {
                512
            } else {
                reply_len
            };
            let reply = expect(max_len, r.write_chunk.then_some(reply_len));
            let h = send(&mut p, i as u32, &data, r.ddp_arg, reply);
            sent.push((h, data));
        }
        let seen = run_recording(&mut p);
        prop_assert_eq!(p.rnr, 0);
        prop_assert_eq!(seen.len(), rpcs.len());
        for (i, m) in seen.iter().enumerate() {
            let xid = crate::wire::rpc::peek_xid(m).unwrap() as usize;
            prop_assert!(*m == echo_call(xid as u32, &sent[xid].1).0, "call {}", i);
        }
        prop_assert!(failures(&p).is_empty(), "{:?}", failures(&p));
        for (h, data) in &sent {
            prop_assert!(returned_payload(&p, *h) == *data);
        }
        let s = p.peers[SERVER].conn.stats();
        prop_assert!(s.max_active_calls <= credits);
        prop_assert!(s.max_reads_in_flight <= max_rdma_read);
        let reserved_for_done = if reply_read_chunks {
            cfg().max_reply_read_chunks
        } else {
            0
        };
        prop_assert!(
            p.peers[SERVER].max_recvs_posted
                <= (credits + cfg().max_outstanding_calls + reserved_for_done) as usize
        );
        prop_assert_eq!(s.replies_exposed, s.done_received);
        Ok(p)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        #[test]
        fn rfc5666_s3_s5_bytes_delivered_equal_bytes_sent(
            client_inline in 1u32..=16,
            server_inline in 1u32..=16,
            credits in 1u32..=4,
            max_rdma_read in 1u32..=4,
            reply_read_chunks in any::<bool>(),
            rpcs in proptest::collection::vec(
                rpc_sized(prop_oneof![0usize..2048, 2048usize..20_000, 20_000usize..300_000]),
                1..=4,
            ),
        ) {
            let base = Config { reply_read_chunks, max_rdma_read, ..cfg() };
            let inline = (client_inline * KIB, server_inline * KIB);
            let mut p = echo_and_check(base, inline, credits, &rpcs)?;
            prop_assert!(p.peers[CLIENT].conn.stats().max_reads_in_flight <= max_rdma_read);
            prop_assert_eq!(p.peers[SERVER].conn.stats().done_timeouts, 0);
            close_and_check_leaks(&mut p);
        }
    }
}

// ---------------------------------------------------------------------------
// s6: CONF_RDMA

fn conf_call(p: &mut Pair, msg: &[u8]) -> CallHandle {
    let now = p.now;
    p.conn(CLIENT)
        .send_call(
            now,
            &OutgoingCall {
                message: msg,
                ddp: None,
                reply: expect(512, None),
                app: AppChunks::NONE,
            },
        )
        .expect("conf call")
}

#[test]
fn rfc5666_s6_2_conf_rdma_answered_in_band_and_applied_both_ways() {
    let client = Config {
        inline_send_size: 2 * KIB,
        inline_recv_size: 8 * KIB,
        inbound_rdma_read: 3,
        peer_inline_recv_size: KIB,
        peer_inline_send_size: KIB,
        max_rdma_read: 16,
        ..cfg()
    };
    let server = Config {
        inline_recv_size: 16 * KIB,
        inline_send_size: 16 * KIB,
        peer_inline_recv_size: KIB,
        peer_inline_send_size: KIB,
        inbound_rdma_read: 7,
        ..cfg()
    };
    let mut p = Pair::new(client, server);
    let req = p.peers[CLIENT].conn.conf_rdma_request();
    assert_eq!(
        req,
        crate::wire::conf::ConfigRdmaReq {
            maxcall_sendsize: 2 * KIB,
            maxreply_sendsize: 8 * KIB,
            maxrdmaread: 3
        }
    );
    let mut buf = [0u8; 64];
    let n = encode_conf_rdma_call(&mut buf, 0x600d, &req).unwrap();
    let h = conf_call(&mut p, &buf[..n]);
    p.drive();
    // The server application never saw it; the engine answered.
    assert!(!p.peers[SERVER]
        .events
        .iter()
        .any(|e| matches!(e, Event::CallArrived { .. })));
    assert_eq!(p.peers[SERVER].conn.stats().conf_rdma_answered, 1);
    let reply = decode_conf_rdma_reply(&reply_of(&p, h).unwrap()).unwrap();
    assert_eq!(
        reply,
        crate::wire::conf::ConfigRdmaReply {
            maxcall_sendsize: 16 * KIB,
            align: 4,
            maxrdmaread: 7
        }
    );
    // Server side: the client's sizes and IRD now bound what it sends.
    let sc = *p.peers[SERVER].conn.config();
    assert_eq!(
        (
            sc.peer_inline_recv_size,
            sc.peer_inline_send_size,
            sc.max_rdma_read
        ),
        (8 * KIB, 2 * KIB, 3)
    );
    // Client side, after applying: 16 KiB calls go inline.
    p.conn(CLIENT).apply_conf_rdma_reply(&reply);
    let cc = *p.peers[CLIENT].conn.config();
    assert_eq!((cc.peer_inline_recv_size, cc.max_rdma_read), (16 * KIB, 7));
    release_all(&mut p);
    // The client's own Send size (2 KiB) still bounds its inline calls.
    let h2 = send(&mut p, 2, &payload(1900, 2), true, expect(4 * KIB, None));
    p.drive();
    assert!(header(p.sends_from(CLIENT).last().unwrap())
        .chunks
        .reads()
        .is_empty());
    assert_eq!(returned_payload(&p, h2), payload(1900, 2));
    close_and_check_leaks(&mut p);
}

#[test]
fn rfc5666_s6_1_conf_rdma_accepted_only_as_the_first_call() {
    // After another call, CONF_RDMA (v1 or v2) changes nothing and is
    // answered PROC_UNAVAIL: limits, Reads and extensions stay as they
    // were while calls and replies use them.
    let mut p = Pair::new(cfg(), rrc(cfg()));
    let h = send(&mut p, 1, b"first", false, expect(512, None));
    p.drive();
    assert_eq!(returned_payload(&p, h), b"first");
    release_all(&mut p);
    let before = *p.peers[SERVER].conn.config();
    let req = crate::wire::conf::ConfigRdmaReq {
        maxcall_sendsize: KIB,
        maxreply_sendsize: KIB,
        maxrdmaread: 0,
    };
    let mut buf = [0u8; 64];
    let n = encode_conf_rdma_call(&mut buf, 0x600d, &req).unwrap();
    let h = conf_call(&mut p, &buf[..n]);
    p.drive();
    let msg = reply_of(&p, h).unwrap();
    assert_eq!(
        decode_conf_rdma_reply(&msg),
        Err(ConfRdmaError::NotSuccessful(AcceptStatus::ProcUnavail))
    );
    p.conn(CLIENT).release_reply(h);
    assert_eq!(
        conf_v2_exchange(&mut p),
        Err(ConfRdmaError::NotSuccessful(AcceptStatus::ProcUnavail))
    );
    let after = *p.peers[SERVER].conn.config();
    assert_eq!(
        (
            after.peer_inline_recv_size,
            after.peer_inline_send_size,
            after.max_rdma_read
        ),
        (
            before.peer_inline_recv_size,
            before.peer_inline_send_size,
            before.max_rdma_read
        )
    );
    assert_eq!(
        p.peers[SERVER].conn.negotiated(),
        Extensions::RESPONDER_READ_CHUNKS
    );
    let s = p.peers[SERVER].conn.stats();
    assert_eq!((s.conf_rdma_refused, s.conf_rdma_answered), (2, 2));
    close_and_check_leaks(&mut p);
}

#[test]
fn rfc5666_s6_2_conf_rdma_maxrdmaread_zero_is_clamped_to_one() {
    let mut p = pair();
    let req = crate::wire::conf::ConfigRdmaReq {
        maxcall_sendsize: 4 * KIB,
        maxreply_sendsize: 4 * KIB,
        maxrdmaread: 0,
    };
    let mut buf = [0u8; 64];
    let n = encode_conf_rdma_call(&mut buf, 0x600d, &req).unwrap();
    let h = conf_call(&mut p, &buf[..n]);
    p.drive();
    let reply = decode_conf_rdma_reply(&reply_of(&p, h).unwrap()).unwrap();
    assert_eq!(p.peers[SERVER].conn.config().max_rdma_read, 1);
    // The client side clamps a server's 0 the same way.
    p.conn(CLIENT)
        .apply_conf_rdma_reply(&crate::wire::conf::ConfigRdmaReply {
            maxrdmaread: 0,
            ..reply
        });
    assert_eq!(p.peers[CLIENT].conn.config().max_rdma_read, 1);
    release_all(&mut p);
    // Long calls are still pulled, one Read at a time.
    let data = payload(20_000, 9);
    let h = send(&mut p, 2, &data, false, expect(32 * KIB, None));
    p.drive();
    assert_eq!(returned_payload(&p, h), data);
    close_and_check_leaks(&mut p);
}

#[test]
fn rfc5666_s6_2_conf_rdma_null_mismatch_unavail_and_garbage() {
    use crate::wire::conf::{CONFIG_RDMA_PROG, CONF_RDMA_PROC};
    use crate::wire::rpc::{AcceptStatus, CallHeader, OpaqueAuth};
    let mut p = pair();
    let call = |xid, vers, proc_, args: &[u8]| {
        let h = CallHeader::new(
            xid,
            CONFIG_RDMA_PROG,
            vers,
            proc_,
            OpaqueAuth::None,
            OpaqueAuth::None,
        );
        let mut v = vec![0u8; h.buffer_len()];
        h.emit(&mut crate::wire::xdr::Encoder::new(&mut v)).unwrap();
        v.extend_from_slice(args);
        v
    };
    // Garbage arguments first: CONF_RDMA is only applied as the first
    // call (s6.1).
    let cases = [
        (
            call(4, 1, CONF_RDMA_PROC, &[0; 8]),
            Some(AcceptStatus::GarbageArgs),
        ),
        (call(1, 1, 0, &[]), None),
        (
            call(2, 3, CONF_RDMA_PROC, &[0; 12]),
            Some(AcceptStatus::ProgMismatch { low: 1, high: 2 }),
        ),
        (call(3, 1, 9, &[]), Some(AcceptStatus::ProcUnavail)),
    ];
    let hs: Vec<_> = cases.iter().map(|(m, _)| conf_call(&mut p, m)).collect();
    p.drive();
    for ((_, want), h) in cases.iter().zip(hs) {
        let msg = reply_of(&p, h).unwrap();
        match want {
            None => {
                // NULL: success with no results.
                let (rh, hl) = crate::wire::rpc::ReplyHeader::parse(&msg).unwrap();
                assert!(rh.is_success());
                assert_eq!(hl, msg.len());
            }
            Some(st) => assert_eq!(
                decode_conf_rdma_reply(&msg),
                Err(ConfRdmaError::NotSuccessful(*st))
            ),
        }
    }
    // The configuration was not touched by the failed calls.
    assert_eq!(p.peers[SERVER].conn.config().peer_inline_recv_size, 4 * KIB);
    close_and_check_leaks(&mut p);
}

#[test]
fn rfc5666_s6_conf_rdma_delivered_when_not_served_by_the_engine() {
    let server = Config {
        serve_conf_rdma: false,
        ..cfg()
    };
    let mut p = Pair::new(cfg(), server);
    let req = p.peers[CLIENT].conn.conf_rdma_request();
    let mut buf = [0u8; 64];
    let n = encode_conf_rdma_call(&mut buf, 5, &req).unwrap();
    conf_call(&mut p, &buf[..n]);
    p.drive_with(&mut |_, _, _, _| {});
    assert!(p.peers[SERVER].events.iter().any(|e| matches!(
        e,
        Event::CallArrived {
            program: crate::wire::conf::CONFIG_RDMA_PROG,
            ..
        }
    )));
}

#[test]
fn rfc5666_s3_3_replies_overtaking_each_other_match_by_xid() {
    // RFC 5666 s3.3: calls complete in any order. Hold the first reply
    // back so the later ones overtake it (after a first exchange has
    // raised the grant from 1 to 4).
    let mut p = pair();
    send(&mut p, 1, b"warm", false, expect(KIB, None));
    p.drive();
    release_all(&mut p);
    p.peers[CLIENT].events.clear();
    let mut first = true;
    p.set_fault_hook(move |f| match f {
        FaultPoint::Send { from: SERVER, .. } if first => {
            first = false;
            Fault::Delay(core::time::Duration::from_millis(1))
        }
        _ => Fault::Deliver,
    });
    let hs: Vec<_> = (0..4)
        .map(|i| {
            send(
                &mut p,
                50 + i,
                &payload(100 + i as usize, i as u8),
                true,
                expect(KIB, None),
            )
        })
        .collect();
    p.drive();
    let order: Vec<u32> = replies(&p).iter().map(|r| r.0).collect();
    assert_eq!(
        order.last(),
        Some(&50),
        "the delayed reply came last: {order:?}"
    );
    for (i, h) in hs.iter().enumerate() {
        assert_eq!(returned_payload(&p, *h), payload(100 + i, i as u8));
    }
    close_and_check_leaks(&mut p);
}

#[test]
fn design_s8_read_chunk_exposed_only_for_the_exchange_and_only_its_window() {
    let mut p = pair();
    let data = payload(30_000, 21);
    let (msg, item) = echo_call(11, &data);
    send(&mut p, 11, &data, true, expect(KIB, Some(32 * KIB)));
    // The server application holds the call: the exchange is open.
    p.drive_with(&mut |_, _, _, _| {});
    let seg = header(p.sends_from(CLIENT).next().unwrap()).chunks.reads()[0].segment;
    let off = item.offset as usize;
    assert_eq!(
        p.peer_read(SERVER, seg),
        Ok(msg[off..off + 30_000].to_vec())
    );
    // Nothing around the advertised window: not the RPC header before it,
    // not the bytes after it.
    let before = Segment {
        offset: seg.offset - 4,
        length: 4,
        ..seg
    };
    let after = Segment {
        offset: seg.offset + 30_000,
        length: 4,
        ..seg
    };
    assert_eq!(
        p.peer_read(SERVER, before),
        Err(WcStatus::RemoteAccessError)
    );
    assert_eq!(p.peer_read(SERVER, after), Err(WcStatus::RemoteAccessError));
    // Answer; once the reply is in, the window is withdrawn.
    let call = p.peers[SERVER]
        .events
        .iter()
        .find_map(|e| match e {
            Event::CallArrived { call, .. } => Some(*call),
            _ => None,
        })
        .unwrap();
    let (reply, ritem) = echo_reply(11, b"ok");
    let now = p.now;
    p.conn(SERVER)
        .send_reply(
            now,
            call,
            &OutgoingReply {
                message: &reply,
                ddp: &[ritem],
            },
        )
        .unwrap();
    p.drive();
    assert_eq!(replies(&p).len(), 1);
    assert_eq!(p.peer_read(SERVER, seg), Err(WcStatus::RemoteAccessError));
    assert_eq!(p.peers[CLIENT].conn.resources().buffers_exposed, 0);
    close_and_check_leaks(&mut p);
}

#[test]
fn engine_reply_before_send_completion_drains_the_slot_later() {
    // On hardware the reply can be polled before the call's own Send
    // completion: the slot waits in Draining, then frees.
    let mut p = pair();
    p.set_fault_hook(|f| match f {
        FaultPoint::Completion {
            side: CLIENT,
            wr_id,
        } if wr_id.kind == WrKind::CallSend => Fault::Delay(core::time::Duration::from_millis(1)),
        _ => Fault::Deliver,
    });
    let h = send(&mut p, 1, b"early", true, expect(KIB, None));
    p.drive_with(&mut |side, conn, now, ev| {
        echo_service(side, conn, now, ev);
        if let Event::ReplyArrived { call, .. } = ev {
            // Released while the Send is still outstanding.
            assert!(conn.release_reply(call));
            assert_eq!(conn.resources().call_slots_busy, 1);
        }
    });
    assert_eq!(replies(&p)[0].1, h);
    assert!(p.now >= Instant(1_000_000));
    assert_eq!(p.peers[CLIENT].conn.resources().call_slots_busy, 0);
    close_and_check_leaks(&mut p);
}

#[test]
fn engine_runs_over_caller_memory_and_refuses_too_little() {
    let need = Connection::memory_len(&cfg()).unwrap();
    let peer = |len| Box::new(super::HeapPeerMemory::new(len).unwrap());
    assert_eq!(
        Connection::with_memory(
            cfg(),
            Box::new(vec![0u8; need.private - 1]),
            peer(need.peer)
        )
        .err(),
        Some(ConfigError::MemoryTooSmall { needed: need })
    );
    assert_eq!(
        Connection::with_memory(
            cfg(),
            Box::new(vec![0u8; need.private]),
            peer(need.peer - 1)
        )
        .err(),
        Some(ConfigError::MemoryTooSmall { needed: need })
    );
    // Garbage-filled memory works: the engine zeroes what it relies on.
    let c = Connection::with_memory(cfg(), Box::new(vec![0xa5u8; need.private]), peer(need.peer))
        .unwrap();
    assert_eq!(c.buffers().memory_len(super::Memory::Private), need.private);
    assert_eq!(c.buffers().memory_len(super::Memory::Peer), need.peer);
    fn assert_send<T: Send>() {}
    assert_send::<Connection>();
    let huge = Config {
        max_call_size: !3,
        max_reply_size: !3,
        max_ddp_size: !3,
        inline_send_size: u32::MAX,
        credits: 4096,
        max_outstanding_calls: 4096,
        ..cfg()
    };
    // About 100 TiB: refused with an error value, not an abort.
    let huge_len = Connection::memory_len(&huge).unwrap();
    assert!(huge_len.private + huge_len.peer > 1 << 46);
    assert_eq!(Connection::new(huge).err(), Some(ConfigError::OutOfMemory));
}

#[test]
fn rfc5666_s3_3_calls_within_grant_wait_for_slots_held_by_late_completions() {
    // Reply Send completions at the server come 1 ms late: slots stay busy
    // after the replies went out, and the client, seeing the replies,
    // sends more calls within its grant. They must wait, not fail.
    let server = Config {
        credits: 2,
        ..cfg()
    };
    let client = Config {
        max_outstanding_calls: 8,
        ..cfg()
    };
    let mut p = Pair::new(client, server);
    p.set_fault_hook(|f| match f {
        FaultPoint::Completion {
            side: SERVER,
            wr_id,
        } if wr_id.kind == WrKind::ReplySend => Fault::Delay(core::time::Duration::from_millis(1)),
        _ => Fault::Deliver,
    });
    let hs: Vec<_> = (0..8)
        .map(|i| send(&mut p, i, &payload(64, i as u8), true, expect(KIB, None)))
        .collect();
    p.drive();
    assert_eq!(p.peers[SERVER].conn.close_reason(), None);
    assert!(p.peers[SERVER].conn.stats().calls_parked > 0);
    assert!(p.peers[SERVER].conn.stats().max_active_calls <= 2);
    for (i, h) in hs.iter().enumerate() {
        assert_eq!(returned_payload(&p, *h), payload(64, i as u8));
    }
    assert_eq!(p.rnr, 0);
    close_and_check_leaks(&mut p);
}

// ---------------------------------------------------------------------------
// Panic contract: hostile transport headers, in both directions, while
// real traffic flows.

mod hostile {
    use super::*;
    use crate::wire::rpcrdma::{ReadSegment, Segment};
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    struct Msg {
        to_server: bool,
        xid: u32,
        vers: u32,
        credits: u32,
        proc_: u32,
        reads: Vec<(u32, u32, u32)>,
        writes: Vec<Vec<(u32, u32)>>,
        reply: Option<Vec<(u32, u32)>>,
        body: u8,
        payload_len: usize,
        garbage: Vec<u8>,
    }

    fn msg() -> impl Strategy<Value = Msg> {
        (
            (
                any::<bool>(),
                0u32..6,
                prop_oneof![9 => Just(1u32), 1 => 0u32..4],
                0u32..40,
            ),
            prop_oneof![6 => 0u32..2, 1 => 2u32..6, 1 => any::<u32>()],
            proptest::collection::vec((0u32..40, 0u32..4, 0u32..70_000), 0..4),
            proptest::collection::vec(
                proptest::collection::vec((0u32..4, 0u32..70_000), 0..3),
                0..3,
            ),
            proptest::option::of(proptest::collection::vec((0u32..4, 0u32..70_000), 0..3)),
            (
                0u8..4,
                0usize..9000,
                proptest::collection::vec(any::<u8>(), 0..64),
            ),
        )
            .prop_map(
                |(
                    (to_server, xid, vers, credits),
                    proc_,
                    reads,
                    writes,
                    reply,
                    (body, payload_len, garbage),
                )| Msg {
                    to_server,
                    xid,
                    vers,
                    credits,
                    proc_,
                    reads,
                    writes,
                    reply,
                    body,
                    payload_len,
                    garbage,
                },
            )
    }

    /// Handles: 0 is never valid; 1..3 pick a real rkey of the target's
    /// peer buffers (which may or may not be exposed).
    fn seg(handle_pick: u32, length: u32, keys: &[(u32, u64)]) -> Segment {
        match keys.get(handle_pick as usize) {
            Some(&(h, a)) if handle_pick > 0 => Segment {
                handle: h,
                length,
                offset: a,
            },
            _ => Segment {
                handle: 0xdead,
                length,
                offset: 0,
            },
        }
    }

    fn encode(m: &Msg, keys: &[(u32, u64)]) -> Vec<u8> {
        let mut h = TransportHeader::new(m.xid, m.credits, MessageBody::Msg);
        h.vers = m.vers;
        h.body = match m.proc_ {
            0 => MessageBody::Msg,
            1 => MessageBody::NoMsg,
            2 => MessageBody::MsgP {
                align: 0,
                thresh: 0,
            },
            3 => MessageBody::Done,
            4 => MessageBody::Error(ErrorBody::Chunk),
            p => MessageBody::Unknown {
                proc_type: p.max(5),
            },
        };
        let mut reads = m.reads.clone();
        reads.sort();
        for (pos, pick, len) in reads {
            h.chunks.push_read(ReadSegment {
                position: pos * 4,
                segment: seg(pick, len, keys),
            });
        }
        for w in &m.writes {
            let segs: Vec<_> = w.iter().map(|&(p, l)| seg(p, l, keys)).collect();
            let _ = h.chunks.push_write_chunk(&segs);
        }
        if let Some(r) = &m.reply {
            let segs: Vec<_> = r.iter().map(|&(p, l)| seg(p, l, keys)).collect();
            h.chunks.set_reply(&segs);
        }
        let mut out = vec![0u8; h.buffer_len()];
        if h.emit(&mut out).is_err() {
            // Not emittable (e.g. position zero in RDMA_MSG): send the
            // fixed words and raw garbage instead.
            out = be(&[m.xid, m.vers, m.credits, m.proc_]);
        }
        match m.body {
            0 => out.extend_from_slice(&echo_call(m.xid, &payload(m.payload_len, 1)).0),
            1 => out.extend_from_slice(&echo_reply(m.xid, &payload(m.payload_len, 2)).0),
            2 => out.extend_from_slice(&m.garbage),
            _ => {}
        }
        // Never more than a receive buffer holds (the provider would fail
        // the Send, which other tests cover).
        out.truncate(4 * KIB as usize);
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        #[test]
        fn rfc5666_s4_2_hostile_headers_never_panic_or_leak(msgs in proptest::collection::vec(msg(), 1..12)) {
            let mut p = pair();
            // Real traffic alongside: calls of every shape outstanding.
            for i in 0..4u32 {
                let (m, item) = echo_call(i, &payload([10, 9000, 40_000, 3000][i as usize], 0));
                let _ = p.peers[CLIENT].conn.send_call(p.now, &OutgoingCall {
                    message: &m,
                    ddp: (i != 2).then_some(item),
                    reply: expect(64 * KIB, (i == 1).then_some(64 * KIB)),
                    app: AppChunks::NONE,
                });
            }
            p.drive_with(&mut |_, _, _, _| {});
            for m in &msgs {
                let (from, to) = if m.to_server { (CLIENT, SERVER) } else { (SERVER, CLIENT) };
                // Keys of buffers on the receiving side's peer (what a Read
                // or Write issued by the receiver would target).
                let t = p.peers[from].conn.buffers();
                let keys: Vec<_> = [0u32, 40, 41, 42].iter().map(|&i| t.remote_key(BufId(i))).collect();
                let _ = to;
                p.inject(from, encode(m, &keys));
            }
            p.drive_with(&mut |side, conn, now, ev| match ev {
                Event::CallArrived { call, xid, .. } if side == SERVER => {
                    let body = conn.call_message(call).and_then(echo_payload).unwrap_or_default();
                    let (msg, item) = echo_reply(xid, &body);
                    let _ = conn.send_reply(now, call, &OutgoingReply { message: &msg, ddp: &[item] });
                }
                Event::ReplyArrived { call, .. } => {
                    conn.release_reply(call);
                }
                _ => {}
            });
            p.conn(CLIENT).close();
            p.conn(SERVER).close();
            p.drive();
            for side in [CLIENT, SERVER] {
                let r = p.peers[side].conn.resources();
                prop_assert!(r.is_idle(), "side {}: {:?}", side, r);
            }
        }
    }
}

// ---------------------------------------------------------------------------
// s3.8, draft-lever s4: responder-provided read chunks and RDMA_DONE

fn rrc(c: Config) -> Config {
    Config {
        reply_read_chunks: true,
        done_timeout: core::time::Duration::from_millis(10),
        ..c
    }
}

fn is_done(bytes: &[u8]) -> bool {
    bytes.get(12..16) == Some(&[0, 0, 0, 3])
}

#[test]
fn rfc5666_s3_8_reply_read_chunk_pulled_then_done_releases_it() {
    let mut p = Pair::new(rrc(cfg()), rrc(cfg()));
    let data = payload(50_000, 31);
    // No reply chunk: the requester expects a short reply.
    let h = send(&mut p, 21, &data, true, expect(512, None));
    p.drive();
    let full = echo_reply(21, &data).0;
    assert_eq!(reply_of(&p, h), Some(full.to_vec()));
    let reply_send = p.sends_from(SERVER).next().unwrap().to_vec();
    let hd = header(&reply_send);
    assert_eq!(hd.body, MessageBody::NoMsg);
    let r = hd.chunks.reads();
    assert_eq!(r.len(), 1);
    assert_eq!(
        (r[0].position, r[0].segment.length as usize),
        (0, full.len())
    );
    let done = p
        .sends_from(CLIENT)
        .find(|b| is_done(b))
        .expect("RDMA_DONE sent");
    assert_eq!(header(done).xid, 21);
    let (c, s) = (p.peers[CLIENT].conn.stats(), p.peers[SERVER].conn.stats());
    assert_eq!((c.replies_pulled, c.done_sent), (1, 1));
    assert_eq!(
        (s.replies_exposed, s.done_received, s.done_timeouts),
        (1, 1, 0)
    );
    let sr = p.peers[SERVER].conn.resources();
    assert_eq!((sr.serve_slots_busy, sr.buffers_exposed), (0, 0));
    // Withdrawn: the requester can no longer read it.
    assert_eq!(
        p.peer_read(CLIENT, r[0].segment),
        Err(WcStatus::RemoteAccessError)
    );
    close_and_check_leaks(&mut p);
}

#[test]
fn rfc5666_s3_8_missing_done_is_reclaimed_by_the_timer() {
    let mut p = Pair::new(rrc(cfg()), rrc(cfg()));
    p.set_fault_hook(|f| match f {
        FaultPoint::Send {
            from: CLIENT,
            bytes,
        } if is_done(bytes) => Fault::Drop,
        _ => Fault::Deliver,
    });
    let data = payload(20_000, 32);
    let h = send(&mut p, 22, &data, true, expect(512, None));
    p.drive();
    assert_eq!(returned_payload(&p, h), data);
    let s = p.peers[SERVER].conn.stats();
    assert_eq!((s.done_received, s.done_timeouts), (0, 1));
    assert!(p.now >= Instant(10_000_000));
    let sr = p.peers[SERVER].conn.resources();
    assert_eq!((sr.serve_slots_busy, sr.buffers_exposed), (0, 0));
    close_and_check_leaks(&mut p);
}

#[test]
fn design_s6_unnegotiated_reply_read_list_fails_call_without_done() {
    // The server (preset) exposes the reply in a read chunk to a plain
    // Version One client: to the client an RDMA_NOMSG with a read list is
    // a long call, pulled, found to be a REPLY to its call, and that call
    // fails. No RDMA_DONE (retired by RFC 8166) and no ERR_CHUNK go back;
    // the server reclaims the exposure by its timer.
    let mut p = Pair::new(cfg(), rrc(cfg()));
    send(&mut p, 23, &payload(20_000, 33), true, expect(512, None));
    p.drive();
    assert_eq!(failures(&p), vec![(23, CallFailure::UnsupportedReply)]);
    let c = p.peers[CLIENT].conn.stats();
    assert_eq!(
        (
            c.done_sent,
            c.err_chunk_sent,
            c.unnegotiated_read_list_replies
        ),
        (0, 0, 1)
    );
    assert!(!p.sends_from(CLIENT).any(is_done));
    let s = p.peers[SERVER].conn.stats();
    assert_eq!((s.done_received, s.done_timeouts), (0, 1));
    assert_eq!(p.peers[CLIENT].conn.outstanding_calls(), 0);
    assert_eq!(p.peers[CLIENT].conn.close_reason(), None);
    // The connection still carries calls.
    let h = send(&mut p, 24, b"small", true, expect(512, None));
    p.drive();
    assert_eq!(returned_payload(&p, h), b"small");
    close_and_check_leaks(&mut p);
}

#[test]
fn design_s6_unnegotiated_rdma_msg_reply_with_read_list_fails_call_without_done() {
    // RDMA_MSG whose RPC direction is REPLY, carrying a read list, from a
    // peer that did not negotiate responder read chunks: the call fails,
    // nothing is read, no RDMA_DONE and no ERR_CHUNK go back.
    let mut p = pair();
    p.set_fault_hook(|f| match f {
        FaultPoint::Send { from: CLIENT, .. } => Fault::Drop,
        _ => Fault::Deliver,
    });
    send(&mut p, 9, b"short", false, expect(512, None));
    p.drive();
    let mut h = TransportHeader::new(9, 4, MessageBody::Msg);
    h.chunks.push_read(crate::wire::rpcrdma::ReadSegment {
        position: 4,
        segment: Segment {
            handle: 1,
            length: 4,
            offset: 0,
        },
    });
    let mut v = vec![0u8; h.buffer_len()];
    h.emit(&mut v).unwrap();
    v.extend_from_slice(&be(&[9, 1, 0, 0, 0, 0]));
    p.inject(SERVER, v);
    p.drive();
    assert_eq!(failures(&p), vec![(9, CallFailure::UnsupportedReply)]);
    let c = p.peers[CLIENT].conn.stats();
    assert_eq!(
        (
            c.done_sent,
            c.err_chunk_sent,
            c.unnegotiated_read_list_replies
        ),
        (0, 0, 1)
    );
    assert_eq!(p.peers[CLIENT].conn.outstanding_calls(), 0);
    close_and_check_leaks(&mut p);
}

#[test]
fn rfc5666_s5_2_nomsg_reply_without_offered_reply_chunk_fails_the_call() {
    // An RDMA_NOMSG without a read list is not a call (s5.1); answering a
    // call that offered no reply chunk it has nowhere to come from: the
    // call fails and gives its slot and credit back, no ERR_CHUNK.
    let mut p = pair();
    p.set_fault_hook(|f| match f {
        FaultPoint::Send { from: CLIENT, .. } => Fault::Drop,
        _ => Fault::Deliver,
    });
    send(&mut p, 7, b"short", false, expect(512, None));
    p.drive();
    assert_eq!(p.peers[CLIENT].conn.outstanding_calls(), 1);
    let h = TransportHeader::new(7, 4, MessageBody::NoMsg);
    let mut v = vec![0u8; h.buffer_len()];
    h.emit(&mut v).unwrap();
    p.inject(SERVER, v);
    p.drive();
    assert_eq!(failures(&p), vec![(7, CallFailure::MalformedReply)]);
    let c = p.peers[CLIENT].conn.stats();
    assert_eq!(c.err_chunk_sent, 0);
    assert_eq!(p.peers[CLIENT].conn.outstanding_calls(), 0);
    assert_eq!(p.peers[CLIENT].conn.resources().buffers_exposed, 0);
    close_and_check_leaks(&mut p);
}

#[test]
fn draft_lever_s4_1_3_abandoned_call_still_sends_done_when_negotiated() {
    // The reply (exposed in a read chunk) arrives after the call timed
    // out: with the extension negotiated the requester still pulls and
    // sends RDMA_DONE, so the responder withdraws it without its timer.
    let client = rrc(Config {
        call_timeout: Some(core::time::Duration::from_millis(5)),
        ..cfg()
    });
    let server = Config {
        done_timeout: core::time::Duration::from_secs(10),
        ..rrc(cfg())
    };
    let mut p = Pair::new(client, server);
    p.set_fault_hook(|f| match f {
        FaultPoint::Send { from: SERVER, .. } => {
            Fault::Delay(core::time::Duration::from_millis(20))
        }
        _ => Fault::Deliver,
    });
    send(&mut p, 31, &payload(20_000, 31), false, expect(512, None));
    p.drive();
    assert_eq!(failures(&p), vec![(31, CallFailure::Timeout)]);
    let c = p.peers[CLIENT].conn.stats();
    assert_eq!((c.done_sent, c.late_replies), (1, 1));
    let s = p.peers[SERVER].conn.stats();
    assert_eq!((s.done_received, s.done_timeouts), (1, 0));
    assert_eq!(p.peers[CLIENT].conn.outstanding_calls(), 0);
    close_and_check_leaks(&mut p);
}

#[test]
fn rfc5666_s3_8_done_consumes_a_credit() {
    // Grant 1: a DONE counts like a call, so DONEs and calls never travel
    // together. An RDMA_NOMSG with a read list is only known to be a reply
    // once pulled, so its credit returns then: the first DONE goes before
    // the second call, the second DONE after the second reply.
    let server = rrc(Config {
        credits: 1,
        ..cfg()
    });
    let mut p = Pair::new(rrc(cfg()), server);
    let h1 = send(&mut p, 1, &payload(20_000, 1), false, expect(512, None));
    let h2 = send(&mut p, 2, &payload(20_000, 2), false, expect(512, None));
    p.drive();
    assert_eq!(returned_payload(&p, h1), payload(20_000, 1));
    assert_eq!(returned_payload(&p, h2), payload(20_000, 2));
    assert_eq!(p.peers[CLIENT].conn.stats().max_outstanding_calls, 1);
    assert_eq!(p.peers[CLIENT].conn.stats().done_sent, 2);
    let kinds: Vec<bool> = p.sends_from(CLIENT).map(is_done).collect();
    assert_eq!(kinds, vec![false, true, false, true]);
    assert_eq!(p.rnr, 0);
    close_and_check_leaks(&mut p);
}

#[test]
fn engine_calls_in_both_directions_share_one_connection() {
    // Each side is requester and responder at once (the backchannel shape
    // of RFC 8167, here with chunks too): receives cover both roles.
    let mut p = pair();
    let mut handles = Vec::new();
    for i in 0..4u32 {
        let data = payload(500 + 7000 * i as usize, i as u8);
        let (msg, item) = echo_call(100 + i, &data);
        for side in [CLIENT, SERVER] {
            let now = p.now;
            let h = p
                .conn(side)
                .send_call(
                    now,
                    &OutgoingCall {
                        message: &msg,
                        ddp: Some(item),
                        reply: expect(32 * KIB, Some(32 * KIB)),
                        app: AppChunks::NONE,
                    },
                )
                .unwrap();
            handles.push((side, h, data.clone()));
        }
    }
    let got = Rc::new(RefCell::new(Vec::new()));
    let g2 = got.clone();
    p.drive_with(&mut move |side, conn, now, ev| match ev {
        Event::CallArrived { call, xid, .. } => {
            let body = echo_payload(conn.call_message(call).unwrap()).unwrap();
            reply_echo(conn, now, call, xid, &body);
        }
        Event::ReplyArrived { call, .. } => {
            g2.borrow_mut().push((
                side,
                call,
                conn.reply_ddp(call).map(|b| b.to_vec()).unwrap().to_vec(),
            ));
            conn.release_reply(call);
        }
        other => panic!("{other:?}"),
    });
    let got = got.borrow();
    assert_eq!(got.len(), 8);
    for (side, h, data) in &handles {
        assert!(got.iter().any(|(s, c, d)| s == side && c == h && d == data));
    }
    assert_eq!(p.rnr, 0);
    close_and_check_leaks(&mut p);
}

/// One long call each way with the same XID (XIDs are per direction),
/// echoed back; `reply` is what each call expects.
fn long_calls_same_xid_both_ways(mut p: Pair, reply: ReplyExpect) -> Pair {
    let data = payload(20_000, 50);
    let (msg, _) = echo_call(500, &data);
    for side in [CLIENT, SERVER] {
        let now = p.now;
        p.conn(side)
            .send_call(
                now,
                &OutgoingCall {
                    message: &msg,
                    ddp: None,
                    reply,
                    app: AppChunks::NONE,
                },
            )
            .unwrap();
    }
    let got = Rc::new(RefCell::new(Vec::new()));
    let g2 = got.clone();
    p.drive_with(&mut move |side, conn, now, ev| match ev {
        Event::CallArrived { call, xid, .. } => {
            let body = echo_payload(conn.call_message(call).unwrap()).unwrap();
            let (msg, _) = echo_reply(xid, &body);
            conn.send_reply(
                now,
                call,
                &OutgoingReply {
                    message: &msg,
                    ddp: &[],
                },
            )
            .unwrap();
        }
        Event::ReplyArrived { call, xid, .. } => {
            let m = conn
                .reply_message(call)
                .map(|b| b.to_vec())
                .unwrap()
                .to_vec();
            g2.borrow_mut().push((side, xid, m));
            conn.release_reply(call);
        }
        other => panic!("side {side}: {other:?}"),
    });
    let full = echo_reply(500, &data).0;
    let got = got.borrow();
    assert_eq!(got.len(), 2);
    for side in [CLIENT, SERVER] {
        assert!(got
            .iter()
            .any(|(s, x, m)| *s == side && *x == 500 && *m == full));
        let st = p.peers[side].conn.stats();
        assert_eq!((st.calls_received, st.err_chunk_sent), (1, 0));
        let first = p.sends_from(side).next().map(header).unwrap();
        assert_eq!((first.xid, first.body), (500, MessageBody::NoMsg));
        assert_eq!(first.chunks.reads().len(), 1, "a long call (s5.1)");
    }
    assert_eq!(p.rnr, 0);
    p
}

#[test]
fn engine_calls_in_both_directions_share_one_connection_long_calls_same_xid() {
    // Plain Version One: an RDMA_NOMSG with a read list is always a call,
    // even when its XID is that of one of our own calls. Replies come in
    // the reply chunks; no RDMA_DONE.
    let mut p = long_calls_same_xid_both_ways(pair(), expect(32 * KIB, None));
    for side in [CLIENT, SERVER] {
        assert_eq!(p.peers[side].conn.stats().done_sent, 0);
    }
    close_and_check_leaks(&mut p);
}

#[test]
fn engine_calls_in_both_directions_share_one_connection_long_calls_same_xid_read_chunk_replies() {
    // Responder-provided read chunks negotiated, no reply chunk offered:
    // both the peer's call and its reply to our call arrive as RDMA_NOMSG
    // with a position-zero read chunk and XID 500. Each is pulled, then
    // routed by its RPC direction.
    let mut p = long_calls_same_xid_both_ways(Pair::new(rrc(cfg()), rrc(cfg())), expect(512, None));
    for side in [CLIENT, SERVER] {
        let st = p.peers[side].conn.stats();
        assert_eq!(
            (
                st.replies_exposed,
                st.replies_pulled,
                st.done_sent,
                st.done_received
            ),
            (1, 1, 1, 1)
        );
        assert_eq!(st.done_timeouts, 0);
    }
    close_and_check_leaks(&mut p);
}

#[test]
fn engine_fuzz_entry_point_survives_random_and_structured_input() {
    // Random bytes.
    let mut rng = 0x1234_5678_9abc_def1u64;
    for _ in 0..300 {
        let n = (xorshift(&mut rng) % 600) as usize;
        let data: Vec<u8> = (0..n).map(|_| xorshift(&mut rng) as u8).collect();
        fuzz_recv(&data);
    }
    // Mutations of the hand-built seeds of the engine_recv target (one per
    // engine path, fuzz/seeds/engine_recv): each run still closes and
    // checks that every resource came back (the assertion inside
    // `fuzz_recv`). A few thousand keep CI fast; cargo-fuzz runs the rest.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/engine_recv");
    let mut seeds: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .expect("engine_recv seeds")
        .map(|e| std::fs::read(e.expect("entry").path()).expect("seed"))
        .collect();
    seeds.sort();
    assert!(seeds.len() > 20, "engine_recv seeds missing");
    let mut replies = 0;
    for seed in &seeds {
        replies += usize::from(fuzz_recv(seed).has("event: ReplyArrived"));
    }
    assert!(replies > 5, "seeds no longer reach replies: {replies}");
    for k in 0..3000 {
        let mut d = seeds[k % seeds.len()].clone();
        for _ in 0..1 + xorshift(&mut rng) % 6 {
            let i = (xorshift(&mut rng) as usize) % d.len();
            d[i] = match xorshift(&mut rng) % 3 {
                0 => xorshift(&mut rng) as u8,
                1 => d[i] ^ 1,
                _ => 0,
            };
        }
        fuzz_recv(&d);
    }
}

#[test]
fn rfc5666_s3_6_s5_2_reply_claiming_more_than_offered_fails_the_call() {
    // The "server" answers by hand with lengths beyond what was offered
    // (the real server engine on the other side just holds the calls).
    let mut p = pair();
    send(&mut p, 61, b"w", false, expect(16 * KIB, Some(KIB)));
    p.drive_with(&mut |_, _, _, _| {});
    let offer = header(p.sends_from(CLIENT).next().unwrap());
    let wseg = offer.chunks.write_chunks().next().unwrap().segments[0];
    // RDMA_MSG reply whose write list says KIB + 4 bytes were written.
    let mut h = TransportHeader::new(61, 4, MessageBody::Msg);
    h.chunks
        .push_write_chunk(&[Segment {
            length: KIB + 4,
            ..wseg
        }])
        .unwrap();
    let mut m = vec![0u8; h.buffer_len()];
    h.emit(&mut m).unwrap();
    m.extend_from_slice(&echo_reply(61, b"").0);
    p.inject(SERVER, m);
    p.drive_with(&mut |_, _, _, _| {});

    send(&mut p, 62, b"r", false, expect(16 * KIB, None));
    p.drive_with(&mut |_, _, _, _| {});
    let offer = header(p.sends_from(CLIENT).nth(1).unwrap());
    let rseg = offer.chunks.reply().unwrap().segments[0];
    // RDMA_NOMSG reply whose reply chunk says 16 KiB + 4 bytes.
    let mut h = TransportHeader::new(62, 4, MessageBody::NoMsg);
    h.chunks.set_reply(&[Segment {
        length: 16 * KIB + 4,
        ..rseg
    }]);
    let mut m = vec![0u8; h.buffer_len()];
    h.emit(&mut m).unwrap();
    p.inject(SERVER, m);
    p.drive_with(&mut |_, _, _, _| {});
    assert_eq!(
        failures(&p),
        vec![
            (61, CallFailure::MalformedReply),
            (62, CallFailure::MalformedReply)
        ]
    );
    assert_eq!(p.peers[CLIENT].conn.resources().buffers_exposed, 0);
}

pub(super) fn conf_v2_exchange(
    p: &mut Pair,
) -> Result<crate::wire::conf2::ConfigRdmaReplyV2, ConfRdmaError> {
    let req = p.peers[CLIENT].conn.conf_rdma_request_v2().unwrap();
    let mut buf = [0u8; 256];
    let n = encode_conf_rdma_call_v2(&mut buf, 0x0c01, &req).unwrap();
    let h = conf_call(p, &buf[..n]);
    p.drive();
    let r = decode_conf_rdma_reply_v2(&reply_of(p, h).unwrap());
    p.conn(CLIENT).release_reply(h);
    r
}

#[test]
fn extensions_conf_rdma_v2_turns_on_responder_read_chunks_only_when_both_advertise() {
    // ALL is configured, but only what the engine implements is advertised.
    let rrc_adv = |c: Config| Config {
        extensions: Extensions::ALL,
        ..c
    };
    // Both advertise: negotiated on both sides, then used.
    let mut p = Pair::new(rrc_adv(cfg()), rrc_adv(cfg()));
    let reply = conf_v2_exchange(&mut p).unwrap();
    let implemented = Extensions::ALL;
    assert_eq!(reply.properties.extensions(), implemented);
    assert_eq!(p.peers[SERVER].conn.negotiated(), implemented);
    assert_eq!(
        p.peers[CLIENT].conn.negotiated(),
        Extensions::EMPTY,
        "not applied yet"
    );
    p.conn(CLIENT).apply_conf_rdma_reply_v2(&reply);
    assert_eq!(p.peers[CLIENT].conn.negotiated(), implemented);
    let data = payload(20_000, 41);
    let h = send(&mut p, 2, &data, true, expect(512, None));
    p.drive();
    assert_eq!(returned_payload(&p, h), data);
    assert_eq!(p.peers[SERVER].conn.stats().done_received, 1);
    close_and_check_leaks(&mut p);

    // Only the client advertises: nothing is negotiated, a reply too long
    // for the offered resources is refused, not exposed.
    let mut p = Pair::new(rrc_adv(cfg()), cfg());
    let reply = conf_v2_exchange(&mut p).unwrap();
    p.conn(CLIENT).apply_conf_rdma_reply_v2(&reply);
    for side in [CLIENT, SERVER] {
        assert_eq!(p.peers[side].conn.negotiated(), Extensions::EMPTY);
    }
    send(&mut p, 3, b"q", false, expect(512, None));
    let outcome = Rc::new(RefCell::new(None));
    let o2 = outcome.clone();
    p.drive_with(&mut move |side, conn, now, ev| {
        if let (SERVER, Event::CallArrived { call, xid, .. }) = (side, ev) {
            let big = echo_reply(xid, &payload(20_000, 1)).0;
            *o2.borrow_mut() = Some(conn.send_reply(
                now,
                call,
                &OutgoingReply {
                    message: &big,
                    ddp: &[],
                },
            ));
        }
    });
    assert_eq!(*outcome.borrow(), Some(Err(ReplyError::TooLarge)));
}

#[test]
fn extensions_conf_rdma_unknown_version_is_prog_mismatch_1_to_2() {
    let mut p = pair();
    let h = CallHeader::new(
        9,
        CONFIG_RDMA_PROG,
        3,
        CONF_RDMA_PROC,
        OpaqueAuth::None,
        OpaqueAuth::None,
    );
    let mut v = vec![0u8; h.buffer_len()];
    h.emit(&mut crate::wire::xdr::Encoder::new(&mut v)).unwrap();
    let handle = conf_call(&mut p, &v);
    p.drive();
    let r = decode_conf_rdma_reply_v2(&reply_of(&p, handle).unwrap());
    let Err(ConfRdmaError::NotSuccessful(st)) = r else {
        panic!("{r:?}");
    };
    assert_eq!(st, AcceptStatus::ProgMismatch { low: 1, high: 2 });
    assert!(!crate::wire::conf2::is_plain_version_one(
        AcceptStatus::Success
    ));
    assert!(crate::wire::conf2::is_plain_version_one(st));
    close_and_check_leaks(&mut p);
}

// ---------------------------------------------------------------------------
// Application memory: directed operations (docs/CLIENT.md)

/// A call whose read chunk source and write chunk target are ranges of
/// the application memory: the message carries no item data, the server
/// sees the whole call, the result lands in the application's range, and
/// nothing stays exposed once the reply is in.
#[test]
fn app_memory_serves_as_read_chunk_source_and_write_chunk_target() {
    const APP: u32 = 256 * KIB;
    let client = Config {
        app_memory: APP,
        ..cfg()
    };
    let mut p = Pair::new(client, cfg());
    let data = payload(100_001, 7);
    assert!(p.conn(CLIENT).write_app_memory(0, &data));
    let (full, item) = echo_call(9, &data);
    // Head up to and including the length word; no data, no padding.
    let head = &full[..item.offset as usize];
    let target = AppSlice {
        offset: 128 * KIB,
        len: data.len() as u32,
    };
    let now = p.now;
    let out_of_range = OutgoingCall {
        message: head,
        ddp: Some(item),
        reply: expect(200 * KIB, None),
        app: AppChunks {
            write: Some(AppSlice {
                offset: APP - 8,
                len: 16,
            }),
            read: None,
        },
    };
    assert_eq!(
        p.conn(CLIENT).send_call(now, &out_of_range).unwrap_err(),
        SendCallError::BadAppSlice
    );
    let h = p
        .conn(CLIENT)
        .send_call(
            now,
            &OutgoingCall {
                message: head,
                ddp: Some(item),
                reply: expect(200 * KIB, None),
                app: AppChunks {
                    write: Some(target),
                    read: Some(AppSlice {
                        offset: 0,
                        len: data.len() as u32,
                    }),
                },
            },
        )
        .expect("send_call");
    // Read source, write target and the reply chunk (the reply might not fit inline).
    assert_eq!(p.peers[CLIENT].conn.resources().buffers_exposed, 3);
    let seen = run_recording(&mut p);
    assert_eq!(seen, vec![full.clone()], "the server sees the whole call");
    let call_send = p.sends_from(CLIENT).next().unwrap().to_vec();
    let hd = header(&call_send);
    assert_eq!(hd.chunks.reads().len(), 1);
    assert_eq!(hd.chunks.reads()[0].position, item.offset);
    assert_eq!(hd.chunks.reads()[0].segment.length, data.len() as u32);
    assert_eq!(
        call_send.len() - hd.buffer_len(),
        head.len(),
        "no data inline"
    );
    let w = hd.chunks.write_chunks().next().expect("a write chunk");
    assert_eq!(w.len_bytes(), u64::from(target.len));
    assert_eq!(returned_payload(&p, h), data);
    let t = target.offset as usize;
    assert_eq!(
        p.peers[CLIENT]
            .conn
            .app_memory()
            .sub(t, data.len())
            .unwrap(),
        &data[..],
        "the result is in the application's range"
    );
    assert_eq!(p.peers[CLIENT].conn.resources().buffers_exposed, 0);
    close_and_check_leaks(&mut p);
}

/// A small directed read source still goes by read chunk (the peer pulls
/// it from the application's memory), and an item that does not match
/// its length word is refused.
#[test]
fn a_small_app_read_source_goes_by_read_chunk() {
    let client = Config {
        app_memory: 64 * KIB,
        ..cfg()
    };
    let mut p = Pair::new(client, cfg());
    let data = payload(10, 1);
    assert!(p.conn(CLIENT).write_app_memory(100, &data));
    let (full, item) = echo_call(3, &data);
    let head = &full[..item.offset as usize];
    let app = AppChunks {
        write: None,
        read: Some(AppSlice {
            offset: 100,
            len: 10,
        }),
    };
    let now = p.now;
    let bad = DdpItem { len: 11, ..item };
    let refused = p.conn(CLIENT).send_call(
        now,
        &OutgoingCall {
            message: head,
            ddp: Some(bad),
            reply: expect(4 * KIB, None),
            app,
        },
    );
    assert_eq!(refused.unwrap_err(), SendCallError::BadDdpItem);
    let h = p
        .conn(CLIENT)
        .send_call(
            now,
            &OutgoingCall {
                message: head,
                ddp: Some(item),
                reply: expect(4 * KIB, None),
                app,
            },
        )
        .unwrap();
    let seen = run_recording(&mut p);
    assert_eq!(seen, vec![full]);
    assert_eq!(
        header(p.sends_from(CLIENT).next().unwrap())
            .chunks
            .reads()
            .len(),
        1
    );
    assert_eq!(returned_payload(&p, h), data);
    close_and_check_leaks(&mut p);
}

/// `Config::idle_timeout`: a server connection that has received nothing
/// for the timeout while nothing was in flight closes itself
/// (`CloseReason::Idle`); the timeout counts from the last message, not
/// from the start of the clock.
#[test]
fn an_idle_connection_closes_after_idle_timeout() {
    let second = core::time::Duration::from_secs(1);
    let server = Config {
        idle_timeout: Some(second),
        ..cfg()
    };
    let mut p = Pair::new(cfg(), server);
    let now = p.now;
    p.conn(SERVER).start_idle_clock(now);
    // Half a second in, a call: it is answered, the clock restarts.
    p.now = p.now.saturating_add(second / 2);
    let h = send(&mut p, 5, b"still here", false, expect(512, None));
    p.drive();
    assert_eq!(returned_payload(&p, h), b"still here");
    let s = &p.peers[SERVER].conn;
    assert_eq!(s.close_reason(), Some(CloseReason::Idle));
    assert_eq!(s.stats().idle_closes, 1);
    assert!(
        p.now >= Instant::ZERO.saturating_add(second + second / 2),
        "closed {:?} after the call, before a whole timeout of quiet",
        p.now
    );
    assert!(p.peers[SERVER].events.contains(&Event::ConnectionLost {
        reason: CloseReason::Idle
    }));
}

/// A directed call that times out gives its application range back with
/// the failure, so the range is no longer exposed to the peer even though
/// the slot waits for a late answer (its own buffers stay exposed).
#[test]
fn a_timed_out_call_withdraws_its_application_range_at_once() {
    let client = Config {
        app_memory: 64 * KIB,
        call_timeout: Some(core::time::Duration::from_millis(5)),
        ..cfg()
    };
    let mut p = Pair::new(client, cfg());
    p.set_fault_hook(|f| match f {
        FaultPoint::Send { from: SERVER, .. } => Fault::Drop,
        _ => Fault::Deliver,
    });
    let data = payload(3000, 4);
    let (msg, item) = echo_call(8, &data);
    let now = p.now;
    p.conn(CLIENT)
        .send_call(
            now,
            &OutgoingCall {
                message: &msg,
                ddp: Some(item),
                reply: expect(4 * KIB, None),
                app: AppChunks {
                    write: Some(AppSlice {
                        offset: 1024,
                        len: 3000,
                    }),
                    read: None,
                },
            },
        )
        .unwrap();
    assert_eq!(p.peers[CLIENT].conn.resources().buffers_exposed, 1);
    p.drive();
    assert_eq!(failures(&p), vec![(8, CallFailure::Timeout)]);
    let c = &p.peers[CLIENT].conn;
    assert_eq!(
        c.resources().call_slots_busy,
        1,
        "still waiting for a late answer"
    );
    assert_eq!(
        c.resources().buffers_exposed,
        0,
        "the application range is withdrawn"
    );
    close_and_check_leaks(&mut p);
}

// ---------------------------------------------------------------------------
// Reply matching (RFC 5531 s8: the XID pairs a reply with its call)

/// Calls held by the server and answered newest first: every reply finds
/// its call, both when the XIDs are in sequence (the index's one-probe
/// case) and when they all share one entry of the index (XIDs 8 apart
/// with 4 call slots: the index names only the last, the others are
/// found by the scan).
#[test]
fn rfc5531_s8_replies_in_any_order_find_their_calls_whatever_the_xids() {
    for xids in [[100u32, 101, 102, 103], [5, 13, 21, 29]] {
        let mut p = pair();
        // One call answered first: its reply brings the grant of 4.
        let first = send(&mut p, 1, b"grant", false, expect(512, None));
        p.drive();
        assert!(p.conn(CLIENT).release_reply(first));
        p.peers[CLIENT].events.clear();
        let datas: Vec<Vec<u8>> = (0..4).map(|i| payload(40 + i, i as u8)).collect();
        let handles: Vec<CallHandle> = xids
            .iter()
            .zip(&datas)
            .map(|(&xid, d)| send(&mut p, xid, d, false, expect(512, None)))
            .collect();
        type Held = Vec<(IncomingCall, u32, Vec<u8>)>;
        let held: Rc<RefCell<Held>> = Rc::default();
        let h2 = held.clone();
        p.drive_with(&mut |side, conn, _now, ev| {
            if let (SERVER, Event::CallArrived { call, xid, .. }) = (side, ev) {
                let data = echo_payload(conn.call_message(call).expect("call")).expect("echo");
                h2.borrow_mut().push((call, xid, data));
            }
        });
        let mut held = held.take();
        assert_eq!(held.len(), 4, "every call reached the server");
        let now = p.now;
        while let Some((call, xid, data)) = held.pop() {
            reply_echo(p.conn(SERVER), now, call, xid, &data);
        }
        p.drive();
        let got = replies(&p);
        assert_eq!(got.len(), 4);
        let order: Vec<u32> = got.iter().map(|r| r.0).collect();
        assert_eq!(order, xids.iter().rev().copied().collect::<Vec<_>>());
        for (xid, handle, _, _) in got {
            let i = xids.iter().position(|&x| x == xid).expect("known xid");
            assert_eq!(handle, handles[i], "xid {xid} matched its own call");
            assert_eq!(returned_payload(&p, handle), datas[i]);
        }
        assert_eq!(p.conn(CLIENT).stats().unmatched_replies, 0);
    }
}

/// `call_header_len` is the length the RPC header parse finds (what a
/// service skips to reach the arguments), for a call waiting for its
/// reply; nothing once it is answered.
#[test]
fn rfc5531_s9_call_header_len_is_where_the_arguments_start() {
    let mut p = pair();
    send(&mut p, 9, b"arguments", false, expect(512, None));
    let arrived: Rc<RefCell<Vec<IncomingCall>>> = Rc::default();
    let a2 = arrived.clone();
    p.drive_with(&mut |side, _conn, _now, ev| {
        if let (SERVER, Event::CallArrived { call, .. }) = (side, ev) {
            a2.borrow_mut().push(call);
        }
    });
    let call = arrived.borrow()[0];
    let msg = p.conn(SERVER).call_message(call).expect("waiting").to_vec();
    let (_, parsed_len) = CallHeader::parse(&msg).expect("a call");
    assert_eq!(p.conn(SERVER).call_header_len(call), Some(parsed_len));
    let now = p.now;
    reply_echo(p.conn(SERVER), now, call, 9, b"arguments");
    assert_eq!(p.conn(SERVER).call_header_len(call), None);
}
