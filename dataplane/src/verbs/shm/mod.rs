//! `shm`: same-host RDMA between processes (or threads) over shared memory.
//!
//! * Setup runs over a `SOCK_SEQPACKET` Unix socket (`shm:///path.sock`):
//!   the connector sends HELLO (ring sizes, private data, its outbox memfd),
//!   the listener checks the peer's uid (SO_PEERCRED) against an allow-list
//!   and answers ACCEPT (same fields) or REJECT (private data). Later, the
//!   socket carries only REGION messages (a memfd, passed once per arena
//!   and protection) and hang-up detection.
//! * The data path is shared memory only: each side publishes descriptors,
//!   posted receives and its rkey table in its own outbox (see
//!   [`shared`]), which the peer can map only read-only (the memfd is
//!   sealed `F_SEAL_FUTURE_WRITE` after our own mapping exists). RDMA Write and Read are
//!   one-sided copies by the initiator into or out of the peer's mapped
//!   memory, after validating rkey, bounds and access. A Send is one copy
//!   into the peer's next posted receive buffer, then a descriptor publish
//!   (release store), which also makes earlier Writes visible to the
//!   receiver (acquire load).
//! * Work executes when posted and whenever a CQ bound to the QP is polled
//!   (the software "HCA" runs on the caller's thread); no syscall per work
//!   request in steady state (the socket is polled for hang-up every
//!   [`SOCKET_CHECK_EVERY`] progress calls).
//!
//! # Hostile peers
//! Everything the peer controls — setup messages, its outbox (descriptors,
//! posted receives, key table), the memfds it hands us — is validated
//! before use: ring indices and counts are bounded, region ids and offsets
//! are range-checked against our own mapping lengths (from `fstat` on a
//! size-sealed memfd), writes go only to mappings we created writable. A
//! peer that breaks the rules moves its own connection to the error state;
//! it cannot make this process panic or touch memory outside what it
//! shared with us. Memory we expose read-only (REMOTE_READ regions, our
//! outbox) is sealed against writes through any descriptor
//! ([`Arena::share_read_only`]); an arena's role toward peers (writable or
//! read-only) is fixed by its first exposure. What a peer cannot be
//! prevented from doing is writing garbage into memory we exposed writable
//! to it (receive buffers, REMOTE_WRITE regions): consumers treat those
//! bytes as untrusted input; nor punching holes in it (a SIGBUS risk on
//! hugetlbfs, see "Known gaps" in docs/VERBS.md).
use std::collections::VecDeque;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::socket::{
    accept4, bind, connect, getsockopt, listen, socket, sockopt::PeerCredentials, AddressFamily,
    Backlog, SockFlag, SockType, UnixAddr,
};

use self::shared::*;
use super::soft_mr::{KeySlots, MrInfo, MrTable};
use super::soft_qp::{check_post, recv_completion, set_placed, SoftQp};
use super::soft_srq::SoftSrq;
use super::*;
use crate::mem::guard::{self, GuardProbe};
use crate::mem::{Arena, Backing, PeerAccess};
use crate::wake::ReadySet;

pub(crate) mod shared;
#[cfg(test)]
mod tests;

/// Progress calls between non-blocking hang-up checks of the socket.
pub const SOCKET_CHECK_EVERY: u32 = 64;

/// Most setup-socket messages one look at the socket reads.
const SOCKET_READS_MAX: usize = 256;

/// The shm provider (marker type).
#[derive(Debug, Clone, Copy)]
pub struct Shm;

impl Provider for Shm {
    type Context = ShmContext;
    type Pd = ShmPd;
    type Mr = ShmMr;
    type Cq = ShmCq;
    type PreparedQp = ShmPreparedQp;
    type Qp = ShmQp;
    type Listener = ShmListener;
    type Incoming = ShmIncoming;
    type Srq = ShmSrq;
    const SCHEME: &'static str = "shm";
    const WINDOWS_ALWAYS: bool = true;

    fn open(url: &str) -> Result<ShmContext, VerbsError> {
        socket_path(url)?;
        Ok(ShmContext {
            inner: Arc::new(CtxInner {
                next_qpn: AtomicU32::new(1),
            }),
        })
    }
}

fn socket_path(url: &str) -> Result<PathBuf, VerbsError> {
    let bad = |why| VerbsError::BadAddress {
        url: url.to_owned(),
        why,
    };
    let path = url
        .strip_prefix("shm://")
        .ok_or_else(|| bad("scheme is not shm://"))?;
    if !path.starts_with('/') {
        return Err(bad("path must be absolute (shm:///path/to.sock)"));
    }
    if path.len() > 100 {
        return Err(bad("socket path too long"));
    }
    Ok(PathBuf::from(path))
}

/// What is at an shm listener's socket path, found by connecting to it the
/// way a client would (`SOCK_SEQPACKET`: a stream connect cannot reach a
/// seqpacket listener, and would call every live socket stale).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SocketProbe {
    /// Nothing at the path.
    Absent,
    /// A socket file nobody listens on (its process died): safe to replace.
    Stale,
    /// A process listens on it; `pid` from SO_PEERCRED when the connect
    /// got through (a listener of another socket type gives none).
    Live {
        /// The listening process, when the kernel told us.
        pid: Option<i32>,
    },
    /// Something that is not a socket (a file, a directory).
    NotASocket,
}

/// Probes `path` (see [`SocketProbe`]). The probe connection is closed at
/// once without a HELLO; a listener of ours sees a peer that left.
///
/// # Errors
/// [`VerbsError::Os`] when the answer is neither of the above (e.g.
/// EACCES: the directory or socket is not ours to connect to).
pub fn probe_socket(path: &Path) -> Result<SocketProbe, VerbsError> {
    use nix::errno::Errno;
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Err(_) => return Ok(SocketProbe::Absent),
        Ok(m) if !m.file_type().is_socket() => return Ok(SocketProbe::NotASocket),
        Ok(_) => {}
    }
    let sock = setup_socket(SockFlag::SOCK_NONBLOCK)?;
    let addr = UnixAddr::new(path).map_err(os("socket address"))?;
    match connect(sock.as_raw_fd(), &addr) {
        Ok(()) => {
            let pid = getsockopt(&sock, PeerCredentials).ok().map(|c| c.pid());
            Ok(SocketProbe::Live { pid })
        }
        // A full backlog still means somebody listens; a listener of
        // another socket type too.
        Err(Errno::EAGAIN | Errno::EPROTOTYPE) => Ok(SocketProbe::Live { pid: None }),
        Err(Errno::ECONNREFUSED) => Ok(SocketProbe::Stale),
        Err(Errno::ENOENT) => Ok(SocketProbe::Absent),
        Err(source) => Err(VerbsError::Os {
            what: "probe of the socket path",
            source,
        }),
    }
}

/// A connection-setup socket: SEQPACKET, close-on-exec, plus `flags`.
fn setup_socket(flags: SockFlag) -> Result<OwnedFd, VerbsError> {
    socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC | flags,
        None,
    )
    .map_err(os("socket"))
}

fn os(what: &'static str) -> impl Fn(nix::Error) -> VerbsError {
    move |source| VerbsError::Os { what, source }
}

#[derive(Debug)]
struct CtxInner {
    next_qpn: AtomicU32,
}

/// An opened shm "device".
#[derive(Debug, Clone)]
pub struct ShmContext {
    inner: Arc<CtxInner>,
}

static CQ_IDS: AtomicUsize = AtomicUsize::new(1);

impl Context<Shm> for ShmContext {
    fn alloc_pd(&self) -> Result<ShmPd, VerbsError> {
        Ok(ShmPd {
            inner: Arc::new(PdInner {
                ctx: self.inner.clone(),
                mrs: Arc::default(),
            }),
        })
    }

    fn create_cq(&self, depth: usize) -> Result<ShmCq, VerbsError> {
        Ok(ShmCq {
            inner: Arc::new(CqInner {
                id: CQ_IDS.fetch_add(1, Ordering::Relaxed),
                depth,
                qps: Mutex::new(CqQps::default()),
                bells: Arc::new(ReadySet::new().map_err(os("epoll_create1"))?),
            }),
        })
    }

    fn listen(&self, url: &str) -> Result<ShmListener, VerbsError> {
        let path = socket_path(url)?;
        let sock = setup_socket(SockFlag::SOCK_NONBLOCK)?;
        // A stale socket file from a dead process would make bind fail, so
        // it is replaced; a live one never is (its server would become
        // unreachable, and stay so after we are gone).
        match probe_socket(&path)? {
            SocketProbe::Absent => {}
            SocketProbe::Stale => {
                let _ = std::fs::remove_file(&path);
            }
            SocketProbe::Live { pid } => {
                return Err(VerbsError::Unavailable(format!(
                    "{url}: the socket is in use by {}; stop it or choose another path",
                    pid.map_or("another process".to_owned(), |p| format!("process {p}"))
                )))
            }
            SocketProbe::NotASocket => {
                return Err(VerbsError::Unavailable(format!(
                    "{url}: {} exists and is not a socket; remove it or choose another path",
                    path.display()
                )))
            }
        }
        let addr = UnixAddr::new(&path).map_err(os("socket address"))?;
        bind(sock.as_raw_fd(), &addr).map_err(os("bind"))?;
        listen(&sock, Backlog::new(512).unwrap_or(Backlog::MAXCONN)).map_err(os("listen"))?;
        Ok(ShmListener {
            sock,
            path,
            allowed: Mutex::new(vec![nix::unistd::getuid().as_raw()]),
            pending: Mutex::new(VecDeque::new()),
            peer_memory_faults: Arc::new(AtomicU64::new(0)),
            uids: Arc::default(),
        })
    }
}

#[derive(Debug)]
struct PdInner {
    ctx: Arc<CtxInner>,
    mrs: Arc<MrTable>,
}

impl PdInner {
    /// Whether an SGE lies in a live registration of this PD with `need`.
    fn check_local(&self, sge: &Sge, need: Access) -> bool {
        self.mrs.check_local(sge, need)
    }
}

/// A protection domain.
#[derive(Debug)]
pub struct ShmPd {
    inner: Arc<PdInner>,
}

impl ProtectionDomain<Shm> for ShmPd {
    fn register(
        &self,
        arena: &Arc<Arena>,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<ShmMr, VerbsError> {
        self.inner.mrs.register(arena, offset, len, access)
    }

    fn create_qp(
        &self,
        send_cq: &ShmCq,
        recv_cq: &ShmCq,
        caps: QpCaps,
    ) -> Result<ShmPreparedQp, VerbsError> {
        self.new_qp(send_cq, recv_cq, caps, None)
    }

    fn create_srq(&self, caps: SrqCaps) -> Result<ShmSrq, VerbsError> {
        // A message is staged in a slot of `max_message` bytes: it needs
        // at least one.
        ShmSrq::create(
            &self.inner.mrs,
            caps,
            MAX_RING,
            1,
            "shared receive queue depth must be 1..=65536, messages at least 1 byte",
        )
    }

    fn create_qp_on_srq(
        &self,
        send_cq: &ShmCq,
        recv_cq: &ShmCq,
        srq: &ShmSrq,
        caps: QpCaps,
    ) -> Result<ShmPreparedQp, VerbsError> {
        srq.inner.check_pd(&self.inner.mrs)?;
        let slots = srq.inner.caps().staging_slots.clamp(1, MAX_RING);
        let size = srq.inner.caps().max_message;
        let arena = Arena::with_backing_lazy(slots as usize * size as usize, Backing::Small)?;
        let slab = crate::mem::Slab::new(arena, 0, size, slots, 0, crate::mem::WrKind::Recv)?;
        let staging = Staging {
            srq: srq.inner.clone(),
            slab,
        };
        // A poll moves at most what the completion queue holds, and a
        // connection can have no more messages waiting than its slots:
        // room for more would never be used.
        let completions = caps.max_recv_wr.min(slots) as usize;
        let qp = self.new_qp(
            send_cq,
            recv_cq,
            QpCaps {
                max_recv_wr: slots,
                ..caps
            },
            Some(staging),
        )?;
        lock(&qp.shared.inner).recv_done.reserve(completions);
        Ok(qp)
    }
}

impl ShmPd {
    fn new_qp(
        &self,
        send_cq: &ShmCq,
        recv_cq: &ShmCq,
        caps: QpCaps,
        staging: Option<Staging>,
    ) -> Result<ShmPreparedQp, VerbsError> {
        check_queue_depths(&caps, MAX_RING, "queue depth must be 1..=65536")?;
        let layout = Layout::new(caps.max_send_wr, caps.max_recv_wr);
        let qpn = self.inner.ctx.next_qpn.fetch_add(1, Ordering::Relaxed);
        let shared = Arc::new(QpShared {
            qpn,
            send_cq: send_cq.inner.id,
            recv_cq: recv_cq.inner.id,
            recv_bells: recv_cq.inner.bells.clone(),
            dropped: AtomicBool::new(false),
            hot: [AtomicBool::new(false), AtomicBool::new(false)],
            inner: Mutex::new(QpInner {
                qpn,
                state: QpState::Init,
                peer_closed: false,
                caps,
                layout,
                pd: self.inner.clone(),
                sq: VecDeque::with_capacity(caps.max_send_wr as usize),
                send_done: VecDeque::with_capacity(caps.max_send_wr as usize),
                rq: VecDeque::with_capacity(caps.max_recv_wr as usize),
                recv_done: VecDeque::with_capacity(caps.max_recv_wr as usize),
                conn: None,
                waits: SendWaits::default(),
                polls: 0,
                socket_ready: false,
                staging: None,
            }),
        });
        if let Some(st) = staging {
            // Every staging slot is a receive of this connection's own,
            // published to the peer at connect like a pre-posted one.
            let mut inner = lock(&shared.inner);
            while let Some(buf) = st.slab.alloc() {
                inner.rq.push_back(RecvWr {
                    wr_id: buf.wr_id(),
                    sgl: SgeList::one(Sge::whole(buf)),
                });
            }
            inner.staging = Some(st);
        }
        send_cq.inner.bind(&shared);
        if recv_cq.inner.id != send_cq.inner.id {
            recv_cq.inner.bind(&shared);
        }
        Ok(ShmPreparedQp { shared })
    }
}

/// A registered memory region; deregistered on drop.
pub type ShmMr = super::SoftMr<Shm>;

#[derive(Debug)]
struct CqInner {
    id: usize,
    depth: usize,
    qps: Mutex<CqQps>,
    /// The setup sockets of the connections it receives for: a peer
    /// sends `M_RING` on one while the poller sleeps
    /// (`CompletionQueue::arm_wakeup`), and a hang-up shows there too.
    /// Tokens are queue-pair numbers.
    bells: Arc<ReadySet>,
}

impl CqInner {
    /// Lists `qp` with this CQ, with room set aside for it in the hot
    /// list: a poll that makes a queue pair hot never allocates.
    fn bind(&self, qp: &Arc<QpShared>) {
        let mut st = lock(&self.qps);
        st.all.push(qp.clone());
        let more = st.all.len().saturating_sub(st.hot.len());
        st.hot.reserve(more);
    }
}

/// Polls a queue pair stays in its CQ's hot list after its last activity
/// (about a millisecond of a busy worker's iterations: a connection in a
/// conversation stays hot, one that pauses longer goes back to the
/// window). Measured with `rpcrdma-bench conns` (docs/BENCHMARKS.md): a
/// longer stay kept hundreds of recently used idle connections driven on
/// every poll.
const HOT_POLLS: u64 = 1 << 10;

/// Queue pairs outside the hot list driven per poll, round robin. A
/// message to an idle connection waits at most `n / COLD_BUDGET` polls of
/// a CQ with `n` queue pairs.
const COLD_BUDGET: usize = 8;

/// The queue pairs bound to a CQ.
///
/// Driving a queue pair costs a lock and a look at the peer's outbox (a
/// shared cache line), so a CQ shared by many connections (a worker's)
/// drives every poll only the queue pairs active in the last
/// [`HOT_POLLS`] polls, plus a window of [`COLD_BUDGET`] of the others:
/// an iteration of a worker with a thousand idle connections stays cheap,
/// and an idle connection's next message is still seen within
/// `n / COLD_BUDGET` polls (128 for 1,024 connections). A queue pair whose send and receive CQs differ is in each one's
/// lists on its own terms (`QpShared::hot` has a flag per role).
#[derive(Debug, Default)]
struct CqQps {
    all: Vec<Arc<QpShared>>,
    /// Active queue pairs and the poll of their last activity; each also
    /// has its `QpShared::hot` flag for this CQ set.
    hot: Vec<(Arc<QpShared>, u64)>,
    /// Where the next cold window starts in `all`.
    cursor: usize,
    polls: u64,
}

/// A completion queue. Polling it also drives the queue pairs bound to it.
#[derive(Debug)]
pub struct ShmCq {
    inner: Arc<CqInner>,
}

impl ShmCq {
    /// Configured depth (informational: each QP buffers its own
    /// completions, bounded by its queue depths).
    pub fn depth(&self) -> usize {
        self.inner.depth
    }
}

impl CompletionQueue for ShmCq {
    fn poll(&self, out: &mut [Completion]) -> usize {
        let mut guard = lock(&self.inner.qps);
        let st = &mut *guard;
        let n = st.all.len();
        if n == 0 || out.is_empty() {
            return 0;
        }
        st.polls += 1;
        let p = st.polls;
        let id = self.inner.id;
        let mut got = 0;
        let mut prune = false;
        // The hot list, every poll, from where the last full poll stopped:
        // with `out` full the rest wait for the next poll, and go first
        // then, so queue pairs early in the list cannot starve the others
        // of completions (a worker's burst is 32; many busy connections
        // fill it every poll).
        let mut i = 0;
        while i < st.hot.len() {
            if got == out.len() {
                st.hot.rotate_left(i);
                break;
            }
            let (qp, last) = &mut st.hot[i];
            let (active, gone) = drive(qp, id, out, &mut got);
            prune |= gone;
            if active {
                *last = p;
            }
            if gone || p.wrapping_sub(*last) > HOT_POLLS {
                qp.hot_flag(id).store(false, Ordering::Relaxed);
                st.hot.swap_remove(i);
            } else {
                i += 1;
            }
        }
        // A window of the others.
        for k in 0..COLD_BUDGET.min(n) {
            let qp = &st.all[(st.cursor + k) % n];
            if qp.hot_flag(id).load(Ordering::Relaxed) {
                continue;
            }
            let (active, gone) = drive(qp, id, out, &mut got);
            prune |= gone;
            if active && !gone {
                qp.hot_flag(id).store(true, Ordering::Relaxed);
                let qp = qp.clone();
                st.hot.push((qp, p));
            }
        }
        st.cursor = (st.cursor + COLD_BUDGET.min(n)) % n;
        if prune {
            st.all
                .retain(|qp| !(qp.dropped.load(Ordering::Relaxed) && lock(&qp.inner).is_drained()));
            st.hot.retain(|(qp, _)| {
                !(qp.dropped.load(Ordering::Relaxed) && lock(&qp.inner).is_drained())
            });
            if !st.all.is_empty() {
                st.cursor %= st.all.len();
            }
        }
        got
    }

    fn wakeup_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.inner.bells.as_fd())
    }

    /// Raises the sleeping flag in the outbox of every connection this
    /// queue receives for, then (after a full fence, the other half of
    /// `Conn::ring_if_sleeping`) looks once at each for anything already
    /// published or completed, or for room the peer gave a Send of ours
    /// that waits for it (a receive, descriptor slots). Rings a sleeping
    /// peer we gave room since we last looked. Costs a lock and a few
    /// loads per queue pair, once per sleep, not per poll.
    fn arm_wakeup(&self) -> bool {
        let st = lock(&self.inner.qps);
        let id = self.inner.id;
        for qp in st.all.iter().filter(|qp| qp.recv_cq == id) {
            if let Some(conn) = lock(&qp.inner).conn.as_mut() {
                conn.set_sleeping(true);
            }
        }
        fence(Ordering::SeqCst);
        st.all.iter().all(|qp| {
            let mut inner = lock(&qp.inner);
            let waiting = !inner.sq.is_empty();
            let news = inner
                .conn
                .as_ref()
                .is_some_and(|c| c.peer_has_news() || (waiting && c.peer_has_room()))
                || !inner.send_done.is_empty()
                || !inner.recv_done.is_empty();
            if let Some(conn) = inner.conn.as_mut() {
                conn.ring_after(false);
            }
            !news
        })
    }

    /// Lowers the flags; the connections whose socket woke us read it at
    /// their next progress (a ring, a region, or a hang-up), so the next
    /// sleep does not wake at once on a message nobody read.
    fn disarm_wakeup(&self) {
        let st = lock(&self.inner.qps);
        let id = self.inner.id;
        for qp in st.all.iter().filter(|qp| qp.recv_cq == id) {
            if let Some(conn) = lock(&qp.inner).conn.as_mut() {
                conn.set_sleeping(false);
            }
        }
        let mut ready = [0u64; 32];
        let n = self.inner.bells.ready(&mut ready);
        for &qpn in &ready[..n] {
            if let Some(qp) = st.all.iter().find(|qp| u64::from(qp.qpn) == qpn) {
                lock(&qp.inner).socket_ready = true;
            }
        }
    }
}

/// Drives one queue pair of CQ `id`: progress, then its completions for
/// that CQ into `out`. Returns (it had work or completions, it is dropped
/// and drained).
fn drive(qp: &QpShared, id: usize, out: &mut [Completion], got: &mut usize) -> (bool, bool) {
    let mut inner = lock(&qp.inner);
    inner.progress();
    let before = *got;
    if qp.send_cq == id {
        while *got < out.len() {
            let Some(c) = inner.send_done.pop_front() else {
                break;
            };
            out[*got] = c;
            *got += 1;
        }
    }
    if qp.recv_cq == id {
        while *got < out.len() {
            let Some(c) = inner.recv_done.pop_front() else {
                break;
            };
            out[*got] = c;
            *got += 1;
        }
    }
    let active = *got > before
        || !inner.sq.is_empty()
        || !inner.send_done.is_empty()
        || !inner.recv_done.is_empty();
    let gone = qp.dropped.load(Ordering::Relaxed) && inner.is_drained();
    (active, gone)
}

#[derive(Debug)]
struct QpShared {
    qpn: u32,
    send_cq: usize,
    recv_cq: usize,
    /// Its receive CQ's set of sockets to wake on (the connection's socket
    /// joins it at setup).
    recv_bells: Arc<ReadySet>,
    dropped: AtomicBool,
    /// In its send CQ's and its receive CQ's hot list ([`CqQps`]).
    hot: [AtomicBool; 2],
    inner: Mutex<QpInner>,
}

impl QpShared {
    /// Its hot-list flag for CQ `cq` (the send CQ's when both are one).
    fn hot_flag(&self, cq: usize) -> &AtomicBool {
        &self.hot[usize::from(self.send_cq != cq)]
    }
}

/// A created queue pair that is not connected yet; receives may be posted.
#[derive(Debug)]
pub struct ShmPreparedQp {
    shared: Arc<QpShared>,
}

/// A connected RC queue pair.
#[derive(Debug)]
pub struct ShmQp {
    shared: Arc<QpShared>,
}

impl Drop for ShmPreparedQp {
    fn drop(&mut self) {
        let mut inner = lock(&self.shared.inner);
        if inner.state == QpState::Init {
            // Not handed to a connection: flush pre-posted receives.
            inner.enter_error(None);
            drop(inner);
            self.shared.dropped.store(true, Ordering::Relaxed);
        }
    }
}

impl Drop for ShmQp {
    fn drop(&mut self) {
        self.disconnect();
        self.shared.dropped.store(true, Ordering::Relaxed);
    }
}

#[derive(Debug)]
struct OutRegion {
    arena: u64,
    writable: bool,
    id: u32,
    /// The guard's view of an arena shared writable.
    guard: Option<GuardProbe>,
}

#[derive(Debug)]
struct Conn {
    /// In the receive CQ's set of sockets (dropped before `sock`).
    _bell: Option<BellMember>,
    sock: OwnedFd,
    mine: Arena,
    /// Sizes of our outbox, as validated at creation. Never read back from
    /// the outbox: shared memory is not trusted, even our own.
    layout: Layout,
    peer: Mapping,
    peer_layout: Layout,
    /// Descriptors we produced.
    desc_head: u64,
    /// Peer descriptors we consumed.
    peer_desc_tail: u64,
    /// Receives we published.
    recv_head: u64,
    /// Sequence number of our oldest outstanding receive.
    rq_front_seq: u64,
    /// Peer receives we consumed.
    peer_recv_tail: u64,
    /// Last values read of the peer's receive head and of its tail of our
    /// descriptors. Both only grow, so a stale copy under-counts the
    /// peer's receives and our ring's free room: safe. They are read
    /// again only when the copy says "none left", which keeps the Send
    /// path off two cache lines the peer writes on every message (each
    /// read of them would be a cross-core miss).
    peer_recv_head_seen: u64,
    peer_desc_tail_seen: u64,
    out_regions: Vec<OutRegion>,
    in_regions: Vec<Option<Mapping>>,
    /// Bytes of `in_regions` mapped, at most [`MAX_PEER_MAPPED`].
    in_mapped: u64,
    keys: KeySlots,
    /// [`guard::faults_total`] when this connection's writable memory was
    /// last looked at.
    guard_seen: u64,
    /// The listener's count of connections ended by a guarded fault
    /// (none on the requesting side).
    fault_count: Option<Arc<AtomicU64>>,
    /// Its place among its peer uid's connections on the listener that
    /// accepted it (none on the requesting side): released with the
    /// connection.
    _uid_slot: Option<UidSlot>,
    /// The peer's outbox has [`FEATURE_DOORBELL`]: it raises its sleeping
    /// flag and understands `M_RING`. Read once at setup.
    peer_rings: bool,
    /// Our sleeping flag as we last wrote it.
    sleeping: bool,
    /// We gave the peer room since we last looked at its sleeping flag:
    /// a receive published or descriptors consumed. A peer asleep with a
    /// Send waiting for exactly that (no receive posted, its descriptor
    /// ring full) must be rung, or it sleeps with the Send unsent.
    gave_room: bool,
    /// Control-message buffer for reading the socket (made once).
    cmsg: Vec<u8>,
}

/// A connection's socket in its receive CQ's [`ReadySet`], taken out
/// when the connection goes (before its socket closes: the first field
/// of [`Conn`], dropped first).
#[derive(Debug)]
struct BellMember {
    set: Arc<ReadySet>,
    fd: std::os::fd::RawFd,
}

impl Drop for BellMember {
    fn drop(&mut self) {
        self.set.remove(self.fd);
    }
}

impl Conn {
    /// Whether the SIGBUS guard replaced a page of memory this connection
    /// shares writable (ours it was given, or the peer's we write): a
    /// hole was punched in it and the hugepage pool could not refill it.
    /// The replaced page no longer reaches the peer, so the connection
    /// cannot go on. Looks at the regions only when the process-wide
    /// count moved: one load per poll otherwise.
    fn peer_memory_faulted(&mut self) -> bool {
        let now = guard::faults_total();
        if now == self.guard_seen {
            return false;
        }
        self.guard_seen = now;
        self.out_regions
            .iter()
            .filter_map(|r| r.guard)
            .chain(
                self.in_regions
                    .iter()
                    .flatten()
                    .filter_map(Mapping::guard_probe),
            )
            .any(|g| g.faults() > 0)
    }

    fn my_words(&self) -> &[AtomicU64] {
        // SAFETY: `mine` is our own outbox arena, alive as long as `self`;
        // its length covers the layout (checked at creation).
        unsafe {
            std::slice::from_raw_parts(self.mine.as_ptr() as *const AtomicU64, self.mine.len() / 8)
        }
    }
    fn peer_word(&self, i: usize) -> u64 {
        // Index validated: the peer mapping covers `peer_layout.words()`.
        self.peer.words()[i].load(Ordering::Acquire)
    }

    /// Reads setup-socket messages until none is queued, or
    /// [`SOCKET_READS_MAX`] of them (a peer that floods its socket leaves
    /// the rest for the next look, which its own flood brings on). `Err`
    /// on hang-up or a protocol violation.
    fn drain_socket(&mut self) -> Result<(), WcStatus> {
        for _ in 0..SOCKET_READS_MAX {
            match Msg::recv_reusing(self.sock.as_fd(), &mut self.cmsg) {
                Ok(None) => return Ok(()),
                Ok(Some(m)) if m.kind == M_REGION => {
                    let id = m.args[0] as usize;
                    let writable = m.args[1] != 0;
                    let Some(fd) = m.fd else {
                        return Err(WcStatus::RemInvReqErr);
                    };
                    if id >= MAX_REGIONS {
                        return Err(WcStatus::RemInvReqErr);
                    }
                    if self.in_regions.len() <= id {
                        self.in_regions.resize_with(id + 1, || None);
                    }
                    if self.in_regions[id].is_some() {
                        return Err(WcStatus::RemInvReqErr);
                    }
                    let map = Mapping::map_peer(fd.as_fd(), writable)
                        .map_err(|_| WcStatus::RemInvReqErr)?;
                    let mapped = self.in_mapped.saturating_add(map.len() as u64);
                    if mapped > MAX_PEER_MAPPED {
                        return Err(WcStatus::RemInvReqErr);
                    }
                    self.in_mapped = mapped;
                    self.in_regions[id] = Some(map);
                }
                // A wake-up, nothing to do: it ended our sleep. A ring
                // with a descriptor attached is not one (the descriptor
                // is closed with the message).
                Ok(Some(m)) if m.kind == M_RING && m.fd.is_none() => {}
                Ok(Some(_)) => return Err(WcStatus::RemInvReqErr),
                Err(_) => return Err(WcStatus::RetryExcErr),
            }
        }
        Ok(())
    }

    /// Region id under which `arena` is exposed (with `writable`) to the
    /// peer; sends the memfd the first time.
    fn ensure_region(&mut self, arena: &Arena, writable: bool) -> Result<u32, VerbsError> {
        if let Some(r) = self
            .out_regions
            .iter()
            .find(|r| r.arena == arena.id() && r.writable == writable)
        {
            return Ok(r.id);
        }
        if self.out_regions.len() >= MAX_REGIONS {
            return Err(VerbsError::Limit("too many regions exposed to this peer"));
        }
        let id = self.out_regions.len() as u32;
        let msg = Msg::new(M_REGION, [id, writable as u32, 0, 0], &[])?;
        if writable {
            arena.share_writable()?;
        } else {
            // REMOTE_READ only: seal the memfd against any new writable
            // mapping or write, whatever descriptor the peer opens (ours
            // was made at creation and keeps working).
            arena.share_read_only()?;
        }
        msg.send(self.sock.as_fd(), Some(arena.fd()))?;
        self.out_regions.push(OutRegion {
            arena: arena.id(),
            writable,
            id,
            guard: arena.guard_probe(),
        });
        Ok(id)
    }

    fn region(&mut self, id: u64) -> Option<&Mapping> {
        let id = usize::try_from(id).ok()?;
        if self.in_regions.get(id).is_none_or(Option::is_none) {
            // The REGION message precedes any reference to it; read it now.
            self.drain_socket().ok()?;
        }
        self.in_regions.get(id)?.as_ref()
    }

    /// Validates a peer rkey access and returns a pointer to `len` bytes.
    fn remote(&mut self, ra: RemoteAddr, len: u64, need: Access) -> Result<*mut u8, WcStatus> {
        const E: WcStatus = WcStatus::RemAccessErr;
        if ra.rkey == 0 {
            return Err(E);
        }
        let slot = (ra.rkey & (self.peer_layout.key_cap - 1)) as usize;
        let base = self.peer_layout.key_base() + slot * KEY_WORDS;
        let w = self.peer.words();
        let r1 = w[base].load(Ordering::Acquire);
        if r1 != ra.rkey as u64 {
            return Err(E);
        }
        let acc_region = w[base + 1].load(Ordering::Relaxed);
        let va = w[base + 2].load(Ordering::Relaxed);
        let region_off = w[base + 3].load(Ordering::Relaxed);
        let mr_len = w[base + 4].load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        if w[base].load(Ordering::Relaxed) != r1 {
            return Err(E);
        }
        if !Access::from_bits_truncate(acc_region as u32).contains(need) {
            return Err(E);
        }
        let off = ra.addr.checked_sub(va).ok_or(E)?;
        if off.checked_add(len).is_none_or(|end| end > mr_len) {
            return Err(E);
        }
        let region_off = region_off.checked_add(off).ok_or(E)?;
        let map = self.region(acc_region >> 32).ok_or(E)?;
        if need.contains(Access::REMOTE_WRITE) && !map.writable {
            return Err(E);
        }
        map.range(region_off, len).ok_or(E)
    }

    /// Publishes one descriptor (space was checked by the caller).
    fn publish(&mut self, kind: u64, byte_len: u32, imm: u32, seq: u64) {
        let cap = self.layout.desc_cap as u64;
        let base = HEADER_WORDS + ((self.desc_head % cap) as usize) * DESC_WORDS;
        let head = self.desc_head + 1;
        let w = self.my_words();
        w[base].store(kind | ((byte_len as u64) << 32), Ordering::Relaxed);
        w[base + 1].store(imm as u64, Ordering::Relaxed);
        w[base + 2].store(seq, Ordering::Relaxed);
        w[W_DESC_HEAD].store(head, Ordering::Release);
        self.desc_head = head;
    }

    fn desc_space(&mut self) -> bool {
        let cap = self.layout.desc_cap as u64;
        if self.desc_head.wrapping_sub(self.peer_desc_tail_seen) < cap {
            return true;
        }
        self.peer_desc_tail_seen = self.peer_word(W_PEER_DESC_TAIL);
        self.desc_head.wrapping_sub(self.peer_desc_tail_seen) < cap
    }

    fn set_flag(&self, flag: u64) {
        self.my_words()[W_FLAGS].fetch_or(flag, Ordering::Release);
        // A sleeping peer learns of the end at once, not at its timeout.
        self.ring_if_sleeping();
    }

    /// After publishing descriptors: rings the peer's doorbell if its
    /// poller sleeps. The peer raises its flag, fences, then looks at our
    /// descriptor head (`ShmCq::arm_wakeup`); we published, fence, then
    /// look at its flag: one of the two sees the other (both fences are
    /// sequentially consistent), so a message never waits for the peer's
    /// timeout. A peer awake costs one load of a line it rarely writes.
    ///
    /// The ring is an `M_RING` on the connection's own socket, sent
    /// without waiting: a peer that never reads its socket gets no more
    /// rings (the send fails), and one that keeps its flag raised costs us
    /// one `sendmsg` per run of Sends to it, which its own calls pay for.
    fn ring_if_sleeping(&self) {
        if !self.peer_rings {
            return;
        }
        fence(Ordering::SeqCst);
        if self.peer_word(W_SLEEPING) == 0 {
            return;
        }
        if let Ok(msg) = Msg::new(M_RING, [0; 4], &[]) {
            // A full or broken socket: the hang-up check finds the latter.
            let _ = msg.send(self.sock.as_fd(), None);
        }
    }

    /// Raises or lowers our sleeping flag (the peer rings our doorbell
    /// while it is raised).
    fn set_sleeping(&mut self, on: bool) {
        if self.sleeping != on {
            self.sleeping = on;
            self.my_words()[W_SLEEPING].store(u64::from(on), Ordering::Relaxed);
        }
    }

    /// Whether the peer published something we have not consumed: a
    /// descriptor, or its close or error flag.
    fn peer_has_news(&self) -> bool {
        self.peer_word(W_DESC_HEAD) != self.peer_desc_tail || self.peer_word(W_FLAGS) != 0
    }

    /// Whether a Send of ours would find room at the peer now: a receive
    /// posted and a free descriptor slot (a Send that waited for either
    /// may go). A garbage counter reads as room: the Send then fails.
    fn peer_has_room(&self) -> bool {
        let recvs = self
            .peer_word(W_RECV_HEAD)
            .wrapping_sub(self.peer_recv_tail);
        let descs = self
            .desc_head
            .wrapping_sub(self.peer_word(W_PEER_DESC_TAIL));
        recvs > 0 && descs < self.layout.desc_cap as u64
    }

    /// Rings a sleeping peer if we published a descriptor (`published`)
    /// or gave it room since the last look (see [`Conn::gave_room`]).
    fn ring_after(&mut self, published: bool) {
        if std::mem::take(&mut self.gave_room) || published {
            self.ring_if_sleeping();
        }
    }
}

/// Builds our outbox. Its pages are faulted in where they are first
/// written or read, not at setup: the key table (16 KiB) stays untouched
/// on a connection that never exposes memory (a server's), and an idle
/// connection touches a page or two of its rings.
fn new_outbox(layout: Layout) -> Result<Arena, VerbsError> {
    let arena = Arena::with_backing_lazy(layout.bytes(), Backing::Small)?;
    let arena = Arc::try_unwrap(arena).map_err(|_| VerbsError::Limit("outbox shared"))?;
    // SAFETY: fresh private arena of at least `layout.bytes()` bytes.
    let w =
        unsafe { std::slice::from_raw_parts(arena.as_ptr() as *const AtomicU64, arena.len() / 8) };
    w[0].store(MAGIC, Ordering::Relaxed);
    w[1].store(layout.desc_cap as u64, Ordering::Relaxed);
    w[2].store(layout.rq_cap as u64, Ordering::Relaxed);
    w[3].store(layout.key_cap as u64, Ordering::Relaxed);
    w[W_FEATURES].store(FEATURE_DOORBELL, Ordering::Relaxed);
    // The peer reads our outbox and must not write it: after this no new
    // writable mapping (and no write(2)) of the memfd is possible through
    // any descriptor; ours, made above, keeps working.
    arena.share_read_only()?;
    Ok(arena)
}

/// Maps and validates the peer's outbox.
fn map_peer_outbox(fd: Option<OwnedFd>, args: [u32; 4]) -> Result<(Mapping, Layout), VerbsError> {
    if args[0] != VERSION {
        return Err(VerbsError::Protocol("unsupported shm version"));
    }
    let layout = Layout {
        desc_cap: args[1],
        rq_cap: args[2],
        key_cap: args[3],
    }
    .validate()?;
    let fd = fd.ok_or(VerbsError::Protocol("no outbox fd"))?;
    let map = Mapping::map_peer(fd.as_fd(), false)?;
    if map.len() < layout.bytes() {
        return Err(VerbsError::Protocol("peer outbox smaller than its layout"));
    }
    let w = map.words();
    if w[0].load(Ordering::Acquire) != MAGIC
        || w[1].load(Ordering::Relaxed) != layout.desc_cap as u64
        || w[2].load(Ordering::Relaxed) != layout.rq_cap as u64
        || w[3].load(Ordering::Relaxed) != layout.key_cap as u64
    {
        return Err(VerbsError::Protocol("peer outbox header mismatch"));
    }
    Ok((map, layout))
}

#[derive(Debug)]
struct QpInner {
    qpn: u32,
    state: QpState,
    /// The peer closed the connection in order (its close flag): the
    /// error state is its end.
    peer_closed: bool,
    caps: QpCaps,
    layout: Layout,
    pd: Arc<PdInner>,
    /// Posted send work not executed yet (head may be waiting on RNR).
    sq: VecDeque<SendWr>,
    send_done: VecDeque<Completion>,
    /// Posted receives, oldest first.
    rq: VecDeque<RecvWr>,
    recv_done: VecDeque<Completion>,
    conn: Option<Conn>,
    waits: SendWaits,
    polls: u32,
    /// Its socket woke the sleeping poller: read it at the next progress.
    socket_ready: bool,
    /// On a shared receive queue: `rq` holds this connection's staging
    /// slots instead of the application's receives.
    staging: Option<Staging>,
}

/// A shared receive queue. A peer writes a Send into one of its
/// connection's staging slots (memory shared with that peer alone); the
/// queue pair's progress copies it into a posted shared receive
/// and republishes the slot. No peer ever maps a shared receive, so one
/// connection cannot touch another's messages, and an idle connection
/// holds only its few staging slots.
pub type ShmSrq = super::SoftSrqHandle<Shm>;

/// A queue pair's side of a shared receive queue: its staging slots.
#[derive(Debug)]
struct Staging {
    srq: Arc<SoftSrq>,
    slab: crate::mem::Slab,
}

/// Outcome of trying the head of the send queue.
enum Step {
    Done(WcStatus, u32),
    Wait,
}

impl QpInner {
    fn is_drained(&self) -> bool {
        self.conn.is_none()
            && self.sq.is_empty()
            && self.rq.is_empty()
            && self.send_done.is_empty()
            && self.recv_done.is_empty()
    }

    /// Moves to the error state: tells the peer (the `error` flag, so its
    /// queue pair errors and flushes too) and releases the connection
    /// (unmaps, closes the socket), then flushes
    /// ([`SoftQp::flush_queues`]: the head send completes with
    /// `head_status`, if given, everything else with `WrFlushErr`).
    fn enter_error(&mut self, head_status: Option<WcStatus>) {
        if let Some(conn) = self.conn.take() {
            conn.set_flag(FLAG_ERROR);
        }
        self.flush_queues(head_status);
    }
}

impl SoftQp for QpInner {
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
        self.sq.pop_front()
    }

    fn pop_recv(&mut self) -> Option<RecvWr> {
        self.rq.pop_front()
    }

    fn push_send_done(&mut self, c: Completion) {
        self.send_done.push_back(c);
    }

    fn push_recv_done(&mut self, c: Completion) {
        self.recv_done.push_back(c);
    }

    fn on_srq(&self) -> bool {
        self.staging.is_some()
    }

    /// Its receive queue holds staging slots, the provider's buffers and
    /// not the application's: nothing to complete, the slot goes back to
    /// its slab. The shared queue's receives stay posted for the others.
    fn release_shared(&mut self, wr: RecvWr) {
        drop(wr);
    }

    fn fail(&mut self) {
        self.enter_error(None);
    }
}

/// Copies the concatenation of `src` into the concatenation of `dst`;
/// returns the bytes copied (the smaller total).
///
/// # Safety
/// Every `(ptr, len)` must be valid for reads (`src`) or writes (`dst`) of
/// `len` bytes for the duration of the call.
unsafe fn copy_sg(src: &[(*const u8, usize)], dst: &[(*mut u8, usize)]) -> usize {
    let (mut si, mut so, mut di, mut doff, mut total) = (0, 0, 0, 0, 0);
    while si < src.len() && di < dst.len() {
        let n = (src[si].1 - so).min(dst[di].1 - doff);
        if n > 0 {
            // SAFETY: so + n <= src len and doff + n <= dst len, valid per the
            // caller's contract. `copy` (memmove) because in-process peers
            // may name overlapping memory.
            unsafe { std::ptr::copy(src[si].0.add(so), dst[di].0.add(doff), n) };
        }
        so += n;
        doff += n;
        total += n;
        if so == src[si].1 {
            si += 1;
            so = 0;
        }
        if di < dst.len() && doff == dst[di].1 {
            di += 1;
            doff = 0;
        }
    }
    total
}

/// Up to `MAX_SGE` raw `(pointer, length)` ranges.
type Ranges = [(*mut u8, usize); MAX_SGE];

/// Local segments of a work request as raw ranges (already validated
/// against the PD by the caller).
fn local_ranges(sgl: &SgeList) -> (Ranges, usize) {
    let mut out = [(std::ptr::null_mut(), 0); MAX_SGE];
    let mut n = 0;
    for s in sgl.iter() {
        // SAFETY: `in_bounds` was checked (via `check_local`), so offset is
        // inside the buffer.
        out[n] = (
            unsafe { s.buf.as_ptr().add(s.offset as usize) },
            s.len as usize,
        );
        n += 1;
    }
    (out, n)
}

fn as_src(r: &[(*mut u8, usize)]) -> [(*const u8, usize); MAX_SGE] {
    let mut out = [(std::ptr::null(), 0); MAX_SGE];
    for (o, i) in out.iter_mut().zip(r) {
        *o = (i.0 as *const u8, i.1);
    }
    out
}

/// Returns a shared receive taken for a message that turned out invalid
/// to the front of its queue.
fn give_back(staging: &Option<Staging>, wr: Option<RecvWr>) {
    if let (Some(st), Some(wr)) = (staging, wr) {
        st.srq.give_back(wr);
    }
}

impl Conn {
    /// Invalidates one of our rkeys (an exposure or a window's binding)
    /// on this connection.
    fn invalidate(&mut self, rkey: u32) -> bool {
        if !self.keys.invalidate(rkey) {
            return false;
        }
        let slot = KeySlots::slot(rkey);
        self.my_words()[self.layout.key_base() + slot * KEY_WORDS].store(0, Ordering::Relaxed);
        fence(Ordering::Release);
        true
    }

    /// Executes a window bind: checks it, then publishes the key-table
    /// entry as `expose` does (the rkey last, with a release store).
    fn bind(&mut self, b: &BindWindow, mrs: &MrTable) -> bool {
        let Some(mr) = self.keys.bind(b, mrs) else {
            return false;
        };
        let writable = mr.access.contains(Access::REMOTE_WRITE);
        match self.ensure_region(&mr.arena, writable) {
            Ok(region) => {
                let region_off = b.addr - mr.arena.as_ptr() as u64;
                self.publish_key(b.rkey, b.access, region, b.addr, region_off, b.len);
                true
            }
            Err(_) => {
                self.keys.invalidate(b.rkey);
                false
            }
        }
    }

    /// Writes one key-table entry, the rkey last (release).
    fn publish_key(&self, rkey: u32, access: Access, region: u32, va: u64, off: u64, len: u64) {
        let base = self.layout.key_base() + KeySlots::slot(rkey) * KEY_WORDS;
        let w = self.my_words();
        w[base + 1].store(
            access.bits() as u64 | ((region as u64) << 32),
            Ordering::Relaxed,
        );
        w[base + 2].store(va, Ordering::Relaxed);
        w[base + 3].store(off, Ordering::Relaxed);
        w[base + 4].store(len, Ordering::Relaxed);
        w[base].store(rkey as u64, Ordering::Release);
    }

    /// Publishes a posted receive in our recv ring.
    fn publish_recv(&mut self, wr: &RecvWr) -> Result<(), VerbsError> {
        let layout = self.layout;
        let base =
            layout.recv_base() + (self.recv_head % layout.rq_cap as u64) as usize * RECV_WORDS;
        let mut words = [0u64; RECV_WORDS];
        words[0] = wr.sgl.len() as u64;
        words[1] = wr.sgl.total_len();
        for (i, s) in wr.sgl.iter().enumerate() {
            let region = self.ensure_region(s.buf.arena(), true)?;
            words[2 + 2 * i] = ((region as u64) << 32) | s.len as u64;
            words[3 + 2 * i] = s.addr() - s.buf.arena().as_ptr() as u64;
        }
        let w = self.my_words();
        for (i, v) in words.iter().enumerate() {
            w[base + i].store(*v, Ordering::Relaxed);
        }
        let head = self.recv_head + 1;
        w[W_RECV_HEAD].store(head, Ordering::Release);
        self.recv_head = head;
        self.gave_room = true;
        Ok(())
    }

    /// Grants the peer access to a registration; returns its rkey.
    fn expose(&mut self, mr: &MrInfo) -> Result<RemoteKey, VerbsError> {
        let region = self.ensure_region(&mr.arena, mr.access.contains(Access::REMOTE_WRITE))?;
        let rkey = self.keys.expose(super::random::random_u32)?;
        let off = mr.addr - mr.arena.as_ptr() as u64;
        self.publish_key(rkey, mr.access, region, mr.addr, off, mr.len);
        Ok(RemoteKey {
            addr: mr.addr,
            rkey,
            len: mr.len,
        })
    }

    /// Peer receives available to us, or `Err` if the peer's counter is
    /// garbage.
    fn peer_recvs(&mut self) -> Result<u64, WcStatus> {
        let seen = self.peer_recv_head_seen.wrapping_sub(self.peer_recv_tail);
        if seen > 0 && seen <= self.peer_layout.rq_cap as u64 {
            return Ok(seen);
        }
        self.peer_recv_head_seen = self.peer_word(W_RECV_HEAD);
        let avail = self.peer_recv_head_seen.wrapping_sub(self.peer_recv_tail);
        if avail > self.peer_layout.rq_cap as u64 {
            return Err(WcStatus::RemInvReqErr);
        }
        Ok(avail)
    }

    /// The peer's next posted receive as writable ranges in our mappings.
    fn peer_recv_ranges(&mut self) -> Result<(Ranges, usize, u64), WcStatus> {
        const E: WcStatus = WcStatus::RemInvReqErr;
        let pl = self.peer_layout;
        let base = pl.recv_base() + (self.peer_recv_tail % pl.rq_cap as u64) as usize * RECV_WORDS;
        let mut words = [0u64; RECV_WORDS];
        {
            let w = self.peer.words();
            for (i, v) in words.iter_mut().enumerate() {
                *v = w[base + i].load(Ordering::Relaxed);
            }
        }
        let n = usize::try_from(words[0]).map_err(|_| E)?;
        if n > MAX_SGE {
            return Err(E);
        }
        let mut out = [(std::ptr::null_mut(), 0); MAX_SGE];
        let mut total = 0u64;
        for (i, o) in out.iter_mut().enumerate().take(n) {
            let a = words[2 + 2 * i];
            let len = a & 0xffff_ffff;
            let map = self.region(a >> 32).ok_or(E)?;
            if !map.writable {
                return Err(E);
            }
            *o = (map.range(words[3 + 2 * i], len).ok_or(E)?, len as usize);
            total += len;
        }
        Ok((out, n, total))
    }
}

impl QpInner {
    fn progress(&mut self) {
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        if conn.peer_memory_faulted() {
            if let Some(count) = &conn.fault_count {
                count.fetch_add(1, Ordering::Relaxed);
            }
            self.enter_error(None);
            return;
        }
        let Some(conn) = self.conn.as_ref() else {
            return;
        };
        let flags = conn.peer_word(W_FLAGS);
        // The peer's close flag (its `disconnect`, which raises its error
        // flag too; a failure raises the error flag alone): whatever ends
        // the queue pair below, it is the peer's orderly end.
        self.peer_closed = flags & FLAG_CLOSED != 0;
        if self.drain_descs().is_err() {
            self.enter_error(None);
            return;
        }
        self.exec_sq();
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        let gone = if flags & (FLAG_CLOSED | FLAG_ERROR) != 0 {
            Some(None)
        } else {
            self.polls = self.polls.wrapping_add(1);
            if self.polls % SOCKET_CHECK_EVERY == 0 || std::mem::take(&mut self.socket_ready) {
                conn.drain_socket().err().map(|st| {
                    // Hang-up without a close or error flag: like an RC
                    // transport timing out, the oldest send fails with
                    // retry-exceeded, the rest flush.
                    let flagged = conn.peer_word(W_FLAGS) & (FLAG_CLOSED | FLAG_ERROR) != 0;
                    (st == WcStatus::RetryExcErr && !flagged).then_some(WcStatus::RetryExcErr)
                })
            } else {
                None
            }
        };
        if let Some(head) = gone {
            // Descriptors the peer published before its flag or hang-up
            // (e.g. a length error for our receive) complete first.
            let _ = self.drain_descs();
            self.enter_error(head);
        }
    }

    /// Consumes the peer's descriptors: receive completions and errors.
    fn drain_descs(&mut self) -> Result<(), WcStatus> {
        const E: WcStatus = WcStatus::RemInvReqErr;
        let qpn = self.qpn;
        let Some(conn) = self.conn.as_mut() else {
            return Ok(());
        };
        let pl = conn.peer_layout;
        loop {
            let head = conn.peer_word(W_DESC_HEAD);
            let tail = conn.peer_desc_tail;
            if head == tail {
                return Ok(());
            }
            if self.staging.is_some() && self.recv_done.len() == self.recv_done.capacity() {
                // The rest waits in its staging slots for the next poll,
                // so the completion queue never grows on the data path.
                return Ok(());
            }
            if head.wrapping_sub(tail) > pl.desc_cap as u64 {
                return Err(E);
            }
            let base = pl.desc_base() + (tail % pl.desc_cap as u64) as usize * DESC_WORDS;
            let (w0, w1, seq) = {
                let w = conn.peer.words();
                (
                    w[base].load(Ordering::Relaxed),
                    w[base + 1].load(Ordering::Relaxed),
                    w[base + 2].load(Ordering::Relaxed),
                )
            };
            let kind = w0 & 0xffff_ffff;
            let byte_len = (w0 >> 32) as u32;
            let imm = w1 as u32;
            // On a shared receive queue a message stays in its staging slot
            // (and the descriptor unconsumed) until a shared receive is
            // posted; once every slot is full, the peer's next Send waits
            // as for receiver-not-ready.
            let mut shared = None;
            if let Some(st) = &self.staging {
                match st.srq.take() {
                    Some(w) => shared = Some(w),
                    None if matches!(kind, D_SEND | D_SEND_IMM | D_SEND_INV | D_WRITE_IMM) => {
                        return Ok(())
                    }
                    None => {}
                }
            }
            conn.peer_desc_tail = tail + 1;
            conn.my_words()[W_PEER_DESC_TAIL].store(tail + 1, Ordering::Release);
            conn.gave_room = true;
            let slot = if seq == conn.rq_front_seq {
                self.rq.pop_front()
            } else {
                None
            };
            let Some(mut wr) = slot else {
                give_back(&self.staging, shared);
                return Err(E);
            };
            conn.rq_front_seq += 1;
            if let Some(target) = shared {
                // `wr` is the staging slot the peer wrote; copy what it
                // says it wrote into the shared receive, then offer the
                // slot to the peer again.
                let staged = std::mem::replace(&mut wr, target);
                let in_slot = byte_len as u64 <= staged.sgl.total_len();
                if matches!(kind, D_SEND | D_SEND_IMM | D_SEND_INV)
                    && in_slot
                    && byte_len as u64 <= wr.sgl.total_len()
                {
                    let (src, sn) = local_ranges(&staged.sgl);
                    let (dst, dn) = local_ranges(&wr.sgl);
                    let src = [(src[0].0 as *const u8, byte_len as usize)];
                    // SAFETY: the slot's range is inside its live staging
                    // arena (`in_slot`, one SGE); the shared receive's
                    // SGEs were checked against their registration when
                    // posted, and it is ours until it completes.
                    unsafe { copy_sg(&src[..sn.min(1)], &dst[..dn]) };
                }
                if !in_slot || conn.publish_recv(&staged).is_err() {
                    // The peer claimed more than its slot holds.
                    self.rq.push_back(staged);
                    self.flush_recv(wr, WcStatus::LocLenErr);
                    return Err(E);
                }
                self.rq.push_back(staged);
            }
            let mut c = recv_completion(wr, qpn, WcStatus::Success, byte_len);
            let mut fatal = None;
            match kind {
                D_SEND | D_SEND_IMM | D_SEND_INV => {
                    if byte_len as u64 > c.sgl.total_len() {
                        c.status = WcStatus::LocLenErr;
                        fatal = Some(E);
                    } else {
                        set_placed(&mut c.sgl, byte_len as u64);
                    }
                    if kind == D_SEND_IMM {
                        c.imm = Some(imm);
                    }
                    if kind == D_SEND_INV {
                        if conn.invalidate(imm) {
                            c.invalidated_rkey = Some(imm);
                        } else {
                            c.status = WcStatus::LocProtErr;
                            fatal = Some(E);
                        }
                    }
                }
                D_WRITE_IMM => {
                    c.opcode = WcOpcode::RecvRdmaWithImm;
                    c.imm = Some(imm);
                    set_placed(&mut c.sgl, 0);
                }
                D_ERR_LEN => {
                    c.status = WcStatus::LocLenErr;
                    c.byte_len = 0;
                    fatal = Some(WcStatus::LocLenErr);
                }
                _ => {
                    c.status = WcStatus::WrFlushErr;
                    fatal = Some(E);
                }
            }
            self.recv_done.push_back(c);
            if let Some(f) = fatal {
                return Err(f);
            }
        }
    }

    fn exec_sq(&mut self) {
        let head = self.conn.as_ref().map(|c| c.desc_head);
        self.exec_sq_run();
        if let Some(conn) = self.conn.as_mut() {
            conn.ring_after(Some(conn.desc_head) != head);
        }
    }

    fn exec_sq_run(&mut self) {
        while self.state == QpState::Rts {
            let Some(mut wr) = self.sq.pop_front() else {
                break;
            };
            let Some(conn) = self.conn.as_mut() else {
                self.sq.push_front(wr);
                break;
            };
            match exec_one(&self.pd, conn, &self.caps, &mut self.waits, &mut wr) {
                Step::Wait => {
                    self.sq.push_front(wr);
                    break;
                }
                Step::Done(WcStatus::Success, n) => self.complete_send(wr, WcStatus::Success, n),
                Step::Done(status, _) => {
                    self.sq.push_front(wr);
                    self.enter_error(Some(status));
                    break;
                }
            }
        }
    }

    fn post_send(&mut self, wr: SendWr) -> Result<(), PostFailed<SendWr>> {
        let unknown_window = match (wr.op, self.conn.as_ref()) {
            (SendOp::Bind(b), Some(c)) => !c.keys.is_window(b.window),
            _ => false,
        };
        let invalid = (wr.inline && wr.sgl.total_len() > self.caps.max_inline as u64)
            || (wr.op.is_key_op() && !wr.sgl.is_empty())
            || unknown_window;
        let outstanding = self.sq.len() + self.send_done.len();
        let wr = check_post(wr, invalid, outstanding, self.caps.max_send_wr)?;
        if let Some(wr) = self.admit_send(wr) {
            self.sq.push_back(wr);
        }
        Ok(())
    }

    fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostFailed<RecvWr>> {
        // On a shared receive queue its receives come from that queue.
        let outstanding = self.rq.len() + self.recv_done.len();
        let wr = check_post(
            wr,
            self.staging.is_some(),
            outstanding,
            self.caps.max_recv_wr,
        )?;
        // A receive buffer is the peer's Send target (shared writable); an
        // arena sealed read-only for peers can never be that.
        if wr
            .sgl
            .iter()
            .any(|s| s.buf.arena().peer_access() == PeerAccess::ReadOnly)
        {
            return Err(PostFailed {
                error: PostError::Invalid,
                wr,
            });
        }
        let Some(wr) = self.admit_recv(wr) else {
            return Ok(());
        };
        if let Some(conn) = self.conn.as_mut() {
            if conn.publish_recv(&wr).is_err() {
                self.rq.push_back(wr);
                self.enter_error(None);
                return Ok(());
            }
        }
        self.rq.push_back(wr);
        Ok(())
    }
}

/// How long a Send may wait for room in the peer's descriptor ring
/// (the peer not consuming at all) before it fails with `RetryExcErr`:
/// in IB terms the transport timeout times the retry count, here a fixed
/// budget far above any scheduling delay of a live peer.
pub const PEER_STALL_TIMEOUT: Duration = Duration::from_secs(2);

/// Since when the head of a send queue has been waiting, and for what.
#[derive(Debug, Default)]
struct SendWaits {
    /// For a receive at the peer (RNR).
    rnr_since: Option<Instant>,
    /// For room in the peer's descriptor ring.
    stall_since: Option<Instant>,
}

fn exec_one(
    pd: &PdInner,
    conn: &mut Conn,
    caps: &QpCaps,
    waits: &mut SendWaits,
    wr: &mut SendWr,
) -> Step {
    let need_local = if matches!(wr.op, SendOp::Read(_)) {
        Access::LOCAL_WRITE
    } else {
        Access::NONE
    };
    if !wr.sgl.iter().all(|s| pd.check_local(s, need_local)) {
        return Step::Done(WcStatus::LocProtErr, 0);
    }
    let total = wr.sgl.total_len();
    if total > u32::MAX as u64 {
        return Step::Done(WcStatus::LocLenErr, 0);
    }
    let (local, n) = local_ranges(&wr.sgl);
    let done = |r: Result<u32, WcStatus>| match r {
        Ok(len) => Step::Done(WcStatus::Success, len),
        Err(st) => Step::Done(st, 0),
    };
    match wr.op {
        SendOp::LocalInv(rkey) => {
            if conn.invalidate(rkey) {
                Step::Done(WcStatus::Success, 0)
            } else {
                Step::Done(WcStatus::LocProtErr, 0)
            }
        }
        SendOp::Bind(b) => {
            if conn.bind(&b, &pd.mrs) {
                Step::Done(WcStatus::Success, 0)
            } else {
                Step::Done(WcStatus::MwBindErr, 0)
            }
        }
        SendOp::Write(ra) => done(conn.remote(ra, total, Access::REMOTE_WRITE).map(|dst| {
            // SAFETY: local ranges validated against live registrations; the
            // remote range validated against our mapping of the peer region.
            unsafe { copy_sg(&as_src(&local[..n])[..n], &[(dst, total as usize)]) };
            total as u32
        })),
        SendOp::Read(ra) => done(conn.remote(ra, total, Access::REMOTE_READ).map(|src| {
            // SAFETY: as for Write, with the local side needing LOCAL_WRITE
            // (checked above).
            unsafe { copy_sg(&[(src as *const u8, total as usize)], &local[..n]) };
            set_placed(&mut wr.sgl, total);
            total as u32
        })),
        SendOp::Send
        | SendOp::SendWithImm(_)
        | SendOp::SendWithInv(_)
        | SendOp::WriteWithImm(..) => {
            if !conn.desc_space() {
                // The peer takes none of our descriptors: as an RC
                // transport whose peer stops acknowledging, give up after
                // the retry budget, with the status IB gives then.
                let now = Instant::now();
                let since = *waits.stall_since.get_or_insert(now);
                if now.duration_since(since) > PEER_STALL_TIMEOUT {
                    waits.stall_since = None;
                    return Step::Done(WcStatus::RetryExcErr, 0);
                }
                return Step::Wait;
            }
            waits.stall_since = None;
            let rnr_since = &mut waits.rnr_since;
            match conn.peer_recvs() {
                Err(st) => return Step::Done(st, 0),
                Ok(0) => {
                    let now = Instant::now();
                    let since = *rnr_since.get_or_insert(now);
                    let budget = caps.rnr_timer * (caps.rnr_retry as u32 + 1);
                    if caps.rnr_retry < 7 && now.duration_since(since) > budget {
                        *rnr_since = None;
                        return Step::Done(WcStatus::RnrRetryExcErr, 0);
                    }
                    return Step::Wait;
                }
                Ok(_) => *rnr_since = None,
            }
            let seq = conn.peer_recv_tail;
            let (kind, imm) = match wr.op {
                SendOp::WriteWithImm(ra, imm) => {
                    let dst = match conn.remote(ra, total, Access::REMOTE_WRITE) {
                        Ok(d) => d,
                        Err(st) => return Step::Done(st, 0),
                    };
                    // SAFETY: as for Write.
                    unsafe { copy_sg(&as_src(&local[..n])[..n], &[(dst, total as usize)]) };
                    (D_WRITE_IMM, imm)
                }
                op => {
                    let (dst, m, room) = match conn.peer_recv_ranges() {
                        Ok(r) => r,
                        Err(st) => return Step::Done(st, 0),
                    };
                    if total > room {
                        conn.publish(D_ERR_LEN, 0, 0, seq);
                        conn.peer_recv_tail += 1;
                        return Step::Done(WcStatus::RemInvReqErr, 0);
                    }
                    // SAFETY: local ranges validated against live
                    // registrations; destination ranges validated against
                    // our writable mappings of the peer's regions.
                    unsafe { copy_sg(&as_src(&local[..n])[..n], &dst[..m]) };
                    match op {
                        SendOp::SendWithImm(imm) => (D_SEND_IMM, imm),
                        SendOp::SendWithInv(rkey) => (D_SEND_INV, rkey),
                        _ => (D_SEND, 0),
                    }
                }
            };
            conn.publish(kind, total as u32, imm, seq);
            conn.peer_recv_tail += 1;
            Step::Done(WcStatus::Success, total as u32)
        }
    }
}

impl ShmPreparedQp {
    /// Binds the connection and publishes pre-posted receives.
    fn finish(
        self,
        sock: OwnedFd,
        mine: Arena,
        peer: Mapping,
        peer_layout: Layout,
        fault_count: Option<Arc<AtomicU64>>,
        uid_slot: Option<UidSlot>,
    ) -> ShmQp {
        let shared = self.shared.clone();
        {
            let mut inner = lock(&shared.inner);
            let mut conn = Conn {
                _bell: None,
                sock,
                mine,
                layout: inner.layout,
                peer,
                peer_layout,
                desc_head: 0,
                peer_desc_tail: 0,
                recv_head: 0,
                rq_front_seq: 0,
                peer_recv_tail: 0,
                peer_recv_head_seen: 0,
                peer_desc_tail_seen: 0,
                out_regions: Vec::new(),
                in_regions: Vec::new(),
                in_mapped: 0,
                keys: KeySlots::new(),
                guard_seen: 0,
                fault_count,
                _uid_slot: uid_slot,
                peer_rings: false,
                sleeping: false,
                gave_room: false,
                cmsg: Msg::cmsg_buffer(),
            };
            // A peer whose outbox has the features word set sends
            // `M_RING` while we sleep and understands ours; one that
            // predates it has 0 there and is left alone (it never rings:
            // our sleep ends at its timeout for it, or on a hang-up).
            conn.peer_rings =
                conn.peer.words()[W_FEATURES].load(Ordering::Relaxed) & FEATURE_DOORBELL != 0;
            // The socket wakes a sleeping poller of the receive CQ: a
            // ring, a region, a hang-up. Without it (no room for another
            // epoll member) the connection still works, on the timeout.
            let fd = conn.sock.as_raw_fd();
            if shared.recv_bells.add(fd, u64::from(shared.qpn)).is_ok() {
                conn._bell = Some(BellMember {
                    set: shared.recv_bells.clone(),
                    fd,
                });
            }
            let ok = inner.rq.iter().all(|wr| conn.publish_recv(wr).is_ok());
            inner.conn = Some(conn);
            inner.state = QpState::Rts;
            if !ok {
                inner.enter_error(None);
            }
        }
        drop(self);
        ShmQp { shared }
    }
}

impl PreparedQp<Shm> for ShmPreparedQp {
    fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostFailed<RecvWr>> {
        lock(&self.shared.inner).post_recv(wr)
    }

    fn connect(
        self,
        url: &str,
        private_data: &[u8],
        timeout: Duration,
    ) -> Result<(ShmQp, Vec<u8>), VerbsError> {
        let path = socket_path(url)?;
        let sock = setup_socket(SockFlag::empty())?;
        let addr = UnixAddr::new(&path).map_err(os("socket address"))?;
        let deadline = Instant::now() + timeout;
        loop {
            match connect(sock.as_raw_fd(), &addr) {
                Ok(()) => break,
                // Listener backlog full: retry until the deadline.
                Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR)
                    if Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(1))
                }
                Err(source) => {
                    return Err(VerbsError::Os {
                        what: "connect",
                        source,
                    })
                }
            }
        }
        let layout = lock(&self.shared.inner).layout;
        let mine = new_outbox(layout)?;
        Msg::new(
            M_HELLO,
            [VERSION, layout.desc_cap, layout.rq_cap, layout.key_cap],
            private_data,
        )?
        // Sealed read-only for peers by `new_outbox`.
        .send(sock.as_fd(), Some(mine.fd()))?;
        let reply = Msg::recv_timeout(
            sock.as_fd(),
            deadline.saturating_duration_since(Instant::now()),
        )?;
        match reply.kind {
            M_ACCEPT => {}
            M_REJECT => {
                return Err(VerbsError::Rejected {
                    private_data: reply.private_data().to_vec(),
                })
            }
            _ => return Err(VerbsError::Protocol("unexpected reply to HELLO")),
        }
        let peer_data = reply.private_data().to_vec();
        let (peer, peer_layout) = map_peer_outbox(reply.fd, reply.args)?;
        Ok((
            self.finish(sock, mine, peer, peer_layout, None, None),
            peer_data,
        ))
    }
}

/// How long an accepted connection may take to send its HELLO.
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(5);

/// Accepted connections waiting for their HELLO at once. When full, the
/// one that has waited longest is closed (a client sends its HELLO right
/// after connecting, so the oldest is the likeliest to be silent), and a
/// newcomer gets its place.
pub const MAX_PENDING_SETUPS: usize = 64;

/// Passive side of connection setup: a listening Unix socket.
///
/// Setup costs a peer nothing it can hold on to: its credentials are
/// checked right after `accept` (a peer whose uid is not allowed is
/// refused before anything is read), and connections waiting for their
/// HELLO wait together, each with its own deadline
/// ([`SETUP_TIMEOUT`]), in a bounded set ([`MAX_PENDING_SETUPS`]), so a
/// silent peer never delays another.
#[derive(Debug)]
pub struct ShmListener {
    sock: OwnedFd,
    path: PathBuf,
    allowed: Mutex<Vec<u32>>,
    pending: Mutex<VecDeque<PendingSetup>>,
    /// Connections it accepted that ended because a peer's hole in
    /// shared writable memory faulted ([`guard`]).
    peer_memory_faults: Arc<AtomicU64>,
    /// Live connections per peer uid, and their limit.
    uids: Arc<UidCounts>,
}

/// Live connections of one listener per peer uid, from the accept that
/// passed the allow-list (setups waiting for their HELLO count) until the
/// connection is released (error, disconnect or drop). Opens and closes
/// are per connection, so one mutex over a map is cheap enough; the map
/// holds only uids with live connections.
#[derive(Debug, Default)]
struct UidCounts {
    /// Most connections per uid; 0: no limit.
    limit: AtomicU32,
    live: Mutex<std::collections::HashMap<u32, u32>>,
}

impl UidCounts {
    /// Counts a connection of `uid` in, unless it has `limit` already
    /// (then `Err(limit)`).
    fn try_add(self: &Arc<Self>, uid: u32) -> Result<UidSlot, u32> {
        let limit = self.limit.load(Ordering::Relaxed);
        let mut live = lock(&self.live);
        let n = live.entry(uid).or_insert(0);
        if limit > 0 && *n >= limit {
            return Err(limit);
        }
        *n += 1;
        Ok(UidSlot {
            counts: self.clone(),
            uid,
        })
    }

    fn count(&self, uid: u32) -> u32 {
        lock(&self.live).get(&uid).copied().unwrap_or(0)
    }
}

/// One connection counted against its uid; counted out when dropped.
#[derive(Debug)]
struct UidSlot {
    counts: Arc<UidCounts>,
    uid: u32,
}

impl Drop for UidSlot {
    fn drop(&mut self) {
        let mut live = lock(&self.counts.live);
        if let Some(n) = live.get_mut(&self.uid) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                live.remove(&self.uid);
            }
        }
    }
}

/// An accepted connection before its HELLO.
#[derive(Debug)]
struct PendingSetup {
    sock: OwnedFd,
    uid: u32,
    deadline: Instant,
    /// Its uid is not allowed: it was sent its REJECT at once and is kept
    /// only until its HELLO is read (closing a socket with unread data
    /// would turn the REJECT into a connection reset at the peer).
    refused: bool,
    /// Its place among its uid's connections (none when refused).
    slot: Option<UidSlot>,
}

impl ShmListener {
    /// Replaces the uid allow-list (default: this process's uid).
    pub fn allow_uids(&self, uids: &[u32]) {
        *lock(&self.allowed) = uids.to_vec();
    }
    /// The socket path.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Caps the connections one peer uid may have through this listener
    /// at once (setups waiting for their HELLO included; 0: no cap, the
    /// default). A connection past it is refused at accept, before it
    /// says anything, with [`VerbsError::PeerLimit`]; a connection counts
    /// out when it is released (error, disconnect or drop), so a close
    /// makes room. Takes effect for the next accept; connections already
    /// open stay.
    pub fn limit_per_uid(&self, limit: u32) {
        self.uids.limit.store(limit, Ordering::Relaxed);
    }

    /// Live connections of `uid` through this listener (setups waiting
    /// for their HELLO included).
    pub fn connections_of_uid(&self, uid: u32) -> u32 {
        self.uids.count(uid)
    }

    /// Connections accepted here that were ended because their peer
    /// punched a hole in memory shared writable and touching it faulted
    /// (the SIGBUS guard, [`crate::mem::guard`]), so far.
    pub fn peer_memory_faults(&self) -> u64 {
        self.peer_memory_faults.load(Ordering::Relaxed)
    }
}

impl Drop for ShmListener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Listener<Shm> for ShmListener {
    fn accept(&self, timeout: Duration) -> Result<ShmIncoming, VerbsError> {
        let deadline = Instant::now() + timeout;
        let mut pending = lock(&self.pending);
        loop {
            // New connections first: their credentials cost one getsockopt.
            loop {
                let raw = match accept4(self.sock.as_raw_fd(), SockFlag::SOCK_CLOEXEC) {
                    Ok(fd) => fd,
                    Err(nix::errno::Errno::EAGAIN) => break,
                    Err(nix::errno::Errno::EINTR | nix::errno::Errno::ECONNABORTED) => continue,
                    Err(source) => {
                        return Err(VerbsError::Os {
                            what: "accept",
                            source,
                        })
                    }
                };
                // SAFETY: accept4 returned a new fd that nothing else owns.
                let sock = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) };
                let uid = getsockopt(&sock, PeerCredentials)
                    .map_err(os("SO_PEERCRED"))?
                    .uid();
                let (slot, refusal) = if !lock(&self.allowed).contains(&uid) {
                    (None, Some(VerbsError::PeerNotAllowed { uid }))
                } else {
                    match self.uids.try_add(uid) {
                        Ok(slot) => (Some(slot), None),
                        Err(limit) => (None, Some(VerbsError::PeerLimit { uid, limit })),
                    }
                };
                let refused = refusal.is_some();
                if let Some(refusal) = refusal {
                    let _ =
                        Msg::new(M_REJECT, [0; 4], &[]).and_then(|m| m.send(sock.as_fd(), None));
                    if matches!(Msg::recv(sock.as_fd()), Ok(Some(_))) {
                        // Its HELLO was there (its outbox fd closes with
                        // it): nothing left to wait for.
                        return Err(refusal);
                    }
                    // Kept until its HELLO is read (see `PendingSetup`).
                    if pending.len() >= MAX_PENDING_SETUPS {
                        pending.pop_front();
                    }
                    pending.push_back(PendingSetup {
                        sock,
                        uid,
                        deadline: Instant::now() + SETUP_TIMEOUT,
                        refused,
                        slot,
                    });
                    return Err(refusal);
                }
                let evicted = (pending.len() >= MAX_PENDING_SETUPS)
                    .then(|| pending.pop_front())
                    .flatten();
                pending.push_back(PendingSetup {
                    sock,
                    uid,
                    deadline: Instant::now() + SETUP_TIMEOUT,
                    refused,
                    slot,
                });
                if evicted.is_some_and(|e| !e.refused) {
                    return Err(VerbsError::SetupTimeout);
                }
            }
            // Then every connection waiting for its HELLO.
            let now = Instant::now();
            let mut i = 0;
            while i < pending.len() {
                let refused = pending[i].refused;
                match (Msg::recv(pending[i].sock.as_fd()), refused) {
                    (Ok(None), _) if now < pending[i].deadline => i += 1,
                    (Ok(Some(hello)), false) => {
                        if let Some(p) = pending.remove(i) {
                            return setup(p, hello, &self.peer_memory_faults);
                        }
                    }
                    // A refused peer's HELLO, end or timeout: it was
                    // counted when refused.
                    (_, true) => {
                        pending.remove(i);
                    }
                    (Ok(None), false) => {
                        pending.remove(i);
                        return Err(VerbsError::SetupTimeout);
                    }
                    (Err(e), false) => {
                        pending.remove(i);
                        return Err(e);
                    }
                }
            }
            let left = deadline.saturating_duration_since(now);
            if left.is_zero() {
                return Err(VerbsError::Timeout);
            }
            let next_expiry = pending
                .iter()
                .map(|p| p.deadline.saturating_duration_since(now))
                .min()
                .unwrap_or(left);
            wait_any_readable(
                std::iter::once(self.sock.as_fd()).chain(pending.iter().map(|p| p.sock.as_fd())),
                left.min(next_expiry),
            )?;
        }
    }
}

/// The HELLO of an allowed connection: the peer's outbox mapped.
fn setup(
    p: PendingSetup,
    hello: Msg,
    fault_count: &Arc<AtomicU64>,
) -> Result<ShmIncoming, VerbsError> {
    if hello.kind != M_HELLO {
        return Err(VerbsError::Protocol("expected HELLO"));
    }
    let private_data = hello.private_data().to_vec();
    let (peer, peer_layout) = map_peer_outbox(hello.fd, hello.args)?;
    Ok(ShmIncoming {
        sock: p.sock,
        uid: p.uid,
        peer,
        peer_layout,
        private_data,
        fault_count: fault_count.clone(),
        uid_slot: p.slot,
    })
}

/// A connection request that passed the uid check.
#[derive(Debug)]
pub struct ShmIncoming {
    sock: OwnedFd,
    uid: u32,
    peer: Mapping,
    peer_layout: Layout,
    private_data: Vec<u8>,
    fault_count: Arc<AtomicU64>,
    uid_slot: Option<UidSlot>,
}

impl ShmIncoming {
    /// The requester's uid (SO_PEERCRED).
    pub fn peer_uid(&self) -> u32 {
        self.uid
    }
}

impl Incoming<Shm> for ShmIncoming {
    fn private_data(&self) -> &[u8] {
        &self.private_data
    }

    /// The requester's uid (tagged 1 in the high half): same host, so the
    /// uid is who it is.
    fn peer_identity(&self) -> u64 {
        (1 << 32) | u64::from(self.uid)
    }

    fn accept(self, qp: ShmPreparedQp, private_data: &[u8]) -> Result<ShmQp, VerbsError> {
        let layout = lock(&qp.shared.inner).layout;
        let mine = new_outbox(layout)?;
        Msg::new(
            M_ACCEPT,
            [VERSION, layout.desc_cap, layout.rq_cap, layout.key_cap],
            private_data,
        )?
        // Sealed read-only for peers by `new_outbox`.
        .send(self.sock.as_fd(), Some(mine.fd()))?;
        Ok(qp.finish(
            self.sock,
            mine,
            self.peer,
            self.peer_layout,
            Some(self.fault_count),
            self.uid_slot,
        ))
    }

    fn reject(self, private_data: &[u8]) -> Result<(), VerbsError> {
        Msg::new(M_REJECT, [0; 4], private_data)?.send(self.sock.as_fd(), None)
    }
}

impl QueuePair<Shm> for ShmQp {
    fn qp_num(&self) -> u32 {
        self.shared.qpn
    }

    fn state(&self) -> QpState {
        lock(&self.shared.inner).state
    }

    fn peer_disconnected(&self) -> bool {
        lock(&self.shared.inner).peer_closed
    }

    fn post_send(&mut self, wr: SendWr) -> Result<(), PostFailed<SendWr>> {
        let mut inner = lock(&self.shared.inner);
        inner.post_send(wr)?;
        inner.exec_sq();
        Ok(())
    }

    fn post_send_list<I: Iterator<Item = SendWr>>(
        &mut self,
        wrs: &mut I,
    ) -> Result<usize, PostFailed<SendWr>> {
        let mut inner = lock(&self.shared.inner);
        let mut n = 0;
        let mut res = Ok(());
        for wr in wrs.by_ref() {
            if let Err(e) = inner.post_send(wr) {
                res = Err(e);
                break;
            }
            n += 1;
        }
        inner.exec_sq();
        res.map(|()| n)
    }

    fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostFailed<RecvWr>> {
        lock(&self.shared.inner).post_recv(wr)
    }

    fn expose(&mut self, mr: &ShmMr) -> Result<RemoteKey, VerbsError> {
        let mut inner = lock(&self.shared.inner);
        mr.check_exposable(&inner.pd.mrs)?;
        let conn = inner.conn.as_mut().ok_or(VerbsError::NotConnected)?;
        conn.expose(&mr.info)
    }

    /// A slot of this connection's key table (256, shared with `expose`):
    /// the slot is the rkey's low byte, the upper 24 bits the consumer's.
    fn alloc_window(&mut self) -> Result<Window, VerbsError> {
        let mut inner = lock(&self.shared.inner);
        let conn = inner.conn.as_mut().ok_or(VerbsError::NotConnected)?;
        conn.keys.alloc_window()
    }

    fn disconnect(&mut self) {
        let mut inner = lock(&self.shared.inner);
        if let Some(conn) = inner.conn.as_ref() {
            conn.set_flag(FLAG_CLOSED);
        }
        inner.enter_error(None);
    }
}
