//! The basic data types of RFC 1813 s2.5-2.6 and the [`Xdr`] trait.

use super::{Error, Result, MAX_NAME_LEN, MAX_PATH_LEN, MNTNAMLEN, MNTPATHLEN, NFS3_FHSIZE};
use crate::wire::xdr::{self, Decoder, Encoder};

/// An XDR message or item of these codecs.
///
/// `decode` and `parse` read, `buffer_len` and `emit` write; they mirror
/// each other. `ddp` is the DDP-eligible item when it travelled apart from
/// the inline XDR (see the module doc); types without such an item ignore
/// it.
pub trait Xdr<'a>: Sized {
    /// Reads the value at the decoder's position. Prefer
    /// [`decode`](Self::decode), which leaves the decoder where it was on
    /// error; this may leave it anywhere.
    ///
    /// # Errors
    /// [`Error::Truncated`] when the input ends inside the value,
    /// [`Error::LimitExceeded`] for a length over its bound,
    /// [`Error::UnknownValue`] for an undefined discriminant,
    /// [`Error::Malformed`] for a DDP item whose length disagrees.
    fn decode_body(d: &mut Decoder<'a>, ddp: Option<&'a [u8]>) -> Result<Self>;

    /// Exact encoded length, with any DDP item's data inline.
    fn buffer_len(&self) -> usize;

    /// Writes the value; the caller has run [`check`](Self::check) and
    /// made sure [`buffer_len`](Self::buffer_len) bytes are free.
    ///
    /// # Errors
    /// Only when those preconditions do not hold.
    fn emit_body(&self, e: &mut Encoder<'_>) -> Result<()>;

    /// Writes what precedes the DDP item's length word: everything but
    /// the item when the value has one (see
    /// [`ddp_data`](Self::ddp_data)), else all of it, as
    /// [`emit_body`](Self::emit_body). The item then follows as a
    /// variable-length opaque (e.g. `service::ReplyWriter::put_ddp_opaque`).
    ///
    /// # Errors
    /// As [`emit_body`](Self::emit_body).
    fn emit_before_ddp(&self, e: &mut Encoder<'_>) -> Result<()> {
        self.emit_body(e)
    }

    /// Checks the rules `emit` enforces beyond the buffer size.
    ///
    /// # Errors
    /// [`Error::LimitExceeded`] or [`Error::Malformed`].
    fn check(&self) -> Result<()> {
        Ok(())
    }

    /// The data of this value's DDP-eligible item (RFC 8267 s4), if it
    /// has one. It is always the last item of the encoding.
    fn ddp_data(&self) -> Option<&'a [u8]> {
        None
    }

    /// Reads the value at the decoder's position; on error the decoder is
    /// left where it was.
    ///
    /// # Errors
    /// As [`decode_body`](Self::decode_body).
    fn decode(d: &mut Decoder<'a>, ddp: Option<&'a [u8]>) -> Result<Self> {
        let mut c = d.clone();
        let v = Self::decode_body(&mut c, ddp)?;
        *d = c;
        Ok(v)
    }

    /// Reads the value that is exactly `bytes`.
    ///
    /// # Errors
    /// As [`decode_body`](Self::decode_body), and [`Error::TrailingBytes`].
    fn parse(bytes: &'a [u8], ddp: Option<&'a [u8]>) -> Result<Self> {
        let mut d = Decoder::new(bytes);
        let v = Self::decode_body(&mut d, ddp)?;
        d.finish()?;
        Ok(v)
    }

    /// Writes the value. On error nothing is written.
    ///
    /// # Errors
    /// [`Error::BufferTooShort`] when `e` has less than `buffer_len` bytes
    /// free; an error of [`check`](Self::check).
    fn emit(&self, e: &mut Encoder<'_>) -> Result<()> {
        self.check()?;
        if e.remaining() < self.buffer_len() {
            return Err(Error::BufferTooShort);
        }
        self.emit_body(e)
    }
}

/// A variable-length opaque of at most `MAX` bytes, borrowed. The bound
/// holds by construction ([`Bounded::new`]) and by decoding.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Bounded<'a, const MAX: usize>(&'a [u8]);

impl<'a, const MAX: usize> Bounded<'a, MAX> {
    /// The bound.
    pub const MAX: usize = MAX;

    /// `bytes`, if at most `MAX` long.
    ///
    /// # Errors
    /// [`Error::LimitExceeded`] when longer.
    pub const fn new(bytes: &'a [u8]) -> Result<Self> {
        if bytes.len() > MAX {
            Err(Error::LimitExceeded)
        } else {
            Ok(Bounded(bytes))
        }
    }

    /// The bytes, without padding.
    pub const fn as_bytes(&self) -> &'a [u8] {
        self.0
    }

    /// Length in bytes.
    pub const fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether it is empty.
    pub const fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<const MAX: usize> core::fmt::Debug for Bounded<'_, MAX> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "\"{}\"", self.0.escape_ascii())
    }
}

impl<'a, const MAX: usize> Xdr<'a> for Bounded<'a, MAX> {
    fn decode_body(d: &mut Decoder<'a>, _ddp: Option<&'a [u8]>) -> Result<Self> {
        Ok(Bounded(d.get_opaque(MAX)?))
    }
    fn buffer_len(&self) -> usize {
        xdr::opaque_len(self.0.len())
    }
    fn emit_body(&self, e: &mut Encoder<'_>) -> Result<()> {
        e.put_opaque(self.0)
    }
}

/// `nfs_fh3` (RFC 1813 s2.5) and MOUNT's `fhandle3`: `opaque<64>`.
pub type FileHandle<'a> = Bounded<'a, NFS3_FHSIZE>;
/// `filename3`, bounded by [`MAX_NAME_LEN`](super::MAX_NAME_LEN).
pub type Filename<'a> = Bounded<'a, MAX_NAME_LEN>;
/// `nfspath3`, bounded by [`MAX_PATH_LEN`](super::MAX_PATH_LEN).
pub type NfsPath<'a> = Bounded<'a, MAX_PATH_LEN>;
/// MOUNT's `dirpath`: `string<MNTPATHLEN>`.
pub type DirPath<'a> = Bounded<'a, MNTPATHLEN>;
/// MOUNT's `name` (host and group names): `string<MNTNAMLEN>`.
pub type MountName<'a> = Bounded<'a, MNTNAMLEN>;

impl<'a> Xdr<'a> for () {
    fn decode_body(_d: &mut Decoder<'a>, _ddp: Option<&'a [u8]>) -> Result<Self> {
        Ok(())
    }
    fn buffer_len(&self) -> usize {
        0
    }
    fn emit_body(&self, _e: &mut Encoder<'_>) -> Result<()> {
        Ok(())
    }
}

/// XDR optional data (`T *`, RFC 4506 s4.19), also the shape of
/// `post_op_attr`, `pre_op_attr` and `post_op_fh3` (a `bool` then the
/// value when TRUE).
impl<'a, T: Xdr<'a>> Xdr<'a> for Option<T> {
    fn decode_body(d: &mut Decoder<'a>, _ddp: Option<&'a [u8]>) -> Result<Self> {
        if d.get_present()? {
            Ok(Some(T::decode_body(d, None)?))
        } else {
            Ok(None)
        }
    }
    fn buffer_len(&self) -> usize {
        4 + self.as_ref().map_or(0, T::buffer_len)
    }
    fn emit_body(&self, e: &mut Encoder<'_>) -> Result<()> {
        e.put_present(self.is_some())?;
        match self {
            Some(v) => v.emit_body(e),
            None => Ok(()),
        }
    }
    fn check(&self) -> Result<()> {
        self.as_ref().map_or(Ok(()), T::check)
    }
}

macro_rules! wire_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $v:ident = $n:expr,)* }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vm])* $v = $n,)*
        }

        impl $name {
            /// The value with discriminant `value`.
            ///
            /// # Errors
            /// [`Error::UnknownValue`] for a value RFC 1813 does not define.
            pub const fn from_wire(value: u32) -> Result<Self> {
                match value {
                    $($n => Ok($name::$v),)*
                    _ => Err(Error::UnknownValue),
                }
            }

            /// The discriminant on the wire.
            pub const fn to_wire(self) -> u32 {
                self as u32
            }
        }

        impl<'a> Xdr<'a> for $name {
            fn decode_body(d: &mut Decoder<'a>, _ddp: Option<&'a [u8]>) -> Result<Self> {
                let save = d.clone();
                let v = Self::from_wire(d.get_u32()?);
                if v.is_err() {
                    *d = save;
                }
                v
            }
            fn buffer_len(&self) -> usize {
                4
            }
            fn emit_body(&self, e: &mut Encoder<'_>) -> Result<()> {
                e.put_u32(self.to_wire())
            }
        }
    };
}
pub(crate) use wire_enum;

wire_enum! {
    /// `nfsstat3` (RFC 1813 s2.6): the status of every result.
    Nfsstat3 {
        /// `NFS3_OK`
        Ok = 0,
        /// `NFS3ERR_PERM`
        Perm = 1,
        /// `NFS3ERR_NOENT`
        Noent = 2,
        /// `NFS3ERR_IO`
        Io = 5,
        /// `NFS3ERR_NXIO`
        Nxio = 6,
        /// `NFS3ERR_ACCES`
        Acces = 13,
        /// `NFS3ERR_EXIST`
        Exist = 17,
        /// `NFS3ERR_XDEV`
        Xdev = 18,
        /// `NFS3ERR_NODEV`
        Nodev = 19,
        /// `NFS3ERR_NOTDIR`
        Notdir = 20,
        /// `NFS3ERR_ISDIR`
        Isdir = 21,
        /// `NFS3ERR_INVAL`
        Inval = 22,
        /// `NFS3ERR_FBIG`
        Fbig = 27,
        /// `NFS3ERR_NOSPC`
        Nospc = 28,
        /// `NFS3ERR_ROFS`
        Rofs = 30,
        /// `NFS3ERR_MLINK`
        Mlink = 31,
        /// `NFS3ERR_NAMETOOLONG`
        Nametoolong = 63,
        /// `NFS3ERR_NOTEMPTY`
        Notempty = 66,
        /// `NFS3ERR_DQUOT`
        Dquot = 69,
        /// `NFS3ERR_STALE`
        Stale = 70,
        /// `NFS3ERR_REMOTE`
        Remote = 71,
        /// `NFS3ERR_BADHANDLE`
        Badhandle = 10001,
        /// `NFS3ERR_NOT_SYNC`
        NotSync = 10002,
        /// `NFS3ERR_BAD_COOKIE`
        BadCookie = 10003,
        /// `NFS3ERR_NOTSUPP`
        Notsupp = 10004,
        /// `NFS3ERR_TOOSMALL`
        Toosmall = 10005,
        /// `NFS3ERR_SERVERFAULT`
        Serverfault = 10006,
        /// `NFS3ERR_BADTYPE`
        Badtype = 10007,
        /// `NFS3ERR_JUKEBOX`
        Jukebox = 10008,
    }
}

wire_enum! {
    /// `ftype3` (RFC 1813 s2.5): the type of a file.
    Ftype3 {
        /// `NF3REG`: regular file.
        Reg = 1,
        /// `NF3DIR`: directory.
        Dir = 2,
        /// `NF3BLK`: block device.
        Blk = 3,
        /// `NF3CHR`: character device.
        Chr = 4,
        /// `NF3LNK`: symbolic link.
        Lnk = 5,
        /// `NF3SOCK`: socket.
        Sock = 6,
        /// `NF3FIFO`: named pipe.
        Fifo = 7,
    }
}

wire_enum! {
    /// `stable_how` (RFC 1813 s3.3.7): how far WRITE must commit data.
    StableHow {
        /// `UNSTABLE`: may be cached until COMMIT.
        Unstable = 0,
        /// `DATA_SYNC`: data on stable storage, metadata may lag.
        DataSync = 1,
        /// `FILE_SYNC`: data and metadata on stable storage.
        FileSync = 2,
    }
}

/// `specdata3` (RFC 1813 s2.5): device numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Specdata3 {
    /// `specdata1`
    pub major: u32,
    /// `specdata2`
    pub minor: u32,
}

/// `nfstime3` (RFC 1813 s2.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Nfstime3 {
    /// Seconds since the Unix epoch.
    pub seconds: u32,
    /// Nanoseconds.
    pub nseconds: u32,
}

impl<'a> Xdr<'a> for Nfstime3 {
    fn decode_body(d: &mut Decoder<'a>, _ddp: Option<&'a [u8]>) -> Result<Self> {
        Ok(Nfstime3 {
            seconds: d.get_u32()?,
            nseconds: d.get_u32()?,
        })
    }
    fn buffer_len(&self) -> usize {
        8
    }
    fn emit_body(&self, e: &mut Encoder<'_>) -> Result<()> {
        e.put_u32(self.seconds)?;
        e.put_u32(self.nseconds)
    }
}

/// `fattr3` (RFC 1813 s2.5): the attributes of a file, 84 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fattr3 {
    /// `type`
    pub ftype: Ftype3,
    /// `mode`: permission bits as in Unix.
    pub mode: u32,
    /// `nlink`
    pub nlink: u32,
    /// `uid`
    pub uid: u32,
    /// `gid`
    pub gid: u32,
    /// `size`, bytes.
    pub size: u64,
    /// `used`: disk bytes used.
    pub used: u64,
    /// `rdev`
    pub rdev: Specdata3,
    /// `fsid`
    pub fsid: u64,
    /// `fileid`
    pub fileid: u64,
    /// `atime`
    pub atime: Nfstime3,
    /// `mtime`
    pub mtime: Nfstime3,
    /// `ctime`
    pub ctime: Nfstime3,
}

impl Fattr3 {
    /// Encoded length.
    pub const LEN: usize = 84;
}

impl<'a> Xdr<'a> for Fattr3 {
    fn decode_body(d: &mut Decoder<'a>, _ddp: Option<&'a [u8]>) -> Result<Self> {
        if d.remaining() < Self::LEN {
            return Err(Error::Truncated);
        }
        Ok(Fattr3 {
            ftype: Ftype3::decode_body(d, None)?,
            mode: d.get_u32()?,
            nlink: d.get_u32()?,
            uid: d.get_u32()?,
            gid: d.get_u32()?,
            size: d.get_u64()?,
            used: d.get_u64()?,
            rdev: Specdata3 {
                major: d.get_u32()?,
                minor: d.get_u32()?,
            },
            fsid: d.get_u64()?,
            fileid: d.get_u64()?,
            atime: Nfstime3::decode_body(d, None)?,
            mtime: Nfstime3::decode_body(d, None)?,
            ctime: Nfstime3::decode_body(d, None)?,
        })
    }
    fn buffer_len(&self) -> usize {
        Self::LEN
    }
    fn emit_body(&self, e: &mut Encoder<'_>) -> Result<()> {
        e.put_u32(self.ftype.to_wire())?;
        e.put_u32(self.mode)?;
        e.put_u32(self.nlink)?;
        e.put_u32(self.uid)?;
        e.put_u32(self.gid)?;
        e.put_u64(self.size)?;
        e.put_u64(self.used)?;
        e.put_u32(self.rdev.major)?;
        e.put_u32(self.rdev.minor)?;
        e.put_u64(self.fsid)?;
        e.put_u64(self.fileid)?;
        self.atime.emit_body(e)?;
        self.mtime.emit_body(e)?;
        self.ctime.emit_body(e)
    }
}

/// `wcc_attr` (RFC 1813 s2.5): the attributes a client checks its cache
/// against, as they were before an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct WccAttr {
    /// `size`
    pub size: u64,
    /// `mtime`
    pub mtime: Nfstime3,
    /// `ctime`
    pub ctime: Nfstime3,
}

impl<'a> Xdr<'a> for WccAttr {
    fn decode_body(d: &mut Decoder<'a>, _ddp: Option<&'a [u8]>) -> Result<Self> {
        Ok(WccAttr {
            size: d.get_u64()?,
            mtime: Nfstime3::decode_body(d, None)?,
            ctime: Nfstime3::decode_body(d, None)?,
        })
    }
    fn buffer_len(&self) -> usize {
        24
    }
    fn emit_body(&self, e: &mut Encoder<'_>) -> Result<()> {
        e.put_u64(self.size)?;
        self.mtime.emit_body(e)?;
        self.ctime.emit_body(e)
    }
}

/// `wcc_data` (RFC 1813 s2.5): attributes before and after a change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct WccData {
    /// `before` (`pre_op_attr`)
    pub before: Option<WccAttr>,
    /// `after` (`post_op_attr`)
    pub after: Option<Fattr3>,
}

impl<'a> Xdr<'a> for WccData {
    fn decode_body(d: &mut Decoder<'a>, _ddp: Option<&'a [u8]>) -> Result<Self> {
        Ok(WccData {
            before: Option::decode_body(d, None)?,
            after: Option::decode_body(d, None)?,
        })
    }
    fn buffer_len(&self) -> usize {
        self.before.buffer_len() + self.after.buffer_len()
    }
    fn emit_body(&self, e: &mut Encoder<'_>) -> Result<()> {
        self.before.emit_body(e)?;
        self.after.emit_body(e)
    }
}

/// The `set_atime`/`set_mtime` unions of `sattr3` (RFC 1813 s2.5,
/// `time_how`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SetTime {
    /// `DONT_CHANGE = 0`
    #[default]
    DontChange,
    /// `SET_TO_SERVER_TIME = 1`
    ServerTime,
    /// `SET_TO_CLIENT_TIME = 2` with the time.
    ClientTime(Nfstime3),
}

impl<'a> Xdr<'a> for SetTime {
    fn decode_body(d: &mut Decoder<'a>, _ddp: Option<&'a [u8]>) -> Result<Self> {
        Ok(match d.get_u32()? {
            0 => SetTime::DontChange,
            1 => SetTime::ServerTime,
            2 => SetTime::ClientTime(Nfstime3::decode_body(d, None)?),
            _ => return Err(Error::UnknownValue),
        })
    }
    fn buffer_len(&self) -> usize {
        match self {
            SetTime::ClientTime(_) => 12,
            _ => 4,
        }
    }
    fn emit_body(&self, e: &mut Encoder<'_>) -> Result<()> {
        match self {
            SetTime::DontChange => e.put_u32(0),
            SetTime::ServerTime => e.put_u32(1),
            SetTime::ClientTime(t) => {
                e.put_u32(2)?;
                t.emit_body(e)
            }
        }
    }
}

/// `sattr3` (RFC 1813 s2.5): attributes to set; `None` leaves one alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Sattr3 {
    /// `set_mode3`
    pub mode: Option<u32>,
    /// `set_uid3`
    pub uid: Option<u32>,
    /// `set_gid3`
    pub gid: Option<u32>,
    /// `set_size3`
    pub size: Option<u64>,
    /// `set_atime`
    pub atime: SetTime,
    /// `set_mtime`
    pub mtime: SetTime,
}

impl<'a> Xdr<'a> for u32 {
    fn decode_body(d: &mut Decoder<'a>, _ddp: Option<&'a [u8]>) -> Result<Self> {
        d.get_u32()
    }
    fn buffer_len(&self) -> usize {
        4
    }
    fn emit_body(&self, e: &mut Encoder<'_>) -> Result<()> {
        e.put_u32(*self)
    }
}

impl<'a> Xdr<'a> for u64 {
    fn decode_body(d: &mut Decoder<'a>, _ddp: Option<&'a [u8]>) -> Result<Self> {
        d.get_u64()
    }
    fn buffer_len(&self) -> usize {
        8
    }
    fn emit_body(&self, e: &mut Encoder<'_>) -> Result<()> {
        e.put_u64(*self)
    }
}

impl<'a> Xdr<'a> for Sattr3 {
    fn decode_body(d: &mut Decoder<'a>, _ddp: Option<&'a [u8]>) -> Result<Self> {
        Ok(Sattr3 {
            mode: Option::decode_body(d, None)?,
            uid: Option::decode_body(d, None)?,
            gid: Option::decode_body(d, None)?,
            size: Option::decode_body(d, None)?,
            atime: SetTime::decode_body(d, None)?,
            mtime: SetTime::decode_body(d, None)?,
        })
    }
    fn buffer_len(&self) -> usize {
        self.mode.buffer_len()
            + self.uid.buffer_len()
            + self.gid.buffer_len()
            + self.size.buffer_len()
            + self.atime.buffer_len()
            + self.mtime.buffer_len()
    }
    fn emit_body(&self, e: &mut Encoder<'_>) -> Result<()> {
        self.mode.emit_body(e)?;
        self.uid.emit_body(e)?;
        self.gid.emit_body(e)?;
        self.size.emit_body(e)?;
        self.atime.emit_body(e)?;
        self.mtime.emit_body(e)
    }
}

/// An NFSv3 result: `union switch (nfsstat3 status) { case NFS3_OK: T
/// resok; default: F resfail; }`, the shape of every RFC 1813 result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Res3<T, F> {
    /// `NFS3_OK` and the `resok` arm.
    Ok(T),
    /// Any other status and the `resfail` arm. Emitting it with
    /// [`Nfsstat3::Ok`] is [`Error::Malformed`].
    Fail(Nfsstat3, F),
}

impl<T, F> Res3<T, F> {
    /// The status.
    pub fn status(&self) -> Nfsstat3 {
        match self {
            Res3::Ok(_) => Nfsstat3::Ok,
            Res3::Fail(s, _) => *s,
        }
    }
}

impl<'a, T: Xdr<'a>, F: Xdr<'a>> Xdr<'a> for Res3<T, F> {
    fn decode_body(d: &mut Decoder<'a>, ddp: Option<&'a [u8]>) -> Result<Self> {
        match Nfsstat3::decode_body(d, None)? {
            Nfsstat3::Ok => Ok(Res3::Ok(T::decode_body(d, ddp)?)),
            s => Ok(Res3::Fail(s, F::decode_body(d, None)?)),
        }
    }
    fn buffer_len(&self) -> usize {
        4 + match self {
            Res3::Ok(v) => v.buffer_len(),
            Res3::Fail(_, v) => v.buffer_len(),
        }
    }
    fn emit_body(&self, e: &mut Encoder<'_>) -> Result<()> {
        e.put_u32(self.status().to_wire())?;
        match self {
            Res3::Ok(v) => v.emit_body(e),
            Res3::Fail(_, v) => v.emit_body(e),
        }
    }
    fn check(&self) -> Result<()> {
        match self {
            Res3::Ok(v) => v.check(),
            Res3::Fail(Nfsstat3::Ok, _) => Err(Error::Malformed),
            Res3::Fail(_, v) => v.check(),
        }
    }
    fn ddp_data(&self) -> Option<&'a [u8]> {
        match self {
            Res3::Ok(v) => v.ddp_data(),
            Res3::Fail(..) => None,
        }
    }
    fn emit_before_ddp(&self, e: &mut Encoder<'_>) -> Result<()> {
        match self {
            Res3::Ok(v) => {
                e.put_u32(Nfsstat3::Ok.to_wire())?;
                v.emit_before_ddp(e)
            }
            Res3::Fail(..) => self.emit_body(e),
        }
    }
}

impl<'a> Xdr<'a> for bool {
    fn decode_body(d: &mut Decoder<'a>, _ddp: Option<&'a [u8]>) -> Result<Self> {
        d.get_bool()
    }
    fn buffer_len(&self) -> usize {
        4
    }
    fn emit_body(&self, e: &mut Encoder<'_>) -> Result<()> {
        e.put_bool(*self)
    }
}

/// Fixed-length opaque (`cookieverf3`, `writeverf3`, `createverf3`).
impl<'a, const N: usize> Xdr<'a> for [u8; N] {
    fn decode_body(d: &mut Decoder<'a>, _ddp: Option<&'a [u8]>) -> Result<Self> {
        let mut out = [0u8; N];
        out.copy_from_slice(d.get_opaque_fixed(N)?);
        Ok(out)
    }
    fn buffer_len(&self) -> usize {
        xdr::roundup(N)
    }
    fn emit_body(&self, e: &mut Encoder<'_>) -> Result<()> {
        e.put_opaque_fixed(self)
    }
}

/// A DDP-eligible variable-length opaque (RFC 8267 s4): read from the
/// input, or only its length word from the input and the data from `ddp`.
pub(crate) trait DdpField<'a>: Sized + Copy {
    /// The bound on the length.
    const MAX: usize;
    fn from_bytes(bytes: &'a [u8]) -> Self;
    fn bytes(&self) -> &'a [u8];

    fn decode_ddp(d: &mut Decoder<'a>, ddp: Option<&'a [u8]>) -> Result<Self> {
        super::get_ddp_opaque(d, Self::MAX, ddp).map(Self::from_bytes)
    }
    fn field_len(&self) -> usize {
        xdr::opaque_len(self.bytes().len())
    }
    fn emit_field(&self, e: &mut Encoder<'_>) -> Result<()> {
        e.put_opaque(self.bytes())
    }
    fn check_field(&self) -> Result<()> {
        if self.bytes().len() > Self::MAX {
            Err(Error::LimitExceeded)
        } else {
            Ok(())
        }
    }
}

/// READ and WRITE data, bounded by [`MAX_DATA_LEN`](super::MAX_DATA_LEN).
impl<'a> DdpField<'a> for &'a [u8] {
    const MAX: usize = super::MAX_DATA_LEN;
    fn from_bytes(bytes: &'a [u8]) -> Self {
        bytes
    }
    fn bytes(&self) -> &'a [u8] {
        self
    }
}

impl<'a, const MAX: usize> DdpField<'a> for Bounded<'a, MAX> {
    const MAX: usize = MAX;
    fn from_bytes(bytes: &'a [u8]) -> Self {
        // The decoder checked the bound.
        Bounded(bytes)
    }
    fn bytes(&self) -> &'a [u8] {
        self.0
    }
}

/// An XDR linked list (`T *next` chains, RFC 4506 s4.19): each element
/// preceded by TRUE, the list ended by FALSE; the READDIRPLUS entries and
/// the MOUNT export and mount lists.
///
/// Built from a slice to encode; decoded as the checked, borrowed list
/// bytes, read back by [`iter`](XdrList::iter) without allocating. Every
/// element takes at least 8 bytes on the wire (its link word and one
/// more), so decoding is linear in the input.
#[derive(Clone, Copy)]
pub struct XdrList<'a, T>(ListRepr<'a, T>);

#[derive(Clone, Copy)]
enum ListRepr<'a, T> {
    Slice(&'a [T]),
    /// Checked list bytes, up to and including the final FALSE.
    Wire(&'a [u8]),
}

impl<'a, T: Xdr<'a> + Copy> XdrList<'a, T> {
    /// A list of `items`, in order.
    pub const fn from_slice(items: &'a [T]) -> Self {
        XdrList(ListRepr::Slice(items))
    }

    /// The elements in order.
    pub fn iter(&self) -> ListIter<'a, T> {
        match self.0 {
            ListRepr::Slice(s) => ListIter(IterRepr::Slice(s.iter())),
            ListRepr::Wire(b) => ListIter(IterRepr::Wire(Decoder::new(b))),
        }
    }

    /// Number of elements (walks a decoded list).
    pub fn len(&self) -> usize {
        match self.0 {
            ListRepr::Slice(s) => s.len(),
            ListRepr::Wire(_) => self.iter().count(),
        }
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.iter().next().is_none()
    }
}

impl<'a, T: Xdr<'a> + Copy> Default for XdrList<'a, T> {
    fn default() -> Self {
        XdrList::from_slice(&[])
    }
}

impl<'a, T: Xdr<'a> + Copy + PartialEq> PartialEq for XdrList<'a, T> {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl<'a, T: Xdr<'a> + Copy + Eq> Eq for XdrList<'a, T> {}

impl<'a, T: Xdr<'a> + Copy + core::fmt::Debug> core::fmt::Debug for XdrList<'a, T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// Iterator over an [`XdrList`].
#[derive(Debug, Clone)]
pub struct ListIter<'a, T>(IterRepr<'a, T>);

#[derive(Debug, Clone)]
enum IterRepr<'a, T> {
    Slice(core::slice::Iter<'a, T>),
    Wire(Decoder<'a>),
}

impl<'a, T: Xdr<'a> + Copy> Iterator for ListIter<'a, T> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        match &mut self.0 {
            IterRepr::Slice(it) => it.next().copied(),
            // Checked when decoded: no error can occur here, and an error
            // would only end the iteration.
            IterRepr::Wire(d) => match d.get_present() {
                Ok(true) => T::decode_body(d, None).ok(),
                _ => None,
            },
        }
    }
}

impl<'a, T: Xdr<'a> + Copy> Xdr<'a> for XdrList<'a, T> {
    fn decode_body(d: &mut Decoder<'a>, _ddp: Option<&'a [u8]>) -> Result<Self> {
        let start = d.rest();
        let from = d.position();
        while d.get_present()? {
            T::decode_body(d, None)?;
        }
        Ok(XdrList(ListRepr::Wire(&start[..d.position() - from])))
    }
    fn buffer_len(&self) -> usize {
        match self.0 {
            ListRepr::Slice(s) => 4 + s.iter().map(|e| 4 + e.buffer_len()).sum::<usize>(),
            ListRepr::Wire(b) => b.len(),
        }
    }
    fn emit_body(&self, e: &mut Encoder<'_>) -> Result<()> {
        for item in self.iter() {
            e.put_present(true)?;
            item.emit_body(e)?;
        }
        e.put_present(false)
    }
    fn check(&self) -> Result<()> {
        self.iter().try_for_each(|e| e.check())
    }
}
