//! `roce`: RoCEv2 reliable connections over UDP in userspace,
//! wire-compatible with Linux rdma_rxe (see docs/ROCE.md).
//!
//! * A **device** is one UDP socket bound at a local IPv4 address and the
//!   RoCEv2 port (4791 unless configured), shared by every context of the
//!   process that uses that address (as an HCA is shared). It multiplexes
//!   the RC queue pairs (by destination QPN) and QP1, where IB CM MADs
//!   (REQ/REP/RTU/REJ/DREQ/DREP/MRA) set connections up the way rdma_cm
//!   does over RoCEv2.
//! * Progress is driven by polling, like `shm`: [`CompletionQueue::poll`]
//!   (and posts, `Listener::accept`, `connect`) receive a `recvmmsg`
//!   batch, run every QP's transport (`rc`), and send what it produced with
//!   one `sendmmsg`. No thread per connection, no allocation per packet.
//! * URL: `roce://IPv4:PORT[?opt=value&...]`; PORT is the rdma_cm service
//!   (TCP port space), carried in the REQ's service ID. Options (also from
//!   the environment, URL wins): `udp_port` (`RPCRDMA_ROCE_UDP_PORT`,
//!   default 4791: every peer must use the same), `local`
//!   (`RPCRDMA_ROCE_LOCAL_IP`: source address for `connect`), `mtu`
//!   (256..4096, default 1024), `ack_timeout_ms` (default 64), `retry`
//!   (transport retries, default 7), `verify_icrc` (`RPCRDMA_ROCE_VERIFY_ICRC`:
//!   check inbound ICRCs assuming the sender used a plain UDP socket, i.e.
//!   IP ID 0 and DF, as this provider does), `faults` (`RPCRDMA_ROCE_FAULTS`,
//!   test only: `drop,dup,reorder[,seed]` per mille on data-path packets).
//!
//! # Hostile peers
//! Every packet is parsed by the total decoders of `wire::roce` /
//! `wire::ibcm`; a REQ only if its path GID is its UDP source address; a
//! data packet only from the QP's peer address and UDP source port
//! (pinned by the first packet) and only in PSN order; QPNs are random; remote addresses are checked against the rkeys
//! exposed on that connection (access, bounds) before any copy. A peer
//! that breaks the protocol gets a NAK and its connection moves to error;
//! nothing else is affected.
use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use self::io::{Faults, Tx};
use self::pd::PdInner;
pub use self::pd::{RoceMr, RocePd};
use self::rc::{ConnRef, PeerPath, RcQp, Timers, MAX_RD};
use self::ready::{Announce, ReadyList};
use super::*;
use crate::mem::Arena;
use crate::wire::ibcm::{
    self, CmMad, CmMessage, CmPath, RdmaCmHeader, Rep, Req, RDMA_CM_HEADER_LEN,
};
use crate::wire::roce::Psn;

pub use self::cm::MAX_REQ_PRIVATE_DATA;
use self::cm::{
    ca_guid, cm_path, emit_mad, send_mad, send_rej, ConnRec, ConnState, PendingReq, CM_RETRY,
    REP_RETRIES,
};
use self::config::parse_url;
pub use self::config::{RoceConfig, ENV_FAULTS, ENV_LOCAL_IP, ENV_UDP_PORT, ENV_VERIFY_ICRC};
pub use self::cq::RoceCq;
use self::cq::{CqInner, CQ_IDS};
use self::device::{mark_ticking, Device, Engine};
pub use self::io::FaultPolicy;
use self::random::{random_u32, random_u64};

mod cm;
mod config;
mod cq;
mod device;
mod io;
mod pd;
mod random;
mod rc;
mod ready;
#[cfg(test)]
mod tests;

/// The roce provider (marker type).
#[derive(Debug, Clone, Copy)]
pub struct Roce;

impl Provider for Roce {
    type Context = RoceContext;
    type Pd = RocePd;
    type Mr = RoceMr;
    type Cq = RoceCq;
    type PreparedQp = RocePreparedQp;
    type Qp = RoceQp;
    type Listener = RoceListener;
    type Incoming = RoceIncoming;
    const SCHEME: &'static str = "roce";

    fn open(url: &str) -> Result<RoceContext, VerbsError> {
        let (_, cfg) = parse_url(url, RoceConfig::from_env())?;
        Ok(RoceContext {
            cfg: Mutex::new(cfg),
        })
    }
}

/// An opened roce context (devices are bound lazily by `listen` and
/// `connect`).
#[derive(Debug)]
pub struct RoceContext {
    cfg: Mutex<RoceConfig>,
}

impl RoceContext {
    /// The configuration queue pairs created from now on use.
    pub fn config(&self) -> RoceConfig {
        *lock(&self.cfg)
    }

    /// Sets the test-only fault policy for queue pairs created from now on.
    pub fn set_fault_policy(&self, f: FaultPolicy) {
        lock(&self.cfg).faults = f;
    }
}

impl Context<Roce> for RoceContext {
    fn alloc_pd(&self) -> Result<RocePd, VerbsError> {
        Ok(RocePd {
            inner: Arc::new(PdInner {
                mrs: Arc::default(),
            }),
            cfg: self.config(),
        })
    }

    fn create_cq(&self, depth: usize) -> Result<RoceCq, VerbsError> {
        Ok(RoceCq {
            inner: Arc::new(CqInner {
                id: CQ_IDS.fetch_add(1, Ordering::Relaxed),
                depth,
                devices: Mutex::new(Vec::new()),
                ready: Arc::new(ReadyList::default()),
                orphans: Mutex::new(VecDeque::new()),
            }),
        })
    }

    fn listen(&self, url: &str) -> Result<RoceListener, VerbsError> {
        let (addr, cfg) = parse_url(url, self.config())?;
        let dev = Device::at(SocketAddrV4::new(*addr.ip(), cfg.udp_port), &cfg)?;
        {
            let mut eng = lock(&dev.eng);
            if eng.cm.listeners.contains_key(&addr.port()) {
                return Err(VerbsError::Os {
                    what: "listen",
                    source: nix::Error::EADDRINUSE,
                });
            }
            eng.cm.listeners.insert(addr.port(), VecDeque::new());
        }
        Ok(RoceListener {
            dev,
            port: addr.port(),
        })
    }
}

// ---------------------------------------------------------------------------
// Protection domains and memory regions

impl ProtectionDomain<Roce> for RocePd {
    fn register(
        &self,
        arena: &Arc<Arena>,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<RoceMr, VerbsError> {
        self.inner.mrs.register(arena, offset, len, access)
    }

    fn create_qp(
        &self,
        send_cq: &RoceCq,
        recv_cq: &RoceCq,
        caps: QpCaps,
    ) -> Result<RocePreparedQp, VerbsError> {
        if caps.max_send_wr == 0
            || caps.max_recv_wr == 0
            || caps.max_send_wr > 16384
            || caps.max_recv_wr > 16384
        {
            return Err(VerbsError::Limit("queue depth must be 1..=16384"));
        }
        let timers = Timers {
            ack_timeout: self.cfg.ack_timeout,
            retry_count: self.cfg.retry_count,
        };
        Ok(RocePreparedQp {
            qp: Some(RcQp::new(
                caps,
                self.inner.clone(),
                send_cq.inner.id,
                recv_cq.inner.id,
                self.cfg.mtu,
                timers,
                match self.cfg.initial_psn {
                    Some(psn) => psn,
                    None => Psn::from_masked(random_u32()?),
                },
            )),
            cfg: self.cfg,
            send_cq: send_cq.inner.clone(),
            recv_cq: recv_cq.inner.clone(),
        })
    }
}

// ---------------------------------------------------------------------------
// Queue pairs

/// A created queue pair that is not connected yet; receives may be posted.
pub struct RocePreparedQp {
    qp: Option<RcQp>,
    cfg: RoceConfig,
    send_cq: Arc<CqInner>,
    recv_cq: Arc<CqInner>,
}

impl std::fmt::Debug for RocePreparedQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RocePreparedQp").finish_non_exhaustive()
    }
}

impl Drop for RocePreparedQp {
    fn drop(&mut self) {
        if let Some(mut qp) = self.qp.take() {
            qp.enter_error(None, false);
            lock(&self.recv_cq.orphans).extend(qp.recv_done.drain(..));
            lock(&self.send_cq.orphans).extend(qp.send_done.drain(..));
        }
    }
}

impl RocePreparedQp {
    /// Moves the QP into `dev`'s engine under a fresh QPN and attaches it
    /// to its CQs.
    ///
    /// # Errors
    /// `VerbsError::Os` if no random QPN can be drawn (nothing installed).
    fn install(&mut self, eng: &mut Engine, dev: &Arc<Device>) -> Result<u32, VerbsError> {
        let qpn = eng.alloc_qpn()?;
        let mut qp = self.qp.take().expect("prepared QP installed once");
        qp.qpn = qpn;
        qp.faults = Faults::new(self.cfg.faults, qpn);
        qp.announce = Some(Announce {
            send: self.send_cq.ready.clone(),
            recv: self.recv_cq.ready.clone(),
            dev: Arc::as_ptr(dev) as usize,
        });
        eng.qps.insert(qpn, qp);
        // Room to tick every queue pair (a full tick marks them all), set
        // aside here, at connection setup, not on the data path.
        let qps = eng.qps.len();
        eng.active.reserve(qps.saturating_sub(eng.active.len()));
        Ok(qpn)
    }

    /// Lists an installed QP's device with its CQs. Called without the
    /// engine lock: `poll` takes a CQ's device list first, then engines.
    fn attach(&self, dev: &Arc<Device>) {
        self.send_cq.attach(dev);
        if !Arc::ptr_eq(&self.send_cq, &self.recv_cq) {
            self.recv_cq.attach(dev);
        }
    }
}

/// A connected RC queue pair.
#[derive(Debug)]
pub struct RoceQp {
    dev: Arc<Device>,
    qpn: u32,
    pd: Arc<PdInner>,
    /// Where the flushed completions of a dropped QP go (see `Drop`).
    send_cq: Arc<CqInner>,
    recv_cq: Arc<CqInner>,
}

impl RoceQp {
    /// Packets the test fault hook dropped, duplicated and reordered on
    /// this QP so far.
    pub fn fault_counts(&self) -> [u64; 3] {
        lock(&self.dev.eng)
            .qps
            .get(&self.qpn)
            .map_or([0; 3], |q| q.faults.counts)
    }

    /// The local address of the device this QP runs on.
    pub fn local_addr(&self) -> SocketAddrV4 {
        self.dev.local
    }

    /// Inbound packets the device dropped for a bad ICRC (with
    /// `verify_icrc`).
    pub fn bad_icrc_count(&self) -> u64 {
        lock(&self.dev.eng).bad_icrc
    }

    /// Packets the device dropped as spoofed (see the module docs).
    pub fn spoofed_count(&self) -> u64 {
        lock(&self.dev.eng).spoofed
    }

    /// Packets the device could not send because they exceeded the path
    /// MTU of the route (EMSGSIZE).
    pub fn oversized_count(&self) -> u64 {
        lock(&self.dev.eng).tx.oversized
    }

    fn with<R>(&self, f: impl FnOnce(&mut RcQp, &mut Tx) -> R) -> Option<R> {
        let mut eng = lock(&self.dev.eng);
        let Engine {
            qps, tx, active, ..
        } = &mut *eng;
        let qp = qps.get_mut(&self.qpn)?;
        mark_ticking(active, qp);
        let r = f(qp, tx);
        let now = Instant::now();
        eng.progress(now);
        self.dev.mark_progress(now);
        Some(r)
    }
}

impl Drop for RoceQp {
    /// Disconnects (DREQ), then removes the QP from its device at once:
    /// nothing may rely on a CQ being polled again (the owner usually
    /// drops its CQ right after the QP). The flushed work requests, with
    /// their buffers, become orphan completions of their CQs, so they are
    /// returned when the CQ is polled or dropped.
    fn drop(&mut self) {
        self.disconnect();
        let removed = {
            let mut eng = lock(&self.dev.eng);
            let qp = eng.qps.remove(&self.qpn);
            if let Some(c) = qp.as_ref().and_then(|q| q.conn) {
                // A DREQ still being retried keeps its record (forgotten
                // after DREQ_RETRIES); anything else goes now.
                let keep = eng
                    .cm
                    .conns
                    .get(&c.local_comm_id)
                    .is_some_and(|r| matches!(r.state, ConnState::DreqSent { .. }));
                if !keep {
                    eng.cm.conns.remove(&c.local_comm_id);
                }
            }
            qp
        };
        if let Some(mut qp) = removed {
            qp.enter_error(None, false);
            lock(&self.recv_cq.orphans).extend(qp.recv_done.drain(..));
            lock(&self.send_cq.orphans).extend(qp.send_done.drain(..));
        }
        // Not under the engine lock: `poll` takes devices, then engines.
        self.send_cq.detach(&self.dev);
        if !Arc::ptr_eq(&self.send_cq, &self.recv_cq) {
            self.recv_cq.detach(&self.dev);
        }
    }
}

impl PreparedQp<Roce> for RocePreparedQp {
    fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostFailed<RecvWr>> {
        match self.qp.as_mut() {
            Some(q) => q.post_recv(wr),
            None => Err(PostFailed {
                error: PostError::Invalid,
                wr,
            }),
        }
    }

    fn connect(
        mut self,
        url: &str,
        private_data: &[u8],
        timeout: Duration,
    ) -> Result<(RoceQp, Vec<u8>), VerbsError> {
        let (target, cfg) = parse_url(url, self.cfg)?;
        if private_data.len() > MAX_REQ_PRIVATE_DATA {
            return Err(VerbsError::Limit("REQ private data is at most 56 bytes"));
        }
        let dev = Device::for_connect(*target.ip(), &cfg)?;
        let local_ip = *dev.local.ip();
        let deadline = Instant::now() + timeout;
        let local_comm_id = loop {
            let c = random_u32()?;
            if c != 0 {
                break c;
            }
        };
        let tid = random_u64()?;
        let src_port = 0x8000 | (random_u32()? as u16 & 0x7FFF);
        let pd = self
            .qp
            .as_ref()
            .map(|q| q.pd.clone())
            .expect("not installed");
        let (qpn, mad) = {
            let mut eng = lock(&dev.eng);
            let qpn = self.install(&mut eng, &dev)?;
            let qp = eng.qps.get_mut(&qpn).expect("just installed");
            // Options in the connect URL apply to this connection.
            qp.configure(
                cfg.mtu,
                Timers {
                    ack_timeout: cfg.ack_timeout,
                    retry_count: cfg.retry_count,
                },
            );
            qp.faults = Faults::new(cfg.faults, qpn);
            let mut private = [0u8; ibcm::private_len::REQ];
            RdmaCmHeader {
                src_port,
                src: IpAddr::V4(local_ip),
                dst: IpAddr::V4(*target.ip()),
            }
            .emit(&mut private)
            .map_err(|_| VerbsError::Protocol("rdma_cm header"))?;
            private[RDMA_CM_HEADER_LEN..RDMA_CM_HEADER_LEN + private_data.len()]
                .copy_from_slice(private_data);
            let req = Req {
                local_comm_id,
                service_id: ibcm::tcp_service_id(target.port()),
                local_ca_guid: ca_guid(local_ip),
                local_qkey: 0,
                local_qpn: qpn,
                responder_resources: MAX_RD as u8,
                local_eecn: 0,
                initiator_depth: MAX_RD as u8,
                remote_eecn: 0,
                remote_cm_response_timeout: 20,
                transport_type: 0,
                end_to_end_flow_control: false,
                starting_psn: qp.initial_psn(),
                local_cm_response_timeout: 20,
                retry_count: cfg.retry_count.min(7),
                pkey: 0xFFFF,
                path_mtu: qp.mtu,
                rdc_exists: false,
                rnr_retry_count: qp.caps.rnr_retry.min(7),
                max_cm_retries: 15,
                srq: false,
                extended_transport: 0,
                primary_path: cm_path(local_ip, *target.ip(), cfg.ack_timeout_code()),
                alternate_path: CmPath::default(),
                private_data: &private,
            };
            let mad = emit_mad(&CmMad::new(tid, CmMessage::Req(req)))
                .ok_or(VerbsError::Protocol("REQ encoding"))?;
            eng.cm.conns.insert(
                local_comm_id,
                ConnRec {
                    local_comm_id,
                    remote_comm_id: 0,
                    peer_ip: *target.ip(),
                    qpn,
                    remote_qpn: 0,
                    active: true,
                    state: ConnState::ReqSent,
                    mad: Box::new(mad),
                    peer_private: Vec::new(),
                    quiet_until: None,
                    claimed: false,
                },
            );
            let Engine { tx, gsi_psn, .. } = &mut *eng;
            send_mad(tx, gsi_psn, *target.ip(), cfg.udp_port, &mad);
            tx.flush();
            (qpn, mad)
        };
        self.attach(&dev);
        let qp = RoceQp {
            dev: dev.clone(),
            qpn,
            pd,
            send_cq: self.send_cq.clone(),
            recv_cq: self.recv_cq.clone(),
        };
        let mut resend_at = Instant::now() + CM_RETRY;
        let mut backoff = 0u32;
        loop {
            let now = Instant::now();
            {
                let mut eng = lock(&dev.eng);
                eng.progress(now);
                dev.mark_progress(now);
                let Some(rec) = eng.cm.conns.get_mut(&local_comm_id) else {
                    // Gone: a DREQ for it crossed, or it was dropped.
                    return Err(VerbsError::NotConnected);
                };
                match &mut rec.state {
                    ConnState::Established => {
                        let pd = std::mem::take(&mut rec.peer_private);
                        rec.claimed = true;
                        drop(eng);
                        return Ok((qp, pd));
                    }
                    // Established, then already disconnected by the peer:
                    // the QP is in the error state, as rdma_cm reports
                    // ESTABLISHED then DISCONNECTED.
                    ConnState::Closed => {
                        let pd = std::mem::take(&mut rec.peer_private);
                        eng.cm.conns.remove(&local_comm_id);
                        drop(eng);
                        return Ok((qp, pd));
                    }
                    ConnState::Rejected(pd) => {
                        let pd = std::mem::take(pd);
                        eng.cm.conns.remove(&local_comm_id);
                        if let Some(q) = eng.qps.get_mut(&qpn) {
                            q.enter_error(None, false);
                        }
                        drop(eng);
                        return Err(VerbsError::Rejected { private_data: pd });
                    }
                    _ => {}
                }
                if now >= resend_at && rec.quiet_until.is_none_or(|t| now >= t) {
                    rec.quiet_until = None;
                    resend_at = now + CM_RETRY;
                    let Engine { tx, gsi_psn, .. } = &mut *eng;
                    send_mad(tx, gsi_psn, *target.ip(), cfg.udp_port, &mad);
                    tx.flush();
                }
                if now >= deadline {
                    eng.cm.conns.remove(&local_comm_id);
                    if let Some(q) = eng.qps.get_mut(&qpn) {
                        q.enter_error(None, false);
                    }
                    let Engine { tx, gsi_psn, .. } = &mut *eng;
                    // Tell the passive side we gave up (REJ "timeout" is
                    // reason 1..; consumer-defined keeps it simple).
                    send_rej(
                        tx,
                        gsi_psn,
                        *target.ip(),
                        tid,
                        local_comm_id,
                        0,
                        ibcm::rej_reason::CONSUMER_DEFINED,
                        &[],
                    );
                    tx.flush();
                    return Err(VerbsError::Timeout);
                }
            }
            backoff += 1;
            idle(backoff);
        }
    }
}

/// Spin, then yield, then sleep briefly (control-path waits only).
fn idle(n: u32) {
    if n < 64 {
        std::hint::spin_loop();
    } else if n < 128 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(100));
    }
}

impl QueuePair<Roce> for RoceQp {
    fn qp_num(&self) -> u32 {
        self.qpn
    }

    fn state(&self) -> QpState {
        lock(&self.dev.eng)
            .qps
            .get(&self.qpn)
            .map_or(QpState::Error, |q| q.state)
    }

    fn post_send(&mut self, wr: SendWr) -> Result<(), PostFailed<SendWr>> {
        let mut slot = Some(wr);
        let r = self.with(|qp, _| qp.post_send(slot.take().expect("once")));
        match r {
            Some(r) => r,
            None => Err(PostFailed {
                error: PostError::Invalid,
                wr: slot.take().expect("not consumed"),
            }),
        }
    }

    fn post_send_list<I: Iterator<Item = SendWr>>(
        &mut self,
        wrs: &mut I,
    ) -> Result<usize, PostFailed<SendWr>> {
        let mut eng = lock(&self.dev.eng);
        let mut n = 0;
        let mut res = Ok(());
        let Engine { qps, active, .. } = &mut *eng;
        if let Some(qp) = qps.get_mut(&self.qpn) {
            mark_ticking(active, qp);
            for wr in wrs.by_ref() {
                if let Err(e) = qp.post_send(wr) {
                    res = Err(e);
                    break;
                }
                n += 1;
            }
        } else if let Some(wr) = wrs.next() {
            res = Err(PostFailed {
                error: PostError::Invalid,
                wr,
            });
        }
        let now = Instant::now();
        eng.progress(now);
        self.dev.mark_progress(now);
        res.map(|()| n)
    }

    fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostFailed<RecvWr>> {
        let mut eng = lock(&self.dev.eng);
        match eng.qps.get_mut(&self.qpn) {
            Some(qp) => qp.post_recv(wr),
            None => Err(PostFailed {
                error: PostError::Invalid,
                wr,
            }),
        }
    }

    fn expose(&mut self, mr: &RoceMr) -> Result<RemoteKey, VerbsError> {
        if !mr.belongs_to(&self.pd.mrs) {
            return Err(VerbsError::InvalidRegistration(
                "memory region of another PD",
            ));
        }
        if !(mr.info.access.contains(Access::REMOTE_READ)
            || mr.info.access.contains(Access::REMOTE_WRITE))
        {
            return Err(VerbsError::InvalidRegistration(
                "memory region has no remote access",
            ));
        }
        let mut eng = lock(&self.dev.eng);
        let qp = eng.qps.get_mut(&self.qpn).ok_or(VerbsError::NotConnected)?;
        qp.expose(mr.info.addr, mr.info.len, mr.info.access, &mr.info.arena)
    }

    /// A slot of this connection's key table (256, shared with `expose`):
    /// the slot is the rkey's low byte, the upper 24 bits the consumer's.
    fn alloc_window(&mut self) -> Result<Window, VerbsError> {
        let mut eng = lock(&self.dev.eng);
        let qp = eng.qps.get_mut(&self.qpn).ok_or(VerbsError::NotConnected)?;
        qp.alloc_window()
    }

    fn disconnect(&mut self) {
        let mut eng = lock(&self.dev.eng);
        let Engine { qps, active, .. } = &mut *eng;
        if let Some(qp) = qps.get_mut(&self.qpn) {
            mark_ticking(active, qp);
            qp.enter_error(None, true);
        }
        let now = Instant::now();
        eng.cm_timers(now);
        eng.tx.flush();
    }
}

// ---------------------------------------------------------------------------
// Listener and incoming requests

/// A service port listening on a device.
#[derive(Debug)]
pub struct RoceListener {
    dev: Arc<Device>,
    port: u16,
}

impl RoceListener {
    /// The local RoCE address (IP and UDP port) of the device.
    pub fn local_addr(&self) -> SocketAddrV4 {
        self.dev.local
    }
}

impl Drop for RoceListener {
    fn drop(&mut self) {
        let mut eng = lock(&self.dev.eng);
        if let Some(q) = eng.cm.listeners.remove(&self.port) {
            let Engine { tx, gsi_psn, .. } = &mut *eng;
            for p in q {
                send_rej(
                    tx,
                    gsi_psn,
                    p.peer_ip,
                    p.tid,
                    0,
                    p.remote_comm_id,
                    ibcm::rej_reason::INVALID_SERVICE_ID,
                    &[],
                );
            }
            tx.flush();
        }
    }
}

impl Listener<Roce> for RoceListener {
    fn accept(&self, timeout: Duration) -> Result<RoceIncoming, VerbsError> {
        let deadline = Instant::now() + timeout;
        let mut n = 0;
        loop {
            let now = Instant::now();
            {
                let mut eng = lock(&self.dev.eng);
                eng.progress(now);
                self.dev.mark_progress(now);
                if let Some(req) = eng
                    .cm
                    .listeners
                    .get_mut(&self.port)
                    .and_then(VecDeque::pop_front)
                {
                    eng.cm.held.push((req.peer_ip, req.remote_comm_id));
                    return Ok(RoceIncoming {
                        dev: self.dev.clone(),
                        req: Some(req),
                    });
                }
            }
            if now >= deadline {
                return Err(VerbsError::Timeout);
            }
            n += 1;
            idle(n);
        }
    }
}

/// A connection request waiting for accept or reject.
#[derive(Debug)]
pub struct RoceIncoming {
    dev: Arc<Device>,
    req: Option<PendingReq>,
}

impl RoceIncoming {
    /// The requester's IPv4 address.
    pub fn peer_ip(&self) -> Option<Ipv4Addr> {
        self.req.as_ref().map(|r| r.peer_ip)
    }
}

impl Drop for RoceIncoming {
    fn drop(&mut self) {
        // Neither accepted nor rejected: refuse, so the peer stops waiting.
        if let Some(r) = self.req.take() {
            let mut eng = lock(&self.dev.eng);
            eng.cm.release_held(r.peer_ip, r.remote_comm_id);
            let Engine { tx, gsi_psn, .. } = &mut *eng;
            send_rej(
                tx,
                gsi_psn,
                r.peer_ip,
                r.tid,
                0,
                r.remote_comm_id,
                ibcm::rej_reason::CONSUMER_DEFINED,
                &[],
            );
            tx.flush();
        }
    }
}

impl Incoming<Roce> for RoceIncoming {
    fn private_data(&self) -> &[u8] {
        self.req.as_ref().map_or(&[], |r| &r.private)
    }

    fn accept(mut self, mut qp: RocePreparedQp, private_data: &[u8]) -> Result<RoceQp, VerbsError> {
        if private_data.len() > ibcm::private_len::REP {
            return Err(VerbsError::Limit("REP private data is at most 196 bytes"));
        }
        let pd = qp.qp.as_ref().map(|q| q.pd.clone()).expect("not installed");
        let dev = self.dev.clone();
        let mut eng = lock(&dev.eng);
        let port = eng.local.port();
        let local_ip = *eng.local.ip();
        // Fallible steps first: on error the request is still ours to
        // refuse (Drop sends a REJ).
        let local_comm_id = loop {
            let c = random_u32()?;
            if c != 0 && !eng.cm.conns.contains_key(&c) {
                break c;
            }
        };
        let qpn = qp.install(&mut eng, &dev)?;
        let req = self.req.take().expect("not yet answered");
        eng.cm.release_held(req.peer_ip, req.remote_comm_id);
        let rc = eng.qps.get_mut(&qpn).expect("just installed");
        rc.awaiting_rtu = true;
        let my_psn = rc.initial_psn();
        // We send from the PSN the REQ announced (the first the requester
        // expects); the requester sends from the one in our REP.
        rc.bind(
            PeerPath {
                addr: SocketAddrV4::new(req.peer_ip, port),
                qpn: req.remote_qpn,
            },
            req.psn,
            ConnRef { local_comm_id },
            // The REQ's path MTU is the requester's; ours may be smaller
            // (an oversized DF packet is refused with EMSGSIZE). The REP
            // has no MTU field: each side sends within its own limit.
            req.mtu.min(rc.mtu),
            req.responder_resources,
        );
        let rnr = rc.caps.rnr_retry.min(7);
        let rep = Rep {
            local_comm_id,
            remote_comm_id: req.remote_comm_id,
            local_qkey: 0,
            local_qpn: qpn,
            local_eecn: 0,
            starting_psn: my_psn,
            responder_resources: MAX_RD as u8,
            // >= 1, or an rxe initiator could never RDMA Read from us.
            initiator_depth: MAX_RD as u8,
            target_ack_delay: 15,
            failover_accepted: 0,
            end_to_end_flow_control: false,
            rnr_retry_count: rnr,
            srq: false,
            local_ca_guid: ca_guid(local_ip),
            private_data,
        };
        let mad = emit_mad(&CmMad::new(req.tid, CmMessage::Rep(rep)))
            .ok_or(VerbsError::Protocol("REP encoding"))?;
        eng.cm.conns.insert(
            local_comm_id,
            ConnRec {
                local_comm_id,
                remote_comm_id: req.remote_comm_id,
                peer_ip: req.peer_ip,
                qpn,
                remote_qpn: req.remote_qpn,
                active: false,
                state: ConnState::RepSent {
                    next: Instant::now() + CM_RETRY,
                    left: REP_RETRIES,
                },
                mad: Box::new(mad),
                peer_private: Vec::new(),
                quiet_until: None,
                claimed: true,
            },
        );
        let Engine { tx, gsi_psn, .. } = &mut *eng;
        send_mad(tx, gsi_psn, req.peer_ip, port, &mad);
        tx.flush();
        drop(eng);
        qp.attach(&dev);
        Ok(RoceQp {
            dev,
            qpn,
            pd,
            send_cq: qp.send_cq.clone(),
            recv_cq: qp.recv_cq.clone(),
        })
    }

    fn reject(mut self, private_data: &[u8]) -> Result<(), VerbsError> {
        if private_data.len() > ibcm::private_len::REJ {
            return Err(VerbsError::Limit("REJ private data is at most 148 bytes"));
        }
        let r = self.req.take().expect("not yet answered");
        let mut eng = lock(&self.dev.eng);
        eng.cm.release_held(r.peer_ip, r.remote_comm_id);
        let Engine { tx, gsi_psn, .. } = &mut *eng;
        send_rej(
            tx,
            gsi_psn,
            r.peer_ip,
            r.tid,
            0,
            r.remote_comm_id,
            ibcm::rej_reason::CONSUMER_DEFINED,
            private_data,
        );
        tx.flush();
        Ok(())
    }
}
