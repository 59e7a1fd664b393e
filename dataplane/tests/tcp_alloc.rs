//! Over TCP too: no heap allocation per RPC in steady state. A
//! `TcpServer` and a `TcpClient` are polled from one thread (so the
//! per-thread counting allocator sees both sides); after a warm-up that
//! touches every buffer, thousands of pipelined RPCs of every procedure,
//! small and large, must allocate zero times on either side.

mod support;

use std::time::Duration;

use dataplane::engine::Instant;
use dataplane::service::bench::{self, Args, Proc};
use dataplane::service::ServiceTable;
use dataplane::tcp::{TcpClient, TcpClientConfig, TcpConfig, TcpServer};
use support::alloc_counter::{measure, CountingAllocator};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// Guards against hangs only.
const HANG: Duration = Duration::from_secs(300);

struct Pair {
    server: TcpServer,
    services: ServiceTable,
    client: TcpClient,
    data: Vec<u8>,
    start: std::time::Instant,
    errors: u64,
}

impl Pair {
    /// `calls` calls cycling through the procedures and sizes, `depth`
    /// outstanding, every reply checked (without allocating).
    fn run(&mut self, calls: u64) {
        let sizes = [0usize, 1, 100, 4096, 65536, 1 << 20];
        let mut sent = 0u64;
        let mut done = 0u64;
        let mut spins = 0u32;
        let Pair {
            server,
            services,
            client,
            data,
            start,
            errors,
        } = self;
        while done < calls {
            assert!(start.elapsed() < HANG, "hung");
            while sent < calls {
                let size = sizes[(sent / 4) as usize % sizes.len()];
                let args = match sent % 4 {
                    0 => Args::Null,
                    1 => Args::Echo(&data[..size]),
                    2 => Args::Sink(&data[..size]),
                    _ => Args::Source(size as u32),
                };
                match client.call(args, size as u64).unwrap() {
                    Some(_) => sent += 1,
                    None => break,
                }
            }
            let now = Instant(start.elapsed().as_nanos() as u64);
            let mut work = server.poll(services, now);
            work += client
                .poll(|r| {
                    let size = r.tag as usize;
                    let ok = match r.procedure {
                        Proc::Null | Proc::Sink => r.check_void().is_ok(),
                        Proc::Echo => r.data().is_ok_and(|d| d == &data[..size]),
                        Proc::Source => r
                            .data()
                            .is_ok_and(|d| d.len() == size && bench::pattern_mismatch(d).is_none()),
                    };
                    if !ok {
                        *errors += 1;
                    }
                    done += 1;
                })
                .unwrap();
            // Adaptive idle without the clock or allocation.
            if work == 0 {
                spins += 1;
                if spins > 100 {
                    std::thread::yield_now();
                }
            } else {
                spins = 0;
            }
        }
    }
}

#[test]
fn steady_state_rpcs_over_tcp_allocate_nothing() {
    let server = TcpServer::bind(
        "127.0.0.1:0".parse().unwrap(),
        TcpConfig {
            max_record_len: (1 << 20) + 4096,
            max_reply_len: (1 << 20) + 4096,
            ..TcpConfig::default()
        },
    )
    .unwrap();
    let client =
        TcpClient::connect(server.local_addr(), TcpClientConfig::for_data(1 << 20, 4)).unwrap();
    let mut pair = Pair {
        server,
        services: ServiceTable::builtin(),
        client,
        data: (0..1u32 << 20).map(|i| (i % 251) as u8).collect(),
        start: std::time::Instant::now(),
        errors: 0,
    };
    // Warm-up: accepts the connection, touches every buffer page.
    pair.run(200);
    assert_eq!(pair.server.connections().len(), 1);
    let ((), allocated) = measure(|| pair.run(4000));
    assert_eq!(pair.errors, 0, "replies that did not check out");
    assert_eq!(
        allocated.count, 0,
        "{allocated:?} over 4000 RPCs (server and client, one thread)"
    );
    assert_eq!(pair.server.stats().rpcs, 4200);
    assert_eq!(pair.client.stats().replies, 4200);
}
