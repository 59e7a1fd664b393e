//! The posted receives of a shared receive queue in the software
//! providers (`shm`, `roce`): one list that the application posts to and
//! the queue pairs on it take from when a message starts.
//!
//! A message takes the newest receive (`SharedReceiveQueue`): a receive
//! posted again as soon as its message was copied out is the next one
//! used, so it is still in cache, and a queue much larger than the load
//! touches only the buffers that load needs.
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use super::soft_mr::MrTable;
use super::{lock, Access, PostError, PostFailed, RecvWr, SrqCaps};

/// A shared receive queue's receives, checked against the registrations
/// of its protection domain.
#[derive(Debug)]
pub(crate) struct SoftSrq {
    mrs: Arc<MrTable>,
    caps: SrqCaps,
    wrs: Mutex<VecDeque<RecvWr>>,
}

impl SoftSrq {
    /// An empty queue of `caps.max_wr` receives in the protection domain
    /// whose registrations are `mrs`.
    pub(crate) fn new(mrs: Arc<MrTable>, caps: SrqCaps) -> SoftSrq {
        SoftSrq {
            mrs,
            caps,
            wrs: Mutex::new(VecDeque::with_capacity(caps.max_wr as usize)),
        }
    }

    /// Whether it was created in the protection domain of `mrs`.
    pub(crate) fn belongs_to(&self, mrs: &Arc<MrTable>) -> bool {
        Arc::ptr_eq(&self.mrs, mrs)
    }

    /// Its sizes.
    pub(crate) fn caps(&self) -> SrqCaps {
        self.caps
    }

    /// `SharedReceiveQueue::post_recv`: every SGE inside a live
    /// registration with local write, and room in the queue.
    pub(crate) fn post(&self, wr: RecvWr) -> Result<(), PostFailed<RecvWr>> {
        if !wr
            .sgl
            .iter()
            .all(|s| s.in_bounds() && self.mrs.check_local(s, Access::LOCAL_WRITE))
        {
            return Err(PostFailed {
                error: PostError::Invalid,
                wr,
            });
        }
        let mut wrs = lock(&self.wrs);
        if wrs.len() >= self.caps.max_wr as usize {
            return Err(PostFailed {
                error: PostError::QueueFull,
                wr,
            });
        }
        wrs.push_back(wr);
        Ok(())
    }

    /// Receives posted and not taken.
    pub(crate) fn posted(&self) -> usize {
        lock(&self.wrs).len()
    }

    /// The receive for a message that starts now, if one is posted.
    pub(crate) fn take(&self) -> Option<RecvWr> {
        lock(&self.wrs).pop_back()
    }

    /// Puts back a receive that was taken and not completed (its queue
    /// pair failed, or the message turned out invalid): it serves the
    /// others.
    pub(crate) fn give_back(&self, wr: RecvWr) {
        lock(&self.wrs).push_back(wr);
    }
}
