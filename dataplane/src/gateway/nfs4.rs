//! The DDP-eligible results of an NFSv4.x COMPOUND reply (RFC 8267 s5):
//! the data of each READ and the link text of each READLINK, in operation
//! order, found by walking the result array. The engine pairs the Nth
//! with the client's Nth write chunk.
//!
//! ```text
//! COMPOUND4res = nfsstat4 status, utf8str_cs tag<>, nfs_resop4 resarray<>
//! nfs_resop4   = nfs_opnum4 resop, then that operation's result
//! READ4res     = nfsstat4 status; NFS4_OK: bool eof, opaque data<>
//! READLINK4res = nfsstat4 status; NFS4_OK: linktext4 link (opaque<>)
//! ```
//!
//! The walk knows the results that go around a READ in what clients send
//! (Linux: SEQUENCE, PUTFH, READ; NFSv4.0: PUTFH, READ; GETATTR and GETFH
//! here and there; LOOKUP, SAVEFH and RESTOREFH between the READs of
//! two files). A
//! failed operation ends the COMPOUND (RFC 8881 s16.2.3) and the walk
//! with the items found before it. A result the walk does not know, or
//! bytes that do not parse, end it too: the items before it are sound
//! (their offsets do not depend on what follows), and a READ after it
//! travels in place, its write chunk returned empty (RFC 5666 s3.6).
//! Past [`MAX_DDP_ITEMS`](crate::engine::MAX_DDP_ITEMS) READ-like
//! results, the later ones travel in place.
//!
//! Total on any bytes: every length is checked against what is left.

use crate::engine::{DdpItem, DdpItems};
use crate::wire::rpc::{AcceptStatus, ReplyBody, ReplyHeader};
use crate::wire::xdr::Decoder;

/// COMPOUND, the only NFSv4 procedure besides NULL.
pub(super) const NFSPROC4_COMPOUND: u32 = 1;

const OP_GETATTR: u32 = 9;
const OP_GETFH: u32 = 10;
const OP_LOOKUP: u32 = 15;
const OP_PUTFH: u32 = 22;
const OP_PUTPUBFH: u32 = 23;
const OP_PUTROOTFH: u32 = 24;
const OP_READ: u32 = 25;
const OP_READLINK: u32 = 27;
const OP_RESTOREFH: u32 = 31;
const OP_SAVEFH: u32 = 32;
const OP_SEQUENCE: u32 = 53;

/// Bounds from the protocol: a file handle is at most 128 bytes (RFC 8881
/// s2.2.14); a tag, a bitmap and an attribute list are not bounded there,
/// so the bound is the message.
const NFS4_FHSIZE: usize = 128;

/// The DDP items of an NFSv4 reply `message` (RPC header included) to a
/// COMPOUND: its successful READs and READLINKs, in order.
pub(super) fn compound_reply_ddp(message: &[u8]) -> DdpItems {
    let mut items = DdpItems::NONE;
    // The walk stops at the first thing it cannot follow; what it found
    // before stands.
    let _ = walk(message, &mut items);
    items
}

fn walk(message: &[u8], items: &mut DdpItems) -> Option<()> {
    let (header, len) = ReplyHeader::parse(message).ok()?;
    match header.body {
        ReplyBody::Accepted(a) if a.status == AcceptStatus::Success => {}
        _ => return None,
    }
    let mut d = Decoder::new(message.get(len..)?);
    // The COMPOUND's own status is that of its last operation: a failed
    // COMPOUND may still hold a successful READ before the failure.
    let _status = d.get_u32().ok()?;
    let _tag = d.get_opaque(message.len()).ok()?;
    let ops = d.get_u32().ok()?;
    for _ in 0..ops {
        let op = d.get_u32().ok()?;
        let status = d.get_u32().ok()?;
        if status != 0 {
            return None;
        }
        match op {
            OP_READ | OP_READLINK => {
                if op == OP_READ {
                    let _eof = d.get_bool().ok()?;
                }
                let start = len + d.position() + 4;
                let data = d.get_opaque(message.len()).ok()?;
                let item = DdpItem {
                    offset: u32::try_from(start).ok()?,
                    len: u32::try_from(data.len()).ok()?,
                };
                if !items.push(item) {
                    return None;
                }
            }
            OP_SEQUENCE => {
                // sessionid (16), sequenceid, slotid, highest_slotid,
                // target_highest_slotid, status_flags.
                d.get_opaque_fixed(16 + 5 * 4).ok()?;
            }
            // Results that are their status alone.
            OP_PUTFH | OP_PUTPUBFH | OP_PUTROOTFH | OP_SAVEFH | OP_RESTOREFH | OP_LOOKUP => {}
            OP_GETFH => {
                d.get_opaque(NFS4_FHSIZE).ok()?;
            }
            OP_GETATTR => {
                let words = d.get_u32().ok()? as usize;
                d.get_opaque_fixed(words.checked_mul(4)?).ok()?;
                d.get_opaque(message.len()).ok()?;
            }
            _ => return None,
        }
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first item found, as the tests of one READ look at it.
    fn first(m: &[u8]) -> Option<DdpItem> {
        compound_reply_ddp(m).as_slice().first().copied()
    }

    /// An accepted, successful reply header (AUTH_NONE verifier).
    fn header(xid: u32) -> Vec<u8> {
        [xid, 1, 0, 0, 0, 0]
            .iter()
            .flat_map(|w| w.to_be_bytes())
            .collect()
    }

    fn words(out: &mut Vec<u8>, ws: &[u32]) {
        for w in ws {
            out.extend_from_slice(&w.to_be_bytes());
        }
    }

    fn opaque(out: &mut Vec<u8>, data: &[u8]) {
        words(out, &[data.len() as u32]);
        out.extend_from_slice(data);
        out.resize(out.len().next_multiple_of(4), 0);
    }

    /// SEQUENCE, PUTFH, GETATTR, READ of `data`, as Linux's v4.1 client
    /// gets it (GETATTR added to walk a variable result).
    fn linux_read_reply(data: &[u8]) -> (Vec<u8>, usize) {
        let mut m = header(7);
        words(&mut m, &[0]); // status
        opaque(&mut m, b"rd"); // tag
        words(&mut m, &[4]); // four results
        words(&mut m, &[OP_SEQUENCE, 0]);
        m.extend_from_slice(&[0xab; 16]);
        words(&mut m, &[1, 2, 3, 4, 0]);
        words(&mut m, &[OP_PUTFH, 0]);
        words(&mut m, &[OP_GETATTR, 0, 2, 0x10, 0x20]);
        opaque(&mut m, &[9; 12]);
        words(&mut m, &[OP_READ, 0, 1]); // eof
        let at = m.len() + 4;
        opaque(&mut m, data);
        (m, at)
    }

    #[test]
    fn the_first_read_result_is_found_after_sequence_putfh_getattr() {
        let data = b"hello, gateway";
        let (m, at) = linux_read_reply(data);
        let item = first(&m).expect("a DDP item");
        assert_eq!(item.offset as usize, at);
        assert_eq!(item.len as usize, data.len());
        assert_eq!(&m[at..at + data.len()], data);
        // An empty READ result is an item too (an empty write chunk).
        let (m, at) = linux_read_reply(b"");
        assert_eq!(
            first(&m),
            Some(DdpItem {
                offset: at as u32,
                len: 0
            })
        );
    }

    #[test]
    fn readlink_after_putfh_in_nfsv4_0() {
        let mut m = header(1);
        words(&mut m, &[0]);
        opaque(&mut m, b"");
        words(&mut m, &[2, OP_PUTFH, 0, OP_READLINK, 0]);
        let at = m.len() + 4;
        opaque(&mut m, b"../target");
        let item = first(&m).unwrap();
        assert_eq!((item.offset as usize, item.len), (at, 9));
    }

    #[test]
    fn failures_and_unknown_results_give_no_item() {
        // PUTFH failed: the COMPOUND stopped there.
        let mut m = header(1);
        words(&mut m, &[70, 0, 1, OP_PUTFH, 70]);
        assert_eq!(first(&m), None);
        // An operation the walk does not know before READ.
        let mut m = header(1);
        words(
            &mut m,
            &[0, 0, 2, 3 /* ACCESS */, 0, 0, 0, OP_READ, 0, 1, 0],
        );
        assert_eq!(first(&m), None);
        // Not a success at the RPC level.
        let mut m = header(1);
        m[20..24].copy_from_slice(&5u32.to_be_bytes());
        assert_eq!(first(&m), None);
    }

    #[test]
    fn every_truncation_and_a_lying_length_are_refused_without_panic() {
        let (m, _) = linux_read_reply(&[5; 40]);
        for cut in 0..m.len() {
            assert_eq!(first(&m[..cut]), None, "cut at {cut}");
        }
        let mut lying = m.clone();
        let n = lying.len();
        // The READ data length word says more than the message holds.
        lying[n - 44..n - 40].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(first(&lying), None);
    }

    #[test]
    fn every_read_and_readlink_is_an_item_in_operation_order() {
        // SEQUENCE, PUTFH, READ, SAVEFH, PUTFH, READLINK, RESTOREFH, READ:
        // three items, the Nth for the client's Nth write chunk.
        let mut m = header(3);
        words(&mut m, &[0]);
        opaque(&mut m, b"");
        words(&mut m, &[8, OP_SEQUENCE, 0]);
        m.extend_from_slice(&[1; 16]);
        words(&mut m, &[1, 2, 3, 4, 0, OP_PUTFH, 0, OP_READ, 0, 0]);
        let a = m.len() + 4;
        opaque(&mut m, b"first read");
        words(&mut m, &[OP_SAVEFH, 0, OP_PUTFH, 0, OP_READLINK, 0]);
        let b = m.len() + 4;
        opaque(&mut m, b"link");
        words(&mut m, &[OP_RESTOREFH, 0, OP_READ, 0, 1]);
        let c = m.len() + 4;
        opaque(&mut m, &[7; 33]);
        let items = compound_reply_ddp(&m);
        let got: Vec<(usize, u32)> = items
            .as_slice()
            .iter()
            .map(|d| (d.offset as usize, d.len))
            .collect();
        assert_eq!(got, [(a, 10), (b, 4), (c, 33)]);
        // What stands before a failure or an unknown result is kept: the
        // second READ failed, so the COMPOUND (and the walk) ended there.
        let mut m = header(4);
        words(&mut m, &[70, 0, 3, OP_PUTFH, 0, OP_READ, 0, 0]);
        let a = m.len() + 4;
        opaque(&mut m, b"ok");
        words(&mut m, &[OP_READ, 70]);
        let got: Vec<(usize, u32)> = compound_reply_ddp(&m)
            .as_slice()
            .iter()
            .map(|d| (d.offset as usize, d.len))
            .collect();
        assert_eq!(got, [(a, 2)]);
    }

    #[test]
    fn more_reads_than_the_engine_places_keep_the_first_ones() {
        let n = crate::engine::MAX_DDP_ITEMS + 2;
        let mut m = header(5);
        words(&mut m, &[0]);
        opaque(&mut m, b"");
        words(&mut m, &[n as u32 + 1, OP_PUTFH, 0]);
        for i in 0..n {
            words(&mut m, &[OP_READ, 0, 0]);
            opaque(&mut m, &[i as u8; 5]);
        }
        let items = compound_reply_ddp(&m);
        assert_eq!(items.as_slice().len(), crate::engine::MAX_DDP_ITEMS);
        for (i, d) in items.as_slice().iter().enumerate() {
            assert_eq!(m[d.offset as usize..][..5], [i as u8; 5]);
        }
    }
}
