//! The slots' transition tables (`Connection::process_serve` for the
//! responder, `Connection::process_call` for the requester), row by row:
//! a connection driven by hand (this test is the peer and the provider),
//! the slot's state asserted after each event.

use core::time::Duration;
use std::collections::VecDeque;

use super::*;
use crate::engine::requester::CallState as C;
use crate::engine::responder::ServeState as S;
use crate::wire::conf::ConfigRdmaReq;
use crate::wire::rpcrdma::ReadSegment;

/// A server connection and what it asked the provider to do.
struct Server {
    c: Connection,
    now: Instant,
    /// Posted receives, oldest first.
    rq: VecDeque<(WrId, BufId)>,
    /// Posted work requests other than receives, not yet completed.
    posted: Vec<WorkRequest>,
}

/// The peer's rkey for read chunks the server pulls.
const RKEY: u32 = 0x0bad_cafe;

fn server_cfg() -> Config {
    Config {
        reply_read_chunks: true,
        done_timeout: Duration::from_millis(10),
        ..cfg()
    }
}

impl Server {
    /// An echo call of our own (the requester half) under `xid`, sent
    /// and its Send completed: its reply may now arrive.
    fn send_own_call(&mut self, xid: u32) {
        let (msg, _) = echo_call(xid, b"ours");
        let now = self.now;
        self.c
            .send_call(
                now,
                &OutgoingCall {
                    message: &msg,
                    ddp: None,
                    reply: expect(512, None),
                    app: AppChunks::NONE,
                },
            )
            .expect("send_call");
        self.collect();
        self.complete(WrKind::CallSend, WcStatus::Success, &[]);
    }

    fn new() -> Server {
        Server::with(server_cfg())
    }

    fn with(config: Config) -> Server {
        let mut s = Server {
            c: Connection::new(config).expect("config"),
            now: Instant(0),
            rq: VecDeque::new(),
            posted: Vec::new(),
        };
        s.collect();
        s
    }

    fn collect(&mut self) {
        while let Some(wr) = self.c.poll_transmit() {
            match wr {
                WorkRequest::PostRecv { wr_id, buf } => self.rq.push_back((wr_id, buf)),
                other => self.posted.push(other),
            }
        }
    }

    /// The peer sends `bytes`: it fills the oldest posted receive.
    fn recv(&mut self, bytes: &[u8]) {
        let (wr_id, buf) = self.rq.pop_front().expect("a receive posted");
        assert!(self.c.buffers_mut().write(buf, 0, bytes));
        self.c.handle_recv(self.now, wr_id, bytes.len() as u32);
        self.collect();
    }

    /// Completes the oldest posted request of `kind`; a Read first gets
    /// its data, `data[remote.offset..]`.
    fn complete(&mut self, kind: WrKind, status: WcStatus, data: &[u8]) -> WrId {
        let i = self
            .posted
            .iter()
            .position(|w| w.wr_id().kind == kind)
            .unwrap_or_else(|| panic!("no {kind:?} posted: {:?}", self.posted));
        let wr = self.posted.remove(i);
        if let (WorkRequest::RdmaRead { local, remote, .. }, WcStatus::Success) = (wr, status) {
            let at = remote.offset as usize;
            let src = &data[at..at + remote.length as usize];
            assert!(self
                .c
                .buffers_mut()
                .write(local.buf, local.offset as usize, src));
        }
        self.c.handle_completion(self.now, wr.wr_id(), status);
        self.collect();
        wr.wr_id()
    }

    /// Flushes every posted request, as a queue pair in the error state.
    fn flush(&mut self) {
        for wr in core::mem::take(&mut self.posted) {
            self.c
                .handle_completion(self.now, wr.wr_id(), WcStatus::Flushed);
        }
        self.collect();
    }

    fn state(&self, idx: usize) -> S {
        self.c.serves[idx].state
    }

    /// The slot serving `xid`.
    fn slot(&self, xid: u32) -> usize {
        (0..self.c.serves.len())
            .find(|&i| self.state(i) != S::Free && self.c.responder_slot_message(i).0 == xid)
            .expect("a busy slot for the xid")
    }

    fn call_arrived(&mut self) -> IncomingCall {
        while let Some(ev) = self.c.poll_event() {
            if let Event::CallArrived { call, .. } = ev {
                return call;
            }
        }
        panic!("no CallArrived");
    }
}

/// An inline RDMA_MSG echo call.
fn inline_call(xid: u32, data: &[u8]) -> Vec<u8> {
    raw_call(xid, 4, &echo_call(xid, data).0)
}

/// An RDMA_MSG echo call whose data goes in a read chunk of `segs`
/// segments (at offsets into the data); returns the Send and the data.
fn read_chunk_call(xid: u32, len: usize, segs: usize) -> (Vec<u8>, Vec<u8>) {
    let data = payload(len, xid as u8);
    let (msg, item) = echo_call(xid, &data);
    let (off, n) = (item.offset as usize, item.len as usize);
    let mut h = TransportHeader::new(xid, 4, MessageBody::Msg);
    let per = n / segs;
    for k in 0..segs {
        let length = if k + 1 == segs { n - per * k } else { per };
        h.chunks.push_read(ReadSegment {
            position: off as u32,
            segment: Segment {
                handle: RKEY,
                length: length as u32,
                offset: (per * k) as u64,
            },
        });
    }
    let mut v = vec![0u8; h.buffer_len()];
    h.emit(&mut v).unwrap();
    v.extend_from_slice(&msg[..off]);
    v.extend_from_slice(&msg[off + roundup4(n as u64) as usize..]);
    (v, data)
}

/// An RDMA_NOMSG whose whole RPC message (`rpc`) is in a position-zero
/// read chunk.
fn nomsg_call(xid: u32, rpc: &[u8]) -> Vec<u8> {
    nomsg_segments(xid, rpc.len(), 1)
}

/// An RDMA_NOMSG with a position-zero read chunk of `segs` segments over
/// `len` bytes (at offsets into them).
fn nomsg_segments(xid: u32, len: usize, segs: usize) -> Vec<u8> {
    let mut h = TransportHeader::new(xid, 4, MessageBody::NoMsg);
    let per = len / segs;
    for k in 0..segs {
        let length = if k + 1 == segs { len - per * k } else { per };
        h.chunks.push_read(ReadSegment {
            position: 0,
            segment: Segment {
                handle: RKEY,
                length: length as u32,
                offset: (per * k) as u64,
            },
        });
    }
    let mut v = vec![0u8; h.buffer_len()];
    h.emit(&mut v).unwrap();
    v
}

fn done(xid: u32) -> Vec<u8> {
    let h = TransportHeader::new(xid, 4, MessageBody::Done);
    let mut v = vec![0u8; h.buffer_len()];
    h.emit(&mut v).unwrap();
    v
}

/// Answers `call` (echo of `data`); `big` makes the reply too long for
/// the peer's inline size with no chunk offered: exposed in a read chunk.
fn reply(s: &mut Server, call: IncomingCall, xid: u32, big: bool) {
    let data = if big {
        payload(8 * KIB as usize, 3)
    } else {
        payload(16, 3)
    };
    let (msg, _) = echo_reply(xid, &data);
    let now = s.now;
    s.c.send_reply(
        now,
        call,
        &OutgoingReply {
            message: &msg,
            ddp: &[],
        },
    )
    .expect("send_reply");
    s.collect();
}

#[test]
fn process_serve_walks_every_row_of_the_transition_table() {
    // Free -CallAccepted, Reads listed-> PullingReadChunks
    // -ReadDone, Reads still due-> PullingReadChunks
    // -ReadDone, the last, ok (CallComplete, a call)-> Executing
    // -ReplyPosted-> AwaitingCompletions
    // -ReplyOpDone, the last-> Free
    let mut s = Server::new();
    let (m, data) = read_chunk_call(1, 3000, 2);
    s.recv(&m);
    let i = s.slot(1);
    assert_eq!(s.state(i), S::PullingReadChunks);
    s.complete(WrKind::ChunkRead, WcStatus::Success, &data);
    assert_eq!(s.state(i), S::PullingReadChunks);
    s.complete(WrKind::ChunkRead, WcStatus::Success, &data);
    assert_eq!(s.state(i), S::Executing);
    let call = s.call_arrived();
    assert_eq!(s.c.call_message(call).map(echo_payload), Some(Some(data)));
    reply(&mut s, call, 1, false);
    assert_eq!(s.state(i), S::AwaitingCompletions);
    // A stale completion (an earlier generation) changes nothing.
    let stale = s.c.stats().stale_completions;
    let send = s.posted[0].wr_id();
    let old = WrId {
        generation: send.generation.wrapping_sub(1),
        ..send
    };
    s.c.handle_completion(s.now, old, WcStatus::Success);
    assert_eq!(s.state(i), S::AwaitingCompletions);
    assert_eq!(s.c.stats().stale_completions, stale + 1);
    s.complete(WrKind::ReplySend, WcStatus::Success, &[]);
    assert_eq!(s.state(i), S::Free);
    // The same completion again: stale, the slot stays free.
    s.c.handle_completion(s.now, send, WcStatus::Success);
    assert_eq!(s.state(i), S::Free);
    assert_eq!(s.c.stats().stale_completions, stale + 2);

    // Free -CallAccepted, no Reads (CallComplete, a call)-> Executing
    // -ReplyPosted, exposed-> AwaitingCompletions
    // -ReplyOpDone, the last, exposed-> AwaitingDone
    // -DoneArrived-> Free
    s.recv(&inline_call(2, b"inline"));
    let i = s.slot(2);
    assert_eq!(s.state(i), S::Executing);
    let call = s.call_arrived();
    reply(&mut s, call, 2, true);
    assert_eq!(s.state(i), S::AwaitingCompletions);
    assert_eq!(s.c.stats().replies_exposed, 1);
    s.complete(WrKind::ReplySend, WcStatus::Success, &[]);
    assert_eq!(s.state(i), S::AwaitingDone);
    s.recv(&done(2));
    assert_eq!(s.state(i), S::Free);
    assert_eq!(s.c.stats().done_received, 1);

    // AwaitingCompletions -DoneArrived-> AwaitingCompletions (withdrawn)
    // -ReplyOpDone, the last-> Free
    s.recv(&inline_call(3, b"early done"));
    let i = s.slot(3);
    let call = s.call_arrived();
    reply(&mut s, call, 3, true);
    assert_eq!(s.state(i), S::AwaitingCompletions);
    s.recv(&done(3));
    assert_eq!(s.state(i), S::AwaitingCompletions);
    assert_eq!(s.c.resources().buffers_exposed, 0);
    s.complete(WrKind::ReplySend, WcStatus::Success, &[]);
    assert_eq!(s.state(i), S::Free);

    // AwaitingDone -DoneTimeout-> Free
    s.recv(&inline_call(4, b"no done"));
    let i = s.slot(4);
    let call = s.call_arrived();
    reply(&mut s, call, 4, true);
    s.complete(WrKind::ReplySend, WcStatus::Success, &[]);
    assert_eq!(s.state(i), S::AwaitingDone);
    s.now = s.c.poll_timeout().expect("the reclaim timer");
    let now = s.now;
    s.c.handle_timeout(now);
    assert_eq!(s.state(i), S::Free);
    assert_eq!(s.c.stats().done_timeouts, 1);

    // CallComplete, not a call with the header's XID -> Free, ERR_CHUNK
    let (rpc, _) = echo_call(0x55, b"other xid");
    s.recv(&nomsg_call(5, &rpc));
    let i = s.slot(5);
    assert_eq!(s.state(i), S::PullingReadChunks);
    s.complete(WrKind::ChunkRead, WcStatus::Success, &rpc);
    assert_eq!(s.state(i), S::Free);
    let err = s
        .posted
        .iter()
        .find_map(|w| match *w {
            WorkRequest::Send { wr_id, local, .. } if wr_id.kind == WrKind::ErrorSend => Some(
                header(&s.c.buffers().bytes(local.buf)[..local.len as usize]),
            ),
            _ => None,
        })
        .expect("ERR_CHUNK");
    assert_eq!(
        (err.xid, err.body),
        (5, MessageBody::Error(ErrorBody::Chunk))
    );

    // CallComplete, CONF_RDMA served by the engine -> Executing, then
    // ReplyPosted -> AwaitingCompletions
    let mut buf = [0u8; 64];
    let req = ConfigRdmaReq {
        maxcall_sendsize: 4 * KIB,
        maxreply_sendsize: 4 * KIB,
        maxrdmaread: 4,
    };
    let n = encode_conf_rdma_call(&mut buf, 6, &req).unwrap();
    s.recv(&raw_call(6, 4, &buf[..n]));
    let i = s.slot(6);
    assert_eq!(s.state(i), S::AwaitingCompletions);
    assert_eq!(s.c.stats().conf_rdma_answered, 1);
    s.complete(WrKind::ReplySend, WcStatus::Success, &[]);
    assert_eq!(s.state(i), S::Free);
    assert_eq!(s.c.resources().serve_slots_busy, 0);
}

#[test]
fn process_serve_pulled_reply_goes_to_the_requester_and_frees_the_slot() {
    // Free|PullingReadChunks -CallComplete, a pulled REPLY-> Free
    let mut s = Server::new();
    s.send_own_call(7);
    let (rpc, _) = echo_reply(7, &payload(6000, 1));
    s.recv(&nomsg_call(7, &rpc));
    let i = s.slot(7);
    assert_eq!(s.state(i), S::PullingReadChunks);
    s.complete(WrKind::ChunkRead, WcStatus::Success, &rpc);
    assert_eq!(s.state(i), S::Free);
    let got = core::iter::from_fn(|| s.c.poll_event())
        .any(|e| matches!(e, Event::ReplyArrived { xid: 7, .. }));
    assert!(got, "the pulled reply reached the requester half");
}

#[test]
fn process_serve_beyond_the_grant_closes_and_frees_the_slot() {
    // Free|PullingReadChunks -CallComplete, beyond the grant-> (Closed) Free
    let mut s = Server::new();
    s.send_own_call(8);
    // Three calls being executed, then an RDMA_NOMSG with our XID: it
    // might be our reply, so it does not count yet.
    for xid in 100..103 {
        s.recv(&inline_call(xid, b"busy"));
    }
    let (rpc, _) = echo_call(8, b"a call after all");
    s.recv(&nomsg_call(8, &rpc));
    let i = s.slot(8);
    assert_eq!(s.state(i), S::PullingReadChunks);
    // A fourth call fills the grant; the pulled message is a call too.
    s.recv(&inline_call(103, b"busy"));
    s.complete(WrKind::ChunkRead, WcStatus::Success, &rpc);
    assert_eq!(s.c.close_reason(), Some(CloseReason::CreditOverrun));
    assert_eq!(s.state(i), S::Free);
}

#[test]
fn process_serve_closed_from_every_state() {
    // Free -Closed-> Free
    let mut s = Server::new();
    s.c.close();
    assert!(s.c.serves.iter().all(|t| t.state == S::Free));

    // PullingReadChunks -Closed, work posted-> Draining
    // Draining -ReadDone, more due-> Draining; -ReadDone, the last-> Free
    let mut s = Server::new();
    let (m, _) = read_chunk_call(1, 3000, 2);
    s.recv(&m);
    let i = s.slot(1);
    assert_eq!(s.state(i), S::PullingReadChunks);
    s.c.close();
    assert_eq!(s.state(i), S::Draining);
    s.complete(WrKind::ChunkRead, WcStatus::Flushed, &[]);
    assert_eq!(s.state(i), S::Draining);
    s.complete(WrKind::ChunkRead, WcStatus::Flushed, &[]);
    assert_eq!(s.state(i), S::Free);

    // PullingReadChunks -ReadDone, failed-> PullingReadChunks (the close
    // that follows drains it)
    let mut s = Server::new();
    let (m, _) = read_chunk_call(1, 3000, 2);
    s.recv(&m);
    let i = s.slot(1);
    let wr = s.posted.remove(0);
    s.c.handle_completion(s.now, wr.wr_id(), WcStatus::RemoteAccessError);
    assert!(s.c.close_reason().is_some());
    assert_eq!(s.state(i), S::Draining);
    s.flush();
    assert_eq!(s.state(i), S::Free);

    // Executing -Closed, nothing posted-> Free
    let mut s = Server::new();
    s.recv(&inline_call(2, b"x"));
    let i = s.slot(2);
    assert_eq!(s.state(i), S::Executing);
    s.c.close();
    assert_eq!(s.state(i), S::Free);

    // AwaitingCompletions -Closed, work posted-> Draining
    // Draining -ReplyOpDone, the last-> Free
    let mut s = Server::new();
    s.recv(&inline_call(3, b"x"));
    let i = s.slot(3);
    let call = s.call_arrived();
    reply(&mut s, call, 3, true);
    assert_eq!(s.state(i), S::AwaitingCompletions);
    s.c.close();
    assert_eq!(s.state(i), S::Draining);
    assert_eq!(s.c.resources().buffers_exposed, 0);
    s.complete(WrKind::ReplySend, WcStatus::Flushed, &[]);
    assert_eq!(s.state(i), S::Free);

    // AwaitingDone -Closed, nothing posted-> Free
    let mut s = Server::new();
    s.recv(&inline_call(4, b"x"));
    let i = s.slot(4);
    let call = s.call_arrived();
    reply(&mut s, call, 4, true);
    s.complete(WrKind::ReplySend, WcStatus::Success, &[]);
    assert_eq!(s.state(i), S::AwaitingDone);
    s.c.close();
    assert_eq!(s.state(i), S::Free);
    let r = s.c.resources();
    assert_eq!((r.serve_slots_busy, r.buffers_exposed), (0, 0));
}

// ---------------------------------------------------------------------------
// The requester's call slot (`process_call`)

impl Server {
    /// An echo call; its slot.
    fn call(&mut self, xid: u32) -> usize {
        let (msg, _) = echo_call(xid, b"call");
        let now = self.now;
        self.c
            .send_call(
                now,
                &OutgoingCall {
                    message: &msg,
                    ddp: None,
                    reply: expect(512, None),
                    app: AppChunks::NONE,
                },
            )
            .expect("send_call");
        self.collect();
        self.call_slot(xid)
    }

    fn call_slot(&self, xid: u32) -> usize {
        (0..self.c.calls.len())
            .find(|&i| self.c.calls[i].state != C::Free && self.c.calls[i].xid == xid)
            .expect("a busy call slot for the xid")
    }

    fn call_state(&self, idx: usize) -> C {
        self.c.calls[idx].state
    }

    fn handle(&mut self, xid: u32) -> CallHandle {
        while let Some(ev) = self.c.poll_event() {
            if let Event::ReplyArrived { call, xid: x, .. } = ev {
                if x == xid {
                    return call;
                }
            }
        }
        panic!("no ReplyArrived for {xid}");
    }

    /// Completes the Send of the call with `xid`.
    fn complete_send(&mut self, idx: usize, status: WcStatus) {
        let i = self
            .posted
            .iter()
            .position(|w| {
                let id = w.wr_id();
                id.kind == WrKind::CallSend && id.index as usize == idx
            })
            .expect("the call's Send");
        let wr = self.posted.remove(i);
        self.c.handle_completion(self.now, wr.wr_id(), status);
        self.collect();
    }
}

fn client_cfg() -> Config {
    Config {
        reply_read_chunks: true,
        // A reply exposed in a read chunk longer than this cannot be a
        // call: it is pulled as a reply.
        max_call_size: 4 * KIB,
        call_timeout: Some(Duration::from_millis(10)),
        ..cfg()
    }
}

/// An inline RDMA_MSG echo reply granting 4 credits.
fn inline_reply(xid: u32) -> Vec<u8> {
    raw_call(xid, 4, &echo_reply(xid, b"reply").0)
}

#[test]
fn process_call_walks_every_row_of_the_transition_table() {
    let mut c = Server::with(client_cfg());
    // Free -Submitted-> Queued -SendPosted-> Sent (the first grant is 1)
    let a = c.call(1);
    assert_eq!(c.call_state(a), C::Sent);
    let b = c.call(2);
    assert_eq!(c.call_state(b), C::Queued);
    // Sent -ReplyPlaced-> ReplyReady; its grant sends the queued call:
    // Queued -SendPosted-> Sent
    c.recv(&inline_reply(1));
    assert_eq!(c.call_state(a), C::ReplyReady);
    assert_eq!(c.call_state(b), C::Sent);
    // ReplyReady -Released-> Draining (its Send is still posted)
    // -SendDone-> Free
    let h = c.handle(1);
    assert!(c.c.release_reply(h));
    assert_eq!(c.call_state(a), C::Draining);
    c.complete_send(a, WcStatus::Success);
    assert_eq!(c.call_state(a), C::Free);
    // SendDone while the reply is awaited: noted, unchanged.
    c.complete_send(b, WcStatus::Success);
    assert_eq!(c.call_state(b), C::Sent);
    // A stale completion (an earlier generation) changes nothing.
    let stale = c.c.stats().stale_completions;
    let old = WrId {
        kind: WrKind::CallSend,
        index: a as u32,
        generation: c.c.calls[a].generation.wrapping_sub(1),
    };
    c.c.handle_completion(c.now, old, WcStatus::Success);
    assert_eq!(c.c.stats().stale_completions, stale + 1);

    // Sent -ReplyPullStarted-> PullingReplyReadChunk
    // -ReplyReadDone, Reads still due-> PullingReplyReadChunk
    // -ReplyReadDone, the last, ok-> ReplyReady, RDMA_DONE sent
    let rpc = echo_reply(2, &payload(6000, 2)).0;
    c.recv(&nomsg_segments(2, rpc.len(), 2));
    assert_eq!(c.call_state(b), C::PullingReplyReadChunk);
    c.complete(WrKind::ReplyRead, WcStatus::Success, &rpc);
    assert_eq!(c.call_state(b), C::PullingReplyReadChunk);
    c.complete(WrKind::ReplyRead, WcStatus::Success, &rpc);
    assert_eq!(c.call_state(b), C::ReplyReady);
    assert!(c.posted.iter().any(|w| w.wr_id().kind == WrKind::DoneSend));
    let h = c.handle(2);
    assert!(c.c.release_reply(h));
    assert_eq!(c.call_state(b), C::Free);

    // PullingReplyReadChunk -ReplyReadDone, the last, ok, not the reply
    // to the call-> Draining (CallFailed) -SendDone-> Free
    let d = c.call(3);
    let wrong = echo_reply(0x33, &payload(6000, 3)).0;
    c.recv(&nomsg_segments(3, wrong.len(), 1));
    assert_eq!(c.call_state(d), C::PullingReplyReadChunk);
    c.complete(WrKind::ReplyRead, WcStatus::Success, &wrong);
    assert_eq!(c.call_state(d), C::Draining);
    c.complete_send(d, WcStatus::Success);
    assert_eq!(c.call_state(d), C::Free);

    // Sent -Failed (RDMA_ERROR)-> Draining -SendDone-> Free
    let e = c.call(4);
    let h = TransportHeader::new(4, 4, MessageBody::Error(ErrorBody::Chunk));
    let mut m = vec![0u8; h.buffer_len()];
    h.emit(&mut m).unwrap();
    c.recv(&m);
    assert_eq!(c.call_state(e), C::Draining);
    c.complete_send(e, WcStatus::Success);
    assert_eq!(c.call_state(e), C::Free);

    // Sent -Timeout-> Abandoned -LateAnswer-> Draining -SendDone-> Free
    let f = c.call(5);
    c.now = Instant(c.now.0 + 20_000_000);
    let now = c.now;
    c.c.handle_timeout(now);
    assert_eq!(c.call_state(f), C::Abandoned);
    c.recv(&inline_reply(5));
    assert_eq!(c.call_state(f), C::Draining);
    c.complete_send(f, WcStatus::Success);
    assert_eq!(c.call_state(f), C::Free);
    assert_eq!(c.c.stats().late_replies, 1);
}

#[test]
fn process_call_timeout_and_close_rows() {
    // Queued -Timeout-> Draining, and Free at once (no Send posted)
    let mut c = Server::with(client_cfg());
    let a = c.call(1);
    let b = c.call(2);
    assert_eq!(c.call_state(b), C::Queued);
    c.now = Instant(20_000_000);
    let now = c.now;
    c.c.handle_timeout(now);
    assert_eq!(c.call_state(a), C::Abandoned);
    assert_eq!(c.c.calls[b].state, C::Free);
    // Abandoned -Closed-> Draining -SendDone (flushed)-> Free
    c.c.close();
    assert_eq!(c.call_state(a), C::Draining);
    c.complete_send(a, WcStatus::Flushed);
    assert_eq!(c.c.calls[a].state, C::Free);

    // Sent -Closed-> Draining; Queued -Closed-> Draining, Free at once
    let mut c = Server::with(client_cfg());
    let a = c.call(1);
    let b = c.call(2);
    c.c.close();
    assert_eq!(c.call_state(a), C::Draining);
    assert_eq!(c.c.calls[b].state, C::Free);
    c.flush();
    assert_eq!(c.c.calls[a].state, C::Free);

    // PullingReplyReadChunk -Closed-> Draining -ReplyReadDone (flushed)
    // -> Free; ReplyReady -Closed-> unchanged
    let mut c = Server::with(client_cfg());
    let a = c.call(1);
    c.complete_send(a, WcStatus::Success);
    c.recv(&inline_reply(1));
    assert_eq!(c.call_state(a), C::ReplyReady);
    let b = c.call(2);
    c.complete_send(b, WcStatus::Success);
    let rpc = echo_reply(2, &payload(6000, 2)).0;
    c.recv(&nomsg_segments(2, rpc.len(), 1));
    assert_eq!(c.call_state(b), C::PullingReplyReadChunk);
    c.c.close();
    assert_eq!(c.call_state(b), C::Draining);
    assert_eq!(c.call_state(a), C::ReplyReady);
    c.flush();
    assert_eq!(c.c.calls[b].state, C::Free);
    let h = c.handle(1);
    assert!(c.c.release_reply(h));
    assert_eq!(c.c.calls[a].state, C::Free);
}
