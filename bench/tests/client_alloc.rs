//! No heap allocation per RPC in steady state on the bench's
//! client side, for every in-process transport (`shm`, `tcp`, `roce`) and
//! every workload shape (NULL, pipelined NULL, ECHO across the inline
//! limit, READ into write chunks, WRITE as read chunks). The embedded
//! servers run on their own threads; the counts here are the test
//! thread's (the server side is proven in dataplane/tests/worker_alloc.rs).
//!
//! Two measurements: the driver's `start`/`poll` calls themselves, and the
//! whole timed loop (`driver::drive`): a run four times longer allocates
//! no more than a short one.

#[path = "../../dataplane/tests/support/alloc_counter.rs"]
#[allow(dead_code)]
mod alloc_counter;

use std::time::{Duration, Instant};

use alloc_counter::{measure, CountingAllocator};
use bench::driver::{drive, Reply, RpcDriver};
use bench::rdma::RdmaDriver;
use bench::tcp::TcpDriver;
use bench::transport::{Op, OpenOptions, RunSpec};
use dataplane::service::bench::{
    decode_data_reply, decode_ddp_reply, decode_void_reply, fill_pattern, Args,
};
use dataplane::verbs::roce::Roce;
use dataplane::verbs::shm::Shm;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

const WARMUP: u32 = 200;
const MEASURED: u32 = 1000;

/// The workloads: op, size, depth.
const SHAPES: &[(Op, u32, u32)] = &[
    (Op::Null, 0, 1),
    (Op::Null, 0, 16),
    (Op::Echo, 4097, 1),
    (Op::Read, 4096, 2),
    (Op::Read, 256 << 10, 8),
    (Op::Write, 256 << 10, 8),
];

/// Runs `calls` calls of `spec` keeping `spec.depth` in flight, decoding
/// each reply; returns how many replies decoded as the expected success.
fn run_calls<D: RpcDriver>(d: &mut D, spec: &RunSpec, data: &[u8], calls: u32) -> u32 {
    let args = match spec.op {
        Op::Null => Args::Null,
        Op::Echo => Args::Echo(data),
        Op::Read => Args::Source(spec.size),
        Op::Write => Args::Sink(data),
    };
    let depth = spec.depth.min(calls);
    for slot in 0..depth {
        d.start(slot, args).unwrap();
    }
    let (mut started, mut finished, mut good) = (depth, 0u32, 0u32);
    // Completed slots to restart; capacity reserved before the loop.
    let mut free = Vec::with_capacity(spec.depth as usize);
    let t0 = Instant::now();
    while finished < calls {
        free.clear();
        d.poll(|slot, r: Reply<'_>| {
            finished += 1;
            let ok = match spec.op {
                Op::Null | Op::Write => decode_void_reply(r.message).is_ok(),
                Op::Echo | Op::Read => match r.ddp {
                    Some(ddp) => {
                        ddp.len() == spec.size as usize
                            && decode_ddp_reply(r.message, ddp.len()).is_ok()
                    }
                    None => decode_data_reply(r.message, None)
                        .is_ok_and(|b| b.len() == spec.size as usize),
                },
            };
            good += u32::from(ok);
            free.push(slot);
        })
        .unwrap();
        for &slot in &free {
            if started < calls {
                d.start(slot, args).unwrap();
                started += 1;
            }
        }
        // A hang guard, not a speed bound.
        assert!(t0.elapsed() < Duration::from_secs(120), "calls hung");
    }
    good
}

fn check_driver<D: RpcDriver>(d: &mut D) {
    for &(op, size, depth) in SHAPES {
        let spec = RunSpec::new(op, size, depth, Duration::from_millis(10));
        d.prepare(&spec).unwrap();
        let mut data = vec![0u8; size as usize];
        fill_pattern(&mut data);
        assert_eq!(run_calls(d, &spec, &data, WARMUP), WARMUP);
        let (good, allocated) = measure(|| run_calls(d, &spec, &data, MEASURED));
        assert_eq!(good, MEASURED, "{} {op:?} {size}", d.name());
        // One Vec of `depth` slots per measurement (run_calls' own).
        assert!(
            allocated.count <= 1,
            "{} {op:?} size {size} depth {depth}: {allocated:?} over {MEASURED} calls",
            d.name()
        );
    }
}

#[test]
fn shm_client_allocates_nothing_per_call() {
    check_driver(&mut RdmaDriver::<Shm>::embedded("shm", &OpenOptions::default()).unwrap());
}

#[test]
fn roce_client_allocates_nothing_per_call() {
    check_driver(&mut RdmaDriver::<Roce>::embedded("roce", &OpenOptions::default()).unwrap());
}

#[test]
fn tcp_client_allocates_nothing_per_call() {
    check_driver(&mut TcpDriver::embedded(&OpenOptions::default()).unwrap());
}

#[test]
fn the_timed_loop_allocates_per_run_not_per_call() {
    let mut d = RdmaDriver::<Shm>::embedded("shm", &OpenOptions::default()).unwrap();
    for (op, size, depth) in [(Op::Null, 0, 4), (Op::Read, 65536, 4)] {
        let mut spec = RunSpec::new(op, size, depth, Duration::from_millis(50));
        spec.warmup_calls = 20;
        // The first run sizes the embedded server; not measured.
        drive(&mut d, &spec).unwrap();
        let (short, a_short) = measure(|| drive(&mut d, &spec).unwrap());
        assert!(short.calls > 0, "{op:?}: no call completed in a run");
        // The comparison proves something only when the long run made
        // clearly more calls than the short one. A timed run promises no
        // call count (a loaded machine may starve it), so lengthen the run
        // until it does; the cap means broken, not slow.
        let want = short.calls.saturating_mul(2).max(short.calls + 64);
        let mut long_ms = 200u64;
        let (long, a_long) = loop {
            spec.duration = Duration::from_millis(long_ms);
            let (long, a_long) = measure(|| drive(&mut d, &spec).unwrap());
            if long.calls >= want {
                break (long, a_long);
            }
            assert!(
                long_ms < 60_000,
                "{op:?}: a {long_ms} ms run made {} calls, not the {want} wanted",
                long.calls
            );
            long_ms *= 2;
        };
        // A run reconnects (a fixed number of allocations); the calls in
        // it add none. Slack for buffers that may grow once.
        assert!(
            a_long.count <= a_short.count + 8,
            "{op:?}: {} calls allocated {a_short:?}, {} calls {a_long:?}",
            short.calls,
            long.calls
        );
    }
}
