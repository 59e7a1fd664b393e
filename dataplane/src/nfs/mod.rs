//! NFS version 3 and MOUNT version 3 codecs (RFC 1813), enough to test the
//! transport with a real upper layer and for a storage gateway to build on.
//!
//! # Scope
//! Both directions of every message below: a client encodes arguments and
//! decodes results, a server (or a gateway in the middle) decodes
//! arguments and encodes results.
//!
//! | program | procedures with codecs |
//! |---|---|
//! | NFS ([`NFS_PROGRAM`] 100003, version 3) | NULL, GETATTR, LOOKUP, READLINK, READ, WRITE, SYMLINK, READDIRPLUS, COMMIT (RFC 1813 s3.3) |
//! | MOUNT ([`MOUNT_PROGRAM`] 100005, version 3) | all: NULL, MNT, DUMP, UMNT, UMNTALL, EXPORT (RFC 1813 appendix I) |
//!
//! The numbers of the other NFSv3 procedures are in [`Nfs3Proc`]; decoding
//! their arguments or results is [`Error::UnknownValue`]. Shared types:
//! [`Nfsstat3`], [`Ftype3`], [`Fattr3`], post-op attributes
//! (`Option<Fattr3>`), [`WccAttr`] and [`WccData`], [`Sattr3`],
//! [`FileHandle`] (`nfs_fh3`, at most 64 bytes), cookie and write
//! verifiers (`[u8; 8]`), [`StableHow`], READDIRPLUS entry lists
//! ([`EntryList`]).
//!
//! # Shape
//! Every message type implements [`Xdr`]: `decode`/`parse` read it from a
//! borrowed buffer, `buffer_len` and `emit` write it into a caller buffer,
//! and the three mirror each other (`parse(emit(x)) == x`, and
//! `buffer_len` is exactly what `emit` writes and what `parse` consumed).
//! Results are [`Res3`]: the `resok` arm under `NFS3_OK`, otherwise the
//! status and the `resfail` arm. [`Nfs3Args`]/[`Nfs3Res`] and
//! [`MountArgs`]/[`MountRes`] select the message by procedure number.
//!
//! - Client: [`encode_call`] writes a whole call message,
//!   [`Nfs3Args::reply_expect`] sizes what comes back, [`decode_reply`]
//!   reads the reply (MOUNT: [`encode_mount_call`], [`decode_mount_reply`]).
//! - Gateway with whole messages: [`decode_call`], [`encode_reply`]
//!   ([`encode_mount_reply`]).
//! - Service on the `service::ServiceTable`: [`decode_args`] from the
//!   `CallInfo`, [`write_results`] into the `ReplyWriter`, which marks the
//!   DDP item for the engine (MOUNT: [`decode_mount_args`],
//!   [`write_mount_results`]).
//!
//! # Zero copy and bounds
//! File handles, names, paths and data borrow the input. Decoders are
//! total (a value or an [`Error`] for any bytes, never a panic) and
//! allocate nothing: XDR linked lists (READDIRPLUS entries, the DUMP and
//! EXPORT lists and EXPORT's group lists) are checked once and then read
//! through an iterator over the borrowed bytes ([`XdrList`]), and the
//! MNT flavor list lives in a fixed array. Every length from the peer has
//! a bound:
//!
//! | item | bound |
//! |---|---|
//! | `nfs_fh3`, `fhandle3` | [`NFS3_FHSIZE`] = [`FHSIZE3`] = 64 (RFC 1813 s2.4, appendix I) |
//! | `filename3` | [`MAX_NAME_LEN`] = 255: RFC 1813 leaves `filename3` unbounded; 255 is the name limit of every Unix server (Linux `NFS3_MAXNAMLEN`) |
//! | `nfspath3` (READLINK result, SYMLINK argument) | [`MAX_PATH_LEN`] = 4096: unbounded in RFC 1813; Linux symlink targets go up to `PATH_MAX` (4096), so the MOUNT bound (1024) would refuse real READLINK replies |
//! | `dirpath` (MNT, UMNT, DUMP, EXPORT) | [`MNTPATHLEN`] = 1024 (appendix I) |
//! | MOUNT `name` (DUMP host, EXPORT group) | [`MNTNAMLEN`] = 255 (appendix I) |
//! | READ/WRITE data | [`MAX_DATA_LEN`] = 16 MiB (the bench program's bound; Linux tops out at 1 MiB) |
//! | MNT `auth_flavors<>` | [`MAX_AUTH_FLAVORS`] = 16 |
//!
//! Emitters check lengths against the same bounds and the output room
//! before writing: on error nothing has been written.
//!
//! # Direct data placement (RFC 8267 s4)
//! The NFS upper-layer binding for versions 2 and 3 (RFC 8267 s4, in the
//! terms of RFC 8166 s6) names the data items that may travel by RDMA
//! instead of inline, at most one per message: the `data` of a WRITE
//! argument, the `data` of a READ result, the path of a READLINK result
//! and the path of a SYMLINK argument ([`ddp_eligible`]). Nothing else
//! is: no length word, file handle, name, attribute or directory listing.
//!
//! - Encoding: [`encode_call`] and [`encode_reply`] return the item as a
//!   [`DdpItem`] (offset of its first data byte in the message, its
//!   length), for `engine::OutgoingCall::ddp` / `OutgoingReply::ddp`. In
//!   all four messages the item is the last XDR item, so the message ends
//!   with its data and padding.
//! - Decoding: when a chunk carried the item, the inline XDR holds its
//!   length word only (no data, no padding: the reduced XDR stream of
//!   RFC 8166 s3.4) and the data come separately (the engine's
//!   `reply_ddp`, or the read chunk of a call whose data a gateway pulls
//!   itself). Every decoder takes `ddp: Option<&[u8]>`: with
//!   `Some(data)`, the DDP item is `data`, whose length must equal the
//!   inline length word (else [`Error::Malformed`]), as
//!   `service::bench::decode_data_reply` does. A decoded value without a
//!   DDP item (another procedure, a `resfail`) ignores `ddp`: a chunk
//!   offered and not used is normal.
//! - Sizing: [`Nfs3Args::reply_expect`] gives the `engine::ReplyExpect`
//!   of a call (largest reply, largest DDP result), so the requester
//!   offers a write chunk for READ and READLINK and a reply chunk where
//!   the reply could exceed the inline size (READDIRPLUS).

//! # Panic contract
//! No function panics on any input, except [`fuzz_parse`] when the codec
//! itself is wrong.

mod mount;
mod nfs3;
mod types;

#[cfg(test)]
mod tests;

pub use mount::{
    decode_mount_reply, encode_mount_call, encode_mount_reply, ExportList, ExportNode, GroupList,
    MntRes3, MountArgs, MountBody, MountList, MountProc, MountRes, MountRes3Ok, Mountstat3,
    MAX_AUTH_FLAVORS, MAX_MOUNT_LIST_REPLY,
};
pub use nfs3::{
    Commit3Args, Commit3Res, Commit3ResOk, DirListPlus3, DirOpArgs3, EntryIter, EntryList,
    EntryPlus3, Getattr3Args, Getattr3Res, Getattr3ResOk, Lookup3Args, Lookup3Res, Lookup3ResOk,
    Nfs3Args, Nfs3Res, Read3Args, Read3Res, Read3ResOk, Readdirplus3Args, Readdirplus3Res,
    Readdirplus3ResOk, Readlink3Args, Readlink3Res, Readlink3ResOk, Symlink3Args, Symlink3Res,
    Symlink3ResOk, Write3Args, Write3Res, Write3ResOk,
};
pub use types::{
    Bounded, DirPath, Fattr3, FileHandle, Filename, Ftype3, ListIter, MountName, NfsPath, Nfsstat3,
    Nfstime3, Res3, Sattr3, SetTime, Specdata3, StableHow, WccAttr, WccData, Xdr, XdrList,
};

use crate::engine::DdpItem;
use crate::service::{CallInfo, ProcError, ReplyWriter};
use crate::wire::rpc::{AcceptStatus, CallHeader, OpaqueAuth, ReplyBody, ReplyHeader, RpcMessage};
use crate::wire::xdr::{self, Decoder, Encoder};
pub use crate::wire::{Error, Result};

/// NFS program number (RFC 1813 s3, `NFS_PROGRAM`).
pub const NFS_PROGRAM: u32 = 100_003;
/// The NFS version these codecs speak.
pub const NFS_V3: u32 = 3;
/// MOUNT program number (RFC 1813 appendix I).
pub const MOUNT_PROGRAM: u32 = 100_005;
/// The MOUNT version these codecs speak.
pub const MOUNT_V3: u32 = 3;

/// Largest NFSv3 file handle, bytes (`NFS3_FHSIZE`, RFC 1813 s2.4).
pub const NFS3_FHSIZE: usize = 64;
/// Largest MOUNT v3 file handle, bytes (`FHSIZE3`, appendix I).
pub const FHSIZE3: usize = 64;
/// Size of `cookieverf3` (`NFS3_COOKIEVERFSIZE`).
pub const NFS3_COOKIEVERFSIZE: usize = 8;
/// Size of `createverf3` (`NFS3_CREATEVERFSIZE`).
pub const NFS3_CREATEVERFSIZE: usize = 8;
/// Size of `writeverf3` (`NFS3_WRITEVERFSIZE`).
pub const NFS3_WRITEVERFSIZE: usize = 8;
/// Largest MOUNT `dirpath` (`MNTPATHLEN`, appendix I).
pub const MNTPATHLEN: usize = 1024;
/// Largest MOUNT `name` (`MNTNAMLEN`, appendix I).
pub const MNTNAMLEN: usize = 255;
/// Bound on `filename3` (unbounded in RFC 1813; see the module doc).
pub const MAX_NAME_LEN: usize = 255;
/// Bound on `nfspath3` (unbounded in RFC 1813; see the module doc).
pub const MAX_PATH_LEN: usize = 4096;
/// Bound on READ result and WRITE argument data (see the module doc).
pub const MAX_DATA_LEN: usize = 16 << 20;

/// `cookieverf3`: the READDIR(PLUS) cookie verifier.
pub type CookieVerf3 = [u8; NFS3_COOKIEVERFSIZE];
/// `writeverf3`: the WRITE/COMMIT verifier.
pub type WriteVerf3 = [u8; NFS3_WRITEVERFSIZE];
/// `post_op_attr` (RFC 1813 s2.5): attributes, if the server had them.
pub type PostOpAttr = Option<Fattr3>;
/// `pre_op_attr` (RFC 1813 s2.5): weak cache consistency "before".
pub type PreOpAttr = Option<WccAttr>;
/// `post_op_fh3` (RFC 1813 s2.5).
pub type PostOpFh3<'a> = Option<FileHandle<'a>>;

/// NFSv3 procedure numbers (RFC 1813 s3.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Nfs3Proc {
    /// 0
    Null = 0,
    /// 1
    Getattr = 1,
    /// 2
    Setattr = 2,
    /// 3
    Lookup = 3,
    /// 4
    Access = 4,
    /// 5
    Readlink = 5,
    /// 6
    Read = 6,
    /// 7
    Write = 7,
    /// 8
    Create = 8,
    /// 9
    Mkdir = 9,
    /// 10
    Symlink = 10,
    /// 11
    Mknod = 11,
    /// 12
    Remove = 12,
    /// 13
    Rmdir = 13,
    /// 14
    Rename = 14,
    /// 15
    Link = 15,
    /// 16
    Readdir = 16,
    /// 17
    Readdirplus = 17,
    /// 18
    Fsstat = 18,
    /// 19
    Fsinfo = 19,
    /// 20
    Pathconf = 20,
    /// 21
    Commit = 21,
}

impl Nfs3Proc {
    const ALL: [Nfs3Proc; 22] = [
        Nfs3Proc::Null,
        Nfs3Proc::Getattr,
        Nfs3Proc::Setattr,
        Nfs3Proc::Lookup,
        Nfs3Proc::Access,
        Nfs3Proc::Readlink,
        Nfs3Proc::Read,
        Nfs3Proc::Write,
        Nfs3Proc::Create,
        Nfs3Proc::Mkdir,
        Nfs3Proc::Symlink,
        Nfs3Proc::Mknod,
        Nfs3Proc::Remove,
        Nfs3Proc::Rmdir,
        Nfs3Proc::Rename,
        Nfs3Proc::Link,
        Nfs3Proc::Readdir,
        Nfs3Proc::Readdirplus,
        Nfs3Proc::Fsstat,
        Nfs3Proc::Fsinfo,
        Nfs3Proc::Pathconf,
        Nfs3Proc::Commit,
    ];

    /// The procedure with number `value`.
    ///
    /// # Errors
    /// [`Error::UnknownValue`] above 21.
    pub fn from_wire(value: u32) -> Result<Self> {
        by_number(&Self::ALL, value)
    }

    /// The procedure number.
    pub const fn to_wire(self) -> u32 {
        self as u32
    }
}

/// Which message of a procedure carries its DDP-eligible item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DdpSide {
    /// The call's arguments (a read chunk may carry the item).
    Call,
    /// The reply's results (a write chunk may carry the item).
    Reply,
}

/// The NFSv3 DDP-eligibility rule of RFC 8267 s4: WRITE and SYMLINK
/// arguments, READ and READLINK results; `None` for every other procedure
/// (no NFSv3 procedure has two). MOUNT has no DDP-eligible item.
pub const fn ddp_eligible(proc: Nfs3Proc) -> Option<DdpSide> {
    match proc {
        Nfs3Proc::Write | Nfs3Proc::Symlink => Some(DdpSide::Call),
        Nfs3Proc::Read | Nfs3Proc::Readlink => Some(DdpSide::Reply),
        _ => None,
    }
}

/// An encoded RPC message: the message is `out[..len]`; `ddp` marks its
/// DDP-eligible item, if the message has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Encoded {
    /// Length of the message.
    pub len: usize,
    /// The DDP-eligible item (RFC 8267 s4).
    pub ddp: Option<DdpItem>,
}

/// Why a reply is not a decoded result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReplyError {
    /// The reply (header or results) did not decode.
    #[error("malformed reply: {0}")]
    Malformed(Error),
    /// The server denied the call.
    #[error("call denied")]
    Denied,
    /// The server accepted the call but did not run it successfully.
    #[error("call not successful: {0:?}")]
    Status(AcceptStatus),
}

/// What [`encode_message`] needs of a procedure's message.
pub(crate) trait Message<'a> {
    fn check(&self) -> Result<()>;
    fn buffer_len(&self) -> usize;
    fn emit(&self, e: &mut Encoder<'_>) -> Result<()>;
    fn emit_before_ddp(&self, e: &mut Encoder<'_>) -> Result<()>;
    fn ddp_data(&self) -> Option<&'a [u8]>;
}

/// The procedure numbered `value` of a program whose procedures are
/// numbered 0.. in `all` (NFSv3: RFC 1813 s3; MOUNT v3: its appendix I).
fn by_number<T: Copy>(all: &[T], value: u32) -> Result<T> {
    usize::try_from(value)
        .ok()
        .and_then(|i| all.get(i).copied())
        .ok_or(Error::UnknownValue)
}

/// A call of `program`/`version`/`procedure` with `credential` and an
/// AUTH_NONE verifier, followed by `args` (see [`encode_message`]).
fn encode_program_call<'a, T: Message<'a>>(
    out: &mut [u8],
    xid: u32,
    (program, version, procedure): (u32, u32, u32),
    credential: OpaqueAuth<'_>,
    args: &T,
) -> Result<Encoded> {
    let header = CallHeader::new(
        xid,
        program,
        version,
        procedure,
        credential,
        OpaqueAuth::None,
    );
    encode_message(out, &RpcMessage::Call(header), args)
}

/// An accepted, successful reply with `verifier`, followed by `res`.
fn encode_success_reply<'a, T: Message<'a>>(
    out: &mut [u8],
    xid: u32,
    verifier: OpaqueAuth<'_>,
    res: &T,
) -> Result<Encoded> {
    let header = ReplyHeader::accepted(xid, verifier, AcceptStatus::Success);
    encode_message(out, &RpcMessage::Reply(header), res)
}

/// Emits an RPC header followed by `body`, returning the message length
/// and the body's DDP item located in the message. Checks everything
/// before writing.
fn encode_message<'a, T: Message<'a>>(
    out: &mut [u8],
    header: &RpcMessage<'_>,
    body: &T,
) -> Result<Encoded> {
    body.check()?;
    if header.buffer_len() + body.buffer_len() > out.len() {
        return Err(Error::BufferTooShort);
    }
    let mut enc = Encoder::new(out);
    header.emit(&mut enc)?;
    body.emit(&mut enc)?;
    let end = enc.position();
    let ddp = match body.ddp_data() {
        None => None,
        Some(data) => Some(DdpItem {
            offset: u32::try_from(end - xdr::roundup(data.len()))
                .map_err(|_| Error::LimitExceeded)?,
            len: u32::try_from(data.len()).map_err(|_| Error::LimitExceeded)?,
        }),
    };
    Ok(Encoded { len: end, ddp })
}

/// Encodes an NFSv3 call (program 100003 version 3, the procedure of
/// `args`) with credential `credential` and an AUTH_NONE verifier into
/// `out`. The DDP item (WRITE data, SYMLINK path) is returned in
/// [`Encoded::ddp`]; the message holds it inline, as the engine expects.
///
/// # Errors
/// [`Error::BufferTooShort`] if it does not fit, [`Error::LimitExceeded`]
/// for an item over its bound, or an error of `CallHeader::emit`.
pub fn encode_call(
    out: &mut [u8],
    xid: u32,
    credential: OpaqueAuth<'_>,
    args: &Nfs3Args<'_>,
) -> Result<Encoded> {
    let procedure = (NFS_PROGRAM, NFS_V3, args.procedure().to_wire());
    encode_program_call(out, xid, procedure, credential, args)
}

/// Encodes a successful (`MSG_ACCEPTED`/`SUCCESS`) RPC reply carrying
/// `res` into `out`. The DDP item (READ data, READLINK path of a `resok`)
/// is returned in [`Encoded::ddp`].
///
/// # Errors
/// As [`encode_call`]; [`Error::Malformed`] for a [`Res3::Fail`] whose
/// status is `NFS3_OK`.
pub fn encode_reply(
    out: &mut [u8],
    xid: u32,
    verifier: OpaqueAuth<'_>,
    res: &Nfs3Res<'_>,
) -> Result<Encoded> {
    encode_success_reply(out, xid, verifier, res)
}

/// A decoder over the results of a successful reply.
fn success_results(message: &[u8]) -> core::result::Result<Decoder<'_>, ReplyError> {
    let (header, len) = ReplyHeader::parse(message).map_err(ReplyError::Malformed)?;
    match header.body {
        ReplyBody::Accepted(a) if a.status == AcceptStatus::Success => {
            Ok(Decoder::new(&message[len..]))
        }
        ReplyBody::Accepted(a) => Err(ReplyError::Status(a.status)),
        ReplyBody::Denied(_) => Err(ReplyError::Denied),
    }
}

/// Decodes the reply `message` to a call of `procedure` (the caller knows
/// which procedure it called; the reply does not say). `ddp` is the
/// DDP-eligible result when a write chunk carried it (the engine's
/// `reply_ddp`); see the module doc.
///
/// # Errors
/// [`ReplyError`] when the reply is not a success or its results do not
/// decode exactly (trailing bytes included).
pub fn decode_reply<'a>(
    procedure: Nfs3Proc,
    message: &'a [u8],
    ddp: Option<&'a [u8]>,
) -> core::result::Result<Nfs3Res<'a>, ReplyError> {
    let dec = success_results(message)?;
    Nfs3Res::parse_proc(procedure, dec.rest(), ddp).map_err(ReplyError::Malformed)
}

/// The DDP-eligible item of a whole NFSv3 reply `message` to a call of
/// `procedure` (a gateway's view, RFC 8267 s4): the data of a successful
/// READ or the path of a successful READLINK, located in `message`. `None`
/// for every other procedure, for a reply that is not a success (RFC 5531
/// `accept_stat`, or an NFS status other than `NFS3_OK`: the `resfail`
/// arms carry no eligible item), and for results that do not decode
/// exactly: such a reply travels whole, inline or in the reply chunk.
pub fn reply_ddp(procedure: Nfs3Proc, message: &[u8]) -> Option<DdpItem> {
    if ddp_eligible(procedure) != Some(DdpSide::Reply) {
        return None;
    }
    let res = decode_reply(procedure, message, None).ok()?;
    let data = res.ddp_data()?;
    // `data` borrows `message`: its place is the distance between the two.
    let offset = (data.as_ptr() as usize).checked_sub(message.as_ptr() as usize)?;
    Some(DdpItem {
        offset: u32::try_from(offset).ok()?,
        len: u32::try_from(data.len()).ok()?,
    })
}

/// Decodes a whole NFSv3 call message (a gateway's view): the RPC call
/// header and the arguments. `ddp` is the DDP-eligible argument when it
/// travelled apart (see the module doc).
///
/// # Errors
/// An error of `CallHeader::parse`; [`Error::UnknownValue`] when the call
/// is not for NFS version 3 or names a procedure without a codec;
/// otherwise as [`Nfs3Args::parse_proc`].
pub fn decode_call<'a>(
    message: &'a [u8],
    ddp: Option<&'a [u8]>,
) -> Result<(CallHeader<'a>, Nfs3Args<'a>)> {
    let (header, len) = CallHeader::parse(message)?;
    if header.program != NFS_PROGRAM || header.version != NFS_V3 {
        return Err(Error::UnknownValue);
    }
    let proc = Nfs3Proc::from_wire(header.procedure)?;
    let args = Nfs3Args::parse_proc(proc, &message[len..], ddp)?;
    Ok((header, args))
}

/// The arguments of a call an [`RpcService`](crate::service::RpcService)
/// serving NFS version 3 received (the engine has already pulled any read
/// chunk, so the arguments are whole).
///
/// # Errors
/// [`ProcError::ProcUnavail`] for a procedure without a codec,
/// [`ProcError::GarbageArgs`] for arguments that do not decode exactly.
pub fn decode_args<'a>(call: &CallInfo<'a>) -> core::result::Result<Nfs3Args<'a>, ProcError> {
    let proc = Nfs3Proc::from_wire(call.procedure).map_err(|_| ProcError::ProcUnavail)?;
    if !Nfs3Args::has_codec(proc) {
        return Err(ProcError::ProcUnavail);
    }
    Nfs3Args::parse_proc(proc, call.args, None).map_err(|_| ProcError::GarbageArgs)
}

/// Writes `res` as the results of a service's reply, marking its DDP item
/// (READ data, READLINK path) with `ReplyWriter::put_ddp_opaque` so that
/// the engine can move it by the requester's write chunk.
///
/// # Errors
/// [`ProcError::SystemErr`] when the results do not fit the reply buffer
/// or break a rule of `emit` (an over-long item, a `resfail` with
/// `NFS3_OK`).
pub fn write_results(
    res: &Nfs3Res<'_>,
    reply: &mut ReplyWriter<'_>,
) -> core::result::Result<(), ProcError> {
    write_message(res, reply)
}

/// [`write_results`] for MOUNT (which has no DDP item).
///
/// # Errors
/// As [`write_results`].
pub fn write_mount_results(
    res: &MountRes<'_>,
    reply: &mut ReplyWriter<'_>,
) -> core::result::Result<(), ProcError> {
    write_message(res, reply)
}

/// [`decode_args`] for a service serving MOUNT version 3.
///
/// # Errors
/// As [`decode_args`].
pub fn decode_mount_args<'a>(
    call: &CallInfo<'a>,
) -> core::result::Result<MountArgs<'a>, ProcError> {
    let proc = MountProc::from_wire(call.procedure).map_err(|_| ProcError::ProcUnavail)?;
    if !MountArgs::has_codec(proc) {
        return Err(ProcError::ProcUnavail);
    }
    MountArgs::parse_proc(proc, call.args, None).map_err(|_| ProcError::GarbageArgs)
}

fn write_message<'a, T: Message<'a>>(
    res: &T,
    reply: &mut ReplyWriter<'_>,
) -> core::result::Result<(), ProcError> {
    res.check().map_err(|_| ProcError::SystemErr)?;
    let enc = reply.encoder();
    if enc.remaining() < res.buffer_len() {
        return Err(ProcError::SystemErr);
    }
    match res.ddp_data() {
        None => res.emit(enc).map_err(|_| ProcError::SystemErr),
        Some(data) => {
            res.emit_before_ddp(enc).map_err(|_| ProcError::SystemErr)?;
            reply.put_ddp_opaque(data)
        }
    }
}

/// Reads a DDP-eligible variable-length opaque of at most `max` bytes: from
/// the input, or (length word only in the input) from `ddp`.
fn get_ddp_opaque<'a>(d: &mut Decoder<'a>, max: usize, ddp: Option<&'a [u8]>) -> Result<&'a [u8]> {
    match ddp {
        None => d.get_opaque(max),
        Some(data) => {
            let len = d.get_u32()? as usize;
            if len > max {
                return Err(Error::LimitExceeded);
            }
            if len != data.len() {
                return Err(Error::Malformed);
            }
            Ok(data)
        }
    }
}

/// Emits `$value`, checks lengths, re-parses and compares (see
/// `wire::rpc::fuzz_parse`); also re-decodes with the DDP item split off.
macro_rules! fuzz_round_trip {
    ($value:expr, $parsed_len:expr, |$bytes:ident, $ddp:ident| $parse:expr) => {{
        let value = $value;
        let len = value.buffer_len();
        assert_eq!(len, $parsed_len, "buffer_len != parsed length");
        let mut out = vec![0u8; len];
        let mut enc = Encoder::new(&mut out);
        value.emit(&mut enc).expect("a parsed value re-emits");
        assert_eq!(enc.position(), len, "emitted length != buffer_len");
        {
            let $bytes: &[u8] = &out;
            let $ddp: Option<&[u8]> = None;
            let again = $parse.expect("emitted bytes parse");
            assert_eq!(again, value, "round trip changed the value");
        }
        if let Some(data) = value.ddp_data() {
            // The inline part as it travels when a chunk carries the item.
            let cut = len - xdr::roundup(data.len());
            let $bytes: &[u8] = &out[..cut];
            let $ddp: Option<&[u8]> = Some(data);
            let again = $parse.expect("split message parses");
            assert_eq!(again, value, "split round trip changed the value");
        }
    }};
}

/// Fuzz entry point: runs every decoder of this module over `data`.
///
/// - Arguments and results of every procedure with a codec, NFS and
///   MOUNT, parsed from `data`, and whole RPC calls and replies: they
///   return instead of panicking.
/// - Whatever parses re-emits into exactly `buffer_len` bytes (the parsed
///   length) which parse back equal; a value with a DDP item also parses
///   back equal from the inline part with the item handed separately.
///
/// # Panics
/// Only when one of those properties fails, i.e. when this codec is wrong.
///
/// # Allocation
/// Only the re-emit buffers, each no longer than `data`.
pub fn fuzz_parse(data: &[u8]) {
    for proc in Nfs3Proc::ALL {
        if let Ok(a) = Nfs3Args::parse_proc(proc, data, None) {
            fuzz_round_trip!(a, data.len(), |b, ddp| Nfs3Args::parse_proc(proc, b, ddp));
        }
        if let Ok(r) = Nfs3Res::parse_proc(proc, data, None) {
            fuzz_round_trip!(r, data.len(), |b, ddp| Nfs3Res::parse_proc(proc, b, ddp));
        }
    }
    for proc in MountProc::ALL {
        if let Ok(a) = MountArgs::parse_proc(proc, data, None) {
            fuzz_round_trip!(a, data.len(), |b, _ddp| MountArgs::parse_proc(
                proc, b, None
            ));
        }
        if let Ok(r) = MountRes::parse_proc(proc, data, None) {
            fuzz_round_trip!(r, data.len(), |b, _ddp| MountRes::parse_proc(proc, b, None));
        }
    }
    // Whole messages: a call to either program, or a reply decoded as
    // each procedure's.
    if let Ok((call, args)) = decode_call(data, None) {
        assert_eq!(call.program, NFS_PROGRAM);
        assert_eq!(call.procedure, args.procedure().to_wire());
    }
    if let Ok((call, len)) = CallHeader::parse(data) {
        let args = &data[len..];
        if call.program == MOUNT_PROGRAM {
            if let Ok(proc) = MountProc::from_wire(call.procedure) {
                let _ = MountArgs::parse_proc(proc, args, None);
            }
        }
    }
    if ReplyHeader::parse(data).is_ok() {
        for proc in Nfs3Proc::ALL {
            let _ = decode_reply(proc, data, None);
        }
        for proc in MountProc::ALL {
            let _ = decode_mount_reply(proc, data);
        }
    }
}
