//! Shared receive queues: a queue pair on one takes a receive from it
//! when a Send (or an RDMA Write with immediate) starts, and holds it
//! until the message's last packet; an empty queue is receiver-not-ready
//! for that message (IBTA 9.7.5.2.8), as an empty receive queue is. The
//! receives are taken by a shard's progress (under the shard's lock, then
//! the queue's) and posted by the application.
use super::Roce;

/// A shared receive queue.
pub type RoceSrq = crate::verbs::SoftSrqHandle<Roce>;
