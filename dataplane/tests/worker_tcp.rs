//! ONC RPC/TCP connections served by the worker loop (`WorkerSet`), next
//! to RDMA endpoints: counters, per-transport gauges, and the graceful
//! stop (a call whose record has begun is finished and answered, then the
//! worker shuts its side of the stream). Adaptive idle; no timing
//! assertion (PATIENCE only catches hangs).
mod support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use dataplane::service::bench::{self, Args};
use dataplane::service::ServiceTable;
use dataplane::wire::rpc::write_record_header;
use dataplane::worker::{IdleStrategy, Transport, WorkerConfig, WorkerSet, WorkerSnapshot};
use support::worker_harness::stop_sleeping_workers;

const PATIENCE: Duration = Duration::from_secs(60);

fn spawn_set() -> WorkerSet {
    let config = WorkerConfig {
        idle: IdleStrategy::Adaptive {
            park_max: Duration::from_micros(200),
        },
        ..WorkerConfig::default()
    };
    WorkerSet::spawn(&[None], config, Arc::new(ServiceTable::builtin())).expect("spawn")
}

/// A connected pair: the client's end, and the server's end handed to
/// the set.
fn connect(set: &WorkerSet) -> TcpStream {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    client.set_read_timeout(Some(PATIENCE)).unwrap();
    let (server, _) = listener.accept().unwrap();
    assert_eq!(set.hand_off_tcp(server).ok(), Some(0));
    client
}

/// One call record: the record mark, then the call message.
fn record(xid: u32, args: Args<'_>) -> Vec<u8> {
    let mut buf = vec![0u8; 4 + 64 + 4096];
    let e = bench::encode_call(&mut buf[4..], xid, args).unwrap();
    write_record_header(&mut buf[..4], e.len).unwrap();
    buf.truncate(4 + e.len);
    buf
}

/// Reads one reply record (single fragment, as the server writes them).
fn read_reply(s: &mut TcpStream) -> Vec<u8> {
    let mut mark = [0u8; 4];
    s.read_exact(&mut mark).expect("reply record mark");
    let word = u32::from_be_bytes(mark);
    assert_ne!(word & 0x8000_0000, 0, "one fragment, the last");
    let mut msg = vec![0u8; (word & 0x7fff_ffff) as usize];
    s.read_exact(&mut msg).expect("reply record");
    msg
}

/// Polls worker 0's counters until `cond` holds (PATIENCE catches a hang).
fn wait_for(set: &WorkerSet, cond: impl Fn(&WorkerSnapshot) -> bool) -> WorkerSnapshot {
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        let s = set.snapshot()[0];
        if cond(&s) {
            return s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "counters stuck: {s:?}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn tcp_calls_are_served_and_counted_by_the_worker() {
    let set = spawn_set();
    let mut client = connect(&set);
    client.write_all(&record(1, Args::Null)).unwrap();
    bench::decode_void_reply(&read_reply(&mut client)).unwrap();
    let data: Vec<u8> = (0..3000u32).map(|i| (i * 13) as u8).collect();
    client.write_all(&record(2, Args::Echo(&data))).unwrap();
    let reply = read_reply(&mut client);
    assert_eq!(bench::decode_data_reply(&reply, None).unwrap(), &data[..]);

    // The worker folds its TCP counters in right after the pass that wrote
    // the reply, so the client may be a little ahead of them.
    let s = wait_for(&set, |s| s.rpcs == 2);
    assert_eq!(s.connections, 1);
    assert_eq!(s.connections_total, 1);
    assert_eq!(s.connections_by_transport[Transport::Tcp.index()], 1);
    assert_eq!(s.connections_by_transport[Transport::Shm.index()], 0);
    assert!(s.bytes_in > data.len() as u64 && s.bytes_out > data.len() as u64);

    // The peer goes away: the gauges come back to 0 (polled: the worker
    // notices at its next pass).
    drop(client);
    let deadline = std::time::Instant::now() + PATIENCE;
    while set.snapshot()[0].connections != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "connection not retired"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        set.snapshot()[0].connections_by_transport[Transport::Tcp.index()],
        0
    );
    let report = set.stop(Duration::from_secs(5));
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(report.workers[0].connections, 1);
    assert_eq!(report.workers[0].cut_short, 0);
}

#[test]
fn stop_finishes_the_call_being_received_then_ends_the_stream() {
    let set = spawn_set();
    let mut client = connect(&set);
    // Served before the stop.
    client.write_all(&record(1, Args::Null)).unwrap();
    bench::decode_void_reply(&read_reply(&mut client)).unwrap();

    // Half a call, then the stop (with a long grace), then the rest.
    let data = vec![0x5au8; 2000];
    let call = record(2, Args::Echo(&data));
    client.write_all(&call[..100]).unwrap();
    // The worker has the first bytes once its counter shows them. (Whether
    // it sees the stop before or after the rest of the record depends on
    // scheduling; either way the call is answered, then the stream ends.)
    let first = (record(1, Args::Null).len() + 100) as u64;
    wait_for(&set, |s| s.bytes_in >= first);
    let stopper = std::thread::spawn(move || set.stop(PATIENCE));
    client.write_all(&call[100..]).unwrap();
    let reply = read_reply(&mut client);
    assert_eq!(bench::decode_data_reply(&reply, None).unwrap(), &data[..]);

    // Then end of stream: the worker shut its side after the last reply.
    let mut rest = [0u8; 64];
    assert_eq!(
        client.read(&mut rest).expect("end of stream, not a reset"),
        0
    );
    drop(client);
    let report = stopper.join().unwrap();
    assert!(report.is_clean(), "{report:?}");
    let w = &report.workers[0];
    assert_eq!((w.connections, w.cut_short), (1, 0));
    assert_eq!(w.counters.rpcs, 2);
    assert_eq!(w.counters.connections, 0);
}

/// A worker asleep (adaptive idle parking for an hour at a time) answers
/// a TCP call at once: it sleeps on its TCP connections' readiness too,
/// so the calls complete (PATIENCE means broken, not slow), and at the
/// end every sleep was ended by a doorbell (the sockets, the stop's), none
/// by its timeout.
#[test]
fn a_sleeping_worker_wakes_for_a_tcp_call() {
    let config = WorkerConfig {
        idle: IdleStrategy::Adaptive {
            park_max: Duration::from_secs(3600),
        },
        ..WorkerConfig::default()
    };
    let set = WorkerSet::spawn(&[None], config, Arc::new(ServiceTable::builtin())).expect("spawn");
    let mut client = connect(&set);
    for xid in 1..=3 {
        // Asleep now: a sleep begun and not yet ended (none ends by its
        // timeout here, as the end of the test checks).
        wait_for(&set, |s| s.sleeps > s.doorbell_wakeups);
        client.write_all(&record(xid, Args::Null)).unwrap();
        bench::decode_void_reply(&read_reply(&mut client)).unwrap();
    }
    wait_for(&set, |s| s.rpcs == 3);
    drop(client);
    wait_for(&set, |s| s.sleeps > s.doorbell_wakeups);
    stop_sleeping_workers(move || set.stop(Duration::from_secs(1)));
}
