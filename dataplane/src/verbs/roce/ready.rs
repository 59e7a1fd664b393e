//! Which queue pairs have completions waiting, per completion queue.
//!
//! A queue pair announces itself on its completion queue's list when one
//! of its completion queues goes from empty to non-empty; a poll visits
//! only the announced queue pairs. A worker's completion queue shared by
//! 1,024 connections then costs a poll the same as one with a single
//! connection (docs/WORKER.md, "One completion queue per worker").

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use crate::verbs::lock;
use crate::wake::SleeperBell;

/// A queue pair with completions waiting: the shard it lives in (by
/// `Shard::id`) and its number there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Ready {
    pub shard: usize,
    pub qpn: u32,
}

/// The announced queue pairs of one completion queue, in order. Locked
/// last: it is pushed under a shard's lock and popped under it.
///
/// It is also the queue's doorbell (`CompletionQueue::arm_wakeup`): while
/// the poller sleeps, a push (by the device's thread, which drives the
/// sleeper's shards) rings it.
#[derive(Debug)]
pub(super) struct ReadyList {
    q: Mutex<VecDeque<Ready>>,
    /// Rung by a push while the poller sleeps.
    bell: SleeperBell,
}

impl ReadyList {
    pub fn new() -> nix::Result<ReadyList> {
        Ok(ReadyList {
            q: Mutex::new(VecDeque::new()),
            bell: SleeperBell::new()?,
        })
    }

    pub fn push(&self, r: Ready) {
        lock(&self.q).push_back(r);
        self.bell.notify();
    }

    /// The poller is about to sleep: pushes from now on ring the
    /// doorbell. False when something is announced already.
    pub fn arm(&self) -> bool {
        self.bell.arm(|| lock(&self.q).is_empty())
    }

    /// The poller is back: pushes stop ringing; the doorbell is quiet.
    pub fn disarm(&self) {
        self.bell.disarm();
    }

    pub fn doorbell(&self) -> &SleeperBell {
        &self.bell
    }

    /// Puts back a queue pair whose completions did not all fit the
    /// caller's buffer: it is first at the next poll.
    pub fn push_front(&self, r: Ready) {
        lock(&self.q).push_front(r);
    }

    pub fn pop(&self) -> Option<Ready> {
        lock(&self.q).pop_front()
    }

    /// Makes room for `n` announcements in all (control path).
    pub fn reserve(&self, n: usize) {
        let mut q = lock(&self.q);
        let more = n.saturating_sub(q.len());
        q.reserve(more);
    }

    pub fn len(&self) -> usize {
        lock(&self.q).len()
    }
}

/// Where an installed queue pair announces completions: the lists of its
/// send and receive completion queues, and its shard.
#[derive(Debug, Clone)]
pub(super) struct Announce {
    pub send: Arc<ReadyList>,
    pub recv: Arc<ReadyList>,
    pub shard: usize,
}
