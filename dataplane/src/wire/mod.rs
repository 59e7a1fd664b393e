//! Pure codecs: bytes in, values out, and back. No I/O, no threads, no
//! memory pools, no clock.
//!
//! Each module follows the smoltcp `wire` pattern where a message has a
//! fixed layout (a zero-copy view with field ranges and `check_len`) and a
//! checked high-level `Repr` with `parse`, `buffer_len` and `emit` that
//! mirror each other.
//!
//! # Panic contract
//! Decoders are total: any byte string yields a value or an [`Error`], never
//! a panic, and never allocates more than the input (bounded by
//! caller-given limits) justifies. Encoders write into caller-supplied
//! buffers and return [`Error::BufferTooShort`] rather than panicking when
//! the buffer is too small.

mod bytes;
pub mod conf;
pub mod conf2;
pub mod extensions;
pub mod ibcm;
pub mod roce;
pub mod rpc;
pub mod rpcrdma;
pub mod rtrext;
pub mod xdr;

/// A decoding or encoding failure. Cheap to copy: data-path errors are
/// counted and dropped, not formatted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The input ended before the item being decoded.
    #[error("input truncated")]
    Truncated,
    /// The output buffer cannot hold what is being emitted.
    #[error("output buffer too short")]
    BufferTooShort,
    /// A count or length on the wire is larger than the caller's limit (or
    /// than what the remaining input could possibly hold).
    #[error("count or length exceeds limit")]
    LimitExceeded,
    /// A discriminant or enumeration value that this codec does not know.
    #[error("unknown discriminant")]
    UnknownValue,
    /// The bytes decode but break a rule of the protocol (for example read
    /// chunk positions out of order).
    #[error("malformed message")]
    Malformed,
    /// Bytes remain after a message that should have consumed its input.
    #[error("trailing bytes after message")]
    TrailingBytes,
}

/// Result type of the wire codecs.
pub type Result<T> = core::result::Result<T, Error>;
