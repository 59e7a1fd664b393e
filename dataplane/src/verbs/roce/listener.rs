//! Listeners and incoming connection requests: the passive side of
//! connection setup (accept with a REP, refuse with a REJ).
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::cm::{
    ca_guid, emit_mad, send_mad, send_rej, ConnRec, ConnState, PendingReq, CM_RETRY, REP_RETRIES,
};
use super::device::{Control, Device};
use super::qp::{RocePreparedQp, RoceQp};
use super::random::random_u32;
use super::rc::{ConnRef, PeerPath, MAX_RD};
use super::Roce;
use crate::verbs::{Incoming, Listener, VerbsError};
use crate::wire::ibcm::{self, CmMad, CmMessage, Rep};
use crate::wire::roce::seg::Mtu;

/// A service port listening on a device.
#[derive(Debug)]
pub struct RoceListener {
    pub(super) dev: Arc<Device>,
    pub(super) port: u16,
}

impl RoceListener {
    /// The local RoCE address (IP and UDP port) of the device.
    pub fn local_addr(&self) -> SocketAddrV4 {
        self.dev.local
    }

    /// The counters of the device the listener is on (its connection
    /// requests refused among them), for a daemon's metrics.
    pub fn device_stats(&self) -> super::RoceDeviceStats {
        self.dev.stats()
    }
}

impl Drop for RoceListener {
    fn drop(&mut self) {
        let mut ctl = self.dev.control();
        if let Some(q) = ctl.cm.listeners.remove(&self.port) {
            let Control { tx, gsi_psn, .. } = &mut *ctl;
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

/// The longest an `accept` waits without looking at the queue: room for a
/// request the connection manager's timers made (a REP that timed out)
/// wakes nobody.
const ACCEPT_LOOK_AGAIN: Duration = Duration::from_millis(10);

impl Listener<Roce> for RoceListener {
    /// Waits for a request on the connection manager's queue: woken when
    /// the control part has taken a MAD (the device's thread, or a
    /// `connect`, runs it), and looking again at least every
    /// [`ACCEPT_LOOK_AGAIN`] for room its timers made. It neither reads the
    /// socket nor wakes on a timer of its own: an acceptor that did (every
    /// 100 us) took the cores of spinning workers and read some of their
    /// packets, which they then got handed over (docs/ROCE.md).
    fn accept(&self, timeout: Duration) -> Result<RoceIncoming, VerbsError> {
        let deadline = Instant::now() + timeout;
        let mut ctl = self.dev.control();
        loop {
            let now = Instant::now();
            if ctl.cm.make_room(self.port, now) {
                // Refuses the REP given up and fails its queue pair now,
                // not at the timers' next run.
                ctl.cm_timers(&self.dev, now);
                ctl.tx.flush();
            }
            if let Some(req) = ctl.cm.take_request(self.port, now) {
                return Ok(RoceIncoming {
                    dev: self.dev.clone(),
                    req: Some(req),
                });
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(VerbsError::Timeout);
            }
            ctl = self
                .dev
                .wait_for_mads(ctl, (deadline - now).min(ACCEPT_LOOK_AGAIN));
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
            refuse(&self.dev, &r, &[]);
        }
    }
}

impl Incoming<Roce> for RoceIncoming {
    /// The requester's IPv4 address (tagged 2 in the high half).
    fn peer_identity(&self) -> u64 {
        self.peer_ip()
            .map_or(0, |ip| (2 << 32) | u64::from(u32::from(ip)))
    }

    fn private_data(&self) -> &[u8] {
        self.req.as_ref().map_or(&[], |r| &r.private)
    }

    fn accept(mut self, mut qp: RocePreparedQp, private_data: &[u8]) -> Result<RoceQp, VerbsError> {
        if private_data.len() > ibcm::private_len::REP {
            return Err(VerbsError::Limit("REP private data is at most 196 bytes"));
        }
        let pd = qp.qp.as_ref().map(|q| q.pd.clone()).expect("not installed");
        let dev = self.dev.clone();
        // Before the control lock: a route lookup toward the requester.
        let own_mtu = match self.req.as_ref() {
            Some(r) => qp.cfg.mtu_toward(r.peer_ip),
            None => qp.cfg.mtu.unwrap_or(Mtu::Mtu1024),
        };
        let mut ctl = dev.control();
        let port = dev.local.port();
        let local_ip = *dev.local.ip();
        // Fallible steps first: on error the request is still ours to
        // refuse (Drop sends a REJ).
        let local_comm_id = loop {
            let c = random_u32()?;
            if c != 0 && !ctl.cm.conns.contains_key(&c) {
                break c;
            }
        };
        let peer = self.req.as_ref().expect("not yet answered");
        let (peer_ip, remote_qpn, peer_psn, peer_mtu, peer_rd) = (
            peer.peer_ip,
            peer.remote_qpn,
            peer.psn,
            peer.mtu,
            peer.responder_resources,
        );
        let (qpn, shard, (my_psn, rnr)) = qp.install(&mut ctl, &dev, |rc| {
            rc.awaiting_rtu = true;
            rc.buffers = dev.buffers;
            let my_psn = rc.initial_psn();
            // We send from the PSN the REQ announced (the first the
            // requester expects); the requester sends from the one in our
            // REP.
            let mtu = own_mtu;
            rc.bind(
                PeerPath {
                    addr: SocketAddrV4::new(peer_ip, port),
                    qpn: remote_qpn,
                },
                peer_psn,
                ConnRef { local_comm_id },
                // The REQ's path MTU is the requester's; ours may be
                // smaller (an oversized DF packet is refused with
                // EMSGSIZE). The REP has no MTU field: each side sends
                // within its own limit.
                peer_mtu.min(mtu),
                peer_rd,
            );
            (my_psn, rc.caps.rnr_retry.min(7))
        })?;
        let req = self.req.take().expect("not yet answered");
        ctl.cm.release_held(req.peer_ip, req.remote_comm_id);
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
        let Some(mad) = emit_mad(&CmMad::new(req.tid, CmMessage::Rep(rep))) else {
            // Not reachable with checked lengths; the queue pair is not
            // left in the device with nobody to remove it.
            qp.uninstall(&mut ctl, &dev, &shard, qpn);
            return Err(VerbsError::Protocol("REP encoding"));
        };
        ctl.cm.conns.insert(
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
        let Control { tx, gsi_psn, .. } = &mut *ctl;
        send_mad(tx, gsi_psn, req.peer_ip, port, &mad);
        tx.flush();
        drop(ctl);
        // The REP is resent on the device thread's timer: out of its
        // quiet wait.
        dev.wake_thread();
        Ok(RoceQp {
            dev,
            shard,
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
        refuse(&self.dev, &r, private_data);
        Ok(())
    }
}

/// Refuses connection request `r` (the consumer's REJ, with its private
/// data) and forgets it.
fn refuse(dev: &Device, r: &PendingReq, private_data: &[u8]) {
    let mut ctl = dev.control();
    ctl.cm.release_held(r.peer_ip, r.remote_comm_id);
    let Control { tx, gsi_psn, .. } = &mut *ctl;
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
}
