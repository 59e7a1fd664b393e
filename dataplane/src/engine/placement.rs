//! Send-based data placement (draft-dnoveck-rpcrdma-rtrext-02, "rtrext",
//! s3.3, s5.3, s7): a DDP-eligible item travels in the Sends of a
//! transmission group, excised from the payload stream and laid into the
//! receiver's placement-targetable buffer segments, instead of being
//! pulled or pushed by RDMA (one round trip instead of two).
//!
//! This module is the arithmetic: which segments a receive buffer has
//! ([`TargetLayout`], the Receive Buffer Structure property of s8.3), how
//! a message with one placed item is laid out in Sends ([`plan`]), and
//! where each byte of a received item lands ([`ItemSpan`]). The engine
//! uses it in `continuation.rs` (framing), `requester.rs` and
//! `responder.rs` (when to place). docs/EXTENSIONS.md section 7 has the
//! rules and what we chose where the draft is silent.
//!
//! Layout of a transmission group with a placed item (ours; the draft
//! leaves the sender free as long as the receiver can find every byte):
//!
//! ```text
//! t0: header(dp = one TBSN item) | payload stream (the whole message
//!     without the item) | .. | item in target segments from the first
//!     one past the payload stream
//! tn: Transmit Continue header, no payload stream | .. | item in target
//!     segments past the header
//! ```
//!
//! The receiver takes each transmission's payload stream from right after
//! its header (`payload_len` bytes, s9.2-9.4) and every listed segment as
//! item bytes; whatever else a Send carries is padding.

use super::{roundup4, DdpItem};
use crate::wire::rpcrdma::Segment;
use crate::wire::rtrext::{BufferGroup, BufferStructure, SEGMENT_FLAG_PLACEMENT_TARGET};

/// Bytes at the start of each of our receive buffers that no placed data
/// lands in: room for a Transmit Continue header (36 bytes), so that a
/// continuation loses little more than its header to placement.
const OUR_HEAD: u32 = 64;
/// Placement-targetable segments in each of our receive buffers (a 4 KiB
/// buffer: 64 bytes, then seven of 576). Few segments keep the segment
/// number lists short; a segment a message only partly fills is padding.
const OUR_TARGETS: u32 = 7;
/// The smallest target segment we advertise: below it a buffer gets none.
const MIN_TARGET: u32 = 64;
/// Target segments of a peer's buffer we place into (its numbering still
/// counts all of them).
pub(super) const MAX_TARGETS: usize = 32;
/// Target buffer segment numbers of one item we send or accept: the
/// parse limit of a header (`Limits::DEFAULT.max_buffer_numbers`).
pub(super) const MAX_ITEM_SEGMENTS: usize = 64;
/// Bytes a placed item adds to the first transmission's header:
/// `disp length type offset count` and its segment numbers (s7.3).
pub(super) const fn item_header_len(segments: usize) -> u32 {
    20 + 4 * segments as u32
}
/// Bytes a too-short or no-item answer adds to a Transmit Response
/// header: `disp length type` (s7.3, s7.4).
pub(super) const ANSWER_HEADER_LEN: u32 = 12;
/// Bytes one response direction adds to a Transmit Request header: one
/// set `begin end count` with one item `minlen type` (s7.4).
pub(super) const DIRECTION_HEADER_LEN: u32 = 20;
/// How a call of ours directs its reply's DDP-eligible item (s7.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ResultDirection {
    /// Placed by Send in our target segments when at least `min_len`
    /// long (TBSN).
    Send {
        /// Shorter items travel in the payload stream.
        min_len: u32,
    },
    /// Written by RDMA into this segment of our memory (EXRW), as a
    /// write chunk would be.
    Write(Segment),
}

impl ResultDirection {
    /// Bytes the direction adds to a Transmit Request header: one set
    /// with one item, an EXRW one with its segment.
    pub(super) fn header_len(&self) -> u32 {
        match self {
            ResultDirection::Send { .. } => DIRECTION_HEADER_LEN,
            ResultDirection::Write(_) => DIRECTION_HEADER_LEN + 4 + SEGMENT_LEN,
        }
    }
}

/// Bytes of an RDMA segment on the wire (handle, length, offset).
const SEGMENT_LEN: u32 = 16;

/// The shortest reply item we ask to have placed: one of our segments.
/// A shorter one travels in the payload stream (`XMPTYPE_TOOSHORT`).
pub(super) const fn direction_min_len(recv_len: u32) -> u32 {
    target_len(recv_len)
}

/// Length of each of our target segments for receive buffers of
/// `recv_len` bytes (0: none).
const fn target_len(recv_len: u32) -> u32 {
    if recv_len <= OUR_HEAD {
        return 0;
    }
    let len = ((recv_len - OUR_HEAD) / OUR_TARGETS) & !3;
    if len < MIN_TARGET {
        0
    } else {
        len
    }
}

/// The placement-targetable segments of one receive buffer, in buffer
/// order (rtrext s7.2): ours, or what a peer advertised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct TargetLayout {
    /// Target segments per buffer (the numbering's stride, s6.2).
    per_buffer: u32,
    /// (offset, length) of the first `known` of them.
    segs: [(u32, u32); MAX_TARGETS],
    known: u8,
}

impl TargetLayout {
    /// No target segments: nothing can be placed.
    pub(super) const NONE: TargetLayout = TargetLayout {
        per_buffer: 0,
        segs: [(0, 0); MAX_TARGETS],
        known: 0,
    };

    /// Our receive buffers of `recv_len` bytes.
    pub(super) fn ours(recv_len: u32) -> TargetLayout {
        let mut out = TargetLayout::NONE;
        let len = target_len(recv_len);
        if len == 0 {
            return out;
        }
        for k in 0..OUR_TARGETS {
            out.segs[k as usize] = (OUR_HEAD + k * len, len);
        }
        out.per_buffer = OUR_TARGETS;
        out.known = OUR_TARGETS as u8;
        out
    }

    /// The Receive Buffer Structure property value (s8.3) describing
    /// `ours(recv_len)`: the head, the targets, and any rest. Alignment 4
    /// is all a receive buffer of any provider guarantees (XDR's).
    pub(super) fn our_groups(recv_len: u32) -> ([BufferGroup; 3], usize) {
        let mut g = [BufferGroup::default(); 3];
        let len = target_len(recv_len);
        if len == 0 {
            g[0] = BufferGroup {
                count: 1,
                length: recv_len,
                align: 4,
                flags: 0,
            };
            return (g, usize::from(recv_len > 0));
        }
        g[0] = BufferGroup {
            count: 1,
            length: OUR_HEAD,
            align: 4,
            flags: 0,
        };
        g[1] = BufferGroup {
            count: OUR_TARGETS,
            length: len,
            align: 4,
            flags: SEGMENT_FLAG_PLACEMENT_TARGET,
        };
        let rest = recv_len - OUR_HEAD - OUR_TARGETS * len;
        if rest == 0 {
            return (g, 2);
        }
        g[2] = BufferGroup {
            count: 1,
            length: rest,
            align: 4,
            flags: 0,
        };
        (g, 3)
    }

    /// A peer's buffers as its Receive Buffer Structure describes them
    /// (parsed within `Limits::max_buffer_segments`: a short walk).
    pub(super) fn from_structure(s: &BufferStructure<'_>) -> TargetLayout {
        let mut out = TargetLayout::NONE;
        let (mut off, mut per) = (0u64, 0u64);
        for g in s.groups {
            let target = g.is_placement_target() && g.length > 0;
            for _ in 0..g.count {
                if target {
                    if usize::from(out.known) < MAX_TARGETS {
                        out.segs[usize::from(out.known)] = (off as u32, g.length);
                        out.known += 1;
                    }
                    per += 1;
                }
                off += u64::from(g.length);
            }
        }
        if off != u64::from(s.length) || off > u64::from(u32::MAX) {
            return TargetLayout::NONE;
        }
        out.per_buffer = per as u32;
        out
    }

    /// True when no segment can take placed data.
    pub(super) fn is_empty(&self) -> bool {
        self.known == 0
    }

    /// Target segments per buffer.
    pub(super) fn per_buffer(&self) -> u32 {
        self.per_buffer
    }

    /// Transmission, offset in its buffer and length of target segment
    /// number `tbsn` of a group (s6.2: numbered through all buffers).
    pub(super) fn segment(&self, tbsn: u32) -> Option<(u32, u32, u32)> {
        if self.per_buffer == 0 {
            return None;
        }
        let (t, k) = (tbsn / self.per_buffer, tbsn % self.per_buffer);
        let (off, len) = *self
            .segs
            .get(k as usize)
            .filter(|_| k < u32::from(self.known))?;
        Some((t, off, len))
    }
}

/// How a message with one placed item goes out (see the module
/// documentation): the whole payload stream in the first transmission,
/// the item in the target segments listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PlacedLayout {
    /// The item, in the message as the application encoded it.
    pub(super) item: DdpItem,
    /// Transmissions in the group.
    pub(super) count: u32,
    /// Payload stream bytes: the message without the item and its XDR
    /// padding.
    pub(super) payload_len: u32,
    /// Target buffer segment numbers, in the order the item fills them.
    pub(super) segments: [u32; MAX_ITEM_SEGMENTS],
    pub(super) n_segments: usize,
}

impl PlacedLayout {
    /// The segment numbers.
    pub(super) fn segment_numbers(&self) -> &[u32] {
        &self.segments[..self.n_segments]
    }

    /// The pieces of the item that transmission `seq` carries, in order,
    /// where the receiver's `targets` put them (`Piece::dest` is where
    /// the bytes are in the message); `None` for a segment number
    /// `targets` does not have.
    pub(super) fn pieces_in<'a>(
        &'a self,
        targets: &'a TargetLayout,
        seq: u32,
    ) -> impl Iterator<Item = Option<Piece>> + 'a {
        let span = ItemSpan {
            disp: self.item.offset,
            len: self.item.len,
            offset: 0,
            first: 0,
            count: self.n_segments as u32,
        };
        self.segment_numbers()
            .iter()
            .enumerate()
            .filter_map(
                move |(j, &number)| match span.piece(targets, j as u32, number) {
                    Some((t, piece)) if t == seq => Some(Some(piece)),
                    Some(_) => None,
                    None => Some(None),
                },
            )
    }
}

/// Lays out a message of `msg_len` bytes with `item` placed into a
/// receiver's `targets`, in Sends of at most `limit` bytes; the first
/// has a header of `first_header` bytes plus the item's entry, the
/// others `continue_header`. `None` when it cannot be done: the payload
/// stream does not fit the first Send, the item needs more than
/// [`MAX_ITEM_SEGMENTS`] segments, or no whole segment fits a Send.
pub(super) fn plan(
    targets: &TargetLayout,
    limit: u32,
    msg_len: u32,
    item: DdpItem,
    first_header: u32,
    continue_header: u32,
) -> Option<PlacedLayout> {
    let padded = roundup4(u64::from(item.len));
    if item.len == 0
        || item.offset % 4 != 0
        || u64::from(item.offset) + padded > u64::from(msg_len)
        || targets.is_empty()
    {
        return None;
    }
    let payload_len = msg_len - padded as u32;
    // The header grows with the segment list, which may push the item's
    // first segment further out: start from none and redo the layout
    // with the list it produced until that list fits the header assumed
    // (an assumed list at least as long only leaves padding).
    let mut assumed = 0usize;
    for _ in 0..4 {
        let head = first_header.checked_add(item_header_len(assumed))?;
        let out = lay_out(targets, limit, head, payload_len, item, continue_header)?;
        if out.n_segments <= assumed {
            return Some(out);
        }
        assumed = out.n_segments;
    }
    None
}

fn lay_out(
    targets: &TargetLayout,
    limit: u32,
    first_header: u32,
    payload_len: u32,
    item: DdpItem,
    continue_header: u32,
) -> Option<PlacedLayout> {
    let mut out = PlacedLayout {
        item,
        count: 0,
        payload_len,
        segments: [0; MAX_ITEM_SEGMENTS],
        n_segments: 0,
    };
    let mut floor = first_header.checked_add(payload_len)?;
    if floor > limit {
        return None;
    }
    let mut left = item.len;
    let mut t = 0u32;
    loop {
        let mut used = false;
        for k in 0..targets.known as usize {
            let (off, len) = targets.segs[k];
            if off < floor || u64::from(off) + u64::from(len) > u64::from(limit) {
                continue;
            }
            if out.n_segments == MAX_ITEM_SEGMENTS {
                return None;
            }
            out.segments[out.n_segments] =
                t.checked_mul(targets.per_buffer)?.checked_add(k as u32)?;
            out.n_segments += 1;
            used = true;
            left -= left.min(len);
            if left == 0 {
                out.count = t + 1;
                return Some(out);
            }
        }
        if !used && t > 0 {
            // Not even an empty continuation has a whole segment.
            return None;
        }
        t += 1;
        floor = continue_header;
    }
}

/// Where the bytes of a received placed item are: one per item of the
/// group being received, checked against our layout when its first
/// transmission arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct ItemSpan {
    /// Displacement in the message (virtual XDR stream).
    pub(super) disp: u32,
    pub(super) len: u32,
    /// Bytes into the first segment where the item starts.
    pub(super) offset: u32,
    /// Its segment numbers: `numbers[first..first + count]` of the
    /// group's list.
    pub(super) first: u32,
    pub(super) count: u32,
}

/// One piece of a placed item inside a transmission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Piece {
    /// Where it is in the transmission (from the start of the Send).
    pub(super) src: u32,
    /// Where it goes in the message.
    pub(super) dest: u32,
    pub(super) len: u32,
}

impl ItemSpan {
    /// Piece `j` of the item (its `j`th segment, `numbers[j]`), laid out
    /// in `targets` with segments of equal length: `(transmission,
    /// piece)`. `None` if the number is not one of `targets`'.
    pub(super) fn piece(
        &self,
        targets: &TargetLayout,
        j: u32,
        number: u32,
    ) -> Option<(u32, Piece)> {
        let (t, off, seg_len) = targets.segment(number)?;
        let skip = if j == 0 { self.offset } else { 0 };
        // Item bytes before this piece: the first segment's share, then
        // whole segments.
        let before = if j == 0 {
            0
        } else {
            u64::from(seg_len - self.offset.min(seg_len)) + u64::from(j - 1) * u64::from(seg_len)
        };
        let left = u64::from(self.len).checked_sub(before)?;
        let len = u64::from(seg_len.checked_sub(skip)?).min(left);
        Some((
            t,
            Piece {
                src: off + skip,
                dest: (u64::from(self.disp) + before) as u32,
                len: len as u32,
            },
        ))
    }

    /// Segments an item of this length needs starting `offset` bytes
    /// into the first of `seg_len`.
    pub(super) fn segments_needed(len: u32, offset: u32, seg_len: u32) -> u64 {
        if seg_len == 0 {
            return u64::MAX;
        }
        (u64::from(len) + u64::from(offset)).div_ceil(u64::from(seg_len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_4k_buffer_is_a_head_and_seven_targets() {
        let t = TargetLayout::ours(4096);
        assert_eq!(t.per_buffer(), 7);
        assert_eq!(t.segment(0), Some((0, 64, 576)));
        assert_eq!(t.segment(6), Some((0, 64 + 6 * 576, 576)));
        assert_eq!(t.segment(7), Some((1, 64, 576)));
        let (g, n) = TargetLayout::our_groups(4096);
        assert_eq!(n, 2);
        let s = BufferStructure {
            length: 4096,
            groups: &g[..n],
        };
        assert_eq!(TargetLayout::from_structure(&s), t);
        // A size that leaves a rest keeps it as a plain segment.
        let (g, n) = TargetLayout::our_groups(1000);
        assert_eq!(n, 3);
        let total: u32 = g[..n].iter().map(|g| g.count * g.length).sum();
        assert_eq!(total, 1000);
        assert!(TargetLayout::ours(100).is_empty());
    }

    #[test]
    fn a_layout_puts_the_payload_first_and_the_item_in_whole_segments() {
        let t = TargetLayout::ours(4096);
        let item = DdpItem {
            offset: 100,
            len: 8192,
        };
        let l = plan(&t, 4096, 100 + 8192 + 20, item, 44, 36).unwrap();
        assert_eq!(l.payload_len, 120);
        // 44 + header entry + 120 bytes of payload: the first target past
        // them is segment 1; 8192 bytes take 15 segments of 576.
        assert_eq!(l.segment_numbers()[0], 1);
        assert_eq!(l.n_segments, 15);
        assert_eq!(l.count, 3);
        // Every piece of the item, as the receiver finds it, is the
        // sender's byte for byte, transmission after transmission.
        let mut covered = 0;
        for seq in 0..l.count {
            for p in l.pieces_in(&t, seq) {
                let p = p.unwrap();
                assert_eq!(p.dest, 100 + covered);
                covered += p.len;
            }
        }
        assert_eq!(covered, 8192);
        assert_eq!(ItemSpan::segments_needed(8192, 0, 576), 15);
    }

    #[test]
    fn a_layout_that_cannot_be_made_is_refused() {
        let t = TargetLayout::ours(4096);
        let item = DdpItem {
            offset: 4040,
            len: 100,
        };
        // The payload stream alone overflows the first Send.
        assert!(plan(&t, 4096, 4140, item, 44, 36).is_none());
        // Just fits: the item goes entirely into the next transmission.
        let item = DdpItem {
            offset: 4000,
            len: 100,
        };
        let l = plan(&t, 4096, 4100, item, 44, 36).unwrap();
        assert_eq!((l.count, l.segment_numbers()), (2, &[7][..]));
        // No targets at all.
        let item = DdpItem {
            offset: 8,
            len: 100,
        };
        assert!(plan(&TargetLayout::NONE, 4096, 108, item, 44, 36).is_none());
        // More segments than a header may list.
        let item = DdpItem {
            offset: 8,
            len: 64 * 576 + 1,
        };
        assert!(plan(&t, 4096, 8 + 64 * 576 + 4, item, 44, 36).is_none());
    }
}
