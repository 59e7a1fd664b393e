//! Remote invalidation of a reply's read chunk: RDMA_DONE as Send With
//! Invalidate (draft-lever s4.1.4).
//!
//! Used only when both peers advertised
//! [`super::Extensions::REMOTE_INVALIDATE`] (and responder-provided read
//! chunks) in CONF_RDMA version 2; that negotiation is authoritative. The
//! RFC 8797 private data flag alone only says the peer's provider accepts
//! Send With Invalidate, not that it exposes one invalidatable rkey per
//! reply, so it does not turn this on (docs/EXTENSIONS.md s3).
//!
//! The DONE after a successful pull carries `invalidate_rkey` = the handle
//! of the reply's read chunk (the draft's "only that R_key"), provided all
//! its segments share one handle. DONEs for replies not pulled (failed,
//! abandoned, unsupported) go as plain Send: the responder withdraws the
//! memory itself, and we never name an rkey we did not read from.

use std::collections::VecDeque;

use super::requester::CallState;
use super::{Connection, Extensions};

/// (xid, rkey) of DONEs queued after a pull, oldest first.
#[derive(Debug)]
pub(super) struct DoneInvalidate {
    rkeys: VecDeque<(u32, u32)>,
}

impl DoneInvalidate {
    pub(super) fn new(capacity: usize) -> DoneInvalidate {
        DoneInvalidate {
            rkeys: VecDeque::with_capacity(capacity.max(1)),
        }
    }

    /// The rkey the DONE for `xid` invalidates (Send With Invalidate), if
    /// any; called where the DONE's Send is built.
    pub(super) fn take(&mut self, xid: u32) -> Option<u32> {
        let i = self.rkeys.iter().position(|&(x, _)| x == xid)?;
        self.rkeys.remove(i).map(|(_, rkey)| rkey)
    }
}

impl Connection {
    /// Both peers negotiated remote invalidation of read chunks.
    pub(super) fn remote_invalidate(&self) -> bool {
        self.negotiated
            .contains(Extensions::REMOTE_INVALIDATE.union(Extensions::RESPONDER_READ_CHUNKS))
    }

    /// A DONE for `xid` is being queued: if it follows the pull of a reply
    /// (the slot is still pulling) and remote invalidation is in use,
    /// remember the rkey it should invalidate.
    pub(super) fn note_done_rkey(&mut self, xid: u32) {
        if !self.remote_invalidate() {
            return;
        }
        let Some(s) = self
            .calls
            .iter()
            .find(|s| s.state == CallState::PullingReplyReadChunk && s.xid == xid)
        else {
            return;
        };
        let handle = single_handle(s.reads.iter().map(|r| r.seg.handle));
        self.remember_done_rkey(xid, handle);
    }

    /// The same for a reply that was pulled through a responder slot and
    /// recognised as a REPLY only afterwards (docs/ENGINE.md, "Routing
    /// RDMA_NOMSG"): `handle` is its read chunk's [`single_handle`].
    pub(super) fn note_pulled_reply_rkey(&mut self, xid: u32, handle: Option<u32>) {
        if self.remote_invalidate() {
            self.remember_done_rkey(xid, handle);
        }
    }

    fn remember_done_rkey(&mut self, xid: u32, handle: Option<u32>) {
        let Some(handle) = handle else {
            return;
        };
        let q = &mut self.inval.rkeys;
        if q.len() == q.capacity() {
            // Never grow: the oldest DONE then goes as plain Send.
            q.pop_front();
        }
        q.push_back((xid, handle));
    }
}

/// The one rkey a read chunk was exposed under, if all its segments share
/// it (draft-lever s4.1.4 invalidates "only that R_key").
pub(super) fn single_handle(mut handles: impl Iterator<Item = u32>) -> Option<u32> {
    let first = handles.next()?;
    handles.all(|h| h == first).then_some(first)
}
