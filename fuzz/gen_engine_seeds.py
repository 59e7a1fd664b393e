#!/usr/bin/env python3
"""Writes the hand-built seeds of the engine_recv and engine_worker targets
(fuzz/seeds/engine_recv/, fuzz/seeds/engine_worker/), one per engine path,
in the input format `dataplane::engine::fuzz_recv` and
`dataplane::worker::fuzz_endpoint` document: a configuration byte, then
operations (a control byte: low four bits the operation, high four its
parameter; then its arguments). Run from the repository root; the seeds are
committed, this only documents and regenerates them."""
import os
import struct

RAW, COMPLETE, STALE, REPLY, CALL, ANSWER, TIME, RELEASE, ENGINE_CALL, \
    SCRIBBLE, PEER_MEMORY, DONE, RECV_ERROR, DISCONNECT, COMPLETE_ALL, \
    RAW_INVALIDATE = range(16)

# Configuration bits.
READ_CHUNKS, WINDOWS, REMOTE_INV, CONF_RDMA, ONE_CREDIT, ONE_READ, IDLE, SMALL = \
    (1 << i for i in range(8))


def op(code, param=0, *args):
    out = bytes([code | (param << 4)])
    for a in args:
        out += a
    return out


def b(*xs):
    return bytes(xs)


def u16(n):
    return struct.pack(">H", n)


def u32(n):
    return struct.pack(">I", n)


def all_done():
    return op(COMPLETE_ALL)


def reply(sel, kind, credits=4, body=b"\0" * 8):
    return op(REPLY, 0, b(sel, kind, credits), u16(len(body)), body)


def call(shape, proc=0, body=b"\0" * 8):
    return op(CALL, 0, b(shape, proc), u16(len(body)), body)


def answer(sel, shape):
    return op(ANSWER, 0, b(sel, shape))


def raw(msg):
    return op(RAW, 0, u16(len(msg)), msg)


def rdma_hdr(xid, credits, proc, chunks=b"\0\0\0\0" * 3):
    return u32(xid) + u32(1) + u32(credits) + u32(proc) + chunks


def rpc_reply(xid, extra=b""):
    return u32(xid) + u32(1) + u32(0) + u32(0) + u32(0) + u32(0) + extra


# The engine sends three calls before the input (XIDs 1, 2, 3); the grant
# starts at one credit, so only call 1 is on the wire until a reply grants
# more. Replies pick a call among those the peer saw, in order.
first = reply(0, 0) + all_done()
seeds = {
    "reply_inline": b(0) + first + op(RELEASE, 0, b(0)),
    "reply_write_chunk": b(0) + first + reply(2, 1, body=b"\x11" * 3000) + all_done(),
    "reply_reply_chunk": b(0) + first + reply(2, 2, body=b"\x22" * 20000) + all_done(),
    "reply_reply_chunk_and_inline": b(0) + first + reply(2, 7, body=b"\x22" * 500) + all_done(),
    "reply_msgp": b(0) + first + reply(1, 3, body=b"\x08" * 64),
    "reply_err_vers": b(0) + first + reply(1, 4),
    "reply_err_chunk_and_other": b(0) + first + reply(1, 5, credits=2) + reply(2, 5, credits=3),
    "reply_read_chunk_done": b(READ_CHUNKS) + first + reply(2, 6, body=b"\x33" * 5000)
    + all_done() + all_done() + op(RELEASE, 0, b(0)),
    "reply_read_chunk_unnegotiated": b(0) + first + reply(2, 6, body=b"\x33" * 100) + all_done(),
    "peer_call_inline": b(0) + call(0) + answer(0, 0) + all_done(),
    "peer_call_read_chunk": b(0) + call(1 | 4, body=b"\x44" * 3000) + all_done()
    + answer(0, 4) + all_done(),
    "peer_call_nomsg": b(ONE_READ) + call(2, body=b"\x55" * 6000) + all_done()
    + answer(0, 1 | 0x10) + all_done(),
    "peer_call_reply_chunk": b(0) + call(0x10) + answer(0, 2) + all_done(),
    "peer_call_two_ddp": b(0) + call(8) + answer(0, 8 | 1) + all_done(),
    "peer_call_msgp": b(0) + call(3, body=b"\x66" * 100) + answer(0, 0) + all_done(),
    "peer_call_unknown_type": b(0) + call(0x40) + all_done(),
    "exposed_reply_done": b(READ_CHUNKS) + call(0) + answer(0, 3) + all_done()
    + op(DONE, 0, b(0)) + all_done(),
    "exposed_reply_done_invalidate": b(READ_CHUNKS | WINDOWS | REMOTE_INV) + call(0)
    + answer(0, 3) + all_done() + op(DONE, 1, b(0)) + all_done(),
    "exposed_reply_timeout": b(READ_CHUNKS) + call(0) + answer(0, 3) + all_done()
    + op(TIME, 15) + all_done(),
    "conf_rdma": b(CONF_RDMA) + call(0x80, proc=1) + all_done() + call(0x80, proc=1)
    + all_done(),
    "timeout_then_late_reply": b(0) + first + op(TIME, 15) + op(TIME, 15) + reply(1, 0)
    + reply(2, 2) + all_done(),
    "key_windows_write_chunk": b(WINDOWS) + first + reply(2, 1, body=b"\x77" * 2000)
    + all_done() + op(RELEASE, 0, b(0)) + all_done(),
    "credit_overrun": b(ONE_CREDIT) + call(0) + call(0) + call(0) + all_done(),
    "parked_calls": b(0) + call(0) * 4 + answer(0, 0) * 4 + call(0) * 4 + all_done()
    + answer(0, 0) * 4 + all_done(),
    "idle_close": b(IDLE) + reply(0, 0) + all_done() + reply(1, 0) + reply(2, 0) + all_done()
    + op(RELEASE, 0, b(0)) * 3 + all_done() + op(TIME, 15) * 3,
    "completions_any_order": b(0) + call(1 | 4, body=b"\x44" * 9000)
    + op(COMPLETE, 0, b(2)) + op(COMPLETE, 0, b(0)) + op(COMPLETE, 11, b(0))
    + op(STALE, 0, b(0)) + op(STALE, 1, b(0), struct.pack(">Q", (4 << 60) | 3)),
    "stale_and_errors": b(0) + first + op(STALE, 2, b(10)) + op(STALE, 0, b(0))
    + op(RECV_ERROR, 0) + op(RECV_ERROR, 13),
    "scribble_peer_memory": b(0) + first + reply(2, 1, body=b"\x11" * 3000)
    + op(SCRIBBLE, 0, b(5), u16(0), b(8), b"\xff" * 8) + op(PEER_MEMORY, 0, u16(0), b(4), b"\1\2\3\4")
    + all_done(),
    "small_inline_chunks": b(SMALL) + first + reply(2, 2, body=b"\x22" * 4000) + all_done()
    + op(ENGINE_CALL, 0, b(3 | 4 | 8 | 16)) + all_done(),
    "disconnect": b(0) + first + op(DISCONNECT, 0),
    "qp_failure": b(0) + first + op(DISCONNECT, 1),
    "qp_failure_while_pulling": b(0) + call(1, body=b"\x44" * 3000) + op(DISCONNECT, 1)
    + all_done(),
    "reply_read_chunk_pulled_by_requester": b(READ_CHUNKS | ONE_CREDIT) + reply(0, 0)
    + all_done() + call(0) + reply(2, 6, body=b"\x33" * 3000) + all_done() + all_done(),
    "reply_read_chunk_too_large": b(READ_CHUNKS | ONE_CREDIT) + reply(0, 0) + all_done()
    + call(0) + reply(2, 6, credits=0x80, body=b"\x33" * 100) + all_done() + all_done(),
    "reply_nomsg_without_reply_chunk": b(0) + first + reply(1, 2),
    "reply_send_with_invalidate": b(REMOTE_INV) + call(4 | 0x10) + answer(0, 4) + all_done(),
    "one_key_window": b(WINDOWS | SMALL) + first + op(ENGINE_CALL, 0, b(3 | 8 | 16))
    + op(ENGINE_CALL, 0, b(3 | 8 | 16)) + all_done(),
    "error_buffers_exhausted": b(0) + raw(u32(9) + u32(2) + u32(1) + u32(0) + b"\0" * 12) * 12,
    "raw_reply_unknown_xid": b(0) + raw(rdma_hdr(77, 4, 0) + rpc_reply(77)),
    # Raw messages, built by hand (what the structured operations cannot say).
    "raw_reply_msg_xid1": b(0) + raw(rdma_hdr(1, 4, 0) + rpc_reply(1)) + all_done(),
    "raw_done_unknown_xid": b(0) + raw(rdma_hdr(77, 0, 3)),
    "raw_runt": b(0) + raw(b"\0\0\0\1\0\0\0\1"),
    "raw_vers2": b(0) + raw(u32(9) + u32(2) + u32(1) + u32(0) + b"\0" * 12),
    "raw_invalidate_unknown_key": b(WINDOWS) + op(RAW_INVALIDATE, 0, u32(0x1234),
                                                  u16(28 + 24), rdma_hdr(1, 4, 0) + rpc_reply(1)),
}


# Message continuation (draft-dnoveck-rpcrdma-rtrext-02): the peer turns it
# on with a CONF_RDMA version 2 call listing RTR Support (property 3, all
# three operations) and its group limits (properties 5 and 6, 4 each).
def prop(pid, value):
    return u32(pid) + u32(len(value)) + value


def rpc_call(xid, prog, vers, proc_, args=b""):
    return u32(xid) + u32(0) + u32(2) + u32(prog) + u32(vers) + u32(proc_) + u32(0) * 4 + args


CONF_V2 = raw(rdma_hdr(0x0c01, 4, 0) + rpc_call(
    0x0c01, 100417, 2, 1,
    u32(4096) + u32(4096) + u32(4) + u32(3)
    + prop(3, u32(7)) + prop(5, u32(4)) + prop(6, u32(4))))


def opt(xid, opttype, info, payload=b""):
    """An RDMA_OPTIONAL header (docs/EXTENSIONS.md section 4) and payload."""
    return raw(u32(xid) + u32(1) + u32(4) + u32(5) + u32(opttype) + u32(len(info)) + info
               + payload)


def xmtreq(xid, count, rsbuf, part):
    return opt(xid, 5, u32(0) + u32(0) + u32(count) + u32(rsbuf) + u32(len(part)), part)


def xmtresp(xid, count, part):
    return opt(xid, 6, u32(0) + u32(count) + u32(len(part)), part)


def xmtcont(xid, seq, itype, part):
    return opt(xid, 7, u32(seq) + u32(itype) + u32(len(part)), part)


def repterr_badcont(xid):
    # bad = (xid, CALL, 0), no lead, OPTRERR_BADCONT
    return opt(xid, 8, u32(xid) + u32(0) + u32(0) + u32(0) + u32(3))


peer_call = rpc_call(0x2000, 100003, 3, 6, u32(6000) + b"\x5a" * 6000)
engine_reply = rpc_reply(4, u32(6000) + b"\x6b" * 6000)
seeds.update({
    # A call of the peer in three transmissions, answered.
    "continuation_peer_call_group": b(CONF_RDMA) + CONF_V2 + all_done()
    + xmtreq(0x2000, 3, 2, peer_call[:4000]) + xmtcont(0x2000, 1, 5, peer_call[4000:8000])
    + xmtcont(0x2000, 2, 5, peer_call[8000:]) + all_done() + answer(0, 2) + all_done(),
    # A Version One message breaks into a group: reported, group dropped.
    "continuation_group_broken": b(CONF_RDMA) + CONF_V2 + all_done()
    + xmtreq(0x2001, 3, 0, peer_call[:4000]) + call(0) + all_done()
    + xmtcont(0x2001, 2, 5, peer_call[4000:4100]) + all_done(),
    # The engine's long call goes as a group reserving receives; its
    # reply comes in two transmissions; a report fails the next call.
    "continuation_engine_groups": b(CONF_RDMA) + CONF_V2 + all_done() + reply(0, 0)
    + all_done() + reply(1, 0) + reply(2, 0) + all_done() + op(ENGINE_CALL, 0, b(2 | 8))
    + all_done()
    + xmtresp(4, 2, engine_reply[:4000]) + xmtcont(4, 1, 6, engine_reply[4000:]) + all_done()
    + op(RELEASE, 0, b(0)) * 2 + all_done()
    + op(ENGINE_CALL, 0, b(2 | 8)) + all_done() + repterr_badcont(5) + all_done()
    + op(TIME, 15) + all_done(),
})


# Send-based data placement (draft-dnoveck-rpcrdma-rtrext-02 s7,
# docs/EXTENSIONS.md section 8): the peer advertises it too (extension
# flag 0x4 in property 0x80000001, besides RTR Support with Transmit
# Request and Response) and describes its receive buffers (Receive Buffer
# Structure, property 4: 4096 bytes, a 64-byte head and seven
# placement-targetable segments of 576, like the engine's own).
RECV_LEN, HEAD, SEG, PER_BUF = 4096, 64, 576, 7


def buffer_structure():
    groups = [(1, HEAD, 4, 0), (PER_BUF, SEG, 4, 1)]
    return u32(RECV_LEN) + u32(len(groups)) + b"".join(
        u32(c) + u32(ln) + u32(al) + u32(fl) for c, ln, al, fl in groups)


CONF_V2_PLACEMENT = raw(rdma_hdr(0x0c02, 4, 0) + rpc_call(
    0x0c02, 100417, 2, 1,
    u32(4096) + u32(4096) + u32(4) + u32(5)
    + prop(3, u32(7)) + prop(5, u32(4)) + prop(6, u32(4))
    + prop(0x80000001, u32(4)) + prop(4, buffer_structure())))


def tbsn_item(disp, length, offset, numbers):
    """An `xmdp_mitem` placed by target buffer segment numbers (s7.3)."""
    return u32(disp) + u32(length) + u32(2) + u32(offset) + u32(len(numbers)) \
        + b"".join(u32(n) for n in numbers)


def placed_group(xid, msg, disp, length, tweak=None, bad_offset=None):
    """A call of the peer in Sends, its item at `disp` (`length` bytes,
    XDR padded) placed into the engine's target segments the way the
    engine lays out its own (docs/EXTENSIONS.md section 8): the whole
    payload stream (the message without the item) in the first
    transmission, the item in every target segment past it, then in all
    seven segments of each Transmit Continue (payload stream empty).
    Segment numbers count seven per transmission; segment k of a buffer
    is at 64 + 576 * k. The header lists `tweak(numbers)` and the offset
    `bad_offset` when given (wrong ones are the point of some seeds); the
    Sends are laid out by the right ones."""
    padded = (length + 3) & ~3
    stream = msg[:disp] + msg[disp + padded:]
    item = msg[disp:disp + length]
    need = (length + SEG - 1) // SEG
    # The header grows by four bytes per number, which may push the first
    # segment out: redo the layout until the list is stable (as
    # placement::plan does).
    numbers = []
    while True:
        floor = 24 + 4 + 20 + 4 * len(numbers) + 4 + 12 + len(stream)
        good, t = [], 0
        while len(good) < need:
            good += [t * PER_BUF + k for k in range(PER_BUF)
                     if HEAD + k * SEG >= floor][:need - len(good)]
            t, floor = t + 1, 36
        if len(good) == len(numbers):
            break
        numbers = good
    count = numbers[-1] // PER_BUF + 1
    sends = [bytearray(RECV_LEN) for _ in range(count)]
    ends = [36] * count
    for j, n in enumerate(numbers):
        t, k = divmod(n, PER_BUF)
        piece = item[j * SEG:(j + 1) * SEG]
        at = HEAD + k * SEG
        sends[t][at:at + len(piece)] = piece
        ends[t] = at + len(piece)
    listed = tweak(numbers) if tweak else numbers
    offset = 0 if bad_offset is None else bad_offset
    info = u32(1) + tbsn_item(disp, length, offset, listed) + u32(0) \
        + u32(count) + u32(0) + u32(len(stream))
    first = u32(xid) + u32(1) + u32(4) + u32(5) + u32(5) + u32(len(info)) + info + stream
    assert len(first) <= HEAD + numbers[0] * SEG
    sends[0][:len(first)] = first
    for t in range(1, count):
        sends[t][:36] = u32(xid) + u32(1) + u32(4) + u32(5) + u32(7) + u32(12) \
            + u32(t) + u32(5) + u32(0)
    # Each Send ends with the last byte of the item it carries.
    return b"".join(raw(bytes(sends[t][:ends[t]])) for t in range(count))


# A DDP-eligible argument: an NFSv3 WRITE-like call, the data (an opaque
# of 10,000 bytes) placed, one word of other arguments after it.
W_DATA = bytes((i * 7 + 3) & 0xff for i in range(10000))
W_DISP = 40 + 4


def write_call(xid):
    return rpc_call(xid, 100003, 3, 7, u32(len(W_DATA)) + W_DATA + u32(0x0a0b0c0d))


# A small call whose reply's DDP-eligible item is to be placed (s7.4):
# one direction set over the whole call, one TBSN direction (placed if at
# least 576 bytes, one of the peer's segments), three receives reserved.
r_call = rpc_call(0x3004, 100003, 3, 6, b"\x31" * 36)
DIRECTED = u32(1) + u32(0) + u32((len(r_call) + 3) & ~3) + u32(1) + u32(SEG) + u32(2)
directed_req = raw(u32(0x3004) + u32(1) + u32(4) + u32(5) + u32(5)
                   + u32(4 + len(DIRECTED) + 12) + u32(0) + DIRECTED
                   + u32(1) + u32(3) + u32(len(r_call)) + r_call)
seeds.update({
    # A call of the peer in three transmissions, its 10,000-byte argument
    # in 18 of the engine's target segments; answered.
    "placement_peer_call_placed": b(CONF_RDMA) + CONF_V2_PLACEMENT + all_done()
    + placed_group(0x3000, write_call(0x3000), W_DISP, len(W_DATA)) + all_done()
    + answer(0, 0) + all_done(),
    # Segment numbers the engine refuses (OPTRERR_BADTBSN): one past the
    # three transmissions' 21 segments (checked at the first
    # transmission; the group's Transmit Continues are then dropped), and
    # segment 0 of the first transmission, under its header and payload
    # stream (checked as the transmission is taken).
    "placement_peer_call_bad_tbsn": b(CONF_RDMA) + CONF_V2_PLACEMENT + all_done()
    + placed_group(0x3001, write_call(0x3001), W_DISP, len(W_DATA),
                   tweak=lambda ns: ns[:-1] + [40]) + all_done()
    + placed_group(0x3002, write_call(0x3002), W_DISP, len(W_DATA),
                   tweak=lambda ns: [0] + ns[1:]) + all_done(),
    # An offset past the first segment's end (OPTRERR_BADOFF).
    "placement_peer_call_bad_offset": b(CONF_RDMA) + CONF_V2_PLACEMENT + all_done()
    + placed_group(0x3003, write_call(0x3003), W_DISP, len(W_DATA), bad_offset=SEG)
    + all_done(),
    # A Transmit Request directing its reply's item into the peer's
    # target segments; the engine's reply (9,028 bytes, a 9,000-byte DDP
    # item) goes as a Transmit Response group with the item placed.
    "placement_reply_directed": b(CONF_RDMA) + CONF_V2_PLACEMENT + all_done()
    + directed_req + all_done() + answer(0, 2 | 4) + all_done(),
    # The engine's own call with a 9,000-byte DDP argument goes placed
    # into the peer's target segments (after replies granting credits).
    "placement_engine_call_placed": b(CONF_RDMA) + CONF_V2_PLACEMENT + all_done()
    + reply(0, 0) + all_done() + reply(1, 0) + reply(2, 0) + all_done()
    + op(ENGINE_CALL, 0, b(2 | 4)) + all_done(),
})


def write(d, seeds):
    os.makedirs(d, exist_ok=True)
    # Crash inputs found by fuzzing are kept (they are not generated here).
    for f in os.listdir(d):
        if not f.startswith("crash-"):
            os.remove(os.path.join(d, f))
    for name, data in seeds.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
    print(d, len(seeds), "seeds")


write("fuzz/seeds/engine_recv", seeds)

# engine_worker: the same operations through the endpoint; its
# configuration bits differ, and operation 15 sets the send queue's room.
W_READ_CHUNKS, W_WINDOWS, W_SMALL_SQ, W_NO_PD, W_REMOTE_INV, W_ONE_CREDIT, W_CONF_RDMA, \
    W_ONE_READ = (1 << i for i in range(8))
SEND_ROOM = 15
flag_map = {READ_CHUNKS: W_READ_CHUNKS, WINDOWS: W_WINDOWS, REMOTE_INV: W_REMOTE_INV,
            CONF_RDMA: W_CONF_RDMA, ONE_CREDIT: W_ONE_CREDIT, ONE_READ: W_ONE_READ}
worker = {}
for name, data in seeds.items():
    if name in ("raw_invalidate_unknown_key", "idle_close", "one_key_window",
                "small_inline_chunks", "error_buffers_exhausted"):
        continue
    f = sum(w for e, w in flag_map.items() if data[0] & e)
    worker[name] = bytes([f]) + data[1:]
worker.update({
    "small_send_queue_backlog": b(W_SMALL_SQ) + first + reply(2, 1, body=b"\x11" * 3000)
    + all_done() + op(SEND_ROOM, 0) + all_done(),
    "no_private_data": b(W_NO_PD) + first + reply(2, 2, body=b"\x22" * 3000) + all_done(),
    "foreign_and_stale_ids": b(0) + first
    + op(STALE, 1, b(0), struct.pack(">Q", (1 << 56) | 5)) + op(STALE, 0, b(0))
    + op(STALE, 3, b(9), struct.pack(">Q", (5 << 56) | (3 << 32) | 1)),
    "every_status": b(0) + call(1 | 4, body=b"\x44" * 9000)
    + b"".join(op(COMPLETE, st, b(0)) for st in range(6, 15)),
    "recv_longer_than_buffer": b(0) + raw(b"\0" * 5000),
    "done_invalidating_unknown_key": b(W_WINDOWS) + op(DONE, 1, b(0)),
    "windows_scribble": b(W_WINDOWS) + first + reply(2, 1, body=b"\x11" * 300)
    + op(SCRIBBLE, 0, b(1), u16(8), b(16), b"\xee" * 16) + all_done(),
})
write("fuzz/seeds/engine_worker", worker)
