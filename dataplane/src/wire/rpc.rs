//! ONC RPC version 2 message headers (RFC 5531 s9) and TCP record marking
//! (RFC 5531 s11).
//!
//! # What is here
//! - [`RpcMessage`]: the top of `struct rpc_msg`, either a [`CallHeader`]
//!   or a [`ReplyHeader`], selected by `msg_type`.
//! - [`OpaqueAuth`]: credentials and verifiers (RFC 5531 s8.2). AUTH_NONE
//!   (s10.1) and AUTH_SYS (appendix A, [`AuthSys`]) are parsed; every other
//!   flavor is kept as its flavor number and a borrowed body.
//! - [`RecordMarker`], [`write_record_header`] and [`RecordReassembler`]:
//!   the record marking standard that frames RPC messages on a byte stream.
//! - [`peek_xid`], [`peek_direction`], [`peek_rpc_version`]: cheap looks at
//!   the fixed first words of a message, for the RPC-over-RDMA layer (which
//!   checks that an RDMA_MSG body carries its transport header's XID) and for
//!   servers that must answer a message they cannot parse.
//!
//! # Header, not body
//! Each `Repr` covers the RPC *header* only. The procedure arguments of a
//! call and the results of a successful reply follow the header and belong
//! to the program. `parse` returns the header length, so the caller slices
//! the body itself; `buffer_len` and `emit` cover the header only.
//!
//! # Zero copy, no allocation
//! Parsed headers borrow opaque auth bodies and the AUTH_SYS machine name
//! from the input; AUTH_SYS group ids are kept in a fixed array. Nothing in
//! this module allocates except [`RecordReassembler::new`], which allocates
//! its record buffer once, at the maximum record size
//! ([`RecordReassembler::with_buffer`] takes the caller's buffer instead).
//!
//! # RPC version
//! A call whose `rpcvers` is not 2 still parses (when the rest of it has
//! the version 2 layout), keeping `rpcvers` in [`CallHeader::rpc_version`];
//! a server checks [`CallHeader::is_supported_version`] and answers
//! `MSG_DENIED` / `RPC_MISMATCH` (RFC 5531 s9). When such a call does not
//! parse at all, [`peek_rpc_version`] still tells the server what the
//! peer asked for, and [`peek_xid`] gives the XID to answer with.
//!
//! # Panic contract
//! Parsers are total: any byte string yields a value or an [`Error`], never
//! a panic. Emitters check the buffer length and the limits before writing
//! anything and return [`Error::BufferTooShort`] or [`Error::LimitExceeded`]
//! instead of panicking; on error nothing has been written. The only
//! functions that panic on purpose are the fuzz entry point [`fuzz_parse`]
//! (when the codec itself is wrong) and [`RecordReassembler::new`] (only
//! for a maximum over `isize::MAX`, like any `Vec`).
//!
//! # Errors
//! - [`Error::Truncated`]: the input ends inside the header. More stream
//!   bytes could help.
//! - [`Error::LimitExceeded`]: an auth body over 400 bytes, a machine name
//!   over 255 bytes, more than 16 group ids, or a record over the maximum.
//! - [`Error::UnknownValue`]: a `msg_type`, `reply_stat`, `accept_stat`,
//!   `reject_stat` or `auth_stat` that RFC 5531 does not define.
//! - [`Error::Malformed`]: a header of the wrong direction for the parser
//!   asked, or an AUTH_SYS body whose fields end early.
//! - [`Error::TrailingBytes`]: an AUTH_SYS body longer than its fields.

use super::xdr::{self, Decoder, Encoder};
use super::{Error, Result};

/// The RPC protocol version this codec speaks: `rpcvers` is 2 (RFC 5531 s9).
pub const RPC_VERSION: u32 = 2;

/// Largest body of an `opaque_auth` (RFC 5531 s8.2: `opaque body<400>`).
pub const MAX_AUTH_BODY_LEN: usize = 400;

/// Largest AUTH_SYS machine name (RFC 5531 appendix A: `string
/// machinename<255>`).
pub const MAX_MACHINE_NAME_LEN: usize = 255;

/// Most group ids in an AUTH_SYS credential (RFC 5531 appendix A:
/// `unsigned int gids<16>`).
pub const MAX_AUTH_SYS_GIDS: usize = 16;

/// Length of the longest call header this codec emits or accepts: six words
/// and two `opaque_auth` with 400-byte bodies.
pub const MAX_CALL_HEADER_LEN: usize = 6 * 4 + 2 * (4 + xdr::opaque_len(MAX_AUTH_BODY_LEN));

/// Length of the longest reply header: xid, msg_type, reply_stat, a
/// 400-byte verifier, accept_stat and a PROG_MISMATCH low/high pair.
pub const MAX_REPLY_HEADER_LEN: usize = 3 * 4 + 4 + xdr::opaque_len(MAX_AUTH_BODY_LEN) + 3 * 4;

/// `msg_type` (RFC 5531 s9): the direction of an RPC message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MessageType {
    /// `CALL = 0`: a request from a client to a server.
    Call,
    /// `REPLY = 1`: a server's answer to a call with the same XID.
    Reply,
}

impl MessageType {
    /// The `msg_type` discriminant on the wire.
    pub const fn to_wire(self) -> u32 {
        match self {
            MessageType::Call => 0,
            MessageType::Reply => 1,
        }
    }

    /// The direction with discriminant `value`.
    ///
    /// # Errors
    /// [`Error::UnknownValue`] for anything but 0 and 1.
    pub const fn from_wire(value: u32) -> Result<Self> {
        match value {
            0 => Ok(MessageType::Call),
            1 => Ok(MessageType::Reply),
            _ => Err(Error::UnknownValue),
        }
    }
}

/// The XID of an RPC message: its first word (RFC 5531 s9). `None` when
/// `msg` is shorter than four bytes. Nothing else is checked.
pub fn peek_xid(msg: &[u8]) -> Option<u32> {
    word_at(msg, 0)
}

/// The direction (`msg_type`, RFC 5531 s9) of an RPC message: its second
/// word. `None` when `msg` is shorter than eight bytes or the word is not a
/// defined `msg_type`.
pub fn peek_direction(msg: &[u8]) -> Option<MessageType> {
    MessageType::from_wire(word_at(msg, 4)?).ok()
}

/// The `rpcvers` a call asks for: its third word. `None` when `msg` is not
/// a call or is shorter than twelve bytes. A server uses it to answer
/// `RPC_MISMATCH` to a call it cannot otherwise parse.
pub fn peek_rpc_version(msg: &[u8]) -> Option<u32> {
    match peek_direction(msg)? {
        MessageType::Call => word_at(msg, 8),
        MessageType::Reply => None,
    }
}

fn word_at(bytes: &[u8], offset: usize) -> Option<u32> {
    let w = bytes.get(offset..offset.checked_add(4)?)?;
    Some(u32::from_be_bytes([w[0], w[1], w[2], w[3]]))
}

/// `auth_flavor` (RFC 5531 s8.2): which authentication scheme an
/// `opaque_auth` belongs to. An open set: flavors are assigned by IANA and
/// any value is valid on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AuthFlavor(pub u32);

impl AuthFlavor {
    /// `AUTH_NONE = 0` (RFC 5531 s10.1).
    pub const NONE: AuthFlavor = AuthFlavor(0);
    /// `AUTH_SYS = 1` (RFC 5531 appendix A).
    pub const SYS: AuthFlavor = AuthFlavor(1);
    /// `AUTH_SHORT = 2`: the shorthand verifier a server may return for
    /// AUTH_SYS (RFC 5531 appendix A).
    pub const SHORT: AuthFlavor = AuthFlavor(2);
    /// `AUTH_DH = 3` (RFC 2695).
    pub const DH: AuthFlavor = AuthFlavor(3);
    /// `RPCSEC_GSS = 6` (RFC 2203).
    pub const RPCSEC_GSS: AuthFlavor = AuthFlavor(6);
    /// `AUTH_TLS = 7` (RFC 9289).
    pub const TLS: AuthFlavor = AuthFlavor(7);
}

/// An AUTH_SYS credential body, `struct authsys_parms` (RFC 5531
/// appendix A). Borrows the machine name; keeps the group ids in a fixed
/// array, so it never allocates.
///
/// Invariant (kept by [`AuthSys::new`] and by parsing): the machine name is
/// at most 255 bytes and there are at most 16 group ids, so the encoded body
/// (at most 340 bytes) always fits an `opaque_auth`.
#[derive(Clone, Copy)]
pub struct AuthSys<'a> {
    stamp: u32,
    machine_name: &'a [u8],
    uid: u32,
    gid: u32,
    gids: [u32; MAX_AUTH_SYS_GIDS],
    gid_count: u8,
}

impl<'a> AuthSys<'a> {
    /// An AUTH_SYS credential. `machine_name` is taken as bytes: RFC 5531
    /// calls it a string but does not constrain its characters.
    ///
    /// # Errors
    /// [`Error::LimitExceeded`] when `machine_name` is over 255 bytes or
    /// `gids` has more than 16 entries.
    pub fn new(
        stamp: u32,
        machine_name: &'a [u8],
        uid: u32,
        gid: u32,
        gids: &[u32],
    ) -> Result<Self> {
        if machine_name.len() > MAX_MACHINE_NAME_LEN || gids.len() > MAX_AUTH_SYS_GIDS {
            return Err(Error::LimitExceeded);
        }
        let mut all = [0u32; MAX_AUTH_SYS_GIDS];
        all[..gids.len()].copy_from_slice(gids);
        Ok(AuthSys {
            stamp,
            machine_name,
            uid,
            gid,
            gids: all,
            gid_count: gids.len() as u8,
        })
    }

    /// The `stamp` the client chose for this credential.
    pub fn stamp(&self) -> u32 {
        self.stamp
    }

    /// The caller's machine name, as sent (at most 255 bytes).
    pub fn machine_name(&self) -> &'a [u8] {
        self.machine_name
    }

    /// The caller's effective user id.
    pub fn uid(&self) -> u32 {
        self.uid
    }

    /// The caller's effective group id.
    pub fn gid(&self) -> u32 {
        self.gid
    }

    /// The caller's supplementary group ids (at most 16).
    pub fn gids(&self) -> &[u32] {
        &self.gids[..usize::from(self.gid_count)]
    }

    /// Parses an AUTH_SYS body: the bytes of an `opaque_auth` body whose
    /// flavor is AUTH_SYS, which must hold `authsys_parms` exactly.
    ///
    /// # Errors
    /// - [`Error::Malformed`]: the body ends inside a field (the body is
    ///   complete, so more input would not help).
    /// - [`Error::LimitExceeded`]: machine name over 255 bytes, more than 16
    ///   group ids, or a count larger than the body could hold.
    /// - [`Error::TrailingBytes`]: bytes left in the body after `gids`.
    pub fn parse(body: &'a [u8]) -> Result<Self> {
        let mut d = Decoder::new(body);
        let sys = Self::decode_fields(&mut d).map_err(|e| match e {
            Error::Truncated => Error::Malformed,
            other => other,
        })?;
        d.finish()?;
        Ok(sys)
    }

    fn decode_fields(d: &mut Decoder<'a>) -> Result<Self> {
        let stamp = d.get_u32()?;
        let machine_name = d.get_string(MAX_MACHINE_NAME_LEN)?;
        let uid = d.get_u32()?;
        let gid = d.get_u32()?;
        let count = d.get_count(MAX_AUTH_SYS_GIDS, 4)?;
        let mut gids = [0u32; MAX_AUTH_SYS_GIDS];
        for slot in gids.iter_mut().take(count) {
            *slot = d.get_u32()?;
        }
        Ok(AuthSys {
            stamp,
            machine_name,
            uid,
            gid,
            gids,
            gid_count: count as u8,
        })
    }

    /// Length of the encoded body (without the flavor and length words of
    /// the enclosing `opaque_auth`). Always a multiple of four.
    pub fn buffer_len(&self) -> usize {
        4 + xdr::opaque_len(self.machine_name.len()) + 4 + 4 + 4 + 4 * self.gids().len()
    }

    /// Writes the body.
    ///
    /// ```text
    /// struct authsys_parms {            /* RFC 5531 appendix A */
    ///     unsigned int stamp;
    ///     string machinename<255>;
    ///     unsigned int uid;
    ///     unsigned int gid;
    ///     unsigned int gids<16>;
    /// };
    /// ```
    ///
    /// # Errors
    /// [`Error::BufferTooShort`] when `enc` has less than
    /// [`buffer_len`](Self::buffer_len) bytes free; nothing is written.
    pub fn emit(&self, enc: &mut Encoder<'_>) -> Result<()> {
        if enc.remaining() < self.buffer_len() {
            return Err(Error::BufferTooShort);
        }
        enc.put_u32(self.stamp)?;
        enc.put_opaque(self.machine_name)?;
        enc.put_u32(self.uid)?;
        enc.put_u32(self.gid)?;
        enc.put_count(self.gids().len())?;
        for &g in self.gids() {
            enc.put_u32(g)?;
        }
        Ok(())
    }
}

impl PartialEq for AuthSys<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.stamp == other.stamp
            && self.machine_name == other.machine_name
            && self.uid == other.uid
            && self.gid == other.gid
            && self.gids() == other.gids()
    }
}

impl Eq for AuthSys<'_> {}

impl core::fmt::Debug for AuthSys<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("AuthSys")
            .field("stamp", &self.stamp)
            .field(
                "machine_name",
                &format_args!("\"{}\"", self.machine_name.escape_ascii()),
            )
            .field("uid", &self.uid)
            .field("gid", &self.gid)
            .field("gids", &self.gids())
            .finish()
    }
}

/// `opaque_auth` (RFC 5531 s8.2): a credential or verifier.
///
/// Parsing maps the wire form to exactly one variant, so that
/// `parse(emit(x)) == x`:
/// - flavor AUTH_NONE with an empty body is [`OpaqueAuth::None`];
/// - flavor AUTH_SYS is [`OpaqueAuth::Sys`] (a body that is not a valid
///   `authsys_parms` is an error);
/// - every other flavor, and AUTH_NONE with a non-empty body (RFC 5531
///   s10.1 only recommends an empty one), is [`OpaqueAuth::Other`].
///
/// `emit` refuses the two `Other` values that would not parse back as
/// themselves: flavor AUTH_SYS, and flavor AUTH_NONE with an empty body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpaqueAuth<'a> {
    /// AUTH_NONE with an empty body (RFC 5531 s10.1).
    None,
    /// AUTH_SYS (RFC 5531 appendix A).
    Sys(AuthSys<'a>),
    /// Any other flavor, kept opaque: the body borrows the input and is at
    /// most 400 bytes.
    Other {
        /// The flavor number.
        flavor: AuthFlavor,
        /// The body bytes, without padding.
        body: &'a [u8],
    },
}

impl<'a> OpaqueAuth<'a> {
    /// The flavor number this value is sent with.
    pub fn flavor(&self) -> AuthFlavor {
        match self {
            OpaqueAuth::None => AuthFlavor::NONE,
            OpaqueAuth::Sys(_) => AuthFlavor::SYS,
            OpaqueAuth::Other { flavor, .. } => *flavor,
        }
    }

    /// Decodes one `opaque_auth` at the decoder's position. On error the
    /// decoder is left where it was.
    ///
    /// # Errors
    /// - [`Error::Truncated`]: the input ends inside the `opaque_auth`.
    /// - [`Error::LimitExceeded`]: a body over 400 bytes, or an AUTH_SYS body
    ///   over its limits (see [`AuthSys::parse`]).
    /// - [`Error::Malformed`], [`Error::TrailingBytes`]: an AUTH_SYS body that
    ///   does not hold `authsys_parms` exactly.
    pub fn decode(dec: &mut Decoder<'a>) -> Result<Self> {
        // AUTH_NONE with an empty body, two zero words, is what most
        // calls and nearly every reply verifier carry: taken without the
        // opaque machinery (`tests::auth_none_shortcut_decodes_as_the_general_path`).
        if dec.rest().get(..8) == Some(&[0u8; 8][..]) {
            dec.skip(8)?;
            return Ok(OpaqueAuth::None);
        }
        Self::decode_general(dec)
    }

    /// [`OpaqueAuth::decode`] without its shortcut for AUTH_NONE.
    fn decode_general(dec: &mut Decoder<'a>) -> Result<Self> {
        let mut d = dec.clone();
        let flavor = AuthFlavor(d.get_u32()?);
        let body = d.get_opaque(MAX_AUTH_BODY_LEN)?;
        let auth = match flavor {
            AuthFlavor::NONE if body.is_empty() => OpaqueAuth::None,
            AuthFlavor::SYS => OpaqueAuth::Sys(AuthSys::parse(body)?),
            _ => OpaqueAuth::Other { flavor, body },
        };
        *dec = d;
        Ok(auth)
    }

    fn body_len(&self) -> usize {
        match self {
            OpaqueAuth::None => 0,
            OpaqueAuth::Sys(sys) => sys.buffer_len(),
            OpaqueAuth::Other { body, .. } => body.len(),
        }
    }

    /// Length of the encoded `opaque_auth`: flavor, length, padded body.
    pub fn buffer_len(&self) -> usize {
        4 + xdr::opaque_len(self.body_len())
    }

    /// Checks what `emit` checks, without writing.
    fn check(&self) -> Result<()> {
        match self {
            OpaqueAuth::None | OpaqueAuth::Sys(_) => Ok(()),
            OpaqueAuth::Other { body, .. } if body.len() > MAX_AUTH_BODY_LEN => {
                Err(Error::LimitExceeded)
            }
            OpaqueAuth::Other { flavor, body } => {
                if *flavor == AuthFlavor::SYS || (*flavor == AuthFlavor::NONE && body.is_empty()) {
                    Err(Error::Malformed)
                } else {
                    Ok(())
                }
            }
        }
    }

    /// Writes the `opaque_auth`.
    ///
    /// ```text
    /// struct opaque_auth {              /* RFC 5531 s8.2 */
    ///     auth_flavor flavor;
    ///     opaque body<400>;
    /// };
    /// ```
    ///
    /// # Errors
    /// - [`Error::LimitExceeded`]: an `Other` body over 400 bytes.
    /// - [`Error::Malformed`]: an `Other` that would parse back as another
    ///   variant (flavor AUTH_SYS, or AUTH_NONE with an empty body).
    /// - [`Error::BufferTooShort`]: `enc` has less than
    ///   [`buffer_len`](Self::buffer_len) bytes free.
    ///
    /// On error nothing is written.
    pub fn emit(&self, enc: &mut Encoder<'_>) -> Result<()> {
        self.check()?;
        if enc.remaining() < self.buffer_len() {
            return Err(Error::BufferTooShort);
        }
        self.emit_unchecked(enc)
    }

    /// Writes after `check` and the length check have passed.
    fn emit_unchecked(&self, enc: &mut Encoder<'_>) -> Result<()> {
        enc.put_u32(self.flavor().0)?;
        match self {
            OpaqueAuth::None => enc.put_opaque(&[]),
            OpaqueAuth::Sys(sys) => {
                // The body length; the body is a whole number of XDR units,
                // so no padding follows. At most 340, so the cast is exact.
                enc.put_u32(sys.buffer_len() as u32)?;
                sys.emit(enc)
            }
            OpaqueAuth::Other { body, .. } => enc.put_opaque(body),
        }
    }
}

/// Reads `xid` and `msg_type`, the words every RPC message starts with.
fn decode_xid_and_type(d: &mut Decoder<'_>) -> Result<(u32, MessageType)> {
    let xid = d.get_u32()?;
    let mtype = MessageType::from_wire(d.get_u32()?)?;
    Ok((xid, mtype))
}

/// The header of an RPC call: `xid`, `msg_type` CALL and `call_body` up to
/// and including the verifier (RFC 5531 s9). The procedure arguments
/// follow it and are not part of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallHeader<'a> {
    /// Transaction id, echoed by the reply.
    pub xid: u32,
    /// `rpcvers` as received. Parsing accepts any value (see the module
    /// doc); a server answers RPC_MISMATCH unless
    /// [`is_supported_version`](Self::is_supported_version).
    pub rpc_version: u32,
    /// `prog`: the remote program number.
    pub program: u32,
    /// `vers`: the version of the remote program.
    pub version: u32,
    /// `proc`: the procedure number within the program.
    pub procedure: u32,
    /// `cred`: who the caller says it is.
    pub credential: OpaqueAuth<'a>,
    /// `verf`: the proof that goes with the credential.
    pub verifier: OpaqueAuth<'a>,
}

impl<'a> CallHeader<'a> {
    /// A version 2 call header.
    pub fn new(
        xid: u32,
        program: u32,
        version: u32,
        procedure: u32,
        credential: OpaqueAuth<'a>,
        verifier: OpaqueAuth<'a>,
    ) -> Self {
        CallHeader {
            xid,
            rpc_version: RPC_VERSION,
            program,
            version,
            procedure,
            credential,
            verifier,
        }
    }

    /// Whether `rpcvers` is 2, the only version RFC 5531 defines. When it is
    /// not, a server answers `MSG_DENIED` with `RPC_MISMATCH` low = high = 2.
    pub fn is_supported_version(&self) -> bool {
        self.rpc_version == RPC_VERSION
    }

    /// Parses a call header from the start of `msg`. Returns the header
    /// and its length: the procedure arguments are `msg[len..]`.
    ///
    /// # Errors
    /// As [`decode`](Self::decode).
    pub fn parse(msg: &'a [u8]) -> Result<(Self, usize)> {
        let mut d = Decoder::new(msg);
        let header = Self::decode(&mut d)?;
        Ok((header, d.position()))
    }

    /// Decodes a call header at the decoder's position and leaves the
    /// decoder at the first byte of the arguments. On error the decoder is
    /// left where it was.
    ///
    /// # Errors
    /// - [`Error::Truncated`]: the input ends inside the header.
    /// - [`Error::UnknownValue`]: `msg_type` is neither CALL nor REPLY.
    /// - [`Error::Malformed`]: the message is a REPLY, or the credential or
    ///   verifier is a malformed AUTH_SYS body.
    /// - [`Error::LimitExceeded`], [`Error::TrailingBytes`]: from the
    ///   credential or verifier (see [`OpaqueAuth::decode`]).
    pub fn decode(dec: &mut Decoder<'a>) -> Result<Self> {
        let mut d = dec.clone();
        let (xid, mtype) = decode_xid_and_type(&mut d)?;
        if mtype != MessageType::Call {
            return Err(Error::Malformed);
        }
        let header = Self::decode_body(&mut d, xid)?;
        *dec = d;
        Ok(header)
    }

    /// `call_body`, after `xid` and `msg_type`.
    fn decode_body(d: &mut Decoder<'a>, xid: u32) -> Result<Self> {
        Ok(CallHeader {
            xid,
            rpc_version: d.get_u32()?,
            program: d.get_u32()?,
            version: d.get_u32()?,
            procedure: d.get_u32()?,
            credential: OpaqueAuth::decode(d)?,
            verifier: OpaqueAuth::decode(d)?,
        })
    }

    /// Length of the encoded header.
    pub fn buffer_len(&self) -> usize {
        6 * 4 + self.credential.buffer_len() + self.verifier.buffer_len()
    }

    /// Writes the header; the caller writes the arguments after it.
    ///
    /// ```text
    /// unsigned int xid;                 /* RFC 5531 s9, struct rpc_msg */
    /// msg_type mtype;                   /* CALL = 0 */
    /// struct call_body {
    ///     unsigned int rpcvers;         /* 2 */
    ///     unsigned int prog;
    ///     unsigned int vers;
    ///     unsigned int proc;
    ///     opaque_auth  cred;
    ///     opaque_auth  verf;
    ///     /* procedure-specific parameters start here */
    /// };
    /// ```
    ///
    /// # Errors
    /// [`Error::BufferTooShort`], or an error of [`OpaqueAuth::emit`] for
    /// the credential or verifier. On error nothing is written.
    pub fn emit(&self, enc: &mut Encoder<'_>) -> Result<()> {
        self.credential.check()?;
        self.verifier.check()?;
        if enc.remaining() < self.buffer_len() {
            return Err(Error::BufferTooShort);
        }
        enc.put_u32(self.xid)?;
        enc.put_u32(MessageType::Call.to_wire())?;
        enc.put_u32(self.rpc_version)?;
        enc.put_u32(self.program)?;
        enc.put_u32(self.version)?;
        enc.put_u32(self.procedure)?;
        self.credential.emit_unchecked(enc)?;
        self.verifier.emit_unchecked(enc)
    }
}

/// `accept_stat` with its arm of `accepted_reply.reply_data` (RFC 5531 s9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AcceptStatus {
    /// `SUCCESS = 0`: the procedure ran; its results follow the header.
    Success,
    /// `PROG_UNAVAIL = 1`: the program is not served here.
    ProgUnavail,
    /// `PROG_MISMATCH = 2`: the program is served, but only versions
    /// `low..=high`.
    ProgMismatch {
        /// Lowest version served.
        low: u32,
        /// Highest version served.
        high: u32,
    },
    /// `PROC_UNAVAIL = 3`: the program has no such procedure.
    ProcUnavail,
    /// `GARBAGE_ARGS = 4`: the arguments did not decode.
    GarbageArgs,
    /// `SYSTEM_ERR = 5`: the server failed, e.g. out of memory.
    SystemErr,
}

impl AcceptStatus {
    /// The `accept_stat` discriminant on the wire.
    pub const fn to_wire(self) -> u32 {
        match self {
            AcceptStatus::Success => 0,
            AcceptStatus::ProgUnavail => 1,
            AcceptStatus::ProgMismatch { .. } => 2,
            AcceptStatus::ProcUnavail => 3,
            AcceptStatus::GarbageArgs => 4,
            AcceptStatus::SystemErr => 5,
        }
    }

    fn decode(d: &mut Decoder<'_>) -> Result<Self> {
        Ok(match d.get_u32()? {
            0 => AcceptStatus::Success,
            1 => AcceptStatus::ProgUnavail,
            2 => AcceptStatus::ProgMismatch {
                low: d.get_u32()?,
                high: d.get_u32()?,
            },
            3 => AcceptStatus::ProcUnavail,
            4 => AcceptStatus::GarbageArgs,
            5 => AcceptStatus::SystemErr,
            _ => return Err(Error::UnknownValue),
        })
    }

    fn buffer_len(&self) -> usize {
        match self {
            AcceptStatus::ProgMismatch { .. } => 12,
            _ => 4,
        }
    }

    fn emit(&self, enc: &mut Encoder<'_>) -> Result<()> {
        enc.put_u32(self.to_wire())?;
        if let AcceptStatus::ProgMismatch { low, high } = *self {
            enc.put_u32(low)?;
            enc.put_u32(high)?;
        }
        Ok(())
    }
}

/// `auth_stat` (RFC 5531 s9): why a server refused a credential or
/// verifier, carried by a denied reply with `AUTH_ERROR`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AuthStat {
    /// `AUTH_OK = 0`: success (not expected in a denied reply, but
    /// encodable).
    Ok = 0,
    /// `AUTH_BADCRED = 1`: bad credential (seal broken).
    BadCred = 1,
    /// `AUTH_REJECTEDCRED = 2`: the client must begin a new session.
    RejectedCred = 2,
    /// `AUTH_BADVERF = 3`: bad verifier (seal broken).
    BadVerf = 3,
    /// `AUTH_REJECTEDVERF = 4`: verifier expired or replayed.
    RejectedVerf = 4,
    /// `AUTH_TOOWEAK = 5`: rejected for security reasons.
    TooWeak = 5,
    /// `AUTH_INVALIDRESP = 6`: bogus response verifier.
    InvalidResp = 6,
    /// `AUTH_FAILED = 7`: reason unknown.
    Failed = 7,
    /// `AUTH_KERB_GENERIC = 8`: Kerberos generic error.
    KerbGeneric = 8,
    /// `AUTH_TIMEEXPIRE = 9`: the Kerberos credential expired.
    TimeExpire = 9,
    /// `AUTH_TKT_FILE = 10`: problem with the Kerberos ticket file.
    TktFile = 10,
    /// `AUTH_DECODE = 11`: the authenticator could not be decoded.
    Decode = 11,
    /// `AUTH_NET_ADDR = 12`: wrong network address in the ticket.
    NetAddr = 12,
    /// `RPCSEC_GSS_CREDPROBLEM = 13`: no credentials for the user.
    RpcsecGssCredProblem = 13,
    /// `RPCSEC_GSS_CTXPROBLEM = 14`: problem with the GSS context.
    RpcsecGssCtxProblem = 14,
}

impl AuthStat {
    const ALL: [AuthStat; 15] = [
        AuthStat::Ok,
        AuthStat::BadCred,
        AuthStat::RejectedCred,
        AuthStat::BadVerf,
        AuthStat::RejectedVerf,
        AuthStat::TooWeak,
        AuthStat::InvalidResp,
        AuthStat::Failed,
        AuthStat::KerbGeneric,
        AuthStat::TimeExpire,
        AuthStat::TktFile,
        AuthStat::Decode,
        AuthStat::NetAddr,
        AuthStat::RpcsecGssCredProblem,
        AuthStat::RpcsecGssCtxProblem,
    ];

    /// The `auth_stat` discriminant on the wire.
    pub const fn to_wire(self) -> u32 {
        self as u32
    }

    /// The `auth_stat` with discriminant `value`.
    ///
    /// # Errors
    /// [`Error::UnknownValue`] for values RFC 5531 does not define (above 14).
    pub fn from_wire(value: u32) -> Result<Self> {
        usize::try_from(value)
            .ok()
            .and_then(|i| Self::ALL.get(i).copied())
            .ok_or(Error::UnknownValue)
    }
}

/// `rejected_reply` (RFC 5531 s9): why a server refused to run a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejectedReply {
    /// `RPC_MISMATCH = 0`: the server speaks RPC versions `low..=high`
    /// only.
    RpcMismatch {
        /// Lowest RPC version supported.
        low: u32,
        /// Highest RPC version supported.
        high: u32,
    },
    /// `AUTH_ERROR = 1`: the credential or verifier was refused.
    AuthError(AuthStat),
}

impl RejectedReply {
    /// What a server answers to a call whose `rpcvers` is not 2.
    pub const RPC_VERSION_MISMATCH: RejectedReply = RejectedReply::RpcMismatch {
        low: RPC_VERSION,
        high: RPC_VERSION,
    };

    fn decode(d: &mut Decoder<'_>) -> Result<Self> {
        Ok(match d.get_u32()? {
            0 => RejectedReply::RpcMismatch {
                low: d.get_u32()?,
                high: d.get_u32()?,
            },
            1 => RejectedReply::AuthError(AuthStat::from_wire(d.get_u32()?)?),
            _ => return Err(Error::UnknownValue),
        })
    }

    fn buffer_len(&self) -> usize {
        match self {
            RejectedReply::RpcMismatch { .. } => 12,
            RejectedReply::AuthError(_) => 8,
        }
    }

    fn emit(&self, enc: &mut Encoder<'_>) -> Result<()> {
        match *self {
            RejectedReply::RpcMismatch { low, high } => {
                enc.put_u32(0)?;
                enc.put_u32(low)?;
                enc.put_u32(high)
            }
            RejectedReply::AuthError(stat) => {
                enc.put_u32(1)?;
                enc.put_u32(stat.to_wire())
            }
        }
    }
}

/// `accepted_reply` (RFC 5531 s9) without the results: the server ran the
/// authentication and answers with a verifier and a status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcceptedReply<'a> {
    /// `verf`: the server's verifier.
    pub verifier: OpaqueAuth<'a>,
    /// `reply_data` discriminant and its arm.
    pub status: AcceptStatus,
}

/// `reply_body` (RFC 5531 s9), switched on `reply_stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyBody<'a> {
    /// `MSG_ACCEPTED = 0`.
    Accepted(AcceptedReply<'a>),
    /// `MSG_DENIED = 1`.
    Denied(RejectedReply),
}

/// The header of an RPC reply: `xid`, `msg_type` REPLY and `reply_body`
/// (RFC 5531 s9). For `SUCCESS` the procedure results follow it and are not
/// part of it; for every other status nothing follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplyHeader<'a> {
    /// The XID of the call answered.
    pub xid: u32,
    /// Accepted or denied, with details.
    pub body: ReplyBody<'a>,
}

impl<'a> ReplyHeader<'a> {
    /// An accepted reply.
    pub fn accepted(xid: u32, verifier: OpaqueAuth<'a>, status: AcceptStatus) -> Self {
        ReplyHeader {
            xid,
            body: ReplyBody::Accepted(AcceptedReply { verifier, status }),
        }
    }

    /// A denied reply.
    pub fn denied(xid: u32, reason: RejectedReply) -> Self {
        ReplyHeader {
            xid,
            body: ReplyBody::Denied(reason),
        }
    }

    /// Whether this is `MSG_ACCEPTED` with `SUCCESS`, i.e. results follow.
    pub fn is_success(&self) -> bool {
        matches!(
            self.body,
            ReplyBody::Accepted(AcceptedReply {
                status: AcceptStatus::Success,
                ..
            })
        )
    }

    /// Parses a reply header from the start of `msg`. Returns the header
    /// and its length: the results are `msg[len..]`.
    ///
    /// # Errors
    /// As [`decode`](Self::decode).
    pub fn parse(msg: &'a [u8]) -> Result<(Self, usize)> {
        let mut d = Decoder::new(msg);
        let header = Self::decode(&mut d)?;
        Ok((header, d.position()))
    }

    /// Decodes a reply header at the decoder's position and leaves the
    /// decoder at the first byte of the results. On error the decoder is
    /// left where it was.
    ///
    /// # Errors
    /// - [`Error::Truncated`]: the input ends inside the header.
    /// - [`Error::UnknownValue`]: unknown `msg_type`, `reply_stat`,
    ///   `accept_stat`, `reject_stat` or `auth_stat`.
    /// - [`Error::Malformed`]: the message is a CALL, or the verifier is a
    ///   malformed AUTH_SYS body.
    /// - [`Error::LimitExceeded`], [`Error::TrailingBytes`]: from the
    ///   verifier (see [`OpaqueAuth::decode`]).
    pub fn decode(dec: &mut Decoder<'a>) -> Result<Self> {
        let mut d = dec.clone();
        let (xid, mtype) = decode_xid_and_type(&mut d)?;
        if mtype != MessageType::Reply {
            return Err(Error::Malformed);
        }
        let header = Self::decode_body(&mut d, xid)?;
        *dec = d;
        Ok(header)
    }

    /// `reply_body`, after `xid` and `msg_type`.
    fn decode_body(d: &mut Decoder<'a>, xid: u32) -> Result<Self> {
        let body = match d.get_u32()? {
            0 => ReplyBody::Accepted(AcceptedReply {
                verifier: OpaqueAuth::decode(d)?,
                status: AcceptStatus::decode(d)?,
            }),
            1 => ReplyBody::Denied(RejectedReply::decode(d)?),
            _ => return Err(Error::UnknownValue),
        };
        Ok(ReplyHeader { xid, body })
    }

    /// Length of the encoded header.
    pub fn buffer_len(&self) -> usize {
        3 * 4
            + match &self.body {
                ReplyBody::Accepted(a) => a.verifier.buffer_len() + a.status.buffer_len(),
                ReplyBody::Denied(r) => r.buffer_len(),
            }
    }

    /// Writes the header; after `SUCCESS` the caller writes the results.
    ///
    /// ```text
    /// unsigned int xid;                 /* RFC 5531 s9, struct rpc_msg */
    /// msg_type mtype;                   /* REPLY = 1 */
    /// union reply_body switch (reply_stat stat) {
    /// case MSG_ACCEPTED:                /* 0 */
    ///     opaque_auth verf;
    ///     union switch (accept_stat stat) {
    ///     case SUCCESS:       opaque results[0];  /* results follow */
    ///     case PROG_MISMATCH: unsigned int low; unsigned int high;
    ///     default:            void;
    ///     } reply_data;
    /// case MSG_DENIED:                  /* 1 */
    ///     union rejected_reply switch (reject_stat stat) {
    ///     case RPC_MISMATCH:  unsigned int low; unsigned int high;
    ///     case AUTH_ERROR:    auth_stat stat;
    ///     };
    /// };
    /// ```
    ///
    /// # Errors
    /// [`Error::BufferTooShort`], or an error of [`OpaqueAuth::emit`] for
    /// the verifier. On error nothing is written.
    pub fn emit(&self, enc: &mut Encoder<'_>) -> Result<()> {
        if let ReplyBody::Accepted(a) = &self.body {
            a.verifier.check()?;
        }
        if enc.remaining() < self.buffer_len() {
            return Err(Error::BufferTooShort);
        }
        enc.put_u32(self.xid)?;
        enc.put_u32(MessageType::Reply.to_wire())?;
        match &self.body {
            ReplyBody::Accepted(a) => {
                enc.put_u32(0)?;
                a.verifier.emit_unchecked(enc)?;
                a.status.emit(enc)
            }
            ReplyBody::Denied(r) => {
                enc.put_u32(1)?;
                r.emit(enc)
            }
        }
    }
}

/// `struct rpc_msg` (RFC 5531 s9) up to where the program's data starts:
/// a call header or a reply header, chosen by `msg_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RpcMessage<'a> {
    /// `msg_type` CALL.
    Call(CallHeader<'a>),
    /// `msg_type` REPLY.
    Reply(ReplyHeader<'a>),
}

impl<'a> RpcMessage<'a> {
    /// The transaction id.
    pub fn xid(&self) -> u32 {
        match self {
            RpcMessage::Call(c) => c.xid,
            RpcMessage::Reply(r) => r.xid,
        }
    }

    /// The direction.
    pub fn direction(&self) -> MessageType {
        match self {
            RpcMessage::Call(_) => MessageType::Call,
            RpcMessage::Reply(_) => MessageType::Reply,
        }
    }

    /// Parses a message header from the start of `msg`. Returns the header
    /// and its length: the arguments or results are `msg[len..]`.
    ///
    /// # Errors
    /// As [`decode`](Self::decode).
    pub fn parse(msg: &'a [u8]) -> Result<(Self, usize)> {
        let mut d = Decoder::new(msg);
        let m = Self::decode(&mut d)?;
        Ok((m, d.position()))
    }

    /// Decodes a message header at the decoder's position; on error the
    /// decoder is left where it was.
    ///
    /// # Errors
    /// [`Error::UnknownValue`] for an unknown `msg_type`, otherwise as
    /// [`CallHeader::decode`] or [`ReplyHeader::decode`] (never
    /// [`Error::Malformed`] for the direction).
    pub fn decode(dec: &mut Decoder<'a>) -> Result<Self> {
        let mut d = dec.clone();
        let (xid, mtype) = decode_xid_and_type(&mut d)?;
        let m = match mtype {
            MessageType::Call => RpcMessage::Call(CallHeader::decode_body(&mut d, xid)?),
            MessageType::Reply => RpcMessage::Reply(ReplyHeader::decode_body(&mut d, xid)?),
        };
        *dec = d;
        Ok(m)
    }

    /// Length of the encoded header.
    pub fn buffer_len(&self) -> usize {
        match self {
            RpcMessage::Call(c) => c.buffer_len(),
            RpcMessage::Reply(r) => r.buffer_len(),
        }
    }

    /// Writes the header (see [`CallHeader::emit`], [`ReplyHeader::emit`]).
    ///
    /// # Errors
    /// As [`CallHeader::emit`] or [`ReplyHeader::emit`]; on error nothing
    /// is written.
    pub fn emit(&self, enc: &mut Encoder<'_>) -> Result<()> {
        match self {
            RpcMessage::Call(c) => c.emit(enc),
            RpcMessage::Reply(r) => r.emit(enc),
        }
    }
}

/// A record marking fragment header (RFC 5531 s11): one big-endian word
/// whose top bit says "last fragment of the record" and whose low 31 bits
/// are the fragment length in bytes (the header itself not counted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RecordMarker {
    word: u32,
}

impl RecordMarker {
    /// Length of a fragment header on the wire.
    pub const LEN: usize = 4;
    /// The last-fragment bit.
    pub const LAST_FRAGMENT: u32 = 0x8000_0000;
    /// Largest fragment length a header can announce, 2^31 - 1.
    pub const MAX_FRAGMENT_LEN: usize = 0x7FFF_FFFF;

    /// A header announcing a fragment of `fragment_len` bytes.
    ///
    /// # Errors
    /// [`Error::LimitExceeded`] when `fragment_len` is over 2^31 - 1.
    pub fn new(fragment_len: usize, is_last: bool) -> Result<Self> {
        if fragment_len > Self::MAX_FRAGMENT_LEN {
            return Err(Error::LimitExceeded);
        }
        let last = if is_last { Self::LAST_FRAGMENT } else { 0 };
        Ok(RecordMarker {
            word: last | fragment_len as u32,
        })
    }

    /// The header with wire word `word`; every word is a valid header.
    pub const fn from_word(word: u32) -> Self {
        RecordMarker { word }
    }

    /// The wire word.
    pub const fn to_word(self) -> u32 {
        self.word
    }

    /// Whether this fragment ends its record.
    pub const fn is_last(self) -> bool {
        self.word & Self::LAST_FRAGMENT != 0
    }

    /// Bytes of fragment data that follow the header.
    pub const fn fragment_len(self) -> usize {
        (self.word & !Self::LAST_FRAGMENT) as usize
    }

    /// Reads a header from the first four bytes of `bytes`.
    ///
    /// # Errors
    /// [`Error::Truncated`] when `bytes` is shorter than four bytes.
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        word_at(bytes, 0)
            .map(Self::from_word)
            .ok_or(Error::Truncated)
    }

    /// Writes the header into the first four bytes of `buf`.
    ///
    /// # Errors
    /// [`Error::BufferTooShort`] when `buf` is shorter than four bytes.
    pub fn emit(self, buf: &mut [u8]) -> Result<()> {
        buf.get_mut(..Self::LEN)
            .ok_or(Error::BufferTooShort)?
            .copy_from_slice(&self.word.to_be_bytes());
        Ok(())
    }
}

/// Writes the header of a record sent as a single fragment of `record_len`
/// bytes (last-fragment bit set) into the start of `buf`, and returns the
/// header length ([`RecordMarker::LEN`]); the record follows it.
///
/// # Errors
/// - [`Error::LimitExceeded`]: `record_len` is over 2^31 - 1 (send such a
///   record as several fragments with [`RecordMarker`]).
/// - [`Error::BufferTooShort`]: `buf` is shorter than four bytes.
pub fn write_record_header(buf: &mut [u8], record_len: usize) -> Result<usize> {
    RecordMarker::new(record_len, true)?.emit(buf)?;
    Ok(RecordMarker::LEN)
}

/// Where a [`RecordReassembler`] is in the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReassemblyState {
    /// Reading a fragment header; `have` of its four bytes are in
    /// `marker_bytes`.
    Marker { have: usize },
    /// Copying fragment data: `left` bytes still to come; `last` from the
    /// fragment's header.
    Fragment { left: usize, last: bool },
    /// A whole record is in the buffer, waiting for `poll_record`.
    Complete,
    /// A fragment would have made the record too long. Record boundaries
    /// are lost, so the stream cannot be read any further.
    Failed(Error),
}

/// Joins record-marked fragments from a byte stream into whole records
/// (RFC 5531 s11), never holding more than a fixed maximum.
///
/// Holds records in one buffer whose length is the maximum record size:
/// either allocated once by [`new`](RecordReassembler::new) or supplied by
/// the caller to [`with_buffer`](Self::with_buffer) (registered memory, a
/// stack array). Pushing and polling never allocate. A fragment
/// header that would take the record over the maximum is refused as soon
/// as its four bytes arrive, before any of its data is copied.
///
/// ```text
/// loop {
///     let used = reassembler.push(input)?;   // stops at the end of a record
///     input = &input[used..];
///     match reassembler.poll_record() {
///         Some(record) => handle(record),
///         None => break,                     // all of `input` consumed
///     }
/// }
/// ```
pub struct RecordReassembler<B = Box<[u8]>> {
    buf: B,
    record_len: usize,
    /// A fragment header of the current record has been taken (the record
    /// may still be empty: zero-length fragments are legal).
    record_started: bool,
    marker_bytes: [u8; RecordMarker::LEN],
    state: ReassemblyState,
}

impl<B: AsRef<[u8]>> core::fmt::Debug for RecordReassembler<B> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RecordReassembler")
            .field("max_record_len", &self.buf.as_ref().len())
            .field("record_len", &self.record_len)
            .field("state", &self.state)
            .finish()
    }
}

impl RecordReassembler {
    /// A reassembler for records of at most `max_record_len` bytes (the
    /// sum of a record's fragment lengths, headers not counted). Allocates
    /// `max_record_len` bytes, once.
    ///
    /// # Panics
    /// Like `vec!`: when `max_record_len` is over `isize::MAX` (and the
    /// process aborts when the allocator fails).
    pub fn new(max_record_len: usize) -> Self {
        Self::with_buffer(vec![0u8; max_record_len].into_boxed_slice())
    }
}

impl<B: AsRef<[u8]> + AsMut<[u8]>> RecordReassembler<B> {
    /// A reassembler that keeps records in `buf`; the maximum record size
    /// is `buf`'s length. Allocates nothing. `buf.as_ref()` and
    /// `buf.as_mut()` must be the same bytes, as they are for slices,
    /// arrays, `Vec` and `Box<[u8]>`.
    pub fn with_buffer(buf: B) -> Self {
        RecordReassembler {
            buf,
            record_len: 0,
            record_started: false,
            marker_bytes: [0; RecordMarker::LEN],
            state: ReassemblyState::Marker { have: 0 },
        }
    }

    /// The largest record accepted.
    pub fn max_record_len(&self) -> usize {
        self.buf.as_ref().len()
    }

    /// Gives back the record buffer.
    pub fn into_buffer(self) -> B {
        self.buf
    }

    /// Whether bytes of an unfinished record (or of its fragment header) are
    /// held. At the end of a stream this means the peer sent a truncated
    /// record.
    pub fn is_mid_record(&self) -> bool {
        match self.state {
            ReassemblyState::Marker { have } => have != 0 || self.record_started,
            ReassemblyState::Fragment { .. } => true,
            ReassemblyState::Complete | ReassemblyState::Failed(_) => false,
        }
    }

    /// Forgets any partial or unpolled record and any error, ready for a
    /// new stream.
    pub fn reset(&mut self) {
        self.record_len = 0;
        self.record_started = false;
        self.state = ReassemblyState::Marker { have: 0 };
    }

    /// Takes stream bytes from the start of `input`, up to the end of the
    /// next complete record, and returns how many it took. When it returns
    /// less than `input.len()`, a record is complete: call
    /// [`poll_record`](Self::poll_record), then push the rest. While a
    /// complete record waits to be polled, `push` takes nothing.
    ///
    /// # Errors
    /// [`Error::LimitExceeded`] when a fragment header announces more data
    /// than the maximum record size leaves room for. The error is sticky:
    /// record boundaries are lost, so every later `push` fails the same way
    /// until [`reset`](Self::reset); the connection should be closed.
    pub fn push(&mut self, input: &[u8]) -> Result<usize> {
        let mut rest = input;
        loop {
            match self.state {
                ReassemblyState::Failed(e) => return Err(e),
                ReassemblyState::Complete => break,
                ReassemblyState::Marker { have } => {
                    if rest.is_empty() {
                        break;
                    }
                    let take = (RecordMarker::LEN - have).min(rest.len());
                    self.marker_bytes[have..have + take].copy_from_slice(&rest[..take]);
                    rest = &rest[take..];
                    let have = have + take;
                    if have < RecordMarker::LEN {
                        self.state = ReassemblyState::Marker { have };
                        break;
                    }
                    let marker = RecordMarker::from_word(u32::from_be_bytes(self.marker_bytes));
                    self.start_fragment(marker)?;
                }
                ReassemblyState::Fragment { left, last } => {
                    if rest.is_empty() {
                        break;
                    }
                    let take = left.min(rest.len());
                    self.buf.as_mut()[self.record_len..self.record_len + take]
                        .copy_from_slice(&rest[..take]);
                    self.record_len += take;
                    rest = &rest[take..];
                    self.state = if take < left {
                        ReassemblyState::Fragment {
                            left: left - take,
                            last,
                        }
                    } else {
                        Self::after_fragment(last)
                    };
                }
            }
        }
        Ok(input.len() - rest.len())
    }

    /// Checks a complete fragment header against the room left, before any
    /// of its data is taken.
    fn start_fragment(&mut self, marker: RecordMarker) -> Result<()> {
        let room = self.max_record_len() - self.record_len;
        if marker.fragment_len() > room {
            self.state = ReassemblyState::Failed(Error::LimitExceeded);
            return Err(Error::LimitExceeded);
        }
        self.record_started = true;
        self.state = if marker.fragment_len() == 0 {
            Self::after_fragment(marker.is_last())
        } else {
            ReassemblyState::Fragment {
                left: marker.fragment_len(),
                last: marker.is_last(),
            }
        };
        Ok(())
    }

    /// Where the current fragment's next bytes go, for a reader that reads
    /// the stream straight into the record rather than through a buffer of
    /// its own (one copy less for bulk data): at most the bytes the
    /// fragment still has. `None` between fragments (a header comes next)
    /// and while a complete record waits to be polled.
    pub fn fragment_space(&mut self) -> Option<&mut [u8]> {
        match self.state {
            ReassemblyState::Fragment { left, .. } => {
                Some(&mut self.buf.as_mut()[self.record_len..self.record_len + left])
            }
            _ => None,
        }
    }

    /// `n` bytes were written at the start of
    /// [`fragment_space`](Self::fragment_space) (more than it offered are
    /// not counted).
    pub fn fragment_filled(&mut self, n: usize) {
        if let ReassemblyState::Fragment { left, last } = self.state {
            let n = n.min(left);
            self.record_len += n;
            self.state = if n < left {
                ReassemblyState::Fragment {
                    left: left - n,
                    last,
                }
            } else {
                Self::after_fragment(last)
            };
        }
    }

    fn after_fragment(last: bool) -> ReassemblyState {
        if last {
            ReassemblyState::Complete
        } else {
            ReassemblyState::Marker { have: 0 }
        }
    }

    /// The next complete record, once. The slice is valid until the next
    /// call that takes `&mut self`; pushing more bytes starts the next
    /// record.
    pub fn poll_record(&mut self) -> Option<&[u8]> {
        if self.state != ReassemblyState::Complete {
            return None;
        }
        let len = self.record_len;
        self.record_len = 0;
        self.record_started = false;
        self.state = ReassemblyState::Marker { have: 0 };
        Some(&self.buf.as_ref()[..len])
    }

    /// [`poll_record`](Self::poll_record), with the record writable: a
    /// relay rewrites a field (its XID) in place instead of copying the
    /// record.
    pub fn poll_record_mut(&mut self) -> Option<&mut [u8]> {
        if self.state != ReassemblyState::Complete {
            return None;
        }
        let len = self.record_len;
        self.record_len = 0;
        self.record_started = false;
        self.state = ReassemblyState::Marker { have: 0 };
        Some(&mut self.buf.as_mut()[..len])
    }
}

/// Emits `$value`, checks the emitted length against `buffer_len` and the
/// parsed length, and parses the emitted bytes back with `$parse`. A macro
/// rather than a generic fn: the re-parsed value borrows a local buffer, so
/// it has a shorter lifetime than `$value` and only a concrete type can
/// compare the two.
macro_rules! fuzz_round_trip {
    ($value:expr, $parsed_len:expr, |$bytes:ident| $parse:expr) => {{
        let mut out = [0u8; MAX_CALL_HEADER_LEN];
        let mut enc = Encoder::new(&mut out);
        $value.emit(&mut enc).expect("a parsed value re-emits");
        let written = enc.position();
        assert_eq!(written, $parsed_len, "emitted length != parsed length");
        assert_eq!(written, $value.buffer_len(), "emitted length != buffer_len");
        let $bytes: &[u8] = &out[..written];
        let (again, again_len) = $parse.expect("emitted bytes parse");
        assert_eq!(again, $value, "round trip changed the value");
        assert_eq!(again_len, written);
    }};
}

/// Fuzz entry point: runs every parser of this module over `data` and
/// checks what must hold for any input.
///
/// - Every header parser (`RpcMessage`, `CallHeader`, `ReplyHeader`,
///   `OpaqueAuth`, `AuthSys`, `RecordMarker`) and the peek helpers return
///   instead of panicking.
/// - Whatever parses re-emits into exactly `buffer_len` bytes, that length
///   equals the parsed header length, and the emitted bytes parse back to
///   an equal value.
/// - A [`RecordReassembler`] fed `data` in chunks whose sizes come from
///   `data` yields exactly the records, and the error, that walking the
///   fragment headers of `data` directly gives.
///
/// # Panics
/// Only when one of those properties fails, i.e. when this codec is wrong.
///
/// # Allocation
/// None: the reassembler works in a stack buffer, so a fuzz harness or test
/// with a counting global allocator can assert zero allocations around it.
pub fn fuzz_parse(data: &[u8]) {
    let _ = (peek_xid(data), peek_direction(data), peek_rpc_version(data));

    if let Ok((m, len)) = RpcMessage::parse(data) {
        fuzz_round_trip!(m, len, |b| RpcMessage::parse(b));
        assert_eq!(peek_xid(data), Some(m.xid()));
        assert_eq!(peek_direction(data), Some(m.direction()));
    }
    if let Ok((c, len)) = CallHeader::parse(data) {
        fuzz_round_trip!(c, len, |b| CallHeader::parse(b));
        assert_eq!(peek_rpc_version(data), Some(c.rpc_version));
    }
    if let Ok((r, len)) = ReplyHeader::parse(data) {
        fuzz_round_trip!(r, len, |b| ReplyHeader::parse(b));
    }
    let mut d = Decoder::new(data);
    match OpaqueAuth::decode(&mut d) {
        Ok(a) => fuzz_round_trip!(a, d.position(), |b| {
            let mut d = Decoder::new(b);
            OpaqueAuth::decode(&mut d).map(|a| (a, d.position()))
        }),
        Err(_) => assert_eq!(d.position(), 0, "decoder moved on error"),
    }
    if let Ok(s) = AuthSys::parse(data) {
        fuzz_round_trip!(s, data.len(), |b| AuthSys::parse(b).map(|s| (s, b.len())));
    }
    if let Ok(m) = RecordMarker::parse(data) {
        let mut out = [0u8; RecordMarker::LEN];
        m.emit(&mut out).expect("a marker fits four bytes");
        assert_eq!(&out[..], &data[..RecordMarker::LEN]);
    }
    fuzz_reassembly(data);
}

/// Outcome of walking one record's fragment headers straight from the
/// input, the reference the reassembler is checked against.
#[derive(Debug, PartialEq, Eq)]
enum RecordWalk {
    /// A whole record of `len` bytes whose framing ends at input offset
    /// `end`.
    Complete { end: usize, len: usize },
    /// A fragment header takes the record over the maximum.
    TooLong,
    /// The input ends first.
    Incomplete,
}

/// Walks the record whose first fragment header is at `data[start..]`,
/// checking its data against `expect` (the reassembler's record, if any).
fn walk_record(data: &[u8], start: usize, max: usize, expect: Option<&[u8]>) -> RecordWalk {
    let mut pos = start;
    let mut len = 0usize;
    loop {
        let Ok(marker) = RecordMarker::parse(&data[pos..]) else {
            return RecordWalk::Incomplete;
        };
        pos += RecordMarker::LEN;
        let flen = marker.fragment_len();
        if flen > max - len {
            return RecordWalk::TooLong;
        }
        let Some(fragment) = data.get(pos..pos + flen) else {
            return RecordWalk::Incomplete;
        };
        if let Some(record) = expect {
            assert_eq!(record.get(len..len + flen), Some(fragment), "fragment data");
        }
        pos += flen;
        len += flen;
        if marker.is_last() {
            return RecordWalk::Complete { end: pos, len };
        }
    }
}

/// Fuzz entry point for record marking alone: the first byte picks the
/// maximum record size (times four), the rest is fed to a
/// [`RecordReassembler`] in chunks whose sizes the input also picks, and
/// every record it yields is checked against walking the fragment headers
/// directly. Panics only when the reassembler and the walk disagree.
pub fn fuzz_reassembly(data: &[u8]) {
    let Some((&first, _)) = data.split_first() else {
        return;
    };
    let max = usize::from(first) * 4;
    let mut storage = [0u8; 255 * 4];
    let mut reassembler = RecordReassembler::with_buffer(&mut storage[..max]);
    let mut walked = 0usize;
    let mut fed = 0usize;
    let mut chunk_no = 0usize;
    while fed < data.len() {
        let chunk_len = usize::from(data[chunk_no % data.len()] % 17) + 1;
        chunk_no += 1;
        let chunk = &data[fed..(fed + chunk_len).min(data.len())];
        fed += chunk.len();
        let mut off = 0;
        while off < chunk.len() {
            let used = match reassembler.push(&chunk[off..]) {
                Ok(used) => used,
                Err(e) => {
                    assert_eq!(e, Error::LimitExceeded);
                    assert_eq!(walk_record(data, walked, max, None), RecordWalk::TooLong);
                    assert_eq!(reassembler.push(&[0]), Err(Error::LimitExceeded));
                    return;
                }
            };
            off += used;
            match reassembler.poll_record() {
                Some(record) => {
                    let len = record.len();
                    assert!(len <= max);
                    match walk_record(data, walked, max, Some(record)) {
                        RecordWalk::Complete { end, len: wlen } => {
                            assert_eq!(wlen, len, "record length");
                            assert_eq!(end, fed - chunk.len() + off, "record end");
                            walked = end;
                        }
                        other => panic!("reassembler gave a record, walk says {other:?}"),
                    }
                }
                None => assert_eq!(off, chunk.len(), "push stopped without a record"),
            }
        }
    }
    match walk_record(data, walked, max, None) {
        RecordWalk::Incomplete => {
            assert_eq!(reassembler.is_mid_record(), walked < data.len());
        }
        other => panic!("all input pushed, walk still finds {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// `OpaqueAuth::decode`'s AUTH_NONE shortcut gives what the
        /// general decode gives, result and decoder position, on inputs
        /// that take it and on near misses (any word pair, bytes cut
        /// short, a decoder not at the start).
        #[test]
        fn auth_none_shortcut_decodes_as_the_general_path(
            lead in 0usize..3,
            flavor in prop_oneof![Just(0u32), Just(1), any::<u32>()],
            len in prop_oneof![Just(0u32), Just(4), any::<u32>()],
            body in proptest::collection::vec(any::<u8>(), 0..24),
            cut in proptest::option::of(0usize..40),
        ) {
            let mut bytes = vec![0u8; 4 * lead];
            bytes.extend_from_slice(&flavor.to_be_bytes());
            bytes.extend_from_slice(&len.to_be_bytes());
            bytes.extend_from_slice(&body);
            if let Some(n) = cut {
                bytes.truncate(n);
            }
            let (mut a, mut b) = (Decoder::new(&bytes), Decoder::new(&bytes));
            for d in [&mut a, &mut b] {
                d.skip((4 * lead).min(bytes.len())).unwrap();
            }
            let fast = OpaqueAuth::decode(&mut a);
            let general = OpaqueAuth::decode_general(&mut b);
            prop_assert_eq!(fast, general);
            prop_assert_eq!(a.position(), b.position());
        }
    }

    // Golden messages, assembled by hand from the XDR of RFC 5531 s9,
    // s8.2 and appendix A, one XDR word per line.

    /// NFSv3 NULL call with AUTH_NONE credential and verifier.
    #[rustfmt::skip]
    const CALL_NULL_AUTH_NONE: [u8; 40] = [
        0x12, 0x34, 0x56, 0x78, // xid
        0x00, 0x00, 0x00, 0x00, // msg_type CALL
        0x00, 0x00, 0x00, 0x02, // rpcvers 2
        0x00, 0x01, 0x86, 0xa3, // prog 100003 (NFS)
        0x00, 0x00, 0x00, 0x03, // vers 3
        0x00, 0x00, 0x00, 0x00, // proc 0 (NULL)
        0x00, 0x00, 0x00, 0x00, // cred.flavor AUTH_NONE
        0x00, 0x00, 0x00, 0x00, // cred.body length 0
        0x00, 0x00, 0x00, 0x00, // verf.flavor AUTH_NONE
        0x00, 0x00, 0x00, 0x00, // verf.body length 0
    ];

    /// NFSv3 GETATTR call with AUTH_SYS: machine name "host1" (5 bytes, 3
    /// bytes of padding), 3 group ids.
    #[rustfmt::skip]
    const CALL_AUTH_SYS: [u8; 80] = [
        0x00, 0x00, 0x01, 0x01, // xid
        0x00, 0x00, 0x00, 0x00, // msg_type CALL
        0x00, 0x00, 0x00, 0x02, // rpcvers 2
        0x00, 0x01, 0x86, 0xa3, // prog 100003
        0x00, 0x00, 0x00, 0x03, // vers 3
        0x00, 0x00, 0x00, 0x01, // proc 1 (GETATTR)
        0x00, 0x00, 0x00, 0x01, // cred.flavor AUTH_SYS
        0x00, 0x00, 0x00, 0x28, // cred.body length 40
        0x5f, 0x5e, 0x10, 0x00, //   stamp
        0x00, 0x00, 0x00, 0x05, //   machinename length 5
        b'h', b'o', b's', b't', //   machinename
        b'1', 0x00, 0x00, 0x00, //   ... and padding
        0x00, 0x00, 0x03, 0xe8, //   uid 1000
        0x00, 0x00, 0x03, 0xe8, //   gid 1000
        0x00, 0x00, 0x00, 0x03, //   gids count 3
        0x00, 0x00, 0x00, 0x04, //   gids[0] 4
        0x00, 0x00, 0x00, 0x18, //   gids[1] 24
        0x00, 0x00, 0x03, 0xe9, //   gids[2] 1001
        0x00, 0x00, 0x00, 0x00, // verf.flavor AUTH_NONE
        0x00, 0x00, 0x00, 0x00, // verf.body length 0
    ];

    /// A call whose credential (RPCSEC_GSS) and verifier (flavor 300) are
    /// kept opaque.
    #[rustfmt::skip]
    const CALL_OPAQUE_FLAVORS: [u8; 52] = [
        0xca, 0xfe, 0xf0, 0x0d, // xid
        0x00, 0x00, 0x00, 0x00, // msg_type CALL
        0x00, 0x00, 0x00, 0x02, // rpcvers 2
        0x00, 0x01, 0x86, 0xa5, // prog 100005 (MOUNT)
        0x00, 0x00, 0x00, 0x03, // vers 3
        0x00, 0x00, 0x00, 0x05, // proc 5 (EXPORT)
        0x00, 0x00, 0x00, 0x06, // cred.flavor RPCSEC_GSS
        0x00, 0x00, 0x00, 0x07, // cred.body length 7
        0x01, 0x02, 0x03, 0x04, //   body
        0x05, 0x06, 0x07, 0x00, //   ... and padding
        0x00, 0x00, 0x01, 0x2c, // verf.flavor 300
        0x00, 0x00, 0x00, 0x04, // verf.body length 4
        0xaa, 0xbb, 0xcc, 0xdd, //   body
    ];

    /// The first five words of every accepted reply with an AUTH_NONE
    /// verifier are the same; the accept_stat words follow.
    macro_rules! accepted_reply_bytes {
        ($($tail:expr),*) => {
            [
                0x12, 0x34, 0x56, 0x78, // xid
                0x00, 0x00, 0x00, 0x01, // msg_type REPLY
                0x00, 0x00, 0x00, 0x00, // reply_stat MSG_ACCEPTED
                0x00, 0x00, 0x00, 0x00, // verf.flavor AUTH_NONE
                0x00, 0x00, 0x00, 0x00, // verf.body length 0
                $($tail),*
            ]
        };
    }

    const REPLY_SUCCESS: [u8; 24] = accepted_reply_bytes!(0, 0, 0, 0);
    const REPLY_PROG_UNAVAIL: [u8; 24] = accepted_reply_bytes!(0, 0, 0, 1);
    #[rustfmt::skip]
    const REPLY_PROG_MISMATCH: [u8; 32] = accepted_reply_bytes!(
        0, 0, 0, 2, // accept_stat PROG_MISMATCH
        0, 0, 0, 2, // low 2
        0, 0, 0, 3  // high 3
    );
    const REPLY_PROC_UNAVAIL: [u8; 24] = accepted_reply_bytes!(0, 0, 0, 3);
    const REPLY_GARBAGE_ARGS: [u8; 24] = accepted_reply_bytes!(0, 0, 0, 4);
    const REPLY_SYSTEM_ERR: [u8; 24] = accepted_reply_bytes!(0, 0, 0, 5);

    #[rustfmt::skip]
    const REPLY_DENIED_RPC_MISMATCH: [u8; 24] = [
        0x12, 0x34, 0x56, 0x78, // xid
        0x00, 0x00, 0x00, 0x01, // msg_type REPLY
        0x00, 0x00, 0x00, 0x01, // reply_stat MSG_DENIED
        0x00, 0x00, 0x00, 0x00, // reject_stat RPC_MISMATCH
        0x00, 0x00, 0x00, 0x02, // low 2
        0x00, 0x00, 0x00, 0x02, // high 2
    ];

    #[rustfmt::skip]
    const REPLY_DENIED_AUTH_BADCRED: [u8; 20] = [
        0x12, 0x34, 0x56, 0x78, // xid
        0x00, 0x00, 0x00, 0x01, // msg_type REPLY
        0x00, 0x00, 0x00, 0x01, // reply_stat MSG_DENIED
        0x00, 0x00, 0x00, 0x01, // reject_stat AUTH_ERROR
        0x00, 0x00, 0x00, 0x01, // auth_stat AUTH_BADCRED
    ];

    const XID: u32 = 0x1234_5678;
    const GIDS: [u32; 3] = [4, 24, 1001];

    fn call_null_auth_none() -> CallHeader<'static> {
        CallHeader::new(XID, 100_003, 3, 0, OpaqueAuth::None, OpaqueAuth::None)
    }

    fn call_auth_sys() -> CallHeader<'static> {
        let sys = AuthSys::new(0x5f5e_1000, b"host1", 1000, 1000, &GIDS).unwrap();
        CallHeader::new(0x101, 100_003, 3, 1, OpaqueAuth::Sys(sys), OpaqueAuth::None)
    }

    fn call_opaque_flavors() -> CallHeader<'static> {
        CallHeader::new(
            0xcafe_f00d,
            100_005,
            3,
            5,
            OpaqueAuth::Other {
                flavor: AuthFlavor::RPCSEC_GSS,
                body: &[1, 2, 3, 4, 5, 6, 7],
            },
            OpaqueAuth::Other {
                flavor: AuthFlavor(300),
                body: &[0xaa, 0xbb, 0xcc, 0xdd],
            },
        )
    }

    fn accepted(status: AcceptStatus) -> RpcMessage<'static> {
        RpcMessage::Reply(ReplyHeader::accepted(XID, OpaqueAuth::None, status))
    }

    fn denied(reason: RejectedReply) -> RpcMessage<'static> {
        RpcMessage::Reply(ReplyHeader::denied(XID, reason))
    }

    /// Every golden message with the header it encodes.
    fn goldens() -> [(&'static str, &'static [u8], RpcMessage<'static>); 11] {
        [
            (
                "call NULL AUTH_NONE",
                &CALL_NULL_AUTH_NONE,
                RpcMessage::Call(call_null_auth_none()),
            ),
            (
                "call AUTH_SYS",
                &CALL_AUTH_SYS,
                RpcMessage::Call(call_auth_sys()),
            ),
            (
                "call opaque flavors",
                &CALL_OPAQUE_FLAVORS,
                RpcMessage::Call(call_opaque_flavors()),
            ),
            ("SUCCESS", &REPLY_SUCCESS, accepted(AcceptStatus::Success)),
            (
                "PROG_UNAVAIL",
                &REPLY_PROG_UNAVAIL,
                accepted(AcceptStatus::ProgUnavail),
            ),
            (
                "PROG_MISMATCH",
                &REPLY_PROG_MISMATCH,
                accepted(AcceptStatus::ProgMismatch { low: 2, high: 3 }),
            ),
            (
                "PROC_UNAVAIL",
                &REPLY_PROC_UNAVAIL,
                accepted(AcceptStatus::ProcUnavail),
            ),
            (
                "GARBAGE_ARGS",
                &REPLY_GARBAGE_ARGS,
                accepted(AcceptStatus::GarbageArgs),
            ),
            (
                "SYSTEM_ERR",
                &REPLY_SYSTEM_ERR,
                accepted(AcceptStatus::SystemErr),
            ),
            (
                "denied RPC_MISMATCH",
                &REPLY_DENIED_RPC_MISMATCH,
                denied(RejectedReply::RPC_VERSION_MISMATCH),
            ),
            (
                "denied AUTH_BADCRED",
                &REPLY_DENIED_AUTH_BADCRED,
                denied(RejectedReply::AuthError(AuthStat::BadCred)),
            ),
        ]
    }

    fn emit_to_vec(m: &RpcMessage<'_>) -> Vec<u8> {
        let mut buf = vec![0u8; MAX_CALL_HEADER_LEN];
        let mut enc = Encoder::new(&mut buf);
        m.emit(&mut enc).unwrap();
        let n = enc.position();
        buf.truncate(n);
        buf
    }

    fn set_word(bytes: &mut [u8], offset: usize, value: u32) {
        bytes[offset..offset + 4].copy_from_slice(&value.to_be_bytes());
    }

    #[test]
    fn golden_deconstruct() {
        // Field by field, without going through the expected Repr.
        let (m, len) = RpcMessage::parse(&CALL_AUTH_SYS).unwrap();
        assert_eq!(len, 80);
        let RpcMessage::Call(c) = m else {
            panic!("not a call")
        };
        assert_eq!(c.xid, 0x101);
        assert_eq!(c.rpc_version, 2);
        assert!(c.is_supported_version());
        assert_eq!((c.program, c.version, c.procedure), (100_003, 3, 1));
        let OpaqueAuth::Sys(sys) = c.credential else {
            panic!("not AUTH_SYS")
        };
        assert_eq!(sys.stamp(), 0x5f5e_1000);
        assert_eq!(sys.machine_name(), b"host1");
        assert_eq!((sys.uid(), sys.gid()), (1000, 1000));
        assert_eq!(sys.gids(), &GIDS);
        assert_eq!(c.verifier, OpaqueAuth::None);

        // One buffer for the parse and the address check: each use of a
        // `const` is its own value, so `&CONST[i]` in two places need not
        // be one address (Miri gives them two).
        let input = CALL_OPAQUE_FLAVORS;
        let (c, _) = CallHeader::parse(&input).unwrap();
        assert_eq!(c.credential.flavor(), AuthFlavor::RPCSEC_GSS);
        let OpaqueAuth::Other { body, .. } = c.credential else {
            panic!("not opaque")
        };
        assert_eq!(body, &[1, 2, 3, 4, 5, 6, 7]);
        // Zero copy: the body borrows the input.
        assert!(core::ptr::eq(&body[0], &input[32]));

        let (r, len) = ReplyHeader::parse(&REPLY_PROG_MISMATCH).unwrap();
        assert_eq!(len, 32);
        assert_eq!(r.xid, XID);
        assert!(!r.is_success());
        let ReplyBody::Accepted(a) = r.body else {
            panic!("not accepted")
        };
        assert_eq!(a.status, AcceptStatus::ProgMismatch { low: 2, high: 3 });
        assert_eq!(a.status.to_wire(), 2);

        let (r, _) = ReplyHeader::parse(&REPLY_DENIED_AUTH_BADCRED).unwrap();
        assert_eq!(
            r.body,
            ReplyBody::Denied(RejectedReply::AuthError(AuthStat::BadCred))
        );
    }

    #[test]
    fn golden_parse_emit_buffer_len() {
        for (name, bytes, expected) in goldens() {
            let (m, len) = RpcMessage::parse(bytes).unwrap();
            assert_eq!(m, expected, "{name}: parse");
            assert_eq!(len, bytes.len(), "{name}: header length");
            assert_eq!(expected.buffer_len(), bytes.len(), "{name}: buffer_len");
            assert_eq!(emit_to_vec(&expected), bytes, "{name}: emit");
            assert_eq!(peek_xid(bytes), Some(expected.xid()), "{name}");
            assert_eq!(peek_direction(bytes), Some(expected.direction()), "{name}");
            // The direction-specific parsers agree, and refuse the other
            // direction.
            match expected {
                RpcMessage::Call(c) => {
                    assert_eq!(CallHeader::parse(bytes), Ok((c, bytes.len())), "{name}");
                    assert_eq!(ReplyHeader::parse(bytes), Err(Error::Malformed), "{name}");
                    assert_eq!(peek_rpc_version(bytes), Some(2));
                }
                RpcMessage::Reply(r) => {
                    assert_eq!(ReplyHeader::parse(bytes), Ok((r, bytes.len())), "{name}");
                    assert_eq!(CallHeader::parse(bytes), Err(Error::Malformed), "{name}");
                    assert_eq!(peek_rpc_version(bytes), None);
                }
            }
            fuzz_parse(bytes);
        }
    }

    #[test]
    fn body_follows_header() {
        let mut msg = CALL_AUTH_SYS.to_vec();
        msg.extend_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
        let (call, len) = CallHeader::parse(&msg).unwrap();
        assert_eq!(call, call_auth_sys());
        assert_eq!(&msg[len..], &[0xde, 0xad, 0xbe, 0xef]);

        let mut d = Decoder::new(&msg);
        RpcMessage::decode(&mut d).unwrap();
        assert_eq!(d.rest(), &[0xde, 0xad, 0xbe, 0xef]);

        let mut reply = REPLY_SUCCESS.to_vec();
        reply.extend_from_slice(&[0, 0, 0, 0]);
        let (r, len) = ReplyHeader::parse(&reply).unwrap();
        assert!(r.is_success());
        assert_eq!(len, 24);
    }

    #[test]
    fn truncated_at_every_offset_is_an_error() {
        for (name, bytes, _) in goldens() {
            for cut in 0..bytes.len() {
                let part = &bytes[..cut];
                assert_eq!(
                    RpcMessage::parse(part),
                    Err(Error::Truncated),
                    "{name} cut at {cut}"
                );
                assert!(CallHeader::parse(part).is_err(), "{name} cut at {cut}");
                assert!(ReplyHeader::parse(part).is_err(), "{name} cut at {cut}");
                let mut d = Decoder::new(part);
                assert!(RpcMessage::decode(&mut d).is_err());
                assert_eq!(d.position(), 0, "decoder moved on error");
                fuzz_parse(part);
            }
        }
    }

    #[test]
    fn emit_into_short_buffer_writes_nothing() {
        for (name, bytes, m) in goldens() {
            for len in 0..bytes.len() {
                let mut buf = vec![0xEEu8; len];
                let mut enc = Encoder::new(&mut buf);
                assert_eq!(m.emit(&mut enc), Err(Error::BufferTooShort), "{name}");
                assert_eq!(enc.position(), 0, "{name}");
                assert!(buf.iter().all(|&b| b == 0xEE), "{name}: wrote on error");
            }
        }
    }

    #[test]
    fn peek_helpers() {
        assert_eq!(peek_xid(&[]), None);
        assert_eq!(peek_xid(&[1, 2, 3]), None);
        assert_eq!(peek_xid(&[1, 2, 3, 4]), Some(0x0102_0304));
        assert_eq!(peek_direction(&CALL_NULL_AUTH_NONE[..7]), None);
        assert_eq!(
            peek_direction(&CALL_NULL_AUTH_NONE[..8]),
            Some(MessageType::Call)
        );
        assert_eq!(peek_direction(&REPLY_SUCCESS), Some(MessageType::Reply));
        let mut bad = REPLY_SUCCESS;
        set_word(&mut bad, 4, 2);
        assert_eq!(peek_direction(&bad), None);
        assert_eq!(peek_rpc_version(&CALL_NULL_AUTH_NONE[..11]), None);
        assert_eq!(peek_rpc_version(&CALL_NULL_AUTH_NONE[..12]), Some(2));
    }

    #[test]
    fn rpc_version_other_than_2_parses_for_rpc_mismatch() {
        let mut msg = CALL_NULL_AUTH_NONE;
        set_word(&mut msg, 8, 3);
        let (c, _) = CallHeader::parse(&msg).unwrap();
        assert_eq!(c.rpc_version, 3);
        assert!(!c.is_supported_version());
        // Round-trips with the version it came with.
        let again = emit_to_vec(&RpcMessage::Call(c));
        assert_eq!(again, msg);
        // Even when the rest does not parse, the version can be seen.
        assert_eq!(peek_rpc_version(&msg[..12]), Some(3));
        assert_eq!(peek_xid(&msg[..12]), Some(XID));
        // The answer a server sends.
        let answer = ReplyHeader::denied(c.xid, RejectedReply::RPC_VERSION_MISMATCH);
        assert_eq!(
            emit_to_vec(&RpcMessage::Reply(answer)),
            REPLY_DENIED_RPC_MISMATCH
        );
    }

    #[test]
    fn unknown_discriminants_are_errors() {
        // msg_type
        for v in [2, 0x7fff_ffff, 0xffff_ffff] {
            let mut m = CALL_NULL_AUTH_NONE;
            set_word(&mut m, 4, v);
            assert_eq!(RpcMessage::parse(&m), Err(Error::UnknownValue));
            assert_eq!(CallHeader::parse(&m), Err(Error::UnknownValue));
            assert_eq!(ReplyHeader::parse(&m), Err(Error::UnknownValue));
        }
        // reply_stat
        let mut m = REPLY_SUCCESS;
        set_word(&mut m, 8, 2);
        assert_eq!(RpcMessage::parse(&m), Err(Error::UnknownValue));
        // accept_stat
        for v in [6, 0xffff_ffff] {
            let mut m = REPLY_SUCCESS;
            set_word(&mut m, 20, v);
            assert_eq!(RpcMessage::parse(&m), Err(Error::UnknownValue));
        }
        // reject_stat
        let mut m = REPLY_DENIED_AUTH_BADCRED;
        set_word(&mut m, 12, 2);
        assert_eq!(RpcMessage::parse(&m), Err(Error::UnknownValue));
        // auth_stat: 0..=14 are defined, 15 is not.
        for v in 0..=14 {
            let mut m = REPLY_DENIED_AUTH_BADCRED;
            set_word(&mut m, 16, v);
            let (r, _) = ReplyHeader::parse(&m).unwrap();
            let ReplyBody::Denied(RejectedReply::AuthError(stat)) = r.body else {
                panic!("not AUTH_ERROR")
            };
            assert_eq!(stat.to_wire(), v);
            assert_eq!(emit_to_vec(&RpcMessage::Reply(r)), m);
        }
        for v in [15, 0xffff_ffff] {
            let mut m = REPLY_DENIED_AUTH_BADCRED;
            set_word(&mut m, 16, v);
            assert_eq!(RpcMessage::parse(&m), Err(Error::UnknownValue));
            assert_eq!(AuthStat::from_wire(v), Err(Error::UnknownValue));
        }
    }

    /// Offsets into `CALL_AUTH_SYS`.
    const CRED_LEN_AT: usize = 28;
    const NAME_LEN_AT: usize = 36;
    const GIDS_COUNT_AT: usize = 56;

    #[test]
    fn hostile_lengths_and_counts() {
        for (at, v) in [
            (CRED_LEN_AT, 0xffff_ffff),
            (CRED_LEN_AT, 401),
            (NAME_LEN_AT, 0xffff_ffff),
            (NAME_LEN_AT, 256),
            (GIDS_COUNT_AT, 0xffff_ffff),
            (GIDS_COUNT_AT, 17),
            (GIDS_COUNT_AT, 4), // more than the body holds
        ] {
            let mut m = CALL_AUTH_SYS;
            set_word(&mut m, at, v);
            assert_eq!(
                RpcMessage::parse(&m),
                Err(Error::LimitExceeded),
                "word at {at} = {v:#x}"
            );
            fuzz_parse(&m);
        }
        // A machine name running past the end of the 40-byte body: the
        // body is complete, so this is Malformed rather than Truncated.
        let mut m = CALL_AUTH_SYS;
        set_word(&mut m, NAME_LEN_AT, 41);
        assert_eq!(RpcMessage::parse(&m), Err(Error::Malformed));
        // A verifier length of 0xFFFFFFFF, in a call and in a reply.
        let mut m = CALL_NULL_AUTH_NONE;
        set_word(&mut m, 36, 0xffff_ffff);
        assert_eq!(RpcMessage::parse(&m), Err(Error::LimitExceeded));
        let mut m = REPLY_SUCCESS;
        set_word(&mut m, 16, 0xffff_ffff);
        assert_eq!(RpcMessage::parse(&m), Err(Error::LimitExceeded));
    }

    /// An AUTH_SYS call with `gids` group ids, all present on the wire.
    fn auth_sys_call_with_gids(gids: u32) -> Vec<u8> {
        let mut m = CALL_AUTH_SYS[..GIDS_COUNT_AT].to_vec();
        m.extend_from_slice(&gids.to_be_bytes());
        for g in 0..gids {
            m.extend_from_slice(&g.to_be_bytes());
        }
        m.extend_from_slice(&[0; 8]); // verifier AUTH_NONE
        let body_len = m.len() - 8 - (CRED_LEN_AT + 4);
        set_word(&mut m, CRED_LEN_AT, body_len as u32);
        m
    }

    #[test]
    fn sixteen_gids_fit_seventeen_do_not() {
        let m = auth_sys_call_with_gids(16);
        let (c, len) = CallHeader::parse(&m).unwrap();
        assert_eq!(len, m.len());
        let OpaqueAuth::Sys(sys) = c.credential else {
            panic!("not AUTH_SYS")
        };
        assert_eq!(sys.gids().len(), 16);
        assert_eq!(emit_to_vec(&RpcMessage::Call(c)), m);

        let m = auth_sys_call_with_gids(17);
        assert_eq!(CallHeader::parse(&m), Err(Error::LimitExceeded));
        assert_eq!(
            AuthSys::new(0, b"", 0, 0, &[0; 17]),
            Err(Error::LimitExceeded)
        );
        assert_eq!(
            AuthSys::new(0, &[b'a'; 256], 0, 0, &[]),
            Err(Error::LimitExceeded)
        );
        assert!(AuthSys::new(0, &[b'a'; 255], 0, 0, &[0; 16]).is_ok());
    }

    #[test]
    fn auth_body_of_401_bytes_is_refused() {
        let mut m = CALL_NULL_AUTH_NONE[..24].to_vec();
        m.extend_from_slice(&[0, 0, 0, 6, 0, 0, 0x01, 0x91]); // RPCSEC_GSS, 401
        m.extend_from_slice(&[0x55; 404]);
        m.extend_from_slice(&[0; 8]);
        assert_eq!(RpcMessage::parse(&m), Err(Error::LimitExceeded));
        // 400 is the limit, inclusive.
        let mut m = CALL_NULL_AUTH_NONE[..24].to_vec();
        m.extend_from_slice(&[0, 0, 0, 6, 0, 0, 0x01, 0x90]); // RPCSEC_GSS, 400
        m.extend_from_slice(&[0x55; 400]);
        m.extend_from_slice(&[0; 8]);
        let (c, len) = CallHeader::parse(&m).unwrap();
        assert_eq!(len, m.len());
        assert_eq!(c.buffer_len(), m.len());
        assert_eq!(emit_to_vec(&RpcMessage::Call(c)), m);

        let long = [0u8; 401];
        let too_long = OpaqueAuth::Other {
            flavor: AuthFlavor::RPCSEC_GSS,
            body: &long,
        };
        let mut buf = [0u8; 512];
        assert_eq!(
            too_long.emit(&mut Encoder::new(&mut buf)),
            Err(Error::LimitExceeded)
        );
    }

    #[test]
    fn auth_sys_body_must_hold_exactly_its_fields() {
        // One word too many in the body.
        let mut m = CALL_AUTH_SYS[..CRED_LEN_AT + 4 + 40].to_vec();
        m.extend_from_slice(&[0, 0, 0, 0]);
        m.extend_from_slice(&[0; 8]);
        set_word(&mut m, CRED_LEN_AT, 44);
        assert_eq!(CallHeader::parse(&m), Err(Error::TrailingBytes));
        // One word too few: the body ends inside `gids`. Not `Truncated`:
        // the message is complete, waiting for more would not help.
        let mut m = CALL_AUTH_SYS[..CRED_LEN_AT + 4 + 36].to_vec();
        m.extend_from_slice(&[0; 8]);
        set_word(&mut m, CRED_LEN_AT, 36);
        set_word(&mut m, GIDS_COUNT_AT, 2);
        assert!(CallHeader::parse(&m).is_ok());
        set_word(&mut m, GIDS_COUNT_AT, 3);
        assert_eq!(CallHeader::parse(&m), Err(Error::LimitExceeded));
        let short = &CALL_AUTH_SYS[CRED_LEN_AT + 4..CRED_LEN_AT + 4 + 10];
        assert_eq!(AuthSys::parse(short), Err(Error::Malformed));
        assert_eq!(AuthSys::parse(&[]), Err(Error::Malformed));
    }

    #[test]
    fn auth_none_with_a_body_is_kept() {
        let mut m = CALL_NULL_AUTH_NONE[..24].to_vec();
        m.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 4, 9, 9, 9, 9]);
        m.extend_from_slice(&[0; 8]);
        let (c, _) = CallHeader::parse(&m).unwrap();
        assert_eq!(
            c.credential,
            OpaqueAuth::Other {
                flavor: AuthFlavor::NONE,
                body: &[9, 9, 9, 9]
            }
        );
        assert_eq!(emit_to_vec(&RpcMessage::Call(c)), m);
    }

    #[test]
    fn non_canonical_opaque_auth_is_not_emitted() {
        let mut buf = [0u8; 64];
        for auth in [
            OpaqueAuth::Other {
                flavor: AuthFlavor::NONE,
                body: &[],
            },
            OpaqueAuth::Other {
                flavor: AuthFlavor::SYS,
                body: &[0; 20],
            },
        ] {
            let mut enc = Encoder::new(&mut buf);
            assert_eq!(auth.emit(&mut enc), Err(Error::Malformed));
            let call = CallHeader::new(1, 2, 3, 4, auth, OpaqueAuth::None);
            assert_eq!(call.emit(&mut enc), Err(Error::Malformed));
            let reply = ReplyHeader::accepted(1, auth, AcceptStatus::Success);
            assert_eq!(reply.emit(&mut enc), Err(Error::Malformed));
            assert_eq!(enc.position(), 0);
        }
    }

    // Record marking (RFC 5531 s11).

    /// The record "abcde" sent as two fragments, "abc" then "de" (last).
    #[rustfmt::skip]
    const TWO_FRAGMENT_RECORD: [u8; 13] = [
        0x00, 0x00, 0x00, 0x03, // fragment header: not last, 3 bytes
        b'a', b'b', b'c',
        0x80, 0x00, 0x00, 0x02, // fragment header: last, 2 bytes
        b'd', b'e',
    ];

    #[test]
    fn record_marker_golden() {
        let m = RecordMarker::parse(&TWO_FRAGMENT_RECORD).unwrap();
        assert!(!m.is_last());
        assert_eq!(m.fragment_len(), 3);
        let m = RecordMarker::parse(&TWO_FRAGMENT_RECORD[7..]).unwrap();
        assert!(m.is_last());
        assert_eq!(m.fragment_len(), 2);
        assert_eq!(m.to_word(), 0x8000_0002);
        assert_eq!(RecordMarker::new(2, true), Ok(m));

        let mut buf = [0u8; 4];
        RecordMarker::new(3, false).unwrap().emit(&mut buf).unwrap();
        assert_eq!(buf, TWO_FRAGMENT_RECORD[..4]);
        assert_eq!(
            RecordMarker::new(0x8000_0000, true),
            Err(Error::LimitExceeded)
        );
        let max = RecordMarker::new(RecordMarker::MAX_FRAGMENT_LEN, false).unwrap();
        assert_eq!(max.to_word(), 0x7fff_ffff);
        assert_eq!(RecordMarker::parse(&[0x80, 0, 0]), Err(Error::Truncated));
        assert_eq!(max.emit(&mut [0u8; 3]), Err(Error::BufferTooShort));

        let mut out = [0u8; 8];
        assert_eq!(write_record_header(&mut out, 40), Ok(4));
        assert_eq!(out[..4], [0x80, 0, 0, 40]);
        assert_eq!(
            write_record_header(&mut out, 1 << 31),
            Err(Error::LimitExceeded)
        );
        assert_eq!(
            write_record_header(&mut out[..3], 1),
            Err(Error::BufferTooShort)
        );
    }

    #[test]
    fn reassemble_two_fragments_at_once() {
        let mut r = RecordReassembler::new(16);
        assert_eq!(r.push(&TWO_FRAGMENT_RECORD), Ok(13));
        assert_eq!(r.poll_record(), Some(&b"abcde"[..]));
        assert_eq!(r.poll_record(), None);
        assert!(!r.is_mid_record());
    }

    #[test]
    fn fragment_data_read_straight_into_the_record() {
        // Two fragments ("abc", then "de", last): headers through push,
        // data through fragment_space / fragment_filled, as a reader that
        // reads the socket into the record does.
        let mut r = RecordReassembler::new(16);
        assert!(r.fragment_space().is_none(), "a header comes first");
        assert_eq!(r.push(&TWO_FRAGMENT_RECORD[..4]), Ok(4));
        let space = r.fragment_space().expect("inside the first fragment");
        assert_eq!(space.len(), 3);
        space[..2].copy_from_slice(b"ab");
        r.fragment_filled(2);
        let space = r.fragment_space().unwrap();
        assert_eq!(space.len(), 1);
        space[0] = b'c';
        r.fragment_filled(5); // more than offered: only 1 counts
        assert!(r.fragment_space().is_none(), "the second header is next");
        assert_eq!(r.push(&TWO_FRAGMENT_RECORD[7..11]), Ok(4));
        r.fragment_space().unwrap().copy_from_slice(b"de");
        r.fragment_filled(2);
        assert!(
            r.fragment_space().is_none(),
            "complete, waiting to be polled"
        );
        assert_eq!(r.poll_record_mut().map(|m| &*m), Some(&b"abcde"[..]));
        assert!(!r.is_mid_record());
    }

    #[test]
    fn reassemble_byte_by_byte() {
        let mut r = RecordReassembler::new(5);
        for (i, b) in TWO_FRAGMENT_RECORD.iter().enumerate() {
            assert_eq!(r.poll_record(), None);
            assert_eq!(r.push(core::slice::from_ref(b)), Ok(1), "byte {i}");
            assert!(r.is_mid_record() || i == TWO_FRAGMENT_RECORD.len() - 1);
        }
        assert_eq!(r.poll_record(), Some(&b"abcde"[..]));
    }

    /// Pushes `stream` in chunks of the given sizes (cycled) and returns
    /// the records, joined with '|'.
    fn reassemble_in_chunks(stream: &[u8], max: usize, sizes: &[usize]) -> Vec<u8> {
        let mut r = RecordReassembler::new(max);
        let mut out = Vec::new();
        let mut pos = 0;
        let mut i = 0;
        while pos < stream.len() {
            let end = (pos + sizes[i % sizes.len()]).min(stream.len());
            i += 1;
            let mut chunk = &stream[pos..end];
            pos = end;
            loop {
                let used = r.push(chunk).unwrap();
                chunk = &chunk[used..];
                match r.poll_record() {
                    Some(rec) => {
                        out.extend_from_slice(rec);
                        out.push(b'|');
                    }
                    None => break,
                }
            }
            assert!(chunk.is_empty());
        }
        assert!(!r.is_mid_record());
        out
    }

    #[test]
    fn reassemble_across_split_points() {
        // Three records: "abcde" in two fragments, an empty record, and
        // "xyz" behind a zero-length first fragment.
        let mut stream = TWO_FRAGMENT_RECORD.to_vec();
        stream.extend_from_slice(&[0x80, 0, 0, 0]);
        stream.extend_from_slice(&[0, 0, 0, 0, 0x80, 0, 0, 3, b'x', b'y', b'z']);
        let want = b"abcde||xyz|".to_vec();
        // Every two-way split.
        for cut in 0..=stream.len() {
            assert_eq!(
                reassemble_in_chunks(&stream, 5, &[cut.max(1), stream.len()]),
                want
            );
        }
        // Deterministic pseudo-random chunk sizes (an LCG); proptest covers
        // more in tests/wire_rpc.rs.
        let mut seed = 0x2545_f491_u32;
        for _ in 0..200 {
            let sizes: Vec<usize> = (0..8)
                .map(|_| {
                    seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                    (seed >> 16) as usize % 9 + 1
                })
                .collect();
            assert_eq!(reassemble_in_chunks(&stream, 5, &sizes), want);
        }
        assert_eq!(reassemble_in_chunks(&stream, 5, &[1]), want);
    }

    #[test]
    fn push_stops_at_the_end_of_a_record() {
        let mut stream = TWO_FRAGMENT_RECORD.to_vec();
        stream.extend_from_slice(&TWO_FRAGMENT_RECORD);
        let mut r = RecordReassembler::new(5);
        assert_eq!(r.push(&stream), Ok(13));
        // An unpolled record blocks further input.
        assert_eq!(r.push(&stream[13..]), Ok(0));
        assert_eq!(r.poll_record(), Some(&b"abcde"[..]));
        assert_eq!(r.push(&stream[13..]), Ok(13));
        assert_eq!(r.poll_record(), Some(&b"abcde"[..]));
    }

    #[test]
    fn record_over_the_max_fails_at_its_header() {
        // 0x7FFFFFFF announced: refused as soon as the header is complete,
        // before any data; nothing is buffered.
        let mut r = RecordReassembler::new(1 << 16);
        assert_eq!(r.push(&[0x7f, 0xff, 0xff]), Ok(3));
        assert_eq!(r.push(&[0xff]), Err(Error::LimitExceeded));
        // Sticky: framing is lost.
        assert_eq!(r.push(&[0x80, 0, 0, 0]), Err(Error::LimitExceeded));
        assert_eq!(r.poll_record(), None);
        r.reset();
        assert_eq!(r.push(&[0x80, 0, 0, 1, 7]), Ok(5));
        assert_eq!(r.poll_record(), Some(&[7u8][..]));

        // The limit counts the whole record, across fragments: "abc" fits
        // a 4-byte maximum, "abc" + "de" does not.
        let mut r = RecordReassembler::new(4);
        assert_eq!(r.push(&TWO_FRAGMENT_RECORD[..7]), Ok(7));
        assert_eq!(r.push(&TWO_FRAGMENT_RECORD[7..]), Err(Error::LimitExceeded));
        // Exactly the maximum is fine.
        let mut r = RecordReassembler::new(5);
        assert_eq!(r.push(&TWO_FRAGMENT_RECORD), Ok(13));
        assert_eq!(r.poll_record().map(<[u8]>::len), Some(5));
        assert_eq!(r.max_record_len(), 5);
        fuzz_parse(&[0x7f, 0xff, 0xff, 0xff]);
    }

    #[test]
    fn debug_output_is_readable() {
        let sys = AuthSys::new(1, b"h\xffst", 2, 3, &[4, 5]).unwrap();
        let text = format!("{sys:?}");
        assert!(text.contains(r#"machine_name: "h\xffst""#), "{text}");
        assert!(text.contains("gids: [4, 5]"), "{text}");
        let r = RecordReassembler::with_buffer([0u8; 8]);
        assert!(format!("{r:?}").contains("max_record_len: 8"));
        assert_eq!(r.into_buffer(), [0u8; 8]);
    }

    #[test]
    fn truncated_stream_is_visible() {
        let mut r = RecordReassembler::new(8);
        assert!(!r.is_mid_record());
        r.push(&[0, 0]).unwrap();
        assert!(r.is_mid_record());
        r.reset();
        r.push(&[0, 0, 0, 0]).unwrap(); // empty non-last fragment
        assert!(r.is_mid_record());
        r.push(&[0x80, 0, 0, 2, 1]).unwrap();
        assert!(r.is_mid_record());
        r.push(&[2]).unwrap();
        assert_eq!(r.poll_record(), Some(&[1u8, 2][..]));
        assert!(!r.is_mid_record());
    }
}
