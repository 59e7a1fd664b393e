//! The server's message limit, as the bench can explain it.
//!
//! A server refuses a call whose message (bulk data included) is larger
//! than its limit with RDMA_ERROR / ERR_CHUNK, and a reply that would be
//! larger with SYSTEM_ERR (rpcrdmad: `transport.max_message`). Neither
//! answer says which limit or how large it is, so without this the bench
//! could only print `PeerChunkError`. The bench knows the sizes of its own
//! messages; when one is over rpcrdmad's default limit, the failure is
//! reported as that: the message's size, the key and the default.

use crate::transport::Op;

/// rpcrdmad's default `transport.max_message` (1 MiB of data plus 4 KiB
/// of headers; docs/CONFIG.md).
pub const RPCRDMAD_DEFAULT_MAX_MESSAGE: u32 = (1 << 20) + 4096;

/// An RPC call header with AUTH_NONE credentials and verifier: XID,
/// message type, RPC version, program, version, procedure, two empty
/// opaque_auths.
const CALL_HEADER: u64 = 40;
/// An accepted reply header: XID, message type, reply status, an empty
/// verifier, accept status.
const REPLY_HEADER: u64 = 24;

/// Bytes of a counted opaque of `n` bytes: length word and padded data.
fn opaque(n: u32) -> u64 {
    4 + u64::from(n).next_multiple_of(4)
}

/// Size of the RPC call message of `op` with `size` data bytes.
pub fn call_bytes(op: Op, size: u32) -> u64 {
    CALL_HEADER
        + match op {
            Op::Null => 0,
            Op::Read => 4,
            Op::Echo | Op::Write => opaque(size),
        }
}

/// Size of the RPC reply message of `op` with `size` data bytes.
pub fn reply_bytes(op: Op, size: u32) -> u64 {
    REPLY_HEADER
        + match op {
            Op::Null | Op::Write => 0,
            Op::Echo | Op::Read => opaque(size),
        }
}

/// How the server refused a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// RDMA_ERROR / ERR_CHUNK: the call's chunks were not acceptable
    /// (first suspect: the call is over the limit).
    ErrChunk,
    /// SYSTEM_ERR: the server ran the call but could not send the reply
    /// (first suspect: the reply is over the limit).
    SystemErr,
}

/// The one-line explanation of `refusal` for a call of `op` with `size`
/// data bytes, when its call or reply is over rpcrdmad's default
/// `transport.max_message`; `None` when neither is (the refusal has
/// another cause).
pub fn over_limit(op: Op, size: u32, refusal: Refusal) -> Option<String> {
    let limit = u64::from(RPCRDMAD_DEFAULT_MAX_MESSAGE);
    let (call, reply) = (call_bytes(op, size), reply_bytes(op, size));
    let (what, bytes, answer) = match refusal {
        Refusal::ErrChunk if call > limit => ("call", call, "RDMA_ERROR ERR_CHUNK"),
        Refusal::SystemErr if reply > limit => ("reply", reply, "SYSTEM_ERR"),
        // The call got through but its reply would not have.
        Refusal::ErrChunk if reply > limit => ("reply", reply, "RDMA_ERROR ERR_CHUNK"),
        _ => return None,
    };
    // The largest data size whose messages fit the default limit: the
    // limit less the largest header around the data.
    let data = u64::from(size).next_multiple_of(4);
    let headers = match op {
        Op::Echo => (call - data).max(reply - data),
        Op::Write => call - data,
        Op::Read => reply - data,
        Op::Null => 0,
    };
    let fits = limit.saturating_sub(headers) / 4 * 4;
    Some(format!(
        "{what} of {bytes} bytes exceeds the server's transport.max_message ({limit} bytes, \
         rpcrdmad's default) and was refused ({answer}); raise transport.max_message in the \
         server's configuration to at least {need} bytes, or use a --size of at most {fits}",
        need = bytes.next_multiple_of(4)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use dataplane::service::bench::{encode_call, Args};

    #[test]
    fn call_sizes_are_the_encoded_sizes() {
        let data = vec![7u8; 4097];
        let mut buf = vec![0u8; 8192];
        for (op, args, size) in [
            (Op::Null, Args::Null, 0),
            (Op::Read, Args::Source(4097), 4097),
            (Op::Echo, Args::Echo(&data), 4097),
            (Op::Write, Args::Sink(&data[..4096]), 4096),
        ] {
            let e = encode_call(&mut buf, 1, args).unwrap();
            assert_eq!(call_bytes(op, size), e.len as u64, "{op:?}");
        }
    }

    #[test]
    fn a_two_mib_echo_names_both_sizes_and_the_key() {
        let m = over_limit(Op::Echo, 2 << 20, Refusal::ErrChunk).unwrap();
        assert_eq!(
            m,
            "call of 2097196 bytes exceeds the server's transport.max_message (1052672 bytes, \
             rpcrdmad's default) and was refused (RDMA_ERROR ERR_CHUNK); raise \
             transport.max_message in the server's configuration to at least 2097196 bytes, \
             or use a --size of at most 1052628"
        );
        let m = over_limit(Op::Read, 2 << 20, Refusal::SystemErr).unwrap();
        assert!(
            m.starts_with(
                "reply of 2097180 bytes exceeds the server's transport.max_message (1052672 bytes"
            ),
            "{m}"
        );
        // What fits is not blamed on the limit.
        assert_eq!(over_limit(Op::Echo, 1 << 20, Refusal::ErrChunk), None);
        assert_eq!(over_limit(Op::Null, 0, Refusal::SystemErr), None);
        // The suggested size fits, four bytes more do not.
        assert!(m.ends_with("or use a --size of at most 1052644"), "{m}");
        assert_eq!(over_limit(Op::Read, 1_052_644, Refusal::SystemErr), None);
        assert!(over_limit(Op::Read, 1_052_648, Refusal::SystemErr).is_some());
        assert_eq!(over_limit(Op::Echo, 1_052_628, Refusal::ErrChunk), None);
        assert!(over_limit(Op::Echo, 1_052_632, Refusal::ErrChunk).is_some());
        let m = over_limit(Op::Write, 2 << 20, Refusal::ErrChunk).unwrap();
        assert!(m.starts_with("call of 2097196 bytes"), "{m}");
        assert!(m.ends_with("or use a --size of at most 1052628"), "{m}");
    }
}
