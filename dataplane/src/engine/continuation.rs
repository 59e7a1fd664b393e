//! Message continuation (draft-dnoveck-rpcrdma-rtrext-02, "rtrext",
//! s4, s9.2-9.5): one RPC message in a transmission group of several
//! Sends instead of a chunk the peer has to pull or we have to push, so
//! that a long call or reply without DDP-eligible data costs one round
//! trip, not two.
//!
//! Only between peers that both advertised it (CONF_RDMA version 2,
//! docs/EXTENSIONS.md); a plain Version One peer never sees an
//! `RDMA_OPTIONAL` header. The wire framing is `wire::rtrext`'s.
//!
//! * **Sending a call** (`encode_call`, `Connection::call_group`): a call
//!   that would otherwise be a long call (RDMA_NOMSG with a position-zero
//!   read chunk, RFC 5666 s5.1) goes as a group when the peer's Request
//!   Transmission Receive Limit (s8.4) allows its length and the peer's
//!   grant has a credit for every transmission (s4.3: each Send of the
//!   group takes a receive of the peer's, so a group of n holds n
//!   credits until its reply). A call whose reply might not fit inline
//!   reserves receives for the reply's later transmissions instead of
//!   offering a reply chunk (`optxrq_rsbuf`, s4.3, s5.2), when the peer's
//!   Response Transmission Send Limit (s8.5) and our free continuation
//!   receives allow it; such a call goes as a Transmit Request even when
//!   it fits one Send.
//! * **Sending a reply** (`post_reply`): a reply too long for one Send,
//!   to a call that reserved enough receives, goes as a group.
//! * **Receiving**: the transmissions of a group follow each other with
//!   nothing in between (s4.2: the sender queues them back to back, and
//!   a reliable connection keeps their order). The first takes a
//!   responder slot (a call) or finds its call (a reply); each payload is
//!   appended to the slot's message buffer, and the receive goes back at
//!   once. Anything else arriving before the group is whole breaks it
//!   off: the peer gets a Report Error (s9.5) naming what was expected,
//!   the partial message is dropped, and the message that broke in is
//!   then handled as usual. A group that stops arriving is dropped after
//!   `Config::group_timeout`.
//!
//! Errors reported (Report Error, s9.5), each tested by name in
//! `engine::tests`:
//!
//! | found | `optr_err` |
//! |---|---|
//! | a Version One header inside a group | `BADHMT`, expected `RDMA_OPTIONAL` |
//! | another operation inside a group | `BADOMT`, expected Transmit Continue |
//! | a continuation of the other direction | `BADOMT`, expected the group's kind |
//! | a continuation with no group open | `BADCONT` |
//! | a continuation of another XID | `BADXID` |
//! | a transmission number out of order (one lost) | `BADSEQ` |
//! | a group longer than we accept (our limit, or the receives the call reserved) | `BADSEQ`, expected the most allowed |
//! | a payload past the end of its Send, or past the message buffer | `BADPL` |
//!
//! A Report Error about a call of ours fails that call
//! ([`super::CallFailure::TransmissionError`]); one about a reply we
//! sent is counted (the reply's slot is long gone).

use super::buffers::{BufId, LocalSlice};
use super::connection::{Disposition, Received};
use super::time::{Instant, Timer};
use super::wr::{WorkRequest, WrId, WrKind};
use super::{CallFailure, Connection, Extensions};
use crate::wire::rpc::MessageType;
use crate::wire::rpcrdma::ErrorBody;
use crate::wire::rtrext::{
    op_type, ErrorInfo, ErrorReport, GroupKind, Limits as RtrLimits, Operation, OptionalHeader,
    TransmissionId, RDMA_OPTIONAL,
};

/// Header bytes of each kind of transmission we send (no placement, no
/// directions: fixed sizes).
const REQUEST_HEADER_LEN: u32 = 24 + 4 + 4 + 12;
const RESPONSE_HEADER_LEN: u32 = 24 + 4 + 8;
const CONTINUE_HEADER_LEN: u32 = 24 + 12;

/// The placement lists we parse: we implement none of send-based
/// placement, so a header that carries any is refused after parsing,
/// but it must parse within these (`OptionalHeader::with_capacity`).
pub(super) const PARSE_LIMITS: RtrLimits = RtrLimits::DEFAULT;

/// Transmissions a message of `len` bytes takes in Sends of at most
/// `limit` bytes, the first with a header of `first` bytes and the
/// others with a Transmit Continue header. `None` when not even one byte
/// fits.
pub(super) fn transmissions(len: u32, limit: u32, first: u32) -> Option<u32> {
    let head = limit.checked_sub(first).filter(|&n| n > 0)?;
    let body = limit.checked_sub(CONTINUE_HEADER_LEN).filter(|&n| n > 0)?;
    Some(1 + len.saturating_sub(head).div_ceil(body))
}

/// The transmissions a call of `len` bytes takes (a Transmit Request and
/// its continuations).
pub(super) fn call_transmissions(len: u32, limit: u32) -> Option<u32> {
    transmissions(len, limit, REQUEST_HEADER_LEN)
}

/// The transmissions a reply of `len` bytes takes.
pub(super) fn reply_transmissions(len: u32, limit: u32) -> Option<u32> {
    transmissions(len, limit, RESPONSE_HEADER_LEN)
}

/// Where the group being received goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum GroupTarget {
    /// A call of the peer, reassembled in this responder slot.
    Serve(u32),
    /// The reply to our call in this requester slot.
    Call(u32),
    /// A group we refused at its first transmission (reported or
    /// answered already): its later transmissions are dropped quietly.
    Discard,
}

/// The transmission group being received (at most one at a time: s4.2).
#[derive(Debug, Clone, Copy)]
pub(super) struct RxGroup {
    xid: u32,
    kind: GroupKind,
    target: GroupTarget,
    /// The target slot's generation when the group began.
    generation: u32,
    /// The transmission number expected next.
    next: u32,
    /// Transmissions in the group.
    count: u32,
    /// Payload bytes reassembled so far.
    filled: u32,
    /// The credit word of the first transmission (a grant, for a reply).
    credits: u32,
    deadline: Instant,
}

impl RxGroup {
    fn direction(&self) -> MessageType {
        match self.kind {
            GroupKind::Request => MessageType::Call,
            GroupKind::Response => MessageType::Reply,
        }
    }
}

/// One transmission group to queue (`Connection::queue_group`).
pub(super) struct GroupSend {
    pub(super) xid: u32,
    pub(super) credits: u32,
    pub(super) kind: GroupKind,
    /// Receives reserved for the reply (Transmit Request only).
    pub(super) reply_buffers: u32,
    /// The message: `len` bytes at the start of `message`.
    pub(super) message: BufId,
    pub(super) len: u32,
    /// Where the transmissions are laid out, one after the other.
    pub(super) group_buf: BufId,
    /// The largest Send.
    pub(super) limit: u32,
    /// The id of the group's first Send; the others carry the next op
    /// numbers ([`WrId::for_op`]).
    pub(super) wr_id: WrId,
}

impl Connection {
    /// True when message continuation is in use on this connection.
    pub(super) fn continues(&self) -> bool {
        self.negotiated.contains(Extensions::MESSAGE_CONTINUATION)
    }

    /// Writes the transmissions of `g` into its group buffer and queues
    /// their Sends back to back (s4.2: nothing may come between them).
    /// Returns how many Sends were queued; 0, queuing nothing, if the
    /// group does not fit the buffer or a header does not encode.
    ///
    /// ```text
    /// first = xid vers=1 credits RDMA_OPTIONAL XMTREQ  len  dp=0 rsd=0 count rsbuf pslen payload
    ///       / xid vers=1 credits RDMA_OPTIONAL XMTRESP len  dp=0 count pslen payload  -- s9.2, s9.3
    /// next  = xid vers=1 credits RDMA_OPTIONAL XMTCONT 12   xnum itype pslen payload -- s9.4
    /// ```
    pub(super) fn queue_group(&mut self, g: &GroupSend) -> u32 {
        let first_len = match g.kind {
            GroupKind::Request => REQUEST_HEADER_LEN,
            GroupKind::Response => RESPONSE_HEADER_LEN,
        };
        let Some(count) = transmissions(g.len, g.limit, first_len) else {
            return 0;
        };
        // Each transmission starts 4-aligned, so takes at most the limit
        // rounded up.
        let room = u64::from(count) * u64::from(g.limit.next_multiple_of(4));
        if room > u64::from(self.bufs.buf_len(g.group_buf)) {
            return 0;
        }
        let queued_before = self.tx.len();
        let (mut from, mut at) = (0u32, 0u32);
        for seq in 0..count {
            let header = if seq == 0 {
                first_len
            } else {
                CONTINUE_HEADER_LEN
            };
            let n = (g.limit - header).min(g.len - from);
            let op = match (seq, g.kind) {
                (0, GroupKind::Request) => Operation::TransmitRequest {
                    count,
                    reply_buffers: g.reply_buffers,
                    payload_len: n,
                },
                (0, GroupKind::Response) => Operation::TransmitResponse {
                    count,
                    payload_len: n,
                },
                _ => Operation::TransmitContinue {
                    seq,
                    group: g.kind,
                    payload_len: n,
                },
            };
            let h = OptionalHeader::new(g.xid, g.credits, op);
            let out = self.bufs.bytes_mut(g.group_buf);
            let Some(Ok(hl)) = out
                .get_mut(at as usize..)
                .map(|room| h.emit(self.negotiated, room))
            else {
                self.tx.truncate(queued_before);
                return 0;
            };
            let payload = LocalSlice {
                buf: g.message,
                offset: from,
                len: n,
            };
            if !self.bufs.copy(payload, g.group_buf, at as usize + hl) {
                self.tx.truncate(queued_before);
                return 0;
            }
            self.tx.push_back(WorkRequest::Send {
                wr_id: WrId::for_op(g.wr_id.kind, g.wr_id.index, g.wr_id.generation, seq),
                local: LocalSlice {
                    buf: g.group_buf,
                    offset: at,
                    len: hl as u32 + n,
                },
                invalidate_rkey: None,
            });
            from += n;
            // The next transmission starts 4-aligned.
            at += (hl as u32 + n).next_multiple_of(4);
        }
        count
    }

    /// A message whose fixed words say RDMA_OPTIONAL arrived on a
    /// connection that negotiated message continuation: `len` bytes in
    /// `recv`. Its header is copied out alone (into the private `rx_copy`)
    /// and parsed there; the payload is copied once, from the receive
    /// buffer straight to where it goes. Returns what became of it.
    pub(super) fn on_optional(
        &mut self,
        now: Instant,
        recv: Received<'_>,
        len: usize,
    ) -> Disposition {
        // The header: the six fixed words and the optinfo they count.
        let mut fixed = [0u8; crate::wire::rtrext::OPTIONAL_FIXED_LEN];
        let _ = self.read_received(recv, 0, &mut fixed);
        let info = u32::from_be_bytes([fixed[20], fixed[21], fixed[22], fixed[23]]);
        let header = (fixed.len() as u64 + u64::from(info)).min(len as u64) as usize;
        let copy = self.rx_copy;
        let copied = header <= self.bufs.buf_len(copy) as usize
            && self.copy_received(recv, 0, header as u32, copy, 0);
        let bytes = if copied {
            self.bufs.bytes(copy).get(..header).unwrap_or(&[])
        } else {
            &[]
        };
        let parsed = self.opt_hdr.parse_into(bytes, &PARSE_LIMITS);
        let xid = self.opt_hdr.xid;
        let Ok(hlen) = parsed else {
            // Not even the XDR of the operation: as a Version One header
            // that does not decode (RFC 5666 s4.2), after ending any
            // group it broke into.
            let xid = bytes
                .get(..4)
                .map_or(0, |w| u32::from_be_bytes([w[0], w[1], w[2], w[3]]));
            self.break_group(
                xid,
                0,
                ErrorInfo::BadOptionalType {
                    expected: op_type::TRANSMIT_CONTINUE,
                    current: 0,
                },
            );
            match self.find_sent_call(xid) {
                Some(slot) => self.fail_reply(slot, CallFailure::MalformedReply),
                None => self.send_error(xid, ErrorBody::Chunk),
            }
            return Disposition::Done;
        };
        let op = self.opt_hdr.op;
        let room = (len - hlen) as u32;
        let placed = !self.opt_hdr.placement.is_empty() || !self.opt_hdr.directions.is_empty();
        match op {
            Operation::TransmitContinue {
                seq,
                group,
                payload_len,
            } => {
                self.on_continue(now, recv, hlen, xid, seq, group, payload_len, room);
                return Disposition::Done;
            }
            _ => self.break_group(
                xid,
                0,
                ErrorInfo::BadOptionalType {
                    expected: op_type::TRANSMIT_CONTINUE,
                    current: op.op_type(),
                },
            ),
        }
        if op.payload_len() > room {
            let direction = match op {
                Operation::TransmitResponse { .. } => MessageType::Reply,
                _ => MessageType::Call,
            };
            self.report(
                TransmissionId {
                    xid,
                    direction,
                    seq: 0,
                },
                None,
                ErrorInfo::BadPayloadLength {
                    value: op.payload_len(),
                    min: 0,
                    max: room,
                },
            );
            if let Some(slot) = self
                .find_sent_call(xid)
                .filter(|_| direction == MessageType::Reply)
            {
                self.fail_reply(
                    slot,
                    CallFailure::TransmissionError {
                        code: crate::wire::rtrext::err_code::BAD_PAYLOAD_LENGTH,
                    },
                );
            }
            self.discard_rest(xid, op);
            return Disposition::Done;
        }
        match op {
            Operation::TransmitRequest {
                count,
                reply_buffers,
                payload_len,
            } if !placed => {
                return self.on_call_group(now, recv, hlen, xid, count, reply_buffers, payload_len);
            }
            Operation::TransmitResponse { count, payload_len } if !placed => {
                self.on_reply_group(now, recv, hlen, xid, count, payload_len);
            }
            Operation::ReportError(r) => self.on_report(r),
            // Placement (send-based or explicit, s7.3) is not implemented
            // and not advertised; unknown operations: as Version One's
            // unknown message types (ERR_CHUNK, or the call fails).
            _ => {
                match self.find_sent_call(xid) {
                    Some(slot) => self.fail_reply(slot, CallFailure::UnsupportedReply),
                    None => self.send_error(xid, ErrorBody::Chunk),
                }
                self.discard_rest(xid, op);
            }
        }
        Disposition::Done
    }

    /// After refusing the first transmission of a group of more than
    /// one: its continuations are dropped as they come, not each
    /// reported.
    fn discard_rest(&mut self, xid: u32, op: Operation) {
        let (kind, count) = match op {
            Operation::TransmitRequest { count, .. } => (GroupKind::Request, count),
            Operation::TransmitResponse { count, .. } => (GroupKind::Response, count),
            _ => return,
        };
        if count > 1 {
            if kind == GroupKind::Request {
                self.note_group_messages(count);
            }
            self.open_group(xid, kind, GroupTarget::Discard, 0, count, 0, 0);
            self.stats.groups_dropped += 1;
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn open_group(
        &mut self,
        xid: u32,
        kind: GroupKind,
        target: GroupTarget,
        generation: u32,
        count: u32,
        filled: u32,
        credits: u32,
    ) {
        let deadline = self.last_activity.saturating_add(self.config.group_timeout);
        self.rx_group = Some(RxGroup {
            xid,
            kind,
            target,
            generation,
            next: 1,
            count,
            filled,
            credits,
            deadline,
        });
        self.timers.set(Timer::GroupReassembly, deadline);
    }

    /// The first transmission of a call (Transmit Request, s9.2) of
    /// `count` transmissions, `payload_len` payload bytes after `hlen`.
    #[allow(clippy::too_many_arguments)]
    fn on_call_group(
        &mut self,
        now: Instant,
        recv: Received<'_>,
        hlen: usize,
        xid: u32,
        count: u32,
        reply_buffers: u32,
        payload_len: u32,
    ) -> Disposition {
        let op = self.opt_hdr.op;
        let max = self.config.max_group_transmissions;
        if count > max {
            self.report(
                TransmissionId {
                    xid,
                    direction: MessageType::Call,
                    seq: 0,
                },
                None,
                ErrorInfo::BadSequence {
                    expected: max,
                    current: count,
                },
            );
            self.discard_rest(xid, op);
            return Disposition::Done;
        }
        // RFC 5666 s3.3 with rtrext s4.3: each transmission takes a credit.
        if self.active_calls + self.parked.len() as u32 + count > self.grant() {
            self.close_with(super::CloseReason::CreditOverrun);
            return Disposition::Done;
        }
        let credits = self.opt_hdr.credits;
        // The reply may use the receives the call reserved, within what
        // we send at most.
        let reply_buffers = reply_buffers.min(max - 1);
        match self.take_group_slot(now, count, reply_buffers) {
            Ok(idx) => {
                let took = self.start_serve_group(
                    idx,
                    recv,
                    hlen,
                    xid,
                    count,
                    reply_buffers,
                    payload_len,
                    credits,
                );
                if !took {
                    self.report(
                        TransmissionId {
                            xid,
                            direction: MessageType::Call,
                            seq: 0,
                        },
                        None,
                        ErrorInfo::BadPayloadLength {
                            value: payload_len,
                            min: 0,
                            max: self.config.max_call_size,
                        },
                    );
                    self.discard_rest(xid, op);
                    return Disposition::Done;
                }
                if count == 1 {
                    self.finish_serve_group(now, idx);
                } else {
                    let generation = self.serves[idx as usize].generation;
                    self.open_group(
                        xid,
                        GroupKind::Request,
                        GroupTarget::Serve(idx),
                        generation,
                        count,
                        payload_len,
                        credits,
                    );
                }
                Disposition::Done
            }
            // One transmission waits for a slot like any call; a group
            // cannot (its continuations are on their way): it is
            // refused as a call we cannot take (s4.2 leaves this open).
            Err(()) if count == 1 => Disposition::Park,
            Err(()) => {
                self.send_error(xid, ErrorBody::Chunk);
                self.discard_rest(xid, op);
                Disposition::Done
            }
        }
    }

    /// A continuation (Transmit Continue, s9.4).
    #[allow(clippy::too_many_arguments)]
    fn on_continue(
        &mut self,
        now: Instant,
        recv: Received<'_>,
        hlen: usize,
        xid: u32,
        seq: u32,
        group: GroupKind,
        payload_len: u32,
        room: u32,
    ) {
        let Some(g) = self.rx_group else {
            let direction = match group {
                GroupKind::Request => MessageType::Call,
                GroupKind::Response => MessageType::Reply,
            };
            self.report(
                TransmissionId {
                    xid,
                    direction,
                    seq,
                },
                None,
                ErrorInfo::BadContinuation,
            );
            return;
        };
        if g.target == GroupTarget::Discard {
            // The rest of a group refused or broken off: dropped quietly
            // (a lost transmission leaves gaps, so any later number
            // counts). Anything else is on its own again.
            if xid != g.xid || group != g.kind || seq < g.next || seq >= g.count {
                self.rx_group = None;
                self.timers.stop(Timer::GroupReassembly);
                self.on_continue(now, recv, hlen, xid, seq, group, payload_len, room);
            } else if seq + 1 >= g.count {
                self.rx_group = None;
                self.timers.stop(Timer::GroupReassembly);
            } else if let Some(open) = &mut self.rx_group {
                open.next = seq + 1;
            }
            return;
        }
        let wrong = if xid != g.xid {
            Some(ErrorInfo::BadXid {
                expected: g.xid,
                current: xid,
            })
        } else if group != g.kind {
            Some(ErrorInfo::BadOptionalType {
                expected: g.kind.to_wire(),
                current: group.to_wire(),
            })
        } else if seq != g.next {
            Some(ErrorInfo::BadSequence {
                expected: g.next,
                current: seq,
            })
        } else if payload_len > room {
            Some(ErrorInfo::BadPayloadLength {
                value: payload_len,
                min: 0,
                max: room,
            })
        } else {
            None
        };
        if let Some(info) = wrong {
            self.break_group(xid, seq, info);
            return;
        }
        if !self.group_target_alive(&g) {
            // Its slot moved on (the call failed meanwhile): the rest of
            // the group has nowhere to go.
            if let Some(open) = &mut self.rx_group {
                open.target = GroupTarget::Discard;
                open.next = seq + 1;
            }
            return;
        }
        // Append the payload to the message being reassembled.
        let dest = match g.target {
            GroupTarget::Serve(idx) => self.serves[idx as usize].message_buf(),
            GroupTarget::Call(idx) => self.calls[idx as usize].reply_buffer(),
            GroupTarget::Discard => return,
        };
        let cap = match g.target {
            GroupTarget::Serve(_) => self.bufs.buf_len(dest).min(self.config.max_call_size),
            _ => self.bufs.buf_len(dest),
        };
        if u64::from(g.filled) + u64::from(payload_len) > u64::from(cap) {
            self.break_group(
                xid,
                seq,
                ErrorInfo::BadPayloadLength {
                    value: payload_len,
                    min: 0,
                    max: cap - g.filled,
                },
            );
            return;
        }
        if !self.copy_received(recv, hlen as u32, payload_len, dest, g.filled as usize) {
            // Checked above against both buffers: unreachable, but a
            // payload that is not there breaks the group, never the engine.
            let info = ErrorInfo::BadPayloadLength {
                value: payload_len,
                min: 0,
                max: room,
            };
            self.break_group(xid, seq, info);
            return;
        }
        let filled = g.filled + payload_len;
        if seq + 1 < g.count {
            if let Some(open) = &mut self.rx_group {
                open.next += 1;
                open.filled = filled;
            }
            return;
        }
        self.rx_group = None;
        self.timers.stop(Timer::GroupReassembly);
        match g.target {
            GroupTarget::Serve(idx) => {
                self.stats.call_groups_received += 1;
                self.serves[idx as usize].set_call_len(filled);
                self.finish_serve_group(now, idx);
            }
            GroupTarget::Call(idx) => {
                self.stats.reply_groups_received += 1;
                self.finish_reply_group(idx as usize, g.xid, filled, g.credits);
            }
            GroupTarget::Discard => {}
        }
    }

    /// The first transmission of a reply (Transmit Response, s9.3).
    fn on_reply_group(
        &mut self,
        _now: Instant,
        recv: Received<'_>,
        hlen: usize,
        xid: u32,
        count: u32,
        payload_len: u32,
    ) {
        let op = self.opt_hdr.op;
        let credits = self.opt_hdr.credits;
        let Some(idx) = self.find_sent_call(xid) else {
            self.stats.unmatched_replies += 1;
            self.discard_rest(xid, op);
            return;
        };
        let allowed = 1 + self.calls[idx].reply_receives();
        let reply_buf = self.calls[idx].reply_buffer();
        let cap = self.bufs.buf_len(reply_buf);
        let wrong = if count > allowed {
            Some(ErrorInfo::BadSequence {
                expected: allowed,
                current: count,
            })
        } else if payload_len > cap {
            Some(ErrorInfo::BadPayloadLength {
                value: payload_len,
                min: 0,
                max: cap,
            })
        } else {
            None
        };
        if let Some(info) = wrong {
            let code = info.code();
            self.report(
                TransmissionId {
                    xid,
                    direction: MessageType::Reply,
                    seq: 0,
                },
                None,
                info,
            );
            self.fail_reply(idx, CallFailure::TransmissionError { code });
            self.discard_rest(xid, op);
            return;
        }
        if !self.copy_received(recv, hlen as u32, payload_len, reply_buf, 0) {
            // Checked above: unreachable; the call fails, never the engine.
            self.fail_reply(idx, CallFailure::MalformedReply);
            self.discard_rest(xid, op);
            return;
        }
        if count == 1 {
            self.finish_reply_group(idx, xid, payload_len, credits);
        } else {
            let generation = self.calls[idx].generation;
            self.open_group(
                xid,
                GroupKind::Response,
                GroupTarget::Call(idx as u32),
                generation,
                count,
                payload_len,
                credits,
            );
        }
    }

    /// A Report Error from the peer (s9.5): about a call of ours, that
    /// call fails (the peer dropped it); about a reply of ours, counted.
    fn on_report(&mut self, r: ErrorReport) {
        self.stats.transmission_errors_received += 1;
        // The group the error broke: the earlier transmission that led to
        // it, else the one it was found on.
        let about = r.lead.unwrap_or(r.bad);
        if about.direction == MessageType::Call {
            if let Some(idx) = self.find_sent_call(about.xid) {
                let code = r.info.code();
                self.fail_reply(idx, CallFailure::TransmissionError { code });
            }
        }
    }

    /// Something other than the expected continuation arrived while a
    /// group was open (or the group went wrong): the group is dropped
    /// and the peer told why (s9.5). `xid`/`seq`: the transmission it was
    /// found on.
    pub(super) fn break_group(&mut self, xid: u32, seq: u32, info: ErrorInfo) {
        let Some(g) = self.rx_group.take() else {
            return;
        };
        self.timers.stop(Timer::GroupReassembly);
        if g.target == GroupTarget::Discard {
            return;
        }
        self.stats.groups_dropped += 1;
        let lead = TransmissionId {
            xid: g.xid,
            direction: g.direction(),
            seq: 0,
        };
        let bad = TransmissionId {
            xid,
            direction: g.direction(),
            seq,
        };
        let code = info.code();
        self.report(bad, Some(lead), info);
        self.drop_group_target(g, code);
        // The rest of the group, if any is still on its way, is dropped
        // quietly, not reported one by one: after the transmission the
        // error was found on when that was one of its continuations (a
        // lost one, or a bad one), else from where it stopped.
        let next = if seq > 0 {
            seq.saturating_add(1)
        } else {
            g.next
        };
        if next < g.count {
            self.rx_group = Some(RxGroup {
                target: GroupTarget::Discard,
                next,
                ..g
            });
            self.timers.set(Timer::GroupReassembly, g.deadline);
        }
    }

    /// A version One header arrived: if a group is open it is broken off
    /// (`BADHMT`, rtrext s9.5).
    pub(super) fn interrupt_group(&mut self, xid: u32, proc_type: u32) {
        if self.rx_group.is_some() {
            self.break_group(
                xid,
                0,
                ErrorInfo::BadHeaderType {
                    expected: RDMA_OPTIONAL,
                    current: proc_type,
                },
            );
        }
    }

    /// Whether the slot a group is reassembled in is still waiting for
    /// it: the responder slot receiving it, or our call still sent (or
    /// abandoned at its timeout), in the same generation.
    fn group_target_alive(&self, g: &RxGroup) -> bool {
        match g.target {
            GroupTarget::Serve(idx) => self.serves[idx as usize].receives_group(g.generation),
            GroupTarget::Call(idx) => self.calls[idx as usize].awaits_answer(g.generation),
            GroupTarget::Discard => false,
        }
    }

    /// Gives back what an unfinished group held.
    fn drop_group_target(&mut self, g: RxGroup, code: u32) {
        if !self.group_target_alive(&g) {
            return;
        }
        match g.target {
            GroupTarget::Serve(idx) => self.drop_serve_group(idx as usize),
            GroupTarget::Call(idx) => {
                self.fail_reply(idx as usize, CallFailure::TransmissionError { code });
            }
            GroupTarget::Discard => {}
        }
    }

    /// `Timer::GroupReassembly` fired: a group that stopped arriving is
    /// dropped (nothing is reported: the peer stopped sending it).
    pub(super) fn expire_group(&mut self, now: Instant) {
        let Some(g) = self.rx_group else {
            return;
        };
        if g.deadline > now {
            self.timers.set(Timer::GroupReassembly, g.deadline);
            return;
        }
        self.rx_group = None;
        if g.target != GroupTarget::Discard {
            self.stats.groups_dropped += 1;
        }
        self.drop_group_target(g, 0);
    }

    /// The connection closed: a group being received ends with it (its
    /// slot is drained by the close).
    pub(super) fn close_group(&mut self) {
        self.rx_group = None;
    }

    /// Sends a Report Error (s9.5) in a control buffer; dropped and
    /// counted as an error reply when none is free.
    fn report(&mut self, bad: TransmissionId, lead: Option<TransmissionId>, info: ErrorInfo) {
        let Some(i) = self.err_free.pop() else {
            self.stats.error_replies_dropped += 1;
            return;
        };
        let credits = self.grant_to_send(self.config.credits);
        let h = OptionalHeader::new(
            bad.xid,
            credits,
            Operation::ReportError(ErrorReport { bad, lead, info }),
        );
        let buf = self.err_bufs[i as usize].buf;
        let Ok(n) = h.emit(self.negotiated, self.bufs.bytes_mut(buf)) else {
            self.err_free.push(i);
            self.stats.error_replies_dropped += 1;
            return;
        };
        self.err_bufs[i as usize].busy = true;
        self.stats.transmission_errors_sent += 1;
        self.post_control(WrKind::ErrorSend, i, n as u32, None);
    }
}
