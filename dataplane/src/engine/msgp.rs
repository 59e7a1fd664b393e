//! RDMA_MSGP received (RFC 5666 s3.9, s4.3; retired by RFC 8166).
//!
//! The padding sits inside the RPC message, in front of the data of each
//! opaque item at or above `thresh`, so only a decoder that walks the
//! message knows where it is. The engine therefore does not strip it: it
//! checks the header, handles the message exactly as an RDMA_MSG (same
//! credit and chunk checks, same delivery), and records the padding
//! parameters for the upper layer, which decodes with
//! [`crate::wire::xdr::Decoder::get_opaque_padded`] and the
//! [`MessagePadding`] from [`Connection::call_padding`] /
//! [`Connection::reply_padding`].
//!
//! Rule (docs/ENGINE.md): accepted from any peer (there is nothing to
//! negotiate: RFC 5666 lets a sender choose RDMA_MSGP), when
//! * `align` is 0 or 1 (no padding), or a multiple of 4 with `thresh`
//!   above [`MAX_AUTH_BYTES`], so that no padding can sit in the RPC
//!   header's credential or verifier, which the engine itself decodes;
//! * the read list is empty: where a read chunk's position lies in a padded
//!   stream is undefined, and Linux only ever sent RDMA_MSGP without chunks;
//! * it is not a CONF_RDMA call the engine answers itself (its own decoder
//!   does not skip padding).
//!
//! Otherwise a call is answered ERR_CHUNK and a reply fails its call, as
//! before. Write list and reply chunk are used as for RDMA_MSG.

use super::buffers::BufId;
use super::connection::Disposition;
use super::time::Instant;
use super::{CallFailure, CallHandle, Connection, Event, IncomingCall};
use crate::wire::conf::CONFIG_RDMA_PROG;
use crate::wire::rpc::{peek_direction, MessageType};
use crate::wire::rpcrdma::{rpc_xid_at, ErrorBody, MessageBody, Padding};

/// Largest credential or verifier body (RFC 5531 s8.2).
pub const MAX_AUTH_BYTES: u32 = 400;

/// How an RPC message received in RDMA_MSGP is padded: the header's
/// parameters and where the message started in the Send (the offset that
/// [`crate::wire::xdr::Decoder::get_opaque_padded`] wants as `base` for a
/// decoder over the whole message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessagePadding {
    /// `rdma_align` and `rdma_thresh` of the header.
    pub padding: Padding,
    /// Offset of the RPC message's first byte in the Send (the transport
    /// header length).
    pub offset: u32,
}

/// Padding of the messages delivered from RDMA_MSGP, per slot, with the
/// slot generation it belongs to (a recycled slot's entry is stale).
#[derive(Debug)]
pub(super) struct MsgpState {
    serve: Vec<Option<(u32, MessagePadding)>>,
    call: Vec<Option<(u32, MessagePadding)>>,
}

impl MsgpState {
    pub(super) fn new(serve_slots: usize, call_slots: usize) -> MsgpState {
        MsgpState {
            serve: vec![None; serve_slots],
            call: vec![None; call_slots],
        }
    }
}

/// True when the engine can take a message with these padding parameters.
fn usable(p: &Padding) -> bool {
    p.align <= 1 || (p.align % 4 == 0 && p.thresh > MAX_AUTH_BYTES)
}

impl Connection {
    /// An RDMA_MSGP header parsed in `rx_hdr` (see the module docs).
    pub(super) fn on_msgp(
        &mut self,
        now: Instant,
        buf: BufId,
        len: usize,
        hlen: usize,
        padding: Padding,
    ) -> Disposition {
        let xid = self.rx_hdr.xid;
        let bytes = self.bufs.bytes(buf).get(..len).unwrap_or(&[]);
        let rpc = bytes.get(hlen..).unwrap_or(&[]);
        let ok = usable(&padding) && self.rx_hdr.chunks.reads().is_empty();
        let mp = MessagePadding {
            padding,
            offset: hlen as u32,
        };
        match peek_direction(rpc) {
            Some(MessageType::Call) => {
                let conf =
                    self.config.serve_conf_rdma && rpc_xid_at(rpc, 12) == Some(CONFIG_RDMA_PROG);
                if !ok || conf {
                    self.send_error(xid, ErrorBody::Chunk);
                    return Disposition::Done;
                }
                // From here on it is an RDMA_MSG.
                self.rx_hdr.body = MessageBody::Msg;
                let before = self.events.len();
                let d = self.on_call(now, buf, len, hlen, None);
                if self.events.len() > before {
                    if let Some(&Event::CallArrived { call, .. }) = self.events.back() {
                        self.msgp.serve[call.index as usize] = Some((call.generation, mp));
                    }
                }
                d
            }
            Some(MessageType::Reply) => {
                match self.find_sent_call(xid) {
                    Some(slot) if ok => {
                        self.rx_hdr.body = MessageBody::Msg;
                        let before = self.events.len();
                        self.on_reply(slot, buf, len, hlen);
                        if self.events.len() > before {
                            if let Some(&Event::ReplyArrived { call, .. }) = self.events.back() {
                                self.msgp.call[call.index as usize] = Some((call.generation, mp));
                            }
                        }
                    }
                    Some(slot) => self.fail_reply(slot, CallFailure::UnsupportedReply),
                    None => self.stats.unmatched_replies += 1,
                }
                Disposition::Done
            }
            None => {
                self.send_error(xid, ErrorBody::Chunk);
                Disposition::Done
            }
        }
    }

    /// How the call was padded, if it arrived in RDMA_MSGP (`None` for
    /// RDMA_MSG / RDMA_NOMSG, or a stale handle). Decode its opaque items
    /// with [`crate::wire::xdr::Decoder::get_opaque_padded`].
    pub fn call_padding(&self, call: IncomingCall) -> Option<MessagePadding> {
        self.call_message(call)?;
        match self.msgp.serve.get(call.index as usize)? {
            Some((g, mp)) if *g == call.generation => Some(*mp),
            _ => None,
        }
    }

    /// How the reply to `call` was padded, if it arrived in RDMA_MSGP.
    pub fn reply_padding(&self, call: CallHandle) -> Option<MessagePadding> {
        self.reply_message(call)?;
        match self.msgp.call.get(call.index as usize)? {
            Some((g, mp)) if *g == call.generation => Some(*mp),
            _ => None,
        }
    }
}
