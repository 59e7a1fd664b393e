//! CONF_RDMA, the RPC-over-RDMA connection configuration protocol
//! (RFC 5666 s6), and the rpcbind netids of RPC-over-RDMA (RFC 5666 s12).
//!
//! Only the procedure's argument and result bodies live here; the ONC RPC
//! call and reply headers around them belong to `wire::rpc`. Both bodies
//! are three XDR `unsigned int`s (RFC 5666 s6.2), 12 bytes.
//!
//! # Panic contract
//! Nothing here panics; decoders and encoders return [`Error`] values.

use super::xdr::{Decoder, Encoder};
use super::{Error, Result};

/// RPC program number of CONF_RDMA (`rdmaconfig`, RFC 5666 s6.2, s12).
pub const CONFIG_RDMA_PROG: u32 = 100_417;
/// The only version of the program RFC 5666 defines.
pub const CONFIG_RDMA_VERS: u32 = 1;
/// The NULL procedure every ONC RPC program has.
pub const CONFIG_RDMA_PROC_NULL: u32 = 0;
/// The CONF_RDMA procedure.
pub const CONF_RDMA_PROC: u32 = 1;

/// rpcbind netid of RPC-over-RDMA with IPv4 addressing (RFC 5666 s12).
pub const NETID_RDMA: &str = "rdma";
/// rpcbind netid of RPC-over-RDMA with IPv6 addressing (RFC 5666 s12).
pub const NETID_RDMA6: &str = "rdma6";

/// Encoded length of either body.
pub const BODY_LEN: usize = 12;

/// The CONF_RDMA argument (`config_rdma_req`, RFC 5666 s6.2): what the
/// client asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ConfigRdmaReq {
    /// Largest inline call the client wants to send, in bytes.
    pub maxcall_sendsize: u32,
    /// Largest inline reply the client will accept, in bytes.
    pub maxreply_sendsize: u32,
    /// RDMA Reads the client allows in flight at itself (its IRD).
    pub maxrdmaread: u32,
}

/// The CONF_RDMA result (`config_rdma_reply`, RFC 5666 s6.2): what the
/// server grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ConfigRdmaReply {
    /// Largest inline call the server accepts, in bytes.
    pub maxcall_sendsize: u32,
    /// Receive buffer alignment the server recommends for opaque data
    /// (the RDMA_MSGP `align` a client may use).
    pub align: u32,
    /// RDMA Reads the server allows in flight at itself.
    pub maxrdmaread: u32,
}

/// Reads three words and insists the input held nothing else.
fn parse_words(bytes: &[u8]) -> Result<[u32; 3]> {
    let mut dec = Decoder::new(bytes);
    let w = decode_words(&mut dec)?;
    dec.finish()?;
    Ok(w)
}

fn decode_words(dec: &mut Decoder<'_>) -> Result<[u32; 3]> {
    Ok([dec.get_u32()?, dec.get_u32()?, dec.get_u32()?])
}

fn encode_words(enc: &mut Encoder<'_>, w: [u32; 3]) -> Result<()> {
    if enc.remaining() < BODY_LEN {
        return Err(Error::BufferTooShort);
    }
    w.iter().try_for_each(|v| enc.put_u32(*v))
}

fn emit_words(buf: &mut [u8], w: [u32; 3]) -> Result<usize> {
    let mut enc = Encoder::new(buf);
    encode_words(&mut enc, w)?;
    Ok(enc.position())
}

impl ConfigRdmaReq {
    /// Decodes the body, which must be all of `bytes`.
    ///
    /// # Errors
    /// [`Error::Truncated`] if shorter than 12 bytes,
    /// [`Error::TrailingBytes`] if longer.
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        parse_words(bytes).map(Self::from_words)
    }

    /// Decodes the body at the decoder's position.
    ///
    /// # Errors
    /// [`Error::Truncated`] if fewer than 12 bytes remain.
    pub fn decode(dec: &mut Decoder<'_>) -> Result<Self> {
        decode_words(dec).map(Self::from_words)
    }

    fn from_words([maxcall_sendsize, maxreply_sendsize, maxrdmaread]: [u32; 3]) -> Self {
        ConfigRdmaReq {
            maxcall_sendsize,
            maxreply_sendsize,
            maxrdmaread,
        }
    }

    /// Always [`BODY_LEN`].
    pub const fn buffer_len(&self) -> usize {
        BODY_LEN
    }

    // config_rdma_req = maxcall_sendsize maxreply_sendsize maxrdmaread
    //                                                   -- RFC 5666 s6.2
    fn words(&self) -> [u32; 3] {
        [
            self.maxcall_sendsize,
            self.maxreply_sendsize,
            self.maxrdmaread,
        ]
    }

    /// Writes the body at the start of `buf`; returns 12.
    ///
    /// # Errors
    /// [`Error::BufferTooShort`] (nothing written) if `buf` is too short.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        emit_words(buf, self.words())
    }

    /// Appends the body to `enc`.
    ///
    /// # Errors
    /// [`Error::BufferTooShort`] (nothing written) if it does not fit.
    pub fn encode(&self, enc: &mut Encoder<'_>) -> Result<()> {
        encode_words(enc, self.words())
    }
}

impl ConfigRdmaReply {
    /// Decodes the body, which must be all of `bytes`.
    ///
    /// # Errors
    /// [`Error::Truncated`] if shorter than 12 bytes,
    /// [`Error::TrailingBytes`] if longer.
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        parse_words(bytes).map(Self::from_words)
    }

    /// Decodes the body at the decoder's position.
    ///
    /// # Errors
    /// [`Error::Truncated`] if fewer than 12 bytes remain.
    pub fn decode(dec: &mut Decoder<'_>) -> Result<Self> {
        decode_words(dec).map(Self::from_words)
    }

    fn from_words([maxcall_sendsize, align, maxrdmaread]: [u32; 3]) -> Self {
        ConfigRdmaReply {
            maxcall_sendsize,
            align,
            maxrdmaread,
        }
    }

    /// Always [`BODY_LEN`].
    pub const fn buffer_len(&self) -> usize {
        BODY_LEN
    }

    // config_rdma_reply = maxcall_sendsize align maxrdmaread
    //                                                   -- RFC 5666 s6.2
    fn words(&self) -> [u32; 3] {
        [self.maxcall_sendsize, self.align, self.maxrdmaread]
    }

    /// Writes the body at the start of `buf`; returns 12.
    ///
    /// # Errors
    /// [`Error::BufferTooShort`] (nothing written) if `buf` is too short.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        emit_words(buf, self.words())
    }

    /// Appends the body to `enc`.
    ///
    /// # Errors
    /// [`Error::BufferTooShort`] (nothing written) if it does not fit.
    pub fn encode(&self, enc: &mut Encoder<'_>) -> Result<()> {
        encode_words(enc, self.words())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // config_rdma_req { maxcall 4096, maxreply 4096, maxrdmaread 16 }
    #[rustfmt::skip]
    const REQ: [u8; 12] = [
        0x00, 0x00, 0x10, 0x00, // maxcall_sendsize  4096
        0x00, 0x00, 0x10, 0x00, // maxreply_sendsize 4096
        0x00, 0x00, 0x00, 0x10, // maxrdmaread       16
    ];
    // config_rdma_reply { maxcall 1024, align 4096, maxrdmaread 8 }
    #[rustfmt::skip]
    const REPLY: [u8; 12] = [
        0x00, 0x00, 0x04, 0x00, // maxcall_sendsize 1024
        0x00, 0x00, 0x10, 0x00, // align            4096
        0x00, 0x00, 0x00, 0x08, // maxrdmaread      8
    ];

    #[test]
    fn constants() {
        assert_eq!(CONFIG_RDMA_PROG, 100417);
        assert_eq!((CONFIG_RDMA_VERS, CONF_RDMA_PROC), (1, 1));
        assert_eq!((NETID_RDMA, NETID_RDMA6), ("rdma", "rdma6"));
    }

    #[test]
    fn req_golden() {
        let repr = ConfigRdmaReq {
            maxcall_sendsize: 4096,
            maxreply_sendsize: 4096,
            maxrdmaread: 16,
        };
        assert_eq!(ConfigRdmaReq::parse(&REQ), Ok(repr));
        assert_eq!(repr.buffer_len(), REQ.len());
        let mut buf = [0u8; 12];
        assert_eq!(repr.emit(&mut buf), Ok(12));
        assert_eq!(buf, REQ);
        let mut d = Decoder::new(&REQ);
        assert_eq!(ConfigRdmaReq::decode(&mut d), Ok(repr));
    }

    #[test]
    fn reply_golden() {
        let repr = ConfigRdmaReply {
            maxcall_sendsize: 1024,
            align: 4096,
            maxrdmaread: 8,
        };
        assert_eq!(ConfigRdmaReply::parse(&REPLY), Ok(repr));
        assert_eq!(repr.buffer_len(), REPLY.len());
        let mut buf = [0u8; 12];
        let mut enc = Encoder::new(&mut buf);
        assert_eq!(repr.encode(&mut enc), Ok(()));
        assert_eq!(buf, REPLY);
    }

    #[test]
    fn truncated_trailing_and_short_buffers() {
        for cut in 0..REQ.len() {
            assert_eq!(ConfigRdmaReq::parse(&REQ[..cut]), Err(Error::Truncated));
            assert_eq!(ConfigRdmaReply::parse(&REPLY[..cut]), Err(Error::Truncated));
            let mut buf = vec![0u8; cut];
            let r = ConfigRdmaReq::default().emit(&mut buf);
            assert_eq!(r, Err(Error::BufferTooShort));
        }
        let mut long = REQ.to_vec();
        long.push(0);
        assert_eq!(ConfigRdmaReq::parse(&long), Err(Error::TrailingBytes));
    }
}
