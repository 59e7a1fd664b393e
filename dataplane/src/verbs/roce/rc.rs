//! One RC queue pair's transport: requester (PSN assignment, segmentation,
//! go-back-N, retransmit and RNR timers), responder (PSN checks, duplicate
//! handling incl. RDMA Read replay, R_Key checks, ACK coalescing) and the
//! completer (cumulative ACKs, NAKs, read responses), after IBTA Vol. 1
//! ch. 9 and 10 as Linux rxe implements them (rxe_req.c, rxe_resp.c,
//! rxe_comp.c). Sans-IO except for the [`Tx`] batch it emits into.
use std::collections::VecDeque;
use std::net::SocketAddrV4;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::io::{Faults, SocketBuffers, Tx};
use super::pd::PdInner;
use super::ready::{Announce, Ready};
use crate::mem::Arena;
use crate::verbs::soft_mr::{KeySlots, MrTable, KEY_SLOTS};
use crate::verbs::soft_qp::{check_post, recv_completion, set_placed, SoftQp};
use crate::verbs::soft_srq::SoftSrq;
use crate::verbs::*;
use crate::wire::roce::seg::{self, MessageKind, Mtu};
use crate::wire::roce::{Aeth, Bth, NakCode, Opcode, Position, Psn, Reth, RocePacket, Syndrome};

/// Most PSNs in flight (sent, not acknowledged) per QP.
pub(super) const WINDOW: i32 = 128;
/// Ask for an ACK at least every this many packets inside long messages.
const ACKREQ_EVERY: u32 = 32;
/// How long a requester with packets unacknowledged waits in silence
/// before it sends its last packet again (at most; a quarter of a
/// shorter ACK timeout). A lost tail has nothing after it to make the
/// responder NAK (IBTA 9.7.5.1.5 only NAKs a PSN that is ahead), so
/// without this it waits for the whole ACK timeout (64 ms). The probe is
/// one packet, and it does not spend a retry: if only the ACK was slow
/// the responder answers a duplicate with a repeated ACK, if the tail was
/// lost it arrives now, and if more was lost the responder NAKs the
/// first PSN it misses and the requester goes back to it (the same idea
/// as TCP's tail loss probe, RFC 8985). Longer than the device's thread
/// takes to drive a responder nobody polls (about 1 ms).
const QUIET_PROBE: Duration = Duration::from_millis(4);
/// Probes without progress before only the retransmission timer is left,
/// each after twice the silence of the one before (4, 8, 16, 32 ms: all
/// inside the default 64 ms timeout), so a slow peer gets a handful of
/// duplicates, not one every few milliseconds.
const MAX_PROBES: u32 = 4;
/// Most RDMA Reads outstanding (initiator depth / responder resources).
pub(super) const MAX_RD: u32 = 16;
/// Read response packets a responder emits per progress call (pacing: a
/// 1 MiB read would otherwise overrun the peer's socket buffer at once).
const READ_BURST: u32 = 64;
static ZEROS: [u8; 4096] = [0; 4096];

/// How a requester recovered from losses (for tests and logs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Last packets sent again after a quiet period (`QUIET_PROBE`).
    pub tail_probes: u64,
    /// Retransmission timer expiries (go back to the oldest unacknowledged
    /// PSN, a retry spent).
    pub timeouts: u64,
    /// PSN sequence error NAKs received (go back to the PSN named).
    pub sequence_naks: u64,
}

/// Where the peer of a connected QP is.
#[derive(Debug, Clone, Copy)]
pub(super) struct PeerPath {
    pub addr: SocketAddrV4,
    pub qpn: u32,
}

/// The CM identity of the connection a QP is bound to.
#[derive(Debug, Clone, Copy)]
pub(super) struct ConnRef {
    pub local_comm_id: u32,
}

/// Transport timers and retry budgets.
#[derive(Debug, Clone, Copy)]
pub(super) struct Timers {
    /// Retransmission (local ACK) timeout.
    pub ack_timeout: Duration,
    /// Transport retries before `RetryExcErr`.
    pub retry_count: u8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Msg(MessageKind),
    Read,
    /// Local Invalidate or window Bind: runs in order when reached, sends
    /// nothing.
    Local,
}

struct SqEntry {
    wr: SendWr,
    kind: Kind,
    remote: RemoteAddr,
    first: Psn,
    npkts: u32,
    /// Packets sent in the current attempt (reads: 0 or `npkts`).
    sent: u32,
    total: u32,
    ranges: [(usize, usize); MAX_SGE],
    nr: usize,
    /// No peer may write the ranges' memory ([`crate::mem::Arena::peer_may_write`]).
    private: bool,
    /// Every PSN acknowledged (or, for reads, every response placed).
    done: bool,
    /// Reads: response packets placed.
    got: u32,
    /// A local error decided at post time, reported in order.
    local_err: Option<WcStatus>,
}

impl SqEntry {
    fn last(&self) -> Psn {
        self.first.add(self.npkts.max(1) - 1)
    }
}

#[derive(Debug, Clone)]
struct KeyEntry {
    rkey: u32,
    addr: u64,
    len: u64,
    access: Access,
    _arena: Arc<Arena>,
}

/// An accepted RDMA Read: the responder resource (kept for replays of
/// duplicates, 16 at most, oldest overwritten as in rxe) and, while
/// responses are being sent, a job.
#[derive(Clone)]
struct ReadJob {
    /// PSN of the request (first response).
    psn: Psn,
    va: u64,
    rkey: u32,
    addr: usize,
    len: u32,
    npkts: u32,
    sent: u32,
    _arena: Option<Arc<Arena>>,
}

enum Cur {
    Idle,
    Send {
        placed: u32,
    },
    Write {
        addr: usize,
        left: u32,
        imm_len: u32,
    },
}

/// One RC queue pair (owned by its device's engine once bound).
pub(super) struct RcQp {
    pub qpn: u32,
    pub state: QpState,
    /// The peer sent a DREQ: the error state is its orderly end.
    pub peer_disconnected: bool,
    pub caps: QpCaps,
    pub pd: Arc<PdInner>,
    pub send_cq: usize,
    pub recv_cq: usize,
    /// Set when installed on a device: where new completions are
    /// announced (before that none are produced).
    pub announce: Option<Announce>,
    /// On its send CQ's and its receive CQ's ready list (one flag when
    /// both are one CQ: `[0]`).
    announced: [bool; 2],
    /// In its shard's list of queue pairs to tick (`ShardState::active`).
    pub ticking: bool,
    pub mtu: Mtu,
    /// The device socket's buffers (set at install), which the window
    /// and read burst are fitted to at [`bind`](Self::bind).
    pub buffers: SocketBuffers,
    /// When to send the last packet again if nothing is heard (see
    /// [`QUIET_PROBE`]); armed with the retransmission timer.
    probe_at: Option<Instant>,
    /// Probes sent since the last progress (see [`MAX_PROBES`]).
    probes_in_row: u32,
    /// How losses were recovered: tail probes sent, retransmission
    /// timeouts, sequence NAKs received.
    pub recovery: Recovery,
    /// Most PSNs in flight: [`WINDOW`], or fewer if the socket buffers
    /// would not hold them.
    window: i32,
    /// Read responses per progress step: [`READ_BURST`], or fewer
    /// likewise.
    read_burst: u32,
    pub timers: Timers,
    pub peer: Option<PeerPath>,
    /// The UDP source port the peer's QP sends from (pinned by its first
    /// packet).
    pub peer_src_port: Option<u16>,
    pub conn: Option<ConnRef>,
    /// Our QP errored: a DREQ is to be sent by the CM.
    pub dreq_due: bool,
    /// Passive side: our REP is out and neither the RTU nor a packet of
    /// the peer's QP has come back yet (the first such packet implies the
    /// RTU; the device's CM then stops resending the REP).
    pub awaiting_rtu: bool,
    pub faults: Faults,
    // requester
    sq: VecDeque<SqEntry>,
    pub send_done: VecDeque<Completion>,
    next_psn: Psn,
    /// One past the highest PSN put on the wire: ACKs and NAKs may only
    /// cover PSNs the peer can have seen (`next_psn` also counts work
    /// posted but not yet sent).
    sent_end: Psn,
    una: Psn,
    sq_next: usize,
    retry_left: u8,
    rnr_left: u8,
    timer: Option<Instant>,
    rnr_until: Option<Instant>,
    /// A read re-request already issued for this PSN (one per gap).
    reread_at: Option<Psn>,
    // responder
    /// Our receives; on a shared receive queue, at most the one taken for
    /// the message in progress.
    rq: VecDeque<RecvWr>,
    /// The shared receive queue this queue pair takes its receives from.
    pub srq: Option<Arc<SoftSrq>>,
    pub recv_done: VecDeque<Completion>,
    epsn: Psn,
    msn: u32,
    nak_sent: bool,
    ack_due: bool,
    /// The ACK owed was marked in the progress step now running: a
    /// polling caller holds it one step (see [`tick`](Self::tick)).
    ack_fresh: bool,
    /// Request packets emitted (first sends and retransmissions): a step
    /// that sent some lets a held ACK ride behind them.
    packets_out: u64,
    cur: Cur,
    read_jobs: VecDeque<ReadJob>,
    read_res: VecDeque<ReadJob>,
    /// Reads we may have outstanding: the peer's responder resources.
    max_rd: u32,
    /// What each key slot grants (live keys only).
    keys: Vec<Option<KeyEntry>>,
    /// Who owns each key slot (exposures, windows).
    slots: KeySlots,
}

/// Smallest RNR NAK timer code waiting at least `d` (IBTA table, rxe
/// `rnrnak_usec`); code 0 (655 ms) if nothing smaller suffices.
fn rnr_code(d: Duration) -> u8 {
    let us = d.as_micros().min(u32::MAX as u128) as u32;
    (1u8..32)
        .filter(|&c| crate::wire::roce::rnr_timer_usec(c) >= us)
        .min_by_key(|&c| crate::wire::roce::rnr_timer_usec(c))
        .unwrap_or(0)
}

/// Copies `dst.len()` bytes from byte `off` of the concatenated `ranges`.
///
/// # Safety
/// Every range must be valid for reads.
unsafe fn gather(ranges: &[(usize, usize)], mut off: usize, dst: &mut [u8]) {
    let mut done = 0;
    for &(addr, len) in ranges {
        if done == dst.len() {
            break;
        }
        if off >= len {
            off -= len;
            continue;
        }
        let n = (len - off).min(dst.len() - done);
        // SAFETY: off + n <= len, valid per the caller.
        unsafe { std::ptr::copy((addr + off) as *const u8, dst[done..].as_mut_ptr(), n) };
        done += n;
        off = 0;
    }
}

/// The address of bytes `off..off + len` of the concatenated `ranges`,
/// when they lie in one range.
fn within_one_range(ranges: &[(usize, usize)], mut off: usize, len: usize) -> Option<usize> {
    for &(addr, rlen) in ranges {
        if off < rlen {
            return (off + len <= rlen).then_some(addr + off);
        }
        off -= rlen;
    }
    None
}

/// Payloads shorter than this are copied into the transmit slot even from
/// private memory: two more iovecs cost more than the copy.
const EXTERNAL_MIN: usize = 1024;

/// Copies `src` to byte `off` of the concatenated `ranges`; false if it
/// does not fit (nothing is copied then).
///
/// # Safety
/// Every range must be valid for writes.
unsafe fn scatter(ranges: &[(usize, usize)], mut off: usize, src: &[u8]) -> bool {
    let room: usize = ranges.iter().map(|r| r.1).sum();
    if off + src.len() > room {
        return false;
    }
    let mut done = 0;
    for &(addr, len) in ranges {
        if done == src.len() {
            break;
        }
        if off >= len {
            off -= len;
            continue;
        }
        let n = (len - off).min(src.len() - done);
        // SAFETY: off + n <= len, valid per the caller.
        unsafe { std::ptr::copy(src[done..].as_ptr(), (addr + off) as *mut u8, n) };
        done += n;
        off = 0;
    }
    true
}

fn sgl_ranges(sgl: &SgeList) -> ([(usize, usize); MAX_SGE], usize) {
    let mut out = [(0usize, 0usize); MAX_SGE];
    let mut n = 0;
    for s in sgl.iter() {
        out[n] = (s.addr() as usize, s.len as usize);
        n += 1;
    }
    (out, n)
}

/// What a received request packet is, for the responder.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ReqClass {
    Send,
    Write,
    Read,
}

fn classify(op: Opcode) -> Option<ReqClass> {
    use Opcode::*;
    Some(match op {
        RcSendFirst | RcSendMiddle | RcSendLast | RcSendLastImm | RcSendOnly | RcSendOnlyImm
        | RcSendLastInv | RcSendOnlyInv => ReqClass::Send,
        RcWriteFirst | RcWriteMiddle | RcWriteLast | RcWriteLastImm | RcWriteOnly
        | RcWriteOnlyImm => ReqClass::Write,
        RcReadRequest => ReqClass::Read,
        _ => return None,
    })
}

impl RcQp {
    pub fn new(
        caps: QpCaps,
        pd: Arc<PdInner>,
        send_cq: usize,
        recv_cq: usize,
        mtu: Mtu,
        timers: Timers,
        initial_psn: Psn,
    ) -> RcQp {
        RcQp {
            qpn: 0,
            state: QpState::Init,
            peer_disconnected: false,
            caps,
            pd,
            send_cq,
            recv_cq,
            announce: None,
            announced: [false; 2],
            ticking: false,
            mtu,
            buffers: SocketBuffers::UNLIMITED,
            probe_at: None,
            probes_in_row: 0,
            recovery: Recovery::default(),
            window: WINDOW,
            read_burst: READ_BURST,
            timers,
            peer: None,
            peer_src_port: None,
            conn: None,
            dreq_due: false,
            awaiting_rtu: false,
            faults: Faults::default(),
            sq: VecDeque::with_capacity(caps.max_send_wr as usize),
            send_done: VecDeque::with_capacity(caps.max_send_wr as usize),
            // Set by `bind` from the peer's announcement.
            next_psn: Psn::default(),
            sent_end: Psn::default(),
            una: Psn::default(),
            sq_next: 0,
            retry_left: timers.retry_count,
            rnr_left: caps.rnr_retry,
            timer: None,
            rnr_until: None,
            reread_at: None,
            rq: VecDeque::with_capacity(caps.max_recv_wr as usize),
            srq: None,
            recv_done: VecDeque::with_capacity(caps.max_recv_wr as usize),
            // What we announce in our REQ or REP: the peer sends from it.
            epsn: initial_psn,
            msn: 0,
            nak_sent: false,
            ack_due: false,
            ack_fresh: false,
            packets_out: 0,
            cur: Cur::Idle,
            read_jobs: VecDeque::with_capacity(MAX_RD as usize),
            read_res: VecDeque::with_capacity(MAX_RD as usize),
            max_rd: MAX_RD,
            keys: vec![None; KEY_SLOTS],
            slots: KeySlots::new(),
        }
    }

    /// Applies the path MTU and timers of the URL `connect` was given.
    pub fn configure(&mut self, mtu: Mtu, timers: Timers) {
        self.mtu = mtu;
        self.timers = timers;
        self.retry_left = timers.retry_count;
    }

    /// The PSN we expect to receive first, drawn at creation: the Starting
    /// PSN of our REQ or REP. In the IB CM (IBA 12.7, and Linux
    /// `drivers/infiniband/core/cm.c`, which rdma_cm and so every kernel
    /// and rdma-core peer uses) the Starting PSN a side announces is the
    /// one *it receives from*: the peer sets its send PSN to it. Only
    /// meaningful before [`bind`](Self::bind).
    pub fn initial_psn(&self) -> Psn {
        self.epsn
    }

    /// Connects the transport: we send from `peer_psn` (the Starting PSN
    /// the peer announced, the first it expects), and expect the peer's
    /// first packet at our own announced [`initial_psn`](Self::initial_psn).
    /// `peer_rd` is the peer's responder resources (how many of our RDMA
    /// Reads it can hold).
    pub fn bind(&mut self, peer: PeerPath, peer_psn: Psn, conn: ConnRef, mtu: Mtu, peer_rd: u8) {
        self.max_rd = u32::from(peer_rd).clamp(1, MAX_RD);
        self.peer = Some(peer);
        self.conn = Some(conn);
        self.mtu = mtu;
        self.window = self.buffers.fit(mtu, WINDOW as u32) as i32;
        self.read_burst = self.buffers.fit(mtu, READ_BURST);
        self.next_psn = peer_psn;
        self.una = peer_psn;
        self.sent_end = peer_psn;
        self.state = QpState::Rts;
    }

    /// Puts this queue pair on CQ `cq`'s ready list, once: a queue pair is
    /// on a list at most once, so a list never holds more entries than
    /// queue pairs (it was sized for them at attach, no allocation here).
    fn announce_on(&mut self, cq: usize) {
        let Some(a) = &self.announce else { return };
        let (list, flag) = if cq == self.send_cq {
            (&a.send, &mut self.announced[0])
        } else {
            (&a.recv, &mut self.announced[1])
        };
        if !*flag {
            *flag = true;
            list.push(Ready {
                shard: a.shard,
                qpn: self.qpn,
            });
        }
    }

    /// CQ `cq` has taken every completion of this queue pair it holds:
    /// the next one announces it again.
    pub fn drained_on(&mut self, cq: usize) {
        if cq == self.send_cq {
            self.announced[0] = false;
        }
        if cq == self.recv_cq && cq != self.send_cq {
            self.announced[1] = false;
        }
    }

    /// Whether a receive is there for a message that starts now: our own
    /// oldest, or one taken from the shared receive queue.
    fn recv_ready(&mut self) -> bool {
        if self.rq.is_empty() {
            if let Some(wr) = self.srq.as_ref().and_then(|s| s.take()) {
                self.rq.push_back(wr);
            }
        }
        !self.rq.is_empty()
    }

    /// Error state: the head send completes with `head` (if given),
    /// everything else flushes ([`SoftQp::flush_queues`]; in `Error`
    /// already, what was queued since, e.g. pre-posted receives);
    /// `tell_peer` asks the CM for a DREQ. The transport forgets its
    /// requests, read responses and keys.
    pub fn enter_error(&mut self, head: Option<WcStatus>, tell_peer: bool) {
        if self.state != QpState::Error && tell_peer && self.conn.is_some() {
            self.dreq_due = true;
        }
        self.flush_queues(head);
        self.read_jobs.clear();
        self.read_res.clear();
        self.sq_next = 0;
        self.timer = None;
        for k in self.keys.iter_mut() {
            *k = None;
        }
        self.slots.invalidate_all();
    }

    // ------------------------------------------------------------------
    // Posting

    pub fn post_send(&mut self, wr: SendWr) -> Result<(), PostFailed<SendWr>> {
        let invalid = (wr.inline && wr.sgl.total_len() > self.caps.max_inline as u64)
            || (wr.op.is_key_op() && !wr.sgl.is_empty())
            || !wr.sgl.iter().all(Sge::in_bounds)
            || matches!(wr.op, SendOp::Bind(b) if !self.slots.is_window(b.window));
        let outstanding = self.sq.len() + self.send_done.len();
        let wr = check_post(wr, invalid, outstanding, self.caps.max_send_wr)?;
        let Some(wr) = self.admit_send(wr) else {
            return Ok(());
        };
        let need = if matches!(wr.op, SendOp::Read(_)) {
            Access::LOCAL_WRITE
        } else {
            Access::NONE
        };
        let mut local_err = None;
        // Whether no peer may write the payload's memory (then its packets
        // leave straight from it, `emit_data`).
        let mut private = true;
        for s in wr.sgl.iter() {
            match self.pd.check_local_source(s, need) {
                Some(peer_may_write) => private &= !peer_may_write,
                None => local_err = Some(WcStatus::LocProtErr),
            }
        }
        let total64 = wr.sgl.total_len();
        if total64 > (1 << 31) {
            local_err = Some(WcStatus::LocLenErr);
        }
        let total = total64.min(u32::MAX as u64) as u32;
        let (kind, remote) = match wr.op {
            SendOp::Send => (Kind::Msg(MessageKind::Send), RemoteAddr::default()),
            SendOp::SendWithImm(_) => (Kind::Msg(MessageKind::SendImm), RemoteAddr::default()),
            SendOp::SendWithInv(_) => (Kind::Msg(MessageKind::SendInv), RemoteAddr::default()),
            SendOp::Write(ra) => (Kind::Msg(MessageKind::Write), ra),
            SendOp::WriteWithImm(ra, _) => (Kind::Msg(MessageKind::WriteImm), ra),
            SendOp::Read(ra) => (Kind::Read, ra),
            SendOp::LocalInv(_) | SendOp::Bind(_) => (Kind::Local, RemoteAddr::default()),
        };
        let npkts = match kind {
            Kind::Local => 0,
            _ if local_err.is_some() => 0,
            _ => seg::packet_count(total, self.mtu),
        };
        let (ranges, nr) = sgl_ranges(&wr.sgl);
        let first = self.next_psn;
        self.next_psn = first.add(npkts);
        self.sq.push_back(SqEntry {
            wr,
            kind,
            remote,
            first,
            npkts,
            sent: 0,
            total,
            ranges,
            nr,
            private,
            done: false,
            got: 0,
            local_err,
        });
        Ok(())
    }

    pub fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostFailed<RecvWr>> {
        // On a shared receive queue its receives come from that queue.
        let invalid = self.srq.is_some() || !wr.sgl.iter().all(Sge::in_bounds);
        let outstanding = self.rq.len() + self.recv_done.len();
        let wr = check_post(wr, invalid, outstanding, self.caps.max_recv_wr)?;
        if let Some(wr) = self.admit_recv(wr) {
            self.rq.push_back(wr);
        }
        Ok(())
    }

    /// Grants the peer access to a registration; returns its rkey.
    pub fn expose(
        &mut self,
        addr: u64,
        len: u64,
        access: Access,
        arena: &Arc<Arena>,
    ) -> Result<RemoteKey, VerbsError> {
        if self.state == QpState::Error {
            return Err(VerbsError::NotConnected);
        }
        let rkey = self.slots.expose(super::random::random_u32)?;
        self.keys[KeySlots::slot(rkey)] = Some(KeyEntry {
            rkey,
            addr,
            len,
            access,
            _arena: arena.clone(),
        });
        Ok(RemoteKey { addr, rkey, len })
    }

    /// Reserves a key slot as a memory window.
    pub fn alloc_window(&mut self) -> Result<Window, VerbsError> {
        if self.state == QpState::Error {
            return Err(VerbsError::NotConnected);
        }
        self.slots.alloc_window()
    }

    /// Invalidates an exposure or a window's binding.
    fn invalidate(&mut self, rkey: u32) -> bool {
        if !self.slots.invalidate(rkey) {
            return false;
        }
        self.keys[KeySlots::slot(rkey)] = None;
        // Reads done under this key must not be replayed to a duplicate
        // request any more (IBTA 9.7.5.1.2 replays only what the key
        // still grants).
        self.read_res.retain(|r| r.rkey != rkey);
        true
    }

    /// Executes a window bind (in send-queue order): checks it and fills
    /// the slot's entry.
    fn bind_window(&mut self, b: &BindWindow) -> bool {
        let Some(mr) = self.slots.bind(b, &self.pd.mrs) else {
            return false;
        };
        self.keys[KeySlots::slot(b.rkey)] = Some(KeyEntry {
            rkey: b.rkey,
            addr: b.addr,
            len: b.len,
            access: b.access,
            _arena: mr.arena,
        });
        true
    }

    /// Validates a peer access of `len` bytes at `va` with `rkey`.
    fn check_remote(
        &self,
        va: u64,
        rkey: u32,
        len: u32,
        need: Access,
    ) -> Option<(usize, Arc<Arena>)> {
        let k = self.keys.get(KeySlots::slot(rkey))?.as_ref()?;
        if k.rkey != rkey || !k.access.contains(need) {
            return None;
        }
        let off = va.checked_sub(k.addr)?;
        if off.checked_add(len as u64)? > k.len {
            return None;
        }
        Some((va as usize, k._arena.clone()))
    }

    // ------------------------------------------------------------------
    // Output: requests, read responses, ACKs, timers

    /// Runs timers and emits whatever the window allows.
    /// Whether [`tick`](Self::tick) has anything to do now or later: a
    /// timer, an ACK owed, Read responses or requests to send, work
    /// posted and not yet acknowledged. An idle queue pair needs no tick
    /// until a packet, a post or the connection manager touches it.
    pub fn needs_tick(&self) -> bool {
        self.timer.is_some()
            || self.rnr_until.is_some()
            || self.ack_due
            || !self.read_jobs.is_empty()
            || !self.sq.is_empty()
    }

    /// The silence after which the tail is probed: [`QUIET_PROBE`], or a
    /// quarter of a shorter ACK timeout.
    fn quiet(&self) -> Duration {
        QUIET_PROBE.min(self.timers.ack_timeout / 4)
    }

    pub fn tick(&mut self, now: Instant, tx: &mut Tx, hold_ack: bool) {
        if self.state != QpState::Rts {
            return;
        }
        let Some(peer) = self.peer else {
            return;
        };
        // Retransmission timer (IBTA 9.7.6.1.3: go back to the oldest
        // unacknowledged PSN; RetryExcErr when the budget is spent).
        if let Some(t) = self.timer {
            if now >= t {
                if self.retry_left == 0 {
                    self.enter_error(Some(WcStatus::RetryExcErr), true);
                    return;
                }
                self.retry_left -= 1;
                self.recovery.timeouts += 1;
                let una = self.una;
                self.go_back(una);
                self.timer = None;
                self.probe_at = None;
            }
        }
        if let Some(t) = self.probe_at {
            if self.timer.is_none() {
                self.probe_at = None;
            } else if now >= t && self.sent_end.distance(self.una) > 0 {
                // Silence since the last packet or progress: send the
                // last packet sent again (see QUIET_PROBE).
                self.recovery.tail_probes += 1;
                self.probes_in_row += 1;
                let last = self.sent_end.sub(1);
                self.go_back(last);
                self.probe_at = (self.probes_in_row < MAX_PROBES)
                    .then(|| now + self.quiet() * (1 << self.probes_in_row));
            }
        }
        // Coalesced ACK (IBTA 9.7.5.1.1 lets a responder acknowledge
        // several packets with one). Marked by this step's packets, it is
        // held to the end of the caller's next step when a thread polls:
        // that step is usually the application's post of its answer (a
        // reply Send). The device's thread (`hold_ack` false) never holds
        // one: nobody may drive the shard again soon.
        //
        // Our own requests (the answer) leave first and the ACK right
        // behind them, in the same `sendmmsg`: the answer is what the
        // peer waits for, and toward a GSO device the shorter ACK ends
        // the answer's run, so both travel as one datagram (`Tx`). The
        // requests are in our send queue's PSN space and the ACK in the
        // peer's, so neither orders the other (only a responder's own
        // responses, ACKs and read responses, are ordered by PSN); the
        // peer's Send completes when the ACK arrives, and an RPC requester
        // frees its call slot only then (docs/ENGINE.md, `Draining`), so
        // an answer seen first costs nothing but that wait.
        let hold = hold_ack && self.ack_fresh;
        self.ack_fresh = false;
        let out_before = self.packets_out;
        self.emit_requests(now, tx, peer);
        if !hold || self.packets_out != out_before {
            self.send_owed_ack(tx, peer);
        }
        self.emit_read_responses(tx, peer);
    }

    /// Sends the ACK this QP holds for its next step, if any, now: a
    /// local disconnect ends the QP before that step, and a peer that
    /// gets our DREQ with its last Send unacknowledged flushes that Send
    /// (`WrFlushErr`) although we received it.
    pub fn send_held_ack(&mut self, tx: &mut Tx) {
        if self.state != QpState::Rts {
            return;
        }
        if let Some(peer) = self.peer {
            self.send_owed_ack(tx, peer);
        }
    }

    /// Sends the coalesced ACK owed, if any.
    fn send_owed_ack(&mut self, tx: &mut Tx, peer: PeerPath) {
        if self.ack_due {
            self.ack_due = false;
            self.send_ack(tx, peer, Syndrome::ACK, self.epsn.sub(1));
        }
    }

    fn send_ack(&mut self, tx: &mut Tx, peer: PeerPath, syn: Syndrome, psn: Psn) {
        let mut p = RocePacket::new(Bth::new(Opcode::RcAcknowledge, peer.qpn, psn), &[]);
        p.aeth = Some(Aeth {
            syndrome: syn,
            msn: self.msn & 0xFF_FFFF,
        });
        let slot = tx.slot();
        if let Ok(n) = p.emit(slot) {
            tx.commit(n, peer.addr, Some(&mut self.faults));
        }
    }

    fn emit_read_responses(&mut self, tx: &mut Tx, peer: PeerPath) {
        if !self.read_jobs.is_empty() {
            // Responses are ordered by PSN: the ACK of the requests
            // before the Read leaves before the Read's responses.
            self.send_owed_ack(tx, peer);
        }
        let mut budget = self.read_burst;
        while budget > 0 {
            let Some(job) = self.read_jobs.front_mut() else {
                return;
            };
            while job.sent < job.npkts && budget > 0 {
                let i = job.sent;
                let off = i * self.mtu.bytes();
                let len = seg::payload_len(job.len, self.mtu, i).unwrap_or(0) as usize;
                let Some(op) = seg::opcode(MessageKind::ReadResponse, i, job.npkts) else {
                    break;
                };
                let mut p = RocePacket::new(Bth::new(op, peer.qpn, job.psn.add(i)), &ZEROS[..len]);
                if op.headers().aeth {
                    p.aeth = Some(Aeth {
                        syndrome: Syndrome::ACK,
                        msn: self.msn & 0xFF_FFFF,
                    });
                }
                let at = p.payload_offset();
                let slot = tx.slot();
                // The payload is copied in below, once (see `emit_data`).
                if let Ok(n) = p.emit_around_payload(slot) {
                    // A zero-length read (address 0, nothing validated)
                    // copies nothing.
                    if len > 0 {
                        // SAFETY: the range was validated against a live
                        // key whose arena the job keeps mapped.
                        unsafe {
                            std::ptr::copy(
                                (job.addr + off as usize) as *const u8,
                                slot[at..].as_mut_ptr(),
                                len,
                            )
                        }
                    }
                    tx.commit(n, peer.addr, Some(&mut self.faults));
                }
                job.sent += 1;
                budget -= 1;
            }
            if job.sent >= job.npkts {
                self.read_jobs.pop_front();
            }
        }
    }

    fn emit_requests(&mut self, now: Instant, tx: &mut Tx, peer: PeerPath) {
        if let Some(t) = self.rnr_until {
            if now < t {
                return;
            }
            self.rnr_until = None;
        }
        let mut reads_out = self
            .sq
            .iter()
            .take(self.sq_next)
            .filter(|e| e.kind == Kind::Read && !e.done)
            .count() as u32;
        while self.sq_next < self.sq.len() {
            let idx = self.sq_next;
            if let Some(st) = self.sq[idx].local_err {
                if idx == 0 {
                    self.enter_error(Some(st), true);
                }
                return;
            }
            match self.sq[idx].kind {
                Kind::Local => {
                    let err = match self.sq[idx].wr.op {
                        SendOp::LocalInv(rkey) => {
                            (!self.invalidate(rkey)).then_some(WcStatus::LocProtErr)
                        }
                        SendOp::Bind(b) => (!self.bind_window(&b)).then_some(WcStatus::MwBindErr),
                        _ => unreachable!("local entry"),
                    };
                    if err.is_some() {
                        self.sq[idx].local_err = err;
                        continue;
                    }
                    self.sq[idx].done = true;
                    self.sq_next += 1;
                    continue;
                }
                Kind::Read => {
                    if self.sq[idx].first.distance(self.una) >= self.window
                        || reads_out >= self.max_rd
                    {
                        break;
                    }
                    self.emit_read_request(tx, peer, idx);
                    let e = &mut self.sq[idx];
                    e.sent = e.npkts;
                    reads_out += 1;
                    self.sq_next += 1;
                }
                Kind::Msg(kind) => {
                    let e = &self.sq[idx];
                    let psn = e.first.add(e.sent);
                    if psn.distance(self.una) >= self.window {
                        break;
                    }
                    self.emit_data(tx, peer, idx, kind);
                    let e = &mut self.sq[idx];
                    e.sent += 1;
                    if e.sent >= e.npkts {
                        self.sq_next += 1;
                    }
                }
            }
            if self.timer.is_none() {
                self.timer = Some(now + self.timers.ack_timeout);
            }
            if self.probe_at.is_none() && self.probes_in_row == 0 {
                self.probe_at = Some(now + self.quiet());
            }
        }
        self.complete_head();
    }

    fn emit_read_request(&mut self, tx: &mut Tx, peer: PeerPath, idx: usize) {
        self.packets_out += 1;
        let e = &self.sq[idx];
        let done_bytes = e.got * self.mtu.bytes();
        let mut bth = Bth::new(Opcode::RcReadRequest, peer.qpn, e.first.add(e.got));
        bth.ack_req = true;
        let mut p = RocePacket::new(bth, &[]);
        p.reth = Some(Reth {
            va: e.remote.addr.wrapping_add(done_bytes as u64),
            rkey: e.remote.rkey,
            dma_len: e.total.saturating_sub(done_bytes),
        });
        let end = e.last().next();
        let slot = tx.slot();
        if let Ok(n) = p.emit(slot) {
            tx.commit(n, peer.addr, Some(&mut self.faults));
        }
        self.note_sent(end);
    }

    /// Records that every PSN before `end` has been transmitted.
    fn note_sent(&mut self, end: Psn) {
        if end.distance(self.sent_end) > 0 {
            self.sent_end = end;
        }
    }

    /// Whether an ACK/NAK PSN lies in [una, sent_end): acknowledged
    /// nothing stale and nothing we have not sent.
    fn in_ack_window(&self, psn: Psn) -> bool {
        psn.distance(self.una) >= 0 && self.sent_end.distance(psn) > 0
    }

    fn emit_data(&mut self, tx: &mut Tx, peer: PeerPath, idx: usize, kind: MessageKind) {
        self.packets_out += 1;
        let mtu = self.mtu;
        let e = &self.sq[idx];
        let i = e.sent;
        let Some(op) = seg::opcode(kind, i, e.npkts) else {
            return;
        };
        let len = seg::payload_len(e.total, mtu, i).unwrap_or(0) as usize;
        let psn = e.first.add(i);
        let mut bth = Bth::new(op, peer.qpn, psn);
        let last = i + 1 == e.npkts;
        bth.ack_req = last || psn.value() % ACKREQ_EVERY == 0;
        let mut p = RocePacket::new(bth, &ZEROS[..len]);
        let h = op.headers();
        if h.reth {
            p.reth = Some(Reth {
                va: e.remote.addr,
                rkey: e.remote.rkey,
                dma_len: e.total,
            });
        }
        if h.immdt {
            p.immdt = match e.wr.op {
                SendOp::SendWithImm(v) | SendOp::WriteWithImm(_, v) => Some(v),
                _ => Some(0),
            };
        }
        if h.ieth {
            p.ieth = match e.wr.op {
                SendOp::SendWithInv(k) => Some(k),
                _ => Some(0),
            };
        }
        let at = p.payload_offset();
        let ranges = e.ranges;
        let nr = e.nr;
        let off = (i * mtu.bytes()) as usize;
        // A payload in memory no peer may write, of whole words (no pad)
        // and in one range, is not copied: the kernel gathers it from the
        // registered memory (`Tx::commit_external`). Not under injected
        // faults, which duplicate and reorder slots.
        let external =
            (e.private && len >= EXTERNAL_MIN && len % 4 == 0 && !self.faults.policy.is_active())
                .then(|| within_one_range(&ranges[..nr], off, len))
                .flatten();
        self.note_sent(psn.next());
        let Ok(n) = p.emit_around_payload(tx.slot()) else {
            return;
        };
        if let Some(addr) = external {
            // Headers in the slot, the payload left where it lies; its
            // ICRC is sealed with the batch.
            // SAFETY: `e.private`: no peer may write the memory; the
            // ranges were validated at post time and belong to this queued
            // work request, whose completion (whatever makes it in this
            // step) is seen only by a poll, which takes the shard's lock
            // after this step has flushed the batch.
            if unsafe { tx.commit_external(at, addr, len, peer.addr) } {
                return;
            }
        }
        // The payload goes straight from the registered memory into the
        // slot (`p` carried zeros only for its length): the same slot, as
        // nothing was queued since.
        let slot = tx.slot();
        // SAFETY: ranges were validated against live registrations at post
        // time; the buffers are owned by the queued work request.
        unsafe { gather(&ranges[..nr], off, &mut slot[at..at + len]) };
        tx.commit(n, peer.addr, Some(&mut self.faults));
    }

    /// Rewinds transmission to `psn` (go-back-N).
    fn go_back(&mut self, psn: Psn) {
        let mut first_unsent = None;
        for (i, e) in self.sq.iter_mut().enumerate() {
            if e.done || e.npkts == 0 && e.kind != Kind::Local {
                continue;
            }
            match e.kind {
                Kind::Local => {}
                Kind::Read => {
                    if e.last().distance(psn) >= 0 {
                        e.sent = 0;
                        first_unsent.get_or_insert(i);
                    }
                }
                Kind::Msg(_) => {
                    if e.last().distance(psn) >= 0 {
                        let from = psn.distance(e.first).max(0) as u32;
                        e.sent = e.sent.min(from);
                        first_unsent.get_or_insert(i);
                    }
                }
            }
        }
        if let Some(i) = first_unsent {
            self.sq_next = self.sq_next.min(i);
        }
        self.reread_at = None;
    }

    /// Pops completed work requests from the head, in order.
    fn complete_head(&mut self) {
        while let Some(e) = self.sq.front() {
            if !e.done {
                break;
            }
            let e = self.sq.pop_front().expect("front exists");
            self.sq_next = self.sq_next.saturating_sub(1);
            let len = if e.kind == Kind::Local { 0 } else { e.total };
            let mut wr = e.wr;
            if e.kind == Kind::Read {
                set_placed(&mut wr.sgl, e.total as u64);
            }
            self.complete_send(wr, WcStatus::Success, len);
        }
        if self.sq.iter().all(|e| e.done || e.sent == 0) {
            self.timer = None;
        }
    }

    // ------------------------------------------------------------------
    // Input

    /// Handles one transport packet addressed to this QP.
    pub fn on_packet(&mut self, p: &RocePacket<'_>, now: Instant, tx: &mut Tx) {
        if self.state != QpState::Rts {
            return;
        }
        let Some(peer) = self.peer else {
            return;
        };
        match p.bth.opcode {
            Opcode::RcAcknowledge => self.on_ack(p, now, tx, peer),
            Opcode::RcReadResponseFirst
            | Opcode::RcReadResponseMiddle
            | Opcode::RcReadResponseLast
            | Opcode::RcReadResponseOnly => self.on_read_response(p, now, tx, peer),
            op => {
                if let Some(c) = classify(op) {
                    self.on_request(p, c, tx, peer)
                }
            }
        }
    }

    /// Cumulative acknowledgement of every PSN up to and including `psn`.
    fn ack_through(&mut self, psn: Psn, now: Instant) -> bool {
        // Ignore stale ACKs and ACKs for PSNs never sent.
        if !self.in_ack_window(psn) {
            return false;
        }
        let mut implicit_nak = None;
        for e in self.sq.iter_mut() {
            if e.done || e.npkts == 0 {
                continue;
            }
            if e.last().distance(psn) > 0 {
                break;
            }
            match e.kind {
                Kind::Msg(_) => e.done = true,
                Kind::Read => {
                    // An ACK past a read whose responses we lack: they were
                    // lost (responses precede later ACKs); re-request.
                    implicit_nak.get_or_insert(e.first.add(e.got));
                    break;
                }
                Kind::Local => {}
            }
        }
        let new_una = match implicit_nak {
            Some(p) => p,
            None => psn.next(),
        };
        if new_una.distance(self.una) > 0 {
            self.una = new_una;
            self.retry_left = self.timers.retry_count;
            self.timer = Some(now + self.timers.ack_timeout);
            self.probe_at = Some(now + self.quiet());
            self.probes_in_row = 0;
        }
        if let Some(p) = implicit_nak {
            if self.reread_at != Some(p) {
                self.go_back(p);
                self.reread_at = Some(p);
            }
        }
        self.complete_head();
        true
    }

    fn on_ack(&mut self, p: &RocePacket<'_>, now: Instant, tx: &mut Tx, peer: PeerPath) {
        let Some(aeth) = p.aeth else {
            return;
        };
        let psn = p.bth.psn;
        match aeth.syndrome {
            Syndrome::Ack { .. } => {
                self.ack_through(psn, now);
                self.rnr_left = self.caps.rnr_retry;
            }
            Syndrome::RnrNak { timer } => {
                if !self.in_ack_window(psn) {
                    return;
                }
                self.ack_through(psn.sub(1), now);
                if self.caps.rnr_retry < 7 {
                    if self.rnr_left == 0 {
                        self.enter_error(Some(WcStatus::RnrRetryExcErr), true);
                        return;
                    }
                    self.rnr_left -= 1;
                }
                self.go_back(psn);
                self.rnr_until = Some(
                    now + Duration::from_micros(crate::wire::roce::rnr_timer_usec(timer) as u64),
                );
                self.timer = None;
            }
            Syndrome::Nak(code) => {
                if !self.in_ack_window(psn) {
                    return;
                }
                self.ack_through(psn.sub(1), now);
                match code {
                    NakCode::PsnSequenceError => {
                        self.recovery.sequence_naks += 1;
                        self.go_back(psn);
                        self.emit_requests(now, tx, peer);
                    }
                    NakCode::RemoteAccessError => {
                        self.enter_error(Some(WcStatus::RemAccessErr), true)
                    }
                    _ => self.enter_error(Some(WcStatus::RemInvReqErr), true),
                }
            }
        }
    }

    fn on_read_response(&mut self, p: &RocePacket<'_>, now: Instant, tx: &mut Tx, peer: PeerPath) {
        let psn = p.bth.psn;
        let mtu = self.mtu.bytes();
        // The oldest read not complete: responses arrive in PSN order.
        let Some(idx) = self
            .sq
            .iter()
            .position(|e| e.kind == Kind::Read && !e.done && e.sent > 0)
        else {
            return;
        };
        let e = &mut self.sq[idx];
        let expected = e.first.add(e.got);
        let d = psn.distance(expected);
        if d < 0 {
            return; // duplicate
        }
        if d > 0 {
            if psn.distance(e.first) < e.npkts as i32 && self.reread_at != Some(expected) {
                // Gap: re-request the rest of the read (rxe req_retry).
                self.reread_at = Some(expected);
                self.go_back(expected);
                self.reread_at = Some(expected);
                self.emit_requests(now, tx, peer);
            }
            return;
        }
        let i = e.got;
        let want = seg::payload_len(e.total, self.mtu, i).unwrap_or(0) as usize;
        let pos = p.bth.opcode.position();
        let last = i + 1 == e.npkts;
        // A re-requested read restarts with FIRST (or ONLY) mid-message.
        let pos_ok = match pos {
            Position::Only => last,
            Position::First => !last,
            Position::Middle => i > 0 && !last,
            Position::Last => i > 0 && last,
        };
        if !pos_ok || p.payload.len() != want {
            // Malformed response sequence: class B error.
            self.enter_error(Some(WcStatus::RemInvReqErr), true);
            return;
        }
        // SAFETY: ranges validated (LOCAL_WRITE) at post; the buffers are
        // owned by the queued work request.
        let ok = unsafe { scatter(&e.ranges[..e.nr], (i * mtu) as usize, p.payload) };
        if !ok {
            self.enter_error(Some(WcStatus::LocLenErr), true);
            return;
        }
        e.got += 1;
        if e.got == e.npkts {
            e.done = true;
        }
        // A read response acknowledges every earlier PSN (IBTA 9.7.5.1.4).
        self.ack_through(psn, now);
        self.complete_head();
    }

    fn nak(&mut self, tx: &mut Tx, peer: PeerPath, code: NakCode) {
        let psn = self.epsn;
        self.send_ack(tx, peer, Syndrome::Nak(code), psn);
    }

    fn responder_error(&mut self, tx: &mut Tx, peer: PeerPath, code: NakCode) {
        self.nak(tx, peer, code);
        self.enter_error(None, true);
    }

    fn on_request(&mut self, p: &RocePacket<'_>, class: ReqClass, tx: &mut Tx, peer: PeerPath) {
        let psn = p.bth.psn;
        let d = psn.distance(self.epsn);
        if d > 0 {
            // Sequence error: NAK once, then drop until the retry arrives.
            if !self.nak_sent {
                self.nak_sent = true;
                self.nak(tx, peer, NakCode::PsnSequenceError);
            }
            return;
        }
        if d < 0 {
            // Duplicate: re-execute reads, re-acknowledge the rest.
            if class == ReqClass::Read {
                self.replay_read(p, tx, peer);
            } else {
                self.ack_due = true;
                self.ack_fresh = true;
            }
            return;
        }
        self.nak_sent = false;
        let op = p.bth.opcode;
        let pos = op.position();
        match class {
            ReqClass::Read => {
                let Some(reth) = p.reth else { return };
                let npkts = seg::packet_count(reth.dma_len, self.mtu);
                let addr = if reth.dma_len == 0 {
                    Some((0usize, None))
                } else {
                    self.check_remote(reth.va, reth.rkey, reth.dma_len, Access::REMOTE_READ)
                        .map(|(a, ar)| (a, Some(ar)))
                };
                let Some((addr, arena)) = addr else {
                    return self.responder_error(tx, peer, NakCode::RemoteAccessError);
                };
                let job = ReadJob {
                    psn,
                    va: reth.va,
                    rkey: reth.rkey,
                    addr,
                    len: reth.dma_len,
                    npkts,
                    sent: 0,
                    _arena: arena,
                };
                // Resources are a ring: a peer exceeding what we announced
                // loses its oldest (as in rxe), it gets no error.
                if self.read_res.len() >= MAX_RD as usize {
                    self.read_res.pop_front();
                }
                if self.read_jobs.len() >= MAX_RD as usize {
                    self.read_jobs.pop_front();
                }
                self.read_res.push_back(job.clone());
                self.read_jobs.push_back(job);
                self.epsn = psn.add(npkts);
                self.msn = self.msn.wrapping_add(1);
                self.emit_read_responses(tx, peer);
            }
            ReqClass::Send => {
                let starts = matches!(pos, Position::First | Position::Only);
                match (&self.cur, starts) {
                    (Cur::Idle, true) => {}
                    _ if !starts && matches!(self.cur, Cur::Send { .. }) => {}
                    _ => return self.responder_error(tx, peer, NakCode::InvalidRequest),
                }
                if starts {
                    if !self.recv_ready() {
                        // Receiver not ready (IBTA 9.7.5.2.8).
                        let code = rnr_code(self.caps.rnr_timer);
                        self.send_ack(tx, peer, Syndrome::RnrNak { timer: code }, psn);
                        return;
                    }
                    self.cur = Cur::Send { placed: 0 };
                }
                let Cur::Send { placed } = self.cur else {
                    return;
                };
                let wr = self.rq.front().expect("receive checked");
                let (ranges, nr) = sgl_ranges(&wr.sgl);
                // SAFETY: receive SGEs were validated at post (LOCAL_WRITE)
                // and are owned by the queued receive.
                let fits = unsafe { scatter(&ranges[..nr], placed as usize, p.payload) };
                if !fits {
                    let wr = self.rq.pop_front().expect("receive checked");
                    self.flush_recv(wr, WcStatus::LocLenErr);
                    self.cur = Cur::Idle;
                    return self.responder_error(tx, peer, NakCode::InvalidRequest);
                }
                let placed = placed + p.payload.len() as u32;
                self.cur = Cur::Send { placed };
                self.epsn = psn.next();
                if matches!(pos, Position::Last | Position::Only) {
                    self.cur = Cur::Idle;
                    self.msn = self.msn.wrapping_add(1);
                    let mut wr = self.rq.pop_front().expect("receive checked");
                    let mut status = WcStatus::Success;
                    let mut inv = None;
                    if let Some(rkey) = p.ieth {
                        if self.invalidate(rkey) {
                            inv = Some(rkey);
                        } else {
                            status = WcStatus::LocProtErr;
                        }
                    }
                    set_placed(&mut wr.sgl, placed as u64);
                    let mut c = recv_completion(wr, self.qpn, status, placed);
                    c.imm = p.immdt;
                    c.invalidated_rkey = inv;
                    self.push_recv_done(c);
                    if status != WcStatus::Success {
                        return self.responder_error(tx, peer, NakCode::InvalidRequest);
                    }
                }
                if p.bth.ack_req {
                    self.ack_due = true;
                    self.ack_fresh = true;
                }
            }
            ReqClass::Write => {
                let starts = matches!(pos, Position::First | Position::Only);
                let ends = matches!(pos, Position::Last | Position::Only);
                match (&self.cur, starts) {
                    (Cur::Idle, true) => {}
                    _ if !starts && matches!(self.cur, Cur::Write { .. }) => {}
                    _ => return self.responder_error(tx, peer, NakCode::InvalidRequest),
                }
                if ends && p.immdt.is_some() && !self.recv_ready() {
                    let code = rnr_code(self.caps.rnr_timer);
                    self.send_ack(tx, peer, Syndrome::RnrNak { timer: code }, psn);
                    return;
                }
                if starts {
                    let Some(reth) = p.reth else { return };
                    let addr = if reth.dma_len == 0 {
                        Some(0usize)
                    } else {
                        self.check_remote(reth.va, reth.rkey, reth.dma_len, Access::REMOTE_WRITE)
                            .map(|(a, _)| a)
                    };
                    let Some(addr) = addr else {
                        return self.responder_error(tx, peer, NakCode::RemoteAccessError);
                    };
                    self.cur = Cur::Write {
                        addr,
                        left: reth.dma_len,
                        imm_len: reth.dma_len,
                    };
                }
                let Cur::Write {
                    addr,
                    left,
                    imm_len,
                } = self.cur
                else {
                    return;
                };
                let n = p.payload.len() as u32;
                if n > left || (ends && n != left) {
                    self.cur = Cur::Idle;
                    return self.responder_error(tx, peer, NakCode::InvalidRequest);
                }
                if n > 0 {
                    // SAFETY: [addr, addr + dma_len) was validated against
                    // a live key (REMOTE_WRITE) at the first packet; the
                    // key's arena keeps it mapped.
                    unsafe { std::ptr::copy(p.payload.as_ptr(), addr as *mut u8, n as usize) };
                }
                self.cur = Cur::Write {
                    addr: addr + n as usize,
                    left: left - n,
                    imm_len,
                };
                self.epsn = psn.next();
                if ends {
                    self.cur = Cur::Idle;
                    self.msn = self.msn.wrapping_add(1);
                    if let Some(imm) = p.immdt {
                        let mut wr = self.rq.pop_front().expect("receive checked");
                        set_placed(&mut wr.sgl, 0);
                        let mut c = recv_completion(wr, self.qpn, WcStatus::Success, imm_len);
                        c.opcode = WcOpcode::RecvRdmaWithImm;
                        c.imm = Some(imm);
                        self.push_recv_done(c);
                    }
                }
                if p.bth.ack_req {
                    self.ack_due = true;
                    self.ack_fresh = true;
                }
            }
        }
    }

    /// A duplicate RDMA Read request: replay the responses of the read it
    /// belongs to from its PSN (IBTA 9.7.5.1.2; rxe `duplicate_request`:
    /// same rkey, range within the original, FIRST only when replaying
    /// from the start, MIDDLE/LAST otherwise). Unknown ones are dropped.
    fn replay_read(&mut self, p: &RocePacket<'_>, tx: &mut Tx, peer: PeerPath) {
        // Responses are ordered by PSN (see `emit_read_responses`).
        self.send_owed_ack(tx, peer);
        let Some(reth) = p.reth else { return };
        let psn = p.bth.psn;
        let mtu = self.mtu.bytes() as u64;
        let found = self.read_res.iter().rev().find(|r| {
            let idx = psn.distance(r.psn);
            idx >= 0
                && (idx as u32) < r.npkts
                && r.rkey == reth.rkey
                && reth.va == r.va.wrapping_add(idx as u64 * mtu)
                && reth.va.wrapping_add(reth.dma_len as u64) == r.va.wrapping_add(r.len as u64)
        });
        let Some(r) = found else {
            return;
        };
        // Re-check the key: it may have been invalidated (or the slot
        // reused) since the original read.
        if self
            .check_remote(reth.va, reth.rkey, reth.dma_len, Access::REMOTE_READ)
            .is_none()
            && reth.dma_len > 0
        {
            return;
        }
        let idx = psn.distance(r.psn) as u32;
        if let Some(j) = self.read_jobs.iter_mut().find(|j| j.psn == r.psn) {
            j.sent = j.sent.min(idx);
        } else {
            let mut job = r.clone();
            job.sent = idx;
            if self.read_jobs.len() >= MAX_RD as usize {
                self.read_jobs.pop_front();
            }
            self.read_jobs.push_back(job);
        }
        self.emit_read_responses(tx, peer);
    }
}

impl SoftQp for RcQp {
    fn qpn(&self) -> u32 {
        self.qpn
    }

    fn qp_state(&mut self) -> &mut QpState {
        &mut self.state
    }

    fn mrs(&self) -> &MrTable {
        &self.pd.mrs
    }

    fn pop_send(&mut self) -> Option<SendWr> {
        self.sq.pop_front().map(|e| e.wr)
    }

    fn pop_recv(&mut self) -> Option<RecvWr> {
        self.rq.pop_front()
    }

    /// Queues a send-side completion, announcing the queue pair on its
    /// send CQ unless it is already on that CQ's list (ready.rs).
    fn push_send_done(&mut self, c: Completion) {
        self.send_done.push_back(c);
        self.announce_on(self.send_cq);
    }

    fn push_recv_done(&mut self, c: Completion) {
        self.recv_done.push_back(c);
        self.announce_on(self.recv_cq);
    }

    fn on_srq(&self) -> bool {
        self.srq.is_some()
    }

    /// The shared receive taken for a message that will not complete
    /// here goes back to the shared receive queue for the others.
    fn release_shared(&mut self, wr: RecvWr) {
        if let Some(srq) = &self.srq {
            srq.give_back(wr);
        }
    }

    /// A local error: the peer is told (DREQ).
    fn fail(&mut self) {
        self.enter_error(None, true);
    }
}
