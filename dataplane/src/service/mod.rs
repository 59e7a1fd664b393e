//! RPC services: the [`RpcService`] trait, the [`ServiceTable`] that
//! dispatches a call message to a service and encodes its reply, and the
//! built-in bench program ([`bench`]).
//!
//! # Where this runs
//! Inside a worker, run to completion, between two polls:
//! the worker hands [`ServiceTable::dispatch`] the reassembled call message
//! (the engine has already pulled any read chunks) and a preallocated
//! reply buffer; the service writes its results with a [`ReplyWriter`] and
//! marks the one DDP-eligible item, if any, while it encodes (the
//! upper-layer binding's decision, RFC 5666 s3.4; the engine then decides
//! inline, write chunk, reply chunk or responder-provided read chunk).
//! Nothing here allocates: a steady-state RPC costs no heap operation.
//!
//! # What the table answers by itself (RFC 5531 s9)
//! * `rpcvers != 2`: `MSG_DENIED` / `RPC_MISMATCH` (2, 2).
//! * A credential other than AUTH_NONE / AUTH_SYS, or one that does not
//!   decode: `MSG_DENIED` / `AUTH_ERROR` / `AUTH_BADCRED` (what Linux's
//!   svc does for an unknown flavor).
//! * Program not registered: `PROG_UNAVAIL`; version outside the program's
//!   range: `PROG_MISMATCH` with the range.
//! * Procedure 0 of every registered program and version: the NULL
//!   procedure (no arguments, no results), without calling the service.
//! * A service error: `PROC_UNAVAIL`, `GARBAGE_ARGS` or `SYSTEM_ERR`; a
//!   result larger than the reply buffer: `SYSTEM_ERR`.
//! * A message too short to carry an XID and a call direction: nothing
//!   (there is nobody to answer; [`Dispatch::Drop`]).
//!
//! CONF_RDMA (program 100417) is transport business: the engine answers it
//! from the connection's negotiated limits before a call reaches this
//! table (`engine::Config::serve_conf_rdma`).
//!
//! # Panic contract
//! [`ServiceTable::dispatch`] never panics on any call bytes; services get
//! their arguments as bytes and must decode them with the total
//! [`Decoder`].

pub mod bench;
pub mod latency;

use core::ops::RangeInclusive;
use std::sync::Arc;

use crate::engine::DdpItem;
use crate::wire::rpc::{
    peek_direction, peek_rpc_version, peek_xid, AcceptStatus, AuthStat, CallHeader, MessageType,
    OpaqueAuth, RejectedReply, ReplyHeader, RPC_VERSION,
};
use crate::wire::xdr::{Decoder, Encoder};
use crate::wire::Error as WireError;

/// `xid`, `msg_type`, `rpcvers`, `prog`, `vers`, `proc` (RFC 5531 s9): the
/// credential follows.
const CALL_FIXED_LEN: usize = 24;

/// One decoded call, as a service sees it.
#[derive(Debug, Clone, Copy)]
pub struct CallInfo<'a> {
    /// Transaction id.
    pub xid: u32,
    /// Program number.
    pub program: u32,
    /// Program version (inside the service's range).
    pub version: u32,
    /// Procedure number (never 0: the table answers NULL itself).
    pub procedure: u32,
    /// The caller's credential (AUTH_NONE or AUTH_SYS).
    pub credential: OpaqueAuth<'a>,
    /// The procedure's arguments, XDR, after the call header.
    pub args: &'a [u8],
}

impl<'a> CallInfo<'a> {
    /// A decoder over the arguments.
    pub fn decoder(&self) -> Decoder<'a> {
        Decoder::new(self.args)
    }
}

/// Why a procedure did not produce results; becomes the reply's
/// `accept_stat` (RFC 5531 s9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ProcError {
    /// The program has no such procedure (`PROC_UNAVAIL`).
    #[error("procedure unavailable")]
    ProcUnavail,
    /// The arguments did not decode (`GARBAGE_ARGS`).
    #[error("garbage arguments")]
    GarbageArgs,
    /// The server could not run the procedure (`SYSTEM_ERR`), e.g. the
    /// results do not fit the reply buffer.
    #[error("system error")]
    SystemErr,
}

impl ProcError {
    fn accept_status(self) -> AcceptStatus {
        match self {
            ProcError::ProcUnavail => AcceptStatus::ProcUnavail,
            ProcError::GarbageArgs => AcceptStatus::GarbageArgs,
            ProcError::SystemErr => AcceptStatus::SystemErr,
        }
    }
}

impl From<WireError> for ProcError {
    /// A decode error of the arguments is `GARBAGE_ARGS`; running out of
    /// reply space is `SYSTEM_ERR`.
    fn from(e: WireError) -> ProcError {
        match e {
            WireError::BufferTooShort => ProcError::SystemErr,
            _ => ProcError::GarbageArgs,
        }
    }
}

/// Where a service writes its results: an XDR encoder positioned after the
/// accepted-reply header, plus the DDP-eligible item marked while encoding.
#[derive(Debug)]
pub struct ReplyWriter<'a> {
    enc: Encoder<'a>,
    /// Bytes of the reply message before the encoder's first byte.
    base: usize,
    ddp: Option<DdpItem>,
}

impl<'a> ReplyWriter<'a> {
    /// The encoder for the results.
    pub fn encoder(&mut self) -> &mut Encoder<'a> {
        &mut self.enc
    }

    /// Writes `data` as a variable-length opaque and marks it DDP-eligible
    /// (RFC 5666 s3.4: the one item a write chunk may carry).
    ///
    /// # Errors
    /// [`ProcError::SystemErr`] if it does not fit, or an item is already
    /// marked (one DDP item per reply is what the engine moves).
    pub fn put_ddp_opaque(&mut self, data: &[u8]) -> Result<(), ProcError> {
        self.put_ddp_opaque_in_place(data.len())?
            .copy_from_slice(data);
        Ok(())
    }

    /// Like [`ReplyWriter::put_ddp_opaque`], but returns the `len` data
    /// bytes for the service to fill in place (no staging copy).
    ///
    /// # Errors
    /// As [`ReplyWriter::put_ddp_opaque`].
    pub fn put_ddp_opaque_in_place(&mut self, len: usize) -> Result<&mut [u8], ProcError> {
        if self.ddp.is_some() {
            return Err(ProcError::SystemErr);
        }
        let offset = self.base + self.enc.position() + 4;
        let item = DdpItem {
            offset: u32::try_from(offset).map_err(|_| ProcError::SystemErr)?,
            len: u32::try_from(len).map_err(|_| ProcError::SystemErr)?,
        };
        let data = self.enc.put_opaque_in_place(len)?;
        self.ddp = Some(item);
        Ok(data)
    }
}

/// An RPC program served inside the workers.
///
/// `call` runs on a worker core between two polls: it must not block, and
/// should not allocate (the steady-state zero-allocation test covers the
/// built-in services).
pub trait RpcService: Send + Sync {
    /// The program number.
    fn program(&self) -> u32;
    /// The versions served, lowest to highest (`PROG_MISMATCH` reports
    /// this range).
    fn versions(&self) -> RangeInclusive<u32>;
    /// A short name for logs and rpcbind listings.
    fn name(&self) -> &'static str;
    /// Runs procedure `call.procedure` (never 0) and writes its results.
    ///
    /// # Errors
    /// The [`ProcError`] that becomes the reply's `accept_stat`; anything
    /// already written is discarded.
    fn call(&self, call: &CallInfo<'_>, reply: &mut ReplyWriter<'_>) -> Result<(), ProcError>;
}

/// What [`ServiceTable::dispatch`] produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dispatch {
    /// Send the reply message `out[..len]`; `ddp` is its DDP-eligible
    /// item, if any.
    Reply {
        /// Length of the RPC reply message.
        len: usize,
        /// The DDP-eligible result.
        ddp: Option<DdpItem>,
    },
    /// No reply: the message is not a decodable call, or the reply buffer
    /// cannot hold even an error reply.
    Drop,
}

/// A call whose RPC header the transport has parsed already (the RDMA
/// engine does, to know what it delivers): its fields, and where its
/// arguments start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnownCall {
    /// RPC XID.
    pub xid: u32,
    /// Program number.
    pub program: u32,
    /// Program version.
    pub version: u32,
    /// Procedure number.
    pub procedure: u32,
    /// Length of the call header (`xid` through the verifier).
    pub header_len: usize,
}

impl KnownCall {
    /// The fixed words of `call` with the header length a parse found
    /// (`None` when the fixed words are not there).
    pub fn peek(call: &[u8], header_len: usize) -> Option<KnownCall> {
        let (program, version, procedure) = latency::peek_procedure(call)?;
        Some(KnownCall {
            xid: peek_xid(call)?,
            program,
            version,
            procedure,
            header_len,
        })
    }
}

/// What a worker (RDMA or TCP) does with a call message: the seam between
/// the transports and the services. [`ServiceTable`] implements it; tests
/// plug in any handler.
pub trait Dispatcher: Send + Sync + 'static {
    /// Handles the RPC call message `call` (XDR, as received), writing the
    /// whole RPC reply message into `reply`.
    fn dispatch(&self, call: &[u8], reply: &mut [u8]) -> Dispatch;

    /// As [`Dispatcher::dispatch`], for a call whose header `known`
    /// describes (parsed from these very bytes): a dispatcher may skip
    /// parsing it again. Answers exactly as `dispatch` would.
    fn dispatch_known(&self, call: &[u8], known: &KnownCall, reply: &mut [u8]) -> Dispatch {
        let _ = known;
        self.dispatch(call, reply)
    }

    /// The (program, version) pairs it serves, for the workers' latency
    /// tables ([`latency`]); none by default (nothing is then recorded).
    fn programs(&self) -> Vec<(u32, u32)> {
        Vec::new()
    }
}

impl Dispatcher for ServiceTable {
    fn dispatch(&self, call: &[u8], reply: &mut [u8]) -> Dispatch {
        ServiceTable::dispatch(self, call, reply)
    }

    fn dispatch_known(&self, call: &[u8], known: &KnownCall, reply: &mut [u8]) -> Dispatch {
        ServiceTable::dispatch_known(self, call, known, reply)
    }

    fn programs(&self) -> Vec<(u32, u32)> {
        ServiceTable::programs(self)
            .map(|(p, v, _)| (p, v))
            .collect()
    }
}

/// Why [`ServiceTable::register`] refused a service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RegisterError {
    /// Another service already serves the program.
    #[error("program {0} is already registered")]
    Duplicate(u32),
    /// The version range is empty.
    #[error("program {0} has an empty version range")]
    NoVersions(u32),
}

/// The services a worker dispatches to, by program number.
#[derive(Clone, Default)]
pub struct ServiceTable {
    services: Vec<Arc<dyn RpcService>>,
}

impl core::fmt::Debug for ServiceTable {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_list()
            .entries(self.services.iter().map(|s| (s.name(), s.program())))
            .finish()
    }
}

impl ServiceTable {
    /// A table with no services.
    pub fn new() -> ServiceTable {
        ServiceTable::default()
    }

    /// The daemon's built-in table: the bench program ([`bench`]).
    pub fn builtin() -> ServiceTable {
        let mut t = ServiceTable::new();
        t.register(Arc::new(bench::BenchService))
            .expect("an empty table accepts the bench program");
        t
    }

    /// Adds a service.
    ///
    /// # Errors
    /// [`RegisterError::Duplicate`] if the program is already served,
    /// [`RegisterError::NoVersions`] for an empty version range.
    pub fn register(&mut self, service: Arc<dyn RpcService>) -> Result<(), RegisterError> {
        let program = service.program();
        if service.versions().is_empty() {
            return Err(RegisterError::NoVersions(program));
        }
        if self.find(program).is_some() {
            return Err(RegisterError::Duplicate(program));
        }
        self.services.push(service);
        Ok(())
    }

    /// Every (program, version, name) served, for rpcbind and logs.
    pub fn programs(&self) -> impl Iterator<Item = (u32, u32, &'static str)> + '_ {
        self.services.iter().flat_map(|s| {
            let (program, name) = (s.program(), s.name());
            s.versions().map(move |v| (program, v, name))
        })
    }

    fn find(&self, program: u32) -> Option<&dyn RpcService> {
        // A handful of programs: a linear scan beats hashing.
        self.services
            .iter()
            .find(|s| s.program() == program)
            .map(|s| &**s)
    }

    /// Decodes the call in `call_message`, runs it, and encodes the reply
    /// into `out` (see the module doc for the answers the table gives by
    /// itself). Never panics, never allocates.
    pub fn dispatch(&self, call_message: &[u8], out: &mut [u8]) -> Dispatch {
        let (Some(xid), Some(MessageType::Call)) =
            (peek_xid(call_message), peek_direction(call_message))
        else {
            return Dispatch::Drop;
        };
        if peek_rpc_version(call_message).is_some_and(|v| v != RPC_VERSION) {
            return denied(out, xid, RejectedReply::RPC_VERSION_MISMATCH);
        }
        let Ok((header, header_len)) = CallHeader::parse(call_message) else {
            // The fixed part is there (the version was peeked) but the
            // credential or verifier does not decode.
            return match peek_rpc_version(call_message) {
                Some(_) => denied(out, xid, RejectedReply::AuthError(AuthStat::BadCred)),
                None => Dispatch::Drop,
            };
        };
        let known = KnownCall {
            xid,
            program: header.program,
            version: header.version,
            procedure: header.procedure,
            header_len,
        };
        self.answer(call_message, &known, header.credential, out)
    }

    /// As [`ServiceTable::dispatch`] for a call whose header the transport
    /// parsed (`known`, from these bytes): the six fixed words are compared
    /// with `known` and only the credential and verifier are decoded again,
    /// which must end at `known.header_len`. Anything that differs takes
    /// the full path, so the answer is `dispatch`'s whatever `known` says.
    pub fn dispatch_known(
        &self,
        call_message: &[u8],
        known: &KnownCall,
        out: &mut [u8],
    ) -> Dispatch {
        // The fixed words are what `known` says (the same peeks
        // `dispatch` starts with, and the ones `KnownCall::peek` reads).
        if peek_direction(call_message) != Some(MessageType::Call)
            || peek_rpc_version(call_message) != Some(RPC_VERSION)
            || KnownCall::peek(call_message, known.header_len).as_ref() != Some(known)
        {
            return self.dispatch(call_message, out);
        }
        let mut d = Decoder::new(call_message);
        let credential = match (
            d.skip(CALL_FIXED_LEN),
            OpaqueAuth::decode(&mut d),
            OpaqueAuth::decode(&mut d),
        ) {
            (Ok(()), Ok(credential), Ok(_verifier)) if d.position() == known.header_len => {
                credential
            }
            _ => return self.dispatch(call_message, out),
        };
        self.answer(call_message, known, credential, out)
    }

    /// The answer to a decoded call (the common part of both dispatches).
    fn answer(
        &self,
        call_message: &[u8],
        header: &KnownCall,
        credential: OpaqueAuth<'_>,
        out: &mut [u8],
    ) -> Dispatch {
        let xid = header.xid;
        if !matches!(credential, OpaqueAuth::None | OpaqueAuth::Sys(_)) {
            return denied(out, xid, RejectedReply::AuthError(AuthStat::BadCred));
        }
        let Some(service) = self.find(header.program) else {
            return accepted_error(out, xid, AcceptStatus::ProgUnavail);
        };
        let versions = service.versions();
        if !versions.contains(&header.version) {
            let status = AcceptStatus::ProgMismatch {
                low: *versions.start(),
                high: *versions.end(),
            };
            return accepted_error(out, xid, status);
        }
        let success = ReplyHeader::accepted(xid, OpaqueAuth::None, AcceptStatus::Success);
        let base = success.buffer_len();
        if out.len() < base {
            return Dispatch::Drop;
        }
        let (head, body) = out.split_at_mut(base);
        if success.emit(&mut Encoder::new(head)).is_err() {
            return Dispatch::Drop;
        }
        if header.procedure == 0 {
            // The NULL procedure of every program (RFC 5531 s12.1 habit).
            return Dispatch::Reply {
                len: base,
                ddp: None,
            };
        }
        let call = CallInfo {
            xid,
            program: header.program,
            version: header.version,
            procedure: header.procedure,
            credential,
            args: call_message.get(header.header_len..).unwrap_or(&[]),
        };
        let mut writer = ReplyWriter {
            enc: Encoder::new(body),
            base,
            ddp: None,
        };
        match service.call(&call, &mut writer) {
            Ok(()) => Dispatch::Reply {
                len: base + writer.enc.position(),
                ddp: writer.ddp,
            },
            Err(e) => accepted_error(out, xid, e.accept_status()),
        }
    }
}

/// `out` := an accepted reply with an error status and no results.
fn accepted_error(out: &mut [u8], xid: u32, status: AcceptStatus) -> Dispatch {
    emit_header(out, &ReplyHeader::accepted(xid, OpaqueAuth::None, status))
}

/// `out` := a denied reply.
fn denied(out: &mut [u8], xid: u32, reason: RejectedReply) -> Dispatch {
    emit_header(out, &ReplyHeader::denied(xid, reason))
}

fn emit_header(out: &mut [u8], header: &ReplyHeader<'_>) -> Dispatch {
    let mut enc = Encoder::new(out);
    match header.emit(&mut enc) {
        Ok(()) => Dispatch::Reply {
            len: enc.position(),
            ddp: None,
        },
        Err(_) => Dispatch::Drop,
    }
}

#[cfg(test)]
mod tests;
