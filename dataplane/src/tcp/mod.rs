//! ONC RPC over TCP with record marking (RFC 5531 s11), served by the same
//! [`ServiceTable`](crate::service::ServiceTable) as RPC-over-RDMA and
//! polled by the same workers, so the bench compares transports with the
//! same services in the same process.
//!
//! # Pieces
//! - [`TcpAcceptor`]: a non-blocking listener; [`TcpAcceptor::accept_ready`]
//!   takes the connections that are waiting, without blocking. The control
//!   plane may own it and hand accepted streams to workers, or a worker may
//!   own it (see [`TcpServer`]).
//! - [`TcpConnections`]: the connections of one worker.
//!   [`TcpConnections::add`] takes an accepted stream (made non-blocking
//!   here); [`TcpConnections::poll`] does one pass of work over all of them
//!   and returns how much it did (0 = idle, for the worker's idle
//!   strategy). Each pass reads what is available, reassembles records,
//!   dispatches each complete call, and writes the record-marked replies.
//! - [`TcpServer`]: an acceptor and its connections polled together, for a
//!   worker that owns its listener and for tests.
//! - [`TcpClient`]: the requester side for the bench's `tcp` transport:
//!   pipelined calls of the bench program up to a depth, replies matched by
//!   XID, poll-driven.
//!
//! # Where this sits
//! Beside the worker loop: it imports `wire` (record
//! marking, RPC headers) and `service` (dispatch, the bench program
//! encoders) and does its own socket I/O, so it is not sans-IO like the
//! engine; it is the TCP counterpart of "engine + provider" in one piece,
//! because TCP needs no protocol state beyond record reassembly.
//!
//! # Memory and allocation
//! Every buffer is allocated when a connection is set up and never
//! resized: an input buffer (one `read` worth), a reassembly buffer of the
//! largest record, and an output buffer of the largest reply plus a batch
//! area (see [`TcpConfig`]). Large buffers are private lazy mappings, so
//! memory is committed only as far as messages reach. A steady-state RPC
//! makes no heap allocation (tested with a counting allocator).
//!
//! # Bad peers
//! A record over the limit (the fragment header is checked before any of
//! its data is copied, so a garbage header is caught at once), a
//! connection reset, or an end of stream in the middle of a record costs
//! that connection only: it is closed and counted in [`TcpStats`]. A
//! record that is not a decodable call (too short, a reply) gets no answer
//! and is counted; record boundaries are intact, so the connection stays.
//!
//! The full description (limits, back-pressure, readiness checks, measured
//! costs) is in `docs/TCP.md`.

pub(crate) mod buf;
mod client;
mod epoll;
mod peers;
mod server;

#[cfg(test)]
mod tests;

use core::time::Duration;
use std::io;
use std::net::SocketAddr;

pub use buf::ZeroedBuf;
pub use client::{Reply, TcpClient, TcpClientConfig, TcpClientError, TcpClientStats};
pub use peers::PeerCounts;
pub use server::{
    NoRelay, Relayed, TcpAcceptor, TcpCallId, TcpConnCounts, TcpConnections, TcpRelay, TcpServer,
};

use crate::service::bench::MAX_DATA;
use crate::wire::rpc::{RecordMarker, MAX_CALL_HEADER_LEN};

/// Default largest call record and largest reply: the bench program's
/// largest argument or result ([`MAX_DATA`], 16 MiB) with its length word,
/// plus room for any call header ([`MAX_CALL_HEADER_LEN`], 832 bytes),
/// rounded up to 4 KiB.
pub const DEFAULT_MAX_MESSAGE_LEN: usize = MAX_DATA as usize + 4096;

const _: () = assert!(DEFAULT_MAX_MESSAGE_LEN >= MAX_DATA as usize + 4 + MAX_CALL_HEADER_LEN);

/// Smallest message limit accepted: an accepted reply header with an
/// AUTH_NONE verifier (24 bytes) and a result word.
pub const MIN_MESSAGE_LEN: usize = 28;

/// How [`TcpConnections::poll`] finds the connections with work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// Try a non-blocking `read` on every connection every pass: one
    /// system call per connection, even when it has nothing.
    ReadAll,
    /// One `poll(2)` with a zero timeout over all sockets, then work only
    /// on the ready ones: one system call per pass plus one per busy
    /// connection, but the kernel looks at every socket each time.
    Poll,
    /// Every socket registered once in an epoll set (level-triggered);
    /// one `epoll_wait` with a zero timeout per pass returns only the
    /// ready ones, so an idle connection costs nothing per pass. Idle
    /// timeouts are checked by a scan a few times per timeout period.
    Epoll,
    /// [`Readiness::Epoll`] from this many connections on,
    /// [`Readiness::ReadAll`] below.
    Auto {
        /// The smallest connection count that uses epoll.
        poll_from: usize,
    },
}

impl Default for Readiness {
    /// `Auto { poll_from: 2 }`: an idle `epoll_wait` costs about what one
    /// empty `read` does, and nothing per extra idle socket, so only a
    /// lone connection is read directly (measured:
    /// `examples/tcp_readiness.rs`, docs/TCP.md, "Readiness").
    fn default() -> Self {
        Readiness::Auto { poll_from: 2 }
    }
}

/// Limits and sizes of the TCP transport (server side).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpConfig {
    /// Largest call record accepted: the sum of its fragment lengths,
    /// record marks not counted. A fragment header that would pass it
    /// closes the connection. Reserved per connection.
    pub max_record_len: usize,
    /// Largest reply message (without its record mark). A reply that does
    /// not fit is answered `SYSTEM_ERR` by the service table. Reserved per
    /// connection.
    pub max_reply_len: usize,
    /// Bytes asked for per `read` (the per-connection input buffer).
    pub read_buffer_len: usize,
    /// Output space beyond one reply, where replies to pipelined calls
    /// gather to leave in one `write`.
    pub batch_len: usize,
    /// `read` calls per connection per pass, so that one busy connection
    /// cannot starve the others.
    pub reads_per_poll: usize,
    /// Connections one [`TcpConnections`] holds; more are refused.
    pub max_connections: usize,
    /// Close a connection that moved no byte for this long (`None`: never).
    pub idle_timeout: Option<Duration>,
    /// Close a connection that sent no byte for this long after it was
    /// added (`None`: only `idle_timeout` applies). A client sends its
    /// first call as soon as it connects; a connection that says nothing
    /// only holds a descriptor and buffers.
    pub first_byte_timeout: Option<Duration>,
    /// How a pass finds ready connections.
    pub readiness: Readiness,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            max_record_len: DEFAULT_MAX_MESSAGE_LEN,
            max_reply_len: DEFAULT_MAX_MESSAGE_LEN,
            read_buffer_len: 64 << 10,
            batch_len: 64 << 10,
            reads_per_poll: 8,
            max_connections: 1024,
            // The period on which Linux's RPC server ages out idle TCP
            // transports (svc_conn_age_period).
            idle_timeout: Some(Duration::from_secs(6 * 60)),
            first_byte_timeout: Some(Duration::from_secs(10)),
            readiness: Readiness::default(),
        }
    }
}

impl TcpConfig {
    /// Checks the limits.
    ///
    /// # Errors
    /// [`TcpError::Config`] naming the field: a message limit under
    /// [`MIN_MESSAGE_LEN`] or over 2^31 - 1 (one record fragment), a zero
    /// read buffer, read budget or connection limit.
    pub fn validate(&self) -> Result<(), TcpError> {
        let message = MIN_MESSAGE_LEN..=RecordMarker::MAX_FRAGMENT_LEN;
        if !message.contains(&self.max_record_len) {
            return Err(TcpError::Config(
                "max_record_len must be 28..=2147483647 bytes",
            ));
        }
        if !message.contains(&self.max_reply_len) {
            return Err(TcpError::Config(
                "max_reply_len must be 28..=2147483647 bytes",
            ));
        }
        if self.read_buffer_len == 0 {
            return Err(TcpError::Config("read_buffer_len must not be 0"));
        }
        if self.reads_per_poll == 0 {
            return Err(TcpError::Config("reads_per_poll must not be 0"));
        }
        if self.max_connections == 0 {
            return Err(TcpError::Config("max_connections must not be 0"));
        }
        Ok(())
    }
}

/// Counters of one [`TcpConnections`], monotonically increasing; the
/// worker copies them to its metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TcpStats {
    /// Connections added.
    pub connections_opened: u64,
    /// Connections refused: the set was full, or the socket could not be
    /// set up.
    pub connections_refused: u64,
    /// Connections closed cleanly: the peer ended the stream between
    /// records (after its replies were written), or
    /// [`TcpConnections::close_all`].
    pub connections_closed: u64,
    /// Connections closed for an error: the sum of the five counters below.
    pub connections_dropped: u64,
    /// Records over `max_record_len` (garbage or hostile record marks).
    pub oversized_records: u64,
    /// Ends of stream in the middle of a record.
    pub truncated_records: u64,
    /// Socket errors other than would-block (reset, broken pipe).
    pub io_errors: u64,
    /// Connections closed by the idle timeout.
    pub idle_timeouts: u64,
    /// Connections closed by the first-byte timeout: they never sent
    /// anything.
    pub silent_timeouts: u64,
    /// Calls answered (every reply written, errors like `PROG_UNAVAIL`
    /// included).
    pub rpcs: u64,
    /// Records that got no answer: not a decodable call
    /// ([`Dispatch::Drop`](crate::service::Dispatch::Drop)).
    pub records_dropped: u64,
    /// Bytes read from sockets.
    pub bytes_in: u64,
    /// Bytes written to sockets.
    pub bytes_out: u64,
    /// Passes that stopped reading a connection because its output was
    /// full (back-pressure).
    pub output_stalls: u64,
    /// Times a pass served a connection (read, answered, wrote). With
    /// epoll readiness an idle connection adds nothing: this grows with
    /// the traffic, not with the connection count.
    pub connections_served: u64,
}

impl TcpStats {
    /// Connections currently open (opened minus closed and dropped).
    pub fn open_connections(&self) -> u64 {
        self.connections_opened - self.connections_closed - self.connections_dropped
    }
}

/// Errors of connection setup on the TCP transport (control path).
#[derive(Debug, thiserror::Error)]
pub enum TcpError {
    /// A configuration value is out of range.
    #[error("tcp transport: {0}")]
    Config(&'static str),
    /// A `tcp://` URL did not parse.
    #[error("bad tcp url {url:?}: expected tcp://IP:PORT (IPv6 as [ADDR]:PORT)")]
    BadUrl {
        /// The URL given.
        url: String,
    },
    /// Binding a listener failed.
    #[error("cannot listen on tcp://{addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The error from the operating system.
        source: io::Error,
    },
    /// The connection set is full.
    #[error("too many tcp connections ({max}); refused {peer}")]
    TooManyConnections {
        /// The configured maximum.
        max: usize,
        /// The peer refused.
        peer: SocketAddr,
    },
    /// A socket operation failed; `what` says which.
    #[error("tcp {what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The error from the operating system.
        source: io::Error,
    },
}

/// Parses `tcp://IP:PORT` (IPv6 as `tcp://[ADDR]:PORT`); host names are not
/// resolved, like the daemon's listener URLs.
///
/// # Errors
/// [`TcpError::BadUrl`] for another scheme or an address that does not
/// parse.
pub fn parse_tcp_url(url: &str) -> Result<SocketAddr, TcpError> {
    url.strip_prefix("tcp://")
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| TcpError::BadUrl {
            url: url.to_owned(),
        })
}
