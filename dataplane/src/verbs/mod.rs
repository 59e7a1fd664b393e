//! The provider-neutral verbs API.
//!
//! It mirrors ibverbs closely enough that a real HCA maps onto it one to
//! one: a device context opened from an address URL, a protection domain,
//! memory regions with access flags and lkey/rkey, completion queues polled
//! in batches into a caller slice, and reliable-connected queue pairs with a
//! send queue (Send, Send with Immediate, Send with Invalidate, RDMA Write,
//! RDMA Write with Immediate, RDMA Read, Local Invalidate; SGE lists;
//! signaled/unsignaled; inline) and a receive queue. Errors complete like
//! hardware: the failing work request completes with an error status, the
//! queue pair moves to [`QpState::Error`], and everything still queued
//! completes with [`WcStatus::WrFlushErr`], in order.
//!
//! Differences from raw ibverbs, on purpose:
//! * A work request owns its buffers: each scatter/gather element carries a
//!   [`Buf`] (moved in on post, handed back in the [`Completion`]); the
//!   compiler, not a comment, prevents reuse of memory still in flight.
//!   Unsignaled work requests give their buffers back to the slab (drop)
//!   when they retire.
//! * Work-request ids are typed ([`WrId`]).
//! * Remote access is granted per connection with [`QueuePair::expose`]
//!   (think of a type 2 memory window bound to the QP): the returned
//!   [`RemoteKey`] is valid on that connection only, until invalidated
//!   locally ([`SendOp::LocalInv`]) or remotely ([`SendOp::SendWithInv`]).
//!   Per exchange, a [`Window`] ([`QueuePair::alloc_window`]) is bound by
//!   a work request ([`SendOp::Bind`]) over exactly the exchange's bytes,
//!   under an rkey the consumer chooses ([`Window::rkey`]), so a sans-IO
//!   engine knows the key when it marshals a header, before the bind has
//!   executed.
//! * Connection setup is a listener/connector pair carrying private data
//!   (as rdma_cm does; RFC 8797 data rides on it).
//!
//! Everything on the hot path is statically dispatched: providers implement
//! the traits below with associated types; no `dyn`, no heap allocation per
//! work request.
// Posts hand a refused work request back by value (`PostFailed<W>`), a
// ~180-byte `Err`: boxing it would put a heap allocation on the
// queue-full path, which is a normal back-pressure event on the data path.
#![allow(clippy::result_large_err)]

use std::os::fd::BorrowedFd;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::mem::{Arena, Buf, WrId};

#[cfg(feature = "ibverbs")]
pub mod ibverbs;
mod random;
pub mod roce;
pub mod shm;
mod soft_mr;
mod soft_qp;
mod soft_srq;
pub use soft_mr::SoftMr;
pub use soft_srq::SoftSrqHandle;

/// Locks a software provider's state. A panic while it was held leaves
/// the state consistent enough to flush and report, so the poison is
/// taken over rather than spreading the panic to every thread of the
/// process.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Most scatter/gather elements in one work request: two, what the
/// message path uses at most (a header and the payload it sends from
/// where it lies). Every work request and completion carries its list by
/// value, so this bound is what each post and each poll moves: four made
/// a completion 176 bytes and a Send 192, two make them 104 and 120, and
/// the shm message rate rose by about a tenth (docs/VERBS.md).
pub const MAX_SGE: usize = 2;
/// Most bytes of connection private data (the IB CM REQ limit for rdma_cm
/// users is 56; RFC 8797 needs 8; we allow a little more).
pub const MAX_PRIVATE_DATA: usize = 196;

/// Memory-region access flags.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(u32);

impl Access {
    /// No remote access, local read only.
    pub const NONE: Access = Access(0);
    /// The local HCA may write (receives, RDMA Read destinations).
    pub const LOCAL_WRITE: Access = Access(1);
    /// Peers may RDMA Write.
    pub const REMOTE_WRITE: Access = Access(2);
    /// Peers may RDMA Read.
    pub const REMOTE_READ: Access = Access(4);
    /// Raw bits.
    pub const fn bits(self) -> u32 {
        self.0
    }
    /// From raw bits (unknown bits dropped).
    pub const fn from_bits_truncate(bits: u32) -> Access {
        Access(bits & 7)
    }
    /// Whether all of `other` is set.
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Access({}{}{})",
            if self.contains(Access::LOCAL_WRITE) {
                "LW"
            } else {
                ""
            },
            if self.contains(Access::REMOTE_WRITE) {
                "RW"
            } else {
                ""
            },
            if self.contains(Access::REMOTE_READ) {
                "RR"
            } else {
                ""
            }
        )
    }
}

/// A peer's memory as named in RDMA operations: the owner's virtual address
/// and the rkey it handed out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RemoteKey {
    /// Owner-side virtual address of the first byte.
    pub addr: u64,
    /// Remote key.
    pub rkey: u32,
    /// Length of the exposed range.
    pub len: u64,
}

impl RemoteKey {
    /// The address `offset` bytes into the range, with the same rkey.
    pub fn at(&self, offset: u64) -> RemoteAddr {
        RemoteAddr {
            addr: self.addr.wrapping_add(offset),
            rkey: self.rkey,
        }
    }
}

/// Target of an RDMA Write or Read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RemoteAddr {
    /// Owner-side virtual address.
    pub addr: u64,
    /// Remote key.
    pub rkey: u32,
}

/// One scatter/gather element: `len` bytes at `offset` in an owned buffer.
#[derive(Debug)]
pub struct Sge {
    /// The buffer (moved in on post, handed back by the completion).
    pub buf: Buf,
    /// Byte offset into the buffer.
    pub offset: u32,
    /// Length in bytes.
    pub len: u32,
}

impl Sge {
    /// The buffer's valid bytes (`0..buf.len()`), for sends and writes.
    pub fn data(buf: Buf) -> Sge {
        let len = buf.len();
        Sge {
            buf,
            offset: 0,
            len,
        }
    }
    /// The buffer's whole capacity, for receives and reads.
    pub fn whole(buf: Buf) -> Sge {
        let len = buf.capacity();
        Sge {
            buf,
            offset: 0,
            len,
        }
    }
    /// Address of the first byte.
    pub fn addr(&self) -> u64 {
        self.buf.addr().wrapping_add(self.offset as u64)
    }
    /// Whether `offset + len` stays inside the buffer.
    pub fn in_bounds(&self) -> bool {
        (self.offset as u64 + self.len as u64) <= self.buf.capacity() as u64
    }
}

/// A fixed-capacity scatter/gather list (no heap). Its elements are the
/// leading `Some`s of the array (no count beside them: the list is moved
/// with every work request and completion, and a count would cost it
/// another eight bytes of padding).
#[derive(Debug, Default)]
pub struct SgeList {
    sges: [Option<Sge>; MAX_SGE],
}

impl SgeList {
    /// An empty list.
    pub const fn new() -> SgeList {
        SgeList {
            sges: [const { None }; MAX_SGE],
        }
    }
    /// A list of one element.
    pub fn one(sge: Sge) -> SgeList {
        let mut l = SgeList::new();
        l.sges[0] = Some(sge);
        l
    }
    /// Appends; gives the element back if the list is full.
    pub fn push(&mut self, sge: Sge) -> Result<(), Sge> {
        match self.sges.iter_mut().find(|s| s.is_none()) {
            Some(free) => {
                *free = Some(sge);
                Ok(())
            }
            None => Err(sge),
        }
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.iter().count()
    }
    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.sges[0].is_none()
    }
    /// Sum of element lengths.
    pub fn total_len(&self) -> u64 {
        self.iter().map(|s| s.len as u64).sum()
    }
    /// The elements in order.
    pub fn iter(&self) -> impl Iterator<Item = &Sge> {
        self.sges.iter().map_while(Option::as_ref)
    }
    /// The elements in order, mutably.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut Sge> {
        self.sges.iter_mut().map_while(Option::as_mut)
    }
    /// Removes and returns the first buffer (the common single-SGE case);
    /// the others go back to their slabs.
    pub fn take_first(&mut self) -> Option<Buf> {
        self.take_all().next()
    }
    /// Removes all elements, yielding their buffers in order (those not
    /// taken from the iterator go back to their slabs when it drops).
    pub fn take_all(&mut self) -> impl Iterator<Item = Buf> {
        std::mem::take(&mut self.sges)
            .into_iter()
            .map_while(|s| s.map(|s| s.buf))
    }
}

/// What a send-queue work request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    /// Two-sided send into the peer's next posted receive.
    Send,
    /// Send carrying 32 bits of immediate data.
    SendWithImm(u32),
    /// Send that also invalidates the given rkey of the receiver's.
    SendWithInv(u32),
    /// One-sided write of the SGE list to the peer's memory.
    Write(RemoteAddr),
    /// Write that also consumes a receive at the peer and reports `imm`.
    WriteWithImm(RemoteAddr, u32),
    /// One-sided read of the peer's memory into the SGE list.
    Read(RemoteAddr),
    /// Invalidates one of our own rkeys (no SGEs).
    LocalInv(u32),
    /// Binds a memory window of this queue pair (no SGEs); executes in
    /// send-queue order, so the key is live for every later work request
    /// of this queue pair (a Send posted after it included).
    Bind(BindWindow),
}

impl SendOp {
    /// Whether the operation works on this side's keys only and carries
    /// no SGEs (local invalidate, window bind).
    pub fn is_key_op(&self) -> bool {
        matches!(self, SendOp::LocalInv(_) | SendOp::Bind(_))
    }
    /// The opcode of its completion.
    pub fn wc_opcode(&self) -> WcOpcode {
        match self {
            SendOp::Send | SendOp::SendWithImm(_) | SendOp::SendWithInv(_) => WcOpcode::Send,
            SendOp::Write(_) | SendOp::WriteWithImm(..) => WcOpcode::RdmaWrite,
            SendOp::Read(_) => WcOpcode::RdmaRead,
            SendOp::LocalInv(_) => WcOpcode::LocalInv,
            SendOp::Bind(_) => WcOpcode::Bind,
        }
    }
}

/// A memory window: a key slot of one queue pair
/// ([`QueuePair::alloc_window`]) that a [`SendOp::Bind`] binds over a
/// byte range of a memory region under an rkey the consumer chooses, and
/// that [`SendOp::LocalInv`] or the peer's [`SendOp::SendWithInv`]
/// invalidates. It dies with its queue pair.
///
/// The rkey is the window's `fixed` bits where `mask` is clear and the
/// consumer's tag where it is set: the provider owns the bits that find
/// the window (its slot or the HCA's index), the consumer owns the key
/// that tells one binding of it from the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    index: u32,
    fixed: u32,
    mask: u32,
    /// The key the window holds now, which its next bind must not reuse
    /// (0: none known).
    held: u32,
}

impl Window {
    /// A window handle (providers only).
    pub(crate) fn new(index: u32, fixed: u32, mask: u32) -> Window {
        debug_assert!(mask != 0, "a window needs key bits");
        Window {
            index,
            fixed,
            mask,
            held: 0,
        }
    }

    /// This window holding `rkey`: the key it was allocated with (a type 2
    /// window of an HCA comes with one) or last bound under.
    pub fn holding(self, rkey: u32) -> Window {
        Window { held: rkey, ..self }
    }

    /// The key the window holds now, as far as this handle knows (0: none):
    /// a bind under it is refused (see [`BindWindow`]).
    pub fn held(&self) -> u32 {
        self.held
    }

    /// The rkey for `tag` ([`Window::rkey`]), stepped on
    /// ([`Window::next_rkey`]) past the key the window holds and past
    /// every key in `also`: a key its next bind may use.
    pub fn rkey_unlike(&self, tag: u32, also: &[u32]) -> u32 {
        let mut rkey = self.rkey(tag);
        for _ in 0..=also.len() {
            if rkey != self.held && !also.contains(&rkey) {
                break;
            }
            rkey = self.next_rkey(rkey);
        }
        rkey
    }
    /// Index of the window in its queue pair (what [`BindWindow::window`]
    /// names).
    pub fn index(&self) -> u32 {
        self.index
    }
    /// The provider's bits of every rkey of this window (where `mask` is
    /// clear).
    pub fn fixed(&self) -> u32 {
        self.fixed & !self.mask
    }
    /// The bits of an rkey the consumer chooses.
    pub fn mask(&self) -> u32 {
        self.mask
    }
    /// The rkey for `tag`: `(fixed & !mask) | (tag & mask)`. Never 0 (the
    /// value every provider treats as no key): should the fixed bits be
    /// all clear and the tag's masked bits too, the lowest mask bit is set
    /// instead, so tag 0 and that bit then name the same key.
    pub fn rkey(&self, tag: u32) -> u32 {
        let r = self.fixed() | (tag & self.mask);
        if r == 0 {
            self.mask & self.mask.wrapping_neg()
        } else {
            r
        }
    }
    /// The rkey after `rkey` when the tag counts up by one in the mask's
    /// bits (the mask is one run of bits in every provider): a fresh key
    /// per exchange without knowing where the provider put the tag.
    pub fn next_rkey(&self, rkey: u32) -> u32 {
        let step = self.mask & self.mask.wrapping_neg();
        self.rkey((rkey & self.mask).wrapping_add(step))
    }
    /// Whether `rkey` could be one of this window's keys (fixed bits
    /// match, not 0).
    pub fn owns(&self, rkey: u32) -> bool {
        rkey != 0 && rkey & !self.mask == self.fixed()
    }
    /// A bind of this window under `rkey` over `len` bytes at `addr` of
    /// the region with local key `lkey`, granting `access`.
    pub fn bind(&self, rkey: u32, lkey: u32, addr: u64, len: u64, access: Access) -> BindWindow {
        BindWindow {
            window: self.index,
            rkey,
            lkey,
            addr,
            len,
            access,
        }
    }
}

/// What a [`SendOp::Bind`] binds.
///
/// Valid when: `window` is a window of this queue pair that is not bound
/// (type 2 windows must be invalidated before they are bound again);
/// `rkey` is one of its keys ([`Window::owns`]) and not the key it was
/// last bound under (for a type 2 window of an HCA never bound yet: the
/// key it was allocated with); `lkey` names a live region of the queue pair's
/// protection domain; `addr..addr + len` lies inside it and `len` is not
/// 0 (as for IB type 2 windows, a zero-length bind is refused); `access`
/// is `REMOTE_READ` and/or `REMOTE_WRITE`, each also granted by the
/// region. Otherwise the bind completes with [`WcStatus::MwBindErr`] and
/// the queue pair moves to the error state. A window index the queue
/// pair never allocated is a malformed request ([`PostError::Invalid`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BindWindow {
    /// [`Window::index`].
    pub window: u32,
    /// The key to bind under ([`Window::rkey`]).
    pub rkey: u32,
    /// Local key of the memory region the window lies in.
    pub lkey: u32,
    /// Address of the first byte granted.
    pub addr: u64,
    /// Bytes granted.
    pub len: u64,
    /// `REMOTE_READ` and/or `REMOTE_WRITE`.
    pub access: Access,
}

impl BindWindow {
    /// The key the peer uses, as advertised.
    pub fn remote_key(&self) -> RemoteKey {
        RemoteKey {
            addr: self.addr,
            rkey: self.rkey,
            len: self.len,
        }
    }
}

/// The checks of a [`BindWindow`] against the window's key bits and the
/// region it names (`mr_addr`, `mr_len`, `mr_access`) that every provider
/// applies (the window's own state is the provider's to check): one of
/// the window's keys, a non-empty range inside the region, remote rights
/// the region also grants.
pub(crate) fn bind_ok(
    b: &BindWindow,
    w: &Window,
    mr_addr: u64,
    mr_len: u64,
    mr_access: Access,
) -> bool {
    let remote = Access::REMOTE_READ | Access::REMOTE_WRITE;
    let rights = b.access.bits();
    w.owns(b.rkey)
        && b.len > 0
        && b.addr >= mr_addr
        && b.addr
            .checked_add(b.len)
            .is_some_and(|end| end <= mr_addr.saturating_add(mr_len))
        && rights != 0
        && rights & !remote.bits() == 0
        && mr_access.contains(b.access)
}

/// A send-queue work request.
#[derive(Debug)]
pub struct SendWr {
    /// Returned in the completion.
    pub wr_id: WrId,
    /// The operation.
    pub op: SendOp,
    /// Local buffers (gathered for Send/Write, scattered into for Read).
    pub sgl: SgeList,
    /// Generate a completion on success (errors always complete).
    pub signaled: bool,
    /// Ask for inline data (must fit `QpCaps::max_inline`).
    pub inline: bool,
}

impl SendWr {
    /// A signaled, non-inline work request.
    pub fn new(wr_id: WrId, op: SendOp, sgl: SgeList) -> SendWr {
        SendWr {
            wr_id,
            op,
            sgl,
            signaled: true,
            inline: false,
        }
    }
}

/// A receive-queue work request.
#[derive(Debug)]
pub struct RecvWr {
    /// Returned in the completion.
    pub wr_id: WrId,
    /// Buffers to scatter the incoming message into.
    pub sgl: SgeList,
}

/// Completion status, as `ibv_wc_status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WcStatus {
    /// Completed.
    #[default]
    Success,
    /// Local length error: a message exceeded the posted receive.
    LocLenErr,
    /// Local protection error: an SGE is outside its registration or lacks
    /// the needed local access.
    LocProtErr,
    /// Local QP operation error: the work request is malformed.
    LocQpOpErr,
    /// Remote access error: bad rkey, out of bounds, or missing access.
    RemAccessErr,
    /// Remote invalid request: e.g. the peer's receive was too small.
    RemInvReqErr,
    /// The peer had no receive posted for longer than the RNR retry budget.
    RnrRetryExcErr,
    /// Transport retries exhausted: the peer is gone.
    RetryExcErr,
    /// Flushed because the queue pair is in the error state.
    WrFlushErr,
    /// A memory-window bind was invalid (see [`BindWindow`]).
    MwBindErr,
}

/// Completion opcode, as `ibv_wc_opcode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WcOpcode {
    /// Send (any flavour).
    #[default]
    Send,
    /// RDMA Write (with or without immediate).
    RdmaWrite,
    /// RDMA Read.
    RdmaRead,
    /// Local invalidate.
    LocalInv,
    /// Memory-window bind.
    Bind,
    /// Receive of a Send.
    Recv,
    /// Receive consumed by an RDMA Write with Immediate.
    RecvRdmaWithImm,
}

/// One work completion. Carries the work request's buffers back.
#[derive(Debug, Default)]
pub struct Completion {
    /// The work request's id.
    pub wr_id: WrId,
    /// Outcome.
    pub status: WcStatus,
    /// What completed.
    pub opcode: WcOpcode,
    /// Bytes received (receives) or transferred.
    pub byte_len: u32,
    /// Immediate data, if any.
    pub imm: Option<u32>,
    /// The rkey a Send with Invalidate invalidated at this receiver.
    pub invalidated_rkey: Option<u32>,
    /// Queue-pair number.
    pub qp_num: u32,
    /// The work request's buffers; for receives, lengths are set to the
    /// bytes placed in each.
    pub sgl: SgeList,
}

impl Completion {
    /// Whether the status is `Success`.
    pub fn is_ok(&self) -> bool {
        self.status == WcStatus::Success
    }
}

/// Queue-pair state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpState {
    /// Created, receives may be posted, not connected yet.
    Init,
    /// Connected: ready to send.
    Rts,
    /// Error: everything completes with `WrFlushErr`.
    Error,
}

/// Queue-pair sizing and retry attributes.
#[derive(Debug, Clone, Copy)]
pub struct QpCaps {
    /// Send-queue depth (outstanding + not yet polled).
    pub max_send_wr: u32,
    /// Receive-queue depth.
    pub max_recv_wr: u32,
    /// Largest inline send.
    pub max_inline: u32,
    /// RNR retries before `RnrRetryExcErr` (7 = retry forever, as in IB).
    pub rnr_retry: u8,
    /// Wait between RNR retries (IB's min RNR timer).
    pub rnr_timer: Duration,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps {
            max_send_wr: 128,
            max_recv_wr: 128,
            max_inline: 256,
            rnr_retry: 6,
            rnr_timer: Duration::from_millis(10),
        }
    }
}

/// Why a post was refused (the work request is handed back).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PostError {
    /// The queue is full.
    #[error("queue full")]
    QueueFull,
    /// The work request is malformed (e.g. inline too large, SGE out of its
    /// buffer, SGEs on a local invalidate).
    #[error("invalid work request")]
    Invalid,
}

/// A post that was refused, with the work request handed back.
#[derive(Debug)]
pub struct PostFailed<W> {
    /// Why.
    pub error: PostError,
    /// The work request, untouched.
    pub wr: W,
}

/// Control-path errors (setup, registration, connection).
#[derive(Debug, thiserror::Error)]
pub enum VerbsError {
    /// The URL's scheme does not belong to this provider, or it is malformed.
    #[error("bad address {url:?}: {why}")]
    BadAddress {
        /// The URL.
        url: String,
        /// What is wrong.
        why: &'static str,
    },
    /// A system call failed.
    #[error("{what}: {source}")]
    Os {
        /// What we were doing.
        what: &'static str,
        /// The OS error.
        source: nix::Error,
    },
    /// Memory setup failed.
    #[error(transparent)]
    Mem(#[from] crate::mem::MemError),
    /// The registration request is invalid (range outside the arena, ...).
    #[error("invalid registration: {0}")]
    InvalidRegistration(&'static str),
    /// A resource limit was hit (keys, regions, queue sizes).
    #[error("resource limit: {0}")]
    Limit(&'static str),
    /// The peer's uid is not in the allow-list.
    #[error("peer uid {uid} not allowed")]
    PeerNotAllowed {
        /// The peer's uid (SO_PEERCRED).
        uid: u32,
    },
    /// The peer's uid already has the most connections one uid may have
    /// on the listener (shm: [`shm::ShmListener::limit_per_uid`]).
    #[error("peer uid {uid} already has {limit} connections, the most one uid may have (raise `shm.max_connections_per_uid` if one user needs more)")]
    PeerLimit {
        /// The peer's uid (SO_PEERCRED).
        uid: u32,
        /// The limit per uid.
        limit: u32,
    },
    /// The peer rejected the connection; its private data is attached.
    #[error("connection rejected by peer")]
    Rejected {
        /// The peer's reject private data.
        private_data: Vec<u8>,
    },
    /// The peer broke the setup protocol.
    #[error("protocol violation by peer: {0}")]
    Protocol(&'static str),
    /// Nothing happened within the timeout.
    #[error("timed out")]
    Timeout,
    /// A peer connected but sent no setup message within the setup
    /// timeout (listener side): its connection was closed.
    #[error("no setup message within the setup timeout")]
    SetupTimeout,
    /// The queue pair is not connected / in error.
    #[error("queue pair not connected")]
    NotConnected,
    /// The provider cannot serve this address on this host (no RDMA
    /// device, no such device, ...); the message is one complete line.
    #[error("{0}")]
    Unavailable(String),
}

/// The checks every provider applies to [`ProtectionDomain::register`]:
/// a non-empty range inside the arena, and remote write only with local
/// write (as ibverbs requires).
///
/// # Errors
/// [`VerbsError::InvalidRegistration`] naming the rule broken.
pub(crate) fn check_registration(
    arena: &Arena,
    offset: usize,
    len: usize,
    access: Access,
) -> Result<(), VerbsError> {
    if offset.checked_add(len).is_none_or(|end| end > arena.len()) || len == 0 {
        return Err(VerbsError::InvalidRegistration("range outside the arena"));
    }
    if access.contains(Access::REMOTE_WRITE) && !access.contains(Access::LOCAL_WRITE) {
        return Err(VerbsError::InvalidRegistration(
            "REMOTE_WRITE requires LOCAL_WRITE",
        ));
    }
    if access.contains(Access::REMOTE_WRITE) {
        arena.mark_remote_writable();
    }
    Ok(())
}

/// The check the software providers apply to [`ProtectionDomain::create_qp`]:
/// both queue depths in `1..=max`.
///
/// # Errors
/// [`VerbsError::Limit`] with `why` (which names the range).
pub(crate) fn check_queue_depths(
    caps: &QpCaps,
    max: u32,
    why: &'static str,
) -> Result<(), VerbsError> {
    let ok = |d: u32| (1..=max).contains(&d);
    if ok(caps.max_send_wr) && ok(caps.max_recv_wr) {
        Ok(())
    } else {
        Err(VerbsError::Limit(why))
    }
}

/// A verbs provider: the family of types one implementation supplies.
pub trait Provider: Sized + 'static {
    /// An opened device.
    type Context: Context<Self>;
    /// Protection domain.
    type Pd: ProtectionDomain<Self>;
    /// Registered memory region.
    type Mr: MemoryRegion;
    /// Completion queue.
    type Cq: CompletionQueue;
    /// A created, not yet connected queue pair.
    type PreparedQp: PreparedQp<Self>;
    /// A connected queue pair.
    type Qp: QueuePair<Self>;
    /// Passive side of connection setup.
    type Listener: Listener<Self>;
    /// A connection request waiting for accept/reject.
    type Incoming: Incoming<Self>;
    /// A shared receive queue.
    type Srq: SharedReceiveQueue<Self>;

    /// URL scheme this provider serves (`"shm"`, ...).
    const SCHEME: &'static str;

    /// Whether every connected queue pair has memory windows
    /// ([`QueuePair::alloc_window`] fails only when they run out), so that
    /// a consumer may promise a peer before connecting that each of its
    /// keys can be invalidated on its own (RFC 8797 remote invalidation).
    const WINDOWS_ALWAYS: bool = false;

    /// Opens the device for `url` (for `shm`, any `shm://` URL).
    ///
    /// # Errors
    /// [`VerbsError::BadAddress`] if the URL is not for this provider.
    fn open(url: &str) -> Result<Self::Context, VerbsError>;
}

/// An opened device.
pub trait Context<P: Provider>: Send + Sync {
    /// Allocates a protection domain.
    ///
    /// # Errors
    /// Provider-specific resource errors.
    fn alloc_pd(&self) -> Result<P::Pd, VerbsError>;
    /// Creates a completion queue of `depth` entries.
    ///
    /// # Errors
    /// Provider-specific resource errors.
    fn create_cq(&self, depth: usize) -> Result<P::Cq, VerbsError>;
    /// Listens on `url`.
    ///
    /// # Errors
    /// Bad URL, address in use, OS errors.
    fn listen(&self, url: &str) -> Result<P::Listener, VerbsError>;
}

/// A protection domain: owns registrations and queue pairs.
pub trait ProtectionDomain<P: Provider>: Send + Sync {
    /// Registers `len` bytes at `offset` of `arena` with `access`.
    ///
    /// # Errors
    /// [`VerbsError::InvalidRegistration`] if the range is outside the
    /// arena or remote write is asked without local write.
    fn register(
        &self,
        arena: &Arc<Arena>,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<P::Mr, VerbsError>;
    /// Creates an RC queue pair using `send_cq` and `recv_cq`.
    ///
    /// # Errors
    /// [`VerbsError::Limit`] for unsupported sizes.
    fn create_qp(
        &self,
        send_cq: &P::Cq,
        recv_cq: &P::Cq,
        caps: QpCaps,
    ) -> Result<P::PreparedQp, VerbsError>;
    /// Creates a shared receive queue: receives posted to it serve every
    /// queue pair created on it ([`ProtectionDomain::create_qp_on_srq`]),
    /// as `ibv_create_srq`.
    ///
    /// # Errors
    /// [`VerbsError::Limit`] for unsupported sizes.
    fn create_srq(&self, caps: SrqCaps) -> Result<P::Srq, VerbsError>;
    /// Creates an RC queue pair whose receives come from `srq` (its own
    /// receive queue is unused: [`QueuePair::post_recv`] is refused).
    /// `caps.max_recv_wr` is how many receive completions it may hold
    /// between two polls of its CQ without growing.
    ///
    /// # Errors
    /// As [`ProtectionDomain::create_qp`].
    fn create_qp_on_srq(
        &self,
        send_cq: &P::Cq,
        recv_cq: &P::Cq,
        srq: &P::Srq,
        caps: QpCaps,
    ) -> Result<P::PreparedQp, VerbsError>;
}

/// The completion that tells the receive side that queue pair `qp_num`,
/// on a shared receive queue, failed (see [`SharedReceiveQueue`]).
pub fn srq_qp_failed(qp_num: u32) -> Completion {
    Completion {
        status: WcStatus::WrFlushErr,
        opcode: WcOpcode::Recv,
        qp_num,
        ..Completion::default()
    }
}

/// Shared-receive-queue sizing.
#[derive(Debug, Clone, Copy)]
pub struct SrqCaps {
    /// Receives the queue holds at once.
    pub max_wr: u32,
    /// The largest message a queue pair on it receives.
    pub max_message: u32,
    /// A provider whose peers write into receive buffers directly (`shm`)
    /// cannot let every peer of the queue reach every buffer: it stages
    /// each connection's messages in this many slots of `max_message`
    /// bytes that only that peer can write, and copies each into a shared
    /// receive when it is polled. Others ignore it.
    pub staging_slots: u32,
}

/// A shared receive queue (as `ibv_srq`): one pool of posted receives
/// for many queue pairs. A message takes one of the posted receives (a
/// hardware queue the oldest; `shm` and `roce` the newest, so that a
/// receive posted again at once is the next one used and stays in cache,
/// and a queue much larger than the load touches only the buffers the
/// load needs), and its completion goes to the receive CQ of the queue pair it arrived on,
/// with that queue pair's number. When the queue is empty, a sender sees
/// receiver-not-ready, as with an empty receive queue. A queue pair's
/// error or destruction flushes nothing from it: its receives stay posted
/// for the other queue pairs. So that a consumer still learns on the
/// receive side that a queue pair failed, `shm` and `roce` then deliver one
/// completion to its receive CQ with status [`WcStatus::WrFlushErr`], the
/// default `wr_id` and no buffers ([`srq_qp_failed`]; IB reports this as
/// the last-WQE-reached async event); with `ibverbs` watch
/// [`QueuePair::state`].
pub trait SharedReceiveQueue<P: Provider>: Send + Sync {
    /// Posts one receive.
    ///
    /// # Errors
    /// The work request is handed back if the queue is full or it is
    /// malformed (an SGE outside its registration or without local write).
    fn post_recv(&self, wr: RecvWr) -> Result<(), PostFailed<RecvWr>>;
    /// Receives posted and not yet consumed.
    fn posted(&self) -> usize;
}

/// A registered memory region. Deregistered on drop.
pub trait MemoryRegion: Send + Sync {
    /// Local key (what slab buffers carved from it carry).
    fn lkey(&self) -> u32;
    /// Virtual address of the first byte.
    fn addr(&self) -> u64;
    /// Length in bytes.
    fn len(&self) -> usize;
    /// Whether the length is zero.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Access flags.
    fn access(&self) -> Access;
}

/// A completion queue.
pub trait CompletionQueue: Send + Sync {
    /// Moves up to `out.len()` completions into `out` (overwriting, which
    /// drops anything left there), returns how many. Also drives the
    /// provider's progress for its queue pairs (software providers).
    fn poll(&self, out: &mut [Completion]) -> usize;

    /// The thread that polls this queue is about to sleep (an adaptive
    /// idle's park). A provider whose work runs on the polling thread
    /// (`roce`) sends now what it held for that thread's next poll and
    /// has its own thread take over until then. Default: nothing.
    fn before_sleep(&self) {}

    /// A descriptor that becomes readable when news may have come for a
    /// thread that sleeps after [`CompletionQueue::arm_wakeup`] returned
    /// true (`crate::wake::sleep_on`). `None`: the provider cannot wake a
    /// sleeper, which then sleeps until its timeout. Default: `None`.
    fn wakeup_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    /// The polling thread is about to sleep on [`wakeup_fd`]: from now on
    /// the queue's peers ring it when they publish something for it.
    /// Returns false when something came already (look again instead of
    /// sleeping). Default: true (nothing to arm).
    ///
    /// [`wakeup_fd`]: CompletionQueue::wakeup_fd
    fn arm_wakeup(&self) -> bool {
        true
    }

    /// The polling thread is back (or did not sleep): peers stop ringing
    /// and the descriptor is quiet again. Default: nothing.
    fn disarm_wakeup(&self) {}

    /// Descriptors besides [`wakeup_fd`] whose readiness is news for a
    /// sleeper right now, handed to `add` after [`arm_wakeup`] returned
    /// true (`roce`: the device's socket while no thread reads it, so a
    /// packet wakes the sleeper itself rather than through the device's
    /// thread). Readiness that turns out not to be ours only costs the
    /// sleeper a look. Default: none.
    ///
    /// [`wakeup_fd`]: CompletionQueue::wakeup_fd
    /// [`arm_wakeup`]: CompletionQueue::arm_wakeup
    fn watch_also(&self, add: &mut dyn FnMut(std::os::fd::RawFd)) {
        let _ = add;
    }
}

/// A created queue pair, before connection (typestate).
pub trait PreparedQp<P: Provider>: Send + Sized {
    /// Posts a receive before the connection exists (pre-posted receives).
    ///
    /// # Errors
    /// The work request is handed back if the queue is full or it is
    /// malformed.
    fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostFailed<RecvWr>>;
    /// Connects to `url`, sending `private_data`; returns the connected
    /// queue pair and the peer's private data.
    ///
    /// # Errors
    /// [`VerbsError::Rejected`], [`VerbsError::Timeout`], OS and protocol
    /// errors.
    fn connect(
        self,
        url: &str,
        private_data: &[u8],
        timeout: Duration,
    ) -> Result<(P::Qp, Vec<u8>), VerbsError>;
}

/// A listening endpoint.
pub trait Listener<P: Provider>: Send {
    /// Waits up to `timeout` for a connection request.
    ///
    /// # Errors
    /// [`VerbsError::Timeout`]; [`VerbsError::PeerNotAllowed`] when a peer
    /// outside the allow-list tried (it has been refused); protocol errors.
    fn accept(&self, timeout: Duration) -> Result<P::Incoming, VerbsError>;
}

/// A connection request.
pub trait Incoming<P: Provider>: Send + Sized {
    /// The requester's private data.
    fn private_data(&self) -> &[u8];
    /// Accepts, binding `qp` to the connection and answering with
    /// `private_data`.
    ///
    /// # Errors
    /// OS and protocol errors (the peer may have gone).
    fn accept(self, qp: P::PreparedQp, private_data: &[u8]) -> Result<P::Qp, VerbsError>;
    /// Refuses, answering with `private_data`.
    ///
    /// # Errors
    /// OS errors.
    fn reject(self, private_data: &[u8]) -> Result<(), VerbsError>;
    /// Who asks, as far as the provider can tell, stable across the
    /// requester's reconnections (an address or a local uid, never a port
    /// or a queue-pair number): what a duplicate request cache keys on.
    /// 0 when the provider cannot tell.
    fn peer_identity(&self) -> u64 {
        0
    }
}

/// A connected RC queue pair.
pub trait QueuePair<P: Provider>: Send {
    /// Queue-pair number (unique per context).
    fn qp_num(&self) -> u32;
    /// Current state.
    fn state(&self) -> QpState;
    /// Whether the queue pair is in Error because the peer disconnected
    /// in order (a CM DREQ, a close), not because something failed: the
    /// end of a connection, which is not an error to count.
    fn peer_disconnected(&self) -> bool {
        false
    }
    /// Posts one send-queue work request.
    ///
    /// # Errors
    /// The work request is handed back if the send queue is full or it is
    /// malformed. In the error state posts succeed and flush.
    fn post_send(&mut self, wr: SendWr) -> Result<(), PostFailed<SendWr>>;
    /// Posts a linked list of work requests (one doorbell). Stops at the
    /// first refused one, which is returned; the rest stay in `wrs`.
    ///
    /// # Errors
    /// As [`QueuePair::post_send`].
    fn post_send_list<I: Iterator<Item = SendWr>>(
        &mut self,
        wrs: &mut I,
    ) -> Result<usize, PostFailed<SendWr>>;
    /// Posts one receive.
    ///
    /// # Errors
    /// As [`QueuePair::post_send`].
    fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostFailed<RecvWr>>;
    /// Grants the peer of this connection access to `mr` (its access flags
    /// decide read and/or write); returns the key to advertise.
    ///
    /// # Errors
    /// [`VerbsError::Limit`] when the connection's key table is full,
    /// [`VerbsError::InvalidRegistration`] if `mr` has no remote access,
    /// [`VerbsError::NotConnected`] in the error state.
    fn expose(&mut self, mr: &P::Mr) -> Result<RemoteKey, VerbsError>;
    /// Reserves a memory window of this queue pair, to be bound per
    /// exchange with [`SendOp::Bind`]. Windows live as long as the queue
    /// pair; each provider has a fixed number per queue pair (shared with
    /// [`QueuePair::expose`]'s keys).
    ///
    /// # Errors
    /// [`VerbsError::Limit`] when the queue pair has no window left,
    /// [`VerbsError::NotConnected`] in the error state,
    /// [`VerbsError::Unavailable`] when the device has no type 2 memory
    /// windows (use [`QueuePair::expose`] there).
    fn alloc_window(&mut self) -> Result<Window, VerbsError>;
    /// Moves the queue pair to the error state (flushing everything) and
    /// tells the peer. Completions remain pollable from the CQs.
    fn disconnect(&mut self);
}

#[cfg(test)]
mod sge_list_tests {
    use super::{Sge, SgeList, MAX_SGE};
    use crate::mem::{Arena, Backing, Slab, WrKind};

    #[test]
    fn a_list_holds_max_sge_and_gives_back_its_buffers() {
        let arena = Arena::with_backing(8 * 4096, Backing::Small).unwrap();
        let slab = Slab::new(arena, 0, 4096, 8, 7, WrKind::Send).unwrap();
        let mut l = SgeList::new();
        assert!(l.is_empty());
        assert_eq!(l.len(), 0);
        for i in 0..MAX_SGE {
            let sge = Sge::whole(slab.alloc().unwrap());
            assert!(l.push(sge).is_ok(), "element {i}");
            assert_eq!(l.len(), i + 1);
        }
        // Full: the element comes back, nothing is lost.
        let extra = l.push(Sge::whole(slab.alloc().unwrap())).unwrap_err();
        drop(extra);
        assert_eq!(slab.available(), 8 - MAX_SGE);
        assert_eq!(l.total_len(), 4096 * MAX_SGE as u64);
        // The first buffer out, the rest back to the slab; the list is
        // empty after, and takes new elements from its start.
        let first = l.take_first().unwrap();
        assert!(l.is_empty());
        assert_eq!(l.iter().count(), 0);
        assert_eq!(slab.available(), 8 - 1);
        drop(first);
        l.push(Sge::whole(slab.alloc().unwrap())).unwrap();
        assert_eq!(l.len(), 1);
        assert_eq!(l.take_all().count(), 1);
        assert_eq!(slab.available(), 8);
    }
}

#[cfg(test)]
mod size_tests {
    use super::{Completion, RecvWr, SendWr};

    #[test]
    fn work_requests_and_completions_stay_within_two_cache_lines() {
        // Each post moves a work request and each poll a completion, a
        // few times per message (queue, out array, endpoint): the message
        // rate pays for every line they grow by.
        assert!(std::mem::size_of::<Completion>() <= 128);
        assert!(std::mem::size_of::<SendWr>() <= 128);
        assert!(std::mem::size_of::<RecvWr>() <= 128);
    }
}

#[cfg(test)]
mod window_tests {
    use super::Window;

    #[test]
    fn a_fresh_key_is_never_the_one_the_window_holds() {
        // An HCA's type 2 window: 8 key bits, allocated under a key whose
        // byte the consumer's tag may happen to equal (1 in 256).
        let w = Window::new(3, 0x1234_5600, 0xff);
        let allocated = w.rkey(0x5a);
        let w = w.holding(allocated);
        let k = w.rkey_unlike(0x5a, &[]);
        assert_ne!(k, allocated);
        assert!(w.owns(k));
        // Nor any key it is told to avoid as well.
        let also = w.next_rkey(allocated);
        let k = w.rkey_unlike(0x5a, &[also]);
        assert!(k != allocated && k != also && w.owns(k), "{k:#x}");
        // A tag that collides with nothing is taken as it is.
        assert_eq!(w.rkey_unlike(0x11, &[also]), w.rkey(0x11));
    }
}
