//! One RPC-over-RDMA connection on a verbs provider: the engine's
//! [`Connection`] glued to a connected queue pair, its completion queue and
//! its registered memory.
//!
//! Buffer model (docs/ENGINE.md, "Glue"): each endpoint owns one
//! [`Arena`] (memfd, hugepage-backed when available) sized by
//! [`Connection::memory_len`]. The engine cuts its buffers from it through
//! [`ArenaSlab`] (a [`SlabMemory`]); the whole arena is registered as one
//! memory region and exposed once to this connection's queue pair, and that
//! key is installed for every engine buffer (`set_remote_key`). A verbs
//! work request must own a [`mem::Buf`] per scatter/gather element, while the
//! engine may have several requests on one buffer at once, so each SGE
//! carries a region lease ([`Slab::region_leases`]) over the whole arena
//! with the engine's byte range as offset and length. Leases are bounded
//! (send queue + receive queue + slack) and all come back when every posted
//! request has completed, which is the endpoint's drain test.
//!
//! Why one arena per connection: with the `shm` provider a peer maps the
//! whole arena behind a key it was given (docs/VERBS.md), so memory a peer
//! may touch must not be shared with another connection.
//!
//! Work-request ids: the verbs layer carries [`mem::WrId`] with kind
//! [`mem::WrKind::Engine`]; the engine's id (kind 4 bits, generation 28
//! bits, index) folds into it losslessly as long as the index fits 24 bits,
//! which every engine configuration guarantees (counts are at most 4096).
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use crate::engine::{
    self, BufferTable, BulkMemory, BulkPool, CloseReason, ConfigError, Connection, CreditPool,
    Event, PeerLimits, PeerMemory, Resources, SlabMemory, Stats, WorkRequest,
};
use crate::mem::{self, Arena, Backing, Buf, Slab};
use crate::verbs::{
    Access, BindWindow, Completion, CompletionQueue, Context, Incoming, MemoryRegion, PostError,
    PreparedQp, ProtectionDomain, Provider, QpCaps, QpState, QueuePair, RecvWr, RemoteAddr, SendOp,
    SendWr, Sge, SgeList, SharedReceiveQueue, SrqCaps, VerbsError, WcOpcode, WcStatus, Window,
};
use crate::wire::rpcrdma::{PrivateData, PRIVATE_DATA_LEN};

/// Completions taken from a completion queue per poll.
pub const POLL_BURST: usize = 32;

/// Packs an engine work-request id into the id the verbs layer carries:
/// kind [`mem::WrKind::Engine`], the engine index as the 24-bit index, the
/// engine kind (4 bits) and generation (28 bits) as the 32-bit generation.
pub fn to_verbs_wr_id(id: engine::WrId) -> mem::WrId {
    let generation = ((id.kind as u32) << 28) | (id.generation & ((1 << 28) - 1));
    mem::WrId::new(mem::WrKind::Engine, id.index, generation)
}

/// Unpacks [`to_verbs_wr_id`]; `None` for an id of another kind or an
/// unknown engine kind.
pub fn from_verbs_wr_id(id: mem::WrId) -> Option<engine::WrId> {
    if id.kind() != Some(mem::WrKind::Engine) {
        return None;
    }
    let g = id.generation();
    engine::WrId::from_u64(
        (u64::from(g >> 28) << 60) | (u64::from(g & ((1 << 28) - 1)) << 32) | u64::from(id.index()),
    )
}

/// The engine's view of a provider completion status.
pub fn engine_status(status: WcStatus) -> engine::WcStatus {
    match status {
        WcStatus::Success => engine::WcStatus::Success,
        WcStatus::WrFlushErr => engine::WcStatus::Flushed,
        WcStatus::RemAccessErr => engine::WcStatus::RemoteAccessError,
        WcStatus::RnrRetryExcErr => engine::WcStatus::ReceiverNotReady,
        WcStatus::LocLenErr => engine::WcStatus::LengthError,
        WcStatus::LocProtErr
        | WcStatus::LocQpOpErr
        | WcStatus::RemInvReqErr
        | WcStatus::RetryExcErr
        | WcStatus::MwBindErr => engine::WcStatus::Other,
    }
}

/// The engine's private region ([`engine::Memory::Private`]), living in
/// a registered [`Arena`] that peers can at most read (with `shm`, it is
/// shared read-only and sealed against writes).
///
/// The engine reads and writes its buffers through these slices; the
/// provider reaches the same bytes through raw pointers of region leases
/// only while a work request owns them, on bytes the engine does not touch
/// until the completion (its slot state machines guarantee it).
pub struct ArenaSlab {
    arena: Arc<Arena>,
    len: usize,
}

impl ArenaSlab {
    /// The first `len` bytes of `arena` (clamped to its length).
    pub fn new(arena: Arc<Arena>, len: usize) -> ArenaSlab {
        let len = len.min(arena.len());
        ArenaSlab { arena, len }
    }
}

impl core::fmt::Debug for ArenaSlab {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ArenaSlab")
            .field("arena", &self.arena.id())
            .field("len", &self.len)
            .finish()
    }
}

impl SlabMemory for ArenaSlab {
    fn bytes(&self) -> &[u8] {
        // SAFETY: `len` is within the live mapping (kept alive by the Arc);
        // see the type documentation for who else touches these bytes.
        unsafe { std::slice::from_raw_parts(self.arena.as_ptr(), self.len) }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; `&mut self` is the engine's exclusive view.
        unsafe { std::slice::from_raw_parts_mut(self.arena.as_ptr(), self.len) }
    }
}

/// The engine's peer region ([`engine::Memory::Peer`]): receive buffers
/// and RDMA Write targets, in a registered [`Arena`] the peer may write
/// at any moment (with `shm`, it has the arena mapped writable). Only a
/// pointer and a length: the engine copies in and out of it.
pub struct ArenaPeerMemory {
    arena: Arc<Arena>,
    len: usize,
}

impl ArenaPeerMemory {
    /// The first `len` bytes of `arena` (clamped to its length).
    pub fn new(arena: Arc<Arena>, len: usize) -> ArenaPeerMemory {
        let len = len.min(arena.len());
        ArenaPeerMemory { arena, len }
    }
}

impl core::fmt::Debug for ArenaPeerMemory {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ArenaPeerMemory")
            .field("arena", &self.arena.id())
            .field("len", &self.len)
            .finish()
    }
}

// SAFETY: the arena stays mapped while the Arc lives, and nothing in this
// process makes a reference to its bytes (the engine copies).
unsafe impl PeerMemory for ArenaPeerMemory {
    fn as_ptr(&self) -> *mut u8 {
        self.arena.as_ptr()
    }
    fn len(&self) -> usize {
        self.len
    }
}

/// How endpoints are built.
#[derive(Debug, Clone, Copy)]
pub struct EndpointConfig {
    /// The engine's configuration (limits, credits, sizes).
    pub engine: engine::Config,
    /// Send-queue depth. The engine does not track it and may emit many
    /// work requests for one reply (Writes of a long reply chunk); what
    /// does not fit waits in the endpoint's backlog.
    pub max_send_wr: u32,
    /// Work requests the backlog holds without growing (it grows, rarely,
    /// beyond that: the engine's output is never dropped).
    pub backlog: usize,
    /// Timeout of connection setup (connect side).
    pub connect_timeout: Duration,
    /// Page size of the connection's arena (hugepages when available by
    /// default; the daemon maps `memory.hugepages` here).
    pub backing: Backing,
    /// Grant the peer remote access to the connection's memory. A
    /// requester must (the responder reads its read chunks and writes its
    /// write and reply chunks); a responder only needs it for
    /// responder-provided read chunks, so a server that does not offer
    /// them sets this to false and its peer gets no key at all (with the
    /// `shm` provider receive buffers are still shared for Sends, see
    /// docs/VERBS.md "Known gaps").
    pub expose_memory: bool,
    /// Receiver-not-ready retries before a Send fails (7: forever).
    pub rnr_retry: u8,
    /// Wait between receiver-not-ready retries. Credits (RFC 5666 s3.3)
    /// keep a conforming peer from ever running out of receives, so RNR
    /// only happens in the window between the passive side's accept and
    /// its receives becoming visible (the `shm` provider answers ACCEPT
    /// before it publishes them); under load that window exceeds the
    /// ibverbs-like 60 ms default, so the budget here is generous.
    pub rnr_timer: Duration,
}

impl Default for EndpointConfig {
    fn default() -> Self {
        EndpointConfig {
            engine: engine::Config::default(),
            max_send_wr: 256,
            backlog: 512,
            connect_timeout: Duration::from_secs(10),
            backing: Backing::Auto,
            expose_memory: true,
            rnr_retry: 6,
            rnr_timer: Duration::from_millis(250),
        }
    }
}

impl EndpointConfig {
    /// Receive-queue depth: every receive the engine may post
    /// (`engine::Config::max_receives`, whatever it counts), and one more.
    fn max_recv_wr(&self) -> u32 {
        self.engine.max_receives() + 1
    }

    /// Our RFC 8797 private data: inline sizes, no remote invalidation
    /// (see [`EndpointConfig::private_data_with`]).
    pub fn private_data(&self) -> [u8; PRIVATE_DATA_LEN] {
        self.private_data_with(false)
    }

    /// Our RFC 8797 private data, telling the peer whether it may
    /// invalidate our keys with Send With Invalidate.
    pub fn private_data_with(&self, remote_invalidate: bool) -> [u8; PRIVATE_DATA_LEN] {
        let mut out = [0u8; PRIVATE_DATA_LEN];
        let pd = PrivateData {
            remote_invalidate,
            max_send_size: self.engine.inline_send_size,
            max_recv_size: self.engine.inline_recv_size,
        };
        // Cannot fail: the buffer is exactly PRIVATE_DATA_LEN long.
        let _ = pd.emit(&mut out);
        out
    }
}

/// Why an endpoint could not be built or connected.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    /// The engine refused the configuration.
    #[error("engine configuration: {0}")]
    Config(#[from] engine::ConfigError),
    /// Memory, registration, queue creation or connection setup failed.
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    /// The engine's memory is larger than one registration can name
    /// (4 GiB: SGE offsets are 32-bit).
    #[error("connection memory of {0} bytes exceeds 4 GiB; lower sizes or credits")]
    TooLarge(usize),
    /// Pre-posting the engine's receives failed.
    #[error("pre-posting receives failed: {0}")]
    PrePost(PostError),
}

/// One registered region of an endpoint.
struct Region<P: Provider> {
    mr: P::Mr,
    leases: Slab,
    arena: Arc<Arena>,
}

impl<P: Provider> Region<P> {
    /// `len` bytes (at least one page) in a fresh arena, registered with
    /// `access`, with `max_leases` region leases over it.
    fn new(
        pd: &P::Pd,
        len: usize,
        access: Access,
        max_leases: u32,
        backing: Backing,
    ) -> Result<Region<P>, EndpointError> {
        let len = len.max(mem::PAGE_SIZE);
        // Lazy: sized for the largest message in every slot, touched only
        // where messages land (the populate would cost the whole size).
        let arena = Arena::with_backing_lazy(len, backing).map_err(VerbsError::from)?;
        let mr = pd.register(&arena, 0, len, access)?;
        let leases = Slab::region_leases(
            arena.clone(),
            0,
            len as u32,
            max_leases,
            mr.lkey(),
            mem::WrKind::Engine,
        )
        .map_err(VerbsError::from)?;
        Ok(Region { mr, leases, arena })
    }

    fn leases_idle(&self) -> bool {
        self.leases.available() == self.leases.total()
    }
}

/// `want` memory windows of `qp` for per-exchange keys, or `None` when
/// the provider cannot give that many (no type 2 windows, or more than
/// its key table holds beside the two region keys the fallback needs).
fn alloc_key_windows<P: Provider>(qp: &mut P::Qp, want: usize) -> Option<Vec<Window>> {
    // Two slots of the 256-entry key tables stay free for region keys.
    if want > MAX_KEY_WINDOWS {
        return None;
    }
    let mut windows = Vec::with_capacity(want);
    for _ in 0..want {
        windows.push(qp.alloc_window().ok()?);
    }
    Some(windows)
}

/// Most windows an endpoint asks for (every provider has 256 keys per
/// queue pair, shared with whole-region exposures).
pub const MAX_KEY_WINDOWS: usize = 254;

/// A worker's bulk buffer pool for one provider (docs/WORKER.md, "Bulk
/// buffers"): one arena registered once in the provider's protection
/// domain, cut into the buffers of an [`engine::BulkPool`] that the
/// worker's connections lease large messages from, plus the work-request
/// leases over it. Local access only: pool buffers are never exposed.
pub struct BulkBuffers<P: Provider> {
    region: Arc<Region<P>>,
    pool: Arc<BulkPool>,
}

impl<P: Provider> core::fmt::Debug for BulkBuffers<P> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("BulkBuffers")
            .field("pool", &self.pool)
            .finish()
    }
}

impl<P: Provider> BulkBuffers<P> {
    /// `count` buffers of `buf_len` bytes in a fresh arena of `backing`
    /// registered in `pd`, with `max_leases` work-request leases over it
    /// (every posted work request naming a pool buffer holds one; when
    /// they run out, work waits in its endpoint's backlog). Pages are
    /// faulted in at first use, once: the pool is reused, not refilled.
    ///
    /// # Errors
    /// [`EndpointError::Verbs`] for memory or registration;
    /// [`EndpointError::Config`] for no buffer at all.
    pub fn new(
        pd: &P::Pd,
        count: u32,
        buf_len: u32,
        backing: Backing,
        max_leases: u32,
    ) -> Result<BulkBuffers<P>, EndpointError> {
        let len = BulkPool::memory_len(count, buf_len);
        if len > u32::MAX as usize {
            return Err(EndpointError::TooLarge(len));
        }
        let region = Region::new(pd, len, Access::LOCAL_WRITE, max_leases, backing)?;
        let memory = ArenaBulkMemory(region.arena.clone(), len);
        let pool = BulkPool::new(Box::new(memory), buf_len)
            .ok_or(EndpointError::Config(ConfigError::BadCount))?;
        Ok(BulkBuffers {
            region: Arc::new(region),
            pool: Arc::new(pool),
        })
    }

    /// The engine's view of the pool.
    pub fn pool(&self) -> &Arc<BulkPool> {
        &self.pool
    }

    /// Whether every buffer and every work-request lease is back (the
    /// leak check once the worker's connections are gone).
    pub fn is_idle(&self) -> bool {
        self.pool.available() == self.pool.count() && self.region.leases_idle()
    }
}

/// Staging slots per connection on a shared receive queue, where the
/// provider has them (`shm`: each peer writes its Sends into slots of its
/// own connection, copied into shared receives when polled). A peer can
/// have this many messages delivered between two polls of its queue
/// pair: with 4, a depth-32 client was held to 4 calls per worker
/// iteration. 16 cost 64 KiB of address space per connection with 4 KiB
/// messages, of which an idle connection touches a page.
pub const STAGING_SLOTS: u32 = 16;

/// A worker's shared receive queue for one provider (docs/WORKER.md,
/// "Shared receives"): `count` inline-size buffers in one arena
/// registered once with local access only, posted to one queue that
/// every connection of the worker on that provider receives from. A
/// connection copies each message out and gives the buffer back at
/// once (or when its call leaves the wait for a slot); the endpoint
/// posts it again, so the queue stays full.
pub struct SharedRecvs<P: Provider> {
    srq: P::Srq,
    slab: Slab,
    _mr: P::Mr,
    /// The receives as credits that back the grants of the connections.
    credits: Arc<CreditPool>,
    /// Messages that arrived in the queue's buffers.
    messages: std::sync::atomic::AtomicU64,
}

impl<P: Provider> core::fmt::Debug for SharedRecvs<P> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SharedRecvs")
            .field("count", &self.slab.total())
            .field("buf_size", &self.slab.buf_size())
            .finish()
    }
}

impl<P: Provider> SharedRecvs<P> {
    /// A shared receive queue in `pd` with `count` posted receives of
    /// `buf_size` bytes, in a fresh arena of `backing`.
    ///
    /// # Errors
    /// [`EndpointError::Verbs`] for memory, registration or the queue;
    /// [`EndpointError::PrePost`] if the queue refuses the receives.
    pub fn new(
        pd: &P::Pd,
        count: u32,
        buf_size: u32,
        backing: Backing,
    ) -> Result<SharedRecvs<P>, EndpointError> {
        let len = (count as usize)
            .checked_mul(buf_size as usize)
            .filter(|&l| l > 0 && l <= u32::MAX as usize)
            .ok_or(EndpointError::TooLarge(count as usize * buf_size as usize))?;
        let arena = Arena::with_backing_lazy(len, backing).map_err(VerbsError::from)?;
        let mr = pd.register(&arena, 0, len, Access::LOCAL_WRITE)?;
        let slab = Slab::new(arena, 0, buf_size, count, mr.lkey(), mem::WrKind::Recv)
            .map_err(VerbsError::from)?;
        let srq = pd.create_srq(SrqCaps {
            max_wr: count,
            max_message: buf_size,
            staging_slots: STAGING_SLOTS,
        })?;
        let shared = SharedRecvs {
            srq,
            slab,
            _mr: mr,
            credits: Arc::new(CreditPool::new(count)),
            messages: std::sync::atomic::AtomicU64::new(0),
        };
        if shared.refill() < count as usize {
            return Err(EndpointError::PrePost(PostError::QueueFull));
        }
        Ok(shared)
    }

    /// Posts every buffer not posted (those a closed connection dropped
    /// instead of giving back); returns how many are posted now.
    pub fn refill(&self) -> usize {
        // Bounded: a refused post puts its buffer back in the slab.
        for _ in 0..self.slab.available() {
            let Some(buf) = self.slab.alloc() else {
                break;
            };
            self.repost(buf);
        }
        self.srq.posted()
    }

    /// Posts `buf` again. A refusal drops it back into the slab, for the
    /// next [`SharedRecvs::refill`].
    pub fn repost(&self, buf: Buf) {
        let wr = RecvWr {
            wr_id: buf.wr_id(),
            sgl: SgeList::one(Sge::whole(buf)),
        };
        drop(self.srq.post_recv(wr));
    }

    /// Receives posted now.
    pub fn posted(&self) -> usize {
        self.srq.posted()
    }

    /// Buffers in all.
    pub fn count(&self) -> usize {
        self.slab.total()
    }

    /// The receives as credits: what the connections' grants reserve.
    pub fn credits(&self) -> &Arc<CreditPool> {
        &self.credits
    }

    /// Messages that arrived in the queue's buffers so far.
    pub fn messages(&self) -> u64 {
        self.messages.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether every buffer is posted or free (the leak check once the
    /// worker's connections are gone).
    pub fn is_full(&self) -> bool {
        self.srq.posted() + self.slab.available() == self.slab.total()
    }

    /// Whether 2 MiB hugepages back the receive buffers.
    pub fn is_hugepage_backed(&self) -> bool {
        self.slab.arena().is_hugepage_backed()
    }

    /// Bytes of each receive buffer.
    pub fn buf_size(&self) -> u32 {
        self.slab.buf_size()
    }

    /// Whether a dropped buffer waits for [`SharedRecvs::refill`]
    /// (one atomic load: checked on every flush).
    fn needs_refill(&self) -> bool {
        self.slab.available() > 0
    }
}

/// A bulk pool's arena as the engine sees it: a pointer and a length.
#[derive(Debug)]
struct ArenaBulkMemory(Arc<Arena>, usize);

// SAFETY: the arena stays mapped while the Arc lives; it is registered for
// local access only and never shared with a peer, so only this process
// writes it, and only through the pool's leases.
unsafe impl BulkMemory for ArenaBulkMemory {
    fn as_ptr(&self) -> *mut u8 {
        self.0.as_ptr()
    }
    fn len(&self) -> usize {
        self.1.min(self.0.len())
    }
    fn is_hugepage_backed(&self) -> bool {
        self.0.is_hugepage_backed()
    }
}

/// Registered memory of one endpoint: the engine's two regions, and the
/// worker's bulk pool when the connection leases from one.
struct Registered<P: Provider> {
    private: Region<P>,
    peer: Region<P>,
    bulk: Option<Arc<Region<P>>>,
}

impl<P: Provider> Registered<P> {
    fn region(&self, memory: engine::Memory) -> &Region<P> {
        match memory {
            engine::Memory::Private => &self.private,
            engine::Memory::Peer => &self.peer,
            // The engine leases only from the pool it was given, which is
            // this one; without it the SGE would fall outside the region
            // and the post be refused.
            engine::Memory::Bulk => self.bulk.as_deref().unwrap_or(&self.private),
        }
    }
}

/// Builds a scatter/gather list of one region lease over `len` bytes at
/// `offset` of engine buffer `buf`; `None` when no lease is free.
fn lease_sge<P: Provider>(
    mem: &Registered<P>,
    bufs: &BufferTable,
    buf: engine::BufId,
    offset: u32,
    len: u32,
) -> Option<SgeList> {
    lease_one(mem, bufs, buf, offset, len).map(SgeList::one)
}

/// One SGE over `len` bytes at `offset` of engine buffer `buf`, on a
/// lease of its region's registration.
fn lease_one<P: Provider>(
    mem: &Registered<P>,
    bufs: &BufferTable,
    buf: engine::BufId,
    offset: u32,
    len: u32,
) -> Option<Sge> {
    let lease = mem.region(bufs.memory(buf)).leases.alloc()?;
    let at = bufs.slab_offset(buf) as u64 + u64::from(offset);
    Some(Sge {
        buf: lease,
        offset: at as u32,
        len,
    })
}

/// The completion queue of an endpoint: its own, or one it shares (a
/// worker's, polled by the worker).
enum CqHandle<P: Provider> {
    Own(P::Cq),
    Shared(Arc<P::Cq>),
}

impl<P: Provider> CqHandle<P> {
    fn get(&self) -> &P::Cq {
        match self {
            CqHandle::Own(cq) => cq,
            CqHandle::Shared(cq) => cq,
        }
    }
}

/// An endpoint whose queue pair exists and whose receives are posted, not
/// yet connected (typestate, like [`PreparedQp`]).
pub struct PreparedEndpoint<P: Provider> {
    qp: P::PreparedQp,
    cq: CqHandle<P>,
    conn: Connection,
    mem: Registered<P>,
    config: EndpointConfig,
    srq: Option<Arc<SharedRecvs<P>>>,
}

impl<P: Provider> core::fmt::Debug for PreparedEndpoint<P> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("PreparedEndpoint")
            .field("config", &self.config)
            .finish()
    }
}

impl<P: Provider> PreparedEndpoint<P> {
    /// Allocates the connection's arena, registers it, builds the engine
    /// over it, creates a completion queue and a queue pair, and posts the
    /// engine's initial receives (so a peer may send the moment the
    /// connection exists).
    ///
    /// # Errors
    /// [`EndpointError`]: engine configuration, memory, registration, queue
    /// creation, or a refused pre-post.
    pub fn new(
        ctx: &P::Context,
        pd: &P::Pd,
        config: &EndpointConfig,
    ) -> Result<PreparedEndpoint<P>, EndpointError> {
        Self::with_cq(ctx, pd, config, None, None, None)
    }

    /// [`new`](Self::new), with the queue pair on `shared`, a completion
    /// queue other connections use too (a worker's: docs/WORKER.md), when
    /// given. Such an endpoint never polls it: its owner routes each
    /// completion by queue-pair number to
    /// [`Endpoint::handle_completion`].
    ///
    /// With `bulk` (the worker's pool, in `pd`), a connection that never
    /// exposes its replies leases large messages from the pool and owns
    /// inline-size buffers only (docs/WORKER.md, "Bulk buffers"); its
    /// small arenas then use 4 KiB pages unless `config.backing` demands
    /// hugepages.
    ///
    /// With `srq` (the worker's shared receive queue, in `pd`), the
    /// connection posts no receives of its own: its messages arrive in
    /// the queue's buffers, which it gives back as soon as it has copied
    /// them (docs/WORKER.md, "Shared receives").
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn with_cq(
        ctx: &P::Context,
        pd: &P::Pd,
        config: &EndpointConfig,
        shared: Option<Arc<P::Cq>>,
        bulk: Option<&BulkBuffers<P>>,
        srq: Option<&Arc<SharedRecvs<P>>>,
    ) -> Result<PreparedEndpoint<P>, EndpointError> {
        let mut config = *config;
        config.engine.shared_receives = srq.is_some();
        let config = &config;
        let bulk = bulk.filter(|_| config.engine.may_lease_bulk());
        let len = match bulk {
            Some(_) => Connection::memory_len_pooled(&config.engine)?,
            None => Connection::memory_len(&config.engine)?,
        };
        // A pooled connection's arenas are a few hundred KiB: on 2 MiB
        // pages an idle connection would commit a whole page per region.
        let backing = match (bulk, config.backing) {
            (Some(_), Backing::Auto) => Backing::Small,
            (_, b) => b,
        };
        for l in [len.private, len.peer] {
            if l > u32::MAX as usize {
                return Err(EndpointError::TooLarge(l));
            }
        }
        let max_recv_wr = config.max_recv_wr();
        let max_leases = config.max_send_wr + max_recv_wr + 8;
        // Peers may read the private region (read chunks we offer) but
        // never write it; the peer region takes their Sends and Writes.
        let mem = Registered {
            private: Region::new(
                pd,
                len.private,
                Access::LOCAL_WRITE | Access::REMOTE_READ,
                max_leases,
                backing,
            )?,
            peer: Region::new(
                pd,
                len.peer,
                Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
                max_leases,
                backing,
            )?,
            bulk: bulk.map(|b| b.region.clone()),
        };
        let private: Box<dyn SlabMemory> =
            Box::new(ArenaSlab::new(mem.private.arena.clone(), len.private));
        let peer: Box<dyn PeerMemory> =
            Box::new(ArenaPeerMemory::new(mem.peer.arena.clone(), len.peer));
        let mut conn = match bulk {
            Some(b) => {
                Connection::with_bulk_pool(config.engine, Some((private, peer)), b.pool.clone())?
            }
            None => Connection::with_memory(config.engine, private, peer)?,
        };
        if let Some(s) = srq {
            // Admission: the queue must back this connection's floor.
            conn.use_credit_pool(s.credits.clone())?;
        }
        let cq = match shared {
            Some(cq) => CqHandle::Shared(cq),
            None => {
                let depth = (config.max_send_wr + max_recv_wr) as usize;
                CqHandle::Own(ctx.create_cq(depth)?)
            }
        };
        let caps = QpCaps {
            max_send_wr: config.max_send_wr,
            max_recv_wr,
            rnr_retry: config.rnr_retry,
            rnr_timer: config.rnr_timer,
            ..QpCaps::default()
        };
        let mut qp = match srq {
            Some(s) => pd.create_qp_on_srq(cq.get(), cq.get(), &s.srq, caps)?,
            None => pd.create_qp(cq.get(), cq.get(), caps)?,
        };
        // Drain the engine's initial output: its receives, nothing else
        // (it has no call to send yet).
        while let Some(wr) = conn.poll_transmit() {
            if let WorkRequest::PostRecv { wr_id, buf } = wr {
                let len = conn.buffers().buf_len(buf);
                let sgl = lease_sge(&mem, conn.buffers(), buf, 0, len)
                    .ok_or(EndpointError::PrePost(PostError::QueueFull))?;
                qp.post_recv(RecvWr {
                    wr_id: to_verbs_wr_id(wr_id),
                    sgl,
                })
                .map_err(|f| EndpointError::PrePost(f.error))?;
            }
        }
        Ok(PreparedEndpoint {
            qp,
            cq,
            conn,
            mem,
            config: *config,
            srq: srq.cloned(),
        })
    }

    /// Our RFC 8797 private data, to send with connect/accept. It offers
    /// remote invalidation when every exposure will have a key of its own
    /// (a provider with windows on every queue pair, and few enough
    /// exposures): then a peer's Send With Invalidate ends one exchange's
    /// access, never a whole region's.
    pub fn private_data(&self) -> [u8; PRIVATE_DATA_LEN] {
        let own_keys = P::WINDOWS_ALWAYS
            && self.config.expose_memory
            && self.conn.max_exposures() <= MAX_KEY_WINDOWS;
        self.config.private_data_with(own_keys)
    }

    /// Applies the peer's RFC 8797 private data (absent or invalid: 1024
    /// bytes each way).
    pub fn apply_peer_private_data(&mut self, bytes: &[u8]) {
        apply_private_data(&mut self.conn, bytes);
    }

    /// Connects to `url` (active side), applying the peer's private data.
    ///
    /// # Errors
    /// Connection setup and exposure errors ([`VerbsError`]).
    pub fn connect(self, url: &str) -> Result<Endpoint<P>, EndpointError> {
        let ours = self.private_data();
        let PreparedEndpoint {
            qp,
            cq,
            mut conn,
            mem,
            config,
            srq,
        } = self;
        let (qp, theirs) = qp.connect(url, &ours, config.connect_timeout)?;
        apply_private_data(&mut conn, &theirs);
        Endpoint::build(qp, cq, conn, mem, config, srq)
    }

    /// Accepts `incoming` (passive side), applying its private data.
    ///
    /// # Errors
    /// Accept and exposure errors ([`VerbsError`]).
    pub fn accept(self, incoming: P::Incoming) -> Result<Endpoint<P>, EndpointError> {
        let ours = self.private_data();
        let PreparedEndpoint {
            qp,
            cq,
            mut conn,
            mem,
            config,
            srq,
        } = self;
        apply_private_data(&mut conn, incoming.private_data());
        let peer = incoming.peer_identity();
        let qp = incoming.accept(qp, &ours)?;
        let mut ep = Endpoint::build(qp, cq, conn, mem, config, srq)?;
        ep.peer = peer;
        Ok(ep)
    }
}

fn apply_private_data(conn: &mut Connection, bytes: &[u8]) {
    let pd = PrivateData::parse_or_default(bytes);
    conn.set_peer_remote_invalidate(pd.remote_invalidate);
    let max_rdma_read = conn.config().max_rdma_read;
    conn.set_peer_limits(PeerLimits {
        inline_recv_size: pd.max_recv_size,
        inline_send_size: pd.max_send_size,
        max_rdma_read,
    });
}

/// Per-endpoint counters (plain integers: an endpoint lives on one thread;
/// the worker folds them into its shared counters).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EndpointCounters {
    /// Completions handled.
    pub completions: u64,
    /// Bytes received by Sends and pulled by RDMA Reads.
    pub bytes_in: u64,
    /// Bytes sent by Sends and RDMA Writes.
    pub bytes_out: u64,
    /// Receives completed.
    pub recvs: u64,
    /// Sends completed.
    pub sends: u64,
    /// RDMA Reads completed (read chunks pulled).
    pub rdma_reads: u64,
    /// RDMA Writes completed (write and reply chunks filled).
    pub rdma_writes: u64,
    /// Completions with an error status (flushes included).
    pub error_completions: u64,
    /// Completions whose id was not one of ours: dropped.
    pub foreign_completions: u64,
    /// Work requests the provider refused as malformed (closes).
    pub post_invalid: u64,
    /// Times the send or receive queue was full (work waited in the
    /// backlog).
    pub queue_full: u64,
}

/// A connected endpoint: the engine, its queue pair, completion queue and
/// registered memory. Driven by one thread (a worker or a client).
pub struct Endpoint<P: Provider> {
    // Field order is drop order: the queue pair and its completion queue go
    // first (their flushed buffers return to the lease slab), then the
    // engine, then the registration and the arena.
    qp: P::Qp,
    cq: CqHandle<P>,
    conn: Connection,
    mem: Registered<P>,
    /// Engine output not yet accepted by the provider, in engine order.
    pending: VecDeque<WorkRequest>,
    lost: Option<CloseReason>,
    /// The requester, as the provider identified it at accept
    /// (`Incoming::peer_identity`); 0 for connections we made.
    peer: u64,
    counters: EndpointCounters,
    /// `counters` as of the last [`Endpoint::take_counter_delta`].
    reported: EndpointCounters,
    /// The worker's shared receive queue the connection receives from.
    srq: Option<Arc<SharedRecvs<P>>>,
    /// When the endpoint was built (its age in a status report).
    opened: std::time::Instant,
}

impl<P: Provider> core::fmt::Debug for Endpoint<P> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Endpoint")
            .field("qp_num", &self.qp.qp_num())
            .field("lost", &self.lost)
            .field("pending", &self.pending.len())
            .finish()
    }
}

impl<P: Provider> Endpoint<P> {
    fn build(
        mut qp: P::Qp,
        cq: CqHandle<P>,
        mut conn: Connection,
        mem: Registered<P>,
        config: EndpointConfig,
        srq: Option<Arc<SharedRecvs<P>>>,
    ) -> Result<Endpoint<P>, EndpointError> {
        // Keys per exchange: memory windows the engine binds over exactly
        // one exchange's bytes under a fresh key, and invalidates when the
        // exchange ends (docs/ENGINE.md). Where the provider has too few
        // (or none), one key for each region, valid on this connection
        // only, and the engine advertises exact ranges of it. None at all
        // when the peer never needs one (`expose_memory`).
        if config.expose_memory {
            let windows = alloc_key_windows::<P>(&mut qp, conn.max_exposures());
            let region_keys = if windows.is_some() {
                None
            } else {
                Some((qp.expose(&mem.private.mr)?, qp.expose(&mem.peer.mr)?))
            };
            let bufs = conn.buffers_mut();
            for i in 0..bufs.count() {
                let id = engine::BufId(i as u32);
                let region = mem.region(bufs.memory(id));
                let addr = region.mr.addr() + bufs.slab_offset(id) as u64;
                let rkey = region_keys.map_or(0, |(private, peer)| match bufs.memory(id) {
                    engine::Memory::Private => private.rkey,
                    engine::Memory::Peer => peer.rkey,
                    // Never exposed (`engine::bulk`).
                    engine::Memory::Bulk => 0,
                });
                bufs.set_remote_key(id, rkey, addr);
            }
            if let Some(w) = windows {
                conn.set_key_windows(&w);
            }
        }
        Ok(Endpoint {
            qp,
            cq,
            conn,
            mem,
            pending: VecDeque::with_capacity(config.backlog),
            lost: None,
            peer: 0,
            counters: EndpointCounters::default(),
            reported: EndpointCounters::default(),
            srq,
            opened: std::time::Instant::now(),
        })
    }

    /// The requester, as its provider identified it when the connection
    /// was accepted (`Incoming::peer_identity`; 0 when unknown).
    pub fn peer_identity(&self) -> u64 {
        self.peer
    }

    /// When the endpoint was built (connection setup).
    pub fn opened(&self) -> std::time::Instant {
        self.opened
    }

    /// The queue pair's number.
    pub fn qp_num(&self) -> u32 {
        self.qp.qp_num()
    }

    /// The engine.
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// The engine, mutably (send calls and replies, read messages).
    pub fn connection_mut(&mut self) -> &mut Connection {
        &mut self.conn
    }

    /// The engine's counters.
    pub fn stats(&self) -> &Stats {
        self.conn.stats()
    }

    /// The endpoint's counters.
    pub fn counters(&self) -> &EndpointCounters {
        &self.counters
    }

    /// What the counters gained since the last call (a worker folds it
    /// into its own).
    pub fn take_counter_delta(&mut self) -> EndpointCounters {
        let (now, then) = (self.counters, self.reported);
        self.reported = now;
        EndpointCounters {
            completions: now.completions - then.completions,
            bytes_in: now.bytes_in - then.bytes_in,
            bytes_out: now.bytes_out - then.bytes_out,
            recvs: now.recvs - then.recvs,
            sends: now.sends - then.sends,
            rdma_reads: now.rdma_reads - then.rdma_reads,
            rdma_writes: now.rdma_writes - then.rdma_writes,
            error_completions: now.error_completions - then.error_completions,
            foreign_completions: now.foreign_completions - then.foreign_completions,
            post_invalid: now.post_invalid - then.post_invalid,
            queue_full: now.queue_full - then.queue_full,
        }
    }

    /// The engine's resources in use.
    pub fn resources(&self) -> Resources {
        self.conn.resources()
    }

    /// Region leases held by posted work requests (and their unpolled
    /// completions).
    pub fn leases_in_use(&self) -> usize {
        [&self.mem.private, &self.mem.peer]
            .iter()
            .map(|r| r.leases.total() - r.leases.available())
            .sum()
    }

    /// Whether 2 MiB hugepages back this endpoint's memory.
    pub fn is_hugepage_backed(&self) -> bool {
        self.mem.private.arena.is_hugepage_backed() && self.mem.peer.arena.is_hugepage_backed()
    }

    /// Why the connection closed, once it has.
    pub fn close_reason(&self) -> Option<CloseReason> {
        self.lost.or(self.conn.close_reason())
    }

    /// Polls up to `wcs.len()` completions and feeds them to the engine.
    /// Returns how many there were. An endpoint on a shared completion
    /// queue polls nothing here (0): its owner polls the queue.
    pub fn poll_completions(&mut self, now: engine::Instant, wcs: &mut [Completion]) -> usize {
        let CqHandle::Own(cq) = &self.cq else {
            return 0;
        };
        let n = cq.poll(wcs);
        for wc in wcs[..n].iter_mut() {
            self.handle_completion(now, wc);
        }
        if n == 0 && self.srq.is_some() && self.lost.is_none() {
            // No receive of its own flushes when the queue pair fails:
            // its state says so (`SharedReceiveQueue`).
            self.notice_failed_qp();
        }
        n
    }

    /// Closes the engine if the queue pair failed under it.
    fn notice_failed_qp(&mut self) {
        if self.conn.close_reason().is_none() && self.qp.state() == QpState::Error {
            if self.qp.peer_disconnected() {
                self.conn.handle_peer_disconnect();
            } else {
                self.conn.handle_queue_pair_failure();
            }
        }
    }

    /// The shared completion queue this endpoint's queue pair is on, if it
    /// is on one ([`PreparedEndpoint::with_cq`]).
    pub fn shared_cq(&self) -> Option<&Arc<P::Cq>> {
        match &self.cq {
            CqHandle::Shared(cq) => Some(cq),
            CqHandle::Own(_) => None,
        }
    }

    /// Feeds one completion of this endpoint's queue pair to the engine
    /// (the owner of a shared completion queue routes them here by
    /// `qp_num`). Its scatter/gather leases go back first.
    pub fn handle_completion(&mut self, now: engine::Instant, wc: &mut Completion) {
        self.counters.completions += 1;
        if let Some(srq) = &self.srq {
            if wc.wr_id.kind() == Some(mem::WrKind::Recv) {
                // A shared receive: lent to the engine, or straight back.
                let Some(buf) = wc.sgl.take_first() else {
                    return;
                };
                if wc.status != WcStatus::Success {
                    self.counters.error_completions += 1;
                    srq.repost(buf);
                    self.notice_failed_qp();
                    return;
                }
                self.counters.recvs += 1;
                self.counters.bytes_in += u64::from(wc.byte_len);
                srq.messages
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                self.conn
                    .handle_shared_recv(now, buf, wc.byte_len, wc.invalidated_rkey);
                return;
            }
            if wc.wr_id.kind().is_none() && wc.status != WcStatus::Success {
                // The queue pair failed (`verbs::srq_qp_failed`).
                self.notice_failed_qp();
                return;
            }
        }
        // Give the leases back first: the engine's slot state, not the
        // lease, says when bytes may be reused.
        for lease in wc.sgl.take_all() {
            drop(lease);
        }
        let Some(id) = from_verbs_wr_id(wc.wr_id) else {
            self.counters.foreign_completions += 1;
            return;
        };
        if wc.status != WcStatus::Success {
            self.counters.error_completions += 1;
            if wc.status == WcStatus::WrFlushErr
                && self.conn.close_reason().is_none()
                && self.qp.peer_disconnected()
            {
                // A flush after the peer's orderly disconnect: its end,
                // with that reason, not a transport error.
                self.conn.handle_peer_disconnect();
            }
            self.conn
                .handle_completion(now, id, engine_status(wc.status));
            return;
        }
        match wc.opcode {
            WcOpcode::Recv | WcOpcode::RecvRdmaWithImm => {
                self.counters.recvs += 1;
                self.counters.bytes_in += u64::from(wc.byte_len);
                self.conn
                    .handle_recv_invalidating(now, id, wc.byte_len, wc.invalidated_rkey);
            }
            op => {
                let c = &mut self.counters;
                match op {
                    WcOpcode::RdmaRead => {
                        c.rdma_reads += 1;
                        c.bytes_in += u64::from(wc.byte_len);
                    }
                    WcOpcode::Send => {
                        c.sends += 1;
                        c.bytes_out += u64::from(wc.byte_len);
                    }
                    WcOpcode::RdmaWrite => {
                        c.rdma_writes += 1;
                        c.bytes_out += u64::from(wc.byte_len);
                    }
                    _ => {}
                }
                self.conn
                    .handle_completion(now, id, engine::WcStatus::Success);
            }
        }
    }

    /// Runs the engine's timers if one is due.
    pub fn handle_timeouts(&mut self, now: engine::Instant) {
        if self.conn.poll_timeout().is_some_and(|t| t <= now) {
            self.conn.handle_timeout(now);
        }
    }

    /// The polling thread is about to sleep: tells the connection's own
    /// completion queue, if it has one (`CompletionQueue::before_sleep`).
    pub fn before_sleep(&self) {
        if let CqHandle::Own(cq) = &self.cq {
            cq.before_sleep();
        }
    }

    /// The doorbell of the connection's own completion queue, if it has
    /// one and its provider rings it (`CompletionQueue::wakeup_fd`).
    pub fn wakeup_fd(&self) -> Option<RawFd> {
        match &self.cq {
            CqHandle::Own(cq) => cq.wakeup_fd().map(|fd| fd.as_raw_fd()),
            _ => None,
        }
    }

    /// The polling thread is about to sleep on doorbells: arms the
    /// connection's own completion queue, if it has one
    /// (`CompletionQueue::arm_wakeup`). False when a completion is there
    /// already: do not sleep. Every arm is followed by
    /// [`Endpoint::disarm_wakeup`], slept or not.
    pub fn arm_wakeup(&self) -> bool {
        match &self.cq {
            CqHandle::Own(cq) => cq.arm_wakeup(),
            _ => true,
        }
    }

    /// Back from a sleep (`CompletionQueue::disarm_wakeup`).
    pub fn disarm_wakeup(&self) {
        if let CqHandle::Own(cq) = &self.cq {
            cq.disarm_wakeup();
        }
    }

    /// Its own queue's further descriptors for an armed sleep
    /// (`CompletionQueue::watch_also`).
    pub fn watch_also(&self, add: &mut dyn FnMut(RawFd)) {
        if let CqHandle::Own(cq) = &self.cq {
            cq.watch_also(add);
        }
    }

    /// The engine's next deadline.
    pub fn poll_timeout(&self) -> Option<engine::Instant> {
        self.conn.poll_timeout()
    }

    /// The engine's next event. A lost connection also moves the queue
    /// pair to the error state, so everything posted flushes back.
    pub fn poll_event(&mut self) -> Option<Event> {
        let ev = self.conn.poll_event()?;
        if let Event::ConnectionLost { reason } = ev {
            self.lost = Some(reason);
            self.qp.disconnect();
        }
        Some(ev)
    }

    /// Closes the connection: the engine drops its calls, the queue pair
    /// goes to the error state and everything posted flushes back.
    pub fn close(&mut self) {
        self.conn.close();
        self.qp.disconnect();
    }

    /// Whether the connection is closed and every posted work request has
    /// come back (then the endpoint may be dropped; [`Endpoint::resources`]
    /// is the leak check).
    pub fn is_drained(&self) -> bool {
        self.close_reason().is_some()
            && self.pending.is_empty()
            && self.mem.private.leases_idle()
            && self.mem.peer.leases_idle()
            // Work on bulk buffers holds leases of the worker's pool, not
            // of this endpoint's regions; and with shared receives no
            // receive of its own flushes last: the engine's count of its
            // work in flight says when the flushes are all back.
            && (self.mem.bulk.is_none() && self.srq.is_none() || self.conn.resources().is_idle())
    }

    /// Moves the engine's output to the provider: receives one by one,
    /// runs of send-queue work as one linked list (one doorbell). What the
    /// provider cannot take yet (queue full) waits, in order, for the next
    /// call. Returns the number of work requests posted.
    pub fn flush(&mut self) -> usize {
        if let Some(srq) = &self.srq {
            while let Some(buf) = self.conn.poll_released_recv() {
                srq.repost(buf);
            }
            if srq.needs_refill() {
                srq.refill();
            }
        }
        while let Some(wr) = self.conn.poll_transmit() {
            self.pending.push_back(wr);
        }
        let mut posted = 0;
        loop {
            match self.pending.front().copied() {
                None => return posted,
                Some(WorkRequest::PostRecv { wr_id, buf }) => {
                    let len = self.conn.buffers().buf_len(buf);
                    let Some(sgl) = lease_sge(&self.mem, self.conn.buffers(), buf, 0, len) else {
                        return posted;
                    };
                    let wr = RecvWr {
                        wr_id: to_verbs_wr_id(wr_id),
                        sgl,
                    };
                    match self.qp.post_recv(wr) {
                        Ok(()) => {
                            self.pending.pop_front();
                            posted += 1;
                        }
                        Err(f) => return posted + self.refused(f.error),
                    }
                }
                Some(_) => {
                    let mut batch = SendBatch {
                        pending: &mut self.pending,
                        bufs: self.conn.buffers(),
                        mem: &self.mem,
                        last: None,
                        starved: false,
                    };
                    let result = self.qp.post_send_list(&mut batch);
                    let (last, starved) = (batch.last, batch.starved);
                    match result {
                        Ok(n) => {
                            posted += n;
                            if starved {
                                return posted;
                            }
                        }
                        Err(f) => {
                            // The refused request is the last one taken:
                            // put it back in front, its lease goes home.
                            drop(f.wr);
                            if let Some(wr) = last {
                                self.pending.push_front(wr);
                            }
                            return posted + self.refused(f.error);
                        }
                    }
                }
            }
        }
    }

    fn refused(&mut self, error: PostError) -> usize {
        match error {
            PostError::QueueFull => self.counters.queue_full += 1,
            PostError::Invalid => {
                // A malformed request is our bug or a provider limit: this
                // connection cannot continue, the others are unaffected.
                self.counters.post_invalid += 1;
                self.pending.clear();
                self.close();
            }
        }
        0
    }

    /// Work requests waiting for room in a queue.
    pub fn backlog(&self) -> usize {
        self.pending.len()
    }
}

/// The run of send-queue work at the front of the backlog, converted to
/// verbs work requests on the fly (no allocation).
struct SendBatch<'a, P: Provider> {
    pending: &'a mut VecDeque<WorkRequest>,
    bufs: &'a BufferTable,
    mem: &'a Registered<P>,
    last: Option<WorkRequest>,
    starved: bool,
}

impl<P: Provider> Iterator for SendBatch<'_, P> {
    type Item = SendWr;
    fn next(&mut self) -> Option<SendWr> {
        let wr = *self.pending.front()?;
        let (wr_id, local, op) = match wr {
            WorkRequest::PostRecv { .. } => return None,
            WorkRequest::Bind {
                wr_id,
                window,
                rkey,
                local,
                access,
            } => {
                let region = self.mem.region(self.bufs.memory(local.buf));
                let addr = region.mr.addr()
                    + self.bufs.slab_offset(local.buf) as u64
                    + u64::from(local.offset);
                let access = match access {
                    engine::Access::RemoteRead => Access::REMOTE_READ,
                    engine::Access::RemoteWrite => Access::REMOTE_WRITE,
                    engine::Access::None => Access::NONE,
                };
                let bind = BindWindow {
                    window,
                    rkey,
                    lkey: region.mr.lkey(),
                    addr,
                    len: u64::from(local.len),
                    access,
                };
                return Some(self.take(wr, wr_id, SendOp::Bind(bind)));
            }
            WorkRequest::Invalidate { wr_id, rkey } => {
                return Some(self.take(wr, wr_id, SendOp::LocalInv(rkey)));
            }
            WorkRequest::Send {
                wr_id,
                local,
                gather: Some(more),
                invalidate_rkey,
            } => {
                // Header and payload from where each lies: two SGEs.
                let op = invalidate_rkey.map_or(SendOp::Send, SendOp::SendWithInv);
                let (Some(mut sgl), Some(second)) = (
                    lease_sge(self.mem, self.bufs, local.buf, local.offset, local.len),
                    lease_one(self.mem, self.bufs, more.buf, more.offset, more.len),
                ) else {
                    self.starved = true;
                    return None;
                };
                // Cannot fail: one SGE of `MAX_SGE` is taken.
                let _ = sgl.push(second);
                self.pending.pop_front();
                self.last = Some(wr);
                return Some(SendWr::new(to_verbs_wr_id(wr_id), op, sgl));
            }
            WorkRequest::Send {
                wr_id,
                local,
                gather: None,
                invalidate_rkey,
            } => (
                wr_id,
                local,
                invalidate_rkey.map_or(SendOp::Send, SendOp::SendWithInv),
            ),
            WorkRequest::RdmaRead {
                wr_id,
                local,
                remote,
            } => (
                wr_id,
                local,
                SendOp::Read(RemoteAddr {
                    addr: remote.offset,
                    rkey: remote.handle,
                }),
            ),
            WorkRequest::RdmaWrite {
                wr_id,
                local,
                remote,
            } => (
                wr_id,
                local,
                SendOp::Write(RemoteAddr {
                    addr: remote.offset,
                    rkey: remote.handle,
                }),
            ),
        };
        let Some(sgl) = lease_sge(self.mem, self.bufs, local.buf, local.offset, local.len) else {
            self.starved = true;
            return None;
        };
        self.pending.pop_front();
        self.last = Some(wr);
        Some(SendWr::new(to_verbs_wr_id(wr_id), op, sgl))
    }
}

impl<P: Provider> SendBatch<'_, P> {
    /// A work request without SGEs (key operations), taken off the
    /// backlog.
    fn take(&mut self, wr: WorkRequest, wr_id: engine::WrId, op: SendOp) -> SendWr {
        self.pending.pop_front();
        self.last = Some(wr);
        SendWr::new(to_verbs_wr_id(wr_id), op, SgeList::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_wr_ids_fold_into_verbs_ids_losslessly() {
        for kind in [
            engine::WrKind::Recv,
            engine::WrKind::CallSend,
            engine::WrKind::ReplySend,
            engine::WrKind::ChunkRead,
            engine::WrKind::ChunkWrite,
            engine::WrKind::ErrorSend,
            engine::WrKind::ReplyRead,
            engine::WrKind::DoneSend,
            engine::WrKind::KeyBind,
            engine::WrKind::KeyInvalidate,
        ] {
            for (index, generation) in [(0, 0), (4095, (1 << 28) - 1), ((1 << 24) - 1, 12345)] {
                let id = engine::WrId {
                    kind,
                    index,
                    generation,
                };
                let v = to_verbs_wr_id(id);
                assert_eq!(v.kind(), Some(mem::WrKind::Engine));
                assert_eq!(mem::WrId::from_raw(v.to_raw()), Some(v));
                assert_eq!(from_verbs_wr_id(v), Some(id));
            }
        }
        let foreign = mem::WrId::new(mem::WrKind::Recv, 1, 1);
        assert_eq!(from_verbs_wr_id(foreign), None);
        let bad_kind = mem::WrId::new(mem::WrKind::Engine, 1, 15 << 28);
        assert_eq!(from_verbs_wr_id(bad_kind), None);
    }
}
