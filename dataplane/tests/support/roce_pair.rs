//! A connected pair of `roce` endpoints on loopback, for the loss,
//! allocation and capture tests. Either endpoint can be driven from any
//! thread; both live in one process and share one device.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use dataplane::mem::{Arena, Buf, Slab, WrKind};
use dataplane::verbs::roce::{Roce, RoceContext, RoceCq, RoceMr, RocePd, RocePreparedQp, RoceQp};
use dataplane::verbs::*;

/// Turns a hang into a failure (never a pass criterion).
pub const TIMEOUT: Duration = Duration::from_secs(120);
/// Size of the exposed RDMA region and of the largest message.
pub const BIG: usize = 1 << 20;

static SEQ: AtomicUsize = AtomicUsize::new(0);

/// A URL on an address of this process (127.64.0.0/10 by pid; the
/// conformance suite uses the same scheme) with a fresh service port,
/// plus `extra` query options.
pub fn loopback_url(extra: &str) -> String {
    let pid = std::process::id();
    let ip = std::net::Ipv4Addr::from(0x7F40_0000 | (pid & 0x3F_FFFF));
    let port = 40000 + SEQ.fetch_add(1, Ordering::Relaxed) % 20000;
    format!("roce://{ip}:{port}?{extra}")
}

/// One endpoint: memory, CQ and a connected QP.
pub struct Endpoint {
    pub cq: RoceCq,
    pub qp: RoceQp,
    pub recv: Slab,
    pub local: Slab,
    /// 1 MiB registered LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ.
    pub rdma: Option<Buf>,
    pub rdma_mr: RoceMr,
    _mrs: Vec<RoceMr>,
    _pd: RocePd,
    _ctx: RoceContext,
}

struct Unconnected {
    ctx: RoceContext,
    pd: RocePd,
    cq: RoceCq,
    recv: Slab,
    local: Slab,
    rdma: Buf,
    rdma_mr: RoceMr,
    mrs: Vec<RoceMr>,
}

fn prepare(url: &str, prepost: u32) -> (Unconnected, RocePreparedQp) {
    let ctx = Roce::open(url).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256).unwrap();
    let bytes = BIG * 4;
    let recv_arena = Arena::new(bytes).unwrap();
    let local_arena = Arena::new(bytes).unwrap();
    let rdma_arena = Arena::new(BIG).unwrap();
    let lw = Access::LOCAL_WRITE;
    let recv_mr = pd.register(&recv_arena, 0, bytes, lw).unwrap();
    let local_mr = pd.register(&local_arena, 0, bytes, lw).unwrap();
    let rdma_mr = pd
        .register(
            &rdma_arena,
            0,
            BIG,
            lw | Access::REMOTE_WRITE | Access::REMOTE_READ,
        )
        .unwrap();
    let recv = Slab::new(recv_arena, 0, BIG as u32, 4, recv_mr.lkey(), WrKind::Recv).unwrap();
    let local = Slab::new(local_arena, 0, BIG as u32, 4, local_mr.lkey(), WrKind::Send).unwrap();
    let rdma_slab = Slab::new(rdma_arena, 0, BIG as u32, 1, rdma_mr.lkey(), WrKind::Chunk).unwrap();
    let mut rdma = rdma_slab.alloc().unwrap();
    rdma.set_len(BIG as u32);
    let caps = QpCaps {
        max_send_wr: 64,
        max_recv_wr: 16,
        max_inline: 256,
        rnr_retry: 7,
        rnr_timer: Duration::from_millis(1),
    };
    let mut pqp = pd.create_qp(&cq, &cq, caps).unwrap();
    for _ in 0..prepost {
        let b = recv.alloc().unwrap();
        pqp.post_recv(RecvWr {
            wr_id: b.wr_id(),
            sgl: SgeList::one(Sge::whole(b)),
        })
        .unwrap();
    }
    let u = Unconnected {
        ctx,
        pd,
        cq,
        recv,
        local,
        rdma,
        rdma_mr,
        mrs: vec![recv_mr, local_mr],
    };
    (u, pqp)
}

impl Unconnected {
    fn into_endpoint(self, qp: RoceQp) -> Endpoint {
        Endpoint {
            cq: self.cq,
            qp,
            recv: self.recv,
            local: self.local,
            rdma: Some(self.rdma),
            rdma_mr: self.rdma_mr,
            _mrs: self.mrs,
            _pd: self.pd,
            _ctx: self.ctx,
        }
    }
}

/// Two connected endpoints (`a` accepted, `b` connected), `prepost`
/// receives each.
pub fn pair(url: &str, prepost: u32) -> (Endpoint, Endpoint) {
    let (a, a_qp) = prepare(url, prepost);
    let listener = a.ctx.listen(url).unwrap();
    let url2 = url.to_owned();
    let t = std::thread::spawn(move || {
        let (b, b_qp) = prepare(&url2, prepost);
        let (qp, pd) = b_qp.connect(&url2, b"b", TIMEOUT).unwrap();
        assert_eq!(pd, b"a");
        b.into_endpoint(qp)
    });
    let inc = listener.accept(TIMEOUT).unwrap();
    assert_eq!(inc.private_data(), b"b");
    let qp = inc.accept(a_qp, b"a").unwrap();
    let b = t.join().unwrap();
    (a.into_endpoint(qp), b)
}

impl Endpoint {
    /// Polls once into `out`, returning how many arrived.
    pub fn poll(&self, out: &mut [Completion]) -> usize {
        self.cq.poll(out)
    }

    pub fn post_recv(&mut self) {
        let b = self.recv.alloc().expect("recv buffer");
        self.qp
            .post_recv(RecvWr {
                wr_id: b.wr_id(),
                sgl: SgeList::one(Sge::whole(b)),
            })
            .unwrap();
    }

    pub fn post(&mut self, op: SendOp, data: &[u8], read_len: u32) {
        let mut b = self.local.alloc().expect("local buffer");
        let sge = if matches!(op, SendOp::Read(_)) {
            Sge {
                buf: b,
                offset: 0,
                len: read_len,
            }
        } else {
            assert!(b.fill(data));
            Sge::data(b)
        };
        let wr = SendWr::new(sge.buf.wr_id(), op, SgeList::one(sge));
        self.qp.post_send(wr).map_err(|e| e.error).unwrap();
    }

    pub fn key(&mut self) -> RemoteKey {
        self.qp.expose(&self.rdma_mr).unwrap()
    }

    pub fn rdma(&mut self) -> &mut Buf {
        self.rdma.as_mut().unwrap()
    }
}

/// Polls `me` until a completion matching `pred` arrives on it (the
/// other endpoint's shard of the device, which nobody polls meanwhile,
/// is driven by the device's thread).
pub fn wait(me: &Endpoint, pred: impl Fn(&Completion) -> bool) -> Completion {
    let deadline = Instant::now() + TIMEOUT;
    let mut out: [Completion; 8] = std::array::from_fn(|_| Completion::default());
    let mut spins = 0u32;
    loop {
        let n = me.poll(&mut out[..1]);
        if n == 1 {
            let c = std::mem::take(&mut out[0]);
            assert!(pred(&c), "unexpected completion {c:?}");
            return c;
        }
        assert!(Instant::now() < deadline, "timed out");
        // Adaptive idle: spin, then yield, then sleep briefly.
        spins += 1;
        if spins < 200 {
            std::hint::spin_loop();
        } else if spins < 400 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

/// Deterministic test bytes.
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
