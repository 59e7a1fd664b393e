//! Completion queues: a poll drives the shards of the queue's queue
//! pairs and takes completions from those its ready list names.
use std::collections::VecDeque;
use std::os::fd::{BorrowedFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::device::{Control, DataPath, Device, Shard};
use super::ready::ReadyList;
use crate::verbs::{lock, Completion, CompletionQueue};

pub(super) static CQ_IDS: AtomicUsize = AtomicUsize::new(1);

/// A shard with queue pairs on a completion queue, and how many.
#[derive(Debug)]
pub(super) struct CqShard {
    dev: Arc<Device>,
    shard: Arc<Shard>,
    qps: usize,
    /// The shard is this queue's own (its queue pairs have this queue as
    /// their receive queue); otherwise this queue is only the send queue
    /// of some of them.
    owner: bool,
}

#[derive(Debug)]
pub(super) struct CqInner {
    pub(super) id: usize,
    pub(super) depth: usize,
    /// The shards of its queue pairs: a poll drives each once.
    pub(super) shards: Mutex<Vec<CqShard>>,
    /// Its queue pairs with completions waiting (ready.rs).
    pub(super) ready: Arc<ReadyList>,
    /// Completions of queue pairs that never reached a device (flushed
    /// pre-posted receives of a dropped or failed prepared QP).
    pub(super) orphans: Mutex<VecDeque<Completion>>,
}

impl CqInner {
    /// This queue's shard on `dev`, created if it has none yet (the
    /// control part is locked: shards are made at connection setup).
    pub(super) fn shard_on(&self, dev: &Arc<Device>, ctl: &Control) -> Arc<Shard> {
        let shards = lock(&self.shards);
        match shards.iter().find(|s| s.owner && Arc::ptr_eq(&s.dev, dev)) {
            Some(s) => s.shard.clone(),
            None => dev.new_shard(ctl),
        }
    }

    /// Counts a queue pair of `shard` on this queue.
    pub(super) fn attach(&self, dev: &Arc<Device>, shard: &Arc<Shard>, owner: bool) {
        let mut shards = lock(&self.shards);
        match shards.iter_mut().find(|s| Arc::ptr_eq(&s.shard, shard)) {
            Some(s) => s.qps += 1,
            None => shards.push(CqShard {
                dev: dev.clone(),
                shard: shard.clone(),
                qps: 1,
                owner,
            }),
        }
        // A queue pair is on this CQ's list at most once: room for all of
        // them now, so announcing never allocates.
        let qps: usize = shards.iter().map(|s| s.qps).sum();
        self.ready.reserve(qps);
    }

    /// Uncounts a queue pair of `shard`; the shard goes with its owner's
    /// last queue pair.
    pub(super) fn detach(&self, shard: &Arc<Shard>) {
        let mut shards = lock(&self.shards);
        if let Some(i) = shards.iter().position(|s| Arc::ptr_eq(&s.shard, shard)) {
            shards[i].qps -= 1;
            if shards[i].qps == 0 {
                let s = shards.swap_remove(i);
                if s.owner {
                    s.dev.remove_shard(&s.shard);
                }
            }
        }
    }

    /// Its own shards' counters (one per device it has queue pairs on).
    pub(super) fn shard_stats(&self) -> Vec<super::RoceShardStats> {
        lock(&self.shards)
            .iter()
            .filter(|s| s.owner)
            .map(|s| s.shard.stats())
            .collect()
    }
}

/// A completion queue. Polling it drives the devices of its queue pairs
/// and visits only the queue pairs that announced completions, so a
/// queue shared by many mostly idle connections polls as fast as one.
#[derive(Debug)]
pub struct RoceCq {
    pub(super) inner: Arc<CqInner>,
}

impl RoceCq {
    /// Configured depth (informational: each QP buffers its completions).
    pub fn depth(&self) -> usize {
        self.inner.depth
    }

    /// The counters of this queue's shards, one per device it owns queue
    /// pairs on (see docs/ROCE.md, "Who drives a device").
    pub fn shard_stats(&self) -> Vec<super::RoceShardStats> {
        self.inner.shard_stats()
    }
}

impl CompletionQueue for RoceCq {
    /// One progress step of each of the queue's shards that holds
    /// nothing back (a held ACK leaves now: nobody may poll again soon),
    /// then the shards are handed to the device's thread, woken, until
    /// the next poll (docs/ROCE.md, "Who drives a device").
    fn before_sleep(&self) {
        let _data_path = DataPath::enter();
        let shards = lock(&self.inner.shards);
        let now = Instant::now();
        for s in shards.iter() {
            lock(&s.shard.state).progress(&s.dev, &s.shard, now, false);
            s.shard.hand_to_device(&s.dev);
        }
    }

    fn wakeup_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.inner.ready.doorbell().as_fd())
    }

    /// While the poller sleeps its shards are the device thread's
    /// (`before_sleep`), and an announcement that thread makes rings the
    /// doorbell (`ReadyList::push`).
    fn arm_wakeup(&self) -> bool {
        self.inner.ready.arm() && lock(&self.inner.orphans).is_empty()
    }

    fn disarm_wakeup(&self) {
        self.inner.ready.disarm();
    }

    /// The socket of each device none of whose shards a thread drives:
    /// a packet then wakes the sleeper at once, instead of waking the
    /// device's thread, which rings the doorbell when it has driven the
    /// packet's queue pair (two wake-ups in series). The device's thread
    /// still wakes too, and whichever reads the packet first hands it on.
    fn watch_also(&self, add: &mut dyn FnMut(RawFd)) {
        let now = Instant::now();
        for s in lock(&self.inner.shards).iter() {
            if let Some(fd) = s.dev.socket_if_nobody_drives(now) {
                add(fd);
            }
        }
    }

    fn poll(&self, out: &mut [Completion]) -> usize {
        let _data_path = DataPath::enter();
        let mut got = 0;
        {
            let mut o = lock(&self.inner.orphans);
            while got < out.len() {
                let Some(c) = o.pop_front() else { break };
                out[got] = c;
                got += 1;
            }
        }
        let shards = lock(&self.inner.shards);
        if shards.is_empty() {
            return got;
        }
        let now = Instant::now();
        let id = self.inner.id;
        let ready = &*self.inner.ready;
        for s in shards.iter() {
            let mut st = lock(&s.shard.state);
            st.progress(&s.dev, &s.shard, now, true);
            s.shard.mark_progress(&s.dev, now);
            s.shard.counters.polled.fetch_add(1, Ordering::Relaxed);
            let me = s.shard.id;
            // Each announced queue pair once; another shard's go back.
            for _ in 0..ready.len() {
                if got == out.len() {
                    break;
                }
                let Some(r) = ready.pop() else { break };
                if r.shard != me {
                    // Another shard's: back in line, unless that shard
                    // has no queue pair on this CQ any more.
                    if shards.iter().any(|s| s.shard.id == r.shard) {
                        ready.push(r);
                    }
                    continue;
                }
                // Gone since it announced: its completions are orphans.
                let Some(qp) = st.qps.get_mut(&r.qpn) else {
                    continue;
                };
                if qp.send_cq == id {
                    while got < out.len() {
                        let Some(c) = qp.send_done.pop_front() else {
                            break;
                        };
                        out[got] = c;
                        got += 1;
                    }
                }
                if qp.recv_cq == id {
                    while got < out.len() {
                        let Some(c) = qp.recv_done.pop_front() else {
                            break;
                        };
                        out[got] = c;
                        got += 1;
                    }
                }
                let left = (qp.send_cq == id && !qp.send_done.is_empty())
                    || (qp.recv_cq == id && !qp.recv_done.is_empty());
                if left {
                    // `out` is full: this one is first next time.
                    ready.push_front(r);
                    break;
                }
                qp.drained_on(id);
            }
        }
        got
    }
}
