//! CONF_RDMA version 2: our extension negotiation, built on
//! the CONF_RDMA program of RFC 5666 s6 and the transport property model
//! that draft-dnoveck-rpcrdma-rtrext-02 s8 extends.
//!
//! Program 100417, version 2, procedure 1 takes the three words of the
//! Version 1 `config_rdma_req` followed by the requester's transport
//! property list, and returns the three words of `config_rdma_reply`
//! followed by the responder's property list. Both lists advertise what
//! their sender supports; neither is an answer to the other. The exact
//! bytes are in `docs/EXTENSIONS.md`.
//!
//! # Negotiation rule
//! An extension is on only when both sides advertised it:
//! [`negotiate`]`(ours, theirs)` is the intersection. A responder that
//! answers version 2 with PROG_MISMATCH (or PROG_UNAVAIL) is a plain
//! Version One peer: the requester falls back to CONF_RDMA version 1 and
//! uses [`Extensions::EMPTY`], so such a peer never receives an extension.
//!
//! # What advertises each extension
//! | extension | advertised by |
//! |---|---|
//! | responder-provided read chunks (Lever draft s4) | our flag property, bit [`ext_flag::RESPONDER_READ_CHUNKS`] |
//! | remote invalidation (Send With Invalidate, Lever draft s4.1.4) | our flag property, bit [`ext_flag::REMOTE_INVALIDATE`] |
//! | message continuation (rtrext s4) | RTR Support property (rtrext s8.2) with Transmit Request, Transmit Response and Transmit Continue |
//! | send-based data placement (rtrext s3.3) | our flag property, bit [`ext_flag::SEND_PLACEMENT`], and RTR Support with Transmit Request and Transmit Response |
//!
//! Our flag property has id [`prop_id::EXTENSION_FLAGS`]; unknown bits
//! are ignored by [`PropertyList::extensions`] and kept by the codec.
//!
//! # Panic contract
//! Nothing here panics, except [`fuzz_parse`], whose job is to panic
//! when a codec invariant breaks; decoders and encoders return [`Error`]
//! values.

use super::conf::{ConfigRdmaReply, ConfigRdmaReq};
use super::rpc::AcceptStatus;
use super::rtrext::{prop_id, Limits, Property, PropertyList, RtrSupport};
use super::xdr::{Decoder, Encoder};
use super::{Error, Result};

// The set itself lives in `extensions`, below both this module and
// `rtrext` (whose headers are checked against it), so that neither of the
// two has to import the other's items in both directions.
pub use super::extensions::Extensions;

/// Version 2 of the CONF_RDMA program (ours; program number and
/// procedure numbers as in RFC 5666 s6.2, see `conf::CONFIG_RDMA_PROG`).
pub const CONFIG_RDMA_VERS2: u32 = 2;

/// Bits of our extension flag property (id [`prop_id::EXTENSION_FLAGS`]).
pub mod ext_flag {
    /// The sender handles responder-provided read chunks in replies and
    /// the RDMA_DONE pull-completion notification (Lever draft s4.1).
    pub const RESPONDER_READ_CHUNKS: u32 = 0x1;
    /// The sender accepts Send With Invalidate for the memory it exposes
    /// (Lever draft s4.1.4).
    pub const REMOTE_INVALIDATE: u32 = 0x2;
    /// The sender sends and receives send-based data placement (rtrext
    /// s3.3, s5.3); it also advertises RTR Support.
    pub const SEND_PLACEMENT: u32 = 0x4;
}

/// The negotiation rule: an extension is on only when both
/// peers advertised it. For a peer that answered PROG_MISMATCH to
/// version 2, pass [`Extensions::EMPTY`] as `theirs`.
pub const fn negotiate(ours: Extensions, theirs: Extensions) -> Extensions {
    ours.intersection(theirs)
}

/// True when the answer to our version 2 call means "plain Version One":
/// PROG_MISMATCH (the peer serves another range of CONF_RDMA versions; it
/// would not have refused version 2 otherwise), or PROG_UNAVAIL /
/// PROC_UNAVAIL (no CONF_RDMA at all). Such a peer gets
/// [`Extensions::EMPTY`]: pass that to [`negotiate`]. Other statuses are
/// failures of the call itself, for the caller to handle.
pub const fn is_plain_version_one(status: AcceptStatus) -> bool {
    matches!(
        status,
        AcceptStatus::ProgMismatch { .. } | AcceptStatus::ProgUnavail | AcceptStatus::ProcUnavail
    )
}

impl PropertyList {
    /// The extensions this list advertises (see the module documentation's
    /// table). A flag whose prerequisite is missing (send placement
    /// without RTR Support) does not count.
    pub fn extensions(&self) -> Extensions {
        let flags = match self.get(prop_id::EXTENSION_FLAGS) {
            Some(Property::ExtensionFlags(w)) => w,
            _ => 0,
        };
        let rtr = self.rtr_support();
        let ops = RtrSupport::TRANSMIT_REQUEST.union(RtrSupport::TRANSMIT_RESPONSE);
        let mut ext = Extensions::EMPTY;
        if flags & ext_flag::RESPONDER_READ_CHUNKS != 0 {
            ext = ext.union(Extensions::RESPONDER_READ_CHUNKS);
        }
        if flags & ext_flag::REMOTE_INVALIDATE != 0 {
            ext = ext.union(Extensions::REMOTE_INVALIDATE);
        }
        if rtr.contains(ops.union(RtrSupport::TRANSMIT_CONTINUE)) {
            ext = ext.union(Extensions::MESSAGE_CONTINUATION);
        }
        if flags & ext_flag::SEND_PLACEMENT != 0 && rtr.contains(ops) {
            ext = ext.union(Extensions::SEND_PLACEMENT);
        }
        ext
    }

    /// Appends the properties that advertise `ext`: our flag property
    /// (always, so a version 2 peer sees an explicit "none"), and RTR
    /// Support when message continuation or send placement is in `ext`.
    /// Other properties (limits, buffer structure) are the caller's.
    ///
    /// # Errors
    /// As [`PropertyList::push`].
    pub fn push_extensions(&mut self, ext: Extensions) -> Result<()> {
        let mut flags = 0;
        if ext.contains(Extensions::RESPONDER_READ_CHUNKS) {
            flags |= ext_flag::RESPONDER_READ_CHUNKS;
        }
        if ext.contains(Extensions::REMOTE_INVALIDATE) {
            flags |= ext_flag::REMOTE_INVALIDATE;
        }
        if ext.contains(Extensions::SEND_PLACEMENT) {
            flags |= ext_flag::SEND_PLACEMENT;
        }
        if ext.intersects(Extensions::MESSAGE_CONTINUATION.union(Extensions::SEND_PLACEMENT)) {
            let mut rtr = RtrSupport::TRANSMIT_REQUEST.union(RtrSupport::TRANSMIT_RESPONSE);
            if ext.contains(Extensions::MESSAGE_CONTINUATION) {
                rtr = rtr.union(RtrSupport::TRANSMIT_CONTINUE);
            }
            self.push(Property::RtrSupport(rtr))?;
        }
        self.push(Property::ExtensionFlags(flags))
    }
}

/// The CONF_RDMA version 2 argument: the Version 1 request words, then the
/// requester's transport properties.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConfigRdmaReqV2 {
    /// The RFC 5666 s6.2 fields, unchanged.
    pub base: ConfigRdmaReq,
    /// What the requester advertises.
    pub properties: PropertyList,
}

/// The CONF_RDMA version 2 result: the Version 1 reply words, then the
/// responder's transport properties.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConfigRdmaReplyV2 {
    /// The RFC 5666 s6.2 fields, unchanged.
    pub base: ConfigRdmaReply,
    /// What the responder advertises.
    pub properties: PropertyList,
}

/// Runs `decode_into` over all of `bytes`.
fn parse_all(bytes: &[u8], f: impl FnOnce(&mut Decoder<'_>) -> Result<()>) -> Result<()> {
    let mut dec = Decoder::new(bytes);
    f(&mut dec)?;
    dec.finish()
}

macro_rules! v2_body {
    ($ty:ident, $base:ident, $grammar:literal) => {
        impl $ty {
            /// With an empty property list sized for `limits`, so that
            /// decoding within them never allocates.
            pub fn with_capacity(limits: &Limits) -> Self {
                $ty {
                    base: $base::default(),
                    properties: PropertyList::with_capacity(limits),
                }
            }

            /// Decodes the body at the decoder's position into `self`,
            /// reusing its storage.
            ///
            /// # Errors
            /// [`Error::Truncated`], or those of
            /// [`PropertyList::decode_into`].
            pub fn decode_into(&mut self, dec: &mut Decoder<'_>, limits: &Limits) -> Result<()> {
                self.base = $base::decode(dec)?;
                self.properties.decode_into(dec, limits)
            }

            /// Decodes a body that is all of `bytes` into `self`.
            ///
            /// # Errors
            /// As [`Self::decode_into`], plus [`Error::TrailingBytes`].
            pub fn parse_into(&mut self, bytes: &[u8], limits: &Limits) -> Result<()> {
                parse_all(bytes, |dec| self.decode_into(dec, limits))
            }

            /// Decodes a body that is all of `bytes`.
            ///
            /// # Errors
            /// As [`Self::parse_into`].
            pub fn parse(bytes: &[u8], limits: &Limits) -> Result<Self> {
                let mut body = $ty::default();
                body.parse_into(bytes, limits)?;
                Ok(body)
            }

            /// Exact number of bytes [`Self::emit`] writes.
            pub fn buffer_len(&self) -> usize {
                self.base.buffer_len() + self.properties.buffer_len()
            }

            /// Appends the body to `enc`.
            ///
            /// # Errors
            /// Those of [`PropertyList::encode`], then
            /// [`Error::BufferTooShort`]; nothing is written on error.
            #[doc = concat!("\n\nGrammar: `", $grammar, "` (ours; RFC 5666 s6.2 for the words).")]
            pub fn encode(&self, enc: &mut Encoder<'_>) -> Result<()> {
                // Validate and size-check before the first word, so that
                // nothing is written on error.
                self.properties.check_emit()?;
                if enc.remaining() < self.buffer_len() {
                    return Err(Error::BufferTooShort);
                }
                self.base.encode(enc)?;
                self.properties.encode(enc)
            }

            /// Writes the body at the start of `buf`; returns its length.
            ///
            /// # Errors
            /// As [`Self::encode`].
            pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
                let mut enc = Encoder::new(buf);
                self.encode(&mut enc)?;
                Ok(enc.position())
            }
        }
    };
}

v2_body!(
    ConfigRdmaReqV2,
    ConfigRdmaReq,
    "config_rdma_req_v2 = maxcall_sendsize maxreply_sendsize maxrdmaread proplist"
);
v2_body!(
    ConfigRdmaReplyV2,
    ConfigRdmaReply,
    "config_rdma_reply_v2 = maxcall_sendsize align maxrdmaread proplist"
);

// ---------------------------------------------------------------------------
// Fuzzing entry point

/// Runs every parser of [`super::rtrext`] ([`super::rtrext::fuzz_parse`])
/// and of this module over `data` and checks their invariants: whatever
/// parses re-emits into exactly `buffer_len()` bytes that parse back
/// equal. For the `rtrext` cargo-fuzz target and its corpus replay; it
/// lives here, not in `rtrext`, because this module is the one that may
/// call both.
///
/// # Panics
/// Only when a codec invariant is broken (that is what it is for).
pub fn fuzz_parse(data: &[u8]) {
    super::rtrext::fuzz_parse(data);
    let limits = Limits::DEFAULT;
    if let Ok(req) = ConfigRdmaReqV2::parse(data, &limits) {
        let mut buf = vec![0u8; req.buffer_len()];
        assert_eq!(req.emit(&mut buf), Ok(buf.len()));
        assert_eq!(ConfigRdmaReqV2::parse(&buf, &limits).as_ref(), Ok(&req));
        let _ = req.properties.extensions();
    }
    if let Ok(rep) = ConfigRdmaReplyV2::parse(data, &limits) {
        let mut buf = vec![0u8; rep.buffer_len()];
        assert_eq!(rep.emit(&mut buf), Ok(buf.len()));
        assert_eq!(ConfigRdmaReplyV2::parse(&buf, &limits).as_ref(), Ok(&rep));
    }
}

#[cfg(test)]
mod tests {
    use super::super::conf::{CONFIG_RDMA_PROG, CONF_RDMA_PROC};
    use super::super::rpc::{CallHeader, ReplyBody, ReplyHeader};
    use super::super::rpcrdma::TransportHeader;
    use super::super::rtrext::{BufferGroup, BufferStructure};
    use super::*;

    const L: Limits = Limits::DEFAULT;

    // config_rdma_req_v2: 4 KiB inline both ways, 16 RDMA Reads, then a
    // property list advertising every extension.
    #[rustfmt::skip]
    pub(crate) const REQ_V2: [u8; 40] = [
        0x00, 0x00, 0x10, 0x00, // maxcall_sendsize  4096
        0x00, 0x00, 0x10, 0x00, // maxreply_sendsize 4096
        0x00, 0x00, 0x00, 0x10, // maxrdmaread       16
        0x00, 0x00, 0x00, 0x02, // 2 properties
        0x00, 0x00, 0x00, 0x03, // RTR Support (rtrext s8.2)
        0x00, 0x00, 0x00, 0x04, //   value length 4
        0x00, 0x00, 0x00, 0x07, //   XREQ | XRESP | XCONT
        0x80, 0x00, 0x00, 0x01, // extension flags (ours)
        0x00, 0x00, 0x00, 0x04, //   value length 4
        0x00, 0x00, 0x00, 0x07, //   RRC | RI | SEND_PLACEMENT
    ];

    // config_rdma_reply_v2: 8 KiB calls, align 4096, 8 RDMA Reads; the
    // responder advertises responder-provided read chunks and remote
    // invalidation only.
    #[rustfmt::skip]
    pub(crate) const REPLY_V2: [u8; 28] = [
        0x00, 0x00, 0x20, 0x00, // maxcall_sendsize 8192
        0x00, 0x00, 0x10, 0x00, // align            4096
        0x00, 0x00, 0x00, 0x08, // maxrdmaread      8
        0x00, 0x00, 0x00, 0x01, // 1 property
        0x80, 0x00, 0x00, 0x01, // extension flags (ours)
        0x00, 0x00, 0x00, 0x04, //   value length 4
        0x00, 0x00, 0x00, 0x03, //   RRC | RI
    ];

    fn req_repr() -> ConfigRdmaReqV2 {
        let mut properties = PropertyList::new();
        properties.push_extensions(Extensions::ALL).unwrap();
        ConfigRdmaReqV2 {
            base: ConfigRdmaReq {
                maxcall_sendsize: 4096,
                maxreply_sendsize: 4096,
                maxrdmaread: 16,
            },
            properties,
        }
    }

    fn reply_repr() -> ConfigRdmaReplyV2 {
        let mut properties = PropertyList::new();
        properties
            .push_extensions(Extensions::RESPONDER_READ_CHUNKS.union(Extensions::REMOTE_INVALIDATE))
            .unwrap();
        ConfigRdmaReplyV2 {
            base: ConfigRdmaReply {
                maxcall_sendsize: 8192,
                align: 4096,
                maxrdmaread: 8,
            },
            properties,
        }
    }

    #[test]
    fn constants() {
        assert_eq!(
            (CONFIG_RDMA_PROG, CONFIG_RDMA_VERS2, CONF_RDMA_PROC),
            (100417, 2, 1)
        );
        assert_eq!(prop_id::EXTENSION_FLAGS, 0x8000_0001);
        assert_eq!(Extensions::ALL.bits(), 0xf);
        assert_eq!(Extensions::from_bits_truncate(0xff), Extensions::ALL);
    }

    #[test]
    fn golden_req_v2() {
        let repr = req_repr();
        assert_eq!(ConfigRdmaReqV2::parse(&REQ_V2, &L).as_ref(), Ok(&repr));
        assert_eq!(repr.buffer_len(), REQ_V2.len());
        let mut buf = [0xAAu8; 40];
        assert_eq!(repr.emit(&mut buf), Ok(40));
        assert_eq!(buf, REQ_V2);
        let mut scratch = ConfigRdmaReqV2::with_capacity(&L);
        scratch.parse_into(&REQ_V2, &L).unwrap();
        assert_eq!(scratch, repr);
        assert_eq!(repr.properties.extensions(), Extensions::ALL);
        for cut in 0..REQ_V2.len() {
            assert!(ConfigRdmaReqV2::parse(&REQ_V2[..cut], &L).is_err(), "{cut}");
        }
        let mut long = REQ_V2.to_vec();
        long.extend_from_slice(&[0; 4]);
        assert_eq!(ConfigRdmaReqV2::parse(&long, &L), Err(Error::TrailingBytes));
        for short in [0, 12, 39] {
            let mut out = vec![0x55u8; short];
            assert_eq!(repr.emit(&mut out), Err(Error::BufferTooShort));
            assert!(out.iter().all(|&b| b == 0x55));
        }
        // The Version 1 body is the first 12 bytes, unchanged.
        assert_eq!(ConfigRdmaReq::parse(&REQ_V2[..12]), Ok(repr.base));
        fuzz_parse(&REQ_V2);
    }

    #[test]
    fn golden_reply_v2_and_negotiation() {
        let repr = reply_repr();
        assert_eq!(ConfigRdmaReplyV2::parse(&REPLY_V2, &L).as_ref(), Ok(&repr));
        assert_eq!(repr.buffer_len(), REPLY_V2.len());
        let mut buf = [0u8; 28];
        let mut enc = Encoder::new(&mut buf);
        assert_eq!(repr.encode(&mut enc), Ok(()));
        assert_eq!(buf, REPLY_V2);
        for cut in 0..REPLY_V2.len() {
            assert!(
                ConfigRdmaReplyV2::parse(&REPLY_V2[..cut], &L).is_err(),
                "{cut}"
            );
        }
        let ours = req_repr().properties.extensions();
        let theirs = repr.properties.extensions();
        let on = negotiate(ours, theirs);
        assert_eq!(
            on,
            Extensions::RESPONDER_READ_CHUNKS.union(Extensions::REMOTE_INVALIDATE)
        );
        // Both sides compute the same answer.
        assert_eq!(negotiate(theirs, ours), on);
        fuzz_parse(&REPLY_V2);
    }

    /// The full exchange as `docs/EXTENSIONS.md` shows it: ONC RPC call
    /// header (RFC 5531 s9) plus the version 2 argument, and the reply.
    #[test]
    fn documented_exchange_parses() {
        #[rustfmt::skip]
        let call_header: [u8; 40] = [
            0x00, 0x00, 0x0c, 0x01, // xid
            0x00, 0x00, 0x00, 0x00, // CALL
            0x00, 0x00, 0x00, 0x02, // rpcvers 2
            0x00, 0x01, 0x88, 0x41, // prog 100417
            0x00, 0x00, 0x00, 0x02, // vers 2
            0x00, 0x00, 0x00, 0x01, // proc 1 (CONF_RDMA)
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // cred AUTH_NONE
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // verf AUTH_NONE
        ];
        let mut call = call_header.to_vec();
        call.extend_from_slice(&REQ_V2);
        // As one Send: the RDMA_MSG header (credits 32, no chunks) first.
        let mut send = Vec::new();
        for w in [0xc01u32, 1, 32, 0, 0, 0, 0] {
            send.extend_from_slice(&w.to_be_bytes());
        }
        send.extend_from_slice(&call);
        assert_eq!(send.len(), 108);
        let (t, tlen) = TransportHeader::parse(&send, &Default::default()).unwrap();
        assert_eq!(t.check_rpc_xid(&send, tlen), Ok(()));
        assert_eq!(&send[tlen..], &call[..]);
        let (h, len) = CallHeader::parse(&call).unwrap();
        assert_eq!((h.program, h.version, h.procedure), (100417, 2, 1));
        assert_eq!(ConfigRdmaReqV2::parse(&call[len..], &L), Ok(req_repr()));

        #[rustfmt::skip]
        let reply_header: [u8; 24] = [
            0x00, 0x00, 0x0c, 0x01, // xid
            0x00, 0x00, 0x00, 0x01, // REPLY
            0x00, 0x00, 0x00, 0x00, // MSG_ACCEPTED
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // verf AUTH_NONE
            0x00, 0x00, 0x00, 0x00, // SUCCESS
        ];
        let mut reply = reply_header.to_vec();
        reply.extend_from_slice(&REPLY_V2);
        let (r, len) = ReplyHeader::parse(&reply).unwrap();
        assert!(r.is_success());
        assert_eq!(
            ConfigRdmaReplyV2::parse(&reply[len..], &L),
            Ok(reply_repr())
        );

        // A Version One responder: PROG_MISMATCH low 1 high 1.
        #[rustfmt::skip]
        let mismatch: [u8; 32] = [
            0x00, 0x00, 0x0c, 0x01, // xid
            0x00, 0x00, 0x00, 0x01, // REPLY
            0x00, 0x00, 0x00, 0x00, // MSG_ACCEPTED
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // verf AUTH_NONE
            0x00, 0x00, 0x00, 0x02, // PROG_MISMATCH
            0x00, 0x00, 0x00, 0x01, // low 1
            0x00, 0x00, 0x00, 0x01, // high 1
        ];
        let (r, _) = ReplyHeader::parse(&mismatch).unwrap();
        let ReplyBody::Accepted(a) = r.body else {
            panic!("{r:?}")
        };
        assert!(is_plain_version_one(a.status));
        assert_eq!(
            negotiate(Extensions::ALL, Extensions::EMPTY),
            Extensions::EMPTY
        );
        assert!(!is_plain_version_one(AcceptStatus::Success));
        assert!(!is_plain_version_one(AcceptStatus::GarbageArgs));
        assert!(is_plain_version_one(AcceptStatus::ProgUnavail));
    }

    #[test]
    fn advertisement_round_trips_for_every_subset() {
        for bits in 0..=Extensions::ALL.bits() {
            let ext = Extensions::from_bits_truncate(bits);
            let mut p = PropertyList::new();
            p.push_extensions(ext).unwrap();
            assert_eq!(p.extensions(), ext, "{bits:#x}");
            let mut buf = vec![0u8; p.buffer_len()];
            p.emit(&mut buf).unwrap();
            let back = PropertyList::parse(&buf, &L).unwrap();
            assert_eq!(back.extensions(), ext);
            for other in 0..=Extensions::ALL.bits() {
                let o = Extensions::from_bits_truncate(other);
                assert_eq!(negotiate(ext, o).bits(), bits & other);
            }
        }
    }

    #[test]
    fn prerequisites_of_each_flag() {
        let with = |props: &[Property<'_>]| {
            let mut p = PropertyList::new();
            for x in props {
                p.push(*x).unwrap();
            }
            p.extensions()
        };
        let rtr = |w| Property::RtrSupport(RtrSupport(w));
        let flags = Property::ExtensionFlags;
        assert_eq!(with(&[]), Extensions::EMPTY);
        // Continuation needs all three operations.
        assert_eq!(with(&[rtr(7)]), Extensions::MESSAGE_CONTINUATION);
        assert_eq!(with(&[rtr(5)]), Extensions::EMPTY);
        assert_eq!(with(&[rtr(6)]), Extensions::EMPTY);
        // Send placement needs its flag and the two initial operations.
        assert_eq!(with(&[flags(ext_flag::SEND_PLACEMENT)]), Extensions::EMPTY);
        assert_eq!(
            with(&[rtr(3), flags(ext_flag::SEND_PLACEMENT)]),
            Extensions::SEND_PLACEMENT
        );
        // Unknown flag bits are ignored, and kept by the codec.
        let mut p = PropertyList::new();
        p.push(flags(0xffff_fff0 | ext_flag::REMOTE_INVALIDATE))
            .unwrap();
        assert_eq!(p.extensions(), Extensions::REMOTE_INVALIDATE);
        let mut buf = vec![0u8; p.buffer_len()];
        p.emit(&mut buf).unwrap();
        assert_eq!(PropertyList::parse(&buf, &L), Ok(p));
        // Other properties ride along untouched.
        let g = [BufferGroup {
            count: 2,
            length: 4096,
            align: 4096,
            flags: 1,
        }];
        let rbs = Property::ReceiveBufferStructure(BufferStructure {
            length: 8192,
            groups: &g,
        });
        assert_eq!(with(&[rbs, rtr(7)]), Extensions::MESSAGE_CONTINUATION);
    }

    #[test]
    fn hostile_v2_bodies() {
        // Property count of all ones after the three words.
        let mut b = REQ_V2[..12].to_vec();
        b.extend_from_slice(&[0xff; 4]);
        assert_eq!(ConfigRdmaReqV2::parse(&b, &L), Err(Error::LimitExceeded));
        // A property value of all-ones length.
        let mut b = REPLY_V2;
        b[20..24].fill(0xff);
        assert_eq!(ConfigRdmaReplyV2::parse(&b, &L), Err(Error::LimitExceeded));
        // A Version 1 body is not a version 2 body.
        assert_eq!(
            ConfigRdmaReqV2::parse(&REQ_V2[..12], &L),
            Err(Error::Truncated)
        );
        // Emission refuses an invalid list before writing anything.
        let mut bad = req_repr();
        bad.properties.push(Property::ExtensionFlags(0)).unwrap();
        let mut buf = [0u8; 64];
        assert_eq!(bad.emit(&mut buf), Err(Error::Malformed));
        assert!(buf.iter().all(|&b| b == 0));
        fuzz_parse(&b);
    }
}
