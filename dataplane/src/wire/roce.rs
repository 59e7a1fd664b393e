//! RoCEv2 transport packets as Linux rdma_rxe puts them in a UDP datagram
//! (destination port 4791): the InfiniBand Base Transport Header (BTH),
//! the extension headers an RC/UD packet carries (RETH, AETH, IETH,
//! ImmDt, DETH), payload, pad and the 4-byte invariant CRC (ICRC).
//!
//! Sources: IBTA Vol. 1 ch. 9 (transport layer: BTH, extension headers,
//! ACK/NAK syndromes), Annex A17 (RoCEv2 encapsulation, ICRC over the
//! IP/UDP pseudo-header), and Linux `drivers/infiniband/sw/rxe/rxe_hdr.h`,
//! `rxe_opcode.c`, `rxe_icrc.c`.
//!
//! ```text
//!  UDP payload:  BTH(12) | ext headers (opcode table) | payload | pad(0-3) | ICRC(4)
//!  BTH: 0 opcode | 1 SE.M.PadCnt(2).TVer(4) | 2-3 P_Key | 4 F.B.resv6
//!       | 5-7 dest QPN | 8 A.resv7 | 9-11 PSN        (big-endian)
//! ```
//!
//! # Shape of the API
//! * [`Packet`]: a zero-copy view over a UDP payload (BTH at offset 0),
//!   with field accessors and setters, `new_checked` and `check_len`.
//! * [`RocePacket`]: the checked representation (BTH fields, the extension
//!   headers as `Option`s, payload without pad) with `parse`,
//!   `buffer_len` and `emit`, which mirror each other. `emit` computes
//!   PadCnt and writes a zero ICRC; seal it with [`icrc::seal_ipv4`] /
//!   [`icrc::seal_ipv6`] once the IP/UDP header values are known.
//! * [`Opcode`]: the opcodes of the RC set (without atomics) and the UD
//!   sends, with the table of extension headers each carries.
//! * [`Psn`]: 24-bit packet sequence numbers with IB's half-window order.
//! * [`seg`]: path-MTU segmentation of Send/Write/Read-response messages.
//! * [`icrc`]: the invariant CRC over a whole IP frame or over header
//!   values given separately (plain UDP socket send path).
//!
//! # What parse checks
//! TVer is 0 (rxe drops anything else), the opcode is one of [`Opcode`],
//! every extension header the opcode carries is present, the bytes between
//! the headers and the ICRC are a multiple of 4 and at least PadCnt long,
//! and opcodes without payload (RDMA Read request, Acknowledge) have none.
//! Reserved bits are ignored on receive and sent as zero. The ICRC itself
//! is not checked by `parse`: it covers IP header fields that a UDP
//! payload does not contain (see [`icrc`]).
//!
//! # Panic contract
//! Nothing here panics on any input, except [`fuzz_parse`], whose job is
//! to panic when a codec invariant breaks. View accessors on a buffer that
//! failed `check_len` return zeros rather than panicking; emitters validate
//! and check the buffer size before writing a byte.

use core::cmp::Ordering;

use super::bytes::{be24, be32, be64, put24};
use super::{Error, Result};

pub mod icrc;
pub mod seg;

/// The IANA UDP port of RoCEv2.
pub const ROCEV2_UDP_PORT: u16 = 4791;
/// Base Transport Header length.
pub const BTH_LEN: usize = 12;
/// RDMA Extended Transport Header length.
pub const RETH_LEN: usize = 16;
/// ACK Extended Transport Header length.
pub const AETH_LEN: usize = 4;
/// Invalidate Extended Transport Header length.
pub const IETH_LEN: usize = 4;
/// Immediate data length.
pub const IMMDT_LEN: usize = 4;
/// Datagram Extended Transport Header length.
pub const DETH_LEN: usize = 8;
/// Invariant CRC length.
pub const ICRC_LEN: usize = 4;
/// The default (full-membership) partition key rxe always sends.
pub const DEFAULT_PKEY: u16 = 0xFFFF;
/// The Q_Key of the General Services Interface (QP1, CM MADs).
pub const GSI_QKEY: u32 = 0x8001_0000;
/// Largest 24-bit value (QPNs, PSNs, MSNs).
pub const MAX_24: u32 = 0x00FF_FFFF;

// ---------------------------------------------------------------------------
// Opcodes

/// The extension headers an opcode carries, in wire order: RETH or DETH,
/// then AETH, then ImmDt or IETH (IBTA Vol. 1 ch. 9; rxe_opcode.c).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExtHeaders {
    /// Datagram ETH (UD).
    pub deth: bool,
    /// RDMA ETH (Write FIRST/ONLY, Read request).
    pub reth: bool,
    /// ACK ETH (acknowledge, Read response FIRST/LAST/ONLY).
    pub aeth: bool,
    /// Immediate data.
    pub immdt: bool,
    /// Invalidate ETH (Send with Invalidate LAST/ONLY).
    pub ieth: bool,
    /// A payload may follow.
    pub payload: bool,
}

impl ExtHeaders {
    /// Total length of the extension headers.
    pub const fn len(&self) -> usize {
        (if self.deth { DETH_LEN } else { 0 })
            + (if self.reth { RETH_LEN } else { 0 })
            + (if self.aeth { AETH_LEN } else { 0 })
            + (if self.immdt { IMMDT_LEN } else { 0 })
            + (if self.ieth { IETH_LEN } else { 0 })
    }

    /// True when the opcode carries no extension header.
    pub const fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

macro_rules! opcodes {
    ($( $(#[$doc:meta])* $name:ident = $val:literal,
        [$($hdr:ident),*] )*) => {
        /// Transport opcodes this codec knows (`include/rdma/ib_pack.h`,
        /// `rxe_opcode.c`): the RC set without atomics and flush, plus the
        /// UD sends that carry CM MADs. Anything else parses as
        /// [`Error::UnknownValue`].
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum Opcode {
            $( $(#[$doc])* $name = $val, )*
        }

        impl Opcode {
            /// Every known opcode, in numeric order.
            pub const ALL: &'static [Opcode] = &[$(Opcode::$name),*];

            /// The opcode with wire value `v`, if known.
            pub const fn from_u8(v: u8) -> Option<Opcode> {
                match v {
                    $( $val => Some(Opcode::$name), )*
                    _ => None,
                }
            }

            /// The extension headers (and payload) this opcode carries.
            pub const fn headers(self) -> ExtHeaders {
                match self {
                    $( Opcode::$name => {
                        #[allow(unused_mut)]
                        let mut h = ExtHeaders {
                            deth: false, reth: false, aeth: false,
                            immdt: false, ieth: false, payload: false,
                        };
                        $( h.$hdr = true; )*
                        h
                    } )*
                }
            }
        }
    };
}

opcodes! {
    /// RC Send, first packet of several.
    RcSendFirst = 0x00, [payload]
    /// RC Send, middle packet.
    RcSendMiddle = 0x01, [payload]
    /// RC Send, last packet.
    RcSendLast = 0x02, [payload]
    /// RC Send, last packet, with immediate data.
    RcSendLastImm = 0x03, [immdt, payload]
    /// RC Send in one packet.
    RcSendOnly = 0x04, [payload]
    /// RC Send in one packet, with immediate data.
    RcSendOnlyImm = 0x05, [immdt, payload]
    /// RC RDMA Write, first packet (RETH).
    RcWriteFirst = 0x06, [reth, payload]
    /// RC RDMA Write, middle packet.
    RcWriteMiddle = 0x07, [payload]
    /// RC RDMA Write, last packet.
    RcWriteLast = 0x08, [payload]
    /// RC RDMA Write, last packet, with immediate data.
    RcWriteLastImm = 0x09, [immdt, payload]
    /// RC RDMA Write in one packet (RETH).
    RcWriteOnly = 0x0A, [reth, payload]
    /// RC RDMA Write in one packet with immediate (RETH then ImmDt).
    RcWriteOnlyImm = 0x0B, [reth, immdt, payload]
    /// RC RDMA Read request (RETH, no payload).
    RcReadRequest = 0x0C, [reth]
    /// RC RDMA Read response, first packet (AETH).
    RcReadResponseFirst = 0x0D, [aeth, payload]
    /// RC RDMA Read response, middle packet (no AETH).
    RcReadResponseMiddle = 0x0E, [payload]
    /// RC RDMA Read response, last packet (AETH).
    RcReadResponseLast = 0x0F, [aeth, payload]
    /// RC RDMA Read response in one packet (AETH).
    RcReadResponseOnly = 0x10, [aeth, payload]
    /// RC Acknowledge (AETH, no payload).
    RcAcknowledge = 0x11, [aeth]
    /// RC Send with Invalidate, last packet (IETH).
    RcSendLastInv = 0x16, [ieth, payload]
    /// RC Send with Invalidate in one packet (IETH).
    RcSendOnlyInv = 0x17, [ieth, payload]
    /// UD Send (DETH); CM MADs ride this to QP1.
    UdSendOnly = 0x64, [deth, payload]
    /// UD Send with immediate (DETH then ImmDt).
    UdSendOnlyImm = 0x65, [deth, immdt, payload]
}

/// Where a packet sits in its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Position {
    /// First of several packets.
    First,
    /// Neither first nor last.
    Middle,
    /// Last of several packets.
    Last,
    /// The whole message in one packet (also Read request and Acknowledge).
    Only,
}

impl Opcode {
    /// The wire value.
    pub const fn to_u8(self) -> u8 {
        self as u8
    }

    /// True for Reliable Connection opcodes (prefix 0x00).
    pub const fn is_rc(self) -> bool {
        self.to_u8() & 0xE0 == 0x00
    }

    /// True for Unreliable Datagram opcodes (prefix 0x60).
    pub const fn is_ud(self) -> bool {
        self.to_u8() & 0xE0 == 0x60
    }

    /// Position of a packet with this opcode within its message.
    pub const fn position(self) -> Position {
        use Opcode::*;
        match self {
            RcSendFirst | RcWriteFirst | RcReadResponseFirst => Position::First,
            RcSendMiddle | RcWriteMiddle | RcReadResponseMiddle => Position::Middle,
            RcSendLast | RcSendLastImm | RcSendLastInv | RcWriteLast | RcWriteLastImm
            | RcReadResponseLast => Position::Last,
            _ => Position::Only,
        }
    }
}

// ---------------------------------------------------------------------------
// PSN

/// A 24-bit packet sequence number. Arithmetic wraps modulo 2^24; order is
/// defined only within half the space (IBTA Vol. 1 ch. 9: a PSN is
/// "ahead" when it is less than 2^23 after the other), which is what rxe's
/// `psn_compare` computes with `(s32)((a - b) << 8)`.
///
/// `Psn` deliberately does not implement `Ord`: the order is not total.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    /// The modulus of PSN arithmetic.
    pub const MODULUS: u32 = 1 << 24;

    /// A PSN from a value below 2^24.
    pub const fn new(v: u32) -> Option<Psn> {
        if v <= MAX_24 {
            Some(Psn(v))
        } else {
            None
        }
    }

    /// A PSN from the low 24 bits of `v`.
    pub const fn from_masked(v: u32) -> Psn {
        Psn(v & MAX_24)
    }

    /// The 24-bit value.
    pub const fn value(self) -> u32 {
        self.0
    }

    /// `self + n` modulo 2^24.
    #[allow(clippy::should_implement_trait)]
    pub const fn add(self, n: u32) -> Psn {
        Psn(self.0.wrapping_add(n) & MAX_24)
    }

    /// `self - n` modulo 2^24.
    #[allow(clippy::should_implement_trait)]
    pub const fn sub(self, n: u32) -> Psn {
        Psn(self.0.wrapping_sub(n) & MAX_24)
    }

    /// The next PSN.
    pub const fn next(self) -> Psn {
        self.add(1)
    }

    /// Signed distance `self - earlier` in [-2^23, 2^23): positive when
    /// `self` is ahead of `earlier`. Exactly half a window apart reads as
    /// behind (-2^23), as rxe's compare does.
    pub const fn distance(self, earlier: Psn) -> i32 {
        // Shift the 24-bit difference into the top of an i32 and back:
        // sign extension gives the half-window interpretation.
        ((self.0.wrapping_sub(earlier.0) << 8) as i32) >> 8
    }

    /// Order within the half window: `Greater` when `self` is ahead.
    pub const fn compare(self, other: Psn) -> Ordering {
        let d = self.distance(other);
        if d < 0 {
            Ordering::Less
        } else if d > 0 {
            Ordering::Greater
        } else {
            Ordering::Equal
        }
    }
}

// ---------------------------------------------------------------------------
// Extension headers

/// RDMA Extended Transport Header (IBTA Vol. 1 ch. 9; rxe_hdr.h): remote VA, R_Key, DMA
/// length. 16 bytes: VA u64 | R_Key u32 | DMA length u32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Reth {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Length of the whole RDMA operation in bytes.
    pub dma_len: u32,
}

impl Reth {
    fn read(b: &[u8]) -> Reth {
        Reth {
            va: be64(b, 0),
            rkey: be32(b, 8),
            dma_len: be32(b, 12),
        }
    }

    fn write(&self, b: &mut [u8]) {
        b[0..8].copy_from_slice(&self.va.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        b[12..16].copy_from_slice(&self.dma_len.to_be_bytes());
    }
}

/// NAK codes of an AETH with syndrome type NAK (IBTA Vol. 1 ch. 9; rxe `enum aeth_syndrome`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum NakCode {
    /// PSN sequence error: the responder expected another PSN (in the AETH
    /// packet's PSN field); go back N.
    PsnSequenceError = 0,
    /// Invalid request (class C errors: bad opcode sequence, length).
    InvalidRequest = 1,
    /// Remote access error (R_Key, bounds, access rights).
    RemoteAccessError = 2,
    /// Remote operational error.
    RemoteOperationalError = 3,
    /// Invalid RD request (RD only; never sent by rxe).
    InvalidRdRequest = 4,
}

/// The AETH syndrome, typed (IBTA Vol. 1 ch. 9; Linux `enum aeth_syndrome`):
/// bits 7-5 type (0 ACK, 1 RNR NAK, 3 NAK; 2 reserved), bits 4-0 value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Syndrome {
    /// Positive acknowledgement with an end-to-end credit code (0-31;
    /// 31 = unlimited, which rxe always sends and ignores on receive).
    Ack {
        /// Credit count code.
        credit: u8,
    },
    /// Receiver not ready; retry after the encoded timer (0-31, 0 being the
    /// longest: 655.36 ms).
    RnrNak {
        /// RNR NAK timer code.
        timer: u8,
    },
    /// Negative acknowledgement.
    Nak(NakCode),
}

impl Syndrome {
    /// Credit code meaning "unlimited" / no flow control.
    pub const UNLIMITED_CREDIT: u8 = 0x1F;

    /// An ACK as rxe sends it (credit 0x1F).
    pub const ACK: Syndrome = Syndrome::Ack {
        credit: Self::UNLIMITED_CREDIT,
    };

    /// Decodes the syndrome byte.
    ///
    /// # Errors
    /// [`Error::UnknownValue`] for the reserved type (0x40-0x5F) and for
    /// NAK codes above 4.
    pub const fn from_u8(b: u8) -> Result<Syndrome> {
        let v = b & 0x1F;
        match b & 0xE0 {
            0x00 => Ok(Syndrome::Ack { credit: v }),
            0x20 => Ok(Syndrome::RnrNak { timer: v }),
            0x60 => match v {
                0 => Ok(Syndrome::Nak(NakCode::PsnSequenceError)),
                1 => Ok(Syndrome::Nak(NakCode::InvalidRequest)),
                2 => Ok(Syndrome::Nak(NakCode::RemoteAccessError)),
                3 => Ok(Syndrome::Nak(NakCode::RemoteOperationalError)),
                4 => Ok(Syndrome::Nak(NakCode::InvalidRdRequest)),
                _ => Err(Error::UnknownValue),
            },
            _ => Err(Error::UnknownValue),
        }
    }

    /// Encodes the syndrome byte.
    ///
    /// # Errors
    /// [`Error::Malformed`] when a credit or timer code exceeds 31.
    pub const fn to_u8(self) -> Result<u8> {
        match self {
            Syndrome::Ack { credit } if credit <= 0x1F => Ok(credit),
            Syndrome::RnrNak { timer } if timer <= 0x1F => Ok(0x20 | timer),
            Syndrome::Nak(code) => Ok(0x60 | code as u8),
            _ => Err(Error::Malformed),
        }
    }
}

/// RNR NAK timer code to microseconds (rxe_comp.c `rnrnak_usec`).
pub const fn rnr_timer_usec(code: u8) -> u32 {
    const T: [u32; 32] = [
        655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560,
        3_840, 5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880,
        163_840, 245_760, 327_680, 491_520,
    ];
    T[(code & 0x1F) as usize]
}

/// ACK Extended Transport Header (IBTA Vol. 1 ch. 9; rxe_hdr.h): syndrome u8 | MSN u24.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Aeth {
    /// What is being acknowledged.
    pub syndrome: Syndrome,
    /// Message sequence number (24 bits).
    pub msn: u32,
}

impl Aeth {
    fn read(b: &[u8]) -> Result<Aeth> {
        Ok(Aeth {
            syndrome: Syndrome::from_u8(b[0])?,
            msn: be24(b, 1),
        })
    }

    fn check(&self) -> Result<u8> {
        if self.msn > MAX_24 {
            return Err(Error::Malformed);
        }
        self.syndrome.to_u8()
    }

    fn write(&self, syn: u8, b: &mut [u8]) {
        b[0] = syn;
        put24(b, 1, self.msn);
    }
}

/// Datagram Extended Transport Header (IBTA Vol. 1 ch. 9; rxe_hdr.h): Q_Key u32 | resv u8 |
/// source QPN u24.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Deth {
    /// Queue key.
    pub qkey: u32,
    /// Sender's QP number (24 bits).
    pub src_qpn: u32,
}

// ---------------------------------------------------------------------------
// Zero-copy view

mod field {
    pub const OPCODE: usize = 0;
    pub const FLAGS: usize = 1; // SE 0x80, M 0x40, PadCnt 0x30, TVer 0x0F
    pub const PKEY: core::ops::Range<usize> = 2..4;
    pub const FECN_BECN: usize = 4; // F 0x80, B 0x40, resv6a
    pub const DEST_QPN: usize = 5; // 24 bits
    pub const ACKREQ: usize = 8; // A 0x80, resv7
    pub const PSN: usize = 9; // 24 bits
}

/// A zero-copy view of a RoCEv2 UDP payload (smoltcp style): BTH at
/// offset 0, extension headers, payload, pad, ICRC in the last 4 bytes.
#[derive(Debug, Clone, Copy)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps `buffer` without checking its length.
    pub const fn new_unchecked(buffer: T) -> Self {
        Packet { buffer }
    }

    /// Wraps `buffer` after [`Packet::check_len`].
    ///
    /// # Errors
    /// As [`Packet::check_len`].
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Checks that the BTH, the ICRC and, for a known opcode, its extension
    /// headers fit. An unknown opcode passes (the BTH can still be read).
    ///
    /// # Errors
    /// [`Error::Truncated`] when the buffer is too short.
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        let ext = self.opcode().map_or(0, |o| o.headers().len());
        if len < BTH_LEN + ext + ICRC_LEN {
            Err(Error::Truncated)
        } else {
            Ok(())
        }
    }

    /// Consumes the view, returning the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn byte(&self, i: usize) -> u8 {
        self.buffer.as_ref().get(i).copied().unwrap_or(0)
    }

    /// Raw opcode byte.
    pub fn opcode_raw(&self) -> u8 {
        self.byte(field::OPCODE)
    }

    /// The opcode, if known.
    pub fn opcode(&self) -> Option<Opcode> {
        Opcode::from_u8(self.opcode_raw())
    }

    /// Solicited Event bit.
    pub fn solicited(&self) -> bool {
        self.byte(field::FLAGS) & 0x80 != 0
    }

    /// MigReq bit.
    pub fn mig_req(&self) -> bool {
        self.byte(field::FLAGS) & 0x40 != 0
    }

    /// Pad count (0-3).
    pub fn pad_count(&self) -> usize {
        usize::from((self.byte(field::FLAGS) >> 4) & 3)
    }

    /// Transport header version (must be 0).
    pub fn tver(&self) -> u8 {
        self.byte(field::FLAGS) & 0x0F
    }

    /// Partition key.
    pub fn pkey(&self) -> u16 {
        u16::from_be_bytes([self.byte(field::PKEY.start), self.byte(field::PKEY.end - 1)])
    }

    /// Forward explicit congestion notification.
    pub fn fecn(&self) -> bool {
        self.byte(field::FECN_BECN) & 0x80 != 0
    }

    /// Backward explicit congestion notification.
    pub fn becn(&self) -> bool {
        self.byte(field::FECN_BECN) & 0x40 != 0
    }

    /// Destination QP number (24 bits).
    pub fn dest_qpn(&self) -> u32 {
        self.u24(field::DEST_QPN)
    }

    /// AckReq bit.
    pub fn ack_req(&self) -> bool {
        self.byte(field::ACKREQ) & 0x80 != 0
    }

    /// Packet sequence number.
    pub fn psn(&self) -> Psn {
        Psn::from_masked(self.u24(field::PSN))
    }

    fn u24(&self, at: usize) -> u32 {
        u32::from_be_bytes([0, self.byte(at), self.byte(at + 1), self.byte(at + 2)])
    }

    /// The ICRC as the little-endian word on the wire (compare with
    /// [`icrc::compute_ipv4`] and friends); 0 when the buffer is short.
    pub fn icrc(&self) -> u32 {
        let b = self.buffer.as_ref();
        b.len()
            .checked_sub(ICRC_LEN)
            .and_then(|at| b.get(at..))
            .map_or(0, |t| u32::from_le_bytes([t[0], t[1], t[2], t[3]]))
    }

    /// Bytes after the BTH up to (excluding) the ICRC; empty when short.
    pub fn transport_body(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        b.get(BTH_LEN..b.len().saturating_sub(ICRC_LEN))
            .unwrap_or(&[])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    fn set_byte(&mut self, i: usize, v: u8) {
        if let Some(b) = self.buffer.as_mut().get_mut(i) {
            *b = v;
        }
    }

    fn set_u24(&mut self, at: usize, v: u32) {
        let b = v.to_be_bytes();
        self.set_byte(at, b[1]);
        self.set_byte(at + 1, b[2]);
        self.set_byte(at + 2, b[3]);
    }

    /// Sets the opcode byte.
    pub fn set_opcode_raw(&mut self, v: u8) {
        self.set_byte(field::OPCODE, v);
    }

    /// Sets byte 1 from its parts (TVer is written as given, low 4 bits).
    pub fn set_flags(&mut self, solicited: bool, mig_req: bool, pad_count: usize, tver: u8) {
        let v = (u8::from(solicited) << 7)
            | (u8::from(mig_req) << 6)
            | (((pad_count & 3) as u8) << 4)
            | (tver & 0x0F);
        self.set_byte(field::FLAGS, v);
    }

    /// Sets the partition key.
    pub fn set_pkey(&mut self, v: u16) {
        let b = v.to_be_bytes();
        self.set_byte(field::PKEY.start, b[0]);
        self.set_byte(field::PKEY.start + 1, b[1]);
    }

    /// Sets FECN/BECN (the reserved bits of byte 4 become zero).
    pub fn set_fecn_becn(&mut self, fecn: bool, becn: bool) {
        self.set_byte(
            field::FECN_BECN,
            (u8::from(fecn) << 7) | (u8::from(becn) << 6),
        );
    }

    /// Sets the destination QPN (low 24 bits of `v`).
    pub fn set_dest_qpn(&mut self, v: u32) {
        self.set_u24(field::DEST_QPN, v);
    }

    /// Sets AckReq (the reserved bits of byte 8 become zero).
    pub fn set_ack_req(&mut self, v: bool) {
        self.set_byte(field::ACKREQ, u8::from(v) << 7);
    }

    /// Sets the PSN.
    pub fn set_psn(&mut self, v: Psn) {
        self.set_u24(field::PSN, v.value());
    }
}

// ---------------------------------------------------------------------------
// Whole-packet representation

/// The BTH fields a sender chooses (PadCnt is derived from the payload
/// length and TVer is always 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Bth {
    /// Opcode.
    pub opcode: Opcode,
    /// Solicited Event.
    pub solicited: bool,
    /// MigReq (rxe always sends 0).
    pub mig_req: bool,
    /// Partition key ([`DEFAULT_PKEY`]).
    pub pkey: u16,
    /// FECN (not covered by the ICRC).
    pub fecn: bool,
    /// BECN (not covered by the ICRC).
    pub becn: bool,
    /// Destination QP number (24 bits).
    pub dest_qpn: u32,
    /// Acknowledge request.
    pub ack_req: bool,
    /// Packet sequence number.
    pub psn: Psn,
}

impl Bth {
    /// A BTH with defaults as rxe sends them: no SE, no MigReq, P_Key
    /// 0xFFFF, no congestion bits, no AckReq.
    pub const fn new(opcode: Opcode, dest_qpn: u32, psn: Psn) -> Bth {
        Bth {
            opcode,
            solicited: false,
            mig_req: false,
            pkey: DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qpn,
            ack_req: false,
            psn,
        }
    }
}

/// A checked RoCEv2 transport packet: BTH, the extension headers its opcode
/// carries and the payload without pad. `parse` takes the UDP payload
/// including the ICRC; `emit` writes the same layout with a zero ICRC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RocePacket<'a> {
    /// Base transport header.
    pub bth: Bth,
    /// DETH (UD opcodes).
    pub deth: Option<Deth>,
    /// RETH (Write FIRST/ONLY, Read request).
    pub reth: Option<Reth>,
    /// AETH (Acknowledge, Read response FIRST/LAST/ONLY).
    pub aeth: Option<Aeth>,
    /// Immediate data (`*_IMM` opcodes), as the 32-bit big-endian word.
    pub immdt: Option<u32>,
    /// R_Key to invalidate (`*_INV` opcodes).
    pub ieth: Option<u32>,
    /// Payload without pad.
    pub payload: &'a [u8],
}

impl<'a> RocePacket<'a> {
    /// A packet with only a BTH and a payload (fill in extension headers
    /// before emitting if the opcode needs them).
    pub const fn new(bth: Bth, payload: &'a [u8]) -> RocePacket<'a> {
        RocePacket {
            bth,
            deth: None,
            reth: None,
            aeth: None,
            immdt: None,
            ieth: None,
            payload,
        }
    }

    /// Parses a UDP payload: BTH, extension headers, payload, pad, ICRC
    /// (not verified; see [`icrc`]).
    ///
    /// # Errors
    /// * [`Error::Truncated`]: shorter than BTH + extension headers + ICRC.
    /// * [`Error::Malformed`]: TVer != 0; PadCnt larger than the payload
    ///   area; payload area not a multiple of 4; a payload on an opcode
    ///   that carries none.
    /// * [`Error::UnknownValue`]: unknown opcode or AETH syndrome.
    pub fn parse(data: &'a [u8]) -> Result<RocePacket<'a>> {
        let view = Packet::new_unchecked(data);
        if data.len() < BTH_LEN {
            return Err(Error::Truncated);
        }
        if view.tver() != 0 {
            return Err(Error::Malformed);
        }
        let opcode = view.opcode().ok_or(Error::UnknownValue)?;
        view.check_len()?;
        let hdrs = opcode.headers();
        let body = &data[BTH_LEN..data.len() - ICRC_LEN];
        let (ext, rest) = body.split_at(hdrs.len());
        let pad = view.pad_count();
        if rest.len() % 4 != 0 || pad > rest.len() || (!hdrs.payload && !rest.is_empty()) {
            return Err(Error::Malformed);
        }
        let mut at = 0;
        let mut take = |n: usize| {
            let s = &ext[at..at + n];
            at += n;
            s
        };
        let deth = hdrs.deth.then(|| {
            let b = take(DETH_LEN);
            Deth {
                qkey: be32(b, 0),
                src_qpn: be24(b, 5),
            }
        });
        let reth = hdrs.reth.then(|| Reth::read(take(RETH_LEN)));
        let aeth = match hdrs.aeth {
            true => Some(Aeth::read(take(AETH_LEN))?),
            false => None,
        };
        let immdt = hdrs.immdt.then(|| be32(take(IMMDT_LEN), 0));
        let ieth = hdrs.ieth.then(|| be32(take(IETH_LEN), 0));
        Ok(RocePacket {
            bth: Bth {
                opcode,
                solicited: view.solicited(),
                mig_req: view.mig_req(),
                pkey: view.pkey(),
                fecn: view.fecn(),
                becn: view.becn(),
                dest_qpn: view.dest_qpn(),
                ack_req: view.ack_req(),
                psn: view.psn(),
            },
            deth,
            reth,
            aeth,
            immdt,
            ieth,
            payload: &rest[..rest.len() - pad],
        })
    }

    /// Pad bytes after the payload: `(-len) & 3`.
    pub const fn pad_len(&self) -> usize {
        self.payload.len().wrapping_neg() & 3
    }

    /// Bytes `emit` writes: BTH + extension headers + payload + pad + ICRC.
    pub const fn buffer_len(&self) -> usize {
        BTH_LEN + self.bth.opcode.headers().len() + self.payload.len() + self.pad_len() + ICRC_LEN
    }

    /// Offset of the payload in the emitted packet.
    pub const fn payload_offset(&self) -> usize {
        BTH_LEN + self.bth.opcode.headers().len()
    }

    fn validate(&self) -> Result<Option<u8>> {
        let h = self.bth.opcode.headers();
        let present = ExtHeaders {
            deth: self.deth.is_some(),
            reth: self.reth.is_some(),
            aeth: self.aeth.is_some(),
            immdt: self.immdt.is_some(),
            ieth: self.ieth.is_some(),
            payload: h.payload,
        };
        if present != h
            || (!h.payload && !self.payload.is_empty())
            || self.bth.dest_qpn > MAX_24
            || self.deth.is_some_and(|d| d.src_qpn > MAX_24)
        {
            return Err(Error::Malformed);
        }
        self.aeth.map(|a| a.check()).transpose()
    }

    /// Writes the packet at the start of `buf` with PadCnt computed, zero
    /// pad bytes and a zero ICRC; returns [`RocePacket::buffer_len`].
    ///
    /// # Errors
    /// [`Error::Malformed`] when the extension headers present do not match
    /// the opcode's table, a payload is given to an opcode without one, a
    /// QPN/MSN exceeds 24 bits or a syndrome code exceeds 31;
    /// [`Error::BufferTooShort`] when `buf` is too small. Nothing is written
    /// on error.
    //
    // packet = BTH [DETH] [RETH] [AETH] [ImmDt | IETH] payload pad ICRC
    //                                  -- IBTA Vol. 1 ch. 9, rxe_opcode.c
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        let len = self.emit_around_payload(buf)?;
        let at = self.payload_offset();
        buf[at..at + self.payload.len()].copy_from_slice(self.payload);
        Ok(len)
    }

    /// [`RocePacket::emit`] without the payload's bytes: writes the
    /// headers, zero pad bytes and a zero ICRC, and leaves the
    /// `self.payload.len()` bytes at [`RocePacket::payload_offset`] as they
    /// were, for a caller that gathers the payload into them itself (from
    /// registered memory: one pass over the data instead of three).
    ///
    /// # Errors
    /// As [`RocePacket::emit`].
    pub fn emit_around_payload(&self, buf: &mut [u8]) -> Result<usize> {
        let syn = self.validate()?;
        let len = self.buffer_len();
        let out = buf.get_mut(..len).ok_or(Error::BufferTooShort)?;
        let payload_at = self.payload_offset();
        out[..payload_at].fill(0);
        out[payload_at + self.payload.len()..].fill(0);
        {
            let mut v = Packet::new_unchecked(&mut *out);
            let b = self.bth;
            v.set_opcode_raw(b.opcode.to_u8());
            v.set_flags(b.solicited, b.mig_req, self.pad_len(), 0);
            v.set_pkey(b.pkey);
            v.set_fecn_becn(b.fecn, b.becn);
            v.set_dest_qpn(b.dest_qpn);
            v.set_ack_req(b.ack_req);
            v.set_psn(b.psn);
        }
        let mut at = BTH_LEN;
        if let Some(d) = self.deth {
            out[at..at + 4].copy_from_slice(&d.qkey.to_be_bytes());
            put24(out, at + 5, d.src_qpn);
            at += DETH_LEN;
        }
        if let Some(r) = self.reth {
            r.write(&mut out[at..at + RETH_LEN]);
            at += RETH_LEN;
        }
        if let (Some(a), Some(syn)) = (self.aeth, syn) {
            a.write(syn, &mut out[at..at + AETH_LEN]);
            at += AETH_LEN;
        }
        for word in [self.immdt, self.ieth].into_iter().flatten() {
            out[at..at + 4].copy_from_slice(&word.to_be_bytes());
            at += 4;
        }
        debug_assert_eq!(at, payload_at);
        Ok(len)
    }
}

// ---------------------------------------------------------------------------
// Fuzzing entry point

/// Runs the RoCE packet parser and the ICRC functions over `data`;
/// whatever parses must re-emit into exactly `buffer_len()` bytes and
/// parse back equal. The `roce_packet` cargo-fuzz target calls it and
/// then [`super::ibcm::fuzz_parse`] (the IB CM codecs sit above this
/// module, so the caller combines the two).
///
/// # Panics
/// Only when a codec invariant is broken (that is what it is for).
pub fn fuzz_parse(data: &[u8]) {
    if let Ok(p) = RocePacket::parse(data) {
        assert_eq!(p.buffer_len(), data.len(), "parse consumed everything");
        let mut buf = vec![0u8; p.buffer_len()];
        let n = p.emit(&mut buf).expect("a parsed packet must emit");
        assert_eq!(n, buf.len());
        let again = RocePacket::parse(&buf).expect("re-parse");
        assert_eq!(again, p);
        let view = Packet::new_checked(data).expect("view of a parsed packet");
        assert_eq!(view.psn(), p.bth.psn);
        assert_eq!(view.dest_qpn(), p.bth.dest_qpn);
    }
    let _ = icrc::compute_frame(data);
    let _ = icrc::verify_frame(data);
}

#[cfg(test)]
mod tests;
