//! `rpcrdma-bench floor`: the physical floor of this machine next to the
//! `shm` provider's round trips, measured in one run between two pinned
//! processes.
//!
//! 1. raw cross-core cache-line ping-pong (two processes, one shared page);
//! 2. one-sided RDMA Write ping-pong (each side writes a sequence number into
//!    the other's registered memory and spins on its own memory, like
//!    `ib_write_lat`);
//! 3. Send/Receive ping-pong (each side polls its CQ, reposts, answers);
//! 4. Send/Receive exchanges pipelined at [`RATE_DEPTH`] (the ping-pong's
//!    work with 32 outstanding, as `rate --depth 32` moves its calls, and
//!    nothing above the provider): the provider's own ceiling for an RPC
//!    message rate;
//! 5. single-core memcpy bandwidth over buffers larger than the LLC
//!    ([`bench::membw`]), the reference for bulk throughput.
use std::os::fd::AsFd;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dataplane::mem::{Arena, Slab, WrKind};
use dataplane::verbs::shm::{Shm, ShmCq, ShmQp};
use dataplane::verbs::*;

const TIMEOUT: Duration = Duration::from_secs(30);
/// Spins between clock reads in the timed loops (see `write_pingpong`).
const CLOCK_CHECK_SPINS: u32 = 1024;
const MSG: usize = 64;
/// Exchanges outstanding in the pipelined Send/Recv run: the RPC message
/// rate's depth (`rpcrdma-bench rate --depth 32`, docs/BENCHMARKS.md), and
/// the receives `setup` posts on each side.
const RATE_DEPTH: u64 = 32;

fn pin(core: usize) -> bool {
    core_affinity::set_for_current(core_affinity::CoreId { id: core })
}

/// Summary of per-iteration round-trip samples (nanoseconds).
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Stats {
    #[serde(rename = "median_ns")]
    median: u64,
    #[serde(rename = "p99_ns")]
    p99: u64,
    #[serde(rename = "mean_ns")]
    mean: f64,
}

/// Everything `floor` measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FloorReport {
    /// Round trips per ping-pong.
    pub iters: u64,
    /// The two cores.
    pub cores: [usize; 2],
    /// Whether pinning the initiator worked.
    pub pinned: bool,
    /// Payload of the shm ping-pongs.
    pub payload_bytes: usize,
    /// Raw cross-core cache-line ping-pong.
    pub raw_pingpong: Stats,
    /// shm RDMA Write ping-pong.
    pub shm_write_pingpong: Stats,
    /// shm Send/Recv ping-pong.
    pub shm_send_pingpong: Stats,
    /// shm Send/Recv exchanges completed per second with [`RATE_DEPTH`]
    /// outstanding.
    pub shm_send_exchanges_per_s: f64,
    /// Single-core memcpy bandwidth.
    pub memcpy: bench::membw::MemcpyReport,
}

impl Stats {
    /// The median round trip.
    pub fn median_ns(&self) -> u64 {
        self.median
    }
}

fn stats(mut v: Vec<u64>) -> Stats {
    v.sort_unstable();
    let mean = v.iter().sum::<u64>() as f64 / v.len() as f64;
    Stats {
        median: v[v.len() / 2],
        p99: v[v.len() * 99 / 100],
        mean,
    }
}

/// The shared page for the raw ping-pong: a file in /dev/shm mapped by both.
fn shared_page(path: &str, create: bool) -> &'static [AtomicU64] {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(create)
        .truncate(create)
        .open(path)
        .expect("open /dev/shm page");
    if create {
        f.set_len(4096).expect("size shared page");
    }
    // SAFETY: a fresh shared mapping of a 4 KiB file, leaked for the
    // process lifetime (so the 'static slice stays valid).
    let p = unsafe {
        nix::sys::mman::mmap(
            None,
            std::num::NonZeroUsize::new(4096).unwrap(),
            nix::sys::mman::ProtFlags::PROT_READ | nix::sys::mman::ProtFlags::PROT_WRITE,
            nix::sys::mman::MapFlags::MAP_SHARED,
            f.as_fd(),
            0,
        )
    }
    .expect("mmap shared page");
    // SAFETY: page-aligned 4 KiB mapping viewed as 512 atomics; never unmapped.
    unsafe { std::slice::from_raw_parts(p.as_ptr() as *const AtomicU64, 512) }
}

/// Raw ping-pong: line 0 (word 0) is written by the initiator, line 1 (word 8)
/// by the responder.
fn raw_pingpong(page: &[AtomicU64], initiator: bool, iters: u64) -> Vec<u64> {
    let (mine, theirs) = if initiator {
        (&page[0], &page[8])
    } else {
        (&page[8], &page[0])
    };
    let mut samples = Vec::with_capacity(iters as usize);
    for i in 1..=iters {
        if initiator {
            let t = Instant::now();
            mine.store(i, Ordering::Release);
            while theirs.load(Ordering::Acquire) != i {
                std::hint::spin_loop();
            }
            samples.push(t.elapsed().as_nanos() as u64);
        } else {
            while theirs.load(Ordering::Acquire) != i {
                std::hint::spin_loop();
            }
            mine.store(i, Ordering::Release);
        }
    }
    samples
}

struct Side {
    qp: ShmQp,
    cq: ShmCq,
    send: Slab,
    recv: Slab,
    /// Our 4 KiB REMOTE_WRITE target; the peer writes sequence numbers here.
    target: dataplane::mem::Buf,
    peer: RemoteKey,
    comps: Vec<Completion>,
    _keep: (
        dataplane::verbs::shm::ShmPd,
        Vec<dataplane::verbs::shm::ShmMr>,
    ),
}

impl Side {
    fn poll_until(&mut self, what: WcOpcode) -> Completion {
        let deadline = Instant::now() + TIMEOUT;
        let mut spins = 0u32;
        loop {
            let n = self.cq.poll(&mut self.comps);
            for i in 0..n {
                let c = std::mem::take(&mut self.comps[i]);
                assert!(c.is_ok(), "{:?}", c.status);
                if c.opcode == what {
                    // Keep any other completions in the slice order irrelevant
                    // here: the ping-pong has one outstanding operation.
                    return c;
                }
            }
            spins = spins.wrapping_add(1);
            if spins % CLOCK_CHECK_SPINS == 0 {
                assert!(Instant::now() < deadline, "bench peer went away");
            }
        }
    }

    fn post_recv(&mut self) {
        let b = self.recv.alloc().expect("recv buffer");
        self.qp
            .post_recv(RecvWr {
                wr_id: b.wr_id(),
                sgl: SgeList::one(Sge::whole(b)),
            })
            .map_err(|e| e.error)
            .unwrap();
    }

    fn send(&mut self, op: SendOp, data: &[u8], signaled: bool) {
        let mut b = self.send.alloc().expect("send buffer");
        b.fill(data);
        let mut wr = SendWr::new(b.wr_id(), op, SgeList::one(Sge::data(b)));
        wr.signaled = signaled;
        wr.inline = true;
        self.qp.post_send(wr).map_err(|e| e.error).unwrap();
    }

    fn target_word(&self) -> &AtomicU64 {
        // SAFETY: the target buffer is 4 KiB, 8-byte aligned (slab offset 0
        // of a page-aligned arena), alive as long as `self`.
        unsafe { &*(self.target.as_ptr() as *const AtomicU64) }
    }

    fn write_pingpong(&mut self, initiator: bool, iters: u64) -> Vec<u64> {
        let mut samples = Vec::with_capacity(iters as usize);
        let mut msg = [0u8; MSG];
        for i in 1..=iters {
            msg[..8].copy_from_slice(&i.to_le_bytes());
            let t = Instant::now();
            if initiator {
                self.send(SendOp::Write(self.peer.at(0)), &msg, false);
            }
            let deadline = Instant::now() + TIMEOUT;
            let mut spins = 0u32;
            while self.target_word().load(Ordering::Acquire) != i {
                std::hint::spin_loop();
                // The clock is read only now and then: reading it on every
                // spin would slow this loop down next to the raw ping-pong,
                // which never reads it, and skew the ratio.
                spins = spins.wrapping_add(1);
                if spins % CLOCK_CHECK_SPINS == 0 {
                    assert!(Instant::now() < deadline, "write ping-pong stalled");
                }
            }
            if initiator {
                samples.push(t.elapsed().as_nanos() as u64);
            } else {
                self.send(SendOp::Write(self.peer.at(0)), &msg, false);
            }
        }
        samples
    }

    fn send_pingpong(&mut self, initiator: bool, iters: u64) -> Vec<u64> {
        let mut samples = Vec::with_capacity(iters as usize);
        let msg = [7u8; MSG];
        for _ in 0..iters {
            let t = Instant::now();
            if initiator {
                self.send(SendOp::Send, &msg, false);
            }
            let c = self.poll_until(WcOpcode::Recv);
            drop(c);
            self.post_recv();
            if initiator {
                samples.push(t.elapsed().as_nanos() as u64);
            } else {
                self.send(SendOp::Send, &msg, false);
            }
        }
        samples
    }

    /// `iters` request/answer exchanges with [`RATE_DEPTH`] outstanding:
    /// the initiator sends the next request on each answer, the responder
    /// answers each request, both repost their receive first (as the
    /// ping-pong does). Returns the initiator's exchanges per second.
    fn send_rate(&mut self, initiator: bool, iters: u64) -> f64 {
        let msg = [7u8; MSG];
        let t = Instant::now();
        let mut sent = 0;
        if initiator {
            while sent < RATE_DEPTH.min(iters) {
                self.send(SendOp::Send, &msg, false);
                sent += 1;
            }
        }
        let deadline = t + TIMEOUT;
        let mut done = 0;
        let mut spins = 0u32;
        while done < iters {
            let n = self.cq.poll(&mut self.comps);
            // Stop at the last exchange: the responder leaves then, and
            // the flush of our remaining receives may follow it in the
            // same poll.
            for i in 0..n.min((iters - done) as usize) {
                let c = std::mem::take(&mut self.comps[i]);
                assert!(c.is_ok(), "{:?}", c.status);
                if c.opcode != WcOpcode::Recv {
                    continue;
                }
                drop(c);
                self.post_recv();
                done += 1;
                if !initiator {
                    self.send(SendOp::Send, &msg, false);
                } else if sent < iters {
                    self.send(SendOp::Send, &msg, false);
                    sent += 1;
                }
            }
            spins = spins.wrapping_add(1);
            if spins % CLOCK_CHECK_SPINS == 0 {
                assert!(Instant::now() < deadline, "pipelined exchanges stalled");
            }
        }
        iters as f64 / t.elapsed().as_secs_f64()
    }
}

fn setup(url: &str, listener: Option<&dataplane::verbs::shm::ShmListener>) -> Side {
    let ctx = Shm::open(url).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let arena = Arena::new(2 << 20).unwrap();
    let lw = Access::LOCAL_WRITE;
    let mr_send = pd.register(&arena, 0, 1 << 20, lw).unwrap();
    let recv_arena = Arena::new(1 << 20).unwrap();
    let mr_recv = pd.register(&recv_arena, 0, 1 << 20, lw).unwrap();
    let target_arena = Arena::new(4096).unwrap();
    let mr_target = pd
        .register(&target_arena, 0, 4096, lw | Access::REMOTE_WRITE)
        .unwrap();
    let send = Slab::new(arena, 0, 4096, 256, mr_send.lkey(), WrKind::Send).unwrap();
    let recv = Slab::new(recv_arena, 0, 4096, 256, mr_recv.lkey(), WrKind::Recv).unwrap();
    let target_slab = Slab::new(target_arena, 0, 4096, 1, mr_target.lkey(), WrKind::Chunk).unwrap();
    let mut target = target_slab.alloc().unwrap();
    target.write(0, &[0u8; 4096]);
    let caps = QpCaps {
        rnr_retry: 7,
        ..QpCaps::default()
    };
    let mut pqp = pd.create_qp(&cq, &cq, caps).unwrap();
    for _ in 0..32 {
        let b = recv.alloc().unwrap();
        pqp.post_recv(RecvWr {
            wr_id: b.wr_id(),
            sgl: SgeList::one(Sge::whole(b)),
        })
        .map_err(|e| e.error)
        .unwrap();
    }
    let qp = if let Some(l) = listener {
        let inc = l.accept(TIMEOUT).unwrap();
        inc.accept(pqp, b"floor").unwrap()
    } else {
        pqp.connect(url, b"floor", TIMEOUT).unwrap().0
    };
    let mut side = Side {
        qp,
        cq,
        send,
        recv,
        target,
        peer: RemoteKey::default(),
        comps: (0..32).map(|_| Completion::default()).collect(),
        _keep: (pd, vec![mr_send, mr_recv]),
    };
    let key = side.qp.expose(&mr_target).unwrap();
    side._keep.1.push(mr_target);
    let mut m = [0u8; 20];
    m[..8].copy_from_slice(&key.addr.to_le_bytes());
    m[8..12].copy_from_slice(&key.rkey.to_le_bytes());
    m[12..20].copy_from_slice(&key.len.to_le_bytes());
    side.send(SendOp::Send, &m, false);
    let c = side.poll_until(WcOpcode::Recv);
    let d = c.sgl.iter().next().unwrap().buf.to_vec();
    side.peer = RemoteKey {
        addr: u64::from_le_bytes(d[..8].try_into().unwrap()),
        rkey: u32::from_le_bytes(d[8..12].try_into().unwrap()),
        len: u64::from_le_bytes(d[12..20].try_into().unwrap()),
    };
    drop(c);
    side.post_recv();
    side
}

/// The responder process.
pub fn peer(url: &str, page: &str, core: usize, iters: u64) {
    pin(core);
    let p = shared_page(page, false);
    raw_pingpong(p, false, iters);
    let mut side = setup(url, None);
    side.write_pingpong(false, iters);
    side.send_pingpong(false, iters);
    side.send_rate(false, iters);
}

/// The initiator: spawns the responder, runs the three ping-pongs and the
/// pipelined exchanges, then the memcpy bandwidth on the first core
/// (`memcpy_bytes` per copy, for at least `memcpy_time`); prints a table
/// and returns the figures.
pub fn run(
    iters: u64,
    cores: (usize, usize),
    memcpy_bytes: usize,
    memcpy_time: Duration,
) -> FloorReport {
    let pid = std::process::id();
    let url = format!("shm:///tmp/rpcrdma-bench-floor-{pid}.sock");
    let page_path = format!("/dev/shm/rpcrdma-bench-floor-{pid}");
    let page = shared_page(&page_path, true);
    let pinned = pin(cores.0);
    // Listen before the responder exists, so its connect cannot race us.
    let listener = Shm::open(&url).unwrap().listen(&url).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "floor-peer",
            "--url",
            &url,
            "--page",
            &page_path,
            "--core",
            &cores.1.to_string(),
            "--iters",
            &iters.to_string(),
        ])
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn responder");
    let raw = stats(raw_pingpong(page, true, iters));
    let _ = std::fs::remove_file(&page_path);
    let mut side = setup(&url, Some(&listener));
    let write = stats(side.write_pingpong(true, iters));
    let send = stats(side.send_pingpong(true, iters));
    let exchanges = side.send_rate(true, iters);
    drop(side);
    let st = child.wait().unwrap();
    assert!(st.success(), "responder failed: {st}");
    let memcpy = bench::membw::measure(memcpy_bytes, memcpy_time, Some(cores.0));
    println!(
        "floor: {iters} round trips each, processes pinned to cores {} and {} (pinning {}), {MSG}-byte payloads",
        cores.0,
        cores.1,
        if pinned { "ok" } else { "FAILED" }
    );
    println!(
        "{:<34} {:>12} {:>12} {:>12} {:>10}",
        "round trip", "median ns", "p99 ns", "mean ns", "x raw"
    );
    for (name, s) in [
        ("raw cache-line ping-pong", &raw),
        ("shm RDMA Write ping-pong", &write),
        ("shm Send/Recv ping-pong", &send),
    ] {
        println!(
            "{:<34} {:>12} {:>12} {:>12.0} {:>10.1}",
            name,
            s.median,
            s.p99,
            s.mean,
            s.median as f64 / raw.median.max(1) as f64
        );
    }
    println!(
        "shm Send/Recv pipelined, {RATE_DEPTH} outstanding: {:.2} M exchanges/s ({:.0} ns each)",
        exchanges / 1e6,
        1e9 / exchanges.max(1.0)
    );
    println!(
        "memcpy, one core, {} MiB buffers (LLC {}): best {:.2} GB/s, mean {:.2} GB/s over {} copies",
        memcpy.buffer_bytes >> 20,
        memcpy
            .llc_bytes
            .map_or("unknown".to_owned(), |b| format!("{} KiB", b >> 10)),
        memcpy.best_gb_per_s,
        memcpy.mean_gb_per_s,
        memcpy.copies
    );
    FloorReport {
        iters,
        cores: [cores.0, cores.1],
        pinned,
        payload_bytes: MSG,
        raw_pingpong: raw,
        shm_write_pingpong: write,
        shm_send_pingpong: send,
        shm_send_exchanges_per_s: exchanges,
        memcpy,
    }
}
