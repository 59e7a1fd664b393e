//! A counting global allocator for tests that prove a code path allocates
//! nothing (or no more than its input justifies).
//!
//! Counts are per thread, so the test harness's own threads do not disturb
//! a measurement. Install it in a test binary with
//! `#[global_allocator] static A: CountingAllocator = CountingAllocator;`
//! and measure with [`measure`].

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Forwards to the system allocator and counts, per thread, the number of
/// allocations and the bytes requested by allocations and growing
/// reallocations.
pub struct CountingAllocator;

thread_local! {
    // `const` initialisation: reading these never allocates, which matters
    // inside the allocator itself.
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
    static BYTES: Cell<u64> = const { Cell::new(0) };
}

fn count(bytes: usize) {
    // `try_with`: during thread teardown the slots may be gone; such
    // allocations are not part of any measurement.
    let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
    let _ = BYTES.try_with(|c| c.set(c.get() + bytes as u64));
}

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged, so `System`'s guarantees hold; counting touches only
// thread-local cells and never allocates.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: forwarded unchanged; the caller upholds `alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` through this allocator with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size.saturating_sub(layout.size()));
        // SAFETY: forwarded unchanged; the caller upholds `realloc`'s contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// What a measured closure allocated on this thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocated {
    /// Number of allocations and reallocations.
    pub count: u64,
    /// Bytes requested (growth only, for reallocations).
    pub bytes: u64,
}

/// Runs `f` and reports what it allocated on the calling thread.
pub fn measure<R>(f: impl FnOnce() -> R) -> (R, Allocated) {
    let (c0, b0) = (ALLOCATIONS.with(Cell::get), BYTES.with(Cell::get));
    let r = f();
    let (c1, b1) = (ALLOCATIONS.with(Cell::get), BYTES.with(Cell::get));
    (
        r,
        Allocated {
            count: c1 - c0,
            bytes: b1 - b0,
        },
    )
}

/// Allocations made on the calling thread so far (for measuring a thread
/// the test does not run on, e.g. from inside a callback on a worker).
pub fn thread_allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}
