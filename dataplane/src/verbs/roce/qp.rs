//! Queue pairs: a prepared queue pair (receives may be posted) and its
//! `connect`, the active side of connection setup; a connected queue
//! pair's posts, keys and teardown.
use std::net::{IpAddr, SocketAddrV4};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::cm::{
    ca_guid, cm_path, emit_mad, send_mad, send_rej, ConnRec, ConnState, CM_RETRY,
    MAX_REQ_PRIVATE_DATA,
};
use super::config::{parse_url, RoceConfig};
use super::cq::CqInner;
use super::device::{mark_ticking, Control, DataPath, Device, Shard, ShardState};
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
    /// Moves the QP into its receive queue's shard on `dev` under a fresh
    /// QPN, after `prepare` (which sees the QPN), and counts it on its
    /// completion queues.
    ///
    /// # Errors
    /// `VerbsError::Os` if no random QPN can be drawn (nothing installed).
    pub(super) fn install<R>(
        &mut self,
        ctl: &mut Control,
        dev: &Arc<Device>,
        prepare: impl FnOnce(&mut RcQp) -> R,
    ) -> Result<(u32, Arc<Shard>, R), VerbsError> {
        let qpn = ctl.alloc_qpn()?;
        let shard = self.recv_cq.shard_on(dev, ctl);
        let mut qp = self.qp.take().expect("prepared QP installed once");
        qp.qpn = qpn;
        qp.faults = Faults::new(self.cfg.faults, qpn);
        qp.announce = Some(Announce {
            send: self.send_cq.ready.clone(),
            recv: self.recv_cq.ready.clone(),
            shard: shard.id,
        });
        let r = prepare(&mut qp);
        // Counted on the queues first: a new shard is then the receive
        // queue's before anything can announce on it.
        self.recv_cq.attach(dev, &shard, true);
        if !Arc::ptr_eq(&self.send_cq, &self.recv_cq) {
            self.send_cq.attach(dev, &shard, false);
        }
        ctl.insert_qp(dev, &shard, qp);
        Ok((qpn, shard, r))
    }

    /// Undoes [`install`](Self::install) for a connection that failed
    /// before anyone saw it.
    pub(super) fn uninstall(&self, ctl: &mut Control, dev: &Device, shard: &Arc<Shard>, qpn: u32) {
        ctl.remove_qp(dev, qpn);
        detach(&self.send_cq, &self.recv_cq, shard);
    }
}

/// Uncounts a queue pair of `shard` on its completion queues.
fn detach(send_cq: &Arc<CqInner>, recv_cq: &Arc<CqInner>, shard: &Arc<Shard>) {
    recv_cq.detach(shard);
    if !Arc::ptr_eq(send_cq, recv_cq) {
        send_cq.detach(shard);
    }
}

/// A connected RC queue pair.
#[derive(Debug)]
pub struct RoceQp {
    pub(super) dev: Arc<Device>,
    /// Where it lives: its receive queue's shard of the device.
    pub(super) shard: Arc<Shard>,
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
        lock(&self.shard.state)
            .qps
            .get(&self.qpn)
            .map_or([0; 3], |q| q.faults.counts)
    }

    /// How this QP's requester recovered from losses so far: tail probes
    /// after a quiet period, retransmission timeouts, sequence NAKs.
    pub fn recovery_counts(&self) -> super::RoceRecovery {
        lock(&self.shard.state)
            .qps
            .get(&self.qpn)
            .map_or_else(Default::default, |q| q.recovery)
    }

    /// The local address of the device this QP runs on.
    pub fn local_addr(&self) -> SocketAddrV4 {
        self.dev.local
    }

    /// Inbound packets the device dropped for a bad ICRC (with
    /// `verify_icrc`).
    pub fn bad_icrc_count(&self) -> u64 {
        self.dev.stats().bad_icrc
    }

    /// Packets the device dropped as spoofed (see the module docs).
    pub fn spoofed_count(&self) -> u64 {
        self.dev.stats().spoofed
    }

    /// Packets the device could not send because they exceeded the path
    /// MTU of the route (EMSGSIZE).
    pub fn oversized_count(&self) -> u64 {
        self.dev.oversized()
    }

    /// The counters of the device this QP runs on.
    pub fn device_stats(&self) -> super::RoceDeviceStats {
        self.dev.stats()
    }

    /// The counters of the shard this QP lives in (its receive queue's).
    pub fn shard_stats(&self) -> super::RoceShardStats {
        self.shard.stats()
    }

    /// Runs `f` on this queue pair in its shard, then its post step (what
    /// it may send now, sent; `ShardState::post_step`): the data path,
    /// under the shard's lock only.
    fn with<R>(&self, f: impl FnOnce(&mut RcQp, &mut Tx) -> R) -> Option<R> {
        let _data_path = DataPath::enter();
        let mut st = lock(&self.shard.state);
        let ShardState {
            qps, tx, active, ..
        } = &mut *st;
        let qp = qps.get_mut(&self.qpn)?;
        mark_ticking(active, qp);
        let r = f(qp, tx);
        let now = Instant::now();
        st.post_step(&self.dev, self.qpn, now);
        self.shard.mark_progress(&self.dev, now);
        self.shard.counters.polled.fetch_add(1, Ordering::Relaxed);
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
            let mut ctl = self.dev.control();
            let qp = ctl.remove_qp(&self.dev, self.qpn);
            if let Some(c) = qp.as_ref().and_then(|q| q.conn) {
                // A DREQ still being retried keeps its record (forgotten
                // after DREQ_RETRIES); anything else goes now.
                let keep = ctl
                    .cm
                    .conns
                    .get(&c.local_comm_id)
                    .is_some_and(|r| matches!(r.state, ConnState::DreqSent { .. }));
                if !keep {
                    ctl.cm.conns.remove(&c.local_comm_id);
                }
            }
            detach(&self.send_cq, &self.recv_cq, &self.shard);
            qp
        };
        if let Some(mut qp) = removed {
            qp.enter_error(None, false);
            lock(&self.recv_cq.orphans).extend(qp.recv_done.drain(..));
            lock(&self.send_cq.orphans).extend(qp.send_done.drain(..));
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
        // Before the control lock: a route lookup. The REQ announces it;
        // the passive side sends within the smaller of it and its own.
        let path_mtu = cfg.mtu_toward(*target.ip());
        let deadline = Instant::now() + timeout;
        let tid = random_u64()?;
        let src_port = 0x8000 | (random_u32()? as u16 & 0x7FFF);
        let pd = self
            .qp
            .as_ref()
            .map(|q| q.pd.clone())
            .expect("not installed");
        let (qpn, shard, mad, local_comm_id) = {
            let mut ctl = dev.control();
            // Drawn under the lock, unique among this device's connection
            // records (as the passive side does), before anything is
            // installed.
            let local_comm_id = loop {
                let c = random_u32()?;
                if c != 0 && !ctl.cm.conns.contains_key(&c) {
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
            let (qpn, shard, (starting_psn, path_mtu, rnr_retry)) =
                self.install(&mut ctl, &dev, |qp| {
                    // Options in the connect URL apply to this connection.
                    qp.configure(
                        path_mtu,
                        Timers {
                            ack_timeout: cfg.ack_timeout,
                            retry_count: cfg.retry_count,
                        },
                    );
                    qp.faults = Faults::new(cfg.faults, qp.qpn);
                    qp.buffers = dev.buffers;
                    (qp.initial_psn(), qp.mtu, qp.caps.rnr_retry.min(7))
                })?;
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
                starting_psn,
                local_cm_response_timeout: 20,
                retry_count: cfg.retry_count.min(7),
                pkey: 0xFFFF,
                path_mtu,
                rdc_exists: false,
                rnr_retry_count: rnr_retry,
                max_cm_retries: 15,
                srq: false,
                extended_transport: 0,
                primary_path: cm_path(local_ip, *target.ip(), cfg.ack_timeout_code()),
                alternate_path: CmPath::default(),
                private_data: &private,
            };
            let Some(mad) = emit_mad(&CmMad::new(tid, CmMessage::Req(req))) else {
                self.uninstall(&mut ctl, &dev, &shard, qpn);
                return Err(VerbsError::Protocol("REQ encoding"));
            };
            ctl.cm.conns.insert(
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
            let Control { tx, gsi_psn, .. } = &mut *ctl;
            send_mad(tx, gsi_psn, *target.ip(), cfg.udp_port, &mad);
            tx.flush();
            (qpn, shard, mad, local_comm_id)
        };
        let qp = RoceQp {
            dev: dev.clone(),
            shard,
            qpn,
            pd,
            send_cq: self.send_cq.clone(),
            recv_cq: self.recv_cq.clone(),
        };
        let mut resend_at = Instant::now() + CM_RETRY;
        let mut backoff = 0u32;
        loop {
            let now = Instant::now();
            dev.control_step(now, true);
            {
                let mut ctl = dev.control();
                let ctl = &mut *ctl;
                let Some(rec) = ctl.cm.conns.get_mut(&local_comm_id) else {
                    // Gone: a DREQ for it crossed, or it was dropped.
                    return Err(VerbsError::NotConnected);
                };
                match &mut rec.state {
                    ConnState::Established => {
                        let pd = std::mem::take(&mut rec.peer_private);
                        rec.claimed = true;
                        return Ok((qp, pd));
                    }
                    // Established, then already disconnected by the peer:
                    // the QP is in the error state, as rdma_cm reports
                    // ESTABLISHED then DISCONNECTED.
                    ConnState::Closed => {
                        let pd = std::mem::take(&mut rec.peer_private);
                        ctl.cm.conns.remove(&local_comm_id);
                        return Ok((qp, pd));
                    }
                    ConnState::Rejected(pd) => {
                        let pd = std::mem::take(pd);
                        ctl.cm.conns.remove(&local_comm_id);
                        ctl.with_qp(&dev, qpn, |q| q.enter_error(None, false));
                        return Err(VerbsError::Rejected { private_data: pd });
                    }
                    _ => {}
                }
                if now >= resend_at && rec.quiet_until.is_none_or(|t| now >= t) {
                    rec.quiet_until = None;
                    resend_at = now + CM_RETRY;
                    let Control { tx, gsi_psn, .. } = ctl;
                    send_mad(tx, gsi_psn, *target.ip(), cfg.udp_port, &mad);
                    tx.flush();
                }
                if now >= deadline {
                    ctl.cm.conns.remove(&local_comm_id);
                    ctl.with_qp(&dev, qpn, |q| q.enter_error(None, false));
                    let Control { tx, gsi_psn, .. } = ctl;
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
        lock(&self.shard.state)
            .qps
            .get(&self.qpn)
            .map_or(QpState::Error, |q| q.state)
    }

    fn peer_disconnected(&self) -> bool {
        lock(&self.shard.state)
            .qps
            .get(&self.qpn)
            .is_some_and(|q| q.peer_disconnected)
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
        let _data_path = DataPath::enter();
        let mut st = lock(&self.shard.state);
        let mut n = 0;
        let mut res = Ok(());
        let ShardState { qps, active, .. } = &mut *st;
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
        st.post_step(&self.dev, self.qpn, now);
        self.shard.mark_progress(&self.dev, now);
        self.shard.counters.polled.fetch_add(1, Ordering::Relaxed);
        res.map(|()| n)
    }

    fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostFailed<RecvWr>> {
        let _data_path = DataPath::enter();
        let mut st = lock(&self.shard.state);
        match st.qps.get_mut(&self.qpn) {
            Some(qp) => qp.post_recv(wr),
            None => Err(PostFailed {
                error: PostError::Invalid,
                wr,
            }),
        }
    }

    fn expose(&mut self, mr: &RoceMr) -> Result<RemoteKey, VerbsError> {
        mr.check_exposable(&self.pd.mrs)?;
        let mut st = lock(&self.shard.state);
        let qp = st.qps.get_mut(&self.qpn).ok_or(VerbsError::NotConnected)?;
        qp.expose(mr.info.addr, mr.info.len, mr.info.access, &mr.info.arena)
    }

    /// A slot of this connection's key table (256, shared with `expose`):
    /// the slot is the rkey's low byte, the upper 24 bits the consumer's.
    fn alloc_window(&mut self) -> Result<Window, VerbsError> {
        let mut st = lock(&self.shard.state);
        let qp = st.qps.get_mut(&self.qpn).ok_or(VerbsError::NotConnected)?;
        qp.alloc_window()
    }

    fn disconnect(&mut self) {
        let owes_dreq = {
            let mut st = lock(&self.shard.state);
            let ShardState {
                qps, active, tx, ..
            } = &mut *st;
            qps.get_mut(&self.qpn).is_some_and(|qp| {
                // The ACK held for the next step goes first: it leaves
                // before the DREQ sent below.
                qp.send_held_ack(tx);
                tx.flush();
                mark_ticking(active, qp);
                qp.enter_error(None, true);
                qp.dreq_due
            })
        };
        // The DREQ leaves now, from the connection manager (the shard's
        // lock is released first: the control part locks shards).
        let mut ctl = self.dev.control();
        if owes_dreq {
            self.dev.wake_for_dreq();
        }
        ctl.cm_timers(&self.dev, Instant::now());
        ctl.tx.flush();
    }
}
