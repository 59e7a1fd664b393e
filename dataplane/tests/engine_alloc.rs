//! No heap allocation per RPC in steady state. Two engines are
//! driven through the public API by a minimal in-line provider that itself
//! allocates nothing after set-up, under a counting global allocator;
//! after a warm-up, 10,000 RPCs over every path (inline, read chunk, long call,
//! write chunk, reply chunk, reply exposed in a read chunk + RDMA_DONE)
//! must allocate zero times.

mod support;

use std::collections::VecDeque;

use dataplane::engine::{
    Access, AppChunks, BufId, BufferTable, Config, Connection, DdpItem, Event, Instant, LocalSlice,
    OutgoingCall, OutgoingReply, ReplyExpect, WcStatus, WorkRequest, WrId,
};
use dataplane::wire::rpc::{AcceptStatus, CallHeader, OpaqueAuth, ReplyHeader};
use dataplane::wire::xdr::{Decoder, Encoder};
use support::alloc_counter::{measure, CountingAllocator};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

enum Done {
    Recv(WrId, u32),
    Wc(WrId, WcStatus),
}

/// Two connections and a provider that executes work requests at once.
struct Wire {
    conns: [Connection; 2],
    rq: [VecDeque<(WrId, BufId)>; 2],
    done: VecDeque<(usize, Done)>,
    reply_scratch: Vec<u8>,
    /// Sends, Reads, Writes executed.
    ops: [u64; 3],
    /// The last reply's message, kept when `Some` (set-up only).
    kept: Option<Vec<u8>>,
}

impl Wire {
    fn new(cfg: Config) -> Wire {
        let mut w = Wire {
            conns: [Connection::new(cfg).unwrap(), Connection::new(cfg).unwrap()],
            rq: [VecDeque::with_capacity(64), VecDeque::with_capacity(64)],
            done: VecDeque::with_capacity(256),
            reply_scratch: vec![0u8; 300 * 1024],
            ops: [0; 3],
            kept: None,
        };
        // Receives are posted before the connection is established.
        for side in 0..2 {
            while let Some(wr) = w.conns[side].poll_transmit() {
                w.execute(side, wr);
            }
        }
        w
    }

    fn execute(&mut self, side: usize, wr: WorkRequest) {
        let peer = 1 - side;
        let [a, b] = &mut self.conns;
        let (me, other) = if side == 0 { (a, b) } else { (b, a) };
        match wr {
            WorkRequest::PostRecv { wr_id, buf } => self.rq[side].push_back((wr_id, buf)),
            // This loopback gives no key windows: the engine never binds.
            WorkRequest::Bind { .. } | WorkRequest::Invalidate { .. } => {
                unreachable!("key operation without key windows: {wr:?}")
            }
            WorkRequest::Send {
                wr_id,
                local,
                gather,
                ..
            } => {
                self.ops[0] += 1;
                let (rwr, rbuf) = self.rq[peer].pop_front().expect("receiver not ready");
                let mut len = 0;
                for part in [Some(local), gather].into_iter().flatten() {
                    let to = LocalSlice {
                        buf: rbuf,
                        offset: len,
                        len: part.len,
                    };
                    transfer(me.buffers(), part, other.buffers_mut(), to);
                    len += part.len;
                }
                self.done.push_back((peer, Done::Recv(rwr, len)));
                self.done
                    .push_back((side, Done::Wc(wr_id, WcStatus::Success)));
            }
            WorkRequest::RdmaWrite {
                wr_id,
                local,
                remote,
            } => {
                self.ops[2] += 1;
                let dst = other
                    .buffers()
                    .resolve(&remote, Access::RemoteWrite)
                    .unwrap();
                transfer(me.buffers(), local, other.buffers_mut(), dst);
                self.done
                    .push_back((side, Done::Wc(wr_id, WcStatus::Success)));
            }
            WorkRequest::RdmaRead {
                wr_id,
                local,
                remote,
            } => {
                self.ops[1] += 1;
                let src = other
                    .buffers()
                    .resolve(&remote, Access::RemoteRead)
                    .unwrap();
                transfer(other.buffers(), src, me.buffers_mut(), local);
                self.done
                    .push_back((side, Done::Wc(wr_id, WcStatus::Success)));
            }
        }
    }

    /// Runs until quiet; the server echoes, the client releases replies.
    /// Returns the number of replies the client saw.
    fn run(&mut self, now: Instant) -> usize {
        let mut replies = 0;
        loop {
            let mut busy = false;
            for side in 0..2 {
                while let Some(wr) = self.conns[side].poll_transmit() {
                    busy = true;
                    self.execute(side, wr);
                }
            }
            while let Some((side, d)) = self.done.pop_front() {
                busy = true;
                match d {
                    Done::Recv(id, len) => self.conns[side].handle_recv(now, id, len),
                    Done::Wc(id, st) => self.conns[side].handle_completion(now, id, st),
                }
            }
            while let Some(ev) = self.conns[1].poll_event() {
                busy = true;
                if let Event::CallArrived { call, xid, .. } = ev {
                    let n = echo_reply_into(
                        &mut self.reply_scratch,
                        xid,
                        self.conns[1].call_message(call).unwrap(),
                    );
                    let len = u32::from_be_bytes(self.reply_scratch[24..28].try_into().unwrap());
                    let item = DdpItem { offset: 28, len };
                    let reply = OutgoingReply {
                        message: &self.reply_scratch[..n],
                        ddp: &[item],
                    };
                    self.conns[1].send_reply(now, call, &reply).unwrap();
                }
            }
            while let Some(ev) = self.conns[0].poll_event() {
                busy = true;
                match ev {
                    Event::ReplyArrived { call, .. } => {
                        replies += 1;
                        if let Some(k) = &mut self.kept {
                            *k = self.conns[0].reply_message(call).unwrap().to_vec();
                        }
                        assert!(self.conns[0].release_reply(call));
                    }
                    other => panic!("unexpected {other:?}"),
                }
            }
            if !busy {
                return replies;
            }
        }
    }
}

/// Encodes the echo reply for `call` into `out`; returns its length. The
/// reply header with AUTH_NONE is 24 bytes, so the payload's data starts
/// at 28.
fn echo_reply_into(out: &mut [u8], xid: u32, call: &[u8]) -> usize {
    let (_, hl) = CallHeader::parse(call).unwrap();
    let payload = Decoder::new(&call[hl..]).get_opaque(usize::MAX).unwrap();
    let mut e = Encoder::new(out);
    ReplyHeader::accepted(xid, OpaqueAuth::None, AcceptStatus::Success)
        .emit(&mut e)
        .unwrap();
    e.put_opaque(payload).unwrap();
    e.position()
}

fn echo_call(xid: u32, len: usize) -> (Vec<u8>, DdpItem) {
    let h = CallHeader::new(xid, 0x2000_0101, 1, 1, OpaqueAuth::None, OpaqueAuth::None);
    let payload: Vec<u8> = (0..len).map(|i| i as u8).collect();
    let mut buf = vec![0u8; h.buffer_len() + 4 + len.next_multiple_of(4)];
    let mut e = Encoder::new(&mut buf);
    h.emit(&mut e).unwrap();
    e.put_opaque(&payload).unwrap();
    let item = DdpItem {
        offset: h.buffer_len() as u32 + 4,
        len: len as u32,
    };
    (buf, item)
}

#[test]
fn design_s4_no_heap_allocation_per_rpc_in_steady_state() {
    let cfg = Config {
        peer_inline_recv_size: 4096,
        peer_inline_send_size: 4096,
        credits: 4,
        max_outstanding_calls: 4,
        max_call_size: 256 * 1024,
        max_reply_size: 256 * 1024,
        max_ddp_size: 256 * 1024,
        reply_read_chunks: true,
        ..Config::default()
    };
    let mut w = Wire::new(cfg);
    // (payload length, DDP argument, expected reply): every path.
    let shapes: [(usize, bool, ReplyExpect); 6] = [
        (
            100,
            true,
            ReplyExpect {
                max_len: 1024,
                ddp_max: None,
            },
        ), // inline both ways
        (
            100_000,
            true,
            ReplyExpect {
                max_len: 512,
                ddp_max: Some(128 * 1024),
            },
        ), // read + write chunk
        (
            50_000,
            false,
            ReplyExpect {
                max_len: 64 * 1024,
                ddp_max: None,
            },
        ), // long call + reply chunk
        (
            3000,
            true,
            ReplyExpect {
                max_len: 8192,
                ddp_max: None,
            },
        ), // inline call, reply chunk
        (
            9000,
            true,
            ReplyExpect {
                max_len: 16 * 1024,
                ddp_max: Some(16 * 1024),
            },
        ), // read + write
        (
            30_000,
            true,
            ReplyExpect {
                max_len: 512,
                ddp_max: None,
            },
        ), // read chunk, reply exposed in a read chunk + RDMA_DONE
    ];
    steady_state_allocates_nothing(&mut w, &shapes);
    let total = w.conns[0].stats().replies_received;
    // One call shape in six has its reply exposed as a read chunk + DONE.
    assert_eq!(w.conns[1].stats().done_received, total / 6);
}

/// Two engines that negotiated `ext` through CONF_RDMA version 2.
fn negotiated_wire(ext: dataplane::engine::Extensions, place_results: bool) -> Wire {
    use dataplane::engine::{decode_conf_rdma_reply_v2, encode_conf_rdma_call_v2};
    let cfg = Config {
        peer_inline_recv_size: 4096,
        peer_inline_send_size: 4096,
        credits: 32,
        max_outstanding_calls: 32,
        max_call_size: 256 * 1024,
        max_reply_size: 256 * 1024,
        max_ddp_size: 256 * 1024,
        extensions: ext,
        place_results,
        ..Config::default()
    };
    let mut w = Wire::new(cfg);
    let req = w.conns[0].conf_rdma_request_v2().unwrap();
    let mut buf = [0u8; 256];
    let n = encode_conf_rdma_call_v2(&mut buf, 0xc0f, &req).unwrap();
    let conf = OutgoingCall {
        message: &buf[..n],
        ddp: None,
        reply: ReplyExpect {
            max_len: 512,
            ddp_max: None,
        },
        app: AppChunks::NONE,
    };
    w.kept = Some(Vec::new());
    w.conns[0].send_call(Instant(0), &conf).unwrap();
    assert_eq!(w.run(Instant(0)), 1);
    let reply = decode_conf_rdma_reply_v2(&w.kept.take().unwrap()).unwrap();
    w.conns[0].apply_conf_rdma_reply_v2(&reply);
    assert_eq!(w.conns[0].negotiated(), ext);
    w
}

/// Two engines that negotiated message continuation (draft-dnoveck-
/// rpcrdma-rtrext-02) through CONF_RDMA version 2: long calls and long
/// replies go as transmission groups, and steady state still allocates
/// nothing.
#[test]
fn rtrext_s4_no_heap_allocation_per_rpc_with_message_continuation() {
    let mut w = negotiated_wire(dataplane::engine::Extensions::MESSAGE_CONTINUATION, false);
    let shapes: [(usize, bool, ReplyExpect); 6] = [
        (
            100,
            false,
            ReplyExpect {
                max_len: 1024,
                ddp_max: None,
            },
        ), // inline both ways
        (
            20_000,
            false,
            ReplyExpect {
                max_len: 32 * 1024,
                ddp_max: None,
            },
        ), // call group, reply group
        (
            100_000,
            false,
            ReplyExpect {
                max_len: 128 * 1024,
                ddp_max: None,
            },
        ), // long call + reply chunk (too long for 17 Sends)
        (
            3000,
            false,
            ReplyExpect {
                max_len: 8192,
                ddp_max: None,
            },
        ), // one Transmit Request reserving one receive, reply group of 1
        (
            9000,
            true,
            ReplyExpect {
                max_len: 16 * 1024,
                ddp_max: Some(16 * 1024),
            },
        ), // argument and result inline in groups
        (
            60_000,
            false,
            ReplyExpect {
                max_len: 64 * 1024,
                ddp_max: None,
            },
        ), // call group of 15, reply group of 15 (16 receives reserved)
    ];
    steady_state_allocates_nothing(&mut w, &shapes);
    let (c, s) = (w.conns[0].stats(), w.conns[1].stats());
    assert!(c.call_groups_sent > 0 && s.call_groups_received == c.call_groups_sent);
    assert!(s.reply_groups_sent > 0 && c.reply_groups_received == s.reply_groups_sent);
    assert_eq!(c.groups_dropped + s.groups_dropped, 0);
}

/// As above with send-based data placement (rtrext s7) as well: DDP
/// arguments and results placed in the peer's target buffer segments
/// (results by Send, `place_results`; or written by RDMA as the call
/// directs, the default), and the Transmit Request and Response headers
/// carrying their placement and directions, allocate nothing in steady
/// state either.
#[test]
fn rtrext_s7_no_heap_allocation_per_rpc_with_send_placement() {
    for place_results in [true, false] {
        placement_allocates_nothing(place_results);
    }
}

fn placement_allocates_nothing(place_results: bool) {
    use dataplane::engine::Extensions;
    let mut w = negotiated_wire(
        Extensions::MESSAGE_CONTINUATION.union(Extensions::SEND_PLACEMENT),
        place_results,
    );
    let ddp = |max_len: u32, ddp_max: Option<u32>| ReplyExpect { max_len, ddp_max };
    let shapes: [(usize, bool, ReplyExpect); 6] = [
        (100, false, ddp(1024, None)),                      // inline both ways
        (12_000, true, ddp(16 * 1024, Some(16 * 1024))),    // both items placed
        (100_000, true, ddp(128 * 1024, Some(128 * 1024))), // read + write chunks
        (3000, false, ddp(8192, Some(8192))),               // result directed, reply in one Send
        (9000, true, ddp(16 * 1024, None)),                 // argument placed, reply group
        (60_000, false, ddp(64 * 1024, None)),              // groups, nothing to place
    ];
    steady_state_allocates_nothing(&mut w, &shapes);
    let (c, s) = (w.conns[0].stats(), w.conns[1].stats());
    assert!(c.items_placed_sent > 0 && s.items_placed_received == c.items_placed_sent);
    assert_eq!(c.items_placed_received, s.items_placed_sent);
    assert_eq!(s.items_placed_sent > 0, place_results);
    assert_eq!(c.groups_dropped + s.groups_dropped, 0);
}

/// Runs 10,000 echo RPCs over `shapes` after a warm-up and checks that
/// none of them allocated, and that Sends, Reads and Writes all ran.
fn steady_state_allocates_nothing(w: &mut Wire, shapes: &[(usize, bool, ReplyExpect); 6]) {
    let calls: Vec<_> = (0..48u32)
        .map(|i| {
            let (len, ddp, reply) = shapes[i as usize % shapes.len()];
            let (msg, item) = echo_call(i, len);
            (msg, ddp.then_some(item), reply)
        })
        .collect();
    let round = |w: &mut Wire, range: std::ops::Range<usize>| {
        let mut sent = 0;
        for chunk in calls[range].chunks(4) {
            for (msg, ddp, reply) in chunk {
                let call = OutgoingCall {
                    message: msg,
                    ddp: *ddp,
                    reply: *reply,
                    app: AppChunks::NONE,
                };
                w.conns[0].send_call(Instant(0), &call).unwrap();
                sent += 1;
            }
            assert!(w.run(Instant(0)) > 0);
        }
        sent
    };
    let base = w.conns[0].stats().replies_received;
    round(w, 0..24); // warm-up
    let before = w.ops;
    // At least 10,000 RPCs after warm-up, every path, no heap.
    const MEASURED_RPCS: usize = 10_000;
    let (sent, allocated) = measure(|| {
        let mut sent = 0;
        while sent < MEASURED_RPCS {
            sent += round(w, 24..48);
        }
        sent
    });
    assert!(sent >= MEASURED_RPCS);
    // Every kind of operation happened in the measured part.
    assert!(
        (0..3).all(|i| w.ops[i] > before[i]),
        "{before:?} -> {:?}",
        w.ops
    );
    assert_eq!(
        allocated.count, 0,
        "heap activity in steady state over {sent} RPCs: {allocated:?}"
    );
    let total = (24 + sent) as u64;
    assert_eq!(w.conns[0].stats().replies_received - base, total);
}

/// Copies `from` of one engine's buffers to `to` of another's, a page at
/// a time through the stack (either may be peer memory, which is never a
/// slice; and this runs in the measured loop, so it must not allocate).
fn transfer(src: &BufferTable, from: LocalSlice, dst: &mut BufferTable, to: LocalSlice) {
    assert_eq!(from.len, to.len, "transfer lengths");
    let mut page = [0u8; 4096];
    let mut at = 0u32;
    while at < from.len {
        let n = (from.len - at).min(page.len() as u32);
        let piece = LocalSlice {
            offset: from.offset + at,
            len: n,
            ..from
        };
        assert!(src.read(piece, &mut page[..n as usize]), "source range");
        assert!(
            dst.write(to.buf, (to.offset + at) as usize, &page[..n as usize]),
            "destination range"
        );
        at += n;
    }
}
