//! The storage gateway's relay: calls of routed programs that arrive over
//! RPC-over-RDMA go on to ONC RPC servers over TCP, and each reply goes
//! back to the RDMA connection its call came from (docs/GATEWAY.md).
//!
//! # Shape
//! A [`Forwarder`] belongs to one worker and runs in its poll loop: it
//! owns non-blocking, pipelined TCP connections to every backend
//! ([`GatewayConfig::routes`]), and no thread waits on a request.
//!
//! ```text
//! call arrives (engine has pulled its read chunks)
//!   -> forward(origin, call)      XID rewritten, record-marked, queued
//! every iteration
//!   -> poll(now, |origin, answer| ...)
//!        Reply: the backend's reply, its XID restored; the worker finds
//!               the DDP item (nfs::reply_ddp) and answers through the
//!               engine, which picks inline, write chunk or reply chunk
//!        Failed: no reply within the call timeout; the worker answers
//!               SYSTEM_ERR (RFC 5531 s9)
//!   -> next_resend() / resend()   calls whose backend connection was
//!                                 lost, sent again on a new one
//! ```
//!
//! # What crosses the gateway
//! * Chunks end at the gateway: a segment's handle means something only
//!   on its own RDMA connection (RFC 8166 s3.4). The engine has pulled a
//!   call's read chunks and spliced their data back at its XDR position
//!   before the call reaches [`Forwarder::forward`], so the backend gets
//!   an ordinary ONC RPC call; a reply's DDP-eligible item goes into the
//!   client's write chunk on the way back.
//! * Only the XID changes. The credential, the verifier and the arguments
//!   travel untouched; the backend's XID is the pending call's table slot
//!   and a per-slot generation, so a late reply to a call that already
//!   timed out cannot be taken for the reply of the slot's next call.
//! * Calls are routed by program number alone: the backend answers a
//!   version it does not serve with PROG_MISMATCH itself.
//!
//! # Failure
//! A backend connection that fails (refused, reset, a malformed record)
//! is closed; the calls that were on it are sent again on a new
//! connection, until their call timeout, after which each is answered
//! SYSTEM_ERR. The RDMA connections are not touched: a backend's failure
//! costs its own calls only.

mod backend;
mod drc;
mod forwarder;
mod nfs4;
#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub use forwarder::{Answer, ForwardError, Forwarded, Forwarder, RelayWatch, Token, KEEP_MAX};

use crate::engine::DdpItems;
use crate::nfs;

/// Programs routed to one backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// ONC RPC program number (NFS 100003, MOUNT 100005, NFSACL 100227).
    pub program: u32,
    /// Versions registered with rpcbind for it. Calls of any version are
    /// forwarded; the backend judges them.
    pub versions: RangeInclusive<u32>,
    /// The backend's TCP address.
    pub backend: SocketAddr,
    /// TCP connections to the backend, per worker (at least 1). Calls go
    /// round the connections that are up.
    pub connections: u32,
}

/// What a worker's [`Forwarder`] serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayConfig {
    /// One route per program; a program appears once.
    pub routes: Vec<Route>,
    /// Calls a worker has at its backends at once, over all routes
    /// (1..=65536). A call beyond it is answered SYSTEM_ERR at once.
    pub max_in_flight: u32,
    /// How long a call may wait for its backend's reply, resends
    /// included, before it is answered SYSTEM_ERR.
    pub call_timeout: Duration,
    /// How long after a failed connection attempt the next one is made.
    pub reconnect_after: Duration,
    /// The largest call or reply record (without its record mark).
    pub max_message: usize,
    /// Entries of each worker's duplicate request cache (at least 1; each
    /// holds a reply of up to 1 KiB).
    pub reply_cache_entries: u32,
    /// How long a cached reply answers retransmissions.
    pub reply_cache_ttl: Duration,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            routes: Vec::new(),
            max_in_flight: 1024,
            call_timeout: Duration::from_secs(30),
            reconnect_after: Duration::from_millis(100),
            max_message: crate::tcp::DEFAULT_MAX_MESSAGE_LEN,
            reply_cache_entries: 4096,
            reply_cache_ttl: Duration::from_secs(120),
        }
    }
}

/// Why a [`GatewayConfig`] is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GatewayConfigError {
    /// Two routes name one program.
    #[error("program {0} is routed twice")]
    DuplicateProgram(u32),
    /// A route has no connection, or more than 64.
    #[error("program {0}: connections must be 1..=64")]
    BadConnections(u32),
    /// `max_in_flight` is outside 1..=65536.
    #[error("max_in_flight must be 1..=65536")]
    BadInFlight,
    /// `max_message` cannot hold a call header.
    #[error("max_message must be at least 1024 bytes")]
    MessageTooSmall,
}

impl GatewayConfig {
    /// Checks the limits [`Forwarder::new`] relies on.
    ///
    /// # Errors
    /// The first [`GatewayConfigError`] found.
    pub fn validate(&self) -> Result<(), GatewayConfigError> {
        for (i, r) in self.routes.iter().enumerate() {
            if self.routes[..i].iter().any(|o| o.program == r.program) {
                return Err(GatewayConfigError::DuplicateProgram(r.program));
            }
            if !(1..=64).contains(&r.connections) {
                return Err(GatewayConfigError::BadConnections(r.program));
            }
        }
        if !(1..=65536).contains(&self.max_in_flight) {
            return Err(GatewayConfigError::BadInFlight);
        }
        if self.max_message < 1024 {
            return Err(GatewayConfigError::MessageTooSmall);
        }
        Ok(())
    }
}

/// Upper bounds (microseconds) of the latency histogram's buckets; one
/// more bucket counts everything slower.
pub const LATENCY_BOUNDS_US: [u64; 16] = [
    10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000, 200_000,
    500_000, 1_000_000,
];

/// One route's counters, shared by every worker (relaxed atomics; the
/// metrics endpoint reads them).
#[derive(Debug, Default)]
pub struct RouteCounters {
    /// Calls forwarded (resends not counted again).
    pub calls: AtomicU64,
    /// Replies relayed back.
    pub replies: AtomicU64,
    /// Record bytes written to the backend (record marks included).
    pub bytes_out: AtomicU64,
    /// Record bytes of replies taken from the backend.
    pub bytes_in: AtomicU64,
    /// Calls answered SYSTEM_ERR: no reply within the call timeout.
    pub errors_timeout: AtomicU64,
    /// Calls answered SYSTEM_ERR at once: every in-flight slot taken.
    pub errors_busy: AtomicU64,
    /// Backend connections lost or refused.
    pub errors_connection: AtomicU64,
    /// Calls sent again after their connection was lost.
    pub resends: AtomicU64,
    /// Calls that found no room in the backend connections' output and
    /// went out later (sent once, not again).
    pub output_waits: AtomicU64,
    /// Replies from the backend that matched no call in flight (late
    /// replies to calls that timed out, or a confused backend).
    pub stray_replies: AtomicU64,
    /// Retransmissions answered from the duplicate request cache.
    pub cache_hits: AtomicU64,
    /// Retransmissions that joined their call while it was at the backend.
    pub cache_joins: AtomicU64,
    /// Reply latency, forward to reply, by [`LATENCY_BOUNDS_US`] bucket
    /// (not cumulative).
    pub latency: [AtomicU64; LATENCY_BOUNDS_US.len() + 1],
    /// Sum of the reply latencies, nanoseconds.
    pub latency_sum_ns: AtomicU64,
}

impl RouteCounters {
    fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    fn record_latency(&self, ns: u64) {
        let us = ns / 1000;
        let i = LATENCY_BOUNDS_US
            .iter()
            .position(|&b| us <= b)
            .unwrap_or(LATENCY_BOUNDS_US.len());
        Self::add(&self.latency[i], 1);
        Self::add(&self.latency_sum_ns, ns);
    }
}

/// The counters of every route of a [`GatewayConfig`], in route order.
#[derive(Debug, Default)]
pub struct GatewayCounters {
    /// One per route.
    pub routes: Vec<RouteCounters>,
}

impl GatewayCounters {
    /// Zeroed counters for `config`'s routes.
    pub fn new(config: &GatewayConfig) -> GatewayCounters {
        GatewayCounters {
            routes: config
                .routes
                .iter()
                .map(|_| RouteCounters::default())
                .collect(),
        }
    }
}

/// The DDP-eligible items of a relayed reply, in message order, for the
/// engine to place in the client's write chunks (the Nth in the Nth):
/// what the upper-layer binding names for the call's program, version and
/// procedure. NFS version 3: the data of READ, the path of READLINK (RFC
/// 8267 s4); NFS version 4: the data of each READ and the text of each
/// READLINK of the COMPOUND, in operation order (RFC 8267 s5,
/// [`nfs4`]). Replies of other programs, and unsuccessful replies, have
/// none and travel whole (inline or in the reply chunk).
pub fn reply_ddp(program: u32, version: u32, procedure: u32, message: &[u8]) -> DdpItems {
    if program != nfs::NFS_PROGRAM {
        return DdpItems::NONE;
    }
    match version {
        nfs::NFS_V3 => nfs::Nfs3Proc::from_wire(procedure)
            .ok()
            .and_then(|p| nfs::reply_ddp(p, message))
            .map_or(DdpItems::NONE, DdpItems::one),
        4 if procedure == nfs4::NFSPROC4_COMPOUND => nfs4::compound_reply_ddp(message),
        _ => DdpItems::NONE,
    }
}
