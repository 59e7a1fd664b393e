//! What a worker reports about its connections when the control plane
//! asks ([`WorkerSet::status`](super::WorkerSet::status), behind
//! `rpcrdmad status`).
//!
//! The question travels over the worker's control ring like any other
//! command, and the worker answers between two iterations of its loop:
//! the connections are the worker's alone, so asking is the only way to
//! read them without a lock on the data path. Building the answer
//! allocates; it happens once per question, never per RPC.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use super::Transport;

/// One connection, as its worker sees it when asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionStatus {
    /// The worker that serves it.
    pub worker: usize,
    /// Its transport.
    pub transport: Transport,
    /// Who the peer is, as far as the transport tells: an address
    /// (`roce`, `tcp`), a uid (`shm`), or `unknown`.
    pub peer: String,
    /// Time since the connection was set up.
    pub age: Duration,
    /// RDMA: calls our grants let the peer have in progress now
    /// (0 over TCP, which has no credits).
    pub credits_granted: u32,
    /// RDMA: calls in progress now (responder slots busy); TCP: 0.
    pub credits_in_use: u32,
    /// Calls received whole.
    pub calls_received: u64,
    /// Replies sent.
    pub replies_sent: u64,
    /// Bytes received (RDMA: Sends and Reads into us; TCP: socket bytes).
    pub bytes_received: u64,
    /// Bytes sent (RDMA: Sends and Writes; TCP: socket bytes).
    pub bytes_sent: u64,
    /// Errors on this connection: error completions and protocol errors
    /// answered with RDMA_ERROR (0 over TCP, whose errors close the
    /// connection).
    pub errors: u64,
    /// RDMA: whether 2 MiB hugepages back its buffers; TCP: `None`.
    pub hugepages: Option<bool>,
}

/// One worker's answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkerStatus {
    /// The worker.
    pub worker: usize,
    /// Its open connections, every transport.
    pub connections: Vec<ConnectionStatus>,
}

/// One of a worker's pools: a bulk pool or a shared receive queue of one
/// provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolStatus {
    /// `bulk` or `shared_receives`.
    pub pool: &'static str,
    /// The provider's scheme.
    pub provider: &'static str,
    /// The worker that owns it.
    pub worker: usize,
    /// Buffers in it.
    pub buffers: u64,
    /// Buffers in use (bulk: leased; shared receives: reserved for the
    /// grants of the worker's connections).
    pub used: u64,
    /// Bytes of each buffer.
    pub buffer_bytes: u64,
    /// Whether 2 MiB hugepages back it.
    pub hugepages: bool,
}

/// The peer a provider's identity (`Incoming::peer_identity`) stands
/// for: the shm provider tags a uid with 1 in the high half, roce an IPv4
/// address with 2; anything else is not decoded.
pub fn describe_peer(identity: u64) -> String {
    let low = identity as u32;
    match identity >> 32 {
        1 => format!("uid {low}"),
        2 => IpAddr::V4(Ipv4Addr::from(low)).to_string(),
        _ if identity == 0 => "unknown".to_owned(),
        _ => format!("peer {identity:#x}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_of_the_providers_read_back() {
        assert_eq!(describe_peer((1 << 32) | 1000), "uid 1000");
        assert_eq!(
            describe_peer((2 << 32) | u64::from(u32::from(Ipv4Addr::new(10, 0, 0, 7)))),
            "10.0.0.7"
        );
        assert_eq!(describe_peer(0), "unknown");
    }
}
