//! Idle connections cost a worker nothing per iteration: the connections
//! it accepts share its completion queue, every completion is routed to
//! its connection, and only connections with work are processed.
//!
//! One worker, 64 idle connections (each served one NULL first, so it is
//! really established) and a busy one: 200 NULL calls on the busy one
//! process at most a few endpoints per call (the counter
//! `endpoints_processed`), where polling every connection would process
//! 65 per iteration. Over `shm` and `roce`. Counts only, no timing.
mod support;

use dataplane::client::{CallOutcome, Client, ReplyTarget};
use dataplane::engine::CallHandle;
use dataplane::service::bench::{self, Args};
use dataplane::verbs::roce::Roce;
use dataplane::verbs::shm::Shm;
use dataplane::worker::PoolProvider;
use support::roce_pair::loopback_url;
use support::worker_harness::*;

const IDLE: usize = 64;
const CALLS: u64 = 200;

fn null<P: PoolProvider>(client: &mut Client<P>) {
    let call = queue_null(client);
    expect_void_reply(client, call);
}

/// Queues a bench NULL call.
fn queue_null<P: PoolProvider>(client: &mut Client<P>) -> CallHandle {
    client
        .call(ReplyTarget::Inline, |xid, buf| {
            bench::encode_call(buf, xid, Args::Null)
                .ok()
                .map(|e| (e.len, e.ddp))
        })
        .expect("call")
}

/// Waits for `call`'s reply, which must be SUCCESS with no results.
fn expect_void_reply<P: PoolProvider>(client: &mut Client<P>, call: CallHandle) {
    let outcome = client.wait(call).expect("reply");
    assert!(matches!(outcome, CallOutcome::Reply { .. }), "{outcome:?}");
    bench::decode_void_reply(&client.reply(call).map(|b| b.to_vec()).unwrap()).expect("void reply");
    assert!(client.release(call));
}

fn idle_connections_are_not_processed<P: PoolProvider>(url: String) {
    let engine = engine_config(4096, 4);
    let server = Server::<P>::at(url.clone(), 1, engine, bench_service(), |_| {});
    let mut idle: Vec<Client<P>> = (0..IDLE)
        .map(|_| Client::<P>::connect(&url, client_config(engine)).expect("connect"))
        .collect();
    for c in idle.iter_mut() {
        null(c);
    }
    let mut busy = Client::<P>::connect(&url, client_config(engine)).expect("connect");
    null(&mut busy);
    let before = server.pool().snapshot()[0];
    assert_eq!(before.connections, IDLE as u64 + 1);
    for _ in 0..CALLS {
        null(&mut busy);
    }
    let after = server.pool().snapshot()[0];
    assert_eq!(after.rpcs - before.rpcs, CALLS);
    let processed = after.endpoints_processed - before.endpoints_processed;
    // A call is a receive completion and a send completion, often handled
    // in separate iterations; anything near IDLE per call means the idle
    // connections were looked at.
    assert!(
        processed <= 3 * CALLS,
        "{processed} endpoints processed for {CALLS} calls with {IDLE} idle connections"
    );
    println!(
        "{}: {processed} endpoints processed for {CALLS} calls",
        P::SCHEME
    );
    drop(idle);
    drop(busy);
    assert_clean(&server.stop(std::time::Duration::from_secs(5)));
}

#[test]
fn shm_idle_connections_are_not_processed() {
    idle_connections_are_not_processed::<Shm>(sock_url());
}

#[test]
fn roce_idle_connections_are_not_processed() {
    idle_connections_are_not_processed::<Roce>(loopback_url(""));
}

/// A park longer than any deadline here: a worker or client that only
/// woke at its park's timeout would fail the test, not slow it down.
const HOUR: std::time::Duration = std::time::Duration::from_secs(3600);

/// Waits (deadline: broken) until worker 0's counters satisfy `cond`.
fn until<P: PoolProvider>(
    server: &Server<P>,
    what: &str,
    cond: impl Fn(&dataplane::worker::WorkerSnapshot) -> bool,
) -> dataplane::worker::WorkerSnapshot {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let s = server.pool().snapshot()[0];
        if cond(&s) {
            return s;
        }
        assert!(std::time::Instant::now() < deadline, "{what}: {s:?}");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// A sleeping worker answers a call at once: the client's message rings
/// the worker's doorbell (`shm`: the client's Send; `roce`: the device's
/// thread, which drives a sleeping worker's queue pairs, announcing the
/// completion), the reply rings the sleeping client's, and a stop rings
/// the worker's control doorbell. Both sides park for an hour at a time
/// (adaptive idle) and no engine deadline is near, so each step can only
/// finish through a doorbell: the calls complete within the client's
/// wait timeout, and at the end every sleep the worker took was ended by
/// a doorbell, none by its timeout.
fn sleeping_worker_and_client_are_woken<P: PoolProvider>(url: String) {
    use dataplane::worker::IdleStrategy;
    let engine = engine_config(4096, 4);
    let server = Server::<P>::at(url.clone(), 1, engine, bench_service(), |c| {
        c.idle = IdleStrategy::Adaptive { park_max: HOUR }
    });
    let mut config = client_config(engine);
    config.idle = IdleStrategy::Adaptive { park_max: HOUR };
    let mut client = Client::<P>::connect(&url, config).expect("connect");
    null(&mut client);
    for round in 0..3 {
        // Asleep now: a sleep begun and not yet ended (none ends by its
        // timeout here, as the end of the test checks).
        let asleep = until(&server, &format!("round {round}: never slept"), |s| {
            s.sleeps > s.doorbell_wakeups
        });
        null(&mut client);
        until(&server, &format!("round {round}: not counted"), |s| {
            s.rpcs == asleep.rpcs + 1
        });
    }
    drop(client);
    until(&server, "never slept before the stop", |s| {
        s.sleeps > s.doorbell_wakeups
    });
    // The stop wakes the sleeping worker through its control doorbell.
    stop_sleeping_workers(move || server.stop(std::time::Duration::from_secs(1)));
}

#[test]
fn shm_a_sleeping_worker_and_client_are_woken_by_their_doorbells() {
    sleeping_worker_and_client_are_woken::<Shm>(sock_url());
}

#[test]
fn roce_a_sleeping_worker_and_client_are_woken_by_their_doorbells() {
    sleeping_worker_and_client_are_woken::<Roce>(loopback_url(""));
}

/// A backend for the bench program that answers each call (SUCCESS, no
/// results) only when the test says so: it reports each call it read on
/// `got`, then waits for a word on the returned sender before replying.
fn held_backend(
    got: std::sync::mpsc::Sender<u32>,
) -> (std::net::SocketAddr, std::sync::mpsc::Sender<()>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (release, released) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        let Ok((mut s, _)) = listener.accept() else {
            return;
        };
        loop {
            let mut mark = [0u8; 4];
            if s.read_exact(&mut mark).is_err() {
                return;
            }
            let len = (u32::from_be_bytes(mark) & 0x7fff_ffff) as usize;
            assert!(len <= 4096, "a call record of {len} bytes");
            let mut msg = vec![0u8; len];
            if s.read_exact(&mut msg).is_err() {
                return;
            }
            let xid = u32::from_be_bytes(msg[..4].try_into().unwrap());
            if got.send(xid).is_err() || released.recv().is_err() {
                return;
            }
            // Record mark, XID, REPLY, MSG_ACCEPTED, AUTH_NONE verifier,
            // SUCCESS (RFC 5531 s9).
            let mut rec = Vec::new();
            for w in [0x8000_0000u32 | 24, xid, 1, 0, 0, 0, 0] {
                rec.extend_from_slice(&w.to_be_bytes());
            }
            if s.write_all(&rec).is_err() {
                return;
            }
        }
    });
    (addr, release)
}

/// A worker whose relay waits for a gateway backend sleeps on the
/// backend's socket: the reply ends the sleep (docs/WORKER.md,
/// "Doorbells"). The bench program is routed to a backend that holds each
/// reply until the worker is asleep; the worker parks for an hour and the
/// relay's call timeout is an hour too, so only the socket can wake it in
/// time: every call is answered within the client's wait, and at the end
/// every sleep the worker took was ended by a doorbell, none by a timeout
/// (the relay once capped such a sleep at a millisecond, which ended by
/// its timeout).
#[test]
fn shm_a_sleeping_gateway_worker_is_woken_by_its_backends_reply() {
    use dataplane::gateway::{GatewayConfig, Route};
    use dataplane::worker::{GatewaySetup, IdleStrategy};
    let (got, calls_seen) = std::sync::mpsc::channel();
    let (backend, release) = held_backend(got);
    let gateway = GatewayConfig {
        routes: vec![Route {
            program: BENCH_PROGRAM,
            versions: 1..=1,
            backend,
            connections: 1,
        }],
        call_timeout: HOUR,
        ..GatewayConfig::default()
    };
    let engine = engine_config(4096, 4);
    let url = sock_url();
    let server = Server::<Shm>::at(url.clone(), 1, engine, bench_service(), |c| {
        c.idle = IdleStrategy::Adaptive { park_max: HOUR };
        c.gateway = Some(GatewaySetup {
            config: std::sync::Arc::new(gateway),
        });
    });
    let mut config = client_config(engine);
    config.idle = IdleStrategy::Adaptive { park_max: HOUR };
    let mut client = Client::<Shm>::connect(&url, config).expect("connect");
    for round in 0..3 {
        let call = queue_null(&mut client);
        // `call` queues; the client's progress sends (a Send can wait in
        // the provider for the server's first receives).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while calls_seen.try_recv().is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "round {round}: the call never reached the backend: {:?}",
                server.pool().snapshot()[0]
            );
            client.progress();
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
        // The worker forwarded the call awake; a sleep seen now began
        // after that, with the reply due.
        until(&server, &format!("round {round}: never slept"), |s| {
            s.sleeps > s.doorbell_wakeups
        });
        release.send(()).unwrap();
        expect_void_reply(&mut client, call);
    }
    drop(client);
    until(&server, "never slept before the stop", |s| {
        s.sleeps > s.doorbell_wakeups
    });
    stop_sleeping_workers(move || server.stop(std::time::Duration::from_secs(1)));
}
