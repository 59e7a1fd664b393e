//! The bulk buffer pool: large message buffers a worker's connections
//! lease one exchange at a time.
//!
//! Why: a responder slot must be able to hold the largest call and reply
//! the configuration allows (a megabyte each by default), yet most calls
//! and replies fit the inline size. Giving every slot of every connection
//! buffers of that size cost 2 MiB per slot and 2 x credits slots, 131 MiB
//! of address space per connection at the defaults, almost none of it
//! touched. With a pool, a responder slot owns an inline-size message
//! buffer only and leases a pool buffer for a call or reply that needs
//! more, for that exchange, giving it back when the exchange's last
//! completion arrives (SPDK's nvmf poll
//! group buffer cache, Linux svcrdma's page pool). The pool is bounded:
//! a call that finds it empty waits, holding its receive, and is retried
//! ([`super::Timer::BulkRetry`]); memory never grows past the pool.
//!
//! Pool buffers are private memory (only this process writes them; the
//! provider does while a work request owns one). They are never exposed
//! to a peer: one registration covers the whole pool, so exposing a
//! buffer under its key (or, with `shm`, its mapping) would expose every
//! connection's. A connection that may expose its replies (responder-
//! provided read chunks) keeps per-connection message buffers instead
//! ([`super::ConfigError::BulkPoolWithExposedReplies`]).
//!
//! The free list is a stack of indices: the buffer given back last is the
//! next one leased, so a worker that needs few large buffers at a time
//! keeps reusing the same, cache-warm ones (a FIFO queue would cycle
//! through the whole pool, 64 MiB at the defaults, and every READ's reply
//! would start cold: 8 % less READ throughput in `rpcrdma-bench targets`).
//! It sits behind a mutex that only the owning worker's thread takes (a
//! pool is shared by the connections of one worker, and moves with them
//! across the control ring, hence `Sync`): uncontended, one atomic
//! exchange each way. Leasing allocates nothing.

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

use super::heap::HeapPeerMemory;

/// Memory a [`BulkPool`] cuts its buffers from: a base pointer and a
/// length, shared by every connection that leases from the pool.
///
/// # Safety
/// `as_ptr()..as_ptr() + len()` must stay mapped and writable for as long
/// as the value lives; no peer may write it (it is never exposed), and no
/// Rust reference to those bytes may exist outside the leases the pool
/// hands out.
pub unsafe trait BulkMemory: core::fmt::Debug + Send + Sync {
    /// First byte.
    fn as_ptr(&self) -> *mut u8;
    /// Length in bytes.
    fn len(&self) -> usize;
    /// Whether the length is zero.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Whether 2 MiB hugepages back it (for status reports).
    fn is_hugepage_backed(&self) -> bool {
        false
    }
}

/// A bounded pool of equal buffers over one [`BulkMemory`] (module docs).
pub struct BulkPool {
    memory: Box<dyn BulkMemory>,
    buf_len: u32,
    count: u32,
    /// Indices not leased, the most recently returned last.
    free: Mutex<Vec<u32>>,
    /// Leases refused because the pool was empty (or its last buffers
    /// were kept for waiting connections).
    empty: AtomicU64,
    /// Connections with a call waiting for a buffer: that many free
    /// buffers are kept for them (`take`).
    waiters: AtomicU32,
}

impl core::fmt::Debug for BulkPool {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("BulkPool")
            .field("buf_len", &self.buf_len)
            .field("count", &self.count)
            .field("available", &self.available())
            .finish()
    }
}

/// Buffers start at multiples of this (cache lines, as engine buffers).
const BULK_ALIGN: u32 = 64;

impl BulkPool {
    /// A pool of as many `buf_len`-byte buffers (rounded up to 64) as
    /// `memory` holds, or `None` if that is none or `buf_len` is zero. An
    /// exchange needs one buffer at most (its call, then its reply).
    pub fn new(memory: Box<dyn BulkMemory>, buf_len: u32) -> Option<BulkPool> {
        let buf_len = buf_len.checked_next_multiple_of(BULK_ALIGN)?;
        if buf_len == 0 {
            return None;
        }
        let count = u32::try_from(memory.len() / buf_len as usize).unwrap_or(u32::MAX);
        if count == 0 {
            return None;
        }
        // Reversed, so that leases start at buffer 0.
        let free = Mutex::new((0..count).rev().collect());
        Some(BulkPool {
            memory,
            buf_len,
            count,
            free,
            empty: AtomicU64::new(0),
            waiters: AtomicU32::new(0),
        })
    }

    /// Bytes a pool of `count` buffers of `buf_len` needs.
    pub fn memory_len(count: u32, buf_len: u32) -> usize {
        count as usize * buf_len.next_multiple_of(BULK_ALIGN) as usize
    }

    /// A pool of `count` buffers of `buf_len` bytes on the heap (tests,
    /// an engine without a provider).
    pub fn on_heap(count: u32, buf_len: u32) -> Option<BulkPool> {
        let memory = HeapPeerMemory::new(Self::memory_len(count, buf_len))?;
        Self::new(Box::new(memory), buf_len)
    }

    /// Whether 2 MiB hugepages back the buffers.
    pub fn is_hugepage_backed(&self) -> bool {
        self.memory.is_hugepage_backed()
    }

    /// Length of each buffer.
    pub fn buf_len(&self) -> u32 {
        self.buf_len
    }

    /// Number of buffers.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Buffers not leased (equal to [`BulkPool::count`] once every
    /// connection using the pool is gone: the leak check).
    pub fn available(&self) -> u32 {
        self.free_list().len() as u32
    }

    /// The free list. A panic while it was held cannot leave it torn
    /// (every change is one push or pop), so a poisoned lock is used as
    /// is.
    fn free_list(&self) -> std::sync::MutexGuard<'_, Vec<u32>> {
        self.free.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Length of the whole pool memory.
    pub fn memory_bytes(&self) -> usize {
        self.memory.len()
    }

    /// Leases refused so far because every buffer was leased (each
    /// wait of a call, and each of its retries, counts).
    pub fn times_empty(&self) -> u64 {
        self.empty.load(Ordering::Relaxed)
    }

    /// Leases a buffer: its index. For a connection not `waiting`, only
    /// while more buffers are free than connections wait: a call that
    /// waited is served before calls that arrived after it, rather than
    /// losing every freed buffer to the next new call until its retry.
    pub(super) fn take(&self, waiting: bool) -> Option<u32> {
        let mut free = self.free_list();
        let kept = if waiting {
            0
        } else {
            self.waiters.load(Ordering::Relaxed) as usize
        };
        let got = if free.len() > kept { free.pop() } else { None };
        if got.is_none() {
            self.empty.fetch_add(1, Ordering::Relaxed);
        }
        got
    }

    /// A connection starts waiting for a buffer.
    pub(super) fn add_waiter(&self) {
        self.waiters.fetch_add(1, Ordering::Relaxed);
    }

    /// A connection stops waiting (it got a buffer, closed or dropped).
    pub(super) fn remove_waiter(&self) {
        let _ = self
            .waiters
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| w.checked_sub(1));
    }

    /// Connections waiting for a buffer now.
    pub fn waiters(&self) -> u32 {
        self.waiters.load(Ordering::Relaxed)
    }

    /// Returns buffer `index`.
    pub(super) fn give_back(&self, index: u32) {
        debug_assert!(index < self.count);
        // Never grows past `count`: every index is leased at most once.
        self.free_list().push(index);
    }

    /// Offset of buffer `index` in the pool memory.
    pub(super) fn offset(&self, index: u32) -> usize {
        index as usize * self.buf_len as usize
    }

    /// The pool memory's first byte.
    pub(super) fn base(&self) -> *mut u8 {
        self.memory.as_ptr()
    }
}

// SAFETY: the allocation lives until drop; nobody but the leases' holders
// reaches it.
unsafe impl BulkMemory for HeapPeerMemory {
    fn as_ptr(&self) -> *mut u8 {
        self.raw_ptr()
    }
    fn len(&self) -> usize {
        self.byte_len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_leases_each_buffer_once_and_takes_it_back() {
        let pool = BulkPool::on_heap(3, 1000).unwrap();
        assert_eq!(pool.buf_len(), 1024);
        assert_eq!((pool.count(), pool.available()), (3, 3));
        let mut got: Vec<u32> = (0..3).map_while(|_| pool.take(false)).collect();
        assert_eq!(pool.take(false), None, "a fourth lease from three buffers");
        got.sort_unstable();
        assert_eq!(got, [0, 1, 2]);
        assert_eq!(pool.offset(2), 2048);
        for i in got {
            pool.give_back(i);
        }
        assert_eq!(pool.available(), 3);
        assert_eq!(pool.times_empty(), 1);
    }

    #[test]
    fn the_buffer_given_back_last_is_leased_next() {
        // Cache-warm reuse: one exchange at a time keeps using one buffer.
        let pool = BulkPool::on_heap(4, 1024).unwrap();
        let first = pool.take(false).unwrap();
        pool.give_back(first);
        for _ in 0..10 {
            let again = pool.take(false).unwrap();
            assert_eq!(again, first);
            pool.give_back(again);
        }
        let (a, b) = (pool.take(false).unwrap(), pool.take(false).unwrap());
        pool.give_back(a);
        assert_eq!(pool.take(false), Some(a));
        pool.give_back(b);
    }

    #[test]
    fn free_buffers_are_kept_for_waiting_connections() {
        let pool = BulkPool::on_heap(2, 1024).unwrap();
        pool.add_waiter();
        let a = pool.take(false).unwrap();
        assert_eq!(
            pool.take(false),
            None,
            "the last one is kept for the waiter"
        );
        let b = pool.take(true).unwrap();
        pool.remove_waiter();
        pool.give_back(a);
        pool.give_back(b);
        assert_eq!(pool.waiters(), 0);
        pool.remove_waiter();
        assert_eq!(pool.waiters(), 0, "never below zero");
    }

    #[test]
    fn a_pool_needs_a_buffer() {
        assert!(BulkPool::on_heap(0, 4096).is_none());
        assert!(BulkPool::on_heap(1, 0).is_none());
        assert!(BulkPool::on_heap(1, 4096).is_some());
    }
}
