//! The relay against TCP servers on loopback, with time passed in: calls
//! and replies matched, XIDs restored, resends after a lost connection,
//! timeouts, stray replies. (The gateway against a real NFS server is in
//! control/tests/gateway.rs.)

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::*;
use crate::engine::Instant;

const PROG: u32 = 400_123;

/// A call message: AUTH_NONE, `args` after the header.
fn call(xid: u32, program: u32, procedure: u32, args: &[u8]) -> Vec<u8> {
    let mut m = Vec::new();
    for w in [xid, 0, 2, program, 1, procedure, 0, 0, 0, 0] {
        m.extend_from_slice(&u32::to_be_bytes(w));
    }
    m.extend_from_slice(args);
    m
}

/// What the test backend does with the n-th call it reads (from 0).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Act {
    /// Replies SUCCESS with the call's arguments as results.
    Echo,
    /// Closes the connection without replying.
    Hang,
    /// Replies with the XID changed (a reply to nothing).
    WrongXid,
}

/// The calls a test backend read, in order.
type Seen = Arc<Mutex<Vec<Vec<u8>>>>;

/// A backend serving each connection on a thread of its own, acting on
/// the n-th call it reads by `plan[n]` (calls past its end are echoed).
/// Its threads end with the test process.
fn backend(plan: Vec<Act>) -> (SocketAddr, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Seen = Arc::default();
    let plan = Arc::new(plan);
    let all = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let (seen, plan) = (all.clone(), plan.clone());
            std::thread::spawn(move || serve(stream.unwrap(), &seen, &plan));
        }
    });
    (addr, seen)
}

fn serve(mut s: TcpStream, seen: &Mutex<Vec<Vec<u8>>>, plan: &[Act]) {
    loop {
        let mut mark = [0u8; 4];
        if s.read_exact(&mut mark).is_err() {
            return;
        }
        let word = u32::from_be_bytes(mark);
        assert!(word & 0x8000_0000 != 0, "one fragment per record");
        let mut msg = vec![0u8; (word & 0x7fff_ffff) as usize];
        s.read_exact(&mut msg).unwrap();
        let act = {
            let mut seen = seen.lock().unwrap();
            let act = plan.get(seen.len()).copied().unwrap_or(Act::Echo);
            seen.push(msg.clone());
            act
        };
        if act == Act::Hang {
            return;
        }
        let mut xid = [msg[0], msg[1], msg[2], msg[3]];
        if act == Act::WrongXid {
            xid[0] ^= 0x55;
        }
        let mut reply = xid.to_vec();
        for w in [1u32, 0, 0, 0, 0] {
            reply.extend_from_slice(&w.to_be_bytes());
        }
        reply.extend_from_slice(&msg[40..]);
        let mut rec = (0x8000_0000u32 | reply.len() as u32).to_be_bytes().to_vec();
        rec.extend_from_slice(&reply);
        if s.write_all(&rec).is_err() {
            return;
        }
    }
}

fn forwarder(addr: SocketAddr, connections: u32) -> (Forwarder<u32>, Arc<GatewayCounters>) {
    forwarder_sized(addr, connections, 64 << 10)
}

fn forwarder_sized(
    addr: SocketAddr,
    connections: u32,
    max_message: usize,
) -> (Forwarder<u32>, Arc<GatewayCounters>) {
    let config = GatewayConfig {
        routes: vec![Route {
            program: PROG,
            versions: 1..=1,
            backend: addr,
            connections,
        }],
        max_in_flight: 64,
        call_timeout: Duration::from_secs(5),
        reconnect_after: Duration::from_millis(1),
        max_message,
        ..GatewayConfig::default()
    };
    config.validate().unwrap();
    let counters = Arc::new(GatewayCounters::new(&config));
    (
        Forwarder::new(Arc::new(config), counters.clone()).unwrap(),
        counters,
    )
}

/// Polls until `want` answers came (a deadline that means broken),
/// handing back resends from `calls` (by origin) as a worker would.
/// Time moves by 1 ms per round.
fn run(
    fw: &mut Forwarder<u32>,
    calls: &[Vec<u8>],
    now: &mut Instant,
    want: usize,
) -> Vec<(u32, Option<Vec<u8>>)> {
    let mut got = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while got.len() < want {
        assert!(
            std::time::Instant::now() < deadline,
            "broken: {} of {want} answers",
            got.len()
        );
        fw.poll(*now, |origin, a| match a {
            Answer::Reply { message, .. } => got.push((origin, Some(message.to_vec()))),
            Answer::Failed { xid } => {
                assert_eq!(xid, 0x1000 + origin);
                got.push((origin, None));
            }
        });
        while let Some((token, origin)) = fw.next_resend() {
            if !fw.resend(*now, token, &calls[origin as usize]) {
                break;
            }
        }
        *now = now.saturating_add(Duration::from_millis(1));
        std::thread::sleep(Duration::from_micros(200));
    }
    got
}

#[test]
fn pipelined_calls_come_back_to_their_origin_with_their_xid() {
    let (addr, seen) = backend(vec![]);
    let (mut fw, counters) = forwarder(addr, 2);
    let mut now = Instant::ZERO;
    let calls: Vec<Vec<u8>> = (0..40u32)
        .map(|i| call(0x1000 + i, PROG, 7, &i.to_be_bytes().repeat(i as usize + 1)))
        .collect();
    for (i, c) in calls.iter().enumerate() {
        fw.forward(now, i as u32, 1, c).unwrap();
    }
    assert_eq!(fw.in_flight(), 40);
    let got = run(&mut fw, &calls, &mut now, 40);
    for (origin, reply) in &got {
        let reply = reply.as_ref().expect("a reply");
        assert_eq!(
            reply[..4],
            (0x1000 + origin).to_be_bytes(),
            "client XID restored"
        );
        assert_eq!(
            reply[24..],
            calls[*origin as usize][40..],
            "the results of its own call"
        );
    }
    assert_eq!(fw.in_flight(), 0);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 40);
    // Only the XID changed on the way out, and no two calls shared one.
    let mut xids: Vec<[u8; 4]> = seen.iter().map(|m| [m[0], m[1], m[2], m[3]]).collect();
    for m in &seen {
        assert!(
            calls.iter().any(|c| c[4..] == m[4..]),
            "call body untouched"
        );
    }
    xids.sort();
    xids.dedup();
    assert_eq!(xids.len(), 40);
    let r = &counters.routes[0];
    assert_eq!(r.calls.load(Ordering::Relaxed), 40);
    assert_eq!(r.replies.load(Ordering::Relaxed), 40);
    assert_eq!(
        r.latency
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .sum::<u64>(),
        40
    );
    // No connection was lost: whatever waited for room went out once.
    assert_eq!(r.resends.load(Ordering::Relaxed), 0);
}

#[test]
fn a_lost_backend_connection_sends_its_calls_again() {
    // The first call read kills the connection: all that was on it is
    // sent again on a new one.
    let (addr, seen) = backend(vec![Act::Hang]);
    let (mut fw, counters) = forwarder(addr, 1);
    let mut now = Instant::ZERO;
    let calls: Vec<Vec<u8>> = (0..5u32)
        .map(|i| call(0x1000 + i, PROG, 1, &[i as u8; 8]))
        .collect();
    for (i, c) in calls.iter().enumerate() {
        fw.forward(now, i as u32, 1, c).unwrap();
    }
    let got = run(&mut fw, &calls, &mut now, 5);
    assert!(
        got.iter().all(|(_, r)| r.is_some()),
        "every call answered by the backend"
    );
    let r = &counters.routes[0];
    assert!(r.errors_connection.load(Ordering::Relaxed) >= 1);
    assert!(r.resends.load(Ordering::Relaxed) >= 1);
    assert_eq!(r.replies.load(Ordering::Relaxed), 5);
    // The hung call reached the backend twice; the others at least once.
    assert!(seen.lock().unwrap().len() > 5);
}

#[test]
fn calls_kept_as_copies_are_resent_by_the_relay_itself() {
    // Calls from an origin that keeps no bytes (a TCP connection's
    // record): the first read kills the connection, and the relay sends
    // the small calls again from its copies without asking the worker;
    // the one above KEEP_MAX is handed back for the worker to abandon.
    let (addr, seen) = backend(vec![Act::Hang]);
    let (mut fw, counters) = forwarder_sized(addr, 1, 256 << 10);
    let mut now = Instant::ZERO;
    let mut calls: Vec<Vec<u8>> = (0..4u32)
        .map(|i| call(0x1000 + i, PROG, 1, &[i as u8; 8]))
        .collect();
    calls.push(call(0x1004, PROG, 1, &vec![4u8; KEEP_MAX]));
    for (i, c) in calls.iter().enumerate() {
        assert_eq!(fw.forward_copy(now, i as u32, 1, c), Ok(Forwarded::Sent));
    }
    let (mut answered, mut handed_back) = (Vec::new(), Vec::new());
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while answered.len() + handed_back.len() < calls.len() {
        assert!(
            std::time::Instant::now() < deadline,
            "broken: {answered:?} {handed_back:?}"
        );
        fw.poll(now, |origin, a| match a {
            Answer::Reply { message, .. } => {
                assert_eq!(message[24..], calls[origin as usize][40..]);
                answered.push(origin);
            }
            Answer::Failed { .. } => panic!("call {origin} failed"),
        });
        while let Some((token, origin)) = fw.next_resend() {
            handed_back.push(origin);
            fw.abandon(token);
        }
        now = now.saturating_add(Duration::from_millis(1));
        std::thread::sleep(Duration::from_micros(200));
    }
    answered.sort();
    // The hung call (the first read) was among the copies, so every
    // small call was answered, and only the large one came back.
    assert_eq!(answered, [0, 1, 2, 3]);
    assert_eq!(handed_back, [4]);
    assert_eq!(fw.in_flight(), 0);
    let r = &counters.routes[0];
    assert!(r.errors_connection.load(Ordering::Relaxed) >= 1);
    assert!(r.resends.load(Ordering::Relaxed) >= 4);
    // Call 0 reached the backend twice: once hung, once answered.
    let seen = seen.lock().unwrap();
    assert_eq!(seen.iter().filter(|m| m[4..] == calls[0][4..]).count(), 2);
}

/// What a sleeping worker waits on for its relay: nothing while no call
/// is out; with calls out, each connection with a reply due (readable)
/// and the earliest call timeout; a call queued for a connection makes
/// the sleep short (no descriptor tells when it can go).
#[test]
fn a_relay_asks_its_sleeper_to_watch_the_sockets_with_replies_due() {
    // A backend that takes connections and calls and never answers, so
    // that what is due stays due.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let held: Vec<TcpStream> = listener.incoming().map_while(Result::ok).collect();
        drop(held);
    });
    let (mut fw, _) = forwarder(addr, 2);
    assert_eq!(fw.connections(), 2);
    let mut fds = Vec::new();
    let idle = fw.watch(&mut fds);
    assert_eq!((idle.deadline, idle.rings, fds.len()), (None, true, 0));

    let t0 = Instant::ZERO.saturating_add(Duration::from_secs(1));
    let t1 = t0.saturating_add(Duration::from_millis(3));
    let calls: Vec<Vec<u8>> = (0..3u32).map(|i| call(0x1000 + i, PROG, 1, &[])).collect();
    fw.forward(t0, 0, 1, &calls[0]).unwrap();
    fw.forward(t1, 1, 1, &calls[1]).unwrap();
    // Once connected and written out, both connections wait for a reply
    // and have nothing to write.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let w = loop {
        fw.poll(t1, |_, _| panic!("an answer from a silent backend"));
        fds.clear();
        let w = fw.watch(&mut fds);
        if fds.len() == 2 && fds.iter().all(|p| p.events == libc::POLLIN) {
            break w;
        }
        assert!(std::time::Instant::now() < deadline, "broken: {fds:?}");
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(w.deadline, Some(t0.saturating_add(Duration::from_secs(5))));
    assert!(w.rings);

    // Timed out (virtual time): nothing left to watch.
    let mut failed = 0;
    fw.poll(t1.saturating_add(Duration::from_secs(6)), |_, a| {
        assert!(matches!(a, Answer::Failed { .. }));
        failed += 1;
    });
    assert_eq!(failed, 2);
    fds.clear();
    let w = fw.watch(&mut fds);
    assert_eq!((w.deadline, w.rings, fds.len()), (None, true, 0));

    // A backend that is not there: the call waits in the resend queue.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let (mut fw, _) = forwarder(port, 1);
    fw.forward(t0, 2, 1, &calls[2]).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let w = loop {
        fw.poll(t0, |_, _| {});
        let w = fw.watch(&mut fds);
        if !w.rings {
            break w;
        }
        assert!(std::time::Instant::now() < deadline, "broken: never queued");
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(w.deadline, Some(t0.saturating_add(Duration::from_secs(5))));
}

#[test]
fn a_backend_that_is_not_there_times_calls_out() {
    // A port nobody listens on: connections are refused, calls wait in
    // the resend queue, and the call timeout answers them.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let (mut fw, counters) = forwarder(port, 1);
    let now = Instant::ZERO;
    let calls: Vec<Vec<u8>> = (0..3u32).map(|i| call(0x1000 + i, PROG, 1, &[])).collect();
    for (i, c) in calls.iter().enumerate() {
        fw.forward(now, i as u32, 1, c).unwrap();
    }
    // Virtual time: the timeout passes without waiting for it.
    let mut later = now.saturating_add(Duration::from_secs(6));
    let got = run(&mut fw, &calls, &mut later, 3);
    assert!(got.iter().all(|(_, r)| r.is_none()), "every call failed");
    assert_eq!(fw.in_flight(), 0);
    let r = &counters.routes[0];
    assert_eq!(r.errors_timeout.load(Ordering::Relaxed), 3);
    assert!(r.errors_connection.load(Ordering::Relaxed) >= 1);
}

#[test]
fn a_reply_to_nothing_is_counted_and_dropped() {
    let (addr, seen) = backend(vec![Act::WrongXid]);
    let (mut fw, counters) = forwarder(addr, 1);
    let mut now = Instant::ZERO;
    let calls = vec![
        call(0x1000, PROG, 1, &[1; 4]),
        call(0x1001, PROG, 1, &[2; 4]),
    ];
    fw.forward(now, 0, 1, &calls[0]).unwrap();
    fw.forward(now, 1, 1, &calls[1]).unwrap();
    let got = run(&mut fw, &calls, &mut now, 1);
    assert_eq!(got[0].0, 1, "only the second call was answered");
    assert_eq!(counters.routes[0].stray_replies.load(Ordering::Relaxed), 1);
    assert_eq!(fw.in_flight(), 1);
    assert_eq!(seen.lock().unwrap().len(), 2);
}

#[test]
fn calls_of_other_programs_and_non_calls_are_not_taken() {
    let (mut fw, _) = forwarder("127.0.0.1:9".parse().unwrap(), 1);
    let other = call(1, PROG + 1, 1, &[]);
    assert!(!fw.routes(&other));
    assert_eq!(
        fw.forward(Instant::ZERO, 0, 1, &other),
        Err(ForwardError::NotRouted)
    );
    assert_eq!(
        fw.forward(Instant::ZERO, 0, 1, &[1, 2, 3]),
        Err(ForwardError::Malformed)
    );
    let mut reply = call(1, PROG, 1, &[]);
    reply[7] = 1;
    assert!(!fw.routes(&reply));
    assert_eq!(fw.in_flight(), 0);
}

#[test]
fn calls_beyond_the_in_flight_limit_are_refused() {
    let (mut fw, counters) = forwarder("127.0.0.1:9".parse().unwrap(), 1);
    let c = call(1, PROG, 1, &[]);
    for i in 0..64 {
        fw.forward(Instant::ZERO, i, 1, &c).unwrap();
    }
    assert_eq!(
        fw.forward(Instant::ZERO, 64, 1, &c),
        Err(ForwardError::Busy)
    );
    assert_eq!(counters.routes[0].errors_busy.load(Ordering::Relaxed), 1);
}

#[test]
fn configs_with_a_program_twice_or_no_connection_are_refused() {
    let route = Route {
        program: 100_003,
        versions: 3..=3,
        backend: "127.0.0.1:2049".parse().unwrap(),
        connections: 1,
    };
    let twice = GatewayConfig {
        routes: vec![route.clone(), route.clone()],
        ..GatewayConfig::default()
    };
    assert_eq!(
        twice.validate(),
        Err(GatewayConfigError::DuplicateProgram(100_003))
    );
    let none = GatewayConfig {
        routes: vec![Route {
            connections: 0,
            ..route
        }],
        ..GatewayConfig::default()
    };
    assert_eq!(
        none.validate(),
        Err(GatewayConfigError::BadConnections(100_003))
    );
}

/// A relay of NFS (program 100003) to `addr`.
fn nfs_forwarder(addr: SocketAddr) -> (Forwarder<u32>, Arc<GatewayCounters>) {
    let config = GatewayConfig {
        routes: vec![Route {
            program: 100_003,
            versions: 3..=3,
            backend: addr,
            connections: 1,
        }],
        max_in_flight: 16,
        reconnect_after: Duration::from_millis(1),
        max_message: 64 << 10,
        ..GatewayConfig::default()
    };
    let counters = Arc::new(GatewayCounters::new(&config));
    (
        Forwarder::new(Arc::new(config), counters.clone()).unwrap(),
        counters,
    )
}

/// An NFSv3 call (version 3) of `procedure`.
fn nfs_call(xid: u32, procedure: u32, args: &[u8]) -> Vec<u8> {
    let mut m = call(xid, 100_003, procedure, args);
    m[16..20].copy_from_slice(&3u32.to_be_bytes());
    m
}

#[test]
fn a_retransmitted_remove_runs_once_and_is_answered_from_the_cache() {
    let (addr, seen) = backend(vec![]);
    let (mut fw, counters) = nfs_forwarder(addr);
    let mut now = Instant::ZERO;
    let remove = nfs_call(0x1000, 12, b"fh and name");
    // Origins 0..=2 are the same call from the same client, as a client
    // retransmits it after reconnecting, while it is at the backend.
    assert_eq!(fw.forward(now, 0, 7, &remove), Ok(Forwarded::Sent));
    assert_eq!(fw.forward(now, 1, 7, &remove), Ok(Forwarded::Joined));
    assert_eq!(fw.forward(now, 2, 7, &remove), Ok(Forwarded::Refused));
    let calls = vec![remove.clone(), remove.clone()];
    let mut got = run(&mut fw, &calls, &mut now, 2);
    got.sort();
    assert_eq!(got[0].0, 0);
    assert_eq!(got[1].0, 1, "the joined retransmission got the reply too");
    assert_eq!(got[0].1, got[1].1);
    let reply = got[0].1.clone().unwrap();
    // Done: a later retransmission is answered from the cache.
    match fw.forward(now, 3, 7, &remove) {
        Ok(Forwarded::Cached(r)) => assert_eq!(r, &reply[..]),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        seen.lock().unwrap().len(),
        1,
        "the backend saw the REMOVE once"
    );
    // Another client's call of the same XID and bytes is its own call.
    assert_eq!(fw.forward(now, 4, 8, &remove), Ok(Forwarded::Sent));
    // An idempotent procedure (LOOKUP) is never cached.
    let lookup = nfs_call(0x2000, 3, b"fh and name");
    assert_eq!(fw.forward(now, 5, 7, &lookup), Ok(Forwarded::Sent));
    assert_eq!(fw.forward(now, 6, 7, &lookup), Ok(Forwarded::Sent));
    let _ = run(&mut fw, &calls, &mut now, 3);
    assert_eq!(seen.lock().unwrap().len(), 4);
    let r = &counters.routes[0];
    assert_eq!(r.cache_hits.load(Ordering::Relaxed), 1);
    assert_eq!(r.cache_joins.load(Ordering::Relaxed), 1);
}

#[test]
fn large_replies_read_straight_into_the_record_are_whole() {
    // Replies of 300 KiB and more: their data is read from the socket into
    // the record directly (no read buffer), across many reads.
    let (addr, _) = backend(vec![]);
    let (mut fw, _) = forwarder_sized(addr, 1, 2 << 20);
    let mut now = Instant::ZERO;
    let calls: Vec<Vec<u8>> = (0..6u32)
        .map(|i| {
            let body: Vec<u8> = (0..300_000 + i as usize * 50_001)
                .map(|k| (k as u32).wrapping_mul(2_654_435_761).to_be_bytes()[0] ^ i as u8)
                .collect();
            call(0x1000 + i, PROG, 7, &body)
        })
        .collect();
    for (i, c) in calls.iter().enumerate() {
        fw.forward(now, i as u32, 1, c).unwrap();
    }
    let got = run(&mut fw, &calls, &mut now, calls.len());
    for (origin, reply) in &got {
        let reply = reply.as_ref().expect("a reply");
        assert!(
            reply[24..] == calls[*origin as usize][40..],
            "reply {origin} differs"
        );
    }
}

/// A gateway a worker cannot set up stops the start with an error that
/// names it, instead of leaving the routed programs to the dispatcher.
#[test]
fn worker_set_refuses_a_gateway_it_cannot_build() {
    use crate::worker::{GatewaySetup, WorkerConfig, WorkerError, WorkerSet};

    let route = Route {
        program: PROG,
        versions: 1..=1,
        backend: "127.0.0.1:9".parse().unwrap(),
        connections: 1,
    };
    let setup = |config: GatewayConfig| WorkerConfig {
        gateway: Some(GatewaySetup {
            config: Arc::new(config),
        }),
        ..WorkerConfig::default()
    };

    // Refused before any thread starts: a program routed twice.
    let twice = GatewayConfig {
        routes: vec![route.clone(), route.clone()],
        ..GatewayConfig::default()
    };
    match WorkerSet::spawn(
        &[None],
        setup(twice),
        Arc::new(crate::service::ServiceTable::new()),
    ) {
        Err(WorkerError::GatewayConfig(GatewayConfigError::DuplicateProgram(PROG))) => {}
        other => panic!("expected DuplicateProgram, got {:?}", other.map(|_| ())),
    }

    // Refused by the worker: a record buffer larger than the address
    // space cannot be reserved.
    let huge = GatewayConfig {
        routes: vec![route],
        max_message: 1 << 50,
        ..GatewayConfig::default()
    };
    match WorkerSet::spawn(
        &[None],
        setup(huge),
        Arc::new(crate::service::ServiceTable::new()),
    ) {
        Err(WorkerError::Gateway { worker: 0, source }) => {
            assert_ne!(source.raw_os_error(), None, "{source}");
        }
        other => panic!("expected a gateway error, got {:?}", other.map(|_| ())),
    }
}
