//! Memory registration as the software providers (`shm`, `roce`) keep it:
//! a per-PD table of regions, the local-key check every posted SGE goes
//! through, and the region handle that deregisters on drop. One copy for
//! both providers; `ibverbs` leaves all of this to the HCA.

use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use super::{check_registration, lock, Access, MemoryRegion, Sge, VerbsError};
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

/// The registrations of one protection domain.
#[derive(Debug, Default)]
pub(crate) struct MrTable {
    mrs: Mutex<Vec<Option<MrInfo>>>,
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
            None => {
                mrs.push(None);
                mrs.len() - 1
            }
        };
        let info = MrInfo {
            lkey: slot as u32 + 1,
            arena: arena.clone(),
            addr: arena.as_ptr() as u64 + offset as u64,
            len: len as u64,
            access,
        };
        mrs[slot] = Some(info.clone());
        Ok(SoftMr {
            table: self.clone(),
            info,
            _provider: PhantomData,
        })
    }

    /// Whether an SGE lies in a live registration of this table with `need`.
    pub(crate) fn check_local(&self, sge: &Sge, need: Access) -> bool {
        if !sge.in_bounds() {
            return false;
        }
        let mrs = lock(&self.mrs);
        let Some(Some(mr)) = mrs.get((sge.buf.lkey() as usize).wrapping_sub(1)) else {
            return false;
        };
        let addr = sge.addr();
        mr.lkey == sge.buf.lkey()
            && mr.access.contains(need)
            && addr >= mr.addr
            && addr + sge.len as u64 <= mr.addr + mr.len
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
        if let Some(slot) = mrs.get_mut(self.info.lkey as usize - 1) {
            *slot = None;
        }
    }
}
