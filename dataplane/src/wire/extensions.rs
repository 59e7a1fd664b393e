//! The set of RPC-over-RDMA extensions two peers negotiated
//! ([`Extensions`]). In memory only: how each is advertised on the wire is
//! the business of [`super::conf2`] (CONF_RDMA version 2), and the
//! headers of [`super::rtrext`] check against it what they may carry.
//!
//! It sits in a module of its own, below both, so that `rtrext` does not
//! depend on `conf2` while `conf2` builds on `rtrext`'s property lists.

/// A set of RPC-over-RDMA extensions (a small bitset). In memory only: on
/// the wire each extension is advertised as the table in
/// [`super::conf2`]'s documentation says.
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

    /// The extensions of `self` not in `other`.
    pub const fn difference(self, other: Extensions) -> Extensions {
        Extensions(self.0 & !other.0)
    }
}
