//! Per-connection byte buffers backed by private anonymous mappings.
//!
//! A connection reserves room for its largest record and its largest reply
//! (16 MiB each by default) when it is set up, so that no RPC ever
//! allocates. Reserving is not touching: [`ZeroedBuf`] maps the bytes
//! privately and lazily (`MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE`), so
//! a page costs memory only once a message reaches it, and a connection
//! that only ever sees small calls stays small. A `Vec` of zeroes would
//! usually behave the same through `calloc`, but not always: once glibc
//! has raised its dynamic mmap threshold, `calloc` serves a large block
//! from the heap and clears it, touching every page of every connection.

use core::ptr::NonNull;
use std::io;
use std::num::NonZeroUsize;

use nix::sys::mman::{mmap_anonymous, munmap, MapFlags, ProtFlags};

/// A fixed-length, zero-initialised byte buffer in its own private
/// mapping, unmapped on drop. Pages are faulted in on first touch.
pub struct ZeroedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer exclusively owns its mapping, like a `Box<[u8]>`;
// `&ZeroedBuf` gives only shared byte access.
unsafe impl Send for ZeroedBuf {}
// SAFETY: as above; no interior mutability.
unsafe impl Sync for ZeroedBuf {}

impl ZeroedBuf {
    /// Maps `len` zero bytes (no mapping for `len == 0`).
    ///
    /// # Errors
    /// The `mmap` error, e.g. `ENOMEM` when the address space is exhausted.
    pub fn new(len: usize) -> io::Result<ZeroedBuf> {
        let Some(nz) = NonZeroUsize::new(len) else {
            return Ok(ZeroedBuf {
                ptr: NonNull::dangling(),
                len: 0,
            });
        };
        // SAFETY: a fresh private anonymous mapping at a kernel-chosen
        // address; nothing else refers to that range.
        let ptr = unsafe {
            mmap_anonymous(
                None,
                nz,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_PRIVATE | MapFlags::MAP_NORESERVE,
            )
        }
        .map_err(io::Error::from)?;
        Ok(ZeroedBuf {
            ptr: ptr.cast(),
            len,
        })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl AsRef<[u8]> for ZeroedBuf {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` bytes (or dangling with len 0),
        // initialised (anonymous mappings read as zero), and borrowed
        // shared for the lifetime of `&self`.
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl AsMut<[u8]> for ZeroedBuf {
    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_ref`, borrowed exclusively through `&mut self`.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl core::ops::Deref for ZeroedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_ref()
    }
}

impl core::ops::DerefMut for ZeroedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.as_mut()
    }
}

impl Drop for ZeroedBuf {
    fn drop(&mut self) {
        if self.len != 0 {
            // SAFETY: the mapping was created in `new` with this pointer and
            // length, and no borrow of it outlives `self`.
            unsafe {
                let _ = munmap(self.ptr.cast(), self.len);
            }
        }
    }
}

impl core::fmt::Debug for ZeroedBuf {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ZeroedBuf").field("len", &self.len).finish()
    }
}

/// Bytes waiting to be written to a socket: `buf[start..end]`, appended at
/// `end`, written from `start`.
///
/// The buffer is one reply-reserve (the largest message plus its record
/// mark) plus a batch area. A new message is encoded only where a whole
/// reserve fits after `end`, so an encoder never runs out of room for a
/// message within the limit; the batch area lets pipelined small messages
/// gather and leave in one `write`.
#[derive(Debug)]
pub(crate) struct OutBuf {
    buf: ZeroedBuf,
    start: usize,
    end: usize,
    /// Record mark plus largest message.
    reserve: usize,
    /// Pending bytes that may be moved to the front to make a reserve.
    batch: usize,
}

impl OutBuf {
    pub(crate) fn new(reserve: usize, batch: usize) -> io::Result<OutBuf> {
        Ok(OutBuf {
            buf: ZeroedBuf::new(reserve + batch)?,
            start: 0,
            end: 0,
            reserve,
            batch,
        })
    }

    /// Bytes not yet written.
    pub(crate) fn pending(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// Marks `n` pending bytes as written.
    pub(crate) fn consume(&mut self, n: usize) {
        self.start += n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// Whether a whole reserve fits after `end`, moving a short pending
    /// tail (at most the batch area) to the front if that makes it fit.
    pub(crate) fn make_reserve(&mut self) -> bool {
        if self.buf.len() - self.end >= self.reserve {
            return true;
        }
        let pending = self.end - self.start;
        if self.start > 0 && pending <= self.batch {
            // At most `batch` bytes, once per batch area filled.
            self.buf.copy_within(self.start..self.end, 0);
            self.start = 0;
            self.end = pending;
        }
        self.buf.len() - self.end >= self.reserve
    }

    /// The reserve after `end`, to encode one message into; call only
    /// after [`make_reserve`](Self::make_reserve) returned true.
    pub(crate) fn reserve_mut(&mut self) -> &mut [u8] {
        let end = self.end;
        &mut self.buf[end..end + self.reserve]
    }

    /// Appends the first `n` bytes of the reserve.
    pub(crate) fn commit(&mut self, n: usize) {
        debug_assert!(n <= self.reserve);
        self.end += n;
    }
}

/// Bytes read from a socket and not yet taken by the reassembler:
/// `buf[start..end]`. Filled only when empty, so each read gets the whole
/// buffer.
#[derive(Debug)]
pub(crate) struct InBuf {
    buf: ZeroedBuf,
    start: usize,
    end: usize,
}

impl InBuf {
    pub(crate) fn new(len: usize) -> io::Result<InBuf> {
        Ok(InBuf {
            buf: ZeroedBuf::new(len)?,
            start: 0,
            end: 0,
        })
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.start == self.end
    }

    pub(crate) fn unread(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    pub(crate) fn consume(&mut self, n: usize) {
        self.start += n;
    }

    /// The whole buffer, to read into; only when empty.
    pub(crate) fn space(&mut self) -> &mut [u8] {
        debug_assert!(self.is_empty());
        &mut self.buf[..]
    }

    /// `n` bytes were read into [`space`](Self::space).
    pub(crate) fn filled(&mut self, n: usize) {
        self.start = 0;
        self.end = n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_buf_is_zero_writable_and_empty_is_fine() {
        let mut b = ZeroedBuf::new(1 << 20).unwrap();
        assert_eq!(b.len(), 1 << 20);
        assert!(b.iter().all(|&x| x == 0));
        b[12345] = 7;
        assert_eq!(b.as_ref()[12345], 7);
        let e = ZeroedBuf::new(0).unwrap();
        assert!(e.is_empty());
        assert_eq!(e.as_ref(), &[] as &[u8]);
    }

    #[test]
    fn out_buf_compacts_a_short_tail_to_make_a_reserve() {
        let mut o = OutBuf::new(100, 20).unwrap();
        assert!(o.make_reserve());
        o.reserve_mut()[..15].fill(1);
        o.commit(15);
        // 105 left after end: still a reserve.
        assert!(o.make_reserve());
        o.reserve_mut()[..10].fill(2);
        o.commit(10);
        // end = 25: 95 left, not a reserve, and nothing written yet.
        assert!(!o.make_reserve());
        o.consume(12);
        // 13 pending <= batch: moved to the front.
        assert!(o.make_reserve());
        assert_eq!(o.pending().len(), 13);
        assert_eq!(&o.pending()[..3], &[1, 1, 1]);
        assert_eq!(&o.pending()[3..], &[2; 10]);
        o.consume(13);
        assert!(o.is_empty());
    }

    #[test]
    fn out_buf_keeps_a_long_tail_in_place() {
        let mut o = OutBuf::new(100, 20).unwrap();
        o.commit(100);
        o.consume(50);
        // 50 pending > batch: no move, no reserve until it drains.
        assert!(!o.make_reserve());
        assert_eq!(o.pending().len(), 50);
        o.consume(40);
        assert!(o.make_reserve());
        assert_eq!(o.pending().len(), 10);
    }
}
