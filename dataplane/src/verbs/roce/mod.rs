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
//!
//! [`CompletionQueue::poll`]: super::CompletionQueue::poll
use std::sync::Mutex;

pub use self::cm::MAX_REQ_PRIVATE_DATA;
use self::config::parse_url;
pub use self::config::{RoceConfig, ENV_FAULTS, ENV_LOCAL_IP, ENV_UDP_PORT, ENV_VERIFY_ICRC};
pub use self::context::RoceContext;
pub use self::cq::RoceCq;
pub use self::io::FaultPolicy;
pub use self::listener::{RoceIncoming, RoceListener};
pub use self::pd::{RoceMr, RocePd};
pub use self::qp::{RocePreparedQp, RoceQp};
pub use self::srq::RoceSrq;
use super::{Provider, VerbsError};

mod cm;
mod config;
mod context;
mod cq;
mod device;
mod io;
mod listener;
mod pd;
mod qp;
mod random;
mod rc;
mod ready;
mod srq;
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
    type Srq = RoceSrq;
    const SCHEME: &'static str = "roce";
    const WINDOWS_ALWAYS: bool = true;

    fn open(url: &str) -> Result<RoceContext, VerbsError> {
        let (_, cfg) = parse_url(url, RoceConfig::from_env())?;
        Ok(RoceContext {
            cfg: Mutex::new(cfg),
        })
    }
}
