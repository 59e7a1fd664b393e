//! Completion queues: a poll drives the devices of the queue's queue
//! pairs and takes completions from those its ready list names.
use std::collections::VecDeque;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::device::Device;
use super::ready::ReadyList;
use crate::verbs::{lock, Completion, CompletionQueue};

pub(super) static CQ_IDS: AtomicUsize = AtomicUsize::new(1);

/// A device with queue pairs on a completion queue, and how many.
#[derive(Debug)]
pub(super) struct CqDevice {
    dev: Arc<Device>,
    qps: usize,
}

#[derive(Debug)]
pub(super) struct CqInner {
    pub(super) id: usize,
    pub(super) depth: usize,
    /// The devices of its queue pairs: a poll drives each once.
    pub(super) devices: Mutex<Vec<CqDevice>>,
    /// Its queue pairs with completions waiting (ready.rs).
    pub(super) ready: Arc<ReadyList>,
    /// Completions of queue pairs that never reached a device (flushed
    /// pre-posted receives of a dropped or failed prepared QP).
    pub(super) orphans: Mutex<VecDeque<Completion>>,
}

impl CqInner {
    pub(super) fn attach(&self, dev: &Arc<Device>) {
        let mut devices = lock(&self.devices);
        match devices.iter_mut().find(|d| Arc::ptr_eq(&d.dev, dev)) {
            Some(d) => d.qps += 1,
            None => devices.push(CqDevice {
                dev: dev.clone(),
                qps: 1,
            }),
        }
        // A queue pair is on this CQ's list at most once: room for all of
        // them now, so announcing never allocates.
        let qps: usize = devices.iter().map(|d| d.qps).sum();
        self.ready.reserve(qps);
    }

    pub(super) fn detach(&self, dev: &Arc<Device>) {
        let mut devices = lock(&self.devices);
        if let Some(i) = devices.iter().position(|d| Arc::ptr_eq(&d.dev, dev)) {
            devices[i].qps -= 1;
            if devices[i].qps == 0 {
                devices.swap_remove(i);
            }
        }
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
}

impl CompletionQueue for RoceCq {
    fn poll(&self, out: &mut [Completion]) -> usize {
        let mut got = 0;
        {
            let mut o = lock(&self.inner.orphans);
            while got < out.len() {
                let Some(c) = o.pop_front() else { break };
                out[got] = c;
                got += 1;
            }
        }
        let devices = lock(&self.inner.devices);
        if devices.is_empty() {
            return got;
        }
        let now = Instant::now();
        let id = self.inner.id;
        let ready = &*self.inner.ready;
        for d in devices.iter() {
            let mut eng = lock(&d.dev.eng);
            eng.progress(now);
            d.dev.mark_progress(now);
            let me = d.dev.id;
            // Each announced queue pair once; another device's go back.
            for _ in 0..ready.len() {
                if got == out.len() {
                    break;
                }
                let Some(r) = ready.pop() else { break };
                if r.dev != me {
                    // Another device's: back in line, unless that device
                    // has no queue pair on this CQ any more.
                    if devices.iter().any(|d| d.dev.id == r.dev) {
                        ready.push(r);
                    }
                    continue;
                }
                // Gone since it announced: its completions are orphans.
                let Some(qp) = eng.qps.get_mut(&r.qpn) else {
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
