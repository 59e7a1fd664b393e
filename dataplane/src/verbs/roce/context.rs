//! Contexts and protection domains: the objects that create the others
//! (protection domains, completion queues and listeners; memory regions
//! and queue pairs).
use std::collections::VecDeque;
use std::net::SocketAddrV4;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use super::config::{parse_url, RoceConfig};
use super::cq::{CqInner, RoceCq, CQ_IDS};
use super::device::Device;
use super::io::FaultPolicy;
use super::listener::RoceListener;
use super::pd::{PdInner, RoceMr, RocePd};
use super::qp::RocePreparedQp;
use super::random::random_u32;
use super::rc::{RcQp, Timers};
use super::ready::ReadyList;
use super::srq::RoceSrq;
use super::Roce;
use crate::mem::Arena;
use crate::verbs::{
    check_queue_depths, lock, Access, Context, ProtectionDomain, QpCaps, SrqCaps, VerbsError,
};
use crate::wire::roce::seg::Mtu;
use crate::wire::roce::Psn;

/// An opened roce context (devices are bound lazily by `listen` and
/// `connect`).
#[derive(Debug)]
pub struct RoceContext {
    pub(super) cfg: Mutex<RoceConfig>,
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
                shards: Mutex::new(Vec::new()),
                ready: Arc::new(ReadyList::new().map_err(|source| VerbsError::Os {
                    what: "eventfd",
                    source,
                })?),
                orphans: Mutex::new(VecDeque::new()),
            }),
        })
    }

    fn listen(&self, url: &str) -> Result<RoceListener, VerbsError> {
        let (addr, cfg) = parse_url(url, self.config())?;
        let dev = Device::at(SocketAddrV4::new(*addr.ip(), cfg.udp_port), &cfg)?;
        {
            let mut ctl = dev.control();
            if ctl.cm.listeners.contains_key(&addr.port()) {
                return Err(VerbsError::Os {
                    what: "listen",
                    source: nix::Error::EADDRINUSE,
                });
            }
            ctl.cm.listeners.insert(addr.port(), VecDeque::new());
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

    fn create_srq(&self, caps: SrqCaps) -> Result<RoceSrq, VerbsError> {
        RoceSrq::create(
            &self.inner.mrs,
            caps,
            16384,
            0,
            "shared receive queue depth must be 1..=16384",
        )
    }

    fn create_qp_on_srq(
        &self,
        send_cq: &RoceCq,
        recv_cq: &RoceCq,
        srq: &RoceSrq,
        caps: QpCaps,
    ) -> Result<RocePreparedQp, VerbsError> {
        srq.inner.check_pd(&self.inner.mrs)?;
        // The queue pair holds at most the receive of the message in
        // progress; room for `max_recv_wr` completions waits beside it.
        let mut pqp = self.create_qp(send_cq, recv_cq, caps)?;
        if let Some(qp) = pqp.qp.as_mut() {
            qp.srq = Some(srq.inner.clone());
        }
        Ok(pqp)
    }

    fn create_qp(
        &self,
        send_cq: &RoceCq,
        recv_cq: &RoceCq,
        caps: QpCaps,
    ) -> Result<RocePreparedQp, VerbsError> {
        check_queue_depths(&caps, 16384, "queue depth must be 1..=16384")?;
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
                // Replaced at connect or accept by the path's MTU.
                self.cfg.mtu.unwrap_or(Mtu::Mtu1024),
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
