//! InfiniBand Communication Management MADs as Linux rdma_cm sends them
//! over RoCEv2 to QP1 (IBTA Vol. 1 ch. 12 CM message formats, Tables 106-113 as
//! the kernel numbers them; ch. 13 MAD header; Linux `include/rdma/ibta_vol1_c12.h`, `cm_msgs.h`,
//! `cma_priv.h`/`cma.c` for the rdma_cm header).
//!
//! A CM MAD is the 256-byte payload of a UD Send (BTH opcode 0x64, dest QP
//! 1, DETH Q_Key 0x80010000, source QP 1; see [`gsi_packet`]):
//!
//! ```text
//!  MAD header (24 B)                 CM message (232 B at MAD offset 24)
//!  0 BaseVersion = 1                 REQ REP RTU REJ DREQ DREP MRA: fixed
//!  1 MgmtClass   = 0x07 (CM)         layouts, tables on each type below,
//!  2 ClassVersion = 2                offsets relative to MAD byte 24,
//!  3 Method      = 0x03 (Send)       bit 7 = most significant.
//!  4 Status (2)  6 ClassSpecific (2)
//!  8 TransactionID (8)
//!  16 AttributeID (2) 18 reserved (2) 20 AttributeModifier (4)
//! ```
//!
//! REQ private data starts with the 36-byte rdma_cm header
//! ([`RdmaCmHeader`]); the consumer's data (where the RFC 8797 bytes of
//! [`super::rpcrdma::PrivateData`] ride) follows it. The other messages
//! carry consumer data only.
//!
//! # Private data in the Reprs
//! Each message has a fixed private-data area. `parse` returns the whole
//! area; `emit` accepts up to its size and pads with zeros. So a message
//! built with short private data re-parses with the zero padding attached.
//!
//! # What parse checks
//! Exactly 256 bytes; base version 1, class 0x07, class version 2, method
//! Send (Linux `validate_mad` rejects others for CM attributes); a known
//! attribute ID; a valid path MTU code in REQ. Reserved bits and the ECE
//! bytes are ignored and sent as zero.
//!
//! # Panic contract
//! Nothing here panics on any input, except [`fuzz_parse`], whose job is
//! to panic when a codec invariant breaks. Emitters validate field widths
//! and the buffer size before writing a byte.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::bytes::{be16, be24, be32, be64, put24};
use super::roce::seg::Mtu;
use super::roce::{Bth, Deth, Opcode, Psn, RocePacket, GSI_QKEY};
use super::{Error, Result};

/// Length of a MAD.
pub const MAD_LEN: usize = 256;
/// Length of the common MAD header.
pub const MAD_HEADER_LEN: usize = 24;
/// Length of the CM message area after the header.
pub const CM_DATA_LEN: usize = MAD_LEN - MAD_HEADER_LEN;
/// MAD base version.
pub const BASE_VERSION: u8 = 1;
/// Management class of the Communication Manager.
pub const MGMT_CLASS_CM: u8 = 0x07;
/// CM class version Linux sends.
pub const CM_CLASS_VERSION: u8 = 2;
/// MAD method Send (all CM messages but ClassPortInfo).
pub const METHOD_SEND: u8 = 0x03;
/// QP number of the General Services Interface.
pub const GSI_QPN: u32 = 1;
/// The rdma_cm port space prefix of TCP service IDs (RDMA_PS_TCP << 16).
pub const RDMA_CM_TCP_SERVICE_ID: u64 = 0x0000_0000_0106_0000;
/// Length of the rdma_cm header at the start of REQ private data.
pub const RDMA_CM_HEADER_LEN: usize = 36;

/// Private data sizes (ibta_vol1_c12.h).
pub mod private_len {
    /// REQ.
    pub const REQ: usize = 92;
    /// REP.
    pub const REP: usize = 196;
    /// RTU.
    pub const RTU: usize = 224;
    /// REJ.
    pub const REJ: usize = 148;
    /// DREQ.
    pub const DREQ: usize = 220;
    /// DREP.
    pub const DREP: usize = 224;
    /// MRA.
    pub const MRA: usize = 222;
}

/// CM attribute IDs (IBTA Vol. 1 ch. 12; Linux ib_cm.h).
pub mod attr {
    /// Connection request.
    pub const REQ: u16 = 0x0010;
    /// Message receipt acknowledgement.
    pub const MRA: u16 = 0x0011;
    /// Connection reject.
    pub const REJ: u16 = 0x0012;
    /// Connection reply.
    pub const REP: u16 = 0x0013;
    /// Ready to use.
    pub const RTU: u16 = 0x0014;
    /// Disconnect request.
    pub const DREQ: u16 = 0x0015;
    /// Disconnect reply.
    pub const DREP: u16 = 0x0016;
}

/// REJ reason codes rdma_cm peers use (Linux `enum ib_cm_rej_reason`).
pub mod rej_reason {
    /// No QP available.
    pub const NO_QP: u16 = 1;
    /// No resources available.
    pub const NO_RESOURCES: u16 = 3;
    /// Timeout: the peer did not answer (here: no RTU after our REPs).
    pub const TIMEOUT: u16 = 4;
    /// Invalid service ID (nobody listens).
    pub const INVALID_SERVICE_ID: u16 = 8;
    /// Stale connection.
    pub const STALE_CONN: u16 = 10;
    /// Invalid GID.
    pub const INVALID_GID: u16 = 12;
    /// Invalid path MTU.
    pub const INVALID_MTU: u16 = 26;
    /// Consumer-defined reject (rdma_reject).
    pub const CONSUMER_DEFINED: u16 = 28;
}

/// The rdma_cm service ID of TCP port `port` (RDMA_PS_TCP).
pub const fn tcp_service_id(port: u16) -> u64 {
    RDMA_CM_TCP_SERVICE_ID | port as u64
}

/// The TCP port of an rdma_cm TCP-port-space service ID.
pub const fn tcp_port_of_service_id(sid: u64) -> Option<u16> {
    if sid & !0xFFFF == RDMA_CM_TCP_SERVICE_ID {
        Some((sid & 0xFFFF) as u16)
    } else {
        None
    }
}

/// The IPv4-mapped GID (`::ffff:a.b.c.d`) RoCEv2 uses for an IPv4 address.
pub const fn ipv4_mapped_gid(a: Ipv4Addr) -> [u8; 16] {
    let o = a.octets();
    [
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, o[0], o[1], o[2], o[3],
    ]
}

/// The IP address a GID stands for (IPv4 when IPv4-mapped).
pub fn gid_to_ip(gid: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(gid);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// The UD packet that carries a MAD to or from QP1: UD SEND_ONLY, P_Key
/// 0xFFFF, dest QP 1, DETH Q_Key 0x80010000, source QP 1.
pub const fn gsi_packet(psn: Psn, mad: &[u8]) -> RocePacket<'_> {
    let mut p = RocePacket::new(Bth::new(Opcode::UdSendOnly, GSI_QPN, psn), mad);
    p.deth = Some(Deth {
        qkey: GSI_QKEY,
        src_qpn: GSI_QPN,
    });
    p
}

// ---------------------------------------------------------------------------
// Field helpers over fixed-size areas (indices are constants in range)

fn gid(b: &[u8], at: usize) -> [u8; 16] {
    let mut g = [0u8; 16];
    g.copy_from_slice(&b[at..at + 16]);
    g
}
fn put(b: &mut [u8], at: usize, v: &[u8]) {
    b[at..at + v.len()].copy_from_slice(v);
}
/// Fails with [`Error::Malformed`] unless `v` fits in `bits` bits.
fn width(v: u32, bits: u32) -> Result<()> {
    if v >> bits == 0 {
        Ok(())
    } else {
        Err(Error::Malformed)
    }
}
fn private(area: &mut [u8], at: usize, max: usize, data: &[u8]) -> Result<()> {
    if data.len() > max {
        return Err(Error::LimitExceeded);
    }
    put(area, at, data);
    Ok(())
}

// ---------------------------------------------------------------------------
// MAD header

/// The common MAD header (IBTA Vol. 1 ch. 13; ib_mad.h), unvalidated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MadHeader {
    /// Base version (1).
    pub base_version: u8,
    /// Management class (0x07 for CM).
    pub mgmt_class: u8,
    /// Class version (2 for CM).
    pub class_version: u8,
    /// Method (0x03 Send).
    pub method: u8,
    /// Status.
    pub status: u16,
    /// Class-specific word.
    pub class_specific: u16,
    /// Transaction ID (Linux: agent id in the high half, local comm ID in
    /// the low half; replies echo the request's).
    pub tid: u64,
    /// Attribute ID (see [`attr`]).
    pub attr_id: u16,
    /// Attribute modifier (ECE on newer kernels, normally 0).
    pub attr_mod: u32,
}

impl MadHeader {
    /// A CM Send header for `attr_id`.
    pub const fn cm(attr_id: u16, tid: u64) -> MadHeader {
        MadHeader {
            base_version: BASE_VERSION,
            mgmt_class: MGMT_CLASS_CM,
            class_version: CM_CLASS_VERSION,
            method: METHOD_SEND,
            status: 0,
            class_specific: 0,
            tid,
            attr_id,
            attr_mod: 0,
        }
    }

    /// Decodes the first 24 bytes of `data` (byte 18-19 reserved, ignored).
    ///
    /// # Errors
    /// [`Error::Truncated`] when shorter than 24 bytes.
    pub fn parse(data: &[u8]) -> Result<MadHeader> {
        let b = data.get(..MAD_HEADER_LEN).ok_or(Error::Truncated)?;
        Ok(MadHeader {
            base_version: b[0],
            mgmt_class: b[1],
            class_version: b[2],
            method: b[3],
            status: be16(b, 4),
            class_specific: be16(b, 6),
            tid: be64(b, 8),
            attr_id: be16(b, 16),
            attr_mod: be32(b, 20),
        })
    }

    /// Always [`MAD_HEADER_LEN`].
    pub const fn buffer_len(&self) -> usize {
        MAD_HEADER_LEN
    }

    /// Writes the 24 bytes; returns 24.
    ///
    /// # Errors
    /// [`Error::BufferTooShort`] when `buf` is shorter than 24 bytes.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        let b = buf.get_mut(..MAD_HEADER_LEN).ok_or(Error::BufferTooShort)?;
        b[0] = self.base_version;
        b[1] = self.mgmt_class;
        b[2] = self.class_version;
        b[3] = self.method;
        put(b, 4, &self.status.to_be_bytes());
        put(b, 6, &self.class_specific.to_be_bytes());
        put(b, 8, &self.tid.to_be_bytes());
        put(b, 16, &self.attr_id.to_be_bytes());
        put(b, 18, &[0, 0]);
        put(b, 20, &self.attr_mod.to_be_bytes());
        Ok(MAD_HEADER_LEN)
    }
}

// ---------------------------------------------------------------------------
// Path

/// A CM path record as carried in REQ (44 bytes):
///
/// | off | field |
/// |---|---|
/// | 0 | local LID (2) |
/// | 2 | remote LID (2; 0xFFFF on RoCE) |
/// | 4 | local GID (16) |
/// | 20 | remote GID (16) |
/// | 36 | flow label `[31:12]`, reserved `[11:6]`, packet rate `[5:0]` |
/// | 40 | traffic class |
/// | 41 | hop limit |
/// | 42 | SL `[7:4]`, subnet local `[3]` |
/// | 43 | local ACK timeout `[7:3]` |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CmPath {
    /// Local LID.
    pub local_lid: u16,
    /// Remote LID.
    pub remote_lid: u16,
    /// Local GID (IPv4-mapped on RoCEv2 over IPv4).
    pub local_gid: [u8; 16],
    /// Remote GID.
    pub remote_gid: [u8; 16],
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Packet rate (6 bits).
    pub packet_rate: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Subnet local.
    pub subnet_local: bool,
    /// Local ACK timeout (5 bits).
    pub local_ack_timeout: u8,
}

const PATH_LEN: usize = 44;

impl CmPath {
    fn read(b: &[u8]) -> CmPath {
        let w = be32(b, 36);
        CmPath {
            local_lid: be16(b, 0),
            remote_lid: be16(b, 2),
            local_gid: gid(b, 4),
            remote_gid: gid(b, 20),
            flow_label: w >> 12,
            packet_rate: (w & 0x3F) as u8,
            traffic_class: b[40],
            hop_limit: b[41],
            sl: b[42] >> 4,
            subnet_local: b[42] & 0x08 != 0,
            local_ack_timeout: b[43] >> 3,
        }
    }

    fn write(&self, b: &mut [u8]) -> Result<()> {
        width(self.flow_label, 20)?;
        width(u32::from(self.packet_rate), 6)?;
        width(u32::from(self.sl), 4)?;
        width(u32::from(self.local_ack_timeout), 5)?;
        put(b, 0, &self.local_lid.to_be_bytes());
        put(b, 2, &self.remote_lid.to_be_bytes());
        put(b, 4, &self.local_gid);
        put(b, 20, &self.remote_gid);
        put(
            b,
            36,
            &((self.flow_label << 12) | u32::from(self.packet_rate)).to_be_bytes(),
        );
        b[40] = self.traffic_class;
        b[41] = self.hop_limit;
        b[42] = (self.sl << 4) | (u8::from(self.subnet_local) << 3);
        b[43] = self.local_ack_timeout << 3;
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Messages

/// ConnectRequest (IBTA Table 106). Offsets from MAD byte 24:
///
/// | off | field |
/// |---|---|
/// | 0 | local comm ID (4) |
/// | 4 | reserved / ECE vendor ID (4, ignored) |
/// | 8 | service ID (8) |
/// | 16 | local CA GUID (8) |
/// | 24 | reserved (4) |
/// | 28 | local Q_Key (4) |
/// | 32 | local QPN (3), responder resources (1) |
/// | 36 | local EECN (3), initiator depth (1) |
/// | 40 | remote EECN (3); 43: remote CM response timeout `[7:3]`, transport service type `[2:1]`, end-to-end flow control `[0]` |
/// | 44 | starting PSN (3); 47: local CM response timeout `[7:3]`, retry count `[2:0]` |
/// | 48 | P_Key (2) |
/// | 50 | path MTU `[7:4]`, RDC exists `[3]`, RNR retry count `[2:0]` |
/// | 51 | max CM retries `[7:4]`, SRQ `[3]`, extended transport type `[2:0]` |
/// | 52 | primary path (44) |
/// | 96 | alternate path (44) |
/// | 140 | private data (92) |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Req<'a> {
    /// Sender's communication ID.
    pub local_comm_id: u32,
    /// Service ID ([`tcp_service_id`] for rdma_cm TCP port space).
    pub service_id: u64,
    /// Sender's CA GUID.
    pub local_ca_guid: u64,
    /// Q_Key (0 for RC).
    pub local_qkey: u32,
    /// Sender's QPN (24 bits).
    pub local_qpn: u32,
    /// RDMA Reads/atomics the sender accepts as responder.
    pub responder_resources: u8,
    /// Local EECN (24 bits, RD only).
    pub local_eecn: u32,
    /// RDMA Reads/atomics the sender issues as initiator.
    pub initiator_depth: u8,
    /// Remote EECN (24 bits).
    pub remote_eecn: u32,
    /// Remote CM response timeout (5 bits, 4.096 us * 2^t).
    pub remote_cm_response_timeout: u8,
    /// Transport service type (2 bits; 0 = RC).
    pub transport_type: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// The first PSN the REQ's sender expects to receive: the REP's sender
    /// sends from it (Linux cm.c loads it into the active side's `rq_psn`
    /// and the passive side's `sq_psn`; docs/ROCE.md "The Starting PSN").
    pub starting_psn: Psn,
    /// Local CM response timeout (5 bits).
    pub local_cm_response_timeout: u8,
    /// Transport retry count (3 bits).
    pub retry_count: u8,
    /// Partition key.
    pub pkey: u16,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// RDC exists.
    pub rdc_exists: bool,
    /// RNR retry count (3 bits; 7 = infinite).
    pub rnr_retry_count: u8,
    /// Max CM retries (4 bits).
    pub max_cm_retries: u8,
    /// The sender uses an SRQ.
    pub srq: bool,
    /// Extended transport type (3 bits).
    pub extended_transport: u8,
    /// Primary path.
    pub primary_path: CmPath,
    /// Alternate path (all zero when absent).
    pub alternate_path: CmPath,
    /// Private data (at most 92 bytes; rdma_cm header first).
    pub private_data: &'a [u8],
}

/// ConnectReply (IBTA Table 110). Offsets from MAD byte 24:
///
/// | off | field |
/// |---|---|
/// | 0 | local comm ID (4) |
/// | 4 | remote comm ID (4) |
/// | 8 | local Q_Key (4) |
/// | 12 | local QPN (3), ECE (1, ignored) |
/// | 16 | local EECN (3), ECE (1, ignored) |
/// | 20 | starting PSN (3), ECE (1, ignored) |
/// | 24 | responder resources |
/// | 25 | initiator depth |
/// | 26 | target ACK delay `[7:3]`, failover accepted `[2:1]`, end-to-end flow control `[0]` |
/// | 27 | RNR retry count `[7:5]`, SRQ `[4]` |
/// | 28 | local CA GUID (8) |
/// | 36 | private data (196) |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rep<'a> {
    /// Sender's communication ID.
    pub local_comm_id: u32,
    /// The REQ sender's communication ID.
    pub remote_comm_id: u32,
    /// Q_Key.
    pub local_qkey: u32,
    /// Sender's QPN (24 bits).
    pub local_qpn: u32,
    /// Local EECN (24 bits).
    pub local_eecn: u32,
    /// The first PSN the REP's sender expects to receive: the REQ's sender
    /// sends from it (Linux cm.c loads it into the active side's `sq_psn`;
    /// docs/ROCE.md "The Starting PSN").
    pub starting_psn: Psn,
    /// Responder resources.
    pub responder_resources: u8,
    /// Initiator depth (must be >= 1 for Linux to grant remote read).
    pub initiator_depth: u8,
    /// Target ACK delay (5 bits).
    pub target_ack_delay: u8,
    /// Failover accepted (2 bits).
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// The sender uses an SRQ.
    pub srq: bool,
    /// Sender's CA GUID.
    pub local_ca_guid: u64,
    /// Private data (at most 196 bytes).
    pub private_data: &'a [u8],
}

/// ConnectReject (IBTA Table 108). Offsets from MAD byte 24:
///
/// | off | field |
/// |---|---|
/// | 0 | local comm ID (4) |
/// | 4 | remote comm ID (4) |
/// | 8 | message rejected `[7:6]` (0 REQ, 1 REP, 2 other) |
/// | 9 | reject info length `[7:1]` |
/// | 10 | reason (2) |
/// | 12 | additional reject information (72) |
/// | 84 | private data (148) |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rej<'a> {
    /// Sender's communication ID.
    pub local_comm_id: u32,
    /// The rejected side's communication ID.
    pub remote_comm_id: u32,
    /// Which message is rejected (2 bits).
    pub message_rejected: u8,
    /// Bytes of `ari` that are meaningful (7 bits, at most 72).
    pub reject_info_len: u8,
    /// Reason ([`rej_reason`]).
    pub reason: u16,
    /// Additional reject information (72 bytes, as sent).
    pub ari: [u8; 72],
    /// Private data (at most 148 bytes).
    pub private_data: &'a [u8],
}

/// MessageReceiptAcknowledgement (IBTA Table 107). Offsets from MAD byte 24:
///
/// | off | field |
/// |---|---|
/// | 0 | local comm ID (4) |
/// | 4 | remote comm ID (4) |
/// | 8 | message MRAed `[7:6]` (0 REQ, 1 REP, 2 LAP) |
/// | 9 | service timeout `[7:3]` |
/// | 10 | private data (222) |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Mra<'a> {
    /// Sender's communication ID.
    pub local_comm_id: u32,
    /// Peer's communication ID.
    pub remote_comm_id: u32,
    /// Which message is acknowledged (2 bits).
    pub message_mraed: u8,
    /// Service timeout (5 bits).
    pub service_timeout: u8,
    /// Private data (at most 222 bytes).
    pub private_data: &'a [u8],
}

/// Messages with two communication IDs and private data only: RTU (IBTA
/// Table 111, private data 224 at offset 8) and DREP (Table 113, the same
/// layout). DREQ (Table 112) adds the remote QPN at offset 8 (3 bytes, 1
/// reserved) and has private data 220 at offset 12.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CommIds<'a> {
    /// Sender's communication ID.
    pub local_comm_id: u32,
    /// Peer's communication ID.
    pub remote_comm_id: u32,
    /// Private data.
    pub private_data: &'a [u8],
}

/// DisconnectRequest (IBTA Table 112).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Dreq<'a> {
    /// Sender's communication ID.
    pub local_comm_id: u32,
    /// Peer's communication ID.
    pub remote_comm_id: u32,
    /// The receiver's QPN (Linux ignores a DREQ naming another QP).
    pub remote_qpn: u32,
    /// Private data (at most 220 bytes).
    pub private_data: &'a [u8],
}

/// One CM message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmMessage<'a> {
    /// Connection request.
    Req(Req<'a>),
    /// Connection reply.
    Rep(Rep<'a>),
    /// Ready to use.
    Rtu(CommIds<'a>),
    /// Connection reject.
    Rej(Rej<'a>),
    /// Disconnect request.
    Dreq(Dreq<'a>),
    /// Disconnect reply.
    Drep(CommIds<'a>),
    /// Message receipt acknowledgement.
    Mra(Mra<'a>),
}

impl CmMessage<'_> {
    /// The attribute ID of this message.
    pub const fn attr_id(&self) -> u16 {
        match self {
            CmMessage::Req(_) => attr::REQ,
            CmMessage::Rep(_) => attr::REP,
            CmMessage::Rtu(_) => attr::RTU,
            CmMessage::Rej(_) => attr::REJ,
            CmMessage::Dreq(_) => attr::DREQ,
            CmMessage::Drep(_) => attr::DREP,
            CmMessage::Mra(_) => attr::MRA,
        }
    }

    /// The private data area.
    pub const fn private_data(&self) -> &[u8] {
        match self {
            CmMessage::Req(m) => m.private_data,
            CmMessage::Rep(m) => m.private_data,
            CmMessage::Rtu(m) | CmMessage::Drep(m) => m.private_data,
            CmMessage::Rej(m) => m.private_data,
            CmMessage::Dreq(m) => m.private_data,
            CmMessage::Mra(m) => m.private_data,
        }
    }
}

/// A whole CM MAD: header values that vary plus the message. The fixed
/// header fields (version, class, class version, method Send, attribute ID)
/// are implied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmMad<'a> {
    /// Status word (0 in every message Linux sends).
    pub status: u16,
    /// Transaction ID.
    pub tid: u64,
    /// Attribute modifier (ECE; normally 0).
    pub attr_mod: u32,
    /// The message.
    pub message: CmMessage<'a>,
}

impl<'a> CmMad<'a> {
    /// A MAD with status 0 and attribute modifier 0.
    pub const fn new(tid: u64, message: CmMessage<'a>) -> CmMad<'a> {
        CmMad {
            status: 0,
            tid,
            attr_mod: 0,
            message,
        }
    }

    /// Parses a 256-byte CM MAD (the payload of a QP1 UD Send).
    ///
    /// # Errors
    /// * [`Error::Truncated`] / [`Error::TrailingBytes`]: not 256 bytes.
    /// * [`Error::UnknownValue`]: base version, class or class version
    ///   other than 1/0x07/2; an attribute this codec does not know
    ///   (ClassPortInfo, SIDR, LAP/APR); a REQ path MTU code outside 1..=5.
    /// * [`Error::Malformed`]: a method other than Send; a REJ whose
    ///   reject info length exceeds the 72-byte ARI field.
    pub fn parse(data: &'a [u8]) -> Result<CmMad<'a>> {
        let h = MadHeader::parse(data)?;
        if data.len() < MAD_LEN {
            return Err(Error::Truncated);
        }
        if data.len() > MAD_LEN {
            return Err(Error::TrailingBytes);
        }
        if h.base_version != BASE_VERSION
            || h.mgmt_class != MGMT_CLASS_CM
            || h.class_version != CM_CLASS_VERSION
        {
            return Err(Error::UnknownValue);
        }
        if h.method != METHOD_SEND {
            return Err(Error::Malformed);
        }
        let d = &data[MAD_HEADER_LEN..];
        let ids = |pd_at: usize| CommIds {
            local_comm_id: be32(d, 0),
            remote_comm_id: be32(d, 4),
            private_data: &d[pd_at..],
        };
        let message = match h.attr_id {
            attr::REQ => CmMessage::Req(Req {
                local_comm_id: be32(d, 0),
                service_id: be64(d, 8),
                local_ca_guid: be64(d, 16),
                local_qkey: be32(d, 28),
                local_qpn: be24(d, 32),
                responder_resources: d[35],
                local_eecn: be24(d, 36),
                initiator_depth: d[39],
                remote_eecn: be24(d, 40),
                remote_cm_response_timeout: d[43] >> 3,
                transport_type: (d[43] >> 1) & 3,
                end_to_end_flow_control: d[43] & 1 != 0,
                starting_psn: Psn::from_masked(be24(d, 44)),
                local_cm_response_timeout: d[47] >> 3,
                retry_count: d[47] & 7,
                pkey: be16(d, 48),
                path_mtu: Mtu::from_ib(d[50] >> 4).ok_or(Error::UnknownValue)?,
                rdc_exists: d[50] & 0x08 != 0,
                rnr_retry_count: d[50] & 7,
                max_cm_retries: d[51] >> 4,
                srq: d[51] & 0x08 != 0,
                extended_transport: d[51] & 7,
                primary_path: CmPath::read(&d[52..52 + PATH_LEN]),
                alternate_path: CmPath::read(&d[96..96 + PATH_LEN]),
                private_data: &d[140..],
            }),
            attr::REP => CmMessage::Rep(Rep {
                local_comm_id: be32(d, 0),
                remote_comm_id: be32(d, 4),
                local_qkey: be32(d, 8),
                local_qpn: be24(d, 12),
                local_eecn: be24(d, 16),
                starting_psn: Psn::from_masked(be24(d, 20)),
                responder_resources: d[24],
                initiator_depth: d[25],
                target_ack_delay: d[26] >> 3,
                failover_accepted: (d[26] >> 1) & 3,
                end_to_end_flow_control: d[26] & 1 != 0,
                rnr_retry_count: d[27] >> 5,
                srq: d[27] & 0x10 != 0,
                local_ca_guid: be64(d, 28),
                private_data: &d[36..],
            }),
            attr::RTU => CmMessage::Rtu(ids(8)),
            attr::DREP => CmMessage::Drep(ids(8)),
            attr::DREQ => CmMessage::Dreq(Dreq {
                local_comm_id: be32(d, 0),
                remote_comm_id: be32(d, 4),
                remote_qpn: be24(d, 8),
                private_data: &d[12..],
            }),
            attr::REJ => {
                if d[9] >> 1 > 72 {
                    return Err(Error::Malformed);
                }
                let mut ari = [0u8; 72];
                ari.copy_from_slice(&d[12..84]);
                CmMessage::Rej(Rej {
                    local_comm_id: be32(d, 0),
                    remote_comm_id: be32(d, 4),
                    message_rejected: d[8] >> 6,
                    reject_info_len: d[9] >> 1,
                    reason: be16(d, 10),
                    ari,
                    private_data: &d[84..],
                })
            }
            attr::MRA => CmMessage::Mra(Mra {
                local_comm_id: be32(d, 0),
                remote_comm_id: be32(d, 4),
                message_mraed: d[8] >> 6,
                service_timeout: d[9] >> 3,
                private_data: &d[10..],
            }),
            _ => return Err(Error::UnknownValue),
        };
        Ok(CmMad {
            status: h.status,
            tid: h.tid,
            attr_mod: h.attr_mod,
            message,
        })
    }

    /// Always [`MAD_LEN`].
    pub const fn buffer_len(&self) -> usize {
        MAD_LEN
    }

    /// The header `emit` writes.
    pub const fn header(&self) -> MadHeader {
        let mut h = MadHeader::cm(self.message.attr_id(), self.tid);
        h.status = self.status;
        h.attr_mod = self.attr_mod;
        h
    }

    /// Writes the 256-byte MAD at the start of `buf`; returns 256.
    ///
    /// # Errors
    /// [`Error::Malformed`] when a field exceeds its bit width (24-bit QPN,
    /// EECN; 5-bit timeouts; 3-bit retry counts; 4-bit max CM retries;
    /// 2-bit type fields; 20-bit flow label; 6-bit rate; 4-bit SL; 7-bit
    /// reject info length or more than 72); [`Error::LimitExceeded`] when
    /// the private data exceeds its area; [`Error::BufferTooShort`] when
    /// `buf` is shorter than 256 bytes. Nothing is written on error.
    //
    // mad = header(24) cm_message(232, zero-padded private data)
    //                                   -- IBTA Vol. 1 ch. 13, Tables 106-113
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        let mut mad = [0u8; MAD_LEN];
        self.header().emit(&mut mad)?;
        let d = &mut mad[MAD_HEADER_LEN..];
        match &self.message {
            CmMessage::Req(m) => emit_req(m, d)?,
            CmMessage::Rep(m) => {
                width(m.local_qpn, 24)?;
                width(m.local_eecn, 24)?;
                width(u32::from(m.target_ack_delay), 5)?;
                width(u32::from(m.failover_accepted), 2)?;
                width(u32::from(m.rnr_retry_count), 3)?;
                put(d, 0, &m.local_comm_id.to_be_bytes());
                put(d, 4, &m.remote_comm_id.to_be_bytes());
                put(d, 8, &m.local_qkey.to_be_bytes());
                put24(d, 12, m.local_qpn);
                put24(d, 16, m.local_eecn);
                put24(d, 20, m.starting_psn.value());
                d[24] = m.responder_resources;
                d[25] = m.initiator_depth;
                d[26] = (m.target_ack_delay << 3)
                    | (m.failover_accepted << 1)
                    | u8::from(m.end_to_end_flow_control);
                d[27] = (m.rnr_retry_count << 5) | (u8::from(m.srq) << 4);
                put(d, 28, &m.local_ca_guid.to_be_bytes());
                private(d, 36, private_len::REP, m.private_data)?;
            }
            CmMessage::Rtu(m) | CmMessage::Drep(m) => {
                put(d, 0, &m.local_comm_id.to_be_bytes());
                put(d, 4, &m.remote_comm_id.to_be_bytes());
                private(d, 8, private_len::RTU, m.private_data)?;
            }
            CmMessage::Dreq(m) => {
                width(m.remote_qpn, 24)?;
                put(d, 0, &m.local_comm_id.to_be_bytes());
                put(d, 4, &m.remote_comm_id.to_be_bytes());
                put24(d, 8, m.remote_qpn);
                private(d, 12, private_len::DREQ, m.private_data)?;
            }
            CmMessage::Rej(m) => {
                width(u32::from(m.message_rejected), 2)?;
                if m.reject_info_len > 72 {
                    return Err(Error::Malformed);
                }
                put(d, 0, &m.local_comm_id.to_be_bytes());
                put(d, 4, &m.remote_comm_id.to_be_bytes());
                d[8] = m.message_rejected << 6;
                d[9] = m.reject_info_len << 1;
                put(d, 10, &m.reason.to_be_bytes());
                put(d, 12, &m.ari);
                private(d, 84, private_len::REJ, m.private_data)?;
            }
            CmMessage::Mra(m) => {
                width(u32::from(m.message_mraed), 2)?;
                width(u32::from(m.service_timeout), 5)?;
                put(d, 0, &m.local_comm_id.to_be_bytes());
                put(d, 4, &m.remote_comm_id.to_be_bytes());
                d[8] = m.message_mraed << 6;
                d[9] = m.service_timeout << 3;
                private(d, 10, private_len::MRA, m.private_data)?;
            }
        }
        buf.get_mut(..MAD_LEN)
            .ok_or(Error::BufferTooShort)?
            .copy_from_slice(&mad);
        Ok(MAD_LEN)
    }
}

fn emit_req(m: &Req<'_>, d: &mut [u8]) -> Result<()> {
    for (v, bits) in [
        (m.local_qpn, 24),
        (m.local_eecn, 24),
        (m.remote_eecn, 24),
        (u32::from(m.remote_cm_response_timeout), 5),
        (u32::from(m.transport_type), 2),
        (u32::from(m.local_cm_response_timeout), 5),
        (u32::from(m.retry_count), 3),
        (u32::from(m.rnr_retry_count), 3),
        (u32::from(m.max_cm_retries), 4),
        (u32::from(m.extended_transport), 3),
    ] {
        width(v, bits)?;
    }
    put(d, 0, &m.local_comm_id.to_be_bytes());
    put(d, 8, &m.service_id.to_be_bytes());
    put(d, 16, &m.local_ca_guid.to_be_bytes());
    put(d, 28, &m.local_qkey.to_be_bytes());
    put24(d, 32, m.local_qpn);
    d[35] = m.responder_resources;
    put24(d, 36, m.local_eecn);
    d[39] = m.initiator_depth;
    put24(d, 40, m.remote_eecn);
    d[43] = (m.remote_cm_response_timeout << 3)
        | (m.transport_type << 1)
        | u8::from(m.end_to_end_flow_control);
    put24(d, 44, m.starting_psn.value());
    d[47] = (m.local_cm_response_timeout << 3) | m.retry_count;
    put(d, 48, &m.pkey.to_be_bytes());
    d[50] = (m.path_mtu.to_ib() << 4) | (u8::from(m.rdc_exists) << 3) | m.rnr_retry_count;
    d[51] = (m.max_cm_retries << 4) | (u8::from(m.srq) << 3) | m.extended_transport;
    m.primary_path.write(&mut d[52..52 + PATH_LEN])?;
    m.alternate_path.write(&mut d[96..96 + PATH_LEN])?;
    private(d, 140, private_len::REQ, m.private_data)
}

// ---------------------------------------------------------------------------
// rdma_cm header

/// The header rdma_cm puts at the start of REQ private data (Linux
/// `struct cma_hdr`, 36 bytes):
///
/// | off | field |
/// |---|---|
/// | 0 | cma version (0x00) |
/// | 1 | IP version `[7:4]` (4 or 6) |
/// | 2 | port (2): the active side's source port |
/// | 4 | source address (16; IPv4: 12 zero bytes then the address) |
/// | 20 | destination address (16) |
///
/// The consumer's private data (56 bytes in a REQ) follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RdmaCmHeader {
    /// Active side's source port.
    pub src_port: u16,
    /// Active side's address.
    pub src: IpAddr,
    /// Passive side's address.
    pub dst: IpAddr,
}

impl RdmaCmHeader {
    /// Decodes the header at the start of REQ private data and returns the
    /// consumer data after it.
    ///
    /// # Errors
    /// [`Error::Truncated`] below 36 bytes; [`Error::UnknownValue`] for a
    /// cma version other than 0 or an IP version other than 4 or 6.
    pub fn parse(pd: &[u8]) -> Result<(RdmaCmHeader, &[u8])> {
        let b = pd.get(..RDMA_CM_HEADER_LEN).ok_or(Error::Truncated)?;
        if b[0] != 0 {
            return Err(Error::UnknownValue);
        }
        let addr = |at: usize| -> Result<IpAddr> {
            match b[1] >> 4 {
                4 => Ok(IpAddr::V4(Ipv4Addr::new(
                    b[at + 12],
                    b[at + 13],
                    b[at + 14],
                    b[at + 15],
                ))),
                6 => Ok(IpAddr::V6(Ipv6Addr::from(gid(b, at)))),
                _ => Err(Error::UnknownValue),
            }
        };
        Ok((
            RdmaCmHeader {
                src_port: be16(b, 2),
                src: addr(4)?,
                dst: addr(20)?,
            },
            &pd[RDMA_CM_HEADER_LEN..],
        ))
    }

    /// Always [`RDMA_CM_HEADER_LEN`].
    pub const fn buffer_len(&self) -> usize {
        RDMA_CM_HEADER_LEN
    }

    /// Writes the 36 bytes; returns 36.
    ///
    /// # Errors
    /// [`Error::Malformed`] when source and destination are of different
    /// IP versions; [`Error::BufferTooShort`] below 36 bytes.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        let mut h = [0u8; RDMA_CM_HEADER_LEN];
        let version = match (self.src, self.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                put(&mut h, 16, &s.octets());
                put(&mut h, 32, &d.octets());
                4
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                put(&mut h, 4, &s.octets());
                put(&mut h, 20, &d.octets());
                6
            }
            _ => return Err(Error::Malformed),
        };
        h[1] = version << 4;
        put(&mut h, 2, &self.src_port.to_be_bytes());
        buf.get_mut(..RDMA_CM_HEADER_LEN)
            .ok_or(Error::BufferTooShort)?
            .copy_from_slice(&h);
        Ok(RDMA_CM_HEADER_LEN)
    }
}

// ---------------------------------------------------------------------------
// Fuzzing entry point

/// Runs the MAD, CM and rdma_cm header parsers over `data` (and over a UD
/// packet's payload if `data` is one); whatever parses re-emits and parses
/// back equal.
///
/// # Panics
/// Only when a codec invariant is broken.
pub fn fuzz_parse(data: &[u8]) {
    let mad_bytes = match RocePacket::parse(data) {
        Ok(p) if p.bth.opcode == Opcode::UdSendOnly => p.payload,
        _ => data,
    };
    if let Ok(mad) = CmMad::parse(mad_bytes) {
        let mut buf = [0u8; MAD_LEN];
        assert_eq!(mad.emit(&mut buf), Ok(MAD_LEN));
        let again = CmMad::parse(&buf).expect("re-parse MAD");
        assert_eq!(again, mad);
        if let CmMessage::Req(req) = mad.message {
            if let Ok((h, user)) = RdmaCmHeader::parse(req.private_data) {
                let mut hb = [0u8; RDMA_CM_HEADER_LEN];
                // An IPv4 header re-emits with zero pad bytes; compare Reprs.
                assert_eq!(h.emit(&mut hb), Ok(RDMA_CM_HEADER_LEN));
                assert_eq!(RdmaCmHeader::parse(&hb).map(|x| x.0), Ok(h));
                let _ = super::rpcrdma::PrivateData::parse(user);
            }
        }
    }
    if let Ok(h) = MadHeader::parse(data) {
        let mut hb = [0u8; MAD_HEADER_LEN];
        assert_eq!(h.emit(&mut hb), Ok(MAD_HEADER_LEN));
        assert_eq!(MadHeader::parse(&hb), Ok(h));
    }
    if let Ok((h, _)) = RdmaCmHeader::parse(data) {
        let mut hb = [0u8; RDMA_CM_HEADER_LEN];
        assert_eq!(h.emit(&mut hb), Ok(RDMA_CM_HEADER_LEN));
        assert_eq!(RdmaCmHeader::parse(&hb).map(|x| x.0), Ok(h));
    }
}

#[cfg(test)]
mod tests;
