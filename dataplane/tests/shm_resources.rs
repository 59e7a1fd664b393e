//! Process-wide resource checks for `shm`, in their own test binary so no
//! other test disturbs the counts: no fd or mapping leaks after peers die,
//! and no heap allocation per work request in steady state.
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dataplane::mem::{Arena, Slab, WrKind};
use dataplane::verbs::shm::{Shm, ShmCq, ShmMr, ShmPd, ShmQp};
use dataplane::verbs::*;

struct Counting;
static ALLOCS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Count only on the measuring thread: libtest allocates on its own
    /// threads (spawning other tests, capturing output) at any time.
    static COUNTING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn count() {
    if COUNTING.with(|c| c.get()) {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: forwards to the system allocator; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as ours.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        count();
        // SAFETY: same contract as ours.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The two tests must not overlap (shared counters, fd table).
static SERIAL: Mutex<()> = Mutex::new(());
const T: Duration = Duration::from_secs(30);

struct Side {
    qp: ShmQp,
    cq: ShmCq,
    send: Slab,
    recv: Slab,
    rdma_mr: ShmMr,
    _mrs: Vec<ShmMr>,
    _pd: ShmPd,
    out: Vec<Completion>,
}

fn pair(tag: &str) -> (Side, Side) {
    let url = format!("shm:///tmp/rpcrdma-res-{tag}-{}.sock", std::process::id());
    let ctx = Shm::open(&url).unwrap();
    let listener = ctx.listen(&url).unwrap();
    let mk = || {
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(64).unwrap();
        let a = Arena::new(1 << 20).unwrap();
        let r = Arena::new(1 << 20).unwrap();
        let x: Arc<Arena> = Arena::new(1 << 16).unwrap();
        let lw = Access::LOCAL_WRITE;
        let mr = pd.register(&a, 0, 1 << 20, lw).unwrap();
        let rmr = pd.register(&r, 0, 1 << 20, lw).unwrap();
        let xmr = pd
            .register(
                &x,
                0,
                1 << 16,
                lw | Access::REMOTE_WRITE | Access::REMOTE_READ,
            )
            .unwrap();
        let send = Slab::new(a, 0, 4096, 64, mr.lkey(), WrKind::Send).unwrap();
        let recv = Slab::new(r, 0, 4096, 64, rmr.lkey(), WrKind::Recv).unwrap();
        let caps = QpCaps {
            rnr_retry: 7,
            ..QpCaps::default()
        };
        let mut pqp = pd.create_qp(&cq, &cq, caps).unwrap();
        for _ in 0..16 {
            let b = recv.alloc().unwrap();
            pqp.post_recv(RecvWr {
                wr_id: b.wr_id(),
                sgl: SgeList::one(Sge::whole(b)),
            })
            .unwrap();
        }
        (pqp, cq, pd, send, recv, xmr, vec![mr, rmr])
    };
    let (pa, cqa, pda, sa, ra, xa, ma) = mk();
    let (pb, cqb, pdb, sb, rb, xb, mb) = mk();
    let u = url.clone();
    let h = std::thread::spawn(move || pb.connect(&u, b"", T).unwrap().0);
    let qa = listener.accept(T).unwrap().accept(pa, b"").unwrap();
    let qb = h.join().unwrap();
    let side = |qp, cq, send, recv, rdma_mr, _mrs, _pd| Side {
        qp,
        cq,
        send,
        recv,
        rdma_mr,
        _mrs,
        _pd,
        out: (0..32).map(|_| Completion::default()).collect(),
    };
    (
        side(qa, cqa, sa, ra, xa, ma, pda),
        side(qb, cqb, sb, rb, xb, mb, pdb),
    )
}

impl Side {
    fn send(&mut self, op: SendOp, n: usize, signaled: bool) {
        let mut b = self.send.alloc().unwrap();
        b.set_len(n as u32);
        let mut wr = SendWr::new(b.wr_id(), op, SgeList::one(Sge::data(b)));
        wr.signaled = signaled;
        self.qp.post_send(wr).map_err(|e| e.error).unwrap();
    }
    /// Polls until a completion of `op` arrives; reposts receives.
    fn wait(&mut self, op: WcOpcode) {
        let deadline = Instant::now() + T;
        loop {
            let n = self.cq.poll(&mut self.out);
            let mut found = false;
            for i in 0..n {
                let mut c = std::mem::take(&mut self.out[i]);
                assert!(c.is_ok(), "{:?}", c.status);
                found |= c.opcode == op;
                if c.opcode == WcOpcode::Recv {
                    let b = c.sgl.take_first().unwrap();
                    let sgl = SgeList::one(Sge::whole(b));
                    self.qp
                        .post_recv(RecvWr {
                            wr_id: c.wr_id,
                            sgl,
                        })
                        .map_err(|e| e.error)
                        .unwrap();
                }
            }
            if found {
                return;
            }
            assert!(Instant::now() < deadline);
        }
    }
    fn drain_until_error(&mut self) {
        let deadline = Instant::now() + T;
        while self.qp.state() != QpState::Error || self.cq.poll(&mut self.out) > 0 {
            self.cq.poll(&mut self.out);
            assert!(Instant::now() < deadline);
            std::thread::yield_now();
        }
        for c in &mut self.out {
            *c = Completion::default();
        }
    }
}

/// Our fds: memfds and sockets (other test threads may open and close
/// unrelated ones at any time, e.g. pipes to children).
fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|t| {
            let t = t.to_string_lossy();
            t.starts_with("/memfd:") || t.starts_with("socket:")
        })
        .count()
}

/// Our mappings: memfd-backed ones (arenas, outboxes, peer regions);
/// thread stacks of other tests come and go.
fn maps() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| l.contains("/memfd:"))
        .count()
}

#[test]
fn no_fd_or_mapping_leaks_after_peer_death() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // Warm up lazily initialised process state (thread stacks, statics).
    drop(pair("warm"));
    let (f0, m0) = (fds(), maps());
    for round in 0..3 {
        let (mut a, b) = pair(&format!("leak{round}"));
        assert!(fds() > f0 && maps() > m0, "the counters see our resources");
        let mut b = b;
        let key = b.qp.expose(&b.rdma_mr).unwrap();
        a.send(SendOp::Write(key.at(0)), 512, true);
        a.wait(WcOpcode::RdmaWrite);
        a.send(SendOp::Send, 100, true);
        b.wait(WcOpcode::Recv);
        // Work in flight, then the peer vanishes without a word (round 0),
        // after a disconnect (round 1), or after an error (round 2).
        for _ in 0..4 {
            a.send(SendOp::Send, 4000, true);
        }
        match round {
            0 => drop(b),
            1 => {
                b.qp.disconnect();
                drop(b);
            }
            _ => {
                b.send(SendOp::Write(RemoteAddr { addr: 0, rkey: 1 }), 8, true);
                b.drain_until_error();
                drop(b);
            }
        }
        a.drain_until_error();
        assert_eq!(a.send.available(), a.send.total());
        assert_eq!(a.recv.available(), a.recv.total());
        drop(a);
    }
    assert_eq!(fds(), f0, "fd leak");
    assert_eq!(maps(), m0, "mapping leak");
}

const CHILD_URL: &str = "RPCRDMA_RESOURCES_CHILD_URL";

/// Child half of `no_leaks_after_sigkill`: connects, receives forever
/// (until SIGKILLed). Returns at once in a normal run.
#[test]
fn child_connect_and_wait() {
    let Ok(url) = std::env::var(CHILD_URL) else {
        return;
    };
    let ctx = Shm::open(&url).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let r = Arena::new(1 << 20).unwrap();
    let x = Arena::new(1 << 16).unwrap();
    let rmr = pd.register(&r, 0, 1 << 20, Access::LOCAL_WRITE).unwrap();
    let xmr = pd
        .register(&x, 0, 1 << 16, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let recv = Slab::new(r, 0, 4096, 64, rmr.lkey(), WrKind::Recv).unwrap();
    let caps = QpCaps {
        rnr_retry: 7,
        ..QpCaps::default()
    };
    let mut pqp = pd.create_qp(&cq, &cq, caps).unwrap();
    for _ in 0..8 {
        let b = recv.alloc().unwrap();
        pqp.post_recv(RecvWr {
            wr_id: b.wr_id(),
            sgl: SgeList::one(Sge::whole(b)),
        })
        .unwrap();
    }
    let (mut qp, _) = pqp.connect(&url, b"", T).unwrap();
    let key = qp.expose(&xmr).unwrap();
    println!("KEY {} {}", key.addr, key.rkey);
    let mut out: Vec<Completion> = (0..32).map(|_| Completion::default()).collect();
    loop {
        cq.poll(&mut out); // receive and never repost: the sender will RNR-wait
        std::thread::sleep(Duration::from_micros(100));
    }
}

#[test]
fn no_leaks_after_sigkill() {
    use std::io::BufRead;
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    drop(pair("warm2"));
    let (f0, m0) = (fds(), maps());
    {
        let url = format!("shm:///tmp/rpcrdma-res-kill-{}.sock", std::process::id());
        let ctx = Shm::open(&url).unwrap();
        let listener = ctx.listen(&url).unwrap();
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "child_connect_and_wait",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_URL, &url)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(64).unwrap();
        let a = Arena::new(1 << 20).unwrap();
        let r = Arena::new(1 << 20).unwrap();
        let mr = pd.register(&a, 0, 1 << 20, Access::LOCAL_WRITE).unwrap();
        let rmr = pd.register(&r, 0, 1 << 20, Access::LOCAL_WRITE).unwrap();
        let send = Slab::new(a, 0, 4096, 64, mr.lkey(), WrKind::Send).unwrap();
        let recv = Slab::new(r, 0, 4096, 64, rmr.lkey(), WrKind::Recv).unwrap();
        let caps = QpCaps {
            rnr_retry: 7,
            ..QpCaps::default()
        };
        let mut pqp = pd.create_qp(&cq, &cq, caps).unwrap();
        for _ in 0..8 {
            let b = recv.alloc().unwrap();
            pqp.post_recv(RecvWr {
                wr_id: b.wr_id(),
                sgl: SgeList::one(Sge::whole(b)),
            })
            .unwrap();
        }
        let mut qp = listener.accept(T).unwrap().accept(pqp, b"").unwrap();
        assert!(fds() > f0 && maps() > m0, "the counters see our resources");
        let mut line = String::new();
        let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        while !line.contains("KEY ") {
            line.clear();
            assert!(stdout.read_line(&mut line).unwrap() > 0, "child died early");
        }
        let v: Vec<u64> = line[line.find("KEY ").unwrap() + 4..]
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect();
        let key = RemoteAddr {
            addr: v[0],
            rkey: v[1] as u32,
        };
        // 8 sends land in the child's receives, 8 more wait on RNR, plus
        // writes queued behind them: all in flight when the child dies.
        for i in 0..20 {
            let mut b = send.alloc().unwrap();
            b.set_len(256);
            let op = if i % 3 == 2 {
                SendOp::Write(key)
            } else {
                SendOp::Send
            };
            qp.post_send(SendWr::new(b.wr_id(), op, SgeList::one(Sge::data(b))))
                .map_err(|e| e.error)
                .unwrap();
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let mut out: Vec<Completion> = (0..32).map(|_| Completion::default()).collect();
        let mut statuses = Vec::new();
        let deadline = Instant::now() + T;
        while statuses.len() < 20 + 8 {
            let n = cq.poll(&mut out);
            statuses.extend(out.iter_mut().take(n).map(|c| std::mem::take(c).status));
            assert!(
                Instant::now() < deadline,
                "only {} completions",
                statuses.len()
            );
        }
        assert_eq!(qp.state(), QpState::Error);
        assert!(statuses.contains(&WcStatus::RetryExcErr), "{statuses:?}");
        assert!(
            statuses
                .iter()
                .filter(|s| **s == WcStatus::WrFlushErr)
                .count()
                > 8
        );
        assert_eq!(send.available(), send.total());
        assert_eq!(recv.available(), recv.total());
    }
    assert_eq!(fds(), f0, "fd leak after SIGKILL");
    assert_eq!(maps(), m0, "mapping leak after SIGKILL");
}

#[test]
fn no_heap_allocation_per_work_request() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (mut a, mut b) = pair("alloc");
    let key = b.qp.expose(&b.rdma_mr).unwrap();
    let round = |a: &mut Side, b: &mut Side| {
        a.send(SendOp::Send, 64, false);
        b.wait(WcOpcode::Recv);
        b.send(SendOp::SendWithImm(7), 64, false);
        a.wait(WcOpcode::Recv);
        a.send(SendOp::Write(key.at(128)), 1024, false);
        a.send(SendOp::Read(key.at(0)), 2048, true);
        a.wait(WcOpcode::RdmaRead);
    };
    for _ in 0..100 {
        round(&mut a, &mut b); // warm-up: first region exchanges etc.
    }
    let before = ALLOCS.load(Ordering::Relaxed);
    COUNTING.with(|c| c.set(true));
    for _ in 0..1000 {
        round(&mut a, &mut b);
    }
    COUNTING.with(|c| c.set(false));
    let allocs = ALLOCS.load(Ordering::Relaxed) - before;
    assert_eq!(allocs, 0, "heap allocations in 1000 steady-state rounds");
}
