//! The `ibverbs` provider: real RDMA hardware (InfiniBand, RoCE, iWARP
//! HCAs, and the kernel's soft `rxe`/`siw` devices) through libibverbs and
//! librdmacm (`rdma-sys` bindings). Built only with the cargo feature
//! `ibverbs`. See `docs/IBVERBS.md` for how the neutral API maps onto
//! verbs, how to run it on rxe, and its limits.
//!
//! Ownership: every raw handle has exactly one owner that releases it on
//! drop, and children keep their parents alive with `Arc` (a QP holds its
//! PD and both CQs, an MR its PD and arena, a PD its device), as jonhoo's
//! `ibverbs` crate does. Device contexts are the ones librdmacm opened
//! (`rdma_get_devices`); librdmacm keeps them for the life of the process.
//!
//! Queue pairs are created by us, not by rdma_cm (so receives can be
//! pre-posted before the connection exists); rdma_cm carries the QP number
//! and private data, and we move the QP through RTR/RTS with
//! `rdma_init_qp_attr`.
#![allow(clippy::result_large_err)]

mod sys;
pub mod translate;

#[cfg(test)]
mod tests;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdma_sys::*;

use self::sys::{errno_error, os_error, Channel, CmId, DeviceList, SockAddr};
use self::translate::*;
use crate::mem::{Arena, WrId};
use crate::verbs::lock;
use crate::verbs::{
    bind_ok, Access, Completion, CompletionQueue, Context, Incoming, Listener, MemoryRegion,
    PostError, PostFailed, PreparedQp, ProtectionDomain, Provider, QpCaps, QpState, QueuePair,
    RecvWr, RemoteKey, SendOp, SendWr, SgeList, SharedReceiveQueue, SrqCaps, VerbsError, WcOpcode,
    WcStatus, Window, MAX_SGE,
};
use crate::wake::ReadySet;

/// Send-queue slots beyond the user's depth: one window bind, one drain
/// marker, and slack.
const SQ_RESERVE: u32 = 4;
/// Receive-queue slots beyond the user's depth: the drain marker.
const RQ_RESERVE: u32 = 1;
/// Most memory windows (exposures alive at once) per queue pair.
const MAX_WINDOWS: usize = 256;
/// Bound on connection-setup steps the API gives no timeout for (accept,
/// window binds, teardown drain). Turns a dead fabric into an error.
const SETUP_TIMEOUT: Duration = Duration::from_secs(10);
/// CQ polls between two checks of the connections' rdma_cm channels
/// (one `epoll_wait(0)`), which is how a peer's disconnect is noticed.
const CM_CHECK_EVERY: u32 = 32;
/// Hardware `wr_id` bit marking a receive.
const RECV_BIT: u64 = 1 << 62;
/// Hardware `wr_id` bits marking a shared receive (the rest is its slot).
const SRQ_BIT: u64 = 1 << 61;
const SEQ_MASK: u64 = (1 << 62) - 1;

/// Checks whether an `ibverbs://` address can be served here: the URL
/// parses and an RDMA device exists (the one named, or the one owning the
/// address). For the daemon's start-up checks.
///
/// # Errors
/// [`VerbsError::BadAddress`] for a malformed URL;
/// [`VerbsError::Unavailable`] with a one-line reason (no RDMA device on
/// this host, no such device, address not on an RDMA device).
pub fn probe(url: &str) -> Result<(), VerbsError> {
    Ibverbs::open(url).map(drop)
}

/// The provider (type family).
#[derive(Debug)]
pub struct Ibverbs;

impl Provider for Ibverbs {
    type Context = IbvContext;
    type Pd = IbvPd;
    type Mr = IbvMr;
    type Cq = IbvCq;
    type PreparedQp = IbvPreparedQp;
    type Qp = IbvQp;
    type Listener = IbvListener;
    type Incoming = IbvIncoming;
    type Srq = IbvSrq;

    const SCHEME: &'static str = SCHEME;

    /// Opens the device named by `?device=NAME`, else the device rdma_cm
    /// binds the URL's IP to (the first device for loopback and wildcard
    /// addresses).
    ///
    /// # Errors
    /// [`VerbsError::BadAddress`], [`VerbsError::Unavailable`] (see
    /// [`probe`]), OS errors querying the device.
    fn open(url: &str) -> Result<IbvContext, VerbsError> {
        let u = parse_url(url)?;
        let list = DeviceList::get();
        if list.contexts().is_empty() {
            return Err(VerbsError::Unavailable(no_device_message(url)));
        }
        let names = list.names();
        let (ctx, port) = if let Some(name) = &u.device {
            let i = names.iter().position(|n| n == name).ok_or_else(|| {
                VerbsError::Unavailable(format!(
                    "{url}: no RDMA device named {name} (found: {})",
                    names.join(", ")
                ))
            })?;
            (list.contexts()[i], 1)
        } else {
            // Let rdma_cm tell which device owns the address.
            let ch = Channel::new()?;
            let id = CmId::new(&ch)?;
            let bind = std::net::SocketAddr::new(u.addr.ip(), 0);
            id.bind(bind).map_err(|e| {
                VerbsError::Unavailable(format!(
                    "{url}: {} is not an address of an RDMA device ({e}; devices: {})",
                    u.addr.ip(),
                    names.join(", ")
                ))
            })?;
            let v = id.verbs();
            if v.is_null() {
                (list.contexts()[0], 1)
            } else {
                let port = id.port_num().max(1);
                let c = list
                    .contexts()
                    .iter()
                    .copied()
                    .find(|&c| c == v)
                    .unwrap_or(v);
                (c, port)
            }
        };
        let dev = Device::new(ctx, port)?;
        Ok(IbvContext { dev: Arc::new(dev) })
    }
}

/// An opened device (shared by everything created from it).
#[derive(Debug)]
struct Device {
    ctx: *mut ibv_context,
    name: String,
    port: u8,
    /// Type 2 memory windows are supported (`expose` binds one per
    /// exposure); otherwise `expose` hands out the MR's rkey.
    mw_type2: bool,
    max_qp_wr: u32,
    max_cqe: u32,
    /// RDMA Read depth we offer and ask for.
    rd_atomic: u8,
    /// The device is rxe, whose receive completions carry the kernel's
    /// `wc_flags` values (see [`recv_invalidated`]).
    kernel_wc_flags: bool,
}

// SAFETY: libibverbs contexts are thread-safe (every verb may be called
// from any thread); the pointer is owned by librdmacm for the process
// lifetime and never freed by us.
unsafe impl Send for Device {}
// SAFETY: see `Send`.
unsafe impl Sync for Device {}

impl Device {
    fn new(ctx: *mut ibv_context, port: u8) -> Result<Device, VerbsError> {
        // SAFETY: all-zero is a valid ibv_device_attr (plain integers).
        let mut attr: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: valid context, attr is a valid out pointer.
        let rc = unsafe { ibv_query_device(ctx, &mut attr) };
        if rc != 0 {
            return Err(errno_error("ibv_query_device", rc));
        }
        let caps = attr.device_cap_flags;
        let mw_type2 = caps
            & (ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2A.0
                | ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2B.0)
            != 0;
        Ok(Device {
            ctx,
            name: sys::device_name(ctx),
            port,
            mw_type2,
            max_qp_wr: attr.max_qp_wr.max(0) as u32,
            max_cqe: attr.max_cqe.max(0) as u32,
            rd_atomic: attr.max_qp_rd_atom.clamp(0, 16) as u8,
            kernel_wc_flags: attr.vendor_id == RXE_VENDOR_ID,
        })
    }
}

/// An opened RDMA device.
#[derive(Debug)]
pub struct IbvContext {
    dev: Arc<Device>,
}

impl IbvContext {
    /// The device name (`mlx5_0`, `rxe0`, ...).
    pub fn device_name(&self) -> &str {
        &self.dev.name
    }
    /// Whether exposures are type 2 memory windows (per connection,
    /// invalidatable) rather than the region's own rkey.
    pub fn has_memory_windows(&self) -> bool {
        self.dev.mw_type2
    }
}

impl Context<Ibverbs> for IbvContext {
    fn alloc_pd(&self) -> Result<IbvPd, VerbsError> {
        // SAFETY: valid context.
        let pd = unsafe { ibv_alloc_pd(self.dev.ctx) };
        if pd.is_null() {
            return Err(os_error("ibv_alloc_pd"));
        }
        Ok(IbvPd {
            inner: Arc::new(PdInner {
                pd,
                dev: Arc::clone(&self.dev),
                mrs: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// Creates a CQ of twice `depth` entries: a hardware CQ overrun is
    /// fatal, and window binds and drain markers take entries too.
    fn create_cq(&self, depth: usize) -> Result<IbvCq, VerbsError> {
        let want = (depth.max(1) as u64 * 2).min(u64::from(self.dev.max_cqe.max(1)));
        // A completion channel: its descriptor wakes a sleeping poller
        // (`CompletionQueue::arm_wakeup`). Non-blocking, so the events are
        // read without waiting.
        // SAFETY: valid context.
        let channel = unsafe { ibv_create_comp_channel(self.dev.ctx) };
        if channel.is_null() {
            return Err(os_error("ibv_create_comp_channel"));
        }
        // SAFETY: `channel` is valid; its fd is owned by the channel.
        let channel_fd = unsafe { (*channel).fd };
        // SAFETY: plain fcntl on a valid descriptor.
        unsafe {
            let fl = libc::fcntl(channel_fd, libc::F_GETFL);
            libc::fcntl(channel_fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
        }
        // SAFETY: valid context and channel.
        let cq =
            unsafe { ibv_create_cq(self.dev.ctx, want as i32, std::ptr::null_mut(), channel, 0) };
        if cq.is_null() {
            // SAFETY: no CQ uses the channel.
            unsafe { ibv_destroy_comp_channel(channel) };
            return Err(os_error("ibv_create_cq"));
        }
        let hw = Arc::new(CqHw {
            cq,
            channel,
            _dev: Arc::clone(&self.dev),
        });
        let os = |what| move |source| VerbsError::Os { what, source };
        let epoll = ReadySet::new().map_err(os("epoll_create1"))?;
        // The channel joins the connections' rdma_cm channels in the
        // set, whose descriptor is the queue's wake-up descriptor: a
        // completion event or a connection event wakes a sleeper.
        epoll
            .add(channel_fd, COMP_CHANNEL_TOKEN)
            .map_err(os("epoll_ctl"))?;
        Ok(IbvCq {
            inner: Arc::new(CqInner {
                hw,
                qps: Mutex::new(HashMap::new()),
                stash: Mutex::new(VecDeque::with_capacity(depth.max(1) * 2)),
                stashed: AtomicBool::new(false),
                epoll,
                polls: AtomicU32::new(0),
            }),
        })
    }

    fn listen(&self, url: &str) -> Result<IbvListener, VerbsError> {
        let u = parse_url(url)?;
        let ch = Channel::new()?;
        let id = CmId::new(&ch)?;
        id.bind(u.addr)?;
        let v = id.verbs();
        if !v.is_null() && v != self.dev.ctx {
            return Err(VerbsError::Unavailable(format!(
                "{url}: the address belongs to device {}, this context is {}",
                sys::device_name(v),
                self.dev.name
            )));
        }
        // SAFETY: valid, bound id.
        if unsafe { rdma_listen(id.as_ptr(), 128) } != 0 {
            return Err(os_error("rdma_listen"));
        }
        Ok(IbvListener {
            _id: id,
            ch,
            dev: Arc::clone(&self.dev),
        })
    }
}

#[derive(Debug)]
struct PdInner {
    pd: *mut ibv_pd,
    dev: Arc<Device>,
    /// Live regions by lkey, for window binds (which name the region by
    /// its lkey and need its `ibv_mr`).
    mrs: Mutex<HashMap<u32, MrRef>>,
}

/// What a window bind needs to know about a region.
#[derive(Debug, Clone, Copy)]
struct MrRef {
    mr: *mut ibv_mr,
    addr: u64,
    len: u64,
    access: Access,
}

// SAFETY: protection domains are thread-safe verbs objects; freed once.
unsafe impl Send for PdInner {}
// SAFETY: see `Send`.
unsafe impl Sync for PdInner {}

impl Drop for PdInner {
    fn drop(&mut self) {
        // SAFETY: every child (MR, MW, QP) holds an Arc to us, so none is
        // left when this runs.
        unsafe {
            ibv_dealloc_pd(self.pd);
        }
    }
}

/// A protection domain.
#[derive(Debug)]
pub struct IbvPd {
    inner: Arc<PdInner>,
}

impl ProtectionDomain<Ibverbs> for IbvPd {
    fn register(
        &self,
        arena: &Arc<Arena>,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<IbvMr, VerbsError> {
        super::check_registration(arena, offset, len, access)?;
        let flags = mr_access(access, self.inner.dev.mw_type2);
        // SAFETY: offset + len is inside the arena (checked above).
        let addr = unsafe { arena.as_ptr().add(offset) };
        // SAFETY: valid PD; the range is mapped memory the MR keeps alive
        // (it holds the arena's Arc) until deregistration.
        let mr = unsafe { ibv_reg_mr(self.inner.pd, addr.cast(), len, flags as i32) };
        if mr.is_null() {
            return Err(os_error("ibv_reg_mr"));
        }
        // SAFETY: a registered MR is valid until dereg.
        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
        lock(&self.inner.mrs).insert(
            lkey,
            MrRef {
                mr,
                addr: addr as u64,
                len: len as u64,
                access,
            },
        );
        Ok(IbvMr {
            mr,
            addr: addr as u64,
            len,
            lkey,
            rkey,
            access,
            _arena: Arc::clone(arena),
            _pd: Arc::clone(&self.inner),
        })
    }

    fn create_qp(
        &self,
        send_cq: &IbvCq,
        recv_cq: &IbvCq,
        caps: QpCaps,
    ) -> Result<IbvPreparedQp, VerbsError> {
        self.new_qp(send_cq, recv_cq, None, caps)
    }

    fn create_srq(&self, caps: SrqCaps) -> Result<IbvSrq, VerbsError> {
        let dev = &self.inner.dev;
        if caps.max_wr == 0 || caps.max_wr > dev.max_qp_wr {
            return Err(VerbsError::Limit(
                "shared receive queue depth must be 1..=max_qp_wr",
            ));
        }
        // SAFETY: all-zero is a valid ibv_srq_init_attr.
        let mut init: ibv_srq_init_attr = unsafe { std::mem::zeroed() };
        init.attr.max_wr = caps.max_wr;
        init.attr.max_sge = MAX_SGE as u32;
        // SAFETY: valid PD; `init` is read and updated with what the
        // device granted.
        let srq = unsafe { ibv_create_srq(self.inner.pd, &mut init) };
        if srq.is_null() {
            return Err(os_error("ibv_create_srq"));
        }
        Ok(IbvSrq {
            inner: Arc::new(SrqInner {
                srq,
                slots: Mutex::new(SrqSlots {
                    wrs: (0..caps.max_wr).map(|_| None).collect(),
                    free: (0..caps.max_wr).rev().collect(),
                }),
                pd: Arc::clone(&self.inner),
            }),
        })
    }

    fn create_qp_on_srq(
        &self,
        send_cq: &IbvCq,
        recv_cq: &IbvCq,
        srq: &IbvSrq,
        caps: QpCaps,
    ) -> Result<IbvPreparedQp, VerbsError> {
        if !Arc::ptr_eq(&srq.inner.pd, &self.inner) {
            return Err(VerbsError::InvalidRegistration(
                "the shared receive queue belongs to another protection domain",
            ));
        }
        self.new_qp(send_cq, recv_cq, Some(&srq.inner), caps)
    }
}

impl IbvPd {
    fn new_qp(
        &self,
        send_cq: &IbvCq,
        recv_cq: &IbvCq,
        srq: Option<&Arc<SrqInner>>,
        caps: QpCaps,
    ) -> Result<IbvPreparedQp, VerbsError> {
        let dev = &self.inner.dev;
        if caps.max_send_wr == 0 || caps.max_recv_wr == 0 {
            return Err(VerbsError::Limit("queue depths must be at least 1"));
        }
        let sq_cap = caps.max_send_wr.saturating_add(SQ_RESERVE);
        let rq_cap = caps.max_recv_wr.saturating_add(RQ_RESERVE);
        if sq_cap > dev.max_qp_wr || rq_cap > dev.max_qp_wr {
            return Err(VerbsError::Limit(
                "queue depth above the device's max_qp_wr",
            ));
        }
        let mut init = ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: send_cq.inner.hw.cq,
            recv_cq: recv_cq.inner.hw.cq,
            srq: srq.map_or(std::ptr::null_mut(), |s| s.srq),
            cap: ibv_qp_cap {
                max_send_wr: sq_cap,
                max_recv_wr: rq_cap,
                max_send_sge: MAX_SGE as u32,
                max_recv_sge: MAX_SGE as u32,
                max_inline_data: caps.max_inline,
            },
            qp_type: ibv_qp_type::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: valid PD and CQs of the same device; `init` is read and
        // its `cap` updated with what the device granted.
        let mut qp = unsafe { ibv_create_qp(self.inner.pd, &mut init) };
        if qp.is_null() && caps.max_inline > 0 {
            // Some devices support less inline data: inline is only an
            // optimisation here (the data is in registered memory anyway).
            init.cap.max_inline_data = 0;
            // SAFETY: as above.
            qp = unsafe { ibv_create_qp(self.inner.pd, &mut init) };
        }
        if qp.is_null() {
            return Err(os_error("ibv_create_qp"));
        }
        // SAFETY: valid QP.
        let qp_num = unsafe { (*qp).qp_num };
        let shared = Arc::new(QpShared {
            qp,
            qp_num,
            hw_inline: init.cap.max_inline_data,
            state: AtomicU8::new(STATE_INIT),
            sq: Mutex::new(SendRing::new(sq_cap, caps.max_send_wr)),
            rq: Mutex::new(RecvRing::new(rq_cap, caps.max_recv_wr)),
            windows: Mutex::new(Vec::new()),
            cm: Mutex::new(None),
            caps,
            pd: Arc::clone(&self.inner),
            srq: srq.cloned(),
            _send_cq: Arc::clone(&send_cq.inner.hw),
            _recv_cq: Arc::clone(&recv_cq.inner.hw),
        });
        // RESET -> INIT so receives can be posted before connecting.
        // SAFETY: all-zero is a valid ibv_qp_attr.
        let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = ibv_qp_state::IBV_QPS_INIT;
        attr.pkey_index = 0;
        attr.port_num = dev.port;
        attr.qp_access_flags = mr_access(
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
            false,
        );
        let mask = ibv_qp_attr_mask::IBV_QP_STATE.0
            | ibv_qp_attr_mask::IBV_QP_PKEY_INDEX.0
            | ibv_qp_attr_mask::IBV_QP_PORT.0
            | ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS.0;
        // SAFETY: valid QP and attributes.
        let rc = unsafe { ibv_modify_qp(qp, &mut attr, mask as i32) };
        if rc != 0 {
            return Err(errno_error("ibv_modify_qp(INIT)", rc));
        }
        let qp = QpHandle::new(shared, send_cq, recv_cq);
        Ok(IbvPreparedQp { h: qp })
    }
}

/// A registered memory region (deregistered on drop).
#[derive(Debug)]
pub struct IbvMr {
    mr: *mut ibv_mr,
    addr: u64,
    len: usize,
    lkey: u32,
    rkey: u32,
    access: Access,
    _arena: Arc<Arena>,
    _pd: Arc<PdInner>,
}

// SAFETY: an MR is an immutable verbs object after registration; only
// dereg (in drop, once) mutates it.
unsafe impl Send for IbvMr {}
// SAFETY: see `Send`.
unsafe impl Sync for IbvMr {}

impl IbvMr {
    /// The region's own rkey (what `expose` hands out on devices without
    /// type 2 memory windows).
    pub fn rkey(&self) -> u32 {
        self.rkey
    }
}

impl Drop for IbvMr {
    fn drop(&mut self) {
        lock(&self._pd.mrs).remove(&self.lkey);
        // SAFETY: registered once, deregistered once, before the arena
        // Arc (a later field) lets the memory go.
        unsafe {
            ibv_dereg_mr(self.mr);
        }
    }
}

impl MemoryRegion for IbvMr {
    fn lkey(&self) -> u32 {
        self.lkey
    }
    fn addr(&self) -> u64 {
        self.addr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn access(&self) -> Access {
        self.access
    }
}

/// The hardware CQ and its completion channel (destroyed after every QP
/// using it).
#[derive(Debug)]
struct CqHw {
    cq: *mut ibv_cq,
    channel: *mut ibv_comp_channel,
    _dev: Arc<Device>,
}

/// The completion channel's token in a CQ's epoll set (rdma_cm channels
/// use queue-pair numbers, which fit in 24 bits).
const COMP_CHANNEL_TOKEN: u64 = u64::MAX;

// SAFETY: CQ polling is thread-safe in libibverbs providers; destroyed once.
unsafe impl Send for CqHw {}
// SAFETY: see `Send`.
unsafe impl Sync for CqHw {}

impl Drop for CqHw {
    fn drop(&mut self) {
        // SAFETY: every QP using this CQ holds an Arc to it; every event
        // read from the channel was acknowledged (`take_cq_events`), which
        // `ibv_destroy_cq` waits for; the channel outlives its CQ.
        unsafe {
            ibv_destroy_cq(self.cq);
            ibv_destroy_comp_channel(self.channel);
        }
    }
}

#[derive(Debug)]
struct CqInner {
    hw: Arc<CqHw>,
    /// The QPs whose completions land here, by QP number.
    qps: Mutex<HashMap<u32, Arc<QpShared>>>,
    /// Completions taken off the hardware CQ by someone other than the
    /// owner's `poll` (a window bind waiting, a QP draining on drop);
    /// handed out first by the next `poll`.
    stash: Mutex<VecDeque<Completion>>,
    stashed: AtomicBool,
    /// The connections' rdma_cm channels (token: QP number) and the
    /// completion channel ([`COMP_CHANNEL_TOKEN`]).
    epoll: ReadySet,
    polls: AtomicU32,
}

impl CqInner {
    fn poll(&self, out: &mut [Completion]) -> usize {
        let mut n = 0;
        if self.stashed.load(Ordering::Acquire) {
            let mut st = lock(&self.stash);
            while n < out.len() {
                let Some(c) = st.pop_front() else { break };
                out[n] = c;
                n += 1;
            }
            self.stashed.store(!st.is_empty(), Ordering::Release);
        }
        if self.polls.fetch_add(1, Ordering::Relaxed) % CM_CHECK_EVERY == 0 {
            self.check_cm_events();
        }
        while n < out.len() {
            let got = self.poll_hw(&mut out[n..]);
            if got.1 == 0 {
                break;
            }
            n += got.0;
        }
        n
    }

    /// One `ibv_poll_cq` of at most 16 entries; returns (completions
    /// written to `out`, hardware entries consumed).
    fn poll_hw(&self, out: &mut [Completion]) -> (usize, usize) {
        const BURST: usize = 16;
        // SAFETY: all-zero is a valid ibv_wc (integers and a union of
        // integers).
        let mut wcs: [ibv_wc; BURST] = unsafe { std::mem::zeroed() };
        let want = out.len().min(BURST);
        // SAFETY: valid CQ; `wcs` has room for `want` entries.
        let got = unsafe { ibv_poll_cq(self.hw.cq, want as i32, wcs.as_mut_ptr()) };
        if got <= 0 {
            return (0, 0);
        }
        let got = got as usize;
        let mut n = 0;
        let qps = lock(&self.qps);
        for wc in &wcs[..got] {
            let Some(qp) = qps.get(&wc.qp_num) else {
                continue; // a QP already torn down
            };
            if let Some(c) = qp.complete(wc) {
                out[n] = c;
                n += 1;
            }
        }
        (n, got)
    }

    /// Takes completions off the hardware CQ into the stash (for a caller
    /// waiting on a provider-internal completion).
    fn pump(&self) {
        let mut buf: [Completion; 16] = std::array::from_fn(|_| Completion::default());
        let (n, _) = self.poll_hw(&mut buf);
        if n > 0 {
            let mut st = lock(&self.stash);
            for c in buf.iter_mut().take(n) {
                st.push_back(std::mem::take(c));
            }
            self.stashed.store(true, Ordering::Release);
        }
        self.check_cm_events();
    }

    /// Reads and acknowledges the completion channel's events (each one
    /// a notification that `arm` asked for); the channel is non-blocking.
    fn take_cq_events(&self) {
        loop {
            let mut cq: *mut ibv_cq = std::ptr::null_mut();
            let mut ctx: *mut std::ffi::c_void = std::ptr::null_mut();
            // SAFETY: valid channel; out-pointers live for the call.
            let rc = unsafe { ibv_get_cq_event(self.hw.channel, &mut cq, &mut ctx) };
            if rc != 0 {
                return;
            }
            // SAFETY: the event was for our CQ, read above.
            unsafe { ibv_ack_cq_events(self.hw.cq, 1) };
        }
    }

    /// Reads the rdma_cm events of connections whose channel is readable
    /// (peer disconnects, device removal): one `epoll_wait(0)`.
    fn check_cm_events(&self) {
        let mut ready = [0u64; 8];
        let n = self.epoll.ready(&mut ready);
        for &token in &ready[..n] {
            if token == COMP_CHANNEL_TOKEN {
                continue; // read by `disarm_wakeup`
            }
            let qpn = token as u32;
            let qp = lock(&self.qps).get(&qpn).cloned();
            if let Some(qp) = qp {
                qp.process_cm_events();
            }
        }
    }
}

/// A completion queue.
#[derive(Debug)]
pub struct IbvCq {
    inner: Arc<CqInner>,
}

impl CompletionQueue for IbvCq {
    /// Polls the hardware CQ in bursts of 16 into `out`; every 32nd call
    /// also checks the connections' rdma_cm channels (one
    /// `epoll_wait(0)`) so a peer's disconnect moves its QP to error.
    fn poll(&self, out: &mut [Completion]) -> usize {
        self.inner.poll(out)
    }

    /// The epoll set of the completion channel and the connections'
    /// rdma_cm channels.
    fn wakeup_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        Some(self.inner.epoll.as_fd())
    }

    /// Asks for an event at the next completion, then takes what came
    /// before the request into the stash (the next `poll` hands it out):
    /// a completion between the last poll and the request makes no event.
    ///
    /// A request the device refuses (it is going away) arms nothing: the
    /// sleep then ends at its timeout, and the rdma_cm channels in the
    /// same set still report the connections' end.
    fn arm_wakeup(&self) -> bool {
        // SAFETY: valid CQ.
        let _ = unsafe { ibv_req_notify_cq(self.inner.hw.cq, 0) };
        self.inner.pump();
        !self.inner.stashed.load(Ordering::Acquire)
    }

    fn disarm_wakeup(&self) {
        self.inner.take_cq_events();
    }
}

const STATE_INIT: u8 = 0;
const STATE_RTS: u8 = 1;
const STATE_ERROR: u8 = 2;

#[derive(Debug)]
enum SlotOp {
    Empty,
    User(SendOp),
    Bind(usize),
    Drain,
}

#[derive(Debug)]
struct SendSlot {
    wr_id: WrId,
    op: SlotOp,
    sgl: SgeList,
}

/// Work requests posted and not yet retired, in post order. Hardware
/// `wr_id` = sequence number; slot = sequence mod capacity.
#[derive(Debug)]
struct SendRing {
    slots: Box<[SendSlot]>,
    head: u64,
    tail: u64,
    user_cap: u64,
    drained: bool,
}

impl SendRing {
    fn new(cap: u32, user_cap: u32) -> SendRing {
        SendRing {
            slots: (0..cap)
                .map(|_| SendSlot {
                    wr_id: WrId::default(),
                    op: SlotOp::Empty,
                    sgl: SgeList::new(),
                })
                .collect(),
            head: 0,
            tail: 0,
            user_cap: u64::from(user_cap),
            drained: false,
        }
    }
    fn outstanding(&self) -> u64 {
        self.head - self.tail
    }
    fn room(&self, internal: bool) -> bool {
        let cap = if internal {
            self.slots.len() as u64
        } else {
            self.user_cap
        };
        self.outstanding() < cap
    }
    fn slot(&mut self, seq: u64) -> &mut SendSlot {
        let n = self.slots.len() as u64;
        &mut self.slots[(seq % n) as usize]
    }
}

#[derive(Debug)]
struct RecvSlot {
    wr_id: WrId,
    sgl: SgeList,
    marker: bool,
}

#[derive(Debug)]
struct RecvRing {
    slots: Box<[RecvSlot]>,
    head: u64,
    tail: u64,
    user_cap: u64,
    drained: bool,
}

impl RecvRing {
    fn new(cap: u32, user_cap: u32) -> RecvRing {
        RecvRing {
            slots: (0..cap)
                .map(|_| RecvSlot {
                    wr_id: WrId::default(),
                    sgl: SgeList::new(),
                    marker: false,
                })
                .collect(),
            head: 0,
            tail: 0,
            user_cap: u64::from(user_cap),
            drained: false,
        }
    }
    fn slot(&mut self, seq: u64) -> &mut RecvSlot {
        let n = self.slots.len() as u64;
        &mut self.slots[(seq % n) as usize]
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WindowState {
    Free,
    Binding,
    Bound,
    Failed,
}

/// A type 2 memory window of a QP: one `expose` uses and frees again,
/// or one the consumer binds itself (`user`, from `alloc_window`).
#[derive(Debug)]
struct MwSlot {
    mw: *mut ibv_mw,
    /// The key it is (or was last) bound under; also in `(*mw).rkey`,
    /// which rdma_rxe's bind checks against the window's current key.
    rkey: u32,
    state: WindowState,
    user: bool,
}

/// The connection's rdma_cm side (id before channel: drop order).
#[derive(Debug)]
struct CmConn {
    id: CmId,
    ch: Channel,
    disconnected: bool,
}

/// Everything about one QP that the CQs need to turn hardware completions
/// into neutral ones. Owned jointly by the QP handle and the CQ registries;
/// destroys the hardware QP when the last reference goes.
#[derive(Debug)]
struct QpShared {
    qp: *mut ibv_qp,
    qp_num: u32,
    hw_inline: u32,
    state: AtomicU8,
    sq: Mutex<SendRing>,
    rq: Mutex<RecvRing>,
    windows: Mutex<Vec<MwSlot>>,
    cm: Mutex<Option<CmConn>>,
    caps: QpCaps,
    pd: Arc<PdInner>,
    /// The shared receive queue its receives come from.
    srq: Option<Arc<SrqInner>>,
    _send_cq: Arc<CqHw>,
    _recv_cq: Arc<CqHw>,
}

// SAFETY: the QP pointer is used for posting (serialised by the ring
// mutexes) and modify/destroy (thread-safe verbs); all mutable bookkeeping
// is behind mutexes or atomics.
unsafe impl Send for QpShared {}
// SAFETY: see `Send`.
unsafe impl Sync for QpShared {}

impl Drop for QpShared {
    fn drop(&mut self) {
        // Last reference: nobody posts or polls for this QP any more.
        // Windows go first: deallocating one invalidates its rkey, so the
        // peer can no longer reach our buffers through it, and a bound
        // type 2 window holds a reference on its QP in rdma_rxe
        // (rxe_mw.c takes one at bind), which makes destroying the QP
        // first wait in the kernel until its cleanup gives up. Then the
        // QP, which stops the HCA touching the buffers the rings hand
        // back to their slabs as they drop. Both before the PD (we hold
        // its Arc).
        for w in lock(&self.windows).drain(..) {
            // SAFETY: allocated by us, freed once.
            unsafe {
                ibv_dealloc_mw(w.mw);
            }
        }
        // SAFETY: valid QP, destroyed once.
        unsafe {
            ibv_destroy_qp(self.qp);
        }
    }
}

impl QpShared {
    fn state(&self) -> QpState {
        match self.state.load(Ordering::Acquire) {
            STATE_INIT => QpState::Init,
            STATE_RTS => QpState::Rts,
            _ => QpState::Error,
        }
    }

    /// Moves to the error state; `notify` also tells the peer (DREQ), as
    /// after a local error completion.
    fn enter_error(&self, notify: bool) {
        if self.state.swap(STATE_ERROR, Ordering::AcqRel) == STATE_ERROR {
            return;
        }
        if notify {
            self.cm_disconnect();
        }
    }

    /// rdma_disconnect (once) and the QP to ERR, flushing everything.
    fn cm_disconnect(&self) {
        if let Some(cm) = lock(&self.cm).as_mut() {
            if !cm.disconnected {
                cm.disconnected = true;
                cm.id.disconnect();
            }
        }
        self.modify_err();
    }

    fn modify_err(&self) {
        // SAFETY: all-zero ibv_qp_attr is valid.
        let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = ibv_qp_state::IBV_QPS_ERR;
        // SAFETY: valid QP; any state may move to ERR.
        unsafe {
            ibv_modify_qp(self.qp, &mut attr, ibv_qp_attr_mask::IBV_QP_STATE.0 as i32);
        }
    }

    fn process_cm_events(&self) {
        let mut peer_gone = false;
        if let Some(cm) = lock(&self.cm).as_mut() {
            while let Ok(Some(ev)) = cm.ch.try_event() {
                let k = ev.kind();
                drop(ev);
                if k == rdma_cm_event_type::RDMA_CM_EVENT_DISCONNECTED
                    || k == rdma_cm_event_type::RDMA_CM_EVENT_DEVICE_REMOVAL
                {
                    peer_gone = true;
                }
            }
        }
        if peer_gone {
            self.state.store(STATE_ERROR, Ordering::Release);
            self.cm_disconnect();
        }
    }

    /// Turns one hardware completion of this QP into a neutral one (or
    /// consumes it, for provider-internal work requests).
    fn complete(&self, wc: &ibv_wc) -> Option<Completion> {
        let status = wc_status(wc.status);
        if status != WcStatus::Success {
            self.enter_error(status != WcStatus::WrFlushErr);
        }
        if wc.wr_id & RECV_BIT != 0 {
            self.complete_recv(wc, status)
        } else if wc.wr_id & SRQ_BIT != 0 {
            let srq = self.srq.as_ref()?;
            let (wr_id, sgl) = srq.take(wc.wr_id & !SRQ_BIT)?;
            Some(self.recv_completion(wc, status, wr_id, sgl))
        } else {
            self.complete_send(wc, status)
        }
    }

    fn complete_send(&self, wc: &ibv_wc, status: WcStatus) -> Option<Completion> {
        let seq = wc.wr_id & SEQ_MASK;
        let mut sq = lock(&self.sq);
        if seq < sq.tail || seq >= sq.head {
            return None;
        }
        // Unsignaled work requests before this one retired with it.
        while sq.tail < seq {
            let t = sq.tail;
            let s = sq.slot(t);
            let op = std::mem::replace(&mut s.op, SlotOp::Empty);
            drop(std::mem::take(&mut s.sgl));
            sq.tail += 1;
            if let SlotOp::User(SendOp::LocalInv(rkey)) = op {
                self.window_invalidated(rkey);
            }
        }
        let s = sq.slot(seq);
        let op = std::mem::replace(&mut s.op, SlotOp::Empty);
        let mut sgl = std::mem::take(&mut s.sgl);
        let wr_id = s.wr_id;
        sq.tail = seq + 1;
        match op {
            SlotOp::Empty => None,
            SlotOp::Drain => {
                sq.drained = true;
                None
            }
            SlotOp::Bind(w) => {
                drop(sq);
                let mut ws = lock(&self.windows);
                if let Some(win) = ws.get_mut(w) {
                    win.state = if status == WcStatus::Success {
                        WindowState::Bound
                    } else {
                        WindowState::Failed
                    };
                }
                None
            }
            SlotOp::User(op) => {
                drop(sq);
                let ok = status == WcStatus::Success;
                let byte_len = match op {
                    SendOp::Read(_) if ok => {
                        scatter_lengths(&mut sgl, wc.byte_len);
                        wc.byte_len
                    }
                    SendOp::LocalInv(rkey) if ok => {
                        self.window_invalidated(rkey);
                        0
                    }
                    _ if ok => sgl.total_len() as u32,
                    _ => 0,
                };
                Some(Completion {
                    wr_id,
                    status,
                    opcode: send_wc_opcode(&op),
                    byte_len,
                    imm: None,
                    invalidated_rkey: None,
                    qp_num: self.qp_num,
                    sgl,
                })
            }
        }
    }

    fn complete_recv(&self, wc: &ibv_wc, status: WcStatus) -> Option<Completion> {
        let seq = wc.wr_id & SEQ_MASK;
        let mut rq = lock(&self.rq);
        if seq < rq.tail || seq >= rq.head {
            return None;
        }
        // RC receives complete in order; `tail` follows.
        rq.tail = seq + 1;
        let s = rq.slot(seq);
        let marker = std::mem::take(&mut s.marker);
        let sgl = std::mem::take(&mut s.sgl);
        let wr_id = s.wr_id;
        if marker {
            rq.drained = true;
            return None;
        }
        drop(rq);
        Some(self.recv_completion(wc, status, wr_id, sgl))
    }

    /// The completion of receive `wr_id` (its buffers `sgl`).
    fn recv_completion(
        &self,
        wc: &ibv_wc,
        status: WcStatus,
        wr_id: WrId,
        mut sgl: SgeList,
    ) -> Completion {
        let mut c = Completion {
            wr_id,
            status,
            opcode: WcOpcode::Recv,
            qp_num: self.qp_num,
            ..Completion::default()
        };
        if status == WcStatus::Success {
            c.opcode = recv_wc_opcode(wc.opcode);
            c.byte_len = wc.byte_len;
            scatter_lengths(&mut sgl, wc.byte_len);
            // SAFETY: the union holds imm_data or invalidated_rkey as
            // wc_flags says; both are plain u32.
            let (imm, inv) = unsafe {
                (
                    wc.imm_data_invalidated_rkey_union.imm_data,
                    wc.imm_data_invalidated_rkey_union.invalidated_rkey,
                )
            };
            if wc.wc_flags & ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0 {
                c.imm = Some(u32::from_be(imm));
            }
            if recv_invalidated(wc.wc_flags, self.pd.dev.kernel_wc_flags) {
                c.invalidated_rkey = Some(inv);
                self.window_invalidated(inv);
            }
        } else {
            scatter_lengths(&mut sgl, 0);
        }
        c.sgl = sgl;
        c
    }

    /// Allocates a type 2 window for `expose` or, `user`, for the
    /// consumer's binds; returns its index. At most `MAX_WINDOWS`.
    fn new_window(&self, ws: &mut Vec<MwSlot>, user: bool) -> Result<usize, VerbsError> {
        if ws.len() >= MAX_WINDOWS {
            return Err(VerbsError::Limit("256 memory windows on this QP"));
        }
        // SAFETY: valid PD.
        let mw = unsafe { ibv_alloc_mw(self.pd.pd, ibv_mw_type::IBV_MW_TYPE_2) }
            .unwrap_or(std::ptr::null_mut());
        if mw.is_null() {
            return Err(os_error("ibv_alloc_mw(type 2)"));
        }
        // SAFETY: freshly allocated window.
        let rkey = unsafe { (*mw).rkey };
        ws.push(MwSlot {
            mw,
            rkey,
            state: WindowState::Free,
            user,
        });
        Ok(ws.len() - 1)
    }

    fn window_invalidated(&self, rkey: u32) {
        let mut ws = lock(&self.windows);
        if let Some(w) = ws
            .iter_mut()
            .find(|w| !w.user && w.rkey == rkey && w.state == WindowState::Bound)
        {
            w.state = WindowState::Free;
        }
    }

    fn post_send_internal(&self, op: SlotOp, hw: &mut ibv_send_wr) -> Result<u64, PostError> {
        let mut sq = lock(&self.sq);
        if !sq.room(true) {
            return Err(PostError::QueueFull);
        }
        let seq = sq.head;
        hw.wr_id = seq;
        let mut bad = std::ptr::null_mut();
        // SAFETY: valid QP; `hw` is a complete work request with no SGE
        // pointers into freed memory (internal requests carry none).
        let rc = unsafe { ibv_post_send(self.qp, hw, &mut bad) };
        if rc != 0 {
            return Err(PostError::QueueFull);
        }
        let s = sq.slot(seq);
        s.op = op;
        s.wr_id = WrId::default();
        sq.head += 1;
        Ok(seq)
    }

    /// Posts a signaled zero-length Send; once the QP is in error it
    /// flushes, and its completion retires every unsignaled request
    /// before it (ib_drain_sq's technique).
    fn post_drain_markers(&self) {
        let mut hw = zeroed_send_wr();
        hw.opcode = ibv_wr_opcode::IBV_WR_SEND;
        hw.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
        if self.post_send_internal(SlotOp::Drain, &mut hw).is_err() {
            lock(&self.sq).drained = true;
        }
        let mut rq = lock(&self.rq);
        let seq = rq.head;
        let mut w = zeroed_recv_wr();
        w.wr_id = RECV_BIT | seq;
        let mut bad = std::ptr::null_mut();
        // SAFETY: valid QP; a receive with no SGEs.
        let rc = unsafe { ibv_post_recv(self.qp, &mut w, &mut bad) };
        if rc == 0 {
            rq.slot(seq).marker = true;
            rq.head += 1;
        } else {
            rq.drained = true;
        }
        drop(rq);
        // Move to Error again, now that the markers are posted. A receive
        // posted in the Error state must complete flushed (IBTA), but on
        // rxe nothing runs to flush it: rdma-core's rxe library posts
        // receives into a queue shared with the kernel without a system
        // call, and the kernel's responder only flushes the receive queue
        // when its task runs, which a transition to Error schedules
        // (rxe_qp.c, `rxe_qp_error`). Without this every QP's drop waited
        // out SETUP_TIMEOUT there. Error -> Error is allowed by the spec
        // and harmless on hardware.
        self.modify_err();
    }

    fn drained(&self) -> bool {
        lock(&self.sq).drained && lock(&self.rq).drained
    }

    fn post_recv(&self, wr: RecvWr) -> Result<(), PostFailed<RecvWr>> {
        if let Err(error) = check_recv(&wr) {
            return Err(PostFailed { error, wr });
        }
        let mut rq = lock(&self.rq);
        if rq.head - rq.tail >= rq.user_cap {
            return Err(PostFailed {
                error: PostError::QueueFull,
                wr,
            });
        }
        let seq = rq.head;
        let mut sges = NO_SGES;
        let mut hw = zeroed_recv_wr();
        fill_recv_wr(&wr, RECV_BIT | seq, &mut sges, &mut hw);
        let mut bad = std::ptr::null_mut();
        // SAFETY: valid QP; `hw` points at `sges`, both live for the call;
        // the buffers stay owned by the ring slot until the completion.
        let rc = unsafe { ibv_post_recv(self.qp, &mut hw, &mut bad) };
        if rc != 0 {
            let error = if rc == libc::ENOMEM {
                PostError::QueueFull
            } else {
                PostError::Invalid
            };
            return Err(PostFailed { error, wr });
        }
        let s = rq.slot(seq);
        s.wr_id = wr.wr_id;
        s.sgl = wr.sgl;
        s.marker = false;
        rq.head += 1;
        Ok(())
    }
}

/// A shared receive queue (`ibv_srq`). Its receives complete on the
/// receive CQ of whichever queue pair took them, in any order across
/// queue pairs, so each is found again by its slot, not by a sequence.
#[derive(Debug)]
pub struct IbvSrq {
    inner: Arc<SrqInner>,
}

#[derive(Debug)]
struct SrqInner {
    srq: *mut ibv_srq,
    slots: Mutex<SrqSlots>,
    pd: Arc<PdInner>,
}

/// The posted receives' buffers by slot, and the free slots.
#[derive(Debug)]
struct SrqSlots {
    wrs: Box<[Option<(WrId, SgeList)>]>,
    free: Vec<u32>,
}

// SAFETY: the SRQ pointer is used for posting (serialised by the slots
// mutex) and destroy (once, in drop); all bookkeeping is behind the mutex.
unsafe impl Send for SrqInner {}
// SAFETY: see `Send`.
unsafe impl Sync for SrqInner {}

impl Drop for SrqInner {
    fn drop(&mut self) {
        // Last reference: every queue pair on it is destroyed (each holds
        // an Arc), so the device no longer writes its buffers, which go
        // back to their slabs as the slots drop. Before the PD (we hold
        // its Arc).
        // SAFETY: valid SRQ, destroyed once.
        unsafe {
            ibv_destroy_srq(self.srq);
        }
    }
}

impl SrqInner {
    /// The receive in `slot`, which just completed.
    fn take(&self, slot: u64) -> Option<(WrId, SgeList)> {
        let mut st = lock(&self.slots);
        let i = u32::try_from(slot).ok()?;
        let wr = st.wrs.get_mut(i as usize)?.take()?;
        st.free.push(i);
        Some(wr)
    }
}

impl SharedReceiveQueue<Ibverbs> for IbvSrq {
    fn post_recv(&self, wr: RecvWr) -> Result<(), PostFailed<RecvWr>> {
        if let Err(error) = check_recv(&wr) {
            return Err(PostFailed { error, wr });
        }
        let mut st = lock(&self.inner.slots);
        let Some(slot) = st.free.pop() else {
            return Err(PostFailed {
                error: PostError::QueueFull,
                wr,
            });
        };
        let mut sges = NO_SGES;
        let mut hw = zeroed_recv_wr();
        fill_recv_wr(&wr, SRQ_BIT | u64::from(slot), &mut sges, &mut hw);
        let mut bad = std::ptr::null_mut();
        // SAFETY: valid SRQ; `hw` points at `sges`, both live for the call;
        // the buffers stay owned by the slot until the completion.
        let rc = unsafe { ibv_post_srq_recv(self.inner.srq, &mut hw, &mut bad) };
        if rc != 0 {
            st.free.push(slot);
            let error = if rc == libc::ENOMEM {
                PostError::QueueFull
            } else {
                PostError::Invalid
            };
            return Err(PostFailed { error, wr });
        }
        st.wrs[slot as usize] = Some((wr.wr_id, wr.sgl));
        Ok(())
    }

    fn posted(&self) -> usize {
        let st = lock(&self.inner.slots);
        st.wrs.len() - st.free.len()
    }
}

/// Sets each buffer's valid length from `total` bytes scattered in order.
fn scatter_lengths(sgl: &mut SgeList, total: u32) {
    let mut left = total;
    for s in sgl.iter_mut() {
        let here = left.min(s.len);
        s.buf.set_len(s.offset + here);
        left -= here;
    }
}

/// The QP plus its registrations in the CQs; unregisters on drop.
#[derive(Debug)]
struct QpHandle {
    shared: Arc<QpShared>,
    send_cq: Arc<CqInner>,
    recv_cq: Arc<CqInner>,
    epoll_fd: Option<i32>,
}

impl QpHandle {
    fn new(shared: Arc<QpShared>, send_cq: &IbvCq, recv_cq: &IbvCq) -> QpHandle {
        for cq in [&send_cq.inner, &recv_cq.inner] {
            lock(&cq.qps).insert(shared.qp_num, Arc::clone(&shared));
        }
        QpHandle {
            shared,
            send_cq: Arc::clone(&send_cq.inner),
            recv_cq: Arc::clone(&recv_cq.inner),
            epoll_fd: None,
        }
    }

    fn cqs(&self) -> impl Iterator<Item = &Arc<CqInner>> {
        let same = Arc::ptr_eq(&self.send_cq, &self.recv_cq);
        std::iter::once(&self.send_cq).chain((!same).then_some(&self.recv_cq))
    }

    /// The connection is up: keep its rdma_cm side, watch its channel.
    fn connected(&mut self, cm: CmConn) {
        let fd = cm.ch.fd();
        *lock(&self.shared.cm) = Some(cm);
        self.shared.state.store(STATE_RTS, Ordering::Release);
        for cq in self.cqs() {
            // A failure leaves the QP to learn of a disconnect from its
            // completions (flushes) instead.
            let _ = cq.epoll.add(fd, u64::from(self.shared.qp_num));
        }
        self.epoll_fd = Some(fd);
    }

    /// Moves the QP through RTR and RTS with the attributes rdma_cm
    /// computed for `id`, with our RNR timer (RTR) and RNR retry (RTS).
    fn ready(&self, id: &CmId) -> Result<(), VerbsError> {
        for (state, what) in [
            (ibv_qp_state::IBV_QPS_RTR, "ibv_modify_qp(RTR)"),
            (ibv_qp_state::IBV_QPS_RTS, "ibv_modify_qp(RTS)"),
        ] {
            // SAFETY: all-zero ibv_qp_attr is valid.
            let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
            attr.qp_state = state;
            let mut mask = 0;
            // SAFETY: valid id with a resolved route / connect request;
            // out pointers to locals.
            if unsafe { rdma_init_qp_attr(id.as_ptr(), &mut attr, &mut mask) } != 0 {
                return Err(os_error("rdma_init_qp_attr"));
            }
            if state == ibv_qp_state::IBV_QPS_RTR {
                attr.min_rnr_timer = rnr_timer_code(self.shared.caps.rnr_timer);
                mask |= ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER.0 as i32;
            } else {
                attr.rnr_retry = self.shared.caps.rnr_retry.min(7);
                mask |= ibv_qp_attr_mask::IBV_QP_RNR_RETRY.0 as i32;
            }
            // SAFETY: valid QP and attributes from rdma_cm.
            let rc = unsafe { ibv_modify_qp(self.shared.qp, &mut attr, mask) };
            if rc != 0 {
                return Err(errno_error(what, rc));
            }
        }
        Ok(())
    }

    fn check_device(&self, id: &CmId, url: &str) -> Result<(), VerbsError> {
        let v = id.verbs();
        let ours = self.shared.pd.dev.ctx;
        if !v.is_null() && v != ours {
            return Err(VerbsError::Unavailable(format!(
                "{url}: reached through device {}, but the queue pair is on {}",
                sys::device_name(v),
                self.shared.pd.dev.name
            )));
        }
        Ok(())
    }
}

impl Drop for QpHandle {
    fn drop(&mut self) {
        let sh = &self.shared;
        if sh.state.load(Ordering::Acquire) != STATE_ERROR || lock(&sh.cm).is_some() {
            sh.state.store(STATE_ERROR, Ordering::Release);
            sh.cm_disconnect();
        }
        // Collect every outstanding completion (into the stashes) so the
        // application still sees its buffers come back, then stop
        // dispatching for this QP.
        sh.post_drain_markers();
        let deadline = Instant::now() + SETUP_TIMEOUT;
        while !sh.drained() && Instant::now() < deadline {
            for cq in self.cqs() {
                cq.pump();
            }
            std::thread::yield_now();
        }
        if let Some(fd) = self.epoll_fd {
            for cq in self.cqs() {
                cq.epoll.remove(fd);
            }
        }
        for cq in self.cqs() {
            lock(&cq.qps).remove(&sh.qp_num);
        }
    }
}

/// A created queue pair in INIT: receives may be posted.
#[derive(Debug)]
pub struct IbvPreparedQp {
    h: QpHandle,
}

impl IbvPreparedQp {
    /// The queue-pair number.
    pub fn qp_num(&self) -> u32 {
        self.h.shared.qp_num
    }
}

impl PreparedQp<Ibverbs> for IbvPreparedQp {
    fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostFailed<RecvWr>> {
        self.h.shared.post_recv(wr)
    }

    /// Resolves the address and route with rdma_cm, sends a connect
    /// request carrying our QP number and `private_data` (at most 56
    /// bytes on IB/RoCE), moves the QP to RTR/RTS on the response and
    /// completes the handshake (`rdma_establish`).
    ///
    /// # Errors
    /// [`VerbsError::Rejected`] with the peer's reject data,
    /// [`VerbsError::Timeout`], [`VerbsError::Limit`] for oversized
    /// private data, [`VerbsError::Unavailable`] when the address routes
    /// through another device, OS errors (`ECONNREFUSED` when nobody
    /// listens, `EHOSTUNREACH`).
    fn connect(
        mut self,
        url: &str,
        private_data: &[u8],
        timeout: Duration,
    ) -> Result<(IbvQp, Vec<u8>), VerbsError> {
        let u = parse_url(url)?;
        let sh = Arc::clone(&self.h.shared);
        let param = conn_param(
            CmMessage::Connect,
            private_data,
            sh.qp_num,
            &sh.caps,
            sh.pd.dev.rd_atomic,
        )?;
        let deadline = Instant::now() + timeout;
        let ch = Channel::new()?;
        let id = CmId::new(&ch)?;
        let mut dst = SockAddr::from(u.addr);
        // SAFETY: valid id; `dst` lives for the call (copied by rdma_cm).
        let rc = unsafe {
            rdma_resolve_addr(
                id.as_ptr(),
                std::ptr::null_mut(),
                dst.as_mut_ptr(),
                sys::step_ms(deadline),
            )
        };
        if rc != 0 {
            return Err(os_error("rdma_resolve_addr"));
        }
        expect_event(
            &ch,
            deadline,
            rdma_cm_event_type::RDMA_CM_EVENT_ADDR_RESOLVED,
        )?;
        self.h.check_device(&id, url)?;
        // SAFETY: valid id with a resolved address.
        if unsafe { rdma_resolve_route(id.as_ptr(), sys::step_ms(deadline)) } != 0 {
            return Err(os_error("rdma_resolve_route"));
        }
        expect_event(
            &ch,
            deadline,
            rdma_cm_event_type::RDMA_CM_EVENT_ROUTE_RESOLVED,
        )?;
        let mut raw = param.raw;
        // SAFETY: valid id with a route; `raw` points at `private_data`,
        // which outlives the call (rdma_cm copies it).
        if unsafe { rdma_connect(id.as_ptr(), &mut raw) } != 0 {
            return Err(os_error("rdma_connect"));
        }
        let ev = ch.wait_event(deadline)?;
        let peer_data = match ev.kind() {
            rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_RESPONSE
            | rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED => ev.private_data(),
            rdma_cm_event_type::RDMA_CM_EVENT_REJECTED => {
                return Err(rejected(&ev));
            }
            _ => return Err(setup_failed(&ev)),
        };
        drop(ev);
        self.h.ready(&id)?;
        // SAFETY: valid id; our QP is in RTS.
        if unsafe { rdma_establish(id.as_ptr()) } != 0 {
            return Err(os_error("rdma_establish"));
        }
        self.h.connected(CmConn {
            id,
            ch,
            disconnected: false,
        });
        let qp = IbvQp::from_handle(self.h);
        Ok((qp, peer_data))
    }
}

fn expect_event(
    ch: &Channel,
    deadline: Instant,
    want: rdma_cm_event_type::Type,
) -> Result<(), VerbsError> {
    let ev = ch.wait_event(deadline)?;
    if ev.kind() == want {
        return Ok(());
    }
    Err(setup_failed(&ev))
}

/// IB CM reject reason "consumer defined": the peer application said no.
const REJ_CONSUMER: i32 = 28;

fn rejected(ev: &sys::Event) -> VerbsError {
    let data = ev.private_data();
    if ev.status() == REJ_CONSUMER || !data.is_empty() {
        VerbsError::Rejected { private_data: data }
    } else {
        errno_error("connect (nobody listens there?)", libc::ECONNREFUSED)
    }
}

fn setup_failed(ev: &sys::Event) -> VerbsError {
    let errno = match ev.kind() {
        rdma_cm_event_type::RDMA_CM_EVENT_ADDR_ERROR
        | rdma_cm_event_type::RDMA_CM_EVENT_ROUTE_ERROR
        | rdma_cm_event_type::RDMA_CM_EVENT_UNREACHABLE => libc::EHOSTUNREACH,
        rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_ERROR => libc::ECONNABORTED,
        rdma_cm_event_type::RDMA_CM_EVENT_REJECTED => libc::ECONNREFUSED,
        _ => return VerbsError::Protocol("unexpected rdma_cm event during setup"),
    };
    errno_error("rdma_cm connection setup", errno)
}

/// A connected RC queue pair.
#[derive(Debug)]
pub struct IbvQp {
    h: QpHandle,
    /// Largest inline send the hardware took (inline requests above it
    /// go out as ordinary gathers).
    hw_inline: u32,
}

impl IbvQp {
    fn from_handle(h: QpHandle) -> IbvQp {
        let hw_inline = h.shared.hw_inline;
        IbvQp { h, hw_inline }
    }

    fn pf(error: PostError, wr: SendWr) -> PostFailed<SendWr> {
        PostFailed { error, wr }
    }

    /// Translates and posts up to `CHUNK` linked work requests, one
    /// doorbell (`CHUNK` = 1 for `post_send`: no large stack arrays on the
    /// single-request path).
    fn post_chunk<const CHUNK: usize, I: Iterator<Item = SendWr>>(
        &mut self,
        wrs: &mut I,
    ) -> (usize, bool, Option<PostFailed<SendWr>>) {
        let sh = Arc::clone(&self.h.shared);
        let mut sq = lock(&sh.sq);
        let mut hws: [ibv_send_wr; CHUNK] = std::array::from_fn(|_| zeroed_send_wr());
        let mut sges = [NO_SGES; CHUNK];
        let mut held: [Option<SendWr>; CHUNK] = std::array::from_fn(|_| None);
        // Binds our checks refuse still need a region pointer (the HCA
        // refuses them for their zero length before looking at it).
        // SAFETY: all-zero is a valid ibv_mr (null pointers, zero keys).
        let mut no_mr: ibv_mr = unsafe { std::mem::zeroed() };
        let mut k = 0;
        let mut rekey = None;
        let mut refused = None;
        let mut exhausted = false;
        while k < CHUNK {
            let Some(wr) = wrs.next() else {
                exhausted = true;
                break;
            };
            if let Err(e) = check_send(&wr, sh.caps.max_inline) {
                refused = Some(Self::pf(e, wr));
                break;
            }
            if sq.outstanding() + k as u64 >= sq.user_cap {
                refused = Some(Self::pf(PostError::QueueFull, wr));
                break;
            }
            fill_send_wr(&wr, sq.head + k as u64, &mut sges[k], &mut hws[k]);
            if let SendOp::Bind(b) = wr.op {
                let mut ws = lock(&sh.windows);
                let Some(win) = ws.get_mut(b.window as usize).filter(|w| w.user) else {
                    refused = Some(Self::pf(PostError::Invalid, wr));
                    break;
                };
                let mr = lock(&sh.pd.mrs).get(&b.lkey).copied();
                let w = Window::new(b.window, win.rkey & !0xff, 0xff);
                let valid = b.rkey != win.rkey
                    && mr.is_some_and(|m| bind_ok(&b, &w, m.addr, m.len, m.access));
                let mr_ptr = match mr {
                    Some(m) if valid => m.mr,
                    _ => std::ptr::addr_of_mut!(no_mr),
                };
                fill_bind(&b, win.mw, mr_ptr, valid, &mut hws[k]);
                if valid {
                    win.rkey = b.rkey;
                    rekey = Some((win.mw, b.rkey));
                }
            }
            if wr.inline && wr.sgl.total_len() > u64::from(self.hw_inline) {
                hws[k].send_flags &= !ibv_send_flags::IBV_SEND_INLINE.0;
            }
            held[k] = Some(wr);
            k += 1;
            if rekey.is_some() {
                // A bind ends the doorbell: it must go to the HCA
                // carrying the window's current key (rdma_rxe checks it),
                // and the window's next bind the key this one gives it.
                break;
            }
        }
        if k == 0 {
            return (0, exhausted, refused);
        }
        // Link after filling, through raw pointers only: the arrays no
        // longer move.
        let p = hws.as_mut_ptr();
        let sp = sges.as_mut_ptr();
        for i in 0..k {
            // SAFETY: i < k <= CHUNK, inside both arrays.
            unsafe {
                let w = &mut *p.add(i);
                w.sg_list = if w.num_sge == 0 {
                    std::ptr::null_mut()
                } else {
                    (*sp.add(i)).as_mut_ptr()
                };
                w.next = if i + 1 < k {
                    p.add(i + 1)
                } else {
                    std::ptr::null_mut()
                };
            }
        }
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY: valid QP; `p[..k]` is a linked list of complete work
        // requests whose SGE arrays (`sges`) live on this frame for the
        // call; the buffers the SGEs name are moved into ring slots below
        // and stay there until their completions.
        let rc = unsafe { ibv_post_send(sh.qp, p, &mut bad) };
        let posted = if rc == 0 {
            k
        } else if bad.is_null() {
            0
        } else {
            // SAFETY: `bad` points into `hws` (libibverbs contract).
            (unsafe { bad.offset_from(p) }).clamp(0, k as isize) as usize
        };
        if let Some((mw, rkey)) = rekey.filter(|_| posted == k) {
            // SAFETY: our window (freed only with the QP); the bind (the
            // last request of the list) was posted.
            unsafe { (*mw).rkey = rkey };
        }
        for h in held.iter_mut().take(posted) {
            let wr = h.take().expect("held");
            let seq = sq.head;
            let s = sq.slot(seq);
            s.wr_id = wr.wr_id;
            s.op = SlotOp::User(wr.op);
            s.sgl = wr.sgl;
            sq.head += 1;
        }
        drop(sq);
        if posted < k {
            // The hardware refused request `posted`; hand it back. Any
            // linked after it were not posted either and cannot go back
            // into the caller's iterator: they complete with LocQpOpErr
            // (the QP is then unusable: this only happens when the
            // device's queue accounting disagrees with ours).
            let first = held[posted].take().expect("held");
            let error = if rc == libc::ENOMEM {
                PostError::QueueFull
            } else {
                PostError::Invalid
            };
            let mut lost = held
                .iter_mut()
                .skip(posted + 1)
                .filter_map(Option::take)
                .peekable();
            if lost.peek().is_some() {
                let mut st = lock(&self.h.send_cq.stash);
                for mut wr in lost {
                    st.push_back(Completion {
                        wr_id: wr.wr_id,
                        status: WcStatus::LocQpOpErr,
                        opcode: send_wc_opcode(&wr.op),
                        qp_num: sh.qp_num,
                        sgl: std::mem::take(&mut wr.sgl),
                        ..Completion::default()
                    });
                }
                self.h.send_cq.stashed.store(true, Ordering::Release);
                sh.enter_error(true);
            }
            return (posted, false, Some(Self::pf(error, first)));
        }
        (posted, exhausted, refused)
    }
}

impl QueuePair<Ibverbs> for IbvQp {
    fn qp_num(&self) -> u32 {
        self.h.shared.qp_num
    }

    /// The state as last learnt from completions (an error completion
    /// moves it to `Error`) and from rdma_cm (a peer's disconnect, seen
    /// when a CQ of this QP is polled).
    fn state(&self) -> QpState {
        self.h.shared.state()
    }

    fn post_send(&mut self, wr: SendWr) -> Result<(), PostFailed<SendWr>> {
        let mut one = std::iter::once(wr);
        match self.post_chunk::<1, _>(&mut one) {
            (_, _, Some(f)) => Err(f),
            _ => Ok(()),
        }
    }

    fn post_send_list<I: Iterator<Item = SendWr>>(
        &mut self,
        wrs: &mut I,
    ) -> Result<usize, PostFailed<SendWr>> {
        let mut total = 0;
        loop {
            let (n, exhausted, refused) = self.post_chunk::<16, _>(wrs);
            total += n;
            if let Some(f) = refused {
                return Err(f);
            }
            if exhausted {
                return Ok(total);
            }
        }
    }

    fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostFailed<RecvWr>> {
        self.h.shared.post_recv(wr)
    }

    /// With type 2 memory windows (mlx5, rxe, ...): binds a window over
    /// the whole region to this QP with a fresh key byte, waits for the
    /// bind to complete (so the key is live before anyone learns it) and
    /// returns the window's rkey: valid on this connection only, until a
    /// Local Invalidate or a peer's Send with Invalidate. Without windows
    /// (e.g. siw): the region's own rkey, valid for any QP of the PD and
    /// not invalidatable (see docs/IBVERBS.md).
    ///
    /// # Errors
    /// [`VerbsError::NotConnected`] in the error state or when the bind
    /// fails; [`VerbsError::InvalidRegistration`] without remote access;
    /// [`VerbsError::Limit`] with 256 windows bound; OS errors allocating
    /// a window.
    fn expose(&mut self, mr: &IbvMr) -> Result<RemoteKey, VerbsError> {
        let sh = Arc::clone(&self.h.shared);
        if sh.state() != QpState::Rts {
            return Err(VerbsError::NotConnected);
        }
        if !mr.access.contains(Access::REMOTE_READ) && !mr.access.contains(Access::REMOTE_WRITE) {
            return Err(VerbsError::InvalidRegistration(
                "region has no remote access",
            ));
        }
        let key = |rkey| RemoteKey {
            addr: mr.addr,
            rkey,
            len: mr.len as u64,
        };
        if !sh.pd.dev.mw_type2 {
            return Ok(key(mr.rkey));
        }
        let (w, mw, rkey) = {
            let mut ws = lock(&sh.windows);
            let w = match ws
                .iter()
                .position(|w| !w.user && w.state == WindowState::Free)
            {
                Some(w) => w,
                None => sh.new_window(&mut ws, false)?,
            };
            let win = &mut ws[w];
            win.rkey = next_rkey(win.rkey);
            win.state = WindowState::Binding;
            (w, win.mw, win.rkey)
        };
        let mut hw = zeroed_send_wr();
        hw.opcode = ibv_wr_opcode::IBV_WR_BIND_MW;
        hw.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
        hw.bind_mw_tso_union.bind_mw = bind_mw_t {
            mw,
            rkey,
            bind_info: ibv_mw_bind_info {
                mr: mr.mr,
                addr: mr.addr,
                length: mr.len as u64,
                mw_access_flags: mw_access(mr.access),
            },
        };
        if sh.post_send_internal(SlotOp::Bind(w), &mut hw).is_err() {
            lock(&sh.windows)[w].state = WindowState::Free;
            return Err(VerbsError::Limit(
                "send queue full: no room for a window bind",
            ));
        }
        // SAFETY: our window. The bind just posted carried the window's
        // current key (rdma_rxe refuses a bind naming any other); the
        // next one must carry the key this one gives it.
        unsafe { (*mw).rkey = rkey };
        let deadline = Instant::now() + SETUP_TIMEOUT;
        loop {
            let st = lock(&sh.windows)[w].state;
            match st {
                WindowState::Bound => return Ok(key(rkey)),
                WindowState::Failed => {
                    lock(&sh.windows)[w].state = WindowState::Free;
                    return Err(VerbsError::NotConnected);
                }
                _ if Instant::now() >= deadline => return Err(VerbsError::Timeout),
                _ => {
                    self.h.send_cq.pump();
                    std::thread::yield_now();
                }
            }
        }
    }

    /// A type 2 window (`ibv_alloc_mw`), bound per exchange by
    /// `IBV_WR_BIND_MW` work requests: the HCA owns the upper 24 bits of
    /// its rkeys (the window's index), the consumer the low byte (as
    /// `ibv_inc_rkey` changes it). At most 256 per QP, counting the
    /// windows `expose` uses; freed with the QP.
    ///
    /// # Errors
    /// [`VerbsError::Unavailable`] on devices without type 2 windows;
    /// [`VerbsError::NotConnected`] in the error state;
    /// [`VerbsError::Limit`] with 256 windows; OS errors.
    fn alloc_window(&mut self) -> Result<Window, VerbsError> {
        let sh = &self.h.shared;
        if !sh.pd.dev.mw_type2 {
            return Err(VerbsError::Unavailable(format!(
                "{} has no type 2 memory windows: use expose instead",
                sh.pd.dev.name
            )));
        }
        if sh.state() == QpState::Error {
            return Err(VerbsError::NotConnected);
        }
        let mut ws = lock(&sh.windows);
        let i = sh.new_window(&mut ws, true)?;
        // The HCA allocated the window under a key of its own: the first
        // bind must use another.
        Ok(Window::new(i as u32, ws[i].rkey & !0xff, 0xff).holding(ws[i].rkey))
    }

    /// Sends a DREQ, moves the QP to ERR (everything flushes, in order,
    /// onto the CQs) and posts a signaled marker so unsignaled requests
    /// still queued retire too.
    fn disconnect(&mut self) {
        let sh = &self.h.shared;
        sh.state.store(STATE_ERROR, Ordering::Release);
        sh.cm_disconnect();
        let mut hw = zeroed_send_wr();
        hw.opcode = ibv_wr_opcode::IBV_WR_SEND;
        hw.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
        // Best effort: with a full queue, the next signaled completion
        // retires the unsignaled ones anyway.
        let _ = sh.post_send_internal(SlotOp::Empty, &mut hw);
    }
}

/// A listening rdma_cm id.
#[derive(Debug)]
pub struct IbvListener {
    _id: CmId,
    ch: Channel,
    dev: Arc<Device>,
}

impl Listener<Ibverbs> for IbvListener {
    /// Waits for a connect request; requests that arrive on another
    /// device (wildcard listeners) are rejected and skipped.
    fn accept(&self, timeout: Duration) -> Result<IbvIncoming, VerbsError> {
        let deadline = Instant::now() + timeout;
        loop {
            let ev = self.ch.wait_event(deadline)?;
            if ev.kind() != rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_REQUEST {
                continue;
            }
            let private_data = ev.private_data();
            let initiator_depth = ev.initiator_depth();
            // SAFETY: a connect request's id is new and ours to own.
            let id = unsafe { CmId::from_raw(ev.id()) };
            // Acked before the id migrates off the listener's channel.
            drop(ev);
            let ch = Channel::new()?;
            id.migrate(&ch)?;
            let on_other_device = !id.verbs().is_null() && id.verbs() != self.dev.ctx;
            let inc = IbvIncoming {
                conn: Some((id, ch)),
                private_data,
                initiator_depth,
            };
            if on_other_device {
                let _ = inc.reject(&[]);
                continue;
            }
            return Ok(inc);
        }
    }
}

/// A connect request.
#[derive(Debug)]
pub struct IbvIncoming {
    conn: Option<(CmId, Channel)>,
    private_data: Vec<u8>,
    initiator_depth: u8,
}

impl Drop for IbvIncoming {
    fn drop(&mut self) {
        if let Some((id, _)) = &self.conn {
            // SAFETY: valid id of an unanswered request.
            unsafe {
                rdma_reject(id.as_ptr(), std::ptr::null(), 0);
            }
        }
    }
}

impl Incoming<Ibverbs> for IbvIncoming {
    /// The requester's private data as rdma_cm delivers it: on IB/RoCE
    /// the REQ's whole private-data area (56 bytes, zero-padded).
    fn private_data(&self) -> &[u8] {
        &self.private_data
    }

    /// Moves `qp` to RTR/RTS, answers with our QP number and
    /// `private_data` (at most 196 bytes) and waits (up to 10 s) for the
    /// requester's ready-to-use.
    ///
    /// # Errors
    /// [`VerbsError::Limit`] for oversized private data,
    /// [`VerbsError::Unavailable`] when the request came in on another
    /// device, [`VerbsError::Timeout`], OS errors.
    fn accept(mut self, qp: IbvPreparedQp, private_data: &[u8]) -> Result<IbvQp, VerbsError> {
        let (id, ch) = self.conn.take().expect("unanswered request");
        let h = qp.h;
        let sh = Arc::clone(&h.shared);
        let rd = sh.pd.dev.rd_atomic.min(self.initiator_depth);
        let param = conn_param(CmMessage::Accept, private_data, sh.qp_num, &sh.caps, rd)?;
        h.check_device(&id, "incoming connection")?;
        h.ready(&id)?;
        let mut raw = param.raw;
        // SAFETY: valid id of a connect request; `raw` points at
        // `private_data`, which outlives the call.
        if unsafe { rdma_accept(id.as_ptr(), &mut raw) } != 0 {
            return Err(os_error("rdma_accept"));
        }
        let deadline = Instant::now() + SETUP_TIMEOUT;
        expect_event(&ch, deadline, rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED)?;
        let mut h = h;
        h.connected(CmConn {
            id,
            ch,
            disconnected: false,
        });
        Ok(IbvQp::from_handle(h))
    }

    fn reject(mut self, private_data: &[u8]) -> Result<(), VerbsError> {
        if private_data.len() > MAX_REJECT_PRIVATE_DATA {
            return Err(VerbsError::Limit(
                "reject private data over 148 bytes (IB CM REJ limit)",
            ));
        }
        let (id, _ch) = self.conn.take().expect("unanswered request");
        // SAFETY: valid id; the data outlives the call.
        let rc = unsafe {
            rdma_reject(
                id.as_ptr(),
                private_data.as_ptr().cast(),
                private_data.len() as u8,
            )
        };
        if rc != 0 {
            return Err(os_error("rdma_reject"));
        }
        Ok(())
    }
}
