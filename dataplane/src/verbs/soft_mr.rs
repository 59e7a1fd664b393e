//! Memory registration as the software providers (`shm`, `roce`) keep it:
//! a per-PD table of regions, the local-key check every posted SGE goes
//! through, the region handle that deregisters on drop, and who owns the
//! slots of a connection's key table (exposures, memory windows). One
//! copy for both providers; `ibverbs` leaves all of this to the HCA.
//!
//! Registration and deregistration are control-path work under the
//! table's mutex. The check every posted SGE goes through takes no lock
//! and writes nothing: it reads a seqlock-style mirror of the table
//! ([`KeyIndex`]), so the workers sharing a protection domain read its
//! cache lines side by side instead of taking turns on one mutex.

use std::marker::PhantomData;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use super::{
    bind_ok, check_registration, lock, Access, BindWindow, MemoryRegion, Sge, VerbsError, Window,
};
use crate::mem::Arena;

/// One registered range.
#[derive(Debug, Clone)]
pub(crate) struct MrInfo {
    /// Local key: the table slot + 1 (never 0).
    pub(crate) lkey: u32,
    /// The arena the range lies in.
    pub(crate) arena: Arc<Arena>,
    /// Address of the first byte.
    pub(crate) addr: u64,
    /// Length in bytes.
    pub(crate) len: u64,
    /// Access flags.
    pub(crate) access: Access,
}

/// Most memory regions one protection domain holds at once (the lock-free
/// index has room for this many local keys).
pub(crate) const MAX_MRS: usize = 1 << 16;
/// Entries of the index allocated together, when the first key of their
/// range is handed out.
const INDEX_CHUNK: usize = 64;

/// One local key's entry in the [`KeyIndex`]: what the per-SGE check
/// needs, without the arena (the SGE's own buffer keeps its memory alive).
#[derive(Debug, Default)]
struct IndexEntry {
    /// Odd while a writer changes the entry; readers retry then, or when
    /// it moved while they read.
    seq: AtomicU32,
    /// The key the entry is live under; 0 when free.
    lkey: AtomicU32,
    access: AtomicU32,
    addr: AtomicU64,
    len: AtomicU64,
}

/// The live registrations' keys, ranges and access, for lookups that take
/// no lock. Writers (register, deregister) are serialised by the table's
/// mutex; a chunk of entries, once allocated, lives as long as the table.
#[derive(Debug)]
struct KeyIndex {
    chunks: Box<[OnceLock<Box<[IndexEntry; INDEX_CHUNK]>>]>,
}

impl Default for KeyIndex {
    fn default() -> Self {
        KeyIndex {
            chunks: (0..MAX_MRS / INDEX_CHUNK)
                .map(|_| OnceLock::new())
                .collect(),
        }
    }
}

impl KeyIndex {
    fn entry(&self, slot: usize) -> Option<&IndexEntry> {
        self.chunks
            .get(slot / INDEX_CHUNK)?
            .get()
            .map(|c| &c[slot % INDEX_CHUNK])
    }

    /// Sets slot `slot` to `(lkey, addr, len, access)`; `lkey` 0 frees it.
    /// Only under the table's mutex (one writer at a time).
    fn publish(&self, slot: usize, lkey: u32, addr: u64, len: u64, access: Access) {
        let Some(chunk) = self.chunks.get(slot / INDEX_CHUNK) else {
            return;
        };
        let e = &chunk.get_or_init(|| Box::new(std::array::from_fn(|_| IndexEntry::default())))
            [slot % INDEX_CHUNK];
        let seq = e.seq.load(Ordering::Relaxed);
        e.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        e.lkey.store(lkey, Ordering::Relaxed);
        e.access.store(access.bits(), Ordering::Relaxed);
        e.addr.store(addr, Ordering::Relaxed);
        e.len.store(len, Ordering::Relaxed);
        e.seq.store(seq.wrapping_add(2), Ordering::Release);
    }

    /// The live registration under `lkey`: (address, length, access).
    fn lookup(&self, lkey: u32) -> Option<(u64, u64, Access)> {
        let e = self.entry((lkey as usize).checked_sub(1)?)?;
        let mut spins = 0u32;
        loop {
            let seq = e.seq.load(Ordering::Acquire);
            if seq & 1 == 0 {
                let live = e.lkey.load(Ordering::Relaxed);
                let access = e.access.load(Ordering::Relaxed);
                let addr = e.addr.load(Ordering::Relaxed);
                let len = e.len.load(Ordering::Relaxed);
                fence(Ordering::Acquire);
                if e.seq.load(Ordering::Relaxed) == seq {
                    return (live == lkey).then(|| (addr, len, Access::from_bits_truncate(access)));
                }
            }
            // A writer is inside the entry (a few stores under the table's
            // mutex); if it was preempted there, give it the core.
            spins = spins.wrapping_add(1);
            if spins % 64 == 0 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

/// The registrations of one protection domain.
#[derive(Debug, Default)]
pub(crate) struct MrTable {
    mrs: Mutex<Vec<Option<MrInfo>>>,
    index: KeyIndex,
}

impl MrTable {
    /// Registers `len` bytes at `offset` of `arena` (checked by
    /// [`check_registration`]) in the first free slot.
    pub(crate) fn register<P>(
        self: &Arc<Self>,
        arena: &Arc<Arena>,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<SoftMr<P>, VerbsError> {
        check_registration(arena, offset, len, access)?;
        let mut mrs = lock(&self.mrs);
        let slot = match mrs.iter().position(Option::is_none) {
            Some(s) => s,
            None if mrs.len() < MAX_MRS => {
                mrs.push(None);
                mrs.len() - 1
            }
            None => {
                return Err(VerbsError::Limit(
                    "protection domain already holds 65536 memory regions",
                ))
            }
        };
        let info = MrInfo {
            lkey: slot as u32 + 1,
            arena: arena.clone(),
            addr: arena.as_ptr() as u64 + offset as u64,
            len: len as u64,
            access,
        };
        self.index
            .publish(slot, info.lkey, info.addr, info.len, info.access);
        mrs[slot] = Some(info.clone());
        Ok(SoftMr {
            table: self.clone(),
            info,
            _provider: PhantomData,
        })
    }

    /// The live registration with local key `lkey`.
    pub(crate) fn get(&self, lkey: u32) -> Option<MrInfo> {
        let mrs = lock(&self.mrs);
        match mrs.get((lkey as usize).wrapping_sub(1)) {
            Some(Some(mr)) if mr.lkey == lkey => Some(mr.clone()),
            _ => None,
        }
    }

    /// Whether an SGE lies in a live registration of this table with `need`.
    pub(crate) fn check_local(&self, sge: &Sge, need: Access) -> bool {
        self.check_local_source(sge, need).is_some()
    }

    /// [`MrTable::check_local`], and if it holds, whether a peer may write
    /// the SGE's memory ([`Arena::peer_may_write`]). Takes no lock.
    pub(crate) fn check_local_source(&self, sge: &Sge, need: Access) -> Option<bool> {
        if !sge.in_bounds() {
            return None;
        }
        let (start, len, access) = self.index.lookup(sge.buf.lkey())?;
        let addr = sge.addr();
        let ok = access.contains(need)
            && addr >= start
            && addr.checked_add(sge.len as u64)? <= start.checked_add(len)?;
        // In a live registration's range, the SGE's buffer lies in the
        // registered arena (live arenas do not overlap), and it keeps that
        // arena alive while we ask.
        ok.then(|| sge.buf.arena().peer_may_write())
    }
}

/// A registered memory region of a software provider `P`; deregistered on
/// drop (buffers carved from it then fail with a local protection error).
/// `P` keeps one provider's regions from being passed to another's calls.
#[derive(Debug)]
pub struct SoftMr<P> {
    table: Arc<MrTable>,
    pub(crate) info: MrInfo,
    _provider: PhantomData<fn() -> P>,
}

impl<P> SoftMr<P> {
    /// Whether the region was registered in `table` (its protection
    /// domain's), for the check that a QP only exposes its own PD's memory.
    pub(crate) fn belongs_to(&self, table: &Arc<MrTable>) -> bool {
        Arc::ptr_eq(&self.table, table)
    }

    /// What every provider's `expose` requires of a region: one of this
    /// protection domain's (`table`), with remote read or write access.
    ///
    /// # Errors
    /// [`VerbsError::InvalidRegistration`] naming the rule broken.
    pub(crate) fn check_exposable(&self, table: &Arc<MrTable>) -> Result<(), VerbsError> {
        if !self.belongs_to(table) {
            return Err(VerbsError::InvalidRegistration(
                "memory region of another PD",
            ));
        }
        if !(self.info.access.contains(Access::REMOTE_READ)
            || self.info.access.contains(Access::REMOTE_WRITE))
        {
            return Err(VerbsError::InvalidRegistration(
                "memory region has no remote access",
            ));
        }
        Ok(())
    }
}

impl<P> MemoryRegion for SoftMr<P> {
    fn lkey(&self) -> u32 {
        self.info.lkey
    }
    fn addr(&self) -> u64 {
        self.info.addr
    }
    fn len(&self) -> usize {
        self.info.len as usize
    }
    fn access(&self) -> Access {
        self.info.access
    }
}

impl<P> Drop for SoftMr<P> {
    fn drop(&mut self) {
        let mut mrs = lock(&self.table.mrs);
        let slot = self.info.lkey as usize - 1;
        if let Some(entry) = mrs.get_mut(slot) {
            *entry = None;
            self.table.index.publish(slot, 0, 0, 0, Access::NONE);
        }
    }
}

/// Slots of a connection's key table (the low 8 bits of an rkey).
pub(crate) const KEY_SLOTS: usize = 256;
/// The rkey bits that pick the slot.
const SLOT_BITS: u32 = KEY_SLOTS as u32 - 1;

/// What a slot of a software provider's per-connection key table is used
/// for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Free,
    /// An [`expose`](super::QueuePair::expose) key, live until invalidated.
    Exposed(u32),
    /// A memory window: the key it is bound under, and the key of its
    /// last binding (a rebind must change it).
    Window {
        bound: Option<u32>,
        last: u32,
    },
}

/// Who owns the slots of one connection's key table, for `shm` and
/// `roce` (the providers keep what a key grants in their own tables):
/// `expose` keys (24 random bits above the slot), memory windows (slot
/// fixed, the upper 24 bits the consumer's) and their bindings.
#[derive(Debug)]
pub(crate) struct KeySlots {
    slots: Vec<Slot>,
}

impl KeySlots {
    pub(crate) fn new() -> KeySlots {
        KeySlots {
            slots: vec![Slot::Free; KEY_SLOTS],
        }
    }

    /// The slot an rkey names.
    pub(crate) fn slot(rkey: u32) -> usize {
        (rkey & SLOT_BITS) as usize
    }

    /// Takes a free slot for an `expose` key: `random` supplies the upper
    /// bits (drawn again while the key would be 0).
    pub(crate) fn expose(
        &mut self,
        mut random: impl FnMut() -> Result<u32, VerbsError>,
    ) -> Result<u32, VerbsError> {
        let slot = self.free()?;
        let rkey = loop {
            let r = (random()? & !SLOT_BITS) | slot as u32;
            if r != 0 {
                break r;
            }
        };
        self.slots[slot] = Slot::Exposed(rkey);
        Ok(rkey)
    }

    fn free(&self) -> Result<usize, VerbsError> {
        self.slots
            .iter()
            .position(|s| *s == Slot::Free)
            .ok_or(VerbsError::Limit("key table of this connection is full"))
    }

    /// Reserves a free slot as a window: the slot is its fixed bits, the
    /// upper 24 bits its consumer's tag.
    pub(crate) fn alloc_window(&mut self) -> Result<Window, VerbsError> {
        let slot = self.free()?;
        self.slots[slot] = Slot::Window {
            bound: None,
            last: 0,
        };
        Ok(Window::new(slot as u32, slot as u32, !SLOT_BITS))
    }

    /// Whether `index` names a window of this table.
    pub(crate) fn is_window(&self, index: u32) -> bool {
        matches!(self.slots.get(index as usize), Some(Slot::Window { .. }))
    }

    /// Checks a bind against the window's state and the region `lkey`
    /// names in `mrs`; on success the window is bound and the region is
    /// returned (the caller publishes the key).
    pub(crate) fn bind(&mut self, b: &BindWindow, mrs: &MrTable) -> Option<MrInfo> {
        let i = b.window as usize;
        let Some(Slot::Window { bound: None, last }) = self.slots.get(i).copied() else {
            return None;
        };
        let w = Window::new(b.window, b.window, !SLOT_BITS);
        let mr = mrs.get(b.lkey)?;
        if b.rkey == last || !bind_ok(b, &w, mr.addr, mr.len, mr.access) {
            return None;
        }
        self.slots[i] = Slot::Window {
            bound: Some(b.rkey),
            last: b.rkey,
        };
        Some(mr)
    }

    /// Invalidates `rkey` if it is live here (an `expose` key frees its
    /// slot, a window becomes bindable again); returns whether it was.
    pub(crate) fn invalidate(&mut self, rkey: u32) -> bool {
        let i = Self::slot(rkey);
        match self.slots[i] {
            _ if rkey == 0 => false,
            Slot::Exposed(k) if k == rkey => {
                self.slots[i] = Slot::Free;
                true
            }
            Slot::Window {
                bound: Some(k),
                last,
            } if k == rkey => {
                self.slots[i] = Slot::Window { bound: None, last };
                true
            }
            _ => false,
        }
    }

    /// Every key dies (the connection failed); windows stay reserved.
    pub(crate) fn invalidate_all(&mut self) {
        for s in &mut self.slots {
            match *s {
                Slot::Exposed(_) => *s = Slot::Free,
                Slot::Window { last, .. } => *s = Slot::Window { bound: None, last },
                Slot::Free => {}
            }
        }
    }
}

/// Checks the key arithmetic of a window a software provider handed out
/// (the providers' tests run it on real queue pairs): no tag gives rkey
/// 0, every key keeps the window's fixed bits (its slot), the next key
/// differs from the last, and a key with other fixed bits is not the
/// window's.
#[cfg(test)]
pub(crate) fn check_window_keys(w: &Window) {
    assert_eq!(w.mask(), !SLOT_BITS, "the tag is the upper 24 bits");
    assert_eq!(w.fixed(), w.index(), "the slot is the fixed bits");
    let tags = [0, 1, 0xff, 0x100, 0xdead_beef, u32::MAX, 0xffff_ff00];
    for t in tags {
        let k = w.rkey(t);
        assert_ne!(k, 0, "tag {t:#x} of window {}", w.index());
        assert_eq!(KeySlots::slot(k), w.index() as usize, "fixed bits kept");
        assert!(w.owns(k));
        let n = w.next_rkey(k);
        assert_ne!(n, k);
        assert_eq!(KeySlots::slot(n), w.index() as usize);
        assert!(!w.owns(k ^ 1), "other fixed bits");
    }
    assert!(!w.owns(0));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An SGE over `len` bytes of a one-buffer slab of `arena` under `lkey`.
    fn sge_in(arena: &Arc<Arena>, lkey: u32, len: u32) -> Sge {
        let slab = crate::mem::Slab::new(arena.clone(), 0, 4096, 1, lkey, crate::mem::WrKind::Recv)
            .unwrap();
        let mut s = Sge::whole(slab.alloc().unwrap());
        s.len = len;
        s
    }

    #[test]
    fn the_lock_free_check_follows_registration_and_deregistration() {
        let table = Arc::new(MrTable::default());
        let arena = Arena::new(1 << 16).unwrap();
        let mr = table
            .register::<()>(&arena, 0, 8192, Access::LOCAL_WRITE)
            .unwrap();
        let sge = sge_in(&arena, mr.info.lkey, 4096);
        assert_eq!(
            table.check_local_source(&sge, Access::LOCAL_WRITE),
            Some(false)
        );
        assert_eq!(
            table.check_local_source(&sge, Access::REMOTE_READ),
            None,
            "access the region lacks"
        );
        let stray = sge_in(&arena, mr.info.lkey + 1, 16);
        assert_eq!(
            table.check_local_source(&stray, Access::NONE),
            None,
            "no such key"
        );
        arena.mark_remote_writable();
        assert_eq!(
            table.check_local_source(&sge, Access::LOCAL_WRITE),
            Some(true),
            "a peer may write the arena now"
        );
        drop(mr);
        assert_eq!(
            table.check_local_source(&sge, Access::LOCAL_WRITE),
            None,
            "deregistered"
        );
        // The slot is reused by the next registration, whose range decides.
        let small = table
            .register::<()>(&arena, 0, 64, Access::LOCAL_WRITE)
            .unwrap();
        assert_eq!(small.info.lkey, sge.buf.lkey());
        assert_eq!(
            table.check_local_source(&sge, Access::LOCAL_WRITE),
            None,
            "past its end"
        );
    }

    #[test]
    fn index_readers_never_see_a_half_written_entry() {
        // One writer flips slot 0 between two registrations and free while
        // two readers look it up: every answer is one whole state.
        const LOOKUPS: u64 = 200_000;
        let index = Arc::new(KeyIndex::default());
        let states = [
            (0x1000, 0x10, Access::LOCAL_WRITE),
            (0x9000, 0x90, Access::REMOTE_READ),
        ];
        let looked = Arc::new(AtomicU64::new(0));
        let found = Arc::new(AtomicU64::new(0));
        index.publish(0, 1, 0x1000, 0x10, Access::LOCAL_WRITE);
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (index, looked, found) = (index.clone(), looked.clone(), found.clone());
                std::thread::spawn(move || {
                    // Until both enough lookups and one live find: on a
                    // loaded machine a reader may run only while the
                    // writer sits in the free state for a long stretch.
                    while looked.fetch_add(1, Ordering::Relaxed) < LOOKUPS
                        || found.load(Ordering::Relaxed) == 0
                    {
                        if let Some(entry) = index.lookup(1) {
                            assert!(states.contains(&entry), "torn entry {entry:x?}");
                            found.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let mut i = 0u64;
        while looked.load(Ordering::Relaxed) < LOOKUPS || found.load(Ordering::Relaxed) == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "broken: readers stuck, or never saw the key live ({} found)",
                found.load(Ordering::Relaxed)
            );
            match i % 3 {
                2 => index.publish(0, 0, 0, 0, Access::NONE),
                k => {
                    let (addr, len, access) = states[k as usize];
                    index.publish(0, 1, addr, len, access);
                }
            }
            i += 1;
        }
        for r in readers {
            r.join().unwrap();
        }
        assert!(found.load(Ordering::Relaxed) > 0, "the key was found live");
        assert_eq!(index.lookup(2), None, "a key never published");
        assert_eq!(index.lookup(0), None, "key 0 names no slot");
    }

    #[test]
    fn slot_zero_never_gives_rkey_zero() {
        let w = Window::new(0, 0, !SLOT_BITS);
        assert_eq!(w.rkey(0), 0x100);
        assert_eq!(w.rkey(0x100), 0x100);
        check_window_keys(&w);
    }

    #[test]
    fn hca_layout_keeps_the_index_bits() {
        // ibverbs: the HCA's index in the upper 24 bits, our key byte low.
        let w = Window::new(3, 0x0012_3400, 0xff);
        assert_eq!(w.rkey(0xabcd_ef01), 0x0012_3401);
        assert_eq!(w.next_rkey(0x0012_34ff), 0x0012_3400);
        assert!(!w.owns(0x0012_3501));
    }

    #[test]
    fn windows_and_exposures_share_the_slots() {
        let mut t = KeySlots::new();
        // Slot 0 with zero random bits would be rkey 0: drawn again.
        let mut draws = [0x1234_5678, 0].into_iter().rev();
        let k = t.expose(|| Ok(draws.next().unwrap())).unwrap();
        assert_eq!(k, 0x1234_5600);
        for i in 1..KEY_SLOTS {
            let w = t.alloc_window().unwrap();
            assert_eq!(w.index() as usize, i);
            check_window_keys(&w);
        }
        assert!(matches!(t.alloc_window(), Err(VerbsError::Limit(_))));
        assert!(matches!(t.expose(|| Ok(7 << 8)), Err(VerbsError::Limit(_))));
        assert!(t.invalidate(k));
        assert!(!t.invalidate(k), "once");
        assert_eq!(t.alloc_window().unwrap().index(), 0);
    }
}
