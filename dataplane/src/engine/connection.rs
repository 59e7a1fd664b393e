//! The [`Connection`]: construction, the input dispatch (`handle_*`), the
//! outputs (`poll_*`), closing and the leak check. The requester and
//! responder halves live in `requester.rs` and `responder.rs`.

use std::collections::VecDeque;
use std::sync::Arc;

use super::buffers::{
    Access, BufClass, BufId, BufferTable, BufferTableBuilder, LocalSlice, MemoryLen, PeerMemory,
    SlabMemory,
};
use super::bulk::BulkPool;
use super::requester::{CallSlot, CallState, XidIndex};
use super::responder::{ServeSlot, ServeState};
use super::time::{Instant, Timer, TimerTable};
use super::wr::{WcStatus, WorkRequest, WrId, WrKind};
use super::{CloseReason, Config, ConfigError, Event, Extensions, PeerLimits};
use crate::mem::Buf;
use crate::wire::rpc::{peek_direction, MessageType};
use crate::wire::rpcrdma::{
    Decoded, ErrorBody, HeaderView, Limits, MessageBody, TransportHeader, RPCRDMA_VERSION,
};

/// Counters of everything the engine dropped, refused or noticed. Data-path
/// errors are cheap values counted here.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Calls posted (Send of a call).
    pub calls_sent: u64,
    /// Replies matched to our calls.
    pub replies_received: u64,
    /// Calls complete and accepted: delivered to the application, or
    /// answered by the engine (CONF_RDMA).
    pub calls_received: u64,
    /// Replies posted.
    pub replies_sent: u64,
    /// RDMA_ERROR / ERR_VERS sent.
    pub err_vers_sent: u64,
    /// RDMA_ERROR / ERR_CHUNK sent.
    pub err_chunk_sent: u64,
    /// RDMA_ERROR replies not sent because no error buffer was free.
    pub error_replies_dropped: u64,
    /// Completions whose id is unknown, stale (generation mismatch) or
    /// duplicated: dropped.
    pub stale_completions: u64,
    /// Calls the peer sent beyond our grant (each closes the connection).
    pub credit_overruns: u64,
    /// Connections closed by [`super::Config::idle_timeout`] (0 or 1).
    pub idle_closes: u64,
    /// Replies and errors whose XID matches none of our calls: dropped.
    pub unmatched_replies: u64,
    /// Replies to calls that had already timed out: dropped.
    pub late_replies: u64,
    /// CONF_RDMA calls the engine answered itself (RFC 5666 s6).
    pub conf_rdma_answered: u64,
    /// RDMA_DONE matching none of our exposed replies: dropped.
    pub done_ignored: u64,
    /// Exposures refused because every key window was bound (the
    /// exchange failed; a sizing bug, since there are
    /// `Connection::max_exposures` windows).
    pub key_windows_exhausted: u64,
    /// Send With Invalidate naming a key of none of our exposures (with
    /// key windows; with region keys the peer would have killed the
    /// region's key, and the connection fails at its next access).
    pub unknown_remote_invalidations: u64,
    /// RDMA_DONE that released an exposed reply.
    pub done_received: u64,
    /// RDMA_DONE sent after pulling a reply's read chunk.
    pub done_sent: u64,
    /// Exposed replies withdrawn by the reclaim timer, without RDMA_DONE.
    pub done_timeouts: u64,
    /// Replies we exposed in a read chunk (responder side).
    pub replies_exposed: u64,
    /// Replies we pulled from a read chunk (requester side).
    pub replies_pulled: u64,
    /// Replies carrying a read list although responder-provided read
    /// chunks were not negotiated (RFC 8166 forbids them): the call
    /// failed, no RDMA_DONE was sent.
    pub unnegotiated_read_list_replies: u64,
    /// CONF_RDMA calls refused (PROC_UNAVAIL) because another call came
    /// first on the connection.
    pub conf_rdma_refused: u64,
    /// Calls that waited for a responder slot (their receive held).
    pub calls_parked: u64,
    /// Messages that arrived in shared receives beyond every grant the
    /// peer was given (their receives were not backed).
    pub beyond_grant: u64,
    /// Times a call found the bulk pool empty and waited (its receive
    /// held; counted again at each retry).
    pub bulk_pool_empty: u64,
    /// Messages shorter than the four fixed header words: dropped (there
    /// is no XID to answer).
    pub runts_dropped: u64,
    /// Receives reporting more bytes than the buffer holds: dropped.
    pub bad_recv_len: u64,
    /// Highest number of peer calls in progress at once.
    pub max_active_calls: u32,
    /// Highest number of our calls (and RDMA_DONEs, which take a credit)
    /// outstanding at once.
    pub max_outstanding_calls: u32,
    /// Highest number of RDMA Reads in flight at once.
    pub max_reads_in_flight: u32,
    /// Our calls sent with a read chunk (the peer pulls it: a round trip
    /// more than the call's Send).
    pub calls_pulled: u64,
    /// Our calls sent as a transmission group of more than one Send
    /// (rtrext s4), and replies we sent so.
    pub call_groups_sent: u64,
    /// Replies sent as a transmission group of more than one Send.
    pub reply_groups_sent: u64,
    /// Calls received as a transmission group of more than one Send.
    pub call_groups_received: u64,
    /// Replies received as a transmission group of more than one Send.
    pub reply_groups_received: u64,
    /// Report Error operations sent (rtrext s9.5), one per error found in
    /// the peer's transmissions.
    pub transmission_errors_sent: u64,
    /// Report Error operations received.
    pub transmission_errors_received: u64,
    /// Transmission groups dropped unfinished: broken off by another
    /// message, a bad transmission, the group timeout or the close.
    pub groups_dropped: u64,
    /// DDP-eligible items we sent placed by Send into the peer's target
    /// buffer segments (rtrext s7.3): call arguments and reply results.
    pub items_placed_sent: u64,
    /// Placed items we received and put back into their message.
    pub items_placed_received: u64,
}

/// Resources in use, for the leak check: after [`Connection::close`] and
/// the flush of every posted work request, all of it is zero
/// ([`Resources::is_idle`]) unless the application still holds a reply it
/// has not released.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Resources {
    /// Receive buffers posted (or queued for posting).
    pub recvs_posted: u32,
    /// Requester slots not free (including replies not yet released).
    pub call_slots_busy: u32,
    /// Responder slots not free.
    pub serve_slots_busy: u32,
    /// RDMA_ERROR buffers in flight.
    pub error_sends_busy: u32,
    /// RDMA Reads in flight.
    pub reads_in_flight: u32,
    /// Buffers exposed to the peer for RDMA.
    pub buffers_exposed: u32,
    /// Key binds and invalidations queued or posted, not yet completed.
    pub key_ops_in_flight: u32,
    /// Bulk pool buffers leased (`engine::bulk`).
    pub bulk_leased: u32,
    /// Shared receives lent to the connection and not yet given back.
    pub shared_recvs_held: u32,
}

/// A call kept for a free responder slot (or a bulk buffer), with its
/// receive: one of the connection's own (by index), or a shared one.
#[derive(Debug)]
pub(super) enum Parked {
    Own { index: u32, len: u32 },
    Shared { buf: Buf, len: u32 },
}

/// Where a received message is.
#[derive(Clone, Copy)]
pub(super) enum Received<'a> {
    /// In one of the connection's own receive buffers.
    Own(BufId),
    /// In a shared receive lent by the connection's owner.
    Shared(&'a Buf),
}

impl Resources {
    /// True when nothing at all is in use.
    pub fn is_idle(&self) -> bool {
        *self == Resources::default()
    }
}

#[derive(Debug, Clone, Copy)]
pub(super) struct RecvBuf {
    pub(super) buf: BufId,
    pub(super) generation: u32,
    pub(super) posted: bool,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct ErrBuf {
    pub(super) buf: BufId,
    pub(super) generation: u32,
    pub(super) busy: bool,
}

/// One RDMA Read to issue: a peer segment and where its bytes go.
#[derive(Debug, Clone, Copy)]
pub(super) struct PendingRead {
    pub(super) seg: crate::wire::rpcrdma::Segment,
    pub(super) dest: u32,
}

/// Whose Reads a read FIFO entry holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ReadOwner {
    /// A responder slot pulling a call's read chunks.
    Serve(u32),
    /// A requester slot pulling a reply's read chunk.
    Call(u32),
}

/// What became of a received message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Disposition {
    /// Handled; the receive buffer can be reposted.
    Done,
    /// A valid call within the grant found no free responder slot: keep
    /// the receive buffer and process it again when a slot frees.
    Park,
}

/// One RPC-over-RDMA connection, both directions (module docs).
#[derive(Debug)]
pub struct Connection {
    pub(super) config: Config,
    pub(super) closed: Option<CloseReason>,
    pub(super) bufs: BufferTable,
    /// The application memory ([`Config::app_memory`]), if any.
    pub(super) app_buf: Option<BufId>,
    /// When a message last arrived (or the idle clock started).
    pub(super) last_activity: Instant,
    /// Scratch for the header being parsed; reused, never reallocated.
    pub(super) rx_hdr: TransportHeader,
    /// The private copy of the message being processed
    /// ([`BufClass::RecvCopy`]): a receive buffer is peer memory, read
    /// once into this buffer, and everything after parses the copy, so a
    /// peer that rewrites the receive buffer later changes nothing.
    pub(super) rx_copy: BufId,
    /// Key binds and invalidations queued and not yet completed.
    pub(super) key_ops_posted: u64,
    /// Scratch for the header being built.
    pub(super) tx_hdr: TransportHeader,
    pub(super) recvs: Vec<RecvBuf>,
    pub(super) err_bufs: Vec<ErrBuf>,
    pub(super) err_free: Vec<u32>,
    // Requester side.
    pub(super) calls: Vec<CallSlot>,
    pub(super) call_free: Vec<u32>,
    /// Where a reply's XID is looked up first (`requester::XidIndex`).
    pub(super) call_by_xid: XidIndex,
    /// Calls encoded and waiting for a credit, in order.
    pub(super) call_queue: VecDeque<u32>,
    /// The peer's latest grant (RFC 5666 s3.3); 1 until the first reply.
    pub(super) granted: u32,
    /// Our calls sent and not yet answered.
    pub(super) outstanding: u32,
    // Responder side.
    pub(super) serves: Vec<ServeSlot>,
    pub(super) serve_free: Vec<u32>,
    /// Slots with RDMA Reads still to issue, oldest first (both halves
    /// share `max_rdma_read`).
    pub(super) read_fifo: VecDeque<ReadOwner>,
    /// RDMA_DONEs to send (XIDs), waiting for a credit or a control buffer.
    pub(super) done_queue: VecDeque<u32>,
    /// Replies exposed in read chunks, waiting for RDMA_DONE.
    pub(super) dones_pending: u32,
    /// Extensions in use on this connection (both peers advertised them).
    pub(super) negotiated: Extensions,
    /// A call from the peer was delivered: CONF_RDMA is no longer accepted
    /// (RFC 5666 s6.1: it is the first call on a connection).
    pub(super) first_call_delivered: bool,
    pub(super) reads_in_flight: u32,
    /// The serve slots' lists have their usual room (the first chunked
    /// call gave it to all of them; `Connection::warm_slot_lists`).
    pub(super) slot_lists_warm: bool,
    /// Peer calls received and not yet answered (counted against the grant).
    pub(super) active_calls: u32,
    /// Calls that wait for a responder slot (or a bulk buffer) with their
    /// receives, oldest first.
    pub(super) parked: VecDeque<Parked>,
    /// Shared receives done with, for the owner to post again.
    released: VecDeque<Buf>,
    /// The shared receives reserved for our grants
    /// ([`Connection::use_credit_pool`]).
    backing: Option<super::credits::Backing>,
    // Outputs.
    pub(super) tx: VecDeque<WorkRequest>,
    pub(super) events: VecDeque<Event>,
    pub(super) timers: TimerTable,
    pub(super) stats: Stats,
    /// Padding of messages received in RDMA_MSGP (`msgp.rs`).
    pub(super) msgp: super::msgp::MsgpState,
    /// The transmission group being received (`continuation.rs`).
    pub(super) rx_group: Option<super::continuation::RxGroup>,
    /// Scratch for an RDMA_OPTIONAL header being parsed; reused.
    pub(super) opt_hdr: crate::wire::rtrext::OptionalHeader,
    /// The peer's Request Transmission Receive Limit (rtrext s8.4): the
    /// longest call group it accepts; 1 until CONF_RDMA v2 says more.
    pub(super) peer_group_recv_limit: u32,
    /// The peer's Response Transmission Send Limit (rtrext s8.5).
    pub(super) peer_group_send_limit: u32,
    /// Continuation receives ([`Config::continuation_receives`]) no call
    /// has reserved.
    pub(super) cont_recvs_free: u32,
    /// Where placed data may land in our receive buffers and in the
    /// peer's (rtrext s7.2, s8.3; `placement.rs`).
    pub(super) our_targets: super::placement::TargetLayout,
    pub(super) peer_targets: super::placement::TargetLayout,
    /// The placed items of the group being received, checked against
    /// `our_targets` at its first transmission, and their segment numbers.
    pub(super) rx_spans: [super::placement::ItemSpan; super::MAX_DDP_ITEMS],
    pub(super) rx_n_spans: usize,
    pub(super) rx_numbers: [u32; super::placement::MAX_ITEM_SEGMENTS],
    /// Scratch for an RDMA_OPTIONAL header with placement being sent.
    pub(super) tx_opt: crate::wire::rtrext::OptionalHeader,
    /// Rkeys for RDMA_DONE as Send With Invalidate (`inval.rs`).
    pub(super) inval: super::inval::DoneInvalidate,
}

/// The chunk lists the scratch headers have room for before they grow:
/// what NFS calls carry (a few reads, a write chunk or two, a reply
/// chunk), not the worst case `Config::limits` allows (about 18 KiB per
/// header at the defaults, twice per idle connection). A header grows
/// within the limits to the largest it has parsed or built, then keeps
/// that capacity: steady state allocates nothing.
const HEADER_START: Limits = Limits {
    max_read_segments: 4,
    max_write_chunks: 2,
    max_segments_per_chunk: 4,
    max_reply_segments: 4,
};

/// Bytes of a control buffer: an RDMA_ERROR header is at most 16 + 4 +
/// 32 bytes, an RDMA_DONE 28, a Report Error (rtrext s9.5) with its lead
/// transmission 68.
const ERROR_BUFFER_LEN: u32 = 96;

/// A connection's buffers and slots, as [`Connection::layout`] cut them.
struct Layout {
    recvs: Vec<RecvBuf>,
    rx_copy: BufId,
    err_bufs: Vec<ErrBuf>,
    calls: Vec<CallSlot>,
    serves: Vec<ServeSlot>,
    /// The application memory, last in the slab.
    app: Option<BufId>,
}

impl Connection {
    /// Builds a connection: allocates its slab, slots and queues once, and
    /// queues a [`WorkRequest::PostRecv`] for every receive buffer (poll
    /// them before connecting, as a verbs consumer pre-posts receives).
    ///
    /// Receive buffers: `credits + max_outstanding_calls` (every call the
    /// peer may send within its grant, plus a reply to each of our calls).
    ///
    /// # Errors
    /// [`ConfigError`] for a configuration outside the documented ranges.
    pub fn new(config: Config) -> Result<Connection, ConfigError> {
        Self::build(config, None, None)
    }

    /// [`Connection::new`] over caller-provided memory (for example
    /// registered arenas of the worker's) of at least
    /// [`Connection::memory_len`] bytes each: `private`, which only this
    /// process writes, and `peer`, which the peer may write
    /// (`engine::buffers` docs). Their contents need not be zeroed.
    ///
    /// # Errors
    /// [`ConfigError`], including [`ConfigError::MemoryTooSmall`].
    pub fn with_memory(
        config: Config,
        private: Box<dyn SlabMemory>,
        peer: Box<dyn PeerMemory>,
    ) -> Result<Connection, ConfigError> {
        Self::build(config, Some((private, peer)), None)
    }

    /// [`Connection::with_memory`] for a connection whose responder slots
    /// own inline-size message buffers only and lease `pool`'s for a call
    /// or reply that needs more, one exchange at a time (`engine::bulk`;
    /// the worker's pool, shared by its connections). The regions need
    /// [`Connection::memory_len_pooled`] bytes. `private` and `peer` may
    /// be `None` for fresh heap regions.
    ///
    /// # Errors
    /// As [`Connection::with_memory`];
    /// [`ConfigError::BulkPoolWithExposedReplies`] if the configuration
    /// may expose replies in read chunks,
    /// [`ConfigError::BulkPoolTooSmall`] if a pool buffer cannot hold
    /// `max_call_size` or `max_reply_size`.
    pub fn with_bulk_pool(
        config: Config,
        memory: Option<(Box<dyn SlabMemory>, Box<dyn PeerMemory>)>,
        pool: Arc<BulkPool>,
    ) -> Result<Connection, ConfigError> {
        if !config.may_lease_bulk() {
            return Err(ConfigError::BulkPoolWithExposedReplies);
        }
        if pool.buf_len() < config.max_call_size.max(config.max_reply_size) {
            return Err(ConfigError::BulkPoolTooSmall {
                buf_len: pool.buf_len(),
            });
        }
        Self::build(config, memory, Some(pool))
    }

    /// Bytes of each region a connection with `config` cuts its buffers
    /// from.
    ///
    /// # Errors
    /// [`ConfigError`] for a configuration `new` would refuse.
    pub fn memory_len(config: &Config) -> Result<MemoryLen, ConfigError> {
        let mut b = BufferTableBuilder::default();
        Self::layout(config, &mut b, false)?;
        Ok(b.total())
    }

    /// [`Connection::memory_len`] of a connection built
    /// [`with_bulk_pool`](Connection::with_bulk_pool): its responder
    /// slots own inline-size buffers only.
    ///
    /// # Errors
    /// As [`Connection::memory_len`].
    pub fn memory_len_pooled(config: &Config) -> Result<MemoryLen, ConfigError> {
        let mut b = BufferTableBuilder::default();
        Self::layout(config, &mut b, true)?;
        Ok(b.total())
    }

    /// Checks `c` and adds every buffer to `b`, in the one fixed order;
    /// `pooled`: responder slots own inline-size message buffers.
    fn layout(c: &Config, b: &mut BufferTableBuilder, pooled: bool) -> Result<Layout, ConfigError> {
        if [
            c.inline_recv_size,
            c.inline_send_size,
            c.peer_inline_recv_size,
            c.peer_inline_send_size,
        ]
        .iter()
        .any(|&s| s < 1024)
        {
            return Err(ConfigError::InlineTooSmall);
        }
        let count_ok = |n: u32| (1..=4096).contains(&n);
        if !count_ok(c.credits)
            || c.max_outstanding_calls > 4096
            || !count_ok(c.error_buffers)
            || !(1..=64).contains(&c.max_group_transmissions)
            || c.continuation_receives > 4096
        {
            return Err(ConfigError::BadCount);
        }
        if c.max_call_size % 4 != 0
            || c.max_reply_size % 4 != 0
            || c.max_ddp_size % 4 != 0
            || c.max_call_size < 32
            || c.max_reply_size < 32
        {
            return Err(ConfigError::BadMessageSize);
        }
        // Receives: every call the peer may send within its grant, a reply
        // to each of our calls, and an RDMA_DONE for each reply we may
        // have exposed in a read chunk.
        let n_recv = if c.shared_receives {
            0
        } else {
            c.max_receives()
        };
        let n_serve = c.responder_slots();
        let serve_message = ServeSlot::message_size(c, pooled);
        let w = u128::from;
        let total: u128 = w(n_recv) * w(c.inline_recv_size)
            + w(c.error_buffers) * ERROR_BUFFER_LEN as u128
            + (w(c.max_outstanding_calls) + w(n_serve)) * w(c.group_buffer_len())
            + w(c.max_outstanding_calls)
                * (w(c.inline_send_size)
                    + w(c.max_call_size)
                    + w(c.max_reply_size)
                    + w(c.max_ddp_size))
            + w(n_serve) * (w(c.inline_send_size) + w(serve_message))
            + w(c.app_memory);
        if total > (isize::MAX as u128) / 2 {
            return Err(ConfigError::TooMuchMemory);
        }

        let recvs: Vec<RecvBuf> = (0..n_recv)
            .map(|_| RecvBuf {
                buf: b.add(BufClass::Recv, c.inline_recv_size),
                generation: 0,
                posted: false,
            })
            .collect();
        let rx_copy = b.add(BufClass::RecvCopy, c.inline_recv_size);
        let err_bufs: Vec<ErrBuf> = (0..c.error_buffers)
            .map(|_| ErrBuf {
                buf: b.add(BufClass::Error, ERROR_BUFFER_LEN),
                generation: 0,
                busy: false,
            })
            .collect();
        let calls: Vec<CallSlot> = (0..c.max_outstanding_calls)
            .map(|_| CallSlot::new(b, c))
            .collect();
        let serves: Vec<ServeSlot> = (0..n_serve)
            .map(|_| ServeSlot::new(b, c, serve_message))
            .collect();
        // Last, so that the other buffers keep their offsets.
        let app = (c.app_memory > 0).then(|| b.add(BufClass::App, c.app_memory));
        Ok(Layout {
            recvs,
            rx_copy,
            err_bufs,
            calls,
            serves,
            app,
        })
    }

    fn build(
        config: Config,
        memory: Option<(Box<dyn SlabMemory>, Box<dyn PeerMemory>)>,
        bulk: Option<Arc<BulkPool>>,
    ) -> Result<Connection, ConfigError> {
        let c = &config;
        let mut b = BufferTableBuilder::default();
        let Layout {
            recvs,
            rx_copy,
            err_bufs,
            calls,
            serves,
            app: app_buf,
        } = Self::layout(c, &mut b, bulk.is_some())?;
        let n_serve = serves.len() as u32;
        // Calls waiting for a slot never outnumber the receives that back
        // the grant, own or shared.
        let n_recv = c.max_receives() as usize;
        let n_calls = calls.len();
        let mut bufs = match memory {
            None => b.build().ok_or(ConfigError::OutOfMemory)?,
            Some((private, peer))
                if private.bytes().len() >= b.total().private && peer.len() >= b.total().peer =>
            {
                b.build_in(private, peer)
            }
            Some(_) => return Err(ConfigError::MemoryTooSmall { needed: b.total() }),
        };
        if let Some(pool) = bulk {
            bufs.set_bulk_pool(pool);
        }

        // Per call slot: its Send, and with key windows up to three binds
        // and three invalidations; per responder slot: its Reads, Writes
        // and Send; per reply exposed in a read chunk, a bind and an
        // invalidation. Sized for the worst case, not grown: how full the
        // queue gets depends on timing (how many completions one poll
        // returns), so growing it on demand would allocate on the data
        // path at a moment no warm-up can fix. An idle connection only
        // touches the entries it uses.
        // With message continuation a slot's Send may be a group of up to
        // `max_group_transmissions` Sends.
        let group_sends = if c.may_continue() {
            c.max_group_transmissions as usize
        } else {
            0
        };
        let mut tx = VecDeque::with_capacity(
            recvs.len()
                + err_bufs.len()
                + calls.len() * (7 + group_sends)
                + serves.len() * (4 + group_sends)
                + 2 * c.replies_exposed_at_most() as usize
                + 64,
        );
        let mut conn_recvs = recvs;
        for (i, r) in conn_recvs.iter_mut().enumerate() {
            r.posted = true;
            tx.push_back(WorkRequest::PostRecv {
                wr_id: WrId {
                    kind: WrKind::Recv,
                    index: i as u32,
                    generation: r.generation,
                },
                buf: r.buf,
            });
        }
        let mut call_free: Vec<u32> = (0..c.max_outstanding_calls).collect();
        call_free.reverse();
        let mut serve_free: Vec<u32> = (0..n_serve).collect();
        serve_free.reverse();
        let mut err_free: Vec<u32> = (0..c.error_buffers).collect();
        err_free.reverse();
        Ok(Connection {
            config,
            closed: None,
            bufs,
            app_buf,
            last_activity: Instant::ZERO,
            rx_hdr: TransportHeader::with_capacity(&HEADER_START),
            rx_copy,
            key_ops_posted: 0,
            tx_hdr: TransportHeader::with_capacity(&HEADER_START),
            recvs: conn_recvs,
            err_bufs,
            err_free,
            call_queue: VecDeque::with_capacity(calls.len()),
            call_by_xid: XidIndex::new(calls.len()),
            calls,
            call_free,
            granted: 1,
            outstanding: 0,
            read_fifo: VecDeque::with_capacity(serves.len() + n_calls),
            done_queue: VecDeque::with_capacity(n_calls),
            dones_pending: 0,
            first_call_delivered: false,
            negotiated: if c.reply_read_chunks {
                Extensions::RESPONDER_READ_CHUNKS
            } else {
                Extensions::EMPTY
            },
            serves,
            serve_free,
            reads_in_flight: 0,
            slot_lists_warm: false,
            active_calls: 0,
            parked: VecDeque::with_capacity(n_recv),
            // Between two flushes: the messages of one poll (within the
            // grant) and the parked calls they let proceed.
            released: VecDeque::with_capacity(if c.shared_receives { 2 * n_recv + 1 } else { 0 }),
            backing: None,
            tx,
            events: VecDeque::with_capacity(
                2 * (c.max_outstanding_calls as usize + n_serve as usize) + 4,
            ),
            timers: TimerTable::default(),
            stats: Stats::default(),
            msgp: super::msgp::MsgpState::new(n_serve as usize, n_calls),
            rx_group: None,
            opt_hdr: if c.may_continue() {
                crate::wire::rtrext::OptionalHeader::with_capacity(
                    &super::continuation::PARSE_LIMITS,
                )
            } else {
                crate::wire::rtrext::OptionalHeader::default()
            },
            peer_group_recv_limit: 1,
            peer_group_send_limit: 1,
            cont_recvs_free: c.reply_continuation_receives(),
            our_targets: super::placement::TargetLayout::ours(c.inline_recv_size),
            peer_targets: super::placement::TargetLayout::NONE,
            rx_spans: [super::placement::ItemSpan::default(); super::MAX_DDP_ITEMS],
            rx_n_spans: 0,
            rx_numbers: [0; super::placement::MAX_ITEM_SEGMENTS],
            tx_opt: if c.may_continue() {
                crate::wire::rtrext::OptionalHeader::with_capacity(
                    &super::continuation::PARSE_LIMITS,
                )
            } else {
                crate::wire::rtrext::OptionalHeader::default()
            },
            inval: super::inval::DoneInvalidate::new(n_calls),
        })
    }

    /// The configuration (with the peer limits currently in force).
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Updates what we know of the peer (RFC 8797 private data, or a
    /// CONF_RDMA reply, RFC 5666 s6.2). Applies to messages planned from
    /// now on. Sizes below 1024 bytes are raised to 1024 (RFC 5666 s6.1:
    /// every peer receives at least 1 KB).
    pub fn set_peer_limits(&mut self, peer: PeerLimits) {
        self.config.peer_inline_recv_size = peer.inline_recv_size.max(1024);
        self.config.peer_inline_send_size = peer.inline_send_size.max(1024);
        self.config.max_rdma_read = peer.max_rdma_read;
    }

    /// The engine's buffers (read access for the worker and tests).
    pub fn buffers(&self) -> &BufferTable {
        &self.bufs
    }

    /// The engine's buffers, writable: the provider side delivers received
    /// bytes and one-sided RDMA into them (in hardware the NIC does; the
    /// test harness copies). Also where the worker installs rkeys.
    pub fn buffers_mut(&mut self) -> &mut BufferTable {
        &mut self.bufs
    }

    /// Counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Why the connection closed, if it did.
    pub fn close_reason(&self) -> Option<CloseReason> {
        self.closed
    }

    /// Extensions in use on this connection: those both peers advertised
    /// (CONF_RDMA v2, docs/EXTENSIONS.md), or preset by
    /// [`Config::reply_read_chunks`].
    pub fn negotiated(&self) -> Extensions {
        self.negotiated
    }

    /// True when replies may travel in responder-provided read chunks.
    pub(super) fn reply_read_chunks(&self) -> bool {
        self.negotiated.contains(Extensions::RESPONDER_READ_CHUNKS)
    }

    /// Backs this connection's grants with receives of `pool`, the shared
    /// receive queue's ([`Config::shared_receives`]; docs/WORKER.md,
    /// "Shared receives"). Call once, before the peer can send.
    ///
    /// # Errors
    /// [`ConfigError::CreditPoolWithoutSharedReceives`] without shared
    /// receives; [`ConfigError::NoReceiveCredit`] when the pool cannot
    /// back one more connection.
    pub fn use_credit_pool(&mut self, pool: Arc<super::CreditPool>) -> Result<(), ConfigError> {
        if !self.config.shared_receives {
            return Err(ConfigError::CreditPoolWithoutSharedReceives);
        }
        self.backing =
            Some(super::credits::Backing::new(pool).ok_or(ConfigError::NoReceiveCredit)?);
        Ok(())
    }

    /// Shared receives reserved for this connection's grants (0 without
    /// a credit pool).
    pub fn credits_reserved(&self) -> u32 {
        self.backing.as_ref().map_or(0, |b| b.reserved())
    }

    /// Credits the peer granted us (RFC 5666 s3.3).
    pub fn granted_credits(&self) -> u32 {
        self.granted
    }

    /// The calls the peer may have in progress at us: what our grants
    /// allow it now.
    pub fn credits_granted(&self) -> u32 {
        self.grant()
    }

    /// Our calls sent and not yet answered.
    pub fn outstanding_calls(&self) -> u32 {
        self.outstanding
    }

    /// The calls the peer may have in progress at us (RFC 5666 s3.3):
    /// our configured grant, which `new` backs with as many receive
    /// buffers; on a credit pool, the most that any grant we sent may
    /// still allow.
    pub(super) fn grant(&self) -> u32 {
        match &self.backing {
            None => self.config.credits,
            Some(b) => b.calls_allowed(),
        }
    }

    /// The credit value for the next reply or RDMA_ERROR we send, the
    /// call having asked for `requested` (RFC 5666 s3.3): our configured
    /// grant; on a credit pool, what the peer asked for up to `credits`,
    /// cut to the connection's fair share of the pool and to what the
    /// pool can back (never zero).
    pub(super) fn grant_to_send(&mut self, requested: u32) -> u32 {
        let credits = self.config.credits;
        match &mut self.backing {
            None => credits,
            Some(b) => b.grant(requested.clamp(1, credits)),
        }
    }

    /// The next work request to post, in order. Writes of a reply come
    /// before its Send; the worker must post in this order on one QP.
    /// After a close, requests queued earlier still come out: post them
    /// (a queue pair in the error state flushes them) or report them
    /// `Flushed`, so that their resources return.
    pub fn poll_transmit(&mut self) -> Option<WorkRequest> {
        self.tx.pop_front()
    }

    /// The next event for the application.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// When [`Connection::handle_timeout`] should next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.next_deadline()
    }

    /// Runs the timers due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        for t in Timer::ALL {
            if self.timers.is_expired(t, now) {
                self.timers.stop(t);
                match t {
                    Timer::CallTimeout => self.expire_calls(now),
                    Timer::Idle => self.check_idle(now),
                    Timer::BulkRetry => self.unpark(now),
                    Timer::DoneReclaim => self.reclaim_exposed_replies(now),
                    Timer::GroupReassembly => self.expire_group(now),
                }
            }
        }
    }

    /// [`Connection::handle_recv`] for a message that came as Send With
    /// Invalidate of our key `invalidated` (an RDMA_DONE with remote
    /// invalidation): that exposure needs no local invalidation any more.
    /// A key naming none of our exposures is counted.
    pub fn handle_recv_invalidating(
        &mut self,
        now: Instant,
        wr_id: WrId,
        byte_len: u32,
        invalidated: Option<u32>,
    ) {
        if let Some(rkey) = invalidated {
            if !self.bufs.note_remote_invalidation(rkey) {
                self.stats.unknown_remote_invalidations += 1;
            }
        }
        self.handle_recv(now, wr_id, byte_len);
    }

    /// A receive completed successfully with `byte_len` bytes in the
    /// buffer of `wr_id`. Unknown or stale ids are counted and ignored.
    pub fn handle_recv(&mut self, now: Instant, wr_id: WrId, byte_len: u32) {
        let Some(i) = self.take_recv(wr_id) else {
            return;
        };
        // One store per message; the idle timer itself is re-armed only
        // when it fires (check_idle).
        self.last_activity = now;
        if self.closed.is_some() {
            return;
        }
        let buf = self.recvs[i].buf;
        if byte_len > self.bufs.buf_len(buf) {
            self.stats.bad_recv_len += 1;
        } else if self.process_message(now, Received::Own(buf), byte_len as usize)
            == Disposition::Park
        {
            // A call within the grant but no free slot: keep its receive
            // buffer (the grant still counts it) until a slot frees.
            self.stats.calls_parked += 1;
            self.parked.push_back(Parked::Own {
                index: i as u32,
                len: byte_len,
            });
            return;
        }
        // Every byte we need was copied out: repost at once, ahead of any
        // reply this message causes (RFC 5666 s3.3: the grant stays backed).
        if self.closed.is_none() {
            self.post_recv(i);
        }
        self.unpark(now);
    }

    /// Processes parked calls while responder slots are free (called at the
    /// end of the entry points that can free a slot, never from inside a
    /// handler, so the scratch header is not reused under a caller).
    fn unpark(&mut self, now: Instant) {
        while self.closed.is_none() && !self.serve_free.is_empty() {
            let Some(parked) = self.parked.pop_front() else {
                break;
            };
            let (recv, len) = match &parked {
                Parked::Own { index, len } => {
                    (Received::Own(self.recvs[*index as usize].buf), *len)
                }
                Parked::Shared { buf, len } => (Received::Shared(buf), *len),
            };
            if self.process_message(now, recv, len as usize) == Disposition::Park {
                self.parked.push_front(parked);
                break;
            }
            match parked {
                Parked::Own { index, .. } => {
                    if self.closed.is_none() {
                        self.post_recv(index as usize);
                    }
                }
                Parked::Shared { buf, .. } => self.release_held(buf),
            }
        }
    }

    /// A message of `byte_len` bytes arrived in `buf`, a shared receive
    /// ([`Config::shared_receives`]); `invalidated` as for
    /// [`Connection::handle_recv_invalidating`]. The buffer is lent: it
    /// comes back through [`Connection::poll_released_recv`], at once
    /// unless the call waits for a responder slot or a bulk buffer.
    pub fn handle_shared_recv(
        &mut self,
        now: Instant,
        buf: Buf,
        byte_len: u32,
        invalidated: Option<u32>,
    ) {
        if let Some(rkey) = invalidated {
            if !self.bufs.note_remote_invalidation(rkey) {
                self.stats.unknown_remote_invalidations += 1;
            }
        }
        self.last_activity = now;
        // Counted before anything answers it: a reply's grant reckons
        // with every message received so far.
        if let Some(b) = &mut self.backing {
            if !b.received(false) {
                self.stats.beyond_grant += 1;
            }
        }
        if self.closed.is_some() {
            self.released.push_back(buf);
            return;
        }
        if byte_len > buf.len() || byte_len > self.config.inline_recv_size {
            self.stats.bad_recv_len += 1;
        } else if self.process_message(now, Received::Shared(&buf), byte_len as usize)
            == Disposition::Park
        {
            self.stats.calls_parked += 1;
            if let Some(b) = &mut self.backing {
                b.hold();
            }
            self.parked.push_back(Parked::Shared { buf, len: byte_len });
            return;
        }
        self.released.push_back(buf);
        self.unpark(now);
    }

    /// Drops the parked calls (the connection closed): receives of our own
    /// are simply not reposted, as the queue pair is gone; shared ones go
    /// back to their owner's queue.
    pub(super) fn drop_parked(&mut self) {
        while let Some(p) = self.parked.pop_front() {
            if let Parked::Shared { buf, .. } = p {
                self.release_held(buf);
            }
        }
    }

    /// A call of the peer's came (or was refused) as a transmission group
    /// of `count`: on a credit pool, the messages of the group beyond its
    /// first are owed back to the peer's reckoning like answered ones
    /// (each of them took a credit, and the one answer returns them all;
    /// `Backing::answered_extra`).
    pub(super) fn note_group_messages(&mut self, count: u32) {
        if let Some(b) = &mut self.backing {
            b.answered_extra(count.saturating_sub(1));
        }
    }

    /// One of our calls went out: on a credit pool, a receive is reserved
    /// for its reply (the peer's grants cover only its own calls).
    pub(super) fn expect_reply(&mut self) {
        if let Some(b) = &mut self.backing {
            b.expect_one_more();
        }
    }

    /// Gives back a shared receive that a parked call held.
    fn release_held(&mut self, buf: Buf) {
        if let Some(b) = &mut self.backing {
            b.released();
        }
        self.released.push_back(buf);
    }

    /// The next shared receive the connection is done with, to post
    /// again ([`Connection::handle_shared_recv`]). A closed connection
    /// gives back every one it held.
    pub fn poll_released_recv(&mut self) -> Option<Buf> {
        self.released.pop_front()
    }

    /// A work request other than a successful receive completed. A status
    /// other than [`WcStatus::Success`] means the queue pair failed: the
    /// connection closes, and the completion still returns its resources.
    pub fn handle_completion(&mut self, now: Instant, wr_id: WrId, status: WcStatus) {
        let ok = status == WcStatus::Success;
        match wr_id.kind {
            WrKind::Recv => {
                if let Some(i) = self.take_recv(wr_id) {
                    if ok {
                        // A successful receive belongs in handle_recv: count
                        // it, and keep the grant backed by reposting.
                        self.stats.stale_completions += 1;
                        if self.closed.is_none() {
                            self.post_recv(i);
                        }
                    }
                }
            }
            WrKind::ErrorSend | WrKind::DoneSend => {
                let i = wr_id.index as usize;
                match self.err_bufs.get_mut(i) {
                    Some(e) if e.busy && wr_id.same_generation(e.generation) => {
                        e.busy = false;
                        e.generation = e.generation.wrapping_add(1);
                        self.err_free.push(i as u32);
                        if wr_id.kind == WrKind::DoneSend {
                            // The DONE's credit (RFC 5666 s3.8) returns.
                            self.outstanding = self.outstanding.saturating_sub(1);
                        }
                        self.transmit_queued_calls();
                    }
                    _ => self.stats.stale_completions += 1,
                }
            }
            WrKind::ReplyRead => self.on_reply_read_done(wr_id, ok),
            WrKind::CallSend => self.on_call_send_done(wr_id),
            WrKind::ReplySend | WrKind::ChunkWrite => self.on_reply_op_done(wr_id),
            WrKind::ChunkRead => self.on_read_done(now, wr_id, ok),
            WrKind::KeyBind | WrKind::KeyInvalidate => {
                self.key_ops_posted = self.key_ops_posted.saturating_sub(1);
            }
        }
        if !ok {
            self.close_with(CloseReason::TransportError(status));
        }
        self.unpark(now);
    }

    /// The queue pair failed with no work request of ours to report it
    /// (with [`Config::shared_receives`] nothing of the connection's own
    /// sits in its receive queue to flush): the connection closes as on a
    /// flushed completion.
    pub fn handle_queue_pair_failure(&mut self) {
        self.close_with(CloseReason::TransportError(WcStatus::Flushed));
    }

    /// The peer disconnected in order (the provider says so): the
    /// connection closes as on a failure, with its own reason
    /// ([`CloseReason::PeerDisconnected`]).
    pub fn handle_peer_disconnect(&mut self) {
        self.close_with(CloseReason::PeerDisconnected);
    }

    /// Closes the connection: outstanding calls fail, calls being served
    /// are dropped, and no new work is generated. Work requests already
    /// queued or posted still complete (the provider flushes them) and
    /// return their resources; [`Connection::resources`] then reports idle.
    pub fn close(&mut self) {
        self.close_with(CloseReason::Local);
    }

    /// Resources in use (the leak check).
    pub fn resources(&self) -> Resources {
        let busy_calls = self
            .calls
            .iter()
            .filter(|s| s.state != CallState::Free)
            .count();
        let busy_serves = self
            .serves
            .iter()
            .filter(|s| s.state != ServeState::Free)
            .count();
        Resources {
            recvs_posted: self.recvs.iter().filter(|r| r.posted).count() as u32,
            call_slots_busy: busy_calls as u32,
            serve_slots_busy: busy_serves as u32,
            error_sends_busy: self.err_bufs.iter().filter(|e| e.busy).count() as u32,
            reads_in_flight: self.reads_in_flight,
            buffers_exposed: self.bufs.exposed_count() as u32,
            key_ops_in_flight: self.key_ops_posted as u32,
            bulk_leased: self.bufs.bulk_leased() as u32,
            shared_recvs_held: (self.released.len()
                + self
                    .parked
                    .iter()
                    .filter(|p| matches!(p, Parked::Shared { .. }))
                    .count()) as u32,
        }
    }

    /// Starts the idle clock ([`Config::idle_timeout`]) at `now`: the
    /// worker calls it when it takes the connection over, so that a peer
    /// that never sends anything is timed out too. Nothing without an
    /// idle timeout.
    pub fn start_idle_clock(&mut self, now: Instant) {
        if let Some(t) = self.config.idle_timeout {
            self.last_activity = now;
            self.timers.set(Timer::Idle, now.saturating_add(t));
        }
    }

    /// [`Timer::Idle`] fired: close if the connection was idle for the
    /// whole timeout, else wait for the new deadline.
    fn check_idle(&mut self, now: Instant) {
        let Some(t) = self.config.idle_timeout else {
            return;
        };
        let due = self.last_activity.saturating_add(t);
        // A call of ours in flight holds a call slot; one of the peer's
        // being served holds a serve slot.
        let r = self.resources();
        let busy = r.call_slots_busy > 0 || r.serve_slots_busy > 0;
        if now >= due && !busy {
            self.stats.idle_closes += 1;
            self.close_with(CloseReason::Idle);
        } else {
            let next = if now >= due {
                now.saturating_add(t)
            } else {
                due
            };
            self.timers.set(Timer::Idle, next);
        }
    }

    pub(super) fn close_with(&mut self, reason: CloseReason) {
        if self.closed.is_some() {
            return;
        }
        self.closed = Some(reason);
        if reason == CloseReason::CreditOverrun {
            self.stats.credit_overruns += 1;
        }
        self.timers = TimerTable::default();
        self.close_group();
        self.events.push_back(Event::ConnectionLost { reason });
        self.close_requester();
        self.close_responder();
    }

    fn take_recv(&mut self, wr_id: WrId) -> Option<usize> {
        let i = wr_id.index as usize;
        match self.recvs.get_mut(i) {
            Some(r)
                if r.posted
                    && wr_id.kind == WrKind::Recv
                    && wr_id.same_generation(r.generation) =>
            {
                r.posted = false;
                r.generation = r.generation.wrapping_add(1);
                Some(i)
            }
            _ => {
                self.stats.stale_completions += 1;
                None
            }
        }
    }

    fn post_recv(&mut self, i: usize) {
        let r = &mut self.recvs[i];
        r.posted = true;
        self.tx.push_back(WorkRequest::PostRecv {
            wr_id: WrId {
                kind: WrKind::Recv,
                index: i as u32,
                generation: r.generation,
            },
            buf: r.buf,
        });
    }

    /// Classifies a received message and hands it to the requester or the
    /// responder half. Header errors are answered before anything is
    /// allocated or read (RFC 5666 s4.2).
    fn process_message(&mut self, now: Instant, recv: Received<'_>, len: usize) -> Disposition {
        // RDMA_OPTIONAL (rtrext, `continuation.rs`) only between peers
        // that negotiated it: its header is copied out alone and its
        // payload straight to where it goes (`Connection::copy_received`).
        if self.continues() {
            let mut fixed = [0u8; crate::wire::rtrext::OPTIONAL_FIXED_LEN];
            let optional = |w: &[u8]| u32::from_be_bytes([w[12], w[13], w[14], w[15]]);
            if len >= fixed.len()
                && self.read_received(recv, 0, &mut fixed)
                && optional(&fixed) == crate::wire::rtrext::RDMA_OPTIONAL
                && fixed[4..8] == RPCRDMA_VERSION.to_be_bytes()
            {
                return self.on_optional(now, recv, len);
            }
        }
        // The one read of the receive buffer (see `rx_copy`).
        let buf = self.rx_copy;
        let copied = match recv {
            Received::Own(recv) => {
                let whole = LocalSlice {
                    buf: recv,
                    offset: 0,
                    len: len as u32,
                };
                self.bufs.copy(whole, buf, 0)
            }
            Received::Shared(src) => self
                .bufs
                .bytes_mut(buf)
                .get_mut(..len)
                .is_some_and(|dst| src.read(0, dst)),
        };
        if !copied {
            self.stats.bad_recv_len += 1;
            return Disposition::Done;
        }
        // For a Version One peer RDMA_OPTIONAL stays an unknown message
        // type. Any other header breaks off a group being received
        // (rtrext s4.2).
        if self.rx_group.is_some() {
            let fixed = HeaderView::new_checked(self.bufs.bytes(buf).get(..len).unwrap_or(&[]))
                .ok()
                .map(|v| (v.xid(), v.proc_type()));
            if let Some((xid, proc_type)) = fixed {
                self.interrupt_group(xid, proc_type);
            }
        }
        let limits = self.config.limits;
        let bytes = self.bufs.bytes(buf).get(..len).unwrap_or(&[]);
        let parsed = self.rx_hdr.parse_into(bytes, &limits);
        let view_xid = HeaderView::new_checked(bytes).ok().map(|v| v.xid());
        let hlen = match parsed {
            Err(_) => {
                // Which side does it belong to? A reply to one of our calls
                // fails that call; anything else is a request we answer.
                match view_xid {
                    Some(xid) => match self.find_sent_call(xid) {
                        Some(slot) => self.fail_reply(slot, super::CallFailure::MalformedReply),
                        None => self.send_error(xid, ErrorBody::Chunk),
                    },
                    // Not even an XID to answer.
                    None => self.stats.runts_dropped += 1,
                }
                return Disposition::Done;
            }
            Ok(Decoded::UnsupportedVersion { xid, .. }) => {
                match self.find_sent_call(xid) {
                    Some(slot) => self.fail_reply(slot, super::CallFailure::MalformedReply),
                    None => self.send_error(
                        xid,
                        ErrorBody::Vers {
                            low: RPCRDMA_VERSION,
                            high: RPCRDMA_VERSION,
                        },
                    ),
                }
                return Disposition::Done;
            }
            Ok(Decoded::Header { len }) => len,
        };
        let xid = self.rx_hdr.xid;
        match self.rx_hdr.body {
            MessageBody::Msg => match peek_direction(bytes.get(hlen..).unwrap_or(&[])) {
                Some(MessageType::Call) => return self.on_call(now, buf, len, hlen, None),
                Some(MessageType::Reply) => match self.find_sent_call(xid) {
                    Some(slot) => self.on_reply(slot, buf, len, hlen),
                    None => self.stats.unmatched_replies += 1,
                },
                None => self.send_error(xid, ErrorBody::Chunk),
            },
            // RDMA_NOMSG. XIDs are per direction: the peer's call may carry
            // the XID of one of ours, so the XID alone never makes a
            // message a reply (docs/ENGINE.md, "Routing RDMA_NOMSG").
            MessageBody::NoMsg => {
                let sent = self.find_sent_call(xid);
                if self.rx_hdr.chunks.reads().is_empty() {
                    // Not a call (RFC 5666 s5.1 needs the position-zero
                    // read chunk): the reply in the reply chunk our call
                    // offered (s5.2), or a reply with nowhere to be.
                    match sent {
                        Some(slot) if self.offered_reply_chunk(slot) => {
                            self.on_reply(slot, buf, len, hlen)
                        }
                        Some(slot) => self.fail_reply(slot, super::CallFailure::MalformedReply),
                        None => return self.on_call(now, buf, len, hlen, None),
                    }
                } else {
                    // A long call (s5.1). Only with responder-provided read
                    // chunks can it also be a reply (draft-lever s4.1): then
                    // it is pulled first and routed by its RPC direction.
                    let reply_to = sent.filter(|_| self.reply_read_chunks());
                    return self.on_call(now, buf, len, hlen, reply_to);
                }
            }
            MessageBody::Error(e) => match self.find_sent_call(xid) {
                Some(slot) => self.on_peer_error(slot, e),
                None => self.stats.unmatched_replies += 1,
            },
            MessageBody::Done => self.on_done(xid),
            // RDMA_MSGP (retired by RFC 8166): see msgp.rs.
            MessageBody::MsgP { align, thresh } => {
                let padding = crate::wire::rpcrdma::Padding { align, thresh };
                return self.on_msgp(now, buf, len, hlen, padding);
            }
            // Unknown types: ERR_CHUNK, as Linux svcrdma answers.
            MessageBody::Unknown { .. } => match self.find_sent_call(xid) {
                Some(slot) => self.fail_reply(slot, super::CallFailure::UnsupportedReply),
                None => self.send_error(xid, ErrorBody::Chunk),
            },
        }
        Disposition::Done
    }

    /// Copies `dst.len()` bytes at `offset` of a received message out of
    /// its receive buffer (peer memory). False if they are not all there.
    pub(super) fn read_received(&self, recv: Received<'_>, offset: u32, dst: &mut [u8]) -> bool {
        match recv {
            Received::Own(buf) => self.bufs.read(
                LocalSlice {
                    buf,
                    offset,
                    len: dst.len() as u32,
                },
                dst,
            ),
            Received::Shared(src) => src.read(offset, dst),
        }
    }

    /// Copies `len` bytes at `offset` of a received message into `dest`
    /// at `at`: the one copy of a transmission's payload out of peer
    /// memory. False, copying nothing, if either range falls outside.
    pub(super) fn copy_received(
        &mut self,
        recv: Received<'_>,
        offset: u32,
        len: u32,
        dest: BufId,
        at: usize,
    ) -> bool {
        match recv {
            Received::Own(buf) => self.bufs.copy(LocalSlice { buf, offset, len }, dest, at),
            Received::Shared(src) => self
                .bufs
                .bytes_mut(dest)
                .get_mut(at..at + len as usize)
                .is_some_and(|d| src.read(offset, d)),
        }
    }

    /// Sends an RDMA_ERROR (RFC 5666 s4.2) for `xid`; no slot is used.
    ///
    /// ```text
    /// error = xid vers=1 credits=grant RDMA_ERROR (ERR_VERS low high / ERR_CHUNK)
    /// ```
    pub(super) fn send_error(&mut self, xid: u32, body: ErrorBody) {
        let Some(i) = self.err_free.pop() else {
            self.stats.error_replies_dropped += 1;
            return;
        };
        let e = &mut self.err_bufs[i as usize];
        e.busy = true;
        let buf = e.buf;
        self.tx_hdr.chunks.clear();
        self.tx_hdr.xid = xid;
        self.tx_hdr.vers = RPCRDMA_VERSION;
        // The request's own ask is not at hand here (its header may not
        // even parse): the configured grant, cut like any other.
        self.tx_hdr.credits = self.grant_to_send(self.config.credits);
        self.tx_hdr.body = MessageBody::Error(body);
        let Ok(n) = self.tx_hdr.emit(self.bufs.bytes_mut(buf)) else {
            // Cannot happen (the buffer holds the largest error header);
            // give the buffer back rather than panic.
            self.err_bufs[i as usize].busy = false;
            self.err_free.push(i);
            self.stats.error_replies_dropped += 1;
            return;
        };
        match body {
            ErrorBody::Vers { .. } => self.stats.err_vers_sent += 1,
            _ => self.stats.err_chunk_sent += 1,
        }
        self.post_control(WrKind::ErrorSend, i, n as u32, None);
    }

    /// Queues the Send of the first `len` bytes of control buffer `i`
    /// (busy since the caller took it), an RDMA_ERROR, a Report Error or
    /// an RDMA_DONE (`kind`); its completion frees the buffer.
    pub(super) fn post_control(
        &mut self,
        kind: WrKind,
        i: u32,
        len: u32,
        invalidate_rkey: Option<u32>,
    ) {
        let e = &self.err_bufs[i as usize];
        let (buf, generation) = (e.buf, e.generation);
        self.tx.push_back(WorkRequest::Send {
            wr_id: WrId {
                kind,
                index: i,
                generation,
            },
            local: super::LocalSlice {
                buf,
                offset: 0,
                len,
            },
            gather: None,
            invalidate_rkey,
        });
    }

    /// Lets the peer reach `offset..offset + len` of `buf`: call before
    /// the segment is marshaled (with key windows it takes the key of
    /// this exposure from here, and the bind is queued ahead of the Send
    /// that advertises it). False when no key window is free (the caller
    /// fails the exchange).
    #[must_use]
    pub(super) fn expose(&mut self, buf: BufId, access: Access, offset: u32, len: u32) -> bool {
        if self.bufs.access(buf) != Access::None {
            self.unexpose(buf);
        }
        match self.bufs.set_access(buf, access, offset, len) {
            Ok(None) => true,
            Ok(Some(bind)) => {
                self.tx.push_back(WorkRequest::Bind {
                    wr_id: WrId {
                        kind: WrKind::KeyBind,
                        index: bind.window,
                        generation: 0,
                    },
                    window: bind.window,
                    rkey: bind.rkey,
                    local: LocalSlice { buf, offset, len },
                    access,
                });
                self.key_ops_posted += 1;
                true
            }
            Err(()) => {
                self.stats.key_windows_exhausted += 1;
                false
            }
        }
    }

    /// Ends the peer's access to `buf` (the exchange ended: answer,
    /// timeout, error). With key windows its key is invalidated by a work
    /// request, so a late access fails at the provider; a closed
    /// connection's queue pair is in error and takes every key with it.
    pub(super) fn unexpose(&mut self, buf: BufId) {
        let Some(rkey) = self.bufs.unexpose(buf) else {
            return;
        };
        if self.closed.is_some() {
            return;
        }
        self.tx.push_back(WorkRequest::Invalidate {
            wr_id: WrId {
                kind: WrKind::KeyInvalidate,
                index: 0,
                generation: 0,
            },
            rkey,
        });
        self.key_ops_posted += 1;
    }

    /// Whether the peer accepts Send With Invalidate (its RFC 8797
    /// private data flag), for replies from now on
    /// ([`Config::peer_remote_invalidate`]).
    pub fn set_peer_remote_invalidate(&mut self, accepts: bool) {
        self.config.peer_remote_invalidate = accepts;
    }

    /// Gives the connection memory windows to expose buffers under (one
    /// fresh key per exposure, invalidated when the exchange ends), at
    /// least [`Connection::max_exposures`] of them; the worker allocates
    /// them on the queue pair. Without, every buffer is reached under the
    /// one key of its region ([`BufferTable::set_remote_key`]).
    pub fn set_key_windows(&mut self, windows: &[crate::verbs::Window]) {
        self.bufs.set_key_windows(windows);
    }

    /// The most exposures a connection with this configuration has at
    /// once: a call's read chunk, write chunk and reply chunk per
    /// requester slot, and the replies exposed in read chunks
    /// (`max_reply_read_chunks`) when responder-provided read chunks may
    /// be in use. Small on a server (a window is an HCA object on
    /// `ibverbs`).
    pub fn max_exposures(&self) -> usize {
        3 * self.calls.len() + self.config.replies_exposed_at_most() as usize
    }
}
