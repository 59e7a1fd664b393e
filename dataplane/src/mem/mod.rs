//! Registered memory: arenas, fixed-size slabs, owned buffer handles and
//! typed work-request ids.
//!
//! * [`Arena`]: one shareable block of memory (a size-sealed memfd mapped
//!   `MAP_SHARED`, write-sealed for peers when exposed read-only), backed by 2 MiB hugepages when the host has them
//!   reserved, by 4 KiB pages otherwise (one warning line per process says
//!   how to reserve hugepages). Providers register ranges of an arena.
//! * [`Slab`]: fixed-size buffers carved from a registered arena range
//!   (receive, send, chunk buffers). Allocation and release are lock-free
//!   and never touch the heap.
//! * [`Buf`]: a non-`Clone` handle to one slab buffer. Posting a buffer moves
//!   the handle into the queue pair's work-request slot; the completion
//!   hands it back. Dropping a handle returns the buffer to its slab, so
//!   pool counts return to their totals when everything is closed.
//! * [`WrId`]: a typed work-request id (kind, slab index, generation).
//! * [`PeerBytes`], [`copy_out`], [`copy_in`]: how memory a peer can
//!   touch is read and written (copies, never a Rust slice).
//!
//! This module does not import `wire` or any provider.
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Once};

use crossbeam_queue::ArrayQueue;
use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::memfd::{memfd_create, MFdFlags};
use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};

pub mod guard;
mod peer;
pub use peer::{copy_in, copy_out, PeerBytes};

/// Size of a hugepage on x86-64 / aarch64 Linux (the only size we use).
pub const HUGEPAGE_SIZE: usize = 2 << 20;
/// Size of a normal page.
pub const PAGE_SIZE: usize = 4096;

/// The one warning line printed when hugepages are missing.
pub const HUGEPAGE_WARNING: &str = "rpcrdma: warning: no free 2 MiB hugepages, registered memory falls back to 4 KiB pages; \
     reserve some as root with `echo 64 > /proc/sys/vm/nr_hugepages` (or vm.nr_hugepages in sysctl.conf)";

/// Environment variable: `off` makes [`Backing::Auto`] behave as if no
/// hugepages were reserved.
pub const HUGEPAGES_ENV: &str = "RPCRDMA_HUGEPAGES";

static WARN_ONCE: Once = Once::new();
static FALLBACKS: AtomicUsize = AtomicUsize::new(0);

/// How many arenas of this process fell back to 4 KiB pages (the warning is
/// printed for the first one only).
pub fn hugepage_fallbacks() -> usize {
    FALLBACKS.load(Ordering::Relaxed)
}

/// Gives the heap's free pages back to the kernel (glibc's `malloc_trim`;
/// a no-op elsewhere). A connection's engine, queues and backlog are heap
/// allocations made by the acceptor thread and freed by a worker; glibc
/// keeps the freed pages in the acceptor's arena, so without this a
/// daemon's resident memory stays at its peak after clients leave. It
/// walks every arena under its lock: call it from the control plane after
/// connections closed, never per call (workers do not allocate in steady
/// state, so they do not wait on it). Returns whether memory was released.
pub fn release_free_heap() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: no arguments beyond the pad; thread-safe in glibc.
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// Errors of the (control-path) memory setup.
#[derive(Debug, thiserror::Error)]
pub enum MemError {
    /// `memfd_create`, `ftruncate`, sealing or `mmap` failed.
    #[error("cannot create {what} memory of {len} bytes: {source}")]
    Map {
        /// Which step or backing failed.
        what: &'static str,
        /// Requested length.
        len: usize,
        /// The OS error.
        source: nix::Error,
    },
    /// Slab geometry does not fit the arena or the id space.
    #[error("slab does not fit: {0}")]
    Geometry(&'static str),
    /// The arena is already shared with peers in the other role (see
    /// [`PeerAccess`]).
    #[error("arena sharing refused: {0}")]
    Sharing(&'static str),
    /// Adding the seals a sharing role needs failed (kernel < 5.1 for
    /// `F_SEAL_FUTURE_WRITE`, or a backing without seal support).
    #[error("cannot seal arena for peers: {0}")]
    Seal(nix::Error),
    /// The arena cannot be guarded against holes a peer punches in it
    /// ([`guard`]), so it is not shared writable.
    #[error("cannot share arena writable: {0}")]
    Guard(#[from] guard::GuardError),
}

/// What peers may do with an arena whose memfd we pass them. Decided by the
/// first exposure and fixed from then on (see [`Arena::share_writable`] and
/// [`Arena::share_read_only`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum PeerAccess {
    /// Never passed to a peer (seals: `SHRINK | GROW`).
    Private = 0,
    /// Passed writable (receive buffers, `REMOTE_WRITE`); seals
    /// `SHRINK | GROW | SEAL`.
    Writable = 1,
    /// Passed read-only (`REMOTE_READ`, outboxes); seals
    /// `SHRINK | GROW | FUTURE_WRITE | SEAL`: nobody can create a writable
    /// mapping or `write(2)` to it any more, through any descriptor, while
    /// our own read-write mapping keeps working.
    ReadOnly = 2,
}

/// Which pages back an arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backing {
    /// Try hugepages, fall back to 4 KiB pages with one warning.
    Auto,
    /// 2 MiB hugepages or an error.
    Huge,
    /// 4 KiB pages, no warning (small control regions).
    Small,
}

/// A block of shareable memory: a sealed memfd (size cannot change, so a
/// peer that maps it can never take a SIGBUS from a truncation) mapped
/// read-write here.
#[derive(Debug)]
pub struct Arena {
    ptr: NonNull<u8>,
    len: usize,
    fd: OwnedFd,
    huge: bool,
    id: u64,
    /// A [`PeerAccess`]; changed only under `share_lock`.
    peers: AtomicU8,
    share_lock: Mutex<()>,
    /// Set when the arena is first shared writable: a peer can punch
    /// holes in it from then on ([`guard`]).
    guard: std::sync::OnceLock<guard::PeerWritable>,
    /// Set for good when any range of it is registered with
    /// `REMOTE_WRITE` (a software provider's registration): peers may then
    /// write it through RDMA Writes.
    remote_writable: AtomicBool,
}

// SAFETY: the arena is plain memory plus an fd; all access to its bytes goes
// through `Buf` (unique ownership of a slab slot) or through providers, which
// document their own synchronisation. The pointer itself is never mutated.
unsafe impl Send for Arena {}
// SAFETY: see `Send`; `&Arena` only exposes the pointer value, the length and
// the fd.
unsafe impl Sync for Arena {}

static ARENA_IDS: AtomicUsize = AtomicUsize::new(1);

impl Arena {
    /// An arena of at least `len` bytes, hugepage-backed when possible
    /// ([`Backing::Auto`]).
    ///
    /// # Errors
    /// [`MemError::Map`] when even 4 KiB pages cannot be mapped.
    pub fn new(len: usize) -> Result<Arc<Arena>, MemError> {
        Self::with_backing(len, Backing::Auto)
    }

    /// An arena with an explicit backing policy.
    ///
    /// # Errors
    /// [`MemError::Map`] when the requested backing is unavailable.
    pub fn with_backing(len: usize, backing: Backing) -> Result<Arc<Arena>, MemError> {
        Self::build(len, backing, true)
    }

    /// Like [`Arena::with_backing`], but 4 KiB pages are not faulted in
    /// up front: they get memory when first touched. For large, sparsely
    /// used memory such as a connection's engine buffers, sized for the
    /// largest message in every request slot (docs/WORKER.md): populating
    /// them would cost their whole size in resident memory per
    /// connection. Hugepages are still populated (their reservation is
    /// what must not fail later).
    ///
    /// # Errors
    /// As [`Arena::with_backing`].
    pub fn with_backing_lazy(len: usize, backing: Backing) -> Result<Arc<Arena>, MemError> {
        Self::build(len, backing, false)
    }

    fn build(len: usize, backing: Backing, populate_small: bool) -> Result<Arc<Arena>, MemError> {
        let len = len.max(1);
        match backing {
            Backing::Huge => Self::map(len, true, true).map(Arc::new),
            Backing::Small => Self::map(len, false, populate_small).map(Arc::new),
            Backing::Auto => match Self::try_huge(len) {
                Ok(a) => Ok(Arc::new(a)),
                Err(_) => {
                    FALLBACKS.fetch_add(1, Ordering::Relaxed);
                    WARN_ONCE.call_once(|| eprintln!("{HUGEPAGE_WARNING}"));
                    Self::map(len, false, populate_small).map(Arc::new)
                }
            },
        }
    }

    /// Hugepages unless the operator turned them off with
    /// `RPCRDMA_HUGEPAGES=off` (also how tests exercise the fallback on a
    /// host that has hugepages).
    fn try_huge(len: usize) -> Result<Arena, MemError> {
        if std::env::var_os(HUGEPAGES_ENV).is_some_and(|v| v == "off") {
            return Err(MemError::Geometry("hugepages turned off"));
        }
        Self::map(len, true, true)
    }

    fn map(len: usize, huge: bool, populate: bool) -> Result<Arena, MemError> {
        let page = if huge { HUGEPAGE_SIZE } else { PAGE_SIZE };
        let len = len
            .checked_next_multiple_of(page)
            .ok_or(MemError::Geometry("length overflows"))?;
        let what = if huge { "hugepage" } else { "4 KiB page" };
        let err = |source| MemError::Map { what, len, source };
        let mut flags = MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING;
        if huge {
            flags |= MFdFlags::MFD_HUGETLB;
        }
        let fd = memfd_create(c"rpcrdma-arena", flags).map_err(err)?;
        nix::unistd::ftruncate(&fd, len as libc::off_t).map_err(err)?;
        // Seal the size: a peer mapping this fd must never see it shrink.
        // Not F_SEAL_SEAL yet: a read-only exposure adds F_SEAL_FUTURE_WRITE
        // later (after our read-write mapping exists), see `share_read_only`.
        fcntl(
            &fd,
            FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW),
        )
        .map_err(err)?;
        let nz = std::num::NonZeroUsize::new(len).ok_or(MemError::Geometry("empty"))?;
        // SAFETY: a fresh shared mapping of an fd we own, at a kernel-chosen
        // address; nothing else refers to that address range yet.
        // MAP_POPULATE faults every page in now (registration pins memory),
        // so hugetlb reservation failures surface here and not as SIGBUS;
        // lazy arenas skip it for 4 KiB pages (`with_backing_lazy`).
        let flags = if populate {
            MapFlags::MAP_SHARED | MapFlags::MAP_POPULATE
        } else {
            MapFlags::MAP_SHARED
        };
        let ptr = unsafe {
            mmap(
                None,
                nz,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                flags,
                &fd,
                0,
            )
        }
        .map_err(err)?;
        Ok(Arena {
            ptr: ptr.cast(),
            len,
            fd,
            huge,
            id: ARENA_IDS.fetch_add(1, Ordering::Relaxed) as u64,
            peers: AtomicU8::new(PeerAccess::Private as u8),
            remote_writable: AtomicBool::new(false),
            share_lock: Mutex::new(()),
            guard: std::sync::OnceLock::new(),
        })
    }

    /// What peers may do with this arena so far.
    pub fn peer_access(&self) -> PeerAccess {
        match self.peers.load(Ordering::Acquire) {
            0 => PeerAccess::Private,
            1 => PeerAccess::Writable,
            _ => PeerAccess::ReadOnly,
        }
    }

    /// Records that a range of the arena is registered with
    /// `REMOTE_WRITE`: from now on peers may write it.
    pub fn mark_remote_writable(&self) {
        self.remote_writable.store(true, Ordering::Release);
    }

    /// Whether a peer may write the arena: shared writable with one, or
    /// registered with `REMOTE_WRITE` somewhere. When false, only this
    /// process writes it, so its bytes may be read as a slice by whoever
    /// owns them (a work request, for its payload's ICRC).
    pub fn peer_may_write(&self) -> bool {
        self.remote_writable.load(Ordering::Acquire) || self.peer_access() == PeerAccess::Writable
    }

    /// Call before passing the memfd to a peer that may write it. The first
    /// call adds `F_SEAL_SEAL`, so a peer holding the fd cannot add seals
    /// either (e.g. `F_SEAL_FUTURE_WRITE`, which would break other peers'
    /// writable mappings).
    ///
    /// # Errors
    /// [`MemError::Sharing`] if the arena was sealed read-only for peers;
    /// [`MemError::Seal`] if sealing fails.
    pub fn share_writable(&self) -> Result<(), MemError> {
        self.share(PeerAccess::Writable)
    }

    /// Call before passing the memfd to a peer that may only read it. The
    /// first call adds `F_SEAL_FUTURE_WRITE | F_SEAL_SEAL` (Linux >= 5.1,
    /// shmem and hugetlbfs): from then on nobody, through any descriptor or
    /// a reopen of `/proc/<pid>/fd/N`, can map the memfd writable,
    /// `mprotect` a mapping writable, `write(2)` it or punch holes in it;
    /// our own read-write mapping (made at creation) keeps working.
    ///
    /// # Errors
    /// [`MemError::Sharing`] if the arena was already passed to a peer
    /// writable (its mappings cannot be revoked); [`MemError::Seal`] if the
    /// kernel or the backing cannot seal (then do not expose it at all).
    pub fn share_read_only(&self) -> Result<(), MemError> {
        self.share(PeerAccess::ReadOnly)
    }

    fn share(&self, want: PeerAccess) -> Result<(), MemError> {
        let _guard = self.share_lock.lock().unwrap_or_else(|e| e.into_inner());
        let now = self.peer_access();
        if now == want {
            return Ok(());
        }
        if now != PeerAccess::Private {
            return Err(MemError::Sharing(match want {
                PeerAccess::ReadOnly => {
                    "arena already shared writable with a peer; expose read-only memory from another arena"
                }
                _ => "arena is sealed read-only for peers; it cannot be shared writable (receive buffers, REMOTE_WRITE)",
            }));
        }
        let seals = match want {
            PeerAccess::ReadOnly => SealFlag::F_SEAL_FUTURE_WRITE | SealFlag::F_SEAL_SEAL,
            _ => SealFlag::F_SEAL_SEAL,
        };
        if want == PeerAccess::Writable {
            // Before the memfd leaves the process: from then on the peer
            // can punch holes, and a touch of one with the hugepage pool
            // empty must cost its connection, not the process.
            let page = if self.huge { HUGEPAGE_SIZE } else { PAGE_SIZE };
            // SAFETY: our mapping, page-aligned, mapped until `Drop`,
            // which drops the registration first.
            let g = unsafe { guard::PeerWritable::register(self.ptr.as_ptr(), self.len, page) }?;
            let _ = self.guard.set(g);
        }
        fcntl(&self.fd, FcntlArg::F_ADD_SEALS(seals)).map_err(MemError::Seal)?;
        self.peers.store(want as u8, Ordering::Release);
        Ok(())
    }

    /// The guard's view of this arena once shared writable: pages a
    /// peer's hole cost us ([`guard::GuardProbe::faults`]).
    pub fn guard_probe(&self) -> Option<guard::GuardProbe> {
        self.guard.get().map(guard::PeerWritable::probe)
    }

    /// First byte of the mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes (a multiple of the page size).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true (arenas have at least one page); for clippy's sake.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether 2 MiB hugepages back this arena.
    pub fn is_hugepage_backed(&self) -> bool {
        self.huge
    }

    /// The memfd (providers pass it to peers).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Process-unique id of this arena.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Whether `[addr, addr+len)` lies inside this arena.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        let base = self.ptr.as_ptr() as u64;
        addr >= base
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= base + self.len as u64)
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: the mapping was created in `map` with this pointer and
        // length; every `Buf`/`Slab`/registration holds an `Arc<Arena>`, so
        // no one can reach the memory after the last reference is gone.
        // The guard lets go of the range before it is unmapped.
        drop(self.guard.take());
        unsafe {
            let _ = munmap(self.ptr.cast(), self.len);
        }
    }
}

/// What a work request or buffer is for; the top byte of a [`WrId`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum WrKind {
    /// A receive buffer.
    Recv = 1,
    /// A send buffer (inline messages).
    Send = 2,
    /// A chunk buffer (RDMA Read / Write payload).
    Chunk = 3,
    /// Work requests without a buffer (e.g. local invalidate).
    Control = 4,
    /// A transport engine's work request (`dataplane::engine::WrId`
    /// folded into the index and generation fields; see `docs/ENGINE.md`,
    /// "Glue").
    Engine = 5,
}

impl WrKind {
    fn from_u8(v: u8) -> Option<WrKind> {
        Some(match v {
            1 => WrKind::Recv,
            2 => WrKind::Send,
            3 => WrKind::Chunk,
            4 => WrKind::Control,
            5 => WrKind::Engine,
            _ => return None,
        })
    }
}

/// A typed work-request id: kind (8 bits), slab index (24 bits), generation
/// (32 bits), packed into the 64 bits a hardware `wr_id` carries. Never a
/// pointer.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct WrId(u64);

/// Largest slab index a [`WrId`] can carry.
pub const MAX_SLAB_INDEX: u32 = (1 << 24) - 1;

impl WrId {
    /// Packs the three fields; `index` is truncated to 24 bits.
    pub const fn new(kind: WrKind, index: u32, generation: u32) -> WrId {
        WrId(((kind as u64) << 56) | (((index & MAX_SLAB_INDEX) as u64) << 32) | generation as u64)
    }
    /// The raw 64-bit value (what a hardware provider puts in `wr_id`).
    pub const fn to_raw(self) -> u64 {
        self.0
    }
    /// Rebuilds an id from its raw value; `None` if the kind is unknown.
    pub fn from_raw(raw: u64) -> Option<WrId> {
        WrKind::from_u8((raw >> 56) as u8).map(|_| WrId(raw))
    }
    /// The kind (`None` only for the default id).
    pub fn kind(self) -> Option<WrKind> {
        WrKind::from_u8((self.0 >> 56) as u8)
    }
    /// The slab index.
    pub const fn index(self) -> u32 {
        ((self.0 >> 32) as u32) & MAX_SLAB_INDEX
    }
    /// The generation.
    pub const fn generation(self) -> u32 {
        self.0 as u32
    }
}

impl std::fmt::Debug for WrId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "WrId({:?}#{}g{})",
            self.kind(),
            self.index(),
            self.generation()
        )
    }
}

#[derive(Debug)]
struct SlabShared {
    arena: Arc<Arena>,
    base: *mut u8,
    buf_size: u32,
    count: u32,
    lkey: u32,
    kind: WrKind,
    free: ArrayQueue<u32>,
    generations: Box<[AtomicU32]>,
    /// Every handle names the same `buf_size` bytes at `base` (region
    /// leases, [`Slab::region_leases`]): no handle may give out a Rust
    /// slice of them.
    aliased: bool,
}

// SAFETY: `base` points into `arena` (kept alive by the Arc); disjoint
// buffers are handed out exclusively through the lock-free free list.
unsafe impl Send for SlabShared {}
// SAFETY: as above; shared access touches only atomics and the queue.
unsafe impl Sync for SlabShared {}

/// A pool of fixed-size buffers carved from a registered arena range.
#[derive(Debug, Clone)]
pub struct Slab {
    shared: Arc<SlabShared>,
}

impl Slab {
    /// `count` buffers of `buf_size` bytes starting at `offset` in `arena`,
    /// registered under `lkey` (the provider's key for the range).
    ///
    /// # Errors
    /// [`MemError::Geometry`] if the buffers do not fit in the arena or the
    /// count exceeds the 24-bit index space.
    pub fn new(
        arena: Arc<Arena>,
        offset: usize,
        buf_size: u32,
        count: u32,
        lkey: u32,
        kind: WrKind,
    ) -> Result<Slab, MemError> {
        if count == 0 || count > MAX_SLAB_INDEX + 1 {
            return Err(MemError::Geometry("count out of range"));
        }
        let bytes = (buf_size as usize)
            .checked_mul(count as usize)
            .and_then(|b| b.checked_add(offset))
            .ok_or(MemError::Geometry("size overflows"))?;
        if bytes > arena.len() {
            return Err(MemError::Geometry("buffers exceed the arena"));
        }
        let free = ArrayQueue::new(count as usize);
        for i in 0..count {
            let _ = free.push(i);
        }
        // SAFETY: offset <= bytes <= arena.len(), so the result stays inside
        // (or one past the end of) the mapping.
        let base = unsafe { arena.as_ptr().add(offset) };
        Ok(Slab {
            shared: Arc::new(SlabShared {
                arena,
                base,
                buf_size,
                count,
                lkey,
                kind,
                free,
                generations: (0..count).map(|_| AtomicU32::new(0)).collect(),
                aliased: false,
            }),
        })
    }

    /// Up to `max_leases` non-exclusive handles ("region leases") over one
    /// registered range: `len` bytes at `offset` in `arena`, under `lkey`.
    ///
    /// Why: a transport engine names its memory by ranges of one slab and
    /// may have several work requests on the same bytes at once (several
    /// RDMA Reads into one message buffer, several Writes from one), while
    /// a verbs work request must own a [`Buf`] per scatter/gather element.
    /// A lease is such a `Buf` whose address and capacity are the whole
    /// range (the SGE's offset and length select the bytes). Leases alias
    /// each other, so they copy nothing: [`Buf::read`], [`Buf::write`]
    /// and [`Buf::fill`]
    /// refuses; providers use [`Buf::as_ptr`]. The owner of the range
    /// (the engine) decides which bytes are in flight. The count is
    /// bounded and accounted like a slab (`available() == total()` when
    /// nothing is posted).
    ///
    /// # Errors
    /// [`MemError::Geometry`] if the range is outside the arena or
    /// `max_leases` is 0 or beyond the 24-bit index space.
    pub fn region_leases(
        arena: Arc<Arena>,
        offset: usize,
        len: u32,
        max_leases: u32,
        lkey: u32,
        kind: WrKind,
    ) -> Result<Slab, MemError> {
        if max_leases == 0 || max_leases > MAX_SLAB_INDEX + 1 {
            return Err(MemError::Geometry("lease count out of range"));
        }
        if offset
            .checked_add(len as usize)
            .is_none_or(|end| end > arena.len())
        {
            return Err(MemError::Geometry("region exceeds the arena"));
        }
        let free = ArrayQueue::new(max_leases as usize);
        for i in 0..max_leases {
            let _ = free.push(i);
        }
        // SAFETY: offset + len <= arena.len(), checked above.
        let base = unsafe { arena.as_ptr().add(offset) };
        Ok(Slab {
            shared: Arc::new(SlabShared {
                arena,
                base,
                buf_size: len,
                count: max_leases,
                lkey,
                kind,
                free,
                generations: (0..max_leases).map(|_| AtomicU32::new(0)).collect(),
                aliased: true,
            }),
        })
    }

    /// Whether this slab hands out region leases ([`Slab::region_leases`]).
    pub fn is_region(&self) -> bool {
        self.shared.aliased
    }

    /// Takes a free buffer (length 0), or `None` when all are in use.
    pub fn alloc(&self) -> Option<Buf> {
        let index = self.shared.free.pop()?;
        let generation = self.shared.generations[index as usize].load(Ordering::Relaxed);
        Some(Buf {
            shared: self.shared.clone(),
            index,
            generation,
            len: 0,
        })
    }

    /// Buffers currently free.
    pub fn available(&self) -> usize {
        self.shared.free.len()
    }

    /// Configured number of buffers.
    pub fn total(&self) -> usize {
        self.shared.count as usize
    }

    /// Size of each buffer.
    pub fn buf_size(&self) -> u32 {
        self.shared.buf_size
    }

    /// The arena the slab lives in.
    pub fn arena(&self) -> &Arc<Arena> {
        &self.shared.arena
    }
}

/// One slab buffer, owned. Not `Clone`: whoever holds it may use the bytes;
/// posting it to a queue pair moves it away until its completion.
#[derive(Debug)]
pub struct Buf {
    shared: Arc<SlabShared>,
    index: u32,
    generation: u32,
    len: u32,
}

impl Buf {
    /// Typed id of this buffer (the slab's kind, index, generation).
    pub fn wr_id(&self) -> WrId {
        WrId::new(self.shared.kind, self.index, self.generation)
    }
    /// Slab index.
    pub fn index(&self) -> u32 {
        self.index
    }
    /// Generation (bumped each time the buffer returns to its slab).
    pub fn generation(&self) -> u32 {
        self.generation
    }
    /// Key the buffer's memory is registered under.
    pub fn lkey(&self) -> u32 {
        self.shared.lkey
    }
    /// Virtual address of the first byte (what an SGE carries).
    pub fn addr(&self) -> u64 {
        self.base_ptr() as u64
    }
    /// Capacity in bytes.
    pub fn capacity(&self) -> u32 {
        self.shared.buf_size
    }
    /// Valid length (set by the user before a send, by the provider on a
    /// receive or read completion).
    pub fn len(&self) -> u32 {
        self.len
    }
    /// Whether the valid length is zero.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Sets the valid length, clamped to the capacity.
    pub fn set_len(&mut self, len: u32) {
        self.len = len.min(self.shared.buf_size);
    }
    /// The arena holding this buffer.
    pub fn arena(&self) -> &Arc<Arena> {
        &self.shared.arena
    }
    /// Whether this is a region lease ([`Slab::region_leases`]): the bytes
    /// are shared with other leases and have no slice view.
    pub fn is_lease(&self) -> bool {
        self.shared.aliased
    }
    fn view_len(&self) -> usize {
        if self.shared.aliased {
            0
        } else {
            self.shared.buf_size as usize
        }
    }
    fn base_ptr(&self) -> *mut u8 {
        if self.shared.aliased {
            return self.shared.base;
        }
        // SAFETY: index < count and the slab geometry was checked to fit the
        // arena in `Slab::new`.
        unsafe {
            self.shared
                .base
                .add(self.index as usize * self.shared.buf_size as usize)
        }
    }
    /// Raw pointer to the first byte, for providers.
    pub fn as_ptr(&self) -> *mut u8 {
        self.base_ptr()
    }
    /// Copies `dst.len()` bytes at `offset` of the buffer into `dst`.
    /// False (copying nothing) if the range is outside the buffer, or the
    /// buffer is a region lease.
    ///
    /// A buffer's bytes are never handed out as a Rust slice: registered
    /// memory may be written by a peer (shm maps it; a Send lands in it)
    /// or by a provider thread, so the only sound access is a copy through
    /// a raw pointer into memory this process owns, parsed afterwards.
    pub fn read(&self, offset: u32, dst: &mut [u8]) -> bool {
        let Some(end) = (offset as usize).checked_add(dst.len()) else {
            return false;
        };
        if end > self.view_len() {
            return false;
        }
        // SAFETY: `offset..end` lies inside this buffer (checked above),
        // which lies inside the live arena; `dst` is our own memory and
        // cannot overlap registered memory handed out as a `Buf`.
        unsafe { copy_out(self.base_ptr().add(offset as usize), dst) };
        true
    }
    /// Copies `src` to `offset` of the buffer (the valid length is not
    /// changed). False (copying nothing) if it does not fit, or the buffer
    /// is a region lease.
    pub fn write(&mut self, offset: u32, src: &[u8]) -> bool {
        let Some(end) = (offset as usize).checked_add(src.len()) else {
            return false;
        };
        if end > self.view_len() {
            return false;
        }
        // SAFETY: as in `read`; `&mut self` makes this handle the only
        // writer of these bytes in this process.
        unsafe { copy_in(src, self.base_ptr().add(offset as usize)) };
        true
    }
    /// A copy of the valid bytes (empty for a region lease). For tests and
    /// the control path; the data path reads into its own buffers.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; (self.len as usize).min(self.view_len())];
        self.read(0, &mut v);
        v
    }
    /// Copies `src` to the start of the buffer and sets the length.
    /// Returns false (and copies nothing) if it does not fit (always for
    /// a non-empty `src` into a region lease).
    pub fn fill(&mut self, src: &[u8]) -> bool {
        if !self.write(0, src) {
            return false;
        }
        self.len = src.len() as u32;
        true
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        self.shared.generations[self.index as usize].fetch_add(1, Ordering::Relaxed);
        // Cannot fail: the queue has room for every index and each index is
        // owned by exactly one handle.
        let _ = self.shared.free.push(self.index);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wr_id_round_trip() {
        let id = WrId::new(WrKind::Chunk, 0x12_3456, 0xdead_beef);
        assert_eq!(id.kind(), Some(WrKind::Chunk));
        assert_eq!(id.index(), 0x12_3456);
        assert_eq!(id.generation(), 0xdead_beef);
        assert_eq!(WrId::from_raw(id.to_raw()), Some(id));
        assert_eq!(WrId::from_raw(0), None);
    }

    #[test]
    fn slab_accounting_and_generations() {
        let arena = Arena::with_backing(64 * 1024, Backing::Small).unwrap();
        let slab = Slab::new(arena, 0, 4096, 8, 7, WrKind::Recv).unwrap();
        let mut bufs: Vec<Buf> = (0..8).map(|_| slab.alloc().unwrap()).collect();
        assert!(slab.alloc().is_none());
        assert_eq!(slab.available(), 0);
        assert!(bufs[0].fill(b"hello"));
        assert_eq!(bufs[0].to_vec(), b"hello");
        assert_eq!(bufs[0].lkey(), 7);
        let first = bufs.remove(0);
        let (idx, generation) = (first.index(), first.generation());
        drop(first);
        let again = slab.alloc().unwrap();
        assert_eq!(again.index(), idx);
        assert_eq!(again.generation(), generation + 1);
        drop(again);
        drop(bufs);
        assert_eq!(slab.available(), slab.total());
    }

    #[test]
    fn region_leases_alias_one_range_and_are_accounted() {
        let arena = Arena::with_backing(64 * 1024, Backing::Small).unwrap();
        let leases = Slab::region_leases(arena.clone(), 4096, 8192, 3, 9, WrKind::Engine).unwrap();
        assert!(leases.is_region());
        let a = leases.alloc().unwrap();
        let mut b = leases.alloc().unwrap();
        let c = leases.alloc().unwrap();
        assert!(leases.alloc().is_none(), "bounded count");
        assert_eq!(a.addr(), arena.as_ptr() as u64 + 4096);
        assert_eq!(a.addr(), b.addr());
        assert_eq!(c.capacity(), 8192);
        assert_eq!(c.lkey(), 9);
        assert!(a.is_lease());
        // No slice views on aliased memory.
        b.set_len(100);
        assert!(b.to_vec().is_empty() && !b.read(0, &mut [0u8; 1]));
        assert!(!b.write(0, b"x"));
        assert!(!b.fill(b"x"));
        assert!(b.fill(b""));
        drop((a, b, c));
        assert_eq!(leases.available(), leases.total());
        assert!(Slab::region_leases(arena.clone(), 60 * 1024, 8192, 1, 1, WrKind::Engine).is_err());
        assert!(Slab::region_leases(arena, 0, 4096, 0, 1, WrKind::Engine).is_err());
    }

    /// Pages of `a` that are resident (mincore(2)).
    fn resident_pages(a: &Arena) -> usize {
        let pages = a.len() / PAGE_SIZE;
        let mut vec = vec![0u8; pages];
        // SAFETY: the range is the arena's live mapping; `vec` has one byte
        // per page as mincore requires.
        let rc = unsafe { libc::mincore(a.as_ptr().cast(), a.len(), vec.as_mut_ptr()) };
        assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
        vec.iter().filter(|&&b| b & 1 == 1).count()
    }

    #[test]
    fn lazy_small_arenas_are_not_populated() {
        let len = 16 << 20;
        let eager = Arena::with_backing(len, Backing::Small).unwrap();
        assert_eq!(resident_pages(&eager), len / PAGE_SIZE);
        let lazy = Arena::with_backing_lazy(len, Backing::Small).unwrap();
        assert!(resident_pages(&lazy) < 16, "{}", resident_pages(&lazy));
        // Touching one page makes that page (and only about that) resident.
        // SAFETY: inside the live mapping.
        unsafe { lazy.as_ptr().add(5 * PAGE_SIZE).write(1) };
        let r = resident_pages(&lazy);
        assert!((1..32).contains(&r), "{r}");
    }

    #[test]
    fn slab_geometry_checked() {
        let arena = Arena::with_backing(8192, Backing::Small).unwrap();
        assert!(Slab::new(arena.clone(), 0, 4096, 3, 1, WrKind::Send).is_err());
        assert!(Slab::new(arena, 4096, 4096, 1, 1, WrKind::Send).is_ok());
    }
}
