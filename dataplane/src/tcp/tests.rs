//! Record-marking paths of the TCP server and client over loopback, in one
//! thread: the server is polled between the test's own socket operations,
//! so every byte boundary is chosen by the test (fragments, pipelining,
//! calls split across reads, hostile record marks, back-pressure).

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use super::*;
use crate::engine::Instant;
use crate::service::bench::{self, encode_call, Args};
use crate::service::ServiceTable;
use crate::wire::rpc::{
    AcceptStatus, OpaqueAuth, RecordMarker, RecordReassembler, ReplyBody, ReplyHeader,
};

/// Guards against hangs only; never a statement about speed.
const HANG: Duration = Duration::from_secs(60);

/// Spin, then yield, then sleep briefly (the workers' `adaptive` idle).
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
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

fn now() -> Instant {
    use std::sync::OnceLock;
    static START: OnceLock<std::time::Instant> = OnceLock::new();
    let start = *START.get_or_init(std::time::Instant::now);
    Instant(start.elapsed().as_nanos() as u64)
}

struct Rig {
    listener: TcpListener,
    conns: TcpConnections,
    services: ServiceTable,
}

impl Rig {
    fn new(cfg: TcpConfig) -> Rig {
        Rig {
            listener: TcpListener::bind("127.0.0.1:0").unwrap(),
            conns: TcpConnections::new(cfg).unwrap(),
            services: ServiceTable::builtin(),
        }
    }

    fn addr(&self) -> SocketAddr {
        self.listener.local_addr().unwrap()
    }

    /// A raw client socket whose server side is in `conns`.
    fn connect(&mut self) -> TcpStream {
        let client = TcpStream::connect(self.addr()).unwrap();
        let (s, _) = self.listener.accept().unwrap();
        self.conns.add(s, now()).unwrap();
        client.set_nonblocking(true).unwrap();
        client
    }

    fn poll(&mut self) -> usize {
        self.conns.poll(&self.services, now())
    }

    /// [`connect`](Self::connect) with fixed socket buffers of `bytes` on
    /// the client's receive side and the server's send side (no autotuning).
    fn connect_small_buffers(&mut self, bytes: usize) -> TcpStream {
        use nix::sys::socket::{setsockopt, sockopt};
        let client = TcpStream::connect(self.addr()).unwrap();
        setsockopt(&client, sockopt::RcvBuf, &bytes).unwrap();
        let (s, _) = self.listener.accept().unwrap();
        setsockopt(&s, sockopt::SndBuf, &bytes).unwrap();
        self.conns.add(s, now()).unwrap();
        client.set_nonblocking(true).unwrap();
        client
    }

    /// Polls the server until `done` holds.
    fn pump(&mut self, mut done: impl FnMut(&mut Rig) -> bool) {
        let start = std::time::Instant::now();
        let mut idle = Idle(0);
        while !done(self) {
            assert!(start.elapsed() < HANG, "hung");
            let w = self.poll();
            idle.wait(w);
        }
    }

    /// Polls the server and reads `client` until `n` reply records arrived.
    fn replies(&mut self, client: &mut TcpStream, n: usize) -> Vec<Vec<u8>> {
        let mut r = RecordReassembler::new(DEFAULT_MAX_MESSAGE_LEN);
        let mut out = Vec::new();
        let mut buf = vec![0u8; 1 << 16];
        self.pump(|rig| {
            let _ = rig;
            match client.read(&mut buf) {
                Ok(0) => panic!("server closed the connection"),
                Ok(k) => {
                    let mut input = &buf[..k];
                    while !input.is_empty() {
                        let used = r.push(input).unwrap();
                        input = &input[used..];
                        if let Some(rec) = r.poll_record() {
                            out.push(rec.to_vec());
                        }
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
            out.len() >= n
        });
        out
    }

    /// Polls until the server has closed `client`'s connection (end of
    /// stream or reset on the client side).
    fn wait_closed(&mut self, client: &mut TcpStream) {
        let mut buf = [0u8; 4096];
        self.pump(|_| match client.read(&mut buf) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) if e.kind() == ErrorKind::WouldBlock => false,
            Err(_) => true,
        });
    }
}

/// A call message (no record mark).
fn call(xid: u32, args: Args<'_>) -> Vec<u8> {
    let data = match args {
        Args::Echo(d) | Args::Sink(d) => d.len(),
        Args::Null | Args::Source(_) => 0,
    };
    let mut b = vec![0u8; 100 + data];
    let c = encode_call(&mut b, xid, args).unwrap();
    b.truncate(c.len);
    b
}

/// `msg` as one record of fragments of the given lengths (the rest in the
/// last one).
fn fragmented(msg: &[u8], lens: &[usize]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut rest = msg;
    for &l in lens {
        let mark = RecordMarker::new(l, false).unwrap().to_word();
        out.extend_from_slice(&mark.to_be_bytes());
        out.extend_from_slice(&rest[..l]);
        rest = &rest[l..];
    }
    let mark = RecordMarker::new(rest.len(), true).unwrap().to_word();
    out.extend_from_slice(&mark.to_be_bytes());
    out.extend_from_slice(rest);
    out
}

fn record(msg: &[u8]) -> Vec<u8> {
    fragmented(msg, &[])
}

fn xid_of(reply: &[u8]) -> u32 {
    u32::from_be_bytes(reply[..4].try_into().unwrap())
}

fn write_all(client: &mut TcpStream, rig: &mut Rig, mut bytes: &[u8]) {
    // The client socket is non-blocking: keep the server polling while the
    // bytes go out, or a large write could wait on a full server socket.
    rig.pump(|_| {
        match client.write(bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => panic!("{e}"),
        }
        bytes.is_empty()
    });
}

fn all_modes() -> [Readiness; 4] {
    [
        Readiness::ReadAll,
        Readiness::Poll,
        Readiness::Epoll,
        Readiness::Auto { poll_from: 2 },
    ]
}

#[test]
fn a_call_in_several_fragments_is_answered() {
    // RFC 5531 s11: a record is any number of fragments, the last one
    // flagged; zero-length fragments are legal.
    let data: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
    let msg = call(7, Args::Echo(&data));
    let mut rig = Rig::new(TcpConfig::default());
    let mut c = rig.connect();
    write_all(&mut c, &mut rig, &fragmented(&msg, &[3, 0, 40, 500]));
    let r = rig.replies(&mut c, 1);
    assert_eq!(xid_of(&r[0]), 7);
    assert_eq!(bench::decode_data_reply(&r[0], None).unwrap(), &data[..]);
    assert_eq!(rig.conns.stats().rpcs, 1);
}

#[test]
fn pipelined_calls_in_one_write_are_all_answered_in_order() {
    for mode in all_modes() {
        let mut rig = Rig::new(TcpConfig {
            readiness: mode,
            ..TcpConfig::default()
        });
        let mut c = rig.connect();
        let _other = rig.connect();
        let mut bytes = Vec::new();
        for xid in 0..100u32 {
            let size = (xid as usize * 37) % 3000;
            let data = vec![xid as u8; size];
            let args = match xid % 4 {
                0 => Args::Null,
                1 => Args::Echo(&data),
                2 => Args::Sink(&data),
                _ => Args::Source(size as u32),
            };
            bytes.extend(record(&call(xid, args)));
        }
        write_all(&mut c, &mut rig, &bytes);
        let replies = rig.replies(&mut c, 100);
        for (xid, r) in replies.iter().enumerate() {
            assert_eq!(xid_of(r), xid as u32, "{mode:?}");
            let size = (xid * 37) % 3000;
            match xid % 4 {
                0 | 2 => bench::decode_void_reply(r).unwrap(),
                1 => assert_eq!(
                    bench::decode_data_reply(r, None).unwrap(),
                    &vec![xid as u8; size][..]
                ),
                _ => {
                    let d = bench::decode_data_reply(r, None).unwrap();
                    assert_eq!(d.len(), size);
                    assert_eq!(bench::pattern_mismatch(d), None);
                }
            }
        }
        assert_eq!(rig.conns.stats().rpcs, 100, "{mode:?}");
        assert_eq!(rig.conns.len(), 2);
    }
}

#[test]
fn a_call_split_across_many_reads_is_answered() {
    // Every split point, including inside the record mark: the bytes leave
    // in pieces of 1..=7 bytes with a server pass after each.
    let data = vec![0xA5u8; 777];
    let bytes = [
        record(&call(1, Args::Echo(&data))),
        fragmented(&call(2, Args::Source(5)), &[6, 6]),
    ]
    .concat();
    let mut rig = Rig::new(TcpConfig::default());
    let mut c = rig.connect();
    let mut at = 0;
    let mut step = 1;
    while at < bytes.len() {
        let end = (at + step).min(bytes.len());
        write_all(&mut c, &mut rig, &bytes[at..end]);
        // Let the server see this piece alone before the next one.
        let before = rig.conns.stats().bytes_in;
        rig.pump(|r| r.conns.stats().bytes_in > before);
        at = end;
        step = step % 7 + 1;
    }
    let r = rig.replies(&mut c, 2);
    assert_eq!(bench::decode_data_reply(&r[0], None).unwrap(), &data[..]);
    assert_eq!(
        bench::decode_data_reply(&r[1], None).unwrap(),
        &[7, 38, 69, 100, 131]
    );
    assert!(rig.conns.stats().bytes_in >= bytes.len() as u64);
}

#[test]
fn an_oversized_record_costs_only_its_connection() {
    let cfg = TcpConfig {
        max_record_len: 4096,
        ..TcpConfig::default()
    };
    for bad in [
        // One fragment over the limit.
        RecordMarker::new(4097, true)
            .unwrap()
            .to_word()
            .to_be_bytes()
            .to_vec(),
        // Garbage: "GET / HTTP/1.1" reads as a 1.2 GB fragment.
        b"GET / HTTP/1.1\r\n\r\n".to_vec(),
        // Fragments that add up to more than the limit.
        fragmented(&[0u8; 5000], &[4000]),
    ] {
        let mut rig = Rig::new(cfg);
        let mut good = rig.connect();
        let mut evil = rig.connect();
        write_all(&mut evil, &mut rig, &bad);
        rig.wait_closed(&mut evil);
        let s = *rig.conns.stats();
        assert_eq!(s.oversized_records, 1);
        assert_eq!(s.connections_dropped, 1);
        assert_eq!(rig.conns.len(), 1);
        write_all(&mut good, &mut rig, &record(&call(9, Args::Null)));
        let r = rig.replies(&mut good, 1);
        assert_eq!(xid_of(&r[0]), 9);
    }
}

#[test]
fn a_record_that_is_no_call_gets_no_answer_and_the_connection_stays() {
    let mut rig = Rig::new(TcpConfig::default());
    let mut c = rig.connect();
    let mut reply = [0u8; 64];
    let mut enc = crate::wire::xdr::Encoder::new(&mut reply);
    ReplyHeader::accepted(5, OpaqueAuth::None, AcceptStatus::Success)
        .emit(&mut enc)
        .unwrap();
    let n = enc.position();
    let bytes = [
        record(&reply[..n]),
        record(&[]),
        record(&[1, 2, 3]),
        record(&call(6, Args::Null)),
    ]
    .concat();
    write_all(&mut c, &mut rig, &bytes);
    let r = rig.replies(&mut c, 1);
    assert_eq!(xid_of(&r[0]), 6);
    assert_eq!(rig.conns.stats().records_dropped, 3);
    assert_eq!(rig.conns.stats().rpcs, 1);
    assert_eq!(rig.conns.len(), 1);
}

#[test]
fn unknown_programs_get_rpc_errors_over_tcp() {
    let mut rig = Rig::new(TcpConfig::default());
    let mut c = rig.connect();
    let mut msg = call(3, Args::Null);
    msg[12..16].copy_from_slice(&0x4000_0000u32.to_be_bytes());
    write_all(&mut c, &mut rig, &record(&msg));
    let r = rig.replies(&mut c, 1);
    let (h, _) = ReplyHeader::parse(&r[0]).unwrap();
    assert!(matches!(h.body, ReplyBody::Accepted(a) if a.status == AcceptStatus::ProgUnavail));
}

#[test]
fn end_of_stream_inside_a_record_is_counted_as_truncated() {
    let mut rig = Rig::new(TcpConfig::default());
    let mut c = rig.connect();
    let bytes = record(&call(1, Args::Echo(&[1; 100])));
    write_all(&mut c, &mut rig, &bytes[..50]);
    c.shutdown(Shutdown::Write).unwrap();
    rig.pump(|r| r.conns.is_empty());
    assert_eq!(rig.conns.stats().truncated_records, 1);
    assert_eq!(rig.conns.stats().connections_dropped, 1);
}

#[test]
fn a_half_closed_peer_gets_every_reply_before_the_close() {
    let mut rig = Rig::new(TcpConfig::default());
    let mut c = rig.connect();
    let bytes: Vec<u8> = (0..20)
        .flat_map(|x| record(&call(x, Args::Source(10_000))))
        .collect();
    write_all(&mut c, &mut rig, &bytes);
    c.shutdown(Shutdown::Write).unwrap();
    let r = rig.replies(&mut c, 20);
    assert_eq!(r.len(), 20);
    rig.wait_closed(&mut c);
    rig.pump(|r| r.conns.is_empty());
    let s = rig.conns.stats();
    assert_eq!((s.connections_closed, s.connections_dropped), (1, 0));
    assert_eq!(s.rpcs, 20);
}

/// Moves the calling thread (only) into a network namespace of its own with
/// just `lo` up, so a test that depends on kernel TCP state (the
/// per-destination metrics cache, autotuned buffers) starts from a known
/// one. Sockets opened by this thread afterwards live there. Without the
/// privilege for it (not root), returns false and the test runs in the
/// current namespace.
fn private_netns() -> bool {
    use nix::sched::{unshare, CloneFlags};
    if let Err(e) = unshare(CloneFlags::CLONE_NEWNET) {
        println!("note: no private network namespace ({e}); using the current one");
        return false;
    }
    // SIOCSIFFLAGS lo |= IFF_UP on a socket of the new namespace.
    // SAFETY: ifreq is plain data; the name fits; the fd is ours.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0, "socket in the new namespace");
        let mut req: libc::ifreq = std::mem::zeroed();
        for (d, s) in req.ifr_name.iter_mut().zip(b"lo\0") {
            *d = *s as libc::c_char;
        }
        assert_eq!(
            libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req),
            0,
            "SIOCGIFFLAGS lo"
        );
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        assert_eq!(
            libc::ioctl(fd, libc::SIOCSIFFLAGS, &req),
            0,
            "SIOCSIFFLAGS lo up"
        );
        libc::close(fd);
    }
    true
}

#[test]
fn a_peer_that_does_not_read_is_slowed_not_buffered() {
    // Kernel TCP state left by earlier loopback traffic (a tcp_metrics
    // entry for 127.0.0.1) changes how much the sockets absorb; start clean.
    private_netns();
    // Read directly (one connection) and through epoll, where the stalled
    // socket is watched for room to write only.
    for readiness in [Readiness::default(), Readiness::Epoll] {
        peer_that_does_not_read(readiness);
    }
}

fn peer_that_does_not_read(readiness: Readiness) {
    // Small limits: one 64 KiB reply fills the output, so the server must
    // stop taking calls until the client reads.
    let cfg = TcpConfig {
        max_record_len: 70_000,
        max_reply_len: 70_000,
        batch_len: 4096,
        readiness,
        ..TcpConfig::default()
    };
    let mut rig = Rig::new(cfg);
    // Fixed, small socket buffers on both sides of the stalled direction:
    // autotuning could otherwise absorb all 4 MiB of replies, and the
    // server would never have to stall.
    let mut c = rig.connect_small_buffers(65536);
    let data = vec![0x3Cu8; 65536];
    let calls = 64;
    let bytes: Vec<u8> = (0..calls)
        .flat_map(|x| record(&call(x, Args::Echo(&data))))
        .collect();
    // 4 MiB of calls without reading a reply: the server stalls on its
    // output, its socket fills, and our writes block. Wait for the event
    // itself (the stall), keeping the calls coming; the deadline in `pump`
    // means broken.
    let mut sent = 0;
    rig.pump(|rig| {
        if sent < bytes.len() {
            match c.write(&bytes[sent..]) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
        }
        rig.conns.stats().output_stalls > 0
    });
    assert!(rig.conns.stats().rpcs < u64::from(calls));
    // Now read while writing the rest: everything arrives, in order.
    let mut r = RecordReassembler::new(DEFAULT_MAX_MESSAGE_LEN);
    let mut got = 0u32;
    let mut buf = vec![0u8; 1 << 16];
    rig.pump(|_| {
        if sent < bytes.len() {
            match c.write(&bytes[sent..]) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
        }
        match c.read(&mut buf) {
            Ok(0) => panic!("closed"),
            Ok(k) => {
                let mut input = &buf[..k];
                while !input.is_empty() {
                    let used = r.push(input).unwrap();
                    input = &input[used..];
                    if let Some(rec) = r.poll_record() {
                        assert_eq!(xid_of(rec), got);
                        assert_eq!(bench::decode_data_reply(rec, None).unwrap(), &data[..]);
                        got += 1;
                    }
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => panic!("{e}"),
        }
        got == calls
    });
    assert_eq!(rig.conns.stats().rpcs, u64::from(calls));
    assert_eq!(rig.conns.stats().connections_dropped, 0);
}

#[test]
fn connections_over_the_limit_are_refused() {
    let mut rig = Rig::new(TcpConfig {
        max_connections: 2,
        ..TcpConfig::default()
    });
    let _a = rig.connect();
    let _b = rig.connect();
    let _c = TcpStream::connect(rig.addr()).unwrap();
    let (s, _) = rig.listener.accept().unwrap();
    let err = rig.conns.add(s, now()).unwrap_err();
    assert!(matches!(err, TcpError::TooManyConnections { max: 2, .. }));
    assert!(err.to_string().contains("too many"), "{err}");
    assert_eq!(rig.conns.stats().connections_refused, 1);
    assert_eq!(rig.conns.stats().open_connections(), 2);
}

#[test]
fn an_idle_connection_is_closed_after_the_timeout_only() {
    let mut rig = Rig::new(TcpConfig {
        idle_timeout: Some(Duration::from_secs(10)),
        first_byte_timeout: None,
        ..TcpConfig::default()
    });
    let client = TcpStream::connect(rig.addr()).unwrap();
    let (s, _) = rig.listener.accept().unwrap();
    rig.conns.add(s, Instant(0)).unwrap();
    let services = ServiceTable::builtin();
    assert_eq!(rig.conns.poll(&services, Instant(9_999_999_999)), 0);
    assert_eq!(rig.conns.len(), 1);
    assert_eq!(rig.conns.poll(&services, Instant(10_000_000_000)), 1);
    assert!(rig.conns.is_empty());
    assert_eq!(rig.conns.stats().idle_timeouts, 1);
    drop(client);
}

/// A connection that never sends a byte is closed after the first-byte
/// timeout, long before the idle timeout; one that has sent a call is
/// held to the idle timeout only.
#[test]
fn a_silent_connection_is_closed_after_the_first_byte_timeout() {
    let mut rig = Rig::new(TcpConfig {
        readiness: Readiness::Epoll,
        idle_timeout: Some(Duration::from_secs(360)),
        first_byte_timeout: Some(Duration::from_secs(10)),
        ..TcpConfig::default()
    });
    let silent = TcpStream::connect(rig.addr()).unwrap();
    let (s, _) = rig.listener.accept().unwrap();
    rig.conns.add(s, Instant(0)).unwrap();
    let mut talker = TcpStream::connect(rig.addr()).unwrap();
    let (s, _) = rig.listener.accept().unwrap();
    rig.conns.add(s, Instant(0)).unwrap();
    let services = ServiceTable::builtin();
    let second = 1_000_000_000u64;
    // The talker's NULL is answered at 1 s.
    talker.write_all(&record(&call(7, Args::Null))).unwrap();
    let deadline = std::time::Instant::now() + HANG;
    while rig.conns.stats().rpcs < 1 {
        assert!(std::time::Instant::now() < deadline, "no reply");
        rig.conns.poll(&services, Instant(second));
    }
    assert_eq!(rig.conns.poll(&services, Instant(9 * second)), 0);
    assert_eq!(rig.conns.len(), 2);
    // Within a quarter timeout past 10 s: only the silent one goes.
    assert_eq!(rig.conns.poll(&services, Instant(13 * second)), 1);
    assert_eq!(rig.conns.len(), 1);
    assert_eq!(rig.conns.stats().silent_timeouts, 1);
    assert_eq!(rig.conns.stats().idle_timeouts, 0);
    drop(silent);
}

#[test]
fn with_epoll_an_idle_connection_is_closed_within_a_quarter_timeout_late() {
    // Epoll passes look for idle connections four times per timeout
    // period, not on every pass.
    let mut rig = Rig::new(TcpConfig {
        readiness: Readiness::Epoll,
        idle_timeout: Some(Duration::from_secs(8)),
        first_byte_timeout: None,
        ..TcpConfig::default()
    });
    let mut clients = Vec::new();
    for _ in 0..2 {
        clients.push(TcpStream::connect(rig.addr()).unwrap());
        let (s, _) = rig.listener.accept().unwrap();
        rig.conns.add(s, Instant(0)).unwrap();
    }
    let services = ServiceTable::builtin();
    let second = 1_000_000_000u64;
    assert_eq!(rig.conns.poll(&services, Instant(7 * second)), 0);
    assert_eq!(rig.conns.len(), 2);
    assert_eq!(rig.conns.poll(&services, Instant(9 * second)), 2);
    assert!(rig.conns.is_empty());
    assert_eq!(rig.conns.stats().idle_timeouts, 2);
}

#[test]
fn with_epoll_idle_connections_cost_a_pass_nothing() {
    // 200 idle connections and one busy one: every call is answered, and
    // the passes serve the busy connection only (a scan would serve 201
    // connections per pass).
    let mut rig = Rig::new(TcpConfig {
        readiness: Readiness::Epoll,
        ..TcpConfig::default()
    });
    let mut idle: Vec<TcpStream> = (0..200).map(|_| rig.connect()).collect();
    // Each idle one is served once first: a connection that has answered
    // a call must go back to costing nothing.
    for (xid, c) in idle.iter_mut().enumerate() {
        write_all(c, &mut rig, &record(&call(1000 + xid as u32, Args::Null)));
        rig.replies(c, 1);
    }
    let served_before = rig.conns.stats().connections_served;
    let rpcs_before = rig.conns.stats().rpcs;
    let mut busy = rig.connect();
    let calls = 50u32;
    for xid in 0..calls {
        write_all(&mut busy, &mut rig, &record(&call(xid, Args::Null)));
        let r = rig.replies(&mut busy, 1);
        assert_eq!(xid_of(&r[0]), xid);
    }
    let stats = rig.conns.stats();
    assert_eq!(stats.rpcs - rpcs_before, u64::from(calls));
    let served = stats.connections_served - served_before;
    assert!(
        served <= 2 * u64::from(calls),
        "{served} connections served for {calls} calls"
    );
    // An idle peer that leaves is noticed by the same readiness.
    let before = stats.connections_closed;
    drop(idle);
    rig.pump(|rig| rig.conns.len() == 1);
    assert_eq!(rig.conns.stats().connections_closed, before + 200);
}

#[test]
fn close_all_closes_and_counts() {
    let mut rig = Rig::new(TcpConfig::default());
    let mut a = rig.connect();
    let _b = rig.connect();
    rig.conns.close_all();
    assert!(rig.conns.is_empty());
    assert_eq!(rig.conns.stats().connections_closed, 2);
    rig.wait_closed(&mut a);
}

#[test]
fn config_and_url_errors() {
    let bad = [
        TcpConfig {
            max_record_len: 27,
            ..TcpConfig::default()
        },
        TcpConfig {
            max_reply_len: 1 << 31,
            ..TcpConfig::default()
        },
        TcpConfig {
            read_buffer_len: 0,
            ..TcpConfig::default()
        },
        TcpConfig {
            reads_per_poll: 0,
            ..TcpConfig::default()
        },
        TcpConfig {
            max_connections: 0,
            ..TcpConfig::default()
        },
    ];
    for cfg in bad {
        assert!(matches!(TcpConnections::new(cfg), Err(TcpError::Config(_))));
    }
    assert_eq!(
        parse_tcp_url("tcp://127.0.0.1:20049").unwrap(),
        "127.0.0.1:20049".parse().unwrap()
    );
    assert_eq!(
        parse_tcp_url("tcp://[::1]:1").unwrap(),
        "[::1]:1".parse().unwrap()
    );
    for url in [
        "roce://127.0.0.1:1",
        "tcp://localhost:1",
        "tcp://1.2.3.4",
        "127.0.0.1:1",
    ] {
        let e = parse_tcp_url(url).unwrap_err();
        assert!(e.to_string().contains("tcp://IP:PORT"), "{e}");
    }
}

#[test]
fn acceptor_takes_waiting_connections_without_blocking() {
    let acceptor = TcpAcceptor::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    assert!(acceptor.url().starts_with("tcp://127.0.0.1:"));
    let mut got = Vec::new();
    assert_eq!(acceptor.accept_ready(8, |s, _| got.push(s)).unwrap(), 0);
    let _c: Vec<_> = (0..3)
        .map(|_| TcpStream::connect(acceptor.local_addr()).unwrap())
        .collect();
    let start = std::time::Instant::now();
    let mut idle = Idle(0);
    while got.len() < 3 {
        assert!(start.elapsed() < HANG);
        let n = acceptor.accept_ready(2, |s, _| got.push(s)).unwrap();
        assert!(n <= 2);
        idle.wait(n);
    }
    let e = TcpAcceptor::bind(acceptor.local_addr()).unwrap_err();
    assert!(
        e.to_string().contains("cannot listen on tcp://127.0.0.1:"),
        "{e}"
    );
}

// --- client ---------------------------------------------------------------

/// Polls the server and the client until `n` replies arrived, checking
/// each with `check`.
fn client_replies(
    rig: &mut Rig,
    client: &mut TcpClient,
    n: usize,
    mut check: impl FnMut(Reply<'_>),
) {
    rig.pump(|_| {
        client.poll(&mut check).unwrap();
        client.stats().replies as usize >= n
    });
}

#[test]
fn client_pipelines_up_to_its_depth_and_matches_replies() {
    let mut rig = Rig::new(TcpConfig::default());
    let mut client = TcpClient::connect(rig.addr(), TcpClientConfig::for_data(100_000, 8)).unwrap();
    let (s, _) = rig.listener.accept().unwrap();
    rig.conns.add(s, now()).unwrap();
    let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
    let mut tags = Vec::new();
    for tag in 0..8u64 {
        let args = if tag % 2 == 0 {
            Args::Echo(&data[..tag as usize * 1000])
        } else {
            Args::Source(tag as u32 * 1000)
        };
        assert!(client.call(args, tag).unwrap().is_some());
        tags.push(tag);
    }
    // Depth reached: nothing more is taken.
    assert_eq!(client.call(Args::Null, 99).unwrap(), None);
    assert_eq!(client.outstanding(), 8);
    let mut seen = Vec::new();
    client_replies(&mut rig, &mut client, 8, |r| {
        let d = r.data().unwrap();
        assert_eq!(d.len(), r.tag as usize * 1000);
        if r.tag % 2 == 0 {
            assert_eq!(r.procedure, bench::Proc::Echo);
            assert_eq!(d, &data[..d.len()]);
        } else {
            assert_eq!(r.procedure, bench::Proc::Source);
            assert_eq!(bench::pattern_mismatch(d), None);
        }
        seen.push(r.tag);
    });
    assert_eq!(seen, tags);
    assert_eq!(client.stats().calls, 8);
    assert_eq!(client.stats().bytes_out, rig.conns.stats().bytes_in);
    // A call over the limit is refused and nothing is queued.
    let big = vec![0u8; 200_000];
    assert!(matches!(
        client.call(Args::Echo(&big), 0),
        Err(TcpClientError::CallTooLarge { .. })
    ));
    assert_eq!(client.outstanding(), 0);
}

/// A fake server: accepts one client and sends it `bytes`.
fn fake_server(bytes: Vec<u8>, close: bool) -> (TcpClient, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let client =
        TcpClient::connect(l.local_addr().unwrap(), TcpClientConfig::for_data(1000, 4)).unwrap();
    let (mut s, _) = l.accept().unwrap();
    s.write_all(&bytes).unwrap();
    if close {
        s.shutdown(Shutdown::Write).unwrap();
    }
    (client, s)
}

fn client_error(client: &mut TcpClient) -> TcpClientError {
    let start = std::time::Instant::now();
    let mut idle = Idle(0);
    loop {
        assert!(start.elapsed() < HANG, "hung");
        match client.poll(|r| panic!("unexpected reply {r:?}")) {
            Ok(w) => idle.wait(w),
            Err(e) => return e,
        }
    }
}

#[test]
fn client_reports_a_bad_server() {
    let mut reply = [0u8; 64];
    let mut enc = crate::wire::xdr::Encoder::new(&mut reply);
    ReplyHeader::accepted(12345, OpaqueAuth::None, AcceptStatus::Success)
        .emit(&mut enc)
        .unwrap();
    let n = enc.position();

    let (mut c, _s) = fake_server(record(&reply[..n]), false);
    c.call(Args::Null, 0).unwrap().unwrap();
    assert!(matches!(
        client_error(&mut c),
        TcpClientError::UnexpectedXid(12345)
    ));

    let (mut c, _s) = fake_server(record(&call(1, Args::Null)), false);
    c.call(Args::Null, 0).unwrap().unwrap();
    assert!(matches!(client_error(&mut c), TcpClientError::NotAReply));

    let (mut c, _s) = fake_server(b"\x7f\xff\xff\xff".to_vec(), false);
    assert!(matches!(
        client_error(&mut c),
        TcpClientError::ReplyTooLarge { .. }
    ));

    let (mut c, _s) = fake_server(Vec::new(), true);
    c.call(Args::Null, 0).unwrap().unwrap();
    let e = client_error(&mut c);
    assert!(
        matches!(e, TcpClientError::Closed { outstanding: 1 }),
        "{e}"
    );

    assert!(matches!(
        TcpClient::connect_url("tcp://nowhere:1", TcpClientConfig::default()),
        Err(TcpClientError::Setup(TcpError::BadUrl { .. }))
    ));
    assert!(matches!(
        TcpClient::connect_url(
            "tcp://127.0.0.1:1",
            TcpClientConfig {
                depth: 0,
                ..TcpClientConfig::default()
            }
        ),
        Err(TcpClientError::Setup(TcpError::Config(_)))
    ));
}

/// A relay that takes every call and remembers it.
#[derive(Default)]
struct TakeAll(Vec<(TcpCallId, u32)>);

impl TcpRelay for TakeAll {
    fn relay(&mut self, from: TcpCallId, _: SocketAddr, record: &[u8], _: &mut [u8]) -> Relayed {
        self.0.push((from, xid_of(record)));
        Relayed::Taken
    }
}

/// A reply message to `xid`: accepted, SUCCESS, no results.
fn success(xid: u32) -> Vec<u8> {
    [xid, 1, 0, 0, 0, 0]
        .iter()
        .flat_map(|w| w.to_be_bytes())
        .collect()
}

#[test]
fn relayed_calls_are_answered_later_and_never_on_another_connection() {
    let mut rig = Rig::new(TcpConfig::default());
    let mut a = rig.connect();
    let mut relay = TakeAll::default();
    let null = |xid| call(xid, Args::Null);
    write_all(&mut a, &mut rig, &record(&null(7)));
    write_all(&mut a, &mut rig, &record(&null(8)));
    let start = std::time::Instant::now();
    while relay.0.len() < 2 {
        assert!(start.elapsed() < HANG, "hung");
        rig.conns.poll_with(&rig.services, &mut relay, now());
    }
    // Nothing was answered by the services.
    assert_eq!(rig.conns.stats().rpcs, 0);
    // Answers in the other order: each goes to its own call's connection.
    let (first, second) = (relay.0[0], relay.0[1]);
    assert!(rig.conns.deliver(second.0, &success(second.1), now()));
    assert!(rig.conns.deliver(first.0, &success(first.1), now()));
    let got = rig.replies(&mut a, 2);
    assert_eq!(
        got.iter().map(|r| xid_of(r)).collect::<Vec<_>>(),
        vec![8, 7]
    );

    // A call whose connection closed: its late reply is refused, and a
    // new connection (which may get the same descriptor) sees nothing.
    write_all(&mut a, &mut rig, &record(&null(9)));
    while relay.0.len() < 3 {
        assert!(start.elapsed() < HANG, "hung");
        rig.conns.poll_with(&rig.services, &mut relay, now());
    }
    let late = relay.0[2];
    drop(a);
    rig.pump(|r| r.conns.is_empty());
    let mut b = rig.connect();
    assert!(
        !rig.conns.deliver(late.0, &success(late.1), now()),
        "delivered to a closed connection"
    );
    rig.conns.forget(late.0);
    write_all(&mut b, &mut rig, &record(&null(10)));
    assert_eq!(
        xid_of(&rig.replies(&mut b, 1)[0]),
        10,
        "b's own call, answered by the services"
    );
}
