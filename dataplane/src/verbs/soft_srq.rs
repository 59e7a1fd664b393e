//! The posted receives of a shared receive queue in the software
//! providers (`shm`, `roce`): one list that the application posts to and
//! the queue pairs on it take from when a message starts.
//!
//! A message takes the newest receive (`SharedReceiveQueue`): a receive
//! posted again as soon as its message was copied out is the next one
//! used, so it is still in cache, and a queue much larger than the load
//! touches only the buffers that load needs.
use std::collections::VecDeque;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use super::soft_mr::MrTable;
use super::{
    lock, Access, PostError, PostFailed, Provider, RecvWr, SharedReceiveQueue, SrqCaps, VerbsError,
};

/// The shared receive queue of a software provider `P` (its `P::Srq`):
/// the application's handle on the [`SoftSrq`] its queue pairs take
/// receives from. `P` keeps one provider's queue from being passed to
/// another's calls.
pub struct SoftSrqHandle<P> {
    pub(crate) inner: Arc<SoftSrq>,
    _provider: PhantomData<fn() -> P>,
}

impl<P> std::fmt::Debug for SoftSrqHandle<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftSrqHandle")
            .field("inner", &self.inner)
            .finish()
    }
}

impl<P> SoftSrqHandle<P> {
    /// `ProtectionDomain::create_srq` of a software provider: an empty
    /// queue of `caps.max_wr` receives in the protection domain whose
    /// registrations are `mrs`, if `caps.max_wr` is within `1..=max_wr`
    /// and `caps.max_message` at least `min_message` (the provider's
    /// limits, `why` the error saying them).
    ///
    /// # Errors
    /// [`VerbsError::Limit`] with `why`.
    pub(crate) fn create(
        mrs: &Arc<MrTable>,
        caps: SrqCaps,
        max_wr: u32,
        min_message: u32,
        why: &'static str,
    ) -> Result<Self, VerbsError> {
        if !(1..=max_wr).contains(&caps.max_wr) || caps.max_message < min_message {
            return Err(VerbsError::Limit(why));
        }
        Ok(SoftSrqHandle {
            inner: Arc::new(SoftSrq::new(mrs.clone(), caps)),
            _provider: PhantomData,
        })
    }
}

impl<P: Provider> SharedReceiveQueue<P> for SoftSrqHandle<P> {
    fn post_recv(&self, wr: RecvWr) -> Result<(), PostFailed<RecvWr>> {
        self.inner.post(wr)
    }

    fn posted(&self) -> usize {
        self.inner.posted()
    }
}

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
    fn new(mrs: Arc<MrTable>, caps: SrqCaps) -> SoftSrq {
        SoftSrq {
            mrs,
            caps,
            wrs: Mutex::new(VecDeque::with_capacity(caps.max_wr as usize)),
        }
    }

    /// What `ProtectionDomain::create_qp_on_srq` requires of the queue
    /// (as `ibverbs` does): it was created in the protection domain of
    /// `mrs`, the queue pair's. Its receives were checked against that
    /// domain's registrations when posted; a queue pair of another domain
    /// would place messages in memory its own domain never granted.
    ///
    /// # Errors
    /// [`VerbsError::InvalidRegistration`] otherwise.
    pub(crate) fn check_pd(&self, mrs: &Arc<MrTable>) -> Result<(), VerbsError> {
        if !Arc::ptr_eq(&self.mrs, mrs) {
            return Err(VerbsError::InvalidRegistration(
                "the shared receive queue belongs to another protection domain",
            ));
        }
        Ok(())
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
