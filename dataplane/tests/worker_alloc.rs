//! No heap allocation per RPC in steady state, on both sides of
//! a worker + client pair over `shm`. The client is measured on the test
//! thread; the worker is measured from inside its own thread by a
//! dispatcher that samples the worker thread's allocation count at every
//! call (the whole loop runs between two samples: completions, engine,
//! service, posting, idle).

mod support;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dataplane::client::{CallOutcome, Client, Directed, MemKey, MemRange, ReplyTarget};
use dataplane::engine::DdpItem;
use dataplane::verbs::shm::Shm;
use dataplane::wire::rpc::ReplyHeader;
use dataplane::wire::rpc::{CallHeader, OpaqueAuth};
use dataplane::wire::xdr::Decoder;
use dataplane::wire::xdr::Encoder;
use dataplane::worker::{Dispatched, Dispatcher};
use support::alloc_counter::{measure, thread_allocations, CountingAllocator};
use support::worker_harness::*;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

const WARMUP: usize = 300;
const MEASURED: usize = 1200;

/// The bench service, plus a sample of the worker thread's allocation
/// count at every call (atomics only: sampling allocates nothing).
struct Sampling {
    inner: Arc<dyn Dispatcher>,
    samples: Vec<AtomicU64>,
    next: AtomicUsize,
}

impl Dispatcher for Sampling {
    fn dispatch(&self, call: &[u8], reply: &mut [u8]) -> Dispatched {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        if let Some(s) = self.samples.get(i) {
            s.store(thread_allocations(), Ordering::Relaxed);
        }
        self.inner.dispatch(call, reply)
    }
}

thread_local! {
    /// Where replies are copied to be checked (the client hands out views
    /// of memory the server wrote); sized once, so checking allocates
    /// nothing.
    static REPLY_COPY: std::cell::RefCell<Vec<u8>> =
        std::cell::RefCell::new(Vec::with_capacity(512 << 10));
}

/// One echo, checked byte-exact without allocating.
fn echo_checked(client: &mut Client, payload: &[u8], ddp: bool, target: ReplyTarget) {
    let call = client
        .call(target, |xid, buf| {
            encode_call(xid, ECHO, Arg::Opaque(payload, ddp), buf)
        })
        .unwrap();
    let CallOutcome::Reply { ddp_len, .. } = client.wait(call).unwrap() else {
        panic!("echo failed");
    };
    REPLY_COPY.with_borrow_mut(|copy| {
        copy.clear();
        let data = match ddp_len {
            Some(_) => {
                client.ddp(call).unwrap().append_to(copy);
                &copy[..]
            }
            None => {
                client.reply(call).unwrap().append_to(copy);
                let (_, hl) = ReplyHeader::parse(copy).unwrap();
                Decoder::new(&copy[hl..]).get_opaque(usize::MAX).unwrap()
            }
        };
        assert!(data == payload, "echo differs");
    });
    assert!(client.release(call));
}

/// A directed ECHO (docs/CLIENT.md): the argument pulled from `from`, the
/// result written into `into`, both application memory; checked
/// byte-exact, then a barrier on its operation id.
fn directed_echo(client: &mut Client, from: MemKey, into: MemKey, len: u32) {
    let (call, op) = client
        .call_directed(
            Directed {
                source: Some(MemRange {
                    key: from,
                    offset: 0,
                    len,
                }),
                target: Some(MemRange {
                    key: into,
                    offset: 0,
                    len,
                }),
            },
            |xid, buf| {
                let mut e = Encoder::new(buf);
                CallHeader::new(
                    xid,
                    BENCH_PROGRAM,
                    1,
                    ECHO,
                    OpaqueAuth::None,
                    OpaqueAuth::None,
                )
                .emit(&mut e)
                .ok()?;
                e.put_u32(len).ok()?;
                let offset = e.position() as u32;
                Some((e.position(), Some(DdpItem { offset, len })))
            },
        )
        .unwrap();
    assert!(client.barrier_wait(op).unwrap().complete);
    assert!(matches!(
        client.wait(call).unwrap(),
        CallOutcome::Reply { .. }
    ));
    assert!(client.release(call));
    let sent = client.region(from, 0, len).unwrap();
    let got = client.region(into, 0, len).unwrap();
    assert!(sent == got, "directed echo differs");
}

/// Every path in turn: inline, read chunk + write chunk, long call + reply
/// chunk, a pipelined burst, and a directed operation through application
/// memory.
fn round(
    client: &mut Client,
    small: &[u8],
    big: &[u8],
    calls: &mut [Option<dataplane::engine::CallHandle>; 4],
    keys: (MemKey, MemKey),
) -> usize {
    directed_echo(client, keys.0, keys.1, big.len() as u32);
    echo_checked(client, small, true, ReplyTarget::Inline);
    echo_checked(
        client,
        big,
        true,
        ReplyTarget::WriteChunk {
            max_ddp: big.len() as u32,
        },
    );
    echo_checked(client, big, false, ReplyTarget::ReplyChunk);
    for c in calls.iter_mut() {
        *c = Some(
            client
                .call(ReplyTarget::Inline, |xid, buf| {
                    encode_call(xid, ECHO, Arg::Opaque(small, false), buf)
                })
                .unwrap(),
        );
    }
    for c in calls.iter_mut() {
        let call = c.take().unwrap();
        assert!(matches!(
            client.wait(call).unwrap(),
            CallOutcome::Reply { .. }
        ));
        assert!(client.release(call));
    }
    8
}

#[test]
fn design_s4_no_heap_allocation_per_rpc_on_worker_and_client() {
    const MAX: u32 = 256 << 10;
    let sampling = Arc::new(Sampling {
        inner: bench_service(),
        samples: (0..WARMUP + MEASURED + 64)
            .map(|_| AtomicU64::new(0))
            .collect(),
        next: AtomicUsize::new(0),
    });
    let server = Server::with_dispatcher(1, engine_config(MAX, 4), sampling.clone());
    let mut engine = engine_config(MAX, 4);
    engine.app_memory = 2 * MAX;
    let mut client = Client::<Shm>::connect(&server.url, client_config(engine)).unwrap();
    let small = pattern(200, 1);
    let big = pattern(100_000, 2);
    let keys = (client.register(MAX).unwrap(), client.register(MAX).unwrap());
    client.write_region(keys.0, 0, &big).unwrap();
    let mut calls = [None; 4];
    let mut done = 0;
    while done < WARMUP {
        done += round(&mut client, &small, &big, &mut calls, keys);
    }
    let warm_index = sampling.next.load(Ordering::Relaxed);
    let (n, client_alloc) = measure(|| {
        let mut n = 0;
        while n < MEASURED {
            n += round(&mut client, &small, &big, &mut calls, keys);
        }
        n
    });
    let last_index = sampling.next.load(Ordering::Relaxed) - 1;
    assert_eq!(
        client_alloc.count, 0,
        "client allocated {client_alloc:?} over {n} RPCs"
    );
    // The sampler sees the worker thread's own allocations (its set-up
    // allocated before the first call), so a zero below means zero.
    assert!(sampling.samples[0].load(Ordering::Relaxed) > 0);
    let first = sampling.samples[warm_index].load(Ordering::Relaxed);
    let last = sampling.samples[last_index].load(Ordering::Relaxed);
    assert_eq!(
        last - first,
        0,
        "worker allocated {} times over {} RPCs",
        last - first,
        last_index - warm_index
    );
    assert!(last_index - warm_index >= MEASURED - 7);
    client.close().unwrap();
    assert_clean(&server.stop(Duration::from_secs(1)));
}
