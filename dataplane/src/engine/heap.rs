//! Heap memory held as a raw pointer (module-level so that the engine's
//! two users, `buffers` and `bulk`, share it without importing each
//! other).

/// Memory on the heap for an engine without a provider (tests, the
/// fuzzer): zeroed, and held only as a raw pointer. It is the engine's
/// [`super::PeerMemory`] there, and the memory of a heap
/// [`super::BulkPool`].
pub struct HeapPeerMemory {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: plain memory reached through raw pointers by its owner (a bulk
// pool's: by the connections holding leases of disjoint buffers).
unsafe impl Send for HeapPeerMemory {}
// SAFETY: as above.
unsafe impl Sync for HeapPeerMemory {}

impl HeapPeerMemory {
    /// `len` zeroed bytes, or `None` if they cannot be had.
    pub fn new(len: usize) -> Option<HeapPeerMemory> {
        let mut v: Vec<u8> = Vec::new();
        v.try_reserve_exact(len).ok()?;
        v.resize(len, 0);
        let b = v.into_boxed_slice();
        let len = b.len();
        Some(HeapPeerMemory {
            ptr: Box::into_raw(b).cast::<u8>(),
            len,
        })
    }

    /// First byte.
    pub(super) fn raw_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Length in bytes.
    pub(super) fn byte_len(&self) -> usize {
        self.len
    }
}

impl core::fmt::Debug for HeapPeerMemory {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("HeapPeerMemory")
            .field("len", &self.len)
            .finish()
    }
}

impl Drop for HeapPeerMemory {
    fn drop(&mut self) {
        // SAFETY: made by Box::into_raw of a boxed slice of `len` bytes.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.len)) });
    }
}
