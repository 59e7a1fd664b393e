//! The engine's memory: one slab allocated at construction, cut into
//! fixed buffers named by [`BufId`].
//!
//! Why one slab owned by the engine: it is the simplest design that
//! allocates nothing per RPC, lets the worker register the memory once
//! (one memory region over [`BufferTable::slab`]; a buffer's address is the
//! region's base plus [`BufferTable::slab_offset`]), and keeps a buffer out
//! of reuse while a work request that names it is posted: the engine's
//! request slots, not the caller, decide when a buffer is free, and they
//! only do so when the completion for its [`super::WrId`] arrived.
//!
//! Remote access: a buffer the engine advertises in a chunk list carries an
//! rkey and an address ([`BufferTable::remote_key`]); the worker installs
//! real ones with [`BufferTable::set_remote_key`] after registering. The
//! engine marks a buffer exposed ([`Access`]) only while an exchange needs
//! it; [`BufferTable::resolve`] is the check a provider (or the test
//! harness) applies to a peer's RDMA Read or Write. On real hardware the
//! exposure maps to registering/invalidating a per-buffer memory window or
//! FRWR (see `docs/ENGINE.md`).

use crate::wire::rpcrdma::Segment;

/// Memory the engine cuts its buffers from: any byte region that lives as
/// long as the connection. [`super::Connection::new`] uses a private
/// `Box<[u8]>`; [`super::Connection::with_memory`] takes another, e.g. a
/// registered, shareable (memfd) region from the `mem` arena, so
/// that a provider can reach the buffers one-sidedly. The engine never
/// resizes it and reads or writes only inside the ranges of its buffers.
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
    /// The Send buffer of a request slot (header plus inline message).
    Send,
    /// The Send buffer of an RDMA_ERROR reply.
    Error,
    /// A whole RPC message: the call of a slot, or its reply.
    Message,
    /// The destination of a DDP-eligible reply item (write chunk target).
    Ddp,
    /// The application memory ([`super::Config::app_memory`]), or a view:
    /// a per-slot descriptor pointed at a range of it for one call
    /// ([`BufferTable::retarget`]), so that each call has its own exposure
    /// window.
    App,
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
    start: usize,
    len: u32,
    class: BufClass,
    rkey: u32,
    addr: u64,
    access: Access,
    /// The exposed byte range (offset, length) while `access` is not None.
    window: (u32, u32),
}

/// The engine's buffers: one slab ([`SlabMemory`]) and a descriptor per
/// buffer. Built once by [`super::Connection::new`]; never grows.
pub struct BufferTable {
    slab: Box<dyn SlabMemory>,
    descs: Vec<Desc>,
}

impl core::fmt::Debug for BufferTable {
    // Not the bytes: a slab is megabytes.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("BufferTable")
            .field("slab_len", &self.slab.bytes().len())
            .field("buffers", &self.descs.len())
            .field("exposed", &self.exposed_count())
            .finish()
    }
}

/// Builds a [`BufferTable`]: add buffers, then `build` allocates the slab.
#[derive(Debug, Default)]
pub(crate) struct BufferTableBuilder {
    descs: Vec<Desc>,
    total: usize,
}

impl BufferTableBuilder {
    /// Adds one buffer of `len` bytes; returns its id. Buffers start at
    /// 64-byte boundaries of the slab (cache lines; any registration
    /// alignment beyond that is the worker's business).
    pub(crate) fn add(&mut self, class: BufClass, len: u32) -> BufId {
        let id = BufId(self.descs.len() as u32);
        let start = self.total.next_multiple_of(64);
        self.descs.push(Desc {
            start,
            len,
            class,
            // Default keys for callers that do not register (tests): the
            // worker replaces them with real rkeys and addresses.
            rkey: 0x100 + id.0,
            addr: start as u64,
            access: Access::None,
            window: (0, 0),
        });
        self.total = start + len as usize;
        id
    }

    /// Bytes of slab the buffers added so far need.
    pub(crate) fn total(&self) -> usize {
        self.total
    }

    /// The table over a fresh zeroed private slab, written once so that
    /// its pages are faulted in at construction, not on the data path.
    /// `None` if the memory cannot be had.
    pub(crate) fn build(self) -> Option<BufferTable> {
        let mut slab = Vec::new();
        slab.try_reserve_exact(self.total).ok()?;
        slab.resize(self.total, 0u8);
        Some(self.build_in(Box::new(slab.into_boxed_slice())))
    }

    /// The table over `memory`, which the caller checked holds at least
    /// [`BufferTableBuilder::total`] bytes.
    pub(crate) fn build_in(self, memory: Box<dyn SlabMemory>) -> BufferTable {
        BufferTable {
            slab: memory,
            descs: self.descs,
        }
    }
}

impl BufferTable {
    /// Number of buffers.
    pub fn count(&self) -> usize {
        self.descs.len()
    }

    /// The whole slab (for the worker to register once).
    pub fn slab(&self) -> &[u8] {
        self.slab.bytes()
    }

    fn desc(&self, id: BufId) -> Option<&Desc> {
        self.descs.get(id.0 as usize)
    }

    /// Offset of buffer `id` in the slab (0 for an unknown id).
    pub fn slab_offset(&self, id: BufId) -> usize {
        self.desc(id).map_or(0, |d| d.start)
    }

    /// Length of buffer `id` (0 for an unknown id).
    pub fn buf_len(&self, id: BufId) -> u32 {
        self.desc(id).map_or(0, |d| d.len)
    }

    /// The class of buffer `id`.
    pub fn class(&self, id: BufId) -> Option<BufClass> {
        self.desc(id).map(|d| d.class)
    }

    /// The bytes of buffer `id` (empty for an unknown id).
    pub fn bytes(&self, id: BufId) -> &[u8] {
        match self.desc(id) {
            Some(d) => self
                .slab
                .bytes()
                .get(d.start..d.start + d.len as usize)
                .unwrap_or(&[]),
            None => &[],
        }
    }

    /// The bytes of buffer `id`, writable: how a provider without real
    /// registered memory (the test harness) delivers receives and one-sided
    /// operations. Empty for an unknown id.
    pub fn bytes_mut(&mut self, id: BufId) -> &mut [u8] {
        match self.descs.get(id.0 as usize) {
            Some(d) => self
                .slab
                .bytes_mut()
                .get_mut(d.start..d.start + d.len as usize)
                .unwrap_or(&mut []),
            None => &mut [],
        }
    }

    /// The bytes named by `s`, if it lies inside its buffer.
    pub fn slice(&self, s: LocalSlice) -> Option<&[u8]> {
        let b = self.bytes(s.buf);
        b.get(s.offset as usize..(s.offset as usize).checked_add(s.len as usize)?)
    }

    /// Writable [`BufferTable::slice`].
    pub fn slice_mut(&mut self, s: LocalSlice) -> Option<&mut [u8]> {
        let b = self.bytes_mut(s.buf);
        b.get_mut(s.offset as usize..(s.offset as usize).checked_add(s.len as usize)?)
    }

    /// Installs the rkey and address under which the peer reaches buffer
    /// `id` (the worker calls this after registering the slab).
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
    /// `base`.
    pub(crate) fn retarget(&mut self, view: BufId, base: BufId, offset: u32, len: u32) -> bool {
        let Some(b) = self.desc(base).copied() else {
            return false;
        };
        if u64::from(offset) + u64::from(len) > u64::from(b.len) {
            return false;
        }
        match self.descs.get_mut(view.0 as usize) {
            Some(v) => {
                v.start = b.start + offset as usize;
                v.len = len;
                v.addr = b.addr.wrapping_add(u64::from(offset));
                v.access = Access::None;
                v.window = (0, 0);
                true
            }
            None => false,
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

    /// Exposes bytes `offset..offset + len` of buffer `id` for `access`
    /// (exactly what one advertised segment covers: a peer reaches nothing
    /// else of the buffer, e.g. stale bytes of an earlier call).
    pub(crate) fn set_access(&mut self, id: BufId, access: Access, offset: u32, len: u32) {
        if let Some(d) = self.descs.get_mut(id.0 as usize) {
            d.access = access;
            d.window = (offset, len);
        }
    }

    /// Withdraws any exposure of buffer `id`.
    pub(crate) fn unexpose(&mut self, id: BufId) {
        self.set_access(id, Access::None, 0, 0);
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

    /// Copies `src` to `dst_offset` in buffer `dst` (both inside the slab,
    /// possibly different buffers). Returns false, copying nothing, if
    /// either range falls outside its buffer.
    pub(crate) fn copy(&mut self, src: LocalSlice, dst: BufId, dst_offset: usize) -> bool {
        let (Some(s), Some(d)) = (self.desc(src.buf).copied(), self.desc(dst).copied()) else {
            return false;
        };
        let (so, sl) = (src.offset as usize, src.len as usize);
        if so + sl > s.len as usize || dst_offset + sl > d.len as usize {
            return false;
        }
        let slab = self.slab.bytes_mut();
        if s.start + so + sl > slab.len() || d.start + dst_offset + sl > slab.len() {
            return false;
        }
        slab.copy_within(s.start + so..s.start + so + sl, d.start + dst_offset);
        true
    }

    /// Zeroes `len` bytes at `offset` of buffer `id` (XDR roundup bytes
    /// the sender elided, RFC 5666 s3.7). False if out of range.
    pub(crate) fn zero(&mut self, id: BufId, offset: usize, len: usize) -> bool {
        match self.bytes_mut(id).get_mut(offset..offset + len) {
            Some(b) => {
                b.fill(0);
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
        let a = b.add(BufClass::Recv, 100);
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
        t.set_access(c, Access::RemoteRead, 8, 20);
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
        t.set_access(c, Access::RemoteRead, 0, 50);
        let past_end = t.segment(c, 40, 11);
        assert_eq!(t.resolve(&past_end, Access::RemoteRead), None);
        t.unexpose(c);
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
}
