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
//!   receives a `recvmmsg` batch, runs the transport (`rc`) of the queue
//!   pairs of the queue's **shard** of the device, and sends what it
//!   produced with one `sendmmsg`; a post runs its queue pair and sends,
//!   without reading the socket first. A shard is locked only by the
//!   thread polling its queue; packets for another shard's queue pairs
//!   are handed over through its lock-free inbox; the connection manager
//!   has a lock of its own, off the data path; the device's thread drives
//!   only shards nobody polls. No thread per connection, no allocation
//!   per packet (see `device.rs` and docs/ROCE.md).
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
pub use self::config::{
    RoceConfig, ENV_FAULTS, ENV_GSO, ENV_LOCAL_IP, ENV_UDP_PORT, ENV_VERIFY_ICRC,
};
pub use self::context::RoceContext;
pub use self::cq::RoceCq;
pub use self::io::FaultPolicy;
pub use self::listener::{RoceIncoming, RoceListener};
pub use self::pd::{RoceMr, RocePd};
pub use self::qp::{RocePreparedQp, RoceQp};
pub use self::rc::Recovery as RoceRecovery;
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

/// A device's counters (`RoceQp::device_stats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RoceDeviceStats {
    /// Shards: one per completion queue with queue pairs on the device.
    pub shards: usize,
    /// Inbound packets dropped for a bad ICRC (with `verify_icrc`).
    pub bad_icrc: u64,
    /// Packets dropped as spoofed (see the module docs).
    pub spoofed: u64,
    /// CM MADs dropped because the connection manager's queue was full.
    pub mads_dropped: u64,
    /// Connection requests rejected (`NO_RESOURCES`) because their peer
    /// address already had `MAX_HALF_OPEN_PER_PEER` connections half-open
    /// (queued for the application, held by it, or answered and waiting
    /// for their RTU).
    pub half_open_refused: u64,
    /// Times the control lock (connection manager, QPN map) was taken.
    pub control_locks: u64,
    /// Of those, by a thread inside a completion queue poll or a post:
    /// zero by design (the data path takes only its shard's lock).
    pub control_locks_on_data_path: u64,
    /// Data packets the connection manager's receive (`connect`,
    /// `accept`, the device's thread when no shard reads) handed to a
    /// shard.
    pub handed_out_by_control: u64,
    /// Packets the kernel refused as larger than the route's MTU.
    pub oversized: u64,
}

/// A shard's counters (`RoceQp::shard_stats`, `RoceCq::shard_stats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RoceShardStats {
    /// Progress runs by threads polling its completion queue or posting.
    pub polled: u64,
    /// Progress runs by the device's thread, because no thread had driven
    /// the shard for a millisecond.
    pub idle_runs: u64,
    /// Packets it received for another shard's queue pair and handed over.
    pub handed_out: u64,
    /// Packets other shards handed to it, processed.
    pub handed_in: u64,
    /// Packets for it dropped because its inbox was full.
    pub inbox_drops: u64,
}

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
