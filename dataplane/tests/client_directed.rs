//! Directed operations (docs/CLIENT.md) end to end: a worker pool serving
//! the bench program, a client with application memory, over `shm` and
//! `roce` (loopback). READ-like operations land SOURCE's bytes in the
//! application's range by RDMA Write; WRITE-like ones let the server pull
//! the argument from it by RDMA Read; ECHO does both. Operation ids,
//! the barrier's high-water mark, refused access to ranges in flight and
//! deregistration are checked on both providers.

mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use dataplane::client::{
    CallOutcome, Client, ClientError, Directed, MemKey, MemRange, OpId, ReplyTarget,
};
use dataplane::engine::DdpItem;
use dataplane::service::bench::{pattern_mismatch, PROGRAM};
use dataplane::verbs::roce::Roce;
use dataplane::verbs::shm::Shm;
use dataplane::verbs::Provider;
use dataplane::wire::rpc::{CallHeader, OpaqueAuth};
use dataplane::wire::xdr::Encoder;
use dataplane::worker::PoolProvider;
use support::worker_harness::{
    assert_clean, bench_service, client_config, decode_opaque_reply, engine_config, sock_url,
    Server, ECHO, SINK, SOURCE,
};

const MAX: u32 = 1 << 20;
const APP: u32 = 8 << 20;
const DEPTH: u32 = 8;

fn roce_url() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let pid = std::process::id();
    format!(
        "roce://127.{}.{}.{}:20051",
        30 + (pid >> 8) % 60,
        pid % 250 + 1,
        n % 250 + 1
    )
}

fn connect<P: Provider>(url: &str) -> Client<P> {
    let mut engine = engine_config(MAX, DEPTH);
    engine.app_memory = APP;
    Client::<P>::connect(url, client_config(engine)).expect("connect")
}

/// A bench call header, then the caller's arguments.
fn header(xid: u32, proc_: u32, buf: &mut [u8]) -> Option<Encoder<'_>> {
    let mut e = Encoder::new(buf);
    CallHeader::new(xid, PROGRAM, 1, proc_, OpaqueAuth::None, OpaqueAuth::None)
        .emit(&mut e)
        .ok()?;
    Some(e)
}

/// SOURCE(count): the result lands in `target`.
fn source<P: Provider>(
    c: &mut Client<P>,
    target: MemRange,
) -> (dataplane::engine::CallHandle, OpId) {
    c.call_directed(
        Directed {
            source: None,
            target: Some(target),
        },
        |xid, buf| {
            let mut e = header(xid, SOURCE, buf)?;
            e.put_u32(target.len).ok()?;
            Some((e.position(), None))
        },
    )
    .expect("directed SOURCE")
}

/// ECHO (or SINK) of `source`'s bytes, pulled by the server from
/// application memory: the message ends with the length word (the data
/// and its padding are the read chunk).
fn from_app<P: Provider>(
    c: &mut Client<P>,
    proc_: u32,
    source: MemRange,
    target: Option<MemRange>,
) -> Result<(dataplane::engine::CallHandle, OpId), ClientError> {
    c.call_directed(
        Directed {
            source: Some(source),
            target,
        },
        |xid, buf| {
            let mut e = header(xid, proc_, buf)?;
            e.put_u32(source.len).ok()?;
            let offset = e.position() as u32;
            Some((
                e.position(),
                Some(DdpItem {
                    offset,
                    len: source.len,
                }),
            ))
        },
    )
}

fn range(key: MemKey, offset: u32, len: u32) -> MemRange {
    MemRange { key, offset, len }
}

fn expect_reply<P: Provider>(
    c: &mut Client<P>,
    call: dataplane::engine::CallHandle,
) -> Option<u32> {
    match c.wait(call).expect("reply") {
        CallOutcome::Reply { ddp_len, .. } => ddp_len,
        CallOutcome::Failed(f) => panic!("call failed: {f:?}"),
    }
}

fn directed_operations<P: PoolProvider>(url: String) {
    // A server connection sends no calls: one requester slot.
    let server = Server::<P>::at(url, 1, engine_config(MAX, DEPTH), bench_service(), |c| {
        c.endpoint.engine.max_outstanding_calls = 1
    });
    let mut c = connect::<P>(&server.url);

    // Keys: registered once, reused by every operation below.
    let reads = c.register(DEPTH * 256 * 1024).unwrap();
    let writes = c.register(1 << 20).unwrap();
    let echoed = c.register(1 << 20).unwrap();
    assert!(matches!(
        c.register(APP),
        Err(ClientError::NoAppMemory { .. })
    ));

    // READ-like: SOURCE of sizes around the inline limit and chunk
    // boundaries, DEPTH in flight into distinct ranges of one region.
    let sizes = [1u32, 4095, 4096, 4097, 65_536, 200_001, 256 * 1024];
    let mut ids = Vec::new();
    let mut calls = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        let (call, op) = source(&mut c, range(reads, i as u32 * 256 * 1024, n));
        ids.push(op);
        calls.push((call, i as u32 * 256 * 1024, n));
    }
    // Operation ids increase by one.
    for w in ids.windows(2) {
        assert_eq!(w[1].0, w[0].0 + 1);
    }
    // Nothing has been polled yet, so every operation is still in flight
    // (completions are taken only by poll/wait/barrier_wait): its target
    // cannot be read, written, reused or deregistered.
    let (_, first_off, first_len) = calls[0];
    let last = *ids.last().unwrap();
    assert_eq!(
        c.barrier(last),
        dataplane::client::Barrier {
            high_water: OpId(0),
            complete: false
        }
    );
    match c.region(reads, first_off, first_len) {
        Err(ClientError::InFlight(op)) => assert_eq!(op, ids[0]),
        other => panic!("read a target in flight: {other:?}"),
    }
    match c.deregister(reads) {
        Err(ClientError::InFlight(_)) => {}
        other => panic!("deregistered a region in flight: {other:?}"),
    }
    let b = c.barrier_wait(last).expect("barrier");
    assert!(b.complete && b.high_water >= last);
    for (call, off, n) in calls {
        let ddp_len = expect_reply(&mut c, call);
        // The server used our write chunk for every size (its reply
        // otherwise carries the data inline).
        assert_eq!(ddp_len, Some(n), "SOURCE({n}) by write chunk");
        assert_eq!(c.ddp(call).map(|b| b.len()), Some(n as usize));
        let got = c.region(reads, off, n).expect("completed range readable");
        assert_eq!(
            pattern_mismatch(&got.to_vec()),
            None,
            "SOURCE({n}) bytes in app memory"
        );
        assert!(c.release(call));
    }

    // One more, not polled: refused while in flight, and the barrier
    // reports the previous high-water mark until it completes.
    let (held, held_op) = source(&mut c, range(reads, 0, 64 * 1024));
    assert_eq!(held_op.0, last.0 + 1);
    assert_eq!(
        c.barrier(held_op),
        dataplane::client::Barrier {
            high_water: last,
            complete: false
        }
    );
    assert!(c.barrier(last).complete);
    match c.write_region(reads, 1000, &[0u8; 10]) {
        Err(ClientError::InFlight(op)) => assert_eq!(op, held_op),
        other => panic!("handed out a range in flight: {other:?}"),
    }
    // Outside the operation's range the region is the application's.
    assert!(c.write_region(reads, 64 * 1024, &[0u8; 10]).is_ok());
    match c.deregister(reads) {
        Err(ClientError::InFlight(op)) => assert_eq!(op, held_op),
        other => panic!("deregister while in flight: {other:?}"),
    }
    // The same target range twice is refused.
    assert!(matches!(
        c.call_directed(
            Directed {
                source: None,
                target: Some(range(reads, 0, 8)),
            },
            |_, _| None,
        ),
        Err(ClientError::InFlight(op)) if op == held_op
    ));
    expect_reply(&mut c, held);
    assert!(c.release(held));
    assert!(c.barrier(held_op).complete);
    assert_eq!(c.high_water(), held_op);

    // WRITE-like: SINK pulls from app memory; ECHO pulls and writes back.
    let data: Vec<u8> = (0..(1 << 20) as u32).map(|i| (i * 7 + 3) as u8).collect();
    c.write_region(writes, 0, &data).unwrap();
    for &n in &[1u32, 4097, 300_000, 1 << 20] {
        let (call, op) = from_app(&mut c, SINK, range(writes, 0, n), None).expect("SINK");
        // The server may still read the source: writing to it is refused,
        // reading it is not.
        assert!(c.region(writes, 0, n).is_ok());
        match c.write_region(writes, n - 1, &[0u8]) {
            Err(ClientError::InFlight(o)) => assert_eq!(o, op),
            other => panic!("wrote a source in flight: {other:?}"),
        }
        expect_reply(&mut c, call);
        assert!(c.barrier(op).complete);
        assert!(c.release(call));
        let (call, _) =
            from_app(&mut c, ECHO, range(writes, 0, n), Some(range(echoed, 0, n))).expect("ECHO");
        assert_eq!(expect_reply(&mut c, call), Some(n));
        assert!(c.release(call));
        assert_eq!(
            c.region(echoed, 0, n).unwrap(),
            &data[..n as usize],
            "ECHO of {n} bytes through app memory"
        );
    }
    // An ECHO whose result goes inline (no target) still pulls its
    // argument from app memory.
    let (call, _) = from_app(&mut c, ECHO, range(writes, 5, 3000), None).unwrap();
    expect_reply(&mut c, call);
    assert_eq!(
        decode_opaque_reply(&c.reply(call).map(|b| b.to_vec()).unwrap()),
        &data[5..3005]
    );
    assert!(c.release(call));

    // Plain calls still work beside directed ones.
    let plain = c
        .call(ReplyTarget::Inline, |xid, buf| {
            let e = header(xid, 0, buf)?;
            Some((e.position(), None))
        })
        .unwrap();
    expect_reply(&mut c, plain);
    assert!(c.release(plain));

    // Deregistered keys are dead; the space can be registered again.
    c.deregister(echoed).unwrap();
    assert!(matches!(c.region(echoed, 0, 1), Err(ClientError::BadKey)));
    assert!(matches!(
        from_app(&mut c, SINK, range(echoed, 0, 4), None),
        Err(ClientError::BadKey)
    ));
    let again = c.register(1 << 20).unwrap();
    assert_ne!(again, echoed);
    assert!(matches!(
        c.region(reads, 256 * 1024 * DEPTH - 1, 2),
        Err(ClientError::OutOfRange { .. })
    ));

    assert_eq!(c.endpoint().resources().buffers_exposed, 0);
    c.close().expect("clean close");
    assert_clean(&server.stop(Duration::from_secs(2)));
}

#[test]
fn directed_operations_over_shm() {
    directed_operations::<Shm>(sock_url());
}

#[test]
fn directed_operations_over_roce() {
    directed_operations::<Roce>(roce_url());
}

/// One call slot, calls back to back: each reply may come in a moment
/// before the acknowledgement of its call's Send (roce puts the ACK
/// behind the answer, docs/ROCE.md), so the slot may still be draining
/// when the next call is made. `call` then waits for it instead of
/// failing with `NoSlot` (docs/CLIENT.md).
#[test]
fn one_slot_calls_back_to_back_never_find_it_draining_over_roce() {
    let server = Server::<Roce>::at(
        roce_url(),
        1,
        engine_config(MAX, DEPTH),
        bench_service(),
        |c| c.endpoint.engine.max_outstanding_calls = 1,
    );
    let mut c = Client::<Roce>::connect(&server.url, client_config(engine_config(4096, 1)))
        .expect("connect");
    for i in 0..2_000 {
        let call = c
            .call(ReplyTarget::Inline, |xid, buf| {
                let e = header(xid, 0, buf)?;
                Some((e.position(), None))
            })
            .unwrap_or_else(|e| panic!("call {i}: {e}"));
        assert!(matches!(c.wait(call), Ok(CallOutcome::Reply { .. })));
        assert!(c.release(call));
    }
    c.close().expect("clean close");
    assert_clean(&server.stop(Duration::from_secs(2)));
}
