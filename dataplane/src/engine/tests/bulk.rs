//! The bulk buffer pool (`engine::bulk`): a responder owns inline-size
//! message buffers and leases the pool's for large calls and replies, one
//! exchange at a time; an empty pool makes calls wait, never fail.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use super::*;

/// A pool of `count` buffers for [`cfg`]'s largest message.
fn pool(count: u32) -> Arc<BulkPool> {
    Arc::new(BulkPool::on_heap(count, cfg().max_call_size).expect("pool"))
}

/// Drives `p` with a server that keeps the first call it gets and does
/// not answer it (its exchange, and any pool buffer, stay held): the
/// call and its XID.
fn hold_first_call(p: &mut Pair) -> (IncomingCall, u32) {
    let mut held = None;
    p.drive_with(&mut |side, _, _, ev| {
        if let (SERVER, Event::CallArrived { call, xid, .. }) = (side, ev) {
            held.get_or_insert((call, xid));
        }
    });
    held.expect("call arrived")
}

/// Answers a call [`hold_first_call`] kept with its echo, and drives `p`
/// until the exchange is over.
fn answer_held_call(p: &mut Pair, (call, xid): (IncomingCall, u32)) {
    let now = p.now;
    let echoed = echo_payload(p.conn(SERVER).call_message(call).expect("call")).unwrap();
    reply_echo(p.conn(SERVER), now, call, xid, &echoed);
    p.drive();
}

/// Drives `p` (echo server) for `d` of virtual time, not until it
/// settles: a call waiting for the pool retries for as long as it waits.
fn drive_for(p: &mut Pair, d: core::time::Duration) {
    let until = p.now.saturating_add(d);
    p.drive_until(until);
}

#[test]
fn a_pooled_responder_owns_inline_buffers_only() {
    let c = cfg();
    let own = Connection::memory_len(&c).unwrap();
    let pooled = Connection::memory_len_pooled(&c).unwrap();
    // Every responder slot without its largest-message buffer (what the
    // pool holds instead), now an inline-size one.
    let largest = c.max_call_size.max(c.max_reply_size);
    let inline = c.inline_recv_size.max(c.inline_send_size);
    let saved = c.responder_slots() as usize * (largest - inline) as usize;
    assert_eq!(pooled.private + saved, own.private);
    assert_eq!(
        pooled.peer, own.peer,
        "the peer-writable region is the same"
    );
}

#[test]
fn large_calls_and_replies_lease_pool_buffers_for_their_exchange_only() {
    let pool = pool(4);
    let mut p = Pair::with_server_pool(cfg(), cfg(), pool.clone());
    // What each call held while the server executed it.
    let leased = Rc::new(RefCell::new(Vec::new()));
    let seen = leased.clone();
    let small = payload(100, 1);
    let ddp = payload(100_000, 2);
    let long = payload(60_000, 3);
    let h1 = send(&mut p, 1, &small, false, expect(4 * KIB, None));
    let h2 = send(&mut p, 2, &ddp, true, expect(200 * KIB, Some(128 * KIB)));
    let h3 = send(&mut p, 3, &long, false, expect(64 * KIB, None));
    p.drive_with(&mut |side, conn, now, ev| {
        if let (SERVER, Event::CallArrived { xid, .. }) = (side, ev) {
            seen.borrow_mut().push((xid, conn.resources().bulk_leased));
        }
        echo_service(side, conn, now, ev);
    });
    assert_eq!(returned_payload(&p, h1), small);
    assert_eq!(returned_payload(&p, h2), ddp);
    assert_eq!(returned_payload(&p, h3), long);
    let mut held = leased.borrow().clone();
    held.sort_unstable();
    // An inline call without chunks needs nothing; a call offering a
    // write chunk leases a buffer (its DDP item is placed there); a long
    // call leases one for the call, which then holds its reply too. The
    // counts include exchanges still finishing when the next call
    // arrived: the long call finds the DDP call's buffer still leased.
    assert_eq!(held.len(), 3);
    assert_eq!(held[0], (1, 0), "inline call, inline reply: no lease");
    assert!(held[1].1 >= 1, "write chunk offered: a buffer {held:?}");
    assert!(
        held[2].1 >= 2,
        "long call: its buffer and the one still finishing {held:?}"
    );
    assert_eq!(p.peers[SERVER].conn.stats().bulk_pool_empty, 0);
    assert_eq!(pool.available(), 4, "every lease back after its exchange");
    close_and_check_leaks(&mut p);
}

#[test]
fn a_call_that_finds_the_pool_empty_waits_and_is_served_once_another_connection_gives_back() {
    // Two connections of one worker share a pool of one buffer. The
    // first holds it (a long call, still executing); the second's long
    // call must wait, not fail, and is served after the first replies.
    let pool = pool(1);
    let mut a = Pair::with_server_pool(cfg(), cfg(), pool.clone());
    let mut b = Pair::with_server_pool(cfg(), cfg(), pool.clone());
    let long = payload(60_000, 4);
    let ha = send(&mut a, 10, &long, false, expect(64 * KIB, None));
    let held = hold_first_call(&mut a);
    assert_eq!(pool.available(), 0, "the executing call holds the buffer");

    let hb = send(&mut b, 20, &long, false, expect(64 * KIB, None));
    drive_for(&mut b, core::time::Duration::from_millis(5));
    let waits = b.peers[SERVER].conn.stats().bulk_pool_empty;
    assert!(waits >= 2, "tried again while the pool was empty: {waits}");
    assert!(reply_of(&b, hb).is_none(), "no reply without a buffer");
    assert!(failures(&b).is_empty(), "waiting is not failing");

    // The first connection answers; its exchange ends and gives back.
    answer_held_call(&mut a, held);
    assert_eq!(returned_payload(&a, ha), long);
    assert_eq!(pool.available(), 1);

    b.drive();
    assert_eq!(returned_payload(&b, hb), long);
    assert_eq!(pool.available(), 1);
    close_and_check_leaks(&mut a);
    close_and_check_leaks(&mut b);
}

#[test]
fn a_connection_closed_mid_exchange_gives_its_leases_back() {
    let pool = pool(1);
    let mut p = Pair::with_server_pool(cfg(), cfg(), pool.clone());
    let long = payload(60_000, 5);
    send(&mut p, 30, &long, false, expect(64 * KIB, None));
    // The server never answers; the client gives up on the connection.
    p.drive_with(&mut |_, _, _, _| {});
    assert_eq!(pool.available(), 0);
    close_and_check_leaks(&mut p);
    assert_eq!(pool.available(), 1, "the close's flush returned it");
    // And a dropped connection returns whatever it still held.
    let mut q = Pair::with_server_pool(cfg(), cfg(), pool.clone());
    send(&mut q, 31, &long, false, expect(64 * KIB, None));
    q.drive_with(&mut |_, _, _, _| {});
    assert_eq!(pool.available(), 0);
    // A connection waiting for the buffer stops counting as a waiter
    // when it closes.
    let mut r = Pair::with_server_pool(cfg(), cfg(), pool.clone());
    send(&mut r, 32, &long, false, expect(64 * KIB, None));
    drive_for(&mut r, core::time::Duration::from_millis(1));
    assert_eq!(pool.waiters(), 1);
    close_and_check_leaks(&mut r);
    assert_eq!(pool.waiters(), 0);
    drop(q);
    assert_eq!(pool.available(), 1);
}

#[test]
fn a_pool_is_refused_where_replies_may_be_exposed_or_messages_do_not_fit() {
    let exposing = Config {
        reply_read_chunks: true,
        ..cfg()
    };
    assert_eq!(
        Connection::with_bulk_pool(exposing, None, pool(2)).err(),
        Some(ConfigError::BulkPoolWithExposedReplies)
    );
    let small = Arc::new(BulkPool::on_heap(2, 64 * KIB).unwrap());
    assert_eq!(
        Connection::with_bulk_pool(cfg(), None, small).err(),
        Some(ConfigError::BulkPoolTooSmall { buf_len: 64 * KIB })
    );
}

#[test]
fn a_pure_server_has_no_requester_slots_and_still_serves() {
    // A server that never calls (max_outstanding_calls 0) carries no
    // requester buffers: with a pool its memory is receives and
    // inline-size slots.
    let server = Config {
        max_outstanding_calls: 0,
        ..cfg()
    };
    let with = Connection::memory_len_pooled(&cfg()).unwrap();
    let without = Connection::memory_len_pooled(&server).unwrap();
    let requester = cfg().max_outstanding_calls as usize
        * (cfg().max_call_size + cfg().max_reply_size + cfg().max_ddp_size) as usize;
    assert!(with.private + with.peer >= without.private + without.peer + requester);
    let mut p = Pair::with_server_pool(cfg(), server, pool(4));
    let data = payload(100_000, 6);
    let h = send(&mut p, 40, &data, true, expect(200 * KIB, Some(128 * KIB)));
    p.drive();
    assert_eq!(returned_payload(&p, h), data);
    let (msg, _) = echo_call(41, b"back");
    let now = p.now;
    let refused = p.conn(SERVER).send_call(
        now,
        &OutgoingCall {
            message: &msg,
            ddp: None,
            reply: expect(4 * KIB, None),
            app: AppChunks::NONE,
        },
    );
    assert_eq!(refused.err(), Some(SendCallError::NoSlot));
    close_and_check_leaks(&mut p);
}

#[test]
fn a_freed_buffer_is_kept_for_a_waiting_connection_not_taken_by_a_new_call() {
    // A holds the only buffer and B waits for it. When A gives it back, a
    // call that arrives on C in the meantime must not take it: it waits
    // too, and B, which waited first, is served.
    let pool = pool(1);
    let mut a = Pair::with_server_pool(cfg(), cfg(), pool.clone());
    let mut b = Pair::with_server_pool(cfg(), cfg(), pool.clone());
    let mut c = Pair::with_server_pool(cfg(), cfg(), pool.clone());
    let long = payload(60_000, 7);
    let ha = send(&mut a, 1, &long, false, expect(64 * KIB, None));
    let held = hold_first_call(&mut a);
    let hb = send(&mut b, 2, &long, false, expect(64 * KIB, None));
    drive_for(&mut b, core::time::Duration::from_millis(1));
    assert_eq!(pool.waiters(), 1, "B waits");

    answer_held_call(&mut a, held);
    assert_eq!(returned_payload(&a, ha), long);
    assert_eq!(pool.available(), 1, "A gave it back");

    // C's call arrives before B's next retry (100 µs): it must not win.
    let hc = send(&mut c, 3, &long, false, expect(64 * KIB, None));
    drive_for(&mut c, core::time::Duration::from_micros(50));
    assert!(
        c.peers[SERVER].conn.stats().bulk_pool_empty >= 1,
        "C waited"
    );
    assert_eq!(pool.available(), 1, "the buffer was kept for B");
    assert_eq!(pool.waiters(), 2);

    b.drive();
    assert_eq!(returned_payload(&b, hb), long);
    c.drive();
    assert_eq!(returned_payload(&c, hc), long);
    assert_eq!((pool.available(), pool.waiters()), (1, 0));
    for p in [&mut a, &mut b, &mut c] {
        close_and_check_leaks(p);
    }
}
