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
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use self::pd::PdInner;
pub use self::pd::{RoceMr, RocePd};
use self::qp::idle;
pub use self::qp::{RocePreparedQp, RoceQp};
use self::rc::{ConnRef, PeerPath, RcQp, Timers, MAX_RD};
use self::ready::ReadyList;
use super::*;
use crate::mem::Arena;
use crate::wire::ibcm::{self, CmMad, CmMessage, Rep};
use crate::wire::roce::Psn;

pub use self::cm::MAX_REQ_PRIVATE_DATA;
use self::cm::{
    ca_guid, emit_mad, send_mad, send_rej, ConnRec, ConnState, PendingReq, CM_RETRY, REP_RETRIES,
};
use self::config::parse_url;
pub use self::config::{RoceConfig, ENV_FAULTS, ENV_LOCAL_IP, ENV_UDP_PORT, ENV_VERIFY_ICRC};
pub use self::cq::RoceCq;
use self::cq::{CqInner, CQ_IDS};
use self::device::{Device, Engine};
pub use self::io::FaultPolicy;
use self::random::random_u32;

mod cm;
mod config;
mod cq;
mod device;
mod io;
mod pd;
mod qp;
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
