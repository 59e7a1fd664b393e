//! `dataplane::tcp` against a real ONC RPC peer nobody here wrote: the
//! libtirpc client and server that `bench/build.rs` generates with rpcgen
//! from `bench/tirpc/bench_prog.x`.
//!
//! - The libtirpc client calls our `TcpServer` (polled in a thread on
//!   127.0.0.1:0): its `verify` mode checks NULL, ECHO, SINK and SOURCE
//!   byte for byte and an oversized SOURCE refused with GARBAGE_ARGS; its
//!   latency and throughput modes check every result length, over several
//!   connections at once. libtirpc sends large calls as several record
//!   fragments, so this also covers fragment reassembly against a real
//!   sender.
//! - Our `TcpClient` calls the libtirpc server, pipelined.
//!
//! Real-peer rule: when the peer could not be built (rpcgen or libtirpc
//! missing), the tests fail under `RPCRDMA_REQUIRE_PEERS=1` and otherwise
//! print `skipped: libtirpc not installed` and pass.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use bench::tirpc::{self, Proc, TirpcResult, TirpcServer, Workload};
use dataplane::engine::Instant;
use dataplane::service::bench::{self as prog, Args};
use dataplane::service::ServiceTable;
use dataplane::tcp::{TcpClient, TcpClientConfig, TcpConfig, TcpServer, TcpStats};

/// Guards against hangs only; never a statement about speed.
const HANG: Duration = Duration::from_secs(300);

/// Whether the peer was built; prints the skip line (or panics when peers
/// are required) when it was not.
fn peer_available() -> bool {
    match tirpc::binaries() {
        Ok(_) => true,
        Err(e) if std::env::var("RPCRDMA_REQUIRE_PEERS").as_deref() == Ok("1") => {
            panic!("{e}, and RPCRDMA_REQUIRE_PEERS=1")
        }
        Err(e) => {
            println!("skipped: libtirpc not installed ({e})");
            false
        }
    }
}

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

/// Our server, polled in a thread until stopped.
struct OurServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    handle: JoinHandle<TcpStats>,
}

impl OurServer {
    fn start() -> OurServer {
        let mut server =
            TcpServer::bind("127.0.0.1:0".parse().unwrap(), TcpConfig::default()).unwrap();
        let addr = server.local_addr();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let handle = thread::spawn(move || {
            let services = ServiceTable::builtin();
            let start = std::time::Instant::now();
            let mut idle = Idle::default();
            // Stopping waits for the peers' connections to end: a client
            // that has exited may still have its end of stream in flight.
            while !(flag.load(Ordering::Relaxed) && server.connections().is_empty()) {
                assert!(start.elapsed() < HANG, "hung");
                let w = server.poll(&services, Instant(start.elapsed().as_nanos() as u64));
                idle.wait(w);
            }
            *server.stats()
        });
        OurServer { addr, stop, handle }
    }

    /// Stops polling once every connection has ended, and returns the
    /// counters.
    fn stop(self) -> TcpStats {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().expect("server thread")
    }
}

#[test]
fn libtirpc_client_verifies_our_server_at_every_size() {
    if !peer_available() {
        return;
    }
    let server = OurServer::start();
    let sizes = [0, 1, 3, 4096, 65535, 1 << 20, 5 << 20, prog::MAX_DATA];
    for size in sizes {
        match tirpc::run_client(server.addr.port(), &Workload::Verify { size }) {
            Ok(TirpcResult::Verify(v)) => {
                assert!(v.ok);
                assert_eq!(v.size, u64::from(size));
            }
            other => panic!("verify {size}: {other:?}"),
        }
    }
    let s = server.stop();
    // Each verify: NULL, ECHO, SINK, SOURCE, the refused SOURCE, NULL.
    assert_eq!(s.rpcs, 6 * sizes.len() as u64);
    assert_eq!(s.connections_opened, sizes.len() as u64);
    assert_eq!(s.connections_closed, sizes.len() as u64);
    assert_eq!(s.connections_dropped, 0);
    assert_eq!(s.records_dropped, 0);
}

#[test]
fn libtirpc_client_workloads_against_our_server() {
    if !peer_available() {
        return;
    }
    let server = OurServer::start();
    let port = server.addr.port();
    // Latency mode checks each result's length (ECHO, SOURCE).
    for (proc, size) in [
        (Proc::Null, 0),
        (Proc::Echo, 4096),
        (Proc::Sink, 4096),
        (Proc::Source, 4096),
        (Proc::Echo, 1 << 20),
        (Proc::Source, 1 << 20),
    ] {
        let w = Workload::Lat {
            proc,
            size,
            iterations: 50,
            warmup: 5,
        };
        let TirpcResult::Lat(lat) = tirpc::run_client(port, &w).unwrap() else {
            panic!("not a latency report")
        };
        assert_eq!(lat.count, 50);
        assert_eq!(lat.size, u64::from(size));
        assert!(lat.min_ns > 0 && lat.min_ns <= lat.max_ns);
    }
    // Several connections at once, one libtirpc thread each.
    for w in [
        Workload::Rate {
            depth: 4,
            seconds: 0.2,
        },
        Workload::Read {
            size: 256 << 10,
            depth: 3,
            seconds: 0.2,
        },
        Workload::Write {
            size: 256 << 10,
            depth: 3,
            seconds: 0.2,
        },
    ] {
        let (TirpcResult::Rate(t) | TirpcResult::Read(t) | TirpcResult::Write(t)) =
            tirpc::run_client(port, &w).unwrap()
        else {
            panic!("not a throughput report")
        };
        assert!(t.calls > 0, "{w:?}: {t:?}");
    }
    let s = server.stop();
    assert_eq!(s.connections_dropped, 0);
    assert_eq!(s.records_dropped, 0);
    assert!(s.rpcs >= 6 * 55);
}

#[test]
fn our_client_against_the_libtirpc_server() {
    if !peer_available() {
        return;
    }
    let server = TirpcServer::start(0).expect("start the libtirpc server");
    let addr: SocketAddr = ([127, 0, 0, 1], server.port()).into();
    let max = prog::MAX_DATA as usize;
    let data: Vec<u8> = (0..max as u32).map(|i| (i ^ (i >> 11)) as u8).collect();
    let mut client = TcpClient::connect(addr, TcpClientConfig::for_data(max, 8)).unwrap();
    let start = std::time::Instant::now();
    let mut idle = Idle::default();

    // Each size alone, then a pipelined burst of small mixed calls.
    let mut plan: Vec<(u64, usize)> = Vec::new();
    for size in [0, 1, 1000, 65536, 1 << 20, max] {
        for p in 0..4 {
            plan.push((p, size));
        }
    }
    let singles = plan.len();
    for n in 0..64u64 {
        plan.push((n % 4, (n as usize * 997) % 20_000));
    }
    let mut next = 0;
    let mut done = 0;
    let mut errors = Vec::new();
    while done < plan.len() {
        assert!(start.elapsed() < HANG, "hung");
        // One large call at a time, then up to the depth.
        while next < plan.len() && (next >= singles || client.outstanding() == 0) {
            let (p, size) = plan[next];
            let args = match p {
                0 => Args::Null,
                1 => Args::Echo(&data[..size]),
                2 => Args::Sink(&data[..size]),
                _ => Args::Source(size as u32),
            };
            match client.call(args, next as u64).unwrap() {
                Some(_) => next += 1,
                None => break,
            }
        }
        let w = client
            .poll(|r| {
                let (p, size) = plan[r.tag as usize];
                let ok = match p {
                    0 | 2 => r.check_void().is_ok(),
                    1 => r.data().is_ok_and(|d| d == &data[..size]),
                    _ => r
                        .data()
                        .is_ok_and(|d| d.len() == size && prog::pattern_mismatch(d).is_none()),
                };
                if !ok {
                    errors.push((p, size, r.check_void().err(), r.data().err()));
                }
                done += 1;
            })
            .unwrap();
        idle.wait(w);
    }
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(client.stats().replies, plan.len() as u64);
    drop(client);
    assert!(server.stderr_text().is_empty(), "{}", server.stderr_text());
    let status = server.stop().expect("stop the server");
    assert!(status.success(), "{status}");
}
