//! The RPC-over-RDMA Version One transport header (RFC 5666 s4, with the
//! on-the-wire rules of RFC 8166) and the RFC 8797 connection private data.
//!
//! Every RPC-over-RDMA Send starts with this header: four fixed words (XID,
//! version, credits, message type), then, depending on the type, the three
//! chunk lists, the RDMA_MSGP padding parameters or an error body. The RPC
//! message itself (when there is one inline) follows the header and is not
//! this module's business, except for [`TransportHeader::check_rpc_xid`].
//!
//! # Shape of the API
//! * [`HeaderView`]: a zero-copy view of the four fixed words, usable even
//!   when the rest of the header is garbage (the engine needs the XID to
//!   answer ERR_CHUNK to a header that failed to parse).
//! * [`TransportHeader`]: the checked representation with `parse`,
//!   `parse_into`, `buffer_len` and `emit`, which mirror each other.
//!
//! # Why the chunk lists sit beside the message body
//! The chunk lists live in [`TransportHeader::chunks`], not inside the
//! [`MessageBody`] variants. A per-connection scratch header can then be
//! reused across messages of different types without dropping and later
//! re-allocating its vectors: [`TransportHeader::parse_into`] clears the
//! lists and refills them in place. Write chunks are stored flattened (one
//! vector of segments plus one vector of per-chunk segment counts) so that
//! no inner vector is ever dropped. Every vector grows by at most the
//! matching [`Limits`] field, so once warmed up (or built with
//! [`TransportHeader::with_capacity`]) parsing allocates nothing and the
//! memory held is bounded by the limits. Bodies without chunk lists
//! (RDMA_DONE, RDMA_ERROR, unknown types) always have empty lists.
//!
//! # Outcomes the engine answers
//! * A version other than 1: [`TransportHeader::parse_into`] returns
//!   [`Decoded::UnsupportedVersion`] with the XID (answer ERR_VERS,
//!   RFC 5666 s4.2). The convenience [`TransportHeader::parse`] maps it to
//!   [`Error::UnknownValue`].
//! * An unknown message type: the header parses with
//!   [`MessageBody::Unknown`] (answer ERR_CHUNK).
//! * Any other failure is an [`Error`]; take the XID for ERR_CHUNK from
//!   [`HeaderView`] when at least the fixed words arrived.
//!
//! # Validation (RFC 5666 s3.4, s4.3, s5.1; RFC 8166 read/write chunk rules)
//! Before `parse` returns, and again before `emit` writes anything:
//! * read positions are multiples of 4 and never decrease (segments of one
//!   read chunk share a position, chunks come in XDR stream order);
//! * a position-zero read chunk (the whole RPC message, RFC 5666 s5.1)
//!   appears only in RDMA_NOMSG: in RDMA_MSG and RDMA_MSGP the inline RPC
//!   message itself begins at position zero;
//! * the segments of one chunk add up to at most `u32::MAX` bytes, since a
//!   chunk stands for one XDR item whose byte count is a 32-bit word (sums
//!   are computed with checked arithmetic);
//! * a reply chunk has at least one segment; a write-list chunk may have
//!   none (RFC 8267 uses such a chunk as a placeholder that keeps write
//!   chunks paired with their results; a peer that sends one loses nothing);
//! * on parse only: counts stay within [`Limits`], checked before anything
//!   is stored.
//!
//! Trailing bytes after a header without an inline RPC message (NOMSG,
//! DONE, ERROR) are not an error: the header length is returned and the
//! caller decides.
//!
//! # RDMA_MSGP and RDMA_DONE
//! RFC 8166 retired both. They are decoded and can be emitted (for tests
//! and for peers that asked for RFC 5666 features); see [`Padding`] for the
//! padding rule.
//!
//! # Panic contract
//! Nothing here panics on any input, except [`fuzz_parse`], whose job is to
//! panic when a codec invariant breaks. Emitters validate and return
//! [`Error`] values; they check the buffer size before writing a byte.

use super::bytes::be32;
use super::xdr::{Decoder, Encoder};
use super::{Error, Result};

// RDMA_MSGP's padding rule is applied by the XDR decoder (padded opaques),
// so `xdr` owns the type and this module re-exports it: `xdr` stays below
// `rpcrdma` and `wire::rpcrdma::Padding` keeps its path.
pub use super::xdr::Padding;

/// The only RPC-over-RDMA version this module speaks (RFC 5666 s4.1).
pub const RPCRDMA_VERSION: u32 = 1;

/// Length of the four fixed header words (xid, vers, credits, proc).
pub const FIXED_HEADER_LEN: usize = 16;

/// Smallest RDMA_MSG / RDMA_NOMSG header: fixed words plus three empty lists.
pub const MIN_CHUNKED_HEADER_LEN: usize = FIXED_HEADER_LEN + 12;

/// Encoded length of an RDMA_MSG or RDMA_NOMSG transport header whose read
/// list has `read_segments` entries, whose write list has `write_chunks`
/// chunks of `write_segments` segments in all, and whose reply chunk, if
/// any, has `reply_segments` segments (RFC 5666 s4.3). The same arithmetic
/// as [`TransportHeader::buffer_len`], for planning before a header exists.
pub const fn chunked_header_len(
    read_segments: usize,
    write_chunks: usize,
    write_segments: usize,
    reply_segments: Option<usize>,
) -> usize {
    FIXED_HEADER_LEN + chunk_lists_len(read_segments, write_chunks, write_segments, reply_segments)
}

/// Encoded length of the three chunk lists (see [`chunked_header_len`]).
const fn chunk_lists_len(
    read_segments: usize,
    write_chunks: usize,
    write_segments: usize,
    reply_segments: Option<usize>,
) -> usize {
    let reads = read_segments * READ_ENTRY_LEN + 4;
    let writes = write_chunks * 8 + write_segments * SEGMENT_LEN + 4;
    let reply = match reply_segments {
        Some(n) => 8 + n * SEGMENT_LEN,
        None => 4,
    };
    reads + writes + reply
}

/// Message type numbers (RFC 5666 s4.3 `enum rdma_proc`).
pub mod proc_type {
    /// An RPC message follows the chunk lists.
    pub const RDMA_MSG: u32 = 0;
    /// The RPC message travels in chunks; nothing follows the lists.
    pub const RDMA_NOMSG: u32 = 1;
    /// Padded RPC message (RFC 5666 only; retired by RFC 8166).
    pub const RDMA_MSGP: u32 = 2;
    /// The requester finished pulling a reply's read chunks (RFC 5666 only).
    pub const RDMA_DONE: u32 = 3;
    /// Header or chunk encoding error report.
    pub const RDMA_ERROR: u32 = 4;
}

/// Error codes of an RDMA_ERROR body (RFC 5666 s4.3 `rpc_rdma_errcode`).
pub mod err_code {
    /// Version mismatch; carries the supported range.
    pub const ERR_VERS: u32 = 1;
    /// Malformed header or chunk lists.
    pub const ERR_CHUNK: u32 = 2;
}

/// Encoded size of one segment: handle, length, 64-bit offset.
const SEGMENT_LEN: usize = 16;
/// Encoded size of one read list entry: presence word, position, segment.
const READ_ENTRY_LEN: usize = 4 + 4 + SEGMENT_LEN;

// ---------------------------------------------------------------------------
// Limits

/// Bounds on the chunk lists a peer may send, checked during parsing
/// before anything is stored.
///
/// Defaults, and why: a transport header must fit in one receive buffer,
/// whose size is the inline threshold (1024 bytes without RFC 8797 private
/// data, 4096 by default for Linux, 64 KiB at most). A read list entry
/// takes 24 bytes, so even a 4 KiB header holds at most about 170 of them,
/// and real traffic is far smaller: Linux sends one chunk per list, made of
/// a handful of segments (each FRWR segment maps many pages). The defaults
/// leave ample room for that and for NFSv4 COMPOUNDs pairing several READs
/// with write chunks, while a scratch header stays below 20 KiB:
///
/// | field | default | reason |
/// |---|---|---|
/// | `max_read_segments` | 64 | a 1 MiB payload in 16 KiB segments, twice the Linux per-chunk need |
/// | `max_write_chunks` | 16 | one per DDP-eligible result; Linux uses at most 1 |
/// | `max_segments_per_chunk` | 64 | same reasoning as reads |
/// | `max_reply_segments` | 64 | a reply chunk sized like the largest write chunk |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Read list entries (segments), over all read chunks.
    pub max_read_segments: usize,
    /// Chunks in the write list.
    pub max_write_chunks: usize,
    /// Segments in any one write chunk.
    pub max_segments_per_chunk: usize,
    /// Segments in the reply chunk.
    pub max_reply_segments: usize,
}

impl Limits {
    /// The documented defaults (see the type's documentation).
    pub const DEFAULT: Limits = Limits {
        max_read_segments: 64,
        max_write_chunks: 16,
        max_segments_per_chunk: 64,
        max_reply_segments: 64,
    };
}

impl Default for Limits {
    fn default() -> Self {
        Limits::DEFAULT
    }
}

// ---------------------------------------------------------------------------
// Segments and chunks

/// One registered memory region of a chunk (RFC 5666 s4.3
/// `xdr_rdma_segment`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Segment {
    /// Steering tag (rkey / STag) of the registration.
    pub handle: u32,
    /// Length of the region in bytes.
    pub length: u32,
    /// Virtual address or offset of the region.
    pub offset: u64,
}

impl Segment {
    // segment: handle(4) length(4) offset(8)   -- RFC 5666 s4.3
    fn decode(dec: &mut Decoder<'_>) -> Result<Segment> {
        Ok(Segment {
            handle: dec.get_u32()?,
            length: dec.get_u32()?,
            offset: dec.get_u64()?,
        })
    }

    fn encode(&self, enc: &mut Encoder<'_>) -> Result<()> {
        enc.put_u32(self.handle)?;
        enc.put_u32(self.length)?;
        enc.put_u64(self.offset)
    }
}

/// One read list entry (RFC 5666 s4.3 `xdr_read_chunk`): a segment and the
/// XDR position its data belongs at. Consecutive entries with the same
/// position form one read chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReadSegment {
    /// Byte offset in the RPC message's XDR stream (a multiple of 4).
    pub position: u32,
    /// Where the data is in the sender's memory.
    pub segment: Segment,
}

/// One read chunk: the run of read list entries sharing a position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadChunk<'a> {
    /// XDR position of the chunk (zero: the whole RPC message).
    pub position: u32,
    /// Its entries, in list order (all with `position`).
    pub segments: &'a [ReadSegment],
}

impl ReadChunk<'_> {
    /// Total bytes of the chunk.
    pub fn len_bytes(&self) -> u64 {
        self.segments
            .iter()
            .map(|s| u64::from(s.segment.length))
            .sum()
    }
}

/// One write chunk (RFC 5666 s4.3 `xdr_write_chunk`): a counted array of
/// segments; also the shape of the reply chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteChunk<'a> {
    /// The chunk's segments, filled in order.
    pub segments: &'a [Segment],
}

impl WriteChunk<'_> {
    /// Total bytes of the chunk.
    pub fn len_bytes(&self) -> u64 {
        self.segments.iter().map(|s| u64::from(s.length)).sum()
    }
}

/// Iterator over the read chunks of a read list.
#[derive(Debug, Clone)]
pub struct ReadChunks<'a> {
    rest: &'a [ReadSegment],
}

impl<'a> Iterator for ReadChunks<'a> {
    type Item = ReadChunk<'a>;

    fn next(&mut self) -> Option<ReadChunk<'a>> {
        let position = self.rest.first()?.position;
        let n = self
            .rest
            .iter()
            .take_while(|s| s.position == position)
            .count();
        let (segments, rest) = self.rest.split_at(n);
        self.rest = rest;
        Some(ReadChunk { position, segments })
    }
}

/// Iterator over the chunks of a write list.
#[derive(Debug, Clone)]
pub struct WriteChunks<'a> {
    segments: &'a [Segment],
    counts: core::slice::Iter<'a, u32>,
}

impl<'a> Iterator for WriteChunks<'a> {
    type Item = WriteChunk<'a>;

    fn next(&mut self) -> Option<WriteChunk<'a>> {
        let n = *self.counts.next()? as usize;
        // `counts` always sums to `segments.len()` (ChunkLists invariant);
        // `min` keeps this total even if that were ever violated.
        let (segments, rest) = self.segments.split_at(n.min(self.segments.len()));
        self.segments = rest;
        Some(WriteChunk { segments })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.counts.size_hint()
    }
}

/// The read list, write list and reply chunk of an RDMA_MSG, RDMA_NOMSG or
/// RDMA_MSGP header (RFC 5666 s4.3), stored for reuse (see the module
/// documentation).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ChunkLists {
    reads: Vec<ReadSegment>,
    /// Segments of all write chunks, chunk after chunk.
    write_segments: Vec<Segment>,
    /// Segment count of each write chunk; sums to `write_segments.len()`.
    write_counts: Vec<u32>,
    /// Reply chunk segments; empty when `has_reply` is false.
    reply: Vec<Segment>,
    has_reply: bool,
}

impl ChunkLists {
    /// Empty lists; nothing allocated.
    pub fn new() -> Self {
        Self::default()
    }

    /// Empty lists with room for everything `limits` allows, so that
    /// parsing within those limits never allocates.
    pub fn with_capacity(limits: &Limits) -> Self {
        ChunkLists {
            reads: Vec::with_capacity(limits.max_read_segments),
            write_segments: Vec::with_capacity(
                limits
                    .max_write_chunks
                    .saturating_mul(limits.max_segments_per_chunk),
            ),
            write_counts: Vec::with_capacity(limits.max_write_chunks),
            reply: Vec::with_capacity(limits.max_reply_segments),
            has_reply: false,
        }
    }

    /// Makes room for everything `limits` allows beyond what the lists
    /// hold, so that parsing within those limits allocates nothing.
    pub fn reserve(&mut self, limits: &Limits) {
        self.reads.reserve(limits.max_read_segments);
        self.write_segments.reserve(
            limits
                .max_write_chunks
                .saturating_mul(limits.max_segments_per_chunk),
        );
        self.write_counts.reserve(limits.max_write_chunks);
        self.reply.reserve(limits.max_reply_segments);
    }

    /// Empties all three lists, keeping their capacity.
    pub fn clear(&mut self) {
        self.reads.clear();
        self.write_segments.clear();
        self.write_counts.clear();
        self.reply.clear();
        self.has_reply = false;
    }

    /// True when all three lists are empty (absent reply chunk).
    pub fn is_empty(&self) -> bool {
        self.reads.is_empty() && self.write_counts.is_empty() && !self.has_reply
    }

    /// The read list entries, in wire order.
    pub fn reads(&self) -> &[ReadSegment] {
        &self.reads
    }

    /// The read chunks (entries grouped by position), in wire order.
    pub fn read_chunks(&self) -> ReadChunks<'_> {
        ReadChunks { rest: &self.reads }
    }

    /// Appends a read list entry. Not validated here: `emit` checks the
    /// ordering rules.
    pub fn push_read(&mut self, entry: ReadSegment) {
        self.reads.push(entry);
    }

    /// Number of chunks in the write list.
    pub fn write_chunk_count(&self) -> usize {
        self.write_counts.len()
    }

    /// The write chunks, in wire order.
    pub fn write_chunks(&self) -> WriteChunks<'_> {
        WriteChunks {
            segments: &self.write_segments,
            counts: self.write_counts.iter(),
        }
    }

    /// Appends a write chunk made of `segments` (which may be empty, see
    /// the module documentation).
    ///
    /// # Errors
    /// [`Error::LimitExceeded`] if `segments` has more than `u32::MAX`
    /// entries (no XDR count could carry it).
    pub fn push_write_chunk(&mut self, segments: &[Segment]) -> Result<()> {
        let n = u32::try_from(segments.len()).map_err(|_| Error::LimitExceeded)?;
        self.write_segments.extend_from_slice(segments);
        self.write_counts.push(n);
        Ok(())
    }

    /// The segments of write chunk `index`, for rewriting their lengths to
    /// the bytes actually written before a reply returns the write list
    /// (RFC 5666 s3.6). `None` if there is no such chunk.
    pub fn write_chunk_mut(&mut self, index: usize) -> Option<&mut [Segment]> {
        let n = *self.write_counts.get(index)? as usize;
        let start: usize = self.write_counts[..index].iter().map(|&c| c as usize).sum();
        self.write_segments.get_mut(start..start.checked_add(n)?)
    }

    /// The reply chunk's segments, for rewriting their lengths (RFC 5666
    /// s5.2); `None` if there is no reply chunk.
    pub fn reply_mut(&mut self) -> Option<&mut [Segment]> {
        self.has_reply.then_some(&mut self.reply[..])
    }

    /// The reply chunk, if present.
    pub fn reply(&self) -> Option<WriteChunk<'_>> {
        self.has_reply.then_some(WriteChunk {
            segments: &self.reply,
        })
    }

    /// Sets the reply chunk to `segments`.
    pub fn set_reply(&mut self, segments: &[Segment]) {
        self.reply.clear();
        self.reply.extend_from_slice(segments);
        self.has_reply = true;
    }

    /// Removes the reply chunk (its storage is kept for reuse).
    pub fn clear_reply(&mut self) {
        self.reply.clear();
        self.has_reply = false;
    }

    /// Encoded size of the three lists.
    fn buffer_len(&self) -> usize {
        chunk_lists_len(
            self.reads.len(),
            self.write_counts.len(),
            self.write_segments.len(),
            self.has_reply.then_some(self.reply.len()),
        )
    }

    /// The rules of the module documentation, minus the limits; shared by
    /// parse and emit. `position_zero_allowed` is true for RDMA_NOMSG only.
    fn validate(&self, position_zero_allowed: bool) -> Result<()> {
        // Read chunks: RFC 5666 s3.4 (positions in stream order, one
        // position per chunk), s3.7 (XDR alignment), s5.1 (position zero).
        let mut prev: Option<u32> = None;
        let mut chunk_len: u32 = 0;
        for r in &self.reads {
            check_read_position(r.position, prev, position_zero_allowed)?;
            if prev != Some(r.position) {
                chunk_len = 0;
            }
            chunk_len = add_len(chunk_len, r.segment.length)?;
            prev = Some(r.position);
        }
        let counted: usize = self.write_counts.iter().map(|&n| n as usize).sum();
        if counted != self.write_segments.len() {
            return Err(Error::Malformed);
        }
        for chunk in self.write_chunks() {
            chunk
                .segments
                .iter()
                .try_fold(0u32, |acc, s| add_len(acc, s.length))?;
        }
        if self.has_reply {
            if self.reply.is_empty() {
                return Err(Error::Malformed);
            }
            self.reply
                .iter()
                .try_fold(0u32, |acc, s| add_len(acc, s.length))?;
        } else if !self.reply.is_empty() {
            return Err(Error::Malformed);
        }
        Ok(())
    }

    // read_list   = *( TRUE position segment ) FALSE
    // write_list  = *( TRUE count segment{count} ) FALSE
    // reply_chunk = FALSE / TRUE count segment{count}      -- RFC 5666 s4.3
    fn encode(&self, enc: &mut Encoder<'_>) -> Result<()> {
        for r in &self.reads {
            enc.put_present(true)?;
            enc.put_u32(r.position)?;
            r.segment.encode(enc)?;
        }
        enc.put_present(false)?;
        for chunk in self.write_chunks() {
            enc.put_present(true)?;
            encode_segment_array(enc, chunk.segments)?;
        }
        enc.put_present(false)?;
        enc.put_present(self.has_reply)?;
        if self.has_reply {
            encode_segment_array(enc, &self.reply)?;
        }
        Ok(())
    }

    /// Decodes the three lists into `self` (which the caller cleared),
    /// checking every count against `limits` before storing. The protocol
    /// rules are checked afterwards by [`ChunkLists::validate`], the same
    /// function `emit` uses, so parse and emit accept the same lists.
    fn decode(&mut self, dec: &mut Decoder<'_>, limits: &Limits) -> Result<()> {
        // Read list (RFC 5666 s4.3 xdr_read_list).
        while dec.get_present()? {
            if self.reads.len() >= limits.max_read_segments {
                return Err(Error::LimitExceeded);
            }
            let position = dec.get_u32()?;
            let segment = Segment::decode(dec)?;
            push_bounded(
                &mut self.reads,
                ReadSegment { position, segment },
                limits.max_read_segments,
            );
        }
        // Write list (RFC 5666 s4.3 xdr_write_list of xdr_write_chunk).
        let write_cap = limits
            .max_write_chunks
            .saturating_mul(limits.max_segments_per_chunk);
        while dec.get_present()? {
            if self.write_counts.len() >= limits.max_write_chunks {
                return Err(Error::LimitExceeded);
            }
            let n = dec.get_count(limits.max_segments_per_chunk, SEGMENT_LEN)?;
            decode_segments(dec, &mut self.write_segments, n, write_cap)?;
            // get_count read `n` from a 32-bit word: the cast is lossless.
            push_bounded(&mut self.write_counts, n as u32, limits.max_write_chunks);
        }
        // Reply chunk (RFC 5666 s4.3, s5.2): an optional write chunk.
        if dec.get_present()? {
            let n = dec.get_count(limits.max_reply_segments, SEGMENT_LEN)?;
            decode_segments(dec, &mut self.reply, n, limits.max_reply_segments)?;
            self.has_reply = true;
        }
        Ok(())
    }
}

/// RFC 5666 s3.4 / s3.7: positions are XDR offsets (multiples of 4) in
/// stream order; position zero only where the whole message is a chunk.
fn check_read_position(position: u32, prev: Option<u32>, zero_allowed: bool) -> Result<()> {
    if position & 3 != 0 || (position == 0 && !zero_allowed) || prev.is_some_and(|p| position < p) {
        return Err(Error::Malformed);
    }
    Ok(())
}

/// Adds a segment length to a chunk total; a chunk stands for one XDR item
/// whose byte count is 32 bits, so a larger total cannot be valid.
fn add_len(total: u32, length: u32) -> Result<u32> {
    total.checked_add(length).ok_or(Error::LimitExceeded)
}

/// Pushes `item` without ever growing `v` past `max` elements of capacity.
/// The caller has checked `v.len() < max`.
fn push_bounded<T>(v: &mut Vec<T>, item: T, max: usize) {
    if v.len() == v.capacity() {
        let grow = v.capacity().max(4).min(max.saturating_sub(v.len())).max(1);
        v.reserve_exact(grow);
    }
    v.push(item);
}

/// Decodes `n` segments onto `out`, never growing its capacity past `cap`
/// (the caller's limit, which `out.len() + n` respects).
fn decode_segments(
    dec: &mut Decoder<'_>,
    out: &mut Vec<Segment>,
    n: usize,
    cap: usize,
) -> Result<()> {
    let needed = out.len() + n;
    if needed > out.capacity() {
        // Exact for the common single chunk; doubles (capped) otherwise.
        let target = needed
            .max(out.capacity().saturating_mul(2))
            .min(cap.max(needed));
        out.reserve_exact(target - out.len());
    }
    for _ in 0..n {
        out.push(Segment::decode(dec)?);
    }
    Ok(())
}

// write_chunk = count segment{count}   -- RFC 5666 s4.3 xdr_write_chunk
fn encode_segment_array(enc: &mut Encoder<'_>, segments: &[Segment]) -> Result<()> {
    enc.put_count(segments.len())?;
    segments.iter().try_for_each(|s| s.encode(enc))
}

// ---------------------------------------------------------------------------
// Message body and header

/// The body of an RPC-over-RDMA header after the four fixed words, without
/// the chunk lists (they are in [`TransportHeader::chunks`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageBody {
    /// RDMA_MSG: chunk lists, then the RPC message inline.
    Msg,
    /// RDMA_NOMSG: chunk lists only; the RPC message travels in a chunk.
    NoMsg,
    /// RDMA_MSGP: padding parameters, chunk lists, then the padded RPC
    /// message (RFC 5666 s3.9; retired by RFC 8166).
    MsgP {
        /// See [`Padding::align`].
        align: u32,
        /// See [`Padding::thresh`].
        thresh: u32,
    },
    /// RDMA_DONE: nothing after the fixed words (RFC 5666 s3.8).
    Done,
    /// RDMA_ERROR: an error code and its arguments, no chunk lists.
    Error(ErrorBody),
    /// A message type this module does not know. Only the fixed words were
    /// decoded; the engine answers ERR_CHUNK.
    Unknown {
        /// The type number received.
        proc_type: u32,
    },
}

impl MessageBody {
    /// The message type number on the wire.
    pub fn proc_type(&self) -> u32 {
        match self {
            MessageBody::Msg => proc_type::RDMA_MSG,
            MessageBody::NoMsg => proc_type::RDMA_NOMSG,
            MessageBody::MsgP { .. } => proc_type::RDMA_MSGP,
            MessageBody::Done => proc_type::RDMA_DONE,
            MessageBody::Error(_) => proc_type::RDMA_ERROR,
            MessageBody::Unknown { proc_type } => *proc_type,
        }
    }

    /// True for the types that carry chunk lists.
    pub fn has_chunk_lists(&self) -> bool {
        matches!(
            self,
            MessageBody::Msg | MessageBody::NoMsg | MessageBody::MsgP { .. }
        )
    }

    /// True for the types followed by an inline RPC message.
    pub fn has_inline_message(&self) -> bool {
        matches!(self, MessageBody::Msg | MessageBody::MsgP { .. })
    }
}

/// The body of an RDMA_ERROR message (RFC 5666 s4.2, s4.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorBody {
    /// ERR_VERS: the sender supports versions `low..=high`.
    Vers {
        /// Lowest supported version.
        low: u32,
        /// Highest supported version.
        high: u32,
    },
    /// ERR_CHUNK: the header or its chunk lists could not be decoded.
    Chunk,
    /// Any other code, with the eight words RFC 5666's default arm carries
    /// (`rdma_extra[8]`). Emitting it with code 1 or 2 is an error.
    Other {
        /// The error code received.
        code: u32,
        /// The words that followed it.
        extra: [u32; 8],
    },
}

impl ErrorBody {
    /// The error code on the wire.
    pub fn code(&self) -> u32 {
        match self {
            ErrorBody::Vers { .. } => err_code::ERR_VERS,
            ErrorBody::Chunk => err_code::ERR_CHUNK,
            ErrorBody::Other { code, .. } => *code,
        }
    }

    fn buffer_len(&self) -> usize {
        match self {
            ErrorBody::Vers { .. } => 12,
            ErrorBody::Chunk => 4,
            ErrorBody::Other { .. } => 4 + 32,
        }
    }

    // rpc_rdma_error = ERR_VERS low high / ERR_CHUNK / code extra[8]
    //                                                  -- RFC 5666 s4.3
    fn decode(dec: &mut Decoder<'_>) -> Result<ErrorBody> {
        Ok(match dec.get_u32()? {
            err_code::ERR_VERS => ErrorBody::Vers {
                low: dec.get_u32()?,
                high: dec.get_u32()?,
            },
            err_code::ERR_CHUNK => ErrorBody::Chunk,
            code => {
                let mut extra = [0u32; 8];
                for w in &mut extra {
                    *w = dec.get_u32()?;
                }
                ErrorBody::Other { code, extra }
            }
        })
    }

    fn encode(&self, enc: &mut Encoder<'_>) -> Result<()> {
        enc.put_u32(self.code())?;
        match self {
            ErrorBody::Vers { low, high } => {
                enc.put_u32(*low)?;
                enc.put_u32(*high)
            }
            ErrorBody::Chunk => Ok(()),
            ErrorBody::Other { extra, .. } => extra.iter().try_for_each(|w| enc.put_u32(*w)),
        }
    }
}

/// What [`TransportHeader::parse_into`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decoded {
    /// A Version One header, now in the receiver. The header is `len` bytes
    /// long; an inline RPC message (RDMA_MSG, RDMA_MSGP) starts there.
    Header {
        /// Length of the transport header in bytes.
        len: usize,
    },
    /// The peer speaks another version: answer ERR_VERS to `xid`
    /// (RFC 5666 s4.2). The receiver keeps only the fixed words (its body
    /// is `Unknown` with the type number received, its lists are empty).
    UnsupportedVersion {
        /// XID to answer.
        xid: u32,
        /// Version the peer used.
        vers: u32,
    },
}

/// A zero-copy view of the four fixed header words (smoltcp style).
///
/// These words keep their offsets in every version (RFC 5666 s4.1), so the
/// view is meaningful even when the rest of the header is not.
#[derive(Debug, Clone, Copy)]
pub struct HeaderView<T: AsRef<[u8]>> {
    buffer: T,
}

mod field {
    use core::ops::Range;
    pub const XID: Range<usize> = 0..4;
    pub const VERS: Range<usize> = 4..8;
    pub const CREDITS: Range<usize> = 8..12;
    pub const PROC: Range<usize> = 12..16;
}

/// The big-endian word at `r` (four bytes) of `bytes`, for the zero-copy
/// views. Callers check the length first; a short buffer reads as zero
/// rather than panicking.
pub(crate) fn word_at(bytes: &[u8], r: core::ops::Range<usize>) -> u32 {
    bytes
        .get(r)
        .map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

impl<T: AsRef<[u8]>> HeaderView<T> {
    /// Wraps `buffer` without checking its length.
    pub const fn new_unchecked(buffer: T) -> Self {
        HeaderView { buffer }
    }

    /// Wraps `buffer` after [`HeaderView::check_len`].
    ///
    /// # Errors
    /// [`Error::Truncated`] when `buffer` is shorter than 16 bytes.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let v = Self::new_unchecked(buffer);
        v.check_len()?;
        Ok(v)
    }

    /// Checks that the four fixed words are present.
    ///
    /// # Errors
    /// [`Error::Truncated`] when the buffer is shorter than 16 bytes.
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < FIXED_HEADER_LEN {
            Err(Error::Truncated)
        } else {
            Ok(())
        }
    }

    fn word(&self, r: core::ops::Range<usize>) -> u32 {
        word_at(self.buffer.as_ref(), r)
    }

    /// The XID (`rdma_xid`).
    pub fn xid(&self) -> u32 {
        self.word(field::XID)
    }

    /// The protocol version (`rdma_vers`).
    pub fn vers(&self) -> u32 {
        self.word(field::VERS)
    }

    /// Credits requested or granted (`rdma_credit`).
    pub fn credits(&self) -> u32 {
        self.word(field::CREDITS)
    }

    /// The message type (`rdma_proc`).
    pub fn proc_type(&self) -> u32 {
        self.word(field::PROC)
    }

    /// The bytes after the fixed words.
    pub fn payload(&self) -> &[u8] {
        self.buffer.as_ref().get(FIXED_HEADER_LEN..).unwrap_or(&[])
    }
}

/// A checked RPC-over-RDMA transport header (RFC 5666 s4.1, s4.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportHeader {
    /// Transaction ID; equals the RPC message's XID (RFC 5666 s4.1).
    pub xid: u32,
    /// Protocol version; 1 in everything `parse` returns.
    pub vers: u32,
    /// Credits requested (in calls) or granted (in replies), RFC 5666 s3.3.
    pub credits: u32,
    /// Message type and its type-specific fields.
    pub body: MessageBody,
    /// Chunk lists; empty unless `body` is Msg, NoMsg or MsgP.
    pub chunks: ChunkLists,
}

impl Default for TransportHeader {
    fn default() -> Self {
        TransportHeader::new(0, 0, MessageBody::Msg)
    }
}

impl TransportHeader {
    /// A Version One header with empty chunk lists.
    pub fn new(xid: u32, credits: u32, body: MessageBody) -> Self {
        TransportHeader {
            xid,
            vers: RPCRDMA_VERSION,
            credits,
            body,
            chunks: ChunkLists::new(),
        }
    }

    /// An empty RDMA_MSG header whose lists can hold everything `limits`
    /// allows: a per-connection scratch header that never allocates.
    pub fn with_capacity(limits: &Limits) -> Self {
        TransportHeader {
            chunks: ChunkLists::with_capacity(limits),
            ..Self::default()
        }
    }

    /// The RDMA_MSGP padding parameters, if this is an RDMA_MSGP header.
    pub fn padding(&self) -> Option<Padding> {
        match self.body {
            MessageBody::MsgP { align, thresh } => Some(Padding { align, thresh }),
            _ => None,
        }
    }

    /// Decodes a header from the start of `bytes` into `self`, reusing the
    /// capacity of its chunk lists (see the module documentation).
    ///
    /// # Errors
    /// * [`Error::Truncated`]: the input ends inside the header.
    /// * [`Error::LimitExceeded`]: a list is longer than `limits` allows,
    ///   or a chunk's segments add up to more than `u32::MAX` bytes.
    /// * [`Error::UnknownValue`]: a list presence word is neither 0 nor 1.
    /// * [`Error::Malformed`]: a read position is misaligned, decreasing,
    ///   or zero outside RDMA_NOMSG; or the reply chunk is empty.
    ///
    /// On error `self` holds a partial decode; its fixed fields are valid
    /// only if the input had 16 bytes (use [`HeaderView`] for the XID).
    pub fn parse_into(&mut self, bytes: &[u8], limits: &Limits) -> Result<Decoded> {
        // The commonest header by far, a Version One RDMA_MSG with three
        // empty lists (every call and reply carried inline), decoded
        // without the list machinery; the general decode gives the same
        // result (`tests::prop_shortcut_parse_is_the_general_parse`).
        if let Some(w) = bytes.get(..MIN_CHUNKED_HEADER_LEN) {
            let word = |i: usize| be32(w, i);
            if word(4) == RPCRDMA_VERSION
                && word(12) == proc_type::RDMA_MSG
                && w[FIXED_HEADER_LEN..].iter().all(|&b| b == 0)
            {
                self.chunks.clear();
                self.xid = word(0);
                self.vers = RPCRDMA_VERSION;
                self.credits = word(8);
                self.body = MessageBody::Msg;
                return Ok(Decoded::Header {
                    len: MIN_CHUNKED_HEADER_LEN,
                });
            }
        }
        self.parse_into_general(bytes, limits)
    }

    /// [`TransportHeader::parse_into`] without its shortcut for the
    /// commonest header.
    fn parse_into_general(&mut self, bytes: &[u8], limits: &Limits) -> Result<Decoded> {
        self.chunks.clear();
        let mut dec = Decoder::new(bytes);
        // fixed = xid vers credits proc               -- RFC 5666 s4.1
        let xid = dec.get_u32()?;
        let vers = dec.get_u32()?;
        let credits = dec.get_u32()?;
        let proc = dec.get_u32()?;
        self.xid = xid;
        self.vers = vers;
        self.credits = credits;
        if vers != RPCRDMA_VERSION {
            self.body = MessageBody::Unknown { proc_type: proc };
            return Ok(Decoded::UnsupportedVersion { xid, vers });
        }
        self.body = match proc {
            proc_type::RDMA_MSG => MessageBody::Msg,
            proc_type::RDMA_NOMSG => MessageBody::NoMsg,
            // msgp = align thresh chunk_lists       -- RFC 5666 s4.3
            proc_type::RDMA_MSGP => MessageBody::MsgP {
                align: dec.get_u32()?,
                thresh: dec.get_u32()?,
            },
            proc_type::RDMA_DONE => MessageBody::Done,
            proc_type::RDMA_ERROR => MessageBody::Error(ErrorBody::decode(&mut dec)?),
            other => MessageBody::Unknown { proc_type: other },
        };
        if self.body.has_chunk_lists() {
            self.chunks.decode(&mut dec, limits)?;
            self.chunks.validate(self.body == MessageBody::NoMsg)?;
        }
        Ok(Decoded::Header {
            len: dec.position(),
        })
    }

    /// Decodes a Version One header from the start of `bytes`; returns it
    /// and its length in bytes. Allocates; the engine uses
    /// [`TransportHeader::parse_into`].
    ///
    /// # Errors
    /// As [`TransportHeader::parse_into`], plus [`Error::UnknownValue`]
    /// when the version is not 1.
    pub fn parse(bytes: &[u8], limits: &Limits) -> Result<(Self, usize)> {
        let mut h = TransportHeader::default();
        match h.parse_into(bytes, limits)? {
            Decoded::Header { len } => Ok((h, len)),
            Decoded::UnsupportedVersion { .. } => Err(Error::UnknownValue),
        }
    }

    /// Checks the rules `emit` enforces (see the module documentation;
    /// also: no chunk lists on bodies that have none, and no
    /// [`MessageBody::Unknown`] / [`ErrorBody::Other`] carrying a number
    /// this module knows).
    ///
    /// # Errors
    /// [`Error::Malformed`] for a rule broken, [`Error::LimitExceeded`]
    /// for a chunk longer than `u32::MAX` bytes.
    pub fn validate(&self) -> Result<()> {
        if self.body.has_chunk_lists() {
            return self.chunks.validate(self.body == MessageBody::NoMsg);
        }
        if !self.chunks.is_empty() {
            return Err(Error::Malformed);
        }
        // Catch-all variants must not spell a known number: the bytes would
        // then parse as something else.
        match self.body {
            MessageBody::Unknown { proc_type } if proc_type <= proc_type::RDMA_ERROR => {
                Err(Error::Malformed)
            }
            MessageBody::Error(ErrorBody::Other { code, .. })
                if code == err_code::ERR_VERS || code == err_code::ERR_CHUNK =>
            {
                Err(Error::Malformed)
            }
            _ => Ok(()),
        }
    }

    /// Exact number of bytes [`TransportHeader::emit`] writes.
    pub fn buffer_len(&self) -> usize {
        FIXED_HEADER_LEN
            + match &self.body {
                MessageBody::Msg | MessageBody::NoMsg => self.chunks.buffer_len(),
                MessageBody::MsgP { .. } => 8 + self.chunks.buffer_len(),
                MessageBody::Done | MessageBody::Unknown { .. } => 0,
                MessageBody::Error(e) => e.buffer_len(),
            }
    }

    /// Writes the header at the start of `buf`; returns the bytes written
    /// (always [`TransportHeader::buffer_len`]).
    ///
    /// # Errors
    /// Those of [`TransportHeader::validate`], checked first; then
    /// [`Error::BufferTooShort`] if `buf` is shorter than `buffer_len()`.
    /// Nothing is written on error.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        let mut enc = Encoder::new(buf);
        self.encode(&mut enc)?;
        Ok(enc.position())
    }

    /// Appends the header to `enc` (see [`TransportHeader::emit`]).
    ///
    /// # Errors
    /// As [`TransportHeader::emit`]; nothing is written on error.
    //
    // header = xid vers credits proc body
    // body   = chunk_lists                     ; RDMA_MSG, RDMA_NOMSG
    //        / align thresh chunk_lists        ; RDMA_MSGP
    //        / (nothing)                       ; RDMA_DONE, unknown types
    //        / rpc_rdma_error                  ; RDMA_ERROR
    //                                          -- RFC 5666 s4.1, s4.3
    pub fn encode(&self, enc: &mut Encoder<'_>) -> Result<()> {
        // The commonest header (see `parse_into`): seven words, nothing
        // to validate.
        if self.body == MessageBody::Msg && self.chunks.is_empty() {
            let out = enc.take(MIN_CHUNKED_HEADER_LEN)?;
            out[..4].copy_from_slice(&self.xid.to_be_bytes());
            out[4..8].copy_from_slice(&self.vers.to_be_bytes());
            out[8..12].copy_from_slice(&self.credits.to_be_bytes());
            out[12..16].copy_from_slice(&proc_type::RDMA_MSG.to_be_bytes());
            out[16..].fill(0);
            return Ok(());
        }
        self.validate()?;
        if enc.remaining() < self.buffer_len() {
            return Err(Error::BufferTooShort);
        }
        enc.put_u32(self.xid)?;
        enc.put_u32(self.vers)?;
        enc.put_u32(self.credits)?;
        enc.put_u32(self.body.proc_type())?;
        match &self.body {
            MessageBody::Msg | MessageBody::NoMsg => self.chunks.encode(enc),
            MessageBody::MsgP { align, thresh } => {
                enc.put_u32(*align)?;
                enc.put_u32(*thresh)?;
                self.chunks.encode(enc)
            }
            MessageBody::Done | MessageBody::Unknown { .. } => Ok(()),
            MessageBody::Error(e) => e.encode(enc),
        }
    }

    /// Checks that the RPC message after an RDMA_MSG or RDMA_MSGP header
    /// starts with this header's XID (RFC 5666 s4.1), reading the word at
    /// `header_len` in `message` (the whole received Send). Types without
    /// an inline RPC message pass trivially.
    ///
    /// # Errors
    /// [`Error::Truncated`] if no word follows the header;
    /// [`Error::Malformed`] if the XIDs differ.
    pub fn check_rpc_xid(&self, message: &[u8], header_len: usize) -> Result<()> {
        if !self.body.has_inline_message() {
            return Ok(());
        }
        match rpc_xid_at(message, header_len) {
            None => Err(Error::Truncated),
            Some(x) if x == self.xid => Ok(()),
            Some(_) => Err(Error::Malformed),
        }
    }
}

/// The big-endian word at `offset` in `bytes` (the RPC XID when `offset` is
/// the transport header length), if present.
pub fn rpc_xid_at(bytes: &[u8], offset: usize) -> Option<u32> {
    let end = offset.checked_add(4)?;
    let b = bytes.get(offset..end)?;
    Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

// ---------------------------------------------------------------------------
// RFC 8797 connection private data

/// Magic number that opens RPC-over-RDMA private data (RFC 8797).
pub const PRIVATE_DATA_MAGIC: u32 = 0xf6ab_0e18;
/// The private data format version we speak.
pub const PRIVATE_DATA_VERSION: u8 = 1;
/// Encoded length of the private data.
pub const PRIVATE_DATA_LEN: usize = 8;
/// Inline threshold assumed when a peer sent no valid private data.
pub const DEFAULT_INLINE_SIZE: u32 = 1024;
/// Flag bit: the sender accepts Send With Invalidate.
const FLAG_REMOTE_INVALIDATE: u8 = 0x01;

/// RPC-over-RDMA connection private data (RFC 8797): what a peer exchanges
/// in the CM connect request / accept.
///
/// Layout: magic (u32), version (u8), flags (u8), send size code (u8),
/// receive size code (u8); a code `c` means `(c + 1) * 1024` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrivateData {
    /// The sender can receive Send With Invalidate (flags bit 0).
    pub remote_invalidate: bool,
    /// Largest Send the sender will post, in bytes.
    pub max_send_size: u32,
    /// Largest Send the sender can receive, in bytes.
    pub max_recv_size: u32,
}

impl PrivateData {
    /// What to assume for a peer without valid private data (RFC 8797):
    /// 1024-byte inline thresholds, no remote invalidation.
    pub const DEFAULT: PrivateData = PrivateData {
        remote_invalidate: false,
        max_send_size: DEFAULT_INLINE_SIZE,
        max_recv_size: DEFAULT_INLINE_SIZE,
    };

    /// Decodes private data. `None` means the bytes are not valid
    /// RPC-over-RDMA private data (too short, wrong magic or unknown
    /// version) and the peer is to be treated per RFC 8797 as having sent
    /// none: use [`PrivateData::DEFAULT`]. Bytes after the first eight are
    /// ignored (CM private data areas are padded). Unknown flag bits are
    /// ignored.
    pub fn parse(bytes: &[u8]) -> Option<PrivateData> {
        let b = bytes.get(..PRIVATE_DATA_LEN)?;
        let magic = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        if magic != PRIVATE_DATA_MAGIC || b[4] != PRIVATE_DATA_VERSION {
            return None;
        }
        Some(PrivateData {
            remote_invalidate: b[5] & FLAG_REMOTE_INVALIDATE != 0,
            max_send_size: size_from_code(b[6]),
            max_recv_size: size_from_code(b[7]),
        })
    }

    /// [`PrivateData::parse`], falling back to [`PrivateData::DEFAULT`].
    pub fn parse_or_default(bytes: &[u8]) -> PrivateData {
        Self::parse(bytes).unwrap_or(Self::DEFAULT)
    }

    /// Always [`PRIVATE_DATA_LEN`].
    pub const fn buffer_len(&self) -> usize {
        PRIVATE_DATA_LEN
    }

    /// Writes the eight bytes at the start of `buf`; returns 8.
    ///
    /// # Errors
    /// [`Error::Malformed`] if a size is not a multiple of 1024 between
    /// 1024 and 262144 (not encodable); [`Error::BufferTooShort`] if `buf`
    /// is shorter than 8 bytes. Nothing is written on error.
    //
    // private_data = magic version flags send_code recv_code  -- RFC 8797
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        let send = size_code(self.max_send_size).ok_or(Error::Malformed)?;
        let recv = size_code(self.max_recv_size).ok_or(Error::Malformed)?;
        let out = buf
            .get_mut(..PRIVATE_DATA_LEN)
            .ok_or(Error::BufferTooShort)?;
        out[..4].copy_from_slice(&PRIVATE_DATA_MAGIC.to_be_bytes());
        out[4] = PRIVATE_DATA_VERSION;
        out[5] = if self.remote_invalidate {
            FLAG_REMOTE_INVALIDATE
        } else {
            0
        };
        out[6] = send;
        out[7] = recv;
        Ok(PRIVATE_DATA_LEN)
    }
}

fn size_from_code(code: u8) -> u32 {
    (u32::from(code) + 1) * 1024
}

/// The RFC 8797 code for `size` bytes, if `size` is encodable exactly.
pub fn size_code(size: u32) -> Option<u8> {
    if size == 0 || size & 1023 != 0 {
        return None;
    }
    u8::try_from(size / 1024 - 1).ok()
}

// ---------------------------------------------------------------------------
// Fuzzing entry point

/// Runs every parser of this module and of [`super::conf`] over `data` and
/// checks their invariants: a header that parses re-emits into exactly
/// `buffer_len()` bytes and parses back equal, also through a reused
/// scratch header. For the lead's cargo-fuzz target.
///
/// # Panics
/// Only when a codec invariant is broken (that is what it is for).
pub fn fuzz_parse(data: &[u8]) {
    let limits = Limits::DEFAULT;
    let view_xid = HeaderView::new_checked(data).map(|v| v.xid());
    let mut scratch = TransportHeader::with_capacity(&limits);
    let decoded = scratch.parse_into(data, &limits);
    match TransportHeader::parse(data, &limits) {
        Ok((h, len)) => {
            assert_eq!(decoded, Ok(Decoded::Header { len }));
            assert_eq!(scratch, h);
            assert!(len <= data.len());
            assert_eq!(Ok(h.xid), view_xid);
            let mut buf = vec![0u8; h.buffer_len()];
            let n = h.emit(&mut buf).expect("a parsed header must emit");
            assert_eq!(n, buf.len());
            let (again, len2) = TransportHeader::parse(&buf, &limits).expect("re-parse");
            assert_eq!(again, h);
            assert_eq!(len2, n);
            if h.body.has_inline_message() {
                let _ = h.check_rpc_xid(data, len);
            }
            if let Some(p) = h.padding() {
                let _ = p.pad_len(len, u32::MAX);
            }
        }
        Err(e) => {
            if let Ok(Decoded::UnsupportedVersion { xid, vers }) = decoded {
                assert_eq!(e, Error::UnknownValue);
                assert_eq!(Ok(xid), view_xid);
                assert_ne!(vers, RPCRDMA_VERSION);
            } else {
                assert_eq!(decoded, Err(e));
            }
        }
    }
    // Capacity never exceeds what the limits allow.
    assert!(scratch.chunks.reads.capacity() <= limits.max_read_segments);
    assert!(scratch.chunks.write_counts.capacity() <= limits.max_write_chunks);
    assert!(scratch.chunks.reply.capacity() <= limits.max_reply_segments);

    if let Ok(req) = super::conf::ConfigRdmaReq::parse(data) {
        let mut buf = [0u8; super::conf::BODY_LEN];
        req.emit(&mut buf).expect("emit req");
        assert_eq!(buf[..], data[..super::conf::BODY_LEN]);
    }
    if let Ok(rep) = super::conf::ConfigRdmaReply::parse(data) {
        let mut buf = [0u8; super::conf::BODY_LEN];
        rep.emit(&mut buf).expect("emit reply");
        assert_eq!(buf[..], data[..super::conf::BODY_LEN]);
    }
    if let Some(pd) = PrivateData::parse(data) {
        let mut buf = [0u8; PRIVATE_DATA_LEN];
        pd.emit(&mut buf).expect("emit private data");
        assert_eq!(PrivateData::parse(&buf), Some(pd));
    }
}

#[cfg(test)]
mod tests;
