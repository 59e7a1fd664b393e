//! Golden bytes (hand-assembled from RFC 5666 s4.3), hostile inputs kept
//! as regressions, and property tests for the transport header codec.

use super::*;
use proptest::prelude::*;

const L: Limits = Limits::DEFAULT;

fn seg(handle: u32, length: u32, offset: u64) -> Segment {
    Segment {
        handle,
        length,
        offset,
    }
}

fn rseg(position: u32, handle: u32, length: u32, offset: u64) -> ReadSegment {
    ReadSegment {
        position,
        segment: seg(handle, length, offset),
    }
}

/// The four checks every golden message gets (smoltcp style): deconstruct,
/// construct, parse(emit) round trip, buffer_len; then truncation at every
/// offset must fail without panicking. `header_len` is where the header
/// ends (bytes after it are the RPC message).
fn check_golden(bytes: &[u8], header_len: usize, repr: &TransportHeader) {
    // Deconstruct.
    let (parsed, len) = TransportHeader::parse(bytes, &L).expect("golden parses");
    assert_eq!(&parsed, repr);
    assert_eq!(len, header_len);
    // Construct.
    assert_eq!(repr.buffer_len(), header_len);
    let mut buf = vec![0xAAu8; header_len];
    assert_eq!(repr.emit(&mut buf), Ok(header_len));
    assert_eq!(&buf[..], &bytes[..header_len]);
    // Round trip, and through a warmed scratch header.
    let (again, len2) = TransportHeader::parse(&buf, &L).unwrap();
    assert_eq!(&again, repr);
    assert_eq!(len2, header_len);
    let mut scratch = TransportHeader::with_capacity(&L);
    assert_eq!(
        scratch.parse_into(&buf, &L),
        Ok(Decoded::Header { len: header_len })
    );
    assert_eq!(&scratch, repr);
    // The fixed words through the zero-copy view.
    let view = HeaderView::new_checked(bytes).unwrap();
    assert_eq!(
        (view.xid(), view.vers(), view.credits(), view.proc_type()),
        (repr.xid, repr.vers, repr.credits, repr.body.proc_type())
    );
    // Truncation anywhere inside the header fails cleanly.
    for cut in 0..header_len {
        let r = TransportHeader::parse(&bytes[..cut], &L);
        assert!(r.is_err(), "cut at {cut} parsed: {r:?}");
        assert!(scratch.parse_into(&bytes[..cut], &L).is_err());
    }
    // Too-short output buffers fail before writing.
    for short in [0, header_len / 2, header_len - 1] {
        let mut out = vec![0x55u8; short];
        assert_eq!(repr.emit(&mut out), Err(Error::BufferTooShort));
        assert!(out.iter().all(|&b| b == 0x55));
    }
    fuzz_parse(bytes);
}

// RDMA_MSG call whose read list carries two read chunks: the first (at XDR
// position 128) made of two segments, the second (at 4096) of one.
#[rustfmt::skip]
const MSG_TWO_READ_CHUNKS: [u8; 100] = [
    0x12, 0x34, 0x56, 0x78, // xid
    0x00, 0x00, 0x00, 0x01, // vers 1
    0x00, 0x00, 0x00, 0x20, // credits 32
    0x00, 0x00, 0x00, 0x00, // RDMA_MSG
    // read list
    0x00, 0x00, 0x00, 0x01, //   present
    0x00, 0x00, 0x00, 0x80, //   position 128
    0x00, 0x00, 0x00, 0xa1, //   handle
    0x00, 0x00, 0x10, 0x00, //   length 4096
    0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, // offset 0x1_0000_0000
    0x00, 0x00, 0x00, 0x01, //   present
    0x00, 0x00, 0x00, 0x80, //   position 128 (same chunk)
    0x00, 0x00, 0x00, 0xa2, //   handle
    0x00, 0x00, 0x02, 0x00, //   length 512
    0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x10, 0x00, // offset 0x1_0000_1000
    0x00, 0x00, 0x00, 0x01, //   present
    0x00, 0x00, 0x10, 0x00, //   position 4096 (second chunk)
    0x00, 0x00, 0x00, 0xb1, //   handle
    0x00, 0x00, 0x08, 0x00, //   length 2048
    0xff, 0xff, 0x80, 0x00, 0x00, 0x00, 0x20, 0x00, // offset
    0x00, 0x00, 0x00, 0x00, //   end of read list
    0x00, 0x00, 0x00, 0x00, // write list: empty
    0x00, 0x00, 0x00, 0x00, // reply chunk: absent
];

#[test]
fn golden_msg_two_read_chunks() {
    let mut h = TransportHeader::new(0x1234_5678, 32, MessageBody::Msg);
    h.chunks.push_read(rseg(128, 0xa1, 4096, 0x1_0000_0000));
    h.chunks.push_read(rseg(128, 0xa2, 512, 0x1_0000_1000));
    h.chunks
        .push_read(rseg(4096, 0xb1, 2048, 0xffff_8000_0000_2000));
    check_golden(&MSG_TWO_READ_CHUNKS, 100, &h);

    let chunks: Vec<_> = h.chunks.read_chunks().collect();
    assert_eq!(chunks.len(), 2);
    assert_eq!((chunks[0].position, chunks[0].segments.len()), (128, 2));
    assert_eq!(chunks[0].len_bytes(), 4608);
    assert_eq!((chunks[1].position, chunks[1].len_bytes()), (4096, 2048));
}

// RDMA_MSG reply returning a write list of two chunks, two segments each.
#[rustfmt::skip]
const MSG_WRITE_LIST: [u8; 108] = [
    0x00, 0x00, 0x00, 0x2a, // xid 42
    0x00, 0x00, 0x00, 0x01, // vers 1
    0x00, 0x00, 0x00, 0x80, // credits 128
    0x00, 0x00, 0x00, 0x00, // RDMA_MSG
    0x00, 0x00, 0x00, 0x00, // read list: empty
    // write list
    0x00, 0x00, 0x00, 0x01, //   present
    0x00, 0x00, 0x00, 0x02, //   chunk 1: 2 segments
    0x00, 0x00, 0x01, 0x01, 0x00, 0x00, 0x40, 0x00, // handle 0x101, length 16384
    0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, // offset 0x10_0000
    0x00, 0x00, 0x01, 0x02, 0x00, 0x00, 0x20, 0x00, // handle 0x102, length 8192
    0x00, 0x00, 0x00, 0x00, 0x00, 0x20, 0x00, 0x00, // offset 0x20_0000
    0x00, 0x00, 0x00, 0x01, //   present
    0x00, 0x00, 0x00, 0x02, //   chunk 2: 2 segments
    0x00, 0x00, 0x02, 0x01, 0x00, 0x00, 0x00, 0x00, // handle 0x201, length 0 (unused)
    0x00, 0x00, 0x00, 0x00, 0x00, 0x30, 0x00, 0x00, // offset 0x30_0000
    0x00, 0x00, 0x02, 0x02, 0x00, 0x00, 0x00, 0x04, // handle 0x202, length 4
    0x00, 0x00, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00, // offset 0x40_0000
    0x00, 0x00, 0x00, 0x00, //   end of write list
    0x00, 0x00, 0x00, 0x00, // reply chunk: absent
];

#[test]
fn golden_msg_write_list() {
    let mut h = TransportHeader::new(42, 128, MessageBody::Msg);
    h.chunks
        .push_write_chunk(&[seg(0x101, 16384, 0x10_0000), seg(0x102, 8192, 0x20_0000)])
        .unwrap();
    h.chunks
        .push_write_chunk(&[seg(0x201, 0, 0x30_0000), seg(0x202, 4, 0x40_0000)])
        .unwrap();
    check_golden(&MSG_WRITE_LIST, 108, &h);

    let chunks: Vec<_> = h.chunks.write_chunks().collect();
    assert_eq!(h.chunks.write_chunk_count(), 2);
    assert_eq!(chunks[0].len_bytes(), 24576);
    assert_eq!(chunks[1].segments[1].handle, 0x202);
    assert!(h.chunks.reply().is_none());

    // A responder echoes the call's write list with the lengths it wrote.
    let mut reply = TransportHeader::default();
    reply.chunks.clone_from(&h.chunks);
    reply.chunks.write_chunk_mut(1).unwrap()[1].length = 0;
    assert_eq!(reply.chunks.write_chunk_mut(1).unwrap()[0].handle, 0x201);
    assert!(reply.chunks.write_chunk_mut(2).is_none());
    assert!(reply.chunks.reply_mut().is_none());
    let lens: Vec<u64> = reply.chunks.write_chunks().map(|c| c.len_bytes()).collect();
    assert_eq!(lens, [24576, 0]);
}

// RDMA_MSG call offering a two-segment reply chunk (RFC 5666 s5.2).
#[rustfmt::skip]
const MSG_REPLY_CHUNK: [u8; 64] = [
    0xde, 0xad, 0xbe, 0xef, // xid
    0x00, 0x00, 0x00, 0x01, // vers 1
    0x00, 0x00, 0x00, 0x01, // credits 1
    0x00, 0x00, 0x00, 0x00, // RDMA_MSG
    0x00, 0x00, 0x00, 0x00, // read list: empty
    0x00, 0x00, 0x00, 0x00, // write list: empty
    0x00, 0x00, 0x00, 0x01, // reply chunk: present
    0x00, 0x00, 0x00, 0x02, //   2 segments
    0x11, 0x22, 0x33, 0x44, 0x00, 0x01, 0x00, 0x00, // handle, length 65536
    0x00, 0x00, 0x7f, 0x00, 0x00, 0x00, 0x00, 0x00, // offset
    0x11, 0x22, 0x33, 0x45, 0x00, 0x00, 0x80, 0x00, // handle, length 32768
    0x00, 0x00, 0x7f, 0x00, 0x00, 0x01, 0x00, 0x00, // offset
];

#[test]
fn golden_msg_reply_chunk() {
    let mut h = TransportHeader::new(0xdead_beef, 1, MessageBody::Msg);
    h.chunks.set_reply(&[
        seg(0x1122_3344, 65536, 0x7f00_0000_0000),
        seg(0x1122_3345, 32768, 0x7f00_0001_0000),
    ]);
    check_golden(&MSG_REPLY_CHUNK, 64, &h);
    assert_eq!(h.chunks.reply().map(|r| r.len_bytes()), Some(98304));
    h.chunks.reply_mut().unwrap()[1].length = 100;
    assert_eq!(h.chunks.reply().map(|r| r.len_bytes()), Some(65636));
    h.chunks.clear_reply();
    assert!(h.chunks.reply().is_none() && h.chunks.is_empty());
}

// RDMA_NOMSG long call: the whole RPC call in a position-zero read chunk
// (RFC 5666 s5.1), plus a reply chunk for the long reply.
#[rustfmt::skip]
const NOMSG_POSITION_ZERO: [u8; 72] = [
    0x00, 0x00, 0x00, 0x07, // xid 7
    0x00, 0x00, 0x00, 0x01, // vers 1
    0x00, 0x00, 0x00, 0x10, // credits 16
    0x00, 0x00, 0x00, 0x01, // RDMA_NOMSG
    0x00, 0x00, 0x00, 0x01, // read list: present
    0x00, 0x00, 0x00, 0x00, //   position 0
    0x00, 0x00, 0x0c, 0x01, //   handle
    0x00, 0x00, 0x30, 0x00, //   length 12288
    0x00, 0x00, 0x00, 0x00, 0x00, 0x50, 0x00, 0x00, // offset
    0x00, 0x00, 0x00, 0x00, //   end of read list
    0x00, 0x00, 0x00, 0x00, // write list: empty
    0x00, 0x00, 0x00, 0x01, // reply chunk: present
    0x00, 0x00, 0x00, 0x01, //   1 segment
    0x00, 0x00, 0x0c, 0x02, 0x00, 0x00, 0x80, 0x00, // handle, length 32768
    0x00, 0x00, 0x00, 0x00, 0x00, 0x60, 0x00, 0x00, // offset
];

#[test]
fn golden_nomsg_position_zero() {
    let mut h = TransportHeader::new(7, 16, MessageBody::NoMsg);
    h.chunks.push_read(rseg(0, 0xc01, 12288, 0x50_0000));
    h.chunks.set_reply(&[seg(0xc02, 32768, 0x60_0000)]);
    check_golden(&NOMSG_POSITION_ZERO, 72, &h);
    // The same read list in an RDMA_MSG is refused: the inline message
    // itself starts at position zero.
    let mut msg = NOMSG_POSITION_ZERO;
    msg[15] = 0;
    assert_eq!(TransportHeader::parse(&msg, &L), Err(Error::Malformed));
    let mut as_msg = h.clone();
    as_msg.body = MessageBody::Msg;
    assert_eq!(as_msg.emit(&mut [0u8; 128]), Err(Error::Malformed));
}

// RDMA_MSGP (RFC 5666 s4.3): align and thresh come before the chunk lists.
#[rustfmt::skip]
const MSGP: [u8; 36] = [
    0x00, 0x00, 0x01, 0x00, // xid 256
    0x00, 0x00, 0x00, 0x01, // vers 1
    0x00, 0x00, 0x00, 0x04, // credits 4
    0x00, 0x00, 0x00, 0x02, // RDMA_MSGP
    0x00, 0x00, 0x10, 0x00, // rdma_align 4096
    0x00, 0x00, 0x04, 0x00, // rdma_thresh 1024
    0x00, 0x00, 0x00, 0x00, // read list: empty
    0x00, 0x00, 0x00, 0x00, // write list: empty
    0x00, 0x00, 0x00, 0x00, // reply chunk: absent
];

#[test]
fn golden_msgp_and_padding_rule() {
    let h = TransportHeader::new(
        256,
        4,
        MessageBody::MsgP {
            align: 4096,
            thresh: 1024,
        },
    );
    check_golden(&MSGP, 36, &h);
    let p = h.padding().unwrap();
    assert_eq!(
        p,
        Padding {
            align: 4096,
            thresh: 1024
        }
    );
    // NFS WRITE data whose bytes would start at offset 36 + 120 in the Send:
    // pad up to 4096.
    assert_eq!(p.pad_len(156, 8192), Ok(4096 - 156));
    assert_eq!(p.pad_len(4096, 8192), Ok(0));
    assert_eq!(p.pad_len(156, 1024), Ok(4096 - 156)); // at the threshold
    assert_eq!(p.pad_len(156, 1023), Ok(0)); // below it
    let no_align = Padding {
        align: 0,
        thresh: 0,
    };
    assert_eq!(no_align.pad_len(7, 100), Ok(0));
    let odd = Padding {
        align: 6,
        thresh: 0,
    };
    assert_eq!(odd.pad_len(8, 100), Err(Error::Malformed));
    assert_eq!(TransportHeader::new(1, 1, MessageBody::Msg).padding(), None);
}

// RDMA_ERROR / ERR_VERS: supported versions 1..=1.
#[rustfmt::skip]
const ERR_VERS: [u8; 28] = [
    0x00, 0x00, 0x00, 0x63, // xid 99
    0x00, 0x00, 0x00, 0x01, // vers 1
    0x00, 0x00, 0x00, 0x01, // credits 1
    0x00, 0x00, 0x00, 0x04, // RDMA_ERROR
    0x00, 0x00, 0x00, 0x01, // ERR_VERS
    0x00, 0x00, 0x00, 0x01, // low 1
    0x00, 0x00, 0x00, 0x01, // high 1
];

#[test]
fn golden_err_vers() {
    let h = TransportHeader::new(
        99,
        1,
        MessageBody::Error(ErrorBody::Vers { low: 1, high: 1 }),
    );
    check_golden(&ERR_VERS, 28, &h);
}

// RDMA_ERROR / ERR_CHUNK.
#[rustfmt::skip]
const ERR_CHUNK: [u8; 20] = [
    0x00, 0x00, 0x00, 0x64, // xid 100
    0x00, 0x00, 0x00, 0x01, // vers 1
    0x00, 0x00, 0x00, 0x00, // credits 0
    0x00, 0x00, 0x00, 0x04, // RDMA_ERROR
    0x00, 0x00, 0x00, 0x02, // ERR_CHUNK
];

#[test]
fn golden_err_chunk() {
    let h = TransportHeader::new(100, 0, MessageBody::Error(ErrorBody::Chunk));
    check_golden(&ERR_CHUNK, 20, &h);
}

// RDMA_DONE (RFC 5666 s3.8): the fixed words only.
#[rustfmt::skip]
const DONE: [u8; 16] = [
    0x00, 0x00, 0x00, 0x65, // xid 101
    0x00, 0x00, 0x00, 0x01, // vers 1
    0x00, 0x00, 0x00, 0x02, // credits 2
    0x00, 0x00, 0x00, 0x03, // RDMA_DONE
];

#[test]
fn golden_done() {
    let h = TransportHeader::new(101, 2, MessageBody::Done);
    check_golden(&DONE, 16, &h);
}

// RDMA_MSG followed by a real ONC RPC call (RFC 5531): NFSv3 NULL with
// AUTH_NONE credential and verifier.
#[rustfmt::skip]
const MSG_WITH_RPC_CALL: [u8; 68] = [
    0x5e, 0xed, 0x00, 0x01, // xid
    0x00, 0x00, 0x00, 0x01, // vers 1
    0x00, 0x00, 0x00, 0x80, // credits 128
    0x00, 0x00, 0x00, 0x00, // RDMA_MSG
    0x00, 0x00, 0x00, 0x00, // read list: empty
    0x00, 0x00, 0x00, 0x00, // write list: empty
    0x00, 0x00, 0x00, 0x00, // reply chunk: absent
    // ONC RPC call
    0x5e, 0xed, 0x00, 0x01, // xid (same)
    0x00, 0x00, 0x00, 0x00, // CALL
    0x00, 0x00, 0x00, 0x02, // rpcvers 2
    0x00, 0x01, 0x86, 0xa3, // prog 100003 (NFS)
    0x00, 0x00, 0x00, 0x03, // vers 3
    0x00, 0x00, 0x00, 0x00, // proc 0 (NULL)
    0x00, 0x00, 0x00, 0x00, // cred AUTH_NONE
    0x00, 0x00, 0x00, 0x00, //   length 0
    0x00, 0x00, 0x00, 0x00, // verf AUTH_NONE
    0x00, 0x00, 0x00, 0x00, //   length 0
];

#[test]
fn golden_msg_with_rpc_call_and_xid_check() {
    let h = TransportHeader::new(0x5eed_0001, 128, MessageBody::Msg);
    check_golden(&MSG_WITH_RPC_CALL, 28, &h);
    let (p, len) = TransportHeader::parse(&MSG_WITH_RPC_CALL, &L).unwrap();
    assert_eq!(p.check_rpc_xid(&MSG_WITH_RPC_CALL, len), Ok(()));
    assert_eq!(rpc_xid_at(&MSG_WITH_RPC_CALL, len), Some(0x5eed_0001));

    let mut bad = MSG_WITH_RPC_CALL;
    bad[31] ^= 1; // RPC xid differs from the header's
    let (p, len) = TransportHeader::parse(&bad, &L).unwrap();
    assert_eq!(p.check_rpc_xid(&bad, len), Err(Error::Malformed));
    // No RPC message after an RDMA_MSG header.
    assert_eq!(p.check_rpc_xid(&bad[..len + 3], len), Err(Error::Truncated));
    assert_eq!(rpc_xid_at(&bad, usize::MAX), None);
    // Types without an inline message have nothing to check.
    let done = TransportHeader::new(1, 1, MessageBody::Done);
    assert_eq!(done.check_rpc_xid(&DONE, 16), Ok(()));
}

#[test]
fn golden_msgp_with_rpc_xid() {
    let mut msg = MSGP.to_vec();
    msg.extend_from_slice(&[0x00, 0x00, 0x01, 0x00, 0, 0, 0, 0]);
    let (h, len) = TransportHeader::parse(&msg, &L).unwrap();
    assert_eq!(len, 36);
    assert_eq!(h.check_rpc_xid(&msg, len), Ok(()));
}

#[test]
fn error_other_code_round_trips_and_refuses_known_codes() {
    let mut bytes = ERR_CHUNK.to_vec();
    bytes[19] = 9; // unknown code: eight words follow (RFC 5666 s4.3)
    for w in 1..=8u8 {
        bytes.extend_from_slice(&[0, 0, 0, w]);
    }
    let extra = [1, 2, 3, 4, 5, 6, 7, 8];
    let h = TransportHeader::new(
        100,
        0,
        MessageBody::Error(ErrorBody::Other { code: 9, extra }),
    );
    check_golden(&bytes, 52, &h);
    let bad = TransportHeader::new(
        1,
        0,
        MessageBody::Error(ErrorBody::Other { code: 2, extra }),
    );
    assert_eq!(bad.emit(&mut [0u8; 64]), Err(Error::Malformed));
}

// ---------------------------------------------------------------------------
// Outcomes the engine answers

#[test]
fn unknown_proc_type_is_answerable_with_err_chunk() {
    let mut bytes = DONE;
    bytes[15] = 7;
    let (h, len) = TransportHeader::parse(&bytes, &L).unwrap();
    assert_eq!(h.body, MessageBody::Unknown { proc_type: 7 });
    assert_eq!((h.xid, len), (101, 16));
    assert!(h.chunks.is_empty());
    fuzz_parse(&bytes);
}

#[test]
fn other_version_is_answerable_with_err_vers() {
    let mut bytes = MSG_TWO_READ_CHUNKS;
    bytes[7] = 2;
    let mut scratch = TransportHeader::default();
    scratch.parse_into(&MSG_TWO_READ_CHUNKS, &L).unwrap();
    assert_eq!(
        scratch.parse_into(&bytes, &L),
        Ok(Decoded::UnsupportedVersion {
            xid: 0x1234_5678,
            vers: 2
        })
    );
    assert!(scratch.chunks.is_empty());
    assert_eq!(TransportHeader::parse(&bytes, &L), Err(Error::UnknownValue));
    // Only the fixed words are needed for the answer.
    let mut h = TransportHeader::default();
    assert_eq!(
        h.parse_into(&bytes[..16], &L),
        Ok(Decoded::UnsupportedVersion {
            xid: 0x1234_5678,
            vers: 2
        })
    );
    fuzz_parse(&bytes);
}

#[test]
fn header_view_gives_xid_when_chunk_lists_are_broken() {
    let mut bytes = MSG_TWO_READ_CHUNKS;
    bytes[23] = 0x81; // misaligned position
    assert_eq!(TransportHeader::parse(&bytes, &L), Err(Error::Malformed));
    let view = HeaderView::new_checked(&bytes[..]).unwrap();
    assert_eq!(view.xid(), 0x1234_5678);
    assert_eq!(view.payload().len(), 84);
    assert_eq!(
        HeaderView::new_checked(&bytes[..15]).err(),
        Some(Error::Truncated)
    );
    assert_eq!(HeaderView::new_unchecked(&bytes[..3]).xid(), 0);
}

// ---------------------------------------------------------------------------
// Hostile inputs

/// Fixed words of an RDMA_MSG (or other `proc`) header.
fn fixed(proc: u32) -> Vec<u8> {
    let mut v = Vec::new();
    for w in [0xabcd_0001u32, 1, 8, proc] {
        v.extend_from_slice(&w.to_be_bytes());
    }
    v
}

fn words(v: &mut Vec<u8>, ws: &[u32]) {
    for w in ws {
        v.extend_from_slice(&w.to_be_bytes());
    }
}

fn read_entry(v: &mut Vec<u8>, position: u32, length: u32) {
    words(v, &[1, position, 0x77, length, 0, 0x1000]);
}

fn parse_err(bytes: &[u8]) -> Error {
    fuzz_parse(bytes);
    TransportHeader::parse(bytes, &L).expect_err("must fail")
}

#[test]
fn hostile_all_ones_counts_and_discriminators() {
    // Read list "present" word of 0xFFFFFFFF.
    let mut b = fixed(0);
    words(&mut b, &[0xffff_ffff, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(parse_err(&b), Error::UnknownValue);
    // Write chunk segment count of 0xFFFFFFFF.
    let mut b = fixed(0);
    words(&mut b, &[0, 1, 0xffff_ffff, 0, 0, 0, 0, 0, 0]);
    assert_eq!(parse_err(&b), Error::LimitExceeded);
    // Write list "present" word of 0xFFFFFFFF.
    let mut b = fixed(0);
    words(&mut b, &[0, 0xffff_ffff, 0, 0]);
    assert_eq!(parse_err(&b), Error::UnknownValue);
    // Reply chunk segment count of 0xFFFFFFFF.
    let mut b = fixed(0);
    words(&mut b, &[0, 0, 1, 0xffff_ffff, 0, 0, 0, 0]);
    assert_eq!(parse_err(&b), Error::LimitExceeded);
    // Counts within the limit but beyond the input.
    let mut b = fixed(0);
    words(&mut b, &[0, 1, 3, 0, 0, 0, 0]);
    assert_eq!(parse_err(&b), Error::LimitExceeded);
    // A write list whose chunk count word is huge even with generous limits.
    let huge = Limits {
        max_segments_per_chunk: usize::MAX,
        ..L
    };
    let mut b = fixed(0);
    words(&mut b, &[0, 1, 0xffff_ffff, 0]);
    let mut h = TransportHeader::default();
    assert_eq!(h.parse_into(&b, &huge), Err(Error::LimitExceeded));
    assert_eq!(h.chunks.write_segments.capacity(), 0);
}

#[test]
fn hostile_read_positions() {
    // Descending across chunks.
    let mut b = fixed(0);
    read_entry(&mut b, 64, 10);
    read_entry(&mut b, 32, 10);
    words(&mut b, &[0, 0, 0]);
    assert_eq!(parse_err(&b), Error::Malformed);
    // Back to an earlier chunk's position after a later one.
    let mut b = fixed(0);
    read_entry(&mut b, 32, 10);
    read_entry(&mut b, 64, 10);
    read_entry(&mut b, 32, 10);
    words(&mut b, &[0, 0, 0]);
    assert_eq!(parse_err(&b), Error::Malformed);
    // Misaligned.
    for pos in [1, 2, 3, 6, 0xffff_fffd] {
        let mut b = fixed(0);
        read_entry(&mut b, pos, 10);
        words(&mut b, &[0, 0, 0]);
        assert_eq!(parse_err(&b), Error::Malformed, "position {pos}");
    }
    // Position zero outside RDMA_NOMSG (here RDMA_MSGP).
    let mut b = fixed(2);
    words(&mut b, &[4096, 1024]);
    read_entry(&mut b, 0, 10);
    words(&mut b, &[0, 0, 0]);
    assert_eq!(parse_err(&b), Error::Malformed);
    // Position zero then a later chunk in RDMA_NOMSG is fine.
    let mut b = fixed(1);
    read_entry(&mut b, 0, 100);
    read_entry(&mut b, 0, 100);
    read_entry(&mut b, 48, 8192);
    words(&mut b, &[0, 0, 0]);
    let (h, _) = TransportHeader::parse(&b, &L).unwrap();
    assert_eq!(h.chunks.read_chunks().count(), 2);
}

#[test]
fn hostile_lists_one_over_the_limit() {
    // Read list: exactly the limit parses, one more does not.
    for (n, ok) in [
        (L.max_read_segments, true),
        (L.max_read_segments + 1, false),
    ] {
        let mut b = fixed(0);
        for _ in 0..n {
            read_entry(&mut b, 4, 1);
        }
        words(&mut b, &[0, 0, 0]);
        let r = TransportHeader::parse(&b, &L);
        assert_eq!(r.is_ok(), ok, "{n} read segments");
        if !ok {
            assert_eq!(parse_err(&b), Error::LimitExceeded);
        }
    }
    // Write chunks.
    for (n, ok) in [(L.max_write_chunks, true), (L.max_write_chunks + 1, false)] {
        let mut b = fixed(0);
        words(&mut b, &[0]);
        for _ in 0..n {
            words(&mut b, &[1, 1, 9, 100, 0, 0]);
        }
        words(&mut b, &[0, 0]);
        assert_eq!(TransportHeader::parse(&b, &L).is_ok(), ok, "{n} chunks");
        if !ok {
            assert_eq!(parse_err(&b), Error::LimitExceeded);
        }
    }
    // Segments in one write chunk, and in the reply chunk.
    for reply in [false, true] {
        let max = if reply {
            L.max_reply_segments
        } else {
            L.max_segments_per_chunk
        };
        for (n, ok) in [(max, true), (max + 1, false)] {
            let mut b = fixed(0);
            if reply {
                words(&mut b, &[0, 0, 1, n as u32]);
            } else {
                words(&mut b, &[0, 1, n as u32]);
            }
            for _ in 0..n {
                words(&mut b, &[9, 100, 0, 0]);
            }
            if !reply {
                words(&mut b, &[0, 0]);
            }
            assert_eq!(TransportHeader::parse(&b, &L).is_ok(), ok);
            if !ok {
                assert_eq!(parse_err(&b), Error::LimitExceeded);
            }
        }
    }
}

#[test]
fn hostile_length_sums_that_overflow() {
    // Two segments of one read chunk adding past u32::MAX.
    let mut b = fixed(0);
    read_entry(&mut b, 8, 0xffff_ffff);
    read_entry(&mut b, 8, 1);
    words(&mut b, &[0, 0, 0]);
    assert_eq!(parse_err(&b), Error::LimitExceeded);
    // The same lengths in two different chunks are fine.
    let mut b = fixed(0);
    read_entry(&mut b, 8, 0xffff_ffff);
    read_entry(&mut b, 12, 0xffff_ffff);
    words(&mut b, &[0, 0, 0]);
    let (h, _) = TransportHeader::parse(&b, &L).unwrap();
    let total: u64 = h.chunks.read_chunks().map(|c| c.len_bytes()).sum();
    assert_eq!(total, 2 * 0xffff_ffff);
    // Write chunk and reply chunk.
    let mut b = fixed(0);
    words(
        &mut b,
        &[0, 1, 2, 1, 0x8000_0000, 0, 0, 2, 0x8000_0000, 0, 0, 0, 0],
    );
    assert_eq!(parse_err(&b), Error::LimitExceeded);
    let mut b = fixed(0);
    words(&mut b, &[0, 0, 1, 2, 1, 0xffff_fff0, 0, 0, 2, 0x10, 0, 0]);
    assert_eq!(parse_err(&b), Error::LimitExceeded);
    // The emitter refuses the same.
    let mut h = TransportHeader::new(1, 1, MessageBody::Msg);
    h.chunks.set_reply(&[seg(1, u32::MAX, 0), seg(2, 1, 0)]);
    assert_eq!(h.emit(&mut [0u8; 256]), Err(Error::LimitExceeded));
}

#[test]
fn empty_write_chunk_accepted_empty_reply_chunk_refused() {
    let mut b = fixed(0);
    words(&mut b, &[0, 1, 0, 0, 0]);
    let (h, len) = TransportHeader::parse(&b, &L).unwrap();
    assert_eq!(len, b.len());
    assert_eq!(h.chunks.write_chunk_count(), 1);
    assert!(h.chunks.write_chunks().next().unwrap().segments.is_empty());
    fuzz_parse(&b);

    let mut b = fixed(0);
    words(&mut b, &[0, 0, 1, 0]);
    assert_eq!(parse_err(&b), Error::Malformed);
    let mut h = TransportHeader::new(1, 1, MessageBody::NoMsg);
    h.chunks.set_reply(&[]);
    assert_eq!(h.emit(&mut [0u8; 64]), Err(Error::Malformed));
}

#[test]
fn emitter_refuses_what_parse_would_refuse() {
    let mut buf = [0u8; 256];
    // Chunk lists on a body that has none.
    let mut h = TransportHeader::new(1, 1, MessageBody::Done);
    h.chunks.push_read(rseg(4, 1, 1, 0));
    assert_eq!(h.emit(&mut buf), Err(Error::Malformed));
    // Descending and misaligned positions.
    let mut h = TransportHeader::new(1, 1, MessageBody::Msg);
    h.chunks.push_read(rseg(8, 1, 1, 0));
    h.chunks.push_read(rseg(4, 1, 1, 0));
    assert_eq!(h.emit(&mut buf), Err(Error::Malformed));
    let mut h = TransportHeader::new(1, 1, MessageBody::Msg);
    h.chunks.push_read(rseg(5, 1, 1, 0));
    assert_eq!(h.emit(&mut buf), Err(Error::Malformed));
    // A catch-all type spelling a known number would re-parse differently.
    let h = TransportHeader::new(1, 1, MessageBody::Unknown { proc_type: 0 });
    assert_eq!(h.emit(&mut buf), Err(Error::Malformed));
    assert!(buf.iter().all(|&b| b == 0), "nothing written on error");
}

#[test]
fn trailing_bytes_after_header_only_messages_are_left_to_the_caller() {
    let mut b = ERR_CHUNK.to_vec();
    b.extend_from_slice(&[1, 2, 3, 4]);
    assert_eq!(TransportHeader::parse(&b, &L).map(|(_, n)| n), Ok(20));
}

// ---------------------------------------------------------------------------
// Memory: reuse without growth

#[test]
fn reused_header_never_grows_beyond_limits() {
    let mut scratch = TransportHeader::default();
    let mut biggest = fixed(0);
    for _ in 0..L.max_read_segments {
        read_entry(&mut biggest, 4, 1);
    }
    words(&mut biggest, &[0]);
    for _ in 0..L.max_write_chunks {
        words(&mut biggest, &[1, L.max_segments_per_chunk as u32]);
        for _ in 0..L.max_segments_per_chunk {
            words(&mut biggest, &[1, 1, 0, 0]);
        }
    }
    words(&mut biggest, &[0, 1, L.max_reply_segments as u32]);
    for _ in 0..L.max_reply_segments {
        words(&mut biggest, &[1, 1, 0, 0]);
    }
    let inputs: [&[u8]; 6] = [
        &MSG_TWO_READ_CHUNKS,
        &biggest,
        &MSG_WRITE_LIST,
        &DONE,
        &biggest,
        &NOMSG_POSITION_ZERO,
    ];
    let caps = |h: &TransportHeader| {
        (
            h.chunks.reads.capacity(),
            h.chunks.write_segments.capacity(),
            h.chunks.write_counts.capacity(),
            h.chunks.reply.capacity(),
        )
    };
    let max_caps = (
        L.max_read_segments,
        L.max_write_chunks * L.max_segments_per_chunk,
        L.max_write_chunks,
        L.max_reply_segments,
    );
    let mut warmed = None;
    for round in 0..3 {
        for input in inputs {
            scratch.parse_into(input, &L).unwrap();
            let c = caps(&scratch);
            assert!(c.0 <= max_caps.0 && c.1 <= max_caps.1, "{c:?}");
            assert!(c.2 <= max_caps.2 && c.3 <= max_caps.3, "{c:?}");
        }
        if round == 0 {
            warmed = Some(caps(&scratch));
        } else {
            assert_eq!(Some(caps(&scratch)), warmed, "no growth once warm");
        }
    }
    // Pre-sized: parsing never reallocates.
    let mut sized = TransportHeader::with_capacity(&L);
    let before = caps(&sized);
    assert_eq!(before, max_caps);
    for input in inputs {
        sized.parse_into(input, &L).unwrap();
        assert_eq!(caps(&sized), before);
    }
}

// ---------------------------------------------------------------------------
// RFC 8797 private data

#[rustfmt::skip]
const PRIVATE_DATA: [u8; 8] = [
    0xf6, 0xab, 0x0e, 0x18, // magic
    0x01,                   // version 1
    0x01,                   // flags: remote invalidation supported
    0x03,                   // send size code 3: 4096 bytes
    0x0f,                   // recv size code 15: 16384 bytes
];

#[test]
fn golden_private_data() {
    let pd = PrivateData {
        remote_invalidate: true,
        max_send_size: 4096,
        max_recv_size: 16384,
    };
    assert_eq!(PrivateData::parse(&PRIVATE_DATA), Some(pd));
    assert_eq!(pd.buffer_len(), 8);
    let mut buf = [0u8; 8];
    assert_eq!(pd.emit(&mut buf), Ok(8));
    assert_eq!(buf, PRIVATE_DATA);
    // CM private data areas are padded: trailing bytes are ignored.
    let mut padded = PRIVATE_DATA.to_vec();
    padded.resize(56, 0);
    assert_eq!(PrivateData::parse(&padded), Some(pd));
    // Unknown flag bits are ignored.
    let mut flags = PRIVATE_DATA;
    flags[5] = 0xfe;
    assert_eq!(
        PrivateData::parse(&flags).map(|p| p.remote_invalidate),
        Some(false)
    );
    // Extremes of the size code.
    let mut ext = PRIVATE_DATA;
    ext[6] = 0;
    ext[7] = 0xff;
    let p = PrivateData::parse(&ext).unwrap();
    assert_eq!((p.max_send_size, p.max_recv_size), (1024, 256 * 1024));
    fuzz_parse(&PRIVATE_DATA);
}

#[test]
fn invalid_private_data_means_defaults() {
    let mut magic = PRIVATE_DATA;
    magic[0] = 0;
    let mut vers = PRIVATE_DATA;
    vers[4] = 2;
    for bad in [&magic[..], &vers[..], &PRIVATE_DATA[..7], &[][..]] {
        assert_eq!(PrivateData::parse(bad), None);
        assert_eq!(PrivateData::parse_or_default(bad), PrivateData::DEFAULT);
    }
    assert_eq!(PrivateData::DEFAULT.max_send_size, 1024);
    // Sizes that no code expresses are refused on emit.
    for size in [0, 1000, 1025, 257 * 1024] {
        let pd = PrivateData {
            max_send_size: size,
            ..PrivateData::DEFAULT
        };
        assert_eq!(pd.emit(&mut [0u8; 8]), Err(Error::Malformed), "{size}");
    }
    assert_eq!(
        PrivateData::DEFAULT.emit(&mut [0u8; 7]),
        Err(Error::BufferTooShort)
    );
    assert_eq!(size_code(256 * 1024), Some(255));
}

// ---------------------------------------------------------------------------
// Property tests

fn arb_segment() -> impl Strategy<Value = Segment> {
    // Lengths below 2^24 so that no generated chunk overflows 32 bits.
    (any::<u32>(), 0u32..(1 << 24), any::<u64>()).prop_map(|(h, l, o)| seg(h, l, o))
}

fn arb_body() -> impl Strategy<Value = MessageBody> {
    prop_oneof![
        4 => Just(MessageBody::Msg),
        3 => Just(MessageBody::NoMsg),
        2 => (any::<u32>(), any::<u32>())
            .prop_map(|(align, thresh)| MessageBody::MsgP { align, thresh }),
        1 => Just(MessageBody::Done),
        1 => (any::<u32>(), any::<u32>())
            .prop_map(|(low, high)| MessageBody::Error(ErrorBody::Vers { low, high })),
        1 => Just(MessageBody::Error(ErrorBody::Chunk)),
        1 => (3u32.., any::<[u32; 8]>())
            .prop_map(|(code, extra)| MessageBody::Error(ErrorBody::Other { code, extra })),
        1 => (5u32..).prop_map(|proc_type| MessageBody::Unknown { proc_type }),
    ]
}

fn arb_header() -> impl Strategy<Value = TransportHeader> {
    let reads = proptest::collection::vec((0u32..3, arb_segment()), 0..=L.max_read_segments);
    let writes = proptest::collection::vec(
        proptest::collection::vec(arb_segment(), 0..=6),
        0..=L.max_write_chunks,
    );
    let reply = proptest::option::of(proptest::collection::vec(arb_segment(), 1..=8));
    (
        any::<u32>(),
        any::<u32>(),
        arb_body(),
        any::<bool>(),
        reads,
        writes,
        reply,
    )
        .prop_map(|(xid, credits, body, start_zero, reads, writes, reply)| {
            let mut h = TransportHeader::new(xid, credits, body);
            if body.has_chunk_lists() {
                // Ascending, 4-byte aligned positions; a step of 0 extends
                // the current chunk. Position zero only for RDMA_NOMSG.
                let mut pos = if start_zero && body == MessageBody::NoMsg {
                    0
                } else {
                    4
                };
                for (step, s) in reads {
                    pos += 4 * step;
                    h.chunks.push_read(ReadSegment {
                        position: pos,
                        segment: s,
                    });
                }
                for w in &writes {
                    h.chunks.push_write_chunk(w).unwrap();
                }
                if let Some(r) = reply {
                    h.chunks.set_reply(&r);
                }
            }
            h
        })
}

proptest! {
    #[test]
    fn prop_round_trip(h in arb_header()) {
        let n = h.buffer_len();
        let mut buf = vec![0u8; n + 8];
        prop_assert_eq!(h.emit(&mut buf), Ok(n));
        let (p, len) = TransportHeader::parse(&buf[..n], &L).unwrap();
        prop_assert_eq!(len, n);
        prop_assert_eq!(&p, &h);
        fuzz_parse(&buf[..n]);
    }

    #[test]
    fn prop_parse_into_warmed_equals_parse(a in arb_header(), b in arb_header()) {
        let mut scratch = TransportHeader::default();
        for h in [&a, &b, &a] {
            let mut buf = vec![0u8; h.buffer_len()];
            h.emit(&mut buf).unwrap();
            prop_assert_eq!(
                scratch.parse_into(&buf, &L),
                Ok(Decoded::Header { len: buf.len() })
            );
            prop_assert_eq!(&scratch, h);
        }
    }

    /// `parse_into`'s shortcut (a Version One RDMA_MSG with three empty
    /// lists) decodes exactly what the general decode does, on inputs
    /// that take it and on near misses (a flipped bit anywhere in the
    /// first 28 bytes, any trailing bytes, a header cut short), starting
    /// from a scratch header that held lists before.
    #[test]
    fn prop_shortcut_parse_is_the_general_parse(
        xid in any::<u32>(),
        credits in any::<u32>(),
        flip in proptest::option::of((0usize..28, 0u8..8)),
        cut in proptest::option::of(0usize..28),
        rest in proptest::collection::vec(any::<u8>(), 0..16),
        warm in arb_header(),
    ) {
        let mut bytes = Vec::new();
        for w in [xid, RPCRDMA_VERSION, credits, proc_type::RDMA_MSG, 0, 0, 0] {
            bytes.extend_from_slice(&w.to_be_bytes());
        }
        if let Some((at, bit)) = flip {
            bytes[at] ^= 1 << bit;
        }
        bytes.extend_from_slice(&rest);
        if let Some(n) = cut {
            bytes.truncate(n);
        }
        let mut warm_buf = vec![0u8; warm.buffer_len()];
        warm.emit(&mut warm_buf).unwrap();
        let (mut fast, mut general) = (TransportHeader::default(), TransportHeader::default());
        for h in [&mut fast, &mut general] {
            h.parse_into(&warm_buf, &L).unwrap();
        }
        let a = fast.parse_into(&bytes, &L);
        let b = general.parse_into_general(&bytes, &L);
        prop_assert_eq!(a, b);
        if a.is_ok() {
            prop_assert_eq!(&fast, &general);
        }
    }

    /// `encode`'s shortcut writes the seven words the general encoder
    /// writes for the same header.
    #[test]
    fn prop_shortcut_encode_is_the_general_encode(
        xid in any::<u32>(),
        vers in any::<u32>(),
        credits in any::<u32>(),
        room in 0usize..40,
    ) {
        let mut h = TransportHeader::new(xid, credits, MessageBody::Msg);
        h.vers = vers;
        let mut want = vec![0u8; 28];
        let mut e = Encoder::new(&mut want);
        for w in [xid, vers, credits, proc_type::RDMA_MSG, 0, 0, 0] {
            e.put_u32(w).unwrap();
        }
        let mut got = vec![0xAAu8; room];
        let r = h.emit(&mut got);
        if room < 28 {
            prop_assert_eq!(r, Err(Error::BufferTooShort));
            prop_assert!(got.iter().all(|&b| b == 0xAA));
        } else {
            prop_assert_eq!(r, Ok(28));
            prop_assert_eq!(&got[..28], &want[..]);
        }
    }

    #[test]
    fn prop_arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..512)) {
        fuzz_parse(&data);
    }

    #[test]
    fn prop_mutated_headers_never_panic(
        h in arb_header(),
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6),
        cut in any::<usize>(),
    ) {
        let mut buf = vec![0u8; h.buffer_len()];
        h.emit(&mut buf).unwrap();
        for (at, v) in flips {
            let i = at % buf.len();
            buf[i] = v;
        }
        fuzz_parse(&buf);
        fuzz_parse(&buf[..cut % (buf.len() + 1)]);
    }

    #[test]
    fn prop_private_data_round_trip(inv in any::<bool>(), s in any::<u8>(), r in any::<u8>()) {
        let pd = PrivateData {
            remote_invalidate: inv,
            max_send_size: (u32::from(s) + 1) * 1024,
            max_recv_size: (u32::from(r) + 1) * 1024,
        };
        let mut buf = [0u8; 8];
        prop_assert_eq!(pd.emit(&mut buf), Ok(8));
        prop_assert_eq!(PrivateData::parse(&buf), Some(pd));
    }
}

#[test]
fn rfc5666_s4_3_chunked_header_len_matches_emitted_headers() {
    for (reads, writes, reply) in [
        (0usize, &[][..], None),
        (1, &[1usize][..], None),
        (2, &[2, 1][..], Some(1usize)),
        (0, &[1][..], Some(3)),
    ] {
        let mut h = TransportHeader::new(7, 1, MessageBody::NoMsg);
        for i in 0..reads {
            h.chunks.push_read(rseg(0, 1, 4, 8 * i as u64));
        }
        for &n in writes {
            let segs: Vec<Segment> = (0..n).map(|i| seg(2, 4, i as u64)).collect();
            h.chunks.push_write_chunk(&segs).unwrap();
        }
        if let Some(n) = reply {
            let segs: Vec<Segment> = (0..n).map(|i| seg(3, 4, i as u64)).collect();
            h.chunks.set_reply(&segs);
        }
        let want = chunked_header_len(reads, writes.len(), writes.iter().sum(), reply);
        assert_eq!(h.buffer_len(), want);
        let mut buf = vec![0u8; want];
        assert_eq!(h.emit(&mut buf).unwrap(), want);
    }
}
