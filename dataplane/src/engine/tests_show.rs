//! Engine tests for the behaviours docs/ENGINE.md promises: the read-chunk length vs XDR
//! count cross-check, a credit overrun isolated to its connection, and
//! multi-megabyte calls and replies, an RDMA_DONE for an unknown XID.
//! Named after the RFC 5666 section
//! whose rule each checks; helpers come from `tests.rs`.

use std::cell::RefCell;
use std::rc::Rc;

use super::harness::*;
use super::tests::*;
use super::*;
use crate::wire::rpcrdma::{ErrorBody, MessageBody};

// ---------------------------------------------------------------------------
// s3.4, s3.7: a read chunk's length against the XDR count before it

/// Has the client send `data` as a DDP argument, catches that Send before
/// the server sees it (the call and its read chunk stay exposed), and
/// returns the Send's bytes with the inline XDR count of the argument
/// replaced by `count` (`None`: unchanged).
fn doctored_call(p: &mut Pair, xid: u32, data: &[u8], count: Option<u32>) -> (CallHandle, Vec<u8>) {
    let caught: Rc<RefCell<Option<Vec<u8>>>> = Rc::default();
    let c2 = caught.clone();
    p.set_fault_hook(move |fp| match fp {
        FaultPoint::Send {
            from: CLIENT,
            bytes,
        } if c2.borrow().is_none() => {
            *c2.borrow_mut() = Some(bytes.to_vec());
            Fault::Drop
        }
        _ => Fault::Deliver,
    });
    let len = data.len() as u32;
    let h = send(p, xid, data, true, expect(len + 512, None));
    p.drive();
    let mut bytes = caught.borrow_mut().take().expect("the call was sent");
    let hd = header(&bytes);
    assert_eq!(hd.body, MessageBody::Msg);
    let r = hd.chunks.reads()[0];
    assert!(r.position > 0);
    assert_eq!(
        r.segment.length, len,
        "the requester sends the count it wrote"
    );
    let at = hd.buffer_len() + r.position as usize - 4;
    assert_eq!(bytes[at..at + 4], len.to_be_bytes(), "XDR count inline");
    if let Some(c) = count {
        bytes[at..at + 4].copy_from_slice(&c.to_be_bytes());
    }
    (h, bytes)
}

/// Injects a doctored call and checks it was refused with ERR_CHUNK
/// before any RDMA Read, the client's call failed, and nothing leaked.
fn assert_refused(data_len: usize, count: u32) {
    let mut p = pair();
    p.drive();
    let data = payload(data_len, 1);
    let (_, bytes) = doctored_call(&mut p, 5, &data, Some(count));
    p.inject(CLIENT, bytes);
    p.drive();
    assert_eq!(last_error_from_server(&p), (5, ErrorBody::Chunk));
    assert_eq!(p.ops[1], 0, "no RDMA Read was posted");
    let s = p.peers[SERVER].conn.stats();
    assert_eq!((s.err_chunk_sent, s.calls_received), (1, 0));
    assert_eq!(p.peers[SERVER].conn.resources().serve_slots_busy, 0);
    assert_eq!(failures(&p), vec![(5, CallFailure::PeerChunkError)]);
    assert_eq!(p.peers[CLIENT].conn.resources().buffers_exposed, 0);
    assert_eq!(p.peers[SERVER].conn.close_reason(), None);
    close_and_check_leaks(&mut p);
}

#[test]
fn rfc5666_s3_4_read_chunk_length_disagreeing_with_xdr_count_gets_err_chunk() {
    // Count smaller than the chunk (and than its roundup-less length).
    assert_refused(10_000, 9_000);
    assert_refused(10_000, 9_996);
    // Count larger than the chunk.
    assert_refused(10_000, 10_001);
    assert_refused(10_000, 20_000);
    // 4097 bytes: chunk 4097; a count of 4100 is not the chunk's length
    // nor a count whose roundup it is.
    assert_refused(4097, 4100);
    assert_refused(4097, 4093);
}

#[test]
fn rfc5666_s3_4_read_chunk_position_without_inline_xdr_count_gets_err_chunk() {
    // A second read chunk right behind the first: no inline word before
    // it to hold its XDR count (s3.4: the count stays in the inline part).
    let mut p = pair();
    p.drive();
    let data = payload(4096, 2);
    let (_, bytes) = doctored_call(&mut p, 6, &data, None);
    let hd = header(&bytes);
    let r = hd.chunks.reads()[0];
    // A second chunk of 4 bytes right behind the first: no inline count.
    let mut h2 = hd.clone();
    h2.chunks.push_read(crate::wire::rpcrdma::ReadSegment {
        position: r.position + r.segment.length,
        segment: r.segment,
    });
    let mut m = vec![0u8; h2.buffer_len()];
    h2.emit(&mut m).unwrap();
    m.extend_from_slice(&bytes[hd.buffer_len()..]);
    p.inject(CLIENT, m);
    p.drive();
    assert_eq!(last_error_from_server(&p), (6, ErrorBody::Chunk));
    assert_eq!(p.ops[1], 0, "no RDMA Read was posted");
    close_and_check_leaks(&mut p);
}

/// Injects a doctored call and checks the server pulled it and answered
/// with the `count` bytes the XDR says the argument holds.
fn assert_accepted(data_len: usize, count: Option<u32>) {
    let mut p = pair();
    p.drive();
    let data = payload(data_len, 3);
    let (h, bytes) = doctored_call(&mut p, 8, &data, count);
    p.inject(CLIENT, bytes);
    p.drive();
    assert_eq!(p.ops[1], 1, "one RDMA Read");
    let s = p.peers[SERVER].conn.stats();
    assert_eq!((s.err_chunk_sent, s.calls_received), (0, 1));
    assert!(failures(&p).is_empty(), "{:?}", failures(&p));
    let n = count.map_or(data_len, |c| c as usize);
    assert_eq!(returned_payload(&p, h), data[..n]);
    close_and_check_leaks(&mut p);
}

#[test]
fn rfc5666_s3_7_read_chunk_length_with_or_without_roundup_is_accepted() {
    // Roundup elided (s3.7): count 4097, chunk 4097.
    assert_accepted(4097, None);
    // Roundup included: count 4097, chunk 4100 (the chunk of a 4100-byte
    // argument whose count says 4097).
    assert_accepted(4100, Some(4097));
    assert_accepted(4100, Some(4099));
    // No roundup to speak of.
    assert_accepted(4096, None);
    assert_accepted(4100, Some(4100));
}

// ---------------------------------------------------------------------------
// s3.3: a credit overrun ends only its own connection

/// Moves every pair to the latest virtual time among them, so they run in
/// one timeline.
fn sync(ps: &mut [&mut Pair]) {
    let t = ps.iter().map(|p| p.now).max().expect("pairs");
    for p in ps.iter_mut() {
        p.now = t;
    }
}

#[test]
fn rfc5666_s3_3_credit_overrun_closes_only_that_connection() {
    let server = Config {
        credits: 2,
        ..cfg()
    };
    // `bad` gets overrun; `good` runs RPCs alongside it; `alone` runs the
    // same RPCs with nothing else going on, as the reference.
    let mut bad = Pair::new(cfg(), server);
    let mut good = Pair::new(cfg(), server);
    let mut alone = Pair::new(cfg(), server);
    for p in [&mut bad, &mut good, &mut alone] {
        p.drive();
    }
    let sizes = [10usize, 5_000, 70_000, 0, 300_000, 4_097];
    for (round, &len) in sizes.iter().enumerate() {
        let xid = round as u32 + 100;
        sync(&mut [&mut bad, &mut good, &mut alone]);
        match round {
            // An ordinary RPC on `bad` first.
            0 | 1 => {
                let data = payload(len, 7);
                let h = send(&mut bad, xid, &data, true, expect(len as u32 + 512, None));
                bad.drive();
                assert_eq!(returned_payload(&bad, h), data);
            }
            // Three calls on a grant of two, none answered: overrun.
            2 => {
                for x in 1..=3 {
                    bad.inject(CLIENT, raw_call(x, 2, &echo_call(x, b"x").0));
                }
                bad.drive_with(&mut |_, _, _, _| {});
                assert_eq!(
                    bad.peers[SERVER].conn.close_reason(),
                    Some(CloseReason::CreditOverrun)
                );
            }
            _ => {}
        }
        sync(&mut [&mut bad, &mut good, &mut alone]);
        for p in [&mut good, &mut alone] {
            let data = payload(len, round as u8);
            let reply = expect(
                len as u32 + 512,
                (round % 2 == 1).then_some(len as u32 + 512),
            );
            let h = send(p, xid, &data, true, reply);
            p.drive();
            assert_eq!(returned_payload(p, h), data, "round {round} byte-exact");
            p.conn(CLIENT).release_reply(h);
        }
    }
    let b = &bad.peers[SERVER].conn;
    assert_eq!(b.stats().credit_overruns, 1);
    for side in [CLIENT, SERVER] {
        let (g, a) = (&good.peers[side].conn, &alone.peers[side].conn);
        assert_eq!(g.close_reason(), None);
        assert_eq!(g.stats(), a.stats(), "side {side} stats unaffected");
        assert_eq!(g.stats().credit_overruns, 0);
        assert_eq!(g.granted_credits(), a.granted_credits());
        assert_eq!(g.resources(), a.resources());
    }
    assert_eq!(
        good.peers[SERVER].conn.stats().calls_received,
        sizes.len() as u64
    );
    assert_eq!(good.peers[CLIENT].conn.granted_credits(), 2);
    assert_eq!(good.rnr, 0);
    for p in [&mut bad, &mut good, &mut alone] {
        close_and_check_leaks(p);
    }
}

// ---------------------------------------------------------------------------
// s3 - s5: calls and replies up to 4 MiB

mod prop_large {
    use super::super::tests::prop::{echo_and_check, rpc_sized};
    use super::*;
    use proptest::prelude::*;

    const MAX: u32 = (4 << 20) + 64 * KIB;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 8, ..ProptestConfig::default() })]

        #[test]
        fn rfc5666_s3_s5_bytes_delivered_equal_bytes_sent_up_to_4_mib(
            client_inline in 1u32..=16,
            server_inline in 1u32..=16,
            credits in 1u32..=4,
            max_rdma_read in 1u32..=4,
            reply_read_chunks in any::<bool>(),
            rpcs in proptest::collection::vec(
                rpc_sized(prop_oneof![
                    1 => 0usize..2048,
                    1 => 2048usize..300_000,
                    2 => 300_000usize..=4 << 20,
                ]),
                1..=3,
            ),
        ) {
            let base = Config {
                max_call_size: MAX,
                max_reply_size: MAX,
                max_ddp_size: MAX,
                max_rdma_read,
                reply_read_chunks,
                ..cfg()
            };
            let inline = (client_inline * KIB, server_inline * KIB);
            let mut p = echo_and_check(base, inline, credits, &rpcs)?;
            close_and_check_leaks(&mut p);
        }
    }
}

// ---------------------------------------------------------------------------
// s3.8: RDMA_DONE for an XID with no exposed reply

#[test]
fn rfc5666_s3_8_done_for_unknown_xid_is_dropped_silently() {
    let mut p = pair();
    p.drive();
    let sent_before = p.sends_from(SERVER).count();
    // xid, vers 1, credits 1, RDMA_DONE: for a reply the server never exposed.
    p.inject(CLIENT, be(&[0xdead, 1, 1, 3]));
    p.drive();
    let s = &p.peers[SERVER].conn;
    assert_eq!(s.stats().done_ignored, 1);
    assert_eq!(s.stats().done_received, 0);
    assert_eq!(s.close_reason(), None);
    assert_eq!(
        p.sends_from(SERVER).count(),
        sent_before,
        "no answer, not even an RDMA_ERROR"
    );
    // The connection still serves.
    let data = payload(3000, 9);
    let h = send(&mut p, 8, &data, true, expect(8192, None));
    p.drive();
    assert_eq!(returned_payload(&p, h), data);
    close_and_check_leaks(&mut p);
}
