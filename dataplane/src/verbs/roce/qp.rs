//! Queue pairs: a prepared queue pair (receives may be posted) and its
//! `connect`, the active side of connection setup; a connected queue
//! pair's posts, keys and teardown.
use std::net::{IpAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::cm::{
    ca_guid, cm_path, emit_mad, send_mad, send_rej, ConnRec, ConnState, CM_RETRY,
    MAX_REQ_PRIVATE_DATA,
};
use super::config::{parse_url, RoceConfig};
use super::cq::CqInner;
use super::device::{mark_ticking, Device, Engine};
use super::io::{Faults, Tx};
use super::pd::{PdInner, RoceMr};
use super::random::{random_u32, random_u64};
use super::rc::{RcQp, Timers, MAX_RD};
use super::ready::Announce;
use super::Roce;
use crate::verbs::{
    lock, PostError, PostFailed, PreparedQp, QpState, QueuePair, RecvWr, RemoteKey, SendWr,
    VerbsError, Window,
};
use crate::wire::ibcm::{self, CmMad, CmMessage, CmPath, RdmaCmHeader, Req, RDMA_CM_HEADER_LEN};

/// A created queue pair that is not connected yet; receives may be posted.
pub struct RocePreparedQp {
    pub(super) qp: Option<RcQp>,
    pub(super) cfg: RoceConfig,
    pub(super) send_cq: Arc<CqInner>,
    pub(super) recv_cq: Arc<CqInner>,
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
    pub(super) fn install(
        &mut self,
        eng: &mut Engine,
        dev: &Arc<Device>,
    ) -> Result<u32, VerbsError> {
        let qpn = eng.alloc_qpn()?;
        let mut qp = self.qp.take().expect("prepared QP installed once");
        qp.qpn = qpn;
        qp.faults = Faults::new(self.cfg.faults, qpn);
        qp.announce = Some(Announce {
            send: self.send_cq.ready.clone(),
            recv: self.recv_cq.ready.clone(),
            dev: dev.id,
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
    pub(super) fn attach(&self, dev: &Arc<Device>) {
        self.send_cq.attach(dev);
        if !Arc::ptr_eq(&self.send_cq, &self.recv_cq) {
            self.recv_cq.attach(dev);
        }
    }
}

/// A connected RC queue pair.
#[derive(Debug)]
pub struct RoceQp {
    pub(super) dev: Arc<Device>,
    pub(super) qpn: u32,
    pub(super) pd: Arc<PdInner>,
    /// Where the flushed completions of a dropped QP go (see `Drop`).
    pub(super) send_cq: Arc<CqInner>,
    pub(super) recv_cq: Arc<CqInner>,
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
        let tid = random_u64()?;
        let src_port = 0x8000 | (random_u32()? as u16 & 0x7FFF);
        let pd = self
            .qp
            .as_ref()
            .map(|q| q.pd.clone())
            .expect("not installed");
        let (qpn, mad, local_comm_id) = {
            let mut eng = lock(&dev.eng);
            // Drawn under the lock, unique among this device's connection
            // records (as the passive side does), before anything is
            // installed.
            let local_comm_id = loop {
                let c = random_u32()?;
                if c != 0 && !eng.cm.conns.contains_key(&c) {
                    break c;
                }
            };
            // Fallible steps before the queue pair is installed: a failure
            // after would leave it in the device with nobody to remove it.
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
            let Some(mad) = emit_mad(&CmMad::new(tid, CmMessage::Req(req))) else {
                eng.qps.remove(&qpn);
                return Err(VerbsError::Protocol("REQ encoding"));
            };
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
            (qpn, mad, local_comm_id)
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
pub(super) fn idle(n: u32) {
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
        mr.check_exposable(&self.pd.mrs)?;
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
