//! CONF_RDMA, the connection configuration protocol (RFC 5666 s6), as the
//! engine speaks it.
//!
//! Responder: with [`Config::serve_conf_rdma`] the engine answers program
//! 100417 itself, in-band, from its configuration: version 1
//! procedure 1 takes the client's limits and returns ours; version 2
//! procedure 1 (docs/EXTENSIONS.md) does the same and also exchanges
//! extension advertisements, and both sides then use
//! `negotiate(ours, theirs)`; procedure 0 (NULL) succeeds, other
//! procedures get PROC_UNAVAIL, other versions PROG_MISMATCH 1..2,
//! arguments that do not decode GARBAGE_ARGS.
//!
//! Requester: [`Connection::conf_rdma_request`] says what to ask for,
//! [`encode_conf_rdma_call`] builds the call to pass to
//! [`Connection::send_call`], [`decode_conf_rdma_reply`] reads the answer
//! and [`Connection::apply_conf_rdma_reply`] applies it; the `_v2`
//! functions do the same for version 2, and a `PROG_MISMATCH` answer to it
//! means a plain Version One peer (`conf2::is_plain_version_one`). RFC 5666 s6.1:
//! until that reply arrives the client assumes one credit and 1 KB
//! messages, which is where a requester's grant starts anyway.
//!
//! What the values mean for us (RFC 5666 s6.2):
//! * `maxcall_sendsize` (request): the largest inline call the client
//!   sends, i.e. its Send size; (reply) the largest inline call the server
//!   receives, i.e. its receive size.
//! * `maxreply_sendsize` (request): the largest inline reply the client
//!   receives.
//! * `maxrdmaread`: RDMA Reads the sender allows in flight against itself
//!   (its IRD); the other side issues no more than that.
//! * `align` (reply): we send 4, XDR's own alignment, since we neither send
//!   nor accept RDMA_MSGP padding.

use super::placement::TargetLayout;
use super::time::Instant;
use super::{Config, Connection, Extensions, PeerLimits};
use crate::wire::conf::{
    ConfigRdmaReply, ConfigRdmaReq, CONFIG_RDMA_PROC_NULL, CONFIG_RDMA_PROG, CONFIG_RDMA_VERS,
    CONF_RDMA_PROC,
};
use crate::wire::conf2::{negotiate, ConfigRdmaReplyV2, ConfigRdmaReqV2, CONFIG_RDMA_VERS2};
use crate::wire::rpc::{AcceptStatus, CallHeader, OpaqueAuth, ReplyBody, ReplyHeader};
use crate::wire::rtrext::{prop_id, BufferStructure, Limits as PropLimits, Property, PropertyList};
use crate::wire::xdr::Encoder;

/// The `align` we report: XDR alignment, no RDMA_MSGP padding.
pub const CONF_RDMA_ALIGN: u32 = 4;

/// Why a CONF_RDMA reply could not be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ConfRdmaError {
    /// The reply or its result body does not decode.
    #[error("CONF_RDMA reply does not decode: {0}")]
    Decode(crate::wire::Error),
    /// The server accepted the call but did not succeed (e.g.
    /// PROG_UNAVAIL: it does not speak CONF_RDMA; PROG_MISMATCH).
    #[error("CONF_RDMA not successful: {0:?}")]
    NotSuccessful(AcceptStatus),
    /// The server denied the call (RPC version or authentication).
    #[error("CONF_RDMA call denied")]
    Denied,
}

/// Encodes a CONF_RDMA v1 call (AUTH_NONE) with `req` into `buf`; returns
/// its length.
///
/// # Errors
/// [`crate::wire::Error::BufferTooShort`] if `buf` is shorter than the 52
/// bytes of the call.
pub fn encode_conf_rdma_call(
    buf: &mut [u8],
    xid: u32,
    req: &ConfigRdmaReq,
) -> Result<usize, crate::wire::Error> {
    let mut e = Encoder::new(buf);
    CallHeader::new(
        xid,
        CONFIG_RDMA_PROG,
        CONFIG_RDMA_VERS,
        CONF_RDMA_PROC,
        OpaqueAuth::None,
        OpaqueAuth::None,
    )
    .emit(&mut e)?;
    req.encode(&mut e)?;
    Ok(e.position())
}

/// Decodes the reply to a CONF_RDMA call.
///
/// # Errors
/// [`ConfRdmaError`]: undecodable, denied, or accepted without success.
pub fn decode_conf_rdma_reply(msg: &[u8]) -> Result<ConfigRdmaReply, ConfRdmaError> {
    let (h, hl) = ReplyHeader::parse(msg).map_err(ConfRdmaError::Decode)?;
    match h.body {
        ReplyBody::Denied(_) => Err(ConfRdmaError::Denied),
        ReplyBody::Accepted(a) if a.status != AcceptStatus::Success => {
            Err(ConfRdmaError::NotSuccessful(a.status))
        }
        ReplyBody::Accepted(_) => {
            ConfigRdmaReply::parse(msg.get(hl..).unwrap_or(&[])).map_err(ConfRdmaError::Decode)
        }
    }
}

impl Config {
    fn conf_rdma_reply(&self) -> ConfigRdmaReply {
        ConfigRdmaReply {
            maxcall_sendsize: self.inline_recv_size,
            align: CONF_RDMA_ALIGN,
            maxrdmaread: self.inbound_rdma_read,
        }
    }
}

impl Connection {
    /// The CONF_RDMA arguments describing us as a client.
    pub fn conf_rdma_request(&self) -> ConfigRdmaReq {
        ConfigRdmaReq {
            maxcall_sendsize: self.config.inline_send_size,
            maxreply_sendsize: self.config.inline_recv_size,
            maxrdmaread: self.config.inbound_rdma_read,
        }
    }

    /// Applies the server's CONF_RDMA reply: its receive size bounds our
    /// inline calls, its `maxrdmaread` our Reads against it (never raised
    /// above our configured `max_rdma_read`).
    pub fn apply_conf_rdma_reply(&mut self, reply: &ConfigRdmaReply) {
        self.set_peer_limits(PeerLimits {
            inline_recv_size: reply.maxcall_sendsize,
            inline_send_size: self.config.peer_inline_send_size,
            // A peer's 0 would stop every Read for good: at least 1.
            max_rdma_read: self.config.max_rdma_read.min(reply.maxrdmaread.max(1)),
        });
    }

    /// Answers a CONF_RDMA program call held in responder slot `idx`
    /// (call header `hl` bytes long), in-band. False if the reply could
    /// not be planned (the caller then answers ERR_CHUNK).
    ///
    /// CONF_RDMA (v1 or v2) is applied only as the `first` call delivered
    /// on the connection (RFC 5666 s6.1). Later, limits and extensions are
    /// in use by calls and exposed replies: it changes nothing and is
    /// answered PROC_UNAVAIL (RFC 5531: the procedure is not available;
    /// SYSTEM_ERR would suggest a transient fault worth retrying).
    pub(super) fn answer_conf_rdma(
        &mut self,
        now: Instant,
        idx: usize,
        version: u32,
        procedure: u32,
        hl: usize,
        first: bool,
    ) -> bool {
        let (xid, message, call_len) = self.responder_slot_message(idx);
        let args = self
            .bufs
            .bytes(message)
            .get(hl..call_len as usize)
            .unwrap_or(&[]);
        let (status, result) = match (version, procedure) {
            (CONFIG_RDMA_VERS | CONFIG_RDMA_VERS2, CONFIG_RDMA_PROC_NULL) => {
                (AcceptStatus::Success, ConfResult::None)
            }
            (CONFIG_RDMA_VERS | CONFIG_RDMA_VERS2, CONF_RDMA_PROC) if !first => {
                self.stats.conf_rdma_refused += 1;
                (AcceptStatus::ProcUnavail, ConfResult::None)
            }
            (CONFIG_RDMA_VERS, CONF_RDMA_PROC) => match ConfigRdmaReq::parse(args) {
                Ok(req) => {
                    self.apply_conf_rdma_request(&req);
                    (
                        AcceptStatus::Success,
                        ConfResult::V1(self.config.conf_rdma_reply()),
                    )
                }
                Err(_) => (AcceptStatus::GarbageArgs, ConfResult::None),
            },
            // Version 2 (docs/EXTENSIONS.md): the v1 words plus property
            // lists; the extensions in use are those both lists name.
            // Control path, once per connection: it may allocate.
            (CONFIG_RDMA_VERS2, CONF_RDMA_PROC) => {
                match ConfigRdmaReqV2::parse(args, &PropLimits::DEFAULT) {
                    Ok(req) => {
                        self.apply_conf_rdma_request(&req.base);
                        let ours = self.advertised_extensions();
                        self.negotiated = negotiate(ours, req.properties.extensions());
                        self.apply_peer_properties(&req.properties);
                        let mut reply = ConfigRdmaReplyV2 {
                            base: self.config.conf_rdma_reply(),
                            properties: PropertyList::new(),
                        };
                        match self.push_advertisement(&mut reply.properties) {
                            Ok(()) => (AcceptStatus::Success, ConfResult::V2(reply)),
                            Err(_) => (AcceptStatus::SystemErr, ConfResult::None),
                        }
                    }
                    Err(_) => (AcceptStatus::GarbageArgs, ConfResult::None),
                }
            }
            (CONFIG_RDMA_VERS | CONFIG_RDMA_VERS2, _) => {
                (AcceptStatus::ProcUnavail, ConfResult::None)
            }
            _ => (
                AcceptStatus::ProgMismatch {
                    low: CONFIG_RDMA_VERS,
                    high: CONFIG_RDMA_VERS2,
                },
                ConfResult::None,
            ),
        };
        // The arguments were parsed above: the reply may overwrite them.
        let mut e = Encoder::new(self.bufs.bytes_mut(message));
        let encoded = ReplyHeader::accepted(xid, OpaqueAuth::None, status)
            .emit(&mut e)
            .and_then(|()| match &result {
                ConfResult::None => Ok(()),
                ConfResult::V1(r) => r.encode(&mut e),
                ConfResult::V2(r) => r.encode(&mut e),
            });
        let len = e.position();
        if encoded.is_err() {
            return false;
        }
        self.stats.conf_rdma_answered += 1;
        self.post_encoded_reply(now, idx, len).is_ok()
    }

    /// A client's CONF_RDMA limits: its reply size bounds our inline
    /// replies, its Send size the replies it may send us, its IRD our
    /// Reads.
    fn apply_conf_rdma_request(&mut self, req: &ConfigRdmaReq) {
        self.set_peer_limits(PeerLimits {
            inline_recv_size: req.maxreply_sendsize,
            inline_send_size: req.maxcall_sendsize,
            // A peer's 0 would stop every Read for good: at least 1.
            max_rdma_read: self.config.max_rdma_read.min(req.maxrdmaread.max(1)),
        });
    }

    /// The CONF_RDMA version 2 arguments describing us as a client: the
    /// version 1 words and our advertised extensions.
    ///
    /// # Errors
    /// Only if the property list cannot hold the advertisement (it can).
    pub fn conf_rdma_request_v2(&self) -> Result<ConfigRdmaReqV2, crate::wire::Error> {
        let mut properties = PropertyList::new();
        self.push_advertisement(&mut properties)?;
        Ok(ConfigRdmaReqV2 {
            base: self.conf_rdma_request(),
            properties,
        })
    }

    /// Applies the server's CONF_RDMA version 2 reply: its limits as for
    /// version 1, and the extensions both sides advertised. (A server
    /// answering PROG_MISMATCH / PROG_UNAVAIL / PROC_UNAVAIL is plain
    /// Version One, `conf2::is_plain_version_one`: nothing to apply.)
    pub fn apply_conf_rdma_reply_v2(&mut self, reply: &ConfigRdmaReplyV2) {
        self.apply_conf_rdma_reply(&reply.base);
        self.negotiated = negotiate(self.advertised_extensions(), reply.properties.extensions());
        self.apply_peer_properties(&reply.properties);
    }

    /// Our property list: the extensions we advertise and, with message
    /// continuation, the longest group we accept and send (rtrext s8.4,
    /// s8.5; both are `max_group_transmissions`); with send-based
    /// placement, the structure of our receive buffers (s8.3).
    fn push_advertisement(&self, list: &mut PropertyList) -> Result<(), crate::wire::Error> {
        let ours = self.advertised_extensions();
        list.push_extensions(ours)?;
        if ours.contains(Extensions::MESSAGE_CONTINUATION) {
            let max = self.config.max_group_transmissions;
            list.push(Property::RequestTransmissionReceiveLimit(max))?;
            list.push(Property::ResponseTransmissionSendLimit(max))?;
        }
        if ours.contains(Extensions::SEND_PLACEMENT) {
            let len = self.config.inline_recv_size;
            let (groups, n) = TargetLayout::our_groups(len);
            list.push(Property::ReceiveBufferStructure(BufferStructure {
                length: len,
                groups: &groups[..n],
            }))?;
        }
        Ok(())
    }

    /// What the peer's property list says: the longest call group it
    /// accepts and the longest reply group it sends (1 each, the draft's
    /// default, when it sent none), and where in its receive buffers
    /// placed data may go (none when it sent no structure, s5.3).
    fn apply_peer_properties(&mut self, list: &PropertyList) {
        self.peer_targets = match list.get(prop_id::RECEIVE_BUFFER_STRUCTURE) {
            Some(Property::ReceiveBufferStructure(b))
                if self.negotiated.contains(Extensions::SEND_PLACEMENT) =>
            {
                TargetLayout::from_structure(&b)
            }
            _ => TargetLayout::NONE,
        };
        self.peer_group_recv_limit = match list.get(prop_id::REQUEST_TRANSMISSION_RECEIVE_LIMIT) {
            Some(Property::RequestTransmissionReceiveLimit(n)) => n.max(1),
            _ => 1,
        };
        self.peer_group_send_limit = match list.get(prop_id::RESPONSE_TRANSMISSION_SEND_LIMIT) {
            Some(Property::ResponseTransmissionSendLimit(n)) => n.max(1),
            _ => 1,
        };
    }

    /// What we advertise: the configured extensions the engine implements,
    /// never a promise it cannot keep. Send-based placement rides on the
    /// transmission framing of message continuation here, so it is
    /// advertised only together with it (docs/EXTENSIONS.md section 7).
    pub fn advertised_extensions(&self) -> Extensions {
        let ours = self.config.extensions.intersection(
            Extensions::RESPONDER_READ_CHUNKS
                .union(Extensions::REMOTE_INVALIDATE)
                .union(Extensions::MESSAGE_CONTINUATION)
                .union(Extensions::SEND_PLACEMENT),
        );
        if ours.contains(Extensions::MESSAGE_CONTINUATION) {
            ours
        } else {
            ours.difference(Extensions::SEND_PLACEMENT)
        }
    }
}

/// The result body of an in-band CONF_RDMA answer.
#[derive(Debug)]
enum ConfResult {
    None,
    V1(ConfigRdmaReply),
    V2(ConfigRdmaReplyV2),
}

/// Encodes a CONF_RDMA v2 call (AUTH_NONE) with `req` into `buf`; returns
/// its length.
///
/// # Errors
/// [`crate::wire::Error::BufferTooShort`] if `buf` cannot hold the call, or
/// an error of the property list.
pub fn encode_conf_rdma_call_v2(
    buf: &mut [u8],
    xid: u32,
    req: &ConfigRdmaReqV2,
) -> Result<usize, crate::wire::Error> {
    let mut e = Encoder::new(buf);
    CallHeader::new(
        xid,
        CONFIG_RDMA_PROG,
        CONFIG_RDMA_VERS2,
        CONF_RDMA_PROC,
        OpaqueAuth::None,
        OpaqueAuth::None,
    )
    .emit(&mut e)?;
    req.encode(&mut e)?;
    Ok(e.position())
}

/// Decodes the reply to a CONF_RDMA v2 call.
///
/// # Errors
/// [`ConfRdmaError`]; [`ConfRdmaError::NotSuccessful`] with a status for
/// which `conf2::is_plain_version_one` holds means the peer is plain
/// Version One.
pub fn decode_conf_rdma_reply_v2(msg: &[u8]) -> Result<ConfigRdmaReplyV2, ConfRdmaError> {
    let (h, hl) = ReplyHeader::parse(msg).map_err(ConfRdmaError::Decode)?;
    match h.body {
        ReplyBody::Denied(_) => Err(ConfRdmaError::Denied),
        ReplyBody::Accepted(a) if a.status != AcceptStatus::Success => {
            Err(ConfRdmaError::NotSuccessful(a.status))
        }
        ReplyBody::Accepted(_) => {
            ConfigRdmaReplyV2::parse(msg.get(hl..).unwrap_or(&[]), &PropLimits::DEFAULT)
                .map_err(ConfRdmaError::Decode)
        }
    }
}
