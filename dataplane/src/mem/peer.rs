//! Memory a peer can touch, reached only by copying.
//!
//! Bytes a peer may write at any moment (an `shm` peer maps them; RDMA
//! Writes and Sends land in them) are never a Rust slice in this process:
//! a `&[u8]` promises the compiler that nobody changes the bytes while it
//! lives, and a hostile peer could also change a header between the check
//! and the use. Such memory is read through [`copy_out`] into memory this
//! process owns, and parsed there. [`PeerBytes`] is the read-only view the
//! engine and the client hand out for one exchange's bytes: it borrows the
//! exchange (so it cannot outlive it) and offers copies, never a slice.

use std::marker::PhantomData;

/// Copies `dst.len()` bytes from `src` into `dst`.
///
/// # Safety
/// `src..src + dst.len()` must lie inside one live allocation or mapping
/// that `dst` does not overlap.
pub unsafe fn copy_out(src: *const u8, dst: &mut [u8]) {
    // SAFETY: the caller's contract. A concurrent writer on the other side
    // changes only bytes of the copy; nothing here is assumed stable.
    unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) }
}

/// Copies `src` to `dst`.
///
/// # Safety
/// `dst..dst + src.len()` must lie inside one live, writable allocation or
/// mapping that `src` does not overlap.
pub unsafe fn copy_in(src: &[u8], dst: *mut u8) {
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) }
}

/// A read-only view of `len` bytes a peer may write (module docs). It
/// lives no longer than the borrow it was made from, which is the
/// exchange's: when the exchange ends, the view is gone.
#[derive(Clone, Copy)]
pub struct PeerBytes<'a> {
    ptr: *const u8,
    len: usize,
    _exchange: PhantomData<&'a [u8]>,
}

impl<'a> PeerBytes<'a> {
    /// A view of `len` bytes at `ptr`.
    ///
    /// # Safety
    /// The bytes must stay mapped for `'a`.
    pub unsafe fn new(ptr: *const u8, len: usize) -> PeerBytes<'a> {
        PeerBytes {
            ptr,
            len,
            _exchange: PhantomData,
        }
    }

    /// No bytes.
    pub const fn empty() -> PeerBytes<'a> {
        PeerBytes {
            ptr: std::ptr::null(),
            len: 0,
            _exchange: PhantomData,
        }
    }

    /// Number of bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `dst.len()` bytes from `offset` into `dst`; false, copying
    /// nothing, if the range is outside the view.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> bool {
        match offset.checked_add(dst.len()) {
            Some(end) if end <= self.len => {
                if !dst.is_empty() {
                    // SAFETY: inside the view, which is mapped for 'a
                    // (`new`'s contract); `dst` is our own memory.
                    unsafe { copy_out(self.ptr.add(offset), dst) };
                }
                true
            }
            _ => false,
        }
    }

    /// The bytes `offset..offset + len` as a narrower view, if inside.
    pub fn sub(&self, offset: usize, len: usize) -> Option<PeerBytes<'a>> {
        let end = offset.checked_add(len)?;
        if end > self.len {
            return None;
        }
        if len == 0 {
            return Some(PeerBytes::empty());
        }
        // SAFETY: inside the view.
        Some(unsafe { PeerBytes::new(self.ptr.add(offset), len) })
    }

    /// Appends a copy of all the bytes to `out` (reusing its capacity).
    pub fn append_to(&self, out: &mut Vec<u8>) {
        let at = out.len();
        out.resize(at + self.len, 0);
        self.read(0, &mut out[at..]);
    }

    /// A copy of the bytes.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.append_to(&mut v);
        v
    }
}

impl std::fmt::Debug for PeerBytes<'_> {
    // A copy of at most 32 bytes, so that assertion messages say something.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut head = [0u8; 32];
        let n = self.len.min(head.len());
        self.read(0, &mut head[..n]);
        f.debug_struct("PeerBytes")
            .field("len", &self.len)
            .field("head", &&head[..n])
            .finish()
    }
}

/// Compares by copying, a bounded piece at a time.
impl PartialEq<[u8]> for PeerBytes<'_> {
    fn eq(&self, other: &[u8]) -> bool {
        if other.len() != self.len {
            return false;
        }
        let mut piece = [0u8; 256];
        other.chunks(piece.len()).enumerate().all(|(i, want)| {
            let got = &mut piece[..want.len()];
            self.read(i * 256, got) && got == want
        })
    }
}

/// Compares two views by copying both, a bounded piece at a time.
impl PartialEq for PeerBytes<'_> {
    fn eq(&self, other: &PeerBytes<'_>) -> bool {
        if other.len != self.len {
            return false;
        }
        let (mut a, mut b) = ([0u8; 256], [0u8; 256]);
        (0..self.len).step_by(a.len()).all(|at| {
            let n = (self.len - at).min(a.len());
            self.read(at, &mut a[..n]) && other.read(at, &mut b[..n]) && a[..n] == b[..n]
        })
    }
}

impl PartialEq<&[u8]> for PeerBytes<'_> {
    fn eq(&self, other: &&[u8]) -> bool {
        *self == **other
    }
}

impl<const N: usize> PartialEq<[u8; N]> for PeerBytes<'_> {
    fn eq(&self, other: &[u8; N]) -> bool {
        *self == other[..]
    }
}

impl<const N: usize> PartialEq<&[u8; N]> for PeerBytes<'_> {
    fn eq(&self, other: &&[u8; N]) -> bool {
        *self == other[..]
    }
}

impl PartialEq<Vec<u8>> for PeerBytes<'_> {
    fn eq(&self, other: &Vec<u8>) -> bool {
        *self == other[..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_copy_and_compare_within_bounds() {
        let backing: Vec<u8> = (0..=255u8).cycle().take(700).collect();
        // SAFETY: `backing` outlives the view.
        let v = unsafe { PeerBytes::new(backing.as_ptr(), backing.len()) };
        assert_eq!(v.len(), 700);
        assert!(v == backing);
        assert!(v == v && v.sub(0, 3) != v.sub(1, 3));
        assert!(v != backing[..699]);
        let mut d = [0u8; 4];
        assert!(v.read(696, &mut d) && d == backing[696..]);
        assert!(!v.read(697, &mut d));
        assert!(!v.read(usize::MAX, &mut d));
        let s = v.sub(256, 3).unwrap();
        assert!(s == [0u8, 1, 2] && s.to_vec() == [0, 1, 2]);
        assert!(v.sub(698, 3).is_none());
        assert!(v.sub(700, 0).unwrap().is_empty());
        let mut out = vec![9u8];
        s.append_to(&mut out);
        assert_eq!(out, [9, 0, 1, 2]);
        assert!(PeerBytes::empty().is_empty() && PeerBytes::empty() == [0u8; 0]);
        assert!(format!("{s:?}").contains("len: 3"));
    }
}
