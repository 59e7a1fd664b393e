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
use std::net::SocketAddrV4;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

pub use self::listener::{RoceIncoming, RoceListener};
use self::pd::PdInner;
pub use self::pd::{RoceMr, RocePd};
pub use self::qp::{RocePreparedQp, RoceQp};
use self::rc::{RcQp, Timers};
use self::ready::ReadyList;
use super::*;
use crate::mem::Arena;
use crate::wire::roce::Psn;

pub use self::cm::MAX_REQ_PRIVATE_DATA;
use self::config::parse_url;
pub use self::config::{RoceConfig, ENV_FAULTS, ENV_LOCAL_IP, ENV_UDP_PORT, ENV_VERIFY_ICRC};
pub use self::cq::RoceCq;
use self::cq::{CqInner, CQ_IDS};
use self::device::Device;
pub use self::io::FaultPolicy;
use self::random::random_u32;

mod cm;
mod config;
mod cq;
mod device;
mod io;
mod listener;
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
