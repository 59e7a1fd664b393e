//! ONC RPC over TCP end to end: a `TcpServer` polled in its own
//! thread on 127.0.0.1, `TcpClient`s in others. Byte-exact ECHO of every
//! size up to the program's 16 MiB maximum, SOURCE pattern checks, 64
//! clients at once, and a client sending garbage that loses only its own
//! connection while the others keep going.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use dataplane::engine::Instant;
use dataplane::service::bench::{self, Args, Proc};
use dataplane::service::ServiceTable;
use dataplane::tcp::{TcpClient, TcpClientConfig, TcpConfig, TcpServer, TcpStats};

/// Guards against hangs only; never a statement about speed.
const HANG: Duration = Duration::from_secs(300);

/// Spin, then yield, then sleep briefly (the workers' `adaptive` idle).
#[derive(Default)]
struct Idle(u32);

impl Idle {
    fn wait(&mut self, work: usize) {
        if work > 0 {
            self.0 = 0;
            return;
        }
        self.0 += 1;
        if self.0 < 50 {
            std::hint::spin_loop();
        } else if self.0 < 100 {
            thread::yield_now();
        } else {
            thread::sleep(Duration::from_micros(50));
        }
    }
}

struct ServerThread {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    handle: JoinHandle<TcpStats>,
}

impl ServerThread {
    fn start(cfg: TcpConfig) -> ServerThread {
        let mut server = TcpServer::bind("127.0.0.1:0".parse().unwrap(), cfg).unwrap();
        let addr = server.local_addr();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let handle = thread::spawn(move || {
            let services = ServiceTable::builtin();
            let start = std::time::Instant::now();
            let mut idle = Idle::default();
            while !flag.load(Ordering::Relaxed) {
                let now = Instant(start.elapsed().as_nanos() as u64);
                let w = server.poll(&services, now);
                idle.wait(w);
            }
            server.connections_mut().close_all();
            *server.stats()
        });
        ServerThread { addr, stop, handle }
    }

    fn stop(self) -> TcpStats {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().expect("server thread")
    }
}

/// One call, waited for; `check` sees the reply.
fn round_trip(
    client: &mut TcpClient,
    args: Args<'_>,
    check: impl FnOnce(dataplane::tcp::Reply<'_>),
) {
    let start = std::time::Instant::now();
    let mut idle = Idle::default();
    while client.call(args, 0).unwrap().is_none() {
        assert!(start.elapsed() < HANG, "hung queueing");
        let w = client.poll(|r| panic!("stray reply {r:?}")).unwrap();
        idle.wait(w);
    }
    let mut check = Some(check);
    while check.is_some() {
        assert!(start.elapsed() < HANG, "hung waiting for a reply");
        let w = client
            .poll(|r| (check.take().expect("one reply"))(r))
            .unwrap();
        idle.wait(w);
    }
}

#[test]
fn every_procedure_and_size_is_byte_exact() {
    let server = ServerThread::start(TcpConfig::default());
    let mut client = TcpClient::connect(server.addr, TcpClientConfig::default()).unwrap();
    round_trip(&mut client, Args::Null, |r| {
        assert_eq!(r.procedure, Proc::Null);
        r.check_void().unwrap();
    });
    let max = bench::MAX_DATA as usize;
    let mut data = vec![0u8; max];
    for (i, b) in data.iter_mut().enumerate() {
        // Not the SOURCE pattern, so an ECHO answered by SOURCE shows.
        *b = (i as u32).wrapping_mul(2_654_435_761).to_be_bytes()[0];
    }
    for size in [0, 1, 1024, 65536, 1 << 20, max] {
        round_trip(&mut client, Args::Echo(&data[..size]), |r| {
            let got = r.data().unwrap();
            assert_eq!(got.len(), size);
            assert!(got == &data[..size], "echo {size} differs");
        });
        round_trip(&mut client, Args::Sink(&data[..size]), |r| {
            r.check_void().unwrap()
        });
        round_trip(&mut client, Args::Source(size as u32), |r| {
            let got = r.data().unwrap();
            assert_eq!(got.len(), size);
            assert_eq!(bench::pattern_mismatch(got), None, "source {size}");
        });
    }
    // Over the program's maximum: GARBAGE_ARGS, and the connection stays.
    round_trip(&mut client, Args::Source(bench::MAX_DATA + 1), |r| {
        assert!(matches!(
            r.data(),
            Err(bench::ReplyError::Status(
                dataplane::wire::rpc::AcceptStatus::GarbageArgs
            ))
        ));
    });
    round_trip(&mut client, Args::Null, |r| r.check_void().unwrap());
    let client_stats = *client.stats();
    drop(client);
    let s = server.stop();
    assert_eq!(s.rpcs, 1 + 6 * 3 + 2);
    assert_eq!(s.bytes_in, client_stats.bytes_out);
    assert_eq!(s.bytes_out, client_stats.bytes_in);
    assert_eq!(s.connections_dropped, 0);
}

/// `clients` connections driven from one thread, `depth` calls each in
/// flight, `calls` calls per connection of mixed procedures and sizes, all
/// checked.
fn drive(addr: SocketAddr, clients: usize, depth: usize, calls: u64, seed: u64) -> u64 {
    let data: Vec<u8> = (0..65536u32).map(|i| (i ^ (i >> 8)) as u8).collect();
    let mut cs: Vec<TcpClient> = (0..clients)
        .map(|_| TcpClient::connect(addr, TcpClientConfig::for_data(data.len(), depth)).unwrap())
        .collect();
    let mut sent = vec![0u64; clients];
    let mut done = vec![0u64; clients];
    let start = std::time::Instant::now();
    let mut idle = Idle::default();
    while done.iter().any(|&d| d < calls) {
        assert!(start.elapsed() < HANG, "hung");
        let mut work = 0;
        for (i, c) in cs.iter_mut().enumerate() {
            while sent[i] < calls {
                let n = sent[i] + seed;
                let size = ((n * 7919) % data.len() as u64) as usize;
                let args = match n % 4 {
                    0 => Args::Null,
                    1 => Args::Echo(&data[..size]),
                    2 => Args::Sink(&data[..size]),
                    _ => Args::Source(size as u32),
                };
                // The tag carries the size, to check the reply with.
                match c.call(args, size as u64).unwrap() {
                    Some(_) => sent[i] += 1,
                    None => break,
                }
            }
            work += c
                .poll(|r| {
                    let size = r.tag as usize;
                    match r.procedure {
                        Proc::Null | Proc::Sink => r.check_void().unwrap(),
                        Proc::Echo => assert!(r.data().unwrap() == &data[..size]),
                        Proc::Source => {
                            let d = r.data().unwrap();
                            assert_eq!(d.len(), size);
                            assert_eq!(bench::pattern_mismatch(d), None);
                        }
                    }
                    done[i] += 1;
                })
                .unwrap();
        }
        idle.wait(work);
    }
    done.iter().sum()
}

#[test]
fn sixty_four_clients_at_once() {
    let server = ServerThread::start(TcpConfig::default());
    let addr = server.addr;
    // 8 threads of 8 connections each: 64 connections open and busy at
    // the same time, without 64 threads on a two-core machine.
    let threads: Vec<_> = (0..8)
        .map(|t| thread::spawn(move || drive(addr, 8, 4, 40, t * 1000)))
        .collect();
    let total: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(total, 64 * 40);
    let s = server.stop();
    assert_eq!(s.rpcs, 64 * 40);
    assert_eq!(s.connections_opened, 64);
    assert_eq!(s.connections_dropped, 0);
}

#[test]
fn a_garbage_client_loses_only_its_connection() {
    let server = ServerThread::start(TcpConfig {
        max_record_len: 1 << 20,
        max_reply_len: 1 << 20,
        ..TcpConfig::default()
    });
    let addr = server.addr;
    let good: Vec<_> = (0..4)
        .map(|t| thread::spawn(move || drive(addr, 2, 4, 200, t * 77)))
        .collect();
    let mut evil = Vec::new();
    // A valid call first, then garbage whose first word announces 1.2 GB.
    let mut call = vec![0u8; 128];
    let c = bench::encode_call(&mut call, 1, Args::Null).unwrap();
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .write_all(&(0x8000_0000u32 | c.len as u32).to_be_bytes())
        .unwrap();
    stream.write_all(&call[..c.len]).unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    stream.set_read_timeout(Some(HANG)).unwrap();
    // The NULL reply (28 bytes with its mark), then end of stream or reset.
    let mut buf = [0u8; 256];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => evil.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(evil.len(), 4 + 24, "the valid call was answered first");
    // An oversized record from a second garbage client, as one fragment
    // just over the limit.
    let mut s2 = TcpStream::connect(addr).unwrap();
    s2.write_all(&(0x8000_0000u32 | ((1 << 20) + 1)).to_be_bytes())
        .unwrap();
    s2.set_read_timeout(Some(HANG)).unwrap();
    let closed = matches!(s2.read(&mut buf), Ok(0) | Err(_));
    assert!(closed);
    let total: u64 = good.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(total, 4 * 2 * 200);
    let s = server.stop();
    assert_eq!(s.oversized_records, 2);
    assert_eq!(s.connections_dropped, 2);
    assert_eq!(s.rpcs, 4 * 2 * 200 + 1);
}
