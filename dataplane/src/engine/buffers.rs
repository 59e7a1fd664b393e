//! The engine's memory: two regions allocated at construction, cut into
//! fixed buffers named by [`BufId`].
//!
//! Why fixed buffers owned by the engine: it is the simplest design that
//! allocates nothing per RPC, lets the worker register the memory once
//! (one memory region per region; a buffer's address is the region's base
//! plus [`BufferTable::slab_offset`]), and keeps a buffer out of reuse
//! while a work request that names it is posted: the engine's request
//! slots, not the caller, decide when a buffer is free, and they only do
//! so when the completion for its [`super::WrId`] arrived.
//!
//! Why two regions ([`Memory`]): a peer may write some buffers at any
//! moment (receive buffers; the requester's reply, write-chunk and
//! application buffers, which the peer RDMA-Writes), and with `shm` it has
//! them mapped. Those live in [`Memory::Peer`], a [`PeerMemory`] the engine
//! reaches only through copies ([`BufferTable::read`],
//! [`BufferTable::write`], [`BufferTable::copy`], [`PeerBytes`]); a
//! received header is copied out once before it is parsed. Everything
//! else (Send buffers, the responder's call and reply assembly, the
//! requester's call) lives in [`Memory::Private`], a [`SlabMemory`] that
//! only this process writes, where slices are sound: the provider touches
//! those bytes only while a work request owns them, and peers at most
//! read them.
//!
//! Remote access: a buffer the engine advertises in a chunk list carries an
//! rkey and an address ([`BufferTable::remote_key`]); the worker installs
//! real ones with [`BufferTable::set_remote_key`] after registering. The
//! engine marks a buffer exposed ([`Access`]) only while an exchange needs
//! it; [`BufferTable::resolve`] is the check a provider (or the test
//! harness) applies to a peer's RDMA Read or Write.

use std::hash::{BuildHasher, RandomState};

use std::sync::Arc;

use super::bulk::BulkPool;
pub use super::heap::HeapPeerMemory;
use crate::mem::{copy_in, copy_out, PeerBytes};
use crate::verbs::Window;
use crate::wire::rpcrdma::Segment;

/// Memory only this process writes: any byte region that lives as long as
/// the connection. [`super::Connection::new`] uses a private
/// `Box<[u8]>`; [`super::Connection::with_memory`] takes another, e.g. a
/// registered arena that peers can at most read, so that a provider can
/// reach the buffers one-sidedly. The engine never resizes it and reads or
/// writes only inside the ranges of its buffers.
pub trait SlabMemory: core::fmt::Debug + Send {
    /// The whole region.
    fn bytes(&self) -> &[u8];
    /// The whole region, writable.
    fn bytes_mut(&mut self) -> &mut [u8];
}

// A slab's Debug would print megabytes: the engine never prints it (see
// BufferTable's Debug); these impls satisfy the trait bound only.
impl SlabMemory for Box<[u8]> {
    fn bytes(&self) -> &[u8] {
        self
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        self
    }
}

impl SlabMemory for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        self
    }
}

/// Memory a peer may write at any moment (module docs): only a base
/// pointer and a length, never a slice.
///
/// # Safety
/// `as_ptr()..as_ptr() + len()` must stay mapped and writable for as long
/// as the value lives, and no Rust reference to those bytes may exist in
/// this process.
pub unsafe trait PeerMemory: core::fmt::Debug + Send {
    /// First byte.
    fn as_ptr(&self) -> *mut u8;
    /// Length in bytes.
    fn len(&self) -> usize;
    /// Whether the length is zero.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

// SAFETY: the allocation lives until drop and is never referenced.
unsafe impl PeerMemory for HeapPeerMemory {
    fn as_ptr(&self) -> *mut u8 {
        self.raw_ptr()
    }
    fn len(&self) -> usize {
        self.byte_len()
    }
}

/// Which region a buffer lives in (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Memory {
    /// Only this process writes it; peers may at most read it.
    Private,
    /// A peer may write it at any moment; reached only by copies.
    Peer,
    /// A buffer leased from the worker's [`BulkPool`] for one exchange:
    /// private memory (only this process writes it), never exposed.
    Bulk,
}

/// Bytes each region needs (what [`super::Connection::with_memory`]
/// wants).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryLen {
    /// Bytes of [`Memory::Private`].
    pub private: usize,
    /// Bytes of [`Memory::Peer`].
    pub peer: usize,
}

/// Index of a buffer in a [`BufferTable`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufId(pub u32);

/// A byte range of one of the engine's buffers (what work requests and
/// [`BufferTable::slice`] name memory by).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalSlice {
    /// The buffer.
    pub buf: BufId,
    /// First byte, from the start of the buffer.
    pub offset: u32,
    /// Number of bytes.
    pub len: u32,
}

/// What a buffer is used for (fixed at construction).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BufClass {
    /// A receive buffer (the local inline receive size).
    Recv,
    /// The private copy a received message is parsed from (one per
    /// connection, the inline receive size).
    RecvCopy,
    /// The Send buffer of a request slot (header plus inline message).
    Send,
    /// The Send buffer of an RDMA_ERROR reply.
    Error,
    /// A whole RPC message the engine assembles or sends: the call of a
    /// requester slot, the call and the reply of a responder slot.
    Message,
    /// The requester's buffer for a reply: the peer writes it (reply
    /// chunk), or we pull it (responder-provided read chunk), or the
    /// inline reply is copied into it.
    Reply,
    /// The destination of a DDP-eligible reply item (write chunk target).
    Ddp,
    /// The application memory ([`super::Config::app_memory`]), or a view:
    /// a per-slot descriptor pointed at a range of it for one call
    /// ([`BufferTable::retarget`]), so that each call has its own exposure
    /// window.
    App,
}

impl BufClass {
    /// The region buffers of this class live in: those a peer writes are
    /// in [`Memory::Peer`].
    pub fn memory(self) -> Memory {
        match self {
            BufClass::Recv | BufClass::Reply | BufClass::Ddp | BufClass::App => Memory::Peer,
            BufClass::RecvCopy | BufClass::Send | BufClass::Error | BufClass::Message => {
                Memory::Private
            }
        }
    }
}

/// What a peer may currently do to a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Nothing: the buffer is not advertised.
    None,
    /// RDMA Read (the buffer is a read chunk source).
    RemoteRead,
    /// RDMA Write (the buffer is a write or reply chunk target).
    RemoteWrite,
}

#[derive(Debug, Clone, Copy)]
struct Desc {
    /// Offset in the buffer's region (in the bulk pool while leased).
    start: usize,
    len: u32,
    class: BufClass,
    /// The buffer's own place (`start`, `len`), kept while a bulk lease
    /// stands in for it.
    own: (usize, u32),
    /// The bulk pool buffer leased for the current exchange.
    lease: Option<u32>,
    rkey: u32,
    addr: u64,
    access: Access,
    /// The exposed byte range (offset, length) while `access` is not None.
    window: (u32, u32),
    /// The key window bound for the current exposure (its slot in
    /// [`KeyWindows::windows`]), when windows are in use.
    bound: Option<u16>,
    /// The peer invalidated the current exposure's key (Send With
    /// Invalidate): no local invalidation is due.
    remotely_invalidated: bool,
}

impl Desc {
    fn memory(&self) -> Memory {
        if self.lease.is_some() {
            Memory::Bulk
        } else {
            self.class.memory()
        }
    }
}

/// A bind the engine asks for when it exposes a buffer with key windows in
/// use ([`BufferTable::set_key_windows`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KeyBind {
    /// The provider's window index.
    pub(crate) window: u32,
    /// The fresh key.
    pub(crate) rkey: u32,
}

/// The memory windows of a connection (per-exchange keys): a pool the
/// engine binds one of per exposure, under a fresh, unpredictable key.
struct KeyWindows {
    windows: Vec<Window>,
    /// Slots of `windows` not bound, used as a stack.
    free: Vec<u16>,
    /// The bound ones: (rkey, buffer), a few at a time (what calls in
    /// flight advertised), so a Send With Invalidate finds its buffer
    /// without a scan of every descriptor. Capacity: every window.
    live: Vec<(u32, BufId)>,
    /// Keys come from SipHash under a per-process random key over a
    /// counter: a peer that saw every earlier key cannot tell the next
    /// (the bits it can choose are the window's mask; rkeys are
    /// unpredictable, per connection and per exchange).
    hasher: RandomState,
    counter: u64,
}

/// The engine's buffers: two regions (module docs) and a descriptor per
/// buffer. Built once by [`super::Connection::new`]; never grows.
pub struct BufferTable {
    private: Box<dyn SlabMemory>,
    peer: Box<dyn PeerMemory>,
    descs: Vec<Desc>,
    /// Reads of receive buffers so far ([`BufferTable::receive_reads`]).
    recv_reads: core::cell::Cell<u64>,
    /// Per-exchange keys, when the provider has windows.
    keys: Option<KeyWindows>,
    /// The worker's pool large messages lease from, when given.
    bulk: Option<Arc<BulkPool>>,
    /// Counted among the pool's waiters: a lease failed, and none has
    /// succeeded since.
    bulk_waiting: bool,
}

/// Bulk leases go back to the pool with the table. The owner drops a
/// connection only once no work request names its buffers (the worker
/// destroys the queue pair first), so nothing writes them any more.
impl Drop for BufferTable {
    fn drop(&mut self) {
        for i in 0..self.descs.len() {
            self.release_bulk(BufId(i as u32));
        }
        self.stop_waiting_for_bulk();
    }
}

impl core::fmt::Debug for BufferTable {
    // Not the bytes: a slab is megabytes.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("BufferTable")
            .field("private_len", &self.private.bytes().len())
            .field("peer_len", &self.peer.len())
            .field("buffers", &self.descs.len())
            .field("exposed", &self.exposed_count())
            .finish()
    }
}

/// Builds a [`BufferTable`]: add buffers, then `build` allocates the
/// regions.
#[derive(Debug, Default)]
pub(crate) struct BufferTableBuilder {
    descs: Vec<Desc>,
    total: MemoryLen,
}

impl BufferTableBuilder {
    /// Adds one buffer of `len` bytes; returns its id. Buffers start at
    /// 64-byte boundaries of their region (cache lines; any registration
    /// alignment beyond that is the worker's business).
    pub(crate) fn add(&mut self, class: BufClass, len: u32) -> BufId {
        let id = BufId(self.descs.len() as u32);
        let total = match class.memory() {
            Memory::Peer => &mut self.total.peer,
            Memory::Private | Memory::Bulk => &mut self.total.private,
        };
        let start = total.next_multiple_of(64);
        *total = start + len as usize;
        self.descs.push(Desc {
            start,
            len,
            class,
            own: (start, len),
            lease: None,
            // Default keys for callers that do not register (tests): the
            // worker replaces them with real rkeys and addresses.
            rkey: 0x100 + id.0,
            addr: start as u64,
            access: Access::None,
            window: (0, 0),
            bound: None,
            remotely_invalidated: false,
        });
        id
    }

    /// Bytes of each region the buffers added so far need.
    pub(crate) fn total(&self) -> MemoryLen {
        self.total
    }

    /// The table over fresh zeroed heap regions, written once so that
    /// their pages are faulted in at construction, not on the data path.
    /// `None` if the memory cannot be had.
    pub(crate) fn build(self) -> Option<BufferTable> {
        let mut private = Vec::new();
        private.try_reserve_exact(self.total.private).ok()?;
        private.resize(self.total.private, 0u8);
        let peer = HeapPeerMemory::new(self.total.peer)?;
        Some(self.build_in(Box::new(private.into_boxed_slice()), Box::new(peer)))
    }

    /// The table over `private` and `peer`, which the caller checked hold
    /// at least [`BufferTableBuilder::total`] bytes each.
    pub(crate) fn build_in(
        self,
        private: Box<dyn SlabMemory>,
        peer: Box<dyn PeerMemory>,
    ) -> BufferTable {
        let mut descs = self.descs;
        // The builder grew by doubling; a connection keeps its table for
        // life, so it keeps only what it uses.
        descs.shrink_to_fit();
        BufferTable {
            private,
            peer,
            descs,
            recv_reads: core::cell::Cell::new(0),
            keys: None,
            bulk: None,
            bulk_waiting: false,
        }
    }
}

impl BufferTable {
    /// Number of buffers.
    pub fn count(&self) -> usize {
        self.descs.len()
    }

    /// Length of one region (for the worker to register it once).
    pub fn memory_len(&self, memory: Memory) -> usize {
        match memory {
            Memory::Private => self.private.bytes().len(),
            Memory::Peer => self.peer.len(),
            Memory::Bulk => self.bulk.as_ref().map_or(0, |p| p.memory_bytes()),
        }
    }

    fn desc(&self, id: BufId) -> Option<&Desc> {
        self.descs.get(id.0 as usize)
    }

    /// Offset of buffer `id` in its region (0 for an unknown id).
    pub fn slab_offset(&self, id: BufId) -> usize {
        self.desc(id).map_or(0, |d| d.start)
    }

    /// The region buffer `id` lives in (`Private` for an unknown id).
    pub fn memory(&self, id: BufId) -> Memory {
        self.desc(id).map_or(Memory::Private, Desc::memory)
    }

    /// Length of buffer `id` (0 for an unknown id).
    pub fn buf_len(&self, id: BufId) -> u32 {
        self.desc(id).map_or(0, |d| d.len)
    }

    /// The class of buffer `id`.
    pub fn class(&self, id: BufId) -> Option<BufClass> {
        self.desc(id).map(|d| d.class)
    }

    /// The bytes of private buffer `id`. Empty for an unknown id and for
    /// a buffer in [`Memory::Peer`], which is never a slice (use
    /// [`BufferTable::read`] or [`BufferTable::peer_bytes`]).
    pub fn bytes(&self, id: BufId) -> &[u8] {
        match self.desc(id) {
            Some(d) if d.memory() == Memory::Private => self
                .private
                .bytes()
                .get(d.start..d.start + d.len as usize)
                .unwrap_or(&[]),
            Some(d) if d.memory() == Memory::Bulk => match self.raw(id, 0, d.len as usize) {
                // SAFETY: inside the pool (`locate`), leased to this table
                // alone, and written by nobody else (`BulkMemory`); the
                // slice borrows the table, which holds the lease.
                Some(p) => unsafe { std::slice::from_raw_parts(p, d.len as usize) },
                None => &[],
            },
            Some(_) => {
                debug_assert!(false, "a slice of peer memory was asked for");
                &[]
            }
            None => &[],
        }
    }

    /// The bytes of private buffer `id`, writable. Empty as for
    /// [`BufferTable::bytes`].
    pub fn bytes_mut(&mut self, id: BufId) -> &mut [u8] {
        match self.descs.get(id.0 as usize).copied() {
            Some(d) if d.memory() == Memory::Private => self
                .private
                .bytes_mut()
                .get_mut(d.start..d.start + d.len as usize)
                .unwrap_or(&mut []),
            Some(d) if d.memory() == Memory::Bulk => match self.raw_mut(id, 0, d.len as usize) {
                // SAFETY: as in `bytes`, with the table borrowed exclusively.
                Some(p) => unsafe { std::slice::from_raw_parts_mut(p, d.len as usize) },
                None => &mut [],
            },
            Some(_) => {
                debug_assert!(false, "a slice of peer memory was asked for");
                &mut []
            }
            None => &mut [],
        }
    }

    /// The bytes named by `s`, if it lies inside its private buffer.
    pub fn slice(&self, s: LocalSlice) -> Option<&[u8]> {
        let b = self.bytes(s.buf);
        b.get(s.offset as usize..(s.offset as usize).checked_add(s.len as usize)?)
    }

    /// Writable [`BufferTable::slice`].
    pub fn slice_mut(&mut self, s: LocalSlice) -> Option<&mut [u8]> {
        let b = self.bytes_mut(s.buf);
        b.get_mut(s.offset as usize..(s.offset as usize).checked_add(s.len as usize)?)
    }

    /// How many times bytes were read out of a receive buffer: the engine
    /// reads each received message exactly once (into its private copy),
    /// so that a peer rewriting the buffer afterwards changes nothing it
    /// parsed. Tests compare this with the messages delivered.
    pub fn receive_reads(&self) -> u64 {
        self.recv_reads.get()
    }

    /// Counts a read from buffer `id` if it is a receive buffer.
    fn note_read(&self, id: BufId) {
        if self.class(id) == Some(BufClass::Recv) {
            self.recv_reads.set(self.recv_reads.get() + 1);
        }
    }

    /// Pointer to byte `offset..offset + len` of buffer `id`, if inside.
    fn locate(&self, id: BufId, offset: usize, len: usize) -> Option<(Memory, usize)> {
        let d = self.desc(id)?;
        if offset.checked_add(len)? > d.len as usize {
            return None;
        }
        let at = d.start + offset;
        let region = self.memory_len(d.memory());
        (at + len <= region).then_some((d.memory(), at))
    }

    /// A pointer for reading `len` bytes at `offset` of buffer `id`, if
    /// inside (derived from a shared borrow: never written through).
    fn raw(&self, id: BufId, offset: usize, len: usize) -> Option<*const u8> {
        let (memory, at) = self.locate(id, offset, len)?;
        let base = match memory {
            Memory::Private => self.private.bytes().as_ptr(),
            Memory::Peer => self.peer.as_ptr().cast_const(),
            Memory::Bulk => self.bulk_base().cast_const(),
        };
        // SAFETY: `at + len` is inside the region (`locate`).
        Some(unsafe { base.add(at) })
    }

    /// The first byte of region `memory`, for writing (derived from an
    /// exclusive borrow of the private region).
    fn base_mut(&mut self, memory: Memory) -> *mut u8 {
        match memory {
            Memory::Private => self.private.bytes_mut().as_mut_ptr(),
            Memory::Peer => self.peer.as_ptr(),
            Memory::Bulk => self.bulk_base(),
        }
    }

    /// The bulk pool's first byte (null without a pool: `locate` then
    /// finds no room, so it is never offset).
    fn bulk_base(&self) -> *mut u8 {
        self.bulk
            .as_ref()
            .map_or(std::ptr::null_mut(), |p| p.base())
    }

    /// Gives the table the pool its [`BufferTable::lease_bulk`] takes from.
    pub(crate) fn set_bulk_pool(&mut self, pool: Arc<BulkPool>) {
        self.bulk = Some(pool);
    }

    /// The bulk pool, if the table has one.
    pub fn bulk_pool(&self) -> Option<&Arc<BulkPool>> {
        self.bulk.as_ref()
    }

    /// Makes buffer `id` a bulk pool buffer until
    /// [`BufferTable::release_bulk`]: same id, a pool buffer's place and
    /// length. True if it now is one (also if it already was); false if
    /// the table has no pool, the pool is empty, or `id` is unknown.
    pub(crate) fn lease_bulk(&mut self, id: BufId) -> bool {
        let Some(pool) = self.bulk.as_ref() else {
            return false;
        };
        let Some(d) = self.descs.get_mut(id.0 as usize) else {
            return false;
        };
        if d.lease.is_some() {
            return true;
        }
        // Pool buffers are never exposed (module docs of `bulk`).
        debug_assert_eq!(d.access, Access::None, "leasing for an exposed buffer");
        let Some(index) = pool.take(self.bulk_waiting) else {
            if !self.bulk_waiting {
                pool.add_waiter();
                self.bulk_waiting = true;
            }
            return false;
        };
        if std::mem::take(&mut self.bulk_waiting) {
            pool.remove_waiter();
        }
        d.lease = Some(index);
        d.start = pool.offset(index);
        d.len = pool.buf_len();
        true
    }

    /// Gives buffer `id`'s bulk lease back, if it has one: the buffer is
    /// its own small self again.
    pub(crate) fn release_bulk(&mut self, id: BufId) {
        let Some(d) = self.descs.get_mut(id.0 as usize) else {
            return;
        };
        if let (Some(index), Some(pool)) = (d.lease.take(), self.bulk.as_ref()) {
            (d.start, d.len) = d.own;
            pool.give_back(index);
        }
    }

    /// Stops counting among the bulk pool's waiters (the connection
    /// closed: its waiting calls are gone).
    pub(crate) fn stop_waiting_for_bulk(&mut self) {
        if let (true, Some(pool)) = (std::mem::take(&mut self.bulk_waiting), self.bulk.as_ref()) {
            pool.remove_waiter();
        }
    }

    /// Buffers holding a bulk lease now.
    pub fn bulk_leased(&self) -> usize {
        self.descs.iter().filter(|d| d.lease.is_some()).count()
    }

    /// A pointer for writing `len` bytes at `offset` of buffer `id`, if
    /// inside.
    fn raw_mut(&mut self, id: BufId, offset: usize, len: usize) -> Option<*mut u8> {
        let (memory, at) = self.locate(id, offset, len)?;
        // SAFETY: `at + len` is inside the region (`locate`).
        Some(unsafe { self.base_mut(memory).add(at) })
    }

    /// Copies the bytes named by `s` into `dst` (`dst.len()` must equal
    /// `s.len`), from either region. False, copying nothing, if `s` is not
    /// inside its buffer.
    pub fn read(&self, s: LocalSlice, dst: &mut [u8]) -> bool {
        if dst.len() != s.len as usize {
            return false;
        }
        self.note_read(s.buf);
        match self.raw(s.buf, s.offset as usize, dst.len()) {
            Some(p) => {
                // SAFETY: inside the live region; `dst` is the caller's own
                // memory, not a buffer of this table (it holds `&self`
                // while the caller holds `&mut dst`).
                unsafe { copy_out(p, dst) };
                true
            }
            None => false,
        }
    }

    /// A copy of the bytes named by `s`, from either region (tests and
    /// the control path; the data path copies into its own buffers).
    pub fn to_vec(&self, s: LocalSlice) -> Option<Vec<u8>> {
        let mut v = vec![0u8; s.len as usize];
        self.read(s, &mut v).then_some(v)
    }

    /// Copies `src` to byte `offset` of buffer `id`, in either region.
    /// False, copying nothing, if it does not fit.
    pub fn write(&mut self, id: BufId, offset: usize, src: &[u8]) -> bool {
        match self.raw_mut(id, offset, src.len()) {
            Some(p) => {
                // SAFETY: inside the live region; `&mut self` excludes any
                // slice of it in this process, so `src` cannot overlap.
                unsafe { copy_in(src, p) };
                true
            }
            None => false,
        }
    }

    /// The first word of buffer `id` (an RPC message's XID), copied out.
    pub fn peek_xid(&self, id: BufId) -> Option<u32> {
        let mut w = [0u8; 4];
        self.read(
            LocalSlice {
                buf: id,
                offset: 0,
                len: 4,
            },
            &mut w,
        )
        .then(|| u32::from_be_bytes(w))
    }

    /// A read-only view of `len` bytes at `offset` of buffer `id`, in
    /// either region, for as long as the table is borrowed.
    pub fn peer_bytes(&self, id: BufId, offset: usize, len: usize) -> Option<PeerBytes<'_>> {
        self.note_read(id);
        let p = self.raw(id, offset, len)?;
        // SAFETY: inside the region, which lives as long as `self`.
        Some(unsafe { PeerBytes::new(p, len) })
    }

    /// Installs the rkey and address under which the peer reaches buffer
    /// `id` (the worker calls this after registering the regions).
    pub fn set_remote_key(&mut self, id: BufId, rkey: u32, addr: u64) {
        if let Some(d) = self.descs.get_mut(id.0 as usize) {
            d.rkey = rkey;
            d.addr = addr;
        }
    }

    /// Points view `view` at `len` bytes at `offset` of buffer `base`
    /// (its bytes, its address; the view keeps its own rkey, which the
    /// worker set to the one key of the whole memory). The view's exposure
    /// is withdrawn. False, changing nothing, if the range is outside
    /// `base`, the two live in different regions, or the view is still
    /// bound to a key window.
    pub(crate) fn retarget(&mut self, view: BufId, base: BufId, offset: u32, len: u32) -> bool {
        let Some(b) = self.desc(base).copied() else {
            return false;
        };
        if u64::from(offset) + u64::from(len) > u64::from(b.len) {
            return false;
        }
        match self.descs.get_mut(view.0 as usize) {
            // A view still bound to a key window is still exposed: the
            // caller unexposes it first (its key must be invalidated).
            Some(v) if v.memory() == b.memory() && v.bound.is_none() => {
                v.start = b.start + offset as usize;
                v.len = len;
                v.addr = b.addr.wrapping_add(u64::from(offset));
                v.access = Access::None;
                v.window = (0, 0);
                true
            }
            _ => false,
        }
    }

    /// The rkey and address advertised for buffer `id`.
    pub fn remote_key(&self, id: BufId) -> (u32, u64) {
        self.desc(id).map_or((0, 0), |d| (d.rkey, d.addr))
    }

    /// What a peer may do to buffer `id` right now.
    pub fn access(&self, id: BufId) -> Access {
        self.desc(id).map_or(Access::None, |d| d.access)
    }

    /// Gives the engine memory windows to expose its buffers under, one
    /// per exposure with a fresh key each time, instead of the one key per
    /// region [`BufferTable::set_remote_key`] installed. At most
    /// 65,536 are used.
    pub fn set_key_windows(&mut self, windows: &[Window]) {
        let windows: Vec<Window> = windows.iter().take(1 << 16).copied().collect();
        let free = (0..windows.len() as u16).rev().collect();
        let live = Vec::with_capacity(windows.len());
        self.keys = Some(KeyWindows {
            windows,
            free,
            live,
            hasher: RandomState::new(),
            counter: 0,
        });
    }

    /// Whether exposures bind key windows.
    pub fn uses_key_windows(&self) -> bool {
        self.keys.is_some()
    }

    /// Exposes bytes `offset..offset + len` of buffer `id` for `access`
    /// (exactly what one advertised segment covers: a peer reaches nothing
    /// else of the buffer, e.g. stale bytes of an earlier call). With key
    /// windows, binds a free one under a fresh key and returns the bind to
    /// queue; the buffer's [`BufferTable::remote_key`] is then that key.
    /// `Err(())` when every window is bound (nothing changes).
    pub(crate) fn set_access(
        &mut self,
        id: BufId,
        access: Access,
        offset: u32,
        len: u32,
    ) -> Result<Option<KeyBind>, ()> {
        let Some(d) = self.descs.get_mut(id.0 as usize) else {
            return Ok(None);
        };
        // A pool buffer is never exposed (module docs of `bulk`): its key
        // would reach the whole pool.
        if d.lease.is_some() && access != Access::None {
            debug_assert!(false, "exposing a bulk pool buffer");
            return Err(());
        }
        let bind = match self.keys.as_mut() {
            Some(k) if access != Access::None => {
                debug_assert!(d.bound.is_none(), "exposed twice without unexpose");
                let slot = k.free.pop().ok_or(())?;
                let w = k.windows[slot as usize];
                k.counter += 1;
                let tag = k.hasher.hash_one(k.counter) as u32;
                // Never the key the window holds (a type 2 window refuses
                // it) nor the one this buffer was last exposed under.
                let rkey = w.rkey_unlike(tag, &[d.rkey]);
                k.windows[slot as usize] = w.holding(rkey);
                d.bound = Some(slot);
                d.remotely_invalidated = false;
                d.rkey = rkey;
                k.live.push((rkey, id));
                Some(KeyBind {
                    window: w.index(),
                    rkey,
                })
            }
            _ => None,
        };
        d.access = access;
        d.window = (offset, len);
        Ok(bind)
    }

    /// Withdraws any exposure of buffer `id`. With key windows, returns
    /// the key to invalidate locally (none when the peer invalidated it
    /// already), and the window goes back to the pool: a later bind of it
    /// is queued after this invalidation.
    pub(crate) fn unexpose(&mut self, id: BufId) -> Option<u32> {
        let d = self.descs.get_mut(id.0 as usize)?;
        d.access = Access::None;
        d.window = (0, 0);
        let slot = d.bound.take()?;
        if let Some(k) = self.keys.as_mut() {
            k.free.push(slot);
            if let Some(i) = k.live.iter().position(|&(_, b)| b == id) {
                k.live.swap_remove(i);
            }
        }
        (!std::mem::take(&mut d.remotely_invalidated)).then_some(d.rkey)
    }

    /// The peer invalidated `rkey` (a Send With Invalidate arrived): the
    /// buffer exposed under it no longer needs a local invalidation. False
    /// if no current exposure has that key.
    pub(crate) fn note_remote_invalidation(&mut self, rkey: u32) -> bool {
        let Some(&(_, id)) = self
            .keys
            .as_ref()
            .and_then(|k| k.live.iter().find(|&&(r, _)| r == rkey))
        else {
            return false;
        };
        match self.descs.get_mut(id.0 as usize) {
            Some(d) => {
                d.remotely_invalidated = true;
                true
            }
            None => false,
        }
    }

    /// Number of buffers currently exposed to the peer.
    pub fn exposed_count(&self) -> usize {
        self.descs
            .iter()
            .filter(|d| d.access != Access::None)
            .count()
    }

    /// A segment of `len` bytes at `offset` in buffer `id`, as advertised
    /// to the peer.
    pub(crate) fn segment(&self, id: BufId, offset: u32, len: u32) -> Segment {
        let (handle, addr) = self.remote_key(id);
        Segment {
            handle,
            length: len,
            offset: addr.wrapping_add(u64::from(offset)),
        }
    }

    /// The provider's check of a peer's one-sided access: the buffer whose
    /// rkey is `seg.handle`, the offset of `seg` in it, provided the whole
    /// segment lies inside the exposed window of the buffer and the buffer
    /// is exposed for `want`.
    /// Linear in the number of buffers: a helper for soft providers and the
    /// test harness, not for the data path.
    pub fn resolve(&self, seg: &Segment, want: Access) -> Option<LocalSlice> {
        let (i, d) = self
            .descs
            .iter()
            .enumerate()
            .find(|(_, d)| d.rkey == seg.handle)?;
        if d.access != want || want == Access::None {
            return None;
        }
        let off = seg.offset.checked_sub(d.addr)?;
        let end = off.checked_add(u64::from(seg.length))?;
        let (w_off, w_len) = (u64::from(d.window.0), u64::from(d.window.1));
        if off < w_off || end > w_off + w_len || end > u64::from(d.len) {
            return None;
        }
        Some(LocalSlice {
            buf: BufId(i as u32),
            offset: off as u32,
            len: seg.length,
        })
    }

    /// Copies `src` to `dst_offset` in buffer `dst` (possibly different
    /// buffers and regions; overlapping ranges of one region are moved
    /// correctly). Returns false, copying nothing, if either range falls
    /// outside its buffer.
    pub(crate) fn copy(&mut self, src: LocalSlice, dst: BufId, dst_offset: usize) -> bool {
        self.note_read(src.buf);
        let n = src.len as usize;
        let (Some((from_mem, from)), Some((to_mem, to))) = (
            self.locate(src.buf, src.offset as usize, n),
            self.locate(dst, dst_offset, n),
        ) else {
            return false;
        };
        // Both pointers from one base per region, the private one from an
        // exclusive borrow (a pointer from a shared borrow may not be
        // written through).
        let from_base = self.base_mut(from_mem);
        let to_base = if to_mem == from_mem {
            from_base
        } else {
            self.base_mut(to_mem)
        };
        // SAFETY: both ranges are inside live regions (`locate`); no slice
        // of them exists while `&mut self` is held; `copy` allows overlap.
        unsafe { std::ptr::copy(from_base.add(from), to_base.add(to), n) };
        true
    }

    /// Zeroes `len` bytes at `offset` of buffer `id` (XDR roundup bytes
    /// the sender elided, RFC 5666 s3.7). False if out of range.
    pub(crate) fn zero(&mut self, id: BufId, offset: usize, len: usize) -> bool {
        match self.raw_mut(id, offset, len) {
            Some(p) => {
                // SAFETY: inside a live region; `&mut self` as in `copy`.
                unsafe { std::ptr::write_bytes(p, 0, len) };
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> (BufferTable, BufId, BufId) {
        let mut b = BufferTableBuilder::default();
        let a = b.add(BufClass::Message, 100);
        let c = b.add(BufClass::Message, 50);
        (b.build().unwrap(), a, c)
    }

    #[test]
    fn buffers_are_disjoint_and_aligned() {
        let (t, a, c) = table();
        assert_eq!(t.bytes(a).len(), 100);
        assert_eq!(t.bytes(c).len(), 50);
        assert_eq!(t.slab_offset(c) % 64, 0);
        assert!(t.slab_offset(c) >= 100);
        assert!(t.bytes(BufId(9)).is_empty());
    }

    #[test]
    fn resolve_enforces_exposure_and_bounds() {
        let (mut t, _, c) = table();
        let seg = t.segment(c, 8, 16);
        assert_eq!(t.resolve(&seg, Access::RemoteRead), None);
        assert_eq!(t.set_access(c, Access::RemoteRead, 8, 20), Ok(None));
        assert_eq!(
            t.resolve(&seg, Access::RemoteRead),
            Some(LocalSlice {
                buf: c,
                offset: 8,
                len: 16
            })
        );
        assert_eq!(t.resolve(&seg, Access::RemoteWrite), None);
        let past_window = t.segment(c, 12, 17);
        assert_eq!(t.resolve(&past_window, Access::RemoteRead), None);
        let before_window = t.segment(c, 4, 8);
        assert_eq!(t.resolve(&before_window, Access::RemoteRead), None);
        assert_eq!(t.set_access(c, Access::RemoteRead, 0, 50), Ok(None));
        let past_end = t.segment(c, 40, 11);
        assert_eq!(t.resolve(&past_end, Access::RemoteRead), None);
        assert_eq!(t.unexpose(c), None);
        assert_eq!(t.resolve(&seg, Access::RemoteRead), None);
        let before = Segment {
            offset: seg.offset.wrapping_sub(100),
            ..seg
        };
        assert_eq!(t.resolve(&before, Access::RemoteRead), None);
    }

    #[test]
    fn copy_checks_both_ranges() {
        let (mut t, a, c) = table();
        t.bytes_mut(a)[..4].copy_from_slice(b"abcd");
        let src = LocalSlice {
            buf: a,
            offset: 0,
            len: 4,
        };
        assert!(t.copy(src, c, 46));
        assert_eq!(&t.bytes(c)[46..], b"abcd");
        assert!(!t.copy(src, c, 47));
        assert!(!t.copy(
            LocalSlice {
                buf: a,
                offset: 98,
                len: 4
            },
            c,
            0
        ));
    }

    #[test]
    fn peer_buffers_live_apart_and_are_reached_only_by_copies() {
        let mut b = BufferTableBuilder::default();
        let msg = b.add(BufClass::Message, 64);
        let recv = b.add(BufClass::Recv, 64);
        let reply = b.add(BufClass::Reply, 64);
        assert_eq!(
            b.total(),
            MemoryLen {
                private: 64,
                peer: 128
            }
        );
        let mut t = b.build().unwrap();
        assert_eq!(t.memory(msg), Memory::Private);
        assert_eq!(
            (t.memory(recv), t.memory(reply)),
            (Memory::Peer, Memory::Peer)
        );
        assert_eq!(t.slab_offset(recv), 0);
        assert_eq!(t.slab_offset(reply), 64);
        assert!(t.write(recv, 60, b"wxyz"));
        assert!(!t.write(recv, 61, b"wxyz"));
        let s = LocalSlice {
            buf: recv,
            offset: 60,
            len: 4,
        };
        let mut out = [0u8; 4];
        assert!(t.read(s, &mut out) && &out == b"wxyz");
        assert!(!t.read(s, &mut [0u8; 3]));
        // Peer to private and private to peer.
        assert!(t.copy(s, msg, 0));
        assert_eq!(&t.bytes(msg)[..4], b"wxyz");
        let from_msg = LocalSlice {
            buf: msg,
            offset: 0,
            len: 4,
        };
        assert!(t.copy(from_msg, reply, 10));
        assert!(t.peer_bytes(reply, 10, 4).unwrap() == *b"wxyz");
        assert!(t.peer_bytes(reply, 62, 4).is_none());
        assert!(t.zero(reply, 10, 2));
        assert!(t.peer_bytes(reply, 10, 4).unwrap() == [0, 0, b'y', b'z']);
        // A view must stay in its base's region.
        assert!(!t.retarget(reply, msg, 0, 8));
    }
}
