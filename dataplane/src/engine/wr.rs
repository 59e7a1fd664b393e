//! Work requests as plain data, and the typed ids that bring their
//! completions back to the request that posted them.
//!
//! The engine does not post anything: it hands [`WorkRequest`]s to the
//! worker (or the test harness), which posts them on a provider's queue
//! pair and later reports their completions with the same [`WrId`]. Memory
//! is named by [`BufId`] plus a byte range, never by address; the worker
//! maps a `BufId` to (lkey, address) through its registration of the
//! engine's [`super::BufferTable`] (see `docs/ENGINE.md`).

use super::buffers::{Access, BufId, LocalSlice};
use crate::wire::rpcrdma::Segment;

/// What a work request was posted for; selects the table `index` points
/// into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WrKind {
    /// A receive buffer; `index` is the receive buffer number.
    Recv = 1,
    /// The Send of a call; `index` is the requester slot.
    CallSend = 2,
    /// The Send of a reply; `index` is the responder slot.
    ReplySend = 3,
    /// An RDMA Read pulling a call's read chunk; `index` is the responder
    /// slot.
    ChunkRead = 4,
    /// An RDMA Write into a write or reply chunk; `index` is the responder
    /// slot.
    ChunkWrite = 5,
    /// The Send of an RDMA_ERROR; `index` is the control buffer number.
    ErrorSend = 6,
    /// An RDMA Read pulling a reply's position-zero read chunk (a
    /// responder-provided read chunk); `index` is the requester slot.
    ReplyRead = 7,
    /// The Send of an RDMA_DONE; `index` is the control buffer number.
    DoneSend = 8,
    /// A memory-window bind for one exposure; `index` is the window.
    KeyBind = 9,
    /// A local invalidation ending one exposure; `index` is the window.
    KeyInvalidate = 10,
}

impl WrKind {
    /// Whether ids of this kind carry an op number: the work requests
    /// of one exchange of a slot (its Sends, Reads and Writes), each
    /// counted once however often the provider reports it ([`OpSet`]).
    pub fn numbers_ops(self) -> bool {
        matches!(
            self,
            WrKind::CallSend
                | WrKind::ReplySend
                | WrKind::ChunkRead
                | WrKind::ChunkWrite
                | WrKind::ReplyRead
        )
    }

    fn from_bits(bits: u64) -> Option<WrKind> {
        Some(match bits {
            1 => WrKind::Recv,
            2 => WrKind::CallSend,
            3 => WrKind::ReplySend,
            4 => WrKind::ChunkRead,
            5 => WrKind::ChunkWrite,
            6 => WrKind::ErrorSend,
            7 => WrKind::ReplyRead,
            8 => WrKind::DoneSend,
            9 => WrKind::KeyBind,
            10 => WrKind::KeyInvalidate,
            _ => return None,
        })
    }
}

/// A typed work-request id: the kind, the index of the slot or buffer that
/// owns the request, and that owner's generation when the request was
/// posted. A completion whose generation no longer matches its owner is
/// stale (a leftover from a recycled slot) and is counted and dropped.
///
/// The work requests of a slot's exchange ([`WrKind::numbers_ops`]) also
/// carry their op number, in the generation's bits 16..28 (the slot's
/// generation keeps 16 bits there; [`WrId::for_op`]): a second completion
/// of the same request is a duplicate, counted and dropped ([`OpSet`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WrId {
    /// What the request is.
    pub kind: WrKind,
    /// Slot or buffer number, per `kind`.
    pub index: u32,
    /// Generation of the owner; only the low 28 bits survive [`WrId::to_u64`].
    pub generation: u32,
}

const GEN_BITS: u32 = 28;
const GEN_MASK: u32 = (1 << GEN_BITS) - 1;
/// Generation bits of an id that carries an op number.
const OP_GEN_BITS: u32 = 16;
const OP_GEN_MASK: u32 = (1 << OP_GEN_BITS) - 1;
/// Work requests of one kind family (Sends and Writes of a reply; Reads)
/// one exchange of a slot may post: their numbers fit 12 bits.
pub const MAX_OPS: u32 = 1 << (GEN_BITS - OP_GEN_BITS);

impl WrId {
    /// The id of op number `op` (below [`MAX_OPS`]) of the exchange of
    /// slot `index` at `generation`.
    pub fn for_op(kind: WrKind, index: u32, generation: u32, op: u32) -> WrId {
        debug_assert!(kind.numbers_ops() && op < MAX_OPS);
        WrId {
            kind,
            index,
            generation: (generation & OP_GEN_MASK) | ((op % MAX_OPS) << OP_GEN_BITS),
        }
    }

    /// The op number ([`WrId::for_op`]); 0 for kinds that carry none.
    pub fn op(&self) -> u32 {
        if self.kind.numbers_ops() {
            (self.generation & GEN_MASK) >> OP_GEN_BITS
        } else {
            0
        }
    }

    /// Packs the id into the 64-bit `wr_id` of a verbs work request:
    /// kind in bits 60..64, generation (mod 2^28) in 32..60, index in 0..32.
    pub fn to_u64(self) -> u64 {
        ((self.kind as u64) << 60)
            | (u64::from(self.generation & GEN_MASK) << 32)
            | u64::from(self.index)
    }

    /// Unpacks [`WrId::to_u64`]; `None` for a kind this engine never posts.
    /// The generation comes back modulo 2^28: the engine compares
    /// generations modulo 2^28 too ([`WrId::same_generation`]).
    pub fn from_u64(raw: u64) -> Option<WrId> {
        Some(WrId {
            kind: WrKind::from_bits(raw >> 60)?,
            index: raw as u32,
            generation: ((raw >> 32) as u32) & GEN_MASK,
        })
    }

    /// True when this id was posted by an owner now at `current`
    /// generation (compared modulo 2^28, the width `to_u64` keeps; modulo
    /// 2^16 for an id that carries an op number).
    pub fn same_generation(&self, current: u32) -> bool {
        let mask = if self.kind.numbers_ops() {
            OP_GEN_MASK
        } else {
            GEN_MASK
        };
        self.generation & mask == current & mask
    }
}

/// Which of the work requests one exchange of a slot posted (numbered
/// from 0, [`WrId::for_op`]) have completed: each counts once, so a
/// provider that reported a completion twice cannot make a slot think its
/// last Write or Read is done while another is still posted. Grows once
/// to the most ops an exchange of the slot posted, then keeps its room.
#[derive(Debug)]
pub(super) struct OpSet {
    done: Vec<u64>,
}

impl Default for OpSet {
    /// Room for 64 ops from the start (most exchanges post a few), so
    /// that the first use of a slot on the data path does not allocate.
    fn default() -> Self {
        OpSet { done: vec![0; 1] }
    }
}

impl OpSet {
    /// A new exchange that will number up to `ops` work requests.
    pub(super) fn reset(&mut self, ops: usize) {
        let words = ops.div_ceil(64);
        if self.done.len() < words {
            self.done.resize(words, 0);
        }
        for w in self.done.iter_mut().take(words) {
            *w = 0;
        }
    }

    /// Marks op `op` of the `posted` ones complete; false when it is not
    /// one of them or completed before (a duplicate).
    pub(super) fn first_completion(&mut self, op: u32, posted: usize) -> bool {
        let op = op as usize;
        if op >= posted {
            return false;
        }
        let Some(w) = self.done.get_mut(op / 64) else {
            return false;
        };
        let bit = 1u64 << (op % 64);
        if *w & bit != 0 {
            return false;
        }
        *w |= bit;
        true
    }
}

/// One operation for the provider, as plain data (the engine
/// knows no provider types). Every request is signaled: its completion
/// comes back through [`super::Connection::handle_completion`] (or
/// [`super::Connection::handle_recv`] for receives), which is when the
/// engine considers its memory free again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkRequest {
    /// Post `buf` (its whole length) as a receive buffer.
    PostRecv {
        /// Id for the receive completion.
        wr_id: WrId,
        /// The buffer.
        buf: BufId,
    },
    /// Send `local` (transport header plus any inline RPC message).
    Send {
        /// Id for the completion.
        wr_id: WrId,
        /// The bytes to send.
        local: LocalSlice,
        /// More bytes sent right after `local` in the same message (a
        /// second SGE): a payload sent from where it lies instead of
        /// copied next to its header. Owned by the Send until its
        /// completion, as `local` is.
        gather: Option<LocalSlice>,
        /// Send With Invalidate of this rkey of the peer: set only on an
        /// RDMA_DONE, to the reply read chunk's rkey, when both peers
        /// negotiated `Extensions::REMOTE_INVALIDATE` (draft-lever s4.1.4).
        invalidate_rkey: Option<u32>,
    },
    /// RDMA Read `remote` (a peer's read chunk segment) into `local`.
    RdmaRead {
        /// Id for the completion.
        wr_id: WrId,
        /// Destination.
        local: LocalSlice,
        /// Source in the peer's memory; `remote.length == local.len`.
        remote: Segment,
    },
    /// RDMA Write `local` into `remote` (a peer's write or reply chunk
    /// segment). Posted before the Send that announces it, so the reliable
    /// connection's ordering places the data before the reply arrives
    /// (RFC 5666 s3.8).
    RdmaWrite {
        /// Id for the completion.
        wr_id: WrId,
        /// Source.
        local: LocalSlice,
        /// Destination in the peer's memory; `remote.length == local.len`.
        remote: Segment,
    },
    /// Bind memory window `window` under `rkey` over exactly `local`,
    /// granting `access`: one exchange's exposure, under a key of its
    /// own. Queued before the Send that advertises the key, so send-queue
    /// order makes it valid before the peer can use it.
    Bind {
        /// Id for the completion.
        wr_id: WrId,
        /// The provider's window index.
        window: u32,
        /// The key, chosen by the engine among the window's keys.
        rkey: u32,
        /// The bytes exposed.
        local: LocalSlice,
        /// What the peer may do.
        access: Access,
    },
    /// Invalidate our `rkey`: the exposure ended (answer, timeout, error),
    /// and from the execution of this request on the peer's accesses
    /// under it fail at the provider.
    Invalidate {
        /// Id for the completion.
        wr_id: WrId,
        /// The key.
        rkey: u32,
    },
}

impl WorkRequest {
    /// The id its completion will carry.
    pub fn wr_id(&self) -> WrId {
        match *self {
            WorkRequest::PostRecv { wr_id, .. }
            | WorkRequest::Send { wr_id, .. }
            | WorkRequest::RdmaRead { wr_id, .. }
            | WorkRequest::RdmaWrite { wr_id, .. }
            | WorkRequest::Bind { wr_id, .. }
            | WorkRequest::Invalidate { wr_id, .. } => wr_id,
        }
    }
}

/// The outcome of a work request, as the provider reports it (a subset of
/// ibverbs `ibv_wc_status`, enough to decide what the engine does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcStatus {
    /// Done.
    Success,
    /// The queue pair is in the error state; the request was not executed.
    Flushed,
    /// The peer refused the access (bad rkey, out of bounds, no
    /// permission).
    RemoteAccessError,
    /// The peer had no receive posted for a Send, retries exhausted.
    ReceiverNotReady,
    /// A received message was longer than the posted buffer.
    LengthError,
    /// Any other provider failure.
    Other,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wr_id_round_trips_through_u64() {
        for kind in [
            WrKind::Recv,
            WrKind::CallSend,
            WrKind::ReplySend,
            WrKind::ChunkRead,
            WrKind::ChunkWrite,
            WrKind::ErrorSend,
            WrKind::ReplyRead,
            WrKind::DoneSend,
            WrKind::KeyBind,
            WrKind::KeyInvalidate,
        ] {
            let id = WrId {
                kind,
                index: 0xdead_beef,
                generation: 0x0abc_def1,
            };
            assert_eq!(WrId::from_u64(id.to_u64()), Some(id));
        }
        assert_eq!(WrId::from_u64(0), None);
        assert_eq!(WrId::from_u64(u64::MAX), None);
    }

    #[test]
    fn generation_compares_modulo_encoded_width() {
        let id = WrId {
            kind: WrKind::Recv,
            index: 1,
            generation: (1 << 28) + 5,
        };
        let back = WrId::from_u64(id.to_u64()).unwrap();
        assert!(back.same_generation(5));
        assert!(back.same_generation((1 << 28) + 5));
        assert!(!back.same_generation(6));
    }
}
