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
//!   credits until its reply). Such a call whose reply might not fit
//!   inline reserves receives for the reply's later transmissions
//!   instead of offering a reply chunk (`optxrq_rsbuf`, s4.3, s5.2), when
//!   the peer's Response Transmission Send Limit (s8.5) and our free
//!   continuation receives allow it. A call that fits one Send with
//!   nothing to pull stays Version One whatever its reply: the
//!   responder's Writes into a reply or write chunk cost no round trip.
//! * **Sending a reply** (`post_reply`): a reply too long for one Send,
//!   to a call that reserved enough receives, goes as a group.
//! * **Receiving**: the transmissions of a group follow each other with
//!   nothing in between (s4.2: the sender queues them back to back, and
//!   a reliable connection keeps their order). The first takes a
//!   responder slot (a call) or finds its call (a reply); each payload is
//!   appended to the slot's message buffer, and the receive goes back at
//!   once (with send-based placement, the payload stream around the
//!   placed items and each item's pieces to their places, `take_transmission`).
//!   Anything else arriving before the group is whole breaks it
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
//! | a placed item's segment number wrong for the group or the Send (send-based placement, s7.3, `placement.rs`) | `BADTBSN` |
//! | a placed item's offset past its first segment | `BADOFF` |
//!
//! A Report Error about a call of ours fails that call
//! ([`super::CallFailure::TransmissionError`]); one about a reply we
//! sent is counted (the reply's slot is long gone).

use super::buffers::{BufId, LocalSlice};
use super::connection::{Disposition, Received};
use super::placement::{ItemSpan, Piece, PlacedLayout, ResultDirection, ANSWER_HEADER_LEN};
use super::time::{Instant, Timer};
use super::wr::{WorkRequest, WrId, WrKind};
use super::{roundup4, CallFailure, Connection, DdpItem, Extensions};
use crate::wire::rpc::MessageType;
use crate::wire::rpcrdma::ErrorBody;
use crate::wire::rtrext::{
    op_type, Direction, ErrorInfo, ErrorReport, GroupKind, ItemLocation, Limits as RtrLimits,
    Operation, OptionalHeader, PlacedItem, PlacementType, ReplyLocation, TransmissionId,
    RDMA_OPTIONAL,
};

/// Header bytes of each kind of transmission we send (no placement, no
/// directions: fixed sizes).
pub(super) const REQUEST_HEADER_LEN: u32 = 24 + 4 + 4 + 12;
pub(super) const RESPONSE_HEADER_LEN: u32 = 24 + 4 + 8;
pub(super) const CONTINUE_HEADER_LEN: u32 = 24 + 12;

/// The placement lists and directions we parse: within the codec's
/// default limits (`OptionalHeader::with_capacity`, so parsing never
/// allocates); what send-based placement can use of them is checked
/// after parsing (`accept_placement`, `reply_direction`).
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

/// The most segments of an explicit-RDMA response direction we follow
/// (a write chunk's, as our requester sends one).
const MAX_WRITE_DIRECTION_SEGMENTS: usize = 16;

/// A call's response direction as received (s7.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ReceivedDirection {
    /// Place the reply's item by Send if at least `min_len` long.
    Send { min_len: u32 },
    /// Write it by RDMA into the direction's segments.
    Write,
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
    /// The message's DDP-eligible item, placed by Send into the peer's
    /// target segments as laid out (s7.3; `placement.rs`).
    pub(super) place: Option<PlacedLayout>,
    /// Transmit Request: where the reply's DDP-eligible item goes (one
    /// response direction, s7.4).
    pub(super) direct_reply: Option<ResultDirection>,
    /// Transmit Response to a call that directed its reply's item, when
    /// the item is not placed: too short (and where it is inline), or
    /// none (s7.4 Table 2).
    pub(super) answer: Option<(PlacementType, DdpItem)>,
}

impl GroupSend {
    /// Header bytes of the first transmission, without a placed item's
    /// entry.
    pub(super) fn first_header_len(&self) -> u32 {
        let base = match self.kind {
            GroupKind::Request => REQUEST_HEADER_LEN,
            GroupKind::Response => RESPONSE_HEADER_LEN,
        };
        base + self.direct_reply.map_or(0, |d| d.header_len())
            + self.answer.map_or(0, |_| ANSWER_HEADER_LEN)
    }
}

impl Connection {
    /// True when message continuation is in use on this connection.
    pub(super) fn continues(&self) -> bool {
        self.negotiated.contains(Extensions::MESSAGE_CONTINUATION)
    }

    /// True when send-based placement is in use too (it rides on the
    /// transmission framing of continuation here).
    pub(super) fn places(&self) -> bool {
        self.negotiated
            .contains(Extensions::MESSAGE_CONTINUATION.union(Extensions::SEND_PLACEMENT))
    }

    /// Writes the transmissions of `g` into its group buffer and queues
    /// their Sends back to back (s4.2: nothing may come between them).
    /// Returns how many Sends were queued; 0, queuing nothing, if the
    /// group does not fit the buffer or a header does not encode.
    ///
    /// ```text
    /// first = xid vers=1 credits RDMA_OPTIONAL XMTREQ  len  dp rsd count rsbuf pslen payload [item]
    ///       / xid vers=1 credits RDMA_OPTIONAL XMTRESP len  dp count pslen payload [item]  -- s9.2, s9.3
    /// next  = xid vers=1 credits RDMA_OPTIONAL XMTCONT 12   xnum itype pslen payload [item] -- s9.4
    /// dp    = { disp length TBSN offset <tbsn> } (a placed item, s7.3)
    ///       | { disp length TOOSHORT | NOITEM } (a direction answered, s7.4)
    /// rsd   = { begin end { minlen TBSN } }       (the reply's item placed, s7.4)
    /// ```
    pub(super) fn queue_group(&mut self, g: &GroupSend) -> u32 {
        let first_len = g.first_header_len();
        let count = match &g.place {
            Some(p) => p.count,
            None => match transmissions(g.len, g.limit, first_len) {
                Some(n) => n,
                None => return 0,
            },
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
            let n = match &g.place {
                Some(p) if seq == 0 => p.payload_len,
                Some(_) => 0,
                None => (g.limit - header).min(g.len - from),
            };
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
            let Some((head, gather)) = self.write_transmission(g, seq, at, op, n, from) else {
                self.tx.truncate(queued_before);
                return 0;
            };
            self.tx.push_back(WorkRequest::Send {
                wr_id: WrId::for_op(g.wr_id.kind, g.wr_id.index, g.wr_id.generation, seq),
                local: LocalSlice {
                    buf: g.group_buf,
                    offset: at,
                    len: head,
                },
                gather,
                invalidate_rkey: None,
            });
            from += n;
            // The next transmission starts 4-aligned.
            at += head.next_multiple_of(4);
        }
        count
    }

    /// Writes transmission `seq` of `g` at `at` in its group buffer: the
    /// header for `op`, then what is sent from where it lies in the
    /// message (one slice: `n` bytes of payload stream from `from`, or
    /// the pieces of a placed item this transmission carries, when they
    /// are contiguous), else copied after the header (the first
    /// transmission of a placed message: its payload stream, the message
    /// without the item). Returns the bytes written at `at` and the
    /// slice to gather after them; `None` if a header does not encode or
    /// a piece does not fit.
    fn write_transmission(
        &mut self,
        g: &GroupSend,
        seq: u32,
        at: u32,
        op: Operation,
        n: u32,
        from: u32,
    ) -> Option<(u32, Option<LocalSlice>)> {
        let hl = if seq == 0 {
            self.first_header(g, op)?
        } else {
            let h = OptionalHeader::new(g.xid, g.credits, op);
            let out = self.bufs.bytes_mut(g.group_buf).get_mut(at as usize..)?;
            h.emit(self.negotiated, out).ok()? as u32
        };
        let message = |offset, len| LocalSlice {
            buf: g.message,
            offset,
            len,
        };
        let Some(p) = &g.place else {
            // The payload stream, from where it lies.
            return Some((hl, (n > 0).then(|| message(from, n))));
        };
        let mut end = at + hl;
        if seq == 0 {
            // The payload stream: the message around the item.
            let (cut, padded) = (p.item.offset, roundup4(u64::from(p.item.len)) as u32);
            let before = message(0, cut);
            let after = message(cut + padded, n - cut);
            if !self.bufs.copy(before, g.group_buf, end as usize)
                || !self.bufs.copy(after, g.group_buf, (end + cut) as usize)
            {
                return None;
            }
            end += n;
        }
        // The item's pieces in this transmission, in order.
        let (mut first, mut last): (Option<Piece>, Option<Piece>) = (None, None);
        let mut contiguous = true;
        for piece in p.pieces_in(&self.peer_targets, seq) {
            let piece = piece?;
            if let Some(l) = last {
                contiguous &= piece.src == l.src + l.len && piece.dest == l.dest + l.len;
            }
            first.get_or_insert(piece);
            last = Some(piece);
        }
        let (Some(first), Some(last)) = (first, last) else {
            return Some((end - at, None));
        };
        // What lies between the header (and payload) and the item is
        // padding: zeros, not what the buffer held before.
        let to = at + first.src;
        if to > end {
            self.bufs
                .zero(g.group_buf, end as usize, (to - end) as usize);
        }
        if contiguous {
            let len = last.dest + last.len - first.dest;
            return Some((to - at, Some(message(first.dest, len))));
        }
        // Target segments that are not back to back (a peer's structure
        // may say so): each piece copied to its place.
        for piece in p.pieces_in(&self.peer_targets, seq) {
            let piece = piece?;
            let dest = at + piece.src;
            if dest > end {
                self.bufs
                    .zero(g.group_buf, end as usize, (dest - end) as usize);
            }
            if !self
                .bufs
                .copy(message(piece.dest, piece.len), g.group_buf, dest as usize)
            {
                return None;
            }
            end = end.max(dest + piece.len);
        }
        Some((end - at, None))
    }

    /// Emits the first header of `g` (operation `op`) at the start of its
    /// transmission, with its placement and direction, into the group
    /// buffer; returns its length. The scratch header keeps its storage,
    /// so this allocates nothing.
    fn first_header(&mut self, g: &GroupSend, op: Operation) -> Option<u32> {
        let h = &mut self.tx_opt;
        h.xid = g.xid;
        h.credits = g.credits;
        h.op = op;
        h.placement.clear();
        h.directions.clear();
        if let Some(p) = &g.place {
            h.placement
                .push(PlacedItem {
                    disp: p.item.offset,
                    length: p.item.len,
                    location: ItemLocation::TargetBuffers {
                        offset: 0,
                        buffer_segments: p.segment_numbers(),
                    },
                })
                .ok()?;
        }
        if let Some((kind, item)) = g.answer {
            let location = match kind {
                PlacementType::TooShort => ItemLocation::TooShort,
                _ => ItemLocation::NoItem,
            };
            h.placement
                .push(PlacedItem {
                    disp: item.offset,
                    length: item.len,
                    location,
                })
                .ok()?;
        }
        let segment;
        let direction = match g.direct_reply {
            Some(ResultDirection::Send { min_len }) => Some(Direction {
                min_len,
                location: ReplyLocation::TargetBuffers,
            }),
            Some(ResultDirection::Write(s)) => {
                segment = [s];
                Some(Direction {
                    min_len: 0,
                    location: ReplyLocation::ExplicitRdma(&segment),
                })
            }
            None => None,
        };
        if let Some(d) = direction {
            h.directions
                .push_set(0, roundup4(u64::from(g.len)).max(4) as u32, &[d])
                .ok()?;
        }
        // The first transmission starts the group buffer.
        let out = self.bufs.bytes_mut(g.group_buf);
        self.tx_opt
            .emit(self.negotiated, out)
            .ok()
            .map(|n| n as u32)
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
            let info = ErrorInfo::BadPayloadLength {
                value: op.payload_len(),
                min: 0,
                max: room,
            };
            self.refuse_first(xid, direction, info, op);
            return Disposition::Done;
        }
        // Placement (s7.3) and response directions (s7.4): what we
        // implement is checked against our buffers here, once per group;
        // the rest (explicit-RDMA locations and directions, more than one
        // direction) is refused below like an unknown operation.
        let (count, direction) = match op {
            Operation::TransmitRequest { count, .. } => (count, MessageType::Call),
            Operation::TransmitResponse { count, .. } => (count, MessageType::Reply),
            _ => (0, MessageType::Call),
        };
        let supported = match op {
            Operation::TransmitRequest { .. } | Operation::TransmitResponse { .. } => {
                match self.accept_placement(count) {
                    Ok(supported) => supported,
                    Err(info) => {
                        self.refuse_first(xid, direction, info, op);
                        return Disposition::Done;
                    }
                }
            }
            _ => true,
        };
        let reply_direction = self.reply_direction();
        match op {
            Operation::TransmitRequest {
                count,
                reply_buffers,
                payload_len,
            } if supported && reply_direction.is_ok() => {
                let rd = reply_direction.ok().flatten();
                return self.on_call_group(
                    now,
                    recv,
                    (hlen, len),
                    xid,
                    count,
                    reply_buffers,
                    payload_len,
                    rd,
                );
            }
            Operation::TransmitResponse { count, payload_len } if supported => {
                self.on_reply_group(now, recv, (hlen, len), xid, count, payload_len);
            }
            Operation::ReportError(r) => self.on_report(r),
            // Explicit-RDMA placement (s7.3) and directions we cannot
            // follow are not implemented; unknown operations: as Version
            // One's unknown message types (ERR_CHUNK, or the call fails).
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

    /// The first transmission of a group (`op`, message `xid` going
    /// `direction`) is refused for `info`: the peer is told (s9.5), our
    /// call it answers fails, the rest of the group is dropped.
    fn refuse_first(&mut self, xid: u32, direction: MessageType, info: ErrorInfo, op: Operation) {
        let code = info.code();
        let bad = TransmissionId {
            xid,
            direction,
            seq: 0,
        };
        self.report(bad, None, info);
        if direction == MessageType::Reply {
            if let Some(slot) = self.find_sent_call(xid) {
                self.fail_reply(slot, CallFailure::TransmissionError { code });
            }
        }
        self.discard_rest(xid, op);
    }

    /// Takes the placement of the group whose first transmission
    /// (`count` transmissions) is in `opt_hdr` (s7.3): target-buffer items
    /// are checked against our buffers and kept in `rx_spans` for the
    /// transmissions to come. `Ok(false)` for what we do not implement
    /// (explicit-RDMA items, more items than a message may place);
    /// `Err` for what is wrong (`BADTBSN`, `BADOFF`).
    fn accept_placement(&mut self, count: u32) -> Result<bool, ErrorInfo> {
        self.rx_n_spans = 0;
        let placement = &self.opt_hdr.placement;
        if placement.is_empty() {
            return Ok(true);
        }
        if !self.negotiated.contains(Extensions::SEND_PLACEMENT) {
            return Ok(false);
        }
        let per = self.our_targets.per_buffer();
        let seg_len = self.our_targets.segment(0).map_or(0, |(_, _, len)| len);
        // Segment numbers of this group: `count` buffers of ours.
        let max = u64::from(count) * u64::from(per);
        let mut numbers = 0usize;
        for item in placement.items() {
            let (offset, list) = match item.location {
                ItemLocation::TargetBuffers {
                    offset,
                    buffer_segments,
                } => (offset, buffer_segments),
                ItemLocation::TooShort | ItemLocation::NoItem => continue,
                ItemLocation::ExplicitRdma(_) => return Ok(false),
            };
            if self.rx_n_spans == self.rx_spans.len() {
                return Ok(false);
            }
            let top = max.saturating_sub(1).min(u64::from(u32::MAX)) as u32;
            if let Some(&bad) = list.iter().find(|&&n| u64::from(n) >= max) {
                return Err(ErrorInfo::BadBufferNumber {
                    value: bad,
                    min: 0,
                    max: top,
                });
            }
            if offset >= seg_len {
                return Err(ErrorInfo::BadOffset {
                    value: offset,
                    min: 0,
                    max: seg_len.saturating_sub(1),
                });
            }
            // Exactly the segments the item fills (the codec saw at least
            // one, in increasing order).
            let need = ItemSpan::segments_needed(item.length, offset, seg_len).max(1);
            if list.len() as u64 != need {
                let at = (need as usize).min(list.len() - 1);
                return Err(ErrorInfo::BadBufferNumber {
                    value: list[at],
                    min: 0,
                    max: top,
                });
            }
            if numbers + list.len() > self.rx_numbers.len() {
                return Ok(false);
            }
            self.rx_numbers[numbers..numbers + list.len()].copy_from_slice(list);
            self.rx_spans[self.rx_n_spans] = ItemSpan {
                disp: item.disp,
                len: item.length,
                offset,
                first: numbers as u32,
                count: list.len() as u32,
            };
            self.rx_n_spans += 1;
            numbers += list.len();
        }
        Ok(true)
    }

    /// The response direction of the call in `opt_hdr` (s7.4): `None`
    /// when it has none; one direction that send-based placement may
    /// follow (target buffers, or the responder's choice), with the
    /// shortest item to place; or one explicit-RDMA direction, followed
    /// as a write chunk (its segments go to the slot with
    /// `take_write_direction`). `Err` for anything else (by size,
    /// several directions), which we do not implement.
    fn reply_direction(&self) -> Result<Option<ReceivedDirection>, ()> {
        let dirs = &self.opt_hdr.directions;
        if dirs.is_empty() {
            return Ok(None);
        }
        if !self.negotiated.contains(Extensions::SEND_PLACEMENT) || dirs.len() != 1 {
            return Err(());
        }
        let mut found = None;
        for set in dirs.sets() {
            for d in set.directions() {
                if found.is_some() {
                    return Err(());
                }
                found = Some(match d.location {
                    ReplyLocation::TargetBuffers | ReplyLocation::Choice(_) => {
                        ReceivedDirection::Send { min_len: d.min_len }
                    }
                    ReplyLocation::ExplicitRdma(segs)
                        if !segs.is_empty() && segs.len() <= MAX_WRITE_DIRECTION_SEGMENTS =>
                    {
                        ReceivedDirection::Write
                    }
                    _ => return Err(()),
                });
            }
        }
        found.map(Some).ok_or(())
    }

    /// The segments of the explicit-RDMA direction in `opt_hdr` become
    /// the write chunk of responder slot `idx` (whose call just began):
    /// the reply then goes as Version One does with a write chunk, the
    /// item written by RDMA, the rest in an RDMA_MSG with the write list
    /// (its lengths the answer to the direction).
    fn take_write_direction(&mut self, idx: u32) {
        self.warm_slot_lists_once();
        let chunks = self.serves[idx as usize].peer_chunks_mut();
        for set in self.opt_hdr.directions.sets() {
            for d in set.directions() {
                if let ReplyLocation::ExplicitRdma(segs) = d.location {
                    // Cannot fail: `reply_direction` bounded the count.
                    let _ = chunks.push_write_chunk(segs);
                }
            }
        }
    }

    /// `cursor` moved past the placed items that start there (each with
    /// its XDR padding: the virtual XDR stream, s6.2).
    fn skip_placed(&self, mut cursor: u32) -> u32 {
        for span in &self.rx_spans[..self.rx_n_spans] {
            if span.disp == cursor {
                cursor = cursor
                    .saturating_add(roundup4(u64::from(span.len)).min(u64::from(u32::MAX)) as u32);
            }
        }
        cursor
    }

    /// Where the next placed item after `cursor` starts.
    fn next_placed(&self, cursor: u32) -> Option<u32> {
        self.rx_spans[..self.rx_n_spans]
            .iter()
            .map(|s| s.disp)
            .find(|&d| d > cursor)
    }

    /// Copies transmission `seq` of a group of `count` into `dest` (at
    /// most `cap` bytes): `len` bytes in `recv`, a header of `hlen`, then
    /// `payload_len` bytes of payload stream, which continue the message
    /// at `cursor` around the placed items (s6.2, s7.3), and the pieces
    /// of placed items this transmission carries in our target segments.
    /// Returns where the payload stream goes on; after the last
    /// transmission, the message length. Each byte is copied once, from
    /// the receive buffer to where it belongs.
    #[allow(clippy::too_many_arguments)]
    fn take_transmission(
        &mut self,
        recv: Received<'_>,
        (hlen, len): (u32, u32),
        payload_len: u32,
        seq: u32,
        count: u32,
        dest: BufId,
        cap: u32,
        mut cursor: u32,
    ) -> Result<u32, ErrorInfo> {
        let too_long = |max: u32| ErrorInfo::BadPayloadLength {
            value: payload_len,
            min: 0,
            max,
        };
        let (mut src, mut left) = (hlen, payload_len);
        loop {
            cursor = self.skip_placed(cursor);
            if left == 0 {
                break;
            }
            let n = left.min(self.next_placed(cursor).map_or(u32::MAX, |d| d - cursor));
            if u64::from(cursor) + u64::from(n) > u64::from(cap)
                || !self.copy_received(recv, src, n, dest, cursor as usize)
            {
                return Err(too_long(cap.saturating_sub(cursor).min(len - hlen)));
            }
            (src, left, cursor) = (src + n, left - n, cursor + n);
        }
        let stream_end = hlen + payload_len;
        for i in 0..self.rx_n_spans {
            let span = self.rx_spans[i];
            for j in 0..span.count {
                let number = self.rx_numbers[(span.first + j) as usize];
                let Some((t, piece)) = span.piece(&self.our_targets, j, number) else {
                    return Err(ErrorInfo::BadBufferNumber {
                        value: number,
                        min: 0,
                        max: (count * self.our_targets.per_buffer()).saturating_sub(1),
                    });
                };
                if t != seq {
                    continue;
                }
                // A segment under the payload stream, or past the end of
                // the Send, holds none of the item.
                if piece.src < stream_end
                    || u64::from(piece.src) + u64::from(piece.len) > u64::from(len)
                {
                    let per = self.our_targets.per_buffer();
                    return Err(ErrorInfo::BadBufferNumber {
                        value: number,
                        min: seq * per,
                        max: seq * per + per - 1,
                    });
                }
                if u64::from(piece.dest) + u64::from(piece.len) > u64::from(cap)
                    || !self.copy_received(recv, piece.src, piece.len, dest, piece.dest as usize)
                {
                    return Err(too_long(cap.saturating_sub(cursor)));
                }
            }
        }
        if seq + 1 < count {
            return Ok(cursor);
        }
        // The message is whole: every placed item must lie inside it;
        // their XDR padding is zeros.
        for span in &self.rx_spans[..self.rx_n_spans] {
            let end = u64::from(span.disp) + roundup4(u64::from(span.len));
            if end > u64::from(cursor) {
                // The payload stream ended before the item's place.
                return Err(ErrorInfo::BadPayloadLength {
                    value: cursor,
                    min: end.min(u64::from(u32::MAX)) as u32,
                    max: cap,
                });
            }
            let at = (u64::from(span.disp) + u64::from(span.len)) as usize;
            self.bufs.zero(dest, at, end as usize - at);
        }
        self.stats.items_placed_received += self.rx_n_spans as u64;
        Ok(cursor)
    }

    /// [`Connection::take_transmission`] for a group's first transmission
    /// (number 0, the message starting at 0).
    fn take_first(
        &mut self,
        recv: Received<'_>,
        hlen_len: (u32, u32),
        payload_len: u32,
        count: u32,
        dest: BufId,
        cap: u32,
    ) -> Result<u32, ErrorInfo> {
        self.take_transmission(recv, hlen_len, payload_len, 0, count, dest, cap, 0)
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
    /// `count` transmissions, `payload_len` payload bytes after `hlen`
    /// in a Send of `len`, its reply directed as `reply_direction` says.
    #[allow(clippy::too_many_arguments)]
    fn on_call_group(
        &mut self,
        now: Instant,
        recv: Received<'_>,
        (hlen, len): (usize, usize),
        xid: u32,
        count: u32,
        reply_buffers: u32,
        payload_len: u32,
        reply_direction: Option<ReceivedDirection>,
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
                let dest = self.serves[idx as usize].message_buf();
                let cap = self.bufs.buf_len(dest).min(self.config.max_call_size);
                let taken = self.take_first(
                    recv,
                    (hlen as u32, len as u32),
                    payload_len,
                    count,
                    dest,
                    cap,
                );
                let filled = match taken {
                    Ok(filled) => filled,
                    Err(info) => {
                        self.return_group_slot(idx);
                        self.refuse_first(xid, MessageType::Call, info, op);
                        return Disposition::Done;
                    }
                };
                let place_min = match reply_direction {
                    Some(ReceivedDirection::Send { min_len }) => Some(min_len),
                    _ => None,
                };
                self.start_serve_group(idx, xid, count, reply_buffers, filled, credits, place_min);
                if reply_direction == Some(ReceivedDirection::Write) {
                    self.take_write_direction(idx);
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
                        filled,
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
        let taken = self.take_transmission(
            recv,
            (hlen as u32, hlen as u32 + room),
            payload_len,
            seq,
            g.count,
            dest,
            cap,
            g.filled,
        );
        let filled = match taken {
            Ok(filled) => filled,
            Err(info) => {
                self.break_group(xid, seq, info);
                return;
            }
        };
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
        (hlen, len): (usize, usize),
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
        let taken = if count > allowed {
            Err(ErrorInfo::BadSequence {
                expected: allowed,
                current: count,
            })
        } else {
            self.take_first(
                recv,
                (hlen as u32, len as u32),
                payload_len,
                count,
                reply_buf,
                cap,
            )
        };
        let filled = match taken {
            Ok(filled) => filled,
            Err(info) => {
                self.refuse_first(xid, MessageType::Reply, info, op);
                return;
            }
        };
        if count == 1 {
            self.finish_reply_group(idx, xid, filled, credits);
        } else {
            let generation = self.calls[idx].generation;
            self.open_group(
                xid,
                GroupKind::Response,
                GroupTarget::Call(idx as u32),
                generation,
                count,
                filled,
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
