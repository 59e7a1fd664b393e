//! The provider conformance suite: one set of scenarios, generic over
//! `P: Provider`, that every provider must pass.
//!
//! A scenario has two halves, `active` and `passive`, each driving its own
//! endpoint (context, PD, CQ, QP, slabs). A runner puts the halves on two
//! threads of one process ([`run_in_process`]) or in two processes
//! ([`run_cross_process`]: the test binary re-executes itself as the
//! passive peer). The halves coordinate through an out-of-band channel
//! (a std channel, or the child's stdin/stdout), never through timing.
//!
//! Every half ends with [`Peer::finish`], which disconnects, drains the CQ
//! and checks that every slab is back to its configured total.
#![allow(dead_code)]

pub mod srq;

/// Instantiates the whole suite for one provider: `provider_suite!(Shm)`,
/// or with a guard run before each case (`provider_suite!(Ibverbs,
/// have_device)`: the case runs only when it returns true). Each case runs
/// in process and cross process (the test binary must also have a
/// `child_peer` test calling [`child_main`]); `every_case_is_listed` keeps
/// the list below in step with [`cases`]. Use with `#[macro_use] mod
/// conformance;`.
macro_rules! provider_suite {
    ($provider:ident) => {
        fn always() -> bool {
            true
        }
        provider_suite!($provider, always);
    };
    ($provider:ident, $guard:ident) => {
        provider_suite!(@cases $provider, $guard;
            send_recv_sizes_and_order,
            rnr_retry_exceeded,
            local_length_error,
            write_then_send_visibility,
            rdma_read,
            write_with_immediate,
            send_with_invalidate,
            local_invalidate,
            bad_rkey,
            out_of_bounds,
            wrong_access_flag,
            flush_on_close,
            peer_death_mid_transfer,
            many_qps_256,
            window_read_only,
            window_bounds,
            window_late_write,
            window_send_with_invalidate,
            window_bind_while_bound,
            window_bind_wrong_fixed_bits,
            window_bind_outside_mr,
            a_send_wakes_a_sleeping_receiver,
        );
    };
    (@cases $provider:ident, $guard:ident; $($name:ident),* $(,)?) => {
        mod in_process {
            use super::*;
            $(#[test] fn $name() {
                if $guard() {
                    conformance::in_process::<$provider>(stringify!($name));
                }
            })*
        }
        mod cross_process {
            use super::*;
            $(#[test] fn $name() {
                if $guard() {
                    conformance::cross_process::<$provider>(stringify!($name), "child_peer");
                }
            })*
        }
        #[test]
        fn every_case_is_listed() {
            let listed = [$(stringify!($name)),*];
            for c in conformance::cases::<$provider>() {
                assert!(listed.contains(&c.name), "case {} not run", c.name);
            }
        }
    };
}

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use dataplane::mem::{Arena, Buf, Slab, WrId, WrKind};
use dataplane::verbs::*;

/// Generous bound that turns a hang into a failure (never a pass criterion).
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// Endpoint geometry.
#[derive(Debug, Clone, Copy)]
pub struct EpConfig {
    pub buf_size: u32,
    pub bufs: u32,
    pub prepost: u32,
    pub caps: QpCaps,
}

impl Default for EpConfig {
    fn default() -> Self {
        EpConfig {
            buf_size: 64 * 1024,
            bufs: 16,
            prepost: 8,
            caps: QpCaps {
                max_send_wr: 64,
                max_recv_wr: 32,
                max_inline: 256,
                // Retry forever: on a shared CI box the receiver thread may
                // be descheduled for a while; only the RNR case uses a budget.
                rnr_retry: 7,
                rnr_timer: Duration::from_millis(1),
            },
        }
    }
}

/// Registered memory of one endpoint (shared by all its QPs).
pub struct Memory<P: Provider> {
    pub recv: Slab,
    pub local: Slab,
    /// One 1 MiB buffer registered LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ.
    pub rdma: Option<Buf>,
    /// One 64 KiB buffer registered LOCAL_WRITE | REMOTE_READ only.
    pub ro: Option<Buf>,
    pub rdma_mr: P::Mr,
    pub ro_mr: P::Mr,
    pub recv_mr: P::Mr,
    pub local_mr: P::Mr,
    slabs: Vec<Slab>,
}

impl<P: Provider> Memory<P> {
    pub fn new(pd: &P::Pd, cfg: &EpConfig) -> Memory<P> {
        let bytes = (cfg.buf_size * cfg.bufs) as usize;
        let recv_arena = Arena::new(bytes).unwrap();
        let local_arena = Arena::new(bytes).unwrap();
        let rdma_arena = Arena::new(1 << 20).unwrap();
        let ro_arena = Arena::new(64 << 10).unwrap();
        let lw = Access::LOCAL_WRITE;
        let recv_mr = pd.register(&recv_arena, 0, bytes, lw).unwrap();
        let local_mr = pd.register(&local_arena, 0, bytes, lw).unwrap();
        let rdma_mr = pd
            .register(
                &rdma_arena,
                0,
                1 << 20,
                lw | Access::REMOTE_WRITE | Access::REMOTE_READ,
            )
            .unwrap();
        let ro_mr = pd
            .register(&ro_arena, 0, 64 << 10, lw | Access::REMOTE_READ)
            .unwrap();
        let recv = Slab::new(
            recv_arena,
            0,
            cfg.buf_size,
            cfg.bufs,
            recv_mr.lkey(),
            WrKind::Recv,
        )
        .unwrap();
        let local = Slab::new(
            local_arena,
            0,
            cfg.buf_size,
            cfg.bufs,
            local_mr.lkey(),
            WrKind::Send,
        )
        .unwrap();
        let rdma_slab =
            Slab::new(rdma_arena, 0, 1 << 20, 1, rdma_mr.lkey(), WrKind::Chunk).unwrap();
        let ro_slab = Slab::new(ro_arena, 0, 64 << 10, 1, ro_mr.lkey(), WrKind::Chunk).unwrap();
        let mut rdma = rdma_slab.alloc().unwrap();
        rdma.set_len(1 << 20);
        let mut ro = ro_slab.alloc().unwrap();
        ro.set_len(64 << 10);
        Memory {
            slabs: vec![recv.clone(), local.clone(), rdma_slab, ro_slab],
            recv,
            local,
            rdma: Some(rdma),
            ro: Some(ro),
            rdma_mr,
            ro_mr,
            recv_mr,
            local_mr,
        }
    }

    /// Returns the long-lived buffers and checks every pool is full.
    pub fn check_pools_full(&mut self) {
        self.rdma.take();
        self.ro.take();
        for s in &self.slabs {
            assert_eq!(
                s.available(),
                s.total(),
                "pool not back to its configured total"
            );
        }
    }
}

/// Out-of-band coordination between the two halves.
pub enum Oob {
    Chan(mpsc::Sender<String>, mpsc::Receiver<String>),
    Pipe(Box<dyn BufRead + Send>, Box<dyn Write + Send>),
}

pub const OOB_PREFIX: &str = "OOB:";

impl Oob {
    pub fn send(&mut self, msg: &str) {
        match self {
            Oob::Chan(tx, _) => {
                let _ = tx.send(msg.to_owned());
            }
            Oob::Pipe(_, w) => {
                let _ = writeln!(w, "{OOB_PREFIX}{msg}");
                let _ = w.flush();
            }
        }
    }

    pub fn recv(&mut self) -> String {
        match self {
            Oob::Chan(_, rx) => rx.recv_timeout(TIMEOUT).expect("peer half went silent"),
            Oob::Pipe(r, _) => loop {
                let mut line = String::new();
                let n = r.read_line(&mut line).expect("oob read");
                assert!(n > 0, "peer half exited");
                // The child's test harness prints around our lines (e.g.
                // "test child_peer ... " without a newline): find the tag.
                if let Some(i) = line.find(OOB_PREFIX) {
                    return line[i + OOB_PREFIX.len()..].trim_end().to_owned();
                }
            },
        }
    }
}

/// What the active half can do to the passive half's process.
pub enum PeerHandle {
    Thread,
    Process(std::process::Child),
}

/// One half of a scenario.
pub struct Peer<P: Provider> {
    pub ctx: P::Context,
    pub pd: P::Pd,
    pub cq: P::Cq,
    pub qp: Option<P::Qp>,
    pub mem: Memory<P>,
    pub cfg: EpConfig,
    pub oob: Oob,
    pub handle: PeerHandle,
    polled: VecDeque<Completion>,
    posted_recvs: usize,
}

/// Spin, then yield, then sleep briefly: kind to a shared two-core box.
pub struct Backoff(u32);

impl Backoff {
    pub fn new() -> Backoff {
        Backoff(0)
    }
    pub fn wait(&mut self) {
        self.0 += 1;
        if self.0 < 200 {
            std::hint::spin_loop();
        } else if self.0 < 400 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new()
    }
}

impl<P: Provider> Peer<P> {
    fn new(
        ctx: P::Context,
        cfg: EpConfig,
        oob: Oob,
        handle: PeerHandle,
    ) -> (Peer<P>, P::PreparedQp) {
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(256).unwrap();
        let mem = Memory::<P>::new(&pd, &cfg);
        let mut pqp = pd.create_qp(&cq, &cq, cfg.caps).unwrap();
        for _ in 0..cfg.prepost {
            let buf = mem.recv.alloc().unwrap();
            pqp.post_recv(RecvWr {
                wr_id: buf.wr_id(),
                sgl: SgeList::one(Sge::whole(buf)),
            })
            .unwrap();
        }
        let peer = Peer {
            ctx,
            pd,
            cq,
            qp: None,
            mem,
            cfg,
            oob,
            handle,
            polled: VecDeque::new(),
            posted_recvs: cfg.prepost as usize,
        };
        (peer, pqp)
    }

    pub fn qp(&mut self) -> &mut P::Qp {
        self.qp.as_mut().expect("connected")
    }

    pub fn state(&self) -> QpState {
        self.qp.as_ref().map_or(QpState::Error, |q| q.state())
    }

    /// Polls until a completion matching `pred` arrives (others are kept).
    pub fn next_where(&mut self, what: &str, pred: impl Fn(&Completion) -> bool) -> Completion {
        let deadline = Instant::now() + TIMEOUT;
        let mut out: [Completion; 32] = std::array::from_fn(|_| Completion::default());
        let mut b = Backoff::new();
        loop {
            if let Some(i) = self.polled.iter().position(&pred) {
                let c = self.polled.remove(i).unwrap();
                if matches!(c.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm) {
                    self.posted_recvs -= 1;
                }
                return c;
            }
            let n = self.cq.poll(&mut out);
            for c in out.iter_mut().take(n) {
                self.polled.push_back(std::mem::take(c));
            }
            if n == 0 {
                assert!(Instant::now() < deadline, "timed out waiting for {what}");
                b.wait();
            }
        }
    }

    pub fn next_recv(&mut self) -> Completion {
        self.next_where("a receive completion", |c| {
            matches!(c.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm)
        })
    }

    pub fn next_send(&mut self) -> Completion {
        self.next_where("a send-queue completion", |c| {
            !matches!(c.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm)
        })
    }

    pub fn post_recvs(&mut self, n: usize) {
        for _ in 0..n {
            let buf = self.mem.recv.alloc().expect("recv buffer");
            self.qp()
                .post_recv(RecvWr {
                    wr_id: buf.wr_id(),
                    sgl: SgeList::one(Sge::whole(buf)),
                })
                .unwrap();
            self.posted_recvs += 1;
        }
    }

    /// A local buffer holding `data`.
    pub fn local_buf(&self, data: &[u8]) -> Buf {
        let mut b = self.mem.local.alloc().expect("local buffer");
        assert!(b.fill(data));
        b
    }

    pub fn post(&mut self, op: SendOp, sgl: SgeList, signaled: bool) {
        let wr_id = sgl
            .iter()
            .next()
            .map_or(WrId::new(WrKind::Control, 0, 0), |s| s.buf.wr_id());
        let mut wr = SendWr::new(wr_id, op, sgl);
        wr.signaled = signaled;
        self.qp().post_send(wr).map_err(|e| e.error).unwrap();
    }

    pub fn send_bytes(&mut self, op: SendOp, data: &[u8], signaled: bool) {
        let b = self.local_buf(data);
        self.post(op, SgeList::one(Sge::data(b)), signaled);
    }

    /// Waits until the QP is in the error state (driving progress).
    pub fn wait_error(&mut self) {
        let deadline = Instant::now() + TIMEOUT;
        let mut out: [Completion; 32] = std::array::from_fn(|_| Completion::default());
        let mut b = Backoff::new();
        while self.state() != QpState::Error {
            let n = self.cq.poll(&mut out);
            for c in out.iter_mut().take(n) {
                self.polled.push_back(std::mem::take(c));
            }
            assert!(
                Instant::now() < deadline,
                "QP never reached the error state"
            );
            b.wait();
        }
    }

    /// Expose a region and describe it as "addr rkey len".
    pub fn expose_str(&mut self, which: &str) -> String {
        let mr = if which == "rdma" {
            &self.mem.rdma_mr
        } else {
            &self.mem.ro_mr
        };
        let key = self.qp.as_mut().expect("connected").expose(mr).unwrap();
        format!("{} {} {}", key.addr, key.rkey, key.len)
    }

    /// Passive half: report success, wait until the active half is done
    /// with the connection, then [`Peer::finish`].
    pub fn passed(mut self) {
        self.oob.send("passed");
        assert_eq!(self.oob.recv(), "bye");
        self.finish();
    }

    /// Disconnects, drains every outstanding completion and checks that
    /// every pool is back to its configured total.
    pub fn finish(mut self) {
        if let Some(qp) = self.qp.as_mut() {
            qp.disconnect();
        }
        self.drain_all();
        self.qp = None;
        self.polled.clear();
        self.mem.check_pools_full();
    }

    /// Polls until all receives we posted have completed (flushed).
    pub fn drain_all(&mut self) {
        let deadline = Instant::now() + TIMEOUT;
        let mut out: [Completion; 32] = std::array::from_fn(|_| Completion::default());
        let mut b = Backoff::new();
        loop {
            let n = self.cq.poll(&mut out);
            for c in out.iter_mut().take(n) {
                if matches!(c.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm) {
                    self.posted_recvs -= 1;
                }
                *c = Completion::default();
            }
            // Previously polled but unclaimed completions count too.
            while let Some(c) = self.polled.pop_front() {
                if matches!(c.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm) {
                    self.posted_recvs -= 1;
                }
            }
            let all_home =
                self.mem.local.available() == self.mem.local.total() && self.posted_recvs == 0;
            if n == 0 && all_home {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "completions never drained: {} receives outstanding, {}/{} local buffers home, state {:?}",
                self.posted_recvs,
                self.mem.local.available(),
                self.mem.local.total(),
                self.state()
            );
            if n == 0 {
                b.wait();
            }
        }
    }
}

pub fn parse_key(s: &str) -> RemoteKey {
    let mut it = s.split(' ').map(|x| x.parse::<u64>().unwrap());
    RemoteKey {
        addr: it.next().unwrap(),
        rkey: it.next().unwrap() as u32,
        len: it.next().unwrap(),
    }
}

pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// One scenario.
pub struct Case<P: Provider> {
    pub name: &'static str,
    pub active_cfg: EpConfig,
    pub passive_cfg: EpConfig,
    pub active: fn(Peer<P>),
    pub passive: fn(Peer<P>),
}

static SOCK_SEQ: AtomicUsize = AtomicUsize::new(0);

pub fn unique_url(scheme: &str) -> String {
    let seq = SOCK_SEQ.fetch_add(1, Ordering::Relaxed);
    if scheme == "roce" {
        // An IP address of this process on lo (127.64.0.0/10 by pid) and a
        // fresh service port: test binaries running at once never meet.
        let pid = std::process::id();
        let ip = std::net::Ipv4Addr::from(0x7F40_0000 | (pid & 0x3F_FFFF));
        return format!("roce://{ip}:{}?verify_icrc=1", 20000 + seq % 40000);
    }
    if scheme != "shm" {
        return unique_ip_url(scheme);
    }
    format!(
        "{scheme}:///tmp/rpcrdma-conf-{}-{}.sock",
        std::process::id(),
        seq
    )
}

/// Env var with the IP the `IP:PORT` providers (ibverbs, roce, ...) listen
/// on; default 127.0.0.1 (on rxe, the IP of the netdev rxe runs on also
/// works).
pub const ENV_ADDR: &str = "RPCRDMA_CONFORMANCE_ADDR";

/// `scheme://IP:PORT` with a port the kernel just handed out as free
/// (bound and released; rdma_cm's and TCP's port spaces are separate on
/// IB/RoCE and shared on iWARP, so a free TCP port is a good pick for both).
pub fn unique_ip_url(scheme: &str) -> String {
    let ip: std::net::IpAddr = std::env::var(ENV_ADDR)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(std::net::Ipv4Addr::LOCALHOST.into());
    let port = std::net::TcpListener::bind((ip, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let addr = std::net::SocketAddr::new(ip, port);
    format!("{scheme}://{addr}")
}

/// Private data as the application sent it: rdma_cm on IB/RoCE delivers
/// the CM message's whole private-data area, zero-padded (56 bytes in a
/// connect request, 196 in an accept), so trailing zeros are dropped
/// (the suite's private data never ends in a zero byte).
pub fn unpad(private_data: &[u8]) -> &[u8] {
    let end = private_data
        .iter()
        .rposition(|&b| b != 0)
        .map_or(0, |i| i + 1);
    &private_data[..end]
}

/// Runs a case on two threads of this process.
pub fn run_in_process<P: Provider>(case: Case<P>) {
    let url = unique_url(P::SCHEME);
    let ctx = P::open(&url).unwrap();
    let listener = ctx.listen(&url).unwrap();
    let (tx_a, rx_b) = mpsc::channel();
    let (tx_b, rx_a) = mpsc::channel();
    let passive_cfg = case.passive_cfg;
    let passive = case.passive;
    let url2 = url.clone();
    let t = std::thread::spawn(move || {
        let ctx = P::open(&url2).unwrap();
        let (mut peer, pqp) =
            Peer::<P>::new(ctx, passive_cfg, Oob::Chan(tx_b, rx_b), PeerHandle::Thread);
        let (qp, pd) = pqp.connect(&url2, b"passive", TIMEOUT).unwrap();
        assert_eq!(unpad(&pd), b"active");
        peer.qp = Some(qp);
        passive(peer);
    });
    let (mut peer, pqp) = Peer::<P>::new(
        ctx,
        case.active_cfg,
        Oob::Chan(tx_a, rx_a),
        PeerHandle::Thread,
    );
    let inc = listener.accept(TIMEOUT).unwrap();
    assert_eq!(unpad(inc.private_data()), b"passive");
    peer.qp = Some(inc.accept(pqp, b"active").unwrap());
    (case.active)(peer);
    t.join().expect("passive half failed");
}

/// Env var naming the case a re-executed child should run.
pub const ENV_CASE: &str = "RPCRDMA_CONFORMANCE_CASE";
/// Env var with the URL the child connects to.
pub const ENV_URL: &str = "RPCRDMA_CONFORMANCE_URL";

/// Runs a case with the passive half in a child process: the test binary
/// itself, re-executed to run only `child_test` (which calls
/// [`child_main`]).
pub fn run_cross_process<P: Provider>(case: Case<P>, child_test: &str) {
    let url = unique_url(P::SCHEME);
    let ctx = P::open(&url).unwrap();
    let listener = ctx.listen(&url).unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([child_test, "--exact", "--nocapture", "--test-threads=1"])
        .env(ENV_CASE, case.name)
        .env(ENV_URL, &url)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let oob = Oob::Pipe(Box::new(BufReader::new(stdout)), Box::new(stdin));
    let (mut peer, pqp) = Peer::<P>::new(ctx, case.active_cfg, oob, PeerHandle::Process(child));
    let inc = listener.accept(TIMEOUT).unwrap();
    assert_eq!(unpad(inc.private_data()), b"passive");
    peer.qp = Some(inc.accept(pqp, b"active").unwrap());
    (case.active)(peer);
}

/// Entry point of the re-executed child: runs the passive half of the case
/// named in the environment. Returns false when not running as a child.
pub fn child_main<P: Provider>(cases: Vec<Case<P>>) -> bool {
    let Ok(name) = std::env::var(ENV_CASE) else {
        return false;
    };
    let url = std::env::var(ENV_URL).unwrap();
    let case = cases
        .into_iter()
        .find(|c| c.name == name)
        .expect("unknown case");
    let ctx = P::open(&url).unwrap();
    let oob = Oob::Pipe(
        Box::new(BufReader::new(std::io::stdin())),
        Box::new(std::io::stdout()),
    );
    let (mut peer, pqp) = Peer::<P>::new(ctx, case.passive_cfg, oob, PeerHandle::Thread);
    let (qp, pd) = pqp.connect(&url, b"passive", TIMEOUT).unwrap();
    assert_eq!(unpad(&pd), b"active");
    peer.qp = Some(qp);
    (case.passive)(peer);
    true
}

/// Waits for the passive half to report its verdict and (cross-process)
/// for the child to exit successfully.
pub fn join_peer<P: Provider>(peer: &mut Peer<P>) {
    assert_eq!(peer.oob.recv(), "passed", "passive half did not pass");
    peer.oob.send("bye");
    if let PeerHandle::Process(child) = &mut peer.handle {
        let st = child.wait().unwrap();
        assert!(st.success(), "child exited with {st}");
    }
}

// ---------------------------------------------------------------------------
// The scenarios.
// ---------------------------------------------------------------------------

fn big_cfg() -> EpConfig {
    EpConfig {
        buf_size: 1 << 20,
        bufs: 4,
        prepost: 4,
        ..EpConfig::default()
    }
}

const SIZES: [usize; 13] = [
    0,
    1,
    2,
    3,
    63,
    64,
    65,
    4095,
    4096,
    4097,
    65536,
    777_777,
    1 << 20,
];

fn send_recv_active<P: Provider>(mut p: Peer<P>) {
    for (i, &len) in SIZES.iter().enumerate() {
        // Wait for the receiver to have a receive posted for this message
        // beyond the pre-posted window (never relies on timing).
        if i >= 4 {
            assert_eq!(p.oob.recv(), "posted");
        }
        let op = if i % 3 == 1 {
            SendOp::SendWithImm(i as u32)
        } else {
            SendOp::Send
        };
        p.send_bytes(op, &pattern(i as u64, len), true);
        let c = p.next_send();
        assert_eq!(c.status, WcStatus::Success, "send {len}");
        assert_eq!(c.opcode, WcOpcode::Send);
    }
    // Gather (2 SGEs, the first of one byte) into scatter (2 SGEs on the
    // receiver); a third does not fit a list.
    assert_eq!(p.oob.recv(), "posted");
    let data = pattern(99, 200_000);
    let mut sgl = SgeList::new();
    for chunk in [&data[..1], &data[1..]] {
        sgl.push(Sge::data(p.local_buf(chunk))).unwrap();
    }
    assert!(sgl.push(Sge::data(p.local_buf(&data[..1]))).is_err());
    p.post(SendOp::Send, sgl, true);
    let c = p.next_send();
    assert!(c.is_ok());
    assert_eq!(c.sgl.len(), 2);
    drop(c);
    join_peer(&mut p);
    p.finish();
}

fn send_recv_passive<P: Provider>(mut p: Peer<P>) {
    for (i, &len) in SIZES.iter().enumerate() {
        let c = p.next_recv();
        assert_eq!(c.status, WcStatus::Success);
        assert_eq!(c.opcode, WcOpcode::Recv);
        assert_eq!(
            c.byte_len as usize, len,
            "message {i} out of order or wrong length"
        );
        assert_eq!(c.imm, if i % 3 == 1 { Some(i as u32) } else { None });
        let buf = &c.sgl.iter().next().unwrap().buf;
        assert_eq!(
            buf.to_vec(),
            &pattern(i as u64, len)[..],
            "bytes of message {i}"
        );
        assert_eq!(c.wr_id.kind(), Some(WrKind::Recv));
        drop(c);
        if i + 4 < SIZES.len() {
            p.post_recvs(1);
            p.oob.send("posted");
        }
    }
    // Scatter receive: two 64 KiB + rest... use two whole buffers.
    let (a, b) = (p.mem.recv.alloc().unwrap(), p.mem.recv.alloc().unwrap());
    let mut sgl = SgeList::one(Sge::whole(a));
    sgl.push(Sge::whole(b)).unwrap();
    p.qp()
        .post_recv(RecvWr {
            wr_id: WrId::new(WrKind::Recv, 9, 9),
            sgl,
        })
        .unwrap();
    p.posted_recvs += 1;
    p.oob.send("posted");
    let c = p.next_recv();
    assert!(c.is_ok());
    assert_eq!(c.byte_len, 200_000);
    let mut got = Vec::new();
    for s in c.sgl.iter() {
        got.extend_from_slice(&s.buf.to_vec());
    }
    assert_eq!(got, pattern(99, 200_000));
    drop(c);
    p.passed();
}

/// The passive side goes to sleep on its CQ's wake-up descriptor the
/// way a worker does (`before_sleep`, `arm_wakeup`, then `ppoll`), and
/// only then is the Send made: it must end the sleep (the deadline means
/// broken). Every provider has a wake-up descriptor.
fn wake_active<P: Provider>(mut p: Peer<P>) {
    assert_eq!(p.oob.recv(), "asleep");
    p.send_bytes(SendOp::Send, b"wake up", true);
    assert!(p.next_send().is_ok());
    join_peer(&mut p);
    p.finish();
}

fn wake_passive<P: Provider>(mut p: Peer<P>) {
    use std::os::fd::AsRawFd;
    let fd =
        p.cq.wakeup_fd()
            .expect("every provider has a wake-up descriptor")
            .as_raw_fd();
    p.cq.before_sleep();
    assert!(p.cq.arm_wakeup(), "nothing was sent yet");
    p.oob.send("asleep");
    let mut fds = [dataplane::wake::pollfd(fd)];
    assert!(
        dataplane::wake::sleep_on(&mut fds, Duration::from_secs(30)),
        "broken: the Send did not wake the sleeping receiver"
    );
    p.cq.disarm_wakeup();
    let c = p.next_recv();
    assert!(c.is_ok(), "{:?}", c.status);
    assert_eq!(c.byte_len, 7);
    drop(c);
    p.passed();
}

fn rnr_active<P: Provider>(mut p: Peer<P>) {
    p.send_bytes(SendOp::Send, b"nobody listens", true);
    let c = p.next_send();
    assert_eq!(c.status, WcStatus::RnrRetryExcErr);
    assert_eq!(p.state(), QpState::Error);
    drop(c);
    // Posting in the error state flushes.
    p.send_bytes(SendOp::Send, b"late", true);
    assert_eq!(p.next_send().status, WcStatus::WrFlushErr);
    join_peer(&mut p);
    p.finish();
}

fn rnr_cfg() -> EpConfig {
    let mut c = EpConfig::default();
    c.caps.rnr_retry = 3;
    c.caps.rnr_timer = Duration::from_millis(2);
    c
}

fn expect_peer_error_passive<P: Provider>(mut p: Peer<P>) {
    // The active side's error moves this QP to error too (RC semantics).
    p.wait_error();
    p.passed();
}

fn no_recv_cfg() -> EpConfig {
    EpConfig {
        prepost: 0,
        ..EpConfig::default()
    }
}

fn len_err_active<P: Provider>(mut p: Peer<P>) {
    assert_eq!(p.oob.recv(), "posted");
    p.send_bytes(SendOp::Send, &[7u8; 100], true);
    let c = p.next_send();
    assert_eq!(c.status, WcStatus::RemInvReqErr);
    assert_eq!(p.state(), QpState::Error);
    drop(c);
    join_peer(&mut p);
    p.finish();
}

fn len_err_passive<P: Provider>(mut p: Peer<P>) {
    let buf = p.mem.recv.alloc().unwrap();
    p.qp()
        .post_recv(RecvWr {
            wr_id: buf.wr_id(),
            sgl: SgeList::one(Sge {
                buf,
                offset: 0,
                len: 64,
            }),
        })
        .unwrap();
    p.posted_recvs += 1;
    p.post_recvs(1);
    p.oob.send("posted");
    let c = p.next_recv();
    assert!(
        is_receive_overrun(c.status),
        "a message longer than the receive: {:?}",
        c.status
    );
    drop(c);
    // The receive behind it flushes.
    assert_eq!(p.next_recv().status, WcStatus::WrFlushErr);
    assert_eq!(p.state(), QpState::Error);
    p.passed();
}

/// The receiver's status when a message is longer than its receive. The
/// InfiniBand spec's answer, and what HCAs report (mlx4, mlx5), is a
/// local length error. The kernel's soft-RoCE driver reports a local QP
/// operation error instead: in rdma_rxe's responder (rxe_resp.c,
/// `send_data_in`) only `-ENOSPC` from `copy_data` counts as a length
/// error, and `copy_data` (rxe_mr.c) turns a payload longer than the
/// whole receive into `-EINVAL`, handled as a malformed WQE. Both are
/// local errors of that receive that move the QP to error, which is what
/// the case proves (with the flush behind it and the sender's error);
/// any other status (success, flush, a remote or protection error) still
/// fails it. See docs/IBVERBS.md.
pub fn is_receive_overrun(status: WcStatus) -> bool {
    matches!(status, WcStatus::LocLenErr | WcStatus::LocQpOpErr)
}

fn write_send_active<P: Provider>(mut p: Peer<P>) {
    let key = parse_key(&p.oob.recv());
    for round in 0..20u64 {
        let len = 65_000 - round as usize * 1000;
        let off = round * 512;
        let data = pattern(round + 1000, len);
        let msg = format!("{round} {off} {len}");
        // A linked list of two work requests, one doorbell: an unsignaled
        // Write, then the signaled Send that must make it visible.
        let w = p.local_buf(&data);
        let s = p.local_buf(msg.as_bytes());
        let mut write = SendWr::new(
            w.wr_id(),
            SendOp::Write(key.at(off)),
            SgeList::one(Sge::data(w)),
        );
        write.signaled = false;
        let send = SendWr::new(s.wr_id(), SendOp::Send, SgeList::one(Sge::data(s)));
        let mut list = [write, send].into_iter();
        assert_eq!(
            p.qp()
                .post_send_list(&mut list)
                .map_err(|e| e.error)
                .unwrap(),
            2
        );
        assert!(p.next_send().is_ok());
        // Do not overwrite the region before the receiver has checked it.
        assert_eq!(p.oob.recv(), "checked");
    }
    join_peer(&mut p);
    p.finish();
}

fn write_send_passive<P: Provider>(mut p: Peer<P>) {
    let k = p.expose_str("rdma");
    p.oob.send(&k);
    for _ in 0..20 {
        let c = p.next_recv();
        assert!(c.is_ok());
        let text = String::from_utf8(c.sgl.iter().next().unwrap().buf.to_vec()).unwrap();
        drop(c);
        p.post_recvs(1);
        let v: Vec<usize> = text.split(' ').map(|x| x.parse().unwrap()).collect();
        let (round, off, len) = (v[0] as u64, v[1], v[2]);
        // The Send completed here: the earlier Write must be visible.
        let rdma = p.mem.rdma.as_ref().unwrap();
        let want = pattern(round + 1000, len);
        let got = &rdma.to_vec()[off..off + len];
        let bad = got.iter().zip(&want).position(|(a, b)| a != b);
        assert_eq!(bad, None, "round {round}: first difference (len {len})");
        p.oob.send("checked");
    }
    p.passed();
}

fn read_active<P: Provider>(mut p: Peer<P>) {
    let key = parse_key(&p.oob.recv());
    let ro = parse_key(&p.oob.recv());
    for (i, (k, off, len)) in [
        (key, 0u64, 65536usize),
        (key, 12345, 120_000),
        (ro, 100, 60_000),
        (ro, 0, 0),
    ]
    .into_iter()
    .enumerate()
    {
        let b = p.mem.local.alloc().unwrap();
        let mut sgl = SgeList::new();
        sgl.push(Sge {
            buf: b,
            offset: 0,
            len: len.min(65536) as u32,
        })
        .unwrap();
        let mut rest = len.saturating_sub(65536);
        while rest > 0 {
            let take = rest.min(65536);
            sgl.push(Sge {
                buf: p.mem.local.alloc().unwrap(),
                offset: 0,
                len: take as u32,
            })
            .unwrap();
            rest -= take;
        }
        p.post(SendOp::Read(k.at(off)), sgl, true);
        let c = p.next_send();
        assert!(c.is_ok(), "read {i}: {:?}", c.status);
        assert_eq!(c.opcode, WcOpcode::RdmaRead);
        assert_eq!(c.byte_len as usize, len);
        let mut got = Vec::new();
        for s in c.sgl.iter() {
            got.extend_from_slice(&s.buf.to_vec());
        }
        let seed = if k == key { 5 } else { 6 };
        let full = pattern(seed, if k == key { 1 << 20 } else { 64 << 10 });
        assert_eq!(got, &full[off as usize..off as usize + len], "read {i}");
    }
    join_peer(&mut p);
    p.finish();
}

fn read_passive<P: Provider>(mut p: Peer<P>) {
    assert!(p.mem.rdma.as_mut().unwrap().fill(&pattern(5, 1 << 20)));
    assert!(p.mem.ro.as_mut().unwrap().fill(&pattern(6, 64 << 10)));
    let k = p.expose_str("rdma");
    p.oob.send(&k);
    let k = p.expose_str("ro");
    p.oob.send(&k);
    p.passed();
}

fn write_imm_active<P: Provider>(mut p: Peer<P>) {
    let key = parse_key(&p.oob.recv());
    let data = pattern(77, 5000);
    let b = p.local_buf(&data);
    p.post(
        SendOp::WriteWithImm(key.at(64), 0xfeed_f00d),
        SgeList::one(Sge::data(b)),
        true,
    );
    let c = p.next_send();
    assert!(c.is_ok());
    assert_eq!(c.opcode, WcOpcode::RdmaWrite);
    drop(c);
    join_peer(&mut p);
    p.finish();
}

fn write_imm_passive<P: Provider>(mut p: Peer<P>) {
    let k = p.expose_str("rdma");
    p.oob.send(&k);
    let c = p.next_recv();
    assert!(c.is_ok());
    assert_eq!(c.opcode, WcOpcode::RecvRdmaWithImm);
    assert_eq!(c.imm, Some(0xfeed_f00d));
    assert_eq!(c.byte_len, 5000);
    drop(c);
    assert_eq!(
        &p.mem.rdma.as_ref().unwrap().to_vec()[64..5064],
        &pattern(77, 5000)[..]
    );
    p.passed();
}

fn send_inv_active<P: Provider>(mut p: Peer<P>) {
    let key = parse_key(&p.oob.recv());
    p.send_bytes(SendOp::Write(key.at(0)), b"before", true);
    assert!(p.next_send().is_ok());
    p.send_bytes(SendOp::SendWithInv(key.rkey), b"done with it", true);
    assert!(p.next_send().is_ok());
    assert_eq!(p.oob.recv(), "invalidated");
    p.send_bytes(SendOp::Write(key.at(0)), b"after", true);
    let c = p.next_send();
    assert_eq!(c.status, WcStatus::RemAccessErr);
    assert_eq!(p.state(), QpState::Error);
    drop(c);
    join_peer(&mut p);
    p.finish();
}

fn send_inv_passive<P: Provider>(mut p: Peer<P>) {
    let k = p.expose_str("rdma");
    let rkey = parse_key(&k).rkey;
    p.oob.send(&k);
    let c = p.next_recv();
    assert!(c.is_ok());
    assert_eq!(c.invalidated_rkey, Some(rkey));
    drop(c);
    assert_eq!(&p.mem.rdma.as_ref().unwrap().to_vec()[..6], b"before");
    p.oob.send("invalidated");
    p.wait_error();
    assert_eq!(&p.mem.rdma.as_ref().unwrap().to_vec()[..6], b"before");
    p.passed();
}

fn local_inv_active<P: Provider>(mut p: Peer<P>) {
    let key = parse_key(&p.oob.recv());
    p.send_bytes(SendOp::Read(key.at(0)), &[0; 16], true);
    assert!(p.next_send().is_ok());
    p.oob.send("read ok");
    assert_eq!(p.oob.recv(), "invalidated");
    p.send_bytes(SendOp::Read(key.at(0)), &[0; 16], true);
    assert_eq!(p.next_send().status, WcStatus::RemAccessErr);
    join_peer(&mut p);
    p.finish();
}

fn local_inv_passive<P: Provider>(mut p: Peer<P>) {
    let k = p.expose_str("rdma");
    let rkey = parse_key(&k).rkey;
    p.oob.send(&k);
    assert_eq!(p.oob.recv(), "read ok");
    let mut wr = SendWr::new(
        WrId::new(WrKind::Control, 1, 1),
        SendOp::LocalInv(rkey),
        SgeList::new(),
    );
    wr.signaled = true;
    p.qp().post_send(wr).unwrap();
    let c = p.next_send();
    assert!(c.is_ok());
    assert_eq!(c.opcode, WcOpcode::LocalInv);
    drop(c);
    p.oob.send("invalidated");
    p.wait_error();
    p.passed();
}

fn bad_access_active<P: Provider>(mut p: Peer<P>, how: fn(RemoteKey, RemoteKey) -> SendOp) {
    let key = parse_key(&p.oob.recv());
    let ro = parse_key(&p.oob.recv());
    // Unsignaled good write first: an error must still complete in order.
    p.send_bytes(SendOp::Write(key.at(0)), b"fine", false);
    p.send_bytes(how(key, ro), &[1u8; 32], false);
    p.send_bytes(SendOp::Send, b"never", true);
    let c = p.next_send();
    assert_eq!(
        c.status,
        WcStatus::RemAccessErr,
        "error completion even when unsignaled"
    );
    assert_eq!(p.next_send().status, WcStatus::WrFlushErr);
    assert_eq!(p.state(), QpState::Error);
    drop(c);
    join_peer(&mut p);
    p.finish();
}

fn bad_access_passive<P: Provider>(mut p: Peer<P>) {
    let k = p.expose_str("rdma");
    p.oob.send(&k);
    let k = p.expose_str("ro");
    p.oob.send(&k);
    p.wait_error();
    // Nothing was written to the read-only region.
    assert!(p.mem.ro.as_ref().unwrap().to_vec().iter().all(|&b| b == 0));
    p.passed();
}

fn bad_rkey_active<P: Provider>(p: Peer<P>) {
    bad_access_active(p, |k, _| {
        SendOp::Write(RemoteAddr {
            addr: k.addr,
            rkey: k.rkey ^ 0x5a5a_0000,
        })
    });
}

fn oob_active<P: Provider>(p: Peer<P>) {
    bad_access_active(p, |k, _| SendOp::Write(k.at(k.len - 16)));
}

fn wrong_access_active<P: Provider>(p: Peer<P>) {
    bad_access_active(p, |_, ro| SendOp::Write(ro.at(0)));
}

fn flush_active<P: Provider>(mut p: Peer<P>) {
    assert_eq!(p.oob.recv(), "posted");
    p.qp().disconnect();
    // Our own pre-posted receives flush.
    for _ in 0..p.cfg.prepost {
        assert_eq!(p.next_recv().status, WcStatus::WrFlushErr);
    }
    join_peer(&mut p);
    p.finish();
}

fn flush_passive<P: Provider>(mut p: Peer<P>) {
    p.post_recvs(4);
    p.oob.send("posted");
    let n = p.cfg.prepost as usize + 4;
    for _ in 0..n {
        let c = p.next_recv();
        assert_eq!(c.status, WcStatus::WrFlushErr);
        assert_eq!(c.sgl.len(), 1, "flushed receive hands its buffer back");
    }
    assert_eq!(p.state(), QpState::Error);
    p.passed();
}

fn peer_death_active<P: Provider>(mut p: Peer<P>) {
    let data = pattern(3, 60_000);
    let mut sent_ok = 0;
    let mut errors = 0;
    let mut killed = false;
    let deadline = Instant::now() + TIMEOUT;
    // Keep the send queue busy; kill the peer after some traffic.
    let mut outstanding = 0;
    loop {
        while outstanding < 8 && p.state() != QpState::Error {
            p.send_bytes(SendOp::Send, &data, true);
            outstanding += 1;
        }
        let c = p.next_send();
        outstanding -= 1;
        if c.is_ok() {
            sent_ok += 1;
        } else {
            assert!(
                matches!(
                    c.status,
                    WcStatus::RetryExcErr | WcStatus::WrFlushErr | WcStatus::RnrRetryExcErr
                ),
                "{:?}",
                c.status
            );
            errors += 1;
        }
        if sent_ok == 20 && !killed {
            killed = true;
            match &mut p.handle {
                PeerHandle::Process(child) => {
                    child.kill().unwrap(); // SIGKILL
                    let _ = child.wait();
                }
                PeerHandle::Thread => p.oob.send("die"),
            }
        }
        if p.state() == QpState::Error && outstanding == 0 {
            break;
        }
        assert!(Instant::now() < deadline);
    }
    assert!(killed);
    if errors == 0 {
        // The death was noticed while our send queue was empty: nothing of
        // ours was in flight. Posting now must flush.
        p.send_bytes(SendOp::Send, &data, true);
        assert_eq!(p.next_send().status, WcStatus::WrFlushErr);
    }
    // Our posted receives flush too.
    for _ in 0..p.cfg.prepost {
        assert_eq!(p.next_recv().status, WcStatus::WrFlushErr);
    }
    p.finish();
}

fn peer_death_passive<P: Provider>(mut p: Peer<P>) {
    // Receive forever until killed (cross-process) or told to die.
    let cross = matches!(p.oob, Oob::Pipe(..));
    let mut got = 0;
    loop {
        let c = p.next_recv();
        assert!(c.is_ok());
        drop(c);
        p.post_recvs(1);
        got += 1;
        if !cross && got == 20 {
            break;
        }
    }
    assert_eq!(p.oob.recv(), "die");
    // In-process stand-in for death: drop everything abruptly.
    drop(p);
}

fn many_active<P: Provider>(mut p: Peer<P>) {
    const N: usize = 256;
    let url = p.oob.recv();
    let listener = p.ctx.listen(&url).unwrap();
    p.oob.send("listening");
    let caps = QpCaps {
        max_send_wr: 4,
        max_recv_wr: 2,
        ..p.cfg.caps
    };
    let mut qps = Vec::new();
    for _ in 0..N {
        let mut pqp = p.pd.create_qp(&p.cq, &p.cq, caps).unwrap();
        let b = p.mem.recv.alloc_or_wait();
        pqp.post_recv(RecvWr {
            wr_id: b.wr_id(),
            sgl: SgeList::one(Sge::whole(b)),
        })
        .unwrap();
        p.posted_recvs += 1;
        let inc = listener.accept(TIMEOUT).unwrap();
        let idx: usize = std::str::from_utf8(unpad(inc.private_data()))
            .unwrap()
            .parse()
            .unwrap();
        let qp = inc.accept(pqp, b"").unwrap();
        qps.push((idx, qp));
    }
    let mut seen = vec![false; N];
    for _ in 0..N {
        let c = p.next_recv();
        assert!(c.is_ok());
        let idx: usize = std::str::from_utf8(&c.sgl.iter().next().unwrap().buf.to_vec())
            .unwrap()
            .parse()
            .unwrap();
        let qpn = c.qp_num;
        drop(c);
        assert!(!seen[idx]);
        seen[idx] = true;
        // Answer on the same connection.
        let (_, qp) = qps
            .iter_mut()
            .find(|(i, q)| *i == idx && q.qp_num() == qpn)
            .unwrap();
        let b = p.mem.local.alloc_or_wait();
        let mut b = b;
        assert!(b.fill(format!("re {idx}").as_bytes()));
        qp.post_send(SendWr::new(
            b.wr_id(),
            SendOp::Send,
            SgeList::one(Sge::data(b)),
        ))
        .unwrap();
        let c = p.next_send();
        assert!(c.is_ok(), "reply on connection {idx}: {c:?}");
    }
    join_peer(&mut p);
    for (_, qp) in &mut qps {
        qp.disconnect();
    }
    drop(qps);
    p.finish();
}

fn many_passive<P: Provider>(mut p: Peer<P>) {
    const N: usize = 256;
    let url = unique_url(P::SCHEME);
    p.oob.send(&url);
    assert_eq!(p.oob.recv(), "listening");
    let caps = QpCaps {
        max_send_wr: 4,
        max_recv_wr: 2,
        ..p.cfg.caps
    };
    let mut qps = Vec::new();
    for i in 0..N {
        let mut pqp = p.pd.create_qp(&p.cq, &p.cq, caps).unwrap();
        let b = p.mem.recv.alloc_or_wait();
        pqp.post_recv(RecvWr {
            wr_id: b.wr_id(),
            sgl: SgeList::one(Sge::whole(b)),
        })
        .unwrap();
        p.posted_recvs += 1;
        let (qp, _) = pqp
            .connect(&url, i.to_string().as_bytes(), TIMEOUT)
            .unwrap();
        qps.push(qp);
    }
    // All 256 send at once, then collect the 256 answers.
    for (i, qp) in qps.iter_mut().enumerate() {
        let mut b = p.mem.local.alloc_or_wait();
        assert!(b.fill(i.to_string().as_bytes()));
        qp.post_send(SendWr::new(
            b.wr_id(),
            SendOp::Send,
            SgeList::one(Sge::data(b)),
        ))
        .unwrap();
    }
    let mut ok_sends = 0;
    let mut answers = 0;
    while ok_sends < N || answers < N {
        let c = p.next_where("any completion", |_| true);
        assert!(c.is_ok(), "{:?}", c.status);
        match c.opcode {
            WcOpcode::Send => ok_sends += 1,
            _ => {
                let qpn = c.qp_num;
                let text = std::str::from_utf8(&c.sgl.iter().next().unwrap().buf.to_vec())
                    .unwrap()
                    .to_owned();
                let i = qps.iter().position(|q| q.qp_num() == qpn).unwrap();
                assert_eq!(text, format!("re {i}"));
                answers += 1;
            }
        }
    }
    p.oob.send("passed");
    drop(qps);
    p.finish();
}

// ---------------------------------------------------------------------------
// Memory windows: a key per exchange, bound by a work request.
// ---------------------------------------------------------------------------

/// Where the window cases bind inside the 1 MiB `rdma` region, and the
/// tag of their first key.
const WIN_OFF: u64 = 4096;
const WIN_TAG: u32 = 0x5a5a_5a5a;

impl<P: Provider> Peer<P> {
    /// Fills the `rdma` region with `pattern(seed)` and returns its bytes.
    pub fn fill_rdma(&mut self, seed: u64) -> Vec<u8> {
        let data = pattern(seed, 1 << 20);
        assert!(self.mem.rdma.as_mut().unwrap().fill(&data));
        data
    }

    /// The `rdma` region's bytes now.
    pub fn rdma_bytes(&self) -> Vec<u8> {
        self.mem.rdma.as_ref().unwrap().to_vec()
    }

    /// A bind of `w` under `rkey` over `len` bytes at `off` of the `rdma`
    /// region.
    pub fn rdma_bind(
        &self,
        w: &Window,
        rkey: u32,
        off: u64,
        len: u64,
        access: Access,
    ) -> BindWindow {
        let mr = &self.mem.rdma_mr;
        w.bind(rkey, mr.lkey(), mr.addr() + off, len, access)
    }

    /// Posts a signaled bind and waits for its successful completion.
    pub fn bind_ok(&mut self, b: BindWindow) {
        self.post(SendOp::Bind(b), SgeList::new(), true);
        let c = self.next_send();
        assert_eq!(c.status, WcStatus::Success, "bind");
        assert_eq!(c.opcode, WcOpcode::Bind);
    }

    /// Binds `w` under `rkey` over `len` bytes at `WIN_OFF` of the `rdma`
    /// region, waits for the bind, and sends the key out of band.
    pub fn bind_and_send_key(&mut self, w: &Window, rkey: u32, len: u64, access: Access) {
        let b = self.rdma_bind(w, rkey, WIN_OFF, len, access);
        self.bind_ok(b);
        self.oob.send(&key_str(b.remote_key()));
    }

    /// Waits for the peer's error to reach this QP, then checks that the
    /// `rdma` region still holds `before`, every byte.
    pub fn unchanged_at_error(&mut self, before: &[u8], what: &str) {
        self.wait_error();
        assert!(self.rdma_bytes() == before, "{what} changed the region");
    }

    /// Posts a signaled local invalidate and waits for its completion.
    pub fn local_inv(&mut self, rkey: u32) {
        self.post(SendOp::LocalInv(rkey), SgeList::new(), true);
        let c = self.next_send();
        assert_eq!(c.status, WcStatus::Success, "local invalidate");
        assert_eq!(c.opcode, WcOpcode::LocalInv);
    }

    /// Reads `len` bytes at `ra` and returns the completion.
    pub fn read(&mut self, ra: RemoteAddr, len: usize) -> Completion {
        let b = self.local_buf(&vec![0; len]);
        self.post(SendOp::Read(ra), SgeList::one(Sge::data(b)), true);
        self.next_send()
    }

    /// Writes `data` at `ra` and returns the completion.
    pub fn write(&mut self, ra: RemoteAddr, data: &[u8]) -> Completion {
        self.send_bytes(SendOp::Write(ra), data, true);
        self.next_send()
    }
}

/// The active half's end after a work request that must fail with
/// `status`: the status, the QP in error, then the usual end.
fn end_with_error<P: Provider>(mut p: Peer<P>, c: Completion, status: WcStatus, what: &str) {
    assert_eq!(c.status, status, "{what}");
    assert_eq!(p.state(), QpState::Error);
    drop(c);
    join_peer(&mut p);
    p.finish();
}

fn key_str(k: RemoteKey) -> String {
    format!("{} {} {}", k.addr, k.rkey, k.len)
}

/// Target of the read-only cases: binds 64 bytes in the middle of the
/// (writable) `rdma` region read-only, unsignaled, and sends the key in a
/// Send posted right behind the bind (send-queue order makes it valid by
/// the time the peer sees the Send); then checks that no byte of the
/// region changed when the peer's error reaches it.
fn window_ro_target<P: Provider>(mut p: Peer<P>) {
    let before = p.fill_rdma(11);
    let w = p.qp().alloc_window().unwrap();
    let b = p.rdma_bind(
        &w,
        w.rkey_unlike(WIN_TAG, &[]),
        WIN_OFF,
        64,
        Access::REMOTE_READ,
    );
    p.post(SendOp::Bind(b), SgeList::new(), false);
    p.send_bytes(SendOp::Send, key_str(b.remote_key()).as_bytes(), true);
    assert!(p.next_send().is_ok());
    p.unchanged_at_error(&before, "the peer");
    p.passed();
}

/// The peer's side: the key from the Send, then a Read inside the window.
fn window_ro_key<P: Provider>(p: &mut Peer<P>) -> RemoteKey {
    let c = p.next_recv();
    assert!(c.is_ok());
    let text = c.sgl.iter().next().unwrap().buf.to_vec();
    let key = parse_key(std::str::from_utf8(&text).unwrap());
    assert_eq!(key.len, 64);
    let expect = &pattern(11, 1 << 20)[WIN_OFF as usize..WIN_OFF as usize + 64];
    let c = p.read(key.at(0), 64);
    assert_eq!(c.status, WcStatus::Success, "read inside the window");
    assert_eq!(c.sgl.iter().next().unwrap().buf.to_vec(), expect);
    key
}

fn window_read_only_active<P: Provider>(mut p: Peer<P>) {
    let key = window_ro_key(&mut p);
    let c = p.write(key.at(0), &[0xee; 16]);
    end_with_error(
        p,
        c,
        WcStatus::RemAccessErr,
        "write through a read-only window",
    );
}

/// Set by a provider's test file when its device checks a window's key
/// and rights but bounds its accesses by the whole region (rdma_rxe: its
/// responder checks the range against the region the window lies in).
pub static WINDOW_RANGE_UNCHECKED: AtomicBool = AtomicBool::new(false);

fn window_bounds_active<P: Provider>(mut p: Peer<P>) {
    let key = window_ro_key(&mut p);
    // The last byte is inside, the one after it is not.
    assert!(p.read(key.at(63), 1).is_ok());
    let c = p.read(key.at(64), 1);
    if c.is_ok() && WINDOW_RANGE_UNCHECKED.load(Ordering::Relaxed) {
        println!("known gap: this device bounds window accesses by the region");
        // Rights are checked: a write through the read-only window fails.
        drop(c);
        let c = p.write(key.at(0), &[0xee; 16]);
        end_with_error(
            p,
            c,
            WcStatus::RemAccessErr,
            "write through a read-only window",
        );
    } else {
        end_with_error(p, c, WcStatus::RemAccessErr, "read 1 byte past the window");
    }
}

/// The hostile late Write: the peer writes through a window, the target
/// invalidates it, the peer writes again: that write fails at the peer
/// and changes no byte of the region.
fn window_late_write_passive<P: Provider>(mut p: Peer<P>) {
    p.fill_rdma(12);
    let w = p.qp().alloc_window().unwrap();
    let rkey = w.rkey_unlike(WIN_TAG, &[]);
    p.bind_and_send_key(&w, rkey, 256, Access::REMOTE_WRITE | Access::REMOTE_READ);
    assert_eq!(p.oob.recv(), "written");
    let landed = p.rdma_bytes();
    let at = WIN_OFF as usize;
    assert_eq!(
        &landed[at..at + 256],
        &pattern(13, 256)[..],
        "the write landed"
    );
    p.local_inv(rkey);
    p.oob.send("invalidated");
    p.unchanged_at_error(&landed, "the late write");
    p.passed();
}

fn window_late_write_active<P: Provider>(mut p: Peer<P>) {
    let key = parse_key(&p.oob.recv());
    assert!(p.write(key.at(0), &pattern(13, 256)).is_ok());
    p.oob.send("written");
    assert_eq!(p.oob.recv(), "invalidated");
    let c = p.write(key.at(0), &[0xee; 256]);
    end_with_error(p, c, WcStatus::RemAccessErr, "late write");
}

/// Send with Invalidate kills a window's key; the window is bound again
/// under a new tag, which works, and the old key stays dead.
fn window_send_inv_passive<P: Provider>(mut p: Peer<P>) {
    p.fill_rdma(14);
    let w = p.qp().alloc_window().unwrap();
    let old = w.rkey_unlike(WIN_TAG, &[]);
    p.bind_and_send_key(&w, old, 128, Access::REMOTE_WRITE);
    let c = p.next_recv();
    assert!(c.is_ok());
    assert_eq!(c.invalidated_rkey, Some(old));
    drop(c);
    let new = w.next_rkey(old);
    assert_ne!(new, old);
    assert!(w.owns(new));
    p.bind_and_send_key(&w, new, 128, Access::REMOTE_WRITE);
    assert_eq!(p.oob.recv(), "second written");
    let now = p.rdma_bytes();
    let at = WIN_OFF as usize;
    assert_eq!(&now[at..at + 5], b"first");
    assert_eq!(&now[at + 8..at + 14], b"second");
    p.oob.send("checked");
    p.unchanged_at_error(&now, "a write with the old key");
    p.passed();
}

fn window_send_inv_active<P: Provider>(mut p: Peer<P>) {
    let old = parse_key(&p.oob.recv());
    assert!(p.write(old.at(0), b"first").is_ok());
    p.send_bytes(SendOp::SendWithInv(old.rkey), b"done with it", true);
    assert!(p.next_send().is_ok());
    let new = parse_key(&p.oob.recv());
    assert_ne!(new.rkey, old.rkey);
    assert!(p.write(new.at(8), b"second").is_ok());
    p.oob.send("second written");
    assert_eq!(p.oob.recv(), "checked");
    let c = p.write(old.at(0), b"stale!");
    end_with_error(
        p,
        c,
        WcStatus::RemAccessErr,
        "write with the invalidated key",
    );
}

/// Posts `bad` (signaled) and expects `MwBindErr` and the error state.
fn expect_bind_err<P: Provider>(mut p: Peer<P>, bad: BindWindow) {
    p.post(SendOp::Bind(bad), SgeList::new(), true);
    let c = p.next_send();
    assert_eq!(c.opcode, WcOpcode::Bind);
    end_with_error(p, c, WcStatus::MwBindErr, &format!("{bad:?}"));
}

fn window_bind_while_bound_active<P: Provider>(mut p: Peer<P>) {
    let w = p.qp().alloc_window().unwrap();
    let rkey = w.rkey_unlike(WIN_TAG, &[]);
    p.bind_ok(p.rdma_bind(&w, rkey, WIN_OFF, 64, Access::REMOTE_READ));
    // Type 2 windows must be invalidated before they are bound again.
    let again = p.rdma_bind(&w, w.next_rkey(rkey), WIN_OFF, 64, Access::REMOTE_READ);
    expect_bind_err(p, again);
}

fn window_bind_wrong_fixed_bits_active<P: Provider>(mut p: Peer<P>) {
    let w = p.qp().alloc_window().unwrap();
    let fixed_bit = !w.mask() & (!w.mask()).wrapping_neg();
    let rkey = w.rkey(WIN_TAG) ^ fixed_bit;
    assert!(!w.owns(rkey));
    let bad = p.rdma_bind(&w, rkey, WIN_OFF, 64, Access::REMOTE_READ);
    expect_bind_err(p, bad);
}

fn window_bind_outside_mr_active<P: Provider>(mut p: Peer<P>) {
    let w = p.qp().alloc_window().unwrap();
    // 32 bytes inside the 1 MiB region, 32 past its end.
    let bad = p.rdma_bind(&w, w.rkey(WIN_TAG), (1 << 20) - 32, 64, Access::REMOTE_READ);
    expect_bind_err(p, bad);
}

/// `Slab::alloc` for tests that churn many small buffers.
pub trait AllocOrWait {
    fn alloc_or_wait(&self) -> Buf;
}

impl AllocOrWait for Slab {
    fn alloc_or_wait(&self) -> Buf {
        self.alloc().expect("slab exhausted")
    }
}

fn many_cfg() -> EpConfig {
    EpConfig {
        buf_size: 4096,
        bufs: 600,
        prepost: 0,
        ..EpConfig::default()
    }
}

/// All scenarios, for provider `P`.
pub fn cases<P: Provider>() -> Vec<Case<P>> {
    let d = EpConfig::default;
    vec![
        Case {
            name: "a_send_wakes_a_sleeping_receiver",
            active_cfg: d(),
            passive_cfg: d(),
            active: wake_active::<P>,
            passive: wake_passive::<P>,
        },
        Case {
            name: "send_recv_sizes_and_order",
            active_cfg: big_cfg(),
            passive_cfg: big_cfg(),
            active: send_recv_active::<P>,
            passive: send_recv_passive::<P>,
        },
        Case {
            name: "rnr_retry_exceeded",
            active_cfg: rnr_cfg(),
            passive_cfg: no_recv_cfg(),
            active: rnr_active::<P>,
            passive: expect_peer_error_passive::<P>,
        },
        Case {
            name: "local_length_error",
            active_cfg: d(),
            passive_cfg: no_recv_cfg(),
            active: len_err_active::<P>,
            passive: len_err_passive::<P>,
        },
        Case {
            name: "write_then_send_visibility",
            active_cfg: d(),
            passive_cfg: d(),
            active: write_send_active::<P>,
            passive: write_send_passive::<P>,
        },
        Case {
            name: "rdma_read",
            active_cfg: d(),
            passive_cfg: d(),
            active: read_active::<P>,
            passive: read_passive::<P>,
        },
        Case {
            name: "write_with_immediate",
            active_cfg: d(),
            passive_cfg: d(),
            active: write_imm_active::<P>,
            passive: write_imm_passive::<P>,
        },
        Case {
            name: "send_with_invalidate",
            active_cfg: d(),
            passive_cfg: d(),
            active: send_inv_active::<P>,
            passive: send_inv_passive::<P>,
        },
        Case {
            name: "local_invalidate",
            active_cfg: d(),
            passive_cfg: d(),
            active: local_inv_active::<P>,
            passive: local_inv_passive::<P>,
        },
        Case {
            name: "bad_rkey",
            active_cfg: d(),
            passive_cfg: d(),
            active: bad_rkey_active::<P>,
            passive: bad_access_passive::<P>,
        },
        Case {
            name: "out_of_bounds",
            active_cfg: d(),
            passive_cfg: d(),
            active: oob_active::<P>,
            passive: bad_access_passive::<P>,
        },
        Case {
            name: "wrong_access_flag",
            active_cfg: d(),
            passive_cfg: d(),
            active: wrong_access_active::<P>,
            passive: bad_access_passive::<P>,
        },
        Case {
            name: "flush_on_close",
            active_cfg: d(),
            passive_cfg: d(),
            active: flush_active::<P>,
            passive: flush_passive::<P>,
        },
        Case {
            name: "peer_death_mid_transfer",
            active_cfg: d(),
            passive_cfg: d(),
            active: peer_death_active::<P>,
            passive: peer_death_passive::<P>,
        },
        Case {
            name: "many_qps_256",
            active_cfg: many_cfg(),
            passive_cfg: many_cfg(),
            active: many_active::<P>,
            passive: many_passive::<P>,
        },
        Case {
            name: "window_read_only",
            active_cfg: d(),
            passive_cfg: d(),
            active: window_read_only_active::<P>,
            passive: window_ro_target::<P>,
        },
        Case {
            name: "window_bounds",
            active_cfg: d(),
            passive_cfg: d(),
            active: window_bounds_active::<P>,
            passive: window_ro_target::<P>,
        },
        Case {
            name: "window_late_write",
            active_cfg: d(),
            passive_cfg: d(),
            active: window_late_write_active::<P>,
            passive: window_late_write_passive::<P>,
        },
        Case {
            name: "window_send_with_invalidate",
            active_cfg: d(),
            passive_cfg: d(),
            active: window_send_inv_active::<P>,
            passive: window_send_inv_passive::<P>,
        },
        Case {
            name: "window_bind_while_bound",
            active_cfg: d(),
            passive_cfg: d(),
            active: window_bind_while_bound_active::<P>,
            passive: expect_peer_error_passive::<P>,
        },
        Case {
            name: "window_bind_wrong_fixed_bits",
            active_cfg: d(),
            passive_cfg: d(),
            active: window_bind_wrong_fixed_bits_active::<P>,
            passive: expect_peer_error_passive::<P>,
        },
        Case {
            name: "window_bind_outside_mr",
            active_cfg: d(),
            passive_cfg: d(),
            active: window_bind_outside_mr_active::<P>,
            passive: expect_peer_error_passive::<P>,
        },
    ]
}

/// Runs the case named `name` in process.
pub fn in_process<P: Provider>(name: &str) {
    let case = cases::<P>().into_iter().find(|c| c.name == name).unwrap();
    run_in_process(case);
}

/// Runs the case named `name` across processes.
pub fn cross_process<P: Provider>(name: &str, child_test: &str) {
    let case = cases::<P>().into_iter().find(|c| c.name == name).unwrap();
    run_cross_process(case, child_test);
}
