//! MOUNT version 3 (RFC 1813 appendix I): every procedure.

use super::nfs3::{proc_enum, xdr_struct};
use super::types::wire_enum;
use super::{
    success_results, DirPath, Encoded, Error, FileHandle, MountName, ReplyError, Result, Xdr,
    XdrList, MOUNT_PROGRAM, MOUNT_V3,
};
use crate::engine::ReplyExpect;
use crate::wire::rpc::OpaqueAuth;
use crate::wire::xdr::{Decoder, Encoder};

/// The largest DUMP or EXPORT reply [`MountArgs::reply_expect`] asks for:
/// both lists are unbounded in the protocol.
pub const MAX_MOUNT_LIST_REPLY: u32 = 64 << 10;

/// Most entries of `mountres3_ok.auth_flavors` kept (the XDR leaves the
/// array unbounded; servers send a handful).
pub const MAX_AUTH_FLAVORS: usize = 16;

/// MOUNT version 3 procedure numbers (appendix I).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MountProc {
    /// `MOUNTPROC3_NULL`
    Null = 0,
    /// `MOUNTPROC3_MNT`
    Mnt = 1,
    /// `MOUNTPROC3_DUMP`
    Dump = 2,
    /// `MOUNTPROC3_UMNT`
    Umnt = 3,
    /// `MOUNTPROC3_UMNTALL`
    Umntall = 4,
    /// `MOUNTPROC3_EXPORT`
    Export = 5,
}

impl MountProc {
    pub(crate) const ALL: [MountProc; 6] = [
        MountProc::Null,
        MountProc::Mnt,
        MountProc::Dump,
        MountProc::Umnt,
        MountProc::Umntall,
        MountProc::Export,
    ];

    /// The procedure with number `value`.
    ///
    /// # Errors
    /// [`Error::UnknownValue`] above 5.
    pub fn from_wire(value: u32) -> Result<Self> {
        super::by_number(&Self::ALL, value)
    }

    /// The procedure number.
    pub const fn to_wire(self) -> u32 {
        self as u32
    }
}

wire_enum! {
    /// `mountstat3` (appendix I).
    Mountstat3 {
        /// `MNT3_OK`
        Ok = 0,
        /// `MNT3ERR_PERM`
        Perm = 1,
        /// `MNT3ERR_NOENT`
        Noent = 2,
        /// `MNT3ERR_IO`
        Io = 5,
        /// `MNT3ERR_ACCES`
        Acces = 13,
        /// `MNT3ERR_NOTDIR`
        Notdir = 20,
        /// `MNT3ERR_INVAL`
        Inval = 22,
        /// `MNT3ERR_NAMETOOLONG`
        Nametoolong = 63,
        /// `MNT3ERR_NOTSUPP`
        Notsupp = 10004,
        /// `MNT3ERR_SERVERFAULT`
        Serverfault = 10006,
    }
}

/// `mountres3_ok`: the export's root handle and the RPC auth flavors the
/// server accepts for it (at most [`MAX_AUTH_FLAVORS`], kept in place).
#[derive(Clone, Copy)]
pub struct MountRes3Ok<'a> {
    fhandle: FileHandle<'a>,
    flavors: [u32; MAX_AUTH_FLAVORS],
    count: u8,
}

impl<'a> MountRes3Ok<'a> {
    /// A result.
    ///
    /// # Errors
    /// [`Error::LimitExceeded`] for more than [`MAX_AUTH_FLAVORS`] flavors.
    pub fn new(fhandle: FileHandle<'a>, auth_flavors: &[u32]) -> Result<Self> {
        if auth_flavors.len() > MAX_AUTH_FLAVORS {
            return Err(Error::LimitExceeded);
        }
        let mut flavors = [0; MAX_AUTH_FLAVORS];
        flavors[..auth_flavors.len()].copy_from_slice(auth_flavors);
        Ok(MountRes3Ok {
            fhandle,
            flavors,
            count: auth_flavors.len() as u8,
        })
    }

    /// `fhandle`
    pub fn fhandle(&self) -> FileHandle<'a> {
        self.fhandle
    }

    /// `auth_flavors` (RFC 5531 flavor numbers).
    pub fn auth_flavors(&self) -> &[u32] {
        &self.flavors[..usize::from(self.count)]
    }
}

impl PartialEq for MountRes3Ok<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.fhandle == other.fhandle && self.auth_flavors() == other.auth_flavors()
    }
}

impl Eq for MountRes3Ok<'_> {}

impl core::fmt::Debug for MountRes3Ok<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("MountRes3Ok")
            .field("fhandle", &self.fhandle)
            .field("auth_flavors", &self.auth_flavors())
            .finish()
    }
}

impl<'a> Xdr<'a> for MountRes3Ok<'a> {
    fn decode_body(d: &mut Decoder<'a>, _ddp: Option<&'a [u8]>) -> Result<Self> {
        let fhandle = FileHandle::decode_body(d, None)?;
        let count = d.get_count(MAX_AUTH_FLAVORS, 4)?;
        let mut flavors = [0; MAX_AUTH_FLAVORS];
        for f in flavors.iter_mut().take(count) {
            *f = d.get_u32()?;
        }
        Ok(MountRes3Ok {
            fhandle,
            flavors,
            count: count as u8,
        })
    }
    fn buffer_len(&self) -> usize {
        self.fhandle.buffer_len() + 4 + 4 * self.auth_flavors().len()
    }
    fn emit_body(&self, e: &mut Encoder<'_>) -> Result<()> {
        self.fhandle.emit_body(e)?;
        e.put_count(self.auth_flavors().len())?;
        for &f in self.auth_flavors() {
            e.put_u32(f)?;
        }
        Ok(())
    }
}

/// `mountres3`: the MNT result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MntRes3<'a> {
    /// `MNT3_OK` and `mountinfo`.
    Ok(MountRes3Ok<'a>),
    /// Another status, nothing else. Emitting it with
    /// [`Mountstat3::Ok`] is [`Error::Malformed`].
    Fail(Mountstat3),
}

impl<'a> Xdr<'a> for MntRes3<'a> {
    fn decode_body(d: &mut Decoder<'a>, _ddp: Option<&'a [u8]>) -> Result<Self> {
        match Mountstat3::decode_body(d, None)? {
            Mountstat3::Ok => Ok(MntRes3::Ok(MountRes3Ok::decode_body(d, None)?)),
            s => Ok(MntRes3::Fail(s)),
        }
    }
    fn buffer_len(&self) -> usize {
        4 + match self {
            MntRes3::Ok(v) => v.buffer_len(),
            MntRes3::Fail(_) => 0,
        }
    }
    fn emit_body(&self, e: &mut Encoder<'_>) -> Result<()> {
        match self {
            MntRes3::Ok(v) => {
                e.put_u32(Mountstat3::Ok.to_wire())?;
                v.emit_body(e)
            }
            MntRes3::Fail(s) => e.put_u32(s.to_wire()),
        }
    }
    fn check(&self) -> Result<()> {
        match self {
            MntRes3::Fail(Mountstat3::Ok) => Err(Error::Malformed),
            _ => Ok(()),
        }
    }
}

xdr_struct! {
    /// `mountbody` without its link: a client that has mounted a path.
    MountBody<'a> {
        /// `ml_hostname`
        hostname: MountName<'a>,
        /// `ml_directory`
        directory: DirPath<'a>,
    }
}

/// `mountlist`: the DUMP result (each element at least 12 bytes).
pub type MountList<'a> = XdrList<'a, MountBody<'a>>;

/// `groups`: the names allowed to mount an export.
pub type GroupList<'a> = XdrList<'a, MountName<'a>>;

xdr_struct! {
    /// `exportnode` without its link.
    ExportNode<'a> {
        /// `ex_dir`
        dir: DirPath<'a>,
        /// `ex_groups`
        groups: GroupList<'a>,
    }
}

/// `exports`: the EXPORT result (each element at least 12 bytes).
pub type ExportList<'a> = XdrList<'a, ExportNode<'a>>;

proc_enum! {
    /// The arguments of a MOUNT v3 call, by procedure.
    MountArgs, MountProc {
        /// MNT: the export's path.
        Mnt(DirPath<'a>),
        /// DUMP: no arguments.
        Dump(()),
        /// UMNT: the export's path.
        Umnt(DirPath<'a>),
        /// UMNTALL: no arguments.
        Umntall(()),
        /// EXPORT: no arguments.
        Export(()),
    }
}

proc_enum! {
    /// The results of a MOUNT v3 reply, by procedure.
    MountRes, MountProc {
        /// MNT
        Mnt(MntRes3<'a>),
        /// DUMP: who has mounted what.
        Dump(MountList<'a>),
        /// UMNT: no results (`void`).
        Umnt(()),
        /// UMNTALL: no results.
        Umntall(()),
        /// EXPORT: the exports and who may mount them.
        Export(ExportList<'a>),
    }
}

/// Encodes a MOUNT v3 call (program 100005 version 3) with credential
/// `credential` and an AUTH_NONE verifier into `out`.
///
/// # Errors
/// [`Error::BufferTooShort`] if it does not fit, or an error of
/// `CallHeader::emit`.
pub fn encode_mount_call(
    out: &mut [u8],
    xid: u32,
    credential: OpaqueAuth<'_>,
    args: &MountArgs<'_>,
) -> Result<Encoded> {
    let procedure = (MOUNT_PROGRAM, MOUNT_V3, args.procedure().to_wire());
    super::encode_program_call(out, xid, procedure, credential, args)
}

/// Encodes a successful RPC reply carrying `res` into `out`.
///
/// # Errors
/// As [`encode_mount_call`]; [`Error::Malformed`] for
/// `MntRes3::Fail(Mountstat3::Ok)`.
pub fn encode_mount_reply(
    out: &mut [u8],
    xid: u32,
    verifier: OpaqueAuth<'_>,
    res: &MountRes<'_>,
) -> Result<Encoded> {
    super::encode_success_reply(out, xid, verifier, res)
}

/// Decodes the reply `message` to a MOUNT call of `procedure`.
///
/// # Errors
/// [`ReplyError`] when the reply is not a success or its results do not
/// decode exactly.
pub fn decode_mount_reply(
    procedure: MountProc,
    message: &[u8],
) -> core::result::Result<MountRes<'_>, ReplyError> {
    let dec = success_results(message)?;
    MountRes::parse_proc(procedure, dec.rest(), None).map_err(ReplyError::Malformed)
}

impl MountArgs<'_> {
    /// What the reply to this call may look like (see
    /// [`Nfs3Args::reply_expect`](super::Nfs3Args::reply_expect)): MNT's
    /// result with a 64-byte handle and [`MAX_AUTH_FLAVORS`] flavors,
    /// [`MAX_MOUNT_LIST_REPLY`] for DUMP and EXPORT; no DDP-eligible
    /// result.
    pub fn reply_expect(&self) -> ReplyExpect {
        let results = match self {
            MountArgs::Null | MountArgs::Umnt(_) | MountArgs::Umntall(_) => 0,
            MountArgs::Mnt(_) => 4 + 4 + super::FHSIZE3 as u32 + 4 + 4 * MAX_AUTH_FLAVORS as u32,
            MountArgs::Dump(_) | MountArgs::Export(_) => MAX_MOUNT_LIST_REPLY,
        };
        ReplyExpect {
            max_len: super::nfs3::success_header_len() + results,
            ddp_max: None,
        }
    }
}
