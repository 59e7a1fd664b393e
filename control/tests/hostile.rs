//! The daemon against peers that do not play along, as an outside tester
//! would try them against a running `rpcrdmad`: each case checks that the
//! daemon stays up, that a good client is served during and after, and
//! that every refusal is counted under its reason. No timing assertion:
//! deadlines only catch a hang.
//!
//! * `a_tcp_connect_burst_is_served_not_refused`: 1,000 connections opened
//!   at once to the tcp listener, against a control ring of 2 entries,
//!   are all served: the acceptor holds what the ring cannot take.
//! * `one_address_gets_its_share_of_tcp_connections_and_others_still_get_in`:
//!   past `workers.max_connections_per_peer` an address's connections are
//!   closed unread and counted `peer_limit`; another address is served,
//!   and a close makes room again.
//! * `silent_shm_setups_cost_only_themselves`: 50 connections to the shm
//!   setup socket that never say anything do not delay a good client,
//!   and are closed and counted as `setup_timeout` when their time is up.
//! * `a_roce_req_flood_from_many_addresses_is_counted_and_a_good_client_is_served`:
//!   48 loopback addresses each send 24 connection requests at once and
//!   never complete one; past 16 half-open per address the provider
//!   rejects them: every REJ a flooder reads is counted `half_open`, and
//!   a client from another address connects and is served during the
//!   flood (its time is printed, not asserted).
//! * `one_uid_gets_its_share_of_shm_connections_and_a_close_makes_room`:
//!   past `shm.max_connections_per_uid` a uid's shm connections are
//!   refused before setup and counted `peer_limit`; the ones within it
//!   are still served, and a close makes room again.
mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;

use dataplane::client::{Client, ReplyTarget};
use dataplane::service::bench::Args;
use dataplane::verbs::roce::Roce;
use dataplane::verbs::shm::Shm;
use support::bench_calls::*;
use support::roce_reqs::*;
use support::*;

fn config(
    dir: &std::path::Path,
    url: &str,
    metrics: SocketAddr,
    workers: &str,
) -> std::path::PathBuf {
    write_file(
        dir,
        "hostile.toml",
        &format!(
            "[[listeners]]\nurl = \"{url}\"\n\n[workers]\ncores = [0]\nidle = \"adaptive\"\n{workers}\n\
             [metrics]\naddress = \"{metrics}\"\n\n[rpcbind]\nregister = false\n"
        ),
    )
}

/// A NULL call of the bench program, record-marked, with `xid`.
fn null_record(xid: u32) -> Vec<u8> {
    let words = [
        0x8000_0028, // last fragment, 40 bytes
        xid,
        0, // CALL
        2,
        dataplane::service::bench::PROGRAM,
        dataplane::service::bench::VERSION,
        0, // NULL
        0,
        0, // AUTH_NONE
        0,
        0, // AUTH_NONE verifier
    ];
    words.iter().flat_map(|w| w.to_be_bytes()).collect()
}

#[test]
fn a_tcp_connect_burst_is_served_not_refused() {
    const CONNECTIONS: usize = 1000;
    const THREADS: usize = 20;
    let dir = scratch_dir("hostile-burst");
    let url = "tcp://127.0.0.42:20342";
    let addr: SocketAddr = "127.0.0.42:20342".parse().unwrap();
    let metrics: SocketAddr = "127.0.0.1:19491".parse().unwrap();
    // A control ring of 2 entries: the burst is sure to find it full.
    let cfg = config(
        &dir,
        url,
        metrics,
        "control_ring = 2\nmax_connections_per_peer = 0\n",
    );
    let mut d = Daemon::spawn(&["--config", cfg.to_str().unwrap()]);
    d.wait_for_line("started");
    // A good client's NULL round trip, quiet, then from the burst's start
    // until every connection of it was served.
    let mut good = TcpStream::connect(addr).expect("good client");
    let quiet = median_round_trip(200, |i| {
        call_null(&mut good, 900_000 + i).expect("quiet call")
    });
    let start = std::sync::Arc::new(std::sync::Barrier::new(THREADS + 1));
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let calling = {
        let (start, done) = (start.clone(), done.clone());
        std::thread::spawn(move || {
            start.wait();
            let mut took = Vec::new();
            while took.len() < 200 || !done.load(std::sync::atomic::Ordering::Relaxed) {
                let t = std::time::Instant::now();
                call_null(&mut good, 910_000 + took.len() as u32)
                    .expect("a good client's call during the burst");
                took.push(t.elapsed());
            }
            took.sort_unstable();
            (good, took[took.len() / 2], took.len())
        })
    };

    // Every thread connects its share as fast as it can (bare connects,
    // nothing else in between), and only then calls on each: the daemon
    // sees one burst, far larger than the worker's control ring.
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let start = start.clone();
            std::thread::spawn(move || {
                start.wait();
                let mut streams: Vec<TcpStream> = (0..CONNECTIONS / THREADS)
                    .map(|i| {
                        TcpStream::connect(addr)
                            .unwrap_or_else(|e| panic!("thread {t} connection {i}: {e}"))
                    })
                    .collect();
                for (i, s) in streams.iter_mut().enumerate() {
                    let xid = (t * 10_000 + i) as u32;
                    s.set_read_timeout(Some(PATIENCE)).unwrap();
                    s.write_all(&null_record(xid)).unwrap();
                    // The accepted reply: mark, xid, REPLY, MSG_ACCEPTED,
                    // AUTH_NONE verifier, SUCCESS.
                    let mut reply = [0u8; 28];
                    s.read_exact(&mut reply).unwrap_or_else(|e| {
                        panic!("thread {t} connection {i}: no reply ({e}): refused?")
                    });
                    assert_eq!(reply[4..8], xid.to_be_bytes());
                    assert_eq!(reply[24..28], [0; 4], "SUCCESS");
                }
                streams
            })
        })
        .collect();
    let streams: Vec<TcpStream> = threads
        .into_iter()
        .flat_map(|h| h.join().expect("a connection of the burst was not served"))
        .collect();
    assert_eq!(streams.len(), CONNECTIONS);
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let (good, attacked, calls) = calling.join().expect("the good client was served");
    report_good_client(
        &format!("tcp connect burst, {calls} calls during it"),
        quiet,
        attacked,
    );

    let body = scrape_until(
        metrics,
        "rpcrdma_listener_connections_total",
        CONNECTIONS as u64 + 1,
    );
    assert_eq!(
        metric(&body, "rpcrdma_listener_rejected_total"),
        0,
        "{body}"
    );
    drop((streams, good));
    d.stop_cleanly();
    let _ = std::fs::remove_dir_all(dir);
}

/// Sends a NULL on `s` and reads its accepted reply.
fn call_null(s: &mut TcpStream, xid: u32) -> std::io::Result<()> {
    s.set_read_timeout(Some(PATIENCE))?;
    s.write_all(&null_record(xid))?;
    let mut reply = [0u8; 28];
    s.read_exact(&mut reply)?;
    assert_eq!(reply[4..8], xid.to_be_bytes());
    assert_eq!(reply[24..28], [0; 4], "SUCCESS");
    Ok(())
}

/// A TCP connection to `addr` from `from` (any port).
fn connect_from(from: std::net::Ipv4Addr, addr: std::net::SocketAddrV4) -> TcpStream {
    use nix::sys::socket::{bind, connect, socket, AddressFamily, SockFlag, SockType, SockaddrIn};
    use std::os::fd::AsRawFd;
    let fd = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    bind(
        fd.as_raw_fd(),
        &SockaddrIn::from(std::net::SocketAddrV4::new(from, 0)),
    )
    .unwrap();
    connect(fd.as_raw_fd(), &SockaddrIn::from(addr)).unwrap();
    TcpStream::from(fd)
}

#[test]
fn one_address_gets_its_share_of_tcp_connections_and_others_still_get_in() {
    const LIMIT: usize = 4;
    let dir = scratch_dir("hostile-peer-limit");
    let url = "tcp://127.0.0.43:20343";
    let addr: std::net::SocketAddrV4 = "127.0.0.43:20343".parse().unwrap();
    let metrics: SocketAddr = "127.0.0.1:19493".parse().unwrap();
    let cfg = config(
        &dir,
        url,
        metrics,
        &format!("max_connections_per_peer = {LIMIT}\n"),
    );
    let mut d = Daemon::spawn(&["--config", cfg.to_str().unwrap()]);
    d.wait_for_line("started");
    let greedy: std::net::Ipv4Addr = "127.0.0.2".parse().unwrap();
    let other: std::net::Ipv4Addr = "127.0.0.3".parse().unwrap();

    // The greedy address's first LIMIT connections are served...
    let mut held: Vec<TcpStream> = (0..LIMIT).map(|_| connect_from(greedy, addr)).collect();
    for (i, s) in held.iter_mut().enumerate() {
        call_null(s, i as u32).expect("a connection within the limit is served");
    }
    // ...the next one is closed unread and counted...
    let mut over = connect_from(greedy, addr);
    over.set_read_timeout(Some(PATIENCE)).unwrap();
    let _ = over.write_all(&null_record(99));
    let mut byte = [0u8; 1];
    match over.read(&mut byte) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("a connection past the limit was not closed: {other:?}"),
    }
    let body = scrape_until(metrics, "rpcrdma_listener_rejected_total", 1);
    assert_eq!(rejected(&body, "peer_limit"), 1, "{body}");
    // ...while another address is served.
    let mut good = connect_from(other, addr);
    call_null(&mut good, 1000).expect("another address is served");
    // A close makes room for the greedy address again (once the worker
    // has seen it: retried until the deadline).
    drop(held.pop());
    let deadline = std::time::Instant::now() + PATIENCE;
    let mut refused_more = 0;
    loop {
        let mut again = connect_from(greedy, addr);
        if call_null(&mut again, 2000).is_ok() {
            break;
        }
        refused_more += 1;
        assert!(
            std::time::Instant::now() < deadline,
            "the close never made room"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let body = scrape_until(metrics, "rpcrdma_listener_rejected_total", 1);
    assert_eq!(rejected(&body, "peer_limit"), 1 + refused_more, "{body}");
    drop((held, good));
    d.stop_cleanly();
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn silent_shm_setups_cost_only_themselves() {
    const SILENT: usize = 50;
    let dir = scratch_dir("hostile-silent");
    let url = format!("shm://{}/d.sock", dir.display());
    let metrics: SocketAddr = "127.0.0.1:19492".parse().unwrap();
    let cfg = config(&dir, &url, metrics, "");
    let mut d = Daemon::spawn(&["--config", cfg.to_str().unwrap()]);
    d.wait_for_line("started");
    let sock = dir.join("d.sock");
    // The quiet figure: a client's NULL round trip before the attack.
    let mut first = Client::<Shm>::connect(&url, client_config(1 << 20, 4)).expect("quiet client");
    let quiet = median_round_trip(200, |_| {
        simple_call(&mut first, Args::Null, ReplyTarget::Inline);
    });
    first.close().expect("close");

    // Connected, never a word (the setup socket is SOCK_SEQPACKET; a
    // stream socket cannot connect to it, so use the same type).
    let silent: Vec<UnixStream> = (0..SILENT)
        .map(|_| {
            let fd = nix::sys::socket::socket(
                nix::sys::socket::AddressFamily::Unix,
                nix::sys::socket::SockType::SeqPacket,
                nix::sys::socket::SockFlag::SOCK_CLOEXEC,
                None,
            )
            .unwrap();
            let addr = nix::sys::socket::UnixAddr::new(&sock).unwrap();
            nix::sys::socket::connect(std::os::fd::AsRawFd::as_raw_fd(&fd), &addr).unwrap();
            UnixStream::from(fd)
        })
        .collect();

    // A good client comes after them and is served at once: its connect
    // would time out if it queued behind fifty 5-second setup timeouts.
    let mut good = Client::<Shm>::connect(&url, client_config(1 << 20, 4)).expect("good client");
    let attacked = median_round_trip(200, |_| {
        simple_call(&mut good, Args::Null, ReplyTarget::Inline);
    });
    report_good_client("50 silent shm setups", quiet, attacked);

    // The silent ones are closed when their setup time is up, and counted.
    let body = scrape_until(metrics, "rpcrdma_listener_rejected_total", SILENT as u64);
    assert_eq!(rejected(&body, "setup_timeout"), SILENT as u64, "{body}");
    assert_eq!(
        metric(&body, "rpcrdma_listener_connections_total"),
        2,
        "the quiet client and the good one: {body}"
    );
    for s in &silent {
        let mut byte = [0u8; 1];
        assert_eq!(
            nix::sys::socket::recv(
                std::os::fd::AsRawFd::as_raw_fd(s),
                &mut byte,
                nix::sys::socket::MsgFlags::MSG_DONTWAIT
            ),
            Ok(0),
            "a silent connection left open"
        );
    }
    // Fifty refusals in a flood: a line at once, the rest summed up later
    // (rate-limited), never a line each.
    let lines = d
        .stderr()
        .lines()
        .filter(|l| l.contains("connection refused"))
        .count();
    assert!(
        (1..SILENT).contains(&lines),
        "{lines} refusal lines:\n{}",
        d.stderr()
    );
    // The good client is still served.
    simple_call(&mut good, Args::Null, ReplyTarget::Inline);
    good.close().expect("close");
    drop(silent);
    d.stop_cleanly();
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn one_uid_gets_its_share_of_shm_connections_and_a_close_makes_room() {
    // Tests run as one uid: the cap is shown on it, with a small limit.
    const LIMIT: usize = 2;
    let dir = scratch_dir("hostile-uid-limit");
    let url = format!("shm://{}/d.sock", dir.display());
    let metrics: SocketAddr = "127.0.0.1:19494".parse().unwrap();
    let cfg = config(
        &dir,
        &url,
        metrics,
        &format!("\n[shm]\nmax_connections_per_uid = {LIMIT}\n"),
    );
    let mut d = Daemon::spawn(&["--config", cfg.to_str().unwrap()]);
    d.wait_for_line("started");

    // The uid's first LIMIT connections are served...
    let mut held: Vec<Client<Shm>> = (0..LIMIT)
        .map(|_| Client::<Shm>::connect(&url, client_config(1 << 20, 4)).expect("within the limit"))
        .collect();
    for c in &mut held {
        simple_call(c, Args::Null, ReplyTarget::Inline);
    }
    // ...the next one is refused before its setup, and counted.
    let over = Client::<Shm>::connect(&url, client_config(1 << 20, 4));
    assert!(over.is_err(), "a connection past the limit was served");
    let body = scrape_until(metrics, "rpcrdma_listener_rejected_total", 1);
    assert_eq!(rejected(&body, "peer_limit"), 1, "{body}");
    // The connections within the limit are still served.
    for c in &mut held {
        simple_call(c, Args::Null, ReplyTarget::Inline);
    }
    // A close makes room (once the worker has released the connection:
    // retried until the deadline).
    held.pop().unwrap().close().expect("close");
    let deadline = std::time::Instant::now() + PATIENCE;
    let mut refused_more = 0;
    let mut again = loop {
        match Client::<Shm>::connect(&url, client_config(1 << 20, 4)) {
            Ok(c) => break c,
            Err(_) => refused_more += 1,
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the close never made room"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    simple_call(&mut again, Args::Null, ReplyTarget::Inline);
    let body = scrape_until(metrics, "rpcrdma_listener_rejected_total", 1);
    assert_eq!(rejected(&body, "peer_limit"), 1 + refused_more, "{body}");
    let lines = d
        .stderr()
        .lines()
        .filter(|l| l.contains("connection refused") && l.contains("max_connections_per_uid"))
        .count();
    assert!(
        lines >= 1,
        "no refusal line naming the key:\n{}",
        d.stderr()
    );
    again.close().expect("close");
    for c in held {
        c.close().expect("close");
    }
    d.stop_cleanly();
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_roce_req_flood_from_many_addresses_is_counted_and_a_good_client_is_served() {
    // 48 x 16 requests queued stay below the listener's 1,024, so no
    // newcomer has to take a flooder's place.
    const ADDRESSES: u8 = 48;
    const PER_ADDRESS: u32 = 24;
    const HALF_OPEN_PER_ADDRESS: u32 = 16;
    let dir = scratch_dir("hostile-roce-flood");
    let server = std::net::Ipv4Addr::new(127, 0, 0, 72);
    let good_ip = std::net::Ipv4Addr::new(127, 0, 0, 73);
    let port = 20672;
    let url = format!("roce://{server}:{port}");
    let metrics: SocketAddr = "127.0.0.1:19497".parse().unwrap();
    let cfg = config(&dir, &url, metrics, "");
    let mut d = Daemon::spawn(&["--config", cfg.to_str().unwrap()]);
    d.wait_for_line("started");
    // The quiet figure, from the good client's address before the flood.
    let good_url = format!("{url}?local={good_ip}");
    let mut first =
        Client::<Roce>::connect(&good_url, client_config(1 << 20, 4)).expect("quiet client");
    let quiet = median_round_trip(200, |_| {
        simple_call(&mut first, Args::Null, ReplyTarget::Inline);
    });
    first.close().expect("close");

    // Every address floods at once, from a thread of its own.
    let flooders: Vec<_> = (1..=ADDRESSES)
        .map(|a| {
            std::thread::spawn(move || {
                flood_reqs(
                    std::net::Ipv4Addr::new(127, 0, 2, a),
                    server,
                    port,
                    PER_ADDRESS,
                    u32::from(a) << 16,
                )
            })
        })
        .collect();
    // The good client connects while the flood arrives and is served.
    let started = std::time::Instant::now();
    let mut good = Client::<Roce>::connect(&good_url, client_config(1 << 20, 4))
        .expect("a good client connects during the flood");
    let connected = started.elapsed();
    simple_call(&mut good, Args::Null, ReplyTarget::Inline);
    println!(
        "good client during the flood: connected in {connected:?}, first call answered at {:?}",
        started.elapsed()
    );
    let attacked = median_round_trip(200, |_| {
        simple_call(&mut good, Args::Null, ReplyTarget::Inline);
    });
    report_good_client("roce REQ flood", quiet, attacked);
    let sockets: Vec<std::net::UdpSocket> =
        flooders.into_iter().map(|f| f.join().unwrap()).collect();
    // Refusals happen and every one a flooder was told of is counted
    // (scraped after the REJs were read, so the count can only be ahead).
    let body = scrape_until(metrics, "rpcrdma_listener_rejected_total", 1);
    let told: u64 = sockets.iter().map(refusals_received).sum();
    let body = if rejected(&body, "half_open") >= told {
        body
    } else {
        scrape_until(metrics, "rpcrdma_listener_rejected_total", told)
    };
    let counted = rejected(&body, "half_open");
    let bound = u64::from(ADDRESSES) * u64::from(PER_ADDRESS - HALF_OPEN_PER_ADDRESS);
    assert!(
        told >= 1 && counted >= told && counted <= bound,
        "told {told}, counted {counted}, at most {bound}:\n{body}"
    );
    // Requests the device could not even queue for its connection
    // manager (a burst larger than its MAD queue while the worker drives
    // the device) are counted apart, never half-open.
    let dropped = rejected(&body, "cm_queue_full");
    println!("flood: {counted} requests refused half-open (the bound alone refuses {bound}), {told} REJs read by the flooders so far, {dropped} connection-manager messages dropped on a full queue");
    // Logged rate-limited: a few lines, never one per refusal.
    let lines = d
        .stderr()
        .lines()
        .filter(|l| l.contains("half-open"))
        .count();
    assert!(
        (1..counted as usize).contains(&lines),
        "{lines} refusal lines:\n{}",
        d.stderr()
    );
    // Still served after the flood.
    for _ in 0..10 {
        simple_call(&mut good, Args::Null, ReplyTarget::Inline);
    }
    good.close().expect("close");
    drop(sockets);
    d.stop_cleanly();
    let _ = std::fs::remove_dir_all(dir);
}
