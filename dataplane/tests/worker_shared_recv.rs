//! The worker's shared receive queue (docs/WORKER.md, "Shared receives"),
//! end to end over `shm` and `roce`: every connection of a worker
//! receives from one queue of a few buffers, fewer than the credits its
//! connections would grant in all; grants are cut to what the queue
//! backs, so pipelined calls from several clients are all served
//! byte-exact and no Send ever finds the queue empty; a connection the
//! queue cannot back is refused and the others keep their service; the
//! buffers are given back as the messages are copied out, so the queue
//! is full again at the end; and a connection's own memory no longer
//! holds a receive buffer per credit.

mod support;

use std::time::Duration;

use dataplane::client::{Client, ReplyTarget};
use dataplane::engine::Connection;
use dataplane::verbs::roce::Roce;
use dataplane::verbs::shm::Shm;
use dataplane::worker::PoolProvider;
use support::roce_pair::loopback_url;
use support::worker_harness::*;

const CLIENTS: usize = 6;
const DEPTH: usize = 8;
const QUEUE: u32 = 16;

/// `CLIENTS` clients, each allowed up to `DEPTH` credits, pipeline
/// `DEPTH` inline echoes each against one worker whose shared queue holds
/// `QUEUE` receives: 48 calls want to be in flight toward 16 buffers.
fn many_clients_share_a_few_receives<P: PoolProvider>(url: String) {
    let engine = engine_config(64 << 10, DEPTH as u32);
    let server = Server::<P>::at(url.clone(), 1, engine, bench_service(), |c| {
        c.shared_receives = QUEUE;
    });
    let queues = server.pool().set().shared_recvs::<P>();
    assert_eq!(queues.len(), 1, "one queue: one worker, one provider");
    let queue = queues[0].clone();
    assert_eq!(
        (queue.count(), queue.posted()),
        (QUEUE as usize, QUEUE as usize)
    );

    let mut clients: Vec<Client<P>> = (0..CLIENTS)
        .map(|_| Client::<P>::connect(&url, client_config(engine)).expect("connect"))
        .collect();
    let payloads: Vec<Vec<u8>> = (0..CLIENTS * DEPTH)
        .map(|i| pattern(200 + 8 * i, i as u8))
        .collect();
    pipelined_echoes(&mut clients, &payloads, DEPTH, ReplyTarget::Inline);
    let calls_made = (CLIENTS * (DEPTH + 1)) as u64;
    // Idle again: each connection keeps what the grants it sent may
    // still let its peer send (at least its floor), never more than the
    // queue holds.
    let reserved = queue.credits().reserved();
    assert!(
        (CLIENTS as u32..=QUEUE).contains(&reserved),
        "{reserved} receives reserved by {CLIENTS} idle connections on a queue of {QUEUE}"
    );
    assert!(
        queue.messages() >= calls_made,
        "every call arrived in the shared queue: {} messages for {calls_made} calls",
        queue.messages()
    );
    for c in clients {
        c.close().expect("close");
    }
    let report = server.stop(Duration::from_secs(5));
    assert_clean(&report);
    assert!(
        report.shared_recv_short.is_empty(),
        "{:?}",
        report.shared_recv_short
    );
    assert_eq!(queue.posted(), QUEUE as usize, "every receive posted again");
    let rpcs: u64 = report.workers.iter().map(|w| w.counters.rpcs).sum();
    assert_eq!(rpcs, calls_made);
}

/// A queue of 2 backs the floor of 2 connections: a third is refused,
/// and the first two are served all the same.
fn a_connection_the_queue_cannot_back_is_refused<P: PoolProvider>(url: String) {
    let engine = engine_config(64 << 10, DEPTH as u32);
    let server = Server::<P>::at(url.clone(), 1, engine, bench_service(), |c| {
        c.shared_receives = 2;
    });
    let mut clients: Vec<Client<P>> = (0..2)
        .map(|_| Client::<P>::connect(&url, client_config(engine)).expect("connect"))
        .collect();
    assert!(
        Client::<P>::connect(&url, client_config(engine)).is_err(),
        "a third connection has no receive to back it"
    );
    for (i, c) in clients.iter_mut().enumerate() {
        for k in 0..4 {
            let p = pattern(100 + k, i as u8);
            assert!(echo(c, &p, false, ReplyTarget::Inline).0 == p);
        }
    }
    for c in clients {
        c.close().expect("close");
    }
    let report = server.stop(Duration::from_secs(5));
    assert_clean(&report);
    let rpcs: u64 = report.workers.iter().map(|w| w.counters.rpcs).sum();
    assert_eq!(rpcs, 8);
}

#[test]
fn shm_a_connection_the_queue_cannot_back_is_refused() {
    a_connection_the_queue_cannot_back_is_refused::<Shm>(sock_url());
}

#[test]
fn roce_a_connection_the_queue_cannot_back_is_refused() {
    a_connection_the_queue_cannot_back_is_refused::<Roce>(loopback_url(""));
}

#[test]
fn shm_many_clients_share_a_few_receives() {
    many_clients_share_a_few_receives::<Shm>(sock_url());
}

#[test]
fn roce_many_clients_share_a_few_receives() {
    many_clients_share_a_few_receives::<Roce>(loopback_url(""));
}

#[test]
fn a_connection_on_shared_receives_owns_no_receive_buffer() {
    // rpcrdmad's defaults: 64 credits, 1 MiB messages, no requester slot,
    // a bulk pool. Its own receives are 64 inline-size buffers of peer
    // memory; on the shared queue it has none, and no peer memory at all.
    // Calls beyond its slots wait with their receive reserved, so it also
    // keeps fewer slots.
    let c = daemon_engine_config();
    let own = Connection::memory_len_pooled(&c).unwrap();
    let shared = Connection::memory_len_pooled(&dataplane::engine::Config {
        shared_receives: true,
        ..c
    })
    .unwrap();
    assert_eq!(own.peer, 64 * 4096, "one receive per credit");
    assert_eq!(shared.peer, 0, "{shared:?}");
    // And two responder slots of room instead of a quarter of the grant
    // (16): 14 slots of an inline Send and message buffer fewer.
    assert_eq!(own.private - shared.private, 14 * (4096 + 4096));
}
