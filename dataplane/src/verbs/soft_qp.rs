//! What a queue pair of the software providers (`shm`, `roce`) does the
//! same way in both: how a work request's completion is built and queued,
//! and how the queue pair enters the error state and flushes what it holds.
//! One copy for both providers; `ibverbs` leaves all of this to the HCA.
//!
//! The rules are those of an IB reliable-connected queue pair (IBTA Vol. 1
//! ch. 10, queue pair states, and ch. 11, work completions):
//!
//! * A work request that completes hands its buffers back in
//!   [`Completion::sgl`]; a successful unsignaled send completes silently,
//!   and its buffers go back to their slab (by drop) at that moment.
//! * The work request that fails completes with its status, signaled or
//!   not, and the queue pair moves to [`QpState::Error`].
//! * In `Error`, everything still outstanding completes with
//!   [`WcStatus::WrFlushErr`], in the order it was posted, the send queue
//!   before the receive queue (the two go to their own completion queues,
//!   so the order between them is not seen by a consumer); so does every
//!   work request posted later, at once.
//! * The receives of a queue pair on a shared receive queue are not its
//!   own and are not flushed: they serve the other queue pairs. One
//!   bufferless completion ([`srq_qp_failed`]) tells the receive side
//!   instead (where IB raises the Last WQE Reached affiliated
//!   event, IBTA Vol. 1 ch. 11).
//!
//! What differs stays in the providers behind [`SoftQp`]: the shape of a
//! send-queue entry, how a new completion is announced to its completion
//! queue (`roce`'s ready lists), what a queue pair on a shared receive
//! queue holds in its receive queue (`shm`: its staging slots, `roce`: the
//! shared receive of the message in progress), and everything a provider
//! does around the error state (telling the peer, releasing the
//! connection, transport timers).
//!
//! The trait is implemented by each provider's queue pair state and used
//! only through that concrete type: every call is statically dispatched
//! and inlined. Nothing here allocates or takes a lock: completions go
//! into queues sized when the queue pair was created, and the one lock
//! a provider's accessor takes is on the error path (`roce` returning a
//! receive to its shared receive queue).

use super::soft_mr::MrTable;
use super::{
    srq_qp_failed, Access, Completion, PostError, PostFailed, QpState, RecvWr, SendWr, SgeList,
    WcOpcode, WcStatus,
};

/// A software queue pair's work queues, as the shared completion and
/// flush logic needs them. The required methods are plain accessors of the
/// provider's own fields; the provided ones are the logic.
pub(crate) trait SoftQp {
    /// The queue pair number completions carry.
    fn qpn(&self) -> u32;
    /// The queue pair's state.
    fn qp_state(&mut self) -> &mut QpState;
    /// The registrations of its protection domain.
    fn mrs(&self) -> &MrTable;
    /// The oldest outstanding send work request, taken off the send queue.
    fn pop_send(&mut self) -> Option<SendWr>;
    /// The oldest receive of the receive queue, taken off it.
    fn pop_recv(&mut self) -> Option<RecvWr>;
    /// Queues a completion for the send CQ (and announces it there, where
    /// the provider keeps track of queue pairs with completions waiting).
    fn push_send_done(&mut self, c: Completion);
    /// As [`push_send_done`](Self::push_send_done), for the receive CQ.
    fn push_recv_done(&mut self, c: Completion);
    /// Whether the queue pair takes its receives from a shared receive
    /// queue.
    fn on_srq(&self) -> bool;
    /// Returns a receive of a queue pair on a shared receive queue that
    /// will not complete here (see [`flush_queues`](Self::flush_queues)).
    fn release_shared(&mut self, wr: RecvWr);
    /// Enters the error state for a local error the queue pair found
    /// itself, the provider's way (it may have to tell the peer); the
    /// flush is [`flush_queues`](Self::flush_queues).
    fn fail(&mut self);

    /// Completes send work request `wr` with `status` and `byte_len`. A
    /// successful unsignaled one produces no completion: its buffers are
    /// dropped here, which returns them to their slab.
    #[inline]
    fn complete_send(&mut self, mut wr: SendWr, status: WcStatus, byte_len: u32) {
        if status == WcStatus::Success && !wr.signaled {
            return;
        }
        let c = Completion {
            wr_id: wr.wr_id,
            status,
            opcode: wr.op.wc_opcode(),
            byte_len,
            imm: None,
            invalidated_rkey: None,
            qp_num: self.qpn(),
            sgl: std::mem::take(&mut wr.sgl),
        };
        self.push_send_done(c);
    }

    /// Completes receive `wr` without a message (a flush, or a local error
    /// found before anything was placed): nothing received, the buffers
    /// handed back as they were posted.
    #[inline]
    fn flush_recv(&mut self, wr: RecvWr, status: WcStatus) {
        let c = recv_completion(wr, self.qpn(), status, 0);
        self.push_recv_done(c);
    }

    /// Moves the queue pair to the error state and flushes it: the oldest
    /// send completes with `head` (if given: the error that stopped it),
    /// every other send and every receive with `WrFlushErr`, in order. On
    /// a shared receive queue the receives are released instead and, the
    /// first time the queue pair fails, [`srq_qp_failed`] completes on the
    /// receive side. Called again in `Error` it flushes whatever was
    /// queued since (e.g. receives posted to a prepared queue pair).
    fn flush_queues(&mut self, head: Option<WcStatus>) {
        let was = std::mem::replace(self.qp_state(), QpState::Error);
        if let Some(status) = head {
            if let Some(wr) = self.pop_send() {
                self.complete_send(wr, status, 0);
            }
        }
        while let Some(wr) = self.pop_send() {
            self.complete_send(wr, WcStatus::WrFlushErr, 0);
        }
        if self.on_srq() {
            while let Some(wr) = self.pop_recv() {
                self.release_shared(wr);
            }
            if was != QpState::Error {
                let c = srq_qp_failed(self.qpn());
                self.push_recv_done(c);
            }
        } else {
            while let Some(wr) = self.pop_recv() {
                self.flush_recv(wr, WcStatus::WrFlushErr);
            }
        }
    }

    /// What a send posted in the error state does: it completes at once
    /// with `WrFlushErr`. Returns the work request to queue otherwise.
    #[inline]
    fn admit_send(&mut self, wr: SendWr) -> Option<SendWr> {
        if *self.qp_state() == QpState::Error {
            self.complete_send(wr, WcStatus::WrFlushErr, 0);
            return None;
        }
        Some(wr)
    }

    /// What a receive posted to a queue pair that may take it does before
    /// it is queued: in the error state it completes at once with
    /// `WrFlushErr`; with an SGE outside a live registration with local
    /// write it completes `LocProtErr` and the queue pair fails, as a
    /// local protection error does on an HCA. Returns the work request to
    /// queue otherwise.
    #[inline]
    fn admit_recv(&mut self, wr: RecvWr) -> Option<RecvWr> {
        if *self.qp_state() == QpState::Error {
            self.flush_recv(wr, WcStatus::WrFlushErr);
            return None;
        }
        if !wr
            .sgl
            .iter()
            .all(|s| self.mrs().check_local(s, Access::LOCAL_WRITE))
        {
            self.flush_recv(wr, WcStatus::LocProtErr);
            self.fail();
            return None;
        }
        Some(wr)
    }
}

/// The two refusals of a post, which hand the work request back: it is
/// malformed (`invalid`: the provider's checks of it), or its queue is
/// full (`outstanding` of `depth`). A work request counts against its
/// queue until its completion has been polled, so a queue pair never
/// holds more completions than its depths, and needs no room beyond the
/// queues sized at creation. Anything else about a posted work request is
/// reported in its completion, as an HCA reports it.
///
/// # Errors
/// [`PostError::Invalid`], then [`PostError::QueueFull`], with `wr`.
#[inline]
pub(crate) fn check_post<W>(
    wr: W,
    invalid: bool,
    outstanding: usize,
    depth: u32,
) -> Result<W, PostFailed<W>> {
    let error = if invalid {
        PostError::Invalid
    } else if outstanding >= depth as usize {
        PostError::QueueFull
    } else {
        return Ok(wr);
    };
    Err(PostFailed { error, wr })
}

/// The completion of receive `wr` on queue pair `qp_num`: a Receive of
/// `byte_len` bytes with `status`, the buffers handed back in it (their
/// lengths as the caller set them, see [`set_placed`]). A message with
/// immediate data, an invalidated key or an RDMA Write with immediate
/// sets those fields on it.
#[inline]
pub(crate) fn recv_completion(
    mut wr: RecvWr,
    qp_num: u32,
    status: WcStatus,
    byte_len: u32,
) -> Completion {
    Completion {
        wr_id: wr.wr_id,
        status,
        opcode: WcOpcode::Recv,
        byte_len,
        imm: None,
        invalidated_rkey: None,
        qp_num,
        sgl: std::mem::take(&mut wr.sgl),
    }
}

/// Sets each buffer's length to what `placed` bytes fill, in order: what a
/// receive or an RDMA Read destination hands back with its completion.
pub(crate) fn set_placed(sgl: &mut SgeList, mut placed: u64) {
    for s in sgl.iter_mut() {
        let here = placed.min(s.len as u64);
        s.buf.set_len(s.offset + here as u32);
        placed -= here;
    }
}
