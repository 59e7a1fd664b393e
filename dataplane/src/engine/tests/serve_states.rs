//! The responder slot's transition table (`Connection::process_serve`),
//! row by row: a server connection driven by hand (this test is the peer
//! and the provider), the slot's state asserted after each event.

use core::time::Duration;
use std::collections::VecDeque;

use super::*;
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
    fn new() -> Server {
        let mut s = Server {
            c: Connection::new(server_cfg()).expect("config"),
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
    let mut h = TransportHeader::new(xid, 4, MessageBody::NoMsg);
    h.chunks.push_read(ReadSegment {
        position: 0,
        segment: Segment {
            handle: RKEY,
            length: rpc.len() as u32,
            offset: 0,
        },
    });
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
            ddp: None,
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
    let (msg, _) = echo_call(7, b"ours");
    let now = s.now;
    s.c.send_call(
        now,
        &OutgoingCall {
            message: &msg,
            ddp: None,
            reply: expect(512, None),
            app: AppChunks::NONE,
        },
    )
    .expect("send_call");
    s.collect();
    s.complete(WrKind::CallSend, WcStatus::Success, &[]);
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
    let (msg, _) = echo_call(8, b"ours");
    let now = s.now;
    s.c.send_call(
        now,
        &OutgoingCall {
            message: &msg,
            ddp: None,
            reply: expect(512, None),
            app: AppChunks::NONE,
        },
    )
    .expect("send_call");
    s.collect();
    s.complete(WrKind::CallSend, WcStatus::Success, &[]);
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
