//! The worker's bulk buffer pool (docs/WORKER.md, "Bulk buffers"), end to
//! end over `shm` and `roce`: connections of one worker lease their large
//! calls and replies from one pool; a pool smaller than the load makes
//! calls wait, never fail; every buffer comes back; and a connection's
//! own memory is inline-size buffers, not the largest message per slot.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use dataplane::client::{Client, ReplyTarget};
use dataplane::engine::{BulkPool, Connection};
use dataplane::service::Dispatch;
use dataplane::verbs::roce::Roce;
use dataplane::verbs::shm::Shm;
use dataplane::worker::{Dispatcher, PoolProvider};
use support::roce_pair::loopback_url;
use support::worker_harness::*;

const MAX: u32 = 256 << 10;
const CLIENTS: usize = 3;
const DEPTH: usize = 4;

/// How long a held call waits for the test to finish issuing the others:
/// past it the test is broken, not slow.
const HOLD_DEADLINE: Duration = Duration::from_secs(20);

/// The bench service behind a gate: while the gate is held, a call
/// reaching the handler waits for it to open. The worker runs handlers to
/// completion, so a call held there keeps its pool buffer leased and
/// stops the worker from finishing any exchange, while the clients keep
/// posting calls into the server's receive buffers.
struct Gated {
    inner: Arc<dyn Dispatcher>,
    held: AtomicBool,
    open: Mutex<bool>,
    opened: Condvar,
    overdue: AtomicBool,
}

impl Gated {
    fn new() -> Arc<Gated> {
        Arc::new(Gated {
            inner: bench_service(),
            held: AtomicBool::new(false),
            open: Mutex::new(false),
            opened: Condvar::new(),
            overdue: AtomicBool::new(false),
        })
    }

    fn hold(&self) {
        *self.open.lock().unwrap() = false;
        self.held.store(true, Ordering::SeqCst);
    }

    fn release(&self) {
        self.held.store(false, Ordering::SeqCst);
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }
}

impl Dispatcher for Gated {
    fn dispatch(&self, call: &[u8], reply: &mut [u8]) -> Dispatch {
        if self.held.load(Ordering::SeqCst) {
            let deadline = Instant::now() + HOLD_DEADLINE;
            let mut open = self.open.lock().unwrap();
            while !*open {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    self.overdue.store(true, Ordering::SeqCst);
                    break;
                }
                open = self.opened.wait_timeout(open, left).unwrap().0;
            }
        }
        self.inner.dispatch(call, reply)
    }
}

/// `CLIENTS` clients each pipeline `DEPTH` long echoes with a reply chunk
/// (a pool buffer each, for the call and then its reply) against one
/// worker whose pool holds one buffer: one exchange at a time fits. The
/// handler is held until every call is posted, so the first call served
/// keeps the only buffer while the other `CLIENTS * DEPTH - 1` are
/// already in the server's receive buffers: at least one finds the pool
/// empty, whatever the scheduling (a free-running worker could finish
/// each exchange before the next call arrived).
fn calls_wait_for_a_small_pool_and_all_are_served<P: PoolProvider>(url: String) {
    let engine = engine_config(MAX, DEPTH as u32);
    let gate = Gated::new();
    let server = Server::<P>::at(url.clone(), 1, engine, gate.clone(), |c| {
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
    pipelined_echoes_around(
        &mut clients,
        &payloads,
        DEPTH,
        ReplyTarget::ReplyChunk,
        || gate.hold(),
        || gate.release(),
    );
    assert!(
        !gate.overdue.load(Ordering::SeqCst),
        "a held call waited {HOLD_DEADLINE:?} for the others to be posted"
    );
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
