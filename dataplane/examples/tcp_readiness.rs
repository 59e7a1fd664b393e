//! How should a `TcpConnections` pass find its busy connections: a `read`
//! on every socket, one `poll(2)` first, or epoll? This measures each, in one run
//! on this machine (docs/TCP.md, "Readiness", records the figures):
//!
//! 1. the cost of an idle pass (no connection has data) for 1..=256
//!    connections, per `Readiness` mode;
//! 2. the NULL round trip over one of N connections (the others idle),
//!    client and server polled from this thread.
//!
//! `cargo run -p dataplane --example tcp_readiness [--release]`. A
//! benchmark, not a test: it asserts nothing about speed.

use std::hint::black_box;
use std::net::{TcpListener, TcpStream};
use std::time::Instant as Clock;

use dataplane::engine::Instant;
use dataplane::service::bench::Args;
use dataplane::service::ServiceTable;
use dataplane::tcp::{Readiness, TcpClient, TcpClientConfig, TcpConfig, TcpConnections};

fn set(n: usize, mode: Readiness) -> (TcpConnections, Vec<TcpStream>, TcpListener) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut conns = TcpConnections::new(TcpConfig {
        readiness: mode,
        idle_timeout: None,
        max_record_len: 4096,
        max_reply_len: 4096,
        ..TcpConfig::default()
    })
    .unwrap();
    let clients = (0..n)
        .map(|_| {
            let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let (s, _) = l.accept().unwrap();
            conns.add(s, Instant(0)).unwrap();
            c
        })
        .collect();
    (conns, clients, l)
}

fn main() {
    let services = ServiceTable::builtin();
    let modes = [
        ("read-all", Readiness::ReadAll),
        ("poll(2)", Readiness::Poll),
        ("epoll", Readiness::Epoll),
    ];
    println!("idle pass, ns per pass");
    println!(
        "{:>6} {:>10} {:>10} {:>10}",
        "conns", modes[0].0, modes[1].0, modes[2].0
    );
    for n in [1, 2, 3, 4, 8, 16, 64, 256, 1000] {
        let mut row = Vec::new();
        for (_, mode) in modes {
            let (mut conns, _clients, _l) = set(n, mode);
            let passes = (200_000 / n).max(2000);
            let t = Clock::now();
            for _ in 0..passes {
                black_box(conns.poll(&services, Instant(0)));
            }
            row.push(t.elapsed().as_nanos() as f64 / passes as f64);
        }
        println!("{n:>6} {:>10.0} {:>10.0} {:>10.0}", row[0], row[1], row[2]);
    }

    println!("\nNULL round trip over 1 of N connections, ns");
    println!(
        "{:>6} {:>10} {:>10} {:>10}",
        "conns", modes[0].0, modes[1].0, modes[2].0
    );
    for n in [1, 2, 3, 4, 8, 64, 1000] {
        let mut row = Vec::new();
        for (_, mode) in modes {
            let (mut conns, _idle_clients, l) = set(n - 1, mode);
            let mut client =
                TcpClient::connect(l.local_addr().unwrap(), TcpClientConfig::for_data(0, 1))
                    .unwrap();
            let (s, _) = l.accept().unwrap();
            conns.add(s, Instant(0)).unwrap();
            let calls = if n > 100 { 2_000 } else { 20_000 };
            let t = Clock::now();
            for _ in 0..calls {
                client.call(Args::Null, 0).unwrap().unwrap();
                let mut got = false;
                while !got {
                    conns.poll(&services, Instant(0));
                    client.poll(|_| got = true).unwrap();
                }
            }
            row.push(t.elapsed().as_nanos() as f64 / calls as f64);
        }
        println!("{n:>6} {:>10.0} {:>10.0} {:>10.0}", row[0], row[1], row[2]);
    }
}
