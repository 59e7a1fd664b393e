//! Path-MTU segmentation of RC messages (IBTA Vol. 1 ch. 9; rxe_req.c and
//! the responder length rules of rxe_resp.c, padding included).
//!
//! A message of `len` bytes travels in `max(1, ceil(len / mtu))` packets,
//! each but the last carrying exactly `mtu` payload bytes. One packet is
//! ONLY; otherwise FIRST, MIDDLE..., LAST. Immediate data and invalidation
//! ride on the last (or only) packet; an RDMA Write's RETH on the first
//! (or only). A zero-length message is one ONLY packet with no payload
//! (rxe rejects a zero-length LAST, which this never produces).

use super::Opcode;

/// Path MTU, with the IB enumeration values used in CM REQ/`ibv_mtu`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Mtu {
    /// 256 bytes.
    Mtu256 = 1,
    /// 512 bytes.
    Mtu512 = 2,
    /// 1024 bytes (rxe on a 1500-byte Ethernet link).
    Mtu1024 = 3,
    /// 2048 bytes.
    Mtu2048 = 4,
    /// 4096 bytes (rxe's maximum).
    Mtu4096 = 5,
}

impl Mtu {
    /// Every path MTU, smallest first.
    pub const ALL: [Mtu; 5] = [
        Mtu::Mtu256,
        Mtu::Mtu512,
        Mtu::Mtu1024,
        Mtu::Mtu2048,
        Mtu::Mtu4096,
    ];

    /// From the IB enumeration value (1..=5).
    pub const fn from_ib(v: u8) -> Option<Mtu> {
        match v {
            1 => Some(Mtu::Mtu256),
            2 => Some(Mtu::Mtu512),
            3 => Some(Mtu::Mtu1024),
            4 => Some(Mtu::Mtu2048),
            5 => Some(Mtu::Mtu4096),
            _ => None,
        }
    }

    /// The IB enumeration value.
    pub const fn to_ib(self) -> u8 {
        self as u8
    }

    /// Payload bytes per full packet.
    pub const fn bytes(self) -> u32 {
        128 << (self as u32)
    }

    /// From a byte count that is exactly one of the five MTUs.
    pub const fn from_bytes(b: u32) -> Option<Mtu> {
        match b {
            256 => Some(Mtu::Mtu256),
            512 => Some(Mtu::Mtu512),
            1024 => Some(Mtu::Mtu1024),
            2048 => Some(Mtu::Mtu2048),
            4096 => Some(Mtu::Mtu4096),
            _ => None,
        }
    }
}

/// The kind of RC message being segmented.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MessageKind {
    /// Send.
    Send,
    /// Send with immediate data.
    SendImm,
    /// Send with Invalidate.
    SendInv,
    /// RDMA Write.
    Write,
    /// RDMA Write with immediate data.
    WriteImm,
    /// RDMA Read response (the responder's side of a Read).
    ReadResponse,
}

/// Number of packets for a `len`-byte message (at least 1).
pub const fn packet_count(len: u32, mtu: Mtu) -> u32 {
    if len == 0 {
        1
    } else {
        len.div_ceil(mtu.bytes())
    }
}

/// Payload bytes of packet `index`, or `None` past the last packet.
pub const fn payload_len(len: u32, mtu: Mtu, index: u32) -> Option<u32> {
    let count = packet_count(len, mtu);
    if index >= count {
        None
    } else if index + 1 < count {
        Some(mtu.bytes())
    } else {
        Some(len - index * mtu.bytes())
    }
}

/// Opcode of packet `index` of `count` for a message of `kind`, or `None`
/// when `index >= count`.
pub const fn opcode(kind: MessageKind, index: u32, count: u32) -> Option<Opcode> {
    use MessageKind as K;
    use Opcode::*;
    if index >= count {
        return None;
    }
    let only = count == 1;
    let first = index == 0;
    let last = index + 1 == count;
    Some(match kind {
        K::Send if only => RcSendOnly,
        K::SendImm if only => RcSendOnlyImm,
        K::SendInv if only => RcSendOnlyInv,
        K::Write if only => RcWriteOnly,
        K::WriteImm if only => RcWriteOnlyImm,
        K::ReadResponse if only => RcReadResponseOnly,
        K::Send | K::SendImm | K::SendInv if first => RcSendFirst,
        K::Write | K::WriteImm if first => RcWriteFirst,
        K::ReadResponse if first => RcReadResponseFirst,
        K::Send if last => RcSendLast,
        K::SendImm if last => RcSendLastImm,
        K::SendInv if last => RcSendLastInv,
        K::Write if last => RcWriteLast,
        K::WriteImm if last => RcWriteLastImm,
        K::ReadResponse if last => RcReadResponseLast,
        K::Send | K::SendImm | K::SendInv => RcSendMiddle,
        K::Write | K::WriteImm => RcWriteMiddle,
        K::ReadResponse => RcReadResponseMiddle,
    })
}

/// One packet of a segmented message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Segment {
    /// Index within the message (PSN offset from the first packet).
    pub index: u32,
    /// Byte offset of this packet's payload within the message.
    pub offset: u32,
    /// Payload bytes (pad excluded).
    pub len: u32,
    /// Opcode to send.
    pub opcode: Opcode,
}

/// Iterator over the packets of one message.
#[derive(Debug, Clone)]
pub struct Segments {
    kind: MessageKind,
    len: u32,
    mtu: Mtu,
    index: u32,
    count: u32,
}

impl Segments {
    /// Segments a `len`-byte message of `kind` at path MTU `mtu`.
    pub const fn new(kind: MessageKind, len: u32, mtu: Mtu) -> Segments {
        Segments {
            kind,
            len,
            mtu,
            index: 0,
            count: packet_count(len, mtu),
        }
    }
}

impl Iterator for Segments {
    type Item = Segment;

    fn next(&mut self) -> Option<Segment> {
        let opcode = opcode(self.kind, self.index, self.count)?;
        let len = payload_len(self.len, self.mtu, self.index)?;
        let s = Segment {
            index: self.index,
            offset: self.index * self.mtu.bytes(),
            len,
            opcode,
        };
        self.index += 1;
        Some(s)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = (self.count - self.index.min(self.count)) as usize;
        (n, Some(n))
    }
}

impl ExactSizeIterator for Segments {}
