//! RDMA_MSGP received (RFC 5666 s3.9, s4.3) and RDMA_DONE as Send With
//! Invalidate (draft-lever s4.1.4).

use super::*;
use crate::wire::rpcrdma::{Padding, ReadSegment};
use crate::wire::xdr::Decoder;

/// An RDMA_MSGP call from a hand-crafted peer: `data` as the echo
/// argument, padded per `pad` in front of its data, no chunks. Returns
/// the Send, the RPC message as sent (padding included) and the header
/// length.
fn msgp_call(xid: u32, data: &[u8], pad: Padding) -> (Vec<u8>, Vec<u8>, usize) {
    let (msg, item) = echo_call(xid, data);
    let h = TransportHeader::new(
        xid,
        4,
        MessageBody::MsgP {
            align: pad.align,
            thresh: pad.thresh,
        },
    );
    let hlen = h.buffer_len();
    let at = item.offset as usize;
    let n = pad.pad_len(hlen + at, data.len() as u32).unwrap();
    let mut rpc = msg[..at].to_vec();
    rpc.extend(std::iter::repeat_n(0u8, n));
    rpc.extend_from_slice(&msg[at..]);
    let mut send = vec![0u8; hlen];
    h.emit(&mut send).unwrap();
    send.extend_from_slice(&rpc);
    (send, rpc, hlen)
}

/// Drives the pair with a server that decodes echo calls padding-aware
/// and answers them; returns (message, padding, decoded argument) of each
/// call it saw.
type Seen = Vec<(Vec<u8>, Option<MessagePadding>, Vec<u8>)>;
fn drive_padded(p: &mut Pair) -> Seen {
    let seen = Rc::new(RefCell::new(Vec::new()));
    let s2 = seen.clone();
    p.drive_with(&mut move |side, conn, now, ev| {
        if let (SERVER, Event::CallArrived { call, xid, .. }) = (side, ev) {
            let msg = conn.call_message(call).unwrap().to_vec();
            let mp = conn.call_padding(call);
            let (_, hl) = CallHeader::parse(&msg).unwrap();
            let mut d = Decoder::new(&msg[hl..]);
            let arg = match mp {
                Some(m) => d.get_opaque_padded(1 << 20, &m.padding, m.offset as usize + hl),
                None => d.get_opaque(1 << 20),
            }
            .unwrap()
            .to_vec();
            d.finish().unwrap();
            let reply = echo_reply(xid, b"ok").0;
            conn.send_reply(
                now,
                call,
                &OutgoingReply {
                    message: &reply,
                    ddp: &[],
                },
            )
            .unwrap();
            s2.borrow_mut().push((msg, mp, arg));
        }
    });
    seen.take()
}

fn big_recv() -> Config {
    Config {
        inline_recv_size: 8 * KIB,
        ..cfg()
    }
}

#[test]
fn rfc5666_s3_9_msgp_call_padded_opaque_decoded_byte_exact() {
    let mut p = Pair::new(cfg(), big_recv());
    p.drive();
    let data = payload(1500, 9);
    let pad = Padding {
        align: 4096,
        thresh: 1024,
    };
    let (bytes, rpc, hlen) = msgp_call(0x51, &data, pad);
    // Golden header: xid, vers 1, credits 4, RDMA_MSGP, align 4096,
    // thresh 1024, three empty chunk lists; then the RPC call (40 bytes of
    // header), the opaque's length word, 4016 pad bytes, the data at Send
    // offset 4096.
    assert_eq!(bytes[..hlen], be(&[0x51, 1, 4, 2, 4096, 1024, 0, 0, 0])[..]);
    assert_eq!(bytes[hlen + 40..hlen + 44], be(&[1500])[..]);
    assert!(bytes[hlen + 44..4096].iter().all(|&b| b == 0));
    assert_eq!(bytes[4096..4096 + 1500], data[..]);
    p.inject(CLIENT, bytes);
    let seen = drive_padded(&mut p);
    assert_eq!(seen.len(), 1);
    let (msg, mp, arg) = &seen[0];
    assert_eq!(msg, &rpc, "message delivered as sent, padding included");
    assert_eq!(
        *mp,
        Some(MessagePadding {
            padding: pad,
            offset: hlen as u32
        })
    );
    assert_eq!(arg, &data, "argument decoded byte-exact");
    let s = p.peers[SERVER].conn.stats();
    assert_eq!(
        (s.calls_received, s.replies_sent, s.err_chunk_sent),
        (1, 1, 0)
    );
}

#[test]
fn rfc5666_s3_9_msgp_opaque_below_thresh_is_not_padded() {
    let mut p = Pair::new(cfg(), big_recv());
    p.drive();
    let pad = Padding {
        align: 4096,
        thresh: 1024,
    };
    let data = payload(600, 3);
    let (bytes, rpc, hlen) = msgp_call(0x52, &data, pad);
    assert_eq!(rpc, echo_call(0x52, &data).0, "nothing inserted");
    p.inject(CLIENT, bytes);
    // align 1: padding never applies, whatever the threshold.
    let (send1, _, _) = msgp_call(
        0x53,
        &payload(2000, 4),
        Padding {
            align: 1,
            thresh: 0,
        },
    );
    p.inject(CLIENT, send1);
    // A plain RDMA_MSG call reports no padding.
    send(&mut p, 0x54, b"plain", false, expect(512, None));
    let seen = drive_padded(&mut p);
    assert_eq!(seen.len(), 3);
    assert_eq!(
        seen[0].1.map(|m| (m.padding, m.offset)),
        Some((pad, hlen as u32))
    );
    assert_eq!(seen[0].2, data);
    assert_eq!(seen[1].2, payload(2000, 4));
    assert_eq!((seen[2].1, &seen[2].2[..]), (None, &b"plain"[..]));
}

#[test]
fn rfc5666_s3_9_msgp_unusable_padding_answered_err_chunk() {
    let mut p = Pair::new(cfg(), big_recv());
    p.drive();
    let rpc = echo_call(9, b"abc").0;
    for (i, (align, thresh)) in [(4098, 1024), (6, 4096), (4096, 400), (8, 0)]
        .into_iter()
        .enumerate()
    {
        let mut m = be(&[9, 1, 1, 2, align, thresh, 0, 0, 0]);
        m.extend_from_slice(&rpc);
        p.inject(CLIENT, m);
        assert!(drive_padded(&mut p).is_empty(), "case {i}");
        assert_eq!(
            last_error_from_server(&p),
            (9, ErrorBody::Chunk),
            "case {i}"
        );
        assert_eq!(p.peers[SERVER].conn.stats().err_chunk_sent, i as u64 + 1);
    }
    let s = &p.peers[SERVER].conn;
    assert_eq!((s.stats().calls_received, s.close_reason()), (0, None));
}

#[test]
fn rfc5666_s4_3_msgp_chunk_lists_still_validated() {
    let mut p = Pair::new(cfg(), big_recv());
    p.drive();
    let rpc = echo_call(9, b"abc").0;
    let pad = MessageBody::MsgP {
        align: 4096,
        thresh: 1024,
    };
    let seg = Segment {
        handle: 0x1234,
        length: 64,
        offset: 0x1000,
    };
    let mut cases = Vec::new();
    // A read chunk at a valid position: refused (position in a padded
    // stream is undefined), before any Read.
    let mut h = TransportHeader::new(9, 1, pad);
    h.chunks.push_read(ReadSegment {
        position: 28,
        segment: seg,
    });
    cases.push(h);
    // A misaligned position and a position-zero chunk: the wire rules.
    for position in [6, 0] {
        let mut h = TransportHeader::new(9, 1, pad);
        h.chunks.push_read(ReadSegment {
            position,
            segment: seg,
        });
        cases.push(h);
    }
    for (i, h) in cases.iter().enumerate() {
        let mut m = vec![0u8; h.buffer_len()];
        // emit refuses what parse would refuse: write the words by hand.
        if h.emit(&mut m).is_err() {
            m = be(&[9, 1, 1, 2, 4096, 1024, 1]);
            m.extend(be(&[
                h.chunks.reads()[0].position,
                0x1234,
                64,
                0,
                0x1000,
                0,
                0,
                0,
            ]));
        }
        m.extend_from_slice(&rpc);
        p.inject(CLIENT, m);
        assert!(drive_padded(&mut p).is_empty(), "case {i}");
        assert_eq!(
            last_error_from_server(&p),
            (9, ErrorBody::Chunk),
            "case {i}"
        );
    }
    assert_eq!(p.ops[1], 0, "no RDMA Read was issued");
    // A write chunk is kept for the reply, as with RDMA_MSG: the DDP
    // result is RDMA-written into it (here a client buffer exposed by hand).
    let (bytes, _, hl) = msgp_call(
        10,
        b"abc",
        Padding {
            align: 4096,
            thresh: 1024,
        },
    );
    let ddp = {
        let t = p.peers[CLIENT].conn.buffers_mut();
        let id = (0..t.count() as u32)
            .map(BufId)
            .find(|&b| t.class(b) == Some(BufClass::Ddp))
            .unwrap();
        assert_eq!(t.set_access(id, Access::RemoteWrite, 0, 64), Ok(None));
        (id, t.segment(id, 0, 64))
    };
    let mut h = TransportHeader::new(10, 4, pad);
    h.chunks.push_write_chunk(&[ddp.1]).unwrap();
    let mut m = vec![0u8; h.buffer_len()];
    h.emit(&mut m).unwrap();
    m.extend_from_slice(&bytes[hl..]);
    p.inject(CLIENT, m);
    let seen = Rc::new(RefCell::new(0));
    let s2 = seen.clone();
    p.drive_with(&mut move |side, conn, now, ev| {
        if let (SERVER, Event::CallArrived { call, xid, .. }) = (side, ev) {
            *s2.borrow_mut() += 1;
            assert!(conn.call_padding(call).is_some());
            let (reply, item) = echo_reply(xid, &payload(40, 1));
            conn.send_reply(
                now,
                call,
                &OutgoingReply {
                    message: &reply,
                    ddp: &[item],
                },
            )
            .unwrap();
        }
    });
    assert_eq!(*seen.borrow(), 1);
    assert_eq!(p.ops[2], 1, "one RDMA Write into the write chunk");
    let c = p.peers[CLIENT].conn.buffers();
    assert_eq!(c.peer_bytes(ddp.0, 0, 40).unwrap(), payload(40, 1));
    assert_eq!(p.peers[SERVER].conn.close_reason(), None);
}

#[test]
fn rfc5666_s3_9_msgp_reply_delivered_with_its_padding() {
    let mut p = Pair::new(big_recv(), big_recv());
    let h = send(&mut p, 0x60, b"x", false, expect(8 * KIB, None));
    p.drive_with(&mut |_, _, _, _| {});
    // The peer answers in RDMA_MSGP with a padded 1500-byte result.
    let data = payload(1500, 5);
    let pad = Padding {
        align: 4096,
        thresh: 1024,
    };
    let (reply, item) = echo_reply(0x60, &data);
    let body = MessageBody::MsgP {
        align: 4096,
        thresh: 1024,
    };
    let th = TransportHeader::new(0x60, 4, body);
    let hlen = th.buffer_len();
    let at = item.offset as usize;
    let n = pad.pad_len(hlen + at, 1500).unwrap();
    let mut m = vec![0u8; hlen];
    th.emit(&mut m).unwrap();
    m.extend_from_slice(&reply[..at]);
    m.extend(std::iter::repeat_n(0u8, n));
    m.extend_from_slice(&reply[at..]);
    p.inject(SERVER, m);
    p.drive_with(&mut |_, _, _, _| {});
    assert_eq!(replies(&p).len(), 1);
    let c = &p.peers[CLIENT].conn;
    let mp = c.reply_padding(h).expect("padding reported");
    assert_eq!((mp.padding, mp.offset), (pad, hlen as u32));
    let msg = c.reply_message(h).map(|b| b.to_vec()).unwrap();
    let (_, hl) = crate::wire::rpc::ReplyHeader::parse(&msg).unwrap();
    let mut d = Decoder::new(&msg[hl..]);
    let got = d
        .get_opaque_padded(1 << 20, &mp.padding, mp.offset as usize + hl)
        .unwrap();
    assert_eq!(got, &data[..]);
    // Released: the handle is stale, so is its padding.
    p.conn(CLIENT).release_reply(h);
    assert_eq!(p.peers[CLIENT].conn.reply_padding(h), None);
}

// ---------------------------------------------------------------------------
// draft-lever s4.1.4: RDMA_DONE as Send With Invalidate

/// Responder-provided read chunks, plus `extra`, advertised by both and
/// negotiated in a CONF_RDMA v2 exchange.
fn negotiated_pair(extra: Extensions) -> Pair {
    let c = |c: Config| Config {
        extensions: Extensions::RESPONDER_READ_CHUNKS.union(extra),
        done_timeout: core::time::Duration::from_millis(10),
        ..c
    };
    let mut p = Pair::new(c(cfg()), c(cfg()));
    let reply = conf_v2_exchange(&mut p).unwrap();
    p.conn(CLIENT).apply_conf_rdma_reply_v2(&reply);
    p
}

/// A call whose reply only fits a responder-provided read chunk; returns
/// the read chunk segment the server exposed it in.
fn exposed_reply(p: &mut Pair, xid: u32, seed: u8) -> Segment {
    let data = payload(50_000, seed);
    let before = p.sends_from(SERVER).count();
    let h = send(p, xid, &data, true, expect(512, None));
    p.drive();
    assert_eq!(returned_payload(p, h), data);
    p.conn(CLIENT).release_reply(h);
    let sends: Vec<Vec<u8>> = p
        .sends_from(SERVER)
        .skip(before)
        .map(<[u8]>::to_vec)
        .collect();
    let hd = sends
        .iter()
        .map(|b| header(b))
        .find(|h| h.xid == xid && h.body == MessageBody::NoMsg)
        .expect("reply exposed in a read chunk");
    hd.chunks.reads()[0].segment
}

fn rkey_installed(p: &Pair, side: usize, rkey: u32) -> bool {
    let t = p.peers[side].conn.buffers();
    (0..t.count() as u32).any(|b| t.remote_key(BufId(b)).0 == rkey)
}

#[test]
fn draft_lever_s4_1_4_done_is_send_with_invalidate_when_negotiated() {
    let mut p = negotiated_pair(Extensions::REMOTE_INVALIDATE);
    for side in [CLIENT, SERVER] {
        assert!(p.peers[side]
            .conn
            .negotiated()
            .contains(Extensions::REMOTE_INVALIDATE));
    }
    let seg = exposed_reply(&mut p, 31, 1);
    // The DONE went as Send With Invalidate of exactly the read chunk's
    // rkey, and the provider (harness) invalidated it.
    assert_eq!(p.invalidations, vec![(CLIENT, seg.handle)]);
    assert!(!rkey_installed(&p, SERVER, seg.handle), "rkey dead");
    assert_eq!(p.peer_read(CLIENT, seg), Err(WcStatus::RemoteAccessError));
    let s = p.peers[SERVER].conn.stats();
    assert_eq!((s.done_received, s.done_timeouts), (1, 0));
    // The next exposure uses the buffer's fresh rkey and works as well.
    let seg2 = exposed_reply(&mut p, 32, 2);
    assert_ne!(seg2.handle, seg.handle);
    assert_eq!(
        p.invalidations,
        vec![(CLIENT, seg.handle), (CLIENT, seg2.handle)]
    );
    assert_eq!(p.peers[SERVER].conn.stats().done_received, 2);
    close_and_check_leaks(&mut p);
}

#[test]
fn draft_lever_s4_1_4_done_is_plain_send_without_remote_invalidation() {
    // Responder-provided read chunks negotiated, remote invalidation
    // advertised by neither; then preset without any CONF_RDMA.
    let mut p = negotiated_pair(Extensions::EMPTY);
    assert!(!p.peers[CLIENT]
        .conn
        .negotiated()
        .contains(Extensions::REMOTE_INVALIDATE));
    let seg = exposed_reply(&mut p, 41, 3);
    assert!(p.invalidations.is_empty(), "plain Send");
    assert!(
        rkey_installed(&p, SERVER, seg.handle),
        "rkey not invalidated"
    );
    // Withdrawn by the responder's own bookkeeping on DONE all the same.
    assert_eq!(p.peer_read(CLIENT, seg), Err(WcStatus::RemoteAccessError));
    assert_eq!(p.peers[SERVER].conn.stats().done_received, 1);
    close_and_check_leaks(&mut p);

    let mut p = Pair::new(rrc(cfg()), rrc(cfg()));
    exposed_reply(&mut p, 42, 4);
    assert!(p.invalidations.is_empty());
    assert_eq!(p.peers[CLIENT].conn.stats().done_sent, 1);
    close_and_check_leaks(&mut p);
}
