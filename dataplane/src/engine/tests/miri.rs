//! Every chunk path of the engine at sizes Miri can interpret in seconds
//! (`deploy/miri engine::tests::miri`): the engine's memory is touched
//! only through raw-pointer copies between its private and peer regions,
//! and these runs are where Miri checks those copies in real exchanges.
//! The same tests run natively with the rest.

use super::*;

/// Small limits: 1 KiB inline each way (the RFC minimum), messages up to
/// 8 KiB, two slots each way, so the regions are a few dozen KiB.
fn small() -> Config {
    Config {
        inline_recv_size: KIB,
        inline_send_size: KIB,
        peer_inline_recv_size: KIB,
        peer_inline_send_size: KIB,
        credits: 2,
        max_outstanding_calls: 2,
        max_call_size: 8 * KIB,
        max_reply_size: 8 * KIB,
        max_ddp_size: 8 * KIB,
        error_buffers: 2,
        ..Config::default()
    }
}

#[test]
fn miri_every_chunk_path_with_key_windows() {
    let mut p = Pair::with_key_windows(small(), small());
    let short = payload(100, 1);
    let bulk = payload(3000, 2);
    // Inline both ways.
    let h = send(&mut p, 1, &short, false, expect(KIB, None));
    p.drive();
    assert_eq!(returned_payload(&p, h), short);
    release_all(&mut p);
    // Read chunk for the argument, write chunk for the result.
    let h = send(&mut p, 2, &bulk, true, expect(8 * KIB, Some(4 * KIB)));
    p.drive();
    assert_eq!(returned_payload(&p, h), bulk);
    release_all(&mut p);
    // Read chunk in, reply chunk back.
    let h = send(&mut p, 3, &bulk, true, expect(8 * KIB, None));
    p.drive();
    assert_eq!(returned_payload(&p, h), bulk);
    release_all(&mut p);
    // A long call (position-zero read chunk) and a reply chunk.
    let h = send(&mut p, 4, &bulk, false, expect(8 * KIB, None));
    p.drive();
    assert_eq!(returned_payload(&p, h), bulk);
    release_all(&mut p);
    for side in [CLIENT, SERVER] {
        let (binds, invalidations) = p.key_ops[side];
        assert_eq!(binds, invalidations, "side {side}");
    }
    assert!(p.key_ops[CLIENT].0 >= 6, "{:?}", p.key_ops);
    close_and_check_leaks(&mut p);
}

#[test]
fn miri_receive_buffers_are_read_once_and_garbage_is_refused() {
    let mut p = Pair::new(small(), small());
    let h = send(
        &mut p,
        7,
        &payload(2000, 3),
        true,
        expect(4 * KIB, Some(4 * KIB)),
    );
    p.drive();
    assert_eq!(returned_payload(&p, h), payload(2000, 3));
    let received = p.sends_from(CLIENT).count() as u64;
    assert_eq!(p.peers[SERVER].conn.buffers().receive_reads(), received);
    // Garbage from a hostile peer: parsed from the private copy, answered
    // or dropped, never a panic.
    for (i, junk) in [&[0u8; 3][..], &[0xff; 40], &be(&[9, 1, 2, 0, 7, 7, 7])]
        .iter()
        .enumerate()
    {
        p.inject(CLIENT, junk.to_vec());
        p.drive();
        assert!(
            p.peers[SERVER].conn.buffers().receive_reads() > received + i as u64,
            "each message read once"
        );
    }
    release_all(&mut p);
    close_and_check_leaks(&mut p);
}

#[test]
fn miri_every_chunk_path_through_a_bulk_pool() {
    // The server's large calls and replies live in pool buffers reached
    // through raw pointers of a memory two connections share: Miri checks
    // the leased slices and the copies in and out of them.
    let pool = std::sync::Arc::new(BulkPool::on_heap(2, 8 * KIB).unwrap());
    let server = Config {
        max_outstanding_calls: 0,
        ..small()
    };
    let mut p = Pair::with_server_pool(small(), server, pool.clone());
    let mut q = Pair::with_server_pool(small(), server, pool.clone());
    let bulk = payload(3000, 3);
    for (xid, ddp, reply) in [
        (1, true, expect(8 * KIB, Some(4 * KIB))),
        (2, true, expect(8 * KIB, None)),
        (3, false, expect(8 * KIB, None)),
    ] {
        for pair in [&mut p, &mut q] {
            let h = send(pair, xid, &bulk, ddp, reply);
            pair.drive();
            assert_eq!(returned_payload(pair, h), bulk);
            release_all(pair);
        }
    }
    assert_eq!(pool.available(), 2);
    close_and_check_leaks(&mut p);
    close_and_check_leaks(&mut q);
}
