//! Fuzzing entry point for the worker's endpoint layer (the
//! `engine_worker` cargo-fuzz target): a real [`Endpoint`] (the engine
//! glued to a queue pair, its completion queue, its two registered arenas
//! and their work-request leases) over a fake provider whose every
//! decision comes from the input.
//!
//! The fake provider is the peer and the HCA at once: it keeps what the
//! endpoint posted, and the input decides which work request completes
//! next (any order), with which verbs status (all of them), whether a
//! stale or foreign id completes, how full the send queue is, what the
//! peer's connection private data says, what lands in a receive buffer or
//! an RDMA Read's destination, and what the peer writes into the arena it
//! holds a key for. The engine is exercised through the endpoint exactly
//! as a worker drives it: `poll_completions`, `handle_timeouts`,
//! `poll_event`, `flush`.
//!
//! Not on the data path: nothing here is reachable from a real provider.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::endpoint::{Endpoint, EndpointConfig, PreparedEndpoint};
use crate::engine::fuzz::{label, Input, PeerModel};
use crate::engine::{Config, Coverage, Instant};
use crate::mem::{self, Arena, Backing};
use crate::verbs::{
    self, Access, Completion, CompletionQueue, Context, Incoming, Listener, MemoryRegion,
    PostError, PostFailed, PreparedQp, ProtectionDomain, Provider, QpCaps, QpState, QueuePair,
    RecvWr, RemoteKey, SendOp, SendWr, SharedReceiveQueue, SrqCaps, VerbsError, WcOpcode, WcStatus,
    Window,
};
use crate::wire::rpcrdma::{PrivateData, Segment, PRIVATE_DATA_LEN};

/// The fake provider's type (no device behind it).
#[derive(Debug)]
pub struct FuzzProvider;

/// A registration: the arena's real address is the region's address, so
/// a peer's segment names real bytes, checked here as an HCA checks them.
#[derive(Debug, Clone)]
struct Mr {
    arena: Arc<Arena>,
    addr: u64,
    len: usize,
    lkey: u32,
    access: Access,
}

/// Everything the provider holds, shared by its objects and the harness.
#[derive(Debug, Default)]
struct State {
    mrs: Vec<Mr>,
    /// Keys the peer may use: region exposures and bound windows, with
    /// the range and the rights they grant.
    keys: HashMap<u32, (u64, u64, Access)>,
    sends: Vec<SendWr>,
    recvs: VecDeque<RecvWr>,
    completions: VecDeque<Completion>,
    /// Bytes of every Send posted, for the peer to read.
    sent: Vec<Vec<u8>>,
    state: Option<QpState>,
    peer_disconnected: bool,
    send_room: usize,
    windows: u32,
    windows_allocated: u32,
    peer_private_data: Vec<u8>,
}

type Shared = Arc<Mutex<State>>;

fn lock(s: &Shared) -> std::sync::MutexGuard<'_, State> {
    s.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl State {
    /// Where `len` bytes at `addr` are, if one registration holds them.
    fn locate(&self, addr: u64, len: usize) -> Option<*mut u8> {
        let mr = self.mrs.iter().find(|m| {
            addr >= m.addr
                && addr
                    .checked_add(len as u64)
                    .is_some_and(|e| e <= m.addr + m.len as u64)
        })?;
        let off = (addr - mr.addr) as usize;
        // SAFETY: inside the mapping of an arena the registration keeps
        // alive (checked just above).
        Some(unsafe { mr.arena.as_ptr().add(off) })
    }

    /// The bytes an SGE names (lease pointer plus offset), if inside a
    /// registration.
    fn sge_ptr(&self, sge: &verbs::Sge) -> Option<*mut u8> {
        self.sge_range(sge, sge.len as usize)
    }

    /// The first `len` bytes an SGE names, if inside a registration.
    fn sge_range(&self, sge: &verbs::Sge, len: usize) -> Option<*mut u8> {
        let addr = (sge.buf.as_ptr() as u64).checked_add(u64::from(sge.offset))?;
        self.locate(addr, len.min(sge.len as usize))
    }

    /// A peer's RDMA Write: key, range and rights checked as an HCA does.
    fn peer_write(&self, seg: &Segment, bytes: &[u8]) -> bool {
        let Some(&(start, len, access)) = self.keys.get(&seg.handle) else {
            return false;
        };
        let end = seg.offset.checked_add(bytes.len() as u64);
        if !access.contains(Access::REMOTE_WRITE)
            || seg.offset < start
            || end.is_none_or(|e| e > start + len)
        {
            return false;
        }
        match self.locate(seg.offset, bytes.len()) {
            Some(p) => {
                // SAFETY: inside a live arena; the engine reaches peer
                // memory only through copies, never through a slice, so
                // this write (what a peer's HCA does at any moment) breaks
                // no borrow.
                unsafe { mem::copy_in(bytes, p) };
                true
            }
            None => false,
        }
    }

    /// Moves everything posted to the completion queue, flushed (the
    /// queue pair entered the error state).
    fn flush_all(&mut self) {
        self.state = Some(QpState::Error);
        for wr in std::mem::take(&mut self.sends) {
            self.completions.push_back(Completion {
                wr_id: wr.wr_id,
                status: WcStatus::WrFlushErr,
                opcode: wr.op.wc_opcode(),
                sgl: wr.sgl,
                ..Completion::default()
            });
        }
        for wr in std::mem::take(&mut self.recvs) {
            self.completions.push_back(Completion {
                wr_id: wr.wr_id,
                status: WcStatus::WrFlushErr,
                opcode: WcOpcode::Recv,
                sgl: wr.sgl,
                ..Completion::default()
            });
        }
    }
}

#[derive(Debug)]
pub struct FuzzContext(Shared);
#[derive(Debug)]
pub struct FuzzPd(Shared);
#[derive(Debug)]
pub struct FuzzMr(Mr);
#[derive(Debug)]
pub struct FuzzCq(Shared);
#[derive(Debug)]
pub struct FuzzQp(Shared);
#[derive(Debug)]
pub struct FuzzListener;
#[derive(Debug)]
pub struct FuzzIncoming;
#[derive(Debug)]
pub struct FuzzSrq;

impl Provider for FuzzProvider {
    type Context = FuzzContext;
    type Pd = FuzzPd;
    type Mr = FuzzMr;
    type Cq = FuzzCq;
    type PreparedQp = FuzzQp;
    type Qp = FuzzQp;
    type Listener = FuzzListener;
    type Incoming = FuzzIncoming;
    type Srq = FuzzSrq;
    const SCHEME: &'static str = "fuzz";
    const WINDOWS_ALWAYS: bool = true;

    fn open(_url: &str) -> Result<FuzzContext, VerbsError> {
        Ok(FuzzContext(Arc::default()))
    }
}

impl Context<FuzzProvider> for FuzzContext {
    fn alloc_pd(&self) -> Result<FuzzPd, VerbsError> {
        Ok(FuzzPd(self.0.clone()))
    }
    fn create_cq(&self, _depth: usize) -> Result<FuzzCq, VerbsError> {
        Ok(FuzzCq(self.0.clone()))
    }
    fn listen(&self, _url: &str) -> Result<FuzzListener, VerbsError> {
        Ok(FuzzListener)
    }
}

impl ProtectionDomain<FuzzProvider> for FuzzPd {
    fn register(
        &self,
        arena: &Arc<Arena>,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<FuzzMr, VerbsError> {
        verbs::check_registration(arena, offset, len, access)?;
        let mut s = lock(&self.0);
        let mr = Mr {
            arena: arena.clone(),
            addr: arena.as_ptr() as u64 + offset as u64,
            len,
            lkey: 0x100 + s.mrs.len() as u32,
            access,
        };
        s.mrs.push(mr.clone());
        Ok(FuzzMr(mr))
    }
    fn create_qp(&self, _: &FuzzCq, _: &FuzzCq, caps: QpCaps) -> Result<FuzzQp, VerbsError> {
        let mut s = lock(&self.0);
        s.send_room = s.send_room.min(caps.max_send_wr as usize);
        s.state = Some(QpState::Init);
        Ok(FuzzQp(self.0.clone()))
    }
    fn create_srq(&self, _caps: SrqCaps) -> Result<FuzzSrq, VerbsError> {
        Err(VerbsError::Limit("no shared receive queues"))
    }
    fn create_qp_on_srq(
        &self,
        _: &FuzzCq,
        _: &FuzzCq,
        _: &FuzzSrq,
        _: QpCaps,
    ) -> Result<FuzzQp, VerbsError> {
        Err(VerbsError::Limit("no shared receive queues"))
    }
}

impl MemoryRegion for FuzzMr {
    fn lkey(&self) -> u32 {
        self.0.lkey
    }
    fn addr(&self) -> u64 {
        self.0.addr
    }
    fn len(&self) -> usize {
        self.0.len
    }
    fn access(&self) -> Access {
        self.0.access
    }
}

impl CompletionQueue for FuzzCq {
    fn poll(&self, out: &mut [Completion]) -> usize {
        let mut s = lock(&self.0);
        let mut n = 0;
        while n < out.len() {
            let Some(c) = s.completions.pop_front() else {
                break;
            };
            out[n] = c;
            n += 1;
        }
        n
    }
}

impl FuzzQp {
    /// Takes a receive; in the error state it completes flushed at once.
    fn post_recv_inner(&mut self, wr: RecvWr) {
        let mut s = lock(&self.0);
        if s.state == Some(QpState::Error) {
            s.completions.push_back(Completion {
                wr_id: wr.wr_id,
                status: WcStatus::WrFlushErr,
                opcode: WcOpcode::Recv,
                sgl: wr.sgl,
                ..Completion::default()
            });
            return;
        }
        s.recvs.push_back(wr);
    }
}

impl PreparedQp<FuzzProvider> for FuzzQp {
    fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostFailed<RecvWr>> {
        self.post_recv_inner(wr);
        Ok(())
    }
    fn connect(
        self,
        _url: &str,
        _private_data: &[u8],
        _timeout: Duration,
    ) -> Result<(FuzzQp, Vec<u8>), VerbsError> {
        let pd = {
            let mut s = lock(&self.0);
            s.state = Some(QpState::Rts);
            s.peer_private_data.clone()
        };
        Ok((self, pd))
    }
}

impl Listener<FuzzProvider> for FuzzListener {
    fn accept(&self, _timeout: Duration) -> Result<FuzzIncoming, VerbsError> {
        Err(VerbsError::Timeout)
    }
}

impl Incoming<FuzzProvider> for FuzzIncoming {
    fn private_data(&self) -> &[u8] {
        &[]
    }
    fn accept(self, _qp: FuzzQp, _private_data: &[u8]) -> Result<FuzzQp, VerbsError> {
        Err(VerbsError::NotConnected)
    }
    fn reject(self, _private_data: &[u8]) -> Result<(), VerbsError> {
        Ok(())
    }
}

impl SharedReceiveQueue<FuzzProvider> for FuzzSrq {
    fn post_recv(&self, wr: RecvWr) -> Result<(), PostFailed<RecvWr>> {
        Err(PostFailed {
            error: PostError::Invalid,
            wr,
        })
    }
    fn posted(&self) -> usize {
        0
    }
}

impl QueuePair<FuzzProvider> for FuzzQp {
    fn qp_num(&self) -> u32 {
        7
    }
    fn state(&self) -> QpState {
        lock(&self.0).state.unwrap_or(QpState::Init)
    }
    fn peer_disconnected(&self) -> bool {
        lock(&self.0).peer_disconnected
    }
    fn post_send(&mut self, wr: SendWr) -> Result<(), PostFailed<SendWr>> {
        let mut s = lock(&self.0);
        if s.state == Some(QpState::Error) {
            s.completions.push_back(Completion {
                wr_id: wr.wr_id,
                status: WcStatus::WrFlushErr,
                opcode: wr.op.wc_opcode(),
                sgl: wr.sgl,
                ..Completion::default()
            });
            return Ok(());
        }
        if s.sends.len() >= s.send_room {
            return Err(PostFailed {
                error: PostError::QueueFull,
                wr,
            });
        }
        // Key operations execute in send-queue order: a bound key is live
        // for everything posted after it.
        match wr.op {
            SendOp::Bind(b) => {
                s.keys.insert(b.rkey, (b.addr, b.len, b.access));
            }
            SendOp::LocalInv(rkey) => {
                s.keys.remove(&rkey);
            }
            SendOp::Send | SendOp::SendWithInv(_) | SendOp::SendWithImm(_) => {
                let mut bytes = Vec::new();
                for sge in wr.sgl.iter() {
                    if let Some(p) = s.sge_ptr(sge) {
                        let mut v = vec![0u8; sge.len as usize];
                        // SAFETY: inside a live arena (`sge_ptr`).
                        unsafe { mem::copy_out(p, &mut v) };
                        bytes.extend_from_slice(&v);
                    }
                }
                s.sent.push(bytes);
            }
            _ => {}
        }
        s.sends.push(wr);
        Ok(())
    }
    fn post_send_list<I: Iterator<Item = SendWr>>(
        &mut self,
        wrs: &mut I,
    ) -> Result<usize, PostFailed<SendWr>> {
        let mut n = 0;
        for wr in wrs {
            self.post_send(wr)?;
            n += 1;
        }
        Ok(n)
    }
    fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostFailed<RecvWr>> {
        self.post_recv_inner(wr);
        Ok(())
    }
    fn expose(&mut self, mr: &FuzzMr) -> Result<RemoteKey, VerbsError> {
        let rkey = 0x5000_0000 | mr.0.lkey;
        let mut s = lock(&self.0);
        s.keys
            .insert(rkey, (mr.0.addr, mr.0.len as u64, mr.0.access));
        Ok(RemoteKey {
            addr: mr.0.addr,
            rkey,
            len: mr.0.len as u64,
        })
    }
    fn alloc_window(&mut self) -> Result<Window, VerbsError> {
        let mut s = lock(&self.0);
        if s.windows_allocated >= s.windows {
            return Err(VerbsError::Limit("no memory window left"));
        }
        let i = s.windows_allocated;
        s.windows_allocated += 1;
        Ok(Window::new(i, (i + 1) << 24, 0x00ff_ffff))
    }
    fn disconnect(&mut self) {
        lock(&self.0).flush_all();
    }
}

/// The verbs statuses by four bits of input: success most often, every
/// error a provider reports.
fn verbs_status(bits: u8) -> WcStatus {
    match bits & 15 {
        6 => WcStatus::LocLenErr,
        7 => WcStatus::LocProtErr,
        8 => WcStatus::LocQpOpErr,
        9 => WcStatus::RemAccessErr,
        10 => WcStatus::RemInvReqErr,
        11 => WcStatus::RnrRetryExcErr,
        12 => WcStatus::RetryExcErr,
        13 => WcStatus::WrFlushErr,
        14 => WcStatus::MwBindErr,
        _ => WcStatus::Success,
    }
}

/// Feeds `data` to one [`Endpoint`] over [`FuzzProvider`], then closes it
/// and checks that every work request, lease and engine resource came
/// back.
///
/// Input: a configuration byte (bit 0 responder-provided read chunks, 1
/// memory windows (else region keys), 2 a send queue of two entries
/// (back-pressure, the endpoint's backlog), 3 no peer private data (1 KiB
/// inline thresholds), 4 the peer offers remote invalidation, 5 a grant of
/// one credit, 6 the engine answers CONF_RDMA, 7 one RDMA Read at a
/// time), then operations: a control byte whose low four bits pick one
/// (as in [`crate::engine::fuzz_recv`], see `Op` below) and whose high
/// four bits are its parameter.
///
/// # Panics
/// When a resource is not returned after the close, or on a panic in the
/// endpoint or the engine (the bugs being looked for).
pub fn fuzz_endpoint(data: &[u8]) -> Coverage {
    let mut input = Input(data);
    let flags = input.byte().unwrap_or(0);
    let mut cov = Coverage::default();
    let engine = Config {
        inline_recv_size: 4096,
        inline_send_size: 4096,
        credits: if flags & 32 != 0 { 1 } else { 4 },
        max_outstanding_calls: 4,
        max_call_size: 64 * 1024,
        max_reply_size: 64 * 1024,
        max_ddp_size: 64 * 1024,
        max_rdma_read: if flags & 128 != 0 { 1 } else { 4 },
        serve_conf_rdma: flags & 64 != 0,
        reply_read_chunks: flags & 1 != 0,
        extensions: crate::engine::fuzz::continuation_if(flags & 64 != 0),
        max_group_transmissions: 4,
        continuation_receives: 4,
        max_reply_read_chunks: 2,
        call_timeout: Some(Duration::from_micros(500)),
        done_timeout: Duration::from_micros(700),
        ..Config::default()
    };
    let config = EndpointConfig {
        engine,
        max_send_wr: 64,
        backlog: 64,
        backing: Backing::Small,
        ..EndpointConfig::default()
    };
    let ctx = FuzzContext(Arc::default());
    {
        let mut s = lock(&ctx.0);
        s.send_room = if flags & 4 != 0 { 2 } else { usize::MAX };
        s.windows = if flags & 2 != 0 { 256 } else { 0 };
        if flags & 8 == 0 {
            let mut pd = [0u8; PRIVATE_DATA_LEN];
            let _ = PrivateData {
                remote_invalidate: flags & 16 != 0,
                max_send_size: 4096,
                max_recv_size: 4096,
            }
            .emit(&mut pd);
            s.peer_private_data = pd.to_vec();
        }
    }
    let Ok(pd) = ctx.alloc_pd() else {
        return cov;
    };
    let Ok(prepared) = PreparedEndpoint::<FuzzProvider>::new(&ctx, &pd, &config) else {
        return cov;
    };
    let Ok(ep) = prepared.connect("fuzz://peer") else {
        return cov;
    };
    let mut h = Harness {
        ep,
        shared: ctx.0.clone(),
        now: Instant::ZERO,
        history: VecDeque::new(),
        peer: PeerModel::new(),
    };
    for shape in [0u8, 4 | 2, 16 | 8 | 3] {
        let now = h.now;
        h.peer.engine_call(h.ep.connection_mut(), now, shape);
    }
    h.pump(&mut cov);
    while let Some(ctl) = input.byte() {
        if h.step(ctl, &mut input, &mut cov).is_none() {
            break;
        }
        h.pump(&mut cov);
    }
    cov.stats(h.ep.connection());
    let c = h.ep.counters();
    for (n, label) in [
        (
            c.foreign_completions,
            label!("endpoint: foreign_completions"),
        ),
        (c.queue_full, label!("endpoint: queue_full")),
        (c.post_invalid, label!("endpoint: post_invalid")),
        (c.error_completions, label!("endpoint: error_completions")),
    ] {
        if n > 0 {
            cov.mark(label);
        }
    }

    // Tear down as a worker retires a connection: release, close, and
    // poll until everything posted has come back flushed.
    for call in h.peer.replies.drain(..) {
        h.ep.connection_mut().release_reply(call);
    }
    h.ep.close();
    cov.sample(h.ep.connection());
    for _ in 0..64 {
        h.pump(&mut cov);
        lock(&h.shared).flush_all();
        if h.ep.is_drained() {
            break;
        }
    }
    let r = h.ep.resources();
    assert!(
        h.ep.is_drained(),
        "not drained: {r:?}, backlog {}",
        h.ep.backlog()
    );
    assert!(r.is_idle(), "leak: {r:?}");
    assert_eq!(h.ep.leases_in_use(), 0, "leases held");
    cov
}

struct Harness {
    ep: Endpoint<FuzzProvider>,
    shared: Shared,
    now: Instant,
    /// Verbs ids completed earlier, replayed as stale completions.
    history: VecDeque<mem::WrId>,
    peer: PeerModel,
}

/// The operations of [`fuzz_endpoint`], by the low four bits of a
/// control byte (the same numbering as the engine target where they mean
/// the same).
#[derive(Debug, Clone, Copy)]
enum Op {
    /// A raw message in the oldest posted receive: `u16` length, bytes
    /// (a length beyond the buffer is reported as it is).
    Raw,
    /// Send-queue entry number `byte` completes with the parameter's
    /// status; a successful Read lands the peer's memory.
    Complete,
    /// A stale or foreign completion: an id completed before (parameter
    /// even) or any `u64`, with status `byte`.
    Stale,
    /// A reply to one of the engine's calls (as `engine_recv`).
    Reply,
    /// A call of the peer (as `engine_recv`).
    Call,
    /// The engine answers a call of the peer (as `engine_recv`).
    Answer,
    /// Time passes: the parameter times 150 µs.
    Time,
    /// The application releases reply `byte`.
    Release,
    /// The engine makes a call of shape `byte`.
    EngineCall,
    /// The peer writes into the arenas under a key: key `byte` of those it
    /// holds, `u16` offset, length `byte`, bytes.
    Scribble,
    /// The peer changes its own memory: `u16` address, length `byte`, bytes.
    PeerMemory,
    /// RDMA_DONE for exposed reply `byte` (parameter odd: as Send With
    /// Invalidate).
    Done,
    /// The oldest receive completes with the parameter's status.
    RecvError,
    /// The peer disconnects (parameter even) or the queue pair fails.
    Disconnect,
    /// Every send-queue entry completes successfully, oldest first
    /// (parameter odd: newest first).
    CompleteAll,
    /// The send queue's room becomes the parameter (0: unlimited).
    SendRoom,
}

const OPS: [Op; 16] = [
    Op::Raw,
    Op::Complete,
    Op::Stale,
    Op::Reply,
    Op::Call,
    Op::Answer,
    Op::Time,
    Op::Release,
    Op::EngineCall,
    Op::Scribble,
    Op::PeerMemory,
    Op::Done,
    Op::RecvError,
    Op::Disconnect,
    Op::CompleteAll,
    Op::SendRoom,
];

impl Harness {
    /// One round of a worker's loop for this endpoint.
    fn pump(&mut self, cov: &mut Coverage) {
        // Small bursts, sampled after each, so that states a burst passes
        // through (a slot draining its flushes) are seen.
        let mut wcs: [Completion; 2] = Default::default();
        for _ in 0..256 {
            let n = self.ep.poll_completions(self.now, &mut wcs);
            cov.sample(self.ep.connection());
            self.ep.handle_timeouts(self.now);
            while let Some(ev) = self.ep.poll_event() {
                cov.event(&ev);
                self.peer.on_event(self.ep.connection(), &ev);
            }
            let posted = self.ep.flush();
            let sent = std::mem::take(&mut lock(&self.shared).sent);
            for bytes in &sent {
                self.peer.saw_send(bytes);
            }
            if n == 0 && posted == 0 {
                break;
            }
        }
        if self.ep.backlog() > 0 {
            cov.mark(label!("endpoint: backlog"));
        }
        cov.sample(self.ep.connection());
        let s = lock(&self.shared);
        for wr in &s.sends {
            cov.mark(match wr.op {
                SendOp::Send | SendOp::SendWithImm(_) => label!("wr: Send"),
                SendOp::SendWithInv(_) => label!("wr: Send with invalidate"),
                SendOp::Read(_) => label!("wr: RdmaRead"),
                SendOp::Write(_) | SendOp::WriteWithImm(..) => label!("wr: RdmaWrite"),
                SendOp::Bind(_) => label!("wr: Bind"),
                SendOp::LocalInv(_) => label!("wr: Invalidate"),
            });
        }
    }

    fn remember(&mut self, id: mem::WrId) {
        if self.history.len() == 16 {
            self.history.pop_front();
        }
        self.history.push_back(id);
    }

    /// Delivers `msg` in the oldest posted receive.
    fn deliver(&mut self, msg: &[u8], invalidated: Option<u32>) {
        let mut s = lock(&self.shared);
        let Some(mut wr) = s.recvs.pop_front() else {
            return;
        };
        if let Some(sge) = wr.sgl.iter().next() {
            let n = msg.len().min(sge.len as usize);
            if let Some(p) = s.sge_range(sge, n) {
                // SAFETY: inside a live arena (`sge_ptr`), a receive
                // buffer the engine handed to the provider.
                unsafe { mem::copy_in(&msg[..n], p) };
            }
        }
        if let Some(rkey) = invalidated {
            s.keys.remove(&rkey);
        }
        let id = wr.wr_id;
        s.completions.push_back(Completion {
            wr_id: id,
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            byte_len: msg.len() as u32,
            invalidated_rkey: invalidated,
            qp_num: 7,
            sgl: std::mem::take(&mut wr.sgl),
            imm: None,
        });
        drop(s);
        self.remember(id);
    }

    /// Completes send-queue entry `i` with `status`.
    fn complete(&mut self, i: usize, status: WcStatus) {
        let mut s = lock(&self.shared);
        if s.sends.is_empty() {
            return;
        }
        let i = i % s.sends.len();
        let wr = s.sends.remove(i);
        let mut len = 0u32;
        if status == WcStatus::Success {
            if let SendOp::Read(remote) = wr.op {
                let mut addr = remote.addr;
                for sge in wr.sgl.iter() {
                    let bytes = self.peer.read_peer(addr, sge.len as usize);
                    if let Some(p) = s.sge_ptr(sge) {
                        // SAFETY: inside a live arena (`sge_ptr`), the
                        // Read's destination.
                        unsafe { mem::copy_in(&bytes, p) };
                    }
                    addr += u64::from(sge.len);
                }
            }
            len = wr.sgl.iter().map(|s| s.len).sum();
        } else {
            // A failed work request takes its queue pair to the error state.
            s.state = Some(QpState::Error);
        }
        let id = wr.wr_id;
        s.completions.push_back(Completion {
            wr_id: id,
            status,
            opcode: wr.op.wc_opcode(),
            byte_len: len,
            qp_num: 7,
            sgl: wr.sgl,
            ..Completion::default()
        });
        if status != WcStatus::Success {
            s.flush_all();
        }
        drop(s);
        self.remember(id);
    }

    fn step(&mut self, ctl: u8, input: &mut Input<'_>, cov: &mut Coverage) -> Option<()> {
        let param = ctl >> 4;
        match OPS[usize::from(ctl & 15)] {
            Op::Raw => {
                let n = input.u16()?;
                let msg = input.take(usize::from(n));
                self.deliver(msg, None);
            }
            Op::Complete => {
                let i = usize::from(input.byte()?);
                let status = verbs_status(param);
                if status != WcStatus::Success {
                    cov.mark(label!("completion: error status"));
                }
                self.complete(i, status);
            }
            Op::Stale => {
                let status = verbs_status(input.byte()?);
                let id = if param & 1 == 0 && !self.history.is_empty() {
                    Some(self.history[usize::from(param >> 1) % self.history.len()])
                } else {
                    mem::WrId::from_raw(input.u64()?)
                };
                if let Some(wr_id) = id {
                    lock(&self.shared).completions.push_back(Completion {
                        wr_id,
                        status,
                        opcode: if param & 2 != 0 {
                            WcOpcode::Recv
                        } else {
                            WcOpcode::Send
                        },
                        qp_num: 7,
                        ..Completion::default()
                    });
                }
            }
            Op::Reply => {
                let (sel, kind, credits) = (input.byte()?, input.byte()?, input.byte()?);
                let n = input.u16()?;
                let body = input.take(usize::from(n));
                let shared = self.shared.clone();
                let mut write = |seg: &Segment, bytes: &[u8]| {
                    lock(&shared).peer_write(seg, bytes);
                };
                if let Some(msg) = self.peer.reply_to(&mut write, sel, kind, credits, body) {
                    self.deliver(&msg, None);
                }
            }
            Op::Call => {
                let (shape, proc_) = (input.byte()?, input.byte()?);
                let n = input.u16()?;
                let body = input.take(usize::from(n));
                let msg = self.peer.peer_call(shape, proc_, body);
                self.deliver(&msg, None);
            }
            Op::Answer => {
                let (sel, shape) = (input.byte()?, input.byte()?);
                let now = self.now;
                self.peer
                    .answer(self.ep.connection_mut(), now, sel, shape, cov);
            }
            Op::Time => {
                self.now = self
                    .now
                    .saturating_add(Duration::from_micros(u64::from(param) * 150));
            }
            Op::Release => {
                let sel = usize::from(input.byte()?);
                let n = self.peer.replies.len();
                if n > 0 {
                    if let Some(call) = self.peer.replies.remove(sel % n) {
                        self.ep.connection_mut().release_reply(call);
                    }
                }
            }
            Op::EngineCall => {
                let shape = input.byte()?;
                let now = self.now;
                self.peer.engine_call(self.ep.connection_mut(), now, shape);
            }
            Op::Scribble => {
                let sel = usize::from(input.byte()?);
                let off = u64::from(input.u16()?);
                let n = usize::from(input.byte()?);
                let bytes = input.take(n);
                let s = lock(&self.shared);
                let mut keys: Vec<_> = s.keys.iter().map(|(k, v)| (*k, *v)).collect();
                keys.sort_unstable_by_key(|(k, _)| *k);
                if !keys.is_empty() {
                    let (handle, (start, len, _)) = keys[sel % keys.len()];
                    let seg = Segment {
                        handle,
                        length: bytes.len() as u32,
                        offset: start + off % len.max(1),
                    };
                    s.peer_write(&seg, bytes);
                }
            }
            Op::PeerMemory => {
                let addr = u64::from(input.u16()?);
                let n = usize::from(input.byte()?);
                let bytes = input.take(n);
                self.peer.write_peer(addr, bytes);
            }
            Op::Done => {
                let sel = input.byte()?;
                let (msg, rkey) = self.peer.done(sel);
                // Parameter odd: as Send With Invalidate, of the exposed
                // reply's key, or of a key that is none of ours.
                let rkey = rkey.unwrap_or(0x0bad_0bad);
                self.deliver(&msg, (param & 1 != 0).then_some(rkey));
            }
            Op::RecvError => {
                let mut s = lock(&self.shared);
                if let Some(wr) = s.recvs.pop_front() {
                    let status = match verbs_status(param) {
                        WcStatus::Success => WcStatus::LocLenErr,
                        e => e,
                    };
                    cov.mark(label!("completion: error status"));
                    let id = wr.wr_id;
                    s.completions.push_back(Completion {
                        wr_id: id,
                        status,
                        opcode: WcOpcode::Recv,
                        qp_num: 7,
                        sgl: wr.sgl,
                        ..Completion::default()
                    });
                    s.flush_all();
                    drop(s);
                    self.remember(id);
                }
            }
            Op::Disconnect => {
                let mut s = lock(&self.shared);
                s.peer_disconnected = param & 1 == 0;
                s.flush_all();
            }
            Op::CompleteAll => {
                let n = lock(&self.shared).sends.len();
                for _ in 0..n {
                    let i = if param & 1 != 0 { usize::MAX } else { 0 };
                    let last = lock(&self.shared).sends.len().saturating_sub(1);
                    self.complete(i.min(last), WcStatus::Success);
                }
            }
            Op::SendRoom => {
                lock(&self.shared).send_room = if param == 0 {
                    usize::MAX
                } else {
                    usize::from(param)
                };
            }
        }
        Some(())
    }
}
