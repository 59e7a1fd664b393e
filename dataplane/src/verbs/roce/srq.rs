//! Shared receive queues: one list of posted receives that every queue
//! pair created on it takes from, in order, when a Send (or an RDMA Write
//! with immediate) starts; an empty list is receiver-not-ready for that
//! message (IBTA 9.7.5.2.8), as an empty receive queue is.
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use super::pd::PdInner;
use super::Roce;
use crate::verbs::{lock, Access, PostError, PostFailed, RecvWr, SharedReceiveQueue, SrqCaps};

/// The receives of a shared receive queue. Taken by a shard's progress
/// (under a shard's lock, then this one) and posted by the application.
#[derive(Debug)]
pub(crate) struct SrqShared {
    pub(super) pd: Arc<PdInner>,
    max_wr: u32,
    wrs: Mutex<VecDeque<RecvWr>>,
}

impl SrqShared {
    pub(super) fn new(pd: Arc<PdInner>, caps: SrqCaps) -> SrqShared {
        SrqShared {
            pd,
            max_wr: caps.max_wr,
            wrs: Mutex::new(VecDeque::with_capacity(caps.max_wr as usize)),
        }
    }

    /// The newest posted receive, for a message that starts now (see
    /// `SharedReceiveQueue`).
    pub(super) fn take(&self) -> Option<RecvWr> {
        lock(&self.wrs).pop_back()
    }

    /// Puts back a receive that a queue pair took and did not complete
    /// (the queue pair failed mid-message): it serves the others.
    pub(super) fn give_back(&self, wr: RecvWr) {
        lock(&self.wrs).push_back(wr);
    }
}

/// A shared receive queue.
#[derive(Debug)]
pub struct RoceSrq {
    pub(super) inner: Arc<SrqShared>,
}

impl SharedReceiveQueue<Roce> for RoceSrq {
    fn post_recv(&self, wr: RecvWr) -> Result<(), PostFailed<RecvWr>> {
        let s = &self.inner;
        if !wr
            .sgl
            .iter()
            .all(|sge| sge.in_bounds() && s.pd.check_local(sge, Access::LOCAL_WRITE))
        {
            return Err(PostFailed {
                error: PostError::Invalid,
                wr,
            });
        }
        let mut wrs = lock(&s.wrs);
        if wrs.len() >= s.max_wr as usize {
            return Err(PostFailed {
                error: PostError::QueueFull,
                wr,
            });
        }
        wrs.push_back(wr);
        Ok(())
    }

    fn posted(&self) -> usize {
        lock(&self.inner.wrs).len()
    }
}
