//! NFSv3 procedure arguments and results (RFC 1813 s3.3).

use super::types::DdpField;
use super::{
    CookieVerf3, Error, Fattr3, FileHandle, Filename, ListIter, Nfs3Proc, NfsPath, PostOpAttr,
    PostOpFh3, Res3, Result, Sattr3, StableHow, WccData, WriteVerf3, Xdr, XdrList,
};
use crate::engine::ReplyExpect;
use crate::wire::rpc::{AcceptStatus, OpaqueAuth, ReplyHeader};
use crate::wire::xdr::{self, Decoder, Encoder};

/// Defines a struct whose fields are XDR items in order, and its [`Xdr`]
/// implementation. An optional last `ddp` field is the DDP-eligible item.
macro_rules! xdr_struct {
    (
        $(#[$m:meta])* $name:ident $(<$lt:lifetime>)? {
            $($(#[$fm:meta])* $f:ident : $t:ty,)*
        }
        $(ddp { $(#[$dm:meta])* $df:ident : $dt:ty })?
    ) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name $(<$lt>)? {
            $($(#[$fm])* pub $f: $t,)*
            $($(#[$dm])* pub $df: $dt,)?
        }

        impl<'a> Xdr<'a> for $name $(<$lt>)? {
            #[allow(unused_variables)]
            fn decode_body(d: &mut Decoder<'a>, ddp: Option<&'a [u8]>) -> Result<Self> {
                Ok($name {
                    $($f: <$t as Xdr<'a>>::decode_body(d, None)?,)*
                    $($df: <$dt as DdpField<'a>>::decode_ddp(d, ddp)?,)?
                })
            }
            fn buffer_len(&self) -> usize {
                0 $(+ self.$f.buffer_len())* $(+ self.$df.field_len())?
            }
            #[allow(unused_variables)]
            fn emit_body(&self, e: &mut Encoder<'_>) -> Result<()> {
                $(self.$f.emit_body(e)?;)*
                $(self.$df.emit_field(e)?;)?
                Ok(())
            }
            fn check(&self) -> Result<()> {
                $(self.$f.check()?;)*
                $(self.$df.check_field()?;)?
                Ok(())
            }
            $(
                fn ddp_data(&self) -> Option<&'a [u8]> {
                    Some(self.$df.bytes())
                }
            )?
            /// Every field but the DDP item.
            #[allow(unused_variables)]
            fn emit_before_ddp(&self, e: &mut Encoder<'_>) -> Result<()> {
                $(self.$f.emit_body(e)?;)*
                Ok(())
            }
        }
    };
}
pub(crate) use xdr_struct;

xdr_struct! {
    /// `diropargs3` (RFC 1813 s2.5): a name in a directory.
    DirOpArgs3<'a> {
        /// `dir`
        dir: FileHandle<'a>,
        /// `name`
        name: Filename<'a>,
    }
}

xdr_struct! {
    /// `GETATTR3args` (RFC 1813 s3.3.1).
    Getattr3Args<'a> {
        /// `object`
        object: FileHandle<'a>,
    }
}

xdr_struct! {
    /// `GETATTR3resok`.
    Getattr3ResOk {
        /// `obj_attributes`
        obj_attributes: Fattr3,
    }
}

/// `GETATTR3res`: no `resfail` data.
pub type Getattr3Res = Res3<Getattr3ResOk, ()>;

xdr_struct! {
    /// `LOOKUP3args` (RFC 1813 s3.3.3).
    Lookup3Args<'a> {
        /// `what`
        what: DirOpArgs3<'a>,
    }
}

xdr_struct! {
    /// `LOOKUP3resok`.
    Lookup3ResOk<'a> {
        /// `object`
        object: FileHandle<'a>,
        /// `obj_attributes`
        obj_attributes: PostOpAttr,
        /// `dir_attributes`
        dir_attributes: PostOpAttr,
    }
}

/// `LOOKUP3res`; `resfail` holds `dir_attributes`.
pub type Lookup3Res<'a> = Res3<Lookup3ResOk<'a>, PostOpAttr>;

xdr_struct! {
    /// `READLINK3args` (RFC 1813 s3.3.5).
    Readlink3Args<'a> {
        /// `symlink`
        symlink: FileHandle<'a>,
    }
}

xdr_struct! {
    /// `READLINK3resok`; `data` is DDP-eligible (RFC 8267 s4).
    Readlink3ResOk<'a> {
        /// `symlink_attributes`
        symlink_attributes: PostOpAttr,
    }
    ddp {
        /// `data`: the link's target.
        data: NfsPath<'a>
    }
}

/// `READLINK3res`; `resfail` holds `symlink_attributes`.
pub type Readlink3Res<'a> = Res3<Readlink3ResOk<'a>, PostOpAttr>;

xdr_struct! {
    /// `READ3args` (RFC 1813 s3.3.6).
    Read3Args<'a> {
        /// `file`
        file: FileHandle<'a>,
        /// `offset`
        offset: u64,
        /// `count`: bytes asked for.
        count: u32,
    }
}

xdr_struct! {
    /// `READ3resok`; `data` is DDP-eligible (RFC 8267 s4). `count`
    /// should equal `data.len()`; the codec keeps both as sent.
    Read3ResOk<'a> {
        /// `file_attributes`
        file_attributes: PostOpAttr,
        /// `count`: bytes read.
        count: u32,
        /// `eof`
        eof: bool,
    }
    ddp {
        /// `data`, at most [`MAX_DATA_LEN`](super::MAX_DATA_LEN) bytes.
        data: &'a [u8]
    }
}

impl<'a> Read3ResOk<'a> {
    /// A result of `data`, with `count` set to its length.
    pub fn new(file_attributes: PostOpAttr, eof: bool, data: &'a [u8]) -> Self {
        Read3ResOk {
            file_attributes,
            count: data.len() as u32,
            eof,
            data,
        }
    }
}

/// `READ3res`; `resfail` holds `file_attributes`.
pub type Read3Res<'a> = Res3<Read3ResOk<'a>, PostOpAttr>;

xdr_struct! {
    /// `WRITE3args` (RFC 1813 s3.3.7); `data` is DDP-eligible (RFC 8267
    /// s4.3). `count` should equal `data.len()`; the codec keeps both as
    /// sent.
    Write3Args<'a> {
        /// `file`
        file: FileHandle<'a>,
        /// `offset`
        offset: u64,
        /// `count`
        count: u32,
        /// `stable`
        stable: StableHow,
    }
    ddp {
        /// `data`, at most [`MAX_DATA_LEN`](super::MAX_DATA_LEN) bytes.
        data: &'a [u8]
    }
}

impl<'a> Write3Args<'a> {
    /// Arguments writing `data` at `offset`, with `count` set to its
    /// length.
    pub fn new(file: FileHandle<'a>, offset: u64, stable: StableHow, data: &'a [u8]) -> Self {
        Write3Args {
            file,
            offset,
            count: data.len() as u32,
            stable,
            data,
        }
    }
}

xdr_struct! {
    /// `WRITE3resok`.
    Write3ResOk {
        /// `file_wcc`
        file_wcc: WccData,
        /// `count`: bytes written.
        count: u32,
        /// `committed`
        committed: StableHow,
        /// `verf`
        verf: WriteVerf3,
    }
}

/// `WRITE3res`; `resfail` holds `file_wcc`.
pub type Write3Res = Res3<Write3ResOk, WccData>;

xdr_struct! {
    /// `SYMLINK3args` (RFC 1813 s3.3.10): `where` and `symlink`
    /// (`symlinkdata3`) flattened; `symlink_data` is DDP-eligible (RFC 8267
    /// s4.3).
    Symlink3Args<'a> {
        /// `where`
        dirop: DirOpArgs3<'a>,
        /// `symlink.symlink_attributes`
        symlink_attributes: Sattr3,
    }
    ddp {
        /// `symlink.symlink_data`: the target.
        symlink_data: NfsPath<'a>
    }
}

xdr_struct! {
    /// `SYMLINK3resok`.
    Symlink3ResOk<'a> {
        /// `obj`
        obj: PostOpFh3<'a>,
        /// `obj_attributes`
        obj_attributes: PostOpAttr,
        /// `dir_wcc`
        dir_wcc: WccData,
    }
}

/// `SYMLINK3res`; `resfail` holds `dir_wcc`.
pub type Symlink3Res<'a> = Res3<Symlink3ResOk<'a>, WccData>;

xdr_struct! {
    /// `READDIRPLUS3args` (RFC 1813 s3.3.17).
    Readdirplus3Args<'a> {
        /// `dir`
        dir: FileHandle<'a>,
        /// `cookie`: 0 to start.
        cookie: u64,
        /// `cookieverf`
        cookieverf: CookieVerf3,
        /// `dircount`: bound on the entries' names and cookies.
        dircount: u32,
        /// `maxcount`: bound on the whole result.
        maxcount: u32,
    }
}

xdr_struct! {
    /// `entryplus3` without its `nextentry` link (the list carries it,
    /// [`EntryList`]).
    EntryPlus3<'a> {
        /// `fileid`
        fileid: u64,
        /// `name`
        name: Filename<'a>,
        /// `cookie`
        cookie: u64,
        /// `name_attributes`
        name_attributes: PostOpAttr,
        /// `name_handle`
        name_handle: PostOpFh3<'a>,
    }
}

/// The `entryplus3 *entries` list of a READDIRPLUS result (an
/// [`XdrList`]; each entry takes at least 32 bytes on the wire).
pub type EntryList<'a> = XdrList<'a, EntryPlus3<'a>>;

/// Iterator over an [`EntryList`].
pub type EntryIter<'a> = ListIter<'a, EntryPlus3<'a>>;

xdr_struct! {
    /// `dirlistplus3`.
    DirListPlus3<'a> {
        /// `entries`
        entries: EntryList<'a>,
        /// `eof`
        eof: bool,
    }
}

xdr_struct! {
    /// `READDIRPLUS3resok`.
    Readdirplus3ResOk<'a> {
        /// `dir_attributes`
        dir_attributes: PostOpAttr,
        /// `cookieverf`
        cookieverf: CookieVerf3,
        /// `reply`
        reply: DirListPlus3<'a>,
    }
}

/// `READDIRPLUS3res`; `resfail` holds `dir_attributes`.
pub type Readdirplus3Res<'a> = Res3<Readdirplus3ResOk<'a>, PostOpAttr>;

xdr_struct! {
    /// `COMMIT3args` (RFC 1813 s3.3.21).
    Commit3Args<'a> {
        /// `file`
        file: FileHandle<'a>,
        /// `offset`
        offset: u64,
        /// `count`: 0 means to the end of the file.
        count: u32,
    }
}

xdr_struct! {
    /// `COMMIT3resok`.
    Commit3ResOk {
        /// `file_wcc`
        file_wcc: WccData,
        /// `verf`
        verf: WriteVerf3,
    }
}

/// `COMMIT3res`; `resfail` holds `file_wcc`.
pub type Commit3Res = Res3<Commit3ResOk, WccData>;

/// Defines an enum with a unit `Null` variant and one variant per
/// procedure wrapping an [`Xdr`] type, with the per-procedure dispatch.
macro_rules! proc_enum {
    (
        $(#[$m:meta])* $name:ident, $proc:ident {
            $($(#[$vm:meta])* $v:ident($t:ty),)*
        }
    ) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum $name<'a> {
            /// NULL: no data.
            Null,
            $($(#[$vm])* $v($t),)*
        }

        impl<'a> $name<'a> {
            /// The procedure.
            pub fn procedure(&self) -> $proc {
                match self {
                    $name::Null => $proc::Null,
                    $($name::$v(_) => $proc::$v,)*
                }
            }

            /// Whether procedure `proc` has a codec here.
            pub fn has_codec(proc: $proc) -> bool {
                matches!(proc, $proc::Null $(| $proc::$v)*)
            }

            /// Decodes the message of procedure `proc` at the decoder's
            /// position; on error the decoder is left where it was.
            ///
            /// # Errors
            /// [`Error::UnknownValue`] for a procedure without a codec,
            /// otherwise as [`Xdr::decode_body`].
            #[allow(unused_variables)]
            pub fn decode_proc(
                proc: $proc,
                d: &mut Decoder<'a>,
                ddp: Option<&'a [u8]>,
            ) -> Result<Self> {
                match proc {
                    $proc::Null => Ok($name::Null),
                    $($proc::$v => Ok($name::$v(<$t>::decode(d, ddp)?)),)*
                    #[allow(unreachable_patterns)]
                    _ => Err(Error::UnknownValue),
                }
            }

            /// Decodes the message of procedure `proc` that is exactly
            /// `bytes` (the arguments of a call, the results of a reply).
            ///
            /// # Errors
            /// As [`decode_proc`](Self::decode_proc), and
            /// [`Error::TrailingBytes`].
            pub fn parse_proc(proc: $proc, bytes: &'a [u8], ddp: Option<&'a [u8]>) -> Result<Self> {
                let mut d = Decoder::new(bytes);
                let v = Self::decode_proc(proc, &mut d, ddp)?;
                d.finish()?;
                Ok(v)
            }

            /// Exact encoded length, DDP item inline.
            pub fn buffer_len(&self) -> usize {
                match self {
                    $name::Null => 0,
                    $($name::$v(x) => x.buffer_len(),)*
                }
            }

            /// Checks the limits `emit` enforces.
            ///
            /// # Errors
            /// As [`Xdr::check`].
            pub fn check(&self) -> Result<()> {
                match self {
                    $name::Null => Ok(()),
                    $($name::$v(x) => x.check(),)*
                }
            }

            /// Writes the message. On error nothing is written.
            ///
            /// # Errors
            /// As [`Xdr::emit`].
            pub fn emit(&self, e: &mut Encoder<'_>) -> Result<()> {
                match self {
                    $name::Null => Ok(()),
                    $($name::$v(x) => x.emit(e),)*
                }
            }

            /// Writes what precedes the DDP item's length word (see
            /// [`Xdr::emit_before_ddp`]); all of the message when it has no
            /// DDP item. Nothing is checked: use
            /// [`check`](Self::check) and [`buffer_len`](Self::buffer_len)
            /// first.
            ///
            /// # Errors
            /// [`Error::BufferTooShort`] when the room runs out midway.
            pub fn emit_before_ddp(&self, e: &mut Encoder<'_>) -> Result<()> {
                match self {
                    $name::Null => Ok(()),
                    $($name::$v(x) => x.emit_before_ddp(e),)*
                }
            }

            /// The DDP-eligible item's data, if this message has one.
            pub fn ddp_data(&self) -> Option<&'a [u8]> {
                match self {
                    $name::Null => None,
                    $($name::$v(x) => x.ddp_data(),)*
                }
            }
        }

        impl<'a> super::Message<'a> for $name<'a> {
            fn check(&self) -> Result<()> {
                self.check()
            }
            fn buffer_len(&self) -> usize {
                self.buffer_len()
            }
            fn emit_before_ddp(&self, e: &mut Encoder<'_>) -> Result<()> {
                self.emit_before_ddp(e)
            }
            fn emit(&self, e: &mut Encoder<'_>) -> Result<()> {
                self.emit(e)
            }
            fn ddp_data(&self) -> Option<&'a [u8]> {
                self.ddp_data()
            }
        }
    };
}
pub(crate) use proc_enum;

proc_enum! {
    /// The arguments of an NFSv3 call, by procedure.
    Nfs3Args, Nfs3Proc {
        /// GETATTR
        Getattr(Getattr3Args<'a>),
        /// LOOKUP
        Lookup(Lookup3Args<'a>),
        /// READLINK
        Readlink(Readlink3Args<'a>),
        /// READ
        Read(Read3Args<'a>),
        /// WRITE (DDP item: `data`)
        Write(Write3Args<'a>),
        /// SYMLINK (DDP item: `symlink_data`)
        Symlink(Symlink3Args<'a>),
        /// READDIRPLUS
        Readdirplus(Readdirplus3Args<'a>),
        /// COMMIT
        Commit(Commit3Args<'a>),
    }
}

proc_enum! {
    /// The results of an NFSv3 reply, by procedure.
    Nfs3Res, Nfs3Proc {
        /// GETATTR
        Getattr(Getattr3Res),
        /// LOOKUP
        Lookup(Lookup3Res<'a>),
        /// READLINK (DDP item: `resok.data`)
        Readlink(Readlink3Res<'a>),
        /// READ (DDP item: `resok.data`)
        Read(Read3Res<'a>),
        /// WRITE
        Write(Write3Res),
        /// SYMLINK
        Symlink(Symlink3Res<'a>),
        /// READDIRPLUS
        Readdirplus(Readdirplus3Res<'a>),
        /// COMMIT
        Commit(Commit3Res),
    }
}

/// Largest encoded `post_op_attr`.
const POST_OP_ATTR_MAX: u32 = 4 + Fattr3::LEN as u32;
/// Largest encoded `wcc_data`.
const WCC_DATA_MAX: u32 = 4 + 24 + POST_OP_ATTR_MAX;
/// Largest encoded `nfs_fh3`.
const FH_MAX: u32 = 4 + super::NFS3_FHSIZE as u32;

/// Length of an accepted SUCCESS reply header with an AUTH_NONE verifier.
pub(crate) fn success_header_len() -> u32 {
    ReplyHeader::accepted(0, OpaqueAuth::None, AcceptStatus::Success).buffer_len() as u32
}

impl Nfs3Args<'_> {
    /// What the reply to this call may look like, for
    /// `engine::OutgoingCall::reply`: the largest reply message (RPC
    /// header with an AUTH_NONE verifier, the larger of `resok` and
    /// `resfail` at their largest) and, for READ and READLINK, the
    /// largest DDP-eligible result, so that a write chunk is offered for
    /// it. READ's data is at most `count` (capped at
    /// [`MAX_DATA_LEN`](super::MAX_DATA_LEN)); READDIRPLUS's `resok` at
    /// most `maxcount` (RFC 1813 s3.3.17).
    pub fn reply_expect(&self) -> ReplyExpect {
        let status = 4u32;
        let (results, ddp_max) = match self {
            Nfs3Args::Null => (0, None),
            Nfs3Args::Getattr(_) => (status + Fattr3::LEN as u32, None),
            Nfs3Args::Lookup(_) => (status + FH_MAX + 2 * POST_OP_ATTR_MAX, None),
            Nfs3Args::Readlink(_) => {
                let path = super::MAX_PATH_LEN as u32;
                (status + POST_OP_ATTR_MAX + 4 + path, Some(path))
            }
            Nfs3Args::Read(a) => {
                let count = a.count.min(super::MAX_DATA_LEN as u32);
                let data = xdr::roundup(count as usize) as u32;
                (status + POST_OP_ATTR_MAX + 4 + 4 + 4 + data, Some(count))
            }
            Nfs3Args::Write(_) => (status + WCC_DATA_MAX + 4 + 4 + 8, None),
            Nfs3Args::Symlink(_) => (status + 4 + FH_MAX + POST_OP_ATTR_MAX + WCC_DATA_MAX, None),
            Nfs3Args::Readdirplus(a) => (
                status.saturating_add(a.maxcount.max(POST_OP_ATTR_MAX)),
                None,
            ),
            Nfs3Args::Commit(_) => (status + WCC_DATA_MAX + 8, None),
        };
        ReplyExpect {
            max_len: success_header_len().saturating_add(results),
            ddp_max,
        }
    }
}
