//! The sans-IO RPC-over-RDMA Version One engine (RFC 5666, with the
//! on-the-wire rules of RFC 8166), requester and responder sides of one
//! connection.
//!
//! # Shape (quinn-proto style)
//! A [`Connection`] is a state machine. Inputs are `handle_*` calls:
//! [`Connection::handle_recv`] (a receive completed: the bytes are in the
//! engine's receive buffer), [`Connection::handle_completion`] (any other
//! completion), [`Connection::handle_timeout`], and the application's
//! commands [`Connection::send_call`], [`Connection::send_reply`],
//! [`Connection::release_reply`], [`Connection::close`]. Outputs are
//! `poll_*` calls: [`Connection::poll_transmit`] yields [`WorkRequest`]s
//! (plain data) for the worker to post, [`Connection::poll_event`] yields
//! [`Event`]s for the application, [`Connection::poll_timeout`] the next
//! deadline. The engine performs no I/O, reads no clock (time is an
//! [`Instant`] passed in), starts no threads and knows no provider type.
//!
//! # Memory
//! The engine cuts one region ([`BufferTable`]; its own allocation, or the
//! caller's [`SlabMemory`] via [`Connection::with_memory`]) into receive
//! buffers, per-slot Send buffers, per-slot message buffers and a few
//! control buffers (RDMA_ERROR, RDMA_DONE). Request slots are preallocated
//! too (requester slots: `max_outstanding_calls`; responder slots:
//! [`Config::responder_slots`]), as are the scratch transport headers and queues, so an
//! RPC in steady state allocates nothing. A buffer named in a posted work
//! request is not reused before the completion for its [`WrId`] arrives.
//! See `docs/ENGINE.md` for how the worker maps [`BufId`]s to registered
//! memory.
//!
//! # Panic contract
//! Nothing a peer sends, and nothing a provider reports (unknown,
//! duplicate or stale work-request ids, error completions, lengths larger
//! than the buffer) makes the engine panic: bad input is answered
//! (RDMA_ERROR), counted in [`Stats`] and dropped, or closes the connection
//! ([`CloseReason`]). Application misuse (stale handles, oversized
//! messages) returns an error value. No number from a peer or a provider
//! indexes a table before it is bounds- and generation-checked; byte
//! ranges go through checked accessors; arithmetic on peer values is
//! checked or done in `u64`.

mod buffers;
mod bulk;
mod conf;
mod connection;
mod continuation;
mod credits;
pub(crate) mod fuzz;
mod heap;
mod inval;
mod msgp;
mod placement;
mod requester;
mod responder;
mod time;
mod wr;

#[cfg(test)]
mod harness;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_continuation;
#[cfg(test)]
mod tests_placement;
#[cfg(test)]
mod tests_show;

pub use buffers::{
    Access, BufClass, BufId, BufferTable, HeapPeerMemory, LocalSlice, Memory, MemoryLen,
    PeerMemory, SlabMemory,
};
pub use bulk::{BulkMemory, BulkPool};
pub use conf::{
    decode_conf_rdma_reply, decode_conf_rdma_reply_v2, encode_conf_rdma_call,
    encode_conf_rdma_call_v2, ConfRdmaError,
};
pub use connection::{Connection, Resources, Stats};
pub use credits::{CreditPool, CREDIT_FLOOR};
pub use fuzz::{fuzz_recv, Coverage};
pub use msgp::{MessagePadding, MAX_AUTH_BYTES};
pub use time::{Instant, Timer, TimerTable};
pub use wr::{WcStatus, WorkRequest, WrId, WrKind};

pub use crate::wire::extensions::Extensions;
use crate::wire::rpcrdma::{Limits, PrivateData, DEFAULT_INLINE_SIZE};
use core::time::Duration;

/// Connection parameters, fixed at construction except the peer's limits
/// ([`Connection::set_peer_limits`], e.g. after CONF_RDMA).
///
/// The reply inline limit a requester plans with is the smaller of our
/// receive size and the peer's send size; the call inline limit the
/// smaller of our send size and the peer's receive size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Size of each receive buffer we post: the largest Send we accept
    /// (our inline receive threshold, advertised in RFC 8797 private data).
    pub inline_recv_size: u32,
    /// The largest Send we post (our inline send threshold).
    pub inline_send_size: u32,
    /// The peer's inline receive threshold: no Send we post is longer.
    /// 1024 when the peer sent no private data (RFC 8797).
    pub peer_inline_recv_size: u32,
    /// The largest Send the peer posts: a reply that could be longer gets a
    /// reply chunk even if our receive buffers would hold it. 1024 when
    /// the peer sent no private data (RFC 8797).
    pub peer_inline_send_size: u32,
    /// The peer accepts Send With Invalidate (the RFC 8797 private data
    /// flag): a reply then invalidates the call's key remotely when every
    /// chunk of the call was advertised under that one key (as Linux's
    /// svcrdma does). False when the peer sent no private data.
    pub peer_remote_invalidate: bool,
    /// Credits we grant the peer: calls it may have outstanding with us
    /// (RFC 5666 s3.3). Never zero.
    pub credits: u32,
    /// Calls we keep outstanding at most (requester slots); also the credit
    /// value we request in every call. 0 for a pure server: it answers
    /// calls and makes none (`send_call` then finds no slot), and its
    /// connections carry no requester buffers.
    pub max_outstanding_calls: u32,
    /// Largest RPC call message (after reassembly of its chunks).
    pub max_call_size: u32,
    /// Largest RPC reply message (after reassembly).
    pub max_reply_size: u32,
    /// Largest DDP-eligible reply item we accept into a write chunk.
    pub max_ddp_size: u32,
    /// RDMA Reads we keep in flight at most (the peer's IRD; CONF_RDMA
    /// `maxrdmaread`, RFC 5666 s6.2). Further reads wait in FIFO order.
    pub max_rdma_read: u32,
    /// RDMA Reads the peer may keep in flight against us (our IRD), as
    /// reported in a CONF_RDMA reply or request (`maxrdmaread`).
    pub inbound_rdma_read: u32,
    /// Answer CONF_RDMA (program 100417) calls in the engine, from this
    /// configuration (RFC 5666 s6), instead of delivering them.
    pub serve_conf_rdma: bool,
    /// Extensions we advertise in a CONF_RDMA version 2 exchange
    /// (docs/EXTENSIONS.md). The engine implements
    /// [`Extensions::RESPONDER_READ_CHUNKS`],
    /// [`Extensions::REMOTE_INVALIDATE`] and
    /// [`Extensions::MESSAGE_CONTINUATION`]; other bits are ignored.
    /// Default: none (plain Version One).
    pub extensions: Extensions,
    /// With [`Extensions::MESSAGE_CONTINUATION`]: the most transmissions
    /// of one group we accept (our Request Transmission Receive Limit,
    /// rtrext s8.4) and send (our Response Transmission Send Limit,
    /// s8.5). Each requester and responder slot then owns a group buffer
    /// of this many Sends (`inline_send_size` each). 1..=64; the default,
    /// 17, carries a 64 KiB argument or result plus its RPC header in
    /// 4 KiB Sends.
    pub max_group_transmissions: u32,
    /// With [`Extensions::MESSAGE_CONTINUATION`] on a requester with
    /// receives of its own: receives posted beyond the others, for the
    /// later transmissions of replies (rtrext s4.3). A call reserves
    /// what its longest reply needs (`optxrq_rsbuf`) or, if too few are
    /// free, offers a reply chunk as without the extension.
    pub continuation_receives: u32,
    /// A transmission group that stops arriving is dropped after this
    /// long (its slot and credits come back; a call of ours fails).
    pub group_timeout: Duration,
    /// With message continuation in use: the largest DDP-eligible
    /// argument or result that goes in a call's or reply's Sends instead
    /// of a read or write chunk (0: never). A group saves the chunk's
    /// round trip but costs a Send per `inline_send_size` bytes, which
    /// outweighs the round trip beyond a few Sends where a round trip is
    /// cheap (docs/BENCHMARKS.md, "Message continuation").
    pub continuation_ddp_max: u32,
    /// With send-based placement in use: ask for a call's DDP-eligible
    /// result placed in our receive buffers' target segments (rtrext
    /// s7.4, TBSN) instead of written by RDMA into our memory (EXRW).
    /// Off by default: the RDMA Write adds no round trip (the reply's
    /// Send follows it on the same connection) and measured faster than
    /// the extra Sends on both soft providers (docs/BENCHMARKS.md,
    /// "Send-based placement"); placing saves exposing our memory.
    pub place_results: bool,
    /// Responder-provided read chunks are in use from the start, because
    /// both peers agreed out of band (otherwise a CONF_RDMA v2 exchange
    /// turns them on, see [`Connection::negotiated`]). Then a reply that
    /// fits neither inline nor in a reply chunk is exposed in a
    /// position-zero read chunk and released by RDMA_DONE, and replies
    /// carrying such a chunk are pulled (draft-lever s4).
    pub reply_read_chunks: bool,
    /// Replies exposed in read chunks at once at most; each reserves one
    /// receive buffer for its RDMA_DONE.
    pub max_reply_read_chunks: u32,
    /// How long an exposed reply waits for RDMA_DONE before its memory is
    /// withdrawn (RFC 5666 s3.8, s11).
    pub done_timeout: Duration,
    /// Buffers for RDMA_ERROR and RDMA_DONE messages; an error reply finding none free is
    /// dropped and counted.
    pub error_buffers: u32,
    /// Calls not answered this long after [`Connection::send_call`] fail
    /// with [`CallFailure::Timeout`].
    pub call_timeout: Option<Duration>,
    /// Chunk-list limits applied when parsing the peer's headers.
    pub limits: Limits,
    /// Bytes of application memory in the connection's registered memory
    /// (0: none): ranges of it serve as write-chunk targets and read-chunk
    /// sources of calls ([`AppChunks`]), registered once with the
    /// connection.
    pub app_memory: u32,
    /// Close the connection after this long without a received message
    /// while nothing is in flight (no call being served, none of ours
    /// outstanding). `None` (the default): never. A server sets it so
    /// that peers that vanished without a word (a crashed RoCE client
    /// sends no disconnect, and a server that only answers never notices)
    /// do not hold their connection's memory forever.
    pub idle_timeout: Option<Duration>,
    /// Receives come from a shared receive queue that the connection's
    /// owner keeps posted (docs/WORKER.md, "Shared receives"): the
    /// connection posts none of its own and gets each message's buffer
    /// lent through [`Connection::handle_shared_recv`], to give back
    /// through [`Connection::poll_released_recv`]. The grant is still
    /// `credits`; the owner's queue, not the connection, backs it.
    pub shared_receives: bool,
}

impl Config {
    /// Receives that back the connection: every call the peer may send
    /// within its grant, a reply to each of our calls, and an RDMA_DONE
    /// for each reply we may have exposed in a read chunk.
    pub fn max_receives(&self) -> u32 {
        self.credits
            + self.max_outstanding_calls
            + self.replies_exposed_at_most()
            + self.reply_continuation_receives()
    }

    /// Whether message continuation may be used: configured (it is then
    /// advertised; the peer's advertisement decides, `negotiated`).
    pub fn may_continue(&self) -> bool {
        self.extensions.contains(Extensions::MESSAGE_CONTINUATION)
    }

    /// Receives kept for the later transmissions of replies
    /// ([`Config::continuation_receives`]): only on a requester with
    /// receives of its own that may use message continuation.
    pub fn reply_continuation_receives(&self) -> u32 {
        if self.may_continue() && self.max_outstanding_calls > 0 && !self.shared_receives {
            self.continuation_receives
        } else {
            0
        }
    }

    /// Bytes of the group buffer each slot owns: room for
    /// `max_group_transmissions` Sends when message continuation may be
    /// used, else none.
    pub(crate) fn group_buffer_len(&self) -> u32 {
        if self.may_continue() {
            // Each Send starts 4-aligned in the buffer.
            self.max_group_transmissions
                .saturating_mul(self.inline_send_size.next_multiple_of(4))
        } else {
            0
        }
    }

    /// Replies this side may have exposed in read chunks at once:
    /// `max_reply_read_chunks` when responder-provided read chunks may be
    /// used (configured, or offered for CONF_RDMA v2 negotiation), else 0.
    /// Sizes the receives kept for RDMA_DONE, the key windows and the
    /// work-request queue.
    pub fn replies_exposed_at_most(&self) -> u32 {
        if self.reply_read_chunks || self.extensions.contains(Extensions::RESPONDER_READ_CHUNKS) {
            self.max_reply_read_chunks
        } else {
            0
        }
    }

    /// Whether a connection with this configuration may lease from a bulk
    /// pool: only if it never exposes its replies (responder-provided
    /// read chunks), since pool buffers are never exposed
    /// (`engine::bulk`).
    pub fn may_lease_bulk(&self) -> bool {
        self.replies_exposed_at_most() == 0
    }

    /// Responder slots a connection keeps: the grant, room for replies
    /// whose completions are still due while the peer already sent the
    /// calls their credits allow, and the replies that may be exposed
    /// waiting for RDMA_DONE. A call within the grant that finds every
    /// slot busy waits for one (parked), it is not refused; each slot
    /// costs a Send buffer, a message buffer and about 1 KiB of heap, so
    /// slots are memory on every idle connection. The room is a quarter
    /// of the grant (at least 2) with receives of its own; 2 on shared
    /// receives, where a grant is also cut to the connection's share of
    /// the worker's queue and a waiting call keeps its receive reserved.
    pub fn responder_slots(&self) -> u32 {
        let room = if self.shared_receives {
            2
        } else {
            (self.credits / 4).max(2)
        };
        self.credits + room + self.replies_exposed_at_most()
    }

    /// Takes the peer's inline sizes and its remote-invalidation flag from
    /// its RFC 8797 connection private data (use
    /// [`PrivateData::parse_or_default`] so that a peer without valid
    /// private data counts as 1024 bytes each way, no remote invalidation).
    pub fn with_peer_private_data(mut self, pd: &PrivateData) -> Config {
        self.peer_inline_recv_size = pd.max_recv_size;
        self.peer_inline_send_size = pd.max_send_size;
        self.peer_remote_invalidate = pd.remote_invalidate;
        self
    }
}

impl Default for Config {
    /// Defaults as Linux xprtrdma/svcrdma use them: 4 KiB inline thresholds, a peer
    /// assumed at 1024 until it says otherwise, 32 credits, 16 Reads.
    fn default() -> Self {
        Config {
            inline_recv_size: 4096,
            inline_send_size: 4096,
            peer_inline_recv_size: DEFAULT_INLINE_SIZE,
            peer_inline_send_size: DEFAULT_INLINE_SIZE,
            peer_remote_invalidate: false,
            credits: 32,
            max_outstanding_calls: 32,
            max_call_size: 1 << 20,
            max_reply_size: 1 << 20,
            max_ddp_size: 1 << 20,
            max_rdma_read: 16,
            inbound_rdma_read: 16,
            serve_conf_rdma: true,
            extensions: Extensions::EMPTY,
            max_group_transmissions: 17,
            continuation_receives: 32,
            group_timeout: Duration::from_secs(1),
            continuation_ddp_max: 16 * 1024,
            place_results: false,
            reply_read_chunks: false,
            max_reply_read_chunks: 8,
            done_timeout: Duration::from_secs(1),
            error_buffers: 4,
            call_timeout: None,
            limits: Limits::DEFAULT,
            app_memory: 0,
            idle_timeout: None,
            shared_receives: false,
        }
    }
}

/// Why [`Connection::new`] refused a [`Config`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// Inline sizes must be at least 1024 bytes (RFC 5666 s6.1, RFC 8797).
    #[error("inline sizes must be at least 1024 bytes (inline_recv_size, inline_send_size, peer_inline_*_size)")]
    InlineTooSmall,
    /// `credits` and `error_buffers` must be at least 1 and at most 4096,
    /// `max_outstanding_calls` at most 4096.
    #[error(
        "credits and error_buffers must be between 1 and 4096, max_outstanding_calls at most 4096"
    )]
    BadCount,
    /// Message sizes must be multiples of 4 (XDR) and at least 32 bytes.
    #[error("max_call_size, max_reply_size must be multiples of 4 and at least 32; max_ddp_size a multiple of 4")]
    BadMessageSize,
    /// [`Connection::with_memory`] got less memory than
    /// [`Connection::memory_len`].
    #[error(
        "memory for the connection's buffers too small: {} private and {} peer bytes needed",
        needed.private,
        needed.peer
    )]
    MemoryTooSmall {
        /// Bytes needed in each region.
        needed: MemoryLen,
    },
    /// The memory for the buffers could not be allocated.
    #[error("cannot allocate the connection's buffer memory")]
    OutOfMemory,
    /// The slab would exceed the address space.
    #[error("buffer memory for this configuration exceeds the address space")]
    TooMuchMemory,
    /// [`Connection::with_bulk_pool`] for a configuration that may expose
    /// its replies in read chunks (pool buffers are never exposed).
    #[error("a connection that may expose its replies (reply_read_chunks, RESPONDER_READ_CHUNKS) cannot lease from a bulk pool")]
    BulkPoolWithExposedReplies,
    /// The bulk pool's buffers are smaller than `max_call_size` or
    /// `max_reply_size`.
    #[error(
        "bulk pool buffers of {buf_len} bytes are smaller than max_call_size or max_reply_size"
    )]
    BulkPoolTooSmall {
        /// The pool's buffer length.
        buf_len: u32,
    },
    /// A credit pool was given to a connection without
    /// [`Config::shared_receives`].
    #[error("a credit pool backs shared receives only (Config::shared_receives)")]
    CreditPoolWithoutSharedReceives,
    /// The shared receive queue has no receive left to back one more
    /// connection's minimum grant.
    #[error("no shared receive left to back one more connection (raise the shared receive queue)")]
    NoReceiveCredit,
}

/// Handle of one of our outgoing calls (requester side). Stale once the
/// slot is recycled: accessors then return `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CallHandle {
    index: u32,
    generation: u32,
}

impl CallHandle {
    /// The requester slot the call occupies, below
    /// `max_outstanding_calls`: a caller can keep per-call state in an
    /// array indexed by it (no map, no allocation).
    pub fn slot(&self) -> usize {
        self.index as usize
    }
}

/// Handle of a call the peer sent us (responder side), to answer with
/// [`Connection::send_reply`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IncomingCall {
    index: u32,
    generation: u32,
}

/// A DDP-eligible item of an RPC message (RFC 5666 s3.4; which items are
/// eligible is the upper-layer binding's decision, e.g. RFC 8267): the
/// data of one variable-length opaque. `offset` is where its data starts
/// in the message (after its length word, so a multiple of 4); the message
/// holds the `len` data bytes and their XDR padding.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DdpItem {
    /// Offset of the first data byte in the XDR stream (a multiple of 4).
    pub offset: u32,
    /// Data length in bytes, without XDR padding.
    pub len: u32,
}

/// The most DDP items one reply places; later ones travel in place.
/// NFSv4 COMPOUNDs carry a few READs at most, and Linux sends one write
/// chunk.
pub const MAX_DDP_ITEMS: usize = 8;

/// Up to [`MAX_DDP_ITEMS`] DDP items of one message, in message order,
/// held without allocation (an upper-layer binding's answer for a reply).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DdpItems {
    items: [DdpItem; MAX_DDP_ITEMS],
    len: u8,
}

impl DdpItems {
    /// No item.
    pub const NONE: DdpItems = DdpItems {
        items: [DdpItem { offset: 0, len: 0 }; MAX_DDP_ITEMS],
        len: 0,
    };

    /// One item.
    pub fn one(item: DdpItem) -> DdpItems {
        let mut l = DdpItems::NONE;
        l.push(item);
        l
    }

    /// Appends `item`; false (nothing changes) when full.
    pub fn push(&mut self, item: DdpItem) -> bool {
        let Some(slot) = self.items.get_mut(usize::from(self.len)) else {
            return false;
        };
        *slot = item;
        self.len += 1;
        true
    }

    /// The items, in the order they were pushed.
    pub fn as_slice(&self) -> &[DdpItem] {
        &self.items[..usize::from(self.len)]
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// What the requester expects back, so it can provide chunks (RFC 5666
/// s3.4, s5.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplyExpect {
    /// Upper bound of the whole reply message in bytes (including any DDP
    /// item). When the reply could exceed our inline receive size, a reply
    /// chunk of this size is provided.
    pub max_len: u32,
    /// Upper bound of a DDP-eligible result: when set, a write chunk of
    /// this size is provided.
    pub ddp_max: Option<u32>,
}

/// An outgoing call.
#[derive(Debug, Clone, Copy)]
pub struct OutgoingCall<'a> {
    /// The whole RPC call message (RFC 5531 header and arguments), XDR.
    /// Its XID (first word) is the transport header's XID.
    pub message: &'a [u8],
    /// A DDP-eligible argument, moved by a read chunk when the call does
    /// not fit inline.
    pub ddp: Option<DdpItem>,
    /// What the reply may look like.
    pub reply: ReplyExpect,
    /// Chunks in the connection's application memory instead of the call
    /// slot's own buffers (directed operations, docs/CLIENT.md).
    pub app: AppChunks,
}

/// A byte range of the connection's application memory
/// ([`Config::app_memory`], [`Connection::app_memory`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppSlice {
    /// Offset in the application memory.
    pub offset: u32,
    /// Length in bytes.
    pub len: u32,
}

/// Where a call's chunks live when the application provides them: the
/// registered memory is reused by every call, so nothing is registered
/// or copied per call (the Sun NFS/RDMA paper's s9.2 wish).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AppChunks {
    /// Write chunk target (RFC 5666 s3.6): the responder RDMA-writes the
    /// reply's DDP-eligible result here. Replaces `reply.ddp_max`.
    pub write: Option<AppSlice>,
    /// Read chunk source (RFC 5666 s3.4): the bytes of the call's DDP item
    /// ([`OutgoingCall::ddp`]), which are then *not* in `message`: the
    /// message holds everything before the item's data (up to and
    /// including its length word) followed by everything after its data
    /// and padding, exactly what travels inline (s3.7).
    pub read: Option<AppSlice>,
}

impl AppChunks {
    /// No application memory: the slot's buffers, as before.
    pub const NONE: AppChunks = AppChunks {
        write: None,
        read: None,
    };
}

/// An outgoing reply.
#[derive(Debug, Clone, Copy)]
pub struct OutgoingReply<'a> {
    /// The whole RPC reply message, XDR; its XID must be the call's.
    pub message: &'a [u8],
    /// The DDP-eligible results, in message order: the Nth is
    /// RDMA-written into the call's Nth write chunk (RFC 5666 s3.6: each
    /// decoded result consumes the next entry of the write list; RFC 8267
    /// s5 pairs them with an NFSv4 COMPOUND's READ-like operations). One
    /// whose chunk is missing or empty, or beyond [`MAX_DDP_ITEMS`], is
    /// returned in place.
    pub ddp: &'a [DdpItem],
}

/// Why one call failed. The connection may stay up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallFailure {
    /// The peer answered RDMA_ERROR / ERR_VERS with its supported range.
    PeerVersionError {
        /// Lowest version the peer supports.
        low: u32,
        /// Highest version the peer supports.
        high: u32,
    },
    /// The peer answered RDMA_ERROR / ERR_CHUNK.
    PeerChunkError,
    /// The peer answered RDMA_ERROR with another code.
    PeerError {
        /// The code.
        code: u32,
    },
    /// The reply broke a protocol rule (bad header, XID mismatch, a chunk
    /// we did not offer or longer than offered).
    MalformedReply,
    /// The reply used a feature we did not advertise (RDMA_MSGP, a read
    /// list in a reply).
    UnsupportedReply,
    /// The reply is larger than `max_reply_size`.
    ReplyTooLarge,
    /// No reply within `call_timeout`. Every key the call advertised is
    /// invalidated at once (a late RDMA Write or Read fails at the
    /// provider); the slot stays reserved (the credit is still in use)
    /// until the reply arrives or the connection closes.
    Timeout,
    /// The connection closed before the reply arrived.
    ConnectionLost,
    /// No key window was free to expose the call's chunks under (fewer
    /// windows than `Connection::max_exposures` were given).
    NoKeyWindow,
    /// The peer reported an error in the transmissions of the call or of
    /// its reply (rtrext s9.5 Report Error, `code` its `optr_err`), or
    /// the reply's transmission group broke off.
    TransmissionError {
        /// The `optr_err` code (rtrext s9.5); 0 for a group that broke
        /// off here.
        code: u32,
    },
}

/// What a peer told us about itself (RFC 8797 private data, CONF_RDMA
/// reply, RFC 5666 s6.2); see [`Connection::set_peer_limits`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerLimits {
    /// Largest Send the peer receives (CONF_RDMA `maxcall_sendsize` when
    /// the peer is the server).
    pub inline_recv_size: u32,
    /// Largest Send the peer posts.
    pub inline_send_size: u32,
    /// RDMA Reads we may have in flight against the peer.
    pub max_rdma_read: u32,
}

/// Why the connection closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// [`Connection::close`] was called.
    Local,
    /// The peer sent more calls than we granted credits (RFC 5666 s3.3).
    CreditOverrun,
    /// A work request completed with an error: the queue pair is dead.
    TransportError(WcStatus),
    /// Nothing was received and nothing was in flight for
    /// [`Config::idle_timeout`].
    Idle,
    /// The peer disconnected in order (the provider saw a CM DREQ or a
    /// close): the end of the connection, not an error.
    PeerDisconnected,
}

/// What the engine tells the application.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A call arrived and is complete (read chunks pulled and spliced):
    /// read it with [`Connection::call_message`], answer it with
    /// [`Connection::send_reply`].
    CallArrived {
        /// Handle for the answer.
        call: IncomingCall,
        /// RPC XID.
        xid: u32,
        /// RPC program number.
        program: u32,
        /// Program version.
        version: u32,
        /// Procedure number.
        procedure: u32,
        /// Length of the reassembled call message.
        len: u32,
    },
    /// The reply to one of our calls arrived: read it with
    /// [`Connection::reply_message`] / [`Connection::reply_ddp`], then
    /// [`Connection::release_reply`].
    ReplyArrived {
        /// The call answered.
        call: CallHandle,
        /// RPC XID.
        xid: u32,
        /// Length of the reply message (without a DDP item moved by a
        /// write chunk).
        len: u32,
        /// Bytes the responder wrote into our write chunk, if it used it.
        ddp_len: Option<u32>,
    },
    /// One of our calls failed; its handle is no longer valid.
    CallFailed {
        /// The call.
        call: CallHandle,
        /// RPC XID.
        xid: u32,
        /// Why.
        reason: CallFailure,
    },
    /// The connection closed. Outstanding calls fail with
    /// [`CallFailure::ConnectionLost`]; pending completions still drain.
    ConnectionLost {
        /// Why.
        reason: CloseReason,
    },
}

/// Why [`Connection::send_call`] refused a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SendCallError {
    /// The connection is closed.
    #[error("connection closed")]
    Closed,
    /// Every requester slot is in use (back-pressure: retry after a reply).
    #[error("no free call slot")]
    NoSlot,
    /// The message is not an RPC call (no XID / not direction CALL).
    #[error("message is not an RPC call")]
    NotACall,
    /// The message is larger than `max_call_size`, or even a long call's
    /// transport header does not fit the peer's inline size.
    #[error("call larger than max_call_size")]
    TooLarge,
    /// The DDP item lies outside the message, is misaligned, or its XDR
    /// length word does not hold `len`.
    #[error("DDP item outside the message, misaligned or not matching its length word")]
    BadDdpItem,
    /// `reply.max_len` exceeds `max_reply_size` or `reply.ddp_max` exceeds
    /// `max_ddp_size`.
    #[error("expected reply larger than the configured maximum")]
    ReplyTooLarge,
    /// An [`AppChunks`] range lies outside the connection's application
    /// memory (or it has none).
    #[error("application memory range outside the connection's app_memory")]
    BadAppSlice,
}

/// Why [`Connection::send_reply`] refused a reply. The call stays
/// answerable except after [`ReplyError::Closed`] / [`ReplyError::StaleHandle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReplyError {
    /// The connection is closed (the call is gone).
    #[error("connection closed")]
    Closed,
    /// The handle does not name a call waiting for its reply.
    #[error("stale call handle")]
    StaleHandle,
    /// The message is not an RPC reply carrying the call's XID.
    #[error("message is not the reply to this call")]
    NotTheReply,
    /// The reply fits neither inline nor in the call's reply chunk (RFC
    /// 5666 s3.4: answer with a short error reply instead).
    #[error("reply fits neither inline nor in the reply chunk")]
    TooLarge,
    /// The DDP item is larger than the call's write chunk.
    #[error("DDP item larger than the write chunk")]
    DdpTooLarge,
    /// No key window was free to expose the reply in a read chunk under
    /// (fewer windows than `Connection::max_exposures` were given).
    #[error("no key window free to expose the reply")]
    NoKeyWindow,
    /// The DDP item lies outside the message, is misaligned, or its XDR
    /// length word does not hold `len`.
    #[error("DDP item outside the message, misaligned or not matching its length word")]
    BadDdpItem,
}

/// Checks a DDP item against its message: aligned, after at least a
/// length word that holds `len` (the XDR count the peer cross-checks the
/// chunk length against, RFC 5666 s3.4), data and padding inside it.
fn ddp_item_fits(item: &DdpItem, msg: &[u8]) -> bool {
    let end = u64::from(item.offset) + crate::wire::xdr::roundup(item.len as usize) as u64;
    app_ddp_item_fits(item, msg) && end <= msg.len() as u64
}

/// [`ddp_item_fits`] for each of `items`, and each one's data and
/// padding ending before the next one's length word.
fn ddp_items_fit(items: &[DdpItem], msg: &[u8]) -> bool {
    items.iter().all(|d| ddp_item_fits(d, msg))
        && items.windows(2).all(|w| {
            let end = u64::from(w[0].offset) + roundup4(u64::from(w[0].len));
            end + 4 <= u64::from(w[1].offset)
        })
}

/// [`ddp_item_fits`] for an item whose data is not in `msg`
/// ([`AppChunks::read`]): aligned, its length word (holding `len`) ends at
/// `item.offset`, where the data would start, and the rest of the message
/// follows.
fn app_ddp_item_fits(item: &DdpItem, msg: &[u8]) -> bool {
    item.offset % 4 == 0
        && item.offset >= 4
        && item.offset as usize <= msg.len()
        && msg[item.offset as usize - 4..item.offset as usize] == item.len.to_be_bytes()
}

/// `len` rounded up to a multiple of 4 (`wire::xdr::roundup`), in `u64`
/// for peer-supplied chunk lengths (saturating, never overflows).
fn roundup4(len: u64) -> u64 {
    crate::wire::xdr::roundup(usize::try_from(len).unwrap_or(usize::MAX)) as u64
}
