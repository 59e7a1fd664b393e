//! The gateway's relay allocates nothing per call in steady state:
//! forwarding, the backend's replies, XID restoring, the duplicate request
//! cache (misses, entries replaced, hits) and the call table, measured
//! with a counting allocator on the thread that runs the relay (the
//! backend is a TCP echo server on another thread, on loopback).

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use dataplane::engine::Instant;
use dataplane::gateway::{Answer, Forwarded, Forwarder, GatewayConfig, GatewayCounters, Route};
use support::alloc_counter::{measure, CountingAllocator};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// An ONC RPC server that answers every call SUCCESS with its arguments.
fn echo_backend() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let mut s = stream.unwrap();
            std::thread::spawn(move || loop {
                let mut mark = [0u8; 4];
                if s.read_exact(&mut mark).is_err() {
                    return;
                }
                let mut msg = vec![0u8; (u32::from_be_bytes(mark) & 0x7fff_ffff) as usize];
                s.read_exact(&mut msg).unwrap();
                let mut rec = Vec::with_capacity(msg.len() + 28);
                rec.extend_from_slice(&(0x8000_0000u32 | (msg.len() as u32 - 16)).to_be_bytes());
                rec.extend_from_slice(&msg[..4]);
                for w in [1u32, 0, 0, 0, 0] {
                    rec.extend_from_slice(&w.to_be_bytes());
                }
                rec.extend_from_slice(&msg[40..]);
                if s.write_all(&rec).is_err() {
                    return;
                }
            });
        }
    });
    addr
}

/// An NFSv3 call of `procedure` (AUTH_NONE) with `args`.
fn nfs_call(xid: u32, procedure: u32, args: &[u8]) -> Vec<u8> {
    let mut m = Vec::new();
    for w in [xid, 0, 2, 100_003, 3, procedure, 0, 0, 0, 0] {
        m.extend_from_slice(&w.to_be_bytes());
    }
    m.extend_from_slice(args);
    m
}

#[test]
fn the_relay_allocates_nothing_per_call_in_steady_state() {
    let config = GatewayConfig {
        routes: vec![Route {
            program: 100_003,
            versions: 3..=3,
            backend: echo_backend(),
            connections: 2,
        }],
        max_in_flight: 64,
        max_message: 64 << 10,
        reply_cache_entries: 64,
        ..GatewayConfig::default()
    };
    let counters = Arc::new(GatewayCounters::new(&config));
    let mut fw: Forwarder<u32> = Forwarder::new(Arc::new(config), counters).unwrap();
    // Calls prepared up front: READ (procedure 6, not cached) and REMOVE
    // (12, cached), with distinct XIDs; the bodies vary in length.
    const DEPTH: u32 = 16;
    let calls: Vec<Vec<u8>> = (0..4000u32)
        .map(|i| {
            nfs_call(
                i,
                if i % 2 == 0 { 6 } else { 12 },
                &vec![i as u8; 4 + (i % 7) as usize * 100],
            )
        })
        .collect();
    let mut now = Instant::ZERO;
    let mut next = 0usize;
    let mut answered = 0usize;
    let mut hits = 0usize;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut round = |upto: usize, now: &mut Instant, answered: &mut usize, hits: &mut usize| {
        while *answered < upto {
            assert!(
                std::time::Instant::now() < deadline,
                "broken: {answered} of {upto}"
            );
            while next < upto && next - *answered < DEPTH as usize {
                match fw.forward(*now, next as u32, 1, &calls[next]).unwrap() {
                    Forwarded::Sent => {}
                    other => panic!("call {next}: {other:?}"),
                }
                next += 1;
            }
            let mut last_remove = None;
            fw.poll(*now, |origin, a| match a {
                Answer::Reply { message, .. } => {
                    assert_eq!(message[..4], origin.to_be_bytes());
                    if origin % 2 == 1 {
                        last_remove = Some(origin as usize);
                    }
                    *answered += 1;
                }
                Answer::Failed { .. } => panic!("call {origin} failed"),
            });
            // A retransmission of a REMOVE just answered: from the cache.
            if let Some(i) = last_remove {
                match fw.forward(*now, u32::MAX, 1, &calls[i]) {
                    Ok(Forwarded::Cached(reply)) => {
                        assert_eq!(reply[..4], (i as u32).to_be_bytes());
                        *hits += 1;
                    }
                    other => panic!("retransmission of {i}: {other:?}"),
                }
            }
            *now = now.saturating_add(Duration::from_micros(10));
        }
    };
    // Warm-up: every buffer, table and cache slot used once.
    round(1000, &mut now, &mut answered, &mut hits);
    let ((), allocated) = measure(|| round(4000, &mut now, &mut answered, &mut hits));
    assert_eq!(answered, 4000);
    assert!(hits > 100, "the cache answered retransmissions: {hits}");
    assert_eq!(
        allocated.count, 0,
        "allocations in steady state: {allocated:?}"
    );
}
