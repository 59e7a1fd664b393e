//! The worker's bulk buffer pool (docs/WORKER.md, "Bulk buffers"), end to
//! end over `shm` and `roce`: connections of one worker lease their large
//! calls and replies from one pool; a pool smaller than the load makes
//! calls wait, never fail; every buffer comes back; and a connection's
//! own memory is inline-size buffers, not the largest message per slot.

mod support;

use std::sync::Arc;
use std::time::Duration;

use dataplane::client::{Client, ReplyTarget};
use dataplane::engine::{BulkPool, Connection};
use dataplane::verbs::roce::Roce;
use dataplane::verbs::shm::Shm;
use dataplane::worker::PoolProvider;
use support::roce_pair::loopback_url;
use support::worker_harness::*;

const MAX: u32 = 256 << 10;
const CLIENTS: usize = 3;
const DEPTH: usize = 4;

/// `CLIENTS` clients each pipeline `DEPTH` long echoes with a reply chunk
/// (a pool buffer each, for the call and then its reply) against one
/// worker whose pool holds one buffer: one exchange at a time fits.
fn calls_wait_for_a_small_pool_and_all_are_served<P: PoolProvider>(url: String) {
    let engine = engine_config(MAX, DEPTH as u32);
    let server = Server::<P>::at(url.clone(), 1, engine, bench_service(), |c| {
        c.bulk_buffers = 1;
    });
    let pools: Vec<Arc<BulkPool>> = server
        .pool()
        .set()
        .bulk_pools()
        .into_iter()
        .map(|(_, p)| p)
        .collect();
    assert_eq!(pools.len(), 1, "one pool: one worker, one provider");
    let pool = pools[0].clone();
    assert_eq!(pool.count(), 1);
    assert!(pool.buf_len() >= engine.max_call_size.max(engine.max_reply_size));

    let mut clients: Vec<Client<P>> = (0..CLIENTS)
        .map(|_| Client::<P>::connect(&url, client_config(engine)).expect("connect"))
        .collect();
    let payloads: Vec<Vec<u8>> = (0..CLIENTS * DEPTH)
        .map(|i| pattern(100_000 + 4 * i, i as u8))
        .collect();
    pipelined_echoes(&mut clients, &payloads, DEPTH, ReplyTarget::ReplyChunk);
    assert!(
        pool.times_empty() > 0,
        "{} calls in flight needing a buffer each against a pool of one: some waited",
        CLIENTS * DEPTH
    );
    for c in clients {
        c.close().expect("close");
    }
    let report = server.stop(Duration::from_secs(5));
    assert_clean(&report);
    assert!(report.bulk_short.is_empty(), "{:?}", report.bulk_short);
    assert_eq!(pool.available(), pool.count(), "every buffer back");
    let rpcs: u64 = report.workers.iter().map(|w| w.counters.rpcs).sum();
    assert_eq!(rpcs, (CLIENTS * (DEPTH + 1)) as u64);
}

#[test]
fn shm_calls_wait_for_a_small_pool_and_all_are_served() {
    calls_wait_for_a_small_pool_and_all_are_served::<Shm>(sock_url());
}

#[test]
fn roce_calls_wait_for_a_small_pool_and_all_are_served() {
    calls_wait_for_a_small_pool_and_all_are_served::<Roce>(loopback_url(""));
}

#[test]
fn a_server_connection_with_a_pool_owns_about_a_megabyte_not_a_hundred() {
    // rpcrdmad's defaults: 64 credits, 1 MiB messages (plus headers), no
    // requester slot. Every responder slot (80) owning a buffer of the
    // largest message is 80 MiB; with the pool a slot owns an inline-size
    // one.
    let c = daemon_engine_config();
    let own = Connection::memory_len(&c).unwrap();
    let pooled = Connection::memory_len_pooled(&c).unwrap();
    let (own, pooled) = (own.private + own.peer, pooled.private + pooled.peer);
    assert!(own > 80 << 20, "{own} bytes without a pool");
    assert!(pooled < 1 << 20, "{pooled} bytes with a pool");
}
