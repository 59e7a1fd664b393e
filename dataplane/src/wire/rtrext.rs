//! Noveck's round-trip reduction extension to RPC-over-RDMA
//! (draft-dnoveck-rpcrdma-rtrext-02, "rtrext" below): the transport
//! properties it defines (s8), its data placement structures (s6-7) and
//! its four new operations (s9), as far as the draft defines bytes.
//!
//! # How the operations ride in a Version One message
//! The draft overlays its operations on the opaque body of an
//! "optional" header type that a future protocol version was to define
//! (rtrext s1.3, s9.1). Version One has no such type, so we define one
//! (see `docs/EXTENSIONS.md`):
//!
//! ```text
//! xid vers=1 credits proc=RDMA_OPTIONAL opttype optinfo<> [payload stream]
//! ```
//!
//! The first four words are the Version One fixed words (RFC 5666 s4.1),
//! so [`super::rpcrdma::HeaderView`] works unchanged and a plain Version
//! One receiver sees an unknown message type (it answers ERR_CHUNK). The
//! operation structure is carried as a counted opaque so that a receiver
//! can step over an operation it does not know. The engine may send these
//! headers only to a peer that negotiated them in CONF_RDMA version 2
//! ([`super::conf2`]); [`OptionalHeader::emit`] takes the negotiated
//! [`Extensions`] and refuses to write a header the peer did not agree to.
//!
//! # Shape of the API
//! * [`OptionalView`]: zero-copy view of the six fixed words (the engine
//!   needs XID and operation type to report an error about a header whose
//!   body does not parse).
//! * [`OptionalHeader`]: checked representation with `parse`,
//!   `parse_into`, `buffer_len` and `emit`. Variable-length parts
//!   ([`DataPlacement`], [`ResponseDirections`]) sit beside the
//!   [`Operation`] and store their nested arrays flattened in reusable
//!   vectors, as `rpcrdma::ChunkLists` does: a warmed scratch header (or
//!   one built with `with_capacity`) parses without allocating, and no
//!   vector ever grows past its [`Limits`] field.
//! * [`PropertyList`]: the transport property list (rtrext s8.1, the
//!   property model of RPC-over-RDMA Version Two), with the four rtrext
//!   properties and our extension flag word typed, anything else kept
//!   opaque.
//!
//! # Outcomes the engine answers
//! * An operation type this module does not know parses as
//!   [`Operation::Unknown`] (its optinfo skipped); the engine may answer
//!   Report Error with [`ErrorInfo::BadOptionalType`].
//! * Any other failure is an [`Error`]; the XID and operation type for a
//!   report come from [`OptionalView`] once the fixed words arrived.
//! * Semantic checks that need connection state (buffer segment numbers
//!   against the peer's buffer structure, offsets, transmission order and
//!   counts) are the engine's, reported with [`ErrorInfo`].
//!
//! # Validation (checked by parse and again by emit)
//! * Excised items (explicit-RDMA or target-buffer placement) sit at
//!   4-byte aligned displacements of the virtual XDR stream, in stream
//!   order, without overlapping (each starts at or after the previous
//!   one's displacement plus its XDR-rounded length).
//! * An explicit-RDMA location has at least one segment and its segment
//!   lengths add up to at most `u32::MAX`; a target-buffer location names
//!   at least one buffer segment, with strictly increasing numbers.
//! * Placement types that rtrext s6.2 (Table 1) calls XDR-invalid in a
//!   context fail to decode ([`Error::UnknownValue`]); the ones it calls
//!   semantically invalid (too-short / no-item results in a request) are
//!   [`Error::Malformed`].
//! * Response direction sets have 4-byte aligned starts, non-empty ranges,
//!   and come in increasing, disjoint order (rtrext s7.4).
//! * A transmission group has at least one transmission; continuation
//!   transmissions are numbered from 1 (the initial one is 0).
//! * The optinfo length must equal what its structure uses.
//! * Property lists: no duplicate ids, typed values use exactly their
//!   opaque length, limits above zero, buffer structures consistent.
//! * On parse only: counts within [`Limits`], checked before storing.
//!
//! # Panic contract
//! Nothing here panics on any input, except [`fuzz_parse`], whose job is
//! to panic when a codec invariant breaks. Emitters validate first and
//! check the buffer size before writing a byte.

use super::extensions::Extensions;
use super::rpc::MessageType;
use super::rpcrdma::{word_at, HeaderView, Segment, FIXED_HEADER_LEN, RPCRDMA_VERSION};
use super::xdr::{roundup, Decoder, Encoder};
use super::{Error, Result};

/// The message type (`rdma_proc`) of a header carrying an rtrext
/// operation. Our assignment: Version One uses 0..=4 (RFC 5666 s4.3), the
/// next number is the one a receiver that knows nothing about it will
/// refuse as unknown.
pub const RDMA_OPTIONAL: u32 = 5;

/// Length of the fixed words of an optional header: the four Version One
/// words, the operation type and the optinfo length.
pub const OPTIONAL_FIXED_LEN: usize = FIXED_HEADER_LEN + 8;

/// Operation type numbers (`opttype`, rtrext s9.1 Table 4).
///
/// The draft's table (5..=8) and its XDR constants (1..=4, s9.2-9.5,
/// s10.2) disagree. We take the table: the operation-type space is shared
/// by every extension, and the low numbers are the likeliest to be taken
/// by the companion property-exchange extension the draft builds on.
pub mod op_type {
    /// Transmit Request (rtrext s9.2): first or only transmission of a call.
    pub const TRANSMIT_REQUEST: u32 = 5;
    /// Transmit Response (rtrext s9.3): first or only transmission of a reply.
    pub const TRANSMIT_RESPONSE: u32 = 6;
    /// Transmit Continue (rtrext s9.4): a later transmission of a group.
    pub const TRANSMIT_CONTINUE: u32 = 7;
    /// Report Error (rtrext s9.5).
    pub const REPORT_ERROR: u32 = 8;
}

/// Transport property ids (rtrext s8.1 Table 3, plus ours).
pub mod prop_id {
    /// RTR Support (rtrext s8.2): which new operations the sender supports.
    pub const RTR_SUPPORT: u32 = 3;
    /// Receive Buffer Structure (rtrext s8.3).
    pub const RECEIVE_BUFFER_STRUCTURE: u32 = 4;
    /// Request Transmission Receive Limit (rtrext s8.4).
    pub const REQUEST_TRANSMISSION_RECEIVE_LIMIT: u32 = 5;
    /// Response Transmission Send Limit (rtrext s8.5).
    pub const RESPONSE_TRANSMISSION_SEND_LIMIT: u32 = 6;
    /// Ours: the extension flag word of CONF_RDMA version 2 (see
    /// `super::super::conf2::ext_flag`). Ids with the top bit set are left
    /// for local use by us; no draft assigns there.
    pub const EXTENSION_FLAGS: u32 = 0x8000_0001;
}

/// Flag bit of a buffer segment (rtrext s7.2): the segment may receive
/// placed bulk data ("placement-targetable").
pub const SEGMENT_FLAG_PLACEMENT_TARGET: u32 = 0x01;

const SEGMENT_LEN: usize = 16;
/// Smallest encodings, for `get_count`'s input-size check.
const MIN_ITEM_LEN: usize = 12; // disp, length, type
const MIN_SET_LEN: usize = 12; // begin, end, item count
const MIN_DIRECTION_LEN: usize = 8; // minlen, type
const MIN_PROPERTY_LEN: usize = 8; // id, value length
const BUFFER_GROUP_LEN: usize = 16; // count, length, align, flags

// ---------------------------------------------------------------------------
// Limits

/// Bounds on what a peer may send, checked while parsing before anything
/// is stored.
///
/// An rtrext header must fit in one receive buffer (the inline threshold,
/// 1 KiB to 64 KiB) together with at least the start of its payload, so a
/// few dozen placement entries is already generous. Property lists travel
/// once per connection, in a CONF_RDMA call or reply.
///
/// | field | default | reason |
/// |---|---|---|
/// | `max_items` | 16 | one per DDP-eligible item of a message; an NFSv4 COMPOUND has a few |
/// | `max_segments` | 64 | all RDMA segments of one header, as `rpcrdma::Limits` |
/// | `max_buffer_numbers` | 64 | target buffer segments over all items: 1 MiB in 16 KiB segments |
/// | `max_direction_sets` | 16 | one per operation of a COMPOUND that may return bulk data |
/// | `max_directions` | 32 | over all sets |
/// | `max_properties` | 16 | five are defined today |
/// | `max_property_len` | 512 | a buffer structure of 31 groups |
/// | `max_buffer_groups` | 16 | a receive buffer is a handful of differently aligned regions |
/// | `max_buffer_segments` | 1024 | segments in one receive buffer, summed over groups |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Placed items (`xmdp_mitem`) in one header.
    pub max_items: usize,
    /// RDMA segments in one header, over all locations and directions.
    pub max_segments: usize,
    /// Target buffer segment numbers in one header, over all items.
    pub max_buffer_numbers: usize,
    /// Response direction sets (`xmdp_rsdset`).
    pub max_direction_sets: usize,
    /// Response directions (`xmdp_rsditem`), over all sets.
    pub max_directions: usize,
    /// Entries of a property list.
    pub max_properties: usize,
    /// Bytes of one property value.
    pub max_property_len: usize,
    /// Groups of a receive buffer structure.
    pub max_buffer_groups: usize,
    /// Segments of a receive buffer structure (sum of the group counts).
    pub max_buffer_segments: u64,
}

impl Limits {
    /// The documented defaults (see the type's documentation).
    pub const DEFAULT: Limits = Limits {
        max_items: 16,
        max_segments: 64,
        max_buffer_numbers: 64,
        max_direction_sets: 16,
        max_directions: 32,
        max_properties: 16,
        max_property_len: 512,
        max_buffer_groups: 16,
        max_buffer_segments: 1024,
    };
}

impl Default for Limits {
    fn default() -> Self {
        Limits::DEFAULT
    }
}

// ---------------------------------------------------------------------------
// Small shared helpers

// segment = handle length offset(hyper)      -- RFC 5666 s4.3
fn decode_segment(dec: &mut Decoder<'_>) -> Result<Segment> {
    Ok(Segment {
        handle: dec.get_u32()?,
        length: dec.get_u32()?,
        offset: dec.get_u64()?,
    })
}

fn encode_segment(enc: &mut Encoder<'_>, s: &Segment) -> Result<()> {
    enc.put_u32(s.handle)?;
    enc.put_u32(s.length)?;
    enc.put_u64(s.offset)
}

/// Makes room for `additional` more elements without ever growing `v`'s
/// capacity past `max` (the caller checked `v.len() + additional <= max`).
fn reserve_bounded<T>(v: &mut Vec<T>, additional: usize, max: usize) {
    let needed = v.len().saturating_add(additional);
    if needed > v.capacity() {
        let target = needed
            .max(v.capacity().saturating_mul(2))
            .min(max.max(needed));
        v.reserve_exact(target - v.len());
    }
}

/// Reads the count of an array whose elements go into a pool that already
/// holds `used` of at most `max` entries.
fn get_pool_count(dec: &mut Decoder<'_>, used: usize, max: usize, min_len: usize) -> Result<usize> {
    dec.get_count(max.saturating_sub(used), min_len)
}

/// A pool range as stored in a record; empty ranges are always `(0, 0)`,
/// so that equal values compare equal however they were built.
fn pool_range(start: usize, count: usize) -> Result<(u32, u32)> {
    if count == 0 {
        Ok((0, 0))
    } else {
        Ok((to_u32(start)?, to_u32(count)?))
    }
}

fn to_u32(n: usize) -> Result<u32> {
    u32::try_from(n).map_err(|_| Error::LimitExceeded)
}

/// Segment lengths of one location add up to at most `u32::MAX`: the
/// location holds one XDR item, whose length is a 32-bit word.
fn check_segments(segments: &[Segment]) -> Result<()> {
    if segments.is_empty() {
        return Err(Error::Malformed);
    }
    segments
        .iter()
        .try_fold(0u32, |acc, s| acc.checked_add(s.length))
        .map(|_| ())
        .ok_or(Error::LimitExceeded)
}

fn encode_segments(enc: &mut Encoder<'_>, segments: &[Segment]) -> Result<()> {
    enc.put_count(segments.len())?;
    segments.iter().try_for_each(|s| encode_segment(enc, s))
}

fn decode_segments_into(
    dec: &mut Decoder<'_>,
    pool: &mut Vec<Segment>,
    max: usize,
) -> Result<(u32, u32)> {
    let n = get_pool_count(dec, pool.len(), max, SEGMENT_LEN)?;
    let start = pool.len();
    reserve_bounded(pool, n, max);
    for _ in 0..n {
        pool.push(decode_segment(dec)?);
    }
    pool_range(start, n)
}

fn slice_of<T>(pool: &[T], start: u32, count: u32) -> &[T] {
    let start = start as usize;
    // Records are built only by push/decode, which keep ranges in bounds;
    // `get` keeps this total regardless.
    pool.get(start..start.saturating_add(count as usize))
        .unwrap_or(&[])
}

// ---------------------------------------------------------------------------
// Placement types (rtrext s6.2)

/// `xmdp_type` (rtrext s6.2): how a DDP-eligible item is or is to be placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PlacementType {
    /// `XMPTYPE_EXRW = 1`: explicit RDMA Read or Write (chunk-style DDP).
    ExplicitRdma,
    /// `XMPTYPE_TBSN = 2`: send-based placement into target buffer segments.
    TargetBuffers,
    /// `XMPTYPE_CHOOSE = 3` (s6.2 text calls it CHOICE): the responder picks.
    Choice,
    /// `XMPTYPE_BYSIZE = 4`: the responder picks by the item's size.
    BySize,
    /// `XMPTYPE_TOOSHORT = 5`: the item was too short and went inline.
    TooShort,
    /// `XMPTYPE_NOITEM = 6`: no reply item matched the direction.
    NoItem,
}

impl PlacementType {
    /// The discriminant on the wire.
    pub const fn to_wire(self) -> u32 {
        match self {
            PlacementType::ExplicitRdma => 1,
            PlacementType::TargetBuffers => 2,
            PlacementType::Choice => 3,
            PlacementType::BySize => 4,
            PlacementType::TooShort => 5,
            PlacementType::NoItem => 6,
        }
    }

    /// The type with discriminant `value`.
    ///
    /// # Errors
    /// [`Error::UnknownValue`] outside 1..=6.
    pub const fn from_wire(value: u32) -> Result<Self> {
        Ok(match value {
            1 => PlacementType::ExplicitRdma,
            2 => PlacementType::TargetBuffers,
            3 => PlacementType::Choice,
            4 => PlacementType::BySize,
            5 => PlacementType::TooShort,
            6 => PlacementType::NoItem,
            _ => return Err(Error::UnknownValue),
        })
    }
}

// ---------------------------------------------------------------------------
// Message data placement (rtrext s7.3)

/// Where one item of bulk data is (`xmdp_loc`, rtrext s7.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ItemLocation<'a> {
    /// Fetched from / written to these registered segments (`XMPTYPE_EXRW`).
    ExplicitRdma(&'a [Segment]),
    /// In the receiver's placement-targetable buffer segments
    /// (`XMPTYPE_TBSN`): starting `offset` bytes into the first listed
    /// segment, then through the following ones.
    TargetBuffers {
        /// Byte offset into `buffer_segments[0]`.
        offset: u32,
        /// Target buffer segment numbers of the transmission group.
        buffer_segments: &'a [u32],
    },
    /// Response only: the matching item was shorter than the direction's
    /// minimum and travels inline (`XMPTYPE_TOOSHORT`).
    TooShort,
    /// Response only: no reply item matched the direction
    /// (`XMPTYPE_NOITEM`).
    NoItem,
}

impl ItemLocation<'_> {
    /// The placement type of this location.
    pub fn placement_type(&self) -> PlacementType {
        match self {
            ItemLocation::ExplicitRdma(_) => PlacementType::ExplicitRdma,
            ItemLocation::TargetBuffers { .. } => PlacementType::TargetBuffers,
            ItemLocation::TooShort => PlacementType::TooShort,
            ItemLocation::NoItem => PlacementType::NoItem,
        }
    }

    /// True when the item was excised from the payload stream.
    pub fn is_excised(&self) -> bool {
        matches!(
            self,
            ItemLocation::ExplicitRdma(_) | ItemLocation::TargetBuffers { .. }
        )
    }
}

/// One item of bulk data of a message (`xmdp_mitem`, rtrext s7.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlacedItem<'a> {
    /// Displacement of the item in the virtual XDR stream.
    pub disp: u32,
    /// Length of the item in bytes.
    pub length: u32,
    /// Where its bytes are.
    pub location: ItemLocation<'a>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ItemRecord {
    disp: u32,
    length: u32,
    kind: PlacementType,
    /// TargetBuffers: the byte offset; otherwise 0.
    offset: u32,
    /// Range in the segment pool (ExplicitRdma) or the buffer number pool
    /// (TargetBuffers).
    start: u32,
    count: u32,
}

/// The placement of all bulk data of one message (`xmdp_grpinfo`, rtrext
/// s7.3), stored flattened for reuse (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DataPlacement {
    items: Vec<ItemRecord>,
    segments: Vec<Segment>,
    buffer_numbers: Vec<u32>,
}

/// Iterator over the items of a [`DataPlacement`].
#[derive(Debug, Clone)]
pub struct PlacedItems<'a> {
    placement: &'a DataPlacement,
    records: core::slice::Iter<'a, ItemRecord>,
}

impl<'a> Iterator for PlacedItems<'a> {
    type Item = PlacedItem<'a>;

    fn next(&mut self) -> Option<PlacedItem<'a>> {
        self.records.next().map(|r| self.placement.view(r))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.records.size_hint()
    }
}

impl DataPlacement {
    /// No items; nothing allocated.
    pub fn new() -> Self {
        Self::default()
    }

    /// No items, with room for everything `limits` allows.
    pub fn with_capacity(limits: &Limits) -> Self {
        DataPlacement {
            items: Vec::with_capacity(limits.max_items),
            segments: Vec::with_capacity(limits.max_segments),
            buffer_numbers: Vec::with_capacity(limits.max_buffer_numbers),
        }
    }

    /// Removes all items, keeping the storage.
    pub fn clear(&mut self) {
        self.items.clear();
        self.segments.clear();
        self.buffer_numbers.clear();
    }

    /// True when no bulk data was excised (payload and virtual XDR stream
    /// are the same).
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Number of items.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// The items, in wire order.
    pub fn items(&self) -> PlacedItems<'_> {
        PlacedItems {
            placement: self,
            records: self.items.iter(),
        }
    }

    /// Item `index`, if there is one.
    pub fn get(&self, index: usize) -> Option<PlacedItem<'_>> {
        self.items.get(index).map(|r| self.view(r))
    }

    /// The segments of explicit-RDMA item `index`, for rewriting their
    /// lengths to the bytes actually written (as RFC 5666 s3.6 does for
    /// write chunks). `None` for other items.
    pub fn segments_mut(&mut self, index: usize) -> Option<&mut [Segment]> {
        let r = *self.items.get(index)?;
        if r.kind != PlacementType::ExplicitRdma {
            return None;
        }
        let start = r.start as usize;
        self.segments.get_mut(start..start + r.count as usize)
    }

    fn view(&self, r: &ItemRecord) -> PlacedItem<'_> {
        let location = match r.kind {
            PlacementType::ExplicitRdma => {
                ItemLocation::ExplicitRdma(slice_of(&self.segments, r.start, r.count))
            }
            PlacementType::TargetBuffers => ItemLocation::TargetBuffers {
                offset: r.offset,
                buffer_segments: slice_of(&self.buffer_numbers, r.start, r.count),
            },
            PlacementType::TooShort => ItemLocation::TooShort,
            _ => ItemLocation::NoItem,
        };
        PlacedItem {
            disp: r.disp,
            length: r.length,
            location,
        }
    }

    /// Appends an item (copying its slices). Not validated here: `emit`
    /// checks the rules.
    ///
    /// # Errors
    /// [`Error::LimitExceeded`] if a pool would pass `u32::MAX` entries.
    pub fn push(&mut self, item: PlacedItem<'_>) -> Result<()> {
        let (offset, start, count) = match item.location {
            ItemLocation::ExplicitRdma(segs) => {
                let (start, count) = pool_range(self.segments.len(), segs.len())?;
                self.segments.extend_from_slice(segs);
                (0, start, count)
            }
            ItemLocation::TargetBuffers {
                offset,
                buffer_segments,
            } => {
                let (start, count) = pool_range(self.buffer_numbers.len(), buffer_segments.len())?;
                self.buffer_numbers.extend_from_slice(buffer_segments);
                (offset, start, count)
            }
            ItemLocation::TooShort | ItemLocation::NoItem => (0, 0, 0),
        };
        self.items.push(ItemRecord {
            disp: item.disp,
            length: item.length,
            kind: item.location.placement_type(),
            offset,
            start,
            count,
        });
        Ok(())
    }

    /// Explicit-RDMA items or target-buffer items present?
    fn uses(&self, kind: PlacementType) -> bool {
        self.items.iter().any(|r| r.kind == kind)
    }

    /// The rules of the module documentation; `in_response` allows the
    /// too-short / no-item results (rtrext s6.2 Table 1).
    fn validate(&self, in_response: bool) -> Result<()> {
        let mut next_free: u64 = 0;
        for item in self.items() {
            match item.location {
                ItemLocation::ExplicitRdma(segs) => check_segments(segs)?,
                ItemLocation::TargetBuffers {
                    buffer_segments, ..
                } => {
                    if buffer_segments.is_empty()
                        || buffer_segments.windows(2).any(|w| w[0] >= w[1])
                    {
                        return Err(Error::Malformed);
                    }
                }
                ItemLocation::TooShort | ItemLocation::NoItem => {
                    if !in_response {
                        return Err(Error::Malformed);
                    }
                }
            }
            if item.location.is_excised() {
                let disp = u64::from(item.disp);
                if item.disp & 3 != 0 || disp < next_free {
                    return Err(Error::Malformed);
                }
                next_free = disp + roundup(item.length as usize) as u64;
            }
        }
        Ok(())
    }

    fn buffer_len(&self) -> usize {
        4 + self
            .items()
            .map(|i| {
                12 + match i.location {
                    ItemLocation::ExplicitRdma(s) => 4 + s.len() * SEGMENT_LEN,
                    ItemLocation::TargetBuffers {
                        buffer_segments, ..
                    } => 8 + buffer_segments.len() * 4,
                    ItemLocation::TooShort | ItemLocation::NoItem => 0,
                }
            })
            .sum::<usize>()
    }

    // grpinfo = count mitem{count}
    // mitem   = disp length loc
    // loc     = EXRW count segment{count}
    //         / TBSN offset count bsnum{count}
    //         / TOOSHORT / NOITEM                   -- rtrext s7.3, s10.2
    fn encode(&self, enc: &mut Encoder<'_>) -> Result<()> {
        enc.put_count(self.items.len())?;
        for item in self.items() {
            enc.put_u32(item.disp)?;
            enc.put_u32(item.length)?;
            enc.put_u32(item.location.placement_type().to_wire())?;
            match item.location {
                ItemLocation::ExplicitRdma(segs) => encode_segments(enc, segs)?,
                ItemLocation::TargetBuffers {
                    offset,
                    buffer_segments,
                } => {
                    enc.put_u32(offset)?;
                    enc.put_count(buffer_segments.len())?;
                    buffer_segments.iter().try_for_each(|n| enc.put_u32(*n))?;
                }
                ItemLocation::TooShort | ItemLocation::NoItem => {}
            }
        }
        Ok(())
    }

    /// Decodes into `self` (which the caller cleared), counts checked
    /// against `limits` before anything is stored.
    fn decode(&mut self, dec: &mut Decoder<'_>, limits: &Limits) -> Result<()> {
        let n = dec.get_count(limits.max_items, MIN_ITEM_LEN)?;
        reserve_bounded(&mut self.items, n, limits.max_items);
        for _ in 0..n {
            let disp = dec.get_u32()?;
            let length = dec.get_u32()?;
            let kind = PlacementType::from_wire(dec.get_u32()?)?;
            let (offset, start, count) = match kind {
                PlacementType::ExplicitRdma => {
                    let (s, c) =
                        decode_segments_into(dec, &mut self.segments, limits.max_segments)?;
                    (0, s, c)
                }
                PlacementType::TargetBuffers => {
                    let offset = dec.get_u32()?;
                    let max = limits.max_buffer_numbers;
                    let c = get_pool_count(dec, self.buffer_numbers.len(), max, 4)?;
                    let s = self.buffer_numbers.len();
                    reserve_bounded(&mut self.buffer_numbers, c, max);
                    for _ in 0..c {
                        self.buffer_numbers.push(dec.get_u32()?);
                    }
                    let (s, c) = pool_range(s, c)?;
                    (offset, s, c)
                }
                PlacementType::TooShort | PlacementType::NoItem => (0, 0, 0),
                // Not an arm of xmdp_loc: XDR-invalid (rtrext s6.2 Table 1).
                PlacementType::Choice | PlacementType::BySize => return Err(Error::UnknownValue),
            };
            self.items.push(ItemRecord {
                disp,
                length,
                kind,
                offset,
                start,
                count,
            });
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Response direction (rtrext s7.4)

/// Where the responder is to put one item of reply bulk data
/// (`xmdp_rsdloc`, rtrext s7.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyLocation<'a> {
    /// RDMA Write into these segments (`XMPTYPE_EXRW`).
    ExplicitRdma(&'a [Segment]),
    /// Send-based placement or RDMA Write into these segments, the
    /// responder's choice (`XMPTYPE_CHOOSE`).
    Choice(&'a [Segment]),
    /// Send-based placement for items up to `threshold` bytes, RDMA Write
    /// into `segments` for longer ones (`XMPTYPE_BYSIZE`; the draft names
    /// the threshold `xmdrsdl_dsdov` and leaves its direction implicit, see
    /// `docs/EXTENSIONS.md`).
    BySize {
        /// Largest item length placed by Send.
        threshold: u32,
        /// Where longer items go.
        segments: &'a [Segment],
    },
    /// Send-based placement, where the responder decides (`XMPTYPE_TBSN`).
    TargetBuffers,
}

impl ReplyLocation<'_> {
    /// The placement type of this direction.
    pub fn placement_type(&self) -> PlacementType {
        match self {
            ReplyLocation::ExplicitRdma(_) => PlacementType::ExplicitRdma,
            ReplyLocation::Choice(_) => PlacementType::Choice,
            ReplyLocation::BySize { .. } => PlacementType::BySize,
            ReplyLocation::TargetBuffers => PlacementType::TargetBuffers,
        }
    }

    /// The registered segments of the direction (empty for TargetBuffers).
    pub fn segments(&self) -> &[Segment] {
        match self {
            ReplyLocation::ExplicitRdma(s)
            | ReplyLocation::Choice(s)
            | ReplyLocation::BySize { segments: s, .. } => s,
            ReplyLocation::TargetBuffers => &[],
        }
    }
}

/// One response direction (`xmdp_rsditem`, rtrext s7.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Direction<'a> {
    /// Items shorter than this go inline (and use up this direction).
    pub min_len: u32,
    /// Where a matching item goes.
    pub location: ReplyLocation<'a>,
}

/// One response direction set (`xmdp_rsdset`, rtrext s7.4): directions
/// that apply to reply items produced by the request XDR range
/// `begin..end` (half-open).
#[derive(Debug, Clone)]
pub struct DirectionSet<'a> {
    /// First request XDR stream position of the range.
    pub begin: u32,
    /// End of the range (exclusive).
    pub end: u32,
    records: &'a [DirectionRecord],
    segments: &'a [Segment],
}

impl<'a> DirectionSet<'a> {
    /// Number of directions in the set.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// True when the set has no directions.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The directions, in wire order.
    pub fn directions(&self) -> impl Iterator<Item = Direction<'a>> + '_ {
        let segments = self.segments;
        self.records.iter().map(move |r| r.view(segments))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DirectionRecord {
    min_len: u32,
    kind: PlacementType,
    threshold: u32,
    start: u32,
    count: u32,
}

impl DirectionRecord {
    fn view<'a>(&self, pool: &'a [Segment]) -> Direction<'a> {
        let segs = slice_of(pool, self.start, self.count);
        let location = match self.kind {
            PlacementType::ExplicitRdma => ReplyLocation::ExplicitRdma(segs),
            PlacementType::Choice => ReplyLocation::Choice(segs),
            PlacementType::BySize => ReplyLocation::BySize {
                threshold: self.threshold,
                segments: segs,
            },
            _ => ReplyLocation::TargetBuffers,
        };
        Direction {
            min_len: self.min_len,
            location,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SetRecord {
    begin: u32,
    end: u32,
    first: u32,
    count: u32,
}

/// Directions for placing reply bulk data (`xmdp_rsdgroup`, rtrext s7.4),
/// stored flattened for reuse.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ResponseDirections {
    sets: Vec<SetRecord>,
    directions: Vec<DirectionRecord>,
    segments: Vec<Segment>,
}

impl ResponseDirections {
    /// No sets; nothing allocated.
    pub fn new() -> Self {
        Self::default()
    }

    /// No sets, with room for everything `limits` allows.
    pub fn with_capacity(limits: &Limits) -> Self {
        ResponseDirections {
            sets: Vec::with_capacity(limits.max_direction_sets),
            directions: Vec::with_capacity(limits.max_directions),
            segments: Vec::with_capacity(limits.max_segments),
        }
    }

    /// Removes all sets, keeping the storage.
    pub fn clear(&mut self) {
        self.sets.clear();
        self.directions.clear();
        self.segments.clear();
    }

    /// True when there are no sets.
    pub fn is_empty(&self) -> bool {
        self.sets.is_empty()
    }

    /// Number of sets.
    pub fn len(&self) -> usize {
        self.sets.len()
    }

    /// The sets, in wire order.
    pub fn sets(&self) -> impl Iterator<Item = DirectionSet<'_>> + '_ {
        self.sets.iter().map(move |s| DirectionSet {
            begin: s.begin,
            end: s.end,
            records: slice_of(&self.directions, s.first, s.count),
            segments: &self.segments,
        })
    }

    /// Appends a set for the request range `begin..end` with `directions`
    /// (copied). Not validated here: `emit` checks the rules.
    ///
    /// # Errors
    /// [`Error::LimitExceeded`] if a pool would pass `u32::MAX` entries.
    pub fn push_set(&mut self, begin: u32, end: u32, directions: &[Direction<'_>]) -> Result<()> {
        let (first, set_count) = pool_range(self.directions.len(), directions.len())?;
        for d in directions {
            let segs = d.location.segments();
            let (start, count) = pool_range(self.segments.len(), segs.len())?;
            self.segments.extend_from_slice(segs);
            let threshold = match d.location {
                ReplyLocation::BySize { threshold, .. } => threshold,
                _ => 0,
            };
            self.directions.push(DirectionRecord {
                min_len: d.min_len,
                kind: d.location.placement_type(),
                threshold,
                start,
                count,
            });
        }
        self.sets.push(SetRecord {
            begin,
            end,
            first,
            count: set_count,
        });
        Ok(())
    }

    /// Any direction of type `kind`?
    fn uses(&self, kinds: &[PlacementType]) -> bool {
        self.directions.iter().any(|d| kinds.contains(&d.kind))
    }

    fn validate(&self) -> Result<()> {
        let mut prev_end: Option<u32> = None;
        for set in self.sets() {
            if set.begin & 3 != 0 || set.begin >= set.end || prev_end.is_some_and(|e| set.begin < e)
            {
                return Err(Error::Malformed);
            }
            prev_end = Some(set.end);
            for d in set.directions() {
                if d.location != ReplyLocation::TargetBuffers {
                    check_segments(d.location.segments())?;
                }
            }
        }
        Ok(())
    }

    fn buffer_len(&self) -> usize {
        4 + self.sets.len() * MIN_SET_LEN
            + self
                .directions
                .iter()
                .map(|d| {
                    MIN_DIRECTION_LEN
                        + match d.kind {
                            PlacementType::TargetBuffers => 0,
                            PlacementType::BySize => 8 + d.count as usize * SEGMENT_LEN,
                            _ => 4 + d.count as usize * SEGMENT_LEN,
                        }
                })
                .sum::<usize>()
    }

    // rsdgroup = count rsdset{count}
    // rsdset   = begin end count rsditem{count}
    // rsditem  = minlen rsdloc
    // rsdloc   = (EXRW / CHOOSE) count segment{count}
    //          / BYSIZE threshold count segment{count}
    //          / TBSN                                -- rtrext s7.4, s10.2
    fn encode(&self, enc: &mut Encoder<'_>) -> Result<()> {
        enc.put_count(self.sets.len())?;
        for set in self.sets() {
            enc.put_u32(set.begin)?;
            enc.put_u32(set.end)?;
            enc.put_count(set.len())?;
            for d in set.directions() {
                enc.put_u32(d.min_len)?;
                enc.put_u32(d.location.placement_type().to_wire())?;
                match d.location {
                    ReplyLocation::ExplicitRdma(s) | ReplyLocation::Choice(s) => {
                        encode_segments(enc, s)?
                    }
                    ReplyLocation::BySize {
                        threshold,
                        segments,
                    } => {
                        enc.put_u32(threshold)?;
                        encode_segments(enc, segments)?;
                    }
                    ReplyLocation::TargetBuffers => {}
                }
            }
        }
        Ok(())
    }

    fn decode(&mut self, dec: &mut Decoder<'_>, limits: &Limits) -> Result<()> {
        let n = dec.get_count(limits.max_direction_sets, MIN_SET_LEN)?;
        reserve_bounded(&mut self.sets, n, limits.max_direction_sets);
        for _ in 0..n {
            let begin = dec.get_u32()?;
            let end = dec.get_u32()?;
            let max = limits.max_directions;
            let m = get_pool_count(dec, self.directions.len(), max, MIN_DIRECTION_LEN)?;
            let (first, set_count) = pool_range(self.directions.len(), m)?;
            reserve_bounded(&mut self.directions, m, max);
            for _ in 0..m {
                let min_len = dec.get_u32()?;
                let kind = PlacementType::from_wire(dec.get_u32()?)?;
                let (threshold, start, count) = match kind {
                    PlacementType::ExplicitRdma | PlacementType::Choice => {
                        let (s, c) =
                            decode_segments_into(dec, &mut self.segments, limits.max_segments)?;
                        (0, s, c)
                    }
                    PlacementType::BySize => {
                        let threshold = dec.get_u32()?;
                        let (s, c) =
                            decode_segments_into(dec, &mut self.segments, limits.max_segments)?;
                        (threshold, s, c)
                    }
                    PlacementType::TargetBuffers => (0, 0, 0),
                    // Not an arm of xmdp_rsdloc (rtrext s6.2 Table 1).
                    PlacementType::TooShort | PlacementType::NoItem => {
                        return Err(Error::UnknownValue)
                    }
                };
                self.directions.push(DirectionRecord {
                    min_len,
                    kind,
                    threshold,
                    start,
                    count,
                });
            }
            self.sets.push(SetRecord {
                begin,
                end,
                first,
                count: set_count,
            });
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Operations (rtrext s9)

/// Which kind of message a transmission group carries; on the wire, the
/// operation type of the group's first transmission (our reading of
/// `optxc_itype`, which rtrext s9.4 leaves undescribed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GroupKind {
    /// Begun by Transmit Request.
    Request,
    /// Begun by Transmit Response.
    Response,
}

impl GroupKind {
    /// The operation type on the wire.
    pub const fn to_wire(self) -> u32 {
        match self {
            GroupKind::Request => op_type::TRANSMIT_REQUEST,
            GroupKind::Response => op_type::TRANSMIT_RESPONSE,
        }
    }

    /// The kind for operation type `value`.
    ///
    /// # Errors
    /// [`Error::UnknownValue`] for any other operation type.
    pub const fn from_wire(value: u32) -> Result<Self> {
        match value {
            op_type::TRANSMIT_REQUEST => Ok(GroupKind::Request),
            op_type::TRANSMIT_RESPONSE => Ok(GroupKind::Response),
            _ => Err(Error::UnknownValue),
        }
    }
}

/// Names one transmission (`xms_id`, rtrext s6.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TransmissionId {
    /// XID of the RPC message.
    pub xid: u32,
    /// Call or reply.
    pub direction: MessageType,
    /// Transmission number within its group (0: the first).
    pub seq: u32,
}

impl TransmissionId {
    // xms_id = xid msg_type seq                    -- rtrext s6.1
    fn decode(dec: &mut Decoder<'_>) -> Result<Self> {
        Ok(TransmissionId {
            xid: dec.get_u32()?,
            direction: MessageType::from_wire(dec.get_u32()?)?,
            seq: dec.get_u32()?,
        })
    }

    fn encode(&self, enc: &mut Encoder<'_>) -> Result<()> {
        enc.put_u32(self.xid)?;
        enc.put_u32(self.direction.to_wire())?;
        enc.put_u32(self.seq)
    }
}

/// Error codes of Report Error (`optr_err`, rtrext s9.5).
pub mod err_code {
    /// Unexpected header message type.
    pub const BAD_HEADER_TYPE: u32 = 1;
    /// Unexpected optional operation type.
    pub const BAD_OPTIONAL_TYPE: u32 = 2;
    /// A continuation nothing announced.
    pub const BAD_CONTINUATION: u32 = 3;
    /// Unexpected transmission number.
    pub const BAD_SEQUENCE: u32 = 4;
    /// Unexpected XID in a continuation.
    pub const BAD_XID: u32 = 5;
    /// Bad offset in a target-buffer location.
    pub const BAD_OFFSET: u32 = 6;
    /// Bad target buffer segment number.
    pub const BAD_BUFFER_NUMBER: u32 = 7;
    /// Bad payload stream length.
    pub const BAD_PAYLOAD_LENGTH: u32 = 8;
}

/// What went wrong (`optr_info`, rtrext s9.5). Values that were "expected
/// and found" carry both; values "out of range" carry the value and the
/// valid range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorInfo {
    /// `OPTRERR_BADHMT`: header message type.
    BadHeaderType {
        /// What was expected.
        expected: u32,
        /// What arrived.
        current: u32,
    },
    /// `OPTRERR_BADOMT`: optional operation type.
    BadOptionalType {
        /// What was expected.
        expected: u32,
        /// What arrived.
        current: u32,
    },
    /// `OPTRERR_BADCONT`: a continuation nothing announced.
    BadContinuation,
    /// `OPTRERR_BADSEQ`: transmission number.
    BadSequence {
        /// What was expected.
        expected: u32,
        /// What arrived.
        current: u32,
    },
    /// `OPTRERR_BADXID`: XID of a continuation.
    BadXid {
        /// What was expected.
        expected: u32,
        /// What arrived.
        current: u32,
    },
    /// `OPTRERR_BADOFF`: offset into a target buffer segment.
    BadOffset {
        /// The value received.
        value: u32,
        /// Smallest valid value.
        min: u32,
        /// Largest valid value.
        max: u32,
    },
    /// `OPTRERR_BADTBSN`: target buffer segment number.
    BadBufferNumber {
        /// The value received.
        value: u32,
        /// Smallest valid value.
        min: u32,
        /// Largest valid value.
        max: u32,
    },
    /// `OPTRERR_BADPL`: payload stream length.
    BadPayloadLength {
        /// The value received.
        value: u32,
        /// Smallest valid value.
        min: u32,
        /// Largest valid value.
        max: u32,
    },
}

impl ErrorInfo {
    /// The error code on the wire.
    pub fn code(&self) -> u32 {
        match self {
            ErrorInfo::BadHeaderType { .. } => err_code::BAD_HEADER_TYPE,
            ErrorInfo::BadOptionalType { .. } => err_code::BAD_OPTIONAL_TYPE,
            ErrorInfo::BadContinuation => err_code::BAD_CONTINUATION,
            ErrorInfo::BadSequence { .. } => err_code::BAD_SEQUENCE,
            ErrorInfo::BadXid { .. } => err_code::BAD_XID,
            ErrorInfo::BadOffset { .. } => err_code::BAD_OFFSET,
            ErrorInfo::BadBufferNumber { .. } => err_code::BAD_BUFFER_NUMBER,
            ErrorInfo::BadPayloadLength { .. } => err_code::BAD_PAYLOAD_LENGTH,
        }
    }

    fn buffer_len(&self) -> usize {
        4 + match self {
            ErrorInfo::BadContinuation => 0,
            ErrorInfo::BadHeaderType { .. }
            | ErrorInfo::BadOptionalType { .. }
            | ErrorInfo::BadSequence { .. }
            | ErrorInfo::BadXid { .. } => 8,
            _ => 12,
        }
    }

    // optr_info = (BADHMT / BADOMT / BADSEQ / BADXID) expect current
    //           / BADCONT
    //           / (BADOFF / BADTBSN / BADPL) value min max  -- rtrext s9.5
    fn decode(dec: &mut Decoder<'_>) -> Result<Self> {
        let code = dec.get_u32()?;
        if !(err_code::BAD_HEADER_TYPE..=err_code::BAD_PAYLOAD_LENGTH).contains(&code) {
            return Err(Error::UnknownValue);
        }
        if code == err_code::BAD_CONTINUATION {
            return Ok(ErrorInfo::BadContinuation);
        }
        let (a, b) = (dec.get_u32()?, dec.get_u32()?);
        Ok(match code {
            err_code::BAD_HEADER_TYPE => ErrorInfo::BadHeaderType {
                expected: a,
                current: b,
            },
            err_code::BAD_OPTIONAL_TYPE => ErrorInfo::BadOptionalType {
                expected: a,
                current: b,
            },
            err_code::BAD_SEQUENCE => ErrorInfo::BadSequence {
                expected: a,
                current: b,
            },
            err_code::BAD_XID => ErrorInfo::BadXid {
                expected: a,
                current: b,
            },
            _ => {
                let (value, min, max) = (a, b, dec.get_u32()?);
                match code {
                    err_code::BAD_OFFSET => ErrorInfo::BadOffset { value, min, max },
                    err_code::BAD_BUFFER_NUMBER => ErrorInfo::BadBufferNumber { value, min, max },
                    _ => ErrorInfo::BadPayloadLength { value, min, max },
                }
            }
        })
    }

    fn encode(&self, enc: &mut Encoder<'_>) -> Result<()> {
        enc.put_u32(self.code())?;
        match *self {
            ErrorInfo::BadContinuation => Ok(()),
            ErrorInfo::BadHeaderType { expected, current }
            | ErrorInfo::BadOptionalType { expected, current }
            | ErrorInfo::BadSequence { expected, current }
            | ErrorInfo::BadXid { expected, current } => {
                enc.put_u32(expected)?;
                enc.put_u32(current)
            }
            ErrorInfo::BadOffset { value, min, max }
            | ErrorInfo::BadBufferNumber { value, min, max }
            | ErrorInfo::BadPayloadLength { value, min, max } => {
                enc.put_u32(value)?;
                enc.put_u32(min)?;
                enc.put_u32(max)
            }
        }
    }
}

/// The body of Report Error (`optrept_err`, rtrext s9.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorReport {
    /// The transmission on which the error was found.
    pub bad: TransmissionId,
    /// An earlier transmission that may have led to it.
    pub lead: Option<TransmissionId>,
    /// The error and its values.
    pub info: ErrorInfo,
}

/// An rtrext operation, without its variable-length placement parts (they
/// are [`OptionalHeader::placement`] and [`OptionalHeader::directions`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// Transmit Request (`optxmt_req`, rtrext s9.2): first or only
    /// transmission of a call. Placement and directions apply.
    TransmitRequest {
        /// Transmissions in this group (at least 1).
        count: u32,
        /// Receive buffers the requester reserved, beyond the one every
        /// reply gets, for continuation transmissions of the reply
        /// (`optxrq_rsbuf`, our reading of rtrext s4.3 and s5.2); 0: the
        /// reply must be a single transmission.
        reply_buffers: u32,
        /// Payload stream bytes in this transmission, right after the header.
        payload_len: u32,
    },
    /// Transmit Response (`optxmt_resp`, rtrext s9.3): first or only
    /// transmission of a reply. Placement applies.
    TransmitResponse {
        /// Transmissions in this group (at least 1).
        count: u32,
        /// Payload stream bytes in this transmission, right after the header.
        payload_len: u32,
    },
    /// Transmit Continue (`optxmt_cont`, rtrext s9.4).
    TransmitContinue {
        /// Number of this transmission in its group (1 or more).
        seq: u32,
        /// What the group carries.
        group: GroupKind,
        /// Payload stream bytes in this transmission (may be 0).
        payload_len: u32,
    },
    /// Report Error (`optrept_err`, rtrext s9.5).
    ReportError(ErrorReport),
    /// An operation type this module does not know. Its optinfo is
    /// skipped when parsed and emitted empty (as `rpcrdma`'s unknown
    /// message types).
    Unknown {
        /// The operation type received.
        opttype: u32,
    },
}

impl Operation {
    /// The operation type on the wire.
    pub fn op_type(&self) -> u32 {
        match self {
            Operation::TransmitRequest { .. } => op_type::TRANSMIT_REQUEST,
            Operation::TransmitResponse { .. } => op_type::TRANSMIT_RESPONSE,
            Operation::TransmitContinue { .. } => op_type::TRANSMIT_CONTINUE,
            Operation::ReportError(_) => op_type::REPORT_ERROR,
            Operation::Unknown { opttype } => *opttype,
        }
    }

    /// Payload stream bytes that follow the header in this transmission.
    pub fn payload_len(&self) -> u32 {
        match *self {
            Operation::TransmitRequest { payload_len, .. }
            | Operation::TransmitResponse { payload_len, .. }
            | Operation::TransmitContinue { payload_len, .. } => payload_len,
            Operation::ReportError(_) | Operation::Unknown { .. } => 0,
        }
    }
}

// ---------------------------------------------------------------------------
// Fixed words view

/// A zero-copy view of the six fixed words of an optional header (smoltcp
/// style): the Version One words, the operation type and the optinfo
/// length.
#[derive(Debug, Clone, Copy)]
pub struct OptionalView<T: AsRef<[u8]>> {
    buffer: T,
}

mod field {
    use core::ops::Range;
    // Words 0-3 are the Version One words (`rpcrdma::HeaderView`).
    pub const OPTTYPE: Range<usize> = 16..20;
    pub const OPTINFO_LEN: Range<usize> = 20..24;
}

impl<T: AsRef<[u8]>> OptionalView<T> {
    /// Wraps `buffer` without checking its length.
    pub const fn new_unchecked(buffer: T) -> Self {
        OptionalView { buffer }
    }

    /// Wraps `buffer` after [`OptionalView::check_len`].
    ///
    /// # Errors
    /// [`Error::Truncated`] when `buffer` is shorter than 24 bytes.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let v = Self::new_unchecked(buffer);
        v.check_len()?;
        Ok(v)
    }

    /// Checks that the six fixed words are present.
    ///
    /// # Errors
    /// [`Error::Truncated`] when the buffer is shorter than 24 bytes.
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < OPTIONAL_FIXED_LEN {
            Err(Error::Truncated)
        } else {
            Ok(())
        }
    }

    /// The four Version One words, which an optional header shares.
    pub fn fixed(&self) -> HeaderView<&[u8]> {
        HeaderView::new_unchecked(self.buffer.as_ref())
    }

    /// The XID.
    pub fn xid(&self) -> u32 {
        self.fixed().xid()
    }

    /// The protocol version (1).
    pub fn vers(&self) -> u32 {
        self.fixed().vers()
    }

    /// Credits requested or granted.
    pub fn credits(&self) -> u32 {
        self.fixed().credits()
    }

    /// The message type ([`RDMA_OPTIONAL`] for a header of this module).
    pub fn proc_type(&self) -> u32 {
        self.fixed().proc_type()
    }

    /// The operation type.
    pub fn op_type(&self) -> u32 {
        word_at(self.buffer.as_ref(), field::OPTTYPE)
    }

    /// The length of the operation structure in bytes.
    pub fn optinfo_len(&self) -> u32 {
        word_at(self.buffer.as_ref(), field::OPTINFO_LEN)
    }
}

// ---------------------------------------------------------------------------
// The header

/// A checked RPC-over-RDMA header carrying an rtrext operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionalHeader {
    /// Transaction ID; equals the RPC message's XID.
    pub xid: u32,
    /// Credits requested or granted (RFC 5666 s3.3).
    pub credits: u32,
    /// The operation and its fixed fields.
    pub op: Operation,
    /// Bulk data placement of the message (`optxrq_dp` / `optxrs_dp`);
    /// empty unless `op` is Transmit Request or Transmit Response.
    pub placement: DataPlacement,
    /// Directions for the reply's bulk data (`optxrq_rsd`); empty unless
    /// `op` is Transmit Request.
    pub directions: ResponseDirections,
}

impl Default for OptionalHeader {
    fn default() -> Self {
        OptionalHeader::new(
            0,
            0,
            Operation::TransmitRequest {
                count: 1,
                reply_buffers: 0,
                payload_len: 0,
            },
        )
    }
}

impl OptionalHeader {
    /// A header with empty placement and directions.
    pub fn new(xid: u32, credits: u32, op: Operation) -> Self {
        OptionalHeader {
            xid,
            credits,
            op,
            placement: DataPlacement::new(),
            directions: ResponseDirections::new(),
        }
    }

    /// A scratch header whose storage holds everything `limits` allows, so
    /// that parsing within them never allocates.
    pub fn with_capacity(limits: &Limits) -> Self {
        OptionalHeader {
            placement: DataPlacement::with_capacity(limits),
            directions: ResponseDirections::with_capacity(limits),
            ..Self::default()
        }
    }

    /// The extensions the peer must have negotiated before this header may
    /// be sent to it: message continuation for a group of more than one
    /// transmission, a continuation, or a request that reserves buffers
    /// for a continued reply; send-based data placement for any
    /// target-buffer placement or direction that allows it. Every rtrext
    /// operation also needs at least one of the two (see
    /// [`OptionalHeader::allowed`]).
    pub fn required_extensions(&self) -> Extensions {
        let mut need = Extensions::EMPTY;
        let multi = match self.op {
            Operation::TransmitRequest {
                count,
                reply_buffers,
                ..
            } => count > 1 || reply_buffers > 0,
            Operation::TransmitResponse { count, .. } => count > 1,
            Operation::TransmitContinue { .. } => true,
            _ => false,
        };
        if multi {
            need = need.union(Extensions::MESSAGE_CONTINUATION);
        }
        let send_placed = self.placement.uses(PlacementType::TargetBuffers)
            || self.directions.uses(&[
                PlacementType::TargetBuffers,
                PlacementType::Choice,
                PlacementType::BySize,
            ]);
        if send_placed {
            need = need.union(Extensions::SEND_PLACEMENT);
        }
        need
    }

    /// True when a peer with the `negotiated` extensions may receive this
    /// header: it negotiated message continuation or send-based placement
    /// (rtrext s5.1: the new operations come with either feature) and
    /// everything [`OptionalHeader::required_extensions`] lists. A plain
    /// Version One peer negotiated nothing, so it never qualifies.
    pub fn allowed(&self, negotiated: Extensions) -> bool {
        negotiated.intersects(Extensions::MESSAGE_CONTINUATION.union(Extensions::SEND_PLACEMENT))
            && negotiated.contains(self.required_extensions())
    }

    /// Checks the rules of the module documentation (the ones that do not
    /// depend on negotiation).
    ///
    /// # Errors
    /// [`Error::Malformed`] for a rule broken; [`Error::LimitExceeded`]
    /// for a location longer than `u32::MAX` bytes.
    pub fn validate(&self) -> Result<()> {
        let (placement, directions) = match self.op {
            Operation::TransmitRequest { count, .. } => {
                if count == 0 {
                    return Err(Error::Malformed);
                }
                self.placement.validate(false)?;
                self.directions.validate()?;
                (true, true)
            }
            Operation::TransmitResponse { count, .. } => {
                if count == 0 {
                    return Err(Error::Malformed);
                }
                self.placement.validate(true)?;
                (true, false)
            }
            Operation::TransmitContinue { seq, .. } => {
                if seq == 0 {
                    return Err(Error::Malformed);
                }
                (false, false)
            }
            Operation::ReportError(_) => (false, false),
            Operation::Unknown { opttype } => {
                if (op_type::TRANSMIT_REQUEST..=op_type::REPORT_ERROR).contains(&opttype) {
                    return Err(Error::Malformed);
                }
                (false, false)
            }
        };
        if (!placement && !self.placement.is_empty())
            || (!directions && !self.directions.is_empty())
        {
            return Err(Error::Malformed);
        }
        Ok(())
    }

    /// Length of the operation structure (optinfo) in bytes.
    fn optinfo_len(&self) -> usize {
        match self.op {
            Operation::TransmitRequest { .. } => {
                self.placement.buffer_len() + self.directions.buffer_len() + 12
            }
            Operation::TransmitResponse { .. } => self.placement.buffer_len() + 8,
            Operation::TransmitContinue { .. } => 12,
            Operation::ReportError(r) => {
                12 + 4 + if r.lead.is_some() { 12 } else { 0 } + r.info.buffer_len()
            }
            Operation::Unknown { .. } => 0,
        }
    }

    /// Exact number of bytes [`OptionalHeader::emit`] writes.
    pub fn buffer_len(&self) -> usize {
        OPTIONAL_FIXED_LEN + self.optinfo_len()
    }

    /// Decodes a header from the start of `bytes` into `self`, reusing its
    /// storage; returns the header length (the payload stream starts
    /// there).
    ///
    /// # Errors
    /// * [`Error::Truncated`]: the input ends inside the header.
    /// * [`Error::UnknownValue`]: the version is not 1, the message type
    ///   not [`RDMA_OPTIONAL`], or a discriminant (placement type, message
    ///   direction, error code, presence word, group kind) is unknown or
    ///   not allowed in its place.
    /// * [`Error::LimitExceeded`]: a count is above `limits` or the input.
    /// * [`Error::Malformed`]: a rule of the module documentation is
    ///   broken, or the optinfo length disagrees with its structure.
    pub fn parse_into(&mut self, bytes: &[u8], limits: &Limits) -> Result<usize> {
        self.placement.clear();
        self.directions.clear();
        let mut dec = Decoder::new(bytes);
        // header = xid vers credits proc opttype optinfo<>
        let xid = dec.get_u32()?;
        let vers = dec.get_u32()?;
        let credits = dec.get_u32()?;
        let proc = dec.get_u32()?;
        if vers != RPCRDMA_VERSION || proc != RDMA_OPTIONAL {
            return Err(Error::UnknownValue);
        }
        let opttype = dec.get_u32()?;
        let info = dec.get_opaque(usize::MAX)?;
        self.xid = xid;
        self.credits = credits;
        self.op = match self.decode_op(opttype, info, limits) {
            Ok(Some(op)) => op,
            Ok(None) => Operation::Unknown { opttype },
            // The optinfo arrived whole: a structure that runs past its
            // end means the length word lied, not that input is missing.
            Err(Error::Truncated) => return Err(Error::Malformed),
            Err(e) => return Err(e),
        };
        self.validate()?;
        Ok(dec.position())
    }

    /// Decodes the operation structure `info` of type `opttype` into
    /// `self`'s storage; `None` for an unknown type.
    fn decode_op(
        &mut self,
        opttype: u32,
        info: &[u8],
        limits: &Limits,
    ) -> Result<Option<Operation>> {
        let mut d = Decoder::new(info);
        let op = match opttype {
            // optxmt_req = grpinfo rsdgroup count rsbuf pslen  -- rtrext s9.2
            op_type::TRANSMIT_REQUEST => {
                self.placement.decode(&mut d, limits)?;
                self.directions.decode(&mut d, limits)?;
                Operation::TransmitRequest {
                    count: d.get_u32()?,
                    reply_buffers: d.get_u32()?,
                    payload_len: d.get_u32()?,
                }
            }
            // optxmt_resp = grpinfo count pslen              -- rtrext s9.3
            op_type::TRANSMIT_RESPONSE => {
                self.placement.decode(&mut d, limits)?;
                Operation::TransmitResponse {
                    count: d.get_u32()?,
                    payload_len: d.get_u32()?,
                }
            }
            // optxmt_cont = xnum itype pslen                 -- rtrext s9.4
            op_type::TRANSMIT_CONTINUE => Operation::TransmitContinue {
                seq: d.get_u32()?,
                group: GroupKind::from_wire(d.get_u32()?)?,
                payload_len: d.get_u32()?,
            },
            // optrept_err = xms_id *xms_id optr_info         -- rtrext s9.5
            op_type::REPORT_ERROR => {
                let bad = TransmissionId::decode(&mut d)?;
                let lead = if d.get_present()? {
                    Some(TransmissionId::decode(&mut d)?)
                } else {
                    None
                };
                Operation::ReportError(ErrorReport {
                    bad,
                    lead,
                    info: ErrorInfo::decode(&mut d)?,
                })
            }
            _ => return Ok(None),
        };
        if d.remaining() != 0 {
            return Err(Error::Malformed);
        }
        Ok(Some(op))
    }

    /// Decodes a header from the start of `bytes`; returns it and its
    /// length. Allocates; the engine uses [`OptionalHeader::parse_into`].
    ///
    /// # Errors
    /// As [`OptionalHeader::parse_into`].
    pub fn parse(bytes: &[u8], limits: &Limits) -> Result<(Self, usize)> {
        let mut h = OptionalHeader::default();
        let len = h.parse_into(bytes, limits)?;
        Ok((h, len))
    }

    /// Writes the header at the start of `buf` for a peer that negotiated
    /// `negotiated`; returns the bytes written (always `buffer_len()`).
    ///
    /// # Errors
    /// [`Error::Malformed`] if [`OptionalHeader::allowed`] is false for
    /// `negotiated` (the peer never agreed to receive it) or a rule of
    /// [`OptionalHeader::validate`] is broken; [`Error::LimitExceeded`] as
    /// there; then [`Error::BufferTooShort`]. Nothing is written on error.
    pub fn emit(&self, negotiated: Extensions, buf: &mut [u8]) -> Result<usize> {
        let mut enc = Encoder::new(buf);
        self.encode(negotiated, &mut enc)?;
        Ok(enc.position())
    }

    /// Appends the header to `enc` (see [`OptionalHeader::emit`]).
    ///
    /// # Errors
    /// As [`OptionalHeader::emit`]; nothing is written on error.
    //
    // header  = xid vers(1) credits RDMA_OPTIONAL opttype infolen optinfo
    // optinfo = optxmt_req / optxmt_resp / optxmt_cont / optrept_err
    //         / (nothing)                      ; unknown operation types
    //                          -- our framing (module docs), rtrext s9
    pub fn encode(&self, negotiated: Extensions, enc: &mut Encoder<'_>) -> Result<()> {
        if !self.allowed(negotiated) {
            return Err(Error::Malformed);
        }
        self.validate()?;
        if enc.remaining() < self.buffer_len() {
            return Err(Error::BufferTooShort);
        }
        enc.put_u32(self.xid)?;
        enc.put_u32(RPCRDMA_VERSION)?;
        enc.put_u32(self.credits)?;
        enc.put_u32(RDMA_OPTIONAL)?;
        enc.put_u32(self.op.op_type())?;
        enc.put_count(self.optinfo_len())?;
        match self.op {
            Operation::TransmitRequest {
                count,
                reply_buffers,
                payload_len,
            } => {
                self.placement.encode(enc)?;
                self.directions.encode(enc)?;
                enc.put_u32(count)?;
                enc.put_u32(reply_buffers)?;
                enc.put_u32(payload_len)
            }
            Operation::TransmitResponse { count, payload_len } => {
                self.placement.encode(enc)?;
                enc.put_u32(count)?;
                enc.put_u32(payload_len)
            }
            Operation::TransmitContinue {
                seq,
                group,
                payload_len,
            } => {
                enc.put_u32(seq)?;
                enc.put_u32(group.to_wire())?;
                enc.put_u32(payload_len)
            }
            Operation::ReportError(r) => {
                r.bad.encode(enc)?;
                enc.put_present(r.lead.is_some())?;
                if let Some(lead) = r.lead {
                    lead.encode(enc)?;
                }
                r.info.encode(enc)
            }
            Operation::Unknown { .. } => Ok(()),
        }
    }

    /// The payload stream bytes of this transmission: `payload_len` bytes
    /// right after the header, in `message` (the whole received Send).
    ///
    /// # Errors
    /// [`Error::Truncated`] if the Send is shorter than that.
    pub fn payload<'a>(&self, message: &'a [u8], header_len: usize) -> Result<&'a [u8]> {
        let end = header_len
            .checked_add(self.op.payload_len() as usize)
            .ok_or(Error::Truncated)?;
        message.get(header_len..end).ok_or(Error::Truncated)
    }
}

// ---------------------------------------------------------------------------
// Transport properties (rtrext s8)

/// The RTR Support property value (`xpr_rtrs`, rtrext s8.2): which new
/// operations the sender supports. Unknown bits are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RtrSupport(pub u32);

impl RtrSupport {
    /// `RTRS_XREQ`: Transmit Request.
    pub const TRANSMIT_REQUEST: RtrSupport = RtrSupport(1);
    /// `RTRS_XRESP`: Transmit Response.
    pub const TRANSMIT_RESPONSE: RtrSupport = RtrSupport(2);
    /// `RTRS_XCONT`: Transmit Continue (message continuation).
    pub const TRANSMIT_CONTINUE: RtrSupport = RtrSupport(4);

    /// True when every bit of `other` is set.
    pub const fn contains(self, other: RtrSupport) -> bool {
        self.0 & other.0 == other.0
    }

    /// The bits of both.
    pub const fn union(self, other: RtrSupport) -> RtrSupport {
        RtrSupport(self.0 | other.0)
    }
}

/// A run of identical buffer segments (`xmrbs_group` with its
/// `xmrbs_seg`, rtrext s7.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BufferGroup {
    /// How many consecutive segments (at least 1).
    pub count: u32,
    /// Length of each segment in bytes.
    pub length: u32,
    /// Guaranteed alignment of each segment: 0 (none) or a power of two.
    pub align: u32,
    /// Segment flags ([`SEGMENT_FLAG_PLACEMENT_TARGET`]; others kept).
    pub flags: u32,
}

impl BufferGroup {
    /// True when these segments may receive placed bulk data.
    pub fn is_placement_target(&self) -> bool {
        self.flags & SEGMENT_FLAG_PLACEMENT_TARGET != 0
    }
}

/// The structure of a receive buffer (`xmrbs_buf`, rtrext s7.2, the value
/// of the Receive Buffer Structure property, s8.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferStructure<'a> {
    /// Total buffer length; equals the sum over groups of count x length.
    pub length: u32,
    /// The groups, in buffer order.
    pub groups: &'a [BufferGroup],
}

impl BufferStructure<'_> {
    /// Number of segments in the buffer.
    pub fn segment_count(&self) -> u64 {
        self.groups.iter().map(|g| u64::from(g.count)).sum()
    }

    /// True when any segment may receive placed bulk data (rtrext s5.3:
    /// otherwise the owner cannot receive send-based placement).
    pub fn has_placement_targets(&self) -> bool {
        self.groups.iter().any(BufferGroup::is_placement_target)
    }

    fn validate(&self, max_segments: u64) -> Result<()> {
        let mut total: u64 = 0;
        let mut segments: u64 = 0;
        for g in self.groups {
            if g.count == 0 || (g.align != 0 && !g.align.is_power_of_two()) {
                return Err(Error::Malformed);
            }
            segments += u64::from(g.count);
            total += u64::from(g.count) * u64::from(g.length);
        }
        if segments > max_segments {
            return Err(Error::LimitExceeded);
        }
        if total != u64::from(self.length) {
            return Err(Error::Malformed);
        }
        Ok(())
    }

    fn value_len(&self) -> usize {
        8 + self.groups.len() * BUFFER_GROUP_LEN
    }
}

/// One transport property (a `propval` of the RPC-over-RDMA Version Two
/// property model that rtrext s8.1 extends): typed when this module knows
/// the id, opaque otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Property<'a> {
    /// RTR Support (id 3, rtrext s8.2).
    RtrSupport(RtrSupport),
    /// Receive Buffer Structure (id 4, rtrext s8.3).
    ReceiveBufferStructure(BufferStructure<'a>),
    /// Request Transmission Receive Limit (id 5, rtrext s8.4): the longest
    /// request, in transmissions, the sender accepts (at least 1).
    RequestTransmissionReceiveLimit(u32),
    /// Response Transmission Send Limit (id 6, rtrext s8.5): the longest
    /// response, in transmissions, the sender generates (at least 1).
    ResponseTransmissionSendLimit(u32),
    /// Our extension flag word (id [`prop_id::EXTENSION_FLAGS`]; bits in
    /// `conf2::ext_flag`, unknown bits kept).
    ExtensionFlags(u32),
    /// Any other id; the value is kept as it came.
    Unknown {
        /// Property id.
        id: u32,
        /// Its value bytes.
        value: &'a [u8],
    },
}

impl Property<'_> {
    /// The property id on the wire.
    pub fn id(&self) -> u32 {
        match self {
            Property::RtrSupport(_) => prop_id::RTR_SUPPORT,
            Property::ReceiveBufferStructure(_) => prop_id::RECEIVE_BUFFER_STRUCTURE,
            Property::RequestTransmissionReceiveLimit(_) => {
                prop_id::REQUEST_TRANSMISSION_RECEIVE_LIMIT
            }
            Property::ResponseTransmissionSendLimit(_) => prop_id::RESPONSE_TRANSMISSION_SEND_LIMIT,
            Property::ExtensionFlags(_) => prop_id::EXTENSION_FLAGS,
            Property::Unknown { id, .. } => *id,
        }
    }

    /// Length of the value in bytes (before XDR padding).
    pub fn value_len(&self) -> usize {
        match self {
            Property::ReceiveBufferStructure(b) => b.value_len(),
            Property::Unknown { value, .. } => value.len(),
            _ => 4,
        }
    }
}

fn is_known_property(id: u32) -> bool {
    matches!(
        id,
        prop_id::RTR_SUPPORT
            | prop_id::RECEIVE_BUFFER_STRUCTURE
            | prop_id::REQUEST_TRANSMISSION_RECEIVE_LIMIT
            | prop_id::RESPONSE_TRANSMISSION_SEND_LIMIT
            | prop_id::EXTENSION_FLAGS
    )
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PropRecord {
    id: u32,
    /// Kept as opaque bytes (an id this module does not type).
    opaque: bool,
    /// The scalar value, or the buffer length of a buffer structure.
    word: u32,
    /// Range in the group pool (buffer structure) or byte pool (unknown).
    start: u32,
    count: u32,
}

/// A transport property list (`propval<>`), stored flattened for reuse.
///
/// Wire form of each entry: id (u32), value as an XDR opaque (length,
/// bytes, padding). The list is an XDR counted array.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PropertyList {
    records: Vec<PropRecord>,
    groups: Vec<BufferGroup>,
    bytes: Vec<u8>,
}

impl PropertyList {
    /// An empty list; nothing allocated.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty list with room for everything `limits` allows.
    pub fn with_capacity(limits: &Limits) -> Self {
        PropertyList {
            records: Vec::with_capacity(limits.max_properties),
            groups: Vec::with_capacity(limits.max_buffer_groups),
            bytes: Vec::with_capacity(
                limits
                    .max_properties
                    .saturating_mul(limits.max_property_len),
            ),
        }
    }

    /// Empties the list, keeping its storage.
    pub fn clear(&mut self) {
        self.records.clear();
        self.groups.clear();
        self.bytes.clear();
    }

    /// Number of properties.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// True when the list is empty.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    fn view(&self, r: &PropRecord) -> Property<'_> {
        if r.opaque {
            return Property::Unknown {
                id: r.id,
                value: slice_of(&self.bytes, r.start, r.count),
            };
        }
        match r.id {
            prop_id::RTR_SUPPORT => Property::RtrSupport(RtrSupport(r.word)),
            prop_id::RECEIVE_BUFFER_STRUCTURE => {
                Property::ReceiveBufferStructure(BufferStructure {
                    length: r.word,
                    groups: slice_of(&self.groups, r.start, r.count),
                })
            }
            prop_id::REQUEST_TRANSMISSION_RECEIVE_LIMIT => {
                Property::RequestTransmissionReceiveLimit(r.word)
            }
            prop_id::RESPONSE_TRANSMISSION_SEND_LIMIT => {
                Property::ResponseTransmissionSendLimit(r.word)
            }
            prop_id::EXTENSION_FLAGS => Property::ExtensionFlags(r.word),
            id => Property::Unknown {
                id,
                value: slice_of(&self.bytes, r.start, r.count),
            },
        }
    }

    /// The properties, in wire order.
    pub fn iter(&self) -> impl Iterator<Item = Property<'_>> + '_ {
        self.records.iter().map(move |r| self.view(r))
    }

    /// The property with id `id`, if present.
    pub fn get(&self, id: u32) -> Option<Property<'_>> {
        self.records
            .iter()
            .find(|r| r.id == id)
            .map(|r| self.view(r))
    }

    /// The RTR Support value, or its default (none, rtrext s8.1).
    pub fn rtr_support(&self) -> RtrSupport {
        match self.get(prop_id::RTR_SUPPORT) {
            Some(Property::RtrSupport(s)) => s,
            _ => RtrSupport::default(),
        }
    }

    /// Appends a property (copying its slices). Not validated here: emit
    /// checks the rules (an `Unknown` spelling a known id is refused there).
    ///
    /// # Errors
    /// [`Error::LimitExceeded`] if a pool would pass `u32::MAX` entries.
    pub fn push(&mut self, p: Property<'_>) -> Result<()> {
        let (word, start, count) = match p {
            Property::RtrSupport(RtrSupport(w))
            | Property::RequestTransmissionReceiveLimit(w)
            | Property::ResponseTransmissionSendLimit(w)
            | Property::ExtensionFlags(w) => (w, 0, 0),
            Property::ReceiveBufferStructure(b) => {
                let (start, count) = pool_range(self.groups.len(), b.groups.len())?;
                self.groups.extend_from_slice(b.groups);
                (b.length, start, count)
            }
            Property::Unknown { value, .. } => {
                let (start, count) = pool_range(self.bytes.len(), value.len())?;
                self.bytes.extend_from_slice(value);
                (0, start, count)
            }
        };
        self.records.push(PropRecord {
            id: p.id(),
            opaque: matches!(p, Property::Unknown { .. }),
            word,
            start,
            count,
        });
        Ok(())
    }

    /// Checks the rules shared by parse and emit: ids unique, no `Unknown`
    /// spelling a known id, limits at least 1, buffer structures valid
    /// (group counts at least 1, alignments 0 or powers of two, total
    /// length consistent, at most `max_buffer_segments` segments).
    ///
    /// # Errors
    /// [`Error::Malformed`], or [`Error::LimitExceeded`] for too many
    /// buffer segments.
    pub fn validate(&self, limits: &Limits) -> Result<()> {
        for (i, r) in self.records.iter().enumerate() {
            if self.records[..i].iter().any(|o| o.id == r.id) {
                return Err(Error::Malformed);
            }
            match self.view(r) {
                Property::RequestTransmissionReceiveLimit(0)
                | Property::ResponseTransmissionSendLimit(0) => return Err(Error::Malformed),
                Property::ReceiveBufferStructure(b) => b.validate(limits.max_buffer_segments)?,
                Property::Unknown { id, .. } if is_known_property(id) => {
                    return Err(Error::Malformed)
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The rules `encode` checks: [`PropertyList::validate`] without the
    /// parse-side bound on buffer segments (what we send is ours to size).
    pub(super) fn check_emit(&self) -> Result<()> {
        self.validate(&Limits {
            max_buffer_segments: u64::MAX,
            ..Limits::DEFAULT
        })
    }

    /// Exact encoded length of the list.
    pub fn buffer_len(&self) -> usize {
        4 + self
            .iter()
            .map(|p| 8 + roundup(p.value_len()))
            .sum::<usize>()
    }

    /// Appends the list to `enc`.
    ///
    /// # Errors
    /// Those of [`PropertyList::validate`] (with [`Limits::DEFAULT`]'s
    /// buffer segment bound lifted), then [`Error::BufferTooShort`];
    /// nothing is written on error.
    //
    // proplist = count propval{count}
    // propval  = id value_len value pad
    // value    = u32                                   ; ids 3, 5, 6, ours
    //          / buflen count (count length align flags){count}  ; id 4
    //          / opaque                                ; anything else
    //                   -- RPC-over-RDMA v2 property model, rtrext s8, s7.2
    pub fn encode(&self, enc: &mut Encoder<'_>) -> Result<()> {
        self.check_emit()?;
        if enc.remaining() < self.buffer_len() {
            return Err(Error::BufferTooShort);
        }
        enc.put_count(self.records.len())?;
        for p in self.iter() {
            enc.put_u32(p.id())?;
            match p {
                Property::Unknown { value, .. } => enc.put_opaque(value)?,
                Property::ReceiveBufferStructure(b) => {
                    enc.put_count(b.value_len())?;
                    enc.put_u32(b.length)?;
                    enc.put_count(b.groups.len())?;
                    for g in b.groups {
                        enc.put_u32(g.count)?;
                        enc.put_u32(g.length)?;
                        enc.put_u32(g.align)?;
                        enc.put_u32(g.flags)?;
                    }
                }
                Property::RtrSupport(RtrSupport(w))
                | Property::RequestTransmissionReceiveLimit(w)
                | Property::ResponseTransmissionSendLimit(w)
                | Property::ExtensionFlags(w) => {
                    enc.put_u32(4)?;
                    enc.put_u32(w)?;
                }
            }
        }
        Ok(())
    }

    /// Writes the list at the start of `buf`; returns its length.
    ///
    /// # Errors
    /// As [`PropertyList::encode`].
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        let mut enc = Encoder::new(buf);
        self.encode(&mut enc)?;
        Ok(enc.position())
    }

    /// Decodes a list at the decoder's position into `self`, reusing its
    /// storage.
    ///
    /// # Errors
    /// [`Error::Truncated`]; [`Error::LimitExceeded`] for counts or value
    /// lengths above `limits` or the input; [`Error::Malformed`] when a
    /// typed value does not use exactly its opaque length, or a rule of
    /// [`PropertyList::validate`] is broken.
    pub fn decode_into(&mut self, dec: &mut Decoder<'_>, limits: &Limits) -> Result<()> {
        self.clear();
        let n = dec.get_count(limits.max_properties, MIN_PROPERTY_LEN)?;
        reserve_bounded(&mut self.records, n, limits.max_properties);
        for _ in 0..n {
            let id = dec.get_u32()?;
            let value = dec.get_opaque(limits.max_property_len)?;
            let mut v = Decoder::new(value);
            let typed = self.decode_value(id, value, &mut v, limits);
            // The value arrived whole: running past its end means the
            // value is malformed, not that input is missing.
            let (word, start, count) = match typed {
                Err(Error::Truncated) => return Err(Error::Malformed),
                r => r?,
            };
            if v.remaining() != 0 {
                return Err(Error::Malformed);
            }
            self.records.push(PropRecord {
                id,
                opaque: !is_known_property(id),
                word,
                start,
                count,
            });
        }
        self.validate(limits)
    }

    /// Decodes the value of property `id` (all of `value`, read through
    /// `v`) into the pools; returns the record fields.
    fn decode_value(
        &mut self,
        id: u32,
        value: &[u8],
        v: &mut Decoder<'_>,
        limits: &Limits,
    ) -> Result<(u32, u32, u32)> {
        Ok(match id {
            prop_id::RECEIVE_BUFFER_STRUCTURE => {
                let length = v.get_u32()?;
                let max = limits.max_buffer_groups;
                let c = get_pool_count(v, self.groups.len(), max, BUFFER_GROUP_LEN)?;
                let start = self.groups.len();
                reserve_bounded(&mut self.groups, c, max);
                for _ in 0..c {
                    self.groups.push(BufferGroup {
                        count: v.get_u32()?,
                        length: v.get_u32()?,
                        align: v.get_u32()?,
                        flags: v.get_u32()?,
                    });
                }
                let (start, c) = pool_range(start, c)?;
                (length, start, c)
            }
            id if is_known_property(id) => (v.get_u32()?, 0, 0),
            _ => {
                let start = self.bytes.len();
                let cap = limits
                    .max_properties
                    .saturating_mul(limits.max_property_len);
                reserve_bounded(&mut self.bytes, value.len(), cap);
                self.bytes.extend_from_slice(value);
                v.skip(value.len())?;
                let (start, count) = pool_range(start, value.len())?;
                (0, start, count)
            }
        })
    }

    /// Decodes a list that is all of `bytes`.
    ///
    /// # Errors
    /// As [`PropertyList::decode_into`], plus [`Error::TrailingBytes`].
    pub fn parse(bytes: &[u8], limits: &Limits) -> Result<Self> {
        let mut list = PropertyList::new();
        let mut dec = Decoder::new(bytes);
        list.decode_into(&mut dec, limits)?;
        dec.finish()?;
        Ok(list)
    }
}

// ---------------------------------------------------------------------------
// Fuzzing entry point

/// Runs every parser of this module over `data` and checks their
/// invariants: whatever parses re-emits into exactly
/// `buffer_len()` bytes that parse back equal, also through a reused
/// scratch value. The cargo-fuzz target calls it through
/// [`super::conf2::fuzz_parse`], which adds the CONF_RDMA version 2
/// bodies (this module is below `conf2` and cannot call its parsers).
///
/// # Panics
/// Only when a codec invariant is broken (that is what it is for).
pub fn fuzz_parse(data: &[u8]) {
    let limits = Limits::DEFAULT;
    let all = Extensions::ALL;

    let mut scratch = OptionalHeader::with_capacity(&limits);
    let scratch_result = scratch.parse_into(data, &limits);
    match OptionalHeader::parse(data, &limits) {
        Ok((h, len)) => {
            assert_eq!(scratch_result, Ok(len));
            assert_eq!(scratch, h);
            assert!(len <= data.len());
            let view = OptionalView::new_checked(data).expect("a parsed header has fixed words");
            assert_eq!((view.xid(), view.op_type()), (h.xid, h.op.op_type()));
            let mut buf = vec![0u8; h.buffer_len()];
            let n = h.emit(all, &mut buf).expect("a parsed header must emit");
            assert_eq!(n, buf.len());
            if !matches!(h.op, Operation::Unknown { .. }) {
                assert_eq!(&buf[..], &data[..len], "re-emit differs");
            }
            let (again, len2) = OptionalHeader::parse(&buf, &limits).expect("re-parse");
            assert_eq!(again, h);
            assert_eq!(len2, n);
            let _ = h.payload(data, len);
            assert!(!h.allowed(Extensions::EMPTY));
        }
        Err(e) => assert_eq!(scratch_result, Err(e)),
    }
    assert!(scratch.placement.items.capacity() <= limits.max_items);
    assert!(scratch.placement.segments.capacity() <= limits.max_segments);
    assert!(scratch.directions.directions.capacity() <= limits.max_directions);

    if let Ok(list) = PropertyList::parse(data, &limits) {
        let mut buf = vec![0u8; list.buffer_len()];
        assert_eq!(list.emit(&mut buf), Ok(buf.len()));
        assert_eq!(PropertyList::parse(&buf, &limits).as_ref(), Ok(&list));
    }
}

#[cfg(test)]
mod tests;
