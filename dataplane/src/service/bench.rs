//! The bench program, served by [`BenchService`], and the
//! call encoders and reply decoders its clients use.
//!
//! The contract is `bench/tirpc/bench_prog.x` (docs/PROTOCOL.md, "Bench
//! program"): program [`PROGRAM`] version [`VERSION`], procedures NULL,
//! ECHO(`bench_data`) -> `bench_data`, SINK(`bench_data`) -> void,
//! SOURCE(`unsigned int count`) -> `bench_data`, where `bench_data` is
//! `opaque<MAX_DATA>`. The bulk argument of ECHO and SINK and the bulk
//! result of ECHO and SOURCE are DDP-eligible: over RDMA they may travel in
//! a read chunk (calls) or a write chunk (replies) instead of inline.

use core::ops::RangeInclusive;

use super::{CallInfo, ProcError, ReplyWriter, RpcService};
use crate::engine::DdpItem;
use crate::wire::rpc::{AcceptStatus, CallHeader, OpaqueAuth, ReplyBody, ReplyHeader};
use crate::wire::xdr::{self, Decoder, Encoder};
use crate::wire::Error as WireError;

/// Program number: 0x2052444D, in the range RFC 5531 appendix B leaves to
/// users (0x20000000-0x3FFFFFFF).
pub const PROGRAM: u32 = 0x2052_444D;
/// The only version.
pub const VERSION: u32 = 1;
/// Largest ECHO/SINK argument and ECHO/SOURCE result (`BENCH_MAXDATA`).
pub const MAX_DATA: u32 = 16 << 20;

/// The procedures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proc {
    /// 0: no arguments, no results.
    Null = 0,
    /// 1: returns its argument.
    Echo = 1,
    /// 2: consumes its argument, returns nothing.
    Sink = 2,
    /// 3: returns `count` pattern bytes.
    Source = 3,
}

/// Byte `i` of a SOURCE result: `(i * 31 + 7) mod 256`.
#[inline]
pub fn pattern_byte(i: usize) -> u8 {
    (i.wrapping_mul(31).wrapping_add(7)) as u8
}

/// Fills `out` with the SOURCE pattern (byte 0 of `out` is pattern byte 0).
pub fn fill_pattern(out: &mut [u8]) {
    // The pattern repeats every 256 bytes; copy a period rather than
    // computing each byte (source is a bandwidth benchmark).
    let mut period = [0u8; 256];
    for (i, b) in period.iter_mut().enumerate() {
        *b = pattern_byte(i);
    }
    for chunk in out.chunks_mut(256) {
        chunk.copy_from_slice(&period[..chunk.len()]);
    }
}

/// Index of the first byte of `data` that differs from the SOURCE pattern.
pub fn pattern_mismatch(data: &[u8]) -> Option<usize> {
    data.iter()
        .enumerate()
        .position(|(i, &b)| b != pattern_byte(i))
}

/// The bench program's server side.
#[derive(Debug, Clone, Copy, Default)]
pub struct BenchService;

impl RpcService for BenchService {
    fn program(&self) -> u32 {
        PROGRAM
    }

    fn versions(&self) -> RangeInclusive<u32> {
        VERSION..=VERSION
    }

    fn name(&self) -> &'static str {
        "rpcrdma_bench"
    }

    fn call(&self, call: &CallInfo<'_>, reply: &mut ReplyWriter<'_>) -> Result<(), ProcError> {
        let mut args = call.decoder();
        match call.procedure {
            p if p == Proc::Echo as u32 => {
                let data = args.get_opaque(MAX_DATA as usize)?;
                args.finish()?;
                reply.put_ddp_opaque(data)
            }
            p if p == Proc::Sink as u32 => {
                args.get_opaque(MAX_DATA as usize)?;
                args.finish()?;
                Ok(())
            }
            p if p == Proc::Source as u32 => {
                let count = args.get_u32()?;
                args.finish()?;
                if count > MAX_DATA {
                    return Err(ProcError::GarbageArgs);
                }
                fill_pattern(reply.put_ddp_opaque_in_place(count as usize)?);
                Ok(())
            }
            _ => Err(ProcError::ProcUnavail),
        }
    }
}

/// An encoded call: the message is `out[..len]`; `ddp` marks the
/// DDP-eligible argument (ECHO, SINK), for `engine::OutgoingCall::ddp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncodedCall {
    /// Length of the call message.
    pub len: usize,
    /// The DDP-eligible argument, if the procedure has one.
    pub ddp: Option<DdpItem>,
}

/// The argument of a call to encode.
#[derive(Debug, Clone, Copy)]
pub enum Args<'a> {
    /// NULL.
    Null,
    /// ECHO of these bytes.
    Echo(&'a [u8]),
    /// SINK of these bytes.
    Sink(&'a [u8]),
    /// SOURCE of this many bytes.
    Source(u32),
}

impl Args<'_> {
    /// The procedure.
    pub fn procedure(&self) -> Proc {
        match self {
            Args::Null => Proc::Null,
            Args::Echo(_) => Proc::Echo,
            Args::Sink(_) => Proc::Sink,
            Args::Source(_) => Proc::Source,
        }
    }

    /// Largest reply message this call can get: a reply header with an
    /// AUTH_NONE verifier, plus the result.
    pub fn max_reply_len(&self) -> u32 {
        let header =
            ReplyHeader::accepted(0, OpaqueAuth::None, AcceptStatus::Success).buffer_len() as u32;
        header
            + match self {
                Args::Null | Args::Sink(_) => 0,
                Args::Echo(d) => xdr::opaque_len(d.len()) as u32,
                Args::Source(n) => xdr::opaque_len(*n as usize) as u32,
            }
    }

    /// Length of the DDP-eligible result, if the procedure has one.
    pub fn ddp_result_len(&self) -> Option<u32> {
        match self {
            Args::Echo(d) => Some(d.len() as u32),
            Args::Source(n) => Some(*n),
            Args::Null | Args::Sink(_) => None,
        }
    }
}

/// An encoder over `out` holding the RPC call header of `args`.
fn call_header<'a>(out: &'a mut [u8], xid: u32, args: &Args<'_>) -> Result<Encoder<'a>, WireError> {
    let header = CallHeader::new(
        xid,
        PROGRAM,
        VERSION,
        args.procedure() as u32,
        OpaqueAuth::None,
        OpaqueAuth::None,
    );
    let mut enc = Encoder::new(out);
    header.emit(&mut enc)?;
    Ok(enc)
}

/// Encodes a version 1 call with an AUTH_NONE credential into `out`.
///
/// # Errors
/// [`WireError::BufferTooShort`] if it does not fit,
/// [`WireError::LimitExceeded`] for data longer than [`MAX_DATA`].
pub fn encode_call(out: &mut [u8], xid: u32, args: Args<'_>) -> Result<EncodedCall, WireError> {
    let mut enc = call_header(out, xid, &args)?;
    let ddp = match args {
        Args::Null => None,
        Args::Source(count) => {
            enc.put_u32(count)?;
            None
        }
        Args::Echo(data) | Args::Sink(data) => {
            if data.len() > MAX_DATA as usize {
                return Err(WireError::LimitExceeded);
            }
            let offset = enc.position() as u32 + 4;
            enc.put_opaque(data)?;
            Some(DdpItem {
                offset,
                len: data.len() as u32,
            })
        }
    };
    Ok(EncodedCall {
        len: enc.position(),
        ddp,
    })
}

/// [`encode_call`] for a directed call whose DDP item (the data of ECHO or
/// SINK) the server pulls from application memory (docs/CLIENT.md): the
/// message stops after the item's length word, and the returned item
/// names where the data would start. NULL and SOURCE encode as usual.
///
/// # Errors
/// As [`encode_call`].
pub fn encode_call_directed(
    out: &mut [u8],
    xid: u32,
    args: Args<'_>,
) -> Result<EncodedCall, WireError> {
    let (Args::Echo(data) | Args::Sink(data)) = args else {
        return encode_call(out, xid, args);
    };
    if data.len() > MAX_DATA as usize {
        return Err(WireError::LimitExceeded);
    }
    let mut enc = call_header(out, xid, &args)?;
    enc.put_u32(data.len() as u32)?;
    Ok(EncodedCall {
        len: enc.position(),
        ddp: Some(DdpItem {
            offset: enc.position() as u32,
            len: data.len() as u32,
        }),
    })
}

/// Why a bench reply is not a successful result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReplyError {
    /// The reply did not decode.
    #[error("malformed reply: {0}")]
    Malformed(WireError),
    /// The server denied the call.
    #[error("call denied")]
    Denied,
    /// The server accepted the call but did not run it successfully.
    #[error("call not successful: {0:?}")]
    Status(AcceptStatus),
}

/// Decodes a successful reply's `bench_data` result (ECHO, SOURCE), whose
/// bytes are either inline in `message` or, when the server moved them by
/// a write chunk, in `ddp` (the engine's `reply_ddp`; the inline message
/// then holds only the length word, RFC 5666 s3.4).
///
/// # Errors
/// [`ReplyError`] when the reply is not a well-formed success.
pub fn decode_data_reply<'a>(
    message: &'a [u8],
    ddp: Option<&'a [u8]>,
) -> Result<&'a [u8], ReplyError> {
    match ddp {
        Some(data) => decode_ddp_reply(message, data.len()).map(|()| data),
        None => {
            let mut dec = success_results(message)?;
            let data = dec
                .get_opaque(MAX_DATA as usize)
                .map_err(ReplyError::Malformed)?;
            dec.finish().map_err(ReplyError::Malformed)?;
            Ok(data)
        }
    }
}

/// Checks a successful data reply whose `ddp_len` result bytes were
/// placed in a write chunk: the message carries only their length word.
///
/// # Errors
/// [`ReplyError`] when the reply is not a success or the length differs.
pub fn decode_ddp_reply(message: &[u8], ddp_len: usize) -> Result<(), ReplyError> {
    let mut dec = success_results(message)?;
    let len = dec.get_u32().map_err(ReplyError::Malformed)?;
    if len as usize != ddp_len {
        return Err(ReplyError::Malformed(WireError::Malformed));
    }
    Ok(())
}

/// Checks a successful reply without results (NULL, SINK).
///
/// # Errors
/// [`ReplyError`] when the reply is not a well-formed, empty success.
pub fn decode_void_reply(message: &[u8]) -> Result<(), ReplyError> {
    success_results(message)?
        .finish()
        .map_err(ReplyError::Malformed)
}

/// A decoder over the results of a successful reply.
fn success_results(message: &[u8]) -> Result<Decoder<'_>, ReplyError> {
    let (header, len) = ReplyHeader::parse(message).map_err(ReplyError::Malformed)?;
    match header.body {
        ReplyBody::Accepted(a) if a.status == AcceptStatus::Success => {
            Ok(Decoder::new(&message[len..]))
        }
        ReplyBody::Accepted(a) => Err(ReplyError::Status(a.status)),
        ReplyBody::Denied(_) => Err(ReplyError::Denied),
    }
}
