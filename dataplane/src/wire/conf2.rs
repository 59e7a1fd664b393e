//! CONF_RDMA version 2: our extension negotiation (DESIGN s6), built on
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
//! Nothing here panics; decoders and encoders return [`Error`] values.

use super::conf::{ConfigRdmaReply, ConfigRdmaReq};
use super::rtrext::{prop_id, Limits, Property, PropertyList, RtrSupport};
use super::xdr::{Decoder, Encoder};
use super::{Error, Result};

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

/// A set of RPC-over-RDMA extensions (a small bitset). In memory only: on
/// the wire each extension is advertised as the module documentation's
/// table says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Extensions(u8);

impl Extensions {
    /// No extension: what a plain Version One peer gets.
    pub const EMPTY: Extensions = Extensions(0);
    /// Responder-provided read chunks with RDMA_DONE (Lever draft s4).
    pub const RESPONDER_READ_CHUNKS: Extensions = Extensions(0x1);
    /// Remote invalidation by Send With Invalidate (Lever draft s4.1.4).
    pub const REMOTE_INVALIDATE: Extensions = Extensions(0x2);
    /// Message continuation (rtrext s4).
    pub const MESSAGE_CONTINUATION: Extensions = Extensions(0x4);
    /// Send-based data placement (rtrext s3.3).
    pub const SEND_PLACEMENT: Extensions = Extensions(0x8);
    /// Every extension this crate knows.
    pub const ALL: Extensions = Extensions(0xf);

    /// The raw bits.
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// The set with `bits`, ignoring unknown ones.
    pub const fn from_bits_truncate(bits: u8) -> Extensions {
        Extensions(bits & Self::ALL.0)
    }

    /// True when no extension is in the set.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// True when every extension of `other` is in `self`.
    pub const fn contains(self, other: Extensions) -> bool {
        self.0 & other.0 == other.0
    }

    /// True when `self` and `other` share an extension.
    pub const fn intersects(self, other: Extensions) -> bool {
        self.0 & other.0 != 0
    }

    /// The extensions in both.
    pub const fn intersection(self, other: Extensions) -> Extensions {
        Extensions(self.0 & other.0)
    }

    /// The extensions in either.
    pub const fn union(self, other: Extensions) -> Extensions {
        Extensions(self.0 | other.0)
    }
}

/// The negotiation rule (DESIGN s6): an extension is on only when both
/// peers advertised it. For a peer that answered PROG_MISMATCH to
/// version 2, pass [`Extensions::EMPTY`] as `theirs`.
pub const fn negotiate(ours: Extensions, theirs: Extensions) -> Extensions {
    ours.intersection(theirs)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholder() {
        assert!(negotiate(Extensions::ALL, Extensions::EMPTY).is_empty());
    }
}
