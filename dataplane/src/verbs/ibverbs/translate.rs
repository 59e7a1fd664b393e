//! The pure half of the `ibverbs` provider: URL parsing and the one-to-one
//! translations between the provider-neutral types and libibverbs /
//! librdmacm structures. No system call here, so all of it is unit-tested
//! on machines without an RDMA device.

use std::net::SocketAddr;
use std::time::Duration;

use rdma_sys::{
    bind_mw_t, ibv_access_flags, ibv_mr, ibv_mw, ibv_mw_bind_info, ibv_recv_wr, ibv_send_flags,
    ibv_send_wr, ibv_sge, ibv_wc_flags, ibv_wc_opcode, ibv_wc_status, ibv_wr_opcode,
    rdma_conn_param,
};

use crate::verbs::{
    Access, BindWindow, PostError, QpCaps, RecvWr, SendOp, SendWr, VerbsError, WcOpcode, WcStatus,
    MAX_SGE,
};

/// URL scheme of this provider.
pub const SCHEME: &str = "ibverbs";

/// A parsed `ibverbs://IP:PORT[?device=NAME]` address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IbvUrl {
    /// The IP and rdma_cm port (RDMA_PS_TCP port space).
    pub addr: SocketAddr,
    /// An explicit device name (`mlx5_0`, `rxe0`); otherwise the device is
    /// the one rdma_cm binds the address to.
    pub device: Option<String>,
}

/// Parses `ibverbs://IP:PORT` with an optional `?device=NAME` query.
/// IPv6 addresses are bracketed (`ibverbs://[fe80::1%eth0]:20049` is not
/// supported: scope ids are not parsed by `SocketAddr`).
///
/// # Errors
/// [`VerbsError::BadAddress`] naming what is wrong.
pub fn parse_url(url: &str) -> Result<IbvUrl, VerbsError> {
    let bad = |why| VerbsError::BadAddress {
        url: url.to_owned(),
        why,
    };
    let rest = url
        .strip_prefix("ibverbs://")
        .ok_or(bad("not an ibverbs:// address"))?;
    let (authority, query) = match rest.split_once('?') {
        Some((a, q)) => (a, Some(q)),
        None => (rest, None),
    };
    let authority = authority.strip_suffix('/').unwrap_or(authority);
    let addr: SocketAddr = authority
        .parse()
        .map_err(|_| bad("expected ibverbs://IP:PORT (IPv6 in brackets)"))?;
    if addr.port() == 0 {
        return Err(bad("port 0: name the port clients connect to"));
    }
    let mut device = None;
    if let Some(q) = query {
        for kv in q.split('&').filter(|s| !s.is_empty()) {
            match kv.split_once('=') {
                Some(("device", name))
                    if !name.is_empty()
                        && name.len() < 64
                        && name
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') =>
                {
                    device = Some(name.to_owned());
                }
                Some(("device", _)) => return Err(bad("bad device name")),
                _ => return Err(bad("unknown query parameter (only device=NAME)")),
            }
        }
    }
    Ok(IbvUrl { addr, device })
}

/// The one-line message for a host without any RDMA device. It names the
/// providers that work without one by pointing at the docs, so it stays
/// true as providers are added.
pub fn no_device_message(url: &str) -> String {
    format!(
        "{url}: no RDMA device found (no HCA, and no rxe/siw link: see `rdma link`); \
         use a provider that needs none, e.g. shm:///path.sock (see docs/VERBS.md)"
    )
}

/// `ibv_wc_status` -> [`WcStatus`]. Statuses without a provider-neutral
/// twin map to the closest class: local errors to `LocQpOpErr` /
/// `LocProtErr`, remote ones to `RemInvReqErr` / `RemAccessErr`, transport
/// loss to `RetryExcErr`.
pub fn wc_status(status: ibv_wc_status::Type) -> WcStatus {
    use ibv_wc_status::*;
    match status {
        IBV_WC_SUCCESS => WcStatus::Success,
        IBV_WC_LOC_LEN_ERR => WcStatus::LocLenErr,
        IBV_WC_LOC_QP_OP_ERR | IBV_WC_LOC_EEC_OP_ERR => WcStatus::LocQpOpErr,
        IBV_WC_LOC_PROT_ERR | IBV_WC_LOC_ACCESS_ERR | IBV_WC_LOC_RDD_VIOL_ERR => {
            WcStatus::LocProtErr
        }
        IBV_WC_MW_BIND_ERR => WcStatus::MwBindErr,
        IBV_WC_WR_FLUSH_ERR => WcStatus::WrFlushErr,
        IBV_WC_REM_INV_REQ_ERR | IBV_WC_REM_OP_ERR | IBV_WC_REM_INV_RD_REQ_ERR => {
            WcStatus::RemInvReqErr
        }
        IBV_WC_BAD_RESP_ERR | IBV_WC_REM_ABORT_ERR => WcStatus::RemInvReqErr,
        IBV_WC_REM_ACCESS_ERR => WcStatus::RemAccessErr,
        IBV_WC_RETRY_EXC_ERR | IBV_WC_RESP_TIMEOUT_ERR => WcStatus::RetryExcErr,
        IBV_WC_RNR_RETRY_EXC_ERR => WcStatus::RnrRetryExcErr,
        // EEC statuses (RD transport, unused), fatal, general, tag matching
        // and anything newer: the QP is unusable, locally.
        _ => WcStatus::LocQpOpErr,
    }
}

/// The completion opcode of a successful send-queue work request, from
/// what was posted (for flushed and failed completions the hardware
/// opcode is undefined, so the provider always uses this).
pub fn send_wc_opcode(op: &SendOp) -> WcOpcode {
    op.wc_opcode()
}

/// The opcode of a successful receive completion.
pub fn recv_wc_opcode(op: ibv_wc_opcode::Type) -> WcOpcode {
    if op == ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM {
        WcOpcode::RecvRdmaWithImm
    } else {
        WcOpcode::Recv
    }
}

/// `vendor_id` the kernel's soft-RoCE driver (rdma_rxe) reports: 0xFFFFFF,
/// the IBTA "no OUI" value (ibv_devinfo shows it for rxe0).
pub const RXE_VENDOR_ID: u32 = 0x00FF_FFFF;

/// Bit 2 of `wc_flags` as the kernel writes it (`IB_WC_WITH_INVALIDATE`
/// in include/rdma/ib_verbs.h). libibverbs gives that bit another
/// meaning (`IBV_WC_IP_CSUM_OK`) and uses bit 3 (`IBV_WC_WITH_INV`).
const KERNEL_WC_WITH_INVALIDATE: u32 = 1 << 2;

/// Whether a successful receive completion carries an invalidated rkey
/// (the peer used Send with Invalidate). Hardware providers translate
/// their CQEs into `IBV_WC_WITH_INV`. rxe does not: its responder
/// (drivers/infiniband/sw/rxe/rxe_resp.c, `do_complete`) fills the
/// user-space CQE with the kernel's flag values, and rdma-core's rxe
/// library copies CQEs verbatim, so the invalidation arrives as bit 2.
/// On rxe that bit means nothing else (it never reports checksum
/// offload), elsewhere it does, hence `kernel_flag_layout` (the device is
/// rxe) gates it. A kernel that one day writes `IBV_WC_WITH_INV` is
/// recognised either way.
pub fn recv_invalidated(wc_flags: u32, kernel_flag_layout: bool) -> bool {
    wc_flags & ibv_wc_flags::IBV_WC_WITH_INV.0 != 0
        || (kernel_flag_layout && wc_flags & KERNEL_WC_WITH_INVALIDATE != 0)
}

/// [`Access`] -> `ibv_access_flags` for `ibv_reg_mr`. `mw_bind` adds
/// `IBV_ACCESS_MW_BIND` (needed to bind type 2 windows to the region).
pub fn mr_access(access: Access, mw_bind: bool) -> u32 {
    let mut f = 0;
    if access.contains(Access::LOCAL_WRITE) {
        f |= ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
    }
    if access.contains(Access::REMOTE_WRITE) {
        f |= ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
    }
    if access.contains(Access::REMOTE_READ) {
        f |= ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
    }
    if mw_bind && access.contains(Access::REMOTE_WRITE) | access.contains(Access::REMOTE_READ) {
        f |= ibv_access_flags::IBV_ACCESS_MW_BIND.0;
    }
    f
}

/// The remote-access flags of a memory window bound over a region with
/// `access` (only the remote bits carry over).
pub fn mw_access(access: Access) -> u32 {
    let mut f = 0;
    if access.contains(Access::REMOTE_WRITE) {
        f |= ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
    }
    if access.contains(Access::REMOTE_READ) {
        f |= ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
    }
    f
}

/// A zeroed `ibv_send_wr`.
pub fn zeroed_send_wr() -> ibv_send_wr {
    // SAFETY: ibv_send_wr is a plain C struct of integers, raw pointers and
    // unions of those; all-zero is a valid value of each (null pointers,
    // zero lengths).
    unsafe { std::mem::zeroed() }
}

/// A zeroed `ibv_recv_wr`.
pub fn zeroed_recv_wr() -> ibv_recv_wr {
    ibv_recv_wr {
        wr_id: 0,
        next: std::ptr::null_mut(),
        sg_list: std::ptr::null_mut(),
        num_sge: 0,
    }
}

/// An empty SGE array.
pub const NO_SGES: [ibv_sge; MAX_SGE] = [ibv_sge {
    addr: 0,
    length: 0,
    lkey: 0,
}; MAX_SGE];

/// Checks a send work request against the queue pair's limits (the same
/// rules every provider applies): SGEs inside their buffers, no SGEs on a
/// local invalidate, inline only for Send/Write within `max_inline`.
///
/// # Errors
/// [`PostError::Invalid`].
pub fn check_send(wr: &SendWr, max_inline: u32) -> Result<(), PostError> {
    if wr.sgl.iter().any(|s| !s.in_bounds()) {
        return Err(PostError::Invalid);
    }
    match wr.op {
        op if op.is_key_op() && !wr.sgl.is_empty() => return Err(PostError::Invalid),
        op if (op.is_key_op() || matches!(op, SendOp::Read(_))) && wr.inline => {
            return Err(PostError::Invalid)
        }
        _ => {}
    }
    if wr.inline && wr.sgl.total_len() > u64::from(max_inline) {
        return Err(PostError::Invalid);
    }
    Ok(())
}

/// Fills `sges` from the work request's list and `out` with the rest of
/// the work request, one to one: opcode, `IBV_SEND_SIGNALED`,
/// `IBV_SEND_INLINE`, immediate data (big-endian on the wire, as verbs
/// wants it), the rkey to invalidate (host order), remote address and
/// rkey. `out.sg_list` points at `sges`, so `sges` must stay put until the
/// post. `hw_wr_id` is the provider's own id (it finds the slot holding
/// the buffers with it). Validate with [`check_send`] first.
pub fn fill_send_wr(
    wr: &SendWr,
    hw_wr_id: u64,
    sges: &mut [ibv_sge; MAX_SGE],
    out: &mut ibv_send_wr,
) {
    *out = zeroed_send_wr();
    let mut n = 0;
    for (dst, s) in sges.iter_mut().zip(wr.sgl.iter()) {
        *dst = ibv_sge {
            addr: s.addr(),
            length: s.len,
            lkey: s.buf.lkey(),
        };
        n += 1;
    }
    out.wr_id = hw_wr_id;
    out.next = std::ptr::null_mut();
    out.sg_list = if n == 0 {
        std::ptr::null_mut()
    } else {
        sges.as_mut_ptr()
    };
    out.num_sge = n;
    let mut flags = 0;
    if wr.signaled {
        flags |= ibv_send_flags::IBV_SEND_SIGNALED.0;
    }
    if wr.inline {
        flags |= ibv_send_flags::IBV_SEND_INLINE.0;
    }
    out.send_flags = flags;
    use ibv_wr_opcode::*;
    let (opcode, remote) = match wr.op {
        SendOp::Send => (IBV_WR_SEND, None),
        SendOp::SendWithImm(imm) => {
            out.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
            (IBV_WR_SEND_WITH_IMM, None)
        }
        SendOp::SendWithInv(rkey) => {
            out.imm_data_invalidated_rkey_union.invalidated_rkey = rkey;
            (IBV_WR_SEND_WITH_INV, None)
        }
        SendOp::Write(ra) => (IBV_WR_RDMA_WRITE, Some(ra)),
        SendOp::WriteWithImm(ra, imm) => {
            out.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
            (IBV_WR_RDMA_WRITE_WITH_IMM, Some(ra))
        }
        SendOp::Read(ra) => (IBV_WR_RDMA_READ, Some(ra)),
        SendOp::LocalInv(rkey) => {
            out.imm_data_invalidated_rkey_union.invalidated_rkey = rkey;
            (IBV_WR_LOCAL_INV, None)
        }
        // The window and region pointers come from the provider's tables
        // (`fill_bind`).
        SendOp::Bind(_) => (IBV_WR_BIND_MW, None),
    };
    out.opcode = opcode;
    if let Some(ra) = remote {
        out.wr.rdma = rdma_sys::rdma_t {
            remote_addr: ra.addr,
            rkey: ra.rkey,
        };
    }
}

/// The bind part of an `IBV_WR_BIND_MW` work request: window `mw`, region
/// `mr`, the consumer's rkey, range and remote rights. A bind our own
/// checks refused (`valid` false) goes to the HCA with length 0, which a
/// type 2 window must refuse (IBTA o10-37.2.40): it completes
/// `IBV_WC_MW_BIND_ERR` in send-queue order, as the HCA's own refusals do.
pub fn fill_bind(
    b: &BindWindow,
    mw: *mut ibv_mw,
    mr: *mut ibv_mr,
    valid: bool,
    out: &mut ibv_send_wr,
) {
    out.opcode = ibv_wr_opcode::IBV_WR_BIND_MW;
    out.bind_mw_tso_union.bind_mw = bind_mw_t {
        mw,
        rkey: b.rkey,
        bind_info: ibv_mw_bind_info {
            mr,
            addr: b.addr,
            length: if valid { b.len } else { 0 },
            mw_access_flags: mw_access(b.access),
        },
    };
}

/// Checks a receive work request: at least one SGE, all inside their
/// buffers.
///
/// # Errors
/// [`PostError::Invalid`].
pub fn check_recv(wr: &RecvWr) -> Result<(), PostError> {
    if wr.sgl.iter().any(|s| !s.in_bounds()) {
        return Err(PostError::Invalid);
    }
    Ok(())
}

/// Fills an `ibv_recv_wr` (and its SGEs) from a receive work request.
pub fn fill_recv_wr(
    wr: &RecvWr,
    hw_wr_id: u64,
    sges: &mut [ibv_sge; MAX_SGE],
    out: &mut ibv_recv_wr,
) {
    let mut n = 0;
    for (dst, s) in sges.iter_mut().zip(wr.sgl.iter()) {
        *dst = ibv_sge {
            addr: s.addr(),
            length: s.len,
            lkey: s.buf.lkey(),
        };
        n += 1;
    }
    *out = ibv_recv_wr {
        wr_id: hw_wr_id,
        next: std::ptr::null_mut(),
        sg_list: if n == 0 {
            std::ptr::null_mut()
        } else {
            sges.as_mut_ptr()
        },
        num_sge: n,
    };
}

/// Most private data in an rdma_cm connect request on IB/RoCE (the IB CM
/// REQ carries 92 bytes; rdma_cm's own header takes 36).
pub const MAX_CONNECT_PRIVATE_DATA: usize = 56;
/// Most private data in an accept (IB CM REP: 196 bytes).
pub const MAX_ACCEPT_PRIVATE_DATA: usize = 196;
/// Most private data in a reject (IB CM REJ: 148 bytes).
pub const MAX_REJECT_PRIVATE_DATA: usize = 148;

/// Which message the connection parameters go into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmMessage {
    /// `rdma_connect` (the REQ).
    Connect,
    /// `rdma_accept` (the REP).
    Accept,
}

/// `rdma_conn_param` borrowing its private data: the RFC 8797 private data
/// (or any other) rides here, byte for byte, in the CM REQ or REP.
pub struct ConnParam<'a> {
    /// The raw parameters (`private_data` points into the borrowed slice).
    pub raw: rdma_conn_param,
    _data: std::marker::PhantomData<&'a [u8]>,
}

impl std::fmt::Debug for ConnParam<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnParam")
            .field("private_data_len", &self.raw.private_data_len)
            .field("responder_resources", &self.raw.responder_resources)
            .field("initiator_depth", &self.raw.initiator_depth)
            .field("retry_count", &self.raw.retry_count)
            .field("rnr_retry_count", &self.raw.rnr_retry_count)
            .field("qp_num", &self.raw.qp_num)
            .finish()
    }
}

/// Builds the connection parameters for `rdma_connect` / `rdma_accept`:
/// our QP number (the QP is ours, not rdma_cm's), the private data, the
/// RDMA Read depths, and the retry counts (7 transport retries; the RNR
/// retry count the peer uses when sending to us, which rdma_cm carries in
/// the CM message: we ask for the same budget we use, `caps.rnr_retry`).
///
/// # Errors
/// [`VerbsError::Limit`] when the private data does not fit the message.
pub fn conn_param<'a>(
    msg: CmMessage,
    private_data: &'a [u8],
    qp_num: u32,
    caps: &QpCaps,
    rd_atomic: u8,
) -> Result<ConnParam<'a>, VerbsError> {
    let max = match msg {
        CmMessage::Connect => MAX_CONNECT_PRIVATE_DATA,
        CmMessage::Accept => MAX_ACCEPT_PRIVATE_DATA,
    };
    if private_data.len() > max {
        return Err(VerbsError::Limit(match msg {
            CmMessage::Connect => "connect private data over 56 bytes (IB CM REQ limit)",
            CmMessage::Accept => "accept private data over 196 bytes (IB CM REP limit)",
        }));
    }
    Ok(ConnParam {
        raw: rdma_conn_param {
            private_data: if private_data.is_empty() {
                std::ptr::null()
            } else {
                private_data.as_ptr().cast()
            },
            private_data_len: private_data.len() as u8,
            responder_resources: rd_atomic,
            initiator_depth: rd_atomic,
            flow_control: 1,
            retry_count: 7,
            rnr_retry_count: caps.rnr_retry.min(7),
            srq: 0,
            qp_num,
        },
        _data: std::marker::PhantomData,
    })
}

/// Copies private data out of a CM event's parameters (bounded by the
/// largest CM message, whatever length the event claims).
///
/// # Safety
/// `ptr` must be null or point at `len` readable bytes.
pub unsafe fn copy_private_data(ptr: *const std::ffi::c_void, len: u8) -> Vec<u8> {
    if ptr.is_null() || len == 0 {
        return Vec::new();
    }
    let len = usize::from(len).min(MAX_ACCEPT_PRIVATE_DATA);
    // SAFETY: the caller guarantees `len` readable bytes at `ptr`; we read
    // no more than that.
    unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) }.to_vec()
}

/// IB's 5-bit minimum RNR NAK timer code for at least `d` (IBA table 45);
/// longer than the largest (491.52 ms) gives that largest, code 31; code 0
/// (655.36 ms) is never chosen.
pub fn rnr_timer_code(d: Duration) -> u8 {
    // Microseconds of codes 1..=31.
    const TABLE_US: [u32; 31] = [
        10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560, 3840, 5120,
        7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680,
        491520,
    ];
    let us = d.as_micros();
    for (i, &t) in TABLE_US.iter().enumerate() {
        if u128::from(t) >= us {
            return i as u8 + 1;
        }
    }
    31
}

/// `ibv_inc_rkey`: a memory window's next rkey changes only the low 8
/// bits (the consumer-owned key byte).
pub fn next_rkey(rkey: u32) -> u32 {
    (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff)
}

/// Hardware `wr_id` of provider-internal work requests (window binds and
/// drain markers) has this bit; user work requests carry a ring sequence.
pub const INTERNAL_WR: u64 = 1 << 63;
