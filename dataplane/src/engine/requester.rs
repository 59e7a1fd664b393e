//! The requester half: our calls, from encoding to the reply.
//!
//! Chunk decisions are made first, in [`plan_call`], then the header is
//! encoded to match (the Linux `rpc_rdma.c` order):
//! * the reply's resources: a write chunk when the caller names a
//!   DDP-eligible result, a reply chunk when the reply (less a DDP item
//!   expected in the write chunk) might not fit our inline receive size;
//! * the call: inline (RDMA_MSG) if header and message fit the peer's
//!   inline receive size; else the DDP-eligible argument moves to a read
//!   chunk at its XDR position if the rest then fits; else the whole
//!   message becomes a position-zero read chunk of an RDMA_NOMSG (long
//!   call, RFC 5666 s5.1).
//!
//! Credits (RFC 5666 s3.3): every call requests `max_outstanding_calls`
//! (with message continuation in use, room for one group beside them:
//! `Connection::credits_wanted`);
//! every reply's grant replaces ours (a grant of 0 counts as 1, as Linux
//! reads it); calls beyond the grant wait in `call_queue`, in order.

use super::buffers::{Access, BufClass, BufId, BufferTableBuilder, LocalSlice};
use super::connection::{PendingRead, ReadOwner};
use super::continuation::{self, GroupSend, CONTINUE_HEADER_LEN, RESPONSE_HEADER_LEN};
use super::placement::{self, ResultDirection};
use super::time::{Instant, Timer};
use super::wr::{OpSet, WorkRequest, WrId, WrKind, MAX_OPS};
use super::{
    app_ddp_item_fits, ddp_item_fits, roundup4, AppSlice, CallFailure, CallHandle, Config,
    Connection, DdpItem, Event, OutgoingCall, ReplyExpect, SendCallError,
};
use crate::mem::PeerBytes;
use crate::wire::rpc::{peek_direction, peek_xid, MessageType};
use crate::wire::rpcrdma::{
    chunked_header_len, ErrorBody, MessageBody, ReadSegment, Segment, TransportHeader,
    RPCRDMA_VERSION,
};
use crate::wire::rtrext::GroupKind;

/// A call going as a transmission group (`Connection::call_group`): its
/// Sends and what its first header carries.
pub(super) struct CallGroup {
    count: u32,
    send: GroupSend,
}

/// Where one of our calls is (SPDK-style request state). Every transition
/// is made by `Connection::process_call`, whose doc comment holds the
/// table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CallState {
    /// Unused; its buffers are not exposed.
    Free,
    /// Encoded into the slot's call buffer and planned; waiting for a
    /// credit (the peer's grant is used up).
    Queued,
    /// Send posted; waiting for the reply. Read-chunk and reply-chunk
    /// buffers are exposed to the peer. Holds one credit.
    Sent,
    /// The reply came as an RDMA_NOMSG with a position-zero read chunk
    /// (responder-provided, draft-lever s4.1): RDMA Reads pull it into the
    /// reply buffer; RDMA_DONE follows when they complete.
    PullingReplyReadChunk,
    /// The reply is in the slot's buffers and `ReplyArrived` was emitted;
    /// the application reads it, then releases the slot.
    ReplyReady,
    /// Failed with a timeout but the peer may still answer (and write into
    /// our reply chunk): the slot and its credit stay reserved until the
    /// reply arrives or the connection closes.
    Abandoned,
    /// The exchange is over; waiting only for the Send completion of the
    /// call (and any reply Reads still in flight) before the slot is free.
    Draining,
}

/// What can happen to a requester slot: the input of
/// `Connection::process_call`. Each entry point of the requester (the
/// application's call and release, a credit, an answer, a completion, the
/// call timer, the close) turns what it saw into one of these.
#[derive(Debug, Clone, Copy)]
pub(super) enum CallEvent {
    /// `send_call` took the slot for a planned call.
    Submitted,
    /// `send_call` could not copy the call after all (unreachable: the
    /// call buffer is `max_call_size` long); the slot goes back at once.
    Refused,
    /// Credits were free: the call's Send (or the `sends` Sends of its
    /// transmission group) is being posted, its chunks exposed.
    SendPosted { sends: u32 },
    /// The reply is in the slot's buffers (`len` bytes, `ddp_len` in the
    /// write chunk).
    ReplyPlaced { len: u32, ddp_len: Option<u32> },
    /// The reply is exposed in a position-zero read chunk: its Reads are
    /// listed.
    ReplyPullStarted,
    /// A Read of the reply's read chunk completed (`ok`), or was flushed.
    ReplyReadDone { wr_id: WrId, ok: bool },
    /// The call's Send completed, or was flushed.
    SendDone { wr_id: WrId },
    /// The call fails (`CallFailed` is emitted).
    Failed { reason: CallFailure },
    /// The application released the reply.
    Released,
    /// An answer arrived for a call abandoned at its timeout.
    LateAnswer,
    /// The call timer found the call's deadline passed.
    Timeout,
    /// The connection closed.
    Closed,
}

/// What `process_call` does after an event's own step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Then {
    Return,
    Settle,
    SettleAndPumpReads,
}

/// How the call itself travels (decided before encoding).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CallPlan {
    /// RDMA_MSG, whole message inline (RFC 5666 s3.1 / s4).
    Inline,
    /// RDMA_MSG, the DDP item in a read chunk at its XDR position, the rest
    /// inline without the item's data and padding (RFC 5666 s3.4, s3.7).
    ReadChunk { position: u32, len: u32 },
    /// RDMA_NOMSG, the whole message in a position-zero read chunk (RFC
    /// 5666 s5.1).
    Long,
}

/// A requester slot: state plus the four buffers it owns for its lifetime.
#[derive(Debug)]
pub(super) struct CallSlot {
    /// Changed only by `Connection::process_call`.
    pub(super) state: CallState,
    pub(super) generation: u32,
    pub(super) xid: u32,
    /// Transport header plus inline message.
    send_buf: BufId,
    /// The whole call message (read chunk source).
    call_buf: BufId,
    /// The reply message (reply chunk target).
    reply_buf: BufId,
    /// The DDP-eligible result (write chunk target).
    ddp_buf: BufId,
    /// Views of the application memory for this call's write chunk target
    /// and read chunk source (retargeted per call, [`AppChunks`]).
    write_view: BufId,
    read_view: BufId,
    /// This call's write chunk target: `ddp_buf` or `write_view`.
    write_buf: BufId,
    /// The DDP item's bytes are in `read_view`, not in the message.
    app_read: bool,
    msg_len: u32,
    /// The longest reply the call expects (`ReplyExpect::max_len`).
    reply_max: u32,
    plan: CallPlan,
    write_chunk: Option<u32>,
    reply_chunk: Option<u32>,
    /// Sends of the call posted and not completed (more than one for a
    /// transmission group).
    sends_pending: u32,
    /// Credits the call holds until its answer: 1, or the transmissions
    /// of its group (rtrext s4.3).
    group_len: u32,
    /// Continuation receives reserved for the reply's later
    /// transmissions (rtrext s9.2 `optxrq_rsbuf`).
    reply_buffers: u32,
    /// Where the call's transmission group is laid out
    /// (`Config::group_buffer_len`; empty without message continuation).
    group_buf: BufId,
    deadline: Option<Instant>,
    reply_len: u32,
    ddp_len: Option<u32>,
    /// Reads of a responder-provided reply read chunk (capacity
    /// `limits.max_read_segments`, reserved at construction).
    pub(super) reads: Vec<PendingRead>,
    reads_issued: usize,
    reads_done: usize,
    /// Which of the reply's Reads completed (each counts once).
    reads_seen: OpSet,
    /// Sends of the call posted (numbered from 0), and which completed.
    sends_posted: u32,
    sends_seen: OpSet,
}

impl CallSlot {
    pub(super) fn new(b: &mut BufferTableBuilder, c: &Config) -> CallSlot {
        let (send_buf, call_buf, reply_buf, ddp_buf) = (
            b.add(BufClass::Send, c.inline_send_size),
            b.add(BufClass::Message, c.max_call_size),
            b.add(BufClass::Reply, c.max_reply_size),
            b.add(BufClass::Ddp, c.max_ddp_size),
        );
        CallSlot {
            state: CallState::Free,
            generation: 0,
            xid: 0,
            send_buf,
            call_buf,
            reply_buf,
            ddp_buf,
            write_view: b.add(BufClass::App, 0),
            read_view: b.add(BufClass::App, 0),
            write_buf: ddp_buf,
            app_read: false,
            msg_len: 0,
            reply_max: 0,
            plan: CallPlan::Inline,
            write_chunk: None,
            reply_chunk: None,
            sends_pending: 0,
            group_len: 1,
            reply_buffers: 0,
            group_buf: b.add(BufClass::Send, c.group_buffer_len()),
            deadline: None,
            reply_len: 0,
            ddp_len: None,
            reads: Vec::with_capacity(c.limits.max_read_segments),
            reads_issued: 0,
            reads_done: 0,
            reads_seen: OpSet::default(),
            sends_posted: 0,
            sends_seen: OpSet::default(),
        }
    }

    /// Reads posted and not completed.
    fn reads_in_flight(&self) -> bool {
        self.reads_done < self.reads_issued
    }

    /// Where the reply goes (a reply chunk's target, a group's
    /// reassembly).
    pub(super) fn reply_buffer(&self) -> BufId {
        self.reply_buf
    }

    /// Whether the call is still waiting for its answer (sent, or
    /// abandoned at its timeout), in `generation`.
    pub(super) fn awaits_answer(&self, generation: u32) -> bool {
        matches!(self.state, CallState::Sent | CallState::Abandoned)
            && self.generation == generation
    }

    /// Receives this call reserved for its reply's continuations.
    pub(super) fn reply_receives(&self) -> u32 {
        self.reply_buffers
    }
}

/// The chunk decision for a call (see the module documentation).
/// `send_limit`: the largest Send the peer accepts and we may post;
/// `recv_limit`: the largest Send we receive and the peer may post. Returns the call plan, the
/// write chunk length and the reply chunk length.
pub(super) fn plan_call(
    send_limit: usize,
    recv_limit: usize,
    msg_len: usize,
    ddp: Option<DdpItem>,
    reply: ReplyExpect,
) -> Result<(CallPlan, Option<u32>, Option<u32>), SendCallError> {
    // Reply resources first: they appear in the call header in every shape.
    let write_chunk = reply.ddp_max;
    // One write chunk of one segment, or none.
    let wsegs = usize::from(write_chunk.is_some());
    let inline_reply =
        u64::from(reply.max_len) - u64::from(write_chunk.unwrap_or(0).min(reply.max_len));
    let reply_hdr = chunked_header_len(0, wsegs, wsegs, None) as u64;
    let reply_chunk = (reply_hdr + inline_reply > recv_limit as u64).then_some(reply.max_len);
    let rsegs = reply_chunk.map(|_| 1);

    let inline_hdr = chunked_header_len(0, wsegs, wsegs, rsegs);
    let chunk_hdr = chunked_header_len(1, wsegs, wsegs, rsegs);
    let plan = if inline_hdr + msg_len <= send_limit {
        CallPlan::Inline
    } else if let Some(d) = ddp.filter(|d| {
        chunk_hdr as u64 + msg_len as u64 - roundup4(u64::from(d.len)) <= send_limit as u64
    }) {
        CallPlan::ReadChunk {
            position: d.offset,
            len: d.len,
        }
    } else if chunk_hdr <= send_limit {
        CallPlan::Long
    } else {
        return Err(SendCallError::TooLarge);
    };
    Ok((plan, write_chunk, reply_chunk))
}

impl Connection {
    /// Call slots free now. A finished call's slot frees only once its
    /// Send (and any Reads of its reply) completed, and a reply may come
    /// in before the acknowledgement of its call's Send does.
    pub fn free_call_slots(&self) -> usize {
        self.call_free.len()
    }

    /// Queues a call; it is sent as soon as the peer's grant allows.
    /// The message is copied into the slot (one copy; the slot's buffer
    /// is what the peer reads for a read chunk).
    ///
    /// # Errors
    /// [`SendCallError`]: closed, no free slot, not a call, too large, a
    /// bad DDP item or an expected reply above the configured maxima.
    pub fn send_call(
        &mut self,
        now: Instant,
        call: &OutgoingCall<'_>,
    ) -> Result<CallHandle, SendCallError> {
        if self.closed.is_some() {
            return Err(SendCallError::Closed);
        }
        let msg = call.message;
        let xid = peek_xid(msg).ok_or(SendCallError::NotACall)?;
        if peek_direction(msg) != Some(MessageType::Call) {
            return Err(SendCallError::NotACall);
        }
        if msg.len() > self.config.max_call_size as usize {
            return Err(SendCallError::TooLarge);
        }
        let app_len = self.app_buf.map_or(0, |b| self.bufs.buf_len(b));
        let in_app = |a: AppSlice| u64::from(a.offset) + u64::from(a.len) <= u64::from(app_len);
        if call.app.write.is_some_and(|a| !in_app(a)) || call.app.read.is_some_and(|a| !in_app(a)) {
            return Err(SendCallError::BadAppSlice);
        }
        // The message length the peer sees: with an application read
        // source, the item's data and padding are not in `message`.
        let wire_len = match (call.app.read, call.ddp) {
            (None, _) => {
                if call.ddp.is_some_and(|d| !ddp_item_fits(&d, msg)) {
                    return Err(SendCallError::BadDdpItem);
                }
                msg.len()
            }
            (Some(a), Some(d)) if a.len == d.len && app_ddp_item_fits(&d, msg) => {
                msg.len() + crate::wire::xdr::roundup(d.len as usize)
            }
            (Some(_), _) => return Err(SendCallError::BadDdpItem),
        };
        if wire_len > self.config.max_call_size as usize {
            return Err(SendCallError::TooLarge);
        }
        let mut reply = call.reply;
        if let Some(w) = call.app.write {
            // The target is the application's range, not the slot's DDP
            // buffer: its length is the write chunk offered.
            reply.ddp_max = Some(w.len);
        } else if reply.ddp_max.is_some_and(|d| d > self.config.max_ddp_size) {
            return Err(SendCallError::ReplyTooLarge);
        }
        if reply.max_len > self.config.max_reply_size {
            return Err(SendCallError::ReplyTooLarge);
        }
        let send_limit = self
            .config
            .inline_send_size
            .min(self.config.peer_inline_recv_size);
        let (mut plan, write_chunk, reply_chunk) = plan_call(
            send_limit as usize,
            self.config
                .inline_recv_size
                .min(self.config.peer_inline_send_size) as usize,
            wire_len,
            call.ddp,
            reply,
        )?;
        if let (Some(_), Some(d)) = (call.app.read, call.ddp) {
            // A directed read source always goes by read chunk (the peer
            // pulls it from the application's memory): fitting inline
            // means the chunked form fits too; a long call cannot carry
            // it (its data would have to be in the message).
            let wsegs = usize::from(write_chunk.is_some());
            let chunked = chunked_header_len(1, wsegs, wsegs, reply_chunk.map(|_| 1)) + msg.len();
            plan = match plan {
                CallPlan::Inline | CallPlan::ReadChunk { .. } if chunked <= send_limit as usize => {
                    CallPlan::ReadChunk {
                        position: d.offset,
                        len: d.len,
                    }
                }
                _ => return Err(SendCallError::TooLarge),
            };
        }
        let idx = self.call_free.pop().ok_or(SendCallError::NoSlot)?;
        let deadline = self.config.call_timeout.map(|t| now.saturating_add(t));
        self.process_call(idx as usize, CallEvent::Submitted);
        self.call_by_xid.insert(xid, idx);
        let s = &mut self.calls[idx as usize];
        s.xid = xid;
        s.msg_len = msg.len() as u32;
        s.reply_max = reply.max_len;
        s.plan = plan;
        s.write_chunk = write_chunk;
        s.reply_chunk = reply_chunk;
        s.deadline = deadline;
        s.reply_len = 0;
        s.ddp_len = None;
        s.group_len = 1;
        s.app_read = call.app.read.is_some();
        s.write_buf = if call.app.write.is_some() {
            s.write_view
        } else {
            s.ddp_buf
        };
        let (call_buf, generation) = (s.call_buf, s.generation);
        let (write_view, read_view) = (s.write_view, s.read_view);
        if let Some(app) = self.app_buf {
            // Checked against the application memory above.
            if let Some(w) = call.app.write {
                self.bufs.retarget(write_view, app, w.offset, w.len);
            }
            if let Some(r) = call.app.read {
                self.bufs.retarget(read_view, app, r.offset, r.len);
            }
        }
        match self.bufs.bytes_mut(call_buf).get_mut(..msg.len()) {
            Some(dst) => dst.copy_from_slice(msg),
            // The call buffer is max_call_size long: unreachable.
            None => {
                self.process_call(idx as usize, CallEvent::Refused);
                return Err(SendCallError::TooLarge);
            }
        }
        if let Some(d) = deadline {
            let at = self.timers.get(Timer::CallTimeout).map_or(d, |t| t.min(d));
            self.timers.set(Timer::CallTimeout, at);
        }
        self.call_queue.push_back(idx);
        self.transmit_queued_calls();
        Ok(CallHandle {
            index: idx,
            generation,
        })
    }

    /// The reply to `call` (after `ReplyArrived`, until released): the RPC
    /// reply message, without a DDP item the responder wrote into our
    /// write chunk.
    ///
    /// A view, not a slice: the peer could write these bytes while a
    /// slice lived (`engine::buffers` docs). It ends with the borrow.
    pub fn reply_message(&self, call: CallHandle) -> Option<PeerBytes<'_>> {
        let s = self.ready_slot(call)?;
        self.bufs.peer_bytes(s.reply_buf, 0, s.reply_len as usize)
    }

    /// The DDP-eligible result the responder wrote into our write chunk
    /// (a view, as [`Connection::reply_message`]).
    pub fn reply_ddp(&self, call: CallHandle) -> Option<PeerBytes<'_>> {
        let s = self.ready_slot(call)?;
        self.bufs.peer_bytes(s.write_buf, 0, s.ddp_len? as usize)
    }

    /// The application memory ([`Config::app_memory`] bytes; empty
    /// without). The engine reads and writes only the ranges of calls in
    /// flight ([`super::AppChunks`]); keeping the application off those
    /// ranges meanwhile is the caller's part (`dataplane::client` refuses
    /// access to them).
    ///
    /// A view, not a slice: the peer writes these bytes (write chunks).
    pub fn app_memory(&self) -> PeerBytes<'_> {
        self.app_buf
            .and_then(|b| self.bufs.peer_bytes(b, 0, self.bufs.buf_len(b) as usize))
            .unwrap_or(PeerBytes::empty())
    }

    /// Copies `src` into the application memory at `offset`; false,
    /// copying nothing, if it does not fit.
    pub fn write_app_memory(&mut self, offset: usize, src: &[u8]) -> bool {
        self.app_buf
            .is_some_and(|b| self.bufs.write(b, offset, src))
    }

    /// Gives the slot of an answered call back. False for a stale handle.
    pub fn release_reply(&mut self, call: CallHandle) -> bool {
        if self.ready_slot(call).is_none() {
            return false;
        }
        self.process_call(call.index as usize, CallEvent::Released);
        true
    }

    fn ready_slot(&self, call: CallHandle) -> Option<&CallSlot> {
        self.calls
            .get(call.index as usize)
            .filter(|s| s.state == CallState::ReplyReady && s.generation == call.generation)
    }

    /// Sends queued calls while the grant allows (RFC 5666 s3.3: never
    /// more unanswered calls than the peer's latest grant).
    pub(super) fn transmit_queued_calls(&mut self) {
        // Pull completion first: the responder holds memory until it comes.
        self.transmit_dones();
        while self.closed.is_none() && self.outstanding < self.granted {
            let Some(idx) = self.call_queue.pop_front() else {
                break;
            };
            self.encode_call(idx as usize);
        }
    }

    /// Encodes and posts the Send of a planned call.
    ///
    /// ```text
    /// call = xid vers=1 credits=requested RDMA_MSG   read_list write_list reply_chunk rpc_call
    ///      ; read_list empty (inline, s3.1) or one chunk at the DDP item's position (s3.4)
    ///      / xid vers=1 credits=requested RDMA_NOMSG read_list(position 0) write_list reply_chunk
    ///      ; long call, s5.1
    /// write_list  = one chunk, one segment over the slot's DDP buffer   (s3.6)
    ///             ; or over the application's range (directed operation)
    /// reply_chunk = one segment over the slot's reply buffer            (s5.2)
    /// read chunk  = over the call buffer at the item's position, or over
    ///               the application's range when the item's data is not
    ///               in the message (directed operation)
    /// ```
    fn encode_call(&mut self, idx: usize) {
        if let Some(group) = self.call_group(idx) {
            self.encode_call_group(idx, group);
            return;
        }
        let s = &self.calls[idx];
        let (xid, plan, msg_len, wc, rc) = (s.xid, s.plan, s.msg_len, s.write_chunk, s.reply_chunk);
        let (send_buf, call_buf, reply_buf, write_buf, generation) = (
            s.send_buf,
            s.call_buf,
            s.reply_buf,
            s.write_buf,
            s.generation,
        );
        // Where the read chunk's bytes are: in the call buffer at their XDR
        // position, or in the application's range (then the message holds
        // no data and no padding for the item).
        let (read_src, read_off, app_read) = if s.app_read {
            (s.read_view, 0, true)
        } else {
            (s.call_buf, 0, false)
        };
        // Expose first: with key windows each exposure takes its key here
        // and queues its bind ahead of the Send below.
        let mut exposed = match plan {
            CallPlan::Inline => true,
            CallPlan::ReadChunk { len, .. } if app_read => {
                self.expose(read_src, Access::RemoteRead, read_off, len)
            }
            CallPlan::ReadChunk { position, len } => {
                self.expose(call_buf, Access::RemoteRead, position, len)
            }
            CallPlan::Long => self.expose(call_buf, Access::RemoteRead, 0, msg_len),
        };
        if let Some(w) = wc {
            exposed &= self.expose(write_buf, Access::RemoteWrite, 0, w);
        }
        if let Some(r) = rc {
            exposed &= self.expose(reply_buf, Access::RemoteWrite, 0, r);
        }
        if !exposed {
            self.process_call(
                idx,
                CallEvent::Failed {
                    reason: CallFailure::NoKeyWindow,
                },
            );
            return;
        }
        let credits = self.credits_wanted();
        let h = &mut self.tx_hdr;
        h.chunks.clear();
        h.xid = xid;
        h.vers = RPCRDMA_VERSION;
        h.credits = credits;
        h.body = MessageBody::Msg;
        match plan {
            CallPlan::Inline => {}
            CallPlan::ReadChunk { position, len } => h.chunks.push_read(ReadSegment {
                position,
                segment: if app_read {
                    self.bufs.segment(read_src, read_off, len)
                } else {
                    self.bufs.segment(call_buf, position, len)
                },
            }),
            CallPlan::Long => {
                h.body = MessageBody::NoMsg;
                h.chunks.push_read(ReadSegment {
                    position: 0,
                    segment: self.bufs.segment(call_buf, 0, msg_len),
                });
            }
        }
        let mut ok = true;
        if let Some(w) = wc {
            ok &= h
                .chunks
                .push_write_chunk(&[self.bufs.segment(write_buf, 0, w)])
                .is_ok();
        }
        if let Some(r) = rc {
            h.chunks.set_reply(&[self.bufs.segment(reply_buf, 0, r)]);
        }
        let hlen = match self.tx_hdr.emit(self.bufs.bytes_mut(send_buf)) {
            Ok(n) if ok => n,
            // plan_call sized the header against this buffer: unreachable,
            // but a failure fails the call, never the engine.
            _ => {
                self.process_call(
                    idx,
                    CallEvent::Failed {
                        reason: CallFailure::MalformedReply,
                    },
                );
                return;
            }
        };
        // Inline part after the header: all of it, or all but the read
        // chunk's data and its XDR padding (RFC 5666 s3.7), or nothing.
        let total = match plan {
            CallPlan::Inline => {
                let src = LocalSlice {
                    buf: call_buf,
                    offset: 0,
                    len: msg_len,
                };
                self.bufs.copy(src, send_buf, hlen);
                hlen + msg_len as usize
            }
            CallPlan::ReadChunk { position, len } => {
                let after = if app_read {
                    position
                } else {
                    position + roundup4(u64::from(len)) as u32
                };
                let head = LocalSlice {
                    buf: call_buf,
                    offset: 0,
                    len: position,
                };
                let tail = LocalSlice {
                    buf: call_buf,
                    offset: after,
                    len: msg_len - after,
                };
                self.bufs.copy(head, send_buf, hlen);
                self.bufs.copy(tail, send_buf, hlen + position as usize);
                hlen + (position + msg_len - after) as usize
            }
            CallPlan::Long => hlen,
        };
        if plan != CallPlan::Inline {
            self.stats.calls_pulled += 1;
        }
        self.process_call(idx, CallEvent::SendPosted { sends: 1 });
        self.tx.push_back(WorkRequest::Send {
            wr_id: WrId::for_op(WrKind::CallSend, idx as u32, generation, 0),
            local: LocalSlice {
                buf: send_buf,
                offset: 0,
                len: total as u32,
            },
            gather: None,
            invalidate_rkey: None,
        });
    }

    /// The credits every message of ours asks for (RFC 5666 s3.3): one
    /// per call we keep outstanding, and with message continuation in use
    /// room for one group of the longest we send beside them (each of its
    /// transmissions takes a credit, rtrext s4.3).
    pub(super) fn credits_wanted(&self) -> u32 {
        let calls = self.config.max_outstanding_calls;
        if self.continues() {
            let longest = self
                .config
                .max_group_transmissions
                .min(self.peer_group_recv_limit);
            calls + longest.saturating_sub(1)
        } else {
            calls
        }
    }

    /// Whether call `idx` goes as a Transmit Request (rtrext s9.2,
    /// `continuation.rs`): `(transmissions, receives reserved for the
    /// reply)`. When message continuation is in use, a call whose message
    /// (a DDP-eligible argument included: sending it inline is the
    /// requester's choice, RFC 8166 s3.4.3) fits a group the peer accepts
    /// (s8.4) and the grant has credits for (s4.3) goes as that group,
    /// instead of a read chunk the peer would pull (a round trip); its
    /// reply, if it might not fit inline, gets reserved receives (s8.5)
    /// instead of a reply chunk, and its DDP-eligible result an
    /// explicit-RDMA direction (or placement, `placement.rs`) instead of
    /// a write chunk. A call that needs a chunk it cannot trade this way
    /// stays Version One, as does one that fits one Send with nothing to
    /// pull (its reply's chunks cost no round trip), and a directed
    /// operation (its data is in application memory the peer reaches by
    /// RDMA).
    fn call_group(&self, idx: usize) -> Option<CallGroup> {
        if !self.continues() {
            return None;
        }
        let s = &self.calls[idx];
        // Only the call itself makes it a group: a chunk the peer would
        // have to pull (a read chunk, or the whole call in one: a round
        // trip). A reply chunk or a write chunk costs no round trip (the
        // responder's Writes precede its Send), and measured faster than
        // a reply in Sends (docs/BENCHMARKS.md, "Send-based placement"):
        // a call that fits one Send inline stays Version One, even where
        // the group's longer header would make it two.
        if s.app_read || s.write_buf != s.ddp_buf || matches!(s.plan, CallPlan::Inline) {
            return None;
        }
        let ddp_max = self.config.continuation_ddp_max;
        let argument = match s.plan {
            CallPlan::ReadChunk { len, .. } => len,
            _ => 0,
        };
        if argument.max(s.write_chunk.unwrap_or(0)) > ddp_max {
            return None;
        }
        let c = &self.config;
        let send_limit = c.inline_send_size.min(c.peer_inline_recv_size);
        let recv_limit = c.inline_recv_size.min(c.peer_inline_send_size);
        let max = c.max_group_transmissions;
        // Where the reply's DDP-eligible item goes (s7.4), once placement
        // is in use: written by RDMA into our DDP buffer (EXRW, a write
        // chunk in rtrext's words; no round trip of its own) when the rest
        // of the reply fits one Send, which then is a Version One reply
        // with the write list; placed by Send into our target segments
        // when configured so (`place_results`) or the rest is long, the
        // receives reserved covering it placed or inline.
        let rest_fits = |w: u32| {
            let hdr = chunked_header_len(0, 1, 1, None) as u64;
            let rest = u64::from(s.reply_max).saturating_sub(roundup4(u64::from(w)));
            hdr + rest <= u64::from(recv_limit)
        };
        let direct_reply = match s.write_chunk {
            Some(w) if self.places() && !c.place_results && rest_fits(w) => {
                // The segment's key is taken when the call is queued.
                Some(ResultDirection::Write(Segment {
                    handle: 0,
                    length: w,
                    offset: 0,
                }))
            }
            Some(_) if self.places() && !self.our_targets.is_empty() => {
                Some(ResultDirection::Send {
                    min_len: placement::direction_min_len(c.inline_recv_size),
                })
            }
            _ => None,
        };
        let mut probe = GroupSend {
            xid: s.xid,
            credits: 0,
            kind: GroupKind::Request,
            reply_buffers: 0,
            message: s.call_buf,
            len: s.msg_len,
            group_buf: s.group_buf,
            limit: send_limit,
            // Set when queued.
            wr_id: WrId {
                kind: WrKind::CallSend,
                index: idx as u32,
                generation: s.generation,
            },
            place: None,
            direct_reply,
            answer: None,
        };
        // The argument placed by Send (s7.3) when the peer has target
        // segments that take it; else inline in the payload stream.
        probe.place = match s.plan {
            CallPlan::ReadChunk { position, len } if self.places() => placement::plan(
                &self.peer_targets,
                send_limit,
                s.msg_len,
                DdpItem {
                    offset: position,
                    len,
                },
                probe.first_header_len(),
                CONTINUE_HEADER_LEN,
            ),
            _ => None,
        };
        let count = match &probe.place {
            Some(p) => p.count,
            None => continuation::transmissions(s.msg_len, send_limit, probe.first_header_len())?,
        };
        if count > max.min(self.peer_group_recv_limit) || self.outstanding + count > self.granted {
            return None;
        }
        let written = matches!(direct_reply, Some(ResultDirection::Write(_)));
        let reply_buffers = if written || (s.reply_chunk.is_none() && s.write_chunk.is_none()) {
            0
        } else {
            let answered =
                RESPONSE_HEADER_LEN + direct_reply.map_or(0, |_| placement::ANSWER_HEADER_LEN);
            let inline = continuation::transmissions(s.reply_max, recv_limit, answered)?;
            let placed = match (direct_reply, s.write_chunk) {
                (Some(_), Some(w)) => placement::plan(
                    &self.our_targets,
                    recv_limit,
                    s.reply_max,
                    DdpItem { offset: 0, len: w },
                    RESPONSE_HEADER_LEN,
                    CONTINUE_HEADER_LEN,
                )
                .map_or(0, |p| p.count),
                _ => 0,
            };
            let n = inline.max(placed);
            if n > max.min(self.peer_group_send_limit) || n - 1 > self.cont_recvs_free {
                return None;
            }
            n - 1
        };
        probe.reply_buffers = reply_buffers;
        Some(CallGroup { count, send: probe })
    }

    /// Queues call `idx` as the transmission group `group` describes (one
    /// Transmit Request, then Transmit Continues), reserving its
    /// continuation receives for the reply; no chunk is exposed.
    ///
    /// ```text
    /// call = xid vers=1 credits=requested RDMA_OPTIONAL XMTREQ dp rsd count rsbuf pslen part0
    ///        { xid vers=1 credits=requested RDMA_OPTIONAL XMTCONT n itype=XMTREQ pslen partn }
    ///                                    -- rtrext s9.2, s9.4, s7.3-7.4 (docs/EXTENSIONS.md s4, s7)
    /// ```
    fn encode_call_group(&mut self, idx: usize, group: CallGroup) {
        let credits = self.credits_wanted();
        let CallGroup { count, mut send } = group;
        // A result written by RDMA: our DDP buffer exposed as for a write
        // chunk (with key windows the key is taken here), the direction's
        // segment over it.
        if let Some(ResultDirection::Write(seg)) = &mut send.direct_reply {
            let write_buf = self.calls[idx].write_buf;
            if !self.expose(write_buf, Access::RemoteWrite, 0, seg.length) {
                self.process_call(
                    idx,
                    CallEvent::Failed {
                        reason: CallFailure::NoKeyWindow,
                    },
                );
                return;
            }
            *seg = self.bufs.segment(write_buf, 0, seg.length);
        }
        let written = matches!(send.direct_reply, Some(ResultDirection::Write(_)));
        let s = &mut self.calls[idx];
        s.reply_chunk = None;
        if !written {
            s.write_chunk = None;
        }
        s.group_len = count;
        s.reply_buffers = send.reply_buffers;
        self.cont_recvs_free -= send.reply_buffers;
        let g = GroupSend {
            credits,
            wr_id: WrId {
                kind: WrKind::CallSend,
                index: idx as u32,
                generation: s.generation,
            },
            ..send
        };
        let sends = self.queue_group(&g);
        if sends == 0 {
            // `call_group` sized the group against the buffer:
            // unreachable, but it fails the call, never the engine.
            self.process_call(
                idx,
                CallEvent::Failed {
                    reason: CallFailure::MalformedReply,
                },
            );
            return;
        }
        if sends > 1 {
            self.stats.call_groups_sent += 1;
        }
        if g.place.is_some() {
            self.stats.items_placed_sent += 1;
        }
        self.process_call(idx, CallEvent::SendPosted { sends });
    }

    /// The reply to call `idx` arrived whole as a transmission group
    /// (`len` bytes in its reply buffer; `credits` the first
    /// transmission's grant).
    pub(super) fn finish_reply_group(&mut self, idx: usize, xid: u32, len: u32, credits: u32) {
        if self.take_answer(idx, Some(credits)) {
            let reply_buf = self.calls[idx].reply_buf;
            let event = if len >= 8 && self.bufs.peek_xid(reply_buf) == Some(xid) {
                CallEvent::ReplyPlaced { len, ddp_len: None }
            } else {
                CallEvent::Failed {
                    reason: CallFailure::MalformedReply,
                }
            };
            self.process_call(idx, event);
        }
        self.transmit_queued_calls();
    }

    /// The slot of a sent (or abandoned) call with this XID: the slot the
    /// index names when it holds that call (O(1), the usual case), else a
    /// scan of the slots.
    pub(super) fn find_sent_call(&self, xid: u32) -> Option<usize> {
        let is_it = |s: &CallSlot| {
            matches!(s.state, CallState::Sent | CallState::Abandoned) && s.xid == xid
        };
        if let Some(idx) = self.call_by_xid.get(xid) {
            if self.calls.get(idx).is_some_and(is_it) {
                return Some(idx);
            }
        }
        self.calls.iter().position(is_it)
    }

    /// Whether call `idx` offered the peer a reply chunk (only then can an
    /// RDMA_NOMSG with its XID be its reply).
    pub(super) fn offered_reply_chunk(&self, idx: usize) -> bool {
        self.calls.get(idx).is_some_and(|s| s.reply_chunk.is_some())
    }

    /// Accounts for the answer to slot `idx` (any answer: reply, error,
    /// garbage): the credit returns, the peer's grant (if trusted) is
    /// taken, the slot's memory is no longer exposed. False when the call
    /// had been abandoned (the answer is then dropped here).
    fn take_answer(&mut self, idx: usize, grant: Option<u32>) -> bool {
        self.outstanding = self.outstanding.saturating_sub(self.calls[idx].group_len);
        if let Some(g) = grant {
            self.granted = g.clamp(1, self.credits_wanted().max(1));
        }
        self.unexpose_call(idx);
        if self.calls[idx].state == CallState::Abandoned {
            self.stats.late_replies += 1;
            self.process_call(idx, CallEvent::LateAnswer);
            return false;
        }
        true
    }

    /// A reply header for slot `idx` parsed in `rx_hdr`; the message is
    /// `len` bytes of receive buffer `buf`, the header `hlen` of them.
    pub(super) fn on_reply(&mut self, idx: usize, buf: BufId, len: usize, hlen: usize) {
        let xid = self.rx_hdr.xid;
        let has_reads = !self.rx_hdr.chunks.reads().is_empty();
        // RDMA_DONE exists only between peers that negotiated
        // responder-provided read chunks (RFC 8166 retired it): a plain
        // Version One peer never receives one.
        let done_due = has_reads && self.reply_read_chunks();
        if has_reads && !done_due {
            self.stats.unnegotiated_read_list_replies += 1;
        }
        if self.take_answer(idx, Some(self.rx_hdr.credits)) {
            let placed = if has_reads {
                self.start_reply_pull(idx)
            } else {
                self.place_reply(idx, buf, len, hlen).map(Some)
            };
            match placed {
                Ok(Some((len, ddp_len))) => {
                    self.process_call(idx, CallEvent::ReplyPlaced { len, ddp_len })
                }
                // Pulling; RDMA_DONE follows the Reads.
                Ok(None) => {}
                Err(reason) => {
                    if done_due {
                        // Pull completion is due even for a reply we do
                        // not pull (draft-lever s4.1.3).
                        self.queue_done(xid);
                    }
                    self.process_call(idx, CallEvent::Failed { reason });
                }
            }
        } else if done_due {
            self.queue_done(xid);
        }
        self.transmit_queued_calls();
    }

    /// A REPLY pulled by the responder half from an RDMA_NOMSG read list
    /// (`len` bytes of `src`; `credits` the header's grant; `written` the
    /// header's write chunk count and the first one's length). Negotiated:
    /// the pull completed, so RDMA_DONE is due whether or not the XID
    /// still names a call (draft-lever s4.1.3). Not negotiated: a reply
    /// with a read list is the peer's protocol error (RFC 8166): the call
    /// fails, no DONE is sent.
    pub(super) fn on_pulled_reply(
        &mut self,
        xid: u32,
        src: BufId,
        len: u32,
        credits: u32,
        written: (usize, u64),
    ) {
        let negotiated = self.reply_read_chunks();
        if negotiated {
            self.queue_done(xid);
        } else {
            self.stats.unnegotiated_read_list_replies += 1;
        }
        match self.find_sent_call(xid) {
            None => self.stats.unmatched_replies += 1,
            Some(idx) if !negotiated => {
                if self.take_answer(idx, None) {
                    self.process_call(
                        idx,
                        CallEvent::Failed {
                            reason: CallFailure::UnsupportedReply,
                        },
                    );
                }
            }
            Some(idx) => {
                if self.take_answer(idx, Some(credits)) {
                    let reply_buf = self.calls[idx].reply_buf;
                    let placed = self.check_write_chunk(idx, written).and_then(|ddp_len| {
                        if self.bufs.peek_xid(src) != Some(xid) {
                            return Err(CallFailure::MalformedReply);
                        }
                        if len > self.bufs.buf_len(reply_buf) {
                            return Err(CallFailure::ReplyTooLarge);
                        }
                        let whole = LocalSlice {
                            buf: src,
                            offset: 0,
                            len,
                        };
                        self.bufs.copy(whole, reply_buf, 0);
                        Ok(ddp_len)
                    });
                    match placed {
                        Ok(ddp_len) => {
                            self.stats.replies_pulled += 1;
                            self.process_call(idx, CallEvent::ReplyPlaced { len, ddp_len });
                        }
                        Err(reason) => self.process_call(idx, CallEvent::Failed { reason }),
                    }
                }
            }
        }
        self.transmit_queued_calls();
    }

    /// The write list of a reply against the one write chunk we offered
    /// (RFC 5666 s3.6): the bytes the responder wrote into it.
    fn returned_write_chunk(&self, idx: usize) -> Result<Option<u32>, CallFailure> {
        let chunks = &self.rx_hdr.chunks;
        let used = chunks.write_chunks().next().map_or(0, |c| c.len_bytes());
        self.check_write_chunk(idx, (chunks.write_chunk_count(), used))
    }

    /// `returned_write_chunk` for a write list already taken apart:
    /// (count, bytes in the first chunk).
    fn check_write_chunk(
        &self,
        idx: usize,
        written: (usize, u64),
    ) -> Result<Option<u32>, CallFailure> {
        let (count, used) = written;
        match (count, self.calls[idx].write_chunk) {
            (0, _) => Ok(None),
            (1, Some(offered)) => {
                if used > u64::from(offered) {
                    return Err(CallFailure::MalformedReply);
                }
                Ok(Some(used as u32))
            }
            _ => Err(CallFailure::MalformedReply),
        }
    }

    /// A reply exposed by the responder in a position-zero read chunk of an
    /// RDMA_NOMSG (draft-lever s4.1.2): plan the Reads into the slot's
    /// reply buffer and queue them. Refused unless both peers support it.
    fn start_reply_pull(&mut self, idx: usize) -> Result<Option<(u32, Option<u32>)>, CallFailure> {
        if !self.reply_read_chunks() {
            return Err(CallFailure::UnsupportedReply);
        }
        if self.rx_hdr.body != MessageBody::NoMsg {
            return Err(CallFailure::MalformedReply);
        }
        let ddp_len = self.returned_write_chunk(idx)?;
        let mut chunks = self.rx_hdr.chunks.read_chunks();
        let (Some(chunk), None) = (chunks.next(), chunks.next()) else {
            return Err(CallFailure::MalformedReply);
        };
        let total = chunk.len_bytes();
        let s = &mut self.calls[idx];
        if chunk.position != 0 || total < 8 {
            return Err(CallFailure::MalformedReply);
        }
        if total > u64::from(self.bufs.buf_len(s.reply_buf)) {
            return Err(CallFailure::ReplyTooLarge);
        }
        if chunk.segments.len() > MAX_OPS as usize {
            return Err(CallFailure::MalformedReply);
        }
        s.reads.clear();
        s.reads_issued = 0;
        s.reads_done = 0;
        let mut dest = 0u32;
        for r in chunk.segments.iter().filter(|r| r.segment.length > 0) {
            s.reads.push(PendingRead {
                seg: r.segment,
                dest,
            });
            dest += r.segment.length;
        }
        s.reads_seen.reset(s.reads.len());
        s.reply_len = total as u32;
        s.ddp_len = ddp_len;
        self.process_call(idx, CallEvent::ReplyPullStarted);
        Ok(None)
    }

    /// The next Read of requester slot `idx` (see `pump_reads`).
    pub(super) fn next_reply_read(&mut self, idx: u32) -> Option<(PendingRead, BufId, WrId, bool)> {
        let s = self.calls.get_mut(idx as usize)?;
        if s.state != CallState::PullingReplyReadChunk {
            return None;
        }
        let r = *s.reads.get(s.reads_issued)?;
        let id = WrId::for_op(WrKind::ReplyRead, idx, s.generation, s.reads_issued as u32);
        s.reads_issued += 1;
        Some((r, s.reply_buf, id, s.reads_issued == s.reads.len()))
    }

    pub(super) fn on_reply_read_done(&mut self, wr_id: WrId, ok: bool) {
        let i = wr_id.index as usize;
        if i < self.calls.len() {
            self.process_call(i, CallEvent::ReplyReadDone { wr_id, ok });
        } else {
            self.stats.stale_completions += 1;
        }
    }

    /// Queues an RDMA_DONE for `xid`; `transmit_queued_calls` sends it.
    fn queue_done(&mut self, xid: u32) {
        if self.closed.is_none() {
            self.note_done_rkey(xid);
            self.done_queue.push_back(xid);
        }
    }

    /// Sends queued RDMA_DONEs while a credit and a control buffer are
    /// free. RFC 5666 s3.8: a DONE consumes a credit; it is counted as
    /// outstanding until its Send completes.
    ///
    /// ```text
    /// done = xid vers=1 credits=requested RDMA_DONE
    /// ```
    fn transmit_dones(&mut self) {
        while self.closed.is_none() && self.outstanding < self.granted {
            let Some(&xid) = self.done_queue.front() else {
                break;
            };
            let Some(i) = self.err_free.pop() else {
                break;
            };
            self.done_queue.pop_front();
            let e = &mut self.err_bufs[i as usize];
            e.busy = true;
            let buf = e.buf;
            let h = TransportHeader::new(xid, self.credits_wanted(), MessageBody::Done);
            let Ok(n) = h.emit(self.bufs.bytes_mut(buf)) else {
                self.err_bufs[i as usize].busy = false;
                self.err_free.push(i);
                continue;
            };
            self.outstanding += 1;
            self.stats.max_outstanding_calls =
                self.stats.max_outstanding_calls.max(self.outstanding);
            self.stats.done_sent += 1;
            let invalidate = self.inval.take(xid);
            self.post_control(WrKind::DoneSend, i, n as u32, invalidate);
        }
    }

    /// Checks the reply's chunk lists against what we offered and puts the
    /// reply message in the slot's reply buffer (RFC 5666 s3.6, s5.2).
    /// Data the responder RDMA-wrote is already in place (its Writes were
    /// ordered before the reply Send).
    fn place_reply(
        &mut self,
        idx: usize,
        buf: BufId,
        len: usize,
        hlen: usize,
    ) -> Result<(u32, Option<u32>), CallFailure> {
        let ddp_len = self.returned_write_chunk(idx)?;
        let s = &self.calls[idx];
        let chunks = &self.rx_hdr.chunks;
        match self.rx_hdr.body {
            MessageBody::Msg => {
                let recv_bytes = self.bufs.bytes(buf).get(..len).unwrap_or(&[]);
                if self.rx_hdr.check_rpc_xid(recv_bytes, hlen).is_err() {
                    return Err(CallFailure::MalformedReply);
                }
                let inline = len - hlen;
                if inline > self.bufs.buf_len(s.reply_buf) as usize {
                    return Err(CallFailure::ReplyTooLarge);
                }
                let src = LocalSlice {
                    buf,
                    offset: hlen as u32,
                    len: inline as u32,
                };
                let reply_buf = s.reply_buf;
                self.bufs.copy(src, reply_buf, 0);
                Ok((inline as u32, ddp_len))
            }
            MessageBody::NoMsg => {
                let (Some(rc), Some(offered)) = (chunks.reply(), s.reply_chunk) else {
                    return Err(CallFailure::MalformedReply);
                };
                let used = rc.len_bytes();
                if used > u64::from(offered) || used < 8 {
                    return Err(CallFailure::MalformedReply);
                }
                if self.bufs.peek_xid(s.reply_buf) != Some(s.xid) {
                    return Err(CallFailure::MalformedReply);
                }
                Ok((used as u32, ddp_len))
            }
            _ => Err(CallFailure::UnsupportedReply),
        }
    }

    /// An RDMA_ERROR answered call `idx` (RFC 5666 s4.2): that call fails,
    /// the connection stays.
    pub(super) fn on_peer_error(&mut self, idx: usize, e: ErrorBody) {
        if self.take_answer(idx, Some(self.rx_hdr.credits)) {
            let reason = match e {
                ErrorBody::Vers { low, high } => CallFailure::PeerVersionError { low, high },
                ErrorBody::Chunk => CallFailure::PeerChunkError,
                ErrorBody::Other { code, .. } => CallFailure::PeerError { code },
            };
            self.process_call(idx, CallEvent::Failed { reason });
        }
        self.transmit_queued_calls();
    }

    /// An answer to call `idx` that we cannot decode: the call fails.
    pub(super) fn fail_reply(&mut self, idx: usize, reason: CallFailure) {
        if self.take_answer(idx, None) {
            self.process_call(idx, CallEvent::Failed { reason });
        }
        self.transmit_queued_calls();
    }

    /// Tells the application that call `idx` failed.
    fn call_failed_event(&mut self, idx: usize, reason: CallFailure) {
        let s = &self.calls[idx];
        self.events.push_back(Event::CallFailed {
            call: CallHandle {
                index: idx as u32,
                generation: s.generation,
            },
            xid: s.xid,
            reason,
        });
    }

    /// Withdraws every exposure of slot `idx`: its own buffers and its
    /// views of the application memory.
    fn unexpose_call(&mut self, idx: usize) {
        let s = &self.calls[idx];
        let bufs = [
            s.call_buf,
            s.reply_buf,
            s.ddp_buf,
            s.write_view,
            s.read_view,
        ];
        for buf in bufs {
            self.unexpose(buf);
        }
    }

    /// Slot `idx` has just become `Free`: a new generation (stale handles
    /// and completions no longer match it), nothing exposed, the slot
    /// back.
    fn free_call(&mut self, idx: usize) {
        let s = &mut self.calls[idx];
        s.generation = s.generation.wrapping_add(1);
        s.deadline = None;
        self.cont_recvs_free += s.reply_buffers;
        s.reply_buffers = 0;
        self.unexpose_call(idx);
        self.call_free.push(idx as u32);
    }

    pub(super) fn on_call_send_done(&mut self, wr_id: WrId) {
        let i = wr_id.index as usize;
        if i < self.calls.len() {
            self.process_call(i, CallEvent::SendDone { wr_id });
        } else {
            self.stats.stale_completions += 1;
        }
    }

    /// `Timer::CallTimeout` fired: fail every queued or sent call whose
    /// deadline passed, then re-arm for the earliest remaining one.
    pub(super) fn expire_calls(&mut self, now: Instant) {
        for idx in 0..self.calls.len() {
            let s = &self.calls[idx];
            if s.deadline.is_none_or(|d| d > now) {
                continue;
            }
            if matches!(s.state, CallState::Queued | CallState::Sent) {
                self.process_call(idx, CallEvent::Timeout);
            }
        }
        let next = self
            .calls
            .iter()
            .filter(|s| matches!(s.state, CallState::Queued | CallState::Sent))
            .filter_map(|s| s.deadline)
            .min();
        if let Some(t) = next {
            self.timers.set(Timer::CallTimeout, t);
        }
    }

    /// Connection closed: every call not yet answered fails.
    pub(super) fn close_requester(&mut self) {
        self.call_queue.clear();
        self.done_queue.clear();
        self.outstanding = 0;
        for idx in 0..self.calls.len() {
            self.process_call(idx, CallEvent::Closed);
            self.unexpose_call(idx);
        }
    }

    /// Moves requester slot `idx` on by `event`: the one place a call slot
    /// changes state (SPDK's `nvmf_rdma_request_process`). The entry
    /// points (`send_call`, `transmit_queued_calls`' `encode_call`,
    /// `on_reply`, `on_pulled_reply`, `on_peer_error`, `fail_reply`,
    /// `take_answer`, `start_reply_pull`, `on_reply_read_done`,
    /// `on_call_send_done`, `release_reply`, `expire_calls`,
    /// `close_requester`) only turn what they saw into a `CallEvent`. A
    /// slot that is done (`Draining`) settles: it is freed once neither
    /// its Send nor a Read of its reply is still posted.
    ///
    /// ```text
    /// state                  event                          -> state                  RFC 5666
    /// ---------------------  -----------------------------  ----------------------    -----------
    /// Free                   Submitted                      -> Queued
    /// Queued                 Refused                        -> Free
    /// Queued                 SendPosted                     -> Sent                   s3.3 (a credit;
    ///                                                                                  a group's Sends
    ///                                                                                  one each, rtrext s4.3)
    /// Queued                 Timeout                        -> Draining (CallFailed)
    /// Sent                   ReplyPlaced                    -> ReplyReady             s3.6, s5.2
    ///                                                          (ReplyArrived)
    /// Sent                   ReplyPullStarted               -> PullingReplyReadChunk  draft-lever s4.1.2
    /// Sent                   Timeout                        -> Abandoned (CallFailed, keys withdrawn)
    /// PullingReplyReadChunk  ReplyReadDone, Reads still due -> PullingReplyReadChunk
    /// PullingReplyReadChunk  ReplyReadDone, failed          -> PullingReplyReadChunk  (the close
    ///                                                          that follows fails it)
    /// PullingReplyReadChunk  ReplyReadDone, the last, ok    -> ReplyReady, or         s3.8 (DONE
    ///                                                          Draining if malformed  queued)
    /// Sent|PullingReply..    ReplyPlaced                    -> ReplyReady
    /// Queued|Sent|Pulling..  Failed                         -> Draining (CallFailed)
    /// ReplyReady             Released                       -> Draining
    /// Abandoned              LateAnswer                     -> Draining
    /// Queued|Sent|Pulling..  Closed                         -> Draining (CallFailed,
    ///                                                          ConnectionLost)
    /// Abandoned              Closed                         -> Draining
    /// other                  Closed                         -> unchanged
    /// Draining               SendDone | ReplyReadDone       -> Draining, or Free when
    ///                                                          neither is still posted
    /// not Free               SendDone (Send pending)        -> unchanged (noted)
    /// other                  SendDone | ReplyReadDone       -> unchanged (stale, counted)
    /// ```
    ///
    /// Entering `Draining` settles at once (`Free` if nothing is posted);
    /// entering `Free` frees the slot (`free_call`). `ReplyReadDone` for
    /// the last Read raises `ReplyPlaced` or `Failed` itself.
    pub(super) fn process_call(&mut self, idx: usize, event: CallEvent) {
        use CallEvent as E;
        use CallState as S;
        let s = &mut self.calls[idx];
        let then = match (s.state, event) {
            (S::Free, E::Submitted) => {
                s.state = S::Queued;
                Then::Return
            }
            (S::Queued, E::Refused) => {
                s.state = S::Free;
                self.free_call(idx);
                Then::Return
            }
            (S::Queued, E::SendPosted { sends }) => {
                s.state = S::Sent;
                s.sends_pending = sends;
                s.sends_posted = sends;
                s.sends_seen.reset(sends as usize);
                self.outstanding += s.group_len;
                self.stats.calls_sent += 1;
                self.expect_reply();
                self.stats.max_outstanding_calls =
                    self.stats.max_outstanding_calls.max(self.outstanding);
                Then::Return
            }
            (S::Sent | S::PullingReplyReadChunk, E::ReplyPlaced { len, ddp_len }) => {
                s.state = S::ReplyReady;
                s.reply_len = len;
                s.ddp_len = ddp_len;
                self.stats.replies_received += 1;
                self.events.push_back(Event::ReplyArrived {
                    call: CallHandle {
                        index: idx as u32,
                        generation: s.generation,
                    },
                    xid: s.xid,
                    len,
                    ddp_len,
                });
                Then::Return
            }
            (S::Sent, E::ReplyPullStarted) => {
                s.state = S::PullingReplyReadChunk;
                self.read_fifo.push_back(ReadOwner::Call(idx as u32));
                self.pump_reads();
                Then::Return
            }
            (S::PullingReplyReadChunk | S::Draining, E::ReplyReadDone { wr_id, ok })
                if wr_id.same_generation(s.generation)
                    && s.reads_in_flight()
                    && s.reads_seen.first_completion(wr_id.op(), s.reads_issued) =>
            {
                s.reads_done += 1;
                self.reads_in_flight = self.reads_in_flight.saturating_sub(1);
                let (state, done, xid) = (s.state, s.reads_done == s.reads.len(), s.xid);
                let (reply_buf, len, ddp_len) = (s.reply_buf, s.reply_len, s.ddp_len);
                if state != S::Draining && done && ok {
                    // Pull completion notification (RFC 5666 s3.8).
                    self.queue_done(xid);
                    if self.bufs.peek_xid(reply_buf) == Some(xid) {
                        self.stats.replies_pulled += 1;
                        self.process_call(idx, E::ReplyPlaced { len, ddp_len });
                    } else {
                        self.process_call(
                            idx,
                            E::Failed {
                                reason: CallFailure::MalformedReply,
                            },
                        );
                    }
                    self.transmit_queued_calls();
                }
                Then::SettleAndPumpReads
            }
            (state, E::SendDone { wr_id })
                if s.sends_pending > 0
                    && state != S::Free
                    && wr_id.same_generation(s.generation)
                    && s.sends_seen
                        .first_completion(wr_id.op(), s.sends_posted as usize) =>
            {
                s.sends_pending -= 1;
                Then::Settle
            }
            (_, E::ReplyReadDone { .. } | E::SendDone { .. }) => {
                self.stats.stale_completions += 1;
                Then::Return
            }
            (S::Queued | S::Sent | S::PullingReplyReadChunk, E::Failed { reason }) => {
                self.call_failed_event(idx, reason);
                self.calls[idx].state = S::Draining;
                Then::Settle
            }
            (S::ReplyReady, E::Released) | (S::Abandoned, E::LateAnswer | E::Closed) => {
                s.state = S::Draining;
                Then::Settle
            }
            (S::Queued, E::Timeout) => {
                self.call_queue.retain(|&q| q as usize != idx);
                self.call_failed_event(idx, CallFailure::Timeout);
                self.calls[idx].state = S::Draining;
                Then::Settle
            }
            (S::Sent, E::Timeout) => {
                s.state = S::Abandoned;
                s.deadline = None;
                // The exchange is over for us: every key it advertised is
                // invalidated now, so a late Write or Read fails at the
                // provider instead of landing (the slot's own buffers wait
                // for the answer or close before reuse; application memory
                // goes back to the application).
                self.unexpose_call(idx);
                self.call_failed_event(idx, CallFailure::Timeout);
                Then::Return
            }
            (S::Queued | S::Sent | S::PullingReplyReadChunk, E::Closed) => {
                self.call_failed_event(idx, CallFailure::ConnectionLost);
                self.calls[idx].state = S::Draining;
                Then::Settle
            }
            (_, E::Closed) => Then::Return,
            // No entry point raises these: a handle, an XID or the call
            // queue names only a slot in the state its event needs.
            (
                _,
                E::Submitted
                | E::Refused
                | E::SendPosted { .. }
                | E::ReplyPlaced { .. }
                | E::ReplyPullStarted
                | E::Failed { .. }
                | E::Released
                | E::LateAnswer
                | E::Timeout,
            ) => {
                debug_assert!(false, "call slot {idx}: {event:?} in {:?}", s.state);
                Then::Return
            }
        };
        if then == Then::Return {
            return;
        }
        // Settle: a slot that is done is freed once nothing holds it (its
        // Send and its Reads own its buffers until they complete).
        let s = &mut self.calls[idx];
        if s.state == S::Draining && s.sends_pending == 0 && !s.reads_in_flight() {
            s.state = S::Free;
            self.free_call(idx);
        }
        if then == Then::SettleAndPumpReads {
            self.pump_reads();
        }
    }
}

/// The call slot last given each XID, direct-mapped by the XID's low bits
/// into a table of at least twice as many entries as there are slots,
/// made once with the connection (nothing allocated per call). Requesters
/// number their calls in sequence (ours, Linux's, libtirpc's), so the
/// calls in flight, fewer than the table's entries, never share an entry
/// and a reply finds its call in one probe instead of a scan of every
/// slot. An entry is a hint: the caller checks that the slot holds that
/// XID, and scans when it does not (XIDs chosen otherwise, a call
/// outstanding while the numbers went round the table).
#[derive(Debug)]
pub(super) struct XidIndex {
    slots: Box<[u32]>,
}

impl XidIndex {
    const EMPTY: u32 = u32::MAX;

    pub(super) fn new(call_slots: usize) -> XidIndex {
        let n = (call_slots.max(1) * 2).next_power_of_two();
        XidIndex {
            slots: vec![Self::EMPTY; n].into_boxed_slice(),
        }
    }

    fn entry(&self, xid: u32) -> usize {
        xid as usize & (self.slots.len() - 1)
    }

    pub(super) fn insert(&mut self, xid: u32, idx: u32) {
        let e = self.entry(xid);
        self.slots[e] = idx;
    }

    pub(super) fn get(&self, xid: u32) -> Option<usize> {
        let idx = self.slots[self.entry(xid)];
        (idx != Self::EMPTY).then_some(idx as usize)
    }
}
