//! Fuzzing entry point for the engine (the `engine_recv` cargo-fuzz
//! target, like [`crate::wire::rpcrdma::fuzz_parse`] for the codecs), and
//! the peer model it shares with the endpoint target
//! (`worker::fuzz_endpoint`).
//!
//! The input plays the whole peer: the messages it sends (raw bytes, or
//! well-formed calls and replies built around what the engine advertised,
//! so mutations keep reaching the deep states), the contents of its own
//! memory that the engine's RDMA Reads land from, its writes into the
//! engine's exposed buffers, and the provider: which posted work request
//! completes next, in any order and with any status, plus stale and
//! made-up ids.
//!
//! Nothing here is on the data path: it only calls the engine's public
//! inputs and reads slot states between them ([`Coverage`]).

use super::Extensions;
use std::collections::{HashMap, VecDeque};

use super::requester::CallState;
use super::responder::ServeState;
use super::{
    Access, AppChunks, BufId, CallFailure, CallHandle, CloseReason, Config, Connection, DdpItem,
    Event, IncomingCall, Instant, LocalSlice, Memory, OutgoingCall, OutgoingReply, PeerMemory,
    ReplyExpect, SlabMemory, WcStatus, WorkRequest, WrId,
};
use crate::wire::rpcrdma::{ErrorBody, Limits, MessageBody, ReadSegment, Segment, TransportHeader};

/// The bit number of a [`Coverage`] label, checked and found at compile
/// time.
macro_rules! label {
    ($l:literal) => {
        const { $crate::engine::fuzz::Coverage::index($l) }
    };
}
pub(crate) use label;

/// What one input reached, as a bit set over [`Coverage::LABELS`]: slot
/// states seen between inputs, events, work-request kinds, and engine
/// counters that moved. The corpus replay test tabulates it
/// (docs/FUZZING.md, "Coverage per engine state").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Coverage(pub u128);

impl Coverage {
    /// The name of each bit, in bit order.
    pub const LABELS: &'static [&'static str] = &[
        "call: Queued",
        "call: Sent",
        "call: PullingReplyReadChunk",
        "call: ReplyReady",
        "call: Abandoned",
        "call: Draining",
        "serve: PullingReadChunks",
        "serve: Executing",
        "serve: AwaitingCompletions",
        "serve: AwaitingDone",
        "serve: Draining",
        "serve: ReceivingGroup",
        "event: CallArrived",
        "event: ReplyArrived",
        "event: ReplyArrived with DDP",
        "event: CallFailed PeerVersionError",
        "event: CallFailed PeerChunkError",
        "event: CallFailed PeerError",
        "event: CallFailed MalformedReply",
        "event: CallFailed UnsupportedReply",
        "event: CallFailed ReplyTooLarge",
        "event: CallFailed Timeout",
        "event: CallFailed ConnectionLost",
        "event: CallFailed NoKeyWindow",
        "event: CallFailed TransmissionError",
        "event: ConnectionLost Local",
        "event: ConnectionLost CreditOverrun",
        "event: ConnectionLost TransportError",
        "event: ConnectionLost Idle",
        "event: ConnectionLost PeerDisconnected",
        "wr: Send",
        "wr: Send with invalidate",
        "wr: RdmaRead",
        "wr: RdmaWrite",
        "wr: Bind",
        "wr: Invalidate",
        "completion: error status",
        "reply sent",
        "reply sent with DDP",
        "stats: replies_exposed",
        "stats: replies_pulled",
        "stats: done_received",
        "stats: done_sent",
        "stats: done_timeouts",
        "stats: done_ignored",
        "stats: err_vers_sent",
        "stats: err_chunk_sent",
        "stats: stale_completions",
        "stats: calls_parked",
        "stats: unmatched_replies",
        "stats: late_replies",
        "stats: conf_rdma_answered",
        "stats: conf_rdma_refused",
        "stats: credit_overruns",
        "stats: runts_dropped",
        "stats: bad_recv_len",
        "stats: unknown_remote_invalidations",
        "stats: unnegotiated_read_list_replies",
        "stats: error_replies_dropped",
        "stats: idle_closes",
        "stats: call_groups_received",
        "stats: reply_groups_received",
        "stats: transmission_errors_sent",
        "stats: transmission_errors_received",
        "stats: groups_dropped",
        "stats: items_placed_sent",
        "stats: items_placed_received",
        "endpoint: foreign_completions",
        "endpoint: queue_full",
        "endpoint: backlog",
        "endpoint: post_invalid",
        "endpoint: error_completions",
    ];

    /// The bit of `label`, found at compile time through [`label!`]
    /// (the labels are marked thousands of times per input: a search by
    /// name each time cost a tenth of the fuzzers' time).
    ///
    /// # Panics
    /// If no label is called `label` (at compile time, in a `const`).
    pub(crate) const fn index(label: &str) -> usize {
        let l = label.as_bytes();
        let mut i = 0;
        while i < Self::LABELS.len() {
            let c = Self::LABELS[i].as_bytes();
            if c.len() == l.len() {
                let mut j = 0;
                while j < c.len() && c[j] == l[j] {
                    j += 1;
                }
                if j == c.len() {
                    return i;
                }
            }
            i += 1;
        }
        panic!("no such coverage label")
    }

    fn set(&mut self, i: usize) {
        self.0 |= 1 << i;
    }

    /// Whether the input reached `label`.
    pub fn has(&self, label: &str) -> bool {
        Self::LABELS
            .iter()
            .position(|l| *l == label)
            .is_some_and(|i| self.0 & (1 << i) != 0)
    }

    /// Marks the states the slots of `c` are in now.
    pub(crate) fn sample(&mut self, c: &Connection) {
        for s in &c.calls {
            match s.state {
                CallState::Free => {}
                CallState::Queued => self.set(label!("call: Queued")),
                CallState::Sent => self.set(label!("call: Sent")),
                CallState::PullingReplyReadChunk => self.set(label!("call: PullingReplyReadChunk")),
                CallState::ReplyReady => self.set(label!("call: ReplyReady")),
                CallState::Abandoned => self.set(label!("call: Abandoned")),
                CallState::Draining => self.set(label!("call: Draining")),
            }
        }
        for s in &c.serves {
            match s.state {
                ServeState::Free => {}
                ServeState::PullingReadChunks => self.set(label!("serve: PullingReadChunks")),
                ServeState::Executing => self.set(label!("serve: Executing")),
                ServeState::AwaitingCompletions => self.set(label!("serve: AwaitingCompletions")),
                ServeState::AwaitingDone => self.set(label!("serve: AwaitingDone")),
                ServeState::Draining => self.set(label!("serve: Draining")),
                ServeState::ReceivingGroup => self.set(label!("serve: ReceivingGroup")),
            }
        }
    }

    pub(crate) fn event(&mut self, ev: &Event) {
        match ev {
            Event::CallArrived { .. } => self.set(label!("event: CallArrived")),
            Event::ReplyArrived { ddp_len, .. } => {
                self.set(label!("event: ReplyArrived"));
                if ddp_len.is_some() {
                    self.set(label!("event: ReplyArrived with DDP"));
                }
            }
            Event::CallFailed { reason, .. } => self.set(match reason {
                CallFailure::PeerVersionError { .. } => {
                    label!("event: CallFailed PeerVersionError")
                }
                CallFailure::PeerChunkError => label!("event: CallFailed PeerChunkError"),
                CallFailure::PeerError { .. } => label!("event: CallFailed PeerError"),
                CallFailure::MalformedReply => label!("event: CallFailed MalformedReply"),
                CallFailure::UnsupportedReply => label!("event: CallFailed UnsupportedReply"),
                CallFailure::ReplyTooLarge => label!("event: CallFailed ReplyTooLarge"),
                CallFailure::Timeout => label!("event: CallFailed Timeout"),
                CallFailure::ConnectionLost => label!("event: CallFailed ConnectionLost"),
                CallFailure::NoKeyWindow => label!("event: CallFailed NoKeyWindow"),
                CallFailure::TransmissionError { .. } => {
                    label!("event: CallFailed TransmissionError")
                }
            }),
            Event::ConnectionLost { reason } => self.set(match reason {
                CloseReason::Local => label!("event: ConnectionLost Local"),
                CloseReason::CreditOverrun => label!("event: ConnectionLost CreditOverrun"),
                CloseReason::TransportError(_) => label!("event: ConnectionLost TransportError"),
                CloseReason::Idle => label!("event: ConnectionLost Idle"),
                CloseReason::PeerDisconnected => label!("event: ConnectionLost PeerDisconnected"),
            }),
        }
    }

    pub(crate) fn work_request(&mut self, wr: &WorkRequest) {
        match wr {
            WorkRequest::PostRecv { .. } => {}
            WorkRequest::Send {
                invalidate_rkey, ..
            } => {
                self.set(label!("wr: Send"));
                if invalidate_rkey.is_some() {
                    self.set(label!("wr: Send with invalidate"));
                }
            }
            WorkRequest::RdmaRead { .. } => self.set(label!("wr: RdmaRead")),
            WorkRequest::RdmaWrite { .. } => self.set(label!("wr: RdmaWrite")),
            WorkRequest::Bind { .. } => self.set(label!("wr: Bind")),
            WorkRequest::Invalidate { .. } => self.set(label!("wr: Invalidate")),
        }
    }

    pub(crate) fn stats(&mut self, c: &Connection) {
        let s = c.stats();
        for (n, label) in [
            (s.replies_exposed, label!("stats: replies_exposed")),
            (s.replies_pulled, label!("stats: replies_pulled")),
            (s.done_received, label!("stats: done_received")),
            (s.done_sent, label!("stats: done_sent")),
            (s.done_timeouts, label!("stats: done_timeouts")),
            (s.done_ignored, label!("stats: done_ignored")),
            (s.err_vers_sent, label!("stats: err_vers_sent")),
            (s.err_chunk_sent, label!("stats: err_chunk_sent")),
            (s.stale_completions, label!("stats: stale_completions")),
            (s.calls_parked, label!("stats: calls_parked")),
            (s.unmatched_replies, label!("stats: unmatched_replies")),
            (s.late_replies, label!("stats: late_replies")),
            (s.conf_rdma_answered, label!("stats: conf_rdma_answered")),
            (s.conf_rdma_refused, label!("stats: conf_rdma_refused")),
            (s.credit_overruns, label!("stats: credit_overruns")),
            (s.runts_dropped, label!("stats: runts_dropped")),
            (s.bad_recv_len, label!("stats: bad_recv_len")),
            (
                s.unknown_remote_invalidations,
                label!("stats: unknown_remote_invalidations"),
            ),
            (
                s.unnegotiated_read_list_replies,
                label!("stats: unnegotiated_read_list_replies"),
            ),
            (
                s.error_replies_dropped,
                label!("stats: error_replies_dropped"),
            ),
            (s.idle_closes, label!("stats: idle_closes")),
            (
                s.call_groups_received,
                label!("stats: call_groups_received"),
            ),
            (
                s.reply_groups_received,
                label!("stats: reply_groups_received"),
            ),
            (
                s.transmission_errors_sent,
                label!("stats: transmission_errors_sent"),
            ),
            (
                s.transmission_errors_received,
                label!("stats: transmission_errors_received"),
            ),
            (s.groups_dropped, label!("stats: groups_dropped")),
            (s.items_placed_sent, label!("stats: items_placed_sent")),
            (
                s.items_placed_received,
                label!("stats: items_placed_received"),
            ),
        ] {
            if n > 0 {
                self.set(label);
            }
        }
    }

    /// Marks label number `i` (the endpoint target's own observations;
    /// [`label!`] gives the number of a name).
    pub(crate) fn mark(&mut self, i: usize) {
        self.set(i);
    }
}

/// Message continuation and send-based placement for the fuzz targets'
/// engines when `on` (each negotiated only if the input's peer asks for
/// it in CONF_RDMA v2).
pub(crate) fn continuation_if(on: bool) -> Extensions {
    if on {
        Extensions::MESSAGE_CONTINUATION.union(Extensions::SEND_PLACEMENT)
    } else {
        Extensions::EMPTY
    }
}

/// The fuzz input, consumed front to back; running out ends the run.
pub(crate) struct Input<'a>(pub(crate) &'a [u8]);

impl<'a> Input<'a> {
    pub(crate) fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }

    pub(crate) fn u16(&mut self) -> Option<u16> {
        let (b, rest) = self.0.split_first_chunk::<2>()?;
        self.0 = rest;
        Some(u16::from_be_bytes(*b))
    }

    pub(crate) fn u32(&mut self) -> Option<u32> {
        let (b, rest) = self.0.split_first_chunk::<4>()?;
        self.0 = rest;
        Some(u32::from_be_bytes(*b))
    }

    pub(crate) fn u64(&mut self) -> Option<u64> {
        let (b, rest) = self.0.split_first_chunk::<8>()?;
        self.0 = rest;
        Some(u64::from_be_bytes(*b))
    }

    /// Up to `n` bytes (fewer at the end of the input).
    pub(crate) fn take(&mut self, n: usize) -> &'a [u8] {
        let (a, b) = self.0.split_at(n.min(self.0.len()));
        self.0 = b;
        a
    }
}

/// The fake peer's own registered memory: what its read chunks advertise
/// and the engine's RDMA Reads copy from, and where the engine's RDMA
/// Writes land. One key; the segment offset is the address.
pub(crate) const PEER_KEY: u32 = 0x7065_6572;
pub(crate) const PEER_MEM: usize = 64 * 1024;

/// A completion status chosen by 4 bits of input: success most often
/// (progress needs it), every failure the engine distinguishes.
pub(crate) fn status_of(bits: u8) -> WcStatus {
    match bits & 15 {
        10 => WcStatus::Flushed,
        11 => WcStatus::RemoteAccessError,
        12 => WcStatus::ReceiverNotReady,
        13 => WcStatus::LengthError,
        14 => WcStatus::Other,
        _ => WcStatus::Success,
    }
}

/// One of the engine's calls as the peer saw its Send: the XID and the
/// chunks it offered for the reply.
#[derive(Debug, Clone, Default)]
pub(crate) struct SeenCall {
    pub(crate) xid: u32,
    pub(crate) write_chunks: Vec<Vec<Segment>>,
    pub(crate) reply_chunk: Option<Vec<Segment>>,
}

/// A reply of the engine exposed in a read chunk (responder-provided),
/// waiting for the peer's RDMA_DONE.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SeenExposed {
    pub(crate) xid: u32,
    pub(crate) rkey: u32,
}

/// What the peer learns from one Send of the engine.
pub(crate) enum Seen {
    Call(SeenCall),
    Exposed(SeenExposed),
    Other,
}

/// Parses a Send of the engine: a call (its chunks kept for the reply),
/// a reply exposed in a position-zero read chunk, or anything else.
/// `own_xids` are the XIDs of the engine's calls: a long call also
/// travels as RDMA_NOMSG with a position-zero read chunk.
pub(crate) fn see_send(bytes: &[u8], own_xids: core::ops::Range<u32>) -> Seen {
    // A call sent as a transmission group (message continuation): its
    // first transmission names the XID; it offers no chunks.
    if let Ok((h, _)) =
        crate::wire::rtrext::OptionalHeader::parse(bytes, &crate::wire::rtrext::Limits::DEFAULT)
    {
        return match h.op {
            crate::wire::rtrext::Operation::TransmitRequest { .. } => Seen::Call(SeenCall {
                xid: h.xid,
                write_chunks: Vec::new(),
                reply_chunk: None,
            }),
            _ => Seen::Other,
        };
    }
    let Ok((hdr, len)) = TransportHeader::parse(bytes, &Limits::DEFAULT) else {
        return Seen::Other;
    };
    if !hdr.body.has_chunk_lists() {
        return Seen::Other;
    }
    if let Some(r) = hdr.chunks.reads().first() {
        if r.position == 0 && hdr.body == MessageBody::NoMsg && !own_xids.contains(&hdr.xid) {
            return Seen::Exposed(SeenExposed {
                xid: hdr.xid,
                rkey: r.segment.handle,
            });
        }
    }
    // An inline message: its direction word says call (0) or reply (1);
    // RDMA_NOMSG calls carry theirs in the read chunk, so an RDMA_NOMSG
    // with a position-zero read chunk was handled above.
    let direction = (hdr.body == MessageBody::NoMsg).then_some(0).or_else(|| {
        bytes
            .get(len + 4..len + 8)
            .map(|w| u32::from_be_bytes([w[0], w[1], w[2], w[3]]))
    });
    if hdr.body.has_inline_message() && direction != Some(0) {
        return Seen::Other;
    }
    Seen::Call(SeenCall {
        xid: hdr.xid,
        write_chunks: hdr
            .chunks
            .write_chunks()
            .map(|c| c.segments.to_vec())
            .collect(),
        reply_chunk: hdr.chunks.reply().map(|c| c.segments.to_vec()),
    })
}

/// An accepted, successful RPC reply header for `xid` (RFC 5531: XID,
/// REPLY, MSG_ACCEPTED, AUTH_NONE verifier, SUCCESS).
pub(crate) fn rpc_reply_header(xid: u32) -> Vec<u8> {
    let mut m = Vec::with_capacity(64);
    for w in [xid, 1, 0, 0, 0, 0] {
        m.extend_from_slice(&w.to_be_bytes());
    }
    m
}

/// An RPC call header for `xid` (RFC 5531, AUTH_NONE), program, version,
/// procedure.
pub(crate) fn rpc_call_header(xid: u32, prog: u32, vers: u32, proc_: u32) -> Vec<u8> {
    let mut m = Vec::with_capacity(64);
    for w in [xid, 0, 2, prog, vers, proc_, 0, 0, 0, 0] {
        m.extend_from_slice(&w.to_be_bytes());
    }
    m
}

/// Emits `hdr` followed by `message`.
pub(crate) fn with_header(hdr: &TransportHeader, message: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; hdr.buffer_len()];
    let n = hdr.emit(&mut out).unwrap_or(0);
    out.truncate(n);
    out.extend_from_slice(message);
    out
}

/// Where the peer writes into a segment the engine advertised: through
/// the engine's exposure bookkeeping, or with key windows through the keys
/// the peer saw bound (as a provider checks them).
pub(crate) fn resolve(
    c: &Connection,
    live: Option<&HashMap<u32, (LocalSlice, Access)>>,
    seg: &Segment,
    want: Access,
) -> Option<LocalSlice> {
    let t = c.buffers();
    let Some(keys) = live else {
        return t.resolve(seg, want);
    };
    let &(local, access) = keys.get(&seg.handle)?;
    let start = t.remote_key(local.buf).1 + u64::from(local.offset);
    let off = seg.offset.checked_sub(start)?;
    if access != want || off + u64::from(seg.length) > u64::from(local.len) {
        return None;
    }
    Some(LocalSlice {
        buf: local.buf,
        offset: local.offset + off as u32,
        len: seg.length,
    })
}

/// The requests the peer makes of the engine and the replies it builds:
/// the part of the model both fuzz targets share. `peer_mem` is the fake
/// peer's registered memory.
pub(crate) struct PeerModel {
    pub(crate) peer_mem: Vec<u8>,
    pub(crate) calls_seen: VecDeque<SeenCall>,
    pub(crate) exposed: VecDeque<SeenExposed>,
    pub(crate) incoming: VecDeque<(IncomingCall, u32)>,
    pub(crate) replies: VecDeque<CallHandle>,
    pub(crate) next_call_xid: u32,
    pub(crate) next_peer_xid: u32,
}

impl PeerModel {
    pub(crate) fn new() -> PeerModel {
        PeerModel {
            peer_mem: vec![0u8; PEER_MEM],
            calls_seen: VecDeque::new(),
            exposed: VecDeque::new(),
            incoming: VecDeque::new(),
            replies: VecDeque::new(),
            next_call_xid: 1,
            next_peer_xid: 0x1000,
        }
    }

    /// Notes what a Send of the engine told the peer.
    pub(crate) fn saw_send(&mut self, bytes: &[u8]) {
        match see_send(bytes, 1..self.next_call_xid) {
            Seen::Call(c) => {
                if self.calls_seen.len() == 8 {
                    self.calls_seen.pop_front();
                }
                self.calls_seen.push_back(c);
            }
            Seen::Exposed(e) => {
                if self.exposed.len() == 8 {
                    self.exposed.pop_front();
                }
                self.exposed.push_back(e);
            }
            Seen::Other => {}
        }
    }

    /// Copies `len` bytes of the peer's memory at `addr` (wrapping), for
    /// an RDMA Read of the engine.
    pub(crate) fn read_peer(&self, addr: u64, len: usize) -> Vec<u8> {
        let start = (addr % PEER_MEM as u64) as usize;
        (0..len)
            .map(|i| self.peer_mem[(start + i) % PEER_MEM])
            .collect()
    }

    /// Writes `bytes` into the peer's memory at `addr` (wrapping).
    pub(crate) fn write_peer(&mut self, addr: u64, bytes: &[u8]) {
        let start = (addr % PEER_MEM as u64) as usize;
        for (i, b) in bytes.iter().enumerate() {
            self.peer_mem[(start + i) % PEER_MEM] = *b;
        }
    }

    /// Records an engine event; calls and replies stay for later ops.
    pub(crate) fn on_event(&mut self, c: &Connection, ev: &Event) {
        match *ev {
            Event::CallArrived { call, xid, .. } => {
                // Reading the call is part of what an application does.
                let _ = c.call_message(call).map(<[u8]>::len);
                self.incoming.push_back((call, xid));
            }
            Event::ReplyArrived { call, .. } => {
                if let Some(m) = c.reply_message(call) {
                    let _ = m.to_vec();
                }
                if let Some(d) = c.reply_ddp(call) {
                    let _ = d.to_vec();
                }
                self.replies.push_back(call);
            }
            _ => {}
        }
    }

    /// A call of the engine, of a shape chosen by `shape`: message size
    /// (inline, or long enough for a read chunk), a DDP argument, a write
    /// chunk for the result, a reply chunk.
    pub(crate) fn engine_call(&mut self, c: &mut Connection, now: Instant, shape: u8) {
        let len = [40usize, 900, 9000, 30_000][usize::from(shape & 3)];
        let xid = self.next_call_xid;
        self.next_call_xid = self.next_call_xid.wrapping_add(1);
        let mut msg = rpc_call_header(xid, 100_003, 3, 6);
        let ddp_off = msg.len() as u32 + 4;
        msg.extend_from_slice(&(len as u32).to_be_bytes());
        msg.resize(msg.len() + len.next_multiple_of(4), 0xab);
        let ddp = (shape & 4 != 0).then_some(DdpItem {
            offset: ddp_off,
            len: len as u32,
        });
        // Once message continuation is in use, a long reply fits the
        // receives the targets' groups may reserve (4 transmissions).
        let long_reply = if c.negotiated().contains(Extensions::MESSAGE_CONTINUATION) {
            12 * 1024
        } else {
            60 * 1024
        };
        let reply = ReplyExpect {
            max_len: if shape & 8 != 0 { long_reply } else { 1024 },
            ddp_max: (shape & 16 != 0).then_some(32 * 1024),
        };
        let _ = c.send_call(
            now,
            &OutgoingCall {
                message: &msg,
                ddp,
                reply,
                app: AppChunks::NONE,
            },
        );
    }

    /// The peer's reply to one of the engine's calls: `kind` picks the
    /// message type and how the chunks the call offered are used; the
    /// result bytes are written into the engine's memory through its keys
    /// first, as the peer's RDMA Writes would be, or placed in the peer's
    /// memory for a reply read chunk.
    pub(crate) fn reply_to(
        &mut self,
        write: &mut dyn FnMut(&Segment, &[u8]),
        sel: u8,
        kind: u8,
        credits: u8,
        body: &[u8],
    ) -> Option<Vec<u8>> {
        let n = self.calls_seen.len();
        if n == 0 {
            return None;
        }
        let call = self.calls_seen[usize::from(sel) % n].clone();
        let mut rpc = rpc_reply_header(call.xid);
        rpc.extend_from_slice(body);
        rpc.resize(rpc.len().next_multiple_of(4), 0);
        let wire_credits = u32::from(credits & 7);
        let mut hdr = TransportHeader::new(call.xid, wire_credits, MessageBody::Msg);
        let mut inline = rpc.clone();
        match kind & 7 {
            // RDMA_MSG, the result in the first write chunk when offered.
            0 | 1 => {
                if let Some(chunk) = call.write_chunks.first().filter(|_| kind & 1 != 0) {
                    let data = body;
                    let segs = write_through(write, chunk, data);
                    let _ = hdr.chunks.push_write_chunk(&segs);
                    inline = rpc_reply_header(call.xid);
                    inline.extend_from_slice(&(data.len() as u32).to_be_bytes());
                }
            }
            // RDMA_NOMSG: the whole reply through the reply chunk.
            2 => {
                hdr.body = MessageBody::NoMsg;
                // Without a reply chunk offered, a reply with nowhere to
                // be (MalformedReply).
                if let Some(chunk) = &call.reply_chunk {
                    let segs = write_through(write, chunk, &rpc);
                    hdr.chunks.set_reply(&segs);
                }
                inline.clear();
            }
            // RDMA_MSGP (retired; the engine refuses or unpads it).
            3 => {
                hdr.body = MessageBody::MsgP {
                    align: 4 << (credits & 3),
                    thresh: u32::from(body.first().copied().unwrap_or(0)),
                };
            }
            // RDMA_ERROR of each kind.
            4 => {
                hdr.body = MessageBody::Error(ErrorBody::Vers { low: 2, high: 3 });
                inline.clear();
            }
            5 => {
                hdr.body = MessageBody::Error(if credits & 1 == 0 {
                    ErrorBody::Chunk
                } else {
                    ErrorBody::Other {
                        code: 7,
                        extra: [0; 8],
                    }
                });
                inline.clear();
            }
            // A reply read chunk (responder-provided, draft-lever s4.1):
            // the reply waits in the peer's memory for the engine's Reads.
            6 => {
                hdr.body = MessageBody::NoMsg;
                let addr = u64::from(sel) * 4096;
                self.write_peer(addr, &rpc);
                // The high bit of `credits`: the chunk claims more than
                // the engine may take (ReplyTooLarge).
                let claim = if credits & 0x80 != 0 { 0x10_0000 } else { 0 };
                hdr.chunks.push_read(ReadSegment {
                    position: 0,
                    segment: Segment {
                        handle: PEER_KEY,
                        length: rpc.len() as u32 + claim,
                        offset: addr,
                    },
                });
                inline.clear();
            }
            // The reply chunk used although the reply is inline too.
            _ => {
                if let Some(chunk) = &call.reply_chunk {
                    let segs = write_through(write, chunk, &rpc);
                    hdr.chunks.set_reply(&segs);
                }
            }
        }
        Some(with_header(&hdr, &inline))
    }

    /// A call of the peer to the engine: `shape` picks a read chunk
    /// (position zero, or the argument at its XDR position), write chunks,
    /// a reply chunk, the CONF_RDMA program. Read chunk data waits in the
    /// peer's memory.
    pub(crate) fn peer_call(&mut self, shape: u8, proc_: u8, body: &[u8]) -> Vec<u8> {
        let xid = self.next_peer_xid;
        self.next_peer_xid = self.next_peer_xid.wrapping_add(1);
        let prog = if shape & 0x80 != 0 { 100_417 } else { 100_003 };
        let mut rpc = rpc_call_header(xid, prog, if prog == 100_417 { 1 } else { 3 }, 0);
        rpc[20..24].copy_from_slice(&u32::from(proc_ & 31).to_be_bytes());
        let arg_pos = rpc.len() as u32 + 4;
        rpc.extend_from_slice(&(body.len() as u32).to_be_bytes());
        let mut data = body.to_vec();
        data.resize(data.len().next_multiple_of(4), 0);
        let mut hdr = TransportHeader::new(xid, 4, MessageBody::Msg);
        let addr = u64::from(xid & 7) * 8192;
        let inline = match shape & 3 {
            // Inline.
            0 => {
                rpc.extend_from_slice(&data);
                rpc
            }
            // The argument in a read chunk at its position.
            1 => {
                self.write_peer(addr, &data);
                for (i, part) in [0usize, 1].iter().enumerate() {
                    let half = data.len().div_ceil(2).next_multiple_of(4);
                    let (from, to) = if *part == 0 {
                        (0, half.min(data.len()))
                    } else {
                        (half.min(data.len()), data.len())
                    };
                    if to > from || i == 0 {
                        hdr.chunks.push_read(ReadSegment {
                            position: arg_pos,
                            segment: Segment {
                                handle: PEER_KEY,
                                length: (to - from) as u32,
                                offset: addr + from as u64,
                            },
                        });
                    }
                }
                rpc
            }
            // The whole call in a position-zero read chunk (RDMA_NOMSG).
            2 => {
                rpc.extend_from_slice(&data);
                self.write_peer(addr, &rpc);
                hdr.body = MessageBody::NoMsg;
                hdr.chunks.push_read(ReadSegment {
                    position: 0,
                    segment: Segment {
                        handle: PEER_KEY,
                        length: rpc.len() as u32,
                        offset: addr,
                    },
                });
                Vec::new()
            }
            // RDMA_MSGP with padding fields (retired by RFC 8166).
            _ => {
                hdr.body = MessageBody::MsgP {
                    align: 64,
                    thresh: 32,
                };
                rpc.extend_from_slice(&data);
                rpc
            }
        };
        for w in 0..(shape >> 2 & 3) {
            let seg = Segment {
                handle: PEER_KEY,
                length: 4096 << (w * 3),
                offset: 0x8000 + u64::from(w) * 0x1000,
            };
            let _ = hdr.chunks.push_write_chunk(&[seg]);
        }
        if shape & 0x10 != 0 {
            hdr.chunks.set_reply(&[
                Segment {
                    handle: PEER_KEY,
                    length: 16 * 1024,
                    offset: 0,
                },
                Segment {
                    handle: PEER_KEY,
                    length: 48 * 1024,
                    offset: 0x4000,
                },
            ]);
        }
        if shape & 0x20 != 0 {
            hdr.credits = 64;
        }
        if shape & 0x40 != 0 && hdr.body == MessageBody::Msg {
            // A made-up message type: answered ERR_CHUNK.
            let mut raw = with_header(&TransportHeader::new(xid, 4, MessageBody::Done), &inline);
            raw[12..16].copy_from_slice(&9u32.to_be_bytes());
            return raw;
        }
        with_header(&hdr, &inline)
    }

    /// The engine's answer to a call of the peer: `shape` picks its size
    /// (inline, reply chunk or exposed, too large) and up to two DDP
    /// items. Marks in `cov` whether the engine took it, and with DDP.
    pub(crate) fn answer(
        &mut self,
        c: &mut Connection,
        now: Instant,
        sel: u8,
        shape: u8,
        cov: &mut Coverage,
    ) {
        let n = self.incoming.len();
        if n == 0 {
            return;
        }
        let (call, xid) = if shape & 0x80 != 0 {
            // An answer to a call already answered (or never delivered).
            self.incoming[usize::from(sel) % n]
        } else {
            match self.incoming.remove(usize::from(sel) % n) {
                Some(x) => x,
                None => return,
            }
        };
        let len = [16usize, 2000, 9000, 40_000][usize::from(shape & 3)];
        let mut msg = rpc_reply_header(if shape & 0x40 != 0 { xid ^ 1 } else { xid });
        let mut ddp = Vec::new();
        for i in 0..(shape >> 2 & 3).min(2) {
            let item_len = [len, 8192, 100][usize::from(i + (shape >> 4 & 1))];
            msg.extend_from_slice(&(item_len as u32).to_be_bytes());
            ddp.push(DdpItem {
                offset: msg.len() as u32,
                len: item_len as u32,
            });
            msg.resize(msg.len() + item_len.next_multiple_of(4), 0xcd);
        }
        if ddp.is_empty() {
            msg.resize(msg.len() + len, 0);
        }
        let r = c.send_reply(
            now,
            call,
            &OutgoingReply {
                message: &msg,
                ddp: &ddp,
            },
        );
        if r.is_ok() {
            cov.set(label!("reply sent"));
            if !ddp.is_empty() {
                cov.set(label!("reply sent with DDP"));
            }
        }
    }

    /// RDMA_DONE for a reply the engine exposed (or for any XID).
    pub(crate) fn done(&mut self, sel: u8) -> (Vec<u8>, Option<u32>) {
        let n = self.exposed.len();
        let (xid, rkey) = if n == 0 {
            (u32::from(sel), None)
        } else {
            let e = self.exposed[usize::from(sel) % n];
            (e.xid, Some(e.rkey))
        };
        let hdr = TransportHeader::new(xid, 0, MessageBody::Done);
        (with_header(&hdr, &[]), rkey)
    }
}

/// Writes `data` across the segments of `chunk` with the peer's RDMA
/// Writes (`write`; each segment filled in order, the rest of the data
/// dropped) and returns the segments as the reply echoes them: the bytes
/// written to each.
fn write_through(
    write: &mut dyn FnMut(&Segment, &[u8]),
    chunk: &[Segment],
    data: &[u8],
) -> Vec<Segment> {
    let mut rest = data;
    let mut out = Vec::with_capacity(chunk.len());
    for seg in chunk {
        let n = rest.len().min(seg.length as usize);
        let (now, later) = rest.split_at(n);
        rest = later;
        let used = Segment {
            length: n as u32,
            ..*seg
        };
        write(&used, now);
        out.push(used);
    }
    out
}

/// Regions kept from one input to the next, by length: building a
/// connection's slab afresh for every input (a megabyte, allocated,
/// zeroed and unmapped under AddressSanitizer) cost most of an input's
/// time. Each is handed out zeroed and exactly as long as the connection
/// asks, so the engine sees what [`Connection::new`] would give it and
/// AddressSanitizer still catches an access past either region's end.
#[derive(Default)]
struct Spare {
    private: HashMap<usize, Vec<u8>>,
    peer: HashMap<usize, Box<[u8]>>,
}

thread_local! {
    static SPARE: core::cell::RefCell<Spare> = core::cell::RefCell::default();
}

/// A private region taken from [`SPARE`]; it goes back there on drop.
#[derive(Debug)]
struct SparePrivate(Vec<u8>);

impl SlabMemory for SparePrivate {
    fn bytes(&self) -> &[u8] {
        &self.0
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }
}

impl Drop for SparePrivate {
    fn drop(&mut self) {
        let v = core::mem::take(&mut self.0);
        let _ = SPARE.try_with(|s| s.borrow_mut().private.insert(v.len(), v));
    }
}

/// A peer region taken from [`SPARE`] (held as a raw pointer, as the
/// engine requires of memory a peer writes); it goes back there on drop.
#[derive(Debug)]
struct SparePeer {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the region is owned by this value alone (raw pointer to a
// leaked boxed slice); moving it to another thread moves that ownership.
unsafe impl Send for SparePeer {}

// SAFETY: a boxed slice of `len` bytes, leaked, so mapped until it is
// reclaimed in drop; no reference to it exists while this value lives.
unsafe impl PeerMemory for SparePeer {
    fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
}

impl Drop for SparePeer {
    fn drop(&mut self) {
        // SAFETY: made by Box::into_raw of a boxed slice of `len` bytes.
        let b = unsafe { Box::from_raw(core::ptr::slice_from_raw_parts_mut(self.ptr, self.len)) };
        let _ = SPARE.try_with(|s| s.borrow_mut().peer.insert(b.len(), b));
    }
}

/// [`Connection::new`] over zeroed regions from [`SPARE`].
fn reused_connection(cfg: Config) -> Result<Connection, super::ConfigError> {
    let need = Connection::memory_len(&cfg)?;
    let (private, peer) = SPARE.with(|s| {
        let mut s = s.borrow_mut();
        let mut private = s.private.remove(&need.private).unwrap_or_default();
        private.clear();
        private.reserve_exact(need.private);
        private.resize(need.private, 0);
        let mut peer = s
            .peer
            .remove(&need.peer)
            .unwrap_or_else(|| vec![0u8; need.peer].into_boxed_slice());
        peer.fill(0);
        (private, peer)
    });
    let len = peer.len();
    let peer = SparePeer {
        ptr: Box::into_raw(peer).cast::<u8>(),
        len,
    };
    Connection::with_memory(cfg, Box::new(SparePrivate(private)), Box::new(peer))
}

/// Feeds `data` to one [`Connection`] as everything its peer and its
/// provider do, then closes it and checks that every resource came back.
///
/// Input: one configuration byte (bit 0 responder-provided read chunks,
/// 1 key windows, 2 the peer accepts remote invalidation, 3 the engine
/// answers CONF_RDMA, 4 a grant of one credit, 5 one RDMA Read at a time,
/// 6 an idle timeout, 7 1 KiB inline thresholds), then operations, each a
/// control byte whose low four bits pick it (see [`Op`]) and whose high
/// four bits are its parameter, followed by its arguments.
///
/// Before the input the engine has sent three calls of different shapes,
/// so replies can match them (the peer learns their XIDs and chunks from
/// the Sends, as a real peer does).
///
/// # Panics
/// Only when an engine invariant breaks (resources not returned after the
/// close), or on a panic inside the engine (the bug being looked for).
pub fn fuzz_recv(data: &[u8]) -> Coverage {
    let mut input = Input(data);
    let flags = input.byte().unwrap_or(0);
    let mut cov = Coverage::default();
    let small = flags & 0x80 != 0;
    let cfg = Config {
        inline_recv_size: if small { 1024 } else { 4096 },
        inline_send_size: if small { 1024 } else { 4096 },
        peer_inline_recv_size: if small { 1024 } else { 4096 },
        peer_inline_send_size: if small { 1024 } else { 4096 },
        peer_remote_invalidate: flags & 4 != 0,
        credits: if flags & 16 != 0 { 1 } else { 4 },
        max_outstanding_calls: 4,
        max_call_size: 64 * 1024,
        max_reply_size: 64 * 1024,
        max_ddp_size: 64 * 1024,
        max_rdma_read: if flags & 32 != 0 { 1 } else { 4 },
        serve_conf_rdma: flags & 8 != 0,
        reply_read_chunks: flags & 1 != 0,
        // A peer's CONF_RDMA version 2 call may turn message
        // continuation on (only where the engine answers CONF_RDMA, so
        // that inputs without it build the same connection as before).
        extensions: continuation_if(flags & 8 != 0),
        max_group_transmissions: 4,
        continuation_receives: 4,
        max_reply_read_chunks: 2,
        call_timeout: Some(core::time::Duration::from_micros(500)),
        done_timeout: core::time::Duration::from_micros(700),
        idle_timeout: (flags & 64 != 0).then_some(core::time::Duration::from_millis(3)),
        ..Config::default()
    };
    let Ok(mut c) = reused_connection(cfg) else {
        return cov;
    };
    let windows = flags & 2 != 0;
    let mut h = Harness {
        now: Instant::ZERO,
        recvs: VecDeque::new(),
        posted: Vec::new(),
        history: VecDeque::new(),
        live: windows.then(HashMap::new),
        peer: PeerModel::new(),
    };
    // Distinct rkeys per buffer, as a provider without windows hands out.
    let t = c.buffers_mut();
    for i in 0..t.count() as u32 {
        let addr = 0x7f00_0000_0000 + t.slab_offset(BufId(i)) as u64;
        t.set_remote_key(BufId(i), i.wrapping_mul(0x9e37_79b9) | 1, addr);
    }
    if windows {
        // With small inline thresholds too: a single window, so exposures
        // run out (NoKeyWindow) as on a device short of windows.
        let n = if small { 1 } else { c.max_exposures() as u32 };
        let w: Vec<crate::verbs::Window> = (0..n)
            .map(|i| crate::verbs::Window::new(i, i + 1, 0xffff_f000))
            .collect();
        c.set_key_windows(&w);
    }
    if flags & 64 != 0 {
        c.start_idle_clock(h.now);
    }
    for shape in [0u8, 4 | 2, 16 | 8 | 3] {
        h.peer.engine_call(&mut c, h.now, shape);
    }
    h.drain(&mut c, &mut cov);

    while let Some(ctl) = input.byte() {
        if h.step(&mut c, ctl, &mut input, &mut cov).is_none() {
            break;
        }
        while let Some(ev) = c.poll_event() {
            cov.event(&ev);
            h.peer.on_event(&c, &ev);
        }
        h.drain(&mut c, &mut cov);
        cov.sample(&c);
    }
    cov.stats(&c);

    // Tear down like a provider whose queue pair failed: flush everything.
    for call in h.peer.replies.drain(..) {
        c.release_reply(call);
    }
    c.close();
    cov.sample(&c);
    h.drain(&mut c, &mut cov);
    for (id, _) in h.recvs.drain(..) {
        c.handle_completion(h.now, id, WcStatus::Flushed);
    }
    for wr in std::mem::take(&mut h.posted) {
        c.handle_completion(h.now, wr.wr_id(), WcStatus::Flushed);
    }
    while let Some(ev) = c.poll_event() {
        cov.event(&ev);
        if let Event::ReplyArrived { call, .. } = ev {
            c.release_reply(call);
        }
    }
    h.drain(&mut c, &mut cov);
    for wr in std::mem::take(&mut h.posted) {
        c.handle_completion(h.now, wr.wr_id(), WcStatus::Flushed);
    }
    cov.sample(&c);
    let r = c.resources();
    assert!(r.is_idle(), "leak: {r:?}");
    cov
}

/// The operations of [`fuzz_recv`], by the low four bits of a control
/// byte.
#[derive(Debug, Clone, Copy)]
enum Op {
    /// A raw message: `u16` length, bytes.
    Raw,
    /// Complete posted work request number `byte` (any order) with the
    /// status of the parameter; a successful Read lands the peer's memory.
    Complete,
    /// A stale completion: an id completed before (parameter even) or an
    /// arbitrary `u64` id, with the status byte.
    Stale,
    /// A reply to one of the engine's calls: call `byte`, kind `byte`,
    /// credits `byte`, `u16` length, result bytes.
    Reply,
    /// A call of the peer: shape `byte`, procedure `byte`, `u16` length,
    /// argument bytes.
    Call,
    /// The engine answers call `byte` of the peer with shape `byte`.
    Answer,
    /// Time passes: the parameter times 150 µs.
    Time,
    /// The application releases reply `byte`.
    Release,
    /// The engine makes a call of shape `byte`.
    EngineCall,
    /// The peer writes into the engine's peer memory: buffer `byte`,
    /// `u16` offset, length `byte`, bytes (what a peer holding a key may
    /// do at any moment).
    Scribble,
    /// The peer changes its own memory: `u16` address, length `byte`, bytes.
    PeerMemory,
    /// RDMA_DONE for exposed reply `byte` (Send With Invalidate of its
    /// key when the parameter is odd).
    Done,
    /// The oldest receive completes with the parameter's status, or
    /// (success) a length beyond its buffer.
    RecvError,
    /// The peer disconnects (parameter even) or the queue pair fails.
    Disconnect,
    /// Every posted work request completes successfully, oldest first
    /// (the parameter's low bit: newest first).
    CompleteAll,
    /// A raw message delivered as Send With Invalidate of `u32` key:
    /// `u32`, `u16` length, bytes.
    RawInvalidate,
}

const OPS: [Op; 16] = [
    Op::Raw,
    Op::Complete,
    Op::Stale,
    Op::Reply,
    Op::Call,
    Op::Answer,
    Op::Time,
    Op::Release,
    Op::EngineCall,
    Op::Scribble,
    Op::PeerMemory,
    Op::Done,
    Op::RecvError,
    Op::Disconnect,
    Op::CompleteAll,
    Op::RawInvalidate,
];

struct Harness {
    now: Instant,
    recvs: VecDeque<(WrId, BufId)>,
    /// Posted non-receive work requests, oldest first.
    posted: Vec<WorkRequest>,
    /// Ids completed earlier, replayed as stale completions.
    history: VecDeque<WrId>,
    /// With key windows: the keys bound, as the provider would hold them.
    live: Option<HashMap<u32, (LocalSlice, Access)>>,
    peer: PeerModel,
}

impl Harness {
    fn drain(&mut self, c: &mut Connection, cov: &mut Coverage) {
        while let Some(wr) = c.poll_transmit() {
            cov.work_request(&wr);
            match wr {
                WorkRequest::PostRecv { wr_id, buf } => {
                    self.recvs.push_back((wr_id, buf));
                    continue;
                }
                WorkRequest::Send { local, gather, .. } => {
                    let bufs = c.buffers();
                    if let Some(mut bytes) = bufs.to_vec(local) {
                        if let Some(more) = gather.and_then(|g| bufs.to_vec(g)) {
                            bytes.extend_from_slice(&more);
                        }
                        self.peer.saw_send(&bytes);
                    }
                }
                WorkRequest::Bind {
                    rkey,
                    local,
                    access,
                    ..
                } => {
                    if let Some(k) = &mut self.live {
                        k.insert(rkey, (local, access));
                    }
                }
                WorkRequest::Invalidate { rkey, .. } => {
                    if let Some(k) = &mut self.live {
                        k.remove(&rkey);
                    }
                }
                WorkRequest::RdmaRead { .. } | WorkRequest::RdmaWrite { .. } => {}
            }
            self.posted.push(wr);
        }
    }

    fn remember(&mut self, id: WrId) {
        if self.history.len() == 16 {
            self.history.pop_front();
        }
        self.history.push_back(id);
    }

    /// Completes `wr` with `status`; a successful Read first lands the
    /// bytes of the peer's memory it names in the engine's buffer.
    fn complete(&mut self, c: &mut Connection, wr: WorkRequest, status: WcStatus) {
        if let (WorkRequest::RdmaRead { local, remote, .. }, WcStatus::Success) = (wr, status) {
            let bytes = self.peer.read_peer(remote.offset, local.len as usize);
            c.buffers_mut()
                .write(local.buf, local.offset as usize, &bytes);
        }
        if let WorkRequest::RdmaWrite { local, remote, .. } = wr {
            if let Some(bytes) = c.buffers().to_vec(local) {
                self.peer.write_peer(remote.offset, &bytes);
            }
        }
        self.remember(wr.wr_id());
        c.handle_completion(self.now, wr.wr_id(), status);
    }

    /// Delivers `msg` in the oldest posted receive; its length is
    /// reported even when it exceeds the buffer (a provider bug the engine
    /// must survive).
    fn deliver(&mut self, c: &mut Connection, msg: &[u8], invalidated: Option<u32>) {
        let Some((id, buf)) = self.recvs.pop_front() else {
            return;
        };
        let room = c.buffers().buf_len(buf) as usize;
        c.buffers_mut().write(buf, 0, &msg[..msg.len().min(room)]);
        self.remember(id);
        match invalidated {
            Some(rkey) => {
                if let Some(k) = &mut self.live {
                    k.remove(&rkey);
                }
                c.handle_recv_invalidating(self.now, id, msg.len() as u32, Some(rkey));
            }
            None => c.handle_recv(self.now, id, msg.len() as u32),
        }
    }

    fn step(
        &mut self,
        c: &mut Connection,
        ctl: u8,
        input: &mut Input<'_>,
        cov: &mut Coverage,
    ) -> Option<()> {
        let param = ctl >> 4;
        match OPS[usize::from(ctl & 15)] {
            Op::Raw => {
                let n = input.u16()?;
                let msg = input.take(usize::from(n));
                self.deliver(c, msg, None);
            }
            Op::Complete => {
                let i = usize::from(input.byte()?);
                if !self.posted.is_empty() {
                    let wr = self.posted.remove(i % self.posted.len());
                    let status = status_of(param);
                    if status != WcStatus::Success {
                        cov.mark(label!("completion: error status"));
                    }
                    self.complete(c, wr, status);
                }
            }
            Op::Stale => {
                let status = status_of(input.byte()?);
                let id = if param & 1 == 0 && !self.history.is_empty() {
                    Some(self.history[usize::from(param >> 1) % self.history.len()])
                } else {
                    WrId::from_u64(input.u64()?)
                };
                if let Some(id) = id {
                    c.handle_completion(self.now, id, status);
                }
            }
            Op::Reply => {
                let (sel, kind, credits) = (input.byte()?, input.byte()?, input.byte()?);
                let n = input.u16()?;
                let body = input.take(usize::from(n));
                let live = self.live.as_ref();
                let mut write = |seg: &Segment, bytes: &[u8]| {
                    if let Some(local) = resolve(c, live, seg, Access::RemoteWrite) {
                        c.buffers_mut()
                            .write(local.buf, local.offset as usize, bytes);
                    }
                };
                if let Some(msg) = self.peer.reply_to(&mut write, sel, kind, credits, body) {
                    self.deliver(c, &msg, None);
                }
            }
            Op::Call => {
                let (shape, proc_) = (input.byte()?, input.byte()?);
                let n = input.u16()?;
                let body = input.take(usize::from(n));
                let msg = self.peer.peer_call(shape, proc_, body);
                self.deliver(c, &msg, None);
            }
            Op::Answer => {
                let (sel, shape) = (input.byte()?, input.byte()?);
                self.peer.answer(c, self.now, sel, shape, cov);
            }
            Op::Time => {
                self.now = self
                    .now
                    .saturating_add(core::time::Duration::from_micros(u64::from(param) * 150));
                if c.poll_timeout().is_some_and(|t| t <= self.now) {
                    c.handle_timeout(self.now);
                }
            }
            Op::Release => {
                let sel = usize::from(input.byte()?);
                let n = self.peer.replies.len();
                if n > 0 {
                    if let Some(call) = self.peer.replies.remove(sel % n) {
                        c.release_reply(call);
                    }
                }
            }
            Op::EngineCall => {
                let shape = input.byte()?;
                self.peer.engine_call(c, self.now, shape);
            }
            Op::Scribble => {
                let sel = usize::from(input.byte()?);
                let off = usize::from(input.u16()?);
                let n = usize::from(input.byte()?);
                let bytes = input.take(n);
                let t = c.buffers();
                let peer_bufs: Vec<BufId> = (0..t.count() as u32)
                    .map(BufId)
                    .filter(|&b| t.memory(b) == Memory::Peer)
                    .collect();
                if !peer_bufs.is_empty() {
                    let buf = peer_bufs[sel % peer_bufs.len()];
                    let len = t.buf_len(buf) as usize;
                    let at = off % len.max(1);
                    let n = bytes.len().min(len - at);
                    c.buffers_mut().write(buf, at, &bytes[..n]);
                }
            }
            Op::PeerMemory => {
                let addr = u64::from(input.u16()?);
                let n = usize::from(input.byte()?);
                let bytes = input.take(n);
                self.peer.write_peer(addr, bytes);
            }
            Op::Done => {
                let sel = input.byte()?;
                let (msg, rkey) = self.peer.done(sel);
                let inval = rkey.filter(|_| param & 1 != 0);
                self.deliver(c, &msg, inval);
            }
            Op::RecvError => {
                if let Some((id, buf)) = self.recvs.pop_front() {
                    let status = status_of(param);
                    self.remember(id);
                    if status == WcStatus::Success {
                        let len = c.buffers().buf_len(buf) + 1 + u32::from(param);
                        c.handle_recv(self.now, id, len);
                    } else {
                        cov.mark(label!("completion: error status"));
                        c.handle_completion(self.now, id, status);
                    }
                }
            }
            Op::Disconnect => {
                if param & 1 == 0 {
                    c.handle_peer_disconnect();
                } else {
                    c.handle_queue_pair_failure();
                }
            }
            Op::CompleteAll => {
                let mut all = std::mem::take(&mut self.posted);
                if param & 1 != 0 {
                    all.reverse();
                }
                for wr in all {
                    self.complete(c, wr, WcStatus::Success);
                }
            }
            Op::RawInvalidate => {
                let rkey = input.u32()?;
                let n = input.u16()?;
                let msg = input.take(usize::from(n));
                self.deliver(c, msg, Some(rkey));
            }
        }
        Some(())
    }
}
