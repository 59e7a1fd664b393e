//! The responder half: calls the peer sends us, from the header to the
//! completion of our reply.
//!
//! Order of checks for an arriving call (RFC 5666 s3.3, s4.2): credit
//! overrun closes the connection; a header or chunk layout we cannot use
//! is answered with ERR_CHUNK; only then is a slot taken and an RDMA Read
//! issued. Read chunks are pulled with at most `max_rdma_read` Reads in
//! flight per connection, the rest waiting in FIFO order (s3.3 last
//! paragraph, s6.2 `maxrdmaread`); their data lands at its XDR position in
//! the slot's call buffer, with elided XDR roundup zero-filled (s3.7).
//!
//! The reply: a DDP-eligible item goes by RDMA Write into the call's first
//! write chunk (s3.6) and the write list comes back with the lengths
//! written; what remains goes inline (RDMA_MSG) when it fits the peer's
//! inline receive size, else by RDMA Write into the call's reply chunk
//! with an RDMA_NOMSG (s5.2), never past the chunk's end. Writes are
//! queued before the Send that announces them. When both peers support
//! it (negotiated, see `Connection::negotiated`), a reply too large for every
//! requester-provided resource is exposed in a position-zero read chunk
//! instead, until RDMA_DONE or the reclaim timer (s3.8, draft-lever s4.1).

use core::time::Duration;

use super::buffers::{Access, BufClass, BufId, BufferTableBuilder, LocalSlice};
use super::connection::{Disposition, PendingRead, ReadOwner};
use super::time::{Instant, Timer};
use super::wr::{OpSet, WorkRequest, WrId, WrKind, MAX_OPS};
use super::{
    ddp_items_fit, roundup4, CloseReason, Config, Connection, DdpItem, Event, IncomingCall,
    OutgoingReply, ReplyError, MAX_DDP_ITEMS,
};
use crate::wire::conf::CONFIG_RDMA_PROG;
use crate::wire::rpc::{peek_direction, peek_xid, CallHeader, MessageType};
use crate::wire::rpcrdma::{
    chunked_header_len, ChunkLists, ErrorBody, Limits, MessageBody, ReadSegment, Segment,
    RPCRDMA_VERSION,
};
use crate::wire::rtrext::PlacementType;

/// Where a call from the peer is (SPDK-style request state). Every
/// transition is made by `Connection::process_serve`, whose doc comment
/// holds the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ServeState {
    /// Unused.
    Free,
    /// The header was valid and the inline parts are in the call buffer;
    /// RDMA Reads of the read chunks are queued or in flight.
    PullingReadChunks,
    /// `CallArrived` was emitted; the application owns the call until it
    /// calls `send_reply`.
    Executing,
    /// The reply's Writes and Send are posted; waiting for their
    /// completions before the slot (and its reply buffer, the Writes'
    /// source) is reused. A reply exposed in a read chunk may also be
    /// released by RDMA_DONE meanwhile.
    AwaitingCompletions,
    /// Every work request completed, but the reply is exposed in a read
    /// chunk: waiting for the requester's RDMA_DONE (RFC 5666 s3.8) or the
    /// reclaim timer.
    AwaitingDone,
    /// The call arrives as a transmission group (rtrext s4.2): its
    /// continuations are appended to the message buffer as they come.
    ReceivingGroup,
    /// The connection closed; waiting for the flush of work requests still
    /// posted.
    Draining,
}

/// What can happen to a serve slot: the input of
/// `Connection::process_serve`. Each entry point of the responder (a
/// call header, a completion, the application's reply, RDMA_DONE, the
/// reclaim timer, the close) turns what it saw into one of these.
#[derive(Debug, Clone, Copy)]
pub(super) enum ServeEvent {
    /// The call's header passed every check (`on_call`): the slot was
    /// taken, the inline parts are placed and the Reads of its read
    /// chunks, if any, listed.
    CallAccepted { now: Instant },
    /// Raised by `process_serve` itself when the call is whole in the
    /// slot's buffer (no Reads, or the last one completed): it is
    /// examined and handed to the application.
    CallComplete { now: Instant },
    /// A Read of the slot's read chunks completed (`ok`), or was flushed.
    ReadDone { now: Instant, wr_id: WrId, ok: bool },
    /// The reply (the application's, or the engine's own CONF_RDMA answer)
    /// was queued: `ops` Writes and Send posted; `exposed`: the reply is
    /// exposed in a position-zero read chunk.
    ReplyPosted {
        now: Instant,
        ops: u32,
        exposed: bool,
    },
    /// A Write or the Send of the reply completed, or was flushed.
    ReplyOpDone { wr_id: WrId },
    /// RDMA_DONE for the exposed reply arrived.
    DoneArrived,
    /// The reclaim timer found the exposed reply's deadline passed.
    DoneTimeout,
    /// The connection closed.
    Closed,
    /// The first transmission of a call's group was taken (rtrext s9.2).
    GroupStarted,
    /// The group broke off or timed out (`continuation.rs`).
    GroupDropped,
}

/// What a whole call turned out to be (`examine_call`).
#[derive(Debug, Clone, Copy)]
enum Examined {
    /// A REPLY to one of our calls (an RDMA_NOMSG with a read list).
    Reply,
    /// A call the grant had no room for: the connection closed.
    Overrun,
    /// Not a call carrying the transport header's XID.
    NotACall,
    /// A call, to deliver.
    Call {
        program: u32,
        version: u32,
        procedure: u32,
        hl: usize,
    },
}

/// A pulled REPLY on its way to the requester half (`take_pulled_reply`).
#[derive(Debug, Clone, Copy)]
struct PulledReply {
    xid: u32,
    buf: BufId,
    len: u32,
    credits: u32,
    written: (usize, u64),
    rkey: Option<u32>,
}

/// What `process_serve` does after an event's own step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Then {
    Return,
    Settle,
    SettleAndPumpReads,
}

/// A responder slot: state plus the two buffers it owns (its Send buffer,
/// and one message buffer that holds the call, then the reply).
#[derive(Debug)]
pub(super) struct ServeSlot {
    /// Changed only by `Connection::process_serve`.
    pub(super) state: ServeState,
    pub(super) generation: u32,
    xid: u32,
    send_buf: BufId,
    /// The reassembled call, then the reply (inline part first, then the
    /// DDP item: the Writes' source). One buffer serves both: the reply
    /// is placed only once the call is no longer read (`send_reply` ends
    /// `Executing`, after which `call_message` is `None`; the engine's
    /// own CONF_RDMA answer parses its arguments before it encodes), so a
    /// slot needs the larger of the two sizes, not their sum.
    message: BufId,
    call_len: u32,
    /// Length of the call's RPC header (`xid` through the verifier), as
    /// `examine_call` parsed it.
    header_len: u32,
    /// Capacity `limits.max_read_segments`, reserved at construction.
    reads: Vec<PendingRead>,
    reads_issued: usize,
    reads_done: usize,
    /// The call's write list and reply chunk, kept for the reply.
    peer_chunks: ChunkLists,
    /// Reads, Writes and Sends posted and not completed.
    ops_in_flight: u32,
    /// Which of the call's Reads completed (each counts once).
    reads_seen: OpSet,
    /// Writes and Sends of the reply posted (numbered from 0), and which
    /// completed.
    reply_ops_posted: u32,
    reply_ops_seen: OpSet,
    /// The reply is exposed in a read chunk until RDMA_DONE or
    /// `done_deadline`.
    done_pending: bool,
    done_deadline: Instant,
    /// Pulled while it may still be a reply to one of our calls (RDMA_NOMSG
    /// with a read list, responder read chunks negotiated): not counted
    /// against the grant until its RPC direction says CALL.
    maybe_reply: bool,
    /// The transport header's credit word (a grant, if it is a reply).
    hdr_credits: u32,
    /// Credits the call holds until its reply: 1, or the transmissions
    /// of its group (rtrext s4.3).
    credits_held: u32,
    /// Receives the requester reserved for the reply's later
    /// transmissions (rtrext s9.2 `optxrq_rsbuf`); 0 for a Version One
    /// call.
    reply_buffers: u32,
    /// The call's response direction (rtrext s7.4): its reply's
    /// DDP-eligible item is placed by Send (`placement.rs`) if at least
    /// this long, else answered as too short.
    reply_direction: Option<u32>,
    /// Where a reply's transmission group is laid out
    /// (`Config::group_buffer_len`; empty without message continuation).
    group_buf: BufId,
}

/// Read segments every serve slot gets room for at the connection's first
/// chunked call ([`Connection::warm_slot_lists`]); until then a slot
/// holds no list memory at all, so an idle connection, or one whose calls
/// carry no chunk (NULL, GETATTR), pays nothing for them.
const SLOT_READS: usize = 4;

/// The chunk lists every serve slot gets room for at the connection's
/// first chunked call, as for [`SLOT_READS`]: a write chunk or two of a
/// few segments and a reply chunk (what NFS calls carry), not the worst
/// case the limits allow. A larger call grows its slot's lists once.
const SLOT_CHUNKS: Limits = Limits {
    max_read_segments: 0,
    max_write_chunks: 2,
    max_segments_per_chunk: 4,
    max_reply_segments: 4,
};

/// How long a call that found the bulk pool empty waits before it is
/// tried again (`Timer::BulkRetry`). Short against any call timeout; the
/// worker checks the timers of its shared endpoints every millisecond.
const BULK_RETRY: Duration = Duration::from_micros(100);

impl ServeSlot {
    /// The length of a slot's own message buffer (the call, then the
    /// reply): the largest call or reply, or with a bulk pool (`pooled`)
    /// what fits inline (a call received inline, a reply sent inline);
    /// a larger message leases a pool buffer for its exchange.
    pub(super) fn message_size(c: &Config, pooled: bool) -> u32 {
        if pooled {
            c.inline_recv_size.max(c.inline_send_size)
        } else {
            c.max_call_size.max(c.max_reply_size)
        }
    }

    /// A free slot with its buffers added to `b`; `message_len` from
    /// [`ServeSlot::message_size`].
    pub(super) fn new(b: &mut BufferTableBuilder, c: &Config, message_len: u32) -> ServeSlot {
        let message = b.add(BufClass::Message, message_len);
        ServeSlot {
            state: ServeState::Free,
            generation: 0,
            xid: 0,
            send_buf: b.add(BufClass::Send, c.inline_send_size),
            message,
            call_len: 0,
            header_len: 0,
            // A slot's lists start empty; every slot's get their usual
            // room at the connection's first chunked call (all at once,
            // so that which slot a later call lands in cannot make it
            // allocate), and grow (within `c.limits`) only for a larger
            // call, then keep that capacity. An idle connection carries
            // no chunk list per slot (docs/ENGINE.md, "Memory").
            reads: Vec::new(),
            reads_issued: 0,
            reads_done: 0,
            peer_chunks: ChunkLists::default(),
            ops_in_flight: 0,
            reads_seen: OpSet::default(),
            reply_ops_posted: 0,
            reply_ops_seen: OpSet::default(),
            done_pending: false,
            done_deadline: Instant::ZERO,
            maybe_reply: false,
            hdr_credits: 0,
            credits_held: 1,
            reply_buffers: 0,
            reply_direction: None,
            group_buf: b.add(BufClass::Send, c.group_buffer_len()),
        }
    }

    /// A new call `xid` of `call_len` bytes (so far) takes the slot: no
    /// Reads, no reply ops, no chunks yet; it holds `credits_held`
    /// credits and may answer into `reply_buffers` reserved receives.
    fn begin_call(&mut self, xid: u32, call_len: u32, credits_held: u32, reply_buffers: u32) {
        self.xid = xid;
        self.call_len = call_len;
        self.reads.clear();
        self.reads_issued = 0;
        self.reads_done = 0;
        self.ops_in_flight = 0;
        self.reply_ops_posted = 0;
        self.credits_held = credits_held;
        self.reply_buffers = reply_buffers;
        self.reply_direction = None;
        self.peer_chunks.clear();
    }

    /// The call's write list and reply chunk, to fill from an rtrext
    /// response direction.
    pub(super) fn peer_chunks_mut(&mut self) -> &mut ChunkLists {
        &mut self.peer_chunks
    }

    /// The buffer the call is reassembled in, then the reply.
    pub(super) fn message_buf(&self) -> BufId {
        self.message
    }

    /// Whether the slot is receiving a call's transmission group, in
    /// `generation`.
    pub(super) fn receives_group(&self, generation: u32) -> bool {
        self.state == ServeState::ReceivingGroup && self.generation == generation
    }

    /// The reassembled call is `len` bytes long.
    pub(super) fn set_call_len(&mut self, len: u32) {
        self.call_len = len;
    }
}

/// How a reply travels (decided by `plan_reply` before anything moves).
#[derive(Debug, Clone, Copy)]
struct ReplyPlan {
    /// Per write chunk (in the call's order), the bytes of the DDP item
    /// placed in it; 0 for a chunk that gets none.
    chunk_lens: [u32; MAX_DDP_ITEMS],
    /// Which items of the reply's list are placed (bit k: item k, into
    /// write chunk k); the others stay in the message.
    placed: u8,
    /// Bytes of the reply outside the write chunks.
    inline_len: usize,
    /// The inline part goes into the reply chunk (RDMA_NOMSG).
    use_reply_chunk: bool,
    /// The inline part is exposed in a position-zero read chunk
    /// (RDMA_NOMSG, responder-provided read chunk, draft-lever s4.1).
    use_read_chunk: bool,
    /// The reply goes as a transmission group into the receives the call
    /// reserved (rtrext s4.3, s9.3).
    use_group: bool,
    /// The reply's first DDP-eligible item, in the message (a group may
    /// place it by Send, rtrext s7.4).
    group_item: Option<DdpItem>,
}

/// Sets the segment lengths of a chunk to the bytes actually placed when
/// `n` bytes fill its segments in order (RFC 5666 s3.6: lengths rewritten
/// to match the transfer).
fn fill_lengths(segments: &mut [Segment], mut n: u64) {
    for s in segments {
        let take = n.min(u64::from(s.length));
        s.length = take as u32;
        n -= take;
    }
}

impl Connection {
    /// A call header (RDMA_MSG with a CALL body, or RDMA_NOMSG) parsed in
    /// `rx_hdr`; the message is `len` bytes of receive buffer `buf`.
    /// `reply_to`: an RDMA_NOMSG with a read list that may also be the
    /// reply to our call in that requester slot (responder read chunks
    /// negotiated): it is pulled as a call unless it cannot be one (the
    /// grant is full, or its layout is not a call's), and routed by its
    /// RPC direction once pulled (`examine_call`).
    pub(super) fn on_call(
        &mut self,
        now: Instant,
        buf: BufId,
        len: usize,
        hlen: usize,
        reply_to: Option<usize>,
    ) -> Disposition {
        let xid = self.rx_hdr.xid;
        // RFC 5666 s3.3: more calls than granted end the connection (calls
        // waiting for a slot count: the peer sent them).
        let full = self.active_calls + self.parked.len() as u32 >= self.grant();
        let layout = self.check_call_layout(buf, len, hlen);
        if let (Some(slot), true) = (reply_to, full || layout.is_none()) {
            self.on_reply(slot, buf, len, hlen);
            return Disposition::Done;
        }
        if full {
            self.close_with(CloseReason::CreditOverrun);
            return Disposition::Done;
        }
        // RFC 5666 s4.2: bad chunks are answered before any resource use.
        let Some(total) = layout else {
            self.send_error(xid, ErrorBody::Chunk);
            return Disposition::Done;
        };
        // All slots busy within the grant: replies whose completions are
        // still due hold them. Wait for one instead of failing the peer.
        let Some(idx) = self.serve_free.pop() else {
            return Disposition::Park;
        };
        if !self.lease_bulk_for(idx as usize, total) {
            // The worker's pool is empty: other connections' exchanges
            // hold it. Wait like a call that found no slot, and try again
            // soon (their completions free buffers, not ours).
            self.serve_free.push(idx);
            self.stats.bulk_pool_empty += 1;
            self.timers
                .set(Timer::BulkRetry, now.saturating_add(BULK_RETRY));
            return Disposition::Park;
        }
        let maybe_reply = reply_to.is_some();
        if !maybe_reply {
            self.active_calls += 1;
            self.stats.max_active_calls = self.stats.max_active_calls.max(self.active_calls);
        }
        let idx = idx as usize;
        self.assemble_call(idx, buf, len, hlen, total);
        self.serves[idx].maybe_reply = maybe_reply;
        self.serves[idx].hdr_credits = self.rx_hdr.credits;
        self.process_serve(idx, ServeEvent::CallAccepted { now });
        Disposition::Done
    }

    /// The length of the reassembled call, if the read list describes a
    /// usable layout (RFC 5666 s3.4, s3.7, s5.1): positions at or past the
    /// end of the previous chunk (with its roundup), inline bytes enough
    /// to reach each position, each chunk past position zero as long as
    /// the XDR count inline right before it (or its roundup), a long
    /// call's single position-zero chunk,
    /// the total within `max_call_size`, and Reads allowed at all.
    fn check_call_layout(&self, buf: BufId, len: usize, hlen: usize) -> Option<u32> {
        let chunks = &self.rx_hdr.chunks;
        if !chunks.reads().is_empty() && self.config.max_rdma_read == 0 {
            return None;
        }
        // Every Read is numbered (`WrId::for_op`).
        if chunks.reads().len() >= MAX_OPS as usize {
            return None;
        }
        let total = match self.rx_hdr.body {
            MessageBody::Msg => {
                let bytes = self.bufs.bytes(buf).get(..len)?;
                self.rx_hdr.check_rpc_xid(bytes, hlen).ok()?;
                let inline = (len - hlen) as u64;
                let (mut full, mut consumed) = (0u64, 0u64);
                for chunk in chunks.read_chunks() {
                    let pos = u64::from(chunk.position);
                    let gap = pos.checked_sub(full)?;
                    if consumed + gap > inline {
                        return None;
                    }
                    consumed += gap;
                    // s3.4, s3.7: past position zero the chunk replaces an
                    // opaque's data; its XDR count is the inline word just
                    // before the position, and the chunk holds that many
                    // bytes, with or without the roundup.
                    if pos > 0 {
                        if gap < 4 {
                            return None;
                        }
                        let at = hlen + consumed as usize;
                        let word: [u8; 4] = bytes.get(at - 4..at)?.try_into().ok()?;
                        let count = u64::from(u32::from_be_bytes(word));
                        let n = chunk.len_bytes();
                        if n != count && n != roundup4(count) {
                            return None;
                        }
                    }
                    full = pos + roundup4(chunk.len_bytes());
                }
                full + (inline - consumed)
            }
            MessageBody::NoMsg => {
                let mut it = chunks.read_chunks();
                let first = it.next()?;
                if first.position != 0 || it.next().is_some() {
                    return None;
                }
                roundup4(first.len_bytes())
            }
            _ => return None,
        };
        if total > u64::from(self.config.max_call_size) || total < 8 {
            return None;
        }
        Some(total as u32)
    }

    /// Leases a bulk pool buffer for free slot `idx` when its own message
    /// buffer is too small for the call just received (`total` bytes
    /// reassembled) or for the largest reply its chunks can carry
    /// (RFC 8166 s3.4: inline, in the reply chunk, plus a DDP item in
    /// each of the first `MAX_DDP_ITEMS` write chunks, RFC 8267): one pool
    /// buffer holds both, as the
    /// slot's own buffer does. False, leasing nothing, when the pool has
    /// none for this connection. True at once without a pool.
    fn lease_bulk_for(&mut self, idx: usize, total: u32) -> bool {
        if self.bufs.bulk_pool().is_none() {
            return true;
        }
        let message = self.serves[idx].message;
        let chunks = &self.rx_hdr.chunks;
        let reply_room = u64::from(self.config.inline_send_size)
            .max(chunks.reply().map_or(0, |r| r.len_bytes()))
            + chunks
                .write_chunks()
                .take(MAX_DDP_ITEMS)
                .fold(0u64, |sum, c| sum.saturating_add(c.len_bytes()));
        let reply_need = reply_room.min(u64::from(self.config.max_reply_size));
        let need = u64::from(total).max(reply_need);
        need <= u64::from(self.bufs.buf_len(message)) || self.bufs.lease_bulk(message)
    }

    /// [`Connection::warm_slot_lists`] unless done (an rtrext call that
    /// brings a write chunk in its response direction).
    pub(super) fn warm_slot_lists_once(&mut self) {
        if !self.slot_lists_warm {
            self.warm_slot_lists();
        }
    }

    /// Gives every serve slot its usual list room ([`SLOT_READS`],
    /// [`SLOT_CHUNKS`]), once per connection, at its first chunked call.
    fn warm_slot_lists(&mut self) {
        for s in self.serves.iter_mut() {
            s.reads.reserve(SLOT_READS);
            s.peer_chunks.reserve(&SLOT_CHUNKS);
        }
        self.slot_lists_warm = true;
    }

    /// Copies the inline parts of the call to their XDR positions in the
    /// slot's call buffer, zero-fills elided roundup, and lists the Reads
    /// that fill the gaps. The layout was checked by `check_call_layout`.
    fn assemble_call(&mut self, idx: usize, buf: BufId, len: usize, hlen: usize, total: u32) {
        if !self.slot_lists_warm && !self.rx_hdr.chunks.is_empty() {
            self.warm_slot_lists();
        }
        let s = &mut self.serves[idx];
        s.begin_call(self.rx_hdr.xid, total, 1, 0);
        for c in self.rx_hdr.chunks.write_chunks() {
            // Cannot fail: the count came from a 32-bit word.
            let _ = s.peer_chunks.push_write_chunk(c.segments);
        }
        if let Some(r) = self.rx_hdr.chunks.reply() {
            s.peer_chunks.set_reply(r.segments);
        }
        let call_buf = s.message;
        let mut src = hlen as u64; // next inline byte in the receive buffer
        let mut dst = 0u64; // position in the reassembled XDR stream
        for chunk in self.rx_hdr.chunks.read_chunks() {
            if self.rx_hdr.body == MessageBody::Msg {
                let gap = u64::from(chunk.position) - dst;
                let piece = LocalSlice {
                    buf,
                    offset: src as u32,
                    len: gap as u32,
                };
                self.bufs.copy(piece, call_buf, dst as usize);
                src += gap;
                dst += gap;
            }
            for r in chunk.segments.iter().filter(|r| r.segment.length > 0) {
                s.reads.push(PendingRead {
                    seg: r.segment,
                    dest: dst as u32,
                });
                dst += u64::from(r.segment.length);
            }
            let pad = roundup4(chunk.len_bytes()) - chunk.len_bytes();
            self.bufs.zero(call_buf, dst as usize, pad as usize);
            dst += pad;
        }
        if self.rx_hdr.body == MessageBody::Msg {
            let rest = len as u64 - src;
            let piece = LocalSlice {
                buf,
                offset: src as u32,
                len: rest as u32,
            };
            self.bufs.copy(piece, call_buf, dst as usize);
        }
        let s = &mut self.serves[idx];
        s.reads_seen.reset(s.reads.len());
    }

    /// Issues queued Reads while fewer than `max_rdma_read` are in flight,
    /// oldest owner first (calls being pulled and replies being pulled
    /// share the peer's IRD).
    pub(super) fn pump_reads(&mut self) {
        while self.closed.is_none() && self.reads_in_flight < self.config.max_rdma_read {
            let Some(&owner) = self.read_fifo.front() else {
                break;
            };
            let Some((read, local_buf, wr_id, last)) = self.next_read(owner) else {
                self.read_fifo.pop_front();
                continue;
            };
            if last {
                self.read_fifo.pop_front();
            }
            self.reads_in_flight += 1;
            self.stats.max_reads_in_flight =
                self.stats.max_reads_in_flight.max(self.reads_in_flight);
            self.tx.push_back(WorkRequest::RdmaRead {
                wr_id,
                local: LocalSlice {
                    buf: local_buf,
                    offset: read.dest,
                    len: read.seg.length,
                },
                remote: read.seg,
            });
        }
    }

    /// Takes the next Read of `owner`: the read, its destination buffer,
    /// its id, and whether it was the owner's last.
    fn next_read(&mut self, owner: ReadOwner) -> Option<(PendingRead, BufId, WrId, bool)> {
        match owner {
            ReadOwner::Serve(idx) => {
                let s = self.serves.get_mut(idx as usize)?;
                let r = *s.reads.get(s.reads_issued)?;
                let id = WrId::for_op(WrKind::ChunkRead, idx, s.generation, s.reads_issued as u32);
                s.reads_issued += 1;
                s.ops_in_flight += 1;
                Some((r, s.message, id, s.reads_issued == s.reads.len()))
            }
            ReadOwner::Call(idx) => self.next_reply_read(idx),
        }
    }

    pub(super) fn on_read_done(&mut self, now: Instant, wr_id: WrId, ok: bool) {
        let i = wr_id.index as usize;
        if i < self.serves.len() {
            self.process_serve(i, ServeEvent::ReadDone { now, wr_id, ok });
        } else {
            self.stats.stale_completions += 1;
        }
    }

    /// The call in slot `idx` is whole: a pulled REPLY, a call beyond the
    /// grant (an RDMA_NOMSG that might have been a reply counts against
    /// it only now; the connection is closed), something that is not a
    /// call carrying the transport header's XID, or a call to deliver.
    fn examine_call(&mut self, idx: usize) -> Examined {
        let s = &self.serves[idx];
        let msg = self
            .bufs
            .bytes(s.message)
            .get(..s.call_len as usize)
            .unwrap_or(&[]);
        if peek_direction(msg) == Some(MessageType::Reply) {
            return Examined::Reply;
        }
        if s.maybe_reply {
            // A call after all: it counts against the grant from now on.
            self.serves[idx].maybe_reply = false;
            if self.active_calls + self.parked.len() as u32 >= self.grant() {
                self.close_with(CloseReason::CreditOverrun);
                return Examined::Overrun;
            }
            self.active_calls += 1;
            self.stats.max_active_calls = self.stats.max_active_calls.max(self.active_calls);
        }
        let s = &self.serves[idx];
        let msg = self
            .bufs
            .bytes(s.message)
            .get(..s.call_len as usize)
            .unwrap_or(&[]);
        match CallHeader::parse(msg) {
            Ok((h, hl)) if h.xid == s.xid => Examined::Call {
                program: h.program,
                version: h.version,
                procedure: h.procedure,
                hl,
            },
            _ => Examined::NotACall,
        }
    }

    /// Slot `idx` pulled a REPLY (an RDMA_NOMSG with a read list is only
    /// known to be one after the pull): what the requester half needs of
    /// it, taken before the slot is freed, without ERR_CHUNK and without
    /// counting a call.
    fn take_pulled_reply(&mut self, idx: usize) -> PulledReply {
        let s = &self.serves[idx];
        let chunks = &s.peer_chunks;
        let written = (
            chunks.write_chunk_count(),
            chunks.write_chunks().next().map_or(0, |c| c.len_bytes()),
        );
        let r = PulledReply {
            xid: s.xid,
            buf: s.message,
            len: s.call_len,
            credits: s.hdr_credits,
            written,
            rkey: super::inval::single_handle(s.reads.iter().map(|r| r.seg.handle)),
        };
        if !s.maybe_reply {
            self.active_calls = self.active_calls.saturating_sub(1);
        }
        // The slot is freed before the reply is handed over: nothing
        // reuses the call buffer before the copy in `on_pulled_reply`,
        // and a close on that path finds the slot free. (Pulled replies
        // need responder read chunks, which a connection with a bulk pool
        // never has: the call buffer is its own.)
        debug_assert!(self.bufs.bulk_pool().is_none());
        r
    }

    /// Hands a pulled REPLY (its slot already free) to the requester half.
    fn hand_over_pulled_reply(&mut self, r: PulledReply) {
        self.note_pulled_reply_rkey(r.xid, r.rkey);
        self.on_pulled_reply(r.xid, r.buf, r.len, r.credits, r.written);
    }

    /// Gives up on the call in a slot: ERR_CHUNK to the peer and the
    /// peer's credit back (the slot is freed by the caller,
    /// `process_serve`).
    fn refuse_call(&mut self, idx: usize) {
        let s = &self.serves[idx];
        let (xid, held) = (s.xid, s.credits_held);
        self.send_error(xid, ErrorBody::Chunk);
        self.active_calls = self.active_calls.saturating_sub(held);
    }

    /// Takes a free slot for a call arriving as a transmission group of
    /// `count` whose reply may use `reply_buffers` more receives, with a
    /// bulk buffer when its own is too small for the longest such call
    /// or reply. `Err` when no slot (or no bulk buffer) is free.
    pub(super) fn take_group_slot(
        &mut self,
        now: Instant,
        count: u32,
        reply_buffers: u32,
    ) -> Result<u32, ()> {
        let idx = self.serve_free.pop().ok_or(())?;
        if self.bufs.bulk_pool().is_some() {
            let message = self.serves[idx as usize].message;
            let c = &self.config;
            let call =
                (u64::from(count) * u64::from(c.inline_recv_size)).min(u64::from(c.max_call_size));
            let reply = (u64::from(reply_buffers + 1) * u64::from(c.inline_send_size))
                .min(u64::from(c.max_reply_size));
            if call.max(reply) > u64::from(self.bufs.buf_len(message))
                && !self.bufs.lease_bulk(message)
            {
                self.serve_free.push(idx);
                self.stats.bulk_pool_empty += 1;
                self.timers
                    .set(Timer::BulkRetry, now.saturating_add(BULK_RETRY));
                return Err(());
            }
        }
        Ok(idx)
    }

    /// Sets up slot `idx` (just taken) for a call arriving as a group of
    /// `count` whose first transmission put `filled` bytes into its
    /// message buffer (`message_buf`), `count` credits held, the reply
    /// directed as `reply_direction` says.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn start_serve_group(
        &mut self,
        idx: u32,
        xid: u32,
        count: u32,
        reply_buffers: u32,
        filled: u32,
        credits: u32,
        reply_direction: Option<u32>,
    ) {
        let i = idx as usize;
        let s = &mut self.serves[i];
        s.begin_call(xid, filled, count, reply_buffers);
        s.reply_direction = reply_direction;
        s.maybe_reply = false;
        s.hdr_credits = credits;
        self.active_calls += count;
        self.stats.max_active_calls = self.stats.max_active_calls.max(self.active_calls);
        if count > 1 {
            self.note_group_messages(count);
            self.process_serve(i, ServeEvent::GroupStarted);
        }
    }

    /// Gives back slot `idx`, just taken for a group whose first
    /// transmission was refused.
    pub(super) fn return_group_slot(&mut self, idx: u32) {
        let dest = self.serves[idx as usize].message;
        self.bufs.release_bulk(dest);
        self.serve_free.push(idx);
    }

    /// The call in slot `idx` is whole (the last transmission of its
    /// group came): on as a call with nothing to pull.
    pub(super) fn finish_serve_group(&mut self, now: Instant, idx: u32) {
        self.process_serve(idx as usize, ServeEvent::CallAccepted { now });
    }

    /// The group being reassembled in slot `idx` broke off.
    pub(super) fn drop_serve_group(&mut self, idx: usize) {
        self.process_serve(idx, ServeEvent::GroupDropped);
    }

    /// (xid, message buffer, call length) of responder slot `idx`: the
    /// call is at the start of the buffer, and the reply goes there once
    /// the call has been read.
    pub(super) fn responder_slot_message(&self, idx: usize) -> (u32, BufId, u32) {
        let s = &self.serves[idx];
        (s.xid, s.message, s.call_len)
    }

    /// Sends the reply the engine itself encoded at the start of slot
    /// `idx`'s reply buffer (`len` bytes, no DDP item).
    pub(super) fn post_encoded_reply(
        &mut self,
        now: Instant,
        idx: usize,
        len: usize,
    ) -> Result<(), ReplyError> {
        let plan = self.plan_reply(idx, len, &[])?;
        self.post_reply(now, idx, plan)
    }

    /// The reassembled call message of `call` (while it waits for its
    /// reply).
    pub fn call_message(&self, call: IncomingCall) -> Option<&[u8]> {
        let s = self.executing(call)?;
        self.bufs.bytes(s.message).get(..s.call_len as usize)
    }

    /// Length of `call`'s RPC header (`xid` through the verifier, RFC 5531
    /// s9), as the engine's parse of it found (while it waits for its
    /// reply): a service given it need not parse the header again. An
    /// accessor rather than an `Event::CallArrived` field, so existing
    /// matches keep compiling.
    pub fn call_header_len(&self, call: IncomingCall) -> Option<usize> {
        self.executing(call).map(|s| s.header_len as usize)
    }

    fn executing(&self, call: IncomingCall) -> Option<&ServeSlot> {
        self.serves
            .get(call.index as usize)
            .filter(|s| s.state == ServeState::Executing && s.generation == call.generation)
    }

    /// Answers `call`. The message is copied into the slot's reply buffer
    /// (the source of any RDMA Write), then the Writes and the Send are
    /// queued.
    ///
    /// # Errors
    /// [`ReplyError`]; after `TooLarge`, `DdpTooLarge`, `BadDdpItem` and
    /// `NotTheReply` the call is still waiting for a (smaller) reply.
    ///
    /// ```text
    /// reply = xid vers=1 credits=grant RDMA_MSG   read_list=0 write_list reply_chunk=0 rpc_reply
    ///       / xid vers=1 credits=grant RDMA_NOMSG read_list=0 write_list reply_chunk
    /// write_list  = the call's write chunks; the first holds the DDP item
    ///               (lengths = bytes written, roundup not written), the
    ///               others come back with zero lengths        -- s3.6
    /// reply_chunk = the call's reply chunk, lengths = bytes written -- s5.2
    /// ```
    pub fn send_reply(
        &mut self,
        now: Instant,
        call: IncomingCall,
        reply: &OutgoingReply<'_>,
    ) -> Result<(), ReplyError> {
        if self.closed.is_some() {
            return Err(ReplyError::Closed);
        }
        let s = self.executing(call).ok_or(ReplyError::StaleHandle)?;
        let msg = reply.message;
        if peek_xid(msg) != Some(s.xid) || peek_direction(msg) != Some(MessageType::Reply) {
            return Err(ReplyError::NotTheReply);
        }
        if msg.len() > self.bufs.buf_len(s.message) as usize {
            return Err(ReplyError::TooLarge);
        }
        if !ddp_items_fit(reply.ddp, msg) {
            return Err(ReplyError::BadDdpItem);
        }
        let idx = call.index as usize;
        let plan = self.plan_reply(idx, msg.len(), reply.ddp)?;
        let inline_len = plan.inline_len;
        let reply_buf = self.serves[idx].message;
        // Place the reply: inline part (message without the placed DDP
        // data and their padding) at 0, the placed data right after it,
        // item after item in write-chunk order.
        let out = self.bufs.bytes_mut(reply_buf);
        let placed = (|| -> Option<()> {
            let (mut from, mut to, mut data) = (0usize, 0usize, inline_len);
            for (k, d) in reply.ddp.iter().enumerate().take(MAX_DDP_ITEMS) {
                if plan.placed & (1 << k) == 0 {
                    continue;
                }
                let (off, dlen) = (d.offset as usize, d.len as usize);
                let keep = off.checked_sub(from)?;
                out.get_mut(to..to + keep)?
                    .copy_from_slice(msg.get(from..off)?);
                to += keep;
                out.get_mut(data..data + dlen)?
                    .copy_from_slice(msg.get(off..off + dlen)?);
                data += dlen;
                from = off + roundup4(u64::from(d.len)) as usize;
            }
            let rest = msg.len().checked_sub(from)?;
            out.get_mut(to..to + rest)?
                .copy_from_slice(msg.get(from..)?);
            (to + rest == inline_len).then_some(())
        })();
        // The checks above make a miss impossible; refuse rather than panic.
        if placed.is_none() {
            return Err(ReplyError::TooLarge);
        }

        self.post_reply(now, idx, plan)
    }

    /// The reply buffer of `call`, whole, for a reply encoded in place
    /// ([`Connection::send_reply_in_place`]). It still holds the call
    /// message ([`Connection::call_message`]), which the reply overwrites:
    /// copy the call out first.
    pub fn reply_buffer(&mut self, call: IncomingCall) -> Option<&mut [u8]> {
        let id = self.executing(call)?.message;
        Some(self.bufs.bytes_mut(id))
    }

    /// Answers `call` with the reply message the service encoded in place:
    /// the first `len` bytes of [`Connection::reply_buffer`], `ddp` its
    /// DDP-eligible item. The same checks and errors as
    /// [`Connection::send_reply`], but the message is not copied: a reply
    /// of 256 KiB costs a pass over its bytes less.
    ///
    /// The layout the Writes and the Send read (inline part at 0, the
    /// placed item right after it) is the message's own when nothing
    /// follows the item, as in the READ results of NFS and of the bench
    /// program; otherwise the tail after the item is rotated in front of
    /// it. After an error the call waits for another reply, which has to
    /// come through `send_reply`: the buffer no longer holds the call.
    ///
    /// # Errors
    /// [`ReplyError`], as for `send_reply`.
    pub fn send_reply_in_place(
        &mut self,
        now: Instant,
        call: IncomingCall,
        len: usize,
        ddp: Option<DdpItem>,
    ) -> Result<(), ReplyError> {
        if self.closed.is_some() {
            return Err(ReplyError::Closed);
        }
        let s = self.executing(call).ok_or(ReplyError::StaleHandle)?;
        let (id, xid) = (s.message, s.xid);
        let ddp = ddp.as_slice();
        let msg = self.bufs.bytes(id).get(..len).ok_or(ReplyError::TooLarge)?;
        if peek_xid(msg) != Some(xid) || peek_direction(msg) != Some(MessageType::Reply) {
            return Err(ReplyError::NotTheReply);
        }
        if !ddp_items_fit(ddp, msg) {
            return Err(ReplyError::BadDdpItem);
        }
        let idx = call.index as usize;
        let plan = self.plan_reply(idx, len, ddp)?;
        if let Some(d) = ddp.first().filter(|_| plan.placed & 1 != 0) {
            // [head | data | pad | tail] becomes [head | tail | data | pad].
            let off = d.offset as usize;
            let after = off + roundup4(u64::from(d.len)) as usize;
            if len.checked_sub(after).map(|tail| off + tail) != Some(plan.inline_len) {
                // `plan_reply` places this one item or none.
                return Err(ReplyError::BadDdpItem);
            }
            if after < len {
                let out = self.bufs.bytes_mut(id);
                if let Some(moved) = out.get_mut(off..len) {
                    moved.rotate_left(after - off);
                }
            }
        }
        self.post_reply(now, idx, plan)
    }

    /// Queues the Writes and the Send of the reply laid out in slot
    /// `idx`'s reply buffer per `plan` (inline part at 0, DDP data after
    /// it), and moves the slot to `AwaitingCompletions`.
    ///
    /// # Errors
    /// `TooLarge` if the header does not fit the Send buffer, which
    /// `plan_reply` rules out; nothing is queued then.
    fn post_reply(&mut self, now: Instant, idx: usize, plan: ReplyPlan) -> Result<(), ReplyError> {
        let ReplyPlan {
            chunk_lens,
            inline_len,
            use_reply_chunk,
            use_read_chunk,
            use_group,
            group_item,
            ..
        } = plan;
        let s = &self.serves[idx];
        let (reply_buf, send_buf, generation) = (s.message, s.send_buf, s.generation);
        if use_group {
            return self.post_reply_group(now, idx, inline_len as u32, group_item);
        }
        // Expose a reply read chunk first: with key windows its key is
        // taken here, and its bind queued ahead of the Send.
        if use_read_chunk && !self.expose(reply_buf, Access::RemoteRead, 0, inline_len as u32) {
            return Err(ReplyError::NoKeyWindow);
        }
        let credits = self.grant_to_send(self.serves[idx].hdr_credits);
        // Header chunk lists, lengths rewritten to what is written.
        let h = &mut self.tx_hdr;
        h.chunks.clear();
        let peer = &self.serves[idx].peer_chunks;
        for c in peer.write_chunks() {
            let _ = h.chunks.push_write_chunk(c.segments);
        }
        for i in 0..h.chunks.write_chunk_count() {
            let n = chunk_lens.get(i).map_or(0, |&n| u64::from(n));
            if let Some(segs) = h.chunks.write_chunk_mut(i) {
                fill_lengths(segs, n);
            }
        }
        if use_reply_chunk {
            if let Some(rc) = peer.reply() {
                h.chunks.set_reply(rc.segments);
            }
            if let Some(segs) = h.chunks.reply_mut() {
                fill_lengths(segs, inline_len as u64);
            }
        }
        if use_read_chunk {
            // read_list = one position-zero chunk over the reply (s5.1
            // shape, draft-lever s4.1)
            h.chunks.push_read(ReadSegment {
                position: 0,
                segment: self.bufs.segment(reply_buf, 0, inline_len as u32),
            });
        }
        h.xid = self.serves[idx].xid;
        h.vers = RPCRDMA_VERSION;
        h.credits = credits;
        h.body = if use_reply_chunk || use_read_chunk {
            MessageBody::NoMsg
        } else {
            MessageBody::Msg
        };

        // Every op is numbered (`WrId::for_op`): refuse a reply that would
        // post more than the numbers allow (thousands of segments).
        let segments = self
            .tx_hdr
            .chunks
            .write_chunks()
            .chain(self.tx_hdr.chunks.reply())
            .flat_map(|c| c.segments.iter())
            .filter(|s| s.length > 0)
            .count();
        if segments >= MAX_OPS as usize {
            if use_read_chunk {
                self.unexpose(reply_buf);
            }
            return Err(ReplyError::TooLarge);
        }
        // RDMA Writes first (RFC 5666 s3.8: placed before the reply is
        // processed), sourced from the reply buffer.
        let mut ops = 0u32;
        let mut src = inline_len as u32;
        for segs in self.tx_hdr.chunks.write_chunks() {
            for seg in segs.segments.iter().filter(|s| s.length > 0) {
                self.tx.push_back(WorkRequest::RdmaWrite {
                    wr_id: WrId::for_op(WrKind::ChunkWrite, idx as u32, generation, ops),
                    local: LocalSlice {
                        buf: reply_buf,
                        offset: src,
                        len: seg.length,
                    },
                    remote: *seg,
                });
                src += seg.length;
                ops += 1;
            }
        }
        if let Some(rc) = self.tx_hdr.chunks.reply() {
            let mut src = 0u32;
            for seg in rc.segments.iter().filter(|s| s.length > 0) {
                self.tx.push_back(WorkRequest::RdmaWrite {
                    wr_id: WrId::for_op(WrKind::ChunkWrite, idx as u32, generation, ops),
                    local: LocalSlice {
                        buf: reply_buf,
                        offset: src,
                        len: seg.length,
                    },
                    remote: *seg,
                });
                src += seg.length;
                ops += 1;
            }
        }
        let hlen = match self.tx_hdr.emit(self.bufs.bytes_mut(send_buf)) {
            Ok(n) => n,
            Err(_) => {
                // The size check above makes this unreachable; undo the
                // queued Writes rather than panic.
                for _ in 0..ops {
                    self.tx.pop_back();
                }
                if use_read_chunk {
                    self.unexpose(reply_buf);
                }
                return Err(ReplyError::TooLarge);
            }
        };
        let mut total = hlen;
        if !use_reply_chunk && !use_read_chunk {
            let src = LocalSlice {
                buf: reply_buf,
                offset: 0,
                len: inline_len as u32,
            };
            self.bufs.copy(src, send_buf, hlen);
            total += inline_len;
        }
        self.tx.push_back(WorkRequest::Send {
            wr_id: WrId::for_op(WrKind::ReplySend, idx as u32, generation, ops),
            local: LocalSlice {
                buf: send_buf,
                offset: 0,
                len: total as u32,
            },
            gather: None,
            invalidate_rkey: self.remote_invalidation_for(idx),
        });
        self.process_serve(
            idx,
            ServeEvent::ReplyPosted {
                now,
                ops: ops + 1,
                exposed: use_read_chunk,
            },
        );
        Ok(())
    }

    /// Queues the reply in slot `idx`'s message buffer (`len` bytes) as a
    /// transmission group (rtrext s4.2, s9.3) into the receives its call
    /// reserved (`plan_reply` checked they suffice). If the call directed
    /// its reply's item (s7.4), `item` (the reply's first DDP-eligible
    /// one) is placed by Send when it is long enough and its layout fits
    /// those receives; otherwise the header answers too short (the item
    /// inline) or no item.
    ///
    /// # Errors
    /// `TooLarge` if the group does not fit the slot's group buffer,
    /// which `plan_reply` rules out; nothing is queued then.
    fn post_reply_group(
        &mut self,
        now: Instant,
        idx: usize,
        len: u32,
        item: Option<DdpItem>,
    ) -> Result<(), ReplyError> {
        let credits = self.grant_to_send(self.serves[idx].hdr_credits);
        let s = &self.serves[idx];
        let limit = self
            .config
            .inline_send_size
            .min(self.config.peer_inline_recv_size);
        let mut g = super::continuation::GroupSend {
            xid: s.xid,
            credits,
            kind: crate::wire::rtrext::GroupKind::Response,
            reply_buffers: 0,
            message: s.message,
            len,
            group_buf: s.group_buf,
            limit,
            wr_id: WrId::for_op(WrKind::ReplySend, idx as u32, s.generation, 0),
            place: None,
            direct_reply: None,
            answer: None,
        };
        if let Some(min_len) = s.reply_direction {
            let most = (1 + s.reply_buffers).min(self.config.max_group_transmissions);
            g.place = item
                .filter(|d| d.len >= min_len && self.places())
                .and_then(|d| {
                    super::placement::plan(
                        &self.peer_targets,
                        limit,
                        len,
                        d,
                        g.first_header_len(),
                        super::continuation::CONTINUE_HEADER_LEN,
                    )
                    .filter(|p| p.count <= most)
                });
            if g.place.is_none() {
                g.answer = Some(match item {
                    Some(d) => (PlacementType::TooShort, d),
                    None => (PlacementType::NoItem, DdpItem::default()),
                });
            }
        }
        let sends = self.queue_group(&g);
        if sends == 0 {
            return Err(ReplyError::TooLarge);
        }
        if sends > 1 {
            self.stats.reply_groups_sent += 1;
        }
        if g.place.is_some() {
            self.stats.items_placed_sent += 1;
        }
        self.process_serve(
            idx,
            ServeEvent::ReplyPosted {
                now,
                ops: sends,
                exposed: false,
            },
        );
        Ok(())
    }

    /// Decides how a reply of `msg_len` bytes with DDP items `ddp`
    /// travels (before anything is copied or queued): item k goes into the
    /// call's write chunk k (an empty or missing chunk is RFC 8267's
    /// "return it inline"), then inline vs reply chunk for the rest.
    fn plan_reply(
        &self,
        idx: usize,
        msg_len: usize,
        ddp: &[DdpItem],
    ) -> Result<ReplyPlan, ReplyError> {
        let s = &self.serves[idx];
        let (mut chunk_lens, mut placed, mut elided) = ([0u32; MAX_DDP_ITEMS], 0u8, 0usize);
        for (k, (d, chunk)) in ddp
            .iter()
            .zip(s.peer_chunks.write_chunks())
            .enumerate()
            .take(MAX_DDP_ITEMS)
        {
            let cap = chunk.len_bytes();
            if cap == 0 {
                continue;
            }
            if u64::from(d.len) > cap {
                return Err(ReplyError::DdpTooLarge);
            }
            chunk_lens[k] = d.len;
            placed |= 1 << k;
            elided += roundup4(u64::from(d.len)) as usize;
        }
        let inline_len = msg_len - elided;
        // The reply header returns the call's write list (RFC 5666 s3.6).
        let wchunks = s.peer_chunks.write_chunk_count();
        let wsegs: usize = s.peer_chunks.write_chunks().map(|c| c.segments.len()).sum();
        let hdr = |reads, reply| chunked_header_len(reads, wchunks, wsegs, reply);
        let send_limit = self
            .config
            .inline_send_size
            .min(self.config.peer_inline_recv_size) as usize;
        let (mut use_reply_chunk, mut use_read_chunk, mut use_group) = (false, false, false);
        // A call that reserved receives for a continued reply (rtrext
        // s4.3, s9.2) brought no chunks: its reply goes as a group when it
        // fits the receives reserved and the Sends we send at most.
        // A reply to a call that directed its item (rtrext s7.4) answers
        // the direction in its header: placed, or inline if it must.
        let answer = s
            .reply_direction
            .map_or(0, |_| super::placement::ANSWER_HEADER_LEN);
        let group_fits = || {
            super::continuation::transmissions(
                inline_len as u32,
                send_limit as u32,
                super::continuation::RESPONSE_HEADER_LEN + answer,
            )
            .is_some_and(|n| n <= (1 + s.reply_buffers).min(self.config.max_group_transmissions))
        };
        if hdr(0, None) + inline_len > send_limit {
            match s.peer_chunks.reply() {
                _ if s.reply_buffers > 0 && placed == 0 && self.continues() && group_fits() => {
                    use_group = true;
                }
                Some(rc)
                    if inline_len as u64 <= rc.len_bytes()
                        && hdr(0, Some(rc.segments.len())) <= send_limit =>
                {
                    use_reply_chunk = true;
                }
                // Every requester-provided resource is too small: expose
                // the reply in a position-zero read chunk, if both peers
                // support it (draft-lever s4.1.1).
                _ if self.reply_read_chunks()
                    && self.dones_pending < self.config.max_reply_read_chunks
                    && hdr(1, None) <= send_limit =>
                {
                    use_read_chunk = true;
                }
                _ => return Err(ReplyError::TooLarge),
            }
        }
        Ok(ReplyPlan {
            chunk_lens,
            placed,
            inline_len,
            use_reply_chunk,
            use_read_chunk,
            use_group,
            group_item: ddp.first().copied(),
        })
    }

    pub(super) fn on_reply_op_done(&mut self, wr_id: WrId) {
        let i = wr_id.index as usize;
        if i < self.serves.len() {
            self.process_serve(i, ServeEvent::ReplyOpDone { wr_id });
        } else {
            self.stats.stale_completions += 1;
        }
    }

    /// The requester's key the reply to slot `idx` invalidates with Send
    /// With Invalidate: when the peer accepts it (RFC 8797) and every
    /// segment of the call's read list, write list and reply chunk carries
    /// the same handle (RFC 8166 s3.4.4 lets one key be invalidated; as
    /// Linux's svcrdma, we invalidate only when that ends every exposure of
    /// the call). The requester invalidates anything else itself.
    fn remote_invalidation_for(&self, idx: usize) -> Option<u32> {
        if !self.config.peer_remote_invalidate {
            return None;
        }
        let s = &self.serves[idx];
        let reads = s.reads.iter().map(|r| r.seg.handle);
        let writes = s
            .peer_chunks
            .write_chunks()
            .flat_map(|c| c.segments.iter().map(|g| g.handle));
        let reply = s
            .peer_chunks
            .reply()
            .into_iter()
            .flat_map(|c| c.segments.iter().map(|g| g.handle));
        super::inval::single_handle(reads.chain(writes).chain(reply))
    }

    /// RDMA_DONE for `xid` (RFC 5666 s3.8): the requester pulled the reply
    /// we exposed; withdraw it. A DONE matching nothing is dropped
    /// silently (draft-lever s4.1.3).
    pub(super) fn on_done(&mut self, xid: u32) {
        let Some(i) = self
            .serves
            .iter()
            .position(|s| s.done_pending && s.xid == xid)
        else {
            self.stats.done_ignored += 1;
            return;
        };
        self.process_serve(i, ServeEvent::DoneArrived);
    }

    /// The exposure of slot `i`'s reply ends (DONE, timer or close).
    fn withdraw_exposure(&mut self, i: usize) {
        let s = &mut self.serves[i];
        s.done_pending = false;
        let buf = s.message;
        self.dones_pending = self.dones_pending.saturating_sub(1);
        self.unexpose(buf);
    }

    /// `Timer::DoneReclaim` fired: withdraw every exposed reply whose
    /// deadline passed (RFC 5666 s3.8, s11: a requester that never sends
    /// RDMA_DONE does not pin our memory), then re-arm.
    pub(super) fn reclaim_exposed_replies(&mut self, now: Instant) {
        for i in 0..self.serves.len() {
            let s = &self.serves[i];
            if s.done_pending && s.done_deadline <= now {
                self.process_serve(i, ServeEvent::DoneTimeout);
            }
        }
        self.arm_done_reclaim();
    }

    fn arm_done_reclaim(&mut self) {
        let next = self
            .serves
            .iter()
            .filter(|s| s.done_pending)
            .map(|s| s.done_deadline)
            .min();
        match next {
            Some(t) => self.timers.set(Timer::DoneReclaim, t),
            None => self.timers.stop(Timer::DoneReclaim),
        }
    }

    /// Slot `idx` has just become `Free`: the exchange is over and no
    /// work request names its buffers. Gives back a leased bulk buffer
    /// and the slot itself, under a new generation (stale handles and
    /// completions no longer match it).
    fn free_serve(&mut self, idx: usize) {
        let message = self.serves[idx].message;
        self.bufs.release_bulk(message);
        let s = &mut self.serves[idx];
        s.generation = s.generation.wrapping_add(1);
        s.reads.clear();
        s.maybe_reply = false;
        self.serve_free.push(idx as u32);
    }

    /// Connection closed: calls being served are dropped; slots with work
    /// still posted wait for its flush.
    pub(super) fn close_responder(&mut self) {
        self.read_fifo.clear();
        self.drop_parked();
        self.bufs.stop_waiting_for_bulk();
        self.active_calls = 0;
        self.dones_pending = 0;
        for idx in 0..self.serves.len() {
            self.process_serve(idx, ServeEvent::Closed);
        }
    }

    /// Moves responder slot `idx` on by `event`: the one place a serve
    /// slot changes state (SPDK's `nvmf_rdma_request_process`). The entry
    /// points (`on_call`, `on_read_done`, `post_reply`, `on_reply_op_done`,
    /// `on_done`, `reclaim_exposed_replies`, `close_responder`) only turn
    /// what they saw into a `ServeEvent`; after an event that may release
    /// the slot it settles as far as what still holds it allows (posted
    /// work, the exposure of its reply).
    ///
    /// ```text
    /// state                event                            -> state                RFC 5666
    /// -------------------  -------------------------------  ---------------------   -----------
    /// Free                 CallAccepted, Reads listed       -> PullingReadChunks    s3.3, s3.4
    /// Free                 CallAccepted, no Reads           -> (CallComplete)
    /// Free                 GroupStarted                     -> ReceivingGroup       rtrext s4.2, s9.2
    /// ReceivingGroup       CallAccepted (the last came)     -> (CallComplete)       rtrext s9.4
    /// ReceivingGroup       GroupDropped                     -> Free (credits back)  rtrext s9.5
    /// PullingReadChunks    ReadDone, Reads still due        -> PullingReadChunks    s3.3
    /// PullingReadChunks    ReadDone, failed                 -> PullingReadChunks    (the close
    ///                                                          that follows drains it)
    /// PullingReadChunks    ReadDone, the last, ok           -> (CallComplete)       s3.7
    /// Free|PullingRead..   CallComplete, a call             -> Executing            (CallArrived)
    ///   (and ReceivingGroup, for every CallComplete row)
    /// Free|PullingRead..   CallComplete, CONF_RDMA served   -> Executing, then      s6
    ///                                                          ReplyPosted
    /// Free|PullingRead..   CallComplete, not a call / XID   -> Free                 s4.2 ERR_CHUNK
    /// Free|PullingRead..   CallComplete, a pulled REPLY     -> Free                 draft-lever s4.1
    ///                                                          (handed to the requester half)
    /// Free|PullingRead..   CallComplete, beyond the grant   -> Closed: Free         s3.3
    /// Executing            ReplyPosted                      -> AwaitingCompletions  s3.6, s5.2
    ///                      (a reply group: its Sends)                              rtrext s9.3
    /// AwaitingCompletions  ReplyOpDone, more due            -> AwaitingCompletions
    /// AwaitingCompletions  ReplyOpDone, the last            -> Free
    /// AwaitingCompletions  ReplyOpDone, the last, exposed   -> AwaitingDone         s3.8
    /// AwaitingCompletions  DoneArrived | DoneTimeout        -> AwaitingCompletions  s3.8
    ///                                                          (exposure withdrawn)
    /// AwaitingDone         DoneArrived | DoneTimeout        -> Free                 s3.8, s11
    /// any but Free         Closed, work posted              -> Draining
    /// any                  Closed, nothing posted           -> Free
    /// Draining             ReadDone | ReplyOpDone, more due -> Draining
    /// Draining             ReadDone | ReplyOpDone, the last -> Free
    /// other                ReadDone | ReplyOpDone           -> unchanged            (stale, counted)
    /// ```
    ///
    /// `CallComplete` is raised here, not by an entry point. Entering
    /// `Free` frees the slot (`free_serve`: new generation, bulk
    /// buffer back). Re-entrant: a close inside a step (a call beyond the
    /// grant) processes `Closed` for every slot, this one included, before
    /// the step returns, and the step changes nothing after it.
    pub(super) fn process_serve(&mut self, idx: usize, event: ServeEvent) {
        use ServeEvent as E;
        use ServeState as S;
        let s = &mut self.serves[idx];
        let then = match (s.state, event) {
            (S::Free, E::GroupStarted) => {
                s.state = S::ReceivingGroup;
                Then::Return
            }
            (S::ReceivingGroup, E::GroupDropped) => {
                self.active_calls = self.active_calls.saturating_sub(s.credits_held);
                s.state = S::Free;
                self.free_serve(idx);
                Then::Return
            }
            (S::Free | S::ReceivingGroup, E::CallAccepted { now }) => {
                if s.reads.is_empty() {
                    self.process_serve(idx, E::CallComplete { now });
                } else {
                    s.state = S::PullingReadChunks;
                    self.read_fifo.push_back(ReadOwner::Serve(idx as u32));
                    self.pump_reads();
                }
                Then::Return
            }
            (S::Free | S::PullingReadChunks | S::ReceivingGroup, E::CallComplete { now }) => {
                match self.examine_call(idx) {
                    Examined::Reply => {
                        let r = self.take_pulled_reply(idx);
                        self.serves[idx].state = S::Free;
                        self.free_serve(idx);
                        self.hand_over_pulled_reply(r);
                    }
                    // The close has drained the slot already.
                    Examined::Overrun => {}
                    Examined::NotACall => {
                        self.refuse_call(idx);
                        self.serves[idx].state = S::Free;
                        self.free_serve(idx);
                    }
                    Examined::Call {
                        program,
                        version,
                        procedure,
                        hl,
                    } => {
                        let s = &mut self.serves[idx];
                        let (xid, generation, len) = (s.xid, s.generation, s.call_len);
                        s.state = S::Executing;
                        s.header_len = hl as u32;
                        self.stats.calls_received += 1;
                        let first = !self.first_call_delivered;
                        self.first_call_delivered = true;
                        if self.config.serve_conf_rdma && program == CONFIG_RDMA_PROG {
                            // Answered in-band by the engine itself (RFC
                            // 5666 s6): `ReplyPosted` on success.
                            if !self.answer_conf_rdma(now, idx, version, procedure, hl, first) {
                                self.refuse_call(idx);
                                self.serves[idx].state = S::Free;
                                self.free_serve(idx);
                            }
                        } else {
                            self.events.push_back(Event::CallArrived {
                                call: IncomingCall {
                                    index: idx as u32,
                                    generation,
                                },
                                xid,
                                program,
                                version,
                                procedure,
                                len,
                            });
                        }
                    }
                }
                Then::Return
            }
            (S::PullingReadChunks | S::Draining, E::ReadDone { now, wr_id, ok })
                if wr_id.same_generation(s.generation)
                    && s.reads_done < s.reads_issued
                    && s.reads_seen.first_completion(wr_id.op(), s.reads_issued) =>
            {
                s.reads_done += 1;
                s.ops_in_flight -= 1;
                let whole = s.state == S::PullingReadChunks && s.reads_done == s.reads.len();
                self.reads_in_flight = self.reads_in_flight.saturating_sub(1);
                // A failed Read is not delivered: the connection closes
                // right after (every error completion does), which drains
                // the slot.
                if ok && whole {
                    self.process_serve(idx, E::CallComplete { now });
                }
                Then::SettleAndPumpReads
            }
            (S::Executing, E::ReplyPosted { now, ops, exposed }) => {
                let held = s.credits_held;
                s.ops_in_flight = ops;
                s.reply_ops_posted = ops;
                s.reply_ops_seen.reset(ops as usize);
                s.state = S::AwaitingCompletions;
                if exposed {
                    s.done_pending = true;
                    s.done_deadline = now.saturating_add(self.config.done_timeout);
                    self.dones_pending += 1;
                    self.stats.replies_exposed += 1;
                    self.arm_done_reclaim();
                }
                self.active_calls = self.active_calls.saturating_sub(held);
                self.stats.replies_sent += 1;
                Then::Return
            }
            // Only a reply op the slot posted, once: while a Read of the
            // call is still posted (a slot closed while pulling), a forged
            // reply-op completion must not free the slot under the Read,
            // which still writes into its buffer and holds the
            // connection's Read count; nor may a repeated one free it
            // under a Write or the Send still posted.
            (S::AwaitingCompletions | S::Draining, E::ReplyOpDone { wr_id })
                if wr_id.same_generation(s.generation)
                    && s.ops_in_flight as usize > s.reads_issued - s.reads_done
                    && s.reply_ops_seen
                        .first_completion(wr_id.op(), s.reply_ops_posted as usize) =>
            {
                s.ops_in_flight -= 1;
                Then::Settle
            }
            (_, E::ReadDone { .. } | E::ReplyOpDone { .. }) => {
                self.stats.stale_completions += 1;
                Then::Return
            }
            (S::AwaitingCompletions | S::AwaitingDone, E::DoneArrived | E::DoneTimeout) => {
                if matches!(event, E::DoneArrived) {
                    self.stats.done_received += 1;
                } else {
                    self.stats.done_timeouts += 1;
                }
                self.withdraw_exposure(idx);
                Then::Settle
            }
            (state, E::Closed) => {
                if s.done_pending {
                    self.withdraw_exposure(idx);
                }
                if state != S::Free {
                    self.serves[idx].state = S::Draining;
                }
                Then::Settle
            }
            // No entry point raises these: a reply needs `Executing`
            // (`send_reply` checks it), only an exposed reply's slot is
            // found by DONE or the timer, and only a free slot is taken.
            (_, E::CallAccepted { .. } | E::CallComplete { .. } | E::ReplyPosted { .. })
            | (_, E::DoneArrived | E::DoneTimeout | E::GroupStarted | E::GroupDropped) => {
                debug_assert!(false, "serve slot {idx}: {event:?} in {:?}", s.state);
                Then::Return
            }
        };
        if then == Then::Return {
            return;
        }
        // Settle: release the slot once nothing holds it.
        let s = &mut self.serves[idx];
        match s.state {
            S::AwaitingCompletions if s.ops_in_flight == 0 && s.done_pending => {
                s.state = S::AwaitingDone;
            }
            S::AwaitingCompletions | S::Draining if s.ops_in_flight == 0 => {
                s.state = S::Free;
                self.free_serve(idx);
            }
            S::AwaitingDone if !s.done_pending => {
                s.state = S::Free;
                self.free_serve(idx);
            }
            _ => {}
        }
        if then == Then::SettleAndPumpReads {
            self.pump_reads();
        }
    }
}
